//! The RDMA state machines, without I/O or clock (time is an argument):
//! the pool of buffers registered once at start, and the work requests in
//! flight per queue pair.
//!
//! Work requests (one per `read_remote` / `write_remote`):
//!
//! | event | state | result |
//! |---|---|---|
//! | admit, QP ready, length ≤ local slot and = remote length, queue not full | — | posted (a `wr_id`, a deadline) |
//! | admit, QP not ready (connecting, or failed) | — | refused: `ConnectionFailed` (reconnect) |
//! | admit, `max_outstanding_per_qp` reached | — | refused: `Overloaded` (retry later) |
//! | admit, zero length or length mismatch | — | refused: `InvalidArgument` |
//! | completion success, known `wr_id` | posted | done: Ok |
//! | completion error (remote access, length, protection) | posted | done: that error; the QP goes to error (an RC QP does after any failed WR), every other WR on it is flushed |
//! | completion "flushed" | posted | done: `ConnectionFailed` |
//! | completion, unknown `wr_id` (after a timeout) | — | ignored (counted) |
//! | deadline passed | posted | done: `DeadlineExceeded`; the QP goes to error: a completion that never came means the QP cannot be trusted |
//!
//! Buffer pool: `slots` buffers of `slot_bytes`, one memory registration for
//! all of them, taken lowest free first and given back on drop; a request
//! larger than a slot or a pool with no free slot is refused (no
//! registration on the I/O path, as 3FS does).

use std::collections::{BTreeMap, BTreeSet};

/// A queue pair, named by the memory layer.
pub type QpId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Pull remote memory into a local slot (the successor pulling a
    /// predecessor's payload; 3FS's write path).
    Read,
    /// Push a local slot into remote memory (a target serving a read into
    /// client memory).
    Write,
}

/// Status of a work completion (the subset of `ibv_wc_status` we act on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// The remote key, address or length was refused by the remote side.
    RemoteAccess,
    /// The local buffer was refused (bad lkey, length).
    LocalProtection,
    /// Retries exhausted, transport error: the peer is unreachable.
    Transport,
    /// Flushed because the QP went to the error state.
    Flushed,
    Other(u32),
}

/// Why a work request ended without success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WrError {
    /// The QP is not usable: reconnect (retryable).
    QpDown(String),
    /// Too many requests in flight on the QP (retryable after a while).
    QueueFull { limit: usize },
    /// Bad request (not retryable): lengths, keys.
    Invalid(String),
    /// No completion before the deadline.
    TimedOut { after_ms: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    Ready,
    Failed,
}

#[derive(Clone, Debug)]
struct Pending {
    qp: QpId,
    op: OpKind,
    bytes: u32,
    posted_ms: u64,
    deadline_ms: u64,
}

/// The work requests in flight, per queue pair.
#[derive(Debug)]
pub struct WorkEngine {
    max_outstanding_per_qp: usize,
    timeout_ms: u64,
    next_wr_id: u64,
    qps: BTreeMap<QpId, (QpState, usize)>,
    pending: BTreeMap<u64, Pending>,
    /// Completions that matched no request (late, after a timeout).
    pub stray_completions: u64,
    /// QPs that went to the error state since [`WorkEngine::take_failed`].
    newly_failed: Vec<QpId>,
}

impl WorkEngine {
    pub fn new(max_outstanding_per_qp: usize, timeout_ms: u64) -> Self {
        WorkEngine {
            max_outstanding_per_qp: max_outstanding_per_qp.max(1),
            timeout_ms: timeout_ms.max(1),
            next_wr_id: 1,
            qps: BTreeMap::new(),
            pending: BTreeMap::new(),
            stray_completions: 0,
            newly_failed: Vec::new(),
        }
    }

    /// A connected QP (after the handshake moved it to ready-to-send).
    pub fn qp_ready(&mut self, qp: QpId) {
        self.qps.insert(qp, (QpState::Ready, 0));
    }

    /// The QP is gone (connection closed): its requests end `QpDown`.
    pub fn qp_closed(&mut self, qp: QpId) -> Vec<(u64, Result<(), WrError>)> {
        let done = self.fail_qp(qp, "connection closed");
        self.qps.remove(&qp);
        done
    }

    pub fn outstanding(&self, qp: QpId) -> usize {
        self.qps.get(&qp).map_or(0, |(_, n)| *n)
    }

    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Admits a request of `bytes` into a local slot of `local_bytes`
    /// against a remote buffer of `remote_bytes`; returns its `wr_id`.
    pub fn admit(&mut self, qp: QpId, op: OpKind, bytes: u32, local_bytes: usize, remote_bytes: u32, now_ms: u64) -> Result<u64, WrError> {
        if bytes == 0 {
            return Err(WrError::Invalid("zero-length transfer".into()));
        }
        if bytes != remote_bytes {
            return Err(WrError::Invalid(format!("transfer of {bytes} bytes against a remote buffer of {remote_bytes}")));
        }
        if bytes as usize > local_bytes {
            return Err(WrError::Invalid(format!("transfer of {bytes} bytes into a local buffer of {local_bytes}")));
        }
        let limit = self.max_outstanding_per_qp;
        match self.qps.get_mut(&qp) {
            None => return Err(WrError::QpDown(format!("no queue pair {qp}"))),
            Some((QpState::Failed, _)) => return Err(WrError::QpDown(format!("queue pair {qp} is in the error state"))),
            Some((QpState::Ready, n)) if *n >= limit => return Err(WrError::QueueFull { limit }),
            Some((QpState::Ready, n)) => *n += 1,
        }
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        self.pending.insert(wr_id, Pending { qp, op, bytes, posted_ms: now_ms, deadline_ms: now_ms.saturating_add(self.timeout_ms) });
        Ok(wr_id)
    }

    /// The device refused to post `wr_id` (e.g. its queue was full): forget it.
    pub fn cancel(&mut self, wr_id: u64) {
        if let Some(p) = self.pending.remove(&wr_id) {
            self.dec(p.qp);
        }
    }

    fn dec(&mut self, qp: QpId) {
        if let Some((_, n)) = self.qps.get_mut(&qp) {
            *n = n.saturating_sub(1);
        }
    }

    /// The QPs that went to the error state since the last call: their
    /// connections must be closed (a new connection makes a new QP).
    pub fn take_failed(&mut self) -> Vec<QpId> {
        std::mem::take(&mut self.newly_failed)
    }

    fn fail_qp(&mut self, qp: QpId, why: &str) -> Vec<(u64, Result<(), WrError>)> {
        if let Some((state, _)) = self.qps.get_mut(&qp) {
            if *state == QpState::Ready {
                self.newly_failed.push(qp);
            }
            *state = QpState::Failed;
        }
        let doomed: Vec<u64> = self.pending.iter().filter(|(_, p)| p.qp == qp).map(|(id, _)| *id).collect();
        let mut out = Vec::with_capacity(doomed.len());
        for id in doomed {
            self.pending.remove(&id);
            self.dec(qp);
            out.push((id, Err(WrError::QpDown(format!("queue pair {qp}: {why}")))));
        }
        out
    }

    /// A work completion; returns every request it ends (itself, and the
    /// others of its QP when it moved the QP to the error state).
    pub fn complete(&mut self, wr_id: u64, status: WcStatus, byte_len: u32) -> Vec<(u64, Result<(), WrError>)> {
        let Some(p) = self.pending.remove(&wr_id) else {
            self.stray_completions += 1;
            return Vec::new();
        };
        self.dec(p.qp);
        let own = match status {
            WcStatus::Success if p.op == OpKind::Read && byte_len != p.bytes => {
                Err(WrError::Invalid(format!("read completed with {byte_len} of {} bytes", p.bytes)))
            }
            WcStatus::Success => return vec![(wr_id, Ok(()))],
            WcStatus::RemoteAccess => Err(WrError::Invalid("the remote side refused the key, address or length".into())),
            WcStatus::LocalProtection => Err(WrError::Invalid("the local buffer was refused".into())),
            WcStatus::Transport => Err(WrError::QpDown("transport retries exhausted".into())),
            WcStatus::Flushed => Err(WrError::QpDown("flushed".into())),
            WcStatus::Other(code) => Err(WrError::QpDown(format!("work completion status {code}"))),
        };
        let mut out = vec![(wr_id, own)];
        if status != WcStatus::Success {
            out.extend(self.fail_qp(p.qp, "a work request failed"));
        }
        out
    }

    /// Requests past their deadline end `TimedOut`; their QPs go to error.
    pub fn expire(&mut self, now_ms: u64) -> Vec<(u64, Result<(), WrError>)> {
        let late: Vec<(u64, QpId, u64)> =
            self.pending.iter().filter(|(_, p)| p.deadline_ms <= now_ms).map(|(id, p)| (*id, p.qp, p.posted_ms)).collect();
        let mut out = Vec::new();
        for (id, qp, posted) in late {
            if self.pending.remove(&id).is_some() {
                self.dec(qp);
                out.push((id, Err(WrError::TimedOut { after_ms: now_ms.saturating_sub(posted) })));
                out.extend(self.fail_qp(qp, "a work request timed out"));
            }
        }
        out
    }
}

/// Slot accounting of the registered buffer pool.
#[derive(Debug)]
pub struct SlotPool {
    slot_bytes: usize,
    free: BTreeSet<usize>,
    slots: usize,
}

impl SlotPool {
    pub fn new(slots: usize, slot_bytes: usize) -> Self {
        SlotPool { slot_bytes, free: (0..slots).collect(), slots }
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// A free slot for `len` bytes (lowest first).
    pub fn take(&mut self, len: usize) -> Result<usize, WrError> {
        if len == 0 || len > self.slot_bytes {
            return Err(WrError::Invalid(format!("{len} bytes do not fit a registered slot of {} bytes", self.slot_bytes)));
        }
        let slot = *self.free.iter().next().ok_or(WrError::QueueFull { limit: self.slots })?;
        self.free.remove(&slot);
        Ok(slot)
    }

    pub fn give(&mut self, slot: usize) {
        debug_assert!(slot < self.slots && !self.free.contains(&slot), "slot {slot} given back twice");
        if slot < self.slots {
            self.free.insert(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_checks_lengths_state_and_queue_depth() {
        let mut e = WorkEngine::new(2, 1_000);
        assert!(matches!(e.admit(1, OpKind::Read, 10, 10, 10, 0), Err(WrError::QpDown(_))), "unknown QP");
        e.qp_ready(1);
        assert!(matches!(e.admit(1, OpKind::Read, 0, 10, 0, 0), Err(WrError::Invalid(_))));
        assert!(matches!(e.admit(1, OpKind::Read, 10, 10, 11, 0), Err(WrError::Invalid(_))));
        assert!(matches!(e.admit(1, OpKind::Read, 11, 10, 11, 0), Err(WrError::Invalid(_))));
        let a = e.admit(1, OpKind::Read, 10, 10, 10, 0).unwrap();
        let b = e.admit(1, OpKind::Write, 10, 10, 10, 0).unwrap();
        assert_ne!(a, b);
        assert_eq!(e.admit(1, OpKind::Read, 10, 10, 10, 0), Err(WrError::QueueFull { limit: 2 }));
        assert_eq!(e.complete(a, WcStatus::Success, 10), vec![(a, Ok(()))]);
        assert_eq!(e.outstanding(1), 1);
        assert!(e.admit(1, OpKind::Read, 10, 10, 10, 0).is_ok(), "a slot in the queue was freed");
    }

    #[test]
    fn a_failed_completion_flushes_the_qp_and_later_completions_are_strays() {
        let mut e = WorkEngine::new(8, 1_000);
        e.qp_ready(1);
        e.qp_ready(2);
        let a = e.admit(1, OpKind::Read, 4, 4, 4, 0).unwrap();
        let b = e.admit(1, OpKind::Read, 4, 4, 4, 0).unwrap();
        let c = e.admit(2, OpKind::Read, 4, 4, 4, 0).unwrap();
        let done = e.complete(a, WcStatus::RemoteAccess, 0);
        assert_eq!(done.len(), 2);
        assert!(matches!(done[0], (id, Err(WrError::Invalid(_))) if id == a));
        assert!(matches!(done[1], (id, Err(WrError::QpDown(_))) if id == b));
        assert!(matches!(e.admit(1, OpKind::Read, 4, 4, 4, 0), Err(WrError::QpDown(_))), "QP 1 is in error");
        assert_eq!(e.take_failed(), vec![1]);
        assert_eq!(e.take_failed(), Vec::<QpId>::new());
        assert_eq!(e.complete(b, WcStatus::Flushed, 0), vec![], "b already ended");
        assert_eq!(e.stray_completions, 1);
        assert_eq!(e.complete(c, WcStatus::Success, 4), vec![(c, Ok(()))], "QP 2 unaffected");
        // A reconnect makes QP 1 usable again.
        e.qp_ready(1);
        assert!(e.admit(1, OpKind::Read, 4, 4, 4, 0).is_ok());
    }

    #[test]
    fn a_short_read_is_an_error() {
        let mut e = WorkEngine::new(8, 1_000);
        e.qp_ready(1);
        let a = e.admit(1, OpKind::Read, 8, 8, 8, 0).unwrap();
        assert!(matches!(e.complete(a, WcStatus::Success, 4)[0], (_, Err(WrError::Invalid(_)))));
    }

    #[test]
    fn deadlines_expire_requests_and_fail_their_qp() {
        let mut e = WorkEngine::new(8, 100);
        e.qp_ready(1);
        let a = e.admit(1, OpKind::Write, 4, 4, 4, 0).unwrap();
        let b = e.admit(1, OpKind::Write, 4, 4, 4, 50).unwrap();
        assert!(e.expire(99).is_empty());
        let done = e.expire(100);
        assert_eq!(done[0], (a, Err(WrError::TimedOut { after_ms: 100 })));
        assert!(matches!(done[1], (id, Err(WrError::QpDown(_))) if id == b));
        assert_eq!(e.in_flight(), 0);
        assert_eq!(e.complete(a, WcStatus::Success, 4), vec![], "a late completion is a stray");
    }

    #[test]
    fn closing_a_qp_ends_its_requests() {
        let mut e = WorkEngine::new(8, 100);
        e.qp_ready(7);
        let a = e.admit(7, OpKind::Read, 1, 1, 1, 0).unwrap();
        assert!(matches!(e.qp_closed(7)[0], (id, Err(WrError::QpDown(_))) if id == a));
        assert!(matches!(e.admit(7, OpKind::Read, 1, 1, 1, 0), Err(WrError::QpDown(_))));
    }

    #[test]
    fn slots_are_taken_lowest_first_and_bounded() {
        let mut p = SlotPool::new(2, 4096);
        assert!(matches!(p.take(4097), Err(WrError::Invalid(_))));
        assert!(matches!(p.take(0), Err(WrError::Invalid(_))));
        assert_eq!(p.take(10).unwrap(), 0);
        assert_eq!(p.take(4096).unwrap(), 1);
        assert_eq!(p.take(1), Err(WrError::QueueFull { limit: 2 }));
        p.give(0);
        assert_eq!(p.take(1).unwrap(), 0);
        assert_eq!(p.free(), 0);
    }
}
