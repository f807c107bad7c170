//! `fskv up`: a whole single-node cluster from one data directory.
//!
//! Today it starts what exists — the embedded transactional KV engine that
//! meta and mgmtd will keep their state in — checks that it is usable, records
//! the cluster's identity on first start, and says which services are not built
//! yet. It runs until Ctrl-C or SIGTERM and then closes the engine cleanly.

use crate::config::Config;
use clap::Args;
use fskv_kv::{open_engine, run_transaction, RetryOptions};
use std::path::PathBuf;

#[derive(Args)]
pub struct UpArgs {
    /// Data directory (all state of the cluster). Default: up.data_dir of the config (./data).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Base port: S3 on P, KV on P+1, MQ on P+2, internal services above P+10.
    #[arg(long)]
    base_port: Option<u16>,
    /// Start, check and stop at once instead of serving until a signal.
    #[arg(long, hide = true)]
    check: bool,
}

/// Services of a full cluster that are not implemented yet, and the issue that builds each.
const NOT_YET: &[(&str, &str)] = &[
    ("mgmtd (cluster manager)", "issue #6"),
    ("meta (metadata service)", "issue #3"),
    ("storage x3 (chunk engines, CRAQ)", "issues #4, #5"),
    ("S3 gateway", "issue #8"),
    ("KV and MQ gateways", "later issues"),
    ("FUSE mount", "issue #7"),
];

const CLUSTER_ID_KEY: &[u8] = b"SYS\0cluster_id";

pub async fn run(args: UpArgs, config: &Config) -> anyhow::Result<()> {
    let data_dir = args.data.unwrap_or_else(|| config.up.data_dir.clone());
    let base_port = args.base_port.unwrap_or(config.up.base_port);
    anyhow::ensure!(base_port <= 65535 - 20, "--base-port {base_port} leaves no room for internal ports above it");
    std::fs::create_dir_all(data_dir.join("pids"))
        .map_err(|e| anyhow::anyhow!("cannot create data directory {}: {e}", data_dir.display()))?;

    let spec = config.kv.engine_spec(&data_dir)?;
    let engine = open_engine(&spec).map_err(|e| anyhow::anyhow!("cannot open the KV engine ({spec}): {e}"))?;
    let (cluster_id, fresh) = run_transaction(&*engine, &RetryOptions::default(), |txn| {
        Box::pin(async move {
            if let Some(id) = txn.get(CLUSTER_ID_KEY).await? {
                return Ok((String::from_utf8_lossy(&id).into_owned(), false));
            }
            let id = new_cluster_id();
            txn.set(CLUSTER_ID_KEY, id.as_bytes())?;
            Ok((id, true))
        })
    })
    .await?;

    println!("fskv up: data directory {}", data_dir.display());
    println!(
        "  running  KV engine {} ({}), cluster {cluster_id}{}",
        engine.name(),
        spec,
        if fresh { " (new)" } else { " (existing data)" }
    );
    for (service, issue) in NOT_YET {
        println!("  not yet  {service} — not implemented ({issue})");
    }
    println!("  base port {base_port} reserved for the gateways; nothing listens there yet");
    if args.check {
        return Ok(());
    }
    println!("fskv up: serving; Ctrl-C or SIGTERM stops it");
    wait_for_shutdown().await?;
    println!("fskv up: stopping");
    drop(engine);
    println!("fskv up: stopped cleanly");
    Ok(())
}

fn new_cluster_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("fskv-{:x}-{:x}", nanos, std::process::id())
}

async fn wait_for_shutdown() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}
