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

/// What an open finds in [`CacheStamps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtOpen {
    /// Opened here before at this version (and the open allows keeping):
    /// the kernel keeps its pages; else it drops them.
    pub keep_pages: bool,
    /// This mount opened the file, or handed the kernel its attributes, at
    /// another version: another client changed it, so the kernel's cached
    /// attributes (the size) are dropped too.
    pub drop_attrs: bool,
}

#[derive(Default)]
struct Stamps {
    /// inode → version at this mount's last open of it.
    opened: HashMap<InodeId, u64>,
    /// inode → version of the file attributes last handed to the kernel.
    attrs: HashMap<InodeId, u64>,
}

/// The inode version of each file when this mount last opened it and when
/// it last gave the kernel its attributes, for close-to-open consistency
/// (any change by anyone bumps the version meta returns at the next open):
/// the kernel keeps the pages of an unchanged file across opens, and drops
/// the attributes of a changed one. Bounded: a full map forgets
/// everything (the next opens just read fresh and keep the cached
/// attributes' TTL).
pub struct CacheStamps {
    stamps: Mutex<Stamps>,
    max_entries: usize,
}

fn insert_bounded(map: &mut HashMap<InodeId, u64>, inode: InodeId, version: u64, max_entries: usize) {
    if map.len() >= max_entries && !map.contains_key(&inode) {
        map.clear();
    }
    map.insert(inode, version);
}

impl CacheStamps {
    pub fn new(max_entries: usize) -> Self {
        CacheStamps { stamps: Mutex::new(Stamps::default()), max_entries: max_entries.max(1) }
    }

    /// Records `version` as opened and says what the kernel's cache of the
    /// file is worth (`may_keep`: the open allows keeping its pages).
    pub fn on_open(&self, inode: InodeId, version: u64, may_keep: bool) -> AtOpen {
        let mut s = self.stamps.lock();
        let opened = s.opened.get(&inode).copied();
        let attrs = s.attrs.get(&inode).copied();
        let at_open = AtOpen {
            keep_pages: may_keep && opened == Some(version),
            drop_attrs: opened.is_some_and(|v| v != version) || attrs.is_some_and(|v| v != version),
        };
        insert_bounded(&mut s.opened, inode, version, self.max_entries);
        if at_open.drop_attrs {
            // The kernel asks again; that answer is recorded then.
            s.attrs.remove(&inode);
        }
        at_open
    }

    /// The attributes of `inode` at `version` go to the kernel (a lookup,
    /// getattr, readdirplus or create reply of a regular file).
    pub fn on_attrs(&self, inode: InodeId, version: u64) {
        let mut s = self.stamps.lock();
        insert_bounded(&mut s.attrs, inode, version, self.max_entries);
    }

    /// A writer of this mount closed: both stamps go, so the next open
    /// reads fresh pages and keeps the kernel's attributes (the kernel kept
    /// them up to date through the writes).
    pub fn forget(&self, inode: InodeId) {
        let mut s = self.stamps.lock();
        s.opened.remove(&inode);
        s.attrs.remove(&inode);
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

/// The handles and, for the files open for writing, an index by inode (the
/// read path asks "who writes this file" on every read and getattr).
///
/// **Invariant:** `writers[i]` holds exactly the `(fh, file)` of the slots
/// that are `Slot::File` with `inode == i && writable`, and no key maps to
/// an empty list.
#[derive(Default)]
struct Slots {
    by_fh: HashMap<u64, Slot>,
    writers: HashMap<InodeId, Vec<(u64, Arc<OpenFile>)>>,
}

/// All handles of one mount, bounded by `max_handles`.
pub struct HandleTable {
    slots: Mutex<Slots>,
    next_fh: AtomicU64,
    max_handles: usize,
}

impl HandleTable {
    pub fn new(max_handles: usize) -> Self {
        HandleTable { slots: Mutex::new(Slots::default()), next_fh: AtomicU64::new(1), max_handles: max_handles.max(1) }
    }

    fn insert(&self, slot: Slot) -> FsResult<u64> {
        let mut slots = self.slots.lock();
        if slots.by_fh.len() >= self.max_handles {
            tracing::warn!(max = self.max_handles, "open handle limit reached");
            return Err(FsError(Errno::EMFILE));
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if let Slot::File(f) = &slot {
            if f.writable {
                slots.writers.entry(f.inode).or_default().push((fh, f.clone()));
            }
        }
        slots.by_fh.insert(fh, slot);
        Ok(fh)
    }

    pub fn insert_file(&self, file: OpenFile) -> FsResult<u64> {
        self.insert(Slot::File(Arc::new(file)))
    }

    pub fn insert_dir(&self, dir: OpenDir) -> FsResult<u64> {
        self.insert(Slot::Dir(Arc::new(dir)))
    }

    pub fn file(&self, fh: u64) -> FsResult<Arc<OpenFile>> {
        match self.slots.lock().by_fh.get(&fh) {
            Some(Slot::File(f)) => Ok(f.clone()),
            _ => Err(FsError(Errno::EBADF)),
        }
    }

    pub fn dir(&self, fh: u64) -> FsResult<Arc<OpenDir>> {
        match self.slots.lock().by_fh.get(&fh) {
            Some(Slot::Dir(d)) => Ok(d.clone()),
            _ => Err(FsError(Errno::EBADF)),
        }
    }

    pub fn remove_file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        let mut slots = self.slots.lock();
        if !matches!(slots.by_fh.get(&fh), Some(Slot::File(_))) {
            return None;
        }
        let Some(Slot::File(f)) = slots.by_fh.remove(&fh) else { return None };
        if f.writable {
            if let Some(list) = slots.writers.get_mut(&f.inode) {
                list.retain(|(h, _)| *h != fh);
                if list.is_empty() {
                    slots.writers.remove(&f.inode);
                }
            }
        }
        Some(f)
    }

    pub fn remove_dir(&self, fh: u64) {
        let mut slots = self.slots.lock();
        if matches!(slots.by_fh.get(&fh), Some(Slot::Dir(_))) {
            slots.by_fh.remove(&fh);
        }
    }

    /// Whether a handle of this mount has `inode` open for writing.
    pub fn has_writer(&self, inode: InodeId) -> bool {
        self.slots.lock().writers.contains_key(&inode)
    }

    /// Open writable files of `inode` (to report sizes that meta has not
    /// seen yet).
    pub fn writers_of(&self, inode: InodeId) -> Vec<Arc<OpenFile>> {
        self.slots.lock().writers.get(&inode).map(|list| list.iter().map(|(_, f)| f.clone()).collect()).unwrap_or_default()
    }

    /// Every open file (for closing at unmount).
    pub fn drain_files(&self) -> Vec<Arc<OpenFile>> {
        let mut slots = self.slots.lock();
        slots.writers.clear();
        let fhs: Vec<u64> = slots.by_fh.iter().filter(|(_, s)| matches!(s, Slot::File(_))).map(|(k, _)| *k).collect();
        fhs.into_iter()
            .filter_map(|fh| match slots.by_fh.remove(&fh) {
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
    fn cache_stamps_keep_pages_of_unchanged_files_and_drop_attributes_of_changed_ones() {
        let at = |keep_pages, drop_attrs| AtOpen { keep_pages, drop_attrs };
        let stamps = CacheStamps::new(2);
        let f = InodeId(5);
        assert_eq!(stamps.on_open(f, 1, true), at(false, false), "first open");
        assert_eq!(stamps.on_open(f, 1, true), at(true, false), "same version");
        assert_eq!(stamps.on_open(f, 1, false), at(false, false), "same version, O_TRUNC");
        assert_eq!(stamps.on_open(f, 2, true), at(false, true), "changed elsewhere");
        assert_eq!(stamps.on_open(f, 3, false), at(false, true), "changed elsewhere, O_TRUNC");
        // Attributes handed out at one version, opened at another.
        stamps.on_attrs(f, 4);
        assert_eq!(stamps.on_open(f, 5, true), at(false, true), "stat'ed at 4, opened at 5");
        stamps.on_attrs(f, 5);
        assert_eq!(stamps.on_open(f, 5, true), at(true, false), "stat'ed and opened at 5");
        // Only stat'ed, never opened here.
        stamps.on_attrs(InodeId(6), 1);
        assert_eq!(stamps.on_open(InodeId(6), 2, true), at(false, true), "stat'ed at 1, first opened at 2");
        stamps.on_attrs(InodeId(6), 2);
        stamps.forget(InodeId(6));
        assert_eq!(stamps.on_open(InodeId(6), 3, true), at(false, false), "after this mount's writer closed");
        // Opens fill up: they are all forgotten, and a forgotten file opens
        // fresh; the attributes handed out at 5 are still known.
        stamps.on_open(InodeId(7), 1, true);
        assert_eq!(stamps.on_open(f, 6, true), at(false, true));
        stamps.on_attrs(InodeId(8), 1);
        stamps.on_attrs(InodeId(9), 1);
        assert_eq!(stamps.on_open(f, 7, true), at(false, true), "the open at 6 is still known");
    }

    fn open_file(inode: u64, writable: bool) -> OpenFile {
        OpenFile { inode: InodeId(inode), writable, handle: tokio::sync::RwLock::new(None), wb: None }
    }

    /// The writer index against a scan of every handle, over a seeded run
    /// of opens, closes (of files, directories and unknown handles) and a
    /// drain.
    #[test]
    fn writer_index_matches_a_scan_of_the_handles() {
        let table = HandleTable::new(64);
        let mut open: Vec<(u64, u64, bool)> = Vec::new(); // (fh, inode, writable) of open files
        let mut dirs: Vec<u64> = Vec::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || crate::xorshift(&mut rng);
        for step in 0..2000 {
            let r = next();
            match r % 5 {
                0 | 1 => {
                    let (inode, writable) = (1 + next() % 4, next() % 2 == 0);
                    match table.insert_file(open_file(inode, writable)) {
                        Ok(fh) => open.push((fh, inode, writable)),
                        Err(_) => assert_eq!(open.len() + dirs.len(), 64, "EMFILE below the limit"),
                    }
                }
                2 if !open.is_empty() => {
                    let (fh, inode, _) = open.swap_remove((next() % open.len() as u64) as usize);
                    assert_eq!(table.remove_file(fh).map(|f| f.inode), Some(InodeId(inode)));
                    assert!(table.remove_file(fh).is_none(), "a handle removed twice");
                }
                3 => match table.insert_dir(OpenDir { inode: InodeId(9), state: Default::default() }) {
                    Ok(fh) => {
                        assert!(table.remove_file(fh).is_none(), "a directory handle removed as a file");
                        dirs.push(fh);
                    }
                    Err(_) => assert_eq!(open.len() + dirs.len(), 64),
                },
                _ if !dirs.is_empty() => table.remove_dir(dirs.swap_remove(0)),
                _ => {}
            }
            if step == 1500 {
                assert_eq!(table.drain_files().len(), open.len());
                open.clear();
            }
            for inode in 1..=4 {
                let mut want: Vec<u64> = open.iter().filter(|(_, i, w)| *i == inode && *w).map(|(fh, _, _)| *fh).collect();
                assert_eq!(table.has_writer(InodeId(inode)), !want.is_empty(), "step {step}, inode {inode}");
                assert_eq!(table.writers_of(InodeId(inode)).len(), want.len(), "step {step}, inode {inode}");
                let slots = table.slots.lock();
                let mut got: Vec<u64> =
                    slots.writers.get(&InodeId(inode)).map(|l| l.iter().map(|(fh, _)| *fh).collect()).unwrap_or_default();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "step {step}, inode {inode}");
                assert!(slots.writers.values().all(|l| !l.is_empty()), "an empty writer list left behind");
            }
        }
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
