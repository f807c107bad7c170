//! The partition state file and the lease rules. Pure: the caller passes
//! the time.
//!
//! Each partition directory holds one small file `state` (inline JSON,
//! replaced atomically with compare-and-swap on the inode version through
//! meta's `CreateWritePublish`). It is the partition's single source of
//! truth: who writes it (writer id, fencing epoch, lease expiry), where the
//! log starts and ends (`log_start`, `hw` = the high watermark = the next
//! offset), and which segment file is active with how many of its bytes are
//! committed. Every append is acknowledged only after the CAS that moves
//! `hw` past it succeeded, so:
//!
//! | rule | consequence |
//! |---|---|
//! | readers read `state` and never past `seg_bytes` of the active segment | a record is visible only when the state says it is durable; a torn or unacknowledged tail is never read |
//! | every writer change of `state` is a CAS on the version it last wrote | a writer that lost the partition fails its next CAS and acknowledges nothing more (fenced) |
//! | a new owner bumps `epoch` and starts a new segment file at `hw` | bytes a fenced writer appends after the takeover land in a segment nobody reads past its committed end |
//! | segment names are `<base offset>-<epoch>.log` (20 + 10 digits) | a segment is valid for offsets `[base, next valid segment's base)`; for one base the highest epoch wins |
//!
//! Lease rules ([`decide_acquire`]):
//!
//! | lease in the state file | requester | decision |
//! |---|---|---|
//! | none, or expired (`lease_until_ms <= now`) | any writer | take over (epoch + 1) |
//! | held by the same writer id (a restart of this gateway) | same id | take over at once (epoch + 1 fences the dead incarnation) |
//! | held by another writer and valid | another id | refuse: `NotPartitionWriter` naming the owner's endpoint |
//! | held by another writer and valid | another id with `force` (admin takeover) | take over (epoch + 1): the other writer is fenced |

use serde::{Deserialize, Serialize};

/// Name of the state file in a partition directory.
pub const STATE_FILE: &str = "state";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Format version (1).
    pub v: u32,
    /// Fencing epoch: bumped by every change of owner.
    pub epoch: u64,
    /// Writer id of the owner ("" = none).
    pub writer: String,
    /// Where the owner serves (named in `NotPartitionWriter`).
    pub endpoint: String,
    /// The lease ends at this wall-clock time (ms since the epoch); 0 = released.
    pub lease_until_ms: u64,
    /// First offset still in the log (retention moved it).
    pub log_start: u64,
    /// High watermark: the offset the next record gets; every offset below is durable.
    pub hw: u64,
    /// The active segment's file name ("" before the first owner).
    pub seg: String,
    /// Its base offset.
    pub seg_base: u64,
    /// Its committed bytes.
    pub seg_bytes: u64,
    /// Largest record timestamp in the active segment (-1 = none).
    pub seg_max_ts: i64,
    /// When the active segment was made (ms), for rolling by age.
    pub seg_created_ms: u64,
    /// Offset of the newest producer-state snapshot file (`producers-<offset>.snap`), if any.
    #[serde(default)]
    pub snap: Option<u64>,
}

impl PartitionState {
    pub fn new() -> PartitionState {
        PartitionState {
            v: 1,
            epoch: 0,
            writer: String::new(),
            endpoint: String::new(),
            lease_until_ms: 0,
            log_start: 0,
            hw: 0,
            seg: String::new(),
            seg_base: 0,
            seg_bytes: 0,
            seg_max_ts: -1,
            seg_created_ms: 0,
            snap: None,
        }
    }
}

impl Default for PartitionState {
    fn default() -> Self {
        PartitionState::new()
    }
}

/// What a writer may do with a partition it wants to own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Take it over with this epoch.
    Take { epoch: u64 },
    /// Someone else holds a valid lease.
    Refuse { owner: String, remaining_ms: u64 },
}

/// The lease rules (see the module table). `min_epoch` lets the caller skip
/// epochs whose segment files already exist (left by an owner that crashed
/// before its CAS).
pub fn decide_acquire(state: &PartitionState, me: &str, now_ms: u64, force: bool, min_epoch: u64) -> Acquire {
    let held_by_other = !state.writer.is_empty() && state.writer != me && state.lease_until_ms > now_ms;
    if held_by_other && !force {
        let owner = if state.endpoint.is_empty() { state.writer.clone() } else { state.endpoint.clone() };
        return Acquire::Refuse { owner, remaining_ms: state.lease_until_ms - now_ms };
    }
    Acquire::Take { epoch: (state.epoch + 1).max(min_epoch) }
}

/// Segment file name of `base` written in `epoch`.
pub fn segment_name(base: u64, epoch: u64) -> String {
    format!("{base:020}-{epoch:010}.log")
}

/// Index file name of a segment.
pub fn index_name(base: u64, epoch: u64) -> String {
    format!("{base:020}-{epoch:010}.idx")
}

/// Parses `<base>-<epoch>.<ext>`.
pub fn parse_segment_name(name: &str, ext: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(ext)?.strip_suffix('.')?;
    let (b, e) = stem.split_once('-')?;
    // Digits only: `u64::from_str` also takes a leading `+`, which would give
    // one segment a second file name.
    let digits = |x: &str, n: usize| x.len() == n && x.bytes().all(|c| c.is_ascii_digit());
    if !digits(b, 20) || !digits(e, 10) {
        return None;
    }
    Some((b.parse().ok()?, e.parse().ok()?))
}

/// A segment as listed: base offset, epoch, file name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRef {
    pub base: u64,
    pub epoch: u64,
    pub name: String,
}

/// The valid segments among listed names, in offset order: for one base the
/// highest epoch not above `max_epoch` wins (see the module table); names of
/// later epochs (an owner mid-takeover) are ignored.
pub fn valid_segments(names: impl IntoIterator<Item = String>, max_epoch: u64) -> Vec<SegmentRef> {
    let mut all: Vec<SegmentRef> = names
        .into_iter()
        .filter_map(|n| parse_segment_name(&n, "log").map(|(base, epoch)| SegmentRef { base, epoch, name: n }))
        .filter(|s| s.epoch <= max_epoch)
        .collect();
    all.sort_by_key(|s| (s.base, s.epoch));
    let mut out: Vec<SegmentRef> = Vec::with_capacity(all.len());
    for s in all {
        match out.last_mut() {
            Some(last) if last.base == s.base => *last = s,
            _ => out.push(s),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(writer: &str, until: u64, epoch: u64) -> PartitionState {
        PartitionState {
            writer: writer.into(),
            endpoint: format!("http://{writer}"),
            lease_until_ms: until,
            epoch,
            ..PartitionState::new()
        }
    }

    #[test]
    fn lease_table() {
        assert_eq!(decide_acquire(&PartitionState::new(), "a", 10, false, 0), Acquire::Take { epoch: 1 });
        assert_eq!(decide_acquire(&held("b", 5, 3), "a", 10, false, 0), Acquire::Take { epoch: 4 });
        assert_eq!(decide_acquire(&held("a", 50, 3), "a", 10, false, 0), Acquire::Take { epoch: 4 });
        assert_eq!(decide_acquire(&held("b", 50, 3), "a", 10, false, 0), Acquire::Refuse { owner: "http://b".into(), remaining_ms: 40 });
        assert_eq!(decide_acquire(&held("b", 50, 3), "a", 10, true, 0), Acquire::Take { epoch: 4 });
        assert_eq!(decide_acquire(&held("b", 5, 3), "a", 10, false, 9), Acquire::Take { epoch: 9 });
    }

    #[test]
    fn segment_names_and_shadowing() {
        assert_eq!(segment_name(5, 2), "00000000000000000005-0000000002.log");
        assert_eq!(parse_segment_name(&segment_name(5, 2), "log"), Some((5, 2)));
        assert_eq!(parse_segment_name("00000000000000000005-0000000002.idx", "log"), None);
        assert_eq!(parse_segment_name("junk.log", "log"), None);
        // A sign is not a digit: no second name for segment 5 (u64::from_str takes `+5`).
        assert_eq!(parse_segment_name("+0000000000000000005-0000000002.log", "log"), None);
        assert_eq!(parse_segment_name("00000000000000000005-+000000002.log", "log"), None);
        let names =
            vec![segment_name(0, 1), segment_name(10, 1), segment_name(10, 2), segment_name(20, 2), segment_name(20, 5), index_name(0, 1)];
        let v = valid_segments(names, 3);
        assert_eq!(v.iter().map(|s| (s.base, s.epoch)).collect::<Vec<_>>(), vec![(0, 1), (10, 2), (20, 2)]);
    }
}
