//! Real processes: `fskv mgmtd` + 3 `fskv storage --mgmtd` + a writer
//! streaming through a `StorageClient` fed by mgmtd's routing.
//!
//! * kill -9 of a storage node under load: it is marked offline within T
//!   (+ one tick), moved to the chain end, writes continue; restarted, it
//!   syncs and serves again; every acknowledged write reads back and the
//!   replicas are identical.
//! * a storage node whose mgmtd is unreachable exits after T/2.
//! * a storage node paused (SIGSTOP) longer than T exits when resumed.

mod common;

use bytes::Bytes;
use common::acked::{check_acked, pattern, Written, REGION_BYTES};
use common::free_port;
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_proto::mgmtd::MgmtdStatusResp;
use fskv_proto::routing::PublicTargetState;
use fskv_proto::storage::DumpChunkMeta;
use fskv_proto::storage::DumpChunkMetaReq;
use fskv_rpc::{CallOptions, ClientConfig, RpcClient, TcpTransport};
use fskv_types::{ChainId, ChunkId, InodeId, NodeId, TargetId};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHAIN: ChainId = ChainId(1);
const T_MS: u64 = 3_000;
const TICK_MS: u64 = 200;
const WRITERS: u64 = 4;
const REGIONS_PER_CHUNK: u64 = 64;

struct Procs {
    children: BTreeMap<String, Child>,
    dir: PathBuf,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.children.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Procs {
    fn new(dir: &Path) -> Self {
        Procs { children: BTreeMap::new(), dir: dir.to_path_buf() }
    }

    fn spawn(&mut self, name: &str, args: &[String]) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{name}.log"))).unwrap();
        // The test's in-process clients hold no key: services without authentication.
        let child = Command::new(env!("CARGO_BIN_EXE_fskv"))
            .arg("--insecure-no-auth")
            .args(args)
            .env("FSKV_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fskv");
        self.children.insert(name.to_string(), child);
    }

    fn mgmtd(&mut self, port: u16, nodes: u32, replicas: u32) {
        let data = self.dir.join("mgmtd");
        self.spawn(
            "mgmtd",
            &[
                "mgmtd".into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--data".into(),
                data.display().to_string(),
                "--nodes".into(),
                nodes.to_string(),
                "--targets-per-node".into(),
                "1".into(),
                "--replicas".into(),
                replicas.to_string(),
                "--heartbeat-timeout-ms".into(),
                T_MS.to_string(),
                "--tick-interval-ms".into(),
                TICK_MS.to_string(),
                "--lease-ms".into(),
                "3000".into(),
            ],
        );
    }

    fn storage(&mut self, node: u32, port: u16, mgmtd_port: u16) {
        let data = self.dir.join(format!("node-{node}"));
        self.spawn(
            &format!("storage-{node}"),
            &[
                "storage".into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--node-id".into(),
                node.to_string(),
                "--data".into(),
                data.display().to_string(),
                "--mgmtd".into(),
                format!("127.0.0.1:{mgmtd_port}"),
                "--heartbeat-interval-ms".into(),
                "300".into(),
                "--initial-lease-ms".into(),
                (T_MS / 2).to_string(),
                "--max-start-wait-ms".into(),
                "30000".into(),
                "--no-sync-writes".into(),
            ],
        );
    }

    fn kill9(&mut self, name: &str) {
        let mut c = self.children.remove(name).expect("running");
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

fn rpc() -> RpcClient {
    RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default())
}

fn mgmtd_client(port: u16) -> MgmtdClient {
    MgmtdClient::new(rpc(), vec![format!("127.0.0.1:{port}")], MgmtdClientConfig::default())
}

/// Polls mgmtd's status until `pred` holds; panics after `timeout`.
async fn wait_status(m: &MgmtdClient, timeout: Duration, what: &str, pred: impl Fn(&MgmtdStatusResp) -> bool) -> MgmtdStatusResp {
    let start = Instant::now();
    let addr = m.addrs()[0].clone();
    loop {
        if let Ok(s) = m.status_of(&addr).await {
            if pred(&s) {
                return s;
            }
            if start.elapsed() > timeout {
                panic!("timed out after {timeout:?} waiting for {what}; last status: {s:#?}");
            }
        } else if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}; mgmtd unreachable");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn all_serving(s: &MgmtdStatusResp) -> bool {
    s.is_primary
        && s.nodes.iter().filter(|n| !n.address.is_empty() && n.alive).count() == 3
        && s.chains.iter().all(|c| c.targets.iter().all(|t| t.public == PublicTargetState::Serving))
}

const WRITTEN: Written = Written { chain: CHAIN, inode: InodeId(9), regions_per_chunk: REGIONS_PER_CHUNK };

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_storage_node_is_failed_over_and_recovered_by_mgmtd() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let mut procs = Procs::new(&dir);
    let mport = free_port();
    procs.mgmtd(mport, 3, 3);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    for n in 1..=3u32 {
        procs.storage(n, ports[n as usize - 1], mport);
    }
    let m = mgmtd_client(mport);
    let outcome = tokio::time::timeout(Duration::from_secs(120), async {
        wait_status(&m, Duration::from_secs(30), "3 nodes up, all serving", all_serving).await;
        let source = MgmtdRoutingSource::start(mgmtd_client(mport), Duration::from_secs(10)).await.expect("routing");
        source.wait_for_nodes(3, Duration::from_secs(10)).await;
        let client = StorageClient::new(
            rpc(),
            source.handle(),
            StorageClientConfig {
                max_attempts: 400,
                retry_backoff_ms: 5,
                call_timeout_ms: 2_000,
                routing_wait_ms: 300,
                ..Default::default()
            },
        );
        let stop = Arc::new(AtomicBool::new(false));
        let acked_count = Arc::new(AtomicU64::new(0));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (c, stop, count) = (client.clone(), stop.clone(), acked_count.clone());
            writers.push(tokio::spawn(async move {
                let mut acked = BTreeMap::new();
                let chunk = ChunkId::new(InodeId(9), w);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (r, generation) = (n % REGIONS_PER_CHUNK, n / REGIONS_PER_CHUNK);
                    c.write(CHAIN, chunk, r * REGION_BYTES, pattern(w, r, generation)).await.expect("write not acked after retries");
                    acked.insert(r, generation);
                    count.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
                (w, acked)
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Kill the middle target's node (chain order comes from the generator).
        let routing = source.current();
        let victim_target = routing.chain(CHAIN).unwrap().targets[1].target_id;
        let victim = victim_target.0 as u32 / 100;
        let before_kill = acked_count.load(Ordering::Relaxed);
        assert!(before_kill > 10, "writes stream before the kill: {before_kill}");
        let killed_at = Instant::now();
        procs.kill9(&format!("storage-{victim}"));
        let s = wait_status(&m, Duration::from_millis(T_MS + 3_000), "the victim offline", |s| {
            s.chains[0].targets.last().is_some_and(|t| t.target_id == victim_target && t.public == PublicTargetState::Offline)
        })
        .await;
        let offline_after = killed_at.elapsed();
        assert!(offline_after <= Duration::from_millis(T_MS + 2 * TICK_MS + 500), "marked offline after {offline_after:?}");
        assert!(!s.nodes.iter().find(|n| n.node_id == NodeId(victim)).unwrap().alive);
        // Writes flow again.
        let at_offline = acked_count.load(Ordering::Relaxed);
        let flow_deadline = Instant::now() + Duration::from_secs(10);
        while acked_count.load(Ordering::Relaxed) < at_offline + 20 {
            assert!(Instant::now() < flow_deadline, "writes did not resume after failover");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("victim {victim}: offline after {offline_after:?}, writes flowing at {:?}", killed_at.elapsed());
        // Restart it on its data: it waits for offline (already), reports
        // online, is synced by its predecessor, serves again.
        procs.storage(victim, ports[victim as usize - 1], mport);
        wait_status(&m, Duration::from_secs(40), "the restarted node serving again", all_serving).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        let mut acked = BTreeMap::new();
        for w in writers {
            let (id, regions) = w.await.unwrap();
            acked.insert(id, regions);
        }
        let total = acked_count.load(Ordering::Relaxed);
        assert!(total > at_offline + 20);
        check_acked(&client, &WRITTEN, &acked, 6).await;
        // Replicas identical: every target's chunk metadata (versions, length, CRC32C) equal.
        let mut dumps = Vec::new();
        for n in 1..=3u32 {
            let addr = format!("127.0.0.1:{}", ports[n as usize - 1]);
            let target = TargetId(n as u64 * 100 + 1);
            let (resp, _) =
                rpc().call::<DumpChunkMeta>(&addr, &DumpChunkMetaReq { target }, Bytes::new(), CallOptions::default()).await.expect("dump");
            dumps.push(resp.chunks);
        }
        assert_eq!(dumps[0].len(), WRITERS as usize);
        assert_eq!(dumps[0], dumps[1], "replicas differ");
        assert_eq!(dumps[0], dumps[2], "replicas differ");
        total
    })
    .await;
    match outcome {
        Ok(total) => eprintln!("{total} acked writes verified after kill -9, failover and recovery"),
        Err(_) => {
            let _ = tmp.keep();
            panic!("timed out; logs in {}", dir.display())
        }
    }
}

/// Waits (bounded) for a child to exit; returns its status.
async fn wait_exit(procs: &mut Procs, name: &str, timeout: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Some(status) = procs.children.get_mut(name).and_then(|c| c.try_wait().ok().flatten()) {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_exits_when_mgmtd_is_unreachable_for_half_t() {
    let tmp = tempfile::tempdir().unwrap();
    let mut procs = Procs::new(tmp.path());
    let mport = free_port();
    procs.mgmtd(mport, 3, 3);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    for n in 1..=3u32 {
        procs.storage(n, ports[n as usize - 1], mport);
    }
    let m = mgmtd_client(mport);
    wait_status(&m, Duration::from_secs(30), "3 nodes up, all serving", all_serving).await;
    let killed_at = Instant::now();
    procs.kill9("mgmtd");
    for n in 1..=3 {
        let name = format!("storage-{n}");
        let status = wait_exit(&mut procs, &name, Duration::from_millis(T_MS + 2_000)).await;
        let elapsed = killed_at.elapsed();
        let status = status.unwrap_or_else(|| panic!("{name} still running {elapsed:?} after mgmtd died"));
        assert_eq!(status.code(), Some(3), "{name}");
        // The lease is T/2 from the last acked heartbeat (sent ≤ 300 ms before the kill).
        assert!(elapsed <= Duration::from_millis(T_MS / 2 + 1_000), "{name} exited after {elapsed:?}");
        assert!(procs.log(&name).contains("could not renew the mgmtd lease"), "{name} log: {}", procs.log(&name));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_paused_longer_than_t_exits_on_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let mut procs = Procs::new(tmp.path());
    let mport = free_port();
    procs.mgmtd(mport, 3, 3);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    for n in 1..=3u32 {
        procs.storage(n, ports[n as usize - 1], mport);
    }
    let m = mgmtd_client(mport);
    wait_status(&m, Duration::from_secs(30), "3 nodes up, all serving", all_serving).await;
    let pid = procs.children["storage-2"].id() as i32;
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_status(&m, Duration::from_millis(T_MS + 3_000), "node 2 offline", |s| {
        s.chains[0].targets.iter().any(|t| t.target_id == TargetId(201) && t.public == PublicTargetState::Offline)
    })
    .await;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let status = wait_exit(&mut procs, "storage-2", Duration::from_secs(5)).await.expect("paused node exits after resume");
    assert_eq!(status.code(), Some(3));
    let log = procs.log("storage-2");
    assert!(log.contains("exiting"), "{log}");
}
