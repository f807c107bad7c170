//! Data integrity through the FUSE mount (issue #7), against `fskv up --mount`:
//!
//! * `fuse_data_integrity_matrix`: files of many sizes (around pages, the
//!   layout's chunk size, MiB boundaries, up to 200 MiB), holes, overwrites in
//!   the middle, truncate down and up, four concurrent writers, random reads;
//!   everything compared against a model, through the mount and with
//!   `fskv get`; a file put with `fskv put` read through the mount.
//! * `fuse_writes_survive_kill9_of_a_storage_node`: a writer (write, fsync,
//!   close per file) through the mount while one storage process is killed
//!   with SIGKILL and restarted by the supervisor; every file whose fsync
//!   succeeded reads back intact, and the cluster is healthy again.
//!
//! File contents come from a position-addressed seeded generator
//! ([`fill`]): the byte at file offset `o` written with seed `s` is a function
//! of `(s, o)`. A file's model is its length plus the extents written with
//! each seed (the rest reads as zeros), so expected bytes are regenerated
//! piece by piece: no file is ever held whole in memory, and a mismatch is
//! reported at its exact offset. Skips (with a printed reason) without
//! /dev/fuse.

mod common;

use common::{child_pid, cluster_healthy, free_base_port, fskv_ok, is_mounted, start_up_with, wait_cluster_healthy, UpGuard};
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The root layout's chunk size (`MetaConfig::default().root_layout`, which
/// `fskv meta` keeps when it builds the layout from mgmtd's chain table).
const CHUNK: u64 = 512 * KIB;
/// Writes and reads go in pieces of at most this many bytes.
const PIECE: usize = MIB as usize;

/// The two tests each start a cluster and move hundreds of MiB; on a
/// 2-core machine they must not run at the same time.
static SERIAL: Mutex<()> = Mutex::new(());

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the bytes at file offsets `off..` of the stream `seed`.
fn fill(seed: u64, off: u64, buf: &mut [u8]) {
    let key = splitmix(seed);
    let (mut pos, mut i) = (off, 0);
    while i < buf.len() {
        let word = splitmix(key ^ (pos / 8)).to_le_bytes();
        let b = (pos % 8) as usize;
        let n = (8 - b).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[b..b + n]);
        i += n;
        pos += n as u64;
    }
}

/// Expected content of one file: its length and the extents `(start, end,
/// seed)` (sorted, disjoint) written with each seed; other bytes are zeros.
#[derive(Clone, Debug, Default)]
struct Model {
    len: u64,
    extents: Vec<(u64, u64, u64)>,
}

impl Model {
    fn cut(&mut self, from: u64, to: u64) {
        let mut out = Vec::with_capacity(self.extents.len() + 1);
        for &(s, e, seed) in &self.extents {
            if e <= from || s >= to {
                out.push((s, e, seed));
                continue;
            }
            if s < from {
                out.push((s, from, seed));
            }
            if e > to {
                out.push((to, e, seed));
            }
        }
        self.extents = out;
    }

    fn write(&mut self, off: u64, len: u64, seed: u64) {
        if len == 0 {
            return;
        }
        self.cut(off, off + len);
        self.extents.push((off, off + len, seed));
        self.extents.sort_unstable();
        self.len = self.len.max(off + len);
    }

    fn truncate(&mut self, len: u64) {
        self.cut(len, u64::MAX);
        self.len = len;
    }

    /// The expected bytes at `off..off + buf.len()`.
    fn expected(&self, off: u64, buf: &mut [u8]) {
        buf.fill(0);
        let end = off + buf.len() as u64;
        for &(s, e, seed) in &self.extents {
            let (a, b) = (s.max(off), e.min(end));
            if a < b {
                fill(seed, a, &mut buf[(a - off) as usize..(b - off) as usize]);
            }
        }
    }
}

/// Writes `len` bytes of stream `seed` at `off` (pieces of `piece` bytes)
/// and records it in the model.
fn write_range(f: &File, m: &mut Model, off: u64, len: u64, seed: u64, piece: usize) {
    let mut buf = vec![0u8; piece];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(piece as u64) as usize;
        fill(seed, off + done, &mut buf[..n]);
        f.write_all_at(&buf[..n], off + done).unwrap_or_else(|e| panic!("write at {}: {e}", off + done));
        done += n as u64;
    }
    m.write(off, len, seed);
}

/// A new file at `path` holding `len` bytes of stream `seed`.
fn create_file(path: &Path, len: u64, seed: u64) -> Model {
    let f = File::create(path).unwrap_or_else(|e| panic!("create {path:?}: {e}"));
    let mut m = Model::default();
    write_range(&f, &mut m, 0, len, seed, PIECE);
    f.sync_all().unwrap_or_else(|e| panic!("fsync {path:?}: {e}"));
    m
}

/// Reads `r` to its end in pieces and compares with the model: the same
/// length, the same bytes (the first difference is reported by offset).
fn verify_stream(r: impl Read, m: &Model, what: &str) {
    if let Err(e) = check_stream(r, m, what) {
        panic!("{e}");
    }
}

fn check_stream(mut r: impl Read, m: &Model, what: &str) -> Result<(), String> {
    let (mut got, mut want) = (vec![0u8; PIECE], vec![0u8; PIECE]);
    let mut off = 0u64;
    loop {
        let mut n = 0;
        while n < PIECE {
            match r.read(&mut got[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{what}: read at {}: {e}", off + n as u64)),
            }
        }
        if n == 0 {
            break;
        }
        if off + n as u64 > m.len {
            return Err(format!("{what}: longer than the model's {} bytes (read {} so far)", m.len, off + n as u64));
        }
        m.expected(off, &mut want[..n]);
        if got[..n] != want[..n] {
            let i = (0..n).find(|&i| got[i] != want[i]).unwrap_or(0);
            let bad = (0..n).filter(|&i| got[i] != want[i]).count();
            return Err(format!(
                "{what}: bytes differ at offset {} (got {:#04x}, want {:#04x}; {bad} of the {n} bytes read at {off} differ; model {m:?})",
                off + i as u64,
                got[i],
                want[i]
            ));
        }
        off += n as u64;
    }
    if off != m.len {
        return Err(format!("{what}: {off} bytes, shorter than the model (model {m:?})"));
    }
    Ok(())
}

fn verify_path(path: &Path, m: &Model) {
    let f = File::open(path).unwrap_or_else(|e| panic!("open {path:?}: {e}"));
    assert_eq!(f.metadata().expect("fstat").len(), m.len, "size of {path:?} (model {m:?})");
    verify_stream(f, m, &path.display().to_string());
}

/// `count` positional reads at seeded random offsets and lengths (crossing
/// chunk boundaries and the end of the file).
fn verify_random_reads(path: &Path, m: &Model, seed: u64, count: u64) {
    let f = File::open(path).unwrap_or_else(|e| panic!("open {path:?}: {e}"));
    for i in 0..count {
        let r = splitmix(seed * 1000 + i);
        let off = r % (m.len + 1);
        let len = (splitmix(r) % (3 * CHUNK)) as usize;
        let mut got = vec![0u8; len];
        let mut n = 0;
        while n < len {
            match f.read_at(&mut got[n..], off + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => panic!("{path:?}: pread({off}, {len}): {e}"),
            }
        }
        let want_len = (m.len.saturating_sub(off)).min(len as u64) as usize;
        assert_eq!(n, want_len, "{path:?}: pread({off}, {len}) returned {n} bytes");
        let mut want = vec![0u8; n];
        m.expected(off, &mut want);
        assert!(got[..n] == want[..], "{path:?}: pread({off}, {len}) returned wrong bytes");
    }
}

/// `fskv get` of `remote` into a scratch file compared with the model (the
/// native client sees what the mount wrote); the scratch file is removed.
fn verify_get(mgmtd: &str, meta: &str, remote: &str, m: &Model, scratch: &Path) {
    let local = scratch.join("get.out");
    fskv_ok(&["get", "--mgmtd", mgmtd, "--meta", meta, remote, local.to_str().unwrap()]);
    let f = File::open(&local).expect("open the file fskv get wrote");
    verify_stream(f, m, &format!("fskv get {remote}"));
    fs::remove_file(&local).expect("remove the scratch file");
}

struct Cluster {
    up: UpGuard,
    mnt: PathBuf,
    data: PathBuf,
    mgmtd: String,
    meta: String,
}

fn start_cluster(dir: &Path) -> Cluster {
    let base = free_base_port();
    let mnt = dir.join("mnt");
    let data = dir.join("data");
    let child = start_up_with(&data, base, &["--mount", mnt.to_str().unwrap()]);
    let up = UpGuard { child: Some(child), mount: Some(mnt.clone()) };
    assert!(is_mounted(&mnt), "fskv up reported ready without the mount");
    Cluster { up, mnt, data, mgmtd: format!("127.0.0.1:{}", base + 11), meta: format!("127.0.0.1:{}", base + 12) }
}

/// The test's scratch directory; with `FSKV_TEST_KEEP=1` it is kept (and
/// printed) for the logs in `data/logs`.
fn scratch_dir() -> tempfile::TempDir {
    let mut dir = tempfile::tempdir().expect("tempdir");
    if std::env::var_os("FSKV_TEST_KEEP").is_some() {
        println!("keeping {}", dir.path().display());
        dir.disable_cleanup(true);
    }
    dir
}

#[test]
fn fuse_data_integrity_matrix() {
    if !common::fuse_or_skip("fuse_data_integrity_matrix") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let dir = scratch_dir();
    let c = start_cluster(dir.path());
    let mnt = c.mnt.clone();
    println!("cluster up and mounted in {:?}", t0.elapsed());
    // name → model of every file made through the mount.
    let mut files: Vec<(String, Model)> = Vec::new();

    // Sizes around pages, MiB and chunk boundaries, and two large files.
    let t = Instant::now();
    let sizes = [0, 1, 4095, 4096, 4097, MIB - 1, MIB, MIB + 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 7, 64 * MIB, 200 * MIB];
    for (i, len) in sizes.into_iter().enumerate() {
        let name = format!("size-{len}");
        let m = create_file(&mnt.join(&name), len, 100 + i as u64);
        files.push((name, m));
    }
    println!("sizes written in {:?}", t.elapsed());

    // An unaligned writer: pieces of CHUNK + 13 bytes.
    let mut m = Model::default();
    let f = File::create(mnt.join("odd-pieces")).expect("create odd-pieces");
    write_range(&f, &mut m, 0, 9 * MIB + 333, 7, (CHUNK + 13) as usize);
    drop(f);
    files.push(("odd-pieces".into(), m));

    // Holes: a write far past the end of a new file (whole chunks missing),
    // then past the end of an existing one, ending inside a chunk.
    let mut m = Model::default();
    let f = File::create(mnt.join("holes")).expect("create holes");
    write_range(&f, &mut m, 5 * MIB + 123, 1000, 21, PIECE);
    write_range(&f, &mut m, 11 * CHUNK - 10, 20, 22, PIECE);
    write_range(&f, &mut m, 100, 4000, 23, PIECE);
    drop(f);
    assert_eq!(m.len, 11 * CHUNK + 10);
    files.push(("holes".into(), m));
    let (name, mut m) = files.iter().find(|(n, _)| n == "size-4097").cloned().expect("size-4097");
    let f = OpenOptions::new().write(true).open(mnt.join(&name)).expect("open size-4097");
    write_range(&f, &mut m, 3 * MIB + 5, 7, 24, PIECE);
    drop(f);
    files.iter_mut().find(|(n, _)| *n == name).expect("size-4097").1 = m;

    // Overwrites in the middle: across a chunk boundary of the 64 MiB file,
    // 3 MiB at an unaligned offset, one byte.
    let name = format!("size-{}", 64 * MIB);
    let mut m = files.iter().find(|(n, _)| *n == name).expect("64 MiB file").1.clone();
    let f = OpenOptions::new().write(true).open(mnt.join(&name)).expect("open 64 MiB file");
    write_range(&f, &mut m, 17 * CHUNK - 100, 300, 31, PIECE);
    write_range(&f, &mut m, 20 * MIB + 4095, 3 * MIB, 32, PIECE);
    write_range(&f, &mut m, 63 * MIB, 1, 33, PIECE);
    f.sync_all().expect("fsync 64 MiB file");
    drop(f);
    files.iter_mut().find(|(n, _)| *n == name).expect("64 MiB file").1 = m;

    // Truncate down and up: through an open fd (ftruncate) and by path
    // (truncate(2)); bytes cut off must not come back when the file grows.
    let mut m = create_file(&mnt.join("trunc-fd"), 4 * MIB + 99, 41);
    let f = OpenOptions::new().read(true).write(true).open(mnt.join("trunc-fd")).expect("open trunc-fd");
    f.set_len(700_001).expect("ftruncate down");
    m.truncate(700_001);
    f.set_len(3 * MIB + 5).expect("ftruncate up");
    m.truncate(3 * MIB + 5);
    write_range(&f, &mut m, 2 * MIB, 10, 42, PIECE);
    assert_eq!(f.metadata().expect("fstat trunc-fd").len(), m.len);
    drop(f);
    files.push(("trunc-fd".into(), m));
    let mut m = create_file(&mnt.join("trunc-path"), 3 * CHUNK + 1000, 43);
    let p = mnt.join("trunc-path");
    let set_len = |len: u64| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: truncate(2) with a valid NUL-terminated path.
        let rc = unsafe { libc::truncate(c.as_ptr(), len as libc::off_t) };
        assert_eq!(rc, 0, "truncate({p:?}, {len}): {}", std::io::Error::last_os_error());
    };
    set_len(CHUNK); // exactly a chunk boundary
    m.truncate(CHUNK);
    set_len(2 * MIB);
    m.truncate(2 * MIB);
    set_len(0);
    m.truncate(0);
    set_len(CHUNK + 3);
    m.truncate(CHUNK + 3);
    files.push(("trunc-path".into(), m));
    // Extend then shrink right after the file was closed (its release, which
    // makes meta recompute the length, may still be on the way), through a
    // new fd: the size is the last one set, and stays so after close.
    // Also on the fd that created the file (written or empty), as
    // pjdfstest's ftruncate::shrink_not_empty / extend_file_shrink_sparse.
    for i in 0..30u64 {
        let name = format!("regrow-{i}");
        let p = mnt.join(&name);
        let (f, mut m) = match i % 3 {
            0 => {
                let m = create_file(&p, 3 * CHUNK + 5, 200 + i);
                (OpenOptions::new().write(true).open(&p).expect("open regrow"), m)
            }
            1 => {
                let f = File::create(&p).expect("create regrow");
                let mut m = Model::default();
                write_range(&f, &mut m, 0, 3 * CHUNK + 5, 200 + i, PIECE);
                (f, m)
            }
            _ => (File::create(&p).expect("create regrow"), Model::default()),
        };
        f.set_len(5 * MIB + i).expect("ftruncate up");
        m.truncate(5 * MIB + i);
        f.set_len(100 + i).expect("ftruncate down");
        m.truncate(100 + i);
        assert_eq!(f.metadata().expect("fstat").len(), m.len, "{name}: fstat after extend then shrink");
        drop(f);
        assert_eq!(fs::metadata(&p).expect("stat").len(), m.len, "{name}: stat after close");
        files.push((name, m));
    }
    println!("holes, overwrites, truncates in {:?}", t.elapsed());

    // Four writers at once, each its own file, pieces written out of order.
    let t = Instant::now();
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let path = mnt.join(format!("concurrent-{w}"));
            std::thread::spawn(move || {
                let len = 12 * MIB + w * 777;
                let f = File::create(&path).expect("create concurrent file");
                let mut m = Model::default();
                let pieces = len.div_ceil(MIB);
                let mut order: Vec<u64> = (0..pieces).collect();
                order.sort_by_key(|&i| splitmix(w * 100 + i)); // a seeded shuffle
                for i in order {
                    let off = i * MIB;
                    write_range(&f, &mut m, off, MIB.min(len - off), 50 + w, PIECE);
                }
                write_range(&f, &mut m, 5 * MIB + 3 * w, 2 * CHUNK, 60 + w, PIECE);
                f.sync_all().expect("fsync concurrent file");
                (format!("concurrent-{w}"), m)
            })
        })
        .collect();
    for w in writers {
        files.push(w.join().expect("concurrent writer panicked"));
    }
    println!("concurrent writers in {:?}", t.elapsed());

    // Everything back through the mount (fresh opens), then random reads.
    let t = Instant::now();
    for (name, m) in &files {
        verify_path(&mnt.join(name), m);
    }
    for (name, m) in files.iter().filter(|(n, _)| n == "holes" || n.starts_with("size-67108864") || n == "trunc-fd") {
        verify_random_reads(&mnt.join(name), m, name.len() as u64, 40);
    }
    println!("read back through the mount in {:?}", t.elapsed());

    // The native client (`fskv get`) sees the same bytes.
    let t = Instant::now();
    let scratch = dir.path().join("scratch");
    fs::create_dir(&scratch).expect("scratch dir");
    for (name, m) in &files {
        verify_get(&c.mgmtd, &c.meta, &format!("/{name}"), m, &scratch);
    }
    println!("read back with fskv get in {:?}", t.elapsed());

    // A file put with `fskv put` reads back through the mount.
    for (name, len, seed) in [("put-big", 9 * MIB + 5, 71), ("put-chunk", CHUNK, 72), ("put-small", 100, 73)] {
        let local = scratch.join(name);
        let mut m = Model::default();
        let f = File::create(&local).expect("create local file");
        write_range(&f, &mut m, 0, len, seed, PIECE);
        drop(f);
        fskv_ok(&["put", "--mgmtd", &c.mgmtd, "--meta", &c.meta, local.to_str().unwrap(), &format!("/{name}")]);
        fs::remove_file(&local).expect("remove local file");
        verify_path(&mnt.join(name), &m);
        verify_random_reads(&mnt.join(name), &m, seed, 10);
    }

    // Remove the large files before stopping (the tempdir goes anyway).
    for (name, _) in &files {
        fs::remove_file(mnt.join(name)).unwrap_or_else(|e| panic!("unlink {name}: {e}"));
    }
    c.up.stop();
    println!("fuse_data_integrity_matrix took {:?}", t0.elapsed());
}

/// One file of the kill -9 writer and what happened to it.
#[derive(Debug)]
struct Written {
    name: String,
    len: u64,
    seed: u64,
    /// Set when fsync returned success.
    synced: bool,
    /// The first error (write, fsync or open), if any.
    error: Option<String>,
    started: Instant,
    /// From create to close.
    took: Duration,
}

fn write_fsync_close(dir: &Path, i: u64) -> Written {
    let name = format!("k-{i:05}");
    let len = 200 * KIB + splitmix(i) % (2 * MIB); // over 1..5 chunks
    let seed = 10_000 + i;
    let started = Instant::now();
    let mut w = Written { name, len, seed, synced: false, error: None, started, took: Duration::ZERO };
    let result = (|| -> std::io::Result<()> {
        let f = File::create(dir.join(&w.name))?;
        let mut buf = vec![0u8; 256 * KIB as usize];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            fill(seed, off, &mut buf[..n]);
            f.write_all_at(&buf[..n], off)?;
            off += n as u64;
        }
        f.sync_all()?;
        w.synced = true;
        drop(f); // close(2): its error (flush) is not reported by std
        Ok(())
    })();
    if let Err(e) = result {
        w.error = Some(e.to_string());
    }
    w.took = started.elapsed();
    w
}

fn model_of(w: &Written) -> Model {
    let mut m = Model::default();
    m.write(0, w.len, w.seed);
    m
}

/// Joins a thread, panicking if it does not finish within `timeout` (a
/// write stuck in the kernel would otherwise hang the test).
fn join_within<T>(h: std::thread::JoinHandle<T>, timeout: Duration, what: &str) -> T {
    let start = Instant::now();
    while !h.is_finished() {
        assert!(start.elapsed() < timeout, "{what} did not finish within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    h.join().unwrap_or_else(|_| panic!("{what} panicked"))
}

#[test]
fn fuse_writes_survive_kill9_of_a_storage_node() {
    if !common::fuse_or_skip("fuse_writes_survive_kill9_of_a_storage_node") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let dir = scratch_dir();
    let c = start_cluster(dir.path());
    let work = c.mnt.join("k");
    fs::create_dir(&work).expect("mkdir through the mount");
    println!("cluster up and mounted in {:?}", t0.elapsed());

    let stop = Arc::new(AtomicBool::new(false));
    let done: Arc<Mutex<Vec<Written>>> = Arc::default();
    let writer = {
        let (stop, done, work) = (stop.clone(), done.clone(), work.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let w = write_fsync_close(&work, i);
                done.lock().unwrap_or_else(|e| e.into_inner()).push(w);
                i += 1;
            }
        })
    };
    let synced_count = |done: &Mutex<Vec<Written>>| done.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|w| w.synced).count();

    // Let some files be fsync'ed, then kill -9 storage-2.
    let start = Instant::now();
    while synced_count(&done) < 8 {
        assert!(start.elapsed() < Duration::from_secs(60), "fewer than 8 files fsync'ed in 60 s before the kill");
        assert!(!writer.is_finished(), "the writer stopped before the kill");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child_pid(&c.data, "storage-2").expect("pid file of storage-2");
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(String::from_utf8_lossy(&cmdline).contains("storage"), "pid {pid} is not a storage process");
    let before_kill: Vec<String> =
        done.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|w| w.synced).map(|w| w.name.clone()).collect();
    let killed_at = Instant::now();
    // SAFETY: kill(2) on a process of the cluster this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill -9 {pid}");
    println!("killed storage-2 (pid {pid}) after {} fsync'ed files", before_kill.len());

    // While the writer keeps going: the files fsync'ed before the kill read
    // back from the surviving replicas; watch the cluster notice and heal.
    let t = Instant::now();
    {
        let snapshot: Vec<(String, Model)> = done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|w| before_kill.contains(&w.name))
            .map(|w| (w.name.clone(), model_of(w)))
            .collect();
        for (name, m) in &snapshot {
            verify_path(&work.join(name), m);
        }
    }
    println!("pre-kill files verified while degraded in {:?}", t.elapsed());
    let mut saw_unhealthy = None;
    let mut restarted = None;
    while killed_at.elapsed() < Duration::from_secs(12) {
        if saw_unhealthy.is_none() {
            if let Err(state) = cluster_healthy(&c.mgmtd) {
                saw_unhealthy = Some(format!("after {:?}: {state}", killed_at.elapsed()));
            }
        }
        if restarted.is_none() && child_pid(&c.data, "storage-2").is_some_and(|p| p != pid) {
            restarted = Some(killed_at.elapsed());
        }
        assert!(!writer.is_finished(), "the writer stopped");
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    join_within(writer, Duration::from_secs(90), "the writer (a write or fsync stuck after the kill)");
    println!("storage-2 restarted after {restarted:?}; mgmtd showed {saw_unhealthy:?}");
    assert!(restarted.is_some() || child_pid(&c.data, "storage-2").is_some_and(|p| p != pid), "storage-2 was not restarted");

    // The cluster heals: every chain's targets serving and up to date.
    wait_cluster_healthy(&c.mgmtd, Duration::from_secs(120));
    println!("healthy again {:?} after the kill", killed_at.elapsed());

    // After recovery writes go through again, every one of them.
    let mut written = std::mem::take(&mut *done.lock().unwrap_or_else(|e| e.into_inner()));
    let next = written.len() as u64;
    for i in next..next + 5 {
        let w = write_fsync_close(&work, i);
        assert!(w.synced && w.error.is_none(), "a write after recovery failed: {w:?}");
        written.push(w);
    }

    // Every file whose fsync succeeded (before, during or after the
    // failover) reads back intact, twice through the mount (reads spread
    // over the serving replicas, now including the restarted one) and once
    // with the native client for a sample.
    let after_kill = written.iter().filter(|w| w.started >= killed_at).count();
    let failed: Vec<_> = written.iter().filter(|w| !w.synced).map(|w| (w.name.as_str(), w.error.as_deref())).collect();
    let synced: Vec<&Written> = written.iter().filter(|w| w.synced).collect();
    assert!(before_kill.iter().all(|n| synced.iter().any(|w| &w.name == n)));
    let t = Instant::now();
    for round in 0..2 {
        for w in &synced {
            verify_path(&work.join(&w.name), &model_of(w));
        }
        println!("round {round}: {} fsync'ed files verified through the mount", synced.len());
    }
    let scratch = dir.path().join("scratch");
    fs::create_dir(&scratch).expect("scratch dir");
    for w in synced.iter().step_by(7) {
        verify_get(&c.mgmtd, &c.meta, &format!("/k/{}", w.name), &model_of(w), &scratch);
    }
    println!("verified in {:?}", t.elapsed());
    let slowest = written.iter().map(|w| w.took).max().unwrap_or_default();
    println!(
        "{} files: {} fsync'ed ({} before the kill), {} started after the kill, {} failed: {failed:?}; slowest file {slowest:?}",
        written.len(),
        synced.len(),
        before_kill.len(),
        after_kill,
        failed.len()
    );
    // The client retries over the failover (mgmtd marks the dead node
    // offline after the 3 s heartbeat timeout), so a write stalls but does
    // not fail.
    assert!(failed.is_empty(), "writes through the mount failed during the failover: {failed:?}");
    assert!(slowest < Duration::from_secs(30), "a file took {slowest:?} to write, fsync and close");
    c.up.stop();
    println!("fuse_writes_survive_kill9_of_a_storage_node took {:?}", t0.elapsed());
}

/// The model against a plain buffer under random writes and truncates, and
/// [`verify_stream`] catching a single flipped byte (no cluster needed).
#[test]
fn model_matches_a_plain_buffer_and_verify_catches_a_flipped_byte() {
    let mut m = Model::default();
    let mut plain: Vec<u8> = Vec::new();
    for i in 0..300u64 {
        let r = splitmix(i);
        if r.is_multiple_of(5) {
            let len = splitmix(r) % (3 * CHUNK);
            m.truncate(len);
            plain.resize(len as usize, 0);
        } else {
            let (off, len) = (splitmix(r) % (3 * CHUNK), splitmix(r + 1) % 70_000);
            m.write(off, len, i);
            let end = (off + len) as usize;
            if plain.len() < end {
                plain.resize(end, 0);
            }
            fill(i, off, &mut plain[off as usize..end]);
        }
        assert_eq!(m.len, plain.len() as u64);
        let mut got = vec![0u8; plain.len()];
        m.expected(0, &mut got);
        assert!(got == plain, "model differs from the buffer after op {i}");
    }
    m.write(CHUNK - 5, 2 * MIB, 1000);
    plain.resize((CHUNK - 5 + 2 * MIB) as usize, 0);
    fill(1000, CHUNK - 5, &mut plain[(CHUNK - 5) as usize..]);
    verify_stream(&plain[..], &m, "plain");
    let mut bad = plain.clone();
    bad[(MIB + 7) as usize] ^= 1;
    let e = check_stream(&bad[..], &m, "bad").expect_err("a flipped byte went unnoticed");
    assert!(e.contains(&format!("offset {}", MIB + 7)), "{e}");
    check_stream(&plain[..plain.len() - 1], &m, "short").expect_err("a missing last byte went unnoticed");
    let mut long = plain.clone();
    long.push(0);
    check_stream(&long[..], &m, "long").expect_err("an extra byte went unnoticed");
}
