//! Bit-rot repair and the scrubber.
//!
//! A page checksum that fails on a committed chunk (the engine verifies every
//! page it reads) means the block file no longer holds what was written. The
//! chunk is rewritten from another replica:
//!
//! | step | rule |
//! |---|---|
//! | one at a time | a chunk already being repaired here is not repaired again: the read fails with `ChecksumMismatch` (a peer asking us for a source while we ask it ends at once) |
//! | lock | the chunk's lock, so no write step runs on it meanwhile |
//! | re-check | read the committed content again: already good (repaired by a concurrent reader) → done; no checksum error → nothing to do |
//! | source | each *other* serving target of the chain, in chain order: a strict read of the whole chunk must return the same committed version, the same length and the recorded whole-content CRC |
//! | rewrite | `ChunkEngine::repair_committed`: a fresh block, same version and tags; the damaged block is retired |
//! | no source | the chunk stays as it is and reads keep failing with `ChecksumMismatch` (never a wrong byte); logged once per attempt |
//!
//! Who repairs: a `BatchRead` that meets a checksum error (then reads the
//! batch again, once), and the **scrubber** — a background task that reads
//! every committed chunk of every target, at most `scrub_bytes_per_sec`, one
//! pass after another with `scrub_pause_between_passes_ms` in between. Its
//! progress per target is in `SpaceInfo` (`fskv admin status`).

use super::{StorageService, Target};
use bytes::Bytes;
use fskv_chunk_engine::{ChunkError, ReadMode};
use fskv_proto::routing::ChainRoles;
use fskv_proto::storage::{BatchRead, BatchReadReq, ReadIo, ScrubProgress};
use fskv_types::{ChainId, ChunkId};
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info, warn};

/// Who found the damage (for the logs and counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RepairCause {
    Read,
    Scrub,
}

/// Removes the chunk from `Target::repairing` when the repair ends.
struct Repairing<'a> {
    target: &'a Target,
    chunk: ChunkId,
}

impl Drop for Repairing<'_> {
    fn drop(&mut self) {
        self.target.repairing.lock().remove(&self.chunk);
    }
}

/// What a look at one chunk's committed content found.
enum Check {
    Good(u64),
    Corrupt,
    /// Gone, or another error (logged by the caller's path).
    Other,
}

impl StorageService {
    async fn check_committed(&self, target: &Arc<Target>, chunk: ChunkId) -> Check {
        let engine = target.engine.clone();
        let read = self.blocking(move || Ok(engine.read(chunk, 0, u64::MAX >> 1, ReadMode::CommittedOnly))).await;
        match read {
            Ok(Ok(r)) => Check::Good(r.data.len() as u64),
            Ok(Err(ChunkError::ChecksumMismatch { .. })) => Check::Corrupt,
            _ => Check::Other,
        }
    }

    /// Repairs `chunk` of `target` (in `chain`) from another replica; returns
    /// whether its committed content now reads back clean.
    pub(super) async fn repair_chunk(&self, target: &Arc<Target>, chain_id: ChainId, chunk: ChunkId, cause: RepairCause) -> bool {
        // One repair of a chunk at a time here; a source read that reaches
        // a target already repairing that chunk fails at once instead of
        // starting a repair of its own (which would ask us back and wait
        // for our lock: every replica damaged otherwise deadlocks until
        // the call deadlines).
        if !target.repairing.lock().insert(chunk) {
            return false;
        }
        let _repairing = Repairing { target, chunk };
        let _guard = target.locks.lock(chunk).await;
        match self.check_committed(target, chunk).await {
            Check::Good(_) => return true,
            Check::Other => return false,
            Check::Corrupt => {}
        }
        let Some(meta) = target.engine.meta(chunk) else { return false };
        if meta.pending.is_some() {
            warn!(target = %target.id, %chunk, ?cause, "checksum error on a chunk with a pending version; repair left to a later read or scrub pass");
            return false;
        }
        let routing = self.inner.routing.current();
        let Some(chain) = routing.chain(chain_id) else { return false };
        for peer in chain.readable().filter(|t| t.target_id != target.id) {
            let Some(addr) = routing.node_address(peer.node_id) else { continue };
            let io = ReadIo {
                chain_id,
                chain_ver: chain.chain_version,
                target: peer.target_id,
                chunk,
                offset_bytes: 0,
                len_bytes: meta.committed.len_bytes,
                relaxed: false,
            };
            let got = self
                .inner
                .rpc
                .call::<BatchRead>(addr, &BatchReadReq { ios: vec![io], caps: Vec::new() }, Bytes::new(), self.call_opts())
                .await;
            let (resp, payload) = match got {
                Ok(r) => r,
                Err(e) => {
                    warn!(target = %target.id, %chunk, peer = %peer.target_id, error = %e, "repair source unreachable");
                    continue;
                }
            };
            let same = matches!(resp.results.first(), Some(Ok(ok))
                if ok.version == meta.committed_ver && ok.len_bytes == meta.committed.len_bytes && payload.len() == ok.len_bytes as usize)
                && crc32c::crc32c(&payload) == meta.committed.crc;
            if !same {
                continue;
            }
            let (engine, version) = (target.engine.clone(), meta.committed_ver);
            match self.blocking(move || Ok(engine.repair_committed(chunk, version, &payload)?)).await {
                Ok(()) => {
                    info!(target = %target.id, %chunk, version, peer = %peer.target_id, ?cause, "repaired a chunk whose page checksum failed");
                    target.scrub.lock().repaired += 1;
                    return true;
                }
                Err(e) => {
                    error!(target = %target.id, %chunk, error = %e, "repair failed");
                    return false;
                }
            }
        }
        error!(target = %target.id, %chunk, version = meta.committed_ver, ?cause, "checksum error and no other replica holds this version; reads of it fail");
        false
    }

    /// The scrubber (see the module doc). Runs until the service stops.
    pub(super) async fn scrub_worker(self) {
        let rate = self.inner.config.scrub_bytes_per_sec;
        if rate == 0 {
            return;
        }
        let pause = Duration::from_millis(self.inner.config.scrub_pause_between_passes_ms);
        loop {
            for id in self.target_ids() {
                let Ok(target) = self.target(id) else { continue };
                self.scrub_target(&target, rate).await;
            }
            tokio::time::sleep(pause).await;
        }
    }

    async fn scrub_target(&self, target: &Arc<Target>, rate_bytes_per_sec: u64) {
        let chunks = target.engine.committed_chunk_ids();
        {
            let mut p = target.scrub.lock();
            p.pass_chunks_total = chunks.len() as u64;
            p.pass_chunks_done = 0;
        }
        let started = tokio::time::Instant::now();
        let mut bytes = 0u64;
        for chunk in chunks {
            let check = self.check_committed(target, chunk).await;
            if let Check::Good(n) = check {
                bytes += n;
            }
            if matches!(check, Check::Corrupt) {
                target.scrub.lock().corrupt_found += 1;
                let chain = self.inner.routing.current().locate_target(target.id).map(|(c, _)| c.chain_id);
                if let Some(chain) = chain {
                    self.repair_chunk(target, chain, chunk, RepairCause::Scrub).await;
                }
            }
            {
                let mut p = target.scrub.lock();
                p.pass_chunks_done += 1;
                p.chunks_checked += 1;
                if let Check::Good(n) = check {
                    p.bytes_checked += n;
                }
            }
            // At most `rate` bytes per second over the pass.
            let due = Duration::from_secs_f64(bytes as f64 / rate_bytes_per_sec as f64);
            let elapsed = started.elapsed();
            if due > elapsed {
                tokio::time::sleep(due - elapsed).await;
            }
        }
        target.scrub.lock().passes += 1;
    }

    /// The scrubber's progress on `target`.
    pub fn scrub_progress(&self, target: fskv_types::TargetId) -> Option<ScrubProgress> {
        self.inner.targets.get(&target).map(|t| t.scrub.lock().clone())
    }
}
