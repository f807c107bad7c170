//! FoundationDB engine (cargo feature `fdb`): a thin mapping of [`KvEngine`]
//! onto the `foundationdb` crate. FoundationDB itself provides the semantics;
//! this file maps errors and applies the same client-side limit checks as the
//! embedded engines so that both fail the same way.
//!
//! Needs libfdb_c at link time. Tests run when `FDB_CLUSTER_FILE` is set.

use crate::limits::{check_key, check_range, check_value, grow_transaction, MAX_TRANSACTION_BYTES};
use crate::{KeyValue, KvEngine, KvError, KvResult, RangeRequest, RangeResult, Transaction};
use async_trait::async_trait;
use bytes::Bytes;
use foundationdb::options::{MutationType, StreamingMode};
use foundationdb::{Database, FdbError, KeySelector, RangeOption};
use std::sync::{Arc, OnceLock};

static NETWORK: OnceLock<Result<(), String>> = OnceLock::new();

/// Starts the FoundationDB network thread once per process. It runs until the
/// process exits (the stop guard is deliberately leaked).
fn boot_network() -> KvResult<()> {
    let result = NETWORK.get_or_init(|| {
        // SAFETY: called at most once per process (OnceLock), before any other
        // FoundationDB call; the guard is leaked so the network is never stopped
        // while a Database is in use.
        let booted = unsafe { foundationdb::api::FdbApiBuilder::default().build().and_then(|builder| builder.boot()) };
        match booted {
            Ok(guard) => {
                std::mem::forget(guard);
                Ok(())
            }
            Err(e) => Err(format!("cannot start the FoundationDB client network: {e}")),
        }
    });
    result.clone().map_err(KvError::Storage)
}

fn map_err(e: FdbError) -> KvError {
    match e.code() {
        1020 => KvError::NotCommitted,
        1021 => KvError::CommitUnknownResult,
        1007 => KvError::TransactionTooOld,
        2101 => KvError::TransactionTooLarge { size: 0, limit: MAX_TRANSACTION_BYTES },
        2102 => KvError::KeyTooLarge { len: 0, limit: crate::limits::MAX_KEY_BYTES },
        2103 => KvError::ValueTooLarge { len: 0, limit: crate::limits::MAX_VALUE_BYTES },
        code if e.is_maybe_committed() => {
            let _ = code;
            KvError::CommitUnknownResult
        }
        code if e.is_retryable() => KvError::Retryable { code, message: e.message().to_string() },
        code => KvError::Storage(format!("FoundationDB error {code}: {}", e.message())),
    }
}

/// A FoundationDB cluster.
#[derive(Clone)]
pub struct FdbEngine {
    db: Arc<Database>,
}

impl FdbEngine {
    /// Opens the cluster named by `cluster_file` (or the default cluster file).
    pub fn open(cluster_file: Option<&str>) -> KvResult<Self> {
        boot_network()?;
        let db = Database::new(cluster_file).map_err(map_err)?;
        Ok(FdbEngine { db: Arc::new(db) })
    }
}

#[async_trait]
impl KvEngine for FdbEngine {
    fn name(&self) -> &'static str {
        "fdb"
    }

    async fn begin(&self) -> KvResult<Box<dyn Transaction>> {
        let trx = self.db.create_trx().map_err(map_err)?;
        Ok(Box::new(FdbTransaction { trx, size_bytes: 0 }))
    }
}

struct FdbTransaction {
    trx: foundationdb::Transaction,
    size_bytes: usize,
}

impl FdbTransaction {
    fn grow(&mut self, bytes: usize) -> KvResult<()> {
        grow_transaction(&mut self.size_bytes, bytes)
    }

    async fn read_range(&mut self, req: &RangeRequest, snapshot: bool) -> KvResult<RangeResult> {
        check_range(&req.begin, &req.end)?;
        let mut remaining = if req.limit == 0 { usize::MAX } else { req.limit };
        let mut begin = KeySelector::first_greater_or_equal(req.begin.to_vec());
        let mut end = KeySelector::first_greater_or_equal(req.end.to_vec());
        let mut kvs: Vec<KeyValue> = Vec::new();
        loop {
            let mut opt = RangeOption::from((begin.clone(), end.clone()));
            opt.limit = (remaining != usize::MAX).then_some(remaining);
            opt.reverse = req.reverse;
            opt.mode = StreamingMode::WantAll;
            let values = self.trx.get_range(&opt, 1, snapshot).await.map_err(map_err)?;
            let more = values.more();
            for kv in values.iter() {
                kvs.push((Bytes::copy_from_slice(kv.key()), Bytes::copy_from_slice(kv.value())));
            }
            remaining = remaining.saturating_sub(values.len());
            let Some((last, _)) = kvs.last() else {
                return Ok(RangeResult { kvs, more: false });
            };
            if !more {
                return Ok(RangeResult { kvs, more: false });
            }
            if remaining == 0 {
                return Ok(RangeResult { kvs, more: true });
            }
            if req.reverse {
                end = KeySelector::first_greater_or_equal(last.to_vec());
            } else {
                begin = KeySelector::first_greater_than(last.to_vec());
            }
        }
    }
}

#[async_trait]
impl Transaction for FdbTransaction {
    async fn get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        check_key(key)?;
        let v = self.trx.get(key, false).await.map_err(map_err)?;
        Ok(v.map(|s| Bytes::copy_from_slice(&s)))
    }

    async fn snapshot_get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        check_key(key)?;
        let v = self.trx.get(key, true).await.map_err(map_err)?;
        Ok(v.map(|s| Bytes::copy_from_slice(&s)))
    }

    async fn get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        self.read_range(range, false).await
    }

    async fn snapshot_get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        self.read_range(range, true).await
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> KvResult<()> {
        check_key(key)?;
        check_value(value)?;
        self.grow(key.len() + value.len())?;
        self.trx.set(key, value);
        Ok(())
    }

    fn clear(&mut self, key: &[u8]) -> KvResult<()> {
        check_key(key)?;
        self.grow(key.len())?;
        self.trx.clear(key);
        Ok(())
    }

    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        check_range(begin, end)?;
        self.grow(begin.len() + end.len())?;
        self.trx.clear_range(begin, end);
        Ok(())
    }

    fn atomic_add(&mut self, key: &[u8], delta: i64) -> KvResult<()> {
        check_key(key)?;
        self.grow(key.len() + 8)?;
        self.trx.atomic_op(key, &delta.to_le_bytes(), MutationType::Add);
        Ok(())
    }

    fn atomic_max(&mut self, key: &[u8], value: u64) -> KvResult<()> {
        check_key(key)?;
        self.grow(key.len() + 8)?;
        self.trx.atomic_op(key, &value.to_le_bytes(), MutationType::Max);
        Ok(())
    }

    fn add_read_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        check_range(begin, end)?;
        self.grow(begin.len() + end.len())?;
        self.trx.add_conflict_range(begin, end, foundationdb::options::ConflictRangeType::Read).map_err(map_err)
    }

    fn add_write_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        check_range(begin, end)?;
        self.grow(begin.len() + end.len())?;
        self.trx.add_conflict_range(begin, end, foundationdb::options::ConflictRangeType::Write).map_err(map_err)
    }

    async fn commit(self: Box<Self>) -> KvResult<u64> {
        let committed = self.trx.commit().await.map_err(|e| map_err(*e))?;
        let version = committed.committed_version().map_err(map_err)?;
        Ok(version.max(0) as u64)
    }
}
