//! The chunk capabilities of a `user:` principal's client (docs/security.md,
//! "Chunk capabilities"): [`MetaCapSource`] asks meta (`meta.IssueCap`) for
//! a capability the first time an inode is read or written and keeps it
//! until it is close to expiry.
//!
//! | cached for the inode | asked for | does |
//! |---|---|---|
//! | nothing, or one with less than `CAP_RENEW_BEFORE_MS` left | read or write | one `IssueCap` (write → read-write) |
//! | read-write, valid | read or write | uses it |
//! | read, valid | read | uses it |
//! | read, valid | write | one `IssueCap` for read-write (replaces it) |
//!
//! At most [`MAX_CLIENT_CAPS`] inodes are kept (expired ones dropped first,
//! then everything when still full). A capability is valid 10 minutes, so a
//! long-lived handle costs one meta call per inode per ~8 minutes.

use crate::meta::MetaClient;
use crate::storage::{CapSource, StorageClientError};
use fskv_proto::cap::{now_ms, ChunkCap, CAP_RENEW_BEFORE_MS};
use fskv_types::{InodeId, Status};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

/// Inodes whose capabilities one client keeps.
pub const MAX_CLIENT_CAPS: usize = 4096;

/// Capabilities from meta, cached per inode.
pub struct MetaCapSource {
    meta: MetaClient,
    cached: Mutex<HashMap<InodeId, ChunkCap>>,
}

impl MetaCapSource {
    pub fn new(meta: MetaClient) -> Self {
        MetaCapSource { meta, cached: Mutex::new(HashMap::new()) }
    }

    fn usable(cap: &ChunkCap, write: bool, now: u64) -> bool {
        (!write || cap.rights.allows_write()) && cap.expires_at_ms > now.saturating_add(CAP_RENEW_BEFORE_MS)
    }

    async fn get(&self, inode: InodeId, write: bool) -> Result<ChunkCap, StorageClientError> {
        let now = now_ms();
        if let Some(cap) = self.cached.lock().get(&inode).filter(|c| Self::usable(c, write, now)) {
            return Ok(*cap);
        }
        let cap = self.meta.issue_cap(inode, write).await.map_err(|e| {
            let status = match e {
                crate::meta::MetaClientError::Status(s) => s,
                other => Status::new(other.code(), format!("no chunk capability for {inode} from meta: {other}")),
            };
            StorageClientError::Remote(status)
        })?;
        let mut cached = self.cached.lock();
        if cached.len() >= MAX_CLIENT_CAPS {
            cached.retain(|_, c| c.expires_at_ms > now);
            if cached.len() >= MAX_CLIENT_CAPS {
                cached.clear();
            }
        }
        // Keep a read-write one rather than replace it by a read one.
        let keep_old =
            cached.get(&inode).is_some_and(|old| old.rights.allows_write() && !cap.rights.allows_write() && old.expires_at_ms > now);
        if !keep_old {
            cached.insert(inode, cap);
        }
        Ok(cap)
    }

    /// Inodes with a cached capability (tests).
    pub fn cached_len(&self) -> usize {
        self.cached.lock().len()
    }
}

impl CapSource for MetaCapSource {
    fn cap(&self, inode: InodeId, write: bool) -> Pin<Box<dyn Future<Output = Result<ChunkCap, StorageClientError>> + Send + '_>> {
        Box::pin(self.get(inode, write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_proto::cap::CapRights;

    fn cap(rights: CapRights, expires_at_ms: u64) -> ChunkCap {
        ChunkCap { inode: InodeId(1), rights, expires_at_ms, mac: [0; 32] }
    }

    #[test]
    fn a_cached_capability_is_renewed_before_expiry_and_upgraded_for_writes() {
        let now = 1_000_000;
        // Plenty of time left: used, for reads; a read one is not used for a write.
        assert!(MetaCapSource::usable(&cap(CapRights::Read, now + CAP_RENEW_BEFORE_MS + 1), false, now));
        assert!(!MetaCapSource::usable(&cap(CapRights::Read, now + CAP_RENEW_BEFORE_MS + 1), true, now));
        assert!(MetaCapSource::usable(&cap(CapRights::ReadWrite, now + CAP_RENEW_BEFORE_MS + 1), true, now));
        assert!(MetaCapSource::usable(&cap(CapRights::ReadWrite, now + CAP_RENEW_BEFORE_MS + 1), false, now));
        // Within the renewal window, or expired: asked again.
        assert!(!MetaCapSource::usable(&cap(CapRights::ReadWrite, now + CAP_RENEW_BEFORE_MS), false, now));
        assert!(!MetaCapSource::usable(&cap(CapRights::ReadWrite, now - 1), false, now));
    }
}
