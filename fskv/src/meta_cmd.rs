//! `fskv meta` (serve the metadata service) and `fskv bench meta`.

use crate::config::Config;
use anyhow::Context;
use clap::Args;
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_meta::{ChainStorage, MetaConfig, MetaService, NoStorage, StorageBackend};
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct MetaArgs {
    /// Address to serve meta RPC on.
    #[arg(long, default_value = "127.0.0.1:9011")]
    listen: String,
    /// Data directory; the [kv] section of the config chooses the engine
    /// (embedded RocksDB under DIR/kv by default). Default: up.data_dir.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Engine spec overriding [kv]: memory, rocksdb:PATH,
    /// etcd:http://H:P[,http://H:P...][?OPTIONS] or fdb:CLUSTER_FILE. Meta
    /// servers keep no state of their own: any number of them may serve one
    /// etcd or FoundationDB engine, and clients fail over between them.
    #[arg(long)]
    engine: Option<String>,
    /// mgmtd addresses (comma-separated). With them, new files stripe over
    /// mgmtd's chain table and exact lengths, truncates and chunk GC go to
    /// the storage service; without, lengths come from client reports only.
    #[arg(long, value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Bound on the wait for mgmtd's first routing info at start.
    #[arg(long, default_value_t = 30_000)]
    mgmtd_wait_ms: u64,
    /// This meta server's node id in mgmtd's list of meta servers (unique
    /// per meta server of the cluster).
    #[arg(long, default_value_t = 1)]
    node_id: u32,
    /// Address clients should use, registered with mgmtd (default: the
    /// address served on).
    #[arg(long)]
    advertise: Option<String>,
}

impl MetaArgs {
    /// The node id this process claims as its principal (`identity.rs`).
    pub fn node_id(&self) -> u32 {
        self.node_id
    }
}

/// The storage backend and the chain table, from mgmtd's routing info.
async fn storage_from_mgmtd(
    addrs: Vec<String>,
    wait_ms: u64,
) -> anyhow::Result<(Arc<dyn StorageBackend>, MetaConfig, Arc<MgmtdRoutingSource>)> {
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
    let mgmtd = MgmtdClient::new(rpc.clone(), addrs.clone(), MgmtdClientConfig::default());
    let source = MgmtdRoutingSource::start(mgmtd, Duration::from_millis(wait_ms))
        .await
        .with_context(|| format!("fetching routing info from mgmtd {addrs:?}"))?;
    let routing = source.current();
    let table = routing
        .chain_tables
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("mgmtd's routing info (version {}) has no chain table", routing.version))?;
    anyhow::ensure!(!table.chains.is_empty(), "mgmtd's chain table {} has no chains", table.table_id);
    let config = MetaConfig::over_chain_table(&table);
    let storage = StorageClient::new(rpc, source.handle(), StorageClientConfig::default());
    Ok((Arc::new(ChainStorage::new(storage)), config, source))
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
    /// Measure this KV engine instead of a temporary RocksDB under --dir,
    /// e.g. etcd:http://127.0.0.1:2379,... (the run uses a fresh key prefix
    /// and clears it afterwards).
    #[arg(long)]
    engine: Option<String>,
}

pub async fn run(args: MetaArgs, config: &Config) -> anyhow::Result<()> {
    let mut _owner = None;
    let spec = match args.engine {
        Some(spec) => spec,
        None => {
            let data_dir = args.data.unwrap_or_else(|| config.up.data_dir.clone());
            std::fs::create_dir_all(&data_dir).map_err(|e| anyhow::anyhow!("cannot create data directory {}: {e}", data_dir.display()))?;
            _owner = Some(crate::dir_lock::DirLock::acquire(&data_dir, "meta")?);
            config.kv.engine_spec(&data_dir)?
        }
    };
    let engine = fskv_kv::open_engine(&spec).map_err(|e| anyhow::anyhow!("cannot open the KV engine ({spec}): {e}"))?;
    let (storage, meta_config, routing, storage_note) = if args.mgmtd.is_empty() {
        let note = "no --mgmtd: file lengths from client reports only, no chunk GC".to_string();
        (Arc::new(NoStorage) as Arc<dyn StorageBackend>, MetaConfig::default(), None, note)
    } else {
        let (storage, config, source) = storage_from_mgmtd(args.mgmtd.clone(), args.mgmtd_wait_ms).await?;
        let note = format!("chain table {} with {} chains from mgmtd {:?}", config.chain_table_id, config.chains.len(), args.mgmtd);
        (storage, config, Some(source), note)
    };
    let service = MetaService::open(engine, storage, meta_config).await?;
    let server = service.serve(&args.listen).await?;
    println!("fskv meta: serving on {} (engine {}; {storage_note})", server.local_addr(), crate::mgmtd_cmd::redact(&spec));
    let registration = routing.as_ref().map(|source| {
        let reg = fskv_meta::mgmtd_link::MetaRegistration {
            node_id: fskv_types::NodeId(args.node_id),
            address: args.advertise.clone().unwrap_or_else(|| server.local_addr().to_string()),
            generation: crate::generation_now(),
            initial_interval_ms: 1_000,
        };
        tokio::spawn(fskv_meta::mgmtd_link::run_registration(source.client().clone(), reg))
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    println!("fskv meta: stopping");
    if let Some(task) = registration {
        task.abort();
    }
    server.shutdown().await;
    if let Some(source) = routing {
        source.stop();
    }
    Ok(())
}

pub async fn bench(args: MetaBenchArgs, config: &Config) -> anyhow::Result<()> {
    // An etcd run gets a key prefix of its own (the last `prefix=` wins),
    // removed afterwards.
    let engine_spec = args.engine.map(|spec| match spec.strip_prefix("etcd:") {
        Some(_) => {
            let sep = if spec.contains('?') { '&' } else { '?' };
            format!("{spec}{sep}prefix=fskv-bench-meta-{}-{}/", std::process::id(), crate::generation_now())
        }
        None => spec,
    });
    let opts = fskv_meta::bench::MetaBenchOptions {
        dir: args.dir,
        seconds: args.common.seconds,
        callers: args.callers,
        sync_writes: config.kv.sync_writes,
        batch_shards: args.batch_shards,
        engine_spec: engine_spec.clone(),
        ..Default::default()
    };
    eprintln!("bench meta: {} s per measurement, callers {:?} ...", opts.seconds, opts.callers);
    let report = fskv_meta::bench::run(opts).await;
    if let Some(spec) = engine_spec.filter(|s| s.starts_with("etcd:")) {
        let engine = fskv_kv::open_engine(&spec)?;
        let mut txn = engine.begin().await?;
        txn.clear_range(b"", &[0xff])?;
        txn.commit().await.map_err(|e| anyhow::anyhow!("removing the bench's keys from etcd: {e}"))?;
    }
    crate::bench::emit(&report?, args.common.json.as_ref())
}
