//! The meta service's Prometheus metrics, served with the RPC server's on
//! `GET /metrics` of the service's port (see `fskv_rpc::metrics`).
//! Operations are counted where every request enters
//! (`MetaService::execute`, once per request with its final result);
//! transactions where every operation commits (`Inner::commit_group`, one
//! KV transaction per group of batched requests; a failed group is retried
//! request by request, each a group of its own).
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fskv_meta_ops_total` | counter | op, result (`ok`, `error`) | operations executed (`op` as in logs: `create`, `stat`, …) |
//! | `fskv_meta_txn_commits_total` | counter | – | KV transactions committed (one per group) |
//! | `fskv_meta_txn_retries_total` | counter | reason (`conflict`, `other`) | transaction attempts retried (`conflict`: `NotCommitted`; `other`: too old, unknown result) |
//! | `fskv_meta_txn_failures_total` | counter | – | groups that ended in an error (after retries) |
//! | `fskv_meta_txn_duration_seconds` | histogram | – | a group's transaction, retries included |
//! | `fskv_meta_txn_group_ops` | histogram | – | requests committed in one transaction (batching) |

use fskv_rpc::metrics::{duration_histogram, Counter, Family, Histogram, Labels, MetricsRegistry};

/// Live counters of one meta service.
pub struct MetaMetrics {
    pub ops: Family<Labels, Counter>,
    pub commits: Counter,
    pub retries: Family<Labels, Counter>,
    pub failures: Counter,
    pub txn_duration: Histogram,
    pub group_ops: Histogram,
}

impl MetaMetrics {
    pub fn register(registry: &MetricsRegistry) -> MetaMetrics {
        let m = MetaMetrics {
            ops: Family::default(),
            commits: Counter::default(),
            retries: Family::default(),
            failures: Counter::default(),
            txn_duration: duration_histogram(),
            group_ops: Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]),
        };
        registry.register("fskv_meta_ops", "Metadata operations executed, by op and result", m.ops.clone());
        registry.register("fskv_meta_txn_commits", "KV transactions committed", m.commits.clone());
        registry.register("fskv_meta_txn_retries", "Transaction attempts retried, by reason", m.retries.clone());
        registry.register("fskv_meta_txn_failures", "Transaction groups that ended in an error", m.failures.clone());
        registry.register("fskv_meta_txn_duration_seconds", "A group's transaction, retries included", m.txn_duration.clone());
        registry.register("fskv_meta_txn_group_ops", "Requests committed in one transaction", m.group_ops.clone());
        m
    }
}
