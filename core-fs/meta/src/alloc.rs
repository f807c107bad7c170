//! Sharded inode-id allocation in batches.
//!
//! [`ALLOC_SHARDS`] counters live under `IALC` + shard byte (8-byte LE
//! sequence numbers). A server takes a batch of [`ALLOC_BATCH`] sequence
//! numbers from a random shard in one small transaction (read + write of that
//! counter; concurrent servers on the same shard conflict and retry) and hands
//! ids out from memory. Sequence `s` of shard `h` is inode id
//! `FIRST_ALLOCATED_ID + s * ALLOC_SHARDS + h`: unique across shards, never
//! the root. Ids of a batch not used before a restart are skipped, never reused.

use crate::error::MetaResult;
use crate::schema::{alloc_key, decode_i64};
use fskv_kv::{run_transaction, KvEngine, RetryOptions};
use fskv_types::InodeId;
use std::sync::Arc;
use tokio::sync::Mutex;

pub const ALLOC_SHARDS: u64 = 16;
pub const ALLOC_BATCH: u64 = 256;
pub const FIRST_ALLOCATED_ID: u64 = 0x100;

pub struct InodeAllocator {
    engine: Arc<dyn KvEngine>,
    free: Mutex<Vec<InodeId>>,
    /// The server's random source (it picks the shard of each batch).
    rng: Arc<parking_lot::Mutex<rand::rngs::StdRng>>,
}

impl InodeAllocator {
    pub fn new(engine: Arc<dyn KvEngine>, rng: Arc<parking_lot::Mutex<rand::rngs::StdRng>>) -> Self {
        InodeAllocator { engine, free: Mutex::new(Vec::new()), rng }
    }

    pub async fn allocate(&self) -> MetaResult<InodeId> {
        let mut free = self.free.lock().await;
        if free.is_empty() {
            let shard = (rand::Rng::gen::<u64>(&mut *self.rng.lock()) % ALLOC_SHARDS) as u8;
            let first = self.take_batch(shard).await?;
            // Hand out ascending ids: pop from the end of a descending list.
            for seq in (first..first + ALLOC_BATCH).rev() {
                free.push(InodeId(FIRST_ALLOCATED_ID + seq * ALLOC_SHARDS + u64::from(shard)));
            }
        }
        free.pop().ok_or_else(|| crate::MetaError::Internal("inode allocator batch empty".into()))
    }

    async fn take_batch(&self, shard: u8) -> MetaResult<u64> {
        let what = format!("inode allocator shard {shard}");
        let first = bump_counter(&*self.engine, &alloc_key(shard), ALLOC_BATCH as i64, i64::MAX, &what).await?;
        tracing::debug!(shard, first, "took an inode id batch");
        Ok(first as u64)
    }
}

/// Adds `by` (> 0) to the 8-byte LE counter at `key` (absent = 0) in one
/// synced transaction and returns the value before. Fails, changing
/// nothing, when the sum would reach `limit`. A retry after an unknown
/// result re-reads the counter: at worst a step is skipped, never handed
/// out twice.
pub(crate) async fn bump_counter(engine: &dyn KvEngine, key: &[u8], by: i64, limit: i64, what: &str) -> MetaResult<i64> {
    let opts = RetryOptions { retry_unknown_result: true, ..RetryOptions::default() };
    let before = run_transaction(engine, &opts, |txn| {
        let (key, what) = (key.to_vec(), what.to_string());
        Box::pin(async move {
            let current = match txn.get(&key).await? {
                Some(raw) => decode_i64(&key, &raw).map_err(|e| fskv_kv::KvError::Storage(e.to_string()))?,
                None => 0,
            };
            let next = current
                .checked_add(by)
                .filter(|n| *n < limit)
                .ok_or_else(|| fskv_kv::KvError::Storage(format!("{what} exhausted at {current}")))?;
            txn.set(&key, &next.to_le_bytes())?;
            Ok(current)
        })
    })
    .await?;
    Ok(before)
}
