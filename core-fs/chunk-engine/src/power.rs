//! The power-loss model (feature `fault-injection`, tests only).
//!
//! A process crash keeps every `write(2)` and every store into a shared
//! mapping: they are in the page cache. A power cut keeps only what an
//! `fsync`/`fdatasync` made durable; of the rest, each disk sector may hold
//! any of the versions written to it since the last sync (drives reorder
//! their cache), and a sector is the unit that is written whole or not.
//!
//! [`PowerLog`] sits on the engine's two I/O paths to its own files — block
//! files ([`crate::alloc::Allocator`]) and the append journal
//! ([`crate::journal`]) — and keeps, per file, an undo record (offset, the
//! bytes before) of every write since the file's last completed sync.
//! [`PowerLog::cut`] then rolls each sector back to a random point of its
//! own history: newest write first, a coin per (sector, write) decides
//! whether that write reached the disk (stop: the sector keeps it and
//! everything older) or not (the sector goes back to the bytes before it,
//! and the next older write is tossed for). Sectors are 512 bytes, the
//! smallest a drive writes atomically.
//!
//! | event | undo records of the file |
//! |---|---|
//! | write `[off, off+len)` | + (off, bytes before) |
//! | sync that started after records `..m` were made | records `..m` dropped (durable) |
//! | power cut | each sector rolled back to a random prefix of its writes; all records dropped |
//!
//! RocksDB is not on this seam: every RocksDB write of the engine is a
//! synced batch when `sync_writes` is set, and RocksDB makes a synced batch
//! durable before it returns, so the state a process crash leaves in
//! RocksDB is the state a power cut leaves (the model relies on RocksDB's
//! own guarantee there, which RocksDB tests with its fault-injection
//! environment).

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

/// The unit a drive writes whole.
pub const SECTOR_BYTES: u64 = 512;

struct FileUndo {
    /// A descriptor of the same file, to write the old bytes back.
    file: File,
    /// Writes since the last sync, oldest first: (offset, bytes before).
    undo: Vec<(u64, Vec<u8>)>,
}

/// What a power cut did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerCutStats {
    /// Files with writes not yet synced.
    pub files: u64,
    /// Unsynced writes.
    pub writes: u64,
    /// Sectors rolled back (at least one write of theirs lost).
    pub sectors_lost: u64,
    /// Sectors that kept their newest unsynced write.
    pub sectors_kept: u64,
}

/// Undo records of unsynced writes, per file (keyed by descriptor: every
/// file the engine writes stays open as long as the engine).
#[derive(Default)]
pub struct PowerLog {
    enabled: AtomicBool,
    files: Mutex<HashMap<i32, FileUndo>>,
}

impl PowerLog {
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::SeqCst);
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Records that `[offset, offset + old.len())` of `file` is about to be
    /// overwritten; `old` holds its bytes now.
    pub fn record(&self, file: &File, offset: u64, old: Vec<u8>) -> std::io::Result<()> {
        let mut files = self.files.lock();
        let f = match files.entry(file.as_raw_fd()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(FileUndo { file: file.try_clone()?, undo: Vec::new() }),
        };
        f.undo.push((offset, old));
        Ok(())
    }

    /// How many writes of `file` a sync starting now covers.
    pub fn mark(&self, file: &File) -> usize {
        self.files.lock().get(&file.as_raw_fd()).map_or(0, |f| f.undo.len())
    }

    /// A sync of `file` that started at `mark` completed: those writes are durable.
    pub fn synced(&self, file: &File, mark: usize) {
        if let Some(f) = self.files.lock().get_mut(&file.as_raw_fd()) {
            let n = mark.min(f.undo.len());
            f.undo.drain(..n);
        }
    }

    /// The power cut: rolls every sector with unsynced writes back to a
    /// random prefix of its history (seeded, so a failing case replays).
    /// The caller then drops the engine without a graceful shutdown.
    pub fn cut(&self, seed: u64) -> std::io::Result<PowerCutStats> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut stats = PowerCutStats::default();
        let mut files = self.files.lock();
        let mut fds: Vec<i32> = files.keys().copied().collect();
        fds.sort_unstable();
        for fd in fds {
            let Some(f) = files.get_mut(&fd) else { continue };
            if f.undo.is_empty() {
                continue;
            }
            stats.files += 1;
            stats.writes += f.undo.len() as u64;
            // Sector → settled (a write of it reached the disk: older ones did too).
            let mut settled: HashMap<u64, ()> = HashMap::new();
            for (offset, old) in f.undo.iter().rev() {
                let end = offset + old.len() as u64;
                let mut sector = offset / SECTOR_BYTES;
                while sector * SECTOR_BYTES < end {
                    let lo = (sector * SECTOR_BYTES).max(*offset);
                    let hi = ((sector + 1) * SECTOR_BYTES).min(end);
                    if let std::collections::hash_map::Entry::Vacant(slot) = settled.entry(sector) {
                        if rng.gen_bool(0.5) {
                            slot.insert(());
                            stats.sectors_kept += 1;
                        } else {
                            let from = (lo - offset) as usize;
                            let to = (hi - offset) as usize;
                            f.file.write_all_at(&old[from..to], lo)?;
                            stats.sectors_lost += 1;
                        }
                    }
                    sector += 1;
                }
            }
            f.undo.clear();
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_keeps_synced_writes_and_rolls_each_sector_back_to_a_prefix_of_its_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("open");
        file.set_len(4 * SECTOR_BYTES).expect("size");
        let log = PowerLog::default();
        log.enable();
        let write = |off: u64, byte: u8, len: u64| {
            let mut old = vec![0u8; len as usize];
            file.read_exact_at(&mut old, off).expect("read old");
            log.record(&file, off, old).expect("record");
            file.write_all_at(&vec![byte; len as usize], off).expect("write");
        };
        // Sector 0 synced with 1s; then 2s then 3s over sectors 0..2, unsynced.
        write(0, 1, SECTOR_BYTES);
        let m = log.mark(&file);
        log.synced(&file, m);
        write(0, 2, 2 * SECTOR_BYTES);
        write(0, 3, 2 * SECTOR_BYTES);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            // Replay the same two unsynced writes for each seed.
            file.write_all_at(&vec![1; SECTOR_BYTES as usize], 0).expect("reset");
            file.write_all_at(&vec![0; SECTOR_BYTES as usize], SECTOR_BYTES).expect("reset");
            log.files.lock().clear();
            write(0, 2, 2 * SECTOR_BYTES);
            write(0, 3, 2 * SECTOR_BYTES);
            let stats = log.cut(seed).expect("cut");
            assert_eq!((stats.files, stats.writes), (1, 2));
            let mut bytes = vec![0u8; (2 * SECTOR_BYTES) as usize];
            file.read_exact_at(&mut bytes, 0).expect("read");
            let s0 = bytes[0];
            let s1 = bytes[SECTOR_BYTES as usize];
            assert!(bytes[..SECTOR_BYTES as usize].iter().all(|&b| b == s0), "a sector is whole");
            assert!(bytes[SECTOR_BYTES as usize..].iter().all(|&b| b == s1), "a sector is whole");
            assert!([1, 2, 3].contains(&s0), "sector 0 is its synced or a later version: {s0}");
            assert!([0, 2, 3].contains(&s1), "sector 1 is its synced or a later version: {s1}");
            seen.insert((s0, s1));
        }
        assert!(seen.len() >= 6, "sectors vary independently across seeds: {seen:?}");
        // Synced state survives a cut with nothing pending.
        assert_eq!(log.cut(99).expect("cut"), PowerCutStats::default());
    }
}
