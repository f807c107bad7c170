//! `fskv mgmtd`: one cluster manager instance over a RocksDB KV engine in
//! `--data`. On first start it generates the chain table for the layout
//! (`--nodes`, `--targets-per-node`, `--replicas`) and stores it; later
//! starts load it (the layout must match).

use anyhow::Context;
use clap::Args;
use fskv_mgmtd::{Layout, Mgmtd, MgmtdConfig, SystemClock};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct MgmtdArgs {
    /// RPC listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Data directory (RocksDB KV engine in DIR/kv).
    #[arg(long)]
    data: PathBuf,
    /// Storage nodes (ids 1..=N).
    #[arg(long)]
    nodes: u32,
    /// Targets per storage node (target i of node n is n*100+i+1).
    #[arg(long)]
    targets_per_node: u32,
    /// Replication factor (chain length).
    #[arg(long)]
    replicas: u32,
    /// T: a storage node without heartbeat this long is failed.
    #[arg(long, default_value_t = 60_000)]
    heartbeat_timeout_ms: u64,
    /// Period of the chain recomputation.
    #[arg(long, default_value_t = 1_000)]
    tick_interval_ms: u64,
    /// Primary lease (renewed every third of it).
    #[arg(long, default_value_t = 10_000)]
    lease_ms: u64,
    /// This instance's id (default: mgmtd-<pid>).
    #[arg(long)]
    id: Option<String>,
    /// Write the bound address to this file once serving.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
}

pub async fn run(args: MgmtdArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data)?;
    let kv_path = args.data.join("kv");
    let spec = format!("rocksdb:{}", kv_path.display());
    let engine = fskv_kv::open_engine(&spec).with_context(|| format!("opening {spec}"))?;
    let layout = Layout { nodes: args.nodes, targets_per_node: args.targets_per_node, replicas: args.replicas };
    let config = MgmtdConfig {
        heartbeat_timeout_ms: args.heartbeat_timeout_ms,
        tick_interval_ms: args.tick_interval_ms,
        lease_ms: args.lease_ms,
        ..MgmtdConfig::new(args.id.unwrap_or_else(|| format!("mgmtd-{}", std::process::id())))
    };
    let mgmtd = Mgmtd::new(config, layout, engine, Arc::new(SystemClock))?;
    let running = mgmtd.serve(&args.listen).await?;
    if let Some(path) = &args.ready_file {
        std::fs::write(path, running.local_addr())?;
    }
    eprintln!("fskv mgmtd: serving on {}", running.local_addr());
    crate::storage_cmd::wait_for_signal().await;
    running.shutdown().await;
    Ok(())
}
