//! When the daemon takes a batch from a ring: the `io_depth` rule, as a
//! pure function of what is ready and the time (no I/O, no clock).
//!
//! `n` = submissions ready, bounded by the room left for their completions
//! (and by `max_batch`); `d` = the ring's `io_depth`; `t` = its timeout.
//!
//! | `io_depth` | state | decision |
//! |---|---|---|
//! | `d > 0` | `n >= d` | take exactly `d` |
//! | `d > 0` | `n < d` | nothing (wait for more submissions or consumed completions) |
//! | `0` | `n > 0` | take `n` (whatever is ready) |
//! | `d < 0` | `n >= \|d\|` | take `\|d\|` |
//! | `d < 0`, `t == 0` | `0 < n < \|d\|` | take `n` |
//! | `d < 0`, `t > 0` | `0 < n < \|d\|`, first seen short at `s` | take `n` once `now >= s + t`, else wait until `s + t` |
//! | any | `n == 0` | nothing |
//!
//! A batch with `d > 0` larger than `max_batch` is still taken whole (the
//! program asked for exactly that many); `max_batch` bounds the other cases.

use std::time::{Duration, Instant};

/// What to do with a ring now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Take this many submissions as one batch (then ask again).
    Take(u32),
    /// Nothing before this instant (unless more arrive).
    WaitUntil(Instant),
    /// Nothing until more submissions (or consumed completions) arrive.
    Idle,
}

/// The batching state of one ring.
#[derive(Clone, Debug)]
pub struct Batcher {
    io_depth: i32,
    timeout: Duration,
    max_batch: u32,
    /// When a short batch (`d < 0`) was first seen.
    short_since: Option<Instant>,
}

impl Batcher {
    pub fn new(io_depth: i32, timeout_ms: u32, max_batch: u32) -> Batcher {
        Batcher { io_depth, timeout: Duration::from_millis(u64::from(timeout_ms)), max_batch: max_batch.max(1), short_since: None }
    }

    pub fn io_depth(&self) -> i32 {
        self.io_depth
    }

    /// The decision for `ready` submissions with room for `cq_space` completions.
    pub fn decide(&mut self, ready: u32, cq_space: u32, now: Instant) -> Decision {
        let n = ready.min(cq_space);
        if self.io_depth > 0 {
            let d = self.io_depth as u32;
            return if n >= d { Decision::Take(d) } else { Decision::Idle };
        }
        let n = n.min(self.max_batch);
        if n == 0 {
            self.short_since = None;
            return Decision::Idle;
        }
        if self.io_depth == 0 {
            return Decision::Take(n);
        }
        let d = self.io_depth.unsigned_abs();
        if n >= d {
            self.short_since = None;
            return Decision::Take(d);
        }
        if self.timeout.is_zero() {
            return Decision::Take(n);
        }
        let since = *self.short_since.get_or_insert(now);
        let at = since + self.timeout;
        if now >= at {
            self.short_since = None;
            Decision::Take(n)
        } else {
            Decision::WaitUntil(at)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_depth_takes_exact_batches() {
        let t0 = Instant::now();
        let mut b = Batcher::new(4, 0, 64);
        assert_eq!(b.decide(3, 100, t0), Decision::Idle);
        assert_eq!(b.decide(4, 100, t0), Decision::Take(4));
        assert_eq!(b.decide(9, 100, t0), Decision::Take(4));
        assert_eq!(b.decide(9, 3, t0), Decision::Idle, "no room for four completions");
        let mut big = Batcher::new(128, 0, 64);
        assert_eq!(big.decide(128, 128, t0), Decision::Take(128), "an exact batch is never cut");
    }

    #[test]
    fn zero_depth_takes_what_is_ready() {
        let t0 = Instant::now();
        let mut b = Batcher::new(0, 0, 64);
        assert_eq!(b.decide(0, 10, t0), Decision::Idle);
        assert_eq!(b.decide(5, 10, t0), Decision::Take(5));
        assert_eq!(b.decide(5, 2, t0), Decision::Take(2));
        assert_eq!(b.decide(500, 1000, t0), Decision::Take(64), "bounded by max_batch");
    }

    #[test]
    fn negative_depth_waits_for_a_full_batch_up_to_the_timeout() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = Batcher::new(-8, 10, 64);
        assert_eq!(b.decide(20, 100, t0), Decision::Take(8));
        assert_eq!(b.decide(3, 100, t0), Decision::WaitUntil(t0 + ms(10)));
        assert_eq!(b.decide(5, 100, t0 + ms(4)), Decision::WaitUntil(t0 + ms(10)), "the clock runs from the first short look");
        assert_eq!(b.decide(5, 100, t0 + ms(10)), Decision::Take(5));
        assert_eq!(b.decide(2, 100, t0 + ms(11)), Decision::WaitUntil(t0 + ms(21)), "a new short batch starts a new wait");
        assert_eq!(b.decide(8, 100, t0 + ms(12)), Decision::Take(8), "a full batch goes at once");
        assert_eq!(b.decide(0, 100, t0 + ms(13)), Decision::Idle);
        let mut no_timeout = Batcher::new(-8, 0, 64);
        assert_eq!(no_timeout.decide(3, 100, t0), Decision::Take(3));
    }
}
