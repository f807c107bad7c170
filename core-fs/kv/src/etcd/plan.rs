//! The commit plan of an etcd transaction (pure: no I/O, no clock).
//!
//! A transaction's reads become **compares** evaluated by etcd atomically
//! with its writes, so the transaction commits only if everything it read is
//! unchanged at the commit point. Rules (R = the transaction's snapshot
//! revision):
//!
//! | what was read (non-snapshot) | compare | catches |
//! |---|---|---|
//! | key `k`, present at R with `mod_revision` m | `mod_revision(k) == m` | a later set (mod > m), a clear (a missing key compares as 0), a clear and re-create |
//! | key `k`, absent at R, outside every read range | `mod_revision(k) == 0` | a later create |
//! | key `k`, absent at R, inside a read range | (none: the range compare covers it) | — |
//! | range `[b, e)` (the part actually read) | `mod_revision([b, e)) < R + 1`, i.e. every key now in the range was last written at or before R | inserts and overwrites inside the range |
//! | every key a range read returned (present at R) | `mod_revision(k) == m`, as a point read | clears inside the range (a cleared key vanishes, so the range compare cannot see it) |
//!
//! etcd keeps no tombstones a compare could see, so the last row is what
//! makes range reads exact: a deleted key is detected through the compare on
//! that very key. A read range costs one compare plus one per key it
//! returned; an emptiness check (`limit 1` on an empty directory) costs one.
//!
//! Atomic adds / maxes are blind: their base value is read at commit time.
//! With atomics the request is a nested transaction:
//!
//! ```text
//! outer compare : mod_revision(a) == guess(a)   for every atomic key a
//! outer success : [ inner txn { compare: the read compares above,
//!                               success: every mutation } ]
//! outer failure : [ range(a) for every atomic key a ]   (fresh bases → retry)
//! ```
//!
//! so a wrong guess of an atomic base never fails the transaction (it is
//! retried with the values the failure branch returned), while a failed read
//! compare does (`NotCommitted`).
//!
//! Mutations: a set inside a range this transaction clears would make etcd
//! refuse the request (a put inside a delete range of one transaction is a
//! "duplicate key"), so cleared ranges are merged and split around the keys
//! set after the clear; a point clear inside a cleared range is dropped.
//!
//! Limits checked here, before anything is sent (etcd's own checks are the
//! same, so a refusal is never a surprise at the server):
//! * etcd's `--max-txn-ops` (default 128) bounds `max(compares, mutations)`
//!   of a flat transaction, and for a nested one `max(1, atomics) +
//!   max(compares, mutations)` — refused with [`KvError::TooManyOperations`];
//! * etcd's `--max-request-bytes` (default 1.5 MiB) bounds the encoded
//!   request; the estimate here is an upper bound of the protobuf size —
//!   refused with [`KvError::TransactionTooLarge`].

use crate::{key_after, KvError, KvResult};
use bytes::Bytes;
use std::collections::BTreeMap;

/// Upper bound of the protobuf bytes a compare adds besides its keys.
pub(crate) const COMPARE_OVERHEAD_BYTES: usize = 32;
/// Upper bound of the protobuf bytes a mutation adds besides its key and value.
pub(crate) const OP_OVERHEAD_BYTES: usize = 16;

/// A compare on etcd keys (prefix applied by the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Compare {
    /// `mod_revision(key) == mod_revision` (0: the key is absent).
    ModEquals { key: Bytes, mod_revision: i64 },
    /// Every key in `[begin, end)` has `mod_revision < below`.
    RangeModBelow { begin: Bytes, end: Bytes, below: i64 },
}

/// A mutation sent to etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Put {
        key: Bytes,
        value: Bytes,
    },
    /// Deletes `key` (`end` None) or `[key, end)`.
    Delete {
        key: Bytes,
        end: Option<Bytes>,
    },
}

/// What a transaction does to one key in its own write set (user keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    Set(Bytes),
    Clear,
    Add(i64),
    Max(u64),
}

/// What a transaction read (user keys) and wrote, as input to [`plan`].
#[derive(Debug, Default)]
pub(crate) struct TxnSets {
    /// Snapshot revision; `None` when nothing was read.
    pub read_revision: Option<i64>,
    /// Keys read (points, and every key a read range returned) → their
    /// `mod_revision` at the snapshot (0 = absent).
    pub observed: BTreeMap<Bytes, i64>,
    /// Ranges read (the part actually read).
    pub ranges: Vec<(Bytes, Bytes)>,
    /// Own writes per key (after folding, as the overlay holds them).
    pub writes: BTreeMap<Bytes, Write>,
    /// Own range clears, in call order.
    pub cleared: Vec<(Bytes, Bytes)>,
}

/// Limits of the etcd cluster the engine talks to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanLimits {
    pub max_txn_ops: usize,
    pub max_request_bytes: usize,
}

/// A transaction ready to send except for the atomic bases.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub compares: Vec<Compare>,
    /// Deletes and plain puts.
    pub ops: Vec<Op>,
    /// Atomic keys (etcd keys) with their operation.
    pub atomics: Vec<(Bytes, Write)>,
    /// Estimated request size (bytes, an upper bound).
    pub request_bytes: usize,
    /// Operations as etcd counts them against `--max-txn-ops`.
    pub ops_needed: usize,
}

/// Merges overlapping or touching ranges (sorted by begin, disjoint).
pub(crate) fn merge_ranges(mut ranges: Vec<(Bytes, Bytes)>) -> Vec<(Bytes, Bytes)> {
    ranges.retain(|(b, e)| b < e);
    ranges.sort();
    let mut out: Vec<(Bytes, Bytes)> = Vec::with_capacity(ranges.len());
    for (b, e) in ranges {
        match out.last_mut() {
            Some((_, last_end)) if b <= *last_end => {
                if e > *last_end {
                    *last_end = e;
                }
            }
            _ => out.push((b, e)),
        }
    }
    out
}

fn covered(ranges: &[(Bytes, Bytes)], key: &[u8]) -> bool {
    // `ranges` is sorted and disjoint: the candidate is the last range starting at or before `key`.
    let i = ranges.partition_point(|(b, _)| &b[..] <= key);
    i > 0 && key < &ranges[i - 1].1[..]
}

/// Builds the plan: compares from the read sets, mutations from the write
/// set, etcd keys made by prefixing `prefix`. Refuses a plan etcd would refuse.
pub(crate) fn plan(sets: &TxnSets, prefix: &[u8], limits: PlanLimits) -> KvResult<Plan> {
    let ek = |k: &[u8]| -> Bytes {
        let mut v = Vec::with_capacity(prefix.len() + k.len());
        v.extend_from_slice(prefix);
        v.extend_from_slice(k);
        Bytes::from(v)
    };
    let mut compares = Vec::new();
    let read_ranges = merge_ranges(sets.ranges.clone());
    if let Some(rev) = sets.read_revision {
        for (b, e) in &read_ranges {
            compares.push(Compare::RangeModBelow { begin: ek(b), end: ek(e), below: rev.saturating_add(1) });
        }
        for (k, m) in &sets.observed {
            if *m == 0 && covered(&read_ranges, k) {
                continue;
            }
            compares.push(Compare::ModEquals { key: ek(k), mod_revision: *m });
        }
    }

    // Mutations. Keys written after a range clear survive it: split the
    // cleared ranges around them (etcd refuses a put inside a delete range).
    let cleared = merge_ranges(sets.cleared.clone());
    let mut ops = Vec::new();
    let mut atomics = Vec::new();
    let mut survivors: Vec<&Bytes> = Vec::new();
    for (k, w) in &sets.writes {
        match w {
            Write::Set(v) => {
                survivors.push(k);
                ops.push(Op::Put { key: ek(k), value: v.clone() });
            }
            Write::Clear => {
                if !covered(&cleared, k) {
                    ops.push(Op::Delete { key: ek(k), end: None });
                }
            }
            Write::Add(_) | Write::Max(_) => {
                survivors.push(k);
                atomics.push((ek(k), w.clone()));
            }
        }
    }
    for (b, e) in &cleared {
        let mut lo = b.clone();
        let start = survivors.partition_point(|k| **k < *b);
        for k in survivors[start..].iter().take_while(|k| ***k < *e) {
            if lo < **k {
                ops.push(Op::Delete { key: ek(&lo), end: Some(ek(k)) });
            }
            lo = key_after(k);
        }
        if lo < *e {
            ops.push(Op::Delete { key: ek(&lo), end: Some(ek(e)) });
        }
    }

    // Limits: operations.
    let mutations = ops.len() + atomics.len();
    let needed = if atomics.is_empty() { compares.len().max(mutations) } else { atomics.len() + compares.len().max(mutations) };
    if needed > limits.max_txn_ops {
        return Err(KvError::TooManyOperations { ops: needed, limit: limits.max_txn_ops });
    }
    // Limits: request bytes (atomic values are 8 bytes; their compares and
    // failure-branch ranges are counted too).
    let mut bytes = 0usize;
    for c in &compares {
        bytes += COMPARE_OVERHEAD_BYTES
            + match c {
                Compare::ModEquals { key, .. } => key.len(),
                Compare::RangeModBelow { begin, end, .. } => begin.len() + end.len(),
            };
    }
    for op in &ops {
        bytes += OP_OVERHEAD_BYTES
            + match op {
                Op::Put { key, value } => key.len() + value.len(),
                Op::Delete { key, end } => key.len() + end.as_ref().map_or(0, |e| e.len()),
            };
    }
    for (k, _) in &atomics {
        bytes += 3 * k.len() + OP_OVERHEAD_BYTES + 8 + 2 * COMPARE_OVERHEAD_BYTES;
    }
    if bytes > limits.max_request_bytes {
        return Err(KvError::TransactionTooLarge { size: bytes, limit: limits.max_request_bytes });
    }
    Ok(Plan { compares, ops, atomics, request_bytes: bytes, ops_needed: needed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    const WIDE: PlanLimits = PlanLimits { max_txn_ops: 10_000, max_request_bytes: 1 << 30 };

    #[test]
    fn merge_ranges_joins_overlapping_and_touching() {
        let m = merge_ranges(vec![(b("c"), b("e")), (b("a"), b("b")), (b("b"), b("c")), (b("x"), b("x")), (b("d"), b("f"))]);
        assert_eq!(m, vec![(b("a"), b("f"))]);
        let m = merge_ranges(vec![(b("a"), b("b")), (b("c"), b("d"))]);
        assert_eq!(m, vec![(b("a"), b("b")), (b("c"), b("d"))]);
    }

    #[test]
    fn point_reads_compare_their_mod_revision_and_ranges_compare_below_the_snapshot() {
        let mut sets = TxnSets { read_revision: Some(10), ..Default::default() };
        sets.observed.insert(b("k"), 7);
        sets.observed.insert(b("absent"), 0);
        sets.observed.insert(b("dir/a"), 3); // returned by the range read
        sets.observed.insert(b("dir/zz"), 0); // absent, inside the range: covered by it
        sets.ranges.push((b("dir/"), b("dir0")));
        sets.writes.insert(b("out"), Write::Set(b("1")));
        let p = plan(&sets, b"p/", WIDE).unwrap();
        assert_eq!(
            p.compares,
            vec![
                Compare::RangeModBelow { begin: b("p/dir/"), end: b("p/dir0"), below: 11 },
                Compare::ModEquals { key: b("p/absent"), mod_revision: 0 },
                Compare::ModEquals { key: b("p/dir/a"), mod_revision: 3 },
                Compare::ModEquals { key: b("p/k"), mod_revision: 7 },
            ]
        );
        assert_eq!(p.ops, vec![Op::Put { key: b("p/out"), value: b("1") }]);
        assert!(p.atomics.is_empty());
    }

    #[test]
    fn cleared_ranges_are_split_around_keys_set_after_the_clear() {
        let mut sets = TxnSets::default();
        sets.cleared.push((b("a"), b("m")));
        sets.cleared.push((b("k"), b("z"))); // overlaps: merged into [a, z)
        sets.writes.insert(b("c"), Write::Set(b("1")));
        sets.writes.insert(b("d"), Write::Add(1));
        sets.writes.insert(b("q"), Write::Clear); // inside the cleared range: dropped
        sets.writes.insert(b("zz"), Write::Clear); // outside: a point delete
        let p = plan(&sets, b"", WIDE).unwrap();
        assert_eq!(
            p.ops,
            vec![
                Op::Put { key: b("c"), value: b("1") },
                Op::Delete { key: b("zz"), end: None },
                Op::Delete { key: b("a"), end: Some(b("c")) },
                Op::Delete { key: key_after(b"c"), end: Some(b("d")) },
                Op::Delete { key: key_after(b"d"), end: Some(b("z")) },
            ]
        );
        assert_eq!(p.atomics, vec![(b("d"), Write::Add(1))]);
    }

    #[test]
    fn a_key_set_at_the_start_of_a_cleared_range_leaves_no_empty_delete() {
        let mut sets = TxnSets::default();
        sets.cleared.push((b("a"), b("b")));
        sets.writes.insert(b("a"), Write::Set(b("1")));
        let p = plan(&sets, b"", WIDE).unwrap();
        assert_eq!(p.ops, vec![Op::Put { key: b("a"), value: b("1") }, Op::Delete { key: key_after(b"a"), end: Some(b("b")) }]);
    }

    #[test]
    fn no_compares_without_a_read_revision() {
        let mut sets = TxnSets::default();
        sets.writes.insert(b("x"), Write::Set(b("1")));
        let p = plan(&sets, b"", WIDE).unwrap();
        assert!(p.compares.is_empty());
    }

    #[test]
    fn operation_limits_follow_etcds_flat_and_nested_rules() {
        let mut sets = TxnSets { read_revision: Some(5), ..Default::default() };
        for i in 0..4 {
            sets.observed.insert(b(&format!("r{i}")), 1);
        }
        for i in 0..3 {
            sets.writes.insert(b(&format!("w{i}")), Write::Set(b("v")));
        }
        // Flat: max(4 compares, 3 mutations) = 4.
        assert!(plan(&sets, b"", PlanLimits { max_txn_ops: 4, max_request_bytes: 1 << 20 }).is_ok());
        let e = plan(&sets, b"", PlanLimits { max_txn_ops: 3, max_request_bytes: 1 << 20 }).unwrap_err();
        assert_eq!(e, KvError::TooManyOperations { ops: 4, limit: 3 });
        // Nested: 1 atomic + max(4 compares, 4 mutations) = 5.
        sets.writes.insert(b("ctr"), Write::Add(1));
        let e = plan(&sets, b"", PlanLimits { max_txn_ops: 4, max_request_bytes: 1 << 20 }).unwrap_err();
        assert_eq!(e, KvError::TooManyOperations { ops: 5, limit: 4 });
        assert!(plan(&sets, b"", PlanLimits { max_txn_ops: 5, max_request_bytes: 1 << 20 }).is_ok());
    }

    #[test]
    fn request_size_is_refused_before_sending() {
        let mut sets = TxnSets::default();
        sets.writes.insert(b("k"), Write::Set(Bytes::from(vec![0u8; 1000])));
        let limit = 1000 + 1 + OP_OVERHEAD_BYTES;
        assert!(plan(&sets, b"", PlanLimits { max_txn_ops: 128, max_request_bytes: limit }).is_ok());
        let e = plan(&sets, b"", PlanLimits { max_txn_ops: 128, max_request_bytes: limit - 1 }).unwrap_err();
        assert_eq!(e, KvError::TransactionTooLarge { size: limit, limit: limit - 1 });
    }
}
