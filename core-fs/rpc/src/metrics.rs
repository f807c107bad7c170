//! Prometheus metrics of a service process, served as OpenMetrics text by
//! the RPC server itself: a plain HTTP `GET /metrics` on the RPC port
//! ([`crate::http`] says how the server tells HTTP from RPC).
//!
//! A [`MetricsRegistry`] is shared by everything in one service: the RPC
//! server registers [`RpcMetrics`] in it, the service its own counters
//! ([`MetricsRegistry::register`], live `prometheus-client` metrics updated
//! on the hot path) and values read at scrape time
//! ([`MetricsRegistry::register_snapshot`]: space, chain states, journal
//! statistics — read from the service's state when scraped, never copied on
//! the hot path). Same encoder and content type as the HTTP gateways'
//! `/metrics` (`fskv-gateway`'s `Metrics`).
//!
//! Naming rules (all services): `fskv_<service>_<what>[_<unit>]`, units in
//! the name (`_seconds`, `_bytes`), counters end in `_total` (the encoder
//! adds it: register counters without it).
//!
//! RPC metrics (every service; `method` is the method's name, e.g.
//! `storage.WriteChunk`, or `unknown`; `code` an `ErrorCode` name):
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fskv_rpc_requests_total` | counter | method | requests answered (refused ones included) |
//! | `fskv_rpc_request_errors_total` | counter | method, code | requests answered with an error |
//! | `fskv_rpc_request_duration_seconds` | histogram (50 µs … 52 s) | method | handler start to reply queued |
//! | `fskv_rpc_requests_in_flight` | gauge | – | handlers running |
//! | `fskv_rpc_connections_open` | gauge | – | connections being served (RPC and HTTP) |
//! | `fskv_rpc_connections_accepted_total` | counter | – | connections accepted |
//! | `fskv_rpc_connections_refused_total` | counter | – | connections closed at accept (`max_connections`) |
//! | `fskv_rpc_http_requests_total` | counter | status | HTTP requests on the RPC port, by response status |
//! | `fskv_rpc_auth_failures_total` | counter | reason | connections closed because their handshake failed ([`crate::auth`] reason names) |
//! | `fskv_rpc_connections_evicted_total` | counter | – | connections closed in their handshake to make room (`max_unauthenticated_connections`) |

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};
use std::sync::{Arc, OnceLock};

pub use prometheus_client;
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::metrics::histogram::Histogram;

/// The content type of [`MetricsRegistry::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A label set built at run time: `(name, value)` pairs.
pub type Labels = Vec<(&'static str, String)>;

/// A histogram of durations in seconds: 50 µs doubling to ~52 s.
pub fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
}

/// Every metric of one service; shared by its RPC server(s) and its code.
pub struct MetricsRegistry {
    registry: Mutex<Registry>,
    rpc: OnceLock<Arc<RpcMetrics>>,
}

impl std::fmt::Debug for MetricsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsRegistry")
    }
}

impl MetricsRegistry {
    pub fn new() -> Arc<MetricsRegistry> {
        Arc::new(MetricsRegistry { registry: Mutex::new(Registry::default()), rpc: OnceLock::new() })
    }

    /// Registers a live metric under `name` (a counter without `_total`).
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry.lock().register(name, help, metric);
    }

    /// Registers values computed when scraped: `collect` fills a
    /// [`Snapshot`]. It runs on the scraping task, so it must be cheap and
    /// must not block (read in-memory state only).
    pub fn register_snapshot(&self, collect: impl Fn(&mut Snapshot) + Send + Sync + 'static) {
        self.registry.lock().register_collector(Box::new(SnapshotCollector(Box::new(collect))));
    }

    /// The RPC server's metrics, registered at the first call.
    pub fn rpc(&self) -> Arc<RpcMetrics> {
        self.rpc.get_or_init(|| Arc::new(RpcMetrics::register(self))).clone()
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 << 10);
        // Writing into a String cannot fail; a collector's error ends the text early.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry.lock());
        out
    }
}

/// The RPC server's metrics (table in the module doc).
pub struct RpcMetrics {
    pub requests: Family<Labels, Counter>,
    pub errors: Family<Labels, Counter>,
    pub duration: Family<Labels, Histogram, fn() -> Histogram>,
    pub in_flight: Gauge,
    pub connections_open: Gauge,
    pub connections_accepted: Counter,
    pub connections_refused: Counter,
    pub http_requests: Family<Labels, Counter>,
    pub auth_failures: Family<Labels, Counter>,
    pub connections_evicted: Counter,
}

impl RpcMetrics {
    fn register(registry: &MetricsRegistry) -> RpcMetrics {
        let m = RpcMetrics {
            requests: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            in_flight: Gauge::default(),
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            connections_refused: Counter::default(),
            http_requests: Family::default(),
            auth_failures: Family::default(),
            connections_evicted: Counter::default(),
        };
        registry.register("fskv_rpc_requests", "RPC requests answered (refused ones included)", m.requests.clone());
        registry.register("fskv_rpc_request_errors", "RPC requests answered with an error, by error code", m.errors.clone());
        registry.register("fskv_rpc_request_duration_seconds", "From handler start to the reply queued", m.duration.clone());
        registry.register("fskv_rpc_requests_in_flight", "RPC handlers running", m.in_flight.clone());
        registry.register("fskv_rpc_connections_open", "Connections being served (RPC and HTTP)", m.connections_open.clone());
        registry.register("fskv_rpc_connections_accepted", "Connections accepted", m.connections_accepted.clone());
        registry.register("fskv_rpc_connections_refused", "Connections closed at accept (max_connections)", m.connections_refused.clone());
        registry.register(
            "fskv_rpc_connections_evicted",
            "Unauthenticated connections closed to make room for new ones (max_unauthenticated_connections)",
            m.connections_evicted.clone(),
        );
        registry.register("fskv_rpc_http_requests", "HTTP requests on the RPC port, by response status", m.http_requests.clone());
        registry.register(
            "fskv_rpc_auth_failures",
            "Connections closed because their authentication handshake failed",
            m.auth_failures.clone(),
        );
        m
    }

    /// Counts one failed handshake.
    pub fn auth_failure(&self, reason: crate::auth::AuthFailure) {
        self.auth_failures.get_or_create(&vec![("reason", reason.name().to_string())]).inc();
    }

    /// Counts one answered request (and its error code, if any).
    pub fn record(&self, method: &'static str, error: Option<fskv_types::ErrorCode>, seconds: Option<f64>) {
        let labels = vec![("method", method.to_string())];
        self.requests.get_or_create(&labels).inc();
        if let Some(s) = seconds {
            self.duration.get_or_create(&labels).observe(s);
        }
        if let Some(code) = error {
            self.errors.get_or_create(&vec![("method", method.to_string()), ("code", format!("{code:?}"))]).inc();
        }
    }
}

/// Values read at scrape time, grouped in families.
#[derive(Default)]
pub struct Snapshot {
    families: Vec<SnapshotFamily>,
}

struct SnapshotFamily {
    name: &'static str,
    help: &'static str,
    counter: bool,
    samples: Vec<(Labels, f64)>,
}

impl Snapshot {
    /// A gauge sample; samples of one name form one family (give them the
    /// same help).
    pub fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, value: f64) {
        self.push(name, help, false, labels, value);
    }

    /// A counter sample (`name` without `_total`; the value never decreases
    /// while the process lives).
    pub fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, value: u64) {
        self.push(name, help, true, labels, value as f64);
    }

    fn push(&mut self, name: &'static str, help: &'static str, counter: bool, labels: Labels, value: f64) {
        let family = match self.families.iter().position(|f| f.name == name) {
            Some(i) => &mut self.families[i],
            None => {
                self.families.push(SnapshotFamily { name, help, counter, samples: Vec::new() });
                let last = self.families.len() - 1;
                &mut self.families[last]
            }
        };
        family.samples.push((labels, value));
    }
}

struct SnapshotCollector(Box<dyn Fn(&mut Snapshot) + Send + Sync>);

impl std::fmt::Debug for SnapshotCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotCollector")
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut snapshot = Snapshot::default();
        (self.0)(&mut snapshot);
        for f in &snapshot.families {
            let kind = if f.counter { MetricType::Counter } else { MetricType::Gauge };
            let mut family = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            for (labels, value) in &f.samples {
                let sample = family.encode_family(labels)?;
                if f.counter {
                    // Cannot lose precision below 2^53; counters here are counts and bytes.
                    ConstCounter::new(*value as u64).encode(sample)?;
                } else {
                    ConstGauge::new(*value).encode(sample)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_live_and_snapshot_metrics() {
        let registry = MetricsRegistry::new();
        let rpc = registry.rpc();
        rpc.record("storage.WriteChunk", None, Some(0.001));
        rpc.record("storage.WriteChunk", Some(fskv_types::ErrorCode::Overloaded), Some(0.002));
        registry.register_snapshot(|s| {
            s.gauge("fskv_test_used_bytes", "used", vec![("target", "101".into())], 4096.0);
            s.gauge("fskv_test_used_bytes", "used", vec![("target", "102".into())], 0.0);
            s.counter("fskv_test_records", "records", vec![], 7);
        });
        let text = registry.render();
        assert!(text.contains("fskv_rpc_requests_total{method=\"storage.WriteChunk\"} 2"), "{text}");
        assert!(text.contains("fskv_rpc_request_errors_total{method=\"storage.WriteChunk\",code=\"Overloaded\"} 1"), "{text}");
        assert!(text.contains("fskv_rpc_request_duration_seconds_count{method=\"storage.WriteChunk\"} 2"), "{text}");
        assert!(text.contains("fskv_test_used_bytes{target=\"101\"} 4096"), "{text}");
        assert!(text.contains("fskv_test_used_bytes{target=\"102\"} 0"), "{text}");
        assert!(text.contains("fskv_test_records_total 7"), "{text}");
        assert_eq!(text.matches("# TYPE fskv_test_used_bytes gauge").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        // The same registry gives the same RPC metrics to a second server.
        assert!(Arc::ptr_eq(&rpc, &registry.rpc()));
    }
}
