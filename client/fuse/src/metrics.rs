//! The mount's Prometheus metrics (docs/metrics.md "FUSE"), served by
//! `fskv mount --metrics-listen ADDR` on `GET /metrics`.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `fskv_fuse_ops` | counter | `op` | requests of the kernel handled on tokio (lookup, getattr, read, write, create, …) |
//! | `fskv_fuse_op_duration_seconds` | histogram | `op` | from the kernel's request to the reply |
//! | `fskv_fuse_ops_in_flight` | gauge | | requests being handled |
//! | `fskv_fuse_buffered_writes` | counter | | writes answered from the write-behind buffer on the request thread (not in the two above) |
//! | `fskv_fuse_buffered_write_bytes` | counter | | their bytes |
//! | `fskv_fuse_read_arounds` | counter | | small reads widened to their window whose other pages were stored in the kernel's cache ([`crate::readaround`]) |
//! | `fskv_fuse_read_around_stored_bytes` | counter | | the bytes so stored |
//!
//! Virtual-directory (USRBIO) requests are answered on the request thread
//! and are not counted. A request's error is not told apart from its
//! success here (the reply is sent inside each operation); the errors of
//! the cluster calls behind them are in the services' own metrics.

use fskv_rpc::metrics::{duration_histogram, Counter, Family, Gauge, Histogram, Labels, MetricsRegistry};
use std::sync::Arc;
use std::time::Duration;

/// The mount's metrics (see the module table).
pub struct FuseMetrics {
    /// Handles of each op's series, so a request pays a map lookup under a
    /// read lock, not a label allocation.
    by_op: parking_lot::RwLock<std::collections::HashMap<&'static str, (Counter, Histogram)>>,
    ops: Family<Labels, Counter>,
    duration: Family<Labels, Histogram, fn() -> Histogram>,
    in_flight: Gauge,
    buffered_writes: Counter,
    buffered_write_bytes: Counter,
    read_arounds: Counter,
    read_around_stored_bytes: Counter,
}

impl FuseMetrics {
    /// Registers the mount's metrics in `registry`.
    pub fn register(registry: &MetricsRegistry) -> Arc<FuseMetrics> {
        let m = FuseMetrics {
            by_op: Default::default(),
            ops: Family::default(),
            duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            in_flight: Gauge::default(),
            buffered_writes: Counter::default(),
            buffered_write_bytes: Counter::default(),
            read_arounds: Counter::default(),
            read_around_stored_bytes: Counter::default(),
        };
        registry.register("fskv_fuse_ops", "FUSE requests handled, by operation", m.ops.clone());
        registry.register("fskv_fuse_op_duration_seconds", "FUSE request to reply, by operation", m.duration.clone());
        registry.register("fskv_fuse_ops_in_flight", "FUSE requests being handled", m.in_flight.clone());
        registry.register("fskv_fuse_buffered_writes", "writes answered from the write-behind buffer", m.buffered_writes.clone());
        registry.register(
            "fskv_fuse_buffered_write_bytes",
            "bytes of writes answered from the write-behind buffer",
            m.buffered_write_bytes.clone(),
        );
        registry.register(
            "fskv_fuse_read_arounds",
            "small reads whose surrounding pages were stored in the page cache",
            m.read_arounds.clone(),
        );
        registry.register(
            "fskv_fuse_read_around_stored_bytes",
            "bytes read around small reads and stored in the page cache",
            m.read_around_stored_bytes.clone(),
        );
        Arc::new(m)
    }

    fn finished(&self, op: &'static str, took: Duration) {
        self.in_flight.dec();
        let cached = self.by_op.read().get(op).cloned();
        let (count, duration) = cached.unwrap_or_else(|| {
            let labels = vec![("op", op.to_string())];
            let series = (self.ops.get_or_create(&labels).clone(), self.duration.get_or_create(&labels).clone());
            self.by_op.write().insert(op, series.clone());
            series
        });
        count.inc();
        duration.observe(took.as_secs_f64());
    }

    /// A read-around's store of `bytes` (0: cancelled or refused; not counted).
    pub(crate) fn read_around(&self, bytes: u64) {
        if bytes > 0 {
            self.read_arounds.inc();
            self.read_around_stored_bytes.inc_by(bytes);
        }
    }

    pub(crate) fn buffered_write(&self, bytes: u64) {
        self.buffered_writes.inc();
        self.buffered_write_bytes.inc_by(bytes);
    }
}

/// One request being handled: counted in flight from `start`, timed and
/// counted when dropped (also if its task panics or is aborted).
pub(crate) struct OpTimer {
    metrics: Arc<FuseMetrics>,
    op: &'static str,
    start: std::time::Instant,
}

impl OpTimer {
    pub(crate) fn start(metrics: &Arc<FuseMetrics>, op: &'static str) -> OpTimer {
        metrics.in_flight.inc();
        OpTimer { metrics: Arc::clone(metrics), op, start: std::time::Instant::now() }
    }
}

impl Drop for OpTimer {
    fn drop(&mut self) {
        self.metrics.finished(self.op, self.start.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_counted_and_timed_by_name_and_in_flight_returns_to_zero() {
        let registry = MetricsRegistry::new();
        let m = FuseMetrics::register(&registry);
        let a = OpTimer::start(&m, "lookup");
        let b = OpTimer::start(&m, "lookup");
        assert_eq!(m.in_flight.get(), 2);
        drop((a, b));
        drop(OpTimer::start(&m, "read"));
        m.buffered_write(4096);
        assert_eq!(m.in_flight.get(), 0);
        let text = registry.render();
        assert!(text.contains("fskv_fuse_ops_total{op=\"lookup\"} 2"), "{text}");
        assert!(text.contains("fskv_fuse_ops_total{op=\"read\"} 1"), "{text}");
        assert!(text.contains("fskv_fuse_op_duration_seconds_count{op=\"lookup\"} 2"), "{text}");
        assert!(text.contains("fskv_fuse_buffered_write_bytes_total 4096"), "{text}");
    }
}
