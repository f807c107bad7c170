//! The chunk engine: get / update / commit / query over block pools and
//! RocksDB chunk metadata.
//!
//! Concurrency: updates, commits and replaces of one chunk are serialized by
//! a striped mutex (1024 stripes by chunk id hash). The metadata cache is a
//! sharded `RwLock<HashMap>` of `Arc<Cached>`; a reader clones the `Arc`
//! (which holds the block handles) and reads without any lock, so a reader
//! of an old version keeps its block alive until it is done.

use crate::alloc::{Allocator, BlockHandle, PoolStats};
use crate::checksum;
use crate::error::{ChunkError, Result};
use crate::journal::{AppendDelta, DeltaKind, Journal, MAX_DELTA_DATA_BYTES};
use crate::layout::{SizeClass, MAX_CHUNK_BYTES};
use crate::meta::{
    chunk_from_key, chunk_key, segment_key, BlockRef, ChunkMeta, PendingState, RecentCommit, UpdateTag, VersionData, CHUNK_KEY_PREFIX,
    RECENT_COMMITS,
};
use fskv_types::{ChunkId, InodeId};
use parking_lot::{Mutex, RwLock};
use rocksdb::{WriteBatch, WriteOptions, DB};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const CACHE_SHARDS: usize = 64;
const LOCK_STRIPES: usize = 1024;
const ENGINE_CONFIG_KEY: &[u8] = b"e";
/// The journal LSN current at the last checkpoint batch (u64 LE): new
/// journal records get larger LSNs even if the journal file is lost.
const JOURNAL_FLOOR_KEY: &[u8] = b"j";
/// Chunks whose records one checkpoint batch writes (their locks are held
/// while it is built and written).
const CHECKPOINT_BATCH_CHUNKS: usize = 64;

/// RocksDB's own default memtable size (see [`EngineConfig::meta_write_buffer_bytes`]).
pub const DEFAULT_META_WRITE_BUFFER_BYTES: usize = 64 << 20;
/// The smallest memtable [`ChunkEngine::open`] accepts.
pub const MIN_META_WRITE_BUFFER_BYTES: usize = 64 << 10;

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Blocks created by one pool growth (`fallocate`) step. 256 in
    /// production; tests may lower it. Fixed for the life of an engine
    /// directory (checked at open).
    pub blocks_per_grow: u64,
    /// `fdatasync` the written block file and sync the RocksDB WAL before an
    /// update or commit returns. Without it a process crash is still safe
    /// (page cache and WAL survive) but a power loss may lose recent
    /// operations.
    pub sync_writes: bool,
    /// Size of each of the append journal's two regions (`journal.rs`):
    /// how many in-place appends are recorded before a checkpoint writes
    /// their chunks' records to RocksDB. A multiple of 512 in
    /// [[`crate::journal::MIN_JOURNAL_REGION_BYTES`], 1 GiB].
    pub journal_region_bytes: u64,
    /// RocksDB's memtable size for the chunk metadata. RocksDB also
    /// preallocates each WAL file at 1.1× this (and the MANIFEST at this
    /// or its 4 MiB default, the smaller): free on a disk file system
    /// (`fallocate` reserves extents), but real memory on tmpfs, where a
    /// 64 MiB default made opening and closing an engine cost ~70 MiB of
    /// page zeroing (the simulation, on `/dev/shm`, spent half its time
    /// there). Chunk records are ~100 bytes, so a small memtable only means
    /// more frequent, smaller flushes.
    pub meta_write_buffer_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            blocks_per_grow: crate::layout::DEFAULT_BLOCKS_PER_GROW,
            sync_writes: true,
            journal_region_bytes: crate::journal::DEFAULT_JOURNAL_REGION_BYTES,
            meta_write_buffer_bytes: DEFAULT_META_WRITE_BUFFER_BYTES,
        }
    }
}

/// What an update does.
#[derive(Clone, Copy, Debug)]
pub enum UpdateKind<'a> {
    /// Write `data` at `offset_bytes`, extending the chunk (zero-filled) if needed.
    Write { offset_bytes: u64, data: &'a [u8] },
    /// Set the length to `len_bytes`, cutting or zero-extending.
    Truncate { len_bytes: u64 },
    /// Remove the chunk (takes effect on commit).
    Remove,
}

/// One update: produces pending version `committed + 1`.
#[derive(Clone, Copy, Debug)]
pub struct UpdateRequest<'a> {
    pub chunk: ChunkId,
    /// The chain version the request was routed with; older than the chunk's
    /// is rejected, newer is recorded.
    pub chain_ver: u32,
    pub kind: UpdateKind<'a>,
    /// Identifies the request; a retry with the same non-default tag returns
    /// the first result without applying the update again.
    pub tag: UpdateTag,
    /// If set, the version the caller expects to create (CRAQ: the head's
    /// `committed + 1`); a mismatch fails with `VersionMismatch`.
    pub expected_ver: Option<u64>,
    /// The file layout's chunk size, if the caller knows it (3FS passes it
    /// with every update). When the update needs a new block, the block is
    /// sized for `max(new length, hint)`, so later appends up to the layout
    /// chunk size stay in place instead of copying through every larger
    /// class. `None`: the smallest class that fits the new length.
    pub chunk_size_hint_bytes: Option<u64>,
}

/// How `ChunkEngine::update_with` applies an update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateOptions {
    /// Commit the new version in the same metadata batch
    /// (`update_and_commit`).
    pub commit: bool,
    /// CRC32C of a `Write`'s `data` as the caller received it (the storage
    /// service gets one with every payload). The engine checks it against
    /// the checksums it computes anyway (page CRCs, folded; one extra pass
    /// over the data only for a write into the middle of existing content)
    /// and fails with `ChecksumMismatch` before writing the data or any
    /// metadata, so the caller need not checksum the payload itself. Not
    /// checked for a duplicate (nothing is written) or a non-write update.
    pub data_crc: Option<u32>,
}

/// Result of an update.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UpdateOutcome {
    pub pending_ver: u64,
    pub committed_ver: u64,
    /// Length and CRC32C of the pending content (0 for a remove).
    pub len_bytes: u32,
    pub crc: u32,
    /// The update was an in-place append (no copy, same block).
    pub in_place: bool,
    /// The tag matched an already applied update; nothing was written.
    pub duplicate: bool,
}

/// Which version a read returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// The committed version; fails with `Uncommitted` while a pending one exists.
    Strict,
    /// The pending version if there is one, else the committed one.
    Relaxed,
    /// The committed version, ignoring any pending one (recovery).
    CommittedOnly,
}

/// Data returned by a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadResult {
    pub data: Vec<u8>,
    /// Version of the content the data came from.
    pub version: u64,
    /// Whole length of that version of the chunk.
    pub chunk_len_bytes: u32,
    /// The data is from an uncommitted (pending) version.
    pub uncommitted: bool,
}

/// Where a simulated crash happens (tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// In update: a block is allocated, nothing written.
    UpdateAfterAllocate,
    /// In update: data written to the block, not yet synced (lost or torn
    /// by a power cut, kept by a process crash), metadata not written.
    UpdateBeforeDataSync,
    /// In update: data written to the block and synced, metadata not.
    UpdateAfterDataWrite,
    /// In update: metadata batch written, in-memory state not updated.
    UpdateAfterMetaWrite,
    /// In commit: before the metadata batch.
    CommitBeforeMetaWrite,
    /// In commit: after the metadata batch.
    CommitAfterMetaWrite,
}

impl CrashPoint {
    /// Every crash point, in the order an update and its commit reach them.
    pub const ALL: [CrashPoint; 6] = [
        CrashPoint::UpdateAfterAllocate,
        CrashPoint::UpdateBeforeDataSync,
        CrashPoint::UpdateAfterDataWrite,
        CrashPoint::UpdateAfterMetaWrite,
        CrashPoint::CommitBeforeMetaWrite,
        CrashPoint::CommitAfterMetaWrite,
    ];
}

/// Cached state of one chunk: its record and a handle per referenced block.
struct Cached {
    meta: ChunkMeta,
    committed_block: Option<Arc<BlockHandle>>,
    /// May be the same handle as `committed_block` (in-place append).
    pending_block: Option<Arc<BlockHandle>>,
    /// `meta` has changes recorded only in the append journal: its RocksDB
    /// record and page-table segments are older, so the next RocksDB write
    /// of the chunk writes every segment.
    journaled: bool,
}

impl Cached {
    fn handles(&self) -> impl Iterator<Item = &Arc<BlockHandle>> {
        self.committed_block.iter().chain(self.pending_block.iter())
    }
}

/// A freshly allocated block not yet referenced by metadata; freed if the
/// operation fails before the metadata batch.
struct Provisional(Option<Arc<BlockHandle>>);

impl Provisional {
    fn keep(mut self) -> Option<Arc<BlockHandle>> {
        self.0.take()
    }
}

impl Drop for Provisional {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.retire();
        }
    }
}

/// New content for a pending or replaced version, before its record is built.
struct NewContent {
    data: VersionData,
    handle: Option<Arc<BlockHandle>>,
    in_place: bool,
    /// Bytes appended in place whose block write is not synced: the journal
    /// record carries them, or the block is synced before the RocksDB write.
    unsynced_tail: Option<Vec<u8>>,
}

/// Outcome of [`ChunkEngine::append_in_journal`].
enum Journaled {
    /// Recorded; maybe with a full journal region to checkpoint.
    Done(UpdateOutcome, Option<usize>),
    /// No room in the journal: go through RocksDB (content handed back).
    NoRoom(NewContent, Option<usize>),
}

/// The chunk engine of one storage target. `Send + Sync`; all methods are
/// blocking (call them from `spawn_blocking` in async code).
pub struct ChunkEngine {
    dir: PathBuf,
    config: EngineConfig,
    db: Arc<DB>,
    alloc: Arc<Allocator>,
    journal: Journal,
    cache: Vec<RwLock<ChunkMap<Arc<Cached>>>>,
    locks: Vec<Mutex<()>>,
    #[cfg(feature = "crash-points")]
    crash_point: Mutex<Option<CrashPoint>>,
    poisoned: AtomicBool,
}

/// A fast multiplicative hasher for chunk ids (not DoS-resistant; chunk ids
/// are assigned by the metadata service, not chosen by clients).
#[derive(Default, Clone, Copy)]
struct ChunkIdHasher(u64);

impl Hasher for ChunkIdHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type ChunkMap<V> = HashMap<ChunkId, V, BuildHasherDefault<ChunkIdHasher>>;

fn shard_of(id: ChunkId, n: usize) -> usize {
    let mut h = ChunkIdHasher::default();
    id.hash(&mut h);
    (h.finish() as usize) % n
}

fn class_of(b: BlockRef) -> Result<SizeClass> {
    SizeClass::new(b.class).ok_or_else(|| ChunkError::CorruptMetadata(format!("size class {}", b.class)))
}

impl ChunkEngine {
    /// Opens (or creates) an engine in `dir`: RocksDB under `dir/meta`,
    /// block files under `dir/blocks`. Rebuilds the block bitmaps from the
    /// chunk records and fails on a block referenced twice or beyond a pool.
    pub fn open(dir: impl AsRef<Path>, config: EngineConfig) -> Result<ChunkEngine> {
        let dir = dir.as_ref().to_path_buf();
        if config.blocks_per_grow == 0 {
            return Err(ChunkError::InvalidArgument("blocks_per_grow must be positive".into()));
        }
        if config.meta_write_buffer_bytes < MIN_META_WRITE_BUFFER_BYTES {
            return Err(ChunkError::InvalidArgument(format!(
                "meta_write_buffer_bytes must be at least {MIN_META_WRITE_BUFFER_BYTES}, got {}",
                config.meta_write_buffer_bytes
            )));
        }
        std::fs::create_dir_all(&dir).map_err(|e| ChunkError::io(format!("creating {dir:?}"), e))?;
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_write_buffer_size(config.meta_write_buffer_bytes);
        opts.set_manifest_preallocation_size(config.meta_write_buffer_bytes.min(4 << 20));
        let db = Arc::new(DB::open(&opts, dir.join("meta"))?);
        check_engine_config(&db, &config)?;
        let alloc = Arc::new(Allocator::open(&dir.join("blocks"), Arc::clone(&db), config.blocks_per_grow)?);
        let floor = match db.get(JOURNAL_FLOOR_KEY)? {
            Some(v) => u64::from_le_bytes(
                v.as_slice().try_into().map_err(|_| ChunkError::CorruptMetadata(format!("journal floor of {} bytes", v.len())))?,
            ),
            None => 0,
        };
        let (journal, deltas) = Journal::open(&dir, config.journal_region_bytes, config.sync_writes)?;
        let engine = ChunkEngine {
            dir,
            config,
            db,
            alloc,
            journal,
            cache: (0..CACHE_SHARDS).map(|_| RwLock::new(ChunkMap::default())).collect(),
            locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            #[cfg(feature = "crash-points")]
            crash_point: Mutex::new(None),
            poisoned: AtomicBool::new(false),
        };
        let lsns = engine.load_all()?;
        let n = lsns.len();
        engine.journal.raise_floor(lsns.values().copied().fold(floor, u64::max));
        let replayed = engine.replay(deltas, lsns)?;
        // The journal starts empty: what it held must be in RocksDB first.
        engine.checkpoint_chunks(&replayed)?;
        engine.journal.finish_open()?;
        tracing::info!(dir = ?engine.dir, chunks = n, replayed_chunks = replayed.len(), "chunk engine opened");
        Ok(engine)
    }

    /// Loads every chunk record into the cache and marks its blocks used.
    /// Returns each chunk's record journal LSN.
    fn load_all(&self) -> Result<ChunkMap<u64>> {
        let mut lsns = ChunkMap::default();
        for item in self.db.prefix_iterator([CHUNK_KEY_PREFIX]) {
            let (key, value) = item?;
            if key.first() != Some(&CHUNK_KEY_PREFIX) {
                break;
            }
            let id = chunk_from_key(&key)?;
            let (meta, lsn) = ChunkMeta::decode_record(&value, |block, seg| Ok(self.db.get(segment_key(block, seg))?))?;
            let cached = self.adopt(meta)?;
            self.cache[shard_of(id, CACHE_SHARDS)].write().insert(id, Arc::new(cached));
            lsns.insert(id, lsn);
        }
        Ok(lsns)
    }

    /// Applies the journal's records newer than their chunks' RocksDB
    /// records, in LSN order. Returns the chunks changed.
    fn replay(&self, deltas: Vec<AppendDelta>, mut lsns: ChunkMap<u64>) -> Result<Vec<ChunkId>> {
        let mut touched = Vec::new();
        for d in deltas {
            // No record: the chunk was removed after the append.
            let Some(record_lsn) = lsns.get_mut(&d.chunk) else { continue };
            if d.lsn <= *record_lsn {
                continue;
            }
            let old = self.cached(d.chunk).ok_or(ChunkError::NotFound(d.chunk))?;
            let new = apply_delta(&old, &d)?;
            // The appended bytes the record carries: the block may have
            // lost them (the file was not synced for this append). Synced
            // by the checkpoint that follows the replay.
            if !d.data.is_empty() {
                let h = old.committed_block.as_ref().ok_or_else(|| {
                    ChunkError::CorruptMetadata(format!("{}: journal record {} carries bytes for a chunk without a block", d.chunk, d.lsn))
                })?;
                h.write_at(u64::from(d.base_len), &d.data)?;
            }
            self.cache[shard_of(d.chunk, CACHE_SHARDS)].write().insert(d.chunk, Arc::new(new));
            *record_lsn = d.lsn;
            touched.push(d.chunk);
            self.journal.count_replayed(1);
        }
        touched.sort_unstable();
        touched.dedup();
        Ok(touched)
    }

    /// Writes the current record of each of `chunks` that has journal-only
    /// changes to RocksDB (with every page-table segment), in batches of
    /// [`CHECKPOINT_BATCH_CHUNKS`] whose chunk locks are held meanwhile.
    /// The caller holds no chunk lock.
    fn checkpoint_chunks(&self, chunks: &[ChunkId]) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(self.config.sync_writes);
        for group in chunks.chunks(CHECKPOINT_BATCH_CHUNKS) {
            self.check_alive()?;
            let mut stripes: Vec<usize> = group.iter().map(|c| shard_of(*c, LOCK_STRIPES)).collect();
            stripes.sort_unstable();
            stripes.dedup();
            // Sorted order: two checkpoints never deadlock; updates hold one stripe.
            let _guards: Vec<_> = stripes.iter().map(|&s| self.locks[s].lock()).collect();
            let lsn = self.journal.head_lsn();
            let mut batch = WriteBatch::default();
            let mut written = Vec::new();
            for &chunk in group {
                // Gone (its delete is in RocksDB) or rewritten through RocksDB since.
                let Some(c) = self.cached(chunk).filter(|c| c.journaled) else { continue };
                self.sync_blocks(&c)?;
                for (key, value) in c.meta.segment_puts(None)? {
                    batch.put(key, value);
                }
                batch.put(chunk_key(chunk), c.meta.encode_record(lsn));
                written.push((chunk, c));
            }
            batch.put(JOURNAL_FLOOR_KEY, lsn.to_le_bytes());
            self.db.write_opt(batch, &wo)?;
            for (chunk, c) in written {
                let persisted = Cached {
                    meta: c.meta.clone(),
                    committed_block: c.committed_block.clone(),
                    pending_block: c.pending_block.clone(),
                    journaled: false,
                };
                self.cache[shard_of(chunk, CACHE_SHARDS)].write().insert(chunk, Arc::new(persisted));
            }
        }
        Ok(())
    }

    /// Checkpoints journal region `region` (the caller holds no chunk
    /// lock), unless someone else is at it. A failure leaves the region
    /// busy; appends then go through RocksDB until a later checkpoint
    /// succeeds.
    fn checkpoint_region(&self, region: usize) -> Result<()> {
        let Some(chunks) = self.journal.take_region(region) else { return Ok(()) };
        let result = self.checkpoint_chunks(&chunks);
        self.journal.region_done(region, result.is_ok());
        result
    }

    /// Checkpoints every journal region holding records, so the journal is
    /// empty (graceful close: no update runs concurrently).
    fn checkpoint_journal(&self) -> Result<()> {
        for region in self.journal.busy_regions() {
            self.checkpoint_region(region)?;
        }
        Ok(())
    }

    fn adopt(&self, meta: ChunkMeta) -> Result<Cached> {
        let committed_block = match meta.committed.block {
            Some(b) => Some(self.alloc.adopt(class_of(b)?, b.index)?),
            None => None,
        };
        let pending_block = match meta.pending.as_ref().and_then(|(_, p)| p.block()) {
            Some(b) if Some(b) == meta.committed.block => committed_block.clone(),
            Some(b) => Some(self.alloc.adopt(class_of(b)?, b.index)?),
            None => None,
        };
        Ok(Cached { meta, committed_block, pending_block, journaled: false })
    }

    /// Ends the engine gracefully: checkpoints the append journal and
    /// flushes RocksDB memtables. Dropping the engine without this is a
    /// valid (simulated) crash.
    pub fn close(self) -> Result<()> {
        self.checkpoint_journal()?;
        self.db.flush()?;
        Ok(())
    }

    /// Bytes still free for unprivileged use on the filesystem holding the
    /// engine's directory (`statvfs`), i.e. room for pools to grow into.
    pub fn free_disk_bytes(&self) -> Result<u64> {
        let path = std::ffi::CString::new(self.dir().as_os_str().as_encoded_bytes())
            .map_err(|_| ChunkError::InvalidArgument("engine directory path contains NUL".into()))?;
        // SAFETY: statvfs writes into the zeroed struct we own; the path is a
        // valid NUL-terminated string for the duration of the call.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(ChunkError::io(format!("statvfs {}", self.dir().display()), std::io::Error::last_os_error()));
        }
        Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    // ----- get -----

    /// Reads up to `len_bytes` at `offset_bytes` (short at the chunk end),
    /// verifying the page checksums of every page touched.
    pub fn read(&self, chunk: ChunkId, offset_bytes: u64, len_bytes: u64, mode: ReadMode) -> Result<ReadResult> {
        let _span = tracing::trace_span!("chunk_read", chunk = %chunk, offset_bytes, len_bytes).entered();
        self.check_alive()?;
        let cached = self.cached(chunk).ok_or(ChunkError::NotFound(chunk))?;
        let (version, content, handle, uncommitted) = select_version(chunk, &cached, mode)?;
        let data = read_range(chunk, content, handle, offset_bytes, len_bytes)?;
        Ok(ReadResult { data, version, chunk_len_bytes: content.len_bytes, uncommitted })
    }

    // ----- update -----

    /// Applies an update as a new pending version (`committed + 1`). Any
    /// earlier pending version is discarded. Writes that append within the
    /// current block are done in place; everything else copies on write.
    pub fn update(&self, req: &UpdateRequest<'_>) -> Result<UpdateOutcome> {
        self.update_with(req, UpdateOptions::default())
    }

    /// `update` followed by `commit` of the version it creates, written as
    /// **one** RocksDB batch (CRAQ: the tail of a chain, or a one-target
    /// chain, commits right after applying). After a crash the chunk is
    /// either its state before or the new committed version; there is no
    /// intermediate pending state. A duplicate (same tag) of the pending
    /// version commits that version; a duplicate of a committed version
    /// returns it. The outcome has `committed_ver == pending_ver`.
    pub fn update_and_commit(&self, req: &UpdateRequest<'_>) -> Result<UpdateOutcome> {
        self.update_with(req, UpdateOptions { commit: true, ..UpdateOptions::default() })
    }

    /// `update` (or, with `opts.commit`, `update_and_commit`), optionally
    /// verifying the written data against a CRC32C the caller received with
    /// it (`opts.data_crc`, see `UpdateOptions`).
    pub fn update_with(&self, req: &UpdateRequest<'_>, opts: UpdateOptions) -> Result<UpdateOutcome> {
        let _span = tracing::debug_span!("chunk_update", chunk = %req.chunk, commit = opts.commit).entered();
        let (out, checkpoint) = self.update_locked(req, opts)?;
        self.after_unlock(checkpoint);
        Ok(out)
    }

    /// A journal region filled up: checkpoint it now that the chunk's lock
    /// is released.
    fn after_unlock(&self, checkpoint: Option<usize>) {
        let Some(region) = checkpoint else { return };
        match self.checkpoint_region(region) {
            Ok(()) | Err(ChunkError::Poisoned) => {}
            Err(e) => tracing::error!(error = %e, region, "append journal checkpoint failed"),
        }
    }

    /// `update_with` under the chunk's lock; also returns a journal region
    /// the caller must checkpoint once the lock is released.
    fn update_locked(&self, req: &UpdateRequest<'_>, opts: UpdateOptions) -> Result<(UpdateOutcome, Option<usize>)> {
        let commit = opts.commit;
        self.check_alive()?;
        let _guard = self.lock(req.chunk);
        let old = self.cached(req.chunk);
        if let Some(old) = &old {
            if req.chain_ver < old.meta.chain_ver {
                return Err(ChunkError::StaleChainVersion { chunk: req.chunk, request: req.chain_ver, current: old.meta.chain_ver });
            }
            // A duplicate only when it is the version the caller expects to
            // create: the same tag at another version is the same request
            // applied again by a predecessor that no longer knew it (a
            // full-chunk sync does not carry tags), and its successors must
            // take that version too or the replicas' versions part
            // (simulation seed 422 at 5 ms ticks).
            let dup = duplicate_outcome(&old.meta, req.tag).filter(|d| req.expected_ver.is_none_or(|e| e == d.pending_ver));
            if let Some(mut out) = dup {
                let mut checkpoint = None;
                if commit && out.pending_ver > out.committed_ver {
                    (out.committed_ver, checkpoint) = self.commit_locked(req.chunk, out.pending_ver)?;
                }
                return Ok((out, checkpoint));
            }
        }
        let committed_ver = old.as_ref().map_or(0, |c| c.meta.committed_ver);
        let pending_ver = committed_ver + 1;
        if let Some(expected) = req.expected_ver {
            if expected != pending_ver {
                return Err(ChunkError::VersionMismatch {
                    chunk: req.chunk,
                    detail: format!("update expects version {expected}, next version is {pending_ver}"),
                });
            }
        }
        let mut to_checkpoint = None;
        let (state, handle, in_place) = match req.kind {
            UpdateKind::Remove => {
                if !matches!(old.as_deref(), Some(c) if c.meta.committed_ver > 0) {
                    return Err(ChunkError::NotFound(req.chunk));
                }
                (PendingState::Removed { tag: req.tag }, None, false)
            }
            kind => {
                let min_block = req.chunk_size_hint_bytes.unwrap_or(0).min(MAX_CHUNK_BYTES);
                let mut nc = self.new_content(req.chunk, old.as_deref(), kind, req.tag, (min_block, opts.data_crc))?;
                // An in-place append over a chunk with nothing pending:
                // its metadata goes to the journal.
                if let Some(base) = old.as_deref().filter(|o| nc.in_place && o.meta.pending.is_none()) {
                    match self.append_in_journal(req.chunk, req.chain_ver, base, nc, commit)? {
                        Journaled::Done(out, checkpoint) => return Ok((out, checkpoint)),
                        Journaled::NoRoom(back, checkpoint) => {
                            to_checkpoint = checkpoint;
                            nc = back;
                        }
                    }
                }
                // Through RocksDB: the bytes must be on disk before the record.
                if let (Some(_), Some(h)) = (nc.unsynced_tail.take(), nc.handle.as_ref()) {
                    self.sync_data(h)?;
                }
                (PendingState::Data(nc.data), nc.handle, nc.in_place)
            }
        };
        let (len_bytes, crc) = match &state {
            PendingState::Data(v) => (v.len_bytes, v.crc),
            PendingState::Removed { .. } => (0, 0),
        };
        let new = if commit {
            // The record `commit` would write after this update, built directly.
            match state {
                PendingState::Removed { .. } => None,
                PendingState::Data(v) => Some(Cached {
                    meta: ChunkMeta {
                        chain_ver: req.chain_ver,
                        committed_ver: pending_ver,
                        committed: v,
                        pending: None,
                        recent: old.as_ref().map(|c| c.meta.recent_after_commit()).unwrap_or_default(),
                    },
                    committed_block: handle,
                    pending_block: None,
                    journaled: false,
                }),
            }
        } else {
            let meta = ChunkMeta {
                chain_ver: req.chain_ver,
                committed_ver,
                committed: old.as_ref().map(|c| c.meta.committed.clone()).unwrap_or_default(),
                pending: Some((pending_ver, state)),
                recent: old.as_ref().map(|c| c.meta.recent.clone()).unwrap_or_default(),
            };
            let committed_block = old.as_ref().and_then(|c| c.committed_block.clone());
            Some(Cached { meta, committed_block, pending_block: handle, journaled: false })
        };
        self.persist_and_swap(req.chunk, old.as_deref(), new, true)?;
        let committed_ver = if commit { pending_ver } else { committed_ver };
        Ok((UpdateOutcome { pending_ver, committed_ver, len_bytes, crc, in_place, duplicate: false }, to_checkpoint))
    }

    /// Records an in-place append (`nc`, already written to the block) by
    /// a journal record instead of a RocksDB batch — as the committed
    /// version (`commit`: the chain tail) or as the pending one (a head or
    /// middle target) — then swaps the cache entry. `base`: the chunk's
    /// state, with nothing pending.
    fn append_in_journal(&self, chunk: ChunkId, chain_ver: u32, base: &Cached, mut nc: NewContent, commit: bool) -> Result<Journaled> {
        let (Some(block), Some(handle)) = (nc.data.block, nc.handle.as_ref()) else { return Ok(Journaled::NoRoom(nc, None)) };
        let first_page = (base.meta.committed.len_bytes as u64 / handle.class().crc_page_bytes()) as usize;
        let new_ver = base.meta.committed_ver + 1;
        let mut delta = AppendDelta {
            lsn: 0,
            kind: if commit { DeltaKind::Append } else { DeltaKind::PendingAppend },
            chunk,
            chain_ver,
            block,
            new_ver,
            base_len: base.meta.committed.len_bytes,
            base_crc: base.meta.committed.crc,
            new_len: nc.data.len_bytes,
            new_crc: nc.data.crc,
            tag: nc.data.tag,
            pages: nc.data.page_crcs.get(first_page..).unwrap_or_default().to_vec(),
            data: nc.unsynced_tail.take().unwrap_or_default(),
        };
        // Bytes too many for a record: on disk in the block before the record.
        if !delta.data.is_empty() && delta.encoded_len() > self.journal.max_record_bytes() {
            delta.data = Vec::new();
            self.sync_data(handle)?;
        }
        let appended = self.journal_append(&mut delta)?;
        if appended.lsn.is_none() {
            if !delta.data.is_empty() {
                nc.unsynced_tail = Some(std::mem::take(&mut delta.data));
            }
            return Ok(Journaled::NoRoom(nc, appended.checkpoint));
        }
        self.crash_at(CrashPoint::UpdateAfterMetaWrite)?;
        let out = UpdateOutcome {
            pending_ver: new_ver,
            committed_ver: if commit { new_ver } else { base.meta.committed_ver },
            len_bytes: nc.data.len_bytes,
            crc: nc.data.crc,
            in_place: true,
            duplicate: false,
        };
        let new = with_append(base, chain_ver, new_ver, nc.data, commit);
        debug_assert!(new.committed_block.as_ref().zip(nc.handle.as_ref()).is_some_and(|(a, b)| Arc::ptr_eq(a, b)));
        self.cache[shard_of(chunk, CACHE_SHARDS)].write().insert(chunk, Arc::new(new));
        Ok(Journaled::Done(out, appended.checkpoint))
    }

    /// Builds the pending content of a write or truncate on top of the
    /// committed version: in place if it only appends within the block,
    /// otherwise in a new block (copy on write).
    fn new_content(
        &self,
        chunk: ChunkId,
        old: Option<&Cached>,
        kind: UpdateKind<'_>,
        tag: UpdateTag,
        (min_block_bytes, data_crc): (u64, Option<u32>),
    ) -> Result<NewContent> {
        let empty = VersionData::default();
        let base = old.map_or(&empty, |c| &c.meta.committed);
        let base_handle = old.and_then(|c| c.committed_block.as_ref());
        let base_len = base.len_bytes as u64;
        let (offset_bytes, data, new_len) = match kind {
            UpdateKind::Write { offset_bytes, data } => {
                let end = offset_bytes.checked_add(data.len() as u64).filter(|&e| e <= MAX_CHUNK_BYTES).ok_or_else(|| {
                    ChunkError::InvalidArgument(format!(
                        "{chunk}: write of {} bytes at {offset_bytes} exceeds the {MAX_CHUNK_BYTES}-byte chunk limit",
                        data.len()
                    ))
                })?;
                (offset_bytes, data, end.max(base_len))
            }
            UpdateKind::Truncate { len_bytes } => {
                if len_bytes > MAX_CHUNK_BYTES {
                    return Err(ChunkError::InvalidArgument(format!(
                        "{chunk}: truncate to {len_bytes} exceeds the {MAX_CHUNK_BYTES}-byte chunk limit"
                    )));
                }
                (len_bytes.min(base_len), &[][..], len_bytes)
            }
            UpdateKind::Remove => unreachable!("remove has no content"),
        };
        // Only a write has a payload to check.
        let data_crc = if matches!(kind, UpdateKind::Write { .. }) { data_crc } else { None };
        // Bytes past the committed end of the block belong to an in-place
        // pending version if there is one; overwriting them before the new
        // record commits would corrupt that version after a crash, so then
        // we copy instead.
        let tail_in_use = old.is_some_and(|c| match (&c.pending_block, base_handle) {
            (Some(p), Some(b)) => Arc::ptr_eq(p, b),
            _ => false,
        });
        if let (Some(h), false) = (base_handle, tail_in_use) {
            let appends = offset_bytes == base_len && new_len >= base_len;
            if appends && new_len <= h.class().block_bytes() {
                return self.append_in_place(chunk, base, h, new_len, (data, data_crc), tag);
            }
        }
        self.copy_on_write(chunk, base, base_handle, (offset_bytes, data, data_crc), new_len, tag, min_block_bytes)
    }

    /// Writes `data` (zero-padded to `new_len`) after the committed end of
    /// the committed block. Committed bytes are never touched.
    fn append_in_place(
        &self,
        chunk: ChunkId,
        base: &VersionData,
        handle: &Arc<BlockHandle>,
        new_len: u64,
        (data, data_crc): (&[u8], Option<u32>),
        tag: UpdateTag,
    ) -> Result<NewContent> {
        let base_len = base.len_bytes as u64;
        let padded;
        let tail: &[u8] = if base_len + data.len() as u64 == new_len {
            data
        } else {
            padded = vec![0u8; (new_len - base_len) as usize];
            &padded
        };
        debug_assert!(data.is_empty() || tail.len() == data.len());
        // Checksums first: a payload that fails `data_crc` is never written.
        let mut page_crcs = base.page_crcs.clone();
        let (crc, tail_crc) = checksum::extend_and_crc(&mut page_crcs, base.crc, base_len, tail, handle.class().crc_page_bytes());
        check_data_crc(chunk, data_crc, tail_crc)?;
        self.crash_at(CrashPoint::UpdateAfterAllocate)?;
        handle.write_at(base_len, tail)?;
        self.crash_at(CrashPoint::UpdateBeforeDataSync)?;
        // A small append's bytes may ride in its journal record instead of
        // an fdatasync of the block file (one sync per append, not two).
        let unsynced_tail = if self.config.sync_writes && !tail.is_empty() && tail.len() <= MAX_DELTA_DATA_BYTES {
            Some(tail.to_vec())
        } else {
            self.sync_data(handle)?;
            None
        };
        self.crash_at(CrashPoint::UpdateAfterDataWrite)?;
        let data = VersionData { block: base.block, len_bytes: new_len as u32, crc, tag, page_crcs };
        tracing::trace!(%chunk, new_len, "in-place append");
        Ok(NewContent { data, handle: Some(Arc::clone(handle)), in_place: true, unsynced_tail })
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_on_write(
        &self,
        chunk: ChunkId,
        base: &VersionData,
        base_handle: Option<&Arc<BlockHandle>>,
        (offset_bytes, data, data_crc): (u64, &[u8], Option<u32>),
        new_len: u64,
        tag: UpdateTag,
        min_block_bytes: u64,
    ) -> Result<NewContent> {
        // A write that covers the whole new content (offset 0, nothing of
        // the old content left) goes straight from the caller's buffer:
        // no read of the old block, no copy.
        if offset_bytes == 0 && data.len() as u64 == new_len {
            return self.write_new_block(chunk, data, tag, (min_block_bytes, data_crc));
        }
        // Otherwise the new content's checksums do not give the payload's:
        // one pass over the payload (what a caller would otherwise do).
        if data_crc.is_some() {
            check_data_crc(chunk, data_crc, checksum::crc32c(data))?;
        }
        let mut buf = match base_handle {
            Some(h) => read_range(chunk, base, Some(h), 0, base.len_bytes as u64)?,
            None => Vec::new(),
        };
        buf.resize(new_len as usize, 0);
        let end = offset_bytes as usize + data.len();
        if end <= buf.len() {
            buf[offset_bytes as usize..end].copy_from_slice(data);
        }
        self.write_new_block(chunk, &buf, tag, (min_block_bytes, None))
    }

    /// Allocates the smallest block that fits `buf` and `min_block_bytes`
    /// and writes `buf` into it. `buf_crc`: fail unless `buf` has this CRC32C.
    fn write_new_block(
        &self,
        chunk: ChunkId,
        buf: &[u8],
        tag: UpdateTag,
        (min_block_bytes, buf_crc): (u64, Option<u32>),
    ) -> Result<NewContent> {
        let len = buf.len() as u64;
        if len == 0 {
            check_data_crc(chunk, buf_crc, 0)?;
            let data = VersionData { block: None, len_bytes: 0, crc: 0, tag, page_crcs: Vec::new() };
            return Ok(NewContent { data, handle: None, in_place: false, unsynced_tail: None });
        }
        let class = SizeClass::for_len(len.max(min_block_bytes))
            .ok_or_else(|| ChunkError::InvalidArgument(format!("{chunk}: {len} bytes exceed the chunk limit")))?;
        // Checksums first: a payload that fails `buf_crc` is never written.
        let (page_crcs, crc) = checksum::of(buf, class.crc_page_bytes());
        check_data_crc(chunk, buf_crc, crc)?;
        let block = Provisional(Some(self.alloc.allocate(class)?));
        let handle = block.0.as_ref().map(Arc::clone).ok_or(ChunkError::Poisoned)?;
        self.crash_at(CrashPoint::UpdateAfterAllocate)?;
        handle.write_at(0, buf)?;
        self.crash_at(CrashPoint::UpdateBeforeDataSync)?;
        self.sync_data(&handle)?;
        self.crash_at(CrashPoint::UpdateAfterDataWrite)?;
        let data =
            VersionData { block: Some(BlockRef { class: class.raw(), index: handle.index() }), len_bytes: len as u32, crc, tag, page_crcs };
        tracing::trace!(%chunk, len, ?handle, "copy-on-write block");
        Ok(NewContent { data, handle: block.keep(), in_place: false, unsynced_tail: None })
    }

    // ----- commit -----

    /// Promotes pending version `version` to committed (a pending remove
    /// deletes the chunk). Committing a version that is already committed
    /// is a no-op that returns the committed version.
    pub fn commit(&self, chunk: ChunkId, version: u64) -> Result<u64> {
        let _span = tracing::debug_span!("chunk_commit", chunk = %chunk, version).entered();
        self.check_alive()?;
        let (committed, checkpoint) = {
            let _guard = self.lock(chunk);
            self.commit_locked(chunk, version)?
        };
        self.after_unlock(checkpoint);
        Ok(committed)
    }

    /// `commit` with the chunk's stripe lock held; also returns a journal
    /// region the caller must checkpoint once the lock is released.
    fn commit_locked(&self, chunk: ChunkId, version: u64) -> Result<(u64, Option<usize>)> {
        let old = self.cached(chunk).ok_or(ChunkError::NotFound(chunk))?;
        let Some((pending_ver, state)) = old.meta.pending.as_ref().filter(|(v, _)| *v == version) else {
            if old.meta.committed_ver >= version && version > 0 {
                return Ok((old.meta.committed_ver, None));
            }
            return Err(ChunkError::VersionMismatch {
                chunk,
                detail: format!("commit of {version}: committed {}, pending {:?}", old.meta.committed_ver, old.meta.pending_ver()),
            });
        };
        self.crash_at(CrashPoint::CommitBeforeMetaWrite)?;
        let mut checkpoint = None;
        if let PendingState::Data(v) = state {
            // An in-place pending append: the commit is a journal record.
            if let Some(block) = v.block.filter(|b| old.meta.committed.block == Some(*b)) {
                let mut delta = AppendDelta {
                    lsn: 0,
                    kind: DeltaKind::Commit,
                    chunk,
                    chain_ver: old.meta.chain_ver,
                    block,
                    new_ver: *pending_ver,
                    base_len: old.meta.committed.len_bytes,
                    base_crc: old.meta.committed.crc,
                    new_len: v.len_bytes,
                    new_crc: v.crc,
                    tag: v.tag,
                    pages: Vec::new(),
                    data: Vec::new(),
                };
                let appended = self.journal_append(&mut delta)?;
                if appended.lsn.is_some() {
                    self.crash_at(CrashPoint::CommitAfterMetaWrite)?;
                    let new = committed_pending(&old, true)?;
                    self.cache[shard_of(chunk, CACHE_SHARDS)].write().insert(chunk, Arc::new(new));
                    return Ok((*pending_ver, appended.checkpoint));
                }
                checkpoint = appended.checkpoint;
            }
        }
        let new = match state {
            PendingState::Removed { .. } => None,
            PendingState::Data(_) => Some(committed_pending(&old, false)?),
        };
        self.persist_and_swap(chunk, Some(&old), new, false)?;
        Ok((*pending_ver, checkpoint))
    }

    // ----- full-chunk replace (recovery) -----

    /// Replaces the chunk's content with `data` as committed version
    /// `version`, dropping any pending version (recovery writes). `recent`:
    /// the tags of the sender's older committed versions (so a late retry
    /// of one is still recognised here); at most [`RECENT_COMMITS`], each
    /// below `version`, else `InvalidArgument` (they come from a peer).
    pub fn replace(
        &self,
        chunk: ChunkId,
        chain_ver: u32,
        version: u64,
        data: &[u8],
        tag: UpdateTag,
        recent: Vec<RecentCommit>,
    ) -> Result<()> {
        let _span = tracing::debug_span!("chunk_replace", chunk = %chunk, version).entered();
        self.check_alive()?;
        if version == 0 || data.len() as u64 > MAX_CHUNK_BYTES {
            return Err(ChunkError::InvalidArgument(format!("{chunk}: replace needs version > 0 and at most {MAX_CHUNK_BYTES} bytes")));
        }
        if recent.len() > RECENT_COMMITS || recent.iter().any(|r| r.version >= version) {
            return Err(ChunkError::InvalidArgument(format!(
                "{chunk}: a replace at version {version} carries {} older versions' tags (at most {RECENT_COMMITS}, each older)",
                recent.len()
            )));
        }
        let _guard = self.lock(chunk);
        let old = self.cached(chunk);
        let nc = self.write_new_block(chunk, data, tag, (0, None))?;
        let meta = ChunkMeta { chain_ver, committed_ver: version, committed: nc.data, pending: None, recent };
        let new = Cached { meta, committed_block: nc.handle, pending_block: None, journaled: false };
        self.persist_and_swap(chunk, old.as_deref(), Some(new), true)
    }

    /// Rewrites the committed content of `chunk` with `data` — the same
    /// bytes, fetched from another replica — into a fresh block (bit-rot
    /// repair). Only if the chunk is still committed at `version` with
    /// nothing pending and `data` has the recorded whole-content CRC; the
    /// version, chain version and the tags of recent versions are kept, so
    /// retries stay recognised. The damaged block is retired.
    pub fn repair_committed(&self, chunk: ChunkId, version: u64, data: &[u8]) -> Result<()> {
        let _span = tracing::debug_span!("chunk_repair", chunk = %chunk, version).entered();
        self.check_alive()?;
        let _guard = self.lock(chunk);
        let old = self.cached(chunk).ok_or(ChunkError::NotFound(chunk))?;
        let m = &old.meta;
        if m.committed_ver != version || m.pending.is_some() || m.committed.len_bytes as usize != data.len() {
            return Err(ChunkError::VersionMismatch {
                chunk,
                detail: format!(
                    "repair of version {version} ({} bytes): the chunk is at {} ({} bytes){}",
                    data.len(),
                    m.committed_ver,
                    m.committed.len_bytes,
                    if m.pending.is_some() { " with a pending version" } else { "" }
                ),
            });
        }
        let min_block = old.committed_block.as_ref().map_or(0, |b| b.class().block_bytes());
        let nc = self.write_new_block(chunk, data, m.committed.tag, (min_block, Some(m.committed.crc)))?;
        let mut meta = m.clone();
        meta.committed = nc.data;
        let new = Cached { meta, committed_block: nc.handle, pending_block: None, journaled: false };
        self.persist_and_swap(chunk, Some(&old), Some(new), false)
    }

    /// Writes the new record (or deletes it) in one batch, then swaps the
    /// cache entry and retires blocks the new record no longer references.
    fn persist_and_swap(&self, chunk: ChunkId, old: Option<&Cached>, new: Option<Cached>, is_update: bool) -> Result<()> {
        // The record supersedes the chunk's journal records, whose appended
        // bytes may be in their records only.
        if let Some(o) = old.filter(|o| o.journaled) {
            self.sync_blocks(o)?;
        }
        let mut batch = WriteBatch::default();
        match &new {
            Some(c) => {
                // After journal-only changes the old record's segments are
                // not all in RocksDB: write every segment.
                let persisted = old.filter(|o| !o.journaled).map(|o| &o.meta);
                for (key, value) in c.meta.segment_puts(persisted)? {
                    batch.put(key, value);
                }
                batch.put(chunk_key(chunk), c.meta.encode_record(self.journal.head_lsn()));
            }
            None => batch.delete(chunk_key(chunk)),
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(self.config.sync_writes);
        if let Err(e) = self.db.write_opt(batch, &wo) {
            // As RocksDB itself stops after a failed write: fail-stop.
            tracing::error!(error = %e, %chunk, "metadata write failed; the engine stops until reopened");
            self.poisoned.store(true, Ordering::SeqCst);
            if let Some(new) = &new {
                let keep: HashSet<BlockRef> = old.map(|c| c.meta.blocks().into_iter().collect()).unwrap_or_default();
                retire_unreferenced(new, &keep);
            }
            return Err(e.into());
        }
        self.crash_at(if is_update { CrashPoint::UpdateAfterMetaWrite } else { CrashPoint::CommitAfterMetaWrite })?;
        let keep: HashSet<BlockRef> = new.as_ref().map(|c| c.meta.blocks().into_iter().collect()).unwrap_or_default();
        {
            let mut shard = self.cache[shard_of(chunk, CACHE_SHARDS)].write();
            match new {
                Some(c) => shard.insert(chunk, Arc::new(c)),
                None => shard.remove(&chunk),
            };
        }
        if let Some(old) = old {
            retire_unreferenced(old, &keep);
        }
        Ok(())
    }

    // ----- query -----

    /// `(version, tag, crc)` of the chunk's pending version, if any — the
    /// CRC32C of its content for a pending write, `None` for a pending
    /// removal — without cloning the whole record (a hot-path check of the
    /// write path).
    pub fn pending_update(&self, chunk: ChunkId) -> Option<(u64, UpdateTag, Option<u32>)> {
        let c = self.cached(chunk)?;
        match &c.meta.pending {
            Some((ver, PendingState::Data(v))) => Some((*ver, v.tag, Some(v.crc))),
            Some((ver, PendingState::Removed { tag })) => Some((*ver, *tag, None)),
            None => None,
        }
    }

    /// Bit rot, injected: flips every bit of the byte at `offset_bytes` of
    /// the committed content, in the block file, without touching the
    /// checksums (tests of the read path's repair and of the scrubber).
    #[cfg(feature = "fault-injection")]
    pub fn corrupt_committed_byte(&self, chunk: ChunkId, offset_bytes: u64) -> Result<()> {
        let c = self.cached(chunk).ok_or(ChunkError::NotFound(chunk))?;
        if offset_bytes >= u64::from(c.meta.committed.len_bytes) {
            return Err(ChunkError::InvalidArgument(format!("{chunk}: offset {offset_bytes} past the committed length")));
        }
        let block = c.committed_block.as_ref().ok_or_else(|| ChunkError::CorruptMetadata(format!("{chunk}: no block")))?;
        let mut byte = [0u8; 1];
        block.read_at(offset_bytes, &mut byte)?;
        block.write_at(offset_bytes, &[!byte[0]])
    }

    /// The chunk's metadata, if it exists.
    pub fn meta(&self, chunk: ChunkId) -> Option<ChunkMeta> {
        self.cached(chunk).map(|c| c.meta.clone())
    }

    /// The chunk of `inode` with the highest index, with one reverse seek.
    pub fn last_chunk(&self, inode: InodeId) -> Result<Option<(ChunkId, ChunkMeta)>> {
        // A failed engine missed every update since its fault: its last
        // chunk may be older than the chain's (simulation seed 4320).
        self.check_alive()?;
        let mut it = self.db.raw_iterator();
        it.seek_for_prev(chunk_key(ChunkId::new(inode, u64::MAX)));
        if !it.valid() {
            it.status()?;
            return Ok(None);
        }
        let Some(key) = it.key() else { return Ok(None) };
        if key.first() != Some(&CHUNK_KEY_PREFIX) {
            return Ok(None);
        }
        let id = chunk_from_key(key)?;
        if id.inode != inode {
            return Ok(None);
        }
        // The cache, not the record: journal-only changes are newer. (Not
        // cached: removed since the seek.)
        Ok(self.meta(id).map(|meta| (id, meta)))
    }

    /// All chunk records in id order (recovery compares them with a peer's).
    pub fn dump(&self) -> Result<Vec<(ChunkId, ChunkMeta)>> {
        // From the in-memory cache, which holds every chunk and swaps each
        // entry atomically: reading records and their page-table segments
        // from RocksDB with separate gets could mix two versions of a chunk
        // written concurrently (seen as a spurious CorruptMetadata).
        let mut out: Vec<(ChunkId, ChunkMeta)> = Vec::new();
        for shard in self.cache.iter() {
            out.extend(shard.read().iter().map(|(id, c)| (*id, c.meta.clone())));
        }
        out.sort_unstable_by_key(|(id, _)| *id);
        Ok(out)
    }

    /// Counters of the append journal since open.
    pub fn journal_stats(&self) -> crate::journal::JournalStats {
        self.journal.stats()
    }

    /// Chunk records in the metadata cache (every chunk with a committed or
    /// a pending version); one read lock per cache shard.
    /// Ids of the chunks with a committed version (the scrubber's pass),
    /// without cloning their records as [`Self::dump`] does.
    pub fn committed_chunk_ids(&self) -> Vec<ChunkId> {
        let mut ids = Vec::new();
        for shard in self.cache.iter() {
            ids.extend(shard.read().iter().filter(|(_, c)| c.meta.committed_ver > 0).map(|(id, _)| *id));
        }
        ids
    }

    pub fn chunk_count(&self) -> u64 {
        self.cache.iter().map(|shard| shard.read().len() as u64).sum()
    }

    /// Occupancy of every pool.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        SizeClass::all().map(|c| self.alloc.stats(c)).collect()
    }

    /// Pre-grows the pool that holds chunks of `chunk_len_bytes` until it has
    /// `free_blocks` free blocks (in whole 256-block `fallocate` steps), so
    /// later writes do not pay for growth. Returns the growth steps taken.
    pub fn reserve(&self, chunk_len_bytes: u64, free_blocks: u64) -> Result<u64> {
        let class = SizeClass::for_len(chunk_len_bytes.max(1))
            .ok_or_else(|| ChunkError::InvalidArgument(format!("{chunk_len_bytes} bytes exceed the chunk limit")))?;
        self.alloc.reserve(class, free_blocks)
    }

    /// Number of `fallocate` calls since open.
    pub fn fallocate_calls(&self) -> u64 {
        self.alloc.fallocate_calls()
    }

    /// File and byte offset of a block (tests use it to corrupt data).
    pub fn block_file(&self, block: BlockRef) -> Result<(PathBuf, u64)> {
        Ok(self.alloc.block_path(class_of(block)?, block.index))
    }

    /// Checks that the bitmaps hold exactly the blocks referenced by the
    /// persisted chunk records (no leak, no double allocation) and that the
    /// cache agrees with RocksDB. Only meaningful while no reader holds a
    /// handle to a retired block.
    pub fn check_invariants(&self) -> Result<()> {
        let records = self.dump()?;
        let mut referenced: HashSet<BlockRef> = HashSet::new();
        for (id, meta) in &records {
            for b in meta.blocks() {
                if !referenced.insert(b) {
                    return Err(ChunkError::CorruptMetadata(format!("{id}: block {b:?} referenced twice")));
                }
            }
            if self.meta(*id).as_ref() != Some(meta) {
                return Err(ChunkError::CorruptMetadata(format!("{id}: cache differs from RocksDB")));
            }
        }
        let cached: usize = self.cache.iter().map(|s| s.read().len()).sum();
        if cached != records.len() {
            return Err(ChunkError::CorruptMetadata(format!("{cached} cached chunks, {} records", records.len())));
        }
        for class in SizeClass::all() {
            let used: HashSet<u64> = self.alloc.used_blocks(class).into_iter().collect();
            let refs: HashSet<u64> = referenced.iter().filter(|b| b.class == class.raw()).map(|b| b.index).collect();
            if used != refs {
                return Err(ChunkError::CorruptMetadata(format!(
                    "class {}: bitmap has {:?} extra, {:?} missing",
                    class.raw(),
                    used.difference(&refs).collect::<Vec<_>>(),
                    refs.difference(&used).collect::<Vec<_>>()
                )));
            }
        }
        Ok(())
    }

    // ----- crash simulation -----

    /// Makes the next operation reaching `point` fail as if the process died
    /// there; the engine is then poisoned and must be dropped and reopened.
    /// Feature `crash-points` (tests only).
    #[cfg(feature = "crash-points")]
    pub fn inject_crash(&self, point: CrashPoint) {
        *self.crash_point.lock() = Some(point);
    }

    /// Drops the engine without any graceful shutdown work.
    #[doc(hidden)]
    pub fn simulate_crash(self) {
        drop(self);
    }

    #[cfg(feature = "crash-points")]
    fn crash_at(&self, point: CrashPoint) -> Result<()> {
        let mut cp = self.crash_point.lock();
        if *cp == Some(point) {
            *cp = None;
            self.poisoned.store(true, Ordering::SeqCst);
            return Err(ChunkError::InjectedCrash(point));
        }
        Ok(())
    }

    /// Without the `crash-points` feature a crash point costs nothing.
    #[cfg(not(feature = "crash-points"))]
    #[inline(always)]
    fn crash_at(&self, _point: CrashPoint) -> Result<()> {
        Ok(())
    }

    fn check_alive(&self) -> Result<()> {
        if self.is_failed() {
            return Err(ChunkError::Poisoned);
        }
        Ok(())
    }

    /// Whether the engine stopped (fail-stop): a block file's read, write or
    /// fdatasync failed, the journal or RocksDB failed a write, or a crash
    /// was injected. It takes no more updates and reads until reopened; the
    /// storage service reports its target offline.
    pub fn is_failed(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst) || self.alloc.io_failed()
    }

    /// Starts the power-loss model: from now on every write to a block file
    /// or the journal is remembered until its file is synced, so that
    /// [`ChunkEngine::power_cut`] can undo it. Call right after open.
    /// Feature `fault-injection` (tests only).
    #[cfg(feature = "fault-injection")]
    pub fn enable_power_loss_model(&self) {
        self.alloc.power.enable();
        self.journal.power.enable();
    }

    /// A simulated power cut (see [`crate::power`]): every block-file and
    /// journal sector written since its file's last sync is rolled back to a
    /// random point of its history (seeded). The engine must then be dropped
    /// without shutdown ([`ChunkEngine::simulate_crash`]) and reopened.
    #[cfg(feature = "fault-injection")]
    pub fn power_cut(&self, seed: u64) -> Result<crate::power::PowerCutStats> {
        let a = self.alloc.power.cut(seed).map_err(|e| ChunkError::io("power cut of the block files", e))?;
        let j = self.journal.power.cut(seed ^ 0x9E37_79B9_7F4A_7C15).map_err(|e| ChunkError::io("power cut of the journal", e))?;
        self.poisoned.store(true, Ordering::SeqCst);
        Ok(crate::power::PowerCutStats {
            files: a.files + j.files,
            writes: a.writes + j.writes,
            sectors_lost: a.sectors_lost + j.sectors_lost,
            sectors_kept: a.sectors_kept + j.sectors_kept,
        })
    }

    /// Disk-fault injection: the next block-file operation of kind `op`
    /// fails with `errno`. Feature `fault-injection` (tests only).
    #[cfg(feature = "fault-injection")]
    pub fn inject_io_fault(&self, op: crate::alloc::IoOp, errno: i32) {
        self.alloc.inject_io_fault(op, errno);
    }

    // ----- helpers -----

    fn cached(&self, chunk: ChunkId) -> Option<Arc<Cached>> {
        self.cache[shard_of(chunk, CACHE_SHARDS)].read().get(&chunk).cloned()
    }

    fn lock(&self, chunk: ChunkId) -> parking_lot::MutexGuard<'_, ()> {
        self.locks[shard_of(chunk, LOCK_STRIPES)].lock()
    }

    /// `Journal::append`; a failure (a failed `fdatasync` of a record that
    /// is already in the page cache) poisons the engine, as RocksDB stops
    /// taking writes after a failed WAL write: the state after a reopen is
    /// the one to trust.
    fn journal_append(&self, delta: &mut AppendDelta) -> Result<crate::journal::Appended> {
        self.journal.append(delta).inspect_err(|e| {
            tracing::error!(error = %e, chunk = %delta.chunk, "append journal write failed; the engine takes no more updates until reopened");
            self.poisoned.store(true, Ordering::SeqCst);
        })
    }

    fn sync_data(&self, handle: &BlockHandle) -> Result<()> {
        if self.config.sync_writes {
            handle.sync()?;
        }
        Ok(())
    }

    /// Syncs the blocks of a chunk with journal-only changes before a
    /// RocksDB record supersedes its journal records (their appended bytes
    /// may be on disk only in the records).
    fn sync_blocks(&self, c: &Cached) -> Result<()> {
        if let Some(h) = &c.committed_block {
            self.sync_data(h)?;
        }
        match (&c.pending_block, &c.committed_block) {
            (Some(p), Some(h)) if Arc::ptr_eq(p, h) => Ok(()),
            (Some(p), _) => self.sync_data(p),
            (None, _) => Ok(()),
        }
    }
}

fn check_engine_config(db: &DB, config: &EngineConfig) -> Result<()> {
    // The block layout depends on both the configured step and the byte cap.
    let mut want = config.blocks_per_grow.to_le_bytes().to_vec();
    want.extend_from_slice(&crate::layout::MAX_GROW_STEP_BYTES.to_le_bytes());
    match db.get(ENGINE_CONFIG_KEY)? {
        None => {
            let mut wo = WriteOptions::default();
            wo.set_sync(true);
            db.put_opt(ENGINE_CONFIG_KEY, &want, &wo)?;
            Ok(())
        }
        Some(v) if v.as_slice() == want => Ok(()),
        Some(v) => Err(ChunkError::InvalidArgument(format!(
            "engine directory was created with another block layout (blocks_per_grow and growth cap {}), \
             opened with blocks_per_grow {} and growth cap {} bytes",
            describe_layout_record(&v),
            config.blocks_per_grow,
            crate::layout::MAX_GROW_STEP_BYTES
        ))),
    }
}

fn describe_layout_record(v: &[u8]) -> String {
    let word = |i: usize| v.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    match (v.len(), word(0), word(1)) {
        (16, Some(blocks), Some(cap)) => format!("{blocks} blocks, {cap} bytes"),
        (8, Some(blocks), _) => format!("{blocks} blocks, no cap: a directory of an older version"),
        _ => format!("an unreadable record of {} bytes", v.len()),
    }
}

/// If `tag` identifies the pending, the committed or one of the recent
/// committed versions, the outcome of the original update. For a recent
/// (older) version, `pending_ver` and `committed_ver` are both that version:
/// it was committed, and nothing is to be done for it.
fn duplicate_outcome(meta: &ChunkMeta, tag: UpdateTag) -> Option<UpdateOutcome> {
    if tag == UpdateTag::default() {
        return None;
    }
    let mut out = UpdateOutcome {
        pending_ver: meta.committed_ver,
        committed_ver: meta.committed_ver,
        len_bytes: meta.committed.len_bytes,
        crc: meta.committed.crc,
        in_place: false,
        duplicate: true,
    };
    match &meta.pending {
        Some((ver, state)) if state.tag() == tag => {
            out.pending_ver = *ver;
            if let PendingState::Data(v) = state {
                (out.len_bytes, out.crc) = (v.len_bytes, v.crc);
            } else {
                (out.len_bytes, out.crc) = (0, 0);
            }
            Some(out)
        }
        // The committed version's request, retried (possibly while another
        // write is pending).
        _ if meta.committed_ver > 0 && meta.committed.tag == tag => Some(out),
        _ => {
            let old = meta.recent.iter().rev().find(|r| r.tag == tag)?;
            Some(UpdateOutcome {
                pending_ver: old.version,
                committed_ver: old.version,
                len_bytes: old.len_bytes,
                crc: old.crc,
                in_place: false,
                duplicate: true,
            })
        }
    }
}

/// Picks the version a read of `mode` sees.
fn select_version(chunk: ChunkId, c: &Cached, mode: ReadMode) -> Result<(u64, &VersionData, Option<&Arc<BlockHandle>>, bool)> {
    let committed = (c.meta.committed_ver, &c.meta.committed, c.committed_block.as_ref(), false);
    match (&c.meta.pending, mode) {
        (None, _) if c.meta.committed_ver == 0 => Err(ChunkError::NotFound(chunk)),
        (None, _) => Ok(committed),
        (Some((pv, _)), ReadMode::Strict) => Err(ChunkError::Uncommitted { chunk, committed: c.meta.committed_ver, pending: *pv }),
        (Some(_), ReadMode::CommittedOnly) if c.meta.committed_ver == 0 => Err(ChunkError::NotFound(chunk)),
        (Some(_), ReadMode::CommittedOnly) => Ok(committed),
        (Some((_, PendingState::Removed { .. })), ReadMode::Relaxed) => Err(ChunkError::NotFound(chunk)),
        (Some((pv, PendingState::Data(v))), ReadMode::Relaxed) => Ok((*pv, v, c.pending_block.as_ref(), true)),
    }
}

/// Reads `[offset, offset+len)` of a version (clamped to its length),
/// verifying the checksum of every page it touches.
fn read_range(chunk: ChunkId, v: &VersionData, handle: Option<&Arc<BlockHandle>>, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>> {
    let chunk_len = v.len_bytes as u64;
    let start = offset_bytes.min(chunk_len);
    let end = offset_bytes.saturating_add(len_bytes).min(chunk_len);
    if start == end {
        return Ok(Vec::new());
    }
    let handle = handle.ok_or_else(|| ChunkError::CorruptMetadata(format!("{chunk}: content without a block")))?;
    let page = handle.class().crc_page_bytes();
    let first_page = start / page;
    let read_start = first_page * page;
    let read_end = end.div_ceil(page).saturating_mul(page).min(chunk_len);
    let mut buf = vec![0u8; (read_end - read_start) as usize];
    handle.read_at(read_start, &mut buf)?;
    for (i, piece) in buf.chunks(page as usize).enumerate() {
        let page_no = first_page as usize + i;
        let expected =
            *v.page_crcs.get(page_no).ok_or_else(|| ChunkError::CorruptMetadata(format!("{chunk}: no checksum for page {page_no}")))?;
        let actual = checksum::crc32c(piece);
        if actual != expected {
            tracing::error!(%chunk, page_no, "checksum mismatch");
            return Err(ChunkError::ChecksumMismatch {
                chunk,
                what: format!("page {page_no} ({page} bytes) of {handle:?}"),
                expected,
                actual,
            });
        }
    }
    let head = (start - read_start) as usize;
    buf.truncate((end - read_start) as usize);
    if head > 0 {
        buf.drain(..head);
    }
    Ok(buf)
}

/// Fails with `ChecksumMismatch` if the caller's CRC of the payload
/// (`want`) differs from the one the engine computed (`got`).
fn check_data_crc(chunk: ChunkId, want: Option<u32>, got: u32) -> Result<()> {
    match want {
        Some(expected) if expected != got => {
            Err(ChunkError::ChecksumMismatch { chunk, what: "update payload (CRC32C given by the caller)".into(), expected, actual: got })
        }
        _ => Ok(()),
    }
}

/// `base` (nothing pending) after an in-place append of `data` as version
/// `new_ver`: committed (`commit`) or pending in the same block.
fn with_append(base: &Cached, chain_ver: u32, new_ver: u64, data: VersionData, commit: bool) -> Cached {
    let meta = if commit {
        ChunkMeta { chain_ver, committed_ver: new_ver, committed: data, pending: None, recent: base.meta.recent_after_commit() }
    } else {
        ChunkMeta {
            chain_ver,
            committed_ver: base.meta.committed_ver,
            committed: base.meta.committed.clone(),
            pending: Some((new_ver, PendingState::Data(data))),
            recent: base.meta.recent.clone(),
        }
    };
    let pending_block = if commit { None } else { base.committed_block.clone() };
    Cached { meta, committed_block: base.committed_block.clone(), pending_block, journaled: true }
}

/// `old` with its pending data version committed; `journaled`: by a
/// journal record (else by the RocksDB record being written).
fn committed_pending(old: &Cached, journaled: bool) -> Result<Cached> {
    let Some((ver, PendingState::Data(v))) = &old.meta.pending else {
        return Err(ChunkError::CorruptMetadata("commit of a chunk without pending data".into()));
    };
    Ok(Cached {
        meta: ChunkMeta {
            chain_ver: old.meta.chain_ver,
            committed_ver: *ver,
            committed: v.clone(),
            pending: None,
            recent: old.meta.recent_after_commit(),
        },
        committed_block: old.pending_block.clone(),
        pending_block: None,
        journaled,
    })
}

/// `old` with a journal record applied (replay at open). The record must
/// follow exactly from `old`: an append extends its committed content in
/// its block with nothing pending; a commit promotes the matching in-place
/// pending version.
fn apply_delta(old: &Cached, d: &AppendDelta) -> Result<Cached> {
    let c = &old.meta.committed;
    let base_matches = c.block == Some(d.block) && c.len_bytes == d.base_len && c.crc == d.base_crc && d.new_len >= d.base_len;
    let mismatch = || {
        ChunkError::CorruptMetadata(format!(
            "{}: journal record {} ({:?} v{} len {} in {:?}) does not follow from the chunk (v{} len {} in {:?}, pending {:?})",
            d.chunk,
            d.lsn,
            d.kind,
            d.new_ver,
            d.new_len,
            d.block,
            old.meta.committed_ver,
            c.len_bytes,
            c.block,
            old.meta.pending_ver()
        ))
    };
    if d.kind == DeltaKind::Commit {
        let pending_matches = matches!(&old.meta.pending, Some((ver, PendingState::Data(v)))
            if *ver == d.new_ver && v.block == Some(d.block) && v.len_bytes == d.new_len && v.crc == d.new_crc);
        if !(base_matches && pending_matches) {
            return Err(mismatch());
        }
        return committed_pending(old, true);
    }
    let class = SizeClass::new(d.block.class);
    let (Some(class), true) = (class, base_matches && old.meta.pending.is_none() && old.meta.committed_ver + 1 == d.new_ver) else {
        return Err(mismatch());
    };
    let page = class.crc_page_bytes();
    let first_page = (d.base_len as u64 / page) as usize;
    let mut page_crcs = c.page_crcs.get(..first_page).unwrap_or_default().to_vec();
    page_crcs.extend_from_slice(&d.pages);
    if page_crcs.len() as u64 != (d.new_len as u64).div_ceil(page) || d.new_len as u64 > class.block_bytes() {
        return Err(ChunkError::CorruptMetadata(format!("{}: journal record {} has a bad page table", d.chunk, d.lsn)));
    }
    let data = VersionData { block: Some(d.block), len_bytes: d.new_len, crc: d.new_crc, tag: d.tag, page_crcs };
    Ok(with_append(old, d.chain_ver, d.new_ver, data, d.kind == DeltaKind::Append))
}

/// Retires every handle of `old` whose block `keep` no longer references.
fn retire_unreferenced(old: &Cached, keep: &HashSet<BlockRef>) {
    let mut seen = HashSet::new();
    for h in old.handles() {
        let r = BlockRef { class: h.class().raw(), index: h.index() };
        if !keep.contains(&r) && seen.insert(r) {
            h.retire();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_block_is_freed_only_when_the_last_reader_lets_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = ChunkEngine::open(dir.path(), EngineConfig { blocks_per_grow: 4, sync_writes: false, ..EngineConfig::default() })
            .expect("open");
        let c = ChunkId::new(InodeId(1), 0);
        let write = |off: u64, data: &[u8], request: u64| {
            let req = UpdateRequest {
                chunk: c,
                chain_ver: 1,
                kind: UpdateKind::Write { offset_bytes: off, data },
                tag: UpdateTag { client: 1, request },
                expected_ver: None,
                chunk_size_hint_bytes: None,
            };
            let out = e.update(&req).expect("update");
            e.commit(c, out.pending_ver).expect("commit");
        };
        write(0, b"old data", 1);
        // A reader holds the cached entry (and so the block handle).
        let reader = e.cached(c).expect("cached");
        let old_block = reader.committed_block.as_ref().map(|h| h.index()).expect("block");
        write(0, b"new data", 2);
        let class0 = SizeClass::new(0).expect("class");
        assert!(e.alloc.used_blocks(class0).contains(&old_block), "freed under a reader");
        let data = read_range(c, &reader.meta.committed, reader.committed_block.as_ref(), 0, 100).expect("read");
        assert_eq!(data, b"old data");
        drop(reader);
        assert!(!e.alloc.used_blocks(class0).contains(&old_block), "not freed after the reader left");
        e.check_invariants().expect("invariants");
    }
}
