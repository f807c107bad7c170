//! The write path: `WriteChunk`, `ForwardChunk`, `CopyRange` and
//! `RemoveChunks`, and the settle pass. A write is checked (routing before
//! anything else, then the payload), then runs as one CRAQ step
//! ([`crate::craq::WriteStep`]) under the chunk's lock: [`StorageService::run_step`]
//! executes the step's effects — engine calls, forwards, queries to the
//! tail — and feeds their results back. It makes no routing or commit
//! decision of its own; the step's module doc has the transition table.
//!
//! A step that fails its forward (or is cancelled while the forward is out)
//! leaves the chunk to the settle pass ([`StorageService::settle_unsettled`],
//! run by the sync worker): its pending version may be committed down the
//! chain, and a [`SettleStep`] commits it here once the tail shows it.

use super::{StorageService, Target};
use crate::chain::Origin;
use crate::channels::{ChannelTable, Seen};
use crate::craq::{self, engine_tag, Applied, Effect, LeftOver, Payload, SettleEffect, SettleOutcome, SettleStep, WriteStep};
use crate::error::{Result, StorageError};
use bytes::{Bytes, BytesMut};
use fskv_chunk_engine::{ChunkEngine, ReadMode, RecentCommit, UpdateKind, UpdateOptions, UpdateOutcome, UpdateRequest, UpdateTag};
use fskv_proto::routing::RoutingInfo;
use fskv_proto::storage::{
    CopyRangeReq, CopyRangeResp, CopySource, ForwardChunk, ForwardMode, ForwardReq, ForwardResp, QueryChunk, QueryChunkReq,
    RemoteChunkMeta, RemoveChunksReq, RemoveChunksResp, UpdateOp, WriteReq, WriteResp, MAX_WRITE_CHANNELS,
};
use fskv_types::{ChainId, ChunkId, NodeId, Status, TargetId};
use std::sync::Arc;
use tracing::{debug, info, info_span, warn, Instrument};

/// Most chunks remembered for settling after failed forwards.
const MAX_UNSETTLED_CHUNKS: usize = 65_536;
/// Bound on watched left-overs (`SettleOutcome::Unresolved`); past it a
/// new one is not watched (its next update settles it).
const MAX_WATCHED_LEFT_OVERS: usize = 65_536;
/// A watched left-over is asked about again this long after its chain
/// changed (a new tail, a sync's end), then at twice the last interval, up
/// to [`WATCH_MAX_INTERVAL_MS`].
const WATCH_FIRST_INTERVAL_MS: u64 = 500;
const WATCH_MAX_INTERVAL_MS: u64 = 60_000;

/// A watched left-over: when to ask the serving tail again, the interval
/// that led there, and the chain version it was last asked at.
#[derive(Clone, Copy, Debug)]
pub(super) struct Watch {
    next_check: tokio::time::Instant,
    interval_ms: u64,
    chain_ver: u32,
}

/// Largest range one `CopyRange` copies: the largest chunk, which is also
/// the largest write the chunk engine takes.
pub const MAX_COPY_BYTES: u64 = fskv_chunk_engine::MAX_CHUNK_BYTES;

/// Rejects a copy whose source or destination range does not fit a chunk.
fn check_copy_bounds(req: &CopyRangeReq) -> Result<()> {
    let len = u64::from(req.src.len_bytes);
    if len == 0 || len > MAX_COPY_BYTES {
        return Err(StorageError::Invalid(format!("copy of {len} bytes: must be 1..={MAX_COPY_BYTES}")));
    }
    for (what, offset) in [("source", req.src.offset_bytes), ("destination", req.offset_bytes)] {
        if offset.checked_add(len).is_none_or(|end| end > MAX_COPY_BYTES) {
            return Err(StorageError::Invalid(format!("copy {what} range {offset}+{len} exceeds the {MAX_COPY_BYTES}-byte chunk limit")));
        }
    }
    Ok(())
}

/// The length half of `check_payload`, for an update's payload: the chunk
/// engine checks its CRC in the checksum pass it makes anyway
/// (`UpdateOptions::data_crc`), so the payload is not read twice.
fn check_payload_len(chunk: ChunkId, payload: &[u8], len_bytes: u32) -> Result<()> {
    if payload.len() != len_bytes as usize {
        return Err(StorageError::Invalid(format!("{chunk}: payload of {} bytes, header says {len_bytes}", payload.len())));
    }
    Ok(())
}

fn check_payload(chunk: ChunkId, payload: &[u8], len_bytes: u32, crc: u32) -> Result<()> {
    check_payload_len(chunk, payload, len_bytes)?;
    let actual = crc32c::crc32c(payload);
    if actual != crc {
        return Err(StorageError::Checksum { chunk, expected: crc, actual });
    }
    Ok(())
}

/// A running step; dropped while its forward is out (the handler was
/// cancelled), it leaves the chunk to the settle pass
/// ([`WriteStep::abandoned`]).
struct StepRun<'a> {
    service: &'a StorageService,
    key: (TargetId, ChainId, ChunkId),
    step: WriteStep,
}

impl Drop for StepRun<'_> {
    fn drop(&mut self) {
        if self.step.abandoned() {
            let (target, chain, chunk) = self.key;
            debug!(%target, %chunk, "update cancelled while forwarding; the chunk will be settled");
            self.service.remember_unsettled(target, chain, chunk);
        }
    }
}

impl StorageService {
    pub(super) async fn handle_write(&self, req: WriteReq, payload: Bytes) -> Result<WriteResp> {
        let span = info_span!("write", chain = %req.chain_id, target = %req.target, chunk = %req.chunk, request = req.tag.request);
        async move {
            let _slot = self.client_write_slot().await?;
            self.head_write(&req, payload).await
        }
        .instrument(span)
        .await
    }

    async fn client_write_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.inner.client_write_slots.acquire().await.map_err(|_| StorageError::Internal("write slots closed".into()))
    }

    /// A client write at the head (the caller holds a client write slot):
    /// routing check, payload check, then the CRAQ step. Client writes and
    /// server-side copies both go through here.
    async fn head_write(&self, req: &WriteReq, payload: Bytes) -> Result<WriteResp> {
        let target = self.target(req.target)?;
        // Stale chain version first (before touching data or locks).
        self.precheck_write(req.chain_id, req.target, req.chain_ver, Origin::Client)?;
        if let UpdateOp::Write { len_bytes, .. } = req.op {
            check_payload_len(req.chunk, &payload, len_bytes)?;
        }
        if let Some(ch) = req.channel.filter(|ch| !ChannelTable::valid(*ch)) {
            return Err(StorageError::Invalid(format!("write channel {} is not below {MAX_WRITE_CHANNELS}", ch.id)));
        }
        let fwd = ForwardReq {
            chain_id: req.chain_id,
            chain_ver: req.chain_ver,
            from: req.target,
            to: req.target,
            chunk: req.chunk,
            op: req.op,
            mode: ForwardMode::Update { version: 0 },
            tag: req.tag,
            chunk_size_hint_bytes: req.chunk_size_hint_bytes,
            recent: Vec::new(),
            channel: req.channel,
        };
        let applied = self.run_step(&target, Origin::Client, &fwd, payload).await?;
        Ok(WriteResp { version: applied.version, len_bytes: applied.len_bytes, crc: applied.crc, duplicate: applied.duplicate })
    }

    /// A server-side copy at the destination head: checks bounds and
    /// routing (stale version first, before any read), reads the source
    /// range from the source chain, then writes it as a client write would.
    pub(super) async fn handle_copy_range(&self, req: CopyRangeReq) -> Result<CopyRangeResp> {
        let span = info_span!(
            "copy_range",
            chain = %req.chain_id,
            target = %req.target,
            chunk = %req.chunk,
            src_chain = %req.src.chain_id,
            src_chunk = %req.src.chunk,
            request = req.tag.request
        );
        async move {
            check_copy_bounds(&req)?;
            let _slot = self.client_write_slot().await?;
            self.target(req.target)?;
            self.precheck_write(req.chain_id, req.target, req.chain_ver, Origin::Client)?;
            let (data, src_found_bytes) = self.read_copy_source(req.src).await?;
            let op = UpdateOp::Write { offset_bytes: req.offset_bytes, len_bytes: req.src.len_bytes, crc: crc32c::crc32c(&data) };
            let write = WriteReq {
                chain_id: req.chain_id,
                chain_ver: req.chain_ver,
                target: req.target,
                chunk: req.chunk,
                op,
                tag: req.tag,
                chunk_size_hint_bytes: req.chunk_size_hint_bytes,
                cap: None,
                channel: None,
            };
            let write = self.head_write(&write, data).await?;
            debug!(version = write.version, duplicate = write.duplicate, src_found_bytes, "copied");
            Ok(CopyRangeResp { write, src_found_bytes })
        }
        .instrument(span)
        .await
    }

    /// The committed bytes of `src` from a serving replica of its chain,
    /// zero-filled to `src.len_bytes` (a missing chunk reads as all zeros);
    /// also returns how many bytes the chunk held.
    async fn read_copy_source(&self, src: CopySource) -> Result<(Bytes, u32)> {
        let read = self.inner.peer_reader.read(src.chain_id, src.chunk, src.offset_bytes, src.len_bytes, false).await;
        let data = match read {
            Ok(r) => r.data,
            Err(e) if e.code() == fskv_types::ErrorCode::NotFound => Bytes::new(),
            Err(e) => {
                return Err(StorageError::CopySource {
                    chain: src.chain_id,
                    chunk: src.chunk,
                    status: Status::new(e.code(), e.to_string()),
                });
            }
        };
        let want = src.len_bytes as usize;
        if data.len() > want {
            return Err(StorageError::Internal(format!("{}: source read returned {} bytes for {want}", src.chunk, data.len())));
        }
        let found = data.len() as u32;
        if data.len() == want {
            return Ok((data, found));
        }
        let mut padded = BytesMut::with_capacity(want);
        padded.extend_from_slice(&data);
        padded.resize(want, 0);
        Ok((padded.freeze(), found))
    }

    pub(super) async fn handle_forward(&self, req: ForwardReq, payload: Bytes) -> Result<ForwardResp> {
        let span = info_span!("forward", chain = %req.chain_id, target = %req.to, chunk = %req.chunk, from = %req.from);
        async move {
            let target = self.target(req.to)?;
            let origin = Origin::Predecessor(req.from);
            self.precheck_write(req.chain_id, req.to, req.chain_ver, origin)?;
            match req.mode {
                ForwardMode::Update { .. } => {
                    if let UpdateOp::Write { len_bytes, .. } = req.op {
                        check_payload_len(req.chunk, &payload, len_bytes)?;
                    }
                }
                ForwardMode::FullReplace { len_bytes, crc, .. } => check_payload(req.chunk, &payload, len_bytes, crc)?,
                ForwardMode::ReplaceRemove => {}
            }
            let applied = self.run_step(&target, origin, &req, payload).await?;
            Ok(ForwardResp { committed_ver: applied.version })
        }
        .instrument(span)
        .await
    }

    /// The CRAQ step of `req` at `target` (arrived from `origin`): takes the
    /// chunk's lock, then executes the step's effects until it answers.
    async fn run_step(&self, target: &Arc<Target>, origin: Origin, req: &ForwardReq, payload: Bytes) -> Result<Applied> {
        self.run_step_inner(target, origin, req, payload).await.map_err(|e| Self::engine_error(target, e))
    }

    async fn run_step_inner(&self, target: &Arc<Target>, origin: Origin, req: &ForwardReq, payload: Bytes) -> Result<Applied> {
        // Counted before routing is read below: a sync that waits for the
        // older chain versions cannot miss this step (`crate::inflight`).
        let _inflight = target.inflight.enter(req.chain_id, req.chain_ver);
        let _guard = target.locks.lock(req.chunk).await;
        // A client write seen on its channel before (`crate::channels`),
        // decided under the lock: a first attempt still running when its
        // retry arrived has recorded its answer by now.
        let channel = req.channel.filter(|_| matches!(req.mode, ForwardMode::Update { .. }));
        if let (Some(ch), Origin::Client) = (channel, origin) {
            match self.inner.channels.check(req.tag.client, ch, req.chunk) {
                Seen::New => {}
                Seen::Duplicate(applied) => {
                    debug!(version = applied.version, seq = ch.seq, "a retry of a committed write (write channel)");
                    return Ok(applied);
                }
                Seen::Superseded { latest } => {
                    return Err(StorageError::Superseded { client: req.tag.client, channel: ch.id, seq: ch.seq, latest });
                }
            }
        }
        // Routing may have changed while we waited for the lock.
        let routing = self.inner.routing.current();
        let left_over = target.engine.pending_update(req.chunk).map(LeftOver::from_pending);
        let mut run = StepRun { service: self, key: (target.id, req.chain_id, req.chunk), step: WriteStep::new(origin, req) };
        let mut effect = run.step.begin(routing.chain(req.chain_id), left_over);
        loop {
            effect = match effect {
                Effect::QueryTail { tail, node } => {
                    let answer = self.query_tail(&routing, req.chain_id, tail, node, req.chunk).await;
                    run.step.tail_answered(answer)
                }
                Effect::CommitLeftOver { version } => {
                    let result = self.commit_left_over(target, req.chunk, version).await;
                    run.step.left_over_committed(result)
                }
                Effect::ApplyUpdate { expected_ver, commit } => {
                    let outcome = self.apply_locally(target, req, payload.clone(), expected_ver, commit).await;
                    if outcome.is_ok() {
                        self.inner.metrics.wrote(target.id, payload.len());
                    }
                    run.step.applied(outcome)
                }
                Effect::ApplyReplace => {
                    let (engine, chunk, mode, tag, data) =
                        (target.engine.clone(), req.chunk, req.mode, engine_tag(req.tag), payload.clone());
                    let recent = craq::recent_commits(&req.recent);
                    let len = data.len();
                    let version = self.blocking(move || replace_locally(&engine, chunk, mode, tag, &data, recent)).await;
                    if version.is_ok() {
                        self.inner.metrics.wrote(target.id, len);
                    }
                    run.step.replaced(version)
                }
                Effect::Forward { to, node, payload: what } => {
                    let result = self.forward(target, &routing, req, (to, node), what, &payload).await;
                    run.step.forwarded(result)
                }
                Effect::Commit { version } => {
                    let (engine, chunk) = (target.engine.clone(), req.chunk);
                    let result = self.blocking(move || Ok(engine.commit(chunk, version)?)).await;
                    run.step.committed(result.map(|_| ()))
                }
                Effect::Ack(applied) => {
                    debug!(version = applied.version, duplicate = applied.duplicate, "committed");
                    if let Some(ch) = channel {
                        self.inner.channels.record(req.tag.client, ch, req.chunk, applied);
                    }
                    return Ok(applied);
                }
                Effect::Fail { error, settle_later } => {
                    if settle_later {
                        self.remember_unsettled(target.id, req.chain_id, req.chunk);
                    }
                    return Err(error);
                }
            };
        }
    }

    /// [`crate::craq::Effect::ApplyUpdate`]: the update as pending
    /// `committed + 1` in the engine (committed at once if `commit`).
    async fn apply_locally(
        &self,
        target: &Target,
        req: &ForwardReq,
        payload: Bytes,
        expected_ver: Option<u64>,
        commit: bool,
    ) -> Result<UpdateOutcome> {
        let (engine, req) = (target.engine.clone(), req.clone());
        self.blocking(move || {
            let (kind, data_crc) = match req.op {
                UpdateOp::Write { offset_bytes, crc, .. } => (UpdateKind::Write { offset_bytes, data: &payload }, Some(crc)),
                UpdateOp::Truncate { len_bytes } => (UpdateKind::Truncate { len_bytes }, None),
                UpdateOp::Remove => (UpdateKind::Remove, None),
            };
            let update = UpdateRequest {
                chunk: req.chunk,
                chain_ver: req.chain_ver,
                kind,
                tag: engine_tag(req.tag),
                expected_ver,
                chunk_size_hint_bytes: req.chunk_size_hint_bytes,
            };
            // The engine verifies the payload's CRC (see check_payload_len).
            Ok(engine.update_with(&update, UpdateOptions { commit, data_crc })?)
        })
        .await
    }

    /// [`crate::craq::Effect::Forward`]: sends `what` to the successor `to`
    /// on `node`. A full chunk is read under the lock at the step's version.
    async fn forward(
        &self,
        target: &Target,
        routing: &RoutingInfo,
        req: &ForwardReq,
        (to, node): (TargetId, NodeId),
        what: Payload,
        data: &Bytes,
    ) -> Result<()> {
        let addr = Self::addr_of(routing, node)?;
        let (mode, data, recent) = match what {
            Payload::Update { version } => (ForwardMode::Update { version }, data.clone(), Vec::new()),
            Payload::FullChunk { version } => {
                let (mode, data) = self.full_chunk(target, req.chunk, version, req.chain_ver).await?;
                // The pending version goes as committed: the committed one
                // here joins the older versions' tags it carries.
                let recent = target.engine.meta(req.chunk).map_or_else(Vec::new, |m| craq::recent_tags(&m.recent_after_commit()));
                (mode, data, recent)
            }
            Payload::Remove => (ForwardMode::ReplaceRemove, Bytes::new(), Vec::new()),
            Payload::Relay => (req.mode, data.clone(), req.recent.clone()),
        };
        let fwd = ForwardReq { from: target.id, to, mode, recent, ..req.clone() };
        self.inner
            .rpc
            .call::<ForwardChunk>(&addr, &fwd, data, self.call_opts())
            .await
            .map(|_| ())
            .map_err(|e| StorageError::Forward { to, status: e.to_status() })
    }

    /// The whole pending content of `chunk` at `version` as a replace.
    pub(super) async fn full_chunk(&self, target: &Target, chunk: ChunkId, version: u64, chain_ver: u32) -> Result<(ForwardMode, Bytes)> {
        let engine = target.engine.clone();
        let read = self.blocking(move || Ok(engine.read(chunk, 0, u64::MAX >> 1, ReadMode::Relaxed)?)).await?;
        if read.version != version {
            return Err(StorageError::Internal(format!("{chunk}: expected pending {version} under the lock, found {}", read.version)));
        }
        let data = Bytes::from(read.data);
        let mode =
            ForwardMode::FullReplace { version, chunk_chain_ver: chain_ver, len_bytes: data.len() as u32, crc: crc32c::crc32c(&data) };
        Ok((mode, data))
    }

    /// [`crate::craq::Effect::QueryTail`]: the tail's metadata of `chunk`.
    async fn query_tail(
        &self,
        routing: &RoutingInfo,
        chain_id: ChainId,
        tail: TargetId,
        node: NodeId,
        chunk: ChunkId,
    ) -> Result<Option<RemoteChunkMeta>> {
        let addr = Self::addr_of(routing, node)?;
        let chain_ver = routing.chain(chain_id).map_or(0, |c| c.chain_version);
        let query = QueryChunkReq { target: tail, chunk, chain_ver };
        match self.inner.rpc.call::<QueryChunk>(&addr, &query, Bytes::new(), self.call_opts()).await {
            Ok((resp, _)) => Ok(resp.meta),
            Err(e) => {
                debug!(%chunk, error = %e, "cannot ask the tail about a left-over pending version");
                Err(StorageError::Forward { to: tail, status: e.to_status() })
            }
        }
    }

    /// [`crate::craq::Effect::CommitLeftOver`].
    async fn commit_left_over(&self, target: &Target, chunk: ChunkId, version: u64) -> Result<()> {
        let engine = target.engine.clone();
        match self.blocking(move || Ok(engine.commit(chunk, version)?)).await {
            Ok(_) => {
                info!(%chunk, version, "committed a left-over pending version (the tail had, or this target is the tail now)");
                Ok(())
            }
            Err(e) => {
                warn!(%chunk, version, error = %e, "could not commit a left-over pending version");
                Err(e)
            }
        }
    }

    pub(super) fn remember_unsettled(&self, target: TargetId, chain: ChainId, chunk: ChunkId) {
        let mut set = self.inner.unsettled.lock();
        if set.len() < MAX_UNSETTLED_CHUNKS {
            set.insert((target, chain, chunk));
        } else {
            warn!(%chunk, "too many chunks to settle; this one waits for its next write");
        }
    }

    /// Settles the chunks whose forwards failed (one pass; kept for the next
    /// pass only if the tail could not be asked), then the watched
    /// left-overs that are due:
    ///
    /// | outcome of a settle | unsettled chunk | watched left-over |
    /// |---|---|---|
    /// | `Clean` (no left-over, superseded, committed here now) | done | no longer watched |
    /// | `Retry` (tail not asked, commit failed) | kept for the next pass | moved to the unsettled set |
    /// | `Unresolved` (the serving tail has not committed it) | watched, first check [`WATCH_FIRST_INTERVAL_MS`] later | checked again [`WATCH_FIRST_INTERVAL_MS`] after its chain's version changes, else at twice the last interval (≤ [`WATCH_MAX_INTERVAL_MS`]) |
    ///
    /// A watched left-over's fate changes only with the chain: a target
    /// that holds it pending commits it when it becomes the serving tail,
    /// or completes it through a sync to a successor, and this target must
    /// follow. Watched chunks do not count as unsettled (a left-over that
    /// nobody ever commits stays pending until the chunk's next update).
    pub(super) async fn settle_unsettled(&self) {
        let batch = std::mem::take(&mut *self.inner.unsettled.lock());
        for (me, chain_id, chunk) in batch {
            let Ok(target) = self.target(me) else { continue };
            let _guard = target.locks.lock(chunk).await;
            match self.settle(&target, chain_id, chunk).await {
                SettleOutcome::Clean => {}
                SettleOutcome::Retry => self.remember_unsettled(me, chain_id, chunk),
                SettleOutcome::Unresolved => self.watch(me, chain_id, chunk, None),
            }
        }
        let routing = self.inner.routing.current();
        let chain_ver = |chain: ChainId| routing.chain(chain).map_or(0, |c| c.chain_version);
        let now = tokio::time::Instant::now();
        let due: Vec<((TargetId, ChainId, ChunkId), Watch)> = self
            .inner
            .watched
            .lock()
            .iter()
            .filter(|((_, chain, _), w)| now >= w.next_check || chain_ver(*chain) != w.chain_ver)
            .map(|(k, w)| (*k, *w))
            .collect();
        for ((me, chain_id, chunk), w) in due {
            self.inner.watched.lock().remove(&(me, chain_id, chunk));
            let Ok(target) = self.target(me) else { continue };
            let _guard = target.locks.lock(chunk).await;
            match self.settle(&target, chain_id, chunk).await {
                SettleOutcome::Clean => debug!(%chunk, "a watched left-over is settled"),
                SettleOutcome::Retry => self.remember_unsettled(me, chain_id, chunk),
                SettleOutcome::Unresolved => self.watch(me, chain_id, chunk, Some(w)),
            }
        }
    }

    /// Watches a left-over the serving tail had not committed (`last`: its
    /// previous watch, for the backoff).
    fn watch(&self, me: TargetId, chain_id: ChainId, chunk: ChunkId, last: Option<Watch>) {
        let chain_ver = self.inner.routing.current().chain(chain_id).map_or(0, |c| c.chain_version);
        let interval_ms = match last {
            Some(w) if w.chain_ver == chain_ver => (w.interval_ms * 2).min(WATCH_MAX_INTERVAL_MS),
            _ => WATCH_FIRST_INTERVAL_MS,
        };
        let next_check = tokio::time::Instant::now() + std::time::Duration::from_millis(interval_ms);
        let mut set = self.inner.watched.lock();
        if set.len() < MAX_WATCHED_LEFT_OVERS || set.contains_key(&(me, chain_id, chunk)) {
            set.insert((me, chain_id, chunk), Watch { next_check, interval_ms, chain_ver });
        } else {
            warn!(%chunk, "too many watched left-overs; this one waits for its next write");
        }
    }

    /// One [`SettleStep`] of `chunk` (the caller holds its lock).
    pub(super) async fn settle(&self, target: &Target, chain_id: ChainId, chunk: ChunkId) -> SettleOutcome {
        let routing = self.inner.routing.current();
        let left_over = target.engine.pending_update(chunk).map(LeftOver::from_pending);
        let mut step = SettleStep::new(target.id, left_over, None);
        let mut effect = step.begin(routing.chain(chain_id));
        loop {
            effect = match effect {
                SettleEffect::QueryTail { tail, node } => {
                    let answer = self.query_tail(&routing, chain_id, tail, node, chunk).await;
                    debug!(%chunk, ?left_over, %tail, ?answer, "settling a left-over: the serving tail's answer");
                    step.tail_answered(answer)
                }
                SettleEffect::CommitLeftOver { version } => {
                    let result = self.commit_left_over(target, chunk, version).await;
                    step.left_over_committed(result)
                }
                SettleEffect::Finished(outcome) => return outcome,
            };
        }
    }

    /// Removes chunks from the end of the file down to `from_index`, each as
    /// a replicated remove through the chain. A chunk holding only a pending
    /// version (a write whose forward failed) is removed too: the remove
    /// settles that version first (`craq.rs`), so a write whose client gave
    /// up cannot be committed after the truncate or unlink that removed its
    /// chunk and bring its bytes back (the simulation's file checker found
    /// a truncated file regrow that way).
    pub(super) async fn handle_remove_chunks(&self, req: RemoveChunksReq) -> Result<RemoveChunksResp> {
        let target = self.target(req.target)?;
        self.precheck_write(req.chain_id, req.target, req.chain_ver, Origin::Client)?;
        let mut removed = 0u32;
        let mut just_removed: Option<ChunkId> = None;
        loop {
            let engine = target.engine.clone();
            let inode = req.inode;
            let last = self.blocking(move || Ok(engine.last_chunk(inode)?)).await?;
            let Some((chunk, meta)) = last.filter(|(c, _)| c.index >= req.from_index) else {
                return Ok(RemoveChunksResp { removed, more: false });
            };
            if removed >= req.max_chunks.max(1) {
                return Ok(RemoveChunksResp { removed, more: true });
            }
            if just_removed == Some(chunk) {
                // Still here after its remove was acknowledged (a pending
                // version left in place): the caller retries.
                warn!(%chunk, committed = meta.committed_ver, "chunk still present after its removal");
                return Err(StorageError::Unsettled { target: req.target, version: meta.committed_ver });
            }
            if meta.committed_ver == 0 {
                // Only a pending version, left by a write whose forward
                // failed: settle it first. Committed down the chain → it is
                // committed here now and removed below like any chunk; never
                // committed anywhere → nobody can read it and the chain has
                // nothing to remove: drop it here (else the loop would stop
                // at it, and a length measured on this head would count it).
                let guard = target.locks.lock(chunk).await;
                if self.settle(&target, req.chain_id, chunk).await == SettleOutcome::Retry {
                    return Err(StorageError::Unsettled { target: req.target, version: 0 });
                }
                let Some(m) = target.engine.meta(chunk) else {
                    // The left-over was a removal, committed by the settle.
                    removed += 1;
                    continue;
                };
                if m.committed_ver == 0 {
                    // Made committed (empty) so that it can be removed; no
                    // request tag: neither step is a client's update.
                    let engine = target.engine.clone();
                    self.blocking(move || {
                        engine.replace(chunk, m.chain_ver, 1, &[], UpdateTag::default(), Vec::new())?;
                        engine.update_and_commit(&UpdateRequest {
                            chunk,
                            chain_ver: m.chain_ver,
                            kind: UpdateKind::Remove,
                            tag: UpdateTag::default(),
                            expected_ver: None,
                            chunk_size_hint_bytes: None,
                        })?;
                        Ok(())
                    })
                    .await?;
                    debug!(%chunk, "dropped a version never committed anywhere");
                    removed += 1;
                    continue;
                }
                drop(guard);
            }
            let fwd = ForwardReq {
                chain_id: req.chain_id,
                chain_ver: req.chain_ver,
                from: req.target,
                to: req.target,
                chunk,
                op: UpdateOp::Remove,
                mode: ForwardMode::Update { version: 0 },
                tag: req.tag,
                chunk_size_hint_bytes: None,
                recent: Vec::new(),
                channel: None,
            };
            self.run_step(&target, Origin::Client, &fwd, Bytes::new()).await?;
            removed += 1;
            just_removed = Some(chunk);
        }
    }
}

/// Applies a full-chunk replace or a replace-remove to the local engine;
/// idempotent (an equal committed version is left alone).
fn replace_locally(
    engine: &ChunkEngine,
    chunk: ChunkId,
    mode: ForwardMode,
    tag: UpdateTag,
    data: &[u8],
    recent: Vec<RecentCommit>,
) -> Result<u64> {
    match mode {
        ForwardMode::FullReplace { version, chunk_chain_ver, crc, len_bytes } => {
            let same = engine.meta(chunk).is_some_and(|m| {
                m.committed_ver == version && m.pending.is_none() && m.committed.crc == crc && m.committed.len_bytes == len_bytes
            });
            if !same {
                engine.replace(chunk, chunk_chain_ver, version, data, tag, recent)?;
            }
            Ok(version)
        }
        ForwardMode::ReplaceRemove => {
            let Some(meta) = engine.meta(chunk) else { return Ok(0) };
            if meta.committed_ver == 0 {
                // Pending only: make it committed (empty) so it can be removed.
                engine.replace(chunk, meta.chain_ver, 1, &[], tag, Vec::new())?;
            }
            let committed = engine.meta(chunk).map_or(0, |m| m.committed_ver);
            engine.update_and_commit(&UpdateRequest {
                chunk,
                chain_ver: meta.chain_ver,
                kind: UpdateKind::Remove,
                tag,
                expected_ver: None,
                chunk_size_hint_bytes: None,
            })?;
            debug_assert!(engine.meta(chunk).is_none(), "{chunk} still present after remove");
            Ok(committed + 1)
        }
        ForwardMode::Update { .. } => Err(StorageError::Invalid("update passed to replace".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::StorageConfig;
    use fskv_chunk_engine::EngineConfig;
    use fskv_client::storage::RoutingPublisher;
    use fskv_proto::routing::{ChainInfo, ChainTarget, NodeInfo, PublicTargetState};
    use fskv_proto::storage::{ForwardChunk, QueryChunk, QueryChunkResp, RequestTag};
    use fskv_rpc::{ClientConfig, Router, RpcClient, Server, ServerConfig, TcpTransport};
    use fskv_types::InodeId;
    use parking_lot::Mutex;

    /// A two-target chain whose tail (a stub server) takes forwards and
    /// never answers them (as if the ack were lost) and answers
    /// `QueryChunk` with what the test sets; a write at the head cancelled
    /// once its forward reached the tail, leaving its version pending at the
    /// head.
    struct CutForward {
        _dir: tempfile::TempDir,
        tail: Server,
        tail_meta: Arc<Mutex<Option<RemoteChunkMeta>>>,
        publisher: RoutingPublisher,
        service: StorageService,
        chunk: ChunkId,
        pending_ver: u64,
        crc: u32,
    }

    async fn cut_forward() -> CutForward {
        let dir = tempfile::tempdir().unwrap();
        let tail_meta: Arc<Mutex<Option<RemoteChunkMeta>>> = Arc::default();
        let forwarded = Arc::new(tokio::sync::Notify::new());
        let (meta, seen) = (tail_meta.clone(), forwarded.clone());
        let router = Router::new()
            .route::<ForwardChunk, _, _>(move |_ctx, _req: ForwardReq, _payload| {
                let seen = seen.clone();
                async move {
                    seen.notify_one();
                    std::future::pending::<()>().await;
                    Ok((ForwardResp { committed_ver: 0 }, Bytes::new()))
                }
            })
            .route::<QueryChunk, _, _>(move |_ctx, _req: QueryChunkReq, _payload| {
                let meta = meta.clone();
                async move { Ok((QueryChunkResp { meta: *meta.lock() }, Bytes::new())) }
            });
        let tail = Server::bind(Arc::new(TcpTransport::new()), "127.0.0.1:0", router, ServerConfig::default()).await.unwrap();
        let (publisher, handle) = RoutingPublisher::new(two_target_routing(1, tail.local_addr()));
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        let config = StorageConfig { inline_engine_io: true, ..StorageConfig::new(NodeId(1)) };
        let engine_config = EngineConfig { sync_writes: false, blocks_per_grow: 4, ..EngineConfig::default() };
        let service = StorageService::open(config, dir.path(), &[TargetId(101)], engine_config, handle, rpc).unwrap();

        let chunk = ChunkId::new(InodeId(5), 0);
        let data = Bytes::from_static(b"written");
        let req = WriteReq {
            chain_id: ChainId(1),
            chain_ver: 1,
            target: TargetId(101),
            chunk,
            op: UpdateOp::Write { offset_bytes: 0, len_bytes: data.len() as u32, crc: crc32c::crc32c(&data) },
            tag: RequestTag { client: 1, request: 1 },
            chunk_size_hint_bytes: None,
            cap: None,
            channel: None,
        };
        // Cancel the write once its forward reached the tail.
        let write = service.handle_write(req, data);
        tokio::select! {
            biased;
            _ = forwarded.notified() => {}
            r = write => panic!("the write finished: {r:?}"),
        }
        let engine = service.engine(TargetId(101)).unwrap();
        let (pending_ver, _, crc) = engine.pending_update(chunk).expect("pending after the cancelled forward");
        let crc = crc.expect("a pending write, not a removal");
        assert_eq!(engine.meta(chunk).unwrap().committed_ver, 0);
        CutForward { _dir: dir, tail, tail_meta, publisher, service, chunk, pending_ver, crc }
    }

    /// Chain 1 at `chain_version`: target 101 (here, node 1) then 201 (the
    /// stub at `tail_addr`, node 2), both serving.
    fn two_target_routing(chain_version: u32, tail_addr: &str) -> RoutingInfo {
        RoutingInfo {
            version: u64::from(chain_version),
            nodes: vec![
                NodeInfo { node_id: NodeId(1), address: "127.0.0.1:1".into() },
                NodeInfo { node_id: NodeId(2), address: tail_addr.to_string() },
            ],
            chains: vec![ChainInfo {
                chain_id: ChainId(1),
                chain_version,
                targets: vec![
                    ChainTarget { target_id: TargetId(101), node_id: NodeId(1), state: PublicTargetState::Serving },
                    ChainTarget { target_id: TargetId(201), node_id: NodeId(2), state: PublicTargetState::Serving },
                ],
            }],
            chain_tables: Vec::new(),
            meta_servers: Vec::new(),
        }
    }

    /// Found by the simulation (seed 98 of 200): the head crashed while the
    /// middle target's forward to the tail was out; the connection closed,
    /// the middle's handler was dropped with its update pending, and the
    /// tail had committed it. Nothing settled the chunk, so the new head
    /// kept the older committed version. A handler cancelled mid-forward
    /// now leaves the chunk to the settle pass, which commits it once the
    /// tail shows it committed.
    #[tokio::test]
    async fn an_update_cancelled_mid_forward_is_settled_from_the_tail() {
        let CutForward { tail, tail_meta, service, chunk, pending_ver, crc, .. } = cut_forward().await;
        let engine = service.engine(TargetId(101)).unwrap();
        // The tail committed it: the settle pass commits it here too.
        *tail_meta.lock() = Some(RemoteChunkMeta { chain_ver: 1, committed_ver: pending_ver, pending_ver: None, len_bytes: 7, crc });
        service.settle_unsettled().await;
        assert_eq!(engine.meta(chunk).unwrap().committed_ver, pending_ver, "the left-over was not settled");
        assert!(engine.pending_update(chunk).is_none());
        tail.shutdown().await;
    }

    /// Found by the simulation with the KV gateway (seed 2566 of the first
    /// soak): the serving tail had not committed a left-over when the head
    /// asked, so the head kept it pending and forgot it; later another
    /// target that held it pending became the serving tail and committed
    /// it, and the head stayed a version behind its successors for good. A
    /// left-over the tail had not committed is now watched, and asked
    /// about again when its chain changes.
    #[tokio::test]
    async fn a_left_over_the_tail_commits_later_is_followed_after_the_chain_changes() {
        let CutForward { tail, tail_meta, publisher, service, chunk, pending_ver, crc, .. } = cut_forward().await;
        let engine = service.engine(TargetId(101)).unwrap();
        // Not committed at the tail: kept pending here, and watched.
        service.settle_unsettled().await;
        assert_eq!(engine.pending_update(chunk).map(|p| p.0), Some(pending_ver));
        assert_eq!(service.unsettled_chunks(), 0);
        assert_eq!(service.watched_left_overs(), 1);
        // The chain changes and its (new) serving tail has committed it.
        *tail_meta.lock() = Some(RemoteChunkMeta { chain_ver: 2, committed_ver: pending_ver, pending_ver: None, len_bytes: 7, crc });
        publisher.publish(two_target_routing(2, tail.local_addr()));
        service.settle_unsettled().await;
        assert_eq!(engine.meta(chunk).unwrap().committed_ver, pending_ver, "the watched left-over was not followed");
        assert!(engine.pending_update(chunk).is_none());
        assert_eq!(service.watched_left_overs(), 0);
        tail.shutdown().await;
    }
}
