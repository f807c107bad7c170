//! Who may call which storage method, and the chunk-capability check of
//! `user:` connections (docs/security.md, "Chunk capabilities").
//!
//! | connection's principal | data path (`WriteChunk`, `BatchRead`, `QueryLastChunk`) | every other method (`ForwardChunk`, `CommitChunk`, `QueryChunk`, `RemoveChunks`, `SpaceInfo`, `DumpChunkMeta`, `SyncStart`/`SyncDone`, `CopyRange`; `InjectDiskFault` and `InjectBitRot` in test builds) |
//! |---|---|---|
//! | none (server without a cluster key) | allowed | allowed |
//! | trusted (`node:*`, `meta:*`, `mgmtd`, `fuse`, `gateway`, `client`, any name proven with the cluster key) | allowed, no check, no cost | allowed |
//! | `user:…` (proven with its derived key) | only with a capability covering the inode of every chunk touched: read for `BatchRead`/`QueryLastChunk`, read-write for every `WriteChunk` op (write, truncate, remove) | `PermissionDenied` |
//!
//! `CopyRange` is refused for users: its source is another inode the
//! request would need a second capability for, and no user client sends it
//! (the gateways, trusted, do).
//!
//! # Cost per I/O ([`CapCache`])
//!
//! Each connection keeps the capabilities it verified (keyed by MAC, at
//! most [`MAX_CACHED_CAPS`], cleared when full). The first request with a
//! capability pays one HMAC-SHA256 over ~100 bytes; every later one a
//! mutex, a hash lookup, a 56-byte compare and a clock read
//! (docs/BENCHMARKS.md has the measured numbers). The principal is fixed
//! per connection, so a cache hit is bound to it as the MAC is.

use crate::error::StorageError;
use fskv_proto::cap::{now_ms, CapError, ChunkCap, MAX_CAPS_PER_REQUEST};
use fskv_rpc::auth::{CapKey, Principal};
use fskv_rpc::RequestContext;
use fskv_types::InodeId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Verified capabilities one connection keeps.
pub const MAX_CACHED_CAPS: usize = 1024;

/// The capabilities a connection verified (its `ConnLocal` slot).
#[derive(Default)]
pub struct CapCache {
    verified: Mutex<HashMap<[u8; 32], ChunkCap>>,
}

impl CapCache {
    /// Checks `cap` for an access to `inode` by `principal`: the MAC once per
    /// connection (then cached), the inode, rights and expiry every time.
    pub fn check(&self, key: &CapKey, principal: &str, cap: &ChunkCap, inode: InodeId, write: bool, now_ms: u64) -> Result<(), CapError> {
        let hit = self.verified.lock().get(&cap.mac) == Some(cap);
        if !hit {
            if !cap.authentic(key, principal) {
                return Err(CapError::BadMac);
            }
            let mut verified = self.verified.lock();
            if verified.len() >= MAX_CACHED_CAPS {
                verified.retain(|_, c| now_ms <= c.expires_at_ms.saturating_add(fskv_proto::cap::CAP_CLOCK_SKEW_MS));
                if verified.len() >= MAX_CACHED_CAPS {
                    verified.clear();
                }
            }
            verified.insert(cap.mac, *cap);
        }
        cap.covers(inode, write, now_ms)
    }

    pub fn len(&self) -> usize {
        self.verified.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A `user:` connection: what its data-path requests are checked with.
pub struct UserConn {
    principal: Principal,
    key: Arc<CapKey>,
    cache: Arc<CapCache>,
}

impl UserConn {
    /// `None` for a trusted (or unauthenticated) connection; the checker for
    /// a user one. A user connection to a service without the capability key
    /// is refused (it cannot verify anything).
    pub fn of(ctx: &RequestContext, key: Option<&Arc<CapKey>>) -> Result<Option<UserConn>, StorageError> {
        let Some(principal) = ctx.principal.as_ref().filter(|p| p.is_user()) else { return Ok(None) };
        let key = key.ok_or_else(|| StorageError::PermissionDenied(format!("{principal}: this storage service has no capability key")))?;
        let cache = ctx
            .conn_local
            .get_or_default::<CapCache>()
            .ok_or_else(|| StorageError::Internal("the connection slot holds another type".into()))?;
        Ok(Some(UserConn { principal: principal.clone(), key: key.clone(), cache }))
    }

    /// Every inode in `inodes` is covered by one of `caps` (read, or read-write with `write`).
    pub fn check(&self, caps: &[ChunkCap], inodes: impl IntoIterator<Item = InodeId>, write: bool) -> Result<(), StorageError> {
        if caps.len() > MAX_CAPS_PER_REQUEST {
            return Err(self.denied(CapError::TooMany(caps.len())));
        }
        let now = now_ms();
        let mut last: Option<InodeId> = None;
        for inode in inodes {
            if last == Some(inode) {
                continue;
            }
            let cap = caps.iter().find(|c| c.inode == inode).ok_or_else(|| self.denied(CapError::Missing(inode)))?;
            self.cache.check(&self.key, self.principal.name(), cap, inode, write, now).map_err(|e| self.denied(e))?;
            last = Some(inode);
        }
        Ok(())
    }

    fn denied(&self, e: CapError) -> StorageError {
        StorageError::PermissionDenied(format!("{}: {e}", self.principal))
    }
}

/// The refusal of a method users may not call.
pub fn refuse_users(ctx: &RequestContext, method: &str) -> Result<(), StorageError> {
    match ctx.principal.as_ref().filter(|p| p.is_user()) {
        Some(p) => {
            Err(StorageError::PermissionDenied(format!("{p} may not call storage.{method} (user principals only read and write chunks)")))
        }
        None => Ok(()),
    }
}

/// ns per check of a capability: cold (`ChunkCap::check`: the HMAC and the
/// coverage, what a connection's first request pays) and warm
/// (`CapCache::check` on a cached capability, every later request), over
/// `iterations` each. Used by `fskv bench caps` and
/// `cargo run --release -p fskv-storage --example caps_micro`.
pub fn measure_check_ns(iterations: u64) -> (f64, f64) {
    use fskv_proto::cap::CapRights;
    let iterations = iterations.max(1);
    let key = fskv_rpc::auth::ClusterKey::generate().cap_key();
    let principal = "user:1000:1000";
    let cap = ChunkCap::issue(&key, principal, InodeId(42), CapRights::ReadWrite, now_ms() + 600_000);
    let mut ok = 0u64;
    let started = std::time::Instant::now();
    for _ in 0..iterations {
        let c = std::hint::black_box(&cap);
        ok += u64::from(c.check(&key, principal, InodeId(42), true, now_ms()).is_ok());
    }
    let cold = started.elapsed().as_nanos() as f64 / iterations as f64;
    let cache = CapCache::default();
    let started = std::time::Instant::now();
    for _ in 0..iterations {
        let c = std::hint::black_box(&cap);
        ok += u64::from(cache.check(&key, principal, c, InodeId(42), true, now_ms()).is_ok());
    }
    let warm = started.elapsed().as_nanos() as f64 / iterations as f64;
    debug_assert_eq!(ok, 2 * iterations);
    (cold, warm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_proto::cap::{CapRights, CAP_CLOCK_SKEW_MS};
    use fskv_rpc::auth::ClusterKey;

    #[test]
    fn the_cache_skips_the_mac_but_not_the_coverage() {
        let key = ClusterKey::from_bytes([3; 32]).cap_key();
        let cache = CapCache::default();
        let cap = ChunkCap::issue(&key, "user:1:1", InodeId(5), CapRights::Read, 10_000);
        assert_eq!(cache.check(&key, "user:1:1", &cap, InodeId(5), false, 0), Ok(()));
        assert_eq!(cache.len(), 1);
        // Hit: still checked for inode, rights, expiry.
        assert_eq!(
            cache.check(&key, "user:1:1", &cap, InodeId(6), false, 0),
            Err(CapError::WrongInode { cap: InodeId(5), wanted: InodeId(6) })
        );
        assert_eq!(cache.check(&key, "user:1:1", &cap, InodeId(5), true, 0), Err(CapError::ReadOnly(InodeId(5))));
        assert!(matches!(
            cache.check(&key, "user:1:1", &cap, InodeId(5), false, 10_001 + CAP_CLOCK_SKEW_MS),
            Err(CapError::Expired { .. })
        ));
        // Same MAC with a field changed is not a hit: it is verified, and fails.
        let mut forged = cap;
        forged.rights = CapRights::ReadWrite;
        assert_eq!(cache.check(&key, "user:1:1", &forged, InodeId(5), true, 0), Err(CapError::BadMac));
        let mut forged = cap;
        forged.expires_at_ms = u64::MAX;
        assert_eq!(cache.check(&key, "user:1:1", &forged, InodeId(5), false, 0), Err(CapError::BadMac));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let key = ClusterKey::from_bytes([3; 32]).cap_key();
        let cache = CapCache::default();
        for i in 0..(MAX_CACHED_CAPS as u64 + 10) {
            let cap = ChunkCap::issue(&key, "user:1:1", InodeId(i), CapRights::Read, 10_000);
            assert_eq!(cache.check(&key, "user:1:1", &cap, InodeId(i), false, 0), Ok(()));
            assert!(cache.len() <= MAX_CACHED_CAPS);
        }
    }
}
