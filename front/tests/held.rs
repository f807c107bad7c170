//! The front's bounds on held requests, end to end through `fskv_front::start`
//! and a real listener, with a stand-in gateway program that starts but
//! never reports ready (so every request is held): past the queue bound a
//! request gets 503 `SlowDown` with `Retry-After` at once; past the wait
//! bound (`queue_timeout_ms`) the held ones get the same, not a hang; the
//! start timeout kills the stuck process; `/status` counts it all.

use bytes::Bytes;
use fskv_front::config::{FrontConfig, PoolBounds};
use fskv_front::proxy::ListenMode;
use fskv_front::{FrontOptions, GatewayLaunch, ListenerSpec};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, Option<String>, String, Duration) {
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    let start = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(20), client.get(format!("http://{addr}{path}").parse().unwrap()))
        .await
        .expect("a held request hung")
        .expect("a response");
    let status = resp.status().as_u16();
    let retry_after = resp.headers().get(http::header::RETRY_AFTER).map(|v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, retry_after, String::from_utf8_lossy(&body).into_owned(), start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_and_wait_bounds_requests_get_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    // A gateway that never serves: it runs until stopped and never writes its address.
    let program = dir.path().join("stuck-gateway");
    std::fs::write(&program, "#!/bin/sh\nexec sleep 30\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let credentials = dir.path().join("credentials.json");
    std::fs::write(&credentials, r#"{"access_key": "AK", "secret_key": "SK"}"#).unwrap();

    let config = FrontConfig {
        max_queue: 2,
        queue_timeout_ms: 400,
        start_timeout_ms: 1_000,
        stop_grace_ms: 1_000,
        s3: fskv_front::config::ProtocolPools {
            reader: PoolBounds { min: 0, max: 1 },
            writer: PoolBounds { min: 0, max: 1 },
            ..Default::default()
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
            program,
            config_file: None,
            mgmtd: vec!["127.0.0.1:1".into()],
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

    // Two are held (the queue bound), the third is refused at once.
    let held: Vec<_> = (0..2).map(|i| tokio::spawn(get(addr, if i == 0 { "/b/k0" } else { "/b/k1" }))).collect();
    let st = async {
        loop {
            let st = fskv_front::admin::fetch_status(&admin, Duration::from_secs(5)).await.unwrap();
            if st.pools.iter().any(|p| p.role == "reader" && p.queued == 2) {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let st = tokio::time::timeout(Duration::from_secs(5), st).await.expect("two requests held");
    let readers = st.pools.iter().find(|p| p.role == "reader").unwrap();
    assert_eq!(readers.processes.len(), 1, "the first request started a process: {st:#?}");
    assert_eq!(readers.processes[0].state, "starting");

    let (status, retry_after, body, took) = get(addr, "/b/k2").await;
    assert_eq!((status, retry_after.as_deref()), (503, Some("1")), "{body}");
    assert!(body.contains("<Code>SlowDown</Code>"), "{body}");
    assert!(took < Duration::from_millis(300), "a full queue refuses at once, not after {took:?}");

    for h in held {
        let (status, retry_after, body, took) = h.await.unwrap();
        assert_eq!((status, retry_after.as_deref()), (503, Some("1")), "{body}");
        assert!(body.contains("<Code>SlowDown</Code>") && body.contains("in time"), "{body}");
        assert!(took >= Duration::from_millis(390) && took < Duration::from_secs(3), "held for {took:?}, bound 400 ms");
    }

    // The stuck start is killed at start_timeout_ms and counted as a failed start.
    let counted = async {
        loop {
            let st = fskv_front::admin::fetch_status(&admin, Duration::from_secs(5)).await.unwrap();
            let r = st.pools.iter().find(|p| p.role == "reader").unwrap().clone();
            if r.start_failures >= 1 {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let r = tokio::time::timeout(Duration::from_secs(5), counted).await.expect("the stuck start was killed");
    assert_eq!(r.rejected, 3, "{r:#?}");
    assert_eq!(r.requests, 0, "nothing reached a process: {r:#?}");
    front.stop().await;
}
