//! Chunk metadata records and their on-disk encoding.
//!
//! Key: `b'c'` followed by `ChunkId::to_bytes()` (inode then index, both
//! big-endian), so all chunks of a file are adjacent and the last one is a
//! single `seek_for_prev`.
//!
//! Value (little-endian, format 5; formats 4, 3 and 2 are still read: format
//! 4 is format 5 without the trailing `journal_lsn`, format 3 is format 4
//! without the `open` entries of a Version, format 2 is format 3 without the
//! trailing `recent` list):
//! ```text
//! u8  format = 5
//! u32 chain_ver
//! u64 committed_ver            0 = never committed (chunk only pending)
//! Version committed
//! u64 pending_ver              0 = no pending version
//! u8  pending_kind             (only if pending_ver != 0) 1 = data, 2 = removed
//! Version pending | Tag        data: a Version; removed: the update tag
//! Version := u8 has_block, [u8 class, u64 block_idx], u32 len, u32 crc,
//!            Tag, u32 tail_page_crc (CRC of the last, partial page; 0 if none),
//!            [only if has_block] u8 open_count, open_count × u32 open entries
//! u8  recent_count            (≤ RECENT_COMMITS) then per entry:
//!     Tag, u64 version, u32 len, u32 crc   older committed versions' tags
//! u64 journal_lsn             the append journal's newest LSN at write time
//! Tag := u64 client, u64 request
//! ```
//!
//! Page checksums of **full** pages live per block, not per record, in
//! segments of 64 entries: key `b'b' ‖ class ‖ block_idx (u64 BE) ‖ segment
//! (u32 BE)`, value 64 × u32 LE. Only **complete** segments are stored as
//! keys (format 4 and later); the entries of the version's last, incomplete segment
//! (`full pages % 64` of them, the "open" entries) are in the record. A full
//! page of a block never changes while a version that covers it references
//! the block (in-place writes only go past the committed length), so the
//! committed and an in-place pending version share the complete segments,
//! and an append writes the record plus only the segments it completed:
//! three of four 64 KiB appends (16 pages of 4 KiB) write one key. Segments
//! past a version's complete ones are ignored, so stale segments of a freed
//! block are harmless; a new version written into a block rewrites every
//! complete segment it uses. (Format 3 stored the incomplete segment as a
//! shorter key instead; such records and keys are still read.)

use crate::error::{ChunkError, Result};
use crate::layout::{SizeClass, MAX_CHUNK_BYTES};
use fskv_types::ChunkId;
use serde::Serialize;

const FORMAT: u8 = 5;
const FORMAT_V4: u8 = 4;
const FORMAT_V3: u8 = 3;
const FORMAT_V2: u8 = 2;
/// Committed versions before the current one whose update tags are kept, so
/// a retried write is recognised even after other writes to the chunk
/// committed in between.
pub const RECENT_COMMITS: usize = 8;
pub(crate) const SEGMENT_PAGES: usize = 64;
const SEGMENT_KEY_PREFIX: u8 = b'b';
pub(crate) const CHUNK_KEY_PREFIX: u8 = b'c';

pub(crate) fn chunk_key(id: ChunkId) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = CHUNK_KEY_PREFIX;
    k[1..].copy_from_slice(&id.to_bytes());
    k
}

/// The RocksDB key of a page-table segment (public for the fuzz target `chunk_records` only).
#[doc(hidden)]
pub fn segment_key(block: BlockRef, segment: u32) -> [u8; 14] {
    let mut k = [0u8; 14];
    k[0] = SEGMENT_KEY_PREFIX;
    k[1] = block.class;
    k[2..10].copy_from_slice(&block.index.to_be_bytes());
    k[10..].copy_from_slice(&segment.to_be_bytes());
    k
}

pub(crate) fn chunk_from_key(key: &[u8]) -> Result<ChunkId> {
    match key.split_first() {
        Some((&CHUNK_KEY_PREFIX, rest)) => {
            ChunkId::from_bytes(rest).ok_or_else(|| ChunkError::CorruptMetadata(format!("chunk key of {} bytes", key.len())))
        }
        _ => Err(ChunkError::CorruptMetadata("key without chunk prefix".into())),
    }
}

/// Identifies the request that produced a version, so a retried update is
/// applied once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct UpdateTag {
    pub client: u64,
    pub request: u64,
}

/// Position of a block: size class and pool-wide index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct BlockRef {
    pub class: u8,
    pub index: u64,
}

/// One version of a chunk's content.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VersionData {
    /// `None` only for an empty chunk.
    pub block: Option<BlockRef>,
    pub len_bytes: u32,
    /// CRC32C of the whole content.
    pub crc: u32,
    pub tag: UpdateTag,
    /// CRC32C of each page (`SizeClass::crc_page_bytes`) of the content;
    /// the last page may be partial.
    #[serde(skip)]
    pub page_crcs: Vec<u32>,
}

/// The in-flight version of a chunk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum PendingState {
    Data(VersionData),
    Removed { tag: UpdateTag },
}

impl PendingState {
    pub fn tag(&self) -> UpdateTag {
        match self {
            PendingState::Data(v) => v.tag,
            PendingState::Removed { tag } => *tag,
        }
    }

    pub fn block(&self) -> Option<BlockRef> {
        match self {
            PendingState::Data(v) => v.block,
            PendingState::Removed { .. } => None,
        }
    }
}

/// Everything the engine records about one chunk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkMeta {
    pub chain_ver: u32,
    /// 0 when the chunk was never committed.
    pub committed_ver: u64,
    pub committed: VersionData,
    /// `(pending_ver, state)`; `pending_ver == committed_ver + 1`.
    pub pending: Option<(u64, PendingState)>,
    /// Older committed versions (oldest first, at most [`RECENT_COMMITS`])
    /// with a non-default tag, for duplicate detection of late retries.
    pub recent: Vec<RecentCommit>,
}

/// A committed version that has since been replaced by a newer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RecentCommit {
    pub tag: UpdateTag,
    pub version: u64,
    pub len_bytes: u32,
    pub crc: u32,
}

impl ChunkMeta {
    /// `recent` after the current committed version is replaced by a newer one.
    pub fn recent_after_commit(&self) -> Vec<RecentCommit> {
        let mut recent = self.recent.clone();
        if self.committed_ver > 0 && self.committed.tag != UpdateTag::default() {
            recent.push(RecentCommit {
                tag: self.committed.tag,
                version: self.committed_ver,
                len_bytes: self.committed.len_bytes,
                crc: self.committed.crc,
            });
        }
        let excess = recent.len().saturating_sub(RECENT_COMMITS);
        recent.drain(..excess);
        recent
    }
}

impl ChunkMeta {
    pub fn pending_ver(&self) -> Option<u64> {
        self.pending.as_ref().map(|(v, _)| *v)
    }

    /// Blocks referenced by this record (committed first); at most two and
    /// never the same block twice.
    pub fn blocks(&self) -> Vec<BlockRef> {
        let mut out: Vec<BlockRef> = self.committed.block.into_iter().collect();
        if let Some(b) = self.pending.as_ref().and_then(|(_, p)| p.block()) {
            if !out.contains(&b) {
                out.push(b);
            }
        }
        out
    }

    /// The record value (without page tables; see [`ChunkMeta::segment_puts`]),
    /// with journal LSN 0.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_record(0)
    }

    /// The record value stamped with `journal_lsn`: the append journal's
    /// newest LSN when the record is written, so journal records of this
    /// chunk up to it are known to be superseded (see `journal.rs`).
    pub fn encode_record(&self, journal_lsn: u64) -> Vec<u8> {
        let mut w = self.encode_format(FORMAT);
        w.extend_from_slice(&journal_lsn.to_le_bytes());
        w
    }

    /// The record body in format 5 (without its trailing LSN), 4, or (tests
    /// of the upgrade path) 3.
    fn encode_format(&self, format: u8) -> Vec<u8> {
        let mut w = Vec::with_capacity(128);
        w.push(format);
        w.extend_from_slice(&self.chain_ver.to_le_bytes());
        w.extend_from_slice(&self.committed_ver.to_le_bytes());
        encode_version(&mut w, &self.committed, format);
        match &self.pending {
            None => w.extend_from_slice(&0u64.to_le_bytes()),
            Some((ver, state)) => {
                w.extend_from_slice(&ver.to_le_bytes());
                match state {
                    PendingState::Data(v) => {
                        w.push(1);
                        encode_version(&mut w, v, format);
                    }
                    PendingState::Removed { tag } => {
                        w.push(2);
                        encode_tag(&mut w, *tag);
                    }
                }
            }
        }
        debug_assert!(self.recent.len() <= RECENT_COMMITS);
        let recent = &self.recent[self.recent.len().saturating_sub(RECENT_COMMITS)..];
        w.push(recent.len() as u8);
        for r in recent {
            encode_tag(&mut w, r.tag);
            w.extend_from_slice(&r.version.to_le_bytes());
            w.extend_from_slice(&r.len_bytes.to_le_bytes());
            w.extend_from_slice(&r.crc.to_le_bytes());
        }
        w
    }

    fn versions(&self) -> impl Iterator<Item = &VersionData> {
        let pending = match &self.pending {
            Some((_, PendingState::Data(v))) => Some(v),
            _ => None,
        };
        std::iter::once(&self.committed).chain(pending)
    }

    /// Page-table segments to write with this record, given the record it
    /// replaces: for each version, the complete segments not already
    /// persisted for its block by a version of `old` that it extends.
    pub fn segment_puts(&self, old: Option<&ChunkMeta>) -> Result<Vec<([u8; 14], Vec<u8>)>> {
        self.segment_puts_format(old, FORMAT)
    }

    /// `segment_puts` for a record of `format`: 4 writes complete segments
    /// only; 3 (tests of the upgrade path) also the incomplete last one.
    fn segment_puts_format(&self, old: Option<&ChunkMeta>, format: u8) -> Result<Vec<([u8; 14], Vec<u8>)>> {
        let mut puts: Vec<([u8; 14], Vec<u8>)> = Vec::new();
        for v in self.versions() {
            let Some(block) = v.block else { continue };
            let page = class_page_bytes(block.class)?;
            let full_pages = (v.len_bytes as u64 / page) as usize;
            // Pages that go into segment keys.
            let full = if format >= FORMAT_V4 { full_pages / SEGMENT_PAGES * SEGMENT_PAGES } else { full_pages };
            let persisted = old.map_or(0, |o| persisted_full_pages(o, block, v, page));
            let first_seg = persisted / SEGMENT_PAGES;
            let mut seg = first_seg;
            while seg * SEGMENT_PAGES < full && persisted < full {
                let key = segment_key(block, seg as u32);
                let end = ((seg + 1) * SEGMENT_PAGES).min(full);
                let mut value = Vec::with_capacity((end - seg * SEGMENT_PAGES) * 4);
                for c in &v.page_crcs[seg * SEGMENT_PAGES..end] {
                    value.extend_from_slice(&c.to_le_bytes());
                }
                if let Some(slot) = puts.iter_mut().find(|(k, _)| *k == key) {
                    if value.len() > slot.1.len() {
                        slot.1 = value;
                    }
                } else {
                    puts.push((key, value));
                }
                seg += 1;
            }
        }
        Ok(puts)
    }

    /// Decodes a record, reading its page-table segments with `segment`.
    pub fn decode(bytes: &[u8], segment: impl FnMut(BlockRef, u32) -> Result<Option<Vec<u8>>>) -> Result<ChunkMeta> {
        Ok(Self::decode_record(bytes, segment)?.0)
    }

    /// `decode`, also returning the record's journal LSN (0 before format 5).
    pub fn decode_record(bytes: &[u8], mut segment: impl FnMut(BlockRef, u32) -> Result<Option<Vec<u8>>>) -> Result<(ChunkMeta, u64)> {
        let mut r = Reader { buf: bytes };
        let format = r.u8()?;
        if ![FORMAT, FORMAT_V4, FORMAT_V3, FORMAT_V2].contains(&format) {
            return Err(ChunkError::CorruptMetadata(format!("unknown chunk record format {format}")));
        }
        let chain_ver = r.u32()?;
        let committed_ver = r.u64()?;
        let committed = decode_version(&mut r, &mut segment, format)?;
        let pending_ver = r.u64()?;
        let pending = if pending_ver == 0 {
            None
        } else {
            let state = match r.u8()? {
                1 => PendingState::Data(decode_version(&mut r, &mut segment, format)?),
                2 => PendingState::Removed { tag: decode_tag(&mut r)? },
                k => return Err(ChunkError::CorruptMetadata(format!("unknown pending kind {k}"))),
            };
            Some((pending_ver, state))
        };
        let mut recent = Vec::new();
        if format != FORMAT_V2 {
            let count = r.u8()? as usize;
            if count > RECENT_COMMITS {
                return Err(ChunkError::CorruptMetadata(format!("{count} recent commits (limit {RECENT_COMMITS})")));
            }
            for _ in 0..count {
                recent.push(RecentCommit { tag: decode_tag(&mut r)?, version: r.u64()?, len_bytes: r.u32()?, crc: r.u32()? });
            }
        }
        let journal_lsn = if format >= FORMAT { r.u64()? } else { 0 };
        if !r.buf.is_empty() {
            return Err(ChunkError::CorruptMetadata(format!("{} trailing bytes in chunk record", r.buf.len())));
        }
        Ok((ChunkMeta { chain_ver, committed_ver, committed, pending, recent }, journal_lsn))
    }
}

fn class_page_bytes(class: u8) -> Result<u64> {
    SizeClass::new(class).map(SizeClass::crc_page_bytes).ok_or_else(|| ChunkError::CorruptMetadata(format!("size class {class}")))
}

/// Full pages of `v` already persisted in `block` by a version of `old`
/// whose full pages are a prefix of `v`'s.
fn persisted_full_pages(old: &ChunkMeta, block: BlockRef, v: &VersionData, page: u64) -> usize {
    old.versions()
        .filter(|w| w.block == Some(block))
        .map(|w| (w.len_bytes as u64 / page) as usize)
        .filter(|&n| n <= v.page_crcs.len() && old_prefix_matches(old, block, v, n))
        .max()
        .unwrap_or(0)
}

fn old_prefix_matches(old: &ChunkMeta, block: BlockRef, v: &VersionData, n: usize) -> bool {
    old.versions().filter(|w| w.block == Some(block)).any(|w| w.page_crcs.len() >= n && w.page_crcs[..n] == v.page_crcs[..n])
}

fn encode_tag(w: &mut Vec<u8>, tag: UpdateTag) {
    w.extend_from_slice(&tag.client.to_le_bytes());
    w.extend_from_slice(&tag.request.to_le_bytes());
}

fn encode_version(w: &mut Vec<u8>, v: &VersionData, format: u8) {
    match v.block {
        None => w.push(0),
        Some(b) => {
            w.push(1);
            w.push(b.class);
            w.extend_from_slice(&b.index.to_le_bytes());
        }
    }
    w.extend_from_slice(&v.len_bytes.to_le_bytes());
    w.extend_from_slice(&v.crc.to_le_bytes());
    encode_tag(w, v.tag);
    let page = v.block.and_then(|b| class_page_bytes(b.class).ok());
    let tail = match page {
        Some(page) if !(v.len_bytes as u64).is_multiple_of(page) => v.page_crcs.last().copied().unwrap_or(0),
        _ => 0,
    };
    w.extend_from_slice(&tail.to_le_bytes());
    if format >= FORMAT_V4 && v.block.is_some() {
        // The open entries: full pages past the last complete segment.
        let full = page.map_or(0, |p| (v.len_bytes as u64 / p) as usize).min(v.page_crcs.len());
        let open = &v.page_crcs[full / SEGMENT_PAGES * SEGMENT_PAGES..full];
        w.push(open.len() as u8);
        for c in open {
            w.extend_from_slice(&c.to_le_bytes());
        }
    }
}

fn decode_tag(r: &mut Reader) -> Result<UpdateTag> {
    Ok(UpdateTag { client: r.u64()?, request: r.u64()? })
}

fn decode_version(r: &mut Reader, segment: &mut impl FnMut(BlockRef, u32) -> Result<Option<Vec<u8>>>, format: u8) -> Result<VersionData> {
    let block = match r.u8()? {
        0 => None,
        1 => {
            let class = r.u8()?;
            class_page_bytes(class)?;
            Some(BlockRef { class, index: r.u64()? })
        }
        k => return Err(ChunkError::CorruptMetadata(format!("block flag {k}"))),
    };
    let len_bytes = r.u32()?;
    let crc = r.u32()?;
    let tag = decode_tag(r)?;
    let tail = r.u32()?;
    let open = match block {
        Some(_) if format >= FORMAT_V4 => {
            let n = r.u8()? as usize;
            if n >= SEGMENT_PAGES {
                return Err(ChunkError::CorruptMetadata(format!("{n} open page-table entries")));
            }
            let mut open = Vec::with_capacity(n);
            for _ in 0..n {
                open.push(r.u32()?);
            }
            Some(open)
        }
        _ => None,
    };
    let page_crcs = match block {
        None => Vec::new(),
        Some(b) => load_page_table(b, len_bytes, (tail, open), segment)?,
    };
    let v = VersionData { block, len_bytes, crc, tag, page_crcs };
    check_version_shape(&v)?;
    Ok(v)
}

/// Full-page entries from the block's segments (format 4 and later: the complete
/// ones, then the record's `open` entries; format 3: all from segments),
/// then the tail page's CRC.
fn load_page_table(
    block: BlockRef,
    len_bytes: u32,
    (tail, open): (u32, Option<Vec<u32>>),
    segment: &mut impl FnMut(BlockRef, u32) -> Result<Option<Vec<u8>>>,
) -> Result<Vec<u32>> {
    let page = class_page_bytes(block.class)?;
    if len_bytes as u64 > MAX_CHUNK_BYTES {
        return Err(ChunkError::CorruptMetadata(format!("length {len_bytes}")));
    }
    let full_pages = (len_bytes as u64 / page) as usize;
    let full = match &open {
        Some(open) if open.len() != full_pages % SEGMENT_PAGES => {
            return Err(ChunkError::CorruptMetadata(format!("{} open page-table entries for {full_pages} full pages", open.len())));
        }
        Some(_) => full_pages / SEGMENT_PAGES * SEGMENT_PAGES,
        None => full_pages,
    };
    let mut table = Vec::with_capacity(full_pages + 1);
    let mut seg = 0u32;
    while table.len() < full {
        let want = (full - table.len()).min(SEGMENT_PAGES);
        let value = segment(block, seg)?.unwrap_or_default();
        if value.len() < want * 4 {
            return Err(ChunkError::CorruptMetadata(format!(
                "page table segment {seg} of {block:?} has {} bytes, need {}",
                value.len(),
                want * 4
            )));
        }
        for c in value[..want * 4].chunks_exact(4) {
            table.push(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        }
        seg += 1;
    }
    table.extend(open.unwrap_or_default());
    if !(len_bytes as u64).is_multiple_of(page) {
        table.push(tail);
    }
    Ok(table)
}

/// A version's block, length and page table must agree.
fn check_version_shape(v: &VersionData) -> Result<()> {
    let Some(b) = v.block else {
        return if v.len_bytes == 0 && v.page_crcs.is_empty() {
            Ok(())
        } else {
            Err(ChunkError::CorruptMetadata("content without a block".into()))
        };
    };
    let class = SizeClass::new(b.class).ok_or_else(|| ChunkError::CorruptMetadata("size class".into()))?;
    let pages = (v.len_bytes as u64).div_ceil(class.crc_page_bytes());
    if v.len_bytes as u64 > class.block_bytes() || pages != v.page_crcs.len() as u64 {
        return Err(ChunkError::CorruptMetadata(format!(
            "length {} / {} page checksums do not fit class {}",
            v.len_bytes,
            v.page_crcs.len(),
            b.class
        )));
    }
    Ok(())
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        if self.buf.len() < N {
            return Err(ChunkError::CorruptMetadata("truncated chunk record".into()));
        }
        let (head, rest) = self.buf.split_at(N);
        self.buf = rest;
        let mut out = [0u8; N];
        out.copy_from_slice(head);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn store(meta: &ChunkMeta, old: Option<&ChunkMeta>, segs: &mut HashMap<[u8; 14], Vec<u8>>) -> Vec<u8> {
        for (k, v) in meta.segment_puts(old).unwrap() {
            segs.insert(k, v);
        }
        meta.encode()
    }

    fn load(bytes: &[u8], segs: &HashMap<[u8; 14], Vec<u8>>) -> Result<ChunkMeta> {
        ChunkMeta::decode(bytes, |b, s| Ok(segs.get(&segment_key(b, s)).cloned()))
    }

    fn version(len_bytes: u32, pages: usize, seed: u32) -> VersionData {
        VersionData {
            block: Some(BlockRef { class: 4, index: 9 }),
            len_bytes,
            crc: 0xdead_beef,
            tag: UpdateTag { client: 1, request: 2 },
            page_crcs: (0..pages as u32).map(|i| i * 7 + seed).collect(),
        }
    }

    #[test]
    fn record_round_trips_and_rejects_garbage() {
        let mut segs = HashMap::new();
        let meta = ChunkMeta {
            chain_ver: 7,
            committed_ver: 3,
            committed: version(300_000, 74, 0),
            pending: Some((4, PendingState::Removed { tag: UpdateTag { client: 1, request: 3 } })),
            recent: vec![RecentCommit { tag: UpdateTag { client: 1, request: 1 }, version: 2, len_bytes: 5, crc: 6 }],
        };
        let bytes = store(&meta, None, &mut segs);
        assert_eq!(segs.len(), 1, "73 full pages = 1 complete segment + 9 entries in the record");
        assert_eq!(load(&bytes, &segs).unwrap(), meta);
        for cut in 0..bytes.len() {
            assert!(load(&bytes[..cut], &segs).is_err());
        }
        let mut bad = bytes.clone();
        bad[0] = 9;
        assert!(load(&bad, &segs).is_err());
        assert!(load(&bytes, &HashMap::new()).is_err(), "missing page table");
    }

    #[test]
    fn in_place_append_writes_only_completed_segments() {
        let mut segs = HashMap::new();
        let committed = version(200 * 4096, 200, 0);
        let c = ChunkMeta { chain_ver: 1, committed_ver: 1, committed: committed.clone(), pending: None, recent: vec![] };
        let bytes = store(&c, None, &mut segs);
        assert_eq!(segs.len(), 3, "segments 0..2 complete, 8 entries in the record");
        assert_eq!(load(&bytes, &segs).unwrap(), c);
        // Pending extends the same block by 16 pages, still inside segment 3:
        // no key besides the record.
        let mut p = version(216 * 4096, 216, 0);
        p.page_crcs[..200].copy_from_slice(&committed.page_crcs);
        let with_pending = ChunkMeta { pending: Some((2, PendingState::Data(p.clone()))), ..c.clone() };
        assert!(with_pending.segment_puts(Some(&c)).unwrap().is_empty());
        let bytes = store(&with_pending, Some(&c), &mut segs);
        assert_eq!(load(&bytes, &segs).unwrap(), with_pending);
        // Commit: nothing new to write.
        let c2 = ChunkMeta { chain_ver: 1, committed_ver: 2, committed: p.clone(), pending: None, recent: c.recent_after_commit() };
        assert!(c2.segment_puts(Some(&with_pending)).unwrap().is_empty());
        let bytes = store(&c2, Some(&with_pending), &mut segs);
        assert_eq!(load(&bytes, &segs).unwrap(), c2);
        // An append that completes segment 3 writes exactly that segment.
        let mut p3 = version(256 * 4096, 256, 0);
        p3.page_crcs[..216].copy_from_slice(&p.page_crcs);
        let c3 = ChunkMeta { committed_ver: 3, committed: p3, recent: c2.recent_after_commit(), ..c2.clone() };
        let puts = c3.segment_puts(Some(&c2)).unwrap();
        assert_eq!(puts.len(), 1);
        assert_eq!(puts[0].0, segment_key(BlockRef { class: 4, index: 9 }, 3));
        assert_eq!(puts[0].1.len(), 64 * 4);
        let bytes = store(&c3, Some(&c2), &mut segs);
        assert_eq!(load(&bytes, &segs).unwrap(), c3);
        // Open entries that disagree with the length are refused.
        let mut bad = c3.clone();
        bad.committed.len_bytes = 230 * 4096;
        bad.committed.page_crcs = (0..230).collect();
        let bytes = bad.encode();
        assert!(load(&bytes, &segs).is_ok());
        let mut short = bytes.clone();
        // Claim one open entry fewer than the length needs (and drop it).
        let open_at = 1 + 4 + 8 + 1 + 1 + 8 + 4 + 4 + 16 + 4;
        short[open_at] -= 1;
        short.drain(open_at + 1..open_at + 5);
        assert!(load(&short, &segs).is_err());
    }

    #[test]
    fn format_3_records_and_partial_segments_are_read_and_upgraded() {
        let mut segs = HashMap::new();
        let v = version(100 * 4096 + 7, 101, 3);
        let c = ChunkMeta { chain_ver: 2, committed_ver: 5, committed: v.clone(), pending: None, recent: vec![] };
        // As the previous version wrote it: segment 1 partial (36 entries) in a key.
        for (k, val) in c.segment_puts_format(None, FORMAT_V3).unwrap() {
            segs.insert(k, val);
        }
        assert_eq!(segs.len(), 2);
        let v3 = c.encode_format(FORMAT_V3);
        assert_eq!(v3[0], 3);
        let decoded = load(&v3, &segs).unwrap();
        assert_eq!(decoded, c);
        // The next record (an append in place) is format 5 and needs no new
        // key: segment 0 is complete, pages 64..120 go into the record.
        let mut p = version(120 * 4096, 120, 3);
        p.page_crcs[..100].copy_from_slice(&v.page_crcs[..100]);
        let next = ChunkMeta { committed_ver: 6, committed: p, ..decoded.clone() };
        assert!(next.segment_puts(Some(&decoded)).unwrap().is_empty());
        let v5 = next.encode_record(77);
        assert_eq!(v5[0], 5);
        assert_eq!(load(&v5, &segs).unwrap(), next);
        let (_, lsn) = ChunkMeta::decode_record(&v5, |b, s| Ok(segs.get(&segment_key(b, s)).cloned())).unwrap();
        assert_eq!(lsn, 77);
        // Format 4 (no journal LSN) is still read, as LSN 0.
        let v4 = next.encode_format(FORMAT_V4);
        let (again, lsn) = ChunkMeta::decode_record(&v4, |b, s| Ok(segs.get(&segment_key(b, s)).cloned())).unwrap();
        assert_eq!((again, lsn), (next, 0));
    }
}
