//! Linearizability of the KV gateway's single-key operations through `fskv
//! up` with real processes: clients run a random history of get / put /
//! compare-and-swap on a few keys (every written value unique, so a CAS on
//! the version read is a CAS on the value read), recording each operation's
//! invocation and response times; a Wing & Gong search (with memoization,
//! as Porcupine / Knossos do) then looks for a linearization per key (keys
//! are independent registers, so histories check per key). Once on a quiet
//! cluster, once with a storage node killed (-9) mid-run: an operation that
//! failed may or may not have taken effect, and the checker allows both.

mod common;

use common::{free_base_port, start_up};
use fskv_gateway_kv::client::{ClientError, KvClient, PutOptions};
use http::StatusCode;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A register's value: `None` = no key; values are unique ids.
type Val = Option<u64>;

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Get(Val),
    Put(u64),
    /// Compare-and-swap from `old` (None: create-only) to `new`; `ok` None = outcome unknown.
    Cas {
        old: Val,
        new: u64,
        ok: Option<bool>,
    },
}

#[derive(Clone, Debug)]
struct Op {
    call: u64,
    /// `u64::MAX`: no response (the operation may take effect at any time after `call`, or never).
    ret: u64,
    kind: Kind,
}

/// The register model: the next state if `op` may happen in `state`.
fn step(state: Val, kind: &Kind) -> Option<Val> {
    match kind {
        Kind::Get(v) => (*v == state).then_some(state),
        Kind::Put(v) => Some(Some(*v)),
        Kind::Cas { old, new, ok } => match ok {
            Some(true) => (state == *old).then_some(Some(*new)),
            Some(false) => (state != *old).then_some(state),
            None => Some(if state == *old { Some(*new) } else { state }),
        },
    }
}

/// Whether `ops` (one key, from the initial state `init`) is linearizable.
fn linearizable(ops: &[Op], init: Val) -> bool {
    let n = ops.len();
    let words = n.div_ceil(64);
    let mut seen: HashSet<(Vec<u64>, Val)> = HashSet::new();
    let completed = ops.iter().filter(|o| o.ret != u64::MAX).count();
    // Depth-first, explicit stack of (done set, state, completed count).
    let mut stack = vec![(vec![0u64; words], init, 0usize)];
    let mut budget: u64 = 20_000_000;
    while let Some((done, state, ndone)) = stack.pop() {
        if ndone == completed {
            return true;
        }
        budget -= 1;
        assert!(budget > 0, "linearizability search exceeded its budget");
        let is_done = |i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        // An operation can go next only if it was invoked before every pending completed one returned.
        let min_ret = (0..n).filter(|i| !is_done(*i)).map(|i| ops[i].ret).min().unwrap_or(u64::MAX);
        for i in 0..n {
            if is_done(i) || ops[i].call > min_ret {
                continue;
            }
            if let Some(next) = step(state, &ops[i].kind) {
                let mut d = done.clone();
                d[i / 64] |= 1 << (i % 64);
                if seen.insert((d.clone(), next)) {
                    stack.push((d, next, ndone + usize::from(ops[i].ret != u64::MAX)));
                }
            }
        }
    }
    false
}

#[test]
fn the_checker_accepts_and_refuses_known_histories() {
    let op = |call, ret, kind| Op { call, ret, kind };
    // put 1, then a get sees 1: fine; a later get seeing nothing: not.
    let ok = [op(0, 10, Kind::Put(1)), op(20, 30, Kind::Get(Some(1)))];
    assert!(linearizable(&ok, None));
    let bad = [op(0, 10, Kind::Put(1)), op(20, 30, Kind::Get(None))];
    assert!(!linearizable(&bad, None));
    // Overlapping: the get may see either.
    let overlap = [op(0, 10, Kind::Put(1)), op(5, 8, Kind::Get(None))];
    assert!(linearizable(&overlap, None));
    // Two CAS from the same old value both succeeding: a lost update.
    let lost = [
        op(0, 10, Kind::Cas { old: None, new: 1, ok: Some(true) }),
        op(20, 40, Kind::Cas { old: Some(1), new: 2, ok: Some(true) }),
        op(21, 41, Kind::Cas { old: Some(1), new: 3, ok: Some(true) }),
    ];
    assert!(!linearizable(&lost, None));
    // A put without a response may have happened...
    let maybe = [op(0, u64::MAX, Kind::Put(7)), op(20, 30, Kind::Get(Some(7)))];
    assert!(linearizable(&maybe, None));
    // ...or not.
    let maybe_not = [op(0, u64::MAX, Kind::Put(7)), op(20, 30, Kind::Get(None))];
    assert!(linearizable(&maybe_not, None));
    // A stale read after a newer read is not linearizable.
    let stale = [op(0, 5, Kind::Put(1)), op(6, 9, Kind::Put(2)), op(10, 12, Kind::Get(Some(2))), op(13, 15, Kind::Get(Some(1)))];
    assert!(!linearizable(&stale, None));
}

const KEYS: usize = 3;
/// Values are larger than the 4 KiB kept inline in the inode, so every
/// write goes through the storage chains (and the killed node matters).
const VALUE_BYTES: usize = 8192;

fn value_of(id: u64) -> Vec<u8> {
    let mut v = format!("{id}:").into_bytes();
    v.resize(VALUE_BYTES, b'x');
    v
}

fn id_of(b: &[u8]) -> u64 {
    let end = b.iter().position(|c| *c == b':').expect("a value of this test");
    assert_eq!(b.len(), VALUE_BYTES, "a whole value");
    std::str::from_utf8(&b[..end]).unwrap().parse().unwrap()
}
const OPS_PER_CLIENT: usize = 150;
/// When the storage node is killed, after the history starts.
const KILL_AFTER_MS: u64 = 300;

async fn worker(c: KvClient, id: u64, ops: usize, start: Instant, seed: u64) -> Vec<(usize, Op)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let now = || start.elapsed().as_nanos() as u64;
    let mut out = Vec::new();
    let mut seq = 0u64;
    for _ in 0..ops {
        let k = rng.gen_range(0..KEYS);
        let key = format!("reg-{k}");
        let r: u32 = rng.gen_range(0..3);
        seq += 1;
        let fresh = id * 1_000_000 + seq;
        let call = now();
        match r {
            0 => {
                // A failed read has no effect: not recorded.
                if let Ok(v) = c.get_with("lin", key.as_bytes(), &[]).await {
                    let val = v.map(|v| id_of(&v.bytes));
                    out.push((k, Op { call, ret: now(), kind: Kind::Get(val) }));
                }
            }
            1 => {
                let res = c.put("lin", key.as_bytes(), value_of(fresh), &PutOptions::default()).await;
                let ret = if res.is_ok() { now() } else { u64::MAX };
                out.push((k, Op { call, ret, kind: Kind::Put(fresh) }));
            }
            _ => {
                // Read, then swap from what was read (its version).
                let Ok(cur) = c.get("lin", key.as_bytes()).await else { continue };
                let ret_get = now();
                let old = cur.as_ref().map(|v| id_of(&v.bytes));
                out.push((k, Op { call, ret: ret_get, kind: Kind::Get(old) }));
                let opts = match &cur {
                    Some(v) => PutOptions { if_match: Some(v.version), ..Default::default() },
                    None => PutOptions { if_absent: true, ..Default::default() },
                };
                let call = now();
                let res = c.put("lin", key.as_bytes(), value_of(fresh), &opts).await;
                let (ok, ret) = match res {
                    Ok(_) => (Some(true), now()),
                    Err(ClientError::Status { status: StatusCode::PRECONDITION_FAILED, .. }) => (Some(false), now()),
                    Err(_) => (None, u64::MAX),
                };
                out.push((k, Op { call, ret, kind: Kind::Cas { old, new: fresh, ok } }));
            }
        }
    }
    out
}

fn run_history(kill_storage: bool) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = common::UpGuard { child: Some(start_up(&data, base)), mount: None };
    let text = std::fs::read_to_string(data.join("endpoints.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let token = v["bearer_token"].as_str().unwrap().to_string();
    let url = v["kv"].as_str().unwrap().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (histories, failed) = rt.block_on(async {
        let c = KvClient::new(&url, Some(token)).with_timeout_ms(20_000);
        c.put_namespace("lin", &serde_json::json!({})).await.unwrap();
        let start = Instant::now();
        let data = Arc::new(data.clone());
        let killer = tokio::spawn(async move {
            if !kill_storage {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(KILL_AFTER_MS)).await;
            let pid = common::child_pid(&data, "storage-2").expect("storage-2's pid file");
            kill9(pid)
        });
        let mut tasks = Vec::new();
        for id in 1..=4u64 {
            tasks.push(tokio::spawn(worker(c.clone(), id, OPS_PER_CLIENT, start, 0x5eed + id + u64::from(kill_storage) * 100)));
        }
        let mut per_key: Vec<Vec<Op>> = vec![Vec::new(); KEYS];
        let mut failed = 0;
        for t in tasks {
            for (k, op) in t.await.unwrap() {
                failed += usize::from(op.ret == u64::MAX);
                per_key[k].push(op);
            }
        }
        assert!(!kill_storage || killer.await.unwrap(), "the storage node was not killed");
        let last = per_key.iter().flatten().filter(|o| o.ret != u64::MAX).map(|o| o.ret).max().unwrap_or(0);
        assert!(!kill_storage || last > KILL_AFTER_MS * 1_000_000, "the history ended before the kill: lengthen it");
        println!("history ran {} ms", last / 1_000_000);
        (per_key, failed)
    });
    drop(rt);
    let total: usize = histories.iter().map(Vec::len).sum();
    for (k, ops) in histories.iter().enumerate() {
        let t = Instant::now();
        assert!(linearizable(ops, None), "key reg-{k}: the history of {} operations is not linearizable: {ops:#?}", ops.len());
        println!("reg-{k}: {} operations linearizable (checked in {:?})", ops.len(), t.elapsed());
    }
    println!("{total} operations, {failed} without a response (kill_storage = {kill_storage})");
    up.stop();
}

/// kill -9 through the `kill` command (no libc dependency in the tests).
fn kill9(pid: i32) -> bool {
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().map(|s| s.success()).unwrap_or(false)
}

/// Quiet first, then with a storage node killed (one cluster at a time).
#[test]
fn random_histories_are_linearizable() {
    run_history(false);
    run_history(true);
}
