//! The server: a [`Router`] of typed handlers served over a [`Transport`].
//!
//! Threading model: one accept task; per connection one reader task (this
//! module's `serve_conn`) and one writer task; per request one handler task.
//! The reader never awaits a handler, so requests on one connection run
//! concurrently and answer out of order.

use crate::auth::{AuthFailure, ClusterKey, Principal, ServerHandshake, HELLO_HEAD_BYTES, NONCE_BYTES, PROOF_BYTES};
use crate::error::{Result, RpcError};
use crate::frame::{encode_head, FrameHeader, FrameKind, OutFrame, STATUS_OK};
use crate::io::{FrameReader, Incoming};
use crate::method::{decode_body, encode_body, Method};
use crate::metrics::{MetricsRegistry, RpcMetrics};
use crate::outgoing::{writer, Outgoing};
use crate::transport::{Connection, Listener, Transport};
use crate::watch;
use crate::DetHashMap;
use bytes::Bytes;
use fskv_types::{ErrorCode, Status};
use futures::FutureExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tracing::{debug, info_span, warn, Instrument};

/// Server limits.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Requests running at once on one connection; more are answered `Overloaded`.
    pub max_in_flight_per_connection: usize,
    /// Largest frame accepted or sent; a larger incoming header closes the connection.
    pub max_frame_bytes: usize,
    /// How long [`Server::shutdown`] lets in-flight requests finish.
    pub shutdown_grace_ms: u64,
    /// Connections open at once; a connection beyond it is closed at accept.
    pub max_connections: usize,
    /// Bytes of request frames held at once over all connections (being
    /// read or being handled); a request that does not fit is read, dropped
    /// and answered `Overloaded`. At least `max_frame_bytes`.
    pub max_in_flight_bytes: usize,
    /// A frame must arrive whole within this of its first byte, else the
    /// connection is closed (a peer that stalls mid-frame holds nothing).
    pub frame_read_timeout_ms: u64,
    /// A connection with nothing in flight and no frame for this long is
    /// closed (checked by one timer per connection, so the close comes
    /// between one and two of this after the last frame; clients reconnect
    /// on their next call).
    pub idle_timeout_ms: u64,
    /// The cluster key: with it every RPC connection must pass the
    /// [`crate::auth`] handshake before its first frame is read; `None`
    /// serves without authentication (unit tests, simulation,
    /// `--insecure-no-auth`).
    pub cluster_key: Option<Arc<ClusterKey>>,
    /// Bound on the handshake, from accept (the first bytes included).
    pub handshake_timeout_ms: u64,
    /// Connections (with a cluster key) that have not finished their
    /// handshake yet; a connection beyond it closes the **oldest** of them
    /// (an honest peer finishes in two round trips, so the oldest are the
    /// silent or slow ones). Keeps unauthenticated peers from taking the
    /// `max_connections` slots of authenticated ones.
    pub max_unauthenticated_connections: usize,
}

impl ServerConfig {
    /// Checks the limits against each other.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(RpcError::Malformed(format!("server config: {m}")));
        if self.max_frame_bytes > u32::MAX as usize {
            return bad(format!("max_frame_bytes {} exceeds 4 GiB", self.max_frame_bytes));
        }
        if self.max_in_flight_bytes < self.max_frame_bytes {
            return bad(format!("max_in_flight_bytes {} is below max_frame_bytes {}", self.max_in_flight_bytes, self.max_frame_bytes));
        }
        if self.max_connections == 0 || self.max_in_flight_per_connection == 0 || self.max_unauthenticated_connections == 0 {
            return bad("max_connections, max_unauthenticated_connections and max_in_flight_per_connection must be at least 1".into());
        }
        Ok(())
    }
}

/// The process's `[rpc]` settings ([`crate::settings`]) and cluster key
/// ([`crate::auth::install`]).
impl Default for ServerConfig {
    fn default() -> Self {
        let s = crate::settings::current();
        ServerConfig {
            max_in_flight_per_connection: s.max_in_flight_per_connection,
            max_frame_bytes: s.max_frame_bytes,
            shutdown_grace_ms: 5_000,
            max_connections: s.max_connections,
            max_in_flight_bytes: s.max_in_flight_bytes.max(s.max_frame_bytes),
            frame_read_timeout_ms: s.frame_read_timeout_ms,
            idle_timeout_ms: s.idle_timeout_ms,
            cluster_key: crate::auth::current().key,
            handshake_timeout_ms: s.handshake_timeout_ms,
            max_unauthenticated_connections: s.max_unauthenticated_connections,
        }
    }
}

/// What a handler knows about its request.
#[derive(Clone, Debug)]
pub struct RequestContext {
    pub request_id: u64,
    pub method_id: u16,
    pub method_name: &'static str,
    pub peer: Arc<str>,
    /// When the caller stops waiting; the handler is aborted at this instant.
    pub deadline: Option<Instant>,
    /// Who the peer proved to be in the connection's handshake; `None` on a
    /// server without a cluster key (no authentication).
    pub principal: Option<Principal>,
    /// State that lives as long as the connection (one slot per connection,
    /// shared by its requests): e.g. storage's cache of verified chunk
    /// capabilities of a user principal.
    pub conn_local: Arc<ConnLocal>,
}

/// One per-connection slot of any type, created on first use by a handler
/// and dropped with the connection. A router uses one type; a request asking
/// for another type than the slot holds gets `None`.
#[derive(Default)]
pub struct ConnLocal(std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>);

impl std::fmt::Debug for ConnLocal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "ConnLocal(set)" } else { "ConnLocal(empty)" })
    }
}

impl ConnLocal {
    /// The slot's value, made with `T::default()` on first use.
    pub fn get_or_default<T: Default + Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.0.get_or_init(|| Arc::new(T::default())).clone().downcast::<T>().ok()
    }
}

type HandlerResult = std::result::Result<(Bytes, Bytes), Status>;
type BoxFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;
type ErasedHandler = Arc<dyn Fn(RequestContext, Bytes, Bytes) -> BoxFuture + Send + Sync>;

struct Route {
    name: &'static str,
    handler: ErasedHandler,
}

/// Maps method ids to handlers.
#[derive(Default)]
pub struct Router {
    routes: HashMap<u16, Route>,
    metrics: Option<Arc<MetricsRegistry>>,
}

impl Router {
    pub fn new() -> Self {
        Router::default()
    }

    /// The registry the server counts its requests in and serves on
    /// `GET /metrics` (with the service's own metrics); without it the
    /// server makes one of its own.
    pub fn with_metrics(mut self, registry: Arc<MetricsRegistry>) -> Self {
        self.metrics = Some(registry);
        self
    }

    /// Registers the handler of `M`.
    ///
    /// # Panics
    /// If a handler for `M::ID` is already registered (a programming error
    /// caught at startup, never reachable from network data).
    pub fn route<M, F, Fut>(mut self, handler: F) -> Self
    where
        M: Method,
        F: Fn(RequestContext, M::Req, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(M::Resp, Bytes), Status>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased: ErasedHandler = Arc::new(move |ctx, body: Bytes, payload| {
            let handler = handler.clone();
            Box::pin(async move {
                let req: M::Req = decode_body(&body).map_err(|e| Status::new(ErrorCode::MalformedMessage, e.to_string()))?;
                let (resp, payload) = handler(ctx, req, payload).await?;
                let body = encode_body(&resp).map_err(|e| Status::new(ErrorCode::Internal, e.to_string()))?;
                Ok((Bytes::from(body), payload))
            })
        });
        let previous = self.routes.insert(M::ID, Route { name: M::NAME, handler: erased });
        assert!(previous.is_none(), "method id {} ({}) registered twice", M::ID, M::NAME);
        self
    }
}

/// A running server. Dropping it aborts everything; [`Server::shutdown`]
/// stops gracefully.
pub struct Server {
    local_addr: String,
    metrics: Arc<MetricsRegistry>,
    shutdown_tx: watch::Sender<bool>,
    accept_task: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` and starts serving.
    pub async fn bind(transport: Arc<dyn Transport>, addr: &str, mut router: Router, config: ServerConfig) -> Result<Server> {
        config.validate()?;
        let registry = router.metrics.take().unwrap_or_else(MetricsRegistry::new);
        let metrics = registry.rpc();
        let listener = transport.bind(addr).await.map_err(|e| RpcError::connection(addr, e))?;
        let local_addr = listener.local_addr().map_err(|e| RpcError::connection(addr, e))?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let budget = Arc::new(Semaphore::new(config.max_in_flight_bytes));
        let unauthenticated = Mutex::new(Unauthenticated::default());
        let auth_warned = Mutex::new(None);
        let shared = Arc::new(Shared { router, config, budget, registry: registry.clone(), metrics, unauthenticated, auth_warned });
        let accept_task = tokio::spawn(accept_loop(listener, shared, shutdown_rx).instrument(info_span!("rpc_server", addr = %local_addr)));
        Ok(Server { local_addr, metrics: registry, shutdown_tx, accept_task: Some(accept_task) })
    }

    pub fn local_addr(&self) -> &str {
        &self.local_addr
    }

    /// The registry served on `GET /metrics`.
    pub fn metrics(&self) -> &Arc<MetricsRegistry> {
        &self.metrics
    }

    /// Stops accepting, answers new requests `ShuttingDown`, lets in-flight
    /// requests finish (up to `shutdown_grace_ms`), then closes every
    /// connection.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        if let Some(task) = self.accept_task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = self.accept_task.take() {
            task.abort();
        }
    }
}

struct Shared {
    router: Router,
    config: ServerConfig,
    /// `max_in_flight_bytes`, in bytes, shared by every connection.
    budget: Arc<Semaphore>,
    registry: Arc<MetricsRegistry>,
    metrics: Arc<RpcMetrics>,
    /// Connections still in their handshake (`max_unauthenticated_connections`).
    unauthenticated: Mutex<Unauthenticated>,
    /// When the last "failed authentication" warning was logged, and how
    /// many failures were not logged since.
    auth_warned: Mutex<Option<(Instant, u64)>>,
}

/// Least time between two "connection cap reached" warnings, and between
/// two "failed authentication" warnings (a flood of bad handshakes must not
/// flood the log; the counters count every one).
const CAP_WARN_INTERVAL_MS: u64 = 10_000;

/// The connections that have not finished their handshake, oldest first.
///
/// | event | effect |
/// |---|---|
/// | accept (server with a key) | registered with the next id |
/// | more than `max_unauthenticated_connections` registered | the oldest is closed (its eviction sender dropped), counted in `fskv_rpc_connections_evicted` |
/// | handshake done, failed, or connection gone | unregistered (the guard's drop) |
#[derive(Default)]
struct Unauthenticated {
    next_id: u64,
    /// id -> dropping the sender closes that connection.
    pending: std::collections::BTreeMap<u64, tokio::sync::oneshot::Sender<()>>,
}

/// Unregisters a connection from [`Unauthenticated`] however its handshake ends.
struct PendingGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.shared.unauthenticated.lock().pending.remove(&self.id);
    }
}

/// Registers a new connection as unauthenticated, closing the oldest one
/// beyond the cap. The receiver completes when the connection is evicted.
fn register_unauthenticated(shared: &Arc<Shared>) -> (PendingGuard, tokio::sync::oneshot::Receiver<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut evicted = 0;
    let id = {
        let mut u = shared.unauthenticated.lock();
        let id = u.next_id;
        u.next_id += 1;
        u.pending.insert(id, tx);
        while u.pending.len() > shared.config.max_unauthenticated_connections {
            // Dropping the sender wakes the connection's eviction receiver.
            if u.pending.pop_first().is_none() {
                break;
            }
            evicted += 1;
        }
        id
    };
    if evicted > 0 {
        shared.metrics.connections_evicted.inc_by(evicted);
    }
    (PendingGuard { shared: shared.clone(), id }, rx)
}

async fn accept_loop(mut listener: Box<dyn Listener>, shared: Arc<Shared>, mut shutdown_rx: watch::Receiver<bool>) {
    // Invariant: every connection task lives in `conns`, so dropping or
    // aborting this task aborts them all.
    let mut conns = JoinSet::new();
    let mut last_cap_warning: Option<Instant> = None;
    loop {
        // `biased`: a fixed polling order keeps simulations deterministic
        // (tokio's random branch order is not seeded outside tokio_unstable).
        tokio::select! {
            biased;
            _ = shutdown_rx.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) if conns.len() >= shared.config.max_connections => {
                    if last_cap_warning.map_or(true, |at| at.elapsed() >= Duration::from_millis(CAP_WARN_INTERVAL_MS)) {
                        warn!(peer = %conn.peer, max_connections = shared.config.max_connections, "connection cap reached; closing new connections");
                        last_cap_warning = Some(Instant::now());
                    }
                    shared.metrics.connections_refused.inc();
                    drop(conn);
                }
                Ok(conn) => {
                    shared.metrics.connections_accepted.inc();
                    let span = info_span!("rpc_conn", peer = %conn.peer);
                    conns.spawn(serve_conn(conn, shared.clone(), shutdown_rx.clone()).instrument(span));
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    // Avoid spinning when out of file descriptors.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let grace = Duration::from_millis(shared.config.shutdown_grace_ms);
    let _ = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    conns.abort_all();
}

/// The requests running on one connection.
struct InFlight {
    /// request id -> (sequence, handle). The sequence makes a stale removal
    /// (from an aborted task) a no-op. The handle is `None` only between
    /// reserving the slot and spawning the task, both done by the reader, so
    /// a Cancel (also handled by the reader) never sees `None`.
    /// Invariant: no task is aborted or dropped while this lock is held.
    tasks: Mutex<DetHashMap<u64, (u64, Option<AbortHandle>)>>,
    next_seq: std::sync::atomic::AtomicU64,
    idle: Notify,
}

impl InFlight {
    fn remove(&self, request_id: u64, seq: u64) {
        let mut tasks = self.tasks.lock();
        if tasks.get(&request_id).is_some_and(|(s, _)| *s == seq) {
            tasks.remove(&request_id);
        }
        if tasks.is_empty() {
            self.idle.notify_one();
        }
    }

    fn cancel(&self, request_id: u64) {
        let handle = {
            let mut tasks = self.tasks.lock();
            let entry = tasks.remove(&request_id);
            if tasks.is_empty() {
                self.idle.notify_one();
            }
            entry.and_then(|(_, handle)| handle)
        };
        if let Some(handle) = handle {
            handle.abort();
        }
    }

    /// Records the handle of a spawned task if its slot is still there (the
    /// task may already have finished and removed it).
    fn set_handle(&self, request_id: u64, seq: u64, handle: AbortHandle) {
        if let Some((s, slot)) = self.tasks.lock().get_mut(&request_id) {
            if *s == seq {
                *slot = Some(handle);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.tasks.lock().is_empty()
    }
}

/// Aborts every handler of a connection when its reader stops.
struct AbortAllOnDrop(Arc<InFlight>);

impl Drop for AbortAllOnDrop {
    fn drop(&mut self) {
        let handles: Vec<AbortHandle> = self.0.tasks.lock().drain().filter_map(|(_, (_, h))| h).collect();
        for handle in handles {
            handle.abort();
        }
    }
}

/// Removes a handler's entry however its task ends (return, panic, abort).
struct RemoveOnDrop {
    in_flight: Arc<InFlight>,
    request_id: u64,
    seq: u64,
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        self.in_flight.remove(self.request_id, self.seq);
    }
}

struct ConnState {
    shared: Arc<Shared>,
    in_flight: Arc<InFlight>,
    out: Arc<Outgoing>,
    peer: Arc<str>,
    principal: Option<Principal>,
    conn_local: Arc<ConnLocal>,
    shutting_down: bool,
}

/// How long a closing connection waits for queued replies to be written.
const WRITER_DRAIN_MS: u64 = 1_000;

/// Closes a connection's outgoing side when dropped.
struct CloseOnDrop(Arc<Outgoing>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Decrements the open-connections gauge however the connection ends.
struct ConnGauge(Arc<RpcMetrics>);

impl ConnGauge {
    fn open(metrics: &Arc<RpcMetrics>) -> ConnGauge {
        metrics.connections_open.inc();
        ConnGauge(metrics.clone())
    }
}

impl Drop for ConnGauge {
    fn drop(&mut self) {
        self.0.connections_open.dec();
    }
}

/// Reads the first bytes of a connection (up to [`crate::http::HTTP_GET_PREFIX`]'s
/// length; fewer only at end of stream) within `timeout`; `None` on timeout or error.
async fn sniff(read: &mut crate::transport::BoxRead, timeout: Duration) -> Option<([u8; 4], usize)> {
    let mut first = [0u8; 4];
    let mut n = 0;
    let filled = tokio::time::timeout(timeout, async {
        while n < first.len() {
            match read.read(&mut first[n..]).await {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
    .await;
    match filled {
        Ok(Ok(())) => Some((first, n)),
        Ok(Err(e)) => {
            debug!(error = %e, "connection failed before its first bytes");
            None
        }
        Err(_) => {
            debug!("no bytes within the idle timeout; closing");
            None
        }
    }
}

/// The async shell of [`ServerHandshake`]; `first` are the bytes the sniff
/// already read. A refusal is sent (best effort) before the error returns.
async fn server_handshake(
    read: &mut crate::transport::BoxRead,
    write: &mut crate::transport::BoxWrite,
    key: Arc<ClusterKey>,
    first: &[u8],
) -> std::result::Result<Principal, AuthFailure> {
    async fn refuse(write: &mut crate::transport::BoxWrite, refusal: crate::auth::Refusal) -> AuthFailure {
        let _ = write.write_all(&refusal.reply).await;
        let _ = write.flush().await;
        refusal.reason
    }
    let closed = |_| AuthFailure::Closed;
    // Sized for the largest hello: 6 + 64 + 32 bytes.
    let mut hello = [0u8; HELLO_HEAD_BYTES + crate::auth::MAX_PRINCIPAL_BYTES + NONCE_BYTES];
    hello[..first.len()].copy_from_slice(first);
    read.read_exact(&mut hello[first.len()..HELLO_HEAD_BYTES]).await.map_err(closed)?;
    let head: [u8; HELLO_HEAD_BYTES] = hello[..HELLO_HEAD_BYTES].try_into().map_err(|_| AuthFailure::BadMagic)?;
    let len = match ServerHandshake::hello_len(&head) {
        Ok(len) => len,
        Err(refusal) => return Err(refuse(write, refusal).await),
    };
    read.read_exact(&mut hello[HELLO_HEAD_BYTES..len]).await.map_err(closed)?;
    let mut nonce = [0u8; NONCE_BYTES];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
    let mut state = ServerHandshake::new(key, nonce);
    let challenge = match state.on_hello(&hello[..len]) {
        Ok(c) => c,
        Err(refusal) => return Err(refuse(write, refusal).await),
    };
    write.write_all(&challenge).await.map_err(closed)?;
    write.flush().await.map_err(closed)?;
    let mut proof = [0u8; PROOF_BYTES];
    read.read_exact(&mut proof).await.map_err(closed)?;
    match state.on_proof(&proof) {
        Ok((principal, verdict)) => {
            write.write_all(&[verdict]).await.map_err(closed)?;
            write.flush().await.map_err(closed)?;
            Ok(principal)
        }
        Err(refusal) => Err(refuse(write, refusal).await),
    }
}

/// Logs a failed handshake at most once per [`CAP_WARN_INTERVAL_MS`], with
/// the number of failures since the last line (every one is counted in
/// `fskv_rpc_auth_failures_total`).
fn warn_auth_failure(shared: &Shared, reason: AuthFailure) {
    let mut warned = shared.auth_warned.lock();
    let now = Instant::now();
    match warned.as_mut() {
        Some((at, suppressed)) if now.duration_since(*at) < Duration::from_millis(CAP_WARN_INTERVAL_MS) => *suppressed += 1,
        _ => {
            let suppressed = warned.map_or(0, |(_, n)| n);
            *warned = Some((now, 0));
            drop(warned);
            warn!(reason = reason.name(), failures_not_logged_before = suppressed, "closing a connection that failed authentication");
        }
    }
}

async fn serve_conn(conn: Connection, shared: Arc<Shared>, mut shutdown_rx: watch::Receiver<bool>) {
    let Connection { mut read, write, peer } = conn;
    let _open = ConnGauge::open(&shared.metrics);
    // Until its handshake is done a connection holds one of the
    // `max_unauthenticated_connections` places and may be evicted.
    let (pending, mut evicted) = match shared.config.cluster_key {
        Some(_) => {
            let (guard, rx) = register_unauthenticated(&shared);
            (Some(guard), Some(rx))
        }
        None => (None, None),
    };
    let evicted_signal = async {
        match evicted.as_mut() {
            Some(rx) => {
                let _ = rx.await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(evicted_signal);
    let max_frame_bytes = shared.config.max_frame_bytes;
    // HTTP or RPC: the table in `crate::http`. With a key the first bytes
    // must come within the handshake timeout.
    let handshake_timeout = Duration::from_millis(shared.config.handshake_timeout_ms);
    let first_timeout =
        if shared.config.cluster_key.is_some() { handshake_timeout } else { Duration::from_millis(shared.config.idle_timeout_ms) };
    let sniffed = tokio::select! {
        biased;
        _ = &mut evicted_signal => return,
        sniffed = sniff(&mut read, first_timeout) => sniffed,
    };
    let Some((first, first_len)) = sniffed else {
        if shared.config.cluster_key.is_some() {
            shared.metrics.auth_failure(AuthFailure::Timeout);
        }
        return;
    };
    if first_len == first.len() && first == crate::http::HTTP_GET_PREFIX {
        // `/metrics` is unauthenticated: the connection stays evictable.
        let timeout = Duration::from_millis(shared.config.frame_read_timeout_ms);
        tokio::select! {
            biased;
            _ = &mut evicted_signal => {}
            _ = crate::http::serve(read, write, &first, &shared.registry, timeout) => {}
        }
        return;
    }
    let mut write = write;
    // Service identity: no frame is read before the peer proved it holds the key.
    let (principal, prefix_len) = match &shared.config.cluster_key {
        Some(key) => {
            let handshake = server_handshake(&mut read, &mut write, key.clone(), &first[..first_len]);
            let outcome = tokio::select! {
                biased;
                _ = &mut evicted_signal => {
                    debug!("closing a connection evicted during its handshake (max_unauthenticated_connections)");
                    return;
                }
                outcome = tokio::time::timeout(handshake_timeout, handshake) => match outcome {
                    Ok(outcome) => outcome,
                    Err(_) => Err(AuthFailure::Timeout),
                },
            };
            match outcome {
                Ok(principal) => {
                    debug!(%principal, "peer authenticated");
                    (Some(principal), 0)
                }
                Err(reason) => {
                    shared.metrics.auth_failure(reason);
                    warn_auth_failure(&shared, reason);
                    return;
                }
            }
        }
        None => (None, first_len),
    };
    // Authenticated (or no key): no longer evictable.
    drop(pending);
    // Replies are written by their handler's task when the connection is
    // free (`crate::outgoing`). Bounded: each request queues at most one
    // reply (two buffers) and senders wait for room, holding the request's
    // slot, so a peer that never reads cannot grow our memory.
    let out = Arc::new(Outgoing::new(write, shared.config.max_in_flight_per_connection.saturating_add(64).saturating_mul(2)));
    let writer = tokio::spawn(writer(out.clone(), |reason| debug!(reason, "closing the reply side")).in_current_span());
    // Closed however this task ends (also when aborted with the server), so
    // the writer ends the stream rather than wait for frames for ever.
    let close_out = CloseOnDrop(out.clone());
    let in_flight = Arc::new(InFlight { tasks: Mutex::new(DetHashMap::default()), next_seq: 0.into(), idle: Notify::new() });
    let abort_guard = AbortAllOnDrop(in_flight.clone());
    let mut reader = FrameReader::new(read, max_frame_bytes, peer.clone())
        .with_prefix(&first[..prefix_len])
        .with_budget(shared.budget.clone())
        .with_frame_read_timeout(Duration::from_millis(shared.config.frame_read_timeout_ms));
    let idle_timeout = Duration::from_millis(shared.config.idle_timeout_ms);
    let mut state = ConnState {
        shared,
        in_flight,
        out: out.clone(),
        peer: peer.into(),
        principal,
        conn_local: Arc::default(),
        shutting_down: *shutdown_rx.borrow(),
    };
    let mut protocol_error = false;
    // The idle timer: one timer for the connection's life, checked when it
    // fires (no wake-up per request). It closes the connection when nothing
    // is in flight, no frame is arriving and none arrived for the idle
    // timeout; otherwise it is pushed one timeout further. The reader
    // enforces the frame-read timeout.
    let mut idle_checked = reader.last_frame();
    let idle = tokio::time::sleep_until(idle_checked + idle_timeout);
    tokio::pin!(idle);
    loop {
        if state.shutting_down && state.in_flight.is_empty() {
            break;
        }
        // `biased` (requests first): see `accept_loop`.
        tokio::select! {
            biased;
            next = reader.next_incoming() => match next {
                Ok(Some(Incoming::Frame(frame, permit))) => {
                    if !state.on_frame(frame, permit).await {
                        protocol_error = true;
                        break;
                    }
                }
                Ok(Some(Incoming::Refused(header))) => {
                    let status = Status::new(ErrorCode::Overloaded, "the server's in-flight byte budget is used up; retry shortly");
                    state.reply_error(header.request_id, status).await;
                }
                Ok(None) => break,
                Err(e) => {
                    // Logged once; the stream cannot be resynchronised.
                    warn!(error = %e, "closing connection");
                    protocol_error = matches!(e, RpcError::Frame(_));
                    break;
                }
            },
            _ = shutdown_rx.changed(), if !state.shutting_down => {
                state.shutting_down = true;
                if state.in_flight.is_empty() { break; }
            }
            _ = state.in_flight.idle.notified(), if state.shutting_down => {
                if state.in_flight.is_empty() { break; }
            }
            _ = &mut idle => {
                let last = reader.last_frame().max(idle_checked);
                if reader.frame_started().is_none() && state.in_flight.is_empty() && last + idle_timeout <= Instant::now() {
                    debug!("closing an idle connection");
                    break;
                }
                idle_checked = Instant::now();
                let next = reader.last_frame().max(idle_checked) + idle_timeout;
                idle.as_mut().reset(next);
            }
        }
    }
    drop(abort_guard);
    drop(state);
    // The writer sends what is queued, then ends the stream.
    drop(close_out);
    if protocol_error {
        writer.abort();
    } else {
        let grace = Duration::from_millis(WRITER_DRAIN_MS);
        if tokio::time::timeout(grace, writer).await.is_err() {
            debug!("writer did not drain in time");
        }
    }
}

impl ConnState {
    /// Handles one frame; `false` means the peer broke the protocol and the
    /// connection must close.
    async fn on_frame(&mut self, frame: crate::frame::Frame, permit: Option<OwnedSemaphorePermit>) -> bool {
        let id = frame.header.request_id;
        match frame.header.kind {
            FrameKind::Cancel => {
                self.in_flight.cancel(id);
                true
            }
            FrameKind::Response => {
                warn!(request_id = id, "client sent a response frame");
                false
            }
            FrameKind::Request => {
                let method_name =
                    u16::try_from(frame.header.code).ok().and_then(|m| self.shared.router.routes.get(&m)).map_or("unknown", |r| r.name);
                if let Err(status) = self.start_request(frame, permit) {
                    self.shared.metrics.record(method_name, Some(status.code), None);
                    self.reply_error(id, status).await;
                }
                true
            }
        }
    }

    /// Starts the handler task, or says why the request is refused.
    fn start_request(&mut self, frame: crate::frame::Frame, permit: Option<OwnedSemaphorePermit>) -> std::result::Result<(), Status> {
        let header = frame.header;
        if self.shutting_down {
            return Err(Status::new(ErrorCode::ShuttingDown, "server is shutting down"));
        }
        let route = u16::try_from(header.code).ok().and_then(|id| self.shared.router.routes.get(&id).map(|r| (id, r)));
        let Some((method_id, route)) = route else {
            return Err(Status::new(ErrorCode::UnknownMethod, format!("unknown method id {}", header.code)));
        };
        let seq = self.reserve_slot(header.request_id)?;
        let deadline = (header.timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(header.timeout_ms.into()));
        let ctx = RequestContext {
            request_id: header.request_id,
            method_id,
            method_name: route.name,
            peer: self.peer.clone(),
            deadline,
            principal: self.principal.clone(),
            conn_local: self.conn_local.clone(),
        };
        let guard = RemoveOnDrop { in_flight: self.in_flight.clone(), request_id: header.request_id, seq };
        let fut = (route.handler)(ctx, frame.body, frame.payload);
        let span = info_span!("rpc_request", request_id = header.request_id, method = route.name);
        let counted = Counted { metrics: self.shared.metrics.clone(), method: route.name };
        let task =
            run_handler(fut, deadline, header.request_id, self.out.clone(), self.shared.config.max_frame_bytes, (guard, permit), counted);
        let handle = tokio::spawn(task.instrument(span)).abort_handle();
        self.in_flight.set_handle(header.request_id, seq, handle);
        Ok(())
    }

    /// Reserves an in-flight slot (before the task exists, so the task's
    /// removal always finds it) or refuses with `Overloaded`.
    fn reserve_slot(&self, request_id: u64) -> std::result::Result<u64, Status> {
        let mut tasks = self.in_flight.tasks.lock();
        if tasks.len() >= self.shared.config.max_in_flight_per_connection {
            return Err(Status::new(ErrorCode::Overloaded, format!("{} requests in flight on this connection", tasks.len())));
        }
        if tasks.contains_key(&request_id) {
            return Err(Status::new(ErrorCode::InvalidArgument, "request id already in flight"));
        }
        let seq = self.in_flight.next_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tasks.insert(request_id, (seq, None));
        Ok(seq)
    }

    async fn reply_error(&self, request_id: u64, status: Status) {
        debug!(request_id, code = ?status.code, "refusing request");
        let frame = error_frame(request_id, &status);
        let _ = self.out.send_bounded(frame).await;
    }
}

async fn run_handler(
    fut: BoxFuture,
    deadline: Option<Instant>,
    request_id: u64,
    out: Arc<Outgoing>,
    max_frame_bytes: usize,
    // Dropped when the reply is queued: the slot and the request's budget.
    guard: (RemoveOnDrop, Option<OwnedSemaphorePermit>),
    counted: Counted,
) {
    let started = Instant::now();
    counted.metrics.in_flight.inc();
    // Decrements the in-flight gauge also when the task is aborted (Cancel).
    let _in_flight = InFlightGauge(counted.metrics.clone());
    let fut = AssertUnwindSafe(fut).catch_unwind();
    let outcome = match deadline {
        Some(at) => tokio::time::timeout_at(at, fut).await.ok(),
        None => Some(fut.await),
    };
    let result = match outcome {
        None => Err(Status::new(ErrorCode::DeadlineExceeded, "handler deadline exceeded")),
        Some(Err(_panic)) => {
            warn!("handler panicked");
            Err(Status::new(ErrorCode::Internal, "handler panicked"))
        }
        Some(Ok(result)) => result,
    };
    let (frame, code) = match result {
        Ok((body, payload)) => match OutFrame::build(FrameKind::Response, request_id, STATUS_OK, 0, &body, payload, max_frame_bytes) {
            Ok(frame) => (frame, None),
            Err(e) => (error_frame(request_id, &Status::new(ErrorCode::FrameTooLarge, e.to_string())), Some(ErrorCode::FrameTooLarge)),
        },
        Err(status) => (error_frame(request_id, &status), Some(status.code)),
    };
    counted.metrics.record(counted.method, code, Some(started.elapsed().as_secs_f64()));
    let _ = out.send_bounded(frame).await;
    drop(guard);
}

/// What a handler task counts in: the server's metrics under its method's name.
struct Counted {
    metrics: Arc<RpcMetrics>,
    method: &'static str,
}

struct InFlightGauge(Arc<RpcMetrics>);

impl Drop for InFlightGauge {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// Longest error message sent back; longer ones are truncated.
const MAX_ERROR_MESSAGE_BYTES: usize = 4096;

/// An error response: the body is the UTF-8 message, truncated to
/// [`MAX_ERROR_MESSAGE_BYTES`] so the frame is always small.
fn error_frame(request_id: u64, status: &Status) -> OutFrame {
    let mut end = status.message.len().min(MAX_ERROR_MESSAGE_BYTES);
    while !status.message.is_char_boundary(end) {
        end -= 1;
    }
    let msg = &status.message.as_bytes()[..end];
    let header = FrameHeader {
        kind: FrameKind::Response,
        flags: 0,
        request_id,
        code: status.code.as_u32(),
        timeout_ms: 0,
        // Cannot truncate: end <= MAX_ERROR_MESSAGE_BYTES.
        body_len: end as u32,
        payload_len: 0,
    };
    OutFrame { head: encode_head(&header, msg), payload: Bytes::new() }
}
