//! Open file and directory handles, keyed by the `fh` the kernel carries.

use crate::errno::{FsError, FsResult};
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
}

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct ListedEntry {
    pub name: String,
    pub inode: InodeId,
    pub kind: fuser::FileType,
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
