//! RPC level: the service on loopback, used through `MetaClient`, with two
//! stateless servers on one engine and failover when one is killed.

mod common;

use common::test_config;
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_kv::{KvEngine, MemoryEngine};
use fskv_meta::{FakeStorage, MetaService, StorageBackend};
use fskv_proto::meta::*;
use fskv_types::{ErrorCode, InodeId};
use std::sync::Arc;

const ROOT: InodeId = InodeId::ROOT;

async fn server(engine: Arc<dyn KvEngine>) -> (MetaService, fskv_rpc::Server) {
    let storage: Arc<dyn StorageBackend> = Arc::new(FakeStorage::new());
    let svc = MetaService::open(engine, storage, test_config()).await.unwrap();
    let srv = svc.serve("127.0.0.1:0").await.unwrap();
    (svc, srv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_client_over_loopback_with_failover() {
    let engine: Arc<dyn KvEngine> = Arc::new(MemoryEngine::new());
    let (_svc_a, srv_a) = server(engine.clone()).await;
    let (_svc_b, srv_b) = server(engine.clone()).await;
    let mut cfg = MetaClientConfig::new(vec![srv_a.local_addr().to_string(), srv_b.local_addr().to_string()]);
    cfg.retry_backoff_ms = 1;
    let client = MetaClient::new(cfg).unwrap();

    let d = client.mkdir(ROOT, "dir", 0o755).await.unwrap();
    let f = client.create(d.id, "file", 0o644, true).await.unwrap();
    assert_eq!(client.resolve("/dir/file").await.unwrap().id, f.id);
    let err = client.create(d.id, "file", 0o644, true).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists);
    client.set_xattr(f.id, "user.k", b"v", XattrFlag::Any).await.unwrap();
    assert_eq!(client.get_xattr(f.id, "user.k").await.unwrap(), b"v");
    for i in 0..10 {
        client.create(d.id, &format!("x{i}"), 0o644, true).await.unwrap();
    }
    let (page, more) = client.readdir(d.id, "", 4, true).await.unwrap();
    assert_eq!(page.len(), 4);
    assert!(more);
    let obj = client.create_write_publish(ROOT, "obj", 0o644, b"hello", Some(Expected::Absent), Default::default()).await.unwrap();
    assert_eq!(client.read_inline(obj.id, 0, 100).await.unwrap(), b"hello");

    // Batched lookups/stats/creates in one round trip.
    let results = client
        .batch(vec![
            MetaOp::Lookup { parent: d.id, name: "file".into() },
            MetaOp::Stat { inode: obj.id },
            MetaOp::Create { parent: d.id, name: "b1".into(), mode: 0o644, exclusive: true, write: false },
            MetaOp::Lookup { parent: d.id, name: "missing".into() },
        ])
        .await
        .unwrap();
    assert!(results[0].is_ok() && results[1].is_ok() && results[2].is_ok());
    assert_eq!(results[3].as_ref().unwrap_err().code, ErrorCode::NotFound);

    // An idempotent retry through the client: same request sent twice.
    let req = client.request(MetaOp::Create { parent: d.id, name: "idem".into(), mode: 0o644, exclusive: true, write: false });
    let first = client.send(&req).await.unwrap();
    let second = client.send(&req).await.unwrap();
    assert_eq!(first, second);

    // Kill one server: every op still succeeds through the other.
    srv_a.shutdown().await;
    for i in 0..20 {
        let name = format!("after{i}");
        let inode = client.create(d.id, &name, 0o644, true).await.unwrap();
        assert_eq!(client.stat(inode.id).await.unwrap().id, inode.id);
        client.rename(d.id, &name, ROOT, &name).await.unwrap();
        client.unlink(ROOT, &name).await.unwrap();
    }
    let st = client.statfs().await.unwrap();
    assert!(st.inodes >= 14);
    srv_b.shutdown().await;
    let err = client.stat(ROOT).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ConnectionFailed);
}

#[tokio::test]
async fn client_rejects_empty_server_list() {
    assert!(MetaClient::new(MetaClientConfig::new(Vec::new())).is_err());
}

/// A server dies abruptly while creates are in flight: every create is
/// retried on the other server with its request id and succeeds exactly once
/// (no AlreadyExists from a create that had committed before the crash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_in_flight_survive_a_server_crash_exactly_once() {
    let engine: Arc<dyn KvEngine> = Arc::new(MemoryEngine::new());
    let (svc_a, srv_a) = server(engine.clone()).await;
    let (_svc_b, srv_b) = server(engine.clone()).await;
    let mut cfg = MetaClientConfig::new(vec![srv_a.local_addr().to_string(), srv_b.local_addr().to_string()]);
    cfg.retry_backoff_ms = 1;
    cfg.max_attempts = 20;
    let client = MetaClient::new(cfg).unwrap();
    let dir = client.mkdir(ROOT, "crash", 0o755).await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..50 {
                client.create(dir.id, &format!("t{t}-{i}"), 0o644, true).await.unwrap();
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    drop(srv_a); // abort: connections and handlers die mid-request
    drop(svc_a);
    for t in tasks {
        t.await.unwrap();
    }
    let mut names = Vec::new();
    let mut after = String::new();
    loop {
        let (page, more) = client.readdir(dir.id, &after, 100, false).await.unwrap();
        names.extend(page.iter().map(|e| e.name.clone()));
        after = page.last().map(|e| e.name.clone()).unwrap_or_default();
        if !more {
            break;
        }
    }
    assert_eq!(names.len(), 400);
    srv_b.shutdown().await;
    let report = fskv_meta::fsck::check(&*engine).await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}
