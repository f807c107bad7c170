//! `fskv bench …`: each benchmark prints its figures next to a baseline
//! measured in the same run, and optionally writes them as JSON.

use crate::config::Config;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// 1 MiB and 64 B RPC calls over loopback vs iperf3's single-stream loopback throughput.
    Rpc(RpcArgs),
    /// Small-transaction commits/s of the embedded KV engine vs raw RocksDB write batches.
    Kv(KvArgs),
    /// Chunk engine 4 KiB random reads, 1 MiB writes and 64 KiB appends vs fio on the same disk.
    Chunk(ChunkArgs),
    /// 1 MiB writes/reads and 4 KiB random reads through loopback chains of 3 and 1 targets vs iperf3 and fio.
    Storage(crate::storage_cmd::StorageBenchArgs),
    /// Meta creates/stats/readdir pages/renames per second over loopback RPC vs the KV engine's raw small commits.
    Meta(crate::meta_cmd::MetaBenchArgs),
    /// Real processes: kill -9 of a storage node -> writes flowing again, and re-sync MiB/s next to raw chain-3 writes.
    Failover(crate::failover_bench::FailoverBenchArgs),
    /// USRBIO 4 KiB random / 1 MiB sequential reads vs fio on the FUSE mount and the in-process native client (fresh fskv up --mount).
    Usrbio(crate::usrbio_bench::UsrbioBenchArgs),
    /// KV gateway 1 KiB put/get ops/s and p50/p99 (running fskv up clusters) vs Redis and etcd, batch get of 16 x 4 MiB vs iperf3.
    KvGateway(crate::kv_gateway_bench::KvGatewayBenchArgs),
    /// S3 4 KiB PUT/GET and 64 MiB GET through the front vs one gateway process; cold start; time to add a reader under a load step.
    Front(crate::front_bench::FrontBenchArgs),
    /// MQ gateway produce/consume msg/s and produce latency of a running fskv up vs NATS JetStream and Redis streams.
    Mq(crate::mq_bench::MqBenchArgs),
    /// Chunk-capability check per I/O: verify cold (HMAC) / warm (cache hit), and 4 KiB reads as client vs a user principal (running cluster).
    Caps(crate::caps_bench::CapsBenchArgs),
}

#[derive(Args)]
pub struct ChunkArgs {
    #[command(flatten)]
    common: Common,
    /// Parent directory on the disk to measure (not tmpfs); a temporary directory is made under it.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// MiB written (and read) per workload.
    #[arg(long, default_value_t = 48)]
    mib: u64,
    /// Rounds; the report gives the median of the per-round ratios.
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// Durable writes (engine sync_writes, fio fdatasync=1).
    #[arg(long)]
    sync: bool,
    /// Skip the fio baseline.
    #[arg(long)]
    no_fio: bool,
}

#[derive(Args)]
pub struct RpcArgs {
    #[command(flatten)]
    common: Common,
    /// Concurrent callers of the "many callers" runs.
    #[arg(long, default_value_t = 16)]
    callers: usize,
    /// Skip the iperf3 baseline.
    #[arg(long)]
    no_iperf3: bool,
    /// Also measure service identity's cost: connect latency and throughput with and without the cluster-key handshake, interleaved.
    #[arg(long)]
    auth: bool,
}

#[derive(Args)]
pub struct Common {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Args)]
pub struct KvArgs {
    #[command(flatten)]
    common: Common,
    /// Directory on the disk to measure (temporary databases are created and removed under it).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Concurrent committers to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    committers: Vec<usize>,
}

pub fn emit<T: std::fmt::Display + serde::Serialize>(report: &T, json: Option<&PathBuf>) -> anyhow::Result<()> {
    println!("{report}");
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(report)?)?;
    }
    Ok(())
}

pub async fn run(cmd: BenchCommand, config: &Config) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Rpc(a) => {
            let opts = fskv_rpc::bench::BenchOptions {
                seconds: a.common.seconds.ceil().max(1.0) as u64,
                concurrent_callers: a.callers.max(1),
                connections_per_addr: config.rpc.connections_per_peer,
                run_iperf3: !a.no_iperf3,
                auth_comparison: a.auth,
                ..Default::default()
            };
            eprintln!("bench rpc: {} s per measurement, 1 and {} callers ...", opts.seconds, opts.concurrent_callers);
            let report = fskv_rpc::bench::run(opts).await?;
            emit(&report, a.common.json.as_ref())
        }
        BenchCommand::Chunk(a) => {
            let opts = fskv_chunk_engine::bench::ChunkBenchOptions {
                dir: Some(a.dir),
                seconds_per_workload: a.common.seconds,
                data_bytes: a.mib.max(1) << 20,
                sync_writes: a.sync,
                run_fio: !a.no_fio,
                rounds: a.rounds.max(1),
            };
            eprintln!("bench chunk: {} MiB per workload, {} rounds ...", a.mib, opts.rounds);
            let report = tokio::task::spawn_blocking(move || fskv_chunk_engine::bench::run(opts)).await??;
            emit(&report, a.common.json.as_ref())
        }
        BenchCommand::Storage(a) => crate::storage_cmd::bench(a).await,
        BenchCommand::Failover(a) => crate::failover_bench::run(a).await,
        BenchCommand::Usrbio(a) => crate::usrbio_bench::run(a).await,
        BenchCommand::KvGateway(a) => crate::kv_gateway_bench::run(a).await,
        BenchCommand::Front(a) => crate::front_bench::run(a).await,
        BenchCommand::Mq(a) => crate::mq_bench::run(a).await,
        BenchCommand::Caps(a) => crate::caps_bench::run(a, config).await,
        BenchCommand::Kv(a) => {
            let opts = fskv_kv::bench::KvBenchOptions {
                dir: a.dir,
                seconds: a.common.seconds,
                committers: a.committers,
                sync_writes: config.kv.sync_writes,
            };
            eprintln!("bench kv: {} s per measurement, committers {:?} ...", opts.seconds, opts.committers);
            let report = fskv_kv::bench::run(opts).await?;
            emit(&report, a.common.json.as_ref())
        }
        BenchCommand::Meta(a) => crate::meta_cmd::bench(a, config).await,
    }
}
