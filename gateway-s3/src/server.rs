//! The HTTP side: accept connections (at most `max_connections` at once),
//! serve each with hyper's HTTP/1.1, hand requests to s3s.

use crate::auth::{Access, Keys};
use crate::config::{GatewayConfig, Role};
use crate::ops::Gateway;
use crate::store::Store;
use fskv_client::FsClient;
use hyper_util::rt::TokioIo;
use s3s::service::S3ServiceBuilder;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// A running gateway; dropping it does not stop it, [`GatewayHandle::stop`] does.
pub struct GatewayHandle {
    pub addr: SocketAddr,
    pub gateway: Gateway,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl GatewayHandle {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Binds `cfg.listen` and serves until stopped.
pub async fn start(cfg: GatewayConfig, fs: FsClient) -> Result<GatewayHandle, String> {
    if cfg.keys.is_empty() {
        return Err("no access keys configured: every request must be signed".into());
    }
    // Readers create the root too: it may not exist yet when they start first.
    let store = Store::open(fs, &cfg.root_path, true).await?;
    let gateway = Gateway { store, cfg: Arc::new(cfg.clone()) };
    let mut builder = S3ServiceBuilder::new(gateway.clone());
    builder.set_auth(Keys::new(&cfg.keys));
    builder.set_access(Access { role: cfg.role, writer_endpoint: cfg.writer_endpoint.clone() });
    let service = builder.build();
    let tls = match &cfg.tls {
        Some(files) => Some(tls_acceptor(files)?),
        None => None,
    };
    let listener = TcpListener::bind(cfg.listen).await.map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop, stop_rx) = watch::channel(false);
    let limit = Arc::new(Semaphore::new(cfg.limits.max_connections.max(1)));
    let task = tokio::spawn(accept_loop(listener, service, tls, limit, stop_rx.clone()));
    if cfg.role == Role::Writer {
        tokio::spawn(expiry_loop(gateway.clone(), stop_rx));
    }
    tracing::info!(%addr, role = ?cfg.role, root = %cfg.root_path, https = cfg.tls.is_some(), "S3 gateway serving");
    Ok(GatewayHandle { addr, gateway, stop, task })
}

/// Bound on a TLS handshake; a client that stalls in it is dropped.
const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

fn tls_acceptor(files: &crate::config::TlsFiles) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("TLS certificate {}: {e}", files.cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!("TLS certificate {}: no certificate in the file", files.cert_path.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key_path).map_err(|e| format!("TLS key {}: {e}", files.key_path.display()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate and key do not fit together: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn accept_loop(
    listener: TcpListener,
    service: s3s::service::S3Service,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limit: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&limit).acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.changed() => return,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            let result = match tls {
                None => http.keep_alive(true).serve_connection(TokioIo::new(stream), service).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS), acceptor.accept(stream)).await;
                    match handshake {
                        Ok(Ok(tls_stream)) => http.keep_alive(true).serve_connection(TokioIo::new(tls_stream), service).await,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            Ok(())
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
}

async fn expiry_loop(gateway: Gateway, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(gateway.cfg.limits.expiry_scan_interval_ms.max(1000));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        let n = gateway.expire_uploads().await;
        if n > 0 {
            tracing::info!(removed = n, "expired multipart uploads removed");
        }
    }
}
