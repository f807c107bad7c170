//! `fskv bench usrbio`: USRBIO against the FUSE mount and the native client,
//! on one large file of a fresh `fskv up --mount` per replication factor.
//!
//! For each replication factor, in the same run and on the same file:
//!
//! | workload | USRBIO (this process, one ring) | FUSE (fio, `direct=1`) | native client (in-process) |
//! |---|---|---|---|
//! | 4 KiB random reads, IOPS | ring of `d` entries, `d` requests kept in flight | `psync` × `numjobs=d`; `libaio` `iodepth=d` | `d` tasks of `read_into`; one `read_many_into` of `d` reads at a time |
//! | 1 MiB sequential reads, MiB/s | same | same (`psync` jobs read their own `1/d` of the file) | same |
//!
//! for `d` in `--depths` (1, 32, 128), `--rounds` times with the order of
//! the methods rotating (the report gives medians). FUSE runs with `direct=1` so the
//! kernel's page cache on the client side does not answer for the mount
//! (USRBIO has none); the storage processes read from their page cache in
//! every case (the file was just written). The daemon's CPU time (user +
//! system of the `fskv mount` process, from /proc) is reported per GiB
//! moved for USRBIO and FUSE runs.

use anyhow::{bail, Context};
use clap::Args;
use fskv_client::file::{FsClient, FsClientConfig, OpenFlags, ReadInto, ReadIntoOptions};
use fskv_usrbio::{File as UFile, Iov, Ring, RingOptions};
use serde::Serialize;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;

#[derive(Args)]
pub struct UsrbioBenchArgs {
    /// Replication factors to measure (a fresh cluster each).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    replicas: Vec<u32>,
    /// Size of the file read, MiB.
    #[arg(long, default_value_t = 1024)]
    file_mib: u64,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rounds per workload and depth (the order of the methods rotates);
    /// the report gives each method's median round.
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// Requests in flight (USRBIO ring depth, fio numjobs / iodepth, native tasks).
    #[arg(long, value_delimiter = ',', default_value = "1,32,128")]
    depths: Vec<usize>,
    /// Skip the fio (FUSE) baselines.
    #[arg(long)]
    no_fio: bool,
    /// Parent directory of the clusters' data (on the disk to measure, not tmpfs).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// First base port tried (`fskv up --base-port`).
    #[arg(long, default_value_t = 26100)]
    base_port: u16,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Measure {
    pub method: String,
    pub workload: String,
    pub depth: usize,
    pub ops_per_sec: f64,
    pub mib_per_sec: f64,
    /// CPU seconds of the FUSE daemon per GiB read (USRBIO and FUSE runs).
    pub daemon_cpu_s_per_gib: Option<f64>,
    pub errors: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplicaReport {
    pub replicas: u32,
    pub file_mib: u64,
    pub seconds: f64,
    pub rounds: u64,
    /// The median round of each method, workload and depth.
    pub measures: Vec<Measure>,
    /// Every round.
    pub all_rounds: Vec<Measure>,
}

/// The round with the median figure (ops/s for 4 KiB, MiB/s for 1 MiB).
fn median(mut runs: Vec<Measure>) -> Measure {
    runs.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
    let i = runs.len() / 2;
    runs.swap_remove(i)
}

#[derive(Clone, Debug, Serialize)]
pub struct UsrbioBenchReport {
    pub runs: Vec<ReplicaReport>,
}

impl ReplicaReport {
    fn get(&self, method: &str, workload: &str, depth: usize) -> Option<&Measure> {
        self.measures.iter().find(|m| m.method == method && m.workload == workload && m.depth == depth)
    }
}

impl fmt::Display for UsrbioBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.runs {
            writeln!(
                f,
                "replication {} — file {} MiB, {} s per measurement, median of {} rounds",
                r.replicas, r.file_mib, r.seconds, r.rounds
            )?;
            let depths: Vec<usize> = {
                let mut d: Vec<usize> = r.measures.iter().map(|m| m.depth).collect();
                d.sort_unstable();
                d.dedup();
                d
            };
            for (workload, unit) in [("rand4k", "IOPS"), ("seq1m", "MiB/s")] {
                writeln!(f, "  {workload} ({unit}; daemon CPU s/GiB in brackets)")?;
                writeln!(
                    f,
                    "    {:>5} {:>16} {:>16} {:>16} {:>12} {:>14} {:>8} {:>8} {:>8}",
                    "depth", "usrbio", "fuse-psync", "fuse-libaio", "native", "native-batch", "u/psync", "u/aio", "u/nat"
                )?;
                for &d in &depths {
                    let val = |m: Option<&Measure>| -> (String, f64) {
                        match m {
                            None => ("-".into(), 0.0),
                            Some(m) => {
                                let v = if unit == "IOPS" { m.ops_per_sec } else { m.mib_per_sec };
                                let cpu = m.daemon_cpu_s_per_gib.map(|c| format!(" [{c:.1}]")).unwrap_or_default();
                                let err = if m.errors > 0 { format!(" !{}", m.errors) } else { String::new() };
                                (format!("{v:.0}{cpu}{err}"), v)
                            }
                        }
                    };
                    let (u, uv) = val(r.get("usrbio", workload, d));
                    let (p, pv) = val(r.get("fuse-psync", workload, d));
                    let (a, av) = val(r.get("fuse-libaio", workload, d));
                    let (n, nv) = val(r.get("native", workload, d));
                    let (b, bv) = val(r.get("native-batch", workload, d));
                    let ratio = |x: f64, y: f64| if y > 0.0 { format!("{:.2}", x / y) } else { "-".into() };
                    writeln!(
                        f,
                        "    {:>5} {:>16} {:>16} {:>16} {:>12} {:>14} {:>8} {:>8} {:>8}",
                        d,
                        u,
                        p,
                        a,
                        n,
                        b,
                        ratio(uv, pv),
                        ratio(uv, av),
                        ratio(uv, nv.max(bv))
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// A fresh `fskv up --mount` (this binary), stopped and removed on drop.
struct UpProcess {
    child: Child,
    data: PathBuf,
    mnt: PathBuf,
    base: u16,
}

impl UpProcess {
    fn start(dir: &Path, base: u16, replicas: u32) -> anyhow::Result<UpProcess> {
        let exe = std::env::current_exe().context("the fskv binary")?;
        let data = dir.join(format!("usrbio-bench-r{replicas}-{}", std::process::id()));
        let mnt = data.with_extension("mnt");
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&mnt)?;
        // One cluster key for every cluster of the bench and its own clients.
        let (key_file, key) = crate::identity::load_or_create(dir)?;
        crate::identity::install_key(Some(key), "client");
        let mut child = Command::new(exe)
            .arg("--cluster-key-file")
            .arg(&key_file)
            .args(["up", "--replicas", &replicas.to_string(), "--base-port", &base.to_string(), "--data"])
            .arg(&data)
            .arg("--mount")
            .arg(&mnt)
            .env("FSKV_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning fskv up")?;
        let stdout = child.stdout.take().context("stdout of fskv up")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut up = UpProcess { child, data, mnt, base };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(line) if line.contains("serving; Ctrl-C") => break,
                Ok(_) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => bail!("fskv up exited before it was ready"),
                Err(_) if Instant::now() < deadline => {}
                Err(_) => bail!("fskv up was not ready within 180 s"),
            }
        }
        if up.mnt.join("3fs-virt/iovs/submit-ios").symlink_metadata().is_err() {
            up.stop();
            bail!("the mount at {} serves no USRBIO", up.mnt.display());
        }
        Ok(up)
    }

    fn mgmtd(&self) -> String {
        format!("127.0.0.1:{}", self.base + 11)
    }

    fn meta(&self) -> String {
        format!("127.0.0.1:{}", self.base + 12)
    }

    fn mount_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.data.join("pids/mount.pid")).ok()?.trim().parse().ok()
    }

    fn stop(&mut self) {
        // SAFETY: SIGTERM to our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for UpProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.data);
        let _ = std::fs::remove_dir(&self.mnt);
    }
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: Option<i32>) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let (u, s): (f64, f64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((u + s) / hz)
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Offsets for a workload: random aligned blocks, or sequential (wrapping).
struct Offsets {
    random: bool,
    bs: u64,
    blocks: u64,
    rng: u64,
    next: u64,
}

impl Offsets {
    fn new(random: bool, bs: u64, file_len: u64, seed: u64) -> Offsets {
        Offsets { random, bs, blocks: (file_len / bs).max(1), rng: seed | 1, next: 0 }
    }

    fn next(&mut self) -> u64 {
        if self.random {
            (xorshift(&mut self.rng) % self.blocks) * self.bs
        } else {
            let o = self.next;
            self.next = (self.next + 1) % self.blocks;
            o * self.bs
        }
    }
}

/// One workload at one depth.
#[derive(Clone, Copy)]
struct Job {
    file_len: u64,
    bs: u64,
    depth: usize,
    random: bool,
    seconds: f64,
}

impl Job {
    fn workload(&self) -> &'static str {
        if self.random {
            "rand4k"
        } else {
            "seq1m"
        }
    }
}

/// What a run counted.
struct Counts {
    ops: u64,
    bytes: u64,
    secs: f64,
    cpu: Option<f64>,
    errors: u64,
}

fn measure(method: &str, job: &Job, c: Counts) -> Measure {
    let gib = c.bytes as f64 / GIB;
    Measure {
        method: method.into(),
        workload: job.workload().into(),
        depth: job.depth,
        ops_per_sec: c.ops as f64 / c.secs,
        mib_per_sec: c.bytes as f64 / MIB as f64 / c.secs,
        daemon_cpu_s_per_gib: c.cpu.filter(|_| gib > 0.0).map(|cpu| cpu / gib),
        errors: c.errors,
    }
}

/// USRBIO: one ring of `depth` entries, `depth` reads kept in flight.
fn run_usrbio(up: &UpProcess, path: &Path, job: Job) -> anyhow::Result<Measure> {
    let Job { file_len, bs, depth, random, seconds } = job;
    let f = std::fs::File::open(path)?;
    let file = UFile::register(&f)?;
    let iov = Iov::create(&up.mnt, depth * bs as usize)?;
    let ring = Ring::create(&up.mnt, RingOptions::reads(depth as u32))?;
    let mut offsets = Offsets::new(random, bs, file_len, 7 + depth as u64);
    let mut free: Vec<_> = (0..depth).map(|i| iov.buf(i * bs as usize, bs as usize)).collect::<Result<_, _>>()?;
    let cpu0 = cpu_seconds(up.mount_pid());
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let (mut ops, mut bytes, mut errors) = (0u64, 0u64, 0u64);
    loop {
        let issuing = Instant::now() < end;
        if issuing {
            for buf in free.drain(..) {
                ring.prepare(buf, &file, offsets.next(), 0).map_err(|(e, _)| e)?;
            }
            ring.submit();
        }
        if ring.in_flight() == 0 {
            break;
        }
        for c in ring.wait(1, Some(Duration::from_secs(30)))? {
            match c.result {
                Ok(n) if n as u64 == bs => {
                    if issuing {
                        ops += 1;
                        bytes += bs;
                    }
                }
                _ => errors += 1,
            }
            free.push(c.buf);
        }
        if !issuing && ring.in_flight() == 0 {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64().min(seconds).max(1e-9);
    let cpu = cpu0.zip(cpu_seconds(up.mount_pid())).map(|(a, b)| b - a);
    Ok(measure("usrbio", &job, Counts { ops, bytes, secs, cpu, errors }))
}

/// The native client in this process: `depth` tasks of `read_into`.
async fn run_native(fs: &FsClient, path: &str, job: Job) -> anyhow::Result<Measure> {
    let Job { file_len, bs, depth, random, seconds } = job;
    let h = Arc::new(fs.open(path, OpenFlags::read_only()).await?);
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let seq = Arc::new(AtomicU64::new(0));
    let blocks = (file_len / bs).max(1);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let tasks: Vec<_> = (0..depth)
        .map(|t| {
            let (h, ops, errors, seq) = (h.clone(), ops.clone(), errors.clone(), seq.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; bs as usize];
                let mut rng = 0x51_7c_c1_b7_27_22_0a_95u64 ^ (t as u64 + 1);
                while Instant::now() < end {
                    let off = if random { (xorshift(&mut rng) % blocks) * bs } else { (seq.fetch_add(1, Ordering::Relaxed) % blocks) * bs };
                    match h.read_into(off, &mut buf).await {
                        Ok(n) if n as u64 == bs => ops.fetch_add(1, Ordering::Relaxed),
                        _ => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let n = ops.load(Ordering::Relaxed);
    Ok(measure("native", &job, Counts { ops: n, bytes: n * bs, secs, cpu: None, errors: errors.load(Ordering::Relaxed) }))
}

/// The native client in this process, batched as the daemon does it: one
/// `read_many_into` of `depth` reads at a time.
async fn run_native_batched(fs: &FsClient, path: &str, job: Job) -> anyhow::Result<Measure> {
    let Job { file_len, bs, depth, random, seconds } = job;
    let h = fs.open(path, OpenFlags::read_only()).await?;
    let mut bufs = vec![vec![0u8; bs as usize]; depth];
    let mut offsets = Offsets::new(random, bs, file_len, 11 + depth as u64);
    let (mut ops, mut errors) = (0u64, 0u64);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let mut reads: Vec<ReadInto<'_>> = bufs.iter_mut().map(|b| ReadInto { handle: &h, offset: offsets.next(), buf: b }).collect();
        for r in fs.read_many_into(&mut reads, ReadIntoOptions::default()).await {
            match r {
                Ok(n) if n as u64 == bs => ops += 1,
                _ => errors += 1,
            }
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok(measure("native-batch", &job, Counts { ops, bytes: ops * bs, secs, cpu: None, errors }))
}

/// fio on the FUSE mount, `direct=1`.
fn run_fio(up: &UpProcess, path: &Path, job: Job, aio: bool) -> anyhow::Result<Measure> {
    let Job { file_len, bs, depth, random, seconds } = job;
    let secs = seconds.ceil().max(1.0) as u64;
    let mut cmd = Command::new("fio");
    cmd.arg("--name=usrbio-bench")
        .arg(format!("--filename={}", path.display()))
        .arg("--direct=1")
        .arg(format!("--bs={bs}"))
        .arg(format!("--rw={}", if random { "randread" } else { "read" }))
        .arg("--time_based=1")
        .arg(format!("--runtime={secs}"))
        .arg("--group_reporting=1")
        .arg("--output-format=json")
        .arg("--invalidate=0");
    if aio {
        cmd.arg("--ioengine=libaio").arg(format!("--iodepth={depth}")).arg("--numjobs=1").arg(format!("--size={file_len}"));
    } else {
        cmd.arg("--ioengine=psync").arg(format!("--numjobs={depth}"));
        if random {
            cmd.arg(format!("--size={file_len}"));
        } else {
            // Each job reads its own part of the file, sequentially.
            let part = (file_len / depth as u64 / bs).max(1) * bs;
            cmd.arg(format!("--size={part}")).arg(format!("--offset_increment={part}"));
        }
    }
    let cpu0 = cpu_seconds(up.mount_pid());
    let out = cmd.output().context("running fio")?;
    let cpu = cpu0.zip(cpu_seconds(up.mount_pid())).map(|(a, b)| b - a);
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print warnings before the JSON.
    let json = &text[text.find('{').context("no JSON from fio")?..];
    let v: serde_json::Value = serde_json::from_str(json).context("fio JSON")?;
    let job = &v["jobs"][0];
    let iops = job["read"]["iops"].as_f64().unwrap_or(0.0);
    let bw = job["read"]["bw_bytes"].as_f64().unwrap_or(0.0);
    let runtime_s = job["read"]["runtime"].as_f64().unwrap_or(secs as f64 * 1000.0) / 1000.0;
    let errors = job["error"].as_u64().unwrap_or(0);
    let bytes = (bw * runtime_s) as u64;
    let method = if aio { "fuse-libaio" } else { "fuse-psync" };
    Ok(Measure {
        method: method.into(),
        workload: if random { "rand4k" } else { "seq1m" }.into(),
        depth,
        ops_per_sec: iops,
        mib_per_sec: bw / MIB as f64,
        daemon_cpu_s_per_gib: cpu.filter(|_| bytes > 0).map(|c| c / (bytes as f64 / GIB)),
        errors,
    })
}

fn free_base(start: u16) -> u16 {
    let mut base = start;
    while base < 40_000 {
        if (0..16).all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok()) {
            return base;
        }
        base += 20;
    }
    start
}

async fn bench_replicas(args: &UsrbioBenchArgs, replicas: u32) -> anyhow::Result<ReplicaReport> {
    let base = free_base(args.base_port);
    eprintln!("bench usrbio: replication {replicas}: starting fskv up --mount on base port {base} ...");
    let up = UpProcess::start(&args.dir, base, replicas)?;
    let fs = FsClient::connect(vec![up.mgmtd()], vec![up.meta()], FsClientConfig::default()).await?;
    let file_len = args.file_mib.max(8) * MIB;
    let name = "usrbio-bench.bin";
    eprintln!("bench usrbio: writing a {} MiB file ...", file_len / MIB);
    {
        let h = Arc::new(fs.open(&format!("/{name}"), OpenFlags::create_truncate()).await?);
        let piece = 8 * MIB;
        let writes = (0..file_len / piece).map(|i| {
            let h = h.clone();
            async move {
                let mut data = vec![0u8; piece as usize];
                let mut x = i + 1;
                for c in data.chunks_mut(8) {
                    c.copy_from_slice(&xorshift(&mut x).to_le_bytes()[..c.len()]);
                }
                h.write_at(i * piece, bytes::Bytes::from(data)).await
            }
        });
        futures::stream::iter(writes).buffer_unordered(4).try_collect::<Vec<()>>().await?;
        match Arc::try_unwrap(h) {
            Ok(h) => {
                h.close().await?;
            }
            Err(_) => bail!("the writer handle is still shared"),
        }
    }
    let path = up.mnt.join(name);
    let meta_len = std::fs::metadata(&path)?.len();
    if meta_len != file_len {
        bail!("the file is {meta_len} bytes through the mount, want {file_len}");
    }
    let mut methods = vec!["usrbio", "native", "native-batch"];
    if !args.no_fio {
        methods.extend(["fuse-psync", "fuse-libaio"]);
    }
    let rounds = args.rounds.max(1);
    let mut measures = Vec::new();
    let mut all_rounds = Vec::new();
    for (random, bs) in [(true, 4096u64), (false, MIB)] {
        for &d in &args.depths {
            let d = d.max(1);
            let label = if random { "rand4k" } else { "seq1m" };
            let job = Job { file_len, bs, depth: d, random, seconds: args.seconds };
            let mut got: Vec<Vec<Measure>> = vec![Vec::new(); methods.len()];
            for round in 0..rounds {
                eprintln!("bench usrbio: r{replicas} {label} depth {d} round {} of {rounds} ...", round + 1);
                // The order rotates by one per round: no method always goes first.
                for k in 0..methods.len() {
                    let m = (k + round as usize) % methods.len();
                    let (p, upr, nm) = (&path, &up, format!("/{name}"));
                    let r = match methods[m] {
                        "usrbio" => tokio::task::block_in_place(|| run_usrbio(upr, p, job))?,
                        "fuse-psync" => tokio::task::block_in_place(|| run_fio(upr, p, job, false))?,
                        "fuse-libaio" => tokio::task::block_in_place(|| run_fio(upr, p, job, true))?,
                        "native" => run_native(&fs, &nm, job).await?,
                        _ => run_native_batched(&fs, &nm, job).await?,
                    };
                    got[m].push(r);
                }
            }
            for runs in got {
                all_rounds.extend(runs.iter().cloned());
                measures.push(median(runs));
            }
        }
    }
    fs.shutdown();
    drop(up);
    Ok(ReplicaReport { replicas, file_mib: file_len / MIB, seconds: args.seconds, rounds, measures, all_rounds })
}

use futures::{StreamExt, TryStreamExt};

pub async fn run(args: UsrbioBenchArgs) -> anyhow::Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!("no /dev/fuse: USRBIO is served by the FUSE mount");
    }
    let mut runs = Vec::new();
    for &r in &args.replicas {
        runs.push(bench_replicas(&args, r).await?);
    }
    crate::bench::emit(&UsrbioBenchReport { runs }, args.json.as_ref())
}
