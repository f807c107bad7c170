//! The `fskv` binary as a user runs it.

use std::process::Command;

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
fn up_refuses_a_busy_port_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    // P+11 (mgmtd) is the busy port.
    let base = port - 11;
    let out = fskv().args(["up", "--check", "--base-port", &base.to_string(), "--data"]).arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("127.0.0.1:{port}")) && err.contains("in use"), "unclear error: {err}");
}
