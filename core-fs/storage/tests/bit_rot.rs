//! Bit rot on one replica (a byte flipped in a block file, injected through
//! the chunk engine's `fault-injection` seam): reads never return a wrong
//! byte, the damaged chunk is rewritten from another replica, by a read or
//! by the scrubber.

use bytes::Bytes;
use fskv_chunk_engine::{ChunkError, EngineConfig, ReadMode};
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_storage::cluster::{ClusterOptions, LocalCluster};
use fskv_types::{ChainId, ChunkId, InodeId, TargetId};
use std::time::Duration;

const CHAIN: ChainId = ChainId(1);
const CHUNK_BYTES: usize = 300 << 10;

fn pattern(i: u64) -> Vec<u8> {
    (0..CHUNK_BYTES).map(|k| ((k as u64).wrapping_mul(2654435761) ^ i.wrapping_mul(40503)) as u8).collect()
}

async fn cluster(dir: &std::path::Path, scrub_bytes_per_sec: u64) -> LocalCluster {
    let chain = vec![(TargetId(1), 0), (TargetId(2), 1), (TargetId(3), 2)];
    let options = ClusterOptions {
        scrub_bytes_per_sec,
        scrub_pause_between_passes_ms: 100,
        ..ClusterOptions::new(EngineConfig { blocks_per_grow: 8, sync_writes: false, ..EngineConfig::default() })
    };
    LocalCluster::start(dir, 3, &[chain], options).await.expect("cluster")
}

fn client(c: &LocalCluster) -> StorageClient {
    c.client(StorageClientConfig { max_attempts: 10, retry_backoff_ms: 2, ..Default::default() })
}

async fn write_chunks(c: &StorageClient, n: u64) {
    for i in 0..n {
        c.write(CHAIN, ChunkId::new(InodeId(7), i), 0, Bytes::from(pattern(i))).await.expect("write");
    }
}

/// The committed content of `chunk` on `target` reads back clean and equal
/// to what was written (version and CRC unchanged by the repair).
fn assert_clean(c: &LocalCluster, target: TargetId, chunk: ChunkId, want: &[u8], version: u64, crc: u32) {
    let engine = c.engine(target).expect("engine");
    let read = engine.read(chunk, 0, 1 << 30, ReadMode::CommittedOnly).expect("clean read after repair");
    assert!(read.data == want, "{target} {chunk}: repaired content differs");
    let meta = engine.meta(chunk).expect("meta");
    assert_eq!((meta.committed_ver, meta.committed.crc), (version, crc), "{target} {chunk}: version or CRC changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_that_meets_bit_rot_gets_good_data_and_repairs_the_replica() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cluster(dir.path(), 0).await;
    let sc = client(&c);
    write_chunks(&sc, 3).await;
    let chunk = ChunkId::new(InodeId(7), 1);
    let bad = TargetId(2);
    let engine = c.engine(bad).expect("engine");
    let before = engine.meta(chunk).expect("meta");
    engine.corrupt_committed_byte(chunk, 123_457).expect("inject bit rot");
    assert!(
        matches!(engine.read(chunk, 0, 1 << 30, ReadMode::CommittedOnly), Err(ChunkError::ChecksumMismatch { .. })),
        "the injected damage must be visible to the engine"
    );
    // Reads spread over the three replicas: every one returns the written bytes.
    let want = pattern(1);
    for _ in 0..9 {
        let got = sc.read(CHAIN, chunk, 0, CHUNK_BYTES as u32, false).await.expect("read");
        assert!(got.data[..] == want[..], "a read returned wrong bytes");
    }
    assert_clean(&c, bad, chunk, &want, before.committed_ver, before.committed.crc);
    let progress = c.service(1).and_then(|s| s.scrub_progress(bad)).expect("progress");
    assert_eq!(progress.repaired, 1, "{progress:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_scrubber_finds_and_repairs_bit_rot_nobody_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cluster(dir.path(), 64 << 20).await;
    let sc = client(&c);
    write_chunks(&sc, 4).await;
    let chunk = ChunkId::new(InodeId(7), 3);
    let bad = TargetId(3);
    let engine = c.engine(bad).expect("engine");
    let before = engine.meta(chunk).expect("meta");
    engine.corrupt_committed_byte(chunk, 7).expect("inject bit rot");
    let service = c.service(2).expect("service");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let p = service.scrub_progress(bad).expect("progress");
        if p.repaired >= 1 {
            assert!(p.corrupt_found >= 1 && p.chunks_checked >= 1 && p.bytes_checked > 0, "{p:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the scrubber did not repair the chunk within 30 s: {p:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_clean(&c, bad, chunk, &pattern(3), before.committed_ver, before.committed.crc);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bit_rot_on_every_replica_is_an_error_never_wrong_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cluster(dir.path(), 0).await;
    let sc = client(&c);
    write_chunks(&sc, 1).await;
    let chunk = ChunkId::new(InodeId(7), 0);
    for t in [1, 2, 3] {
        c.engine(TargetId(t)).expect("engine").corrupt_committed_byte(chunk, 1000).expect("inject bit rot");
    }
    for _ in 0..3 {
        let r = sc.read(CHAIN, chunk, 0, CHUNK_BYTES as u32, false).await;
        assert_eq!(r.map(|_| ()).map_err(|e| e.code()), Err(fskv_types::ErrorCode::ChecksumMismatch));
    }
    c.shutdown().await;
}
