//! `fskv mgmtd`: one cluster manager instance. Its state lives in a KV
//! engine: the embedded RocksDB under `--data DIR/kv` (one process), or a
//! shared engine (`--engine etcd:http://…` or `fdb:…`, or `[kv]` in the
//! config) on which several instances run, one primary by a lease in the
//! engine and the others standing by. On first start it generates the chain
//! table for the layout (`--nodes`, `--targets-per-node`, `--replicas`) and
//! stores it; later starts load it (the layout must match).

use crate::config::Config;
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
    /// Data directory (the embedded engine in DIR/kv, unless --engine or
    /// the config's [kv] names a shared one).
    #[arg(long)]
    data: Option<PathBuf>,
    /// KV engine spec overriding [kv]: rocksdb:PATH, etcd:http://H:P[,...][?OPTIONS]
    /// or fdb:CLUSTER_FILE. Several mgmtd instances share one etcd or
    /// FoundationDB engine (one is primary by a lease stored in it).
    #[arg(long)]
    engine: Option<String>,
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
    /// Address named to clients redirected to the primary (default: the
    /// bound address; needed when listening on 0.0.0.0, e.g. in a pod).
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Write the bound address to this file once serving.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
}

pub async fn run(args: MgmtdArgs, config: &Config) -> anyhow::Result<()> {
    let mut _owner = None;
    let spec = match (&args.engine, &args.data) {
        (Some(spec), _) => spec.clone(),
        (None, Some(data)) => {
            std::fs::create_dir_all(data).with_context(|| format!("cannot create data directory {}", data.display()))?;
            _owner = Some(crate::dir_lock::DirLock::acquire(data, "mgmtd")?);
            config.kv.engine_spec(data)?
        }
        (None, None) if config.kv.engine == "rocksdb" => anyhow::bail!("fskv mgmtd needs --data DIR (embedded engine) or --engine SPEC"),
        (None, None) => config.kv.engine_spec(std::path::Path::new("."))?,
    };
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
    if let Some(addr) = &args.advertise {
        // The lease loop's next renewal (within lease/3) stores it.
        running.mgmtd.set_address(addr);
    }
    if let Some(path) = &args.ready_file {
        std::fs::write(path, running.local_addr())?;
    }
    eprintln!("fskv mgmtd: serving on {} (engine {})", running.local_addr(), redact(&spec));
    crate::storage_cmd::wait_for_signal().await;
    running.shutdown().await;
    Ok(())
}

/// The engine spec without its options (for logs).
pub fn redact(spec: &str) -> &str {
    spec.split('?').next().unwrap_or(spec)
}
