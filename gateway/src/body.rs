//! Request and response bodies as the shared layer hands them over.
//!
//! [`RequestBody`] enforces, while the handler reads it, the body limit of
//! the request's class (also when no `Content-Length` was sent) and the
//! body-progress timeout; its errors are [`GatewayError`]s in a `BoxError`
//! (`GatewayError::from_body_error` gets them back). [`ResponseBody`] counts
//! the bytes sent and, when the response is done or dropped, ends the
//! request's accounting (metrics, the connection's idle clock).

use crate::conn::ConnClock;
use crate::error::GatewayError;
use crate::metrics::{Metrics, ProtocolLabels, RouteLabels, StatusLabels};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

enum Source {
    Stream(Incoming),
    Full(Option<Bytes>),
}

/// The body of a request, read by the protocol's handler.
pub struct RequestBody {
    source: Source,
    limit: u64,
    received: u64,
    /// The connection's clock: its sweeper declares the body stalled.
    clock: Option<Arc<ConnClock>>,
    timeout_ms: u64,
    bytes_in: Option<Counter>,
    failed: bool,
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody").field("limit", &self.limit).field("received", &self.received).finish_non_exhaustive()
    }
}

impl RequestBody {
    pub(crate) fn stream(body: Incoming, limit: u64, clock: Arc<ConnClock>, progress_timeout_ms: u64, bytes_in: Counter) -> Self {
        RequestBody {
            source: Source::Stream(body),
            limit,
            received: 0,
            clock: Some(clock),
            timeout_ms: progress_timeout_ms,
            bytes_in: Some(bytes_in),
            failed: false,
        }
    }

    /// A body already read whole (by the shared layer, or in tests).
    pub fn full(data: Bytes) -> Self {
        RequestBody {
            limit: u64::MAX,
            received: 0,
            source: Source::Full(Some(data)),
            clock: None,
            timeout_ms: 0,
            bytes_in: None,
            failed: false,
        }
    }

    /// The size limit that applies to this body.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Reads the whole body (at most its limit) into memory.
    pub async fn collect(mut self) -> Result<Bytes, GatewayError> {
        use std::future::poll_fn;
        let mut parts: Vec<Bytes> = Vec::new();
        let mut total = 0usize;
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut self).poll_frame(cx)).await {
            let frame = frame.map_err(|e| match e.downcast::<GatewayError>() {
                Ok(g) => *g,
                Err(e) => GatewayError::BodyRead(e.to_string()),
            })?;
            if let Ok(data) = frame.into_data() {
                total += data.len();
                parts.push(data);
            }
        }
        Ok(match parts.len() {
            0 => Bytes::new(),
            1 => parts.pop().unwrap_or_default(),
            _ => {
                let mut all = Vec::with_capacity(total);
                for p in parts {
                    all.extend_from_slice(&p);
                }
                Bytes::from(all)
            }
        })
    }

    fn fail(&mut self, e: GatewayError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.failed = true;
        if let Some(c) = &self.clock {
            c.body_done();
        }
        Poll::Ready(Some(Err(Box::new(e))))
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if let Some(c) = &self.clock {
            c.body_done();
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        let polled = match &mut this.source {
            Source::Full(data) => return Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Source::Stream(body) => Pin::new(body).poll_frame(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(c) = &this.clock {
                    c.body_progress();
                }
                if let Some(d) = frame.data_ref() {
                    this.received += d.len() as u64;
                    if let Some(c) = &this.bytes_in {
                        c.inc_by(d.len() as u64);
                    }
                    if this.received > this.limit {
                        return this.fail(GatewayError::BodyTooLarge { len: None, max: this.limit });
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => this.fail(GatewayError::BodyRead(e.to_string())),
            Poll::Ready(None) => {
                if let Some(c) = &this.clock {
                    c.body_done();
                }
                Poll::Ready(None)
            }
            Poll::Pending => match this.clock.as_ref().map_or(Poll::Pending, |c| c.poll_body_stalled(cx)) {
                Poll::Ready(()) => {
                    tracing::debug!(timeout_ms = this.timeout_ms, received = this.received, "request body stalled; cutting it");
                    let timeout_ms = this.timeout_ms;
                    this.fail(GatewayError::BodyStalled { timeout_ms })
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            _ if self.failed => true,
            Source::Full(d) => d.is_none(),
            Source::Stream(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Full(Some(d)) => SizeHint::with_exact(d.len() as u64),
            Source::Full(None) => SizeHint::with_exact(0),
            Source::Stream(b) => b.size_hint(),
        }
    }
}

/// The accounting of one request, closed when dropped: in-flight gauge,
/// request counter and duration, the connection's clock.
pub(crate) struct Finish {
    pub(crate) clock: Arc<ConnClock>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) protocol: &'static str,
    pub(crate) route: &'static str,
    pub(crate) method: &'static str,
    /// 499 until a response exists: the client went away first.
    pub(crate) status: u16,
    pub(crate) started: std::time::Instant,
    pub(crate) in_flight: Gauge,
}

impl Finish {
    pub(crate) fn start(clock: Arc<ConnClock>, metrics: Arc<Metrics>, protocol: &'static str, method: &'static str) -> Finish {
        clock.on_request_start();
        let in_flight = metrics.in_flight.get_or_create_owned(&ProtocolLabels { protocol });
        in_flight.inc();
        Finish { clock, metrics, protocol, route: "unknown", method, status: 499, started: std::time::Instant::now(), in_flight }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.clock.on_request_end(tokio::time::Instant::now());
        self.in_flight.dec();
        let (protocol, route, method) = (self.protocol, self.route, self.method);
        self.metrics.requests.get_or_create(&StatusLabels { protocol, route, method, status: self.status }).inc();
        self.metrics
            .duration
            .get_or_create(&crate::metrics::MethodLabels { protocol, route, method })
            .observe(self.started.elapsed().as_secs_f64());
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Handler { #[pin] body: B },
        Full { data: Option<Bytes> },
        Forwarded { #[pin] body: hyper::body::Incoming },
    }
}

pin_project! {
    /// A response body as the server sends it: the handler's, or a small
    /// one made by the shared layer (errors, metrics).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        bytes_out: Option<Counter>,
        finish: Option<Finish>,
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn handler(body: B, finish: Finish) -> Self {
        let bytes_out = finish.metrics.body_bytes_out.get_or_create_owned(&RouteLabels { protocol: finish.protocol, route: finish.route });
        ResponseBody { kind: Kind::Handler { body }, bytes_out: Some(bytes_out), finish: Some(finish) }
    }

    /// The front's response to a request sent back through its return socket.
    pub(crate) fn forwarded(body: hyper::body::Incoming, finish: Finish) -> Self {
        let bytes_out = finish.metrics.body_bytes_out.get_or_create_owned(&RouteLabels { protocol: finish.protocol, route: finish.route });
        ResponseBody { kind: Kind::Forwarded { body }, bytes_out: Some(bytes_out), finish: Some(finish) }
    }

    pub(crate) fn full(data: Bytes, finish: Finish) -> Self {
        let bytes_out = finish.metrics.body_bytes_out.get_or_create_owned(&RouteLabels { protocol: finish.protocol, route: finish.route });
        ResponseBody { kind: Kind::Full { data: Some(data).filter(|d| !d.is_empty()) }, bytes_out: Some(bytes_out), finish: Some(finish) }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let r: Poll<Option<Result<Frame<Bytes>, BoxError>>> = match this.kind.project() {
            KindProj::Handler { body } => match body.poll_frame(cx) {
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Forwarded { body } => match body.poll_frame(cx) {
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e) as BoxError))),
                Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        };
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let (Some(d), Some(c)) = (f.data_ref(), this.bytes_out.as_ref()) {
                    c.inc_by(d.len() as u64);
                }
            }
            Poll::Ready(_) => {
                // Done (or failed): the request's accounting ends now.
                this.finish.take();
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Handler { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Forwarded { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Handler { body } => body.size_hint(),
            Kind::Full { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Forwarded { body } => body.size_hint(),
        }
    }
}
