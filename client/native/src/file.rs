//! The file handle API shared by the gateways and the FUSE daemon:
//! [`FsClient`] (a meta client + a storage client) opens [`FileHandle`]s
//! that read and write byte ranges of a file.
//!
//! * A range is split at chunk boundaries of the file's layout; chunk `i`
//!   lives on `chain_for_chunk(layout, i)`. The pieces go to their chains in
//!   parallel, at most `max_inflight_chunks` at once per call.
//! * Reads: a chunk that does not exist (a hole) or is shorter than asked
//!   reads as zeros inside the file length; a read stops at the file length.
//! * Writes go to the chain head with the layout chunk size as the
//!   block-sizing hint; the handle tracks the end of the furthest write.
//! * Length: while a handle with writes is open, a background task reports
//!   the written end (`ReportLength`) every `length_report_interval_ms`;
//!   `fsync` reports it at once; `close` ends the write session with `Close`,
//!   and meta computes the exact length from storage.
//! * Inline files (bytes kept in the inode) are read through `ReadInline`;
//!   writing them through a handle is `Unsupported`.
//! * [`FileHandle::copy_from`] copies a range of another (or the same) file
//!   inside the cluster: each piece (cut at the chunk boundaries of both
//!   files) is one storage `CopyRange` to the destination chain's head,
//!   which reads the source from the source chain; no data passes through
//!   this client (except from an inline source, which is small).
//!
//! See `docs/client.md`.

use crate::meta::{CloseEnd, MetaClient, MetaClientConfig, MetaClientError};
use crate::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
use crate::storage::{ReadSpec, StorageClient, StorageClientConfig, StorageClientError};
use bytes::{Bytes, BytesMut};
use fskv_proto::meta::{chain_for_chunk, Expected, FileLayout, Inode, MetaOp, NewOwner, PublishAttrs, UserInfo};
use fskv_proto::storage::CopySource;
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use fskv_types::{ChainId, ChunkId, ErrorCode, InodeId};
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tracing::Instrument;

/// Default mode bits of files created by [`FsClient::open`].
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// Storage attempts per chunk operation of a client built by
/// The storage retry budget of [`FsClient::connect`]. When a storage
/// process dies, its chains fail until mgmtd marks it offline (its
/// heartbeat timeout, 10 s by default) and the new routing arrives; the
/// client keeps retrying over that window (else a write through the mount
/// fails with EIO), and no longer: a call gives up after this long even if
/// a target hangs, since attempts still running then are cut off.
pub const FAILOVER_RETRY_BUDGET_MS: u64 = 30_000;
/// How long [`FsClient::connect`] without meta addresses waits for a meta
/// server to appear in mgmtd's routing info (one registers within a second
/// of starting).
pub const META_DISCOVERY_WAIT_MS: u64 = 30_000;
/// Attempts within that budget (quick failures back off 5, 10, 20, 40,
/// then 80 ms): the budget, not this count, is meant to end the retries.
pub const FAILOVER_STORAGE_ATTEMPTS: u32 = 1_000;

/// Limits of [`FsClient`]; times and counts carry their units.
#[derive(Clone, Debug)]
pub struct FsClientConfig {
    /// Chunk pieces of one read/write call in flight at once.
    pub max_inflight_chunks: usize,
    /// Period of the background length report of a handle with writes (0 = off).
    pub length_report_interval_ms: u64,
    /// Read pending versions instead of waiting for them to commit.
    pub relaxed_reads: bool,
    /// Mode of files created by `open` with `create`.
    pub create_mode: u32,
    /// Period of the lease renewal (`RenewTemp`) of a [`FsClient::create_temp`]
    /// handle while it lives (0 = off). Keep it well below meta's
    /// `temp_inode_ttl_ms` (1 h by default): a temp inode whose lease lapses
    /// is reclaimed, and its publish then fails with `NotFound`.
    pub temp_lease_renew_interval_ms: u64,
}

impl Default for FsClientConfig {
    fn default() -> Self {
        FsClientConfig {
            max_inflight_chunks: 16,
            length_report_interval_ms: 5_000,
            relaxed_reads: false,
            create_mode: DEFAULT_FILE_MODE,
            temp_lease_renew_interval_ms: 60_000,
        }
    }
}

/// How to open a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    /// Create the file if it does not exist.
    pub create: bool,
    /// With `create`: fail with AlreadyExists if it exists.
    pub exclusive: bool,
    /// With `write`: cut the file to length 0.
    pub truncate: bool,
}

impl OpenFlags {
    pub fn read_only() -> Self {
        OpenFlags { read: true, ..Default::default() }
    }

    pub fn read_write() -> Self {
        OpenFlags { read: true, write: true, ..Default::default() }
    }

    /// Read-write, created if missing, truncated if present.
    pub fn create_truncate() -> Self {
        OpenFlags { read: true, write: true, create: true, truncate: true, exclusive: false }
    }

    /// Read-write, created; fails if the file exists.
    pub fn create_new() -> Self {
        OpenFlags { read: true, write: true, create: true, exclusive: true, truncate: false }
    }
}

/// One read of [`FsClient::read_many_into`]: `buf.len()` bytes at `offset`
/// of `handle`, into the caller's buffer.
pub struct ReadInto<'a> {
    pub handle: &'a FileHandle,
    pub offset: u64,
    pub buf: &'a mut [u8],
}

/// How [`FsClient::read_many_into`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadIntoOptions {
    /// Read pending (uncommitted) versions instead of waiting for them to
    /// commit (as [`FsClientConfig::relaxed_reads`] does for `read_at`).
    pub relaxed: bool,
    /// A hole inside the file length (a missing chunk, or a chunk shorter
    /// than the range asked of it) fails that read with [`FileError::Hole`]
    /// instead of reading as zeros.
    pub forbid_holes: bool,
}

/// Chunk pieces of one [`FsClient::read_many_into`] call sent as one
/// `StorageClient::batch_read` (which makes one RPC per storage node): at
/// most this many pieces ...
const READ_BATCH_MAX_PIECES: usize = 64;
/// ... and this many bytes.
const READ_BATCH_MAX_BYTES: u64 = 8 << 20;

/// Every error of the file API; each names the file and, for data, the chunk.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{op} {path}: {cause}")]
    Meta { op: &'static str, path: String, cause: MetaClientError },
    #[error("{op} chunk {chunk} of {path} on {chain}: {cause}")]
    Storage { op: &'static str, path: String, chunk: ChunkId, chain: ChainId, cause: StorageClientError },
    #[error("{path} ({inode}) is not a regular file")]
    NotAFile { path: String, inode: InodeId },
    #[error("{path}: handle not opened for {mode}")]
    WrongMode { path: String, mode: &'static str },
    #[error("{path}: handle is closed")]
    Closed { path: String },
    #[error("{path}: {what} is not supported")]
    Unsupported { path: String, what: &'static str },
    #[error("{path} ({inode}): layout has no chain for chunk {index}")]
    NoChain { path: String, inode: InodeId, index: u64 },
    #[error("{path}: hole at byte {offset} (reads of this call must not cross holes)")]
    Hole { path: String, offset: u64 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("cannot connect: {0}")]
    Connect(String),
}

impl FileError {
    pub fn code(&self) -> ErrorCode {
        match self {
            FileError::Meta { cause, .. } => cause.code(),
            FileError::Storage { cause, .. } => cause.code(),
            FileError::NotAFile { .. } => ErrorCode::IsDirectory,
            FileError::WrongMode { .. } => ErrorCode::PermissionDenied,
            FileError::Closed { .. } | FileError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            FileError::Unsupported { .. } => ErrorCode::Unsupported,
            FileError::NoChain { .. } => ErrorCode::Internal,
            FileError::Hole { .. } => ErrorCode::NotFound,
            FileError::Connect(_) => ErrorCode::ConnectionFailed,
        }
    }
}

pub type Result<T, E = FileError> = std::result::Result<T, E>;

/// Counters of data-path work, shared by every handle of one client.
#[derive(Debug, Default)]
pub struct IoStats {
    pub chunks_read: AtomicU64,
    pub chunks_written: AtomicU64,
    /// Data bytes received by reads of chunks (inline reads not counted).
    pub bytes_read: AtomicU64,
    /// Data bytes sent by writes of chunks.
    pub bytes_written: AtomicU64,
    /// Pieces copied inside the cluster (`CopyRange`) and their bytes; these
    /// bytes never pass through the client.
    pub chunks_copied: AtomicU64,
    pub bytes_copied: AtomicU64,
    inflight: AtomicUsize,
    /// Most chunk pieces ever in flight at once.
    pub peak_inflight_chunks: AtomicUsize,
}

impl IoStats {
    fn enter(&self) -> InflightGuard<'_> {
        let now = self.inflight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_inflight_chunks.fetch_max(now, Ordering::Relaxed);
        InflightGuard(self)
    }
}

struct InflightGuard<'a>(&'a IoStats);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A filesystem client: metadata through meta, data through storage.
#[derive(Clone)]
pub struct FsClient {
    meta: MetaClient,
    storage: StorageClient,
    config: Arc<FsClientConfig>,
    stats: Arc<IoStats>,
    /// Keeps the routing poll alive for clients built by [`FsClient::connect`].
    routing_source: Option<Arc<MgmtdRoutingSource>>,
}

impl FsClient {
    pub fn new(meta: MetaClient, storage: StorageClient, config: FsClientConfig) -> Self {
        let config = FsClientConfig { max_inflight_chunks: config.max_inflight_chunks.max(1), ..config };
        FsClient { meta, storage, config: Arc::new(config), stats: Arc::default(), routing_source: None }
    }

    /// Connects to a cluster: routing from mgmtd (kept fresh by a long poll),
    /// metadata from the meta servers — `meta_addrs`, or when it is empty the
    /// meta servers registered with mgmtd (`RoutingInfo::meta_servers`).
    pub async fn connect(mgmtd_addrs: Vec<String>, meta_addrs: Vec<String>, config: FsClientConfig) -> Result<Self> {
        Self::connect_with(mgmtd_addrs, meta_addrs, config, ClientConfig::default()).await
    }

    /// [`FsClient::connect`] with an explicit RPC identity and limits. A
    /// `user:` principal (a key from `fskv admin user-key`) gets chunk
    /// capabilities from meta and attaches them to every storage request
    /// ([`crate::caps`]); meta makes it act as itself.
    pub async fn connect_with(
        mgmtd_addrs: Vec<String>,
        meta_addrs: Vec<String>,
        config: FsClientConfig,
        rpc_config: ClientConfig,
    ) -> Result<Self> {
        let is_user = rpc_config.cluster_key.is_some() && fskv_rpc::auth::is_user_principal(&rpc_config.principal);
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), rpc_config.clone());
        let mgmtd = MgmtdClient::new(rpc.clone(), mgmtd_addrs.clone(), MgmtdClientConfig::default());
        let source = MgmtdRoutingSource::start(mgmtd, Duration::from_secs(10))
            .await
            .map_err(|e| FileError::Connect(format!("no routing from mgmtd {mgmtd_addrs:?}: {e}; is the cluster up?")))?;
        let storage_config = StorageClientConfig {
            max_attempts: FAILOVER_STORAGE_ATTEMPTS,
            retry_budget_ms: FAILOVER_RETRY_BUDGET_MS,
            read_affinity: true,
            ..StorageClientConfig::default()
        };
        let storage = StorageClient::new(rpc, source.handle(), storage_config);
        let meta_addrs = if meta_addrs.is_empty() {
            let found = source.wait_for_meta_servers(Duration::from_millis(META_DISCOVERY_WAIT_MS)).await;
            if found.is_empty() {
                return Err(FileError::Connect(format!(
                    "no meta server registered with mgmtd {mgmtd_addrs:?} within {META_DISCOVERY_WAIT_MS} ms; \
                     start `fskv meta --mgmtd ...` or pass the meta addresses"
                )));
            }
            found
        } else {
            meta_addrs
        };
        let meta = MetaClient::new(MetaClientConfig { rpc: rpc_config, ..MetaClientConfig::new(meta_addrs) })
            .map_err(|e| FileError::Connect(format!("meta client: {e}")))?;
        if is_user {
            storage.set_cap_source(Arc::new(crate::caps::MetaCapSource::new(meta.clone())));
        }
        let mut client = FsClient::new(meta, storage, config);
        client.routing_source = Some(source);
        Ok(client)
    }

    pub fn meta(&self) -> &MetaClient {
        &self.meta
    }

    pub fn storage(&self) -> &StorageClient {
        &self.storage
    }

    pub fn config(&self) -> &FsClientConfig {
        &self.config
    }

    pub fn stats(&self) -> &IoStats {
        &self.stats
    }

    /// Stops the routing poll of a client built by [`FsClient::connect`].
    pub fn shutdown(&self) {
        if let Some(s) = &self.routing_source {
            s.stop();
        }
    }

    /// The same client with metadata calls made as `user` (shares connections,
    /// routing and counters); the FUSE mount uses one per request's caller.
    pub fn with_user(&self, user: UserInfo) -> FsClient {
        FsClient { meta: self.meta.with_user(user), ..self.clone() }
    }

    /// The same client with every inode it creates owned by `owner`
    /// ([`MetaClient::with_owner`]; the client must act as root).
    pub fn with_owner(&self, owner: Option<NewOwner>) -> FsClient {
        FsClient { meta: self.meta.with_owner(owner), ..self.clone() }
    }

    /// The same client with metadata changes acknowledged before they are
    /// fsync'ed (`MetaClient::with_relaxed_durability`); `meta().sync()` is
    /// the barrier. The FUSE mount's mode: POSIX makes namespace changes
    /// durable at fsync(2), not at each call.
    pub fn with_relaxed_metadata(&self) -> FsClient {
        FsClient { meta: self.meta.with_relaxed_durability(), ..self.clone() }
    }

    /// Opens the file with inode id `inode` directly (no name lookup; `create`
    /// and `exclusive` are ignored).
    pub async fn open_inode(&self, inode: InodeId, flags: OpenFlags) -> Result<FileHandle> {
        let path = inode.to_string();
        let (found, session) =
            self.meta.open(inode, flags.write).await.map_err(|cause| FileError::Meta { op: "open", path: path.clone(), cause })?;
        let handle = FileHandle::new(self.clone(), path, found, session, flags)?;
        if flags.write && flags.truncate && handle.may_hold_data() {
            handle.truncate(0).await?;
        }
        Ok(handle)
    }

    /// Creates (or, unless `exclusive`, opens) `name` in `parent` with
    /// permission bits `mode`, for reading and writing.
    pub async fn create_at(&self, parent: InodeId, name: &str, mode: u32, exclusive: bool) -> Result<FileHandle> {
        let path = format!("{parent}/{name}");
        let (inode, session) = self.meta.create_for_write(parent, name, mode, exclusive).await.map_err(|cause| FileError::Meta {
            op: "create",
            path: path.clone(),
            cause,
        })?;
        FileHandle::new(self.clone(), path, inode, session, OpenFlags { read: true, write: true, create: true, exclusive, truncate: false })
    }

    /// A write handle on a new file without a name in `parent` (meta
    /// `CreateUnlinked`; it takes the directory's layout). Write it, then
    /// [`FsClient::publish`] it; one never published is reclaimed by meta
    /// after its `temp_inode_ttl_ms`. No write session: nothing reports a
    /// length before the publish, which sets the exact one.
    pub async fn create_temp(&self, parent: InodeId, mode: u32) -> Result<FileHandle> {
        let path = format!("{parent}/<temp>");
        let inode = self.meta.create_unlinked(parent, mode).await.map_err(|cause| FileError::Meta {
            op: "create a temp file in",
            path: path.clone(),
            cause,
        })?;
        let handle = FileHandle::new(
            self.clone(),
            path,
            inode,
            0,
            OpenFlags { read: true, write: true, create: true, exclusive: true, truncate: false },
        )?;
        handle.start_temp_lease();
        Ok(handle)
    }

    /// A read handle on `inode` as a lookup or stat returned it, without a
    /// meta call (the caller already checked what it needs). It reads the
    /// data as the inode's layout places it; its length is the inode's.
    pub fn reader(&self, inode: Inode) -> Result<FileHandle> {
        let path = inode.id.to_string();
        FileHandle::new(self.clone(), path, inode, 0, OpenFlags::read_only())
    }

    /// Publishes a handle of [`FsClient::create_temp`] as `parent/name`,
    /// atomically replacing a file there if `expected` holds, with its length
    /// set to the end of the handle's writes and `attrs` (mtime, xattrs) set
    /// in the same transaction. Waits for the handle's writes first. A failed
    /// publish (say, the directory went away) may be retried with the handle.
    pub async fn publish(
        &self,
        handle: &FileHandle,
        parent: InodeId,
        name: &str,
        expected: Option<Expected>,
        mut attrs: PublishAttrs,
    ) -> Result<Inode> {
        let path = format!("{parent}/{name}");
        attrs.length = Some(Self::written_length(handle).await);
        let inode = handle.inode();
        let published = self.meta.replace(parent, name, inode, expected, attrs).await.map_err(|cause| FileError::Meta {
            op: "publish",
            path,
            cause,
        })?;
        Ok(published)
    }

    /// The `Replace` op [`FsClient::publish`] sends, for a caller that
    /// sends it inside a [`MetaOp::Txn`] with other changes (the S3
    /// gateway's versioned writes). Waits for the handle's writes first.
    pub async fn publish_op(
        handle: &FileHandle,
        parent: InodeId,
        name: &str,
        expected: Option<Expected>,
        mut attrs: PublishAttrs,
    ) -> MetaOp {
        attrs.length = Some(Self::written_length(handle).await);
        MetaOp::Replace { parent, name: name.into(), inode: handle.inode(), expected, attrs }
    }

    /// The end of what `handle` wrote, once its writes in flight are done.
    async fn written_length(handle: &FileHandle) -> u64 {
        let _quiet = handle.shared.writes.write().await;
        handle.shared.state.lock().written_end
    }

    /// Opens the file at a `/`-separated path from the root.
    pub async fn open(&self, path: &str, flags: OpenFlags) -> Result<FileHandle> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
        if name.is_empty() {
            return Err(FileError::InvalidArgument(format!("{path:?} names no file")));
        }
        let parent = self.meta.resolve(dir).await.map_err(|cause| FileError::Meta {
            op: "resolve the directory of",
            path: path.to_string(),
            cause,
        })?;
        self.open_in(parent.id, name, flags, path).await
    }

    /// Opens `name` in the directory `parent`.
    pub async fn open_at(&self, parent: InodeId, name: &str, flags: OpenFlags) -> Result<FileHandle> {
        self.open_in(parent, name, flags, &format!("{parent}/{name}")).await
    }

    async fn open_in(&self, parent: InodeId, name: &str, flags: OpenFlags, path: &str) -> Result<FileHandle> {
        let meta_err = |op| move |cause| FileError::Meta { op, path: path.to_string(), cause };
        let (inode, session) = match (flags.create, flags.write) {
            (true, true) => {
                self.meta.create_for_write(parent, name, self.config.create_mode, flags.exclusive).await.map_err(meta_err("create"))?
            }
            (true, false) => {
                let inode = self.meta.create(parent, name, self.config.create_mode, flags.exclusive).await.map_err(meta_err("create"))?;
                (inode, 0)
            }
            (false, write) => {
                let found = self.meta.lookup(parent, name).await.map_err(meta_err("lookup"))?;
                self.meta.open(found.id, write).await.map_err(meta_err("open"))?
            }
        };
        let handle = FileHandle::new(self.clone(), path.to_string(), inode, session, flags)?;
        if flags.write && flags.truncate && handle.may_hold_data() {
            handle.truncate(0).await?;
        }
        Ok(handle)
    }
}

/// One chunk piece of a [`FsClient::read_many_into`] call.
#[derive(Clone, Copy, Debug)]
struct ReadIntoPiece {
    /// Index of its read in the call.
    read: usize,
    /// Offset of the piece in its read's buffer.
    buf_offset: usize,
    spec: ReadSpec,
}

/// Cuts `pieces` into batches of at most [`READ_BATCH_MAX_PIECES`] pieces and
/// [`READ_BATCH_MAX_BYTES`] bytes (a single larger piece is a batch of its own).
fn read_batches(pieces: Vec<ReadIntoPiece>) -> Vec<Vec<ReadIntoPiece>> {
    let mut out: Vec<Vec<ReadIntoPiece>> = Vec::new();
    let mut bytes = 0u64;
    for p in pieces {
        let len = u64::from(p.spec.len_bytes);
        match out.last_mut() {
            Some(last) if last.len() < READ_BATCH_MAX_PIECES && bytes + len <= READ_BATCH_MAX_BYTES => {
                last.push(p);
                bytes += len;
            }
            _ => {
                out.push(vec![p]);
                bytes = len;
            }
        }
    }
    out
}

impl FsClient {
    /// Reads every `reads[i]` into its buffer and returns the bytes read per
    /// read, in order. Each read stops at the file length (short, like
    /// `read_at`; a read past the length its handle knows first re-reads it
    /// from meta, once per handle); holes inside the length read as zeros,
    /// or fail that read with [`FileError::Hole`] under
    /// `options.forbid_holes`. Inline files are read through meta.
    ///
    /// The chunk pieces of all reads go out together as batched storage
    /// reads (`StorageClient::batch_read`: one RPC per storage node) of at
    /// most [`READ_BATCH_MAX_PIECES`] pieces / [`READ_BATCH_MAX_BYTES`],
    /// `max_inflight_chunks` batches at once. Each piece is copied once, from
    /// the RPC reply into the caller's buffer. One read failing does not
    /// fail the others.
    pub async fn read_many_into(&self, reads: &mut [ReadInto<'_>], options: ReadIntoOptions) -> Vec<Result<usize>> {
        let mut results: Vec<Option<Result<usize>>> = (0..reads.len()).map(|_| None).collect();
        // Handles to refresh: those with a read past their known length (each once).
        let mut stale: Vec<(usize, &FileHandle)> = Vec::new();
        for (i, r) in reads.iter().enumerate() {
            let past = r.offset.saturating_add(r.buf.len() as u64) > r.handle.len();
            if past && !stale.iter().any(|(_, h)| std::ptr::eq(*h, r.handle)) {
                stale.push((i, r.handle));
            }
        }
        let refreshed = futures::future::join_all(stale.iter().map(|(i, h)| async move { (*i, h.refresh_len().await) })).await;
        let mut refresh_failed: Vec<(&FileHandle, FileError)> = Vec::new();
        for (i, r) in refreshed {
            if let Err(e) = r {
                refresh_failed.push((reads[i].handle, e));
            }
        }
        let mut pieces = Vec::new();
        let mut inline = Vec::new();
        for (i, r) in reads.iter().enumerate() {
            if let Some((_, e)) = refresh_failed.iter().find(|(h, _)| std::ptr::eq(*h, r.handle)) {
                // refresh_len fails with a meta error (the others cannot happen).
                let e = match e {
                    FileError::Meta { op, path, cause } => FileError::Meta { op, path: path.clone(), cause: cause.clone() },
                    other => FileError::InvalidArgument(format!("{}: cannot learn its length: {other}", r.handle.path())),
                };
                results[i] = Some(Err(e));
                continue;
            }
            if let Err(e) = r.handle.check_open(false) {
                results[i] = Some(Err(e));
                continue;
            }
            let (length, is_inline) = {
                let st = r.handle.shared.state.lock();
                (st.length, st.inline)
            };
            let len = r.offset.saturating_add(r.buf.len() as u64).min(length).saturating_sub(r.offset);
            results[i] = Some(Ok(len as usize));
            if len == 0 {
                continue;
            }
            if is_inline {
                inline.push((i, len));
                continue;
            }
            for p in split_range(r.offset, len, r.handle.chunk_bytes()) {
                let chain = match r.handle.chain(p.index) {
                    Ok(c) => c,
                    Err(e) => {
                        results[i] = Some(Err(e));
                        break;
                    }
                };
                // A piece lies inside one chunk, whose size is a u32.
                let len_bytes = p.len as u32;
                let chunk = ChunkId::new(r.handle.shared.inode, p.index);
                let spec = ReadSpec { chain, chunk, offset_bytes: p.chunk_offset, len_bytes, relaxed: options.relaxed };
                pieces.push(ReadIntoPiece { read: i, buf_offset: p.buf_offset as usize, spec });
            }
        }
        for (i, len) in inline {
            let r = &mut reads[i];
            match r.handle.read_inline(r.offset, len).await {
                Ok(data) => {
                    let n = data.len().min(r.buf.len());
                    r.buf[..n].copy_from_slice(&data[..n]);
                    results[i] = Some(Ok(n));
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let storage = &self.storage;
        let mut batches = futures::stream::iter(read_batches(pieces).into_iter().map(|batch| async move {
            let specs: Vec<ReadSpec> = batch.iter().map(|p| p.spec).collect();
            let out = storage.batch_read(&specs).await;
            (batch, out)
        }))
        .buffer_unordered(self.config.max_inflight_chunks);
        while let Some((batch, out)) = batches.next().await {
            for (p, r) in batch.iter().zip(out) {
                self.stats.chunks_read.fetch_add(1, Ordering::Relaxed);
                if matches!(results[p.read], Some(Err(_))) {
                    continue;
                }
                let read = &mut reads[p.read];
                let want = p.spec.len_bytes as usize;
                let data = match r {
                    Ok(d) => d.data,
                    Err(e) if e.code() == ErrorCode::NotFound => Bytes::new(),
                    Err(cause) => {
                        let path = read.handle.path().to_string();
                        results[p.read] =
                            Some(Err(FileError::Storage { op: "read", path, chunk: p.spec.chunk, chain: p.spec.chain, cause }));
                        continue;
                    }
                };
                let n = data.len().min(want);
                self.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                let Some(dst) = read.buf.get_mut(p.buf_offset..p.buf_offset + want) else { continue };
                dst[..n].copy_from_slice(&data[..n]);
                if n < want {
                    if options.forbid_holes {
                        let offset = read.offset + (p.buf_offset + n) as u64;
                        results[p.read] = Some(Err(FileError::Hole { path: read.handle.path().to_string(), offset }));
                        continue;
                    }
                    dst[n..].fill(0);
                }
            }
        }
        results.into_iter().map(|r| r.unwrap_or(Ok(0))).collect()
    }
}

/// What a handle knows about its file's length and its own writes.
#[derive(Debug)]
struct LengthState {
    /// Length from meta (at open, truncate, close) or grown by own writes.
    length: u64,
    /// End of the furthest write through this handle (0 = none).
    written_end: u64,
    /// `written_end` as last reported to meta.
    reported_end: u64,
    truncate_version: u64,
    /// Inline bytes are in the inode (no chunks).
    inline: bool,
    /// A write was attempted through this handle (close moves mtime only
    /// then).
    wrote: bool,
    /// A write through this handle failed: it may have changed chunks past
    /// `written_end`, so close lets meta measure the length from storage.
    write_failed: bool,
}

struct Shared {
    client: FsClient,
    path: String,
    inode: InodeId,
    layout: FileLayout,
    session: u64,
    flags: OpenFlags,
    state: Mutex<LengthState>,
    /// Writes hold it shared; fsync/close take it exclusive to wait for them.
    writes: tokio::sync::RwLock<()>,
}

/// An open file. Clone-free; share it behind an `Arc` (all calls take `&self`
/// except `close`).
pub struct FileHandle {
    shared: Arc<Shared>,
    reporter: Mutex<Option<tokio::task::JoinHandle<()>>>,
    closed: bool,
    /// The inode as meta returned it when this handle was opened.
    opened: Box<Inode>,
}

/// One piece of a range inside one chunk.
#[derive(Clone, Copy, Debug)]
struct Piece {
    index: u64,
    /// Offset inside the chunk.
    chunk_offset: u64,
    len: u64,
    /// Offset inside the caller's buffer.
    buf_offset: u64,
}

/// Splits `[offset, offset + len)` at multiples of `chunk_bytes`.
fn split_range(offset: u64, len: u64, chunk_bytes: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut pos = offset;
    let end = offset.saturating_add(len);
    while pos < end {
        let index = pos / chunk_bytes;
        let chunk_offset = pos % chunk_bytes;
        let piece_len = (chunk_bytes - chunk_offset).min(end - pos);
        out.push(Piece { index, chunk_offset, len: piece_len, buf_offset: pos - offset });
        pos += piece_len;
    }
    out
}

/// One piece of a copy: inside one chunk of the source and one chunk of the
/// destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CopyPiece {
    src_index: u64,
    src_chunk_offset: u64,
    dst_index: u64,
    dst_chunk_offset: u64,
    len: u64,
}

/// Cuts a copy of `len` bytes at the chunk boundaries of both files, lazily
/// (a long copy never holds its whole piece list).
struct CopyPieces {
    src_pos: u64,
    dst_pos: u64,
    left: u64,
    src_chunk_bytes: u64,
    dst_chunk_bytes: u64,
}

impl CopyPieces {
    fn new(src_offset: u64, dst_offset: u64, len: u64, src_chunk_bytes: u64, dst_chunk_bytes: u64) -> Self {
        CopyPieces { src_pos: src_offset, dst_pos: dst_offset, left: len, src_chunk_bytes, dst_chunk_bytes }
    }
}

impl Iterator for CopyPieces {
    type Item = CopyPiece;

    fn next(&mut self) -> Option<CopyPiece> {
        if self.left == 0 {
            return None;
        }
        let src_chunk_offset = self.src_pos % self.src_chunk_bytes;
        let dst_chunk_offset = self.dst_pos % self.dst_chunk_bytes;
        let len = (self.src_chunk_bytes - src_chunk_offset).min(self.dst_chunk_bytes - dst_chunk_offset).min(self.left);
        let piece = CopyPiece {
            src_index: self.src_pos / self.src_chunk_bytes,
            src_chunk_offset,
            dst_index: self.dst_pos / self.dst_chunk_bytes,
            dst_chunk_offset,
            len,
        };
        self.src_pos += len;
        self.dst_pos += len;
        self.left -= len;
        Some(piece)
    }
}

impl FileHandle {
    fn new(client: FsClient, path: String, inode: Inode, session: u64, flags: OpenFlags) -> Result<Self> {
        let Some(file) = inode.file() else {
            return Err(FileError::NotAFile { path, inode: inode.id });
        };
        let state = LengthState {
            length: file.length,
            written_end: 0,
            reported_end: 0,
            truncate_version: file.truncate_version,
            inline: file.inline.is_some(),
            wrote: false,
            write_failed: false,
        };
        let shared = Arc::new(Shared {
            client,
            path,
            inode: inode.id,
            layout: file.layout.clone(),
            session,
            flags,
            state: Mutex::new(state),
            writes: tokio::sync::RwLock::new(()),
        });
        Ok(FileHandle { shared, reporter: Mutex::new(None), closed: false, opened: Box::new(inode) })
    }

    pub fn inode(&self) -> InodeId {
        self.shared.inode
    }

    /// The inode's version when this handle was opened (meta bumps it on
    /// every change of the inode, including a close after writes): equal
    /// versions at two opens mean the file did not change in between.
    pub fn opened_version(&self) -> u64 {
        self.opened.version
    }

    /// The inode (attributes included) as meta returned it at open or
    /// create: what a stat right after the open would return.
    pub fn opened_inode(&self) -> &Inode {
        &self.opened
    }

    pub fn path(&self) -> &str {
        &self.shared.path
    }

    pub fn layout(&self) -> &FileLayout {
        &self.shared.layout
    }

    /// The write session id (0 for a read-only handle).
    pub fn session(&self) -> u64 {
        self.shared.session
    }

    /// No write was ever attempted through this handle (nor did one fail):
    /// its `fsync` and the length report of its close have nothing to send.
    pub fn never_wrote(&self) -> bool {
        let st = self.shared.state.lock();
        !st.wrote && !st.write_failed && st.written_end <= st.reported_end
    }

    /// Ends the handle without a meta call when its close would report
    /// nothing: a write session through which no write was attempted (its
    /// close only ends the session, carrying the truncate version the
    /// handle saw). The caller then owes meta the returned close (it
    /// may send it later, batched with others: until then the session is
    /// open, as if the file were still open, and it expires after meta's
    /// `session_ttl_ms` if the close is never sent). Any other handle is
    /// handed back untouched, to be closed with [`FileHandle::close`].
    pub fn into_quiet_close(mut self) -> std::result::Result<QuietClose, FileHandle> {
        if self.shared.session == 0 || !self.never_wrote() || self.shared.state.lock().reported_end != 0 {
            return Err(self);
        }
        self.stop_reporter();
        self.closed = true;
        let truncate_version = self.shared.state.lock().truncate_version;
        let end = CloseEnd { length_hint: Some(0), truncate_version, wrote: false, writes_settled: false };
        Ok(QuietClose { inode: self.shared.inode, session: self.shared.session, end })
    }

    /// The length as this handle knows it: meta's length at open (or last
    /// refresh), grown by this handle's writes.
    pub fn len(&self) -> u64 {
        self.shared.state.lock().length
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the file may hold bytes: a length above 0, or chunks at all.
    /// A chunked file's length in meta is what its writers reported; a
    /// writer that failed or died before reporting leaves chunks beyond it
    /// (a later close would measure them on storage), so an `O_TRUNC` open
    /// must cut a chunked file whatever length meta shows.
    pub fn may_hold_data(&self) -> bool {
        !self.is_empty() || !self.shared.state.lock().inline
    }

    /// Re-reads the length from meta (writes by other handles become visible
    /// once they report or close). A truncate by someone else since this
    /// handle last looked (a newer truncate version) cuts this handle's
    /// written end to the new length.
    pub async fn refresh_len(&self) -> Result<u64> {
        let inode = self.shared.client.meta.stat(self.shared.inode).await.map_err(|e| self.meta_err("stat", e))?;
        let meta_len = inode.size_bytes();
        let mut st = self.shared.state.lock();
        if let Some(f) = inode.file() {
            st.inline = f.inline.is_some();
            if f.truncate_version > st.truncate_version {
                st.truncate_version = f.truncate_version;
                st.written_end = st.written_end.min(meta_len);
                st.reported_end = st.reported_end.min(meta_len);
            }
        }
        st.length = meta_len.max(st.written_end);
        Ok(st.length)
    }

    /// Raises the length this handle reads up to, to `len`: another handle
    /// of the same client wrote that far and meta has not heard of it yet
    /// (the FUSE mount's read-your-writes across handles).
    pub fn raise_len(&self, len: u64) {
        let mut st = self.shared.state.lock();
        st.length = st.length.max(len);
    }

    fn chunk_bytes(&self) -> u64 {
        u64::from(self.shared.layout.chunk_size_bytes.max(1))
    }

    fn meta_err(&self, op: &'static str, cause: MetaClientError) -> FileError {
        FileError::Meta { op, path: self.shared.path.clone(), cause }
    }

    fn check_open(&self, write: bool) -> Result<()> {
        if self.closed {
            return Err(FileError::Closed { path: self.shared.path.clone() });
        }
        let (ok, mode) = if write { (self.shared.flags.write, "writing") } else { (self.shared.flags.read, "reading") };
        if !ok {
            return Err(FileError::WrongMode { path: self.shared.path.clone(), mode });
        }
        Ok(())
    }

    fn chain(&self, index: u64) -> Result<ChainId> {
        chain_for_chunk(&self.shared.layout, index).ok_or_else(|| FileError::NoChain {
            path: self.shared.path.clone(),
            inode: self.shared.inode,
            index,
        })
    }

    /// Reads up to `len` bytes at `offset`; short (or empty) at the file length.
    pub async fn read_at(&self, offset: u64, len: u64) -> Result<Bytes> {
        self.check_open(false)?;
        let (length, inline) = {
            let st = self.shared.state.lock();
            (st.length, st.inline)
        };
        let end = offset.saturating_add(len).min(length);
        if end <= offset {
            return Ok(Bytes::new());
        }
        if inline {
            return self.read_inline(offset, end - offset).await;
        }
        let span = tracing::debug_span!("read_at", inode = %self.shared.inode, offset, len = end - offset);
        self.read_chunks(offset, end - offset).instrument(span).await
    }

    async fn read_inline(&self, offset: u64, len: u64) -> Result<Bytes> {
        let len32 = u32::try_from(len).map_err(|_| FileError::InvalidArgument(format!("inline read of {len} bytes")))?;
        let data =
            self.shared.client.meta.read_inline(self.shared.inode, offset, len32).await.map_err(|e| self.meta_err("read inline", e))?;
        Ok(Bytes::from(data))
    }

    async fn read_chunks(&self, offset: u64, len: u64) -> Result<Bytes> {
        let pieces = split_range(offset, len, self.chunk_bytes());
        let inflight = self.shared.client.config.max_inflight_chunks;
        let mut parts: Vec<Bytes> =
            futures::stream::iter(pieces.into_iter().map(|p| self.read_piece(p))).buffered(inflight).try_collect().await?;
        if parts.len() == 1 {
            // One chunk's piece: the storage reply itself, not a copy of it.
            return Ok(parts.pop().unwrap_or_default());
        }
        let mut out = BytesMut::with_capacity(usize::try_from(len).unwrap_or(0));
        for part in parts {
            out.extend_from_slice(&part);
        }
        Ok(out.freeze())
    }

    /// One piece: missing chunk or missing tail reads as zeros.
    async fn read_piece(&self, p: Piece) -> Result<Bytes> {
        let chain = self.chain(p.index)?;
        let chunk = ChunkId::new(self.shared.inode, p.index);
        let client = &self.shared.client;
        let _g = client.stats.enter();
        let want = u32::try_from(p.len).map_err(|_| FileError::InvalidArgument(format!("piece of {} bytes", p.len)))?;
        let result = client.storage.read(chain, chunk, p.chunk_offset, want, client.config.relaxed_reads).await;
        client.stats.chunks_read.fetch_add(1, Ordering::Relaxed);
        let data = match result {
            Ok(r) => {
                client.stats.bytes_read.fetch_add(r.data.len() as u64, Ordering::Relaxed);
                r.data
            }
            Err(e) if e.code() == ErrorCode::NotFound => {
                tracing::trace!(%chunk, "hole");
                Bytes::new()
            }
            Err(cause) => {
                return Err(FileError::Storage { op: "read", path: self.shared.path.clone(), chunk, chain, cause });
            }
        };
        if data.len() as u64 >= p.len {
            return Ok(data.slice(..p.len as usize));
        }
        let mut padded = BytesMut::with_capacity(p.len as usize);
        padded.extend_from_slice(&data);
        padded.resize(p.len as usize, 0);
        Ok(padded.freeze())
    }

    /// Reads up to `buf.len()` bytes at `offset` into `buf` (one copy, from
    /// the storage reply into `buf`); returns how many, short at the file
    /// length. Unlike [`FileHandle::read_at`], a read past the length this
    /// handle knows first re-reads it from meta (as the FUSE read does).
    /// Holes read as zeros. See [`FsClient::read_many_into`].
    pub async fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let client = self.shared.client.clone();
        let options = ReadIntoOptions { relaxed: client.config.relaxed_reads, forbid_holes: false };
        let mut reads = [ReadInto { handle: self, offset, buf }];
        match client.read_many_into(&mut reads, options).await.pop() {
            Some(r) => r,
            None => Err(FileError::InvalidArgument("read_many_into returned no result".into())),
        }
    }

    /// Writes `data` at `offset`; returns once every chain committed it.
    pub async fn write_at(&self, offset: u64, data: Bytes) -> Result<()> {
        self.check_open(true)?;
        if self.shared.state.lock().inline {
            return Err(FileError::Unsupported { path: self.shared.path.clone(), what: "writing an inline file through a handle" });
        }
        if data.is_empty() {
            return Ok(());
        }
        let end =
            offset.checked_add(data.len() as u64).ok_or_else(|| FileError::InvalidArgument(format!("write at {offset} overflows")))?;
        let _writing = self.shared.writes.read().await;
        let span = tracing::debug_span!("write_at", inode = %self.shared.inode, offset, len = data.len());
        self.tracked_write(self.write_chunks(offset, data).instrument(span)).await?;
        self.note_written(end);
        Ok(())
    }

    /// Runs a write of chunks, noting it for close: it counts as a write
    /// before it is sent, and a failure (it may have changed chunks past
    /// the written end) makes meta measure the length from storage at
    /// close (docs/meta.md, "File length").
    async fn tracked_write(&self, write: impl std::future::Future<Output = Result<()>>) -> Result<()> {
        self.shared.state.lock().wrote = true;
        let r = write.await;
        if r.is_err() {
            self.shared.state.lock().write_failed = true;
        }
        r
    }

    /// Data up to `end` is written through this handle: the length and the
    /// written end grow, and the periodic length report runs.
    fn note_written(&self, end: u64) {
        {
            let mut st = self.shared.state.lock();
            st.written_end = st.written_end.max(end);
            st.length = st.length.max(end);
            st.wrote = true;
        }
        self.start_reporter();
    }

    async fn write_chunks(&self, offset: u64, data: Bytes) -> Result<()> {
        let pieces = split_range(offset, data.len() as u64, self.chunk_bytes());
        let inflight = self.shared.client.config.max_inflight_chunks;
        futures::stream::iter(pieces.into_iter().map(|p| {
            let slice = data.slice(p.buf_offset as usize..(p.buf_offset + p.len) as usize);
            self.write_piece(p, slice)
        }))
        .buffer_unordered(inflight)
        .try_collect::<Vec<()>>()
        .await?;
        Ok(())
    }

    async fn write_piece(&self, p: Piece, data: Bytes) -> Result<()> {
        let chain = self.chain(p.index)?;
        let chunk = ChunkId::new(self.shared.inode, p.index);
        let client = &self.shared.client;
        let _g = client.stats.enter();
        let hint = Some(self.chunk_bytes());
        let len_bytes = data.len() as u64;
        client.storage.write_hinted(chain, chunk, p.chunk_offset, data, hint).await.map_err(|cause| FileError::Storage {
            op: "write",
            path: self.shared.path.clone(),
            chunk,
            chain,
            cause,
        })?;
        client.stats.chunks_written.fetch_add(1, Ordering::Relaxed);
        client.stats.bytes_written.fetch_add(len_bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Copies `len` bytes at `src_offset` of `src` to `dst_offset` of this
    /// file inside the cluster: the range is cut at the chunk boundaries of
    /// both files, and each piece is one storage `CopyRange` sent to the head
    /// of the destination chunk's chain, which reads the source piece from
    /// the source chunk's chain (committed data; holes and short chunks as
    /// zeros) and writes it like [`FileHandle::write_at`]. At most
    /// `max_inflight_chunks` pieces are in flight; returns once every piece
    /// is committed. The written end and length move as with `write_at`.
    ///
    /// `self` must be open for writing and `src` for reading; the source
    /// range must lie within `src.len()` (else `InvalidArgument`), and may not
    /// overlap the destination range of the same file. An inline source is
    /// read through meta and written with `write_at`; an inline destination
    /// is `Unsupported`, as for `write_at`.
    pub async fn copy_from(&self, src: &FileHandle, src_offset: u64, dst_offset: u64, len: u64) -> Result<()> {
        self.check_open(true)?;
        src.check_open(false)?;
        if self.shared.state.lock().inline {
            return Err(FileError::Unsupported { path: self.shared.path.clone(), what: "writing an inline file through a handle" });
        }
        if len == 0 {
            return Ok(());
        }
        let dst_end = self.check_copy_range(src, src_offset, dst_offset, len)?;
        if src.shared.state.lock().inline {
            let data = src.read_at(src_offset, len).await?;
            if data.len() as u64 != len {
                return Err(FileError::InvalidArgument(format!("{}: inline source shrank under the copy", src.shared.path)));
            }
            return self.write_at(dst_offset, data).await;
        }
        let _writing = self.shared.writes.read().await;
        let span =
            tracing::debug_span!("copy_from", inode = %self.shared.inode, src_inode = %src.shared.inode, src_offset, dst_offset, len);
        self.tracked_write(self.copy_chunks(src, src_offset, dst_offset, len).instrument(span)).await?;
        self.note_written(dst_end);
        Ok(())
    }

    /// Checks the ranges of a copy; returns the destination end.
    fn check_copy_range(&self, src: &FileHandle, src_offset: u64, dst_offset: u64, len: u64) -> Result<u64> {
        let overflow = |what: &str| FileError::InvalidArgument(format!("copy of {len} bytes at {what} overflows"));
        let src_end = src_offset.checked_add(len).ok_or_else(|| overflow("the source offset"))?;
        let dst_end = dst_offset.checked_add(len).ok_or_else(|| overflow("the destination offset"))?;
        let src_len = src.len();
        if src_end > src_len {
            return Err(FileError::InvalidArgument(format!(
                "copy of [{src_offset}, {src_end}) of {} reads past its length {src_len}",
                src.shared.path
            )));
        }
        if src.shared.inode == self.shared.inode && src_offset < dst_end && dst_offset < src_end {
            return Err(FileError::InvalidArgument(format!(
                "copy within {}: [{src_offset}, {src_end}) overlaps [{dst_offset}, {dst_end})",
                self.shared.path
            )));
        }
        Ok(dst_end)
    }

    async fn copy_chunks(&self, src: &FileHandle, src_offset: u64, dst_offset: u64, len: u64) -> Result<()> {
        let pieces = CopyPieces::new(src_offset, dst_offset, len, src.chunk_bytes(), self.chunk_bytes());
        let inflight = self.shared.client.config.max_inflight_chunks;
        futures::stream::iter(pieces.map(|p| self.copy_piece(src, p))).buffer_unordered(inflight).try_collect::<Vec<()>>().await?;
        Ok(())
    }

    async fn copy_piece(&self, src: &FileHandle, p: CopyPiece) -> Result<()> {
        let chain = self.chain(p.dst_index)?;
        let chunk = ChunkId::new(self.shared.inode, p.dst_index);
        let source = CopySource {
            chain_id: src.chain(p.src_index)?,
            chunk: ChunkId::new(src.shared.inode, p.src_index),
            offset_bytes: p.src_chunk_offset,
            len_bytes: u32::try_from(p.len).map_err(|_| FileError::InvalidArgument(format!("copy piece of {} bytes", p.len)))?,
        };
        let client = &self.shared.client;
        let _g = client.stats.enter();
        client
            .storage
            .copy_range(chain, chunk, p.dst_chunk_offset, source, Some(self.chunk_bytes()))
            .await
            .map_err(|cause| FileError::Storage { op: "copy", path: self.shared.path.clone(), chunk, chain, cause })?;
        client.stats.chunks_copied.fetch_add(1, Ordering::Relaxed);
        client.stats.bytes_copied.fetch_add(p.len, Ordering::Relaxed);
        Ok(())
    }

    /// Starts the periodic length report (once, after the first write).
    fn start_reporter(&self) {
        let interval_ms = self.shared.client.config.length_report_interval_ms;
        let mut slot = self.reporter.lock();
        // No session (a temp file of `create_temp`): nothing to report to.
        if interval_ms == 0 || slot.is_some() || self.shared.session == 0 {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        *slot = Some(tokio::spawn(report_loop(weak, Duration::from_millis(interval_ms))));
    }

    /// Starts renewing the temp lease of a [`FsClient::create_temp`] handle
    /// (in the slot a length reporter would use: a temp handle has none).
    /// The task stops when the handle is dropped, or once meta no longer
    /// knows the inode as a temp one (published, or reclaimed).
    fn start_temp_lease(&self) {
        let interval_ms = self.shared.client.config.temp_lease_renew_interval_ms;
        let mut slot = self.reporter.lock();
        if interval_ms == 0 || slot.is_some() {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        *slot = Some(tokio::spawn(temp_lease_loop(weak, Duration::from_millis(interval_ms))));
    }

    /// Waits for this handle's in-flight writes and reports the written end
    /// to meta (`ReportLength`: the length only grows; a concurrent truncate
    /// wins). The session stays open; `close` makes the length exact.
    pub async fn fsync(&self) -> Result<()> {
        self.check_open(true)?;
        let _quiet = self.shared.writes.write().await;
        report_length(&self.shared).await
    }

    /// Sets the length to `len` (meta removes chunks past it and shortens
    /// the last one). A longer length is materialised on storage (see
    /// `extend_last_chunk`) so that the exact length on close keeps it.
    pub async fn truncate(&self, len: u64) -> Result<()> {
        self.check_open(true)?;
        let _quiet = self.shared.writes.write().await;
        let old_len = self.len();
        let session = self.shared.session;
        let inode = self.shared.client.meta.truncate(self.shared.inode, len, session).await.map_err(|e| self.meta_err("truncate", e))?;
        {
            let mut st = self.shared.state.lock();
            st.length = inode.size_bytes();
            st.written_end = st.written_end.min(len);
            st.reported_end = st.reported_end.min(len);
            if let Some(f) = inode.file() {
                st.truncate_version = f.truncate_version;
                st.inline = f.inline.is_some();
            }
        }
        if len > old_len && !self.shared.state.lock().inline {
            self.extend_last_chunk(len).await?;
            let mut st = self.shared.state.lock();
            st.written_end = st.written_end.max(len);
        }
        Ok(())
    }

    /// Makes the chunk holding byte `len - 1` at least that long (a storage
    /// truncate zero-extends, creating a missing chunk, and never cuts
    /// here: meta already removed everything past `len`), so the exact
    /// length meta computes from storage on close is `len`.
    async fn extend_last_chunk(&self, len: u64) -> Result<()> {
        let chunk_bytes = self.chunk_bytes();
        let index = (len - 1) / chunk_bytes;
        let chain = self.chain(index)?;
        let chunk = ChunkId::new(self.shared.inode, index);
        let tail = (len - 1) % chunk_bytes + 1;
        self.shared.client.storage.truncate(chain, chunk, tail).await.map_err(|cause| FileError::Storage {
            op: "extend",
            path: self.shared.path.clone(),
            chunk,
            chain,
            cause,
        })?;
        Ok(())
    }

    /// Ends the handle: stops the length reports and, for a writer, reports
    /// the written end and closes the write session (meta fixes the exact
    /// length from storage).
    /// Returns the file's length after close.
    pub async fn close(mut self) -> Result<u64> {
        self.stop_reporter();
        self.closed = true;
        if self.shared.session == 0 {
            return Ok(self.len());
        }
        let _quiet = self.shared.writes.write().await;
        // Report first: it grows the file's dyn_stripe, so meta's exact-length
        // scan on Close reaches the chains of chunks written far out.
        report_length(&self.shared).await?;
        let end = {
            let st = self.shared.state.lock();
            CloseEnd {
                length_hint: Some(st.written_end),
                truncate_version: st.truncate_version,
                wrote: st.wrote,
                writes_settled: st.wrote && !st.write_failed,
            }
        };
        let inode =
            self.shared.client.meta.close(self.shared.inode, self.shared.session, end).await.map_err(|e| self.meta_err("close", e))?;
        let len = inode.size_bytes();
        self.shared.state.lock().length = len;
        Ok(len)
    }

    fn stop_reporter(&self) {
        if let Some(task) = self.reporter.lock().take() {
            task.abort();
        }
    }
}

/// The close a never-written write handle still owes meta
/// ([`FileHandle::into_quiet_close`]): it only ends the session.
#[derive(Clone, Debug)]
pub struct QuietClose {
    pub inode: InodeId,
    pub session: u64,
    pub end: CloseEnd,
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        self.stop_reporter();
        if !self.closed && self.shared.session != 0 {
            tracing::debug!(inode = %self.shared.inode, path = %self.shared.path, "write handle dropped without close; length stays as last reported");
        }
    }
}

/// Reports the written end if it grew since the last report.
async fn report_length(shared: &Shared) -> Result<()> {
    let (end, version) = {
        let st = shared.state.lock();
        if st.written_end <= st.reported_end {
            return Ok(());
        }
        (st.written_end, st.truncate_version)
    };
    let inode = shared.client.meta.report_length(shared.inode, end, version).await.map_err(|cause| FileError::Meta {
        op: "report length",
        path: shared.path.clone(),
        cause,
    })?;
    let mut st = shared.state.lock();
    // A truncate that overtook this report (the handle saw it, or meta's
    // reply shows it) makes the reply's length stale: it must not prop the
    // handle's length back up.
    let same_epoch = st.truncate_version == version && inode.file().is_some_and(|f| f.truncate_version == version);
    if same_epoch {
        st.reported_end = st.reported_end.max(end);
        st.length = st.length.max(inode.size_bytes());
    }
    Ok(())
}

async fn temp_lease_loop(weak: Weak<Shared>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(shared) = weak.upgrade() else { return };
        match shared.client.meta.renew_temp(shared.inode).await {
            Ok(()) => {}
            Err(e) if e.code() == fskv_types::ErrorCode::NotFound => {
                tracing::debug!(inode = %shared.inode, "temp lease ended (published or reclaimed)");
                return;
            }
            Err(e) => tracing::warn!(inode = %shared.inode, error = %e, "temp lease renewal failed; will retry"),
        }
    }
}

async fn report_loop(weak: Weak<Shared>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(shared) = weak.upgrade() else { return };
        if let Err(e) = report_length(&shared).await {
            tracing::warn!(inode = %shared.inode, error = %e, "periodic length report failed; will retry");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_range_cuts_at_chunk_boundaries() {
        let p = split_range(10, 30, 16);
        let got: Vec<(u64, u64, u64, u64)> = p.iter().map(|p| (p.index, p.chunk_offset, p.len, p.buf_offset)).collect();
        assert_eq!(got, vec![(0, 10, 6, 0), (1, 0, 16, 6), (2, 0, 8, 22)]);
        assert!(split_range(5, 0, 16).is_empty());
        assert_eq!(split_range(32, 16, 16).len(), 1);
    }

    #[test]
    fn copy_pieces_cut_at_the_boundaries_of_both_files() {
        // Source chunks of 10, destination chunks of 4: src [7, 25) -> dst [2, 20).
        let got: Vec<(u64, u64, u64, u64, u64)> =
            CopyPieces::new(7, 2, 18, 10, 4).map(|p| (p.src_index, p.src_chunk_offset, p.dst_index, p.dst_chunk_offset, p.len)).collect();
        assert_eq!(
            got,
            vec![(0, 7, 0, 2, 2), (0, 9, 1, 0, 1), (1, 0, 1, 1, 3), (1, 3, 2, 0, 4), (1, 7, 3, 0, 3), (2, 0, 3, 3, 1), (2, 1, 4, 0, 4)]
        );
        assert_eq!(got.iter().map(|p| p.4).sum::<u64>(), 18);
        assert_eq!(CopyPieces::new(0, 0, 0, 4, 4).count(), 0);
        assert_eq!(CopyPieces::new(4, 8, 8, 4, 4).count(), 2);
    }
}
