//! Plain HTTP on the RPC port: `GET /metrics` for Prometheus, no new port.
//!
//! # Telling HTTP from RPC
//!
//! The server reads the first 4 bytes of every new connection (clients
//! always speak first) before deciding:
//!
//! | first 4 bytes | connection is | why unambiguous |
//! |---|---|---|
//! | `GET ` | one HTTP request, answered, then closed | every RPC frame starts with the magic `3FSR` ([`crate::frame::MAGIC`]) |
//! | anything else | RPC: the bytes are the start of the first frame | a wrong magic closes it as before |
//!
//! The 4 bytes must arrive within `idle_timeout_ms` (the rule for a
//! connection that sends nothing), else the connection is closed.
//!
//! # The HTTP request
//!
//! | rule | value |
//! |---|---|
//! | request head size | at most [`MAX_HTTP_REQUEST_BYTES`], else `431` and close |
//! | time to receive the head | `frame_read_timeout_ms` from the first byte, else close without answer |
//! | unparsable head | `400` and close |
//! | method other than `GET` | cannot happen (sniffed) |
//! | path `/metrics` (any query string) | `200`, OpenMetrics text of the service's [`MetricsRegistry`] |
//! | any other path | `404` |
//! | after the response | the connection is closed (`Connection: close`); a request body is never read |
//!
//! [`parse_head`] is pure; [`serve`] is the thin async shell.

use crate::metrics::{MetricsRegistry, CONTENT_TYPE};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// First bytes of a connection that make it an HTTP request.
pub const HTTP_GET_PREFIX: [u8; 4] = *b"GET ";
/// Largest HTTP request head accepted on the RPC port.
pub const MAX_HTTP_REQUEST_BYTES: usize = 8 << 10;
/// Most header lines parsed.
const MAX_HEADERS: usize = 64;

/// What the bytes received so far are.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// More bytes are needed.
    Incomplete,
    /// A whole head: its method and path (query string removed).
    Request { method: String, path: String },
    /// Longer than [`MAX_HTTP_REQUEST_BYTES`] without ending.
    TooLarge,
    /// Not HTTP/1.x.
    Malformed,
}

/// Parses an HTTP/1.x request head (pure).
pub fn parse_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {
            let method = req.method.unwrap_or_default().to_string();
            let target = req.path.unwrap_or_default();
            let path = target.split('?').next().unwrap_or_default().to_string();
            Head::Request { method, path }
        }
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HTTP_REQUEST_BYTES => Head::TooLarge,
        Ok(httparse::Status::Partial) => Head::Incomplete,
        Err(_) => Head::Malformed,
    }
}

/// The response to a whole head: status, reason and body.
pub fn respond(head: &Head, registry: &MetricsRegistry) -> (u16, &'static str, String) {
    match head {
        Head::Request { method, path } if method == "GET" && path == "/metrics" => (200, "OK", registry.render()),
        Head::Request { .. } => (404, "Not Found", "only GET /metrics is served on this port\n".into()),
        Head::TooLarge => (431, "Request Header Fields Too Large", format!("request head over {MAX_HTTP_REQUEST_BYTES} bytes\n")),
        Head::Malformed | Head::Incomplete => (400, "Bad Request", "malformed HTTP request\n".into()),
    }
}

/// Serves one HTTP request whose first bytes (`prefix`) were already read,
/// then returns (the caller drops, so closes, the connection).
pub(crate) async fn serve(
    mut read: crate::transport::BoxRead,
    mut write: crate::transport::BoxWrite,
    prefix: &[u8],
    registry: &MetricsRegistry,
    read_timeout: Duration,
) {
    let mut buf = Vec::with_capacity(1024);
    buf.extend_from_slice(prefix);
    let head = tokio::time::timeout(read_timeout, async {
        let mut chunk = [0u8; 1024];
        loop {
            let head = parse_head(&buf);
            if head != Head::Incomplete {
                return Some(head);
            }
            // Never read past the limit: at most what is left below it.
            let room = (MAX_HTTP_REQUEST_BYTES - buf.len().min(MAX_HTTP_REQUEST_BYTES)).clamp(1, chunk.len());
            match read.read(&mut chunk[..room]).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let Ok(Some(head)) = head else {
        tracing::debug!("HTTP request on the RPC port did not arrive whole; closing");
        return;
    };
    let (status, reason, body) = respond(&head, registry);
    registry.rpc().http_requests.get_or_create(&vec![("status", status.to_string())]).inc();
    let content_type = if status == 200 { CONTENT_TYPE } else { "text/plain; charset=utf-8" };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let sent = tokio::time::timeout(read_timeout, async {
        write.write_all(response.as_bytes()).await?;
        write.shutdown().await
    })
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        tracing::debug!("HTTP response on the RPC port not sent whole");
    }
}

/// Connections a [`serve_metrics`] listener answers at once; more wait in
/// the listen backlog.
pub const MAX_METRICS_CONNECTIONS: usize = 16;

/// A listener of its own for `GET /metrics`, for a process without an RPC
/// port (the FUSE mount: `fskv mount --metrics-listen`). Each connection
/// gets the same rules as the sniffed request on an RPC port (the table
/// above, `read_timeout` for the head and for sending the answer), at most
/// [`MAX_METRICS_CONNECTIONS`] at once. Runs until the task is dropped.
pub async fn serve_metrics(listener: tokio::net::TcpListener, registry: std::sync::Arc<MetricsRegistry>, read_timeout: Duration) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_METRICS_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            Err(e) => {
                tracing::debug!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let (read, write) = sock.into_split();
            serve(Box::new(read), Box::new(write), &[], &registry, read_timeout).await;
            drop(permit);
        });
    }
}

/// Largest metrics text [`scrape`] accepts.
pub const MAX_SCRAPE_BYTES: usize = 64 << 20;

/// Fetches `GET /metrics` from a service's RPC port over TCP within
/// `timeout` (`fskv admin metrics`); the body of a `200`, else an error
/// naming the status.
pub async fn scrape(addr: &str, timeout: Duration) -> Result<String, crate::RpcError> {
    let fetch = async {
        let mut sock = tokio::net::TcpStream::connect(addr).await.map_err(|e| crate::RpcError::connection(addr, e))?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        sock.write_all(request.as_bytes()).await.map_err(|e| crate::RpcError::connection(addr, e))?;
        let mut out = Vec::new();
        (&mut sock).take(MAX_SCRAPE_BYTES as u64 + 1).read_to_end(&mut out).await.map_err(|e| crate::RpcError::connection(addr, e))?;
        if out.len() > MAX_SCRAPE_BYTES {
            return Err(crate::RpcError::Malformed(format!("{addr}: metrics response over {MAX_SCRAPE_BYTES} bytes")));
        }
        let text = String::from_utf8(out).map_err(|_| crate::RpcError::Malformed(format!("{addr}: metrics response is not UTF-8")))?;
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| crate::RpcError::Malformed(format!("{addr}: no HTTP response")))?;
        let status = head.lines().next().unwrap_or_default();
        if !status.starts_with("HTTP/1.1 200 ") {
            return Err(crate::RpcError::Malformed(format!("{addr}: {status}")));
        }
        Ok(body.to_string())
    };
    tokio::time::timeout(timeout, fetch).await.map_err(|_| crate::RpcError::connection(addr, format!("no metrics within {timeout:?}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_heads() {
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), Head::Incomplete);
        assert_eq!(
            parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Head::Request { method: "GET".into(), path: "/metrics".into() }
        );
        assert_eq!(parse_head(b"GET /other HTTP/1.0\r\n\r\n"), Head::Request { method: "GET".into(), path: "/other".into() });
        assert_eq!(parse_head(b"GET \x00\x01 garbage\r\n\r\n"), Head::Malformed);
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HTTP_REQUEST_BYTES, b'a');
        assert_eq!(parse_head(&big), Head::TooLarge);
    }

    #[tokio::test]
    async fn a_metrics_listener_answers_scrapes_and_cuts_a_silent_peer() {
        let registry = MetricsRegistry::new();
        registry.rpc().connections_accepted.inc();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let task = tokio::spawn(serve_metrics(listener, registry.clone(), Duration::from_millis(300)));
        // A peer that connects and says nothing is cut after the timeout.
        let mut silent = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        let text = scrape(&addr, Duration::from_secs(5)).await.expect("scrape");
        assert!(text.contains("fskv_rpc_connections_accepted_total 1"), "{text}");
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await.expect("closed in time").unwrap_or(0);
        assert_eq!(n, 0, "the silent peer gets no answer, only a close");
        task.abort();
    }

    #[test]
    fn answers_only_metrics() {
        let registry = MetricsRegistry::new();
        registry.rpc().connections_accepted.inc();
        let ok = respond(&Head::Request { method: "GET".into(), path: "/metrics".into() }, &registry);
        assert_eq!(ok.0, 200);
        assert!(ok.2.contains("fskv_rpc_connections_accepted_total 1"), "{}", ok.2);
        assert_eq!(respond(&Head::Request { method: "GET".into(), path: "/".into() }, &registry).0, 404);
        assert_eq!(respond(&Head::TooLarge, &registry).0, 431);
        assert_eq!(respond(&Head::Malformed, &registry).0, 400);
    }
}
