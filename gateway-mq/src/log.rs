//! Reading a partition's log: the segment manifest, fetch by offset, offsets
//! by time, and batch iteration for recovery. Used by readers (fetch) and by
//! the writer (recovery after a takeover, queue deliveries).
//!
//! A partition's segments are the **manifest** (`<p>/segments`, a CAS file:
//! every sealed segment with its committed end, the offset after its last
//! record and its largest timestamp) plus the **active** segment named in
//! the state file (committed end `seg_bytes`). A reader reads the state,
//! then the manifest (cached while the state's active segment and log start
//! do not change), and never looks at the directory:
//!
//! | segment | bytes read | offsets valid |
//! |---|---|---|
//! | sealed (manifest entry with `base < state.seg_base`) | `[0, end)` | `[base, next)` |
//! | active (`state.seg`) | `[0, seg_bytes)` | `[seg_base, hw)` |
//! | anything else in the directory | never | — (a fenced writer's leftovers) |
//!
//! Every batch read is checked (length, magic, CRC32C) before it is
//! returned; a bad one inside the committed range is reported as corruption,
//! never passed on.

use crate::error::{from_file, from_meta, MqError, Result};
use crate::index;
use crate::record::{decode_batch, scan_batch, BatchHeader, Scan, StoredRecord, BATCH_HEADER_BYTES};
use crate::state::PartitionState;
use crate::store::{read_json, reader, write_json, Store, Versioned};
use bytes::{Bytes, BytesMut};
use fskv_proto::meta::{Expected, Inode};
use fskv_types::{ErrorCode, InodeId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MANIFEST_FILE: &str = "segments";
/// Bytes read at a time when scanning a segment.
const SCAN_READ_BYTES: u64 = 256 << 10;
const CACHE_MAX_ENTRIES: usize = 16_384;
/// A read of a segment smaller than this fetches this much (never past the
/// committed end) and keeps it, so a consumer reading on a batch at a time
/// pays one storage read per window, not one per batch. Committed bytes
/// never change (module docs), so a window is never stale.
const READ_AHEAD_BYTES: u64 = 64 << 10;
/// Read-ahead windows kept at most (`READ_AHEAD_BYTES` each: 32 MiB).
const MAX_READ_AHEAD_WINDOWS: usize = 512;
/// How old a partition state a fetch may use instead of reading it again,
/// when the offset asked for is below that state's high watermark (a
/// consumer with a backlog): the answer is what a fetch that read the state
/// this long ago would give. A fetch at or past it reads the state afresh,
/// so a consumer at the tail sees a new record at once.
pub const FETCH_STATE_MAX_AGE_MS: u64 = 50;

/// One sealed segment in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedSegment {
    pub name: String,
    pub base: u64,
    /// Committed bytes.
    pub end: u64,
    /// The offset after its last record.
    pub next: u64,
    /// Largest record timestamp (-1: none).
    pub max_ts: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub sealed: Vec<SealedSegment>,
}

impl Manifest {
    /// Adds (or replaces, by name) a sealed segment, keeping base order.
    pub fn seal(&mut self, s: SealedSegment) {
        self.sealed.retain(|x| x.name != s.name && x.base < s.base);
        self.sealed.push(s);
    }
}

pub async fn read_manifest(store: &Store, pdir: InodeId) -> Result<Option<Versioned<Manifest>>> {
    read_json::<Manifest>(&store.fs, pdir, MANIFEST_FILE).await
}

pub async fn write_manifest(store: &Store, pdir: InodeId, m: &Manifest, old: Option<&Versioned<Manifest>>) -> Result<()> {
    let expected = old.map_or(Expected::Absent, |o| o.expected());
    write_json(&store.fs, pdir, MANIFEST_FILE, m, Some(expected)).await.map(drop)
}

/// A segment as a reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub name: String,
    pub base: u64,
    /// Committed bytes.
    pub end: u64,
    /// The offset after its last committed record.
    pub next: u64,
    pub max_ts: i64,
    pub active: bool,
}

/// The segments of a partition in offset order (see the module table).
pub fn segments_of(state: &PartitionState, manifest: &Manifest) -> Vec<Segment> {
    let mut out: Vec<Segment> = manifest
        .sealed
        .iter()
        .filter(|s| s.base < state.seg_base && s.next > state.log_start && s.name != state.seg)
        .map(|s| Segment {
            name: s.name.clone(),
            base: s.base,
            end: s.end,
            next: s.next.min(state.seg_base),
            max_ts: s.max_ts,
            active: false,
        })
        .collect();
    out.sort_by_key(|s| s.base);
    if !state.seg.is_empty() {
        out.push(Segment {
            name: state.seg.clone(),
            base: state.seg_base,
            end: state.seg_bytes,
            next: state.hw,
            max_ts: state.seg_max_ts,
            active: true,
        });
    }
    out
}

/// What a fetch returns.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// Whole stored batches; the first may start before the offset asked for.
    pub data: Bytes,
    /// The offset to fetch next.
    pub next_offset: u64,
    pub high_watermark: u64,
    pub log_start: u64,
    pub batches: usize,
}

/// A segment's index entries with the committed end they cover.
type CachedIndex = (u64, Arc<Vec<index::IndexEntry>>);

/// Caches of a reader: manifests, segment inodes, indexes and where the
/// last fetches ended (so a consumer reading on sequentially costs no index
/// lookup). Bounded; cleared when full.
#[derive(Default)]
struct Caches {
    /// pdir → (active segment, log start, manifest).
    manifests: HashMap<InodeId, (String, u64, Arc<Manifest>)>,
    inodes: HashMap<(InodeId, String), Inode>,
    /// (pdir, segment, committed end) → index entries.
    indexes: HashMap<(InodeId, String), CachedIndex>,
    /// (pdir, offset) → (segment, position of the batch holding offset).
    positions: HashMap<(InodeId, u64), (String, u64)>,
    /// (pdir, segment) → (position, committed bytes from there): the last
    /// read-ahead window of the segment.
    windows: HashMap<(InodeId, String), (u64, Bytes)>,
    /// pdir → the partition state last read for a fetch, and when.
    states: HashMap<InodeId, (Instant, PartitionState)>,
}

#[derive(Clone)]
pub struct LogReader {
    pub store: Store,
    max_batch_bytes: usize,
    caches: Arc<Mutex<Caches>>,
}

impl LogReader {
    pub fn new(store: Store, max_batch_bytes: usize) -> LogReader {
        LogReader { store, max_batch_bytes, caches: Arc::default() }
    }

    /// The partition's segments for `state`.
    pub async fn segments(&self, pdir: InodeId, state: &PartitionState) -> Result<Vec<Segment>> {
        let cached = {
            let c = self.caches.lock();
            c.manifests.get(&pdir).filter(|(seg, start, _)| *seg == state.seg && *start == state.log_start).map(|(_, _, m)| Arc::clone(m))
        };
        let manifest = match cached {
            Some(m) => m,
            None => {
                let m = Arc::new(read_manifest(&self.store, pdir).await?.map(|v| v.value).unwrap_or_default());
                let mut c = self.caches.lock();
                if c.manifests.len() >= CACHE_MAX_ENTRIES {
                    c.manifests.clear();
                }
                c.manifests.insert(pdir, (state.seg.clone(), state.log_start, Arc::clone(&m)));
                m
            }
        };
        Ok(segments_of(state, &manifest))
    }

    async fn inode(&self, pdir: InodeId, name: &str) -> Result<Inode> {
        if let Some(i) = self.caches.lock().inodes.get(&(pdir, name.to_string())) {
            return Ok(i.clone());
        }
        let i = match self.store.fs.meta().lookup(pdir, name).await {
            Ok(i) => i,
            Err(e) if e.code() == ErrorCode::NotFound => return Err(MqError::NotFound(format!("segment {name}"))),
            Err(e) => return Err(from_meta(e, name)),
        };
        let mut c = self.caches.lock();
        if c.inodes.len() >= CACHE_MAX_ENTRIES {
            c.inodes.clear();
        }
        c.inodes.insert((pdir, name.to_string()), i.clone());
        Ok(i)
    }

    /// A partition state read for a fetch less than
    /// [`FETCH_STATE_MAX_AGE_MS`] ago.
    pub fn recent_state(&self, pdir: InodeId) -> Option<PartitionState> {
        let c = self.caches.lock();
        let (at, s) = c.states.get(&pdir)?;
        (at.elapsed() < Duration::from_millis(FETCH_STATE_MAX_AGE_MS)).then(|| s.clone())
    }

    /// Keeps the state just read for [`LogReader::recent_state`].
    pub fn remember_state(&self, pdir: InodeId, state: &PartitionState) {
        let mut c = self.caches.lock();
        if c.states.len() >= CACHE_MAX_ENTRIES && !c.states.contains_key(&pdir) {
            c.states.clear();
        }
        c.states.insert(pdir, (Instant::now(), state.clone()));
    }

    /// Forgets the state kept for `pdir` (a fetch made with it failed).
    pub fn forget_state(&self, pdir: InodeId) {
        self.caches.lock().states.remove(&pdir);
    }

    /// Reads `[pos, pos+len)` of a segment (within its committed end); a
    /// small read comes from, or fills, the segment's read-ahead window.
    pub async fn read_segment(&self, pdir: InodeId, seg: &Segment, pos: u64, len: u64) -> Result<Bytes> {
        let len = len.min(seg.end.saturating_sub(pos));
        if len == 0 {
            return Ok(Bytes::new());
        }
        let key = (pdir, seg.name.clone());
        if let Some((at, w)) = self.caches.lock().windows.get(&key) {
            if *at <= pos && pos + len <= *at + w.len() as u64 {
                let from = (pos - at) as usize;
                return Ok(w.slice(from..from + len as usize));
            }
        }
        let want = if len < READ_AHEAD_BYTES { READ_AHEAD_BYTES.min(seg.end - pos) } else { len };
        let inode = self.inode(pdir, &seg.name).await?;
        let h = reader(&self.store.fs, &inode, seg.end)?;
        let data = h.read_at(pos, want).await.map_err(|e| from_file(e, &seg.name))?;
        if (data.len() as u64) < want {
            return Err(MqError::Corrupt(format!(
                "segment {} is shorter ({} bytes at {pos}) than its committed end {}",
                seg.name,
                data.len(),
                seg.end
            )));
        }
        if want > len {
            let mut c = self.caches.lock();
            if c.windows.len() >= MAX_READ_AHEAD_WINDOWS && !c.windows.contains_key(&key) {
                c.windows.clear();
            }
            c.windows.insert(key, (pos, data.clone()));
        }
        Ok(data.slice(..len as usize))
    }

    async fn index_of(&self, pdir: InodeId, seg: &Segment) -> Vec<index::IndexEntry> {
        let idx_name = seg.name.replace(".log", ".idx");
        let key = (pdir, idx_name.clone());
        if let Some((end, e)) = self.caches.lock().indexes.get(&key) {
            if *end == seg.end || !seg.active {
                return e.to_vec();
            }
        }
        // The index is a hint: on any failure, scan from the start.
        let entries = match self.store.fs.meta().lookup(pdir, &idx_name).await {
            Ok(inode) => {
                // Entries are 16 bytes per ≥ 4 KiB of log: read a bound on them.
                let max = (seg.end / 256 + 4096).min(64 << 20);
                match reader(&self.store.fs, &inode, max) {
                    Ok(h) => match h.read_at(0, max).await {
                        Ok(b) => index::decode(&b),
                        Err(_) => Vec::new(),
                    },
                    Err(_) => Vec::new(),
                }
            }
            Err(_) => Vec::new(),
        };
        let mut c = self.caches.lock();
        if c.indexes.len() >= CACHE_MAX_ENTRIES {
            c.indexes.clear();
        }
        c.indexes.insert(key, (seg.end, Arc::new(entries.clone())));
        entries
    }

    /// The position in `seg` of the batch holding `offset` (or the first
    /// batch after it), found from the cache, the index, then a scan.
    async fn position_of(&self, pdir: InodeId, seg: &Segment, offset: u64) -> Result<u64> {
        if offset <= seg.base {
            return Ok(0);
        }
        if let Some((name, pos)) = self.caches.lock().positions.get(&(pdir, offset)) {
            if *name == seg.name && *pos <= seg.end {
                return Ok(*pos);
            }
        }
        let entries = self.index_of(pdir, seg).await;
        let (_, mut pos) = index::position_for_offset(&entries, offset - seg.base, seg.end);
        // Walk batch headers forward (lengths only; the batches returned
        // are checked in full by `read_batches`).
        let mut buf = Bytes::new();
        let mut buf_pos = pos;
        loop {
            if pos >= seg.end {
                return Ok(seg.end);
            }
            let rel = (pos - buf_pos) as usize;
            if pos < buf_pos || rel + BATCH_HEADER_BYTES > buf.len() {
                buf = self.read_segment(pdir, seg, pos, SCAN_READ_BYTES).await?;
                buf_pos = pos;
                if buf.len() < BATCH_HEADER_BYTES {
                    return Err(corrupt(seg, pos, &Scan::NeedBytes(BATCH_HEADER_BYTES)));
                }
                continue;
            }
            let h = BatchHeader::parse(&buf[rel..]).ok_or_else(|| corrupt(seg, pos, &Scan::Invalid("bad batch header")))?;
            if h.next_offset() > offset {
                return Ok(pos);
            }
            pos += u64::from(h.total_bytes);
        }
    }

    /// Reads whole batches of `seg` from the one holding `offset`, up to
    /// `max_bytes` (at least one batch, whatever its size), never past the
    /// committed end or the segment's last valid offset.
    pub async fn read_batches(&self, pdir: InodeId, seg: &Segment, offset: u64, max_bytes: u64) -> Result<(Bytes, u64, Vec<BatchHeader>)> {
        let start = self.position_of(pdir, seg, offset).await?;
        if start >= seg.end {
            return Ok((Bytes::new(), seg.next, Vec::new()));
        }
        let want = max_bytes.max(BATCH_HEADER_BYTES as u64).min(seg.end - start);
        let mut buf = self.read_segment(pdir, seg, start, want).await?;
        let mut at = 0usize;
        let mut headers = Vec::new();
        let mut next = offset;
        loop {
            if start + at as u64 >= seg.end {
                break;
            }
            match scan_batch(&buf[at..], self.max_batch_bytes) {
                Scan::Batch(h) => {
                    if h.base_offset >= seg.next {
                        break;
                    }
                    at += h.total_bytes as usize;
                    next = h.next_offset();
                    headers.push(h);
                    if at as u64 >= max_bytes {
                        break;
                    }
                }
                Scan::NeedBytes(n) if headers.is_empty() => {
                    // The first batch is larger than max_bytes: return it whole.
                    let total = (at + n) as u64;
                    if start + total > seg.end {
                        return Err(corrupt(seg, start, &Scan::NeedBytes(n)));
                    }
                    buf = self.read_segment(pdir, seg, start, total).await?;
                }
                Scan::NeedBytes(_) => break,
                other => return Err(corrupt(seg, start + at as u64, &other)),
            }
        }
        let data = buf.slice(..at);
        if !headers.is_empty() {
            let mut c = self.caches.lock();
            if c.positions.len() >= CACHE_MAX_ENTRIES {
                c.positions.clear();
            }
            c.positions.insert((pdir, next), (seg.name.clone(), start + at as u64));
        }
        Ok((data, next, headers))
    }

    /// Fetches from `offset` (which must be in `[log_start, hw]`).
    pub async fn fetch(&self, pdir: InodeId, state: &PartitionState, offset: u64, max_bytes: u64) -> Result<Fetched> {
        let empty =
            |next| Fetched { data: Bytes::new(), next_offset: next, high_watermark: state.hw, log_start: state.log_start, batches: 0 };
        if offset < state.log_start || offset > state.hw {
            return Err(MqError::OffsetOutOfRange { offset, log_start: state.log_start, high_watermark: state.hw });
        }
        if offset == state.hw {
            return Ok(empty(offset));
        }
        let segments = self.segments(pdir, state).await?;
        // Retention may have dropped the segment holding `offset` after
        // `state` was read (the manifest is newer): the offset is then below
        // the log start, as if the state had said so — never a silent skip to
        // the next segment.
        if let Some(first) = segments.iter().find(|s| s.next > offset) {
            if first.base > offset {
                return Err(MqError::OffsetOutOfRange { offset, log_start: first.base, high_watermark: state.hw });
            }
        }
        let mut out = BytesMut::new();
        let mut next = offset;
        let mut batches = 0;
        for seg in segments.iter().filter(|s| s.next > offset) {
            if next >= seg.next {
                continue;
            }
            let budget = max_bytes.saturating_sub(out.len() as u64);
            if budget == 0 && batches > 0 {
                break;
            }
            let (data, n, headers) = self.read_batches(pdir, seg, next, budget.max(1)).await?;
            if headers.is_empty() {
                // Nothing at or after `next` in this segment (its records were
                // all below it): go on with the next one.
                next = next.max(seg.next);
                continue;
            }
            batches += headers.len();
            next = n;
            out.extend_from_slice(&data);
            if out.len() as u64 >= max_bytes {
                break;
            }
        }
        if batches == 0 {
            return Ok(empty(next.max(offset)));
        }
        Ok(Fetched { data: out.freeze(), next_offset: next, high_watermark: state.hw, log_start: state.log_start, batches })
    }

    /// The first offset whose record timestamp is at least `ts` (the high
    /// watermark when there is none).
    pub async fn offset_for_time(&self, pdir: InodeId, state: &PartitionState, ts: i64) -> Result<u64> {
        let segments = self.segments(pdir, state).await?;
        for seg in &segments {
            if seg.max_ts < ts || seg.end == 0 {
                continue;
            }
            let entries = self.index_of(pdir, seg).await;
            let mut pos = index::position_for_time(&entries, ts, seg.end);
            while pos < seg.end {
                let buf = self.read_segment(pdir, seg, pos, SCAN_READ_BYTES.max(self.max_batch_bytes as u64)).await?;
                let mut at = 0usize;
                loop {
                    match scan_batch(&buf[at..], self.max_batch_bytes) {
                        Scan::Batch(h) => {
                            let batch = buf.slice(at..at + h.total_bytes as usize);
                            if h.max_timestamp_ms >= ts && h.base_offset < seg.next {
                                let (_, recs) = decode_batch(&batch)?;
                                if let Some(r) = recs.iter().find(|r| r.record.timestamp_ms >= ts && r.offset >= state.log_start) {
                                    return Ok(r.offset);
                                }
                            }
                            at += h.total_bytes as usize;
                        }
                        Scan::NeedBytes(_) if at > 0 => break,
                        other => return Err(corrupt(seg, pos + at as u64, &other)),
                    }
                    if pos + at as u64 >= seg.end {
                        break;
                    }
                }
                pos += at as u64;
            }
        }
        Ok(state.hw)
    }

    /// Records from `offset` up to `max_bytes` of batches (decoded), and the
    /// offset after them.
    pub async fn records(
        &self,
        pdir: InodeId,
        state: &PartitionState,
        offset: u64,
        max_bytes: u64,
    ) -> Result<(Vec<(BatchHeader, Vec<StoredRecord>)>, u64)> {
        let f = self.fetch(pdir, state, offset, max_bytes).await?;
        let mut out = Vec::with_capacity(f.batches);
        let mut data = f.data;
        while !data.is_empty() {
            match scan_batch(&data, self.max_batch_bytes) {
                Scan::Batch(h) => {
                    let b = data.split_to(h.total_bytes as usize);
                    let (h, recs) = decode_batch(&b)?;
                    out.push((h, recs));
                }
                other => return Err(MqError::Corrupt(format!("fetched data: {other:?}"))),
            }
        }
        Ok((out, f.next_offset))
    }

    /// Forgets a partition's cached manifest (after the writer changed it).
    pub fn forget(&self, pdir: InodeId) {
        self.caches.lock().manifests.remove(&pdir);
    }
}

fn corrupt(seg: &Segment, pos: u64, what: &Scan) -> MqError {
    MqError::Corrupt(format!("segment {} at byte {pos} (committed end {}): {what:?}", seg.name, seg.end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_list_ignores_leftovers() {
        let state = PartitionState { seg: "c".into(), seg_base: 100, seg_bytes: 10, hw: 120, log_start: 10, ..PartitionState::new() };
        let m = Manifest {
            sealed: vec![
                SealedSegment { name: "a".into(), base: 0, end: 50, next: 10, max_ts: 1 },
                SealedSegment { name: "b".into(), base: 10, end: 50, next: 100, max_ts: 2 },
                // A fenced writer's seal of the active segment, and a segment past it.
                SealedSegment { name: "c".into(), base: 100, end: 5, next: 105, max_ts: 3 },
                SealedSegment { name: "d".into(), base: 105, end: 5, next: 110, max_ts: 3 },
            ],
        };
        let s = segments_of(&state, &m);
        assert_eq!(s.iter().map(|s| (s.name.as_str(), s.next, s.active)).collect::<Vec<_>>(), vec![("b", 100, false), ("c", 120, true)]);
        let mut m2 = m.clone();
        m2.seal(SealedSegment { name: "b".into(), base: 10, end: 60, next: 100, max_ts: 2 });
        assert_eq!(m2.sealed.len(), 2);
        assert_eq!(m2.sealed[1].end, 60);
    }
}
