//! The conformance suite against the in-memory engine (with its commit
//! thread and in the simulation's inline mode) and the embedded RocksDB engine.

use fskv_kv::conformance::{self, Suite};
use fskv_kv::{KvEngine, MemoryEngine, RocksEngine, RocksOptions};
use std::sync::Arc;

macro_rules! engine_cases {
    ($module:ident, $make:expr) => {
        mod $module {
            use super::*;

            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        let (engine, _dir) = $make;
                        conformance::$name(&Suite::new(engine, concat!(stringify!($name), "/"))).await;
                    }
                };
            }

            case!(lost_update);
            case!(write_skew);
            case!(phantom_insert);
            case!(limited_range_conflict);
            case!(read_your_writes);
            case!(snapshot_reads);
            case!(atomic_add_no_conflict);
            case!(clear_range_conflicts);
            case!(retry_loop);
            case!(size_limits);
            case!(concurrent_committers);
        }
    };
}

fn memory() -> (Arc<dyn KvEngine>, Option<tempfile::TempDir>) {
    (Arc::new(MemoryEngine::new()), None)
}

fn rocks() -> (Arc<dyn KvEngine>, Option<tempfile::TempDir>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = RocksEngine::open(dir.path(), RocksOptions::default()).expect("open rocksdb");
    (Arc::new(engine), Some(dir))
}

/// The simulation's engine: commits inline, the conflict window on a given
/// clock (here the real one).
fn deterministic_memory() -> (Arc<dyn KvEngine>, Option<tempfile::TempDir>) {
    let start = std::time::Instant::now();
    (Arc::new(MemoryEngine::deterministic(Arc::new(move || start.elapsed().as_millis() as u64))), None)
}

engine_cases!(memory_engine, memory());
engine_cases!(deterministic_memory_engine, deterministic_memory());
engine_cases!(rocksdb_engine, rocks());

#[tokio::test]
async fn rocksdb_reopen_keeps_data_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = {
        let engine = RocksEngine::open(dir.path(), RocksOptions::default()).unwrap();
        let mut t = engine.begin().await.unwrap();
        t.set(b"k", b"v").unwrap();
        t.commit().await.unwrap()
    };
    let engine = RocksEngine::open(dir.path(), RocksOptions::default()).unwrap();
    assert_eq!(engine.committed_version(), v1);
    let mut t = engine.begin().await.unwrap();
    assert_eq!(t.get(b"k").await.unwrap().as_deref(), Some(&b"v"[..]));
    t.set(b"k2", b"v2").unwrap();
    assert!(t.commit().await.unwrap() > v1, "versions keep increasing across restarts");
}
