//! `fskv bench caps`: what storage's chunk-capability check costs per I/O
//! (docs/security.md, "Chunk capabilities"; numbers in docs/BENCHMARKS.md).
//!
//! | measurement | what |
//! |---|---|
//! | verify, cold | `ChunkCap::authentic` + `covers`: one HMAC-SHA256 (a connection's first request with a capability) |
//! | verify, warm | `CapCache::check` on a cached capability: mutex, hash lookup, compare, clock read (every later request) |
//! | end to end | 4 KiB random reads of one file through the native client of a running cluster, as `client` (no check) and as a `user:` principal (a capability on every request), interleaved rounds, same process |
//!
//! The user principal is `user:0:0` (derived from the cluster key in this
//! process), so it may read the root-made file and pays the checks only.

use crate::config::Config;
use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use fskv_client::file::{FileHandle, FsClient, FsClientConfig, OpenFlags};
use fskv_rpc::auth::ClusterKey;
use fskv_rpc::ClientConfig;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct CapsBenchArgs {
    /// mgmtd address(es) of a running cluster (`fskv up`: P+11).
    #[arg(long, required = true, value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Size of the file read, MiB (written once as `client`).
    #[arg(long, default_value_t = 64)]
    file_mib: u64,
    /// 4 KiB reads per principal per round.
    #[arg(long, default_value_t = 20_000)]
    reads: u64,
    /// Reads in flight per principal.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Rounds (client, then user, alternately); the report gives medians.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Iterations of each micro-benchmark.
    #[arg(long, default_value_t = 200_000)]
    micro_iterations: u64,
    /// Path of the test file in the cluster (replaced).
    #[arg(long, default_value = "/caps-bench.dat")]
    path: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

async fn read_round(handle: &FileHandle, reads: u64, concurrency: usize, file_bytes: u64, seed: u64) -> anyhow::Result<f64> {
    use futures::StreamExt;
    let blocks = (file_bytes / 4096).max(1);
    let started = Instant::now();
    let mut stream = futures::stream::iter((0..reads).map(|i| {
        // SplitMix-style spread of the block index.
        let x = (seed ^ i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let offset = ((x >> 17) % blocks) * 4096;
        async move { handle.read_at(offset, 4096).await.map(|d| d.len()) }
    }))
    .buffer_unordered(concurrency.max(1));
    while let Some(r) = stream.next().await {
        anyhow::ensure!(r? == 4096, "a short read");
    }
    Ok(reads as f64 / started.elapsed().as_secs_f64())
}

pub async fn run(a: CapsBenchArgs, config: &Config) -> anyhow::Result<()> {
    let key_file = &config.security.cluster_key_file;
    anyhow::ensure!(!key_file.as_os_str().is_empty(), "fskv bench caps needs the cluster key: pass --cluster-key-file FILE");
    let key = ClusterKey::load(key_file).map_err(anyhow::Error::msg)?;
    eprintln!("bench caps: micro-benchmarks, {} iterations each ...", a.micro_iterations);
    let iterations = a.micro_iterations;
    let (cold_ns, warm_ns) = tokio::task::spawn_blocking(move || fskv_storage::access::measure_check_ns(iterations)).await?;
    println!("verify cold (HMAC-SHA256 + coverage): {cold_ns:.0} ns/op");
    println!("verify warm (per-connection cache hit): {warm_ns:.0} ns/op");

    let as_principal =
        |name: &str, k: ClusterKey| ClientConfig { cluster_key: Some(Arc::new(k)), principal: name.into(), ..ClientConfig::default() };
    let fs_config = FsClientConfig { max_inflight_chunks: a.concurrency.max(1), ..FsClientConfig::default() };
    let client = FsClient::connect_with(a.mgmtd.clone(), Vec::new(), fs_config.clone(), as_principal("client", key.clone()))
        .await
        .context("connecting as client")?;
    let user_name = "user:0:0";
    let user = FsClient::connect_with(a.mgmtd.clone(), Vec::new(), fs_config, as_principal(user_name, key.derive_user_key(user_name)))
        .await
        .context("connecting as a user principal")?;
    let file_bytes = a.file_mib.max(1) << 20;
    eprintln!("bench caps: writing {} MiB to {} as client ...", a.file_mib, a.path);
    {
        let w = client.open(&a.path, OpenFlags::create_truncate()).await?;
        let block = Bytes::from(vec![0x5au8; 8 << 20]);
        let mut off = 0u64;
        while off < file_bytes {
            let n = (file_bytes - off).min(block.len() as u64);
            w.write_at(off, block.slice(..n as usize)).await?;
            off += n;
        }
        w.close().await?;
    }
    let hc = client.open(&a.path, OpenFlags::read_only()).await?;
    let hu = user.open(&a.path, OpenFlags::read_only()).await?;
    // Warm both (connections, capability).
    read_round(&hc, 500, a.concurrency, file_bytes, 1).await?;
    read_round(&hu, 500, a.concurrency, file_bytes, 1).await?;
    let (mut rc, mut ru) = (Vec::new(), Vec::new());
    for round in 0..a.rounds.max(1) {
        let seed = u64::from(round) * 7919;
        let c = read_round(&hc, a.reads, a.concurrency, file_bytes, seed).await?;
        let u = read_round(&hu, a.reads, a.concurrency, file_bytes, seed + 1).await?;
        eprintln!("round {round}: client {c:.0} reads/s, {user_name} {u:.0} reads/s ({:.3})", u / c);
        rc.push(c);
        ru.push(u);
    }
    let ratios: Vec<f64> = rc.iter().zip(&ru).map(|(c, u)| u / c).collect();
    let (mc, mu, mr) = (median(rc), median(ru), median(ratios));
    println!("4 KiB random reads, {} in flight, {} rounds x {} reads:", a.concurrency, a.rounds, a.reads);
    println!("  as client (no capability): {mc:.0} reads/s (median)");
    println!("  as {user_name} (capability on every request): {mu:.0} reads/s (median)");
    println!("  ratio user/client: {mr:.3} (median of per-round ratios)");
    hc.close().await?;
    hu.close().await?;
    client.meta().unlink(client.meta().resolve("/").await?.id, a.path.trim_start_matches('/')).await.ok();
    client.shutdown();
    user.shutdown();
    Ok(())
}
