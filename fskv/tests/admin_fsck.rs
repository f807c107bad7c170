//! `fskv admin fsck` against a running `fskv up` after some file operations:
//! clean (exit 0, counts > 0) as JSON and as text, chunks scanned on every
//! chain; a chunk written for an inode meta does not know is an orphan
//! (exit 1); exit 2 when the meta server cannot be reached.

mod common;

use common::{free_base_port, fskv_ok as ok, start_up, stop_up};
use std::process::Output;

fn fskv(args: &[&str]) -> Output {
    common::fskv_cmd().args(args).env("FSKV_LOG", "warn").output().expect("run fskv")
}

#[test]
fn admin_fsck_is_clean_after_file_operations_on_up() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port();
    let up = start_up(&dir.path().join("data"), base);
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let meta = format!("127.0.0.1:{}", base + 12);

    // A chunked file, a small one, one replaced by a second put.
    let big: Vec<u8> = (0..(3 << 20) + 777u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let local_big = dir.path().join("big.bin");
    std::fs::write(&local_big, &big).unwrap();
    let local_small = dir.path().join("small.txt");
    std::fs::write(&local_small, b"hello fsck").unwrap();
    for (local, remote) in [(&local_big, "/big.bin"), (&local_small, "/small.txt"), (&local_small, "/big2.bin"), (&local_big, "/big2.bin")]
    {
        ok(&["put", "--mgmtd", &mgmtd, "--meta", &meta, local.to_str().unwrap(), remote]);
    }

    let out = ok(&["admin", "fsck", "--mgmtd", &mgmtd, "--meta", &meta, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fsck JSON");
    assert_eq!(v["clean"], true, "{v:#}");
    let r = &v["fsck"];
    assert_eq!(r["problems_total"], 0, "{v:#}");
    assert!(r["problems"].as_array().is_some_and(|p| p.is_empty()), "{v:#}");
    // root + three files (at least), and their three entries.
    assert!(r["inodes"].as_u64().is_some_and(|n| n >= 4), "{v:#}");
    assert!(r["entries"].as_u64().is_some_and(|n| n >= 3), "{v:#}");
    assert!(v["routing_version"].as_u64().is_some_and(|n| n > 0), "{v:#}");
    let st = &v["storage"];
    assert_eq!(st["problems_total"], 0, "{v:#}");
    assert!(st["chunks"].as_u64().is_some_and(|n| n >= 4), "two 3 MiB files have at least 4 chunks: {v:#}");
    assert!(st["chains_scanned"].as_u64().is_some_and(|n| n >= 1), "{v:#}");
    assert!(st["skipped_chains"].as_array().is_some_and(|c| c.is_empty()), "{v:#}");

    // Without --meta the check finds meta through mgmtd.
    let text = String::from_utf8(ok(&["admin", "fsck", "--mgmtd", &mgmtd]).stdout).unwrap();
    assert!(text.contains("problems 0") && text.trim_end().ends_with("clean"), "{text}");

    // A chunk of an inode meta never made: an orphan, exit 1.
    let orphan = write_orphan_chunk(&mgmtd);
    let out = fskv(&["admin", "fsck", "--mgmtd", &mgmtd, "--meta", &meta, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fsck JSON");
    assert_eq!((v["clean"].clone(), v["fsck"]["problems_total"].clone()), (serde_json::json!(false), serde_json::json!(0)), "{v:#}");
    let problems = v["storage"]["problems"].as_array().cloned().unwrap_or_default();
    assert!(
        problems.iter().any(|p| p["kind"] == "orphan_chunk" && p["inode"] == serde_json::json!(orphan)),
        "the orphan chunk of {orphan} is reported: {v:#}"
    );
    let meta_only = ok(&["admin", "fsck", "--mgmtd", &mgmtd, "--meta", &meta, "--meta-only"]);
    assert!(String::from_utf8_lossy(&meta_only.stdout).trim_end().ends_with("clean"));

    // No meta server there: the check cannot run → exit 2, with the reason.
    let dead = format!("127.0.0.1:{}", base + 19);
    let out = fskv(&["admin", "fsck", "--mgmtd", &mgmtd, "--meta", &dead]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fsck could not run"), "{}", String::from_utf8_lossy(&out.stderr));
    stop_up(up);
}

/// Writes one chunk of an inode id meta never allocated, straight to the
/// first chain through a storage client; returns the inode id.
fn write_orphan_chunk(mgmtd: &str) -> u64 {
    use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
    use fskv_client::storage::{StorageClient, StorageClientConfig};
    use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
    use fskv_types::{ChunkId, InodeId};
    use std::sync::Arc;
    use std::time::Duration;
    const ORPHAN: u64 = 0x0dea_dbee_f000;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        let m = MgmtdClient::new(rpc.clone(), vec![mgmtd.to_string()], MgmtdClientConfig::default());
        let source = MgmtdRoutingSource::start(m, Duration::from_secs(10)).await.expect("routing");
        let chain = source.current().chains.first().expect("a chain").chain_id;
        let client = StorageClient::new(rpc, source.handle(), StorageClientConfig::default());
        client.write(chain, ChunkId::new(InodeId(ORPHAN), 0), 0, bytes::Bytes::from_static(b"nobody owns me")).await.expect("write");
        source.stop();
    });
    ORPHAN
}
