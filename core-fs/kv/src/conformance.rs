//! The conformance suite every engine must pass: FoundationDB's transaction
//! semantics as 3FS-KV relies on them. Engines' test files call each case;
//! `FDB_CLUSTER_FILE` runs the same cases against FoundationDB.
//!
//! Every case writes only under its own key prefix (the `Suite::prefix`), so
//! cases can run concurrently against one shared cluster. Cases panic on a
//! violated property, with a message naming it.

use crate::{limits, run_transaction, KvEngine, KvError, RangeRequest, RetryOptions};
use bytes::Bytes;
use std::sync::Arc;

/// One engine and a key prefix private to one test case.
#[derive(Clone)]
pub struct Suite {
    pub engine: Arc<dyn KvEngine>,
    pub prefix: Vec<u8>,
}

impl Suite {
    pub fn new(engine: Arc<dyn KvEngine>, prefix: &str) -> Self {
        Suite { engine, prefix: prefix.as_bytes().to_vec() }
    }

    fn key(&self, k: &str) -> Vec<u8> {
        let mut v = self.prefix.clone();
        v.extend_from_slice(k.as_bytes());
        v
    }

    async fn put(&self, k: &str, v: &[u8]) {
        let mut t = self.engine.begin().await.expect("begin");
        t.set(&self.key(k), v).expect("set");
        t.commit().await.expect("commit a setup write");
    }

    async fn read(&self, k: &str) -> Option<Bytes> {
        let mut t = self.engine.begin().await.expect("begin");
        t.get(&self.key(k)).await.expect("get")
    }
}

fn u64_of(v: Option<Bytes>) -> u64 {
    v.map(|b| {
        let mut a = [0u8; 8];
        let n = b.len().min(8);
        a[..n].copy_from_slice(&b[..n]);
        u64::from_le_bytes(a)
    })
    .unwrap_or(0)
}

/// Two transactions read the same counter and both write it: the second to
/// commit must fail with `NotCommitted`.
pub async fn lost_update(s: &Suite) {
    s.put("counter", &5u64.to_le_bytes()).await;
    let k = s.key("counter");
    let mut t1 = s.engine.begin().await.unwrap();
    let mut t2 = s.engine.begin().await.unwrap();
    let v1 = u64_of(t1.get(&k).await.unwrap());
    let v2 = u64_of(t2.get(&k).await.unwrap());
    t1.set(&k, &(v1 + 1).to_le_bytes()).unwrap();
    t2.set(&k, &(v2 + 1).to_le_bytes()).unwrap();
    t1.commit().await.expect("first committer wins");
    let err = t2.commit().await.expect_err("lost update: second read-modify-write committed");
    assert_eq!(err, KvError::NotCommitted);
    assert_eq!(u64_of(s.read("counter").await), 6);
}

/// Write skew (x + y ≥ 1, each transaction zeroes one after reading both):
/// serializable isolation lets only one commit.
pub async fn write_skew(s: &Suite) {
    s.put("x", b"1").await;
    s.put("y", b"1").await;
    let (kx, ky) = (s.key("x"), s.key("y"));
    let mut t1 = s.engine.begin().await.unwrap();
    let mut t2 = s.engine.begin().await.unwrap();
    for t in [&mut t1, &mut t2] {
        let x = t.get(&kx).await.unwrap();
        let y = t.get(&ky).await.unwrap();
        assert_eq!((x.as_deref(), y.as_deref()), (Some(&b"1"[..]), Some(&b"1"[..])));
    }
    t1.set(&kx, b"0").unwrap();
    t2.set(&ky, b"0").unwrap();
    let r1 = t1.commit().await;
    let r2 = t2.commit().await;
    assert!(r1.is_ok() != r2.is_ok(), "write skew: exactly one must commit, got {r1:?} and {r2:?}");
    let x = s.read("x").await;
    let y = s.read("y").await;
    assert!(x.as_deref() == Some(b"1") || y.as_deref() == Some(b"1"), "invariant x+y>=1 broken");
}

/// A transaction that read a range conflicts with a concurrent insert into it.
pub async fn phantom_insert(s: &Suite) {
    s.put("dir/a", b"1").await;
    s.put("dir/c", b"1").await;
    let prefix = s.key("dir/");
    let mut reader = s.engine.begin().await.unwrap();
    let rows = reader.get_range(&RangeRequest::prefix(&prefix)).await.unwrap();
    assert_eq!(rows.kvs.len(), 2);
    s.put("dir/b", b"1").await; // the phantom
    reader.set(&s.key("count"), &(rows.kvs.len() as u64).to_le_bytes()).unwrap();
    let err = reader.commit().await.expect_err("phantom insert into a read range was not detected");
    assert_eq!(err, KvError::NotCommitted);

    // An insert outside the read range does not conflict.
    let mut reader = s.engine.begin().await.unwrap();
    reader.get_range(&RangeRequest::prefix(&prefix)).await.unwrap();
    s.put("other/z", b"1").await;
    reader.set(&s.key("count"), b"3").unwrap();
    reader.commit().await.expect("an insert outside the read range must not conflict");
}

/// A limited range read only conflicts over the part it actually read.
pub async fn limited_range_conflict(s: &Suite) {
    for k in ["r/1", "r/2", "r/3", "r/4"] {
        s.put(k, b"v").await;
    }
    let mut t = s.engine.begin().await.unwrap();
    let page = t.get_range(&RangeRequest::prefix(&s.key("r/")).limit(2)).await.unwrap();
    assert!(page.more);
    assert_eq!(page.kvs.len(), 2);
    s.put("r/5", b"v").await; // after the read part
    t.set(&s.key("w"), b"1").unwrap();
    t.commit().await.expect("insert beyond the read page must not conflict");

    let mut t = s.engine.begin().await.unwrap();
    t.get_range(&RangeRequest::prefix(&s.key("r/")).limit(2)).await.unwrap();
    s.put("r/15", b"v").await; // inside the read page ("r/1" < "r/15" < "r/2")
    t.set(&s.key("w"), b"2").unwrap();
    assert_eq!(t.commit().await, Err(KvError::NotCommitted));
}

/// Reads see the transaction's own sets, clears, range clears and atomic adds,
/// in point and range reads, forwards and backwards.
pub async fn read_your_writes(s: &Suite) {
    for (k, v) in [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", "5")] {
        s.put(k, v.as_bytes()).await;
    }
    s.put("n", &10u64.to_le_bytes()).await;
    let mut t = s.engine.begin().await.unwrap();
    t.set(&s.key("b"), b"20").unwrap();
    t.set(&s.key("bb"), b"new").unwrap();
    t.clear(&s.key("a")).unwrap();
    t.clear_range(&s.key("c"), &s.key("e")).unwrap(); // clears c, d
    t.set(&s.key("cc"), b"after-clear").unwrap(); // set after the range clear survives
    t.atomic_add(&s.key("n"), 5).unwrap();
    t.atomic_add(&s.key("fresh"), 7).unwrap();
    assert_eq!(t.get(&s.key("a")).await.unwrap(), None);
    assert_eq!(t.get(&s.key("b")).await.unwrap().as_deref(), Some(&b"20"[..]));
    assert_eq!(t.get(&s.key("c")).await.unwrap(), None);
    assert_eq!(t.get(&s.key("cc")).await.unwrap().as_deref(), Some(&b"after-clear"[..]));
    assert_eq!(u64_of(t.get(&s.key("n")).await.unwrap()), 15);
    assert_eq!(u64_of(t.get(&s.key("fresh")).await.unwrap()), 7);

    let all = RangeRequest::new(s.key("a"), s.key("z"));
    let rows = t.get_range(&all).await.unwrap();
    let keys: Vec<&[u8]> = rows.kvs.iter().map(|(k, _)| &k[s.prefix.len()..]).collect();
    assert_eq!(keys, vec![&b"b"[..], b"bb", b"cc", b"e", b"fresh", b"n"]);
    let rev = t.get_range(&all.clone().reverse(true).limit(3)).await.unwrap();
    let keys: Vec<&[u8]> = rev.kvs.iter().map(|(k, _)| &k[s.prefix.len()..]).collect();
    assert_eq!(keys, vec![&b"n"[..], b"fresh", b"e"]);
    assert!(rev.more);
    t.commit().await.unwrap();

    // What the transaction saw is what committed.
    let mut t = s.engine.begin().await.unwrap();
    let rows = t.get_range(&all).await.unwrap();
    let keys: Vec<&[u8]> = rows.kvs.iter().map(|(k, _)| &k[s.prefix.len()..]).collect();
    assert_eq!(keys, vec![&b"b"[..], b"bb", b"cc", b"e", b"fresh", b"n"]);
    assert_eq!(u64_of(t.get(&s.key("n")).await.unwrap()), 15);
}

/// Snapshot reads add no conflict; a transaction sees a consistent snapshot
/// taken at its first read (repeatable reads).
pub async fn snapshot_reads(s: &Suite) {
    s.put("x", b"old").await;
    s.put("s/1", b"1").await;
    let mut t = s.engine.begin().await.unwrap();
    assert_eq!(t.snapshot_get(&s.key("x")).await.unwrap().as_deref(), Some(&b"old"[..]));
    t.snapshot_get_range(&RangeRequest::prefix(&s.key("s/"))).await.unwrap();
    s.put("x", b"new").await;
    s.put("s/2", b"2").await;
    // Still the old snapshot.
    assert_eq!(t.snapshot_get(&s.key("x")).await.unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(t.get(&s.key("x")).await.unwrap().as_deref(), Some(&b"old"[..]), "repeatable read");
    t.clear(&s.key("x")).unwrap();
    // `get` above added a conflict on x, so this one must fail...
    assert_eq!(t.commit().await, Err(KvError::NotCommitted));

    // ...while snapshot-only readers commit.
    let mut t = s.engine.begin().await.unwrap();
    t.snapshot_get(&s.key("x")).await.unwrap();
    t.snapshot_get_range(&RangeRequest::prefix(&s.key("s/"))).await.unwrap();
    s.put("x", b"newer").await;
    s.put("s/3", b"3").await;
    t.set(&s.key("y"), b"1").unwrap();
    t.commit().await.expect("snapshot reads must add no conflict");
}

/// Atomic adds from concurrent transactions never conflict and all apply.
pub async fn atomic_add_no_conflict(s: &Suite) {
    let k = s.key("ctr");
    let mut t1 = s.engine.begin().await.unwrap();
    let mut t2 = s.engine.begin().await.unwrap();
    t1.get(&s.key("unrelated")).await.unwrap();
    t2.get(&s.key("unrelated")).await.unwrap();
    t1.atomic_add(&k, 3).unwrap();
    t2.atomic_add(&k, 4).unwrap();
    t1.commit().await.unwrap();
    t2.commit().await.expect("atomic adds must not conflict");
    assert_eq!(u64_of(s.read("ctr").await), 7);
}

/// Atomic max from concurrent transactions never conflicts; the largest wins,
/// and a transaction reads its own max folded into the snapshot's value.
pub async fn atomic_max_no_conflict(s: &Suite) {
    let k = s.key("hi");
    s.put("hi", &10u64.to_le_bytes()).await;
    let mut t1 = s.engine.begin().await.unwrap();
    let mut t2 = s.engine.begin().await.unwrap();
    t1.get(&s.key("unrelated")).await.unwrap();
    t2.get(&s.key("unrelated")).await.unwrap();
    t1.atomic_max(&k, 30).unwrap();
    t2.atomic_max(&k, 20).unwrap();
    t2.atomic_max(&k, 5).unwrap();
    assert_eq!(u64_of(t2.snapshot_get(&k).await.unwrap()), 20, "own max over the snapshot");
    t1.commit().await.unwrap();
    t2.commit().await.expect("atomic max must not conflict");
    assert_eq!(u64_of(s.read("hi").await), 30);
    let mut t3 = s.engine.begin().await.unwrap();
    t3.clear(&k).unwrap();
    t3.atomic_max(&k, 7).unwrap();
    t3.commit().await.unwrap();
    assert_eq!(u64_of(s.read("hi").await), 7, "max after a clear in the same transaction");
}

/// A range clear conflicts with a concurrent reader of a key inside it.
pub async fn clear_range_conflicts(s: &Suite) {
    s.put("q/5", b"v").await;
    let mut reader = s.engine.begin().await.unwrap();
    reader.get(&s.key("q/5")).await.unwrap();
    let mut clearer = s.engine.begin().await.unwrap();
    clearer.clear_range(&s.key("q/"), &s.key("q0")).unwrap();
    clearer.commit().await.unwrap();
    reader.set(&s.key("derived"), b"1").unwrap();
    assert_eq!(reader.commit().await, Err(KvError::NotCommitted));
    assert_eq!(s.read("q/5").await, None);
}

/// `run_transaction` retries conflicts until every increment lands.
pub async fn retry_loop(s: &Suite) {
    let tasks = 16;
    let per_task = 10;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let k = s.key("retry-ctr");
            for _ in 0..per_task {
                let k = k.clone();
                run_transaction(&*s.engine, &RetryOptions { max_attempts: 1000, ..Default::default() }, move |t| {
                    let k = k.clone();
                    Box::pin(async move {
                        let v = u64_of(t.get(&k).await?);
                        t.set(&k, &(v + 1).to_le_bytes())?;
                        Ok(())
                    })
                })
                .await
                .expect("retry loop gave up");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    assert_eq!(u64_of(s.read("retry-ctr").await), (tasks * per_task) as u64);
}

/// FoundationDB's size limits, exactly at and just past each one.
pub async fn size_limits(s: &Suite) {
    let mut t = s.engine.begin().await.unwrap();
    let mut max_key = s.prefix.clone();
    max_key.resize(limits::MAX_KEY_BYTES, b'k');
    t.set(&max_key, b"ok").expect("a key of exactly the limit is allowed");
    let long_key = vec![b'k'; limits::MAX_KEY_BYTES + 1];
    assert!(matches!(t.set(&long_key, b"v"), Err(KvError::KeyTooLarge { .. })));
    assert!(matches!(t.get(&long_key).await, Err(KvError::KeyTooLarge { .. })));
    t.set(&s.key("bigval"), &vec![0u8; limits::MAX_VALUE_BYTES]).expect("a value of exactly the limit");
    assert!(matches!(t.set(&s.key("v2"), &vec![0u8; limits::MAX_VALUE_BYTES + 1]), Err(KvError::ValueTooLarge { .. })));
    drop(t);
    let mut t = s.engine.begin().await.unwrap();
    let chunk = vec![7u8; 90_000];
    let mut too_large = None;
    for i in 0..200 {
        if let Err(e) = t.set(&s.key(&format!("big/{i:04}")), &chunk) {
            too_large = Some(e);
            break;
        }
    }
    assert!(matches!(too_large, Some(KvError::TransactionTooLarge { .. })), "got {too_large:?}");
    // A large transaction under the limit commits whole.
    let mut t = s.engine.begin().await.unwrap();
    for i in 0..100 {
        t.set(&s.key(&format!("big/{i:04}")), &chunk).unwrap();
    }
    t.commit().await.expect("a 9 MB transaction commits");
    let mut t = s.engine.begin().await.unwrap();
    let rows = t.get_range(&RangeRequest::prefix(&s.key("big/"))).await.unwrap();
    assert_eq!(rows.kvs.len(), 100);
    assert!(rows.kvs.iter().all(|(_, v)| v.len() == 90_000));
    let bad = t.get_range(&RangeRequest::new(s.key("b"), s.key("a"))).await;
    assert!(matches!(bad, Err(KvError::InvalidArgument(_))));
}

/// Many concurrent committers moving money between accounts: the total never
/// changes and no transfer is lost or applied twice.
pub async fn concurrent_committers(s: &Suite) {
    let accounts = 8u64;
    let mut t = s.engine.begin().await.unwrap();
    for a in 0..accounts {
        t.set(&s.key(&format!("acct/{a}")), &1000u64.to_le_bytes()).unwrap();
    }
    t.commit().await.unwrap();
    let tasks = 32u64;
    let transfers = 20u64;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..transfers {
                let from = s.key(&format!("acct/{}", (task + i) % accounts));
                let to = s.key(&format!("acct/{}", (task * 3 + i + 1) % accounts));
                let log = s.key(&format!("log/{task:03}/{i:03}"));
                run_transaction(&*s.engine, &RetryOptions { max_attempts: 10_000, ..Default::default() }, move |t| {
                    let (from, to, log) = (from.clone(), to.clone(), log.clone());
                    Box::pin(async move {
                        if from == to {
                            t.set(&log, b"noop")?;
                            return Ok(());
                        }
                        let a = u64_of(t.get(&from).await?);
                        let b = u64_of(t.get(&to).await?);
                        t.set(&from, &(a - 1).to_le_bytes())?;
                        t.set(&to, &(b + 1).to_le_bytes())?;
                        t.set(&log, b"done")?;
                        Ok(())
                    })
                })
                .await
                .expect("transfer");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    let mut t = s.engine.begin().await.unwrap();
    let rows = t.get_range(&RangeRequest::prefix(&s.key("acct/"))).await.unwrap();
    let total: u64 = rows.kvs.iter().map(|(_, v)| u64_of(Some(v.clone()))).sum();
    assert_eq!(total, accounts * 1000, "money created or destroyed");
    let logs = t.get_range(&RangeRequest::prefix(&s.key("log/"))).await.unwrap();
    assert_eq!(logs.kvs.len() as u64, tasks * transfers);
}

/// Every case, one after another.
pub async fn run_all(engine: Arc<dyn KvEngine>, prefix: &str) {
    let s = |name: &str| Suite::new(engine.clone(), &format!("{prefix}{name}/"));
    lost_update(&s("lost_update")).await;
    write_skew(&s("write_skew")).await;
    phantom_insert(&s("phantom")).await;
    limited_range_conflict(&s("limited_range")).await;
    read_your_writes(&s("ryw")).await;
    snapshot_reads(&s("snapshot")).await;
    atomic_add_no_conflict(&s("atomic")).await;
    atomic_max_no_conflict(&s("atomicmax")).await;
    clear_range_conflicts(&s("clear_range")).await;
    retry_loop(&s("retry")).await;
    size_limits(&s("limits")).await;
    concurrent_committers(&s("committers")).await;
}
