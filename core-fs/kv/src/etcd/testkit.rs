//! A real etcd cluster on loopback for tests and benchmarks: N `etcd`
//! processes (Debian's `etcd-server`), each with its own data directory under
//! one temporary directory, killed and removed on drop.
//!
//! The members run with the limits the conformance suite needs
//! (`--max-request-bytes` 11 MiB for its 9 MB transaction, `--max-txn-ops`
//! 10,000) and a short election timeout (500 ms), so a killed leader is
//! replaced within about a second.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `--max-request-bytes` of the test members (11 MiB).
pub const TEST_MAX_REQUEST_BYTES: usize = 11 * 1024 * 1024;
/// `--max-txn-ops` of the test members.
pub const TEST_MAX_TXN_OPS: usize = 10_000;

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    dir: PathBuf,
    token: String,
    members: Vec<Member>,
}

/// Why etcd cannot run here (`None`: it can).
pub fn unavailable() -> Option<String> {
    match Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!("`etcd --version` exited with {s}")),
        Err(e) => Some(format!("no etcd binary ({e}); deploy/install-deps.sh installs Debian's etcd-server")),
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `GET /health` of one member: whether it answers `"health":"true"`.
fn healthy(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}

impl EtcdCluster {
    /// Starts `members` members under a new directory in `base` (the
    /// system's temporary directory when `None`) and waits until every one
    /// is healthy (at most 30 s).
    pub fn start(members: usize, base: Option<&Path>) -> Result<EtcdCluster, String> {
        let base = base.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(members, &base) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn try_start(n: usize, base: &Path) -> Result<EtcdCluster, String> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let token = format!("fskv-test-{}-{nanos}", std::process::id());
        let dir = base.join(&token);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut members = Vec::new();
        for i in 0..n {
            let client_port = free_port().map_err(|e| e.to_string())?;
            let mut peer_port = free_port().map_err(|e| e.to_string())?;
            while peer_port == client_port {
                peer_port = free_port().map_err(|e| e.to_string())?;
            }
            members.push(Member { name: format!("m{i}"), client_port, peer_port, child: None });
        }
        let mut cluster = EtcdCluster { dir, token, members };
        for i in 0..n {
            cluster.spawn(i, "new")?;
        }
        cluster.wait_healthy(Duration::from_secs(30))?;
        Ok(cluster)
    }

    fn initial_cluster(&self) -> String {
        self.members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port)).collect::<Vec<_>>().join(",")
    }

    fn spawn(&mut self, i: usize, state: &str) -> Result<(), String> {
        let initial = self.initial_cluster();
        let m = &self.members[i];
        let data = self.dir.join(&m.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))
            .map_err(|e| format!("etcd log: {e}"))?;
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial, "--initial-cluster-state", state, "--initial-cluster-token", &self.token])
            .args(["--max-request-bytes", &TEST_MAX_REQUEST_BYTES.to_string(), "--max-txn-ops", &TEST_MAX_TXN_OPS.to_string()])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "warn", "--logger", "zap"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start etcd: {e}"))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Waits until every running member answers healthy.
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut pending = Vec::new();
            for m in &mut self.members {
                if let Some(c) = &mut m.child {
                    if let Ok(Some(status)) = c.try_wait() {
                        let log = std::fs::read_to_string(self.dir.join(format!("{}.log", m.name))).unwrap_or_default();
                        let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join("\n");
                        return Err(format!("etcd member {} exited ({status}): {tail}", m.name));
                    }
                    if !healthy(m.client_port) {
                        pending.push(m.name.clone());
                    }
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("etcd members {pending:?} not healthy after {timeout:?} (logs in {})", self.dir.display()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Client URLs of every member.
    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(|m| format!("http://127.0.0.1:{}", m.client_port)).collect()
    }

    /// The engine spec (`etcd:URL,URL,...?...`) with the members' limits and
    /// `prefix`.
    pub fn spec(&self, prefix: &str) -> String {
        format!(
            "etcd:{}?prefix={prefix}&max_txn_ops={TEST_MAX_TXN_OPS}&max_request_bytes={TEST_MAX_REQUEST_BYTES}",
            self.client_urls().join(",")
        )
    }

    /// Kills member `i` with SIGKILL (its data directory stays).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        self.kill(i);
        self.spawn(i, "existing")
    }

    /// POSTs `body` to `path` of member `i` (JSON gateway); the decoded
    /// answer of a 200.
    fn post(&self, i: usize, path: &str, body: &str) -> Result<serde_json::Value, String> {
        let m = &self.members[i];
        let addr = SocketAddr::from(([127, 0, 0, 1], m.client_port));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).map_err(|e| format!("{}: {e}", m.name))?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let req = format!("POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut out = String::new();
        s.read_to_string(&mut out).map_err(|e| e.to_string())?;
        let (head, body) = out.split_once("\r\n\r\n").ok_or("no HTTP header")?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(format!("{path}: {head}: {body}"));
        }
        serde_json::from_str(body).map_err(|e| format!("{path}: {e}"))
    }

    /// Index of the member that is the Raft leader now (by `/v3/maintenance/status`).
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).filter(|i| self.members[*i].child.is_some()).find(|i| {
            self.post(*i, "/v3/maintenance/status", "{}").is_ok_and(|v| v["leader"].is_string() && v["leader"] == v["header"]["member_id"])
        })
    }

    /// Compacts the key history up to `revision` (physically).
    pub fn compact(&self, revision: u64) -> Result<(), String> {
        let i = (0..self.members.len()).find(|i| self.members[*i].child.is_some()).ok_or("no member running")?;
        self.post(i, "/v3/kv/compaction", &format!("{{\"revision\":\"{revision}\",\"physical\":true}}")).map(|_| ())
    }

    /// Where the members' data and logs are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
