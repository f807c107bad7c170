//! What a key carries besides its bytes, and where it lives on the file:
//!
//! | what | where | read by a GET |
//! |---|---|---|
//! | version (ETag) | inode id + inode version: every PUT publishes a new inode, meta bumps the version on every change | always (the lookup returns the inode) |
//! | modify index (`X-Kv-Index`, Consul `ModifyIndex`) | the file's mtime in ns, set by the gateway at publish from a per-process hybrid clock (never below the last index it made) | always |
//! | expiry (TTL), Consul flags, Consul `CreateIndex` | xattr `user.kv.meta` (JSON), published in the same meta transaction as the data | only when the file's mode has the sticky bit (0o1000, "has a record"): keys without TTL or flags cost one meta call per GET |
//! | "condemned" by the evictor | setgid bit (0o2000) on the file's mode | an exists-with-lease treats the key as absent |
//!
//! A file made through FUSE or S3 has neither bit: its version, index and
//! size are read the same way; it never expires.

use crate::frame::Version;
use fskv_proto::meta::Inode;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

pub const XATTR_RECORD: &str = "user.kv.meta";
/// Mode of a value without a record.
pub const VALUE_MODE: u32 = 0o600;
/// Mode bit: the file has a [`Record`] in [`XATTR_RECORD`].
pub const MODE_HAS_RECORD: u32 = 0o1000;
/// Mode bit: the evictor picked this file and is about to remove it.
pub const MODE_CONDEMNED: u32 = 0o2000;

/// The per-key record (only keys that need one have it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Absolute expiry (ns since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ns: Option<u64>,
    /// Consul's opaque `flags`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub flags: u64,
    /// Consul's `CreateIndex` when it differs from the modify index (the key
    /// was overwritten through the Consul API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_index: Option<u64>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Record {
    pub fn is_empty(&self) -> bool {
        self.expires_ns.is_none() && self.flags == 0 && self.create_index.is_none()
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A record that does not parse counts as none (the value stays readable).
    pub fn decode(b: &[u8]) -> Record {
        serde_json::from_slice(b).unwrap_or_default()
    }

    pub fn expired(&self, now_ns: u64) -> bool {
        self.expires_ns.is_some_and(|e| e <= now_ns)
    }
}

pub fn has_record(inode: &Inode) -> bool {
    inode.acl.mode & MODE_HAS_RECORD != 0
}

pub fn is_condemned(inode: &Inode) -> bool {
    inode.acl.mode & MODE_CONDEMNED != 0
}

pub fn version_of(inode: &Inode) -> Version {
    Version { inode: inode.id.0, version: inode.version }
}

/// `"<inode hex>-<version hex>"`, quoted (an HTTP entity tag).
pub fn etag(v: Version) -> String {
    format!("\"{:x}-{:x}\"", v.inode, v.version)
}

/// Parses an entity tag made by [`etag`] (quotes and `W/` optional).
pub fn parse_etag(s: &str) -> Option<Version> {
    let s = s.trim();
    let s = s.strip_prefix("W/").unwrap_or(s);
    let s = s.strip_prefix('"').and_then(|x| x.strip_suffix('"')).unwrap_or(s);
    let (a, b) = s.split_once('-')?;
    let ok = |x: &str| !x.is_empty() && x.len() <= 16 && x.bytes().all(|c| c.is_ascii_hexdigit());
    if !ok(a) || !ok(b) {
        return None;
    }
    Some(Version { inode: u64::from_str_radix(a, 16).ok()?, version: u64::from_str_radix(b, 16).ok()? })
}

pub fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The modify-index clock of one process: wall-clock ns, strictly
/// increasing within the process (a hybrid logical clock that never goes
/// back when the wall clock does), and never below an index it has seen.
#[derive(Debug, Default)]
pub struct IndexClock {
    last: AtomicU64,
}

impl IndexClock {
    pub fn next(&self) -> u64 {
        self.next_at(now_ns())
    }

    /// Pure core of [`IndexClock::next`]: `max(now, last + 1)`.
    pub fn next_at(&self, now: u64) -> u64 {
        let mut cur = self.last.load(Ordering::Relaxed);
        loop {
            let want = now.max(cur.saturating_add(1));
            match self.last.compare_exchange_weak(cur, want, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return want,
                Err(c) => cur = c,
            }
        }
    }

    /// Makes later indexes larger than `seen` (an index read from a file).
    pub fn observe(&self, seen: u64) {
        self.last.fetch_max(seen, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_round_trip_and_refuse_garbage() {
        let v = Version { inode: 0x1234, version: 7 };
        assert_eq!(etag(v), "\"1234-7\"");
        assert_eq!(parse_etag(&etag(v)), Some(v));
        assert_eq!(parse_etag("W/\"1234-7\""), Some(v));
        assert_eq!(parse_etag("1234-7"), Some(v));
        for bad in ["", "\"\"", "12", "x-1", "1-", "-1", "1-2-3", "\"11111111111111111-1\""] {
            assert_eq!(parse_etag(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_index_clock_never_goes_back() {
        let c = IndexClock::default();
        assert_eq!(c.next_at(100), 100);
        assert_eq!(c.next_at(50), 101);
        c.observe(500);
        assert_eq!(c.next_at(200), 501);
        assert_eq!(c.next_at(1000), 1000);
    }

    #[test]
    fn records_encode_compactly() {
        assert_eq!(Record::default().encode(), b"{}");
        let r = Record { expires_ns: Some(5), flags: 42, create_index: None };
        assert_eq!(Record::decode(&r.encode()), r);
        assert!(r.expired(5) && !r.expired(4));
        assert_eq!(Record::decode(b"garbage"), Record::default());
    }
}
