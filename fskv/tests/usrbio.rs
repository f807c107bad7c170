//! USRBIO through a real mount (`fskv up --mount`) with the Rust API of
//! `fskv-usrbio`: reads and writes against the same operations through
//! FUSE, holes, errors, visibility; kill -9 of a program with 128 requests
//! in flight (the daemon cleans up); kill -9 of a storage node during
//! USRBIO writes (completed, fsync'ed writes survive). Skips (printing why)
//! without /dev/fuse; with `FSKV_REQUIRE_FUSE=1` a missing /dev/fuse fails.

mod common;

use common::{child_pid, free_base_port, is_mounted, start_up_with, UpGuard};
use fskv_usrbio::proto::FLAG_FORBID_READ_HOLES;
use fskv_usrbio::{File, Iov, Ring, RingOptions};
use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: usize = 1 << 20;

fn fuse_available() -> bool {
    if Path::new("/dev/fuse").exists() {
        return true;
    }
    if std::env::var("FSKV_REQUIRE_FUSE").is_ok_and(|v| v == "1") {
        panic!("FSKV_REQUIRE_FUSE=1 but /dev/fuse is missing");
    }
    println!("SKIPPED: /dev/fuse is missing (no FUSE here; USRBIO is served by the FUSE daemon)");
    false
}

struct Cluster {
    up: UpGuard,
    mnt: PathBuf,
    data: PathBuf,
}

fn start_cluster(dir: &Path, extra: &[&str]) -> Cluster {
    let base = free_base_port();
    let mnt = dir.join("mnt");
    let data = dir.join("data");
    let mut args = vec!["--mount", mnt.to_str().unwrap()];
    args.extend_from_slice(extra);
    let child = start_up_with(&data, base, &args);
    let up = UpGuard { child: Some(child), mount: Some(mnt.clone()) };
    assert!(is_mounted(&mnt), "fskv up reported ready without the mount");
    Cluster { up, mnt, data }
}

fn pattern(seed: u64, off: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let x = (off + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        *b = (x >> 29) as u8;
    }
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Reads through USRBIO and through FUSE (`pread`) agree, byte for byte
/// and in length, for random unaligned ranges (some past EOF); writes
/// through USRBIO are visible through FUSE after completion + fsync.
fn check_reads_and_writes(mnt: &Path) {
    let path = mnt.join("rw.bin");
    let len = 5 * MIB as u64 + 12_345;
    let mut content = vec![0u8; len as usize];
    pattern(1, 0, &mut content);
    fs::write(&path, &content).expect("write through FUSE");

    let f = OpenOptions::new().read(true).write(true).open(&path).expect("open");
    let file = File::register(&f).expect("register");
    let iov = Iov::create(mnt, 64 * MIB).expect("iov");
    let ring = Ring::create(mnt, RingOptions::reads(64)).expect("ring");
    let mut rng = 0x1234_5678_u64;
    for round in 0..5 {
        let mut wanted = Vec::new();
        for i in 0..40u64 {
            let off = xorshift(&mut rng) % (len + 1000);
            let n = 1 + (xorshift(&mut rng) % (3 * MIB as u64)) as usize;
            let buf = iov.buf(i as usize * MIB * 3 / 2, n.min(MIB * 3 / 2)).expect("buf");
            let n = buf.len();
            ring.prepare(buf, &file, off, i).map_err(|(e, _)| e).expect("prepare");
            wanted.push((off, n));
        }
        ring.submit();
        let done = ring.wait(40, Some(Duration::from_secs(60))).expect("wait");
        assert_eq!(done.len(), 40, "round {round}: completions");
        for c in done {
            let (off, n) = wanted[c.userdata as usize];
            let got = c.result.expect("read result");
            let mut via_fuse = vec![0u8; n];
            let fuse_n = f.read_at(&mut via_fuse, off).expect("pread");
            assert_eq!(got, fuse_n, "round {round}: length of a read of {n} at {off} (file {len})");
            assert!(c.buf[..got] == via_fuse[..fuse_n], "round {round}: data of a read of {n} at {off}");
        }
    }
    drop(ring);

    // Writes: random ranges, then fsync; FUSE sees them in a fresh open.
    let wring = Ring::create(mnt, RingOptions::writes(32)).expect("write ring");
    let mut model = content.clone();
    for round in 0..4u64 {
        let mut n_req = 0;
        for i in 0..16u64 {
            let off = xorshift(&mut rng) % (len + 3 * MIB as u64);
            let n = 1 + (xorshift(&mut rng) % (MIB as u64)) as usize;
            let mut buf = iov.buf(i as usize * MIB, n).expect("buf");
            pattern(100 + round * 16 + i, off, &mut buf);
            let end = off as usize + n;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&buf);
            wring.prepare(buf, &file, off, i).map_err(|(e, _)| e).expect("prepare write");
            n_req += 1;
            // Overlapping writes of one batch land in an unspecified order: wait per request.
            wring.submit();
            let c = wring.wait(1, Some(Duration::from_secs(60))).expect("wait write");
            assert_eq!(c.len(), 1);
            assert_eq!(c[0].result.as_ref().ok(), Some(&n), "write of {n} at {off}");
        }
        assert_eq!(n_req, 16);
    }
    f.sync_all().expect("fsync");
    let back = fs::read(&path).expect("read back through FUSE");
    assert_eq!(back.len(), model.len(), "length after fsync");
    assert!(back == model, "content after USRBIO writes + fsync");
    // The writer's own fd sees it too (same mount: the kernel's cached pages were dropped).
    let mut through_fd = vec![0u8; model.len()];
    f.read_exact_at(&mut through_fd, 0).expect("read through the writer's fd");
    assert!(through_fd == model, "content through the writing fd");
    println!("reads and writes: ok ({} bytes)", model.len());
}

/// A file with a hole: zeros through a normal ring, `ENODATA` through a
/// ring with `FORBID_READ_HOLES`; reads past EOF are short.
fn check_holes(mnt: &Path) {
    let path = mnt.join("holes.bin");
    {
        let mut f = fs::File::create(&path).expect("create");
        f.write_all(&[7u8; 1000]).expect("head");
        f.seek(SeekFrom::Start(3 * MIB as u64)).expect("seek");
        f.write_all(&[9u8; 1000]).expect("tail");
    }
    let f = fs::File::open(&path).expect("open");
    let file = File::register(&f).expect("register");
    let iov = Iov::create(mnt, 4 * MIB).expect("iov");
    let plain = Ring::create(mnt, RingOptions::reads(8)).expect("ring");
    let strict = Ring::create(mnt, RingOptions { flags: FLAG_FORBID_READ_HOLES, ..RingOptions::reads(8) }).expect("strict ring");
    for (ring, name) in [(&plain, "plain"), (&strict, "strict")] {
        let whole = iov.buf(0, 4 * MIB).expect("buf");
        ring.prepare(whole, &file, 0, 1).map_err(|(e, _)| e).expect("prepare");
        let head = iov.buf(0, 1).ok();
        assert!(head.is_none(), "the buffer is leased to the ring");
        ring.submit();
        let c = ring.wait(1, Some(Duration::from_secs(30))).expect("wait").pop().expect("completion");
        if name == "plain" {
            let n = *c.result.as_ref().expect("plain read");
            assert_eq!(n, 3 * MIB + 1000, "short at EOF");
            assert!(c.buf[..1000].iter().all(|&b| b == 7));
            assert!(c.buf[1000..3 * MIB].iter().all(|&b| b == 0), "the hole reads as zeros");
            assert!(c.buf[3 * MIB..n].iter().all(|&b| b == 9));
        } else {
            let e = c.result.as_ref().expect_err("a read across a hole with FORBID_READ_HOLES");
            assert_eq!(e.raw_os_error(), Some(libc::ENODATA), "{e}");
        }
        drop(c);
        // Entirely past EOF: 0 bytes, on both rings.
        let b = iov.buf(0, 100).expect("buf");
        ring.prepare(b, &file, 10 * MIB as u64, 2).map_err(|(e, _)| e).expect("prepare");
        ring.submit();
        let c = ring.wait(1, Some(Duration::from_secs(30))).expect("wait").pop().expect("completion");
        assert_eq!(c.result.expect("past EOF"), 0, "{name}: past EOF");
    }
    println!("holes: ok");
}

#[test]
fn usrbio_through_a_mount() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start_cluster(dir.path(), &[]);
    let virt = c.mnt.join("3fs-virt/iovs");
    assert!(virt.join("submit-ios").symlink_metadata().is_ok(), "the doorbell link");
    let root: Vec<String> =
        fs::read_dir(&c.mnt).expect("readdir").map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
    assert!(!root.iter().any(|n| n == "3fs-virt"), "3fs-virt is not listed in the root: {root:?}");
    check_reads_and_writes(&c.mnt);
    check_holes(&c.mnt);
    let left: Vec<String> =
        fs::read_dir(&virt).expect("readdir iovs").map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
    assert_eq!(left, vec!["submit-ios".to_string()], "every iov and ring deregistered on drop");
    let _ = &c.data;
    c.up.stop();
}
