//! The HTTP server every gateway runs: accept loop with a total and a
//! per-peer connection cap, optional TLS, hyper's HTTP/1.1 per connection
//! under the timeouts of [`crate::conn`] (one sweeper task per server), and
//! the request pipeline:
//!
//! | step | on failure |
//! |---|---|
//! | `GET /metrics` without SigV4 credentials → metrics (per `metrics_endpoint`); otherwise the protocol classifies the head ([`Protocol::classify`]) | 401/403 per the protocol's error format |
//! | request id, tracing span (id, method, path, peer, role, protocol, route) | — |
//! | request target ≤ `max_uri_bytes` (head ≤ `max_header_bytes` and `max_headers`: hyper, 431) | 414 |
//! | reader/writer guard ([`crate::route::guard`]) | 403 `ReadOnlyGateway` |
//! | `Content-Length` ≤ the route class's body limit | 413 |
//! | credentials per [`AuthPolicy`] | the [`AuthError`]'s status |
//! | the handler, with the body wrapped ([`RequestBody`]: limit while streaming, progress timeout) | the protocol's own |
//! | the request id header on the response; accounting when the last byte is sent | — |
//!
//! Refusals by the shared layer are rendered by [`Protocol::error_response`]
//! (S3 XML, JSON, …) and counted in `fskv_gateway_requests_refused_total`.

use crate::auth::{sigv4, Authenticator, Principal};
use crate::body::{BoxError, Finish, RequestBody, ResponseBody};
use crate::config::{HttpLimits, MetricsEndpoint, Role, ServerConfig};
use crate::conn::{ConnClock, Signal, Sweeper, TimedIo, Timeouts};
use crate::error::{AuthError, GatewayError};
use crate::handover::{Declined, Handoff};
use crate::metrics::{self, Metrics, ProtocolLabels, ReasonLabels, RouteLabels};
use crate::route::{guard, AuthPolicy, Route};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tracing::Instrument;

/// A protocol served by the shared layer (S3, KV, MQ, the front).
pub trait Protocol: Send + Sync + 'static {
    /// The handler's response body.
    type Body: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static;

    /// `s3`, `kv`, `mq`, …: the `protocol` label of metrics and logs.
    fn name(&self) -> &'static str;

    /// The response header carrying the request id.
    fn request_id_header(&self) -> HeaderName {
        HeaderName::from_static("x-request-id")
    }

    /// Classifies a request from its head alone (no body, no I/O).
    fn classify(&self, parts: &Parts) -> Route;

    /// Serves one request that passed the shared checks.
    fn handle(&self, req: Request<RequestBody>, cx: RequestContext) -> impl Future<Output = Response<Self::Body>> + Send;

    /// Renders a refusal of the shared layer in the protocol's format
    /// (start from [`GatewayError::reply`]).
    fn error_response(&self, err: &GatewayError, cx: &RequestContext) -> Response<Bytes>;
}

/// What the shared layer knows about a request, handed to the handler.
#[derive(Clone, Debug)]
pub struct RequestContext {
    pub request_id: Arc<str>,
    pub peer: SocketAddr,
    pub role: Role,
    /// The route's name from [`Protocol::classify`] (`"metrics"` for the
    /// metrics endpoint).
    pub route: &'static str,
    /// Set when the route's [`AuthPolicy`] is `Required`.
    pub principal: Option<Principal>,
    pub writer_endpoint: Option<Arc<str>>,
}

/// A new request id: 16 uppercase hex digits, random.
pub fn new_request_id() -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let v = rand::random::<u64>();
    (0..16).map(|i| HEX[((v >> (60 - 4 * i)) & 0xf) as usize] as char).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    Running,
    Draining,
    Abort,
}

/// Open connections per peer IP address.
#[derive(Default)]
struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

impl PeerCounts {
    fn try_add(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut m = self.0.lock();
        let n = m.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot { peers: Arc::clone(self), ip })
    }
}

/// One connection's place in [`PeerCounts`], returned when dropped.
struct PeerSlot {
    peers: Arc<PeerCounts>,
    ip: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.peers.0.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

struct Inner<P> {
    protocol: Arc<P>,
    cfg: ServerConfig,
    writer_endpoint: Option<Arc<str>>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    conns: Arc<Semaphore>,
    peers: Arc<PeerCounts>,
    id_header: HeaderName,
    sweeper: Arc<Sweeper>,
    timeouts: Timeouts,
    /// The front's hook for handing accepted TCP connections to gateway
    /// processes ([`crate::handover`]); `None` in gateways.
    handoff: Option<Arc<dyn Handoff>>,
    /// The front's return socket, for requests of the other role on handed
    /// connections (a gateway process started by the front).
    return_socket: Option<crate::handover::ReturnSocket>,
    /// The idle timeout of handed connections (the front's pool idle
    /// timeout: an idle client connection must not keep the process alive).
    handed_idle: Option<Duration>,
    /// A handed connection this old is closed after its next response.
    handed_max_age: Duration,
}

/// A running server. [`ServerHandle::stop`] stops it gracefully; dropping
/// the handle stops accepting and drains as `stop` does, without waiting.
pub struct ServerHandle {
    pub addr: SocketAddr,
    state: watch::Sender<RunState>,
    accept: tokio::task::JoinHandle<()>,
    /// The accept loop of the Unix socket named by [`UNIX_SOCKET_ENV`], if any.
    accept_unix: Option<(tokio::task::JoinHandle<()>, UnixSocketFile)>,
    sweep: tokio::task::JoinHandle<()>,
    conns: Arc<Semaphore>,
    max_connections: u32,
    grace: Duration,
    /// The loop receiving handed connections ([`crate::handover`]), if any.
    handover: Option<tokio::task::JoinHandle<()>>,
    _file: Option<UnixSocketFile>,
}

impl ServerHandle {
    /// Stops accepting, lets requests in flight finish (idle connections
    /// close at once) for up to `shutdown_grace_ms`, then closes the rest.
    pub async fn stop(self) {
        let ServerHandle { state, accept, accept_unix, sweep, conns, max_connections, grace, handover, .. } = self;
        let _ = state.send(RunState::Draining);
        let _ = accept.await;
        if let Some(h) = handover {
            let _ = h.await;
        }
        if let Some((a, _file)) = accept_unix {
            let _ = a.await;
        }
        let all = |conns: Arc<Semaphore>| async move { conns.acquire_many_owned(max_connections).await.map(drop) };
        if tokio::time::timeout(grace, all(Arc::clone(&conns))).await.is_err() {
            tracing::info!(
                grace_ms = grace.as_millis() as u64,
                "requests still in flight after the shutdown grace; closing their connections"
            );
            let _ = state.send(RunState::Abort);
            let _ = tokio::time::timeout(Duration::from_secs(5), all(conns)).await;
        }
        sweep.abort();
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.max_connections as usize - self.conns.available_permits()
    }
}

/// Binds `cfg.listen` and serves `protocol` until stopped.
pub async fn serve<P: Protocol>(
    cfg: ServerConfig,
    protocol: Arc<P>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
) -> Result<ServerHandle, GatewayError> {
    let listener = TcpListener::bind(cfg.listen).await.map_err(|e| GatewayError::Setup(format!("cannot listen on {}: {e}", cfg.listen)))?;
    serve_on(listener, cfg, protocol, auth, metrics)
}

/// Binds `cfg.listen` and serves `protocol`, offering each plain-TCP
/// connection's first request head to `handoff` first (the front: see
/// [`crate::handover`]); a connection it gives back is served here.
pub async fn serve_with_handoff<P: Protocol>(
    cfg: ServerConfig,
    protocol: Arc<P>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    handoff: Arc<dyn Handoff>,
) -> Result<ServerHandle, GatewayError> {
    let listener = TcpListener::bind(cfg.listen).await.map_err(|e| GatewayError::Setup(format!("cannot listen on {}: {e}", cfg.listen)))?;
    let addr = listener.local_addr().map_err(|e| GatewayError::Setup(format!("listener address: {e}")))?;
    start(listener, addr, None, cfg, protocol, auth, metrics, Extras { handoff: Some(handoff), ..Extras::default() })
}

/// Serves `protocol` on a Unix socket at `path` only (it must not exist;
/// removed when the server stops). The front's return socket.
pub fn serve_unix<P: Protocol>(
    path: &std::path::Path,
    cfg: ServerConfig,
    protocol: Arc<P>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
) -> Result<ServerHandle, GatewayError> {
    let l =
        UnixListener::bind(path).map_err(|e| GatewayError::Setup(format!("cannot listen on the Unix socket {}: {e}", path.display())))?;
    let file = UnixSocketFile(path.to_path_buf());
    start(
        UnixAccept(l),
        SocketAddr::from(([127, 0, 0, 1], 0)),
        None,
        cfg,
        protocol,
        auth,
        metrics,
        Extras { file: Some(file), ..Extras::default() },
    )
}

/// What some servers have besides a listener.
#[derive(Default)]
struct Extras {
    handoff: Option<Arc<dyn Handoff>>,
    /// A gateway process's handover channel and the front's return socket.
    channel: Option<(OwnedFd, Option<PathBuf>)>,
    /// The Unix socket file of a server that listens only there.
    file: Option<UnixSocketFile>,
}

/// Serves on a listener the caller bound (`cfg.listen` is then ignored).
/// Also serves on the Unix socket named by [`UNIX_SOCKET_ENV`] and reports
/// readiness on [`READY_FD_ENV`] (a gateway process started by the front).
pub fn serve_on<P: Protocol>(
    listener: TcpListener,
    cfg: ServerConfig,
    protocol: Arc<P>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
) -> Result<ServerHandle, GatewayError> {
    let addr = listener.local_addr().map_err(|e| GatewayError::Setup(format!("listener address: {e}")))?;
    let unix = match unix_socket_from_env() {
        None => None,
        Some(path) => {
            let l = UnixListener::bind(&path)
                .map_err(|e| GatewayError::Setup(format!("cannot listen on the Unix socket {}: {e}", path.display())))?;
            Some((UnixAccept(l), UnixSocketFile(path)))
        }
    };
    let channel = crate::handover::channel_from_env().map(|fd| (fd, crate::handover::return_socket_from_env()));
    let handle = start(listener, addr, unix, cfg, protocol, auth, metrics, Extras { channel, ..Extras::default() })?;
    notify_ready(addr, handle.accept_unix.as_ref().map(|(_, f)| f.0.as_path()));
    Ok(handle)
}

/// Serves on any [`Listener`] (the deterministic simulation's network):
/// `addr` is the address it reports. No Unix socket, no readiness report.
pub fn serve_listener<P: Protocol, L: Listener>(
    listener: L,
    addr: SocketAddr,
    cfg: ServerConfig,
    protocol: Arc<P>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
) -> Result<ServerHandle, GatewayError> {
    start(listener, addr, None, cfg, protocol, auth, metrics, Extras::default())
}

#[allow(clippy::too_many_arguments)]
fn start<P: Protocol, L: Listener>(
    listener: L,
    addr: SocketAddr,
    unix: Option<(UnixAccept, UnixSocketFile)>,
    cfg: ServerConfig,
    protocol: Arc<P>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    extras: Extras,
) -> Result<ServerHandle, GatewayError> {
    cfg.limits.validate().map_err(GatewayError::Setup)?;
    let Extras { handoff, channel, file } = extras;
    let (channel, return_socket, handed_idle) = match channel {
        Some((fd, ret)) => (
            Some(crate::handover::Channel::new(fd).map_err(|e| GatewayError::Setup(format!("handover channel: {e}")))?),
            ret,
            crate::handover::handed_idle_from_env(),
        ),
        None => (None, None, None),
    };
    let tls = cfg.tls.as_ref().map(crate::tls::acceptor).transpose()?;
    let max_connections = cfg.limits.max_connections as u32;
    let conns = Arc::new(Semaphore::new(max_connections as usize));
    let (state, state_rx) = watch::channel(RunState::Running);
    let grace = Duration::from_millis(cfg.limits.shutdown_grace_ms);
    let l = &cfg.limits;
    let timeouts = Timeouts {
        header_read: Duration::from_millis(l.header_read_timeout_ms),
        idle: Duration::from_millis(l.idle_timeout_ms),
        body_progress: Duration::from_millis(l.body_progress_timeout_ms),
        send_progress: Duration::from_millis(l.send_progress_timeout_ms),
    };
    let sweeper = Arc::new(Sweeper::default());
    let sweep = tokio::spawn(sweep_loop(Arc::clone(&sweeper), timeouts.sweep_period(), state_rx.clone()));
    let inner = Arc::new(Inner {
        sweeper,
        timeouts,
        id_header: protocol.request_id_header(),
        protocol,
        writer_endpoint: cfg.writer_endpoint.as_deref().map(Arc::from),
        cfg,
        auth,
        metrics,
        tls,
        conns: Arc::clone(&conns),
        peers: Arc::default(),
        handoff,
        return_socket: return_socket.map(crate::handover::ReturnSocket::new),
        handed_idle,
        handed_max_age: crate::handover::handed_max_age_from_env(),
    });
    tracing::info!(%addr, unix = ?unix.as_ref().map(|(_, f)| &f.0), protocol = inner.protocol.name(), role = %inner.cfg.role, https = inner.tls.is_some(), "gateway serving");
    let accept_unix = unix.map(|(l, file)| (tokio::spawn(accept_loop(l, Arc::clone(&inner), state_rx.clone())), file));
    let handover = channel.map(|c| tokio::spawn(handover_loop(c, Arc::clone(&inner), state_rx.clone())));
    let accept = tokio::spawn(accept_loop(listener, inner, state_rx));
    Ok(ServerHandle { addr, state, accept, accept_unix, sweep, conns, max_connections, grace, handover, _file: file })
}

/// The environment variable naming a Unix socket path on which a gateway
/// process also serves, besides `--listen` (the first server that starts in
/// the process; ignored when unset). The front starts its gateway processes
/// with a path in its own 0700 directory and sends their requests there:
/// on one host a Unix socket costs less per request than a loopback TCP
/// connection (no TCP/IP stack, no acknowledgements). The path must not
/// exist; the server removes the file when it stops.
pub const UNIX_SOCKET_ENV: &str = "FSKV_GATEWAY_UNIX_SOCKET";

fn unix_socket_from_env() -> Option<std::path::PathBuf> {
    static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let v = std::env::var_os(UNIX_SOCKET_ENV).filter(|v| !v.is_empty())?;
    if USED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    Some(std::path::PathBuf::from(v))
}

/// A bound Unix socket's file, removed when the server is done with it.
struct UnixSocketFile(std::path::PathBuf);

impl Drop for UnixSocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What the accept loop needs of a listener: TCP and Unix sockets here,
/// the simulation's network in `core-fs/sim`.
pub trait Listener: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection and its peer's address.
    fn accept(&self) -> impl Future<Output = std::io::Result<(Self::Stream, SocketAddr)>> + Send;
    /// The stream's socket descriptor, for lingering close ([`linger`]);
    /// `None`: the connection closes without lingering.
    fn raw_fd(_stream: &Self::Stream) -> Option<std::os::fd::RawFd> {
        None
    }
    /// The stream as a TCP stream, for a server with a [`Handoff`]; the
    /// stream back when it is not one.
    fn into_tcp(stream: Self::Stream) -> Result<TcpStream, Self::Stream> {
        Err(stream)
    }
}

/// How long, and for how many bytes, a connection whose HTTP exchange ended
/// keeps reading (and discarding) what its peer still sends before it is
/// closed ("lingering close").
///
/// | the connection ended … | without lingering | with it |
/// |---|---|---|
/// | the peer closed it (keep-alive over) | — | the first read sees EOF: closed at once |
/// | the response went out before the request body was read (an early 4xx: 411, 413, 403) | the socket closes with the body's rest arriving: TCP answers it with RST, which can destroy the response still in the peer's receive buffer; on a Unix socket the peer's next write fails at once (the front then reports 502 instead of the answer) | the peer finishes sending, reads the answer, closes |
/// | by a timeout or an abort (`Signal::Close`) | closed | closed (no lingering) |
const LINGER_MS: u64 = 1_000;
const LINGER_MAX_BYTES: usize = 1 << 20;

/// A second descriptor of an accepted socket, kept while hyper owns the
/// stream, so the socket outlives hyper's close for [`linger`].
struct LingerFd(std::os::fd::OwnedFd);

impl LingerFd {
    fn of(raw: std::os::fd::RawFd) -> Option<LingerFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: dup(2) of a descriptor the stream owns (alive while
        // the caller holds it); the new one is ours.
        let fd = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) };
        // SAFETY: fd is a fresh descriptor owned by nothing else.
        (fd >= 0).then(|| LingerFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }
}

/// Reads and discards what the peer still sends, until EOF, [`LINGER_MS`]
/// or [`LINGER_MAX_BYTES`], then closes (hyper has already sent its FIN).
async fn linger(fd: LingerFd) {
    // The socket is a stream socket either way; reading through a UnixStream
    // wrapper is plain read(2) on it.
    let std = std::os::unix::net::UnixStream::from(fd.0);
    if std.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(mut s) = tokio::net::UnixStream::from_std(std) else { return };
    let deadline = Instant::now() + Duration::from_millis(LINGER_MS);
    let mut buf = vec![0u8; 16 << 10];
    let mut total = 0usize;
    while total < LINGER_MAX_BYTES {
        match tokio::time::timeout_at(deadline, tokio::io::AsyncReadExt::read(&mut s, &mut buf)).await {
            Ok(Ok(n)) if n > 0 => total += n,
            _ => return,
        }
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    async fn accept(&self) -> std::io::Result<(TcpStream, SocketAddr)> {
        let (s, peer) = TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok((s, peer))
    }
    fn raw_fd(stream: &TcpStream) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(stream))
    }
    fn into_tcp(stream: TcpStream) -> Result<TcpStream, TcpStream> {
        Ok(stream)
    }
}

/// A Unix listener; its peers (on this host, with access to the socket's
/// directory) count as `127.0.0.1` for the per-peer cap and in logs.
struct UnixAccept(UnixListener);

impl Listener for UnixAccept {
    type Stream = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<(tokio::net::UnixStream, SocketAddr)> {
        let (s, _) = self.0.accept().await?;
        Ok((s, SocketAddr::from(([127, 0, 0, 1], 0))))
    }
    fn raw_fd(stream: &tokio::net::UnixStream) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(stream))
    }
}

/// The environment variable naming an inherited file descriptor (the write
/// end of a pipe) on which a gateway process reports `ADDRESS\n` once its
/// server accepts connections, then closes it. The front (`fskv front`)
/// starts gateways with `--listen 127.0.0.1:0` and learns their port and
/// readiness this way, whatever the protocol. Used once per process (the
/// first server that starts); ignored when unset.
pub const READY_FD_ENV: &str = "FSKV_GATEWAY_READY_FD";

fn notify_ready(addr: SocketAddr, unix: Option<&std::path::Path>) {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Ok(v) = std::env::var(READY_FD_ENV) else { return };
    if USED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let fd = match v.trim().parse::<i32>() {
        Ok(fd) if fd > 2 => fd,
        _ => {
            tracing::warn!(value = %v, "{READY_FD_ENV} is not a file descriptor number above 2; not reporting readiness");
            return;
        }
    };
    // SAFETY: F_GETFD only inspects the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        tracing::warn!(fd, "{READY_FD_ENV} names no open file descriptor; not reporting readiness");
        return;
    }
    // SAFETY: the descriptor is open and was handed to this process for this
    // one use (nothing else in the process knows its number); the File owns
    // and closes it.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(fd) };
    let line = match unix {
        Some(path) => format!("{addr} unix:{}\n", path.display()),
        None => format!("{addr}\n"),
    };
    if let Err(e) = pipe.write_all(line.as_bytes()) {
        tracing::warn!(fd, error = %e, "cannot report readiness on {READY_FD_ENV}");
    }
}

/// The one timer of a server: sweeps every connection's clock each period,
/// and passes shutdown on to them. Ends once the server is stopping and no
/// connection is left.
async fn sweep_loop(sweeper: Arc<Sweeper>, period: Duration, mut state: watch::Receiver<RunState>) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut now_state = RunState::Running;
    let mut listening = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                sweeper.sweep(Instant::now());
                if now_state != RunState::Running && sweeper.is_empty() {
                    return;
                }
            }
            r = state.changed(), if listening => {
                now_state = match r {
                    Ok(()) => *state.borrow_and_update(),
                    Err(_) => {
                        listening = false;
                        RunState::Draining
                    }
                };
                match now_state {
                    RunState::Running => {}
                    RunState::Draining => sweeper.raise_all(Signal::Drain),
                    RunState::Abort => sweeper.raise_all(Signal::Close),
                }
            }
        }
    }
}

/// Waits until the server should stop accepting (`Draining` or the handle dropped).
async fn stopping(state: &mut watch::Receiver<RunState>) {
    loop {
        if *state.borrow_and_update() != RunState::Running {
            return;
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

async fn accept_loop<P: Protocol, L: Listener>(listener: L, inner: Arc<Inner<P>>, mut state: watch::Receiver<RunState>) {
    let protocol = inner.protocol.name();
    let limits = &inner.cfg.limits;
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&inner.conns).acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stopping(&mut state) => return,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopping(&mut state) => return,
        };
        let Some(slot) = inner.peers.try_add(peer.ip(), limits.max_connections_per_peer) else {
            inner.metrics.connections_refused.get_or_create(&ReasonLabels { protocol, reason: "per_peer" }).inc();
            tracing::debug!(%peer, max = limits.max_connections_per_peer, "per-peer connection cap reached; closing the new connection");
            drop(stream);
            continue;
        };
        inner.metrics.connections_accepted.get_or_create(&ProtocolLabels { protocol }).inc();
        let spare = if inner.tls.is_none() { L::raw_fd(&stream).and_then(LingerFd::of) } else { None };
        let stream = if inner.handoff.is_some() && inner.tls.is_none() {
            match L::into_tcp(stream) {
                Ok(tcp) => {
                    tokio::spawn(offer_then_serve(Arc::clone(&inner), tcp, spare, peer, (permit, slot)));
                    continue;
                }
                Err(stream) => stream,
            }
        } else {
            stream
        };
        tokio::spawn(serve_connection(Arc::clone(&inner), stream, spare, peer, (permit, slot), Origin::Accepted, Instant::now()));
    }
}

/// The front's accept path: the first request head, peeked, is offered to
/// the [`Handoff`]; a connection it gives back is served here as usual.
async fn offer_then_serve<P: Protocol>(
    inner: Arc<Inner<P>>,
    stream: TcpStream,
    spare: Option<LingerFd>,
    peer: SocketAddr,
    held: (tokio::sync::OwnedSemaphorePermit, PeerSlot),
) {
    let Some(handoff) = inner.handoff.clone() else { return };
    let limits = &inner.cfg.limits;
    let accepted = Instant::now();
    let deadline = accepted + inner.timeouts.header_read;
    let declined = match crate::handover::peek_head(&stream, limits.max_header_bytes, limits.max_headers, deadline).await {
        // The front's own metrics are the front's to answer.
        Some(head) if is_metrics_request(&head, limits.metrics_endpoint) => Declined { stream, recycle_after: None },
        Some(head) => match handoff.offer(&head, stream).await {
            None => return,
            Some(d) => d,
        },
        None => Declined { stream, recycle_after: None },
    };
    let origin = match declined.recycle_after {
        Some(after) => Origin::NotHandedYet { recycle_after: after },
        None => Origin::Accepted,
    };
    // The head's time already spent counts against its timeout.
    serve_connection(inner, declined.stream, spare, peer, held, origin, accepted).await;
}

/// A gateway process's side of [`crate::handover`]: serves every connection
/// the front hands over, under the same caps as accepted ones, until the
/// server stops or the front closes the channel.
async fn handover_loop<P: Protocol>(channel: crate::handover::Channel, inner: Arc<Inner<P>>, mut state: watch::Receiver<RunState>) {
    let protocol = inner.protocol.name();
    loop {
        let got = tokio::select! {
            r = channel.recv() => r,
            _ = stopping(&mut state) => return,
        };
        let (conn, live) = match got {
            Ok(Some(pair)) => pair,
            Ok(None) => {
                tracing::info!("the front closed the handover channel");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "receiving a handed connection failed; no more handed connections");
                return;
            }
        };
        let std = std::net::TcpStream::from(conn);
        let stream = match std.set_nonblocking(true).and_then(|()| TcpStream::from_std(std)) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "a handed connection cannot be served; closed");
                continue;
            }
        };
        let peer = match stream.peer_addr() {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "a handed connection has no peer (already closed)");
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&inner.conns).try_acquire_owned() else {
            inner.metrics.connections_refused.get_or_create(&ReasonLabels { protocol, reason: "max_connections" }).inc();
            tracing::debug!(%peer, "connection cap reached; closing a handed connection");
            continue;
        };
        let Some(slot) = inner.peers.try_add(peer.ip(), inner.cfg.limits.max_connections_per_peer) else {
            inner.metrics.connections_refused.get_or_create(&ReasonLabels { protocol, reason: "per_peer" }).inc();
            continue;
        };
        inner.metrics.connections_accepted.get_or_create(&ProtocolLabels { protocol }).inc();
        let spare = LingerFd::of(std::os::fd::AsRawFd::as_raw_fd(&stream));
        let handed = Handed { _live: live, since: Instant::now() };
        tokio::spawn(serve_connection(Arc::clone(&inner), stream, spare, peer, (permit, slot), Origin::Handed(handed), Instant::now()));
    }
}

/// A connection the front handed over: the liveness end (closed when the
/// connection ends, which the front sees) and when it arrived.
struct Handed {
    _live: OwnedFd,
    since: Instant,
}

/// Where a served connection came from.
enum Origin {
    /// Accepted here, served for as long as the client keeps it.
    Accepted,
    /// Handed over by the front (in a gateway process).
    Handed(Handed),
    /// Accepted by the front when no process could take it at once: served
    /// here, closed after a response once `recycle_after` has passed
    /// since the accept ([`Declined`]).
    NotHandedYet { recycle_after: Duration },
}

/// Counts the connection as open while alive.
struct OpenGuard(prometheus_client::metrics::gauge::Gauge);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// `spare`: a second descriptor of the socket for lingering close (plain
/// TCP and Unix sockets); `handed`: set for a connection the front handed
/// over; `accepted`: when the header-read timeout started.
async fn serve_connection<P: Protocol, S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    inner: Arc<Inner<P>>,
    stream: S,
    spare: Option<LingerFd>,
    peer: SocketAddr,
    _held: (tokio::sync::OwnedSemaphorePermit, PeerSlot),
    origin: Origin,
    accepted: Instant,
) {
    let protocol = inner.protocol.name();
    let handed = matches!(origin, Origin::Handed(_));
    // After this, a response closes the connection (back through the front
    // next time, to whichever process serves best then).
    let recycle_at = match &origin {
        Origin::Accepted => None,
        Origin::Handed(h) => Some(h.since + inner.handed_max_age),
        Origin::NotHandedYet { recycle_after } => Some(accepted + *recycle_after),
    };
    let open = inner.metrics.connections_open.get_or_create_owned(&ProtocolLabels { protocol });
    open.inc();
    let _open = OpenGuard(open);
    let mut timeouts = inner.timeouts;
    if let (true, Some(idle)) = (handed, inner.handed_idle) {
        timeouts.idle = timeouts.idle.min(idle);
    }
    let clock = Arc::new(ConnClock::new(accepted, timeouts));
    let _registered = inner.sweeper.register(Arc::clone(&clock));
    match inner.tls.clone() {
        None => {
            let ended = drive(Arc::clone(&inner), TimedIo::new(stream, Arc::clone(&clock)), clock, peer, handed, recycle_at).await;
            if ended == Ended::ByHttp {
                if let Some(fd) = spare {
                    linger(fd).await;
                }
            }
        }
        Some(acceptor) => {
            let limit = Duration::from_millis(inner.cfg.limits.tls_handshake_timeout_ms);
            match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    drive(Arc::clone(&inner), TimedIo::new(tls, Arc::clone(&clock)), clock, peer, handed, recycle_at).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => {
                    inner.metrics.connections_timed_out.get_or_create(&ReasonLabels { protocol, reason: "tls_handshake" }).inc();
                    tracing::debug!(%peer, "TLS handshake timed out");
                }
            }
        }
    }
}

/// How [`drive`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// hyper finished the connection (the peer closed it, or hyper closed it after a response).
    ByHttp,
    /// A timeout or an abort closed it.
    Closed,
}

/// `handed`: the front handed this connection over; `recycle_at`: from
/// then on, responses close the connection.
async fn drive<P, S>(
    inner: Arc<Inner<P>>,
    io: TimedIo<S>,
    clock: Arc<ConnClock>,
    peer: SocketAddr,
    handed: bool,
    recycle_at: Option<Instant>,
) -> Ended
where
    P: Protocol,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let protocol = inner.protocol.name();
    let limits: &HttpLimits = &inner.cfg.limits;
    let svc = {
        let inner = Arc::clone(&inner);
        let clock = Arc::clone(&clock);
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let inner = Arc::clone(&inner);
            let clock = Arc::clone(&clock);
            async move {
                let mut resp = handle(inner, clock, peer, req, handed).await;
                if recycle_at.is_some_and(|t| Instant::now() >= t) {
                    resp.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.keep_alive(true).max_header_size(limits.max_header_bytes).header_read_timeout(None);
    if limits.max_headers != 100 {
        // hyper's default; setting it makes hyper initialise its header array per request.
        http.max_headers(limits.max_headers);
    }
    let conn = http.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut seen = Signal::None;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return Ended::ByHttp;
            }
            s = clock.signal_above(seen) => {
                seen = s;
                match s {
                    Signal::Drain => conn.as_mut().graceful_shutdown(),
                    Signal::Close => {
                        if let Some(expiry) = clock.expiry() {
                            inner.metrics.connections_timed_out.get_or_create(&ReasonLabels { protocol, reason: expiry.label() }).inc();
                            tracing::debug!(%peer, timeout = expiry.label(), "closing the connection: timed out");
                        }
                        return Ended::Closed;
                    }
                    Signal::None => {}
                }
            }
        }
    }
}

fn content_length(parts: &Parts) -> Option<u64> {
    parts.headers.get(CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

fn is_metrics_request(parts: &Parts, endpoint: MetricsEndpoint) -> bool {
    endpoint != MetricsEndpoint::Off
        && (parts.method == http::Method::GET || parts.method == http::Method::HEAD)
        && parts.uri.path() == "/metrics"
        && matches!(sigv4::scheme(parts), Ok(sigv4::Scheme::Anonymous | sigv4::Scheme::Bearer(_)))
}

async fn handle<P: Protocol>(
    inner: Arc<Inner<P>>,
    clock: Arc<ConnClock>,
    peer: SocketAddr,
    req: Request<Incoming>,
    handed: bool,
) -> Response<ResponseBody<P::Body>> {
    let protocol = inner.protocol.name();
    let (parts, body) = req.into_parts();
    let mut finish = Finish::start(Arc::clone(&clock), Arc::clone(&inner.metrics), protocol, metrics::method_label(&parts.method));
    let request_id: Arc<str> = Arc::from(new_request_id());
    // Classification is pure and cheap, so the span is made once with the route.
    let route = if is_metrics_request(&parts, inner.cfg.limits.metrics_endpoint) { None } else { Some(inner.protocol.classify(&parts)) };
    let route_name = route.map_or("metrics", |r| r.name);
    finish.route = route_name;
    let span = tracing::info_span!(
        "request",
        id = %request_id,
        method = %parts.method,
        path = %parts.uri.path(),
        %peer,
        role = %inner.cfg.role.as_str(),
        protocol = %protocol,
        route = %route_name,
    );
    let cx = RequestContext {
        request_id,
        peer,
        role: inner.cfg.role,
        route: route_name,
        principal: None,
        writer_endpoint: inner.writer_endpoint.clone(),
    };
    if handed && inner.cfg.role == Role::Reader && route.is_some_and(|r| r.access == crate::route::Access::Mutation) {
        if let Some(ret) = &inner.return_socket {
            return forward(&inner, finish, &cx, ret, parts, body).instrument(span).await;
        }
    }
    pipeline(inner, clock, finish, cx, parts, body, route).instrument(span).await
}

/// A mutation on a connection handed to a reader: through the front's
/// return socket to the writer pool ([`crate::handover`], step 4).
async fn forward<P: Protocol>(
    inner: &Inner<P>,
    mut finish: Finish,
    cx: &RequestContext,
    ret: &crate::handover::ReturnSocket,
    parts: Parts,
    body: Incoming,
) -> Response<ResponseBody<P::Body>> {
    // Counted apart: the reader did not serve it.
    finish.route = "forwarded_to_writers";
    match ret.forward(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            finish.status = resp.status().as_u16();
            let (head, body) = resp.into_parts();
            Response::from_parts(head, ResponseBody::forwarded(body, finish))
        }
        Err(e) => {
            tracing::error!(error = %e, "a mutation on a handed connection could not be sent to the writers");
            error_response(inner, finish, cx, &GatewayError::Internal(e))
        }
    }
}

async fn pipeline<P: Protocol>(
    inner: Arc<Inner<P>>,
    clock: Arc<ConnClock>,
    finish: Finish,
    mut cx: RequestContext,
    parts: Parts,
    body: Incoming,
    route: Option<Route>,
) -> Response<ResponseBody<P::Body>> {
    let Some(route) = route else {
        return metrics_response(&inner, finish, &cx, &parts);
    };
    match admit(&inner, route, clock, &mut cx, &parts, body).await {
        Ok(body) => respond(&inner, finish, cx, parts, body).await,
        Err(err) => {
            let reason = err.label();
            inner.metrics.refused.get_or_create(&ReasonLabels { protocol: inner.protocol.name(), reason }).inc();
            if matches!(err, GatewayError::Internal(_) | GatewayError::Auth(AuthError::NeedsBody)) {
                tracing::error!(error = %err, "request failed in the gateway layer");
            } else {
                tracing::debug!(reason, error = %err, "request refused");
            }
            error_response(&inner, finish, &cx, &err)
        }
    }
}

async fn respond<P: Protocol>(
    inner: &Inner<P>,
    mut finish: Finish,
    cx: RequestContext,
    parts: Parts,
    body: RequestBody,
) -> Response<ResponseBody<P::Body>> {
    let request_id = Arc::clone(&cx.request_id);
    let resp = inner.protocol.handle(Request::from_parts(parts, body), cx).await;
    finish.status = resp.status().as_u16();
    let (mut head, body) = resp.into_parts();
    set_request_id(&mut head.headers, &inner.id_header, &request_id);
    Response::from_parts(head, ResponseBody::handler(body, finish))
}

/// The shared checks of one request; on success its body for the handler.
async fn admit<P: Protocol>(
    inner: &Inner<P>,
    route: Route,
    clock: Arc<ConnClock>,
    cx: &mut RequestContext,
    parts: &Parts,
    body: Incoming,
) -> Result<RequestBody, GatewayError> {
    let limits = &inner.cfg.limits;
    let uri_len = parts.uri.path_and_query().map_or(0, |p| p.as_str().len());
    if uri_len > limits.max_uri_bytes {
        return Err(GatewayError::UriTooLong { len: uri_len, max: limits.max_uri_bytes });
    }
    guard(inner.cfg.role, route.access, cx.writer_endpoint.as_deref())?;
    let max = limits.max_body_bytes(route.body);
    if let Some(len) = content_length(parts) {
        if len > max {
            return Err(GatewayError::BodyTooLarge { len: Some(len), max });
        }
    }
    let bytes_in = inner.metrics.body_bytes_in.get_or_create_owned(&RouteLabels { protocol: inner.protocol.name(), route: route.name });
    let body = RequestBody::stream(body, max, clock, limits.body_progress_timeout_ms, bytes_in);
    match route.auth {
        AuthPolicy::Open => Ok(body),
        AuthPolicy::Delegated => {
            inner.auth.sigv4().check(parts, SystemTime::now())?;
            Ok(body)
        }
        AuthPolicy::Required => match inner.auth.authenticate(parts, None, SystemTime::now()) {
            Ok(p) => {
                cx.principal = Some(p);
                Ok(body)
            }
            Err(AuthError::NeedsBody) => {
                let bytes = body.collect().await?;
                cx.principal = Some(inner.auth.authenticate(parts, Some(&bytes), SystemTime::now())?);
                Ok(RequestBody::full(bytes))
            }
            Err(e) => Err(e.into()),
        },
    }
}

fn set_request_id(headers: &mut http::HeaderMap, name: &HeaderName, id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        headers.insert(name.clone(), v);
    }
}

fn error_response<P: Protocol>(
    inner: &Inner<P>,
    mut finish: Finish,
    cx: &RequestContext,
    err: &GatewayError,
) -> Response<ResponseBody<P::Body>> {
    let resp = inner.protocol.error_response(err, cx);
    finish.status = resp.status().as_u16();
    let (mut head, body) = resp.into_parts();
    set_request_id(&mut head.headers, &inner.id_header, &cx.request_id);
    Response::from_parts(head, ResponseBody::full(body, finish))
}

fn metrics_response<P: Protocol>(
    inner: &Inner<P>,
    mut finish: Finish,
    cx: &RequestContext,
    parts: &Parts,
) -> Response<ResponseBody<P::Body>> {
    if inner.cfg.limits.metrics_endpoint == MetricsEndpoint::Bearer {
        let checked = match sigv4::scheme(parts) {
            Ok(sigv4::Scheme::Bearer(token)) => inner.auth.bearer(token).map(drop),
            _ => Err(AuthError::Missing),
        };
        if let Err(e) = checked {
            return error_response(inner, finish, cx, &GatewayError::Auth(e));
        }
    }
    let text = if parts.method == http::Method::HEAD { Bytes::new() } else { Bytes::from(inner.metrics.render()) };
    finish.status = 200;
    let mut resp = Response::new(ResponseBody::full(text, finish));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(metrics::CONTENT_TYPE));
    set_request_id(resp.headers_mut(), &inner.id_header, &cx.request_id);
    resp
}
