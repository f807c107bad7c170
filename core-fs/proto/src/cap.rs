//! Chunk capabilities: meta's signed permission for one user principal to
//! read (or read and write) the chunks of one inode, checked by storage on
//! every data-path request of a `user:` connection (docs/security.md,
//! "Chunk capabilities").
//!
//! | field | meaning |
//! |---|---|
//! | `inode` | the file whose chunks (`ChunkId::inode`) it covers |
//! | `rights` | [`CapRights::Read`] or [`CapRights::ReadWrite`] |
//! | `expires_at_ms` | wall-clock ms since the Unix epoch; meta issues [`CAP_VALIDITY_MS`] ahead |
//! | `mac` | `HMAC-SHA256(K_cap, "fskv-chunk-cap-v1" · len · principal · inode BE · rights · expires BE)` ([`fskv_rpc::auth::CapKey`]) |
//!
//! The principal is not in the capability: the MAC binds it, and storage
//! verifies against the connection's proven principal, so a capability
//! copied to another user's connection does not verify.
//!
//! | storage's check ([`ChunkCap::check`]) | refusal |
//! |---|---|
//! | the MAC verifies for the connection's principal (constant time) | [`CapError::BadMac`] |
//! | `inode` is the chunk's inode | [`CapError::WrongInode`] |
//! | a write needs `ReadWrite` | [`CapError::ReadOnly`] |
//! | `now_ms <= expires_at_ms + CAP_CLOCK_SKEW_MS` | [`CapError::Expired`] |
//!
//! Pure functions: the caller passes the clock.

use fskv_rpc::auth::CapKey;
use fskv_types::ids::InodeId;
use serde::{Deserialize, Serialize};

/// How long a capability meta issues is valid.
pub const CAP_VALIDITY_MS: u64 = 600_000;
/// Clock difference between meta and storage hosts a capability tolerates
/// past its expiry (NTP keeps hosts far closer).
pub const CAP_CLOCK_SKEW_MS: u64 = 30_000;
/// A client renews a capability with less than this left.
pub const CAP_RENEW_BEFORE_MS: u64 = 120_000;
/// Most capabilities one storage request carries.
pub const MAX_CAPS_PER_REQUEST: usize = 64;

/// What a capability allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CapRights {
    Read,
    ReadWrite,
}

impl CapRights {
    /// The byte the MAC covers.
    pub fn byte(self) -> u8 {
        match self {
            CapRights::Read => 1,
            CapRights::ReadWrite => 3,
        }
    }

    pub fn allows_write(self) -> bool {
        self == CapRights::ReadWrite
    }
}

/// A chunk capability (table in the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkCap {
    pub inode: InodeId,
    pub rights: CapRights,
    pub expires_at_ms: u64,
    pub mac: [u8; 32],
}

/// Why a capability does not allow a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    #[error("no chunk capability for inode {0} (user principals must present one from meta)")]
    Missing(InodeId),
    #[error("the chunk capability does not verify for this principal")]
    BadMac,
    #[error("the chunk capability is for inode {cap}, not {wanted}")]
    WrongInode { cap: InodeId, wanted: InodeId },
    #[error("the chunk capability for inode {0} is read-only")]
    ReadOnly(InodeId),
    #[error("the chunk capability for inode {inode} expired at {expires_at_ms} ms")]
    Expired { inode: InodeId, expires_at_ms: u64 },
    #[error("{0} chunk capabilities in one request (max {MAX_CAPS_PER_REQUEST})")]
    TooMany(usize),
}

impl ChunkCap {
    /// Meta's side: a capability for `principal`.
    pub fn issue(key: &CapKey, principal: &str, inode: InodeId, rights: CapRights, expires_at_ms: u64) -> ChunkCap {
        ChunkCap { inode, rights, expires_at_ms, mac: key.mac(principal, inode.0, rights.byte(), expires_at_ms) }
    }

    /// Whether the MAC verifies for `principal` (the HMAC; what a cache hit skips).
    pub fn authentic(&self, key: &CapKey, principal: &str) -> bool {
        key.verify(principal, self.inode.0, self.rights.byte(), self.expires_at_ms, &self.mac)
    }

    /// Whether an authentic capability covers an access to `inode` at `now_ms`.
    pub fn covers(&self, inode: InodeId, write: bool, now_ms: u64) -> Result<(), CapError> {
        if self.inode != inode {
            return Err(CapError::WrongInode { cap: self.inode, wanted: inode });
        }
        if write && !self.rights.allows_write() {
            return Err(CapError::ReadOnly(inode));
        }
        if now_ms > self.expires_at_ms.saturating_add(CAP_CLOCK_SKEW_MS) {
            return Err(CapError::Expired { inode, expires_at_ms: self.expires_at_ms });
        }
        Ok(())
    }

    /// The whole check without a cache: MAC, then coverage.
    pub fn check(&self, key: &CapKey, principal: &str, inode: InodeId, write: bool, now_ms: u64) -> Result<(), CapError> {
        if !self.authentic(key, principal) {
            return Err(CapError::BadMac);
        }
        self.covers(inode, write, now_ms)
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_rpc::auth::ClusterKey;

    fn key() -> CapKey {
        ClusterKey::from_bytes([9; 32]).cap_key()
    }

    #[test]
    fn a_capability_covers_its_inode_rights_and_time_for_its_principal_only() {
        let k = key();
        let cap = ChunkCap::issue(&k, "user:1:1", InodeId(7), CapRights::Read, 1_000_000);
        assert_eq!(cap.check(&k, "user:1:1", InodeId(7), false, 999_999), Ok(()));
        // Within the skew after expiry, not beyond.
        assert_eq!(cap.check(&k, "user:1:1", InodeId(7), false, 1_000_000 + CAP_CLOCK_SKEW_MS), Ok(()));
        assert_eq!(
            cap.check(&k, "user:1:1", InodeId(7), false, 1_000_001 + CAP_CLOCK_SKEW_MS),
            Err(CapError::Expired { inode: InodeId(7), expires_at_ms: 1_000_000 })
        );
        assert_eq!(cap.check(&k, "user:1:1", InodeId(8), false, 0), Err(CapError::WrongInode { cap: InodeId(7), wanted: InodeId(8) }));
        assert_eq!(cap.check(&k, "user:1:1", InodeId(7), true, 0), Err(CapError::ReadOnly(InodeId(7))));
        assert_eq!(cap.check(&k, "user:2:1", InodeId(7), false, 0), Err(CapError::BadMac));
        let rw = ChunkCap::issue(&k, "user:1:1", InodeId(7), CapRights::ReadWrite, 1_000_000);
        assert_eq!(rw.check(&k, "user:1:1", InodeId(7), true, 0), Ok(()));
    }

    #[test]
    fn any_tampered_field_breaks_the_mac() {
        let k = key();
        let cap = ChunkCap::issue(&k, "user:1:1", InodeId(7), CapRights::Read, 1_000_000);
        let mut t = cap;
        t.inode = InodeId(8);
        assert_eq!(t.check(&k, "user:1:1", InodeId(8), false, 0), Err(CapError::BadMac));
        let mut t = cap;
        t.rights = CapRights::ReadWrite;
        assert_eq!(t.check(&k, "user:1:1", InodeId(7), true, 0), Err(CapError::BadMac));
        let mut t = cap;
        t.expires_at_ms += 1;
        assert_eq!(t.check(&k, "user:1:1", InodeId(7), false, 0), Err(CapError::BadMac));
        let mut t = cap;
        t.mac[31] ^= 1;
        assert_eq!(t.check(&k, "user:1:1", InodeId(7), false, 0), Err(CapError::BadMac));
        // Another cluster's key.
        assert_eq!(cap.check(&ClusterKey::from_bytes([1; 32]).cap_key(), "user:1:1", InodeId(7), false, 0), Err(CapError::BadMac));
    }
}
