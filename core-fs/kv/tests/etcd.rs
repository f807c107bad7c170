//! The etcd engine against a real 3-member etcd cluster started by the test
//! (`fskv_kv::etcd::testkit`): the whole conformance suite, then what is
//! etcd's own — its limits, a compacted snapshot, and a member killed
//! (the leader) while transactions commit.
//!
//! Without an `etcd` binary the test reports itself skipped (and fails when
//! `FSKV_REQUIRE_ETCD=1`, which deploy/test.sh sets after installing it).

use fskv_kv::conformance::{self, Suite};
use fskv_kv::etcd::testkit::{self, EtcdCluster};
use fskv_kv::{run_transaction, KvEngine, KvError, RangeRequest, RetryOptions};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn skip(test: &str, reason: &str) {
    println!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("FSKV_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{test}: {reason}");
        }
    }
}

/// The cluster, or `None` after reporting the skip.
fn cluster_or_skip(test: &str) -> Option<EtcdCluster> {
    if let Some(reason) = testkit::unavailable() {
        assert!(std::env::var("FSKV_REQUIRE_ETCD").as_deref() != Ok("1"), "{test}: {reason} and FSKV_REQUIRE_ETCD=1");
        skip(test, &reason);
        return None;
    }
    Some(EtcdCluster::start(3, None).expect("start a 3-member etcd cluster"))
}

fn open(spec: &str) -> Arc<dyn KvEngine> {
    fskv_kv::open_engine(spec).expect("open the etcd engine")
}

/// Every conformance case, concurrently (each under its own prefix) on one
/// cluster; every failing case is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_conformance_on_a_three_member_cluster() {
    let Some(cluster) = cluster_or_skip("etcd_conformance_on_a_three_member_cluster") else { return };
    let engine = open(&cluster.spec("conformance/"));
    let started = Instant::now();
    macro_rules! cases {
        ($($name:ident),*) => {{
            let mut handles = Vec::new();
            $(
                let s = Suite::new(engine.clone(), concat!(stringify!($name), "/"));
                handles.push((stringify!($name), tokio::spawn(async move { conformance::$name(&s).await })));
            )*
            handles
        }};
    }
    let handles = cases!(
        lost_update,
        write_skew,
        phantom_insert,
        limited_range_conflict,
        read_your_writes,
        snapshot_reads,
        atomic_add_no_conflict,
        atomic_max_no_conflict,
        clear_range_conflicts,
        retry_loop,
        size_limits,
        concurrent_committers
    );
    let mut failed = Vec::new();
    for (name, h) in handles {
        match h.await {
            Ok(()) => println!("etcd conformance: {name} ok"),
            Err(e) => {
                println!("etcd conformance: {name} FAILED: {e}");
                failed.push(name);
            }
        }
    }
    println!("etcd conformance: {:?}", started.elapsed());
    assert!(failed.is_empty(), "conformance cases failed on etcd: {failed:?}");
}

/// etcd's limits are refused with clear errors: client-side when the spec
/// states the cluster's limits, and server-side (mapped to the same errors)
/// when the spec claims more than the cluster allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_limits_are_refused_with_clear_errors() {
    let Some(cluster) = cluster_or_skip("etcd_limits_are_refused_with_clear_errors") else { return };
    let urls = cluster.client_urls().join(",");
    // As if the cluster ran with etcd's defaults (128 ops, 1.5 MiB).
    let defaults = open(&format!("etcd:{urls}?prefix=limits/"));
    let mut t = defaults.begin().await.unwrap();
    for i in 0..129 {
        t.set(format!("k{i:04}").as_bytes(), b"v").unwrap();
    }
    let e = t.commit().await.unwrap_err();
    assert_eq!(e, KvError::TooManyOperations { ops: 129, limit: 128 });
    assert!(e.to_string().contains("--max-txn-ops"), "{e}");
    let mut t = defaults.begin().await.unwrap();
    for i in 0..20 {
        t.set(format!("big{i:02}").as_bytes(), &vec![1u8; 90_000]).unwrap();
    }
    let e = t.commit().await.unwrap_err();
    assert!(matches!(e, KvError::TransactionTooLarge { limit: 1_572_864, .. }), "{e:?}");
    // 128 sets fit.
    let mut t = defaults.begin().await.unwrap();
    for i in 0..128 {
        t.set(format!("k{i:04}").as_bytes(), b"v").unwrap();
    }
    t.commit().await.expect("128 operations are within etcd's default limit");

    // The spec claims more than the server allows: etcd refuses, mapped to the same error.
    let liar = open(&format!("etcd:{urls}?prefix=limits2/&max_txn_ops=100000&max_request_bytes=100000000"));
    let mut t = liar.begin().await.unwrap();
    for i in 0..(testkit::TEST_MAX_TXN_OPS + 1) {
        t.set(format!("k{i:06}").as_bytes(), b"v").unwrap();
    }
    let e = t.commit().await.unwrap_err();
    assert!(matches!(e, KvError::TooManyOperations { limit: 100_000, .. }), "{e:?}");
    assert!(!e.is_retryable());

    // Read conflicts count too: a read range returning 200 keys is 201 compares.
    let mut t = defaults.begin().await.unwrap();
    for i in 0..100 {
        t.set(format!("r/{i:03}").as_bytes(), b"v").unwrap();
    }
    t.commit().await.unwrap();
    let mut t = defaults.begin().await.unwrap();
    let rows = t.get_range(&RangeRequest::prefix(b"r/")).await.unwrap();
    assert_eq!(rows.kvs.len(), 100);
    let rows2 = t.get_range(&RangeRequest::prefix(b"k0")).await.unwrap();
    assert_eq!(rows2.kvs.len(), 128);
    t.set(b"derived", b"1").unwrap();
    let e = t.commit().await.unwrap_err();
    assert!(matches!(e, KvError::TooManyOperations { limit: 128, .. }), "{e:?}");

    // add_write_conflict_range has no etcd equivalent: refused, not ignored.
    let mut t = defaults.begin().await.unwrap();
    assert!(matches!(t.add_write_conflict_range(b"a", b"b"), Err(KvError::InvalidArgument(_))));
    // add_read_conflict_range conflicts like a range read.
    let mut t = defaults.begin().await.unwrap();
    t.add_read_conflict_range(b"r/", b"r0").unwrap();
    let mut w = defaults.begin().await.unwrap();
    w.clear(b"r/050").unwrap();
    t.set(b"derived", b"2").unwrap();
    // The conflict range's keys are read at the snapshot taken at commit, after this clear: no conflict.
    w.commit().await.unwrap();
    t.commit().await.expect("a conflict range taken after the clear does not conflict with it");
    let mut t = defaults.begin().await.unwrap();
    t.get(b"derived").await.unwrap();
    t.add_read_conflict_range(b"r/", b"r0").unwrap();
    let mut w = defaults.begin().await.unwrap();
    w.clear(b"r/051").unwrap();
    w.commit().await.unwrap();
    t.set(b"derived", b"3").unwrap();
    assert_eq!(t.commit().await, Err(KvError::NotCommitted), "a clear inside a read-conflict range after the snapshot");
}

/// A snapshot whose revision etcd compacted away gives `TransactionTooOld`
/// (retryable), and `run_transaction` gets through on a fresh snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_snapshot_is_too_old() {
    let Some(cluster) = cluster_or_skip("a_compacted_snapshot_is_too_old") else { return };
    let spec = cluster.spec("compact/");
    let engine = open(&spec);
    let mut w = engine.begin().await.unwrap();
    w.set(b"a", b"1").unwrap();
    w.commit().await.unwrap();
    let mut t = engine.begin().await.unwrap();
    assert_eq!(t.get(b"a").await.unwrap().as_deref(), Some(&b"1"[..]));
    let mut w = engine.begin().await.unwrap();
    w.set(b"a", b"2").unwrap();
    let rev = w.commit().await.unwrap();
    cluster.compact(rev).expect("compact");
    let e = t.get(b"b").await.unwrap_err();
    assert_eq!(e, KvError::TransactionTooOld);
    assert!(e.is_retryable());
    let v = run_transaction(&*engine, &RetryOptions::default(), |t| Box::pin(async move { t.get(b"a").await })).await.unwrap();
    assert_eq!(v.as_deref(), Some(&b"2"[..]));
}

/// The leader is killed while 8 tasks commit increments; it comes back
/// later. Every increment acknowledged is counted exactly once: each one
/// also writes its own log key, and a commit whose outcome is unknown is
/// retried only if its log key is absent (the body is idempotent).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commits_survive_the_leader_being_killed() {
    let Some(mut cluster) = cluster_or_skip("commits_survive_the_leader_being_killed") else { return };
    let spec = format!("{}&request_timeout_ms=8000", cluster.spec("failover/"));
    let engine = open(&spec);
    let stop_at = Instant::now() + Duration::from_secs(8);
    let acked = Arc::new(AtomicU64::new(0));
    let unknown = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for task in 0..8u64 {
        let (engine, acked, unknown) = (engine.clone(), acked.clone(), unknown.clone());
        handles.push(tokio::spawn(async move {
            let mut done = BTreeSet::new();
            let mut i = 0u64;
            while Instant::now() < stop_at && i < 2_000 {
                let log = format!("log/{task:02}/{i:05}");
                let opts = RetryOptions { max_attempts: 200, retry_unknown_result: true, ..Default::default() };
                let r = run_transaction(&*engine, &opts, |t| {
                    let log = log.clone();
                    Box::pin(async move {
                        if t.get(log.as_bytes()).await?.is_some() {
                            return Ok(false); // an earlier attempt committed
                        }
                        let n = t.get(b"ctr").await?.map(|v| u64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8]))).unwrap_or(0);
                        t.set(b"ctr", &(n + 1).to_le_bytes())?;
                        t.set(log.as_bytes(), b"1")?;
                        Ok(true)
                    })
                })
                .await;
                match r {
                    Ok(_) => {
                        acked.fetch_add(1, Ordering::Relaxed);
                        done.insert(i);
                    }
                    Err(e) => {
                        assert!(e.is_retryable(), "non-retryable error during failover: {e}");
                        unknown.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
            }
            done
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = cluster.leader().expect("a leader");
    let before = acked.load(Ordering::Relaxed);
    cluster.kill(leader);
    println!("killed the leader (member {leader}) after {before} increments");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = acked.load(Ordering::Relaxed) - before;
    cluster.restart(leader).expect("restart the member");
    let mut done = Vec::new();
    for h in handles {
        done.push(h.await.expect("task"));
    }
    cluster.wait_healthy(Duration::from_secs(30)).expect("healthy again");
    let total_acked = acked.load(Ordering::Relaxed);
    println!("{total_acked} increments acknowledged ({during} in the 3 s after the kill), {} gave up", unknown.load(Ordering::Relaxed));
    assert!(during > 0, "no commit went through in the 3 s after the leader was killed");
    let mut t = engine.begin().await.unwrap();
    let ctr = t.get(b"ctr").await.unwrap().map(|v| u64::from_le_bytes(v[..8].try_into().unwrap())).unwrap_or(0);
    let logs = t.get_range(&RangeRequest::prefix(b"log/")).await.unwrap();
    assert_eq!(ctr, logs.kvs.len() as u64, "the counter must equal the number of log keys (each increment once)");
    for (task, set) in done.iter().enumerate() {
        for i in set {
            let key = format!("log/{task:02}/{i:05}");
            assert!(logs.kvs.iter().any(|(k, _)| &k[..] == key.as_bytes()), "acknowledged increment {key} lost");
        }
    }
    assert!(ctr >= total_acked);
}
