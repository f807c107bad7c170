//! Service identity with real processes (docs/security.md, "Service
//! identity (RPC)"): `fskv up` creates its cluster key 0600; a peer without
//! the key (or with another) is refused at the connection for every method
//! of every service before any handler runs; a forged heartbeat from a key
//! holder claiming to be a client is refused; the unprivileged user `nobody`
//! can neither read nor overwrite a root-owned 0600 file with `fskv get` /
//! `fskv put`.

mod common;

use bytes::Bytes;
use common::{free_base_port, start_up, stop_up};
use fskv_rpc::auth::{ClusterKey, KEY_BYTES};
use fskv_rpc::frame::{encode_head, FrameHeader, FrameKind};
use fskv_rpc::{CallOptions, ClientConfig, ErrorCode, RpcClient, RpcError, TcpTransport};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn counter(text: &str, prefix: &str) -> u64 {
    text.lines().filter_map(|l| l.strip_prefix(prefix)).filter_map(|v| v.trim().parse::<u64>().ok()).sum()
}

/// Sends one request frame for `method` without any handshake and returns
/// every byte the server sent before it closed.
fn raw_unauthenticated_call(addr: &str, method: u16) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = b"\x00\x00\x00\x00";
    let header = FrameHeader {
        kind: FrameKind::Request,
        flags: 0,
        request_id: 7,
        code: u32::from(method),
        timeout_ms: 5_000,
        body_len: body.len() as u32,
        payload_len: 0,
    };
    // The server may close as soon as it has seen the magic; a write error
    // after that is part of the refusal.
    let _ = s.write_all(&encode_head(&header, body));
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[test]
fn up_creates_the_key_0600_and_every_method_refuses_unauthenticated_peers() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    // A fresh directory: `fskv up` creates the key itself (no seeding).
    std::fs::create_dir_all(&data).unwrap();
    let up = common::start_up_unseeded(&data, base, &[]);
    let key_path = data.join("cluster.key");
    let mode = std::fs::metadata(&key_path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "cluster.key must be 0600");
    let text = std::fs::read_to_string(&key_path).unwrap();
    assert_eq!(text.trim().len(), 64, "64 hex digits");
    let effective = std::fs::read_to_string(data.join("effective-config.toml")).unwrap();
    assert!(effective.contains("cluster_key_file") && effective.contains("cluster.key"), "{effective}");

    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let meta = format!("127.0.0.1:{}", base + 12);
    let storage: Vec<String> = (13..=15).map(|o| format!("127.0.0.1:{}", base + o)).collect();
    let services: Vec<(&str, String)> =
        [("mgmtd", mgmtd.clone()), ("meta", meta.clone())].into_iter().chain(storage.iter().map(|s| ("storage", s.clone()))).collect();
    let before: Vec<String> = services.iter().map(|(_, a)| common::scrape_metrics(a)).collect();

    // Every method id of every service, sent to every service, without a key.
    let methods = fskv_proto::all_methods();
    assert!(methods.len() >= 20, "{methods:?}");
    let mut attempts = vec![0u64; services.len()];
    for (i, (_, addr)) in services.iter().enumerate() {
        for (id, name) in &methods {
            let got = raw_unauthenticated_call(addr, *id);
            // At most the refusal byte: never a response frame (32+ bytes).
            assert!(got.len() <= 1, "{name} on {addr}: the server answered {} bytes", got.len());
            if let Some(b) = got.first() {
                assert_eq!(*b, 1, "{name} on {addr}: refusal reason bad_magic");
            }
            attempts[i] += 1;
        }
    }
    // A client with another key: refused (not retried) on every service.
    let wrong = RpcClient::new(
        Arc::new(TcpTransport::new()),
        ClientConfig { cluster_key: Some(Arc::new(ClusterKey::from_bytes([0x5a; KEY_BYTES]))), ..ClientConfig::default() },
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (_, addr) in &services {
        let started = Instant::now();
        let err = rt
            .block_on(wrong.call::<fskv_proto::mgmtd::MgmtdStatus>(
                addr,
                &Default::default(),
                Bytes::new(),
                CallOptions { timeout_ms: 5_000 },
            ))
            .unwrap_err();
        assert!(matches!(err, RpcError::Unauthenticated { .. }), "{addr}: {err}");
        assert_eq!(err.code(), ErrorCode::PermissionDenied);
        assert!(started.elapsed() < Duration::from_secs(3), "refused at once, not after a timeout");
    }
    // No handler ran for any of them: no request was answered with the
    // malformed-body error our frames would have produced, nothing counted
    // under an unknown method, and every attempt counted as a failed handshake.
    for (i, (kind, addr)) in services.iter().enumerate() {
        let after = common::scrape_metrics(addr);
        for text in [&before[i], &after] {
            assert_eq!(counter(text, "fskv_rpc_requests_total{method=\"unknown\"} "), 0, "{kind} {addr}");
            assert!(!text.contains("code=\"MalformedMessage\""), "{kind} {addr}: a handler decoded an unauthenticated body\n{text}");
        }
        let failed = counter(&after, "fskv_rpc_auth_failures_total{reason=\"bad_magic\"} ")
            - counter(&before[i], "fskv_rpc_auth_failures_total{reason=\"bad_magic\"} ");
        assert_eq!(failed, attempts[i], "{kind} {addr}: every unauthenticated connection counted");
        let closed = counter(&after, "fskv_rpc_auth_failures_total{reason=\"closed\"} ");
        assert!(closed >= 1, "{kind} {addr}: the wrong-key client counted\n{after}");
    }
    // The cluster is undisturbed, and its own key works (the flag beats the
    // test key in the environment).
    let out = common::fskv_ok(&["admin", "status", "--mgmtd", &mgmtd, "--json", "--cluster-key-file", key_path.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"chains\""));
    stop_up(up);
}

#[test]
fn a_forged_heartbeat_from_a_client_principal_is_refused() {
    use fskv_proto::mgmtd::{Heartbeat, HeartbeatReq, MgmtdStatus};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = start_up(&data, base);
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Holds the key (the test process's identity) but claims another name.
    let key = Arc::new(ClusterKey::load(&data.join("cluster.key")).unwrap());
    let as_principal = |name: &str| {
        RpcClient::new(
            Arc::new(TcpTransport::new()),
            ClientConfig { cluster_key: Some(key.clone()), principal: name.into(), ..ClientConfig::default() },
        )
    };
    let opts = CallOptions { timeout_ms: 5_000 };
    let status = |c: &RpcClient| rt.block_on(c.call::<MgmtdStatus>(&mgmtd, &Default::default(), Bytes::new(), opts)).unwrap().0;
    let before = status(&as_principal("client"));
    let node2 = before.nodes.iter().find(|n| n.node_id.0 == 2).expect("node 2").clone();
    let forged =
        HeartbeatReq { node_id: fskv_types::NodeId(2), address: "127.0.0.1:1".into(), generation: u64::MAX / 2, targets: Vec::new() };
    for claimed in ["client", "node:3", "gateway", "meta:2"] {
        let err = rt.block_on(as_principal(claimed).call::<Heartbeat>(&mgmtd, &forged, Bytes::new(), opts)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "as {claimed}: {err}");
    }
    std::thread::sleep(Duration::from_millis(1500));
    let after = status(&as_principal("client"));
    let node2_after = after.nodes.iter().find(|n| n.node_id.0 == 2).expect("node 2");
    assert_eq!(node2_after.address, node2.address, "the forged heartbeat re-pointed node 2");
    assert!(node2_after.alive);
    stop_up(up);
}

/// Runs `fskv ARGS` as the user `nobody`.
fn as_nobody(args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]).arg(env!("CARGO_BIN_EXE_fskv")).args(args);
    cmd.env_remove("FSKV_CLUSTER_KEY_FILE").env("FSKV_LOG", "error").current_dir("/");
    let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("setpriv");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "fskv {args:?} as nobody hangs");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn nobody_can_neither_read_nor_overwrite_a_root_file() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        common::skip("nobody_can_neither_read_nor_overwrite_a_root_file", "needs root to run a command as nobody");
        return;
    }
    if std::process::Command::new("setpriv").arg("--version").output().is_err() {
        common::skip("nobody_can_neither_read_nor_overwrite_a_root_file", "setpriv is missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = start_up(&data, base);
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    // Root writes a secret and makes it 0600.
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, b"root's secret\n").unwrap();
    common::fskv_ok(&["put", "--mgmtd", &mgmtd, secret.to_str().unwrap(), "/secret"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let meta = fskv_client::MetaClient::new(fskv_client::MetaClientConfig::new(vec![format!("127.0.0.1:{}", base + 12)])).unwrap();
        let ino = meta.resolve("/secret").await.unwrap();
        let attr = fskv_proto::meta::SetAttr { mode: Some(0o600), uid: Some(0), gid: Some(0), atime_ns: None, mtime_ns: None };
        let after = meta.setattr(ino.id, attr).await.unwrap();
        assert_eq!(after.acl.mode & 0o777, 0o600);
    });
    // The data directory (where the key is) must be reachable for nobody
    // for the key file itself to be the barrier.
    use std::os::unix::fs::PermissionsExt;
    for d in [dir.path(), data.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let key = data.join("cluster.key");
    let out_file = "/tmp/fskv-nobody-get.out";
    let _ = std::fs::remove_file(out_file);
    let evil = "/tmp/fskv-nobody-put.in";
    std::fs::write(evil, b"overwritten by nobody\n").unwrap();
    std::fs::set_permissions(evil, std::fs::Permissions::from_mode(0o644)).unwrap();

    // 1. With the key file named: a clear refusal, exit code 2.
    for args in [
        vec!["get", "--mgmtd", &mgmtd, "--cluster-key-file", key.to_str().unwrap(), "/secret", out_file],
        vec!["put", "--mgmtd", &mgmtd, "--cluster-key-file", key.to_str().unwrap(), evil, "/secret"],
    ] {
        let out = as_nobody(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("cannot read the cluster key at") && err.contains("permission denied — only trusted users"),
            "{args:?}: {err}"
        );
    }
    // 2. Without a key: the services refuse the connection; the command fails.
    for args in [vec!["get", "--mgmtd", &mgmtd, "/secret", out_file], vec!["put", "--mgmtd", &mgmtd, evil, "/secret"]] {
        let started = Instant::now();
        let out = as_nobody(&args);
        assert!(!out.status.success(), "{args:?} succeeded as nobody: {}", String::from_utf8_lossy(&out.stdout));
        assert!(String::from_utf8_lossy(&out.stderr).contains("cluster key"), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        eprintln!("{args:?} as nobody failed after {:?}: {}", started.elapsed(), String::from_utf8_lossy(&out.stderr).trim());
    }
    // Nothing was read, nothing was changed.
    assert!(std::fs::metadata(out_file).map_or(true, |m| m.len() == 0), "nobody got bytes of the secret");
    let back = dir.path().join("back.txt");
    common::fskv_ok(&["get", "--mgmtd", &mgmtd, "/secret", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), b"root's secret\n");
    let _ = std::fs::remove_file(evil);
    let _ = std::fs::remove_file(out_file);
    let _ = Path::new(out_file);
    stop_up(up);
}

/// Runs `fskv ARGS` as `nobody` with the user key file `key` named.
fn as_nobody_with_key(key: &Path, args: &[&str]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.push("--cluster-key-file");
    all.push(key.to_str().unwrap());
    as_nobody(&all)
}

/// Per-user keys and chunk capabilities (docs/security.md, "User principals"
/// and "Chunk capabilities"): a key issued for nobody's uid makes `fskv`
/// act as nobody toward meta, and storage serves it only chunks meta gave it
/// a capability for.
#[test]
fn a_user_key_acts_as_its_user_and_storage_wants_capabilities() {
    use fskv_proto::cap::{now_ms, CapRights, ChunkCap, CAP_VALIDITY_MS};
    use fskv_proto::meta::{chain_for_chunk, CapRequest, FsckRequest, MetaCall, MetaFsckCall, MetaIssueCap, MetaOp, MetaRequest, UserInfo};
    use fskv_proto::mgmtd::{GetRouting, GetRoutingReq, Heartbeat, HeartbeatReq};
    use fskv_proto::routing::ChainRoles;
    use fskv_proto::storage::*;
    use fskv_types::{ChunkId, InodeId};
    const TEST: &str = "a_user_key_acts_as_its_user_and_storage_wants_capabilities";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        common::skip(TEST, "needs root to chown a key file and run a command as nobody");
        return;
    }
    if std::process::Command::new("setpriv").arg("--version").output().is_err() {
        common::skip(TEST, "setpriv is missing");
        return;
    }
    const NOBODY: u32 = 65534;
    let user_name = "user:65534:65534";
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = start_up(&data, base);
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let meta_addr = format!("127.0.0.1:{}", base + 12);
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    // Root's files: a 0600 secret, a 0644 public file, a directory of nobody's.
    let local = |name: &str, body: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        p
    };
    let secret_body = b"root's secret\n".repeat(100);
    let public_body = b"for everyone\n".repeat(100);
    common::fskv_ok(&["put", "--mgmtd", &mgmtd, local("secret.txt", &secret_body).to_str().unwrap(), "/secret"]);
    common::fskv_ok(&["put", "--mgmtd", &mgmtd, local("public.txt", &public_body).to_str().unwrap(), "/public"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root_meta = fskv_client::MetaClient::new(fskv_client::MetaClientConfig::new(vec![meta_addr.clone()])).unwrap();
    let (secret, public, home) = rt.block_on(async {
        let secret = root_meta.resolve("/secret").await.unwrap();
        let attr = fskv_proto::meta::SetAttr { mode: Some(0o600), uid: Some(0), gid: Some(0), atime_ns: None, mtime_ns: None };
        root_meta.setattr(secret.id, attr).await.unwrap();
        let public = root_meta.resolve("/public").await.unwrap();
        let home = root_meta.mkdir(InodeId::ROOT, "nobody-home", 0o755).await.unwrap();
        let attr = fskv_proto::meta::SetAttr { mode: None, uid: Some(NOBODY), gid: Some(NOBODY), atime_ns: None, mtime_ns: None };
        root_meta.setattr(home.id, attr).await.unwrap();
        (secret, public, home)
    });

    // `fskv admin user-key` (root, with the cluster key): 0600, owned by nobody, names the principal.
    let key_path = dir.path().join("nobody.key");
    let out = common::fskv_ok(&["admin", "user-key", "--uid", "65534", "--gid", "65534", "--out", key_path.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(user_name));
    let meta_of_key = std::fs::metadata(&key_path).unwrap();
    assert_eq!(meta_of_key.mode() & 0o777, 0o600);
    assert_eq!((meta_of_key.uid(), meta_of_key.gid()), (NOBODY, NOBODY));
    assert!(std::fs::read_to_string(&key_path).unwrap().starts_with("user:65534:65534\n"));
    // Never over an existing file; a principal over 64 bytes is refused.
    let again = common::fskv_cmd().args(["admin", "user-key", "--uid", "1", "--out", key_path.to_str().unwrap()]).output().unwrap();
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("must not exist"));
    let groups = (1_000_000..1_000_010).map(|g: u32| g.to_string()).collect::<Vec<_>>().join(",");
    let long = dir.path().join("long.key");
    let too_long = common::fskv_cmd()
        .args(["admin", "user-key", "--uid", "1", "--groups", &groups, "--out", long.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!too_long.status.success() && String::from_utf8_lossy(&too_long.stderr).contains("more than 64"));
    assert!(!long.exists());

    // 1. `fskv` as nobody with its key: meta acts as nobody.
    let got = dir.path().join("got");
    let got_s = got.to_str().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = as_nobody_with_key(&key_path, &["get", "--mgmtd", &mgmtd, "/secret", got_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nobody read the secret");
    assert!(err.contains("PermissionDenied") || err.contains("permission denied"), "{err}");
    assert!(std::fs::metadata(&got).map_or(true, |m| m.len() == 0), "nobody got bytes of the secret");
    let evil = local("evil.txt", b"overwritten by nobody\n");
    let out = as_nobody_with_key(&key_path, &["put", "--mgmtd", &mgmtd, evil.to_str().unwrap(), "/secret"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nobody overwrote the secret");
    assert!(err.contains("PermissionDenied") || err.contains("permission denied"), "{err}");
    let back = dir.path().join("back");
    common::fskv_ok(&["get", "--mgmtd", &mgmtd, "/secret", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), secret_body, "the secret changed");
    // The 0644 file is readable (through storage, with a capability).
    let _ = std::fs::remove_file(&got);
    let out = as_nobody_with_key(&key_path, &["get", "--mgmtd", &mgmtd, "/public", got_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&got).unwrap(), public_body);
    // nobody's own directory: write, read back; the file is nobody's.
    let mine_body = b"nobody's data\n".repeat(1000);
    let mine = local("mine.txt", &mine_body);
    let out = as_nobody_with_key(&key_path, &["put", "--mgmtd", &mgmtd, mine.to_str().unwrap(), "/nobody-home/mine"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_file(&got);
    let out = as_nobody_with_key(&key_path, &["get", "--mgmtd", &mgmtd, "/nobody-home/mine", got_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&got).unwrap(), mine_body);
    let mine_inode = rt.block_on(root_meta.resolve("/nobody-home/mine")).unwrap();
    assert_eq!((mine_inode.acl.uid, mine_inode.acl.gid), (NOBODY, NOBODY));

    // 2. Raw RPCs as the user principal.
    let cluster = ClusterKey::load(common::key_file()).unwrap();
    let client_as = |name: &str, key: ClusterKey| {
        RpcClient::new(
            Arc::new(TcpTransport::new()),
            ClientConfig { cluster_key: Some(Arc::new(key)), principal: name.into(), ..ClientConfig::default() },
        )
    };
    let user_key = cluster.derive_user_key(user_name);
    let user = client_as(user_name, user_key.clone());
    let opts = CallOptions { timeout_ms: 5_000 };
    // The user key claims no other name.
    for other in ["client", "user:65533:65534", "user:65534:0", "node:1"] {
        let err = rt.block_on(client_as(other, user_key.clone()).call::<GetRouting>(
            &mgmtd,
            &GetRoutingReq { known_version: 0, wait_ms: 0 },
            Bytes::new(),
            opts,
        ));
        let err = err.unwrap_err();
        assert!(matches!(err, RpcError::Unauthenticated { .. }), "{other}: {err}");
    }
    // mgmtd: routing yes, heartbeats no.
    let routing = rt
        .block_on(user.call::<GetRouting>(&mgmtd, &GetRoutingReq { known_version: 0, wait_ms: 0 }, Bytes::new(), opts))
        .unwrap()
        .0
        .routing
        .expect("routing");
    let hb = HeartbeatReq { node_id: fskv_types::NodeId(1), address: "127.0.0.1:1".into(), generation: u64::MAX / 2, targets: Vec::new() };
    let err = rt.block_on(user.call::<Heartbeat>(&mgmtd, &hb, Bytes::new(), opts)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    // meta: acts as nobody whatever the request claims; fsck refused.
    let chmod = MetaRequest {
        client_id: 9,
        request_id: 0,
        user: UserInfo::root(),
        op: MetaOp::SetAttr { inode: secret.id, attr: fskv_proto::meta::SetAttr { mode: Some(0o666), ..Default::default() } },
        relaxed: false,
        owner: None,
    };
    let err = rt.block_on(user.call::<MetaCall>(&meta_addr, &chmod, Bytes::new(), opts)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    let err =
        rt.block_on(user.call::<MetaFsckCall>(&meta_addr, &FsckRequest { max_problems: 1, page_keys: 0 }, Bytes::new(), opts)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    // meta issues capabilities by the user's permissions.
    let issue = |c: &RpcClient, inode: InodeId, write: bool| {
        rt.block_on(c.call::<MetaIssueCap>(&meta_addr, &CapRequest { inode, write, user: UserInfo::root() }, Bytes::new(), opts))
            .map(|r| r.0.cap)
    };
    assert_eq!(issue(&user, secret.id, false).unwrap_err().code(), ErrorCode::PermissionDenied);
    assert_eq!(issue(&user, public.id, true).unwrap_err().code(), ErrorCode::PermissionDenied);
    let public_read = issue(&user, public.id, false).unwrap();
    assert_eq!(public_read.rights, CapRights::Read);
    let mine_rw = issue(&user, mine_inode.id, true).unwrap();
    assert_eq!(mine_rw.rights, CapRights::ReadWrite);
    let other_user = client_as("user:1000:1000", cluster.derive_user_key("user:1000:1000"));
    let others_cap = issue(&other_user, public.id, false).unwrap();
    let _ = home;

    // Where chunk 0 of /public lives.
    let layout = public.file().expect("a file").layout.clone();
    assert!(public.file().unwrap().inline.is_none(), "the public file must be chunked for this test");
    let chain = chain_for_chunk(&layout, 0).unwrap();
    let info = routing.chain(chain).unwrap().clone();
    let head = info.head().unwrap();
    let addr = routing.node_address(head.node_id).unwrap().to_string();
    let chunk = ChunkId::new(public.id, 0);
    let io = ReadIo {
        chain_id: chain,
        chain_ver: info.chain_version,
        target: head.target_id,
        chunk,
        offset_bytes: 0,
        len_bytes: 13,
        relaxed: false,
    };
    let read =
        |caps: Vec<ChunkCap>| rt.block_on(user.call::<BatchRead>(&addr, &BatchReadReq { ios: vec![io.clone()], caps }, Bytes::new(), opts));
    // With its capability: served.
    let (resp, payload) = read(vec![public_read]).expect("read with a capability");
    assert!(resp.results[0].is_ok(), "{:?}", resp.results[0]);
    assert_eq!(&payload[..], b"for everyone\n");
    // Refused: none, another inode's, expired, tampered, another user's.
    let key_cap = cluster.cap_key();
    let expired = ChunkCap::issue(&key_cap, user_name, public.id, CapRights::Read, now_ms() - CAP_VALIDITY_MS);
    let mut tampered = public_read;
    tampered.mac[0] ^= 1;
    let mut stretched = public_read;
    stretched.expires_at_ms += 3_600_000;
    for (what, caps) in [
        ("no capability", vec![]),
        ("another inode's", vec![mine_rw]),
        ("expired", vec![expired]),
        ("tampered MAC", vec![tampered]),
        ("tampered expiry", vec![stretched]),
        ("another user's", vec![others_cap]),
    ] {
        let err = read(caps).expect_err(what);
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{what}: {err}");
        eprintln!("{what}: {err}");
    }
    // A read capability does not write; nor does a truncate or remove go through.
    let data = Bytes::from_static(b"X");
    for op in [
        UpdateOp::Write { offset_bytes: 0, len_bytes: 1, crc: crc32c::crc32c(b"X") },
        UpdateOp::Truncate { len_bytes: 0 },
        UpdateOp::Remove,
    ] {
        for cap in [None, Some(public_read), Some(mine_rw)] {
            let req = WriteReq {
                chain_id: chain,
                chain_ver: info.chain_version,
                target: head.target_id,
                chunk,
                op,
                tag: RequestTag { client: 99, request: 1 },
                chunk_size_hint_bytes: None,
                cap,
                channel: None,
            };
            let payload = if matches!(op, UpdateOp::Write { .. }) { data.clone() } else { Bytes::new() };
            let err = rt.block_on(user.call::<WriteChunk>(&addr, &req, payload, opts)).unwrap_err();
            assert_eq!(err.code(), ErrorCode::PermissionDenied, "{op:?} with {cap:?}: {err}");
        }
    }
    let q = |cap| QueryLastChunkReq { chain_id: chain, chain_ver: info.chain_version, target: head.target_id, inode: public.id, cap };
    assert_eq!(
        rt.block_on(user.call::<QueryLastChunk>(&addr, &q(None), Bytes::new(), opts)).unwrap_err().code(),
        ErrorCode::PermissionDenied
    );
    assert!(rt.block_on(user.call::<QueryLastChunk>(&addr, &q(Some(public_read)), Bytes::new(), opts)).unwrap().0.last.is_some());
    // Every other storage method is refused to a user, capability or not.
    let tag = RequestTag { client: 99, request: 2 };
    let refused: Vec<(&str, RpcError)> = rt.block_on(async {
        vec![
            ("SpaceInfo", user.call::<SpaceInfo>(&addr, &SpaceInfoReq {}, Bytes::new(), opts).await.unwrap_err()),
            (
                "DumpChunkMeta",
                user.call::<DumpChunkMeta>(&addr, &DumpChunkMetaReq { target: head.target_id }, Bytes::new(), opts).await.unwrap_err(),
            ),
            (
                "CommitChunk",
                user.call::<CommitChunk>(&addr, &CommitReq { target: head.target_id, chunk, version: 1 }, Bytes::new(), opts)
                    .await
                    .unwrap_err(),
            ),
            (
                "QueryChunk",
                user.call::<QueryChunk>(&addr, &QueryChunkReq { target: head.target_id, chunk, chain_ver: 1 }, Bytes::new(), opts)
                    .await
                    .unwrap_err(),
            ),
            (
                "RemoveChunks",
                user.call::<RemoveChunks>(
                    &addr,
                    &RemoveChunksReq {
                        chain_id: chain,
                        chain_ver: info.chain_version,
                        target: head.target_id,
                        inode: public.id,
                        from_index: 0,
                        max_chunks: 1,
                        tag,
                    },
                    Bytes::new(),
                    opts,
                )
                .await
                .unwrap_err(),
            ),
            (
                "ForwardChunk",
                user.call::<ForwardChunk>(
                    &addr,
                    &ForwardReq {
                        chain_id: chain,
                        chain_ver: info.chain_version,
                        from: head.target_id,
                        to: head.target_id,
                        chunk,
                        op: UpdateOp::Remove,
                        mode: ForwardMode::ReplaceRemove,
                        tag,
                        chunk_size_hint_bytes: None,
                        recent: Vec::new(),
                        channel: None,
                    },
                    Bytes::new(),
                    opts,
                )
                .await
                .unwrap_err(),
            ),
            (
                "SyncStart",
                user.call::<SyncStart>(
                    &addr,
                    &SyncReq { chain_id: chain, chain_ver: info.chain_version, from: head.target_id, target: head.target_id },
                    Bytes::new(),
                    opts,
                )
                .await
                .unwrap_err(),
            ),
            (
                "CopyRange",
                user.call::<CopyRange>(
                    &addr,
                    &CopyRangeReq {
                        chain_id: chain,
                        chain_ver: info.chain_version,
                        target: head.target_id,
                        chunk: ChunkId::new(mine_inode.id, 0),
                        offset_bytes: 0,
                        src: CopySource { chain_id: chain, chunk, offset_bytes: 0, len_bytes: 1 },
                        tag,
                        chunk_size_hint_bytes: None,
                    },
                    Bytes::new(),
                    opts,
                )
                .await
                .unwrap_err(),
            ),
        ]
    });
    for (method, err) in refused {
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{method}: {err}");
    }
    // A user's write channel is dropped (`fskv_storage::channels`): its
    // client id is its own claim. A write of its own file under another
    // client's id with the highest seq leaves that client's writes on the
    // channel accepted.
    let channel_write = |c: &RpcClient, cap: Option<ChunkCap>, seq: u64| {
        let data = Bytes::from_static(b"C");
        let req = WriteReq {
            chain_id: chain,
            chain_ver: info.chain_version,
            target: head.target_id,
            chunk: ChunkId::new(mine_inode.id, 5),
            op: UpdateOp::Write { offset_bytes: 0, len_bytes: 1, crc: crc32c::crc32c(b"C") },
            tag: RequestTag { client: 0xc1, request: seq },
            chunk_size_hint_bytes: None,
            cap,
            channel: Some(fskv_proto::storage::WriteChannel { id: 7, seq }),
        };
        rt.block_on(c.call::<WriteChunk>(&addr, &req, data, opts)).map(|r| r.0)
    };
    channel_write(&user, Some(mine_rw), u64::MAX).expect("the user writes its own file");
    let trusted = client_as("client", cluster.clone());
    let after = channel_write(&trusted, None, 1).expect("a trusted client's write refused after a user's claim on its channel");
    assert!(!after.duplicate);
    // Nothing changed: the public file reads back whole as root.
    let back = dir.path().join("public.back");
    common::fskv_ok(&["get", "--mgmtd", &mgmtd, "/public", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), public_body);
    // Services refuse to start with a user key.
    let out = common::fskv_cmd()
        .args([
            "mgmtd",
            "--nodes",
            "1",
            "--targets-per-node",
            "1",
            "--replicas",
            "1",
            "--cluster-key-file",
            key_path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a user key"), "{}", String::from_utf8_lossy(&out.stderr));
    stop_up(up);
}
