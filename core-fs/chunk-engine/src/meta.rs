//! Chunk metadata records and their on-disk encoding.
//!
//! Key: `b'c'` followed by `ChunkId::to_bytes()` (inode then index, both
//! big-endian), so all chunks of a file are adjacent and the last one is a
//! single `seek_for_prev`.
//!
//! Value (little-endian, format 1):
//! ```text
//! u8  format = 1
//! u32 chain_ver
//! u64 committed_ver            0 = never committed (chunk only pending)
//! Version committed
//! u64 pending_ver              0 = no pending version
//! u8  pending_kind             (only if pending_ver != 0) 1 = data, 2 = removed
//! Version pending | Tag        data: a Version; removed: the update tag
//! Version := u8 has_block, [u8 class, u64 block_idx], u32 len, u32 crc,
//!            Tag, u32 shared_pages, u32 n_own, n_own * u32 page_crc
//!            (the page table is the first `shared_pages` entries of the
//!            committed table followed by the own entries; always 0 shared
//!            for the committed version. An in-place pending version shares
//!            all but its last pages, which halves the update record.)
//! Tag := u64 client, u64 request
//! ```

use crate::error::{ChunkError, Result};
use crate::layout::SizeClass;
use fskv_types::ChunkId;
use serde::Serialize;

const FORMAT: u8 = 1;
pub(crate) const CHUNK_KEY_PREFIX: u8 = b'c';

pub(crate) fn chunk_key(id: ChunkId) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = CHUNK_KEY_PREFIX;
    k[1..].copy_from_slice(&id.to_bytes());
    k
}

pub(crate) fn chunk_from_key(key: &[u8]) -> Result<ChunkId> {
    match key.split_first() {
        Some((&CHUNK_KEY_PREFIX, rest)) => ChunkId::from_bytes(rest)
            .ok_or_else(|| ChunkError::CorruptMetadata(format!("chunk key of {} bytes", key.len()))),
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

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64 + 4 * self.committed.page_crcs.len());
        w.push(FORMAT);
        w.extend_from_slice(&self.chain_ver.to_le_bytes());
        w.extend_from_slice(&self.committed_ver.to_le_bytes());
        encode_version(&mut w, &self.committed, &[]);
        match &self.pending {
            None => w.extend_from_slice(&0u64.to_le_bytes()),
            Some((ver, state)) => {
                w.extend_from_slice(&ver.to_le_bytes());
                match state {
                    PendingState::Data(v) => {
                        w.push(1);
                        encode_version(&mut w, v, &self.committed.page_crcs);
                    }
                    PendingState::Removed { tag } => {
                        w.push(2);
                        encode_tag(&mut w, *tag);
                    }
                }
            }
        }
        w
    }

    pub fn decode(bytes: &[u8]) -> Result<ChunkMeta> {
        let mut r = Reader { buf: bytes };
        let format = r.u8()?;
        if format != FORMAT {
            return Err(ChunkError::CorruptMetadata(format!("unknown chunk record format {format}")));
        }
        let chain_ver = r.u32()?;
        let committed_ver = r.u64()?;
        let committed = decode_version(&mut r, &[])?;
        let pending_ver = r.u64()?;
        let pending = if pending_ver == 0 {
            None
        } else {
            let state = match r.u8()? {
                1 => PendingState::Data(decode_version(&mut r, &committed.page_crcs)?),
                2 => PendingState::Removed { tag: decode_tag(&mut r)? },
                k => return Err(ChunkError::CorruptMetadata(format!("unknown pending kind {k}"))),
            };
            Some((pending_ver, state))
        };
        if !r.buf.is_empty() {
            return Err(ChunkError::CorruptMetadata(format!("{} trailing bytes in chunk record", r.buf.len())));
        }
        Ok(ChunkMeta { chain_ver, committed_ver, committed, pending })
    }
}

fn encode_tag(w: &mut Vec<u8>, tag: UpdateTag) {
    w.extend_from_slice(&tag.client.to_le_bytes());
    w.extend_from_slice(&tag.request.to_le_bytes());
}

fn encode_version(w: &mut Vec<u8>, v: &VersionData, shareable: &[u32]) {
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
    let shared = v.page_crcs.iter().zip(shareable).take_while(|(a, b)| a == b).count();
    let own = &v.page_crcs[shared..];
    w.extend_from_slice(&(shared as u32).to_le_bytes());
    w.extend_from_slice(&(own.len() as u32).to_le_bytes());
    w.reserve(own.len() * 4);
    for c in own {
        w.extend_from_slice(&c.to_le_bytes());
    }
}

fn decode_tag(r: &mut Reader) -> Result<UpdateTag> {
    Ok(UpdateTag { client: r.u64()?, request: r.u64()? })
}

fn decode_version(r: &mut Reader, shareable: &[u32]) -> Result<VersionData> {
    let block = match r.u8()? {
        0 => None,
        1 => {
            let class = r.u8()?;
            SizeClass::new(class).ok_or_else(|| ChunkError::CorruptMetadata(format!("size class {class}")))?;
            Some(BlockRef { class, index: r.u64()? })
        }
        k => return Err(ChunkError::CorruptMetadata(format!("block flag {k}"))),
    };
    let len_bytes = r.u32()?;
    let crc = r.u32()?;
    let tag = decode_tag(r)?;
    let shared = r.u32()? as usize;
    let n_own = r.u32()? as usize;
    if shared > shareable.len() || shared + n_own > 1024 {
        return Err(ChunkError::CorruptMetadata(format!("{shared} shared + {n_own} page checksums")));
    }
    let mut page_crcs = Vec::with_capacity(shared + n_own);
    page_crcs.extend_from_slice(&shareable[..shared]);
    for _ in 0..n_own {
        page_crcs.push(r.u32()?);
    }
    let v = VersionData { block, len_bytes, crc, tag, page_crcs };
    check_version_shape(&v)?;
    Ok(v)
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

    #[test]
    fn record_round_trips_and_rejects_garbage() {
        let meta = ChunkMeta {
            chain_ver: 7,
            committed_ver: 3,
            committed: VersionData {
                block: Some(BlockRef { class: 0, index: 9 }),
                len_bytes: 5000,
                crc: 0xdead_beef,
                tag: UpdateTag { client: 1, request: 2 },
                page_crcs: vec![1, 2],
            },
            pending: Some((4, PendingState::Removed { tag: UpdateTag { client: 1, request: 3 } })),
        };
        let mut shared = meta.clone();
        shared.pending = Some((
            4,
            PendingState::Data(VersionData { len_bytes: 9000, page_crcs: vec![1, 2, 3], ..meta.committed.clone() }),
        ));
        let bytes = shared.encode();
        assert_eq!(ChunkMeta::decode(&bytes).unwrap(), shared);
        assert!(bytes.len() < meta.encode().len() + 60, "pending shares the committed prefix");
        let bytes = meta.encode();
        assert_eq!(ChunkMeta::decode(&bytes).unwrap(), meta);
        for cut in 0..bytes.len() {
            assert!(ChunkMeta::decode(&bytes[..cut]).is_err());
        }
        let mut bad = bytes.clone();
        bad[0] = 9;
        assert!(ChunkMeta::decode(&bad).is_err());
    }
}
