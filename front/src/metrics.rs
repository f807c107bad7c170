//! The pools' metrics, in the registry of the front's shared-layer
//! [`fskv_gateway::Metrics`] (so `GET /metrics` on every front listener
//! shows them next to the front's own request metrics).
//!
//! | name | type | labels |
//! |---|---|---|
//! | `fskv_gateway_front_processes` | gauge | protocol, role, state (`starting`, `ready`, `suspect`, `down`, `draining`, `stopping`) |
//! | `fskv_gateway_front_in_flight` | gauge | protocol, role |
//! | `fskv_gateway_front_queued` | gauge | protocol, role |
//! | `fskv_gateway_front_starts_total` | counter | protocol, role |
//! | `fskv_gateway_front_stops_total` | counter | protocol, role |
//! | `fskv_gateway_front_crashes_total` | counter | protocol, role (exits not asked for) |
//! | `fskv_gateway_front_start_failures_total` | counter | protocol, role (exit or timeout before serving) |
//! | `fskv_gateway_front_rejected_total` | counter | protocol, role (503s of the pool) |
//! | `fskv_gateway_front_retries_total` | counter | protocol, role (idempotent reads sent again) |
//! | `fskv_gateway_front_upstream_errors_total` | counter | protocol, role (a process failed a request before its response head) |
//! | `fskv_gateway_front_handed_over_total` | counter | protocol, role (client connections passed to a process of the pool) |
//! | `fskv_gateway_front_cold_start_seconds` | histogram 1 ms … 16 s | protocol, role (spawn to serving) |
//! | `fskv_gateway_front_hold_seconds` | histogram 0.1 ms … 13 s | protocol, role (how long a request waited for a process; 0 when one was free) |

use crate::machine::{Counters, PoolMachine, ProcState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub protocol: &'static str,
    pub role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub protocol: &'static str,
    pub role: &'static str,
    pub state: &'static str,
}

fn cold_start_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn hold_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// The metric families of every pool.
#[derive(Clone)]
pub struct FrontMetrics {
    processes: Family<StateLabels, Gauge>,
    in_flight: Family<PoolLabels, Gauge>,
    queued: Family<PoolLabels, Gauge>,
    starts: Family<PoolLabels, Counter>,
    stops: Family<PoolLabels, Counter>,
    crashes: Family<PoolLabels, Counter>,
    start_failures: Family<PoolLabels, Counter>,
    rejected: Family<PoolLabels, Counter>,
    retries: Family<PoolLabels, Counter>,
    upstream_errors: Family<PoolLabels, Counter>,
    handed_over: Family<PoolLabels, Counter>,
    cold_start: Family<PoolLabels, Histogram, fn() -> Histogram>,
    hold: Family<PoolLabels, Histogram, fn() -> Histogram>,
}

impl FrontMetrics {
    /// Registers the families (under `fskv_gateway_front_*`).
    pub fn register(registry: &mut Registry) -> FrontMetrics {
        let m = FrontMetrics {
            processes: Family::default(),
            in_flight: Family::default(),
            queued: Family::default(),
            starts: Family::default(),
            stops: Family::default(),
            crashes: Family::default(),
            start_failures: Family::default(),
            rejected: Family::default(),
            retries: Family::default(),
            upstream_errors: Family::default(),
            handed_over: Family::default(),
            cold_start: Family::new_with_constructor(cold_start_histogram as fn() -> Histogram),
            hold: Family::new_with_constructor(hold_histogram as fn() -> Histogram),
        };
        let r = registry;
        r.register("front_processes", "Gateway processes of a pool, by state", m.processes.clone());
        r.register("front_in_flight", "Requests a pool's processes are serving", m.in_flight.clone());
        r.register("front_queued", "Requests held until a process can take them", m.queued.clone());
        r.register("front_starts", "Gateway processes started", m.starts.clone());
        r.register("front_stops", "Gateway processes stopped by the pool (idle, shutdown)", m.stops.clone());
        r.register("front_crashes", "Gateway processes that exited without being asked to", m.crashes.clone());
        r.register("front_start_failures", "Gateway processes that exited or timed out before serving", m.start_failures.clone());
        r.register("front_rejected", "Requests refused by a pool (503)", m.rejected.clone());
        r.register("front_retries", "Idempotent reads sent again after their process failed", m.retries.clone());
        r.register("front_upstream_errors", "Requests a gateway process failed before its response head", m.upstream_errors.clone());
        r.register("front_handed_over", "Client connections handed over to a process of the pool", m.handed_over.clone());
        r.register("front_cold_start_seconds", "From spawning a gateway process to its serving", m.cold_start.clone());
        r.register("front_hold_seconds", "How long a request waited for a process", m.hold.clone());
        m
    }

    /// The handles of one pool.
    pub fn pool(&self, protocol: &'static str, role: &'static str) -> PoolMetrics {
        let l = PoolLabels { protocol, role };
        PoolMetrics {
            processes: ProcState::ALL
                .iter()
                .map(|s| self.processes.get_or_create_owned(&StateLabels { protocol, role, state: s.as_str() }))
                .collect(),
            in_flight: self.in_flight.get_or_create_owned(&l),
            queued: self.queued.get_or_create_owned(&l),
            starts: self.starts.get_or_create_owned(&l),
            stops: self.stops.get_or_create_owned(&l),
            crashes: self.crashes.get_or_create_owned(&l),
            start_failures: self.start_failures.get_or_create_owned(&l),
            rejected: self.rejected.get_or_create_owned(&l),
            retries: self.retries.get_or_create_owned(&l),
            upstream_errors: self.upstream_errors.get_or_create_owned(&l),
            handed_over: self.handed_over.get_or_create_owned(&l),
            cold_start: self.cold_start.get_or_create_owned(&l),
            hold: self.hold.get_or_create_owned(&l),
            synced: Counters::default(),
        }
    }
}

/// One pool's metrics; [`PoolMetrics::sync`] copies the machine's view.
pub struct PoolMetrics {
    processes: Vec<Gauge>,
    in_flight: Gauge,
    queued: Gauge,
    starts: Counter,
    stops: Counter,
    crashes: Counter,
    start_failures: Counter,
    rejected: Counter,
    pub retries: Counter,
    pub upstream_errors: Counter,
    pub handed_over: Counter,
    pub cold_start: Histogram,
    pub hold: Histogram,
    synced: Counters,
}

impl PoolMetrics {
    /// Gauges from the machine's state; counters by the growth of its totals.
    pub fn sync(&mut self, m: &PoolMachine) {
        for (g, s) in self.processes.iter().zip(ProcState::ALL) {
            g.set(m.count(s) as i64);
        }
        self.in_flight.set(m.requests_in_flight() as i64);
        self.queued.set(m.queued() as i64);
        let c = m.counters();
        let old = std::mem::replace(&mut self.synced, c);
        self.starts.inc_by(c.starts - old.starts);
        self.stops.inc_by(c.stops - old.stops);
        self.crashes.inc_by(c.crashes - old.crashes);
        self.start_failures.inc_by(c.start_failures - old.start_failures);
        self.rejected.inc_by(c.rejected - old.rejected);
    }
}
