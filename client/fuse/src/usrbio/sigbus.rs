//! Program memory the daemon maps must not be able to kill it.
//!
//! A program can shrink the file behind an iov or ring (`ftruncate`) while
//! the daemon has it mapped; touching the lost pages raises SIGBUS, which
//! would end the whole mount. Every such mapping is entered in a fixed
//! table; the SIGBUS handler looks the faulting address up there and, if it
//! lies in one, maps anonymous zero pages over that whole region (the
//! faulting access then completes against them) and marks it poisoned.
//! Requests that used a poisoned region complete with `-EFAULT`, and the
//! region is no longer served. A fault anywhere else goes to the handler
//! that was installed before (or the default action: the process dies as
//! it would have).
//!
//! | table slot `start` | meaning |
//! |---|---|
//! | 0 | free |
//! | 1 | being claimed (length not yet visible) |
//! | any other | guarded region `[start, start + len)` |

use fskv_usrbio::sys::Mapping;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Most regions guarded at once (iovs + rings of every program).
pub const MAX_GUARDED_REGIONS: usize = 4096;

struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot { start: AtomicUsize::new(0), len: AtomicUsize::new(0), hit: AtomicBool::new(false) };
static SLOTS: [Slot; MAX_GUARDED_REGIONS] = [FREE; MAX_GUARDED_REGIONS];
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in SLOTS.iter() {
        let start = slot.start.load(Ordering::Acquire);
        if start <= 1 {
            continue;
        }
        let len = slot.len.load(Ordering::Acquire);
        if addr >= start && addr < start.saturating_add(len) {
            // SAFETY: replaces exactly the guarded region (which this process
            // mapped and still owns) with fresh anonymous pages; mmap is
            // async-signal-safe.
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                slot.hit.store(true, Ordering::Release);
                return;
            }
        }
    }
    // Not ours: what would have happened without us.
    match PREVIOUS.get() {
        Some(prev) if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN => {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO,
                // so it has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain handler takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: restoring the default action; the faulting access runs
            // again on return and the kernel applies it.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        }
    }
}

fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: plain sigaction calls with valid, zero-initialised structs.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
            }
            let _ = PREVIOUS.set(old);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
            }
        }
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// A mapping of program memory, guarded against SIGBUS while it lives.
pub struct GuardedMap {
    map: Arc<Mapping>,
    slot: usize,
}

impl GuardedMap {
    /// Maps `len` bytes of `fd` and guards them.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<Arc<GuardedMap>> {
        install()?;
        let map = Arc::new(Mapping::map(fd, len)?);
        let slot = SLOTS
            .iter()
            .position(|s| s.start.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let s = &SLOTS[slot];
        s.hit.store(false, Ordering::Release);
        s.len.store(len, Ordering::Release);
        s.start.store(map.as_ptr() as usize, Ordering::Release);
        Ok(Arc::new(GuardedMap { map, slot }))
    }

    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether the program shrank the file under the daemon (its pages are
    /// now anonymous zeros).
    pub fn poisoned(&self) -> bool {
        SLOTS[self.slot].hit.load(Ordering::Acquire)
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // Nothing touches the region any more (this is its last owner in the
        // daemon, apart from views that die with it).
        let s = &SLOTS[self.slot];
        s.start.store(0, Ordering::Release);
        s.len.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_shrunk_file_poisons_its_mapping_instead_of_killing_the_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fd = fskv_usrbio::sys::create_file(&dir.path().join("f"), 3 * 4096).expect("create");
        let g = GuardedMap::map(&fd, 3 * 4096).expect("map");
        // SAFETY: inside the 3-page mapping.
        unsafe { std::ptr::write_volatile(g.as_ptr().add(100), 7u8) };
        assert!(!g.poisoned());
        // SAFETY: ftruncate on our own file.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        // The third page is gone: without the guard this read is a SIGBUS.
        // SAFETY: inside the mapping; the guard catches the fault.
        let v = unsafe { std::ptr::read_volatile(g.as_ptr().add(2 * 4096 + 5)) };
        assert_eq!(v, 0);
        assert!(g.poisoned(), "the fault poisoned the region");
        // SAFETY: the region is anonymous memory now; still mapped.
        unsafe { std::ptr::write_volatile(g.as_ptr().add(2 * 4096 + 5), 1u8) };
        drop(g);
        let again = GuardedMap::map(&fd, 4096).expect("map again");
        assert!(!again.poisoned(), "a reused slot starts clean");
    }
}
