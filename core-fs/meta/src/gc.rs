//! Background reclamation (docs/meta.md, "GC").
//!
//! `GCQU` + inode id entries name what to reclaim:
//! * `File`: an unlinked file. Skipped while a write session younger than
//!   `session_ttl_ms` is open; else its chunks are removed through the
//!   [`StorageBackend`], then (in a transaction that re-checks nlink == 0)
//!   the inode, its xattrs, sessions and the GC entry.
//! * `Tree`: a detached directory. Each pass takes up to
//!   [`TREE_ENTRIES_PER_TXN`] entries in one transaction: child directories
//!   get nlink 0 and their own `Tree` entry, other children lose a link
//!   (→ `File` entry or deleted). An empty tree directory is deleted.
//! * `Temp`: an unpublished `CreateUnlinked` inode, leased by its writer
//!   (`RenewTemp` restarts the TTL). After `temp_inode_ttl_ms` without a
//!   renewal GC *claims* it — one transaction that re-checks the lease and
//!   turns the entry into a `File` entry — and only then removes chunks, so
//!   a publish racing GC either wins (GC drops the entry) or fails with
//!   `NotFound`; it never returns success for data GC removes.
//!
//! Idempotency records older than `idempotency_ttl_ms` are cleared too.

use crate::error::{MetaError, MetaResult};
use crate::ops::{delete_inode, drop_link, load_inode_opt, queue_gc, save_inode, MetaConfig};
use crate::schema::*;
use crate::storage::StorageBackend;
use fskv_kv::{KvEngine, RangeRequest, Transaction};
use fskv_proto::meta::{Inode, InodeData};
use fskv_types::InodeId;
use std::sync::Arc;

pub const TREE_ENTRIES_PER_TXN: usize = 256;
pub const GC_ENTRIES_PER_PASS: usize = 128;
pub const IDEMPOTENCY_EXPIRE_PER_TXN: usize = 2048;
pub const IDEMPOTENCY_EXPIRE_TXNS_PER_PASS: usize = 64;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcStats {
    pub files_removed: u64,
    pub dirs_removed: u64,
    pub chunks_removed: u64,
    pub idempotency_expired: u64,
    /// Entries left for a later pass (open sessions, temp not yet expired).
    pub deferred: u64,
}

/// The system clock (ns since the epoch); meta reads the clock through
/// [`MetaConfig::now_ns`].
pub fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// One GC pass over (part of) the queue.
pub async fn run_once(engine: &Arc<dyn KvEngine>, storage: &dyn StorageBackend, cfg: &MetaConfig) -> MetaResult<GcStats> {
    let mut stats = GcStats::default();
    let entries = {
        let mut txn = engine.begin().await?;
        txn.snapshot_get_range(&RangeRequest::prefix(PREFIX_GC).limit(GC_ENTRIES_PER_PASS)).await?.kvs
    };
    let now = cfg.now_ns();
    for (k, v) in entries {
        let id = id_from_key(&k)?;
        let entry: GcValue = decode(&k, &v)?;
        match entry.kind {
            GcKind::Tree => drain_tree(engine, cfg, id, &mut stats).await?,
            GcKind::Temp if now.saturating_sub(entry.queued_ns) < cfg.temp_inode_ttl_ms.saturating_mul(1_000_000) => stats.deferred += 1,
            GcKind::Temp => {
                if claim_temp(engine, cfg, id, now).await? {
                    reclaim_file(engine, storage, cfg, id, &mut stats).await?
                } else {
                    stats.deferred += 1;
                }
            }
            GcKind::File => reclaim_file(engine, storage, cfg, id, &mut stats).await?,
        }
    }
    stats.idempotency_expired = expire_idempotency(engine, cfg, now).await?;
    Ok(stats)
}

/// Runs passes until the queue holds only deferred entries (tests, shutdown).
pub async fn run_until_idle(engine: &Arc<dyn KvEngine>, storage: &dyn StorageBackend, cfg: &MetaConfig) -> MetaResult<GcStats> {
    let mut total = GcStats::default();
    for _ in 0..10_000 {
        let s = run_once(engine, storage, cfg).await?;
        let progressed = s.files_removed + s.dirs_removed > 0;
        total.files_removed += s.files_removed;
        total.dirs_removed += s.dirs_removed;
        total.chunks_removed += s.chunks_removed;
        total.idempotency_expired += s.idempotency_expired;
        total.deferred = s.deferred;
        if !progressed && !has_work(engine, s.deferred).await? {
            break;
        }
    }
    Ok(total)
}

async fn has_work(engine: &Arc<dyn KvEngine>, deferred: u64) -> MetaResult<bool> {
    let mut txn = engine.begin().await?;
    let r = txn.snapshot_get_range(&RangeRequest::prefix(PREFIX_GC).limit(GC_ENTRIES_PER_PASS)).await?;
    Ok(r.kvs.len() as u64 > deferred)
}

async fn with_txn<T, F>(engine: &Arc<dyn KvEngine>, mut body: F) -> MetaResult<T>
where
    F: for<'t> FnMut(&'t mut dyn Transaction) -> futures::future::BoxFuture<'t, MetaResult<T>>,
{
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let mut txn = engine.begin().await?;
        let result = match body(&mut *txn).await {
            Ok(v) => txn.commit().await.map(|_| v).map_err(MetaError::from),
            Err(e) => Err(e),
        };
        match result {
            Err(e) if e.is_retryable_kv() && !e.is_maybe_committed() && attempt < 50 => {
                tokio::time::sleep(std::time::Duration::from_millis(u64::from(attempt.min(20)))).await;
            }
            other => return other,
        }
    }
}

/// Claims an expired temp inode for reclamation (see the module doc):
/// `true` when it is now a `File` entry, `false` when it was renewed since
/// the pass read it (deferred) or published (entry dropped).
async fn claim_temp(engine: &Arc<dyn KvEngine>, cfg: &MetaConfig, id: InodeId, now: u64) -> MetaResult<bool> {
    let ttl_ns = cfg.temp_inode_ttl_ms.saturating_mul(1_000_000);
    with_txn(engine, |txn| {
        Box::pin(async move {
            let Some(raw) = txn.get(&gc_key(id)).await? else { return Ok(false) };
            let entry: GcValue = decode(&gc_key(id), &raw)?;
            match entry.kind {
                GcKind::Temp if now.saturating_sub(entry.queued_ns) < ttl_ns => return Ok(false),
                GcKind::Temp => {}
                GcKind::File => return Ok(true),
                GcKind::Tree => return Ok(false),
            }
            match load_inode_opt(txn, id).await? {
                Some(i) if i.nlink == 0 => {
                    queue_gc(txn, id, GcKind::File, entry.queued_ns)?;
                    Ok(true)
                }
                _ => {
                    txn.clear(&gc_key(id))?;
                    Ok(false)
                }
            }
        })
    })
    .await
}

async fn reclaim_file(
    engine: &Arc<dyn KvEngine>,
    storage: &dyn StorageBackend,
    cfg: &MetaConfig,
    id: InodeId,
    stats: &mut GcStats,
) -> MetaResult<()> {
    let (inode, live_sessions) = {
        let mut txn = engine.begin().await?;
        let inode: Option<Inode> = match txn.snapshot_get(&inode_key(id)).await? {
            Some(raw) => Some(decode(&inode_key(id), &raw)?),
            None => None,
        };
        let sessions = txn.snapshot_get_range(&RangeRequest::prefix(&session_prefix(id))).await?;
        let cutoff = cfg.now_ns().saturating_sub(cfg.session_ttl_ms * 1_000_000);
        let mut live = 0;
        for (k, v) in &sessions.kvs {
            let s: SessionValue = decode(k, v)?;
            if s.opened_ns >= cutoff {
                live += 1;
            }
        }
        (inode, live)
    };
    if let Some(inode) = &inode {
        if inode.nlink > 0 {
            // Re-linked (published) since it was queued: just drop the entry.
            return with_txn(engine, |txn| Box::pin(async move { Ok(txn.clear(&gc_key(id))?) })).await;
        }
        if live_sessions > 0 {
            stats.deferred += 1;
            return Ok(());
        }
        if let InodeData::File(f) = &inode.data {
            if f.inline.is_none() {
                stats.chunks_removed += storage.remove_chunks(id, &f.layout).await?;
            }
        }
    }
    let removed = with_txn(engine, |txn| {
        Box::pin(async move {
            match load_inode_opt(txn, id).await? {
                Some(i) if i.nlink > 0 => {
                    txn.clear(&gc_key(id))?;
                    Ok(false)
                }
                Some(_) => {
                    delete_inode(txn, id).await?;
                    Ok(true)
                }
                None => {
                    txn.clear(&gc_key(id))?;
                    Ok(false)
                }
            }
        })
    })
    .await?;
    if removed {
        stats.files_removed += 1;
        tracing::debug!(inode = %id, "gc removed file");
    }
    Ok(())
}

async fn drain_tree(engine: &Arc<dyn KvEngine>, cfg: &MetaConfig, dir: InodeId, stats: &mut GcStats) -> MetaResult<()> {
    loop {
        let now = cfg.now_ns();
        let (done, files_deleted) = with_txn(engine, |txn| {
            Box::pin(async move {
                let prefix = dentry_prefix(dir);
                let children = txn.get_range(&RangeRequest::prefix(&prefix).limit(TREE_ENTRIES_PER_TXN)).await?;
                if children.kvs.is_empty() {
                    delete_inode(txn, dir).await?;
                    return Ok((true, 0u64));
                }
                let mut files = 0;
                for (k, v) in &children.kvs {
                    let entry: DentryValue = decode(k, v)?;
                    txn.clear(k)?;
                    if entry.kind == fskv_proto::meta::InodeKind::Directory {
                        if let Some(mut child) = load_inode_opt(txn, entry.inode).await? {
                            child.nlink = 0;
                            save_inode(txn, &child)?;
                            queue_gc(txn, entry.inode, GcKind::Tree, now)?;
                        }
                    } else {
                        drop_link(txn, entry.inode, now).await?;
                        files += 1;
                    }
                }
                Ok((false, files))
            })
        })
        .await?;
        let _ = files_deleted;
        if done {
            stats.dirs_removed += 1;
            tracing::debug!(inode = %dir, "gc removed directory");
            return Ok(());
        }
    }
}

/// Clears idempotency records created before the TTL, oldest first, through
/// the `IDEX` time index (bounded work per pass).
async fn expire_idempotency(engine: &Arc<dyn KvEngine>, cfg: &MetaConfig, now: u64) -> MetaResult<u64> {
    let cutoff = now.saturating_sub(cfg.idempotency_ttl_ms * 1_000_000);
    let mut end = PREFIX_IDEMPOTENCY_EXPIRY.to_vec();
    end.extend_from_slice(&cutoff.to_be_bytes());
    let mut total = 0;
    for _ in 0..IDEMPOTENCY_EXPIRE_TXNS_PER_PASS {
        let mut txn = engine.begin().await?;
        let range = RangeRequest::new(PREFIX_IDEMPOTENCY_EXPIRY.to_vec(), end.clone()).limit(IDEMPOTENCY_EXPIRE_PER_TXN);
        let r = txn.snapshot_get_range(&range).await?;
        for (k, _) in &r.kvs {
            txn.clear(k)?;
            txn.clear(&idempotency_key_of_expiry(k)?)?;
        }
        let n = r.kvs.len() as u64;
        if n > 0 {
            txn.commit().await?;
        }
        total += n;
        if !r.more {
            break;
        }
    }
    Ok(total)
}
