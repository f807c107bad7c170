//! Diagnostic: per-phase timing of 64 KiB in-place appends.
//! `append_probe DIR [hint]`, env `OPS=n`, `FUSED=1`, `PIECE_KIB=k` (write
//! size; with `PIECE_KIB=1024` and no hint every write is a whole new 1 MiB
//! chunk, as the bench's `seq_write_1m`).
use fskv_chunk_engine::*;
use fskv_types::{ChunkId, InodeId};
use std::time::{Duration, Instant};

fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir_in(std::env::args().nth(1).unwrap_or(".".into()))?;
    let e = ChunkEngine::open(dir.path(), EngineConfig { sync_writes: false, ..Default::default() })?;
    let piece_bytes: u64 = std::env::var("PIECE_KIB").ok().and_then(|v| v.parse().ok()).unwrap_or(64) * 1024;
    let piece = vec![7u8; piece_bytes as usize];
    let per_chunk = ((4u64 << 20) / piece_bytes).max(1);
    let whole = piece_bytes >= 1 << 20;
    let hint = std::env::args().nth(2).map(|_| 4u64 << 20);
    // FUSED=1: `update_and_commit` (one batch, as a chain's tail) instead of update + commit.
    let fused = std::env::var("FUSED").is_ok_and(|v| v == "1");
    let ops: u64 = std::env::var("OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    // Pool growth before timing, as the bench does.
    e.reserve(if whole { piece_bytes } else { hint.unwrap_or(65536) }, if whole { ops } else { ops.div_ceil(per_chunk) })?;
    let (mut upd, mut com) = (Duration::ZERO, Duration::ZERO);
    let mut slow = 0;
    let start = Instant::now();
    for op in 0..ops {
        let (index, offset) = if whole { (op, 0) } else { (op / per_chunk, (op % per_chunk) * piece_bytes) };
        let chunk = ChunkId::new(InodeId(1), index);
        let t = Instant::now();
        let req = UpdateRequest {
            chunk,
            chain_ver: 1,
            kind: UpdateKind::Write { offset_bytes: offset, data: &piece },
            tag: UpdateTag::default(),
            expected_ver: None,
            chunk_size_hint_bytes: hint,
        };
        let out = if fused { e.update_and_commit(&req)? } else { e.update(&req)? };
        let t1 = t.elapsed();
        if !fused {
            e.commit(chunk, out.pending_ver)?;
        }
        let t2 = t.elapsed();
        upd += t1;
        com += t2 - t1;
        if t2 > Duration::from_millis(1) {
            slow += 1;
        }
    }
    println!("total {:?} update {:?} commit {:?} slow ops {slow}", start.elapsed(), upd, com);
    Ok(())
}
