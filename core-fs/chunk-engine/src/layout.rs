//! Size classes and block addressing.
//!
//! Class `k` (0..=10) has blocks of `64 KiB << k`. Every class is a pool of
//! [`FILES_PER_POOL`] files. The pool grows in steps of
//! [`pool_blocks_per_grow`] blocks (the configured `blocks_per_grow`, capped so
//! one step is at most [`MAX_GROW_STEP_BYTES`]); growth step `g` is one
//! contiguous `fallocate` range appended to file `g % 256`. A block is named
//! by its pool-wide index `idx = g * step_blocks + i`.

/// Number of block size classes.
pub const NUM_CLASSES: usize = 11;
/// Smallest block size.
pub const MIN_BLOCK_BYTES: u64 = 64 * 1024;
/// Largest block size, and the largest chunk the engine stores.
pub const MAX_CHUNK_BYTES: u64 = MIN_BLOCK_BYTES << (NUM_CLASSES - 1);
/// Data files per size-class pool.
pub const FILES_PER_POOL: u64 = 256;
/// Default number of blocks created by one pool growth step.
pub const DEFAULT_BLOCKS_PER_GROW: u64 = 256;
/// Largest single growth step of a pool. Without the cap, 256 blocks of the
/// 64 MiB class would be one 16 GiB `fallocate` for the first chunk stored.
/// Part of the on-disk layout: the engine records it and refuses to open a
/// directory created with another value.
pub const MAX_GROW_STEP_BYTES: u64 = 16 * 1024 * 1024;

/// Blocks per growth step of `class`'s pool: `blocks_per_grow`, capped at
/// [`MAX_GROW_STEP_BYTES`], at least one block.
pub fn pool_blocks_per_grow(class: SizeClass, blocks_per_grow: u64) -> u64 {
    blocks_per_grow.min(MAX_GROW_STEP_BYTES / class.block_bytes()).max(1)
}

/// A block size class, `0..NUM_CLASSES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SizeClass(u8);

impl SizeClass {
    pub fn new(k: u8) -> Option<SizeClass> {
        ((k as usize) < NUM_CLASSES).then_some(SizeClass(k))
    }

    pub fn index(self) -> usize {
        self.0 as usize
    }

    pub fn raw(self) -> u8 {
        self.0
    }

    pub fn block_bytes(self) -> u64 {
        MIN_BLOCK_BYTES << self.0
    }

    /// Smallest class whose block holds `len_bytes`; `None` above the max.
    pub fn for_len(len_bytes: u64) -> Option<SizeClass> {
        (0..NUM_CLASSES as u8).map(SizeClass).find(|c| c.block_bytes() >= len_bytes)
    }

    /// Granularity of the per-page checksums of a chunk stored in this class:
    /// 4 KiB up to 4 MiB blocks, then `block/1024` so a table never exceeds
    /// 1024 entries.
    pub fn crc_page_bytes(self) -> u64 {
        (self.block_bytes() / 1024).max(4096)
    }

    pub fn all() -> impl Iterator<Item = SizeClass> {
        (0..NUM_CLASSES as u8).map(SizeClass)
    }
}

/// Where a block lives on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLocation {
    pub file_index: u64,
    pub offset_bytes: u64,
}

/// Maps a pool-wide block index to file and offset.
pub fn locate(class: SizeClass, idx: u64, blocks_per_grow: u64) -> BlockLocation {
    let step = idx / blocks_per_grow;
    let within = idx % blocks_per_grow;
    let file_index = step % FILES_PER_POOL;
    let round = step / FILES_PER_POOL;
    let offset_blocks = round * blocks_per_grow + within;
    BlockLocation { file_index, offset_bytes: offset_blocks * class.block_bytes() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_64k_to_64m() {
        assert_eq!(SizeClass::for_len(0).map(SizeClass::index), Some(0));
        assert_eq!(SizeClass::for_len(64 * 1024).map(SizeClass::index), Some(0));
        assert_eq!(SizeClass::for_len(64 * 1024 + 1).map(SizeClass::index), Some(1));
        assert_eq!(SizeClass::for_len(MAX_CHUNK_BYTES).map(SizeClass::index), Some(10));
        assert_eq!(SizeClass::for_len(MAX_CHUNK_BYTES + 1), None);
        assert_eq!(MAX_CHUNK_BYTES, 64 * 1024 * 1024);
    }

    #[test]
    fn growth_steps_are_contiguous_in_one_file() {
        let c = SizeClass::new(0).unwrap();
        let a = locate(c, 0, 256);
        let b = locate(c, 255, 256);
        assert_eq!(a.file_index, b.file_index);
        assert_eq!(b.offset_bytes - a.offset_bytes, 255 * c.block_bytes());
        assert_eq!(locate(c, 256, 256).file_index, 1);
        let wrap = locate(c, 256 * 256, 256);
        assert_eq!(wrap.file_index, 0);
        assert_eq!(wrap.offset_bytes, 256 * c.block_bytes());
    }

    #[test]
    fn growth_steps_are_capped_in_bytes() {
        let small = SizeClass::new(0).unwrap();
        assert_eq!(pool_blocks_per_grow(small, 256), 256);
        assert_eq!(pool_blocks_per_grow(small, 8), 8);
        let mid = SizeClass::new(6).unwrap();
        assert_eq!(pool_blocks_per_grow(mid, 256) * mid.block_bytes(), MAX_GROW_STEP_BYTES);
        let big = SizeClass::new(10).unwrap();
        assert_eq!(pool_blocks_per_grow(big, 256), 1);
        for c in SizeClass::all() {
            assert!(pool_blocks_per_grow(c, 256) * c.block_bytes() <= MAX_GROW_STEP_BYTES.max(c.block_bytes()));
        }
    }
}
