//! A public listener of the front: a [`fskv_gateway::Protocol`] that
//! classifies each request with its protocol's own classifier and forwards
//! it to a process of the reader or the writer pool.
//!
//! | listener mode | `Access::Read` | `Access::Mutation` |
//! |---|---|---|
//! | `Route` (`--s3-listen`, …) | reader pool (the writer pool when the reader pool can have no process) | writer pool |
//! | `Readers` (`--s3-reader-listen`, …) | reader pool | reader pool (the reader gateway refuses it, naming the writer endpoint) |
//!
//! Forwarding keeps the request as the client sent it: method, request
//! target (bytes unchanged), every header including `Host` and every signed
//! one, the body streamed frame by frame (no buffering; `Content-Length` or
//! chunked framing as received). Only hop-by-hop headers (`Connection`,
//! `Keep-Alive`, `Proxy-Connection`, `Upgrade`) are dropped, and not when
//! the request's SigV4 `SignedHeaders` names them. Responses come back the
//! same way (status, headers, streamed body and trailers). Upstream
//! connections are pooled per gateway process (hyper-util's client); a
//! process the front started is reached over its Unix socket
//! ([`UpstreamConnector`]), a static upstream over TCP.
//!
//! | failure | before the response head | after it |
//! |---|---|---|
//! | the gateway process fails (reset, refused, closed) | the process is made `Suspect` (probed); an idempotent read (GET/HEAD, no body) is sent again (≤ `max_retries`), else 502 | the client connection is closed before the announced length; the process is made `Suspect` |
//! | no response head within `upstream_response_timeout_ms` | 504 | — |
//! | the client's body fails (limit, stall, client gone) | the shared layer's error (413, 408, 400) | — |
//! | the pool refuses (queue full, queue timeout, no process) | 503 with `Retry-After` | — |

use crate::error::FrontError;
use crate::pool::{Pool, Ticket, UnixRoutes};
use crate::protocols::ProtocolSpec;
use bytes::Bytes;
use fskv_gateway::handover::Declined;
use fskv_gateway::{Access, AuthPolicy, BoxError, GatewayError, Protocol, RequestBody, RequestContext, Route};
use http::header::{HeaderName, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::request::Parts;
use http::{HeaderMap, Method, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Where a listener sends requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenMode {
    /// By the protocol's classification: reads to readers, mutations to writers.
    Route,
    /// Everything to the reader pool (a read-only endpoint).
    Readers,
}

impl ListenMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ListenMode::Route => "route",
            ListenMode::Readers => "readers",
        }
    }
}

/// The upstream request body: the client's, streamed; or none (a retry of a bodiless read).
pub enum UpBody {
    Stream(RequestBody),
    Empty,
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpBody::Stream(b) => Pin::new(b).poll_frame(cx),
            UpBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Stream(b) => b.is_end_stream(),
            UpBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Stream(b) => b.size_hint(),
            UpBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// A response body of the front: a gateway's, streamed (holding the
/// request's place on its process until done), or a small one of the front.
pub struct FrontBody {
    kind: Kind,
    ticket: Option<Ticket>,
}

enum Kind {
    Upstream(Incoming),
    Full(Option<Bytes>),
}

impl FrontBody {
    pub fn full(data: Bytes) -> FrontBody {
        FrontBody { kind: Kind::Full(Some(data).filter(|d| !d.is_empty())), ticket: None }
    }

    fn upstream(body: Incoming, ticket: Ticket) -> FrontBody {
        FrontBody { kind: Kind::Upstream(body), ticket: Some(ticket) }
    }
}

impl Body for FrontBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match &mut this.kind {
            Kind::Full(d) => Poll::Ready(d.take().map(|d| Ok(Frame::data(d)))),
            Kind::Upstream(b) => match Pin::new(b).poll_frame(cx) {
                Poll::Ready(None) => {
                    this.ticket.take();
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Err(e))) => {
                    if let Some(t) = this.ticket.take() {
                        tracing::warn!(upstream = %t.target.authority, error = %e, "the gateway process failed while sending a response body; closing the client connection");
                        t.connect_failed();
                    }
                    Poll::Ready(Some(Err(Box::new(e))))
                }
                other => other.map_err(|e| Box::new(e) as BoxError),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(d) => d.is_none(),
            Kind::Upstream(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(d) => SizeHint::with_exact(d.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Upstream(b) => b.size_hint(),
        }
    }
}

/// The pooled HTTP/1.1 client to gateway processes.
pub type UpstreamClient = Client<UpstreamConnector, UpBody>;

/// Connects to an upstream: the Unix socket [`UnixRoutes`] names for the
/// request's authority (a process the front started), else TCP to the
/// authority (`host:port`, a static upstream), with `TCP_NODELAY`; both
/// within the connect timeout.
#[derive(Clone)]
pub struct UpstreamConnector {
    unix: UnixRoutes,
    connect_timeout: Duration,
}

/// A connection to a gateway process.
pub enum UpstreamStream {
    Tcp(TokioIo<tokio::net::TcpStream>),
    Unix(TokioIo<tokio::net::UnixStream>),
}

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = UpstreamStream;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<UpstreamStream>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let unix = uri.authority().and_then(|a| self.unix.get(a));
        let limit = self.connect_timeout;
        Box::pin(async move {
            let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, format!("connecting to {uri} took over {limit:?}"));
            match unix {
                Some(path) => {
                    let s = fskv_gateway::handover::connect_unix_within(&path, limit).await?;
                    Ok(UpstreamStream::Unix(TokioIo::new(s)))
                }
                None => {
                    let authority = uri.authority().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no authority"))?;
                    let s = tokio::time::timeout(limit, tokio::net::TcpStream::connect(authority.as_str()))
                        .await
                        .map_err(|_| timed_out())??;
                    s.set_nodelay(true)?;
                    Ok(UpstreamStream::Tcp(TokioIo::new(s)))
                }
            }
        })
    }
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for UpstreamStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: hyper::rt::ReadBufCursor<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for UpstreamStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Tcp(s) => s.is_write_vectored(),
            UpstreamStream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Upstream connection settings.
#[derive(Clone, Copy, Debug)]
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle_per_process: usize,
    pub max_retries: u32,
}

pub fn upstream_client(s: &UpstreamSettings, unix: UnixRoutes) -> UpstreamClient {
    let conn = UpstreamConnector { unix, connect_timeout: s.connect_timeout };
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(s.idle_timeout)
        .pool_max_idle_per_host(s.max_idle_per_process)
        .pool_timer(TokioTimer::new())
        // Host passes as the client sent it (it is signed).
        .set_host(false)
        .build(conn)
}

/// One public listener's protocol.
pub struct FrontProtocol {
    spec: &'static ProtocolSpec,
    mode: ListenMode,
    readers: Arc<Pool>,
    writers: Arc<Pool>,
    /// Reads go to the reader pool unless it can have no process.
    read_pool_is_writers: bool,
    client: UpstreamClient,
    settings: UpstreamSettings,
}

impl FrontProtocol {
    pub fn new(
        spec: &'static ProtocolSpec,
        mode: ListenMode,
        readers: Arc<Pool>,
        writers: Arc<Pool>,
        client: UpstreamClient,
        settings: UpstreamSettings,
    ) -> FrontProtocol {
        let read_pool_is_writers = mode == ListenMode::Route && !readers.can_serve();
        FrontProtocol { spec, mode, readers, writers, read_pool_is_writers, client, settings }
    }

    fn pool_for(&self, access: Access) -> &Arc<Pool> {
        match (self.mode, access) {
            (ListenMode::Readers, _) => &self.readers,
            (ListenMode::Route, Access::Read) if !self.read_pool_is_writers => &self.readers,
            _ => &self.writers,
        }
    }

    fn error(&self, e: FrontError, request_id: &str) -> Response<FrontBody> {
        let (reply, retry_after) = e.reply();
        self.spec.render(&reply, request_id, retry_after).map(FrontBody::full)
    }
}

/// The front's side of connection handover ([`fskv_gateway::handover`]):
/// a `Route` listener passes a connection to a process of the pool its
/// first request goes to, when one can take it at once and has a handover
/// channel; the connection holds that request's place on the process
/// (counted in flight, so the pool scales by open connections and does not
/// stop the process) until the process closes it. Anything else is given
/// back and proxied per request: for its lifetime on a `Readers` listener
/// or a pool of static upstreams; until `handed_connection_max_age_ms`
/// when the pool could not take it now (cold, full, a full channel), after
/// which the front closes it after a response and the client's next
/// connection is offered again.
impl fskv_gateway::Handoff for FrontProtocol {
    fn offer<'a>(&'a self, head: &'a Parts, stream: tokio::net::TcpStream) -> Pin<Box<dyn Future<Output = Option<Declined>> + Send + 'a>> {
        Box::pin(async move {
            if self.mode != ListenMode::Route {
                return Declined::keep(stream);
            }
            let pool = self.pool_for((self.spec.classify)(head).access);
            let Some(max_age) = pool.handed_max_age() else { return Declined::keep(stream) };
            // Not now (a cold or busy pool, a full channel): proxied, and
            // recycled after the age a handed connection would have been.
            let not_now = |stream| Some(Declined { stream, recycle_after: Some(max_age) });
            let Some((ticket, channel)) = pool.try_acquire_now() else { return not_now(stream) };
            let (mut mine, theirs) =
                match tokio::net::UnixStream::pair().and_then(|(m, t)| Ok((m, std::os::fd::OwnedFd::from(t.into_std()?)))) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(error = %e, "no liveness socket pair for a handover; proxying the connection");
                        return not_now(stream);
                    }
                };
            use std::os::fd::AsFd;
            if let Err(e) = fskv_gateway::handover::send_connection(channel.as_fd(), stream.as_fd(), theirs.as_fd()) {
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    tracing::warn!(upstream = %ticket.target.authority, error = %e, "handing a connection over failed; proxying it");
                    ticket.connect_failed();
                }
                return not_now(stream);
            }
            pool.count_handed_over();
            drop((stream, theirs));
            tokio::spawn(async move {
                // Ends when the process closed its end: the connection is over
                // (or the process is gone).
                let mut one = [0u8; 1];
                let _ = tokio::io::AsyncReadExt::read(&mut mine, &mut one).await;
                drop(ticket);
            });
            None
        })
    }
}

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [&str; 4] = ["connection", "keep-alive", "proxy-connection", "upgrade"];

/// The SigV4 `SignedHeaders` list of a request, if it has one.
fn signed_headers(parts_headers: &HeaderMap, uri: &Uri) -> Option<String> {
    if let Some(auth) = parts_headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let i = auth.find("SignedHeaders=")?;
        let rest = &auth[i + "SignedHeaders=".len()..];
        return Some(rest.split([',', ' ']).next().unwrap_or("").to_ascii_lowercase());
    }
    let q = uri.query()?;
    q.split('&')
        .find_map(|p| p.strip_prefix("X-Amz-SignedHeaders="))
        .map(|v| v.replace("%3B", ";").replace("%3b", ";").to_ascii_lowercase())
}

/// Drops hop-by-hop headers (those `Connection` names too), unless signed.
fn strip_hop_by_hop(headers: &mut HeaderMap, uri: Option<&Uri>) {
    if !HOP_BY_HOP.iter().any(|h| headers.contains_key(*h)) {
        return;
    }
    let signed = uri.and_then(|u| signed_headers(headers, u)).unwrap_or_default();
    let is_signed = |name: &str| signed.split(';').any(|s| s == name);
    let mut drop: Vec<HeaderName> = Vec::new();
    for v in headers.get_all(CONNECTION) {
        for token in v.to_str().unwrap_or("").split(',') {
            let t = token.trim().to_ascii_lowercase();
            if let Ok(n) = HeaderName::from_bytes(t.as_bytes()) {
                // Never the framing or the Host.
                if n != CONTENT_LENGTH && n != TRANSFER_ENCODING && n != http::header::HOST {
                    drop.push(n);
                }
            }
        }
    }
    for h in HOP_BY_HOP {
        drop.push(HeaderName::from_static(h));
    }
    for n in drop {
        if !is_signed(n.as_str()) {
            headers.remove(&n);
        }
    }
}

/// Whether the request has no body (so it can be sent again).
fn bodiless(parts: &Parts) -> bool {
    !parts.headers.contains_key(TRANSFER_ENCODING)
        && parts.headers.get(CONTENT_LENGTH).map_or(true, |v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) == Some(0))
}

fn upstream_request(parts: &Parts, headers: HeaderMap, target: &crate::pool::Target, body: UpBody) -> Result<Request<UpBody>, http::Error> {
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(http::uri::Scheme::HTTP);
    uri.authority = Some(target.authority.clone());
    uri.path_and_query = Some(parts.uri.path_and_query().cloned().unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")));
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = Uri::from_parts(uri)?;
    *req.headers_mut() = headers;
    Ok(req)
}

/// The shared layer's error behind a failed upstream request, when the
/// client's body (not the gateway) failed it.
fn client_body_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a GatewayError> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(g) = err.downcast_ref::<GatewayError>() {
            return Some(g);
        }
        cur = err.source();
    }
    None
}

impl Protocol for FrontProtocol {
    type Body = FrontBody;

    fn name(&self) -> &'static str {
        self.spec.name
    }

    /// The front's own id; the gateway's (`x-amz-request-id`, `x-request-id`) passes unchanged.
    fn request_id_header(&self) -> HeaderName {
        HeaderName::from_static("x-fskv-front-request-id")
    }

    fn classify(&self, parts: &Parts) -> Route {
        let mut r = (self.spec.classify)(parts);
        r.auth = match r.auth {
            AuthPolicy::Open => AuthPolicy::Open,
            // Signatures are the gateway's to verify; the front only runs
            // the key-free checks, and only for protocols that ask for them.
            _ if self.spec.sigv4_services.is_empty() => AuthPolicy::Open,
            _ => AuthPolicy::Delegated,
        };
        r
    }

    async fn handle(&self, req: Request<RequestBody>, cx: RequestContext) -> Response<FrontBody> {
        let (mut parts, body) = req.into_parts();
        let route = (self.spec.classify)(&parts);
        let pool = self.pool_for(route.access);
        let retryable = route.access == Access::Read && matches!(parts.method, Method::GET | Method::HEAD) && bodiless(&parts);
        let mut headers = std::mem::take(&mut parts.headers);
        strip_hop_by_hop(&mut headers, Some(&parts.uri));
        let mut body = Some(UpBody::Stream(body));
        let mut attempt = 0u32;
        loop {
            let ticket = match pool.acquire().await {
                Ok(t) => t,
                Err(why) => {
                    tracing::debug!(pool = pool.role.as_str(), reason = why.label(), "request refused by the pool");
                    return self.error(FrontError::Rejected(why), &cx.request_id);
                }
            };
            let send_headers =
                if retryable && attempt < self.settings.max_retries { headers.clone() } else { std::mem::take(&mut headers) };
            let up_body = body.take().unwrap_or(UpBody::Empty);
            let up = match upstream_request(&parts, send_headers, &ticket.target, up_body) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "cannot build the upstream request");
                    return self.error(FrontError::Upstream(e.to_string()), &cx.request_id);
                }
            };
            match tokio::time::timeout(self.settings.response_timeout, self.client.request(up)).await {
                Ok(Ok(resp)) => {
                    let (mut head, incoming) = resp.into_parts();
                    strip_hop_by_hop(&mut head.headers, None);
                    return Response::from_parts(head, FrontBody::upstream(incoming, ticket));
                }
                Ok(Err(e)) => {
                    if let Some(g) = client_body_error(&e) {
                        // The client's body failed (limit, stall, client gone): not the gateway's fault.
                        tracing::debug!(error = %g, "request body failed while forwarding");
                        return self.spec.render_gateway_error(g, &cx.request_id).map(FrontBody::full);
                    }
                    ticket.connect_failed();
                    let upstream = ticket.target.authority.clone();
                    drop(ticket);
                    if retryable && attempt < self.settings.max_retries {
                        attempt += 1;
                        pool.count_retry();
                        tracing::info!(%upstream, error = %e, attempt, "gateway process failed before answering; sending the read again");
                        continue;
                    }
                    tracing::warn!(%upstream, error = %e, "gateway process failed before answering");
                    return self.error(FrontError::Upstream(e.to_string()), &cx.request_id);
                }
                Err(_) => {
                    let timeout_ms = self.settings.response_timeout.as_millis() as u64;
                    tracing::warn!(upstream = %ticket.target.authority, timeout_ms, "gateway process did not answer in time");
                    return self.error(FrontError::UpstreamTimeout { timeout_ms }, &cx.request_id);
                }
            }
        }
    }

    fn error_response(&self, err: &GatewayError, cx: &RequestContext) -> Response<Bytes> {
        self.spec.render_gateway_error(err, &cx.request_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn hop_by_hop_headers_go_unless_signed() {
        let uri: Uri = "/b/k".parse().unwrap();
        let mut h =
            headers(&[("connection", "close, x-custom"), ("x-custom", "1"), ("keep-alive", "5"), ("host", "h"), ("x-amz-date", "d")]);
        strip_hop_by_hop(&mut h, Some(&uri));
        assert!(h.get("connection").is_none() && h.get("keep-alive").is_none() && h.get("x-custom").is_none());
        assert_eq!(h["host"], "h");
        assert_eq!(h["x-amz-date"], "d");
        let auth =
            "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=connection;host;x-amz-date, Signature=abc";
        let mut h = headers(&[("connection", "keep-alive"), ("authorization", auth), ("host", "h")]);
        strip_hop_by_hop(&mut h, Some(&uri));
        assert_eq!(h["connection"], "keep-alive", "a signed header stays");
        let presigned: Uri = "/b/k?X-Amz-SignedHeaders=connection%3Bhost&X-Amz-Signature=x".parse().unwrap();
        let mut h = headers(&[("connection", "keep-alive"), ("upgrade", "x")]);
        strip_hop_by_hop(&mut h, Some(&presigned));
        assert!(h.get("connection").is_some() && h.get("upgrade").is_none());
        // Nothing to strip: untouched, whatever else is there.
        let mut h = headers(&[("transfer-encoding", "chunked"), ("content-length", "3")]);
        strip_hop_by_hop(&mut h, Some(&uri));
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn only_bodiless_requests_can_be_sent_again() {
        let p = |h: &[(&str, &str)]| {
            let mut b = Request::builder().method("GET").uri("/b/k");
            for (k, v) in h {
                b = b.header(*k, *v);
            }
            b.body(()).unwrap().into_parts().0
        };
        assert!(bodiless(&p(&[])));
        assert!(bodiless(&p(&[("content-length", "0")])));
        assert!(!bodiless(&p(&[("content-length", "5")])));
        assert!(!bodiless(&p(&[("transfer-encoding", "chunked")])));
    }

    #[test]
    fn the_request_target_is_kept_byte_for_byte() {
        let parts =
            Request::builder().method("GET").uri("/b/a%2Fb%20c/./../x?list-type=2&prefix=%E2%9C%93&x=a+b").body(()).unwrap().into_parts().0;
        let target = crate::pool::Target { proc: 0, authority: "127.0.0.1:9".parse().unwrap() };
        let r = upstream_request(&parts, HeaderMap::new(), &target, UpBody::Empty).unwrap();
        assert_eq!(r.uri().path_and_query().unwrap().as_str(), "/b/a%2Fb%20c/./../x?list-type=2&prefix=%E2%9C%93&x=a+b");
        assert_eq!(r.uri().authority().unwrap(), "127.0.0.1:9");
    }
}
