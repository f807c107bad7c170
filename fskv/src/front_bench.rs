//! `fskv bench front`: what the front costs, on real processes of one
//! fresh `fskv up` (this binary), in one run.
//!
//! | figure | through the front | baseline (same run) |
//! |---|---|---|
//! | S3 4 KiB PUT ops/s | `fskv up`'s front on P: one writer process (`[front.s3]` writer max 1) | one `fskv gateway s3 --role writer` process, straight |
//! | S3 4 KiB GET ops/s | same front: one reader process (reader max 1) | the same direct gateway |
//! | S3 64 MiB GET MiB/s | same | same |
//! | KV 1 KiB GET ops/s | `fskv up`'s front on P+1: one KV reader process (`[front.kv]` reader max 1) | one `fskv gateway kv --role reader` process, straight |
//! | cold start | a fresh `fskv front` (empty pools): signed GET sent → first byte of its response (the reader process is spawned meanwhile); also the first PUT (writer pool) | — (goal ≤ 300 ms) |
//! | time to add a reader | a fresh `fskv front` (reader max 4, default scale settings) serving 1 client; then a step to `--step-clients` clients: step → a second reader `ready` in `/status` | — (`scale_up_after_ms` is part of it by design) |
//!
//! The throughput workloads run `--rounds` times, each round measuring the
//! front and the direct gateway back to back (the order alternating per
//! round); the report gives per-round figures, each side's median and the
//! ratio of the medians. Every request is signed with SigV4 (header,
//! `UNSIGNED-PAYLOAD`; service `s3` or `kv`) by this process for both sides; failed requests are
//! counted (the goal is zero). Pools keep their processes for the whole run
//! (`idle_timeout_ms` 10 min), so cold starts are not in the throughput.
//! Every measurement opens its own connections, so through the front each is
//! handed over (`[front] hand_over_connections`, the default) to a process
//! of the pool its first request goes to; the report gives the connections
//! the front handed over and proxied.

use anyhow::{bail, Context};
use aws_sigv4::http_request::{sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings};
use bytes::Bytes;
use clap::Args;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde::Serialize;
use std::fmt;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

const MIB: f64 = (1u64 << 20) as f64;
/// Bound on any one request of the benchmark.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Small objects read by the GET workload (and 1 KiB KV values by the KV one).
const SMALL_OBJECTS: usize = 256;
/// Size of the KV values read by `kvget1k`.
const KV_VALUE_BYTES: usize = 1024;

#[derive(Args)]
pub struct FrontBenchArgs {
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rounds of every throughput workload (front and direct back to back, order alternating).
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// Requests in flight for the 4 KiB workloads.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Concurrent 64 MiB GET streams (one object each).
    #[arg(long, default_value_t = 2)]
    large_streams: usize,
    /// Size of the large objects, MiB.
    #[arg(long, default_value_t = 64)]
    large_mib: u64,
    /// Cold starts measured (a fresh front each).
    #[arg(long, default_value_t = 5)]
    cold_starts: usize,
    /// Load steps measured (a fresh front each).
    #[arg(long, default_value_t = 3)]
    load_steps: usize,
    /// Clients after the load step (1 before it).
    #[arg(long, default_value_t = 64)]
    step_clients: usize,
    /// Parent directory of the cluster's data (removed at the end).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// First base port tried (`fskv up --base-port`).
    #[arg(long, default_value_t = 27100)]
    base_port: u16,
    /// Throughput workloads to run: put4k, get4k, get-large (S3), kvget1k (KV native API).
    #[arg(long, value_delimiter = ',', default_value = "put4k,get4k,get-large,kvget1k")]
    workloads: Vec<String>,
    /// Run the `fskv up` front without connection handover
    /// (`[front] hand_over_connections = false`: every request proxied), the
    /// baseline of what handover changes.
    #[arg(long)]
    proxy_only: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// The `fskv up` front of the throughput runs: one process per pool, kept.
const UP_CONFIG: &str = "[front]\nidle_timeout_ms = 600000\n\n[front.s3]\nreader = { min = 0, max = 1 }\nwriter = { min = 0, max = 1 }\n\n\
                         [front.kv]\nreader = { min = 0, max = 1 }\nwriter = { min = 0, max = 1 }\n";
/// The fronts of the cold starts and load steps: the defaults, reader max 4.
const SCALE_CONFIG: &str =
    "[front]\nidle_timeout_ms = 600000\n\n[front.s3]\nreader = { min = 0, max = 4 }\nwriter = { min = 0, max = 1 }\n";

/// One throughput measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Throughput {
    pub target: String,
    pub workload: String,
    pub round: u64,
    pub ops_per_sec: f64,
    pub mib_per_sec: f64,
    pub errors: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub workload: String,
    /// `ops/s` or `MiB/s`.
    pub unit: String,
    pub front_median: f64,
    pub direct_median: f64,
    pub ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ColdStart {
    /// Signed GET sent to a fresh front → first byte of the response.
    pub first_get_ms: f64,
    /// Then the first PUT (the writer pool is still empty) → its response.
    pub first_put_ms: f64,
    /// The reader pool's own figure: spawn → the gateway reports its address.
    pub reader_spawn_to_ready_ms: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LoadStep {
    /// Step (1 → N clients) → a second reader `ready`.
    pub add_reader_ms: f64,
    /// The reader pool's start of that process (spawn → ready).
    pub spawn_to_ready_ms: Option<f64>,
    /// Readers at the end of the step.
    pub readers_after: usize,
    pub requests: u64,
    pub errors: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct FrontBenchReport {
    pub seconds: f64,
    pub concurrency: usize,
    pub large_streams: usize,
    pub large_mib: u64,
    pub step_clients: usize,
    pub throughput: Vec<Throughput>,
    pub summary: Vec<Summary>,
    pub cold_starts: Vec<ColdStart>,
    pub load_steps: Vec<LoadStep>,
    /// Client connections the `fskv up` front handed over to its gateway
    /// processes during the throughput runs (its `/metrics`).
    pub handed_over_connections: f64,
    pub errors: Vec<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl fmt::Display for FrontBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "front vs one gateway process, {} s per measurement, {} in flight (4 KiB), {} × {} MiB streams",
            self.seconds, self.concurrency, self.large_streams, self.large_mib
        )?;
        writeln!(f, "| workload | front (median) | direct (median) | front / direct | rounds: front / direct |")?;
        writeln!(f, "|---|---|---|---|---|")?;
        for s in &self.summary {
            let per_round: Vec<String> = self
                .throughput
                .iter()
                .filter(|t| t.workload == s.workload && t.target == "front")
                .map(|t| {
                    let d = self.throughput.iter().find(|d| d.workload == t.workload && d.round == t.round && d.target == "direct");
                    let val = |x: &Throughput| if s.unit == "MiB/s" { x.mib_per_sec } else { x.ops_per_sec };
                    format!("{:.0} / {:.0}", val(t), d.map_or(0.0, val))
                })
                .collect();
            writeln!(
                f,
                "| {} | {:.0} {} | {:.0} {} | **{:.2}** | {} |",
                s.workload,
                s.front_median,
                s.unit,
                s.direct_median,
                s.unit,
                s.ratio,
                per_round.join("; ")
            )?;
        }
        let errors: u64 = self.throughput.iter().map(|t| t.errors).sum();
        writeln!(f, "failed requests in the throughput runs: {errors}")?;
        writeln!(f, "client connections the front handed over to its gateway processes: {}", self.handed_over_connections)?;
        if !self.cold_starts.is_empty() {
            self.fmt_cold_starts(f)?;
        }
        if !self.load_steps.is_empty() {
            self.fmt_load_steps(f)?;
        }
        if !self.errors.is_empty() {
            writeln!(f, "first errors: {:?}", self.errors)?;
        }
        Ok(())
    }
}

fn list(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ")
}

impl FrontBenchReport {
    fn fmt_cold_starts(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gets: Vec<f64> = self.cold_starts.iter().map(|c| c.first_get_ms).collect();
        let puts: Vec<f64> = self.cold_starts.iter().map(|c| c.first_put_ms).collect();
        let spawn: Vec<f64> = self.cold_starts.iter().filter_map(|c| c.reader_spawn_to_ready_ms).collect();
        writeln!(
            f,
            "cold start (first byte of the first GET to an empty reader pool): median {:.0} ms, max {:.0} ms [{}]",
            median(gets.clone()),
            gets.iter().copied().fold(0.0, f64::max),
            list(&gets)
        )?;
        writeln!(f, "  of which the reader process spawn → ready: median {:.0} ms [{}]", median(spawn.clone()), list(&spawn))?;
        writeln!(f, "  first PUT to an empty writer pool: median {:.0} ms [{}]", median(puts.clone()), list(&puts))
    }

    fn fmt_load_steps(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let adds: Vec<f64> = self.load_steps.iter().map(|s| s.add_reader_ms).collect();
        let step_spawn: Vec<f64> = self.load_steps.iter().filter_map(|s| s.spawn_to_ready_ms).collect();
        writeln!(
            f,
            "time to add a reader (1 → {} clients → second reader ready): median {:.0} ms [{}]; its spawn → ready [{}]",
            self.step_clients,
            median(adds.clone()),
            list(&adds),
            list(&step_spawn)
        )?;
        for s in &self.load_steps {
            writeln!(f, "  step: {} requests, {} failed, {} readers at the end", s.requests, s.errors, s.readers_after)?;
        }
        Ok(())
    }
}

/// A signing client (S3 path style or the KV native API; `UNSIGNED-PAYLOAD`).
#[derive(Clone)]
struct S3 {
    ak: String,
    sk: String,
    /// The SigV4 service: `s3` or `kv`.
    service: &'static str,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl S3 {
    fn new(ak: &str, sk: &str) -> S3 {
        S3 { ak: ak.to_string(), sk: sk.to_string(), service: "s3", client: S3::client() }
    }

    fn client() -> Client<HttpConnector, Full<Bytes>> {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        Client::builder(hyper_util::rt::TokioExecutor::new()).pool_max_idle_per_host(1024).build(conn)
    }

    /// The same keys and service with a client of its own (no pooled connection).
    fn fresh(&self) -> S3 {
        S3 { client: S3::client(), ..self.clone() }
    }

    /// The same client signing for another service (`kv`).
    fn for_service(&self, service: &'static str) -> S3 {
        S3 { service, ..self.clone() }
    }

    fn request(&self, host: &str, method: &Method, target: &str, body: Bytes) -> anyhow::Result<Request<Full<Bytes>>> {
        let creds = aws_credential_types::Credentials::new(&self.ak, &self.sk, None, None, "bench");
        let identity = creds.into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name(self.service)
            .time(SystemTime::now())
            .settings(settings)
            .build()?
            .into();
        let signable = SignableRequest::new(method.as_str(), target, [("host", host)].into_iter(), SignableBody::UnsignedPayload)?;
        let (instr, _) = sign(signable, &params)?.into_parts();
        let mut req = Request::builder().method(method.clone()).uri(format!("http://{host}{target}")).header("host", host);
        for (k, v) in instr.headers() {
            req = req.header(k, v);
        }
        Ok(req.body(Full::new(body))?)
    }

    /// Sends a request; reads the whole response body (counting its bytes).
    /// Returns the bytes and the time to the first byte of the response.
    async fn send(&self, host: &str, method: Method, target: &str, body: Bytes) -> Result<(u64, Duration), String> {
        let req = self.request(host, &method, target, body).map_err(|e| format!("signing: {e}"))?;
        let start = Instant::now();
        let run = async {
            let resp = self.client.request(req).await.map_err(|e| format!("{method} {target}: {e}"))?;
            let status = resp.status();
            let mut body = resp.into_body();
            let mut first: Option<Duration> = None;
            let mut n = 0u64;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| format!("{method} {target}: body: {e}"))?;
                first.get_or_insert_with(|| start.elapsed());
                n += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            if !status.is_success() {
                return Err(format!("{method} {target}: {status}"));
            }
            Ok((n, first.unwrap_or_else(|| start.elapsed())))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, run).await.map_err(|_| format!("{method} {target}: no answer in {REQUEST_TIMEOUT:?}"))?
    }
}

/// A child process, stopped (SIGTERM, then SIGKILL after 30 s) on drop.
struct Proc {
    child: Child,
}

impl Proc {
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SAFETY: SIGTERM to our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_base(start: u16) -> u16 {
    let mut base = start;
    while base < 40_000 {
        if (0..16).all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok()) {
            return base;
        }
        base += 20;
    }
    start
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until `addr` accepts connections (or the process exits).
async fn wait_listening(p: &mut Proc, addr: &str, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if let Ok(Some(s)) = p.child.try_wait() {
            bail!("{what} exited ({s}) before listening on {addr}");
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on {addr} within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

fn start_up(exe: &Path, data: &Path, base: u16, config: &Path) -> anyhow::Result<Proc> {
    let mut child = Command::new(exe)
        .arg("--config")
        .arg(config)
        .args(["up", "--base-port", &base.to_string(), "--data"])
        .arg(data)
        .env("FSKV_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning fskv up")?;
    let stdout = child.stdout.take().context("stdout of fskv up")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let up = Proc { child };
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(line) if line.contains("serving; Ctrl-C") => return Ok(up),
            Ok(_) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => bail!("fskv up exited before it was ready"),
            Err(_) if Instant::now() < deadline => {}
            Err(_) => bail!("fskv up was not ready within 180 s"),
        }
    }
}

/// What a cluster's extra processes need.
struct Cluster {
    exe: PathBuf,
    data: PathBuf,
    mgmtd: String,
    credentials: PathBuf,
}

impl Cluster {
    /// A fresh `fskv front` with empty pools: (process, S3 address, admin address).
    async fn front(&self, config: &Path) -> anyhow::Result<(Proc, String, String)> {
        let (s3, admin) = (format!("127.0.0.1:{}", free_port()?), format!("127.0.0.1:{}", free_port()?));
        let child = Command::new(&self.exe)
            .arg("--config")
            .arg(config)
            .args(["front", "--s3-listen", &s3, "--admin-listen", &admin, "--mgmtd", &self.mgmtd, "--credentials"])
            .arg(&self.credentials)
            .arg("--log-dir")
            .arg(self.data.join("logs"))
            // Its gateway processes inherit it: services refuse to start without the cluster key.
            .env("FSKV_CLUSTER_KEY_FILE", self.data.join("cluster.key"))
            .env("FSKV_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning fskv front")?;
        let mut p = Proc { child };
        wait_listening(&mut p, &s3, "fskv front").await?;
        wait_listening(&mut p, &admin, "fskv front").await?;
        Ok((p, s3, admin))
    }

    /// One `fskv gateway s3 --role writer` (serves reads too).
    async fn gateway(&self, config: &Path) -> anyhow::Result<(Proc, String)> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(self.data.join("logs/bench-direct-gateway.log"))?;
        let child = Command::new(&self.exe)
            .arg("--config")
            .arg(config)
            .args(["gateway", "s3", "--role", "writer", "--listen", &addr, "--mgmtd", &self.mgmtd, "--credentials"])
            .arg(&self.credentials)
            .env("FSKV_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("spawning fskv gateway s3")?;
        let mut p = Proc { child };
        wait_listening(&mut p, &addr, "fskv gateway s3").await?;
        Ok((p, addr))
    }

    /// One `fskv gateway kv --role reader` (what serves KV reads behind the front too).
    async fn kv_gateway(&self, config: &Path) -> anyhow::Result<(Proc, String)> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(self.data.join("logs/bench-direct-kv-gateway.log"))?;
        let child = Command::new(&self.exe)
            .arg("--config")
            .arg(config)
            .args(["gateway", "kv", "--role", "reader", "--listen", &addr, "--mgmtd", &self.mgmtd, "--credentials"])
            .arg(&self.credentials)
            .env("FSKV_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("spawning fskv gateway kv")?;
        let mut p = Proc { child };
        wait_listening(&mut p, &addr, "fskv gateway kv").await?;
        Ok((p, addr))
    }
}

/// `clients` tasks run `op(task, n)` until `dur` has passed: (ops, bytes, errors, elapsed, first errors).
async fn drive<F, Fut>(clients: usize, dur: Duration, op: F) -> (u64, u64, u64, Duration, Vec<String>)
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<u64, String>> + Send,
{
    let ops = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_errors = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let start = Instant::now();
    let end = start + dur;
    let mut tasks = Vec::new();
    for task in 0..clients {
        let (op, ops, bytes, errors, first_errors) = (op.clone(), ops.clone(), bytes.clone(), errors.clone(), first_errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < end {
                n += 1;
                match op(task, n).await {
                    Ok(b) => {
                        ops.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(b, Ordering::Relaxed);
                    }
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let mut fe = first_errors.lock();
                        if fe.len() < 5 {
                            fe.push(e);
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed();
    let fe = std::mem::take(&mut *first_errors.lock());
    (ops.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed), errors.load(Ordering::Relaxed), elapsed, fe)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    Put4k,
    Get4k,
    GetLarge,
    KvGet1k,
}

impl Workload {
    fn name(self, large_mib: u64) -> String {
        match self {
            Workload::Put4k => "S3 PUT 4 KiB".into(),
            Workload::Get4k => "S3 GET 4 KiB".into(),
            Workload::GetLarge => format!("S3 GET {large_mib} MiB"),
            Workload::KvGet1k => "KV GET 1 KiB".into(),
        }
    }

    fn is_kv(self) -> bool {
        self == Workload::KvGet1k
    }
}

async fn measure(
    s3: &S3,
    host: &str,
    target: &str,
    w: Workload,
    round: u64,
    args: &FrontBenchArgs,
    errors: &mut Vec<String>,
) -> Throughput {
    let dur = Duration::from_secs_f64(args.seconds);
    // New connections per measurement: through the front, each is handed
    // over to a process of the pool its first request (this workload's) goes to.
    let (s3c, h) = (s3.fresh(), host.to_string());
    let small = Bytes::from(vec![0x5au8; 4096]);
    let tag = format!("{target}{round}");
    let (ops, bytes, errs, elapsed, first) = match w {
        Workload::Put4k => {
            drive(args.concurrency, dur, move |task, n| {
                let (s3, h, small, key) = (s3c.clone(), h.clone(), small.clone(), format!("/fbench/p-{tag}-{task}-{n}"));
                async move { s3.send(&h, Method::PUT, &key, small).await.map(|_| 4096) }
            })
            .await
        }
        Workload::Get4k => {
            drive(args.concurrency, dur, move |task, n| {
                let (s3, h) = (s3c.clone(), h.clone());
                let key = format!("/fbench/s{}", (task as u64 * 7919 + n) % SMALL_OBJECTS as u64);
                async move { s3.send(&h, Method::GET, &key, Bytes::new()).await.map(|(b, _)| b) }
            })
            .await
        }
        Workload::KvGet1k => {
            let kv = s3c.for_service("kv");
            drive(args.concurrency, dur, move |task, n| {
                let (kv, h) = (kv.clone(), h.clone());
                let key = format!("/v1/kv/fbench/k{}", (task as u64 * 7919 + n) % SMALL_OBJECTS as u64);
                async move {
                    let (b, _) = kv.send(&h, Method::GET, &key, Bytes::new()).await?;
                    if b != KV_VALUE_BYTES as u64 {
                        return Err(format!("GET {key}: {b} bytes, not {KV_VALUE_BYTES}"));
                    }
                    Ok(b)
                }
            })
            .await
        }
        Workload::GetLarge => {
            let want = args.large_mib << 20;
            drive(args.large_streams, dur, move |task, _| {
                let (s3, h, key) = (s3c.clone(), h.clone(), format!("/fbench/big{task}"));
                async move {
                    let (b, _) = s3.send(&h, Method::GET, &key, Bytes::new()).await?;
                    if b != want {
                        return Err(format!("GET {key}: {b} bytes, not {want}"));
                    }
                    Ok(b)
                }
            })
            .await
        }
    };
    errors.extend(first.into_iter().map(|e| format!("{target}: {e}")));
    let secs = elapsed.as_secs_f64();
    let t = Throughput {
        target: target.to_string(),
        workload: w.name(args.large_mib),
        round,
        ops_per_sec: ops as f64 / secs,
        mib_per_sec: bytes as f64 / MIB / secs,
        errors: errs,
    };
    eprintln!("  round {round} {:<14} {:<6} {:>9.0} ops/s {:>8.1} MiB/s  errors {errs}", t.workload, target, t.ops_per_sec, t.mib_per_sec);
    t
}

async fn cold_start(c: &Cluster, s3: &S3, config: &Path) -> anyhow::Result<ColdStart> {
    let (mut front, host, admin) = c.front(config).await?;
    let (_, first_get) = s3.send(&host, Method::GET, "/fbench/s0", Bytes::new()).await.map_err(anyhow::Error::msg)?;
    let put_start = Instant::now();
    s3.send(&host, Method::PUT, "/fbench/cold-put", Bytes::from_static(b"cold")).await.map_err(anyhow::Error::msg)?;
    let first_put = put_start.elapsed();
    let st = fskv_front::admin::fetch_status(&admin, Duration::from_secs(5)).await.map_err(anyhow::Error::msg)?;
    let spawn = st.pools.iter().find(|p| p.role == "reader").and_then(|p| p.last_cold_start_ms);
    front.stop();
    Ok(ColdStart { first_get_ms: ms(first_get), first_put_ms: ms(first_put), reader_spawn_to_ready_ms: spawn })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn load_step(c: &Cluster, s3: &S3, config: &Path, clients: usize) -> anyhow::Result<LoadStep> {
    let (mut front, host, admin) = c.front(config).await?;
    let get = {
        let (s3, host) = (s3.clone(), host.clone());
        move |task: usize, n: u64| {
            let (s3, host) = (s3.clone(), host.clone());
            let key = format!("/fbench/s{}", (task as u64 * 7919 + n) % SMALL_OBJECTS as u64);
            async move { s3.send(&host, Method::GET, &key, Bytes::new()).await.map(|(b, _)| b) }
        }
    };
    // One client: the first reader starts and serves.
    let (ops0, _, err0, _, _) = drive(1, Duration::from_millis(1500), get.clone()).await;
    let ready_readers = |st: &fskv_front::admin::FrontStatus| {
        st.pools.iter().find(|p| p.role == "reader").map_or(0, |p| p.processes.iter().filter(|x| x.state == "ready").count())
    };
    let st = fskv_front::admin::fetch_status(&admin, Duration::from_secs(5)).await.map_err(anyhow::Error::msg)?;
    if ready_readers(&st) != 1 {
        bail!("before the step the reader pool has {} ready processes, not 1", ready_readers(&st));
    }
    let step = Instant::now();
    let load = tokio::spawn(drive(clients, Duration::from_secs(4), get));
    let mut added = None;
    while step.elapsed() < Duration::from_secs(4) {
        let st = fskv_front::admin::fetch_status(&admin, Duration::from_secs(5)).await.map_err(anyhow::Error::msg)?;
        if ready_readers(&st) >= 2 {
            added = Some(step.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (ops1, _, err1, _, _) = load.await?;
    let st = fskv_front::admin::fetch_status(&admin, Duration::from_secs(5)).await.map_err(anyhow::Error::msg)?;
    let readers = st.pools.iter().find(|p| p.role == "reader");
    let spawn = readers.and_then(|p| p.last_cold_start_ms);
    let readers_after = readers.map_or(0, |p| p.processes.iter().filter(|x| x.state == "ready").count());
    front.stop();
    let Some(added) = added else { bail!("no second reader within 4 s of a step to {clients} clients") };
    Ok(LoadStep { add_reader_ms: ms(added), spawn_to_ready_ms: spawn, readers_after, requests: ops0 + ops1, errors: err0 + err1 })
}

pub async fn run(args: FrontBenchArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("the fskv binary")?;
    let work = args.dir.join(format!("front-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let result = bench(&args, &exe, &work).await;
    let _ = std::fs::remove_dir_all(&work);
    let report = result?;
    crate::bench::emit(&report, args.json.as_ref())
}

async fn bench(args: &FrontBenchArgs, exe: &Path, work: &Path) -> anyhow::Result<FrontBenchReport> {
    let (up_cfg, scale_cfg) = (work.join("up.toml"), work.join("scale.toml"));
    let up_config = if args.proxy_only {
        UP_CONFIG.replacen("[front]\n", "[front]\nhand_over_connections = false\n", 1)
    } else {
        UP_CONFIG.to_string()
    };
    std::fs::write(&up_cfg, up_config)?;
    std::fs::write(&scale_cfg, SCALE_CONFIG)?;
    let data = work.join("data");
    let base = free_base(args.base_port);
    eprintln!("bench front: fskv up on base port {base} ...");
    let up = start_up(exe, &data, base, &up_cfg)?;
    let endpoints: serde_json::Value = serde_json::from_slice(&std::fs::read(data.join("endpoints.json"))?)?;
    let key = |k: &str| endpoints[k].as_str().map(str::to_string).with_context(|| format!("endpoints.json has no {k}"));
    let s3 = S3::new(&key("access_key")?, &key("secret_key")?);
    let cluster = Cluster {
        exe: exe.to_path_buf(),
        data: data.clone(),
        mgmtd: format!("127.0.0.1:{}", base + 11),
        credentials: data.join("credentials.json"),
    };
    let mut workloads = Vec::new();
    for w in &args.workloads {
        workloads.push(match w.as_str() {
            "put4k" => Workload::Put4k,
            "get4k" => Workload::Get4k,
            "get-large" => Workload::GetLarge,
            "kvget1k" => Workload::KvGet1k,
            other => bail!("--workloads: unknown workload {other:?} (put4k, get4k, get-large, kvget1k)"),
        });
    }
    let with_s3 = workloads.iter().any(|w| !w.is_kv()) || args.cold_starts > 0 || args.load_steps > 0;
    let with_kv = workloads.iter().any(|w| w.is_kv());
    let effective = data.join("effective-config.toml");
    let front = format!("127.0.0.1:{base}");
    let kv_front = format!("127.0.0.1:{}", base + 1);
    let must = |r: Result<(u64, Duration), String>| r.map_err(anyhow::Error::msg);
    let mut direct = String::new();
    let mut direct_proc = None;
    if with_s3 {
        let (p, addr) = cluster.gateway(&effective).await?;
        (direct_proc, direct) = (Some(p), addr);
        // Data: a bucket, the small objects, one large object per stream.
        must(s3.send(&front, Method::PUT, "/fbench", Bytes::new()).await)?;
        let small = Bytes::from(vec![0xa5u8; 4096]);
        for i in 0..SMALL_OBJECTS {
            must(s3.send(&front, Method::PUT, &format!("/fbench/s{i}"), small.clone()).await)?;
        }
        if workloads.contains(&Workload::GetLarge) {
            let large = Bytes::from((0..args.large_mib << 20).map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8).collect::<Vec<u8>>());
            for i in 0..args.large_streams {
                must(s3.send(&front, Method::PUT, &format!("/fbench/big{i}"), large.clone()).await)?;
            }
        }
        // Warm both sides (the front's reader process starts here, connections open).
        for host in [&front, &direct] {
            for i in 0..32 {
                must(s3.send(host, Method::GET, &format!("/fbench/s{i}"), Bytes::new()).await)?;
            }
        }
    }
    let mut kv_direct = String::new();
    let mut kv_direct_proc = None;
    if with_kv {
        let kv = s3.for_service("kv");
        // The namespace and the values, through the front's KV writer.
        must(kv.send(&kv_front, Method::PUT, "/v1/ns/fbench", Bytes::new()).await)?;
        let value = Bytes::from((0..KV_VALUE_BYTES).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>());
        for i in 0..SMALL_OBJECTS {
            must(kv.send(&kv_front, Method::PUT, &format!("/v1/kv/fbench/k{i}"), value.clone()).await)?;
        }
        let (p, addr) = cluster.kv_gateway(&effective).await?;
        (kv_direct_proc, kv_direct) = (Some(p), addr);
        for host in [&kv_front, &kv_direct] {
            for i in 0..32 {
                must(kv.send(host, Method::GET, &format!("/v1/kv/fbench/k{i}"), Bytes::new()).await)?;
            }
        }
    }

    let mut errors = Vec::new();
    let mut throughput = Vec::new();
    for round in 1..=args.rounds {
        for &w in &workloads {
            let (f, d) = if w.is_kv() { (&kv_front, &kv_direct) } else { (&front, &direct) };
            let order: [(&str, &str); 2] = if round % 2 == 1 { [("front", f), ("direct", d)] } else { [("direct", d), ("front", f)] };
            for (name, host) in order {
                throughput.push(measure(&s3, host, name, w, round, args, &mut errors).await);
            }
        }
    }
    let handed_over_connections = handed_over(&front).await;
    eprintln!("bench front: the front handed {handed_over_connections} client connections over to its gateway processes");
    let mut summary = Vec::new();
    for &w in &workloads {
        let name = w.name(args.large_mib);
        let unit = if w == Workload::GetLarge { "MiB/s" } else { "ops/s" };
        let pick = |target: &str| {
            median(
                throughput
                    .iter()
                    .filter(|t| t.workload == name && t.target == target)
                    .map(|t| if w == Workload::GetLarge { t.mib_per_sec } else { t.ops_per_sec })
                    .collect(),
            )
        };
        let (f, d) = (pick("front"), pick("direct"));
        summary.push(Summary {
            workload: name,
            unit: unit.into(),
            front_median: f,
            direct_median: d,
            ratio: if d > 0.0 { f / d } else { 0.0 },
        });
    }
    drop(direct_proc);
    drop(kv_direct_proc);

    eprintln!("bench front: {} cold starts ...", args.cold_starts);
    let mut cold_starts = Vec::new();
    for _ in 0..args.cold_starts {
        let c = cold_start(&cluster, &s3, &scale_cfg).await?;
        eprintln!(
            "  cold start: first GET {:.0} ms (spawn → ready {:?} ms), first PUT {:.0} ms",
            c.first_get_ms, c.reader_spawn_to_ready_ms, c.first_put_ms
        );
        cold_starts.push(c);
    }
    eprintln!("bench front: {} load steps (1 → {} clients) ...", args.load_steps, args.step_clients);
    let mut load_steps = Vec::new();
    for _ in 0..args.load_steps {
        let s = load_step(&cluster, &s3, &scale_cfg, args.step_clients).await?;
        eprintln!("  load step: second reader ready after {:.0} ms; {} requests, {} failed", s.add_reader_ms, s.requests, s.errors);
        load_steps.push(s);
    }
    drop(up);
    Ok(FrontBenchReport {
        seconds: args.seconds,
        concurrency: args.concurrency,
        large_streams: args.large_streams,
        large_mib: args.large_mib,
        step_clients: args.step_clients,
        throughput,
        summary,
        cold_starts,
        load_steps,
        handed_over_connections,
        errors,
    })
}

/// `fskv_gateway_front_handed_over_total`, summed over the pools, from the
/// front listener's `/metrics` (0 when it cannot be read).
async fn handed_over(host: &str) -> f64 {
    let Ok(text) = fskv_rpc::http::scrape(host, REQUEST_TIMEOUT).await else { return 0.0 };
    let name = "fskv_gateway_front_handed_over_total{";
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}
