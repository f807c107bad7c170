//! Open file and directory handles, keyed by the `fh` the kernel carries.

use crate::errno::{FsError, FsResult};
use crate::writeback::{FlushSink, WriteBehind};
use fskv_client::FileHandle;
use fskv_types::InodeId;
use fuser::Errno;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One open file: I/O takes the lock shared, release takes it exclusive
/// to close the handle once in-flight calls are done.
pub struct OpenFile {
    pub inode: InodeId,
    pub writable: bool,
    pub handle: tokio::sync::RwLock<Option<FileHandle>>,
    /// The write-behind buffer of a writable file (`None`: read-only, or
    /// buffering turned off; writes then go straight to storage).
    pub wb: Option<Arc<WriteBehind>>,
}

impl OpenFile {
    /// Waits until nothing of this handle is buffered or in flight; an error
    /// of a background flush stays for the handle's next write/fsync/close.
    pub async fn settle(self: &Arc<Self>) {
        if let Some(wb) = &self.wb {
            if wb.is_dirty() {
                wb.settle(self).await;
            }
        }
    }

    /// Flushes this handle's buffer and waits for it; the error of a failed
    /// background flush, once.
    pub async fn drain(self: &Arc<Self>) -> FsResult<()> {
        match &self.wb {
            Some(wb) => wb.drain(self).await.map_err(FsError),
            None => Ok(()),
        }
    }

    /// Whether close(2)'s flush has nothing to do: a read-only handle, or
    /// a write handle with nothing buffered, in flight or failed, through
    /// which no write was ever attempted (what [`crate::fs`]'s flush would
    /// send is then nothing). `false` when it cannot tell without waiting.
    pub fn flush_is_noop(&self) -> bool {
        if !self.writable {
            return true;
        }
        if self.wb.as_ref().is_some_and(|wb| !wb.is_settled_ok()) {
            return false;
        }
        self.handle.try_read().is_ok_and(|g| g.as_ref().is_some_and(FileHandle::never_wrote))
    }

    /// The end of this handle's writes, buffered ones included.
    pub fn written_end(&self) -> Option<u64> {
        let buffered = self.wb.as_ref().map_or(0, |wb| wb.end());
        let written = self.handle.try_read().ok().and_then(|g| g.as_ref().map(FileHandle::len));
        match written {
            Some(w) => Some(w.max(buffered)),
            None if buffered > 0 => Some(buffered),
            None => None,
        }
    }
}

/// Background flushes write through the open file's handle.
impl FlushSink for Arc<OpenFile> {
    async fn write_at(&self, offset: u64, data: bytes::Bytes) -> Result<(), Errno> {
        let guard = self.handle.read().await;
        let handle = guard.as_ref().ok_or(Errno::EBADF)?;
        handle.write_at(offset, data).await.map_err(|e| FsError::from(e).0)
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct ListedEntry {
    pub name: String,
    pub inode: InodeId,
    pub kind: fuser::FileType,
    /// The entry's inode as meta listed it (readdirplus); `None` for
    /// virtual entries.
    pub attr: Option<Box<fskv_proto::meta::Inode>>,
}

/// One open directory: the entries read so far (the kernel's readdir
/// offset is an index into them) and where the next page starts.
pub struct OpenDir {
    pub inode: InodeId,
    pub state: tokio::sync::Mutex<DirState>,
}

#[derive(Default)]
pub struct DirState {
    pub entries: Vec<ListedEntry>,
    /// Whether meta has more entries after the last one read.
    pub more: bool,
    /// Name of the last entry read from meta ("" = start).
    pub last_name: String,
}

/// The inode version each file had when this mount last opened it, to
/// keep the kernel's page cache across opens of an unchanged file
/// (close-to-open consistency: any change by anyone bumps the version
/// meta returns at the next open). Bounded: when full it forgets
/// everything (the next opens just read fresh).
pub struct CacheStamps {
    versions: Mutex<HashMap<InodeId, u64>>,
    max_entries: usize,
}

impl CacheStamps {
    pub fn new(max_entries: usize) -> Self {
        CacheStamps { versions: Mutex::new(HashMap::new()), max_entries: max_entries.max(1) }
    }

    /// Records `version` as opened; whether the cache from an earlier open
    /// may be kept (same version, and `may_keep`).
    pub fn on_open(&self, inode: InodeId, version: u64, may_keep: bool) -> bool {
        let mut v = self.versions.lock();
        let keep = may_keep && v.get(&inode) == Some(&version);
        if v.len() >= self.max_entries && !v.contains_key(&inode) {
            v.clear();
        }
        v.insert(inode, version);
        keep
    }

    /// A writer of this mount closed: the next open reads fresh.
    pub fn forget(&self, inode: InodeId) {
        self.versions.lock().remove(&inode);
    }
}

/// Files this mount recently found without one of the extended attributes
/// the kernel and common tools probe on their own ([`PROBED_XATTRS`]): the
/// kernel asks for `security.capability` before **every** write (to drop
/// file capabilities), `ls -l` asks for `security.selinux` on every entry.
/// Without this cache each of those cost a metadata round trip. An entry
/// lives `ttl` (the attribute TTL: the same staleness as cached attributes)
/// and is dropped when this mount sets or removes an xattr of the file.
/// Bounded: when full it forgets everything.
pub struct AbsentXattrCache {
    seen: Mutex<HashMap<(InodeId, usize), std::time::Instant>>,
    ttl: std::time::Duration,
    max_entries: usize,
}

/// Attributes probed on every write or listing, whose absence is cached.
pub const PROBED_XATTRS: [&str; 2] = ["security.capability", "security.selinux"];

/// POSIX ACL attributes: the mount checks mode bits only (no
/// `FUSE_POSIX_ACL`), so ACLs are not supported and these names get
/// EOPNOTSUPP locally, as on a file system mounted without ACLs (`ls -l`
/// asks for `system.posix_acl_access` on every entry).
pub const ACL_XATTRS: [&str; 2] = ["system.posix_acl_access", "system.posix_acl_default"];

/// The index of `name` in [`PROBED_XATTRS`].
pub fn probed_xattr(name: &std::ffi::OsStr) -> Option<usize> {
    PROBED_XATTRS.iter().position(|p| name == *p)
}

/// Whether `name` is a POSIX ACL attribute.
pub fn is_acl_xattr(name: &std::ffi::OsStr) -> bool {
    ACL_XATTRS.iter().any(|p| name == *p)
}

impl AbsentXattrCache {
    pub fn new(ttl_ms: u64, max_entries: usize) -> Self {
        AbsentXattrCache {
            seen: Mutex::new(HashMap::new()),
            ttl: std::time::Duration::from_millis(ttl_ms),
            max_entries: max_entries.max(1),
        }
    }

    /// Whether `inode` was seen without probed attribute `which` less than
    /// `ttl` ago.
    pub fn known_absent(&self, inode: InodeId, which: usize) -> bool {
        self.seen.lock().get(&(inode, which)).is_some_and(|at| at.elapsed() < self.ttl)
    }

    pub fn note_absent(&self, inode: InodeId, which: usize) {
        let mut seen = self.seen.lock();
        if seen.len() >= self.max_entries && !seen.contains_key(&(inode, which)) {
            seen.clear();
        }
        seen.insert((inode, which), std::time::Instant::now());
    }

    /// An inode this mount just created (it has no xattrs at all).
    pub fn note_new_inode(&self, inode: InodeId) {
        for which in 0..PROBED_XATTRS.len() {
            self.note_absent(inode, which);
        }
    }

    pub fn forget(&self, inode: InodeId) {
        let mut seen = self.seen.lock();
        for which in 0..PROBED_XATTRS.len() {
            seen.remove(&(inode, which));
        }
    }
}

/// Attributes of directories as meta last gave them to this mount, kept
/// for the attribute TTL. The kernel drops a directory's attributes
/// whenever an entry in it is made or removed, and the next path walk
/// through it asks for them again (its permission check): without this
/// cache every create in a directory cost a `stat` round trip to meta.
///
/// | event in this mount | cached attributes of the directory |
/// |---|---|
/// | meta answered a `getattr` of it | kept, unless the cache changed while it was asked (an epoch, as the kernel's attribute version) |
/// | create, mknod, symlink, link or unlink in it succeeded | mtime and ctime move to now |
/// | mkdir, rmdir or rename anywhere, or a failed change in it | every entry dropped (link counts, moved parents) |
/// | setattr, setxattr or removexattr on it | dropped |
/// | older than the TTL | dropped; a reply's TTL is what is left of it |
///
/// So what the kernel sees is never older than one attribute TTL, as with
/// its own cache; a change by another client shows within that bound.
pub struct DirAttrCache {
    dirs: Mutex<HashMap<InodeId, (fskv_proto::meta::Inode, std::time::Instant)>>,
    /// Moved by every change: an answer asked for before one is not kept.
    epoch: AtomicU64,
    ttl: std::time::Duration,
    max_entries: usize,
}

impl DirAttrCache {
    pub fn new(ttl_ms: u64, max_entries: usize) -> Self {
        DirAttrCache {
            dirs: Mutex::new(HashMap::new()),
            epoch: AtomicU64::new(0),
            ttl: std::time::Duration::from_millis(ttl_ms),
            max_entries: max_entries.max(1),
        }
    }

    /// The cached attributes of directory `id` and how long they stay valid.
    pub fn get(&self, id: InodeId) -> Option<(fskv_proto::meta::Inode, std::time::Duration)> {
        let mut dirs = self.dirs.lock();
        let (inode, at) = dirs.get(&id)?;
        match self.ttl.checked_sub(at.elapsed()) {
            Some(left) if !left.is_zero() => Some((inode.clone(), left)),
            _ => {
                dirs.remove(&id);
                None
            }
        }
    }

    /// Taken before asking meta; given back to [`DirAttrCache::note`].
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Meta's answer for `inode`, asked for at `epoch` (ignored unless a
    /// directory, or if anything changed since).
    pub fn note(&self, inode: &fskv_proto::meta::Inode, epoch: u64) {
        if inode.dir().is_none() || self.ttl.is_zero() {
            return;
        }
        let mut dirs = self.dirs.lock();
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        if dirs.len() >= self.max_entries && !dirs.contains_key(&inode.id) {
            dirs.clear();
        }
        let mut fresh = inode.clone();
        if let Some((old, _)) = dirs.get(&inode.id) {
            // An answer read before a change this mount made must not
            // take the change's times back.
            fresh.mtime_ns = fresh.mtime_ns.max(old.mtime_ns);
            fresh.ctime_ns = fresh.ctime_ns.max(old.ctime_ns);
        }
        dirs.insert(inode.id, (fresh, std::time::Instant::now()));
    }

    /// An entry of `dir` was made or removed at `now_ns`.
    pub fn touched(&self, dir: InodeId, now_ns: u64) {
        let mut dirs = self.dirs.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        if let Some((inode, _)) = dirs.get_mut(&dir) {
            inode.mtime_ns = inode.mtime_ns.max(now_ns);
            inode.ctime_ns = inode.ctime_ns.max(now_ns);
        }
    }

    pub fn forget(&self, id: InodeId) {
        let mut dirs = self.dirs.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        dirs.remove(&id);
    }

    pub fn clear(&self) {
        let mut dirs = self.dirs.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        dirs.clear();
    }
}

enum Slot {
    File(Arc<OpenFile>),
    Dir(Arc<OpenDir>),
}

impl Slot {
    /// The file, if this slot holds `inode` open for writing.
    fn writer_of(&self, inode: InodeId) -> Option<&Arc<OpenFile>> {
        match self {
            Slot::File(f) if f.inode == inode && f.writable => Some(f),
            _ => None,
        }
    }
}

/// All handles of one mount, bounded by `max_handles`.
pub struct HandleTable {
    slots: Mutex<HashMap<u64, Slot>>,
    next_fh: AtomicU64,
    max_handles: usize,
}

impl HandleTable {
    pub fn new(max_handles: usize) -> Self {
        HandleTable { slots: Mutex::new(HashMap::new()), next_fh: AtomicU64::new(1), max_handles: max_handles.max(1) }
    }

    fn insert(&self, slot: Slot) -> FsResult<u64> {
        let mut slots = self.slots.lock();
        if slots.len() >= self.max_handles {
            tracing::warn!(max = self.max_handles, "open handle limit reached");
            return Err(FsError(Errno::EMFILE));
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        slots.insert(fh, slot);
        Ok(fh)
    }

    pub fn insert_file(&self, file: OpenFile) -> FsResult<u64> {
        self.insert(Slot::File(Arc::new(file)))
    }

    pub fn insert_dir(&self, dir: OpenDir) -> FsResult<u64> {
        self.insert(Slot::Dir(Arc::new(dir)))
    }

    pub fn file(&self, fh: u64) -> FsResult<Arc<OpenFile>> {
        match self.slots.lock().get(&fh) {
            Some(Slot::File(f)) => Ok(f.clone()),
            _ => Err(FsError(Errno::EBADF)),
        }
    }

    pub fn dir(&self, fh: u64) -> FsResult<Arc<OpenDir>> {
        match self.slots.lock().get(&fh) {
            Some(Slot::Dir(d)) => Ok(d.clone()),
            _ => Err(FsError(Errno::EBADF)),
        }
    }

    pub fn remove_file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        let mut slots = self.slots.lock();
        match slots.get(&fh) {
            Some(Slot::File(_)) => match slots.remove(&fh) {
                Some(Slot::File(f)) => Some(f),
                _ => None,
            },
            _ => None,
        }
    }

    pub fn remove_dir(&self, fh: u64) {
        let mut slots = self.slots.lock();
        if matches!(slots.get(&fh), Some(Slot::Dir(_))) {
            slots.remove(&fh);
        }
    }

    /// Whether a handle of this mount has `inode` open for writing.
    pub fn has_writer(&self, inode: InodeId) -> bool {
        self.slots.lock().values().any(|s| s.writer_of(inode).is_some())
    }

    /// Open writable files of `inode` (to report sizes that meta has not
    /// seen yet).
    pub fn writers_of(&self, inode: InodeId) -> Vec<Arc<OpenFile>> {
        self.slots.lock().values().filter_map(|s| s.writer_of(inode).cloned()).collect()
    }

    /// Every open file (for closing at unmount).
    pub fn drain_files(&self) -> Vec<Arc<OpenFile>> {
        let mut slots = self.slots.lock();
        let fhs: Vec<u64> = slots.iter().filter(|(_, s)| matches!(s, Slot::File(_))).map(|(k, _)| *k).collect();
        fhs.into_iter()
            .filter_map(|fh| match slots.remove(&fh) {
                Some(Slot::File(f)) => Some(f),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_proto::meta::{Acl, DirData, Inode, InodeData, LayoutPolicy};

    fn dir(id: u64, mode: u32, mtime_ns: u64) -> Inode {
        let layout = LayoutPolicy { table_id: 1, table_version: 1, chunk_size_bytes: 4096, stripe_size: 1 };
        Inode {
            id: InodeId(id),
            data: InodeData::Directory(DirData { parent: InodeId(1), name: format!("d{id}"), layout }),
            acl: Acl { uid: 0, gid: 0, mode },
            nlink: 2,
            atime_ns: mtime_ns,
            mtime_ns,
            ctime_ns: mtime_ns,
            version: 1,
        }
    }

    #[test]
    fn directory_attributes_follow_this_mounts_changes_and_refuse_answers_read_before_one() {
        let cache = DirAttrCache::new(60_000, 16);
        let d = dir(7, 0o755, 100);
        assert!(cache.get(d.id).is_none());
        cache.note(&d, cache.epoch());
        let (got, ttl) = cache.get(d.id).expect("cached");
        assert_eq!((got.mtime_ns, got.acl.mode), (100, 0o755));
        assert!(ttl <= std::time::Duration::from_millis(60_000) && !ttl.is_zero());
        // A create in it: the times move, never back.
        cache.touched(d.id, 500);
        cache.touched(d.id, 400);
        let (got, _) = cache.get(d.id).unwrap();
        assert_eq!((got.mtime_ns, got.ctime_ns), (500, 500));
        // A later answer with older times keeps the change's times.
        cache.note(&dir(7, 0o700, 300), cache.epoch());
        let (got, _) = cache.get(d.id).unwrap();
        assert_eq!((got.mtime_ns, got.acl.mode), (500, 0o700));
        // An answer asked for before a change is not kept.
        let before = cache.epoch();
        cache.forget(d.id);
        cache.note(&dir(7, 0o777, 900), before);
        assert!(cache.get(d.id).is_none());
        let before = cache.epoch();
        cache.touched(InodeId(8), 1000);
        cache.note(&dir(7, 0o777, 900), before);
        assert!(cache.get(d.id).is_none());
        // clear drops everything.
        cache.note(&dir(7, 0o755, 100), cache.epoch());
        cache.note(&dir(9, 0o755, 100), cache.epoch());
        cache.clear();
        assert!(cache.get(InodeId(7)).is_none() && cache.get(InodeId(9)).is_none());
    }

    #[test]
    fn directory_attributes_expire_and_stay_bounded() {
        let cache = DirAttrCache::new(0, 16);
        cache.note(&dir(7, 0o755, 100), cache.epoch());
        assert!(cache.get(InodeId(7)).is_none(), "a zero TTL keeps nothing");
        let cache = DirAttrCache::new(60_000, 2);
        for id in 1..=3 {
            cache.note(&dir(id, 0o755, 100), cache.epoch());
        }
        assert!(cache.dirs.lock().len() <= 2);
        assert!(cache.get(InodeId(3)).is_some());
    }
}
