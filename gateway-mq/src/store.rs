//! The filesystem side: where topics, partitions, segments and group state
//! live, and the compare-and-swap file helper everything stateful uses.
//!
//! | path (under `--root`, default `/mq`) | what | how it changes |
//! |---|---|---|
//! | `topics/<topic>/topic.json` | topic configuration ([`TopicMeta`]); the topic exists once this file does | CAS (create: `Expected::Absent`) |
//! | `topics/<topic>/<p>/state` | partition state ([`crate::state::PartitionState`]) | CAS by the partition's writer |
//! | `topics/<topic>/<p>/<base>-<epoch>.log` | segment: stored batches, appended in place | appends by the owner of `epoch` |
//! | `topics/<topic>/<p>/<base>-<epoch>.idx` | its sparse index ([`crate::index`]) | appends by the owner |
//! | xattr `user.mq.seal` of a segment | `{end, next, max_ts}` once sealed | set before the CAS that seals it |
//! | `topics/<topic>/<p>/producers-<offset>.snap` | producer table and dedup window as of `offset` | written at a segment roll |
//! | `topics/<topic>/<p>/queue-<name>-<epoch>.q` | a queue's delivery state: a snapshot frame, then delta frames | appends by the owner of `epoch` |
//! | `groups/<group>` | consumer group state ([`crate::group::GroupState`]) | CAS by any gateway |
//!
//! CAS files are JSON; up to [`INLINE_MAX_BYTES`] they are kept inline:
//! created with meta's `CreateWritePublish`, then rewritten in place with
//! `OverwriteInline` (one inode write, not a new inode + dirent + the old
//! one's tombstones); larger ones as a temp inode published with
//! `Replace`. All take `Expected` (absent, or this inode at this version),
//! so a writer that read an older version fails instead of overwriting.

use crate::error::{from_file, from_meta, MqError, Result};
use crate::state::{PartitionState, STATE_FILE};
use bytes::Bytes;
use fskv_client::file::FileHandle;
use fskv_client::FsClient;
use fskv_proto::meta::{Expected, Inode, InodeData, PublishAttrs};
use fskv_types::{ErrorCode, InodeId};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const DIR_MODE: u32 = 0o755;
pub const FILE_MODE: u32 = 0o644;
/// Meta's inline limit (files up to it keep their bytes in the inode).
pub const INLINE_MAX_BYTES: usize = 4096;
pub const TOPIC_FILE: &str = "topic.json";
pub const SEAL_XATTR: &str = "user.mq.seal";
/// How long cached directory ids and topic configurations are trusted.
pub const CACHE_TTL_MS: u64 = 1000;
const CACHE_MAX_ENTRIES: usize = 65_536;

/// A decoded CAS file with the inode version it was read at.
#[derive(Clone, Debug)]
pub struct Versioned<T> {
    pub value: T,
    pub inode: InodeId,
    pub version: u64,
}

impl<T> Versioned<T> {
    pub fn expected(&self) -> Expected {
        Expected::Inode { id: self.inode, version: self.version }
    }
}

/// A queue (share group) configured on a topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMeta {
    /// Deliveries after which a message goes to the dead-letter topic (or is archived).
    #[serde(default)]
    pub max_deliveries: Option<u32>,
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Default visibility timeout of a receive.
    pub visibility_ms: u64,
    /// Default delivery delay of a message (ms).
    #[serde(default)]
    pub delay_ms: u64,
}

impl Default for QueueMeta {
    fn default() -> Self {
        QueueMeta { max_deliveries: None, dead_letter_topic: None, visibility_ms: 30_000, delay_ms: 0 }
    }
}

/// A topic's configuration (`topic.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    pub name: String,
    /// Random id of this incarnation of the topic (message ids use it).
    pub uid: u64,
    pub partitions: u32,
    /// Segments whose newest record is older than this are deleted (None: kept).
    #[serde(default)]
    pub retention_ms: Option<u64>,
    /// Oldest segments are deleted while a partition holds more (None: no bound).
    #[serde(default)]
    pub retention_bytes: Option<u64>,
    pub segment_bytes: u64,
    pub segment_ms: u64,
    pub max_message_bytes: u64,
    /// FIFO: message groups and the deduplication window.
    #[serde(default)]
    pub fifo: bool,
    #[serde(default)]
    pub dedup_window_ms: u64,
    /// Deduplication scope is the message group (else the topic).
    #[serde(default)]
    pub dedup_by_group: bool,
    /// Queues (share groups) over this topic, by name.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueMeta>,
    /// SQS queue attributes, when the topic is an SQS queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub tenant: String,
    pub created_ms: u64,
    #[serde(default)]
    pub modified_ms: u64,
}

/// What a sealed segment's xattr says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// Committed bytes.
    pub end: u64,
    /// The offset after its last record.
    pub next: u64,
    /// Largest record timestamp (-1: none).
    pub max_ts: i64,
}

impl TopicMeta {
    /// The tenant owning the topic: the one recorded at creation, `default`
    /// for topics made before tenants (none recorded).
    pub fn owner(&self) -> &str {
        if self.tenant.is_empty() {
            fskv_gateway::auth::DEFAULT_TENANT
        } else {
            &self.tenant
        }
    }

    /// `Ok` when `tenant` owns the topic, else 403 `AccessDenied`.
    pub fn check_owner(&self, tenant: &str) -> Result<()> {
        if self.owner() == tenant {
            Ok(())
        } else {
            Err(MqError::AccessDenied(format!("topic {:?} belongs to another tenant", self.name)))
        }
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Topic and queue names: 1..=249 of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn check_topic_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(MqError::InvalidRequest(format!("invalid name {name:?}: 1 to 249 characters of A-Z a-z 0-9 . _ -")))
    }
}

struct Cached<T> {
    value: T,
    at: Instant,
}

#[derive(Default)]
struct Caches {
    dirs: HashMap<(InodeId, String), Cached<InodeId>>,
    topics: HashMap<String, Cached<Arc<TopicMeta>>>,
}

/// The filesystem store of one gateway (cheap to clone).
#[derive(Clone)]
pub struct Store {
    pub fs: FsClient,
    /// `fs` whose metadata requests are relaxed (offset commits; docs/mq.md).
    pub fs_relaxed: FsClient,
    pub root: InodeId,
    pub topics: InodeId,
    pub groups: InodeId,
    caches: Arc<Mutex<Caches>>,
}

/// Mode of the MQ root directory (root's).
pub const ROOT_MODE: u32 = 0o700;

impl Store {
    /// Resolves (creating, if `create`) the root and its `topics`/`groups`.
    pub async fn open(fs: FsClient, root_path: &str, create: bool) -> std::result::Result<Store, String> {
        let mut cur = InodeId::ROOT;
        for name in root_path.split('/').filter(|c| !c.is_empty()) {
            cur = dir_at(&fs, cur, name, create).await.map_err(|e| format!("{root_path}: {e}"))?;
        }
        let topics = dir_at(&fs, cur, "topics", create).await.map_err(|e| format!("{root_path}/topics: {e}"))?;
        let groups = dir_at(&fs, cur, "groups", create).await.map_err(|e| format!("{root_path}/groups: {e}"))?;
        if create {
            // Topics are owned in `topic.json`, not by uid: only root (the
            // gateway) gets into the MQ root, so no local user reads logs
            // through the FUSE mount.
            match fs.meta().stat(cur).await {
                Ok(i) if i.acl.mode & 0o7777 != ROOT_MODE => {
                    let attr = fskv_proto::meta::SetAttr { mode: Some(ROOT_MODE), ..Default::default() };
                    if let Err(e) = fs.meta().setattr(cur, attr).await {
                        tracing::warn!(error = %e, "cannot set the mode of the MQ root directory");
                    }
                }
                _ => {}
            }
        }
        let fs_relaxed = fs.with_relaxed_metadata();
        Ok(Store { fs, fs_relaxed, root: cur, topics, groups, caches: Arc::default() })
    }

    fn cached_dir(&self, parent: InodeId, name: &str) -> Option<InodeId> {
        let c = self.caches.lock();
        c.dirs.get(&(parent, name.to_string())).filter(|e| e.at.elapsed() < Duration::from_millis(CACHE_TTL_MS)).map(|e| e.value)
    }

    fn put_dir(&self, parent: InodeId, name: &str, id: InodeId) {
        let mut c = self.caches.lock();
        if c.dirs.len() >= CACHE_MAX_ENTRIES {
            c.dirs.clear();
        }
        c.dirs.insert((parent, name.to_string()), Cached { value: id, at: Instant::now() });
    }

    /// Forgets cached ids and configurations of `topic`.
    pub fn forget_topic(&self, topic: &str) {
        let mut c = self.caches.lock();
        c.topics.remove(topic);
        c.dirs.retain(|(p, n), _| !(*p == self.topics && n == topic));
    }

    /// The directory of a topic.
    pub async fn topic_dir(&self, topic: &str) -> Result<InodeId> {
        if let Some(id) = self.cached_dir(self.topics, topic) {
            return Ok(id);
        }
        match self.fs.meta().lookup(self.topics, topic).await {
            Ok(i) if i.dir().is_some() => {
                self.put_dir(self.topics, topic, i.id);
                Ok(i.id)
            }
            Ok(_) => Err(MqError::TopicNotFound(topic.into())),
            Err(e) if e.code() == ErrorCode::NotFound => Err(MqError::TopicNotFound(topic.into())),
            Err(e) => Err(from_meta(e, topic)),
        }
    }

    /// The directory of a partition (the topic must have it).
    pub async fn partition_dir(&self, topic: &str, partition: u32) -> Result<InodeId> {
        let tdir = self.topic_dir(topic).await?;
        let name = partition.to_string();
        if let Some(id) = self.cached_dir(tdir, &name) {
            return Ok(id);
        }
        match self.fs.meta().lookup(tdir, &name).await {
            Ok(i) => {
                self.put_dir(tdir, &name, i.id);
                Ok(i.id)
            }
            Err(e) if e.code() == ErrorCode::NotFound => {
                self.forget_topic(topic);
                Err(MqError::PartitionNotFound { topic: topic.into(), partition })
            }
            Err(e) => Err(from_meta(e, topic)),
        }
    }

    /// A topic's configuration (cached for [`CACHE_TTL_MS`]).
    pub async fn topic(&self, topic: &str) -> Result<Arc<TopicMeta>> {
        {
            let c = self.caches.lock();
            if let Some(e) = c.topics.get(topic).filter(|e| e.at.elapsed() < Duration::from_millis(CACHE_TTL_MS)) {
                return Ok(Arc::clone(&e.value));
            }
        }
        Ok(Arc::new(self.topic_versioned(topic).await?.value))
    }

    /// A topic's configuration as stored now, with its version.
    pub async fn topic_versioned(&self, topic: &str) -> Result<Versioned<TopicMeta>> {
        check_topic_name(topic)?;
        let tdir = self.topic_dir(topic).await?;
        let v = match read_json::<TopicMeta>(&self.fs, tdir, TOPIC_FILE).await {
            Ok(Some(v)) => v,
            // A topic directory without its file: being created or deleted.
            Ok(None) | Err(MqError::NotFound(_)) => {
                self.forget_topic(topic);
                return Err(MqError::TopicNotFound(topic.into()));
            }
            Err(e) => return Err(e),
        };
        let mut c = self.caches.lock();
        if c.topics.len() >= CACHE_MAX_ENTRIES {
            c.topics.clear();
        }
        c.topics.insert(topic.to_string(), Cached { value: Arc::new(v.value.clone()), at: Instant::now() });
        Ok(v)
    }

    /// Replaces a topic's configuration (CAS on the version read).
    pub async fn update_topic(&self, old: &Versioned<TopicMeta>, new: &TopicMeta) -> Result<()> {
        let tdir = self.topic_dir(&new.name).await?;
        write_json(&self.fs, tdir, TOPIC_FILE, new, Some(old.expected())).await?;
        self.forget_topic(&new.name);
        Ok(())
    }

    /// Creates a topic: its directory, one directory and state file per
    /// partition, then `topic.json` (the topic exists from that moment).
    pub async fn create_topic(&self, meta: &TopicMeta) -> Result<()> {
        check_topic_name(&meta.name)?;
        let m = self.fs.meta();
        let tdir = match m.mkdir(self.topics, &meta.name, DIR_MODE).await {
            Ok(i) => i.id,
            Err(e) if e.code() == ErrorCode::AlreadyExists => {
                // A complete topic, or the leftover of a create that failed half-way.
                let id = self.topic_dir(&meta.name).await?;
                if m.lookup(id, TOPIC_FILE).await.is_ok() {
                    return Err(MqError::TopicExists(meta.name.clone()));
                }
                id
            }
            Err(e) => return Err(from_meta(e, &meta.name)),
        };
        for p in 0..meta.partitions {
            let pdir = match m.mkdir(tdir, &p.to_string(), DIR_MODE).await {
                Ok(i) => i.id,
                Err(e) if e.code() == ErrorCode::AlreadyExists => {
                    m.lookup(tdir, &p.to_string()).await.map_err(|e| from_meta(e, &meta.name))?.id
                }
                Err(e) => return Err(from_meta(e, &meta.name)),
            };
            match write_json(&self.fs, pdir, STATE_FILE, &PartitionState::new(), Some(Expected::Absent)).await {
                Ok(_) | Err(MqError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        match write_json(&self.fs, tdir, TOPIC_FILE, meta, Some(Expected::Absent)).await {
            Ok(_) => {
                self.forget_topic(&meta.name);
                Ok(())
            }
            Err(MqError::Conflict(_)) => Err(MqError::TopicExists(meta.name.clone())),
            Err(e) => Err(e),
        }
    }

    /// Deletes a topic and everything in it (one meta transaction; meta's
    /// GC reclaims the files).
    pub async fn delete_topic(&self, topic: &str) -> Result<()> {
        check_topic_name(topic)?;
        self.topic_dir(topic).await?;
        self.forget_topic(topic);
        match self.fs.meta().remove_tree(self.topics, topic).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => Err(MqError::TopicNotFound(topic.into())),
            Err(e) => Err(from_meta(e, topic)),
        }
    }

    /// Names of all topics (with a `topic.json`), in byte order.
    pub async fn list_topics(&self) -> Result<Vec<String>> {
        let names = list_names(&self.fs, self.topics).await?;
        Ok(names.into_iter().filter(|n| check_topic_name(n).is_ok()).collect())
    }

    pub async fn read_state(&self, pdir: InodeId) -> Result<Versioned<PartitionState>> {
        read_json::<PartitionState>(&self.fs, pdir, STATE_FILE)
            .await?
            .ok_or_else(|| MqError::NotFound("the partition state file (the topic is being deleted?)".into()))
    }

    /// CASes the partition state; meta syncs the change before answering.
    pub async fn write_state(&self, pdir: InodeId, state: &PartitionState, expected: Expected) -> Result<Versioned<PartitionState>> {
        cas_state(&self.fs, pdir, state, expected).await
    }

    /// [`Store::write_state`] as a relaxed metadata change: answered before
    /// meta's fsync; survives a crash of meta, and power loss may take it
    /// (only ever a flush's `hw`/`seg_bytes` step: acquire recovers the
    /// batches past a lost step from the segment, docs/mq.md "Durability").
    pub async fn write_state_relaxed(
        &self,
        pdir: InodeId,
        state: &PartitionState,
        expected: Expected,
    ) -> Result<Versioned<PartitionState>> {
        cas_state(&self.fs_relaxed, pdir, state, expected).await
    }
}

async fn cas_state(fs: &FsClient, pdir: InodeId, state: &PartitionState, expected: Expected) -> Result<Versioned<PartitionState>> {
    let inode = write_json(fs, pdir, STATE_FILE, state, Some(expected)).await?;
    Ok(Versioned { value: state.clone(), inode: inode.id, version: inode.version })
}

/// Looks up (or makes) the directory `name` in `parent`.
async fn dir_at(fs: &FsClient, parent: InodeId, name: &str, create: bool) -> std::result::Result<InodeId, String> {
    match fs.meta().lookup(parent, name).await {
        Ok(i) if i.dir().is_some() => Ok(i.id),
        Ok(_) => Err(format!("{name} is not a directory")),
        Err(e) if e.code() == ErrorCode::NotFound && create => match fs.meta().mkdir(parent, name, DIR_MODE).await {
            Ok(i) => Ok(i.id),
            Err(e) if e.code() == ErrorCode::AlreadyExists => fs.meta().lookup(parent, name).await.map(|i| i.id).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    }
}

/// Every name in a directory, in byte order.
pub async fn list_names(fs: &FsClient, dir: InodeId) -> Result<Vec<String>> {
    Ok(list_entries(fs, dir, false).await?.into_iter().map(|(n, _)| n).collect())
}

/// Every entry of a directory (with attributes when asked), in byte order.
pub async fn list_entries(fs: &FsClient, dir: InodeId, with_attrs: bool) -> Result<Vec<(String, Option<Inode>)>> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let (entries, more) = fs.meta().readdir(dir, &cursor, 1024, with_attrs).await.map_err(|e| from_meta(e, "list"))?;
        let last = entries.last().map(|e| e.name.clone());
        out.extend(entries.into_iter().map(|e| (e.name, e.attr)));
        match last {
            Some(l) if more => cursor = l,
            _ => return Ok(out),
        }
    }
}

/// The bytes of a file as one read (inline or chunked), ignoring meta's
/// length when `len` is given.
pub async fn read_file(fs: &FsClient, inode: &Inode, len: Option<u64>) -> Result<Bytes> {
    if let InodeData::File(f) = &inode.data {
        if let Some(data) = &f.inline {
            return Ok(Bytes::copy_from_slice(data));
        }
    }
    let len = len.unwrap_or_else(|| inode.size_bytes());
    if len == 0 {
        return Ok(Bytes::new());
    }
    reader(fs, inode, len)?.read_at(0, len).await.map_err(|e| from_file(e, "read"))
}

/// A read handle on a file that reads up to `len` bytes whatever meta's
/// length says (a segment's committed end is in the partition state, and
/// meta's length of a file being appended lags).
pub fn reader(fs: &FsClient, inode: &Inode, len: u64) -> Result<FileHandle> {
    let mut i = inode.clone();
    if let InodeData::File(f) = &mut i.data {
        f.length = len;
    }
    fs.reader(i).map_err(|e| from_file(e, "open"))
}

/// Reads a CAS file; `None` when it does not exist.
pub async fn read_json<T: DeserializeOwned>(fs: &FsClient, dir: InodeId, name: &str) -> Result<Option<Versioned<T>>> {
    let inode = match fs.meta().lookup(dir, name).await {
        Ok(i) => i,
        Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(from_meta(e, name)),
    };
    let bytes = read_file(fs, &inode, None).await?;
    let value = serde_json::from_slice(&bytes).map_err(|e| MqError::Corrupt(format!("{name}: {e}")))?;
    Ok(Some(Versioned { value, inode: inode.id, version: inode.version }))
}

/// Writes a CAS file atomically (see the module docs); `PreconditionFailed`
/// becomes `Conflict`, a missing directory `NotFound`.
pub async fn write_json<T: Serialize>(fs: &FsClient, dir: InodeId, name: &str, value: &T, expected: Option<Expected>) -> Result<Inode> {
    let bytes = serde_json::to_vec(value).map_err(|e| MqError::Internal(format!("encode {name}: {e}")))?;
    write_bytes(fs, dir, name, &bytes, expected).await
}

pub async fn write_bytes(fs: &FsClient, dir: InodeId, name: &str, bytes: &[u8], expected: Option<Expected>) -> Result<Inode> {
    let cas = |e: fskv_client::MetaClientError| match e.code() {
        ErrorCode::PreconditionFailed => MqError::Conflict(format!("{name} changed")),
        _ => from_meta(e, name),
    };
    if let (Some(Expected::Inode { id, version }), true) = (&expected, bytes.len() <= INLINE_MAX_BYTES) {
        match fs.meta().overwrite_inline(dir, name, (*id, *version), bytes).await {
            // The file is chunked (it was larger once): publish a new one.
            Err(e) if e.code() == ErrorCode::Unsupported => {}
            r => return r.map_err(cas),
        }
    }
    if bytes.len() <= INLINE_MAX_BYTES {
        return fs.meta().create_write_publish(dir, name, FILE_MODE, bytes, expected, PublishAttrs::default()).await.map_err(cas);
    }
    let h = fs.create_temp(dir, FILE_MODE).await.map_err(|e| from_file(e, name))?;
    h.write_at(0, Bytes::copy_from_slice(bytes)).await.map_err(|e| from_file(e, name))?;
    match fs.publish(&h, dir, name, expected, PublishAttrs::default()).await {
        Ok(i) => Ok(i),
        Err(fskv_client::FileError::Meta { cause, .. }) => Err(cas(cause)),
        Err(e) => Err(from_file(e, name)),
    }
}

/// Reads a sealed segment's xattr.
pub async fn read_seal(fs: &FsClient, inode: InodeId) -> Result<Option<Seal>> {
    match fs.meta().get_xattr(inode, SEAL_XATTR).await {
        Ok(v) => serde_json::from_slice(&v).map(Some).map_err(|e| MqError::Corrupt(format!("seal xattr: {e}"))),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(from_meta(e, "seal xattr")),
    }
}

pub async fn write_seal(fs: &FsClient, inode: InodeId, seal: &Seal) -> Result<()> {
    let v = serde_json::to_vec(seal).map_err(|e| MqError::Internal(e.to_string()))?;
    fs.meta().set_xattr(inode, SEAL_XATTR, &v, fskv_proto::meta::XattrFlag::Any).await.map_err(|e| from_meta(e, "seal xattr"))
}
