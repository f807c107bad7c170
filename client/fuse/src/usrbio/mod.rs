//! USRBIO in the FUSE daemon: the virtual directory `3fs-virt/iovs/`, the
//! registration of iovs, rings and files, the dispatcher that takes batches
//! from rings, and the cleanup after a program dies. The protocol (names,
//! layouts) is `fskv_usrbio::proto`; see `docs/usrbio.md`.
//!
//! | program does | FUSE op | daemon does |
//! |---|---|---|
//! | `symlink(/dev/shm/F, <mnt>/3fs-virt/iovs/<id>[.b<n>])` | symlink | checks F (regular, in /dev/shm, readable and writable by the caller), maps it, records it under `<id>` |
//! | same with `.r<d>` / `.w<d>` … | symlink | also checks the ring header; the dispatcher starts serving it |
//! | `unlink(<link>)` | unlink | forgets it (owner or root only); in-flight requests finish first |
//! | `ioctl(fd, IOC_REG_FD)` | ioctl | records the open file for the calling process; returns its token |
//! | `readlink(…/submit-ios)` | readlink | the doorbell's /dev/shm path |
//! | dies | — (pidfd readable) | closes its rings, waits for their requests, unmaps, removes its `fskv-usrbio.<pid>.*` files |
//!
//! Processes are told apart by thread-group id (the FUSE request carries
//! the calling thread's id; `/proc/<tid>/status` gives the group). A ring
//! serves only files its own process registered, and only iovs of the same
//! user (root: any).

mod exec;
pub mod sigbus;

use crate::handles::ListedEntry;
use exec::Dispatcher;
use fskv_usrbio::batch::Batcher;
use fskv_usrbio::client::check_shm_path;
use fskv_usrbio::proto::{self, IovKey, Priority, RegFdReply, RingKey, DOORBELL_BYTES, DOORBELL_MAGIC, HF3FS_SUPER_MAGIC, LIB_SHM_PREFIX};
use fskv_usrbio::ring::{Consumer, RingView};
use fskv_usrbio::sys::{create_file, fstat, Mapping};
use fuser::{Errno, FileAttr, FileType, INodeNo};
use parking_lot::Mutex;
use sigbus::GuardedMap;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

/// Limits of USRBIO in one mount; units are in the names.
#[derive(Clone, Debug)]
pub struct UsrbioConfig {
    /// Largest iov (or ring file) mapped.
    pub max_iov_bytes: u64,
    /// Iovs + rings registered by one process.
    pub max_regions_per_process: usize,
    /// Iovs + rings registered in the mount.
    pub max_regions: usize,
    /// Batches executing at once (over all rings); rings of higher priority
    /// get the next free one first.
    pub max_inflight_batches: usize,
    /// Largest batch taken from a ring with `io_depth` ≤ 0.
    pub max_batch_entries: u32,
    /// The dispatcher looks at the rings at least this often even without a
    /// doorbell (bounds the delay if a program never rings it).
    pub idle_scan_ms: u64,
    /// After taking a batch, the dispatcher polls the doorbell this long
    /// before it sleeps (0: never polls).
    pub dispatch_spin_us: u64,
}

impl Default for UsrbioConfig {
    fn default() -> Self {
        UsrbioConfig {
            max_iov_bytes: 64 << 30,
            max_regions_per_process: 1024,
            max_regions: sigbus::MAX_GUARDED_REGIONS - 64,
            max_inflight_batches: 64,
            max_batch_entries: 1024,
            idle_scan_ms: 200,
            dispatch_spin_us: 0,
        }
    }
}

/// Virtual inode numbers: far above any inode id meta allocates.
pub const VIRT_BASE: u64 = 0xFFFF_FFFF_0000_0000;
/// `3fs-virt`.
pub const VIRT_DIR_INO: u64 = VIRT_BASE + 1;
/// `3fs-virt/iovs`.
pub const IOVS_DIR_INO: u64 = VIRT_BASE + 2;
/// `3fs-virt/iovs/submit-ios`.
pub const SUBMIT_INO: u64 = VIRT_BASE + 3;
const FIRST_ENTRY_INO: u64 = VIRT_BASE + 16;

/// Whether `ino` is one of the virtual directory's inodes.
pub fn is_virtual(ino: u64) -> bool {
    ino >= VIRT_BASE
}

/// Who made a FUSE request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Thread id of the caller (the FUSE header's pid).
    pub tid: u32,
}

/// The process a registration belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub tgid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// A registered iov or ring.
pub struct Region {
    pub ino: u64,
    pub name: String,
    pub key: IovKey,
    pub target: PathBuf,
    pub owner: Owner,
    pub map: Arc<GuardedMap>,
    /// (dev, ino) of the file when mapped: it is removed at the owner's death
    /// only if it is still that file and was made by the C library.
    file_id: (u64, u64),
    created: SystemTime,
    pub ring: Option<Arc<RingEntry>>,
}

/// A ring being served.
pub struct RingEntry {
    pub ino: u64,
    pub key: RingKey,
    pub owner: Owner,
    /// The ring's memory; keeps the guard alive as long as the consumer.
    pub map: Arc<GuardedMap>,
    pub consumer: Mutex<Consumer>,
    pub batcher: Mutex<Batcher>,
    /// Deregistered, its owner died, or it broke the protocol: no new batches.
    pub closed: AtomicBool,
    /// Batches of this ring executing now.
    pub running: AtomicU32,
}

impl Region {
    /// A region over `map` with no owner or name (unit tests).
    #[cfg(test)]
    pub(crate) fn for_tests(map: Arc<GuardedMap>) -> Region {
        Region {
            ino: 0,
            name: String::new(),
            key: IovKey { id: [0; 16], block_size: 0, ring: None },
            target: PathBuf::new(),
            owner: Owner { tgid: 0, uid: 0, gid: 0 },
            map,
            file_id: (0, 0),
            created: SystemTime::UNIX_EPOCH,
            ring: None,
        }
    }
}

impl RingEntry {
    fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.consumer.lock().close();
        }
    }
}

#[derive(Default)]
struct Proc {
    owner: Option<Owner>,
    /// Tokens (FUSE file handles) registered by this process.
    files: HashSet<u64>,
    regions: HashSet<u64>,
    watching: bool,
}

#[derive(Default)]
struct Registry {
    next_ino: u64,
    by_name: HashMap<String, u64>,
    regions: HashMap<u64, Arc<Region>>,
    by_id: HashMap<[u8; 16], u64>,
    /// Rings in dispatch order (priority, then registration).
    rings: Vec<Arc<RingEntry>>,
    procs: HashMap<i32, Proc>,
}

/// The daemon's USRBIO state (one per mount).
pub struct Server {
    cfg: UsrbioConfig,
    rt: tokio::runtime::Handle,
    registry: Mutex<Registry>,
    bell_path: PathBuf,
    bell: Mapping,
    files: Weak<crate::fs::Shared>,
    dispatcher: Mutex<Option<Dispatcher>>,
    stopping: AtomicBool,
    /// The dispatcher found every batch slot busy: the next batch to finish wakes it.
    pub(crate) starved: AtomicBool,
    started: SystemTime,
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn io_errno(e: &std::io::Error) -> Errno {
    err(e.raw_os_error().unwrap_or(libc::EIO))
}

/// The thread group of thread `tid` (from /proc).
fn tgid_of(tid: u32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok())
}

impl Server {
    /// Creates the doorbell and starts the dispatcher thread. `files` is the
    /// mount's shared state (open files, the client).
    pub(crate) fn start(cfg: UsrbioConfig, rt: tokio::runtime::Handle, files: Weak<crate::fs::Shared>) -> std::io::Result<Arc<Server>> {
        sweep_stale_doorbells();
        let id = fskv_usrbio::sys::random_id()?;
        let bell_path = Path::new(proto::SHM_DIR).join(format!("fskv-usrbio-bell.{}.{}", std::process::id(), proto::id_hex(&id)));
        let fd = create_file(&bell_path, DOORBELL_BYTES)?;
        // Every user of the mount rings it.
        // SAFETY: fchmod on a descriptor we own.
        unsafe { libc::fchmod(fd.as_raw_fd(), 0o666) };
        let bell = Mapping::map(&fd, DOORBELL_BYTES)?;
        // SAFETY: a fresh DOORBELL_BYTES mapping; Doorbell is all atomics.
        let b = unsafe { &*(bell.as_ptr() as *const proto::Doorbell) };
        b.magic.store(DOORBELL_MAGIC, Ordering::Release);
        let server = Arc::new(Server {
            cfg,
            rt,
            registry: Mutex::new(Registry { next_ino: FIRST_ENTRY_INO, ..Default::default() }),
            bell_path,
            bell,
            files,
            dispatcher: Mutex::new(None),
            stopping: AtomicBool::new(false),
            starved: AtomicBool::new(false),
            started: SystemTime::now(),
        });
        let dispatcher = Dispatcher::start(&server)?;
        *server.dispatcher.lock() = Some(dispatcher);
        tracing::info!(doorbell = %server.bell_path.display(), "usrbio: serving 3fs-virt/iovs");
        Ok(server)
    }

    fn doorbell(&self) -> &proto::Doorbell {
        // SAFETY: the mapping is DOORBELL_BYTES long and lives with `self`.
        unsafe { &*(self.bell.as_ptr() as *const proto::Doorbell) }
    }

    /// Wakes the dispatcher (a batch finished, a ring came or went).
    pub(crate) fn wake(&self) {
        fskv_usrbio::ring::ring_doorbell(self.doorbell());
    }

    /// Stops the dispatcher, closes every ring and removes the doorbell.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        self.wake();
        if let Some(d) = self.dispatcher.lock().take() {
            d.join();
        }
        let regions: Vec<Arc<Region>> = {
            let mut reg = self.registry.lock();
            reg.rings.clear();
            reg.by_name.clear();
            reg.by_id.clear();
            reg.regions.drain().map(|(_, r)| r).collect()
        };
        for r in &regions {
            if let Some(ring) = &r.ring {
                ring.close();
            }
        }
        let _ = std::fs::remove_file(&self.bell_path);
    }

    // ----- the virtual namespace -----

    fn attr(&self, ino: u64, kind: FileType, perm: u16, size: u64, (uid, gid): (u32, u32), time: SystemTime) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Attributes of a virtual inode.
    pub fn getattr(&self, ino: u64) -> Result<FileAttr, Errno> {
        match ino {
            VIRT_DIR_INO => Ok(self.attr(ino, FileType::Directory, 0o555, 0, (0, 0), self.started)),
            IOVS_DIR_INO => Ok(self.attr(ino, FileType::Directory, 0o1777, 0, (0, 0), self.started)),
            SUBMIT_INO => Ok(self.attr(ino, FileType::Symlink, 0o777, self.bell_path.as_os_str().len() as u64, (0, 0), self.started)),
            _ => {
                let reg = self.registry.lock();
                let r = reg.regions.get(&ino).ok_or(Errno::ENOENT)?;
                Ok(self.attr(ino, FileType::Symlink, 0o777, r.target.as_os_str().len() as u64, (r.owner.uid, r.owner.gid), r.created))
            }
        }
    }

    /// A name in a virtual directory (`parent` = 1 for `3fs-virt` in the root).
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        match (parent, name.as_bytes()) {
            (1, n) if n == proto::VIRT_DIR.as_bytes() => self.getattr(VIRT_DIR_INO),
            (VIRT_DIR_INO, n) if n == proto::IOVS_DIR.as_bytes() => self.getattr(IOVS_DIR_INO),
            (IOVS_DIR_INO, n) if n == proto::SUBMIT_LINK.as_bytes() => self.getattr(SUBMIT_INO),
            (IOVS_DIR_INO, _) => {
                let ino = *self.registry.lock().by_name.get(name.to_str().ok_or(Errno::ENOENT)?).ok_or(Errno::ENOENT)?;
                self.getattr(ino)
            }
            _ => Err(Errno::ENOENT),
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        if ino == SUBMIT_INO {
            return Ok(self.bell_path.as_os_str().as_bytes().to_vec());
        }
        let reg = self.registry.lock();
        let r = reg.regions.get(&ino).ok_or(Errno::EINVAL)?;
        Ok(r.target.as_os_str().as_bytes().to_vec())
    }

    /// The entries of a virtual directory (for readdir), `.` and `..` first.
    pub fn dir_entries(&self, ino: u64) -> Result<Vec<ListedEntry>, Errno> {
        let dot = |name: &str, ino: u64| ListedEntry {
            name: name.into(),
            inode: fskv_types::InodeId(ino),
            kind: FileType::Directory,
            attr: None,
        };
        match ino {
            VIRT_DIR_INO => Ok(vec![dot(".", VIRT_DIR_INO), dot("..", 1), dot(proto::IOVS_DIR, IOVS_DIR_INO)]),
            IOVS_DIR_INO => {
                let mut out = vec![dot(".", IOVS_DIR_INO), dot("..", VIRT_DIR_INO)];
                out.push(ListedEntry {
                    name: proto::SUBMIT_LINK.into(),
                    inode: fskv_types::InodeId(SUBMIT_INO),
                    kind: FileType::Symlink,
                    attr: None,
                });
                let reg = self.registry.lock();
                let mut names: Vec<(&String, &u64)> = reg.by_name.iter().collect();
                names.sort();
                out.extend(names.into_iter().map(|(n, i)| ListedEntry {
                    name: n.clone(),
                    inode: fskv_types::InodeId(*i),
                    kind: FileType::Symlink,
                    attr: None,
                }));
                Ok(out)
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    // ----- registration -----

    fn owner_of(&self, c: Caller) -> Result<Owner, Errno> {
        let tgid = tgid_of(c.tid).ok_or(Errno::ESRCH)?;
        Ok(Owner { tgid, uid: c.uid, gid: c.gid })
    }

    /// `symlink(target, 3fs-virt/iovs/name)`: registers an iov or a ring.
    pub fn symlink(self: &Arc<Self>, c: Caller, parent: u64, name: &OsStr, target: &Path) -> Result<FileAttr, Errno> {
        if parent != IOVS_DIR_INO {
            return Err(Errno::EPERM);
        }
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        let key = IovKey::parse(name).map_err(|e| {
            tracing::debug!(name, error = %e, "usrbio: bad registration name");
            Errno::EINVAL
        })?;
        let owner = self.owner_of(c)?;
        {
            let reg = self.registry.lock();
            if reg.by_name.contains_key(name) || reg.by_id.contains_key(&key.id) {
                return Err(Errno::EEXIST);
            }
            if reg.regions.len() >= self.cfg.max_regions {
                return Err(Errno::EMFILE);
            }
            if reg.procs.get(&owner.tgid).is_some_and(|p| p.regions.len() >= self.cfg.max_regions_per_process) {
                return Err(Errno::EMFILE);
            }
        }
        let (map, file_id) = self.map_shm(&owner, target)?;
        let ring = match key.ring {
            None => None,
            Some(rk) => Some(self.attach_ring(&owner, rk, &map)?),
        };
        let created = SystemTime::now();
        let region = {
            let mut reg = self.registry.lock();
            if reg.by_name.contains_key(name) || reg.by_id.contains_key(&key.id) {
                return Err(Errno::EEXIST);
            }
            let ino = reg.next_ino;
            reg.next_ino += 1;
            let ring = ring.map(|(rk, consumer)| {
                let batcher = Batcher::new(rk.io_depth, rk.timeout_ms, self.cfg.max_batch_entries);
                Arc::new(RingEntry {
                    ino,
                    key: rk,
                    owner,
                    map: map.clone(),
                    consumer: Mutex::new(consumer),
                    batcher: Mutex::new(batcher),
                    closed: AtomicBool::new(false),
                    running: AtomicU32::new(0),
                })
            });
            let region = Arc::new(Region {
                ino,
                name: name.to_string(),
                key,
                target: target.to_path_buf(),
                owner,
                map,
                file_id,
                created,
                ring: ring.clone(),
            });
            reg.by_name.insert(name.to_string(), ino);
            reg.by_id.insert(key.id, ino);
            reg.regions.insert(ino, region.clone());
            if let Some(r) = ring {
                let at = reg.rings.iter().position(|x| x.key.priority > r.key.priority).unwrap_or(reg.rings.len());
                reg.rings.insert(at, r);
            }
            let proc = reg.procs.entry(owner.tgid).or_default();
            proc.owner.get_or_insert(owner);
            proc.regions.insert(ino);
            region
        };
        self.watch(owner);
        tracing::debug!(
            name,
            tgid = owner.tgid,
            uid = owner.uid,
            bytes = region.map.len(),
            ring = region.ring.is_some(),
            "usrbio: registered"
        );
        if region.ring.is_some() {
            self.wake();
        }
        Ok(self.attr(region.ino, FileType::Symlink, 0o777, target.as_os_str().len() as u64, (owner.uid, owner.gid), created))
    }

    /// Opens and maps the shm file `target` on behalf of `owner`.
    fn map_shm(&self, owner: &Owner, target: &Path) -> Result<(Arc<GuardedMap>, (u64, u64)), Errno> {
        check_shm_path(target).map_err(|_| Errno::EINVAL)?;
        let fd = fskv_usrbio::sys::open_file(target).map_err(|e| {
            tracing::debug!(target = %target.display(), error = %e, "usrbio: cannot open the shm file");
            io_errno(&e)
        })?;
        let st = fstat(&fd).map_err(|e| io_errno(&e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EINVAL);
        }
        if !may_read_write(owner, &st) {
            return Err(Errno::EACCES);
        }
        let len = u64::try_from(st.st_size).unwrap_or(0);
        if len == 0 || len > self.cfg.max_iov_bytes {
            return Err(Errno::EINVAL);
        }
        let map = GuardedMap::map(&fd, len as usize).map_err(|e| io_errno(&e))?;
        Ok((map, (st.st_dev, st.st_ino)))
    }

    fn attach_ring(&self, owner: &Owner, rk: RingKey, map: &Arc<GuardedMap>) -> Result<(RingKey, Consumer), Errno> {
        let view = RingView::attach(map.mapping().clone()).map_err(|e| {
            tracing::debug!(tgid = owner.tgid, error = %e, "usrbio: not a ring");
            Errno::EINVAL
        })?;
        if map.poisoned() || rk.io_depth.unsigned_abs() > view.entries() {
            return Err(Errno::EINVAL);
        }
        Ok((rk, Consumer::new(view)))
    }

    /// `unlink(3fs-virt/iovs/name)`: deregisters (its owner, or root).
    pub fn unlink(&self, c: Caller, parent: u64, name: &OsStr) -> Result<(), Errno> {
        if parent != IOVS_DIR_INO {
            return Err(Errno::EPERM);
        }
        let name = name.to_str().ok_or(Errno::ENOENT)?;
        let mut reg = self.registry.lock();
        let ino = *reg.by_name.get(name).ok_or(Errno::ENOENT)?;
        let region = reg.regions.get(&ino).cloned().ok_or(Errno::ENOENT)?;
        if c.uid != 0 && c.uid != region.owner.uid {
            return Err(Errno::EPERM);
        }
        remove_region(&mut reg, &region);
        drop(reg);
        tracing::debug!(name, "usrbio: deregistered");
        Ok(())
    }

    /// `ioctl(IOC_REG_FD)` on open file `fh` of inode `ino`.
    pub fn register_file(self: &Arc<Self>, c: Caller, ino: u64, fh: u64) -> Result<RegFdReply, Errno> {
        let owner = self.owner_of(c)?;
        {
            let mut reg = self.registry.lock();
            let proc = reg.procs.entry(owner.tgid).or_default();
            proc.owner.get_or_insert(owner);
            proc.files.insert(fh);
        }
        self.watch(owner);
        Ok(RegFdReply { magic: HF3FS_SUPER_MAGIC, flags: 0, inode: ino, file: fh })
    }

    /// `ioctl(IOC_DEREG_FD)`.
    pub fn deregister_file(&self, c: Caller, fh: u64) {
        if let Some(tgid) = tgid_of(c.tid) {
            if let Some(p) = self.registry.lock().procs.get_mut(&tgid) {
                p.files.remove(&fh);
            }
        }
    }

    /// The kernel released `fh`: no process can use it any more.
    pub fn forget_file(&self, fh: u64) {
        for p in self.registry.lock().procs.values_mut() {
            p.files.remove(&fh);
        }
    }

    /// Whether process `tgid` registered file `fh`.
    pub(crate) fn file_registered(&self, tgid: i32, fh: u64) -> bool {
        self.registry.lock().procs.get(&tgid).is_some_and(|p| p.files.contains(&fh))
    }

    /// The iov with `id`, if `owner` may use it.
    pub(crate) fn iov(&self, id: &[u8; 16], owner: &Owner) -> Result<Arc<Region>, i32> {
        let reg = self.registry.lock();
        let r = reg.by_id.get(id).and_then(|ino| reg.regions.get(ino)).ok_or(libc::EACCES)?;
        if r.ring.is_some() || (owner.uid != 0 && r.owner.uid != owner.uid) {
            return Err(libc::EACCES);
        }
        Ok(r.clone())
    }

    /// The rings to look at, in dispatch order.
    pub(crate) fn rings(&self) -> Vec<Arc<RingEntry>> {
        self.registry.lock().rings.clone()
    }

    /// A ring broke the protocol: stop serving it (its link stays until the
    /// program removes it or dies).
    pub(crate) fn break_ring(&self, ring: &Arc<RingEntry>, why: &str) {
        tracing::warn!(ring = ring.ino, tgid = ring.owner.tgid, why, "usrbio: ring no longer served");
        ring.close();
        self.registry.lock().rings.retain(|r| !Arc::ptr_eq(r, ring));
    }

    pub(crate) fn files(&self) -> Option<Arc<crate::fs::Shared>> {
        self.files.upgrade()
    }

    pub(crate) fn config(&self) -> &UsrbioConfig {
        &self.cfg
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.rt
    }

    // ----- processes -----

    /// Starts watching `owner`'s process (once) to clean up when it exits.
    fn watch(self: &Arc<Self>, owner: Owner) {
        {
            let mut reg = self.registry.lock();
            let p = reg.procs.entry(owner.tgid).or_default();
            if p.watching {
                return;
            }
            p.watching = true;
        }
        let server = Arc::downgrade(self);
        let tgid = owner.tgid;
        self.rt.spawn(async move {
            wait_for_exit(tgid).await;
            if let Some(s) = server.upgrade() {
                s.process_exited(tgid).await;
            }
        });
    }

    /// Cleans up after process `tgid`: closes its rings, forgets its files,
    /// waits (bounded) for its batches, unmaps its regions and removes the
    /// /dev/shm files the C library made for it.
    async fn process_exited(&self, tgid: i32) {
        let (proc, regions) = {
            let mut reg = self.registry.lock();
            let Some(proc) = reg.procs.remove(&tgid) else { return };
            let regions: Vec<Arc<Region>> = proc.regions.iter().filter_map(|i| reg.regions.get(i).cloned()).collect();
            for r in &regions {
                remove_region(&mut reg, r);
            }
            (proc, regions)
        };
        let rings: Vec<Arc<RingEntry>> = regions.iter().filter_map(|r| r.ring.clone()).collect();
        let batches_in_flight: u32 = rings.iter().map(|r| r.running.load(Ordering::Acquire)).sum();
        let requests_in_flight: u32 = rings.iter().map(|r| r.consumer.lock().outstanding()).sum();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(PROCESS_EXIT_WAIT_MS);
        while rings.iter().any(|r| r.running.load(Ordering::Acquire) > 0) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut removed = 0;
        if let Some(owner) = proc.owner {
            for r in &regions {
                if remove_lib_file(&r.target, tgid, owner.uid, Some(r.file_id)) {
                    removed += 1;
                }
            }
            removed += sweep_lib_files(tgid, owner.uid);
        }
        let n = regions.len();
        drop(regions);
        drop(rings);
        tracing::info!(
            tgid,
            regions = n,
            files = proc.files.len(),
            batches_in_flight,
            requests_in_flight,
            shm_files_removed = removed,
            "usrbio: process exited; its requests finished, its memory unmapped"
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.bell_path);
    }
}

/// Bound on the wait for a dead process's batches before its regions are
/// dropped (they stay mapped until the last batch holding them ends anyway).
const PROCESS_EXIT_WAIT_MS: u64 = 30_000;

fn remove_region(reg: &mut Registry, region: &Arc<Region>) {
    reg.by_name.remove(&region.name);
    if reg.by_id.get(&region.key.id) == Some(&region.ino) {
        reg.by_id.remove(&region.key.id);
    }
    reg.regions.remove(&region.ino);
    if let Some(ring) = &region.ring {
        ring.close();
        reg.rings.retain(|r| !Arc::ptr_eq(r, ring));
    }
    if let Some(p) = reg.procs.get_mut(&region.owner.tgid) {
        p.regions.remove(&region.ino);
    }
}

/// Whether `owner` may read and write the file of `st` (root may).
fn may_read_write(owner: &Owner, st: &libc::stat) -> bool {
    if owner.uid == 0 {
        return true;
    }
    let mode = st.st_mode;
    if st.st_uid == owner.uid {
        mode & 0o600 == 0o600
    } else if st.st_gid == owner.gid {
        mode & 0o060 == 0o060
    } else {
        mode & 0o006 == 0o006
    }
}

/// Removes `path` if it is a /dev/shm file the C library made for process
/// `tgid` (its name), owned by `uid`, and (when known) still the same file.
fn remove_lib_file(path: &Path, tgid: i32, uid: u32, file_id: Option<(u64, u64)>) -> bool {
    let prefix = format!("{LIB_SHM_PREFIX}{tgid}.");
    let ours =
        path.parent() == Some(Path::new(proto::SHM_DIR)) && path.file_name().is_some_and(|n| n.as_bytes().starts_with(prefix.as_bytes()));
    if !ours {
        return false;
    }
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    use std::os::unix::fs::MetadataExt;
    if !meta.file_type().is_file() || meta.uid() != uid || file_id.is_some_and(|(d, i)| (meta.dev(), meta.ino()) != (d, i)) {
        return false;
    }
    std::fs::remove_file(path).is_ok()
}

/// Removes every `/dev/shm/fskv-usrbio.<tgid>.*` file of `uid` (a process
/// killed between creating a file and registering it leaves one).
fn sweep_lib_files(tgid: i32, uid: u32) -> usize {
    let prefix = format!("{LIB_SHM_PREFIX}{tgid}.");
    let Ok(dir) = std::fs::read_dir(proto::SHM_DIR) else { return 0 };
    dir.filter_map(Result::ok)
        .filter(|e| e.file_name().as_bytes().starts_with(prefix.as_bytes()))
        .filter(|e| remove_lib_file(&e.path(), tgid, uid, None))
        .count()
}

/// Removes doorbells of daemons that no longer run (killed without cleanup).
fn sweep_stale_doorbells() {
    let Ok(dir) = std::fs::read_dir(proto::SHM_DIR) else { return };
    for e in dir.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("fskv-usrbio-bell.")) else { continue };
        let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        // SAFETY: kill with signal 0 only checks for existence.
        let gone = unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Resolves when process `tgid` has exited (pidfd; polling `kill(pid, 0)`
/// where pidfds are unavailable).
async fn wait_for_exit(tgid: i32) {
    // SAFETY: pidfd_open takes a pid and flags; the returned fd is ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tgid, 0) };
    if fd >= 0 {
        // SAFETY: a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: `fd` is an open descriptor owned by the AsyncFd from here on.
        if let Ok(afd) = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
            let _ = afd.readable().await;
            return;
        }
    } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return;
    }
    loop {
        // SAFETY: signal 0 only checks for existence.
        if unsafe { libc::kill(tgid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The ring keys' priority, for logs.
pub fn priority_name(p: Priority) -> &'static str {
    match p {
        Priority::High => "high",
        Priority::Normal => "normal",
        Priority::Low => "low",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_permission_follows_the_mode_bits() {
        // SAFETY: an all-zero stat is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_uid = 1000;
        st.st_gid = 100;
        st.st_mode = libc::S_IFREG | 0o600;
        let me = Owner { tgid: 1, uid: 1000, gid: 100 };
        let other = Owner { tgid: 1, uid: 1001, gid: 100 };
        let stranger = Owner { tgid: 1, uid: 1002, gid: 200 };
        let root = Owner { tgid: 1, uid: 0, gid: 0 };
        assert!(may_read_write(&me, &st));
        assert!(!may_read_write(&other, &st));
        assert!(may_read_write(&root, &st));
        st.st_mode = libc::S_IFREG | 0o660;
        assert!(may_read_write(&other, &st));
        assert!(!may_read_write(&stranger, &st));
        st.st_mode = libc::S_IFREG | 0o666;
        assert!(may_read_write(&stranger, &st));
        st.st_mode = libc::S_IFREG | 0o400;
        assert!(!may_read_write(&me, &st), "read-only for its owner");
    }

    #[test]
    fn only_the_libraries_files_of_that_process_are_removed() {
        let me = unsafe { libc::getuid() };
        let tgid = 999_999;
        let ours = Path::new(proto::SHM_DIR).join(format!("{LIB_SHM_PREFIX}{tgid}.abc"));
        let other_pid = Path::new(proto::SHM_DIR).join(format!("{LIB_SHM_PREFIX}{}.abc", tgid + 1));
        let user_file = Path::new(proto::SHM_DIR).join(format!("psm_usrbio_test_{tgid}"));
        for p in [&ours, &other_pid, &user_file] {
            std::fs::write(p, b"x").expect("write /dev/shm");
        }
        assert!(!remove_lib_file(&user_file, tgid, me, None), "a file the library did not name");
        assert!(!remove_lib_file(&ours, tgid, me + 1, None), "another user's");
        assert!(!remove_lib_file(&ours, tgid, me, Some((0, 0))), "a different file by that name");
        assert_eq!(sweep_lib_files(tgid, me), 1);
        assert!(!ours.exists());
        assert!(other_pid.exists() && user_file.exists());
        let _ = std::fs::remove_file(other_pid);
        let _ = std::fs::remove_file(user_file);
    }

    #[test]
    fn the_tgid_of_a_thread_is_its_process() {
        let me = std::process::id() as i32;
        assert_eq!(tgid_of(me as u32), Some(me));
        // SAFETY: gettid has no preconditions.
        let tid = std::thread::spawn(|| unsafe { libc::gettid() }).join().expect("thread");
        assert!(tgid_of(tid as u32).is_none() || tgid_of(tid as u32) == Some(me), "an exited thread has no status, a live one is ours");
    }
}
