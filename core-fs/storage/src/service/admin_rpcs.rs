//! The RPCs around the write path: `CommitChunk` (commit a pending
//! version), `QueryChunk` (a chunk's metadata; asked of the tail when
//! settling a left-over), `SpaceInfo`, `DumpChunkMeta` (recovery's remote
//! metadata) and the sync marks `SyncStart` / `SyncDone` (a syncing target's
//! up-to-date flag, see [`StorageService::local_state`]).

use super::StorageService;
use crate::chain::RouteReject;
use crate::error::{Result, StorageError};
use crate::sync;
use fskv_proto::routing::PublicTargetState;
use fskv_proto::storage::{
    CommitReq, CommitResp, DumpChunkMetaReq, DumpChunkMetaResp, QueryChunkReq, QueryChunkResp, SpaceInfoResp, SyncReq, SyncResp,
    TargetSpace,
};
use tracing::info;

impl StorageService {
    pub(super) async fn handle_commit(&self, req: CommitReq) -> Result<CommitResp> {
        let target = self.target(req.target)?;
        let _guard = target.locks.lock(req.chunk).await;
        let engine = target.engine.clone();
        let committed_ver = self.blocking(move || Ok(engine.commit(req.chunk, req.version)?)).await?;
        Ok(CommitResp { committed_ver })
    }

    pub(super) fn handle_query_chunk(&self, req: QueryChunkReq) -> Result<QueryChunkResp> {
        let target = self.target(req.target)?;
        // Answer only at the asker's chain version, as a serving target
        // (simulation seed 407: a head with stale routing asked a target
        // already dropped from the chain, which had missed the version the
        // new tail committed, and took its "not committed" as final).
        let routing = self.inner.routing.current();
        let Some((chain, me)) = routing.locate_target(req.target) else { return Err(StorageError::UnknownTarget(req.target)) };
        let reject = if chain.chain_version != req.chain_ver {
            Some(RouteReject::StaleChainVersion { request: req.chain_ver, current: chain.chain_version })
        } else if me.state != PublicTargetState::Serving {
            Some(RouteReject::NotServing { state: me.state })
        } else {
            None
        };
        if let Some(reject) = reject {
            return Err(StorageError::Route { chain: chain.chain_id, target: req.target, reject });
        }
        let meta = target.engine.meta(req.chunk);
        if meta.as_ref().is_some_and(|m| m.pending.is_some()) {
            // A peer settling a left-over found this target holding a
            // pending version too (it waits until this one is settled:
            // `crate::craq::SettleStep`); the settle pass settles it, even if
            // nothing else would (e.g. after a restart, or no write comes).
            self.remember_unsettled(req.target, chain.chain_id, req.chunk);
        }
        Ok(QueryChunkResp { meta: meta.map(|m| sync::remote_meta(&m)) })
    }

    pub(super) fn space_info(&self) -> SpaceInfoResp {
        let mut targets: Vec<TargetSpace> = self
            .inner
            .targets
            .values()
            .map(|t| {
                let stats = t.engine.pool_stats();
                // Capacity = space already in the pools + what the disk can
                // still give them (targets sharing a disk each count it).
                let pooled: u64 = stats.iter().map(|p| p.capacity_blocks * p.block_bytes).sum();
                let free_disk = t.engine.free_disk_bytes().unwrap_or_else(|e| {
                    tracing::warn!(target = %t.id, error = %e, "statvfs failed; capacity counts pooled space only");
                    0
                });
                TargetSpace {
                    target: t.id,
                    capacity_bytes: pooled.saturating_add(free_disk),
                    used_bytes: stats.iter().map(|p| p.used_blocks * p.block_bytes).sum(),
                    scrub: t.scrub.lock().clone(),
                }
            })
            .collect();
        targets.sort_by_key(|t| t.target);
        SpaceInfoResp { targets }
    }

    pub(super) async fn handle_dump(&self, req: DumpChunkMetaReq) -> Result<DumpChunkMetaResp> {
        let engine = self.target(req.target)?.engine.clone();
        let dump = self.blocking(move || Ok(engine.dump()?)).await?;
        Ok(DumpChunkMetaResp { chunks: dump.iter().map(|(id, m)| (*id, sync::remote_meta(m))).collect() })
    }

    pub(super) fn handle_sync_mark(&self, req: SyncReq, done: bool) -> Result<SyncResp> {
        let target = self.target(req.target)?;
        if !target.sync_mark.lock().apply(req.chain_ver, done) {
            info!(target = %req.target, from = %req.from, chain_ver = req.chain_ver, done, "sync mark of an older chain version ignored");
            return Ok(SyncResp {});
        }
        info!(target = %req.target, from = %req.from, chain_ver = req.chain_ver, done, "sync mark");
        Ok(SyncResp {})
    }
}
