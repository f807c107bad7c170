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
        let key = alloc_key(shard);
        // Retrying after an unknown result is safe: the retry re-reads the
        // counter, so at worst a batch is skipped, never handed out twice.
        let opts = RetryOptions { retry_unknown_result: true, ..RetryOptions::default() };
        let first = run_transaction(&*self.engine, &opts, |txn| {
            let key = key.clone();
            Box::pin(async move {
                let current = match txn.get(&key).await? {
                    Some(raw) => decode_i64(&key, &raw).map_err(|e| fskv_kv::KvError::Storage(e.to_string()))?,
                    None => 0,
                };
                let next = current
                    .checked_add(ALLOC_BATCH as i64)
                    .ok_or_else(|| fskv_kv::KvError::Storage(format!("inode allocator shard {shard} exhausted")))?;
                txn.set(&key, &next.to_le_bytes())?;
                Ok(current as u64)
            })
        })
        .await?;
        tracing::debug!(shard, first, "took an inode id batch");
        Ok(first)
    }
}
