//! The safe Rust API: owned iovs, buffers and rings; blocking waits.
//!
//! ```no_run
//! use fskv_usrbio::{File, Iov, Ring, RingOptions};
//! # fn main() -> Result<(), fskv_usrbio::UsrbioError> {
//! let mount = std::path::Path::new("/mnt/fskv");
//! let iov = Iov::create(mount, 64 << 20)?;
//! let ring = Ring::create(mount, RingOptions::reads(128))?;
//! let f = std::fs::File::open(mount.join("data.bin")).map_err(fskv_usrbio::UsrbioError::Io)?;
//! let file = File::register(&f)?;
//! for i in 0..16u64 {
//!     let buf = iov.buf(i as usize * 4096, 4096)?;
//!     ring.prepare(buf, &file, i * 4096, i).map_err(|(e, _)| e)?;
//! }
//! ring.submit();
//! for c in ring.wait(16, None)? {
//!     let n = c.result?;            // bytes read (or the errno as io::Error)
//!     let _data = &c.buf[..n];      // the buffer comes back with its completion
//! }
//! # Ok(()) }
//! ```
//!
//! Buffers are leases of disjoint ranges of an iov ([`Iov::buf`]); a buffer
//! given to [`Ring::prepare`] belongs to the ring until its completion hands
//! it back, so no Rust reference aliases memory the daemon is writing.
//! Dropping a ring waits for its requests in flight (or the daemon's end).

use crate::client::{extract_mount_point, mount_handle, register_fd, Region, RegisteredFd, RingHandle};
use crate::proto::{IovKey, Priority, RingKey, SqeArgs, KNOWN_FLAGS};
use crate::ring::{Deadline, Full};
use crate::sys::{realtime_now, Mapping};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every error of the Rust API.
#[derive(Debug, thiserror::Error)]
pub enum UsrbioError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("buffer [{offset}, {offset}+{len}) is outside the iov of {size} bytes")]
    OutOfRange { offset: usize, len: usize, size: usize },
    #[error("buffer [{offset}, {offset}+{len}) overlaps a buffer in use")]
    Overlap { offset: usize, len: usize },
    #[error("the ring is full ({entries} entries in use)")]
    RingFull { entries: u32 },
    #[error("the ring is for {ring}, the request for {request}")]
    WrongDirection { ring: &'static str, request: &'static str },
    #[error("the file is not open for {0}")]
    FileMode(&'static str),
    #[error("{path} is not on an fskv mount")]
    NotOnMount { path: String },
    #[error("invalid argument: {0}")]
    Invalid(String),
}

type Result<T, E = UsrbioError> = std::result::Result<T, E>;

struct IovInner {
    region: Region,
    /// Leased ranges `(start, end)`.
    leases: Mutex<Vec<(usize, usize)>>,
}

/// A shared-memory buffer region registered with the daemon; unregistered,
/// unmapped and its file removed when the last [`Iov`] and [`IoBuf`] go.
#[derive(Clone)]
pub struct Iov {
    inner: Arc<IovInner>,
}

impl Iov {
    /// Creates an iov of `size` bytes for the mount at `mount`.
    pub fn create(mount: impl AsRef<Path>, size: usize) -> Result<Iov> {
        Iov::create_with_block_size(mount, size, 0)
    }

    /// As [`Iov::create`], with 3FS's block size hint (kept in the name).
    pub fn create_with_block_size(mount: impl AsRef<Path>, size: usize, block_size: u64) -> Result<Iov> {
        let key = IovKey { id: [0; 16], block_size, ring: None };
        let region = Region::create(mount.as_ref(), size, key, false)?;
        Ok(Iov { inner: Arc::new(IovInner { region, leases: Mutex::new(Vec::new()) }) })
    }

    pub fn len(&self) -> usize {
        self.inner.region.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn id(&self) -> [u8; 16] {
        self.inner.region.id
    }

    /// An exclusive lease of `[offset, offset + len)`.
    pub fn buf(&self, offset: usize, len: usize) -> Result<IoBuf> {
        let size = self.len();
        let end = offset.checked_add(len).filter(|&e| e <= size && len > 0).ok_or(UsrbioError::OutOfRange { offset, len, size })?;
        let mut leases = self.inner.leases.lock().unwrap_or_else(|p| p.into_inner());
        if leases.iter().any(|&(s, e)| offset < e && s < end) {
            return Err(UsrbioError::Overlap { offset, len });
        }
        leases.push((offset, end));
        Ok(IoBuf { iov: self.inner.clone(), offset, len })
    }
}

/// A lease of a range of an [`Iov`]: dereferences to its bytes.
pub struct IoBuf {
    iov: Arc<IovInner>,
    offset: usize,
    len: usize,
}

impl IoBuf {
    /// Offset in its iov.
    pub fn offset(&self) -> usize {
        self.offset
    }

    fn map(&self) -> &Mapping {
        &self.iov.region.map
    }
}

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the range lies inside the mapping (checked by `Iov::buf`);
        // the lease is exclusive and the daemon only touches it while the
        // ring owns this buffer.
        unsafe { std::slice::from_raw_parts(self.map().as_ptr().add(self.offset), self.len) }
    }
}

impl std::ops::DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.map().as_ptr().add(self.offset), self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        let mut leases = self.iov.leases.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = leases.iter().position(|&(s, _)| s == self.offset) {
            leases.swap_remove(i);
        }
    }
}

/// A file registered for USRBIO (keeps a duplicate of its descriptor open).
pub struct File {
    reg: RegisteredFd,
}

impl File {
    /// Registers an open file of an fskv mount.
    pub fn register(fd: &impl AsFd) -> Result<File> {
        let raw = fd.as_fd().as_raw_fd();
        let reg = register_fd(raw).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTTY) | Some(libc::EBADF) | Some(libc::ENOSYS) => UsrbioError::NotOnMount { path: format!("fd {raw}") },
            _ => UsrbioError::Io(e),
        })?;
        Ok(File { reg })
    }

    pub fn inode(&self) -> u64 {
        self.reg.inode
    }
}

impl Drop for File {
    fn drop(&mut self) {
        crate::client::ioctl_deregister(self.reg.dup.as_raw_fd());
    }
}

/// How to create a ring.
#[derive(Clone, Copy, Debug)]
pub struct RingOptions {
    pub entries: u32,
    pub for_read: bool,
    /// `> 0` exact batches, `0` whatever is ready, `< 0` up to `|io_depth|`
    /// waiting at most `timeout_ms` for a batch to fill.
    pub io_depth: i32,
    pub priority: Priority,
    pub timeout_ms: u32,
    /// `proto::FLAG_ALLOW_READ_UNCOMMITTED` | `proto::FLAG_FORBID_READ_HOLES`.
    pub flags: u64,
}

impl RingOptions {
    /// A read ring of `entries`, `io_depth` 0.
    pub fn reads(entries: u32) -> RingOptions {
        RingOptions { entries, for_read: true, io_depth: 0, priority: Priority::Normal, timeout_ms: 0, flags: 0 }
    }

    /// A write ring of `entries`, `io_depth` 0.
    pub fn writes(entries: u32) -> RingOptions {
        RingOptions { for_read: false, ..RingOptions::reads(entries) }
    }
}

/// One finished request.
pub struct Completion {
    /// The buffer, back from the ring.
    pub buf: IoBuf,
    /// Bytes transferred, or the error.
    pub result: io::Result<usize>,
    pub userdata: u64,
    /// The request's slot in the ring.
    pub index: u32,
}

struct Inflight {
    buf: IoBuf,
}

/// An I/O ring registered with the daemon.
pub struct Ring {
    handle: RingHandle,
    inflight: Mutex<HashMap<u32, Inflight>>,
}

/// Bound on [`Ring`]'s drop waiting for requests in flight.
const DROP_WAIT_MS: u64 = 60_000;

impl Ring {
    pub fn create(mount: impl AsRef<Path>, opts: RingOptions) -> Result<Ring> {
        if opts.flags & !KNOWN_FLAGS != 0 {
            return Err(UsrbioError::Invalid(format!("unknown flags {:#x}", opts.flags)));
        }
        let key = RingKey {
            for_read: opts.for_read,
            io_depth: opts.io_depth,
            priority: opts.priority,
            timeout_ms: opts.timeout_ms,
            flags: opts.flags,
        };
        let handle = RingHandle::create(mount.as_ref(), opts.entries, key)?;
        Ok(Ring { handle, inflight: Mutex::new(HashMap::new()) })
    }

    pub fn entries(&self) -> u32 {
        self.handle.producer.entries()
    }

    pub fn for_read(&self) -> bool {
        self.handle.key.for_read
    }

    /// Queues the transfer of `buf` (its whole length) at `offset` of
    /// `file`: a read into it or a write from it, as the ring is for. On
    /// error the buffer comes back with it.
    pub fn prepare(&self, buf: IoBuf, file: &File, offset: u64, userdata: u64) -> Result<u32, (UsrbioError, IoBuf)> {
        let read = self.for_read();
        if read && !file.reg.readable() {
            return Err((UsrbioError::FileMode("reading"), buf));
        }
        if !read && !file.reg.writable() {
            return Err((UsrbioError::FileMode("writing"), buf));
        }
        let args = SqeArgs {
            iov_id: buf.iov.region.id,
            iov_offset: buf.offset as u64,
            file: file.reg.token,
            file_offset: offset,
            len: buf.len as u64,
            userdata,
            reserved: 0,
        };
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        match self.handle.producer.prep(args) {
            Ok(slot) => {
                inflight.insert(slot, Inflight { buf });
                Ok(slot)
            }
            Err(Full) => Err((UsrbioError::RingFull { entries: self.entries() }, buf)),
        }
    }

    /// Tells the daemon requests are ready.
    pub fn submit(&self) {
        self.handle.submit();
    }

    /// Waits for at least `min` completions (all that are ready, up to the
    /// ring's entries), at most `timeout` (none: no limit). Returns fewer
    /// than `min` only when the timeout passed.
    pub fn wait(&self, min: usize, timeout: Option<Duration>) -> Result<Vec<Completion>> {
        let deadline = match timeout {
            None => Deadline::Never,
            Some(t) => {
                let now = realtime_now();
                let nsec = now.tv_nsec as u64 + u64::from(t.subsec_nanos());
                Deadline::Realtime(libc::timespec {
                    tv_sec: now.tv_sec + t.as_secs() as libc::time_t + (nsec / 1_000_000_000) as libc::time_t,
                    tv_nsec: (nsec % 1_000_000_000) as libc::c_long,
                })
            }
        };
        let mut cqes = vec![crate::proto::Cqe::default(); self.entries() as usize];
        let n = self.handle.wait(&mut cqes, min, deadline)?;
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(n);
        for c in &cqes[..n] {
            let index = c.index as u32;
            let Some(f) = inflight.remove(&index) else { continue };
            let result = if c.result >= 0 { Ok(c.result as usize) } else { Err(io::Error::from_raw_os_error((-c.result) as i32)) };
            out.push(Completion { buf: f.buf, result, userdata: c.userdata, index });
        }
        Ok(out)
    }

    /// Requests prepared and not yet taken by the daemon.
    pub fn pending(&self) -> u32 {
        self.handle.producer.pending()
    }

    /// Completions posted by the daemon and not yet collected by `wait`.
    pub fn completions_ready(&self) -> u32 {
        self.handle.producer.ready()
    }

    /// Requests prepared and not yet completed-and-consumed.
    pub fn in_flight(&self) -> usize {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The daemon may still be writing into buffers of requests in
        // flight: wait for them before their leases end.
        let start = std::time::Instant::now();
        while self.in_flight() > 0 && start.elapsed() < Duration::from_millis(DROP_WAIT_MS) {
            self.submit();
            if self.wait(1, Some(Duration::from_millis(100))).is_err() {
                break;
            }
        }
    }
}

/// The mount point holding `path`, if it is on an fskv mount.
pub fn mount_point_of(path: impl AsRef<Path>) -> Result<std::path::PathBuf> {
    let p = path.as_ref();
    extract_mount_point(p)?.ok_or_else(|| UsrbioError::NotOnMount { path: p.display().to_string() })
}

/// Whether the daemon of `mount` serves USRBIO (its doorbell can be mapped).
pub fn available(mount: impl AsRef<Path>) -> bool {
    mount_handle(mount.as_ref()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_exclusive_and_bounded() {
        // An iov without a mount: a region made by hand.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("iov");
        let fd = crate::sys::create_file(&path, 8192).expect("create");
        let map = Arc::new(Mapping::map(&fd, 8192).expect("map"));
        let region = Region { map, id: [7; 16], key: IovKey { id: [7; 16], block_size: 0, ring: None }, link: None, file: Some(path) };
        let iov = Iov { inner: Arc::new(IovInner { region, leases: Mutex::new(Vec::new()) }) };
        let mut a = iov.buf(0, 4096).expect("a");
        assert!(matches!(iov.buf(4000, 200), Err(UsrbioError::Overlap { .. })));
        assert!(matches!(iov.buf(8000, 200), Err(UsrbioError::OutOfRange { .. })));
        assert!(matches!(iov.buf(0, 0), Err(UsrbioError::OutOfRange { .. })));
        let b = iov.buf(4096, 4096).expect("b");
        a[..3].copy_from_slice(b"abc");
        assert_eq!(&a[..3], b"abc");
        assert_eq!(b.len(), 4096);
        drop(a);
        let c = iov.buf(100, 10).expect("the range is free again");
        assert_eq!(c.offset(), 100);
        assert!(!iov.is_empty());
    }
}
