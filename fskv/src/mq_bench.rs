//! `fskv bench mq`: produce-with-ack and consume (fetch + commit) msg/s and
//! produce latency of the MQ gateway of a running `fskv up`, next to NATS
//! JetStream (file storage; `sync_interval: always` when the nats-server
//! supports it, and its default, labelled) and Redis streams (`appendfsync
//! always`), started here on loopback with their data on the same disk.
//!
//! Same client shape for every system: `--clients` closed-loop clients, each
//! with its own connection and its own partition / subject / stream; a
//! produce is a batch of `B` messages of `--size` bytes acknowledged as a
//! whole (ours: one produce request; NATS: B pipelined publishes, then their
//! B acks; Redis: B pipelined XADDs); a consume step fetches up to B
//! messages and commits past them (ours: one poll that commits past the
//! previous step's messages and fetches the next, or with `--consume-with
//! fetch-commit` a fetch, then a group commit; NATS: pull
//! `MSG.NEXT` of B, then a synchronous ack of the last (AckAll); Redis:
//! XREADGROUP COUNT B + XACK of their ids). The protocol clients are
//! minimal hand-written ones (HTTP/1.1 + SigV4, NATS text protocol, RESP)
//! so no system pays for a heavier client than another.

use anyhow::{anyhow, bail, Context};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(Args)]
pub struct MqBenchArgs {
    /// Data directory of a running `fskv up` (its endpoints.json names the MQ gateway and the keys).
    #[arg(long)]
    data: PathBuf,
    /// Concurrent clients (each its own connection and partition / subject / stream).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Message size in bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Batch sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,100")]
    batches: Vec<usize>,
    /// Seconds of producing per measurement (consuming reads what was produced, bounded by the same time).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Directory for the baselines' data (same disk as the cluster's).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Path of the nats-server binary (skipped when missing).
    #[arg(long, default_value = "nats-server")]
    nats_server: String,
    /// Path of the redis-server binary (skipped when missing).
    #[arg(long, default_value = "redis-server")]
    redis_server: String,
    /// Only our gateway.
    #[arg(long)]
    no_baselines: bool,
    /// Label for the report (e.g. "r1", "r3").
    #[arg(long, default_value = "")]
    label: String,
    /// How our consumer consumes: `poll` (one `POST /v1/groups/<g>/poll` a
    /// step: commits past the previous step's messages and fetches the
    /// next; the last commit after the loop, timed) or `fetch-commit` (a
    /// fetch, then a commit, a step).
    #[arg(long, value_enum, default_value_t = ConsumeWith::Poll)]
    consume_with: ConsumeWith,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ConsumeWith {
    Poll,
    FetchCommit,
}

#[derive(Clone, Debug, serde::Serialize)]
struct Figures {
    system: String,
    batch: usize,
    produce_msgs_per_s: f64,
    produce_p50_ms: f64,
    produce_p99_ms: f64,
    consume_msgs_per_s: f64,
    produced: u64,
    consumed: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One system under test: per client, a produce step and a consume step.
trait System: Send + Sync + 'static {
    fn name(&self) -> String;
    /// Prepares a fresh topic / stream for `clients` clients.
    fn setup(&self, run: &str, clients: usize) -> impl std::future::Future<Output = anyhow::Result<()>> + Send;
    fn producer(&self, run: &str, client: usize) -> impl std::future::Future<Output = anyhow::Result<Box<dyn ProduceConn>>> + Send;
    fn consumer(&self, run: &str, client: usize) -> impl std::future::Future<Output = anyhow::Result<Box<dyn ConsumeConn>>> + Send;
}

#[async_trait::async_trait]
trait ProduceConn: Send {
    /// Sends `batch` messages and waits for their acknowledgement.
    async fn produce(&mut self, batch: &[Vec<u8>]) -> anyhow::Result<()>;
}

#[async_trait::async_trait]
trait ConsumeConn: Send {
    /// Fetches up to `max` messages and commits past them (or past the
    /// previous step's); returns how many.
    async fn consume(&mut self, max: usize) -> anyhow::Result<usize>;
    /// Commits what is still uncommitted (after the last step).
    async fn finish(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

async fn measure<S: System>(sys: Arc<S>, args: &MqBenchArgs, batch: usize) -> anyhow::Result<Figures> {
    let run = format!("b{}x{}", batch, rand::random::<u32>());
    sys.setup(&run, args.clients).await?;
    let payload: Vec<Vec<u8>> = (0..batch).map(|i| (0..args.size).map(|j| b'a' + ((i + j) % 26) as u8).collect()).collect();
    let payload = Arc::new(payload);
    let dur = Duration::from_secs_f64(args.seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let mut conn = sys.producer(&run, c).await?;
        let payload = Arc::clone(&payload);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut n = 0u64;
            while start.elapsed() < dur {
                let t = Instant::now();
                conn.produce(&payload).await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                n += payload.len() as u64;
            }
            anyhow::Ok((n, lat))
        }));
    }
    let mut produced = 0;
    let mut lat = Vec::new();
    let mut per_client = Vec::new();
    for t in tasks {
        let (n, l) = t.await??;
        produced += n;
        per_client.push(n);
        lat.extend(l);
    }
    let produce_s = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    // Consume what each client produced (bounded by 4x the produce time).
    let start = Instant::now();
    let limit = dur * 4;
    let mut tasks = Vec::new();
    for (c, want) in per_client.iter().copied().enumerate() {
        let mut conn = sys.consumer(&run, c).await?;
        tasks.push(tokio::spawn(async move {
            let mut got = 0u64;
            while got < want && start.elapsed() < limit {
                let n = conn.consume(batch).await?;
                got += n as u64;
            }
            conn.finish().await?;
            anyhow::Ok(got)
        }));
    }
    let mut consumed = 0;
    for t in tasks {
        consumed += t.await??;
    }
    let consume_s = start.elapsed().as_secs_f64();
    Ok(Figures {
        system: sys.name(),
        batch,
        produce_msgs_per_s: produced as f64 / produce_s,
        produce_p50_ms: percentile(&lat, 0.50),
        produce_p99_ms: percentile(&lat, 0.99),
        consume_msgs_per_s: consumed as f64 / consume_s,
        produced,
        consumed,
    })
}

// ------------------------------------------------------------------ our MQ gateway over HTTP/1.1 + SigV4

struct Http {
    stream: BufReader<TcpStream>,
    host: String,
    ak: String,
    sk: String,
}

impl Http {
    async fn connect(addr: &str, ak: &str, sk: &str) -> anyhow::Result<Http> {
        let s = TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Http { stream: BufReader::new(s), host: addr.to_string(), ak: ak.into(), sk: sk.into() })
    }

    /// One signed request; returns (status, body).
    async fn call(&mut self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
        use aws_sigv4::http_request::{sign, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings};
        let creds = aws_credential_types::Credentials::new(&self.ak, &self.sk, None, None, "bench");
        let identity = creds.into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("mq")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| anyhow!("signing params: {e}"))?
            .into();
        let signable = SignableRequest::new(method, path, [("host", self.host.as_str())].into_iter(), SignableBody::Bytes(body))
            .map_err(|e| anyhow!("signable request: {e}"))?;
        let (instr, _) = sign(signable, &params).map_err(|e| anyhow!("signing: {e}"))?.into_parts();
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n", self.host, body.len());
        for (k, v) in instr.headers() {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let w = self.stream.get_mut();
        w.write_all(head.as_bytes()).await?;
        w.write_all(body).await?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| anyhow!("bad status line {line:?}"))?;
        let mut len = 0usize;
        let mut close = false;
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 {
                bail!("connection closed");
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse()?;
                } else if k.eq_ignore_ascii_case("connection") && v.trim().eq_ignore_ascii_case("close") {
                    close = true;
                }
            }
        }
        let mut out = vec![0; len];
        self.stream.read_exact(&mut out).await?;
        if close {
            // The server ends the connection after this response (the front
            // recycles connections it handed over): the next call uses a new one.
            let s = TcpStream::connect(&self.host).await.with_context(|| format!("reconnecting to {}", self.host))?;
            s.set_nodelay(true)?;
            self.stream = BufReader::new(s);
        }
        Ok((status, out))
    }

    async fn ok(&mut self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Vec<u8>> {
        let (st, b) = self.call(method, path, body).await?;
        if !(200..300).contains(&st) {
            bail!("{method} {path}: HTTP {st}: {}", String::from_utf8_lossy(&b));
        }
        Ok(b)
    }
}

struct Ours {
    addr: String,
    ak: String,
    sk: String,
    /// Message size: a fetch of B messages asks for B stored records' bytes.
    size: usize,
    consume_with: ConsumeWith,
}

fn encode_produce(batch: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + batch.iter().map(|v| v.len() + 26).sum::<usize>());
    out.extend_from_slice(b"FMQ1");
    out.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    out.extend_from_slice(&(-1i64).to_le_bytes());
    out.extend_from_slice(&[0u8; 16]);
    for v in batch {
        let len = 8 + 4 + 4 + 4 + v.len() + 2;
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&(-1i64).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(-1i32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
        out.extend_from_slice(&0u16.to_le_bytes());
    }
    out
}

struct OursProducer {
    http: Http,
    path: String,
}

#[async_trait::async_trait]
impl ProduceConn for OursProducer {
    async fn produce(&mut self, batch: &[Vec<u8>]) -> anyhow::Result<()> {
        let body = encode_produce(batch);
        self.http.ok("POST", &self.path, &body).await.map(drop)
    }
}

struct OursConsumer {
    http: Http,
    topic: String,
    partition: usize,
    offset: u64,
    committed: u64,
    record_bytes: usize,
    poll: bool,
}

impl OursConsumer {
    fn group_path(&self, op: &str) -> String {
        // One group per client, as the baselines' one durable consumer / group per client.
        format!("/v1/groups/{}-g{}/{op}", self.topic, self.partition)
    }

    async fn commit(&mut self) -> anyhow::Result<()> {
        let commit = serde_json::json!({"offsets": [{"topic": self.topic, "partition": self.partition, "offset": self.offset}]});
        let path = self.group_path("commit");
        self.http.ok("POST", &path, commit.to_string().as_bytes()).await?;
        self.committed = self.offset;
        Ok(())
    }
}

fn fetched_next(b: &[u8]) -> anyhow::Result<u64> {
    if b.len() < 40 || &b[..4] != b"FMQF" {
        bail!("not a fetch response");
    }
    Ok(u64::from_le_bytes(b[24..32].try_into()?))
}

#[async_trait::async_trait]
impl ConsumeConn for OursConsumer {
    async fn consume(&mut self, max: usize) -> anyhow::Result<usize> {
        let max_bytes = (max * self.record_bytes).max(1);
        let b = if self.poll {
            let body = serde_json::json!({"topic": self.topic, "partition": self.partition, "offset": self.offset, "max_bytes": max_bytes, "wait_ms": 1000});
            let path = self.group_path("poll");
            let b = self.http.ok("POST", &path, body.to_string().as_bytes()).await?;
            self.committed = self.offset;
            b
        } else {
            let path = format!(
                "/v1/topics/{}/partitions/{}/records?offset={}&max_bytes={max_bytes}&wait_ms=1000",
                self.topic, self.partition, self.offset
            );
            self.http.ok("GET", &path, b"").await?
        };
        let next = fetched_next(&b)?;
        let n = next.saturating_sub(self.offset) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.offset = next;
        if !self.poll {
            self.commit().await?;
        }
        Ok(n)
    }

    async fn finish(&mut self) -> anyhow::Result<()> {
        if self.committed < self.offset {
            self.commit().await?;
        }
        Ok(())
    }
}

impl System for Ours {
    fn name(&self) -> String {
        match self.consume_with {
            ConsumeWith::Poll => "fskv MQ gateway (poll)".into(),
            ConsumeWith::FetchCommit => "fskv MQ gateway (fetch+commit)".into(),
        }
    }

    async fn setup(&self, run: &str, clients: usize) -> anyhow::Result<()> {
        let mut h = Http::connect(&self.addr, &self.ak, &self.sk).await?;
        let body = serde_json::json!({"partitions": clients});
        h.ok("PUT", &format!("/v1/topics/bench-{run}"), body.to_string().as_bytes()).await?;
        Ok(())
    }

    async fn producer(&self, run: &str, client: usize) -> anyhow::Result<Box<dyn ProduceConn>> {
        let http = Http::connect(&self.addr, &self.ak, &self.sk).await?;
        Ok(Box::new(OursProducer { http, path: format!("/v1/topics/bench-{run}/partitions/{client}/records") }))
    }

    async fn consumer(&self, run: &str, client: usize) -> anyhow::Result<Box<dyn ConsumeConn>> {
        let http = Http::connect(&self.addr, &self.ak, &self.sk).await?;
        Ok(Box::new(OursConsumer {
            http,
            topic: format!("bench-{run}"),
            partition: client,
            offset: 0,
            committed: 0,
            record_bytes: self.size + 26,
            poll: self.consume_with == ConsumeWith::Poll,
        }))
    }
}

// ------------------------------------------------------------------ NATS JetStream (text protocol)

struct Nats {
    addr: String,
    label: String,
}

struct NatsConn {
    r: BufReader<TcpStream>,
    inbox: String,
    sid: u32,
}

impl NatsConn {
    async fn connect(addr: &str) -> anyhow::Result<NatsConn> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).await?; // INFO
        let inbox = format!("_INBOX.{:016x}", rand::random::<u64>());
        let cmd = format!("CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true}}\r\nSUB {inbox}.* 1\r\nPING\r\n");
        r.get_mut().write_all(cmd.as_bytes()).await?;
        loop {
            line.clear();
            r.read_line(&mut line).await?;
            if line.starts_with("PONG") {
                break;
            }
            if line.starts_with("-ERR") {
                bail!("nats: {line}");
            }
        }
        Ok(NatsConn { r, inbox, sid: 1 })
    }

    /// Reads the next MSG (answering PINGs); returns (reply subject, payload).
    async fn next_msg(&mut self) -> anyhow::Result<(String, Vec<u8>)> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.r.read_line(&mut line).await? == 0 {
                bail!("nats connection closed");
            }
            let l = line.trim_end();
            if l == "PING" {
                self.r.get_mut().write_all(b"PONG\r\n").await?;
                continue;
            }
            if l.starts_with("-ERR") {
                bail!("nats: {l}");
            }
            let parts: Vec<&str> = l.split(' ').collect();
            let (reply, hdr_len, total) = match parts.as_slice() {
                ["MSG", _subj, _sid, reply, n] => (reply.to_string(), 0, n.parse::<usize>()?),
                ["MSG", _subj, _sid, n] => (String::new(), 0, n.parse::<usize>()?),
                ["HMSG", _subj, _sid, reply, h, n] => (reply.to_string(), h.parse::<usize>()?, n.parse::<usize>()?),
                ["HMSG", _subj, _sid, h, n] => (String::new(), h.parse::<usize>()?, n.parse::<usize>()?),
                _ => continue,
            };
            let mut buf = vec![0; total + 2];
            self.r.read_exact(&mut buf).await?;
            buf.truncate(total);
            let _ = hdr_len;
            return Ok((reply, buf));
        }
    }

    async fn request(&mut self, subject: &str, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        self.sid += 1;
        let reply = format!("{}.{}", self.inbox, self.sid);
        let mut cmd = format!("PUB {subject} {reply} {}\r\n", payload.len()).into_bytes();
        cmd.extend_from_slice(payload);
        cmd.extend_from_slice(b"\r\n");
        self.r.get_mut().write_all(&cmd).await?;
        let (_, body) = self.next_msg().await?;
        Ok(body)
    }
}

struct NatsProducer {
    c: NatsConn,
    subject: String,
}

#[async_trait::async_trait]
impl ProduceConn for NatsProducer {
    async fn produce(&mut self, batch: &[Vec<u8>]) -> anyhow::Result<()> {
        let mut cmd = Vec::with_capacity(batch.iter().map(|v| v.len() + 64).sum());
        for v in batch {
            cmd.extend_from_slice(format!("PUB {} {}.a {}\r\n", self.subject, self.c.inbox, v.len()).as_bytes());
            cmd.extend_from_slice(v);
            cmd.extend_from_slice(b"\r\n");
        }
        self.c.r.get_mut().write_all(&cmd).await?;
        for _ in batch {
            let (_, ack) = self.c.next_msg().await?;
            if !ack.starts_with(b"{\"stream\"") {
                bail!("jetstream publish: {}", String::from_utf8_lossy(&ack));
            }
        }
        Ok(())
    }
}

struct NatsConsumer {
    c: NatsConn,
    next: String,
}

#[async_trait::async_trait]
impl ConsumeConn for NatsConsumer {
    async fn consume(&mut self, max: usize) -> anyhow::Result<usize> {
        let req = format!("{{\"batch\":{max},\"expires\":1000000000}}");
        let reply = format!("{}.f", self.c.inbox);
        let cmd = format!("PUB {} {reply} {}\r\n{req}\r\n", self.next, req.len());
        self.c.r.get_mut().write_all(cmd.as_bytes()).await?;
        let mut n = 0;
        let mut last_reply = String::new();
        while n < max {
            let (reply, body) = self.c.next_msg().await?;
            if reply.starts_with("$JS.ACK") {
                n += 1;
                last_reply = reply;
            } else {
                // A status message (408 request timeout, 404 no messages): the pull ended.
                let _ = body;
                break;
            }
        }
        if n > 0 {
            // AckAll: acknowledging the last acknowledges the batch; with a reply: a synchronous (double) ack.
            self.c.sid += 1;
            let r = format!("{}.ack{}", self.c.inbox, self.c.sid);
            let cmd = format!("PUB {last_reply} {r} 4\r\n+ACK\r\n");
            self.c.r.get_mut().write_all(cmd.as_bytes()).await?;
            loop {
                let (_, body) = self.c.next_msg().await?;
                if !body.starts_with(b"{\"stream\"") {
                    break;
                }
            }
        }
        Ok(n)
    }
}

impl System for Nats {
    fn name(&self) -> String {
        format!("NATS JetStream ({})", self.label)
    }

    async fn setup(&self, run: &str, clients: usize) -> anyhow::Result<()> {
        let mut c = NatsConn::connect(&self.addr).await?;
        let cfg =
            serde_json::json!({"name": run, "subjects": [format!("{run}.>")], "storage": "file", "num_replicas": 1, "retention": "limits"});
        let r = c.request(&format!("$JS.API.STREAM.CREATE.{run}"), cfg.to_string().as_bytes()).await?;
        if String::from_utf8_lossy(&r).contains("\"error\"") {
            bail!("stream create: {}", String::from_utf8_lossy(&r));
        }
        for i in 0..clients {
            let cfg = serde_json::json!({"stream_name": run, "config": {"durable_name": format!("c{i}"), "ack_policy": "all", "filter_subject": format!("{run}.{i}"), "deliver_policy": "all", "max_ack_pending": -1}});
            let r = c.request(&format!("$JS.API.CONSUMER.DURABLE.CREATE.{run}.c{i}"), cfg.to_string().as_bytes()).await?;
            if String::from_utf8_lossy(&r).contains("\"error\"") {
                bail!("consumer create: {}", String::from_utf8_lossy(&r));
            }
        }
        Ok(())
    }

    async fn producer(&self, run: &str, client: usize) -> anyhow::Result<Box<dyn ProduceConn>> {
        Ok(Box::new(NatsProducer { c: NatsConn::connect(&self.addr).await?, subject: format!("{run}.{client}") }))
    }

    async fn consumer(&self, run: &str, client: usize) -> anyhow::Result<Box<dyn ConsumeConn>> {
        Ok(Box::new(NatsConsumer { c: NatsConn::connect(&self.addr).await?, next: format!("$JS.API.CONSUMER.MSG.NEXT.{run}.c{client}") }))
    }
}

// ------------------------------------------------------------------ Redis streams (RESP)

struct Redis {
    addr: String,
}

struct RedisConn {
    r: BufReader<TcpStream>,
}

fn resp_cmd(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

#[derive(Debug)]
enum Resp {
    Simple,
    Bulk(Option<Vec<u8>>),
    Int,
    Array(Option<Vec<Resp>>),
}

impl RedisConn {
    async fn connect(addr: &str) -> anyhow::Result<RedisConn> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(RedisConn { r: BufReader::new(s) })
    }

    fn read(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Resp>> + Send + '_>> {
        Box::pin(async move {
            let mut line = String::new();
            if self.r.read_line(&mut line).await? == 0 {
                bail!("redis connection closed");
            }
            let l = line.trim_end();
            let (t, rest) = l.split_at(1);
            Ok(match t {
                "+" => Resp::Simple,
                "-" => bail!("redis: {rest}"),
                ":" => Resp::Int,
                "$" => {
                    let n: i64 = rest.parse()?;
                    if n < 0 {
                        Resp::Bulk(None)
                    } else {
                        let mut b = vec![0; n as usize + 2];
                        self.r.read_exact(&mut b).await?;
                        b.truncate(n as usize);
                        Resp::Bulk(Some(b))
                    }
                }
                "*" => {
                    let n: i64 = rest.parse()?;
                    if n < 0 {
                        Resp::Array(None)
                    } else {
                        let mut v = Vec::with_capacity(n as usize);
                        for _ in 0..n {
                            v.push(self.read().await?);
                        }
                        Resp::Array(Some(v))
                    }
                }
                _ => bail!("redis: unexpected reply {l:?}"),
            })
        })
    }

    async fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<Resp> {
        let mut out = Vec::new();
        resp_cmd(&mut out, args);
        self.r.get_mut().write_all(&out).await?;
        self.read().await
    }
}

struct RedisProducer {
    c: RedisConn,
    key: String,
}

#[async_trait::async_trait]
impl ProduceConn for RedisProducer {
    async fn produce(&mut self, batch: &[Vec<u8>]) -> anyhow::Result<()> {
        let mut out = Vec::new();
        for v in batch {
            resp_cmd(&mut out, &[b"XADD", self.key.as_bytes(), b"*", b"v", v]);
        }
        self.c.r.get_mut().write_all(&out).await?;
        for _ in batch {
            self.c.read().await?;
        }
        Ok(())
    }
}

struct RedisConsumer {
    c: RedisConn,
    key: String,
}

#[async_trait::async_trait]
impl ConsumeConn for RedisConsumer {
    async fn consume(&mut self, max: usize) -> anyhow::Result<usize> {
        let count = max.to_string();
        let r = self
            .c
            .call(&[
                b"XREADGROUP",
                b"GROUP",
                b"g",
                b"c",
                b"COUNT",
                count.as_bytes(),
                b"BLOCK",
                b"1000",
                b"STREAMS",
                self.key.as_bytes(),
                b">",
            ])
            .await?;
        let mut ids: Vec<Vec<u8>> = Vec::new();
        if let Resp::Array(Some(streams)) = r {
            for s in streams {
                if let Resp::Array(Some(kv)) = s {
                    if let Some(Resp::Array(Some(entries))) = kv.into_iter().nth(1) {
                        for e in entries {
                            if let Resp::Array(Some(mut f)) = e {
                                if let Some(Resp::Bulk(Some(id))) = f.drain(..).next() {
                                    ids.push(id);
                                }
                            }
                        }
                    }
                }
            }
        }
        if ids.is_empty() {
            return Ok(0);
        }
        let mut args: Vec<&[u8]> = vec![b"XACK", self.key.as_bytes(), b"g"];
        args.extend(ids.iter().map(Vec::as_slice));
        self.c.call(&args).await?;
        Ok(ids.len())
    }
}

impl System for Redis {
    fn name(&self) -> String {
        "Redis streams (appendfsync always)".into()
    }

    async fn setup(&self, run: &str, clients: usize) -> anyhow::Result<()> {
        let mut c = RedisConn::connect(&self.addr).await?;
        for i in 0..clients {
            let key = format!("{run}.{i}");
            c.call(&[b"XGROUP", b"CREATE", key.as_bytes(), b"g", b"0", b"MKSTREAM"]).await?;
        }
        Ok(())
    }

    async fn producer(&self, run: &str, client: usize) -> anyhow::Result<Box<dyn ProduceConn>> {
        Ok(Box::new(RedisProducer { c: RedisConn::connect(&self.addr).await?, key: format!("{run}.{client}") }))
    }

    async fn consumer(&self, run: &str, client: usize) -> anyhow::Result<Box<dyn ConsumeConn>> {
        Ok(Box::new(RedisConsumer { c: RedisConn::connect(&self.addr).await?, key: format!("{run}.{client}") }))
    }
}

// ------------------------------------------------------------------ baselines' processes

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn wait_port(addr: &str) -> anyhow::Result<()> {
    let start = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        if start.elapsed() > Duration::from_secs(20) {
            bail!("{addr} did not come up");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn have(bin: &str) -> bool {
    Command::new(bin).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Whether this nats-server accepts `sync_interval` (2.10 and later).
fn nats_has_sync_interval(bin: &str, dir: &Path) -> bool {
    let conf = dir.join("probe.conf");
    let text = format!("listen: 127.0.0.1:1\njetstream {{ store_dir: \"{}\", sync_interval: always }}\n", dir.join("probe").display());
    if std::fs::write(&conf, text).is_err() {
        return false;
    }
    Command::new(bin)
        .args(["-c", &conf.display().to_string(), "-t"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

async fn start_nats(bin: &str, dir: &Path, always: bool) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let store = dir.join(if always { "nats-always" } else { "nats-default" });
    let _ = std::fs::remove_dir_all(&store);
    std::fs::create_dir_all(&store)?;
    let sync = if always { ", sync_interval: always" } else { "" };
    let conf = store.join("nats.conf");
    std::fs::write(
        &conf,
        format!("listen: 127.0.0.1:{port}\nmax_payload: 8MB\njetstream {{ store_dir: \"{}\"{sync} }}\n", store.display()),
    )?;
    let child = Command::new(bin)
        .args(["-c", &conf.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nats-server")?;
    let addr = format!("127.0.0.1:{port}");
    let p = Proc(child);
    wait_port(&addr).await?;
    Ok((p, addr))
}

async fn start_redis(bin: &str, dir: &Path) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let d = dir.join("redis");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    let child = Command::new(bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &d.display().to_string(),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server")?;
    let addr = format!("127.0.0.1:{port}");
    let p = Proc(child);
    wait_port(&addr).await?;
    Ok((p, addr))
}

fn print_row(f: &Figures) {
    println!(
        "  {:<44} batch {:>3}: produce {:>9.0} msg/s (p50 {:>7.2} ms, p99 {:>7.2} ms)  consume {:>9.0} msg/s  [{} produced, {} consumed]",
        f.system, f.batch, f.produce_msgs_per_s, f.produce_p50_ms, f.produce_p99_ms, f.consume_msgs_per_s, f.produced, f.consumed
    );
}

pub async fn run(args: MqBenchArgs) -> anyhow::Result<()> {
    let ep: serde_json::Value =
        serde_json::from_slice(&std::fs::read(args.data.join("endpoints.json")).context("reading endpoints.json")?)?;
    let mq = ep["mq"].as_str().ok_or_else(|| anyhow!("endpoints.json has no mq"))?;
    let addr = mq.trim_start_matches("http://").to_string();
    let ours = Arc::new(Ours {
        addr,
        ak: ep["access_key"].as_str().unwrap_or_default().to_string(),
        sk: ep["secret_key"].as_str().unwrap_or_default().to_string(),
        size: args.size,
        consume_with: args.consume_with,
    });
    let base = args.dir.clone().unwrap_or_else(|| args.data.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(".")));
    let work = tempfile::Builder::new().prefix("fskv-mqbench.").tempdir_in(&base)?;
    println!(
        "fskv bench mq {}: {} clients, {} B messages, batches {:?}, {} s per produce run; baselines' data in {}",
        args.label,
        args.clients,
        args.size,
        args.batches,
        args.seconds,
        work.path().display()
    );
    let mut rows = Vec::new();
    for &b in &args.batches {
        anyhow::ensure!((1..=10_000).contains(&b), "batch {b}: 1 to 10000");
        let mut f = measure(Arc::clone(&ours), &args, b).await?;
        f.system = format!("{} {}", ours.name(), args.label).trim().to_string();
        print_row(&f);
        rows.push(f);
    }
    if !args.no_baselines {
        if have(&args.nats_server) {
            let modes: Vec<bool> = if nats_has_sync_interval(&args.nats_server, work.path()) {
                vec![true, false]
            } else {
                println!(
                    "  note: {} has no sync_interval option (before 2.10): only its default (fsync every 2 min) is measured",
                    args.nats_server
                );
                vec![false]
            };
            for always in modes {
                let (_p, addr) = start_nats(&args.nats_server, work.path(), always).await?;
                let sys = Arc::new(Nats {
                    addr,
                    label: if always { "sync_interval: always".into() } else { "default: fsync every 2 min".into() },
                });
                for &b in &args.batches {
                    let f = measure(Arc::clone(&sys), &args, b).await?;
                    print_row(&f);
                    rows.push(f);
                }
            }
        } else {
            println!("  SKIPPED: nats-server not found ({})", args.nats_server);
        }
        if have(&args.redis_server) {
            let (_p, addr) = start_redis(&args.redis_server, work.path()).await?;
            let sys = Arc::new(Redis { addr });
            for &b in &args.batches {
                let f = measure(Arc::clone(&sys), &args, b).await?;
                print_row(&f);
                rows.push(f);
            }
        } else {
            println!("  SKIPPED: redis-server not found ({})", args.redis_server);
        }
    }
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}
