//! Per-chunk async locks: a sharded map of tokio mutexes, an entry removed
//! as soon as nobody holds or waits for it (so memory follows the number of
//! chunks being written, not the number ever written).

use fskv_types::ChunkId;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use tokio::sync::{Mutex, OwnedMutexGuard};

const LOCK_SHARDS: usize = 64;

type Shard = parking_lot::Mutex<HashMap<ChunkId, Arc<Mutex<()>>>>;

/// The lock table of one target.
pub struct ChunkLocks {
    shards: Vec<Shard>,
}

impl Default for ChunkLocks {
    fn default() -> Self {
        ChunkLocks { shards: (0..LOCK_SHARDS).map(|_| parking_lot::Mutex::new(HashMap::new())).collect() }
    }
}

/// Holds one chunk's lock; dropping it releases the lock and removes the
/// entry if it is idle.
pub struct ChunkGuard<'a> {
    locks: &'a ChunkLocks,
    chunk: ChunkId,
    guard: Option<OwnedMutexGuard<()>>,
}

impl ChunkLocks {
    fn shard(&self, chunk: ChunkId) -> &Shard {
        let mut h = DefaultHasher::new();
        chunk.hash(&mut h);
        &self.shards[(h.finish() as usize) % LOCK_SHARDS]
    }

    /// Waits for the lock of `chunk`.
    pub async fn lock(&self, chunk: ChunkId) -> ChunkGuard<'_> {
        let mutex = self.shard(chunk).lock().entry(chunk).or_default().clone();
        let guard = mutex.lock_owned().await;
        ChunkGuard { locks: self, chunk, guard: Some(guard) }
    }

    /// Chunks with a live entry (held or waited for).
    pub fn live_entries(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

impl Drop for ChunkGuard<'_> {
    fn drop(&mut self) {
        let mut shard = self.locks.shard(self.chunk).lock();
        // Release while holding the shard, so nobody can clone the entry
        // between the release and the idle check.
        drop(self.guard.take());
        if let Some(entry) = shard.get(&self.chunk) {
            if Arc::strong_count(entry) == 1 {
                shard.remove(&self.chunk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_types::InodeId;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serializes_one_chunk_and_cleans_up() {
        let locks = Arc::new(ChunkLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (locks, inside) = (locks.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..20 {
                    let _g = locks.lock(ChunkId::new(InodeId(1), 0)).await;
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders of one chunk lock");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(locks.live_entries(), 0);
        let _a = locks.lock(ChunkId::new(InodeId(1), 1)).await;
        let _b = locks.lock(ChunkId::new(InodeId(1), 2)).await;
        assert_eq!(locks.live_entries(), 2);
    }
}
