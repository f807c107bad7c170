//! Connection handover: the front passes an accepted client connection
//! itself to a gateway process (its socket descriptor, over a Unix socket
//! with `SCM_RIGHTS`), which then serves it directly, so the front leaves
//! the data path of that connection.
//!
//! | step | where | what |
//! |---|---|---|
//! | 1 | the front's accept loop | [`peek_head`] looks at the first request head **without consuming it** (`MSG_PEEK`), within `header_read_timeout_ms` and `max_header_bytes` |
//! | 2 | the front's [`Handoff::offer`] | classifies the head, takes a process of the chosen pool that has a handover channel and sends it the connection and one end of a liveness socket pair ([`send_connection`]); or gives the connection back to be proxied ([`Declined`]): for good, or — when no process could take it now — until the max age of step 5, so the client's next connection is offered again |
//! | 3 | the gateway process ([`HANDOVER_FD_ENV`]) | receives both descriptors ([`Channel::recv`]) and serves the connection like one it accepted; the liveness end is closed when the connection ends, which tells the front (its request count on the process drops) |
//! | 4 | the gateway process | a request of the other pool's kind on a handed connection (a mutation on a reader) is sent back through the front's return socket ([`RETURN_SOCKET_ENV`]) and its response streamed back: writes never run on a reader |
//! | 5 | the gateway process | a handed connection older than [`HANDED_MAX_AGE_ENV`] (the front's `handed_connection_max_age_ms`) gets `Connection: close` on its next response, so long-lived clients come back through the front and spread over the processes a pool has now; one idle for the pool's idle timeout ([`HANDED_IDLE_ENV`]) is closed, so that idle clients do not keep a process from stopping |
//!
//! Nothing is consumed before the handover, so the gateway's HTTP parser
//! reads the connection from its first byte. Not handed over, but served
//! by the front as before (answering the error where there is one): a
//! first request `GET /metrics` (the front's own metrics), HTTP/1.0 heads,
//! heads that do not parse, are too large or do not arrive in time.

use http::request::Parts;
use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};
use std::future::Future;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The environment variable naming an inherited descriptor (one end of a
/// `SOCK_SEQPACKET` socket pair) on which a gateway process started by the
/// front receives handed connections. Used by the first server that starts
/// in the process; ignored when unset.
pub const HANDOVER_FD_ENV: &str = "FSKV_GATEWAY_HANDOVER_FD";

/// The environment variable naming the front's return socket (a Unix
/// socket path) for the requests of a handed connection that this process's
/// role must not serve.
pub const RETURN_SOCKET_ENV: &str = "FSKV_GATEWAY_RETURN_SOCKET";

/// The environment variable with the idle timeout (ms) of handed
/// connections: the front passes its pool idle timeout, so that a client's
/// idle keep-alive connection does not keep the process from being stopped.
pub const HANDED_IDLE_ENV: &str = "FSKV_GATEWAY_HANDED_IDLE_MS";

/// The environment variable with the age (ms) at which a handed
/// connection gets `Connection: close` on its next response (step 5 above);
/// [`DEFAULT_HANDED_MAX_AGE_MS`] when unset.
pub const HANDED_MAX_AGE_ENV: &str = "FSKV_GATEWAY_HANDED_MAX_AGE_MS";

/// See [`HANDED_MAX_AGE_ENV`].
pub const DEFAULT_HANDED_MAX_AGE_MS: u64 = 2_000;

/// Bound on connecting to the front's return socket.
const RETURN_CONNECT_TIMEOUT_MS: u64 = 5_000;

/// A head that arrived only in part is looked at again after 1 ms, then
/// after twice as long each time, [`PEEK_RETRIES`] times (31 ms in all);
/// then the front serves the connection itself. A client's head nearly
/// always arrives in one segment; a slow-loris one costs at most six peeks.
const PEEK_FIRST_RETRY_MS: u64 = 1;
const PEEK_RETRIES: u32 = 5;
/// The first peek's buffer (grown fourfold up to `max_header_bytes` while full).
const PEEK_FIRST_BYTES: usize = 2048;

/// The front's side of step 2: take the connection (`None`) or give it back
/// to be served where it was accepted (`Some`).
pub trait Handoff: Send + Sync + 'static {
    fn offer<'a>(&'a self, head: &'a Parts, stream: TcpStream) -> Pin<Box<dyn Future<Output = Option<Declined>> + Send + 'a>>;
}

/// A connection the front did not hand over, to be served where it was accepted.
pub struct Declined {
    pub stream: TcpStream,
    /// `Some` when no process could take it *now* (a cold or busy pool):
    /// once this long has passed since the accept, a response closes the
    /// connection (`Connection: close`), so the client's next connection is
    /// offered again instead of being proxied for as long as it stays
    /// open. `None`: it would never be handed (e.g. static upstreams).
    pub recycle_after: Option<Duration>,
}

impl Declined {
    /// Served here for as long as the client keeps it.
    pub fn keep(stream: TcpStream) -> Option<Declined> {
        Some(Declined { stream, recycle_after: None })
    }
}

/// The first request head on `stream`, without consuming it; `None` when
/// it is not a complete, valid HTTP/1.1 head of at most `max_bytes` bytes
/// and `max_headers` headers by `deadline` and within the retries above, or
/// the peer closed.
pub async fn peek_head(stream: &TcpStream, max_bytes: usize, max_headers: usize, deadline: Instant) -> Option<Parts> {
    let max_bytes = max_bytes.max(1);
    // Most heads are a few hundred bytes: start small and grow only when a
    // peek fills the buffer, instead of zeroing the limit per connection.
    let mut buf = vec![0u8; max_bytes.min(PEEK_FIRST_BYTES)];
    let mut retry = Duration::from_millis(PEEK_FIRST_RETRY_MS);
    let mut waits = 0;
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        let mut headers = vec![httparse::EMPTY_HEADER; max_headers.max(1)];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..n]) {
            Ok(httparse::Status::Complete(_)) => return parts_of(&req),
            // More may already be there: peek again at once with a larger
            // buffer (at most log4(max_bytes / PEEK_FIRST_BYTES) times).
            Ok(httparse::Status::Partial) if n == buf.len() && buf.len() < max_bytes => {
                let len = buf.len().saturating_mul(4).min(max_bytes);
                buf.resize(len, 0);
            }
            Ok(httparse::Status::Partial) if n < buf.len() && waits < PEEK_RETRIES => {
                // The rest of the head has not arrived: a peek would return
                // the same bytes at once, so wait a little (bounded by the deadline).
                if Instant::now() + retry > deadline {
                    return None;
                }
                tokio::time::sleep(retry).await;
                retry *= 2;
                waits += 1;
            }
            _ => return None,
        }
    }
}

fn parts_of(req: &httparse::Request<'_, '_>) -> Option<Parts> {
    if req.version != Some(1) {
        return None;
    }
    let mut b = http::Request::builder().method(req.method?).uri(req.path?);
    for h in req.headers.iter() {
        b = b.header(h.name, h.value);
    }
    b.body(()).ok().map(|r| r.into_parts().0)
}

/// A `SOCK_SEQPACKET` socket pair, both ends close-on-exec: the front keeps
/// the first, the gateway process inherits the second.
pub fn channel_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    socket::socketpair(socket::AddressFamily::Unix, socket::SockType::SeqPacket, None, socket::SockFlag::SOCK_CLOEXEC)
        .map_err(io::Error::from)
}

/// Sends a connection and the gateway's end of its liveness pair, without
/// blocking (`WouldBlock` when the process is not keeping up).
pub fn send_connection(channel: BorrowedFd<'_>, conn: BorrowedFd<'_>, live: BorrowedFd<'_>) -> io::Result<()> {
    let fds = [conn.as_raw_fd(), live.as_raw_fd()];
    let iov = [IoSlice::new(b"C")];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    socket::sendmsg::<()>(channel.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL, None)
        .map(drop)
        .map_err(io::Error::from)
}

/// A gateway process's end of the handover channel.
pub struct Channel(AsyncFd<OwnedFd>);

impl Channel {
    pub fn new(fd: OwnedFd) -> io::Result<Channel> {
        // Inherited without close-on-exec; nothing this process starts may have it.
        nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
        let flags = nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_GETFL).map_err(io::Error::from)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
        // SAFETY: the AsyncFd owns the descriptor, which is neither replaced
        // nor closed while it is registered.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }?;
        Ok(Channel(fd))
    }

    /// The next handed connection and its liveness end; `None` once the
    /// front closed its end. A message without exactly two descriptors is
    /// dropped (its descriptors closed).
    pub async fn recv(&self) -> io::Result<Option<(OwnedFd, OwnedFd)>> {
        loop {
            let mut guard = self.0.readable().await?;
            match guard.try_io(|fd| recv_one(fd.get_ref().as_raw_fd())) {
                Ok(Ok(Received::Closed)) => return Ok(None),
                Ok(Ok(Received::Pair(conn, live))) => return Ok(Some((conn, live))),
                Ok(Ok(Received::Malformed)) => {
                    tracing::warn!("a handover message without a connection and a liveness descriptor; ignored");
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }
}

enum Received {
    Closed,
    Pair(OwnedFd, OwnedFd),
    Malformed,
}

fn recv_one(fd: RawFd) -> io::Result<Received> {
    let mut data = [0u8; 8];
    let mut iov = [IoSliceMut::new(&mut data)];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let msg = socket::recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).map_err(io::Error::from)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    let cmsgs = match msg.cmsgs() {
        Ok(c) => c,
        // Truncated control data: the kernel closed what did not fit.
        Err(_) => return Ok(Received::Malformed),
    };
    for c in cmsgs {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed these descriptors in this process
            // for this message; nothing else refers to them.
            fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(Received::Closed);
    }
    if fds.len() != 2 {
        return Ok(Received::Malformed);
    }
    let live = fds.pop();
    let conn = fds.pop();
    match (conn, live) {
        (Some(c), Some(l)) => Ok(Received::Pair(c, l)),
        _ => Ok(Received::Malformed),
    }
}

/// The handover channel named by [`HANDOVER_FD_ENV`] (the first caller
/// in the process only).
pub(crate) fn channel_from_env() -> Option<OwnedFd> {
    static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let v = std::env::var(HANDOVER_FD_ENV).ok()?;
    if USED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    let fd = match v.trim().parse::<i32>() {
        Ok(fd) if fd > 2 => fd,
        _ => {
            tracing::warn!(value = %v, "{HANDOVER_FD_ENV} is not a descriptor number above 2; no handed connections");
            return None;
        }
    };
    // SAFETY: F_GETFD only inspects the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        tracing::warn!(fd, "{HANDOVER_FD_ENV} names no open descriptor; no handed connections");
        return None;
    }
    // SAFETY: the descriptor is open and was inherited for this one use.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The idle timeout named by [`HANDED_IDLE_ENV`] (at least 100 ms).
pub(crate) fn handed_idle_from_env() -> Option<Duration> {
    let ms = std::env::var(HANDED_IDLE_ENV).ok()?.trim().parse::<u64>().ok()?;
    Some(Duration::from_millis(ms.max(100)))
}

/// The age named by [`HANDED_MAX_AGE_ENV`] (at least 100 ms).
pub(crate) fn handed_max_age_from_env() -> Duration {
    let ms = std::env::var(HANDED_MAX_AGE_ENV).ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(DEFAULT_HANDED_MAX_AGE_MS);
    Duration::from_millis(ms.max(100))
}

/// The front's return socket named by [`RETURN_SOCKET_ENV`].
pub(crate) fn return_socket_from_env() -> Option<PathBuf> {
    std::env::var_os(RETURN_SOCKET_ENV).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The front's return socket as a gateway process uses it: a small pool of
/// kept-alive HTTP/1.1 connections (a burst of mutations on handed reader
/// connections must not cost a Unix connect each).
pub(crate) struct ReturnSocket<B = hyper::body::Incoming> {
    /// The socket's path (shared with the connector; for error messages).
    path: Arc<PathBuf>,
    client: hyper_util::client::legacy::Client<ReturnConnector, B>,
}

/// Idle connections kept to the return socket, and for how long: below the
/// front's own idle timeout, so the front rarely closes one under a request.
const RETURN_MAX_IDLE_CONNECTIONS: usize = 8;
const RETURN_IDLE_TIMEOUT_MS: u64 = 2_000;

#[derive(Clone)]
pub(crate) struct ReturnConnector(Arc<PathBuf>);

impl tower_service::Service<http::Uri> for ReturnConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let path = Arc::clone(&self.0);
        Box::pin(async move {
            let s = connect_unix_within(&path, Duration::from_millis(RETURN_CONNECT_TIMEOUT_MS)).await?;
            Ok(hyper_util::rt::TokioIo::new(s))
        })
    }
}

/// Connects to a Unix socket, failing with `TimedOut` after `limit` (the
/// front's connections to its gateway processes, a process's to the
/// front's return socket).
pub async fn connect_unix_within(path: &std::path::Path, limit: Duration) -> io::Result<tokio::net::UnixStream> {
    tokio::time::timeout(limit, tokio::net::UnixStream::connect(path))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {} took over {limit:?}", path.display())))?
}

impl<B> ReturnSocket<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    pub(crate) fn new(path: PathBuf) -> ReturnSocket<B> {
        let path = Arc::new(path);
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_millis(RETURN_IDLE_TIMEOUT_MS))
            .pool_max_idle_per_host(RETURN_MAX_IDLE_CONNECTIONS)
            .pool_timer(hyper_util::rt::TokioTimer::new())
            // The client's Host passes unchanged (it may be signed).
            .set_host(false)
            .build(ReturnConnector(Arc::clone(&path)));
        ReturnSocket { path, client }
    }

    /// Sends one request through the return socket and returns the
    /// front's response (the request's target is kept as the client sent it).
    pub(crate) async fn forward(&self, mut req: http::Request<B>) -> Result<http::Response<hyper::body::Incoming>, String> {
        // The pool keys connections by scheme and authority: one fixed name
        // for the socket; the request line keeps only path and query.
        let pq = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        *req.uri_mut() = http::Uri::try_from(format!("http://front.return{pq}")).map_err(|e| format!("request target: {e}"))?;
        let mut resp = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("the front's return socket {} failed the request: {e}", self.path.display()))?;
        for h in ["connection", "keep-alive"] {
            resp.headers_mut().remove(h);
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    #[tokio::test]
    async fn a_head_is_peeked_whole_without_being_consumed() {
        let (mut c, s) = pair().await;
        c.write_all(b"PUT /b/k?x=1 HTTP/1.1\r\nHost: h\r\n").await.unwrap();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c.write_all(b"Content-Length: 3\r\n\r\nabc").await.unwrap();
            c
        });
        let parts = peek_head(&s, 8192, 100, Instant::now() + Duration::from_secs(5)).await.unwrap();
        assert_eq!(parts.method, http::Method::PUT);
        assert_eq!(parts.uri.path_and_query().unwrap().as_str(), "/b/k?x=1");
        assert_eq!(parts.headers["host"], "h");
        let _c = writer.await.unwrap();
        // Nothing was consumed: the whole request is still there to read.
        let mut buf = vec![0u8; 256];
        let n = s.try_read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"PUT /b/k?x=1 HTTP/1.1\r\n") && buf[..n].ends_with(b"abc"));
    }

    #[tokio::test]
    async fn heads_longer_than_the_first_peek_grow_the_buffer_up_to_the_limit() {
        let long = "v".repeat(PEEK_FIRST_BYTES * 3);
        let head = format!("GET /k HTTP/1.1\r\nHost: h\r\nX-Long: {long}\r\n\r\n");
        let (mut c, s) = pair().await;
        c.write_all(head.as_bytes()).await.unwrap();
        let parts = peek_head(&s, 64 << 10, 100, Instant::now() + Duration::from_secs(5)).await.unwrap();
        assert_eq!(parts.headers["x-long"].len(), long.len());
        let (mut c, s) = pair().await;
        c.write_all(head.as_bytes()).await.unwrap();
        let limit = PEEK_FIRST_BYTES * 2;
        assert!(peek_head(&s, limit, 100, Instant::now() + Duration::from_millis(200)).await.is_none(), "over the limit");
    }

    #[tokio::test]
    async fn mutations_sent_back_reuse_kept_alive_return_connections() {
        use http_body_util::{BodyExt, Full};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s3-front.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let svc = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let target = req.uri().to_string();
                    let host = req.headers().get("host").cloned();
                    let body = req.into_body().collect().await?.to_bytes();
                    let mut resp = http::Response::new(Full::new(bytes::Bytes::from(format!("{target} {host:?} {}", body.len()))));
                    resp.headers_mut().insert("connection", http::HeaderValue::from_static("keep-alive"));
                    Ok::<_, hyper::Error>(resp)
                });
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(s), svc));
            }
        });
        let ret = ReturnSocket::<Full<bytes::Bytes>>::new(path);
        for i in 0..20 {
            let req = http::Request::put(format!("/bkt/k{i}?x=1"))
                .header("host", "signed.example:9000")
                .body(Full::new(bytes::Bytes::from(vec![7u8; i])))
                .unwrap();
            let resp = ret.forward(req).await.unwrap();
            assert!(resp.headers().get("connection").is_none(), "hop-by-hop header passed");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, format!("/bkt/k{i}?x=1 Some(\"signed.example:9000\") {i}").as_bytes());
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "one kept-alive connection for 20 sequential mutations");
    }

    #[tokio::test]
    async fn heads_that_cannot_be_handed_are_refused() {
        let soon = || Instant::now() + Duration::from_millis(200);
        let (mut c, s) = pair().await;
        c.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        assert!(peek_head(&s, 8192, 100, soon()).await.is_none(), "HTTP/1.0");
        let (mut c, s) = pair().await;
        c.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n").await.unwrap();
        let t = Instant::now();
        assert!(peek_head(&s, 8192, 100, soon()).await.is_none(), "never completed");
        assert!(t.elapsed() < Duration::from_millis(150), "gave up after the retries, not at the deadline: {:?}", t.elapsed());
        let (mut c, s) = pair().await;
        c.write_all(b"GET / HTTP/1.1\r\nHost: hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh\r\n\r\n").await.unwrap();
        assert!(peek_head(&s, 24, 100, soon()).await.is_none(), "too large");
        let (mut c, s) = pair().await;
        c.write_all(b"NOT HTTP\r\n\r\n").await.unwrap();
        assert!(peek_head(&s, 8192, 100, soon()).await.is_none(), "garbage");
        let (c, s) = pair().await;
        drop(c);
        assert!(peek_head(&s, 8192, 100, soon()).await.is_none(), "closed");
    }

    #[tokio::test]
    async fn a_connection_sent_over_the_channel_keeps_working_and_its_liveness_end_reports_the_close() {
        use tokio::io::AsyncReadExt;
        let (front_end, gateway_end) = channel_pair().unwrap();
        let channel = Channel::new(gateway_end).unwrap();
        let (mut client, accepted) = pair().await;
        let (mut live_mine, live_theirs) = tokio::net::UnixStream::pair().unwrap();
        let theirs: OwnedFd = live_theirs.into_std().unwrap().into();
        send_connection(front_end.as_fd(), accepted.as_fd(), theirs.as_fd()).unwrap();
        drop((accepted, theirs));
        let (conn, live) = channel.recv().await.unwrap().unwrap();
        let std = std::net::TcpStream::from(conn);
        std.set_nonblocking(true).unwrap();
        let mut served = TcpStream::from_std(std).unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        served.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        served.write_all(b"pong").await.unwrap();
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        // The liveness pair stays open while the gateway holds its end.
        let mut one = [0u8; 1];
        assert!(tokio::time::timeout(Duration::from_millis(50), live_mine.read(&mut one)).await.is_err());
        drop(live);
        assert_eq!(live_mine.read(&mut one).await.unwrap(), 0);
        // The front closing its end ends the gateway's loop.
        drop(front_end);
        assert!(channel.recv().await.unwrap().is_none());
    }
}
