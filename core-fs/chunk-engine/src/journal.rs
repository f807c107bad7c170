//! The append journal: where in-place appends record their metadata
//! instead of a RocksDB batch.
//!
//! An in-place append over a chunk with nothing pending changes only the
//! chunk's length, CRCs, version and tag; the block stays the same. Three
//! kinds of record cover the CRAQ write path ([`DeltaKind`]): the chain
//! tail's append committed at once (`update_and_commit`), a head's or
//! middle's append left pending (`update`), and the later commit of such a
//! pending append (`commit`). A record is a fixed layout ([`AppendDelta`])
//! copied into a memory-mapped file (`MAP_SHARED`, so the bytes are in the
//! page cache the moment the copy ends and survive a process crash exactly
//! like a `write(2)` would) — no system call and no memtable insert. With
//! `sync_writes` an `fdatasync` of the journal file (which writes the
//! mapping's dirty pages) runs before the call returns, shared by every
//! record copied before it (group commit, as RocksDB's synced WAL does).
//! Everything else (copy-on-write, truncate, remove, recovery writes, a
//! commit of a copied version) writes a RocksDB batch as before.
//!
//! A small append's record carries the appended bytes
//! ([`MAX_DELTA_DATA_BYTES`]; the kind byte's `DATA_FLAG`): the engine
//! then skips the block file's `fdatasync`, one sync per append instead of
//! two.
//!
//! | when | rule (engine.rs) |
//! |---|---|
//! | an append's bytes ride in its record | the block file is not synced for it |
//! | the record would exceed a quarter of a region | the bytes are dropped from it and the block is synced first |
//! | replay of a record with bytes | they are written into the block at `base_len` before it applies |
//! | any RocksDB write of a chunk with journal-only changes (checkpoint included) | its blocks are synced first: the record supersedes journal records whose bytes may be only here |
//!
//! Layout: the file is two regions of `region_bytes`; records are written
//! one after another into the active region, each carrying the next LSN
//! (log sequence number), so a region holds one run of consecutive LSNs
//! from its start. When the active region is full, writing switches to the
//! other one (if it is free) and the full region is **checkpointed**: the
//! current record of every chunk it touched is written to RocksDB, after
//! which the region is free again. If the other region is not free yet, the
//! append falls back to a RocksDB batch (always correct, only slower).
//!
//! Every RocksDB chunk record carries the journal LSN current when it was
//! written (`journal_lsn`); a journal record for a chunk applies at open
//! only if its LSN is larger, i.e. it is newer than the chunk's RocksDB
//! record. That makes a record superseded by any later RocksDB write of the
//! chunk (a checkpoint, a copy-on-write, a remove and re-create) harmless.
//!
//! Record (little-endian): `u32 crc32c` of the rest · `u32 len` (whole
//! record) · `u64 lsn` · `u8 kind` · chunk id (16) · `u32 chain_ver` · block (`u8`
//! class, `u64` index) · `u64 new_ver` · `u32 base_len` · `u32 base_crc` ·
//! `u32 new_len` · `u32 new_crc` · tag (`u64` client, `u64` request) ·
//! `u32 n` · `n × u32` page CRCs (from page `base_len / page` to the end)
//! · with `DATA_FLAG` in the kind byte: `u32` length and the appended
//! bytes (exactly `base_len..new_len`).
//! A scan of a region stops at the first record whose CRC or LSN does not
//! follow: a torn record or an older run left from before the region was
//! reused.

use crate::error::{ChunkError, Result};
use crate::meta::{BlockRef, UpdateTag};
use fskv_types::ChunkId;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const JOURNAL_FILE: &str = "journal";
const OLD_JOURNAL_FILE: &str = "journal.old";
/// Default size of each of the two regions (≈ 50 000 records of a 64 KiB append).
pub const DEFAULT_JOURNAL_REGION_BYTES: u64 = 8 << 20;
/// Smallest region accepted (tests use it to force frequent checkpoints).
pub const MIN_JOURNAL_REGION_BYTES: u64 = 512;
const MAX_JOURNAL_REGION_BYTES: u64 = 1 << 30;
const REGIONS: usize = 2;
const FIXED_BYTES: usize = 4 + 4 + 8 + 1 + 16 + 4 + 1 + 8 + 8 + 4 * 4 + 16 + 4;
/// Appends whose record would carry more page CRCs go through RocksDB.
pub(crate) const MAX_DELTA_PAGES: usize = 1024;
/// Largest append whose bytes a record carries (then the block file is not
/// synced for it; see the module docs).
pub const MAX_DELTA_DATA_BYTES: usize = 16 << 10;
/// Bit of the kind byte: the record carries the appended bytes.
const DATA_FLAG: u8 = 0x80;

/// What a journal record does to its chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeltaKind {
    /// An in-place append committed at once (chain tail): the committed
    /// content grows, nothing pending before or after.
    Append = 1,
    /// An in-place append left pending (head or middle target): the
    /// pending version is the committed content grown in the same block.
    PendingAppend = 2,
    /// The commit of such an in-place pending version (no page CRCs).
    Commit = 3,
}

impl DeltaKind {
    fn from_u8(v: u8) -> Option<DeltaKind> {
        match v {
            1 => Some(DeltaKind::Append),
            2 => Some(DeltaKind::PendingAppend),
            3 => Some(DeltaKind::Commit),
            _ => None,
        }
    }
}

/// One journal record: an in-place append (committed or pending) or the
/// commit of a pending one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AppendDelta {
    pub lsn: u64,
    pub kind: DeltaKind,
    pub chunk: ChunkId,
    pub chain_ver: u32,
    pub block: BlockRef,
    /// The version the append creates (the committed one + 1), or the one
    /// a commit commits.
    pub new_ver: u64,
    /// Committed length and CRC before the record.
    pub base_len: u32,
    pub base_crc: u32,
    /// Length and CRC of the new (or committed pending) content.
    pub new_len: u32,
    pub new_crc: u32,
    pub tag: UpdateTag,
    /// Page CRCs from page `base_len / page_bytes` to the end of the content.
    pub pages: Vec<u32>,
    /// The appended bytes (`base_len..new_len` of the block) when the block
    /// file was not synced for this append; empty when it was.
    pub data: Vec<u8>,
}

impl AppendDelta {
    pub(crate) fn encoded_len(&self) -> usize {
        let data = if self.data.is_empty() { 0 } else { 4 + self.data.len() };
        FIXED_BYTES + 4 * self.pages.len() + data
    }

    /// Writes the record into `out` (exactly `encoded_len` bytes), CRC last.
    fn encode_into(&self, out: &mut [u8]) {
        let mut w = Writer { buf: out, at: 4 };
        w.put(&(self.encoded_len() as u32).to_le_bytes());
        w.put(&self.lsn.to_le_bytes());
        w.put(&[self.kind as u8 | if self.data.is_empty() { 0 } else { DATA_FLAG }]);
        w.put(&self.chunk.to_bytes());
        w.put(&self.chain_ver.to_le_bytes());
        w.put(&[self.block.class]);
        w.put(&self.block.index.to_le_bytes());
        w.put(&self.new_ver.to_le_bytes());
        for v in [self.base_len, self.base_crc, self.new_len, self.new_crc] {
            w.put(&v.to_le_bytes());
        }
        w.put(&self.tag.client.to_le_bytes());
        w.put(&self.tag.request.to_le_bytes());
        w.put(&(self.pages.len() as u32).to_le_bytes());
        for c in &self.pages {
            w.put(&c.to_le_bytes());
        }
        if !self.data.is_empty() {
            w.put(&(self.data.len() as u32).to_le_bytes());
            w.put(&self.data);
        }
        debug_assert_eq!(w.at, self.encoded_len());
        let crc = crate::checksum::crc32c(&w.buf[4..w.at]);
        w.buf[..4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes the record at the start of `buf`; `None` if there is no
    /// valid record there (torn, garbage or zeroes).
    fn decode(buf: &[u8]) -> Option<AppendDelta> {
        let len = u32::from_le_bytes(buf.get(4..8)?.try_into().ok()?) as usize;
        if len < FIXED_BYTES || len > buf.len() {
            return None;
        }
        let crc = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?);
        if crate::checksum::crc32c(&buf[4..len]) != crc {
            return None;
        }
        let mut r = Reader { buf: &buf[8..len] };
        let lsn = r.u64()?;
        let kind_byte = r.take(1)?[0];
        let kind = DeltaKind::from_u8(kind_byte & !DATA_FLAG)?;
        let chunk = ChunkId::from_bytes(r.take(16)?)?;
        let chain_ver = r.u32()?;
        let block = BlockRef { class: r.take(1)?[0], index: r.u64()? };
        let new_ver = r.u64()?;
        let (base_len, base_crc, new_len, new_crc) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let tag = UpdateTag { client: r.u64()?, request: r.u64()? };
        let n = r.u32()? as usize;
        if n > (len - FIXED_BYTES) / 4 {
            return None;
        }
        let pages = (0..n).map(|_| r.u32()).collect::<Option<Vec<u32>>>()?;
        let data = if kind_byte & DATA_FLAG != 0 {
            let data_len = r.u32()? as usize;
            let data = r.take(data_len)?.to_vec();
            if data.is_empty() || data.len() as u64 != u64::from(new_len).checked_sub(u64::from(base_len))? {
                return None;
            }
            data
        } else {
            Vec::new()
        };
        // The record is exactly its fields.
        if !r.buf.is_empty() {
            return None;
        }
        Some(AppendDelta { lsn, kind, chunk, chain_ver, block, new_ver, base_len, base_crc, new_len, new_crc, tag, pages, data })
    }
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// A shared writable mapping of the whole journal file.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this struct; all access goes
// through `&mut Mapping` behind the journal's mutex.
unsafe impl Send for Mapping {}
// SAFETY: as above; a shared reference gives no access to the bytes.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize) -> Result<Mapping> {
        use std::os::fd::AsRawFd;
        // SAFETY: maps `len` bytes of a file we hold open and have sized to
        // at least `len`; the result is checked before use.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(ChunkError::io("mapping the append journal", std::io::Error::last_os_error()));
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` bytes for the life of `self`, and
        // `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; nothing refers to it after drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

struct State {
    map: Mapping,
    region_bytes: usize,
    active: usize,
    /// Write position inside the active region.
    offset: usize,
    next_lsn: u64,
    /// Chunks with records in each region; a region with any holds
    /// records not checkpointed yet ("busy").
    dirty: [HashSet<ChunkId>; REGIONS],
    /// Somebody took the region's dirty set to checkpoint it.
    checkpointing: [bool; REGIONS],
    stats: JournalStats,
}

/// Result of [`Journal::append`].
pub(crate) struct Appended {
    /// `None`: no room (both regions hold records not yet checkpointed);
    /// the caller writes the record to RocksDB instead.
    pub lsn: Option<u64>,
    /// A full region whose checkpoint the caller must run (after releasing
    /// its chunk lock): [`Journal::take_region`], write, [`Journal::region_done`].
    pub checkpoint: Option<usize>,
}

/// Counters of the append journal since the engine opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct JournalStats {
    /// Appends committed by a journal record.
    pub records: u64,
    /// Appends that found no room and were committed through RocksDB.
    pub fallbacks: u64,
    /// Regions checkpointed (and so freed).
    pub checkpoints: u64,
    /// Records found valid and newer than their chunk's record at open.
    pub replayed: u64,
}

/// The append journal of one engine. Thread-safe.
pub(crate) struct Journal {
    state: Mutex<State>,
    /// LSN of the newest record written (or the floor found at open).
    head_lsn: AtomicU64,
    sync: bool,
    file: File,
    /// Newest LSN known durable (`sync_writes`); its lock serializes the
    /// `fdatasync`s, so one call makes every record copied before it
    /// durable for all waiters (group commit).
    synced_lsn: Mutex<u64>,
    /// Largest record taken (a quarter of a region); larger appends go
    /// through RocksDB.
    max_record_bytes: usize,
    old_path: std::path::PathBuf,
    /// Records copied into the mapping but not synced, for simulated power cuts.
    #[cfg(feature = "fault-injection")]
    pub(crate) power: crate::power::PowerLog,
}

impl Journal {
    /// Opens the journal in `dir`, returning it (empty, ready for appends
    /// once the caller has checkpointed what it replays) and every valid
    /// record found, in LSN order. New records get LSNs above those found;
    /// [`Journal::raise_floor`] adds what the caller knows from RocksDB.
    pub fn open(dir: &Path, region_bytes: u64, sync: bool) -> Result<(Journal, Vec<AppendDelta>)> {
        if !(MIN_JOURNAL_REGION_BYTES..=MAX_JOURNAL_REGION_BYTES).contains(&region_bytes) || !region_bytes.is_multiple_of(512) {
            return Err(ChunkError::InvalidArgument(format!(
                "journal_region_bytes {region_bytes}: must be a multiple of 512 in \
                 [{MIN_JOURNAL_REGION_BYTES}, {MAX_JOURNAL_REGION_BYTES}]"
            )));
        }
        let path = dir.join(JOURNAL_FILE);
        let old_path = dir.join(OLD_JOURNAL_FILE);
        // A journal of another size set aside by an earlier open whose
        // replay did not finish: its records count too.
        let mut records = read_records(&old_path)?;
        records.extend(read_records(&path)?);
        records.sort_by_key(|d| d.lsn);
        records.dedup_by_key(|d| d.lsn);
        let total = region_bytes as usize * REGIONS;
        let io = |what: &str, e: std::io::Error| ChunkError::io(format!("{what} {path:?}"), e);
        let existing = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if existing > 0 && existing != total as u64 {
            // Resized: set the old file aside (its records, read above, are
            // not in RocksDB yet) until `finish_open`.
            if old_path.exists() {
                // An earlier open set a file aside and stopped before
                // `finish_open`, so it wrote no record into this one (appends
                // start after open returns): the set-aside file holds them.
                std::fs::remove_file(&path).map_err(|e| io("removing", e))?;
            } else {
                std::fs::rename(&path, &old_path).map_err(|e| io("setting aside", e))?;
            }
            File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("fsync of the directory of", e))?;
        }
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|e| io("opening", e))?;
        // Allocated, not sparse: a store into a hole of a shared mapping
        // would allocate in the page fault, and no space there is SIGBUS.
        let len = file.metadata().map_err(|e| io("stat", e))?.len();
        if len != total as u64 {
            allocate(&file, total).map_err(|e| io("allocating", e))?;
            file.sync_all().map_err(|e| io("fsync of", e))?;
        }
        let map = Mapping::new(&file, total)?;
        let max_lsn = records.iter().map(|d| d.lsn).max().unwrap_or(0);
        let state = State {
            map,
            region_bytes: region_bytes as usize,
            active: 0,
            offset: 0,
            next_lsn: max_lsn + 1,
            dirty: [HashSet::new(), HashSet::new()],
            checkpointing: [false; REGIONS],
            stats: JournalStats::default(),
        };
        let journal = Journal {
            state: Mutex::new(state),
            head_lsn: AtomicU64::new(max_lsn),
            sync,
            file,
            synced_lsn: Mutex::new(max_lsn),
            max_record_bytes: region_bytes as usize / 4,
            old_path,
            #[cfg(feature = "fault-injection")]
            power: crate::power::PowerLog::default(),
        };
        Ok((journal, records))
    }

    /// Called once the records `open` returned are in RocksDB: drops a
    /// journal file of an earlier size kept until then.
    pub fn finish_open(&self) -> Result<()> {
        match std::fs::remove_file(&self.old_path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ChunkError::io(format!("removing {:?}", self.old_path), e)),
        }
    }

    /// Largest record [`Journal::append`] takes.
    pub fn max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }

    /// LSN of the newest record written; a RocksDB chunk record written now
    /// supersedes every journal record of that chunk up to this LSN.
    pub fn head_lsn(&self) -> u64 {
        self.head_lsn.load(Ordering::Acquire)
    }

    /// Makes new records get LSNs above `lsn` (an LSN found in RocksDB).
    pub fn raise_floor(&self, lsn: u64) {
        let mut st = self.state.lock();
        if st.next_lsn <= lsn {
            st.next_lsn = lsn + 1;
            self.head_lsn.store(lsn, Ordering::Release);
        }
    }

    /// Appends `delta` (its `lsn` is assigned here) for a chunk whose lock
    /// the caller holds.
    pub fn append(&self, delta: &mut AppendDelta) -> Result<Appended> {
        let len = delta.encoded_len();
        let mut st = self.state.lock();
        if delta.pages.len() > MAX_DELTA_PAGES || len > self.max_record_bytes {
            st.stats.fallbacks += 1;
            return Ok(Appended { lsn: None, checkpoint: None });
        }
        let mut checkpoint = None;
        if st.offset + len > st.region_bytes {
            let other = 1 - st.active;
            if !st.dirty[other].is_empty() {
                // Still being checkpointed, or its checkpoint failed: ask
                // for (another) one unless one is running.
                let retry = (!st.checkpointing[other]).then_some(other);
                st.stats.fallbacks += 1;
                return Ok(Appended { lsn: None, checkpoint: retry });
            }
            checkpoint = Some(st.active);
            st.active = other;
            st.offset = 0;
        }
        delta.lsn = st.next_lsn;
        let start = st.active * st.region_bytes + st.offset;
        #[cfg(feature = "fault-injection")]
        if self.power.is_enabled() {
            let old = st.map.bytes_mut()[start..start + len].to_vec();
            self.power.record(&self.file, start as u64, old).map_err(|e| ChunkError::io("recording a journal write", e))?;
        }
        delta.encode_into(&mut st.map.bytes_mut()[start..start + len]);
        st.offset += len;
        st.next_lsn += 1;
        let active = st.active;
        st.dirty[active].insert(delta.chunk);
        st.stats.records += 1;
        self.head_lsn.store(delta.lsn, Ordering::Release);
        drop(st);
        if self.sync {
            self.make_durable(delta.lsn)?;
        }
        Ok(Appended { lsn: Some(delta.lsn), checkpoint })
    }

    /// Returns once record `lsn` is on disk: `fdatasync` of the journal file
    /// (it writes the mapping's dirty pages), shared by every record copied
    /// before the call. An error leaves the record in the page cache, where
    /// a later open may still find it: the caller must stop using the engine.
    fn make_durable(&self, lsn: u64) -> Result<()> {
        let mut synced = self.synced_lsn.lock();
        if *synced >= lsn {
            return Ok(());
        }
        // Every record up to the head is completely copied (the head moves
        // after the copy, under the state lock).
        let upto = self.head_lsn();
        #[cfg(feature = "fault-injection")]
        let mark = self.power.mark(&self.file);
        self.file.sync_data().map_err(|e| ChunkError::io("fdatasync of the append journal", e))?;
        #[cfg(feature = "fault-injection")]
        self.power.synced(&self.file, mark);
        *synced = upto;
        Ok(())
    }

    /// Takes the set of chunks with records in `region` for a checkpoint.
    /// `None` if another caller is already checkpointing it.
    pub fn take_region(&self, region: usize) -> Option<Vec<ChunkId>> {
        let mut st = self.state.lock();
        if st.checkpointing[region] || st.dirty[region].is_empty() {
            return None;
        }
        st.checkpointing[region] = true;
        let mut chunks: Vec<ChunkId> = st.dirty[region].iter().copied().collect();
        chunks.sort_unstable();
        Some(chunks)
    }

    /// Ends a checkpoint of `region`: on success the region is free for
    /// reuse; on failure it stays busy and a later append retries.
    pub fn region_done(&self, region: usize, ok: bool) {
        let mut st = self.state.lock();
        st.checkpointing[region] = false;
        if ok {
            st.stats.checkpoints += 1;
            st.dirty[region].clear();
            if st.active == region {
                st.offset = 0;
            }
        }
    }

    pub fn stats(&self) -> JournalStats {
        self.state.lock().stats
    }

    pub fn count_replayed(&self, n: u64) {
        self.state.lock().stats.replayed += n;
    }

    /// Regions holding records not yet checkpointed.
    pub fn busy_regions(&self) -> Vec<usize> {
        let st = self.state.lock();
        (0..REGIONS).filter(|&r| !st.dirty[r].is_empty()).collect()
    }
}

/// `fallocate`s `len` bytes (zeroes when read), or writes zeroes where the
/// filesystem cannot.
fn allocate(file: &File, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain system call on a descriptor we own.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(err);
    }
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = zeros.len().min(len - at);
        file.write_all_at(&zeros[..n], at as u64)?;
        at += n;
    }
    Ok(())
}

/// The valid records of the journal file at `path` (none if it is missing).
fn read_records(path: &Path) -> Result<Vec<AppendDelta>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(scan(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(ChunkError::io(format!("reading {path:?}"), e)),
    }
}

/// Every valid record of both regions of a journal file's bytes, in LSN order.
fn scan(bytes: &[u8]) -> Vec<AppendDelta> {
    let region = bytes.len() / REGIONS;
    let mut out = Vec::new();
    for r in 0..REGIONS {
        let buf = &bytes[r * region..(r + 1) * region];
        let mut at = 0;
        let mut prev: Option<u64> = None;
        while let Some(d) = buf.get(at..).and_then(AppendDelta::decode) {
            // Checked: an LSN read from disk may be u64::MAX.
            if prev.is_some_and(|p| p.checked_add(1) != Some(d.lsn)) {
                break;
            }
            prev = Some(d.lsn);
            at += d.encoded_len();
            out.push(d);
        }
    }
    out.sort_by_key(|d| d.lsn);
    out
}

/// Entry points of the fuzz target `chunk_records` (core-fs/chunk-engine/fuzz)
/// into the record decoder and the open-time scan; not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// The record at the start of `buf` decoded and encoded again; `None`
    /// if there is no valid record there.
    pub fn decode_reencode(buf: &[u8]) -> Option<Vec<u8>> {
        let d = AppendDelta::decode(buf)?;
        let mut out = vec![0u8; d.encoded_len()];
        d.encode_into(&mut out);
        Some(out)
    }

    /// What opening a journal file of these bytes replays: the LSNs of the
    /// records, in replay order.
    pub fn scan_lsns(bytes: &[u8]) -> Vec<u64> {
        scan(bytes).iter().map(|d| d.lsn).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_types::InodeId;

    fn delta(chunk: u64, pages: usize) -> AppendDelta {
        AppendDelta {
            lsn: 0,
            kind: DeltaKind::Append,
            chunk: ChunkId::new(InodeId(9), chunk),
            chain_ver: 3,
            block: BlockRef { class: 6, index: 77 },
            new_ver: 5,
            base_len: 65536,
            base_crc: 0xdead_beef,
            new_len: 131072,
            new_crc: 0x1234_5678,
            tag: UpdateTag { client: 1, request: 2 },
            pages: (0..pages as u32).collect(),
            data: Vec::new(),
        }
    }

    #[test]
    fn records_round_trip_and_a_torn_one_is_not_read() {
        let d = delta(1, 17);
        let mut buf = vec![0u8; d.encoded_len() + 8];
        d.encode_into(&mut buf);
        assert_eq!(AppendDelta::decode(&buf), Some(d.clone()));
        for i in [0, 5, 40, d.encoded_len() - 1] {
            let mut torn = buf.clone();
            torn[i] ^= 0x40;
            assert_eq!(AppendDelta::decode(&torn), None, "flipped byte {i}");
        }
        assert_eq!(AppendDelta::decode(&[0u8; 200]), None);
    }

    #[test]
    fn a_record_carrying_the_appended_bytes_round_trips() {
        let mut d = delta(1, 3);
        d.base_len = 1000;
        d.new_len = 1000 + 700;
        d.data = (0..700u32).map(|i| i as u8).collect();
        let mut buf = vec![0u8; d.encoded_len() + 8];
        d.encode_into(&mut buf);
        assert_eq!(AppendDelta::decode(&buf), Some(d.clone()));
        // Bytes that do not span base_len..new_len are not a record.
        let mut short = d.clone();
        short.data.pop();
        let mut buf = vec![0u8; short.encoded_len()];
        short.encode_into(&mut buf);
        assert_eq!(AppendDelta::decode(&buf), None);
        // Neither is a record with bytes after its fields.
        let plain = delta(2, 3);
        let mut buf = vec![0u8; plain.encoded_len() + 4];
        plain.encode_into(&mut buf[..plain.encoded_len()]);
        let len = (plain.encoded_len() + 4) as u32;
        buf[4..8].copy_from_slice(&len.to_le_bytes());
        let crc = crate::checksum::crc32c(&buf[4..]);
        buf[..4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(AppendDelta::decode(&buf), None);
    }

    #[test]
    fn a_scan_stops_after_lsn_u64_max() {
        // The next LSN after u64::MAX does not exist: the run ends there
        // (the check used to overflow, a panic in debug builds).
        let (mut a, mut b) = (delta(1, 2), delta(2, 2));
        a.lsn = u64::MAX;
        b.lsn = 0;
        let mut file = vec![0u8; 2 * 1024];
        a.encode_into(&mut file[..a.encoded_len()]);
        let at = a.encoded_len();
        b.encode_into(&mut file[at..at + b.encoded_len()]);
        assert_eq!(scan(&file).iter().map(|d| d.lsn).collect::<Vec<_>>(), vec![u64::MAX]);
    }

    #[test]
    fn regions_switch_and_a_scan_stops_at_an_older_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, found) = Journal::open(dir.path(), 4096, false).expect("open");
        j.raise_floor(10);
        assert!(found.is_empty());
        let mut lsns = Vec::new();
        let mut switched = None;
        // 90 + 68 = 158-byte records: 25 fit in a 4 KiB region.
        for i in 0..30 {
            let mut d = delta(i, 17);
            let a = j.append(&mut d).expect("append");
            lsns.push(a.lsn.expect("room"));
            if a.checkpoint.is_some() {
                switched = a.checkpoint;
            }
        }
        assert_eq!(lsns.first(), Some(&11));
        assert_eq!(switched, Some(0));
        // Region 0 is not checkpointed: once region 1 is full, no room.
        let mut full = None;
        for i in 30..60 {
            let a = j.append(&mut delta(i, 17)).expect("append");
            if a.lsn.is_none() {
                full = Some(a.checkpoint);
                break;
            }
        }
        assert_eq!(full, Some(Some(0)), "asks for region 0's checkpoint");
        let chunks = j.take_region(0).expect("take");
        assert_eq!(chunks.len(), 25);
        assert!(j.take_region(0).is_none(), "taken twice");
        j.region_done(0, true);
        drop(j);
        let (j2, found) = Journal::open(dir.path(), 4096, false).expect("reopen");
        // Both regions still hold their runs (region 0 was freed, not erased).
        let got: Vec<u64> = found.iter().map(|d| d.lsn).collect();
        assert_eq!(got, (11..=60).collect::<Vec<_>>());
        assert_eq!(j2.head_lsn(), 60);
        // A new run at the start of region 0 hides the older one after it.
        let mut d = delta(99, 17);
        assert_eq!(j2.append(&mut d).expect("append").lsn, Some(61));
        drop(j2);
        let (_, found) = Journal::open(dir.path(), 4096, false).expect("reopen");
        let got: Vec<u64> = found.iter().map(|d| d.lsn).collect();
        assert_eq!(got, (36..=61).collect::<Vec<_>>());
    }
}
