//! `libhf3fs_api_shared.so`: the C functions of `include/hf3fs_usrbio.h`
//! over `fskv-usrbio` — what programs written for 3FS's USRBIO link against.
//!
//! | call | does | returns |
//! |---|---|---|
//! | `hf3fs_iovcreate` | `/dev/shm/fskv-usrbio.<pid>.<id>` + registration link | 0 / -errno |
//! | `hf3fs_iovopen` | maps the file behind another process's link | 0 / -errno |
//! | `hf3fs_iovwrap` | fills the struct (memory already registered) | 0 / -errno |
//! | `hf3fs_iorcreate*` | ring file + `.r`/`.w` link, file removed at once | 0 / -errno |
//! | `hf3fs_reg_fd` | `ioctl(IOC_REG_FD)` + `dup` | `-dup` (≤ 0) / **positive** errno |
//! | `hf3fs_prep_io` | one entry in the ring | index / -errno |
//! | `hf3fs_submit_ios` | rings the doorbell | 0 / -errno |
//! | `hf3fs_wait_for_ios` | collects completions (futex wait) | count / -errno |
//! | `hf3fs_hardlink`, `hf3fs_punchhole` | `link(2)`; unsupported | 0 / **positive** errno |
//!
//! Every function catches panics (a bug here must not unwind into C) and
//! answers `-EIO` (or the call's failure value) instead. Messages go to
//! stderr unless `HF3FS_USRBIO_LIB_LOG=OFF`.

#![allow(clippy::missing_safety_doc)]

use fskv_usrbio::client::{extract_mount_point, fd_table, ioctl_deregister, is_fskv, raw, register_fd, Region, RegisteredFd, RingHandle};
use fskv_usrbio::proto::{Cqe, IovKey, Priority, RingKey, RingLayout, SqeArgs, KNOWN_FLAGS};
use fskv_usrbio::ring::{Deadline, Full};
use libc::{c_char, c_int, c_void, size_t, timespec};
use std::ffi::CStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `struct hf3fs_iov`.
#[repr(C)]
pub struct Hf3fsIov {
    pub base: *mut u8,
    pub iovh: *mut c_void,
    pub id: [u8; 16],
    pub mount_point: [c_char; 256],
    pub size: size_t,
    pub block_size: size_t,
    pub numa: c_int,
}

/// `struct hf3fs_ior`.
#[repr(C)]
pub struct Hf3fsIor {
    pub iov: Hf3fsIov,
    pub iorh: *mut c_void,
    pub mount_point: [c_char; 256],
    pub for_read: bool,
    pub io_depth: c_int,
    pub priority: c_int,
    pub timeout: c_int,
    pub flags: u64,
}

/// `struct hf3fs_cqe` (the layout of `proto::Cqe`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Hf3fsCqe {
    pub index: i32,
    pub reserved: i32,
    pub result: i64,
    pub userdata: *const c_void,
}

// The layouts of 3FS's header on 64-bit Linux.
const _: () = assert!(std::mem::size_of::<Hf3fsIov>() == 312);
const _: () = assert!(std::mem::offset_of!(Hf3fsIov, id) == 16);
const _: () = assert!(std::mem::offset_of!(Hf3fsIov, mount_point) == 32);
const _: () = assert!(std::mem::offset_of!(Hf3fsIov, size) == 288);
const _: () = assert!(std::mem::offset_of!(Hf3fsIov, numa) == 304);
const _: () = assert!(std::mem::size_of::<Hf3fsIor>() == 600);
const _: () = assert!(std::mem::offset_of!(Hf3fsIor, iorh) == 312);
const _: () = assert!(std::mem::offset_of!(Hf3fsIor, for_read) == 576);
const _: () = assert!(std::mem::offset_of!(Hf3fsIor, io_depth) == 580);
const _: () = assert!(std::mem::offset_of!(Hf3fsIor, flags) == 592);
const _: () = assert!(std::mem::size_of::<Hf3fsCqe>() == std::mem::size_of::<Cqe>());

fn log(msg: std::fmt::Arguments<'_>) {
    if std::env::var("HF3FS_USRBIO_LIB_LOG").map_or(true, |v| !v.eq_ignore_ascii_case("off")) {
        eprintln!("hf3fs_usrbio: {msg}");
    }
}

/// Runs `f`, turning a panic into `on_panic`.
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            log(format_args!("internal error (panic); the call failed"));
            on_panic
        }
    }
}

fn neg(e: &std::io::Error) -> c_int {
    -e.raw_os_error().unwrap_or(libc::EIO)
}

/// A C path argument (`None` for NULL or empty).
unsafe fn path_arg(p: *const c_char) -> Option<PathBuf> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    if c.to_bytes().is_empty() {
        return None;
    }
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(c.to_bytes())))
}

fn copy_mount(dst: &mut [c_char; 256], mount: &Path) -> bool {
    let b = mount.as_os_str().as_bytes();
    if b.len() >= dst.len() {
        return false;
    }
    for (d, s) in dst.iter_mut().zip(b) {
        *d = *s as c_char;
    }
    dst[b.len()] = 0;
    true
}

/// What `iovh` points at.
struct IovState {
    region: Region,
}

/// What `iorh` points at.
struct IorState {
    ring: RingHandle,
}

#[no_mangle]
pub extern "C" fn hf3fs_is_hf3fs(fd: c_int) -> bool {
    guard(false, || fd >= 0 && is_fskv(fd))
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_extract_mount_point(out: *mut c_char, size: c_int, path: *const c_char) -> c_int {
    guard(-1, || {
        // SAFETY: a C string from the caller.
        let Some(path) = (unsafe { path_arg(path) }) else { return -1 };
        let Ok(Some(mp)) = extract_mount_point(&path) else { return -1 };
        let b = mp.as_os_str().as_bytes();
        let needed = b.len() as c_int + 1;
        if !out.is_null() && (b.len() as c_int) < size {
            // SAFETY: `out` has room for `size` > len bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), b.len());
                *out.add(b.len()) = 0;
            }
        }
        needed
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn fill_iov(
    iov: *mut Hf3fsIov,
    base: *mut u8,
    handle: *mut c_void,
    id: [u8; 16],
    mount: &Path,
    size: usize,
    block: usize,
    numa: c_int,
) -> bool {
    // SAFETY: the caller's struct.
    let iov = unsafe { &mut *iov };
    if !copy_mount(&mut iov.mount_point, mount) {
        return false;
    }
    iov.base = base;
    iov.iovh = handle;
    iov.id = id;
    iov.size = size;
    iov.block_size = block;
    iov.numa = numa;
    true
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovcreate(iov: *mut Hf3fsIov, mount: *const c_char, size: size_t, block_size: size_t, numa: c_int) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: a C string from the caller.
        let (Some(mount), false) = (unsafe { path_arg(mount) }, iov.is_null()) else { return -libc::EINVAL };
        if mount.as_os_str().len() >= 256 {
            return -libc::EINVAL;
        }
        let key = IovKey { id: [0; 16], block_size: block_size as u64, ring: None };
        let region = match Region::create(&mount, size, key, false) {
            Ok(r) => r,
            Err(e) => {
                log(format_args!("cannot create an iov of {size} bytes on {}: {e}", mount.display()));
                return neg(&e);
            }
        };
        let (base, id) = (region.map.as_ptr(), region.id);
        let handle = Box::into_raw(Box::new(IovState { region })).cast::<c_void>();
        // SAFETY: the caller's struct; the mount fits (checked above).
        unsafe { fill_iov(iov, base, handle, id, &mount, size, block_size, numa) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovopen(
    iov: *mut Hf3fsIov,
    id: *const u8,
    mount: *const c_char,
    size: size_t,
    block_size: size_t,
    numa: c_int,
) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: a C string from the caller.
        let (Some(mount), false, false) = (unsafe { path_arg(mount) }, iov.is_null(), id.is_null()) else { return -libc::EINVAL };
        if mount.as_os_str().len() >= 256 {
            return -libc::EINVAL;
        }
        let mut idb = [0u8; 16];
        // SAFETY: the caller passes 16 id bytes.
        unsafe { std::ptr::copy_nonoverlapping(id, idb.as_mut_ptr(), 16) };
        let region = match Region::open(&mount, &idb, block_size as u64, size) {
            Ok(r) => r,
            Err(e) => return neg(&e),
        };
        let len = region.map.len();
        let base = region.map.as_ptr();
        let handle = Box::into_raw(Box::new(IovState { region })).cast::<c_void>();
        // SAFETY: the caller's struct.
        unsafe { fill_iov(iov, base, handle, idb, &mount, len, block_size, numa) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovwrap(
    iov: *mut Hf3fsIov,
    base: *mut c_void,
    id: *const u8,
    mount: *const c_char,
    size: size_t,
    block_size: size_t,
    numa: c_int,
) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: a C string from the caller.
        let (Some(mount), false, false) = (unsafe { path_arg(mount) }, iov.is_null(), id.is_null()) else { return -libc::EINVAL };
        let mut idb = [0u8; 16];
        // SAFETY: the caller passes 16 id bytes.
        unsafe { std::ptr::copy_nonoverlapping(id, idb.as_mut_ptr(), 16) };
        // SAFETY: the caller's struct.
        if unsafe { fill_iov(iov, base.cast::<u8>(), std::ptr::null_mut(), idb, &mount, size, block_size, numa) } {
            0
        } else {
            -libc::EINVAL
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovunlink(iov: *mut Hf3fsIov) {
    guard((), || {
        // SAFETY: the caller's struct; iovh was made by this library.
        if let Some(state) = unsafe { iov.as_mut() }.and_then(|i| unsafe { i.iovh.cast::<IovState>().as_mut() }) {
            state.region.unlink_file();
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iovdestroy(iov: *mut Hf3fsIov) {
    guard((), || {
        // SAFETY: the caller's struct.
        let Some(iov) = (unsafe { iov.as_mut() }) else { return };
        if iov.iovh.is_null() {
            return;
        }
        // SAFETY: iovh came from Box::into_raw in this library; taken once.
        let state = unsafe { Box::from_raw(iov.iovh.cast::<IovState>()) };
        iov.iovh = std::ptr::null_mut();
        // Drop: the link goes (the daemon forgets the iov), then the file, then the mapping.
        drop(state);
    })
}

#[no_mangle]
pub extern "C" fn hf3fs_ior_size(entries: c_int) -> size_t {
    u32::try_from(entries).ok().and_then(RingLayout::new).map_or(0, |l| l.bytes)
}

#[allow(clippy::too_many_arguments)]
unsafe fn ior_create(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    priority: c_int,
    timeout: c_int,
    numa: c_int,
    flags: u64,
) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: a C string from the caller.
        let (Some(mount), false) = (unsafe { path_arg(mount) }, ior.is_null()) else { return -libc::EINVAL };
        if timeout < 0
            || entries < 1
            || io_depth.unsigned_abs() > entries as u32
            || flags & !KNOWN_FLAGS != 0
            || mount.as_os_str().len() >= 256
        {
            return -libc::EINVAL;
        }
        let key = RingKey { for_read, io_depth, priority: Priority::from_c(priority), timeout_ms: timeout as u32, flags };
        let ring = match RingHandle::create(&mount, entries as u32, key) {
            Ok(r) => r,
            Err(e) => {
                log(format_args!("cannot create a ring of {entries} entries on {}: {e}", mount.display()));
                return neg(&e);
            }
        };
        let (base, len, id) = (ring.region.map.as_ptr(), ring.region.map.len(), ring.region.id);
        let handle = Box::into_raw(Box::new(IorState { ring })).cast::<c_void>();
        // SAFETY: the caller's struct.
        let r = unsafe { &mut *ior };
        // SAFETY: the caller's struct; the mount fits.
        unsafe { fill_iov(&mut r.iov, base, std::ptr::null_mut(), id, &mount, len, 0, numa) };
        copy_mount(&mut r.mount_point, &mount);
        r.iorh = handle;
        r.for_read = for_read;
        r.io_depth = io_depth;
        r.priority = priority;
        r.timeout = timeout;
        r.flags = flags;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iorcreate(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    numa: c_int,
) -> c_int {
    // SAFETY: forwarded caller arguments.
    unsafe { ior_create(ior, mount, entries, for_read, io_depth, 0, 0, numa, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iorcreate2(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    priority: c_int,
    numa: c_int,
) -> c_int {
    // SAFETY: forwarded caller arguments.
    unsafe { ior_create(ior, mount, entries, for_read, io_depth, priority, 0, numa, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iorcreate3(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    priority: c_int,
    timeout: c_int,
    numa: c_int,
) -> c_int {
    // SAFETY: forwarded caller arguments.
    unsafe { ior_create(ior, mount, entries, for_read, io_depth, priority, timeout, numa, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iorcreate4(
    ior: *mut Hf3fsIor,
    mount: *const c_char,
    entries: c_int,
    for_read: bool,
    io_depth: c_int,
    timeout: c_int,
    numa: c_int,
    flags: u64,
) -> c_int {
    // SAFETY: forwarded caller arguments.
    unsafe { ior_create(ior, mount, entries, for_read, io_depth, 0, timeout, numa, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_iordestroy(ior: *mut Hf3fsIor) {
    guard((), || {
        // SAFETY: the caller's struct.
        let Some(ior) = (unsafe { ior.as_mut() }) else { return };
        if ior.iorh.is_null() {
            return;
        }
        // SAFETY: iorh came from Box::into_raw in this library; taken once.
        drop(unsafe { Box::from_raw(ior.iorh.cast::<IorState>()) });
        ior.iorh = std::ptr::null_mut();
        ior.iov.base = std::ptr::null_mut();
    })
}

/// The ring behind `ior`, if it is one of ours.
unsafe fn ring_of<'a>(ior: *const Hf3fsIor) -> Option<&'a IorState> {
    // SAFETY: the caller's struct; iorh was made by this library.
    unsafe { ior.as_ref().and_then(|i| i.iorh.cast::<IorState>().as_ref()) }
}

#[no_mangle]
pub extern "C" fn hf3fs_reg_fd(fd: c_int, _flags: u64) -> c_int {
    guard(libc::EIO, || {
        if fd < 0 || !is_fskv(fd) {
            return libc::EBADF;
        }
        let mut table = fd_table().lock().unwrap_or_else(|p| p.into_inner());
        if table.contains_key(&fd) {
            return libc::EINVAL;
        }
        let reg = match register_fd(fd) {
            Ok(r) => r,
            Err(e) => return e.raw_os_error().unwrap_or(libc::EIO),
        };
        let dup = raw(&reg.dup);
        if table.contains_key(&dup) {
            return libc::EINVAL;
        }
        let reg = Arc::new(reg);
        table.insert(fd, reg.clone());
        table.insert(dup, reg);
        -dup
    })
}

#[no_mangle]
pub extern "C" fn hf3fs_dereg_fd(fd: c_int) {
    guard((), || {
        let mut table = fd_table().lock().unwrap_or_else(|p| p.into_inner());
        let Some(reg) = table.get(&fd.saturating_abs()).cloned() else { return };
        for k in [reg.fd, raw(&reg.dup)] {
            if table.get(&k).is_some_and(|r| Arc::ptr_eq(r, &reg)) {
                table.remove(&k);
            }
        }
        drop(table);
        ioctl_deregister(raw(&reg.dup));
        // The duplicate closes when the last request preparing with it is done.
    })
}

fn registered(fd: c_int) -> Option<Arc<RegisteredFd>> {
    fd_table().lock().unwrap_or_else(|p| p.into_inner()).get(&fd.saturating_abs()).cloned()
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_io_entries(ior: *const Hf3fsIor) -> c_int {
    // SAFETY: the caller's struct.
    guard(-libc::EIO, || unsafe { ring_of(ior) }.map_or(-libc::EINVAL, |r| r.ring.producer.entries() as c_int))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hf3fs_prep_io(
    ior: *const Hf3fsIor,
    iov: *const Hf3fsIov,
    read: bool,
    ptr: *mut c_void,
    fd: c_int,
    off: size_t,
    len: u64,
    userdata: *const c_void,
) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: the caller's structs.
        let (Some(state), Some(iov)) = (unsafe { ring_of(ior) }, unsafe { iov.as_ref() }) else { return -libc::EINVAL };
        if read != state.ring.key.for_read || ptr.is_null() || iov.base.is_null() || len == 0 || fd == c_int::MIN {
            return -libc::EINVAL;
        }
        let (base, addr) = (iov.base as usize, ptr as usize);
        if addr < base || iov.size > usize::MAX - base {
            return -libc::EINVAL;
        }
        let offset = addr - base;
        if offset > iov.size || len > (iov.size - offset) as u64 {
            return -libc::EINVAL;
        }
        let Some(file) = registered(fd) else { return -libc::EBADF };
        if (read && !file.readable()) || (!read && !file.writable()) {
            return -libc::EACCES;
        }
        let args = SqeArgs {
            iov_id: iov.id,
            iov_offset: offset as u64,
            file: file.token,
            file_offset: off as u64,
            len,
            userdata: userdata as u64,
            reserved: 0,
        };
        match state.ring.producer.prep(args) {
            Ok(slot) => slot as c_int,
            Err(Full) => -libc::EAGAIN,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_submit_ios(ior: *const Hf3fsIor) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: the caller's struct.
        match unsafe { ring_of(ior) } {
            Some(state) => {
                state.ring.submit();
                0
            }
            None => -libc::EINVAL,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_wait_for_ios(
    ior: *const Hf3fsIor,
    cqes: *mut Hf3fsCqe,
    cqec: c_int,
    min_results: c_int,
    abs_timeout: *const timespec,
) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: the caller's struct.
        let Some(state) = (unsafe { ring_of(ior) }) else { return -libc::EINVAL };
        if cqec <= 0 || cqes.is_null() {
            return -libc::EINVAL;
        }
        let min = min_results.clamp(0, cqec) as usize;
        // SAFETY: the caller's timespec, if any.
        let deadline = match unsafe { abs_timeout.as_ref() } {
            None => Deadline::Never,
            Some(t) => Deadline::Realtime(*t),
        };
        // SAFETY: hf3fs_cqe and proto::Cqe have the same layout (asserted
        // above: i32, i32, i64, pointer-sized userdata) and the caller gives
        // room for `cqec` of them.
        let out = unsafe { std::slice::from_raw_parts_mut(cqes.cast::<Cqe>(), cqec as usize) };
        match state.ring.wait(out, min, deadline) {
            Ok(n) => n as c_int,
            Err(e) => neg(&e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hf3fs_hardlink(target: *const c_char, link_name: *const c_char) -> c_int {
    guard(libc::EIO, || {
        if target.is_null() || link_name.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: two C strings from the caller.
        if unsafe { libc::link(target, link_name) } == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
        }
    })
}

#[no_mangle]
pub extern "C" fn hf3fs_punchhole(_fd: c_int, _n: c_int, _start: *const size_t, _end: *const size_t, _flags: size_t) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn hf3fs_iovcreate_device(
    _iov: *mut Hf3fsIov,
    _mount: *const c_char,
    _size: size_t,
    _block: size_t,
    _device: c_int,
) -> c_int {
    -libc::ENOTSUP
}

#[no_mangle]
pub extern "C" fn hf3fs_gdr_available() -> bool {
    false
}

#[no_mangle]
pub extern "C" fn hf3fs_gdr_device_count() -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn hf3fs_iov_mem_type(_iov: *const Hf3fsIov) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn hf3fs_iov_device_id(_iov: *const Hf3fsIov) -> c_int {
    -1
}

#[no_mangle]
pub extern "C" fn hf3fs_iovsync(iov: *const Hf3fsIov, _direction: c_int) -> c_int {
    if iov.is_null() {
        -libc::EINVAL
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes_and_argument_checks() {
        assert_eq!(hf3fs_ior_size(0), 0);
        assert_eq!(hf3fs_ior_size(-3), 0);
        assert_eq!(hf3fs_ior_size(64) % 4096, 0);
        assert!(hf3fs_ior_size(1024) > hf3fs_ior_size(64));
        // SAFETY: NULL arguments are rejected before use.
        unsafe {
            assert_eq!(hf3fs_iorcreate(std::ptr::null_mut(), c"/mnt".as_ptr(), 8, true, 0, -1), -libc::EINVAL);
            let mut ior: Hf3fsIor = std::mem::zeroed();
            assert_eq!(hf3fs_iorcreate4(&mut ior, c"/mnt".as_ptr(), 8, true, 9, 0, -1, 0), -libc::EINVAL, "|io_depth| > entries");
            assert_eq!(hf3fs_iorcreate3(&mut ior, c"/mnt".as_ptr(), 8, true, 0, 0, -1, -1), -libc::EINVAL, "timeout < 0");
            assert_eq!(hf3fs_iorcreate4(&mut ior, c"/mnt".as_ptr(), 8, true, 0, 0, -1, 4), -libc::EINVAL, "unknown flag");
            assert_eq!(hf3fs_io_entries(&ior), -libc::EINVAL, "no ring");
            let mut cqe = [Hf3fsCqe { index: 0, reserved: 0, result: 0, userdata: std::ptr::null() }];
            assert_eq!(hf3fs_wait_for_ios(&ior, cqe.as_mut_ptr(), 1, 1, std::ptr::null()), -libc::EINVAL);
            assert_eq!(hf3fs_submit_ios(&ior), -libc::EINVAL);
            let mut out = [0 as c_char; 64];
            assert_eq!(hf3fs_extract_mount_point(out.as_mut_ptr(), 64, c"/".as_ptr()), -1, "/ is not a mount of ours");
        }
        assert_eq!(hf3fs_reg_fd(-1, 0), libc::EBADF);
        assert_eq!(hf3fs_reg_fd(0, 0), libc::EBADF, "stdin is not on a mount (positive errno)");
        assert!(!hf3fs_is_hf3fs(0));
        assert_eq!(hf3fs_punchhole(0, 0, std::ptr::null(), std::ptr::null(), 0), libc::EOPNOTSUPP);
    }
}
