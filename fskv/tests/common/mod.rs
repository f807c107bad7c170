#![allow(dead_code)]
//! Helpers shared by the CLI tests that run `fskv up`.

pub mod acked;
pub mod http;
pub mod linearizability;
pub mod sigv4;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Reports `test` as skipped for `reason`: printed, and appended to the file
/// named by `FSKV_SKIP_LOG` (deploy/test.sh counts those lines as skipped,
/// not passed, in its summary).
pub fn skip(test: &str, reason: &str) {
    println!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("FSKV_SKIP_LOG") {
        use std::io::Write;
        let line = format!("{test}: {reason}\n");
        let written = std::fs::OpenOptions::new().create(true).append(true).open(&path).and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot record the skip in {}: {e}", std::path::Path::new(&path).display());
        }
    }
}

/// Whether `FSKV_REQUIRE_FUSE=1` is set (CI sets it: there a missing
/// `/dev/fuse` is a failure, not a skip).
pub fn fuse_required() -> bool {
    std::env::var("FSKV_REQUIRE_FUSE").is_ok_and(|v| v == "1")
}

/// Whether a FUSE test can run here. Without `/dev/fuse` the test is
/// reported skipped — or fails, under `FSKV_REQUIRE_FUSE=1`.
pub fn fuse_or_skip(test: &str) -> bool {
    if Path::new("/dev/fuse").exists() {
        return true;
    }
    assert!(!fuse_required(), "{test}: /dev/fuse is missing and FSKV_REQUIRE_FUSE=1");
    skip(test, "/dev/fuse is missing");
    false
}

/// Ports `fskv up --base-port P` binds: the front's routed and read-only
/// listeners — S3 P / P+5, KV P+1 / P+6, MQ and SQS P+2 / P+7, Consul
/// P+3 / P+8 — and its admin listener P+10; mgmtd P+11, meta P+12, storage
/// P+13..P+15. (Gateway processes behind the front take ephemeral ports.)
const UP_PORT_OFFSETS: [u16; 15] = [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16];

/// Test clusters take their ports in slots of this many ports (more than
/// the highest [`UP_PORT_OFFSETS`] offset, and the "dead" addresses some
/// tests aim at inside their own slot).
const PORT_SLOT_WIDTH: u16 = 32;
/// The first slot's base, and the end of the slots unless the kernel's
/// ephemeral range (`net.ipv4.ip_local_port_range`, 32768 and up by
/// default) starts lower: the outgoing connections of other tests and
/// processes take their local ports from that range, and one could take a
/// cluster's port between the check here and the bind (`fskv up` then exits
/// at once, or a restarted storage process cannot listen again).
const PORT_SLOTS_FIRST: u16 = 20_000;
const PORT_SLOTS_END: u16 = 32_000;
/// Fewest slots worth keeping below the ephemeral range.
const PORT_SLOTS_MIN: u16 = 64;
const _: () = assert!(UP_PORT_OFFSETS[UP_PORT_OFFSETS.len() - 1] < PORT_SLOT_WIDTH);

/// A base port whose every [`UP_PORT_OFFSETS`] port is free right now, in a
/// slot no other test holds. The slot is held with an exclusive lock on
/// `$TMPDIR/fskv-test-port-slots/BASE.lock` until this test process exits:
/// two tests of one binary (run in parallel threads) or of two binaries
/// never draw overlapping ranges. (Drawing any free-looking random base let
/// two tests that checked at once both see the same ports free: the likely
/// cause of a CI run where one cluster's front never got its port.)
pub fn free_base_port() -> u16 {
    hold_port_slot(|base| UP_PORT_OFFSETS.iter().all(|o| port_is_free(base + o)))
}

/// One free port (for a test that starts its processes itself and may
/// restart one on the same port), from a [`PORT_SLOT_WIDTH`]-port slot this
/// process holds: ports taken with `bind(:0)` come from the ephemeral range,
/// where another connection's local port could take one before a restart.
pub fn free_port() -> u16 {
    // The slot being handed out, port by port: (base, next offset).
    static CURRENT: std::sync::Mutex<Option<(u16, u16)>> = std::sync::Mutex::new(None);
    let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        match *current {
            Some((base, offset)) if offset < PORT_SLOT_WIDTH => {
                *current = Some((base, offset + 1));
                if port_is_free(base + offset) {
                    return base + offset;
                }
            }
            _ => *current = Some((hold_port_slot(|_| true), 0)),
        }
    }
}

/// How many slots lie between [`PORT_SLOTS_FIRST`] and the ephemeral range
/// (or [`PORT_SLOTS_END`]); with fewer than [`PORT_SLOTS_MIN`] there (the
/// range was widened), all up to [`PORT_SLOTS_END`], said once.
fn port_slot_count() -> u16 {
    static COUNT: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *COUNT.get_or_init(|| {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
        let ephemeral_first = range.split_whitespace().next().and_then(|w| w.parse::<u16>().ok()).unwrap_or(32_768);
        let below = ephemeral_first.min(PORT_SLOTS_END).saturating_sub(PORT_SLOTS_FIRST) / PORT_SLOT_WIDTH;
        if below >= PORT_SLOTS_MIN {
            return below;
        }
        println!(
            "note: the ephemeral port range ({}) covers the test clusters' ports: a port may be taken before it is bound",
            range.trim()
        );
        (PORT_SLOTS_END - PORT_SLOTS_FIRST) / PORT_SLOT_WIDTH
    })
}

fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Takes a slot no other test holds and for which `usable(base)` is true;
/// the slot stays held until this test process exits.
fn hold_port_slot(usable: impl Fn(u16) -> bool) -> u16 {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("fskv-test-port-slots");
    std::fs::create_dir_all(&dir).expect("create the port slot directory");
    for _ in 0..2_000 {
        let base = PORT_SLOTS_FIRST + (rand::random::<u16>() % port_slot_count()) * PORT_SLOT_WIDTH;
        let path = dir.join(format!("{base}.lock"));
        let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).expect("open a port slot lock");
        // flock: another open of the same file, in this process or another, is refused.
        if lock.try_lock().is_ok() && usable(base) {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
            return base;
        }
    }
    panic!("no free port slot");
}

/// The cluster key of every cluster this test binary starts (one per test
/// process, 0600 in the temp directory), also installed as the process's
/// RPC identity so in-process clients (`ClientConfig::default()`) hold it.
/// Commands run through [`fskv_cmd`] get it as `FSKV_CLUSTER_KEY_FILE`.
pub fn key_file() -> &'static Path {
    static KEY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let key = fskv_rpc::auth::ClusterKey::generate();
        let path = std::env::temp_dir().join(format!("fskv-test-cluster-{}.key", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).expect("create the test cluster key");
        f.write_all(key.to_hex().as_bytes()).expect("write the test cluster key");
        fskv_rpc::auth::install(fskv_rpc::auth::ProcessIdentity { key: Some(std::sync::Arc::new(key)), principal: "client".into() });
        path
    })
}

/// `fskv` with the test cluster key ([`key_file`]).
pub fn fskv_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fskv"));
    cmd.env("FSKV_CLUSTER_KEY_FILE", key_file());
    cmd
}

/// Starts `fskv up` and waits for its "serving" line.
pub fn start_up(data: &Path, base: u16) -> Child {
    start_up_with(data, base, &[])
}

/// [`start_up`] with extra arguments for `fskv up`.
/// Its stderr goes to `DATA.stderr.log`; if it exits before it is ready
/// the panic says why at once (no wait for the timeout).
pub fn start_up_with(data: &Path, base: u16, extra: &[&str]) -> Child {
    // `fskv up` finds the test key in its data directory (as if it had created it).
    std::fs::create_dir_all(data).expect("create the data directory");
    let seeded = data.join("cluster.key");
    if !seeded.exists() {
        std::fs::copy(key_file(), &seeded).expect("seed the cluster key");
    }
    start_up_unseeded(data, base, extra)
}

/// [`start_up_with`] without seeding the test key: `fskv up` creates its
/// own `DIR/cluster.key` on a fresh directory (commands then need
/// `--cluster-key-file DIR/cluster.key`).
pub fn start_up_unseeded(data: &Path, base: u16, extra: &[&str]) -> Child {
    let stderr_path = data.with_extension("stderr.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fskv"))
        .args(["up", "--heartbeat-timeout-ms", "3000", "--base-port", &base.to_string(), "--data"])
        .arg(data)
        .args(extra)
        // FSKV_TEST_LOG (a tracing filter) raises the cluster's log level
        // when chasing a failure; the default keeps test logs short.
        .env("FSKV_LOG", std::env::var("FSKV_TEST_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).expect("create the stderr log of fskv up"))
        .spawn()
        .expect("spawn fskv up");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Keep reading to the end so `fskv up` never writes into a closed pipe.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) if line.contains("serving; Ctrl-C") => return child,
            Ok(line) => seen.push(line),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed: the process has exited (or is exiting).
                let status = child.wait().expect("wait for fskv up");
                let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                panic!("fskv up exited ({status}) before it was ready: {seen:#?}\nstderr: {err}");
            }
            Err(_) if Instant::now() < deadline => {}
            Err(_) => {
                let _ = child.kill();
                panic!("fskv up did not become ready: {seen:#?}");
            }
        }
    }
}

pub fn stop_up(mut child: Child) {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "fskv up exited with {status}");
            return;
        }
        assert!(Instant::now() < deadline, "fskv up did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the `fskv` binary and asserts it exits 0.
pub fn fskv_ok(args: &[&str]) -> std::process::Output {
    let out = fskv_cmd().args(args).env("FSKV_LOG", "warn").output().expect("run fskv");
    assert!(
        out.status.success(),
        "fskv {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether `path` is a mount point in /proc/mounts.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let p = path.to_string_lossy();
    mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(&*p))
}

/// The pid `fskv up`'s supervisor wrote for child `name` (`DIR/pids/NAME.pid`).
pub fn child_pid(data: &Path, name: &str) -> Option<i32> {
    std::fs::read_to_string(data.join("pids").join(format!("{name}.pid"))).ok()?.trim().parse().ok()
}

/// `Ok` when `fskv admin status --json` shows every node alive and every
/// target of every chain serving and up to date; else what is missing.
pub fn cluster_healthy(mgmtd: &str) -> Result<(), String> {
    let out = fskv_cmd()
        .args(["admin", "status", "--mgmtd", mgmtd, "--json"])
        .env("FSKV_LOG", "error")
        .output()
        .map_err(|e| format!("cannot run fskv admin status: {e}"))?;
    if !out.status.success() {
        return Err(format!("admin status failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("status is not JSON: {e}"))?;
    let nodes = v["mgmtd"]["nodes"].as_array().ok_or("no nodes in the status")?;
    let dead: Vec<_> = nodes.iter().filter(|n| n["alive"] != true).map(|n| n["node_id"].to_string()).collect();
    let chains = v["mgmtd"]["chains"].as_array().ok_or("no chains in the status")?;
    let mut behind = Vec::new();
    for c in chains {
        for t in c["targets"].as_array().ok_or("chain without targets")? {
            if t["public"] != "serving" || t["local"] != "up-to-date" {
                behind.push(format!("chain {} target {}: {}/{}", c["chain_id"], t["target_id"], t["public"], t["local"]));
            }
        }
    }
    if chains.is_empty() || !dead.is_empty() || !behind.is_empty() {
        return Err(format!("{} chains; nodes not alive: {dead:?}; targets not serving/up-to-date: {behind:?}", chains.len()));
    }
    Ok(())
}

/// Polls [`cluster_healthy`] until it holds (returns how long that took) or
/// `timeout` passes (panics with the last state).
pub fn wait_cluster_healthy(mgmtd: &str, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        match cluster_healthy(mgmtd) {
            Ok(()) => return start.elapsed(),
            Err(state) => assert!(start.elapsed() < timeout, "cluster not healthy after {timeout:?}: {state}"),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A running `fskv up` (optionally with `--mount`): on drop (a failed test)
/// it is stopped with SIGTERM (bounded wait, then SIGKILL) and a mount left
/// behind is detached, so no stale cluster or mount outlives the test.
pub struct UpGuard {
    pub child: Option<Child>,
    pub mount: Option<std::path::PathBuf>,
}

impl UpGuard {
    /// Stops the cluster cleanly (asserting a clean exit and the unmount).
    pub fn stop(mut self) {
        if let Some(child) = self.child.take() {
            stop_up(child);
        }
        if let Some(m) = &self.mount {
            assert!(!is_mounted(m), "still mounted after fskv up stopped");
        }
    }
}

impl Drop for UpGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(m) = &self.mount {
            if is_mounted(m) {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
        }
    }
}

/// One step of a seeded xorshift64 (`state` must not be 0): the tests'
/// reproducible pseudo-random numbers.
pub fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Writes `len` pseudo-random bytes (xorshift from `seed`) to `path` and returns them.
pub fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let data: Vec<u8> = (0..len).map(|_| xorshift(&mut x) as u8).collect();
    std::fs::write(path, &data).unwrap();
    data
}

/// Sum of a counter over the series of a `/metrics` text whose labels
/// contain every `want` pair.
pub fn metric_sum(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| want.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The raw answer (head and body) of a service's `GET /metrics`.
pub fn scrape_metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr} for metrics: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap_or_else(|e| panic!("read the metrics of {addr}: {e}"));
    out
}
