//! `fskv meta` as a process: serves on the embedded engine, survives kill -9
//! and a restart with its namespace intact.

use fskv_client::{MetaClient, MetaClientConfig};
use fskv_types::InodeId;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

fn start_meta(data: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fskv"))
        // The test's in-process client holds no key: a service without authentication.
        .args(["meta", "--insecure-no-auth", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next().expect("fskv meta exited before serving").unwrap();
    let addr = line.split("serving on ").nth(1).and_then(|s| s.split_whitespace().next()).unwrap().to_string();
    // Keep draining stdout so the server's later prints do not hit a closed pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

#[tokio::test]
async fn meta_process_survives_kill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut first, addr) = start_meta(dir.path());
    let client = MetaClient::new(MetaClientConfig::new(vec![addr])).unwrap();
    let d = client.mkdir(InodeId::ROOT, "kept", 0o755).await.unwrap();
    let f = client.create(d.id, "file", 0o644, true).await.unwrap();
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();

    let (mut second, addr) = start_meta(dir.path());
    let client = MetaClient::new(MetaClientConfig::new(vec![addr])).unwrap();
    assert_eq!(client.resolve("/kept/file").await.unwrap().id, f.id);
    let g = client.create(d.id, "after-restart", 0o644, true).await.unwrap();
    assert_ne!(g.id, f.id, "inode ids are never reused across restarts");
    send_sigterm(&second);
    assert!(second.wait().unwrap().success(), "fskv meta did not stop cleanly on SIGTERM");
}

fn send_sigterm(child: &Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}
