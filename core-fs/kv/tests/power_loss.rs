//! Power loss under the embedded engine: RocksDB runs on `fskv-powerfs`, a
//! FUSE filesystem that models a machine losing power (every write since a
//! file's last fsync may be lost or torn; directory entries are durable only
//! once their directory is fsynced — the table in `testing/powerfs`). While
//! 4 tasks commit transactions of 6 keys each (two of them synced, two
//! `Durability::Relaxed`), the test takes power cuts at random instants,
//! reopens RocksDB on each cut's image and checks (memtables of 256 KiB, so
//! flushes to SST files, compactions and MANIFEST updates happen during
//! the writing; every other cut has only relaxed writers and no periodic
//! WAL sync, so unsynced commits are really lost):
//!
//! | check | why |
//! |---|---|
//! | the database opens | recovery copes with a torn WAL tail and lost files |
//! | every synced commit acknowledged before the cut is there | an acknowledged commit is durable (WAL fsync before the ack) |
//! | every transaction is all or nothing | one `WriteBatch` per commit group, checksummed in the WAL |
//! | relaxed commits: all or nothing, may be lost | written to the WAL without fsync |
//!
//! Needs `/dev/fuse` and root (mount); otherwise reported skipped (or a
//! failure under `FSKV_REQUIRE_FUSE=1`, as CI sets).

use fskv_kv::{Durability, KvEngine, RangeRequest, RocksEngine, RocksOptions};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEYS_PER_TXN: usize = 6;
/// Power cuts per run, each at a random instant of one writing session.
const CUTS: u64 = 6;

fn skip(test: &str, reason: &str) {
    assert!(std::env::var("FSKV_REQUIRE_FUSE").map_or(true, |v| v != "1"), "{test}: {reason}, and FSKV_REQUIRE_FUSE=1");
    println!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("FSKV_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{test}: {reason}");
        }
    }
}

/// A transaction's value for each of its keys: its number, padded to 64
/// bytes so the memtables fill and flush during the test.
fn value(n: u64) -> Vec<u8> {
    let mut v = n.to_le_bytes().to_vec();
    v.resize(64, (n % 251) as u8);
    v
}

/// Commits acknowledged so far: (transaction number, synced?).
type Acks = Arc<Mutex<Vec<(u64, bool)>>>;

#[test]
fn synced_commits_survive_power_cuts_and_every_transaction_is_all_or_nothing() {
    let test = "synced_commits_survive_power_cuts_and_every_transaction_is_all_or_nothing";
    if !std::path::Path::new("/dev/fuse").exists() {
        return skip(test, "no /dev/fuse");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip(test, "mounting the power-loss filesystem needs root");
    }
    let seed: u64 = std::env::var("FSKV_POWER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (mut synced_checked, mut relaxed_kept, mut relaxed_lost, mut torn, mut lost) = (0, 0, 0, 0, 0);
    for cut in 0..CUTS {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mountpoint");
        let fs = fskv_powerfs::mount(&mnt).expect("mount the power-loss filesystem");
        let db = mnt.join("db");
        std::fs::create_dir(&db).expect("db dir");
        // The database directory's own entry is durable from the start.
        std::fs::File::open(&mnt).and_then(|d| d.sync_all()).expect("fsync the mount's root");
        // Odd cuts: relaxed writers only, WAL synced by nothing but flushes.
        let all_relaxed = cut % 2 == 1;
        let opts = RocksOptions {
            write_buffer_bytes: 256 << 10,
            relaxed_sync_interval_ms: if all_relaxed { 0 } else { 100 },
            ..RocksOptions::default()
        };
        let engine = RocksEngine::open(&db, opts.clone()).expect("open RocksDB on the power-loss filesystem");
        let acks: Acks = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4u64)
            .map(|task| {
                let (engine, acks, stop) = (engine.clone(), acks.clone(), stop.clone());
                rt.spawn(async move {
                    let synced = task % 2 == 0 && !all_relaxed;
                    // Bounded: the test stops the writers after the cut.
                    for i in 0..100_000u64 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let n = i * 4 + task;
                        let mut t = engine.begin().await.expect("begin");
                        if !synced {
                            t.set_durability(Durability::Relaxed);
                        }
                        for k in 0..KEYS_PER_TXN {
                            t.set(format!("txn/{n:012}/{k}").as_bytes(), &value(n)).expect("set");
                        }
                        if t.commit().await.is_ok() {
                            acks.lock().expect("acks").push((n, synced));
                        }
                    }
                })
            })
            .collect();
        // The cut: at a random instant of the writing (RocksDB keeps running
        // and never learns of it; the image is what a disk would hold).
        std::thread::sleep(Duration::from_millis(rng.gen_range(300..1500)));
        let acked: Vec<(u64, bool)> = acks.lock().expect("acks").clone();
        let image = tmp.path().join("image");
        let report = fs.power_cut(rng.gen(), &image).expect("power cut");
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            rt.block_on(w).expect("writer");
        }
        drop(engine);
        fs.unmount().expect("unmount");
        torn += report.changes_torn;
        lost += report.changes_lost;

        // The machine comes back: RocksDB opens the image.
        let reopened = RocksEngine::open(image.join("db"), opts)
            .unwrap_or_else(|e| panic!("cut {cut}: RocksDB does not open after the power cut ({report:?}): {e}"));
        let rows = rt.block_on(async {
            let mut t = reopened.begin().await.expect("begin");
            t.get_range(&RangeRequest::prefix(b"txn/")).await.expect("scan").kvs
        });
        let mut per_txn: BTreeMap<u64, usize> = BTreeMap::new();
        for (k, v) in &rows {
            let key = std::str::from_utf8(k).expect("utf-8 key");
            let n: u64 = key.split('/').nth(1).and_then(|n| n.parse().ok()).expect("txn number");
            assert_eq!(&v[..], &value(n)[..], "cut {cut}: value of {key}");
            *per_txn.entry(n).or_default() += 1;
        }
        for (n, count) in &per_txn {
            assert_eq!(*count, KEYS_PER_TXN, "cut {cut}: transaction {n} is partly visible after the power cut ({report:?})");
        }
        let present: BTreeSet<u64> = per_txn.keys().copied().collect();
        for (n, synced) in &acked {
            if *synced {
                assert!(present.contains(n), "cut {cut}: synced transaction {n}, acknowledged before the cut, is lost ({report:?})");
                synced_checked += 1;
            } else if present.contains(n) {
                relaxed_kept += 1;
            } else {
                relaxed_lost += 1;
            }
        }
        let want_synced = if all_relaxed { 0 } else { 5 };
        assert!(
            acked.iter().filter(|(_, s)| *s).count() >= want_synced,
            "cut {cut}: too few synced commits before the cut: {}",
            acked.len()
        );
        let files = std::fs::read_dir(image.join("db")).map(|d| d.count()).unwrap_or(0);
        eprintln!(
            "cut {cut} ({}): {} acknowledged before the cut, {} transactions after reopen, {files} files in the image; {report:?}",
            if all_relaxed { "relaxed only" } else { "synced + relaxed" },
            acked.len(),
            present.len()
        );
    }
    eprintln!(
        "power loss (seed {seed}, {CUTS} cuts): {synced_checked} acknowledged synced commits all present; relaxed: {relaxed_kept} kept, \
         {relaxed_lost} lost, none partial; {lost} unsynced writes lost and {torn} torn by the cuts"
    );
}
