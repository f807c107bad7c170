//! Queue semantics over a partition's log (Kafka KIP-932 share groups, SQS):
//! the delivery state of the records of one queue on one partition. Pure
//! state machine; the partition's writer holds it, feeds it the records it
//! reads from the log, and persists every change (see `partition.rs`) before
//! answering.
//!
//! Offsets below `scan` have been examined; those of them not in `entries`
//! are done (acknowledged, archived, moved or expired). Offsets from `scan`
//! on are fresh: available, never delivered.
//!
//! | state | on | becomes |
//! |---|---|---|
//! | fresh / `Available` (visible, group not blocked) | receive | `Acquired { until = now + visibility }`, delivery count + 1, a new receipt nonce |
//! | `Available` with `visible_at_ms > now` (delayed) | receive | skipped (does not block its group) |
//! | `Available`, count ≥ `max_deliveries` | receive | `Moving` (to the dead-letter topic) — or removed (archived) without one |
//! | `Available` older than the retention | receive | removed (expired) |
//! | `Acquired`, `until <= now` | any call | `Available` (visible again, count kept) |
//! | `Acquired` | ack with the latest nonce | removed (done) |
//! | any | ack with an older nonce | unchanged; the ack succeeds (as SQS) |
//! | `Acquired` | release (nack) with delay d | `Available { visible_at = now + d }` |
//! | `Acquired` | change visibility t | `Acquired { until = now + t }` (t = 0: available now) |
//! | `Moving` | moved / move failed | removed / `Available` |
//! | everything | purge | removed; `scan` = high watermark |
//!
//! FIFO queues: a message group with a message `Acquired` or `Moving` is
//! blocked: no other message of it is delivered until that one is done or
//! visible again. One receive may return several consecutive messages of
//! one group. Standard queues deliver in offset order without that rule.
//!
//! Bounds: at most `max_in_flight` messages acquired at once (further
//! receives return fewer) and at most `max_tracked` entries (scanning stops;
//! the rest stays fresh).

use crate::error::MqError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRules {
    /// Deliveries after which a message is moved or archived (None: unlimited).
    pub max_deliveries: Option<u32>,
    /// Whether a dead-letter topic takes messages past `max_deliveries`.
    pub dead_letter: bool,
    pub fifo: bool,
    /// Messages older than this are not delivered (None: kept).
    pub retention_ms: Option<u64>,
    pub max_in_flight: usize,
    pub max_tracked: usize,
}

impl Default for QueueRules {
    fn default() -> Self {
        QueueRules {
            max_deliveries: None,
            dead_letter: false,
            fifo: false,
            retention_ms: None,
            max_in_flight: 120_000,
            max_tracked: 200_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Slot {
    Available { visible_at_ms: u64 },
    Acquired { until_ms: u64 },
    Moving,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub slot: Slot,
    /// Deliveries so far.
    pub count: u32,
    /// Nonce of the latest delivery's receipt (0: never delivered).
    pub nonce: u64,
    /// Message group (FIFO).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Record timestamp (ms).
    pub ts_ms: i64,
    /// First delivery time (ms; 0: never).
    #[serde(default)]
    pub first_receive_ms: u64,
}

/// What the caller knows of a fresh record (read from the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordInfo {
    pub offset: u64,
    pub ts_ms: i64,
    /// Not deliverable before this time (timestamp + delay).
    pub visible_at_ms: u64,
    pub group: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    pub scan: u64,
    pub entries: BTreeMap<u64, Entry>,
    pub next_nonce: u64,
    /// Last purge (ms), for SQS's one purge per 60 s.
    #[serde(default)]
    pub purged_ms: u64,
}

/// One delivered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub offset: u64,
    pub count: u32,
    pub nonce: u64,
    pub first_receive_ms: u64,
    pub ts_ms: i64,
}

/// The result of a receive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Received {
    pub delivered: Vec<Delivery>,
    /// Offsets now `Moving`: the caller copies them to the dead-letter topic.
    pub to_dead_letter: Vec<u64>,
    /// How many of the fresh records were consumed (examined).
    pub fresh_used: usize,
}

/// What an ack did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckResult {
    Deleted,
    /// Already done, or an older receipt: nothing changed.
    Ignored,
}

/// Counts for queue attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueCounts {
    pub visible: u64,
    pub in_flight: u64,
    pub delayed: u64,
}

/// Changed offsets (`None`: removed), what a persisted delta holds.
pub type Changes = BTreeMap<u64, Option<Entry>>;

impl QueueState {
    /// The first offset not done.
    pub fn start(&self) -> u64 {
        self.entries.keys().next().copied().unwrap_or(self.scan)
    }

    fn note(&self, changes: &mut Changes, offset: u64) {
        changes.insert(offset, self.entries.get(&offset).cloned());
    }

    /// Makes acquired messages whose visibility ended available again.
    pub fn expire(&mut self, now_ms: u64, changes: &mut Changes) {
        let due: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.slot, Slot::Acquired { until_ms } if until_ms <= now_ms))
            .map(|(o, _)| *o)
            .collect();
        for o in due {
            if let Some(e) = self.entries.get_mut(&o) {
                e.slot = Slot::Available { visible_at_ms: now_ms };
            }
            self.note(changes, o);
        }
    }

    fn in_flight(&self) -> usize {
        self.entries.values().filter(|e| matches!(e.slot, Slot::Acquired { .. } | Slot::Moving)).count()
    }

    /// Receives up to `max` messages; `fresh` are the records from `scan`
    /// on, in offset order (the caller read them from the log).
    pub fn receive(
        &mut self,
        now_ms: u64,
        max: usize,
        visibility_ms: u64,
        rules: &QueueRules,
        fresh: &[RecordInfo],
        changes: &mut Changes,
    ) -> Received {
        self.expire(now_ms, changes);
        let mut out = Received::default();
        let blocked: HashSet<String> = if rules.fifo {
            self.entries
                .values()
                .filter(|e| matches!(e.slot, Slot::Acquired { .. } | Slot::Moving))
                .filter_map(|e| e.group.clone())
                .collect()
        } else {
            HashSet::new()
        };
        let mut in_flight = self.in_flight();
        // Tracked entries first, in offset order.
        let tracked: Vec<u64> = self.entries.keys().copied().collect();
        for o in tracked {
            if out.delivered.len() >= max || in_flight >= rules.max_in_flight {
                break;
            }
            self.consider(o, now_ms, visibility_ms, rules, &blocked, &mut out, &mut in_flight, changes);
        }
        // Then fresh records.
        for r in fresh {
            if r.offset != self.scan
                || out.delivered.len() >= max
                || in_flight >= rules.max_in_flight
                || self.entries.len() >= rules.max_tracked
            {
                break;
            }
            self.scan = r.offset + 1;
            out.fresh_used += 1;
            self.entries.insert(
                r.offset,
                Entry {
                    slot: Slot::Available { visible_at_ms: r.visible_at_ms },
                    count: 0,
                    nonce: 0,
                    group: r.group.clone(),
                    ts_ms: r.ts_ms,
                    first_receive_ms: 0,
                },
            );
            self.note(changes, r.offset);
            self.consider(r.offset, now_ms, visibility_ms, rules, &blocked, &mut out, &mut in_flight, changes);
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn consider(
        &mut self,
        o: u64,
        now_ms: u64,
        visibility_ms: u64,
        rules: &QueueRules,
        blocked: &HashSet<String>,
        out: &mut Received,
        in_flight: &mut usize,
        changes: &mut Changes,
    ) {
        let Some(e) = self.entries.get(&o) else { return };
        let Slot::Available { visible_at_ms } = e.slot else { return };
        if visible_at_ms > now_ms {
            return;
        }
        if rules.fifo && e.group.as_ref().is_some_and(|g| blocked.contains(g)) {
            return;
        }
        if let Some(ret) = rules.retention_ms {
            if e.ts_ms >= 0 && (e.ts_ms as u64).saturating_add(ret) <= now_ms {
                self.entries.remove(&o);
                self.note(changes, o);
                return;
            }
        }
        if let Some(max) = rules.max_deliveries {
            if e.count >= max {
                if rules.dead_letter {
                    if let Some(e) = self.entries.get_mut(&o) {
                        e.slot = Slot::Moving;
                    }
                    out.to_dead_letter.push(o);
                    *in_flight += 1;
                } else {
                    self.entries.remove(&o);
                }
                self.note(changes, o);
                return;
            }
        }
        self.next_nonce += 1;
        let nonce = self.next_nonce;
        let Some(e) = self.entries.get_mut(&o) else { return };
        e.count += 1;
        e.nonce = nonce;
        e.slot = Slot::Acquired { until_ms: now_ms.saturating_add(visibility_ms) };
        if e.first_receive_ms == 0 {
            e.first_receive_ms = now_ms;
        }
        out.delivered.push(Delivery { offset: o, count: e.count, nonce, first_receive_ms: e.first_receive_ms, ts_ms: e.ts_ms });
        *in_flight += 1;
        self.note(changes, o);
    }

    /// Acknowledges (deletes) a delivered message.
    pub fn ack(&mut self, offset: u64, nonce: u64, changes: &mut Changes) -> Result<AckResult, MqError> {
        if offset >= self.scan {
            return Err(MqError::InvalidReceipt(format!("offset {offset} was never delivered")));
        }
        match self.entries.get(&offset) {
            None => Ok(AckResult::Ignored),
            Some(e) if e.nonce != nonce || e.count == 0 || e.slot == Slot::Moving => Ok(AckResult::Ignored),
            Some(_) => {
                self.entries.remove(&offset);
                self.note(changes, offset);
                Ok(AckResult::Deleted)
            }
        }
    }

    /// Changes the visibility of an acquired message (0: visible now; the
    /// native API's release/nack is this with an optional delay).
    pub fn change_visibility(
        &mut self,
        offset: u64,
        nonce: u64,
        timeout_ms: u64,
        now_ms: u64,
        changes: &mut Changes,
    ) -> Result<(), MqError> {
        self.expire(now_ms, changes);
        if offset >= self.scan {
            return Err(MqError::InvalidReceipt(format!("offset {offset} was never delivered")));
        }
        let Some(e) = self.entries.get_mut(&offset) else {
            return Err(MqError::NotInFlight(format!("message {offset} does not exist any more")));
        };
        if e.nonce != nonce {
            return Err(MqError::NotInFlight(format!("message {offset} was received again since this receipt")));
        }
        match e.slot {
            Slot::Acquired { .. } => {
                e.slot = if timeout_ms == 0 {
                    Slot::Available { visible_at_ms: now_ms }
                } else {
                    Slot::Acquired { until_ms: now_ms.saturating_add(timeout_ms) }
                };
                self.note(changes, offset);
                Ok(())
            }
            _ => Err(MqError::NotInFlight(format!("message {offset} is not in flight"))),
        }
    }

    /// Releases an acquired message (nack), visible again after `delay_ms`.
    pub fn release(&mut self, offset: u64, nonce: u64, delay_ms: u64, now_ms: u64, changes: &mut Changes) -> Result<(), MqError> {
        self.change_visibility(offset, nonce, 0, now_ms, changes)?;
        if let Some(e) = self.entries.get_mut(&offset) {
            e.slot = Slot::Available { visible_at_ms: now_ms.saturating_add(delay_ms) };
        }
        self.note(changes, offset);
        Ok(())
    }

    /// A dead-letter copy finished (`ok`) or failed.
    pub fn moved(&mut self, offset: u64, ok: bool, now_ms: u64, changes: &mut Changes) {
        if let Some(e) = self.entries.get_mut(&offset) {
            if e.slot == Slot::Moving {
                if ok {
                    self.entries.remove(&offset);
                } else {
                    e.slot = Slot::Available { visible_at_ms: now_ms };
                }
                self.note(changes, offset);
            }
        }
    }

    /// Removes every message below `hw`.
    pub fn purge(&mut self, hw: u64, now_ms: u64, changes: &mut Changes) {
        let all: Vec<u64> = self.entries.keys().copied().collect();
        for o in all {
            self.entries.remove(&o);
            self.note(changes, o);
        }
        self.scan = self.scan.max(hw);
        self.purged_ms = now_ms;
    }

    /// Offsets below `log_start` were deleted by retention.
    pub fn truncated(&mut self, log_start: u64, changes: &mut Changes) {
        let gone: Vec<u64> = self.entries.range(..log_start).map(|(o, _)| *o).collect();
        for o in gone {
            self.entries.remove(&o);
            self.note(changes, o);
        }
        self.scan = self.scan.max(log_start);
    }

    /// Applies a persisted delta.
    pub fn apply(&mut self, scan: u64, next_nonce: u64, purged_ms: u64, changes: &Changes) {
        for (o, e) in changes {
            match e {
                Some(e) => {
                    self.entries.insert(*o, e.clone());
                }
                None => {
                    self.entries.remove(o);
                }
            }
        }
        self.scan = self.scan.max(scan);
        self.next_nonce = self.next_nonce.max(next_nonce);
        self.purged_ms = self.purged_ms.max(purged_ms);
    }

    /// Counts for queue attributes; `hw` is the partition's high watermark.
    pub fn counts(&self, hw: u64, now_ms: u64) -> QueueCounts {
        let mut c = QueueCounts { visible: hw.saturating_sub(self.scan), ..QueueCounts::default() };
        for e in self.entries.values() {
            match e.slot {
                Slot::Available { visible_at_ms } if visible_at_ms > now_ms => c.delayed += 1,
                Slot::Available { .. } => c.visible += 1,
                Slot::Acquired { until_ms } if until_ms <= now_ms => c.visible += 1,
                Slot::Acquired { .. } | Slot::Moving => c.in_flight += 1,
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recs(from: u64, n: u64, group: Option<&str>) -> Vec<RecordInfo> {
        (from..from + n).map(|o| RecordInfo { offset: o, ts_ms: 0, visible_at_ms: 0, group: group.map(str::to_string) }).collect()
    }

    #[test]
    fn visibility_ack_nack_and_redelivery() {
        let rules = QueueRules::default();
        let mut q = QueueState::default();
        let mut ch = Changes::new();
        let r = q.receive(100, 2, 30, &rules, &recs(0, 5, None), &mut ch);
        assert_eq!(r.delivered.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(r.fresh_used, 2);
        assert_eq!(q.scan, 2);
        // In flight: the next receive takes 2, 3.
        let r2 = q.receive(110, 2, 30, &rules, &recs(2, 3, None), &mut ch);
        assert_eq!(r2.delivered.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(q.ack(0, r.delivered[0].nonce, &mut ch).unwrap(), AckResult::Deleted);
        assert_eq!(q.ack(0, r.delivered[0].nonce, &mut ch).unwrap(), AckResult::Ignored);
        assert!(q.ack(9, 1, &mut ch).is_err());
        // Nack 2: visible again at once, count kept and incremented on redelivery.
        q.release(2, r2.delivered[0].nonce, 0, 111, &mut ch).unwrap();
        // Offset 1's visibility ends at 130.
        let r3 = q.receive(131, 10, 30, &rules, &recs(4, 1, None), &mut ch);
        assert_eq!(r3.delivered.iter().map(|d| (d.offset, d.count)).collect::<Vec<_>>(), vec![(1, 2), (2, 2), (4, 1)]);
        // The old receipt of 1 no longer deletes it.
        assert_eq!(q.ack(1, r.delivered[1].nonce, &mut ch).unwrap(), AckResult::Ignored);
        assert!(q.entries.contains_key(&1));
        assert!(matches!(q.change_visibility(1, r.delivered[1].nonce, 5, 132, &mut ch), Err(MqError::NotInFlight(_))));
        q.change_visibility(1, r3.delivered[0].nonce, 0, 132, &mut ch).unwrap();
        assert_eq!(q.counts(5, 132), QueueCounts { visible: 1, in_flight: 3, delayed: 0 });
        assert_eq!(q.start(), 1);
    }

    #[test]
    fn dead_letter_after_max_deliveries_and_delay() {
        let rules = QueueRules { max_deliveries: Some(2), dead_letter: true, ..QueueRules::default() };
        let mut q = QueueState::default();
        let mut ch = Changes::new();
        let fresh = vec![
            RecordInfo { offset: 0, ts_ms: 0, visible_at_ms: 0, group: None },
            RecordInfo { offset: 1, ts_ms: 0, visible_at_ms: 500, group: None },
        ];
        let r = q.receive(10, 10, 5, &rules, &fresh, &mut ch);
        assert_eq!(r.delivered.len(), 1, "the delayed record waits");
        q.receive(20, 10, 5, &rules, &[], &mut ch);
        let r = q.receive(30, 10, 5, &rules, &[], &mut ch);
        assert!(r.delivered.is_empty());
        assert_eq!(r.to_dead_letter, vec![0]);
        q.moved(0, true, 31, &mut ch);
        assert!(!q.entries.contains_key(&0));
        let r = q.receive(600, 10, 5, &rules, &[], &mut ch);
        assert_eq!(r.delivered.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![1]);
        // Without a dead-letter topic the message is archived.
        let rules = QueueRules { max_deliveries: Some(1), ..QueueRules::default() };
        let mut q = QueueState::default();
        q.receive(0, 1, 1, &rules, &recs(0, 1, None), &mut ch);
        let r = q.receive(5, 1, 1, &rules, &[], &mut ch);
        assert!(r.delivered.is_empty() && r.to_dead_letter.is_empty());
        assert!(q.entries.is_empty());
    }

    #[test]
    fn fifo_groups_block_while_in_flight() {
        let rules = QueueRules { fifo: true, ..QueueRules::default() };
        let mut q = QueueState::default();
        let mut ch = Changes::new();
        let mut fresh = recs(0, 3, Some("a"));
        fresh.extend(recs(3, 2, Some("b")));
        // One receive may take consecutive messages of one group.
        let r = q.receive(0, 2, 10, &rules, &fresh, &mut ch);
        assert_eq!(r.delivered.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![0, 1]);
        // Group a is blocked: only b's messages come next.
        let r2 = q.receive(1, 10, 10, &rules, &fresh[2..], &mut ch);
        assert_eq!(r2.delivered.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![3, 4]);
        q.ack(0, r.delivered[0].nonce, &mut ch).unwrap();
        assert!(q.receive(2, 10, 10, &rules, &[], &mut ch).delivered.is_empty(), "1 is still in flight");
        q.ack(1, r.delivered[1].nonce, &mut ch).unwrap();
        let r3 = q.receive(3, 10, 10, &rules, &[], &mut ch);
        assert_eq!(r3.delivered.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn deltas_replay_to_the_same_state() {
        let rules = QueueRules::default();
        let mut q = QueueState::default();
        let mut replayed = QueueState::default();
        for step in 0..50u64 {
            let mut ch = Changes::new();
            let r = q.receive(step * 10, 3, 15, &rules, &recs(q.scan, 4, None), &mut ch);
            if let Some(d) = r.delivered.first() {
                q.ack(d.offset, d.nonce, &mut ch).unwrap();
            }
            if step % 7 == 0 {
                q.purge(q.scan + 1, step, &mut ch);
            }
            replayed.apply(q.scan, q.next_nonce, q.purged_ms, &ch);
            assert_eq!(replayed, q, "step {step}");
        }
    }
}
