//! The filesystem side of the gateway: buckets as directories under the
//! root, keys as paths, parent directories made on demand and removed
//! when emptied.

use crate::error;
use crate::objmeta::XATTR_META;
use crate::paths::{self, Layout, ObjectPath, XATTR_LAYOUT};
use crate::versions::{Versioning, XATTR_VERSIONING};
use fskv_client::FsClient;
use fskv_proto::meta::{Inode, InodeKind, MAX_WALK_NAMES};
use fskv_types::{ErrorCode, InodeId};
use s3s::S3Error;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Name of the directory under the root that stages multipart uploads
/// (not a valid bucket name, so never listed as one).
pub const UPLOADS_DIR: &str = ".fskv-uploads";
/// Mode of directories the gateway makes (buckets included): only their
/// owner (the bucket's tenant uid for a bucket, root below it) gets in, so
/// other local users see nothing through the FUSE mount (`allow_other`).
pub const DIR_MODE: u32 = 0o700;
/// Mode of files the gateway makes.
pub const FILE_MODE: u32 = 0o600;
/// Mode of the root directory of the buckets: traversable (a tenant's local
/// user reaches its own bucket through the mount), not listable.
pub const ROOT_MODE: u32 = 0o711;

/// Who a request acts for: its tenant, whose uid owns the tenant's buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    pub ids: fskv_gateway::TenantIds,
}

/// What a key names.
pub enum Found {
    /// A file, with its object record if it has one.
    File(Inode, Option<Vec<u8>>),
    /// A directory with an object record (a key ending in `/`).
    DirObject(Inode, Vec<u8>),
}

/// What a key's own entry `inode` (with its record) is, for a key naming a
/// file or (`dir_object`, a key ending in `/`) a directory.
fn entry_found(inode: Inode, record: Option<Vec<u8>>, dir_object: bool) -> Option<Found> {
    match (inode.kind(), dir_object) {
        (InodeKind::File, false) => Some(Found::File(inode, record)),
        (InodeKind::Directory, true) => record.map(|r| Found::DirObject(inode, r)),
        _ => None,
    }
}

/// Directory ids by (parent, name) below the buckets, so a request for
/// `a/b/key` does not look up `a` and `b` again. An entry lives
/// [`DIR_CACHE_TTL_MS`]; a stale one (the directory was removed, maybe
/// made again) shows as NotFound under it, and the callers then drop the
/// cache and go again without it. Bounded: cleared when full.
pub struct DirCache {
    map: parking_lot::Mutex<HashMap<(InodeId, String), (InodeId, Instant)>>,
}

pub const DIR_CACHE_TTL_MS: u64 = 2_000;
pub const DIR_CACHE_MAX_ENTRIES: usize = 65_536;

impl DirCache {
    fn get(&self, parent: InodeId, name: &str) -> Option<InodeId> {
        let map = self.map.lock();
        let (id, at) = map.get(&(parent, name.to_string()))?;
        (at.elapsed() < Duration::from_millis(DIR_CACHE_TTL_MS)).then_some(*id)
    }

    fn put(&self, parent: InodeId, name: &str, id: InodeId) {
        let mut map = self.map.lock();
        if map.len() >= DIR_CACHE_MAX_ENTRIES {
            map.clear();
        }
        map.insert((parent, name.to_string()), (id, Instant::now()));
    }

    pub fn clear(&self) {
        self.map.lock().clear();
    }
}

/// Layouts of bucket directories by inode. A bucket's layout is set in
/// the transaction that makes its directory and never changes, so an entry
/// never goes stale (a bucket deleted and made again has a new inode).
/// Also the directory last seen under each bucket name, so a read can walk
/// from the root to its key in one meta call ([`Store::locate_find`]); a
/// stale name shows as another inode there, and the reader then goes the
/// long way. Bounded: each map cleared when full.
#[derive(Default)]
pub struct LayoutCache {
    map: parking_lot::Mutex<HashMap<InodeId, Layout>>,
    names: parking_lot::Mutex<HashMap<String, InodeId>>,
}

impl LayoutCache {
    /// The directory last seen under bucket name `name` and its layout.
    fn by_name(&self, name: &str) -> Option<(InodeId, Layout)> {
        let id = *self.names.lock().get(name)?;
        let layout = *self.map.lock().get(&id)?;
        Some((id, layout))
    }

    fn name(&self, name: &str, id: InodeId) {
        let mut names = self.names.lock();
        if names.len() >= LAYOUT_CACHE_MAX_ENTRIES {
            names.clear();
        }
        names.insert(name.to_string(), id);
    }

    fn forget_name(&self, name: &str) {
        self.names.lock().remove(name);
    }
}

pub const LAYOUT_CACHE_MAX_ENTRIES: usize = 65_536;

/// Versioning states of bucket directories by inode, valid while the
/// directory's inode version is the one they were read at. Every request
/// looks its bucket up first ([`Store::bucket`], or in the walk of
/// [`Store::locate_find`]), which records the version it saw; setting the
/// state's xattr bumps that version, so a state put through any gateway
/// process is seen by the next request after it, at no extra meta call
/// while it does not change. Bounded: cleared when full.
#[derive(Default)]
pub struct VersioningCache {
    map: parking_lot::Mutex<HashMap<InodeId, VersioningEntry>>,
}

#[derive(Clone, Copy, Default)]
struct VersioningEntry {
    /// The newest inode version of the bucket directory a lookup saw.
    seen: u64,
    /// The state and the `seen` version it was read after.
    state: Option<(Versioning, u64)>,
}

#[derive(Clone)]
pub struct Store {
    pub fs: FsClient,
    /// The directory whose subdirectories are the buckets.
    pub root: InodeId,
    pub dirs: Arc<DirCache>,
    pub layouts: Arc<LayoutCache>,
    pub versioning: Arc<VersioningCache>,
    /// The tenant of the request this store serves; `None` for the
    /// gateway's own work (upload expiry), which sees every bucket.
    pub caller: Option<Caller>,
}

impl Store {
    /// Resolves (a writer: creates) the root directory `root_path`.
    pub async fn open(fs: FsClient, root_path: &str, create: bool) -> Result<Store, String> {
        let mut cur = InodeId::ROOT;
        for name in root_path.split('/').filter(|c| !c.is_empty()) {
            cur = match fs.meta().lookup(cur, name).await {
                Ok(i) if i.dir().is_some() => i.id,
                Ok(_) => return Err(format!("{root_path}: {name} is not a directory")),
                Err(e) if e.code() == ErrorCode::NotFound && create => match fs.meta().mkdir(cur, name, DIR_MODE).await {
                    Ok(i) => i.id,
                    Err(e) if e.code() == ErrorCode::AlreadyExists => fs.meta().lookup(cur, name).await.map_err(|e| e.to_string())?.id,
                    Err(e) => return Err(format!("cannot create {root_path}: {e}")),
                },
                Err(e) => return Err(format!("{root_path}: {e}")),
            };
        }
        let store = Store {
            fs,
            root: cur,
            dirs: Arc::new(DirCache { map: parking_lot::Mutex::new(HashMap::new()) }),
            layouts: Arc::default(),
            versioning: Arc::default(),
            caller: None,
        };
        if create {
            store.tighten_modes().await;
        }
        Ok(store)
    }

    /// The same store acting for `caller`: every inode it creates (the
    /// bucket, prefix directories, objects and their temp inodes, upload
    /// directories and parts) is owned by the tenant's uid/gid, set by meta
    /// in the creating transaction (`MetaRequest::owner`; the gateway acts
    /// as root, which alone may name an owner).
    pub fn for_caller(&self, caller: Caller) -> Store {
        let owner = fskv_proto::meta::NewOwner { uid: caller.ids.uid, gid: caller.ids.gid };
        Store { fs: self.fs.with_owner(Some(owner)), caller: Some(caller), ..self.clone() }
    }

    /// The same store creating root-owned inodes: for the gateway's own
    /// directories (the multipart staging `.fskv-uploads/<bucket>`), which
    /// no tenant's local user may enter.
    pub fn system(&self) -> Store {
        Store { fs: self.fs.with_owner(None), ..self.clone() }
    }

    /// The owner a chown gives an inode of this store's tenant (`None`:
    /// the gateway's own work).
    pub fn owner_attr(&self) -> (Option<u32>, Option<u32>) {
        match &self.caller {
            Some(c) => (Some(c.ids.uid), Some(c.ids.gid)),
            None => (None, None),
        }
    }

    /// Puts the root to [`ROOT_MODE`] and every bucket made before tenants
    /// (group or other bits set) to [`DIR_MODE`]; failures are logged.
    async fn tighten_modes(&self) {
        let meta = self.fs.meta();
        let set = |mode| fskv_proto::meta::SetAttr { mode: Some(mode), ..Default::default() };
        match meta.stat(self.root).await {
            Ok(i) if i.acl.mode & 0o7777 != ROOT_MODE => {
                if let Err(e) = meta.setattr(self.root, set(ROOT_MODE)).await {
                    tracing::warn!(error = %e, "cannot set the mode of the buckets' root directory");
                }
            }
            _ => {}
        }
        let mut cursor = String::new();
        loop {
            let Ok((entries, more)) = meta.readdir(self.root, &cursor, 1000, true).await else { return };
            for e in &entries {
                let Some(a) = &e.attr else { continue };
                if e.kind == InodeKind::Directory && paths::is_bucket_name(&e.name) && a.acl.mode & 0o077 != 0 {
                    if let Err(err) = meta.setattr(e.inode, set(DIR_MODE)).await {
                        tracing::warn!(bucket = %e.name, error = %err, "cannot tighten a bucket's mode");
                    }
                }
            }
            match entries.last() {
                Some(last) if more => cursor = last.name.clone(),
                _ => return,
            }
        }
    }

    /// Whether the caller's tenant owns a bucket directory (its owner uid
    /// is the tenant's; a store without a caller owns everything).
    pub fn owns(&self, bucket_dir: &Inode) -> bool {
        match &self.caller {
            None => true,
            Some(c) => bucket_dir.acl.uid == c.ids.uid,
        }
    }

    pub async fn bucket(&self, name: &str) -> Result<Inode, S3Error> {
        if !paths::is_bucket_name(name) {
            return Err(error::no_such_bucket(name));
        }
        match self.fs.meta().lookup(self.root, name).await {
            Ok(i) => self.accept_bucket(i, name),
            Err(e) if e.code() == ErrorCode::NotFound => Err(error::no_such_bucket(name)),
            Err(e) => Err(error::from_meta(e, name)),
        }
    }

    /// The inode found under bucket name `name` if it is a bucket the
    /// caller owns (its version recorded for the versioning cache), else
    /// S3's error.
    fn accept_bucket(&self, i: Inode, name: &str) -> Result<Inode, S3Error> {
        match i.dir() {
            Some(_) if self.owns(&i) => {
                self.saw_bucket(&i);
                Ok(i)
            }
            Some(_) => Err(error::access_denied(name)),
            None => Err(error::no_such_bucket(name)),
        }
    }

    /// The layout of the bucket whose directory is `bucket`.
    pub async fn layout(&self, bucket: InodeId) -> Result<Layout, S3Error> {
        if let Some(l) = self.layouts.map.lock().get(&bucket) {
            return Ok(*l);
        }
        let layout = match self.fs.meta().get_xattr(bucket, XATTR_LAYOUT).await {
            Ok(v) => Layout::of_xattr(Some(&v)),
            Err(e) if e.code() == ErrorCode::NotFound => Layout::Tree,
            Err(e) => return Err(error::from_meta(e, "bucket layout")),
        };
        let mut map = self.layouts.map.lock();
        if map.len() >= LAYOUT_CACHE_MAX_ENTRIES {
            map.clear();
        }
        map.insert(bucket, layout);
        Ok(layout)
    }

    /// The versioning state of the bucket whose directory is `bucket`.
    pub async fn versioning_of(&self, bucket: InodeId) -> Result<Versioning, S3Error> {
        let seen = {
            let map = self.versioning.map.lock();
            let e = map.get(&bucket).copied().unwrap_or_default();
            match e.state {
                Some((v, at)) if at == e.seen => return Ok(v),
                _ => e.seen,
            }
        };
        // Read after the lookup that saw `seen`: at least that new.
        let v = match self.fs.meta().get_xattr(bucket, XATTR_VERSIONING).await {
            Ok(b) => Versioning::of_xattr(Some(&b)),
            Err(e) if e.code() == ErrorCode::NotFound => Versioning::Off,
            Err(e) => return Err(error::from_meta(e, "bucket versioning")),
        };
        let mut map = self.versioning.map.lock();
        if map.len() >= LAYOUT_CACHE_MAX_ENTRIES {
            map.clear();
        }
        let e = map.entry(bucket).or_default();
        if e.seen == seen {
            e.state = Some((v, seen));
        }
        Ok(v)
    }

    /// Records the inode version of a bucket directory a lookup saw.
    fn saw_bucket(&self, dir: &Inode) {
        let mut map = self.versioning.map.lock();
        if let Some(e) = map.get_mut(&dir.id) {
            e.seen = e.seen.max(dir.version);
        } else {
            if map.len() >= LAYOUT_CACHE_MAX_ENTRIES {
                map.clear();
            }
            map.insert(dir.id, VersioningEntry { seen: dir.version, state: None });
        }
    }

    /// Drops the state of `bucket` (this process just put a new one).
    pub fn forget_versioning(&self, bucket: InodeId) {
        if let Some(e) = self.versioning.map.lock().get_mut(&bucket) {
            e.state = None;
        }
    }

    /// The bucket directory `bucket` and the path `key` names in it (by the
    /// bucket's layout); 400 for a key the layout refuses.
    pub async fn locate(&self, bucket: &str, key: &str) -> Result<(Inode, ObjectPath), S3Error> {
        let dir = self.bucket(bucket).await?;
        let path = self.path_in(&dir, key).await?;
        self.layouts.name(bucket, dir.id);
        Ok((dir, path))
    }

    /// What [`Store::locate`] then [`Store::find`] answer. Once this
    /// process knows the bucket's directory and layout, in one meta call: a
    /// `WalkXattr` from the root through the bucket's directory and the
    /// key's path to its entry and `user.s3.meta` record.
    pub async fn locate_find(&self, bucket: &str, key: &str) -> Result<(Inode, ObjectPath, Option<Found>), S3Error> {
        if let Some(walked) = self.walk_to(bucket, key).await? {
            return Ok(walked);
        }
        let (dir, path) = self.locate(bucket, key).await?;
        let found = self.find(dir.id, &path).await?;
        Ok((dir, path, found))
    }

    /// [`Store::locate_find`]'s one call; `None` where the long way must
    /// answer: the bucket's directory or layout unknown, another directory
    /// under the name now, a key the layout refuses (the long way's errors
    /// come in S3's order), a path past one walk.
    async fn walk_to(&self, bucket: &str, key: &str) -> Result<Option<(Inode, ObjectPath, Option<Found>)>, S3Error> {
        let Some((id, layout)) = self.layouts.by_name(bucket) else { return Ok(None) };
        let Ok(path) = paths::parse_key_in(layout, key) else { return Ok(None) };
        if path.components.len() >= MAX_WALK_NAMES {
            return Ok(None);
        }
        let names = std::iter::once(bucket.to_string()).chain(path.components.iter().cloned()).collect();
        let (inodes, record) = self.fs.meta().walk_xattr(self.root, names, XATTR_META).await.map_err(|e| error::from_meta(e, bucket))?;
        let mut inodes = inodes.into_iter();
        let Some(dir) = inodes.next() else { return Err(error::no_such_bucket(bucket)) };
        if dir.id != id {
            // Deleted and made again: its layout may differ.
            self.layouts.forget_name(bucket);
            return Ok(None);
        }
        let dir = self.accept_bucket(dir, bucket)?;
        let entry = if inodes.len() == path.components.len() { inodes.last() } else { None };
        let found = entry.and_then(|inode| entry_found(inode, record, path.dir_object));
        Ok(Some((dir, path, found)))
    }

    /// The path `key` names in the bucket directory `dir`.
    pub async fn path_in(&self, dir: &Inode, key: &str) -> Result<ObjectPath, S3Error> {
        let layout = self.layout(dir.id).await?;
        paths::parse_key_in(layout, key).map_err(|why| error::invalid_key(key, why))
    }

    /// The caller's buckets, by name, with their creation times (ns).
    pub async fn list_buckets(&self) -> Result<Vec<(String, u64)>, S3Error> {
        let mut out = Vec::new();
        let mut cursor = String::new();
        loop {
            let (entries, more) =
                self.fs.meta().readdir(self.root, &cursor, 1000, true).await.map_err(|e| error::from_meta(e, "buckets"))?;
            for e in &entries {
                let mine = e.attr.as_ref().is_some_and(|a| self.owns(a));
                if e.kind == InodeKind::Directory && paths::is_bucket_name(&e.name) && mine {
                    out.push((e.name.clone(), e.attr.as_ref().map_or(0, |a| a.ctime_ns.min(a.mtime_ns))));
                }
            }
            match entries.last() {
                Some(last) if more => cursor = last.name.clone(),
                _ => return Ok(out),
            }
        }
    }

    /// The object `path` names in `bucket`, if any.
    pub async fn find(&self, bucket: InodeId, path: &ObjectPath) -> Result<Option<Found>, S3Error> {
        let (found, used_cache) = self.find_with(bucket, path, true).await?;
        if found.is_none() && used_cache {
            self.dirs.clear();
            return Ok(self.find_with(bucket, path, false).await?.0);
        }
        Ok(found)
    }

    async fn find_with(&self, bucket: InodeId, path: &ObjectPath, use_cache: bool) -> Result<(Option<Found>, bool), S3Error> {
        let mut cur = bucket;
        let mut used_cache = false;
        let n = path.components.len();
        for (i, name) in path.components.iter().enumerate() {
            if i + 1 < n && use_cache {
                if let Some(id) = self.dirs.get(cur, name) {
                    cur = id;
                    used_cache = true;
                    continue;
                }
            }
            let last = i + 1 == n;
            // The key's own entry comes with its object record: one round trip.
            let looked = if last {
                self.fs.meta().lookup_xattr(cur, name, XATTR_META).await
            } else {
                self.fs.meta().lookup(cur, name).await.map(|inode| (inode, None))
            };
            let (inode, record) = match looked {
                Ok(found) => found,
                Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::NotDirectory) => return Ok((None, used_cache)),
                Err(e) => return Err(error::from_meta(e, name)),
            };
            if !last {
                if inode.dir().is_none() {
                    return Ok((None, used_cache));
                }
                self.dirs.put(cur, name, inode.id);
                cur = inode.id;
                continue;
            }
            return Ok((entry_found(inode, record, path.dir_object), used_cache));
        }
        Ok((None, used_cache))
    }

    /// The directory `components` below `bucket`, made where missing.
    /// A component that is a file gives 409 ParentIsObject.
    pub async fn ensure_dirs(&self, bucket: InodeId, components: &[String], key: &str) -> Result<InodeId, S3Error> {
        match self.ensure_dirs_with(bucket, components, key, true).await {
            // A cached directory went away: go again without the cache.
            Err(e) if e.code() == &s3s::S3ErrorCode::NoSuchKey => {
                self.dirs.clear();
                self.ensure_dirs_with(bucket, components, key, false).await
            }
            r => r,
        }
    }

    async fn ensure_dirs_with(&self, bucket: InodeId, components: &[String], key: &str, use_cache: bool) -> Result<InodeId, S3Error> {
        let mut cur = bucket;
        for (depth, name) in components.iter().enumerate() {
            if use_cache {
                if let Some(id) = self.dirs.get(cur, name) {
                    cur = id;
                    continue;
                }
            }
            let parent = cur;
            cur = match self.fs.meta().lookup(cur, name).await {
                Ok(i) if i.dir().is_some() => i.id,
                Ok(_) => return Err(error::parent_is_object(key, &components[..=depth].join("/"))),
                Err(e) if e.code() == ErrorCode::NotFound => match self.fs.meta().mkdir(cur, name, DIR_MODE).await {
                    Ok(i) => i.id,
                    // Made meanwhile by another request: use it if it is a directory.
                    Err(e) if e.code() == ErrorCode::AlreadyExists => match self.fs.meta().lookup(cur, name).await {
                        Ok(i) if i.dir().is_some() => i.id,
                        Ok(_) => return Err(error::parent_is_object(key, &components[..=depth].join("/"))),
                        Err(e) => return Err(error::from_meta(e, key)),
                    },
                    Err(e) => return Err(error::from_meta(e, key)),
                },
                Err(e) => return Err(error::from_meta(e, key)),
            };
            self.dirs.put(parent, name, cur);
        }
        Ok(cur)
    }

    /// Removes the directories of `components` (deepest first) that are
    /// empty and not directory objects, stopping at the first that is not.
    pub async fn remove_empty_dirs(&self, bucket: InodeId, components: &[String]) {
        for depth in (1..=components.len()).rev() {
            let Ok(parent) = self.resolve_dirs(bucket, &components[..depth - 1]).await else { return };
            let name = &components[depth - 1];
            let Ok(dir) = self.fs.meta().lookup(parent, name).await else { return };
            if dir.dir().is_none() || self.fs.meta().get_xattr(dir.id, XATTR_META).await.is_ok() {
                return;
            }
            match self.fs.meta().rmdir(parent, name).await {
                Ok(()) => self.dirs.clear(),
                Err(e) if matches!(e.code(), ErrorCode::NotEmpty | ErrorCode::NotFound) => return,
                Err(e) => {
                    tracing::warn!(dir = %components[..depth].join("/"), error = %e, "could not remove an emptied directory");
                    return;
                }
            }
        }
    }

    async fn resolve_dirs(&self, bucket: InodeId, components: &[String]) -> Result<InodeId, ()> {
        let mut cur = bucket;
        for name in components {
            cur = match self.fs.meta().lookup(cur, name).await {
                Ok(i) if i.dir().is_some() => i.id,
                _ => return Err(()),
            };
        }
        Ok(cur)
    }
}

impl Store {
    /// The directory `components` below `bucket` if it exists (no creation).
    pub async fn ensure_dirs_existing(&self, bucket: InodeId, components: &[String]) -> Option<InodeId> {
        self.resolve_dirs(bucket, components).await.ok()
    }
}
