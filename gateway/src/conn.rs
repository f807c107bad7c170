//! Per-connection timeouts without a timer per connection or per request.
//!
//! Each connection has a [`ConnClock`]: its phase and the moments its body
//! and its sends started waiting. One sweeper task per server
//! ([`Sweeper`]) looks at every clock once per period and acts on what
//! [`ConnClock::check`] (pure: time is passed in) finds. No tokio timer is
//! armed per connection or per request (one per server instead), and
//! shutdown needs no per-connection channel.
//!
//! | what | waiting since | limit | on expiry |
//! |---|---|---|---|
//! | phase `Head` | accept; or the first byte read while `Idle` | `header_read_timeout_ms` (the whole head, however slowly it trickles) | connection closed |
//! | phase `Idle` | the last response in flight was done | `idle_timeout_ms` | connection closed |
//! | phase `Active(n)` | — (n requests in flight) | none for the connection itself | — |
//! | request body | the handler's first poll that found no bytes since the last progress | `body_progress_timeout_ms` | the body fails with `BodyStalled` (the handler answers 408) |
//! | sends | a write the peer did not accept | `send_progress_timeout_ms` | connection closed |
//!
//! A limit is enforced within one sweep period after it passes: the period
//! is a quarter of the smallest timeout, between 10 ms and 1 s. Shutdown
//! reaches connections the same way ([`Signal`]).

use futures::task::AtomicWaker;
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Head,
    Active(u32),
    Idle,
}

/// Why a connection is closed by its clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    HeaderRead,
    Idle,
    SendProgress,
}

impl Expiry {
    pub fn label(self) -> &'static str {
        match self {
            Expiry::HeaderRead => "header_read",
            Expiry::Idle => "idle",
            Expiry::SendProgress => "send_progress",
        }
    }
}

/// What [`ConnClock::check`] finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Verdict {
    /// Close the connection.
    pub close: Option<Expiry>,
    /// Fail the request body being waited for.
    pub body_stalled: bool,
}

/// What the server asks of a connection, in increasing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    None = 0,
    /// Finish the request in flight, take no more (graceful shutdown).
    Drain = 1,
    /// Close now (a timeout or the end of the shutdown grace).
    Close = 2,
}

/// The timeouts a clock enforces.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub header_read: Duration,
    pub idle: Duration,
    pub body_progress: Duration,
    pub send_progress: Duration,
}

impl Timeouts {
    /// The sweeper's period for these timeouts.
    pub fn sweep_period(&self) -> Duration {
        let min = self.header_read.min(self.idle).min(self.body_progress).min(self.send_progress);
        (min / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

#[derive(Debug)]
struct State {
    phase: Phase,
    since: Instant,
}

/// `0`: not waiting; otherwise nanoseconds since the clock's origin, plus one.
struct WaitSince(AtomicU64);

impl WaitSince {
    fn start(&self, origin: Instant) {
        if self.0.load(Ordering::Relaxed) == 0 {
            let ns = Instant::now().saturating_duration_since(origin).as_nanos() as u64;
            self.0.store(ns.saturating_add(1), Ordering::Relaxed);
        }
    }

    fn stop(&self) {
        if self.0.load(Ordering::Relaxed) != 0 {
            self.0.store(0, Ordering::Relaxed);
        }
    }

    fn waited(&self, origin: Instant, now: Instant) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            v => Some(now.saturating_duration_since(origin + Duration::from_nanos(v - 1))),
        }
    }
}

/// The timing state of one connection.
pub struct ConnClock {
    origin: Instant,
    timeouts: Timeouts,
    state: Mutex<State>,
    /// Set while `Idle`, so a read takes the lock only when it may matter.
    idle: AtomicBool,
    body_wait: WaitSince,
    send_wait: WaitSince,
    body_stalled: AtomicBool,
    body_waker: AtomicWaker,
    signal: AtomicU8,
    expiry: AtomicU8,
    conn_waker: AtomicWaker,
}

impl std::fmt::Debug for ConnClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnClock").field("state", &*self.state.lock()).finish_non_exhaustive()
    }
}

impl ConnClock {
    /// A connection accepted at `now`, waiting for its first request head.
    pub fn new(now: Instant, timeouts: Timeouts) -> ConnClock {
        ConnClock {
            origin: now,
            timeouts,
            state: Mutex::new(State { phase: Phase::Head, since: now }),
            idle: AtomicBool::new(false),
            body_wait: WaitSince(AtomicU64::new(0)),
            send_wait: WaitSince(AtomicU64::new(0)),
            body_stalled: AtomicBool::new(false),
            body_waker: AtomicWaker::new(),
            signal: AtomicU8::new(Signal::None as u8),
            expiry: AtomicU8::new(0),
            conn_waker: AtomicWaker::new(),
        }
    }

    /// Bytes arrived: while idle they start the next request's head.
    pub fn on_read(&self, now: impl FnOnce() -> Instant) {
        if self.idle.load(Ordering::Relaxed) {
            let now = now();
            let mut s = self.state.lock();
            if s.phase == Phase::Idle {
                *s = State { phase: Phase::Head, since: now };
                self.idle.store(false, Ordering::Relaxed);
            }
        }
    }

    /// A request's head was parsed and its handler starts.
    pub fn on_request_start(&self) {
        let mut s = self.state.lock();
        s.phase = match s.phase {
            Phase::Active(n) => Phase::Active(n + 1),
            Phase::Head | Phase::Idle => Phase::Active(1),
        };
        self.idle.store(false, Ordering::Relaxed);
    }

    /// A request's response is done (or abandoned).
    pub fn on_request_end(&self, now: Instant) {
        let mut s = self.state.lock();
        if let Phase::Active(n) = s.phase {
            if n > 1 {
                s.phase = Phase::Active(n - 1);
            } else {
                *s = State { phase: Phase::Idle, since: now };
                self.idle.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The handler found no body bytes; `Ready` if the sweeper has declared
    /// the body stalled (then the flag is consumed).
    pub(crate) fn poll_body_stalled(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.body_wait.start(self.origin);
        self.body_waker.register(cx.waker());
        if self.body_stalled.swap(false, Ordering::AcqRel) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Body bytes arrived, or the body is done: it is not waiting.
    pub(crate) fn body_progress(&self) {
        self.body_wait.stop();
    }

    pub(crate) fn body_done(&self) {
        self.body_wait.stop();
        self.body_stalled.store(false, Ordering::Relaxed);
    }

    fn send_waiting(&self) {
        self.send_wait.start(self.origin);
    }

    fn send_progress(&self) {
        self.send_wait.stop();
    }

    /// What is due at `now` (pure: reads the state, changes nothing).
    pub fn check(&self, now: Instant) -> Verdict {
        let t = &self.timeouts;
        let s = self.state.lock();
        let mut v = Verdict::default();
        match s.phase {
            Phase::Head if now.saturating_duration_since(s.since) >= t.header_read => v.close = Some(Expiry::HeaderRead),
            Phase::Idle if now.saturating_duration_since(s.since) >= t.idle => v.close = Some(Expiry::Idle),
            Phase::Active(_) => v.body_stalled = self.body_wait.waited(self.origin, now).is_some_and(|w| w >= t.body_progress),
            _ => {}
        }
        if v.close.is_none() && self.send_wait.waited(self.origin, now).is_some_and(|w| w >= t.send_progress) {
            v.close = Some(Expiry::SendProgress);
        }
        v
    }

    /// Acts on a verdict: wakes the stalled body, or asks the connection to close.
    fn apply(&self, v: Verdict) {
        if v.body_stalled {
            self.body_wait.stop();
            self.body_stalled.store(true, Ordering::Release);
            self.body_waker.wake();
        }
        if let Some(e) = v.close {
            self.expiry.store(e as u8 + 1, Ordering::Relaxed);
            self.raise(Signal::Close);
        }
    }

    /// Raises the signal to at least `s` and wakes the connection task.
    pub fn raise(&self, s: Signal) {
        if self.signal.fetch_max(s as u8, Ordering::AcqRel) < s as u8 {
            self.conn_waker.wake();
        }
    }

    /// Waits until the signal is above `seen`.
    pub async fn signal_above(&self, seen: Signal) -> Signal {
        std::future::poll_fn(|cx| {
            self.conn_waker.register(cx.waker());
            match self.signal.load(Ordering::Acquire) {
                2 if seen < Signal::Close => Poll::Ready(Signal::Close),
                1 if seen < Signal::Drain => Poll::Ready(Signal::Drain),
                _ => Poll::Pending,
            }
        })
        .await
    }

    /// The timeout that closed the connection, if one did.
    pub fn expiry(&self) -> Option<Expiry> {
        match self.expiry.load(Ordering::Relaxed) {
            1 => Some(Expiry::HeaderRead),
            2 => Some(Expiry::Idle),
            3 => Some(Expiry::SendProgress),
            _ => None,
        }
    }
}

/// The live connections of a server and the run state they should follow.
#[derive(Default)]
pub struct Sweeper {
    conns: Mutex<HashMap<u64, Arc<ConnClock>>>,
    next_id: AtomicU64,
    /// The signal every connection gets (raised at shutdown).
    all: AtomicU8,
}

/// A connection's place in the [`Sweeper`], removed when dropped.
pub struct Registration {
    sweeper: Arc<Sweeper>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.sweeper.conns.lock().remove(&self.id);
    }
}

impl Sweeper {
    pub fn register(self: &Arc<Self>, clock: Arc<ConnClock>) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut conns = self.conns.lock();
        // Read under the lock: a shutdown raised before is seen here, one
        // raised after sees this connection in the map.
        match self.all.load(Ordering::Acquire) {
            1 => clock.raise(Signal::Drain),
            2 => clock.raise(Signal::Close),
            _ => {}
        }
        conns.insert(id, clock);
        Registration { sweeper: Arc::clone(self), id }
    }

    /// One sweep at `now`.
    pub fn sweep(&self, now: Instant) {
        for clock in self.conns.lock().values() {
            clock.apply(clock.check(now));
        }
    }

    /// Raises `s` on every connection, present and future.
    pub fn raise_all(&self, s: Signal) {
        self.all.fetch_max(s as u8, Ordering::AcqRel);
        for clock in self.conns.lock().values() {
            clock.raise(s);
        }
    }

    pub fn len(&self) -> usize {
        self.conns.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pin_project! {
    /// The connection's byte stream: reads move the clock; a write the
    /// peer does not accept starts the send-progress wait.
    pub struct TimedIo<S> {
        #[pin]
        inner: S,
        clock: Arc<ConnClock>,
    }
}

impl<S> TimedIo<S> {
    pub fn new(inner: S, clock: Arc<ConnClock>) -> Self {
        TimedIo { inner, clock }
    }
}

impl<S: AsyncRead> AsyncRead for TimedIo<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = this.inner.poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.clock.on_read(Instant::now);
        }
        r
    }
}

fn sent<T>(r: Poll<io::Result<T>>, clock: &ConnClock) -> Poll<io::Result<T>> {
    match r {
        Poll::Ready(r) => {
            clock.send_progress();
            Poll::Ready(r)
        }
        Poll::Pending => {
            clock.send_waiting();
            Poll::Pending
        }
    }
}

impl<S: AsyncWrite> AsyncWrite for TimedIo<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.project();
        sent(this.inner.poll_write(cx, buf), this.clock)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.project();
        sent(this.inner.poll_write_vectored(cx, bufs), this.clock)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        sent(this.inner.poll_flush(cx), this.clock)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn clock(now: Instant) -> ConnClock {
        ConnClock::new(now, Timeouts { header_read: S(10), idle: S(60), body_progress: S(30), send_progress: S(20) })
    }

    fn close(c: &ConnClock, now: Instant) -> Option<Expiry> {
        c.check(now).close
    }

    #[test]
    fn fresh_connection_must_send_a_head_in_time() {
        let t0 = Instant::now();
        let c = clock(t0);
        assert_eq!(close(&c, t0 + S(9)), None);
        // Bytes trickling in do not extend the head deadline.
        c.on_read(|| t0 + S(5));
        assert_eq!(close(&c, t0 + S(10)), Some(Expiry::HeaderRead));
    }

    #[test]
    fn active_requests_have_no_connection_deadline() {
        let t0 = Instant::now();
        let c = clock(t0);
        c.on_request_start();
        let late = t0 + S(3600);
        assert_eq!(c.check(late), Verdict::default());
        c.on_read(|| late);
        assert_eq!(c.check(late + S(100)), Verdict::default());
    }

    #[test]
    fn idle_then_next_head() {
        let t0 = Instant::now();
        let c = clock(t0);
        c.on_request_start();
        let t1 = t0 + S(1);
        c.on_request_end(t1);
        assert_eq!(close(&c, t1 + S(59)), None);
        assert_eq!(close(&c, t1 + S(60)), Some(Expiry::Idle));
        // A byte of the next request switches to the head deadline.
        let t2 = t1 + S(30);
        c.on_read(|| t2);
        assert_eq!(close(&c, t2 + S(9)), None);
        assert_eq!(close(&c, t2 + S(10)), Some(Expiry::HeaderRead));
    }

    #[test]
    fn pipelined_requests_count() {
        let t0 = Instant::now();
        let c = clock(t0);
        c.on_request_start();
        c.on_request_start();
        c.on_request_end(t0);
        assert_eq!(close(&c, t0 + S(100)), None, "one request still in flight");
        c.on_request_end(t0 + S(100));
        assert_eq!(close(&c, t0 + S(160)), Some(Expiry::Idle));
        // A stray end (never started) changes nothing.
        c.on_request_end(t0);
        assert_eq!(close(&c, t0 + S(160)), Some(Expiry::Idle));
    }

    #[test]
    fn stalled_body_and_stalled_sends() {
        let t0 = Instant::now();
        let c = clock(t0);
        c.on_request_start();
        // The body waits from its first empty poll (the real clock: now).
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(c.poll_body_stalled(&mut cx).is_pending());
        let start = Instant::now();
        assert!(!c.check(start + S(29)).body_stalled);
        let v = c.check(start + S(31));
        assert!(v.body_stalled && v.close.is_none(), "{v:?}");
        c.apply(v);
        assert!(c.poll_body_stalled(&mut cx).is_ready(), "the body sees the stall once");
        // Progress clears the wait.
        c.body_progress();
        assert!(!c.check(start + S(100)).body_stalled);
        // A send that waits too long closes the connection, in any phase.
        c.send_waiting();
        let start = Instant::now();
        assert_eq!(close(&c, start + S(19)), None);
        assert_eq!(close(&c, start + S(21)), Some(Expiry::SendProgress));
        c.send_progress();
        assert_eq!(close(&c, start + S(100)), None);
    }

    #[test]
    fn signals_only_rise() {
        let c = clock(Instant::now());
        c.raise(Signal::Close);
        c.raise(Signal::Drain);
        assert_eq!(c.signal.load(Ordering::Relaxed), Signal::Close as u8);
    }

    #[test]
    fn sweep_periods() {
        let t = |ms: u64| Timeouts { header_read: Duration::from_millis(ms), idle: S(60), body_progress: S(30), send_progress: S(30) };
        assert_eq!(t(10_000).sweep_period(), S(1));
        assert_eq!(t(300).sweep_period(), Duration::from_millis(75));
        assert_eq!(t(1).sweep_period(), Duration::from_millis(10));
    }
}
