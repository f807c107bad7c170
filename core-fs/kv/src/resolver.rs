//! The commit resolver: decides whether a transaction may commit by checking
//! its read-conflict set against the writes of transactions that committed
//! after its read version (the FoundationDB resolver idea).
//!
//! Pure: no I/O, no clock (time comes in as `now_ms`), so it is tested
//! directly. The embedded engines drive it from their commit thread.
//!
//! Invariants:
//! * `point_writes[k]` is the newest version that wrote point key `k` among
//!   the versions still in `history`;
//! * every write with version `> horizon` is still tracked, so a transaction
//!   with `read_version >= horizon` is checked exactly; older ones get
//!   `TooOld` (we no longer know what they missed).

use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

/// Point keys and half-open key ranges `[begin, end)`.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConflictSet {
    pub points: Vec<Bytes>,
    pub ranges: Vec<(Bytes, Bytes)>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Commit,
    Conflict,
    TooOld,
}

struct HistoryEntry {
    version: u64,
    committed_at_ms: u64,
    points: Vec<Bytes>,
    has_ranges: bool,
}

pub(crate) struct Resolver {
    /// How long write history is kept; transactions older than this may get `TooOld`.
    window_ms: u64,
    /// Upper bound on tracked point keys; beyond it the oldest history is dropped early.
    max_tracked_keys: usize,
    point_writes: BTreeMap<Bytes, u64>,
    range_writes: Vec<(Bytes, Bytes, u64)>,
    history: VecDeque<HistoryEntry>,
    tracked_keys: usize,
    horizon: u64,
}

impl Resolver {
    pub fn new(window_ms: u64, max_tracked_keys: usize, start_version: u64) -> Self {
        Resolver {
            window_ms,
            max_tracked_keys,
            point_writes: BTreeMap::new(),
            range_writes: Vec::new(),
            history: VecDeque::new(),
            tracked_keys: 0,
            horizon: start_version,
        }
    }

    /// Whether a transaction that read `reads` at `read_version` may commit now.
    pub fn check(&self, read_version: u64, reads: &ConflictSet) -> Verdict {
        if read_version < self.horizon {
            return Verdict::TooOld;
        }
        let newer = |v: &u64| *v > read_version;
        for key in &reads.points {
            if self.point_writes.get(key).is_some_and(newer) {
                return Verdict::Conflict;
            }
            if self.range_writes.iter().any(|(b, e, v)| newer(v) && b <= key && key < e) {
                return Verdict::Conflict;
            }
        }
        for (begin, end) in &reads.ranges {
            if begin >= end {
                continue;
            }
            let bounds = (Bound::Included(begin), Bound::Excluded(end));
            if self.point_writes.range::<Bytes, _>(bounds).any(|(_, v)| newer(v)) {
                return Verdict::Conflict;
            }
            if self.range_writes.iter().any(|(b, e, v)| newer(v) && b < end && begin < e) {
                return Verdict::Conflict;
            }
        }
        Verdict::Commit
    }

    /// Records the writes of a transaction committed at `version`.
    /// Versions must be recorded in increasing order.
    pub fn record(&mut self, version: u64, writes: &ConflictSet, now_ms: u64) {
        debug_assert!(self.history.back().is_none_or(|h| h.version < version));
        for key in &writes.points {
            self.point_writes.insert(key.clone(), version);
        }
        for (b, e) in &writes.ranges {
            if b < e {
                self.range_writes.push((b.clone(), e.clone(), version));
            }
        }
        self.tracked_keys += writes.points.len();
        self.history.push_back(HistoryEntry {
            version,
            committed_at_ms: now_ms,
            points: writes.points.clone(),
            has_ranges: !writes.ranges.is_empty(),
        });
        self.prune(now_ms);
    }

    /// Forgets history older than the window (or beyond the key bound).
    pub fn prune(&mut self, now_ms: u64) {
        let mut pruned_ranges = false;
        while let Some(front) = self.history.front() {
            let expired = now_ms.saturating_sub(front.committed_at_ms) > self.window_ms;
            let over = self.tracked_keys > self.max_tracked_keys;
            if !expired && !over {
                break;
            }
            let Some(entry) = self.history.pop_front() else { break };
            for key in &entry.points {
                if self.point_writes.get(key) == Some(&entry.version) {
                    self.point_writes.remove(key);
                }
            }
            self.tracked_keys -= entry.points.len();
            pruned_ranges |= entry.has_ranges;
            self.horizon = self.horizon.max(entry.version);
        }
        if pruned_ranges {
            let horizon = self.horizon;
            self.range_writes.retain(|(_, _, v)| *v > horizon);
        }
    }

    #[cfg(test)]
    fn tracked_keys(&self) -> usize {
        self.tracked_keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(keys: &[&str]) -> ConflictSet {
        ConflictSet { points: keys.iter().map(|k| Bytes::copy_from_slice(k.as_bytes())).collect(), ranges: vec![] }
    }

    fn range(b: &str, e: &str) -> ConflictSet {
        ConflictSet { points: vec![], ranges: vec![(Bytes::copy_from_slice(b.as_bytes()), Bytes::copy_from_slice(e.as_bytes()))] }
    }

    #[test]
    fn point_read_conflicts_only_with_newer_write() {
        let mut r = Resolver::new(5_000, 1_000, 0);
        r.record(5, &points(&["a"]), 0);
        assert_eq!(r.check(4, &points(&["a"])), Verdict::Conflict);
        assert_eq!(r.check(5, &points(&["a"])), Verdict::Commit);
        assert_eq!(r.check(4, &points(&["b"])), Verdict::Commit);
    }

    #[test]
    fn range_read_conflicts_with_insert_inside() {
        let mut r = Resolver::new(5_000, 1_000, 0);
        r.record(2, &points(&["dir/m"]), 0);
        assert_eq!(r.check(1, &range("dir/", "dir0")), Verdict::Conflict);
        assert_eq!(r.check(1, &range("dir/n", "dir0")), Verdict::Commit);
        // end is exclusive
        assert_eq!(r.check(1, &range("dir/a", "dir/m")), Verdict::Commit);
    }

    #[test]
    fn range_write_conflicts_with_point_and_range_reads() {
        let mut r = Resolver::new(5_000, 1_000, 0);
        r.record(3, &range("k1", "k5"), 0);
        assert_eq!(r.check(2, &points(&["k3"])), Verdict::Conflict);
        assert_eq!(r.check(2, &points(&["k5"])), Verdict::Commit);
        assert_eq!(r.check(2, &range("k4", "k9")), Verdict::Conflict);
        assert_eq!(r.check(2, &range("k5", "k9")), Verdict::Commit);
    }

    #[test]
    fn pruning_moves_horizon_and_old_readers_get_too_old() {
        let mut r = Resolver::new(100, 1_000, 0);
        r.record(1, &points(&["a"]), 0);
        r.record(2, &range("b", "c"), 50);
        r.record(3, &points(&["d"]), 500);
        assert_eq!(r.tracked_keys(), 1);
        assert_eq!(r.check(1, &points(&["x"])), Verdict::TooOld);
        assert_eq!(r.check(2, &points(&["a", "bb"])), Verdict::Commit);
        assert_eq!(r.check(2, &points(&["d"])), Verdict::Conflict);
    }

    #[test]
    fn key_bound_prunes_early() {
        let mut r = Resolver::new(u64::MAX, 2, 0);
        r.record(1, &points(&["a", "b"]), 0);
        r.record(2, &points(&["c"]), 0);
        assert_eq!(r.tracked_keys(), 1);
        assert_eq!(r.check(0, &points(&["c"])), Verdict::TooOld);
        assert_eq!(r.check(1, &points(&["c"])), Verdict::Conflict);
    }
}
