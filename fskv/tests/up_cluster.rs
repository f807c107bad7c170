//! `fskv up` as the main job: a real cluster of child processes (mgmtd, three
//! storage services, meta), data written through meta + storage with the
//! native client, the whole cluster stopped with SIGTERM and started again on
//! the same data directory, and every byte read back.

mod common;

use bytes::Bytes;
use common::{free_base_port, start_up, start_up_with, stop_up};
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_client::{CloseEnd, MetaClient, MetaClientConfig};
use fskv_proto::meta::chain_for_chunk;
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use fskv_types::{ChunkId, InodeId};
use std::sync::Arc;
use std::time::Duration;

fn pattern(file: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 31 + file * 7) as u8).collect()
}

struct Clients {
    meta: MetaClient,
    storage: StorageClient,
    source: Arc<MgmtdRoutingSource>,
}

async fn clients(base: u16) -> Clients {
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
    let mgmtd = MgmtdClient::new(rpc.clone(), vec![format!("127.0.0.1:{}", base + 11)], MgmtdClientConfig::default());
    let source = MgmtdRoutingSource::start(mgmtd, Duration::from_secs(30)).await.expect("routing from mgmtd");
    let storage = StorageClient::new(rpc, source.handle(), StorageClientConfig { max_attempts: 40, ..Default::default() });
    let meta = MetaClient::new(MetaClientConfig::new(vec![format!("127.0.0.1:{}", base + 12)])).expect("meta client");
    Clients { meta, storage, source }
}

/// Writes `len` bytes as chunks of the file's layout; returns the inode.
async fn write_file(c: &Clients, name: &str, seed: u64, len: usize) -> InodeId {
    let (inode, session) = c.meta.create_for_write(InodeId::ROOT, name, 0o644, true).await.expect("create");
    let layout = inode.file().expect("a file").layout.clone();
    let chunk = layout.chunk_size_bytes as usize;
    let data = pattern(seed, len);
    for (index, piece) in data.chunks(chunk).enumerate() {
        let chain = chain_for_chunk(&layout, index as u64).expect("layout has chains");
        c.storage.write(chain, ChunkId::new(inode.id, index as u64), 0, Bytes::copy_from_slice(piece)).await.expect("write chunk");
    }
    // Written, not settled: meta measures the length on storage.
    let end = CloseEnd { wrote: true, ..Default::default() };
    let closed = c.meta.close(inode.id, session, end).await.expect("close");
    assert_eq!(closed.size_bytes(), len as u64, "{name}: exact length computed by meta from the storage service");
    inode.id
}

async fn read_file(c: &Clients, name: &str) -> Vec<u8> {
    let inode = c.meta.lookup(InodeId::ROOT, name).await.expect("lookup");
    let layout = inode.file().expect("a file").layout.clone();
    let len = inode.size_bytes() as usize;
    let chunk = layout.chunk_size_bytes as usize;
    let mut out = Vec::with_capacity(len);
    for index in 0..len.div_ceil(chunk) {
        let chain = chain_for_chunk(&layout, index as u64).unwrap();
        let want = (len - index * chunk).min(chunk) as u32;
        let got = c.storage.read(chain, ChunkId::new(inode.id, index as u64), 0, want, false).await.expect("read chunk");
        out.extend_from_slice(&got.data);
    }
    out
}

#[test]
fn up_serves_data_and_keeps_it_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let files: Vec<(String, u64, usize)> =
        vec![("empty".into(), 1, 0), ("small".into(), 2, 1000), ("three-chunks".into(), 3, 3 * (512 << 10) + 17)];

    let up = start_up(&data, base);
    for name in ["mgmtd", "meta", "storage-1", "storage-2", "storage-3"] {
        assert!(data.join("pids").join(format!("{name}.pid")).exists(), "no pid file for {name}");
    }
    let endpoints: serde_json::Value = serde_json::from_slice(&std::fs::read(data.join("endpoints.json")).unwrap()).unwrap();
    assert_eq!(endpoints["mgmtd"], format!("127.0.0.1:{}", base + 11));
    assert_eq!(endpoints["mq"], format!("http://127.0.0.1:{}", base + 2));
    assert_eq!(endpoints["mq_reader"], format!("http://127.0.0.1:{}", base + 7));
    assert_eq!(endpoints["sqs"], endpoints["mq"]);
    // Every gateway runs behind the front (started on demand by its pools), none as a child of `fskv up`.
    assert!(data.join("pids").join("front.pid").exists(), "no pid file for the front");
    for name in ["mq-writer", "mq-reader", "kv-writer", "kv-reader"] {
        assert!(!data.join("pids").join(format!("{name}.pid")).exists(), "{name} runs outside the front");
    }
    // Every child runs with the configuration of `fskv up` (DIR/effective-config.toml).
    let effective = std::fs::read_to_string(data.join("effective-config.toml")).expect("effective config");
    assert!(effective.contains("[rpc]") && effective.contains("max_frame_bytes"), "{effective}");
    let meta_pid = std::fs::read_to_string(data.join("pids/meta.pid")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", meta_pid.trim())).unwrap_or_default();
    assert!(String::from_utf8_lossy(&cmdline).contains("effective-config.toml"), "meta runs without --config: {cmdline:?}");
    let access_key = endpoints["access_key"].as_str().unwrap().to_string();
    second_owners_are_refused(&data, up.id());
    rt.block_on(async {
        let c = clients(base).await;
        for (name, seed, len) in &files {
            write_file(&c, name, *seed, *len).await;
        }
        for (name, seed, len) in &files {
            assert_eq!(read_file(&c, name).await, pattern(*seed, *len), "{name} before restart");
        }
        c.source.stop();
    });
    stop_up(up);
    assert!(!data.join("pids").join("meta.pid").exists(), "pid files left after a clean stop");

    let up = start_up(&data, base);
    let endpoints: serde_json::Value = serde_json::from_slice(&std::fs::read(data.join("endpoints.json")).unwrap()).unwrap();
    assert_eq!(endpoints["access_key"].as_str().unwrap(), access_key, "credentials are kept across restarts");
    rt.block_on(async {
        let c = clients(base).await;
        for (name, seed, len) in &files {
            assert_eq!(read_file(&c, name).await, pattern(*seed, *len), "{name} after restart");
        }
        c.source.stop();
    });
    stop_up(up);
}

/// `fskv up --no-sync-writes`: every storage process runs without
/// fdatasync and meta and mgmtd open their KV engine without WAL sync (each
/// says so in its log), and data written is read back.
#[test]
fn up_without_synced_writes_says_so_and_serves_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = start_up_with(&data, base, &["--no-sync-writes"]);
    let effective = std::fs::read_to_string(data.join("effective-config.toml")).expect("effective config");
    assert!(effective.contains("sync_writes = false"), "{effective}");
    rt.block_on(async {
        let c = clients(base).await;
        write_file(&c, "unsynced", 9, 700_000).await;
        assert_eq!(read_file(&c, "unsynced").await, pattern(9, 700_000));
        c.source.stop();
    });
    stop_up(up);
    let log = |name: &str| std::fs::read_to_string(data.join("logs").join(format!("{name}.log"))).unwrap_or_default();
    for n in 1..=3 {
        assert!(
            log(&format!("storage-{n}")).contains("acknowledged without fdatasync"),
            "storage-{n} log:\n{}",
            log(&format!("storage-{n}"))
        );
    }
    for name in ["meta", "mgmtd"] {
        assert!(log(name).contains("without WAL sync"), "{name} log:\n{}", log(name));
    }
}

/// One owner per data directory: a second `fskv up` on a directory in use
/// (other ports, so only the directory conflicts) and a second mgmtd on
/// the running mgmtd's directory refuse at once, naming the owner, and
/// leave the running cluster's pid files and logs alone.
fn second_owners_are_refused(data: &std::path::Path, up_pid: u32) {
    let pid_files = |dir: &std::path::Path| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = std::fs::read_dir(dir.join("pids"))
            .expect("pids dir")
            .map(|e| {
                let e = e.expect("dir entry");
                (e.file_name().to_string_lossy().into_owned(), std::fs::read_to_string(e.path()).unwrap_or_default())
            })
            .collect();
        v.sort();
        v
    };
    let before = pid_files(data);
    let log_len = std::fs::metadata(data.join("logs/mgmtd.log")).map(|m| m.len()).unwrap_or(0);
    let exe = env!("CARGO_BIN_EXE_fskv");
    let other_base = free_base_port().to_string();
    let mgmtd_dir = data.join("mgmtd").display().to_string();
    let up_args = ["up", "--base-port", &other_base, "--data", data.to_str().unwrap()];
    let mgmtd_args = ["mgmtd", "--insecure-no-auth", "--data", &mgmtd_dir, "--nodes", "3", "--targets-per-node", "4", "--replicas", "3"];
    for (args, owner) in [(&up_args[..], format!("fskv up (pid {up_pid})")), (&mgmtd_args[..], "mgmtd (pid ".to_string())] {
        let mut child = std::process::Command::new(exe)
            .args(args)
            .env("FSKV_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run fskv");
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{args:?} still running 10 s after it was started on a directory in use");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("read stderr");
        assert!(!status.success(), "{args:?} exited 0 on a directory in use: {stderr}");
        assert!(stderr.contains("is in use by") && stderr.contains(&owner), "{args:?}: {stderr}");
    }
    assert_eq!(pid_files(data), before, "pid files changed by the refused starts");
    let log_len_after = std::fs::metadata(data.join("logs/mgmtd.log")).map(|m| m.len()).unwrap_or(0);
    assert!(log_len_after >= log_len, "mgmtd log truncated");
}
