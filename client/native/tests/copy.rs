//! `FileHandle::copy_from`: server-side copies between files over a real
//! meta service and a loopback cluster of three storage services with four
//! chains of three replicas. Files under `/wide` have a different chunk size
//! (set on the directory's layout policy), so copies cut at the boundaries
//! of both files.

mod common;

use bytes::Bytes;
use fskv_chunk_engine::EngineConfig;
use fskv_client::file::{FileHandle, FsClient, FsClientConfig, OpenFlags};
use fskv_client::storage::StorageClientConfig;
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_kv::KvEngine;
use fskv_meta::{ChainStorage, MetaConfig, MetaService, StorageBackend};
use fskv_proto::meta::{InodeData, LayoutPolicy};
use fskv_proto::routing::PublicTargetState;
use fskv_proto::storage::CopySource;
use fskv_storage::cluster::{ClusterOptions, LocalCluster};
use fskv_types::{ChainId, ChunkId, ErrorCode, InodeId, TargetId};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const CHUNK: u64 = 4096;
/// Chunk size of files under `/wide` (not a multiple of `CHUNK`).
const WIDE_CHUNK: u64 = 10_000;
const STRIPE: u32 = 4;
const TEST_TIMEOUT_SECS: u64 = 120;

struct Env {
    fs: FsClient,
    cluster: LocalCluster,
    server: fskv_rpc::Server,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn start(config: FsClientConfig, lagging_routing: bool) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let chains = common::chain_placement(STRIPE, 3);
        let options = ClusterOptions::new(EngineConfig { blocks_per_grow: 8, sync_writes: false, ..EngineConfig::default() });
        let cluster = LocalCluster::start(dir.path(), 3, &chains, options).await.expect("storage cluster");
        let client_config = StorageClientConfig { max_attempts: 20, retry_backoff_ms: 2, ..Default::default() };
        let backend = Arc::new(ChainStorage::new(cluster.client(client_config.clone())));
        let cfg = MetaConfig {
            gc_interval_ms: 0,
            chains: (1..=STRIPE).map(ChainId).collect(),
            root_layout: LayoutPolicy { table_id: 1, table_version: 1, chunk_size_bytes: CHUNK as u32, stripe_size: STRIPE },
            ..MetaConfig::default()
        };
        let kv: Arc<dyn KvEngine> = Arc::new(fskv_kv::MemoryEngine::new());
        let svc = MetaService::open(kv.clone(), backend as Arc<dyn StorageBackend>, cfg).await.expect("meta service");
        let server = svc.serve("127.0.0.1:0").await.expect("serve meta");
        let meta = MetaClient::new(MetaClientConfig::new(vec![server.local_addr().to_string()])).expect("meta client");
        let wide = meta.mkdir(InodeId::ROOT, "wide", 0o755).await.expect("mkdir /wide");
        set_dir_chunk_size(&kv, wide.id, WIDE_CHUNK as u32).await;
        let storage = if lagging_routing { common::lagging_storage_client(&cluster, client_config) } else { cluster.client(client_config) };
        let fs = FsClient::new(meta, storage, config);
        Env { fs, cluster, server, _dir: dir }
    }

    async fn stop(self) {
        self.server.shutdown().await;
        self.cluster.shutdown().await;
    }
}

/// Meta has no call to change a directory's layout policy; the test edits
/// the directory inode in the KV store directly.
async fn set_dir_chunk_size(kv: &Arc<dyn KvEngine>, dir: InodeId, chunk_size_bytes: u32) {
    let mut txn = kv.begin().await.expect("begin");
    let mut inode = fskv_meta::ops::load_inode(&mut *txn, dir).await.expect("load dir");
    let InodeData::Directory(d) = &mut inode.data else { panic!("{dir} is not a directory") };
    d.layout.chunk_size_bytes = chunk_size_bytes;
    fskv_meta::ops::save_inode(&mut *txn, &inode).expect("save dir");
    txn.commit().await.expect("commit");
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(131) ^ seed.wrapping_mul(17)) as u8 | 1).collect()
}

async fn with_timeout<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(TEST_TIMEOUT_SECS), f).await.expect("test timed out")
}

/// Applies a copy to the byte models (growing the destination with zeros).
fn model_copy(src: &[u8], src_offset: u64, dst: &mut Vec<u8>, dst_offset: u64, len: u64) {
    let (s, d, n) = (src_offset as usize, dst_offset as usize, len as usize);
    let piece = src[s..s + n].to_vec();
    if dst.len() < d + n {
        dst.resize(d + n, 0);
    }
    dst[d..d + n].copy_from_slice(&piece);
}

/// Data-path byte counters of the client: (read, written).
fn data_bytes(fs: &FsClient) -> (u64, u64) {
    (fs.stats().bytes_read.load(Ordering::Relaxed), fs.stats().bytes_written.load(Ordering::Relaxed))
}

/// Copies through `copy_from` and asserts no data byte passed through the
/// client while the cluster copied `len` bytes.
async fn copy_in_cluster(fs: &FsClient, dst: &FileHandle, src: &FileHandle, src_offset: u64, dst_offset: u64, len: u64) {
    let before = data_bytes(fs);
    let copied = fs.stats().bytes_copied.load(Ordering::Relaxed);
    dst.copy_from(src, src_offset, dst_offset, len).await.expect("copy");
    assert_eq!(data_bytes(fs), before, "a copy moved data through the client");
    assert_eq!(fs.stats().bytes_copied.load(Ordering::Relaxed) - copied, len);
}

async fn read_all(fs: &FsClient, path: &str) -> Vec<u8> {
    let r = fs.open(path, OpenFlags::read_only()).await.expect("open for read");
    r.read_at(0, r.len() + 100).await.expect("read").to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_within_and_across_files_with_different_chunk_sizes_match_a_model() {
    let env = Env::start(FsClientConfig { max_inflight_chunks: 3, ..Default::default() }, false).await;
    with_timeout(async {
        let fs = &env.fs;
        // Source (10,000-byte chunks) with a hole: chunk 1 missing, chunk 2 half.
        let src = fs.open("/wide/src", OpenFlags::create_new()).await.expect("create src");
        assert_eq!(src.layout().chunk_size_bytes as u64, WIDE_CHUNK);
        let mut src_model = vec![0u8; 37_123];
        let head = pattern(1, 12_000);
        let tail = pattern(2, 37_123 - 25_000);
        src.write_at(0, Bytes::from(head.clone())).await.expect("write src head");
        src.write_at(25_000, Bytes::from(tail.clone())).await.expect("write src tail");
        src_model[..12_000].copy_from_slice(&head);
        src_model[25_000..].copy_from_slice(&tail);
        assert_eq!(src.close().await.expect("close src"), src_model.len() as u64);

        // Destination (4,096-byte chunks) with existing data.
        let dst = fs.open("/dst", OpenFlags::create_new()).await.expect("create dst");
        let mut dst_model = pattern(3, 30_000);
        dst.write_at(0, Bytes::from(dst_model.clone())).await.expect("write dst");
        let src = fs.open("/wide/src", OpenFlags::read_only()).await.expect("open src");
        let peak_before = fs.stats().peak_inflight_chunks.load(Ordering::Relaxed);

        // Unaligned, spanning the hole and several chunks of both files, into
        // the middle of dst and past its end.
        copy_in_cluster(fs, &dst, &src, 3_333, 1_234, 30_000).await;
        model_copy(&src_model, 3_333, &mut dst_model, 1_234, 30_000);
        assert_eq!(dst.len(), 31_234, "the destination grew like a write");
        assert!(fs.stats().chunks_copied.load(Ordering::Relaxed) >= 30_000 / CHUNK + 30_000 / WIDE_CHUNK);
        // Within the same file, far past its end (leaves a hole).
        copy_in_cluster(fs, &dst, &dst, 100, 40_000, 5_000).await;
        model_copy(&dst_model.clone(), 100, &mut dst_model, 40_000, 5_000);
        // The tail of the source, exactly up to its length.
        copy_in_cluster(fs, &dst, &src, 30_000, 2, 7_123).await;
        model_copy(&src_model, 30_000, &mut dst_model, 2, 7_123);
        assert_eq!(dst.len(), 45_000);
        assert_eq!(dst.read_at(0, 1 << 20).await.expect("read dst through the writer"), dst_model);
        assert!(fs.stats().peak_inflight_chunks.load(Ordering::Relaxed) <= peak_before.max(3), "in-flight bound");
        assert_eq!(dst.close().await.expect("close dst"), dst_model.len() as u64, "exact length on close");
        assert_eq!(read_all(fs, "/dst").await, dst_model);

        // From 4,096-byte chunks into a 10,000-byte-chunk file.
        let wide = fs.open("/wide/dst", OpenFlags::create_new()).await.expect("create wide dst");
        let dst_r = fs.open("/dst", OpenFlags::read_only()).await.expect("open dst");
        let mut wide_model = Vec::new();
        copy_in_cluster(fs, &wide, &dst_r, 77, 9_999, 34_567).await;
        model_copy(&dst_model, 77, &mut wide_model, 9_999, 34_567);
        assert_eq!(wide.close().await.expect("close wide"), wide_model.len() as u64);
        assert_eq!(read_all(fs, "/wide/dst").await, wide_model);
        // The source files are unchanged.
        assert_eq!(read_all(fs, "/wide/src").await, src_model);
    })
    .await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copy_from_an_inline_source_and_the_refused_copies() {
    let env = Env::start(FsClientConfig::default(), false).await;
    with_timeout(async {
        let fs = &env.fs;
        let body = b"small inline body".to_vec();
        fs.meta().create_write_publish(InodeId::ROOT, "inline", 0o644, &body, None, Default::default()).await.expect("create inline");
        let inline = fs.open("/inline", OpenFlags::read_only()).await.expect("open inline");
        let dst = fs.open("/dst", OpenFlags::create_new()).await.expect("create dst");
        let mut model = pattern(4, 6_000);
        dst.write_at(0, Bytes::from(model.clone())).await.expect("write dst");

        // An inline source is read through meta and written (it is small).
        dst.copy_from(&inline, 6, 4_090, 11).await.expect("copy from inline");
        model_copy(&body, 6, &mut model, 4_090, 11);
        assert_eq!(dst.read_at(0, 1 << 20).await.expect("read"), model);

        let err = |r: Result<(), fskv_client::file::FileError>| r.expect_err("refused").code();
        // Past the source's length.
        assert_eq!(err(dst.copy_from(&inline, 10, 0, body.len() as u64).await), ErrorCode::InvalidArgument);
        assert_eq!(err(dst.copy_from(&dst, 5_000, 7_000, 1_001).await), ErrorCode::InvalidArgument);
        // Overlapping ranges of one file.
        assert_eq!(err(dst.copy_from(&dst, 0, 100, 1_000).await), ErrorCode::InvalidArgument);
        // Into an inline file, and handles opened for the wrong mode.
        let inline_w = fs.open("/inline", OpenFlags::read_write()).await.expect("open inline for write");
        assert_eq!(err(inline_w.copy_from(&dst, 0, 0, 10).await), ErrorCode::Unsupported);
        assert_eq!(err(inline.copy_from(&dst, 0, 0, 10).await), ErrorCode::PermissionDenied);
        let write_only = fs.open("/dst", OpenFlags { write: true, ..Default::default() }).await.expect("write-only");
        assert_eq!(err(dst.copy_from(&write_only, 0, 0, 10).await), ErrorCode::PermissionDenied);
        inline_w.close().await.expect("close inline");
        write_only.close().await.expect("close write-only");
        assert_eq!(dst.read_at(0, 1 << 20).await.expect("read"), model, "refused copies changed nothing");
        assert_eq!(dst.close().await.expect("close"), model.len() as u64);

        // A retried piece with the same tag is applied once (storage client level).
        let src = fs.open("/src", OpenFlags::create_new()).await.expect("create src");
        src.write_at(0, Bytes::from(pattern(5, 100))).await.expect("write src");
        let src_chain = fskv_proto::meta::chain_for_chunk(src.layout(), 0).expect("src chain");
        let target = fs.open("/target", OpenFlags::create_new()).await.expect("create target");
        let dst_chain = fskv_proto::meta::chain_for_chunk(target.layout(), 0).expect("dst chain");
        let source = CopySource { chain_id: src_chain, chunk: ChunkId::new(src.inode(), 0), offset_bytes: 0, len_bytes: 100 };
        let storage = fs.storage();
        let tag = storage.new_tag();
        let dst_chunk = ChunkId::new(target.inode(), 0);
        let first = storage.copy_range_tagged(dst_chain, dst_chunk, 0, source, None, tag).await.expect("copy");
        src.write_at(0, Bytes::from(pattern(6, 100))).await.expect("rewrite src");
        let again = storage.copy_range_tagged(dst_chain, dst_chunk, 0, source, None, tag).await.expect("retry");
        assert!(!first.write.duplicate && again.write.duplicate);
        assert_eq!(first.write.version, again.write.version);
        let read = storage.read(dst_chain, dst_chunk, 0, 100, false).await.expect("read copy");
        assert_eq!(&read.data[..], &pattern(5, 100)[..], "the retry did not copy the new source bytes");
        src.close().await.expect("close src");
        target.close().await.expect("close target");
    })
    .await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_follow_chain_version_changes() {
    let env = Env::start(FsClientConfig::default(), true).await;
    with_timeout(async {
        let fs = &env.fs;
        let src_model = pattern(7, 5 * WIDE_CHUNK as usize + 11);
        let src = fs.open("/wide/src", OpenFlags::create_new()).await.expect("create src");
        src.write_at(0, Bytes::from(src_model.clone())).await.expect("write src");
        let dst = fs.open("/dst", OpenFlags::create_new()).await.expect("create dst");
        let before = fs.storage().routing().current().version;
        // Every chain loses its head; the client's routing still names it.
        for c in 1..=u64::from(STRIPE) {
            env.cluster.set_state(TargetId(c * 10 + 1), PublicTargetState::Offline);
        }
        assert_eq!(fs.storage().routing().current().version, before, "the client's routing lags");
        copy_in_cluster(fs, &dst, &src, 1, 3, src_model.len() as u64 - 1).await;
        assert!(fs.storage().routing().current().version > before, "the client refreshed its routing");
        let mut model = Vec::new();
        model_copy(&src_model, 1, &mut model, 3, src_model.len() as u64 - 1);
        assert_eq!(dst.close().await.expect("close dst"), model.len() as u64);
        src.close().await.expect("close src");
        assert_eq!(read_all(fs, "/dst").await, model);
    })
    .await;
    env.stop().await;
}
