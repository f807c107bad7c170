//! The calling side of the storage service: RPC method definitions
//! (ids 2000–2999), the routing handle, and [`StorageClient`].
//!
//! # Retries
//! * Writes go to the head of the chain (first serving target). A write
//!   carries `(client id, request id)`; a retry reuses both, so the service
//!   applies it once.
//! * `StaleChainVersion` / `TargetNotServing`: refresh routing through the
//!   [`RoutingHandle`], then retry.
//! * `ChunkUncommitted` on a read: short backoff and retry on the next
//!   serving target (or ask for a relaxed read up front). On a write: the
//!   chunk holds another request's pending version whose fate the chain
//!   cannot tell yet (`fskv_storage::craq`); backoff and retry.
//! * Transport errors: backoff and retry. Every loop is bounded by
//!   `max_retries`.
//!
//! # Read flow control (request-to-send, simplified)
//! The client owns a semaphore of `max_concurrent_senders`. A target may
//! only send read data to this client while the client holds a permit for
//! it: a batch read to one target is issued (the "grant") only after a permit
//! is taken and the permit is held until the reply has arrived. So at most
//! `max_concurrent_senders` targets stream data to one client at once, however
//! many reads are queued. Limit: over TCP the grant and the request are one
//! message (the storage side never announces first), so the client cannot
//! prioritise among targets that are ready; with RDMA the service would
//! post an announce and the client would answer with a grant.

use bytes::Bytes;
use fskv_proto::routing::{ChainInfo, ChainRoles, RoutingInfo};
use fskv_proto::storage::*;
use fskv_rpc::watch;
use fskv_rpc::{CallOptions, Method, RpcClient, RpcError};
use fskv_types::{ChainId, ChunkId, ErrorCode, InodeId, Status, TargetId};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

// ----- routing handle -----

/// Something that can produce newer routing info on request (mgmtd's
/// client, later). Fixed tables have no source.
pub trait RoutingSource: Send + Sync + 'static {
    /// Asks for routing newer than `known_version`; resolves once the source
    /// has published what it has (it may be unchanged).
    fn request_refresh(&self, known_version: u64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// A cached view of the latest routing info plus a way to ask for newer.
#[derive(Clone)]
pub struct RoutingHandle {
    rx: watch::Receiver<Arc<RoutingInfo>>,
    source: Option<Arc<dyn RoutingSource>>,
}

/// The writing side of a [`RoutingHandle`] (tests and the mgmtd client).
pub struct RoutingPublisher {
    tx: watch::Sender<Arc<RoutingInfo>>,
}

impl RoutingPublisher {
    /// A publisher and handle starting from `info` (the pre-mgmtd/test path).
    pub fn new(info: RoutingInfo) -> (RoutingPublisher, RoutingHandle) {
        let (tx, rx) = watch::channel(Arc::new(info));
        (RoutingPublisher { tx }, RoutingHandle { rx, source: None })
    }

    pub fn handle(&self) -> RoutingHandle {
        RoutingHandle { rx: self.tx.subscribe(), source: None }
    }

    pub fn current(&self) -> Arc<RoutingInfo> {
        self.tx.borrow().clone()
    }

    /// Publishes `info` if its version is newer than the current one
    /// (routing from mgmtd keeps its own versions); returns whether it did.
    pub fn publish(&self, info: RoutingInfo) -> bool {
        if info.version <= self.current().version {
            return false;
        }
        self.tx.send_replace(Arc::new(info));
        true
    }

    /// A handle whose refreshes go to `source`.
    pub fn handle_with_source(&self, source: Arc<dyn RoutingSource>) -> RoutingHandle {
        RoutingHandle { rx: self.tx.subscribe(), source: Some(source) }
    }

    /// Applies `change` to a copy of the current info and publishes it with
    /// the routing version bumped by one.
    pub fn update(&self, change: impl FnOnce(&mut RoutingInfo)) -> Arc<RoutingInfo> {
        let mut next = (*self.current()).clone();
        change(&mut next);
        next.version = self.current().version + 1;
        let next = Arc::new(next);
        self.tx.send_replace(next.clone());
        next
    }
}

impl RoutingHandle {
    pub fn new(rx: watch::Receiver<Arc<RoutingInfo>>, source: Option<Arc<dyn RoutingSource>>) -> Self {
        RoutingHandle { rx, source }
    }

    pub fn current(&self) -> Arc<RoutingInfo> {
        self.rx.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<RoutingInfo>> {
        self.rx.clone()
    }

    /// Asks the source (if any) for routing newer than `known_version` and
    /// waits up to `wait` for it to arrive; returns the latest info either way.
    pub async fn refresh(&self, known_version: u64, wait: Duration) -> Arc<RoutingInfo> {
        if let Some(source) = &self.source {
            source.request_refresh(known_version).await;
        }
        let mut rx = self.rx.clone();
        let _ = tokio::time::timeout(wait, rx.wait_for(|r| r.version > known_version)).await;
        self.current()
    }
}

// ----- chunk capabilities -----

/// Where the storage client of a `user:` principal gets chunk capabilities
/// (docs/security.md): [`crate::caps::MetaCapSource`] asks meta and caches
/// them. A client without a source (trusted principals) sends none.
pub trait CapSource: Send + Sync + 'static {
    /// A capability covering `inode` (read-write when `write`), valid for a
    /// while yet.
    fn cap(&self, inode: InodeId, write: bool) -> Pin<Box<dyn Future<Output = Result<ChunkCap>> + Send + '_>>;
}

// ----- errors -----

/// Everything a storage client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StorageClientError {
    #[error("storage error {0}")]
    Remote(Status),
    #[error("rpc error: {0}")]
    Rpc(RpcError),
    #[error("no route: {0}")]
    NoRoute(String),
    #[error("checksum mismatch on {chunk}: expected {expected:#010x}, got {actual:#010x}")]
    Checksum { chunk: ChunkId, expected: u32, actual: u32 },
    #[error("gave up after {attempts} attempts; last error: {last}")]
    RetriesExhausted { attempts: u32, last: Box<StorageClientError> },
    #[error("gave up after {attempts} attempts in {budget_ms} ms (the retry budget); last error: {last}")]
    BudgetExhausted { attempts: u32, budget_ms: u64, last: Box<StorageClientError> },
}

impl StorageClientError {
    pub fn code(&self) -> ErrorCode {
        match self {
            StorageClientError::Remote(s) => s.code,
            StorageClientError::Rpc(e) => e.code(),
            StorageClientError::NoRoute(_) => ErrorCode::TargetNotServing,
            StorageClientError::Checksum { .. } => ErrorCode::ChecksumMismatch,
            StorageClientError::RetriesExhausted { last, .. } | StorageClientError::BudgetExhausted { last, .. } => last.code(),
        }
    }
}

impl From<RpcError> for StorageClientError {
    fn from(e: RpcError) -> Self {
        match e {
            RpcError::Remote(s) => StorageClientError::Remote(s),
            other => StorageClientError::Rpc(other),
        }
    }
}

pub type Result<T, E = StorageClientError> = std::result::Result<T, E>;

// ----- client -----

/// Client limits; times and counts carry their units.
#[derive(Clone, Debug)]
pub struct StorageClientConfig {
    /// Identifies this client in request tags; must be unique per live client.
    pub client_id: u64,
    /// Targets allowed to send read data to this client at once (incast limit).
    pub max_concurrent_senders: usize,
    /// Attempts per operation (first try included).
    pub max_attempts: u32,
    /// Backoff between attempts (doubles, capped at 16x).
    pub retry_backoff_ms: u64,
    /// Time one operation may spend retrying, first attempt included
    /// (0 = bounded by `max_attempts` only). An attempt still running when
    /// it ends is cut off, so a hung target stalls a call at most this long.
    pub retry_budget_ms: u64,
    pub call_timeout_ms: u64,
    /// How long to wait for newer routing after a stale-version error.
    pub routing_wait_ms: u64,
    /// Every read of a file's chunks on one chain goes to the same serving
    /// replica (`StorageClient::replica_for`); off: every read picks the
    /// next replica round-robin (each replica of a chain is exercised, as
    /// the fault tests want). `FsClient` turns it on.
    pub read_affinity: bool,
    /// The `seq` of this client's first write on a write channel
    /// (`WriteChannel`; later ones count up). The default, the wall clock in
    /// nanoseconds, keeps a restarted client that reuses its id above what
    /// the targets remember of its previous run; a simulation fixes it.
    pub first_write_seq: u64,
}

impl Default for StorageClientConfig {
    fn default() -> Self {
        StorageClientConfig {
            client_id: rand::random::<u64>() | 1,
            max_concurrent_senders: 8,
            max_attempts: 12,
            retry_backoff_ms: 5,
            retry_budget_ms: 0,
            call_timeout_ms: 30_000,
            routing_wait_ms: 500,
            read_affinity: false,
            first_write_seq: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX >> 1)),
        }
    }
}

/// Result of one read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadData {
    pub data: Bytes,
    pub version: u64,
    pub chunk_len_bytes: u32,
    /// The data is from a pending version (relaxed read only).
    pub uncommitted: bool,
}

/// One read of [`StorageClient::batch_read`].
#[derive(Clone, Copy, Debug)]
pub struct ReadSpec {
    pub chain: ChainId,
    pub chunk: ChunkId,
    pub offset_bytes: u64,
    pub len_bytes: u32,
    pub relaxed: bool,
}

/// Storage client: chain-aware writes and reads with bounded retries.
#[derive(Clone)]
pub struct StorageClient {
    inner: Arc<Inner>,
}

struct Inner {
    rpc: RpcClient,
    routing: RoutingHandle,
    config: StorageClientConfig,
    next_request: AtomicU64,
    /// Seeds the choice of replica per run of chunks (`replica_for`).
    spread_seed: u64,
    /// Round-robin position (without `read_affinity`).
    spread: AtomicUsize,
    senders: Arc<Semaphore>,
    /// Set for a `user:` principal: every data-path request carries a capability.
    caps: std::sync::OnceLock<Arc<dyn CapSource>>,
    channels: Arc<WriteChannels>,
}

/// This client's write channels (`fskv_proto::storage::WriteChannel`): a
/// write holds one from its first attempt to its last, so a late retry is
/// recognised by the targets however many versions came after it. At most
/// `MAX_WRITE_CHANNELS` writes are in flight at once; more wait.
struct WriteChannels {
    slots: Arc<Semaphore>,
    /// Free channel ids and the next `seq` (one lock: a channel's writes
    /// get increasing seqs in the order they take it).
    state: parking_lot::Mutex<(Vec<u32>, u64)>,
}

/// A write channel held by one write (all its attempts); freed on drop.
struct HeldChannel {
    channel: WriteChannel,
    owner: Arc<WriteChannels>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for HeldChannel {
    fn drop(&mut self) {
        self.owner.state.lock().0.push(self.channel.id);
    }
}

impl WriteChannels {
    fn new(first_seq: u64) -> WriteChannels {
        // Popped from the end: the lowest ids are used first.
        let free = (0..MAX_WRITE_CHANNELS).rev().collect();
        WriteChannels { slots: Arc::new(Semaphore::new(MAX_WRITE_CHANNELS as usize)), state: parking_lot::Mutex::new((free, first_seq)) }
    }

    async fn hold(self: &Arc<Self>) -> Result<HeldChannel> {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| StorageClientError::Remote(Status::new(ErrorCode::Internal, "write channels closed")))?;
        let mut state = self.state.lock();
        let (free, next_seq) = &mut *state;
        // A permit is held, so a channel is free.
        let Some(id) = free.pop() else {
            return Err(StorageClientError::Remote(Status::new(ErrorCode::Internal, "no free write channel under a permit")));
        };
        let seq = *next_seq;
        *next_seq += 1;
        Ok(HeldChannel { channel: WriteChannel { id, seq }, owner: Arc::clone(self), _slot: slot })
    }
}

/// SplitMix64's finalizer: spreads consecutive values.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where one attempt goes.
struct Route {
    chain_ver: u32,
    target: TargetId,
    addr: String,
    routing_version: u64,
}

impl StorageClient {
    pub fn new(rpc: RpcClient, routing: RoutingHandle, config: StorageClientConfig) -> Self {
        assert!(config.max_concurrent_senders > 0 && config.max_attempts > 0);
        let senders = Arc::new(Semaphore::new(config.max_concurrent_senders));
        // From the client id (random by default), not a fresh random number:
        // a simulation fixing the id replays the same choices.
        let spread_seed = config.client_id;
        let spread = AtomicUsize::new(config.client_id as u16 as usize);
        let channels = Arc::new(WriteChannels::new(config.first_write_seq));
        StorageClient {
            inner: Arc::new(Inner {
                rpc,
                routing,
                config,
                next_request: AtomicU64::new(1),
                spread_seed,
                spread,
                senders,
                caps: std::sync::OnceLock::new(),
                channels,
            }),
        }
    }

    pub fn routing(&self) -> &RoutingHandle {
        &self.inner.routing
    }

    /// Makes every data-path request carry a capability from `source` (a
    /// `user:` principal's client); only the first call counts.
    pub fn set_cap_source(&self, source: Arc<dyn CapSource>) -> bool {
        self.inner.caps.set(source).is_ok()
    }

    /// The capability for `inode`, if this client sends capabilities.
    async fn cap_for(&self, inode: InodeId, write: bool) -> Result<Option<ChunkCap>> {
        match self.inner.caps.get() {
            None => Ok(None),
            Some(source) => source.cap(inode, write).await.map(Some),
        }
    }

    /// Capabilities for the inodes of `ios` (none for a trusted client).
    async fn caps_for_reads(&self, ios: &[ReadIo]) -> Result<Vec<ChunkCap>> {
        let Some(source) = self.inner.caps.get() else { return Ok(Vec::new()) };
        let mut inodes: Vec<InodeId> = ios.iter().map(|io| io.chunk.inode).collect();
        inodes.sort_unstable();
        inodes.dedup();
        let mut caps = Vec::with_capacity(inodes.len());
        for inode in inodes {
            caps.push(source.cap(inode, false).await?);
        }
        Ok(caps)
    }

    pub fn config(&self) -> &StorageClientConfig {
        &self.inner.config
    }

    /// A fresh tag for a new request; pass it to the `*_tagged` calls to
    /// retry a request yourself with the same identity.
    pub fn new_tag(&self) -> RequestTag {
        RequestTag { client: self.inner.config.client_id, request: self.inner.next_request.fetch_add(1, Ordering::Relaxed) }
    }

    /// Writes `data` at `offset_bytes` of `chunk`; returns once every target
    /// of the chain committed.
    pub async fn write(&self, chain: ChainId, chunk: ChunkId, offset_bytes: u64, data: Bytes) -> Result<WriteResp> {
        self.write_tagged(chain, chunk, offset_bytes, data, self.new_tag()).await
    }

    pub async fn write_tagged(&self, chain: ChainId, chunk: ChunkId, offset_bytes: u64, data: Bytes, tag: RequestTag) -> Result<WriteResp> {
        let len_bytes = u32::try_from(data.len())
            .map_err(|_| StorageClientError::Remote(Status::new(ErrorCode::InvalidArgument, "write larger than 4 GiB")))?;
        let op = UpdateOp::Write { offset_bytes, len_bytes, crc: crc32c::crc32c(&data) };
        self.update(chain, chunk, op, data, tag, None).await
    }

    /// [`StorageClient::write`] with the file layout's chunk size as the
    /// block-sizing hint, so later appends up to the chunk size stay in place.
    pub async fn write_hinted(
        &self,
        chain: ChainId,
        chunk: ChunkId,
        offset_bytes: u64,
        data: Bytes,
        chunk_size_hint_bytes: Option<u64>,
    ) -> Result<WriteResp> {
        let len_bytes = u32::try_from(data.len())
            .map_err(|_| StorageClientError::Remote(Status::new(ErrorCode::InvalidArgument, "write larger than 4 GiB")))?;
        let op = UpdateOp::Write { offset_bytes, len_bytes, crc: crc32c::crc32c(&data) };
        self.update(chain, chunk, op, data, self.new_tag(), chunk_size_hint_bytes).await
    }

    pub async fn truncate(&self, chain: ChainId, chunk: ChunkId, len_bytes: u64) -> Result<WriteResp> {
        self.update(chain, chunk, UpdateOp::Truncate { len_bytes }, Bytes::new(), self.new_tag(), None).await
    }

    pub async fn remove(&self, chain: ChainId, chunk: ChunkId) -> Result<WriteResp> {
        self.update(chain, chunk, UpdateOp::Remove, Bytes::new(), self.new_tag(), None).await
    }

    async fn update(
        &self,
        chain: ChainId,
        chunk: ChunkId,
        op: UpdateOp,
        data: Bytes,
        tag: RequestTag,
        chunk_size_hint_bytes: Option<u64>,
    ) -> Result<WriteResp> {
        let span = tracing::debug_span!("storage_write", %chain, %chunk, request = tag.request);
        let cap = self.cap_for(chunk.inode, true).await?;
        let held = self.inner.channels.hold().await?;
        let channel = Some(held.channel);
        let build = |route: &Route| WriteReq {
            chain_id: chain,
            chain_ver: route.chain_ver,
            target: route.target,
            chunk,
            op,
            tag,
            chunk_size_hint_bytes,
            cap,
            channel,
        };
        tracing::Instrument::instrument(self.call_head::<WriteChunk>(chain, data, build), span).await
    }

    /// Copies `src` to `offset_bytes` of `chunk` on `chain` inside the
    /// cluster: the head of `chain` reads the source range from a serving
    /// replica of `src.chain_id` and writes it down its chain; the data
    /// never passes through this client. Returns once every target of the
    /// destination chain committed. Retried like a write (same tag, routing
    /// refresh on a stale chain version).
    pub async fn copy_range(
        &self,
        chain: ChainId,
        chunk: ChunkId,
        offset_bytes: u64,
        src: CopySource,
        chunk_size_hint_bytes: Option<u64>,
    ) -> Result<CopyRangeResp> {
        self.copy_range_tagged(chain, chunk, offset_bytes, src, chunk_size_hint_bytes, self.new_tag()).await
    }

    /// [`StorageClient::copy_range`] with a caller-chosen tag (a retry with
    /// the same tag is applied once).
    pub async fn copy_range_tagged(
        &self,
        chain: ChainId,
        chunk: ChunkId,
        offset_bytes: u64,
        src: CopySource,
        chunk_size_hint_bytes: Option<u64>,
        tag: RequestTag,
    ) -> Result<CopyRangeResp> {
        let span =
            tracing::debug_span!("storage_copy", %chain, %chunk, src_chain = %src.chain_id, src_chunk = %src.chunk, request = tag.request);
        let build = |route: &Route| CopyRangeReq {
            chain_id: chain,
            chain_ver: route.chain_ver,
            target: route.target,
            chunk,
            offset_bytes,
            src,
            tag,
            chunk_size_hint_bytes,
        };
        tracing::Instrument::instrument(self.call_head::<CopyRange>(chain, Bytes::new(), build), span).await
    }

    /// Sends `M` (built by `build` for the current head of `chain`, with
    /// `payload`) to that head, retried by [`Self::with_retries`]: a stale
    /// chain version refreshes the routing and rebuilds the request.
    async fn call_head<M: Method>(&self, chain: ChainId, payload: Bytes, build: impl Fn(&Route) -> M::Req) -> Result<M::Resp> {
        let build = &build;
        self.with_retries(|attempt| {
            let payload = payload.clone();
            async move {
                let route = self.head_route(chain)?;
                let req = build(&route);
                tracing::trace!(attempt, target = %route.target, method = M::NAME, "attempt at the head");
                let r = self.inner.rpc.call::<M>(&route.addr, &req, payload, self.call_opts()).await;
                r.map(|(resp, _)| resp).map_err(|e| (StorageClientError::from(e), route.routing_version))
            }
        })
        .await
    }

    /// Reads `len_bytes` at `offset_bytes` (short at the chunk end) from a
    /// serving target of `chain` ([`Self::replica_for`]; the next one on
    /// each retry).
    pub async fn read(&self, chain: ChainId, chunk: ChunkId, offset_bytes: u64, len_bytes: u32, relaxed: bool) -> Result<ReadData> {
        let spec = ReadSpec { chain, chunk, offset_bytes, len_bytes, relaxed };
        self.with_retries(|n| async move {
            let route = self.read_route(chain, chunk, n)?;
            let io = ReadIo {
                chain_id: chain,
                chain_ver: route.chain_ver,
                target: route.target,
                chunk,
                offset_bytes: spec.offset_bytes,
                len_bytes: spec.len_bytes,
                relaxed: spec.relaxed,
            };
            let mut out = self.send_batch(&route.addr, vec![io]).await.map_err(|e| (e, route.routing_version))?;
            match out.pop() {
                Some(r) => r.map_err(|e| (e, route.routing_version)),
                None => Err((StorageClientError::Remote(Status::new(ErrorCode::Internal, "empty batch reply")), 0)),
            }
        })
        .await
    }

    /// Reads many ranges: one RPC per target (each under a sender grant),
    /// then per-read retries for those that failed.
    pub async fn batch_read(&self, specs: &[ReadSpec]) -> Vec<Result<ReadData>> {
        let routing = self.inner.routing.current();
        // Ordered: the RPCs go out in the same order in every run.
        let mut groups: BTreeMap<String, Vec<(usize, ReadIo)>> = BTreeMap::new();
        let mut results: Vec<Option<Result<ReadData>>> = specs.iter().map(|_| None).collect();
        for (i, spec) in specs.iter().enumerate() {
            // A read without a route now is left None and retried below.
            if let Ok(route) = self.pick_readable(&routing, spec.chain, spec.chunk, 0) {
                groups.entry(route.addr).or_default().push((
                    i,
                    ReadIo {
                        chain_id: spec.chain,
                        chain_ver: route.chain_ver,
                        target: route.target,
                        chunk: spec.chunk,
                        offset_bytes: spec.offset_bytes,
                        len_bytes: spec.len_bytes,
                        relaxed: spec.relaxed,
                    },
                ));
            }
        }
        let calls = groups.into_iter().map(|(addr, ios)| async move {
            let (idx, ios): (Vec<usize>, Vec<ReadIo>) = ios.into_iter().unzip();
            (idx, self.send_batch(&addr, ios).await)
        });
        for (idx, res) in futures::future::join_all(calls).await {
            if let Ok(list) = res {
                for (i, r) in idx.into_iter().zip(list) {
                    // NotFound (no such chunk: a hole) is the answer, not a failure to retry.
                    if r.as_ref().map_or_else(|e| e.code() == ErrorCode::NotFound, |_| true) {
                        results[i] = Some(r);
                    }
                }
            }
        }
        // The rest are retried one by one, concurrently.
        let retries = results.iter().enumerate().filter(|(_, r)| r.is_none()).map(|(i, _)| {
            let s = specs[i];
            async move { (i, self.read(s.chain, s.chunk, s.offset_bytes, s.len_bytes, s.relaxed).await) }
        });
        for (i, r) in futures::future::join_all(retries.collect::<Vec<_>>()).await {
            results[i] = Some(r);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(StorageClientError::Remote(Status::new(ErrorCode::Internal, "batch read lost a result")))))
            .collect()
    }

    /// Metadata of the highest-index chunk of `inode` on `chain` (asks the head).
    pub async fn query_last_chunk(&self, chain: ChainId, inode: InodeId) -> Result<Option<(ChunkId, RemoteChunkMeta)>> {
        let cap = self.cap_for(inode, false).await?;
        self.with_retries(|_| async move {
            let route = self.head_route(chain)?;
            let req = QueryLastChunkReq { chain_id: chain, chain_ver: route.chain_ver, target: route.target, inode, cap };
            let r = self.inner.rpc.call::<QueryLastChunk>(&route.addr, &req, Bytes::new(), self.call_opts()).await;
            r.map(|(resp, _)| resp.last).map_err(|e| (e.into(), route.routing_version))
        })
        .await
    }

    /// Removes every chunk of `inode` with index `>= from_index` on `chain`;
    /// returns the number removed.
    pub async fn remove_chunks(&self, chain: ChainId, inode: InodeId, from_index: u64) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let tag = self.new_tag();
            let resp = self
                .with_retries(|_| async move {
                    let route = self.head_route(chain)?;
                    let req = RemoveChunksReq {
                        chain_id: chain,
                        chain_ver: route.chain_ver,
                        target: route.target,
                        inode,
                        from_index,
                        max_chunks: 256,
                        tag,
                    };
                    let r = self.inner.rpc.call::<RemoveChunks>(&route.addr, &req, Bytes::new(), self.call_opts()).await;
                    r.map(|(resp, _)| resp).map_err(|e| (e.into(), route.routing_version))
                })
                .await?;
            total += u64::from(resp.removed);
            if !resp.more {
                return Ok(total);
            }
        }
    }

    /// Space of every target of the storage node at `addr`.
    pub async fn space_info(&self, addr: &str) -> Result<SpaceInfoResp> {
        let (resp, _) = self.inner.rpc.call::<SpaceInfo>(addr, &SpaceInfoReq {}, Bytes::new(), self.call_opts()).await?;
        Ok(resp)
    }

    // ----- internals -----

    fn call_opts(&self) -> CallOptions {
        CallOptions { timeout_ms: self.inner.config.call_timeout_ms }
    }

    /// Runs `attempt` until it succeeds, fails with a non-retryable error,
    /// `max_attempts` is reached or the retry budget is spent. The attempt
    /// returns the routing version it used, so a stale-version error waits
    /// for newer routing.
    async fn with_retries<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = std::result::Result<T, (StorageClientError, u64)>>,
    {
        let cfg = &self.inner.config;
        let deadline = (cfg.retry_budget_ms > 0).then(|| tokio::time::Instant::now() + Duration::from_millis(cfg.retry_budget_ms));
        let mut last = None;
        let mut made = 0u32;
        for n in 0..cfg.max_attempts {
            let outcome = match deadline {
                None => attempt(n).await,
                Some(d) if tokio::time::Instant::now() >= d => break,
                Some(d) => match tokio::time::timeout_at(d, attempt(n)).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err((StorageClientError::Rpc(RpcError::DeadlineExceeded { timeout_ms: cfg.retry_budget_ms }), 0)),
                },
            };
            made = n + 1;
            match outcome {
                Ok(v) => return Ok(v),
                Err((e, routing_version)) => {
                    let code = e.code();
                    if !code.is_retryable() {
                        return Err(e);
                    }
                    tracing::debug!(attempt = n, ?code, error = %e, "storage call failed; retrying");
                    if code.needs_routing_refresh() {
                        self.inner.routing.refresh(routing_version, Duration::from_millis(cfg.routing_wait_ms)).await;
                    } else {
                        let backoff_ms = cfg.retry_backoff_ms.saturating_mul(1 << n.min(4));
                        tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                    }
                    last = Some(e);
                }
            }
        }
        let last = Box::new(last.unwrap_or_else(|| StorageClientError::NoRoute("no attempt made".into())));
        if made < cfg.max_attempts {
            return Err(StorageClientError::BudgetExhausted { attempts: made, budget_ms: cfg.retry_budget_ms, last });
        }
        Err(StorageClientError::RetriesExhausted { attempts: made, last })
    }

    fn chain_of(routing: &RoutingInfo, chain: ChainId) -> std::result::Result<&ChainInfo, (StorageClientError, u64)> {
        routing
            .chain(chain)
            .ok_or_else(|| (StorageClientError::NoRoute(format!("{chain} not in routing v{}", routing.version)), routing.version))
    }

    fn head_route(&self, chain: ChainId) -> std::result::Result<Route, (StorageClientError, u64)> {
        let routing = self.inner.routing.current();
        let info = Self::chain_of(&routing, chain)?;
        let head = info.head().ok_or_else(|| (StorageClientError::NoRoute(format!("{chain} has no serving target")), routing.version))?;
        Self::route_to(&routing, info, head.target_id, head.node_id)
    }

    fn read_route(&self, chain: ChainId, chunk: ChunkId, attempt: u32) -> std::result::Result<Route, (StorageClientError, u64)> {
        let routing = self.inner.routing.current();
        self.pick_readable(&routing, chain, chunk, attempt)
    }

    fn pick_readable(
        &self,
        routing: &RoutingInfo,
        chain: ChainId,
        chunk: ChunkId,
        attempt: u32,
    ) -> std::result::Result<Route, (StorageClientError, u64)> {
        let info = Self::chain_of(routing, chain)?;
        let readable: Vec<_> = info.readable().collect();
        if readable.is_empty() {
            return Err((StorageClientError::NoRoute(format!("{chain} has no serving target")), routing.version));
        }
        let pick = readable[self.replica_for(chain, chunk, attempt, readable.len())];
        Self::route_to(routing, info, pick.target_id, pick.node_id)
    }

    /// Which of `n` readable replicas of `chain` serves a read of `chunk`.
    /// With `read_affinity`: the same one for every chunk of the file on
    /// that chain (chosen by a hash of this client's id, the inode and the
    /// chain), the next one on each retry. A sequential reader then reads
    /// each target's chunks of the file in order, so the target's own
    /// block-file readahead works (round-robin per read made every replica
    /// of a 3-replica chain skip two of three chunks and defeated it), while
    /// files, chains and clients still spread over the replicas. Without:
    /// the next replica round-robin per read.
    fn replica_for(&self, chain: ChainId, chunk: ChunkId, attempt: u32, n: usize) -> usize {
        if !self.inner.config.read_affinity {
            return self.inner.spread.fetch_add(1, Ordering::Relaxed) % n;
        }
        let h = mix64(self.inner.spread_seed ^ mix64(chunk.inode.0 ^ mix64(u64::from(chain.0))));
        ((h % n as u64) as usize + attempt as usize) % n
    }

    fn route_to(
        routing: &RoutingInfo,
        info: &ChainInfo,
        target: TargetId,
        node: fskv_types::NodeId,
    ) -> std::result::Result<Route, (StorageClientError, u64)> {
        let addr =
            routing.node_address(node).ok_or_else(|| (StorageClientError::NoRoute(format!("{node} has no address")), routing.version))?;
        Ok(Route { chain_ver: info.chain_version, target, addr: addr.to_string(), routing_version: routing.version })
    }

    /// One batch read RPC to one target, under a sender grant. Splits the
    /// reply payload and checks every CRC.
    async fn send_batch(&self, addr: &str, ios: Vec<ReadIo>) -> Result<Vec<Result<ReadData>>> {
        let _grant = self
            .inner
            .senders
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StorageClientError::Remote(Status::new(ErrorCode::ShuttingDown, "client closed")))?;
        let chunks: Vec<ChunkId> = ios.iter().map(|io| io.chunk).collect();
        let caps = self.caps_for_reads(&ios).await?;
        let req = BatchReadReq { ios, caps };
        let (resp, payload) = self.inner.rpc.call::<BatchRead>(addr, &req, Bytes::new(), self.call_opts()).await?;
        if resp.results.len() != chunks.len() {
            return Err(StorageClientError::Remote(Status::new(ErrorCode::MalformedMessage, "batch read reply count mismatch")));
        }
        let mut offset = 0usize;
        let mut out = Vec::with_capacity(chunks.len());
        for (chunk, r) in chunks.into_iter().zip(resp.results) {
            out.push(match r {
                Err(s) => Err(StorageClientError::Remote(s)),
                Ok(ok) => {
                    let end = offset + ok.len_bytes as usize;
                    let data = payload.get(offset..end).map(|_| payload.slice(offset..end)).ok_or_else(|| {
                        StorageClientError::Remote(Status::new(ErrorCode::MalformedMessage, "batch read payload too short"))
                    })?;
                    offset = end;
                    let actual = crc32c::crc32c(&data);
                    if actual != ok.crc {
                        Err(StorageClientError::Checksum { chunk, expected: ok.crc, actual })
                    } else {
                        Ok(ReadData { data, version: ok.version, chunk_len_bytes: ok.chunk_len_bytes, uncommitted: ok.uncommitted })
                    }
                }
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_proto::routing::{ChainTarget, NodeInfo, PublicTargetState};
    use fskv_rpc::Method;
    use fskv_types::NodeId;

    #[test]
    fn method_ids_are_in_the_storage_range_and_unique() {
        let ids = [
            WriteChunk::ID,
            ForwardChunk::ID,
            BatchRead::ID,
            CommitChunk::ID,
            QueryLastChunk::ID,
            QueryChunk::ID,
            RemoveChunks::ID,
            SpaceInfo::ID,
            DumpChunkMeta::ID,
            SyncStart::ID,
            SyncDone::ID,
            CopyRange::ID,
        ];
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
        assert!(ids.iter().all(|id| (2000..3000).contains(id)));
    }

    #[tokio::test]
    async fn publisher_bumps_version_and_refresh_sees_it() {
        let info = RoutingInfo {
            version: 1,
            nodes: vec![NodeInfo { node_id: NodeId(1), address: "127.0.0.1:1".into() }],
            chains: vec![ChainInfo {
                chain_id: ChainId(1),
                chain_version: 1,
                targets: vec![ChainTarget { target_id: TargetId(1), node_id: NodeId(1), state: PublicTargetState::Serving }],
            }],
            chain_tables: vec![],
            meta_servers: vec![],
        };
        let (publisher, handle) = RoutingPublisher::new(info);
        let h2 = handle.clone();
        let waiter = tokio::spawn(async move { h2.refresh(1, Duration::from_secs(5)).await.version });
        tokio::time::sleep(Duration::from_millis(10)).await;
        publisher.update(|r| r.chains[0].chain_version += 1);
        assert_eq!(waiter.await.ok(), Some(2));
        assert_eq!(handle.current().chains[0].chain_version, 2);
    }

    /// With read affinity every chunk of a file on a chain reads from one
    /// replica (the target's block-file readahead then sees them in order),
    /// a retry moves to the next replica, and files and chains spread over
    /// all replicas; without it reads go round-robin.
    #[tokio::test]
    async fn reads_of_a_file_on_a_chain_stay_on_one_replica_and_retries_rotate() {
        let (_publisher, handle) = RoutingPublisher::new(one_target_routing("127.0.0.1:1".into()));
        let rpc = RpcClient::new(Arc::new(fskv_rpc::TcpTransport::new()), fskv_rpc::ClientConfig::default());
        let config = StorageClientConfig { client_id: 7, read_affinity: true, ..StorageClientConfig::default() };
        let client = StorageClient::new(rpc, handle, config);
        let n = 3;
        let mut used = [0usize; 3];
        for inode in 1..40u64 {
            for chain in 1..5u32 {
                let chain = ChainId(chain);
                let first = client.replica_for(chain, ChunkId::new(InodeId(inode), 0), 0, n);
                used[first] += 1;
                for index in 0..64u64 {
                    let c = ChunkId::new(InodeId(inode), index);
                    assert_eq!(client.replica_for(chain, c, 0, n), first, "{c} on {chain} left its replica");
                    assert_eq!(client.replica_for(chain, c, 1, n), (first + 1) % n);
                    assert_eq!(client.replica_for(chain, c, 2, n), (first + 2) % n);
                }
            }
        }
        assert!(used.iter().all(|&u| u > 20), "files and chains should spread over the replicas: {used:?}");
        assert_eq!(client.replica_for(ChainId(1), ChunkId::new(InodeId(5), 0), 0, 1), 0);
        // Without affinity: round-robin per read, whatever the chunk.
        let (_publisher, handle) = RoutingPublisher::new(one_target_routing("127.0.0.1:1".into()));
        let rpc = RpcClient::new(Arc::new(fskv_rpc::TcpTransport::new()), fskv_rpc::ClientConfig::default());
        let rr = StorageClient::new(rpc, handle, StorageClientConfig { client_id: 7, ..StorageClientConfig::default() });
        let picks: Vec<usize> = (0..6).map(|_| rr.replica_for(ChainId(1), ChunkId::new(InodeId(5), 0), 0, n)).collect();
        assert_eq!(picks, vec![1, 2, 0, 1, 2, 0]);
    }

    fn one_target_routing(address: String) -> RoutingInfo {
        RoutingInfo {
            version: 1,
            nodes: vec![NodeInfo { node_id: NodeId(1), address }],
            chains: vec![ChainInfo {
                chain_id: ChainId(1),
                chain_version: 1,
                targets: vec![ChainTarget { target_id: TargetId(1), node_id: NodeId(1), state: PublicTargetState::Serving }],
            }],
            chain_tables: vec![],
            meta_servers: vec![],
        }
    }

    /// The retry budget ends a call against a target that accepts
    /// connections but never answers (each attempt would wait the 30 s call
    /// timeout) and against one that refuses them (quick failures), well
    /// before `max_attempts` would.
    #[tokio::test]
    async fn the_retry_budget_bounds_a_call_to_a_hung_or_dead_target() {
        let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hung_addr = hung.local_addr().unwrap().to_string();
        let _keep = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = hung.accept().await {
                held.push(sock); // accepted, never answered
            }
        });
        let dead_addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        for addr in [hung_addr, dead_addr] {
            let (_publisher, handle) = RoutingPublisher::new(one_target_routing(addr.clone()));
            let rpc = RpcClient::new(Arc::new(fskv_rpc::TcpTransport::new()), fskv_rpc::ClientConfig::default());
            let config =
                StorageClientConfig { max_attempts: 1_000, retry_budget_ms: 400, routing_wait_ms: 20, ..StorageClientConfig::default() };
            let client = StorageClient::new(rpc, handle, config);
            let started = std::time::Instant::now();
            let r = client.write(ChainId(1), ChunkId::new(InodeId(1), 0), 0, Bytes::from_static(b"x")).await;
            let took = started.elapsed();
            assert!(matches!(r, Err(StorageClientError::BudgetExhausted { budget_ms: 400, .. })), "{addr}: {r:?}");
            assert!(took < Duration::from_secs(5), "{addr}: the budget of 400 ms ended the call only after {took:?}");
        }
    }
}
