//! One pool of gateway processes as a pure state machine: no I/O, no clock
//! (every call takes `now`), no tasks. The async shell ([`crate::pool`])
//! feeds it events and carries out the [`Action`]s it queues; tests drive it
//! with explicit instants.
//!
//! A pool serves one protocol and one role (reader or writer). It is either
//! **managed** (the front starts and stops gateway processes on this host)
//! or **static** (fixed upstream addresses, e.g. gateways on other hosts,
//! taken out by health checks).
//!
//! ## Process states
//!
//! | state | takes requests | entered when | left when |
//! |---|---|---|---|
//! | `Starting` | no (requests wait in the queue) | the pool needs a process (`Start` action) | ready → `Ready`; exit → removed (a start failure); `start_timeout_ms` → `Kill`, `Stopping` |
//! | `Ready` | yes, up to `max_in_flight_per_process` | ready; a probe succeeded | idle `idle_timeout_ms` and above `min` → `Draining`; a request's connection failed → `Suspect`; exit → removed (a crash) |
//! | `Suspect` | no | a connection to it failed (`Probe` action) | probe ok → `Ready`; probe failed → managed: `Kill`, `Stopping` (counted as a crash); static: `Down` |
//! | `Down` (static only) | no | a probe failed | a probe succeeded → `Ready` (probed every `health_interval_ms`) |
//! | `Draining` | no | idle past the timeout; front shutdown | no request in flight → `Stop`, `Stopping` |
//! | `Stopping` | no | `Stop` or `Kill` sent | exit → removed |
//!
//! ## Rules
//!
//! | rule | what |
//! |---|---|
//! | dispatch | the `Ready` process with the lowest id whose in-flight count is below `scale_up_in_flight`; else the least loaded `Ready` process below `max_in_flight_per_process` (load packs onto the oldest processes, so the newest go idle first when load falls) |
//! | request that must not wait (`request_now`: a connection to hand over) | dispatched by the rule above when no request is held and a process has room; otherwise nothing changes (no hold, start or rejection) and the front proxies the connection instead |
//! | hold | no `Ready` process can take it: the request waits in the FIFO queue (at most `max_queue`, each at most `queue_timeout_ms`); past either bound it is rejected (503 with `Retry-After`) |
//! | reject at once | the pool may have no process (`max == 0`); a static pool with every upstream down; the front is shutting down |
//! | scale up | `load` = requests in flight + queued; `wanted` = ⌈load / `scale_up_in_flight`⌉ clamped to `min..=max`; `active` = processes `Starting`, `Ready` or `Suspect`. With `active == 0` a process starts at once (cold start); otherwise an overload episode starts when `wanted > active`; once it is `scale_up_after_ms` old and the load wanted more for at least half of it, `wanted − active` start together. Dips (requests finishing before the next arrive) do not restart the wait; the episode ends after `scale_up_after_ms` without overload |
//! | minimum | `active < min` starts processes at once |
//! | scale down | a `Ready` process with nothing in flight for `idle_timeout_ms` is drained and stopped, highest id first, while more than `min` are active; it takes no request from the moment it is chosen, so no request is cut |
//! | crash | an unexpected exit removes the process; its requests fail in the shell (idempotent reads are retried as new requests); the scale rules then start a replacement when the pool needs one (`min`, or the retried and queued load) |
//! | start backoff | after a failed start or a crash, the next start waits `restart_backoff_ms`, doubling per consecutive failure up to `max_restart_backoff_ms`; a process becoming ready resets it |
//! | health (static) | every upstream is probed every `health_interval_ms`; a failed probe takes it out (`Down`), a good one brings it back |
//! | shutdown | queued requests are rejected, every process drains and stops, new requests are rejected |

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// A process (or static upstream) of one pool; ids grow, never reused.
pub type ProcId = u64;
/// A request held in the queue, named by the shell.
pub type ReqId = u64;

/// The pool's settings (see docs/front.md for defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSettings {
    pub min_processes: usize,
    pub max_processes: usize,
    /// Requests in flight per process the pool aims at; above it, it grows.
    pub scale_up_in_flight: usize,
    /// How long the load must exceed the target before a process is added
    /// (to a pool that already has one).
    pub scale_up_after_ms: u64,
    /// Hard cap of requests in flight on one process; beyond it requests queue.
    pub max_in_flight_per_process: usize,
    /// A process with nothing in flight this long is drained and stopped (above `min_processes`).
    pub idle_timeout_ms: u64,
    /// Bound on a process's start (spawn to ready).
    pub start_timeout_ms: u64,
    /// Requests held at once while no process can take them.
    pub max_queue: usize,
    /// Bound on the wait of a held request.
    pub queue_timeout_ms: u64,
    pub restart_backoff_ms: u64,
    pub max_restart_backoff_ms: u64,
    /// Period of the health probes of static upstreams.
    pub health_interval_ms: u64,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            min_processes: 0,
            max_processes: 4,
            scale_up_in_flight: 32,
            scale_up_after_ms: 200,
            max_in_flight_per_process: 256,
            idle_timeout_ms: 60_000,
            start_timeout_ms: 10_000,
            max_queue: 1024,
            queue_timeout_ms: 15_000,
            restart_backoff_ms: 200,
            max_restart_backoff_ms: 5_000,
            health_interval_ms: 2_000,
        }
    }
}

impl PoolSettings {
    /// Values the machine cannot work with.
    pub fn validate(&self) -> Result<(), String> {
        if self.min_processes > self.max_processes {
            return Err(format!("min_processes {} is above max_processes {}", self.min_processes, self.max_processes));
        }
        for (name, v) in [
            ("scale_up_in_flight", self.scale_up_in_flight as u64),
            ("max_in_flight_per_process", self.max_in_flight_per_process as u64),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("start_timeout_ms", self.start_timeout_ms),
            ("queue_timeout_ms", self.queue_timeout_ms),
            ("health_interval_ms", self.health_interval_ms),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.scale_up_in_flight > self.max_in_flight_per_process {
            return Err("scale_up_in_flight must not exceed max_in_flight_per_process".into());
        }
        Ok(())
    }
}

/// How a pool gets its processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Processes started and stopped by the front.
    Managed,
    /// Fixed upstreams (one [`ProcId`] each, in the order given).
    Static { upstreams: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcState {
    Starting,
    Ready,
    Suspect,
    Down,
    Draining,
    Stopping,
}

impl ProcState {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcState::Starting => "starting",
            ProcState::Ready => "ready",
            ProcState::Suspect => "suspect",
            ProcState::Down => "down",
            ProcState::Draining => "draining",
            ProcState::Stopping => "stopping",
        }
    }

    pub const ALL: [ProcState; 6] =
        [ProcState::Starting, ProcState::Ready, ProcState::Suspect, ProcState::Down, ProcState::Draining, ProcState::Stopping];
}

/// Why a request is refused by the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// The queue holds `max_queue` requests already.
    QueueFull,
    /// Held `queue_timeout_ms` without a process to take it.
    QueueTimeout,
    /// The pool cannot have a process (`max_processes == 0`, or every static upstream is down).
    NoProcess,
    /// The front is stopping.
    ShuttingDown,
}

impl Reject {
    pub fn label(self) -> &'static str {
        match self {
            Reject::QueueFull => "queue_full",
            Reject::QueueTimeout => "queue_timeout",
            Reject::NoProcess => "no_process",
            Reject::ShuttingDown => "shutting_down",
        }
    }
}

/// What the shell must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start a gateway process for this new id; report `ready` or `exited`.
    Start(ProcId),
    /// Stop it gracefully (nothing is in flight on it); report `exited`.
    Stop(ProcId),
    /// Kill it (start timed out, probe failed); report `exited`.
    Kill(ProcId),
    /// Check that it accepts connections; report `probed`.
    Probe(ProcId),
    /// A held request goes to this process (its in-flight count includes it).
    Dispatch(ReqId, ProcId),
    /// A held request is refused.
    Reject(ReqId, Reject),
}

/// What happens to a new request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Send it to this process now (its in-flight count includes it).
    Dispatch(ProcId),
    /// Held; a later `Dispatch` or `Reject` action names it.
    Queued,
    Rejected(Reject),
}

#[derive(Clone, Debug)]
struct Proc {
    state: ProcState,
    in_flight: usize,
    /// While `Ready` with nothing in flight: since when.
    idle_since: Option<Instant>,
    /// When it entered its current state (start, probe bookkeeping).
    since: Instant,
    started_at: Instant,
    dispatched: u64,
    /// Static upstreams: the next active probe.
    next_probe: Option<Instant>,
    probing: bool,
}

#[derive(Clone, Debug)]
struct Waiter {
    req: ReqId,
    since: Instant,
}

/// Totals since the pool was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub starts: u64,
    pub ready: u64,
    pub stops: u64,
    pub crashes: u64,
    pub start_failures: u64,
    pub dispatched: u64,
    pub queued: u64,
    pub rejected: u64,
}

/// One process as the status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcView {
    pub id: ProcId,
    pub state: ProcState,
    pub in_flight: usize,
    pub dispatched: u64,
    pub age: Duration,
    pub idle_for: Option<Duration>,
}

/// The pool state machine.
#[derive(Debug)]
pub struct PoolMachine {
    settings: PoolSettings,
    kind: PoolKind,
    procs: BTreeMap<ProcId, Proc>,
    queue: VecDeque<Waiter>,
    actions: VecDeque<Action>,
    next_id: ProcId,
    /// The current overload episode: since when the load has wanted more
    /// processes than are active (with dips shorter than
    /// `scale_up_after_ms`), and how long of it the load actually did.
    overload_since: Option<Instant>,
    over_time: Duration,
    /// Since when the load has not wanted more (ends the episode after `scale_up_after_ms`).
    calm_since: Option<Instant>,
    /// Whether the load wanted more at the last evaluation, and when that was.
    last_over: bool,
    last_scale_at: Instant,
    /// The earliest instant the episode can make a start due (a timer).
    scale_due_at: Option<Instant>,
    /// No start before this (backoff after failures).
    next_start_at: Option<Instant>,
    backoff_ms: u64,
    shutting_down: bool,
    counters: Counters,
    last_cold_start: Option<Duration>,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl PoolMachine {
    /// A pool; a static one has its upstreams `Ready` at once and probes
    /// each right away.
    pub fn new(settings: PoolSettings, kind: PoolKind, now: Instant) -> PoolMachine {
        let mut m = PoolMachine {
            settings,
            kind,
            procs: BTreeMap::new(),
            queue: VecDeque::new(),
            actions: VecDeque::new(),
            next_id: 0,
            overload_since: None,
            over_time: Duration::ZERO,
            calm_since: None,
            last_over: false,
            last_scale_at: now,
            scale_due_at: None,
            next_start_at: None,
            backoff_ms: 0,
            shutting_down: false,
            counters: Counters::default(),
            last_cold_start: None,
        };
        if let PoolKind::Static { upstreams } = kind {
            for _ in 0..upstreams {
                let id = m.new_id();
                let p = Proc {
                    state: ProcState::Ready,
                    in_flight: 0,
                    idle_since: Some(now),
                    since: now,
                    started_at: now,
                    dispatched: 0,
                    next_probe: Some(now),
                    probing: false,
                };
                m.procs.insert(id, p);
            }
        }
        m.tick(now);
        m
    }

    fn new_id(&mut self) -> ProcId {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    pub fn kind(&self) -> PoolKind {
        self.kind
    }

    /// The next action for the shell, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn is_static(&self) -> bool {
        matches!(self.kind, PoolKind::Static { .. })
    }

    /// Processes `Starting`, `Ready` or `Suspect` (what the pool counts on).
    fn active(&self) -> usize {
        self.procs.values().filter(|p| matches!(p.state, ProcState::Starting | ProcState::Ready | ProcState::Suspect)).count()
    }

    fn in_flight(&self) -> usize {
        self.procs.values().map(|p| p.in_flight).sum()
    }

    /// The process a request goes to now, if any can take it.
    fn pick(&self) -> Option<ProcId> {
        let ready = || self.procs.iter().filter(|(_, p)| p.state == ProcState::Ready);
        if let Some((id, _)) = ready().find(|(_, p)| p.in_flight < self.settings.scale_up_in_flight) {
            return Some(*id);
        }
        ready().filter(|(_, p)| p.in_flight < self.settings.max_in_flight_per_process).min_by_key(|(_, p)| p.in_flight).map(|(id, _)| *id)
    }

    fn dispatch_to(&mut self, id: ProcId) {
        if let Some(p) = self.procs.get_mut(&id) {
            p.in_flight += 1;
            p.idle_since = None;
            p.dispatched += 1;
        }
        self.counters.dispatched += 1;
    }

    /// Whether the pool can never take a request now.
    fn hopeless(&self) -> bool {
        if self.settings.max_processes == 0 && !self.is_static() {
            return true;
        }
        self.is_static() && !self.procs.values().any(|p| matches!(p.state, ProcState::Ready | ProcState::Suspect))
    }

    /// A new request.
    pub fn request(&mut self, req: ReqId, now: Instant) -> Admission {
        let admission = if self.shutting_down {
            Admission::Rejected(Reject::ShuttingDown)
        } else if let Some(id) = self.pick().filter(|_| self.queue.is_empty()) {
            self.dispatch_to(id);
            Admission::Dispatch(id)
        } else if self.hopeless() {
            Admission::Rejected(Reject::NoProcess)
        } else if self.queue.len() >= self.settings.max_queue {
            Admission::Rejected(Reject::QueueFull)
        } else {
            self.queue.push_back(Waiter { req, since: now });
            self.counters.queued += 1;
            Admission::Queued
        };
        if let Admission::Rejected(_) = admission {
            self.counters.rejected += 1;
        }
        self.scale(now);
        admission
    }

    /// A request that must not wait (a client connection to hand over):
    /// dispatched as [`PoolMachine::request`] would if a process can take it
    /// now; otherwise nothing changes (no hold, no start, no rejection
    /// counted) and the caller serves it another way.
    pub fn request_now(&mut self, now: Instant) -> Option<ProcId> {
        if self.shutting_down || !self.queue.is_empty() {
            return None;
        }
        let id = self.pick()?;
        self.dispatch_to(id);
        self.scale(now);
        Some(id)
    }

    /// A held request is no longer waiting (its client went away).
    pub fn cancel(&mut self, req: ReqId, now: Instant) {
        self.queue.retain(|w| w.req != req);
        self.scale(now);
    }

    /// A dispatched request is done (its response sent, failed or dropped).
    pub fn finished(&mut self, id: ProcId, now: Instant) {
        let mut stop = false;
        if let Some(p) = self.procs.get_mut(&id) {
            p.in_flight = p.in_flight.saturating_sub(1);
            if p.in_flight == 0 {
                match p.state {
                    ProcState::Ready => p.idle_since = Some(now),
                    ProcState::Draining => stop = true,
                    _ => {}
                }
            }
        }
        if stop {
            self.stop(id, now);
        }
        self.drain_queue();
        self.scale(now);
    }

    /// A started process accepts requests; returns its start time (spawn to ready).
    pub fn ready(&mut self, id: ProcId, now: Instant) -> Option<Duration> {
        let p = self.procs.get_mut(&id)?;
        if p.state != ProcState::Starting {
            return None;
        }
        p.state = ProcState::Ready;
        p.since = now;
        p.idle_since = Some(now);
        let took = now.saturating_duration_since(p.started_at);
        self.counters.ready += 1;
        self.backoff_ms = 0;
        self.last_cold_start = Some(took);
        if self.shutting_down {
            self.drain(id, now);
        }
        self.drain_queue();
        self.scale(now);
        Some(took)
    }

    /// A process exited (expected after `Stop`/`Kill`, else a crash or a failed start).
    pub fn exited(&mut self, id: ProcId, now: Instant) {
        let Some(p) = self.procs.remove(&id) else { return };
        match p.state {
            ProcState::Stopping => {}
            ProcState::Starting => {
                self.counters.start_failures += 1;
                self.back_off(now);
            }
            _ => {
                self.counters.crashes += 1;
                self.back_off(now);
            }
        }
        self.scale(now);
    }

    fn back_off(&mut self, now: Instant) {
        self.backoff_ms = if self.backoff_ms == 0 {
            self.settings.restart_backoff_ms
        } else {
            (self.backoff_ms * 2).min(self.settings.max_restart_backoff_ms)
        };
        self.next_start_at = Some(now + ms(self.backoff_ms));
    }

    /// A request could not reach the process (connect refused, reset before
    /// a response): it takes no more requests until a probe answers.
    pub fn connect_failed(&mut self, id: ProcId, now: Instant) {
        let Some(p) = self.procs.get_mut(&id) else { return };
        if p.state == ProcState::Ready {
            p.state = ProcState::Suspect;
            p.since = now;
            if !p.probing {
                p.probing = true;
                self.actions.push_back(Action::Probe(id));
            }
        }
        self.scale(now);
    }

    /// The answer to a `Probe`.
    pub fn probed(&mut self, id: ProcId, ok: bool, now: Instant) {
        let is_static = self.is_static();
        let interval = ms(self.settings.health_interval_ms);
        let Some(p) = self.procs.get_mut(&id) else { return };
        p.probing = false;
        if is_static {
            p.next_probe = Some(now + interval);
        }
        match (p.state, ok) {
            (ProcState::Suspect | ProcState::Down, true) => {
                p.state = ProcState::Ready;
                p.since = now;
                if p.in_flight == 0 {
                    p.idle_since = Some(now);
                }
            }
            (ProcState::Ready | ProcState::Suspect, false) if is_static => {
                p.state = ProcState::Down;
                p.since = now;
                p.idle_since = None;
            }
            (ProcState::Suspect, false) => {
                // It stopped answering: a crash (its exit, which may come
                // later, is then an expected one).
                p.state = ProcState::Stopping;
                p.since = now;
                self.actions.push_back(Action::Kill(id));
                self.counters.crashes += 1;
                self.back_off(now);
            }
            _ => {}
        }
        self.drain_queue();
        self.scale(now);
    }

    /// Stops taking requests: rejects the held ones, drains every process.
    pub fn shutdown(&mut self, now: Instant) {
        self.shutting_down = true;
        while let Some(w) = self.queue.pop_front() {
            self.counters.rejected += 1;
            self.actions.push_back(Action::Reject(w.req, Reject::ShuttingDown));
        }
        let ids: Vec<ProcId> = self.procs.keys().copied().collect();
        for id in ids {
            self.drain(id, now);
        }
    }

    /// Whether the pool is shut down and every managed process has exited.
    pub fn is_stopped(&self) -> bool {
        self.shutting_down && (self.is_static() || self.procs.is_empty())
    }

    /// Timers: held requests past their bound, starts past theirs, idle
    /// processes, delayed scale-up, backoff, health probes.
    pub fn tick(&mut self, now: Instant) {
        let queue_timeout = ms(self.settings.queue_timeout_ms);
        while let Some(w) = self.queue.front() {
            if now.saturating_duration_since(w.since) < queue_timeout {
                break;
            }
            let req = w.req;
            self.queue.pop_front();
            self.counters.rejected += 1;
            self.actions.push_back(Action::Reject(req, Reject::QueueTimeout));
        }
        let start_timeout = ms(self.settings.start_timeout_ms);
        let late: Vec<ProcId> = self
            .procs
            .iter()
            .filter(|(_, p)| p.state == ProcState::Starting && now.saturating_duration_since(p.started_at) >= start_timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            if let Some(p) = self.procs.get_mut(&id) {
                p.state = ProcState::Stopping;
                p.since = now;
            }
            self.counters.start_failures += 1;
            self.back_off(now);
            self.actions.push_back(Action::Kill(id));
        }
        if self.is_static() {
            let due: Vec<ProcId> = self
                .procs
                .iter()
                .filter(|(_, p)| !p.probing && p.next_probe.is_some_and(|t| t <= now) && !self.shutting_down)
                .map(|(id, _)| *id)
                .collect();
            for id in due {
                if let Some(p) = self.procs.get_mut(&id) {
                    p.probing = true;
                    p.next_probe = None;
                }
                self.actions.push_back(Action::Probe(id));
            }
        } else if !self.shutting_down {
            self.retire_idle(now);
        }
        self.scale(now);
    }

    fn end_overload(&mut self) {
        self.overload_since = None;
        self.over_time = Duration::ZERO;
        self.calm_since = None;
        self.scale_due_at = None;
    }

    /// Drains and stops idle processes above the minimum, newest first.
    fn retire_idle(&mut self, now: Instant) {
        let idle_timeout = ms(self.settings.idle_timeout_ms);
        let mut active = self.active();
        let idle: Vec<ProcId> = self
            .procs
            .iter()
            .rev()
            .filter(|(_, p)| {
                p.state == ProcState::Ready
                    && p.in_flight == 0
                    && p.idle_since.is_some_and(|t| now.saturating_duration_since(t) >= idle_timeout)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            if active <= self.settings.min_processes {
                break;
            }
            // Only when nothing waits: a held request would take it.
            if !self.queue.is_empty() {
                break;
            }
            self.drain(id, now);
            active -= 1;
        }
    }

    fn drain(&mut self, id: ProcId, now: Instant) {
        let is_static = self.is_static();
        let Some(p) = self.procs.get_mut(&id) else { return };
        match p.state {
            ProcState::Stopping | ProcState::Draining => return,
            ProcState::Starting if !is_static => {
                // Not serving yet: nothing to drain.
                p.state = ProcState::Stopping;
                p.since = now;
                self.actions.push_back(Action::Stop(id));
                self.counters.stops += 1;
                return;
            }
            _ => {}
        }
        if is_static {
            // Not ours to stop: it just takes no more requests.
            p.state = ProcState::Draining;
            p.since = now;
            return;
        }
        p.state = ProcState::Draining;
        p.since = now;
        p.idle_since = None;
        if p.in_flight == 0 {
            self.stop(id, now);
        }
    }

    fn stop(&mut self, id: ProcId, now: Instant) {
        if self.is_static() {
            return;
        }
        if let Some(p) = self.procs.get_mut(&id) {
            if p.state != ProcState::Stopping {
                p.state = ProcState::Stopping;
                p.since = now;
                self.counters.stops += 1;
                self.actions.push_back(Action::Stop(id));
            }
        }
    }

    /// Hands held requests to processes that can take them, oldest first.
    fn drain_queue(&mut self) {
        while !self.queue.is_empty() {
            let Some(id) = self.pick() else { break };
            let Some(w) = self.queue.pop_front() else { break };
            self.dispatch_to(id);
            self.actions.push_back(Action::Dispatch(w.req, id));
        }
        if self.hopeless() {
            while let Some(w) = self.queue.pop_front() {
                self.counters.rejected += 1;
                self.actions.push_back(Action::Reject(w.req, Reject::NoProcess));
            }
        }
    }

    /// The scale-up and minimum rules.
    fn scale(&mut self, now: Instant) {
        if self.is_static() || self.shutting_down {
            return;
        }
        let after = ms(self.settings.scale_up_after_ms);
        // The load is constant between events: account the time since the last one.
        if self.last_over && self.overload_since.is_some() {
            self.over_time += now.saturating_duration_since(self.last_scale_at);
        }
        self.last_scale_at = now;
        if self.calm_since.is_some_and(|c| now.saturating_duration_since(c) >= after) {
            self.end_overload();
        }
        let s = &self.settings;
        let load = self.in_flight() + self.queue.len();
        let wanted = load.div_ceil(s.scale_up_in_flight).clamp(s.min_processes, s.max_processes);
        let active = self.active();
        self.last_over = wanted > active;
        if wanted <= active {
            if self.overload_since.is_some() && self.calm_since.is_none() {
                self.calm_since = Some(now);
            }
            self.scale_due_at = None;
            return;
        }
        self.calm_since = None;
        if self.next_start_at.is_some_and(|t| now < t) {
            // The backoff's own timer wakes the pool.
            self.scale_due_at = None;
            return;
        }
        self.next_start_at = None;
        let below_min = active < s.min_processes;
        let due = active == 0 || below_min || {
            let since = *self.overload_since.get_or_insert(now);
            let span = now.saturating_duration_since(since);
            // Due once the episode is `scale_up_after_ms` old and the load
            // wanted more for at least half of it (requests finishing and
            // arriving make the count dip; a dip does not restart the wait).
            let due = span >= after && self.over_time * 2 >= span;
            if !due {
                // Staying over from now, it is due at the later of the two.
                let by_age = since + after;
                let by_share = now + span.saturating_sub(self.over_time * 2);
                self.scale_due_at = Some(by_age.max(by_share));
            }
            due
        };
        if !due {
            return;
        }
        self.end_overload();
        for _ in active..wanted {
            let id = self.new_id();
            let p = Proc {
                state: ProcState::Starting,
                in_flight: 0,
                idle_since: None,
                since: now,
                started_at: now,
                dispatched: 0,
                next_probe: None,
                probing: false,
            };
            self.procs.insert(id, p);
            self.counters.starts += 1;
            self.actions.push_back(Action::Start(id));
        }
    }

    /// The earliest instant at which `tick` has something to do (the shell
    /// may tick more often; ticking early is harmless).
    pub fn next_deadline(&self) -> Option<Instant> {
        let s = &self.settings;
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if let Some(w) = self.queue.front() {
            consider(w.since + ms(s.queue_timeout_ms));
        }
        for p in self.procs.values() {
            match p.state {
                ProcState::Starting => consider(p.started_at + ms(s.start_timeout_ms)),
                ProcState::Ready if !self.is_static() => {
                    if let Some(t) = p.idle_since {
                        consider(t + ms(s.idle_timeout_ms));
                    }
                }
                _ => {}
            }
            if let Some(t) = p.next_probe {
                consider(t);
            }
        }
        if let Some(t) = self.scale_due_at {
            consider(t);
        }
        if let Some(t) = self.next_start_at {
            consider(t);
        }
        next
    }

    // ---- views for metrics and status ----

    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn requests_in_flight(&self) -> usize {
        self.in_flight()
    }

    pub fn count(&self, state: ProcState) -> usize {
        self.procs.values().filter(|p| p.state == state).count()
    }

    pub fn state_of(&self, id: ProcId) -> Option<ProcState> {
        self.procs.get(&id).map(|p| p.state)
    }

    pub fn last_cold_start(&self) -> Option<Duration> {
        self.last_cold_start
    }

    pub fn processes(&self, now: Instant) -> Vec<ProcView> {
        self.procs
            .iter()
            .map(|(id, p)| ProcView {
                id: *id,
                state: p.state,
                in_flight: p.in_flight,
                dispatched: p.dispatched,
                age: now.saturating_duration_since(p.started_at),
                idle_for: p.idle_since.map(|t| now.saturating_duration_since(t)),
            })
            .collect()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PoolSettings {
        PoolSettings {
            min_processes: 0,
            max_processes: 3,
            scale_up_in_flight: 2,
            scale_up_after_ms: 100,
            max_in_flight_per_process: 4,
            idle_timeout_ms: 1_000,
            start_timeout_ms: 500,
            max_queue: 3,
            queue_timeout_ms: 2_000,
            restart_backoff_ms: 100,
            max_restart_backoff_ms: 400,
            health_interval_ms: 1_000,
        }
    }

    struct T {
        m: PoolMachine,
        t0: Instant,
    }

    impl T {
        fn new(s: PoolSettings) -> T {
            let t0 = Instant::now();
            T { m: PoolMachine::new(s, PoolKind::Managed, t0), t0 }
        }
        fn at(&self, ms_: u64) -> Instant {
            self.t0 + ms(ms_)
        }
        fn actions(&mut self) -> Vec<Action> {
            std::iter::from_fn(|| self.m.poll_action()).collect()
        }
    }

    #[test]
    fn first_request_to_an_empty_pool_is_held_and_starts_a_process() {
        let mut t = T::new(settings());
        assert!(t.actions().is_empty(), "min 0: nothing starts by itself");
        assert_eq!(t.m.request(1, t.at(0)), Admission::Queued);
        assert_eq!(t.actions(), vec![Action::Start(0)]);
        // More requests while it starts: held, and a second process only when
        // the load wants it for scale_up_after_ms.
        assert_eq!(t.m.request(2, t.at(10)), Admission::Queued);
        assert!(t.actions().is_empty(), "load 2 fits one process at 2 per process");
        assert_eq!(t.m.ready(0, t.at(30)), Some(ms(30)));
        assert_eq!(t.actions(), vec![Action::Dispatch(1, 0), Action::Dispatch(2, 0)]);
        assert_eq!(t.m.requests_in_flight(), 2);
        assert_eq!(t.m.counters().starts, 1);
    }

    #[test]
    fn queue_bounds_reject_with_reasons() {
        let mut t = T::new(settings());
        for r in 0..3 {
            assert_eq!(t.m.request(r, t.at(0)), Admission::Queued);
        }
        assert_eq!(t.m.request(9, t.at(0)), Admission::Rejected(Reject::QueueFull));
        // Start never completes within the queue timeout either: the start is
        // killed at 500 ms and retried after backoff; at 2 s the held requests go.
        t.actions();
        t.m.tick(t.at(500));
        assert!(t.actions().contains(&Action::Kill(0)));
        t.m.exited(0, t.at(510));
        assert_eq!(t.m.counters().start_failures, 1);
        t.m.tick(t.at(2_000));
        let a = t.actions();
        for r in 0..3 {
            assert!(a.contains(&Action::Reject(r, Reject::QueueTimeout)), "{a:?}");
        }
        assert_eq!(t.m.queued(), 0);
    }

    #[test]
    fn a_pool_without_processes_rejects_at_once() {
        let mut t = T::new(PoolSettings { max_processes: 0, min_processes: 0, ..settings() });
        assert_eq!(t.m.request(1, t.at(0)), Admission::Rejected(Reject::NoProcess));
        assert!(t.actions().is_empty());
    }

    #[test]
    fn a_request_that_must_not_wait_is_dispatched_only_when_a_process_has_room() {
        let mut t = T::new(settings());
        assert_eq!(t.m.request_now(t.at(0)), None, "an empty pool: nothing to hand it to");
        assert!(t.actions().is_empty(), "and nothing started for it");
        assert_eq!((t.m.counters().queued, t.m.counters().rejected, t.m.counters().dispatched), (0, 0, 0));
        warm(&mut t);
        assert_eq!(t.m.request_now(t.at(30)), Some(0));
        assert_eq!(t.m.requests_in_flight(), 1, "it holds its place like a request");
        // Up to the hard cap (4 here); then none, and nothing is queued.
        for _ in 0..3 {
            assert_eq!(t.m.request_now(t.at(31)), Some(0));
        }
        assert_eq!(t.m.request_now(t.at(32)), None);
        assert_eq!((t.m.queued(), t.m.counters().rejected), (0, 0));
        // It counts as load: held past scale_up_after_ms, the pool grows.
        t.m.tick(t.at(300));
        assert_eq!(t.actions(), vec![Action::Start(1)]);
        // Held requests come first.
        assert_eq!(t.m.request(50, t.at(310)), Admission::Queued);
        t.m.finished(0, t.at(320));
        t.actions();
        assert_eq!(t.m.request(51, t.at(330)), Admission::Queued);
        assert_eq!(t.m.request_now(t.at(330)), None, "a held request is waiting");
    }

    fn warm(t: &mut T) {
        t.m.request(100, t.at(0));
        t.actions();
        t.m.ready(0, t.at(20));
        t.actions();
        t.m.finished(0, t.at(25));
    }

    #[test]
    fn load_above_target_adds_processes_after_the_delay_and_packs_onto_the_oldest() {
        let mut t = T::new(settings());
        warm(&mut t);
        // 2 per process is the target: 3 and 4 in flight want 2 processes.
        for r in 0..4 {
            assert_eq!(t.m.request(r, t.at(100)), Admission::Dispatch(0), "below the hard cap of 4");
        }
        assert!(t.actions().is_empty(), "overload must last scale_up_after_ms");
        t.m.tick(t.at(150));
        assert!(t.actions().is_empty());
        t.m.tick(t.at(200));
        assert_eq!(t.actions(), vec![Action::Start(1)]);
        // Hard cap: the fifth waits.
        assert_eq!(t.m.request(4, t.at(210)), Admission::Queued);
        t.m.ready(1, t.at(230));
        assert_eq!(t.actions(), vec![Action::Dispatch(4, 1)]);
        // New requests pack onto process 0 first while it is under target.
        for _ in 0..4 {
            t.m.finished(0, t.at(240));
        }
        assert_eq!(t.m.request(5, t.at(250)), Admission::Dispatch(0));
        assert_eq!(t.m.request(6, t.at(250)), Admission::Dispatch(0));
        assert_eq!(t.m.request(7, t.at(250)), Admission::Dispatch(1), "0 is at target, 1 is below");
    }

    #[test]
    fn dips_in_the_load_do_not_restart_the_wait_but_a_calm_ends_it() {
        let mut t = T::new(settings());
        warm(&mut t);
        // Load 3 wants 2 processes; every 30 ms it dips to 2 for 10 ms.
        for r in 0..3 {
            t.m.request(r, t.at(100));
        }
        for (dip, back) in [(120, 130), (150, 160), (180, 190)] {
            t.m.finished(0, t.at(dip));
            t.m.request(dip, t.at(back));
        }
        assert!(t.actions().is_empty());
        // Over for 70 of the episode's 100 ms: due.
        t.m.tick(t.at(200));
        assert_eq!(t.actions(), vec![Action::Start(1)]);

        let mut t = T::new(settings());
        warm(&mut t);
        for r in 0..3 {
            t.m.request(r, t.at(100));
        }
        t.m.finished(0, t.at(120));
        // Calm for 180 ms ends the episode: the next overload waits afresh.
        t.m.tick(t.at(300));
        t.m.request(3, t.at(300));
        assert_eq!(t.m.next_deadline().map(|d| d >= t.at(400)), Some(true));
        t.m.tick(t.at(399));
        assert!(t.actions().is_empty());
        t.m.tick(t.at(400));
        assert_eq!(t.actions(), vec![Action::Start(1)]);
    }

    #[test]
    fn an_overload_for_less_than_half_the_time_starts_nothing() {
        let mut t = T::new(settings());
        warm(&mut t);
        for r in 0..2 {
            t.m.request(r, t.at(100));
        }
        // Load 3 for 10 ms of every 40 (never calm for 100 ms).
        let mut now = 100;
        for i in 0..10 {
            t.m.request(1_000 + i, t.at(now));
            t.m.finished(0, t.at(now + 10));
            now += 40;
            t.m.tick(t.at(now));
        }
        assert!(t.actions().is_empty(), "a quarter of the time over target");
        // The timer the machine asks for is never in the past (no busy ticking).
        if let Some(d) = t.m.next_deadline() {
            assert!(d >= t.at(now), "deadline in the past");
        }
    }

    #[test]
    fn a_burst_starts_several_at_once_up_to_max() {
        let mut t = T::new(settings());
        warm(&mut t);
        for r in 0..4 {
            t.m.request(r, t.at(100));
        }
        for r in 4..7 {
            assert_eq!(t.m.request(r, t.at(100)), Admission::Queued);
        }
        t.m.tick(t.at(200));
        // load 7 wants 4 at 2 each; max 3: two more start together.
        assert_eq!(t.actions(), vec![Action::Start(1), Action::Start(2)]);
        assert_eq!(t.m.request(8, t.at(200)), Admission::Rejected(Reject::QueueFull));
    }

    #[test]
    fn idle_processes_drain_and_stop_newest_first_without_cutting_requests() {
        let mut t = T::new(settings());
        warm(&mut t);
        for r in 0..4 {
            t.m.request(r, t.at(100));
        }
        t.m.tick(t.at(200));
        t.actions();
        t.m.ready(1, t.at(220));
        // Process 1 takes one request that stays in flight for long.
        for _ in 0..4 {
            t.m.finished(0, t.at(300));
        }
        for r in 10..12 {
            t.m.request(r, t.at(300));
        }
        assert_eq!(t.m.request(12, t.at(300)), Admission::Dispatch(1));
        t.m.finished(0, t.at(310));
        t.m.finished(0, t.at(310));
        // At 1310 process 0 has been idle for 1 s; 1 is busy: 0 stops, 1 stays.
        t.m.tick(t.at(1_310));
        assert_eq!(t.actions(), vec![Action::Stop(0)]);
        assert_eq!(t.m.state_of(1), Some(ProcState::Ready));
        t.m.exited(0, t.at(1_320));
        assert_eq!(t.m.counters().crashes, 0, "a stop is not a crash");
        // The long request ends; after the idle timeout the pool is empty again.
        t.m.finished(1, t.at(2_000));
        t.m.tick(t.at(2_999));
        assert!(t.actions().is_empty());
        t.m.tick(t.at(3_000));
        assert_eq!(t.actions(), vec![Action::Stop(1)]);
        t.m.exited(1, t.at(3_010));
        assert_eq!(t.m.count(ProcState::Ready) + t.m.count(ProcState::Starting), 0);
        assert_eq!(t.m.counters().stops, 2);
    }

    #[test]
    fn the_minimum_is_kept_started_and_never_retired() {
        let mut t = T::new(PoolSettings { min_processes: 1, ..settings() });
        assert_eq!(t.actions(), vec![Action::Start(0)]);
        t.m.ready(0, t.at(10));
        t.m.tick(t.at(10_000));
        assert!(t.actions().is_empty(), "the minimum stays");
        // A crash of the minimum is replaced after the backoff.
        t.m.exited(0, t.at(10_001));
        assert!(t.actions().is_empty());
        t.m.tick(t.at(10_101));
        assert_eq!(t.actions(), vec![Action::Start(1)]);
    }

    #[test]
    fn a_crash_is_counted_and_replaced_when_the_load_needs_it_with_backoff() {
        let mut t = T::new(settings());
        warm(&mut t);
        assert_eq!(t.m.request(1, t.at(100)), Admission::Dispatch(0));
        t.m.exited(0, t.at(110));
        assert_eq!(t.m.counters().crashes, 1);
        // The shell retries the read as a new request: held, and a
        // replacement starts after the backoff.
        assert_eq!(t.m.request(2, t.at(111)), Admission::Queued);
        assert!(t.actions().is_empty(), "backoff 100 ms");
        t.m.tick(t.at(210));
        assert_eq!(t.actions(), vec![Action::Start(1)]);
        // It crashes at start: the backoff doubles.
        t.m.exited(1, t.at(220));
        t.m.tick(t.at(320));
        assert!(t.actions().is_empty(), "backoff 200 ms now");
        t.m.tick(t.at(420));
        assert_eq!(t.actions(), vec![Action::Start(2)]);
        t.m.ready(2, t.at(430));
        assert_eq!(t.actions(), vec![Action::Dispatch(2, 2)]);
        // Late reports about a removed process change nothing.
        t.m.finished(0, t.at(440));
        assert_eq!(t.m.requests_in_flight(), 1);
    }

    #[test]
    fn a_failed_connection_makes_a_process_suspect_until_probed() {
        let mut t = T::new(settings());
        warm(&mut t);
        assert_eq!(t.m.request(1, t.at(100)), Admission::Dispatch(0));
        t.m.connect_failed(0, t.at(101));
        t.m.finished(0, t.at(101));
        assert_eq!(t.actions(), vec![Action::Probe(0)]);
        // No dispatch to a suspect process: held, and no new start (it still counts).
        assert_eq!(t.m.request(2, t.at(102)), Admission::Queued);
        assert!(t.actions().is_empty());
        t.m.probed(0, true, t.at(103));
        assert_eq!(t.actions(), vec![Action::Dispatch(2, 0)]);
        // A failed probe kills it; the held load then starts a replacement.
        t.m.connect_failed(0, t.at(200));
        t.m.finished(0, t.at(200));
        assert_eq!(t.m.request(3, t.at(201)), Admission::Queued);
        t.actions();
        t.m.probed(0, false, t.at(202));
        assert_eq!(t.actions(), vec![Action::Kill(0)]);
        t.m.exited(0, t.at(203));
        assert_eq!(t.m.counters().crashes, 1, "a process that stopped answering counts once as crashed");
        t.m.tick(t.at(302));
        assert_eq!(t.actions(), vec![Action::Start(1)], "replaced after the backoff");
    }

    #[test]
    fn start_timeout_kills_and_retries() {
        let mut t = T::new(settings());
        t.m.request(1, t.at(0));
        assert_eq!(t.actions(), vec![Action::Start(0)]);
        t.m.tick(t.at(499));
        assert!(t.actions().is_empty());
        t.m.tick(t.at(500));
        assert_eq!(t.actions(), vec![Action::Kill(0)]);
        t.m.exited(0, t.at(505));
        t.m.tick(t.at(600));
        assert_eq!(t.actions(), vec![Action::Start(1)]);
        // A late ready of the killed one is ignored.
        assert_eq!(t.m.ready(0, t.at(601)), None);
        t.m.ready(1, t.at(650));
        assert_eq!(t.actions(), vec![Action::Dispatch(1, 1)]);
    }

    #[test]
    fn cancelled_waiters_leave_the_queue() {
        let mut t = T::new(settings());
        t.m.request(1, t.at(0));
        t.m.request(2, t.at(0));
        t.m.cancel(1, t.at(5));
        t.actions();
        t.m.ready(0, t.at(10));
        assert_eq!(t.actions(), vec![Action::Dispatch(2, 0)]);
    }

    #[test]
    fn shutdown_rejects_the_held_and_drains_everything() {
        let mut t = T::new(settings());
        warm(&mut t);
        t.m.request(1, t.at(100));
        for r in 2..6 {
            t.m.request(r, t.at(100));
        }
        t.m.tick(t.at(200));
        assert_eq!(t.actions(), vec![Action::Start(1), Action::Start(2)]);
        t.m.shutdown(t.at(250));
        let a = t.actions();
        assert!(a.contains(&Action::Reject(5, Reject::ShuttingDown)), "{a:?}");
        assert!(!a.iter().any(|x| matches!(x, Action::Stop(0))), "0 has requests in flight: {a:?}");
        assert!(a.contains(&Action::Stop(1)) && a.contains(&Action::Stop(2)), "starting ones stop at once: {a:?}");
        assert_eq!(t.m.request(7, t.at(260)), Admission::Rejected(Reject::ShuttingDown));
        for _ in 0..4 {
            t.m.finished(0, t.at(270));
        }
        assert_eq!(t.actions(), vec![Action::Stop(0)]);
        assert!(!t.m.is_stopped());
        for p in 0..3 {
            t.m.exited(p, t.at(280));
        }
        assert!(t.m.is_stopped());
        assert_eq!(t.m.counters().crashes, 0);
    }

    #[test]
    fn static_upstreams_are_probed_and_taken_out_when_down() {
        let t0 = Instant::now();
        let at = |v| t0 + ms(v);
        let mut m = PoolMachine::new(settings(), PoolKind::Static { upstreams: 2 }, t0);
        let probes: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
        assert_eq!(probes, vec![Action::Probe(0), Action::Probe(1)]);
        m.probed(0, false, at(5));
        m.probed(1, true, at(5));
        assert_eq!(m.state_of(0), Some(ProcState::Down));
        assert_eq!(m.request(1, at(10)), Admission::Dispatch(1));
        m.connect_failed(1, at(11));
        m.finished(1, at(11));
        assert_eq!(m.poll_action(), Some(Action::Probe(1)));
        m.probed(1, false, at(12));
        assert_eq!(m.request(2, at(13)), Admission::Rejected(Reject::NoProcess), "every upstream down");
        // Probed again each health interval; back when one answers.
        m.tick(at(1_004));
        assert_eq!(m.poll_action(), None);
        m.tick(at(1_005));
        assert_eq!(m.poll_action(), Some(Action::Probe(0)));
        m.probed(0, true, at(1_006));
        assert_eq!(m.request(3, at(1_007)), Admission::Dispatch(0));
        // Never started, stopped or retired.
        m.finished(0, at(1_008));
        m.tick(at(100_000));
        let a: Vec<_> = std::iter::from_fn(|| m.poll_action()).collect();
        assert!(a.iter().all(|x| matches!(x, Action::Probe(_))), "{a:?}");
        assert_eq!(m.counters().starts, 0);
    }

    #[test]
    fn next_deadline_covers_every_timer() {
        let mut t = T::new(settings());
        assert_eq!(t.m.next_deadline(), None, "an empty idle pool has no timer");
        t.m.request(1, t.at(0));
        assert_eq!(t.m.next_deadline(), Some(t.at(500)), "start timeout before queue timeout");
        t.m.ready(0, t.at(10));
        t.m.finished(0, t.at(20));
        assert_eq!(t.m.next_deadline(), Some(t.at(1_020)), "idle timeout");
    }

    /// A deterministic random walk: the invariants hold after every event.
    #[test]
    fn invariants_under_random_events() {
        let mut seed = 0x2545F4914F6CDD1Du64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let s = settings();
        let t0 = Instant::now();
        let mut m = PoolMachine::new(s.clone(), PoolKind::Managed, t0);
        let mut now = t0;
        let mut in_flight: Vec<ProcId> = Vec::new();
        let mut held: Vec<ReqId> = Vec::new();
        let mut alive: Vec<ProcId> = Vec::new();
        let mut next_req = 0;
        for _ in 0..20_000 {
            now += ms(rnd(50));
            match rnd(8) {
                0 | 1 => {
                    next_req += 1;
                    match m.request(next_req, now) {
                        Admission::Dispatch(p) => in_flight.push(p),
                        Admission::Queued => held.push(next_req),
                        Admission::Rejected(_) => {}
                    }
                }
                2 if !in_flight.is_empty() => {
                    let p = in_flight.swap_remove(rnd(in_flight.len() as u64) as usize);
                    m.finished(p, now);
                }
                3 if !alive.is_empty() => {
                    let p = alive[rnd(alive.len() as u64) as usize];
                    m.ready(p, now);
                }
                4 if !alive.is_empty() && rnd(10) == 0 => {
                    let p = alive.swap_remove(rnd(alive.len() as u64) as usize);
                    m.exited(p, now);
                }
                5 if !in_flight.is_empty() && rnd(10) == 0 => {
                    let p = in_flight[rnd(in_flight.len() as u64) as usize];
                    m.connect_failed(p, now);
                }
                _ => m.tick(now),
            }
            while let Some(a) = m.poll_action() {
                match a {
                    Action::Start(p) => alive.push(p),
                    Action::Stop(p) | Action::Kill(p) => {
                        assert_eq!(m.state_of(p), Some(ProcState::Stopping));
                        assert!(!in_flight.contains(&p) || matches!(a, Action::Kill(_)), "a process with requests was stopped");
                        alive.retain(|x| *x != p);
                        m.exited(p, now);
                    }
                    Action::Probe(p) => m.probed(p, rnd(2) == 0, now),
                    Action::Dispatch(r, p) => {
                        assert!(held.contains(&r), "dispatch of a request not held");
                        held.retain(|x| *x != r);
                        in_flight.push(p);
                    }
                    Action::Reject(r, _) => held.retain(|x| *x != r),
                }
            }
            let active = m.active();
            assert!(active <= s.max_processes, "{active} active");
            assert!(m.queued() <= s.max_queue);
            assert_eq!(m.queued(), held.len());
            for v in m.processes(now) {
                assert!(v.in_flight <= s.max_in_flight_per_process);
            }
            // Requests dispatched to processes since removed are not counted.
            let live_in_flight = in_flight.iter().filter(|p| m.state_of(**p).is_some()).count();
            assert_eq!(m.requests_in_flight(), live_in_flight);
            // Nobody waits while a process could take the oldest held request.
            if m.queued() > 0 {
                assert!(m.pick().is_none(), "a held request while a process has room");
            }
        }
    }
}
