//! A FUSE filesystem in memory that models **power loss**, for tests of
//! programs we do not control the I/O of (RocksDB under the KV engine).
//!
//! Mount it ([`mount`]), run the program on it, and at any instant take a
//! [`Mounted::power_cut`]: the image of what a disk would hold after the
//! power failed at that instant, written to a real directory where the
//! program can be reopened and checked. The running program does not
//! notice the cut (the image is a copy).
//!
//! | operation | durable (in every image after it returns) | until then, at a power cut |
//! |---|---|---|
//! | `write` to a file | once the file is `fsync`ed / `fdatasync`ed | each write since the file's last sync is, independently: lost (½), kept whole (⅜) or torn — only a prefix of whole 512-byte sectors kept (⅛) |
//! | `truncate` / `fallocate` that grows the size | as a write | lost or kept, as a write |
//! | create, `mkdir`, `unlink`, `rmdir`, `rename` (the entries of a directory) | once that directory is `fsync`ed | the directory's entries are those of its last `fsync` (all of its entries since then lost together) |
//!
//! This is the pessimistic POSIX model (ext4 and XFS persist more, e.g. a
//! file's own name when the file is fsynced): a program correct here does
//! not rely on a particular file system. Not modelled: `mmap` writes
//! (RocksDB's defaults do not use them), hard links (refused with `EPERM`),
//! extended attributes (`ENOSYS`), locks (the kernel keeps them locally),
//! permissions (the mount is the test process's own). A directory entry
//! whose directory is durable but whose file never was synced appears as
//! an empty file, as after a real crash.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const ROOT: u64 = 1;
const SECTOR_BYTES: usize = 512;
/// Attribute and entry cache time given to the kernel: every change goes
/// through this filesystem, so the kernel's caches never go stale.
const TTL: Duration = Duration::from_secs(1);
/// Deepest directory nesting an image copies (guards against a cycle that
/// durable entries of different ages could form).
const MAX_DEPTH: usize = 64;

/// One change to a file's bytes since its last sync, with what it replaced
/// (to undo it).
#[derive(Clone, Debug)]
enum Change {
    /// `bytes` written at `offset`; `old_len` the file length before,
    /// `old_bytes` what `[offset, min(offset + len, old_len))` held.
    Write { offset: usize, bytes: Vec<u8>, old_len: usize, old_bytes: Vec<u8> },
    /// Length set from `old_len` to `new_len` (truncate, ftruncate,
    /// fallocate); `lost_tail` the bytes a shrink cut off.
    Resize { old_len: usize, new_len: usize, lost_tail: Vec<u8> },
}

#[derive(Debug)]
enum Body {
    /// `data` is what reads see; undoing `unsynced` newest first gives the
    /// durable bytes.
    File {
        data: Vec<u8>,
        unsynced: Vec<Change>,
    },
    Dir {
        entries: BTreeMap<OsString, u64>,
        durable: BTreeMap<OsString, u64>,
        parent: u64,
    },
}

#[derive(Debug)]
struct Node {
    perm: u16,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    body: Body,
}

impl Node {
    fn kind(&self) -> FileType {
        match self.body {
            Body::File { .. } => FileType::RegularFile,
            Body::Dir { .. } => FileType::Directory,
        }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let (size, nlink) = match &self.body {
            Body::File { data, .. } => (data.len() as u64, 1),
            Body::Dir { entries, .. } => (entries.len() as u64, 2),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            crtime: self.mtime,
            kind: self.kind(),
            perm: self.perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

/// What a power cut did, for the test's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CutReport {
    pub files: usize,
    pub dirs: usize,
    /// Unsynced changes lost, kept whole and torn.
    pub changes_lost: usize,
    pub changes_kept: usize,
    pub changes_torn: usize,
    /// Directories whose entries differed from their last sync.
    pub dirs_rolled_back: usize,
}

#[derive(Debug)]
struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

impl State {
    fn new() -> State {
        let root = Node {
            perm: 0o755,
            uid: current_uid(),
            gid: current_gid(),
            mtime: SystemTime::now(),
            body: Body::Dir { entries: BTreeMap::new(), durable: BTreeMap::new(), parent: ROOT },
        };
        State { nodes: HashMap::from([(ROOT, root)]), next_ino: ROOT + 1 }
    }

    fn dir_entries(&self, ino: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::Dir { entries, .. }) => Ok(entries),
            Some(Body::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn dir_entries_mut(&mut self, ino: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.body) {
            Some(Body::Dir { entries, .. }) => Ok(entries),
            Some(Body::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn add(&mut self, parent: u64, name: &OsStr, perm: u16, req: &Request, body: Body) -> Result<FileAttr, Errno> {
        if self.dir_entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let node = Node { perm, uid: req.uid(), gid: req.gid(), mtime: SystemTime::now(), body };
        let attr = node.attr(ino);
        self.nodes.insert(ino, node);
        self.dir_entries_mut(parent)?.insert(name.to_os_string(), ino);
        Ok(attr)
    }

    fn file_mut(&mut self, ino: u64) -> Result<(&mut Vec<u8>, &mut Vec<Change>, &mut SystemTime), Errno> {
        let node = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        match &mut node.body {
            Body::File { data, unsynced } => Ok((data, unsynced, &mut node.mtime)),
            Body::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    /// Writes `bytes` at `offset` (growing the file) as an unsynced change.
    fn write_at(&mut self, ino: u64, offset: usize, bytes: &[u8]) -> Result<(), Errno> {
        let end = offset.checked_add(bytes.len()).ok_or(Errno::EFBIG)?;
        let (data, unsynced, mtime) = self.file_mut(ino)?;
        let old_len = data.len();
        let old_bytes = data.get(offset..end.min(old_len)).map(<[u8]>::to_vec).unwrap_or_default();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[offset..end].copy_from_slice(bytes);
        unsynced.push(Change::Write { offset, bytes: bytes.to_vec(), old_len, old_bytes });
        *mtime = SystemTime::now();
        Ok(())
    }

    /// Sets the file's length as an unsynced change.
    fn resize(&mut self, ino: u64, new_len: usize) -> Result<(), Errno> {
        let (data, unsynced, mtime) = self.file_mut(ino)?;
        let old_len = data.len();
        let lost_tail = data.get(new_len..).map(<[u8]>::to_vec).unwrap_or_default();
        data.resize(new_len, 0);
        unsynced.push(Change::Resize { old_len, new_len, lost_tail });
        *mtime = SystemTime::now();
        Ok(())
    }
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn current_gid() -> u32 {
    // SAFETY: getgid has no preconditions and cannot fail.
    unsafe { libc::getgid() }
}

/// The durable bytes of a file: `data` with every unsynced change undone,
/// newest first.
fn durable_bytes(data: &[u8], unsynced: &[Change]) -> Vec<u8> {
    let mut d = data.to_vec();
    for c in unsynced.iter().rev() {
        match c {
            Change::Write { offset, old_len, old_bytes, .. } => {
                d[*offset..*offset + old_bytes.len()].copy_from_slice(old_bytes);
                d.truncate(*old_len);
            }
            Change::Resize { old_len, lost_tail, .. } => {
                d.truncate(*old_len);
                d.extend_from_slice(lost_tail);
            }
        }
    }
    d
}

/// The bytes a disk may hold after a power cut: the durable bytes, then each
/// unsynced change lost, kept or torn (the table in the module doc).
fn cut_bytes(data: &[u8], unsynced: &[Change], rng: &mut StdRng, report: &mut CutReport) -> Vec<u8> {
    let mut d = durable_bytes(data, unsynced);
    for c in unsynced {
        let roll = rng.gen_range(0..8);
        if roll < 4 {
            report.changes_lost += 1;
            continue;
        }
        match c {
            Change::Resize { new_len, .. } => {
                d.resize(*new_len, 0);
                report.changes_kept += 1;
            }
            Change::Write { offset, bytes, .. } => {
                let keep = if roll == 7 {
                    report.changes_torn += 1;
                    rng.gen_range(0..=bytes.len() / SECTOR_BYTES) * SECTOR_BYTES
                } else {
                    report.changes_kept += 1;
                    bytes.len()
                };
                if keep > 0 {
                    if d.len() < offset + keep {
                        d.resize(offset + keep, 0);
                    }
                    d[*offset..offset + keep].copy_from_slice(&bytes[..keep]);
                }
            }
        }
    }
    d
}

/// An image entry: a directory's durable entries, or a file's bytes.
enum Image {
    Dir(Vec<(OsString, Image)>),
    File(Vec<u8>),
}

fn build_image(state: &State, ino: u64, depth: usize, rng: &mut StdRng, report: &mut CutReport) -> io::Result<Image> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("durable directory entries form a cycle or nest deeper than 64"));
    }
    let node = state.nodes.get(&ino).ok_or_else(|| io::Error::other(format!("durable entry names a missing inode {ino}")))?;
    match &node.body {
        Body::File { data, unsynced } => {
            report.files += 1;
            Ok(Image::File(cut_bytes(data, unsynced, rng, report)))
        }
        Body::Dir { entries, durable, .. } => {
            report.dirs += 1;
            if entries != durable {
                report.dirs_rolled_back += 1;
            }
            let mut out = Vec::with_capacity(durable.len());
            for (name, child) in durable {
                out.push((name.clone(), build_image(state, *child, depth + 1, rng, report)?));
            }
            Ok(Image::Dir(out))
        }
    }
}

fn write_image(image: &Image, path: &Path) -> io::Result<()> {
    match image {
        Image::File(bytes) => std::fs::write(path, bytes),
        Image::Dir(entries) => {
            std::fs::create_dir_all(path)?;
            for (name, child) in entries {
                write_image(child, &path.join(name))?;
            }
            Ok(())
        }
    }
}

struct PowerFs {
    state: Arc<Mutex<State>>,
}

impl PowerFs {
    fn entry(reply: ReplyEntry, r: Result<FileAttr, Errno>) {
        match r {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn attr(reply: ReplyAttr, r: Result<FileAttr, Errno>) {
        match r {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

fn usize_of(v: u64) -> Result<usize, Errno> {
    usize::try_from(v).map_err(|_| Errno::EFBIG)
}

impl Filesystem for PowerFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = self.state.lock();
        let r = s
            .dir_entries(parent.0)
            .and_then(|e| e.get(name).copied().ok_or(Errno::ENOENT))
            .and_then(|ino| s.nodes.get(&ino).map(|n| n.attr(ino)).ok_or(Errno::ENOENT));
        Self::entry(reply, r);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = self.state.lock();
        Self::attr(reply, s.nodes.get(&ino.0).map(|n| n.attr(ino.0)).ok_or(Errno::ENOENT));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.state.lock();
        let r = (|| {
            if let Some(size) = size {
                s.resize(ino.0, usize_of(size)?)?;
            }
            let node = s.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            if let Some(mode) = mode {
                node.perm = (mode & 0o7777) as u16;
            }
            if let Some(uid) = uid {
                node.uid = uid;
            }
            if let Some(gid) = gid {
                node.gid = gid;
            }
            Ok(node.attr(ino.0))
        })();
        Self::attr(reply, r);
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, _rdev: u32, reply: ReplyEntry) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let r = self.state.lock().add(parent.0, name, (mode & 0o7777) as u16, req, Body::File { data: Vec::new(), unsynced: Vec::new() });
        Self::entry(reply, r);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let body = Body::Dir { entries: BTreeMap::new(), durable: BTreeMap::new(), parent: parent.0 };
        let r = self.state.lock().add(parent.0, name, (mode & 0o7777) as u16, req, body);
        Self::entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state.lock();
        let r = (|| {
            let ino = *s.dir_entries(parent.0)?.get(name).ok_or(Errno::ENOENT)?;
            if matches!(s.nodes.get(&ino).map(|n| &n.body), Some(Body::Dir { .. })) {
                return Err(Errno::EISDIR);
            }
            // The node stays: a durable entry may still name it.
            s.dir_entries_mut(parent.0)?.remove(name);
            Ok(())
        })();
        Self::empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state.lock();
        let r = (|| {
            let ino = *s.dir_entries(parent.0)?.get(name).ok_or(Errno::ENOENT)?;
            if !s.dir_entries(ino)?.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
            s.dir_entries_mut(parent.0)?.remove(name);
            Ok(())
        })();
        Self::empty(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state.lock();
        let r = (|| {
            if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
                return Err(Errno::EINVAL);
            }
            let ino = *s.dir_entries(parent.0)?.get(name).ok_or(Errno::ENOENT)?;
            if let Some(&target) = s.dir_entries(newparent.0)?.get(newname) {
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                if target == ino {
                    return Ok(());
                }
                let src_is_dir = matches!(s.nodes.get(&ino).map(|n| &n.body), Some(Body::Dir { .. }));
                match s.nodes.get(&target).map(|n| &n.body) {
                    Some(Body::Dir { entries, .. }) if !src_is_dir => {
                        return Err(if entries.is_empty() { Errno::EISDIR } else { Errno::ENOTEMPTY })
                    }
                    Some(Body::Dir { entries, .. }) if !entries.is_empty() => return Err(Errno::ENOTEMPTY),
                    Some(Body::File { .. }) if src_is_dir => return Err(Errno::ENOTDIR),
                    _ => {}
                }
            }
            s.dir_entries_mut(parent.0)?.remove(name);
            s.dir_entries_mut(newparent.0)?.insert(newname.to_os_string(), ino);
            if let Some(Node { body: Body::Dir { parent: p, .. }, .. }) = s.nodes.get_mut(&ino) {
                *p = newparent.0;
            }
            Ok(())
        })();
        Self::empty(reply, r);
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let s = self.state.lock();
        match s.nodes.get(&ino.0).map(|n| &n.body) {
            Some(Body::File { data, .. }) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
                let end = start.saturating_add(size as usize).min(data.len());
                reply.data(&data[start..end]);
            }
            Some(Body::Dir { .. }) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.state.lock();
        let r = usize_of(offset).and_then(|off| s.write_at(ino.0, off, data));
        match r {
            Ok(_) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: fuser::LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let mut s = self.state.lock();
        let r = match s.nodes.get_mut(&ino.0).map(|n| &mut n.body) {
            Some(Body::File { unsynced, .. }) => {
                unsynced.clear();
                Ok(())
            }
            // fsync(2) of a directory may come as FSYNC on some kernels.
            Some(Body::Dir { entries, durable, .. }) => {
                *durable = entries.clone();
                Ok(())
            }
            None => Err(Errno::ENOENT),
        };
        Self::empty(reply, r);
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let s = self.state.lock();
        let (entries, parent) = match s.nodes.get(&ino.0).map(|n| &n.body) {
            Some(Body::Dir { entries, parent, .. }) => (entries, *parent),
            Some(Body::File { .. }) => return reply.error(Errno::ENOTDIR),
            None => return reply.error(Errno::ENOENT),
        };
        let mut all: Vec<(u64, FileType, OsString)> =
            vec![(ino.0, FileType::Directory, ".".into()), (parent, FileType::Directory, "..".into())];
        for (name, child) in entries {
            let kind = s.nodes.get(child).map_or(FileType::RegularFile, Node::kind);
            all.push((*child, kind, name.clone()));
        }
        for (i, (child, kind, name)) in all.iter().enumerate().skip(usize::try_from(offset).unwrap_or(usize::MAX)) {
            if reply.add(INodeNo(*child), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let mut s = self.state.lock();
        let r = match s.nodes.get_mut(&ino.0).map(|n| &mut n.body) {
            Some(Body::Dir { entries, durable, .. }) => {
                *durable = entries.clone();
                Ok(())
            }
            Some(Body::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        };
        Self::empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room: space is not what these tests are about.
        reply.statfs(1 << 30, 1 << 30, 1 << 30, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, _flags: i32, reply: ReplyCreate) {
        let r = self.state.lock().add(parent.0, name, (mode & 0o7777) as u16, req, Body::File { data: Vec::new(), unsynced: Vec::new() });
        match r {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mut s = self.state.lock();
        let r = (|| {
            if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
                return Ok(());
            }
            let end = usize_of(offset.checked_add(length).ok_or(Errno::EFBIG)?)?;
            let len = match s.nodes.get(&ino.0).map(|n| &n.body) {
                Some(Body::File { data, .. }) => data.len(),
                Some(Body::Dir { .. }) => return Err(Errno::EISDIR),
                None => return Err(Errno::ENOENT),
            };
            if end > len {
                s.resize(ino.0, end)?;
            }
            Ok(())
        })();
        Self::empty(reply, r);
    }
}

/// A mounted power-loss filesystem; unmounted on drop.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    state: Arc<Mutex<State>>,
    mountpoint: PathBuf,
}

/// Mounts an empty power-loss filesystem at `mountpoint` (an existing empty
/// directory). Needs `/dev/fuse` and the right to mount (root here).
pub fn mount(mountpoint: &Path) -> io::Result<Mounted> {
    let state = Arc::new(Mutex::new(State::new()));
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("fskv-powerfs".into())];
    config.n_threads = Some(2);
    let session = fuser::Session::new(PowerFs { state: state.clone() }, mountpoint, &config)?.spawn()?;
    Ok(Mounted { session: Some(session), state, mountpoint: mountpoint.to_path_buf() })
}

impl Mounted {
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The disk after a power cut now: writes the image to `image` (created;
    /// must not exist) and says what was lost. `seed` picks, for each change
    /// since its file's last sync, whether it was lost, kept or torn; the
    /// same state and seed give the same image.
    pub fn power_cut(&self, seed: u64, image: &Path) -> io::Result<CutReport> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut report = CutReport::default();
        // One consistent instant: nothing changes while the image is taken.
        let tree = {
            let state = self.state.lock();
            build_image(&state, ROOT, 0, &mut rng, &mut report)?
        };
        if image.exists() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists", image.display())));
        }
        write_image(&tree, image)?;
        Ok(report)
    }

    /// Unmounts (waits for the session to end).
    pub fn unmount(mut self) -> io::Result<()> {
        match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(state: &mut State, ino: u64, offset: usize, bytes: &[u8]) {
        state.write_at(ino, offset, bytes).unwrap();
    }

    fn file(state: &mut State) -> u64 {
        let ino = state.next_ino;
        state.next_ino += 1;
        state.nodes.insert(
            ino,
            Node { perm: 0o644, uid: 0, gid: 0, mtime: SystemTime::now(), body: Body::File { data: vec![], unsynced: vec![] } },
        );
        ino
    }

    fn parts(state: &State, ino: u64) -> (Vec<u8>, Vec<Change>) {
        match &state.nodes[&ino].body {
            Body::File { data, unsynced } => (data.clone(), unsynced.clone()),
            Body::Dir { .. } => unreachable!(),
        }
    }

    fn sync(state: &mut State, ino: u64) {
        if let Body::File { unsynced, .. } = &mut state.nodes.get_mut(&ino).unwrap().body {
            unsynced.clear();
        }
    }

    #[test]
    fn durable_bytes_undo_every_unsynced_change() {
        let mut s = State::new();
        let f = file(&mut s);
        change(&mut s, f, 0, b"hello world");
        sync(&mut s, f);
        change(&mut s, f, 6, b"WORLD and more");
        s.resize(f, 4).unwrap(); // shrink
        change(&mut s, f, 8, b"xy"); // a hole then bytes
        s.resize(f, 20).unwrap(); // grow
        let (data, unsynced) = parts(&s, f);
        assert_eq!(data.len(), 20);
        assert_eq!(durable_bytes(&data, &unsynced), b"hello world");
    }

    #[test]
    fn a_cut_keeps_synced_bytes_and_a_subset_of_the_rest_whole_or_torn() {
        for seed in 0..200u64 {
            let mut s = State::new();
            let f = file(&mut s);
            change(&mut s, f, 0, &[1u8; 4096]);
            sync(&mut s, f);
            change(&mut s, f, 4096, &[2u8; 4096]);
            change(&mut s, f, 8192, &[3u8; 1024]);
            let (data, unsynced) = parts(&s, f);
            let mut report = CutReport::default();
            let cut = cut_bytes(&data, &unsynced, &mut StdRng::seed_from_u64(seed), &mut report);
            assert_eq!(&cut[..4096], &[1u8; 4096][..], "seed {seed}: synced bytes lost");
            assert_eq!(report.changes_lost + report.changes_kept + report.changes_torn, 2);
            // Whatever follows is a sector-aligned prefix of each write, or zeros of a hole.
            assert!(cut.len() <= 9216 && (cut.len() - 4096).is_multiple_of(512), "seed {seed}: length {}", cut.len());
            for (i, b) in cut.iter().enumerate().skip(4096) {
                let want = if i < 8192 { 2 } else { 3 };
                assert!(*b == want || *b == 0, "seed {seed}: byte {i} is {b}");
            }
        }
    }

    #[test]
    fn directory_entries_are_durable_only_after_the_directory_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State::new();
        let f = file(&mut s);
        let g = file(&mut s);
        change(&mut s, f, 0, b"kept");
        sync(&mut s, f);
        change(&mut s, g, 0, b"never synced");
        s.dir_entries_mut(ROOT).unwrap().insert("f".into(), f);
        if let Body::Dir { entries, durable, .. } = &mut s.nodes.get_mut(&ROOT).unwrap().body {
            *durable = entries.clone();
        }
        s.dir_entries_mut(ROOT).unwrap().insert("g".into(), g);
        s.dir_entries_mut(ROOT).unwrap().remove(OsStr::new("f"));
        let mut report = CutReport::default();
        let image = build_image(&s, ROOT, 0, &mut StdRng::seed_from_u64(1), &mut report).unwrap();
        write_image(&image, &dir.path().join("img")).unwrap();
        assert_eq!(std::fs::read(dir.path().join("img/f")).unwrap(), b"kept");
        assert!(!dir.path().join("img/g").exists());
        assert_eq!(report.dirs_rolled_back, 1);
    }
}
