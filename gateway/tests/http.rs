//! The shared HTTP layer over loopback with a small test protocol: timeouts,
//! connection caps, limits, the reader guard, authentication, metrics,
//! request ids and graceful shutdown. Raw TCP clients, so every byte on the
//! wire is the test's choice.

use aws_sigv4::http_request::{sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings};
use bytes::Bytes;
use fskv_gateway::{
    Access, AccessKey, AuthPolicy, Authenticator, BodyClass, GatewayError, HttpLimits, KeyStore, Metrics, MetricsEndpoint, Protocol,
    RequestBody, RequestContext, Role, Route, ServerConfig, ServerHandle,
};
use http::request::Parts;
use http::{Request, Response};
use http_body_util::Full;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const AK: &str = "TESTKEY";
const SK: &str = "test-secret";
const TOKEN: &str = "bearer-token-for-tests-0001";

/// Routes: `/open/*` open, `/auth/*` authenticated here, others delegated;
/// paths with `/data` carry data bodies, other PUT/POST control bodies; GET `/slow` waits
/// 600 ms; GET `/big` answers 32 MiB.
struct Echo;

impl Protocol for Echo {
    type Body = Full<Bytes>;

    fn name(&self) -> &'static str {
        "test"
    }

    fn classify(&self, parts: &Parts) -> Route {
        let path = parts.uri.path();
        let auth = if path.starts_with("/open") {
            AuthPolicy::Open
        } else if path.starts_with("/auth") {
            AuthPolicy::Required
        } else {
            AuthPolicy::Delegated
        };
        let (access, body) = match parts.method {
            http::Method::GET | http::Method::HEAD => (Access::Read, BodyClass::Bodiless),
            http::Method::DELETE => (Access::Mutation, BodyClass::Bodiless),
            _ if path.contains("/data") => (Access::Mutation, BodyClass::Data),
            _ => (Access::Mutation, BodyClass::Control),
        };
        Route { name: if access == Access::Read { "read" } else { "write" }, access, body, auth }
    }

    async fn handle(&self, req: Request<RequestBody>, cx: RequestContext) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let text = match parts.uri.path() {
            "/slow" => {
                tokio::time::sleep(Duration::from_millis(600)).await;
                "slow done".to_string()
            }
            "/big" => return Response::new(Full::new(Bytes::from(vec![b'x'; 32 << 20]))),
            _ => match body.collect().await {
                Ok(b) => format!("{} bytes as {}", b.len(), cx.principal.as_ref().map_or("nobody", |p| p.user.as_str())),
                Err(e) => {
                    let r = e.reply();
                    let mut resp = Response::new(Full::new(Bytes::from(r.code.to_string())));
                    *resp.status_mut() = r.status;
                    return resp;
                }
            },
        };
        Response::new(Full::new(Bytes::from(text)))
    }

    fn error_response(&self, err: &GatewayError, cx: &RequestContext) -> Response<Bytes> {
        err.reply().json(&cx.request_id)
    }
}

struct Server {
    handle: ServerHandle,
    addr: SocketAddr,
}

async fn start(role: Role, f: impl FnOnce(&mut HttpLimits)) -> Server {
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap(), role);
    cfg.writer_endpoint = Some("http://writer.example:9000".into());
    f(&mut cfg.limits);
    let mut key = AccessKey::new(AK, SK);
    key.user = "alice".into();
    key.bearer_token = Some(TOKEN.into());
    let keys = Arc::new(KeyStore::new(vec![key]).unwrap());
    let auth = Arc::new(Authenticator::new(keys, "us-east-1", &["s3", "kv"], true));
    let handle = fskv_gateway::serve(cfg, Arc::new(Echo), auth, Arc::new(Metrics::new())).await.unwrap();
    Server { addr: handle.addr, handle }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response (Content-Length bodies only); `None` if the
/// connection closed first.
async fn read_response(s: &mut TcpStream) -> Option<Resp> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => buf.extend_from_slice(&tmp[..n]),
            Err(_) => panic!("no response within 10 s"),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let len: usize = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-length")).map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some(Resp { status, headers, body })
}

async fn send(addr: SocketAddr, raw: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    read_response(&mut s).await.expect("a response")
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes()
}

/// Waits until the peer closes `s` (EOF or reset); returns how long it took.
async fn closed_within(s: &mut TcpStream, bound: Duration) -> Duration {
    let t0 = Instant::now();
    let mut tmp = [0u8; 1024];
    loop {
        match tokio::time::timeout(bound.saturating_sub(t0.elapsed()), s.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return t0.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("connection still open after {bound:?}"),
        }
    }
}

async fn metrics_text(addr: SocketAddr) -> String {
    let r = send(addr, &get("/metrics")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

fn metric_value(text: &str, name: &str, label_part: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(name) && l.contains(label_part)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

// ------------------------------------------------------------------ timeouts

#[tokio::test]
async fn slow_loris_head_is_cut_at_the_header_read_timeout() {
    let srv = start(Role::Writer, |l| l.header_read_timeout_ms = 300).await;
    // Half a header, then nothing.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"GET /open/x HTTP/1.1\r\nHost: t\r\nX-Slow: ").await.unwrap();
    let took = closed_within(&mut s, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(250), "closed too early: {took:?}");
    // A head trickled one byte per 50 ms is cut as well (the deadline covers the whole head).
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let t0 = Instant::now();
    let trickle = async {
        for b in b"GET /open/x HTTP/1.1\r\nHost: t\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n" {
            if s.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    trickle.await;
    assert!(t0.elapsed() < Duration::from_secs(3));
    let mut tmp = [0u8; 64];
    let n = s.read(&mut tmp).await.unwrap_or(0);
    assert_eq!(n, 0, "no response to a head that took longer than the timeout");
    // A connection that never sends a byte is closed too.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    closed_within(&mut s, Duration::from_secs(3)).await;
    let m = metrics_text(srv.addr).await;
    assert!(metric_value(&m, "fskv_gateway_connections_timed_out_total", "reason=\"header_read\"") >= 3.0, "{m}");
    srv.handle.stop().await;
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_but_slow_handlers_are_not() {
    let srv = start(Role::Writer, |l| {
        l.idle_timeout_ms = 400;
        l.header_read_timeout_ms = 300;
    })
    .await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&get("/open/x")).await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().status, 200);
    let took = closed_within(&mut s, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(350), "idle connection closed after {took:?}, before the idle timeout");
    // A handler slower than both timeouts keeps its connection, and the
    // connection serves a next request after it.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&get("/slow")).await.unwrap();
    let r = read_response(&mut s).await.expect("slow response");
    assert_eq!(r.text(), "slow done");
    s.write_all(&get("/open/y")).await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().status, 200);
    let m = metrics_text(srv.addr).await;
    assert!(metric_value(&m, "fskv_gateway_connections_timed_out_total", "reason=\"idle\"") >= 1.0, "{m}");
    srv.handle.stop().await;
}

#[tokio::test]
async fn stalled_body_is_cut_at_the_body_progress_timeout() {
    let srv = start(Role::Writer, |l| l.body_progress_timeout_ms = 300).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let t0 = Instant::now();
    s.write_all(b"PUT /open/data/x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n0123456789").await.unwrap();
    let r = read_response(&mut s).await.expect("a response");
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(r.text(), "RequestTimeout");
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
    // A body that keeps coming, slower in total than the timeout, is fine.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"PUT /open/data/y HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n").await.unwrap();
    for b in b"0123456789" {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(&[*b]).await.unwrap();
    }
    let r = read_response(&mut s).await.unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "10 bytes as nobody"));
    srv.handle.stop().await;
}

#[tokio::test]
async fn a_peer_that_stops_reading_is_disconnected() {
    let srv = start(Role::Writer, |l| l.send_progress_timeout_ms = 300).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&get("/big")).await.unwrap();
    // Read nothing: the server's sends stall once the socket buffers fill.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics_text(srv.addr).await;
        if metric_value(&m, "fskv_gateway_connections_timed_out_total", "reason=\"send_progress\"") >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the stalled connection was not closed:\n{m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(s);
    srv.handle.stop().await;
}

// ------------------------------------------------------------------ connection caps

#[tokio::test]
async fn total_connection_cap_holds_further_connections_back() {
    let srv = start(Role::Writer, |l| l.max_connections = 2).await;
    let mut a = TcpStream::connect(srv.addr).await.unwrap();
    let mut b = TcpStream::connect(srv.addr).await.unwrap();
    a.write_all(&get("/open/a")).await.unwrap();
    b.write_all(&get("/open/b")).await.unwrap();
    assert_eq!(read_response(&mut a).await.unwrap().status, 200);
    assert_eq!(read_response(&mut b).await.unwrap().status, 200);
    // A third connection waits in the backlog: no answer while both are open.
    let mut c = TcpStream::connect(srv.addr).await.unwrap();
    c.write_all(&get("/open/c")).await.unwrap();
    let mut tmp = [0u8; 16];
    assert!(tokio::time::timeout(Duration::from_millis(500), c.read(&mut tmp)).await.is_err(), "served beyond the cap");
    assert_eq!(srv.handle.connections(), 2);
    drop(a);
    let r = read_response(&mut c).await.expect("served once a slot is free");
    assert_eq!(r.status, 200);
    srv.handle.stop().await;
}

#[tokio::test]
async fn per_peer_cap_closes_the_extra_connection() {
    let srv = start(Role::Writer, |l| l.max_connections_per_peer = 2).await;
    let mut a = TcpStream::connect(srv.addr).await.unwrap();
    let mut b = TcpStream::connect(srv.addr).await.unwrap();
    a.write_all(&get("/open/a")).await.unwrap();
    b.write_all(&get("/open/b")).await.unwrap();
    assert_eq!(read_response(&mut a).await.unwrap().status, 200);
    assert_eq!(read_response(&mut b).await.unwrap().status, 200);
    let mut c = TcpStream::connect(srv.addr).await.unwrap();
    let _ = c.write_all(&get("/open/c")).await;
    closed_within(&mut c, Duration::from_secs(3)).await;
    // Others still work on the open connections; a freed slot admits again.
    a.write_all(&get("/open/a2")).await.unwrap();
    assert_eq!(read_response(&mut a).await.unwrap().status, 200);
    drop(b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let m = send(srv.addr, &get("/metrics")).await.text();
    assert_eq!(metric_value(&m, "fskv_gateway_connections_refused_total", "reason=\"per_peer\""), 1.0, "{m}");
    srv.handle.stop().await;
}

// ------------------------------------------------------------------ limits, roles

#[tokio::test]
async fn request_limits_apply_before_the_handler() {
    let srv = start(Role::Writer, |l| {
        l.max_uri_bytes = 300;
        l.max_header_bytes = 2048;
        l.max_body_bytes_control = 100;
        l.max_body_bytes_data = 1000;
    })
    .await;
    let long = format!("/open/{}", "a".repeat(400));
    let r = send(srv.addr, &get(&long)).await;
    assert_eq!(r.status, 414, "{}", r.text());
    let big_header = format!("GET /open/x HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "b".repeat(4000));
    assert_eq!(send(srv.addr, big_header.as_bytes()).await.status, 431);
    // Declared too large: refused without reading the body.
    let r = send(srv.addr, b"PUT /open/doc HTTP/1.1\r\nHost: t\r\nContent-Length: 101\r\n\r\n").await;
    assert_eq!(r.status, 413);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "EntityTooLarge");
    // The data class has its own limit.
    let body = vec![b'z'; 1000];
    let mut raw = b"PUT /open/data/x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n".to_vec();
    raw.extend_from_slice(&body);
    assert_eq!(send(srv.addr, &raw).await.text(), "1000 bytes as nobody");
    // Chunked, no length: cut while streaming.
    let mut raw = b"PUT /open/doc HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        raw.extend_from_slice(b"40\r\n");
        raw.extend_from_slice(&[b'c'; 64]);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let r = send(srv.addr, &raw).await;
    assert_eq!((r.status, r.text().as_str()), (413, "EntityTooLarge"));
    srv.handle.stop().await;
}

#[tokio::test]
async fn reader_refuses_mutations_naming_the_writer() {
    let srv = start(Role::Reader, |_| {}).await;
    assert_eq!(send(srv.addr, &get("/open/x")).await.status, 200);
    for raw in [
        &b"PUT /open/x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"[..],
        b"DELETE /open/x HTTP/1.1\r\nHost: t\r\n\r\n",
        // Refused before the (never sent) body is read.
        b"POST /open/data/x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n",
    ] {
        let r = send(srv.addr, raw).await;
        assert_eq!(r.status, 403);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "ReadOnlyGateway");
        assert!(v["error"]["message"].as_str().unwrap().contains("http://writer.example:9000"), "{v}");
        assert_eq!(v["error"]["request_id"].as_str(), r.header("x-request-id"));
    }
    let m = metrics_text(srv.addr).await;
    assert_eq!(metric_value(&m, "fskv_gateway_requests_refused_total", "reason=\"read_only\""), 3.0, "{m}");
    srv.handle.stop().await;
}

// ------------------------------------------------------------------ authentication

fn signed(method: &str, path: &str, body: &[u8], secret: &str, with_hash: bool, addr: SocketAddr) -> Vec<u8> {
    let host = addr.to_string();
    let creds = aws_credential_types::Credentials::new(AK, secret, None, None, "t");
    let identity = creds.into();
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    if with_hash {
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    }
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("kv")
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let signable = SignableRequest::new(method, path, [("host", host.as_str())].into_iter(), SignableBody::Bytes(body)).unwrap();
    let (instr, _) = sign(signable, &params).unwrap().into_parts();
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in instr.headers() {
        raw.push_str(&format!("{k}: {v}\r\n"));
    }
    raw.push_str("\r\n");
    let mut raw = raw.into_bytes();
    raw.extend_from_slice(body);
    raw
}

#[tokio::test]
async fn required_auth_sigv4_and_bearer() {
    let srv = start(Role::Writer, |_| {}).await;
    let code = |r: &Resp| {
        serde_json::from_slice::<serde_json::Value>(&r.body)
            .map(|v| v["error"]["code"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    let r = send(srv.addr, &signed("PUT", "/auth/k", b"value", SK, true, srv.addr)).await;
    assert_eq!((r.status, r.text().as_str()), (200, "5 bytes as alice"));
    // No x-amz-content-sha256: the layer reads the (signed) body first.
    let r = send(srv.addr, &signed("PUT", "/auth/k", b"{\"x\":1}", SK, false, srv.addr)).await;
    assert_eq!((r.status, r.text().as_str()), (200, "7 bytes as alice"));
    let r = send(srv.addr, &signed("PUT", "/auth/k", b"value", "wrong", true, srv.addr)).await;
    assert_eq!((r.status, code(&r).as_str()), (403, "SignatureDoesNotMatch"));
    let r = send(srv.addr, b"GET /auth/k HTTP/1.1\r\nHost: t\r\n\r\n").await;
    assert_eq!((r.status, code(&r).as_str()), (403, "AccessDenied"));
    let r = send(srv.addr, b"GET /auth/k HTTP/1.1\r\nHost: t\r\nAuthorization: AWS TESTKEY:c2lnbmF0dXJl\r\n\r\n").await;
    assert_eq!((r.status, code(&r).as_str()), (400, "InvalidRequest"));
    let r = send(srv.addr, format!("GET /auth/k HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").as_bytes()).await;
    assert_eq!((r.status, r.text().as_str()), (200, "0 bytes as alice"));
    let r = send(srv.addr, b"GET /auth/k HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer not-a-token-at-all\r\n\r\n").await;
    assert_eq!((r.status, code(&r).as_str()), (401, "InvalidToken"));
    // Delegated routes: the handler checks signatures, but SigV2 and
    // over-long presigned URLs never reach it.
    let r = send(srv.addr, b"GET /d HTTP/1.1\r\nHost: t\r\nAuthorization: AWS TESTKEY:c2lnbmF0dXJl\r\n\r\n").await;
    assert_eq!((r.status, code(&r).as_str()), (400, "InvalidRequest"));
    let date = httpdate_amz(SystemTime::now());
    let q = format!(
        "/d?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={AK}%2F{}%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date={date}&X-Amz-Expires=12096000&X-Amz-SignedHeaders=host&X-Amz-Signature={}",
        &date[..8],
        "0".repeat(64)
    );
    let r = send(srv.addr, &get(&q)).await;
    assert_eq!((r.status, code(&r).as_str()), (400, "AuthorizationQueryParametersError"), "{}", r.text());
    let r = send(srv.addr, &get("/d")).await;
    assert_eq!(r.status, 200, "anonymous on a delegated route reaches the handler");
    srv.handle.stop().await;
}

/// `YYYYMMDDTHHMMSSZ` of a time (test helper, civil-from-days).
fn httpdate_amz(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

// ------------------------------------------------------------------ metrics, request ids, shutdown

/// Checks the OpenMetrics text line by line: descriptors, samples
/// `name{k="v",...} value`, `# EOF` last.
/// (name, labels, value) of one sample.
type Sample = (String, Vec<(String, String)>, f64);

fn parse_openmetrics(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "ends with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut w = rest.splitn(3, ' ');
            let kind = w.next().unwrap();
            assert!(["TYPE", "HELP", "UNIT"].contains(&kind), "{line}");
            assert!(w.next().unwrap().starts_with("fskv_gateway_"), "{line}");
            if kind == "TYPE" {
                assert!(["counter", "gauge", "histogram"].contains(&w.next().unwrap()), "{line}");
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("sample without value: {line}"));
        let value: f64 = if value == "+Inf" { f64::INFINITY } else { value.parse().unwrap_or_else(|_| panic!("bad value: {line}")) };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let inner = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"));
                let labels = inner
                    .split(',')
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("bad label: {line}"));
                        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or_else(|| panic!("unquoted label: {line}"));
                        (k.to_string(), v.to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (series.to_string(), vec![]),
        };
        assert!(name.starts_with("fskv_gateway_") && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "{line}");
        samples.push((name, labels, value));
    }
    samples
}

#[tokio::test]
async fn metrics_parse_and_count_requests() {
    let srv = start(Role::Writer, |_| {}).await;
    for _ in 0..3 {
        assert_eq!(send(srv.addr, &get("/open/x")).await.status, 200);
    }
    let r = send(srv.addr, b"PUT /open/x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello").await;
    assert_eq!(r.status, 200);
    let r = send(srv.addr, &get("/metrics")).await;
    assert!(r.header("content-type").unwrap().starts_with("application/openmetrics-text"));
    let samples = parse_openmetrics(&r.text());
    let find = |name: &str, labels: &[(&str, &str)]| -> f64 {
        samples
            .iter()
            .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v)))
            .map(|(_, _, v)| *v)
            .sum()
    };
    assert_eq!(find("fskv_gateway_requests_total", &[("protocol", "test"), ("route", "read"), ("method", "GET"), ("status", "200")]), 3.0);
    assert_eq!(find("fskv_gateway_requests_total", &[("route", "write"), ("method", "PUT")]), 1.0);
    assert_eq!(find("fskv_gateway_request_duration_seconds_count", &[("route", "read")]), 3.0);
    assert_eq!(find("fskv_gateway_request_body_bytes_total", &[("route", "write")]), 5.0);
    assert!(find("fskv_gateway_response_body_bytes_total", &[("route", "read")]) > 0.0);
    assert_eq!(find("fskv_gateway_requests_in_flight", &[("protocol", "test")]), 1.0, "the metrics request itself");
    assert!(find("fskv_gateway_connections_accepted_total", &[]) >= 5.0);
    srv.handle.stop().await;

    // Bearer-protected metrics.
    let srv = start(Role::Writer, |l| l.metrics_endpoint = MetricsEndpoint::Bearer).await;
    assert_eq!(send(srv.addr, &get("/metrics")).await.status, 403);
    let r = send(srv.addr, format!("GET /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").as_bytes()).await;
    assert_eq!(r.status, 200);
    parse_openmetrics(&r.text());
    srv.handle.stop().await;
}

#[tokio::test]
async fn every_response_carries_a_request_id() {
    let srv = start(Role::Reader, |_| {}).await;
    let a = send(srv.addr, &get("/open/x")).await;
    let b = send(srv.addr, b"DELETE /open/x HTTP/1.1\r\nHost: t\r\n\r\n").await;
    let (ia, ib) = (a.header("x-request-id").unwrap(), b.header("x-request-id").unwrap());
    for id in [ia, ib] {
        assert!(id.len() == 16 && id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
    assert_ne!(ia, ib);
    srv.handle.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_requests_in_flight() {
    let srv = start(Role::Writer, |l| l.shutdown_grace_ms = 5000).await;
    let mut busy = TcpStream::connect(srv.addr).await.unwrap();
    busy.write_all(&get("/slow")).await.unwrap();
    let mut idle = TcpStream::connect(srv.addr).await.unwrap();
    idle.write_all(&get("/open/x")).await.unwrap();
    assert_eq!(read_response(&mut idle).await.unwrap().status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let addr = srv.addr;
    let t0 = Instant::now();
    let stop = tokio::spawn(srv.handle.stop());
    // The idle connection is closed at once; the slow request completes.
    closed_within(&mut idle, Duration::from_secs(2)).await;
    let r = read_response(&mut busy).await.expect("the request in flight finishes");
    assert_eq!(r.text(), "slow done");
    stop.await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(TcpStream::connect(addr).await.is_err(), "no longer listening");
}

#[tokio::test]
async fn shutdown_grace_bounds_a_stuck_request() {
    let srv = start(Role::Writer, |l| l.shutdown_grace_ms = 200).await;
    let mut busy = TcpStream::connect(srv.addr).await.unwrap();
    busy.write_all(&get("/slow")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    srv.handle.stop().await;
    assert!(t0.elapsed() < Duration::from_millis(550), "{:?}", t0.elapsed());
    assert!(read_response(&mut busy).await.is_none(), "cut after the grace");
}

/// Gives back every connection: `/keep*` to be kept, others "not now".
struct Decline(Duration);

impl fskv_gateway::Handoff for Decline {
    fn offer<'a>(
        &'a self,
        head: &'a Parts,
        stream: TcpStream,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<fskv_gateway::handover::Declined>> + Send + 'a>> {
        let recycle_after = if head.uri.path().starts_with("/keep") { None } else { Some(self.0) };
        Box::pin(async move { Some(fskv_gateway::handover::Declined { stream, recycle_after }) })
    }
}

#[tokio::test]
async fn a_connection_no_process_could_take_is_recycled_after_the_max_age() {
    let age = Duration::from_millis(300);
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap(), Role::Writer);
    let keys = Arc::new(KeyStore::new(vec![]).unwrap());
    let auth = Arc::new(Authenticator::new(keys, "us-east-1", &["s3"], false));
    let handle =
        fskv_gateway::serve_with_handoff(cfg, Arc::new(Echo), auth, Arc::new(Metrics::new()), Arc::new(Decline(age))).await.unwrap();
    // Declined "not now": served here, and the first response after the max
    // age closes the connection.
    let mut s = TcpStream::connect(handle.addr).await.unwrap();
    let t0 = Instant::now();
    let mut served = 0;
    loop {
        assert!(t0.elapsed() < Duration::from_secs(5), "never recycled");
        s.write_all(&get("/open/x")).await.unwrap();
        let r = read_response(&mut s).await.expect("a response");
        assert_eq!(r.status, 200, "{}", r.text());
        served += 1;
        if r.header("connection") == Some("close") {
            assert!(t0.elapsed() >= age, "closed before the max age");
            assert!(read_response(&mut s).await.is_none(), "the connection stayed open");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served > 1, "kept alive before the max age");
    // Declined for good: kept alive past the max age.
    let mut s = TcpStream::connect(handle.addr).await.unwrap();
    for _ in 0..2 {
        s.write_all(&get("/keep")).await.unwrap();
        let r = read_response(&mut s).await.expect("a response");
        assert_eq!(r.header("connection"), None);
        tokio::time::sleep(age + Duration::from_millis(50)).await;
    }
    handle.stop().await;
}
