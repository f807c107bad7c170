//! The storage side as meta sees it: find the last chunk of a file on a
//! chain (exact length on close), remove or truncate a file's chunks (GC,
//! truncate). The real storage service will implement [`StorageBackend`];
//! [`NoStorage`] stands in until then and [`FakeStorage`] serves tests.

use async_trait::async_trait;
use fskv_proto::meta::{chain_for_chunk, FileLayout};
use fskv_types::{ChainId, ErrorCode, InodeId};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

/// A failed storage call, with the typed code the storage side answered
/// (retryable or not, as the storage client decided), so meta passes it on
/// instead of flattening every storage failure into one code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage: {message}")]
pub struct StorageError {
    pub code: ErrorCode,
    pub message: String,
}

impl StorageError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        StorageError { code, message: message.into() }
    }
}

/// The last chunk of a file on one chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastChunk {
    pub index: u64,
    pub len_bytes: u32,
}

#[async_trait]
pub trait StorageBackend: Send + Sync + 'static {
    /// Whether [`StorageBackend::last_chunk`] answers; if not, close keeps
    /// the reported / hinted length.
    fn knows_lengths(&self) -> bool;

    /// The chunk of `inode` with the highest index on `chain`, if any.
    async fn last_chunk(&self, inode: InodeId, chain: ChainId) -> Result<Option<LastChunk>, StorageError>;

    /// Removes every chunk of `inode` on the chains of `layout`; returns how many.
    async fn remove_chunks(&self, inode: InodeId, layout: &FileLayout) -> Result<u64, StorageError>;

    /// Drops data beyond `length_bytes`.
    async fn truncate_chunks(&self, inode: InodeId, layout: &FileLayout, length_bytes: u64) -> Result<(), StorageError>;

    /// (capacity, used) in bytes for statfs.
    async fn capacity_bytes(&self) -> (u64, u64);
}

/// No storage service yet: lengths come from reports, nothing to remove.
pub struct NoStorage;

#[async_trait]
impl StorageBackend for NoStorage {
    fn knows_lengths(&self) -> bool {
        false
    }
    async fn last_chunk(&self, _: InodeId, _: ChainId) -> Result<Option<LastChunk>, StorageError> {
        Ok(None)
    }
    async fn remove_chunks(&self, _: InodeId, _: &FileLayout) -> Result<u64, StorageError> {
        Ok(0)
    }
    async fn truncate_chunks(&self, _: InodeId, _: &FileLayout, _: u64) -> Result<(), StorageError> {
        Ok(())
    }
    async fn capacity_bytes(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// In-memory chunks for tests: (inode, chain) → chunk index → length.
#[derive(Default)]
pub struct FakeStorage {
    chunks: Mutex<HashMap<(InodeId, ChainId), BTreeMap<u64, u32>>>,
}

impl FakeStorage {
    pub fn new() -> Self {
        FakeStorage::default()
    }

    /// Records a write of `len_bytes` to chunk `index` (on the chain the layout maps it to).
    pub fn write_chunk(&self, inode: InodeId, layout: &FileLayout, index: u64, len_bytes: u32) {
        if let Some(chain) = chain_for_chunk(layout, index) {
            self.chunks.lock().entry((inode, chain)).or_default().insert(index, len_bytes);
        }
    }

    /// Writes `length_bytes` of data from offset 0 as full chunks plus a tail.
    pub fn write_file(&self, inode: InodeId, layout: &FileLayout, length_bytes: u64) {
        let chunk = u64::from(layout.chunk_size_bytes.max(1));
        let mut off = 0;
        while off < length_bytes {
            let len = (length_bytes - off).min(chunk);
            self.write_chunk(inode, layout, off / chunk, len as u32);
            off += len;
        }
    }

    pub fn chunk_count(&self, inode: InodeId) -> usize {
        self.chunks.lock().iter().filter(|((i, _), _)| *i == inode).map(|(_, m)| m.len()).sum()
    }

    pub fn total_chunks(&self) -> usize {
        self.chunks.lock().values().map(|m| m.len()).sum()
    }
}

#[async_trait]
impl StorageBackend for FakeStorage {
    fn knows_lengths(&self) -> bool {
        true
    }
    async fn last_chunk(&self, inode: InodeId, chain: ChainId) -> Result<Option<LastChunk>, StorageError> {
        let map = self.chunks.lock();
        Ok(map.get(&(inode, chain)).and_then(|m| m.iter().next_back()).map(|(&index, &len_bytes)| LastChunk { index, len_bytes }))
    }
    async fn remove_chunks(&self, inode: InodeId, _: &FileLayout) -> Result<u64, StorageError> {
        let mut map = self.chunks.lock();
        let mut n = 0;
        map.retain(|(i, _), m| {
            if *i == inode {
                n += m.len() as u64;
                false
            } else {
                true
            }
        });
        Ok(n)
    }
    async fn truncate_chunks(&self, inode: InodeId, layout: &FileLayout, length_bytes: u64) -> Result<(), StorageError> {
        let chunk = u64::from(layout.chunk_size_bytes.max(1));
        let mut map = self.chunks.lock();
        for ((i, _), m) in map.iter_mut() {
            if *i != inode {
                continue;
            }
            m.retain(|&idx, _| idx * chunk < length_bytes);
            for (&idx, len) in m.iter_mut() {
                let end = idx * chunk + u64::from(*len);
                if end > length_bytes {
                    *len = (length_bytes - idx * chunk) as u32;
                }
            }
        }
        Ok(())
    }
    async fn capacity_bytes(&self) -> (u64, u64) {
        let used: u64 = self.chunks.lock().values().flat_map(|m| m.values()).map(|&l| u64::from(l)).sum();
        (1 << 40, used)
    }
}
