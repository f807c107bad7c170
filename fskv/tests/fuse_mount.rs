//! `fskv mount` against a running `fskv up`: the POSIX surface through the
//! kernel (std::fs + libc), cross-visibility with `fskv put`/`get`, and a
//! clean unmount on SIGTERM. Skips (with a printed reason) where FUSE is
//! unavailable. One cluster start for everything, to keep the test short.

mod common;

use common::{free_base_port, start_up, start_up_with, UpGuard};
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const MIB: usize = 1 << 20;

fn fskv(args: &[&str]) -> Output {
    let out = common::fskv_cmd().args(args).env("FSKV_LOG", "warn").output().expect("run fskv");
    assert!(out.status.success(), "fskv {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

fn is_mounted(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    let p = path.to_string_lossy();
    mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(&*p))
}

/// The `fskv mount` child; unmounts and kills on drop (a failed test leaves
/// no stale mount behind).
struct MountProc {
    child: Option<Child>,
    path: PathBuf,
}

impl Drop for MountProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.path) {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

enum Mounted {
    Yes(MountProc),
    Skip(String),
}

/// Starts `fskv mount` and waits (bounded) for its "mounted" line.
fn start_mount(mgmtd: &str, meta: &str, path: &Path, close_batch_delay_ms: u64) -> Mounted {
    let mut child = common::fskv_cmd()
        .args(["mount", "--mgmtd", mgmtd, "--meta", meta])
        .args(["--close-batch-delay-ms", &close_batch_delay_ms.to_string()])
        .arg(path)
        .env("FSKV_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fskv mount");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if line.starts_with("mounted ") && is_mounted(path) {
                return Mounted::Yes(MountProc { child: Some(child), path: path.to_path_buf() });
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            if err.contains("Operation not permitted") || err.contains("Permission denied") || err.contains("fusermount") {
                return Mounted::Skip(format!("mounting is not permitted here ({status}): {err}"));
            }
            panic!("fskv mount exited with {status}: {err}");
        }
        assert!(Instant::now() < deadline, "fskv mount did not report the mount within 30 s");
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.to_str().unwrap()).unwrap()
}

fn check_sizes(mnt: &Path) {
    for (i, len) in [0, 1, 4096, MIB + 1, 20 * MIB].into_iter().enumerate() {
        let data = pattern(len, i as u32);
        let p = mnt.join(format!("size-{len}"));
        fs::write(&p, &data).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().len(), len as u64, "size of {p:?}");
        let back = fs::read(&p).unwrap();
        assert!(back == data, "bytes of {p:?} differ (got {} bytes)", back.len());
    }
}

fn check_hole_overwrite_truncate(mnt: &Path) {
    // A hole: 3 MiB of zeros, then 10 bytes.
    let p = mnt.join("holey");
    let mut f = fs::File::create(&p).unwrap();
    f.seek(SeekFrom::Start(3 * MIB as u64)).unwrap();
    f.write_all(b"0123456789").unwrap();
    drop(f);
    let got = fs::read(&p).unwrap();
    assert_eq!(got.len(), 3 * MIB + 10);
    assert!(got[..3 * MIB].iter().all(|&b| b == 0), "hole is not zeros");
    assert_eq!(&got[3 * MIB..], b"0123456789");

    // Overwrite in the middle of an existing file.
    let p = mnt.join(format!("size-{}", MIB + 1));
    let mut expect = fs::read(&p).unwrap();
    let patch = pattern(5000, 99);
    let mut f = OpenOptions::new().write(true).open(&p).unwrap();
    f.seek(SeekFrom::Start(700_000)).unwrap();
    f.write_all(&patch).unwrap();
    f.sync_all().unwrap();
    drop(f);
    expect[700_000..705_000].copy_from_slice(&patch);
    assert!(fs::read(&p).unwrap() == expect, "overwrite in the middle");

    // Truncate down, then up (zeros past the old end).
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(100).unwrap();
    drop(f);
    assert_eq!(fs::read(&p).unwrap(), expect[..100].to_vec());
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(5000).unwrap();
    drop(f);
    let got = fs::read(&p).unwrap();
    assert_eq!(got.len(), 5000);
    assert_eq!(&got[..100], &expect[..100]);
    assert!(got[100..].iter().all(|&b| b == 0));

    // O_TRUNC right after a close (whose release may still be in flight).
    let p = mnt.join("retrunc");
    fs::write(&p, b"abcd").unwrap();
    let f = OpenOptions::new().write(true).truncate(true).open(&p).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 0, "fstat after O_TRUNC");
    drop(f);
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
}

fn check_directories(mnt: &Path) {
    let d = mnt.join("many");
    fs::create_dir(&d).unwrap();
    let n = 310;
    for i in 0..n {
        fs::File::create(d.join(format!("f{i:04}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let want: Vec<String> = (0..n).map(|i| format!("f{i:04}")).collect();
    assert_eq!(names, want, "readdir across pages");
    assert_eq!(fs::remove_dir(&d).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    for i in 0..n {
        fs::remove_file(d.join(format!("f{i:04}"))).unwrap();
    }
    fs::remove_dir(&d).unwrap();
    assert!(!d.exists());
    assert_eq!(fs::metadata(mnt.join("nope")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert_eq!(fs::create_dir(mnt).unwrap_err().raw_os_error(), Some(libc::EEXIST));
}

fn check_rename_links(mnt: &Path) {
    let (a, b) = (mnt.join("a"), mnt.join("b"));
    fs::create_dir_all(a.join("sub")).unwrap();
    fs::create_dir(&b).unwrap();
    fs::write(a.join("file"), b"renamed").unwrap();
    fs::rename(a.join("file"), b.join("moved")).unwrap();
    assert_eq!(fs::read(b.join("moved")).unwrap(), b"renamed");
    assert!(!a.join("file").exists());
    fs::write(a.join("sub/inner"), b"inner").unwrap();
    fs::rename(a.join("sub"), b.join("sub2")).unwrap();
    assert_eq!(fs::read(b.join("sub2/inner")).unwrap(), b"inner");
    // A directory into its own subtree: EINVAL.
    assert_eq!(fs::rename(&b, b.join("sub2/x")).unwrap_err().raw_os_error(), Some(libc::EINVAL));

    std::os::unix::fs::symlink("b/moved", mnt.join("ln")).unwrap();
    assert_eq!(fs::read_link(mnt.join("ln")).unwrap(), Path::new("b/moved"));
    assert!(fs::symlink_metadata(mnt.join("ln")).unwrap().file_type().is_symlink());
    assert_eq!(fs::read(mnt.join("ln")).unwrap(), b"renamed");

    fs::hard_link(b.join("moved"), a.join("hard")).unwrap();
    assert_eq!(fs::metadata(a.join("hard")).unwrap().nlink(), 2);
    assert_eq!(fs::read(a.join("hard")).unwrap(), b"renamed");
    fs::remove_file(b.join("moved")).unwrap();
    assert_eq!(fs::read(a.join("hard")).unwrap(), b"renamed");
}

fn check_attributes(mnt: &Path) {
    let p = mnt.join("attrs");
    fs::write(&p, b"x").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(&p, Some(1234), Some(5678)).unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    let when = UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    let f = fs::File::open(&p).unwrap();
    f.set_times(fs::FileTimes::new().set_accessed(when).set_modified(when)).unwrap();
    drop(f);
    let m = fs::metadata(&p).unwrap();
    assert_eq!(m.modified().unwrap(), when);
    assert_eq!(m.accessed().unwrap(), when);
    assert!(m.modified().unwrap() < SystemTime::now());
}

fn check_xattrs_statfs(mnt: &Path) {
    let p = mnt.join("xattrs");
    fs::write(&p, b"x").unwrap();
    let c = cpath(&p);
    let name = CString::new("user.color").unwrap();
    let value = b"blue";
    // SAFETY: valid NUL-terminated strings and buffers of the given lengths.
    unsafe {
        assert_eq!(libc::setxattr(c.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0), 0);
        let mut buf = [0u8; 64];
        let n = libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n as usize], value);
        assert_eq!(libc::getxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0), 4, "size query");
        let n = libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n as usize], b"user.color\0");
        assert_eq!(libc::setxattr(c.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), libc::XATTR_CREATE), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EEXIST));
        assert_eq!(libc::removexattr(c.as_ptr(), name.as_ptr()), 0);
        assert_eq!(libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODATA));

        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(cpath(mnt).as_ptr(), &mut st), 0);
        assert_eq!(st.f_namemax, 255);
        assert!(st.f_blocks > 0 && st.f_bsize > 0);
    }
}

/// Another user through `allow_other`: the caller's uid/gid reach meta.
fn check_other_user(mnt: &Path) {
    let nobody = 65534;
    let secret = mnt.join("root-only");
    fs::write(&secret, b"secret").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let shared = mnt.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    let as_nobody = |script: &str| Command::new("sh").args(["-c", script]).uid(nobody).gid(nobody).output().unwrap();
    let out = as_nobody(&format!("cat {}", secret.display()));
    assert!(!out.status.success(), "nobody read a 0600 root file");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    let mine = shared.join("mine");
    let out = as_nobody(&format!("echo hi > {}", mine.display()));
    assert!(out.status.success(), "{out:?}");
    let m = fs::metadata(&mine).unwrap();
    assert_eq!((m.uid(), m.gid()), (nobody, nobody), "owner of a file created by another user");
    assert_eq!(fs::read(&mine).unwrap(), b"hi\n");
    let out = as_nobody(&format!("chmod 600 {}", secret.display()));
    assert!(!out.status.success(), "nobody chmod-ed a root file");
}

fn check_cross_visibility(mnt: &Path, mgmtd: &str, meta: &str, scratch: &Path) {
    // Written through the mount, read with `fskv get`.
    let data = pattern(3 * MIB + 17, 7);
    fs::write(mnt.join("via-mount"), &data).unwrap();
    let out = scratch.join("got.bin");
    fskv(&["get", "--mgmtd", mgmtd, "--meta", meta, "/via-mount", out.to_str().unwrap()]);
    assert!(fs::read(&out).unwrap() == data, "fskv get of a file written through the mount");
    // Put with `fskv put`, read through the mount (large and small).
    for (name, len) in [("put-big", 2 * MIB + 5), ("put-small", 100)] {
        let data = pattern(len, 11);
        let local = scratch.join(name);
        fs::write(&local, &data).unwrap();
        fskv(&["put", "--mgmtd", mgmtd, "--meta", meta, local.to_str().unwrap(), &format!("/{name}")]);
        assert!(fs::read(mnt.join(name)).unwrap() == data, "{name} through the mount");
    }
    // The mount keeps a file's page cache across opens only while the
    // file is unchanged: rewritten elsewhere (same length, new bytes), the
    // next open reads the new bytes.
    let first = fs::read(mnt.join("put-big")).unwrap();
    assert!(fs::read(mnt.join("put-big")).unwrap() == first, "a second read of an unchanged file (from the page cache)");
    let data = pattern(2 * MIB + 5, 12);
    let local = scratch.join("put-big-2");
    fs::write(&local, &data).unwrap();
    fskv(&["put", "--mgmtd", mgmtd, "--meta", meta, local.to_str().unwrap(), "/put-big"]);
    assert!(fs::read(mnt.join("put-big")).unwrap() == data, "a file rewritten elsewhere is read fresh at the next open");
    // Rewritten elsewhere with another length, right after this mount read
    // and stat'ed it (the kernel holds its size for attr_ttl): the next
    // open sees the new size, longer and then shorter.
    for (i, len) in [3 * MIB + 9, MIB / 2 + 1].into_iter().enumerate() {
        assert_eq!(fs::read(mnt.join("put-big")).unwrap().len() as u64, fs::metadata(mnt.join("put-big")).unwrap().len());
        let data = pattern(len, 13 + i as u32);
        fs::write(&local, &data).unwrap();
        fskv(&["put", "--mgmtd", mgmtd, "--meta", meta, local.to_str().unwrap(), "/put-big"]);
        let got = fs::read(mnt.join("put-big")).unwrap();
        assert!(got == data, "a file rewritten elsewhere to {len} bytes read {} bytes at the next open", got.len());
    }
    // The same for a file this mount only stat'ed (never opened): its first
    // open after the change sees the new size.
    let data = pattern(2 * MIB, 15);
    fs::write(&local, &data).unwrap();
    fskv(&["put", "--mgmtd", mgmtd, "--meta", meta, local.to_str().unwrap(), "/put-stat"]);
    assert_eq!(fs::metadata(mnt.join("put-stat")).unwrap().len(), 2 * MIB as u64);
    let data = pattern(1000, 16);
    fs::write(&local, &data).unwrap();
    fskv(&["put", "--mgmtd", mgmtd, "--meta", meta, local.to_str().unwrap(), "/put-stat"]);
    let got = fs::read(mnt.join("put-stat")).unwrap();
    assert!(got == data, "a file stat'ed here and shrunk elsewhere read {} bytes at its first open", got.len());
}

/// The mount sets its kernel readahead window (`MountConfig::max_readahead_bytes`,
/// 4 MiB) through sysfs when it may (root); a 20 MiB file then reads back
/// intact sequentially with a cold page cache.
fn check_readahead(mnt: &Path) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = mnt.to_str().unwrap();
    let dev = info
        .lines()
        .rev()
        .find(|l| l.split(' ').nth(4) == Some(p))
        .and_then(|l| l.split(' ').nth(2))
        .expect("the mount in /proc/self/mountinfo")
        .to_string();
    let kb: u32 = fs::read_to_string(format!("/sys/class/bdi/{dev}/read_ahead_kb")).unwrap().trim().parse().unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(kb, 4096, "the mount should set its readahead window to 4 MiB");
    } else {
        println!("not root: the kernel's readahead window ({kb} KiB) stays");
    }
    let data = pattern(20 << 20, 77);
    fs::write(mnt.join("readahead"), &data).unwrap();
    // Dropping the page cache needs root; otherwise the read may be warm.
    let _ = fs::write("/proc/sys/vm/drop_caches", "1");
    assert!(fs::read(mnt.join("readahead")).unwrap() == data, "a sequential read through the readahead window differs");
    fs::remove_file(mnt.join("readahead")).unwrap();
}

/// Which of the first `pages` pages of `f` are in the page cache
/// (mincore(2) on a read-only mapping, which faults nothing in).
fn resident_pages(f: &fs::File, pages: usize) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    let len = pages * 4096;
    // SAFETY: a fresh shared read-only mapping of an open file; unmapped below.
    let addr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    assert_ne!(addr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    let mut vec = vec![0u8; pages];
    // SAFETY: `addr` maps `len` bytes; `vec` has one byte per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(addr, len) };
    assert_eq!(rc, 0, "mincore: {err}");
    vec.iter().map(|b| b & 1 == 1).collect()
}

/// Drops `f`'s clean cached pages and opens it for small random reads
/// (no kernel readahead: each read asks the mount for exactly its pages).
fn cold_random_reader(p: &Path) -> fs::File {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(p).unwrap();
    // SAFETY: fadvise on an open descriptor; no memory is passed.
    unsafe {
        assert_eq!(libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED), 0);
        assert_eq!(libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM), 0);
    }
    f
}

/// The indices of `f`'s cached pages among its first 256, once every page
/// of `want` is cached (stores come after a read's reply) or 10 s passed.
fn cached_pages_once(f: &fs::File, want: std::ops::Range<usize>) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = resident_pages(f, 256);
        if r[want.clone()].iter().all(|x| *x) || Instant::now() > deadline {
            return (0..256).filter(|i| r[*i]).collect();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Read-around (`MountConfig::read_around_bytes`, 32 KiB): a 4 KiB read
/// that misses the page cache leaves the rest of its aligned 32 KiB window
/// cached, and nothing beyond it; never while this mount has the file open
/// for writing; what a writer changes reads back afterwards.
fn check_read_around(mnt: &Path) {
    use std::os::unix::fs::FileExt;
    let p = mnt.join("read-around");
    let data = pattern(MIB, 91);
    fs::write(&p, &data).unwrap();
    let f = cold_random_reader(&p);
    let before = resident_pages(&f, 256);
    assert!(before.iter().all(|r| !r), "pages still cached after FADV_DONTNEED: {before:?}");
    // Page 10 (40 KiB) lies in the window of pages 8..16 (32..64 KiB).
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 40 << 10).unwrap();
    assert!(buf[..] == data[40 << 10..44 << 10], "a small read returned other bytes");
    // The window's other pages are stored after the read's reply.
    assert_eq!(cached_pages_once(&f, 8..16), (8..16).collect::<Vec<_>>(), "cached pages after one 4 KiB read at 40 KiB");
    // The stored pages hold the file's bytes.
    f.read_exact_at(&mut buf, 56 << 10).unwrap();
    assert!(buf[..] == data[56 << 10..60 << 10], "a read of a page stored around differs");
    drop(f);

    // A handle of this mount open for writing: no read-around.
    let w = OpenOptions::new().write(true).open(&p).unwrap();
    let f = cold_random_reader(&p);
    f.read_exact_at(&mut buf, 100 << 10).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(cached_pages_once(&f, 25..26), vec![25], "pages cached around a read while the file is open for writing");
    // The writer's bytes are what a cold read finds afterwards.
    w.write_all_at(&[7u8; 4096], 104 << 10).unwrap();
    drop(w);
    let f = cold_random_reader(&p);
    f.read_exact_at(&mut buf, 100 << 10).unwrap();
    assert!(buf[..] == data[100 << 10..104 << 10]);
    assert_eq!(cached_pages_once(&f, 24..32), (24..32).collect::<Vec<_>>(), "cached pages around a read after the writer closed");
    f.read_exact_at(&mut buf, 104 << 10).unwrap();
    assert!(buf.iter().all(|b| *b == 7), "the page stored around shows bytes from before the write");
    drop(f);
    // A truncate (by path: no handle of ours) inside a window: a read
    // around the new end stores nothing past it, and the size stays.
    let end = 110 << 10;
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::truncate(cpath(&p).as_ptr(), end) }, 0, "truncate: {}", std::io::Error::last_os_error());
    let f = cold_random_reader(&p);
    f.read_exact_at(&mut buf, 96 << 10).unwrap();
    assert!(buf[..] == data[96 << 10..100 << 10]);
    assert_eq!(cached_pages_once(&f, 24..28), (24..28).collect::<Vec<_>>(), "pages cached around a read near the end of a truncated file");
    assert_eq!(f.metadata().unwrap().len(), end as u64, "a store around a read changed the size");
    let mut tail = Vec::new();
    (&f).read_to_end(&mut tail).unwrap();
    assert_eq!(tail.len(), end as usize);
    assert!(
        tail[104 << 10..108 << 10].iter().all(|b| *b == 7) && tail[108 << 10..] == data[108 << 10..end as usize],
        "the bytes before the truncated end"
    );
    drop(f);
    fs::remove_file(&p).unwrap();
}

/// Read-around racing a writer of the same file in this mount (docs/fuse.md
/// "Read-around", the store gate): the file is rewritten whole with byte
/// `v` for `v` in 2..=VERSIONS while two threads open it again and again,
/// drop its cached pages and read random pages (so reads miss and windows
/// are stored around them). A reader that opened after version `v`'s
/// close returned must never see a byte older than `v`: a window read from
/// storage before a write and stored after it would show one. (Mutation
/// check: without the block at a writable open it fails within a run; it
/// does not reach the block at an open that drops another client's change,
/// nor the one at release, which close's flush leaves nothing to do.)
fn check_read_around_races_writers(mnt: &Path) {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicU8, Ordering};
    const FILE_BYTES: usize = 256 << 10;
    const READERS: u64 = 2;
    const VERSIONS: u8 = 250;
    let p = mnt.join("read-around-race");
    fs::write(&p, vec![1u8; FILE_BYTES]).unwrap();
    let closed = AtomicU8::new(1);
    let deadline = Instant::now() + Duration::from_secs(180);
    let reader = |seed: u64| {
        let mut rng = seed;
        let mut buf = vec![0u8; 4096];
        let mut reads = 0u64;
        loop {
            let done = closed.load(Ordering::SeqCst);
            let f = cold_random_reader(&p);
            for _ in 0..8 {
                let page = common::xorshift(&mut rng) % (FILE_BYTES as u64 / 4096);
                f.read_exact_at(&mut buf, page * 4096).unwrap();
                reads += 1;
                let oldest = buf.iter().copied().min().unwrap_or(0);
                assert!(oldest >= done, "page {page} read {oldest} after version {done}'s close returned (read {reads})");
            }
            if done == VERSIONS {
                return reads;
            }
            assert!(Instant::now() < deadline, "the writer did not finish {VERSIONS} versions in 180 s");
        }
    };
    let reads: u64 = std::thread::scope(|s| {
        let readers: Vec<_> = (0..READERS).map(|i| s.spawn(move || reader(0x9e37_79b9_7f4a_7c15 ^ (i << 32 | 1)))).collect();
        for v in 2..=VERSIONS {
            let w = OpenOptions::new().write(true).open(&p).unwrap();
            w.write_all_at(&vec![v; FILE_BYTES], 0).unwrap();
            drop(w);
            closed.store(v, Ordering::SeqCst);
        }
        readers.into_iter().map(|r| r.join().unwrap()).sum()
    });
    let all = fs::read(&p).unwrap();
    let wrong = all.iter().position(|b| *b != VERSIONS);
    assert!(
        all.len() == FILE_BYTES && wrong.is_none(),
        "the file after the last version: {} bytes, byte {wrong:?} is {:?}",
        all.len(),
        wrong.map(|i| all[i])
    );
    eprintln!("read-around race: {reads} reads by {READERS} readers while {} versions were written", VERSIONS - 1);
    fs::remove_file(&p).unwrap();
}

/// Long enough that closes released together share a batch even on a
/// loaded machine (check_deferred_closes).
const CLOSE_BATCH_DELAY_MS: u64 = 300;

fn meta_closes(meta: &str) -> (f64, f64) {
    let text = common::scrape_metrics(meta);
    let closes = common::metric_sum(&text, "fskv_meta_ops_total", &[("op", "close"), ("result", "ok")]);
    let batches = common::metric_sum(&text, "fskv_rpc_request_duration_seconds_count", &[("method", "meta.MetaBatchCall")]);
    (closes, batches)
}

/// Closes of files opened for writing and never written leave the mount in
/// batches (fskv_fuse::closes): every one reaches meta, `N` released
/// together in far fewer requests than `N`.
fn check_deferred_closes(mnt: &Path, meta: &str) {
    const N: usize = 100;
    let dir = mnt.join("quiet-closes");
    fs::create_dir(&dir).unwrap();
    let (closes0, batches0) = meta_closes(meta);
    let files: Vec<fs::File> = (0..N).map(|i| fs::File::create(dir.join(format!("f{i}"))).unwrap()).collect();
    drop(files);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (closes, batches) = meta_closes(meta);
        if closes - closes0 >= N as f64 {
            let sent = batches - batches0;
            assert!((1.0..=(N / 4) as f64).contains(&sent), "{N} closes released together went out in {sent} batch requests");
            break;
        }
        assert!(Instant::now() < deadline, "only {} of {N} deferred closes reached meta in 10 s", closes - closes0);
        std::thread::sleep(Duration::from_millis(20));
    }
    // A file whose close was deferred reads back as written: empty.
    assert_eq!(fs::metadata(dir.join("f0")).unwrap().len(), 0);
}

/// Closes still waiting for their batch at SIGTERM are sent before the
/// mount exits: a mount whose batches would wait a minute is stopped right
/// after 10 closes.
fn check_closes_sent_at_unmount(mgmtd: &str, meta: &str, mnt: &Path) {
    let Mounted::Yes(m) = start_mount(mgmtd, meta, mnt, 60_000) else { panic!("the second mount failed where the first worked") };
    let (closes0, _) = meta_closes(meta);
    let files: Vec<fs::File> = (0..10).map(|i| fs::File::create(mnt.join(format!("at-stop-{i}"))).unwrap()).collect();
    drop(files);
    // The kernel sends RELEASE in the background: let the mount receive them.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(meta_closes(meta).0, closes0, "a close left before its batch delay");
    stop_mount(m);
    let (closes, _) = meta_closes(meta);
    assert!(closes - closes0 >= 10.0, "only {} of 10 queued closes were sent before the mount exited", closes - closes0);
}

/// Without the close queue (`--close-batch-delay-ms 0`) every release sends
/// its close itself: quiet ones and ones that wrote, each reaching meta.
fn check_closes_without_the_queue(mgmtd: &str, meta: &str, mnt: &Path) {
    let Mounted::Yes(m) = start_mount(mgmtd, meta, mnt, 0) else { panic!("the third mount failed where the first worked") };
    let (closes0, _) = meta_closes(meta);
    for i in 0..4 {
        drop(fs::File::create(mnt.join(format!("unqueued-{i}"))).unwrap());
        fs::write(mnt.join(format!("unqueued-written-{i}")), b"bytes").unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while meta_closes(meta).0 - closes0 < 8.0 {
        assert!(Instant::now() < deadline, "only {} of 8 closes reached meta without the queue", meta_closes(meta).0 - closes0);
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_mount(m);
}

fn stop_mount(mut m: MountProc) {
    let mut child = m.child.take().unwrap();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "fskv mount exited with {status}");
            break;
        }
        assert!(Instant::now() < deadline, "fskv mount did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!is_mounted(&m.path), "still mounted after SIGTERM");
}

#[test]
fn fuse_mount_posix_surface_cross_visibility_and_clean_unmount() {
    if !common::fuse_or_skip("fuse_mount_posix_surface_cross_visibility_and_clean_unmount") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port();
    // Stopped even when a check fails (the guard's drop).
    let up = UpGuard { child: Some(start_up(&dir.path().join("data"), base)), mount: None };
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let meta = format!("127.0.0.1:{}", base + 12);
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let m = match start_mount(&mgmtd, &meta, &mnt, CLOSE_BATCH_DELAY_MS) {
        Mounted::Yes(m) => m,
        Mounted::Skip(why) => {
            up.stop();
            assert!(!common::fuse_required(), "mounting failed and FSKV_REQUIRE_FUSE=1: {why}");
            common::skip("fuse_mount_posix_surface_cross_visibility_and_clean_unmount", &why);
            return;
        }
    };
    let t0 = Instant::now();
    check_sizes(&mnt);
    check_hole_overwrite_truncate(&mnt);
    check_directories(&mnt);
    check_rename_links(&mnt);
    check_attributes(&mnt);
    check_xattrs_statfs(&mnt);
    check_other_user(&mnt);
    check_cross_visibility(&mnt, &mgmtd, &meta, dir.path());
    check_readahead(&mnt);
    check_read_around(&mnt);
    check_read_around_races_writers(&mnt);
    check_deferred_closes(&mnt, &meta);
    println!("checks took {:?}", t0.elapsed());
    // A file held open makes umount(2) fail with EBUSY: the mount detaches
    // lazily and the process still exits.
    let busy = fs::File::open(mnt.join("via-mount")).unwrap();
    stop_mount(m);
    drop(busy);
    check_closes_sent_at_unmount(&mgmtd, &meta, &mnt);
    check_closes_without_the_queue(&mgmtd, &meta, &mnt);
    up.stop();
}

#[test]
fn up_with_mount_serves_the_filesystem_and_unmounts_at_stop() {
    if !common::fuse_or_skip("up_with_mount_serves_the_filesystem_and_unmounts_at_stop") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port();
    let mnt = dir.path().join("mnt");
    let up = UpGuard {
        child: Some(start_up_with(&dir.path().join("data"), base, &["--mount", mnt.to_str().unwrap()])),
        mount: Some(mnt.clone()),
    };
    assert!(is_mounted(&mnt), "fskv up reported ready without the mount");
    let data = pattern(MIB + 3, 5);
    fs::write(mnt.join("f"), &data).unwrap();
    assert!(fs::read(mnt.join("f")).unwrap() == data);
    // The mount's metrics (P+16) count what it just served.
    let scraped = fskv(&["admin", "metrics", "--addr", &format!("127.0.0.1:{}", base + 16)]);
    let text = String::from_utf8_lossy(&scraped.stdout);
    for series in ["fskv_fuse_ops_total{op=\"create\"}", "fskv_fuse_op_duration_seconds_count{op=\"read\"}", "fskv_fuse_ops_in_flight"] {
        assert!(text.contains(series), "no {series} in the mount's metrics:\n{text}");
    }
    let meta = format!("127.0.0.1:{}", base + 12);
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let out = dir.path().join("f.out");
    fskv(&["get", "--mgmtd", &mgmtd, "--meta", &meta, "/f", out.to_str().unwrap()]);
    assert!(fs::read(&out).unwrap() == data);
    // Asserts that the mount is gone once fskv up stopped.
    up.stop();
}
