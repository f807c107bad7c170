//! Server-side copies (`CopyRange`) on a loopback cluster of three storage
//! services with two chains of three replicas: the destination head reads
//! the source from the source chain and writes it down its own chain.

use bytes::Bytes;
use fskv_chunk_engine::EngineConfig;
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_proto::routing::PublicTargetState;
use fskv_proto::storage::CopyRange;
use fskv_proto::storage::{CopyRangeReq, CopySource, RequestTag};
use fskv_rpc::{CallOptions, ClientConfig, RpcClient, TcpTransport};
use fskv_storage::cluster::{ClusterOptions, LocalCluster};
use fskv_storage::service::MAX_COPY_BYTES;
use fskv_types::{ChainId, ChunkId, ErrorCode, InodeId, NodeId, TargetId};
use std::sync::Arc;
use std::time::Duration;

const DST: ChainId = ChainId(1);
const SRC: ChainId = ChainId(2);
const DST_TARGETS: [TargetId; 3] = [TargetId(1), TargetId(2), TargetId(3)];
const SRC_TARGETS: [TargetId; 3] = [TargetId(4), TargetId(5), TargetId(6)];
const TEST_TIMEOUT_SECS: u64 = 120;

/// Chain 1 headed on node 0, chain 2 headed on node 1.
async fn cluster(dir: &std::path::Path) -> LocalCluster {
    let dst = vec![(TargetId(1), 0), (TargetId(2), 1), (TargetId(3), 2)];
    let src = vec![(TargetId(4), 1), (TargetId(5), 2), (TargetId(6), 0)];
    let options = ClusterOptions::new(EngineConfig { blocks_per_grow: 8, sync_writes: false, ..EngineConfig::default() });
    LocalCluster::start(dir, 3, &[dst, src], options).await.expect("cluster")
}

fn client(cluster: &LocalCluster) -> StorageClient {
    cluster.client(StorageClientConfig { max_attempts: 20, retry_backoff_ms: 2, ..Default::default() })
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// The committed content of `chunk` on every target, asserting equal
/// replicas with nothing pending.
fn replicas_content(cluster: &LocalCluster, targets: &[TargetId], chunk: ChunkId) -> Vec<u8> {
    let mut first: Option<(u64, Vec<u8>)> = None;
    for t in targets {
        let engine = cluster.engine(*t).expect("engine");
        let meta = engine.meta(chunk).expect("chunk present");
        assert!(meta.pending.is_none(), "{t} {chunk}: pending version left");
        let data = engine.read(chunk, 0, 1 << 30, fskv_chunk_engine::ReadMode::Strict).expect("read").data;
        match &first {
            None => first = Some((meta.committed_ver, data)),
            Some((ver, content)) => {
                assert_eq!(*ver, meta.committed_ver, "{t} {chunk}: committed version differs");
                assert!(*content == data, "{t} {chunk}: content differs");
            }
        }
    }
    first.map(|(_, d)| d).unwrap_or_default()
}

async fn with_timeout<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(TEST_TIMEOUT_SECS), f).await.expect("test timed out")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copy_range_copies_committed_source_bytes_and_zero_fills_missing_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let src_chunk = ChunkId::new(InodeId(10), 0);
        let src_data = pattern(3, 5000);
        c.write(SRC, src_chunk, 0, Bytes::from(src_data.clone())).await.expect("write source");
        let dst_chunk = ChunkId::new(InodeId(20), 0);
        let mut model = pattern(7, 3000);
        c.write(DST, dst_chunk, 0, Bytes::from(model.clone())).await.expect("write destination");

        // Into the middle of the existing destination chunk.
        let src = CopySource { chain_id: SRC, chunk: src_chunk, offset_bytes: 1000, len_bytes: 1500 };
        let resp = c.copy_range(DST, dst_chunk, 700, src, None).await.expect("copy");
        assert_eq!(resp.src_found_bytes, 1500);
        assert!(!resp.write.duplicate);
        model[700..2200].copy_from_slice(&src_data[1000..2500]);
        assert_eq!(replicas_content(&cluster, &DST_TARGETS, dst_chunk), model);

        // A range running past the source chunk's end: the rest is zeros.
        let src = CopySource { chain_id: SRC, chunk: src_chunk, offset_bytes: 4500, len_bytes: 1000 };
        let resp = c.copy_range(DST, dst_chunk, 2500, src, None).await.expect("copy past the source end");
        assert_eq!(resp.src_found_bytes, 500);
        model.resize(3500, 0);
        model[2500..3000].copy_from_slice(&src_data[4500..5000]);
        model[3000..3500].fill(0);
        assert_eq!(replicas_content(&cluster, &DST_TARGETS, dst_chunk), model);

        // A missing source chunk reads as zeros (over existing bytes too).
        let hole = CopySource { chain_id: SRC, chunk: ChunkId::new(InodeId(10), 9), offset_bytes: 0, len_bytes: 400 };
        let resp = c.copy_range(DST, dst_chunk, 100, hole, None).await.expect("copy a hole");
        assert_eq!(resp.src_found_bytes, 0);
        model[100..500].fill(0);
        assert_eq!(replicas_content(&cluster, &DST_TARGETS, dst_chunk), model);

        // A new destination chunk, with the source chain's head offline: the
        // destination head reads from another serving replica.
        cluster.set_state(SRC_TARGETS[0], PublicTargetState::Offline);
        let fresh = ChunkId::new(InodeId(20), 1);
        let src = CopySource { chain_id: SRC, chunk: src_chunk, offset_bytes: 0, len_bytes: 5000 };
        let resp = c.copy_range(DST, fresh, 0, src, Some(8192)).await.expect("copy with the source head offline");
        assert_eq!(resp.src_found_bytes, 5000);
        assert_eq!(replicas_content(&cluster, &DST_TARGETS, fresh), src_data);
        // Source untouched.
        assert_eq!(replicas_content(&cluster, &SRC_TARGETS[1..], src_chunk), src_data);
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copy_range_retry_with_the_same_tag_is_applied_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let src_chunk = ChunkId::new(InodeId(11), 0);
        c.write(SRC, src_chunk, 0, Bytes::from(pattern(1, 2048))).await.expect("write source");
        let dst_chunk = ChunkId::new(InodeId(21), 0);
        let src = CopySource { chain_id: SRC, chunk: src_chunk, offset_bytes: 0, len_bytes: 2048 };
        let tag = c.new_tag();
        let first = c.copy_range_tagged(DST, dst_chunk, 0, src, None, tag).await.expect("copy");
        // The source changes; a retry of the same request must not copy again.
        c.write(SRC, src_chunk, 0, Bytes::from(pattern(2, 2048))).await.expect("rewrite source");
        let again = c.copy_range_tagged(DST, dst_chunk, 0, src, None, tag).await.expect("retry");
        assert!(!first.write.duplicate && again.write.duplicate);
        assert_eq!(first.write.version, again.write.version);
        assert_eq!(replicas_content(&cluster, &DST_TARGETS, dst_chunk), pattern(1, 2048));
        // A new request copies the new source bytes.
        let third = c.copy_range(DST, dst_chunk, 0, src, None).await.expect("new copy");
        assert_eq!(third.write.version, first.write.version + 1);
        assert_eq!(replicas_content(&cluster, &DST_TARGETS, dst_chunk), pattern(2, 2048));
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copy_range_checks_chain_version_role_and_bounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = cluster(dir.path()).await;
    with_timeout(async {
        let c = client(&cluster);
        let src_chunk = ChunkId::new(InodeId(12), 0);
        c.write(SRC, src_chunk, 0, Bytes::from(pattern(5, 100))).await.expect("write source");
        let routing = cluster.routing();
        let head_addr = routing.node_address(NodeId(1)).expect("head address").to_string();
        let middle_addr = routing.node_address(NodeId(2)).expect("middle address").to_string();
        let chain_ver = routing.chain(DST).expect("chain").chain_version;
        let dst_chunk = ChunkId::new(InodeId(22), 0);
        let base = CopyRangeReq {
            chain_id: DST,
            chain_ver,
            target: DST_TARGETS[0],
            chunk: dst_chunk,
            offset_bytes: 0,
            src: CopySource { chain_id: SRC, chunk: src_chunk, offset_bytes: 0, len_bytes: 100 },
            tag: RequestTag { client: 99, request: 1 },
            chunk_size_hint_bytes: None,
        };
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        let call = |addr: String, req: CopyRangeReq| {
            let rpc = rpc.clone();
            async move { rpc.call::<CopyRange>(&addr, &req, Bytes::new(), CallOptions::default()).await.map(|(r, _)| r) }
        };
        let stale = CopyRangeReq { chain_ver: chain_ver - 1, ..base.clone() };
        assert_eq!(call(head_addr.clone(), stale).await.expect_err("stale").code(), ErrorCode::StaleChainVersion);
        let not_head = CopyRangeReq { target: DST_TARGETS[1], ..base.clone() };
        assert_eq!(call(middle_addr, not_head).await.expect_err("not head").code(), ErrorCode::TargetNotServing);
        let empty = CopyRangeReq { src: CopySource { len_bytes: 0, ..base.src }, ..base.clone() };
        assert_eq!(call(head_addr.clone(), empty).await.expect_err("empty").code(), ErrorCode::InvalidArgument);
        let past_chunk = CopyRangeReq { offset_bytes: MAX_COPY_BYTES - 10, ..base.clone() };
        assert_eq!(call(head_addr.clone(), past_chunk).await.expect_err("past the chunk").code(), ErrorCode::InvalidArgument);
        let too_long = CopyRangeReq { src: CopySource { len_bytes: (MAX_COPY_BYTES + 1) as u32, ..base.src }, ..base.clone() };
        assert_eq!(call(head_addr.clone(), too_long).await.expect_err("too long").code(), ErrorCode::InvalidArgument);
        assert!(cluster.engine(DST_TARGETS[0]).expect("engine").meta(dst_chunk).is_none(), "nothing written by refused copies");
        // A source chain unknown to routing is refused (after the head's
        // bounded source-read retries), and nothing is written.
        let no_source = CopyRangeReq { src: CopySource { chain_id: ChainId(77), ..base.src }, ..base.clone() };
        let err = call(head_addr.clone(), no_source).await.expect_err("unknown source chain");
        assert_eq!(err.code(), ErrorCode::TargetNotServing);
        assert!(cluster.engine(DST_TARGETS[0]).expect("engine").meta(dst_chunk).is_none());
        // The valid request goes through.
        let ok = call(head_addr, base).await.expect("copy");
        assert_eq!(ok.src_found_bytes, 100);
        assert_eq!(replicas_content(&cluster, &DST_TARGETS, dst_chunk), pattern(5, 100));
        drop(c);
    })
    .await;
    cluster.shutdown().await;
}
