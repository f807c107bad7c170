//! The async shell of the storage service: RPC handlers, per-chunk locks,
//! forwarding along the chain, and the recovery (sync) worker. Every
//! routing decision is made by [`crate::chain`], every sync decision by
//! [`crate::sync`]; this module only does the I/O around them.

use crate::chain::{self, AfterApply, ChainPosition, ForwardKind, Origin, Successor};
use crate::error::{Result, StorageError};
use crate::locks::ChunkLocks;
use crate::sync::{self, LocalChunk, SyncAction};
use bytes::{Bytes, BytesMut};
use fskv_chunk_engine::{ChunkEngine, EngineConfig, ReadMode, UpdateKind, UpdateOptions, UpdateRequest, UpdateTag};
use fskv_client::storage::{RoutingHandle, StorageClient, StorageClientConfig};
use fskv_proto::routing::{ChainInfo, LocalTargetState, PublicTargetState, RoutingInfo};
use fskv_proto::storage::*;
use fskv_proto::storage::{
    BatchRead, CommitChunk, CopyRange, DumpChunkMeta, ForwardChunk, QueryChunk, QueryLastChunk, RemoveChunks, SpaceInfo, SyncDone,
    SyncStart, WriteChunk,
};
use fskv_rpc::{CallOptions, RequestContext, Router, RpcClient, Server, ServerConfig, TcpTransport, Transport};
use fskv_types::{ChainId, ChunkId, NodeId, Status, TargetId};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tracing::{debug, info, info_span, warn, Instrument};

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
    /// Source reads of `CopyRange` (peer to peer) in flight at once: the
    /// sender-grant bound of the service's peer read client.
    pub max_in_flight_copy_reads: usize,
    /// Attempts of one `CopyRange` source read (uncommitted data on the
    /// replica read, stale routing, transport errors), first included.
    pub copy_read_max_attempts: u32,
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
            max_in_flight_copy_reads: 64,
            copy_read_max_attempts: 6,
        }
    }
}

/// One hosted target.
pub struct Target {
    pub id: TargetId,
    pub engine: Arc<ChunkEngine>,
    locks: ChunkLocks,
    /// The chain version of the predecessor's sync-done; cleared by
    /// sync-start. Counts only while routing shows this target syncing at
    /// that chain version (a late sync-done of an older version must not
    /// make a waiting target report up-to-date).
    sync_done: Mutex<Option<u32>>,
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
}

/// Most chunks remembered for settling after failed forwards.
const MAX_UNSETTLED_CHUNKS: usize = 65_536;

/// Remembers a chunk for settling if dropped before [`Self::disarm`] (the
/// future holding it was cancelled mid-forward).
struct SettleIfCancelled<'a> {
    service: &'a StorageService,
    key: Option<(TargetId, ChainId, ChunkId)>,
}

impl SettleIfCancelled<'_> {
    fn disarm(mut self) {
        self.key = None;
    }
}

impl Drop for SettleIfCancelled<'_> {
    fn drop(&mut self) {
        if let Some((target, chain, chunk)) = self.key.take() {
            debug!(%target, %chunk, "update cancelled while forwarding; the chunk will be settled");
            self.service.remember_unsettled(target, chain, chunk);
        }
    }
}

/// What asking the tail about a left-over pending version found.
#[derive(Debug, PartialEq, Eq)]
enum Settle {
    /// Nothing to do (no left-over, or the tail never committed it).
    Done,
    /// The tail could not be asked; try again later.
    Retry,
}

/// A running service: its RPC server and its sync worker.
pub struct RunningStorage {
    pub service: StorageService,
    server: Server,
    worker: tokio::task::JoinHandle<()>,
}

impl RunningStorage {
    pub fn local_addr(&self) -> &str {
        self.server.local_addr()
    }

    /// Stops the sync worker and the server (in-flight requests get the
    /// server's grace period).
    pub async fn shutdown(self) {
        self.worker.abort();
        self.server.shutdown().await;
    }
}

/// Builds an `UpdateTag` from a request tag (one identity end to end).
fn engine_tag(tag: RequestTag) -> UpdateTag {
    UpdateTag { client: tag.client, request: tag.request }
}

/// Largest range one `CopyRange` copies: the largest chunk, which is also
/// the largest write the chunk engine takes.
pub const MAX_COPY_BYTES: u64 = fskv_chunk_engine::MAX_CHUNK_BYTES;

/// First backoff of a retried `CopyRange` source read (doubles, capped at 16x).
const COPY_READ_BACKOFF_MS: u64 = 5;
/// How long a `CopyRange` source read waits for newer routing after a
/// stale-version or not-serving answer.
const COPY_READ_ROUTING_WAIT_MS: u64 = 500;

/// The peer read client's limits (its tags are never used: it only reads).
fn peer_reader_config(config: &StorageConfig) -> StorageClientConfig {
    StorageClientConfig {
        client_id: u64::from(config.node_id.0),
        max_concurrent_senders: config.max_in_flight_copy_reads.max(1),
        max_attempts: config.copy_read_max_attempts.max(1),
        retry_backoff_ms: COPY_READ_BACKOFF_MS,
        retry_budget_ms: 0,
        call_timeout_ms: config.forward_timeout_ms,
        routing_wait_ms: COPY_READ_ROUTING_WAIT_MS,
    }
}

/// Rejects a copy whose source or destination range does not fit a chunk.
fn check_copy_bounds(req: &CopyRangeReq) -> Result<()> {
    let len = u64::from(req.src.len_bytes);
    if len == 0 || len > MAX_COPY_BYTES {
        return Err(StorageError::Invalid(format!("copy of {len} bytes: must be 1..={MAX_COPY_BYTES}")));
    }
    for (what, offset) in [("source", req.src.offset_bytes), ("destination", req.offset_bytes)] {
        if offset.checked_add(len).is_none_or(|end| end > MAX_COPY_BYTES) {
            return Err(StorageError::Invalid(format!("copy {what} range {offset}+{len} exceeds the {MAX_COPY_BYTES}-byte chunk limit")));
        }
    }
    Ok(())
}

/// The length half of `check_payload`, for an update's payload: the chunk
/// engine checks its CRC in the checksum pass it makes anyway
/// (`UpdateOptions::data_crc`), so the payload is not read twice.
fn check_payload_len(chunk: ChunkId, payload: &[u8], len_bytes: u32) -> Result<()> {
    if payload.len() != len_bytes as usize {
        return Err(StorageError::Invalid(format!("{chunk}: payload of {} bytes, header says {len_bytes}", payload.len())));
    }
    Ok(())
}

fn check_payload(chunk: ChunkId, payload: &[u8], len_bytes: u32, crc: u32) -> Result<()> {
    check_payload_len(chunk, payload, len_bytes)?;
    let actual = crc32c::crc32c(payload);
    if actual != crc {
        return Err(StorageError::Checksum { chunk, expected: crc, actual });
    }
    Ok(())
}

impl StorageService {
    /// A service over already opened engines.
    pub fn new(config: StorageConfig, engines: Vec<(TargetId, Arc<ChunkEngine>)>, routing: RoutingHandle, rpc: RpcClient) -> Self {
        let targets = engines
            .into_iter()
            .map(|(id, engine)| (id, Arc::new(Target { id, engine, locks: ChunkLocks::default(), sync_done: Mutex::new(None) })))
            .collect();
        let peer_reader = StorageClient::new(rpc.clone(), routing.clone(), peer_reader_config(&config));
        StorageService {
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
            }),
        }
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

    /// The local state to report in heartbeats (SPEC §6): up-to-date when
    /// the target is serving or its predecessor finished syncing it at the
    /// chain version where it is syncing now, online otherwise.
    pub fn local_state(&self, target: TargetId) -> Option<LocalTargetState> {
        let t = self.inner.targets.get(&target)?;
        let routing = self.inner.routing.current();
        let located = routing.locate_target(target);
        let serving = located.is_some_and(|(_, ct)| ct.state.can_read());
        let synced =
            located.is_some_and(|(chain, ct)| ct.state == PublicTargetState::Syncing && *t.sync_done.lock() == Some(chain.chain_version));
        Some(if serving || synced { LocalTargetState::UpToDate } else { LocalTargetState::Online })
    }

    /// The plan summary of the last sync `target` completed as predecessor.
    /// Recorded only once the syncing target acknowledged `SyncDone`, so it
    /// lags the target's up-to-date state (set when it handles `SyncDone`)
    /// by that reply: whoever sees the target up to date must wait for it.
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
        info!(addr = server.local_addr(), node = %self.node_id(), targets = ?self.target_ids(), "storage service up");
        Ok(RunningStorage { service: self, server, worker })
    }

    /// The RPC routes of the service.
    pub fn router(&self) -> Router {
        let s = self.clone();
        let router = Router::new().route::<WriteChunk, _, _>(move |_ctx: RequestContext, req: WriteReq, payload: Bytes| {
            let s = s.clone();
            async move { s.handle_write(req, payload).await.map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let s = self.clone();
        let router = router.route::<CopyRange, _, _>(move |_ctx: RequestContext, req: CopyRangeReq, _payload: Bytes| {
            let s = s.clone();
            async move { s.handle_copy_range(req).await.map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let s = self.clone();
        let router = router.route::<ForwardChunk, _, _>(move |_ctx, req: ForwardReq, payload: Bytes| {
            let s = s.clone();
            async move { s.handle_forward(req, payload).await.map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let s = self.clone();
        let router = router.route::<BatchRead, _, _>(move |_ctx, req: BatchReadReq, _payload| {
            let s = s.clone();
            async move { s.handle_batch_read(req).await.map_err(Status::from) }
        });
        let s = self.clone();
        let router = router.route::<CommitChunk, _, _>(move |_ctx, req: CommitReq, _payload| {
            let s = s.clone();
            async move { s.handle_commit(req).await.map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let s = self.clone();
        let router = router.route::<QueryLastChunk, _, _>(move |_ctx, req: QueryLastChunkReq, _payload| {
            let s = s.clone();
            async move { s.handle_query_last(req).await.map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let s = self.clone();
        let router = router.route::<QueryChunk, _, _>(move |_ctx, req: QueryChunkReq, _payload| {
            let s = s.clone();
            async move {
                let target = s.target(req.target).map_err(Status::from)?;
                let meta = target.engine.meta(req.chunk).map(|m| sync::remote_meta(&m));
                Ok((QueryChunkResp { meta }, Bytes::new()))
            }
        });
        let s = self.clone();
        let router = router.route::<RemoveChunks, _, _>(move |_ctx, req: RemoveChunksReq, _payload| {
            let s = s.clone();
            async move { s.handle_remove_chunks(req).await.map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let s = self.clone();
        let router = router.route::<SpaceInfo, _, _>(move |_ctx, _req: SpaceInfoReq, _payload| {
            let s = s.clone();
            async move { Ok((s.space_info(), Bytes::new())) }
        });
        let s = self.clone();
        let router = router.route::<DumpChunkMeta, _, _>(move |_ctx, req: DumpChunkMetaReq, _payload| {
            let s = s.clone();
            async move { s.handle_dump(req).await.map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let s = self.clone();
        let router = router.route::<SyncStart, _, _>(move |_ctx, req: SyncReq, _payload| {
            let s = s.clone();
            async move { s.handle_sync_mark(req, false).map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let s = self.clone();
        router.route::<SyncDone, _, _>(move |_ctx, req: SyncReq, _payload| {
            let s = s.clone();
            async move { s.handle_sync_mark(req, true).map(|r| (r, Bytes::new())).map_err(Status::from) }
        })
    }

    // ----- helpers -----

    fn target(&self, id: TargetId) -> Result<Arc<Target>> {
        self.inner.targets.get(&id).cloned().ok_or(StorageError::UnknownTarget(id))
    }

    fn chain_of(routing: &RoutingInfo, id: ChainId) -> Result<&ChainInfo> {
        routing.chain(id).ok_or(StorageError::UnknownChain(id))
    }

    /// Routing check of a write: the current routing info, through the pure
    /// decision function.
    fn check_write(
        &self,
        chain_id: ChainId,
        target: TargetId,
        chain_ver: u32,
        origin: Origin,
    ) -> Result<(Arc<RoutingInfo>, ChainPosition)> {
        let routing = self.inner.routing.current();
        let chain = Self::chain_of(&routing, chain_id)?;
        let pos = chain::check_write(chain, target, chain_ver, origin).map_err(|reject| StorageError::Route {
            chain: chain_id,
            target,
            reject,
        })?;
        Ok((routing, pos))
    }

    fn call_opts(&self) -> CallOptions {
        CallOptions { timeout_ms: self.inner.config.forward_timeout_ms }
    }

    fn addr_of(routing: &RoutingInfo, node: NodeId) -> Result<String> {
        routing.node_address(node).map(str::to_string).ok_or(StorageError::NoAddress(node))
    }

    // ----- write path -----

    async fn handle_write(&self, req: WriteReq, payload: Bytes) -> Result<WriteResp> {
        let span = info_span!("write", chain = %req.chain_id, target = %req.target, chunk = %req.chunk, request = req.tag.request);
        async move {
            let _slot = self.client_write_slot().await?;
            self.head_write(&req, payload).await
        }
        .instrument(span)
        .await
    }

    async fn client_write_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.inner.client_write_slots.acquire().await.map_err(|_| StorageError::Internal("write slots closed".into()))
    }

    /// A client write at the head (the caller holds a client write slot):
    /// routing check, payload check, then the CRAQ step. Client writes and
    /// server-side copies both go through here.
    async fn head_write(&self, req: &WriteReq, payload: Bytes) -> Result<WriteResp> {
        let target = self.target(req.target)?;
        // Stale chain version first (before touching data or locks).
        self.check_write(req.chain_id, req.target, req.chain_ver, Origin::Client)?;
        if let UpdateOp::Write { len_bytes, .. } = req.op {
            check_payload_len(req.chunk, &payload, len_bytes)?;
        }
        let fwd = ForwardReq {
            chain_id: req.chain_id,
            chain_ver: req.chain_ver,
            from: req.target,
            to: req.target,
            chunk: req.chunk,
            op: req.op,
            mode: ForwardMode::Update { version: 0 },
            tag: req.tag,
            chunk_size_hint_bytes: req.chunk_size_hint_bytes,
        };
        let applied = self.apply_update(&target, Origin::Client, &fwd, payload).await?;
        Ok(WriteResp { version: applied.version, len_bytes: applied.len_bytes, crc: applied.crc, duplicate: applied.duplicate })
    }

    /// A server-side copy at the destination head: checks bounds and
    /// routing (stale version first, before any read), reads the source
    /// range from the source chain, then writes it as a client write would.
    async fn handle_copy_range(&self, req: CopyRangeReq) -> Result<CopyRangeResp> {
        let span = info_span!(
            "copy_range",
            chain = %req.chain_id,
            target = %req.target,
            chunk = %req.chunk,
            src_chain = %req.src.chain_id,
            src_chunk = %req.src.chunk,
            request = req.tag.request
        );
        async move {
            check_copy_bounds(&req)?;
            let _slot = self.client_write_slot().await?;
            self.target(req.target)?;
            self.check_write(req.chain_id, req.target, req.chain_ver, Origin::Client)?;
            let (data, src_found_bytes) = self.read_copy_source(req.src).await?;
            let op = UpdateOp::Write { offset_bytes: req.offset_bytes, len_bytes: req.src.len_bytes, crc: crc32c::crc32c(&data) };
            let write = WriteReq {
                chain_id: req.chain_id,
                chain_ver: req.chain_ver,
                target: req.target,
                chunk: req.chunk,
                op,
                tag: req.tag,
                chunk_size_hint_bytes: req.chunk_size_hint_bytes,
            };
            let write = self.head_write(&write, data).await?;
            debug!(version = write.version, duplicate = write.duplicate, src_found_bytes, "copied");
            Ok(CopyRangeResp { write, src_found_bytes })
        }
        .instrument(span)
        .await
    }

    /// The committed bytes of `src` from a serving replica of its chain,
    /// zero-filled to `src.len_bytes` (a missing chunk reads as all zeros);
    /// also returns how many bytes the chunk held.
    async fn read_copy_source(&self, src: CopySource) -> Result<(Bytes, u32)> {
        let read = self.inner.peer_reader.read(src.chain_id, src.chunk, src.offset_bytes, src.len_bytes, false).await;
        let data = match read {
            Ok(r) => r.data,
            Err(e) if e.code() == fskv_types::ErrorCode::NotFound => Bytes::new(),
            Err(e) => {
                return Err(StorageError::CopySource {
                    chain: src.chain_id,
                    chunk: src.chunk,
                    status: Status::new(e.code(), e.to_string()),
                });
            }
        };
        let want = src.len_bytes as usize;
        if data.len() > want {
            return Err(StorageError::Internal(format!("{}: source read returned {} bytes for {want}", src.chunk, data.len())));
        }
        let found = data.len() as u32;
        if data.len() == want {
            return Ok((data, found));
        }
        let mut padded = BytesMut::with_capacity(want);
        padded.extend_from_slice(&data);
        padded.resize(want, 0);
        Ok((padded.freeze(), found))
    }

    async fn handle_forward(&self, req: ForwardReq, payload: Bytes) -> Result<ForwardResp> {
        let span = info_span!("forward", chain = %req.chain_id, target = %req.to, chunk = %req.chunk, from = %req.from);
        async move {
            let target = self.target(req.to)?;
            let origin = Origin::Predecessor(req.from);
            self.check_write(req.chain_id, req.to, req.chain_ver, origin)?;
            let version = match req.mode {
                ForwardMode::Update { .. } => {
                    if let UpdateOp::Write { len_bytes, .. } = req.op {
                        check_payload_len(req.chunk, &payload, len_bytes)?;
                    }
                    self.apply_update(&target, origin, &req, payload).await?.version
                }
                ForwardMode::FullReplace { len_bytes, crc, .. } => {
                    check_payload(req.chunk, &payload, len_bytes, crc)?;
                    self.apply_replace(&target, &req, payload).await?
                }
                ForwardMode::ReplaceRemove => self.apply_replace(&target, &req, payload).await?,
            };
            Ok(ForwardResp { committed_ver: version })
        }
        .instrument(span)
        .await
    }

    /// CRAQ step at one target: lock, apply as pending `committed + 1`,
    /// forward (or commit at the tail), commit on the ack, unlock.
    async fn apply_update(&self, target: &Arc<Target>, origin: Origin, req: &ForwardReq, payload: Bytes) -> Result<Applied> {
        let _guard = target.locks.lock(req.chunk).await;
        // Routing may have changed while we waited for the lock.
        let (routing, pos) = self.check_write(req.chain_id, target.id, req.chain_ver, origin)?;
        if pos.successor.is_some() && matches!(req.mode, ForwardMode::Update { .. }) {
            self.settle_left_over_pending(target, &routing, req.chain_id, req.chunk, Some(engine_tag(req.tag))).await;
        }
        let expected_ver = match (origin, req.mode) {
            (Origin::Predecessor(_), ForwardMode::Update { version }) => Some(version),
            _ => None,
        };
        // The tail (or a one-target chain) commits right after applying:
        // one engine call, one metadata batch.
        let commit_now = pos.successor.is_none();
        let outcome = {
            let (engine, req, payload) = (target.engine.clone(), req.clone(), payload.clone());
            self.blocking(move || {
                let (kind, data_crc) = match req.op {
                    UpdateOp::Write { offset_bytes, crc, .. } => (UpdateKind::Write { offset_bytes, data: &payload }, Some(crc)),
                    UpdateOp::Truncate { len_bytes } => (UpdateKind::Truncate { len_bytes }, None),
                    UpdateOp::Remove => (UpdateKind::Remove, None),
                };
                let update = UpdateRequest {
                    chunk: req.chunk,
                    chain_ver: req.chain_ver,
                    kind,
                    tag: engine_tag(req.tag),
                    expected_ver,
                    chunk_size_hint_bytes: req.chunk_size_hint_bytes,
                };
                // The engine verifies the payload's CRC (see check_payload_len).
                Ok(engine.update_with(&update, UpdateOptions { commit: commit_now, data_crc })?)
            })
            .await?
        };
        let version = outcome.pending_ver;
        assert!(
            version >= outcome.committed_ver && version > 0,
            "update produced version {version} under committed {}",
            outcome.committed_ver
        );
        let already_committed = outcome.duplicate && outcome.pending_ver == outcome.committed_ver;
        match chain::after_apply(&pos, already_committed) {
            AfterApply::AckDuplicate => {
                debug!(version, "duplicate of a committed write");
                return Ok(Applied { version, len_bytes: outcome.len_bytes, crc: outcome.crc, duplicate: true });
            }
            AfterApply::CommitAndAck => {}
            AfterApply::Forward(succ) => {
                // A handler cancelled while its forward is out (its
                // connection closed when the predecessor or the client went
                // away, or its deadline passed) never learns whether the
                // successors committed: settle the chunk like a failed forward.
                let cancelled = SettleIfCancelled { service: self, key: Some((target.id, req.chain_id, req.chunk)) };
                let result = self.forward_update(target, &routing, succ, req, payload, version).await;
                cancelled.disarm();
                if let Err(e) = result {
                    self.remember_unsettled(target.id, req.chain_id, req.chunk);
                    return Err(e);
                }
            }
        }
        if !commit_now {
            let engine = target.engine.clone();
            let chunk = req.chunk;
            self.blocking(move || Ok(engine.commit(chunk, version)?)).await?;
        }
        debug!(version, duplicate = outcome.duplicate, "committed");
        Ok(Applied { version, len_bytes: outcome.len_bytes, crc: outcome.crc, duplicate: outcome.duplicate })
    }

    /// Sends a just-applied update on to the successor: as the same update,
    /// or as a full-chunk replace when the successor is syncing or its
    /// version diverged.
    /// A pending version left by another request (its acknowledgement was
    /// lost, e.g. when a successor crashed or a link failed) may already be
    /// committed down the chain. Ask the tail: if it committed exactly that
    /// version (same version, same CRC), commit it here too, so the next
    /// update builds on it instead of rolling it back. Otherwise the
    /// left-over was never committed anywhere; the next update replaces it.
    /// `current` is the tag of the request about to apply (its own pending
    /// version is not a left-over). Callers hold the chunk's lock.
    async fn settle_left_over_pending(
        &self,
        target: &Arc<Target>,
        routing: &RoutingInfo,
        chain_id: ChainId,
        chunk: ChunkId,
        current: Option<UpdateTag>,
    ) -> Settle {
        let Some((pending_ver, pending_tag, pending_crc)) = target.engine.pending_data(chunk) else { return Settle::Done };
        if Some(pending_tag) == current {
            return Settle::Done;
        }
        let Ok(chain) = Self::chain_of(routing, chain_id) else { return Settle::Retry };
        let Some(tail) = chain.targets.iter().rev().find(|t| t.state.can_write()) else { return Settle::Retry };
        if tail.target_id == target.id {
            return Settle::Done;
        }
        let Ok(addr) = Self::addr_of(routing, tail.node_id) else { return Settle::Retry };
        let query = QueryChunkReq { target: tail.target_id, chunk };
        let remote = match self.inner.rpc.call::<QueryChunk>(&addr, &query, Bytes::new(), self.call_opts()).await {
            Ok((resp, _)) => resp.meta,
            Err(e) => {
                debug!(%chunk, error = %e, "cannot ask the tail about a left-over pending version");
                return Settle::Retry;
            }
        };
        let committed_at_tail = remote.is_some_and(|r| r.committed_ver == pending_ver && r.crc == pending_crc);
        if !committed_at_tail {
            return Settle::Done;
        }
        let (engine, version) = (target.engine.clone(), pending_ver);
        match self.blocking(move || Ok(engine.commit(chunk, version)?)).await {
            Ok(_) => {
                info!(%chunk, version, "committed a left-over pending version the tail already committed");
                Settle::Done
            }
            Err(e) => {
                warn!(%chunk, version, error = %e, "could not commit a left-over pending version");
                Settle::Retry
            }
        }
    }

    fn remember_unsettled(&self, target: TargetId, chain: ChainId, chunk: ChunkId) {
        let mut set = self.inner.unsettled.lock();
        if set.len() < MAX_UNSETTLED_CHUNKS {
            set.insert((target, chain, chunk));
        } else {
            warn!(%chunk, "too many chunks to settle; this one waits for its next write");
        }
    }

    /// Settles the chunks whose forwards failed (one pass; kept for the next
    /// pass only if the tail could not be asked).
    async fn settle_unsettled(&self) {
        let batch = std::mem::take(&mut *self.inner.unsettled.lock());
        for (me, chain_id, chunk) in batch {
            let Ok(target) = self.target(me) else { continue };
            let _guard = target.locks.lock(chunk).await;
            let routing = self.inner.routing.current();
            if self.settle_left_over_pending(&target, &routing, chain_id, chunk, None).await == Settle::Retry {
                self.remember_unsettled(me, chain_id, chunk);
            }
        }
    }

    async fn forward_update(
        &self,
        target: &Arc<Target>,
        routing: &RoutingInfo,
        succ: Successor,
        req: &ForwardReq,
        payload: Bytes,
        version: u64,
    ) -> Result<()> {
        let addr = Self::addr_of(routing, succ.node)?;
        let base = ForwardReq { from: target.id, to: succ.target, ..req.clone() };
        if succ.kind == ForwardKind::Update {
            let fwd = ForwardReq { mode: ForwardMode::Update { version }, ..base.clone() };
            match self.inner.rpc.call::<ForwardChunk>(&addr, &fwd, payload, self.call_opts()).await {
                Ok(_) => return Ok(()),
                Err(e) if e.code() == fskv_types::ErrorCode::ChunkVersionMismatch => {
                    warn!(successor = %succ.target, version, "successor diverged; repairing with a full-chunk replace");
                }
                Err(e) => return Err(StorageError::Forward { to: succ.target, status: e.to_status() }),
            }
        }
        let (mode, data) = self.full_content(target, req.chunk, version, req.chain_ver, req.op).await?;
        let fwd = ForwardReq { mode, ..base };
        self.inner
            .rpc
            .call::<ForwardChunk>(&addr, &fwd, data, self.call_opts())
            .await
            .map(|_| ())
            .map_err(|e| StorageError::Forward { to: succ.target, status: e.to_status() })
    }

    /// The whole pending content of `chunk` at `version` as a replace.
    async fn full_content(
        &self,
        target: &Arc<Target>,
        chunk: ChunkId,
        version: u64,
        chain_ver: u32,
        op: UpdateOp,
    ) -> Result<(ForwardMode, Bytes)> {
        if op == UpdateOp::Remove {
            return Ok((ForwardMode::ReplaceRemove, Bytes::new()));
        }
        let engine = target.engine.clone();
        let read = self.blocking(move || Ok(engine.read(chunk, 0, u64::MAX >> 1, ReadMode::Relaxed)?)).await?;
        if read.version != version {
            return Err(StorageError::Internal(format!("{chunk}: expected pending {version} under the lock, found {}", read.version)));
        }
        let data = Bytes::from(read.data);
        let mode =
            ForwardMode::FullReplace { version, chunk_chain_ver: chain_ver, len_bytes: data.len() as u32, crc: crc32c::crc32c(&data) };
        Ok((mode, data))
    }

    /// A full-chunk replace (or remove) at a target: committed at once,
    /// passed on to the successor (if any) before the ack.
    async fn apply_replace(&self, target: &Arc<Target>, req: &ForwardReq, payload: Bytes) -> Result<u64> {
        let _guard = target.locks.lock(req.chunk).await;
        let (routing, pos) = self.check_write(req.chain_id, target.id, req.chain_ver, Origin::Predecessor(req.from))?;
        let (engine, chunk, mode, tag, data) = (target.engine.clone(), req.chunk, req.mode, engine_tag(req.tag), payload.clone());
        let version = self.blocking(move || replace_locally(&engine, chunk, mode, tag, &data)).await?;
        if let Some(succ) = pos.successor {
            let addr = Self::addr_of(&routing, succ.node)?;
            let fwd = ForwardReq { from: target.id, to: succ.target, ..req.clone() };
            self.inner
                .rpc
                .call::<ForwardChunk>(&addr, &fwd, payload, self.call_opts())
                .await
                .map_err(|e| StorageError::Forward { to: succ.target, status: e.to_status() })?;
        }
        Ok(version)
    }

    // ----- other RPCs -----

    async fn handle_batch_read(&self, req: BatchReadReq) -> Result<(BatchReadResp, Bytes)> {
        let _slot = self.inner.read_slots.acquire().await.map_err(|_| StorageError::Internal("read slots closed".into()))?;
        let total: u64 = req.ios.iter().map(|io| u64::from(io.len_bytes)).sum();
        if total > self.inner.config.max_read_batch_bytes {
            return Err(StorageError::Invalid(format!(
                "batch of {total} bytes exceeds max_read_batch_bytes {}",
                self.inner.config.max_read_batch_bytes
            )));
        }
        let routing = self.inner.routing.current();
        let mut jobs = Vec::with_capacity(req.ios.len());
        for io in &req.ios {
            let checked = self.target(io.target).and_then(|t| {
                let chain = Self::chain_of(&routing, io.chain_id)?;
                chain::check_read(chain, io.target, io.chain_ver).map_err(|reject| StorageError::Route {
                    chain: io.chain_id,
                    target: io.target,
                    reject,
                })?;
                Ok(t)
            });
            jobs.push((io.clone(), checked.map(|t| t.engine.clone())));
        }
        let results = self
            .blocking(move || {
                let mut payload = BytesMut::with_capacity(total as usize);
                let mut results = Vec::with_capacity(jobs.len());
                for (io, engine) in jobs {
                    let mode = if io.relaxed { ReadMode::Relaxed } else { ReadMode::Strict };
                    let r = engine.and_then(|e| Ok(e.read(io.chunk, io.offset_bytes, u64::from(io.len_bytes), mode)?));
                    results.push(match r {
                        Ok(read) => {
                            payload.extend_from_slice(&read.data);
                            Ok(ReadOk {
                                len_bytes: read.data.len() as u32,
                                crc: crc32c::crc32c(&read.data),
                                version: read.version,
                                chunk_len_bytes: read.chunk_len_bytes,
                                uncommitted: read.uncommitted,
                            })
                        }
                        Err(e) => Err(Status::from(e)),
                    });
                }
                Ok((BatchReadResp { results }, payload.freeze()))
            })
            .await?;
        Ok(results)
    }

    async fn handle_commit(&self, req: CommitReq) -> Result<CommitResp> {
        let target = self.target(req.target)?;
        let _guard = target.locks.lock(req.chunk).await;
        let engine = target.engine.clone();
        let committed_ver = self.blocking(move || Ok(engine.commit(req.chunk, req.version)?)).await?;
        Ok(CommitResp { committed_ver })
    }

    async fn handle_query_last(&self, req: QueryLastChunkReq) -> Result<QueryLastChunkResp> {
        let target = self.target(req.target)?;
        let routing = self.inner.routing.current();
        let chain = Self::chain_of(&routing, req.chain_id)?;
        chain::check_read(chain, req.target, req.chain_ver).map_err(|reject| StorageError::Route {
            chain: req.chain_id,
            target: req.target,
            reject,
        })?;
        let engine = target.engine.clone();
        let last = self.blocking(move || Ok(engine.last_chunk(req.inode)?)).await?;
        Ok(QueryLastChunkResp { last: last.map(|(id, m)| (id, sync::remote_meta(&m))) })
    }

    /// Removes chunks from the end of the file down to `from_index`, each as
    /// a replicated remove through the chain.
    async fn handle_remove_chunks(&self, req: RemoveChunksReq) -> Result<RemoveChunksResp> {
        let target = self.target(req.target)?;
        self.check_write(req.chain_id, req.target, req.chain_ver, Origin::Client)?;
        let mut removed = 0u32;
        loop {
            let engine = target.engine.clone();
            let inode = req.inode;
            let last = self.blocking(move || Ok(engine.last_chunk(inode)?)).await?;
            let Some((chunk, meta)) = last.filter(|(c, _)| c.index >= req.from_index) else {
                return Ok(RemoveChunksResp { removed, more: false });
            };
            if removed >= req.max_chunks.max(1) {
                return Ok(RemoveChunksResp { removed, more: true });
            }
            if meta.committed_ver == 0 {
                // Never committed: nothing readable to remove; stop rather than loop.
                warn!(%chunk, "uncommitted-only chunk left in place by remove-chunks");
                return Ok(RemoveChunksResp { removed, more: false });
            }
            let fwd = ForwardReq {
                chain_id: req.chain_id,
                chain_ver: req.chain_ver,
                from: req.target,
                to: req.target,
                chunk,
                op: UpdateOp::Remove,
                mode: ForwardMode::Update { version: 0 },
                tag: req.tag,
                chunk_size_hint_bytes: None,
            };
            self.apply_update(&target, Origin::Client, &fwd, Bytes::new()).await?;
            removed += 1;
        }
    }

    fn space_info(&self) -> SpaceInfoResp {
        let mut targets: Vec<TargetSpace> = self
            .inner
            .targets
            .values()
            .map(|t| {
                let stats = t.engine.pool_stats();
                // Capacity = space already in the pools + what the disk can
                // still give them (targets sharing a disk each count it).
                let pooled: u64 = stats.iter().map(|p| p.capacity_blocks * p.block_bytes).sum();
                let free_disk = t.engine.free_disk_bytes().unwrap_or_else(|e| {
                    tracing::warn!(target = %t.id, error = %e, "statvfs failed; capacity counts pooled space only");
                    0
                });
                TargetSpace {
                    target: t.id,
                    capacity_bytes: pooled.saturating_add(free_disk),
                    used_bytes: stats.iter().map(|p| p.used_blocks * p.block_bytes).sum(),
                }
            })
            .collect();
        targets.sort_by_key(|t| t.target);
        SpaceInfoResp { targets }
    }

    async fn handle_dump(&self, req: DumpChunkMetaReq) -> Result<DumpChunkMetaResp> {
        let engine = self.target(req.target)?.engine.clone();
        let dump = self.blocking(move || Ok(engine.dump()?)).await?;
        Ok(DumpChunkMetaResp { chunks: dump.iter().map(|(id, m)| (*id, sync::remote_meta(m))).collect() })
    }

    fn handle_sync_mark(&self, req: SyncReq, done: bool) -> Result<SyncResp> {
        let target = self.target(req.target)?;
        *target.sync_done.lock() = done.then_some(req.chain_ver);
        info!(target = %req.target, from = %req.from, chain_ver = req.chain_ver, done, "sync mark");
        Ok(SyncResp {})
    }

    // ----- recovery -----

    /// Watches routing; for every local serving target whose successor is
    /// syncing, runs one sync per (successor, chain version).
    async fn sync_worker(self) {
        let mut rx = self.inner.routing.subscribe();
        loop {
            let routing = self.inner.routing.current();
            for me in self.target_ids() {
                let Some((chain, _)) = routing.locate_target(me) else { continue };
                let Some(succ) = chain::sync_successor(chain, me) else { continue };
                let key = (me, succ.target, chain.chain_version);
                if !self.inner.syncs.lock().insert(key) {
                    continue;
                }
                let s = self.clone();
                let (chain_id, chain_ver) = (chain.chain_id, chain.chain_version);
                let span = info_span!("sync", chain = %chain_id, target = %me, successor = %succ.target, chain_ver);
                tokio::spawn(
                    async move {
                        let result = s.run_sync(me, succ, chain_id, chain_ver).await;
                        if let Err(e) = &result {
                            warn!(error = %e, "sync failed; will retry");
                            tokio::time::sleep(Duration::from_millis(s.inner.config.sync_retry_delay_ms)).await;
                            s.inner.syncs.lock().remove(&key);
                        }
                        // On success the key stays: this chain version is synced.
                    }
                    .instrument(span),
                );
            }
            self.settle_unsettled().await;
            let poll = Duration::from_millis(self.inner.config.sync_poll_ms);
            let _ = tokio::time::timeout(poll, rx.changed()).await;
        }
    }

    /// Recovers `succ` from `me`: sync-start, dump remote metadata, plan,
    /// transfer each chunk under its lock, sync-done.
    pub async fn run_sync(&self, me: TargetId, succ: Successor, chain_id: ChainId, chain_ver: u32) -> Result<sync::PlanSummary> {
        let target = self.target(me)?;
        let routing = self.inner.routing.current();
        let addr = Self::addr_of(&routing, succ.node)?;
        let mark = SyncReq { chain_id, chain_ver, from: me, target: succ.target };
        let rpc_err = |e: fskv_rpc::RpcError| StorageError::Forward { to: succ.target, status: e.to_status() };
        self.inner.rpc.call::<SyncStart>(&addr, &mark, Bytes::new(), self.call_opts()).await.map_err(rpc_err)?;
        let (remote, _) = self
            .inner
            .rpc
            .call::<DumpChunkMeta>(&addr, &DumpChunkMetaReq { target: succ.target }, Bytes::new(), self.call_opts())
            .await
            .map_err(rpc_err)?;
        let engine = target.engine.clone();
        let local = self.blocking(move || Ok(engine.dump()?)).await?;
        let plan = sync::plan_sync(&local, &remote.chunks);
        let summary = sync::summarize(&plan);
        info!(?summary, remote_chunks = remote.chunks.len(), local_chunks = local.len(), "sync plan");
        let remote_by_id: HashMap<ChunkId, RemoteChunkMeta> = remote.chunks.into_iter().collect();
        // Every planned chunk, plus local chunks that were pending-only at the
        // dump (a write may have committed them since), re-decided under the lock.
        let mut ids: Vec<ChunkId> = plan.iter().map(SyncAction::chunk).collect();
        let planned: HashSet<ChunkId> = ids.iter().copied().collect();
        ids.extend(local.iter().map(|(id, _)| *id).filter(|id| !planned.contains(id)));
        let pause_ms = self.inner.config.sync_pause_between_chunks_ms;
        for chunk in ids {
            self.sync_chunk(&target, &addr, succ, chain_id, chain_ver, chunk, remote_by_id.get(&chunk)).await?;
            if pause_ms > 0 {
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            }
        }
        self.inner.rpc.call::<SyncDone>(&addr, &mark, Bytes::new(), self.call_opts()).await.map_err(rpc_err)?;
        self.inner.last_sync.lock().insert(me, summary);
        info!("sync done");
        Ok(summary)
    }

    /// One chunk of a sync: lock, re-decide with the current local
    /// metadata, read the committed content, full-chunk replace, unlock.
    #[allow(clippy::too_many_arguments)]
    async fn sync_chunk(
        &self,
        target: &Arc<Target>,
        addr: &str,
        succ: Successor,
        chain_id: ChainId,
        chain_ver: u32,
        chunk: ChunkId,
        remote: Option<&RemoteChunkMeta>,
    ) -> Result<()> {
        let _guard = target.locks.lock(chunk).await;
        let current = target.engine.meta(chunk);
        let decision = sync::decide(chunk, current.as_ref().map(LocalChunk::from), remote);
        let (mode, data) = match decision {
            None | Some(SyncAction::Skip(_)) => return Ok(()),
            Some(SyncAction::Delete(_)) => (ForwardMode::ReplaceRemove, Bytes::new()),
            Some(SyncAction::Send(..)) => {
                let engine = target.engine.clone();
                let read = self.blocking(move || Ok(engine.read(chunk, 0, u64::MAX >> 1, ReadMode::CommittedOnly)?)).await?;
                let data = Bytes::from(read.data);
                let chunk_chain_ver = current.as_ref().map_or(chain_ver, |m| m.chain_ver);
                let mode = ForwardMode::FullReplace {
                    version: read.version,
                    chunk_chain_ver,
                    len_bytes: data.len() as u32,
                    crc: crc32c::crc32c(&data),
                };
                (mode, data)
            }
        };
        debug!(%chunk, ?decision, "sync transfer");
        let fwd = ForwardReq {
            chain_id,
            chain_ver,
            from: target.id,
            to: succ.target,
            chunk,
            op: UpdateOp::Remove,
            mode,
            tag: RequestTag::default(),
            chunk_size_hint_bytes: None,
        };
        self.inner
            .rpc
            .call::<ForwardChunk>(addr, &fwd, data, self.call_opts())
            .await
            .map(|_| ())
            .map_err(|e| StorageError::Forward { to: succ.target, status: e.to_status() })
    }
}

/// What a local apply produced.
struct Applied {
    version: u64,
    len_bytes: u32,
    crc: u32,
    duplicate: bool,
}

/// Applies a full-chunk replace or a replace-remove to the local engine;
/// idempotent (an equal committed version is left alone).
fn replace_locally(engine: &ChunkEngine, chunk: ChunkId, mode: ForwardMode, tag: UpdateTag, data: &[u8]) -> Result<u64> {
    match mode {
        ForwardMode::FullReplace { version, chunk_chain_ver, crc, len_bytes } => {
            let same = engine.meta(chunk).is_some_and(|m| {
                m.committed_ver == version && m.pending.is_none() && m.committed.crc == crc && m.committed.len_bytes == len_bytes
            });
            if !same {
                engine.replace(chunk, chunk_chain_ver, version, data, tag)?;
            }
            Ok(version)
        }
        ForwardMode::ReplaceRemove => {
            let Some(meta) = engine.meta(chunk) else { return Ok(0) };
            if meta.committed_ver == 0 {
                // Pending only: make it committed (empty) so it can be removed.
                engine.replace(chunk, meta.chain_ver, 1, &[], tag)?;
            }
            let committed = engine.meta(chunk).map_or(0, |m| m.committed_ver);
            engine.update_and_commit(&UpdateRequest {
                chunk,
                chain_ver: meta.chain_ver,
                kind: UpdateKind::Remove,
                tag,
                expected_ver: None,
                chunk_size_hint_bytes: None,
            })?;
            debug_assert!(engine.meta(chunk).is_none(), "{chunk} still present after remove");
            Ok(committed + 1)
        }
        ForwardMode::Update { .. } => Err(StorageError::Invalid("update passed to replace".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_client::storage::RoutingPublisher;
    use fskv_proto::routing::{ChainTarget, NodeInfo};
    use fskv_proto::storage::{ForwardChunk, QueryChunk};
    use fskv_rpc::ClientConfig;
    use fskv_types::InodeId;

    /// Found by the simulation (seed 98 of 200): the head crashed while the
    /// middle target's forward to the tail was out; the connection closed,
    /// the middle's handler was dropped with its update pending, and the
    /// tail had committed it. Nothing settled the chunk, so the new head
    /// kept the older committed version. A handler cancelled mid-forward
    /// now leaves the chunk to the settle pass, which commits it once the
    /// tail shows it committed.
    #[tokio::test]
    async fn an_update_cancelled_mid_forward_is_settled_from_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        // The successor: takes the forward and never answers (it "committed",
        // the ack is lost); answers QueryChunk with what the test sets.
        let tail_meta: Arc<Mutex<Option<RemoteChunkMeta>>> = Arc::default();
        let forwarded = Arc::new(tokio::sync::Notify::new());
        let (meta, seen) = (tail_meta.clone(), forwarded.clone());
        let router = Router::new()
            .route::<ForwardChunk, _, _>(move |_ctx, _req: ForwardReq, _payload| {
                let seen = seen.clone();
                async move {
                    seen.notify_one();
                    std::future::pending::<()>().await;
                    Ok((ForwardResp { committed_ver: 0 }, Bytes::new()))
                }
            })
            .route::<QueryChunk, _, _>(move |_ctx, _req: QueryChunkReq, _payload| {
                let meta = meta.clone();
                async move { Ok((QueryChunkResp { meta: *meta.lock() }, Bytes::new())) }
            });
        let tail = Server::bind(Arc::new(TcpTransport::new()), "127.0.0.1:0", router, ServerConfig::default()).await.unwrap();

        let chain = ChainId(1);
        let routing = RoutingInfo {
            version: 1,
            nodes: vec![
                NodeInfo { node_id: NodeId(1), address: "127.0.0.1:1".into() },
                NodeInfo { node_id: NodeId(2), address: tail.local_addr().to_string() },
            ],
            chains: vec![ChainInfo {
                chain_id: chain,
                chain_version: 1,
                targets: vec![
                    ChainTarget { target_id: TargetId(101), node_id: NodeId(1), state: PublicTargetState::Serving },
                    ChainTarget { target_id: TargetId(201), node_id: NodeId(2), state: PublicTargetState::Serving },
                ],
            }],
            chain_tables: Vec::new(),
            meta_servers: Vec::new(),
        };
        let (_publisher, handle) = RoutingPublisher::new(routing);
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        let config = StorageConfig { inline_engine_io: true, ..StorageConfig::new(NodeId(1)) };
        let engine_config = EngineConfig { sync_writes: false, blocks_per_grow: 4, ..EngineConfig::default() };
        let service = StorageService::open(config, dir.path(), &[TargetId(101)], engine_config, handle, rpc).unwrap();

        let chunk = ChunkId::new(InodeId(5), 0);
        let data = Bytes::from_static(b"written");
        let req = WriteReq {
            chain_id: chain,
            chain_ver: 1,
            target: TargetId(101),
            chunk,
            op: UpdateOp::Write { offset_bytes: 0, len_bytes: data.len() as u32, crc: crc32c::crc32c(&data) },
            tag: RequestTag { client: 1, request: 1 },
            chunk_size_hint_bytes: None,
        };
        // Cancel the write once its forward reached the tail.
        let write = service.handle_write(req, data);
        tokio::select! {
            biased;
            _ = forwarded.notified() => {}
            r = write => panic!("the write finished: {r:?}"),
        }
        let engine = service.engine(TargetId(101)).unwrap();
        let (pending_ver, _, crc) = engine.pending_data(chunk).expect("pending after the cancelled forward");
        assert_eq!(engine.meta(chunk).unwrap().committed_ver, 0);

        // The tail committed it: the settle pass commits it here too.
        *tail_meta.lock() = Some(RemoteChunkMeta { chain_ver: 1, committed_ver: pending_ver, pending_ver: None, len_bytes: 7, crc });
        service.settle_unsettled().await;
        assert_eq!(engine.meta(chunk).unwrap().committed_ver, pending_ver, "the left-over was not settled");
        assert!(engine.pending_data(chunk).is_none());
        tail.shutdown().await;
    }
}
