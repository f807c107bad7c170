//! Recency without a metadata commit per GET: every gateway process
//! (reader or writer) counts the accesses it serves in memory and writes
//! them, once per `recency_flush_interval_ms`, as **one access-log file**
//! per namespace (`ROOT/.fskv-kv/recency/<ns>/<time>-<process>-<seq>`, a
//! single publish however many GETs it covers). The writer merges the
//! logs into its namespace index (`index.rs`) and, every
//! `checkpoint_interval_ms`, writes a checkpoint of the merged recency and
//! counters; logs a checkpoint covers are then removed.
//!
//! | event | in memory | in the next log |
//! |---|---|---|
//! | GET / HEAD / batch get / exists hit | last access = now, hits + 1 | the key's last access, hits |
//! | miss | namespace misses + 1 | misses |
//! | read still streaming at flush time | in-flight count | the key as accessed at the flush, flag `IN_FLIGHT` (repeated every flush until done) |
//! | exists with a lease | — | written **at once**, before the keys are looked up, flag `LEASE` with its end (see `maintain.rs` for why the order matters) |
//!
//! **What a crash loses.** A reader or writer process that dies loses the
//! accesses it counted since its last flush (at most one flush interval):
//! those keys look older than they are and may be evicted a little early.
//! Flushed logs survive; a writer that restarts reloads the checkpoint and
//! merges every log not yet removed, so merged recency is not lost. Hit and
//! miss counts of logs merged after the checkpoint but before a crash may be
//! counted twice (recency merges are idempotent: the latest access wins).
//!
//! The log format (little-endian):
//!
//! | field | bytes |
//! |---|---|
//! | magic `FKRL`, version 1, reserved | 4 + 1 + 3 |
//! | process id, sequence, flushed at (ns) | 8 + 8 + 8 |
//! | namespace hits, misses | 8 + 8 |
//! | count | 4 |
//! | per entry: key_len (u16), flags (u8: 1 `IN_FLIGHT`, 2 `LEASE`), reserved (u8), last access ns (u64), hits (u32), inode (u64), lease until ns (u64), key | 32 + key_len |

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::collections::HashMap;

pub const LOG_MAGIC: &[u8; 4] = b"FKRL";
pub const FLAG_IN_FLIGHT: u8 = 1;
pub const FLAG_LEASE: u8 = 2;
const HEAD_BYTES: usize = 52;
const ENTRY_BYTES: usize = 32;

/// One key's accesses in a log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogEntry {
    pub key: Vec<u8>,
    pub last_ns: u64,
    pub hits: u32,
    pub inode: u64,
    pub in_flight: bool,
    pub lease_until_ns: u64,
}

/// One access log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    pub process: u64,
    pub seq: u64,
    pub at_ns: u64,
    pub hits: u64,
    pub misses: u64,
    pub entries: Vec<LogEntry>,
}

impl Log {
    /// The file name: sorts by flush time.
    pub fn file_name(&self) -> String {
        format!("{:020}-{:016x}-{:08}", self.at_ns, self.process, self.seq)
    }

    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(HEAD_BYTES + self.entries.iter().map(|e| ENTRY_BYTES + e.key.len()).sum::<usize>());
        b.extend_from_slice(LOG_MAGIC);
        b.put_u8(1);
        b.put_bytes(0, 3);
        b.put_u64_le(self.process);
        b.put_u64_le(self.seq);
        b.put_u64_le(self.at_ns);
        b.put_u64_le(self.hits);
        b.put_u64_le(self.misses);
        b.put_u32_le(self.entries.len() as u32);
        for e in &self.entries {
            b.put_u16_le(e.key.len() as u16);
            let mut f = 0;
            if e.in_flight {
                f |= FLAG_IN_FLIGHT;
            }
            if e.lease_until_ns > 0 {
                f |= FLAG_LEASE;
            }
            b.put_u8(f);
            b.put_u8(0);
            b.put_u64_le(e.last_ns);
            b.put_u32_le(e.hits);
            b.put_u64_le(e.inode);
            b.put_u64_le(e.lease_until_ns);
            b.extend_from_slice(&e.key);
        }
        b.freeze()
    }

    /// Decodes a log; `None` if it is not one (a damaged log is skipped).
    pub fn decode(mut b: &[u8]) -> Option<Log> {
        if b.len() < HEAD_BYTES || &b[..4] != LOG_MAGIC || b[4] != 1 {
            return None;
        }
        b.advance(8);
        let mut log = Log {
            process: b.get_u64_le(),
            seq: b.get_u64_le(),
            at_ns: b.get_u64_le(),
            hits: b.get_u64_le(),
            misses: b.get_u64_le(),
            entries: vec![],
        };
        let count = b.get_u32_le();
        for _ in 0..count {
            if b.len() < ENTRY_BYTES {
                return None;
            }
            let key_len = b.get_u16_le() as usize;
            let flags = b.get_u8();
            b.advance(1);
            let last_ns = b.get_u64_le();
            let hits = b.get_u32_le();
            let inode = b.get_u64_le();
            let lease_until_ns = b.get_u64_le();
            if b.len() < key_len {
                return None;
            }
            let key = b[..key_len].to_vec();
            b.advance(key_len);
            log.entries.push(LogEntry { key, last_ns, hits, inode, in_flight: flags & FLAG_IN_FLIGHT != 0, lease_until_ns });
        }
        b.is_empty().then_some(log)
    }
}

#[derive(Clone, Debug, Default)]
struct KeyAccess {
    last_ns: u64,
    hits: u32,
    inode: u64,
    in_flight: u32,
}

#[derive(Debug, Default)]
struct NsAccesses {
    keys: HashMap<Vec<u8>, KeyAccess>,
    hits: u64,
    misses: u64,
}

/// The accesses one process served since its last flush, per namespace.
/// Pure (the caller passes the time); `server.rs` wraps it in a mutex and
/// flushes it.
#[derive(Debug, Default)]
pub struct Accesses {
    by_ns: HashMap<String, NsAccesses>,
    entries: usize,
}

impl Accesses {
    pub fn hit(&mut self, ns: &str, key: &[u8], inode: u64, now_ns: u64) {
        let n = self.by_ns.entry(ns.to_string()).or_default();
        n.hits += 1;
        let e = n.keys.entry(key.to_vec()).or_insert_with(|| {
            self.entries += 1;
            KeyAccess::default()
        });
        e.last_ns = e.last_ns.max(now_ns);
        e.hits = e.hits.saturating_add(1);
        e.inode = inode;
    }

    pub fn miss(&mut self, ns: &str) {
        self.by_ns.entry(ns.to_string()).or_default().misses += 1;
    }

    /// A read that streams (counted as a hit by the caller): in flight until [`Accesses::end_read`].
    pub fn begin_read(&mut self, ns: &str, key: &[u8], inode: u64, now_ns: u64) {
        let n = self.by_ns.entry(ns.to_string()).or_default();
        let e = n.keys.entry(key.to_vec()).or_insert_with(|| {
            self.entries += 1;
            KeyAccess::default()
        });
        e.in_flight += 1;
        e.last_ns = e.last_ns.max(now_ns);
        e.inode = inode;
    }

    pub fn end_read(&mut self, ns: &str, key: &[u8], now_ns: u64) {
        let Some(n) = self.by_ns.get_mut(ns) else { return };
        let e = n.keys.entry(key.to_vec()).or_insert_with(|| {
            self.entries += 1;
            KeyAccess::default()
        });
        e.in_flight = e.in_flight.saturating_sub(1);
        e.last_ns = e.last_ns.max(now_ns);
    }

    /// Distinct keys held.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.by_ns.is_empty()
    }

    /// Takes what is to flush, one log per namespace. Reads still in flight
    /// stay (and are reported as accessed at `now_ns` in every flush).
    pub fn take(&mut self, process: u64, seq: &mut u64, now_ns: u64) -> Vec<(String, Log)> {
        let mut out = Vec::new();
        let mut keep: HashMap<String, NsAccesses> = HashMap::new();
        for (ns, acc) in self.by_ns.drain() {
            let mut log = Log { process, seq: *seq, at_ns: now_ns, hits: acc.hits, misses: acc.misses, entries: vec![] };
            *seq += 1;
            for (key, a) in acc.keys {
                let in_flight = a.in_flight > 0;
                log.entries.push(LogEntry {
                    key: key.clone(),
                    last_ns: if in_flight { now_ns } else { a.last_ns },
                    hits: a.hits,
                    inode: a.inode,
                    in_flight,
                    lease_until_ns: 0,
                });
                if in_flight {
                    keep.entry(ns.clone()).or_default().keys.insert(key, KeyAccess { hits: 0, ..a });
                }
            }
            if log.hits > 0 || log.misses > 0 || !log.entries.is_empty() {
                out.push((ns, log));
            }
        }
        self.entries = keep.values().map(|n| n.keys.len()).sum();
        self.by_ns = keep;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_round_trip() {
        let log = Log {
            process: 7,
            seq: 3,
            at_ns: 99,
            hits: 10,
            misses: 2,
            entries: vec![
                LogEntry { key: b"a".to_vec(), last_ns: 5, hits: 4, inode: 8, in_flight: true, lease_until_ns: 0 },
                LogEntry { key: vec![0, 255], last_ns: 6, hits: 0, inode: 0, in_flight: false, lease_until_ns: 77 },
            ],
        };
        let b = log.encode();
        assert_eq!(Log::decode(&b), Some(log.clone()));
        assert_eq!(Log::decode(&b[..b.len() - 1]), None);
        assert_eq!(Log::decode(b"FKRX"), None);
        assert!(log.file_name() < Log { at_ns: 100, ..log.clone() }.file_name());
    }

    #[test]
    fn accesses_accumulate_and_in_flight_reads_persist() {
        let mut a = Accesses::default();
        a.hit("ns", b"k1", 1, 10);
        a.hit("ns", b"k1", 1, 20);
        a.miss("ns");
        a.begin_read("ns", b"big", 2, 15);
        assert_eq!(a.len(), 2);
        let mut seq = 0;
        let logs = a.take(1, &mut seq, 30);
        assert_eq!(logs.len(), 1);
        let (ns, log) = &logs[0];
        assert_eq!((ns.as_str(), log.hits, log.misses, seq), ("ns", 2, 1, 1));
        let k1 = log.entries.iter().find(|e| e.key == b"k1").unwrap();
        assert_eq!((k1.last_ns, k1.hits, k1.in_flight), (20, 2, false));
        let big = log.entries.iter().find(|e| e.key == b"big").unwrap();
        assert_eq!((big.last_ns, big.in_flight), (30, true));
        // Still in flight at the next flush: reported again at that time.
        let logs = a.take(1, &mut seq, 40);
        assert_eq!(logs[0].1.entries.len(), 1);
        assert_eq!(logs[0].1.entries[0].last_ns, 40);
        a.end_read("ns", b"big", 45);
        let logs = a.take(1, &mut seq, 50);
        assert_eq!((logs[0].1.entries[0].last_ns, logs[0].1.entries[0].in_flight), (45, false));
        assert!(a.take(1, &mut seq, 60).is_empty());
        assert!(a.is_empty());
    }
}
