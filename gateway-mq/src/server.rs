//! The MQ protocol on the shared gateway layer: requests classified by
//! [`crate::route::classify`], native errors as JSON, SQS errors as AWS
//! JSON 1.0.

use crate::api::Mq;
use crate::config::MqConfig;
use crate::error::MqError;
use crate::log::LogReader;
use crate::partition::Writer;
use crate::route::{parse_native, sqs_target};
use crate::store::Store;
use crate::watch::HwWatcher;
use bytes::Bytes;
use fskv_client::FsClient;
use fskv_gateway::{Authenticator, GatewayError, Metrics, Protocol, RequestBody, RequestContext, Route, ServerConfig, ServerHandle};
use http::request::Parts;
use http::{Request, Response};
use std::net::SocketAddr;
use std::sync::Arc;

pub struct MqHttp {
    pub mq: Mq,
}

impl Protocol for MqHttp {
    type Body = http_body_util::Full<Bytes>;

    fn name(&self) -> &'static str {
        "mq"
    }

    fn classify(&self, parts: &Parts) -> Route {
        crate::route::classify(parts)
    }

    async fn handle(&self, req: Request<RequestBody>, cx: RequestContext) -> Response<Self::Body> {
        let (parts, body) = req.into_parts();
        let tenant = cx.principal.as_ref().map(|p| p.tenant.clone()).unwrap_or_default();
        let resp = if sqs_target(&parts).is_some() || cx.route == "sqs.Query" {
            crate::sqs::handle(&self.mq, &parts, body, &cx).await
        } else {
            let r = match parse_native(&parts.method, parts.uri.path()) {
                Some(op) => self.mq.native(op, &parts, body, &tenant).await,
                None => Err(MqError::NotFound(format!("no operation {} {}", parts.method, parts.uri.path()))),
            };
            match r {
                Ok(r) => r,
                Err(e) => {
                    log_error(&e);
                    e.native_response(&cx.request_id)
                }
            }
        };
        resp.map(http_body_util::Full::new)
    }

    fn error_response(&self, err: &GatewayError, cx: &RequestContext) -> Response<Bytes> {
        if cx.route.starts_with("sqs.") {
            crate::sqs::gateway_error(err)
        } else {
            err.reply().json(&cx.request_id)
        }
    }
}

/// Logs a failed request once, here where it is answered.
pub fn log_error(e: &MqError) {
    match e {
        MqError::Internal(_) | MqError::Corrupt(_) => tracing::error!(error = %e, "request failed"),
        MqError::Unavailable(_) | MqError::Fenced(_) => tracing::warn!(error = %e, "request failed"),
        _ => tracing::debug!(error = %e, "request refused"),
    }
}

/// A running MQ gateway.
pub struct MqHandle {
    pub addr: SocketAddr,
    pub mq: Mq,
    pub metrics: Arc<Metrics>,
    server: ServerHandle,
}

impl MqHandle {
    pub async fn stop(self) {
        self.server.stop().await;
    }
}

/// Binds `cfg.listen` and serves until stopped.
pub async fn start(cfg: MqConfig, fs: FsClient) -> Result<MqHandle, String> {
    if cfg.keys.is_empty() {
        return Err("no access keys configured: every request must be authenticated".into());
    }
    let store = Store::open(fs, &cfg.root_path, true).await?;
    let log = LogReader::new(store.clone(), cfg.writer.max_batch_bytes);
    let writer = Writer::new(store.clone(), log.clone(), cfg.writer.clone());
    let watcher = HwWatcher::new(store.clone(), cfg.poll_interval_ms);
    let auth = Arc::new(Authenticator::new(Arc::clone(&cfg.keys), cfg.region.clone(), &["sqs", "mq"], true));
    let metrics = Arc::new(Metrics::new());
    let server_cfg = ServerConfig {
        listen: cfg.listen,
        role: cfg.role,
        writer_endpoint: cfg.writer_endpoint.clone(),
        tls: cfg.tls.clone(),
        limits: cfg.http.clone(),
    };
    let mq = Mq { cfg: Arc::new(cfg), store, log, writer, watcher, commits: Arc::default(), written_groups: Arc::default() };
    let protocol = Arc::new(MqHttp { mq: mq.clone() });
    let server = fskv_gateway::serve(server_cfg, protocol, auth, Arc::clone(&metrics)).await.map_err(|e| e.to_string())?;
    tracing::info!(addr = %server.addr, role = %mq.cfg.role, root = %mq.cfg.root_path, writer_id = %mq.cfg.writer.writer_id, "MQ gateway serving");
    Ok(MqHandle { addr: server.addr, mq, metrics, server })
}
