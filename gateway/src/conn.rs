//! Per-connection timeouts: a pure clock of the connection's phase, and an
//! IO wrapper that feeds it and bounds stalled sends.
//!
//! | phase | entered when | deadline |
//! |---|---|---|
//! | `Head` | accept; or the first byte read while `Idle` | since + `header_read_timeout_ms` (the whole head, however slowly it trickles) |
//! | `Active(n)` | a request's head is parsed (n requests in flight) | none here: the body has `body_progress_timeout_ms` ([`crate::body`]) and sends `send_progress_timeout_ms` ([`TimedIo`]) |
//! | `Idle` | the last response in flight is done | since + `idle_timeout_ms` |
//!
//! A connection past its deadline is closed by the server's connection task,
//! which asks [`ConnClock::check`] when the deadline it was last given passes.

use parking_lot::Mutex;
use pin_project_lite::pin_project;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Head,
    Active(u32),
    Idle,
}

/// Why a connection was closed by its clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    HeaderRead,
    Idle,
}

impl Expiry {
    pub fn label(self) -> &'static str {
        match self {
            Expiry::HeaderRead => "header_read",
            Expiry::Idle => "idle",
        }
    }
}

#[derive(Debug)]
struct State {
    phase: Phase,
    since: Instant,
}

/// The phase of one connection and its deadline. Time is passed in.
#[derive(Debug)]
pub struct ConnClock {
    state: Mutex<State>,
    /// Set while `Idle`, so a read checks the lock only when it may matter.
    idle: AtomicBool,
    send_timed_out: AtomicBool,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

impl ConnClock {
    /// A connection accepted at `now`, waiting for its first request head.
    pub fn new(now: Instant, header_read_timeout: Duration, idle_timeout: Duration) -> ConnClock {
        ConnClock {
            state: Mutex::new(State { phase: Phase::Head, since: now }),
            idle: AtomicBool::new(false),
            send_timed_out: AtomicBool::new(false),
            header_read_timeout,
            idle_timeout,
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

    /// Whether a send was failed by the send progress timeout.
    pub fn send_timed_out(&self) -> bool {
        self.send_timed_out.load(Ordering::Relaxed)
    }

    /// `Err` when the connection is past its deadline at `now`; otherwise the
    /// time to check again (a deadline, or a re-check while active).
    pub fn check(&self, now: Instant) -> Result<Instant, Expiry> {
        let s = self.state.lock();
        let (limit, expiry) = match s.phase {
            Phase::Head => (self.header_read_timeout, Expiry::HeaderRead),
            Phase::Idle => (self.idle_timeout, Expiry::Idle),
            Phase::Active(_) => return Ok(now + self.header_read_timeout.min(self.idle_timeout)),
        };
        let deadline = s.since + limit;
        if now >= deadline {
            Err(expiry)
        } else if s.phase == Phase::Idle {
            // A head may start any time: look again within its timeout.
            Ok(deadline.min(now + self.header_read_timeout))
        } else {
            Ok(deadline)
        }
    }
}

/// Bounds how long an operation may stay pending: the wait starts at the
/// first `Pending` after progress; the timer is allocated once and reset at
/// most once per timeout period.
#[derive(Debug)]
pub(crate) struct ProgressTimer {
    timeout: Duration,
    waiting_since: Option<Instant>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl ProgressTimer {
    pub(crate) fn new(timeout: Duration) -> Self {
        ProgressTimer { timeout, waiting_since: None, sleep: None }
    }

    /// The operation made progress: the wait, if any, is over.
    pub(crate) fn progress(&mut self) {
        self.waiting_since = None;
    }

    /// Called when the operation is pending: `Ready` once it has been
    /// pending for the whole timeout without progress.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        let deadline = since + self.timeout;
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        match sleep.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(()),
        }
    }
}

pin_project! {
    /// The connection's byte stream: reads move the clock, sends that make no
    /// progress for `send_progress_timeout` fail with `TimedOut`.
    pub struct TimedIo<S> {
        #[pin]
        inner: S,
        clock: Arc<ConnClock>,
        send: ProgressTimer,
    }
}

impl<S> TimedIo<S> {
    pub fn new(inner: S, clock: Arc<ConnClock>, send_progress_timeout: Duration) -> Self {
        TimedIo { inner, clock, send: ProgressTimer::new(send_progress_timeout) }
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

fn send_result<T>(r: Poll<io::Result<T>>, timer: &mut ProgressTimer, clock: &ConnClock, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
    match r {
        Poll::Ready(r) => {
            timer.progress();
            Poll::Ready(r)
        }
        Poll::Pending => match timer.poll_expired(cx) {
            Poll::Ready(()) => {
                clock.send_timed_out.store(true, Ordering::Relaxed);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer accepted no response bytes for the send progress timeout",
                )))
            }
            Poll::Pending => Poll::Pending,
        },
    }
}

impl<S: AsyncWrite> AsyncWrite for TimedIo<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write(cx, buf);
        send_result(r, this.send, this.clock, cx)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write_vectored(cx, bufs);
        send_result(r, this.send, this.clock, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let r = this.inner.poll_flush(cx);
        send_result(r, this.send, this.clock, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(now: Instant) -> ConnClock {
        ConnClock::new(now, Duration::from_secs(10), Duration::from_secs(60))
    }

    #[test]
    fn fresh_connection_must_send_a_head_in_time() {
        let t0 = Instant::now();
        let c = clock(t0);
        assert_eq!(c.check(t0), Ok(t0 + Duration::from_secs(10)));
        // Bytes trickling in do not extend the head deadline.
        c.on_read(|| t0 + Duration::from_secs(5));
        assert_eq!(c.check(t0 + Duration::from_secs(10)), Err(Expiry::HeaderRead));
    }

    #[test]
    fn active_requests_have_no_connection_deadline() {
        let t0 = Instant::now();
        let c = clock(t0);
        c.on_request_start();
        let late = t0 + Duration::from_secs(3600);
        assert!(c.check(late).is_ok());
        c.on_read(|| late);
        assert!(c.check(late + Duration::from_secs(100)).is_ok());
    }

    #[test]
    fn idle_then_next_head() {
        let t0 = Instant::now();
        let c = clock(t0);
        c.on_request_start();
        let t1 = t0 + Duration::from_secs(1);
        c.on_request_end(t1);
        assert_eq!(c.check(t1), Ok(t1 + Duration::from_secs(10)), "idle: re-check within a head timeout");
        assert_eq!(c.check(t1 + Duration::from_secs(55)), Ok(t1 + Duration::from_secs(60)));
        assert_eq!(c.check(t1 + Duration::from_secs(60)), Err(Expiry::Idle));
        // A byte of the next request switches to the head deadline.
        let t2 = t1 + Duration::from_secs(30);
        c.on_read(|| t2);
        assert_eq!(c.check(t2), Ok(t2 + Duration::from_secs(10)));
        assert_eq!(c.check(t2 + Duration::from_secs(10)), Err(Expiry::HeaderRead));
    }

    #[test]
    fn pipelined_requests_count() {
        let t0 = Instant::now();
        let c = clock(t0);
        c.on_request_start();
        c.on_request_start();
        c.on_request_end(t0);
        assert!(c.check(t0 + Duration::from_secs(100)).is_ok(), "one request still in flight");
        c.on_request_end(t0 + Duration::from_secs(100));
        assert_eq!(c.check(t0 + Duration::from_secs(160)), Err(Expiry::Idle));
        // A stray end (never started) changes nothing.
        c.on_request_end(t0);
        assert_eq!(c.check(t0 + Duration::from_secs(160)), Err(Expiry::Idle));
    }
}
