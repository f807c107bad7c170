//! The updates in flight at one target, counted per (chain, chain version).
//!
//! A sync may dump the predecessor's chunks only once no update admitted
//! under an **older** chain version can still commit there. Such an update
//! passed its routing check before the syncing target joined the chain, so
//! it is never forwarded to it; if it commits after the dump, nothing sends
//! its chunk either, and the recovered target serves a hole where committed
//! data is (seen as a lost 512 KiB chunk after a storage node's kill -9 on
//! a loaded machine: the tail of the old chain applied a new chunk while
//! the sync planned without it).
//!
//! | who | when | what |
//! |---|---|---|
//! | a write step (client write, forward, relay) | before it reads routing under the chunk lock, until it answers | holds an [`InflightGuard`] for (its chain, its request's chain version) |
//! | the sync worker | after routing shows its successor syncing at version `v`, before the dump | waits until no guard of the chain with a version `< v` is held (bounded: the sync fails and is retried) |
//!
//! A step that registers after the sync worker's check reads routing after
//! registering, so it sees version `v` and rejects an older request: the
//! wait cannot miss a step.

use fskv_types::ChainId;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::Notify;

/// Counts of running write steps per (chain, request chain version).
#[derive(Default)]
pub struct InflightUpdates {
    counts: Mutex<BTreeMap<(ChainId, u32), usize>>,
    changed: Notify,
}

/// Held by a running write step; dropping it ends the step's count.
pub struct InflightGuard<'a> {
    set: &'a InflightUpdates,
    key: (ChainId, u32),
}

impl InflightUpdates {
    /// Counts a step of `chain` admitted (or to be checked) at `chain_ver`.
    pub fn enter(&self, chain: ChainId, chain_ver: u32) -> InflightGuard<'_> {
        *self.counts.lock().entry((chain, chain_ver)).or_insert(0) += 1;
        InflightGuard { set: self, key: (chain, chain_ver) }
    }

    /// Steps of `chain` running under a chain version older than `chain_ver`.
    pub fn older_than(&self, chain: ChainId, chain_ver: u32) -> usize {
        self.counts.lock().range((chain, 0)..(chain, chain_ver)).map(|(_, n)| n).sum()
    }

    /// Waits until no step of `chain` older than `chain_ver` runs; after
    /// `max_wait` returns how many still do.
    pub async fn wait_older_done(&self, chain: ChainId, chain_ver: u32, max_wait: Duration) -> Result<(), usize> {
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            // Registered before the check, so a drop between the check and
            // the wait still wakes us.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let older = self.older_than(chain, chain_ver);
            if older == 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(self.older_than(chain, chain_ver));
            }
        }
    }
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        let mut counts = self.set.counts.lock();
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        } else {
            debug_assert!(false, "in-flight count of {:?} missing", self.key);
        }
        drop(counts);
        self.set.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_older_versions_of_the_same_chain() {
        let set = InflightUpdates::default();
        let _a = set.enter(ChainId(1), 2);
        let _b = set.enter(ChainId(1), 3);
        let _c = set.enter(ChainId(2), 1);
        assert_eq!(set.older_than(ChainId(1), 3), 1);
        assert_eq!(set.older_than(ChainId(1), 4), 2);
        assert_eq!(set.older_than(ChainId(1), 2), 0);
        assert_eq!(set.older_than(ChainId(2), 3), 1);
        assert_eq!(set.older_than(ChainId(3), 9), 0);
    }

    #[tokio::test]
    async fn the_wait_ends_when_the_last_older_step_ends_and_not_before() {
        let set = std::sync::Arc::new(InflightUpdates::default());
        let old1 = set.enter(ChainId(1), 2);
        let old2 = set.enter(ChainId(1), 2);
        let _newer = set.enter(ChainId(1), 3);
        let waiter = {
            let set = set.clone();
            tokio::spawn(async move { set.wait_older_done(ChainId(1), 3, Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        drop(old1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "one older step still runs");
        drop(old2);
        assert_eq!(waiter.await.expect("join"), Ok(()));
    }

    #[tokio::test]
    async fn the_wait_is_bounded() {
        let set = InflightUpdates::default();
        let _stuck = set.enter(ChainId(1), 1);
        assert_eq!(set.wait_older_done(ChainId(1), 2, Duration::from_millis(50)).await, Err(1));
        assert_eq!(set.wait_older_done(ChainId(1), 1, Duration::from_millis(50)).await, Ok(()));
    }
}
