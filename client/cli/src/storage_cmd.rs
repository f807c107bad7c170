//! `fskv storage` (one storage service) and `fskv bench storage`.
//!
//! Routing: until mgmtd exists, the service reads a fixed routing table
//! from `--routing FILE` (JSON [`RoutingInfo`], see `docs/storage.md`) and
//! re-reads it every `--routing-poll-ms`, publishing it when its `version`
//! grows. This is the pre-mgmtd / test path; with mgmtd the same
//! `RoutingHandle` is fed by the mgmtd client instead.

use anyhow::Context;
use clap::Args;
use fskv_chunk_engine::EngineConfig;
use fskv_client::storage::RoutingPublisher;
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use fskv_storage::{StorageConfig, StorageService};
use fskv_types::routing::RoutingInfo;
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
    #[arg(long, value_name = "FILE")]
    routing: PathBuf,
    /// How often the routing file is re-read.
    #[arg(long, default_value_t = 200)]
    routing_poll_ms: u64,
    /// Do not fdatasync chunk writes (a process crash is still safe; a power loss is not).
    #[arg(long)]
    no_sync_writes: bool,
    /// Write the bound address to this file once serving.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
}

fn load_routing(path: &Path) -> anyhow::Result<RoutingInfo> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading routing file {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing routing file {}", path.display()))
}

pub async fn run(args: StorageArgs) -> anyhow::Result<()> {
    let routing = load_routing(&args.routing)?;
    let node = NodeId(args.node_id);
    let targets: Vec<TargetId> = if args.targets.is_empty() {
        routing.targets_of_node(node)
    } else {
        args.targets.iter().map(|t| TargetId(*t)).collect()
    };
    anyhow::ensure!(!targets.is_empty(), "no targets for {node} (pass --targets or list them in the routing file)");
    let (publisher, handle) = RoutingPublisher::new(routing);
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
    let engine_config = EngineConfig { sync_writes: !args.no_sync_writes, ..EngineConfig::default() };
    std::fs::create_dir_all(&args.data)?;
    let data = args.data.clone();
    let service = tokio::task::spawn_blocking(move || {
        StorageService::open(StorageConfig::new(node), &data, &targets, engine_config, handle, rpc)
    })
    .await??;
    let running = service.serve(&args.listen).await?;
    if let Some(path) = &args.ready_file {
        std::fs::write(path, running.local_addr())?;
    }
    eprintln!("fskv storage: {node} serving on {}", running.local_addr());
    let path = args.routing.clone();
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

async fn wait_for_signal() {
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
}

pub async fn bench(a: StorageBenchArgs) -> anyhow::Result<()> {
    let opts = fskv_storage::bench::StorageBenchOptions {
        dir: a.dir,
        seconds_per_workload: a.seconds,
        chunk_count: a.chunks.max(1),
        run_iperf3: !a.no_iperf3,
        run_fio: !a.no_fio,
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
