//! The writer's index of one namespace, in memory (pure: the caller passes
//! the time): every key's size, version, expiry and last access, ordered by
//! last access (the LRU order) and by expiry; the bytes and keys held;
//! leases; keys being written; hit/miss/eviction/expiry counters.
//!
//! Built by a scan when the writer starts (access times from the last
//! checkpoint, else the key's modify time), kept by the writer's own puts
//! and deletes, by the access logs of every process (`recency.rs`), and by
//! a rescan every `rescan_interval_ms` (changes made elsewhere).
//!
//! **Eviction plan** ([`NsIndex::plan_eviction`]): when a capacity (bytes
//! or keys) is above its high watermark, the least recently accessed keys
//! are picked until both would be at or below the low watermark, skipping
//! every key that is protected:
//!
//! | protected | because |
//! |---|---|
//! | leased (an exists with `lease_ms` whose lease has not ended) | the client was told it exists and will read it |
//! | being written through this writer | a newer value is about to land |
//! | read in flight (reported by a log in the last `in_flight_grace_ns`) | a reader is streaming it |
//!
//! Victims are then confirmed after `eviction_confirm_ms` ([`NsIndex::confirm`]):
//! a victim accessed, leased or rewritten since it was picked is spared.

use crate::config::NamespaceConfig;
use crate::frame::Version;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

pub type Key = Arc<[u8]>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    pub version: Version,
    pub last_ns: u64,
    pub expires_ns: Option<u64>,
    /// Reported in flight by a reader at this time (0: never).
    pub in_flight_ns: u64,
}

/// A key found by a scan: (key, size, version, expiry ns, access ns).
pub type Scanned = (Vec<u8>, u64, Version, Option<u64>, u64);
/// Counters of a namespace (since the writer's first start: they survive
/// restarts through the checkpoint).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub expirations: u64,
}

/// A victim as picked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    pub key: Key,
    pub version: Version,
    /// Its last access when picked.
    pub last_ns: u64,
}

#[derive(Debug, Default)]
pub struct NsIndex {
    entries: HashMap<Key, Entry>,
    by_access: BTreeSet<(u64, Key)>,
    by_expiry: BTreeSet<(u64, Key)>,
    pins: HashMap<Key, u64>,
    writing: HashMap<Key, u32>,
    pub bytes: u64,
    pub counters: Counters,
}

/// How long a reader's "in flight" report protects a key.
pub const IN_FLIGHT_GRACE_NS: u64 = 5_000_000_000;

impl NsIndex {
    pub fn keys(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(key)
    }

    fn unlink_orders(&mut self, key: &Key, e: &Entry) {
        self.by_access.remove(&(e.last_ns, Key::clone(key)));
        if let Some(x) = e.expires_ns {
            self.by_expiry.remove(&(x, Key::clone(key)));
        }
    }

    fn link_orders(&mut self, key: &Key, e: &Entry) {
        self.by_access.insert((e.last_ns, Key::clone(key)));
        if let Some(x) = e.expires_ns {
            self.by_expiry.insert((x, Key::clone(key)));
        }
    }

    /// A key written (or found by a scan): its size, version and expiry;
    /// its last access becomes `access_ns` if that is later.
    pub fn upsert(&mut self, key: &[u8], size: u64, version: Version, expires_ns: Option<u64>, access_ns: u64) {
        let k: Key = Arc::from(key);
        let (last, in_flight) = match self.entries.remove(&k) {
            Some(old) => {
                self.unlink_orders(&k, &old);
                self.bytes -= old.size;
                (old.last_ns.max(access_ns), old.in_flight_ns)
            }
            None => (access_ns, 0),
        };
        let e = Entry { size, version, last_ns: last, expires_ns, in_flight_ns: in_flight };
        self.bytes += size;
        self.link_orders(&k, &e);
        self.entries.insert(k, e);
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let (k, e) = self.entries.remove_entry(key)?;
        self.unlink_orders(&k, &e);
        self.bytes -= e.size;
        Some(e)
    }

    /// Removes `key` only if it still has `version`.
    pub fn remove_if(&mut self, key: &[u8], version: Version) -> bool {
        if self.entries.get(key).is_some_and(|e| e.version == version) {
            self.remove(key);
            true
        } else {
            false
        }
    }

    /// An access reported by a log (or served here).
    pub fn touch(&mut self, key: &[u8], at_ns: u64, in_flight: bool) {
        let Some((k, mut e)) = self.entries.remove_entry(key) else { return };
        self.unlink_orders(&k, &e);
        e.last_ns = e.last_ns.max(at_ns);
        if in_flight {
            e.in_flight_ns = e.in_flight_ns.max(at_ns);
        }
        self.link_orders(&k, &e);
        self.entries.insert(k, e);
    }

    pub fn pin(&mut self, key: &[u8], until_ns: u64) {
        let e = self.pins.entry(Arc::from(key)).or_insert(0);
        *e = (*e).max(until_ns);
    }

    pub fn pinned(&self, key: &[u8], now_ns: u64) -> bool {
        self.pins.get(key).is_some_and(|u| *u > now_ns)
    }

    /// Drops ended leases.
    pub fn expire_pins(&mut self, now_ns: u64) {
        self.pins.retain(|_, u| *u > now_ns);
    }

    pub fn begin_write(&mut self, key: &[u8]) {
        *self.writing.entry(Arc::from(key)).or_insert(0) += 1;
    }

    pub fn end_write(&mut self, key: &[u8]) {
        if let Some(n) = self.writing.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.writing.remove(key);
            }
        }
    }

    fn protected(&self, key: &[u8], e: &Entry, now_ns: u64) -> bool {
        self.pinned(key, now_ns)
            || self.writing.contains_key(key)
            || (e.in_flight_ns > 0 && now_ns.saturating_sub(e.in_flight_ns) < IN_FLIGHT_GRACE_NS)
    }

    /// Keys whose expiry has passed (at most `max`), soonest first.
    pub fn expired(&self, now_ns: u64, max: usize) -> Vec<(Key, Version)> {
        self.by_expiry
            .iter()
            .take_while(|(x, _)| *x <= now_ns)
            .filter(|(_, k)| !self.writing.contains_key(&**k))
            .take(max)
            .filter_map(|(_, k)| self.entries.get(k).map(|e| (Key::clone(k), e.version)))
            .collect()
    }

    /// Whether a capacity is above its high watermark.
    pub fn over_high(&self, cfg: &NamespaceConfig) -> bool {
        let over = |used: u64, cap: u64| cap > 0 && used as f64 > cap as f64 * cfg.high_watermark;
        over(self.bytes, cfg.capacity_bytes) || over(self.keys(), cfg.capacity_keys)
    }

    /// Whether `extra` more bytes (and one more key if `new_key`) fit the
    /// capacity (the hard limit, not a watermark).
    pub fn fits(&self, cfg: &NamespaceConfig, extra: u64, new_key: bool) -> bool {
        (cfg.capacity_bytes == 0 || self.bytes + extra <= cfg.capacity_bytes)
            && (cfg.capacity_keys == 0 || self.keys() + u64::from(new_key) <= cfg.capacity_keys)
    }

    /// The least recently accessed unprotected keys whose removal brings
    /// both capacities to the low watermark (at most `max`); empty when no
    /// capacity is above its high watermark.
    pub fn plan_eviction(&self, cfg: &NamespaceConfig, now_ns: u64, max: usize) -> Vec<Victim> {
        if !self.over_high(cfg) {
            return Vec::new();
        }
        let low = |cap: u64| (cap as f64 * cfg.low_watermark) as u64;
        let (mut bytes, mut keys) = (self.bytes, self.keys());
        let done = |bytes: u64, keys: u64| {
            (cfg.capacity_bytes == 0 || bytes <= low(cfg.capacity_bytes)) && (cfg.capacity_keys == 0 || keys <= low(cfg.capacity_keys))
        };
        let mut out = Vec::new();
        for (last, k) in &self.by_access {
            if done(bytes, keys) || out.len() >= max {
                break;
            }
            let Some(e) = self.entries.get(k) else { continue };
            if self.protected(k, e, now_ns) {
                continue;
            }
            bytes -= e.size;
            keys -= 1;
            out.push(Victim { key: Key::clone(k), version: e.version, last_ns: *last });
        }
        out
    }

    /// Whether a picked victim is still to be removed: not accessed,
    /// leased, rewritten or being written since it was picked.
    pub fn confirm(&self, v: &Victim, now_ns: u64) -> bool {
        match self.entries.get(&v.key) {
            Some(e) => e.version == v.version && e.last_ns <= v.last_ns && !self.protected(&v.key, e, now_ns),
            None => false,
        }
    }

    /// Records that a victim was condemned (its mode change bumped the version).
    pub fn set_version(&mut self, key: &[u8], version: Version) {
        if let Some(e) = self.entries.get_mut(key) {
            e.version = version;
        }
    }

    /// Every key with its last access (checkpoints).
    pub fn accesses(&self) -> impl Iterator<Item = (&[u8], u64)> {
        self.entries.iter().map(|(k, e)| (&k[..], e.last_ns))
    }

    /// Keys in LRU order, least recent first (tests, stats).
    pub fn lru_order(&self) -> Vec<Key> {
        self.by_access.iter().map(|(_, k)| Key::clone(k)).collect()
    }

    /// Replaces the entries with those of a fresh scan, keeping known
    /// access times; returns (added, removed).
    pub fn reconcile(&mut self, scanned: Vec<Scanned>) -> (usize, usize) {
        self.reconcile_keeping(scanned, &std::collections::HashSet::new())
    }

    /// [`NsIndex::reconcile`], keeping the keys of `keep` (written while
    /// the scan ran, so maybe after it passed them).
    pub fn reconcile_keeping(&mut self, scanned: Vec<Scanned>, keep: &std::collections::HashSet<Vec<u8>>) -> (usize, usize) {
        let mut seen: HashMap<Key, ()> = HashMap::new();
        let mut added = 0;
        for (key, size, version, expires, mtime) in scanned {
            let known = self.entries.get(&key[..]).map(|e| e.last_ns);
            if known.is_none() {
                added += 1;
            }
            self.upsert(&key, size, version, expires, known.unwrap_or(mtime));
            seen.insert(Arc::from(&key[..]), ());
        }
        let gone: Vec<Key> = self
            .entries
            .keys()
            .filter(|k| !seen.contains_key(*k) && !self.writing.contains_key(*k) && !keep.contains(&k[..]))
            .cloned()
            .collect();
        for k in &gone {
            self.remove(k);
        }
        (added, gone.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version { inode: n, version: 1 }
    }

    fn cfg(bytes: u64, keys: u64) -> NamespaceConfig {
        NamespaceConfig { capacity_bytes: bytes, capacity_keys: keys, high_watermark: 0.9, low_watermark: 0.5, default_ttl_ms: 0 }
    }

    #[test]
    fn lru_order_follows_accesses() {
        let mut ix = NsIndex::default();
        for i in 0..5u64 {
            ix.upsert(&[i as u8], 10, v(i), None, 100 + i);
        }
        ix.touch(&[0], 200, false);
        ix.touch(&[3], 50, false); // older than known: no change
        assert_eq!(ix.lru_order().iter().map(|k| k[0]).collect::<Vec<_>>(), vec![1, 2, 3, 4, 0]);
        assert_eq!((ix.bytes, ix.keys()), (50, 5));
        ix.upsert(&[1], 30, v(9), None, 0);
        assert_eq!(ix.bytes, 70);
        assert_eq!(ix.get(&[1]).unwrap().last_ns, 101);
        assert!(!ix.remove_if(&[1], v(1)));
        assert!(ix.remove_if(&[1], v(9)));
        assert_eq!((ix.bytes, ix.keys()), (40, 4));
    }

    #[test]
    fn eviction_takes_the_least_recent_unprotected_keys_down_to_the_low_watermark() {
        let mut ix = NsIndex::default();
        for i in 0..10u64 {
            ix.upsert(&[i as u8], 10, v(i), None, 1000 + i);
        }
        let c = cfg(100, 0);
        // 100 bytes > 90: evict down to 50 bytes, i.e. 5 keys.
        ix.pin(&[0], 10_000);
        ix.begin_write(&[1]);
        ix.touch(&[2], 1002, true); // a reader streams it
        let plan = ix.plan_eviction(&c, 2000, 100);
        assert_eq!(plan.iter().map(|p| p.key[0]).collect::<Vec<_>>(), vec![3, 4, 5, 6, 7]);
        // Under the high watermark: nothing.
        let mut small = NsIndex::default();
        small.upsert(b"a", 89, v(1), None, 1);
        assert!(small.plan_eviction(&c, 2, 10).is_empty());
        // Key-count capacity.
        let plan = ix.plan_eviction(&cfg(0, 10), 2000, 100);
        assert_eq!(plan.len(), 5);
    }

    #[test]
    fn confirmation_spares_accessed_rewritten_and_leased_victims() {
        let mut ix = NsIndex::default();
        for i in 0..4u64 {
            ix.upsert(&[i as u8], 40, v(i), None, 10 + i);
        }
        let plan = ix.plan_eviction(&cfg(100, 0), 100, 10);
        assert_eq!(plan.len(), 3);
        ix.touch(&[0], 50, false);
        ix.upsert(&[1], 40, v(77), None, 0);
        ix.pin(&[2], 1_000);
        assert!(plan.iter().all(|p| !ix.confirm(p, 200)));
        ix.expire_pins(2_000);
        assert!(ix.confirm(&plan[2], 2_000));
    }

    #[test]
    fn expiry_order_and_reconcile() {
        let mut ix = NsIndex::default();
        ix.upsert(b"a", 1, v(1), Some(30), 0);
        ix.upsert(b"b", 1, v(2), Some(10), 0);
        ix.upsert(b"c", 1, v(3), None, 0);
        ix.begin_write(b"a");
        assert_eq!(ix.expired(100, 10).iter().map(|(k, _)| k[0]).collect::<Vec<_>>(), vec![b'b']);
        ix.end_write(b"a");
        assert_eq!(ix.expired(20, 10).len(), 1);
        assert_eq!(ix.expired(100, 10).len(), 2);
        ix.touch(b"c", 500, false);
        let (added, removed) = ix.reconcile(vec![(b"c".to_vec(), 5, v(3), None, 1), (b"d".to_vec(), 7, v(4), None, 2)]);
        assert_eq!((added, removed), (1, 2));
        assert_eq!(ix.get(b"c").unwrap().last_ns, 500);
        assert_eq!((ix.bytes, ix.keys()), (12, 2));
    }
}
