//! Prometheus metrics of the gateways (`prometheus-client`), served as
//! OpenMetrics text on `GET /metrics`.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `fskv_gateway_requests_total` | counter | protocol, route, method, status |
//! | `fskv_gateway_request_duration_seconds` | histogram (0.5 ms … 33 s) | protocol, route, method |
//! | `fskv_gateway_requests_in_flight` | gauge | protocol |
//! | `fskv_gateway_requests_refused_total` | counter | protocol, reason (refusals by the shared layer: `read_only`, `uri_too_long`, `body_too_large`, `auth_*`) |
//! | `fskv_gateway_request_body_bytes_total` | counter | protocol, route |
//! | `fskv_gateway_response_body_bytes_total` | counter | protocol, route |
//! | `fskv_gateway_connections_open` | gauge | protocol |
//! | `fskv_gateway_connections_accepted_total` | counter | protocol |
//! | `fskv_gateway_connections_refused_total` | counter | protocol, reason (`per_peer`) |
//! | `fskv_gateway_connections_timed_out_total` | counter | protocol, reason (`header_read`, `idle`, `tls_handshake`, `send_progress`) |
//!
//! `route` is the protocol's name of the operation (low cardinality by
//! construction); `method` is one of the standard methods or `OTHER`;
//! `status` 499 counts requests whose client went away before a response.
//! Duration runs from the request head to the last response byte handed
//! to the connection.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub protocol: &'static str,
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub protocol: &'static str,
    pub route: &'static str,
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub protocol: &'static str,
    pub route: &'static str,
    pub method: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub protocol: &'static str,
    pub reason: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 17))
}

/// Every metric of the shared layer; one per process, shared by its servers.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<StatusLabels, Counter>,
    pub duration: Family<MethodLabels, Histogram, fn() -> Histogram>,
    pub in_flight: Family<ProtocolLabels, Gauge>,
    pub refused: Family<ReasonLabels, Counter>,
    pub body_bytes_in: Family<RouteLabels, Counter>,
    pub body_bytes_out: Family<RouteLabels, Counter>,
    pub connections_open: Family<ProtocolLabels, Gauge>,
    pub connections_accepted: Family<ProtocolLabels, Counter>,
    pub connections_refused: Family<ReasonLabels, Counter>,
    pub connections_timed_out: Family<ReasonLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("fskv_gateway");
        let m = Metrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            in_flight: Family::default(),
            refused: Family::default(),
            body_bytes_in: Family::default(),
            body_bytes_out: Family::default(),
            connections_open: Family::default(),
            connections_accepted: Family::default(),
            connections_refused: Family::default(),
            connections_timed_out: Family::default(),
            registry: Registry::default(),
        };
        registry.register("requests", "Requests answered, by route, method and status", m.requests.clone());
        registry.register("request_duration_seconds", "From request head to the last response byte", m.duration.clone());
        registry.register("requests_in_flight", "Requests being served", m.in_flight.clone());
        registry.register("requests_refused", "Requests refused by the shared layer (limits, role, authentication)", m.refused.clone());
        registry.register("request_body_bytes", "Request body bytes received", m.body_bytes_in.clone());
        registry.register("response_body_bytes", "Response body bytes sent", m.body_bytes_out.clone());
        registry.register("connections_open", "Client connections open", m.connections_open.clone());
        registry.register("connections_accepted", "Client connections accepted", m.connections_accepted.clone());
        registry.register("connections_refused", "Client connections closed at once (per-peer cap)", m.connections_refused.clone());
        registry.register("connections_timed_out", "Client connections closed by a timeout", m.connections_timed_out.clone());
        Metrics { registry, ..m }
    }

    /// Registers more metrics of a protocol (e.g. KV eviction counts) in the
    /// same registry, under `fskv_gateway_<name>`; call before serving.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 << 10);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A bounded label for a method.
pub fn method_label(m: &http::Method) -> &'static str {
    match *m {
        http::Method::GET => "GET",
        http::Method::HEAD => "HEAD",
        http::Method::PUT => "PUT",
        http::Method::POST => "POST",
        http::Method::DELETE => "DELETE",
        http::Method::OPTIONS => "OPTIONS",
        http::Method::PATCH => "PATCH",
        _ => "OTHER",
    }
}
