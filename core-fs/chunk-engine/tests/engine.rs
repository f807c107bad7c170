//! Behaviour tests of the chunk engine: versions, COW vs append, pools,
//! checksums, queries.

use fskv_chunk_engine::{ChunkEngine, ChunkError, EngineConfig, ReadMode, UpdateKind, UpdateRequest, UpdateTag, MAX_CHUNK_BYTES};
use fskv_types::{ChunkId, ErrorCode, InodeId};
use std::io::{Read, Seek, SeekFrom, Write};

fn config() -> EngineConfig {
    EngineConfig { blocks_per_grow: 256, sync_writes: false, ..EngineConfig::default() }
}

fn open(dir: &tempfile::TempDir) -> ChunkEngine {
    ChunkEngine::open(dir.path(), config()).expect("open engine")
}

fn cid(inode: u64, index: u64) -> ChunkId {
    ChunkId::new(InodeId(inode), index)
}

fn tag(n: u64) -> UpdateTag {
    UpdateTag { client: 1, request: n }
}

fn write(e: &ChunkEngine, chunk: ChunkId, off: u64, data: &[u8], t: u64) -> fskv_chunk_engine::UpdateOutcome {
    let req = UpdateRequest {
        chunk,
        chain_ver: 1,
        kind: UpdateKind::Write { offset_bytes: off, data },
        tag: tag(t),
        expected_ver: None,
        chunk_size_hint_bytes: None,
    };
    e.update(&req).expect("update")
}

fn write_commit(e: &ChunkEngine, chunk: ChunkId, off: u64, data: &[u8], t: u64) -> fskv_chunk_engine::UpdateOutcome {
    let out = write(e, chunk, off, data, t);
    assert_eq!(e.commit(chunk, out.pending_ver).expect("commit"), out.pending_ver);
    out
}

fn read_all(e: &ChunkEngine, chunk: ChunkId) -> Vec<u8> {
    e.read(chunk, 0, MAX_CHUNK_BYTES, ReadMode::Strict).expect("read").data
}

fn committed_block(e: &ChunkEngine, chunk: ChunkId) -> fskv_chunk_engine::BlockRef {
    e.meta(chunk).and_then(|m| m.committed.block).expect("chunk has a block")
}

#[test]
fn write_commit_read_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(5, 0);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let out = write_commit(&e, c, 0, &data, 1);
    assert_eq!(out.pending_ver, 1);
    assert_eq!(read_all(&e, c), data);
    assert_eq!(e.read(c, 4090, 20, ReadMode::Strict).unwrap().data, &data[4090..4110]);
    assert_eq!(e.read(c, 9990, 100, ReadMode::Strict).unwrap().data, &data[9990..]);
    assert!(e.read(c, 20_000, 10, ReadMode::Strict).unwrap().data.is_empty());
    let m = e.meta(c).unwrap();
    assert_eq!(m.committed.crc, crc32c::crc32c(&data));
    e.check_invariants().unwrap();
    drop(e);
    let e = open(&dir);
    assert_eq!(read_all(&e, c), data);
    e.check_invariants().unwrap();
}

#[test]
fn pending_version_is_reported_and_readable_relaxed() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(5, 1);
    write_commit(&e, c, 0, b"hello", 1);
    let out = write(&e, c, 0, b"HELLO world", 2);
    assert_eq!((out.committed_ver, out.pending_ver), (1, 2));
    let err = e.read(c, 0, 100, ReadMode::Strict).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ChunkUncommitted);
    let relaxed = e.read(c, 0, 100, ReadMode::Relaxed).unwrap();
    assert!(relaxed.uncommitted);
    assert_eq!((relaxed.version, relaxed.data.as_slice()), (2, &b"HELLO world"[..]));
    let old = e.read(c, 0, 100, ReadMode::CommittedOnly).unwrap();
    assert_eq!((old.version, old.data.as_slice()), (1, &b"hello"[..]));
    assert_eq!(e.commit(c, 2).unwrap(), 2);
    assert_eq!(e.commit(c, 2).unwrap(), 2, "commit is idempotent");
    assert!(matches!(e.commit(c, 5), Err(ChunkError::VersionMismatch { .. })));
    assert_eq!(read_all(&e, c), b"HELLO world");
    e.check_invariants().unwrap();
}

#[test]
fn appends_stay_in_place_and_overwrites_copy() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(6, 0);
    let mut model = vec![7u8; 1000];
    write_commit(&e, c, 0, &model, 1);
    let first = committed_block(&e, c);
    for i in 0..20u64 {
        let piece = vec![i as u8; 3000];
        let out = write_commit(&e, c, model.len() as u64, &piece, 10 + i);
        model.extend_from_slice(&piece);
        assert!(out.in_place, "append {i} should be in place");
        assert_eq!(committed_block(&e, c), first, "append moved the block");
        assert_eq!(e.meta(c).unwrap().committed.crc, crc32c::crc32c(&model));
    }
    assert_eq!(read_all(&e, c), model);
    // Overwrite: copy on write into another block.
    let out = write_commit(&e, c, 10, b"overwrite", 100);
    model[10..19].copy_from_slice(b"overwrite");
    assert!(!out.in_place);
    let moved = committed_block(&e, c);
    assert_ne!(moved, first, "overwrite must copy on write");
    assert_eq!(read_all(&e, c), model);
    // Growing past the block moves to a larger class.
    let big = vec![9u8; 70_000];
    let len = model.len() as u64;
    let out = write_commit(&e, c, len, &big, 101);
    model.extend_from_slice(&big);
    assert!(!out.in_place);
    assert_eq!(committed_block(&e, c).class, 1);
    assert_eq!(read_all(&e, c), model);
    e.check_invariants().unwrap();
}

#[test]
fn truncate_and_remove() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(7, 0);
    write_commit(&e, c, 0, &[1u8; 5000], 1);
    let req = |kind, t| UpdateRequest { chunk: c, chain_ver: 1, kind, tag: tag(t), expected_ver: None, chunk_size_hint_bytes: None };
    let out = e.update(&req(UpdateKind::Truncate { len_bytes: 100 }, 2)).unwrap();
    e.commit(c, out.pending_ver).unwrap();
    assert_eq!(read_all(&e, c), vec![1u8; 100]);
    let out = e.update(&req(UpdateKind::Truncate { len_bytes: 300 }, 3)).unwrap();
    assert!(out.in_place);
    e.commit(c, out.pending_ver).unwrap();
    let mut want = vec![1u8; 100];
    want.resize(300, 0);
    assert_eq!(read_all(&e, c), want);
    let out = e.update(&req(UpdateKind::Remove, 4)).unwrap();
    let still = e.read(c, 0, 1000, ReadMode::CommittedOnly).unwrap();
    assert_eq!(still.data, want, "remove is invisible until commit");
    assert!(matches!(e.read(c, 0, 1, ReadMode::Relaxed), Err(ChunkError::NotFound(_))));
    e.commit(c, out.pending_ver).unwrap_or_else(|_| panic!("commit remove"));
    assert!(matches!(e.read(c, 0, 1, ReadMode::Strict), Err(ChunkError::NotFound(_))));
    assert!(e.meta(c).is_none());
    e.check_invariants().unwrap();
    assert!(e.pool_stats().iter().all(|p| p.used_blocks == 0));
}

#[test]
fn pool_grows_in_256_block_fallocate_steps_and_reuses_freed_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let small = vec![3u8; 100];
    for i in 0..256u64 {
        write_commit(&e, cid(8, i), 0, &small, 1);
    }
    assert_eq!(e.fallocate_calls(), 1);
    let class0 = &e.pool_stats()[0];
    assert_eq!((class0.capacity_blocks, class0.used_blocks, class0.grow_steps), (256, 256, 1));
    // One more chunk: exactly one more fallocate, 256 more blocks.
    write_commit(&e, cid(8, 256), 0, &small, 1);
    assert_eq!(e.fallocate_calls(), 2);
    assert_eq!(e.pool_stats()[0].capacity_blocks, 512);
    let (path0, _) = e.block_file(committed_block(&e, cid(8, 0))).unwrap();
    let (path1, off1) = e.block_file(committed_block(&e, cid(8, 256))).unwrap();
    assert_ne!(path0, path1, "second growth step goes to the next file");
    assert_eq!(off1, 0);
    assert_eq!(std::fs::metadata(&path0).unwrap().len(), 256 * 64 * 1024);
    // Free a low block and allocate again: the freed block is reused first.
    let freed = committed_block(&e, cid(8, 10));
    let out = e
        .update(&UpdateRequest {
            chunk: cid(8, 10),
            chain_ver: 1,
            kind: UpdateKind::Remove,
            tag: tag(2),
            expected_ver: None,
            chunk_size_hint_bytes: None,
        })
        .unwrap();
    e.commit(cid(8, 10), out.pending_ver).unwrap();
    write_commit(&e, cid(9, 0), 0, &small, 1);
    assert_eq!(committed_block(&e, cid(9, 0)), freed);
    assert_eq!(e.fallocate_calls(), 2);
    e.check_invariants().unwrap();
    drop(e);
    let e = open(&dir);
    assert_eq!(e.pool_stats()[0].capacity_blocks, 512);
    assert_eq!(e.pool_stats()[0].used_blocks, 257);
    e.check_invariants().unwrap();
}

#[test]
fn corrupted_block_gives_checksum_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(10, 0);
    let data = vec![0x5au8; 20_000];
    write_commit(&e, c, 0, &data, 1);
    let (path, off) = e.block_file(committed_block(&e, c)).unwrap();
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(off + 9000)).unwrap();
    let mut b = [0u8; 1];
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(off + 9000)).unwrap();
    f.write_all(&[b[0] ^ 0x01]).unwrap();
    drop(f);
    let err = e.read(c, 0, 20_000, ReadMode::Strict).unwrap_err();
    assert!(matches!(err, ChunkError::ChecksumMismatch { .. }), "{err}");
    assert_eq!(err.code(), ErrorCode::ChecksumMismatch);
    // Pages not touching the flipped byte still read fine.
    assert_eq!(e.read(c, 0, 4096, ReadMode::Strict).unwrap().data, &data[..4096]);
    // A copy-on-write update over a corrupt page refuses rather than spreading it.
    let req = UpdateRequest {
        chunk: c,
        chain_ver: 1,
        kind: UpdateKind::Write { offset_bytes: 0, data: b"x" },
        tag: tag(2),
        expected_ver: None,
        chunk_size_hint_bytes: None,
    };
    assert!(matches!(e.update(&req), Err(ChunkError::ChecksumMismatch { .. })));
    e.check_invariants().unwrap();
}

#[test]
fn reader_handle_keeps_old_block_until_released() {
    // Whitebox through the public API: an in-flight read of the old version
    // is simulated by reading while updates happen on other threads.
    let dir = tempfile::tempdir().unwrap();
    let e = std::sync::Arc::new(open(&dir));
    let c = cid(11, 0);
    write_commit(&e, c, 0, &vec![1u8; 60_000], 1);
    let writer = {
        let e = e.clone();
        std::thread::spawn(move || {
            for i in 0..200u64 {
                let fill = vec![(i % 200) as u8 + 2; 60_000];
                write_commit(&e, c, 0, &fill, 10 + i);
            }
        })
    };
    for _ in 0..400 {
        let r = e.read(c, 0, 60_000, ReadMode::Relaxed).unwrap();
        assert!(r.data.iter().all(|&b| b == r.data[0]), "torn read");
    }
    writer.join().unwrap();
    e.check_invariants().unwrap();
}

#[test]
fn retried_update_is_applied_once_and_chain_version_checked() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(12, 0);
    write_commit(&e, c, 0, b"abc", 1);
    let req = UpdateRequest {
        chunk: c,
        chain_ver: 3,
        kind: UpdateKind::Write { offset_bytes: 3, data: b"def" },
        tag: tag(2),
        expected_ver: Some(2),
        chunk_size_hint_bytes: None,
    };
    let first = e.update(&req).unwrap();
    let again = e.update(&req).unwrap();
    assert!(again.duplicate);
    assert_eq!((again.pending_ver, again.crc), (first.pending_ver, first.crc));
    e.commit(c, 2).unwrap();
    assert!(e.update(&req).unwrap().duplicate);
    assert_eq!(read_all(&e, c), b"abcdef");
    let stale = UpdateRequest { chain_ver: 2, tag: tag(3), expected_ver: None, ..req };
    assert_eq!(e.update(&stale).unwrap_err().code(), ErrorCode::StaleChainVersion);
    let wrong_ver = UpdateRequest { tag: tag(4), expected_ver: Some(7), ..req };
    assert!(matches!(e.update(&wrong_ver), Err(ChunkError::VersionMismatch { .. })));
}

#[test]
fn limits_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(13, 0);
    let req = UpdateRequest {
        chunk: c,
        chain_ver: 1,
        kind: UpdateKind::Write { offset_bytes: MAX_CHUNK_BYTES, data: b"x" },
        tag: tag(1),
        expected_ver: None,
        chunk_size_hint_bytes: None,
    };
    assert_eq!(e.update(&req).unwrap_err().code(), ErrorCode::InvalidArgument);
    let req = UpdateRequest { kind: UpdateKind::Truncate { len_bytes: MAX_CHUNK_BYTES + 1 }, ..req };
    assert_eq!(e.update(&req).unwrap_err().code(), ErrorCode::InvalidArgument);
    let req = UpdateRequest { kind: UpdateKind::Remove, ..req };
    assert_eq!(e.update(&req).unwrap_err().code(), ErrorCode::NotFound);
    assert!(e.pool_stats().iter().all(|p| p.used_blocks == 0));
}

#[test]
fn last_chunk_dump_and_replace() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    for idx in [0u64, 3, 17] {
        write_commit(&e, cid(20, idx), 0, b"x", 1);
    }
    write_commit(&e, cid(21, 0), 0, b"y", 1);
    write_commit(&e, cid(19, 99), 0, b"z", 1);
    let (last, meta) = e.last_chunk(InodeId(20)).unwrap().unwrap();
    assert_eq!((last, meta.committed_ver), (cid(20, 17), 1));
    assert!(e.last_chunk(InodeId(22)).unwrap().is_none());
    assert!(e.last_chunk(InodeId(18)).unwrap().is_none());
    let dump = e.dump().unwrap();
    let ids: Vec<ChunkId> = dump.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![cid(19, 99), cid(20, 0), cid(20, 3), cid(20, 17), cid(21, 0)]);
    // Full-chunk replace sets committed directly and drops a pending version.
    write(&e, cid(20, 3), 1, b"pending", 2);
    e.replace(cid(20, 3), 4, 9, b"recovered", tag(3), Vec::new()).unwrap();
    let m = e.meta(cid(20, 3)).unwrap();
    assert_eq!((m.committed_ver, m.pending_ver(), m.chain_ver), (9, None, 4));
    assert_eq!(read_all(&e, cid(20, 3)), b"recovered");
    // The sender's older versions' tags come along (late retries of them
    // stay recognised); more than RECENT_COMMITS, or one not older, is refused.
    let older = |v: u64| fskv_chunk_engine::RecentCommit { tag: tag(v), version: v, len_bytes: 1, crc: 0 };
    e.replace(cid(20, 3), 4, 10, b"recovered2", tag(10), vec![older(8), older(9)]).unwrap();
    assert_eq!(e.meta(cid(20, 3)).unwrap().recent, vec![older(8), older(9)]);
    let too_many: Vec<_> = (1..=fskv_chunk_engine::RECENT_COMMITS as u64 + 1).map(older).collect();
    assert!(e.replace(cid(20, 3), 4, 11, b"x", tag(11), too_many).is_err());
    assert!(e.replace(cid(20, 3), 4, 11, b"x", tag(11), vec![older(11)]).is_err());
    assert_eq!(e.meta(cid(20, 3)).unwrap().committed_ver, 10);
    e.check_invariants().unwrap();
}

#[test]
fn concurrent_updates_on_many_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let e = std::sync::Arc::new(open(&dir));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let c = cid(30 + t, i % 7);
                    let len = e.meta(c).map_or(0, |m| m.committed.len_bytes as u64);
                    write_commit(&e, c, len, &[t as u8; 1000], i + 1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    e.check_invariants().unwrap();
    for t in 0..4u64 {
        for i in 0..7u64 {
            let data = read_all(&e, cid(30 + t, i));
            assert!(data.iter().all(|&b| b == t as u8));
        }
    }
}

#[test]
fn sync_writes_mode_round_trips_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig { blocks_per_grow: 256, sync_writes: true, ..EngineConfig::default() };
    let e = ChunkEngine::open(dir.path(), cfg.clone()).unwrap();
    let c = cid(40, 0);
    write_commit(&e, c, 0, b"durable", 1);
    write_commit(&e, c, 7, b" append", 2);
    e.close().unwrap();
    let e = ChunkEngine::open(dir.path(), cfg).unwrap();
    assert_eq!(read_all(&e, c), b"durable append");
    e.check_invariants().unwrap();
    drop(e);
    // Reopening with another growth step is refused rather than misreading blocks.
    let other = EngineConfig { blocks_per_grow: 16, sync_writes: true, ..EngineConfig::default() };
    assert!(matches!(ChunkEngine::open(dir.path(), other), Err(ChunkError::InvalidArgument(_))));
}

#[test]
fn reserve_grows_in_whole_steps() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    assert_eq!(e.reserve(1, 300).unwrap(), 2);
    assert_eq!(e.pool_stats()[0].capacity_blocks, 512);
    assert_eq!(e.reserve(1, 512).unwrap(), 0);
    write_commit(&e, cid(50, 0), 0, b"x", 1);
    assert_eq!(e.fallocate_calls(), 2);
    e.check_invariants().unwrap();
}

#[test]
fn chunk_size_hint_sizes_the_first_block_so_appends_stay_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(60, 0);
    let piece = vec![4u8; 64 * 1024];
    for i in 0..8u64 {
        let req = UpdateRequest {
            chunk: c,
            chain_ver: 1,
            kind: UpdateKind::Write { offset_bytes: i * piece.len() as u64, data: &piece },
            tag: tag(i + 1),
            expected_ver: None,
            chunk_size_hint_bytes: Some(1024 * 1024),
        };
        let out = e.update(&req).unwrap();
        assert_eq!(out.in_place, i > 0);
        e.commit(c, out.pending_ver).unwrap();
        assert_eq!(committed_block(&e, c).class, 4, "1 MiB class from the first write");
    }
    assert_eq!(read_all(&e, c).len(), 8 * 64 * 1024);
    e.check_invariants().unwrap();
}

#[test]
fn large_classes_grow_by_at_most_the_byte_cap() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    // A 64 MiB-class chunk grows its pool by one block, not by 256 (16 GiB).
    let c = cid(61, 0);
    let req = UpdateRequest {
        chunk: c,
        chain_ver: 1,
        kind: UpdateKind::Write { offset_bytes: 0, data: b"head of a big chunk" },
        tag: tag(1),
        expected_ver: None,
        chunk_size_hint_bytes: Some(64 * 1024 * 1024),
    };
    let out = e.update(&req).unwrap();
    e.commit(c, out.pending_ver).unwrap();
    let block = committed_block(&e, c);
    assert_eq!(block.class, 10);
    let stats = &e.pool_stats()[10];
    assert_eq!((stats.capacity_blocks, stats.grow_steps), (1, 1));
    let (path, off) = e.block_file(block).unwrap();
    assert_eq!(off, 0);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 * 1024 * 1024);
    // A 4 MiB-class pool grows in 16 MiB steps.
    write_commit(&e, cid(62, 0), 0, &vec![1u8; 3 * 1024 * 1024], 1);
    assert_eq!(e.pool_stats()[6].capacity_blocks, fskv_chunk_engine::layout::MAX_GROW_STEP_BYTES / (4 << 20));
    drop(e);
    let e = open(&dir);
    assert_eq!(e.pool_stats()[10].capacity_blocks, 1);
    assert_eq!(read_all(&e, c), b"head of a big chunk");
    e.check_invariants().unwrap();
}

#[test]
fn open_rejects_double_referenced_blocks_and_garbage_records() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    write_commit(&e, cid(70, 0), 0, b"a", 1);
    write_commit(&e, cid(70, 1), 0, b"b", 1);
    e.close().unwrap();
    let key = |c: ChunkId| {
        let mut k = vec![b'c'];
        k.extend_from_slice(&c.to_bytes());
        k
    };
    {
        let db = rocksdb::DB::open_default(dir.path().join("meta")).unwrap();
        let a = db.get(key(cid(70, 0))).unwrap().unwrap();
        db.put(key(cid(70, 2)), &a).unwrap();
    }
    let err = ChunkEngine::open(dir.path(), config()).err().expect("double reference must fail");
    assert!(matches!(err, ChunkError::CorruptMetadata(_)), "{err}");
    {
        let db = rocksdb::DB::open_default(dir.path().join("meta")).unwrap();
        db.put(key(cid(70, 2)), [2u8, 1, 2, 3]).unwrap();
    }
    let err = ChunkEngine::open(dir.path(), config()).err().expect("garbage must fail");
    assert!(matches!(err, ChunkError::CorruptMetadata(_)), "{err}");
    {
        let db = rocksdb::DB::open_default(dir.path().join("meta")).unwrap();
        db.delete(key(cid(70, 2))).unwrap();
    }
    let e = open(&dir);
    assert_eq!(read_all(&e, cid(70, 1)), b"b");
    e.check_invariants().unwrap();
}

#[test]
fn late_retry_after_other_commits_is_still_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(13, 0);
    let first = write_commit(&e, c, 0, b"AAAA", 100);
    // Other writers commit over it before the first writer's retry arrives.
    for t in 101..105 {
        write_commit(&e, c, 0, format!("{t:04}").as_bytes(), t);
    }
    let retry = write(&e, c, 0, b"AAAA", 100);
    assert!(retry.duplicate, "a late retry was applied again");
    assert_eq!((retry.pending_ver, retry.crc, retry.len_bytes), (first.pending_ver, first.crc, first.len_bytes));
    assert_eq!(read_all(&e, c), b"0104", "the retry overwrote newer data");
    // The memory of old tags survives a restart and is bounded.
    drop(e);
    let e = open(&dir);
    assert!(write(&e, c, 0, b"AAAA", 100).duplicate);
    let meta = e.meta(c).unwrap();
    assert!(meta.recent.len() <= fskv_chunk_engine::RECENT_COMMITS);
    for t in 105..(105 + fskv_chunk_engine::RECENT_COMMITS as u64 + 1) {
        write_commit(&e, c, 0, b"BBBB", t);
    }
    assert_eq!(e.meta(c).unwrap().recent.len(), fskv_chunk_engine::RECENT_COMMITS);
    let forgotten = write(&e, c, 0, b"AAAA", 100);
    assert!(!forgotten.duplicate, "tags older than RECENT_COMMITS versions are forgotten (documented limit)");
}

/// A write of `data` at `off` into chunk `c` (chain version 1, tag `t`,
/// 1 MiB layout chunks).
fn write_req(c: ChunkId, off: u64, data: &[u8], t: u64) -> UpdateRequest<'_> {
    UpdateRequest {
        chunk: c,
        chain_ver: 1,
        kind: UpdateKind::Write { offset_bytes: off, data },
        tag: tag(t),
        expected_ver: None,
        chunk_size_hint_bytes: Some(1 << 20),
    }
}

#[test]
fn update_and_commit_is_one_committed_step() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(9, 0);
    let fused = |off: u64, data: &[u8], t: u64| e.update_and_commit(&write_req(c, off, data, t)).expect("update_and_commit");
    // First write: a new block, committed at once.
    let out = fused(0, &[1u8; 10_000], 1);
    assert_eq!((out.pending_ver, out.committed_ver, out.duplicate), (1, 1, false));
    assert!(e.meta(c).unwrap().pending.is_none());
    let block = committed_block(&e, c);
    // An append stays in place and is readable strictly right away.
    let out = fused(10_000, &[2u8; 70_000], 2);
    assert_eq!((out.pending_ver, out.committed_ver, out.in_place), (2, 2, true));
    assert_eq!(committed_block(&e, c), block);
    let mut want = vec![1u8; 10_000];
    want.extend_from_slice(&[2u8; 70_000]);
    assert_eq!(read_all(&e, c), want);
    assert_eq!(out.crc, crc32c::crc32c(&want));
    // A retry of a committed request changes nothing.
    let dup = fused(10_000, &[2u8; 70_000], 2);
    assert_eq!((dup.pending_ver, dup.committed_ver, dup.duplicate), (2, 2, true));
    assert_eq!(read_all(&e, c), want);
    // A retry of a pending request (applied by `update`) commits it.
    let pending = write(&e, c, 0, b"abc", 3);
    assert_eq!(pending.pending_ver, 3);
    let dup = fused(0, b"abc", 3);
    assert_eq!((dup.pending_ver, dup.committed_ver, dup.duplicate), (3, 3, true));
    assert!(e.meta(c).unwrap().pending.is_none());
    assert_eq!(&read_all(&e, c)[..3], b"abc");
    // The committed history keeps the tags of earlier versions (late retries).
    let recent: Vec<u64> = e.meta(c).unwrap().recent.iter().map(|r| r.version).collect();
    assert_eq!(recent, vec![1, 2]);
    // An update discards another pending version (4) and commits its own
    // version 4 in the same step.
    write(&e, c, 0, b"zz", 4);
    let out = fused(0, b"yy", 5);
    assert_eq!((out.pending_ver, out.committed_ver), (4, 4));
    assert_eq!(&read_all(&e, c)[..3], b"yyc");
    // A full overwrite goes to a new block; the old one is freed.
    let out = fused(0, &[7u8; 100_000], 6);
    assert_eq!((out.committed_ver, out.in_place), (5, false));
    assert_eq!(read_all(&e, c), vec![7u8; 100_000]);
    // Fused remove deletes the chunk; a fused remove of nothing is NotFound.
    let rm =
        UpdateRequest { chunk: c, chain_ver: 1, kind: UpdateKind::Remove, tag: tag(7), expected_ver: None, chunk_size_hint_bytes: None };
    assert_eq!(e.update_and_commit(&rm).unwrap().committed_ver, 6);
    assert!(e.meta(c).is_none());
    assert!(matches!(e.update_and_commit(&UpdateRequest { tag: tag(8), ..rm }), Err(ChunkError::NotFound(_))));
    e.check_invariants().unwrap();
    // Everything survives a crash and reopen.
    let d = cid(9, 1);
    let req = UpdateRequest {
        chunk: d,
        chain_ver: 1,
        kind: UpdateKind::Write { offset_bytes: 0, data: b"kept" },
        tag: tag(9),
        expected_ver: Some(1),
        chunk_size_hint_bytes: None,
    };
    e.update_and_commit(&req).unwrap();
    e.simulate_crash();
    let e = open(&dir);
    e.check_invariants().unwrap();
    assert_eq!(read_all(&e, d), b"kept");
    assert!(e.meta(c).is_none());
}

#[test]
fn update_with_checks_the_callers_payload_crc_without_writing_bad_data() {
    use fskv_chunk_engine::UpdateOptions;
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(10, 0);
    let apply = |off: u64, data: &[u8], crc: u32, t: u64| {
        e.update_with(&write_req(c, off, data, t), UpdateOptions { commit: true, data_crc: Some(crc) })
    };
    let first: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
    let appended: Vec<u8> = (0..70_001u32).map(|i| (i % 241) as u8).collect();
    let middle = vec![9u8; 5000];
    // Each path: new block (whole write), in-place append (unaligned start),
    // copy-on-write into the middle. A wrong CRC fails and changes nothing.
    for (off, data) in [(0u64, &first[..]), (10_000, &appended[..]), (3000, &middle[..])] {
        let before = e.meta(c);
        let pools = e.pool_stats();
        let bad = apply(off, data, crc32c::crc32c(data) ^ 1, 100 + off);
        assert!(matches!(bad, Err(ChunkError::ChecksumMismatch { .. })), "{bad:?}");
        assert_eq!(e.meta(c), before);
        assert_eq!(e.pool_stats(), pools);
        e.check_invariants().unwrap();
        let good = apply(off, data, crc32c::crc32c(data), 200 + off).expect("good crc");
        assert_eq!(good.committed_ver, good.pending_ver);
    }
    let mut want = first.clone();
    want.extend_from_slice(&appended);
    want[3000..8000].copy_from_slice(&middle);
    assert_eq!(read_all(&e, c), want);
    // The bad attempt of the append wrote nothing past the committed end:
    // a reopen finds the same content.
    e.simulate_crash();
    let e = open(&dir);
    e.check_invariants().unwrap();
    assert_eq!(read_all(&e, c), want);
}

/// A forwarded update whose tag this chunk already committed, but at
/// another version than the one the predecessor now creates, is applied
/// (the predecessor lost the tag with a full-chunk sync and applied the
/// request again): deduplicating it would leave this replica a version
/// behind its predecessor (simulation seed 422). A retry at the same
/// version is still a duplicate.
#[test]
fn a_known_tag_at_another_expected_version_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir);
    let c = cid(10, 0);
    let forward = |data: &[u8], t: u64, expected: u64| {
        let req = UpdateRequest { expected_ver: Some(expected), ..write_req(c, 0, data, t) };
        e.update_and_commit(&req).expect("update_and_commit")
    };
    assert_eq!(forward(b"one", 1, 1).committed_ver, 1);
    assert_eq!(forward(b"two", 2, 2).committed_ver, 2);
    // The same forward retried: a duplicate, nothing applied.
    let retry = forward(b"two", 2, 2);
    assert_eq!((retry.committed_ver, retry.duplicate), (2, true));
    // Request 2 again, now as version 3: applied.
    let again = forward(b"two", 2, 3);
    assert_eq!((again.pending_ver, again.committed_ver, again.duplicate), (3, 3, false));
    assert_eq!(e.meta(c).unwrap().committed_ver, 3);
    // Without an expected version (the head's own client retry) the tag
    // still deduplicates.
    let head_retry = e.update_and_commit(&write_req(c, 0, b"two", 2)).expect("update_and_commit");
    assert_eq!((head_retry.committed_ver, head_retry.duplicate), (3, true));
}
