//! Put/GetBucketVersioning and the versioned moves of `crate::versions`:
//! publishing over a current version, delete markers, deleting one
//! version, reading one version. Each move is one `MetaOp::Txn` guarded by
//! an `Expect` on the key's current file; a guard that fails because a
//! concurrent write changed the key is retried ([`MAX_MOVE_ATTEMPTS`]),
//! one that fails a client's condition is 412.

use super::object::{find_object, Object};
use super::write::{self, Data};
use super::Gateway;
use crate::error;
use crate::objmeta::{self, ObjectMeta, TagList, XATTR_META, XATTR_TAGS};
use crate::paths::ObjectPath;
use crate::store::FILE_MODE;
use crate::versions::{self, VersionRef, Versioning, NULL_VERSION, VERSIONS_DIR, XATTR_VERSIONING};
use fskv_client::keyname::KeyPath;
use fskv_client::keywalk::Walker as KeyWalker;
use fskv_client::FsClient;
use fskv_proto::meta::{Expected, Inode, MetaOp, MetaReply, PublishAttrs, XattrFlag};
use fskv_types::{ErrorCode, InodeId};
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode};

/// Attempts of a versioned move whose guard a concurrent write broke.
pub const MAX_MOVE_ATTEMPTS: u32 = 4;
/// Most store entries of one key walked by one lookup (the null version,
/// a page of a key's entries).
pub const MAX_VERSIONS_SCANNED: usize = 100_000;

/// A new object's data on its way to the key.
pub enum NewObject<'a> {
    /// Bytes or a temp inode (`write::receive`).
    Data(&'a Data),
    /// An existing file `inode`, renamed onto the key (a multipart
    /// upload's in-place `data`, its mtime already the record's).
    Move { dir: InodeId, name: &'a str, inode: InodeId },
}

impl NewObject<'_> {
    async fn op(&self, parent: InodeId, name: &str, expected: Option<Expected>, attrs: PublishAttrs) -> MetaOp {
        match self {
            NewObject::Data(Data::Inline(b)) => {
                MetaOp::CreateWritePublish { parent, name: name.into(), mode: FILE_MODE, data: b.to_vec(), expected, attrs }
            }
            NewObject::Data(Data::Temp(h)) => FsClient::publish_op(h, parent, name, expected, attrs).await,
            NewObject::Move { dir, name: from, .. } => {
                MetaOp::Rename { src_parent: *dir, src_name: from.to_string(), dst_parent: parent, dst_name: name.into() }
            }
        }
    }
}

/// A published object and its `x-amz-version-id` (only a version made
/// while versioning is Enabled has one to show).
#[derive(Clone, Debug)]
pub struct Published {
    pub meta: ObjectMeta,
    pub version_id: Option<String>,
}

/// What a delete did, for the response headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// `x-amz-version-id`: the marker made or the version removed.
    pub version_id: Option<String>,
    /// `x-amz-delete-marker: true`: a marker was made or removed.
    pub delete_marker: bool,
}

/// One file of a version store.
#[derive(Clone, Debug)]
pub struct StoreEntry {
    pub key: String,
    pub sort: String,
    pub parent: InodeId,
    pub name: String,
    pub inode: Inode,
    pub meta: ObjectMeta,
}

impl StoreEntry {
    pub fn version_id(&self) -> &str {
        versions::version_of_sort(&self.sort).unwrap_or(NULL_VERSION)
    }
}

/// The S3 name of a record's version.
pub fn version_name(meta: &ObjectMeta) -> String {
    meta.version_id.clone().unwrap_or_else(|| NULL_VERSION.to_string())
}

fn guard_of(cur: Option<&Inode>) -> Expected {
    cur.map_or(Expected::Absent, |i| Expected::Inode { id: i.id, version: i.version })
}

fn invalid_version(v: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, format!("invalid version id specified: {v:?}"))
}

pub fn parse_version(v: &str) -> Result<VersionRef, S3Error> {
    VersionRef::parse(v).ok_or_else(|| invalid_version(v))
}

fn no_such_version(key: &str, v: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NoSuchVersion, format!("{key:?} has no version {v:?}"))
}

impl Gateway {
    pub async fn get_bucket_versioning(&self, bucket: &str) -> Result<GetBucketVersioningOutput, S3Error> {
        let dir = self.store.bucket(bucket).await?;
        let v = self.read_versioning(dir.id, bucket).await?;
        Ok(GetBucketVersioningOutput {
            status: v.status().map(BucketVersioningStatus::from_static),
            ..GetBucketVersioningOutput::default()
        })
    }

    /// The state from the bucket directory itself (no cache).
    async fn read_versioning(&self, dir: InodeId, bucket: &str) -> Result<Versioning, S3Error> {
        let v = match self.store.fs.meta().get_xattr(dir, XATTR_VERSIONING).await {
            Ok(b) => Versioning::of_xattr(Some(&b)),
            Err(e) if e.code() == ErrorCode::NotFound => Versioning::Off,
            Err(e) => return Err(error::from_meta(e, bucket)),
        };
        Ok(v)
    }

    pub async fn put_bucket_versioning(&self, input: &PutBucketVersioningInput) -> Result<(), S3Error> {
        let conf = &input.versioning_configuration;
        if conf.mfa_delete.as_ref().is_some_and(|m| m.as_str() == MFADelete::ENABLED) {
            return Err(S3Error::with_message(S3ErrorCode::NotImplemented, "MFA delete is not supported"));
        }
        let status = match conf.status.as_ref().map(|s| s.as_str()) {
            Some(s @ ("Enabled" | "Suspended")) => s,
            other => {
                return Err(S3Error::with_message(S3ErrorCode::MalformedXML, format!("versioning status {other:?}: Enabled or Suspended")))
            }
        };
        let dir = self.store.bucket(&input.bucket).await?;
        self.store
            .fs
            .meta()
            .set_xattr(dir.id, XATTR_VERSIONING, status.as_bytes(), XattrFlag::Any)
            .await
            .map_err(|e| error::from_meta(e, &input.bucket))?;
        self.store.forget_versioning(dir.id);
        Ok(())
    }

    /// The version store of `bucket`, made when `create`.
    pub async fn version_store(&self, bucket: &str, create: bool) -> Result<Option<InodeId>, S3Error> {
        let comps = [VERSIONS_DIR.to_string(), bucket.to_string()];
        if create {
            return self.store.system().ensure_dirs(self.store.root, &comps, bucket).await.map(Some);
        }
        Ok(self.store.ensure_dirs_existing(self.store.root, &comps).await)
    }

    /// The path of version `sort` of `key` in a version store.
    fn store_path(key: &str, sort: &str) -> ObjectPath {
        let p = KeyPath::of(&versions::store_key(key, sort));
        let mut components = p.dirs;
        components.push(p.file);
        ObjectPath { components, dir_object: false }
    }

    /// `(parent, name)` of version `sort` of `key` in `store`, its
    /// continuation directories made.
    async fn store_slot(&self, store: InodeId, key: &str, sort: &str) -> Result<(InodeId, String), S3Error> {
        let path = Self::store_path(key, sort);
        let parent = self.store.system().ensure_dirs(store, path.parent(), key).await?;
        Ok((parent, path.name().to_string()))
    }

    /// Up to `limit` store entries of `key`, newest first.
    pub async fn store_entries(&self, store: InodeId, key: &str, limit: usize) -> Result<Vec<StoreEntry>, S3Error> {
        let mut out = self.store_entries_where(store, key, limit, |_| true).await?;
        self.fill_store_records(&mut out).await?;
        Ok(out)
    }

    /// Up to `limit` store entries of `key` whose sort `pick` accepts,
    /// newest first, walking at most [`MAX_VERSIONS_SCANNED`] entries of
    /// the key; their records are not read.
    async fn store_entries_where(
        &self,
        store: InodeId,
        key: &str,
        limit: usize,
        pick: impl Fn(&str) -> bool,
    ) -> Result<Vec<StoreEntry>, S3Error> {
        let start = versions::store_prefix(key);
        let mut walker = KeyWalker::new(self.store.fs.clone(), store, Some((&start, true)));
        let mut out = Vec::new();
        let mut scanned = 0usize;
        while out.len() < limit && scanned < MAX_VERSIONS_SCANNED {
            let Some(found) = walker.next().await.map_err(|e| error::from_meta(e, key))? else { break };
            let Some((k, sort)) = versions::split_store_key(&found.key) else { continue };
            if k != key {
                break;
            }
            scanned += 1;
            let Some(inode) = found.entry.attr else { continue };
            if pick(&sort) {
                out.push(StoreEntry { key: k, sort, parent: found.dir, name: found.entry.name, meta: ObjectMeta::default(), inode });
            }
        }
        Ok(out)
    }

    /// Reads the records of store entries (one batch).
    pub async fn fill_store_records(&self, entries: &mut [StoreEntry]) -> Result<(), S3Error> {
        for batch in entries.chunks_mut(256) {
            let ops = batch.iter().map(|e| MetaOp::GetXattr { inode: e.inode.id, name: XATTR_META.into() }).collect();
            let replies = self.store.fs.meta().batch(ops).await.map_err(|e| error::from_meta(e, "versions"))?;
            for (e, r) in batch.iter_mut().zip(replies) {
                let record = match r {
                    Ok(MetaReply::Xattr(d)) => Some(d),
                    _ => None,
                };
                e.meta = objmeta::effective(&e.inode, record.as_deref());
            }
        }
        Ok(())
    }

    /// The store entry of version `v` of `key`.
    async fn store_entry(&self, store: InodeId, key: &str, v: &VersionRef) -> Result<Option<StoreEntry>, S3Error> {
        match v {
            VersionRef::Id(id) => {
                let path = Self::store_path(key, id);
                let Some(parent) = self.store.ensure_dirs_existing(store, path.parent()).await else { return Ok(None) };
                let inode = match self.store.fs.meta().lookup(parent, path.name()).await {
                    Ok(i) => i,
                    Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
                    Err(e) => return Err(error::from_meta(e, key)),
                };
                let mut e = vec![StoreEntry {
                    key: key.into(),
                    sort: id.clone(),
                    parent,
                    name: path.name().into(),
                    inode,
                    meta: ObjectMeta::default(),
                }];
                self.fill_store_records(&mut e).await?;
                Ok(e.pop())
            }
            VersionRef::Null => Ok(self.store_null(store, key).await?),
        }
    }

    /// The null version of `key` among its store entries: a walk of the
    /// key's entries (names only, in pages) until the one whose sort has
    /// no version id; only its record is read.
    pub async fn store_null(&self, store: InodeId, key: &str) -> Result<Option<StoreEntry>, S3Error> {
        let mut found = self.store_entries_where(store, key, 1, |sort| versions::version_of_sort(sort).is_none()).await?;
        self.fill_store_records(&mut found).await?;
        Ok(found.pop())
    }

    /// The current file of a key (`None`: no object; a directory is 409 as
    /// for any write: dir objects and prefixes are not versioned).
    async fn current_file(&self, parent: InodeId, name: &str, key: &str) -> Result<Option<(Inode, ObjectMeta)>, S3Error> {
        let inode = match self.store.fs.meta().lookup(parent, name).await {
            Ok(i) => i,
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(error::from_meta(e, key)),
        };
        if inode.dir().is_some() {
            return Err(error::exists_as_prefix(key));
        }
        let record = match self.store.fs.meta().get_xattr(inode.id, XATTR_META).await {
            Ok(r) => Some(r),
            Err(e) if e.code() == ErrorCode::NotFound => None,
            Err(e) => return Err(error::from_meta(e, key)),
        };
        let meta = objmeta::effective(&inode, record.as_deref());
        Ok(Some((inode, meta)))
    }

    /// Publishes a new object: the plain publish, or in a versioned bucket
    /// the versioned move. `expected` is the client's condition (If-Match,
    /// If-None-Match) as `object::write_expectation` made it.
    #[allow(clippy::too_many_arguments)]
    pub async fn publish_object(
        &self,
        bucket_name: &str,
        bucket: InodeId,
        path: &ObjectPath,
        key: &str,
        new: NewObject<'_>,
        meta: ObjectMeta,
        tags: Option<&TagList>,
        expected: Option<Expected>,
    ) -> Result<Published, S3Error> {
        let v = self.store.versioning_of(bucket).await?;
        let meta = match (v, &new) {
            (Versioning::Off, NewObject::Data(data)) => write::publish(&self.store, bucket, path, key, data, meta, tags, expected).await?.1,
            _ => self.publish_versioned(bucket_name, bucket, v, path, key, new, meta, tags, expected).await?,
        };
        // As AWS: a write while Suspended (the null version) answers
        // without x-amz-version-id; reads of it answer `null`.
        let version_id = meta.version_id.clone();
        Ok(Published { meta, version_id })
    }

    #[allow(clippy::too_many_arguments)]
    async fn publish_versioned(
        &self,
        bucket_name: &str,
        bucket: InodeId,
        v: Versioning,
        path: &ObjectPath,
        key: &str,
        new: NewObject<'_>,
        mut meta: ObjectMeta,
        tags: Option<&TagList>,
        client: Option<Expected>,
    ) -> Result<ObjectMeta, S3Error> {
        // A moved file has its mtime (and the record's) already.
        if !matches!(new, NewObject::Move { .. }) {
            meta.mtime_ns = write::now_ns();
        }
        meta.version_id = (v == Versioning::Enabled).then(|| versions::new_version_id(meta.mtime_ns, rand::random()));
        let mut xattrs = vec![(XATTR_META.to_string(), meta.encode())];
        if let Some(t) = tags.filter(|t| !t.is_empty()) {
            xattrs.push((XATTR_TAGS.to_string(), objmeta::encode_tags(t)));
        }
        let attrs = PublishAttrs { length: None, mtime_ns: Some(meta.mtime_ns), xattrs };
        let store = if v == Versioning::Off { None } else { self.version_store(bucket_name, true).await? };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let parent = self.store.ensure_dirs(bucket, path.parent(), key).await?;
            let cur = self.current_file(parent, path.name(), key).await?;
            match (&client, &cur) {
                (Some(Expected::Absent), Some(_)) => return Err(error::precondition_failed("If-None-Match: the object exists")),
                (Some(Expected::Inode { id, .. }), c) if c.as_ref().map(|c| c.0.id) != Some(*id) => {
                    return Err(error::precondition_failed("If-Match: the object changed"))
                }
                _ => {}
            }
            let guard = guard_of(cur.as_ref().map(|c| &c.0));
            let mut ops = vec![MetaOp::Expect { parent, name: path.name().into(), expected: guard.clone() }];
            let mut install_expected = guard;
            if let (Some(store), Some((_, cm))) = (store, &cur) {
                if v == Versioning::Enabled || cm.version_id.is_some() {
                    let (sp, sn) = self.store_slot(store, key, &versions::sort_of(cm.version_id.as_deref(), cm.mtime_ns)).await?;
                    ops.push(MetaOp::Rename { src_parent: parent, src_name: path.name().into(), dst_parent: sp, dst_name: sn });
                    install_expected = Expected::Absent;
                }
            }
            if let (Some(store), Versioning::Suspended) = (store, v) {
                if let Some(old) = self.store_null(store, key).await? {
                    ops.push(MetaOp::Unlink { parent: old.parent, name: old.name });
                }
            }
            let install = new.op(parent, path.name(), Some(install_expected), attrs.clone()).await;
            // A rename onto the key replaces what is there; the guard made sure of what that is.
            ops.push(install);
            if let NewObject::Move { inode, .. } = &new {
                // A rename sets no attributes: the record (with the version id) goes with it.
                ops.push(MetaOp::SetXattr { inode: *inode, name: XATTR_META.into(), value: meta.encode(), flag: XattrFlag::Any });
            }
            match self.store.fs.meta().txn(ops).await {
                Ok(_) => return Ok(meta),
                Err(e) if e.code() == ErrorCode::PreconditionFailed && client.is_none() && attempt < MAX_MOVE_ATTEMPTS => {
                    tracing::debug!(%key, error = %e, "the key changed during a versioned publish; again");
                }
                Err(e) if e.code() == ErrorCode::PreconditionFailed => return Err(error::precondition_failed(e.to_string())),
                Err(e) if e.code() == ErrorCode::NotFound && attempt < MAX_MOVE_ATTEMPTS => self.store.dirs.clear(),
                Err(e) if e.code() == ErrorCode::IsDirectory => return Err(error::exists_as_prefix(key)),
                Err(e) => return Err(error::from_meta(e, key)),
            }
        }
    }

    /// DeleteObject without a version in a versioned bucket: the current
    /// version goes to the store (a null one, while Suspended, away) and a
    /// delete marker becomes the newest version.
    pub async fn delete_versioned(
        &self,
        bucket_name: &str,
        bucket: InodeId,
        v: Versioning,
        path: &ObjectPath,
        key: &str,
    ) -> Result<Deleted, S3Error> {
        let Some(store) = self.version_store(bucket_name, true).await? else { return Err(error::internal("no version store")) };
        let mut attempt = 0;
        loop {
            attempt += 1;
            // In a tree bucket the key's path may be blocked (a parent is an
            // object, or the name is a directory of other keys): then no
            // object is there, and none can appear while it is blocked; S3
            // still makes the marker.
            let conflict = |e: &S3Error| e.status_code() == Some(http::StatusCode::CONFLICT);
            let (parent, cur) = match self.store.ensure_dirs(bucket, path.parent(), key).await {
                Ok(p) => match self.current_file(p, path.name(), key).await {
                    Ok(c) => (Some(p), c),
                    Err(e) if conflict(&e) => (None, None),
                    Err(e) => return Err(e),
                },
                Err(e) if conflict(&e) => (None, None),
                Err(e) => return Err(e),
            };
            let now = write::now_ns();
            let marker = ObjectMeta {
                etag: objmeta::EMPTY_MD5.into(),
                mtime_ns: now,
                version_id: (v == Versioning::Enabled).then(|| versions::new_version_id(now, rand::random())),
                delete_marker: true,
                ..ObjectMeta::default()
            };
            let mut ops = Vec::new();
            if let Some(parent) = parent {
                ops.push(MetaOp::Expect { parent, name: path.name().into(), expected: guard_of(cur.as_ref().map(|c| &c.0)) });
            }
            if let (Some((_, cm)), Some(parent)) = (&cur, parent) {
                if v == Versioning::Enabled || cm.version_id.is_some() {
                    let (sp, sn) = self.store_slot(store, key, &versions::sort_of(cm.version_id.as_deref(), cm.mtime_ns)).await?;
                    ops.push(MetaOp::Rename { src_parent: parent, src_name: path.name().into(), dst_parent: sp, dst_name: sn });
                } else {
                    ops.push(MetaOp::Unlink { parent, name: path.name().into() });
                }
            }
            if v == Versioning::Suspended {
                if let Some(old) = self.store_null(store, key).await? {
                    ops.push(MetaOp::Unlink { parent: old.parent, name: old.name });
                }
            }
            let (mp, mn) = self.store_slot(store, key, &versions::sort_of(marker.version_id.as_deref(), now)).await?;
            let attrs = PublishAttrs { length: None, mtime_ns: Some(now), xattrs: vec![(XATTR_META.to_string(), marker.encode())] };
            ops.push(MetaOp::CreateWritePublish {
                parent: mp,
                name: mn,
                mode: FILE_MODE,
                data: Vec::new(),
                expected: Some(Expected::Absent),
                attrs,
            });
            if self.delete_move(ops, bucket, path, key, attempt).await? {
                return Ok(Deleted { version_id: Some(version_name(&marker)), delete_marker: true });
            }
        }
    }

    /// Sends a delete's move: `true` once it committed (emptied directories
    /// of the key's path removed), `false` when a concurrent change broke
    /// its guard and attempt `attempt` may go again.
    async fn delete_move(&self, ops: Vec<MetaOp>, bucket: InodeId, path: &ObjectPath, key: &str, attempt: u32) -> Result<bool, S3Error> {
        match self.store.fs.meta().txn(ops).await {
            Ok(_) => {
                self.store.remove_empty_dirs(bucket, path.parent()).await;
                Ok(true)
            }
            Err(e) if matches!(e.code(), ErrorCode::PreconditionFailed | ErrorCode::NotFound) && attempt < MAX_MOVE_ATTEMPTS => {
                self.store.dirs.clear();
                Ok(false)
            }
            Err(e) => Err(error::from_meta(e, key)),
        }
    }

    /// DeleteObject of one version (or marker), for good. The current one
    /// gives its place to the newest noncurrent version (not a marker);
    /// removing the newest marker of a key without a current one brings
    /// the version below it back. A version that does not exist is no
    /// error, as in S3.
    pub async fn delete_version(
        &self,
        bucket_name: &str,
        bucket: InodeId,
        path: &ObjectPath,
        key: &str,
        v: &VersionRef,
    ) -> Result<Deleted, S3Error> {
        let store = self.version_store(bucket_name, false).await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let parent = self.store.ensure_dirs_existing(bucket, path.parent()).await;
            let cur = match parent {
                Some(p) => self.current_file(p, path.name(), key).await.ok().flatten(),
                None => None,
            };
            let newest = match store {
                Some(s) => self.store_entries(s, key, 2).await?,
                None => Vec::new(),
            };
            let mut ops = Vec::new();
            let mut removed_marker = false;
            if let (Some((ci, cm)), Some(p)) = (&cur, parent) {
                if v.names(cm.version_id.as_deref()) {
                    ops.push(MetaOp::UnlinkExpected { parent: p, name: path.name().into(), expected: guard_of(Some(ci)) });
                    if let Some(n) = newest.first().filter(|n| !n.meta.delete_marker) {
                        ops.push(MetaOp::Rename {
                            src_parent: n.parent,
                            src_name: n.name.clone(),
                            dst_parent: p,
                            dst_name: path.name().into(),
                        });
                    }
                }
            }
            if ops.is_empty() {
                let Some(store) = store else { return Ok(Deleted { version_id: Some(v_name(v)), delete_marker: false }) };
                let Some(entry) = self.store_entry(store, key, v).await? else {
                    return Ok(Deleted { version_id: Some(v_name(v)), delete_marker: false });
                };
                removed_marker = entry.meta.delete_marker;
                let expected = guard_of(Some(&entry.inode));
                ops.push(MetaOp::UnlinkExpected { parent: entry.parent, name: entry.name.clone(), expected });
                let is_newest = newest.first().is_some_and(|n| n.sort == entry.sort);
                if is_newest && removed_marker && cur.is_none() {
                    if let Some(next) = newest.get(1).filter(|n| !n.meta.delete_marker) {
                        let p = self.store.ensure_dirs(bucket, path.parent(), key).await?;
                        ops.push(MetaOp::Expect { parent: p, name: path.name().into(), expected: Expected::Absent });
                        ops.push(MetaOp::Rename {
                            src_parent: next.parent,
                            src_name: next.name.clone(),
                            dst_parent: p,
                            dst_name: path.name().into(),
                        });
                    }
                }
            }
            if self.delete_move(ops, bucket, path, key, attempt).await? {
                return Ok(Deleted { version_id: Some(v_name(v)), delete_marker: removed_marker });
            }
        }
    }

    /// The object a read of `key` at `version` (`None`: the current one)
    /// names: 404 NoSuchVersion when there is no such version, 405 for a
    /// delete marker, as S3 answers.
    pub async fn find_for_read(
        &self,
        bucket_name: &str,
        bucket: InodeId,
        path: &ObjectPath,
        key: &str,
        version: Option<&str>,
    ) -> Result<Object, S3Error> {
        let cur = find_object(&self.store, bucket, path).await?;
        self.version_for_read(bucket_name, key, version, cur).await
    }

    /// The bucket's directory, the key's path in it and what
    /// [`Gateway::find_for_read`] answers, the current object found with
    /// the bucket in one meta call ([`crate::store::Store::locate_find`]).
    pub async fn locate_for_read(
        &self,
        bucket_name: &str,
        key: &str,
        version: Option<&str>,
    ) -> Result<(Inode, ObjectPath, Object), S3Error> {
        let (dir, path, found) = self.store.locate_find(bucket_name, key).await?;
        let obj = self.version_for_read(bucket_name, key, version, found.map(Object::of)).await?;
        Ok((dir, path, obj))
    }

    /// [`Gateway::find_for_read`] once the current object `cur` is found.
    async fn version_for_read(&self, bucket_name: &str, key: &str, version: Option<&str>, cur: Option<Object>) -> Result<Object, S3Error> {
        let Some(version) = version else {
            if let Some(c) = cur {
                return Ok(c);
            }
            // As AWS: a key whose latest version is a delete marker says so.
            let mut e = error::no_such_key(key);
            if let Some(store) = self.version_store(bucket_name, false).await? {
                if let Some(m) = self.store_entries(store, key, 1).await?.into_iter().find(|m| m.meta.delete_marker) {
                    e.set_headers(marker_headers(m.version_id()));
                }
            }
            return Err(e);
        };
        let v = parse_version(version)?;
        if let Some(c) = cur.filter(|c| v.names(c.meta.version_id.as_deref())) {
            return Ok(c);
        }
        let Some(store) = self.version_store(bucket_name, false).await? else { return Err(no_such_version(key, version)) };
        let entry = self.store_entry(store, key, &v).await?.ok_or_else(|| no_such_version(key, version))?;
        if entry.meta.delete_marker {
            let mut e = S3Error::with_message(S3ErrorCode::MethodNotAllowed, format!("version {version:?} of {key:?} is a delete marker"));
            e.set_headers(marker_headers(entry.version_id()));
            return Err(e);
        }
        Ok(Object { inode: entry.inode, meta: entry.meta, dir: false })
    }

    /// The `x-amz-version-id` of a read or write answer: the version's id,
    /// `null` for a null version of a bucket that has versioning, nothing
    /// for a bucket that never had it.
    pub async fn version_header(&self, bucket: InodeId, meta: &ObjectMeta) -> Result<Option<String>, S3Error> {
        if meta.version_id.is_some() {
            return Ok(meta.version_id.clone());
        }
        Ok((self.store.versioning_of(bucket).await? != Versioning::Off).then(|| NULL_VERSION.to_string()))
    }

    /// DeleteBucket's check: no version or marker is left.
    pub async fn versions_left(&self, bucket: &str) -> Result<bool, S3Error> {
        let Some(store) = self.version_store(bucket, false).await? else { return Ok(false) };
        let (entries, _) = self.store.fs.meta().readdir(store, "", 1, false).await.map_err(|e| error::from_meta(e, bucket))?;
        Ok(!entries.is_empty())
    }

    /// Removes the (empty) version store of a deleted bucket.
    pub async fn remove_version_store(&self, bucket: &str) {
        let Some(root) = self.store.ensure_dirs_existing(self.store.root, &[VERSIONS_DIR.to_string()]).await else { return };
        match self.store.fs.meta().rmdir(root, bucket).await {
            Ok(()) => {}
            Err(e) if e.code() == ErrorCode::NotFound => {}
            Err(e) => tracing::warn!(bucket, error = %e, "the bucket's version store could not be removed"),
        }
    }
}

/// `x-amz-delete-marker: true` and the marker's `x-amz-version-id`.
fn marker_headers(version_id: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert("x-amz-delete-marker", http::HeaderValue::from_static("true"));
    if let Ok(v) = http::HeaderValue::from_str(version_id) {
        h.insert("x-amz-version-id", v);
    }
    h
}

fn v_name(v: &VersionRef) -> String {
    match v {
        VersionRef::Null => NULL_VERSION.to_string(),
        VersionRef::Id(id) => id.clone(),
    }
}
