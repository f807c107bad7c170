//! Meta over the real storage service: exact length on close, truncate and
//! GC of chunks, on a loopback chain of three storage services.

mod common;

use bytes::Bytes;
use common::Fs;
use fskv_chunk_engine::EngineConfig;
use fskv_client::storage::StorageClientConfig;
use fskv_meta::{ChainStorage, MetaConfig, MetaService, StorageBackend};
use fskv_proto::meta::*;
use fskv_storage::cluster::{ClusterOptions, LocalCluster};
use fskv_types::{ChainId, ChunkId, InodeId, TargetId};
use std::sync::Arc;

const CHUNK: u32 = 4096;

fn chunks_on(cluster: &LocalCluster, target: TargetId, inode: InodeId) -> Vec<(u64, u32)> {
    let engine = cluster.engine(target).expect("engine");
    engine.dump().expect("dump").into_iter().filter(|(id, _)| id.inode == inode).map(|(id, m)| (id.index, m.committed.len_bytes)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lengths_truncate_and_gc_go_through_the_storage_service() {
    let dir = tempfile::tempdir().unwrap();
    let chain = vec![(TargetId(1), 0), (TargetId(2), 1), (TargetId(3), 2)];
    let options = ClusterOptions::new(EngineConfig { blocks_per_grow: 8, sync_writes: false, ..EngineConfig::default() });
    let cluster = LocalCluster::start(dir.path(), 3, &[chain], options).await.expect("storage cluster");
    let storage_client = cluster.client(StorageClientConfig { max_attempts: 20, retry_backoff_ms: 2, ..Default::default() });
    let backend = Arc::new(ChainStorage::new(storage_client.clone()));

    let cfg = MetaConfig {
        gc_interval_ms: 0,
        chains: vec![ChainId(1)],
        root_layout: LayoutPolicy { table_id: 1, table_version: 1, chunk_size_bytes: CHUNK, stripe_size: 1 },
        ..common::test_config()
    };
    let svc = MetaService::open(Arc::new(fskv_kv::MemoryEngine::new()), backend.clone() as Arc<dyn StorageBackend>, cfg).await.unwrap();
    let fs = Fs::over(svc);

    let (file, session) =
        match fs.op(MetaOp::Create { parent: InodeId::ROOT, name: "f".into(), mode: 0o644, exclusive: true, write: true }).await.unwrap() {
            MetaReply::Opened { inode, session } => (inode, session),
            other => panic!("{other:?}"),
        };
    let layout = file.file().unwrap().layout.clone();
    // 3 full chunks and 100 bytes, written through the storage service, no length report.
    let length = 3 * u64::from(CHUNK) + 100;
    let mut off = 0u64;
    while off < length {
        let index = off / u64::from(CHUNK);
        let len = (length - off).min(u64::from(CHUNK));
        let chain = chain_for_chunk(&layout, index).unwrap();
        storage_client.write(chain, ChunkId::new(file.id, index), 0, Bytes::from(vec![7u8; len as usize])).await.unwrap();
        off += len;
    }
    let closed = fs
        .inode(MetaOp::Close { inode: file.id, session, length_hint: None, truncate_version: 0, wrote: true, writes_settled: false })
        .await
        .unwrap();
    assert_eq!(closed.size_bytes(), length, "exact length from the storage service on close");

    // Truncate inside chunk 1: chunks 2 and 3 go, chunk 1 keeps 904 bytes, on every replica.
    fs.inode(MetaOp::Truncate { inode: file.id, length: 4096 + 904, session: 0 }).await.unwrap();
    for t in [TargetId(1), TargetId(2), TargetId(3)] {
        assert_eq!(chunks_on(&cluster, t, file.id), vec![(0, CHUNK), (1, 904)], "replica {t} after truncate");
    }

    // Unlink, then GC removes the chunks from every replica.
    fs.op(MetaOp::Unlink { parent: InodeId::ROOT, name: "f".into() }).await.unwrap();
    let stats = fs.svc.run_gc_once().await.unwrap();
    assert!(stats.chunks_removed >= 2, "{stats:?}");
    for t in [TargetId(1), TargetId(2), TargetId(3)] {
        assert!(chunks_on(&cluster, t, file.id).is_empty(), "replica {t} keeps chunks after GC");
    }
    let (capacity, _) = backend.capacity_bytes().await;
    assert!(capacity > 0, "statfs capacity from the storage service");
    cluster.shutdown().await;
}
