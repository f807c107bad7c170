//! What the chunk engine decodes by hand when it reads its own disk back:
//! chunk metadata records (RocksDB values, formats 2 to 5, with their
//! page-table segments) and append-journal records (the memory-mapped
//! journal file scanned at open). A damaged disk or a bug elsewhere may put
//! anything there; the engine must report corruption, never panic.
//!
//! The first byte picks the parser. Chunk record: the input is the record
//! followed by segment values the decoder may ask for; a record that
//! decodes is encoded again (format 5) with the segments it would write,
//! and that decodes to the same metadata and journal LSN. Journal: the
//! target fixes up the CRC of every record it can find (a record the engine
//! wrote, or one forged with a correct CRC), then each record that decodes
//! re-encodes to its own bytes, and the open-time scan replays consecutive
//! LSNs only.
#![no_main]

use fskv_chunk_engine::checksum::crc32c;
use fskv_chunk_engine::journal::fuzzing as journal;
use fskv_chunk_engine::meta::{segment_key, BlockRef, ChunkMeta};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fn chunk_record(data: &[u8]) {
    let [split, rest @ ..] = data else { return };
    let at = (usize::from(*split) * 4).min(rest.len());
    let (record, segs) = rest.split_at(at);
    // Segment n is the n-th 64-byte piece of the rest (none past the end).
    let from_disk = |_b: BlockRef, seg: u32| -> fskv_chunk_engine::error::Result<Option<Vec<u8>>> {
        let start = seg as usize * 64;
        Ok(segs.get(start..).map(|s| s[..s.len().min(64 * 4)].to_vec()))
    };
    let Ok((meta, lsn)) = ChunkMeta::decode_record(record, from_disk) else { return };
    let bytes = meta.encode_record(lsn);
    let puts: HashMap<[u8; 14], Vec<u8>> = meta.segment_puts(None).expect("a decoded record's segments encode").into_iter().collect();
    let stored =
        |b: BlockRef, seg: u32| -> fskv_chunk_engine::error::Result<Option<Vec<u8>>> { Ok(puts.get(&segment_key(b, seg)).cloned()) };
    let (again, lsn2) = ChunkMeta::decode_record(&bytes, stored).expect("a re-encoded record decodes");
    assert_eq!(again, meta, "chunk record round trip");
    assert_eq!(lsn2, lsn);
}

fn journal_file(data: &[u8]) {
    let mut buf = data.to_vec();
    // Fix up CRCs along the chain of records as the lengths lay them out,
    // in both halves (the file is two regions).
    let region = buf.len() / 2;
    for r in 0..2 {
        let mut at = r * region;
        let end = (r + 1) * region;
        while at + 8 <= end {
            let len = u32::from_le_bytes([buf[at + 4], buf[at + 5], buf[at + 6], buf[at + 7]]) as usize;
            if len < 8 || at + len > end {
                break;
            }
            let crc = crc32c(&buf[at + 4..at + len]);
            buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
            at += len;
        }
    }
    for r in 0..2 {
        let region_bytes = &buf[r * region..(r + 1) * region];
        if let Some(re) = journal::decode_reencode(region_bytes) {
            assert_eq!(&region_bytes[..re.len()], &re[..], "journal record round trip");
        }
    }
    let lsns = journal::scan_lsns(&buf);
    assert!(lsns.windows(2).all(|w| w[0] <= w[1]), "replay is in LSN order");
}

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else { return };
    if which & 1 == 0 {
        chunk_record(rest)
    } else {
        journal_file(rest)
    }
});
