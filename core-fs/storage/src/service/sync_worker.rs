//! The recovery worker. It watches routing; for every local target that
//! must recover its syncing successor ([`chain::sync_successor`]) it runs
//! one sync per (successor, chain version): `SyncStart`, dump both sides,
//! plan with the rules of [`crate::sync`], transfer each chunk under its
//! lock as a full-chunk replace (or a remove; a left-over pending version
//! is sent, then committed), `SyncDone`. Each pass
//! also settles the chunks whose forward failed (`write.rs`).

use super::{StorageService, Target};
use crate::chain::{self, Successor};
use crate::craq;
use crate::error::{Result, StorageError};
use crate::metrics::SyncRunning;
use crate::sync::{self, LocalChunk, SyncAction};
use bytes::Bytes;
use fskv_chunk_engine::ReadMode;
use fskv_proto::routing::ChainRoles;
use fskv_proto::storage::{
    DumpChunkMeta, DumpChunkMetaReq, ForwardChunk, ForwardMode, ForwardReq, RecentTag, RemoteChunkMeta, RequestTag, SyncDone, SyncReq,
    SyncStart, UpdateOp,
};
use fskv_types::{ChainId, ChunkId, TargetId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, info_span, warn, Instrument};

impl StorageService {
    /// Watches routing; for every local serving target whose successor is
    /// syncing, runs one sync per (successor, chain version).
    pub(super) async fn sync_worker(self) {
        let mut rx = self.inner.routing.subscribe();
        loop {
            let routing = self.inner.routing.current();
            for me in self.target_ids() {
                if self.target(me).is_err() {
                    continue; // failed (fail-stop): it reports itself offline
                }
                let Some((chain, _)) = routing.locate_target(me) else { continue };
                let Some(succ) = chain::sync_successor(chain, me) else { continue };
                let key = (me, succ.target, chain.chain_version);
                if !self.inner.syncs.lock().insert(key) {
                    continue;
                }
                let s = self.clone();
                let (chain_id, chain_ver) = (chain.chain_id, chain.chain_version);
                let span = info_span!("sync", chain = %chain_id, target = %me, successor = %succ.target, chain_ver);
                tokio::spawn(
                    async move {
                        let result = {
                            let _running = SyncRunning::start(&s.inner.metrics);
                            s.run_sync(me, succ, chain_id, chain_ver).await
                        };
                        let outcome = if result.is_ok() { "done" } else { "failed" };
                        s.inner.metrics.syncs.get_or_create(&vec![("result", outcome.to_string())]).inc();
                        if let Err(e) = &result {
                            warn!(error = %e, "sync failed; will retry");
                            tokio::time::sleep(Duration::from_millis(s.inner.config.sync_retry_delay_ms)).await;
                            s.inner.syncs.lock().remove(&key);
                        }
                        // On success the key stays: this chain version is synced.
                    }
                    .instrument(span),
                );
            }
            self.settle_unsettled().await;
            let poll = Duration::from_millis(self.inner.config.sync_poll_ms);
            if let Ok(Err(_closed)) = tokio::time::timeout(poll, rx.changed()).await {
                // The routing source is gone (its owner stopped): nothing
                // will change any more, and looping on would spin and keep
                // the runtime from shutting down (a test that panicked with
                // a LocalCluster running hung at 200% CPU instead of failing).
                info!("routing source closed; the sync worker stops");
                return;
            }
        }
    }

    /// Recovers `succ` from `me`: sync-start, dump remote metadata, plan,
    /// transfer each chunk under its lock, sync-done.
    pub async fn run_sync(&self, me: TargetId, succ: Successor, chain_id: ChainId, chain_ver: u32) -> Result<sync::PlanSummary> {
        let target = self.target(me)?;
        // Writes admitted under an older chain version were not forwarded
        // to `succ`; they must have committed here (and so be in the dump)
        // or failed before the dump is taken (`crate::inflight`).
        let max_wait = Duration::from_millis(self.inner.config.forward_timeout_ms.saturating_mul(3));
        if let Err(running) = target.inflight.wait_older_done(chain_id, chain_ver, max_wait).await {
            return Err(StorageError::Internal(format!(
                "{running} writes of {chain_id} older than chain version {chain_ver} still running after {} ms; sync postponed",
                max_wait.as_millis()
            )));
        }
        let routing = self.inner.routing.current();
        let addr = Self::addr_of(&routing, succ.node)?;
        let mark = SyncReq { chain_id, chain_ver, from: me, target: succ.target };
        let rpc_err = |e: fskv_rpc::RpcError| StorageError::Forward { to: succ.target, status: e.to_status() };
        self.inner.rpc.call::<SyncStart>(&addr, &mark, Bytes::new(), self.call_opts()).await.map_err(rpc_err)?;
        let (remote, _) = self
            .inner
            .rpc
            .call::<DumpChunkMeta>(&addr, &DumpChunkMetaReq { target: succ.target }, Bytes::new(), self.call_opts())
            .await
            .map_err(rpc_err)?;
        let engine = target.engine.clone();
        let local = self.blocking(move || Ok(engine.dump()?)).await?;
        let plan = sync::plan_sync(&local, &remote.chunks);
        let summary = sync::summarize(&plan);
        info!(?summary, remote_chunks = remote.chunks.len(), local_chunks = local.len(), "sync plan");
        let remote_by_id: HashMap<ChunkId, RemoteChunkMeta> = remote.chunks.into_iter().collect();
        // Every planned chunk, plus local chunks that were pending-only at the
        // dump (a write may have committed them since), re-decided under the lock.
        let mut ids: Vec<ChunkId> = plan.iter().map(SyncAction::chunk).collect();
        let planned: HashSet<ChunkId> = ids.iter().copied().collect();
        ids.extend(local.iter().map(|(id, _)| *id).filter(|id| !planned.contains(id)));
        let pause_ms = self.inner.config.sync_pause_between_chunks_ms;
        for chunk in ids {
            self.sync_chunk(&target, &addr, succ, chain_id, chain_ver, chunk, remote_by_id.get(&chunk)).await?;
            if pause_ms > 0 {
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            }
        }
        self.inner.rpc.call::<SyncDone>(&addr, &mark, Bytes::new(), self.call_opts()).await.map_err(rpc_err)?;
        self.inner.last_sync.lock().insert(me, summary);
        info!("sync done");
        Ok(summary)
    }

    /// One chunk of a sync: lock, re-decide with the current local
    /// metadata, read the committed content, full-chunk replace, unlock.
    #[allow(clippy::too_many_arguments)]
    async fn sync_chunk(
        &self,
        target: &Arc<Target>,
        addr: &str,
        succ: Successor,
        chain_id: ChainId,
        chain_ver: u32,
        chunk: ChunkId,
        remote: Option<&RemoteChunkMeta>,
    ) -> Result<()> {
        let _guard = target.locks.lock(chunk).await;
        // This target is the serving tail (a syncing target's predecessor):
        // a left-over pending version here completes through the chain as
        // any write does: sent to the syncing target, then committed here.
        // Sending the older committed version instead rolled back a version
        // a former tail had committed (simulation seed 7646 at 5 ms ticks,
        // where it had been acknowledged; seed 3221, where the head later
        // committed it from a stale copy and acknowledged a retry the
        // successors never got); committing it without sending let the
        // syncing target turn serving without it (seed 403).
        let is_serving_tail = || {
            let routing = self.inner.routing.current();
            routing.chain(chain_id).and_then(|c| c.tail()).is_some_and(|t| t.target_id == target.id)
        };
        // A left-over removal goes the same way: the syncing target removes
        // the chunk, then the removal commits here.
        if let Some((version, tag, crc)) = target.engine.pending_update(chunk).filter(|_| is_serving_tail()) {
            let (mode, data) = match crc {
                None => (ForwardMode::ReplaceRemove, Bytes::new()),
                Some(_) => {
                    let chunk_chain_ver = target.engine.meta(chunk).map_or(chain_ver, |m| m.chain_ver);
                    self.full_chunk(target, chunk, version, chunk_chain_ver).await?
                }
            };
            let tag = craq::request_tag(tag);
            let recent = target.engine.meta(chunk).map_or_else(Vec::new, |m| craq::recent_tags(&m.recent_after_commit()));
            self.send_replace(target.id, addr, succ, chain_id, chain_ver, chunk, mode, tag, data, recent).await?;
            let engine = target.engine.clone();
            self.blocking(move || Ok(engine.commit(chunk, version)?)).await?;
            info!(%chunk, version, "a left-over pending version sent to the syncing successor and committed");
        }
        let current = target.engine.meta(chunk);
        let decision = sync::decide(chunk, current.as_ref().map(LocalChunk::from), remote);
        // The committed version's request tag goes with the chunk, so the
        // synced target recognises a retry of that request (seed 422: a
        // head that got the chunk by sync applied a client's retry again).
        // The tags of the older versions (`recent`) go too (below).
        let tag = current.as_ref().map_or(RequestTag::default(), |m| craq::request_tag(m.committed.tag));
        let (mode, data) = match decision {
            None | Some(SyncAction::Skip(_)) => return Ok(()),
            Some(SyncAction::Delete(_)) => (ForwardMode::ReplaceRemove, Bytes::new()),
            Some(SyncAction::Send(..)) => {
                let engine = target.engine.clone();
                let read = self.blocking(move || Ok(engine.read(chunk, 0, u64::MAX >> 1, ReadMode::CommittedOnly)?)).await?;
                let data = Bytes::from(read.data);
                let chunk_chain_ver = current.as_ref().map_or(chain_ver, |m| m.chain_ver);
                let mode = ForwardMode::FullReplace {
                    version: read.version,
                    chunk_chain_ver,
                    len_bytes: data.len() as u32,
                    crc: crc32c::crc32c(&data),
                };
                (mode, data)
            }
        };
        debug!(%chunk, ?decision, "sync transfer");
        // With the tags of the older versions: a late retry of one of them
        // is recognised on the synced target too (it may become the head).
        let recent = current.as_ref().map_or_else(Vec::new, |m| craq::recent_tags(&m.recent));
        self.send_replace(target.id, addr, succ, chain_id, chain_ver, chunk, mode, tag, data, recent).await
    }

    /// A full-chunk replace or a replace-remove of `chunk` to the syncing
    /// successor.
    #[allow(clippy::too_many_arguments)]
    async fn send_replace(
        &self,
        from: TargetId,
        addr: &str,
        succ: Successor,
        chain_id: ChainId,
        chain_ver: u32,
        chunk: ChunkId,
        mode: ForwardMode,
        tag: RequestTag,
        data: Bytes,
        recent: Vec<RecentTag>,
    ) -> Result<()> {
        let (removal, len) = (matches!(mode, ForwardMode::ReplaceRemove), data.len() as u64);
        let fwd = ForwardReq {
            chain_id,
            chain_ver,
            from,
            to: succ.target,
            chunk,
            op: UpdateOp::Remove,
            mode,
            tag: if removal { RequestTag::default() } else { tag },
            chunk_size_hint_bytes: None,
            recent: if removal { Vec::new() } else { recent },
            channel: None,
        };
        self.inner
            .rpc
            .call::<ForwardChunk>(addr, &fwd, data, self.call_opts())
            .await
            .map_err(|e| StorageError::Forward { to: succ.target, status: e.to_status() })?;
        if removal {
            self.inner.metrics.sync_chunks_removed.inc();
        } else {
            self.inner.metrics.sync_chunks_sent.inc();
            self.inner.metrics.sync_bytes_sent.inc_by(len);
        }
        Ok(())
    }
}
