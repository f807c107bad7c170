//! Bookkeeping of acknowledged writes for the kill -9 tests: writer `w`
//! writes region `r` of chunk `w` with the pattern of its generation; every
//! acknowledged (region → generation) must read back.

use bytes::Bytes;
use fskv_client::storage::StorageClient;
use fskv_types::{ChainId, ChunkId, InodeId};
use std::collections::BTreeMap;

pub const REGION_BYTES: u64 = 4096;

/// Per writer: region → generation of the last acknowledged write.
pub type Acked = BTreeMap<u64, BTreeMap<u64, u64>>;

pub fn pattern(writer: u64, region: u64, generation: u64) -> Bytes {
    Bytes::from((0..REGION_BYTES).map(|i| (writer * 31 + region * 7 + generation * 13 + i) as u8 ^ 0x5a).collect::<Vec<u8>>())
}

/// Where the writers wrote: chunk `w` of `inode` on `chain`, each
/// `regions_per_chunk` regions long.
pub struct Written {
    pub chain: ChainId,
    pub inode: InodeId,
    pub regions_per_chunk: u64,
}

/// Reads every writer's chunk `rounds` times (strict reads, so each may be
/// served by another replica) and checks every acknowledged region.
pub async fn check_acked(c: &StorageClient, at: &Written, acked: &Acked, rounds: usize) {
    for (w, regions) in acked {
        let chunk = ChunkId::new(at.inode, *w);
        for _ in 0..rounds {
            let d = c.read(at.chain, chunk, 0, (REGION_BYTES * at.regions_per_chunk) as u32, false).await.expect("read");
            assert!(!d.uncommitted, "writer {w}: a strict read returned uncommitted data");
            for (r, generation) in regions {
                let (s, e) = ((r * REGION_BYTES) as usize, ((r + 1) * REGION_BYTES) as usize);
                assert!(d.data.len() >= e, "writer {w}: acked region {r} missing (len {})", d.data.len());
                assert!(d.data[s..e] == pattern(*w, *r, *generation)[..], "writer {w}: acked region {r} gen {generation} lost");
            }
        }
    }
}
