//! Static upstreams (gateways on other hosts) through `fskv_front::start`:
//! one live stand-in gateway (a minimal HTTP/1.1 server on loopback) and
//! one dead address. Reads succeed — a read sent to the dead one is sent
//! again to the live one —, the health check takes the dead one out
//! (`down` in `/status`) so later reads go straight to the live one, and
//! with every upstream down the pool answers 503 with `Retry-After` at once.

use bytes::Bytes;
use fskv_front::config::{FrontConfig, PoolBounds, ProtocolPools};
use fskv_front::proxy::ListenMode;
use fskv_front::{FrontOptions, GatewayLaunch, ListenerSpec};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every request head with `200 ok` (keep-alive); counts requests.
async fn stand_in_gateway(listener: tokio::net::TcpListener, served: Arc<AtomicU64>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { return };
        let served = served.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    served.fetch_add(1, Ordering::SeqCst);
                    if sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                        return;
                    }
                }
                match sock.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        });
    }
}

async fn get(addr: std::net::SocketAddr) -> (u16, Option<String>, String) {
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    let resp = tokio::time::timeout(Duration::from_secs(10), client.get(format!("http://{addr}/b/k").parse().unwrap()))
        .await
        .expect("a request hung")
        .expect("a response");
    let status = resp.status().as_u16();
    let retry_after = resp.headers().get(http::header::RETRY_AFTER).map(|v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, retry_after, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_static_upstream_is_taken_out_and_reads_go_to_the_live_one() {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials.json");
    std::fs::write(&credentials, r#"{"access_key": "AK", "secret_key": "SK"}"#).unwrap();
    let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let live_addr = live.local_addr().unwrap().to_string();
    let served = Arc::new(AtomicU64::new(0));
    let server = tokio::spawn(stand_in_gateway(live, served.clone()));
    // A port with nothing listening (bound, then closed).
    let dead_addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();

    let config = FrontConfig {
        health_interval_ms: 200,
        upstream_connect_timeout_ms: 500,
        s3: ProtocolPools {
            // The dead one first: the lowest id takes the first requests.
            reader_upstreams: vec![dead_addr.clone(), live_addr.clone()],
            writer_upstreams: vec![dead_addr.clone()],
            reader: PoolBounds { min: 0, max: 1 },
            writer: PoolBounds { min: 0, max: 1 },
        },
        ..FrontConfig::default()
    };
    let opts = FrontOptions {
        listeners: vec![ListenerSpec {
            protocol: fskv_front::protocols::lookup("s3").unwrap(),
            addr: "127.0.0.1:0".parse().unwrap(),
            mode: ListenMode::Route,
        }],
        admin: Some("127.0.0.1:0".parse().unwrap()),
        launch: GatewayLaunch {
            program: "/nonexistent".into(),
            config_file: None,
            mgmtd: Vec::new(),
            credentials,
            region: "us-east-1".into(),
            extra_args: Vec::new(),
            log_dir: None,
        },
        config,
        http: fskv_gateway::HttpLimits::default(),
        tls: None,
        socket_dir: None,
    };
    let front = fskv_front::start(opts).await.unwrap();
    let addr = front.addr("s3", ListenMode::Route).unwrap();
    let admin = front.admin.as_ref().unwrap().addr.to_string();

    for _ in 0..20 {
        let (status, _, body) = get(addr).await;
        assert_eq!((status, body.as_str()), (200, "ok"));
    }
    assert_eq!(served.load(Ordering::SeqCst), 20, "every read answered by the live upstream");
    let st = fskv_front::admin::fetch_status(&admin, Duration::from_secs(5)).await.unwrap();
    let readers = st.pools.iter().find(|p| p.role == "reader").unwrap();
    assert_eq!(readers.kind, "static");
    let state_of = |a: &str| readers.processes.iter().find(|p| p.address.as_deref() == Some(a)).map(|p| p.state.clone());
    assert_eq!(state_of(&dead_addr).as_deref(), Some("down"), "{readers:#?}");
    assert_eq!(state_of(&live_addr).as_deref(), Some("ready"), "{readers:#?}");
    assert_eq!(readers.starts, 0, "static upstreams are never started");

    // Writes: the only writer upstream is dead → 503 with Retry-After once
    // the probe took it out (before that, the write fails with 502: it is
    // not resent).
    let put = || async {
        let client: Client<HttpConnector, http_body_util::Full<Bytes>> =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
        let req = http::Request::put(format!("http://{addr}/b/k")).body(http_body_util::Full::new(Bytes::from_static(b"x"))).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req)).await.expect("a write hung").unwrap();
        (resp.status().as_u16(), resp.headers().get(http::header::RETRY_AFTER).map(|v| v.to_str().unwrap().to_string()))
    };
    let mut last = put().await;
    for _ in 0..50 {
        if last.0 == 503 {
            break;
        }
        assert_eq!(last.0, 502, "a write to a dead upstream before its probe: 502");
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = put().await;
    }
    assert_eq!(last, (503, Some("5".to_string())), "every writer upstream down: 503 at once");
    front.stop().await;
    server.abort();
}
