//! The meta service: prepares each op, runs it in a transaction with its
//! idempotency record, batches ops on one inode, reclaims in the background,
//! and serves it all over `fskv-rpc`.
//!
//! Servers are stateless: everything lives in the KV engine (the inode-id
//! batch in memory is only a cache of reserved ids), so any number of them can
//! serve one engine that supports it (FoundationDB).

use crate::alloc::InodeAllocator;
use crate::error::{MetaError, MetaResult};
use crate::gc::{self, GcStats};
use crate::metrics::MetaMetrics;
use crate::ops::{self, MetaConfig, OpCtx, Prepared};
use crate::schema::*;
use crate::storage::StorageBackend;
use bytes::Bytes;
use fskv_kv::{KvEngine, Transaction};
use fskv_proto::meta::*;
use fskv_proto::meta::{MetaBatchCall, MetaCall, MetaFsckCall};
use fskv_rpc::{MetricsRegistry, RequestContext, Router, Server, ServerConfig, Status, TcpTransport};
use fskv_types::InodeId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tracing::Instrument;

/// Attempts of one transaction on conflicts before the error goes to the caller.
pub const MAX_TXN_ATTEMPTS: u32 = 100;
/// Times an op is prepared again when a commit overtook what it prepared.
pub const MAX_PREPARE_ATTEMPTS: u32 = 8;
/// Capacity of each per-shard batch queue.
pub const BATCH_QUEUE_CAPACITY: usize = 4096;
/// Last-chunk queries one close sends to storage at once (exact length).
pub const LAST_CHUNK_QUERIES_IN_FLIGHT: usize = 16;

/// What a closing handle says of its own writes (`MetaOp::Close`).
#[derive(Clone, Copy)]
struct OwnWrites {
    session: u64,
    wrote: bool,
    settled: bool,
    truncate_version: u64,
}

struct BatchItem {
    req: MetaRequest,
    prep: Prepared,
    reply: oneshot::Sender<MetaResult<MetaReply>>,
}

struct Inner {
    engine: Arc<dyn KvEngine>,
    cfg: MetaConfig,
    alloc: InodeAllocator,
    storage: Arc<dyn StorageBackend>,
    layout_rr: AtomicU64,
    /// Every random choice of the server ([`MetaConfig::rng_seed`]).
    rng: Arc<parking_lot::Mutex<StdRng>>,
    batch_queues: Vec<mpsc::Sender<BatchItem>>,
    gc_wakeup: Notify,
    /// One fsck at a time per server (it holds a summary of every inode).
    fsck_permit: Semaphore,
    /// Served on `GET /metrics` with the RPC server's metrics.
    registry: Arc<MetricsRegistry>,
    metrics: MetaMetrics,
    /// The key chunk capabilities are issued with (derived from the
    /// process's cluster key; `None` without one: then nobody needs them).
    cap_key: Option<Arc<fskv_rpc::auth::CapKey>>,
    /// `boots << VERSION_FLOOR_SHIFT` of this start ([`Prepared::version_floor`]).
    version_floor: u64,
}

/// Aborts the background tasks when the last handle of a service is dropped.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// A cheap-to-clone handle to one meta server's logic.
#[derive(Clone)]
pub struct MetaService {
    inner: Arc<Inner>,
    _tasks: Arc<Tasks>,
}

/// Short op name for spans and logs.
pub fn op_name(op: &MetaOp) -> &'static str {
    match op {
        MetaOp::Lookup { .. } => "lookup",
        MetaOp::LookupXattr { .. } => "lookup_xattr",
        MetaOp::WalkXattr { .. } => "walk_xattr",
        MetaOp::Stat { .. } => "stat",
        MetaOp::Create { .. } => "create",
        MetaOp::Open { .. } => "open",
        MetaOp::Close { .. } => "close",
        MetaOp::Mkdir { .. } => "mkdir",
        MetaOp::Rmdir { .. } => "rmdir",
        MetaOp::Unlink { .. } => "unlink",
        MetaOp::UnlinkExpected { .. } => "unlink_expected",
        MetaOp::Rename { .. } => "rename",
        MetaOp::Symlink { .. } => "symlink",
        MetaOp::Mknod { .. } => "mknod",
        MetaOp::Readlink { .. } => "readlink",
        MetaOp::Link { .. } => "link",
        MetaOp::Readdir { .. } => "readdir",
        MetaOp::SetAttr { .. } => "setattr",
        MetaOp::Truncate { .. } => "truncate",
        MetaOp::ReportLength { .. } => "report_length",
        MetaOp::GetXattr { .. } => "getxattr",
        MetaOp::SetXattr { .. } => "setxattr",
        MetaOp::ListXattr { .. } => "listxattr",
        MetaOp::RemoveXattr { .. } => "removexattr",
        MetaOp::StatFs => "statfs",
        MetaOp::RemoveTree { .. } => "remove_tree",
        MetaOp::CreateUnlinked { .. } => "create_unlinked",
        MetaOp::WriteInline { .. } => "write_inline",
        MetaOp::ReadInline { .. } => "read_inline",
        MetaOp::Replace { .. } => "replace",
        MetaOp::CreateWritePublish { .. } => "create_write_publish",
        MetaOp::OverwriteInline { .. } => "overwrite_inline",
        MetaOp::RenewTemp { .. } => "renew_temp",
        MetaOp::Txn { .. } => "txn",
        MetaOp::Expect { .. } => "expect",
    }
}

fn is_read_only(op: &MetaOp) -> bool {
    matches!(
        op,
        MetaOp::Lookup { .. }
            | MetaOp::LookupXattr { .. }
            | MetaOp::WalkXattr { .. }
            | MetaOp::Expect { .. }
            | MetaOp::Stat { .. }
            | MetaOp::Readlink { .. }
            | MetaOp::Readdir { .. }
            | MetaOp::GetXattr { .. }
            | MetaOp::ListXattr { .. }
            | MetaOp::StatFs
            | MetaOp::ReadInline { .. }
            | MetaOp::Open { write: false, .. }
    )
}

/// Ops the per-inode queues group into one transaction.
pub fn is_batchable(op: &MetaOp) -> bool {
    matches!(
        op,
        MetaOp::Create { .. }
            | MetaOp::Mkdir { .. }
            | MetaOp::Symlink { .. }
            | MetaOp::Mknod { .. }
            | MetaOp::CreateWritePublish { .. }
            | MetaOp::OverwriteInline { .. }
            | MetaOp::ReportLength { .. }
    )
}

fn creates_inode(op: &MetaOp) -> bool {
    if let MetaOp::Txn { ops } = op {
        return ops.iter().any(creates_inode);
    }
    matches!(
        op,
        MetaOp::Create { .. }
            | MetaOp::Mkdir { .. }
            | MetaOp::Symlink { .. }
            | MetaOp::Mknod { .. }
            | MetaOp::CreateUnlinked { .. }
            | MetaOp::CreateWritePublish { .. }
    )
}

fn shard_of(inode: InodeId, shards: usize) -> usize {
    (SplitMix64::new(inode.0).next_u64() % shards.max(1) as u64) as usize
}

impl MetaService {
    /// Opens the service on `engine`: creates the root directory on first
    /// start, starts the batch workers and the GC task.
    pub async fn open(engine: Arc<dyn KvEngine>, storage: Arc<dyn StorageBackend>, cfg: MetaConfig) -> MetaResult<Self> {
        if cfg.chains.is_empty() {
            return Err(MetaError::InvalidArgument("the chain table has no chains".into()));
        }
        ensure_root(&engine, &cfg).await?;
        let version_floor = count_boot(&engine).await? << VERSION_FLOOR_SHIFT;
        let mut receivers = Vec::new();
        let mut batch_queues = Vec::new();
        for _ in 0..cfg.batch_shards {
            let (tx, rx) = mpsc::channel(BATCH_QUEUE_CAPACITY);
            batch_queues.push(tx);
            receivers.push(rx);
        }
        let registry = MetricsRegistry::new();
        let mut rng = match cfg.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        let layout_rr = AtomicU64::new(u64::from(rng.gen::<u32>()));
        let rng = Arc::new(parking_lot::Mutex::new(rng));
        let inner = Arc::new(Inner {
            alloc: InodeAllocator::new(engine.clone(), rng.clone()),
            engine,
            cfg,
            storage,
            layout_rr,
            rng,
            batch_queues,
            gc_wakeup: Notify::new(),
            fsck_permit: Semaphore::new(1),
            metrics: MetaMetrics::register(&registry),
            registry,
            cap_key: fskv_rpc::auth::current().key.map(|k| Arc::new(k.cap_key())),
            version_floor,
        });
        let mut tasks = Vec::new();
        for (i, rx) in receivers.into_iter().enumerate() {
            let inner = inner.clone();
            tasks.push(tokio::spawn(batch_worker(inner, rx).instrument(tracing::info_span!("meta_batch", shard = i))));
        }
        if inner.cfg.gc_interval_ms > 0 {
            tasks.push(tokio::spawn(gc_loop(inner.clone()).instrument(tracing::info_span!("meta_gc"))));
        }
        Ok(MetaService { inner, _tasks: Arc::new(Tasks(tasks)) })
    }

    pub fn config(&self) -> &MetaConfig {
        &self.inner.cfg
    }

    /// The registry served on `GET /metrics` of this service's port.
    pub fn metrics(&self) -> &Arc<MetricsRegistry> {
        &self.inner.registry
    }

    pub fn engine(&self) -> &Arc<dyn KvEngine> {
        &self.inner.engine
    }

    /// Runs one request (through the batch queue of its inode when batchable).
    pub async fn execute(&self, req: MetaRequest) -> MetaResult<MetaReply> {
        let op = op_name(&req.op);
        let span = tracing::debug_span!("meta_op", op, inode = %req.op.routing_inode(), client = req.client_id, request = req.request_id);
        let result = self.execute_inner(req).instrument(span).await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.inner.metrics.ops.get_or_create(&vec![("op", op.to_string()), ("result", outcome.to_string())]).inc();
        result
    }

    async fn execute_inner(&self, req: MetaRequest) -> MetaResult<MetaReply> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.execute_prepared(&req).await {
                Err(MetaError::StalePrepare(why)) if attempt < MAX_PREPARE_ATTEMPTS => {
                    tracing::debug!(attempt, %why, "prepared state overtaken; preparing again");
                }
                Ok(reply) => {
                    self.inner.after_commit(&req.op, &reply).await;
                    return Ok(reply);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn execute_prepared(&self, req: &MetaRequest) -> MetaResult<MetaReply> {
        let prep = self.inner.prepare(req).await?;
        if is_batchable(&req.op) && !self.inner.batch_queues.is_empty() {
            let shard = shard_of(req.op.routing_inode(), self.inner.batch_queues.len());
            let (tx, rx) = oneshot::channel();
            let queue = self.inner.batch_queues.get(shard).ok_or_else(|| MetaError::Internal("no batch queue".into()))?;
            queue
                .send(BatchItem { req: req.clone(), prep, reply: tx })
                .await
                .map_err(|_| MetaError::Internal("batch worker stopped".into()))?;
            rx.await.map_err(|_| MetaError::Internal("batch worker dropped the request".into()))?
        } else {
            let mut replies = self.inner.commit_group(&[(req.clone(), prep)]).await?;
            replies.pop().ok_or_else(|| MetaError::Internal("empty group result".into()))
        }
    }

    /// Runs independent requests concurrently; one result each.
    pub async fn execute_batch(&self, reqs: Vec<MetaRequest>) -> Vec<MetaResult<MetaReply>> {
        futures::future::join_all(reqs.into_iter().map(|r| self.execute(r))).await
    }

    /// One GC pass now (the background task also runs them).
    pub async fn run_gc_once(&self) -> MetaResult<GcStats> {
        gc::run_once(&self.inner.engine, &*self.inner.storage, &self.inner.cfg).await
    }

    /// GC passes until nothing but deferred work is left.
    pub async fn run_gc_until_idle(&self) -> MetaResult<GcStats> {
        gc::run_until_idle(&self.inner.engine, &*self.inner.storage, &self.inner.cfg).await
    }

    /// The consistency check (`meta.Fsck`), bounded by the request and
    /// [`MAX_FSCK_PROBLEMS`] / [`MAX_FSCK_INODES`]; one at a time per server
    /// (a second one is refused with `ResourceExhausted`).
    pub async fn fsck(&self, req: &FsckRequest) -> MetaResult<FsckReply> {
        let _permit = self
            .inner
            .fsck_permit
            .try_acquire()
            .map_err(|_| MetaError::TooLarge("another fsck is running on this meta server (one at a time)".into()))?;
        let page_keys = if req.page_keys == 0 { crate::fsck::DEFAULT_PAGE_KEYS } else { req.page_keys as usize };
        let opts = crate::fsck::FsckOptions {
            max_problems: req.max_problems.min(MAX_FSCK_PROBLEMS) as usize,
            page_keys,
            max_inodes: MAX_FSCK_INODES,
        };
        tracing::info!(max_problems = opts.max_problems, page_keys = opts.page_keys, "fsck started");
        let reply = crate::fsck::run(&*self.inner.engine, &opts).await?;
        tracing::info!(
            inodes = reply.inodes,
            entries = reply.entries,
            problems = reply.problems_total,
            elapsed_ms = reply.elapsed_ms,
            "fsck done"
        );
        Ok(reply)
    }

    /// A chunk capability for `principal` acting as `user` on `inode`
    /// (`meta.IssueCap`): issued only when `user` may read the file (or
    /// write it with `write`), valid [`fskv_proto::cap::CAP_VALIDITY_MS`].
    pub async fn issue_cap(&self, principal: &str, user: &UserInfo, inode: InodeId, write: bool) -> MetaResult<fskv_proto::cap::ChunkCap> {
        use fskv_proto::cap::{CapRights, ChunkCap, CAP_VALIDITY_MS};
        let key = self.inner.cap_key.as_ref().ok_or_else(|| {
            MetaError::InvalidArgument("this meta server has no cluster key: storage checks no capabilities, none is issued".into())
        })?;
        {
            let mut txn = self.inner.engine.begin().await?;
            ops::cap_check(&mut *txn, user, inode, write).await?;
        }
        let rights = if write { CapRights::ReadWrite } else { CapRights::Read };
        let expires_at_ms = fskv_proto::cap::now_ms().saturating_add(CAP_VALIDITY_MS);
        tracing::debug!(%principal, %inode, ?rights, expires_at_ms, "chunk capability issued");
        Ok(ChunkCap::issue(key, principal, inode, rights, expires_at_ms))
    }

    /// The RPC routes of this service (`meta.Call`, `meta.Batch`, `meta.Fsck`,
    /// `meta.Sync`, `meta.IssueCap`). Who may call what: `crate::caller`.
    pub fn router(&self) -> Router {
        let issuer = self.clone();
        let one = self.clone();
        let many = self.clone();
        let checker = self.clone();
        let syncer = self.clone();
        Router::new()
            .with_metrics(self.inner.registry.clone())
            .route::<MetaSyncCall, _, _>(move |_ctx, _req: SyncRequest, _payload| {
                let engine = syncer.inner.engine.clone();
                async move {
                    engine.sync().await.map_err(|e| Status::from(MetaError::from(e)))?;
                    Ok((SyncReply {}, Bytes::new()))
                }
            })
            .route::<MetaFsckCall, _, _>(move |ctx: RequestContext, req: FsckRequest, _payload| {
                let svc = checker.clone();
                async move {
                    crate::caller::refuse_users(ctx.principal.as_ref(), "Fsck").map_err(Status::from)?;
                    svc.fsck(&req).await.map(|r| (r, Bytes::new())).map_err(Status::from)
                }
            })
            .route::<MetaIssueCap, _, _>(move |ctx: RequestContext, req: CapRequest, _payload| {
                let svc = issuer.clone();
                async move {
                    let user = crate::caller::acting_user(ctx.principal.as_ref(), req.user).map_err(Status::from)?;
                    let principal = ctx.principal.as_ref().map_or("", |p| p.name());
                    let cap = svc.issue_cap(principal, &user, req.inode, req.write).await.map_err(Status::from)?;
                    Ok((CapReply { cap }, Bytes::new()))
                }
            })
            .route::<MetaCall, _, _>(move |ctx: RequestContext, mut req: MetaRequest, _payload| {
                let svc = one.clone();
                async move {
                    // Who the request acts as: crate::caller's table.
                    req.user = crate::caller::acting_user(ctx.principal.as_ref(), req.user).map_err(Status::from)?;
                    svc.execute(req).await.map(|r| (r, Bytes::new())).map_err(Status::from)
                }
            })
            .route::<MetaBatchCall, _, _>(move |ctx: RequestContext, mut req: MetaBatchRequest, _payload| {
                let svc = many.clone();
                async move {
                    for r in &mut req.requests {
                        r.user = crate::caller::acting_user(ctx.principal.as_ref(), std::mem::take(&mut r.user)).map_err(Status::from)?;
                    }
                    if req.requests.len() > MAX_BATCH_OPS {
                        return Err(Status::new(
                            fskv_types::ErrorCode::InvalidArgument,
                            format!("batch of {} ops (max {MAX_BATCH_OPS})", req.requests.len()),
                        ));
                    }
                    let results = svc.execute_batch(req.requests).await;
                    let results = results.into_iter().map(|r| r.map_err(Status::from)).collect();
                    Ok((MetaBatchResponse { results }, Bytes::new()))
                }
            })
    }

    /// Binds `addr` and serves this service over TCP.
    pub async fn serve(&self, addr: &str) -> MetaResult<Server> {
        self.serve_on(Arc::new(TcpTransport::new()), addr).await
    }

    /// Binds `addr` on `transport` (the simulation's) and serves this service.
    pub async fn serve_on(&self, transport: Arc<dyn fskv_rpc::Transport>, addr: &str) -> MetaResult<Server> {
        Server::bind(transport, addr, self.router(), ServerConfig::default())
            .await
            .map_err(|e| MetaError::Internal(format!("cannot serve meta on {addr}: {e}")))
    }
}

async fn ensure_root(engine: &Arc<dyn KvEngine>, cfg: &MetaConfig) -> MetaResult<()> {
    for attempt in 1..=MAX_TXN_ATTEMPTS {
        let result: MetaResult<bool> = async {
            let mut txn = engine.begin().await?;
            if txn.get(&inode_key(InodeId::ROOT)).await?.is_some() {
                return Ok(false);
            }
            ops::save_inode(&mut *txn, &ops::root_inode(cfg, cfg.now_ns()))?;
            txn.atomic_add(KEY_INODE_COUNT, 1)?;
            txn.commit().await?;
            Ok(true)
        }
        .await;
        match result {
            Ok(created) => {
                if created {
                    tracing::info!("created the root directory");
                }
                return Ok(());
            }
            Err(e) if e.is_retryable_kv() && attempt < MAX_TXN_ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(50)))).await
            }
            Err(e) => return Err(e),
        }
    }
    Err(MetaError::Internal("root creation did not converge".into()))
}

/// Bumps [`KEY_META_BOOTS`] in a synced transaction and returns the new
/// count: every start of a server sharing this store gets its own.
async fn count_boot(engine: &Arc<dyn KvEngine>) -> MetaResult<u64> {
    let limit = 1i64 << (64 - VERSION_FLOOR_SHIFT);
    let boots =
        crate::alloc::bump_counter(&**engine, KEY_META_BOOTS, 1, limit, "the meta start counter (the version floor would overflow)")
            .await?
            + 1;
    tracing::info!(boots, "meta start counted");
    Ok(boots as u64)
}

impl Inner {
    async fn prepare(&self, req: &MetaRequest) -> MetaResult<Prepared> {
        let mut p = Prepared { now_ns: self.cfg.now_ns(), version_floor: self.version_floor, ..Prepared::default() };
        if creates_inode(&req.op) {
            p.new_id = Some(self.alloc.allocate().await?);
            p.seed = self.rng.lock().gen();
            p.layout_start = self.layout_rr.fetch_add(1, Ordering::Relaxed);
        }
        match &req.op {
            MetaOp::Create { write: true, .. } | MetaOp::Open { write: true, .. } => p.session = self.rng.lock().gen::<u64>() | 1,
            MetaOp::Close { inode, session, wrote, writes_settled, truncate_version, .. } => {
                let own = OwnWrites { session: *session, wrote: *wrote, settled: *writes_settled, truncate_version: *truncate_version };
                p.exact_length = self.exact_length(*inode, own).await?;
            }
            MetaOp::Truncate { inode, length, session } => self.cut_chunks_first(req, &p, *inode, *length, *session).await?,
            MetaOp::StatFs => p.capacity = self.storage.capacity_bytes().await,
            _ => {}
        }
        Ok(p)
    }

    /// Truncate's storage step, before its length commits: checks the
    /// permission as the op will, then cuts the chunks past `length`.
    async fn cut_chunks_first(&self, req: &MetaRequest, prep: &Prepared, id: InodeId, length: u64, session: u64) -> MetaResult<()> {
        let layout = {
            let mut txn = self.engine.begin().await?;
            let ctx = OpCtx { cfg: &self.cfg, user: &req.user, client_id: req.client_id, prep, owner: req.owner };
            ops::truncate_check(&mut *txn, &ctx, id, session).await?
        };
        if let Some(layout) = layout {
            self.storage.truncate_chunks(id, &layout, length).await?;
        }
        Ok(())
    }

    /// The exact length of a chunked file from storage, for a Close: the
    /// last chunk on each of the first `dyn_stripe` chains (in shuffled
    /// order), doubling the number of chains asked while the file may extend
    /// beyond them. Returned with the truncate version it was measured at
    /// (Close refuses it when a truncate committed since).
    ///
    /// `None` (Close keeps max(stored length, hint)) also when the closing
    /// handle's own writes are known — none, or all settled at the file's
    /// current truncate version — and no other write session is open: every
    /// other handle that wrote either closed (setting the exact length then)
    /// or still holds a session (its close will). Read outside the
    /// transaction: a writer that opens meanwhile sets the length at its own
    /// close, and a truncate since makes Close drop the hint.
    async fn exact_length(&self, id: InodeId, own: OwnWrites) -> MetaResult<Option<(u64, u64)>> {
        if !self.storage.knows_lengths() {
            return Ok(None);
        }
        let mut txn = self.engine.begin().await?;
        let key = inode_key(id);
        let Some(raw) = txn.snapshot_get(&key).await? else { return Ok(None) };
        let inode: Inode = decode(&key, &raw)?;
        let Some(f) = inode.file() else { return Ok(None) };
        if f.inline.is_some() {
            return Ok(None);
        }
        if !own.wrote || (own.settled && f.truncate_version == own.truncate_version) {
            let mut sessions = fskv_kv::RangeRequest::prefix(&session_prefix(id));
            sessions.limit = 2;
            let own_key = session_key(id, own.session);
            if txn.snapshot_get_range(&sessions).await?.kvs.iter().all(|(k, _)| k[..] == own_key[..]) {
                return Ok(None);
            }
        }
        drop(txn);
        let shuffled = f.layout.shuffled_chains();
        let stripe = shuffled.len();
        let chunk = u64::from(f.layout.chunk_size_bytes);
        let mut asked = 0usize;
        let mut upto = (f.dyn_stripe as usize).clamp(1, stripe.max(1)).min(stripe);
        let mut length = 0u64;
        let mut max_index: Option<u64> = None;
        loop {
            // The chains of one round are asked at once (at most
            // `LAST_CHUNK_QUERIES_IN_FLIGHT`): a close waits for one
            // storage round trip per round, not one per chain.
            for group in shuffled.get(asked..upto).unwrap_or(&[]).chunks(LAST_CHUNK_QUERIES_IN_FLIGHT) {
                let mut queries = Vec::with_capacity(group.len());
                for chain in group {
                    queries.push(self.storage.last_chunk(id, *chain));
                }
                for lc in futures::future::try_join_all(queries).await?.into_iter().flatten() {
                    length = length.max(lc.index * chunk + u64::from(lc.len_bytes));
                    max_index = Some(max_index.map_or(lc.index, |m| m.max(lc.index)));
                }
            }
            asked = upto;
            let may_extend = max_index.is_some_and(|m| m + 1 >= upto as u64);
            if upto >= stripe || !may_extend {
                break;
            }
            upto = (upto * 2).min(stripe);
        }
        Ok(Some((length, f.truncate_version)))
    }

    /// Runs `items` in one transaction (all or nothing), retrying conflicts;
    /// counts them ([`crate::metrics`]).
    async fn commit_group(&self, items: &[(MetaRequest, Prepared)]) -> MetaResult<Vec<MetaReply>> {
        let retry_unknown = items.iter().all(|(r, _)| is_read_only(&r.op) || (r.request_id != 0 && r.op.needs_idempotency()));
        let started = tokio::time::Instant::now();
        let result = self.commit_group_attempts(items, retry_unknown).await;
        let m = &self.metrics;
        m.txn_duration.observe(started.elapsed().as_secs_f64());
        match &result {
            Ok(_) => {
                m.commits.inc();
                m.group_ops.observe(items.len() as f64);
            }
            Err(_) => {
                m.failures.inc();
            }
        }
        result
    }

    async fn commit_group_attempts(&self, items: &[(MetaRequest, Prepared)], retry_unknown: bool) -> MetaResult<Vec<MetaReply>> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result: MetaResult<Vec<MetaReply>> = async {
                let mut txn = self.engine.begin().await?;
                if items.iter().all(|(r, _)| r.relaxed) {
                    txn.set_durability(fskv_kv::Durability::Relaxed);
                }
                let mut replies = Vec::with_capacity(items.len());
                for (req, prep) in items {
                    replies.push(self.apply_recorded(&mut *txn, req, prep).await?);
                }
                txn.commit().await?;
                Ok(replies)
            }
            .await;
            match result {
                Err(e) if e.is_retryable_kv() && (!e.is_maybe_committed() || retry_unknown) && attempt < MAX_TXN_ATTEMPTS => {
                    let reason = if matches!(e, MetaError::Kv(fskv_kv::KvError::NotCommitted)) { "conflict" } else { "other" };
                    self.metrics.retries.get_or_create(&vec![("reason", reason.to_string())]).inc();
                    let backoff_ms = u64::from(attempt.min(20));
                    let jitter_ms = self.rng.lock().gen_range(0..=backoff_ms);
                    tokio::time::sleep(Duration::from_millis(backoff_ms / 2 + jitter_ms)).await;
                }
                other => return other,
            }
        }
    }

    /// Applies one request, returning (and keeping) its first result when it
    /// carries an idempotency record.
    async fn apply_recorded(&self, txn: &mut dyn Transaction, req: &MetaRequest, prep: &Prepared) -> MetaResult<MetaReply> {
        let recorded = req.request_id != 0 && req.op.needs_idempotency();
        let key = idempotency_key(req.client_id, req.request_id);
        if recorded {
            if let Some(raw) = txn.get(&key).await? {
                let rec: IdempotencyValue = decode(&key, &raw)?;
                if rec.op != op_name(&req.op) {
                    return Err(MetaError::InvalidArgument(format!(
                        "request id {} of client {} was used for {} and now for {}",
                        req.request_id,
                        req.client_id,
                        rec.op,
                        op_name(&req.op)
                    )));
                }
                tracing::debug!(client = req.client_id, request = req.request_id, "replaying recorded result");
                return Ok(rec.reply);
            }
        }
        let ctx = OpCtx { cfg: &self.cfg, user: &req.user, client_id: req.client_id, prep, owner: req.owner };
        let reply = ops::apply(txn, &ctx, &req.op).await?;
        if recorded {
            txn.set(&key, &encode(&IdempotencyValue { created_ns: prep.now_ns, op: op_name(&req.op).to_string(), reply: reply.clone() })?)?;
            txn.set(&idempotency_expiry_key(prep.now_ns, req.client_id, req.request_id), &[])?;
        }
        Ok(reply)
    }

    async fn after_commit(&self, op: &MetaOp, reply: &MetaReply) {
        if let (
            MetaOp::RemoveTree { .. }
            | MetaOp::Unlink { .. }
            | MetaOp::UnlinkExpected { .. }
            | MetaOp::Rename { .. }
            | MetaOp::Replace { .. },
            _,
        ) = (op, reply)
        {
            self.gc_wakeup.notify_one()
        }
    }

    async fn run_batch(&self, items: Vec<BatchItem>) {
        if items.len() > 1 {
            let group: Vec<(MetaRequest, Prepared)> = items.iter().map(|i| (i.req.clone(), i.prep.clone())).collect();
            if let Ok(replies) = self.commit_group(&group).await {
                for (item, reply) in items.into_iter().zip(replies) {
                    let _ = item.reply.send(Ok(reply));
                }
                return;
            }
            // Some op failed: the group's transaction was dropped; run each alone.
        }
        for item in items {
            let group = [(item.req, item.prep)];
            let result =
                self.commit_group(&group).await.and_then(|mut r| r.pop().ok_or_else(|| MetaError::Internal("empty group result".into())));
            let _ = item.reply.send(result);
        }
    }
}

/// Drains one shard's queue: up to `max_batch_ops` queued ops form a group
/// committed in one transaction; up to `batch_groups_in_flight` groups of a
/// shard commit at once (while all are busy, the queue fills the next group).
async fn batch_worker(inner: Arc<Inner>, mut rx: mpsc::Receiver<BatchItem>) {
    let slots = Arc::new(Semaphore::new(inner.cfg.batch_groups_in_flight.max(1)));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let Some(first) = rx.recv().await else { return };
        let mut items = vec![first];
        while items.len() < inner.cfg.max_batch_ops.max(1) {
            match rx.try_recv() {
                Ok(item) => items.push(item),
                Err(_) => break,
            }
        }
        let inner = inner.clone();
        tokio::spawn(
            async move {
                inner.run_batch(items).await;
                drop(permit);
            }
            .in_current_span(),
        );
    }
}

async fn gc_loop(inner: Arc<Inner>) {
    let interval = Duration::from_millis(inner.cfg.gc_interval_ms.max(1));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = inner.gc_wakeup.notified() => {}
        }
        match gc::run_once(&inner.engine, &*inner.storage, &inner.cfg).await {
            Ok(stats) if stats != GcStats::default() => tracing::debug!(?stats, "gc pass"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "gc pass failed"),
        }
    }
}
