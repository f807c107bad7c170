//! `fskv bench failover`: real processes (this binary as `fskv mgmtd` and
//! three `fskv storage --mgmtd`), one chain of 3 targets.
//!
//! 1. Writers stream 64 KiB writes; the middle node is killed with SIGKILL.
//!    Measured: time until mgmtd shows it offline, and time until the first
//!    write *issued after the kill* is acknowledged (writes flowing again).
//! 2. While it is down, `--missed-mib` MiB are written as 1 MiB chunks.
//!    It is restarted; measured: restart → serving, and the sync itself
//!    (mgmtd shows it syncing → serving) as MiB/s of the missed data.
//! 3. Next to it, `fskv_storage::bench` measures the raw chain-3 1 MiB write
//!    throughput (in-process loopback chain, same disk) in the same run.

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_proto::mgmtd::MgmtdStatusResp;
use fskv_proto::routing::PublicTargetState;
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use fskv_types::{ChainId, ChunkId, InodeId, TargetId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHAIN: ChainId = ChainId(1);
const MIB: u64 = 1 << 20;

#[derive(Args)]
pub struct FailoverBenchArgs {
    /// T given to mgmtd (heartbeat timeout).
    #[arg(long, default_value_t = 3_000)]
    heartbeat_timeout_ms: u64,
    /// Storage heartbeat period.
    #[arg(long, default_value_t = 300)]
    heartbeat_interval_ms: u64,
    /// mgmtd tick period.
    #[arg(long, default_value_t = 200)]
    tick_interval_ms: u64,
    /// MiB written while the killed node is down (re-synced after restart).
    #[arg(long, default_value_t = 256)]
    missed_mib: u64,
    /// Seconds per workload of the raw chain-3 storage bench.
    #[arg(long, default_value_t = 3.0)]
    raw_seconds: f64,
    /// Parent directory on the disk to measure.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailoverReport {
    pub heartbeat_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub tick_interval_ms: u64,
    /// kill -9 → mgmtd's status shows the target offline.
    pub kill_to_offline_ms: f64,
    /// kill -9 → first acknowledged write issued after the kill.
    pub kill_to_first_write_ms: f64,
    pub missed_mib: u64,
    /// Restart of the process → all targets serving.
    pub restart_to_serving_ms: f64,
    /// mgmtd shows the target syncing → serving.
    pub sync_ms: f64,
    pub resync_mib_per_sec: f64,
    /// Raw chain-3 1 MiB write throughput (fskv bench storage, same run).
    pub raw_chain3_write_mib_per_sec: f64,
}

impl fmt::Display for FailoverReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "failover bench: 3 storage processes, chain of 3, T = {} ms, heartbeat every {} ms, tick {} ms, loopback TCP",
            self.heartbeat_timeout_ms, self.heartbeat_interval_ms, self.tick_interval_ms
        )?;
        writeln!(f, "kill -9 -> target offline in mgmtd:        {:>9.0} ms", self.kill_to_offline_ms)?;
        writeln!(f, "kill -9 -> first write acked after kill:   {:>9.0} ms", self.kill_to_first_write_ms)?;
        writeln!(f, "restart -> all serving ({} MiB missed):   {:>9.0} ms", self.missed_mib, self.restart_to_serving_ms)?;
        writeln!(f, "sync (syncing -> serving):                 {:>9.0} ms", self.sync_ms)?;
        writeln!(f, "re-sync throughput:                        {:>9.1} MiB/s", self.resync_mib_per_sec)?;
        write!(f, "raw chain-3 1 MiB writes (bench storage):  {:>9.1} MiB/s", self.raw_chain3_write_mib_per_sec)
    }
}

struct Procs {
    exe: PathBuf,
    dir: PathBuf,
    children: BTreeMap<String, Child>,
    /// The cluster key every process gets (env `FSKV_CLUSTER_KEY_FILE`).
    key_file: Option<PathBuf>,
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
    fn spawn(&mut self, name: &str, args: Vec<String>) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{name}.log")))?;
        let mut cmd = Command::new(&self.exe);
        if let Some(key) = &self.key_file {
            cmd.env("FSKV_CLUSTER_KEY_FILE", key);
        }
        let child =
            cmd.args(args).env("FSKV_LOG", "warn").stdout(Stdio::null()).stderr(log).spawn().with_context(|| format!("spawning {name}"))?;
        self.children.insert(name.to_string(), child);
        Ok(())
    }

    fn kill9(&mut self, name: &str) -> anyhow::Result<()> {
        let mut c = self.children.remove(name).context("not running")?;
        c.kill()?;
        c.wait()?;
        Ok(())
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn rpc() -> RpcClient {
    RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default())
}

async fn wait_status(m: &MgmtdClient, timeout: Duration, what: &str, pred: impl Fn(&MgmtdStatusResp) -> bool) -> anyhow::Result<Instant> {
    let start = Instant::now();
    let addr = m.addrs().first().cloned().context("no mgmtd address")?;
    loop {
        if let Ok(s) = m.status_of(&addr).await {
            if pred(&s) {
                return Ok(Instant::now());
            }
        }
        anyhow::ensure!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn all_serving(s: &MgmtdStatusResp) -> bool {
    s.is_primary
        && s.nodes.iter().filter(|n| !n.address.is_empty() && n.alive).count() == 3
        && s.chains.iter().all(|c| c.targets.iter().all(|t| t.public == PublicTargetState::Serving))
}

fn target_state(s: &MgmtdStatusResp, target: TargetId) -> Option<PublicTargetState> {
    s.chains.iter().flat_map(|c| c.targets.iter()).find(|t| t.target_id == target).map(|t| t.public)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub async fn run(a: FailoverBenchArgs) -> anyhow::Result<()> {
    let tmp = tempfile::Builder::new().prefix(".fskv-bench-failover-").tempdir_in(&a.dir).context("bench dir")?;
    eprintln!("bench failover: raw chain-3 storage bench first ({} s per workload) ...", a.raw_seconds);
    let raw = fskv_storage::bench::run(fskv_storage::bench::StorageBenchOptions {
        dir: tmp.path().to_path_buf(),
        seconds_per_workload: a.raw_seconds,
        chain_lengths: vec![3],
        run_iperf3: false,
        run_fio: false,
        ..Default::default()
    })
    .await?;
    let raw_write = raw.chains.first().map_or(0.0, |c| c.write_1m_mib_per_sec);
    eprintln!("bench failover: raw chain-3 writes {raw_write:.1} MiB/s; starting processes ...");
    let report = failover(&a, tmp.path(), raw_write).await?;
    println!("{report}");
    if let Some(path) = a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(())
}

async fn failover(a: &FailoverBenchArgs, dir: &Path, raw_write: f64) -> anyhow::Result<FailoverReport> {
    let mut procs = Procs { exe: std::env::current_exe()?, dir: dir.to_path_buf(), children: BTreeMap::new(), key_file: None };
    // One cluster key for the bench's processes and its own clients.
    let (key_file, key) = crate::identity::load_or_create(dir)?;
    crate::identity::install_key(Some(key), "client");
    procs.key_file = Some(key_file);
    let mport = free_port()?;
    let maddr = format!("127.0.0.1:{mport}");
    let t = a.heartbeat_timeout_ms;
    procs.spawn(
        "mgmtd",
        vec![
            "mgmtd".into(),
            "--listen".into(),
            maddr.clone(),
            "--data".into(),
            dir.join("mgmtd").display().to_string(),
            "--nodes".into(),
            "3".into(),
            "--targets-per-node".into(),
            "1".into(),
            "--replicas".into(),
            "3".into(),
            "--heartbeat-timeout-ms".into(),
            t.to_string(),
            "--tick-interval-ms".into(),
            a.tick_interval_ms.to_string(),
        ],
    )?;
    let ports = [free_port()?, free_port()?, free_port()?];
    let storage_args = |node: u32| -> Vec<String> {
        vec![
            "storage".into(),
            "--listen".into(),
            format!("127.0.0.1:{}", ports[node as usize - 1]),
            "--node-id".into(),
            node.to_string(),
            "--data".into(),
            dir.join(format!("node-{node}")).display().to_string(),
            "--mgmtd".into(),
            maddr.clone(),
            "--heartbeat-interval-ms".into(),
            a.heartbeat_interval_ms.to_string(),
            "--initial-lease-ms".into(),
            (t / 2).to_string(),
            "--no-sync-writes".into(),
        ]
    };
    for n in 1..=3 {
        procs.spawn(&format!("storage-{n}"), storage_args(n))?;
    }
    let m = MgmtdClient::new(rpc(), vec![maddr.clone()], MgmtdClientConfig::default());
    wait_status(&m, Duration::from_secs(30), "3 nodes serving", all_serving).await?;
    let source = MgmtdRoutingSource::start(m.clone(), Duration::from_secs(10)).await?;
    source.wait_for_nodes(3, Duration::from_secs(10)).await;
    let client = StorageClient::new(
        rpc(),
        source.handle(),
        StorageClientConfig {
            max_attempts: 1_000,
            retry_backoff_ms: 2,
            call_timeout_ms: 2_000,
            routing_wait_ms: 100,
            ..Default::default()
        },
    );
    // Phase 1: stream 64 KiB writes, kill -9 the middle node.
    let stop = Arc::new(AtomicBool::new(false));
    let (ack_tx, mut ack_rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Instant)>();
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let (c, stop, tx) = (client.clone(), stop.clone(), ack_tx.clone());
        writers.push(tokio::spawn(async move {
            let data = Bytes::from(vec![w as u8 ^ 0xa5; 64 << 10]);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let off = (n % 16) * (64 << 10);
                c.write(CHAIN, ChunkId::new(InodeId(77), w), off, data.clone()).await?;
                let _ = tx.send((start, Instant::now()));
                n += 1;
            }
            anyhow::Ok(())
        }));
    }
    drop(ack_tx);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let victim_target = source.current().chain(CHAIN).and_then(|c| c.targets.get(1)).map(|t| t.target_id).context("no middle target")?;
    let victim = (victim_target.0 / 100) as u32;
    let killed_at = Instant::now();
    procs.kill9(&format!("storage-{victim}"))?;
    let offline_at = wait_status(&m, Duration::from_millis(t + 5_000), "victim offline", |s| {
        target_state(s, victim_target) == Some(PublicTargetState::Offline)
    })
    .await?;
    let mut first_after: Option<Instant> = None;
    let flow_deadline = Instant::now() + Duration::from_secs(20);
    while first_after.is_none() && Instant::now() < flow_deadline {
        match tokio::time::timeout(Duration::from_millis(100), ack_rx.recv()).await {
            Ok(Some((start, end))) if start > killed_at => first_after = Some(end),
            Ok(None) => break,
            _ => {}
        }
    }
    let first_after = first_after.context("no write acknowledged after the kill")?;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await??;
    }
    // Phase 2: write the missed data while the node is down.
    eprintln!("bench failover: writing {} MiB while node {victim} is down ...", a.missed_mib);
    let data = Bytes::from(vec![0x3c; MIB as usize]);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (c, next, data, total) = (client.clone(), next.clone(), data.clone(), a.missed_mib);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return anyhow::Ok(());
                }
                c.write(CHAIN, ChunkId::new(InodeId(78), i), 0, data.clone()).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    // Phase 3: restart it and time the recovery.
    let restarted_at = Instant::now();
    procs.spawn(&format!("storage-{victim}"), storage_args(victim))?;
    let syncing_at = wait_status(&m, Duration::from_secs(60), "victim syncing", |s| {
        matches!(target_state(s, victim_target), Some(PublicTargetState::Syncing | PublicTargetState::Serving))
    })
    .await?;
    let serving_at = wait_status(&m, Duration::from_secs(600), "all serving", all_serving).await?;
    let sync = serving_at.duration_since(syncing_at);
    source.stop();
    Ok(FailoverReport {
        heartbeat_timeout_ms: t,
        heartbeat_interval_ms: a.heartbeat_interval_ms,
        tick_interval_ms: a.tick_interval_ms,
        kill_to_offline_ms: ms(offline_at.duration_since(killed_at)),
        kill_to_first_write_ms: ms(first_after.duration_since(killed_at)),
        missed_mib: a.missed_mib,
        restart_to_serving_ms: ms(serving_at.duration_since(restarted_at)),
        sync_ms: ms(sync),
        resync_mib_per_sec: a.missed_mib as f64 / sync.as_secs_f64().max(1e-9),
        raw_chain3_write_mib_per_sec: raw_write,
    })
}
