//! Block pools: per size class, 256 data files, an in-memory occupancy
//! bitmap, growth by one `fallocate` of the pool's step of contiguous blocks
//! (`blocks_per_grow`, capped in bytes by [`crate::layout::MAX_GROW_STEP_BYTES`]).
//!
//! The bitmap is never persisted: at open it is rebuilt from the chunk
//! metadata (every block referenced by a committed or pending version is
//! used). Only the number of growth steps per pool is persisted, under
//! `p<class>`, with a synchronous write right after the `fallocate` and
//! before any block of the new range is handed out, so metadata can never
//! reference a block beyond the recorded capacity.

use crate::error::{ChunkError, Result};
use crate::layout::{locate, pool_blocks_per_grow, SizeClass, FILES_PER_POOL, NUM_CLASSES};
use parking_lot::Mutex;
use rocksdb::{WriteOptions, DB};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Key of a pool's persisted growth-step count.
pub(crate) fn pool_key(class: SizeClass) -> [u8; 2] {
    [b'p', class.raw()]
}

#[derive(Default)]
struct Bitmap {
    words: Vec<u64>,
    len_bits: u64,
    used_bits: u64,
    /// No free bit exists below word `hint`.
    hint: usize,
}

impl Bitmap {
    fn grow_to(&mut self, len_bits: u64) {
        self.len_bits = len_bits;
        self.words.resize(len_bits.div_ceil(64) as usize, 0);
    }

    fn get(&self, bit: u64) -> bool {
        self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }

    fn set(&mut self, bit: u64) {
        debug_assert!(!self.get(bit));
        self.words[(bit / 64) as usize] |= 1 << (bit % 64);
        self.used_bits += 1;
    }

    fn clear(&mut self, bit: u64) {
        debug_assert!(self.get(bit));
        self.words[(bit / 64) as usize] &= !(1 << (bit % 64));
        self.used_bits -= 1;
        self.hint = self.hint.min((bit / 64) as usize);
    }

    /// Lowest free bit, so freed blocks are reused before fresh ones.
    fn first_free(&mut self) -> Option<u64> {
        while self.hint < self.words.len() {
            let w = self.words[self.hint];
            if w != u64::MAX {
                let bit = self.hint as u64 * 64 + (!w).trailing_zeros() as u64;
                return (bit < self.len_bits).then_some(bit);
            }
            self.hint += 1;
        }
        None
    }
}

struct PoolState {
    grow_steps: u64,
    bitmap: Bitmap,
}

struct Pool {
    class: SizeClass,
    /// Blocks per growth step of this pool (see `layout::pool_blocks_per_grow`).
    step_blocks: u64,
    dir: PathBuf,
    files: Vec<OnceLock<File>>,
    state: Mutex<PoolState>,
}

/// Occupancy figures of one pool, for tests and monitoring.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    pub class: u8,
    pub block_bytes: u64,
    pub grow_steps: u64,
    pub capacity_blocks: u64,
    pub used_blocks: u64,
}

/// All eleven pools of one engine.
pub struct Allocator {
    db: Arc<DB>,
    pools: Vec<Pool>,
    fallocate_calls: AtomicU64,
    /// Set by the first failed read, write or fdatasync of a block file: the
    /// disk is suspect and the engine stops (fail-stop, as 3FS does).
    io_failed: AtomicBool,
    /// The next block-file operation of this kind fails with this errno.
    #[cfg(feature = "fault-injection")]
    fault: Mutex<Option<(IoOp, i32)>>,
    /// Unsynced block-file writes, for simulated power cuts.
    #[cfg(feature = "fault-injection")]
    pub(crate) power: crate::power::PowerLog,
}

/// A kind of block-file operation (disk-fault injection, fail-stop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    Sync,
}

impl Allocator {
    /// Opens the pools under `root`, reading each pool's growth count and
    /// checking that its files cover it. Bitmaps start empty; the engine
    /// marks referenced blocks with [`Allocator::mark_used`].
    pub fn open(root: &Path, db: Arc<DB>, blocks_per_grow: u64) -> Result<Allocator> {
        let mut pools = Vec::with_capacity(NUM_CLASSES);
        for class in SizeClass::all() {
            pools.push(Self::open_pool(root, &db, class, blocks_per_grow)?);
        }
        Ok(Allocator {
            db,
            pools,
            fallocate_calls: AtomicU64::new(0),
            io_failed: AtomicBool::new(false),
            #[cfg(feature = "fault-injection")]
            fault: Mutex::new(None),
            #[cfg(feature = "fault-injection")]
            power: crate::power::PowerLog::default(),
        })
    }

    fn open_pool(root: &Path, db: &DB, class: SizeClass, blocks_per_grow: u64) -> Result<Pool> {
        let dir = root.join(format!("class-{:02}-{}k", class.raw(), class.block_bytes() / 1024));
        std::fs::create_dir_all(&dir).map_err(|e| ChunkError::io(format!("creating {dir:?}"), e))?;
        let grow_steps = match db.get(pool_key(class))? {
            None => 0,
            Some(v) => u64::from_le_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| ChunkError::CorruptMetadata(format!("pool record of class {} has {} bytes", class.raw(), v.len())))?,
            ),
        };
        let step_blocks = pool_blocks_per_grow(class, blocks_per_grow);
        let pool = Pool {
            class,
            step_blocks,
            dir,
            files: (0..FILES_PER_POOL).map(|_| OnceLock::new()).collect(),
            state: Mutex::new(PoolState { grow_steps, bitmap: Bitmap::default() }),
        };
        pool.state.lock().bitmap.grow_to(grow_steps * step_blocks);
        pool.check_files_cover(grow_steps)?;
        Ok(pool)
    }

    /// Number of `fallocate` calls made since open.
    pub fn fallocate_calls(&self) -> u64 {
        self.fallocate_calls.load(Ordering::Relaxed)
    }

    /// Marks a block referenced by metadata during open. A block beyond the
    /// pool capacity or referenced twice is corrupt metadata.
    pub fn mark_used(&self, class: SizeClass, idx: u64) -> Result<()> {
        let mut st = self.pools[class.index()].state.lock();
        if idx >= st.bitmap.len_bits {
            return Err(ChunkError::CorruptMetadata(format!(
                "block {idx} of class {} is beyond the pool capacity {}",
                class.raw(),
                st.bitmap.len_bits
            )));
        }
        if st.bitmap.get(idx) {
            return Err(ChunkError::CorruptMetadata(format!("block {idx} of class {} is referenced twice", class.raw())));
        }
        st.bitmap.set(idx);
        Ok(())
    }

    /// Marks a block referenced by a record read at open and returns its handle.
    pub fn adopt(self: &Arc<Self>, class: SizeClass, idx: u64) -> Result<Arc<BlockHandle>> {
        self.mark_used(class, idx)?;
        Ok(Arc::new(BlockHandle { class, idx, alloc: Arc::clone(self), retired: AtomicBool::new(false) }))
    }

    /// Takes the lowest free block of `class`, growing the pool by one
    /// `fallocate` step if none is free.
    pub fn allocate(self: &Arc<Self>, class: SizeClass) -> Result<Arc<BlockHandle>> {
        let pool = &self.pools[class.index()];
        let mut st = pool.state.lock();
        let idx = match st.bitmap.first_free() {
            Some(idx) => idx,
            None => {
                self.grow(pool, &mut st)?;
                st.bitmap.first_free().ok_or_else(|| ChunkError::NoSpace("pool grew but has no free block".into()))?
            }
        };
        st.bitmap.set(idx);
        Ok(Arc::new(BlockHandle { class, idx, alloc: Arc::clone(self), retired: AtomicBool::new(false) }))
    }

    /// Grows the pool of `class` (whole growth steps) until at least
    /// `free_blocks` blocks are free. Returns the number of growth steps.
    pub fn reserve(&self, class: SizeClass, free_blocks: u64) -> Result<u64> {
        let pool = &self.pools[class.index()];
        let mut st = pool.state.lock();
        let mut steps = 0;
        while st.bitmap.len_bits - st.bitmap.used_bits < free_blocks {
            self.grow(pool, &mut st)?;
            steps += 1;
        }
        Ok(steps)
    }

    fn grow(&self, pool: &Pool, st: &mut PoolState) -> Result<()> {
        let step = st.grow_steps;
        let first = locate(pool.class, step * pool.step_blocks, pool.step_blocks);
        let len_bytes = pool.step_blocks * pool.class.block_bytes();
        let file = pool.file(first.file_index)?;
        fallocate(file, first.offset_bytes, len_bytes).map_err(|e| {
            let what = format!("fallocate {len_bytes} bytes in class {}", pool.class.raw());
            if e.raw_os_error() == Some(libc::ENOSPC) {
                ChunkError::NoSpace(format!("{what}: the disk is full"))
            } else {
                ChunkError::io(what, e)
            }
        })?;
        // The new file size must be durable before the record that relies on
        // it, and so must the file's directory entry: the first growth into a
        // file creates it, and after a power cut a file whose entry was never
        // synced may be gone (the pool record would then name blocks of a
        // missing file). Growth is rare (once per `blocks_per_grow` blocks).
        file.sync_all().map_err(|e| ChunkError::io("fsync after fallocate", e))?;
        File::open(&pool.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| ChunkError::io(format!("fsync of the directory {:?}", pool.dir), e))?;
        self.fallocate_calls.fetch_add(1, Ordering::Relaxed);
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.put_opt(pool_key(pool.class), (step + 1).to_le_bytes(), &wo)?;
        st.grow_steps = step + 1;
        st.bitmap.grow_to(st.grow_steps * pool.step_blocks);
        tracing::debug!(class = pool.class.raw(), step, "pool grew by {} blocks", pool.step_blocks);
        Ok(())
    }

    fn free(&self, class: SizeClass, idx: u64) {
        let mut st = self.pools[class.index()].state.lock();
        debug_assert!(idx < st.bitmap.len_bits);
        if idx < st.bitmap.len_bits && st.bitmap.get(idx) {
            st.bitmap.clear(idx);
        } else {
            tracing::error!(class = class.raw(), idx, "freeing a block that is not allocated");
        }
    }

    /// Set of used block indexes of `class` (for invariant checks).
    pub fn used_blocks(&self, class: SizeClass) -> Vec<u64> {
        let st = self.pools[class.index()].state.lock();
        (0..st.bitmap.len_bits).filter(|&b| st.bitmap.get(b)).collect()
    }

    pub fn stats(&self, class: SizeClass) -> PoolStats {
        let st = self.pools[class.index()].state.lock();
        PoolStats {
            class: class.raw(),
            block_bytes: class.block_bytes(),
            grow_steps: st.grow_steps,
            capacity_blocks: st.bitmap.len_bits,
            used_blocks: st.bitmap.used_bits,
        }
    }

    fn file_of(&self, class: SizeClass, idx: u64) -> Result<(&File, u64)> {
        let pool = &self.pools[class.index()];
        let loc = locate(class, idx, pool.step_blocks);
        let file = pool.file(loc.file_index)?;
        Ok((file, loc.offset_bytes))
    }

    pub fn read_at(&self, class: SizeClass, idx: u64, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        debug_assert!(offset_bytes + buf.len() as u64 <= class.block_bytes());
        let (file, base) = self.file_of(class, idx)?;
        let r = self.injected(IoOp::Read).and_then(|()| file.read_exact_at(buf, base + offset_bytes));
        self.checked(r, || format!("reading block {idx} of class {}", class.raw()))
    }

    pub fn write_at(&self, class: SizeClass, idx: u64, offset_bytes: u64, data: &[u8]) -> Result<()> {
        assert!(offset_bytes + data.len() as u64 <= class.block_bytes(), "write past the block end");
        let (file, base) = self.file_of(class, idx)?;
        #[cfg(feature = "fault-injection")]
        if self.power.is_enabled() {
            let mut old = vec![0u8; data.len()];
            let r = file.read_exact_at(&mut old, base + offset_bytes).and_then(|()| self.power.record(file, base + offset_bytes, old));
            self.checked(r, || "recording a write for the power-loss model".to_string())?;
        }
        let r = self.injected(IoOp::Write).and_then(|()| file.write_all_at(data, base + offset_bytes));
        self.checked(r, || format!("writing block {idx} of class {}", class.raw()))
    }

    pub fn sync_block(&self, class: SizeClass, idx: u64) -> Result<()> {
        let (file, _) = self.file_of(class, idx)?;
        #[cfg(feature = "fault-injection")]
        let mark = self.power.mark(file);
        let r = self.injected(IoOp::Sync).and_then(|()| file.sync_data());
        #[cfg(feature = "fault-injection")]
        if r.is_ok() {
            self.power.synced(file, mark);
        }
        self.checked(r, || "fdatasync of a block file".to_string())
    }

    /// Whether a block-file operation has failed since open (fail-stop).
    pub fn io_failed(&self) -> bool {
        self.io_failed.load(Ordering::SeqCst)
    }

    /// Makes the next block-file operation of kind `op` fail with `errno`
    /// (EIO, ENOSPC, ...). Feature `fault-injection` (tests only).
    #[cfg(feature = "fault-injection")]
    pub fn inject_io_fault(&self, op: IoOp, errno: i32) {
        *self.fault.lock() = Some((op, errno));
    }

    #[cfg(feature = "fault-injection")]
    fn injected(&self, op: IoOp) -> std::io::Result<()> {
        let mut fault = self.fault.lock();
        match *fault {
            Some((o, errno)) if o == op => {
                *fault = None;
                Err(std::io::Error::from_raw_os_error(errno))
            }
            _ => Ok(()),
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    #[inline(always)]
    fn injected(&self, _op: IoOp) -> std::io::Result<()> {
        Ok(())
    }

    /// An I/O error on a block file marks the allocator failed (logged once).
    fn checked<T>(&self, r: std::io::Result<T>, context: impl FnOnce() -> String) -> Result<T> {
        r.map_err(|e| {
            let context = context();
            if !self.io_failed.swap(true, Ordering::SeqCst) {
                tracing::error!(error = %e, %context, "block file I/O failed; the engine stops (fail-stop) until reopened");
            }
            ChunkError::io(context, e)
        })
    }

    /// Path of the file holding a block and the block's offset (tests use it
    /// to corrupt data).
    pub fn block_path(&self, class: SizeClass, idx: u64) -> (PathBuf, u64) {
        let pool = &self.pools[class.index()];
        let loc = locate(class, idx, pool.step_blocks);
        (pool.file_path(loc.file_index), loc.offset_bytes)
    }
}

impl Pool {
    fn file_path(&self, file_index: u64) -> PathBuf {
        self.dir.join(format!("data-{file_index:03}"))
    }

    fn file(&self, file_index: u64) -> Result<&File> {
        let slot = &self.files[file_index as usize];
        if let Some(f) = slot.get() {
            return Ok(f);
        }
        let path = self.file_path(file_index);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| ChunkError::io(format!("opening {path:?}"), e))?;
        Ok(slot.get_or_init(|| f))
    }

    /// Every recorded growth step must be backed by its file range.
    fn check_files_cover(&self, grow_steps: u64) -> Result<()> {
        let blocks_per_grow = self.step_blocks;
        for step in 0..grow_steps.min(FILES_PER_POOL) {
            let last_step = step + (grow_steps - 1 - step) / FILES_PER_POOL * FILES_PER_POOL;
            let end_idx = (last_step + 1) * blocks_per_grow - 1;
            let loc = locate(self.class, end_idx, blocks_per_grow);
            let need = loc.offset_bytes + self.class.block_bytes();
            let have = self.file(loc.file_index)?.metadata().map_err(|e| ChunkError::io("stat of a block file", e))?.len();
            if have < need {
                return Err(ChunkError::CorruptMetadata(format!(
                    "{:?} has {have} bytes but growth record needs {need}",
                    self.file_path(loc.file_index)
                )));
            }
        }
        Ok(())
    }
}

fn fallocate(file: &File, offset_bytes: u64, len_bytes: u64) -> std::io::Result<()> {
    let off = i64::try_from(offset_bytes).map_err(|_| std::io::Error::other("offset overflow"))?;
    let len = i64::try_from(len_bytes).map_err(|_| std::io::Error::other("length overflow"))?;
    // SAFETY: plain syscall on a valid open fd; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, off, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A reference-counted handle to an allocated block. The engine's metadata
/// cache holds one per referenced block and readers clone it for the
/// duration of a read. When metadata stops referencing the block the engine
/// [`retire`](BlockHandle::retire)s it; the bit is cleared when the last
/// clone drops, so a reader of an old version never sees its block reused.
pub struct BlockHandle {
    class: SizeClass,
    idx: u64,
    alloc: Arc<Allocator>,
    retired: AtomicBool,
}

impl BlockHandle {
    pub fn class(&self) -> SizeClass {
        self.class
    }

    pub fn index(&self) -> u64 {
        self.idx
    }

    pub fn retire(&self) {
        let was = self.retired.swap(true, Ordering::AcqRel);
        debug_assert!(!was, "block retired twice");
    }

    pub fn read_at(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.alloc.read_at(self.class, self.idx, offset_bytes, buf)
    }

    pub fn write_at(&self, offset_bytes: u64, data: &[u8]) -> Result<()> {
        self.alloc.write_at(self.class, self.idx, offset_bytes, data)
    }

    pub fn sync(&self) -> Result<()> {
        self.alloc.sync_block(self.class, self.idx)
    }
}

impl std::fmt::Debug for BlockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "block(class {}, #{})", self.class.raw(), self.idx)
    }
}

impl Drop for BlockHandle {
    fn drop(&mut self) {
        if self.retired.load(Ordering::Acquire) {
            self.alloc.free(self.class, self.idx);
        }
    }
}
