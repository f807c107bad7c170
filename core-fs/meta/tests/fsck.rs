//! `meta.Fsck` over loopback: clean on a fresh tree (also with one-key
//! pages), then each kind of corruption written straight into the KV is
//! reported, and the reply's problem list is bounded.

mod common;

use common::test_config;
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_kv::{KvEngine, MemoryEngine};
use fskv_meta::schema::{dentry_key, inode_key};
use fskv_meta::{FakeStorage, MetaService, StorageBackend};
use fskv_proto::meta::*;
use fskv_types::InodeId;
use std::collections::HashSet;
use std::sync::Arc;

const ROOT: InodeId = InodeId::ROOT;
const TIMEOUT_MS: u64 = 30_000;

fn req(max_problems: u32, page_keys: u32) -> FsckRequest {
    FsckRequest { max_problems, page_keys }
}

async fn corrupt(engine: &Arc<dyn KvEngine>, f: impl FnOnce(&mut dyn fskv_kv::Transaction)) {
    let mut txn = engine.begin().await.unwrap();
    f(&mut *txn);
    txn.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsck_rpc_is_clean_on_a_fresh_tree_and_reports_corruption() {
    let engine: Arc<dyn KvEngine> = Arc::new(MemoryEngine::new());
    let storage: Arc<dyn StorageBackend> = Arc::new(FakeStorage::new());
    let svc = MetaService::open(engine.clone(), storage, test_config()).await.unwrap();
    let srv = svc.serve("127.0.0.1:0").await.unwrap();
    let client = MetaClient::new(MetaClientConfig::new(vec![srv.local_addr().to_string()])).unwrap();

    let d = client.mkdir(ROOT, "d", 0o755).await.unwrap();
    let sub = client.mkdir(d.id, "sub", 0o755).await.unwrap();
    let a = client.create(d.id, "a", 0o644, true).await.unwrap();
    let b = client.create(sub.id, "b", 0o644, true).await.unwrap();
    client.link(b.id, d.id, "b-link").await.unwrap();
    client.symlink(ROOT, "s", "/d/a").await.unwrap();
    let c = client.create(ROOT, "c", 0o644, true).await.unwrap();

    let clean = client.fsck(&req(100, 0), TIMEOUT_MS).await.unwrap();
    assert_eq!(clean.problems_total, 0, "{clean:#?}");
    assert!(clean.problems.is_empty());
    assert_eq!(clean.inodes, 7, "{clean:#?}"); // root, d, sub, a, b, s, c
    assert_eq!(clean.entries, 7, "{clean:#?}"); // d, sub, a, b, b-link, s, c
                                                // One key per range read: same counts.
    let paged = client.fsck(&req(100, 1), TIMEOUT_MS).await.unwrap();
    assert_eq!((paged.inodes, paged.entries, paged.problems_total), (clean.inodes, clean.entries, 0));

    // Corruption straight in the KV:
    // * the inode under the entry d/a is deleted  → dangling entry;
    // * the entry of d/sub is deleted             → sub is an orphan directory
    //   (b keeps its 2 entries, sub/b and d/b-link, so its nlink still holds)
    //   and d's subdirectory counter (nlink) no longer matches;
    // * c's inode value is garbage                → undecodable (and not dangling).
    corrupt(&engine, |t| {
        t.clear(&inode_key(a.id)).unwrap();
        t.clear(&dentry_key(d.id, "sub")).unwrap();
        t.set(&inode_key(c.id), b"\x01garbage").unwrap();
    })
    .await;
    let bad = client.fsck(&req(100, 2), TIMEOUT_MS).await.unwrap();
    let kinds: HashSet<(FsckProblemKind, InodeId)> = bad.problems.iter().map(|p| (p.kind, p.inode)).collect();
    assert!(kinds.contains(&(FsckProblemKind::DanglingEntry, d.id)), "{bad:#?}");
    assert!(kinds.contains(&(FsckProblemKind::Orphan, sub.id)), "{bad:#?}");
    assert!(kinds.contains(&(FsckProblemKind::Undecodable, c.id)), "{bad:#?}");
    assert!(kinds.contains(&(FsckProblemKind::SubdirCountMismatch, d.id)), "{bad:#?}");
    assert!(!kinds.iter().any(|(k, i)| *k == FsckProblemKind::DanglingEntry && *i == ROOT), "undecodable c is not also dangling: {bad:#?}");
    assert_eq!(bad.problems_total, 4, "{bad:#?}");
    assert!(bad.problems.iter().any(|p| p.detail.contains("d/a") || p.detail.contains(&format!("{}/a", d.id))), "{bad:#?}");

    // A wrong nlink.
    let mut broken_b = client.stat(b.id).await.unwrap();
    broken_b.nlink = 5;
    let value = fskv_meta::schema::encode(&broken_b).unwrap();
    corrupt(&engine, |t| t.set(&inode_key(b.id), &value).unwrap()).await;
    let bad = client.fsck(&req(100, 0), TIMEOUT_MS).await.unwrap();
    assert!(bad.problems.iter().any(|p| p.kind == FsckProblemKind::NlinkMismatch && p.inode == b.id), "{bad:#?}");
    assert_eq!(bad.problems_total, 5, "{bad:#?}");

    // The list is bounded, the count is not.
    let one = client.fsck(&req(1, 0), TIMEOUT_MS).await.unwrap();
    assert_eq!(one.problems.len(), 1);
    assert_eq!(one.problems_total, 5);
    // The server caps the list whatever the caller asks.
    let capped = client.fsck(&req(u32::MAX, 0), TIMEOUT_MS).await.unwrap();
    assert_eq!(capped.problems.len(), 5);

    // The library entry point used by the property tests agrees.
    let report = fskv_meta::fsck::check(&*engine).await.unwrap();
    assert_eq!(report.problems.len(), 5, "{:#?}", report.problems);
}
