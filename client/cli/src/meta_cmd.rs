//! `fskv meta` (serve the metadata service) and `fskv bench meta`.

use crate::config::Config;
use clap::Args;
use fskv_meta::{MetaConfig, MetaService, NoStorage};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct MetaArgs {
    /// Address to serve meta RPC on.
    #[arg(long, default_value = "127.0.0.1:9011")]
    listen: String,
    /// Data directory; the [kv] section of the config chooses the engine
    /// (embedded RocksDB under DIR/kv by default). Default: up.data_dir.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Engine spec overriding [kv]: memory, rocksdb:PATH or fdb:CLUSTER_FILE.
    #[arg(long)]
    engine: Option<String>,
}

#[derive(Args)]
pub struct MetaBenchArgs {
    #[command(flatten)]
    common: crate::bench::Common,
    /// Directory on the disk to measure (a temporary engine is created and removed under it).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Concurrent callers to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    callers: Vec<usize>,
    /// Per-inode batch queues of the measured server (0 disables batching).
    #[arg(long, default_value_t = 8)]
    batch_shards: usize,
}

pub async fn run(args: MetaArgs, config: &Config) -> anyhow::Result<()> {
    let spec = match args.engine {
        Some(spec) => spec,
        None => {
            let data_dir = args.data.unwrap_or_else(|| config.up.data_dir.clone());
            std::fs::create_dir_all(&data_dir)
                .map_err(|e| anyhow::anyhow!("cannot create data directory {}: {e}", data_dir.display()))?;
            config.kv.engine_spec(&data_dir)?
        }
    };
    let engine = fskv_kv::open_engine(&spec).map_err(|e| anyhow::anyhow!("cannot open the KV engine ({spec}): {e}"))?;
    // No storage service yet: file lengths come from client reports.
    let service = MetaService::open(engine, Arc::new(NoStorage), MetaConfig::default()).await?;
    let server = service.serve(&args.listen).await?;
    println!("fskv meta: serving on {} (engine {spec})", server.local_addr());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    println!("fskv meta: stopping");
    server.shutdown().await;
    Ok(())
}

pub async fn bench(args: MetaBenchArgs, config: &Config) -> anyhow::Result<()> {
    let opts = fskv_meta::bench::MetaBenchOptions {
        dir: args.dir,
        seconds: args.common.seconds,
        callers: args.callers,
        sync_writes: config.kv.sync_writes,
        batch_shards: args.batch_shards,
        ..Default::default()
    };
    eprintln!("bench meta: {} s per measurement, callers {:?} ...", opts.seconds, opts.callers);
    let report = fskv_meta::bench::run(opts).await?;
    crate::bench::emit(&report, args.common.json.as_ref())
}
