//! A USRBIO ring as the FUSE daemon serves it (ring.rs, `RingView::attach`
//! and `Consumer`): the ring is shared memory the program writes at will,
//! so its header, counters and submission queue are untrusted. The input
//! fills a memfd-backed mapping (header, then the rest), then each round
//! moves the program's counters (`sq_head`, `cq_tail`) and slot numbers as
//! the input says while the daemon's side attaches, looks at `ready` and
//! `cq_space`, takes what both allow and completes it.
//!
//! Properties (with AddressSanitizer): no read or write outside the
//! mapping; a ring whose header does not fit is refused; `take` never
//! returns more than was ready or a slot outside the ring; completions owed
//! never exceed the completion queue.
#![no_main]

use fskv_usrbio::proto::{Cqe, RingLayout, RING_HEADER_BYTES, RING_MAGIC, RING_VERSION};
use fskv_usrbio::ring::{Consumer, RingView};
use fskv_usrbio::sys::Mapping;
use libfuzzer_sys::fuzz_target;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

const FILE_BYTES: usize = 64 << 10;

fn memfd() -> &'static OwnedFd {
    static FD: OnceLock<OwnedFd> = OnceLock::new();
    FD.get_or_init(|| {
        // SAFETY: a new anonymous file; the returned descriptor is owned here.
        let fd = unsafe { libc::memfd_create(c"fskv-usrbio-fuzz".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create failed");
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fd is valid.
        assert_eq!(unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), FILE_BYTES as libc::off_t) }, 0);
        fd
    })
}

fn write_u32(map: &Mapping, offset: usize, v: u32) {
    // SAFETY: offset + 4 <= map.len() (callers' offsets are in the header).
    unsafe { std::ptr::write_volatile(map.as_ptr().add(offset).cast::<u32>(), v) }
}

fuzz_target!(|data: &[u8]| {
    let [pages, mode, entries_lo, entries_hi, rest @ ..] = data else { return };
    let len = (1 + usize::from(*pages) % (FILE_BYTES / 4096)) * 4096;
    let Ok(map) = Mapping::map(memfd(), len) else { return };
    // The program's bytes: the header and sections, zeros after the input.
    let (image, rounds) = rest.split_at(rest.len().min(len).min(rest.len() * 3 / 4));
    // SAFETY: image.len() <= len; the mapping is len bytes.
    unsafe {
        std::ptr::write_bytes(map.as_ptr(), 0, len);
        std::ptr::copy_nonoverlapping(image.as_ptr(), map.as_ptr(), image.len());
    }
    if mode & 1 != 0 && len >= RING_HEADER_BYTES {
        // A well-formed header, so the fuzzer reaches the queues.
        // SAFETY: in bounds (len >= RING_HEADER_BYTES), 8-aligned (page start).
        unsafe { std::ptr::write_volatile(map.as_ptr().cast::<u64>(), RING_MAGIC) };
        write_u32(&map, 8, RING_VERSION);
        write_u32(&map, 12, u32::from(u16::from_le_bytes([*entries_lo, *entries_hi])) % 1024);
    }
    let map = Arc::new(map);
    let Ok(view) = RingView::attach(map.clone()) else { return };
    let entries = view.entries();
    let layout = RingLayout::new(entries).expect("an attached ring has a valid layout");
    assert!(layout.bytes <= len);
    let mut c = Consumer::new(view);
    for round in rounds.chunks(6) {
        let [op, a, b, c0, ..] = *round else { break };
        let h = c.view().header();
        match op % 4 {
            0 => {
                h.sq_head.fetch_add(u32::from(a), Ordering::Release);
            }
            1 => {
                h.cq_tail.fetch_add(u32::from(b), Ordering::Release);
            }
            2 => {
                // Slot numbers in the submission queue: anything.
                let at = layout.sq_offset + (usize::from(a) % entries as usize) * 4;
                write_u32(&map, at, u32::from_le_bytes([a, b, c0, op]));
            }
            _ => {
                h.sq_head.store(u32::from_le_bytes([op, a, b, c0]), Ordering::Release);
            }
        }
        let (Ok(ready), Ok(space)) = (c.ready(), c.cq_space()) else { return };
        assert!(ready <= entries && space <= entries);
        let n = ready.min(space).min(u32::from(c0));
        let Ok(taken) = c.take(n) else { return };
        assert_eq!(taken.len(), n as usize);
        assert!(taken.iter().all(|t| t.slot < entries));
        assert!(c.outstanding() <= entries);
        let cqes: Vec<Cqe> =
            taken.iter().map(|t| Cqe { index: t.slot as i32, reserved: 0, result: 0, userdata: t.args.userdata }).collect();
        c.complete(&cqes);
    }
});
