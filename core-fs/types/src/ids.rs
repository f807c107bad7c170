//! Identifiers. Each is a newtype so that a chain id is never passed where a
//! target id is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    };
}

id_newtype!(
    /// A storage, meta or mgmtd process registered with mgmtd.
    NodeId(u32), "node-"
);
id_newtype!(
    /// One replica slot on one disk of one storage node.
    TargetId(u64), "target-"
);
id_newtype!(
    /// An ordered list of targets holding the same chunks.
    ChainId(u32), "chain-"
);
id_newtype!(
    /// A file, directory or symlink.
    InodeId(u64), "inode-"
);

impl InodeId {
    /// The root directory of every filesystem.
    pub const ROOT: InodeId = InodeId(1);
}

/// A chunk: the unit of file data stored on one chain.
///
/// The 16-byte encoding is the inode id then the chunk index, both
/// big-endian, so that all chunks of one file are adjacent in a sorted store
/// and the last chunk of a file on a target is one reverse seek from
/// `ChunkId::new(inode, u64::MAX)`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChunkId {
    pub inode: InodeId,
    pub index: u64,
}

impl ChunkId {
    pub const ENCODED_LEN: usize = 16;

    pub fn new(inode: InodeId, index: u64) -> Self {
        ChunkId { inode, index }
    }

    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.inode.0.to_be_bytes());
        out[8..].copy_from_slice(&self.index.to_be_bytes());
        out
    }

    /// Decodes the 16-byte form; `None` if `bytes` has another length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let inode: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
        let index: [u8; 8] = bytes.get(8..16)?.try_into().ok()?;
        if bytes.len() != Self::ENCODED_LEN {
            return None;
        }
        Some(ChunkId { inode: InodeId(u64::from_be_bytes(inode)), index: u64::from_be_bytes(index) })
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chunk-{}.{}", self.inode.0, self.index)
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_id_order_matches_byte_order() {
        let ids = [
            ChunkId::new(InodeId(1), 0),
            ChunkId::new(InodeId(1), 1),
            ChunkId::new(InodeId(1), 256),
            ChunkId::new(InodeId(2), 0),
            ChunkId::new(InodeId(u64::MAX), u64::MAX),
        ];
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1]);
            assert!(pair[0].to_bytes() < pair[1].to_bytes());
        }
        for id in ids {
            assert_eq!(ChunkId::from_bytes(&id.to_bytes()), Some(id));
        }
        assert_eq!(ChunkId::from_bytes(&[0u8; 15]), None);
        assert_eq!(ChunkId::from_bytes(&[0u8; 17]), None);
    }
}
