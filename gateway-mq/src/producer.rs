//! Producer-side state of a partition, kept by its writer: the idempotent
//! producer table (Kafka's rules) and the deduplication window of FIFO
//! topics. Pure; rebuilt after a takeover from the newest snapshot file and
//! the batches appended after it (batch headers carry producer id, epoch
//! and sequence; records carry their dedup id).
//!
//! Idempotent produce, per (partition, producer id):
//!
//! | incoming batch (epoch e, first sequence s, n records) | state | result |
//! |---|---|---|
//! | producer unknown | s = 0 | append; remember |
//! | producer unknown | s ≠ 0 | `UnknownProducerId` (state expired: re-init the producer) |
//! | e < current epoch | — | `ProducerFenced` |
//! | e > current epoch | s = 0 | append (new epoch) |
//! | e > current epoch | s ≠ 0 | `OutOfOrderSequence` |
//! | same epoch, (s, s+n-1) equals one of the last 5 batches | — | duplicate: the original offsets, nothing written |
//! | same epoch, s = last sequence + 1 | — | append |
//! | same epoch, otherwise | — | `OutOfOrderSequence` |
//!
//! Sequences wrap from `i32::MAX` to 0. A producer idle longer than
//! `producer_expiry_ms` is forgotten; at most `max_producers` are kept (the
//! least recently used is forgotten first).
//!
//! Deduplication (FIFO topics): a record whose dedup key (its dedup id, or
//! message group + dedup id with `messageGroup` scope) was appended within
//! `dedup_window_ms` is not appended again; the original offset is returned.
//! The window survives the deletion of the message (it is about sends).

use crate::error::MqError;
use crate::record::{seq_add, ProducerFields};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Batches remembered per producer for duplicate detection (Kafka's 5).
pub const RECENT_BATCHES: usize = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRef {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: u64,
    pub count: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerEntry {
    pub epoch: i16,
    pub recent: VecDeque<BatchRef>,
    pub last_ms: u64,
}

/// What to do with an idempotent batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqCheck {
    Append,
    Duplicate { base_offset: u64 },
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerTable {
    pub producers: HashMap<i64, ProducerEntry>,
}

impl ProducerTable {
    /// Applies the table of the module docs to a batch of `count` records.
    pub fn check(&self, p: ProducerFields, count: u32) -> Result<SeqCheck, MqError> {
        let last = seq_add(p.base_sequence, count.saturating_sub(1));
        let Some(e) = self.producers.get(&p.id) else {
            return if p.base_sequence == 0 { Ok(SeqCheck::Append) } else { Err(MqError::UnknownProducerId(p.id)) };
        };
        if p.epoch < e.epoch {
            return Err(MqError::ProducerFenced { producer_id: p.id, epoch: p.epoch, current: e.epoch });
        }
        if p.epoch > e.epoch {
            return if p.base_sequence == 0 {
                Ok(SeqCheck::Append)
            } else {
                Err(MqError::OutOfOrderSequence { producer_id: p.id, got: p.base_sequence, last: -1 })
            };
        }
        if let Some(b) = e.recent.iter().find(|b| b.first_seq == p.base_sequence && b.last_seq == last) {
            return Ok(SeqCheck::Duplicate { base_offset: b.base_offset });
        }
        let prev = e.recent.back().map_or(-1, |b| b.last_seq);
        if p.base_sequence == seq_add(prev, 1) || (prev == -1 && p.base_sequence == 0) {
            Ok(SeqCheck::Append)
        } else {
            Err(MqError::OutOfOrderSequence { producer_id: p.id, got: p.base_sequence, last: prev })
        }
    }

    /// Records an appended batch.
    pub fn record(&mut self, p: ProducerFields, count: u32, base_offset: u64, now_ms: u64) {
        let e = self.producers.entry(p.id).or_insert_with(|| ProducerEntry { epoch: p.epoch, recent: VecDeque::new(), last_ms: now_ms });
        if p.epoch != e.epoch {
            e.epoch = p.epoch;
            e.recent.clear();
        }
        e.recent.push_back(BatchRef {
            first_seq: p.base_sequence,
            last_seq: seq_add(p.base_sequence, count.saturating_sub(1)),
            base_offset,
            count,
        });
        while e.recent.len() > RECENT_BATCHES {
            e.recent.pop_front();
        }
        e.last_ms = e.last_ms.max(now_ms);
    }

    /// Forgets producers idle since before `now - expiry_ms`, then the least
    /// recently used beyond `max_producers`.
    pub fn expire(&mut self, now_ms: u64, expiry_ms: u64, max_producers: usize) {
        self.producers.retain(|_, e| e.last_ms.saturating_add(expiry_ms) > now_ms);
        if self.producers.len() > max_producers {
            let mut by_age: Vec<(u64, i64)> = self.producers.iter().map(|(id, e)| (e.last_ms, *id)).collect();
            by_age.sort_unstable();
            for (_, id) in by_age.into_iter().take(self.producers.len() - max_producers) {
                self.producers.remove(&id);
            }
        }
    }
}

/// The deduplication window of a FIFO topic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupTable {
    /// Dedup key → (offset, time appended).
    pub keys: HashMap<String, (u64, u64)>,
    /// Appended time → keys, for expiry in time order.
    #[serde(skip)]
    by_time: BTreeMap<u64, Vec<String>>,
}

impl DedupTable {
    /// The key of a record: `dedup_id`, or `group \0 dedup_id` when scoped by group.
    pub fn key(dedup_id: &str, group: Option<&str>, by_group: bool) -> String {
        match (by_group, group) {
            (true, Some(g)) => format!("{g}\u{0}{dedup_id}"),
            _ => dedup_id.to_string(),
        }
    }

    /// The original offset of a key still inside the window.
    pub fn get(&self, key: &str, now_ms: u64, window_ms: u64) -> Option<u64> {
        self.keys.get(key).filter(|(_, at)| at.saturating_add(window_ms) > now_ms).map(|(o, _)| *o)
    }

    pub fn insert(&mut self, key: String, offset: u64, at_ms: u64) {
        if let Some((_, old)) = self.keys.insert(key.clone(), (offset, at_ms)) {
            if let Some(v) = self.by_time.get_mut(&old) {
                v.retain(|k| k != &key);
            }
        }
        self.by_time.entry(at_ms).or_default().push(key);
    }

    /// Drops keys older than the window, then the oldest beyond `max_keys`.
    pub fn expire(&mut self, now_ms: u64, window_ms: u64, max_keys: usize) {
        if self.by_time.is_empty() && !self.keys.is_empty() {
            self.rebuild_time_index();
        }
        while let Some((&at, _)) = self.by_time.first_key_value() {
            if at.saturating_add(window_ms) > now_ms && self.keys.len() <= max_keys {
                break;
            }
            if let Some((_, keys)) = self.by_time.pop_first() {
                for k in keys {
                    if self.keys.get(&k).is_some_and(|(_, t)| *t == at) {
                        self.keys.remove(&k);
                    }
                }
            }
        }
    }

    fn rebuild_time_index(&mut self) {
        self.by_time.clear();
        for (k, (_, at)) in &self.keys {
            self.by_time.entry(*at).or_default().push(k.clone());
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: i64, epoch: i16, seq: i32) -> ProducerFields {
        ProducerFields { id, epoch, base_sequence: seq }
    }

    #[test]
    fn idempotence_table() {
        let mut t = ProducerTable::default();
        assert!(matches!(t.check(p(1, 0, 3), 2), Err(MqError::UnknownProducerId(1))));
        assert_eq!(t.check(p(1, 0, 0), 2).unwrap(), SeqCheck::Append);
        t.record(p(1, 0, 0), 2, 100, 1);
        // A retry of the same batch is a duplicate with its offsets.
        assert_eq!(t.check(p(1, 0, 0), 2).unwrap(), SeqCheck::Duplicate { base_offset: 100 });
        assert_eq!(t.check(p(1, 0, 2), 1).unwrap(), SeqCheck::Append);
        assert!(matches!(t.check(p(1, 0, 5), 1), Err(MqError::OutOfOrderSequence { got: 5, last: 1, .. })));
        // Only the last 5 batches are remembered.
        for i in 0..6 {
            t.record(p(1, 0, 2 + i), 1, 102 + i as u64, 2);
        }
        assert!(matches!(t.check(p(1, 0, 0), 2), Err(MqError::OutOfOrderSequence { .. })));
        assert_eq!(t.check(p(1, 0, 7), 1).unwrap(), SeqCheck::Duplicate { base_offset: 107 });
        // Epochs: older fenced, newer starts at 0.
        assert!(matches!(t.check(p(1, -1, 8), 1), Err(MqError::ProducerFenced { .. })));
        assert!(matches!(t.check(p(1, 1, 8), 1), Err(MqError::OutOfOrderSequence { .. })));
        assert_eq!(t.check(p(1, 1, 0), 1).unwrap(), SeqCheck::Append);
        t.record(p(1, 1, 0), 1, 200, 3);
        assert!(matches!(t.check(p(1, 0, 8), 1), Err(MqError::ProducerFenced { .. })));
        // Wrap-around.
        t.record(p(2, 0, i32::MAX - 1), 2, 300, 3);
        assert_eq!(t.check(p(2, 0, 0), 1).unwrap(), SeqCheck::Append);
        // Expiry and the cap.
        t.expire(10, 5, 10);
        assert!(t.producers.is_empty());
        for id in 0..5 {
            t.record(p(id, 0, 0), 1, 0, id as u64);
        }
        t.expire(5, 100, 3);
        let mut left: Vec<i64> = t.producers.keys().copied().collect();
        left.sort();
        assert_eq!(left, vec![2, 3, 4]);
    }

    #[test]
    fn dedup_window() {
        let mut d = DedupTable::default();
        let k = DedupTable::key("id1", Some("g"), true);
        assert_eq!(k, "g\u{0}id1");
        d.insert(k.clone(), 7, 1000);
        assert_eq!(d.get(&k, 1100, 300), Some(7));
        assert_eq!(d.get(&k, 1300, 300), None);
        d.insert("other".into(), 8, 1200);
        d.expire(1350, 300, 100);
        assert_eq!(d.len(), 1);
        d.insert("x".into(), 9, 1201);
        d.expire(1202, 300, 1);
        assert_eq!(d.keys.keys().cloned().collect::<Vec<_>>(), vec!["x".to_string()]);
        // Serialized and read back, the time index is rebuilt on demand.
        let json = serde_json::to_string(&d).unwrap();
        let mut back: DedupTable = serde_json::from_str(&json).unwrap();
        back.expire(5000, 300, 100);
        assert!(back.is_empty());
    }
}
