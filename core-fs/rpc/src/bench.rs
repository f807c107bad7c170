//! Loopback benchmark of the RPC layer against iperf3.
//!
//! [`run`] is self-contained: it starts an in-process server on
//! `127.0.0.1:0`, runs each scenario for `seconds` with a fresh client, then
//! measures single-stream iperf3 on loopback for the same duration. Loops are
//! bounded by time and by a maximum call count.
//!
//! With [`BenchOptions::auth_comparison`] it also measures the cost of
//! service identity ([`crate::auth`]): the same server and client with and
//! without a cluster key, interleaved (off, on, off, on, … so drift hits
//! both alike): connect latency (a fresh client's first small call: TCP
//! connect + handshake + one call) and small-call / 1 MiB-write throughput
//! on warm connections.

use crate::{CallOptions, ClientConfig, Method, Router, RpcClient, Server, ServerConfig, TcpTransport};
use anyhow::Context;
use bytes::Bytes;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const MIB: f64 = 1024.0 * 1024.0;
/// Safety bound on calls made by one caller in one scenario.
const MAX_CALLS_PER_CALLER: usize = 5_000_000;
/// Extra time given to an iperf3 client beyond its test duration.
const IPERF3_SLACK_SECS: u64 = 20;

/// Echoes the payload back.
struct BenchEcho;
impl Method for BenchEcho {
    const ID: u16 = 1;
    const NAME: &'static str = "bench.Echo";
    type Req = u64;
    type Resp = u64;
}

/// Swallows the payload, replies empty (the shape of a chunk write).
struct BenchWrite;
impl Method for BenchWrite {
    const ID: u16 = 2;
    const NAME: &'static str = "bench.Write";
    type Req = u64;
    type Resp = u64;
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Duration of each scenario and of the iperf3 run.
    pub seconds: u64,
    /// Concurrent callers for the "many callers" variants.
    pub concurrent_callers: usize,
    /// Bulk payload size.
    pub large_payload_bytes: usize,
    /// Payload size of the small-call scenario.
    pub small_payload_bytes: usize,
    /// Client connections per address.
    pub connections_per_addr: usize,
    /// Whether to measure iperf3 at all.
    pub run_iperf3: bool,
    /// Also compare every connection authenticated vs not (module doc).
    pub auth_comparison: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            seconds: 5,
            concurrent_callers: 16,
            large_payload_bytes: 1 << 20,
            small_payload_bytes: 64,
            connections_per_addr: 4,
            run_iperf3: true,
            auth_comparison: false,
        }
    }
}

/// One scenario's result.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub callers: usize,
    pub request_payload_bytes: usize,
    pub reply_payload_bytes: usize,
    pub calls: u64,
    pub errors: u64,
    pub elapsed_secs: f64,
    pub calls_per_sec: f64,
    /// Payload bytes moved per second, both directions counted.
    pub mib_per_sec: f64,
    pub p50_latency_us: u64,
    pub p99_latency_us: u64,
}

/// iperf3's single-stream loopback result.
#[derive(Clone, Debug, Serialize)]
pub struct Iperf3Report {
    /// "ok", "missing", "skipped" or "failed".
    pub status: String,
    pub mib_per_sec: Option<f64>,
    pub gbit_per_sec: Option<f64>,
    pub note: String,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub seconds_per_scenario: u64,
    pub scenarios: Vec<ScenarioReport>,
    pub iperf3: Iperf3Report,
    /// Best 1 MiB echo throughput (request + reply payload bytes) / iperf3.
    pub ratio_echo_both_directions_vs_iperf3: Option<f64>,
    /// Best 1 MiB write throughput (request payload only, one direction,
    /// the fair comparison with iperf3's one-direction stream) / iperf3.
    pub ratio_write_one_direction_vs_iperf3: Option<f64>,
    /// Authenticated vs not ([`BenchOptions::auth_comparison`]).
    pub auth: Option<AuthReport>,
}

/// The cost of the handshake: each figure without and with a cluster key.
#[derive(Clone, Debug, Serialize)]
pub struct AuthReport {
    /// Interleaved rounds.
    pub rounds: usize,
    pub connects_per_round: usize,
    pub connect_p50_us_off: u64,
    pub connect_p50_us_on: u64,
    pub connect_p99_us_off: u64,
    pub connect_p99_us_on: u64,
    /// Per round: (small calls/s off, on), (1 MiB write MiB/s off, on).
    pub small_calls_per_sec: Vec<(f64, f64)>,
    pub write_1mib_mib_per_sec: Vec<(f64, f64)>,
    /// Sum over rounds on / sum off.
    pub ratio_small_calls: f64,
    pub ratio_write_1mib: f64,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "fskv-rpc loopback bench, {} s per scenario", self.seconds_per_scenario)?;
        writeln!(
            f,
            "{:<12} {:>7} {:>9} {:>9} {:>11} {:>10} {:>9} {:>9} {:>6}",
            "scenario", "callers", "req B", "reply B", "calls/s", "MiB/s", "p50 us", "p99 us", "errors"
        )?;
        for s in &self.scenarios {
            writeln!(
                f,
                "{:<12} {:>7} {:>9} {:>9} {:>11.0} {:>10.1} {:>9} {:>9} {:>6}",
                s.name,
                s.callers,
                s.request_payload_bytes,
                s.reply_payload_bytes,
                s.calls_per_sec,
                s.mib_per_sec,
                s.p50_latency_us,
                s.p99_latency_us,
                s.errors
            )?;
        }
        match (self.iperf3.mib_per_sec, self.iperf3.gbit_per_sec) {
            (Some(mib), Some(gbit)) => writeln!(f, "iperf3 single stream: {mib:.1} MiB/s ({gbit:.2} Gbit/s)")?,
            _ => writeln!(f, "iperf3: {} ({})", self.iperf3.status, self.iperf3.note)?,
        }
        let ratio = |r: Option<f64>| r.map_or("n/a".to_string(), |r| format!("{r:.2}"));
        writeln!(f, "ratio 1 MiB write (one direction) / iperf3: {}   [goal >= 0.6]", ratio(self.ratio_write_one_direction_vs_iperf3))?;
        write!(f, "ratio 1 MiB echo (both directions) / iperf3: {}", ratio(self.ratio_echo_both_directions_vs_iperf3))?;
        if let Some(a) = &self.auth {
            writeln!(f)?;
            writeln!(f, "service identity (HMAC handshake) off vs on, {} interleaved rounds:", a.rounds)?;
            writeln!(
                f,
                "  connect + first call ({} per round): p50 {} us -> {} us, p99 {} us -> {} us",
                a.connects_per_round, a.connect_p50_us_off, a.connect_p50_us_on, a.connect_p99_us_off, a.connect_p99_us_on
            )?;
            for (i, ((s_off, s_on), (w_off, w_on))) in a.small_calls_per_sec.iter().zip(&a.write_1mib_mib_per_sec).enumerate() {
                writeln!(f, "  round {}: small {s_off:.0} -> {s_on:.0} calls/s, 1 MiB write {w_off:.1} -> {w_on:.1} MiB/s", i + 1)?;
            }
            write!(f, "  ratio on/off: small calls {:.3}, 1 MiB writes {:.3}", a.ratio_small_calls, a.ratio_write_1mib)?;
        }
        Ok(())
    }
}

/// Runs every scenario and iperf3; see the module docs.
pub async fn run(opts: BenchOptions) -> anyhow::Result<BenchReport> {
    let seconds = opts.seconds.max(1);
    let server = start_server(None).await?;
    let addr = server.local_addr().to_string();
    let large = opts.large_payload_bytes;
    let small = opts.small_payload_bytes;
    let shapes: [(&str, u16, usize, usize); 3] =
        [("echo_1mib", BenchEcho::ID, large, large), ("write_1mib", BenchWrite::ID, large, 0), ("small", BenchEcho::ID, small, small)];
    let mut scenarios = Vec::new();
    for (name, method_id, req_bytes, reply_bytes) in shapes {
        for callers in [1, opts.concurrent_callers.max(1)] {
            let scenario = Scenario { name, method_id, callers, req_bytes, reply_bytes, seconds };
            scenarios.push(run_scenario(&addr, &opts, scenario, None).await?);
        }
    }
    let auth = if opts.auth_comparison { Some(auth_comparison(&addr, &opts, seconds).await?) } else { None };
    server.shutdown().await;

    let iperf3 = if opts.run_iperf3 {
        run_iperf3(seconds).await
    } else {
        Iperf3Report { status: "skipped".into(), mib_per_sec: None, gbit_per_sec: None, note: "disabled by options".into() }
    };
    let best = |name: &str| {
        scenarios.iter().filter(|s| s.name == name).map(|s| s.mib_per_sec).fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))
    };
    let ratio = |rpc: Option<f64>| match (rpc, iperf3.mib_per_sec) {
        (Some(rpc), Some(ip)) if ip > 0.0 => Some(rpc / ip),
        _ => None,
    };
    Ok(BenchReport {
        seconds_per_scenario: seconds,
        ratio_echo_both_directions_vs_iperf3: ratio(best("echo_1mib")),
        ratio_write_one_direction_vs_iperf3: ratio(best("write_1mib")),
        scenarios,
        iperf3,
        auth,
    })
}

/// Rounds of the authenticated-vs-not comparison.
const AUTH_ROUNDS: usize = 3;
/// Fresh connections timed per round and mode.
const AUTH_CONNECTS_PER_ROUND: usize = 200;

/// The module doc's comparison; `plain_addr` serves without a key.
async fn auth_comparison(plain_addr: &str, opts: &BenchOptions, seconds: u64) -> anyhow::Result<AuthReport> {
    let key = Arc::new(crate::auth::ClusterKey::generate());
    let keyed = start_server(Some(key.clone())).await?;
    let keyed_addr = keyed.local_addr().to_string();
    let modes = [(plain_addr.to_string(), None), (keyed_addr, Some(key))];
    let (mut connect_off, mut connect_on) = (Vec::new(), Vec::new());
    let (mut small, mut write) = (Vec::new(), Vec::new());
    let per = (seconds / 2).max(1);
    let small_sc = Scenario {
        name: "small",
        method_id: BenchEcho::ID,
        callers: opts.concurrent_callers.max(1),
        req_bytes: opts.small_payload_bytes,
        reply_bytes: opts.small_payload_bytes,
        seconds: per,
    };
    let write_sc = Scenario {
        name: "write_1mib",
        method_id: BenchWrite::ID,
        callers: opts.concurrent_callers.max(1),
        req_bytes: opts.large_payload_bytes,
        reply_bytes: 0,
        seconds: per,
    };
    for _ in 0..AUTH_ROUNDS {
        let mut s = [0.0; 2];
        let mut w = [0.0; 2];
        for (i, (addr, key)) in modes.iter().enumerate() {
            let samples = if i == 0 { &mut connect_off } else { &mut connect_on };
            for _ in 0..AUTH_CONNECTS_PER_ROUND {
                let client = RpcClient::new(
                    Arc::new(TcpTransport::new()),
                    ClientConfig { connections_per_addr: 1, cluster_key: key.clone(), ..ClientConfig::default() },
                );
                let started = Instant::now();
                one_call(&client, addr, BenchEcho::ID, Bytes::from_static(b"x")).await.context("auth bench connect")?;
                samples.push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            s[i] = run_scenario(addr, opts, small_sc, key.clone()).await?.calls_per_sec;
            w[i] = run_scenario(addr, opts, write_sc, key.clone()).await?.mib_per_sec;
        }
        small.push((s[0], s[1]));
        write.push((w[0], w[1]));
    }
    keyed.shutdown().await;
    connect_off.sort_unstable();
    connect_on.sort_unstable();
    let ratio = |v: &[(f64, f64)]| {
        let (off, on) = v.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        if off > 0.0 {
            on / off
        } else {
            0.0
        }
    };
    Ok(AuthReport {
        rounds: AUTH_ROUNDS,
        connects_per_round: AUTH_CONNECTS_PER_ROUND,
        connect_p50_us_off: percentile(&connect_off, 0.50),
        connect_p50_us_on: percentile(&connect_on, 0.50),
        connect_p99_us_off: percentile(&connect_off, 0.99),
        connect_p99_us_on: percentile(&connect_on, 0.99),
        ratio_small_calls: ratio(&small),
        ratio_write_1mib: ratio(&write),
        small_calls_per_sec: small,
        write_1mib_mib_per_sec: write,
    })
}

async fn start_server(cluster_key: Option<Arc<crate::auth::ClusterKey>>) -> anyhow::Result<Server> {
    let router = Router::new().route::<BenchEcho, _, _>(|_ctx, n, payload| async move { Ok((n, payload)) }).route::<BenchWrite, _, _>(
        |_ctx, n, payload: Bytes| async move {
            std::hint::black_box(payload.len());
            Ok((n, Bytes::new()))
        },
    );
    let config = ServerConfig { cluster_key, ..ServerConfig::default() };
    Server::bind(Arc::new(TcpTransport::new()), "127.0.0.1:0", router, config).await.context("starting the bench server")
}

#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    method_id: u16,
    callers: usize,
    req_bytes: usize,
    reply_bytes: usize,
    seconds: u64,
}

#[derive(Default)]
struct CallerStats {
    calls: u64,
    errors: u64,
    latencies_us: Vec<u64>,
}

async fn run_scenario(
    addr: &str,
    opts: &BenchOptions,
    sc: Scenario,
    cluster_key: Option<Arc<crate::auth::ClusterKey>>,
) -> anyhow::Result<ScenarioReport> {
    let client = RpcClient::new(
        Arc::new(TcpTransport::new()),
        ClientConfig { connections_per_addr: opts.connections_per_addr.max(1), cluster_key, ..ClientConfig::default() },
    );
    let payload = Bytes::from(vec![0xA5u8; sc.req_bytes]);
    // Warm up: open the pool's connections and check the shape is right.
    for _ in 0..opts.connections_per_addr.max(1) {
        one_call(&client, addr, sc.method_id, payload.clone()).await.context("bench warm-up call")?;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(sc.seconds);
    let tasks: Vec<_> =
        (0..sc.callers).map(|_| tokio::spawn(caller_loop(client.clone(), addr.to_string(), sc.method_id, payload.clone(), end))).collect();
    let mut all = CallerStats::default();
    for task in tasks {
        let stats = task.await.context("bench caller task")?;
        all.calls += stats.calls;
        all.errors += stats.errors;
        all.latencies_us.extend(stats.latencies_us);
    }
    let elapsed_secs = start.elapsed().as_secs_f64().max(1e-9);
    all.latencies_us.sort_unstable();
    let bytes_per_call = (sc.req_bytes + sc.reply_bytes) as f64;
    Ok(ScenarioReport {
        name: sc.name.to_string(),
        callers: sc.callers,
        request_payload_bytes: sc.req_bytes,
        reply_payload_bytes: sc.reply_bytes,
        calls: all.calls,
        errors: all.errors,
        elapsed_secs,
        calls_per_sec: all.calls as f64 / elapsed_secs,
        mib_per_sec: all.calls as f64 * bytes_per_call / MIB / elapsed_secs,
        p50_latency_us: percentile(&all.latencies_us, 0.50),
        p99_latency_us: percentile(&all.latencies_us, 0.99),
    })
}

async fn caller_loop(client: RpcClient, addr: String, method_id: u16, payload: Bytes, end: Instant) -> CallerStats {
    let mut stats = CallerStats::default();
    while stats.latencies_us.len() < MAX_CALLS_PER_CALLER && Instant::now() < end {
        let t0 = Instant::now();
        match one_call(&client, &addr, method_id, payload.clone()).await {
            Ok(()) => {
                stats.calls += 1;
                stats.latencies_us.push(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            Err(_) => stats.errors += 1,
        }
        if stats.errors > 1000 {
            break;
        }
    }
    stats
}

async fn one_call(client: &RpcClient, addr: &str, method_id: u16, payload: Bytes) -> crate::error::Result<()> {
    let opts = CallOptions { timeout_ms: 10_000 };
    if method_id == BenchWrite::ID {
        client.call::<BenchWrite>(addr, &1, payload, opts).await.map(|_| ())
    } else {
        client.call::<BenchEcho>(addr, &1, payload, opts).await.map(|_| ())
    }
}

/// `sorted` must be sorted ascending.
fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(rank).copied().unwrap_or(0)
}

/// Single-stream iperf3 over 127.0.0.1 for `seconds` (installs iperf3 with
/// apt-get when missing and root). Other benches reuse it as their network baseline.
pub async fn run_iperf3(seconds: u64) -> Iperf3Report {
    let failed = |status: &str, note: String| Iperf3Report { status: status.into(), mib_per_sec: None, gbit_per_sec: None, note };
    if !iperf3_present().await {
        if !is_root().await {
            return failed("missing", "iperf3 not installed and not root; install it with apt-get install -y iperf3".into());
        }
        if let Err(e) = install_iperf3().await {
            return failed("missing", format!("apt-get install iperf3 failed: {e:#}"));
        }
    }
    match measure_iperf3(seconds).await {
        Ok(bits_per_sec) => Iperf3Report {
            status: "ok".into(),
            mib_per_sec: Some(bits_per_sec / 8.0 / MIB),
            gbit_per_sec: Some(bits_per_sec / 1e9),
            note: "single stream, 127.0.0.1, end.sum_received".into(),
        },
        Err(e) => failed("failed", format!("{e:#}")),
    }
}

async fn iperf3_present() -> bool {
    let probe = tokio::process::Command::new("iperf3")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    matches!(tokio::time::timeout(Duration::from_secs(10), probe).await, Ok(Ok(s)) if s.success())
}

async fn is_root() -> bool {
    let out = tokio::process::Command::new("id").arg("-u").output();
    matches!(tokio::time::timeout(Duration::from_secs(10), out).await, Ok(Ok(o)) if String::from_utf8_lossy(&o.stdout).trim() == "0")
}

async fn install_iperf3() -> anyhow::Result<()> {
    let status = tokio::process::Command::new("apt-get")
        .args(["install", "-y", "iperf3"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    let status = tokio::time::timeout(Duration::from_secs(300), status).await.context("apt-get timed out")??;
    anyhow::ensure!(status.success(), "apt-get exited with {status}");
    anyhow::ensure!(iperf3_present().await, "iperf3 still missing after install");
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Returns `end.sum_received.bits_per_second` of one single-stream run.
async fn measure_iperf3(seconds: u64) -> anyhow::Result<f64> {
    let port = free_port()?.to_string();
    let mut server = tokio::process::Command::new("iperf3")
        .args(["-s", "-1", "-p", &port])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting iperf3 -s")?;
    let secs = seconds.to_string();
    let mut last_err = String::new();
    // The server needs a moment to listen; a refused connect does not use up
    // its single (-1) session, so retry a bounded number of times.
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let client =
            tokio::process::Command::new("iperf3").args(["-c", "127.0.0.1", "-p", &port, "-t", &secs, "-J"]).kill_on_drop(true).output();
        let out = tokio::time::timeout(Duration::from_secs(seconds + IPERF3_SLACK_SECS), client)
            .await
            .context("iperf3 client timed out")?
            .context("running iperf3 -c")?;
        let json: serde_json::Value = match serde_json::from_slice(&out.stdout) {
            Ok(v) => v,
            Err(e) => {
                last_err = format!("unparseable iperf3 output: {e}");
                continue;
            }
        };
        if let Some(bps) = json.pointer("/end/sum_received/bits_per_second").and_then(|v| v.as_f64()) {
            let _ = tokio::time::timeout(Duration::from_secs(5), server.wait()).await;
            return Ok(bps);
        }
        last_err = json.get("error").and_then(|e| e.as_str()).unwrap_or("no end.sum_received in output").to_string();
        if !last_err.contains("connect") {
            break;
        }
    }
    let _ = server.kill().await;
    anyhow::bail!("iperf3 failed: {last_err}")
}
