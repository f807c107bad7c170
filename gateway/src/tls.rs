//! HTTPS: a rustls acceptor (ring provider, TLS 1.2/1.3, ALPN `http/1.1`)
//! from PEM files.

use crate::config::TlsFiles;
use crate::error::GatewayError;
use std::sync::Arc;

pub fn acceptor(files: &TlsFiles) -> Result<tokio_rustls::TlsAcceptor, GatewayError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let setup = GatewayError::Setup;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| setup(format!("TLS certificate {}: {e}", files.cert_path.display())))?;
    if certs.is_empty() {
        return Err(setup(format!("TLS certificate {}: no certificate in the file", files.cert_path.display())));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key_path).map_err(|e| setup(format!("TLS key {}: {e}", files.key_path.display())))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| setup(format!("TLS certificate and key do not fit together: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
