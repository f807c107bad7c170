//! `fskv bench kv-gateway`: one load generator, the same concurrency and
//! value size against the KV gateway of running `fskv up` clusters (each
//! `--target NAME=DIR`, e.g. replication 3 and 1), Redis and etcd started
//! by the bench itself (temporary data directories, loopback ports), in one
//! run. Per concurrency and op (1 KiB puts, then gets), every target in
//! turn for `--seconds` (interleaved, so a change of the machine's load
//! hits all targets alike): ops/s, p50 and p99 latency. Then a batch get of 16 × 4 MiB values
//! (MiB/s) per KV target next to iperf3's single loopback stream.
//!
//! | target | put | get |
//! |---|---|---|
//! | KV gateway | `PUT /v1/kv/bench/<key>` (bearer token) | `GET /v1/kv/bench/<key>` |
//! | Redis | `SET` with `appendonly yes`, `appendfsync always` (every write on disk before the reply, as ours) | `GET` (reads are the same under any fsync policy) |
//! | etcd | v3 JSON gateway `POST /v3/kv/put` | `POST /v3/kv/range` (linearizable, etcd's default) |
//! | HTTP floor | the same requests as the KV gateway | answered by a bare hyper HTTP/1.1 server on its own 2-thread runtime with a fixed value: no auth, no routing, no storage — what any HTTP gateway with this client costs on this machine at least |
//!
//! Every worker has its own connection (HTTP keep-alive pool / one Redis
//! socket); a worker issues its next request when the previous answered.

use anyhow::Context;
use base64::Engine;
use bytes::Bytes;
use clap::Args;
use fskv_gateway_kv::client::{KvClient, PutOptions};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(Args)]
pub struct KvGatewayBenchArgs {
    #[command(flatten)]
    common: crate::bench::Common,
    /// A running `fskv up` to measure: NAME=DATA_DIR (its endpoints.json); repeat (e.g. r3=/tmp/a r1=/tmp/b).
    #[arg(long = "target", required = true)]
    targets: Vec<String>,
    /// Concurrencies to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Value size of the put/get runs.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Keys the get runs read (written first).
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Skip Redis.
    #[arg(long)]
    no_redis: bool,
    /// Skip etcd.
    #[arg(long)]
    no_etcd: bool,
    /// Skip the 16 x 4 MiB batch get and its iperf3 baseline.
    #[arg(long)]
    no_batch: bool,
    /// KV gateway only: spread the keys over this many namespaces (`bench-0`, ...; 1 = `bench`),
    /// to tell per-directory contention in meta from the rest.
    #[arg(long, default_value_t = 1)]
    namespaces: usize,
    /// Skip the HTTP floor (a bare HTTP server answering the KV requests with a fixed value).
    #[arg(long)]
    no_http_floor: bool,
    /// First loopback port for Redis / etcd (the HTTP floor takes the port 20 above).
    #[arg(long, default_value_t = 36_379)]
    baseline_port: u16,
}

#[derive(Clone, Debug, Serialize)]
struct Run {
    target: String,
    op: &'static str,
    concurrency: usize,
    ops_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    errors: u64,
}

#[derive(Debug, Serialize)]
struct BatchRun {
    target: String,
    mib_per_sec: f64,
    batches: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    value_bytes: usize,
    namespaces: usize,
    seconds: f64,
    runs: Vec<Run>,
    batch_get_16x4mib: Vec<BatchRun>,
    iperf3_mib_per_sec: Option<f64>,
    notes: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "KV gateway vs Redis vs etcd: {} B values, {} s per run, KV keys over {} namespace(s)",
            self.value_bytes, self.seconds, self.namespaces
        )?;
        writeln!(f, "{:<14} {:<4} {:>5} {:>11} {:>9} {:>9} {:>7}", "target", "op", "conc", "ops/s", "p50 us", "p99 us", "errors")?;
        for r in &self.runs {
            writeln!(
                f,
                "{:<14} {:<4} {:>5} {:>11.0} {:>9} {:>9} {:>7}",
                r.target, r.op, r.concurrency, r.ops_per_sec, r.p50_us, r.p99_us, r.errors
            )?;
        }
        for b in &self.batch_get_16x4mib {
            writeln!(f, "batch get 16 x 4 MiB  {:<14} {:>8.0} MiB/s ({} batches)", b.target, b.mib_per_sec, b.batches)?;
        }
        if let Some(i) = self.iperf3_mib_per_sec {
            writeln!(f, "iperf3 single stream loopback {i:.0} MiB/s")?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

/// One connection's worth of a target.
enum Conn {
    Kv(KvClient, usize),
    Redis(BufReader<TcpStream>),
    Etcd { http: Client<HttpConnector, Full<Bytes>>, base: String },
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

impl Conn {
    async fn put(&mut self, key: &[u8], value: &Bytes) -> anyhow::Result<()> {
        match self {
            Conn::Kv(c, n) => c.put(&ns_of(key, *n), key, value.clone(), &PutOptions::default()).await.map(drop).map_err(Into::into),
            Conn::Redis(s) => {
                let mut cmd = format!("*3\r\n$3\r\nSET\r\n${}\r\n", key.len()).into_bytes();
                cmd.extend_from_slice(key);
                cmd.extend_from_slice(format!("\r\n${}\r\n", value.len()).as_bytes());
                cmd.extend_from_slice(value);
                cmd.extend_from_slice(b"\r\n");
                s.get_mut().write_all(&cmd).await?;
                let mut line = String::new();
                s.read_line(&mut line).await?;
                anyhow::ensure!(line.starts_with("+OK"), "redis SET: {line:?}");
                Ok(())
            }
            Conn::Etcd { http, base } => {
                let body = serde_json::json!({ "key": b64(key), "value": b64(value) }).to_string();
                etcd_call(http, &format!("{base}/v3/kv/put"), body).await.map(drop)
            }
        }
    }

    async fn get(&mut self, key: &[u8], expect_len: usize) -> anyhow::Result<()> {
        match self {
            Conn::Kv(c, n) => {
                let v = c.get(&ns_of(key, *n), key).await?.context("missing key")?;
                anyhow::ensure!(v.bytes.len() == expect_len, "short value");
                Ok(())
            }
            Conn::Redis(s) => {
                let mut cmd = format!("*2\r\n$3\r\nGET\r\n${}\r\n", key.len()).into_bytes();
                cmd.extend_from_slice(key);
                cmd.extend_from_slice(b"\r\n");
                s.get_mut().write_all(&cmd).await?;
                let mut line = String::new();
                s.read_line(&mut line).await?;
                let n: usize =
                    line.trim().strip_prefix('$').and_then(|n| n.parse().ok()).with_context(|| format!("redis GET: {line:?}"))?;
                anyhow::ensure!(n == expect_len, "short value");
                let mut buf = vec![0u8; n + 2];
                s.read_exact(&mut buf).await?;
                Ok(())
            }
            Conn::Etcd { http, base } => {
                let body = serde_json::json!({ "key": b64(key) }).to_string();
                let v = etcd_call(http, &format!("{base}/v3/kv/range"), body).await?;
                anyhow::ensure!(v["kvs"][0]["value"].is_string(), "missing key");
                Ok(())
            }
        }
    }
}

/// The namespace of a key: `bench`, or `bench-<hash % n>` with `--namespaces n`.
fn ns_of(key: &[u8], n: usize) -> String {
    if n <= 1 {
        return "bench".into();
    }
    let h = key.iter().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(*b)));
    format!("bench-{}", h % n as u64)
}

async fn etcd_call(http: &Client<HttpConnector, Full<Bytes>>, url: &str, body: String) -> anyhow::Result<serde_json::Value> {
    let req = http::Request::post(url).header("content-type", "application/json").body(Full::new(Bytes::from(body)))?;
    let resp = tokio::time::timeout(Duration::from_secs(30), http.request(req)).await.context("etcd timed out")??;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    anyhow::ensure!(status.is_success(), "etcd {status}: {}", String::from_utf8_lossy(&bytes));
    Ok(serde_json::from_slice(&bytes)?)
}

/// How to open a connection to a target.
#[derive(Clone)]
enum Target {
    Kv {
        name: String,
        url: String,
        token: String,
        namespaces: usize,
    },
    Redis {
        port: u16,
    },
    Etcd {
        port: u16,
    },
    /// A KV-protocol target that is only an HTTP server ([`start_http_floor`]).
    Floor {
        url: String,
    },
}

impl Target {
    fn name(&self) -> String {
        match self {
            Target::Kv { name, .. } => format!("kv-{name}"),
            Target::Redis { .. } => "redis".into(),
            Target::Etcd { .. } => "etcd".into(),
            Target::Floor { .. } => "http-floor".into(),
        }
    }

    async fn connect(&self) -> anyhow::Result<Conn> {
        Ok(match self {
            Target::Kv { url, token, namespaces, .. } => {
                Conn::Kv(KvClient::new(url, Some(token.clone())).with_timeout_ms(30_000), *namespaces)
            }
            Target::Floor { url } => Conn::Kv(KvClient::new(url, Some("floor".into())).with_timeout_ms(30_000), 1),
            Target::Redis { port } => {
                let s = TcpStream::connect(("127.0.0.1", *port)).await?;
                s.set_nodelay(true)?;
                Conn::Redis(BufReader::new(s))
            }
            Target::Etcd { port } => {
                let mut c = HttpConnector::new();
                c.set_nodelay(true);
                Conn::Etcd { http: Client::builder(TokioExecutor::new()).build(c), base: format!("http://127.0.0.1:{port}") }
            }
        })
    }
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// `concurrency` workers doing `op` for `seconds`.
async fn load(target: &Target, op: &'static str, concurrency: usize, seconds: f64, keys: usize, value: Bytes) -> anyhow::Result<Run> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let mut conn = target.connect().await?;
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut i = w as u64 * 7919;
            while Instant::now() < deadline {
                i += 1;
                let key = format!("bench-{:08}", i % keys as u64).into_bytes();
                let t = Instant::now();
                let r = if op == "put" { conn.put(&key, &value).await } else { conn.get(&key, value.len()).await };
                match r {
                    Ok(()) => lat.push(t.elapsed().as_micros() as u64),
                    Err(e) => {
                        errors += 1;
                        if errors <= 3 {
                            eprintln!("{op}: {e:#}");
                        }
                    }
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await?;
        all.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    Ok(Run {
        target: target.name(),
        op,
        concurrency,
        ops_per_sec: all.len() as f64 / elapsed,
        p50_us: percentile(&all, 0.5),
        p99_us: percentile(&all, 0.99),
        errors,
    })
}

/// Writes every key the get runs read.
async fn fill(target: &Target, keys: usize, value: &Bytes) -> anyhow::Result<()> {
    let mut conns = Vec::new();
    for _ in 0..16 {
        conns.push(target.connect().await?);
    }
    let mut tasks = Vec::new();
    for (w, mut c) in conns.into_iter().enumerate() {
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..keys).step_by(16) {
                c.put(format!("bench-{i:08}").as_bytes(), &value).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The HTTP floor: a bare hyper HTTP/1.1 server on `port` with a runtime of
/// its own (two workers, as a gateway process has on this machine) that
/// answers every request with `value` and the headers the KV client reads
/// (`ETag`, `X-Kv-Index`); a request body is read and dropped. It stops
/// when the bench process exits.
fn start_http_floor(port: u16, value: Bytes) -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).with_context(|| format!("http floor: port {port}"))?;
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("http-floor").enable_all().build()?;
    std::thread::Builder::new().name("http-floor".into()).spawn(move || {
        rt.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                let value = value.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let value = value.clone();
                        async move {
                            req.into_body().collect().await?;
                            let mut resp = http::Response::new(Full::new(value));
                            let h = resp.headers_mut();
                            h.insert(http::header::ETAG, http::HeaderValue::from_static("\"1-1\""));
                            h.insert("x-kv-index", http::HeaderValue::from_static("1"));
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(sock);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                });
            }
        })
    })?;
    Ok(format!("http://127.0.0.1:{port}"))
}

/// A child process killed when dropped.
struct Child {
    process: tokio::process::Child,
    /// Removed after the process is killed.
    _dir: tempfile::TempDir,
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.start_kill();
    }
}

async fn wait_port(port: u16, what: &str) -> anyhow::Result<()> {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        anyhow::ensure!(start.elapsed() < Duration::from_secs(30), "{what} did not start on port {port}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn start_redis(port: u16) -> anyhow::Result<Child> {
    let dir = tempfile::tempdir()?;
    let child = tokio::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "always"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("redis-server (apt-get install redis-server)")?;
    let c = Child { process: child, _dir: dir };
    wait_port(port, "redis-server").await?;
    Ok(c)
}

async fn start_etcd(port: u16) -> anyhow::Result<Child> {
    let dir = tempfile::tempdir()?;
    let client = format!("http://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{}", port + 1);
    let child = tokio::process::Command::new("etcd")
        .arg("--data-dir")
        .arg(dir.path().join("etcd"))
        .args(["--listen-client-urls", &client, "--advertise-client-urls", &client, "--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer, "--initial-cluster", &format!("default={peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("etcd (apt-get install etcd-server)")?;
    let c = Child { process: child, _dir: dir };
    wait_port(port, "etcd").await?;
    // The JSON gateway answers once the member is ready.
    let mut probe = Target::Etcd { port }.connect().await?;
    let start = Instant::now();
    while probe.put(b"probe", &Bytes::from_static(b"1")).await.is_err() {
        anyhow::ensure!(start.elapsed() < Duration::from_secs(30), "etcd never accepted a put");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(c)
}

async fn batch_get(url: &str, token: &str, seconds: f64) -> anyhow::Result<(f64, u64)> {
    let c = KvClient::new(url, Some(token.to_string())).with_timeout_ms(120_000);
    let value = Bytes::from((0..4 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 11) as u8).collect::<Vec<u8>>());
    let keys: Vec<Vec<u8>> = (0..16).map(|i| format!("big-{i:02}").into_bytes()).collect();
    for k in &keys {
        c.put("bench", k, value.clone(), &PutOptions::default()).await?;
    }
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut n = 0;
    while start.elapsed().as_secs_f64() < seconds || n == 0 {
        let r = c.batch_get("bench", &refs).await?;
        anyhow::ensure!(r.ok == 16 && r.items.iter().all(|i| i.value.len() == 4 << 20), "batch get incomplete");
        bytes += r.items.iter().map(|i| i.value.len() as u64).sum::<u64>();
        n += 1;
    }
    Ok((bytes as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64(), n))
}

pub async fn run(args: KvGatewayBenchArgs) -> anyhow::Result<()> {
    let seconds = args.common.seconds;
    let value = Bytes::from(vec![b'v'; args.value_bytes]);
    let mut targets = Vec::new();
    for t in &args.targets {
        let (name, dir) = t.split_once('=').context("--target NAME=DATA_DIR")?;
        let path = PathBuf::from(dir).join("endpoints.json");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).with_context(|| format!("{}", path.display()))?)?;
        let url = v["kv"].as_str().context("no kv endpoint in endpoints.json")?.to_string();
        let token = v["bearer_token"].as_str().context("no bearer_token in endpoints.json")?.to_string();
        let c = KvClient::new(&url, Some(token.clone()));
        c.put_namespace("bench", &serde_json::json!({})).await?;
        for i in 0..args.namespaces {
            c.put_namespace(&format!("bench-{i}"), &serde_json::json!({})).await?;
        }
        targets.push(Target::Kv { name: name.to_string(), url, token, namespaces: args.namespaces });
    }
    let mut notes = Vec::new();
    let mut _children = Vec::new();
    if !args.no_redis {
        match start_redis(args.baseline_port).await {
            Ok(c) => {
                _children.push(c);
                targets.push(Target::Redis { port: args.baseline_port });
            }
            Err(e) => notes.push(format!("redis skipped: {e:#}")),
        }
    }
    if !args.no_etcd {
        match start_etcd(args.baseline_port + 10).await {
            Ok(c) => {
                _children.push(c);
                targets.push(Target::Etcd { port: args.baseline_port + 10 });
            }
            Err(e) => notes.push(format!("etcd skipped: {e:#}")),
        }
    }
    if !args.no_http_floor {
        match start_http_floor(args.baseline_port + 20, value.clone()) {
            Ok(url) => targets.push(Target::Floor { url }),
            Err(e) => notes.push(format!("http floor skipped: {e:#}")),
        }
    }
    let mut runs = Vec::new();
    for t in &targets {
        fill(t, args.keys, &value).await.with_context(|| format!("filling {}", t.name()))?;
    }
    // Interleaved: every target runs each (concurrency, op) slot back to back,
    // so a change of the machine's load hits all of them alike.
    for &c in &args.concurrency {
        for op in ["put", "get"] {
            for t in &targets {
                let r = load(t, op, c, seconds, args.keys, value.clone()).await?;
                eprintln!("{} {} c={} {:.0} ops/s p50 {} us p99 {} us", r.target, r.op, r.concurrency, r.ops_per_sec, r.p50_us, r.p99_us);
                runs.push(r);
            }
        }
    }
    let mut batches = Vec::new();
    let mut iperf3 = None;
    if !args.no_batch {
        for t in &targets {
            if let Target::Kv { url, token, .. } = t {
                let (mib, n) = batch_get(url, token, seconds).await?;
                batches.push(BatchRun { target: t.name(), mib_per_sec: mib, batches: n });
            }
        }
        let i = fskv_rpc::bench::run_iperf3(seconds.ceil().max(1.0) as u64).await;
        if i.mib_per_sec.is_none() {
            notes.push(format!("iperf3: {} {}", i.status, i.note));
        }
        iperf3 = i.mib_per_sec;
    }
    let report = Report {
        value_bytes: args.value_bytes,
        namespaces: args.namespaces,
        seconds,
        runs,
        batch_get_16x4mib: batches,
        iperf3_mib_per_sec: iperf3,
        notes,
    };
    crate::bench::emit(&report, args.common.json.as_ref())
}
