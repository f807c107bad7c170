//! The client: pooled, multiplexed connections with deadlines and
//! cancellation.
//!
//! Threading model: per connection one reader task (matches responses to
//! pending calls by request id) and one writer task (vectored writes, the
//! payload is never copied). A call registers a oneshot in the connection's
//! pending map, sends its frame ([`Outgoing`]: straight from the caller's
//! thread when the socket is free, else through the writer task) and waits;
//! a drop guard removes the entry and sends a Cancel frame if the call ends
//! (timeout or the future dropped) before its reply.
//!
//! A connection that stops answering is closed: when
//! [`SILENT_TIMEOUTS_BEFORE_CLOSE`] calls in a row reach their deadline with
//! no frame at all arriving on the connection since each was sent, it is
//! failed like a broken one, and the next call dials again. Without this a
//! stream that lost bytes without an error (a peer that rebooted behind a
//! dropped RST, a middlebox that forgot the flow, the simulation's
//! partitions) took a share of every later call to its deadline for good
//! (simulation seed 2819: one in three heartbeats to the primary mgmtd).

use crate::auth::{ClientHandshake, ClusterKey, NONCE_BYTES};
use crate::error::{Result, RpcError};
use crate::frame::{Frame, FrameKind, OutFrame, STATUS_OK};
use crate::io::FrameReader;
use crate::method::{decode_body, encode_body, Method};
use crate::outgoing::{writer, Outgoing};
use crate::transport::{connect_with_timeout, Transport};
use crate::DetHashMap;
use bytes::Bytes;
use fskv_types::{ErrorCode, Status};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, debug_span, Instrument};

/// Client limits.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Connections kept per server address, used round-robin.
    pub connections_per_addr: usize,
    /// Largest frame sent or accepted.
    pub max_frame_bytes: usize,
    /// Calls outstanding at once on one connection; more wait for a slot
    /// (within their deadline).
    pub max_in_flight_per_connection: usize,
    pub connect_timeout_ms: u64,
    /// The cluster key: with it every connection starts with the
    /// [`crate::auth`] handshake; `None` connects without one.
    pub cluster_key: Option<Arc<ClusterKey>>,
    /// The name claimed in the handshake (`node:<id>`, `fuse`, `client`, ...).
    pub principal: Arc<str>,
    /// Bound on the handshake.
    pub handshake_timeout_ms: u64,
}

/// The process's `[rpc]` settings ([`crate::settings`]) and identity
/// ([`crate::auth::install`]).
impl Default for ClientConfig {
    fn default() -> Self {
        let s = crate::settings::current();
        let identity = crate::auth::current();
        ClientConfig {
            cluster_key: identity.key,
            principal: identity.principal,
            handshake_timeout_ms: s.handshake_timeout_ms,
            connections_per_addr: s.connections_per_peer,
            max_frame_bytes: s.max_frame_bytes,
            max_in_flight_per_connection: s.max_in_flight_per_connection,
            connect_timeout_ms: s.connect_timeout_ms,
        }
    }
}

/// Per-call options.
#[derive(Clone, Copy, Debug)]
pub struct CallOptions {
    /// Deadline relative to the call's start; 0 means none. Also sent to
    /// the server, which aborts the handler when it passes.
    pub timeout_ms: u64,
}

/// The process's `default_call_timeout_ms` ([`crate::settings`]).
impl Default for CallOptions {
    fn default() -> Self {
        CallOptions { timeout_ms: crate::settings::current().default_call_timeout_ms }
    }
}

impl CallOptions {
    pub fn with_timeout(timeout: Duration) -> Self {
        CallOptions { timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX) }
    }
}

/// A cheap-to-clone handle to a pool of connections.
#[derive(Clone)]
pub struct RpcClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    transport: Arc<dyn Transport>,
    config: ClientConfig,
    /// Ordered: when the client is dropped its connections close (FIN) in
    /// address order, the same in every run (deterministic simulation).
    pools: Mutex<BTreeMap<String, Arc<Pool>>>,
    next_request_id: AtomicU64,
}

struct Pool {
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next_slot: AtomicUsize,
}

type PendingTx = oneshot::Sender<Result<Frame>>;

/// Calls in a row that time out on a connection that delivers nothing
/// before the connection is closed (module doc).
pub const SILENT_TIMEOUTS_BEFORE_CLOSE: u32 = 2;

/// State shared by a connection's handle and its reader/writer tasks.
struct ConnShared {
    addr: String,
    /// Invariant: `closed` is set while holding this lock, and entries are
    /// only added while it is unset, so no call waits on a dead connection.
    pending: Mutex<DetHashMap<u64, PendingTx>>,
    closed: AtomicBool,
    /// Frames received so far (any kind).
    frames_received: AtomicU64,
    /// Calls in a row that reached their deadline with no frame received
    /// since they were sent; reset by every frame.
    silent_timeouts: AtomicU32,
}

impl ConnShared {
    fn register(&self, request_id: u64) -> Result<oneshot::Receiver<Result<Frame>>> {
        let mut pending = self.pending.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(RpcError::connection(&self.addr, "connection closed"));
        }
        let (tx, rx) = oneshot::channel();
        pending.insert(request_id, tx);
        Ok(rx)
    }

    /// Marks the connection dead and fails every pending call.
    fn fail(&self, reason: &str) {
        let drained: Vec<PendingTx> = {
            let mut pending = self.pending.lock();
            self.closed.store(true, Ordering::Release);
            pending.drain().map(|(_, tx)| tx).collect()
        };
        if !drained.is_empty() {
            debug!(addr = %self.addr, calls = drained.len(), reason, "failing pending calls");
        }
        for tx in drained {
            let _ = tx.send(Err(RpcError::connection(&self.addr, reason)));
        }
    }
}

struct Conn {
    shared: Arc<ConnShared>,
    out: Arc<Outgoing>,
    permits: Arc<Semaphore>,
    reader: AbortHandle,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The writer ends once it has written what is queued.
        self.out.close();
        self.reader.abort();
    }
}

/// Removes the pending entry and cancels the request on the server if the
/// call ends without its reply.
struct PendingGuard {
    conn: Arc<Conn>,
    request_id: u64,
    armed: bool,
    _permit: OwnedSemaphorePermit,
    /// The call's deadline, and the connection's frame count when it was sent.
    deadline: Option<Instant>,
    frames_at_send: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let shared = &self.conn.shared;
        let was_pending = shared.pending.lock().remove(&self.request_id).is_some();
        if was_pending {
            // Best effort: on a broken connection, or one whose queue is
            // full, the handler runs to completion and its reply is dropped.
            self.conn.out.send_cancel(self.request_id);
        }
        let timed_out = self.deadline.is_some_and(|d| Instant::now() >= d);
        if was_pending && timed_out && shared.frames_received.load(Ordering::Acquire) == self.frames_at_send {
            let silent = shared.silent_timeouts.fetch_add(1, Ordering::AcqRel).saturating_add(1);
            if silent >= SILENT_TIMEOUTS_BEFORE_CLOSE {
                debug!(addr = %shared.addr, silent, "no frame for calls in a row past their deadlines; closing the connection");
                shared.fail(&format!("closed: {silent} calls in a row got no reply before their deadlines, and nothing else arrived"));
            }
        }
    }
}

impl RpcClient {
    pub fn new(transport: Arc<dyn Transport>, config: ClientConfig) -> Self {
        RpcClient {
            inner: Arc::new(ClientInner { transport, config, pools: Mutex::new(BTreeMap::new()), next_request_id: AtomicU64::new(1) }),
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Calls `M` on the server at `addr` with `req` and a bulk `payload`;
    /// returns the typed reply and the reply payload.
    pub async fn call<M: Method>(&self, addr: &str, req: &M::Req, payload: Bytes, opts: CallOptions) -> Result<(M::Resp, Bytes)> {
        let request_id = self.inner.next_request_id.fetch_add(1, Ordering::Relaxed);
        let span = debug_span!("rpc_call", request_id, method = M::NAME, addr);
        let deadline = (opts.timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(opts.timeout_ms));
        let body = encode_body(req)?;
        // Size limit checked here, before connecting or writing anything.
        let timeout_ms = u32::try_from(opts.timeout_ms).unwrap_or(u32::MAX);
        let frame = OutFrame::build(
            FrameKind::Request,
            request_id,
            u32::from(M::ID),
            timeout_ms,
            &body,
            payload,
            self.inner.config.max_frame_bytes,
        )?;
        let exchange = self.exchange(addr, request_id, frame, deadline).instrument(span);
        let reply = match deadline {
            // On timeout `exchange` is dropped: its guard sends the Cancel.
            Some(at) => {
                tokio::time::timeout_at(at, exchange).await.map_err(|_| RpcError::DeadlineExceeded { timeout_ms: opts.timeout_ms })??
            }
            None => exchange.await?,
        };
        decode_reply::<M>(reply)
    }

    /// Sends one request frame and waits for its response frame.
    async fn exchange(&self, addr: &str, request_id: u64, frame: OutFrame, deadline: Option<Instant>) -> Result<Frame> {
        let conn = self.conn_for(addr).await?;
        let permit = conn.permits.clone().acquire_owned().await.map_err(|_| RpcError::connection(addr, "connection closed"))?;
        let frames_at_send = conn.shared.frames_received.load(Ordering::Acquire);
        let rx = conn.shared.register(request_id)?;
        let mut guard = PendingGuard { conn: conn.clone(), request_id, armed: true, _permit: permit, deadline, frames_at_send };
        if let Err(e) = conn.out.send(frame) {
            let reason = format!("write failed: {e}");
            conn.shared.fail(&reason);
            return Err(RpcError::connection(addr, reason));
        }
        let reply = rx.await.map_err(|_| RpcError::connection(addr, "connection dropped"))?;
        // The entry was removed by whoever answered; nothing to cancel.
        guard.armed = false;
        reply
    }

    /// A live connection to `addr`, round-robin over the pool's slots;
    /// reconnects a slot whose connection has failed.
    async fn conn_for(&self, addr: &str) -> Result<Arc<Conn>> {
        let pool = {
            let mut pools = self.inner.pools.lock();
            pools
                .entry(addr.to_string())
                .or_insert_with(|| {
                    let n = self.inner.config.connections_per_addr.max(1);
                    Arc::new(Pool { slots: (0..n).map(|_| tokio::sync::Mutex::new(None)).collect(), next_slot: AtomicUsize::new(0) })
                })
                .clone()
        };
        let index = pool.next_slot.fetch_add(1, Ordering::Relaxed) % pool.slots.len();
        let Some(slot) = pool.slots.get(index) else {
            return Err(RpcError::connection(addr, "empty connection pool"));
        };
        let mut slot = slot.lock().await;
        if let Some(conn) = slot.as_ref() {
            if !conn.shared.closed.load(Ordering::Acquire) {
                return Ok(conn.clone());
            }
        }
        // Drop the dead connection before dialling (its tasks end).
        *slot = None;
        let conn = self.connect(addr).await?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    async fn connect(&self, addr: &str) -> Result<Arc<Conn>> {
        let config = &self.inner.config;
        let mut connection = connect_with_timeout(self.inner.transport.as_ref(), addr, config.connect_timeout_ms).await?;
        if let Some(key) = &config.cluster_key {
            let handshake = client_handshake(&mut connection, key.clone(), &config.principal);
            match tokio::time::timeout(Duration::from_millis(config.handshake_timeout_ms), handshake).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e.into_rpc(addr)),
                Err(_) => {
                    return Err(RpcError::Unauthenticated {
                        addr: addr.to_string(),
                        reason: format!("no answer to the handshake within {} ms", config.handshake_timeout_ms),
                    })
                }
            }
        }
        let max_in_flight = config.max_in_flight_per_connection.max(1);
        let shared = Arc::new(ConnShared {
            addr: addr.to_string(),
            pending: Mutex::new(DetHashMap::default()),
            closed: AtomicBool::new(false),
            frames_received: AtomicU64::new(0),
            silent_timeouts: AtomicU32::new(0),
        });
        let span = debug_span!("rpc_client_conn", peer = %connection.peer);
        // Room for one request and one cancel (two buffers each) per permit.
        let out = Arc::new(Outgoing::new(connection.write, max_in_flight.saturating_mul(4).saturating_add(32)));
        let failed = shared.clone();
        tokio::spawn(writer(out.clone(), move |reason| failed.fail(reason)).instrument(span.clone()));
        let reader = FrameReader::new(connection.read, config.max_frame_bytes, connection.peer).trusting_frame_sizes();
        let keyless = config.cluster_key.is_none();
        let reader = tokio::spawn(read_loop(reader, shared.clone(), keyless).instrument(span)).abort_handle();
        Ok(Arc::new(Conn { shared, out, permits: Arc::new(Semaphore::new(max_in_flight)), reader }))
    }
}

/// Why a client handshake failed: a refusal or a bad server proof
/// (`Unauthenticated`, not retried) or a broken connection (retryable).
enum HandshakeError {
    Auth(crate::auth::ClientAuthError),
    Io(std::io::Error),
}

impl HandshakeError {
    fn into_rpc(self, addr: &str) -> RpcError {
        match self {
            HandshakeError::Auth(e) => RpcError::Unauthenticated { addr: addr.to_string(), reason: e.to_string() },
            // The server closes without a word on a hello it cannot parse or
            // a proof that fails before it answers; say what it likely means.
            HandshakeError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => RpcError::Unauthenticated {
                addr: addr.to_string(),
                reason: "the server closed the connection during the handshake (it refused us, or does not authenticate)".into(),
            },
            HandshakeError::Io(e) => RpcError::connection(addr, format!("handshake: {e}")),
        }
    }
}

/// The async shell of [`ClientHandshake`]: hello, challenge, proof, verdict.
async fn client_handshake(
    conn: &mut crate::transport::Connection,
    key: Arc<ClusterKey>,
    principal: &str,
) -> std::result::Result<(), HandshakeError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut nonce = [0u8; NONCE_BYTES];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
    let (mut state, hello) = ClientHandshake::start(key, principal, nonce).map_err(HandshakeError::Auth)?;
    conn.write.write_all(&hello).await.map_err(HandshakeError::Io)?;
    conn.write.flush().await.map_err(HandshakeError::Io)?;
    let mut challenge = [0u8; crate::auth::CHALLENGE_BYTES];
    conn.read.read_exact(&mut challenge[..1]).await.map_err(HandshakeError::Io)?;
    let len = ClientHandshake::challenge_len(challenge[0]);
    conn.read.read_exact(&mut challenge[1..len]).await.map_err(HandshakeError::Io)?;
    let proof = state.on_challenge(&challenge[..len]).map_err(HandshakeError::Auth)?;
    conn.write.write_all(&proof).await.map_err(HandshakeError::Io)?;
    conn.write.flush().await.map_err(HandshakeError::Io)?;
    let mut verdict = [0u8; 1];
    conn.read.read_exact(&mut verdict).await.map_err(HandshakeError::Io)?;
    state.on_verdict(verdict[0]).map_err(HandshakeError::Auth)
}

/// Delivers responses to pending calls until the connection ends, then
/// fails whatever is still pending.
async fn read_loop(mut reader: FrameReader, shared: Arc<ConnShared>, keyless: bool) {
    let mut replies = 0u64;
    let reason = loop {
        let next = reader.next().await;
        if let Ok(Some(_)) = &next {
            shared.frames_received.fetch_add(1, Ordering::AcqRel);
            shared.silent_timeouts.store(0, Ordering::Release);
        }
        match next {
            Ok(Some(frame)) if frame.header.kind == FrameKind::Response => {
                replies += 1;
                let waiter = shared.pending.lock().remove(&frame.header.request_id);
                // No waiter: the call already timed out or was dropped.
                if let Some(tx) = waiter {
                    let _ = tx.send(Ok(frame));
                }
            }
            Ok(Some(frame)) => break format!("unexpected {:?} frame from server", frame.header.kind),
            Ok(None) => break "connection closed by peer".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    // A server that requires the cluster key closes a connection without
    // one at its first frame (`crate::auth`): say so instead of only
    // "connection closed".
    let reason = if keyless && replies == 0 {
        format!("{reason} (before any reply: if the server requires the cluster key, this client has none — pass --cluster-key-file)")
    } else {
        reason
    };
    shared.fail(&reason);
}

fn decode_reply<M: Method>(frame: Frame) -> Result<(M::Resp, Bytes)> {
    if frame.header.code == STATUS_OK {
        let resp = decode_body::<M::Resp>(&frame.body)?;
        return Ok((resp, frame.payload));
    }
    let code = ErrorCode::from_u32(frame.header.code);
    Err(RpcError::Remote(Status::new(code, String::from_utf8_lossy(&frame.body))))
}
