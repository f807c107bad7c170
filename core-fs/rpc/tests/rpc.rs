//! Loopback tests of client and server together. Every wait is bounded.

use bytes::Bytes;
use fskv_rpc::frame::{FrameHeader, FrameKind, HEADER_BYTES};
use fskv_rpc::{CallOptions, ClientConfig, ErrorCode, Method, Router, RpcClient, RpcError, Server, ServerConfig, Status, TcpTransport};
use rand::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Echo;
impl Method for Echo {
    const ID: u16 = 1;
    const NAME: &'static str = "test.Echo";
    type Req = String;
    type Resp = String;
}

/// Sleeps the requested microseconds, answers `n * 2`, echoes the payload.
struct Sleepy;
impl Method for Sleepy {
    const ID: u16 = 2;
    const NAME: &'static str = "test.Sleepy";
    type Req = (u64, u64);
    type Resp = u64;
}

/// Never answers; records start and abort.
struct Block;
impl Method for Block {
    const ID: u16 = 3;
    const NAME: &'static str = "test.Block";
    type Req = ();
    type Resp = ();
}

/// Not served by the test server.
struct Missing;
impl Method for Missing {
    const ID: u16 = 99;
    const NAME: &'static str = "test.Missing";
    type Req = ();
    type Resp = ();
}

/// Same id as `Sleepy` but a body the server cannot decode as `(u64, u64)`.
struct SleepyWrongBody;
impl Method for SleepyWrongBody {
    const ID: u16 = 2;
    const NAME: &'static str = "test.SleepyWrongBody";
    type Req = u8;
    type Resp = u64;
}

#[derive(Default)]
struct Probe {
    started: AtomicUsize,
    aborted: AtomicUsize,
}

struct CountOnDrop(Arc<Probe>);
impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.aborted.fetch_add(1, Ordering::SeqCst);
    }
}

fn router(probe: Arc<Probe>) -> Router {
    Router::new()
        .route::<Echo, _, _>(|_ctx, req, payload| async move { Ok((req, payload)) })
        .route::<Sleepy, _, _>(|_ctx, (n, sleep_us), payload| async move {
            tokio::time::sleep(Duration::from_micros(sleep_us)).await;
            Ok((n * 2, payload))
        })
        .route::<Block, _, _>(move |_ctx, (), _payload| {
            let probe = probe.clone();
            async move {
                let _guard = CountOnDrop(probe.clone());
                probe.started.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok::<_, Status>(((), Bytes::new()))
            }
        })
}

async fn start(config: ServerConfig) -> (Server, Arc<Probe>) {
    start_at("127.0.0.1:0", config).await
}

async fn start_at(addr: &str, config: ServerConfig) -> (Server, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let server = Server::bind(Arc::new(TcpTransport::new()), addr, router(probe.clone()), config).await.unwrap();
    (server, probe)
}

fn client(config: ClientConfig) -> RpcClient {
    RpcClient::new(Arc::new(TcpTransport::new()), config)
}

fn one_conn() -> ClientConfig {
    ClientConfig { connections_per_addr: 1, ..ClientConfig::default() }
}

fn opts_ms(timeout_ms: u64) -> CallOptions {
    CallOptions { timeout_ms }
}

/// Polls `cond` every 5 ms for at most 3 s.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..600 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn round_trip_with_payload() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(ClientConfig::default());
    let payload = Bytes::from((0..1_000_000u32).map(|i| i as u8).collect::<Vec<_>>());
    let (resp, back) = c.call::<Echo>(server.local_addr(), &"hello".to_string(), payload.clone(), opts_ms(5_000)).await.unwrap();
    assert_eq!(resp, "hello");
    assert_eq!(back, payload);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_calls_on_one_connection_out_of_order() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(ClientConfig { max_in_flight_per_connection: 2048, ..one_conn() });
    let addr = server.local_addr().to_string();
    let calls = (0..1000u64).map(|i| {
        let c = c.clone();
        let addr = addr.clone();
        let sleep_us = rand::thread_rng().gen_range(0..2_000);
        async move {
            let payload = Bytes::from(vec![i as u8; (i % 97) as usize]);
            let (resp, back) = c.call::<Sleepy>(&addr, &(i, sleep_us), payload.clone(), opts_ms(10_000)).await.unwrap();
            assert_eq!(resp, i * 2, "reply matched to the wrong call");
            assert_eq!(back, payload);
        }
    });
    futures::future::join_all(calls).await;
    server.shutdown().await;
}

/// Callers write their frames themselves while the connection is idle and
/// queue behind the writer task while it is not: with payloads larger than
/// the socket's buffer from many tasks at once, frames are cut mid-way by
/// a full socket and finished by the writer while others queue. Every
/// payload must come back whole, on the one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_small_frames_from_many_callers_never_interleave() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(ClientConfig { max_in_flight_per_connection: 256, ..one_conn() });
    let addr = server.local_addr().to_string();
    let tasks = (0..24u64).map(|t| {
        let c = c.clone();
        let addr = addr.clone();
        tokio::spawn(async move {
            for i in 0..4u64 {
                let len = if (t + i) % 2 == 0 { (3 << 20) + (t as usize) * 1013 } else { 17 + t as usize };
                let payload = Bytes::from((0..len).map(|b| (b as u64 * 31 + t * 7 + i) as u8).collect::<Vec<_>>());
                let tag = format!("{t}/{i}");
                let (resp, back) = c.call::<Echo>(&addr, &tag, payload.clone(), opts_ms(30_000)).await.unwrap();
                assert_eq!(resp, tag);
                assert!(back == payload, "payload of {tag} ({len} bytes) came back changed");
            }
        })
    });
    for t in futures::future::join_all(tasks).await {
        t.unwrap();
    }
    server.shutdown().await;
}

#[tokio::test]
async fn deadline_exceeded_and_handler_is_cancelled() {
    let (server, probe) = start(ServerConfig::default()).await;
    let c = client(one_conn());
    let err = c.call::<Block>(server.local_addr(), &(), Bytes::new(), opts_ms(100)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert!(err.is_retryable());
    assert_eq!(probe.started.load(Ordering::SeqCst), 1);
    eventually("server handler aborted", || probe.aborted.load(Ordering::SeqCst) == 1).await;
    server.shutdown().await;
}

#[tokio::test]
async fn dropping_the_call_future_cancels_the_server_handler() {
    let (server, probe) = start(ServerConfig::default()).await;
    let c = client(one_conn());
    let addr = server.local_addr().to_string();
    // No deadline: only the Cancel frame can stop the handler.
    let call = tokio::spawn({
        let c = c.clone();
        async move { c.call::<Block>(&addr, &(), Bytes::new(), opts_ms(0)).await }
    });
    eventually("handler started", || probe.started.load(Ordering::SeqCst) == 1).await;
    assert_eq!(probe.aborted.load(Ordering::SeqCst), 0);
    call.abort();
    eventually("server handler aborted", || probe.aborted.load(Ordering::SeqCst) == 1).await;
    // The connection is still usable.
    let (resp, _) = c.call::<Echo>(server.local_addr(), &"after".into(), Bytes::new(), opts_ms(5_000)).await.unwrap();
    assert_eq!(resp, "after");
    server.shutdown().await;
}

#[tokio::test]
async fn oversized_frame_rejected_before_writing() {
    let c = client(ClientConfig { max_frame_bytes: 1 << 20, ..ClientConfig::default() });
    // Nothing listens on port 1: the error proves no connection was tried.
    let err = c.call::<Echo>("127.0.0.1:1", &"x".into(), Bytes::from(vec![0u8; 2 << 20]), opts_ms(1_000)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::FrameTooLarge);
}

#[tokio::test]
async fn oversized_frame_header_closes_the_server_connection() {
    let (server, _) = start(ServerConfig { max_frame_bytes: 1 << 20, ..ServerConfig::default() }).await;
    let mut sock = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    let header = FrameHeader {
        kind: FrameKind::Request,
        flags: 0,
        request_id: 1,
        code: u32::from(Echo::ID),
        timeout_ms: 0,
        body_len: 512 << 20,
        payload_len: u32::MAX,
    };
    let mut raw = Vec::with_capacity(HEADER_BYTES);
    header.encode(&mut raw);
    sock.write_all(&raw).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(3), sock.read(&mut buf)).await.expect("server did not close");
    assert!(matches!(read, Ok(0) | Err(_)), "expected the connection to close, got {read:?}");
    // The server still serves others.
    let c = client(one_conn());
    c.call::<Echo>(server.local_addr(), &"ok".into(), Bytes::new(), opts_ms(5_000)).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn bad_magic_closes_the_server_connection() {
    let (server, _) = start(ServerConfig::default()).await;
    let mut sock = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    sock.write_all(&[0xAB; 64]).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(3), sock.read(&mut buf)).await.expect("server did not close");
    assert!(matches!(read, Ok(0) | Err(_)));
    server.shutdown().await;
}

#[tokio::test]
async fn unknown_method_keeps_connection() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(one_conn());
    let err = c.call::<Missing>(server.local_addr(), &(), Bytes::new(), opts_ms(5_000)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::UnknownMethod);
    assert!(!err.is_retryable());
    c.call::<Echo>(server.local_addr(), &"still up".into(), Bytes::new(), opts_ms(5_000)).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn malformed_body_keeps_connection() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(one_conn());
    let err = c.call::<SleepyWrongBody>(server.local_addr(), &7u8, Bytes::new(), opts_ms(5_000)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::MalformedMessage);
    let (resp, _) = c.call::<Sleepy>(server.local_addr(), &(21, 0), Bytes::new(), opts_ms(5_000)).await.unwrap();
    assert_eq!(resp, 42);
    server.shutdown().await;
}

#[tokio::test]
async fn connection_refused_is_retryable_connection_failed() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let c = client(ClientConfig::default());
    let err = c.call::<Echo>(&format!("127.0.0.1:{port}"), &"x".into(), Bytes::new(), opts_ms(2_000)).await.unwrap_err();
    assert!(matches!(err, RpcError::ConnectionFailed { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::ConnectionFailed);
    assert!(err.is_retryable());
}

#[tokio::test]
async fn server_restart_on_same_port_reconnects() {
    let (server, _) = start(ServerConfig::default()).await;
    let addr = server.local_addr().to_string();
    let c = client(one_conn());
    c.call::<Echo>(&addr, &"first".into(), Bytes::new(), opts_ms(5_000)).await.unwrap();
    server.shutdown().await;
    let (server, _) = start_at(&addr, ServerConfig::default()).await;
    // The client learns of the old connection's end from its reader task;
    // give it a moment to observe the close.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (resp, _) = c.call::<Echo>(&addr, &"second".into(), Bytes::new(), opts_ms(5_000)).await.unwrap();
    assert_eq!(resp, "second");
    server.shutdown().await;
}

#[tokio::test]
async fn broken_connection_fails_pending_calls() {
    let (server, probe) = start(ServerConfig { shutdown_grace_ms: 50, ..ServerConfig::default() }).await;
    let addr = server.local_addr().to_string();
    let c = client(one_conn());
    let call = tokio::spawn({
        let c = c.clone();
        let addr = addr.clone();
        async move { c.call::<Block>(&addr, &(), Bytes::new(), opts_ms(0)).await }
    });
    eventually("handler started", || probe.started.load(Ordering::SeqCst) == 1).await;
    drop(server); // aborts everything: the connection breaks
    let err = tokio::time::timeout(Duration::from_secs(3), call).await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::ConnectionFailed);
}

#[tokio::test]
async fn in_flight_limit_answers_overloaded() {
    let (server, probe) = start(ServerConfig { max_in_flight_per_connection: 2, ..ServerConfig::default() }).await;
    let addr = server.local_addr().to_string();
    let c = client(one_conn());
    let blocked: Vec<_> = (0..2)
        .map(|_| {
            let c = c.clone();
            let addr = addr.clone();
            tokio::spawn(async move { c.call::<Block>(&addr, &(), Bytes::new(), opts_ms(0)).await })
        })
        .collect();
    eventually("two handlers started", || probe.started.load(Ordering::SeqCst) == 2).await;
    let err = c.call::<Echo>(&addr, &"x".into(), Bytes::new(), opts_ms(5_000)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Overloaded);
    assert!(err.is_retryable());
    for b in blocked {
        b.abort();
    }
    eventually("blocked handlers aborted", || probe.aborted.load(Ordering::SeqCst) == 2).await;
    c.call::<Echo>(&addr, &"x".into(), Bytes::new(), opts_ms(5_000)).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn graceful_shutdown_lets_in_flight_requests_finish() {
    let (server, _) = start(ServerConfig::default()).await;
    let addr = server.local_addr().to_string();
    let c = client(one_conn());
    let call = tokio::spawn({
        let c = c.clone();
        let addr = addr.clone();
        async move { c.call::<Sleepy>(&addr, &(5, 200_000), Bytes::new(), opts_ms(5_000)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.shutdown().await;
    let (resp, _) = call.await.unwrap().unwrap();
    assert_eq!(resp, 10);
}

// ----- resource limits (untrusted peers) -----

/// Reads until the server closes the connection; the time it took.
async fn closed_within(sock: &mut tokio::net::TcpStream, bound: Duration) -> Duration {
    let start = std::time::Instant::now();
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(bound, sock.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the server kept the connection open for {bound:?}"),
        }
    }
}

#[tokio::test]
async fn a_peer_stalling_mid_frame_is_cut_off_and_honest_callers_go_on() {
    let config = ServerConfig { frame_read_timeout_ms: 300, ..ServerConfig::default() };
    let (server, _) = start(config).await;
    let t0 = std::time::Instant::now();
    // Half a header, then nothing (slow loris).
    let mut loris = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    loris.write_all(b"3FSR\x01\x01").await.unwrap();
    // A header promising 64 MiB, then nothing: nothing near that is held,
    // and it is cut off the same way.
    let mut liar = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    let header =
        FrameHeader { kind: FrameKind::Request, flags: 0, request_id: 1, code: 1, timeout_ms: 0, body_len: 4, payload_len: 64 << 20 };
    let mut raw = bytes::BytesMut::new();
    header.encode(&mut raw);
    liar.write_all(&raw).await.unwrap();
    let c = client(one_conn());
    let (resp, _) = c.call::<Echo>(server.local_addr(), &"still here".to_string(), Bytes::new(), opts_ms(2_000)).await.unwrap();
    assert_eq!(resp, "still here");
    closed_within(&mut loris, Duration::from_secs(5)).await;
    closed_within(&mut liar, Duration::from_secs(5)).await;
    assert!(t0.elapsed() >= Duration::from_millis(300), "closed before the frame-read timeout: {:?}", t0.elapsed());
    server.shutdown().await;
}

#[tokio::test]
async fn an_idle_connection_is_closed_and_the_client_reconnects() {
    let config = ServerConfig { idle_timeout_ms: 300, ..ServerConfig::default() };
    let (server, _) = start(config).await;
    let mut idle = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    closed_within(&mut idle, Duration::from_secs(5)).await;
    // A pooled client connection idles out too; the next call reconnects.
    let c = client(one_conn());
    c.call::<Echo>(server.local_addr(), &"a".to_string(), Bytes::new(), opts_ms(2_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut ok = false;
    for _ in 0..3 {
        // The first call may race the close and fail with a retryable error.
        match c.call::<Echo>(server.local_addr(), &"b".to_string(), Bytes::new(), opts_ms(2_000)).await {
            Ok(_) => {
                ok = true;
                break;
            }
            Err(e) => assert!(e.code().is_retryable(), "{e}"),
        }
    }
    assert!(ok, "no call succeeded after the idle close");
    // A request in flight keeps its connection open past the idle timeout.
    let (n, _) = c.call::<Sleepy>(server.local_addr(), &(21, 800_000), Bytes::new(), opts_ms(5_000)).await.unwrap();
    assert_eq!(n, 42);
    server.shutdown().await;
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_accept() {
    let config = ServerConfig { max_connections: 2, ..ServerConfig::default() };
    let (server, _) = start(config).await;
    let c1 = client(one_conn());
    let c2 = client(one_conn());
    for c in [&c1, &c2] {
        c.call::<Echo>(server.local_addr(), &"x".to_string(), Bytes::new(), opts_ms(2_000)).await.unwrap();
    }
    let mut third = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    closed_within(&mut third, Duration::from_secs(2)).await;
    let c3 = client(one_conn());
    assert!(c3.call::<Echo>(server.local_addr(), &"x".to_string(), Bytes::new(), opts_ms(1_000)).await.is_err());
    // The first two keep working.
    for c in [&c1, &c2] {
        c.call::<Echo>(server.local_addr(), &"y".to_string(), Bytes::new(), opts_ms(2_000)).await.unwrap();
    }
    server.shutdown().await;
}

#[tokio::test]
async fn requests_beyond_the_byte_budget_are_refused_not_buffered() {
    // Budget for one 600 KiB request at a time.
    let config = ServerConfig { max_frame_bytes: 1 << 20, max_in_flight_bytes: 1 << 20, ..ServerConfig::default() };
    let (server, _) = start(config).await;
    let addr = server.local_addr().to_string();
    let c = client(ClientConfig { connections_per_addr: 2, ..ClientConfig::default() });
    let big = Bytes::from(vec![1u8; 600 << 10]);
    // The first holds its budget for 1.5 s.
    let first = {
        let (c, addr, big) = (c.clone(), addr.clone(), big.clone());
        tokio::spawn(async move { c.call::<Sleepy>(&addr, &(1, 1_500_000), big, opts_ms(10_000)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = c.call::<Sleepy>(&addr, &(2, 0), big.clone(), opts_ms(5_000)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Overloaded, "{err}");
    // Small requests still fit beside it, on the same connections.
    let (n, _) = c.call::<Sleepy>(&addr, &(5, 0), Bytes::from_static(b"tiny"), opts_ms(2_000)).await.unwrap();
    assert_eq!(n, 10);
    let (n, payload) = first.await.unwrap().unwrap();
    assert_eq!((n, payload.len()), (2, 600 << 10));
    // The budget came back.
    let (n, _) = c.call::<Sleepy>(&addr, &(3, 0), big, opts_ms(5_000)).await.unwrap();
    assert_eq!(n, 6);
    server.shutdown().await;
}

/// Sends `request` on a new connection and reads until the server closes it
/// (bounded): the whole HTTP response.
async fn http_exchange(addr: &str, request: &[u8]) -> String {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut out)).await.expect("the server closed the HTTP connection").unwrap();
    String::from_utf8(out).unwrap()
}

/// `name{labels} value` → value, from OpenMetrics text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

#[tokio::test]
async fn http_metrics_and_rpc_share_the_port() {
    let (server, _) = start(ServerConfig::default()).await;
    let addr = server.local_addr().to_string();
    let c = client(one_conn());
    let (r, _) = c.call::<Echo>(&addr, &"hi".to_string(), Bytes::new(), opts_ms(2_000)).await.unwrap();
    assert_eq!(r, "hi");
    let _ = c.call::<Missing>(&addr, &(), Bytes::new(), opts_ms(2_000)).await.unwrap_err();

    let resp = http_exchange(&addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(resp.contains("Content-Type: application/openmetrics-text"), "{resp}");
    assert_eq!(sample(&resp, "fskv_rpc_requests_total{method=\"test.Echo\"}"), Some(1.0), "{resp}");
    assert_eq!(sample(&resp, "fskv_rpc_request_duration_seconds_count{method=\"test.Echo\"}"), Some(1.0), "{resp}");
    assert_eq!(sample(&resp, "fskv_rpc_request_errors_total{method=\"unknown\",code=\"UnknownMethod\"}"), Some(1.0), "{resp}");
    assert_eq!(sample(&resp, "fskv_rpc_requests_in_flight"), Some(0.0), "{resp}");
    // The RPC connection and this HTTP one are open.
    assert_eq!(sample(&resp, "fskv_rpc_connections_open"), Some(2.0), "{resp}");
    assert!(resp.ends_with("# EOF\n"), "{resp}");

    // Another path: 404, closed.
    let resp = http_exchange(&addr, b"GET / HTTP/1.1\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 404 "), "{resp}");
    // Malformed: 400, closed.
    let resp = http_exchange(&addr, b"GET \x01\x02 nonsense\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 400 "), "{resp}");
    // Oversized head: 431, closed. The server reads exactly up to the limit
    // (sending more would only turn its close into a reset here).
    let mut big = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    big.resize(fskv_rpc::http::MAX_HTTP_REQUEST_BYTES, b'a');
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let _ = sock.write_all(&big).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut out)).await.expect("closed");
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 431 "), "{}", String::from_utf8_lossy(&out));

    // RPC on the same port still works, on the old and on a new connection.
    let (r, _) = c.call::<Echo>(&addr, &"again".to_string(), Bytes::new(), opts_ms(2_000)).await.unwrap();
    assert_eq!(r, "again");
    let (r, _) = client(one_conn()).call::<Echo>(&addr, &"new".to_string(), Bytes::new(), opts_ms(2_000)).await.unwrap();
    assert_eq!(r, "new");
    let resp = http_exchange(&addr, b"GET /metrics HTTP/1.0\r\n\r\n").await;
    assert_eq!(sample(&resp, "fskv_rpc_requests_total{method=\"test.Echo\"}"), Some(3.0), "{resp}");
    assert_eq!(sample(&resp, "fskv_rpc_http_requests_total{status=\"404\"}"), Some(1.0), "{resp}");
    assert_eq!(sample(&resp, "fskv_rpc_http_requests_total{status=\"431\"}"), Some(1.0), "{resp}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_stalled_http_request_is_closed_by_the_frame_read_timeout() {
    let config = ServerConfig { frame_read_timeout_ms: 300, ..ServerConfig::default() };
    let (server, _) = start(config).await;
    let mut sock = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    sock.write_all(b"GET /metr").await.unwrap();
    let took = closed_within(&mut sock, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(250), "closed after {took:?}");
    // A peer that sends fewer than 4 bytes and stops: closed at the idle timeout.
    server.shutdown().await;
    let config = ServerConfig { idle_timeout_ms: 300, ..ServerConfig::default() };
    let (server, _) = start(config).await;
    let mut sock = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    sock.write_all(b"GE").await.unwrap();
    closed_within(&mut sock, Duration::from_secs(3)).await;
    let c = client(one_conn());
    let (r, _) = c.call::<Echo>(server.local_addr(), &"ok".to_string(), Bytes::new(), opts_ms(2_000)).await.unwrap();
    assert_eq!(r, "ok");
    server.shutdown().await;
}

/// A connection that swallows requests and never sends a byte (what a
/// stream that lost data without an error looks like) is closed after
/// `SILENT_TIMEOUTS_BEFORE_CLOSE` timed-out calls in a row, and the next
/// call dials a new one; before, every later call on it ran to its deadline.
#[tokio::test]
async fn a_connection_that_answers_nothing_is_closed_and_redialled() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let hole = tokio::spawn({
        let accepted = accepted.clone();
        async move {
            let mut held = Vec::new();
            while let Ok((mut sock, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                held.push(tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
                }));
            }
        }
    });
    // No cluster key: the black hole does not speak the handshake.
    let c = client(ClientConfig { cluster_key: None, ..one_conn() });
    assert_eq!(fskv_rpc::client::SILENT_TIMEOUTS_BEFORE_CLOSE, 2);
    for round in 1..=2 {
        let e = c.call::<Echo>(&addr, &"x".to_string(), Bytes::new(), opts_ms(50)).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::DeadlineExceeded, "{e}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "round {round}: still the first connection");
    }
    // The second silent timeout closed it: the third call dials again.
    let e = c.call::<Echo>(&addr, &"x".to_string(), Bytes::new(), opts_ms(50)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::DeadlineExceeded, "{e}");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "a new connection after two silent timeouts");
    hole.abort();
}

/// Timeouts on a connection that keeps delivering replies to other calls
/// do not close it (a slow handler is not a dead connection).
#[tokio::test]
async fn timeouts_with_replies_in_between_keep_the_connection() {
    let (server, probe) = start(ServerConfig::default()).await;
    let c = client(one_conn());
    let addr = server.local_addr().to_string();
    for _ in 0..4 {
        let e = c.call::<Block>(&addr, &(), Bytes::new(), opts_ms(50)).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::DeadlineExceeded);
        let (echo, _) = c.call::<Echo>(&addr, &"hi".to_string(), Bytes::new(), opts_ms(5_000)).await.unwrap();
        assert_eq!(echo, "hi");
    }
    assert_eq!(probe.started.load(Ordering::SeqCst), 4);
    assert_eq!(server.metrics().rpc().connections_accepted.get(), 1, "one connection throughout");
    server.shutdown().await;
}
