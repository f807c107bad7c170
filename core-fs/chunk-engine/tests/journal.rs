//! The append journal: a chain tail's in-place appends commit with a journal
//! record instead of a RocksDB batch. These tests crash the engine (drop
//! without shutdown) around journal writes, region switches and checkpoints
//! and check what a reopen finds.

use fskv_chunk_engine::{ChunkEngine, EngineConfig, ReadMode, UpdateKind, UpdateRequest, UpdateTag, MAX_CHUNK_BYTES};
use fskv_types::{ChunkId, InodeId};
use std::sync::Arc;

fn config(region: u64, sync_writes: bool) -> EngineConfig {
    EngineConfig { blocks_per_grow: 256, sync_writes, journal_region_bytes: region, ..EngineConfig::default() }
}

fn cid(inode: u64, index: u64) -> ChunkId {
    ChunkId::new(InodeId(inode), index)
}

fn req(chunk: ChunkId, offset_bytes: u64, data: &[u8], request: u64) -> UpdateRequest<'_> {
    UpdateRequest {
        chunk,
        chain_ver: 1,
        kind: UpdateKind::Write { offset_bytes, data },
        tag: UpdateTag { client: 3, request },
        expected_ver: None,
        chunk_size_hint_bytes: Some(1 << 20),
    }
}

/// The chain tail's append: `update_and_commit` at the chunk's end.
fn tail_append(e: &ChunkEngine, chunk: ChunkId, data: &[u8], request: u64) -> bool {
    let len = e.meta(chunk).map_or(0, |m| m.committed.len_bytes as u64);
    e.update_and_commit(&req(chunk, len, data, request)).expect("update_and_commit").in_place
}

fn read_all(e: &ChunkEngine, chunk: ChunkId, mode: ReadMode) -> Vec<u8> {
    e.read(chunk, 0, MAX_CHUNK_BYTES, mode).expect("read").data
}

fn piece(chunk: u64, i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k as u64 * 7 + chunk * 31 + i * 13) as u8).collect()
}

#[test]
fn tail_appends_survive_a_crash_across_region_switches_and_checkpoints() {
    concurrent_tail_appends_then_crash(false, 120);
}

#[test]
fn synced_tail_appends_from_four_writers_survive_a_crash() {
    concurrent_tail_appends_then_crash(true, 25);
}

/// Four writers append to their own chunk; small regions (~100-byte
/// records, a dozen to a region) make them switch regions, checkpoint and
/// fall back to RocksDB many times. Then a crash and two reopens.
fn concurrent_tail_appends_then_crash(sync_writes: bool, appends: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Arc::new(ChunkEngine::open(dir.path(), config(2048, sync_writes)).expect("open"));
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let e = Arc::clone(&e);
            std::thread::spawn(move || {
                for i in 0..appends {
                    tail_append(&e, cid(50, t), &piece(t, i, 4096 + (i as usize % 3) * 1000), i + 1);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    let stats = e.journal_stats();
    assert!(stats.records > appends, "{stats:?}");
    assert!(stats.checkpoints > 2, "{stats:?}");
    // A checkpoint run by the last writer may have covered every record;
    // leave one that none covered, so the reopen must replay it.
    let mut extra = 0;
    while extra < 4 {
        let before = e.journal_stats();
        extra += 1;
        tail_append(&e, cid(50, 0), b"tail", appends + extra);
        let after = e.journal_stats();
        if after.records > before.records && after.checkpoints == before.checkpoints {
            break;
        }
    }
    let expected: Vec<Vec<u8>> = (0..4u64).map(|t| read_all(&e, cid(50, t), ReadMode::Strict)).collect();
    for (t, data) in expected.iter().enumerate() {
        let mut want: Vec<u8> = (0..appends).flat_map(|i| piece(t as u64, i, 4096 + (i as usize % 3) * 1000)).collect();
        if t == 0 {
            want.extend(b"tail".repeat(extra as usize));
        }
        assert!(*data == want, "chunk {t} before the crash");
    }
    let Ok(e) = Arc::try_unwrap(e) else { panic!("engine still shared") };
    e.simulate_crash();

    let e = ChunkEngine::open(dir.path(), config(2048, sync_writes)).expect("reopen");
    assert!(e.journal_stats().replayed > 0, "{:?}", e.journal_stats());
    e.check_invariants().expect("invariants");
    for t in 0..4u64 {
        let c = cid(50, t);
        assert!(read_all(&e, c, ReadMode::Strict) == expected[t as usize], "chunk {t} after the crash");
        assert_eq!(e.meta(c).expect("meta").committed_ver, appends + if t == 0 { extra } else { 0 });
    }
    // The journal was checkpointed at open: a second crash replays nothing.
    e.simulate_crash();
    let e = ChunkEngine::open(dir.path(), config(2048, sync_writes)).expect("reopen");
    assert_eq!(e.journal_stats().replayed, 0);
    assert!(read_all(&e, cid(50, 3), ReadMode::Strict) == expected[3]);
}

#[test]
fn a_journal_record_superseded_by_a_later_rocksdb_write_is_not_replayed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = ChunkEngine::open(dir.path(), config(1 << 20, false)).expect("open");
    let c = cid(60, 0);
    assert!(!tail_append(&e, c, b"first ", 1), "a new chunk gets a block");
    assert!(tail_append(&e, c, b"second ", 2));
    assert_eq!(e.journal_stats().records, 1);
    // Overwrite in the middle: copy-on-write, a RocksDB record.
    e.update_and_commit(&req(c, 0, b"FIRST", 3)).expect("overwrite");
    // Remove, and write the chunk anew with the same length and bytes as
    // before the overwrite, then append through the journal again.
    let remove = UpdateRequest { kind: UpdateKind::Remove, ..req(c, 0, b"", 4) };
    e.update_and_commit(&remove).expect("remove");
    e.update_and_commit(&req(c, 0, b"first ", 5)).expect("recreate");
    assert!(tail_append(&e, c, b"third", 6));
    let want = b"first third".to_vec();
    assert_eq!(read_all(&e, c, ReadMode::Strict), want);
    let ver = e.meta(c).expect("meta").committed_ver;
    e.simulate_crash();
    let e = ChunkEngine::open(dir.path(), config(1 << 20, false)).expect("reopen");
    e.check_invariants().expect("invariants");
    assert_eq!(read_all(&e, c, ReadMode::Strict), want);
    assert_eq!(e.meta(c).expect("meta").committed_ver, ver);
    assert_eq!(e.journal_stats().replayed, 1, "only the append after the re-create");
    // A removed chunk's journal records do not bring it back.
    tail_append(&e, c, b"!", 7);
    e.update_and_commit(&remove).expect("remove again");
    e.simulate_crash();
    let e = ChunkEngine::open(dir.path(), config(1 << 20, false)).expect("reopen");
    assert!(e.meta(c).is_none());
    e.check_invariants().expect("invariants");
}

#[test]
fn a_copy_on_write_after_journaled_appends_keeps_every_page_checksum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = ChunkEngine::open(dir.path(), config(1 << 20, false)).expect("open");
    let c = cid(61, 0);
    // 100 KiB pieces: 25 pages each, so segment keys (64 pages) complete
    // only in the journal.
    let mut want = Vec::new();
    for i in 0..4 {
        let p = piece(61, i, 100 * 1024);
        tail_append(&e, c, &p, i + 1);
        want.extend_from_slice(&p);
    }
    assert_eq!(e.journal_stats().records, 3);
    // A head's overwrite (pending, copy-on-write: a RocksDB record that
    // still references the committed block) on top, then a crash.
    let p = piece(61, 9, 5000);
    let out = e.update(&req(c, 10, &p, 9)).expect("update");
    assert!(!out.in_place);
    e.simulate_crash();
    let e = ChunkEngine::open(dir.path(), config(1 << 20, false)).expect("reopen");
    e.check_invariants().expect("invariants");
    assert_eq!(read_all(&e, c, ReadMode::CommittedOnly), want);
    let mut overwritten = want.clone();
    overwritten[10..10 + p.len()].copy_from_slice(&p);
    assert_eq!(read_all(&e, c, ReadMode::Relaxed), overwritten);
    e.commit(c, out.pending_ver).expect("commit");
    e.close().expect("close");
    let e = ChunkEngine::open(dir.path(), config(1 << 20, false)).expect("reopen");
    assert_eq!(read_all(&e, c, ReadMode::Strict), overwritten);
}

#[test]
fn a_heads_pending_appends_and_commits_survive_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = ChunkEngine::open(dir.path(), config(4096, false)).expect("open");
    let c = cid(64, 0);
    e.update_and_commit(&req(c, 0, b"head:", 1)).expect("first write");
    let mut want = b"head:".to_vec();
    for i in 0..60u64 {
        let p = piece(64, i, 3000);
        let out = e.update(&req(c, want.len() as u64, &p, 2 + i)).expect("update");
        assert!(out.in_place);
        want.extend_from_slice(&p);
        assert_eq!(read_all(&e, c, ReadMode::Relaxed), want);
        e.commit(c, out.pending_ver).expect("commit");
    }
    // One more left pending at the crash.
    let p = piece(64, 99, 777);
    let out = e.update(&req(c, want.len() as u64, &p, 99)).expect("update");
    let stats = e.journal_stats();
    assert_eq!((stats.records, stats.fallbacks), (121, 0), "{stats:?}");
    assert!(stats.checkpoints > 0, "{stats:?}");
    e.simulate_crash();
    let e = ChunkEngine::open(dir.path(), config(4096, false)).expect("reopen");
    e.check_invariants().expect("invariants");
    assert_eq!(read_all(&e, c, ReadMode::CommittedOnly), want);
    let meta = e.meta(c).expect("meta");
    assert_eq!((meta.committed_ver, meta.pending_ver()), (61, Some(62)));
    e.commit(c, out.pending_ver).expect("commit after reopen");
    want.extend_from_slice(&p);
    assert_eq!(read_all(&e, c, ReadMode::Strict), want);
}

#[test]
fn a_torn_journal_record_leaves_the_chunk_at_its_previous_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = ChunkEngine::open(dir.path(), config(1 << 20, false)).expect("open");
    let c = cid(62, 0);
    tail_append(&e, c, b"base", 1);
    tail_append(&e, c, b"+one", 2);
    tail_append(&e, c, b"+two", 3);
    e.simulate_crash();
    // Tear the last record: walk the records of region 0 (u32 crc, u32 len, ...).
    let path = dir.path().join("journal");
    let mut bytes = std::fs::read(&path).expect("journal");
    let (mut at, mut last) = (0usize, 0usize);
    loop {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        last = at;
        at += len;
    }
    assert_eq!(last, at / 2, "two records of the same size");
    bytes[at - 3] ^= 0xff;
    std::fs::write(&path, &bytes).expect("write journal");
    let e = ChunkEngine::open(dir.path(), config(1 << 20, false)).expect("reopen");
    assert_eq!(read_all(&e, c, ReadMode::Strict), b"base+one");
    assert_eq!(e.meta(c).expect("meta").committed_ver, 2);
    e.check_invariants().expect("invariants");
    // And the chunk takes appends again from there.
    tail_append(&e, c, b"+2", 4);
    assert_eq!(read_all(&e, c, ReadMode::Strict), b"base+one+2");
}

#[test]
fn last_chunk_and_sync_mode_see_journaled_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = ChunkEngine::open(dir.path(), config(4096, true)).expect("open");
    let (c0, c1) = (cid(63, 0), cid(63, 1));
    tail_append(&e, c0, &[1u8; 3000], 1);
    tail_append(&e, c1, &[2u8; 3000], 2);
    for i in 0..100 {
        tail_append(&e, c1, &[3u8; 700], 3 + i);
    }
    let (id, meta) = e.last_chunk(InodeId(63)).expect("last_chunk").expect("a chunk");
    assert_eq!((id, meta.committed.len_bytes), (c1, 3000 + 100 * 700));
    assert!(e.journal_stats().checkpoints > 0, "{:?}", e.journal_stats());
    e.simulate_crash();
    let e = ChunkEngine::open(dir.path(), config(4096, true)).expect("reopen");
    let (_, meta) = e.last_chunk(InodeId(63)).expect("last_chunk").expect("a chunk");
    assert_eq!(meta.committed.len_bytes, 3000 + 100 * 700);
    assert_eq!(meta.committed_ver, 101);
    e.check_invariants().expect("invariants");
}

#[test]
fn bad_journal_sizes_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for region in [0, 100, 1000, 4097, 2 << 30] {
        let r = ChunkEngine::open(dir.path(), config(region, false));
        assert!(r.is_err(), "region {region} accepted");
    }
}

#[test]
fn a_resized_journal_keeps_its_records_until_they_are_in_rocksdb() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = ChunkEngine::open(dir.path(), config(4096, false)).expect("open");
    let c = cid(65, 0);
    tail_append(&e, c, b"one", 1);
    tail_append(&e, c, b"+two", 2);
    e.simulate_crash();
    // Reopen with a larger journal: the old records replay, the file grows.
    let e = ChunkEngine::open(dir.path(), config(8192, false)).expect("reopen larger");
    assert_eq!(e.journal_stats().replayed, 1);
    assert_eq!(read_all(&e, c, ReadMode::Strict), b"one+two");
    assert_eq!(std::fs::metadata(dir.path().join("journal")).expect("journal").len(), 2 * 8192);
    assert!(!dir.path().join("journal.old").exists());
    tail_append(&e, c, b"+three", 3);
    e.simulate_crash();
    let e = ChunkEngine::open(dir.path(), config(4096, false)).expect("reopen smaller");
    assert_eq!(read_all(&e, c, ReadMode::Strict), b"one+two+three");
    assert_eq!(e.meta(c).expect("meta").committed_ver, 3);
}
