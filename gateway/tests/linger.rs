//! Lingering close on the Unix socket a gateway serves for the front
//! (`FSKV_GATEWAY_UNIX_SOCKET`): a response sent before the request body was
//! read must stay readable while the peer still sends that body. Its own test
//! binary: the environment variable applies to the first server of a process.

use bytes::Bytes;
use fskv_gateway::{
    Access, AccessKey, AuthPolicy, Authenticator, BodyClass, GatewayError, KeyStore, Metrics, Protocol, RequestBody, RequestContext, Role,
    Route, ServerConfig,
};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every request 411 without reading its body (as s3s does for a
/// chunked signed-payload PUT).
struct Early;

impl Protocol for Early {
    type Body = Full<Bytes>;

    fn name(&self) -> &'static str {
        "early"
    }

    fn classify(&self, _parts: &Parts) -> Route {
        Route { name: "put", access: Access::Mutation, body: BodyClass::Data, auth: AuthPolicy::Open }
    }

    async fn handle(&self, _req: Request<RequestBody>, _cx: RequestContext) -> Response<Full<Bytes>> {
        let mut r = Response::new(Full::new(Bytes::from_static(b"length required")));
        *r.status_mut() = StatusCode::LENGTH_REQUIRED;
        r
    }

    fn error_response(&self, err: &GatewayError, cx: &RequestContext) -> Response<Bytes> {
        err.reply().json(&cx.request_id)
    }
}

#[tokio::test]
async fn an_early_answer_on_the_unix_socket_survives_the_rest_of_the_body() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("early.sock");
    std::env::set_var(fskv_gateway::server::UNIX_SOCKET_ENV, &sock);
    let keys = Arc::new(KeyStore::new(vec![AccessKey::new("K", "S")]).unwrap());
    let auth = Arc::new(Authenticator::new(keys, "us-east-1", &["s3"], true));
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap(), Role::Writer);
    let server = fskv_gateway::serve(cfg, Arc::new(Early), auth, Arc::new(Metrics::new())).await.unwrap();
    assert!(sock.exists(), "the server listens on the Unix socket");

    let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    s.write_all(b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").await.unwrap();
    // The answer comes before any body byte was sent.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(15).any(|w| w == b"length required") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await.expect("an answer").unwrap();
        assert!(n > 0, "closed before answering: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 411"), "{:?}", String::from_utf8_lossy(&got));
    // Give the server time to finish the connection, then send the body as a
    // client that writes its whole request before reading would: the socket
    // must still take it (without lingering, the write fails with EPIPE).
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b"5\r\nhello\r\n0\r\n\r\n").await.expect("the body's rest is accepted after the early answer");
    s.shutdown().await.unwrap();
    // Then the server closes: EOF, within the linger bound.
    let rest = tokio::time::timeout(Duration::from_secs(5), async {
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.map(|_| rest)
    })
    .await
    .expect("closed within the linger bound");
    assert!(rest.is_ok(), "the connection ended with an error: {rest:?}");
    server.stop().await;
    assert!(!sock.exists(), "the socket file is removed when the server stops");
}
