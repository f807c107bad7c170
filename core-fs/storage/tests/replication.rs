//! Chain replication on a loopback cluster of three storage services.

use bytes::Bytes;
use fskv_chunk_engine::EngineConfig;
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_proto::routing::{LocalTargetState, PublicTargetState};
use fskv_proto::storage::WriteChunk;
use fskv_proto::storage::{RequestTag, UpdateOp, WriteReq};
use fskv_rpc::{CallOptions, ClientConfig, RpcClient, TcpTransport};
use fskv_storage::cluster::{ClusterOptions, LocalCluster};
use fskv_types::{ChainId, ChunkId, ErrorCode, InodeId, TargetId};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CHAIN: ChainId = ChainId(1);
const TEST_TIMEOUT_SECS: u64 = 120;

fn options() -> ClusterOptions {
    // Recovery pauses 5 ms between chunks so that a sync of a few dozen
    // chunks overlaps with the writers for sure.
    ClusterOptions {
        engine: EngineConfig { blocks_per_grow: 8, sync_writes: false, ..EngineConfig::default() },
        sync_pause_between_chunks_ms: 5,
        ..ClusterOptions::new(EngineConfig::default())
    }
}

async fn three_node_cluster(dir: &std::path::Path) -> LocalCluster {
    let chain = vec![(TargetId(1), 0), (TargetId(2), 1), (TargetId(3), 2)];
    LocalCluster::start(dir, 3, &[chain], options()).await.expect("cluster")
}

fn client(cluster: &LocalCluster) -> StorageClient {
    cluster.client(StorageClientConfig { max_attempts: 40, retry_backoff_ms: 2, ..Default::default() })
}

/// (chunk, committed version, length, crc, content) of every chunk; asserts
/// nothing is left pending.
fn replica(cluster: &LocalCluster, target: TargetId) -> Vec<(ChunkId, u64, u32, u32, Vec<u8>)> {
    let engine = cluster.engine(target).expect("engine");
    let mut out = Vec::new();
    for (id, meta) in engine.dump().expect("dump") {
        assert!(meta.pending.is_none(), "{target} {id}: pending version left: {meta:?}");
        let data = engine.read(id, 0, 1 << 30, fskv_chunk_engine::ReadMode::Strict).expect("read").data;
        assert_eq!(crc32c::crc32c(&data), meta.committed.crc);
        out.push((id, meta.committed_ver, meta.committed.len_bytes, meta.committed.crc, data));
    }
    out
}

fn assert_replicas_equal(cluster: &LocalCluster, targets: &[TargetId]) -> usize {
    let first = replica(cluster, targets[0]);
    for t in &targets[1..] {
        let other = replica(cluster, *t);
        assert_eq!(first.len(), other.len(), "chunk count differs between {} and {t}", targets[0]);
        for (a, b) in first.iter().zip(&other) {
            assert_eq!((a.0, a.1, a.2, a.3), (b.0, b.1, b.2, b.3), "{} vs {t}", targets[0]);
            assert!(a.4 == b.4, "content of {} differs", a.0);
        }
    }
    first.len()
}

async fn with_timeout<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(TEST_TIMEOUT_SECS), f).await.expect("test timed out")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_leave_identical_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let stop = Arc::new(AtomicBool::new(false));
        let uncommitted_seen = Arc::new(AtomicU64::new(0));
        // Readers: strict reads must never return pending data.
        let mut readers = Vec::new();
        for r in 0..3 {
            let (c, stop, seen) = (client(&cluster), stop.clone(), uncommitted_seen.clone());
            readers.push(tokio::spawn(async move {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let chunk = ChunkId::new(InodeId(1), (reads + r) % 4);
                    match c.read(CHAIN, chunk, 0, 64 * 1024, false).await {
                        Ok(d) => {
                            if d.uncommitted {
                                seen.fetch_add(1, Ordering::Relaxed);
                            }
                            reads += 1;
                        }
                        Err(e) => assert!(matches!(e.code(), ErrorCode::NotFound | ErrorCode::ChunkUncommitted), "{e}"),
                    }
                }
                reads
            }));
        }
        let mut writers = Vec::new();
        for w in 0..8u64 {
            let c = client(&cluster);
            writers.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(w);
                for i in 0..40u64 {
                    let chunk = ChunkId::new(InodeId(1), rng.gen_range(0..4));
                    let offset = rng.gen_range(0..16u64) * 4096;
                    let data = Bytes::from(vec![(w * 40 + i) as u8; rng.gen_range(1..=8192)]);
                    let resp = c.write(CHAIN, chunk, offset, data).await.expect("write");
                    assert!(resp.version > 0 && !resp.duplicate);
                }
            }));
        }
        for w in writers {
            w.await.unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let mut total_reads = 0;
        for r in readers {
            total_reads += r.await.unwrap();
        }
        assert!(total_reads > 0);
        assert_eq!(uncommitted_seen.load(Ordering::Relaxed), 0, "a strict read returned pending data");
        let chunks = assert_replicas_equal(&cluster, &[TargetId(1), TargetId(2), TargetId(3)]);
        assert_eq!(chunks, 4);
        // Versions: 320 writes over 4 chunks, each a new committed version.
        let total: u64 = replica(&cluster, TargetId(3)).iter().map(|c| c.1).sum();
        assert_eq!(total, 320);
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_chain_version_is_rejected_and_retried_request_applies_once() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let chunk = ChunkId::new(InodeId(2), 0);
        c.write(CHAIN, chunk, 0, Bytes::from_static(b"hello")).await.unwrap();
        // A write routed with an old chain version gets the distinct error.
        let routing = cluster.routing();
        let head_addr = routing.node_address(fskv_types::NodeId(1)).unwrap().to_string();
        let chain_ver = routing.chain(CHAIN).unwrap().chain_version;
        let data = Bytes::from_static(b"stale");
        let req = WriteReq {
            chain_id: CHAIN,
            chain_ver: chain_ver - 1,
            target: TargetId(1),
            chunk,
            op: UpdateOp::Write { offset_bytes: 0, len_bytes: 5, crc: crc32c::crc32c(&data) },
            tag: RequestTag { client: 77, request: 1 },
            chunk_size_hint_bytes: None,
            cap: None,
            channel: None,
        };
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        let err = rpc.call::<WriteChunk>(&head_addr, &req, data.clone(), CallOptions::default()).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::StaleChainVersion);
        // A bumped chain version: the client's cached routing is refreshed by the handle.
        cluster.set_state(TargetId(3), PublicTargetState::Serving);
        c.write(CHAIN, chunk, 0, Bytes::from_static(b"HELLO")).await.unwrap();
        // Same tag twice: applied once.
        let tag = c.new_tag();
        let first = c.write_tagged(CHAIN, chunk, 5, Bytes::from_static(b" world"), tag).await.unwrap();
        let again = c.write_tagged(CHAIN, chunk, 5, Bytes::from_static(b" world"), tag).await.unwrap();
        assert!(!first.duplicate && again.duplicate);
        assert_eq!(first.version, again.version);
        for t in [TargetId(1), TargetId(2), TargetId(3)] {
            let meta = cluster.engine(t).unwrap().meta(chunk).unwrap();
            assert_eq!(meta.committed_ver, first.version, "{t}");
        }
        let read = c.read(CHAIN, chunk, 0, 100, false).await.unwrap();
        assert_eq!(&read.data[..], b"HELLO world");
        assert_replicas_equal(&cluster, &[TargetId(1), TargetId(2), TargetId(3)]);
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uncommitted_data_is_hidden_unless_relaxed_and_retry_completes_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let c = cluster.client(StorageClientConfig { max_attempts: 2, retry_backoff_ms: 1, call_timeout_ms: 3_000, ..Default::default() });
        let chunk = ChunkId::new(InodeId(3), 0);
        let v1 = c.write(CHAIN, chunk, 0, Bytes::from_static(b"committed")).await.unwrap().version;
        // The tail dies without mgmtd noticing: the write is applied as
        // pending on head and middle, never committed.
        cluster.stop_node(2).await;
        let tag = c.new_tag();
        let failed = c.write_tagged(CHAIN, chunk, 0, Bytes::from_static(b"PENDING!!"), tag).await;
        assert!(failed.is_err(), "write must fail while the tail is down");
        let head = cluster.engine(TargetId(1)).unwrap();
        let meta = head.meta(chunk).unwrap();
        assert_eq!((meta.committed_ver, meta.pending_ver()), (v1, Some(v1 + 1)));
        // Strict read at the head: the distinct uncommitted status.
        let strict = head.read(chunk, 0, 100, fskv_chunk_engine::ReadMode::Strict);
        assert_eq!(strict.unwrap_err().code(), ErrorCode::ChunkUncommitted);
        // Through the client: a strict read never returns the pending bytes;
        // a relaxed one may.
        for _ in 0..10 {
            if let Ok(d) = c.read(CHAIN, chunk, 0, 100, false).await {
                assert_eq!(&d.data[..], b"committed");
                assert!(!d.uncommitted);
            }
        }
        let mut saw_pending = false;
        for _ in 0..10 {
            if let Ok(d) = c.read(CHAIN, chunk, 0, 100, true).await {
                saw_pending |= d.uncommitted && &d.data[..] == b"PENDING!!";
            }
        }
        assert!(saw_pending, "a relaxed read of head or middle returns the pending data");
        // The tail comes back (same data); the client retries the same
        // request: head and middle see a duplicate, the tail applies it, all commit once.
        cluster.start_node(2, false).await.unwrap();
        let c = client(&cluster);
        let done = c.write_tagged(CHAIN, chunk, 0, Bytes::from_static(b"PENDING!!"), tag).await.unwrap();
        assert_eq!(done.version, v1 + 1);
        let read = c.read(CHAIN, chunk, 0, 100, false).await.unwrap();
        assert_eq!(&read.data[..], b"PENDING!!");
        assert_replicas_equal(&cluster, &[TargetId(1), TargetId(2), TargetId(3)]);
    })
    .await;
    cluster.shutdown().await;
}

/// Writes random data to chunks of inode 10 until `stop`; returns the
/// number of acknowledged writes.
fn spawn_writer(c: StorageClient, seed: u64, stop: Arc<AtomicBool>, acked_total: Arc<AtomicU64>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut acked = 0;
        while !stop.load(Ordering::Relaxed) {
            let chunk = ChunkId::new(InodeId(10), rng.gen_range(0..24));
            let r = if rng.gen_ratio(1, 12) {
                c.remove(CHAIN, chunk).await.map(|_| ())
            } else {
                let len = rng.gen_range(1..=32 * 1024);
                let data = Bytes::from((0..len).map(|_| rng.gen::<u8>()).collect::<Vec<u8>>());
                c.write(CHAIN, chunk, rng.gen_range(0..8u64) * 8192, data).await.map(|_| ())
            };
            match r {
                Ok(()) => {
                    acked += 1;
                    acked_total.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.code() == ErrorCode::NotFound => {} // remove of a missing chunk
                Err(e) => panic!("write failed: {e}"),
            }
        }
        acked
    })
}

async fn wait_up_to_date(cluster: &LocalCluster, node: usize, target: TargetId) {
    for _ in 0..600 {
        if cluster.service(node).and_then(|s| s.local_state(target)) == Some(LocalTargetState::UpToDate) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{target} never finished syncing");
}

/// The summary of the sync `target` (on `node`) ran as predecessor. The
/// predecessor records it when the syncing target's reply to `SyncDone`
/// arrives, i.e. just *after* that target turned up-to-date, so a test that
/// saw the target up to date waits (bounded) for the record.
async fn wait_last_sync(cluster: &LocalCluster, node: usize, target: TargetId) -> fskv_storage::sync::PlanSummary {
    for _ in 0..200 {
        if let Some(plan) = cluster.service(node).and_then(|s| s.last_sync(target)) {
            return plan;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{target} never recorded the sync it ran (SyncDone not acknowledged within 5 s)");
}

async fn recovery_round(wipe: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let stop = Arc::new(AtomicBool::new(false));
        let acked_total = Arc::new(AtomicU64::new(0));
        let w1 = spawn_writer(client(&cluster), 1, stop.clone(), acked_total.clone());
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Take the tail out: mgmtd marks it offline (chain version bumps).
        cluster.stop_node(2).await;
        cluster.set_state(TargetId(3), PublicTargetState::Offline);
        tokio::time::sleep(Duration::from_millis(600)).await;
        // Bring it back (empty or with its stale data); it syncs while writes go on.
        cluster.start_node(2, wipe).await.unwrap();
        let versions = |t| {
            let dump = cluster.engine(t).unwrap().dump().unwrap();
            dump.into_iter().map(|(id, m)| (id, m.committed_ver)).collect::<Vec<_>>()
        };
        assert_ne!(versions(TargetId(3)), versions(TargetId(1)), "the returning target must be behind");
        cluster.set_state(TargetId(3), PublicTargetState::Syncing);
        let at_sync_start = acked_total.load(Ordering::Relaxed);
        let w2 = spawn_writer(client(&cluster), 2, stop.clone(), acked_total.clone());
        wait_up_to_date(&cluster, 2, TargetId(3)).await;
        let during_sync = acked_total.load(Ordering::Relaxed) - at_sync_start;
        assert!(during_sync > 0, "no write was acknowledged while the target was syncing");
        let plan = wait_last_sync(&cluster, 1, TargetId(2)).await;
        assert!(plan.send > 0, "the sync sent nothing: {plan:?}");
        cluster.set_state(TargetId(3), PublicTargetState::Serving);
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        let acked = w1.await.unwrap() + w2.await.unwrap();
        assert!(acked > 20, "too few writes: {acked}");
        let chunks = assert_replicas_equal(&cluster, &[TargetId(1), TargetId(2), TargetId(3)]);
        assert!(chunks > 0);
        // Reads from every serving target agree.
        let c = client(&cluster);
        for i in 0..24 {
            let chunk = ChunkId::new(InodeId(10), i);
            let mut seen = Vec::new();
            for _ in 0..3 {
                seen.push(c.read(CHAIN, chunk, 0, 1 << 20, false).await.map(|d| d.data).map_err(|e| e.code()));
            }
            assert!(seen.windows(2).all(|w| w[0] == w[1]), "{chunk}: replicas disagree");
        }
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_read_spreads_over_targets_under_a_single_sender_grant() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let c = cluster.client(StorageClientConfig { max_concurrent_senders: 1, ..Default::default() });
        let mut specs = Vec::new();
        for i in 0..12u64 {
            let chunk = ChunkId::new(InodeId(4), i);
            c.write(CHAIN, chunk, 0, Bytes::from(vec![i as u8; 1000 + i as usize])).await.unwrap();
            specs.push(fskv_client::storage::ReadSpec { chain: CHAIN, chunk, offset_bytes: 0, len_bytes: 4096, relaxed: false });
        }
        specs.push(fskv_client::storage::ReadSpec {
            chain: CHAIN,
            chunk: ChunkId::new(InodeId(4), 99),
            offset_bytes: 0,
            len_bytes: 10,
            relaxed: false,
        });
        let results = c.batch_read(&specs).await;
        for (i, r) in results.iter().take(12).enumerate() {
            let d = r.as_ref().expect("read");
            assert_eq!(d.data.len(), 1000 + i);
            assert!(d.data.iter().all(|b| *b == i as u8));
        }
        assert_eq!(results[12].as_ref().unwrap_err().code(), ErrorCode::NotFound);
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recovery_of_an_empty_target_while_writing() {
    recovery_round(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recovery_of_a_stale_target_while_writing() {
    recovery_round(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn diverged_successor_is_repaired_with_a_full_chunk_replace() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let chunk = ChunkId::new(InodeId(6), 0);
        c.write(CHAIN, chunk, 0, Bytes::from_static(b"base")).await.unwrap();
        // The tail committed a version its predecessors do not have (its
        // ack was lost and the head's pending was replaced by another write).
        let tail = cluster.engine(TargetId(3)).unwrap();
        let out = tail
            .update(&fskv_chunk_engine::UpdateRequest {
                chunk,
                chain_ver: 1,
                kind: fskv_chunk_engine::UpdateKind::Write { offset_bytes: 0, data: b"LOST" },
                tag: fskv_chunk_engine::UpdateTag { client: 9, request: 9 },
                expected_ver: None,
                chunk_size_hint_bytes: None,
            })
            .unwrap();
        tail.commit(chunk, out.pending_ver).unwrap();
        let resp = c.write(CHAIN, chunk, 2, Bytes::from_static(b"NEW")).await.unwrap();
        assert_eq!(resp.version, 2);
        assert_replicas_equal(&cluster, &[TargetId(1), TargetId(2), TargetId(3)]);
        let read = c.read(CHAIN, chunk, 0, 16, false).await.unwrap();
        assert_eq!(&read.data[..], b"baNEW");
    })
    .await;
    cluster.shutdown().await;
}

/// A write whose acknowledgement was lost after the whole chain committed it
/// (the head and the middle kept it pending) is not rolled back by the next
/// write: before building on its committed version, each target asks the
/// tail, finds the left-over committed there and commits it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn left_over_pending_committed_at_the_tail_is_kept_by_the_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let chunk = ChunkId::new(InodeId(7), 0);
        c.write(CHAIN, chunk, 0, Bytes::from_static(b"base----")).await.unwrap();
        let chain_ver = cluster.routing().chains[0].chain_version;
        let lost = fskv_chunk_engine::UpdateRequest {
            chunk,
            chain_ver,
            kind: fskv_chunk_engine::UpdateKind::Write { offset_bytes: 0, data: b"AAAA" },
            tag: fskv_chunk_engine::UpdateTag { client: 77, request: 1 },
            expected_ver: None,
            chunk_size_hint_bytes: None,
        };
        // Applied everywhere, committed at the middle and the tail, but the
        // head never saw the ack.
        for t in [TargetId(1), TargetId(2), TargetId(3)] {
            let engine = cluster.engine(t).unwrap();
            let out = engine.update(&lost).unwrap();
            assert_eq!(out.pending_ver, 2);
            if t != TargetId(1) {
                engine.commit(chunk, 2).unwrap();
            }
        }
        let resp = c.write(CHAIN, chunk, 4, Bytes::from_static(b"BBBB")).await.unwrap();
        assert_eq!(resp.version, 3, "the next write builds on the left-over version, not beside it");
        assert_replicas_equal(&cluster, &[TargetId(1), TargetId(2), TargetId(3)]);
        let read = c.read(CHAIN, chunk, 0, 16, false).await.unwrap();
        assert_eq!(&read.data[..], b"AAAABBBB", "the committed left-over write was rolled back");
    })
    .await;
    cluster.shutdown().await;
}

/// `RemoveChunks` (a truncate, an unlink's GC) removes a chunk whose only
/// version is pending — a write whose forward failed, or whose ack was lost
/// after the tail committed it — and the chunks below it. Before, it
/// stopped at such a chunk and left it and every lower chunk in place, and
/// the settle pass could later commit the write: a truncated file grew its
/// old bytes back (found by the simulation's file checker).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remove_chunks_removes_chunks_left_pending() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let chain_ver = cluster.routing().chains[0].chain_version;
        for (inode, committed_below_head) in [(InodeId(40), false), (InodeId(41), true)] {
            c.write(CHAIN, ChunkId::new(inode, 0), 0, Bytes::from_static(b"chunk zero")).await.unwrap();
            let pending = ChunkId::new(inode, 1);
            let lost = fskv_chunk_engine::UpdateRequest {
                chunk: pending,
                chain_ver,
                kind: fskv_chunk_engine::UpdateKind::Write { offset_bytes: 0, data: b"from a write the client gave up on" },
                tag: fskv_chunk_engine::UpdateTag { client: 78, request: inode.0 },
                expected_ver: None,
                chunk_size_hint_bytes: None,
            };
            // Pending at the head only (the forward failed), or also
            // committed at the middle and the tail (the ack was lost).
            let reached: &[TargetId] = if committed_below_head { &[TargetId(1), TargetId(2), TargetId(3)] } else { &[TargetId(1)] };
            for t in reached {
                let engine = cluster.engine(*t).unwrap();
                let out = engine.update(&lost).unwrap();
                if *t != TargetId(1) {
                    engine.commit(pending, out.pending_ver).unwrap();
                }
            }
            let removed = c.remove_chunks(CHAIN, inode, 0).await.unwrap();
            assert_eq!(removed, 2, "{inode}: both chunks removed");
            for t in [TargetId(1), TargetId(2), TargetId(3)] {
                let left = cluster.engine(t).unwrap().last_chunk(inode).unwrap();
                assert!(left.is_none(), "{inode} on {t}: {left:?} left after remove-chunks");
            }
        }
        assert_replicas_equal(&cluster, &[TargetId(1), TargetId(2), TargetId(3)]);
    })
    .await;
    cluster.shutdown().await;
}

/// A late retry of a write that committed several versions ago is still
/// recognised on a target that got the chunk by a sync, not by the writes:
/// the sync sends the tags of the older versions with the chunk (before,
/// it sent only the committed version's, and the retry was applied again
/// over the newer writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synced_target_recognises_a_late_retry_of_an_older_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let chunk = ChunkId::new(InodeId(30), 0);
        let old = c.new_tag();
        let first = c.write_tagged(CHAIN, chunk, 0, Bytes::from_static(b"old!"), old).await.unwrap();
        c.write(CHAIN, chunk, 0, Bytes::from_static(b"new1")).await.unwrap();
        c.write(CHAIN, chunk, 0, Bytes::from_static(b"new2")).await.unwrap();
        // The tail is replaced by an empty disk and syncs everything.
        cluster.stop_node(2).await;
        cluster.set_state(TargetId(3), PublicTargetState::Offline);
        cluster.start_node(2, true).await.unwrap();
        cluster.set_state(TargetId(3), PublicTargetState::Syncing);
        wait_up_to_date(&cluster, 2, TargetId(3)).await;
        cluster.set_state(TargetId(3), PublicTargetState::Serving);
        // The synced target becomes the head (the others go offline) and
        // the client's retry of the first write arrives there.
        cluster.set_state(TargetId(1), PublicTargetState::Offline);
        cluster.set_state(TargetId(2), PublicTargetState::Offline);
        let again = c.write_tagged(CHAIN, chunk, 0, Bytes::from_static(b"old!"), old).await.unwrap();
        assert!(again.duplicate, "the retry was applied again: {again:?}");
        assert_eq!(again.version, first.version);
        let read = c.read(CHAIN, chunk, 0, 100, false).await.unwrap();
        assert_eq!(&read.data[..], b"new2", "the retry overwrote newer writes");
    })
    .await;
    cluster.shutdown().await;
}

/// A cluster dropped without `shutdown` (what a failing assertion does)
/// lets its runtime shut down: the services' background loops end once the
/// routing source is gone. The sync worker used to spin on the closed
/// routing watch, so a test that panicked hung at 200% CPU instead of
/// failing.
#[test]
fn a_dropped_cluster_lets_its_runtime_shut_down() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        rt.block_on(async {
            let cluster = three_node_cluster(dir.path()).await;
            client(&cluster).write(CHAIN, ChunkId::new(InodeId(5), 0), 0, Bytes::from_static(b"x")).await.expect("write");
            drop(cluster);
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
        drop(rt);
        let _ = done_tx.send(());
    });
    done_rx.recv_timeout(Duration::from_secs(30)).expect("the runtime of a dropped cluster did not shut down within 30 s");
}

/// A retry that arrives after more newer versions of its chunk than the
/// chunk remembers tags of (`RECENT_COMMITS`) is still recognised, by its
/// write channel, at the head and at a new head after the old one left;
/// an older write on a channel whose later write committed is refused.
/// Before the channels, such a retry was applied again and put its old
/// bytes over the newer ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_retry_is_recognised_by_its_write_channel() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = three_node_cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let chunk = ChunkId::new(InodeId(6), 0);
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        let send = |target: TargetId, seq: u64, request: u64, data: &'static [u8]| {
            let routing = cluster.routing();
            let node = routing.chain(CHAIN).unwrap().targets.iter().find(|t| t.target_id == target).unwrap().node_id;
            let addr = routing.node_address(node).unwrap().to_string();
            let req = WriteReq {
                chain_id: CHAIN,
                chain_ver: routing.chain(CHAIN).unwrap().chain_version,
                target,
                chunk,
                op: UpdateOp::Write { offset_bytes: 0, len_bytes: data.len() as u32, crc: crc32c::crc32c(data) },
                tag: RequestTag { client: 78, request },
                chunk_size_hint_bytes: None,
                cap: None,
                channel: Some(fskv_proto::storage::WriteChannel { id: 3, seq }),
            };
            let rpc = rpc.clone();
            async move { rpc.call::<WriteChunk>(&addr, &req, Bytes::from_static(data), CallOptions::default()).await.map(|(r, _)| r) }
        };
        let first = send(TargetId(1), 10, 1, b"old bytes!").await.unwrap();
        assert!(!first.duplicate);
        let newer = fskv_chunk_engine::RECENT_COMMITS as u64 + 4;
        for i in 0..newer {
            c.write(CHAIN, chunk, 0, Bytes::from(format!("newer {i:04}"))).await.unwrap();
        }
        let latest = format!("newer {:04}", newer - 1);
        // The retry: answered as the duplicate it is, nothing applied.
        let again = send(TargetId(1), 10, 1, b"old bytes!").await.unwrap();
        assert!(again.duplicate, "a late retry was applied again");
        assert_eq!(again.version, first.version);
        assert_eq!(&c.read(CHAIN, chunk, 0, 100, false).await.unwrap().data[..], latest.as_bytes());
        // The head leaves the chain: the new head recognises it too.
        cluster.set_state(TargetId(1), PublicTargetState::Offline);
        let at_new_head = send(TargetId(2), 10, 1, b"old bytes!").await.unwrap();
        assert!(at_new_head.duplicate && at_new_head.version == first.version);
        // A later write on the channel, then an older one: refused.
        send(TargetId(2), 11, 2, b"channel 11").await.unwrap();
        let err = send(TargetId(2), 9, 3, b"channel 9!").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Cancelled, "{err}");
        assert_eq!(&c.read(CHAIN, chunk, 0, 100, false).await.unwrap().data[..], b"channel 11");
        assert_replicas_equal(&cluster, &[TargetId(2), TargetId(3)]);
    })
    .await;
    cluster.shutdown().await;
}
