//! The transaction layer shared by the embedded engines (memory and RocksDB):
//! read-your-writes overlay, conflict tracking, and the commit thread that
//! resolves conflicts and applies group-committed write batches.
//!
//! A store only has to provide consistent snapshots and atomic, durable
//! application of a batch of mutations ([`Store`]); everything that makes the
//! engine transactional lives here.
//!
//! Commit pipeline: `commit()` sends its read version, read-conflict set,
//! write-conflict set and mutations to one commit thread per engine. The thread
//! drains up to [`MAX_BATCH_TXNS`] requests, checks each against the
//! [`Resolver`] in arrival order (a later transaction in the batch conflicts
//! with an earlier one it read from), resolves atomic adds against the latest
//! state, applies all accepted mutations as ONE atomic, durable store write,
//! then publishes the new committed version and answers every waiter. So 16
//! concurrent committers share one fsync.

use crate::limits::{check_key, check_range, check_value, grow_transaction};
use crate::resolver::{ConflictSet, Resolver, Verdict};
use crate::{key_after, KeyValue, KvError, KvResult, RangeRequest, RangeResult, Transaction};
use async_trait::async_trait;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// Most transactions resolved and written in one store batch.
pub(crate) const MAX_BATCH_TXNS: usize = 512;
/// Most mutation bytes in one store batch (the batch is closed once over it).
pub(crate) const MAX_BATCH_BYTES: usize = 32 << 20;
/// Commit requests queued for the commit thread before `commit()` waits.
const COMMIT_QUEUE_DEPTH: usize = 4096;
/// How long write history is kept for conflict checks (FoundationDB: 5 s).
pub(crate) const CONFLICT_WINDOW_MS: u64 = 5_000;
/// Upper bound on point keys tracked by the resolver.
const MAX_TRACKED_KEYS: usize = 4_000_000;
/// Snapshot rows fetched per step of a merged range read.
const RANGE_PAGE_ROWS: usize = 512;

/// A mutation as applied to the store.
#[derive(Clone, Debug)]
pub(crate) enum Mutation {
    Set(Bytes, Bytes),
    Clear(Bytes),
    ClearRange(Bytes, Bytes),
}

/// A consistent read-only view of a store.
pub(crate) trait StoreSnapshot: Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> KvResult<Option<Bytes>>;
    /// Keys in `[begin, end)` in ascending (or descending when `reverse`)
    /// order, at most `limit` (> 0); `more` when the limit cut the read short.
    fn range(&self, begin: &[u8], end: &[u8], limit: usize, reverse: bool) -> KvResult<(Vec<KeyValue>, bool)>;
}

/// An ordered store that can apply a batch atomically and durably.
pub(crate) trait Store: Send + Sync + 'static {
    type Snapshot: StoreSnapshot;
    fn snapshot(&self) -> Self::Snapshot;
    /// The newest value of `key` (only called by the commit thread).
    fn get_latest(&self, key: &[u8]) -> KvResult<Option<Bytes>>;
    /// Applies `mutations` in order, atomically, recording `commit_version`
    /// as the last committed version; durably (fsync) when `sync`, else so
    /// that a process crash keeps it.
    fn apply(&self, mutations: &[Mutation], commit_version: u64, sync: bool) -> KvResult<()>;
    /// Makes everything applied so far durable.
    fn sync(&self) -> KvResult<()>;
}

struct CommitRequest {
    read_version: Option<u64>,
    reads: ConflictSet,
    writes: ConflictSet,
    mutations: Vec<PendingMutation>,
    size_bytes: usize,
    durable: bool,
    reply: oneshot::Sender<KvResult<u64>>,
}

#[derive(Clone, Debug)]
enum PendingMutation {
    Set(Bytes, Bytes),
    Clear(Bytes),
    ClearRange(Bytes, Bytes),
    Add(Bytes, i64),
    Max(Bytes, u64),
}

struct Core<S> {
    store: S,
    committed_version: AtomicU64,
    /// A relaxed batch was applied since the last sync.
    unsynced: std::sync::atomic::AtomicBool,
}

/// Owns the commit thread; joined when the last handle goes away so that a
/// store (e.g. a RocksDB directory lock) is released when the engine is dropped.
struct Inner<S: Store> {
    core: Arc<Core<S>>,
    commit_tx: Option<mpsc::Sender<CommitRequest>>,
    thread: Option<JoinHandle<()>>,
    /// Instead of the commit thread (see [`LocalEngine::start_inline`]).
    inline: Option<parking_lot::Mutex<InlineCommitter>>,
    /// The periodic sync thread and its stop signal.
    syncer: Option<(StopSignal, JoinHandle<()>)>,
}

impl<S: Store> Drop for Inner<S> {
    fn drop(&mut self) {
        if let Some((stop, t)) = self.syncer.take() {
            *stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            stop.1.notify_all();
            if t.join().is_err() {
                tracing::error!("KV sync thread panicked");
            }
        }
        self.commit_tx.take();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("KV commit thread panicked");
            }
        }
    }
}

/// A transactional engine over a [`Store`].
pub(crate) struct LocalEngine<S: Store> {
    inner: Arc<Inner<S>>,
}

impl<S: Store> Clone for LocalEngine<S> {
    fn clone(&self) -> Self {
        LocalEngine { inner: self.inner.clone() }
    }
}

impl<S: Store> LocalEngine<S> {
    /// Starts the engine's commit thread and, with `sync_interval_ms`, a
    /// thread that syncs relaxed commits that often (the bound on what power
    /// loss can take of them).
    pub fn start(store: S, committed_version: u64, name: &str, sync_interval_ms: Option<u64>) -> KvResult<Self> {
        let core = Arc::new(Core {
            store,
            committed_version: AtomicU64::new(committed_version),
            unsynced: std::sync::atomic::AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel(COMMIT_QUEUE_DEPTH);
        let thread_core = core.clone();
        let thread = std::thread::Builder::new()
            .name(format!("kv-commit-{name}"))
            .spawn(move || commit_loop(thread_core, rx))
            .map_err(|e| KvError::Storage(format!("cannot start the commit thread: {e}")))?;
        let syncer = match sync_interval_ms {
            Some(ms) => Some(start_syncer(core.clone(), name, ms)?),
            None => None,
        };
        Ok(LocalEngine { inner: Arc::new(Inner { core, commit_tx: Some(tx), thread: Some(thread), syncer, inline: None }) })
    }

    /// An engine without threads, for deterministic simulation: each commit
    /// is resolved and applied on the committing task, one at a time, and
    /// the conflict window ([`CONFLICT_WINDOW_MS`]) runs on `now_ms` (the
    /// simulation's clock). Same semantics as [`Self::start`], no group
    /// commit.
    pub fn start_inline(store: S, committed_version: u64, now_ms: Arc<dyn Fn() -> u64 + Send + Sync>) -> Self {
        let core = Arc::new(Core {
            store,
            committed_version: AtomicU64::new(committed_version),
            unsynced: std::sync::atomic::AtomicBool::new(false),
        });
        let committer = InlineCommitter {
            resolver: Resolver::new(CONFLICT_WINDOW_MS, MAX_TRACKED_KEYS, committed_version),
            next_version: committed_version + 1,
            now_ms,
        };
        let inline = Some(parking_lot::Mutex::new(committer));
        LocalEngine { inner: Arc::new(Inner { core, commit_tx: None, thread: None, syncer: None, inline }) }
    }

    pub fn store(&self) -> &S {
        &self.inner.core.store
    }

    /// Makes every commit acknowledged so far durable (a no-op when no
    /// relaxed commit happened since the last sync).
    pub async fn sync(&self) -> KvResult<()> {
        let core = self.inner.core.clone();
        tokio::task::spawn_blocking(move || sync_core(&core)).await.map_err(|e| KvError::Storage(format!("sync task: {e}")))?
    }

    pub fn committed_version(&self) -> u64 {
        self.inner.core.committed_version.load(Ordering::Acquire)
    }

    pub fn begin_local(&self) -> LocalTransaction<S> {
        LocalTransaction {
            inner: self.inner.clone(),
            snapshot: None,
            overlay: BTreeMap::new(),
            cleared: Vec::new(),
            reads: ConflictSet::default(),
            extra_writes: Vec::new(),
            size_bytes: 0,
            durability: crate::Durability::Synced,
        }
    }
}

type StopSignal = Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>;

fn start_syncer<S: Store>(core: Arc<Core<S>>, name: &str, interval_ms: u64) -> KvResult<(StopSignal, JoinHandle<()>)> {
    let stop: StopSignal = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let period = std::time::Duration::from_millis(interval_ms.max(1));
    let signal = stop.clone();
    let thread = std::thread::Builder::new()
        .name(format!("kv-sync-{name}"))
        .spawn(move || {
            let (lock, cvar) = &*signal;
            let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
            while !*stopped {
                stopped = cvar.wait_timeout(stopped, period).unwrap_or_else(|e| e.into_inner()).0;
                if let Err(e) = sync_core(&core) {
                    tracing::error!(error = %e, "periodic KV sync failed");
                }
            }
        })
        .map_err(|e| KvError::Storage(format!("cannot start the sync thread: {e}")))?;
    Ok((stop, thread))
}

fn sync_core<S: Store>(core: &Core<S>) -> KvResult<()> {
    if !core.unsynced.swap(false, Ordering::AcqRel) {
        return Ok(());
    }
    core.store.sync().inspect_err(|_| core.unsynced.store(true, Ordering::Release))
}

#[derive(Clone, Debug)]
enum OverlayOp {
    Set(Bytes),
    Clear,
    /// Add to the snapshot's value (never to a value cleared in this transaction:
    /// such adds are folded into `Set` at once).
    Add(i64),
    /// The larger of this and the snapshot's value (same folding rules as `Add`).
    Max(u64),
}

pub(crate) struct LocalTransaction<S: Store> {
    inner: Arc<Inner<S>>,
    snapshot: Option<(u64, Arc<S::Snapshot>)>,
    overlay: BTreeMap<Bytes, OverlayOp>,
    cleared: Vec<(Bytes, Bytes)>,
    reads: ConflictSet,
    extra_writes: Vec<(Bytes, Bytes)>,
    size_bytes: usize,
    durability: crate::Durability,
}

/// FoundationDB's ADD on an 8-byte operand.
pub(crate) fn add_le(base: Option<&[u8]>, delta: i64) -> Bytes {
    let mut cur = [0u8; 8];
    if let Some(b) = base {
        let n = b.len().min(8);
        cur[..n].copy_from_slice(&b[..n]);
    }
    let sum = i64::from_le_bytes(cur).wrapping_add(delta);
    Bytes::copy_from_slice(&sum.to_le_bytes())
}

/// FoundationDB's MAX on an 8-byte operand (unsigned little-endian compare).
pub(crate) fn max_le(base: Option<&[u8]>, value: u64) -> Bytes {
    let mut cur = [0u8; 8];
    if let Some(b) = base {
        let n = b.len().min(8);
        cur[..n].copy_from_slice(&b[..n]);
    }
    Bytes::copy_from_slice(&u64::from_le_bytes(cur).max(value).to_le_bytes())
}

impl<S: Store> LocalTransaction<S> {
    /// The snapshot, taken at the first read. The read version is loaded
    /// BEFORE the snapshot, so the snapshot holds at least every commit up to
    /// the read version; anything newer it may also hold is a write after the
    /// read version, which the resolver treats as a conflict — never a lost update.
    fn snap(&mut self) -> (u64, Arc<S::Snapshot>) {
        if let Some((v, s)) = &self.snapshot {
            return (*v, s.clone());
        }
        let v = self.inner.core.committed_version.load(Ordering::Acquire);
        let s = Arc::new(self.inner.core.store.snapshot());
        self.snapshot = Some((v, s.clone()));
        (v, s)
    }

    fn grow(&mut self, bytes: usize) -> KvResult<()> {
        grow_transaction(&mut self.size_bytes, bytes)
    }

    /// Records atomic `op` (`Add` or `Max`) on `key`: folded into a value
    /// this transaction set or cleared, merged with a pending op of the
    /// same kind, refused next to one of the other kind.
    fn atomic(&mut self, key: &[u8], op: OverlayOp) -> KvResult<()> {
        check_key(key)?;
        self.grow(key.len() + 8)?;
        let next = match (self.overlay.get(key), &op) {
            (Some(OverlayOp::Set(v)), _) => OverlayOp::Set(resolve_own(&op, Some(v)).unwrap_or_default()),
            (Some(OverlayOp::Clear), _) => OverlayOp::Set(resolve_own(&op, None).unwrap_or_default()),
            (None, _) if self.is_cleared(key) => OverlayOp::Set(resolve_own(&op, None).unwrap_or_default()),
            (Some(OverlayOp::Add(a)), OverlayOp::Add(d)) => OverlayOp::Add(a.wrapping_add(*d)),
            (Some(OverlayOp::Max(a)), OverlayOp::Max(m)) => OverlayOp::Max((*a).max(*m)),
            (Some(_), _) => return Err(mixed_atomics(key)),
            (None, _) => op.clone(),
        };
        self.overlay.insert(Bytes::copy_from_slice(key), next);
        Ok(())
    }

    fn is_cleared(&self, key: &[u8]) -> bool {
        self.cleared.iter().any(|(b, e)| &b[..] <= key && key < &e[..])
    }

    fn point_read(&mut self, key: &[u8], conflict: bool) -> KvResult<Option<Bytes>> {
        check_key(key)?;
        let pending = match self.overlay.get(key) {
            Some(OverlayOp::Set(v)) => return Ok(Some(v.clone())),
            Some(OverlayOp::Clear) => return Ok(None),
            Some(op @ (OverlayOp::Add(_) | OverlayOp::Max(_))) => Some(op.clone()),
            None if self.is_cleared(key) => return Ok(None),
            None => None,
        };
        let (_, snap) = self.snap();
        let base = snap.get(key)?;
        if conflict {
            self.grow(key.len())?;
            self.reads.points.push(Bytes::copy_from_slice(key));
        }
        Ok(match pending {
            Some(op) => resolve_own(&op, base.as_ref()),
            None => base,
        })
    }

    fn range_read(&mut self, req: &RangeRequest, conflict: bool) -> KvResult<RangeResult> {
        check_range(&req.begin, &req.end)?;
        let limit = if req.limit == 0 { usize::MAX } else { req.limit };
        let (_, snap) = self.snap();
        let result = self.merged_range(&snap, req, limit)?;
        if conflict {
            let (b, e) = match (result.more, result.kvs.last(), req.reverse) {
                (true, Some((last, _)), false) => (req.begin.clone(), key_after(last)),
                (true, Some((last, _)), true) => (last.clone(), req.end.clone()),
                _ => (req.begin.clone(), req.end.clone()),
            };
            self.grow(b.len() + e.len())?;
            self.reads.ranges.push((b, e));
        }
        Ok(result)
    }

    /// Merges the snapshot's rows with this transaction's own writes, in order.
    fn merged_range(&self, snap: &S::Snapshot, req: &RangeRequest, limit: usize) -> KvResult<RangeResult> {
        let reverse = req.reverse;
        let before = |a: &[u8], b: &[u8]| if reverse { a > b } else { a < b };
        let mut own: Vec<(Bytes, OverlayOp)> = self
            .overlay
            .range::<[u8], _>((std::ops::Bound::Included(&req.begin[..]), std::ops::Bound::Excluded(&req.end[..])))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if reverse {
            own.reverse();
        }
        let mut own_i = 0;
        let (mut lo, mut hi) = (req.begin.clone(), req.end.clone());
        let mut out: Vec<KeyValue> = Vec::new();
        loop {
            let page_rows = (limit - out.len()).saturating_add(16).min(RANGE_PAGE_ROWS);
            let (page, page_more) = snap.range(&lo, &hi, page_rows, reverse)?;
            // Rows up to `boundary` (inclusive) are fully known: merge own writes up to it.
            let boundary = if page_more { page.last().map(|(k, _)| k.clone()) } else { None };
            let within = |k: &[u8]| boundary.as_ref().is_none_or(|b| !before(b, k));
            let mut page_i = 0;
            loop {
                let next_own = own.get(own_i).filter(|(k, _)| within(k));
                let next_page = page.get(page_i);
                let (key, value) = match (next_own, next_page) {
                    (None, None) => break,
                    (Some((ok, op)), Some((pk, pv))) if ok == pk => {
                        own_i += 1;
                        page_i += 1;
                        (ok.clone(), resolve_own(op, Some(pv)))
                    }
                    (Some((ok, op)), Some((pk, _))) if before(ok, pk) => {
                        own_i += 1;
                        (ok.clone(), resolve_own(op, None))
                    }
                    (Some((ok, op)), None) => {
                        own_i += 1;
                        (ok.clone(), resolve_own(op, None))
                    }
                    (_, Some((pk, pv))) => {
                        page_i += 1;
                        let v = if self.is_cleared(pk) { None } else { Some(pv.clone()) };
                        (pk.clone(), v)
                    }
                };
                if let Some(v) = value {
                    out.push((key, v));
                    if out.len() >= limit {
                        let rest = page_i < page.len() || page_more || own_i < own.len();
                        return Ok(RangeResult { kvs: out, more: rest });
                    }
                }
            }
            match boundary {
                None => return Ok(RangeResult { kvs: out, more: false }),
                Some(b) => {
                    if reverse {
                        hi = b;
                    } else {
                        lo = key_after(&b);
                    }
                }
            }
        }
    }

    fn into_request(self, reply: oneshot::Sender<KvResult<u64>>) -> CommitRequest {
        let mut writes = ConflictSet::default();
        let mut mutations = Vec::with_capacity(self.cleared.len() + self.overlay.len());
        for (b, e) in &self.cleared {
            writes.ranges.push((b.clone(), e.clone()));
            mutations.push(PendingMutation::ClearRange(b.clone(), e.clone()));
        }
        writes.ranges.extend(self.extra_writes.iter().cloned());
        for (k, op) in self.overlay {
            writes.points.push(k.clone());
            mutations.push(match op {
                OverlayOp::Set(v) => PendingMutation::Set(k, v),
                OverlayOp::Clear => PendingMutation::Clear(k),
                OverlayOp::Add(d) => PendingMutation::Add(k, d),
                OverlayOp::Max(m) => PendingMutation::Max(k, m),
            });
        }
        CommitRequest {
            read_version: self.snapshot.map(|(v, _)| v),
            reads: self.reads,
            writes,
            mutations,
            size_bytes: self.size_bytes,
            durable: self.durability == crate::Durability::Synced,
            reply,
        }
    }
}

fn mixed_atomics(key: &[u8]) -> KvError {
    KvError::InvalidArgument(format!("atomic add and atomic max on one key ({} bytes) in one transaction", key.len()))
}

fn resolve_own(op: &OverlayOp, base: Option<&Bytes>) -> Option<Bytes> {
    match op {
        OverlayOp::Set(v) => Some(v.clone()),
        OverlayOp::Clear => None,
        OverlayOp::Add(d) => Some(add_le(base.map(|b| &b[..]), *d)),
        OverlayOp::Max(m) => Some(max_le(base.map(|b| &b[..]), *m)),
    }
}

#[async_trait]
impl<S: Store> Transaction for LocalTransaction<S> {
    async fn get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        self.point_read(key, true)
    }

    async fn snapshot_get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        self.point_read(key, false)
    }

    async fn get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        self.range_read(range, true)
    }

    async fn snapshot_get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        self.range_read(range, false)
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> KvResult<()> {
        check_key(key)?;
        check_value(value)?;
        self.grow(key.len() + value.len())?;
        self.overlay.insert(Bytes::copy_from_slice(key), OverlayOp::Set(Bytes::copy_from_slice(value)));
        Ok(())
    }

    fn clear(&mut self, key: &[u8]) -> KvResult<()> {
        check_key(key)?;
        self.grow(key.len())?;
        self.overlay.insert(Bytes::copy_from_slice(key), OverlayOp::Clear);
        Ok(())
    }

    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        check_range(begin, end)?;
        if begin == end {
            return Ok(());
        }
        self.grow(begin.len() + end.len())?;
        let doomed: Vec<Bytes> = self
            .overlay
            .range::<[u8], _>((std::ops::Bound::Included(begin), std::ops::Bound::Excluded(end)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.overlay.remove(&k);
        }
        self.cleared.push((Bytes::copy_from_slice(begin), Bytes::copy_from_slice(end)));
        Ok(())
    }

    fn atomic_add(&mut self, key: &[u8], delta: i64) -> KvResult<()> {
        self.atomic(key, OverlayOp::Add(delta))
    }

    fn atomic_max(&mut self, key: &[u8], value: u64) -> KvResult<()> {
        self.atomic(key, OverlayOp::Max(value))
    }

    fn add_read_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        check_range(begin, end)?;
        self.grow(begin.len() + end.len())?;
        self.snap();
        self.reads.ranges.push((Bytes::copy_from_slice(begin), Bytes::copy_from_slice(end)));
        Ok(())
    }

    fn add_write_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        check_range(begin, end)?;
        self.grow(begin.len() + end.len())?;
        self.extra_writes.push((Bytes::copy_from_slice(begin), Bytes::copy_from_slice(end)));
        Ok(())
    }

    fn set_durability(&mut self, durability: crate::Durability) {
        self.durability = durability;
    }

    async fn commit(self: Box<Self>) -> KvResult<u64> {
        let read_only = self.overlay.is_empty() && self.cleared.is_empty() && self.extra_writes.is_empty();
        if read_only {
            let v = self.snapshot.as_ref().map(|(v, _)| *v);
            return Ok(v.unwrap_or_else(|| self.inner.core.committed_version.load(Ordering::Acquire)));
        }
        if self.inner.inline.is_some() {
            let inner = self.inner.clone();
            let (reply_tx, mut reply_rx) = oneshot::channel();
            let request = self.into_request(reply_tx);
            let Some(committer) = &inner.inline else { return Err(KvError::Closed) };
            let core = &inner.core;
            let mut c = committer.lock();
            let now_ms = (c.now_ms)();
            let InlineCommitter { resolver, next_version, .. } = &mut *c;
            commit_batch(core, resolver, next_version, vec![request], now_ms);
            return reply_rx.try_recv().unwrap_or(Err(KvError::CommitUnknownResult));
        }
        let tx = self.inner.commit_tx.clone().ok_or(KvError::Closed)?;
        let (reply_tx, reply_rx) = oneshot::channel();
        let request = self.into_request(reply_tx);
        tx.send(request).await.map_err(|_| KvError::Closed)?;
        // The commit thread dropping the reply means it died mid-batch: the
        // batch may or may not be on disk.
        reply_rx.await.unwrap_or(Err(KvError::CommitUnknownResult))
    }
}

/// The commit thread's state, kept by an engine that commits inline.
struct InlineCommitter {
    resolver: Resolver,
    next_version: u64,
    now_ms: Arc<dyn Fn() -> u64 + Send + Sync>,
}

fn commit_loop<S: Store>(core: Arc<Core<S>>, mut rx: mpsc::Receiver<CommitRequest>) {
    let start_version = core.committed_version.load(Ordering::Acquire);
    let mut resolver = Resolver::new(CONFLICT_WINDOW_MS, MAX_TRACKED_KEYS, start_version);
    let mut next_version = start_version + 1;
    let clock = Instant::now();
    while let Some(first) = rx.blocking_recv() {
        let mut bytes = first.size_bytes;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_TXNS && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(r) => {
                    bytes += r.size_bytes;
                    batch.push(r);
                }
                Err(_) => break,
            }
        }
        let now_ms = clock.elapsed().as_millis() as u64;
        commit_batch(&core, &mut resolver, &mut next_version, batch, now_ms);
    }
}

/// Resolves, applies and answers one batch. Versions handed out are never
/// reused, even if the store write fails.
fn commit_batch<S: Store>(core: &Core<S>, resolver: &mut Resolver, next_version: &mut u64, batch: Vec<CommitRequest>, now_ms: u64) {
    resolver.prune(now_ms);
    let mut latest = BatchView { store: &core.store, written: HashMap::new(), cleared: Vec::new() };
    let mut mutations = Vec::new();
    let mut accepted = Vec::with_capacity(batch.len());
    let mut durable_in_batch = false;
    for req in batch {
        let read_version = req.read_version.unwrap_or(*next_version - 1);
        match resolver.check(read_version, &req.reads) {
            Verdict::TooOld => {
                let _ = req.reply.send(Err(KvError::TransactionTooOld));
                continue;
            }
            Verdict::Conflict => {
                let _ = req.reply.send(Err(KvError::NotCommitted));
                continue;
            }
            Verdict::Commit => {}
        }
        let resolved = match latest.resolve(&req.mutations) {
            Ok(m) => m,
            Err(e) => {
                let _ = req.reply.send(Err(e));
                continue;
            }
        };
        mutations.extend(resolved);
        let version = *next_version;
        *next_version += 1;
        resolver.record(version, &req.writes, now_ms);
        durable_in_batch |= req.durable;
        accepted.push((req.reply, version));
    }
    let Some(&(_, last_version)) = accepted.last() else { return };
    // One durable transaction makes the whole batch durable (and everything
    // relaxed before it: the log is written in order).
    let sync = durable_in_batch;
    if !sync {
        core.unsynced.store(true, Ordering::Release);
    }
    match core.store.apply(&mutations, last_version, sync) {
        Ok(()) => {
            core.committed_version.store(last_version, Ordering::Release);
            for (reply, v) in accepted {
                let _ = reply.send(Ok(v));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, txns = accepted.len(), "KV batch write failed; nothing of it was applied");
            for (reply, _) in accepted {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// The latest state as seen by the commit thread: the store plus what earlier
/// transactions of the current batch wrote (needed to resolve atomic adds).
struct BatchView<'a, S: Store> {
    store: &'a S,
    written: HashMap<Bytes, Option<Bytes>>,
    cleared: Vec<(Bytes, Bytes)>,
}

impl<S: Store> BatchView<'_, S> {
    fn get(&self, key: &[u8]) -> KvResult<Option<Bytes>> {
        if let Some(v) = self.written.get(key) {
            return Ok(v.clone());
        }
        if self.cleared.iter().any(|(b, e)| &b[..] <= key && key < &e[..]) {
            return Ok(None);
        }
        self.store.get_latest(key)
    }

    /// Turns one transaction's mutations into store mutations and records
    /// their effect for later transactions of the batch. All-or-nothing.
    fn resolve(&mut self, pending: &[PendingMutation]) -> KvResult<Vec<Mutation>> {
        let mut out = Vec::with_capacity(pending.len());
        let mut effects: Vec<(Bytes, Option<Bytes>)> = Vec::new();
        let mut ranges = Vec::new();
        for m in pending {
            match m {
                PendingMutation::ClearRange(b, e) => {
                    ranges.push((b.clone(), e.clone()));
                    out.push(Mutation::ClearRange(b.clone(), e.clone()));
                }
                PendingMutation::Set(k, v) => {
                    effects.push((k.clone(), Some(v.clone())));
                    out.push(Mutation::Set(k.clone(), v.clone()));
                }
                PendingMutation::Clear(k) => {
                    effects.push((k.clone(), None));
                    out.push(Mutation::Clear(k.clone()));
                }
                PendingMutation::Add(k, d) => {
                    // Clear ranges of this same transaction precede its point
                    // ops, and never cover its adds (those become sets).
                    let base = self.get(k)?;
                    let v = add_le(base.as_deref(), *d);
                    effects.push((k.clone(), Some(v.clone())));
                    out.push(Mutation::Set(k.clone(), v));
                }
                PendingMutation::Max(k, m) => {
                    let base = self.get(k)?;
                    let v = max_le(base.as_deref(), *m);
                    effects.push((k.clone(), Some(v.clone())));
                    out.push(Mutation::Set(k.clone(), v));
                }
            }
        }
        for (b, e) in ranges {
            self.written.retain(|k, _| !(b <= *k && *k < e));
            self.cleared.push((b, e));
        }
        self.written.extend(effects);
        Ok(out)
    }
}
