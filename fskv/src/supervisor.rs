//! Child-process supervision for `fskv up`: start each service as its own
//! process, keep `DIR/pids/<name>.pid` current, restart a child that dies
//! (after a delay that backs off while it keeps dying young), and on shutdown
//! send SIGTERM, wait a grace period, then SIGKILL.
//!
//! Each child's stdout and stderr are appended to `DIR/logs/<name>.log`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

/// What to run.
#[derive(Clone, Debug)]
pub struct ChildSpec {
    /// Unique name: the pid file is `pids/<name>.pid`, the log `logs/<name>.log`.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How to supervise.
#[derive(Clone, Debug)]
pub struct SupervisorOptions {
    /// Directory holding `pids/` and `logs/`.
    pub data_dir: PathBuf,
    /// Restart children that exit (`fskv up --no-restart` turns it off).
    pub restart: bool,
    /// First restart delay; doubles while a child keeps dying within
    /// `stable_after_ms`, up to `max_restart_delay_ms`.
    pub restart_delay_ms: u64,
    pub max_restart_delay_ms: u64,
    pub stable_after_ms: u64,
    /// Time between SIGTERM and SIGKILL at shutdown.
    pub stop_grace_ms: u64,
    /// Passed to every child as `--config FILE` (`fskv up` writes its
    /// effective configuration there, so children follow the same file).
    pub config_file: Option<PathBuf>,
}

impl SupervisorOptions {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        SupervisorOptions {
            data_dir: data_dir.into(),
            restart: true,
            restart_delay_ms: 500,
            max_restart_delay_ms: 10_000,
            stable_after_ms: 10_000,
            stop_grace_ms: 10_000,
            config_file: None,
        }
    }
}

/// The live state of one child, for status output and tests.
#[derive(Clone, Debug, Default)]
pub struct ChildStatus {
    pub pid: Option<u32>,
    pub starts: u32,
    pub last_exit: Option<String>,
}

struct Supervised {
    spec: ChildSpec,
    status: Arc<Mutex<ChildStatus>>,
    task: JoinHandle<()>,
}

pub struct Supervisor {
    children: Vec<Supervised>,
    stop_tx: watch::Sender<bool>,
}

fn pid_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("pids").join(format!("{name}.pid"))
}

impl Supervisor {
    /// Starts every child (in order) and supervises them until `shutdown`.
    pub async fn start(specs: Vec<ChildSpec>, opts: SupervisorOptions) -> anyhow::Result<Supervisor> {
        for sub in ["pids", "logs"] {
            let d = opts.data_dir.join(sub);
            std::fs::create_dir_all(&d).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", d.display()))?;
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut children = Vec::new();
        for spec in specs {
            anyhow::ensure!(!children.iter().any(|c: &Supervised| c.spec.name == spec.name), "two children named {}", spec.name);
            let status = Arc::new(Mutex::new(ChildStatus::default()));
            let first = spawn(&spec, &opts).await?;
            record_start(&spec, &opts, &status, &first).await;
            let task = tokio::spawn(supervise(spec.clone(), opts.clone(), status.clone(), first, stop_rx.clone()));
            children.push(Supervised { spec, status, task });
        }
        Ok(Supervisor { children, stop_tx })
    }

    pub async fn status(&self) -> Vec<(String, ChildStatus)> {
        let mut out = Vec::new();
        for c in &self.children {
            out.push((c.spec.name.clone(), c.status.lock().await.clone()));
        }
        out
    }

    /// Stops every child (SIGTERM, then SIGKILL after the grace period) in
    /// reverse start order, and waits for them.
    pub async fn shutdown(self) {
        let _ = self.stop_tx.send(true);
        for c in self.children.into_iter().rev() {
            if c.task.await.is_err() {
                tracing::error!(child = %c.spec.name, "supervisor task panicked");
            }
        }
    }
}

async fn spawn(spec: &ChildSpec, opts: &SupervisorOptions) -> anyhow::Result<Child> {
    let log_path = opts.data_dir.join("logs").join(format!("{}.log", spec.name));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| anyhow::anyhow!("cannot open log {}: {e}", log_path.display()))?;
    let log_err = log.try_clone()?;
    let mut cmd = Command::new(&spec.program);
    if let Some(file) = &opts.config_file {
        cmd.arg("--config").arg(file);
    }
    cmd.args(&spec.args)
        .envs(spec.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .kill_on_drop(true);
    cmd.spawn().map_err(|e| anyhow::anyhow!("cannot start {} ({}): {e}", spec.name, spec.program.display()))
}

async fn record_start(spec: &ChildSpec, opts: &SupervisorOptions, status: &Mutex<ChildStatus>, child: &Child) {
    let pid = child.id();
    if let Some(pid) = pid {
        let path = pid_path(&opts.data_dir, &spec.name);
        if let Err(e) = std::fs::write(&path, format!("{pid}\n")) {
            tracing::warn!(child = %spec.name, error = %e, "cannot write pid file {}", path.display());
        }
    }
    let mut s = status.lock().await;
    s.pid = pid;
    s.starts += 1;
    tracing::info!(child = %spec.name, pid, starts = s.starts, "started");
}

async fn supervise(
    spec: ChildSpec,
    opts: SupervisorOptions,
    status: Arc<Mutex<ChildStatus>>,
    mut child: Child,
    mut stop_rx: watch::Receiver<bool>,
) {
    let mut delay_ms = opts.restart_delay_ms;
    loop {
        let started = tokio::time::Instant::now();
        tokio::select! {
            exit = child.wait() => {
                let what = match exit {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("wait failed: {e}"),
                };
                let _ = std::fs::remove_file(pid_path(&opts.data_dir, &spec.name));
                {
                    let mut s = status.lock().await;
                    s.pid = None;
                    s.last_exit = Some(what.clone());
                }
                if !opts.restart || *stop_rx.borrow() {
                    tracing::warn!(child = %spec.name, exit = %what, "exited; not restarting");
                    return;
                }
                if started.elapsed() >= Duration::from_millis(opts.stable_after_ms) {
                    delay_ms = opts.restart_delay_ms;
                }
                tracing::warn!(child = %spec.name, exit = %what, restart_in_ms = delay_ms, "exited; restarting");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
                    _ = stop_rx.changed() => return,
                }
                delay_ms = (delay_ms * 2).min(opts.max_restart_delay_ms);
                match spawn(&spec, &opts).await {
                    Ok(c) => {
                        child = c;
                        record_start(&spec, &opts, &status, &child).await;
                    }
                    Err(e) => {
                        tracing::error!(child = %spec.name, error = %e, "restart failed; giving up on this child");
                        return;
                    }
                }
            }
            _ = stop_rx.changed() => {
                stop_child(&spec, &opts, &mut child).await;
                status.lock().await.pid = None;
                return;
            }
        }
    }
}

async fn stop_child(spec: &ChildSpec, opts: &SupervisorOptions, child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) with a pid we spawned and have not yet reaped.
        let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        if rc == 0 {
            let grace = Duration::from_millis(opts.stop_grace_ms);
            if tokio::time::timeout(grace, child.wait()).await.is_ok() {
                let _ = std::fs::remove_file(pid_path(&opts.data_dir, &spec.name));
                tracing::info!(child = %spec.name, "stopped");
                return;
            }
            tracing::warn!(child = %spec.name, grace_ms = opts.stop_grace_ms, "did not stop after SIGTERM; killing");
        }
    }
    let _ = child.kill().await;
    let _ = std::fs::remove_file(pid_path(&opts.data_dir, &spec.name));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(name: &str) -> ChildSpec {
        ChildSpec { name: name.into(), program: "sleep".into(), args: vec!["30".into()], env: vec![] }
    }

    fn read_pid(dir: &Path, name: &str) -> Option<u32> {
        std::fs::read_to_string(pid_path(dir, name)).ok()?.trim().parse().ok()
    }

    fn alive(pid: u32) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }

    async fn wait_for<F: Fn() -> bool>(f: F) -> bool {
        for _ in 0..100 {
            if f() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn fast(dir: &Path) -> SupervisorOptions {
        SupervisorOptions { restart_delay_ms: 50, stop_grace_ms: 2_000, ..SupervisorOptions::new(dir) }
    }

    #[tokio::test]
    async fn restarts_a_killed_child_and_stops_all_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let sup = Supervisor::start(vec![sleeper("a"), sleeper("b")], fast(dir.path())).await.unwrap();
        let a1 = read_pid(dir.path(), "a").expect("pid file of a");
        let b1 = read_pid(dir.path(), "b").expect("pid file of b");
        assert!(alive(a1) && alive(b1));
        // SAFETY: a1 is our child.
        unsafe { libc::kill(a1 as libc::pid_t, libc::SIGKILL) };
        assert!(wait_for(|| read_pid(dir.path(), "a").is_some_and(|p| p != a1)).await, "a was not restarted");
        let a2 = read_pid(dir.path(), "a").unwrap();
        assert!(alive(a2));
        let status = sup.status().await;
        assert_eq!(status[0].1.starts, 2);
        assert!(status[0].1.last_exit.as_deref().unwrap_or("").contains("signal"), "{status:?}");
        sup.shutdown().await;
        assert!(wait_for(|| !alive(a2) && !alive(b1)).await, "children survived shutdown");
        assert!(read_pid(dir.path(), "a").is_none() && read_pid(dir.path(), "b").is_none(), "pid files left behind");
    }

    #[tokio::test]
    async fn no_restart_leaves_a_dead_child_dead() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SupervisorOptions { restart: false, ..fast(dir.path()) };
        let sup = Supervisor::start(vec![sleeper("a")], opts).await.unwrap();
        let a1 = read_pid(dir.path(), "a").unwrap();
        // SAFETY: a1 is our child.
        unsafe { libc::kill(a1 as libc::pid_t, libc::SIGKILL) };
        assert!(wait_for(|| read_pid(dir.path(), "a").is_none()).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(read_pid(dir.path(), "a").is_none(), "restarted despite restart = false");
        assert_eq!(sup.status().await[0].1.starts, 1);
        sup.shutdown().await;
    }

    #[tokio::test]
    async fn a_child_ignoring_sigterm_is_killed_after_the_grace_period() {
        let dir = tempfile::tempdir().unwrap();
        let stubborn = ChildSpec {
            name: "stubborn".into(),
            program: "sh".into(),
            args: vec!["-c".into(), "trap '' TERM; sleep 30".into()],
            env: vec![],
        };
        let opts = SupervisorOptions { stop_grace_ms: 200, ..fast(dir.path()) };
        let sup = Supervisor::start(vec![stubborn], opts).await.unwrap();
        let pid = read_pid(dir.path(), "stubborn").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await; // let the trap install
        let t = std::time::Instant::now();
        sup.shutdown().await;
        assert!(!alive(pid), "still alive after shutdown");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_missing_program_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ChildSpec { name: "x".into(), program: "/nonexistent/fskv".into(), args: vec![], env: vec![] };
        let err = Supervisor::start(vec![spec], fast(dir.path())).await.err().expect("must fail");
        assert!(err.to_string().contains("/nonexistent/fskv"), "{err}");
    }
}
