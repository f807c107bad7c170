//! `fskv gateway s3|kv|mq --role reader|writer ...`: one gateway process.

use crate::config::Config;
use anyhow::Context;
use clap::{Args, Subcommand};
use fskv_client::file::{FsClient, FsClientConfig};
use fskv_gateway_s3::{GatewayConfig, KeyStore, Role};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Subcommand)]
pub enum GatewayCommand {
    /// The S3 gateway: buckets are directories under --root, objects are files.
    S3(S3Args),
    /// The KV gateway: namespaces are directories under --root, keys are files (docs/kv.md).
    Kv(KvArgs),
    /// The MQ gateway: topics, partitions, consumer groups and queues under --root (docs/mq.md).
    Mq(MqArgs),
}

/// What every gateway needs: the cluster, the keys, the region and TLS.
#[derive(Args)]
pub struct ClusterArgs {
    /// mgmtd address(es), `host:port`; repeat or separate with commas.
    #[arg(long, required = true, value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Meta server address(es), `host:port`; repeat or separate with commas.
    /// Optional: without it, the meta servers registered with mgmtd are used.
    #[arg(long, value_delimiter = ',')]
    meta: Vec<String>,
    /// JSON file with the access keys: {"access_key": .., "secret_key": ..} or a list of such objects
    /// (optional fields: user, tenant, bearer_token; see docs/gateway.md).
    #[arg(long)]
    credentials: PathBuf,
    /// Region expected in SigV4 signatures (S3 also reports it; MQ puts it in queue ARNs).
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Serve HTTPS: PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How often the user store (/.fskv-admin/users.json) is polled for changes: the bound on how long
    /// a revoked key keeps working.
    #[arg(long, default_value_t = fskv_gateway::auth::users::DEFAULT_POLL_INTERVAL_MS)]
    users_poll_ms: u64,
}

/// The keys of the user store, kept fresh while alive (dropping it stops the poll).
pub struct Users {
    pub keys: Arc<KeyStore>,
    _stop: tokio::sync::watch::Sender<bool>,
}

impl ClusterArgs {
    /// The key store (the cluster's user store, made from the credentials
    /// file on the first start; polled every `--users-poll-ms`) and a client
    /// of the cluster.
    async fn connect(&self) -> anyhow::Result<(Users, FsClient)> {
        anyhow::ensure!((10..=60_000).contains(&self.users_poll_ms), "--users-poll-ms {}: between 10 and 60000", self.users_poll_ms);
        let bootstrap =
            KeyStore::parse(&std::fs::read(&self.credentials).with_context(|| format!("reading {}", self.credentials.display()))?)
                .with_context(|| format!("{}", self.credentials.display()))?;
        let client = FsClient::connect(self.mgmtd.clone(), self.meta.clone(), FsClientConfig::default())
            .await
            .with_context(|| format!("connecting to mgmtd {:?} / meta {:?}", self.mgmtd, self.meta))?;
        let source = Arc::new(crate::users::ClusterUsers::new(client.clone()));
        let (stamp, db) = source.bootstrap(&bootstrap).await.context("loading the user store")?;
        let keys = Arc::new(KeyStore::new(Vec::new())?);
        db.install(&keys)?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let every = std::time::Duration::from_millis(self.users_poll_ms);
        tokio::spawn(fskv_gateway::auth::users::watch(source, Arc::clone(&keys), Some(stamp), every, stop_rx));
        Ok((Users { keys, _stop: stop }, client))
    }

    /// (certificate, key) when serving HTTPS.
    fn tls(&self) -> Option<(PathBuf, PathBuf)> {
        self.tls_cert.clone().zip(self.tls_key.clone())
    }
}

#[derive(Args)]
pub struct MqArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// reader (fetch, offsets, describe; mutations get 403 naming --writer-endpoint) or writer (everything).
    #[arg(long, default_value = "writer")]
    role: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9002")]
    listen: SocketAddr,
    /// Filesystem directory holding topics/ and groups/ (created if missing).
    #[arg(long, default_value = "/mq")]
    root: String,
    /// The writer endpoint a reader names when it refuses a mutation.
    #[arg(long)]
    writer_endpoint: Option<String>,
    /// This writer's id in partition leases: a restart with the same id takes its partitions back at once;
    /// another id waits for the lease to expire (or forces a takeover).
    #[arg(long)]
    writer_id: Option<String>,
    /// How long a partition lease lasts without renewal.
    #[arg(long, default_value_t = 10_000)]
    lease_ms: u64,
    /// The public URL of this gateway (SQS queue URLs); empty: from the Host header.
    #[arg(long, default_value = "")]
    public_url: String,
}

#[derive(Args)]
pub struct KvArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// reader (get/head/exists/scan/watch; writes get 403 naming --writer-endpoint) or writer (everything).
    #[arg(long, default_value = "writer")]
    role: String,
    /// Address of the native KV API.
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: SocketAddr,
    /// Address of the Consul-compatible API (not served without it).
    #[arg(long)]
    consul_listen: Option<SocketAddr>,
    /// Serve only the Consul API, on --listen (no native API): how the front starts its Consul pools.
    #[arg(long, conflicts_with = "consul_listen")]
    consul_only: bool,
    /// The namespace Consul keys live in.
    #[arg(long, default_value = "consul")]
    consul_namespace: String,
    /// Filesystem directory whose subdirectories are the namespaces (created if missing).
    #[arg(long, default_value = "/kv")]
    root: String,
    /// The native writer endpoint a reader names when it refuses a write.
    #[arg(long)]
    writer_endpoint: Option<String>,
    /// The Consul writer endpoint a reader names when it refuses a write.
    #[arg(long)]
    consul_writer_endpoint: Option<String>,
    /// Do not run the writer's background work (eviction, TTL expiry, stats); for a second writer.
    #[arg(long)]
    no_maintenance: bool,
    /// Largest value of one PUT, in bytes.
    #[arg(long)]
    max_value_bytes: Option<u64>,
}

#[derive(Args)]
pub struct S3Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// reader (GET/HEAD/LIST only; writes get 403 naming --writer-endpoint) or writer (everything).
    #[arg(long, default_value = "writer")]
    role: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Filesystem directory whose subdirectories are the buckets (a writer creates it).
    #[arg(long, default_value = "/s3")]
    root: String,
    /// The writer endpoint a reader names when it refuses a write.
    #[arg(long)]
    writer_endpoint: Option<String>,
}

pub async fn run(cmd: GatewayCommand, config: &Config) -> anyhow::Result<()> {
    let args = match cmd {
        GatewayCommand::S3(args) => args,
        GatewayCommand::Kv(args) => return run_kv(args, config).await,
        GatewayCommand::Mq(args) => return run_mq(args, config).await,
    };
    let role: Role = args.role.parse().map_err(anyhow::Error::msg)?;
    let (users, client) = args.cluster.connect().await?;
    let mut cfg = GatewayConfig::new(args.listen, role, Arc::clone(&users.keys));
    cfg.root_path = args.root;
    cfg.region = args.cluster.region.clone();
    cfg.writer_endpoint = args.writer_endpoint;
    cfg.http = config.gateway.clone();
    cfg.virtual_host_domains = config.s3.virtual_host_domains.clone();
    anyhow::ensure!(
        config.s3.lifecycle_day_ms >= 1 && config.s3.lifecycle_max_actions_per_second >= 1,
        "[s3] lifecycle_day_ms and lifecycle_max_actions_per_second must be at least 1"
    );
    cfg.limits.lifecycle_scan_interval_ms = config.s3.lifecycle_scan_interval_ms;
    cfg.limits.lifecycle_max_actions_per_second = config.s3.lifecycle_max_actions_per_second;
    cfg.limits.lifecycle_day_ms = config.s3.lifecycle_day_ms;
    if let Some((cert_path, key_path)) = args.cluster.tls() {
        cfg.tls = Some(fskv_gateway_s3::config::TlsFiles { cert_path, key_path });
    }
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let handle = fskv_gateway_s3::start(cfg, client.clone()).await.map_err(anyhow::Error::msg)?;
    println!("S3 gateway ({}) serving on {scheme}://{}", args.role, handle.addr);
    let _ = std::io::stdout().flush();
    crate::storage_cmd::wait_for_signal().await;
    handle.stop().await;
    drop(users);
    client.shutdown();
    Ok(())
}

async fn run_kv(args: KvArgs, config: &Config) -> anyhow::Result<()> {
    let role: fskv_gateway_kv::config::Role = args.role.parse().map_err(anyhow::Error::msg)?;
    let (users, client) = args.cluster.connect().await?;
    let mut cfg = fskv_gateway_kv::KvConfig::new(args.listen, role, Arc::clone(&users.keys));
    cfg.consul_listen = args.consul_listen;
    cfg.consul_only = args.consul_only;
    cfg.consul_namespace = args.consul_namespace;
    cfg.root_path = args.root;
    cfg.region = args.cluster.region.clone();
    cfg.writer_endpoint = args.writer_endpoint;
    cfg.consul_writer_endpoint = args.consul_writer_endpoint;
    cfg.maintenance.enabled = !args.no_maintenance;
    if let Some(max) = args.max_value_bytes {
        cfg.limits.max_value_bytes = max;
    }
    cfg.http = config.gateway.clone();
    if let Some((cert_path, key_path)) = args.cluster.tls() {
        cfg.tls = Some(fskv_gateway_kv::config::TlsFiles { cert_path, key_path });
    }
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let handle = fskv_gateway_kv::start(cfg, client.clone()).await.map_err(anyhow::Error::msg)?;
    match handle.consul_addr {
        Some(c) if args.consul_only => println!("KV gateway ({}) serving the Consul API only on {scheme}://{c}", args.role),
        Some(c) => println!("KV gateway ({}) serving on {scheme}://{} (Consul API on {scheme}://{c})", args.role, handle.addr),
        None => println!("KV gateway ({}) serving on {scheme}://{}", args.role, handle.addr),
    }
    let _ = std::io::stdout().flush();
    crate::storage_cmd::wait_for_signal().await;
    handle.stop().await;
    drop(users);
    client.shutdown();
    Ok(())
}

async fn run_mq(args: MqArgs, config: &Config) -> anyhow::Result<()> {
    let role: Role = args.role.parse().map_err(anyhow::Error::msg)?;
    let (users, client) = args.cluster.connect().await?;
    let mut cfg = fskv_gateway_mq::MqConfig::new(args.listen, role, Arc::clone(&users.keys));
    cfg.root_path = args.root;
    cfg.region = args.cluster.region.clone();
    cfg.writer_endpoint = args.writer_endpoint;
    cfg.http = config.gateway.clone();
    cfg.public_url = args.public_url;
    anyhow::ensure!(args.lease_ms >= 1000, "--lease-ms {}: at least 1000", args.lease_ms);
    cfg.writer.lease_ms = args.lease_ms;
    cfg.writer.writer_id = args.writer_id.unwrap_or_else(|| format!("mq-{}", args.listen));
    if let Some((cert_path, key_path)) = args.cluster.tls() {
        cfg.tls = Some(fskv_gateway_s3::config::TlsFiles { cert_path, key_path });
    }
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    // Named in the partition leases (DescribeTopic, another writer's refusal):
    // the public URL when there is one (behind the front, `--listen` is a
    // private port, 127.0.0.1:0).
    cfg.writer.endpoint = if cfg.public_url.is_empty() { format!("{scheme}://{}", args.listen) } else { cfg.public_url.clone() };
    let handle = fskv_gateway_mq::start(cfg, client.clone()).await.map_err(anyhow::Error::msg)?;
    println!("MQ gateway ({}) serving on {scheme}://{}", args.role, handle.addr);
    let _ = std::io::stdout().flush();
    crate::storage_cmd::wait_for_signal().await;
    handle.stop().await;
    drop(users);
    client.shutdown();
    Ok(())
}
