//! `fskv storage` (one storage service) and `fskv bench storage`.
//!
//! Routing, two paths:
//! * `--mgmtd ADDR[,ADDR…]` (production): routing comes from mgmtd
//!   ([`MgmtdRoutingSource`]); the service waits until mgmtd shows its
//!   targets offline (or unregistered) before serving, heartbeats every
//!   `--heartbeat-interval-ms`, and **exits** (status 3, with a log line)
//!   when its lease lapses, it is fenced, or it is declared dead.
//! * `--routing FILE` (tests, pre-mgmtd): a fixed routing table (JSON
//!   [`RoutingInfo`], see `docs/storage.md`) re-read every
//!   `--routing-poll-ms` and published when its `version` grows.

use crate::dir_lock::DirLock;
use anyhow::Context;
use clap::Args;
use fskv_chunk_engine::EngineConfig;
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
use fskv_client::storage::RoutingPublisher;
use fskv_proto::routing::RoutingInfo;
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use fskv_storage::mgmtd_link::{self, MgmtdLinkConfig};
use fskv_storage::{StorageConfig, StorageService};
use fskv_types::{NodeId, TargetId};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct StorageArgs {
    /// RPC listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Data directory; target T keeps its chunk engine in DIR/target-T.
    #[arg(long)]
    data: PathBuf,
    /// This service's node id in the routing info.
    #[arg(long, default_value_t = 1)]
    node_id: u32,
    /// Target ids hosted here, comma-separated. Default: the targets of this
    /// node in the routing file.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<u64>,
    /// Fixed routing table (JSON RoutingInfo): the pre-mgmtd / test path.
    #[arg(long, value_name = "FILE", conflicts_with = "mgmtd", required_unless_present = "mgmtd")]
    routing: Option<PathBuf>,
    /// mgmtd addresses (comma-separated): the production path.
    #[arg(long, value_delimiter = ',', value_name = "ADDR")]
    mgmtd: Vec<String>,
    /// Address registered with mgmtd for clients and peers (default: the
    /// bound address; needed when listening on 0.0.0.0, e.g. in a pod).
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Heartbeat period (with --mgmtd).
    #[arg(long, default_value_t = 1_000)]
    heartbeat_interval_ms: u64,
    /// Lease assumed until mgmtd's first ack states T/2 (with --mgmtd).
    #[arg(long, default_value_t = 30_000)]
    initial_lease_ms: u64,
    /// Bound on the wait for mgmtd to mark this node's targets offline at start.
    #[arg(long, default_value_t = 600_000)]
    max_start_wait_ms: u64,
    /// How often the routing file is re-read.
    #[arg(long, default_value_t = 200)]
    routing_poll_ms: u64,
    /// Do not fdatasync chunk writes (a process crash is still safe; a power loss is not).
    #[arg(long)]
    no_sync_writes: bool,
    /// Write the bound address to this file once serving.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    /// Scrubber rate: every committed chunk's page checksums are verified in
    /// the background at most this fast, bit rot repaired from another
    /// replica (0 = off).
    #[arg(long, default_value_t = 16)]
    scrub_mib_per_sec: u64,
    /// Pause between two scrub passes over all targets.
    #[arg(long, default_value_t = 60_000)]
    scrub_pause_between_passes_ms: u64,
}

impl StorageArgs {
    /// The node id this process claims as its principal (`identity.rs`).
    pub fn node_id(&self) -> u32 {
        self.node_id
    }
}

impl StorageArgs {
    fn service_config(&self, node: NodeId) -> StorageConfig {
        let mut config = StorageConfig::new(node);
        config.scrub_bytes_per_sec = self.scrub_mib_per_sec.saturating_mul(1 << 20);
        config.scrub_pause_between_passes_ms = self.scrub_pause_between_passes_ms;
        config
    }
}

fn load_routing(path: &Path) -> anyhow::Result<RoutingInfo> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading routing file {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing routing file {}", path.display()))
}

pub async fn run(args: StorageArgs) -> anyhow::Result<()> {
    // At once, before mgmtd is asked anything: a second service on this
    // directory is refused with the owner's name.
    std::fs::create_dir_all(&args.data).with_context(|| format!("cannot create data directory {}", args.data.display()))?;
    let _owner = DirLock::acquire(&args.data, &format!("storage {}", NodeId(args.node_id)))?;
    if !args.mgmtd.is_empty() {
        return run_with_mgmtd(args).await;
    }
    let Some(routing_path) = args.routing.clone() else { anyhow::bail!("pass --routing FILE or --mgmtd ADDR") };
    let routing = load_routing(&routing_path)?;
    let node = NodeId(args.node_id);
    let targets: Vec<TargetId> =
        if args.targets.is_empty() { routing.targets_of_node(node) } else { args.targets.iter().map(|t| TargetId(*t)).collect() };
    anyhow::ensure!(!targets.is_empty(), "no targets for {node} (pass --targets or list them in the routing file)");
    let (publisher, handle) = RoutingPublisher::new(routing);
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
    let engine_config = engine_config(&args);
    std::fs::create_dir_all(&args.data)?;
    let data = args.data.clone();
    let service_config = args.service_config(node);
    let service =
        tokio::task::spawn_blocking(move || StorageService::open(service_config, &data, &targets, engine_config, handle, rpc)).await??;
    let running = service.serve(&args.listen).await?;
    if let Some(path) = &args.ready_file {
        std::fs::write(path, running.local_addr())?;
    }
    eprintln!("fskv storage: {node} serving on {}", running.local_addr());
    let path = routing_path;
    let poll = Duration::from_millis(args.routing_poll_ms.max(10));
    let reloader = tokio::spawn(async move {
        loop {
            tokio::time::sleep(poll).await;
            match load_routing(&path) {
                Ok(next) if next.version > publisher.current().version => {
                    tracing::info!(version = next.version, "routing file changed");
                    publisher.update(|r| *r = next.clone());
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("routing file unreadable, keeping the last one: {e:#}"),
            }
        }
    });
    wait_for_signal().await;
    reloader.abort();
    running.shutdown().await;
    Ok(())
}

async fn run_with_mgmtd(args: StorageArgs) -> anyhow::Result<()> {
    let node = NodeId(args.node_id);
    let generation = crate::generation_now();
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
    let client_config = MgmtdClientConfig { call_timeout_ms: args.heartbeat_interval_ms.clamp(200, 2_000), ..MgmtdClientConfig::default() };
    let client = MgmtdClient::new(rpc.clone(), args.mgmtd.clone(), client_config);
    let source =
        MgmtdRoutingSource::start(client, Duration::from_millis(args.max_start_wait_ms)).await.context("fetching routing from mgmtd")?;
    let targets: Vec<TargetId> =
        if args.targets.is_empty() { source.current().targets_of_node(node) } else { args.targets.iter().map(|t| TargetId(*t)).collect() };
    anyhow::ensure!(!targets.is_empty(), "no targets for {node} in mgmtd's routing (pass --targets)");
    mgmtd_link::wait_until_safe_to_start(&source, node, &targets, args.max_start_wait_ms).await?;
    let engine_config = engine_config(&args);
    std::fs::create_dir_all(&args.data)?;
    let data = args.data.clone();
    let handle = source.handle();
    let service_config = args.service_config(node);
    let service =
        tokio::task::spawn_blocking(move || StorageService::open(service_config, &data, &targets, engine_config, handle, rpc)).await??;
    let running = service.serve(&args.listen).await?;
    let address = args.advertise.clone().unwrap_or_else(|| running.local_addr().to_string());
    if let Some(path) = &args.ready_file {
        std::fs::write(path, running.local_addr())?;
    }
    eprintln!("fskv storage: {node} serving on {address} (generation {generation}, mgmtd {:?})", args.mgmtd);
    let link = MgmtdLinkConfig {
        heartbeat_interval_ms: args.heartbeat_interval_ms,
        generation,
        initial_lease_ms: args.initial_lease_ms,
        max_start_wait_ms: args.max_start_wait_ms,
    };
    let heartbeats = mgmtd_link::run_heartbeats(running.service.clone(), source.clone(), address, link);
    tokio::select! {
        reason = heartbeats => {
            tracing::error!(%node, "exiting: {reason}");
            eprintln!("fskv storage: {node} exiting: {reason}");
            std::process::exit(3);
        }
        _ = wait_for_signal() => {}
    }
    source.stop();
    running.shutdown().await;
    Ok(())
}

pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[derive(Args)]
pub struct StorageBenchArgs {
    /// Seconds per workload.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Parent directory on the disk to measure.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Distinct 1 MiB chunks.
    #[arg(long, default_value_t = 128)]
    chunks: u64,
    /// Skip iperf3.
    #[arg(long)]
    no_iperf3: bool,
    /// Skip fio.
    #[arg(long)]
    no_fio: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Run every service's scrubber at this rate, continuously, during the
    /// workloads (0 = off): its cost on foreground I/O.
    #[arg(long, default_value_t = 0)]
    scrub_mib_per_sec: u64,
    /// Chain lengths measured, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [3usize, 1])]
    chains: Vec<usize>,
}

pub async fn bench(a: StorageBenchArgs) -> anyhow::Result<()> {
    let opts = fskv_storage::bench::StorageBenchOptions {
        dir: a.dir,
        seconds_per_workload: a.seconds,
        chunk_count: a.chunks.max(1),
        run_iperf3: !a.no_iperf3,
        run_fio: !a.no_fio,
        scrub_mib_per_sec: a.scrub_mib_per_sec,
        chain_lengths: a.chains,
        ..Default::default()
    };
    eprintln!("bench storage: chains {:?}, {} s per workload ...", opts.chain_lengths, opts.seconds_per_workload);
    let report = fskv_storage::bench::run(opts).await?;
    println!("{report}");
    if let Some(path) = a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(())
}

/// The chunk engine's configuration; says so once when writes are not synced.
fn engine_config(args: &StorageArgs) -> EngineConfig {
    if args.no_sync_writes {
        tracing::warn!("--no-sync-writes: chunk writes are acknowledged without fdatasync (a power loss may lose them)");
    }
    EngineConfig { sync_writes: !args.no_sync_writes, ..EngineConfig::default() }
}
