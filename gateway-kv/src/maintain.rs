//! The writer's background work on every namespace: its index
//! (`index.rs`), access-log merges, TTL expiry, eviction, stats and
//! checkpoints. Readers run none of it (they only flush access logs).
//!
//! | task | every | what |
//! |---|---|---|
//! | load | start, new namespaces | scan the namespace (sizes, versions, expiry), take access times from the checkpoint (else the modify time), clear "condemned" bits left by a crash, merge the logs not yet removed |
//! | merge | `merge_interval_ms` | read new access logs: last access per key, in-flight reads, leases, hit/miss counts |
//! | expire | `ttl_sweep_interval_ms` | remove keys whose expiry passed (compare-and-delete on the version the index knows: a key rewritten since is not touched) |
//! | evict | a put above the high watermark, or each tick | one round per namespace at a time, below |
//! | stats | `stats_interval_ms` | publish `ROOT/.fskv-kv/stats/<ns>` for readers |
//! | checkpoint | `checkpoint_interval_ms`, and once more at stop (≤ 4 s) | write `ROOT/.fskv-kv/checkpoint/<ns>` (counters, last access of every key), then remove the logs it covers |
//! | rescan | `rescan_interval_ms` | reconcile the index with the namespace (changes made through FUSE, S3 or other writers) |
//!
//! **An eviction round** never removes a key being read or written, or
//! one under an exists-lease:
//!
//! 1. merge the logs; plan victims in LRU order, skipping leased keys, keys
//!    this writer is writing and keys a reader reported streaming;
//! 2. mark each victim **condemned** (a mode bit, set only if the file is
//!    still the version planned);
//! 3. wait `eviction_confirm_ms` (≥ two flush intervals: every read that
//!    started before step 2 has been reported by then);
//! 4. merge the logs again; a victim accessed, leased, rewritten or being
//!    written since step 1 is spared (its bit cleared);
//! 5. compare-and-delete the others.
//!
//! Leases are safe by a handshake: an exists-with-lease first publishes
//! the lease, then looks the keys up, and counts a condemned key as
//! missing. If its lookup saw the key uncondemned, the lease was published
//! before step 2 and so before step 4's merge, which spares the key.
//!
//! Several writers: each runs this on its own index; compare-and-delete
//! keeps them from removing a value another wrote, but they may evict more
//! than needed. Run one with maintenance (`--no-maintenance` on the others).

use crate::config::{Limits, Maintenance, NamespaceConfig};
use crate::error::{KvError, Result};
use crate::frame::Version;
use crate::index::{Counters, NsIndex, Victim};
use crate::keys::KeyPath;
use crate::ops::namespace::NsStats;
use crate::recency::Log;
use crate::record::{self, Record, XATTR_RECORD};
use crate::store::{Namespace, Store};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use fskv_client::keywalk::Walker;
use fskv_proto::meta::{Expected, MetaOp, MetaReply, SetAttr};
use fskv_types::{ErrorCode, InodeId};
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// Bound on the last checkpoint and stats a stopping writer writes.
const STOP_CHECKPOINT_TIMEOUT_MS: u64 = 4_000;
/// Access logs read per namespace per merge at most.
const MAX_LOGS_PER_MERGE: usize = 4096;
/// Largest access log or checkpoint read.
const MAX_LOG_BYTES: u64 = 1 << 30;

struct NsState {
    dir: InodeId,
    config: NamespaceConfig,
    index: NsIndex,
    loaded: bool,
    loading: bool,
    /// Keys written while a scan of the namespace runs (a reconcile keeps them).
    put_during_scan: Option<HashSet<Vec<u8>>>,
    /// Access logs merged and not yet removed.
    merged: BTreeSet<String>,
    /// Recency or counters changed since the last checkpoint / stats.
    dirty_checkpoint: bool,
    dirty_stats: bool,
    evicting: bool,
}

impl NsState {
    fn new(dir: InodeId, config: NamespaceConfig) -> NsState {
        NsState {
            dir,
            config,
            index: NsIndex::default(),
            loaded: false,
            loading: false,
            put_during_scan: None,
            merged: BTreeSet::new(),
            dirty_checkpoint: false,
            dirty_stats: true,
            evicting: false,
        }
    }
}

pub struct Maintainer {
    store: Store,
    cfg: Maintenance,
    limits: Limits,
    state: Mutex<BTreeMap<String, NsState>>,
    /// Space was freed (puts waiting for room look again).
    room: Notify,
    /// A namespace went above its high watermark.
    evict_wake: Notify,
}

/// Marks a key as being written while alive.
pub struct WriteGuard {
    m: Arc<Maintainer>,
    ns: String,
    key: Vec<u8>,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        if let Some(st) = self.m.state.lock().get_mut(&self.ns) {
            st.index.end_write(&self.key);
        }
    }
}

fn ns_name_ok(name: &str) -> bool {
    crate::keys::is_namespace_name(name)
}

impl Maintainer {
    pub fn new(store: Store, cfg: Maintenance, limits: Limits) -> Arc<Maintainer> {
        Arc::new(Maintainer { store, cfg, limits, state: Mutex::new(BTreeMap::new()), room: Notify::new(), evict_wake: Notify::new() })
    }

    // ----- called by the operations -----

    pub fn write_guard(self: &Arc<Self>, ns: &str, key: &[u8]) -> WriteGuard {
        if let Some(st) = self.state.lock().get_mut(ns) {
            st.index.begin_write(key);
        }
        WriteGuard { m: Arc::clone(self), ns: ns.to_string(), key: key.to_vec() }
    }

    /// Waits until a value of `size` bytes fits the namespace's capacity
    /// (eviction makes room), at most `full_wait_ms`; else `NamespaceFull`.
    pub async fn admit(&self, ns: &Namespace, key: &[u8], size: u64) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.cfg.full_wait_ms);
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let st = self.state.lock();
                let Some(s) = st.get(&ns.name).filter(|s| s.loaded) else { return Ok(()) };
                let cfg = &s.config;
                if !cfg.limited() {
                    return Ok(());
                }
                if cfg.capacity_bytes > 0 && size > cfg.capacity_bytes {
                    return Err(KvError::NamespaceFull {
                        ns: ns.name.clone(),
                        detail: format!("a value of {size} bytes is above its capacity of {} bytes", cfg.capacity_bytes),
                    });
                }
                let old = s.index.get(key);
                let extra = size.saturating_sub(old.map_or(0, |e| e.size));
                if s.index.fits(cfg, extra, old.is_none()) {
                    return Ok(());
                }
            }
            self.evict_wake.notify_one();
            if tokio::time::Instant::now() >= deadline {
                let detail = {
                    let st = self.state.lock();
                    st.get(&ns.name).map_or(String::new(), |s| format!("{} keys, {} bytes", s.index.keys(), s.index.bytes))
                };
                return Err(KvError::NamespaceFull { ns: ns.name.clone(), detail });
            }
            tokio::select! {
                _ = room => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    pub fn on_put(&self, ns: &str, key: &[u8], size: u64, version: Version, expires_ns: Option<u64>) {
        let mut st = self.state.lock();
        let Some(s) = st.get_mut(ns) else { return };
        s.index.upsert(key, size, version, expires_ns, record::now_ns());
        if let Some(set) = &mut s.put_during_scan {
            set.insert(key.to_vec());
        }
        s.dirty_stats = true;
        s.dirty_checkpoint = true;
        if s.loaded && s.index.over_high(&s.config) {
            self.evict_wake.notify_one();
        }
    }

    pub fn on_delete(&self, ns: &str, key: &[u8]) {
        let mut st = self.state.lock();
        if let Some(s) = st.get_mut(ns) {
            s.index.remove(key);
            s.dirty_stats = true;
        }
        drop(st);
        self.room.notify_waiters();
    }

    pub fn pin(&self, ns: &str, keys: &[&[u8]], until_ns: u64) {
        if let Some(s) = self.state.lock().get_mut(ns) {
            for k in keys {
                s.index.pin(k, until_ns);
            }
        }
    }

    pub fn stats(&self, ns: &str) -> Option<NsStats> {
        let st = self.state.lock();
        let s = st.get(ns).filter(|s| s.loaded)?;
        Some(stats_of(&s.index))
    }

    /// A namespace made or changed through this writer.
    pub fn namespace_changed(&self, ns: &Namespace, created: bool) {
        let mut st = self.state.lock();
        let s = st.entry(ns.name.clone()).or_insert_with(|| NsState::new(ns.dir, ns.config.clone()));
        s.config = ns.config.clone();
        if created && !s.loading {
            // Nothing in it yet.
            s.dir = ns.dir;
            s.loaded = true;
        }
        if s.loaded && s.index.over_high(&s.config) {
            self.evict_wake.notify_one();
        }
    }

    pub fn namespace_deleted(&self, ns: &str) {
        self.state.lock().remove(ns);
        self.room.notify_waiters();
    }

    /// The index's LRU order (tests).
    pub fn lru_order(&self, ns: &str) -> Vec<Vec<u8>> {
        self.state.lock().get(ns).map(|s| s.index.lru_order().iter().map(|k| k.to_vec()).collect()).unwrap_or_default()
    }

    /// Whether a namespace's index is loaded (tests, start-up).
    pub fn loaded(&self, ns: &str) -> bool {
        self.state.lock().get(ns).is_some_and(|s| s.loaded)
    }

    // ----- the background loop -----

    /// Runs until `stop` turns true.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let tick = Duration::from_millis(self.cfg.ttl_sweep_interval_ms.min(self.cfg.merge_interval_ms).clamp(10, 1000));
        let mut last_merge = Instant::now();
        let mut last_stats = Instant::now();
        let mut last_checkpoint = Instant::now();
        let mut last_rescan: Option<Instant> = None;
        loop {
            if last_rescan.map_or(true, |t| t.elapsed() >= Duration::from_millis(self.cfg.rescan_interval_ms)) {
                last_rescan = Some(Instant::now());
                let me = Arc::clone(&self);
                tokio::spawn(async move { me.rescan_all().await });
            }
            if last_merge.elapsed() >= Duration::from_millis(self.cfg.merge_interval_ms) {
                last_merge = Instant::now();
                for ns in self.loaded_namespaces() {
                    if let Err(e) = self.merge(&ns).await {
                        tracing::warn!(namespace = %ns, error = %e, "merging access logs failed");
                    }
                }
            }
            for ns in self.loaded_namespaces() {
                if let Err(e) = self.expire(&ns).await {
                    tracing::warn!(namespace = %ns, error = %e, "TTL expiry failed");
                }
            }
            self.start_evictions();
            if last_stats.elapsed() >= Duration::from_millis(self.cfg.stats_interval_ms) {
                last_stats = Instant::now();
                self.publish_stats().await;
            }
            if last_checkpoint.elapsed() >= Duration::from_millis(self.cfg.checkpoint_interval_ms) {
                last_checkpoint = Instant::now();
                for ns in self.loaded_namespaces() {
                    if let Err(e) = self.checkpoint(&ns).await {
                        tracing::warn!(namespace = %ns, error = %e, "checkpoint failed");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = self.evict_wake.notified() => {}
                r = stop.changed() => if r.is_err() || *stop.borrow() { break },
            }
        }
        // A stopping writer leaves its counters and access times behind for
        // the next one (else they would fall back to the last periodic
        // checkpoint): one last checkpoint and stats, bounded in time.
        let last = async {
            for ns in self.loaded_namespaces() {
                if let Err(e) = self.checkpoint(&ns).await {
                    tracing::warn!(namespace = %ns, error = %e, "checkpoint at stop failed");
                }
            }
            self.publish_stats().await;
        };
        if tokio::time::timeout(Duration::from_millis(STOP_CHECKPOINT_TIMEOUT_MS), last).await.is_err() {
            tracing::warn!(timeout_ms = STOP_CHECKPOINT_TIMEOUT_MS, "checkpoint at stop cut short");
        }
    }

    fn loaded_namespaces(&self) -> Vec<String> {
        self.state.lock().iter().filter(|(_, s)| s.loaded).map(|(n, _)| n.clone()).collect()
    }

    /// Lists the namespaces: loads new ones, reconciles known ones.
    async fn rescan_all(self: Arc<Self>) {
        let names = match self.store.list_namespaces(None).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list namespaces");
                return;
            }
        };
        let present: HashSet<&String> = names.iter().collect();
        self.state.lock().retain(|n, _| present.contains(n));
        for name in names {
            if let Err(e) = self.load(&name).await {
                tracing::warn!(namespace = %name, error = %e, "loading the namespace index failed");
            }
        }
    }

    /// Scans a namespace into its index (first load or rescan).
    pub async fn load(&self, name: &str) -> Result<()> {
        if !ns_name_ok(name) {
            return Ok(());
        }
        self.store.forget_namespace(name);
        let ns = self.store.namespace(name).await?;
        let first = {
            let mut st = self.state.lock();
            let s = st.entry(name.to_string()).or_insert_with(|| NsState::new(ns.dir, ns.config.clone()));
            if s.loading {
                return Ok(());
            }
            s.loading = true;
            s.dir = ns.dir;
            s.config = ns.config.clone();
            s.put_during_scan = Some(HashSet::new());
            !s.loaded
        };
        let scanned = self.scan_namespace(&ns).await;
        let checkpoint = if first { self.read_checkpoint(name).await.ok().flatten() } else { None };
        {
            let mut st = self.state.lock();
            let Some(s) = st.get_mut(name) else { return Ok(()) };
            s.loading = false;
            let keep = s.put_during_scan.take().unwrap_or_default();
            let scanned = match scanned {
                Ok(v) => v,
                Err(e) => return Err(e),
            };
            let (times, counters) = checkpoint.unwrap_or_default();
            let entries = scanned
                .into_iter()
                .map(|(key, size, version, expires, mtime)| {
                    let access = times.get(&key).copied().unwrap_or(mtime).max(mtime);
                    (key, size, version, expires, access)
                })
                .collect();
            let (added, removed) = s.index.reconcile_keeping(entries, &keep);
            if first {
                s.index.counters = counters;
            }
            s.loaded = true;
            s.dirty_stats = true;
            tracing::info!(namespace = name, keys = s.index.keys(), bytes = s.index.bytes, added, removed, "namespace index loaded");
        }
        if first {
            self.merge(name).await?;
        }
        Ok(())
    }

    /// Every key of a namespace: (key, size, version, expiry, mtime).
    /// Condemned bits left by a crash are cleared.
    async fn scan_namespace(&self, ns: &Namespace) -> Result<Vec<crate::index::Scanned>> {
        let mut walker = Walker::new(self.store.fs.clone(), ns.dir, None);
        let mut out = Vec::new();
        let mut with_record = Vec::new();
        let mut condemned = Vec::new();
        while let Some(f) = walker.next().await.map_err(KvError::walk)? {
            let Some(a) = f.entry.attr else { continue };
            if record::has_record(&a) {
                with_record.push((out.len(), a.id));
            }
            if record::is_condemned(&a) {
                condemned.push(a.clone());
            }
            out.push((f.key, a.size_bytes(), record::version_of(&a), None, a.mtime_ns));
        }
        for group in with_record.chunks(1024) {
            let ops = group.iter().map(|(_, id)| MetaOp::GetXattr { inode: *id, name: XATTR_RECORD.into() }).collect();
            let results = self.store.fs.meta().batch(ops).await.map_err(|e| KvError::from_code(e.code(), "scan", KvError::NoSuchKey))?;
            for ((i, _), r) in group.iter().zip(results) {
                if let Ok(MetaReply::Xattr(v)) = r {
                    out[*i].3 = Record::decode(&v).expires_ns;
                }
            }
        }
        for inode in condemned {
            match self.store.set_condemned(&inode, false).await {
                Ok(new) => {
                    if let Some(e) = out.iter_mut().find(|e| e.2.inode == inode.id.0) {
                        e.2 = record::version_of(&new);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "could not clear a condemned bit"),
            }
        }
        Ok(out)
    }

    // ----- access logs -----

    /// Reads the access logs not merged yet into the index.
    pub async fn merge(&self, name: &str) -> Result<()> {
        let dir = match self.store.fs.meta().lookup(self.store.system.recency, name).await {
            Ok(d) => d.id,
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(()),
            Err(e) => return Err(KvError::from_code(e.code(), "access logs", KvError::NoSuchKey)),
        };
        let merged: BTreeSet<String> = self.state.lock().get(name).map(|s| s.merged.clone()).unwrap_or_default();
        let mut fresh = Vec::new();
        let mut after = String::new();
        'list: loop {
            let (entries, more) = self
                .store
                .fs
                .meta()
                .readdir(dir, &after, 1024, false)
                .await
                .map_err(|e| KvError::from_code(e.code(), "access logs", KvError::NoSuchKey))?;
            for e in &entries {
                if !merged.contains(&e.name) {
                    fresh.push(e.name.clone());
                    if fresh.len() >= MAX_LOGS_PER_MERGE {
                        break 'list;
                    }
                }
            }
            match entries.last() {
                Some(l) if more => after = l.name.clone(),
                _ => break,
            }
        }
        if fresh.is_empty() {
            return Ok(());
        }
        let store = &self.store;
        let logs: Vec<(String, Option<Log>)> = futures::stream::iter(fresh)
            .map(|n| async move {
                let log = match store.read_file(dir, &n, MAX_LOG_BYTES).await {
                    Ok(Some(b)) => Log::decode(&b),
                    _ => None,
                };
                (n, log)
            })
            .buffer_unordered(32)
            .collect()
            .await;
        let mut st = self.state.lock();
        let Some(s) = st.get_mut(name) else { return Ok(()) };
        for (n, log) in logs {
            if let Some(log) = log {
                apply_log(&mut s.index, &log);
            }
            s.merged.insert(n);
        }
        s.dirty_checkpoint = true;
        s.dirty_stats = true;
        Ok(())
    }

    // ----- checkpoints and stats -----

    async fn read_checkpoint(&self, name: &str) -> Result<Option<(HashMap<Vec<u8>, u64>, Counters)>> {
        let Some(b) = self.store.read_file(self.store.system.checkpoint, name, MAX_LOG_BYTES).await? else { return Ok(None) };
        Ok(decode_checkpoint(&b))
    }

    /// Writes the checkpoint, then removes the logs it covers.
    pub async fn checkpoint(&self, name: &str) -> Result<()> {
        let (bytes, covered) = {
            let mut st = self.state.lock();
            let Some(s) = st.get_mut(name).filter(|s| s.loaded && s.dirty_checkpoint) else { return Ok(()) };
            s.dirty_checkpoint = false;
            (encode_checkpoint(&s.index), s.merged.clone())
        };
        self.store.write_file(self.store.system.checkpoint, name, bytes).await?;
        if let Ok(dir) = self.store.fs.meta().lookup(self.store.system.recency, name).await {
            let store = &self.store;
            let removed: Vec<String> = futures::stream::iter(covered)
                .map(|n| async move {
                    match store.fs.meta().unlink(dir.id, &n).await {
                        Ok(()) => Some(n),
                        Err(e) if e.code() == ErrorCode::NotFound => Some(n),
                        Err(_) => None,
                    }
                })
                .buffer_unordered(32)
                .filter_map(|x| async move { x })
                .collect()
                .await;
            if let Some(s) = self.state.lock().get_mut(name) {
                for n in removed {
                    s.merged.remove(&n);
                }
            }
        }
        Ok(())
    }

    async fn publish_stats(&self) {
        let todo: Vec<(String, NsStats)> = {
            let mut st = self.state.lock();
            st.iter_mut()
                .filter(|(_, s)| s.loaded && s.dirty_stats)
                .map(|(n, s)| {
                    s.dirty_stats = false;
                    (n.clone(), stats_of(&s.index))
                })
                .collect()
        };
        for (name, stats) in todo {
            let bytes = Bytes::from(serde_json::to_vec(&stats).unwrap_or_default());
            if let Err(e) = self.store.write_file(self.store.system.stats, &name, bytes).await {
                tracing::debug!(namespace = %name, error = %e, "could not publish stats");
            }
        }
    }

    // ----- expiry -----

    async fn expire(&self, name: &str) -> Result<()> {
        let (victims, ns) = {
            let mut st = self.state.lock();
            let Some(s) = st.get_mut(name) else { return Ok(()) };
            let now = record::now_ns();
            s.index.expire_pins(now);
            (
                s.index.expired(now, 1024),
                Namespace { name: name.to_string(), dir: s.dir, config: s.config.clone(), owner_uid: 0, owner_gid: 0 },
            )
        };
        if victims.is_empty() {
            return Ok(());
        }
        let store = &self.store;
        let ns = &ns;
        let results: Vec<(Vec<u8>, Version, Result<bool>)> = futures::stream::iter(victims)
            .map(|(k, v)| async move {
                let path = KeyPath::of(&k);
                let r = store.unlink(ns, &path, Some(Expected::Inode { id: InodeId(v.inode), version: v.version })).await;
                (k.to_vec(), v, r)
            })
            .buffer_unordered(self.limits.batch_parallelism)
            .collect()
            .await;
        let mut stale = Vec::new();
        {
            let mut st = self.state.lock();
            let Some(s) = st.get_mut(name) else { return Ok(()) };
            for (k, v, r) in results {
                match r {
                    Ok(true) => {
                        if s.index.remove_if(&k, v) {
                            s.index.counters.expirations += 1;
                        }
                    }
                    Ok(false) => {
                        s.index.remove_if(&k, v);
                    }
                    Err(KvError::PreconditionFailed(_)) => stale.push(k),
                    Err(e) => tracing::debug!(error = %e, "expiry of a key failed; retried next sweep"),
                }
            }
            s.dirty_stats = true;
        }
        // Rewritten since the index learned of it (another writer, FUSE): look again.
        for k in stale {
            let path = KeyPath::of(&k);
            let found = match self.store.lookup(ns, &path).await? {
                Some(inode) => Some((self.store.record(&inode).await?, inode)),
                None => None,
            };
            let mut st = self.state.lock();
            let Some(s) = st.get_mut(name) else { return Ok(()) };
            match found {
                Some((rec, inode)) => s.index.upsert(&k, inode.size_bytes(), record::version_of(&inode), rec.expires_ns, 0),
                None => {
                    s.index.remove(&k);
                }
            }
        }
        self.room.notify_waiters();
        Ok(())
    }

    // ----- eviction -----

    fn start_evictions(self: &Arc<Self>) {
        let mut st = self.state.lock();
        for (name, s) in st.iter_mut() {
            if s.loaded && !s.evicting && s.index.over_high(&s.config) {
                s.evicting = true;
                let me = Arc::clone(self);
                let name = name.clone();
                tokio::spawn(async move {
                    if let Err(e) = me.evict_round(&name).await {
                        tracing::warn!(namespace = %name, error = %e, "eviction round failed");
                    }
                    if let Some(s) = me.state.lock().get_mut(&name) {
                        s.evicting = false;
                    }
                    me.room.notify_waiters();
                    me.evict_wake.notify_one();
                });
            }
        }
    }

    /// One eviction round (see the module docs).
    pub async fn evict_round(&self, name: &str) -> Result<usize> {
        self.merge(name).await?;
        let (mut victims, ns) = {
            let st = self.state.lock();
            let Some(s) = st.get(name) else { return Ok(0) };
            (
                s.index.plan_eviction(&s.config, record::now_ns(), self.cfg.eviction_batch),
                Namespace { name: name.into(), dir: s.dir, config: s.config.clone(), owner_uid: 0, owner_gid: 0 },
            )
        };
        if victims.is_empty() {
            return Ok(0);
        }
        // 2. Condemn (only the version planned).
        let paths: Vec<KeyPath> = victims.iter().map(|v| KeyPath::of(&v.key)).collect();
        let found = self.store.lookup_many(&ns, &paths).await;
        let mut ops = Vec::new();
        let mut which = Vec::new();
        for (i, r) in found.into_iter().enumerate() {
            if let Ok(Some((inode, _))) = r {
                if record::version_of(&inode) == victims[i].version {
                    ops.push(MetaOp::SetAttr {
                        inode: inode.id,
                        attr: SetAttr { mode: Some(inode.acl.mode | record::MODE_CONDEMNED), ..Default::default() },
                    });
                    which.push(i);
                }
            }
        }
        let mut condemned: Vec<Victim> = Vec::new();
        for (ops, idx) in ops.chunks(1024).zip(which.chunks(1024)) {
            let results =
                self.store.fs.meta().batch(ops.to_vec()).await.map_err(|e| KvError::from_code(e.code(), "evict", KvError::NoSuchKey))?;
            let mut st = self.state.lock();
            for (i, r) in idx.iter().zip(results) {
                if let Ok(MetaReply::Inode(inode)) = r {
                    let v = &mut victims[*i];
                    v.version = record::version_of(&inode);
                    if let Some(s) = st.get_mut(name) {
                        s.index.set_version(&v.key, v.version);
                    }
                    condemned.push(v.clone());
                }
            }
        }
        // 3. Let every read that started before the condemnation be reported.
        tokio::time::sleep(Duration::from_millis(self.cfg.eviction_confirm_ms)).await;
        // 4. Spare what was touched meanwhile.
        self.merge(name).await?;
        let (doomed, spared): (Vec<Victim>, Vec<Victim>) = {
            let st = self.state.lock();
            let Some(s) = st.get(name) else { return Ok(0) };
            let now = record::now_ns();
            condemned.into_iter().partition(|v| s.index.confirm(v, now))
        };
        // 5. Compare-and-delete.
        let store = &self.store;
        let ns_ref = &ns;
        let removed: Vec<(Victim, bool)> = futures::stream::iter(doomed)
            .map(|v| async move {
                let path = KeyPath::of(&v.key);
                let r =
                    store.unlink(ns_ref, &path, Some(Expected::Inode { id: InodeId(v.version.inode), version: v.version.version })).await;
                (v, matches!(r, Ok(true)))
            })
            .buffer_unordered(self.limits.batch_parallelism)
            .collect()
            .await;
        let mut n = 0;
        {
            let mut st = self.state.lock();
            if let Some(s) = st.get_mut(name) {
                for (v, ok) in &removed {
                    if *ok && s.index.remove_if(&v.key, v.version) {
                        s.index.counters.evictions += 1;
                        n += 1;
                    }
                }
                s.dirty_stats = true;
                s.dirty_checkpoint = true;
            }
        }
        for v in spared {
            if let Ok(Some(inode)) = self.store.lookup(&ns, &KeyPath::of(&v.key)).await {
                if record::is_condemned(&inode) {
                    if let Ok(new) = self.store.set_condemned(&inode, false).await {
                        if let Some(s) = self.state.lock().get_mut(name) {
                            s.index.set_version(&v.key, record::version_of(&new));
                        }
                    }
                }
            }
        }
        tracing::debug!(namespace = name, evicted = n, "eviction round done");
        Ok(n)
    }
}

fn apply_log(index: &mut NsIndex, log: &Log) {
    index.counters.hits += log.hits;
    index.counters.misses += log.misses;
    for e in &log.entries {
        if e.lease_until_ns > 0 {
            index.pin(&e.key, e.lease_until_ns);
        }
        index.touch(&e.key, e.last_ns, e.in_flight);
    }
}

fn stats_of(index: &NsIndex) -> NsStats {
    let c = index.counters;
    NsStats {
        keys: index.keys(),
        bytes: index.bytes,
        hits: c.hits,
        misses: c.misses,
        evictions: c.evictions,
        expirations: c.expirations,
        as_of_ms: record::now_ns() / 1_000_000,
    }
}

const CHECKPOINT_MAGIC: &[u8; 4] = b"FKCP";

/// `FKCP`, version 1, 3 reserved, counters (4 × u64), count (u32), then per
/// key: key_len (u16), last access ns (u64), key.
pub fn encode_checkpoint(index: &NsIndex) -> Bytes {
    let mut b = BytesMut::new();
    b.extend_from_slice(CHECKPOINT_MAGIC);
    b.put_u8(1);
    b.put_bytes(0, 3);
    let c = index.counters;
    for v in [c.hits, c.misses, c.evictions, c.expirations] {
        b.put_u64_le(v);
    }
    let entries: Vec<(&[u8], u64)> = index.accesses().collect();
    b.put_u32_le(entries.len() as u32);
    for (k, t) in entries {
        b.put_u16_le(k.len() as u16);
        b.put_u64_le(t);
        b.extend_from_slice(k);
    }
    b.freeze()
}

pub fn decode_checkpoint(mut b: &[u8]) -> Option<(HashMap<Vec<u8>, u64>, Counters)> {
    if b.len() < 44 || &b[..4] != CHECKPOINT_MAGIC || b[4] != 1 {
        return None;
    }
    b.advance(8);
    let c = Counters { hits: b.get_u64_le(), misses: b.get_u64_le(), evictions: b.get_u64_le(), expirations: b.get_u64_le() };
    let n = b.get_u32_le();
    let mut m = HashMap::with_capacity(n.min(1 << 20) as usize);
    for _ in 0..n {
        if b.len() < 10 {
            return None;
        }
        let len = b.get_u16_le() as usize;
        let t = b.get_u64_le();
        if b.len() < len {
            return None;
        }
        m.insert(b[..len].to_vec(), t);
        b.advance(len);
    }
    Some((m, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_round_trip() {
        let mut ix = NsIndex::default();
        ix.upsert(b"a", 1, Version { inode: 1, version: 1 }, None, 10);
        ix.upsert(&[0, 255], 1, Version { inode: 2, version: 1 }, None, 20);
        ix.counters.hits = 5;
        ix.counters.evictions = 2;
        let b = encode_checkpoint(&ix);
        let (m, c) = decode_checkpoint(&b).unwrap();
        assert_eq!(m.get(&b"a"[..]), Some(&10));
        assert_eq!(m.get(&[0u8, 255][..]), Some(&20));
        assert_eq!((c.hits, c.evictions), (5, 2));
        assert!(decode_checkpoint(&b[..b.len() - 1]).is_none());
    }

    #[test]
    fn logs_apply_recency_leases_and_counts() {
        let mut ix = NsIndex::default();
        ix.upsert(b"a", 1, Version::default(), None, 10);
        let log = Log {
            hits: 3,
            misses: 1,
            entries: vec![
                crate::recency::LogEntry { key: b"a".to_vec(), last_ns: 50, hits: 3, ..Default::default() },
                crate::recency::LogEntry { key: b"b".to_vec(), last_ns: 50, lease_until_ns: 99, ..Default::default() },
            ],
            ..Default::default()
        };
        apply_log(&mut ix, &log);
        assert_eq!(ix.get(b"a").unwrap().last_ns, 50);
        assert!(ix.pinned(b"b", 98));
        assert_eq!((ix.counters.hits, ix.counters.misses), (3, 1));
    }
}
