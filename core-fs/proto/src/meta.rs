//! Wire types of the metadata service: inodes, layouts, requests and replies,
//! and the pure layout function [`chain_for_chunk`] every client uses to map a
//! chunk of a file to its chain (meta is off the data path).
//!
//! The layout shuffle is specified in `docs/meta.md` ("Layout and shuffle") so
//! that a client in any language reproduces it bit for bit: a Fisher–Yates
//! shuffle driven by SplitMix64 seeded with the file's `seed`.

use fskv_types::ids::{ChainId, InodeId};
use fskv_types::Status;
use serde::{Deserialize, Serialize};

/// Longest name of a directory entry, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Longest symlink target, in bytes.
pub const MAX_SYMLINK_TARGET_BYTES: usize = 4096;
/// Largest xattr value, in bytes.
pub const MAX_XATTR_VALUE_BYTES: usize = 64 * 1024;
/// Most entries one readdir page returns.
pub const MAX_READDIR_LIMIT: u32 = 4096;
/// Default largest file kept inline in its inode, in bytes.
pub const DEFAULT_INLINE_MAX_BYTES: usize = 4096;
/// Most operations in one batch request.
pub const MAX_BATCH_OPS: usize = 1024;

/// Permission bits (`mode & 0o7777`): setuid, setgid, sticky and rwx for
/// owner, group, other.
pub const MODE_PERM_MASK: u32 = 0o7777;
pub const MODE_STICKY: u32 = 0o1000;

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InodeKind {
    File,
    Directory,
    Symlink,
    /// A FIFO, socket or device node: metadata only (the kernel serves it).
    Special(SpecialKind),
}

/// The kinds of special file `mknod(2)` makes besides regular files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SpecialKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl SpecialKind {
    /// Device nodes (only root may make them).
    pub fn is_device(self) -> bool {
        matches!(self, SpecialKind::CharDevice | SpecialKind::BlockDevice)
    }
}

/// Owner, group and permission bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits only (`MODE_PERM_MASK`); the type is in [`InodeKind`].
    pub mode: u32,
}

/// Where the chunks of one file live.
///
/// `chains` are the `stripe` chains picked at create time (consecutive,
/// round-robin from chain table `table_id`), **before** the shuffle;
/// [`FileLayout::shuffled_chains`] applies the per-file shuffle with `seed`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLayout {
    pub table_id: u32,
    pub table_version: u32,
    pub chunk_size_bytes: u32,
    pub chains: Vec<ChainId>,
    pub seed: u64,
}

impl FileLayout {
    pub fn stripe_size(&self) -> u32 {
        u32::try_from(self.chains.len()).unwrap_or(u32::MAX)
    }

    /// The stripe's chains after the per-file shuffle: chunk `i` lives on
    /// element `i % stripe`.
    pub fn shuffled_chains(&self) -> Vec<ChainId> {
        let mut out = self.chains.clone();
        shuffle_with_seed(&mut out, self.seed);
        out
    }
}

/// The chain that holds chunk `chunk_index` of a file with `layout`, or `None`
/// for a layout without chains (an inline-only file).
pub fn chain_for_chunk(layout: &FileLayout, chunk_index: u64) -> Option<ChainId> {
    let stripe = layout.chains.len() as u64;
    if stripe == 0 {
        return None;
    }
    let shuffled = layout.shuffled_chains();
    shuffled.get((chunk_index % stripe) as usize).copied()
}

/// SplitMix64 (Steele, Lea, Flood 2014): the PRNG of the layout shuffle.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Fisher–Yates from the last element down: for `i` in `n-1 ..= 1`,
/// `j = next_u64() % (i + 1)`, swap `i` and `j`. (The modulo bias is part of
/// the specification; it is negligible for stripes below 2^32.)
pub fn shuffle_with_seed<T>(items: &mut [T], seed: u64) {
    let mut rng = SplitMix64::new(seed);
    for i in (1..items.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// How new files in a directory are laid out (inherited by subdirectories).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutPolicy {
    pub table_id: u32,
    pub table_version: u32,
    pub chunk_size_bytes: u32,
    pub stripe_size: u32,
}

/// File-specific attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileData {
    /// Length in bytes (eventually consistent while writers are open).
    pub length: u64,
    /// Bumped by every truncate; length reports carrying an older value are ignored.
    pub truncate_version: u64,
    pub layout: FileLayout,
    /// How many chains (in shuffled order) may hold chunks: starts at
    /// min(16, stripe) and doubles as the file grows.
    pub dyn_stripe: u32,
    /// The file's bytes when it is stored inline (small files). Bytes, not
    /// a sequence of u8 (`serde_bytes`): the same bincode encoding, decoded
    /// with one copy instead of byte by byte.
    #[serde(with = "serde_bytes")]
    pub inline: Option<Vec<u8>>,
}

/// Directory-specific attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirData {
    /// The parent directory (the root is its own parent).
    pub parent: InodeId,
    /// The name in the parent (empty for the root).
    pub name: String,
    /// Default layout of files created inside.
    pub layout: LayoutPolicy,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InodeData {
    File(FileData),
    Directory(DirData),
    Symlink {
        target: String,
    },
    /// A special file; `rdev` is the device number of a device node (0 otherwise).
    Special {
        kind: SpecialKind,
        rdev: u64,
    },
}

/// One inode as stored and as returned by stat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub id: InodeId,
    pub data: InodeData,
    pub acl: Acl,
    /// Entries naming this inode (always 1 for a live directory; 0 = being removed).
    pub nlink: u32,
    /// Nanoseconds since the Unix epoch.
    pub atime_ns: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    /// Bumped by every change of the inode; the compare-and-swap of
    /// [`MetaOp::Replace`] checks it.
    pub version: u64,
}

impl Inode {
    pub fn kind(&self) -> InodeKind {
        match self.data {
            InodeData::File(_) => InodeKind::File,
            InodeData::Directory(_) => InodeKind::Directory,
            InodeData::Symlink { .. } => InodeKind::Symlink,
            InodeData::Special { kind, .. } => InodeKind::Special(kind),
        }
    }

    pub fn file(&self) -> Option<&FileData> {
        match &self.data {
            InodeData::File(f) => Some(f),
            _ => None,
        }
    }

    pub fn dir(&self) -> Option<&DirData> {
        match &self.data {
            InodeData::Directory(d) => Some(d),
            _ => None,
        }
    }

    /// The length in bytes stat reports.
    pub fn size_bytes(&self) -> u64 {
        match &self.data {
            InodeData::File(f) => f.length,
            InodeData::Directory(_) => 0,
            InodeData::Symlink { target } => target.len() as u64,
            InodeData::Special { .. } => 0,
        }
    }

    /// The device number of a device node (0 for every other inode).
    pub fn rdev(&self) -> u64 {
        match &self.data {
            InodeData::Special { rdev, .. } => *rdev,
            _ => 0,
        }
    }
}

/// The caller's identity for permission checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct UserInfo {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl UserInfo {
    pub fn root() -> Self {
        UserInfo::default()
    }

    pub fn new(uid: u32, gid: u32) -> Self {
        UserInfo { uid, gid, groups: Vec::new() }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// Precondition of [`MetaOp::Replace`] / [`MetaOp::CreateWritePublish`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expected {
    /// The name must not exist.
    Absent,
    /// The name must point to this inode at this version.
    Inode { id: InodeId, version: u64 },
}

/// What [`MetaOp::Replace`] / [`MetaOp::CreateWritePublish`] set on the
/// published inode in the same transaction (the S3 gateway publishes an
/// object's data, length and metadata at once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PublishAttrs {
    /// Exact length of a non-inline file whose chunks the caller wrote (it
    /// knows the length: every write was acknowledged). Ignored for inline files.
    pub length: Option<u64>,
    /// The file's mtime (and atime); `None` keeps the inode's.
    pub mtime_ns: Option<u64>,
    /// Extended attributes set (created or replaced), at most
    /// [`MAX_PUBLISH_XATTRS`], each within the SetXattr limits.
    pub xattrs: Vec<(String, Vec<u8>)>,
}

/// Most extended attributes one publish sets.
pub const MAX_PUBLISH_XATTRS: usize = 16;

/// How [`MetaOp::SetXattr`] treats an existing attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrFlag {
    /// Create or replace.
    Any,
    /// Fail with AlreadyExists if it exists.
    Create,
    /// Fail with NotFound if it does not exist.
    Replace,
}

/// Attribute changes of [`MetaOp::SetAttr`]; `None` leaves a field alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime_ns: Option<u64>,
    pub mtime_ns: Option<u64>,
}

/// Every metadata operation. Names are UTF-8, at most [`MAX_NAME_BYTES`],
/// without `/` or NUL, and not `.` or `..`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOp {
    Lookup {
        parent: InodeId,
        name: String,
    },
    Stat {
        inode: InodeId,
    },
    /// Creates a file (or opens the existing one unless `exclusive`).
    /// With `write` a write session is opened too ([`MetaReply::Opened`]).
    Create {
        parent: InodeId,
        name: String,
        mode: u32,
        exclusive: bool,
        write: bool,
    },
    Open {
        inode: InodeId,
        write: bool,
    },
    /// Ends a write session and fixes the length: exact from storage when it
    /// knows, else the larger of the stored length and `length_hint` (ignored
    /// when `truncate_version` is older than the file's: a truncate since).
    /// `wrote`: the handle attempted a write (mtime/ctime move only then, or
    /// when the length changes). `writes_settled`: every write of the handle
    /// succeeded, so `length_hint` is exactly where they end. On an inode
    /// with no other open write session, a close that did not write, or
    /// whose writes settled at the file's current truncate version, takes
    /// the larger of the stored length and the hint without asking storage.
    Close {
        inode: InodeId,
        session: u64,
        length_hint: Option<u64>,
        truncate_version: u64,
        wrote: bool,
        writes_settled: bool,
    },
    /// A directory, with `xattrs` (at most [`MAX_PUBLISH_XATTRS`], each
    /// within the SetXattr limits) set in the same transaction: a directory
    /// whose attributes say what it is (an S3 bucket's layout) is never
    /// seen without them.
    Mkdir {
        parent: InodeId,
        name: String,
        mode: u32,
        #[serde(default)]
        xattrs: Vec<(String, Vec<u8>)>,
    },
    Rmdir {
        parent: InodeId,
        name: String,
    },
    Unlink {
        parent: InodeId,
        name: String,
    },
    /// Unlinks `parent/name` (not a directory) only if `expected` holds:
    /// compare-and-delete (the KV gateway's conditional delete, eviction
    /// and expiry never remove a value written since they looked).
    UnlinkExpected {
        parent: InodeId,
        name: String,
        expected: Expected,
    },
    Rename {
        src_parent: InodeId,
        src_name: String,
        dst_parent: InodeId,
        dst_name: String,
    },
    Symlink {
        parent: InodeId,
        name: String,
        target: String,
    },
    Readlink {
        inode: InodeId,
    },
    /// Hard link: a new entry for an existing non-directory inode.
    Link {
        inode: InodeId,
        parent: InodeId,
        name: String,
    },
    /// Entries after `start_after` (exclusive; empty = from the start), in
    /// byte order of names, at most `limit` (≤ [`MAX_READDIR_LIMIT`]).
    Readdir {
        dir: InodeId,
        start_after: String,
        limit: u32,
        with_attrs: bool,
    },
    SetAttr {
        inode: InodeId,
        attr: SetAttr,
    },
    /// Sets the length. `session` (0 = none) names an open write session of
    /// this client on the inode: it stands for the write permission checked
    /// at open (ftruncate on a descriptor opened for writing).
    Truncate {
        inode: InodeId,
        length: u64,
        session: u64,
    },
    /// A writer's periodic report of the largest offset it wrote.
    ReportLength {
        inode: InodeId,
        length: u64,
        truncate_version: u64,
    },
    GetXattr {
        inode: InodeId,
        name: String,
    },
    SetXattr {
        inode: InodeId,
        name: String,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        flag: XattrFlag,
    },
    ListXattr {
        inode: InodeId,
    },
    RemoveXattr {
        inode: InodeId,
        name: String,
    },
    StatFs,
    /// Detaches the whole tree under `parent/name` in one transaction; it is
    /// reclaimed (chunks, then inodes) in the background.
    RemoveTree {
        parent: InodeId,
        name: String,
    },
    /// A file without a name (nlink 0), to be written and then published with
    /// [`MetaOp::Replace`]. `parent` supplies the layout and permissions.
    CreateUnlinked {
        parent: InodeId,
        mode: u32,
    },
    /// Writes bytes of an inline file (the file must stay within the inline limit).
    WriteInline {
        inode: InodeId,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Reads bytes of an inline file.
    ReadInline {
        inode: InodeId,
        offset: u64,
        len: u32,
    },
    /// Publishes the unlinked `inode` under `parent/name`, atomically
    /// replacing what is there (not a directory), if `expected` holds.
    Replace {
        parent: InodeId,
        name: String,
        inode: InodeId,
        expected: Option<Expected>,
        attrs: PublishAttrs,
    },
    /// Creates an inline file with `data` and publishes it under
    /// `parent/name` in one transaction (replacing a file there if `expected` holds).
    CreateWritePublish {
        parent: InodeId,
        name: String,
        mode: u32,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        expected: Option<Expected>,
        attrs: PublishAttrs,
    },
    /// Replaces the whole content of the inline file `parent/name` in place
    /// if the name is `inode` at `version` (else PreconditionFailed): the
    /// inode keeps its id, its version goes up by one, mtime and ctime are
    /// now; the directory does not change. x on `parent` and w on the file
    /// needed; `Unsupported` if the file keeps its bytes in chunks,
    /// `TooLarge` past the inline limit. The CAS files of the gateways (a
    /// partition's state, a group's offsets): three keys written where
    /// [`MetaOp::CreateWritePublish`] writes a new inode, a dirent and the
    /// old inode's tombstones. Always synced before the reply, even in a
    /// `relaxed` request: a lost overwrite would let the same (inode,
    /// version) name two contents (docs/meta.md "Relaxed durability").
    /// Replies the inode.
    OverwriteInline {
        parent: InodeId,
        name: String,
        inode: InodeId,
        version: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Makes a FIFO, socket or device node (`rdev` for devices; root only).
    Mknod {
        parent: InodeId,
        name: String,
        mode: u32,
        kind: SpecialKind,
        rdev: u64,
    },
    /// Renews the lease of an unpublished [`MetaOp::CreateUnlinked`] inode:
    /// its `temp_inode_ttl_ms` counts again from now, so GC leaves a slow
    /// upload alone while its writer lives. `NotFound` once GC has claimed
    /// the inode (a later `Replace` of it fails too). Replies `Done`.
    RenewTemp {
        inode: InodeId,
    },
    /// Namespace changes that commit together or not at all, in order, each
    /// seeing the ones before it: the S3 gateway's versioning moves (link
    /// the superseded object into the version store and publish the new
    /// one; move the current object away and create a delete marker). At
    /// most [`MAX_TXN_OPS`] ops of these kinds: Link, Unlink,
    /// UnlinkExpected, Rename, Replace, CreateWritePublish, SetXattr,
    /// RemoveXattr, Expect; at most one creates an inode. The first op routes the
    /// request. Replies [`MetaReply::Many`], one reply per op.
    Txn {
        ops: Vec<MetaOp>,
    },
    /// Fails with PreconditionFailed unless `parent/name` is as `expected`
    /// (x on `parent` needed); changes nothing. A [`MetaOp::Txn`]'s guard:
    /// later ops of the txn (a Link, a Rename) change the inode's version,
    /// so the check comes first. Replies `Done`.
    Expect {
        parent: InodeId,
        name: String,
        expected: Expected,
    },
    /// Lookup, and the found inode's extended attribute `xattr` read in the
    /// same transaction (`None` when it has none): what Lookup then GetXattr
    /// answer, in one round trip (the S3 gateway's GET and HEAD read an
    /// object and its record so). Needs x on `parent` and r on the inode,
    /// as the two would. Replies [`MetaReply::InodeXattr`].
    LookupXattr {
        parent: InodeId,
        name: String,
        xattr: String,
    },
    /// Walks `names` down from `parent` (a Lookup per name, each in the
    /// directory the one before found) and reads the last inode's extended
    /// attribute `xattr`, all in one transaction: the S3 gateway's GET and
    /// HEAD find the bucket, the key's entry and its record so, in one round
    /// trip. The walk stops without an error at the first name that is
    /// absent, and after an inode that is not a directory while names
    /// remain; other errors (a name that is not valid, x missing on a
    /// directory) fail the op as Lookup would. 1 ..= [`MAX_WALK_NAMES`]
    /// names. Replies [`MetaReply::Walk`].
    WalkXattr {
        parent: InodeId,
        names: Vec<String>,
        xattr: String,
    },
}

/// Most ops one [`MetaOp::Txn`] holds.
pub const MAX_TXN_OPS: usize = 8;

/// Most names one [`MetaOp::WalkXattr`] walks (a 1 KiB S3 key has at most
/// 512 components; a gateway walks longer paths step by step).
pub const MAX_WALK_NAMES: usize = 64;

impl MetaOp {
    /// Whether `self` may be an op of a [`MetaOp::Txn`].
    pub fn allowed_in_txn(&self) -> bool {
        matches!(
            self,
            MetaOp::Link { .. }
                | MetaOp::Expect { .. }
                | MetaOp::Unlink { .. }
                | MetaOp::UnlinkExpected { .. }
                | MetaOp::Rename { .. }
                | MetaOp::Replace { .. }
                | MetaOp::CreateWritePublish { .. }
                | MetaOp::SetXattr { .. }
                | MetaOp::RemoveXattr { .. }
        )
    }

    /// Whether a retry must return the first result (the op changes state and
    /// is not naturally idempotent); such ops record their result under the
    /// request id.
    pub fn needs_idempotency(&self) -> bool {
        matches!(
            self,
            MetaOp::Create { .. }
                | MetaOp::Mkdir { .. }
                | MetaOp::Rmdir { .. }
                | MetaOp::Unlink { .. }
                | MetaOp::UnlinkExpected { .. }
                | MetaOp::Rename { .. }
                | MetaOp::Symlink { .. }
                | MetaOp::Mknod { .. }
                | MetaOp::Link { .. }
                | MetaOp::RemoveTree { .. }
                | MetaOp::CreateUnlinked { .. }
                | MetaOp::Replace { .. }
                | MetaOp::CreateWritePublish { .. }
                | MetaOp::OverwriteInline { .. }
                | MetaOp::Open { write: true, .. }
                // A retried create-only set or a retried remove would fail
                // (EEXIST / ENODATA) after a first attempt that committed.
                | MetaOp::SetXattr { .. }
                | MetaOp::RemoveXattr { .. }
                | MetaOp::Txn { .. }
        )
    }

    /// The inode whose hash routes this op to a meta server / batch queue:
    /// the parent directory for namespace ops, the file itself otherwise.
    pub fn routing_inode(&self) -> InodeId {
        match self {
            MetaOp::Lookup { parent, .. }
            | MetaOp::LookupXattr { parent, .. }
            | MetaOp::WalkXattr { parent, .. }
            | MetaOp::Create { parent, .. }
            | MetaOp::Mkdir { parent, .. }
            | MetaOp::Rmdir { parent, .. }
            | MetaOp::Unlink { parent, .. }
            | MetaOp::UnlinkExpected { parent, .. }
            | MetaOp::Expect { parent, .. }
            | MetaOp::Symlink { parent, .. }
            | MetaOp::Mknod { parent, .. }
            | MetaOp::Link { parent, .. }
            | MetaOp::RemoveTree { parent, .. }
            | MetaOp::CreateUnlinked { parent, .. }
            | MetaOp::Replace { parent, .. }
            | MetaOp::CreateWritePublish { parent, .. }
            | MetaOp::OverwriteInline { parent, .. } => *parent,
            MetaOp::Rename { dst_parent, .. } => *dst_parent,
            MetaOp::Readdir { dir, .. } => *dir,
            MetaOp::Stat { inode }
            | MetaOp::Open { inode, .. }
            | MetaOp::Close { inode, .. }
            | MetaOp::Readlink { inode }
            | MetaOp::SetAttr { inode, .. }
            | MetaOp::Truncate { inode, .. }
            | MetaOp::ReportLength { inode, .. }
            | MetaOp::GetXattr { inode, .. }
            | MetaOp::SetXattr { inode, .. }
            | MetaOp::ListXattr { inode }
            | MetaOp::RemoveXattr { inode, .. }
            | MetaOp::WriteInline { inode, .. }
            | MetaOp::ReadInline { inode, .. }
            | MetaOp::RenewTemp { inode } => *inode,
            MetaOp::StatFs => InodeId::ROOT,
            MetaOp::Txn { ops } => ops.first().map_or(InodeId::ROOT, MetaOp::routing_inode),
        }
    }
}

/// One request: the op, who asks, and the ids that make a retry idempotent
/// (`request_id` 0 = no idempotency record).
///
/// `relaxed`: the change may be acknowledged before it is fsync'ed (the
/// FUSE mount's namespace ops; POSIX makes them durable at fsync(2)). It
/// survives a crash of meta (kill -9) all the same; power loss can take
/// relaxed changes younger than meta's `relaxed_sync_interval_ms` that no
/// [`MetaSyncCall`] or later synced change covered. A group of requests
/// committed together is synced if any of them is not relaxed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaRequest {
    pub client_id: u64,
    pub request_id: u64,
    pub user: UserInfo,
    pub op: MetaOp,
    pub relaxed: bool,
    /// Owner of every inode this request creates (`Mkdir`, `Create`,
    /// `CreateUnlinked`, `CreateWritePublish`, …) instead of `user`'s
    /// uid/gid, set in the same transaction as the inode (no window where it
    /// is the creator's). Only a request acting as uid 0 may name one
    /// (anyone else: `PermissionDenied`, nothing created): the gateways act
    /// as root and create a tenant's buckets, objects and values owned by
    /// the tenant's uid/gid (docs/security.md, "Tenants, users and owners").
    pub owner: Option<NewOwner>,
}

/// The uid/gid a request's new inodes get (see [`MetaRequest::owner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOwner {
    pub uid: u32,
    pub gid: u32,
}

/// Asks meta to make every change it acknowledged so far durable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRequest {}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncReply {}

/// A batch of independent requests (each succeeds or fails on its own).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaBatchRequest {
    pub requests: Vec<MetaRequest>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaBatchResponse {
    pub results: Vec<Result<MetaReply, Status>>,
}

/// One entry of a readdir page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub inode: InodeId,
    pub kind: InodeKind,
    /// With `with_attrs`: the child's inode (inline bytes stripped).
    pub attr: Option<Inode>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    pub inodes: u64,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// Replies; which variant each op returns is documented on [`MetaOp`] and in
/// `docs/meta.md`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    /// Lookup, Stat, Create (without `write`), Mkdir, Symlink, Link, SetAttr,
    /// Truncate, ReportLength, Close, CreateUnlinked, WriteInline, Replace,
    /// CreateWritePublish, Open (read).
    Inode(Inode),
    /// Open / Create with `write`: the inode and the write session id.
    Opened {
        inode: Inode,
        session: u64,
    },
    /// Rmdir, Unlink, UnlinkExpected, Rename, SetXattr, RemoveXattr, RemoveTree,
    /// RenewTemp.
    Done,
    Target(String),
    Entries {
        entries: Vec<DirEntry>,
        more: bool,
    },
    Xattr(#[serde(with = "serde_bytes")] Vec<u8>),
    XattrNames(Vec<String>),
    StatFs(StatFs),
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Txn: the reply of each of its ops, in order.
    Many(Vec<MetaReply>),
    /// LookupXattr: the inode and its attribute's value, if it has it.
    InodeXattr {
        inode: Inode,
        #[serde(with = "serde_bytes")]
        value: Option<Vec<u8>>,
    },
    /// WalkXattr: the inodes found, one per name from the first, ending
    /// where the walk stopped (fewer than the names when one was absent or
    /// a directory was expected); the last name's attribute value when
    /// every name was found and it has the attribute.
    Walk {
        inodes: Vec<Inode>,
        #[serde(with = "serde_bytes")]
        value: Option<Vec<u8>>,
    },
}

// ----- consistency check (`meta.Fsck`, admin) -----

/// Most problems one [`FsckReply`] lists (the counts cover all of them).
pub const MAX_FSCK_PROBLEMS: u32 = 10_000;
/// Default of [`FsckRequest::max_problems`].
pub const DEFAULT_FSCK_PROBLEMS: u32 = 1_000;
/// Most inodes one check keeps in memory; a larger namespace is refused
/// (`ResourceExhausted`) instead of exhausting the server's memory.
pub const MAX_FSCK_INODES: u64 = 20_000_000;

/// `meta.Fsck`: a read-only consistency check of the whole namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckRequest {
    /// Problems to list in the reply (≤ [`MAX_FSCK_PROBLEMS`]); all are counted.
    pub max_problems: u32,
    /// Keys per range read (0 = the server's default; capped by the server).
    pub page_keys: u32,
}

/// What one fsck problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FsckProblemKind {
    /// An entry whose parent is not a directory inode.
    ParentNotDirectory,
    /// An entry pointing to a missing inode.
    DanglingEntry,
    /// An entry whose kind differs from its inode's.
    KindMismatch,
    /// A directory whose `parent`/`name` differ from the entry naming it.
    DirectoryNameMismatch,
    /// A directory named by more than one entry.
    DirectoryMultiplyNamed,
    /// An inode that is not the root, not named and not queued for GC.
    Orphan,
    /// A non-directory whose nlink differs from its number of entries.
    NlinkMismatch,
    /// A live directory whose parents do not lead to the root.
    Unreachable,
    /// A key or value that does not decode.
    Undecodable,
    /// A live directory whose subdirectory counter (its nlink − 2) differs
    /// from its number of directory entries that are directories.
    SubdirCountMismatch,
}

/// One problem found by fsck.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckProblem {
    pub kind: FsckProblemKind,
    /// The inode concerned (the entry's parent for entry problems; 0 if unknown).
    pub inode: InodeId,
    /// Human-readable details.
    pub detail: String,
}

/// The result of `meta.Fsck`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckReply {
    pub inodes: u64,
    pub entries: u64,
    pub gc_queued: u64,
    /// Every problem found; `problems` lists the first `max_problems` of them.
    pub problems_total: u64,
    pub problems: Vec<FsckProblem>,
    /// KV read transactions used (more than one when a transaction grew too
    /// old during the scan: then concurrent changes can show as problems).
    pub transactions: u32,
    pub elapsed_ms: u64,
}

// ----- chunk capabilities (`meta.IssueCap`) -----

/// Asks for a chunk capability for `inode` (a regular file), bound to the
/// caller's principal: read (`write` false) needs the read permission of
/// the acting user, read-write needs the write permission, as `Open` checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapRequest {
    pub inode: InodeId,
    pub write: bool,
    /// The user the call acts as (trusted principals; a `user:` principal acts as itself).
    pub user: UserInfo,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapReply {
    pub cap: crate::cap::ChunkCap,
}

// ----- methods -----

fskv_rpc::rpc_method!(
    /// One [`MetaRequest`].
    "meta", MetaCall = 1000, MetaRequest => MetaReply
);
fskv_rpc::rpc_method!(
    /// Several independent requests in one round trip.
    "meta", MetaBatchCall = 1001, MetaBatchRequest => MetaBatchResponse
);
fskv_rpc::rpc_method!(
    /// The read-only consistency check of the namespace (admin).
    "meta", MetaFsckCall = 1002, FsckRequest => FsckReply
);
fskv_rpc::rpc_method!(
    /// A durability barrier: every change acknowledged before it is fsync'ed
    /// when it returns (the FUSE mount's fsync(2) / fsyncdir(2)).
    "meta", MetaSyncCall = 1003, SyncRequest => SyncReply
);
fskv_rpc::rpc_method!(
    /// A chunk capability for one inode (docs/security.md): what a `user:`
    /// principal shows storage with each data-path request.
    "meta", MetaIssueCap = 1004, CapRequest => CapReply
);

#[cfg(test)]
mod tests {
    use super::*;

    /// `serde_bytes` on the byte fields changed how they are decoded, not
    /// their encoding: values stored and sent before it read the same.
    #[test]
    fn byte_fields_encode_as_a_plain_vec_of_u8_did() {
        use bincode::Options;
        #[derive(serde::Serialize)]
        struct PlainFileData {
            length: u64,
            truncate_version: u64,
            layout: FileLayout,
            dyn_stripe: u32,
            inline: Option<Vec<u8>>,
        }
        let codec = || bincode::DefaultOptions::new().with_fixint_encoding().with_little_endian();
        let layout = FileLayout { table_id: 1, table_version: 2, chunk_size_bytes: 4096, chains: vec![ChainId(7)], seed: 9 };
        for inline in [None, Some(vec![]), Some((0..=255u8).cycle().take(1500).collect::<Vec<u8>>())] {
            let new = FileData { length: 5, truncate_version: 1, layout: layout.clone(), dyn_stripe: 1, inline: inline.clone() };
            let old = PlainFileData { length: 5, truncate_version: 1, layout: layout.clone(), dyn_stripe: 1, inline };
            let bytes = codec().serialize(&old).unwrap();
            assert_eq!(codec().serialize(&new).unwrap(), bytes);
            assert_eq!(codec().deserialize::<FileData>(&bytes).unwrap(), new);
        }
        let data = (0..=255u8).collect::<Vec<u8>>();
        let plain = codec().serialize(&(5u32, data.clone())).unwrap();
        let reply = codec().serialize(&MetaReply::Data(data.clone())).unwrap();
        assert_eq!(&reply[4..], &plain[4..], "a variant index, then the bytes as a Vec<u8>");
    }

    fn layout(n: u32, seed: u64) -> FileLayout {
        FileLayout { table_id: 1, table_version: 1, chunk_size_bytes: 1 << 20, chains: (1..=n).map(ChainId).collect(), seed }
    }

    #[test]
    fn splitmix64_reference_values() {
        // First outputs of SplitMix64 seeded with 0 (the published reference values).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn shuffle_has_fixed_expected_outputs() {
        let l = layout(8, 42);
        let got: Vec<u32> = l.shuffled_chains().iter().map(|c| c.0).collect();
        assert_eq!(got, FIXED_8_SEED_42.to_vec());
        let chunk: Vec<u32> = (0..10).map(|i| chain_for_chunk(&l, i).map(|c| c.0).unwrap_or(0)).collect();
        let mut expect: Vec<u32> = FIXED_8_SEED_42.to_vec();
        expect.extend_from_slice(&FIXED_8_SEED_42[..2]);
        assert_eq!(chunk, expect);
        let l1 = layout(1, 7);
        assert_eq!(chain_for_chunk(&l1, 12345), Some(ChainId(1)));
        assert_eq!(chain_for_chunk(&layout(0, 7), 0), None);
    }

    // Cross-checked with an independent Python implementation (docs/meta.md).
    const FIXED_8_SEED_42: [u32; 8] = [4, 2, 7, 3, 5, 1, 8, 6];

    #[test]
    fn shuffle_is_a_permutation_and_seed_dependent() {
        let a = layout(16, 1).shuffled_chains();
        let b = layout(16, 2).shuffled_chains();
        assert_ne!(a, b);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, layout(16, 1).chains);
    }
}
