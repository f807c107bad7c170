//! `fskv bench storage`: 1 MiB chunk writes and reads and 4 KiB random
//! reads through a loopback chain of 3 targets (and of 1), next to iperf3
//! loopback and fio on the same disk measured in the same run.
//!
//! Every service runs in this process on its own loopback port; data moves
//! over real TCP connections (client → head → middle → tail) and every
//! target writes to its own chunk engine on the same disk. Replication
//! factor 3 therefore moves each byte over loopback 3 times and writes it to
//! the disk 3 times: the expected ceiling for chain-3 writes is
//! `min(iperf3, fio write) / 3` (both limits share the 2 CPUs here).

use crate::cluster::{ClusterOptions, LocalCluster};
use anyhow::Context;
use bytes::Bytes;
use fskv_chunk_engine::EngineConfig;
use fskv_client::storage::StorageClientConfig;
use fskv_types::{ChainId, ChunkId, InodeId, TargetId};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug)]
pub struct StorageBenchOptions {
    /// Parent directory on the disk to measure.
    pub dir: PathBuf,
    pub seconds_per_workload: f64,
    /// Distinct 1 MiB chunks written (then overwritten in a cycle).
    pub chunk_count: u64,
    /// Concurrent writers / 1 MiB readers.
    pub concurrent_large: usize,
    /// Concurrent 4 KiB readers.
    pub concurrent_small: usize,
    pub chain_lengths: Vec<usize>,
    pub run_iperf3: bool,
    pub run_fio: bool,
    /// Scrubber rate of every service (0 = off), scrubbing continuously
    /// (no pause between passes) while the workloads run.
    pub scrub_mib_per_sec: u64,
}

impl Default for StorageBenchOptions {
    fn default() -> Self {
        StorageBenchOptions {
            dir: PathBuf::from("."),
            seconds_per_workload: 5.0,
            chunk_count: 128,
            concurrent_large: 8,
            concurrent_small: 32,
            chain_lengths: vec![3, 1],
            run_iperf3: true,
            run_fio: true,
            scrub_mib_per_sec: 0,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ChainResult {
    pub chain_length: usize,
    pub write_1m_mib_per_sec: f64,
    pub read_1m_mib_per_sec: f64,
    pub randread_4k_iops: f64,
    pub write_p50_ms: f64,
    pub write_p99_ms: f64,
    /// Bytes the scrubbers verified per second over the chain's run (all
    /// targets); 0 without a scrubber.
    pub scrub_mib_per_sec_measured: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct StorageBenchReport {
    pub seconds_per_workload: f64,
    pub chunk_count: u64,
    pub chains: Vec<ChainResult>,
    pub iperf3_mib_per_sec: Option<f64>,
    pub iperf3_note: String,
    pub fio_write_1m_mib_per_sec: Option<f64>,
    pub fio_randread_4k_iops: Option<f64>,
    pub fio_version: Option<String>,
    /// `min(iperf3, fio write) / 3`: the write ceiling of replication factor 3.
    pub rf3_write_limit_mib_per_sec: Option<f64>,
    /// Chain-3 write throughput as a fraction of that ceiling.
    pub rf3_write_vs_limit: Option<f64>,
}

impl fmt::Display for StorageBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "storage bench: {} s per workload, {} x 1 MiB chunks, loopback TCP, engine sync_writes=off",
            self.seconds_per_workload, self.chunk_count
        )?;
        writeln!(
            f,
            "{:>6} {:>14} {:>14} {:>14} {:>10} {:>10} {:>13}",
            "chain", "write 1M MiB/s", "read 1M MiB/s", "4K rand IOPS", "w p50 ms", "w p99 ms", "scrub MiB/s"
        )?;
        for c in &self.chains {
            writeln!(
                f,
                "{:>6} {:>14.1} {:>14.1} {:>14.0} {:>10.2} {:>10.2} {:>13.1}",
                c.chain_length,
                c.write_1m_mib_per_sec,
                c.read_1m_mib_per_sec,
                c.randread_4k_iops,
                c.write_p50_ms,
                c.write_p99_ms,
                c.scrub_mib_per_sec_measured
            )?;
        }
        let opt = |v: Option<f64>, unit: &str| v.map_or("n/a".to_string(), |v| format!("{v:.1} {unit}"));
        writeln!(f, "iperf3 loopback (single stream): {} ({})", opt(self.iperf3_mib_per_sec, "MiB/s"), self.iperf3_note)?;
        writeln!(
            f,
            "fio same disk: 1 MiB seq write {}, 4 KiB randread {}",
            opt(self.fio_write_1m_mib_per_sec, "MiB/s"),
            opt(self.fio_randread_4k_iops, "IOPS")
        )?;
        write!(
            f,
            "RF3 write ceiling min(iperf3, fio)/3 = {}; chain-3 writes reach {}",
            opt(self.rf3_write_limit_mib_per_sec, "MiB/s"),
            self.rf3_write_vs_limit.map_or("n/a".into(), |r| format!("{:.0}% of it", r * 100.0))
        )
    }
}

pub async fn run(opts: StorageBenchOptions) -> anyhow::Result<StorageBenchReport> {
    let tmp = tempfile::Builder::new().prefix(".fskv-bench-storage-").tempdir_in(&opts.dir).context("bench dir")?;
    let mut chains = Vec::new();
    for &len in &opts.chain_lengths {
        let root = tmp.path().join(format!("chain-{len}"));
        chains.push(bench_chain(&root, len, &opts).await?);
        let _ = std::fs::remove_dir_all(&root);
    }
    let secs = opts.seconds_per_workload.ceil().max(1.0) as u64;
    let (iperf3_mib_per_sec, iperf3_note) = if opts.run_iperf3 {
        let r = fskv_rpc::bench::run_iperf3(secs).await;
        (r.mib_per_sec, format!("{}: {}", r.status, r.note))
    } else {
        (None, "skipped".into())
    };
    let (fio_version, fio_write, fio_rr) = if opts.run_fio {
        let dir = tmp.path().join("fio");
        std::fs::create_dir_all(&dir)?;
        let seconds = opts.seconds_per_workload;
        let size_bytes = opts.chunk_count * MIB;
        tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            use fskv_chunk_engine::bench::{ensure_fio, fio_job};
            let Some(version) = ensure_fio() else { return Ok((None, None, None)) };
            let w = fio_job(&dir, "data", "write", MIB, size_bytes, None, false)?;
            let r = fio_job(&dir, "data", "randread", 4096, size_bytes, Some(seconds), false)?;
            Ok((Some(version), Some(w.iops), Some(r.iops)))
        })
        .await??
    } else {
        (None, None, None)
    };
    let limit = match (iperf3_mib_per_sec, fio_write) {
        (Some(a), Some(b)) => Some(a.min(b) / 3.0),
        (Some(a), None) | (None, Some(a)) => Some(a / 3.0),
        _ => None,
    };
    let rf3 = chains.iter().find(|c| c.chain_length == 3).map(|c| c.write_1m_mib_per_sec);
    Ok(StorageBenchReport {
        seconds_per_workload: opts.seconds_per_workload,
        chunk_count: opts.chunk_count,
        chains,
        iperf3_mib_per_sec,
        iperf3_note,
        fio_write_1m_mib_per_sec: fio_write,
        fio_randread_4k_iops: fio_rr,
        fio_version,
        rf3_write_limit_mib_per_sec: limit,
        rf3_write_vs_limit: match (rf3, limit) {
            (Some(w), Some(l)) if l > 0.0 => Some(w / l),
            _ => None,
        },
    })
}

async fn bench_chain(root: &std::path::Path, len: usize, opts: &StorageBenchOptions) -> anyhow::Result<ChainResult> {
    let spec: Vec<(TargetId, usize)> = (0..len).map(|i| (TargetId(i as u64 + 1), i)).collect();
    let engine = EngineConfig { blocks_per_grow: 256, sync_writes: false, ..EngineConfig::default() };
    let options = ClusterOptions {
        scrub_bytes_per_sec: opts.scrub_mib_per_sec.saturating_mul(MIB),
        scrub_pause_between_passes_ms: 0,
        ..ClusterOptions::new(engine)
    };
    let cluster = LocalCluster::start(root, len, std::slice::from_ref(&spec), options).await?;
    let started = Instant::now();
    let client = cluster.client(StorageClientConfig { max_concurrent_senders: 16, ..Default::default() });
    let limit = Duration::from_secs_f64(opts.seconds_per_workload.max(0.2));
    let chain = ChainId(1);
    let count = opts.chunk_count.max(1);
    // Fill every chunk once (untimed), so reads have data and writes overwrite.
    let payload = Bytes::from((0..MIB).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    run_workers(opts.concurrent_large, Duration::from_secs(3600), Some(count), |w, n| {
        let (c, p) = (client.clone(), payload.clone());
        async move { c.write(chain, ChunkId::new(InodeId(1), n), 0, p).await.map(|_| MIB).map_err(|e| anyhow::anyhow!("{e} (writer {w})")) }
    })
    .await?;
    let (write_bytes, write_secs, mut lat) = run_workers(opts.concurrent_large, limit, None, |_, n| {
        let (c, p) = (client.clone(), payload.clone());
        async move { c.write(chain, ChunkId::new(InodeId(1), n % count), 0, p).await.map(|_| MIB).map_err(anyhow::Error::from) }
    })
    .await?;
    lat.sort_unstable();
    let (read_bytes, read_secs, _) = run_workers(opts.concurrent_large, limit, None, |_, n| {
        let c = client.clone();
        async move {
            let d = c.read(chain, ChunkId::new(InodeId(1), n % count), 0, MIB as u32, false).await?;
            anyhow::ensure!(d.data.len() as u64 == MIB, "short read");
            Ok(MIB)
        }
    })
    .await?;
    let seed = AtomicU64::new(7);
    let (rr_bytes, rr_secs, _) = run_workers(opts.concurrent_small, limit, None, |_, _| {
        let c = client.clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed.fetch_add(1, Ordering::Relaxed));
        let chunk = ChunkId::new(InodeId(1), rng.gen_range(0..count));
        let offset = rng.gen_range(0..MIB / 4096) * 4096;
        async move {
            let d = c.read(chain, chunk, offset, 4096, false).await?;
            Ok(d.data.len() as u64)
        }
    })
    .await?;
    let scrubbed: u64 =
        spec.iter().filter_map(|(t, node)| cluster.service(*node).and_then(|s| s.scrub_progress(*t))).map(|p| p.bytes_checked).sum();
    let scrub_secs = started.elapsed().as_secs_f64().max(1e-9);
    cluster.shutdown().await;
    let pct = |q: f64| lat.get(((lat.len().saturating_sub(1)) as f64 * q).round() as usize).copied().unwrap_or(0) as f64 / 1000.0;
    Ok(ChainResult {
        chain_length: len,
        write_1m_mib_per_sec: write_bytes as f64 / MIB as f64 / write_secs,
        read_1m_mib_per_sec: read_bytes as f64 / MIB as f64 / read_secs,
        randread_4k_iops: (rr_bytes / 4096) as f64 / rr_secs,
        write_p50_ms: pct(0.5),
        write_p99_ms: pct(0.99),
        scrub_mib_per_sec_measured: scrubbed as f64 / MIB as f64 / scrub_secs,
    })
}

/// Runs `workers` loops calling `op(worker, n)` with a shared counter `n`
/// until `limit` passes or `max_ops` ops were issued; returns bytes, seconds
/// and per-op latencies in µs.
async fn run_workers<F, Fut>(workers: usize, limit: Duration, max_ops: Option<u64>, op: F) -> anyhow::Result<(u64, f64, Vec<u64>)>
where
    F: Fn(usize, u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u64>>,
{
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let loops = (0..workers.max(1)).map(|w| {
        let (next, op) = (next.clone(), &op);
        async move {
            let mut bytes = 0u64;
            let mut lat = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if max_ops.is_some_and(|m| n >= m) || start.elapsed() >= limit {
                    return Ok::<_, anyhow::Error>((bytes, lat));
                }
                let t = Instant::now();
                bytes += op(w, n).await?;
                lat.push(t.elapsed().as_micros() as u64);
            }
        }
    });
    let results = futures::future::try_join_all(loops).await?;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let mut all = Vec::new();
    let mut total = 0;
    for (b, l) in results {
        total += b;
        all.extend(l);
    }
    Ok((total, secs, all))
}
