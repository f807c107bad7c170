//! The HTTP side: the shared gateway layer (`fskv-gateway`: connections,
//! timeouts, limits, reader guard, metrics, request ids) serves
//! [`S3Http`], which hands each admitted request to s3s; plus the writer's
//! scan for expired multipart uploads.

use crate::auth::{Access, Keys};
use crate::config::{GatewayConfig, Role};
use crate::cors;
use crate::error;
use crate::ops::lifecycle::LifecycleMetrics;
use crate::ops::Gateway;
use crate::store::Store;
use crate::vhost::VirtualHosts;
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

/// The S3 protocol on the shared layer: routes by [`crate::route::classify_hosted`]
/// (virtual-hosted style resolved by [`VirtualHosts`]), errors as S3 XML,
/// request ids in `x-amz-request-id`; answers CORS preflights and adds the
/// CORS headers of actual requests (`crate::cors`).
pub struct S3Http {
    service: S3Service,
    gateway: Gateway,
    vhosts: VirtualHosts,
    auth: Arc<Authenticator>,
}

/// A large signed-payload PUT whose SigV4 signature the shared layer's
/// verifier checked before s3s ran, so that the payload's SHA-256 can be
/// checked by the body's hashing thread (`body::BodyDigests`) instead of
/// inline in s3s's body stream. s3s sees such a request as anonymous (its
/// `Authorization` removed); [`crate::auth::Access`] and
/// [`crate::ops::Gateway::for_request`] take the principal from this
/// request extension, which no client can set.
///
/// | request | signature checked by | payload SHA-256 checked by |
/// |---|---|---|
/// | PUT, header SigV4, hex `x-amz-content-sha256`, `Content-Length` ≥ `body::OFFLOAD_MIN_BYTES` | the shared layer (here) | the hashing thread, before anything is published (`XAmzContentSHA256Mismatch`) |
/// | any other signed request | s3s | s3s, inline (small bodies) |
/// | `UNSIGNED-PAYLOAD`, presigned URL | s3s | nobody: the payload is not signed |
/// | `STREAMING-*` (aws-chunked) | s3s, chunk signatures included | s3s |
#[derive(Clone, Debug)]
pub struct PreVerified {
    pub access_key: String,
    pub payload_sha256: [u8; 32],
}

/// The declared payload SHA-256 of a request the shared layer may verify
/// itself ([`PreVerified`]); `None` leaves the request to s3s. Only the
/// routes whose handlers hash their body with `body::BodyDigests` (and so
/// check the payload hash) qualify: `route` is the classifier's name.
pub fn pre_verifiable(parts: &Parts, route: &str) -> Option<[u8; 32]> {
    if parts.method != http::Method::PUT || !matches!(route, "PutObject" | "UploadPart") {
        return None;
    }
    let h = &parts.headers;
    let auth = h.get(http::header::AUTHORIZATION)?.as_bytes();
    if !auth.starts_with(b"AWS4-HMAC-SHA256 ") || h.get_all(http::header::AUTHORIZATION).iter().count() != 1 {
        return None;
    }
    let len: u64 = h.get(http::header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()?;
    if len < crate::body::OFFLOAD_MIN_BYTES || h.contains_key("x-amz-decoded-content-length") {
        return None;
    }
    let mut values = h.get_all("x-amz-content-sha256").iter();
    let (v, None) = (values.next()?, values.next()) else { return None };
    let mut out = [0u8; 32];
    hex::decode_to_slice(v.as_bytes(), &mut out).ok()?;
    Some(out)
}

impl S3Http {
    /// The bucket a request addresses: from its `Host` (virtual-hosted
    /// style) or the first component of its path.
    fn bucket_of(&self, headers: &http::HeaderMap, path: &str) -> Option<String> {
        if let Some(b) = self.vhosts.bucket_of(headers) {
            return Some(b);
        }
        let first = path.strip_prefix('/')?.split('/').next()?;
        let name = percent_encoding::percent_decode_str(first).decode_utf8().ok()?;
        (!name.is_empty()).then(|| name.into_owned())
    }

    /// The CORS rules of `bucket` (no tenant check: a preflight carries no
    /// credentials, and the rules are the bucket owner's answer to anyone).
    async fn rules_of(&self, bucket: &str) -> Result<Option<Vec<cors::Rule>>, s3s::S3Error> {
        let dir = self.gateway.store.bucket(bucket).await?;
        self.gateway.cors_rules(dir.id, bucket).await
    }

    /// The answer to a preflight `OPTIONS` (its body is never read).
    async fn preflight(&self, headers: &http::HeaderMap, bucket: Option<&str>, cx: &RequestContext) -> Response<s3s::Body> {
        let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let (origin, method, wanted) = (h("origin"), h("access-control-request-method"), h("access-control-request-headers"));
        let rules = match cors::check_request(origin, method) {
            Err(r) => Err(r),
            Ok(()) => match bucket {
                None => Err(cors::Refusal::NoBucket),
                Some(b) => match self.rules_of(b).await {
                    Ok(rules) => Ok(rules),
                    Err(e) if e.code() == &s3s::S3ErrorCode::NoSuchBucket => Err(cors::Refusal::NoBucket),
                    Err(e) => return error::xml_response(e, &cx.request_id).map(s3s::Body::from),
                },
            },
        };
        match rules.and_then(|rules| cors::preflight(rules.as_deref(), origin, method, wanted)) {
            Ok(pairs) => {
                let mut resp = Response::new(s3s::Body::empty());
                set_headers(resp.headers_mut(), pairs);
                resp
            }
            Err(refusal) => {
                tracing::debug!(?refusal, bucket, origin, method, "CORS preflight refused");
                error::xml_response(refusal.to_error(), &cx.request_id).map(s3s::Body::from)
            }
        }
    }
}

/// s3s writes every `ETag` element quoted; GetObjectAttributes gives it
/// unquoted (AWS, moto and the SDKs' models agree).
fn unquote_attributes_etag(resp: &mut Response<s3s::Body>) {
    replace_xml(resp, unquote_etag_element);
}

/// Replaces a whole (not streamed) response body by `fix` of it, unless
/// `fix` finds nothing to change.
fn replace_xml(resp: &mut Response<s3s::Body>, fix: impl FnOnce(&[u8]) -> Option<Vec<u8>>) {
    let Some(body) = resp.body().bytes() else { return };
    let Some(fixed) = fix(&body) else { return };
    let len = fixed.len();
    *resp.body_mut() = s3s::Body::from(Bytes::from(fixed));
    if resp.headers().contains_key(http::header::CONTENT_LENGTH) {
        resp.headers_mut().insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
}

/// The XML with the quotes of its first `<ETag>"…"</ETag>` removed; `None`
/// when there is no such element.
pub fn unquote_etag_element(xml: &[u8]) -> Option<Vec<u8>> {
    const OPEN: &[u8] = b"<ETag>\"";
    const CLOSE: &[u8] = b"\"</ETag>";
    let start = xml.windows(OPEN.len()).position(|w| w == OPEN)?;
    let inner = start + OPEN.len();
    let end = inner + xml[inner..].windows(CLOSE.len()).position(|w| w == CLOSE)?;
    let mut out = Vec::with_capacity(xml.len());
    out.extend_from_slice(&xml[..inner - 1]);
    out.extend_from_slice(&xml[inner..end]);
    out.extend_from_slice(&xml[end + 1..]);
    Some(out)
}

/// A ListVersionsResult with its `<DeleteMarker>` and `<Version>` elements
/// (s3s writes all markers, then all versions) put back in page order:
/// `order[i]` says whether the page's i-th entry is a marker. They go at
/// the end of the result, after its other elements. `None` (the body kept
/// as it is) when the counts do not match `order` or nothing would move.
/// The tag names cannot occur inside an element's text: s3s escapes `<`.
pub fn interleave_versions(xml: &[u8], order: &[bool]) -> Option<Vec<u8>> {
    const END: &[u8] = b"</ListVersionsResult>";
    fn elements<'a>(xml: &'a [u8], open: &[u8], close: &[u8]) -> Vec<(usize, &'a [u8])> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(i) = find(&xml[at..], open) {
            let start = at + i;
            let Some(j) = find(&xml[start..], close) else { break };
            let end = start + j + close.len();
            out.push((start, &xml[start..end]));
            at = end;
        }
        out
    }
    let markers = elements(xml, b"<DeleteMarker>", b"</DeleteMarker>");
    let versions = elements(xml, b"<Version>", b"</Version>");
    let marker_count = order.iter().filter(|m| **m).count();
    if markers.is_empty() || versions.is_empty() || markers.len() != marker_count || versions.len() != order.len() - marker_count {
        return None;
    }
    let end = xml.len().checked_sub(END.len()).filter(|e| &xml[*e..] == END)?;
    let mut cut: Vec<(usize, usize)> = markers.iter().chain(versions.iter()).map(|(at, e)| (*at, at + e.len())).collect();
    cut.sort_unstable();
    let mut out = Vec::with_capacity(xml.len());
    let mut at = 0;
    for (start, stop) in cut {
        out.extend_from_slice(&xml[at..start]);
        at = stop;
    }
    out.extend_from_slice(xml.get(at..end)?);
    let (mut m, mut v) = (markers.iter(), versions.iter());
    for is_marker in order {
        let (_, e) = if *is_marker { m.next()? } else { v.next()? };
        out.extend_from_slice(e);
    }
    out.extend_from_slice(END);
    Some(out)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn set_headers(headers: &mut http::HeaderMap, pairs: Vec<(&'static str, String)>) {
    for (name, value) in pairs {
        // A value from a rule that is no valid header value is left out.
        if let Ok(v) = http::HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
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
        crate::route::classify_hosted(parts, self.vhosts.bucket_of(&parts.headers).as_deref())
    }

    async fn handle(&self, req: Request<RequestBody>, cx: RequestContext) -> Response<s3s::Body> {
        if !path_is_utf8(req.uri().path()) {
            // s3s would decode it lossily and serve another key.
            return error::xml_response(error::invalid_uri(), &cx.request_id).map(s3s::Body::from);
        }
        let bucket = self.bucket_of(req.headers(), req.uri().path());
        if req.method() == http::Method::OPTIONS {
            return self.preflight(req.headers(), bucket.as_deref(), &cx).await;
        }
        let origin = req.headers().get(http::header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_string);
        let method = req.method().clone();
        // GET ?attributes is GetObjectAttributes (no bucket-level operation has that subresource).
        let attributes = method == http::Method::GET
            && req.uri().query().unwrap_or("").split('&').any(|p| p.split_once('=').map_or(p, |(k, _)| k) == "attributes");
        let (mut parts, body) = req.into_parts();
        if let Some(payload_sha256) = pre_verifiable(&parts, self.classify(&parts).name) {
            match self.auth.sigv4().verify(&parts, None, std::time::SystemTime::now()) {
                Ok(v) => {
                    parts.headers.remove(http::header::AUTHORIZATION);
                    parts.extensions.insert(PreVerified { access_key: v.principal.access_key, payload_sha256 });
                }
                Err(e) => {
                    tracing::debug!(error = %e, "signature refused");
                    return error::xml_response(error::from_gateway(&GatewayError::Auth(e)), &cx.request_id).map(s3s::Body::from);
                }
            }
        }
        let mut req = Request::from_parts(parts, body);
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
        let mut resp = match self.service.call(req.map(s3s::Body::http_body)).await {
            Ok(resp) => resp,
            Err(e) => {
                tracing::error!(error = ?e, "s3s failed to produce a response");
                let err = s3s::S3Error::with_message(s3s::S3ErrorCode::InternalError, "internal error");
                error::xml_response(err, &cx.request_id).map(s3s::Body::from)
            }
        };
        if attributes && resp.status().is_success() {
            unquote_attributes_etag(&mut resp);
        }
        if let Some(order) = resp.extensions_mut().remove::<crate::ops::list::VersionsOrder>() {
            if resp.status().is_success() {
                replace_xml(&mut resp, |xml| interleave_versions(xml, &order.0));
            }
        }
        if let (Some(origin), Some(bucket)) = (origin, bucket) {
            // Only requests with an Origin (browsers) pay for reading the rules.
            match self.rules_of(&bucket).await {
                Ok(Some(rules)) => set_headers(resp.headers_mut(), cors::actual(&rules, &origin, method.as_str())),
                Ok(None) => {}
                Err(e) => tracing::debug!(%bucket, error = %e, "no CORS headers: the bucket's rules are not readable"),
            }
        }
        resp
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
    let gateway = Gateway { store, cfg: Arc::new(cfg.clone()), access: Arc::default() };
    let vhosts = VirtualHosts::new(&cfg.virtual_host_domains)?;
    let mut builder = S3ServiceBuilder::new(gateway.clone());
    builder.set_auth(Keys(Arc::clone(&cfg.keys)));
    builder.set_access(Access(gateway.clone()));
    if !vhosts.is_empty() {
        builder.set_host(vhosts.clone());
    }
    let auth = Arc::new(Authenticator::new(Arc::clone(&cfg.keys), cfg.region.clone(), &["s3"], false));
    let protocol = Arc::new(S3Http { service: builder.build(), gateway: gateway.clone(), vhosts, auth: Arc::clone(&auth) });
    let mut metrics = Metrics::new();
    let lifecycle_metrics = LifecycleMetrics::default();
    lifecycle_metrics.register(metrics.registry_mut());
    let metrics = Arc::new(metrics);
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
        tokio::spawn(expiry_loop(gateway.clone(), stop_rx.clone()));
        tokio::spawn(lifecycle_loop(gateway.clone(), lifecycle_metrics, stop_rx));
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

/// The writer's lifecycle scans (`ops/lifecycle.rs`), one every
/// `lifecycle_scan_interval_ms` (at least 100 ms).
async fn lifecycle_loop(gateway: Gateway, metrics: LifecycleMetrics, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(gateway.cfg.limits.lifecycle_scan_interval_ms.max(100));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        let report = tokio::select! {
            r = gateway.run_lifecycle(crate::ops::write::now_ns(), &metrics) => r,
            _ = stop.changed() => return,
        };
        if report.expired + report.aborted + report.errors > 0 {
            tracing::info!(?report, "lifecycle scan");
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
    fn version_entries_are_put_back_in_page_order() {
        let xml = concat!(
            r#"<?xml version="1.0"?><ListVersionsResult><CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes>"#,
            "<DeleteMarker><Key>a</Key><VersionId>m1</VersionId></DeleteMarker>",
            "<DeleteMarker><Key>b&lt;Version&gt;</Key><VersionId>m2</VersionId></DeleteMarker>",
            "<IsTruncated>false</IsTruncated><Name>bk</Name>",
            "<Version><Key>a</Key><VersionId>v1</VersionId></Version>",
            "<Version><Key>c</Key><VersionId>v3</VersionId></Version>",
            "</ListVersionsResult>"
        );
        // a: marker m1 (newest), version v1; b<Version>: marker m2; c: version v3.
        let out = super::interleave_versions(xml.as_bytes(), &[true, false, true, false]).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            concat!(
                r#"<?xml version="1.0"?><ListVersionsResult><CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes>"#,
                "<IsTruncated>false</IsTruncated><Name>bk</Name>",
                "<DeleteMarker><Key>a</Key><VersionId>m1</VersionId></DeleteMarker>",
                "<Version><Key>a</Key><VersionId>v1</VersionId></Version>",
                "<DeleteMarker><Key>b&lt;Version&gt;</Key><VersionId>m2</VersionId></DeleteMarker>",
                "<Version><Key>c</Key><VersionId>v3</VersionId></Version>",
                "</ListVersionsResult>"
            )
        );
        // Counts that do not match the order, or a single kind: left as they are.
        assert_eq!(super::interleave_versions(xml.as_bytes(), &[true, false, false]), None);
        assert_eq!(super::interleave_versions(xml.as_bytes(), &[true, true, true, false, false]), None);
        let only_versions = "<ListVersionsResult><Version><Key>a</Key></Version></ListVersionsResult>";
        assert_eq!(super::interleave_versions(only_versions.as_bytes(), &[false]), None);
        assert_eq!(super::interleave_versions(b"<Version><DeleteMarker>", &[true, false]), None);
    }

    #[test]
    fn attributes_etag_loses_its_quotes() {
        let xml = br#"<?xml version="1.0"?><GetObjectAttributesResponse><ETag>"abc-2"</ETag><ObjectSize>3</ObjectSize></GetObjectAttributesResponse>"#;
        let out = super::unquote_etag_element(xml).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"<?xml version="1.0"?><GetObjectAttributesResponse><ETag>abc-2</ETag><ObjectSize>3</ObjectSize></GetObjectAttributesResponse>"#
        );
        assert!(super::unquote_etag_element(b"<ObjectSize>3</ObjectSize>").is_none());
        assert!(super::unquote_etag_element(b"<ETag>\"unclosed").is_none());
    }

    #[test]
    fn only_large_signed_payload_object_puts_are_pre_verified() {
        let hash = "a".repeat(64);
        let parts = |method: &str, extra: &[(&str, &str)]| {
            let mut b = http::Request::builder().method(method).uri("/b/k");
            for (k, v) in extra {
                b = b.header(*k, *v);
            }
            b.body(()).unwrap().into_parts().0
        };
        let big = (1u64 << 20).to_string();
        let auth = ("authorization", "AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00");
        let ok = [auth, ("content-length", big.as_str()), ("x-amz-content-sha256", hash.as_str())];
        assert_eq!(super::pre_verifiable(&parts("PUT", &ok), "PutObject"), Some([0xaa; 32]));
        assert_eq!(super::pre_verifiable(&parts("PUT", &ok), "UploadPart"), Some([0xaa; 32]));
        // Other routes (their handlers do not check the payload hash), methods, small bodies, other modes.
        assert_eq!(super::pre_verifiable(&parts("PUT", &ok), "PutBucketConfig"), None);
        assert_eq!(super::pre_verifiable(&parts("PUT", &ok), "PutObjectTagging"), None);
        assert_eq!(super::pre_verifiable(&parts("POST", &ok), "PutObject"), None);
        let small = [auth, ("content-length", "1048575"), ("x-amz-content-sha256", hash.as_str())];
        assert_eq!(super::pre_verifiable(&parts("PUT", &small), "PutObject"), None);
        let unsigned = [auth, ("content-length", big.as_str()), ("x-amz-content-sha256", "UNSIGNED-PAYLOAD")];
        assert_eq!(super::pre_verifiable(&parts("PUT", &unsigned), "PutObject"), None);
        let streaming = [auth, ("content-length", big.as_str()), ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")];
        assert_eq!(super::pre_verifiable(&parts("PUT", &streaming), "PutObject"), None);
        let anonymous = [("content-length", big.as_str()), ("x-amz-content-sha256", hash.as_str())];
        assert_eq!(super::pre_verifiable(&parts("PUT", &anonymous), "PutObject"), None);
        let twice =
            [auth, ("content-length", big.as_str()), ("x-amz-content-sha256", hash.as_str()), ("x-amz-content-sha256", hash.as_str())];
        assert_eq!(super::pre_verifiable(&parts("PUT", &twice), "PutObject"), None);
        let v2 = [("authorization", "AWS k:sig"), ("content-length", big.as_str()), ("x-amz-content-sha256", hash.as_str())];
        assert_eq!(super::pre_verifiable(&parts("PUT", &v2), "PutObject"), None);
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
