//! KV, Consul and MQ through the front of `fskv up` (real processes: the
//! cluster, the front, the gateway processes it starts on demand):
//!
//! | what | how it is checked |
//! |---|---|
//! | pools start from zero | the front's `/status`: no KV, Consul or MQ process before the first request |
//! | SigV4 verifies through the front (KV, service `kv`; SQS, service `sqs`) | signed PUT/GET and SendMessage/ReceiveMessage succeed; the same requests signed with a wrong secret are refused by the gateway behind the front |
//! | bearer tokens pass (KV native API, Consul `X-Consul-Token`) | a GET with the token on the routed and on the read-only port |
//! | writes never reach a reader | after the writes, the reader pools have served no request and have no process; receives (state changes) went to the MQ writer pool |
//! | the read-only ports refuse writes as a direct reader does | a PUT to P+6 (KV) and P+8 (Consul) gets the status, code and message of the same PUT sent straight to the reader process |
//! | `fskv admin status --front` shows the pools | its output names the `kv`, `consul` and `mq` pools |
//! | a connection handed over to a gateway process is recycled | keep-alive GETs on one raw connection to P+1: after `handed_connection_max_age_ms` (1 s here) a response carries `Connection: close` and the process closes the connection; the front counts the handover |
//!
//! `fskv/tests/kv_gateway.rs` and deploy/{kv,mq}-conformance.sh run their
//! whole suites through the same front.

mod common;

use bytes::Bytes;
use common::{free_base_port, metric_sum, start_up_with, UpGuard};
use fskv_front::admin::{fetch_status, FrontStatus};
use fskv_front::pool::PoolStatus;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::path::Path;
use std::time::Duration;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

const CONFIG: &str = r#"
[front]
queue_timeout_ms = 30000
handed_connection_max_age_ms = 1000

[front.kv]
reader = { min = 0, max = 2 }
writer = { min = 0, max = 1 }
"#;

struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    ak: String,
    sk: String,
}

type Reply = (StatusCode, http::HeaderMap, Bytes);

impl Http {
    /// A SigV4-signed request (`service`: `kv`, `sqs`), payload hash in `x-amz-content-sha256`.
    fn signed(
        &self,
        service: &str,
        method: Method,
        (host, target): (&str, &str),
        headers: &[(&str, &str)],
        body: Bytes,
        secret: &str,
    ) -> Request<Full<Bytes>> {
        common::sigv4::signed_request((&self.ak, secret), service, method, (host, target), headers, body)
    }

    fn plain(method: Method, host: &str, target: &str, headers: &[(&str, &str)], body: Bytes) -> Request<Full<Bytes>> {
        let mut req = Request::builder().method(method).uri(format!("http://{host}{target}")).header("host", host);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(Full::new(body)).unwrap()
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> Reply {
        common::http::send(&self.client, req, REQUEST_TIMEOUT).await
    }

    async fn ok(&self, req: Request<Full<Bytes>>) -> Bytes {
        let what = format!("{} {}", req.method(), req.uri());
        let (s, _, b) = self.send(req).await;
        assert!(s.is_success(), "{what}: {s} {}", String::from_utf8_lossy(&b));
        b
    }

    /// An SQS JSON-protocol call through `host`, signed for service `sqs`.
    async fn sqs(&self, host: &str, op: &str, body: serde_json::Value, secret: &str) -> (StatusCode, serde_json::Value) {
        let target = format!("AmazonSQS.{op}");
        let headers = [("content-type", "application/x-amz-json-1.0"), ("x-amz-target", target.as_str())];
        let req = self.signed("sqs", Method::POST, (host, "/"), &headers, Bytes::from(body.to_string()), secret);
        let (s, _, b) = self.send(req).await;
        (s, serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null))
    }
}

/// Keep-alive GETs on one raw connection to the routed KV port (handed to
/// the KV reader by its first request): within a bound after the 1 s max
/// age, a response says `Connection: close` and the connection ends; every
/// response before it was a whole, correct value.
async fn handed_connection_is_recycled(kv: &str, bearer: &str, value: &Bytes) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(kv).await.unwrap();
    let req = format!("GET /v1/kv/front/k1 HTTP/1.1\r\nHost: {kv}\r\nAuthorization: {bearer}\r\n\r\n");
    let start = std::time::Instant::now();
    let mut buf: Vec<u8> = Vec::new();
    let mut responses = 0;
    loop {
        assert!(start.elapsed() < Duration::from_secs(5), "no `Connection: close` within 5 s ({responses} responses)");
        s.write_all(req.as_bytes()).await.unwrap();
        // One response: the head, then Content-Length bytes.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut chunk)).await.expect("a response").unwrap();
            assert!(n > 0, "the connection closed before a response head ({responses} responses)");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let len: usize =
            head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).expect("Content-Length");
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut chunk)).await.expect("a body").unwrap();
            assert!(n > 0, "the body was cut");
            buf.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(&buf[head_end..head_end + len], &value[..]);
        buf.drain(..head_end + len);
        responses += 1;
        if head.lines().any(|l| l.trim() == "connection: close") {
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(900), "closed after {took:?}, before the 1 s max age");
            let mut rest = [0u8; 16];
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut rest)).await.expect("the connection stays open").unwrap_or(0);
            assert_eq!(n, 0, "bytes after `Connection: close`");
            println!("handed connection recycled after {took:?} and {responses} responses");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pool<'a>(st: &'a FrontStatus, protocol: &str, role: &str) -> &'a PoolStatus {
    st.pools.iter().find(|p| p.protocol == protocol && p.role == role).unwrap_or_else(|| panic!("no {protocol} {role} pool: {st:#?}"))
}

fn live(p: &PoolStatus) -> usize {
    p.processes.iter().filter(|x| matches!(x.state.as_str(), "starting" | "ready" | "suspect")).count()
}

#[test]
fn kv_consul_and_sqs_through_the_front() {
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
    let e: serde_json::Value = serde_json::from_slice(&std::fs::read(data.join("endpoints.json")).unwrap()).unwrap();
    let port = |off: u16| format!("127.0.0.1:{}", base + off);
    for (key, off) in [("kv", 1), ("kv_reader", 6), ("mq", 2), ("mq_reader", 7), ("sqs", 2), ("consul", 3), ("consul_reader", 8)] {
        assert_eq!(e[key], format!("http://{}", port(off)), "endpoints.json {key}");
    }
    let admin = port(10);
    let token = e["bearer_token"].as_str().unwrap().to_string();
    let bearer = format!("Bearer {token}");
    // A connection per request: through the front a connection is handed
    // over to the pool of its first request, and every later request on it
    // goes where it went; with one request each, the pools' counts are the
    // requests' routing.
    let h = Http {
        client: Client::builder(hyper_util::rt::TokioExecutor::new()).pool_max_idle_per_host(0).build(HttpConnector::new()),
        ak: e["access_key"].as_str().unwrap().to_string(),
        sk: e["secret_key"].as_str().unwrap().to_string(),
    };
    let sk = h.sk.clone();
    let status = || async { fetch_status(&admin, Duration::from_secs(5)).await.expect("front status") };

    // ---- Every pool starts from zero.
    let st = status().await;
    for proto in ["kv", "consul", "mq"] {
        for role in ["reader", "writer"] {
            assert_eq!(live(pool(&st, proto, role)), 0, "{proto} {role} starts empty: {st:#?}");
        }
    }

    // ---- KV writes with SigV4 through P+1: the writer pool only.
    let kv = port(1);
    let value = Bytes::from((0..1024u32).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>());
    h.ok(h.signed("kv", Method::PUT, (&kv, "/v1/ns/front"), &[], Bytes::new(), &sk)).await;
    h.ok(h.signed("kv", Method::PUT, (&kv, "/v1/kv/front/k1"), &[], value.clone(), &sk)).await;
    let st = status().await;
    assert_eq!(live(pool(&st, "kv", "writer")), 1, "{st:#?}");
    let r = pool(&st, "kv", "reader");
    assert_eq!((live(r), r.requests), (0, 0), "no KV write reached a reader: {st:#?}");

    // ---- KV reads: SigV4 through P+1 (reader pool), bearer on P+1 and P+6.
    assert_eq!(h.ok(h.signed("kv", Method::GET, (&kv, "/v1/kv/front/k1"), &[], Bytes::new(), &sk)).await, value);
    assert_eq!(h.ok(Http::plain(Method::GET, &kv, "/v1/kv/front/k1", &[("authorization", &bearer)], Bytes::new())).await, value);
    assert_eq!(h.ok(Http::plain(Method::GET, &port(6), "/v1/kv/front/k1", &[("authorization", &bearer)], Bytes::new())).await, value);
    // A batch get over POST is a read.
    let st = status().await;
    assert_eq!(pool(&st, "kv", "reader").requests, 3, "every KV read went to the reader pool: {st:#?}");
    assert_eq!(pool(&st, "kv", "writer").requests, 2, "and no read to the writer: {st:#?}");
    // A wrong secret: the gateway behind the front refuses it.
    let (s, _, b) = h.send(h.signed("kv", Method::GET, (&kv, "/v1/kv/front/k1"), &[], Bytes::new(), "wrong-secret")).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{}", String::from_utf8_lossy(&b));
    let (s, _, _) = h.send(h.signed("kv", Method::PUT, (&kv, "/v1/kv/front/k2"), &[], value.clone(), "wrong-secret")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // ---- The read-only port refuses a write as the reader process itself does.
    let reader_addr = pool(&status().await, "kv", "reader").processes.iter().find_map(|p| p.address.clone()).expect("a KV reader");
    let reader_addr = reader_addr.trim_start_matches("http://").to_string();
    let via_front = h.send(h.signed("kv", Method::PUT, (&port(6), "/v1/kv/front/k3"), &[], value.clone(), &sk)).await;
    let direct = h.send(h.signed("kv", Method::PUT, (&reader_addr, "/v1/kv/front/k3"), &[], value.clone(), &sk)).await;
    let code = |b: &Bytes| serde_json::from_slice::<serde_json::Value>(b).unwrap_or_default()["error"].clone();
    assert_eq!(via_front.0, StatusCode::FORBIDDEN);
    assert_eq!((via_front.0, code(&via_front.2)["code"].clone()), (direct.0, code(&direct.2)["code"].clone()));
    assert_eq!(code(&via_front.2)["code"], "ReadOnlyGateway");
    let msg = code(&via_front.2)["message"].as_str().unwrap_or("").to_string();
    assert!(msg.contains(&format!("http://{kv}")), "the refusal names the routed KV endpoint: {msg}");
    assert_eq!(msg, code(&direct.2)["message"].as_str().unwrap_or(""));
    let st = status().await;
    assert_eq!(
        pool(&st, "kv", "writer").requests,
        3,
        "the refused write never reached the writer pool (2 + the wrong-secret PUT): {st:#?}"
    );

    // ---- Consul through P+3 / P+8 (X-Consul-Token).
    let consul = port(3);
    let tok = [("x-consul-token", token.as_str())];
    assert_eq!(&h.ok(Http::plain(Method::PUT, &consul, "/v1/kv/svc/a", &tok, Bytes::from_static(b"v1"))).await[..], b"true");
    assert_eq!(&h.ok(Http::plain(Method::GET, &consul, "/v1/kv/svc/a?raw", &tok, Bytes::new())).await[..], b"v1");
    assert_eq!(&h.ok(Http::plain(Method::GET, &port(8), "/v1/kv/svc/a?raw", &tok, Bytes::new())).await[..], b"v1");
    let (s, _, b) = h.send(Http::plain(Method::PUT, &port(8), "/v1/kv/svc/b", &tok, Bytes::from_static(b"x"))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{}", String::from_utf8_lossy(&b));
    assert!(String::from_utf8_lossy(&b).contains(&format!("http://{consul}")), "{}", String::from_utf8_lossy(&b));
    let (s, _, _) = h.send(Http::plain(Method::GET, &consul, "/v1/kv/svc/a?raw", &[("x-consul-token", "wrong")], Bytes::new())).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the Consul gateway behind the front checks the token (BadBearerToken)");
    let st = status().await;
    assert_eq!(pool(&st, "consul", "writer").requests, 1, "{st:#?}");
    assert!(pool(&st, "consul", "reader").requests >= 3, "{st:#?}");

    // ---- SQS with SigV4 through P+2: every call but GetQueueAttributes is a mutation (ReceiveMessage too).
    let mq = port(2);
    let (s, v) = h.sqs(&mq, "CreateQueue", serde_json::json!({"QueueName": "frontq"}), &sk).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let url = v["QueueUrl"].as_str().expect("QueueUrl").to_string();
    assert!(url.starts_with(&format!("http://{mq}/")), "queue URLs name the front: {url}");
    let (s, v) = h.sqs(&mq, "SendMessage", serde_json::json!({"QueueUrl": url, "MessageBody": "hello through the front"}), &sk).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) =
        h.sqs(&mq, "ReceiveMessage", serde_json::json!({"QueueUrl": url, "MaxNumberOfMessages": 1, "WaitTimeSeconds": 5}), &sk).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let m = &v["Messages"][0];
    assert_eq!(m["Body"], "hello through the front", "{v}");
    let (s, v) = h.sqs(&mq, "DeleteMessage", serde_json::json!({"QueueUrl": url, "ReceiptHandle": m["ReceiptHandle"]}), &sk).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = h.sqs(&mq, "SendMessage", serde_json::json!({"QueueUrl": url, "MessageBody": "x"}), "wrong-secret").await;
    assert!(s == StatusCode::FORBIDDEN || s == StatusCode::BAD_REQUEST, "a wrong secret is refused: {s} {v}");
    let st = status().await;
    let (r, w) = (pool(&st, "mq", "reader"), pool(&st, "mq", "writer"));
    assert_eq!((live(r), r.requests), (0, 0), "no SQS mutation (ReceiveMessage included) reached an MQ reader: {st:#?}");
    assert_eq!(w.requests, 5, "create, send, receive, delete and the refused send went to the writer: {st:#?}");
    assert_eq!(live(w), 1);
    let (s, v) = h.sqs(&mq, "GetQueueAttributes", serde_json::json!({"QueueUrl": url, "AttributeNames": ["All"]}), &sk).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let st = status().await;
    assert_eq!(pool(&st, "mq", "reader").requests, 1, "a read went to the reader pool: {st:#?}");
    // A receive on the read-only port is refused by the reader (it would change the queue).
    let (s, v) = h.sqs(&port(7), "ReceiveMessage", serde_json::json!({"QueueUrl": url}), &sk).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");

    // ---- A connection handed over to the KV reader is recycled after its max age.
    handed_connection_is_recycled(&kv, &bearer, &value).await;
    let front_metrics = h.ok(Http::plain(Method::GET, &kv, "/metrics", &[], Bytes::new())).await;
    let handed = metric_sum(
        &String::from_utf8_lossy(&front_metrics),
        "fskv_gateway_front_handed_over_total",
        &[("protocol", "kv"), ("role", "reader")],
    );
    assert!(handed >= 1.0, "the raw connection was handed to the KV reader pool: {}", String::from_utf8_lossy(&front_metrics));

    // ---- `fskv admin status --front` shows the new pools.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fskv")).args(["admin", "status", "--front", &admin]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    for (proto, role) in
        [("kv", "reader"), ("kv", "writer"), ("consul", "reader"), ("consul", "writer"), ("mq", "reader"), ("mq", "writer")]
    {
        assert!(text.lines().any(|l| l.split_whitespace().take(2).eq([proto, role])), "no {proto} {role} pool line in:\n{text}");
    }
}
