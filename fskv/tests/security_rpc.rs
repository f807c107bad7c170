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

/// `name{labels} value` lines of a service's `GET /metrics` summed per name
/// and label text.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect for metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

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
    let before: Vec<String> = services.iter().map(|(_, a)| scrape(a)).collect();

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
        let after = scrape(addr);
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
