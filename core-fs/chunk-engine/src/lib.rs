//! The chunk engine of a 3FS-KV storage target (docs/chunk-engine.md).
//!
//! Chunks live in blocks of 11 size classes (64 KiB .. 64 MiB), each class a
//! pool of 256 files grown by one `fallocate` of 256 blocks at a time. Chunk
//! metadata lives in RocksDB and is cached in memory; updates create a
//! pending version (copy-on-write, or in place for appends) that `commit`
//! promotes. See `docs/chunk-engine.md` for the design and crash-safety
//! argument.

pub mod alloc;
/// `fskv bench chunk` (feature `bench`).
#[cfg(feature = "bench")]
pub mod bench;
pub mod checksum;
pub mod engine;
pub mod error;
pub mod journal;
pub mod layout;
pub mod meta;
/// The power-loss model (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
pub mod power;

pub use alloc::{IoOp, PoolStats};
pub use engine::{ChunkEngine, CrashPoint, EngineConfig, ReadMode, ReadResult, UpdateKind, UpdateOptions, UpdateOutcome, UpdateRequest};
pub use error::{ChunkError, Result};
pub use journal::JournalStats;
pub use layout::{SizeClass, MAX_CHUNK_BYTES, MIN_BLOCK_BYTES, NUM_CLASSES};
pub use meta::{BlockRef, ChunkMeta, PendingState, RecentCommit, UpdateTag, VersionData, RECENT_COMMITS};

#[cfg(test)]
mod assert_traits {
    fn send_sync<T: Send + Sync>() {}
    #[test]
    fn engine_is_send_sync() {
        send_sync::<super::ChunkEngine>();
    }
}
