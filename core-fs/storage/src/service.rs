//! The storage service: construction, the RPC router and the helpers its
//! handlers share. The handlers live in the submodules, each an async shell
//! around pure decisions:
//!
//! | file | what | decisions made by |
//! |---|---|---|
//! | `service/write.rs` | `WriteChunk`, `ForwardChunk`, `CopyRange`, `RemoveChunks`: executes the CRAQ step's effects under the chunk lock; the settle pass | [`crate::craq`] (and [`crate::chain`] through it) |
//! | `service/read.rs` | `BatchRead`, `QueryLastChunk` | [`crate::chain::check_read`] |
//! | `service/admin_rpcs.rs` | `CommitChunk`, `QueryChunk`, `SpaceInfo`, `DumpChunkMeta`, `SyncStart` / `SyncDone` | – |
//! | `service/sync_worker.rs` | the recovery worker: syncs a syncing successor, settles chunks whose forward failed | [`crate::chain::sync_successor`], [`crate::sync`] |

mod admin_rpcs;
mod read;
mod repair;
mod sync_worker;
mod write;

pub use write::MAX_COPY_BYTES;

use crate::access::{refuse_users, UserConn};
use crate::chain::{self, Origin};
use crate::error::{Result, StorageError};
use crate::inflight::InflightUpdates;
use crate::locks::ChunkLocks;
use crate::metrics::{target_label, StorageMetrics};
use crate::sync;
use bytes::Bytes;
use fskv_chunk_engine::{ChunkEngine, EngineConfig};
use fskv_client::storage::{RoutingHandle, StorageClient, StorageClientConfig};
use fskv_proto::routing::{ChainInfo, LocalTargetState, PublicTargetState, RoutingInfo};
use fskv_proto::storage::*;
use fskv_proto::storage::{
    BatchRead, CommitChunk, CopyRange, DumpChunkMeta, ForwardChunk, QueryChunk, QueryLastChunk, RemoveChunks, SpaceInfo, SyncDone,
    SyncStart, WriteChunk,
};
use fskv_rpc::metrics::{MetricsRegistry, Snapshot};
use fskv_rpc::{CallOptions, RequestContext, Router, RpcClient, Server, ServerConfig, TcpTransport, Transport};
use fskv_types::{ChainId, ChunkId, NodeId, Status, TargetId};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tracing::{info, info_span, Instrument};

/// Service limits; units are in the names.
#[derive(Clone, Debug)]
pub struct StorageConfig {
    /// This service's node id in the routing info.
    pub node_id: NodeId,
    /// Client writes being replicated at once (forwards from predecessors
    /// are not limited here, only by the RPC server's per-connection limit,
    /// so two services heading each other's chains cannot deadlock on it).
    pub max_in_flight_client_writes: usize,
    /// Batch reads served at once.
    pub max_in_flight_reads: usize,
    /// Bytes one batch read may return.
    pub max_read_batch_bytes: u64,
    /// Deadline of one forward (and of each sync RPC).
    pub forward_timeout_ms: u64,
    /// How often the sync worker re-checks routing even without a change.
    pub sync_poll_ms: u64,
    /// Pause before a failed sync is retried.
    pub sync_retry_delay_ms: u64,
    /// Pause between two chunk transfers of a sync (throttles recovery in
    /// favour of foreground I/O; 0 = none).
    pub sync_pause_between_chunks_ms: u64,
    /// Run chunk-engine calls on the calling task instead of the blocking
    /// pool. Off in production (engine I/O must not stall the async
    /// threads); on in the deterministic simulation, where a blocking-pool
    /// thread finishing in real time would make the schedule depend on the
    /// machine.
    pub inline_engine_io: bool,
    /// A read batch of at most this many bytes runs its engine reads on
    /// the async worker that received it (`block_in_place`: the worker's
    /// other tasks move to another thread) instead of a blocking-pool
    /// thread, so a small read (a 4 KiB random read through the FUSE
    /// mount) pays no thread hand-off each way. 0 = always the pool. Only
    /// on a multi-thread runtime; elsewhere the pool is used.
    pub max_inline_read_bytes: u64,
    /// Source reads of `CopyRange` (peer to peer) in flight at once: the
    /// sender-grant bound of the service's peer read client.
    pub max_in_flight_copy_reads: usize,
    /// Attempts of one `CopyRange` source read (uncommitted data on the
    /// replica read, stale routing, transport errors), first included.
    pub copy_read_max_attempts: u32,
    /// Scrubber read rate (every committed chunk's page checksums are
    /// verified in the background, bit rot repaired from another replica);
    /// 0 = no scrubber.
    pub scrub_bytes_per_sec: u64,
    /// Pause between two scrub passes.
    pub scrub_pause_between_passes_ms: u64,
    /// The key chunk capabilities of `user:` connections verify with
    /// (derived from the cluster key; `crate::access`). `None`: user
    /// connections are refused (only possible without a cluster key, where
    /// no connection is a user's).
    pub cap_key: Option<Arc<fskv_rpc::auth::CapKey>>,
}

impl StorageConfig {
    pub fn new(node_id: NodeId) -> Self {
        StorageConfig {
            node_id,
            max_in_flight_client_writes: 256,
            max_in_flight_reads: 256,
            max_read_batch_bytes: 64 << 20,
            forward_timeout_ms: 10_000,
            sync_poll_ms: 200,
            sync_retry_delay_ms: 200,
            sync_pause_between_chunks_ms: 0,
            inline_engine_io: false,
            max_inline_read_bytes: 64 << 10,
            max_in_flight_copy_reads: 64,
            copy_read_max_attempts: 6,
            scrub_bytes_per_sec: 0,
            scrub_pause_between_passes_ms: 60_000,
            cap_key: fskv_rpc::auth::current().key.map(|k| Arc::new(k.cap_key())),
        }
    }
}

/// One hosted target.
pub struct Target {
    pub id: TargetId,
    pub engine: Arc<ChunkEngine>,
    locks: ChunkLocks,
    /// The newest sync mark from the predecessor: sync-start clears `done`,
    /// sync-done sets it, each for its chain version; a mark of an older
    /// chain version than the one held is ignored (two syncs of one target
    /// at two chain versions can overlap, and their marks arrive in any
    /// order: simulation seed 398 at 5 ms ticks, where the older sync's
    /// late sync-done undid the newer one's). Counts only while routing
    /// shows this target syncing at that chain version (a late sync-done
    /// of an older version must not make a waiting target report
    /// up-to-date).
    sync_mark: Mutex<SyncMark>,
    /// Write steps running here, by (chain, request chain version): a sync
    /// waits for the older ones before its dump (`crate::inflight`).
    inflight: InflightUpdates,
    /// The scrubber's progress (`service/repair.rs`).
    scrub: Mutex<ScrubProgress>,
    /// Chunks being repaired now (`service/repair.rs`).
    repairing: Mutex<BTreeSet<ChunkId>>,
}

/// The storage service (cheap to clone).
#[derive(Clone)]
pub struct StorageService {
    inner: Arc<Inner>,
}

struct Inner {
    config: StorageConfig,
    // Ordered maps and sets wherever one is iterated: the same order in
    // every run (deterministic simulation).
    targets: BTreeMap<TargetId, Arc<Target>>,
    routing: RoutingHandle,
    rpc: RpcClient,
    /// Reads the source ranges of `CopyRange` from other chains (same RPC
    /// client and routing as forwards; spreads over serving replicas,
    /// retries uncommitted data and stale routing, checks CRCs).
    peer_reader: StorageClient,
    client_write_slots: Semaphore,
    read_slots: Semaphore,
    /// (me, successor, chain version) of syncs running now.
    syncs: Mutex<BTreeSet<(TargetId, TargetId, u32)>>,
    /// Plan of the last completed sync driven by each local target.
    last_sync: Mutex<BTreeMap<TargetId, sync::PlanSummary>>,
    /// Chunks whose forward failed: they may hold a pending version the tail
    /// committed (lost ack); the worker settles them (bounded set).
    unsettled: Mutex<BTreeSet<(TargetId, ChainId, ChunkId)>>,
    /// Left-overs the serving tail had not committed (`SettleOutcome::Unresolved`),
    /// checked again when their chain changes and at a backoff (bounded set).
    watched: Mutex<BTreeMap<(TargetId, ChainId, ChunkId), write::Watch>>,
    /// The last committed write of each (client, write channel) (`crate::channels`).
    channels: crate::channels::ChannelTable,
    /// Served on `GET /metrics` with the RPC server's metrics.
    registry: Arc<MetricsRegistry>,
    metrics: StorageMetrics,
}

/// A running service: its RPC server, its sync worker and its scrubber.
pub struct RunningStorage {
    pub service: StorageService,
    server: Server,
    worker: tokio::task::JoinHandle<()>,
    scrubber: tokio::task::JoinHandle<()>,
}

impl RunningStorage {
    pub fn local_addr(&self) -> &str {
        self.server.local_addr()
    }

    /// Stops the sync worker, the scrubber and the server (in-flight
    /// requests get the server's grace period).
    pub async fn shutdown(self) {
        self.worker.abort();
        self.scrubber.abort();
        self.server.shutdown().await;
    }
}

/// First backoff of a retried `CopyRange` source read (doubles, capped at 16x).
const COPY_READ_BACKOFF_MS: u64 = 5;
/// How long a `CopyRange` source read waits for newer routing after a
/// stale-version or not-serving answer.
const COPY_READ_ROUTING_WAIT_MS: u64 = 500;

/// The peer read client's limits (its tags and write channels are never
/// used: it only reads).
fn peer_reader_config(config: &StorageConfig) -> StorageClientConfig {
    StorageClientConfig {
        client_id: u64::from(config.node_id.0),
        max_concurrent_senders: config.max_in_flight_copy_reads.max(1),
        max_attempts: config.copy_read_max_attempts.max(1),
        retry_backoff_ms: COPY_READ_BACKOFF_MS,
        retry_budget_ms: 0,
        call_timeout_ms: config.forward_timeout_ms,
        routing_wait_ms: COPY_READ_ROUTING_WAIT_MS,
        read_affinity: false,
        first_write_seq: 1,
    }
}

impl StorageService {
    /// A service over already opened engines.
    pub fn new(config: StorageConfig, engines: Vec<(TargetId, Arc<ChunkEngine>)>, routing: RoutingHandle, rpc: RpcClient) -> Self {
        let targets = engines
            .into_iter()
            .map(|(id, engine)| {
                (
                    id,
                    Arc::new(Target {
                        id,
                        engine,
                        locks: ChunkLocks::default(),
                        sync_mark: Mutex::new(SyncMark::default()),
                        inflight: InflightUpdates::default(),
                        scrub: Mutex::new(ScrubProgress::default()),
                        repairing: Mutex::new(BTreeSet::new()),
                    }),
                )
            })
            .collect();
        let peer_reader = StorageClient::new(rpc.clone(), routing.clone(), peer_reader_config(&config));
        let registry = MetricsRegistry::new();
        let metrics = StorageMetrics::register(&registry);
        let service = StorageService {
            inner: Arc::new(Inner {
                peer_reader,
                client_write_slots: Semaphore::new(config.max_in_flight_client_writes.max(1)),
                read_slots: Semaphore::new(config.max_in_flight_reads.max(1)),
                config,
                targets,
                routing,
                rpc,
                syncs: Mutex::new(BTreeSet::new()),
                last_sync: Mutex::new(BTreeMap::new()),
                unsettled: Mutex::new(BTreeSet::new()),
                watched: Mutex::new(BTreeMap::new()),
                channels: crate::channels::ChannelTable::new(),
                registry,
                metrics,
            }),
        };
        // Weak: the registry lives in `Inner`.
        let weak = Arc::downgrade(&service.inner);
        service.inner.registry.register_snapshot(move |snap| {
            if let Some(inner) = weak.upgrade() {
                StorageService { inner }.snapshot_metrics(snap);
            }
        });
        service
    }

    /// The registry served on `GET /metrics` of this service's port.
    pub fn metrics(&self) -> &Arc<MetricsRegistry> {
        &self.inner.registry
    }

    /// The values read at scrape time (table in [`crate::metrics`]).
    fn snapshot_metrics(&self, snap: &mut Snapshot) {
        for t in self.space_info().targets {
            let labels = target_label(t.target);
            snap.gauge("fskv_storage_target_used_bytes", "Bytes of the blocks in use", labels.clone(), t.used_bytes as f64);
            snap.gauge("fskv_storage_target_capacity_bytes", "Pooled space plus free disk space", labels.clone(), t.capacity_bytes as f64);
            let free = t.capacity_bytes.saturating_sub(t.used_bytes) as f64;
            snap.gauge("fskv_storage_target_free_bytes", "Capacity minus used", labels, free);
        }
        for t in self.inner.targets.values() {
            let labels = target_label(t.id);
            let journal = t.engine.journal_stats();
            snap.gauge("fskv_storage_target_chunks", "Chunk records in the engine", labels.clone(), t.engine.chunk_count() as f64);
            snap.counter("fskv_storage_journal_records", "Appends committed by a journal record", labels.clone(), journal.records);
            snap.counter("fskv_storage_journal_fallbacks", "Appends that found no journal room", labels.clone(), journal.fallbacks);
            snap.counter("fskv_storage_journal_checkpoints", "Journal regions checkpointed", labels.clone(), journal.checkpoints);
            snap.gauge("fskv_storage_journal_replayed", "Journal records replayed at open", labels.clone(), journal.replayed as f64);
            snap.gauge(
                "fskv_storage_target_failed",
                "1 if the engine stopped on a disk fault (fail-stop)",
                labels.clone(),
                f64::from(u8::from(t.engine.is_failed())),
            );
            let scrub = t.scrub.lock().clone();
            snap.counter("fskv_storage_scrub_passes", "Completed scrub passes", labels.clone(), scrub.passes);
            snap.counter("fskv_storage_scrub_checked_bytes", "Bytes verified by the scrubber", labels.clone(), scrub.bytes_checked);
            snap.counter(
                "fskv_storage_scrub_corrupt_chunks",
                "Chunks whose page checksum failed in a scrub",
                labels.clone(),
                scrub.corrupt_found,
            );
            snap.counter(
                "fskv_storage_repaired_chunks",
                "Chunks rewritten from another replica (scrub or read)",
                labels.clone(),
                scrub.repaired,
            );
            let pass_left = scrub.pass_chunks_total.saturating_sub(scrub.pass_chunks_done) as f64;
            snap.gauge("fskv_storage_scrub_pass_chunks_left", "Chunks left in the current scrub pass", labels, pass_left);
        }
        for (target, plan) in self.inner.last_sync.lock().iter() {
            for (action, n) in [("send", plan.send), ("delete", plan.delete), ("skip", plan.skip)] {
                let labels = vec![("target", target.0.to_string()), ("action", action.to_string())];
                snap.gauge("fskv_storage_last_sync_chunks", "Plan of the last sync completed as predecessor", labels, n as f64);
            }
        }
        let unsettled = self.inner.unsettled.lock().len() as f64;
        snap.gauge("fskv_storage_unsettled_chunks", "Chunks waiting for the settle pass", vec![], unsettled);
        let watched = self.inner.watched.lock().len() as f64;
        snap.gauge(
            "fskv_storage_watched_left_overs",
            "Pending left-overs the serving tail had not committed, checked again when their chain changes",
            vec![],
            watched,
        );
    }

    /// Opens (or creates) one chunk engine per target under `data_dir/target-<id>`.
    pub fn open(
        config: StorageConfig,
        data_dir: &Path,
        targets: &[TargetId],
        engine_config: EngineConfig,
        routing: RoutingHandle,
        rpc: RpcClient,
    ) -> anyhow::Result<Self> {
        let mut engines = Vec::new();
        for t in targets {
            let dir = data_dir.join(format!("target-{}", t.0));
            let engine = ChunkEngine::open(&dir, engine_config.clone())
                .map_err(|e| anyhow::anyhow!("opening the chunk engine of {t} in {}: {e}", dir.display()))?;
            engines.push((*t, Arc::new(engine)));
        }
        Ok(Self::new(config, engines, routing, rpc))
    }

    /// Runs blocking engine work off the async threads (or inline, see
    /// [`StorageConfig::inline_engine_io`]).
    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
        if self.inner.config.inline_engine_io {
            return f();
        }
        tokio::task::spawn_blocking(f).await.map_err(|e| StorageError::Internal(format!("blocking task: {e}")))?
    }

    /// [`Self::blocking`] for a read of `bytes`: small reads run in place
    /// (see [`StorageConfig::max_inline_read_bytes`]).
    async fn blocking_read<T: Send + 'static>(&self, bytes: u64, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
        let multi_thread =
            tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if !self.inner.config.inline_engine_io && multi_thread && bytes <= self.inner.config.max_inline_read_bytes {
            return tokio::task::block_in_place(f);
        }
        self.blocking(f).await
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.config.node_id
    }

    pub fn target_ids(&self) -> Vec<TargetId> {
        let mut ids: Vec<_> = self.inner.targets.keys().copied().collect();
        ids.sort();
        ids
    }

    pub fn engine(&self, target: TargetId) -> Option<Arc<ChunkEngine>> {
        self.inner.targets.get(&target).map(|t| t.engine.clone())
    }

    /// The local state to report in heartbeats (docs/mgmtd.md, "Target states"): up-to-date when
    /// the target is serving or its predecessor finished syncing it at the
    /// chain version where it is syncing now, online otherwise.
    pub fn local_state(&self, target: TargetId) -> Option<LocalTargetState> {
        let t = self.inner.targets.get(&target)?;
        if t.engine.is_failed() {
            // Fail-stop after a disk fault: mgmtd takes it out of its chain.
            return Some(LocalTargetState::Offline);
        }
        let routing = self.inner.routing.current();
        let located = routing.locate_target(target);
        let serving = located.is_some_and(|(_, ct)| ct.state.can_read());
        let synced =
            located.is_some_and(|(chain, ct)| ct.state == PublicTargetState::Syncing && t.sync_mark.lock().done_at(chain.chain_version));
        Some(if serving || synced { LocalTargetState::UpToDate } else { LocalTargetState::Online })
    }

    /// The plan summary of the last sync `target` completed as predecessor.
    /// Recorded only once the syncing target acknowledged `SyncDone`, so it
    /// lags the target's up-to-date state (set when it handles `SyncDone`)
    /// by that reply: whoever sees the target up to date must wait for it.
    /// Chunks waiting for the settle pass (a left-over whose fate was not
    /// known yet: `service/write.rs`).
    pub fn unsettled_chunks(&self) -> usize {
        self.inner.unsettled.lock().len()
    }

    /// Left-overs being watched (`SettleOutcome::Unresolved`: pending here,
    /// not committed at the serving tail when last asked).
    pub fn watched_left_overs(&self) -> usize {
        self.inner.watched.lock().len()
    }

    pub fn last_sync(&self, target: TargetId) -> Option<sync::PlanSummary> {
        self.inner.last_sync.lock().get(&target).copied()
    }

    /// Binds `addr`, serves the storage RPCs and starts the sync worker.
    pub async fn serve(self, addr: &str) -> anyhow::Result<RunningStorage> {
        self.serve_on(Arc::new(TcpTransport::new()), addr).await
    }

    /// [`Self::serve`] over any transport (e.g. the simulated network).
    pub async fn serve_on(self, transport: Arc<dyn Transport>, addr: &str) -> anyhow::Result<RunningStorage> {
        let server = Server::bind(transport, addr, self.router(), ServerConfig::default()).await?;
        let worker = tokio::spawn(self.clone().sync_worker().instrument(info_span!("sync_worker", node = %self.node_id())));
        let scrubber = tokio::spawn(self.clone().scrub_worker().instrument(info_span!("scrubber", node = %self.node_id())));
        info!(addr = server.local_addr(), node = %self.node_id(), targets = ?self.target_ids(), "storage service up");
        Ok(RunningStorage { service: self, server, worker, scrubber })
    }

    /// The RPC routes of the service. Who may call what: [`crate::access`].
    pub fn router(&self) -> Router {
        let s = self.clone();
        let router = Router::new().with_metrics(self.inner.registry.clone()).route::<WriteChunk, _, _>(
            move |ctx: RequestContext, mut req: WriteReq, payload: Bytes| {
                let s = s.clone();
                async move {
                    if let Some(user) = UserConn::of(&ctx, s.inner.config.cap_key.as_ref())? {
                        user.check(req.cap.as_slice(), [req.chunk.inode], true)?;
                        // A user's client id is its own claim: with a write
                        // channel it could make the table refuse another
                        // client's writes (`crate::channels`), so a user's
                        // retries are recognised by their tags only.
                        req.channel = None;
                    }
                    s.handle_write(req, payload).await.map(|r| (r, Bytes::new())).map_err(Status::from)
                }
            },
        );
        let s = self.clone();
        let router = router.route::<CopyRange, _, _>(move |ctx: RequestContext, req: CopyRangeReq, _payload: Bytes| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "CopyRange")?;
                s.handle_copy_range(req).await.map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<ForwardChunk, _, _>(move |ctx: RequestContext, req: ForwardReq, payload: Bytes| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "ForwardChunk")?;
                s.handle_forward(req, payload).await.map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<BatchRead, _, _>(move |ctx: RequestContext, req: BatchReadReq, _payload| {
            let s = s.clone();
            async move {
                if let Some(user) = UserConn::of(&ctx, s.inner.config.cap_key.as_ref())? {
                    user.check(&req.caps, req.ios.iter().map(|io| io.chunk.inode), false)?;
                }
                s.handle_batch_read(req).await.map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<CommitChunk, _, _>(move |ctx: RequestContext, req: CommitReq, _payload| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "CommitChunk")?;
                s.handle_commit(req).await.map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<QueryLastChunk, _, _>(move |ctx: RequestContext, req: QueryLastChunkReq, _payload| {
            let s = s.clone();
            async move {
                if let Some(user) = UserConn::of(&ctx, s.inner.config.cap_key.as_ref())? {
                    user.check(req.cap.as_slice(), [req.inode], false)?;
                }
                s.handle_query_last(req).await.map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<QueryChunk, _, _>(move |ctx: RequestContext, req: QueryChunkReq, _payload| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "QueryChunk")?;
                s.handle_query_chunk(req).map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<RemoveChunks, _, _>(move |ctx: RequestContext, req: RemoveChunksReq, _payload| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "RemoveChunks")?;
                s.handle_remove_chunks(req).await.map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<SpaceInfo, _, _>(move |ctx: RequestContext, _req: SpaceInfoReq, _payload| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "SpaceInfo")?;
                Ok((s.space_info(), Bytes::new()))
            }
        });
        let s = self.clone();
        let router = router.route::<DumpChunkMeta, _, _>(move |ctx: RequestContext, req: DumpChunkMetaReq, _payload| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "DumpChunkMeta")?;
                s.handle_dump(req).await.map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<SyncStart, _, _>(move |ctx: RequestContext, req: SyncReq, _payload| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "SyncStart")?;
                s.handle_sync_mark(req, false).map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let s = self.clone();
        let router = router.route::<SyncDone, _, _>(move |ctx: RequestContext, req: SyncReq, _payload| {
            let s = s.clone();
            async move {
                refuse_users(&ctx, "SyncDone")?;
                s.handle_sync_mark(req, true).map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        #[cfg(feature = "fault-injection")]
        let router = {
            use fskv_proto::storage::{DiskFaultOp, InjectDiskFault, InjectDiskFaultReq, InjectDiskFaultResp};
            let s = self.clone();
            router.route::<InjectDiskFault, _, _>(move |ctx: RequestContext, req: InjectDiskFaultReq, _payload| {
                let s = s.clone();
                async move {
                    refuse_users(&ctx, "InjectDiskFault")?;
                    let target = s.target(req.target).map_err(Status::from)?;
                    let op = match req.op {
                        DiskFaultOp::Read => fskv_chunk_engine::IoOp::Read,
                        DiskFaultOp::Write => fskv_chunk_engine::IoOp::Write,
                        DiskFaultOp::Sync => fskv_chunk_engine::IoOp::Sync,
                    };
                    tracing::warn!(target = %req.target, op = ?req.op, errno = req.errno, "injected disk fault (test build)");
                    target.engine.inject_io_fault(op, req.errno);
                    Ok((InjectDiskFaultResp {}, Bytes::new()))
                }
            })
        };
        #[cfg(feature = "fault-injection")]
        let router = {
            use fskv_proto::storage::{InjectBitRot, InjectBitRotReq, InjectBitRotResp};
            let s = self.clone();
            router.route::<InjectBitRot, _, _>(move |ctx: RequestContext, req: InjectBitRotReq, _payload| {
                let s = s.clone();
                async move {
                    refuse_users(&ctx, "InjectBitRot")?;
                    let target = s.target(req.target).map_err(Status::from)?;
                    let engine = target.engine.clone();
                    let chunk = match req.chunk {
                        Some(chunk) => chunk,
                        None => engine
                            .committed_chunk_ids()
                            .into_iter()
                            .find(|c| engine.meta(*c).is_some_and(|m| m.committed.len_bytes > 0))
                            .ok_or_else(|| {
                                Status::new(fskv_types::ErrorCode::NotFound, format!("{} has no chunk with committed content", req.target))
                            })?,
                    };
                    let len = engine.meta(chunk).map_or(0, |m| u64::from(m.committed.len_bytes));
                    if len == 0 {
                        return Err(Status::new(
                            fskv_types::ErrorCode::NotFound,
                            format!("{chunk} has no committed content on {}", req.target),
                        ));
                    }
                    let offset_bytes = req.offset_bytes % len;
                    tracing::warn!(target = %req.target, %chunk, offset_bytes, "injected bit rot (test build)");
                    s.blocking(move || Ok(engine.corrupt_committed_byte(chunk, offset_bytes)?)).await.map_err(Status::from)?;
                    Ok((InjectBitRotResp { chunk, offset_bytes }, Bytes::new()))
                }
            })
        };
        router
    }

    // ----- helpers -----

    /// `error` of an engine call on `target`, or `TargetFailed` if the
    /// engine has stopped (a disk fault): retryable elsewhere, not internal.
    fn engine_error(target: &Target, error: StorageError) -> StorageError {
        if target.engine.is_failed() {
            StorageError::TargetFailed { target: target.id, cause: error.to_string() }
        } else {
            error
        }
    }

    /// A local target that may serve: `TargetFailed` once its engine has
    /// stopped after a disk fault (fail-stop), for every request and
    /// background pass alike. Its metadata is still in memory but misses
    /// every update since the fault, so an answer from it (a last chunk, a
    /// chunk's versions) could be older than the chain's while its routing
    /// still lists it (simulation seed 4320: meta measured an acknowledged
    /// file's length on such a head and set it to 0). Heartbeats read the
    /// engine directly ([`Self::local_state`]) and report it offline.
    fn target(&self, id: TargetId) -> Result<Arc<Target>> {
        let target = self.inner.targets.get(&id).ok_or(StorageError::UnknownTarget(id))?;
        if target.engine.is_failed() {
            return Err(StorageError::TargetFailed { target: id, cause: "the chunk engine stopped after a disk fault".into() });
        }
        Ok(target.clone())
    }

    fn chain_of(routing: &RoutingInfo, id: ChainId) -> Result<&ChainInfo> {
        routing.chain(id).ok_or(StorageError::UnknownChain(id))
    }

    /// The routing check of a write before its lock is taken (a stale chain
    /// version is refused before any data or lock is touched); the CRAQ
    /// step repeats it under the lock.
    fn precheck_write(&self, chain_id: ChainId, target: TargetId, chain_ver: u32, origin: Origin) -> Result<()> {
        let routing = self.inner.routing.current();
        let chain = Self::chain_of(&routing, chain_id)?;
        chain::check_write(chain, target, chain_ver, origin).map_err(|reject| StorageError::Route { chain: chain_id, target, reject })?;
        Ok(())
    }

    fn call_opts(&self) -> CallOptions {
        CallOptions { timeout_ms: self.inner.config.forward_timeout_ms }
    }

    fn addr_of(routing: &RoutingInfo, node: NodeId) -> Result<String> {
        routing.node_address(node).map(str::to_string).ok_or(StorageError::NoAddress(node))
    }
}

/// A syncing target's last sync mark (see `sync_mark` above).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SyncMark {
    chain_ver: u32,
    done: bool,
}

impl SyncMark {
    /// Applies a mark; false (and unchanged) when it is older than the one held.
    pub(crate) fn apply(&mut self, chain_ver: u32, done: bool) -> bool {
        if chain_ver < self.chain_ver {
            return false;
        }
        *self = SyncMark { chain_ver, done };
        true
    }

    /// Whether the predecessor finished the sync of `chain_ver`.
    pub(crate) fn done_at(&self, chain_ver: u32) -> bool {
        self.done && self.chain_ver == chain_ver
    }
}

#[cfg(test)]
mod sync_mark_tests {
    use super::SyncMark;

    #[test]
    fn an_older_mark_never_undoes_a_newer_one() {
        // Seed 398: syncs at chain versions 3 and 4 overlap; 4's done
        // arrives before 3's done.
        let mut m = SyncMark::default();
        assert!(m.apply(3, false));
        assert!(m.apply(4, false));
        assert!(m.apply(4, true));
        assert!(!m.apply(3, true));
        assert!(m.done_at(4));
        assert!(!m.done_at(3));
        // A retried sync at the same version starts over.
        assert!(m.apply(4, false));
        assert!(!m.done_at(4));
        // A newer version's start clears it.
        assert!(m.apply(4, true));
        assert!(m.apply(5, false));
        assert!(!m.done_at(4) && !m.done_at(5));
    }
}
