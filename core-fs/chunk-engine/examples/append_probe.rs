//! Diagnostic: per-phase timing of 64 KiB in-place appends.
//! `append_probe DIR [hint]`, env `OPS=n`, `FUSED=1`.
use fskv_chunk_engine::*;
use fskv_types::{ChunkId, InodeId};
use std::time::{Duration, Instant};

fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir_in(std::env::args().nth(1).unwrap_or(".".into()))?;
    let e = ChunkEngine::open(dir.path(), EngineConfig { sync_writes: false, ..Default::default() })?;
    let piece = vec![7u8; 65536];
    let hint = std::env::args().nth(2).map(|_| 4u64 << 20);
    // FUSED=1: `update_and_commit` (one batch, as a chain's tail) instead of update + commit.
    let fused = std::env::var("FUSED").is_ok_and(|v| v == "1");
    let ops: u64 = std::env::var("OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    // Pool growth before timing, as the bench does.
    e.reserve(hint.unwrap_or(65536), ops.div_ceil(64))?;
    let (mut upd, mut com) = (Duration::ZERO, Duration::ZERO);
    let mut slow = 0;
    let start = Instant::now();
    for op in 0..ops {
        let chunk = ChunkId::new(InodeId(1), op / 64);
        let t = Instant::now();
        let req = UpdateRequest { chunk, chain_ver: 1, kind: UpdateKind::Write { offset_bytes: (op % 64) * 65536, data: &piece }, tag: UpdateTag::default(), expected_ver: None, chunk_size_hint_bytes: hint };
        let out = if fused { e.update_and_commit(&req)? } else { e.update(&req)? };
        let t1 = t.elapsed();
        if !fused {
            e.commit(chunk, out.pending_ver)?;
        }
        let t2 = t.elapsed();
        upd += t1;
        com += t2 - t1;
        if t2 > Duration::from_millis(1) { slow += 1; }
    }
    println!("total {:?} update {:?} commit {:?} slow ops {slow}", start.elapsed(), upd, com);
    Ok(())
}
