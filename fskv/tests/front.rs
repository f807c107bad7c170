//! The front through `fskv up` (real processes: the cluster, the front, the
//! gateway processes it starts): a request to an empty pool succeeds; a
//! burst of reads scales the reader pool up and, after the idle timeout,
//! back to zero, with no request failing on the way up or down; client
//! connections are handed over to the gateway processes, and writes never
//! reach a reader (the reader processes' own metrics: a write on a
//! connection handed to a reader goes back through the front); SigV4 verifies through the front (header and
//! presigned; a wrong secret is refused by the gateway behind it); the
//! read-only endpoint refuses writes; a reader killed with SIGKILL in the
//! middle of a response or of a stream of requests gives clean errors or
//! retried successes, never a hang, and is replaced.
//!
//! Small timeouts in the test configuration (idle 1.5 s) keep it short.

mod common;

use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
};
use bytes::Bytes;
use common::{free_base_port, metric_sum, start_up_with, UpGuard};
use fskv_front::admin::{fetch_status, FrontStatus};
use fskv_front::pool::PoolStatus;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

const IDLE_MS: u64 = 1_500;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const CONFIG: &str = r#"
[front]
idle_timeout_ms = 1500
# Handed connections are not recycled during the test, so that which reader
# a client's connection lands on stays put while the pools scale down.
handed_connection_max_age_ms = 60000
scale_up_in_flight = 2
scale_up_after_ms = 50
queue_timeout_ms = 20000
stop_grace_ms = 3000
restart_backoff_ms = 100

[front.s3]
reader = { min = 0, max = 3 }
writer = { min = 0, max = 1 }
"#;

/// A small S3 client: path-style requests signed with SigV4 (unsigned payload).
#[derive(Clone)]
struct S3 {
    host: String,
    ak: String,
    sk: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// What a request ended with: the status and the whole body, or an error
/// (transport, or the body cut short).
type Outcome = Result<(StatusCode, Bytes), String>;

impl S3 {
    fn new(host: &str, ak: &str, sk: &str) -> S3 {
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
        S3 { host: host.to_string(), ak: ak.to_string(), sk: sk.to_string(), client }
    }

    fn with_host(&self, host: &str) -> S3 {
        S3 { host: host.to_string(), ..self.clone() }
    }

    fn signed(&self, method: &Method, target: &str, body: Bytes, secret: &str) -> Request<Full<Bytes>> {
        let creds = aws_credential_types::Credentials::new(&self.ak, secret, None, None, "test");
        let identity = creds.into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let signable =
            SignableRequest::new(method.as_str(), target, [("host", self.host.as_str())].into_iter(), SignableBody::UnsignedPayload)
                .unwrap();
        let (instr, _) = sign(signable, &params).unwrap().into_parts();
        let mut req = Request::builder().method(method.clone()).uri(format!("http://{}{target}", self.host)).header("host", &self.host);
        for (k, v) in instr.headers() {
            req = req.header(k, v);
        }
        req.body(Full::new(body)).unwrap()
    }

    fn presigned_get(&self, target: &str) -> String {
        let creds = aws_credential_types::Credentials::new(&self.ak, &self.sk, None, None, "test");
        let identity = creds.into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.signature_location = SignatureLocation::QueryParams;
        settings.expires_in = Some(Duration::from_secs(300));
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let signable =
            SignableRequest::new("GET", target, [("host", self.host.as_str())].into_iter(), SignableBody::UnsignedPayload).unwrap();
        let (instr, _) = sign(signable, &params).unwrap().into_parts();
        let mut uri: http::Uri = format!("http://{}{target}", self.host).parse().unwrap();
        let mut req = Request::builder().uri(uri.clone()).body(()).unwrap();
        instr.apply_to_request_http1x(&mut req);
        uri = req.uri().clone();
        uri.to_string()
    }

    async fn send_req(&self, req: Request<Full<Bytes>>) -> Outcome {
        let run = async {
            let resp = self.client.request(req).await.map_err(|e| format!("transport: {e:?}"))?;
            let status = resp.status();
            let body = resp.into_body().collect().await.map_err(|e| format!("body: {e:?}"))?.to_bytes();
            Ok((status, body))
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, run).await {
            Ok(r) => r,
            Err(_) => panic!("a request through the front hung for {REQUEST_TIMEOUT:?}"),
        }
    }

    async fn send(&self, method: Method, target: &str, body: Bytes) -> Outcome {
        self.send_req(self.signed(&method, target, body, &self.sk)).await
    }

    /// Asserts 2xx; returns the body.
    async fn ok(&self, method: Method, target: &str, body: Bytes) -> Bytes {
        match self.send(method.clone(), target, body).await {
            Ok((s, b)) if s.is_success() => b,
            other => panic!("{method} {target}: {other:?}"),
        }
    }
}

async fn status(admin: &str) -> FrontStatus {
    fetch_status(admin, Duration::from_secs(5)).await.expect("front status")
}

fn pool<'a>(st: &'a FrontStatus, role: &str) -> &'a PoolStatus {
    st.pools.iter().find(|p| p.protocol == "s3" && p.role == role).expect("s3 pool")
}

/// Processes of a pool that count (starting, ready, suspect).
fn live(p: &PoolStatus) -> usize {
    p.processes.iter().filter(|x| matches!(x.state.as_str(), "starting" | "ready" | "suspect")).count()
}

async fn wait_for(admin: &str, what: &str, timeout: Duration, cond: impl Fn(&FrontStatus) -> bool) -> FrontStatus {
    let start = Instant::now();
    loop {
        let st = status(admin).await;
        if cond(&st) {
            return st;
        }
        assert!(start.elapsed() < timeout, "{what}: not after {timeout:?}: {st:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scrape(addr: &str) -> Option<String> {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    let resp = client.get(format!("http://{addr}/metrics").parse().ok()?).await.ok()?;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&body).into_owned())
}

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from((0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed as u32) as u8).collect::<Vec<u8>>())
}

const MUTATIONS: [&str; 8] = [
    "PutObject",
    "CreateBucket",
    "DeleteObject",
    "DeleteObjects",
    "CopyObject",
    "UploadPart",
    "CompleteMultipartUpload",
    "CreateMultipartUpload",
];

#[test]
fn front_pools_scale_route_and_survive_kill9() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("front.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = UpGuard { child: Some(start_up_with(&data, base, &["--config", cfg.to_str().unwrap()])), mount: None };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(scenario(&data, base));
    up.stop();
}

async fn scenario(data: &Path, base: u16) {
    let endpoints: serde_json::Value = serde_json::from_slice(&std::fs::read(data.join("endpoints.json")).unwrap()).unwrap();
    let host = format!("127.0.0.1:{base}");
    assert_eq!(endpoints["s3"], format!("http://{host}"), "S3 is the front's port P");
    assert_eq!(endpoints["s3_reader"], format!("http://127.0.0.1:{}", base + 5));
    let admin = format!("127.0.0.1:{}", base + 10);
    assert_eq!(endpoints["front"], format!("http://{admin}"));
    let s3 = S3::new(&host, endpoints["access_key"].as_str().unwrap(), endpoints["secret_key"].as_str().unwrap());

    // ---- Pools start from zero; a request to an empty pool is held and succeeds.
    let st = status(&admin).await;
    assert_eq!((live(pool(&st, "reader")), live(pool(&st, "writer"))), (0, 0), "pools start empty: {st:#?}");
    let t = Instant::now();
    s3.ok(Method::PUT, "/frontb", Bytes::new()).await;
    let first_write = t.elapsed();
    let small = pattern(64 << 10, 1);
    s3.ok(Method::PUT, "/frontb/small", small.clone()).await;
    let st = status(&admin).await;
    assert_eq!(live(pool(&st, "writer")), 1, "the first write started one writer: {st:#?}");
    assert_eq!(live(pool(&st, "reader")), 0, "no read yet, no reader: {st:#?}");
    let t = Instant::now();
    assert_eq!(s3.ok(Method::GET, "/frontb/small", Bytes::new()).await, small);
    let first_read = t.elapsed();
    println!("first write (cold writer) {first_write:?}, first read (cold reader) {first_read:?}");
    let st = status(&admin).await;
    assert_eq!(live(pool(&st, "reader")), 1);
    assert!(pool(&st, "reader").last_cold_start_ms.is_some());

    // ---- SigV4 through the front: header auth above; presigned; a wrong secret is refused by the gateway.
    let url = s3.presigned_get("/frontb/small");
    let (s, body) = s3.send_req(Request::get(url).body(Full::new(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!((s, body.len()), (StatusCode::OK, small.len()), "presigned GET through the front");
    let bad = s3.signed(&Method::GET, "/frontb/small", Bytes::new(), "not-the-secret");
    let (s, body) = s3.send_req(bad).await.unwrap();
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(String::from_utf8_lossy(&body).contains("SignatureDoesNotMatch"), "{}", String::from_utf8_lossy(&body));

    // ---- A burst of reads (with some writes) scales the reader pool up; nothing fails.
    let before = status(&admin).await;
    let reads = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let burst_end = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (s3, reads, writes, failures, small) = (s3.clone(), reads.clone(), writes.clone(), failures.clone(), small.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < burst_end {
                n += 1;
                if i < 2 {
                    let key = format!("/frontb/w{i}-{n}");
                    match s3.send(Method::PUT, &key, Bytes::from(vec![i as u8; 1000])).await {
                        Ok((s, _)) if s.is_success() => {}
                        other => failures.lock().push(format!("PUT {key}: {other:?}")),
                    }
                    writes.fetch_add(1, Ordering::Relaxed);
                } else {
                    match s3.send(Method::GET, "/frontb/small", Bytes::new()).await {
                        Ok((s, b)) if s.is_success() && b == small => {}
                        other => failures.lock().push(format!("GET: {:?}", other.map(|(s, b)| (s, b.len())))),
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut most_readers = 0;
    let mut reader_addrs = std::collections::BTreeSet::new();
    let mut unix_sockets = std::collections::BTreeSet::new();
    while Instant::now() < burst_end {
        let st = status(&admin).await;
        let p = pool(&st, "reader");
        most_readers = most_readers.max(live(p));
        reader_addrs.extend(p.processes.iter().filter_map(|x| x.address.clone()));
        // The front reaches the processes it started over their Unix sockets (`[front] unix_sockets`).
        for x in p.processes.iter().filter(|x| x.state == "ready") {
            let sock = x.unix_socket.as_deref().unwrap_or_else(|| panic!("ready reader {:?} has no Unix socket", x.address));
            unix_sockets.insert(sock.to_string());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!unix_sockets.is_empty(), "no ready reader seen during the burst");
    for sock in &unix_sockets {
        // Under `fskv up` they live in the data directory (`--socket-dir`), not in /tmp.
        assert!(sock.ends_with(".sock") && sock.contains("/run/front/"), "socket path {sock}");
        let dir = std::path::Path::new(sock).parent().unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir).unwrap().permissions()) & 0o777;
        assert_eq!(mode, 0o700, "the sockets' directory {} is {mode:o}", dir.display());
    }
    for t in tasks {
        t.await.unwrap();
    }
    let failures = std::mem::take(&mut *failures.lock());
    assert!(failures.is_empty(), "requests failed during the scale-up: {failures:#?}");
    let (reads, writes) = (reads.load(Ordering::Relaxed), writes.load(Ordering::Relaxed));
    println!("burst: {reads} reads, {writes} writes; at most {most_readers} reader processes");
    assert!(most_readers >= 2, "the reader pool did not grow under {reads} reads from 10 clients (scale_up_in_flight 2)");

    // ---- Writes never reach a reader: the readers' own metrics. The burst's
    // connections were handed over to the processes (the pools count them,
    // not their requests); a mutation on a connection handed to a reader
    // went back through the front to the writers (`forwarded_to_writers`).
    let after = status(&admin).await;
    let (r, w) = (pool(&after, "reader"), pool(&after, "writer"));
    assert!(r.requests > pool(&before, "reader").requests && w.requests > pool(&before, "writer").requests, "{after:#?}");
    let front_text = scrape(&host).await.expect("front /metrics");
    let handed = metric_sum(&front_text, "fskv_gateway_front_handed_over_total", &[("protocol", "s3")]);
    assert!(handed >= 1.0, "no connection of the burst was handed over: {front_text}");
    let (mut scraped, mut served_gets, mut forwarded) = (0, 0.0, 0.0);
    for addr in &reader_addrs {
        // A reader stopped meanwhile has nothing to scrape; the live ones must show no mutation.
        let Some(text) = scrape(addr).await else { continue };
        scraped += 1;
        for route in MUTATIONS {
            let n = metric_sum(&text, "fskv_gateway_requests_total", &[("route", route)]);
            assert_eq!(n, 0.0, "reader {addr} served {n} {route}");
        }
        assert_eq!(
            metric_sum(&text, "fskv_gateway_requests_refused_total", &[("reason", "read_only")]),
            0.0,
            "a write reached reader {addr}"
        );
        served_gets += metric_sum(&text, "fskv_gateway_requests_total", &[("route", "GetObject")]);
        forwarded += metric_sum(&text, "fskv_gateway_requests_total", &[("route", "forwarded_to_writers")]);
    }
    assert!(scraped >= 1, "no reader process to scrape among {reader_addrs:?}");
    assert!(served_gets > 0.0, "the readers served no GET");
    println!("burst: {handed} connections handed over; readers served {served_gets} GETs and sent {forwarded} writes back to the writers");

    // ---- One client connection whose first request (a GET) had it handed to
    // a reader, then a PUT on it: the reader sends the PUT back through the
    // front to the writers (SigV4 still verifies there); the GET after it sees it.
    let sent_back_before = sent_back_by_reader(&admin).await;
    let stream = tokio::net::TcpStream::connect(&host).await.unwrap();
    let (mut one, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    let conn = tokio::spawn(conn);
    let mixed = pattern(10_000, 3);
    for (method, target, body, want) in [
        (Method::GET, "/frontb/small", Bytes::new(), Some(small.clone())),
        (Method::PUT, "/frontb/mixed", mixed.clone(), None),
        (Method::GET, "/frontb/mixed", Bytes::new(), Some(mixed.clone())),
        (Method::DELETE, "/frontb/mixed", Bytes::new(), None),
    ] {
        one.ready().await.expect("the one connection is still open");
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, one.send_request(s3.signed(&method, target, body, &s3.sk)))
            .await
            .expect("a response on the one connection")
            .unwrap();
        let status = resp.status();
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(status.is_success(), "{method} {target} on the one connection: {status} {}", String::from_utf8_lossy(&got));
        if let Some(want) = want {
            assert_eq!(got, want, "{method} {target}");
        }
    }
    drop(one);
    let _ = conn.await;
    let (s, _) = s3.send(Method::GET, "/frontb/mixed", Bytes::new()).await.unwrap();
    assert_eq!(s, StatusCode::NOT_FOUND);
    let sent_back = sent_back_by_reader(&admin).await;
    let most = sent_back.iter().map(|(a, n)| n - sent_back_before.get(a).copied().unwrap_or(0.0)).fold(0.0, f64::max);
    assert!(most >= 2.0, "the PUT and the DELETE on the handed connection went back to the writers: {sent_back_before:?} → {sent_back:?}");

    // ---- Scale down under a trickle of reads: the extra readers drain and stop, no read fails.
    // A client of its own, so that its connection is handed to a reader by
    // its first request (the burst's pooled connections may be a writer's).
    let trickler = S3::new(&host, &s3.ak, &s3.sk);
    let trickle_end = Instant::now() + Duration::from_millis(IDLE_MS * 2 + 1_500);
    let mut trickled = 0;
    while Instant::now() < trickle_end {
        assert_eq!(trickler.ok(Method::GET, "/frontb/small", Bytes::new()).await, small);
        trickled += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let st = status(&admin).await;
    assert_eq!(live(pool(&st, "reader")), 1, "one reader is enough for a trickle ({trickled} reads): {st:#?}");
    // ---- Then back to zero, writers too.
    let st = wait_for(&admin, "both pools back to zero", Duration::from_millis(IDLE_MS * 4 + 5_000), |st| {
        pool(st, "reader").processes.is_empty() && pool(st, "writer").processes.is_empty()
    })
    .await;
    assert!(pool(&st, "reader").stops >= 2 && pool(&st, "writer").stops >= 1, "{st:#?}");
    assert_eq!(pool(&st, "reader").crashes + pool(&st, "writer").crashes, 0, "{st:#?}");
    assert_eq!(pool(&st, "reader").rejected + pool(&st, "writer").rejected, 0, "{st:#?}");
    // An empty pool again: the next read cold-starts and succeeds.
    assert_eq!(s3.ok(Method::GET, "/frontb/small", Bytes::new()).await, small);

    // The read-only endpoint refuses writes (the reader gateway names the
    // writer endpoint). After the metrics check above: this write does reach a reader, to be refused.
    let ro = s3.with_host(&format!("127.0.0.1:{}", base + 5));
    let (s, body) = ro.send(Method::PUT, "/frontb/ro", Bytes::from_static(b"x")).await.unwrap();
    assert_eq!(s, StatusCode::FORBIDDEN, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("ReadOnlyGateway"), "{}", String::from_utf8_lossy(&body));
    assert_eq!(ro.ok(Method::GET, "/frontb/small", Bytes::new()).await, small);

    kill9_mid_body(&s3, &admin).await;
    kill9_under_load(&s3, &admin, &small).await;

    // The front's own metrics show the pools.
    let text = scrape(&host).await.expect("front /metrics");
    assert!(metric_sum(&text, "fskv_gateway_front_starts_total", &[("role", "reader")]) >= 3.0, "{text}");
    assert!(metric_sum(&text, "fskv_gateway_front_crashes_total", &[("role", "reader")]) >= 1.0);
    assert!(text.contains("fskv_gateway_front_cold_start_seconds_count"));
    println!("reads retried on another process after a failure: {}", metric_sum(&text, "fskv_gateway_front_retries_total", &[]));
}

/// Per live reader process: the requests it sent back through the front
/// (`forwarded_to_writers`); asserts it served no mutation itself.
async fn sent_back_by_reader(admin: &str) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for p in &pool(&status(admin).await, "reader").processes {
        let Some(addr) = &p.address else { continue };
        let Some(text) = scrape(addr).await else { continue };
        for route in MUTATIONS {
            assert_eq!(metric_sum(&text, "fskv_gateway_requests_total", &[("route", route)]), 0.0, "reader {addr} served a {route}");
        }
        out.insert(addr.clone(), metric_sum(&text, "fskv_gateway_requests_total", &[("route", "forwarded_to_writers")]));
    }
    out
}

fn kill9(pid: u32) {
    // SAFETY: kill(2) with a pid the front reported for its gateway process.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
}

/// A reader killed while it streams a large object: the client sees the
/// body cut short (an error), not a hang; the pool replaces the reader.
async fn kill9_mid_body(s3: &S3, admin: &str) {
    let big = pattern(48 << 20, 7);
    s3.ok(Method::PUT, "/frontb/big", big.clone()).await;
    let req = s3.signed(&Method::GET, "/frontb/big", Bytes::new(), &s3.sk);
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, s3.client.request(req)).await.expect("response head").expect("GET big");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a first frame").expect("first frame ok");
    let mut got = first.data_ref().map_or(0, |d| d.len());
    let st = status(admin).await;
    let busy: Vec<u32> = pool(&st, "reader").processes.iter().filter(|p| p.in_flight > 0).filter_map(|p| p.pid).collect();
    assert_eq!(busy.len(), 1, "one reader streams the object: {st:#?}");
    kill9(busy[0]);
    let rest = tokio::time::timeout(REQUEST_TIMEOUT, async {
        loop {
            match body.frame().await {
                None => return Ok(()),
                Some(Ok(f)) => got += f.data_ref().map_or(0, |d| d.len()),
                Some(Err(e)) => return Err(e),
            }
        }
    })
    .await
    .expect("the body of a killed reader hung");
    assert!(rest.is_err() || got < big.len(), "a killed reader's response completed ({got} bytes): not killed in time?");
    println!("kill -9 mid-body: client saw {:?} after {got} of {} bytes", rest.err().map(|e| e.to_string()), big.len());
    let st = wait_for(admin, "the killed reader is gone", Duration::from_secs(10), |st| {
        !pool(st, "reader").processes.iter().any(|p| p.pid == Some(busy[0]))
    })
    .await;
    assert!(pool(&st, "reader").crashes >= 1, "{st:#?}");
    // The next read gets a (new) reader.
    assert_eq!(s3.ok(Method::GET, "/frontb/big", Bytes::new()).await.len(), big.len());
}

/// Readers killed while 6 clients read in a loop: every request ends with
/// a success (retried on another process) or a clean error (5xx, or a
/// connection error), never a hang; reads succeed again afterwards.
async fn kill9_under_load(s3: &S3, admin: &str, small: &Bytes) {
    let end = Instant::now() + Duration::from_secs(4);
    let outcomes = Arc::new(parking_lot::Mutex::new((0u64, Vec::<String>::new())));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (s3, outcomes, small) = (s3.clone(), outcomes.clone(), small.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let r = s3.send(Method::GET, "/frontb/small", Bytes::new()).await;
                let mut o = outcomes.lock();
                match r {
                    Ok((s, b)) if s.is_success() => {
                        assert_eq!(b, small, "a successful read returned other bytes");
                        o.0 += 1;
                    }
                    Ok((s, _)) => {
                        assert!(s.is_server_error(), "a killed reader must give a 5xx, not {s}");
                        o.1.push(format!("status {s}"));
                    }
                    Err(e) => o.1.push(e),
                }
            }
        }));
    }
    let mut killed = 0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let st = status(admin).await;
        if let Some(pid) = pool(&st, "reader").processes.iter().filter(|p| p.state == "ready").find_map(|p| p.pid) {
            kill9(pid);
            killed += 1;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (ok, errors) = std::mem::take(&mut *outcomes.lock());
    println!("kill -9 under load: {killed} readers killed; {ok} reads succeeded, {} clean errors: {errors:?}", errors.len());
    assert!(killed >= 2, "no reader to kill");
    assert!(ok > 0);
    assert_eq!(s3.ok(Method::GET, "/frontb/small", Bytes::new()).await, *small);
    let st = status(admin).await;
    assert!(pool(&st, "reader").crashes > killed as u64, "{st:#?}");
}
