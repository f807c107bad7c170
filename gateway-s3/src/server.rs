//! The HTTP side: the shared gateway layer (`fskv-gateway`: connections,
//! timeouts, limits, reader guard, metrics, request ids) serves
//! [`S3Http`], which hands each admitted request to s3s; plus the writer's
//! scan for expired multipart uploads.

use crate::auth::{Access, Keys};
use crate::config::{GatewayConfig, Role};
use crate::error;
use crate::ops::Gateway;
use crate::store::Store;
use bytes::Bytes;
use fskv_client::FsClient;
use fskv_gateway::{Authenticator, GatewayError, Metrics, Protocol, RequestBody, RequestContext, Route, ServerConfig, ServerHandle};
use http::header::HeaderName;
use http::request::Parts;
use http::{Request, Response};
use s3s::service::{S3Service, S3ServiceBuilder};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The S3 protocol on the shared layer: routes by [`crate::route::classify`],
/// errors as S3 XML, request ids in `x-amz-request-id`.
pub struct S3Http {
    service: S3Service,
}

impl Protocol for S3Http {
    type Body = s3s::Body;

    fn name(&self) -> &'static str {
        "s3"
    }

    fn request_id_header(&self) -> HeaderName {
        HeaderName::from_static("x-amz-request-id")
    }

    fn classify(&self, parts: &Parts) -> Route {
        crate::route::classify(parts)
    }

    async fn handle(&self, mut req: Request<RequestBody>, cx: RequestContext) -> Response<s3s::Body> {
        if !path_is_utf8(req.uri().path()) {
            // s3s would decode it lossily and serve another key.
            return error::xml_response(error::invalid_uri(), &cx.request_id).map(s3s::Body::from);
        }
        if length_unknown_unsigned(req.headers()) {
            // s3s refuses an UNSIGNED-PAYLOAD body without Content-Length
            // (MissingContentLength) before any handler runs, though
            // nothing it does with such a body needs the length: the
            // handlers stream it and stop at their own limits
            // (`max_object_bytes`, `max_part_bytes`), after the shared
            // layer's body cap. A zero Content-Length (unsigned: it is not
            // part of the signature) gets it past that check; the handlers
            // read a zero length as unknown (UploadPart then stores the
            // part as a file of its own, not in place).
            req.headers_mut().insert(http::header::CONTENT_LENGTH, http::HeaderValue::from_static("0"));
        }
        match self.service.call(req.map(s3s::Body::http_body)).await {
            Ok(resp) => resp,
            Err(e) => {
                tracing::error!(error = ?e, "s3s failed to produce a response");
                let err = s3s::S3Error::with_message(s3s::S3ErrorCode::InternalError, "internal error");
                error::xml_response(err, &cx.request_id).map(s3s::Body::from)
            }
        }
    }

    fn error_response(&self, err: &GatewayError, cx: &RequestContext) -> Response<Bytes> {
        error::xml_response(error::from_gateway(err), &cx.request_id)
    }
}

/// Whether the request path is UTF-8 once percent-decoded (keys are UTF-8).
pub fn path_is_utf8(path: &str) -> bool {
    percent_encoding::percent_decode_str(path).decode_utf8().is_ok()
}

/// A body sent with `Transfer-Encoding: chunked`, no `Content-Length` and
/// `x-amz-content-sha256: UNSIGNED-PAYLOAD` (header-signed, payload not
/// signed). The other modes:
///
/// | x-amz-content-sha256 | chunked, no Content-Length |
/// |---|---|
/// | `UNSIGNED-PAYLOAD` | accepted (this function) |
/// | `STREAMING-*` (aws-chunked) | accepted when `x-amz-decoded-content-length` is sent (s3s checks the decoded length); 411 `MissingContentLength` without it, as AWS |
/// | a hex SHA-256 (signed payload) | 411 `MissingContentLength`: the digest is checked against a body of known length, and AWS requires it too |
/// | presigned URL (no header) | accepted (s3s needs no length) |
pub fn length_unknown_unsigned(headers: &http::HeaderMap) -> bool {
    let chunked = headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("chunked"));
    chunked
        && !headers.contains_key(http::header::CONTENT_LENGTH)
        && headers.get("x-amz-content-sha256").is_some_and(|v| v.as_bytes() == b"UNSIGNED-PAYLOAD")
}

/// A running gateway; [`GatewayHandle::stop`] stops it gracefully (dropping
/// the handle stops accepting without waiting).
pub struct GatewayHandle {
    pub addr: SocketAddr,
    pub gateway: Gateway,
    pub metrics: Arc<Metrics>,
    server: ServerHandle,
    stop: watch::Sender<bool>,
}

impl GatewayHandle {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.server.stop().await;
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
    builder.set_auth(Keys(Arc::clone(&cfg.keys)));
    builder.set_access(Access);
    let protocol = Arc::new(S3Http { service: builder.build() });
    let auth = Arc::new(Authenticator::new(Arc::clone(&cfg.keys), cfg.region.clone(), &["s3"], false));
    let metrics = Arc::new(Metrics::new());
    let server_cfg = ServerConfig {
        listen: cfg.listen,
        role: cfg.role,
        writer_endpoint: cfg.writer_endpoint.clone(),
        tls: cfg.tls.clone(),
        limits: cfg.http.clone(),
    };
    let server = fskv_gateway::serve(server_cfg, protocol, auth, Arc::clone(&metrics)).await.map_err(|e| e.to_string())?;
    let (stop, stop_rx) = watch::channel(false);
    if cfg.role == Role::Writer {
        tokio::spawn(expiry_loop(gateway.clone(), stop_rx));
    }
    tracing::info!(addr = %server.addr, role = %cfg.role, root = %cfg.root_path, "S3 gateway serving");
    Ok(GatewayHandle { addr: server.addr, gateway, metrics, server, stop })
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

#[cfg(test)]
mod tests {
    use super::length_unknown_unsigned;

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        pairs.iter().map(|(k, v)| (http::HeaderName::from_static(k), http::HeaderValue::from_static(v))).collect()
    }

    #[test]
    fn paths_must_decode_to_utf8() {
        assert!(super::path_is_utf8("/bkt/caf%C3%A9/%E6%97%A5"));
        assert!(super::path_is_utf8("/bkt/100%25"));
        assert!(!super::path_is_utf8("/bkt/%FF-undecodable"));
        assert!(!super::path_is_utf8("/bkt/%C3%28"));
    }

    #[test]
    fn only_unsigned_chunked_bodies_without_length_are_let_through() {
        let te = ("transfer-encoding", "chunked");
        let unsigned = ("x-amz-content-sha256", "UNSIGNED-PAYLOAD");
        assert!(length_unknown_unsigned(&headers(&[te, unsigned])));
        assert!(length_unknown_unsigned(&headers(&[("transfer-encoding", "gzip, Chunked"), unsigned])));
        assert!(!length_unknown_unsigned(&headers(&[te, unsigned, ("content-length", "5")])));
        assert!(!length_unknown_unsigned(&headers(&[unsigned])));
        assert!(!length_unknown_unsigned(&headers(&[te, ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")])));
        assert!(!length_unknown_unsigned(&headers(&[
            te,
            ("x-amz-content-sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        ])));
    }
}
