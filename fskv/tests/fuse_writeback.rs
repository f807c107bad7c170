//! The FUSE mount's write-behind rules (issue #21, `client/fuse/src/writeback.rs`,
//! `docs/fuse.md` "Write-behind"), against `fskv up` with `fskv mount` run
//! by the test (so the test can kill it):
//!
//! * read-your-writes in one mount: 4 KiB writes without fsync are seen at
//!   once by `fstat`, by `pread` on the same fd and on another fd;
//! * visibility to another client (`fskv get`, the native client) once
//!   close(2) returned;
//! * kill -9 of the FUSE daemon loses only unsynced bytes: everything before
//!   an fsync reads back exactly through another client; past it, bytes
//!   are either what was written or absent (never other bytes);
//! * a background flush that fails (every storage process killed, none
//!   restarted) is reported by the next fsync(2) with EIO.
//!
//! Skips (with a printed reason) without /dev/fuse.

mod common;

use common::{child_pid, free_base_port, fskv_ok, is_mounted, start_up_with, UpGuard};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// The tests each start a cluster; run together they could pick the same
/// free ports and meet each other's cluster.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pattern(seed: u64, off: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let x = (off + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        *b = (x >> 29) as u8;
    }
}

fn expected(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pattern(seed, 0, &mut v);
    v
}

/// Writes `len` bytes of `seed`'s pattern from `start` in 4 KiB `pwrite`s.
fn write_small(f: &File, seed: u64, start: usize, len: usize) {
    let mut buf = vec![0u8; 4 * KIB];
    let mut off = start;
    while off < start + len {
        let n = (4 * KIB).min(start + len - off);
        pattern(seed, off as u64, &mut buf[..n]);
        f.write_all_at(&buf[..n], off as u64).expect("pwrite through the mount");
        off += n;
    }
}

/// `fskv mount` started by the test (not by `fskv up`), so it can be killed.
struct Mount {
    child: Option<Child>,
    path: PathBuf,
}

impl Mount {
    fn start(mgmtd: &str, path: &Path) -> Mount {
        fs::create_dir_all(path).expect("mount point");
        let child = common::fskv_cmd()
            .args(["mount", "--mgmtd", mgmtd])
            .arg(path)
            .env("FSKV_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn fskv mount");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !is_mounted(path) {
            assert!(Instant::now() < deadline, "fskv mount did not mount within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Mount { child: Some(child), path: path.to_path_buf() }
    }

    /// SIGKILL, then a lazy unmount of the dead mount point.
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.path) {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stop();
    }
}

fn get(mgmtd: &str, remote: &str, scratch: &Path) -> Vec<u8> {
    let local = scratch.join(remote.trim_start_matches('/').replace('/', "_"));
    fskv_ok(&["get", "--mgmtd", mgmtd, remote, local.to_str().expect("utf-8 path")]);
    fs::read(&local).expect("read what fskv get wrote")
}

#[test]
fn fuse_write_behind_read_your_writes_visibility_kill9_and_flush_errors() {
    if !common::fuse_or_skip("fuse_write_behind_read_your_writes_visibility_kill9_and_flush_errors") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_base_port();
    let data = dir.path().join("data");
    let scratch = dir.path().join("scratch");
    fs::create_dir_all(&scratch).expect("scratch");
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    // No restarts: the last part kills storage and must find it gone.
    let up = UpGuard { child: Some(start_up_with(&data, base, &["--replicas", "1", "--no-restart"])), mount: None };
    let mnt = dir.path().join("mnt");
    let mut mount = Mount::start(&mgmtd, &mnt);

    // 1. Read-your-writes inside the mount, before any fsync.
    let len_a = 6 * MIB + 1234;
    let a = OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(0o644).open(mnt.join("a.bin")).expect("create a");
    let t = Instant::now();
    write_small(&a, 1, 0, len_a);
    let secs = t.elapsed().as_secs_f64();
    println!("{} 4 KiB writes in {secs:.2} s ({:.1} MiB/s, no fsync)", len_a.div_ceil(4 * KIB), len_a as f64 / MIB as f64 / secs);
    assert_eq!(a.metadata().expect("fstat").len(), len_a as u64, "fstat sees the buffered end");
    let want_a = expected(1, len_a);
    let other = File::open(mnt.join("a.bin")).expect("open a again");
    for (off, n) in [(0usize, 4 * KIB), (512 * KIB - 3, 9 * KIB), (len_a - 5000, 5000), (3 * MIB + 17, MIB)] {
        let mut got = vec![0u8; n];
        a.read_exact_at(&mut got, off as u64).expect("pread on the writing fd");
        assert!(got == want_a[off..off + n], "same fd: bytes at {off} differ");
        let mut got2 = vec![0u8; n];
        other.read_exact_at(&mut got2, off as u64).expect("pread on another fd");
        assert!(got2 == want_a[off..off + n], "other fd: bytes at {off} differ");
    }
    // An overwrite in the middle, also unsynced, read back at once.
    let patch = vec![0xAB; 10_000];
    a.write_all_at(&patch, 100_000).expect("overwrite");
    let mut got = vec![0u8; 10_000];
    other.read_exact_at(&mut got, 100_000).expect("pread the overwrite");
    assert!(got == patch, "the overwrite is not seen by another fd of the mount");
    drop(other);
    drop(a); // close(2): flush + release
    let mut want_a2 = want_a.clone();
    want_a2[100_000..110_000].copy_from_slice(&patch);

    // 2. Another client sees it all once close(2) returned.
    let got = get(&mgmtd, "/a.bin", &scratch);
    assert_eq!(got.len(), len_a, "fskv get: length after close");
    assert!(got == want_a2, "fskv get: content after close differs");
    println!("read-your-writes and visibility after close: ok");

    // 3. kill -9 of the FUSE daemon loses only what was not fsync'ed.
    let synced = 4 * MIB + 4 * KIB;
    let b = OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(mnt.join("b.bin")).expect("create b");
    write_small(&b, 2, 0, synced);
    b.sync_all().expect("fsync b");
    write_small(&b, 2, synced, 2 * MIB);
    mount.kill9();
    drop(b);
    let got = get(&mgmtd, "/b.bin", &scratch);
    assert!(got.len() >= synced, "fskv get: b has {} bytes, fewer than the {synced} fsync'ed", got.len());
    let want_b = expected(2, synced + 2 * MIB);
    assert!(got[..synced] == want_b[..synced], "fsync'ed bytes differ after kill -9 of the mount");
    // Past the fsync: written bytes, or zeros where a flush did not land.
    let bad = (synced..got.len()).find(|&i| got[i] != want_b[i] && got[i] != 0);
    assert_eq!(bad, None, "bytes past the fsync are neither written nor zero");
    println!("kill -9 of the mount: {} of {} bytes after the fsync survived", got.len() - synced, 2 * MIB);

    // 4. A failed background flush is reported by the next fsync.
    let mut mount = Mount::start(&mgmtd, &mnt);
    let c = OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(mnt.join("c.bin")).expect("create c");
    for node in 1..=3 {
        let name = format!("storage-{node}");
        let pid = child_pid(&data, &name).unwrap_or_else(|| panic!("pid of {name}"));
        // SAFETY: kill(2) on a process of the cluster this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    }
    std::thread::sleep(Duration::from_millis(200));
    write_small(&c, 3, 0, 64 * KIB); // buffered: write(2) succeeds
    let t = Instant::now();
    let r = c.sync_all();
    println!("fsync with every storage process dead: {r:?} after {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(r.as_ref().map_err(|e| e.raw_os_error()), Err(Some(libc::EIO)), "fsync after a failed background flush");
    drop(c);
    mount.stop();
    drop(mount);
    // Storage is gone: `fskv up` may not exit cleanly; the guard stops it.
    drop(up);
}

/// Namespace changes through the mount are committed relaxed (acknowledged
/// once in meta's log, fsync'ed by fsync(2), fsyncdir(2) or meta's 100 ms
/// timer): a kill -9 of meta right after them loses none, and the mount goes
/// on working once the supervisor restarted meta.
#[test]
fn fuse_relaxed_metadata_survives_kill9_of_meta() {
    if !common::fuse_or_skip("fuse_relaxed_metadata_survives_kill9_of_meta") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_base_port();
    let data = dir.path().join("data");
    let mnt = dir.path().join("mnt");
    let up = UpGuard { child: Some(start_up_with(&data, base, &["--mount", mnt.to_str().expect("utf-8")])), mount: Some(mnt.clone()) };
    assert!(is_mounted(&mnt), "fskv up reported ready without the mount");
    let work = mnt.join("many");
    fs::create_dir(&work).expect("mkdir");
    let n = 300;
    let t = Instant::now();
    for i in 0..n {
        fs::write(work.join(format!("f{i}")), format!("{i}")).expect("create through the mount");
    }
    fs::rename(work.join("f0"), work.join("renamed")).expect("rename");
    let secs = t.elapsed().as_secs_f64();
    println!("{n} small files created in {secs:.2} s ({:.0} /s), no fsync", f64::from(n) / secs);
    let pid = child_pid(&data, "meta").expect("pid of meta");
    // SAFETY: kill(2) on a process of the cluster this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // The mount's meta calls retry while the supervisor restarts meta.
    let deadline = Instant::now() + Duration::from_secs(60);
    let names = loop {
        match fs::read_dir(&work).and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect::<Result<Vec<_>, _>>()) {
            Ok(names) if child_pid(&data, "meta").is_some_and(|p| p != pid) => break names,
            Ok(_) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            other => panic!("the directory is not readable 60 s after meta was killed: {other:?}"),
        }
    };
    assert_eq!(names.len(), n as usize, "entries after kill -9 of meta");
    assert!(!work.join("f0").exists() && work.join("renamed").exists(), "the rename did not survive");
    for i in 1..n {
        assert_eq!(fs::read_to_string(work.join(format!("f{i}"))).expect("read back"), format!("{i}"));
    }
    // The xattrs `ls -l` probes on every entry: ACLs are unsupported
    // (EOPNOTSUPP, answered by the mount), a missing SELinux label is
    // ENODATA (cached after the first answer).
    let path = std::ffi::CString::new(work.join("f1").as_os_str().as_encoded_bytes()).expect("path");
    for (name, want) in
        [("system.posix_acl_access", libc::EOPNOTSUPP), ("security.selinux", libc::ENODATA), ("security.selinux", libc::ENODATA)]
    {
        let name_c = std::ffi::CString::new(name).expect("name");
        // SAFETY: valid NUL-terminated strings; a size query (null buffer, 0).
        let r = unsafe { libc::getxattr(path.as_ptr(), name_c.as_ptr(), std::ptr::null_mut(), 0) };
        let err = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((r, err), (-1, Some(want)), "getxattr {name}");
    }
    // fsyncdir and fsync reach meta's barrier and succeed.
    File::open(&work).expect("open dir").sync_all().expect("fsyncdir");
    let f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(work.join("synced")).expect("create");
    f.sync_all().expect("fsync");
    drop(f);
    up.stop();
}
