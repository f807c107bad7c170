//! The async shell around [`crate::machine::PoolMachine`]: one per pool.
//!
//! | machine action | what the shell does |
//! |---|---|
//! | `Start(p)` | spawns the gateway process (`fskv gateway <proto> --role R --listen 127.0.0.1:0 …`) with a pipe in `FSKV_GATEWAY_READY_FD`; the gateway writes its address there once serving → `ready(p)`; exit → `exited(p)` |
//! | `Stop(p)` | SIGTERM (the gateway drains), SIGKILL after `stop_grace_ms`; exit → `exited(p)` |
//! | `Kill(p)` | SIGKILL; exit → `exited(p)` |
//! | `Probe(p)` | a TCP connect within `upstream_connect_timeout_ms` → `probed(p, ok)` |
//! | `Dispatch(r, p)` / `Reject(r, why)` | wakes the held request `r` |
//!
//! Every event runs the machine under one lock, then its actions, then
//! copies its view to the metrics. One ticker task per pool sleeps until the
//! machine's next deadline (at most 1 s) and ticks it. Gateway processes get
//! `PR_SET_PDEATHSIG` = SIGTERM, so they do not outlive a front killed with
//! SIGKILL.

use crate::machine::{Admission, PoolKind, PoolMachine, PoolSettings, ProcId, ProcState, Reject, ReqId};
use crate::metrics::PoolMetrics;
use fskv_gateway::Role;
use http::uri::Authority;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::{oneshot, watch, Notify};

/// How a managed pool starts a gateway process.
#[derive(Clone, Debug)]
pub struct Launch {
    pub program: PathBuf,
    /// The whole argument list (`--config F gateway s3 --role reader --listen 127.0.0.1:0 …`).
    pub args: Vec<String>,
    /// Where the process's stdout and stderr are appended (else inherited).
    pub log_file: Option<PathBuf>,
    /// A private directory for the processes' Unix sockets: each is started
    /// with `FSKV_GATEWAY_UNIX_SOCKET` = `DIR/<protocol>-<role>-<proc>.sock`
    /// and the front sends its requests there (None: over TCP to `--listen`).
    pub socket_dir: Option<PathBuf>,
    /// Give each process a handover channel (`FSKV_GATEWAY_HANDOVER_FD`):
    /// the front may pass it accepted client connections
    /// ([`fskv_gateway::handover`]).
    pub handover: bool,
    /// The front's return socket for this protocol (`FSKV_GATEWAY_RETURN_SOCKET`).
    pub return_socket: Option<PathBuf>,
    /// The pool's idle timeout, passed as handed connections' idle timeout
    /// (`FSKV_GATEWAY_HANDED_IDLE_MS`).
    pub idle_timeout_ms: u64,
    /// `handed_connection_max_age_ms` (`FSKV_GATEWAY_HANDED_MAX_AGE_MS`).
    pub handed_max_age_ms: u64,
}

/// Where a pool's processes come from.
#[derive(Clone, Debug)]
pub enum Source {
    Managed(Launch),
    /// `host:port` of gateways running elsewhere.
    Static(Vec<String>),
}

/// Timeouts the shell itself applies.
#[derive(Clone, Copy, Debug)]
pub struct ShellTiming {
    pub connect_timeout: Duration,
    pub stop_grace: Duration,
}

/// Where a dispatched request goes.
#[derive(Clone, Debug)]
pub struct Target {
    pub proc: ProcId,
    pub authority: Authority,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ctl {
    Run,
    Stop,
    Kill,
}

struct ProcEntry {
    authority: Option<Authority>,
    /// The process's Unix socket, when requests go there (see [`UnixRoutes`]).
    unix: Option<PathBuf>,
    /// Its TCP address (`--listen`; also where its metrics are scraped).
    tcp: Option<std::net::SocketAddr>,
    pid: Option<u32>,
    ctl: Option<watch::Sender<Ctl>>,
    /// The front's end of the process's handover channel.
    handover: Option<Arc<OwnedFd>>,
}

struct Inner {
    m: PoolMachine,
    waiters: HashMap<ReqId, oneshot::Sender<Result<Target, Reject>>>,
    procs: HashMap<ProcId, ProcEntry>,
    next_req: ReqId,
    metrics: PoolMetrics,
    /// What the ticker sleeps until.
    wake_at: Option<Instant>,
}

/// One pool of gateway processes (or static upstreams) of a protocol and role.
pub struct Pool {
    pub protocol: &'static str,
    pub role: Role,
    source: Source,
    timing: ShellTiming,
    unix_routes: UnixRoutes,
    inner: Mutex<Inner>,
    wake: Notify,
}

/// Why the pool would not start.
#[derive(Debug, thiserror::Error)]
#[error("pool {protocol} {role}: {message}")]
pub struct PoolError {
    pub protocol: &'static str,
    pub role: Role,
    pub message: String,
}

impl Pool {
    /// A pool and its ticker task (needs a tokio runtime).
    pub fn start(
        protocol: &'static str,
        role: Role,
        settings: PoolSettings,
        source: Source,
        timing: ShellTiming,
        unix_routes: UnixRoutes,
        metrics: PoolMetrics,
    ) -> Result<Arc<Pool>, PoolError> {
        let err = |message: String| PoolError { protocol, role, message };
        settings.validate().map_err(err)?;
        let now = Instant::now();
        let mut procs = HashMap::new();
        let kind = match &source {
            Source::Managed(_) => PoolKind::Managed,
            Source::Static(upstreams) => {
                if upstreams.is_empty() {
                    return Err(err("a static pool needs at least one upstream".into()));
                }
                for (i, u) in upstreams.iter().enumerate() {
                    let authority: Authority = u.parse().map_err(|e| err(format!("upstream {u:?}: {e}")))?;
                    procs.insert(
                        i as ProcId,
                        ProcEntry { authority: Some(authority), unix: None, tcp: None, pid: None, ctl: None, handover: None },
                    );
                }
                PoolKind::Static { upstreams: upstreams.len() }
            }
        };
        let m = PoolMachine::new(settings, kind, now);
        let pool = Arc::new(Pool {
            protocol,
            role,
            source,
            timing,
            unix_routes,
            inner: Mutex::new(Inner { m, waiters: HashMap::new(), procs, next_req: 0, metrics, wake_at: None }),
            wake: Notify::new(),
        });
        {
            let mut inner = pool.inner.lock();
            pool.after_event(&mut inner, now);
        }
        tokio::spawn(Arc::clone(&pool).ticker());
        Ok(pool)
    }

    /// Whether the pool can ever have a process (false: `max == 0` and no upstream).
    pub fn can_serve(&self) -> bool {
        let inner = self.inner.lock();
        matches!(inner.m.kind(), PoolKind::Static { .. }) || inner.m.settings().max_processes > 0
    }

    /// Runs `f` on the machine under the lock, then the actions it queued.
    fn event<R>(self: &Arc<Self>, f: impl FnOnce(&mut PoolMachine, Instant) -> R) -> R {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let r = f(&mut inner.m, now);
        self.after_event(&mut inner, now);
        r
    }

    fn after_event(self: &Arc<Self>, inner: &mut Inner, now: Instant) {
        self.run_actions(inner, now);
        let Inner { m, metrics, .. } = inner;
        metrics.sync(m);
        if let Some(d) = inner.m.next_deadline() {
            if inner.wake_at.map_or(true, |w| d < w) {
                inner.wake_at = Some(d);
                self.wake.notify_one();
            }
        }
    }

    fn run_actions(self: &Arc<Self>, inner: &mut Inner, now: Instant) {
        use crate::machine::Action;
        while let Some(a) = inner.m.poll_action() {
            match a {
                Action::Start(p) => {
                    let (tx, rx) = watch::channel(Ctl::Run);
                    inner.procs.insert(p, ProcEntry { authority: None, unix: None, tcp: None, pid: None, ctl: Some(tx), handover: None });
                    tokio::spawn(Arc::clone(self).run_process(p, rx));
                }
                Action::Stop(p) | Action::Kill(p) => {
                    let ctl = if matches!(a, Action::Stop(_)) { Ctl::Stop } else { Ctl::Kill };
                    if let Some(tx) = inner.procs.get(&p).and_then(|e| e.ctl.as_ref()) {
                        tx.send_if_modified(|c| {
                            let escalate = *c == Ctl::Run || ctl == Ctl::Kill;
                            if escalate {
                                *c = ctl;
                            }
                            escalate
                        });
                    }
                }
                Action::Probe(p) => match inner.procs.get(&p).and_then(|e| e.authority.clone().map(|a| (a, e.unix.clone()))) {
                    Some((authority, unix)) => {
                        tokio::spawn(Arc::clone(self).probe(p, authority, unix));
                    }
                    None => inner.m.probed(p, false, now),
                },
                Action::Dispatch(r, p) => {
                    let target = inner.procs.get(&p).and_then(|e| e.authority.clone()).map(|authority| Target { proc: p, authority });
                    match (inner.waiters.remove(&r), target) {
                        (Some(tx), Some(t)) => {
                            if tx.send(Ok(t)).is_err() {
                                inner.m.finished(p, now);
                            }
                        }
                        (Some(tx), None) => {
                            // Cannot happen (only ready processes take requests); fail it cleanly.
                            tracing::error!(proc = p, "dispatch to a process without an address");
                            inner.m.finished(p, now);
                            let _ = tx.send(Err(Reject::NoProcess));
                        }
                        (None, _) => inner.m.finished(p, now),
                    }
                }
                Action::Reject(r, why) => {
                    if let Some(tx) = inner.waiters.remove(&r) {
                        let _ = tx.send(Err(why));
                    }
                }
            }
        }
    }

    /// `handed_connection_max_age_ms` if the pool's processes take handed
    /// connections; `None` if it never hands over (static upstreams, or
    /// launched without a handover channel).
    pub fn handed_max_age(&self) -> Option<Duration> {
        match &self.source {
            Source::Managed(launch) if launch.handover => Some(Duration::from_millis(launch.handed_max_age_ms)),
            _ => None,
        }
    }

    /// A process for one request if one can take it at once, with its
    /// handover channel; `None` otherwise, with nothing held, started or
    /// counted (the connection is then proxied, and its first request held
    /// and counted as usual). A handed connection holds the
    /// ticket while it is open.
    pub fn try_acquire_now(self: &Arc<Self>) -> Option<(Ticket, Arc<OwnedFd>)> {
        // Static upstreams and pools launched without a channel never hand
        // over: asking the machine would count a request that never was.
        self.handed_max_age()?;
        let now = Instant::now();
        let got = {
            let mut inner = self.inner.lock();
            let got = match inner.m.request_now(now) {
                Some(p) => match inner.procs.get(&p).and_then(|e| Some((e.authority.clone()?, e.handover.clone()?))) {
                    Some((authority, channel)) => Some((Target { proc: p, authority }, channel)),
                    None => {
                        inner.m.finished(p, now);
                        None
                    }
                },
                None => None,
            };
            self.after_event(&mut inner, now);
            got
        };
        // The ticket is made outside the lock (its drop takes it).
        got.map(|(target, channel)| (Ticket { pool: Arc::clone(self), target }, channel))
    }

    /// A process for one request: at once, or after being held; or why not.
    pub async fn acquire(self: &Arc<Self>) -> Result<Ticket, Reject> {
        enum Got {
            Now(Target),
            Wait(oneshot::Receiver<Result<Target, Reject>>),
            No(Reject),
        }
        let started = Instant::now();
        let (req, got) = {
            let mut inner = self.inner.lock();
            let req = inner.next_req;
            inner.next_req += 1;
            let got = match inner.m.request(req, started) {
                Admission::Dispatch(p) => match inner.procs.get(&p).and_then(|e| e.authority.clone()) {
                    Some(authority) => {
                        inner.metrics.hold.observe(0.0);
                        Got::Now(Target { proc: p, authority })
                    }
                    None => {
                        inner.m.finished(p, started);
                        Got::No(Reject::NoProcess)
                    }
                },
                Admission::Queued => {
                    // The receiver is kept across `after_event`, which may
                    // already answer it (a process became free in the same event).
                    let (tx, rx) = oneshot::channel();
                    inner.waiters.insert(req, tx);
                    Got::Wait(rx)
                }
                Admission::Rejected(r) => Got::No(r),
            };
            self.after_event(&mut inner, started);
            (req, got)
        };
        // Tickets are made and dropped outside the lock (their drop takes it).
        let rx = match got {
            Got::Now(target) => return Ok(Ticket { pool: Arc::clone(self), target }),
            Got::No(r) => return Err(r),
            Got::Wait(rx) => rx,
        };
        let mut held = Held { pool: Arc::clone(self), req, rx, settled: false };
        let r = (&mut held.rx).await;
        held.settled = true;
        match r {
            Ok(Ok(target)) => {
                self.inner.lock().metrics.hold.observe(started.elapsed().as_secs_f64());
                Ok(Ticket { pool: Arc::clone(self), target })
            }
            Ok(Err(why)) => Err(why),
            Err(_) => Err(Reject::ShuttingDown),
        }
    }

    async fn probe(self: Arc<Self>, p: ProcId, authority: Authority, unix: Option<PathBuf>) {
        let limit = self.timing.connect_timeout;
        let ok = match unix {
            Some(path) => matches!(tokio::time::timeout(limit, tokio::net::UnixStream::connect(path)).await, Ok(Ok(_))),
            None => matches!(tokio::time::timeout(limit, tokio::net::TcpStream::connect(authority.as_str())).await, Ok(Ok(_))),
        };
        if !ok {
            tracing::warn!(protocol = self.protocol, role = %self.role, proc = p, upstream = %authority, "probe failed: no connection");
        }
        self.event(|m, now| m.probed(p, ok, now));
    }

    async fn ticker(self: Arc<Self>) {
        loop {
            let at = {
                let mut inner = self.inner.lock();
                if inner.m.is_stopped() {
                    return;
                }
                let now = Instant::now();
                let at = inner.m.next_deadline().map_or(now + Duration::from_secs(1), |d| d.min(now + Duration::from_secs(1)));
                inner.wake_at = Some(at);
                at
            };
            tokio::select! {
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                _ = self.wake.notified() => {}
            }
            self.event(|m, now| m.tick(now));
        }
    }

    /// One gateway process from spawn to exit.
    async fn run_process(self: Arc<Self>, p: ProcId, mut ctl: watch::Receiver<Ctl>) {
        let Source::Managed(launch) = &self.source else { return };
        let socket = launch.socket_dir.as_ref().map(|d| d.join(format!("{}-{}-{p}.sock", self.protocol, self.role.as_str())));
        let (mut child, mut ready, channel) = match spawn_gateway(launch, socket.as_deref()) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(protocol = self.protocol, role = %self.role, proc = p, error = %e, program = %launch.program.display(), "cannot start a gateway process");
                self.event(|m, now| m.exited(p, now));
                return;
            }
        };
        let pid = child.id();
        if let Some(e) = self.inner.lock().procs.get_mut(&p) {
            e.pid = pid;
            e.handover = channel.map(Arc::new);
        }
        tracing::info!(protocol = self.protocol, role = %self.role, proc = p, pid, "gateway process started");
        // Until it serves (or exits, or is stopped first).
        let mut buf = Vec::with_capacity(64);
        let ready_line = read_ready_line(&mut ready, &mut buf);
        tokio::pin!(ready_line);
        let mut waiting_ready = true;
        let mut kill_at: Option<tokio::time::Instant> = None;
        loop {
            let c = *ctl.borrow_and_update();
            match c {
                Ctl::Run => {}
                Ctl::Stop if kill_at.is_none() => {
                    if let Some(pid) = pid {
                        // SAFETY: kill(2) on our child, not yet reaped (we hold its Child).
                        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                    }
                    kill_at = Some(tokio::time::Instant::now() + self.timing.stop_grace);
                }
                Ctl::Stop => {}
                Ctl::Kill => {
                    let _ = child.start_kill();
                }
            }
            tokio::select! {
                status = child.wait() => {
                    let what = match status { Ok(s) => s.to_string(), Err(e) => format!("wait failed: {e}") };
                    let asked = self.event(|m, now| {
                        let asked = m.state_of(p) == Some(ProcState::Stopping);
                        m.exited(p, now);
                        asked
                    });
                    if let Some(e) = self.inner.lock().procs.remove(&p) {
                        if let (Some(a), Some(_)) = (e.authority, e.unix) {
                            self.unix_routes.remove(&a);
                        }
                    }
                    if asked {
                        tracing::info!(protocol = self.protocol, role = %self.role, proc = p, pid, exit = %what, "gateway process stopped");
                    } else {
                        tracing::warn!(protocol = self.protocol, role = %self.role, proc = p, pid, exit = %what, "gateway process exited unexpectedly");
                    }
                    return;
                }
                line = &mut ready_line, if waiting_ready => {
                    waiting_ready = false;
                    match line {
                        Ok((addr, unix)) => {
                            // Requests go to the Unix socket when the process serves one: under a
                            // name of its own (the pooled connections' key), which the connector
                            // maps to the path.
                            let authority: Option<Authority> = match &unix {
                                Some(path) => {
                                    let a: Option<Authority> = format!("{}-{}-{p}.unix", self.protocol, self.role.as_str()).parse().ok();
                                    if let Some(a) = &a {
                                        self.unix_routes.insert(a.clone(), path.clone());
                                    }
                                    a
                                }
                                None => addr.to_string().parse().ok(),
                            };
                            let took = {
                                let now = Instant::now();
                                let mut inner = self.inner.lock();
                                if let Some(e) = inner.procs.get_mut(&p) {
                                    e.authority = authority;
                                    e.unix = unix;
                                    e.tcp = Some(addr);
                                }
                                let took = inner.m.ready(p, now);
                                if let Some(d) = took {
                                    inner.metrics.cold_start.observe(d.as_secs_f64());
                                }
                                self.after_event(&mut inner, now);
                                took
                            };
                            tracing::info!(protocol = self.protocol, role = %self.role, proc = p, pid, %addr, start_ms = took.map(|d| d.as_millis() as u64), "gateway process serving");
                        }
                        Err(e) => {
                            // It exits (or the start times out and it is killed).
                            tracing::warn!(protocol = self.protocol, role = %self.role, proc = p, pid, error = %e, "gateway process gave no address");
                        }
                    }
                }
                r = ctl.changed() => {
                    if r.is_err() {
                        let _ = child.start_kill();
                    }
                }
                _ = sleep_until_opt(kill_at) => {
                    tracing::warn!(protocol = self.protocol, role = %self.role, proc = p, pid, grace_ms = self.timing.stop_grace.as_millis() as u64, "gateway process did not stop after SIGTERM; killing it");
                    let _ = child.start_kill();
                    kill_at = Some(tokio::time::Instant::now() + Duration::from_secs(3600));
                }
            }
        }
    }

    /// Rejects the held requests and new ones, drains and stops every
    /// process; waits up to `bound` for them to exit, then kills the rest.
    pub async fn shutdown(self: &Arc<Self>, bound: Duration) {
        self.event(|m, now| m.shutdown(now));
        let deadline = Instant::now() + bound;
        while !self.inner.lock().m.is_stopped() {
            if Instant::now() >= deadline {
                tracing::warn!(protocol = self.protocol, role = %self.role, "gateway processes still running at the end of the shutdown bound; killing them");
                self.kill_all();
                for _ in 0..100 {
                    if self.inner.lock().m.is_stopped() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill_all(&self) {
        let inner = self.inner.lock();
        for e in inner.procs.values() {
            if let Some(tx) = &e.ctl {
                let _ = tx.send(Ctl::Kill);
            }
        }
    }

    /// The pool as `GET /status` shows it.
    pub fn status(&self) -> PoolStatus {
        let now = Instant::now();
        let inner = self.inner.lock();
        let m = &inner.m;
        let c = m.counters();
        let s = m.settings();
        let processes = m
            .processes(now)
            .into_iter()
            .map(|v| {
                let e = inner.procs.get(&v.id);
                ProcStatus {
                    id: v.id,
                    state: v.state.as_str().to_string(),
                    address: e.and_then(|e| match e.tcp {
                        Some(a) => Some(a.to_string()),
                        None => e.authority.as_ref().map(|a| a.to_string()),
                    }),
                    unix_socket: e.and_then(|e| e.unix.as_ref()).map(|p| p.display().to_string()),
                    pid: e.and_then(|e| e.pid),
                    in_flight: v.in_flight,
                    requests: v.dispatched,
                    age_ms: v.age.as_millis() as u64,
                    idle_ms: v.idle_for.map(|d| d.as_millis() as u64),
                }
            })
            .collect();
        PoolStatus {
            protocol: self.protocol.to_string(),
            role: self.role.as_str().to_string(),
            kind: match m.kind() {
                PoolKind::Managed => "managed".into(),
                PoolKind::Static { .. } => "static".into(),
            },
            min: s.min_processes,
            max: s.max_processes,
            processes,
            in_flight: m.requests_in_flight(),
            queued: m.queued(),
            starts: c.starts,
            stops: c.stops,
            crashes: c.crashes,
            start_failures: c.start_failures,
            requests: c.dispatched,
            held: c.queued,
            rejected: c.rejected,
            last_cold_start_ms: m.last_cold_start().map(|d| d.as_secs_f64() * 1000.0),
        }
    }

    pub(crate) fn count_retry(&self) {
        self.inner.lock().metrics.retries.inc();
    }

    pub(crate) fn count_upstream_error(&self) {
        self.inner.lock().metrics.upstream_errors.inc();
    }

    pub(crate) fn count_handed_over(&self) {
        self.inner.lock().metrics.handed_over.inc();
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// A held request's wait; leaving it (the client went away) takes the
/// request out of the queue, or gives back a process it was just given.
struct Held {
    pool: Arc<Pool>,
    req: ReqId,
    rx: oneshot::Receiver<Result<Target, Reject>>,
    settled: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let now = Instant::now();
        let mut inner = self.pool.inner.lock();
        if inner.waiters.remove(&self.req).is_some() {
            inner.m.cancel(self.req, now);
        } else if let Ok(Ok(t)) = self.rx.try_recv() {
            inner.m.finished(t.proc, now);
        }
        self.pool.after_event(&mut inner, now);
    }
}

/// A request's place on a process: its in-flight count until dropped.
pub struct Ticket {
    pool: Arc<Pool>,
    pub target: Target,
}

impl Ticket {
    /// The process failed this request before answering: it takes no more
    /// until a probe finds it accepting connections.
    pub fn connect_failed(&self) {
        let p = self.target.proc;
        self.pool.count_upstream_error();
        self.pool.event(|m, now| m.connect_failed(p, now));
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let p = self.target.proc;
        self.pool.event(|m, now| m.finished(p, now));
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("target", &self.target).finish()
    }
}

/// A pool in `GET /status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PoolStatus {
    pub protocol: String,
    pub role: String,
    /// `managed` (processes started here) or `static` (upstreams).
    pub kind: String,
    pub min: usize,
    pub max: usize,
    pub processes: Vec<ProcStatus>,
    pub in_flight: usize,
    pub queued: usize,
    pub starts: u64,
    pub stops: u64,
    pub crashes: u64,
    pub start_failures: u64,
    /// Requests dispatched to a process.
    pub requests: u64,
    /// Requests that had to wait for a process.
    pub held: u64,
    pub rejected: u64,
    pub last_cold_start_ms: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProcStatus {
    pub id: ProcId,
    pub state: String,
    /// `host:port` (of the process's `--listen`, or the static upstream).
    pub address: Option<String>,
    /// The Unix socket the front sends the process's requests to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_socket: Option<String>,
    pub pid: Option<u32>,
    pub in_flight: usize,
    pub requests: u64,
    pub age_ms: u64,
    pub idle_ms: Option<u64>,
}

/// The environment variable through which a gateway started by the front
/// reports its address (see `fskv_gateway::server::READY_FD_ENV`).
pub use fskv_gateway::handover::{HANDED_IDLE_ENV, HANDED_MAX_AGE_ENV, HANDOVER_FD_ENV, RETURN_SOCKET_ENV};
pub use fskv_gateway::server::{READY_FD_ENV, UNIX_SOCKET_ENV};

/// A gateway's ready line: its TCP address, then `unix:PATH` when it also
/// serves on a Unix socket.
fn parse_ready_line(line: &str) -> Result<(std::net::SocketAddr, Option<PathBuf>), String> {
    let (addr, rest) = match line.split_once(' ') {
        Some((a, r)) => (a, Some(r.trim())),
        None => (line, None),
    };
    let addr = addr.parse().map_err(|e| format!("ready line {line:?}: {e}"))?;
    let unix = match rest {
        None => None,
        Some(r) => match r.strip_prefix("unix:") {
            Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
            _ => return Err(format!("ready line {line:?}: expected `unix:PATH` after the address")),
        },
    };
    Ok((addr, unix))
}

/// Which upstream authorities are Unix sockets of gateway processes (the
/// pools fill it as processes become ready, the connector reads it).
#[derive(Clone, Default)]
pub struct UnixRoutes(Arc<parking_lot::RwLock<HashMap<Authority, PathBuf>>>);

impl UnixRoutes {
    pub fn insert(&self, authority: Authority, path: PathBuf) {
        self.0.write().insert(authority, path);
    }

    pub fn remove(&self, authority: &Authority) {
        self.0.write().remove(authority);
    }

    pub fn get(&self, authority: &Authority) -> Option<PathBuf> {
        self.0.read().get(authority).cloned()
    }
}

/// Spawns one gateway process with the write end of a pipe in
/// [`READY_FD_ENV`] (and, with `launch.handover`, one end of a handover
/// channel in [`HANDOVER_FD_ENV`]); returns the child, the pipe's read end
/// and the channel's other end.
fn spawn_gateway(
    launch: &Launch,
    socket: Option<&std::path::Path>,
) -> std::io::Result<(tokio::process::Child, tokio::net::unix::pipe::Receiver, Option<OwnedFd>)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just created and are owned by nothing else.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let wfd = write_end.as_raw_fd();
    let mut cmd = tokio::process::Command::new(&launch.program);
    cmd.args(&launch.args).env(READY_FD_ENV, wfd.to_string()).stdin(Stdio::null()).kill_on_drop(true);
    let channel = if launch.handover { Some(fskv_gateway::handover::channel_pair()?) } else { None };
    let child_channel_fd = channel.as_ref().map(|(_, theirs)| theirs.as_raw_fd());
    match child_channel_fd {
        Some(fd) => cmd.env(HANDOVER_FD_ENV, fd.to_string()),
        None => cmd.env_remove(HANDOVER_FD_ENV),
    };
    match &launch.return_socket {
        Some(path) => cmd.env(RETURN_SOCKET_ENV, path),
        None => cmd.env_remove(RETURN_SOCKET_ENV),
    };
    cmd.env(HANDED_IDLE_ENV, launch.idle_timeout_ms.to_string());
    cmd.env(HANDED_MAX_AGE_ENV, launch.handed_max_age_ms.to_string());
    match socket {
        Some(path) => cmd.env(UNIX_SOCKET_ENV, path),
        None => cmd.env_remove(UNIX_SOCKET_ENV),
    };
    match &launch.log_file {
        Some(path) => {
            let log = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
            cmd.stdout(Stdio::from(log.try_clone()?)).stderr(Stdio::from(log));
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
        }
    }
    // SAFETY: only async-signal-safe calls (fcntl, prctl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // The write end survives exec (it was opened close-on-exec).
            if libc::fcntl(wfd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // So does the gateway's end of the handover channel.
            if let Some(fd) = child_channel_fd {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Die with the front.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(write_end);
    let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(read_end)?;
    // The gateway's end is closed here (the child has its copy).
    Ok((child, rx, channel.map(|(mine, _theirs)| mine)))
}

/// Reads the gateway's `ADDRESS[ unix:PATH]\n` (at most 1 KiB).
async fn read_ready_line(
    rx: &mut tokio::net::unix::pipe::Receiver,
    buf: &mut Vec<u8>,
) -> std::io::Result<(std::net::SocketAddr, Option<PathBuf>)> {
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut chunk = [0u8; 64];
    loop {
        let n = rx.read(&mut chunk).await?;
        if n == 0 {
            return Err(bad("the ready pipe closed before an address was written".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line = String::from_utf8_lossy(&buf[..end]).trim().to_string();
            return parse_ready_line(&line).map_err(bad);
        }
        if buf.len() > 1024 {
            return Err(bad("ready line too long".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_lines_name_the_address_and_maybe_a_unix_socket() {
        let (a, u) = parse_ready_line("127.0.0.1:4000").unwrap();
        assert_eq!((a.port(), u), (4000, None));
        let (a, u) = parse_ready_line("127.0.0.1:4001 unix:/tmp/fskv-front-x/s3-reader-3.sock").unwrap();
        assert_eq!(a.port(), 4001);
        assert_eq!(u.as_deref(), Some(std::path::Path::new("/tmp/fskv-front-x/s3-reader-3.sock")));
        for bad in ["", "nonsense", "127.0.0.1:1 tcp:/x", "127.0.0.1:1 unix:", "127.0.0.1:99999"] {
            assert!(parse_ready_line(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[tokio::test]
    async fn static_pools_never_hand_over_and_count_nothing_for_asking() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = crate::metrics::FrontMetrics::register(&mut registry).pool("s3", "reader");
        let timing = ShellTiming { connect_timeout: Duration::from_secs(1), stop_grace: Duration::from_secs(1) };
        let pool = Pool::start(
            "s3",
            Role::Reader,
            PoolSettings::default(),
            Source::Static(vec!["127.0.0.1:9".into()]),
            timing,
            UnixRoutes::default(),
            metrics,
        )
        .unwrap();
        for _ in 0..3 {
            assert!(pool.try_acquire_now().is_none());
        }
        let st = pool.status();
        assert_eq!((st.requests, st.in_flight), (0, 0), "asking counted a request");
    }

    #[test]
    fn unix_routes_map_authorities_to_paths() {
        let r = UnixRoutes::default();
        let a: Authority = "s3-reader-1.unix".parse().unwrap();
        assert_eq!(r.get(&a), None);
        r.insert(a.clone(), "/tmp/x.sock".into());
        assert_eq!(r.get(&a).as_deref(), Some(std::path::Path::new("/tmp/x.sock")));
        r.remove(&a);
        assert_eq!(r.get(&a), None);
    }
}
