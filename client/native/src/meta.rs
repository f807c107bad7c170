//! Meta client: typed metadata calls with failover between meta servers.
//!
//! * Every request carries this client's random `client_id` and a fresh
//!   `request_id`; a retry of the same call reuses both, so the server's
//!   idempotency record returns the first result of a create/rename/unlink
//!   whose reply was lost.
//! * The first server tried is chosen by the hash of the op's routing inode
//!   (the parent directory for namespace ops, the file for length reports), so
//!   ops on one inode meet on one server and are batched there; on a retryable
//!   error (connection failed, deadline, overloaded, KV conflict) the next
//!   server in the list is tried, up to `max_attempts`.

use bytes::Bytes;
use fskv_proto::meta::*;
use fskv_rpc::{CallOptions, ClientConfig, RpcClient, RpcError, TcpTransport};
use fskv_types::{ErrorCode, InodeId, Status};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a closing write handle reports (see [`MetaOp::Close`]). A caller
/// that wrote chunks itself must say so (`wrote`): with `wrote` false and
/// no other writer open, meta keeps the stored length without looking at
/// storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CloseEnd {
    /// The furthest byte written through the handle.
    pub length_hint: Option<u64>,
    /// The file's truncate version the handle last saw.
    pub truncate_version: u64,
    /// Whether the handle attempted a write.
    pub wrote: bool,
    /// Whether every write of the handle succeeded (`length_hint` is then
    /// exactly where they end).
    pub writes_settled: bool,
}

/// The client's single error type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaClientError {
    /// The server answered with an error (e.g. NotFound, AlreadyExists).
    #[error("meta error {0}")]
    Status(Status),
    /// Every attempt failed at the RPC level; the last error.
    #[error("meta rpc failed after {attempts} attempts: {last}")]
    Unavailable { attempts: u32, last: RpcError },
    #[error("meta client misconfigured: {0}")]
    Config(String),
    /// The server answered with a reply of the wrong kind (a version mismatch).
    #[error("unexpected reply to {op}: {reply}")]
    UnexpectedReply { op: &'static str, reply: String },
}

impl MetaClientError {
    pub fn code(&self) -> ErrorCode {
        match self {
            MetaClientError::Status(s) => s.code,
            MetaClientError::Unavailable { last, .. } => last.code(),
            MetaClientError::Config(_) => ErrorCode::InvalidArgument,
            MetaClientError::UnexpectedReply { .. } => ErrorCode::Internal,
        }
    }
}

pub type Result<T, E = MetaClientError> = std::result::Result<T, E>;

#[derive(Clone, Debug)]
pub struct MetaClientConfig {
    /// Addresses of the meta servers (`host:port`).
    pub servers: Vec<String>,
    /// Identity used for permission checks.
    pub user: UserInfo,
    pub call_timeout_ms: u64,
    /// Attempts per call across all servers.
    pub max_attempts: u32,
    /// Pause before a retry; doubles per attempt up to 8x.
    pub retry_backoff_ms: u64,
    pub rpc: ClientConfig,
    /// Send changes as `relaxed` (see [`MetaClient::with_relaxed_durability`]).
    pub relaxed: bool,
    /// Owner of every inode created (`MetaRequest::owner`; see [`MetaClient::with_owner`]).
    pub owner: Option<NewOwner>,
}

impl MetaClientConfig {
    pub fn new(servers: Vec<String>) -> Self {
        MetaClientConfig {
            servers,
            user: UserInfo::root(),
            call_timeout_ms: 10_000,
            max_attempts: 8,
            retry_backoff_ms: 5,
            rpc: ClientConfig::default(),
            relaxed: false,
            owner: None,
        }
    }
}

/// A cheap-to-clone metadata client.
#[derive(Clone)]
pub struct MetaClient {
    rpc: RpcClient,
    cfg: Arc<MetaClientConfig>,
    client_id: u64,
    next_request_id: Arc<AtomicU64>,
}

fn route_hash(inode: InodeId) -> u64 {
    // SplitMix64 finalizer: spreads consecutive ids.
    SplitMix64::new(inode.0).next_u64()
}

impl MetaClient {
    pub fn new(cfg: MetaClientConfig) -> Result<Self> {
        if cfg.servers.is_empty() {
            return Err(MetaClientError::Config("no meta server address".into()));
        }
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), cfg.rpc.clone());
        let client_id = rand::random::<u64>() | 1;
        Ok(MetaClient { rpc, cfg: Arc::new(cfg), client_id, next_request_id: Arc::new(AtomicU64::new(1)) })
    }

    /// A client over a given RPC client (the simulation's transport) with a
    /// given client id (request ids restart at 1: the id must be new).
    pub fn over(rpc: RpcClient, cfg: MetaClientConfig, client_id: u64) -> Result<Self> {
        if cfg.servers.is_empty() {
            return Err(MetaClientError::Config("no meta server address".into()));
        }
        Ok(MetaClient { rpc, cfg: Arc::new(cfg), client_id, next_request_id: Arc::new(AtomicU64::new(1)) })
    }

    /// The same client acting as another user (shares connections and client id).
    pub fn with_user(&self, user: UserInfo) -> Self {
        let mut cfg = (*self.cfg).clone();
        cfg.user = user;
        MetaClient { rpc: self.rpc.clone(), cfg: Arc::new(cfg), client_id: self.client_id, next_request_id: self.next_request_id.clone() }
    }

    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// A request for `op` with a fresh request id.
    pub fn request(&self, op: MetaOp) -> MetaRequest {
        MetaRequest {
            client_id: self.client_id,
            request_id: self.next_request_id.fetch_add(1, Ordering::Relaxed),
            user: self.cfg.user.clone(),
            op,
            relaxed: self.cfg.relaxed,
            owner: self.cfg.owner,
        }
    }

    /// The same client with every inode it creates owned by `owner` (set by
    /// meta in the creating transaction; meta accepts it only from a client
    /// acting as uid 0). The gateways use one per request of a tenant.
    pub fn with_owner(&self, owner: Option<NewOwner>) -> Self {
        let mut cfg = (*self.cfg).clone();
        cfg.owner = owner;
        MetaClient { rpc: self.rpc.clone(), cfg: Arc::new(cfg), client_id: self.client_id, next_request_id: self.next_request_id.clone() }
    }

    /// The same client with every change sent as `relaxed` (acknowledged
    /// before it is fsync'ed; see [`MetaRequest`]): the FUSE mount's mode.
    /// [`MetaClient::sync`] is its barrier.
    pub fn with_relaxed_durability(&self) -> Self {
        let mut cfg = (*self.cfg).clone();
        cfg.relaxed = true;
        MetaClient { rpc: self.rpc.clone(), cfg: Arc::new(cfg), client_id: self.client_id, next_request_id: self.next_request_id.clone() }
    }

    /// Makes every change meta acknowledged so far durable: a barrier on
    /// every meta server (each syncs its engine). Fails only if no server
    /// answered; a server that is down kept its acknowledged changes in its
    /// log (they survive a process crash) and syncs them when it restarts.
    pub async fn sync(&self) -> Result<()> {
        let opts = CallOptions { timeout_ms: self.cfg.call_timeout_ms };
        let calls = self.cfg.servers.iter().map(|server| {
            let rpc = self.rpc.clone();
            async move { rpc.call::<MetaSyncCall>(server, &SyncRequest {}, Bytes::new(), opts).await }
        });
        let mut last = None;
        let mut ok = false;
        for r in futures::future::join_all(calls).await {
            match r {
                Ok(_) => ok = true,
                Err(e) => last = Some(e),
            }
        }
        match last {
            Some(RpcError::Remote(s)) if !ok => Err(MetaClientError::Status(s)),
            Some(e) if !ok => Err(MetaClientError::Unavailable { attempts: 1, last: e }),
            _ => Ok(()),
        }
    }

    /// Sends `op`, failing over between servers on retryable errors.
    pub async fn call(&self, op: MetaOp) -> Result<MetaReply> {
        let req = self.request(op);
        self.send(&req).await
    }

    /// Sends a prepared request (retries reuse its request id).
    pub async fn send(&self, req: &MetaRequest) -> Result<MetaReply> {
        let start = route_hash(req.op.routing_inode());
        self.with_failover(start, |addr| {
            let rpc = self.rpc.clone();
            let opts = CallOptions { timeout_ms: self.cfg.call_timeout_ms };
            async move { rpc.call::<MetaCall>(&addr, req, Bytes::new(), opts).await.map(|(r, _)| r) }
        })
        .await
    }

    /// Several independent ops in one round trip; one result per op.
    pub async fn batch(&self, ops: Vec<MetaOp>) -> Result<Vec<Result<MetaReply, Status>>> {
        let req = MetaBatchRequest { requests: ops.into_iter().map(|op| self.request(op)).collect() };
        let start = req.requests.first().map(|r| route_hash(r.op.routing_inode())).unwrap_or(0);
        let resp = self
            .with_failover(start, |addr| {
                let rpc = self.rpc.clone();
                let req = &req;
                let opts = CallOptions { timeout_ms: self.cfg.call_timeout_ms };
                async move { rpc.call::<MetaBatchCall>(&addr, req, Bytes::new(), opts).await.map(|(r, _)| r) }
            })
            .await?;
        Ok(resp.results)
    }

    async fn with_failover<T, F, Fut>(&self, start: u64, mut attempt_fn: F) -> Result<T>
    where
        F: FnMut(String) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, RpcError>>,
    {
        let n = self.cfg.servers.len() as u64;
        let attempts = self.cfg.max_attempts.max(1);
        let mut last = None;
        for attempt in 0..attempts {
            let idx = ((start % n) + u64::from(attempt)) % n;
            let addr = self.cfg.servers.get(idx as usize).cloned().unwrap_or_default();
            match attempt_fn(addr.clone()).await {
                Ok(v) => return Ok(v),
                Err(RpcError::Remote(s)) if !s.is_retryable() => return Err(MetaClientError::Status(s)),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(%addr, attempt, error = %e, "meta call failed; trying the next server");
                    last = Some(e);
                    let backoff = self.cfg.retry_backoff_ms << attempt.min(3);
                    tokio::time::sleep(Duration::from_millis(backoff)).await;
                }
                Err(e) => return Err(MetaClientError::Unavailable { attempts: attempt + 1, last: e }),
            }
        }
        let last = last.unwrap_or(RpcError::ShuttingDown);
        Err(MetaClientError::Unavailable { attempts, last })
    }

    // ----- typed wrappers -----

    async fn inode(&self, op: MetaOp, name: &'static str) -> Result<Inode> {
        match self.call(op).await? {
            MetaReply::Inode(i) => Ok(i),
            MetaReply::Opened { inode, .. } => Ok(inode),
            other => Err(unexpected(name, &other)),
        }
    }

    async fn done(&self, op: MetaOp, name: &'static str) -> Result<()> {
        match self.call(op).await? {
            MetaReply::Done => Ok(()),
            other => Err(unexpected(name, &other)),
        }
    }

    /// Ops that commit together or not at all ([`MetaOp::Txn`]); the reply
    /// of each, in order.
    pub async fn txn(&self, ops: Vec<MetaOp>) -> Result<Vec<MetaReply>> {
        match self.call(MetaOp::Txn { ops }).await? {
            MetaReply::Many(replies) => Ok(replies),
            other => Err(unexpected("txn", &other)),
        }
    }

    pub async fn lookup(&self, parent: InodeId, name: &str) -> Result<Inode> {
        self.inode(MetaOp::Lookup { parent, name: name.into() }, "lookup").await
    }

    /// [`MetaOp::LookupXattr`]: `parent/name` and its attribute `xattr`
    /// (`None` when it has none) in one round trip.
    pub async fn lookup_xattr(&self, parent: InodeId, name: &str, xattr: &str) -> Result<(Inode, Option<Vec<u8>>)> {
        match self.call(MetaOp::LookupXattr { parent, name: name.into(), xattr: xattr.into() }).await? {
            MetaReply::InodeXattr { inode, value } => Ok((inode, value)),
            other => Err(unexpected("lookup_xattr", &other)),
        }
    }

    /// [`MetaOp::WalkXattr`]: the inodes of `names` walked down from
    /// `parent` (fewer when the walk stopped early) and the last one's
    /// attribute `xattr`, in one round trip.
    pub async fn walk_xattr(&self, parent: InodeId, names: Vec<String>, xattr: &str) -> Result<(Vec<Inode>, Option<Vec<u8>>)> {
        match self.call(MetaOp::WalkXattr { parent, names, xattr: xattr.into() }).await? {
            MetaReply::Walk { inodes, value } => Ok((inodes, value)),
            other => Err(unexpected("walk_xattr", &other)),
        }
    }

    pub async fn stat(&self, inode: InodeId) -> Result<Inode> {
        self.inode(MetaOp::Stat { inode }, "stat").await
    }

    /// Resolves a `/`-separated path from the root by successive lookups
    /// (symlinks are not followed).
    pub async fn resolve(&self, path: &str) -> Result<Inode> {
        let mut cur = self.stat(InodeId::ROOT).await?;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            cur = self.lookup(cur.id, part).await?;
        }
        Ok(cur)
    }

    pub async fn create(&self, parent: InodeId, name: &str, mode: u32, exclusive: bool) -> Result<Inode> {
        self.inode(MetaOp::Create { parent, name: name.into(), mode, exclusive, write: false }, "create").await
    }

    /// Creates (or opens) a file for writing: the inode and a write session.
    pub async fn create_for_write(&self, parent: InodeId, name: &str, mode: u32, exclusive: bool) -> Result<(Inode, u64)> {
        match self.call(MetaOp::Create { parent, name: name.into(), mode, exclusive, write: true }).await? {
            MetaReply::Opened { inode, session } => Ok((inode, session)),
            other => Err(unexpected("create", &other)),
        }
    }

    /// Opens; with `write` returns a write session id, else 0.
    pub async fn open(&self, inode: InodeId, write: bool) -> Result<(Inode, u64)> {
        match self.call(MetaOp::Open { inode, write }).await? {
            MetaReply::Opened { inode, session } => Ok((inode, session)),
            MetaReply::Inode(i) => Ok((i, 0)),
            other => Err(unexpected("open", &other)),
        }
    }

    /// Ends write session `session` (see [`MetaOp::Close`]).
    pub async fn close(&self, inode: InodeId, session: u64, end: CloseEnd) -> Result<Inode> {
        let op = MetaOp::Close {
            inode,
            session,
            length_hint: end.length_hint,
            truncate_version: end.truncate_version,
            wrote: end.wrote,
            writes_settled: end.writes_settled,
        };
        self.inode(op, "close").await
    }

    /// Ends several write sessions in one round trip (each its own
    /// [`MetaOp::Close`]); one result per close, in order.
    pub async fn close_many(&self, closes: &[(InodeId, u64, CloseEnd)]) -> Result<Vec<Result<(), Status>>> {
        let ops = closes
            .iter()
            .map(|(inode, session, end)| MetaOp::Close {
                inode: *inode,
                session: *session,
                length_hint: end.length_hint,
                truncate_version: end.truncate_version,
                wrote: end.wrote,
                writes_settled: end.writes_settled,
            })
            .collect();
        let results = self.batch(ops).await?;
        Ok(results.into_iter().map(|r| r.map(|_| ())).collect())
    }

    pub async fn mkdir(&self, parent: InodeId, name: &str, mode: u32) -> Result<Inode> {
        self.mkdir_with_xattrs(parent, name, mode, Vec::new()).await
    }

    /// A directory created with its extended attributes, in one transaction.
    pub async fn mkdir_with_xattrs(&self, parent: InodeId, name: &str, mode: u32, xattrs: Vec<(String, Vec<u8>)>) -> Result<Inode> {
        self.inode(MetaOp::Mkdir { parent, name: name.into(), mode, xattrs }, "mkdir").await
    }

    pub async fn rmdir(&self, parent: InodeId, name: &str) -> Result<()> {
        self.done(MetaOp::Rmdir { parent, name: name.into() }, "rmdir").await
    }

    pub async fn unlink(&self, parent: InodeId, name: &str) -> Result<()> {
        self.done(MetaOp::Unlink { parent, name: name.into() }, "unlink").await
    }

    /// Unlinks `parent/name` only if `expected` holds (else `PreconditionFailed`).
    pub async fn unlink_expected(&self, parent: InodeId, name: &str, expected: Expected) -> Result<()> {
        self.done(MetaOp::UnlinkExpected { parent, name: name.into(), expected }, "unlink_expected").await
    }

    pub async fn rename(&self, src_parent: InodeId, src_name: &str, dst_parent: InodeId, dst_name: &str) -> Result<()> {
        let op = MetaOp::Rename { src_parent, src_name: src_name.into(), dst_parent, dst_name: dst_name.into() };
        self.done(op, "rename").await
    }

    pub async fn symlink(&self, parent: InodeId, name: &str, target: &str) -> Result<Inode> {
        self.inode(MetaOp::Symlink { parent, name: name.into(), target: target.into() }, "symlink").await
    }

    /// Makes a FIFO, socket or device node (`rdev` for devices; root only).
    pub async fn mknod(&self, parent: InodeId, name: &str, mode: u32, kind: SpecialKind, rdev: u64) -> Result<Inode> {
        self.inode(MetaOp::Mknod { parent, name: name.into(), mode, kind, rdev }, "mknod").await
    }

    pub async fn readlink(&self, inode: InodeId) -> Result<String> {
        match self.call(MetaOp::Readlink { inode }).await? {
            MetaReply::Target(t) => Ok(t),
            other => Err(unexpected("readlink", &other)),
        }
    }

    pub async fn link(&self, inode: InodeId, parent: InodeId, name: &str) -> Result<Inode> {
        self.inode(MetaOp::Link { inode, parent, name: name.into() }, "link").await
    }

    /// One page of entries after `start_after`; `more` says whether to ask again.
    pub async fn readdir(&self, dir: InodeId, start_after: &str, limit: u32, with_attrs: bool) -> Result<(Vec<DirEntry>, bool)> {
        match self.call(MetaOp::Readdir { dir, start_after: start_after.into(), limit, with_attrs }).await? {
            MetaReply::Entries { entries, more } => Ok((entries, more)),
            other => Err(unexpected("readdir", &other)),
        }
    }

    pub async fn setattr(&self, inode: InodeId, attr: SetAttr) -> Result<Inode> {
        self.inode(MetaOp::SetAttr { inode, attr }, "setattr").await
    }

    /// Sets the length; `session` (0 = none) is an open write session of
    /// this client on the inode, which stands for the write permission.
    pub async fn truncate(&self, inode: InodeId, length: u64, session: u64) -> Result<Inode> {
        self.inode(MetaOp::Truncate { inode, length, session }, "truncate").await
    }

    pub async fn report_length(&self, inode: InodeId, length: u64, truncate_version: u64) -> Result<Inode> {
        self.inode(MetaOp::ReportLength { inode, length, truncate_version }, "report_length").await
    }

    pub async fn get_xattr(&self, inode: InodeId, name: &str) -> Result<Vec<u8>> {
        match self.call(MetaOp::GetXattr { inode, name: name.into() }).await? {
            MetaReply::Xattr(v) => Ok(v),
            other => Err(unexpected("get_xattr", &other)),
        }
    }

    pub async fn set_xattr(&self, inode: InodeId, name: &str, value: &[u8], flag: XattrFlag) -> Result<()> {
        self.done(MetaOp::SetXattr { inode, name: name.into(), value: value.to_vec(), flag }, "set_xattr").await
    }

    pub async fn list_xattr(&self, inode: InodeId) -> Result<Vec<String>> {
        match self.call(MetaOp::ListXattr { inode }).await? {
            MetaReply::XattrNames(v) => Ok(v),
            other => Err(unexpected("list_xattr", &other)),
        }
    }

    pub async fn remove_xattr(&self, inode: InodeId, name: &str) -> Result<()> {
        self.done(MetaOp::RemoveXattr { inode, name: name.into() }, "remove_xattr").await
    }

    pub async fn statfs(&self) -> Result<StatFs> {
        match self.call(MetaOp::StatFs).await? {
            MetaReply::StatFs(s) => Ok(s),
            other => Err(unexpected("statfs", &other)),
        }
    }

    pub async fn remove_tree(&self, parent: InodeId, name: &str) -> Result<()> {
        self.done(MetaOp::RemoveTree { parent, name: name.into() }, "remove_tree").await
    }

    pub async fn create_unlinked(&self, parent: InodeId, mode: u32) -> Result<Inode> {
        self.inode(MetaOp::CreateUnlinked { parent, mode }, "create_unlinked").await
    }

    /// Renews the lease of an unpublished temp inode (see [`MetaOp::RenewTemp`]).
    pub async fn renew_temp(&self, inode: InodeId) -> Result<()> {
        self.done(MetaOp::RenewTemp { inode }, "renew_temp").await
    }

    pub async fn write_inline(&self, inode: InodeId, offset: u64, data: &[u8]) -> Result<Inode> {
        self.inode(MetaOp::WriteInline { inode, offset, data: data.to_vec() }, "write_inline").await
    }

    pub async fn read_inline(&self, inode: InodeId, offset: u64, len: u32) -> Result<Vec<u8>> {
        match self.call(MetaOp::ReadInline { inode, offset, len }).await? {
            MetaReply::Data(d) => Ok(d),
            other => Err(unexpected("read_inline", &other)),
        }
    }

    pub async fn replace(
        &self,
        parent: InodeId,
        name: &str,
        inode: InodeId,
        expected: Option<Expected>,
        attrs: PublishAttrs,
    ) -> Result<Inode> {
        self.inode(MetaOp::Replace { parent, name: name.into(), inode, expected, attrs }, "replace").await
    }

    pub async fn create_write_publish(
        &self,
        parent: InodeId,
        name: &str,
        mode: u32,
        data: &[u8],
        expected: Option<Expected>,
        attrs: PublishAttrs,
    ) -> Result<Inode> {
        let op = MetaOp::CreateWritePublish { parent, name: name.into(), mode, data: data.to_vec(), expected, attrs };
        self.inode(op, "create_write_publish").await
    }

    /// Replaces the bytes of the inline file `parent/name` in place if it is
    /// `expected` (`meta.OverwriteInline`): same inode, a higher version.
    /// `Unsupported` when the file keeps its bytes in chunks.
    pub async fn overwrite_inline(&self, parent: InodeId, name: &str, expected: (InodeId, u64), data: &[u8]) -> Result<Inode> {
        let op = MetaOp::OverwriteInline { parent, name: name.into(), inode: expected.0, version: expected.1, data: data.to_vec() };
        self.inode(op, "overwrite_inline").await
    }
}

fn unexpected(op: &'static str, reply: &MetaReply) -> MetaClientError {
    let mut text = format!("{reply:?}");
    text.truncate(200);
    MetaClientError::UnexpectedReply { op, reply: text }
}

impl MetaClient {
    /// A chunk capability for `inode` bound to this client's principal
    /// (`meta.IssueCap`; docs/security.md): read, or read-write with `write`;
    /// meta checks the acting user's permission as `open` does.
    pub async fn issue_cap(&self, inode: InodeId, write: bool) -> Result<fskv_proto::cap::ChunkCap> {
        let req = CapRequest { inode, write, user: self.cfg.user.clone() };
        let reply = self
            .with_failover(route_hash(inode), |addr| {
                let rpc = self.rpc.clone();
                let req = &req;
                let opts = CallOptions { timeout_ms: self.cfg.call_timeout_ms };
                async move { rpc.call::<MetaIssueCap>(&addr, req, Bytes::new(), opts).await.map(|(r, _)| r) }
            })
            .await?;
        Ok(reply.cap)
    }

    /// Runs the consistency check of the namespace on one meta server (the
    /// first that answers; read-only, so a retry elsewhere is safe).
    /// `timeout_ms` bounds each attempt: a large namespace takes long.
    pub async fn fsck(&self, req: &FsckRequest, timeout_ms: u64) -> Result<FsckReply> {
        self.with_failover(route_hash(InodeId::ROOT), |addr| {
            let rpc = self.rpc.clone();
            let opts = CallOptions { timeout_ms };
            async move { rpc.call::<MetaFsckCall>(&addr, req, Bytes::new(), opts).await.map(|(r, _)| r) }
        })
        .await
    }
}
