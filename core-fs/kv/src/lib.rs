//! Transactional ordered key-value engine with FoundationDB semantics.
//!
//! All metadata of 3FS-KV (meta and mgmtd) lives behind [`KvEngine`]. Three
//! engines implement it:
//!
//! * [`MemoryEngine`] — in memory, for unit tests;
//! * [`RocksEngine`] — the embedded default: RocksDB as the store plus a commit
//!   resolver (the FoundationDB resolver idea) giving serializable snapshot
//!   isolation with read-range conflicts, group commit and synced write batches;
//! * [`EtcdEngine`] — an etcd v3 cluster (Raft) through its JSON gateway: a
//!   distributed engine that can run on these machines (`etcd.rs` module doc
//!   and docs/kv-engine.md give the commit protocol);
//! * `FdbEngine` — FoundationDB through the `foundationdb` crate, behind the
//!   cargo feature `fdb`.
//!
//! Semantics every engine provides (checked by [`conformance`]):
//! * reads see a consistent snapshot at the transaction's read version;
//! * read-your-writes inside a transaction (including range reads and clears);
//! * `get`/`get_range` add read conflicts (a range read conflicts with a
//!   concurrent insert into the range); `snapshot_*` reads add none;
//! * commit fails with [`KvError::NotCommitted`] if anything read was written by
//!   a transaction that committed after the read version;
//! * limits mirror FoundationDB: key ≤ [`limits::MAX_KEY_BYTES`], value ≤
//!   [`limits::MAX_VALUE_BYTES`], transaction ≤ [`limits::MAX_TRANSACTION_BYTES`].
//!
//! Use [`run_transaction`] for the retry loop.

/// `fskv bench kv` (feature `bench`).
#[cfg(feature = "bench")]
pub mod bench;
/// The conformance suite every engine runs (feature `testkit`).
#[cfg(feature = "testkit")]
pub mod conformance;
mod error;
/// The etcd engine (`etcd:` specs); `etcd::testkit` starts a local etcd cluster (feature `testkit`).
pub mod etcd;
#[cfg(feature = "fdb")]
mod fdb;
pub mod limits;
mod local;
mod memory;
mod resolver;
mod rocks;

pub use error::{KvError, KvResult};
pub use etcd::{EtcdEngine, EtcdOptions};
#[cfg(feature = "fdb")]
pub use fdb::FdbEngine;
pub use memory::MemoryEngine;
pub use rocks::{RocksEngine, RocksOptions};

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// One key-value pair.
pub type KeyValue = (Bytes, Bytes);

/// A range read: keys in `[begin, end)`, at most `limit` (0 = no limit) of them,
/// in ascending order or descending when `reverse`.
#[derive(Clone, Debug, Default)]
pub struct RangeRequest {
    pub begin: Bytes,
    pub end: Bytes,
    pub limit: usize,
    pub reverse: bool,
}

impl RangeRequest {
    pub fn new(begin: impl Into<Bytes>, end: impl Into<Bytes>) -> Self {
        RangeRequest { begin: begin.into(), end: end.into(), limit: 0, reverse: false }
    }

    /// All keys starting with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Self {
        RangeRequest::new(Bytes::copy_from_slice(prefix), prefix_end(prefix))
    }

    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    pub fn reverse(mut self, reverse: bool) -> Self {
        self.reverse = reverse;
        self
    }
}

/// The first key after every key that starts with `prefix` (FoundationDB's
/// `strinc`). A prefix of only `0xff` bytes has no such key; the end of the
/// keyspace (`[0xff; 1]` followed by more `0xff`) is returned instead.
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return Bytes::from(end);
        }
        end.pop();
    }
    Bytes::from(vec![0xff; prefix.len() + 1])
}

/// The result of a range read. `more` is true when the limit stopped the read
/// before the end of the range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResult {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
}

/// How durable a commit is when `commit` returns.
///
/// | durability | on return from `commit` | after a process crash (kill -9) | after power loss / OS crash |
/// | --- | --- | --- | --- |
/// | `Synced` (default) | written and fsync'ed | kept | kept |
/// | `Relaxed` | written to the engine's log, not fsync'ed | kept | kept once the next [`KvEngine::sync`], a later `Synced` commit or the engine's periodic sync (at most its `relaxed_sync_interval_ms`) ran; else lost whole (never in part) |
///
/// Engines that cannot relax (etcd, FoundationDB) treat `Relaxed` as `Synced`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    #[default]
    Synced,
    Relaxed,
}

/// A transactional engine.
#[async_trait]
pub trait KvEngine: Send + Sync + 'static {
    /// A short name for logs and reports ("memory", "rocksdb", "fdb").
    fn name(&self) -> &'static str;

    /// Starts a transaction. Its read version is fixed at the first read.
    async fn begin(&self) -> KvResult<Box<dyn Transaction>>;

    /// A barrier: once it returns, every commit acknowledged before it was
    /// called is durable across power loss (see [`Durability`]).
    async fn sync(&self) -> KvResult<()> {
        Ok(())
    }
}

/// One transaction. Dropping it without `commit` discards its writes.
#[async_trait]
pub trait Transaction: Send {
    /// Reads `key`, adding it to the read-conflict set.
    async fn get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>>;

    /// Reads `key` without adding a read conflict.
    async fn snapshot_get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>>;

    /// Reads a range, adding the part of the range it read to the read-conflict set.
    async fn get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult>;

    /// Reads a range without adding a read conflict.
    async fn snapshot_get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult>;

    fn set(&mut self, key: &[u8], value: &[u8]) -> KvResult<()>;

    fn clear(&mut self, key: &[u8]) -> KvResult<()>;

    /// Clears every key in `[begin, end)`.
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()>;

    /// Adds `delta` to the 8-byte little-endian integer stored at `key` (absent
    /// = 0; a shorter value is zero-extended, a longer one truncated), without a
    /// read conflict — FoundationDB's `ADD` mutation with an 8-byte operand.
    fn atomic_add(&mut self, key: &[u8], delta: i64) -> KvResult<()>;

    /// Stores the larger of `value` and the 8-byte little-endian unsigned
    /// integer at `key` (absent = 0; shorter zero-extended, longer truncated),
    /// without a read conflict — FoundationDB's `MAX` mutation with an 8-byte
    /// operand. Mixing `atomic_add` and `atomic_max` on one key within one
    /// transaction is refused (`InvalidArgument`).
    fn atomic_max(&mut self, key: &[u8], value: u64) -> KvResult<()>;

    /// Adds `[begin, end)` to the read-conflict set without reading it.
    fn add_read_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()>;

    /// Adds `[begin, end)` to the write-conflict set without writing it.
    fn add_write_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()>;

    /// Sets how durable the commit is when it returns (default `Synced`).
    fn set_durability(&mut self, _durability: Durability) {}

    /// Commits; returns the commit version (for a read-only transaction, its
    /// read version). On success every write is durable as the transaction's
    /// [`Durability`] says.
    async fn commit(self: Box<Self>) -> KvResult<u64>;
}

/// The smallest key after `key` (`key` + `0x00`): `[key, key_after(key))` is
/// exactly `key`.
pub fn key_after(key: &[u8]) -> Bytes {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    Bytes::from(k)
}

/// Options of [`run_transaction`].
#[derive(Clone, Debug)]
pub struct RetryOptions {
    /// Attempts before giving up with the last error.
    pub max_attempts: u32,
    /// First backoff; doubles up to `max_backoff_ms`.
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// Whether a `CommitUnknownResult` may be retried (only if the body is idempotent).
    pub retry_unknown_result: bool,
}

impl Default for RetryOptions {
    fn default() -> Self {
        RetryOptions { max_attempts: 50, initial_backoff_ms: 1, max_backoff_ms: 200, retry_unknown_result: false }
    }
}

/// Runs `body` in a fresh transaction and commits, retrying on retryable
/// errors with exponential backoff and jitter. `body` must be safe to run more
/// than once; only its last (committed) run has effects.
///
/// ```ignore
/// let n = run_transaction(&*engine, &RetryOptions::default(), |txn| Box::pin(async move {
///     let v = txn.get(b"counter").await?;
///     txn.set(b"counter", b"1")?;
///     Ok(v.is_some())
/// })).await?;
/// ```
pub async fn run_transaction<T, F>(engine: &dyn KvEngine, opts: &RetryOptions, mut body: F) -> KvResult<T>
where
    T: Send,
    F: for<'t> FnMut(&'t mut dyn Transaction) -> BoxFuture<'t, KvResult<T>> + Send,
{
    let mut backoff_ms = opts.initial_backoff_ms.max(1);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let result: KvResult<T> = async {
            let mut txn = engine.begin().await?;
            let value = body(&mut *txn).await?;
            txn.commit().await?;
            Ok(value)
        }
        .await;
        match result {
            Ok(v) => return Ok(v),
            Err(e) => {
                let retry = e.is_retryable() && (!e.maybe_committed() || opts.retry_unknown_result);
                if !retry || attempt >= opts.max_attempts {
                    return Err(e);
                }
                let jitter = rand_jitter(backoff_ms);
                tokio::time::sleep(Duration::from_millis(jitter)).await;
                backoff_ms = (backoff_ms * 2).min(opts.max_backoff_ms.max(1));
            }
        }
    }
}

thread_local! {
    /// [`rand_jitter`]'s xorshift state; 0 until first used (then seeded
    /// from the clock) or set by [`seed_retry_jitter`].
    static JITTER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Makes the retry delays of [`run_transaction`] on this thread a function
/// of `seed` (deterministic simulation runs every host on one thread).
pub fn seed_retry_jitter(seed: u64) {
    JITTER.with(|j| j.set(seed | 1));
}

/// A jittered delay in `[backoff/2, backoff]` from a per-thread xorshift
/// (seeded from the sub-millisecond clock unless [`seed_retry_jitter`]
/// chose the seed): enough to de-synchronize retries.
fn rand_jitter(backoff_ms: u64) -> u64 {
    let r = JITTER.with(|j| {
        let mut x = j.get();
        if x == 0 {
            x = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos() as u64).unwrap_or(0) | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        j.set(x);
        x
    });
    let half = backoff_ms / 2;
    half + r % (backoff_ms - half + 1)
}

/// Suffix of a `rocksdb:PATH` spec whose commits do not sync the WAL
/// ([`RocksOptions::sync_writes`] off: `[kv] sync_writes = false`).
pub const ROCKSDB_NO_SYNC_SUFFIX: &str = "?sync=false";

/// Opens the engine named in a config: `memory`, `rocksdb:PATH` (with
/// [`ROCKSDB_NO_SYNC_SUFFIX`]: commits not synced),
/// `etcd:http://HOST:PORT[,...][?OPTIONS]` (see [`EtcdOptions::parse`]) or
/// `fdb:CLUSTER_FILE`.
pub fn open_engine(spec: &str) -> KvResult<Arc<dyn KvEngine>> {
    if spec == "memory" {
        return Ok(Arc::new(MemoryEngine::new()));
    }
    if let Some(rest) = spec.strip_prefix("rocksdb:") {
        let (path, sync_writes) = match rest.strip_suffix(ROCKSDB_NO_SYNC_SUFFIX) {
            Some(path) => (path, false),
            None => (rest, true),
        };
        if !sync_writes {
            tracing::warn!(path, "KV engine opened without WAL sync: commits survive a process crash, not a power loss");
        }
        return Ok(Arc::new(RocksEngine::open(path, RocksOptions { sync_writes, ..RocksOptions::default() })?));
    }
    if let Some(etcd) = spec.strip_prefix("etcd:") {
        return Ok(Arc::new(EtcdEngine::open(EtcdOptions::parse(etcd)?)?));
    }
    if let Some(cluster) = spec.strip_prefix("fdb:") {
        #[cfg(feature = "fdb")]
        {
            return Ok(Arc::new(FdbEngine::open(Some(cluster))?));
        }
        #[cfg(not(feature = "fdb"))]
        {
            return Err(KvError::InvalidArgument(format!("engine 'fdb:{cluster}' needs a build with the cargo feature `fdb`")));
        }
    }
    Err(KvError::InvalidArgument(format!(
        "unknown KV engine '{spec}': expected memory, rocksdb:PATH[?sync=false], etcd:http://HOST:PORT[,...] or fdb:CLUSTER_FILE"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rocksdb_spec_may_turn_wal_sync_off() {
        let dir = tempfile::tempdir().unwrap();
        for (name, suffix) in [("synced", ""), ("unsynced", ROCKSDB_NO_SYNC_SUFFIX)] {
            let path = dir.path().join(name);
            let engine = open_engine(&format!("rocksdb:{}{suffix}", path.display())).unwrap();
            drop(engine);
            assert!(path.join("CURRENT").exists(), "{name}: the engine lives at the path without the suffix");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
