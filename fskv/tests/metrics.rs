//! Prometheus metrics of the core services on `fskv up`: a plain HTTP
//! `GET /metrics` on each service's RPC port (mgmtd P+11, meta P+12,
//! storage P+13..P+15) answers OpenMetrics text whose counters follow the
//! traffic (a file written and read through meta + storage), while RPC on
//! the same ports keeps working.

mod common;

use common::{free_base_port, fskv_ok, start_up, wait_cluster_healthy, UpGuard};
use std::io::{Read, Write};
use std::time::Duration;

/// `GET /metrics` on a raw TCP connection; the body of the 200 response.
fn scrape(addr: &str) -> String {
    let mut sock = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sock.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    sock.read_to_string(&mut out).unwrap_or_else(|e| panic!("read the metrics of {addr}: {e}"));
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{addr}: not HTTP: {out}"));
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{addr}: {head}");
    assert!(head.contains("application/openmetrics-text"), "{addr}: {head}");
    assert!(body.ends_with("# EOF\n"), "{addr}: truncated text");
    body.to_string()
}

/// The sum of every sample of `name` whose labels contain all of `labels`
/// (`key="value"` strings); `None` if there is none.
fn sum(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut total = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
        if series_name != name || !labels.iter().all(|l| series_labels.contains(l)) {
            continue;
        }
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line}"));
        total = Some(total.unwrap_or(0.0) + v);
    }
    total
}

fn at_least(text: &str, name: &str, labels: &[&str], min: f64) {
    let v = sum(text, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{text}"));
    assert!(v >= min, "{name}{labels:?} = {v}, expected at least {min}");
}

#[test]
fn every_core_service_serves_metrics_on_its_rpc_port() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = UpGuard { child: Some(start_up(&data, base)), mount: None };
    let (mgmtd, meta) = (format!("127.0.0.1:{}", base + 11), format!("127.0.0.1:{}", base + 12));
    let storage: Vec<String> = (13..=15).map(|o| format!("127.0.0.1:{}", base + o)).collect();
    wait_cluster_healthy(&mgmtd, Duration::from_secs(60));

    // Traffic: a 2 MiB file (several chunks on 3-replica chains), written and read back.
    let file_bytes = 2u64 << 20;
    let local = dir.path().join("in.bin");
    std::fs::write(&local, (0..file_bytes).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>()).unwrap();
    fskv_ok(&["put", "--mgmtd", &mgmtd, "--meta", &meta, local.to_str().unwrap(), "/metrics.bin"]);
    let back = dir.path().join("out.bin");
    fskv_ok(&["get", "--mgmtd", &mgmtd, "--meta", &meta, "/metrics.bin", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&local).unwrap());

    // mgmtd: the primary, every target serving, three storage nodes alive.
    let m = scrape(&mgmtd);
    assert_eq!(sum(&m, "fskv_mgmtd_primary", &[]), Some(1.0), "{m}");
    at_least(&m, "fskv_mgmtd_routing_version", &[], 1.0);
    let serving = sum(&m, "fskv_mgmtd_targets", &["state=\"serving\""]).expect("targets by state");
    assert!(serving >= 3.0, "{m}");
    assert_eq!(sum(&m, "fskv_mgmtd_target_state", &["state=\"serving\""]), Some(serving), "one series per serving target: {m}");
    assert_eq!(sum(&m, "fskv_mgmtd_targets", &["state=\"offline\""]), Some(0.0), "{m}");
    assert_eq!(sum(&m, "fskv_mgmtd_storage_nodes", &["alive=\"true\""]), Some(3.0), "{m}");
    assert_eq!(sum(&m, "fskv_mgmtd_meta_servers", &[]), Some(1.0), "{m}");
    at_least(&m, "fskv_rpc_requests_total", &["method=\"mgmtd.Heartbeat\""], 3.0);
    at_least(&m, "fskv_rpc_request_duration_seconds_count", &["method=\"mgmtd.Heartbeat\""], 3.0);

    // meta: the file's create and close, committed.
    let t = scrape(&meta);
    at_least(&t, "fskv_meta_ops_total", &["op=\"create\"", "result=\"ok\""], 1.0);
    at_least(&t, "fskv_meta_ops_total", &["op=\"close\"", "result=\"ok\""], 1.0);
    at_least(&t, "fskv_meta_txn_commits_total", &[], 2.0);
    assert!(sum(&t, "fskv_meta_txn_retries_total", &[]).unwrap_or(0.0) >= 0.0);
    at_least(&t, "fskv_rpc_requests_total", &["method=\"meta."], 2.0);
    assert_eq!(sum(&t, "fskv_rpc_requests_in_flight", &[]), Some(0.0), "{t}");

    // storage: every replica applied the file's bytes; the reads came from somewhere.
    let s: Vec<String> = storage.iter().map(|a| scrape(a)).collect();
    let total = |name: &str, labels: &[&str]| s.iter().map(|t| sum(t, name, labels).unwrap_or(0.0)).sum::<f64>();
    for (addr, text) in storage.iter().zip(&s) {
        at_least(text, "fskv_storage_write_bytes_total", &[], file_bytes as f64);
        at_least(text, "fskv_storage_target_used_bytes", &[], file_bytes as f64);
        at_least(text, "fskv_storage_target_chunks", &[], 1.0);
        at_least(text, "fskv_storage_target_capacity_bytes", &[], file_bytes as f64);
        at_least(text, "fskv_storage_target_free_bytes", &[], 1.0);
        assert!(sum(text, "fskv_storage_journal_records_total", &[]).is_some(), "{addr}: no journal stats");
        assert_eq!(sum(text, "fskv_storage_syncs_running", &[]), Some(0.0), "{addr}");
        at_least(text, "fskv_rpc_connections_accepted_total", &[], 1.0);
    }
    // Every client write reached a head and was forwarded along its chain.
    let writes = total("fskv_rpc_requests_total", &["method=\"storage.WriteChunk\""]);
    assert!(writes >= 1.0, "client writes not counted");
    assert!(total("fskv_rpc_requests_total", &["method=\"storage.ForwardChunk\""]) >= writes, "forwards not counted");
    assert!(total("fskv_storage_write_ops_total", &[]) >= 3.0, "engine updates not counted");
    assert!(total("fskv_storage_read_bytes_total", &[]) >= file_bytes as f64, "reads not counted");

    // RPC still works on the scraped ports, and the CLI prints the same text.
    fskv_ok(&["get", "--mgmtd", &mgmtd, "--meta", &meta, "/metrics.bin", back.to_str().unwrap()]);
    let out = fskv_ok(&["admin", "metrics", "--addr", &storage[0]]);
    let text = String::from_utf8(out.stdout).unwrap();
    at_least(&text, "fskv_rpc_http_requests_total", &["status=\"200\""], 1.0);
    at_least(&text, "fskv_storage_write_bytes_total", &[], file_bytes as f64);
    up.stop();
}
