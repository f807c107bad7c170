//! The filesystem side: namespaces are directories under the root, a key
//! is a file at the path [`KeyPath`] gives (continuation directories for
//! long keys, made on demand and removed when emptied), a value is the
//! file's data. The gateway's own state lives in `ROOT/.fskv-kv/`
//! (not a namespace name):
//!
//! | path | what |
//! |---|---|
//! | `ROOT/<ns>/` | the namespace; its settings in the xattr `user.kv.ns` (JSON [`NamespaceConfig`]) |
//! | `ROOT/<ns>/<name>` | a key (see `keys.rs` for names) |
//! | `ROOT/.fskv-kv/recency/<ns>/<time>-<process>-<seq>` | access logs of every gateway process (see `recency.rs`) |
//! | `ROOT/.fskv-kv/checkpoint/<ns>` | the writer's merged recency and counters |
//! | `ROOT/.fskv-kv/stats/<ns>` | the writer's stats of the namespace, for readers |

use crate::config::NamespaceConfig;
use crate::error::{KvError, Result};
use crate::keys::{self, KeyPath};
use crate::record::{self, Record, XATTR_RECORD};
use fskv_client::{keyname, FsClient};
use fskv_gateway::TenantIds;
use fskv_proto::meta::{Expected, Inode, InodeKind, MetaOp, MetaReply, NewOwner, PublishAttrs, XattrFlag};
use fskv_types::{ErrorCode, InodeId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub const SYSTEM_DIR: &str = ".fskv-kv";
pub const XATTR_NAMESPACE: &str = "user.kv.ns";
/// Mode of continuation directories (and the gateway's own under `.fskv-kv`).
pub const DIR_MODE: u32 = 0o700;
/// Mode of a namespace's directory: only its tenant's uid (and root) gets
/// in, so other local users see nothing of it through the FUSE mount.
pub const NAMESPACE_DIR_MODE: u32 = 0o700;
/// Mode of the KV root: a tenant's local user reaches its namespace through
/// the mount; nobody lists the namespaces.
pub const ROOT_MODE: u32 = 0o711;
/// How long a namespace's directory id and settings are cached.
pub const NAMESPACE_CACHE_TTL_MS: u64 = 2_000;
/// How long a continuation directory's id is cached.
pub const DIR_CACHE_TTL_MS: u64 = 2_000;
pub const DIR_CACHE_MAX_ENTRIES: usize = 65_536;

/// A namespace as the gateway knows it.
#[derive(Clone, Debug)]
pub struct Namespace {
    pub name: String,
    pub dir: InodeId,
    pub config: NamespaceConfig,
    /// Owner uid of the namespace's directory: the uid of the tenant that
    /// owns it (root, 0, for tenant `default` and everything made before tenants).
    pub owner_uid: u32,
    /// Owner gid of the namespace's directory (the tenant's gid).
    pub owner_gid: u32,
}

impl Namespace {
    /// Who owns the values and continuation directories made in it: the
    /// namespace's tenant (set by meta in the creating transaction).
    pub fn new_owner(&self) -> Option<NewOwner> {
        Some(NewOwner { uid: self.owner_uid, gid: self.owner_gid })
    }
}

/// The gateway's directories under `ROOT/.fskv-kv`.
#[derive(Clone, Copy, Debug)]
pub struct SystemDirs {
    pub recency: InodeId,
    pub checkpoint: InodeId,
    pub stats: InodeId,
}

/// Namespaces: name → (namespace, when cached).
type NsCache = HashMap<String, (Arc<Namespace>, Instant)>;
/// Continuation directories: (parent, name) → (id, when cached).
type DirCache = HashMap<(InodeId, String), (InodeId, Instant)>;

#[derive(Clone)]
pub struct Store {
    pub fs: FsClient,
    pub root: InodeId,
    pub system: SystemDirs,
    namespaces: Arc<Mutex<NsCache>>,
    dirs: Arc<Mutex<DirCache>>,
}

fn meta_err(e: fskv_client::MetaClientError, what: impl std::fmt::Display, not_found: KvError) -> KvError {
    KvError::from_code(e.code(), what, not_found)
}

/// A value about to be published.
pub enum Data {
    Inline(bytes::Bytes),
    Temp(Arc<fskv_client::FileHandle>),
}

impl Store {
    /// The same store creating every inode owned by `ns`'s tenant (a
    /// value's temp inode: see `body::ValueWriter`).
    pub fn owned_by(&self, ns: &Namespace) -> Store {
        Store { fs: self.fs.with_owner(ns.new_owner()), ..self.clone() }
    }

    /// Resolves (and creates) `root_path` and the gateway's own directories.
    pub async fn open(fs: FsClient, root_path: &str) -> std::result::Result<Store, String> {
        let mut cur = InodeId::ROOT;
        for name in root_path.split('/').filter(|c| !c.is_empty()) {
            cur = mkdir_p(&fs, cur, name).await.map_err(|e| format!("{root_path}: {e}"))?;
        }
        let system = mkdir_p(&fs, cur, SYSTEM_DIR).await?;
        let dirs = SystemDirs {
            recency: mkdir_p(&fs, system, "recency").await?,
            checkpoint: mkdir_p(&fs, system, "checkpoint").await?,
            stats: mkdir_p(&fs, system, "stats").await?,
        };
        let store = Store { fs, root: cur, system: dirs, namespaces: Arc::default(), dirs: Arc::default() };
        store.tighten_modes(system).await;
        Ok(store)
    }

    /// Keeps other local users out (the FUSE mount is `allow_other`): the
    /// root [`ROOT_MODE`] (traversable, not listable), the gateway's own
    /// directory (access logs name keys) and every namespace made before
    /// tenants (group or other bits set) [`NAMESPACE_DIR_MODE`]. Failures
    /// are logged; only what differs is changed.
    async fn tighten_modes(&self, system: InodeId) {
        let meta = self.fs.meta();
        let set = |mode| fskv_proto::meta::SetAttr { mode: Some(mode), ..Default::default() };
        for (dir, mode) in [(self.root, ROOT_MODE), (system, NAMESPACE_DIR_MODE)] {
            match meta.stat(dir).await {
                Ok(i) if i.acl.mode & 0o7777 != mode => {
                    if let Err(e) = meta.setattr(dir, set(mode)).await {
                        tracing::warn!(error = %e, "cannot set the mode of a KV directory");
                    }
                }
                _ => {}
            }
        }
        let mut after = String::new();
        loop {
            let Ok((entries, more)) = meta.readdir(self.root, &after, 1024, true).await else { return };
            for e in &entries {
                let Some(a) = &e.attr else { continue };
                if e.kind == InodeKind::Directory && keys::is_namespace_name(&e.name) && a.acl.mode & 0o077 != 0 {
                    if let Err(err) = meta.setattr(e.inode, set(NAMESPACE_DIR_MODE)).await {
                        tracing::warn!(namespace = %e.name, error = %err, "cannot tighten a namespace's mode");
                    }
                }
            }
            match entries.last() {
                Some(last) if more => after = last.name.clone(),
                _ => return,
            }
        }
    }

    // ----- namespaces -----

    /// The namespace `name` (cached for [`NAMESPACE_CACHE_TTL_MS`]).
    pub async fn namespace(&self, name: &str) -> Result<Arc<Namespace>> {
        if !keys::is_namespace_name(name) {
            return Err(KvError::InvalidNamespace(name.into()));
        }
        if let Some((ns, at)) = self.namespaces.lock().get(name) {
            if at.elapsed() < Duration::from_millis(NAMESPACE_CACHE_TTL_MS) {
                return Ok(Arc::clone(ns));
            }
        }
        let ns = Arc::new(self.load_namespace(name).await?);
        self.namespaces.lock().insert(name.to_string(), (Arc::clone(&ns), Instant::now()));
        Ok(ns)
    }

    async fn load_namespace(&self, name: &str) -> Result<Namespace> {
        let no_such = || KvError::NoSuchNamespace(name.into());
        let dir = self.fs.meta().lookup(self.root, name).await.map_err(|e| meta_err(e, name, no_such()))?;
        if dir.dir().is_none() {
            return Err(no_such());
        }
        let config = match self.fs.meta().get_xattr(dir.id, XATTR_NAMESPACE).await {
            Ok(v) => serde_json::from_slice(&v).unwrap_or_else(|e| {
                tracing::warn!(namespace = name, error = %e, "unreadable namespace settings; using the defaults");
                NamespaceConfig::default()
            }),
            Err(e) if e.code() == ErrorCode::NotFound => NamespaceConfig::default(),
            Err(e) => return Err(meta_err(e, name, no_such())),
        };
        Ok(Namespace { name: name.into(), dir: dir.id, config, owner_uid: dir.acl.uid, owner_gid: dir.acl.gid })
    }

    pub fn forget_namespace(&self, name: &str) {
        self.namespaces.lock().remove(name);
        self.dirs.lock().clear();
    }

    /// Creates the namespace if missing (owned by `owner`: its directory is
    /// made 0700, the tenant's uid/gid from the transaction that makes it,
    /// marked as an S3 flat bucket's: [`keyname::LAYOUT_XATTR`]) and sets its
    /// settings. An existing namespace of another owner is refused (403);
    /// one made before namespaces carried the layout mark gets it here.
    pub async fn put_namespace(&self, name: &str, config: &NamespaceConfig, owner: TenantIds) -> Result<(Arc<Namespace>, bool)> {
        if !keys::is_namespace_name(name) {
            return Err(KvError::InvalidNamespace(name.into()));
        }
        let owned = self.fs.with_owner(Some(NewOwner { uid: owner.uid, gid: owner.gid }));
        let layout = || vec![(keyname::LAYOUT_XATTR.to_string(), keyname::FLAT_LAYOUT.as_bytes().to_vec())];
        let no_namespace = |e: fskv_client::MetaClientError| meta_err(e, name, KvError::NoSuchNamespace(name.into()));
        let (dir, created) = match owned.meta().mkdir_with_xattrs(self.root, name, NAMESPACE_DIR_MODE, layout()).await {
            Ok(i) => (i.id, true),
            Err(e) if e.code() == ErrorCode::AlreadyExists => {
                let i = self.fs.meta().lookup(self.root, name).await.map_err(no_namespace)?;
                if i.dir().is_none() {
                    return Err(KvError::KeyConflict(format!("{name} exists under the KV root and is not a directory")));
                }
                if i.acl.uid != owner.uid {
                    return Err(KvError::AccessDenied(format!("namespace {name:?} belongs to another tenant")));
                }
                let (attr, value) = layout().remove(0);
                match self.fs.meta().set_xattr(i.id, &attr, &value, XattrFlag::Create).await {
                    Ok(_) => {}
                    Err(e) if e.code() == ErrorCode::AlreadyExists => {}
                    Err(e) => return Err(no_namespace(e)),
                }
                (i.id, false)
            }
            Err(e) => return Err(no_namespace(e)),
        };
        let json = serde_json::to_vec(config).map_err(|e| KvError::Internal(e.to_string()))?;
        self.fs
            .meta()
            .set_xattr(dir, XATTR_NAMESPACE, &json, XattrFlag::Any)
            .await
            .map_err(|e| meta_err(e, name, KvError::NoSuchNamespace(name.into())))?;
        let ns = Arc::new(Namespace { name: name.into(), dir, config: config.clone(), owner_uid: owner.uid, owner_gid: owner.gid });
        self.namespaces.lock().insert(name.into(), (Arc::clone(&ns), Instant::now()));
        Ok((ns, created))
    }

    /// The namespaces whose directory `owner_uid` owns (all with `None`).
    pub async fn list_namespaces(&self, owner_uid: Option<u32>) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let (entries, more) =
                self.fs.meta().readdir(self.root, &after, 1024, true).await.map_err(|e| meta_err(e, "namespaces", KvError::NoSuchKey))?;
            for e in &entries {
                let mine = match owner_uid {
                    None => true,
                    Some(uid) => e.attr.as_ref().is_some_and(|a| a.acl.uid == uid),
                };
                if e.kind == InodeKind::Directory && keys::is_namespace_name(&e.name) && mine {
                    out.push(e.name.clone());
                }
            }
            match entries.last() {
                Some(last) if more => after = last.name.clone(),
                _ => return Ok(out),
            }
        }
    }

    /// Removes the namespace and every key in it (one metadata transaction;
    /// the data is reclaimed in the background) and its bookkeeping.
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        let ns = self.namespace(name).await?;
        self.fs.meta().remove_tree(self.root, &ns.name).await.map_err(|e| meta_err(e, name, KvError::NoSuchNamespace(name.into())))?;
        self.forget_namespace(name);
        for dir in [self.system.recency, self.system.checkpoint, self.system.stats] {
            match self.fs.meta().remove_tree(dir, name).await {
                Ok(()) => {}
                Err(e) if e.code() == ErrorCode::NotFound => {}
                Err(e) => tracing::warn!(namespace = name, error = %e, "could not remove the namespace's bookkeeping"),
            }
        }
        Ok(())
    }

    // ----- keys -----

    fn cached_dir(&self, parent: InodeId, name: &str) -> Option<InodeId> {
        let map = self.dirs.lock();
        let (id, at) = map.get(&(parent, name.to_string()))?;
        (at.elapsed() < Duration::from_millis(DIR_CACHE_TTL_MS)).then_some(*id)
    }

    fn cache_dir(&self, parent: InodeId, name: &str, id: InodeId) {
        let mut map = self.dirs.lock();
        if map.len() >= DIR_CACHE_MAX_ENTRIES {
            map.clear();
        }
        map.insert((parent, name.to_string()), (id, Instant::now()));
    }

    /// The directory holding `path`'s file, if its continuation directories
    /// exist (`None` otherwise).
    async fn parent_of(&self, ns: &Namespace, path: &KeyPath, use_cache: bool) -> Result<Option<InodeId>> {
        let mut cur = ns.dir;
        for d in &path.dirs {
            if use_cache {
                if let Some(id) = self.cached_dir(cur, d) {
                    cur = id;
                    continue;
                }
            }
            match self.fs.meta().lookup(cur, d).await {
                Ok(i) if i.dir().is_some() => {
                    self.cache_dir(cur, d, i.id);
                    cur = i.id;
                }
                Ok(_) => return Ok(None),
                Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::NotDirectory) => return Ok(None),
                Err(e) => return Err(meta_err(e, "key", KvError::NoSuchKey)),
            }
        }
        Ok(Some(cur))
    }

    /// The file of a key, as stored (expiry not checked), if any.
    pub async fn lookup(&self, ns: &Namespace, path: &KeyPath) -> Result<Option<Inode>> {
        for use_cache in [true, false] {
            let Some(parent) = self.parent_of(ns, path, use_cache).await? else {
                if use_cache && !path.dirs.is_empty() {
                    continue;
                }
                return Ok(None);
            };
            match self.fs.meta().lookup(parent, &path.file).await {
                Ok(i) if i.kind() == InodeKind::File => return Ok(Some(i)),
                Ok(_) => return Ok(None),
                Err(e) if e.code() == ErrorCode::NotFound && use_cache && !path.dirs.is_empty() => {
                    // A cached continuation directory may be stale.
                    self.dirs.lock().clear();
                }
                Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::NotDirectory) => return Ok(None),
                Err(e) => return Err(meta_err(e, "key", KvError::NoSuchKey)),
            }
        }
        Ok(None)
    }

    /// Lookups of many keys of one namespace: the short keys in one batched
    /// meta call per 1024, long keys one by one. Records (expiry) fetched
    /// in one more batch for the files that have one.
    pub async fn lookup_many(&self, ns: &Namespace, paths: &[KeyPath]) -> Vec<Result<Option<(Inode, Record)>>> {
        let mut out: Vec<Result<Option<Inode>>> = (0..paths.len()).map(|_| Ok(None)).collect();
        let short: Vec<usize> = (0..paths.len()).filter(|i| paths[*i].dirs.is_empty()).collect();
        for group in short.chunks(1024) {
            let ops = group.iter().map(|i| MetaOp::Lookup { parent: ns.dir, name: paths[*i].file.clone() }).collect();
            match self.fs.meta().batch(ops).await {
                Ok(results) => {
                    for (i, r) in group.iter().zip(results) {
                        out[*i] = match r {
                            Ok(MetaReply::Inode(inode)) if inode.kind() == InodeKind::File => Ok(Some(inode)),
                            Ok(_) => Ok(None),
                            Err(s) if matches!(s.code, ErrorCode::NotFound | ErrorCode::NotDirectory) => Ok(None),
                            Err(s) => Err(KvError::from_code(s.code, "key", KvError::NoSuchKey)),
                        };
                    }
                }
                Err(e) => {
                    let code = e.code();
                    for i in group {
                        out[*i] = Err(KvError::from_code(code, "key", KvError::NoSuchKey));
                    }
                }
            }
        }
        for (i, p) in paths.iter().enumerate() {
            if !p.dirs.is_empty() {
                out[i] = self.lookup(ns, p).await;
            }
        }
        // Records of the files that have one.
        let with_record: Vec<usize> = (0..out.len()).filter(|i| matches!(&out[*i], Ok(Some(inode)) if record::has_record(inode))).collect();
        let mut records: HashMap<usize, Record> = HashMap::new();
        for group in with_record.chunks(1024) {
            let ops = group
                .iter()
                .filter_map(|i| match &out[*i] {
                    Ok(Some(inode)) => Some(MetaOp::GetXattr { inode: inode.id, name: XATTR_RECORD.into() }),
                    _ => None,
                })
                .collect();
            if let Ok(results) = self.fs.meta().batch(ops).await {
                for (i, r) in group.iter().zip(results) {
                    if let Ok(MetaReply::Xattr(v)) = r {
                        records.insert(*i, Record::decode(&v));
                    }
                }
            }
        }
        out.into_iter().enumerate().map(|(i, r)| r.map(|o| o.map(|inode| (inode, records.remove(&i).unwrap_or_default())))).collect()
    }

    /// The record of a file (none unless its mode says it has one).
    pub async fn record(&self, inode: &Inode) -> Result<Record> {
        if !record::has_record(inode) {
            return Ok(Record::default());
        }
        match self.fs.meta().get_xattr(inode.id, XATTR_RECORD).await {
            Ok(v) => Ok(Record::decode(&v)),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(Record::default()),
            Err(e) => Err(meta_err(e, "key", KvError::NoSuchKey)),
        }
    }

    /// The directory a key's file goes in, continuation directories made
    /// where missing.
    pub async fn ensure_parent(&self, ns: &Namespace, path: &KeyPath) -> Result<InodeId> {
        let mut cur = ns.dir;
        let fs = self.fs.with_owner(ns.new_owner());
        for d in &path.dirs {
            if let Some(id) = self.cached_dir(cur, d) {
                cur = id;
                continue;
            }
            let parent = cur;
            cur = mkdir_p(&fs, cur, d).await.map_err(KvError::KeyConflict)?;
            self.cache_dir(parent, d, cur);
        }
        Ok(cur)
    }

    /// Publishes `data` as the key at `path` with `record`, if `expected`
    /// holds; `index` becomes its mtime (the modify index). Retries when a
    /// concurrent delete removed a continuation directory meanwhile.
    pub async fn publish(
        &self,
        ns: &Namespace,
        path: &KeyPath,
        data: &Data,
        record: &Record,
        expected: Option<Expected>,
        index: u64,
    ) -> Result<Inode> {
        let mut xattrs = Vec::new();
        if !record.is_empty() {
            xattrs.push((XATTR_RECORD.to_string(), record.encode()));
        }
        let attrs = PublishAttrs { length: None, mtime_ns: Some(index), xattrs };
        let mode = value_mode(record);
        let fs = self.fs.with_owner(ns.new_owner());
        let mut attempt = 0;
        loop {
            attempt += 1;
            let parent = self.ensure_parent(ns, path).await?;
            let r = match data {
                Data::Inline(b) => {
                    fs.meta().create_write_publish(parent, &path.file, mode, b, expected.clone(), attrs.clone()).await.map_err(|e| e.code())
                }
                Data::Temp(h) => self.fs.publish(h, parent, &path.file, expected.clone(), attrs.clone()).await.map_err(|e| e.code()),
            };
            match r {
                Ok(inode) => return Ok(inode),
                Err(ErrorCode::NotFound) if attempt < 3 && !path.dirs.is_empty() => {
                    self.dirs.lock().clear();
                }
                Err(ErrorCode::NotFound) => {
                    self.forget_namespace(&ns.name);
                    return Err(KvError::NoSuchNamespace(ns.name.clone()));
                }
                Err(code) => return Err(KvError::from_code(code, "put", KvError::NoSuchKey)),
            }
        }
    }

    /// Removes a key (if `expected` holds); `Ok(false)` when there was none.
    /// Continuation directories it empties are removed.
    pub async fn unlink(&self, ns: &Namespace, path: &KeyPath, expected: Option<Expected>) -> Result<bool> {
        let Some(parent) = self.parent_of(ns, path, false).await? else {
            return match expected {
                Some(Expected::Inode { .. }) => Err(KvError::PreconditionFailed("the key does not exist".into())),
                _ => Ok(false),
            };
        };
        let r = match expected {
            Some(e) => self.fs.meta().unlink_expected(parent, &path.file, e).await,
            None => self.fs.meta().unlink(parent, &path.file).await,
        };
        match r {
            Ok(()) => {}
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(false),
            Err(e) if e.code() == ErrorCode::PreconditionFailed => {
                return Err(KvError::PreconditionFailed("the key's version is not the one given".into()))
            }
            Err(e) => return Err(meta_err(e, "delete", KvError::NoSuchKey)),
        }
        if !path.dirs.is_empty() {
            self.remove_empty_dirs(ns, path).await;
        }
        Ok(true)
    }

    /// Removes the continuation directories of `path`, deepest first, while
    /// they are empty.
    async fn remove_empty_dirs(&self, ns: &Namespace, path: &KeyPath) {
        for depth in (1..=path.dirs.len()).rev() {
            let mut parent = ns.dir;
            for d in &path.dirs[..depth - 1] {
                match self.fs.meta().lookup(parent, d).await {
                    Ok(i) => parent = i.id,
                    Err(_) => return,
                }
            }
            match self.fs.meta().rmdir(parent, &path.dirs[depth - 1]).await {
                Ok(()) => self.dirs.lock().clear(),
                Err(e) if matches!(e.code(), ErrorCode::NotEmpty | ErrorCode::NotFound) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "could not remove an emptied continuation directory");
                    return;
                }
            }
        }
    }

    /// Sets or clears the "condemned" mode bit of a file (the evictor).
    pub async fn set_condemned(&self, inode: &Inode, on: bool) -> Result<Inode> {
        let base = inode.acl.mode & !record::MODE_CONDEMNED;
        let mode = if on { base | record::MODE_CONDEMNED } else { base };
        let attr = fskv_proto::meta::SetAttr { mode: Some(mode), ..Default::default() };
        self.fs.meta().setattr(inode.id, attr).await.map_err(|e| meta_err(e, "evict", KvError::NoSuchKey))
    }

    // ----- small files of the gateway's own -----

    /// Writes a small bookkeeping file atomically (inline up to 4 KiB, else
    /// a temp file published over the old one).
    pub async fn write_file(&self, dir: InodeId, name: &str, bytes: bytes::Bytes) -> Result<()> {
        let attrs = PublishAttrs { length: None, mtime_ns: Some(record::now_ns()), xattrs: vec![] };
        let r: std::result::Result<(), ErrorCode> = async {
            if bytes.len() <= fskv_proto::meta::DEFAULT_INLINE_MAX_BYTES {
                return self
                    .fs
                    .meta()
                    .create_write_publish(dir, name, record::VALUE_MODE, &bytes, None, attrs)
                    .await
                    .map(drop)
                    .map_err(|e| e.code());
            }
            let h = self.fs.create_temp(dir, record::VALUE_MODE).await.map_err(|e| e.code())?;
            let chunk = h.layout().chunk_size_bytes.max(4096) as usize;
            let mut off = 0usize;
            while off < bytes.len() {
                let end = (off + chunk).min(bytes.len());
                h.write_at(off as u64, bytes.slice(off..end)).await.map_err(|e| e.code())?;
                off = end;
            }
            self.fs.publish(&h, dir, name, None, attrs).await.map(drop).map_err(|e| e.code())
        }
        .await;
        r.map_err(|code| KvError::from_code(code, format!("bookkeeping file {name}"), KvError::NoSuchKey))
    }

    /// Reads a whole bookkeeping file (`None` if missing).
    pub async fn read_file(&self, dir: InodeId, name: &str, max_bytes: u64) -> Result<Option<bytes::Bytes>> {
        let inode = match self.fs.meta().lookup(dir, name).await {
            Ok(i) => i,
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(meta_err(e, name, KvError::NoSuchKey)),
        };
        self.read_whole(inode, max_bytes).await.map(Some)
    }

    /// The whole data of a file (inline or chunked) up to `max_bytes`.
    pub async fn read_whole(&self, inode: Inode, max_bytes: u64) -> Result<bytes::Bytes> {
        let Some(f) = inode.file() else { return Err(KvError::NoSuchKey) };
        if let Some(data) = &f.inline {
            return Ok(bytes::Bytes::copy_from_slice(data));
        }
        if f.length > max_bytes {
            return Err(KvError::ValueTooLarge { len: Some(f.length), max: max_bytes });
        }
        let len = f.length;
        let h = self.fs.reader(inode).map_err(|e| KvError::from_code(e.code(), "read", KvError::NoSuchKey))?;
        let b = h.read_at(0, len).await.map_err(|e| KvError::from_code(e.code(), "read", KvError::NoSuchKey))?;
        if b.len() as u64 != len {
            return Err(KvError::Unavailable("the value changed while it was read; retry".into()));
        }
        Ok(b)
    }
}

/// A value's file mode: [`record::MODE_HAS_RECORD`] when it has a record.
pub fn value_mode(record: &Record) -> u32 {
    if record.is_empty() {
        record::VALUE_MODE
    } else {
        record::VALUE_MODE | record::MODE_HAS_RECORD
    }
}

/// The directory `name` in `parent`, made if missing.
pub async fn mkdir_p(fs: &FsClient, parent: InodeId, name: &str) -> std::result::Result<InodeId, String> {
    match fs.meta().lookup(parent, name).await {
        Ok(i) if i.dir().is_some() => Ok(i.id),
        Ok(_) => Err(format!("{name} exists and is not a directory")),
        Err(e) if e.code() == ErrorCode::NotFound => match fs.meta().mkdir(parent, name, DIR_MODE).await {
            Ok(i) => Ok(i.id),
            Err(e) if e.code() == ErrorCode::AlreadyExists => match fs.meta().lookup(parent, name).await {
                Ok(i) if i.dir().is_some() => Ok(i.id),
                Ok(_) => Err(format!("{name} exists and is not a directory")),
                Err(e) => Err(format!("{name}: {e}")),
            },
            Err(e) => Err(format!("cannot create {name}: {e}")),
        },
        Err(e) => Err(format!("{name}: {e}")),
    }
}
