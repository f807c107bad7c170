//! Service identity over real TCP: the handshake of `fskv_rpc::auth` in the
//! client's connect and the server's accept.

use bytes::Bytes;
use fskv_rpc::auth::{ClusterKey, KEY_BYTES};
use fskv_rpc::{CallOptions, ClientConfig, ErrorCode, Method, Router, RpcClient, RpcError, Server, ServerConfig, TcpTransport};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers the principal the server saw.
struct WhoAmI;
impl Method for WhoAmI {
    const ID: u16 = 1;
    const NAME: &'static str = "test.WhoAmI";
    type Req = ();
    type Resp = Option<String>;
}

fn key(b: u8) -> Arc<ClusterKey> {
    Arc::new(ClusterKey::from_bytes([b; KEY_BYTES]))
}

async fn start(key: Option<Arc<ClusterKey>>) -> (Server, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let router = Router::new().route::<WhoAmI, _, _>(move |ctx, (), _| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok((ctx.principal.map(|p| p.name().to_string()), Bytes::new())) }
    });
    let config = ServerConfig { cluster_key: key, handshake_timeout_ms: 500, ..ServerConfig::default() };
    let server = Server::bind(Arc::new(TcpTransport::new()), "127.0.0.1:0", router, config).await.unwrap();
    (server, calls)
}

fn client(key: Option<Arc<ClusterKey>>, principal: &str) -> RpcClient {
    let config = ClientConfig { cluster_key: key, principal: principal.into(), connections_per_addr: 1, ..ClientConfig::default() };
    RpcClient::new(Arc::new(TcpTransport::new()), config)
}

async fn who(c: &RpcClient, addr: &str) -> Result<Option<String>, RpcError> {
    c.call::<WhoAmI>(addr, &(), Bytes::new(), CallOptions { timeout_ms: 3_000 }).await.map(|(r, _)| r)
}

fn metric(server: &Server, reason: &str) -> u64 {
    let text = server.metrics().render();
    let prefix = format!("fskv_rpc_auth_failures_total{{reason=\"{reason}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn same_key_authenticates_and_handlers_see_the_principal() {
    let (server, calls) = start(Some(key(1))).await;
    let c = client(Some(key(1)), "node:4");
    for _ in 0..3 {
        assert_eq!(who(&c, server.local_addr()).await.unwrap().as_deref(), Some("node:4"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // Without a key on either side: today's behaviour, no principal.
    let (open, _) = start(None).await;
    assert_eq!(who(&client(None, "client"), open.local_addr()).await.unwrap(), None);
}

#[tokio::test]
async fn a_client_without_the_key_is_refused_before_any_handler() {
    let (server, calls) = start(Some(key(1))).await;
    let err = who(&client(None, "client"), server.local_addr()).await.unwrap_err();
    // The server closes at the frame magic; the call fails, not hangs.
    assert_eq!(err.code(), ErrorCode::ConnectionFailed, "{err}");
    assert!(err.to_string().contains("this client has none"), "the error names the likely cause: {err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(metric(&server, "bad_magic"), 1);
}

#[tokio::test]
async fn a_wrong_key_fails_on_both_sides_and_is_not_retryable() {
    let (server, calls) = start(Some(key(1))).await;
    let err = who(&client(Some(key(2)), "client"), server.local_addr()).await.unwrap_err();
    assert!(matches!(err, RpcError::Unauthenticated { .. }), "{err}");
    assert!(err.to_string().contains("keys differ"), "{err}");
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    assert!(!err.is_retryable());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The client closed without a proof; the server counts it.
    for _ in 0..100 {
        if metric(&server, "closed") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metric(&server, "closed"), 1);
}

#[tokio::test]
async fn a_keyed_client_refuses_a_server_that_does_not_authenticate() {
    let (server, calls) = start(None).await;
    let err = who(&client(Some(key(1)), "client"), server.local_addr()).await.unwrap_err();
    assert!(matches!(err, RpcError::Unauthenticated { .. }), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_forged_proof_gets_a_refusal_byte_and_a_close() {
    let (server, calls) = start(Some(key(1))).await;
    let mut s = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    let mut hello = b"3FSA\x01\x06node:5".to_vec();
    hello.extend_from_slice(&[9; 32]);
    s.write_all(&hello).await.unwrap();
    let mut challenge = [0u8; 65];
    s.read_exact(&mut challenge).await.unwrap();
    assert_eq!(challenge[0], 0);
    s.write_all(&[0u8; 32]).await.unwrap();
    let mut rest = Vec::new();
    // The verdict byte 4 (bad proof), then end of stream.
    tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut rest)).await.unwrap().unwrap();
    assert_eq!(rest, vec![4]);
    assert_eq!(metric(&server, "bad_proof"), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_silent_peer_is_closed_after_the_handshake_timeout() {
    let (server, _) = start(Some(key(1))).await;
    let started = std::time::Instant::now();
    let mut s = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    // Half a hello, then nothing.
    s.write_all(b"3FSA\x01").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut rest)).await.unwrap().unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(450) && waited < Duration::from_secs(2), "{waited:?}");
    assert!(rest.is_empty());
    assert_eq!(metric(&server, "timeout"), 1);
}

#[tokio::test]
async fn metrics_stay_readable_without_the_key() {
    let (server, _) = start(Some(key(1))).await;
    let mut s = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut resp = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut resp)).await.unwrap().unwrap();
    let resp = String::from_utf8_lossy(&resp);
    assert!(resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("fskv_rpc_connections_accepted_total"), "{resp}");
}

/// Silent peers beyond `max_unauthenticated_connections` evict the oldest
/// of themselves; they never take the places of authenticated connections,
/// and a keyed client connecting in the middle of them gets through at once.
#[tokio::test]
async fn silent_peers_beyond_the_unauthenticated_cap_evict_the_oldest_and_honest_clients_get_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let router = Router::new().route::<WhoAmI, _, _>(move |ctx, (), _| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok((ctx.principal.map(|p| p.name().to_string()), Bytes::new())) }
    });
    // A long handshake timeout: only eviction can close the silent peers
    // within this test.
    let config = ServerConfig {
        cluster_key: Some(key(1)),
        handshake_timeout_ms: 60_000,
        max_unauthenticated_connections: 4,
        max_connections: 16,
        ..ServerConfig::default()
    };
    let server = Server::bind(Arc::new(TcpTransport::new()), "127.0.0.1:0", router, config).await.unwrap();
    let addr = server.local_addr().to_string();
    // 12 silent connections: more than the cap, and with the honest one
    // below, more than max_connections would allow if they all stayed.
    let mut silent = Vec::new();
    for _ in 0..12 {
        silent.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The 8 oldest were closed: reading them sees EOF (or a reset).
    let mut closed = 0;
    for s in silent.iter_mut().take(8) {
        let mut buf = [0u8; 8];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 8, "the 8 oldest silent connections are evicted");
    let text = server.metrics().render();
    let evicted: u64 = text.lines().find_map(|l| l.strip_prefix("fskv_rpc_connections_evicted_total ")).unwrap().trim().parse().unwrap();
    assert_eq!(evicted, 8, "{text}");
    // More silent peers keep arriving while an honest client connects
    // (pooled connections are authenticated and no longer evictable).
    let c = client(Some(key(1)), "gateway");
    let started = std::time::Instant::now();
    assert_eq!(who(&c, &addr).await.unwrap().as_deref(), Some("gateway"));
    for _ in 0..20 {
        silent.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..5 {
        assert_eq!(who(&c, &addr).await.unwrap().as_deref(), Some("gateway"), "the authenticated connection survives the flood");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "honest calls took {:?}", started.elapsed());
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    // The last four silent peers are still open (they hold the places).
    for s in silent.iter_mut().rev().take(4) {
        let mut buf = [0u8; 8];
        assert!(tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await.is_err(), "the newest silent peers stay open");
    }
}
