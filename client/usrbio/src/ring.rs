//! Both ends of a ring in shared memory (layout in [`crate::proto`]):
//! [`Producer`] in the program (prepare, submit, wait for completions) and
//! [`Consumer`] in the daemon (take submissions, post completions).
//!
//! | step | side | writes | then publishes |
//! |---|---|---|---|
//! | prepare | program | `args[slot]`, `sq[sq_head % n] = slot` | `sq_head += 1` (release) |
//! | submit | program | — | doorbell `seq += 1`, futex wake if the daemon sleeps |
//! | take | daemon | copies of `sq[..]` and `args[slot]` | `sq_tail += k` |
//! | complete | daemon | `cq[cq_head % n]` | `cq_head += k`, `cq_seq += 1`, futex wake if `cq_waiters` > 0 |
//! | consume | program | copies of `cq[..]`; frees the slots | `cq_tail += k` |
//!
//! The daemon copies what it takes before using it (the program can change
//! its memory at any time) and never trusts the program's counters beyond
//! checking them: [`Consumer::ready`] and [`Consumer::cq_space`] report a
//! ring whose counters are impossible as [`Broken`].

use crate::proto::{Cqe, Doorbell, RingHeader, RingLayout, SqeArgs, DOORBELL_MAGIC, RING_CLOSED, RING_LIVE, RING_MAGIC, RING_VERSION};
use crate::sys::{futex_wait, futex_wait_until_realtime, futex_wake, realtime_now, timespec_before, Mapping};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A ring's memory, validated: pointers to its sections.
pub struct RingView {
    map: Arc<Mapping>,
    layout: RingLayout,
}

/// Why a ring cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("not a ring (bad magic or version)")]
    NotARing,
    #[error("{entries} entries do not fit in {bytes} bytes")]
    TooSmall { entries: u32, bytes: usize },
    #[error("bad entry count {0}")]
    BadEntries(u32),
}

/// The counters of a ring are impossible (the program broke the protocol,
/// or its memory went away): the daemon stops serving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ring protocol broken: {0}")]
pub struct Broken(pub &'static str);

impl RingView {
    /// Writes a fresh header for `entries` into `map` (the program's side,
    /// on a new zero-filled file).
    pub fn init(map: Arc<Mapping>, entries: u32) -> Result<RingView, RingError> {
        let layout = RingLayout::new(entries).ok_or(RingError::BadEntries(entries))?;
        if layout.bytes > map.len() {
            return Err(RingError::TooSmall { entries, bytes: map.len() });
        }
        let view = RingView { map, layout };
        let h = view.header();
        h.version.store(RING_VERSION, Ordering::Relaxed);
        h.entries.store(entries, Ordering::Relaxed);
        h.state.store(RING_LIVE, Ordering::Relaxed);
        h.magic.store(RING_MAGIC, Ordering::Release);
        Ok(view)
    }

    /// Validates the header of an existing ring (the daemon's side).
    pub fn attach(map: Arc<Mapping>) -> Result<RingView, RingError> {
        if map.len() < crate::proto::RING_HEADER_BYTES {
            return Err(RingError::NotARing);
        }
        // SAFETY: the mapping holds at least a header; RingHeader is all atomics.
        let h = unsafe { &*(map.as_ptr() as *const RingHeader) };
        if h.magic.load(Ordering::Acquire) != RING_MAGIC || h.version.load(Ordering::Relaxed) != RING_VERSION {
            return Err(RingError::NotARing);
        }
        let entries = h.entries.load(Ordering::Relaxed);
        let layout = RingLayout::new(entries).ok_or(RingError::BadEntries(entries))?;
        if layout.bytes > map.len() {
            return Err(RingError::TooSmall { entries, bytes: map.len() });
        }
        Ok(RingView { map, layout })
    }

    pub fn header(&self) -> &RingHeader {
        // SAFETY: the mapping is at least RING_HEADER_BYTES long (checked at
        // init/attach), page-aligned, and RingHeader is made of atomics.
        unsafe { &*(self.map.as_ptr() as *const RingHeader) }
    }

    pub fn entries(&self) -> u32 {
        self.layout.entries
    }

    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    fn args_ptr(&self, slot: u32) -> *mut SqeArgs {
        debug_assert!(slot < self.layout.entries);
        // SAFETY: slot < entries, so the pointer lies in the args section.
        unsafe { self.map.as_ptr().add(self.layout.args_offset).cast::<SqeArgs>().add(slot as usize) }
    }

    fn sq_ptr(&self, pos: u32) -> *mut u32 {
        let i = (pos % self.layout.entries) as usize;
        // SAFETY: i < entries: inside the sq section.
        unsafe { self.map.as_ptr().add(self.layout.sq_offset).cast::<u32>().add(i) }
    }

    fn cq_ptr(&self, pos: u32) -> *mut Cqe {
        let i = (pos % self.layout.entries) as usize;
        // SAFETY: i < entries: inside the cq section (8-aligned).
        unsafe { self.map.as_ptr().add(self.layout.cq_offset).cast::<Cqe>().add(i) }
    }

    /// Whether the daemon closed the ring.
    pub fn closed(&self) -> bool {
        self.header().state.load(Ordering::Acquire) == RING_CLOSED
    }
}

/// Rings the doorbell: bumps its sequence and wakes the daemon if it sleeps.
pub fn ring_doorbell(bell: &Doorbell) {
    bell.seq.fetch_add(1, Ordering::SeqCst);
    if bell.waiters.load(Ordering::SeqCst) > 0 {
        futex_wake(&bell.seq, 1);
    }
}

/// The doorbell at the start of `map` (the caller checked its size).
///
/// # Safety
/// `map` must be at least `size_of::<Doorbell>()` bytes and stay mapped for
/// the returned reference's lifetime.
pub unsafe fn doorbell(map: &Mapping) -> Option<&Doorbell> {
    if map.len() < std::mem::size_of::<Doorbell>() {
        return None;
    }
    // SAFETY: per the contract; Doorbell is made of atomics.
    let bell = unsafe { &*(map.as_ptr() as *const Doorbell) };
    (bell.magic.load(Ordering::Acquire) == DOORBELL_MAGIC).then_some(bell)
}

/// How long [`Producer::wait`] waits.
#[derive(Clone, Copy, Debug)]
pub enum Deadline {
    /// Until the minimum number of completions arrived.
    Never,
    /// Until this `CLOCK_REALTIME` instant (the C API's `abs_timeout`).
    Realtime(libc::timespec),
}

/// The program's end of a ring.
pub struct Producer {
    view: RingView,
    /// Free slots (program-private).
    free: Mutex<Vec<u32>>,
    /// Serialises consumers of completions.
    consume: Mutex<()>,
    /// How long `wait` polls for completions before it sleeps on the futex.
    spin: Duration,
}

/// The ring has no free slot (`hf3fs_prep_io` returns `-EAGAIN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the ring is full")]
pub struct Full;

/// How often a waiter without a deadline looks whether the daemon closed the
/// ring or died (a futex wait never ends by itself otherwise).
pub const LIVENESS_CHECK_MS: u64 = 500;

impl Producer {
    pub fn new(view: RingView) -> Producer {
        let n = view.entries();
        Producer { view, free: Mutex::new((0..n).rev().collect()), consume: Mutex::new(()), spin: Duration::ZERO }
    }

    /// Lets `wait` poll for completions this long before it sleeps (saves
    /// the wake-up latency when completions come soon, at the cost of CPU).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    pub fn view(&self) -> &RingView {
        &self.view
    }

    pub fn entries(&self) -> u32 {
        self.view.entries()
    }

    /// Queues one request; returns its slot (reported back in its completion).
    pub fn prep(&self, args: SqeArgs) -> Result<u32, Full> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let slot = free.pop().ok_or(Full)?;
        let h = self.view.header();
        let head = h.sq_head.load(Ordering::Relaxed);
        // SAFETY: slot < entries; the slot was free, so the daemon does not
        // read it now; the sq position head % n was taken by the daemon
        // already (at most n slots are in use; see the module docs).
        unsafe {
            std::ptr::write_volatile(self.view.args_ptr(slot), args);
            std::ptr::write_volatile(self.view.sq_ptr(head), slot);
        }
        h.sq_head.store(head.wrapping_add(1), Ordering::Release);
        Ok(slot)
    }

    /// Requests prepared and not yet taken by the daemon.
    pub fn pending(&self) -> u32 {
        let h = self.view.header();
        h.sq_head.load(Ordering::Acquire).wrapping_sub(h.sq_tail.load(Ordering::Acquire))
    }

    /// Completions ready to be consumed.
    pub fn ready(&self) -> u32 {
        let h = self.view.header();
        h.cq_head.load(Ordering::Acquire).wrapping_sub(h.cq_tail.load(Ordering::Relaxed))
    }

    /// Consumes up to `out.len()` completions without waiting; frees their slots.
    pub fn reap(&self, out: &mut [Cqe]) -> usize {
        let _one = self.consume.lock().unwrap_or_else(|p| p.into_inner());
        let h = self.view.header();
        let tail = h.cq_tail.load(Ordering::Relaxed);
        let head = h.cq_head.load(Ordering::Acquire);
        let avail = head.wrapping_sub(tail).min(self.entries());
        let k = (avail as usize).min(out.len());
        let mut freed = Vec::with_capacity(k);
        for (i, slot) in out.iter_mut().take(k).enumerate() {
            // SAFETY: positions tail..tail+k were published by the daemon
            // (acquire on cq_head above).
            let cqe = unsafe { std::ptr::read_volatile(self.view.cq_ptr(tail.wrapping_add(i as u32))) };
            *slot = cqe;
            if (cqe.index as u32) < self.entries() {
                freed.push(cqe.index as u32);
            }
        }
        h.cq_tail.store(tail.wrapping_add(k as u32), Ordering::Release);
        if !freed.is_empty() {
            self.free.lock().unwrap_or_else(|p| p.into_inner()).extend(freed);
        }
        k
    }

    /// Consumes completions into `out` until at least `min` (≤ `out.len()`)
    /// were taken or the deadline passes; then takes what else is ready.
    /// `alive` is asked every [`LIVENESS_CHECK_MS`] while waiting without
    /// progress; when it (or the ring's state) says the daemon is gone, the
    /// wait ends with `Err(ENOTCONN)` if nothing was taken.
    pub fn wait(&self, out: &mut [Cqe], min: usize, deadline: Deadline, alive: &dyn Fn() -> bool) -> std::io::Result<usize> {
        let min = min.min(out.len());
        let mut filled = 0;
        let h = self.view.header();
        let check_every = std::time::Duration::from_millis(LIVENESS_CHECK_MS);
        let mut last_check = std::time::Instant::now();
        loop {
            filled += self.reap(&mut out[filled..]);
            if filled >= min || filled == out.len() {
                return Ok(filled);
            }
            // The daemon's liveness costs a system call: only after a while without completions.
            let dead = self.view.closed() || (last_check.elapsed() >= check_every && !alive());
            if dead {
                return if filled > 0 { Ok(filled) } else { Err(std::io::Error::from_raw_os_error(libc::ENOTCONN)) };
            }
            if last_check.elapsed() >= check_every {
                last_check = std::time::Instant::now();
            }
            if !self.spin.is_zero() {
                let until = std::time::Instant::now() + self.spin;
                while self.ready() == 0 && std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
                if self.ready() > 0 {
                    continue;
                }
            }
            h.cq_waiters.fetch_add(1, Ordering::SeqCst);
            let seq = h.cq_seq.load(Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.ready() == 0 {
                let check = Duration::from_millis(LIVENESS_CHECK_MS);
                match deadline {
                    Deadline::Never => futex_wait(&h.cq_seq, seq, Some(check)),
                    Deadline::Realtime(at) => {
                        let now = realtime_now();
                        if !timespec_before(&now, &at) {
                            h.cq_waiters.fetch_sub(1, Ordering::SeqCst);
                            return Ok(filled);
                        }
                        let soon = add_ms(&now, LIVENESS_CHECK_MS);
                        let until = if timespec_before(&soon, &at) { soon } else { at };
                        futex_wait_until_realtime(&h.cq_seq, seq, &until);
                    }
                }
            }
            h.cq_waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn add_ms(t: &libc::timespec, ms: u64) -> libc::timespec {
    let nsec = t.tv_nsec as u64 + (ms % 1000) * 1_000_000;
    libc::timespec {
        tv_sec: t.tv_sec + (ms / 1000) as libc::time_t + (nsec / 1_000_000_000) as libc::time_t,
        tv_nsec: (nsec % 1_000_000_000) as libc::c_long,
    }
}

/// The daemon's end of a ring. Not shared: the daemon keeps it under a lock.
pub struct Consumer {
    view: RingView,
    /// Submission entries taken (mirrors `sq_tail`).
    taken: u32,
    /// Completions published (mirrors `cq_head`).
    posted: u32,
    /// Taken and not yet completed.
    outstanding: u32,
}

/// One request taken from a ring: its slot and a copy of its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub slot: u32,
    pub args: SqeArgs,
}

impl Consumer {
    /// Starts serving a ring as the program left it (counters may be non-zero
    /// if the program prepared requests before registering).
    pub fn new(view: RingView) -> Consumer {
        let h = view.header();
        let taken = h.sq_tail.load(Ordering::Acquire);
        let posted = h.cq_head.load(Ordering::Acquire);
        Consumer { view, taken, posted, outstanding: 0 }
    }

    pub fn view(&self) -> &RingView {
        &self.view
    }

    /// Submission entries published and not yet taken.
    pub fn ready(&self) -> Result<u32, Broken> {
        if self.view.header().magic.load(Ordering::Relaxed) != RING_MAGIC {
            return Err(Broken("the ring's memory changed under the daemon"));
        }
        let n = self.view.header().sq_head.load(Ordering::Acquire).wrapping_sub(self.taken);
        if n > self.view.entries() {
            return Err(Broken("more submissions than entries"));
        }
        Ok(n)
    }

    /// Completions the daemon may still owe without overflowing the queue:
    /// entries − (published and not consumed) − (taken and in progress).
    pub fn cq_space(&self) -> Result<u32, Broken> {
        let unconsumed = self.posted.wrapping_sub(self.view.header().cq_tail.load(Ordering::Acquire));
        let used = u64::from(unconsumed) + u64::from(self.outstanding);
        if unconsumed > self.view.entries() {
            return Err(Broken("completion tail ahead of head"));
        }
        Ok(u64::from(self.view.entries()).saturating_sub(used) as u32)
    }

    /// Takes `n` submissions (the caller checked `ready` and `cq_space`);
    /// copies them out and publishes `sq_tail`.
    pub fn take(&mut self, n: u32) -> Result<Vec<Taken>, Broken> {
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            // SAFETY: the position was published (acquire in `ready`); read
            // once, then validated.
            let slot = unsafe { std::ptr::read_volatile(self.view.sq_ptr(self.taken.wrapping_add(i))) };
            if slot >= self.view.entries() {
                return Err(Broken("slot number out of range"));
            }
            // SAFETY: slot < entries; a copy, validated by the caller.
            let args = unsafe { std::ptr::read_volatile(self.view.args_ptr(slot)) };
            out.push(Taken { slot, args });
        }
        self.taken = self.taken.wrapping_add(n);
        self.outstanding += n;
        self.view.header().sq_tail.store(self.taken, Ordering::Release);
        Ok(out)
    }

    /// Publishes completions of taken requests and wakes waiting threads.
    pub fn complete(&mut self, cqes: &[Cqe]) {
        for (i, c) in cqes.iter().enumerate() {
            // SAFETY: the position is free: `take` reserved room for every
            // completion owed (`cq_space`).
            unsafe { std::ptr::write_volatile(self.view.cq_ptr(self.posted.wrapping_add(i as u32)), *c) };
        }
        self.posted = self.posted.wrapping_add(cqes.len() as u32);
        self.outstanding = self.outstanding.saturating_sub(cqes.len() as u32);
        let h = self.view.header();
        h.cq_head.store(self.posted, Ordering::Release);
        h.cq_seq.fetch_add(1, Ordering::SeqCst);
        if h.cq_waiters.load(Ordering::SeqCst) > 0 {
            futex_wake(&h.cq_seq, i32::MAX);
        }
    }

    /// Requests taken and not completed.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Marks the ring closed and wakes its waiters.
    pub fn close(&self) {
        let h = self.view.header();
        h.state.store(RING_CLOSED, Ordering::Release);
        h.cq_seq.fetch_add(1, Ordering::SeqCst);
        futex_wake(&h.cq_seq, i32::MAX);
    }
}

/// A view of the doorbell's futex word (for waiting on it).
pub fn doorbell_word(bell: &Doorbell) -> &AtomicU32 {
    &bell.seq
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::create_file;

    fn ring(entries: u32) -> (tempfile::TempDir, Producer, Consumer) {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = RingLayout::new(entries).expect("layout").bytes;
        let fd = create_file(&dir.path().join("ring"), bytes).expect("create");
        let map = Arc::new(Mapping::map(&fd, bytes).expect("map"));
        let producer = Producer::new(RingView::init(map.clone(), entries).expect("init"));
        let consumer = Consumer::new(RingView::attach(Arc::new(Mapping::map(&fd, bytes).expect("map"))).expect("attach"));
        (dir, producer, consumer)
    }

    fn args(n: u64) -> SqeArgs {
        SqeArgs { file_offset: n, len: n + 1, userdata: 1000 + n, ..Default::default() }
    }

    #[test]
    fn requests_go_through_and_slots_come_back() {
        let (_d, p, mut c) = ring(4);
        let slots: Vec<u32> = (0..4).map(|i| p.prep(args(i)).expect("prep")).collect();
        assert_eq!(p.prep(args(9)), Err(Full), "a fifth request overflows four entries");
        assert_eq!(c.ready(), Ok(4));
        assert_eq!(c.cq_space(), Ok(4));
        let taken = c.take(3).expect("take");
        assert_eq!(taken.iter().map(|t| t.args.file_offset).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(taken.iter().map(|t| t.slot).collect::<Vec<_>>(), slots[..3]);
        assert_eq!(c.ready(), Ok(1));
        assert_eq!(c.cq_space(), Ok(1), "three completions owed");
        assert_eq!(p.pending(), 1);
        // Complete out of order; the program sees them in completion order.
        c.complete(&[Cqe { index: taken[2].slot as i32, result: 3, userdata: taken[2].args.userdata, reserved: 0 }]);
        let mut out = [Cqe::default(); 8];
        assert_eq!(p.reap(&mut out), 1);
        assert_eq!((out[0].index as u32, out[0].result, out[0].userdata), (slots[2], 3, 1002));
        // Its slot is free again.
        let again = p.prep(args(5)).expect("prep after a completion");
        assert_eq!(again, slots[2]);
        c.complete(&[
            Cqe { index: taken[0].slot as i32, result: 1, ..Default::default() },
            Cqe { index: taken[1].slot as i32, result: -5, ..Default::default() },
        ]);
        let got = p.wait(&mut out, 2, Deadline::Never, &|| true).expect("wait");
        assert_eq!(got, 2);
        assert_eq!((out[0].result, out[1].result), (1, -5));
        let rest = c.take(2).expect("take the rest");
        assert_eq!(rest.iter().map(|t| t.args.file_offset).collect::<Vec<_>>(), vec![3, 5]);
    }

    #[test]
    fn a_waiter_sleeps_until_completions_arrive_and_deadlines_end_waits() {
        let (_d, p, mut c) = ring(8);
        for i in 0..3 {
            p.prep(args(i)).expect("prep");
        }
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            let taken = c.take(3).expect("take");
            for t in taken {
                std::thread::sleep(Duration::from_millis(5));
                c.complete(&[Cqe { index: t.slot as i32, result: 7, ..Default::default() }]);
            }
            c
        });
        let mut out = [Cqe::default(); 8];
        let got = p.wait(&mut out, 3, Deadline::Never, &|| true).expect("wait");
        assert_eq!(got, 3);
        assert!(out[..3].iter().all(|c| c.result == 7));
        let c = t.join().expect("daemon thread");
        // Nothing more: an absolute deadline ends the wait with what there is.
        let mut at = realtime_now();
        at = add_ms(&at, 30);
        let start = std::time::Instant::now();
        assert_eq!(p.wait(&mut out, 1, Deadline::Realtime(at), &|| true).expect("wait"), 0);
        assert!(start.elapsed() >= Duration::from_millis(20));
        // A closed ring ends a wait without completions.
        c.close();
        let err = p.wait(&mut out, 1, Deadline::Never, &|| true).expect_err("closed");
        assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
        // So does a dead daemon (the liveness callback).
        let (_d2, p2, _c2) = ring(2);
        let err = p2.wait(&mut out, 1, Deadline::Never, &|| false).expect_err("dead daemon");
        assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
    }

    #[test]
    fn impossible_counters_break_the_ring() {
        let (_d, p, c) = ring(4);
        let h = p.view().header();
        h.sq_head.store(100, Ordering::Release);
        assert!(c.ready().is_err(), "more submissions than entries");
        h.sq_head.store(0, Ordering::Release);
        h.cq_tail.store(50, Ordering::Release);
        assert!(c.cq_space().is_err(), "tail ahead of head");
        h.cq_tail.store(0, Ordering::Release);
        assert_eq!(c.cq_space(), Ok(4));
        h.magic.store(0, Ordering::Release);
        assert!(c.ready().is_err(), "zeroed memory");
        let (_d, p, mut c) = ring(4);
        p.prep(args(1)).expect("prep");
        // SAFETY: position 0 of the sq section of a 4-entry ring.
        unsafe { std::ptr::write_volatile(p.view().sq_ptr(0), 99) };
        assert_eq!(c.take(1), Err(Broken("slot number out of range")));
    }

    #[test]
    fn attach_rejects_what_is_not_a_ring() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fd = create_file(&dir.path().join("x"), 8192).expect("create");
        let map = Arc::new(Mapping::map(&fd, 8192).expect("map"));
        assert_eq!(RingView::attach(map.clone()).err(), Some(RingError::NotARing));
        assert!(matches!(RingView::init(map.clone(), 1000), Err(RingError::TooSmall { .. })));
        RingView::init(map.clone(), 4).expect("init");
        // SAFETY: the entries field of the header.
        unsafe { &*(map.as_ptr() as *const RingHeader) }.entries.store(1 << 19, Ordering::Release);
        assert!(matches!(RingView::attach(map), Err(RingError::TooSmall { .. })));
    }
}
