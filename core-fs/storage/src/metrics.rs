//! The storage service's Prometheus metrics, served with the RPC server's
//! on `GET /metrics` of the service's port (see `fskv_rpc::metrics`).
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fskv_storage_target_used_bytes` | gauge | target | bytes of the blocks in use (committed and pending versions) |
//! | `fskv_storage_target_capacity_bytes` | gauge | target | pooled space + free disk space (as `SpaceInfo`) |
//! | `fskv_storage_target_free_bytes` | gauge | target | capacity − used |
//! | `fskv_storage_target_chunks` | gauge | target | chunk records in the engine |
//! | `fskv_storage_journal_records_total` | counter | target | appends committed by a journal record (since open) |
//! | `fskv_storage_journal_fallbacks_total` | counter | target | appends that found no journal room (went through RocksDB) |
//! | `fskv_storage_journal_checkpoints_total` | counter | target | journal regions checkpointed |
//! | `fskv_storage_journal_replayed` | gauge | target | journal records replayed at open |
//! | `fskv_storage_write_ops_total` | counter | target | updates applied by the engine (client writes, forwards, truncates, removes) |
//! | `fskv_storage_write_bytes_total` | counter | target | payload bytes of those updates |
//! | `fskv_storage_read_ops_total` | counter | target | chunk reads served (`BatchRead` entries that succeeded) |
//! | `fskv_storage_read_bytes_total` | counter | target | bytes of those reads |
//! | `fskv_storage_syncs_running` | gauge | – | syncs this service drives now (as predecessor) |
//! | `fskv_storage_syncs_total` | counter | result (`done`, `failed`) | syncs ended |
//! | `fskv_storage_sync_chunks_sent_total` | counter | – | full chunks sent by syncs |
//! | `fskv_storage_sync_chunks_removed_total` | counter | – | chunk removals sent by syncs |
//! | `fskv_storage_sync_bytes_sent_total` | counter | – | chunk bytes sent by syncs |
//! | `fskv_storage_last_sync_chunks` | gauge | target, action (`send`, `delete`, `skip`) | plan of the last sync the target completed as predecessor |
//! | `fskv_storage_unsettled_chunks` | gauge | – | chunks waiting for the settle pass |
//! | `fskv_storage_watched_left_overs` | gauge | – | left-overs the serving tail had not committed, watched by the settle pass |
//! | `fskv_storage_target_failed` | gauge | target | 1 once the engine stopped on a disk fault (fail-stop; reported offline) |
//! | `fskv_storage_scrub_passes_total` | counter | target | completed scrub passes |
//! | `fskv_storage_scrub_checked_bytes_total` | counter | target | bytes verified by the scrubber |
//! | `fskv_storage_scrub_corrupt_chunks_total` | counter | target | chunks whose page checksum failed in a scrub |
//! | `fskv_storage_repaired_chunks_total` | counter | target | chunks rewritten from another replica (by the scrubber or a read) |
//! | `fskv_storage_scrub_pass_chunks_left` | gauge | target | chunks left in the current scrub pass |

use fskv_rpc::metrics::{Counter, Family, Gauge, Labels, MetricsRegistry};
use fskv_types::TargetId;

/// Live counters of one storage service.
pub struct StorageMetrics {
    pub write_ops: Family<Labels, Counter>,
    pub write_bytes: Family<Labels, Counter>,
    pub read_ops: Family<Labels, Counter>,
    pub read_bytes: Family<Labels, Counter>,
    pub syncs_running: Gauge,
    pub syncs: Family<Labels, Counter>,
    pub sync_chunks_sent: Counter,
    pub sync_chunks_removed: Counter,
    pub sync_bytes_sent: Counter,
}

pub(crate) fn target_label(target: TargetId) -> Labels {
    vec![("target", target.0.to_string())]
}

impl StorageMetrics {
    /// Registers the live counters in `registry`.
    pub fn register(registry: &MetricsRegistry) -> StorageMetrics {
        let m = StorageMetrics {
            write_ops: Family::default(),
            write_bytes: Family::default(),
            read_ops: Family::default(),
            read_bytes: Family::default(),
            syncs_running: Gauge::default(),
            syncs: Family::default(),
            sync_chunks_sent: Counter::default(),
            sync_chunks_removed: Counter::default(),
            sync_bytes_sent: Counter::default(),
        };
        registry.register("fskv_storage_write_ops", "Updates applied by the chunk engine", m.write_ops.clone());
        registry.register("fskv_storage_write_bytes", "Payload bytes of the updates applied", m.write_bytes.clone());
        registry.register("fskv_storage_read_ops", "Chunk reads served", m.read_ops.clone());
        registry.register("fskv_storage_read_bytes", "Bytes of the chunk reads served", m.read_bytes.clone());
        registry.register("fskv_storage_syncs_running", "Syncs this service drives now (as predecessor)", m.syncs_running.clone());
        registry.register("fskv_storage_syncs", "Syncs ended, by result", m.syncs.clone());
        registry.register("fskv_storage_sync_chunks_sent", "Full chunks sent by syncs", m.sync_chunks_sent.clone());
        registry.register("fskv_storage_sync_chunks_removed", "Chunk removals sent by syncs", m.sync_chunks_removed.clone());
        registry.register("fskv_storage_sync_bytes_sent", "Chunk bytes sent by syncs", m.sync_bytes_sent.clone());
        m
    }

    pub(crate) fn wrote(&self, target: TargetId, bytes: usize) {
        let labels = target_label(target);
        self.write_ops.get_or_create(&labels).inc();
        self.write_bytes.get_or_create(&labels).inc_by(bytes as u64);
    }

    pub(crate) fn read(&self, target: TargetId, bytes: usize) {
        let labels = target_label(target);
        self.read_ops.get_or_create(&labels).inc();
        self.read_bytes.get_or_create(&labels).inc_by(bytes as u64);
    }
}

/// Decrements `syncs_running` however a sync ends.
pub(crate) struct SyncRunning<'a>(&'a StorageMetrics);

impl<'a> SyncRunning<'a> {
    pub(crate) fn start(m: &'a StorageMetrics) -> Self {
        m.syncs_running.inc();
        SyncRunning(m)
    }
}

impl Drop for SyncRunning<'_> {
    fn drop(&mut self) {
        self.0.syncs_running.dec();
    }
}
