//! Bit rot under a real `fskv up` (two tests, each on its own cluster).
//!
//! Repair on read: one byte of a committed chunk is flipped
//! in the block file of every target of storage node 2 (the test-only
//! `storage.InjectBitRot` RPC; checksums untouched). Reading the file back
//! many times never returns a wrong byte: a read that meets the damaged
//! copy fails its page CRC there, is served from another replica, and the
//! damaged chunk is rewritten from that replica, which `fskv admin status`
//! counts per target ("repaired"; "corrupt found" counts the scrubber's
//! finds only). Prints the time from the injection to every damaged chunk
//! repaired.
//!
//! The scrubber: the same damage on a cluster whose scrubber pauses 300 ms
//! between passes (`fskv up --scrub-pause-between-passes-ms`), and nobody
//! reads: each damaged target's scrubber finds its chunk ("corrupt found")
//! and rewrites it from a replica ("repaired"); then every read is exact.
//! Prints the time from the injection to every damaged chunk repaired.

mod common;

use bytes::Bytes;
use common::{free_base_port, fskv_ok, random_file, stop_up, wait_cluster_healthy};
use fskv_proto::storage::{InjectBitRot, InjectBitRotReq};
use fskv_rpc::{CallOptions, ClientConfig, ErrorCode, RpcClient, TcpTransport};
use fskv_types::TargetId;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bound on every damaged chunk being repaired by reads (the file is read
/// again and again until then).
const REPAIR_BOUND: Duration = Duration::from_secs(60);

/// target → (corrupt found by the scrubber, repaired), from `fskv admin status --json`.
fn scrub_counts(mgmtd: &str) -> Vec<(u64, u64, u64)> {
    let out = fskv_ok(&["admin", "status", "--mgmtd", mgmtd, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let mut counts = Vec::new();
    for node in v["space"].as_array().into_iter().flatten() {
        for t in node["targets"].as_array().into_iter().flatten() {
            let (Some(target), Some(found), Some(repaired)) =
                (t["target"].as_u64(), t["scrub"]["corrupt_found"].as_u64(), t["scrub"]["repaired"].as_u64())
            else {
                panic!("unexpected target entry in the status: {t}");
            };
            counts.push((target, found, repaired));
        }
    }
    counts
}

#[test]
fn bit_rot_on_one_replica_is_never_read_and_is_repaired() {
    let Some(Damaged { dir, up, mgmtd, a, damaged }) = damage_a_file("bit_rot_on_one_replica_is_never_read_and_is_repaired", &[]) else {
        return;
    };
    let injected_at = Instant::now();

    // Reads spread over the replicas: every one is exact, and each damaged
    // chunk is repaired by the first read that meets it.
    let back = dir.path().join("a.back");
    let mut reads = 0;
    let repaired_after = loop {
        let _ = std::fs::remove_file(&back);
        fskv_ok(&["get", "--mgmtd", &mgmtd, "/a.bin", back.to_str().unwrap()]);
        reads += 1;
        assert!(std::fs::read(&back).unwrap() == a, "read {reads} returned wrong bytes after bit rot on node 2");
        let counts = scrub_counts(&mgmtd);
        let repaired = |t: TargetId| counts.iter().any(|(target, _, repaired)| *target == t.0 && *repaired >= 1);
        if damaged.iter().all(|t| repaired(*t)) {
            break injected_at.elapsed();
        }
        assert!(
            injected_at.elapsed() < REPAIR_BOUND,
            "after {reads} reads in {REPAIR_BOUND:?}, not every damaged chunk was repaired: {counts:?}"
        );
    };
    // Repaired for good: more reads stay exact and nothing new is found.
    let before = scrub_counts(&mgmtd);
    for _ in 0..3 {
        let _ = std::fs::remove_file(&back);
        fskv_ok(&["get", "--mgmtd", &mgmtd, "/a.bin", back.to_str().unwrap()]);
        assert!(std::fs::read(&back).unwrap() == a, "a read after the repair returned wrong bytes");
    }
    let after = scrub_counts(&mgmtd);
    assert_eq!(before, after, "checksum failures after the repair");
    println!(
        "MEASURE bit_rot_damaged_targets={} bit_rot_reads_to_repair={reads} bit_rot_repaired_ms={}",
        damaged.len(),
        repaired_after.as_millis()
    );
    stop_up(up);
}

/// A running `fskv up` holding a 6 MiB file `/a.bin` (its bytes: `a`),
/// with one byte flipped in a chunk of it on each target of node 2 that
/// holds one (`damaged`).
struct Damaged {
    dir: tempfile::TempDir,
    up: std::process::Child,
    mgmtd: String,
    a: Vec<u8>,
    damaged: Vec<TargetId>,
}

/// Starts `fskv up` (with `up_args`), writes the file and damages it.
/// `None` (the cluster stopped, the test reported skipped) when the binary
/// has no `InjectBitRot` (built without the storage crate's
/// `fault-injection` feature).
fn damage_a_file(test: &str, up_args: &[&str]) -> Option<Damaged> {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = common::start_up_with(&data, base, up_args);
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let meta = format!("127.0.0.1:{}", base + 12);
    let node2 = format!("127.0.0.1:{}", base + 14);
    wait_cluster_healthy(&mgmtd, Duration::from_secs(60));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());

    let local = dir.path().join("a");
    let a = random_file(&local, 6 << 20, 7);
    fskv_ok(&["put", "--mgmtd", &mgmtd, "--meta", &meta, local.to_str().unwrap(), "/a.bin"]);

    let mut damaged: Vec<TargetId> = Vec::new();
    let node2_targets: Vec<TargetId> = scrub_counts(&mgmtd).iter().map(|c| TargetId(c.0)).filter(|t| t.0 / 100 == 2).collect();
    assert!(!node2_targets.is_empty(), "no target of node 2 in the status");
    for t in node2_targets {
        let req = InjectBitRotReq { target: t, chunk: None, offset_bytes: 12_345 };
        match rt.block_on(rpc.call::<InjectBitRot>(&node2, &req, Bytes::new(), CallOptions { timeout_ms: 5_000 })) {
            Ok((resp, _)) => {
                println!("flipped byte {} of {} on {t}", resp.offset_bytes, resp.chunk);
                damaged.push(t);
            }
            Err(e) if e.code() == ErrorCode::UnknownMethod => {
                stop_up(up);
                common::skip(
                    test,
                    &format!("this fskv binary has no InjectBitRot (built without the storage crate's fault-injection feature): {e}"),
                );
                return None;
            }
            // This target holds no chunk of the file.
            Err(e) if e.code() == ErrorCode::NotFound => {}
            Err(e) => panic!("InjectBitRot on {t}: {e}"),
        }
    }
    assert!(!damaged.is_empty(), "no target of node 2 holds a chunk of a 6 MiB file");
    Some(Damaged { dir, up, mgmtd, a, damaged })
}

#[test]
fn the_scrubber_repairs_bit_rot_that_nobody_reads() {
    let up_args = ["--scrub-pause-between-passes-ms", "300", "--scrub-mib-per-sec", "64"];
    let Some(Damaged { dir, up, mgmtd, a, damaged }) = damage_a_file("the_scrubber_repairs_bit_rot_that_nobody_reads", &up_args) else {
        return;
    };
    let injected_at = Instant::now();

    // No reads: the scrubber alone finds and repairs every damaged chunk.
    let repaired_after = loop {
        let counts = scrub_counts(&mgmtd);
        let done = |t: TargetId| counts.iter().any(|(target, found, repaired)| *target == t.0 && *found >= 1 && *repaired >= 1);
        if damaged.iter().all(|t| done(*t)) {
            break injected_at.elapsed();
        }
        assert!(
            injected_at.elapsed() < REPAIR_BOUND,
            "in {REPAIR_BOUND:?} the scrubber did not find and repair every damaged chunk of {damaged:?}: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Nothing was found where nothing was damaged.
    for (target, found, _) in scrub_counts(&mgmtd) {
        if !damaged.contains(&TargetId(target)) {
            assert_eq!(found, 0, "the scrubber found corruption on undamaged target {target}");
        }
    }
    let back = dir.path().join("a.back");
    for _ in 0..3 {
        let _ = std::fs::remove_file(&back);
        fskv_ok(&["get", "--mgmtd", &mgmtd, "/a.bin", back.to_str().unwrap()]);
        assert!(std::fs::read(&back).unwrap() == a, "a read after the scrubber's repair returned wrong bytes");
    }
    println!("MEASURE scrub_damaged_targets={} scrub_repaired_ms={}", damaged.len(), repaired_after.as_millis());
    stop_up(up);
}
