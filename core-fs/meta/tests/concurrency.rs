//! Concurrency: racing directory renames never create a cycle or an orphan;
//! racing creates of one name have exactly one winner. Run on the embedded
//! RocksDB engine and the memory engine.

mod common;

use common::{test_config, Fs};
use fskv_kv::{KvEngine, MemoryEngine, RocksEngine, RocksOptions};
use fskv_proto::meta::*;
use fskv_types::{ErrorCode, InodeId};
use std::sync::Arc;

const ROOT: InodeId = InodeId::ROOT;
const DIRS: usize = 8;

async fn rename_storm(engine: Arc<dyn KvEngine>) {
    let fs = Arc::new(Fs::with(engine, test_config()).await);
    let mut ids = Vec::new();
    for i in 0..DIRS {
        ids.push(fs.mkdir(ROOT, &format!("d{i}")).await.unwrap().id);
    }
    let ids = Arc::new(ids);
    let mut tasks = Vec::new();
    for t in 0..16u64 {
        let (fs, ids) = (fs.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let mut seed = SplitMix64::new(t);
            let (mut ok, mut cycles) = (0, 0);
            for _ in 0..40 {
                let a = (seed.next_u64() % DIRS as u64) as usize;
                let b = (seed.next_u64() % (DIRS as u64 + 1)) as usize;
                let moved = ids[a];
                // Target: another dir, or the root.
                let target = if b == DIRS { ROOT } else { ids[b] };
                let Ok(cur) = fs.stat(moved).await else { continue };
                let parent = cur.dir().unwrap().parent;
                let name = format!("d{a}");
                let r = fs.op(MetaOp::Rename { src_parent: parent, src_name: name.clone(), dst_parent: target, dst_name: name }).await;
                match r {
                    Ok(_) => ok += 1,
                    Err(e) if e.code() == ErrorCode::WouldCreateCycle => cycles += 1,
                    // The parent we read may be stale by now.
                    Err(e) if e.code() == ErrorCode::NotFound => {}
                    Err(e) => panic!("unexpected rename error {e}"),
                }
            }
            (ok, cycles)
        }));
    }
    let (mut ok, mut cycles) = (0, 0);
    for t in tasks {
        let (o, c) = t.await.unwrap();
        ok += o;
        cycles += c;
    }
    assert!(ok > 20, "only {ok} renames succeeded");
    assert!(cycles > 0, "no cycle was ever refused: the test did not race");
    fs.fsck_clean().await;
    // Every directory is still reachable from the root by names.
    let mut seen = 0;
    let mut stack = vec![ROOT];
    while let Some(d) = stack.pop() {
        for e in fs.readdir_all(d).await.unwrap() {
            assert_eq!(e.kind, InodeKind::Directory);
            seen += 1;
            stack.push(e.inode);
            assert!(seen <= DIRS, "a directory is reachable twice");
        }
    }
    assert_eq!(seen, DIRS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_directory_renames_memory() {
    rename_storm(Arc::new(MemoryEngine::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_directory_renames_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RocksOptions { sync_writes: false, ..RocksOptions::default() };
    rename_storm(Arc::new(RocksEngine::open(dir.path(), opts).unwrap())).await;
}

async fn create_race(engine: Arc<dyn KvEngine>, batching: bool) {
    let cfg = MetaConfig { batch_shards: if batching { 4 } else { 0 }, ..test_config() };
    let fs = Arc::new(Fs::with(engine, cfg).await);
    for round in 0..5 {
        let name = format!("same{round}");
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let (fs, name) = (fs.clone(), name.clone());
            tasks.push(tokio::spawn(async move { fs.create(ROOT, &name).await }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(i) => winners.push(i.id),
                Err(e) => assert_eq!(e.code(), ErrorCode::AlreadyExists, "{e}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one create wins");
        assert_eq!(fs.lookup(ROOT, &name).await.unwrap().id, winners[0]);
    }
    fs.fsck_clean().await;
}

use fskv_meta::MetaConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_of_one_name_have_one_winner() {
    create_race(Arc::new(MemoryEngine::new()), true).await;
    create_race(Arc::new(MemoryEngine::new()), false).await;
    let dir = tempfile::tempdir().unwrap();
    let opts = RocksOptions { sync_writes: false, ..RocksOptions::default() };
    create_race(Arc::new(RocksEngine::open(dir.path(), opts).unwrap()), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_creates_in_one_directory() {
    let fs = Arc::new(Fs::new().await);
    let d = fs.mkdir(ROOT, "many").await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let fs = fs.clone();
        tasks.push(tokio::spawn(async move { fs.create(d.id, &format!("f{i}")).await.map(|x| x.id) }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().unwrap());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 200);
    assert_eq!(fs.readdir_all(d.id).await.unwrap().len(), 200);
    fs.fsck_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_racing_a_directory_removal_leave_no_orphans() {
    for use_tree in [false, true] {
        let fs = Arc::new(Fs::new().await);
        let victim = fs.mkdir(ROOT, "victim").await.unwrap();
        let mut tasks = Vec::new();
        for t in 0..8 {
            let fs = fs.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..20 {
                    match fs.create(victim.id, &format!("t{t}-{i}")).await {
                        Ok(_) => {}
                        Err(e) => assert!(matches!(e.code(), ErrorCode::NotFound | ErrorCode::NotDirectory), "{e}"),
                    }
                }
            }));
        }
        let remover = {
            let fs = fs.clone();
            tokio::spawn(async move {
                loop {
                    let op = if use_tree {
                        MetaOp::RemoveTree { parent: ROOT, name: "victim".into() }
                    } else {
                        MetaOp::Rmdir { parent: ROOT, name: "victim".into() }
                    };
                    match fs.op(op).await {
                        Ok(_) => return,
                        Err(e) if e.code() == ErrorCode::NotEmpty => {
                            // Empty it and try again.
                            for entry in fs.readdir_all(victim.id).await.unwrap_or_default() {
                                let _ = fs.op(MetaOp::Unlink { parent: victim.id, name: entry.name }).await;
                            }
                            tokio::task::yield_now().await;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        };
        for t in tasks {
            t.await.unwrap();
        }
        remover.await.unwrap();
        fs.svc.run_gc_until_idle().await.unwrap();
        fs.fsck_clean().await;
        let report = fskv_meta::fsck::check(&**fs.svc.engine()).await.unwrap();
        assert_eq!(report.inodes, 1, "only the root is left (use_tree={use_tree})");
        assert_eq!(report.entries, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_servers_on_one_engine() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RocksOptions { sync_writes: false, ..RocksOptions::default() };
    let engine: Arc<dyn KvEngine> = Arc::new(RocksEngine::open(dir.path(), opts).unwrap());
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(Arc::new(Fs::with(engine.clone(), test_config()).await));
    }
    let mut tasks = Vec::new();
    for (s, fs) in servers.iter().enumerate() {
        for t in 0..4 {
            let fs = fs.clone();
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..300 {
                    ids.push(fs.create(ROOT, &format!("s{s}-t{t}-{i}")).await.unwrap().id);
                }
                ids
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "inode ids are unique across servers");
    assert_eq!(servers[2].readdir_all(ROOT).await.unwrap().len(), n);
    servers[0].fsck_clean().await;
}
