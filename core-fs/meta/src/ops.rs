//! Every metadata operation as a function over one KV transaction.
//!
//! Nothing here commits, allocates ids or talks to storage: the caller
//! ([`crate::service`]) prepares what an op needs before the transaction
//! ([`Prepared`]: new inode id, layout seed, session id, exact length, capacity)
//! and commits after. So every op can be tested on a bare transaction.
//!
//! Reads whose change must abort the op are plain (conflict-adding) reads:
//! the parent directory inode, the entry being created/removed/replaced, the
//! emptiness range of a directory being removed, and every ancestor walked by
//! a directory rename's cycle check.

use crate::error::{MetaError, MetaResult};
use crate::perm::{self, EXEC, READ, WRITE};
use crate::schema::*;
use fskv_kv::{key_after, prefix_end, RangeRequest, Transaction};
use fskv_proto::meta::*;
use fskv_types::{ChainId, InodeId};

/// Limits and layout settings of a meta server.
#[derive(Clone, Debug)]
pub struct MetaConfig {
    /// The chain table new files stripe over (id, version, chains).
    pub chain_table_id: u32,
    pub chain_table_version: u32,
    pub chains: Vec<ChainId>,
    /// Layout of the root directory, inherited by everything below.
    pub root_layout: LayoutPolicy,
    pub inline_max_bytes: usize,
    /// Deepest directory nesting walked by a rename's cycle check.
    pub max_path_depth: usize,
    /// How long idempotency records are kept.
    pub idempotency_ttl_ms: u64,
    /// How long an unpublished CreateUnlinked inode lives.
    pub temp_inode_ttl_ms: u64,
    /// A write session older than this no longer blocks GC of an unlinked file.
    pub session_ttl_ms: u64,
    /// Pause between GC passes.
    pub gc_interval_ms: u64,
    /// Per-inode batch queues (0 disables batching).
    pub batch_shards: usize,
    /// Most ops committed in one batch transaction.
    pub max_batch_ops: usize,
    /// Batch transactions of one queue committing at once.
    pub batch_groups_in_flight: usize,
    /// Seed of the server's random choices (inode id shards, layout seeds
    /// and round-robin start, session ids, retry jitter); `None`: from the
    /// OS. A deterministic simulation sets it.
    pub rng_seed: Option<u64>,
    /// The wall clock (ns since the epoch) of mtimes and ctimes, session
    /// and temporary-inode expiry and idempotency expiry; `None`: the
    /// system clock. A deterministic simulation sets its simulated time.
    pub wall_clock_ns: Option<fn() -> u64>,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            chain_table_id: 1,
            chain_table_version: 1,
            chains: (1..=64).map(ChainId).collect(),
            root_layout: LayoutPolicy { table_id: 1, table_version: 1, chunk_size_bytes: 512 << 10, stripe_size: 16 },
            inline_max_bytes: DEFAULT_INLINE_MAX_BYTES,
            max_path_depth: 4096,
            idempotency_ttl_ms: 10 * 60 * 1000,
            temp_inode_ttl_ms: 60 * 60 * 1000,
            session_ttl_ms: 24 * 60 * 60 * 1000,
            gc_interval_ms: 1000,
            batch_shards: 8,
            max_batch_ops: 64,
            batch_groups_in_flight: 4,
            rng_seed: None,
            wall_clock_ns: None,
        }
    }
}

impl MetaConfig {
    /// Now on [`MetaConfig::wall_clock_ns`].
    pub fn now_ns(&self) -> u64 {
        self.wall_clock_ns.map_or_else(crate::gc::now_ns, |clock| clock())
    }

    /// The defaults, with new files striped over mgmtd's chain table
    /// `table` (id, version, chains) at the default stripe, or fewer when
    /// the table has fewer chains.
    pub fn over_chain_table(table: &fskv_proto::routing::ChainTable) -> MetaConfig {
        let defaults = MetaConfig::default();
        let chains = u32::try_from(table.chains.len()).unwrap_or(u32::MAX);
        MetaConfig {
            chain_table_id: table.table_id,
            chain_table_version: table.table_version,
            chains: table.chains.clone(),
            root_layout: LayoutPolicy {
                table_id: table.table_id,
                table_version: table.table_version,
                stripe_size: defaults.root_layout.stripe_size.min(chains),
                ..defaults.root_layout
            },
            ..defaults
        }
    }
}

/// What an op needs that is decided outside its transaction.
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    pub now_ns: u64,
    /// Id for a new inode (ops that create one).
    pub new_id: Option<InodeId>,
    pub seed: u64,
    /// Round-robin start in the chain table.
    pub layout_start: u64,
    /// Id of a write session opened by this op.
    pub session: u64,
    /// Close: the exact length computed from storage, and the file's
    /// truncate version it was computed at.
    pub exact_length: Option<(u64, u64)>,
    /// StatFs: (capacity, used) bytes.
    pub capacity: (u64, u64),
    /// Least version an in-place overwrite sets ([`overwrite_inline`]):
    /// `boot << 40`, where `boot` counts this server's starts (a synced
    /// counter, bumped before the first request). A relaxed change that
    /// power loss takes was issued in an earlier boot, below this floor, so
    /// no (inode, version) pair names two contents. Holds while an inode
    /// sees fewer than 2^40 changes in one boot.
    pub version_floor: u64,
}

/// Everything an op runs with.
pub struct OpCtx<'a> {
    pub cfg: &'a MetaConfig,
    pub user: &'a UserInfo,
    pub client_id: u64,
    pub prep: &'a Prepared,
    /// Owner of the inodes the op creates (`MetaRequest::owner`); only for
    /// a uid-0 user, checked in [`new_inode`].
    pub owner: Option<NewOwner>,
}

// ---------- small helpers ----------

pub fn check_name(name: &str) -> MetaResult<()> {
    if name.len() > MAX_NAME_BYTES {
        return Err(MetaError::NameTooLong { len: name.len(), limit: MAX_NAME_BYTES });
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(MetaError::InvalidArgument(format!("invalid name {name:?}")));
    }
    Ok(())
}

pub async fn load_inode_opt(txn: &mut dyn Transaction, id: InodeId) -> MetaResult<Option<Inode>> {
    let key = inode_key(id);
    match txn.get(&key).await? {
        Some(raw) => {
            let mut inode = decode(&key, &raw)?;
            merge_dir_time(txn, &mut inode).await?;
            Ok(Some(inode))
        }
        None => Ok(None),
    }
}

/// Records a namespace change in `dir` (an entry added, removed or renamed):
/// its mtime and ctime become at least `now_ns`. A blind atomic max on the
/// directory's `DTIM` key, so concurrent creates in one directory do not
/// conflict (the directory's inode record is only read).
/// `dir` is the directory as this transaction loaded it (times folded in):
/// when both its mtime and ctime are already within
/// [`DIR_TIME_GRANULARITY_NS`] of `now_ns`, nothing is written (Linux's
/// own file times move at the coarse clock's granularity, 1–4 ms).
fn touch_dir(txn: &mut dyn Transaction, dir: &Inode, now_ns: u64) -> MetaResult<()> {
    let oldest = dir.mtime_ns.min(dir.ctime_ns);
    if oldest <= now_ns && now_ns - oldest < DIR_TIME_GRANULARITY_NS {
        return Ok(());
    }
    txn.atomic_max(&dir_time_key(dir.id), now_ns)?;
    Ok(())
}

/// How stale a directory's mtime/ctime may be left by a namespace change
/// (see [`touch_dir`]): saves a write per create in a busy directory.
pub const DIR_TIME_GRANULARITY_NS: u64 = 1_000_000;

/// Folds a directory's `DTIM` time into its inode's mtime and ctime (a
/// snapshot read: reading a directory's times never conflicts with creates).
pub async fn merge_dir_time(txn: &mut dyn Transaction, inode: &mut Inode) -> MetaResult<()> {
    if inode.dir().is_none() {
        return Ok(());
    }
    let key = dir_time_key(inode.id);
    if let Some(raw) = txn.snapshot_get(&key).await? {
        let t = decode_i64(&key, &raw)? as u64;
        inode.mtime_ns = inode.mtime_ns.max(t);
        inode.ctime_ns = inode.ctime_ns.max(t);
    }
    Ok(())
}

pub async fn load_inode(txn: &mut dyn Transaction, id: InodeId) -> MetaResult<Inode> {
    load_inode_opt(txn, id).await?.ok_or_else(|| MetaError::NotFound(format!("inode {id}")))
}

/// A live inode: present and linked (nlink > 0), or a directory being the root.
async fn load_live(txn: &mut dyn Transaction, id: InodeId) -> MetaResult<Inode> {
    let inode = load_inode(txn, id).await?;
    if inode.nlink == 0 {
        return Err(MetaError::NotFound(format!("inode {id} is being removed")));
    }
    Ok(inode)
}

pub fn save_inode(txn: &mut dyn Transaction, inode: &Inode) -> MetaResult<()> {
    txn.set(&inode_key(inode.id), &encode(inode)?)?;
    Ok(())
}

async fn load_dir(txn: &mut dyn Transaction, id: InodeId) -> MetaResult<Inode> {
    let inode = load_live(txn, id).await?;
    if inode.dir().is_none() {
        return Err(MetaError::NotDirectory(id));
    }
    Ok(inode)
}

pub async fn get_entry(txn: &mut dyn Transaction, parent: InodeId, name: &str) -> MetaResult<Option<DentryValue>> {
    let key = dentry_key(parent, name);
    match txn.get(&key).await? {
        Some(raw) => Ok(Some(decode(&key, &raw)?)),
        None => Ok(None),
    }
}

fn set_entry(txn: &mut dyn Transaction, parent: InodeId, name: &str, v: DentryValue) -> MetaResult<()> {
    txn.set(&dentry_key(parent, name), &encode(&v)?)?;
    Ok(())
}

async fn dir_is_empty(txn: &mut dyn Transaction, dir: InodeId) -> MetaResult<bool> {
    let r = txn.get_range(&RangeRequest::prefix(&dentry_prefix(dir)).limit(1)).await?;
    Ok(r.kvs.is_empty())
}

fn bump(inode: &mut Inode, now_ns: u64) {
    inode.ctime_ns = now_ns;
    inode.version += 1;
}

/// Deletes an inode record and everything keyed by its id.
pub async fn delete_inode(txn: &mut dyn Transaction, id: InodeId) -> MetaResult<()> {
    txn.clear(&inode_key(id))?;
    txn.clear(&dir_time_key(id))?;
    txn.clear(&dir_subdirs_key(id))?;
    for prefix in [xattr_prefix(id), session_prefix(id)] {
        clear_prefix(txn, &prefix).await?;
    }
    txn.clear(&gc_key(id))?;
    txn.atomic_add(KEY_INODE_COUNT, -1)?;
    Ok(())
}

/// Above this many keys under a prefix, [`clear_prefix`] clears the range.
pub const POINT_CLEAR_MAX_KEYS: usize = 64;

/// Clears every key starting with `prefix`. The keys are read (a conflict-
/// checked range read: a key added concurrently makes this transaction
/// conflict) and cleared one by one; only above [`POINT_CLEAR_MAX_KEYS`] is
/// one range clear written. Range clears are what RocksDB calls range
/// tombstones, and every read of a memtable holding them re-fragments all of
/// them (RocksDB 7.8): one per deleted inode made every meta read cost
/// O(inodes deleted since the last memtable flush) — 60–70 % of meta's CPU
/// while KV puts overwrote keys.
pub async fn clear_prefix(txn: &mut dyn Transaction, prefix: &[u8]) -> MetaResult<()> {
    let found = txn.get_range(&RangeRequest::prefix(prefix).limit(POINT_CLEAR_MAX_KEYS + 1)).await?;
    if found.kvs.len() > POINT_CLEAR_MAX_KEYS {
        txn.clear_range(prefix, &prefix_end(prefix))?;
        return Ok(());
    }
    for (k, _) in &found.kvs {
        txn.clear(k)?;
    }
    Ok(())
}

pub fn queue_gc(txn: &mut dyn Transaction, id: InodeId, kind: GcKind, now_ns: u64) -> MetaResult<()> {
    txn.set(&gc_key(id), &encode(&GcValue { kind, queued_ns: now_ns })?)?;
    Ok(())
}

/// Removes one link of a non-directory inode; at zero links the inode is
/// deleted (symlinks, inline files) or queued for GC (files with chunks).
pub async fn drop_link(txn: &mut dyn Transaction, id: InodeId, now_ns: u64) -> MetaResult<()> {
    let Some(mut inode) = load_inode_opt(txn, id).await? else {
        return Ok(());
    };
    inode.nlink = inode.nlink.saturating_sub(1);
    bump(&mut inode, now_ns);
    if inode.nlink > 0 {
        return save_inode(txn, &inode);
    }
    let has_chunks = matches!(&inode.data, InodeData::File(f) if f.inline.is_none());
    if has_chunks {
        save_inode(txn, &inode)?;
        queue_gc(txn, id, GcKind::File, now_ns)
    } else {
        delete_inode(txn, id).await
    }
}

fn new_inode(ctx: &OpCtx<'_>, data: InodeData, mode: u32, nlink: u32, parent: &Inode) -> MetaResult<Inode> {
    let id = ctx.prep.new_id.ok_or_else(|| MetaError::Internal("no inode id prepared".into()))?;
    // | request | new inode's uid | gid |
    // |---|---|---|
    // | no owner named | the user's | the parent's if it is setgid, else the user's |
    // | owner named, user uid 0 | the owner's | the owner's (it is explicit) |
    // | owner named, any other user | refused: `PermissionDenied` (only root may give an inode away) | |
    let (uid, gid) = match ctx.owner {
        Some(o) if ctx.user.uid == 0 => (o.uid, o.gid),
        Some(o) => {
            return Err(MetaError::PermissionDenied(format!("uid {} may not create inodes owned by uid {}", ctx.user.uid, o.uid)));
        }
        None if parent.acl.mode & 0o2000 != 0 => (ctx.user.uid, parent.acl.gid),
        None => (ctx.user.uid, ctx.user.gid),
    };
    let now = ctx.prep.now_ns;
    Ok(Inode {
        id,
        data,
        acl: Acl { uid, gid, mode: mode & MODE_PERM_MASK },
        nlink,
        atime_ns: now,
        mtime_ns: now,
        ctime_ns: now,
        version: 1,
    })
}

/// Picks `stripe` consecutive chains round-robin from the chain table.
pub fn make_layout(cfg: &MetaConfig, policy: &LayoutPolicy, start: u64, seed: u64) -> FileLayout {
    let n = cfg.chains.len();
    let stripe = (policy.stripe_size as usize).min(n).max(usize::from(n > 0));
    let chains = (0..stripe).filter_map(|k| cfg.chains.get((start as usize + k) % n.max(1)).copied()).collect();
    FileLayout {
        table_id: cfg.chain_table_id,
        table_version: cfg.chain_table_version,
        chunk_size_bytes: policy.chunk_size_bytes,
        chains,
        seed,
    }
}

fn new_file_data(ctx: &OpCtx<'_>, parent: &Inode, inline: Option<Vec<u8>>) -> FileData {
    let policy = parent.dir().map(|d| d.layout.clone()).unwrap_or_else(|| ctx.cfg.root_layout.clone());
    let layout = make_layout(ctx.cfg, &policy, ctx.prep.layout_start, ctx.prep.seed);
    let dyn_stripe = layout.stripe_size().min(16);
    let length = inline.as_ref().map(|d| d.len() as u64).unwrap_or(0);
    FileData { length, truncate_version: 0, layout, dyn_stripe, inline }
}

fn open_session(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId) -> MetaResult<u64> {
    let v = SessionValue { client_id: ctx.client_id, opened_ns: ctx.prep.now_ns };
    txn.set(&session_key(id, ctx.prep.session), &encode(&v)?)?;
    Ok(ctx.prep.session)
}

fn file_mut(inode: &mut Inode) -> MetaResult<&mut FileData> {
    let id = inode.id;
    match &mut inode.data {
        InodeData::File(f) => Ok(f),
        InodeData::Directory(_) => Err(MetaError::IsDirectory(id)),
        InodeData::Symlink { .. } => Err(MetaError::InvalidArgument(format!("{id} is a symlink"))),
        InodeData::Special { .. } => Err(MetaError::InvalidArgument(format!("{id} is a special file"))),
    }
}

// ---------- the dispatcher ----------

/// Runs `op` inside `txn` (not committed here). Directories in the reply
/// carry their POSIX nlink (see [`fold_dir_nlink`]).
pub async fn apply(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, op: &MetaOp) -> MetaResult<MetaReply> {
    if let MetaOp::Txn { ops } = op {
        return apply_txn(txn, ctx, ops).await;
    }
    let mut reply = apply_op(txn, ctx, op).await?;
    match &mut reply {
        MetaReply::Inode(inode) | MetaReply::Opened { inode, .. } | MetaReply::InodeXattr { inode, .. } => {
            fold_dir_nlink(txn, inode).await?
        }
        MetaReply::Entries { entries, .. } => {
            for attr in entries.iter_mut().filter_map(|e| e.attr.as_mut()) {
                fold_dir_nlink(txn, attr).await?;
            }
        }
        MetaReply::Walk { inodes, .. } => {
            for inode in inodes.iter_mut() {
                fold_dir_nlink(txn, inode).await?;
            }
        }
        _ => {}
    }
    Ok(reply)
}

/// [`MetaOp::Txn`]: its ops in order inside the one transaction (which
/// reads its own writes); the first error fails the whole request and
/// nothing is committed.
async fn apply_txn(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, ops: &[MetaOp]) -> MetaResult<MetaReply> {
    if ops.is_empty() || ops.len() > MAX_TXN_OPS {
        return Err(MetaError::InvalidArgument(format!("a txn holds 1..={MAX_TXN_OPS} ops, not {}", ops.len())));
    }
    if let Some(bad) = ops.iter().find(|o| !o.allowed_in_txn()) {
        return Err(MetaError::InvalidArgument(format!("{bad:?} cannot be part of a txn")));
    }
    if ops.iter().filter(|o| matches!(o, MetaOp::CreateWritePublish { .. })).count() > 1 {
        return Err(MetaError::InvalidArgument("a txn creates at most one inode".into()));
    }
    let mut replies = Vec::with_capacity(ops.len());
    for op in ops {
        replies.push(apply_op(txn, ctx, op).await?);
    }
    Ok(MetaReply::Many(replies))
}

/// A live directory's stored nlink is 1 (0 once removed); replies show
/// 2 + its subdirectories, counted in its `DSUB` key with atomic adds (so
/// mkdir and rmdir never write the parent's inode) and read here without
/// a conflict.
async fn fold_dir_nlink(txn: &mut dyn Transaction, inode: &mut Inode) -> MetaResult<()> {
    if inode.dir().is_none() || inode.nlink == 0 {
        return Ok(());
    }
    let key = dir_subdirs_key(inode.id);
    let subdirs = match txn.snapshot_get(&key).await? {
        Some(raw) => decode_i64(&key, &raw)?.max(0),
        None => 0,
    };
    inode.nlink = u32::try_from(subdirs).unwrap_or(u32::MAX - 2).saturating_add(2);
    Ok(())
}

/// Counts a subdirectory added to (+1) or removed from (-1) `dir`.
fn count_subdir(txn: &mut dyn Transaction, dir: InodeId, delta: i64) -> MetaResult<()> {
    txn.atomic_add(&dir_subdirs_key(dir), delta)?;
    Ok(())
}

async fn apply_op(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, op: &MetaOp) -> MetaResult<MetaReply> {
    match op {
        MetaOp::Lookup { parent, name } => lookup(txn, ctx, *parent, name).await.map(MetaReply::Inode),
        MetaOp::LookupXattr { parent, name, xattr } => {
            let inode = lookup(txn, ctx, *parent, name).await?;
            let value = xattr_if_any(txn, ctx, inode.id, xattr).await?;
            Ok(MetaReply::InodeXattr { inode, value })
        }
        MetaOp::WalkXattr { parent, names, xattr } => walk_xattr(txn, ctx, *parent, names, xattr).await,
        MetaOp::Stat { inode } => load_inode(txn, *inode).await.map(MetaReply::Inode),
        MetaOp::Create { parent, name, mode, exclusive, write } => create(txn, ctx, *parent, name, *mode, *exclusive, *write).await,
        MetaOp::Open { inode, write } => open(txn, ctx, *inode, *write).await,
        MetaOp::Close { inode, session, length_hint, truncate_version, wrote, .. } => {
            let args = CloseArgs { session: *session, length_hint: *length_hint, truncate_version: *truncate_version, wrote: *wrote };
            close(txn, ctx, *inode, args).await
        }
        MetaOp::Mkdir { parent, name, mode, xattrs } => mkdir(txn, ctx, *parent, name, *mode, xattrs).await.map(MetaReply::Inode),
        MetaOp::Rmdir { parent, name } => rmdir(txn, ctx, *parent, name).await.map(|_| MetaReply::Done),
        MetaOp::Unlink { parent, name } => unlink(txn, ctx, *parent, name).await.map(|_| MetaReply::Done),
        MetaOp::UnlinkExpected { parent, name, expected } => {
            check_expected(txn, *parent, name, Some(expected)).await?;
            unlink(txn, ctx, *parent, name).await.map(|_| MetaReply::Done)
        }
        MetaOp::Rename { src_parent, src_name, dst_parent, dst_name } => {
            rename(txn, ctx, *src_parent, src_name, *dst_parent, dst_name).await.map(|_| MetaReply::Done)
        }
        MetaOp::Symlink { parent, name, target } => symlink(txn, ctx, *parent, name, target).await.map(MetaReply::Inode),
        MetaOp::Readlink { inode } => readlink(txn, *inode).await.map(MetaReply::Target),
        MetaOp::Mknod { parent, name, mode, kind, rdev } => mknod(txn, ctx, *parent, name, *mode, *kind, *rdev).await.map(MetaReply::Inode),
        MetaOp::Link { inode, parent, name } => link(txn, ctx, *inode, *parent, name).await.map(MetaReply::Inode),
        MetaOp::Readdir { dir, start_after, limit, with_attrs } => readdir(txn, ctx, *dir, start_after, *limit, *with_attrs).await,
        MetaOp::SetAttr { inode, attr } => setattr(txn, ctx, *inode, attr).await.map(MetaReply::Inode),
        MetaOp::Truncate { inode, length, session } => truncate(txn, ctx, *inode, *length, *session).await.map(MetaReply::Inode),
        MetaOp::ReportLength { inode, length, truncate_version } => {
            report_length(txn, ctx, *inode, *length, *truncate_version).await.map(MetaReply::Inode)
        }
        MetaOp::GetXattr { inode, name } => get_xattr(txn, ctx, *inode, name).await.map(MetaReply::Xattr),
        MetaOp::SetXattr { inode, name, value, flag } => set_xattr(txn, ctx, *inode, name, value, *flag).await.map(|_| MetaReply::Done),
        MetaOp::ListXattr { inode } => list_xattr(txn, ctx, *inode).await.map(MetaReply::XattrNames),
        MetaOp::RemoveXattr { inode, name } => remove_xattr(txn, ctx, *inode, name).await.map(|_| MetaReply::Done),
        MetaOp::StatFs => statfs(txn, ctx).await.map(MetaReply::StatFs),
        MetaOp::RemoveTree { parent, name } => remove_tree(txn, ctx, *parent, name).await.map(|_| MetaReply::Done),
        MetaOp::CreateUnlinked { parent, mode } => create_unlinked(txn, ctx, *parent, *mode).await.map(MetaReply::Inode),
        MetaOp::WriteInline { inode, offset, data } => write_inline(txn, ctx, *inode, *offset, data).await.map(MetaReply::Inode),
        MetaOp::ReadInline { inode, offset, len } => read_inline(txn, ctx, *inode, *offset, *len).await.map(MetaReply::Data),
        MetaOp::RenewTemp { inode } => renew_temp(txn, ctx, *inode).await.map(|()| MetaReply::Done),
        MetaOp::Replace { parent, name, inode, expected, attrs } => {
            replace(txn, ctx, *parent, name, *inode, expected.as_ref(), attrs).await.map(MetaReply::Inode)
        }
        MetaOp::CreateWritePublish { parent, name, mode, data, expected, attrs } => {
            let publish = InlinePublish { mode: *mode, data, expected: expected.as_ref(), attrs };
            create_write_publish(txn, ctx, *parent, name, publish).await.map(MetaReply::Inode)
        }
        MetaOp::OverwriteInline { parent, name, inode, version, data } => {
            overwrite_inline(txn, ctx, *parent, name, (*inode, *version), data).await.map(MetaReply::Inode)
        }
        MetaOp::Txn { .. } => Err(MetaError::InvalidArgument("a txn cannot hold a txn".into())),
        MetaOp::Expect { parent, name, expected } => {
            check_name(name)?;
            let dir = load_dir(txn, *parent).await?;
            perm::check(&dir, ctx.user, EXEC)?;
            check_expected(txn, *parent, name, Some(expected)).await.map(|_| MetaReply::Done)
        }
    }
}

// ---------- namespace ----------

pub async fn lookup(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, name: &str) -> MetaResult<Inode> {
    check_name(name)?;
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, EXEC)?;
    let entry = get_entry(txn, parent, name).await?.ok_or_else(|| MetaError::NotFound(format!("{parent}/{name}")))?;
    load_inode(txn, entry.inode).await
}

/// The directory `parent` for a new entry `name`: a valid name, a live
/// directory the caller may write, and no entry of that name yet.
async fn dir_for_new_entry(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, name: &str) -> MetaResult<Inode> {
    check_name(name)?;
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, WRITE | EXEC)?;
    if get_entry(txn, parent, name).await?.is_some() {
        return Err(MetaError::AlreadyExists(format!("{parent}/{name}")));
    }
    Ok(dir)
}

/// Stores a new inode and names it `parent/name`: the entry, the parent's
/// times (and subdirectory count), the inode count.
fn add_new_inode(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, dir: &Inode, name: &str, inode: &Inode) -> MetaResult<()> {
    let parent = dir.id;
    save_inode(txn, inode)?;
    set_entry(txn, parent, name, DentryValue { inode: inode.id, kind: inode.kind() })?;
    touch_dir(txn, dir, ctx.prep.now_ns)?;
    if inode.dir().is_some() {
        count_subdir(txn, parent, 1)?;
    }
    txn.atomic_add(KEY_INODE_COUNT, 1)?;
    tracing::debug!(parent = %parent, inode = %inode.id, name, kind = ?inode.kind(), "new entry");
    Ok(())
}

pub async fn create(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    parent: InodeId,
    name: &str,
    mode: u32,
    exclusive: bool,
    write: bool,
) -> MetaResult<MetaReply> {
    check_name(name)?;
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, WRITE | EXEC)?;
    if let Some(entry) = get_entry(txn, parent, name).await? {
        if exclusive {
            return Err(MetaError::AlreadyExists(format!("{parent}/{name}")));
        }
        if entry.kind == InodeKind::Directory {
            return Err(MetaError::IsDirectory(entry.inode));
        }
        return open(txn, ctx, entry.inode, write).await;
    }
    let data = InodeData::File(new_file_data(ctx, &dir, None));
    let inode = new_inode(ctx, data, mode, 1, &dir)?;
    add_new_inode(txn, ctx, &dir, name, &inode)?;
    if write {
        let session = open_session(txn, ctx, inode.id)?;
        return Ok(MetaReply::Opened { inode, session });
    }
    Ok(MetaReply::Inode(inode))
}

/// `meta.IssueCap`'s check: `id` is a regular file (linked, or an unlinked
/// one still being written or read) and `user` may read it, or write it
/// with `write` — the permission `open` checks.
pub async fn cap_check(txn: &mut dyn Transaction, user: &UserInfo, id: InodeId, write: bool) -> MetaResult<()> {
    let inode = load_inode(txn, id).await?;
    if inode.file().is_none() {
        return Err(MetaError::InvalidArgument(format!("{id} is not a regular file: chunk capabilities are for files")));
    }
    perm::check(&inode, user, if write { WRITE } else { READ })
}

pub async fn open(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, write: bool) -> MetaResult<MetaReply> {
    let inode = load_live(txn, id).await?;
    perm::check(&inode, ctx.user, if write { WRITE } else { READ })?;
    if write {
        match inode.data {
            InodeData::File(_) => {}
            InodeData::Directory(_) => return Err(MetaError::IsDirectory(id)),
            _ => return Err(MetaError::InvalidArgument(format!("{id} is not a regular file: no write session"))),
        }
        let session = open_session(txn, ctx, id)?;
        return Ok(MetaReply::Opened { inode, session });
    }
    Ok(MetaReply::Inode(inode))
}

/// What a closing write handle tells meta.
#[derive(Clone, Copy, Debug)]
pub struct CloseArgs {
    pub session: u64,
    pub length_hint: Option<u64>,
    pub truncate_version: u64,
    pub wrote: bool,
}

pub async fn close(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, args: CloseArgs) -> MetaResult<MetaReply> {
    let mut inode = load_inode(txn, id).await?;
    if args.session != 0 {
        txn.clear(&session_key(id, args.session))?;
    }
    let now = ctx.prep.now_ns;
    if let InodeData::File(f) = &mut inode.data {
        if f.inline.is_none() {
            let new_len = match ctx.prep.exact_length {
                Some((exact, at_version)) if at_version == f.truncate_version => exact,
                Some(_) => {
                    return Err(MetaError::StalePrepare(format!("{id} was truncated while its length was measured")));
                }
                None if args.truncate_version >= f.truncate_version => f.length.max(args.length_hint.unwrap_or(0)),
                None => f.length,
            };
            if new_len != f.length || (args.session != 0 && args.wrote) {
                f.length = new_len;
                grow_dyn_stripe(f);
                inode.mtime_ns = now;
                bump(&mut inode, now);
                save_inode(txn, &inode)?;
            }
        }
    }
    Ok(MetaReply::Inode(inode))
}

/// Whether `session` is an open write session of this client on `id` (the
/// write permission was checked when it was opened).
async fn holds_write_session(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, session: u64) -> MetaResult<bool> {
    if session == 0 {
        return Ok(false);
    }
    let key = session_key(id, session);
    match txn.get(&key).await? {
        Some(raw) => Ok(decode::<SessionValue>(&key, &raw)?.client_id == ctx.client_id),
        None => Ok(false),
    }
}

fn grow_dyn_stripe(f: &mut FileData) {
    let stripe = f.layout.stripe_size();
    let chunk = u64::from(f.layout.chunk_size_bytes.max(1));
    while f.dyn_stripe < stripe && f.length > u64::from(f.dyn_stripe) * chunk {
        f.dyn_stripe = (f.dyn_stripe.max(1) * 2).min(stripe);
    }
}

pub async fn mkdir(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    parent: InodeId,
    name: &str,
    mode: u32,
    xattrs: &[(String, Vec<u8>)],
) -> MetaResult<Inode> {
    check_new_xattrs(xattrs)?;
    let dir = dir_for_new_entry(txn, ctx, parent, name).await?;
    let layout = dir.dir().map(|d| d.layout.clone()).unwrap_or_else(|| ctx.cfg.root_layout.clone());
    let data = InodeData::Directory(DirData { parent, name: name.to_string(), layout });
    let mut mode = mode & MODE_PERM_MASK;
    if dir.acl.mode & 0o2000 != 0 {
        mode |= 0o2000;
    }
    let inode = new_inode(ctx, data, mode, 1, &dir)?;
    add_new_inode(txn, ctx, &dir, name, &inode)?;
    for (xname, value) in xattrs {
        txn.set(&xattr_key(inode.id, xname), value)?;
    }
    Ok(inode)
}

/// Loads the entry `parent/name` and its inode for removal, with the
/// directory write + sticky checks.
async fn victim(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, name: &str) -> MetaResult<(Inode, DentryValue, Inode)> {
    check_name(name)?;
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, WRITE | EXEC)?;
    let entry = get_entry(txn, parent, name).await?.ok_or_else(|| MetaError::NotFound(format!("{parent}/{name}")))?;
    let inode = load_inode(txn, entry.inode).await?;
    perm::check_sticky(&dir, &inode, ctx.user)?;
    Ok((dir, entry, inode))
}

pub async fn rmdir(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, name: &str) -> MetaResult<()> {
    let (dir, entry, inode) = victim(txn, ctx, parent, name).await?;
    if entry.kind != InodeKind::Directory {
        return Err(MetaError::NotDirectory(entry.inode));
    }
    if !dir_is_empty(txn, inode.id).await? {
        return Err(MetaError::NotEmpty(inode.id));
    }
    txn.clear(&dentry_key(parent, name))?;
    touch_dir(txn, &dir, ctx.prep.now_ns)?;
    count_subdir(txn, parent, -1)?;
    delete_inode(txn, inode.id).await?;
    tracing::debug!(parent = %parent, inode = %inode.id, name, "rmdir");
    Ok(())
}

pub async fn unlink(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, name: &str) -> MetaResult<()> {
    let (dir, entry, _) = victim(txn, ctx, parent, name).await?;
    if entry.kind == InodeKind::Directory {
        return Err(MetaError::IsDirectory(entry.inode));
    }
    txn.clear(&dentry_key(parent, name))?;
    touch_dir(txn, &dir, ctx.prep.now_ns)?;
    drop_link(txn, entry.inode, ctx.prep.now_ns).await?;
    tracing::debug!(parent = %parent, inode = %entry.inode, name, "unlink");
    Ok(())
}

/// Fails if `dst_parent` is `moved` or lies below it. Walks parent pointers
/// with plain reads, so a concurrent rename of any ancestor aborts us.
async fn check_no_cycle(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, moved: InodeId, dst_parent: InodeId) -> MetaResult<()> {
    let mut cur = dst_parent;
    for _ in 0..ctx.cfg.max_path_depth {
        if cur == moved {
            return Err(MetaError::WouldCreateCycle { moved });
        }
        if cur == InodeId::ROOT {
            return Ok(());
        }
        let inode = load_inode(txn, cur).await?;
        cur = inode.dir().map(|d| d.parent).ok_or(MetaError::NotDirectory(cur))?;
    }
    Err(MetaError::TooLarge(format!("directory depth above {} at {dst_parent}", ctx.cfg.max_path_depth)))
}

pub async fn rename(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    src_parent: InodeId,
    src_name: &str,
    dst_parent: InodeId,
    dst_name: &str,
) -> MetaResult<()> {
    check_name(dst_name)?;
    let (sdir, src, mut src_inode) = victim(txn, ctx, src_parent, src_name).await?;
    let ddir = load_dir(txn, dst_parent).await?;
    perm::check(&ddir, ctx.user, WRITE | EXEC)?;
    if src_parent == dst_parent && src_name == dst_name {
        return Ok(());
    }
    let is_dir = src.kind == InodeKind::Directory;
    if is_dir && src_parent != dst_parent {
        check_no_cycle(txn, ctx, src.inode, dst_parent).await?;
    }
    if let Some(dst) = get_entry(txn, dst_parent, dst_name).await? {
        if dst.inode == src.inode {
            // Two links to one inode: POSIX says do nothing.
            return Ok(());
        }
        let dst_inode = load_inode(txn, dst.inode).await?;
        perm::check_sticky(&ddir, &dst_inode, ctx.user)?;
        match (is_dir, dst.kind == InodeKind::Directory) {
            (true, false) => return Err(MetaError::NotDirectory(dst.inode)),
            (false, true) => return Err(MetaError::IsDirectory(dst.inode)),
            (true, true) => {
                if !dir_is_empty(txn, dst.inode).await? {
                    return Err(MetaError::NotEmpty(dst.inode));
                }
                delete_inode(txn, dst.inode).await?;
                count_subdir(txn, dst_parent, -1)?;
            }
            (false, false) => drop_link(txn, dst.inode, ctx.prep.now_ns).await?,
        }
    }
    txn.clear(&dentry_key(src_parent, src_name))?;
    set_entry(txn, dst_parent, dst_name, src)?;
    touch_dir(txn, &sdir, ctx.prep.now_ns)?;
    touch_dir(txn, &ddir, ctx.prep.now_ns)?;
    if is_dir && src_parent != dst_parent {
        count_subdir(txn, src_parent, -1)?;
        count_subdir(txn, dst_parent, 1)?;
    }
    if let InodeData::Directory(d) = &mut src_inode.data {
        d.parent = dst_parent;
        d.name = dst_name.to_string();
    }
    // The renamed inode's ctime moves too, whatever its kind (Linux does so).
    bump(&mut src_inode, ctx.prep.now_ns);
    save_inode(txn, &src_inode)?;
    tracing::debug!(inode = %src.inode, %src_parent, src_name, %dst_parent, dst_name, "rename");
    Ok(())
}

pub async fn symlink(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, name: &str, target: &str) -> MetaResult<Inode> {
    check_name(name)?;
    if target.is_empty() || target.len() > MAX_SYMLINK_TARGET_BYTES {
        return Err(MetaError::InvalidArgument(format!("symlink target of {} bytes (1..={MAX_SYMLINK_TARGET_BYTES})", target.len())));
    }
    let dir = dir_for_new_entry(txn, ctx, parent, name).await?;
    let inode = new_inode(ctx, InodeData::Symlink { target: target.to_string() }, 0o777, 1, &dir)?;
    add_new_inode(txn, ctx, &dir, name, &inode)?;
    Ok(inode)
}

/// Makes a FIFO, socket or device node (metadata only: the kernel serves
/// its I/O). Device nodes need root, as mknod(2) needs CAP_MKNOD.
pub async fn mknod(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    parent: InodeId,
    name: &str,
    mode: u32,
    kind: SpecialKind,
    rdev: u64,
) -> MetaResult<Inode> {
    check_name(name)?;
    if kind.is_device() && ctx.user.uid != 0 {
        return Err(MetaError::PermissionDenied("only root makes device nodes".into()));
    }
    let rdev = if kind.is_device() { rdev } else { 0 };
    let dir = dir_for_new_entry(txn, ctx, parent, name).await?;
    let inode = new_inode(ctx, InodeData::Special { kind, rdev }, mode, 1, &dir)?;
    add_new_inode(txn, ctx, &dir, name, &inode)?;
    Ok(inode)
}

pub async fn readlink(txn: &mut dyn Transaction, id: InodeId) -> MetaResult<String> {
    match load_inode(txn, id).await?.data {
        InodeData::Symlink { target } => Ok(target),
        _ => Err(MetaError::InvalidArgument(format!("{id} is not a symlink"))),
    }
}

pub async fn link(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, parent: InodeId, name: &str) -> MetaResult<Inode> {
    check_name(name)?;
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, WRITE | EXEC)?;
    let mut inode = load_live(txn, id).await?;
    if inode.dir().is_some() {
        return Err(MetaError::IsDirectory(id));
    }
    if get_entry(txn, parent, name).await?.is_some() {
        return Err(MetaError::AlreadyExists(format!("{parent}/{name}")));
    }
    inode.nlink += 1;
    bump(&mut inode, ctx.prep.now_ns);
    save_inode(txn, &inode)?;
    set_entry(txn, parent, name, DentryValue { inode: id, kind: inode.kind() })?;
    touch_dir(txn, &dir, ctx.prep.now_ns)?;
    Ok(inode)
}

pub async fn readdir(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    dir_id: InodeId,
    start_after: &str,
    limit: u32,
    with_attrs: bool,
) -> MetaResult<MetaReply> {
    let dir = load_dir(txn, dir_id).await?;
    perm::check(&dir, ctx.user, READ)?;
    let limit = limit.clamp(1, MAX_READDIR_LIMIT) as usize;
    let prefix = dentry_prefix(dir_id);
    let begin = if start_after.is_empty() { prefix.clone().into() } else { key_after(&dentry_key(dir_id, start_after)) };
    let range = RangeRequest::new(begin, prefix_end(&prefix)).limit(limit);
    let result = txn.snapshot_get_range(&range).await?;
    let mut entries = Vec::with_capacity(result.kvs.len());
    for (k, v) in &result.kvs {
        let dv: DentryValue = decode(k, v)?;
        let attr = if with_attrs {
            let key = inode_key(dv.inode);
            match txn.snapshot_get(&key).await? {
                Some(raw) => {
                    let mut i: Inode = decode(&key, &raw)?;
                    if let InodeData::File(f) = &mut i.data {
                        f.inline = f.inline.as_ref().map(|_| Vec::new());
                    }
                    merge_dir_time(txn, &mut i).await?;
                    Some(i)
                }
                None => None,
            }
        } else {
            None
        };
        entries.push(DirEntry { name: name_from_key(k)?, inode: dv.inode, kind: dv.kind, attr });
    }
    Ok(MetaReply::Entries { entries, more: result.more })
}

// ---------- attributes ----------

pub async fn setattr(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, attr: &SetAttr) -> MetaResult<Inode> {
    let mut inode = load_live(txn, id).await?;
    let user = ctx.user;
    if let Some(mode) = attr.mode {
        perm::check_owner(&inode, user)?;
        inode.acl.mode = mode & MODE_PERM_MASK;
    }
    if let Some(uid) = attr.uid {
        if uid != inode.acl.uid && user.uid != 0 {
            return Err(MetaError::PermissionDenied("only root changes the owner".into()));
        }
        inode.acl.uid = uid;
    }
    if let Some(gid) = attr.gid {
        if gid != inode.acl.gid && user.uid != 0 && !(user.uid == inode.acl.uid && user.in_group(gid)) {
            return Err(MetaError::PermissionDenied(format!("uid {} may not set group {gid}", user.uid)));
        }
        inode.acl.gid = gid;
    }
    if attr.atime_ns.is_some() || attr.mtime_ns.is_some() {
        if user.uid != 0 && user.uid != inode.acl.uid {
            perm::check(&inode, user, WRITE)?;
        }
        if let Some(t) = attr.atime_ns {
            inode.atime_ns = t;
        }
        if let Some(t) = attr.mtime_ns {
            inode.mtime_ns = t;
            // An explicit mtime wins over earlier namespace changes.
            txn.clear(&dir_time_key(id))?;
        }
    }
    bump(&mut inode, ctx.prep.now_ns);
    save_inode(txn, &inode)?;
    Ok(inode)
}

/// The checks of [`truncate`] without writing anything: the layout of a
/// chunked file whose chunks the truncate will cut (storage is cut before
/// the length commits, so a length measured on storage after the commit
/// never sees the old data).
pub async fn truncate_check(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, session: u64) -> MetaResult<Option<FileLayout>> {
    let mut inode = load_live(txn, id).await?;
    if !holds_write_session(txn, ctx, id, session).await? {
        perm::check(&inode, ctx.user, WRITE)?;
    }
    let f = file_mut(&mut inode)?;
    Ok(f.inline.is_none().then(|| f.layout.clone()))
}

pub async fn truncate(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, length: u64, session: u64) -> MetaResult<Inode> {
    let mut inode = load_live(txn, id).await?;
    if !holds_write_session(txn, ctx, id, session).await? {
        perm::check(&inode, ctx.user, WRITE)?;
    }
    let inline_max = ctx.cfg.inline_max_bytes as u64;
    let f = file_mut(&mut inode)?;
    if let Some(data) = &mut f.inline {
        if length > inline_max {
            return Err(MetaError::Unsupported(format!("extending inline file {id} beyond {inline_max} bytes by truncate")));
        }
        data.resize(length as usize, 0);
    }
    f.length = length;
    f.truncate_version += 1;
    grow_dyn_stripe(f);
    let now = ctx.prep.now_ns;
    inode.mtime_ns = now;
    bump(&mut inode, now);
    save_inode(txn, &inode)?;
    Ok(inode)
}

pub async fn report_length(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    id: InodeId,
    length: u64,
    truncate_version: u64,
) -> MetaResult<Inode> {
    let mut inode = load_live(txn, id).await?;
    let f = file_mut(&mut inode)?;
    if truncate_version < f.truncate_version || length <= f.length || f.inline.is_some() {
        return Ok(inode); // stale or nothing new
    }
    f.length = length;
    grow_dyn_stripe(f);
    let now = ctx.prep.now_ns;
    inode.mtime_ns = now;
    bump(&mut inode, now);
    save_inode(txn, &inode)?;
    Ok(inode)
}

// ---------- xattrs ----------

fn check_xattr_name(name: &str) -> MetaResult<()> {
    if name.is_empty() {
        return Err(MetaError::InvalidArgument("empty xattr name".into()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(MetaError::NameTooLong { len: name.len(), limit: MAX_NAME_BYTES });
    }
    Ok(())
}

/// [`get_xattr`], with an attribute the inode does not have as `None`.
async fn xattr_if_any(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, name: &str) -> MetaResult<Option<Vec<u8>>> {
    match get_xattr(txn, ctx, id, name).await {
        Ok(v) => Ok(Some(v)),
        Err(MetaError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`MetaOp::WalkXattr`]: a lookup per name, stopping at an absent name or
/// a non-directory with names left; the attribute once all are found.
async fn walk_xattr(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, names: &[String], xattr: &str) -> MetaResult<MetaReply> {
    if names.is_empty() || names.len() > MAX_WALK_NAMES {
        return Err(MetaError::InvalidArgument(format!("a walk takes 1..={MAX_WALK_NAMES} names, not {}", names.len())));
    }
    let mut inodes: Vec<Inode> = Vec::with_capacity(names.len());
    let mut dir = parent;
    for name in names {
        if inodes.last().is_some_and(|i| i.dir().is_none()) {
            return Ok(MetaReply::Walk { inodes, value: None });
        }
        match lookup(txn, ctx, dir, name).await {
            Ok(inode) => {
                dir = inode.id;
                inodes.push(inode);
            }
            Err(MetaError::NotFound(_)) => return Ok(MetaReply::Walk { inodes, value: None }),
            Err(e) => return Err(e),
        }
    }
    let value = xattr_if_any(txn, ctx, dir, xattr).await?;
    Ok(MetaReply::Walk { inodes, value })
}

pub async fn get_xattr(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, name: &str) -> MetaResult<Vec<u8>> {
    check_xattr_name(name)?;
    let inode = load_live(txn, id).await?;
    perm::check(&inode, ctx.user, READ)?;
    let key = xattr_key(id, name);
    let raw = txn.get(&key).await?.ok_or_else(|| MetaError::NotFound(format!("xattr {name} of {id}")))?;
    Ok(raw.to_vec())
}

pub async fn set_xattr(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    id: InodeId,
    name: &str,
    value: &[u8],
    flag: XattrFlag,
) -> MetaResult<()> {
    check_xattr_name(name)?;
    if value.len() > MAX_XATTR_VALUE_BYTES {
        return Err(MetaError::TooLarge(format!("xattr value of {} bytes (max {MAX_XATTR_VALUE_BYTES})", value.len())));
    }
    let mut inode = load_live(txn, id).await?;
    perm::check(&inode, ctx.user, WRITE)?;
    let key = xattr_key(id, name);
    let exists = txn.get(&key).await?.is_some();
    match flag {
        XattrFlag::Create if exists => return Err(MetaError::AlreadyExists(format!("xattr {name} of {id}"))),
        XattrFlag::Replace if !exists => return Err(MetaError::NotFound(format!("xattr {name} of {id}"))),
        _ => {}
    }
    txn.set(&key, value)?;
    bump(&mut inode, ctx.prep.now_ns);
    save_inode(txn, &inode)
}

pub async fn list_xattr(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId) -> MetaResult<Vec<String>> {
    let inode = load_live(txn, id).await?;
    perm::check(&inode, ctx.user, READ)?;
    let r = txn.get_range(&RangeRequest::prefix(&xattr_prefix(id))).await?;
    r.kvs.iter().map(|(k, _)| name_from_key(k)).collect()
}

pub async fn remove_xattr(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, name: &str) -> MetaResult<()> {
    check_xattr_name(name)?;
    let mut inode = load_live(txn, id).await?;
    perm::check(&inode, ctx.user, WRITE)?;
    let key = xattr_key(id, name);
    if txn.get(&key).await?.is_none() {
        return Err(MetaError::NotFound(format!("xattr {name} of {id}")));
    }
    txn.clear(&key)?;
    bump(&mut inode, ctx.prep.now_ns);
    save_inode(txn, &inode)
}

pub async fn statfs(txn: &mut dyn Transaction, ctx: &OpCtx<'_>) -> MetaResult<StatFs> {
    let inodes = match txn.snapshot_get(KEY_INODE_COUNT).await? {
        Some(raw) => decode_i64(KEY_INODE_COUNT, &raw)?.max(0) as u64,
        None => 0,
    };
    let (capacity_bytes, used_bytes) = ctx.prep.capacity;
    Ok(StatFs { inodes, capacity_bytes, used_bytes })
}

// ---------- recursive remove ----------

/// Detaches `parent/name` and queues it for GC in one transaction. A
/// directory's inode gets nlink 0 (no new entries can be created in it) and
/// a `Tree` GC entry; the GC task empties it in the background.
pub async fn remove_tree(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, name: &str) -> MetaResult<()> {
    let (dir, entry, mut inode) = victim(txn, ctx, parent, name).await?;
    txn.clear(&dentry_key(parent, name))?;
    touch_dir(txn, &dir, ctx.prep.now_ns)?;
    if entry.kind == InodeKind::Directory {
        perm::check(&inode, ctx.user, WRITE | EXEC)?;
        count_subdir(txn, parent, -1)?;
        inode.nlink = 0;
        bump(&mut inode, ctx.prep.now_ns);
        save_inode(txn, &inode)?;
        queue_gc(txn, inode.id, GcKind::Tree, ctx.prep.now_ns)?;
    } else {
        drop_link(txn, entry.inode, ctx.prep.now_ns).await?;
    }
    tracing::debug!(parent = %parent, inode = %entry.inode, name, "remove tree");
    Ok(())
}

// ---------- gateway extensions ----------

pub async fn create_unlinked(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, parent: InodeId, mode: u32) -> MetaResult<Inode> {
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, WRITE | EXEC)?;
    // Not inline yet: WriteInline makes it inline, or the data path writes chunks.
    let data = InodeData::File(new_file_data(ctx, &dir, None));
    let inode = new_inode(ctx, data, mode, 0, &dir)?;
    save_inode(txn, &inode)?;
    queue_gc(txn, inode.id, GcKind::Temp, ctx.prep.now_ns)?;
    txn.atomic_add(KEY_INODE_COUNT, 1)?;
    Ok(inode)
}

/// The temp lease of an unpublished inode: its `Temp` GC entry. GC claims
/// an expired one by turning the entry into a `File` entry in a transaction
/// before it removes any chunk, so after the claim neither a renewal nor a
/// publish can succeed (both read the entry and conflict with the claim).
///
/// | entry of `id` | `RenewTemp` | `Replace` (publish) |
/// |---|---|---|
/// | `Temp` | queued time := now (the TTL counts again) | publishes, clears the entry |
/// | `File` (claimed by GC) or none | `NotFound` | `NotFound` |
async fn temp_lease(txn: &mut dyn Transaction, id: InodeId) -> MetaResult<GcValue> {
    let claimed = || MetaError::NotFound(format!("{id} is not a live temp inode (its lease expired and GC reclaims it)"));
    let raw = txn.get(&gc_key(id)).await?.ok_or_else(claimed)?;
    let entry: GcValue = decode(&gc_key(id), &raw)?;
    if entry.kind != GcKind::Temp {
        return Err(claimed());
    }
    Ok(entry)
}

pub async fn renew_temp(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId) -> MetaResult<()> {
    let inode = load_inode(txn, id).await?;
    perm::check(&inode, ctx.user, WRITE)?;
    temp_lease(txn, id).await?;
    queue_gc(txn, id, GcKind::Temp, ctx.prep.now_ns)
}

pub async fn write_inline(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, offset: u64, data: &[u8]) -> MetaResult<Inode> {
    let mut inode = load_inode(txn, id).await?;
    perm::check(&inode, ctx.user, WRITE)?;
    let max = ctx.cfg.inline_max_bytes as u64;
    let end = offset.checked_add(data.len() as u64).ok_or_else(|| MetaError::InvalidArgument("offset overflow".into()))?;
    if end > max {
        return Err(MetaError::TooLarge(format!("inline data up to {end} bytes (max {max})")));
    }
    let f = file_mut(&mut inode)?;
    if f.inline.is_none() && f.length == 0 {
        f.inline = Some(Vec::new());
    }
    let Some(buf) = &mut f.inline else {
        return Err(MetaError::Unsupported(format!("{id} is not an inline file")));
    };
    if buf.len() < end as usize {
        buf.resize(end as usize, 0);
    }
    buf[offset as usize..end as usize].copy_from_slice(data);
    f.length = buf.len() as u64;
    let now = ctx.prep.now_ns;
    inode.mtime_ns = now;
    bump(&mut inode, now);
    save_inode(txn, &inode)?;
    Ok(inode)
}

pub async fn read_inline(txn: &mut dyn Transaction, ctx: &OpCtx<'_>, id: InodeId, offset: u64, len: u32) -> MetaResult<Vec<u8>> {
    let inode = load_inode(txn, id).await?;
    perm::check(&inode, ctx.user, READ)?;
    match inode.file().and_then(|f| f.inline.as_ref()) {
        Some(buf) => {
            let start = (offset as usize).min(buf.len());
            let end = start.saturating_add(len as usize).min(buf.len());
            Ok(buf[start..end].to_vec())
        }
        None => Err(MetaError::Unsupported(format!("{id} is not an inline file"))),
    }
}

/// Checks a CAS precondition against the current entry; returns the entry.
async fn check_expected(
    txn: &mut dyn Transaction,
    parent: InodeId,
    name: &str,
    expected: Option<&Expected>,
) -> MetaResult<Option<DentryValue>> {
    let current = get_entry(txn, parent, name).await?;
    match (expected, &current) {
        (None, _) | (Some(Expected::Absent), None) => {}
        (Some(Expected::Absent), Some(e)) => {
            return Err(MetaError::PreconditionFailed(format!("{parent}/{name} exists (inode {})", e.inode)))
        }
        (Some(Expected::Inode { .. }), None) => return Err(MetaError::PreconditionFailed(format!("{parent}/{name} does not exist"))),
        (Some(Expected::Inode { id, version }), Some(e)) => {
            let cur = load_inode(txn, e.inode).await?;
            if e.inode != *id || cur.version != *version {
                return Err(MetaError::PreconditionFailed(format!(
                    "{parent}/{name} is {} v{}, expected {id} v{version}",
                    e.inode, cur.version
                )));
            }
        }
    }
    if let Some(e) = &current {
        if e.kind == InodeKind::Directory {
            return Err(MetaError::IsDirectory(e.inode));
        }
    }
    Ok(current)
}

async fn publish(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    dir: &Inode,
    name: &str,
    current: Option<DentryValue>,
    new: &Inode,
) -> MetaResult<()> {
    if let Some(old) = current {
        let old_inode = load_inode(txn, old.inode).await?;
        perm::check_sticky(dir, &old_inode, ctx.user)?;
        drop_link(txn, old.inode, ctx.prep.now_ns).await?;
    }
    touch_dir(txn, dir, ctx.prep.now_ns)?;
    set_entry(txn, dir.id, name, DentryValue { inode: new.id, kind: InodeKind::File })
}

/// Checks the attributes a publish sets (before anything is written).
fn check_publish_attrs(attrs: &PublishAttrs) -> MetaResult<()> {
    check_new_xattrs(&attrs.xattrs)
}

/// Checks extended attributes an inode is created or published with: at
/// most [`MAX_PUBLISH_XATTRS`], each within the SetXattr limits.
fn check_new_xattrs(xattrs: &[(String, Vec<u8>)]) -> MetaResult<()> {
    if xattrs.len() > MAX_PUBLISH_XATTRS {
        return Err(MetaError::TooLarge(format!("{} xattrs in one call (max {MAX_PUBLISH_XATTRS})", xattrs.len())));
    }
    for (name, value) in xattrs {
        check_xattr_name(name)?;
        if value.len() > MAX_XATTR_VALUE_BYTES {
            return Err(MetaError::TooLarge(format!("xattr {name} of {} bytes (max {MAX_XATTR_VALUE_BYTES})", value.len())));
        }
    }
    Ok(())
}

/// Applies [`PublishAttrs`] to an inode about to be saved.
fn apply_publish_attrs(txn: &mut dyn Transaction, inode: &mut Inode, attrs: &PublishAttrs) -> MetaResult<()> {
    if let Some(mtime) = attrs.mtime_ns {
        inode.mtime_ns = mtime;
        inode.atime_ns = mtime;
    }
    if let (Some(len), InodeData::File(f)) = (attrs.length, &mut inode.data) {
        if f.inline.is_none() {
            f.length = len;
        }
    }
    for (name, value) in &attrs.xattrs {
        txn.set(&xattr_key(inode.id, name), value)?;
    }
    Ok(())
}

pub async fn replace(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    parent: InodeId,
    name: &str,
    id: InodeId,
    expected: Option<&Expected>,
    attrs: &PublishAttrs,
) -> MetaResult<Inode> {
    check_name(name)?;
    check_publish_attrs(attrs)?;
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, WRITE | EXEC)?;
    let mut inode = load_inode(txn, id).await?;
    if inode.nlink != 0 || inode.file().is_none() {
        return Err(MetaError::InvalidArgument(format!("{id} is not an unpublished file")));
    }
    temp_lease(txn, id).await?;
    let current = check_expected(txn, parent, name, expected).await?;
    publish(txn, ctx, &dir, name, current, &inode).await?;
    inode.nlink = 1;
    bump(&mut inode, ctx.prep.now_ns);
    apply_publish_attrs(txn, &mut inode, attrs)?;
    save_inode(txn, &inode)?;
    txn.clear(&gc_key(id))?;
    tracing::debug!(parent = %parent, inode = %id, name, "replace");
    Ok(inode)
}

/// What [`create_write_publish`] publishes.
pub struct InlinePublish<'a> {
    pub mode: u32,
    pub data: &'a [u8],
    pub expected: Option<&'a Expected>,
    pub attrs: &'a PublishAttrs,
}

pub async fn create_write_publish(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    parent: InodeId,
    name: &str,
    p: InlinePublish<'_>,
) -> MetaResult<Inode> {
    check_name(name)?;
    check_publish_attrs(p.attrs)?;
    if p.data.len() > ctx.cfg.inline_max_bytes {
        return Err(MetaError::TooLarge(format!("{} bytes inline (max {})", p.data.len(), ctx.cfg.inline_max_bytes)));
    }
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, WRITE | EXEC)?;
    let current = check_expected(txn, parent, name, p.expected).await?;
    let file = InodeData::File(new_file_data(ctx, &dir, Some(p.data.to_vec())));
    let mut inode = new_inode(ctx, file, p.mode, 1, &dir)?;
    publish(txn, ctx, &dir, name, current, &inode).await?;
    apply_publish_attrs(txn, &mut inode, p.attrs)?;
    save_inode(txn, &inode)?;
    txn.atomic_add(KEY_INODE_COUNT, 1)?;
    Ok(inode)
}

/// [`MetaOp::OverwriteInline`]: the file `parent/name` must be inode
/// `expected.0` at version `expected.1`.
///
/// | step | keys |
/// |---|---|
/// | read | the directory's inode, the dirent, the file's inode |
/// | write | the file's inode (new bytes, version, mtime, ctime) |
///
/// The new version is `max(version + 1, ctx.prep.version_floor)`: above
/// every version issued before meta last started, so a relaxed overwrite
/// that power loss takes can never be matched by a later one (see
/// [`Prepared::version_floor`]).
pub async fn overwrite_inline(
    txn: &mut dyn Transaction,
    ctx: &OpCtx<'_>,
    parent: InodeId,
    name: &str,
    expected: (InodeId, u64),
    data: &[u8],
) -> MetaResult<Inode> {
    check_name(name)?;
    if data.len() > ctx.cfg.inline_max_bytes {
        return Err(MetaError::TooLarge(format!("{} bytes inline (max {})", data.len(), ctx.cfg.inline_max_bytes)));
    }
    let dir = load_dir(txn, parent).await?;
    perm::check(&dir, ctx.user, EXEC)?;
    let Some(entry) = get_entry(txn, parent, name).await? else {
        return Err(MetaError::PreconditionFailed(format!("{parent}/{name} does not exist")));
    };
    let mut inode = load_inode(txn, entry.inode).await?;
    if (entry.inode, inode.version) != expected {
        return Err(MetaError::PreconditionFailed(format!(
            "{parent}/{name} is {} v{}, expected {} v{}",
            entry.inode, inode.version, expected.0, expected.1
        )));
    }
    perm::check(&inode, ctx.user, WRITE)?;
    let id = inode.id;
    let f = file_mut(&mut inode)?;
    if f.inline.is_none() {
        return Err(MetaError::Unsupported(format!("{id} keeps its bytes in chunks, not inline")));
    }
    f.inline = Some(data.to_vec());
    f.length = data.len() as u64;
    let now = ctx.prep.now_ns;
    inode.mtime_ns = now;
    inode.ctime_ns = now;
    inode.version = inode.version.saturating_add(1).max(ctx.prep.version_floor);
    save_inode(txn, &inode)?;
    Ok(inode)
}

/// The root directory, created at first start.
pub fn root_inode(cfg: &MetaConfig, now_ns: u64) -> Inode {
    Inode {
        id: InodeId::ROOT,
        data: InodeData::Directory(DirData { parent: InodeId::ROOT, name: String::new(), layout: cfg.root_layout.clone() }),
        acl: Acl { uid: 0, gid: 0, mode: 0o755 },
        nlink: 1,
        atime_ns: now_ns,
        mtime_ns: now_ns,
        ctime_ns: now_ns,
        version: 1,
    }
}
