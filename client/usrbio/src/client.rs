//! The program's side, below both APIs (the C ABI and the safe Rust API):
//! finding a mount, shared-memory regions and their registration links,
//! rings, the doorbell, and the process's table of registered files.

use crate::proto::{self, IovKey, RegFdReply, RingKey, HF3FS_SUPER_MAGIC, IOVS_DIR, LIB_SHM_PREFIX, SHM_DIR, SUBMIT_LINK, VIRT_DIR};
use crate::ring::{doorbell, ring_doorbell, Producer, RingView};
use crate::sys::{create_file, fstat, open_file, random_id, Mapping};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// `<mount>/3fs-virt/iovs`.
pub fn iovs_dir(mount: &Path) -> PathBuf {
    mount.join(VIRT_DIR).join(IOVS_DIR)
}

/// The mount point of the fskv (or 3FS) mount holding `path`: the longest
/// mount point of `/proc/self/mountinfo` that is a prefix of the canonical
/// `path`, if it is an fskv mount (type `fuse` or `fuse.fskv` with source
/// `fskv`) or a 3FS one (`fuse.hf3fs`). With
/// `HF3FS_USRBIO_DONT_CHECKFS_FOR_MP=yes` any mount with a `3fs-virt`
/// directory qualifies.
pub fn extract_mount_point(path: &Path) -> io::Result<Option<PathBuf>> {
    let canonical = std::fs::canonicalize(path)?;
    let any_fs = std::env::var("HF3FS_USRBIO_DONT_CHECKFS_FOR_MP").is_ok_and(|v| v == "yes");
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    // The mount the path is on: the longest mount point that is its prefix.
    let mut best: Option<(PathBuf, bool)> = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        // ... mount_point(4) ... " - " fstype source options
        let Some(dash) = fields.iter().position(|f| *f == "-") else { continue };
        let (Some(mp), Some(fstype), Some(source)) = (fields.get(4), fields.get(dash + 1), fields.get(dash + 2)) else { continue };
        let mp = PathBuf::from(unescape_mountinfo(mp));
        if !canonical.starts_with(&mp) || best.as_ref().is_some_and(|(b, _)| mp.as_os_str().len() < b.as_os_str().len()) {
            continue;
        }
        // `fskv mount` shows as type "fuse" (or "fuse.fskv") with source "fskv"; 3FS as "fuse.hf3fs".
        let ours = matches!(*fstype, "fuse.fskv" | "fuse.hf3fs") || (fstype.starts_with("fuse") && *source == "fskv");
        best = Some((mp, ours));
    }
    Ok(match best {
        Some((mp, true)) => Some(mp),
        Some((mp, false)) if any_fs && mp.join(VIRT_DIR).exists() => Some(mp),
        _ => None,
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4]).ok().and_then(|o| u8::from_str_radix(o, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What this process holds per mount: the doorbell, mapped once.
pub struct MountHandle {
    mount: PathBuf,
    bell: Mapping,
}

impl MountHandle {
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// Wakes the daemon to look at the rings.
    pub fn ring_doorbell(&self) {
        // SAFETY: `bell` is at least a Doorbell long (checked when mapped) and
        // lives as long as `self`.
        if let Some(bell) = unsafe { doorbell(&self.bell) } {
            ring_doorbell(bell);
        }
    }

    /// Whether the daemon still serves the mount (a stat of its virtual
    /// directory; a dead FUSE daemon makes it fail with ENOTCONN).
    pub fn alive(&self) -> bool {
        std::fs::metadata(iovs_dir(&self.mount)).is_ok()
    }
}

/// The process's handle of `mount` (the doorbell is found through
/// `3fs-virt/iovs/submit-ios`; cached per mount point).
pub fn mount_handle(mount: &Path) -> io::Result<Arc<MountHandle>> {
    static MOUNTS: OnceLock<Mutex<HashMap<PathBuf, Arc<MountHandle>>>> = OnceLock::new();
    let mounts = MOUNTS.get_or_init(Default::default);
    if let Some(m) = mounts.lock().unwrap_or_else(|p| p.into_inner()).get(mount) {
        return Ok(m.clone());
    }
    let target = std::fs::read_link(iovs_dir(mount).join(SUBMIT_LINK))?;
    check_shm_path(&target)?;
    let fd = open_file(&target)?;
    let st = fstat(&fd)?;
    if (st.st_size as usize) < proto::DOORBELL_BYTES {
        return Err(errno(libc::EIO));
    }
    let bell = Mapping::map(&fd, proto::DOORBELL_BYTES)?;
    // SAFETY: the mapping is DOORBELL_BYTES long.
    if unsafe { doorbell(&bell) }.is_none() {
        return Err(errno(libc::EIO));
    }
    let handle = Arc::new(MountHandle { mount: mount.to_path_buf(), bell });
    mounts.lock().unwrap_or_else(|p| p.into_inner()).insert(mount.to_path_buf(), handle.clone());
    Ok(handle)
}

/// A path directly in /dev/shm (no subdirectories, no `..`).
pub fn check_shm_path(p: &Path) -> io::Result<()> {
    let ok =
        p.parent() == Some(Path::new(SHM_DIR)) && p.file_name().is_some_and(|n| n != "." && n != ".." && !n.is_empty()) && p.is_absolute();
    if ok {
        Ok(())
    } else {
        Err(errno(libc::EINVAL))
    }
}

/// The `/dev/shm` file this library creates for an iov or ring of this process.
pub fn lib_shm_path(id: &[u8; 16], ring: bool) -> PathBuf {
    let name = format!("{LIB_SHM_PREFIX}{}.{}{}", std::process::id(), proto::id_hex(id), if ring { ".ring" } else { "" });
    Path::new(SHM_DIR).join(name)
}

/// A shared-memory region of this process: mapped, maybe registered (a
/// link in the virtual directory) and maybe owning its file.
pub struct Region {
    pub map: Arc<Mapping>,
    pub id: [u8; 16],
    pub key: IovKey,
    /// The registration link, removed on drop.
    pub link: Option<PathBuf>,
    /// The file, removed on drop or by [`Region::unlink_file`].
    pub file: Option<PathBuf>,
}

impl Region {
    /// Creates a file of `size` bytes in /dev/shm, maps it and registers it
    /// under `key` (its id is filled in) in `mount`'s virtual directory.
    pub fn create(mount: &Path, size: usize, mut key: IovKey, ring: bool) -> io::Result<Region> {
        if size == 0 {
            return Err(errno(libc::EINVAL));
        }
        key.id = random_id()?;
        let path = lib_shm_path(&key.id, ring);
        let fd = create_file(&path, size)?;
        let map = match Mapping::map(&fd, size) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let mut region = Region { map, id: key.id, key, link: None, file: Some(path) };
        if ring {
            // Rings are registered by the caller once their header is written.
            return Ok(region);
        }
        region.register(mount)?;
        Ok(region)
    }

    /// Registers the region: a symlink named by its key to its file.
    pub fn register(&mut self, mount: &Path) -> io::Result<()> {
        let file = self.file.clone().ok_or_else(|| errno(libc::EINVAL))?;
        let link = iovs_dir(mount).join(self.key.to_string());
        std::os::unix::fs::symlink(&file, &link)?;
        self.link = Some(link);
        Ok(())
    }

    /// Maps an iov another process registered (`hf3fs_iovopen`): follows its
    /// link, which must point into /dev/shm. Owns neither link nor file.
    pub fn open(mount: &Path, id: &[u8; 16], block_size: u64, size: usize) -> io::Result<Region> {
        let key = IovKey { id: *id, block_size, ring: None };
        let target = std::fs::read_link(iovs_dir(mount).join(key.to_string()))?;
        check_shm_path(&target)?;
        let fd = open_file(&target)?;
        let st = fstat(&fd)?;
        let len = if size == 0 { st.st_size as usize } else { size };
        if len == 0 || len > st.st_size as usize {
            return Err(errno(libc::EINVAL));
        }
        Ok(Region { map: Arc::new(Mapping::map(&fd, len)?), id: *id, key, link: None, file: None })
    }

    /// Removes the file (the mapping stays; others can no longer open it).
    pub fn unlink_file(&mut self) {
        if let Some(f) = self.file.take() {
            let _ = std::fs::remove_file(f);
        }
    }

    /// Removes the registration link (the daemon forgets the region once
    /// its in-flight requests are done).
    pub fn unregister(&mut self) {
        if let Some(l) = self.link.take() {
            let _ = std::fs::remove_file(l);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.unregister();
        self.unlink_file();
    }
}

/// A ring of this process: its region, its producer end and its mount.
pub struct RingHandle {
    pub region: Region,
    pub producer: Producer,
    pub mount: Arc<MountHandle>,
    pub key: RingKey,
}

impl RingHandle {
    /// Creates a ring of `entries`, registers it (`.r<depth>` / `.w<depth>`
    /// link) and removes its file (nothing is left behind if the process dies).
    pub fn create(mount: &Path, entries: u32, key: RingKey) -> io::Result<RingHandle> {
        let layout = proto::RingLayout::new(entries).ok_or_else(|| errno(libc::EINVAL))?;
        if key.io_depth.unsigned_abs() > entries || key.flags & !proto::KNOWN_FLAGS != 0 {
            return Err(errno(libc::EINVAL));
        }
        let handle = mount_handle(mount)?;
        let mut region = Region::create(mount, layout.bytes, IovKey { id: [0; 16], block_size: 0, ring: Some(key) }, true)?;
        let view = RingView::init(region.map.clone(), entries).map_err(|_| errno(libc::EINVAL))?;
        region.register(mount)?;
        region.unlink_file();
        let mut producer = Producer::new(view);
        producer.set_spin(wait_spin());
        Ok(RingHandle { region, producer, mount: handle, key })
    }

    pub fn submit(&self) {
        self.mount.ring_doorbell();
    }

    /// [`Producer::wait`] with the daemon's liveness check; afterwards, if
    /// requests are still waiting to be taken, rings the doorbell (the
    /// daemon may have been waiting for room for their completions).
    pub fn wait(&self, out: &mut [proto::Cqe], min: usize, deadline: crate::ring::Deadline) -> io::Result<usize> {
        let mount = self.mount.clone();
        let r = self.producer.wait(out, min, deadline, &|| mount.alive());
        if self.producer.pending() > 0 {
            self.mount.ring_doorbell();
        }
        r
    }
}

/// How long a wait polls before sleeping: `HF3FS_USRBIO_SPIN_US`
/// (microseconds, at most 10 000), default [`DEFAULT_WAIT_SPIN_US`].
pub fn wait_spin() -> std::time::Duration {
    static SPIN: OnceLock<std::time::Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("HF3FS_USRBIO_SPIN_US").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(DEFAULT_WAIT_SPIN_US);
        std::time::Duration::from_micros(us.min(10_000))
    })
}

/// Default of [`wait_spin`].
pub const DEFAULT_WAIT_SPIN_US: u64 = 0;

/// A file registered with the daemon for this process.
#[derive(Debug)]
pub struct RegisteredFd {
    /// The descriptor registered.
    pub fd: RawFd,
    /// A duplicate kept open while registered (the registration outlives a
    /// close of `fd`, as in 3FS).
    pub dup: OwnedFd,
    /// The token requests name the file by.
    pub token: u64,
    pub inode: u64,
    /// `fcntl(F_GETFL)` of the descriptor.
    pub status_flags: i32,
}

impl RegisteredFd {
    pub fn readable(&self) -> bool {
        self.status_flags & libc::O_ACCMODE != libc::O_WRONLY
    }

    pub fn writable(&self) -> bool {
        self.status_flags & libc::O_ACCMODE != libc::O_RDONLY
    }
}

/// Asks the daemon to register `fd` (the `IOC_REG_FD` ioctl).
pub fn ioctl_register(fd: RawFd) -> io::Result<RegFdReply> {
    let mut reply = RegFdReply::default();
    // SAFETY: the kernel writes at most size_of::<RegFdReply>() bytes (the
    // size encoded in the command) into `reply`.
    let r = unsafe { libc::ioctl(fd, proto::IOC_REG_FD as _, &mut reply as *mut RegFdReply) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if reply.magic != HF3FS_SUPER_MAGIC {
        return Err(errno(libc::EBADF));
    }
    Ok(reply)
}

/// Tells the daemon the process no longer uses `fd` for USRBIO.
pub fn ioctl_deregister(fd: RawFd) {
    let mut magic = 0u32;
    // SAFETY: the kernel writes at most 4 bytes into `magic`.
    unsafe { libc::ioctl(fd, proto::IOC_DEREG_FD as _, &mut magic as *mut u32) };
}

/// Registers `fd` and duplicates it (the duplicate keeps the registration's
/// file open).
pub fn register_fd(fd: RawFd) -> io::Result<RegisteredFd> {
    let reply = ioctl_register(fd)?;
    // SAFETY: F_GETFL / F_DUPFD_CLOEXEC on a descriptor the caller passed;
    // the new descriptor is owned by nothing else.
    let (status_flags, dup) = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        let d = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
        if flags < 0 || d < 0 {
            return Err(io::Error::last_os_error());
        }
        (flags, OwnedFd::from_raw_fd(d))
    };
    Ok(RegisteredFd { fd, dup, token: reply.file, inode: reply.inode, status_flags })
}

/// The process's registered files, by descriptor and by its duplicate
/// (what `hf3fs_reg_fd` / `hf3fs_prep_io` use).
pub fn fd_table() -> &'static Mutex<HashMap<RawFd, Arc<RegisteredFd>>> {
    static FDS: OnceLock<Mutex<HashMap<RawFd, Arc<RegisteredFd>>>> = OnceLock::new();
    FDS.get_or_init(Default::default)
}

/// Whether `fd` is on an fskv mount (the daemon answers `IOC_GET_MAGIC`).
pub fn is_fskv(fd: RawFd) -> bool {
    let mut magic = 0u32;
    // SAFETY: the kernel writes at most 4 bytes (the size in the command) into `magic`.
    let r = unsafe { libc::ioctl(fd, proto::IOC_GET_MAGIC as _, &mut magic as *mut u32) };
    r == 0 && magic == HF3FS_SUPER_MAGIC
}

/// Raw fd of an owned descriptor (for logging and tables).
pub fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_paths_must_be_directly_in_dev_shm() {
        assert!(check_shm_path(Path::new("/dev/shm/x")).is_ok());
        for bad in ["/dev/shm", "/dev/shm/", "/dev/shm/a/b", "/tmp/x", "dev/shm/x", "/dev/shm/.."] {
            assert!(check_shm_path(Path::new(bad)).is_err(), "{bad}");
        }
        let p = lib_shm_path(&[1; 16], true);
        assert!(p.to_string_lossy().starts_with(&format!("/dev/shm/{LIB_SHM_PREFIX}{}.", std::process::id())));
        assert!(p.to_string_lossy().ends_with(".ring"));
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/x\"), r"/x\");
    }

    #[test]
    fn a_path_off_any_fskv_mount_has_no_mount_point() {
        std::env::remove_var("HF3FS_USRBIO_DONT_CHECKFS_FOR_MP");
        assert_eq!(extract_mount_point(Path::new("/")).expect("mountinfo"), None);
        assert!(extract_mount_point(Path::new("/no/such/path")).is_err());
    }
}
