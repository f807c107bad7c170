//! RDMA: one-sided transfers behind the transport seam
//! ([`RemoteMemory`], [`RemoteBuf`]), as 3FS moves bulk data.
//!
//! **Not run on a device.** These machines have no RDMA device and their
//! kernel no InfiniBand support (not even soft-RoCE), so the device shell
//! (`ibverbs.rs`, cargo feature `rdma`, over `ibverbs-sys`) is compiled in
//! CI but has never executed. Everything above the device — the registered
//! buffer pool, the work-request state machine, the queue-pair handshake and
//! the [`RemoteMemory`] implementation — is tested here through the seam on
//! an in-process fabric (`loopback.rs`) that checks keys and bounds as a NIC
//! does and can lose or fail completions.
//!
//! Design (3FS's):
//!
//! | rule | how |
//! |---|---|
//! | buffers registered once | [`RdmaMemory`] registers `pool_slots × slot_bytes` as one memory region at start; [`RemoteMemory::register`] hands out a slot (no registration on the I/O path); a slot goes back when its [`RegisteredBuf`] is dropped |
//! | the successor pulls the payload | a predecessor forwards a [`RemoteBuf`] of its slot (`FLAG_PAYLOAD_REMOTE`) instead of the bytes; the successor calls [`RemoteMemory::read_remote`]: one RDMA READ into its own slot; the predecessor keeps the slot until the successor's reply |
//! | a target serves a read into client memory | [`RemoteMemory::write_remote`]: one RDMA WRITE into the client's slot |
//! | messages | the RPC frames keep travelling on the TCP connection the queue pair was negotiated on (its first 31 bytes each way are the [`QpEndpoint`]s); one reliable-connected queue pair per connection |
//! | a failed queue pair | transfers on it are refused at once (`ConnectionFailed`); its connection is ended `close_grace_ms` later, so the RPC layer reconnects and the handshake makes a new queue pair |
//! | bounds | at most `max_outstanding_per_qp` work requests per queue pair (`Overloaded` beyond), each with a deadline (`op_timeout_ms`, then `DeadlineExceeded` and the queue pair is failed), handshake within `handshake_timeout_ms` |
//!
//! Errors: a failed or flushed completion, or a queue pair in the error
//! state, is `ConnectionFailed` (retryable: the RPC layer reconnects and the
//! handshake makes a new queue pair); a refused key, address or length is
//! `InvalidArgument`-like (`Malformed`), not retried.

mod engine;
#[cfg(feature = "rdma")]
pub mod ibverbs;
pub mod loopback;
mod verbs;

pub use engine::{OpKind, SlotPool, WcStatus, WorkEngine, WrError};
pub use verbs::{Completion, QpEndpoint, Region, Verbs, WorkRequest};

use crate::error::{Result, RpcError};
use crate::transport::{Connection, Listener, RegisteredBuf, RemoteBuf, RemoteMemory, TcpTransport, Transport};
use async_trait::async_trait;
use fskv_types::{ErrorCode, Status};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::sync::oneshot;

/// Settings of the RDMA layer.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Registered buffers (one memory region for all of them).
    pub pool_slots: usize,
    /// Bytes per buffer (the largest one-sided transfer; a chunk write's payload).
    pub slot_bytes: usize,
    pub max_outstanding_per_qp: usize,
    pub op_timeout_ms: u64,
    pub handshake_timeout_ms: u64,
    /// Pause of the completion poller when it found nothing.
    pub idle_poll_us: u64,
    /// How long a connection whose queue pair failed stays open (for the
    /// answers in flight) before it is ended.
    pub close_grace_ms: u64,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            pool_slots: 256,
            slot_bytes: 4 << 20,
            max_outstanding_per_qp: 128,
            op_timeout_ms: 5_000,
            handshake_timeout_ms: 5_000,
            idle_poll_us: 50,
            close_grace_ms: 100,
        }
    }
}

fn wr_error(e: WrError) -> RpcError {
    match e {
        WrError::QpDown(m) => RpcError::ConnectionFailed { addr: "rdma".into(), reason: m },
        WrError::QueueFull { limit } => {
            RpcError::Remote(Status::new(ErrorCode::Overloaded, format!("{limit} RDMA transfers already in flight")))
        }
        WrError::Invalid(m) => RpcError::Malformed(format!("rdma: {m}")),
        WrError::TimedOut { after_ms } => RpcError::DeadlineExceeded { timeout_ms: after_ms },
    }
}

struct Pool {
    region: Box<dyn Region>,
    slot_bytes: usize,
    slots: Mutex<SlotPool>,
}

/// A slot of the registered pool, exposed to peers by its descriptor.
struct PooledBuf {
    pool: Arc<Pool>,
    slot: usize,
    len: usize,
}

impl PooledBuf {
    fn offset(&self) -> usize {
        self.slot * self.pool.slot_bytes
    }
}

impl RegisteredBuf for PooledBuf {
    fn descriptor(&self) -> RemoteBuf {
        RemoteBuf { addr: self.pool.region.addr() + self.offset() as u64, len: self.len as u32, rkey: self.pool.region.rkey() }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: the slot is owned by this buffer alone (the pool hands each
        // slot out once until it is given back in `drop`), lies inside the
        // region, and the region lives as long as the pool this holds.
        unsafe { std::slice::from_raw_parts(self.pool.region.ptr().add(self.offset()), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.pool.region.ptr().add(self.offset()), self.len) }
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        self.pool.slots.lock().give(self.slot);
    }
}

/// The failure flag of one queue pair and the waker of its connection's reader.
#[derive(Default)]
struct Doom {
    failed: std::sync::atomic::AtomicBool,
    waker: futures::task::AtomicWaker,
}

impl Doom {
    fn fail(&self) {
        self.failed.store(true, std::sync::atomic::Ordering::Release);
        self.waker.wake();
    }
}

struct MemInner<V: Verbs> {
    verbs: Arc<V>,
    pool: Arc<Pool>,
    engine: Mutex<WorkEngine>,
    waiters: Mutex<HashMap<u64, oneshot::Sender<Result<()>>>>,
    /// Peer address → its connected queue pairs (one per connection).
    peers: Mutex<BTreeMap<String, Vec<u64>>>,
    /// Per queue pair: set when it failed; its connection's reader then
    /// ends the connection (the RPC layer reconnects: a new queue pair).
    doomed: Mutex<HashMap<u64, Arc<Doom>>>,
    next_pick: std::sync::atomic::AtomicUsize,
    cfg: RdmaConfig,
    clock: Instant,
}

impl<V: Verbs> MemInner<V> {
    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn finish(&self, done: Vec<(u64, std::result::Result<(), WrError>)>) {
        let mut waiters = self.waiters.lock();
        for (wr_id, r) in done {
            if let Some(tx) = waiters.remove(&wr_id) {
                let _ = tx.send(r.map_err(wr_error));
            }
        }
    }
}

/// One-sided remote memory over a [`Verbs`] device: the registered pool,
/// the work requests in flight and the completion poller.
pub struct RdmaMemory<V: Verbs> {
    inner: Arc<MemInner<V>>,
    poller: tokio::task::JoinHandle<()>,
}

impl<V: Verbs> Drop for RdmaMemory<V> {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

impl<V: Verbs> RdmaMemory<V> {
    /// Registers the pool (once) and starts the completion poller (needs a
    /// tokio runtime).
    pub fn new(verbs: Arc<V>, cfg: RdmaConfig) -> Result<Self> {
        let bytes = cfg.pool_slots.checked_mul(cfg.slot_bytes).ok_or_else(|| RpcError::Malformed("rdma pool size overflows".into()))?;
        let region =
            verbs.register(bytes).map_err(|e| RpcError::Unsupported(format!("registering {bytes} bytes on {}: {e}", verbs.name())))?;
        let pool = Arc::new(Pool { region, slot_bytes: cfg.slot_bytes, slots: Mutex::new(SlotPool::new(cfg.pool_slots, cfg.slot_bytes)) });
        let inner = Arc::new(MemInner {
            verbs,
            pool,
            engine: Mutex::new(WorkEngine::new(cfg.max_outstanding_per_qp, cfg.op_timeout_ms)),
            waiters: Mutex::new(HashMap::new()),
            peers: Mutex::new(BTreeMap::new()),
            doomed: Mutex::new(HashMap::new()),
            next_pick: std::sync::atomic::AtomicUsize::new(0),
            cfg,
            clock: Instant::now(),
        });
        let weak = Arc::downgrade(&inner);
        let poller = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(64);
            loop {
                let Some(inner) = weak.upgrade() else { return };
                batch.clear();
                if let Err(e) = inner.verbs.poll(&mut batch, 64) {
                    tracing::error!(device = %inner.verbs.name(), error = %e, "polling the completion queue failed");
                }
                let mut done = Vec::new();
                let failed;
                {
                    let mut engine = inner.engine.lock();
                    for c in &batch {
                        done.extend(engine.complete(c.wr_id, c.status, c.byte_len));
                    }
                    done.extend(engine.expire(inner.now_ms()));
                    failed = engine.take_failed();
                }
                inner.finish(done);
                for qp in failed {
                    // Transfers on it are refused from now on; the connection
                    // ends after a grace that lets answers already being
                    // written (e.g. the error of the failed transfer) get out.
                    if let Some(d) = inner.doomed.lock().get(&qp).cloned() {
                        let grace = Duration::from_millis(inner.cfg.close_grace_ms);
                        tokio::spawn(async move {
                            tokio::time::sleep(grace).await;
                            d.fail();
                        });
                    }
                }
                let idle = Duration::from_micros(inner.cfg.idle_poll_us.max(1));
                let found = !batch.is_empty();
                drop(inner);
                if !found {
                    tokio::time::sleep(idle).await;
                }
            }
        });
        Ok(RdmaMemory { inner, poller })
    }

    /// Free slots of the registered pool.
    pub fn free_slots(&self) -> usize {
        self.inner.pool.slots.lock().free()
    }

    /// Completions that matched no request (they came after a timeout).
    pub fn stray_completions(&self) -> u64 {
        self.inner.engine.lock().stray_completions
    }

    /// Creates a queue pair for a new connection; its endpoint for the peer.
    fn prepare_qp(&self) -> std::io::Result<(u64, QpEndpoint)> {
        self.inner.verbs.create_qp()
    }

    /// Connects `qp` to `remote` and makes it usable for transfers with `peer`.
    fn activate_qp(&self, peer: &str, qp: u64, remote: &QpEndpoint) -> std::io::Result<Arc<Doom>> {
        self.inner.verbs.connect_qp(qp, remote)?;
        let doom = Arc::new(Doom::default());
        self.inner.doomed.lock().insert(qp, doom.clone());
        self.inner.engine.lock().qp_ready(qp);
        self.inner.peers.lock().entry(peer.to_string()).or_default().push(qp);
        Ok(doom)
    }

    fn close_qp(inner: &MemInner<V>, peer: &str, qp: u64) {
        {
            let mut peers = inner.peers.lock();
            if let Some(list) = peers.get_mut(peer) {
                list.retain(|q| *q != qp);
                if list.is_empty() {
                    peers.remove(peer);
                }
            }
        }
        inner.doomed.lock().remove(&qp);
        let done = inner.engine.lock().qp_closed(qp);
        inner.finish(done);
        inner.verbs.destroy_qp(qp);
    }

    fn pick_qp(&self, peer: &str) -> Result<u64> {
        let peers = self.inner.peers.lock();
        let list = peers.get(peer).filter(|l| !l.is_empty()).ok_or_else(|| RpcError::ConnectionFailed {
            addr: peer.to_string(),
            reason: "no RDMA queue pair to this peer (connect first)".into(),
        })?;
        let i = self.inner.next_pick.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(list[i % list.len()])
    }

    /// The local registration behind `buf` (it must come from this pool).
    fn local_of(&self, buf: &RemoteBuf) -> Result<(u64, u32)> {
        let r = &self.inner.pool.region;
        let end = buf.addr.checked_add(u64::from(buf.len));
        if buf.rkey != r.rkey() || buf.addr < r.addr() || end.map_or(true, |e| e > r.addr() + r.len() as u64) {
            return Err(RpcError::Malformed("rdma: the local buffer was not registered by this transport".into()));
        }
        Ok((buf.addr, r.lkey()))
    }

    async fn transfer(&self, peer: &str, op: OpKind, local: RemoteBuf, remote: RemoteBuf) -> Result<()> {
        let qp = self.pick_qp(peer)?;
        let (local_addr, lkey) = self.local_of(&local)?;
        let now = self.inner.now_ms();
        let wr_id = self.inner.engine.lock().admit(qp, op, remote.len, local.len as usize, remote.len, now).map_err(wr_error)?;
        let (tx, rx) = oneshot::channel();
        self.inner.waiters.lock().insert(wr_id, tx);
        let wr = WorkRequest { wr_id, op, local_addr, local_lkey: lkey, len: remote.len, remote };
        if let Err(e) = self.inner.verbs.post(qp, &wr) {
            self.inner.waiters.lock().remove(&wr_id);
            self.inner.engine.lock().cancel(wr_id);
            return Err(RpcError::ConnectionFailed { addr: peer.to_string(), reason: format!("posting an RDMA work request: {e}") });
        }
        // The poller ends every admitted request by its deadline; this bound
        // only guards against a poller that died.
        let guard = Duration::from_millis(self.inner.cfg.op_timeout_ms.saturating_mul(2).max(1));
        match tokio::time::timeout(guard, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) | Err(_) => {
                self.inner.waiters.lock().remove(&wr_id);
                Err(RpcError::DeadlineExceeded { timeout_ms: guard.as_millis() as u64 })
            }
        }
    }
}

#[async_trait]
impl<V: Verbs> RemoteMemory for RdmaMemory<V> {
    fn register(&self, len_bytes: usize) -> Result<Box<dyn RegisteredBuf>> {
        let slot = self.inner.pool.slots.lock().take(len_bytes).map_err(wr_error)?;
        Ok(Box::new(PooledBuf { pool: self.inner.pool.clone(), slot, len: len_bytes }))
    }

    async fn read_remote(&self, peer: &str, src: RemoteBuf, dst: &mut dyn RegisteredBuf) -> Result<()> {
        let local = dst.descriptor();
        if src.len > local.len {
            return Err(RpcError::Malformed(format!("rdma: {} remote bytes do not fit a local buffer of {}", src.len, local.len)));
        }
        self.transfer(peer, OpKind::Read, RemoteBuf { len: src.len, ..local }, src).await
    }

    async fn write_remote(&self, peer: &str, src: &dyn RegisteredBuf, dst: RemoteBuf) -> Result<()> {
        let local = src.descriptor();
        if local.len != dst.len {
            return Err(RpcError::Malformed(format!("rdma: {} local bytes written into a remote buffer of {}", local.len, dst.len)));
        }
        self.transfer(peer, OpKind::Write, local, dst).await
    }
}

/// A transport whose connections carry RPC frames over TCP and have an RDMA
/// queue pair each for one-sided bulk transfers ([`Transport::remote_memory`]).
pub struct RdmaTransport<V: Verbs> {
    tcp: TcpTransport,
    memory: Arc<RdmaMemory<V>>,
}

impl<V: Verbs> RdmaTransport<V> {
    pub fn new(verbs: Arc<V>, cfg: RdmaConfig) -> Result<Self> {
        Ok(RdmaTransport { tcp: TcpTransport::new(), memory: Arc::new(RdmaMemory::new(verbs, cfg)?) })
    }

    pub fn memory(&self) -> &Arc<RdmaMemory<V>> {
        &self.memory
    }
}

/// Exchanges queue-pair endpoints on a fresh connection (the connecting side
/// speaks first) and activates the queue pair for `peer`.
async fn handshake<V: Verbs>(memory: &Arc<RdmaMemory<V>>, conn: &mut Connection, dialer: bool) -> std::io::Result<(u64, Arc<Doom>)> {
    let (qp, mine) = memory.prepare_qp()?;
    let exchange = async {
        let mut theirs = [0u8; QpEndpoint::ENCODED_BYTES];
        let decode = |raw: &[u8]| QpEndpoint::decode(raw).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        if dialer {
            conn.write.write_all(&mine.encode()).await?;
            conn.write.flush().await?;
            conn.read.read_exact(&mut theirs).await?;
            decode(&theirs)
        } else {
            // The acceptor answers only a well-formed handshake.
            conn.read.read_exact(&mut theirs).await?;
            let remote = decode(&theirs)?;
            conn.write.write_all(&mine.encode()).await?;
            conn.write.flush().await?;
            Ok(remote)
        }
    };
    let limit = Duration::from_millis(memory.inner.cfg.handshake_timeout_ms.max(1));
    let result = match tokio::time::timeout(limit, exchange).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("RDMA handshake with {} took over {limit:?}", conn.peer))),
    };
    let remote = match result {
        Ok(r) => r,
        Err(e) => {
            memory.inner.verbs.destroy_qp(qp);
            return Err(e);
        }
    };
    match memory.activate_qp(&conn.peer, qp, &remote) {
        Ok(doom) => Ok((qp, doom)),
        Err(e) => {
            memory.inner.verbs.destroy_qp(qp);
            Err(e)
        }
    }
}

/// The read half of an RDMA connection: ends the connection when its queue
/// pair failed (so the RPC layer reconnects with a new one), and closes the
/// queue pair when the RPC layer drops the connection.
struct QpReader<V: Verbs> {
    inner: crate::transport::BoxRead,
    memory: std::sync::Weak<MemInner<V>>,
    peer: String,
    qp: u64,
    doom: Arc<Doom>,
}

impl<V: Verbs> AsyncRead for QpReader<V> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        self.doom.waker.register(cx.waker());
        if self.doom.failed.load(std::sync::atomic::Ordering::Acquire) {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                format!("RDMA queue pair {} to {} failed", self.qp, self.peer),
            )));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<V: Verbs> Drop for QpReader<V> {
    fn drop(&mut self) {
        if let Some(inner) = self.memory.upgrade() {
            RdmaMemory::close_qp(&inner, &self.peer, self.qp);
        }
    }
}

fn wrap<V: Verbs>(memory: &Arc<RdmaMemory<V>>, conn: Connection, (qp, doom): (u64, Arc<Doom>)) -> Connection {
    let reader = QpReader { inner: conn.read, memory: Arc::downgrade(&memory.inner), peer: conn.peer.clone(), qp, doom };
    Connection { read: Box::new(reader), write: conn.write, peer: conn.peer }
}

struct RdmaListener<V: Verbs> {
    inner: Box<dyn Listener>,
    memory: Arc<RdmaMemory<V>>,
}

#[async_trait]
impl<V: Verbs> Listener for RdmaListener<V> {
    async fn accept(&mut self) -> std::io::Result<Connection> {
        loop {
            let mut conn = self.inner.accept().await?;
            match handshake(&self.memory, &mut conn, false).await {
                Ok(qp) => return Ok(wrap(&self.memory, conn, qp)),
                // One bad client must not stop the accept loop.
                Err(e) => tracing::warn!(peer = %conn.peer, error = %e, "RDMA handshake failed; connection dropped"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<String> {
        self.inner.local_addr()
    }
}

#[async_trait]
impl<V: Verbs> Transport for RdmaTransport<V> {
    fn name(&self) -> &'static str {
        "rdma"
    }

    async fn connect(&self, addr: &str) -> std::io::Result<Connection> {
        let mut conn = self.tcp.connect(addr).await?;
        let qp = handshake(&self.memory, &mut conn, true).await?;
        Ok(wrap(&self.memory, conn, qp))
    }

    async fn bind(&self, addr: &str) -> std::io::Result<Box<dyn Listener>> {
        let inner = self.tcp.bind(addr).await?;
        Ok(Box::new(RdmaListener { inner, memory: self.memory.clone() }))
    }

    fn remote_memory(&self) -> Option<&dyn RemoteMemory> {
        Some(&*self.memory)
    }
}
