#![allow(dead_code)]
//! Helpers shared by the CLI tests that run `fskv up`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_base_port() -> u16 {
    // A base whose P+11..P+15 are free right now (best effort).
    for _ in 0..50 {
        let p = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let base = p.saturating_sub(20).max(20_000);
        if base <= 60_000 && (11..=15).all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok()) {
            return base;
        }
    }
    panic!("no free port range");
}

/// Starts `fskv up` and waits for its "serving" line.
pub fn start_up(data: &Path, base: u16) -> Child {
    start_up_with(data, base, &[])
}

/// [`start_up`] with extra arguments for `fskv up`.
pub fn start_up_with(data: &Path, base: u16, extra: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fskv"))
        .args(["up", "--heartbeat-timeout-ms", "3000", "--base-port", &base.to_string(), "--data"])
        .arg(data)
        .args(extra)
        .env("FSKV_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
