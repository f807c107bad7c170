//! The embedded default engine: RocksDB as the store, behind the shared
//! transaction layer (resolver + group commit) of [`crate::local`].
//!
//! * User keys live in the default column family exactly as given.
//! * The column family `fskv_sys` holds engine state: the last committed
//!   version, written in the same atomic batch as the data it versions.
//! * Each group-commit batch is one `WriteBatch` written with `sync = true`
//!   (WAL fsync) unless [`RocksOptions::sync_writes`] is off or every
//!   transaction of the batch is `Durability::Relaxed`, so an acknowledged
//!   commit survives `kill -9` and power loss. A relaxed batch is written to
//!   the WAL without fsync (it survives `kill -9`); `sync()` and a thread
//!   every `relaxed_sync_interval_ms` fsync the WAL (`flush_wal(true)`).
//! * Transactions read from a RocksDB snapshot taken at their first read.

use crate::local::{LocalEngine, Mutation, Store, StoreSnapshot};
use crate::{KeyValue, KvEngine, KvError, KvResult, Transaction};
use async_trait::async_trait;
use bytes::Bytes;
use rocksdb::{
    ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions, SnapshotWithThreadMode, WriteBatch, WriteOptions, DB,
};
use std::path::Path;
use std::sync::Arc;

const SYS_CF: &str = "fskv_sys";
const VERSION_KEY: &[u8] = b"committed_version";

/// Options of the embedded engine.
#[derive(Clone, Debug)]
pub struct RocksOptions {
    /// fsync the WAL on every commit batch (durable across power loss). When
    /// off, commits survive a process crash but not an OS crash.
    pub sync_writes: bool,
    /// RocksDB block cache size.
    pub block_cache_bytes: usize,
    /// Relaxed commits (see [`crate::Durability`]) are fsync'ed at least
    /// this often; 0 = only by `sync` and later synced commits.
    pub relaxed_sync_interval_ms: u64,
    /// Memtable size before a flush to an SST file (RocksDB's
    /// `write_buffer_size`; tests make it small to exercise flushes and
    /// compactions).
    pub write_buffer_bytes: usize,
}

impl Default for RocksOptions {
    fn default() -> Self {
        RocksOptions { sync_writes: true, block_cache_bytes: 256 << 20, relaxed_sync_interval_ms: 100, write_buffer_bytes: 64 << 20 }
    }
}

fn storage_err(e: rocksdb::Error) -> KvError {
    KvError::Storage(e.into_string())
}

pub(crate) struct RocksStore {
    db: Arc<DB>,
    sync_writes: bool,
}

/// A RocksDB snapshot that keeps its database alive.
pub(crate) struct RocksSnapshot {
    // Field order matters: `snap` is dropped (released) before `_db`.
    snap: SnapshotWithThreadMode<'static, DB>,
    _db: Arc<DB>,
}

impl RocksSnapshot {
    fn new(db: &Arc<DB>) -> Self {
        let snap = db.snapshot();
        // SAFETY: the snapshot borrows the `DB` inside the `Arc`, whose heap
        // address never moves; we keep a clone of the `Arc` in the same struct
        // and drop the snapshot first (field order), so the borrow never outlives
        // the database.
        let snap: SnapshotWithThreadMode<'static, DB> = unsafe { std::mem::transmute(snap) };
        RocksSnapshot { snap, _db: db.clone() }
    }
}

impl StoreSnapshot for RocksSnapshot {
    fn get(&self, key: &[u8]) -> KvResult<Option<Bytes>> {
        Ok(self.snap.get(key).map_err(storage_err)?.map(Bytes::from))
    }

    fn range(&self, begin: &[u8], end: &[u8], limit: usize, reverse: bool) -> KvResult<(Vec<KeyValue>, bool)> {
        if begin >= end {
            return Ok((Vec::new(), false));
        }
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(begin.to_vec());
        opts.set_iterate_upper_bound(end.to_vec());
        let mode = if reverse { IteratorMode::From(end, Direction::Reverse) } else { IteratorMode::From(begin, Direction::Forward) };
        let mut rows = Vec::new();
        for item in self.snap.iterator_opt(mode, opts) {
            let (k, v) = item.map_err(storage_err)?;
            if &k[..] >= end || &k[..] < begin {
                // An exact reverse seek lands on `end` itself when present.
                continue;
            }
            if rows.len() == limit {
                return Ok((rows, true));
            }
            rows.push((Bytes::from(k.into_vec()), Bytes::from(v.into_vec())));
        }
        Ok((rows, false))
    }
}

impl Store for RocksStore {
    type Snapshot = RocksSnapshot;

    fn snapshot(&self) -> RocksSnapshot {
        RocksSnapshot::new(&self.db)
    }

    fn get_latest(&self, key: &[u8]) -> KvResult<Option<Bytes>> {
        Ok(self.db.get(key).map_err(storage_err)?.map(Bytes::from))
    }

    fn sync(&self) -> KvResult<()> {
        self.db.flush_wal(true).map_err(storage_err)
    }

    fn apply(&self, mutations: &[Mutation], commit_version: u64, sync: bool) -> KvResult<()> {
        let sys = self.db.cf_handle(SYS_CF).ok_or_else(|| KvError::Storage("column family fskv_sys missing".into()))?;
        let mut batch = WriteBatch::default();
        for m in mutations {
            match m {
                Mutation::Set(k, v) => batch.put(k, v),
                Mutation::Clear(k) => batch.delete(k),
                Mutation::ClearRange(b, e) => {
                    let default = self.db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME);
                    match default {
                        Some(cf) => batch.delete_range_cf(&cf, b, e),
                        None => return Err(KvError::Storage("default column family missing".into())),
                    }
                }
            }
        }
        batch.put_cf(&sys, VERSION_KEY, commit_version.to_le_bytes());
        let mut wo = WriteOptions::default();
        wo.set_sync(self.sync_writes && sync);
        self.db.write_opt(batch, &wo).map_err(storage_err)
    }
}

/// The embedded RocksDB engine. Cloning shares one database.
#[derive(Clone)]
pub struct RocksEngine {
    engine: LocalEngine<RocksStore>,
}

/// The share of a memtable's size given to its whole-key bloom filter.
const MEMTABLE_BLOOM_RATIO: f64 = 0.02;

impl RocksEngine {
    /// Opens (or creates) the database in directory `path`.
    pub fn open(path: impl AsRef<Path>, opts: RocksOptions) -> KvResult<Self> {
        let path = path.as_ref();
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_bytes_per_sync(1 << 20);
        db_opts.set_write_buffer_size(opts.write_buffer_bytes);
        // A bloom filter over each memtable's whole keys: a point read of a
        // key that is not in the memtable (a directory or inode written
        // long ago) skips the skip-list search.
        db_opts.set_memtable_whole_key_filtering(true);
        db_opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
        let mut table = rocksdb::BlockBasedOptions::default();
        let cache = rocksdb::Cache::new_lru_cache(opts.block_cache_bytes).map_err(storage_err)?;
        table.set_block_cache(&cache);
        table.set_bloom_filter(10.0, false);
        db_opts.set_block_based_table_factory(&table);
        let cfs = vec![
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, db_opts.clone()),
            ColumnFamilyDescriptor::new(SYS_CF, Options::default()),
        ];
        let db = DB::open_cf_descriptors(&db_opts, path, cfs)
            .map_err(|e| KvError::Storage(format!("open {}: {}", path.display(), e.into_string())))?;
        let version = read_version(&db)?;
        let store = RocksStore { db: Arc::new(db), sync_writes: opts.sync_writes };
        let interval = Some(opts.relaxed_sync_interval_ms).filter(|&ms| ms > 0);
        let engine = LocalEngine::start(store, version, "rocksdb", interval)?;
        tracing::info!(path = %path.display(), committed_version = version, "opened embedded KV engine");
        Ok(RocksEngine { engine })
    }

    /// The last committed version.
    pub fn committed_version(&self) -> u64 {
        self.engine.committed_version()
    }

    /// The underlying database (for tools and benchmarks; never write to it).
    pub fn raw_db(&self) -> &Arc<DB> {
        &self.engine.store().db
    }
}

fn read_version(db: &DB) -> KvResult<u64> {
    let sys = db.cf_handle(SYS_CF).ok_or_else(|| KvError::Storage("column family fskv_sys missing".into()))?;
    match db.get_cf(&sys, VERSION_KEY).map_err(storage_err)? {
        None => Ok(0),
        Some(v) => {
            let bytes: [u8; 8] =
                v.as_slice().try_into().map_err(|_| KvError::Storage(format!("corrupt committed version record of {} bytes", v.len())))?;
            Ok(u64::from_le_bytes(bytes))
        }
    }
}

#[async_trait]
impl KvEngine for RocksEngine {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    async fn begin(&self) -> KvResult<Box<dyn Transaction>> {
        Ok(Box::new(self.engine.begin_local()))
    }

    async fn sync(&self) -> KvResult<()> {
        self.engine.sync().await
    }
}
