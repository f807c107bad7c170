//! `fskv up` as the main job: a real cluster of child processes (mgmtd, three
//! storage services, meta), data written through meta + storage with the
//! native client, the whole cluster stopped with SIGTERM and started again on
//! the same data directory, and every byte read back.

use bytes::Bytes;
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use fskv_types::meta::chain_for_chunk;
use fskv_types::{ChunkId, InodeId};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_base_port() -> u16 {
    // A base whose P+11..P+15 are free right now (best effort).
    for _ in 0..50 {
        let p = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let base = p.saturating_sub(20).max(20_000);
        if base <= 60_000 && (11..=15).all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok()) {
            return base;
        }
    }
    panic!("no free port range");
}

/// Starts `fskv up` and waits for its "serving" line.
fn start_up(data: &Path, base: u16) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fskv"))
        .args(["up", "--heartbeat-timeout-ms", "3000", "--base-port", &base.to_string(), "--data"])
        .arg(data)
        .env("FSKV_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fskv up");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Keep reading to the end so `fskv up` never writes into a closed pipe.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) if line.contains("serving; Ctrl-C") => return child,
            Ok(line) => seen.push(line),
            Err(_) if Instant::now() < deadline => {}
            Err(_) => {
                let _ = child.kill();
                panic!("fskv up did not become ready: {seen:#?}");
            }
        }
    }
}

fn stop_up(mut child: Child) {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "fskv up exited with {status}");
            return;
        }
        assert!(Instant::now() < deadline, "fskv up did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    }
}

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
    let closed = c.meta.close(inode.id, session, None).await.expect("close");
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
    let access_key = endpoints["access_key"].as_str().unwrap().to_string();
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
