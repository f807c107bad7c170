//! A commit whose reply is lost (`CommitUnknownResult` after it applied):
//! ops with an idempotency record are retried by the server and return the
//! original result; other ops report the unknown result to the caller.

mod common;

use async_trait::async_trait;
use bytes::Bytes;
use common::Fs;
use fskv_kv::{KvEngine, KvError, KvResult, MemoryEngine, RangeRequest, RangeResult, Transaction};
use fskv_proto::meta::*;
use fskv_types::{ErrorCode, InodeId};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Commits normally but reports `CommitUnknownResult` for the next N commits.
struct LossyEngine {
    inner: MemoryEngine,
    lose_next: Arc<AtomicU32>,
}

struct LossyTxn {
    inner: Box<dyn Transaction>,
    lose_next: Arc<AtomicU32>,
}

#[async_trait]
impl KvEngine for LossyEngine {
    fn name(&self) -> &'static str {
        "lossy"
    }
    async fn begin(&self) -> KvResult<Box<dyn Transaction>> {
        Ok(Box::new(LossyTxn { inner: self.inner.begin().await?, lose_next: self.lose_next.clone() }))
    }
}

#[async_trait]
impl Transaction for LossyTxn {
    async fn get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        self.inner.get(key).await
    }
    async fn snapshot_get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        self.inner.snapshot_get(key).await
    }
    async fn get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        self.inner.get_range(range).await
    }
    async fn snapshot_get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        self.inner.snapshot_get_range(range).await
    }
    fn set(&mut self, key: &[u8], value: &[u8]) -> KvResult<()> {
        self.inner.set(key, value)
    }
    fn clear(&mut self, key: &[u8]) -> KvResult<()> {
        self.inner.clear(key)
    }
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        self.inner.clear_range(begin, end)
    }
    fn atomic_add(&mut self, key: &[u8], delta: i64) -> KvResult<()> {
        self.inner.atomic_add(key, delta)
    }
    fn atomic_max(&mut self, key: &[u8], value: u64) -> KvResult<()> {
        self.inner.atomic_max(key, value)
    }
    fn add_read_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        self.inner.add_read_conflict_range(begin, end)
    }
    fn add_write_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        self.inner.add_write_conflict_range(begin, end)
    }
    async fn commit(self: Box<Self>) -> KvResult<u64> {
        let version = self.inner.commit().await?;
        let lose = self.lose_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if lose {
            return Err(KvError::CommitUnknownResult);
        }
        Ok(version)
    }
}

#[tokio::test]
async fn lost_commit_replies_are_replayed_from_idempotency_records() {
    let lose = Arc::new(AtomicU32::new(0));
    let engine = Arc::new(LossyEngine { inner: MemoryEngine::new(), lose_next: lose.clone() });
    let fs = Fs::with(engine, common::test_config()).await;
    let root = InodeId::ROOT;
    // Warm up the inode allocator so the next lost commit is the op's own.
    fs.create(root, "warm").await.unwrap();
    fs.op(MetaOp::Unlink { parent: root, name: "warm".into() }).await.unwrap();
    fs.svc.run_gc_until_idle().await.unwrap();

    lose.store(1, Ordering::SeqCst);
    let f = fs.create(root, "f").await.expect("the server retries and replays the recorded create");
    assert_eq!(fs.lookup(root, "f").await.unwrap().id, f.id);
    assert_eq!(lose.load(Ordering::SeqCst), 0, "the create's commit was the lost one");

    lose.store(1, Ordering::SeqCst);
    fs.op(MetaOp::Rename { src_parent: root, src_name: "f".into(), dst_parent: root, dst_name: "g".into() }).await.unwrap();
    lose.store(1, Ordering::SeqCst);
    fs.op(MetaOp::Unlink { parent: root, name: "g".into() }).await.unwrap();
    assert_eq!(fs.readdir_all(root).await.unwrap().len(), 0);

    // A lost allocator commit is retried too (it re-reads its counter).
    lose.store(1, Ordering::SeqCst);
    for i in 0..300 {
        fs.create(root, &format!("many{i}")).await.unwrap();
    }
    for i in 0..300 {
        fs.op(MetaOp::Unlink { parent: root, name: format!("many{i}") }).await.unwrap();
    }
    fs.svc.run_gc_until_idle().await.unwrap();

    // Without a request id there is no record: the caller sees the unknown result.
    let mut req = fs.req(MetaOp::Mkdir { parent: root, name: "d".into(), mode: 0o755, xattrs: vec![] });
    req.request_id = 0;
    lose.store(1, Ordering::SeqCst);
    let err = fs.svc.execute(req).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::KvCommitUnknownResult);
    assert!(fs.lookup(root, "d").await.is_ok(), "it did commit");
    fs.fsck_clean().await;
}
