//! The front's admin listener (`--admin-listen`): `GET /status` (JSON: the
//! listeners and every pool with its processes) and `GET /metrics` (the
//! shared layer's, with the pool metrics). `fskv admin status --front ADDR`
//! reads `/status` ([`fetch_status`], [`render_status`]).
//!
//! Why an endpoint of its own rather than registering with mgmtd: a pool's
//! state changes many times a second (in flight, queued, processes coming
//! and going) and belongs to one front, of which a cluster may run several
//! behind a load balancer; mgmtd's routing info is what every client and
//! service caches, versioned, and changes only when the cluster does.
//! Pushing pool state there would bump it constantly (or need a second
//! kind of registration and its RPCs) for something only operators read.

use crate::pool::{Pool, PoolStatus};
use crate::proxy::FrontBody;
use bytes::Bytes;
use fskv_gateway::{Access, AuthPolicy, BodyClass, GatewayError, Protocol, RequestBody, RequestContext, Route};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// One public listener in the status.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListenerStatus {
    pub protocol: String,
    /// `route` or `readers`.
    pub mode: String,
    pub address: String,
}

/// `GET /status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FrontStatus {
    pub listeners: Vec<ListenerStatus>,
    pub pools: Vec<PoolStatus>,
}

/// The admin listener's protocol.
pub struct Admin {
    pub listeners: Vec<ListenerStatus>,
    pub pools: Vec<Arc<Pool>>,
}

impl Admin {
    pub fn status(&self) -> FrontStatus {
        FrontStatus { listeners: self.listeners.clone(), pools: self.pools.iter().map(|p| p.status()).collect() }
    }
}

fn json(status: StatusCode, body: String) -> Response<FrontBody> {
    let mut r = Response::new(FrontBody::full(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

impl Protocol for Admin {
    type Body = FrontBody;

    fn name(&self) -> &'static str {
        "front-admin"
    }

    fn classify(&self, _parts: &Parts) -> Route {
        Route { name: "status", access: Access::Read, body: BodyClass::Bodiless, auth: AuthPolicy::Open }
    }

    async fn handle(&self, req: Request<RequestBody>, cx: RequestContext) -> Response<FrontBody> {
        let path = req.uri().path();
        if req.method() != http::Method::GET || (path != "/status" && path != "/") {
            let reply = fskv_gateway::ErrorReply::new(StatusCode::NOT_FOUND, "NotFound", "GET /status or /metrics");
            return reply.json(&cx.request_id).map(FrontBody::full);
        }
        match serde_json::to_string_pretty(&self.status()) {
            Ok(text) => json(StatusCode::OK, text),
            Err(e) => {
                tracing::error!(error = %e, "cannot render the status");
                fskv_gateway::ErrorReply::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "internal error")
                    .json(&cx.request_id)
                    .map(FrontBody::full)
            }
        }
    }

    fn error_response(&self, err: &GatewayError, cx: &RequestContext) -> Response<Bytes> {
        err.reply().json(&cx.request_id)
    }
}

/// Reads `GET http://ADDR/status` of a front (`addr`: `host:port` or a URL).
pub async fn fetch_status(addr: &str, timeout: Duration) -> Result<FrontStatus, String> {
    use http_body_util::BodyExt;
    let base = if addr.contains("://") { addr.trim_end_matches('/').to_string() } else { format!("http://{addr}") };
    let uri: http::Uri = format!("{base}/status").parse().map_err(|e| format!("front address {addr:?}: {e}"))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, http_body_util::Empty<Bytes>>(hyper_util::client::legacy::connect::HttpConnector::new());
    let fetch = async {
        let resp = client.get(uri.clone()).await.map_err(|e| format!("{uri}: {e}"))?;
        let status = resp.status();
        // The status is small; bound it anyway.
        let body = http_body_util::Limited::new(resp.into_body(), 16 << 20).collect().await.map_err(|e| format!("{uri}: {e}"))?.to_bytes();
        if !status.is_success() {
            return Err(format!("{uri}: {status}: {}", String::from_utf8_lossy(&body)));
        }
        serde_json::from_slice(&body).map_err(|e| format!("{uri}: not a front status: {e}"))
    };
    tokio::time::timeout(timeout, fetch).await.map_err(|_| format!("{uri}: no answer within {} ms", timeout.as_millis()))?
}

/// The status as text (`fskv admin status --front`).
pub fn render_status(addr: &str, st: &FrontStatus) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "front {addr}");
    for l in &st.listeners {
        let _ = writeln!(s, "  listen   {:<6} {:<8} {}", l.protocol, l.mode, l.address);
    }
    let _ = writeln!(s, "pools ({}):", st.pools.len());
    for p in &st.pools {
        let bounds = if p.kind == "static" { "static".to_string() } else { format!("{}..{}", p.min, p.max) };
        let cold = p.last_cold_start_ms.map(|ms| format!(", last cold start {ms:.0} ms")).unwrap_or_default();
        let _ = writeln!(
            s,
            "  {:<6} {:<6} {:<7} processes {}, in flight {}, queued {}; requests {} ({} held, {} rejected); starts {}, stops {}, crashes {}, failed starts {}{cold}",
            p.protocol,
            p.role,
            bounds,
            p.processes.len(),
            p.in_flight,
            p.queued,
            p.requests,
            p.held,
            p.rejected,
            p.starts,
            p.stops,
            p.crashes,
            p.start_failures
        );
        for proc in &p.processes {
            let idle = proc.idle_ms.map(|ms| format!(", idle {:.1} s", ms as f64 / 1000.0)).unwrap_or_default();
            let socket = proc.unix_socket.as_deref().map(|p| format!(", via {p}")).unwrap_or_default();
            let _ = writeln!(
                s,
                "    #{:<4} {:<9} {:<22} pid {:<8} in flight {}, requests {}, up {:.1} s{idle}{socket}",
                proc.id,
                proc.state,
                proc.address.as_deref().unwrap_or("-"),
                proc.pid.map_or("-".to_string(), |p| p.to_string()),
                proc.in_flight,
                proc.requests,
                proc.age_ms as f64 / 1000.0
            );
        }
    }
    s
}
