//! Time behind a trait, so tests (and a simulation) drive mgmtd's clock.
//!
//! Two readings:
//!
//! | reading | used for | may jump |
//! |---|---|---|
//! | [`Clock::now_ms`] (wall clock, ms since the Unix epoch) | the lease record's displayed expiry | yes (NTP steps, `date -s`, VM resume) |
//! | [`Clock::monotonic_ms`] (any origin) | everything measured: how long the holder may act, how long a standby has seen one lease record, heartbeat ages, node and meta-server timeouts | no |
//!
//! No decision compares one process's reading with another's, so mgmtd
//! instances need no synchronized clocks (docs/mgmtd.md, "Primary lease").

use std::sync::atomic::{AtomicU64, Ordering};

pub trait Clock: Send + Sync + 'static {
    /// Wall-clock milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// Milliseconds on a clock that never jumps (its origin is arbitrary).
    /// The default, for test clocks that never jump, is [`Clock::now_ms`].
    fn monotonic_ms(&self) -> u64 {
        self.now_ms()
    }
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    /// Milliseconds since the first reading in this process.
    fn monotonic_ms(&self) -> u64 {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        u64::try_from(ORIGIN.get_or_init(std::time::Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        ManualClock { now_ms: AtomicU64::new(start_ms) }
    }

    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn set(&self, ms: u64) {
        self.now_ms.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}
