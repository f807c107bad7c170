//! Thin, safe wrappers over the system calls both sides need: futexes on
//! shared memory (never `FUTEX_PRIVATE_FLAG`: the other side is another
//! process) and shared mappings of files.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

const FUTEX_WAIT: libc::c_int = 0;
const FUTEX_WAKE: libc::c_int = 1;
const FUTEX_WAIT_BITSET: libc::c_int = 9;
const FUTEX_CLOCK_REALTIME: libc::c_int = 256;
const FUTEX_BITSET_MATCH_ANY: u32 = u32::MAX;

/// Sleeps while `*word == expected`, at most `timeout` (none: until woken).
/// Returns early on a wake-up, a signal or a changed value; callers re-check.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout
        .map(|d| libc::timespec { tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; the
    // kernel only reads it and the timespec.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), FUTEX_WAIT, expected, tsp, std::ptr::null::<u32>(), 0u32);
    }
}

/// Like [`futex_wait`] with an absolute `CLOCK_REALTIME` deadline (the C
/// API's `abs_timeout`). Returns whether the deadline has passed.
pub fn futex_wait_until_realtime(word: &AtomicU32, expected: u32, deadline: &libc::timespec) -> bool {
    // SAFETY: as in `futex_wait`; the timespec outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            FUTEX_WAIT_BITSET | FUTEX_CLOCK_REALTIME,
            expected,
            deadline as *const libc::timespec,
            std::ptr::null::<u32>(),
            FUTEX_BITSET_MATCH_ANY,
        )
    };
    r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

/// Wakes up to `n` sleepers on `word`.
pub fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE does not dereference
    // anything else.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), FUTEX_WAKE, n, std::ptr::null::<libc::timespec>(), std::ptr::null::<u32>(), 0u32);
    }
}

/// The current `CLOCK_REALTIME`.
pub fn realtime_now() -> libc::timespec {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts
}

/// `a < b` for timespecs.
pub fn timespec_before(a: &libc::timespec, b: &libc::timespec) -> bool {
    (a.tv_sec, a.tv_nsec) < (b.tv_sec, b.tv_nsec)
}

/// 16 random bytes (an iov id).
pub fn random_id() -> io::Result<[u8; 16]> {
    let mut id = [0u8; 16];
    let mut filled = 0;
    while filled < id.len() {
        // SAFETY: writes at most `len - filled` bytes into `id[filled..]`.
        let n = unsafe { libc::getrandom(id[filled..].as_mut_ptr().cast(), id.len() - filled, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(id)
}

pub fn cstring(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A shared, read-write mapping of a whole file; unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with another process; every
// access goes through raw pointers or atomics, and the region stays mapped
// until drop.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from offset 0, shared, read-write.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: a fresh mapping chosen by the kernel; no existing memory is touched.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(Mapping { ptr, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region mapped in `map`; no reference into
        // it outlives `self` (borrows are tied to `&self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Creates a new file (`O_EXCL`, mode 0600) of `len` bytes.
pub fn create_file(path: &Path, len: usize) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on an fd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: removes the file we just created.
        unsafe { libc::unlink(c.as_ptr()) };
        return Err(e);
    }
    Ok(fd)
}

/// Opens an existing file read-write, not following a final symlink.
pub fn open_file(path: &Path) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstat` of an open file.
pub fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn futex_wakes_a_sleeper_and_times_out() {
        let word = Arc::new(AtomicU32::new(0));
        let w = word.clone();
        let t = std::thread::spawn(move || {
            while w.load(Ordering::Acquire) == 0 {
                futex_wait(&w, 0, Some(Duration::from_secs(5)));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        word.store(1, Ordering::Release);
        futex_wake(&word, 1);
        t.join().expect("sleeper");
        let start = std::time::Instant::now();
        futex_wait(&word, 1, Some(Duration::from_millis(30)));
        assert!(start.elapsed() >= Duration::from_millis(25));
        let mut deadline = realtime_now();
        deadline.tv_nsec += 20_000_000;
        if deadline.tv_nsec >= 1_000_000_000 {
            deadline.tv_sec += 1;
            deadline.tv_nsec -= 1_000_000_000;
        }
        assert!(futex_wait_until_realtime(&word, 1, &deadline), "the absolute deadline passes");
        assert!(!futex_wait_until_realtime(&word, 7, &deadline), "a changed value returns at once");
    }

    #[test]
    fn mapping_of_a_created_file_is_shared() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("m");
        let fd = create_file(&p, 8192).expect("create");
        assert!(create_file(&p, 8192).is_err(), "O_EXCL");
        let a = Mapping::map(&fd, 8192).expect("map a");
        let b = Mapping::map(&open_file(&p).expect("open"), 8192).expect("map b");
        // SAFETY: both mappings are 8192 bytes long.
        unsafe {
            *a.as_ptr().add(4000) = 42;
            assert_eq!(*b.as_ptr().add(4000), 42);
        }
        assert_eq!(fstat(&fd).expect("fstat").st_size, 8192);
        assert_ne!(random_id().expect("id"), random_id().expect("id"));
    }
}
