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

    pub fn forget(&self, inode: InodeId) {
        let mut seen = self.seen.lock();
        for which in 0..PROBED_XATTRS.len() {
            seen.remove(&(inode, which));
        }
    }
}

enum Slot {
    File(Arc<OpenFile>),
    Dir(Arc<OpenDir>),
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

    /// Open writable files of `inode` (to report sizes that meta has not
    /// seen yet).
    pub fn writers_of(&self, inode: InodeId) -> Vec<Arc<OpenFile>> {
        self.slots
            .lock()
            .values()
            .filter_map(|s| match s {
                Slot::File(f) if f.inode == inode && f.writable => Some(f.clone()),
                _ => None,
            })
            .collect()
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
