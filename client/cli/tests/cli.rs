//! The `fskv` binary as a user runs it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fskv() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fskv"))
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run fskv");
    assert!(out.status.success(), "fskv failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn help_lists_the_subcommands() {
    let help = stdout_of(fskv().arg("--help"));
    for sub in ["up", "bench", "config"] {
        assert!(help.contains(sub), "--help lacks {sub}: {help}");
    }
    let bench = stdout_of(fskv().args(["bench", "--help"]));
    for sub in ["rpc", "kv"] {
        assert!(bench.contains(sub), "bench --help lacks {sub}: {bench}");
    }
}

#[test]
fn default_config_round_trips_and_bad_config_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let default = stdout_of(fskv().args(["config", "default"]));
    let path = dir.path().join("fskv.toml");
    std::fs::write(&path, &default).unwrap();
    let shown = stdout_of(fskv().args(["config", "show", "--config"]).arg(&path));
    assert!(shown.contains("base_port = 9000"), "{shown}");

    std::fs::write(&path, "[kv]\nengine = \"sqlite\"\n").unwrap();
    let out = fskv().args(["config", "show", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sqlite") && err.contains("fskv.toml"), "unclear error: {err}");
}

#[test]
fn up_keeps_its_cluster_across_restarts_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = stdout_of(fskv().args(["up", "--check", "--data"]).arg(&data));
    assert!(first.contains("(new)"), "{first}");
    let id = first.split("cluster ").nth(1).and_then(|s| s.split_whitespace().next()).unwrap().to_string();
    let second = stdout_of(fskv().args(["up", "--check", "--data"]).arg(&data));
    assert!(second.contains(&id) && second.contains("(existing data)"), "restart lost the cluster: {second}");

    let mut child = fskv().args(["up", "--data"]).arg(&data).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = lines.next().expect("fskv up exited before serving").unwrap();
        if line.contains("serving") {
            break;
        }
        assert!(Instant::now() < deadline, "fskv up did not start");
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "fskv up exited with {status} on SIGTERM");
    assert!(rest.iter().any(|l| l.contains("stopped cleanly")), "{rest:?}");
}
