//! Failure tests on a multi-host cluster in Linux network namespaces
//! (`deploy/netns-cluster.sh`): 3 etcd members, 2 mgmtd (primary/standby by a
//! lease in etcd), 2 meta servers on etcd, 4 storage nodes × 3 targets with
//! replication 3, the S3 gateway and the front; every process on its own address.
//!
//! 1. **Partition a storage node during writes**, heal it: no acknowledged
//!    write lost, the chains re-sync, replicas identical (chunk metadata of
//!    every target of every chain, and the data read back).
//! 2. **kill -9 the mgmtd primary**: the standby takes over within lease +
//!    lease/3 (+ slack), routing keeps being served, no storage node exits.
//! 3. **kill -9 a meta server and an etcd member (the leader) during a
//!    metadata workload** (creates + renames, and small-file publishes/reads
//!    of 3 registers through the native client, and 3 S3 objects and 3 KV
//!    keys overwritten and read through **the front** on its own host, i.e.
//!    through the front's gateway processes, and new S3 objects created
//!    through it): clients fail over, no acknowledged operation lost (S3
//!    creates included), every register history (native, S3, KV) is
//!    linearizable, `fskv admin fsck` clean afterwards.
//!
//! Run: `FSKV_NETNS_TEST=short cargo test -p fskv --test netns_cluster`
//! (deploy/test.sh; about a minute) or `FSKV_NETNS_TEST=long` (more rounds,
//! every fault several times; a few minutes). Needs root, iproute2 and etcd;
//! otherwise reported skipped. The test's own traffic comes only from
//! threads that entered the cluster's client namespace (checked), so it
//! never leaves the namespaces the script made.

mod common;

use bytes::Bytes;
use common::linearizability::{check_register, Event, RegOp};
use fskv_client::file::{FsClient, FsClientConfig};
use fskv_client::meta::MetaClient;
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig};
use fskv_proto::meta::{MetaOp, MetaReply, PublishAttrs};
use fskv_proto::storage::{DumpChunkMeta, DumpChunkMetaReq};
use fskv_rpc::{CallOptions, ClientConfig, RpcClient, TcpTransport};
use fskv_types::{ErrorCode, InodeId};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LEASE_MS: u64 = 1_500;
const T_MS: u64 = 6_000;
const REGION: u64 = 4096;
const REGIONS: u64 = 64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    Short,
    Long,
}

/// The script, its state directory and namespace prefix; stops the
/// cluster on drop (also when a check failed) and checks nothing is left.
struct Cluster {
    script: PathBuf,
    dir: PathBuf,
    prefix: String,
}

impl Cluster {
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.script)
            .args(args)
            // One key for the script's processes and this test's clients.
            .env("FSKV_CLUSTER_KEY_FILE", common::key_file())
            .env("FSKV_BIN", env!("CARGO_BIN_EXE_fskv"))
            .env("FSKV_NETNS_DIR", &self.dir)
            .env("FSKV_NETNS_PREFIX", &self.prefix)
            .env("FSKV_NETNS_T_MS", T_MS.to_string())
            .env("FSKV_NETNS_LEASE_MS", LEASE_MS.to_string())
            .env("FSKV_LOG", "info")
            .output()
            .expect("run netns-cluster.sh")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(
            out.status.success(),
            "netns-cluster.sh {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn restarts(&self, host: &str) -> u64 {
        std::fs::read_to_string(self.dir.join("run").join(format!("{host}.restarts"))).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    fn log_tail(&self, host: &str) -> String {
        let log = std::fs::read_to_string(self.dir.join("logs").join(format!("{host}.log"))).unwrap_or_default();
        log.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = self.cmd(&["stop"]);
        if !out.status.success() {
            eprintln!("netns-cluster.sh stop: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces)".into());
    }
    if Command::new("ip").args(["netns", "list"]).output().map(|o| !o.status.success()).unwrap_or(true) {
        return Some("`ip netns` does not work here (iproute2)".into());
    }
    if Command::new("etcd").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        return Some("no etcd binary (deploy/install-deps.sh installs etcd-server)".into());
    }
    None
}

fn net_ns_inode(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}

/// Runs `f` on a tokio runtime whose every thread is inside the network
/// namespace `ns` (entered with setns(2) before the runtime exists, so all
/// threads it makes inherit it; each checks on start).
fn in_namespace<T: Send + 'static>(ns: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_path_buf();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&ns).expect("open the client namespace");
        use std::os::fd::AsRawFd;
        // SAFETY: setns on a valid namespace fd; affects this thread only.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns into {}: {}", ns.display(), std::io::Error::last_os_error());
        let want = net_ns_inode(&ns);
        assert_eq!(net_ns_inode(Path::new("/proc/thread-self/ns/net")), want, "not in the client namespace");
        f()
    })
    .join()
    .expect("namespace thread")
}

fn runtime_in_this_namespace() -> tokio::runtime::Runtime {
    let want = net_ns_inode(Path::new("/proc/thread-self/ns/net"));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .on_thread_start(move || {
            if net_ns_inode(Path::new("/proc/thread-self/ns/net")) != want {
                eprintln!("a runtime thread is outside the client namespace: aborting before it sends anything");
                std::process::abort();
            }
        })
        .build()
        .expect("runtime")
}

#[test]
fn netns_cluster_survives_partitions_and_kills() {
    let form = match std::env::var("FSKV_NETNS_TEST").as_deref() {
        Ok("short") => Form::Short,
        Ok("long") => Form::Long,
        _ => {
            common::skip(
                "netns_cluster_survives_partitions_and_kills",
                "FSKV_NETNS_TEST is not set (deploy/test.sh sets short; FSKV_NETNS_TEST=long for the long form)",
            );
            return;
        }
    };
    if let Some(reason) = skip_reason() {
        common::skip("netns_cluster_survives_partitions_and_kills", &reason);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let prefix = format!("fskvt{}", std::process::id() % 100_000);
    let cluster = Arc::new(Cluster {
        script: Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/netns-cluster.sh"),
        dir: tmp.path().join("cluster"),
        prefix: prefix.clone(),
    });
    let started = Instant::now();
    cluster.ok(&["start"]);
    eprintln!("cluster started in {:?}", started.elapsed());
    let ns = PathBuf::from(format!("/run/netns/{prefix}-client"));
    let c2 = cluster.clone();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        in_namespace(&ns, move || runtime_in_this_namespace().block_on(scenario(c2, form)))
    }));
    if let Err(e) = result {
        for h in ["mgmtd1", "mgmtd2", "meta1", "meta2", "stor2", "etcd1"] {
            eprintln!("--- {h} ---\n{}", cluster.log_tail(h));
        }
        std::panic::resume_unwind(e);
    }
    let cluster = Arc::try_unwrap(cluster).ok().expect("one owner");
    drop(cluster); // stop
    let left = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    let left = String::from_utf8_lossy(&left.stdout).lines().filter(|l| l.starts_with(&format!("{prefix}-"))).count();
    assert_eq!(left, 0, "namespaces left after stop");
    assert!(!tmp.path().join("cluster").exists(), "state directory left after stop");
    eprintln!("whole run {:?}", started.elapsed());
}

fn mgmtd_addrs() -> Vec<String> {
    vec!["10.77.0.21:9000".into(), "10.77.0.22:9000".into()]
}

fn rpc() -> RpcClient {
    RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default())
}

async fn scenario(cluster: Arc<Cluster>, form: Form) {
    let fs = FsClient::connect(mgmtd_addrs(), Vec::new(), FsClientConfig::default()).await.expect("connect through discovery");
    let rounds = if form == Form::Long { 3 } else { 1 };
    for round in 0..rounds {
        let victim = ["stor2", "stor3", "stor4"][round % 3];
        partition_during_writes(&cluster, &fs, round, victim).await;
        mgmtd_primary_kill(&cluster, &fs).await;
    }
    let seconds = if form == Form::Long { 60 } else { 12 };
    metadata_under_meta_and_etcd_kills(&cluster, &fs, seconds).await;
    fsck_clean(&cluster);
}

/// Phase 1.
async fn partition_during_writes(cluster: &Cluster, fs: &FsClient, round: usize, victim: &str) {
    let dir = fs.meta().mkdir(InodeId::ROOT, &format!("part{round}"), 0o755).await.expect("mkdir").id;
    let writers = 6u64;
    let mut files = Vec::new();
    for w in 0..writers {
        let h = fs.create_at(dir, &format!("w{w}"), 0o644, true).await.expect("create");
        files.push(Arc::new(h));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (w, h) in files.iter().enumerate() {
        let (h, stop, count) = (h.clone(), stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (r, generation) = (n % REGIONS, n / REGIONS);
                match h.write_at(r * REGION, common::acked::pattern(w as u64, r, generation)).await {
                    Ok(()) => {
                        acked.insert(r, generation);
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("writer {w}: a write failed after the client's retries: {e}"),
                }
                n += 1;
            }
            (w as u64, acked)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = count.load(Ordering::Relaxed);
    assert!(before > 0, "no write before the partition");
    cluster.ok(&["partition", victim]);
    let cut = Instant::now();
    eprintln!("partitioned {victim} after {before} acked writes");
    tokio::time::sleep(Duration::from_millis(T_MS + 2_000)).await;
    let during = count.load(Ordering::Relaxed) - before;
    cluster.ok(&["heal", victim]);
    let healed = Instant::now();
    eprintln!("healed {victim} after {:?}; {during} writes acked while it was cut off", cut.elapsed());
    assert!(during > 0, "no write was acknowledged while {victim} was partitioned");
    // Back to serving: every target serving and up to date.
    let mgmtd = MgmtdClient::new(rpc(), mgmtd_addrs(), MgmtdClientConfig::default());
    let back = wait_all_serving(&mgmtd, Duration::from_secs(90)).await;
    eprintln!("MEASURE heal_to_all_serving_ms={} (partition of {victim}, round {round})", healed.elapsed().as_millis());
    let _ = back;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = BTreeMap::new();
    for t in tasks {
        let (w, a) = t.await.expect("writer");
        acked.insert(w, a);
    }
    eprintln!("{} writes acked in total", count.load(Ordering::Relaxed));
    // Every acknowledged write reads back (strict reads, spread over replicas).
    for (w, h) in files.iter().enumerate() {
        for _ in 0..3 {
            let data = h.read_at(0, REGION * REGIONS).await.expect("read back");
            for (r, generation) in &acked[&(w as u64)] {
                let (s, e) = ((r * REGION) as usize, ((r + 1) * REGION) as usize);
                assert!(data.len() >= e, "writer {w}: acked region {r} missing");
                assert!(
                    data[s..e] == common::acked::pattern(w as u64, *r, *generation)[..],
                    "writer {w}: acked region {r} gen {generation} lost"
                );
            }
        }
    }
    for h in files {
        if let Ok(h) = Arc::try_unwrap(h) {
            h.close().await.expect("close");
        }
    }
    replicas_identical().await;
}

/// Every target of every chain holds the same chunks, versions, lengths and CRCs.
async fn replicas_identical() {
    let mgmtd = MgmtdClient::new(rpc(), mgmtd_addrs(), MgmtdClientConfig::default());
    let routing = mgmtd.get_routing(0, 0).await.expect("routing").routing.expect("routing info");
    let client = rpc();
    let mut chunks = 0;
    for chain in &routing.chains {
        let mut dumps = Vec::new();
        for t in &chain.targets {
            let node = routing.nodes.iter().find(|n| n.node_id == t.node_id).expect("node of target");
            let (resp, _) = client
                .call::<DumpChunkMeta>(&node.address, &DumpChunkMetaReq { target: t.target_id }, Bytes::new(), CallOptions::default())
                .await
                .expect("dump chunk meta");
            dumps.push((t.target_id, resp.chunks));
        }
        for (target, d) in &dumps[1..] {
            assert_eq!(d, &dumps[0].1, "chain {:?}: target {:?} differs from {:?}", chain.chain_id, target, dumps[0].0);
        }
        chunks += dumps[0].1.len();
    }
    eprintln!("replicas identical: {chunks} chunks over {} chains", routing.chains.len());
}

async fn wait_all_serving(mgmtd: &MgmtdClient, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        for addr in mgmtd_addrs() {
            if let Ok(s) = mgmtd.status_of(&addr).await {
                let ok = s.is_primary
                    && s.nodes.iter().all(|n| n.alive)
                    && !s.chains.is_empty()
                    && s.chains.iter().all(|c| {
                        c.targets.iter().all(|t| {
                            t.public == fskv_proto::routing::PublicTargetState::Serving
                                && t.local == fskv_proto::routing::LocalTargetState::UpToDate
                        })
                    });
                if ok {
                    return start.elapsed();
                }
            }
        }
        assert!(start.elapsed() < timeout, "the cluster did not return to all serving within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Phase 2.
async fn mgmtd_primary_kill(cluster: &Cluster, fs: &FsClient) {
    let mgmtd = MgmtdClient::new(rpc(), mgmtd_addrs(), MgmtdClientConfig::default());
    let mut primary = None;
    for (i, addr) in mgmtd_addrs().iter().enumerate() {
        if mgmtd.status_of(addr).await.is_ok_and(|s| s.is_primary) {
            primary = Some(i);
        }
    }
    let p = primary.expect("a primary mgmtd");
    let (victim, standby) = (format!("mgmtd{}", p + 1), mgmtd_addrs()[1 - p].clone());
    let storage_restarts: Vec<u64> = (1..=4).map(|n| cluster.restarts(&format!("stor{n}"))).collect();
    let version_before = mgmtd.status_of(&mgmtd_addrs()[p]).await.expect("status").routing_version;
    cluster.ok(&["down", &victim, "KILL"]);
    let killed = Instant::now();
    let standby_client = MgmtdClient::new(rpc(), vec![standby.clone()], MgmtdClientConfig::default());
    let took = loop {
        if let Ok(r) = standby_client.get_routing(0, 0).await {
            if r.routing.is_some() {
                break killed.elapsed();
            }
        }
        assert!(killed.elapsed() < Duration::from_secs(15), "the standby did not serve routing within 15 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("MEASURE mgmtd_takeover_ms={} (kill -9 of {victim} to routing served by the standby; lease {LEASE_MS} ms)", took.as_millis());
    assert!(took <= Duration::from_millis(LEASE_MS + LEASE_MS / 3 + 1_000), "takeover took {took:?}, more than lease + lease/3 + 1 s");
    let s = standby_client.status_of(&standby).await.expect("standby status");
    assert!(
        s.is_primary && s.routing_version > version_before,
        "routing version must grow at takeover: {} -> {}",
        version_before,
        s.routing_version
    );
    // Routing continues: the data path works and no storage node exited.
    let dir =
        fs.meta().mkdir(InodeId::ROOT, &format!("after-takeover-{}", s.routing_version), 0o755).await.expect("mkdir after takeover").id;
    let h = fs.create_at(dir, "f", 0o644, true).await.expect("create after takeover");
    h.write_at(0, Bytes::from(vec![7u8; 1 << 20])).await.expect("write after takeover");
    h.close().await.expect("close");
    tokio::time::sleep(Duration::from_millis(T_MS / 2)).await;
    let after: Vec<u64> = (1..=4).map(|n| cluster.restarts(&format!("stor{n}"))).collect();
    assert_eq!(after, storage_restarts, "a storage node exited during the mgmtd takeover");
    cluster.ok(&["up", &victim]);
}

/// One metadata operation retried with the same request id until it
/// answers (the server applies it once): `Ok(reply)`, or `Err(unknown)`
/// after the time budget.
async fn send_until(meta: &MetaClient, op: MetaOp, budget: Duration) -> Result<MetaReply, String> {
    let req = meta.request(op);
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < budget {
        match meta.send(&req).await {
            Ok(r) => return Ok(r),
            Err(e) if e.code().is_retryable() || e.code() == ErrorCode::ConnectionFailed => last = e.to_string(),
            Err(e) => return Err(format!("final error {e}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("no answer within {budget:?}: {last}"))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Acked,
    Unknown,
}

/// Phase 3.
async fn metadata_under_meta_and_etcd_kills(cluster: &Cluster, fs: &FsClient, seconds: u64) {
    let meta = fs.meta().clone();
    let base = meta.mkdir(InodeId::ROOT, "meta-load", 0o755).await.expect("mkdir").id;
    let regs = meta.mkdir(base, "regs", 0o755).await.expect("mkdir").id;
    let clock = Instant::now();
    let now_ns = move || clock.elapsed().as_nanos() as u64;
    let stop_at = Instant::now() + Duration::from_secs(seconds);
    // Creates + renames, 4 tasks, each in its own directory.
    let mut meta_tasks = Vec::new();
    for t in 0..4u64 {
        let meta = meta.clone();
        let dir = meta.mkdir(base, &format!("t{t}"), 0o755).await.expect("mkdir").id;
        meta_tasks.push(tokio::spawn(async move {
            let mut log: Vec<(u64, Outcome, Option<Outcome>)> = Vec::new();
            let mut n = 0u64;
            while Instant::now() < stop_at {
                let create = MetaOp::Create { parent: dir, name: format!("f{n}"), mode: 0o644, exclusive: true, write: false };
                let c = match send_until(&meta, create, Duration::from_secs(30)).await {
                    Ok(_) => Outcome::Acked,
                    Err(_) => Outcome::Unknown,
                };
                let r = if c == Outcome::Acked {
                    let rename = MetaOp::Rename { src_parent: dir, src_name: format!("f{n}"), dst_parent: dir, dst_name: format!("g{n}") };
                    Some(match send_until(&meta, rename, Duration::from_secs(30)).await {
                        Ok(_) => Outcome::Acked,
                        Err(_) => Outcome::Unknown,
                    })
                } else {
                    None
                };
                log.push((n, c, r));
                n += 1;
            }
            (dir, log)
        }));
    }
    // Registers: small files replaced whole (create-write-publish) and read.
    let history: Arc<Mutex<BTreeMap<u64, Vec<Event>>>> = Arc::default();
    let mut reg_tasks = Vec::new();
    for c in 0..4u64 {
        let (meta, history) = (meta.clone(), history.clone());
        reg_tasks.push(tokio::spawn(async move {
            let mut seq = 0u64;
            let mut rng = c.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            while Instant::now() < stop_at {
                let (key, write) = next_register_op(&mut rng);
                let name = format!("reg{key}");
                let call = now_ns();
                let event = if write {
                    seq += 1;
                    let value = (c << 32) | seq;
                    let op = MetaOp::CreateWritePublish {
                        parent: regs,
                        name,
                        mode: 0o644,
                        data: value.to_le_bytes().to_vec(),
                        expected: None,
                        attrs: PublishAttrs::default(),
                    };
                    let ok = send_until(&meta, op, Duration::from_secs(10)).await.is_ok();
                    Some(Event { call, ret: if ok { now_ns() } else { u64::MAX }, op: RegOp::Write(value) })
                } else {
                    match meta.lookup(regs, &name).await {
                        Err(e) if e.code() == ErrorCode::NotFound => Some(Event { call, ret: now_ns(), op: RegOp::Read(None) }),
                        Err(_) => None,
                        Ok(inode) => match meta.read_inline(inode.id, 0, 64).await {
                            Ok(d) if d.len() == 8 => {
                                let v = u64::from_le_bytes(d[..8].try_into().unwrap_or([0; 8]));
                                Some(Event { call, ret: now_ns(), op: RegOp::Read(Some(v)) })
                            }
                            Ok(d) => panic!("register {key}: {} bytes read, expected 8", d.len()),
                            Err(_) => None, // replaced and reclaimed between lookup and read: saw nothing
                        },
                    }
                };
                if let Some(e) = event {
                    history.lock().expect("history").entry(key).or_default().push(e);
                }
            }
        }));
    }
    // The same registers as S3 objects and KV keys, through the front.
    let http = FrontClient::new(&cluster.dir);
    let (call, _) = (now_ns(), http.setup().await);
    let ret = now_ns();
    let http_history: Arc<Mutex<HttpHistory>> = Arc::default();
    // The warm-up wrote 0 to register 0 of each protocol (and read it back).
    for proto in [Proto::S3, Proto::Kv] {
        http_history.lock().expect("history").insert((proto, 0), vec![Event { call, ret, op: RegOp::Write(0) }]);
    }
    for (c, proto) in [(10u64, Proto::S3), (11, Proto::S3), (12, Proto::Kv), (13, Proto::Kv)] {
        let (http, history) = (http.clone(), http_history.clone());
        reg_tasks.push(tokio::spawn(async move {
            let mut seq = 0u64;
            let mut rng = c.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            while Instant::now() < stop_at {
                let (key, write) = next_register_op(&mut rng);
                let call = now_ns();
                let event = if write {
                    seq += 1;
                    let value = (c << 32) | seq;
                    let ok = http.put(proto, key, value).await;
                    Some(Event { call, ret: if ok { now_ns() } else { u64::MAX }, op: RegOp::Write(value) })
                } else {
                    http.get(proto, key).await.map(|v| Event { call, ret: now_ns(), op: RegOp::Read(v) })
                };
                if let Some(e) = event {
                    history.lock().expect("history").entry((proto, key)).or_default().push(e);
                }
            }
        }));
    }
    // S3 creates through the front: fresh keys, each acknowledged one must
    // be there afterwards with its bytes.
    let mut create_tasks = Vec::new();
    for c in 0..2u64 {
        let http = http.clone();
        create_tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut n = 0u64;
            while Instant::now() < stop_at {
                let key = format!("new-{c}-{n}");
                if http.put_object(&key, (c << 32) | n).await {
                    acked.push((key, (c << 32) | n));
                }
                n += 1;
            }
            (n, acked)
        }));
    }
    // Faults: rounds of (meta1 down, the etcd leader down, both up) every 10 s.
    let t0 = Instant::now();
    let mut round = 0u64;
    loop {
        let base = t0 + Duration::from_secs(round * 10);
        if base + Duration::from_secs(9) > stop_at {
            break;
        }
        tokio::time::sleep_until((base + Duration::from_secs(2)).into()).await;
        let meta_victim = if round.is_multiple_of(2) { "meta1" } else { "meta2" };
        cluster.ok(&["down", meta_victim, "KILL"]);
        eprintln!("kill -9 {meta_victim}");
        tokio::time::sleep_until((base + Duration::from_secs(4)).into()).await;
        let leader = etcd_leader().await;
        let etcd_host = format!("etcd{}", leader.unwrap_or(1));
        cluster.ok(&["down", &etcd_host, "KILL"]);
        eprintln!("kill -9 {etcd_host} ({})", if leader.is_some() { "the etcd leader" } else { "no leader found: a member" });
        tokio::time::sleep_until((base + Duration::from_secs(8)).into()).await;
        cluster.ok(&["up", meta_victim]);
        cluster.ok(&["up", &etcd_host]);
        round += 1;
    }
    let mut checked = 0;
    let mut unknown = 0;
    let mut dirs = Vec::new();
    for t in meta_tasks {
        dirs.push(t.await.expect("metadata task"));
    }
    for t in reg_tasks {
        t.await.expect("register task");
    }
    let (mut tried, mut created) = (0, 0);
    for t in create_tasks {
        let (n, acked) = t.await.expect("create task");
        tried += n;
        for (key, value) in acked {
            // Reads retry: the cluster is still settling after the last fault.
            let mut got = None;
            for _ in 0..30 {
                got = http.get_object(&key).await;
                if got.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            assert_eq!(got, Some(Some(value)), "S3 object {key}: acknowledged create through the front lost or wrong");
            created += 1;
        }
    }
    eprintln!("S3 creates through the front: {created} acknowledged of {tried} tried, every one present");
    assert!(created >= 3, "too few S3 creates acknowledged: {created}");
    // No acknowledged operation lost.
    for (dir, log) in &dirs {
        for (n, c, r) in log {
            let f = meta.lookup(*dir, &format!("f{n}")).await.is_ok();
            let g = meta.lookup(*dir, &format!("g{n}")).await.is_ok();
            match (c, r) {
                (Outcome::Acked, Some(Outcome::Acked)) => assert!(g && !f, "acked create+rename of {n}: f={f} g={g}"),
                (Outcome::Acked, Some(Outcome::Unknown)) => assert!(f != g, "acked create of {n}, rename unknown: f={f} g={g}"),
                (Outcome::Acked, None) => assert!(f && !g, "acked create of {n}"),
                (Outcome::Unknown, _) => assert!(!g, "unknown create of {n} cannot have been renamed"),
            }
            checked += 1;
            if *c == Outcome::Unknown || *r == Some(Outcome::Unknown) {
                unknown += 1;
            }
        }
    }
    eprintln!("metadata: {checked} create+rename pairs checked ({unknown} with an unknown outcome)");
    assert!(checked > 20, "too few metadata operations: {checked}");
    // The register history is linearizable.
    let history = history.lock().expect("history").clone();
    let mut ops = 0;
    for (key, events) in &history {
        ops += events.len();
        if let Err(e) = check_register(events, None) {
            panic!("register {key} ({} operations): {e}", events.len());
        }
    }
    eprintln!("registers: {ops} operations on {} registers, linearizable", history.len());
    assert!(ops > 50, "too few register operations: {ops}");
    let http_history = http_history.lock().expect("history").clone();
    for proto in [Proto::S3, Proto::Kv] {
        let (mut ops, mut unknown) = (0, 0);
        for ((p, key), events) in &http_history {
            if *p != proto {
                continue;
            }
            ops += events.len();
            unknown += events.iter().filter(|e| e.ret == u64::MAX).count();
            if let Err(e) = check_register(events, None) {
                panic!("{proto:?} register {key} through the front ({} operations): {e}", events.len());
            }
        }
        eprintln!("{proto:?} through the front: {ops} operations on 3 registers ({unknown} writes with an unknown outcome), linearizable");
        // A request through the front costs several meta transactions on
        // etcd: 0.5-2.7 s each on this loaded debug build, so a short run
        // sees a few dozen at most.
        assert!(ops >= 5, "too few {proto:?} operations through the front: {ops}");
    }
    let mgmtd = MgmtdClient::new(rpc(), mgmtd_addrs(), MgmtdClientConfig::default());
    wait_all_serving(&mgmtd, Duration::from_secs(60)).await;
}

/// Which etcd member (1-3) leads now, asked over the JSON gateway.
async fn etcd_leader() -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for i in 1..=3u64 {
        let addr = format!("10.77.0.1{i}:2379");
        let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(&addr)).await else { continue };
        let req = "POST /v3/maintenance/status HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}";
        if s.write_all(req.as_bytes()).await.is_err() {
            continue;
        }
        let mut out = Vec::new();
        if tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await.is_err() {
            continue;
        }
        let text = String::from_utf8_lossy(&out);
        let Some((_, body)) = text.split_once("\r\n\r\n") else { continue };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else { continue };
        if v["leader"].is_string() && v["leader"] == v["header"]["member_id"] {
            return Some(i);
        }
    }
    None
}

/// `fskv admin fsck` (run inside the client namespace: this thread is there).
fn fsck_clean(cluster: &Cluster) {
    let out = common::fskv_cmd()
        .args(["admin", "fsck", "--mgmtd", &mgmtd_addrs().join(",")])
        .env("FSKV_LOG", "warn")
        .output()
        .expect("run fskv admin fsck");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("clean"), "fsck not clean ({}):\n{text}", out.status);
    eprintln!("fsck: {}", text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or(""));
    let _ = cluster;
}

/// The next register operation of a task: which of the 3 registers, and
/// whether it writes (else reads); xorshift over the task's state.
fn next_register_op(rng: &mut u64) -> (u64, bool) {
    let x = common::xorshift(rng);
    (x % 3, x.is_multiple_of(2))
}

/// Per (protocol, register): the operations on it through the front.
type HttpHistory = BTreeMap<(Proto, u64), Vec<Event>>;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Proto {
    S3,
    Kv,
}

/// Signed S3 and KV requests to the front's host (10.77.0.52), with the
/// cluster's credentials. A request gets 10 s; a failed or timed-out write
/// has an unknown outcome, a failed read is left out of the history.
#[derive(Clone)]
struct FrontClient {
    client: hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, http_body_util::Full<Bytes>>,
    ak: String,
    sk: String,
}

const FRONT_S3: &str = "10.77.0.52:9300";
const FRONT_KV: &str = "10.77.0.52:9301";
const REGISTER_BUCKET: &str = "regs";

impl FrontClient {
    fn new(dir: &Path) -> FrontClient {
        let text = std::fs::read_to_string(dir.join("credentials.json")).expect("credentials.json");
        let v: serde_json::Value = serde_json::from_str(&text).expect("credentials JSON");
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(hyper_util::client::legacy::connect::HttpConnector::new());
        FrontClient {
            client,
            ak: v["access_key"].as_str().expect("access_key").into(),
            sk: v["secret_key"].as_str().expect("secret_key").into(),
        }
    }

    async fn send(&self, proto: Proto, method: http::Method, target: &str, body: Bytes) -> Option<(http::StatusCode, Bytes)> {
        use http_body_util::BodyExt;
        let (host, service) = match proto {
            Proto::S3 => (FRONT_S3, "s3"),
            Proto::Kv => (FRONT_KV, "kv"),
        };
        let req = common::sigv4::signed_request((&self.ak, &self.sk), service, method, (host, target), &[], body);
        let run = async {
            let resp = self.client.request(req).await.ok()?;
            let (head, body) = resp.into_parts();
            let body = body.collect().await.ok()?.to_bytes();
            Some((head.status, body))
        };
        tokio::time::timeout(Duration::from_secs(10), run).await.ok().flatten()
    }

    /// The bucket and the namespace of the registers (before any fault).
    async fn setup(&self) {
        let (st, body) =
            self.send(Proto::S3, http::Method::PUT, &format!("/{REGISTER_BUCKET}"), Bytes::new()).await.expect("create bucket");
        assert!(st.is_success(), "create bucket: {st} {body:?}");
        let (st, body) =
            self.send(Proto::Kv, http::Method::PUT, &format!("/v1/ns/{REGISTER_BUCKET}"), Bytes::new()).await.expect("create ns");
        assert!(st.is_success(), "create namespace: {st} {body:?}");
        // Warm up: the front starts its writer and reader gateway processes
        // on first use; start them before the faults.
        for proto in [Proto::S3, Proto::Kv] {
            assert!(self.put(proto, 0, 0).await, "{proto:?}: warm-up write");
            assert_eq!(self.get(proto, 0).await, Some(Some(0)), "{proto:?}: warm-up read");
        }
    }

    fn target(proto: Proto, key: u64) -> String {
        match proto {
            Proto::S3 => format!("/{REGISTER_BUCKET}/reg{key}"),
            Proto::Kv => format!("/v1/kv/{REGISTER_BUCKET}/reg{key}"),
        }
    }

    /// Whether the write was acknowledged (2xx).
    async fn put(&self, proto: Proto, key: u64, value: u64) -> bool {
        let body = Bytes::copy_from_slice(&value.to_le_bytes());
        matches!(self.send(proto, http::Method::PUT, &Self::target(proto, key), body).await, Some((st, _)) if st.is_success())
    }

    /// A PUT of a new S3 object `key` holding `value`; whether it was acknowledged.
    async fn put_object(&self, key: &str, value: u64) -> bool {
        let body = Bytes::copy_from_slice(&value.to_le_bytes());
        let target = format!("/{REGISTER_BUCKET}/{key}");
        matches!(self.send(Proto::S3, http::Method::PUT, &target, body).await, Some((st, _)) if st.is_success())
    }

    /// The value of S3 object `key` (`Some(None)`: absent; `None`: the read failed).
    async fn get_object(&self, key: &str) -> Option<Option<u64>> {
        self.read(Proto::S3, &format!("/{REGISTER_BUCKET}/{key}"), key).await
    }

    /// `Some(None)`: absent (404); `None`: the read failed (not a history event).
    async fn get(&self, proto: Proto, key: u64) -> Option<Option<u64>> {
        self.read(proto, &Self::target(proto, key), &format!("register {key}")).await
    }

    async fn read(&self, proto: Proto, target: &str, what: &str) -> Option<Option<u64>> {
        let (st, body) = self.send(proto, http::Method::GET, target, Bytes::new()).await?;
        if st == http::StatusCode::NOT_FOUND {
            return Some(None);
        }
        if !st.is_success() {
            return None;
        }
        let bytes: [u8; 8] = body.as_ref().try_into().unwrap_or_else(|_| panic!("{proto:?} {what}: {} bytes read, expected 8", body.len()));
        Some(Some(u64::from_le_bytes(bytes)))
    }
}
