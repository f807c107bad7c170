//! The CRAQ step at one target, as a pure state machine (no I/O, no clock,
//! no locks): the routing snapshot, the chunk's left-over pending version
//! and the result of every effect go in, the next effect comes out. The
//! write path (`service/write.rs`) holds the chunk's lock, executes the
//! effects and feeds their results back; it makes no routing or commit
//! decision of its own.
//!
//! A step is one write at one target: a client update at the head
//! ([`WriteStep::new`] with [`Origin::Client`]: write, truncate, remove, or
//! the write of a server-side copy), an update forwarded by the predecessor
//! (`ForwardMode::Update { version }`), or a full-chunk replace /
//! replace-remove forwarded by the predecessor (recovery of a syncing
//! target, repair of a diverged one).
//!
//! ## Transitions of [`WriteStep`]
//!
//! Every input answers exactly one [`Effect`]; `Ack` and `Fail` end the step.
//! "Full" below is `Forward(FullChunk { v })`, or `Forward(Remove)` when the
//! op is a remove.
//!
//! | phase | input | condition | effect → next phase |
//! |---|---|---|---|
//! | start | `begin(chain, left_over)` | chain not in routing | `Fail(UnknownChain)` |
//! | start | `begin` | [`chain::check_write`] rejects (stale chain version first, then membership, state, role) | `Fail(Route)` |
//! | start | `begin` | update, left-over pending of another request: the [`SettleStep`] table's first effect | `QueryTail` (the serving tail), or `CommitLeftOver` at the chain's last target → settling; a finish as below |
//! | start | `begin` | other updates | `ApplyUpdate { expected_ver, commit: is tail }` → applying |
//! | start | `begin` | replace | `ApplyReplace` → replacing |
//! | settling | `tail_answered` | the serving tail committed exactly the left-over (version and CRC; for a removal: it has no such chunk) | `CommitLeftOver { v }` → settling |
//! | settling | `tail_answered`, `left_over_committed` | settled: not committed at the serving tail (`Unresolved` or `Clean`: replaced by this update), or committed here now | `ApplyUpdate` → applying |
//! | settling | `begin`, `tail_answered`, `left_over_committed` | not settled (`SettleOutcome::Retry`: the serving tail could not be asked or holds it only pending, this target is the serving tail with a syncing target after it, the commit failed) | `Fail(Unsettled)` (retryable), `settle_later` |
//! | applying | `applied` | engine error, or an impossible outcome | `Fail` |
//! | applying | `applied` | duplicate whose version is already committed here | `Ack(duplicate)` (nothing forwarded) |
//! | applying | `applied` | tail (the engine committed at once) | `Ack` |
//! | applying | `applied` | successor serving | `Forward(Update { v })` → forwarding |
//! | applying | `applied` | successor syncing | Full → forwarding |
//! | forwarding | `forwarded(Ok)` | | `Commit { v }` → committing |
//! | forwarding | `forwarded(Err)` | `ChunkVersionMismatch` to an `Update` forward (the successor diverged) | Full → forwarding |
//! | forwarding | `forwarded(Err)` | any other error (timeout, successor gone, stale routing at the successor) | `Fail { settle_later }` |
//! | forwarding | dropped (handler cancelled) | | [`WriteStep::abandoned`]: settle later |
//! | committing | `committed` | Ok / Err | `Ack` / `Fail` |
//! | replacing | `replaced(Ok)` | a successor | `Forward(Relay)` → relaying |
//! | replacing | `replaced(Ok)` | tail | `Ack` |
//! | replacing | `replaced(Err)` | | `Fail` |
//! | relaying | `forwarded` | Ok / Err | `Ack` / `Fail` (nothing pending: no settle) |
//!
//! `settle_later` is set for an update whose forward failed: its pending
//! version may already be committed further down the chain (the ack was
//! lost), so the service remembers the chunk and settles it later with a
//! [`SettleStep`]. The same holds when the step is dropped while forwarding.
//!
//! ## Transitions of [`SettleStep`]
//!
//! Settling a left-over pending version: at the start of a write (above)
//! and in the sync worker's pass over chunks whose forward failed. A sync's
//! predecessor (the serving tail) completes its left-overs itself: it sends
//! the pending content to the syncing target, then commits it. The
//! *serving tail* is the chain's last serving target: the authority on what
//! is committed. A syncing target is never asked: its data is not the
//! authority until its sync ends (seed 2197: a syncing tail's "not
//! committed" dropped a version serving targets had committed; seed 3221: a
//! syncing target's committed version, left from before it failed, made the
//! head commit a version its serving successor did not have).
//!
//! | input | condition | effect |
//! |---|---|---|
//! | `begin(chain)` | no left-over, or it is the current request's own pending version | `Finished(Clean)` |
//! | `begin` | chain not in routing | `Finished(Retry)` |
//! | `begin` | this target is not serving (its next sync replaces the left-over) | `Finished(Clean)` |
//! | `begin` | this target is the serving tail and the chain's last writable target | `CommitLeftOver { v }` (a new tail commits what it holds pending) |
//! | `begin` | this target is the serving tail, a syncing target after it (the sync sends the left-over, then commits it) | `Finished(Retry)` |
//! | `begin` | otherwise | `QueryTail` (the serving tail) |
//! | `tail_answered(Err)` | no address, RPC failed | `Finished(Retry)` |
//! | `tail_answered(Ok)` | committed version and CRC equal the left-over's | `CommitLeftOver { v }` |
//! | `tail_answered(Ok)` | the left-over is a removal and the serving tail has no such chunk (it committed the removal) | `CommitLeftOver { v }` |
//! | `tail_answered(Ok)` | the tail holds that version only pending (it settles its own first; the query puts it in its settle pass) | `Finished(Retry)` |
//! | `tail_answered(Ok)` | the serving tail's committed version is below the left-over's (or it has no chunk): not committed there; kept pending (the next update replaces it), watched by the settle pass in case a later serving tail commits it | `Finished(Unresolved)` |
//! | `tail_answered(Ok)` | otherwise (its committed version is the left-over's with other bytes, or newer): superseded | `Finished(Clean)` |
//! | `left_over_committed` | Ok / Err | `Finished(Clean)` / `Finished(Retry)` |
//!
//! A left-over is never replaced while its fate is unknown: the next update
//! would take the same version number with other bytes, and a successor
//! that committed the left-over would keep it at that version, which sync
//! (same version: skip) never repairs. Simulation seed 3103 (5 ms ticks):
//! the head could not reach the tail, replaced a left-over its successors
//! had committed, became the chain's only target and committed the new
//! write as the same version; an acknowledged write was then missing from
//! both successors. So a write that cannot settle fails retryably, and a
//! target that has become the chain's last target commits its left-over,
//! as chain replication's new tail does (the old tail may have committed
//! it, and readers there may have seen it). With a syncing target after
//! it, the serving tail must not commit first: that target's sync may end
//! without the version and it would turn serving without a committed
//! version (seed 403: three acknowledged writes lost when the two targets
//! that had them failed). The sync sends the left-over, then commits it.
//!
//! A serving tail that holds the left-over's version only pending (its own
//! forward to a former tail was cut) makes the asker wait: it commits its
//! copy on its settle pass (as the serving tail), and the asker's next try
//! finds it committed. `QueryChunk` puts such a chunk in the tail's settle
//! pass, so it never waits for a write that may not come.
//!
//! Inputs out of order (a bug in the shell) end the step with an internal
//! error, never a panic.

use crate::chain::{self, ChainPosition, ForwardKind, Origin, Successor};
use crate::error::StorageError;
use fskv_chunk_engine::{RecentCommit, UpdateOutcome, UpdateTag};
use fskv_proto::routing::{ChainInfo, ChainRoles, PublicTargetState};
use fskv_proto::storage::{ForwardMode, ForwardReq, RecentTag, RemoteChunkMeta, RequestTag, UpdateOp};
use fskv_types::{ChainId, ErrorCode, NodeId, TargetId};

/// The engine's update tag of a request tag (one identity end to end).
pub fn engine_tag(tag: RequestTag) -> UpdateTag {
    UpdateTag { client: tag.client, request: tag.request }
}

/// The request tag of an engine's update tag (what a sync sends with a
/// version, so the synced target recognises a retry of that request).
pub fn request_tag(tag: UpdateTag) -> RequestTag {
    RequestTag { client: tag.client, request: tag.request }
}

/// The older committed versions' tags of a chunk, as a full-chunk replace
/// carries them (`ForwardReq::recent`).
pub fn recent_tags(recent: &[RecentCommit]) -> Vec<RecentTag> {
    recent.iter().map(|r| RecentTag { tag: request_tag(r.tag), version: r.version, len_bytes: r.len_bytes, crc: r.crc }).collect()
}

/// The inverse of [`recent_tags`], at the receiving target.
pub fn recent_commits(recent: &[RecentTag]) -> Vec<RecentCommit> {
    recent.iter().map(|r| RecentCommit { tag: engine_tag(r.tag), version: r.version, len_bytes: r.len_bytes, crc: r.crc }).collect()
}

/// A pending version found in the chunk when a step starts: a write's or a
/// removal's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeftOver {
    pub version: u64,
    /// The request that wrote it.
    pub tag: UpdateTag,
    /// CRC32C of its whole content; `None` for a pending removal.
    pub crc: Option<u32>,
}

impl LeftOver {
    /// From `ChunkEngine::pending_update`.
    pub fn from_pending((version, tag, crc): (u64, UpdateTag, Option<u32>)) -> Self {
        LeftOver { version, tag, crc }
    }
}

/// What a finished step answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub version: u64,
    /// Length and CRC32C of the chunk at `version` (for a replace: the ones
    /// the predecessor sent).
    pub len_bytes: u32,
    pub crc: u32,
    /// The request had been applied before (a retry).
    pub duplicate: bool,
}

/// What a forward carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// The same update with the request's data, to be applied as pending
    /// `version` (`ForwardMode::Update`).
    Update { version: u64 },
    /// The whole content of the chunk at pending `version`, read under the
    /// lock, as a full-chunk replace (`ForwardMode::FullReplace`).
    FullChunk { version: u64 },
    /// The chunk's removal (`ForwardMode::ReplaceRemove`).
    Remove,
    /// The replace this target received, passed on unchanged.
    Relay,
}

/// The next thing the shell does for a [`WriteStep`].
#[derive(Debug)]
#[must_use]
pub enum Effect {
    /// Ask `tail` for its metadata of the chunk (`QueryChunk`); feed
    /// [`WriteStep::tail_answered`].
    QueryTail { tail: TargetId, node: NodeId },
    /// Commit the left-over pending `version` locally; feed
    /// [`WriteStep::left_over_committed`].
    CommitLeftOver { version: u64 },
    /// Apply the update locally as pending `committed + 1` (a successor
    /// passes the head's version as `expected_ver`), committed at once if
    /// `commit`; feed [`WriteStep::applied`].
    ApplyUpdate { expected_ver: Option<u64>, commit: bool },
    /// Apply the received replace locally (committed at once); feed
    /// [`WriteStep::replaced`].
    ApplyReplace,
    /// Send to the successor; feed [`WriteStep::forwarded`].
    Forward { to: TargetId, node: NodeId, payload: Payload },
    /// Commit `version` locally; feed [`WriteStep::committed`].
    Commit { version: u64 },
    /// Done: answer the caller.
    Ack(Applied),
    /// Done: fail the request. `settle_later`: remember the chunk for the
    /// settle pass (its pending version may be committed down the chain).
    Fail { error: StorageError, settle_later: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An update applied as pending `committed + 1`.
    Update { expected_ver: Option<u64>, remove: bool },
    /// A full-chunk replace or replace-remove, committed at once.
    Replace { len_bytes: u32, crc: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    Settling(SettleStep),
    Applying,
    Forwarding(Payload),
    Committing,
    Replacing,
    Relaying,
    Done,
}

/// One write at one target (module doc: the transition table).
#[derive(Debug)]
pub struct WriteStep {
    chain: ChainId,
    chain_ver: u32,
    me: TargetId,
    origin: Origin,
    tag: UpdateTag,
    kind: Kind,
    successor: Option<Successor>,
    applied: Applied,
    phase: Phase,
}

impl WriteStep {
    /// The step of `req` at its `to` target, arrived from `origin` (a client
    /// write at the head is passed as a `ForwardReq` with `to` = the head
    /// and `ForwardMode::Update { version: 0 }`).
    pub fn new(origin: Origin, req: &ForwardReq) -> Self {
        let kind = match req.mode {
            ForwardMode::Update { version } => Kind::Update {
                expected_ver: match origin {
                    Origin::Client => None,
                    Origin::Predecessor(_) => Some(version),
                },
                remove: req.op == UpdateOp::Remove,
            },
            ForwardMode::FullReplace { len_bytes, crc, .. } => Kind::Replace { len_bytes, crc },
            ForwardMode::ReplaceRemove => Kind::Replace { len_bytes: 0, crc: 0 },
        };
        WriteStep {
            chain: req.chain_id,
            chain_ver: req.chain_ver,
            me: req.to,
            origin,
            tag: engine_tag(req.tag),
            kind,
            successor: None,
            applied: Applied { version: 0, len_bytes: 0, crc: 0, duplicate: false },
            phase: Phase::Start,
        }
    }

    /// Starts the step under the chunk's lock with the current routing's
    /// chain and the chunk's pending version, if any.
    pub fn begin(&mut self, chain: Option<&ChainInfo>, left_over: Option<LeftOver>) -> Effect {
        if self.phase != Phase::Start {
            return self.out_of_order("begin");
        }
        let Some(chain) = chain else {
            return self.fail(StorageError::UnknownChain(self.chain), false);
        };
        let pos: ChainPosition = match chain::check_write(chain, self.me, self.chain_ver, self.origin) {
            Ok(pos) => pos,
            Err(reject) => return self.fail(StorageError::Route { chain: self.chain, target: self.me, reject }, false),
        };
        self.successor = pos.successor;
        match self.kind {
            Kind::Replace { .. } => {
                self.phase = Phase::Replacing;
                Effect::ApplyReplace
            }
            Kind::Update { .. } => {
                let mut settle = SettleStep::new(self.me, left_over, Some(self.tag));
                let effect = settle.begin(Some(chain));
                self.settling(settle, effect)
            }
        }
    }

    /// The writable tail's metadata of the chunk (or why it could not be
    /// asked).
    pub fn tail_answered(&mut self, answer: Result<Option<RemoteChunkMeta>, StorageError>) -> Effect {
        let Phase::Settling(mut settle) = self.phase else { return self.out_of_order("tail_answered") };
        let effect = settle.tail_answered(answer);
        self.settling(settle, effect)
    }

    /// The result of [`Effect::CommitLeftOver`].
    pub fn left_over_committed(&mut self, result: Result<(), StorageError>) -> Effect {
        let Phase::Settling(mut settle) = self.phase else { return self.out_of_order("left_over_committed") };
        let effect = settle.left_over_committed(result);
        self.settling(settle, effect)
    }

    /// The result of [`Effect::ApplyUpdate`].
    pub fn applied(&mut self, outcome: Result<UpdateOutcome, StorageError>) -> Effect {
        if self.phase != Phase::Applying {
            return self.out_of_order("applied");
        }
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => return self.fail(e, false),
        };
        let version = outcome.pending_ver;
        if version == 0 || version < outcome.committed_ver {
            let detail = format!("update produced version {version} under committed {}", outcome.committed_ver);
            return self.fail(StorageError::Internal(detail), false);
        }
        self.applied = Applied { version, len_bytes: outcome.len_bytes, crc: outcome.crc, duplicate: outcome.duplicate };
        if outcome.duplicate && outcome.pending_ver == outcome.committed_ver {
            // Applied and committed here before: everything after this
            // target committed it first. Nothing to forward.
            return self.ack();
        }
        match self.successor {
            // The tail: the engine committed at once.
            None => self.ack(),
            Some(succ) => {
                let payload = match succ.kind {
                    ForwardKind::Update => Payload::Update { version },
                    ForwardKind::FullReplace => self.full_payload(),
                };
                self.forward(succ, payload)
            }
        }
    }

    /// The result of [`Effect::ApplyReplace`]: the version now committed.
    pub fn replaced(&mut self, version: Result<u64, StorageError>) -> Effect {
        if self.phase != Phase::Replacing {
            return self.out_of_order("replaced");
        }
        let version = match version {
            Ok(v) => v,
            Err(e) => return self.fail(e, false),
        };
        let Kind::Replace { len_bytes, crc } = self.kind else { return self.out_of_order("replaced") };
        self.applied = Applied { version, len_bytes, crc, duplicate: false };
        match self.successor {
            None => self.ack(),
            Some(succ) => {
                self.phase = Phase::Relaying;
                Effect::Forward { to: succ.target, node: succ.node, payload: Payload::Relay }
            }
        }
    }

    /// The successor's answer to [`Effect::Forward`] (or why it could not
    /// be sent).
    pub fn forwarded(&mut self, result: Result<(), StorageError>) -> Effect {
        match (self.phase, result) {
            (Phase::Relaying, Ok(())) => self.ack(),
            (Phase::Relaying, Err(e)) => self.fail(e, false),
            (Phase::Forwarding(_), Ok(())) => {
                self.phase = Phase::Committing;
                Effect::Commit { version: self.applied.version }
            }
            (Phase::Forwarding(Payload::Update { version }), Err(e)) if e.code() == ErrorCode::ChunkVersionMismatch => {
                tracing::warn!(version, error = %e, "successor diverged; repairing with a full-chunk replace");
                let Some(succ) = self.successor else { return self.out_of_order("forwarded") };
                let payload = self.full_payload();
                self.forward(succ, payload)
            }
            (Phase::Forwarding(_), Err(e)) => self.fail(e, true),
            _ => self.out_of_order("forwarded"),
        }
    }

    /// The result of [`Effect::Commit`].
    pub fn committed(&mut self, result: Result<(), StorageError>) -> Effect {
        if self.phase != Phase::Committing {
            return self.out_of_order("committed");
        }
        match result {
            Ok(()) => self.ack(),
            Err(e) => self.fail(e, false),
        }
    }

    /// Whether the chunk must be settled later if the step is dropped now:
    /// an update's forward is out, and the successors may commit it without
    /// this target ever learning (its handler was cancelled when the
    /// predecessor's connection closed or its deadline passed).
    pub fn abandoned(&self) -> bool {
        matches!(self.phase, Phase::Forwarding(_))
    }

    fn settling(&mut self, settle: SettleStep, effect: SettleEffect) -> Effect {
        match effect {
            SettleEffect::QueryTail { tail, node } => {
                self.phase = Phase::Settling(settle);
                Effect::QueryTail { tail, node }
            }
            SettleEffect::CommitLeftOver { version } => {
                self.phase = Phase::Settling(settle);
                Effect::CommitLeftOver { version }
            }
            // A left-over the tail never committed is replaced by this update.
            SettleEffect::Finished(SettleOutcome::Clean | SettleOutcome::Unresolved) => self.apply(),
            // Its fate unknown: replacing it would reuse its version number
            // (module doc); the client retries, and the settle pass keeps
            // trying even if no retry comes (seed 407: the head otherwise
            // kept it pending, a version behind its successors, for good).
            SettleEffect::Finished(SettleOutcome::Retry) => {
                let version = settle.left_over.map_or(0, |l| l.version);
                self.fail(StorageError::Unsettled { target: self.me, version }, true)
            }
        }
    }

    fn apply(&mut self) -> Effect {
        let Kind::Update { expected_ver, .. } = self.kind else { return self.out_of_order("apply") };
        self.phase = Phase::Applying;
        // The tail (or a one-target chain) commits right after applying:
        // one engine call, one metadata batch.
        Effect::ApplyUpdate { expected_ver, commit: self.successor.is_none() }
    }

    /// A whole-chunk forward of the applied version: a replace, or a
    /// replace-remove for a remove.
    fn full_payload(&self) -> Payload {
        match self.kind {
            Kind::Update { remove: true, .. } => Payload::Remove,
            _ => Payload::FullChunk { version: self.applied.version },
        }
    }

    fn forward(&mut self, succ: Successor, payload: Payload) -> Effect {
        self.phase = Phase::Forwarding(payload);
        Effect::Forward { to: succ.target, node: succ.node, payload }
    }

    fn ack(&mut self) -> Effect {
        self.phase = Phase::Done;
        Effect::Ack(self.applied)
    }

    fn fail(&mut self, error: StorageError, settle_later: bool) -> Effect {
        let settle_later = settle_later && matches!(self.kind, Kind::Update { .. });
        self.phase = Phase::Done;
        Effect::Fail { error, settle_later }
    }

    fn out_of_order(&mut self, input: &str) -> Effect {
        let detail = format!("CRAQ step: input {input} in phase {:?}", self.phase);
        // An update whose forward was out may be committed down the chain.
        let settle_later = self.abandoned();
        self.fail(StorageError::Internal(detail), settle_later)
    }
}

/// How a settle ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleOutcome {
    /// Nothing left to do: no left-over, another version superseded it at
    /// the serving tail, or it is committed here now.
    Clean,
    /// The tail could not be asked or the commit failed: try again later.
    Retry,
    /// The serving tail has not reached the left-over's version: it was
    /// never committed there, and stays pending here (the next update
    /// replaces it). A later serving tail may still commit it (a new tail
    /// commits what it holds pending, a sync's predecessor completes its
    /// left-overs), and then this target must follow: the settle pass
    /// watches it (`service/write.rs`).
    Unresolved,
}

/// The next thing the shell does for a [`SettleStep`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum SettleEffect {
    QueryTail { tail: TargetId, node: NodeId },
    CommitLeftOver { version: u64 },
    Finished(SettleOutcome),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SettlePhase {
    Start,
    Querying,
    Committing,
    Done,
}

/// Settles a left-over pending version: a write whose acknowledgement was
/// lost may be committed down the chain; if the serving tail committed
/// exactly that version, commit it here too, so the next update builds on
/// it instead of rolling it back (module doc: the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettleStep {
    me: TargetId,
    left_over: Option<LeftOver>,
    /// The tag of the request about to apply (its own pending version is
    /// not a left-over); `None` in the settle pass and in a sync.
    current: Option<UpdateTag>,
    phase: SettlePhase,
}

impl SettleStep {
    pub fn new(me: TargetId, left_over: Option<LeftOver>, current: Option<UpdateTag>) -> Self {
        SettleStep { me, left_over, current, phase: SettlePhase::Start }
    }

    /// Starts with the current routing's chain.
    pub fn begin(&mut self, chain: Option<&ChainInfo>) -> SettleEffect {
        if self.phase != SettlePhase::Start {
            return self.finish(SettleOutcome::Retry);
        }
        let Some(left_over) = self.left_over else { return self.finish(SettleOutcome::Clean) };
        if Some(left_over.tag) == self.current {
            return self.finish(SettleOutcome::Clean);
        }
        let Some(chain) = chain else { return self.finish(SettleOutcome::Retry) };
        let serving = |t: &&fskv_proto::routing::ChainTarget| t.state == PublicTargetState::Serving;
        if !chain.targets.iter().filter(serving).any(|t| t.target_id == self.me) {
            // Not serving: its next sync replaces the left-over (rule 4b).
            return self.finish(SettleOutcome::Clean);
        }
        let Some(tail) = chain.targets.iter().rev().find(serving) else { return self.finish(SettleOutcome::Retry) };
        if tail.target_id == self.me {
            if chain.writable_tail().is_some_and(|t| t.target_id != self.me) {
                // A syncing successor has not got it: committing here first
                // would let that target turn serving without a committed
                // version (seed 403). The sync sends it, then commits it.
                return self.finish(SettleOutcome::Retry);
            }
            // The chain's last target commits what it holds pending: a
            // former tail may have committed it (module doc).
            self.phase = SettlePhase::Committing;
            return SettleEffect::CommitLeftOver { version: left_over.version };
        }
        self.phase = SettlePhase::Querying;
        SettleEffect::QueryTail { tail: tail.target_id, node: tail.node_id }
    }

    /// The serving tail's metadata of the chunk (or why it could not be
    /// asked).
    pub fn tail_answered(&mut self, answer: Result<Option<RemoteChunkMeta>, StorageError>) -> SettleEffect {
        let (SettlePhase::Querying, Some(left_over)) = (self.phase, self.left_over) else {
            return self.finish(SettleOutcome::Retry);
        };
        match answer {
            Err(_) => self.finish(SettleOutcome::Retry),
            Ok(Some(r)) if r.committed_ver == left_over.version && Some(r.crc) == left_over.crc => {
                self.phase = SettlePhase::Committing;
                SettleEffect::CommitLeftOver { version: left_over.version }
            }
            // A removal: the serving tail no longer has the chunk, so it
            // committed the removal (it held every version committed here,
            // and no later update of the chunk passes this target before
            // the left-over is settled). Without this the removal stayed
            // pending here for good over the old committed content, which
            // the successors no longer had (simulation seeds 209, 837 and
            // 895, once the writers removed chunks).
            Ok(None) if left_over.crc.is_none() => {
                self.phase = SettlePhase::Committing;
                SettleEffect::CommitLeftOver { version: left_over.version }
            }
            // The serving tail holds that version only pending: it settles
            // its own first (it commits it, as the serving tail), then this
            // one follows (seed 133: answered "clean" here, the head kept a
            // version behind its successors for good).
            Ok(Some(r)) if r.committed_ver < left_over.version && r.pending_ver == Some(left_over.version) => {
                self.finish(SettleOutcome::Retry)
            }
            // Not committed there (yet): another target that holds it
            // pending may commit it when it becomes the serving tail (seed
            // 2566 of the first soak with the KV gateway: the head, told
            // "not committed", kept it pending; the middle, as the serving
            // tail of a sync, committed it and sent it on; the head stayed
            // a version behind its successors for good).
            Ok(r) if r.as_ref().map_or(0, |r| r.committed_ver) < left_over.version => self.finish(SettleOutcome::Unresolved),
            Ok(_) => self.finish(SettleOutcome::Clean),
        }
    }

    /// The result of [`SettleEffect::CommitLeftOver`].
    pub fn left_over_committed(&mut self, result: Result<(), StorageError>) -> SettleEffect {
        match (self.phase, result) {
            (SettlePhase::Committing, Ok(())) => self.finish(SettleOutcome::Clean),
            _ => self.finish(SettleOutcome::Retry),
        }
    }

    fn finish(&mut self, outcome: SettleOutcome) -> SettleEffect {
        self.phase = SettlePhase::Done;
        SettleEffect::Finished(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::RouteReject;
    use fskv_chunk_engine::ChunkError;
    use fskv_proto::routing::{ChainTarget, PublicTargetState};
    use fskv_types::{ChunkId, InodeId, Status};
    use PublicTargetState::*;

    const CHAIN: ChainId = ChainId(7);
    const VER: u32 = 5;
    const TAG: RequestTag = RequestTag { client: 1, request: 42 };
    const OTHER: UpdateTag = UpdateTag { client: 2, request: 9 };

    /// Targets 1, 2, 3… on nodes 11, 12, 13…, at chain version 5.
    fn chain(states: &[PublicTargetState]) -> ChainInfo {
        ChainInfo {
            chain_id: CHAIN,
            chain_version: VER,
            targets: states
                .iter()
                .enumerate()
                .map(|(i, &state)| ChainTarget { target_id: TargetId(i as u64 + 1), node_id: NodeId(i as u32 + 11), state })
                .collect(),
        }
    }

    fn req(to: u64, from: u64, op: UpdateOp, mode: ForwardMode) -> ForwardReq {
        ForwardReq {
            chain_id: CHAIN,
            chain_ver: VER,
            from: TargetId(from),
            to: TargetId(to),
            chunk: ChunkId::new(InodeId(3), 0),
            op,
            mode,
            tag: TAG,
            chunk_size_hint_bytes: None,
            recent: Vec::new(),
            channel: None,
        }
    }

    const WRITE: UpdateOp = UpdateOp::Write { offset_bytes: 0, len_bytes: 4, crc: 0xabcd };

    /// A client write at target `to`.
    fn client(to: u64) -> WriteStep {
        WriteStep::new(Origin::Client, &req(to, to, WRITE, ForwardMode::Update { version: 0 }))
    }

    /// An update forwarded from `from` to `to` as pending `version`.
    fn forwarded(to: u64, from: u64, version: u64) -> WriteStep {
        WriteStep::new(Origin::Predecessor(TargetId(from)), &req(to, from, WRITE, ForwardMode::Update { version }))
    }

    fn outcome(pending_ver: u64, committed_ver: u64, duplicate: bool) -> Result<UpdateOutcome, StorageError> {
        Ok(UpdateOutcome { pending_ver, committed_ver, len_bytes: 4, crc: 0xabcd, in_place: false, duplicate })
    }

    fn forward_err(code: ErrorCode) -> StorageError {
        StorageError::Forward { to: TargetId(2), status: Status::new(code, "from the successor") }
    }

    fn remote(committed_ver: u64, crc: u32) -> RemoteChunkMeta {
        RemoteChunkMeta { chain_ver: VER, committed_ver, pending_ver: None, len_bytes: 4, crc }
    }

    fn ack(version: u64, duplicate: bool) -> Applied {
        Applied { version, len_bytes: 4, crc: 0xabcd, duplicate }
    }

    #[track_caller]
    fn assert_ack(e: Effect, expected: Applied) {
        match e {
            Effect::Ack(a) => assert_eq!(a, expected),
            other => panic!("expected Ack({expected:?}), got {other:?}"),
        }
    }

    #[track_caller]
    fn assert_fail(e: Effect, code: ErrorCode, settle: bool) -> StorageError {
        match e {
            Effect::Fail { error, settle_later } => {
                assert_eq!((error.code(), settle_later), (code, settle), "{error}");
                error
            }
            other => panic!("expected Fail({code:?}), got {other:?}"),
        }
    }

    #[track_caller]
    fn assert_forward(e: Effect, to: u64, payload: Payload) {
        match e {
            Effect::Forward { to: t, node, payload: p } => {
                assert_eq!((t, node, p), (TargetId(to), NodeId(to as u32 + 10), payload));
            }
            other => panic!("expected Forward to {to}, got {other:?}"),
        }
    }

    #[track_caller]
    fn assert_apply(e: Effect, expected_ver: Option<u64>, commit: bool) {
        match e {
            Effect::ApplyUpdate { expected_ver: x, commit: c } => assert_eq!((x, c), (expected_ver, commit)),
            other => panic!("expected ApplyUpdate, got {other:?}"),
        }
    }

    #[test]
    fn head_applies_forwards_commits_on_the_ack_and_answers() {
        let c = chain(&[Serving, Serving, Serving]);
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert!(!s.abandoned());
        assert_forward(s.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });
        assert!(s.abandoned(), "a forward is out");
        assert!(matches!(s.forwarded(Ok(())), Effect::Commit { version: 3 }));
        assert!(!s.abandoned());
        assert_ack(s.committed(Ok(())), ack(3, false));
        assert!(!s.abandoned());
    }

    #[test]
    fn middle_passes_the_heads_version_on_and_the_tail_commits_at_once() {
        let c = chain(&[Serving, Serving, Serving]);
        let mut mid = forwarded(2, 1, 3);
        assert_apply(mid.begin(Some(&c), None), Some(3), false);
        assert_forward(mid.applied(outcome(3, 2, false)), 3, Payload::Update { version: 3 });
        let mut tail = forwarded(3, 2, 3);
        assert_apply(tail.begin(Some(&c), None), Some(3), true);
        assert_ack(tail.applied(outcome(3, 3, false)), ack(3, false));
        // A one-target chain: the head is the tail.
        let one = chain(&[Serving]);
        let mut s = client(1);
        assert_apply(s.begin(Some(&one), None), None, true);
        assert_ack(s.applied(outcome(1, 1, false)), ack(1, false));
    }

    #[test]
    fn stale_chain_version_and_wrong_roles_are_refused_before_any_effect() {
        let c = chain(&[Serving, Serving, Offline]);
        let mut stale =
            WriteStep::new(Origin::Client, &ForwardReq { chain_ver: VER - 1, ..req(1, 1, WRITE, ForwardMode::Update { version: 0 }) });
        let e = assert_fail(stale.begin(Some(&c), None), ErrorCode::StaleChainVersion, false);
        assert!(matches!(e, StorageError::Route { reject: RouteReject::StaleChainVersion { request: 4, current: 5 }, .. }));
        // Stale first: even at a target that would also be refused otherwise.
        let mut stale_offline =
            WriteStep::new(Origin::Client, &ForwardReq { chain_ver: VER + 1, ..req(3, 3, WRITE, ForwardMode::Update { version: 0 }) });
        assert_fail(stale_offline.begin(Some(&c), None), ErrorCode::StaleChainVersion, false);
        let e = assert_fail(client(2).begin(Some(&c), None), ErrorCode::TargetNotServing, false);
        assert!(matches!(e, StorageError::Route { reject: RouteReject::NotHead, .. }));
        let e = assert_fail(forwarded(2, 3, 1).begin(Some(&c), None), ErrorCode::TargetNotServing, false);
        assert!(matches!(e, StorageError::Route { reject: RouteReject::WrongPredecessor { .. }, .. }));
        let e = assert_fail(client(3).begin(Some(&c), None), ErrorCode::TargetNotServing, false);
        assert!(matches!(e, StorageError::Route { reject: RouteReject::NotServing { state: Offline }, .. }));
        let e = assert_fail(client(1).begin(None, None), ErrorCode::TargetNotServing, false);
        assert!(matches!(e, StorageError::UnknownChain(CHAIN)));
    }

    #[test]
    fn crash_after_apply_before_forward_leaves_a_left_over_the_next_write_settles_with_the_tail() {
        let c = chain(&[Serving, Serving, Serving]);
        // The first write applied pending v3 at the head, then the process
        // crashed before forwarding (the step is gone, the pending stays).
        {
            let mut first = client(1);
            assert_apply(first.begin(Some(&c), None), None, false);
            assert_forward(first.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });
        }
        let left_over = Some(LeftOver { version: 3, tag: OTHER, crc: Some(0x1111) });

        // Never forwarded: the tail has v2; the next write replaces the left-over.
        let mut next = client(1);
        assert!(matches!(next.begin(Some(&c), left_over), Effect::QueryTail { tail: TargetId(3), node: NodeId(13) }));
        assert!(!next.abandoned());
        assert_apply(next.tail_answered(Ok(Some(remote(2, 0x2222)))), None, false);
        assert_forward(next.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });

        // The tail never heard of the chunk: the same.
        let mut next = client(1);
        assert!(matches!(next.begin(Some(&c), left_over), Effect::QueryTail { .. }));
        assert_apply(next.tail_answered(Ok(None)), None, false);
    }

    #[test]
    fn a_left_over_the_tail_committed_is_committed_before_the_next_write() {
        let c = chain(&[Serving, Serving, Serving]);
        let left_over = Some(LeftOver { version: 3, tag: OTHER, crc: Some(0x1111) });
        let mut s = client(1);
        assert!(matches!(s.begin(Some(&c), left_over), Effect::QueryTail { tail: TargetId(3), .. }));
        assert!(matches!(s.tail_answered(Ok(Some(remote(3, 0x1111)))), Effect::CommitLeftOver { version: 3 }));
        assert_apply(s.left_over_committed(Ok(())), None, false);
        // The update now builds on v3.
        assert_forward(s.applied(outcome(4, 3, false)), 2, Payload::Update { version: 4 });
        assert!(matches!(s.forwarded(Ok(())), Effect::Commit { version: 4 }));
        assert_ack(s.committed(Ok(())), ack(4, false));

        // Same version, other content: not the left-over; never committed.
        let mut s = client(1);
        assert!(matches!(s.begin(Some(&c), left_over), Effect::QueryTail { .. }));
        assert_apply(s.tail_answered(Ok(Some(remote(3, 0x9999)))), None, false);
    }

    #[test]
    fn a_write_that_cannot_settle_a_left_over_fails_retryably_and_replaces_nothing() {
        // Seed 3103: replacing it would give its version number other bytes.
        let c = chain(&[Serving, Serving, Serving]);
        let left_over = Some(LeftOver { version: 3, tag: OTHER, crc: Some(0x1111) });
        let mut s = client(1);
        assert!(matches!(s.begin(Some(&c), left_over), Effect::QueryTail { .. }));
        let e = assert_fail(s.tail_answered(Err(StorageError::NoAddress(NodeId(13)))), ErrorCode::ChunkUncommitted, true);
        assert!(matches!(e, StorageError::Unsettled { target: TargetId(1), version: 3 }));
        let mut s = client(1);
        assert!(matches!(s.begin(Some(&c), left_over), Effect::QueryTail { .. }));
        assert!(matches!(s.tail_answered(Ok(Some(remote(3, 0x1111)))), Effect::CommitLeftOver { .. }));
        assert_fail(s.left_over_committed(Err(StorageError::Invalid("disk".into()))), ErrorCode::ChunkUncommitted, true);
        // A syncing tail is never asked (seeds 2197, 3221): the serving one is.
        let syncing = chain(&[Serving, Serving, Syncing]);
        let mut s = client(1);
        assert!(matches!(s.begin(Some(&syncing), left_over), Effect::QueryTail { tail: TargetId(2), node: NodeId(12) }));
        assert_apply(s.tail_answered(Ok(Some(remote(2, 0x1111)))), None, false);
    }

    #[test]
    fn the_tail_commits_its_left_over_first_and_a_requests_own_pending_version_is_no_left_over() {
        let c = chain(&[Serving, Serving]);
        // At the tail: nobody to ask; it commits what it holds pending (the
        // old tail may have), then applies and commits at once.
        let mut tail = forwarded(2, 1, 4);
        assert!(matches!(
            tail.begin(Some(&c), Some(LeftOver { version: 3, tag: OTHER, crc: Some(1) })),
            Effect::CommitLeftOver { version: 3 }
        ));
        assert_apply(tail.left_over_committed(Ok(())), Some(4), true);
        // Nothing pending: straight to the engine.
        let mut tail = forwarded(2, 1, 3);
        assert_apply(tail.begin(Some(&c), None), Some(3), true);
        // A one-target chain's head is its tail.
        let alone = chain(&[Serving]);
        let mut s = client(1);
        assert!(matches!(
            s.begin(Some(&alone), Some(LeftOver { version: 3, tag: OTHER, crc: Some(1) })),
            Effect::CommitLeftOver { version: 3 }
        ));
        assert_apply(s.left_over_committed(Ok(())), None, true);
        // A retry finds its own pending version: no query, forwarded again.
        let mut retry = client(1);
        let own = Some(LeftOver { version: 3, tag: engine_tag(TAG), crc: Some(1) });
        assert_apply(retry.begin(Some(&c), own), None, false);
        assert_forward(retry.applied(outcome(3, 2, true)), 2, Payload::Update { version: 3 });
        assert!(matches!(retry.forwarded(Ok(())), Effect::Commit { version: 3 }));
        assert_ack(retry.committed(Ok(())), ack(3, true));
    }

    #[test]
    fn a_retried_write_already_committed_is_acknowledged_without_forwarding() {
        let c = chain(&[Serving, Serving, Serving]);
        for (mut s, expected) in [(client(1), None), (forwarded(2, 1, 3), Some(3))] {
            assert_apply(s.begin(Some(&c), None), expected, false);
            assert_ack(s.applied(outcome(3, 3, true)), ack(3, true));
            assert!(!s.abandoned());
        }
    }

    #[test]
    fn a_failed_or_timed_out_forward_fails_the_write_and_leaves_the_chunk_to_settle() {
        let c = chain(&[Serving, Serving, Serving]);
        for code in [ErrorCode::DeadlineExceeded, ErrorCode::ConnectionFailed, ErrorCode::TargetNotServing] {
            let mut s = client(1);
            assert_apply(s.begin(Some(&c), None), None, false);
            assert_forward(s.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });
            assert_fail(s.forwarded(Err(forward_err(code))), code, true);
            assert!(!s.abandoned());
        }
        // The successor had no address yet.
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_forward(s.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });
        assert_fail(s.forwarded(Err(StorageError::NoAddress(NodeId(12)))), ErrorCode::TargetNotServing, true);
    }

    #[test]
    fn successor_changed_mid_forward_passes_its_code_through_and_settles_later() {
        // The successor's routing moved on while the forward was out: it
        // answers StaleChainVersion (or refuses this target as predecessor);
        // the client refreshes and retries, the chunk is settled meanwhile.
        let c = chain(&[Serving, Serving, Serving]);
        for code in [ErrorCode::StaleChainVersion, ErrorCode::TargetNotServing] {
            let mut s = forwarded(2, 1, 3);
            assert_apply(s.begin(Some(&c), None), Some(3), false);
            assert_forward(s.applied(outcome(3, 2, false)), 3, Payload::Update { version: 3 });
            assert_fail(s.forwarded(Err(forward_err(code))), code, true);
        }
    }

    #[test]
    fn a_step_dropped_while_forwarding_asks_to_be_settled() {
        let c = chain(&[Serving, Serving]);
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert!(!s.abandoned(), "nothing applied yet");
        assert_forward(s.applied(outcome(1, 0, false)), 2, Payload::Update { version: 1 });
        assert!(s.abandoned());
        // After a repair attempt too.
        assert_forward(s.forwarded(Err(forward_err(ErrorCode::ChunkVersionMismatch))), 2, Payload::FullChunk { version: 1 });
        assert!(s.abandoned());
    }

    #[test]
    fn a_diverged_successor_is_repaired_with_a_full_chunk_replace() {
        let c = chain(&[Serving, Serving, Serving]);
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_forward(s.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });
        assert_forward(s.forwarded(Err(forward_err(ErrorCode::ChunkVersionMismatch))), 2, Payload::FullChunk { version: 3 });
        assert!(matches!(s.forwarded(Ok(())), Effect::Commit { version: 3 }));
        assert_ack(s.committed(Ok(())), ack(3, false));

        // A mismatch of the replace itself is not repaired again.
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_forward(s.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });
        assert_forward(s.forwarded(Err(forward_err(ErrorCode::ChunkVersionMismatch))), 2, Payload::FullChunk { version: 3 });
        assert_fail(s.forwarded(Err(forward_err(ErrorCode::ChunkVersionMismatch))), ErrorCode::ChunkVersionMismatch, true);

        // A remove is repaired with a replace-remove.
        let mut s = WriteStep::new(Origin::Client, &req(1, 1, UpdateOp::Remove, ForwardMode::Update { version: 0 }));
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_forward(s.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });
        assert_forward(s.forwarded(Err(forward_err(ErrorCode::ChunkVersionMismatch))), 2, Payload::Remove);
    }

    #[test]
    fn a_syncing_successor_gets_the_whole_chunk() {
        let c = chain(&[Serving, Serving, Syncing, Offline]);
        let mut s = forwarded(2, 1, 3);
        assert_apply(s.begin(Some(&c), None), Some(3), false);
        assert_forward(s.applied(outcome(3, 2, false)), 3, Payload::FullChunk { version: 3 });
        assert!(matches!(s.forwarded(Ok(())), Effect::Commit { version: 3 }));
        assert_ack(s.committed(Ok(())), ack(3, false));
        // A remove goes as a replace-remove.
        let mut s = WriteStep::new(Origin::Predecessor(TargetId(1)), &req(2, 1, UpdateOp::Remove, ForwardMode::Update { version: 3 }));
        assert_apply(s.begin(Some(&c), None), Some(3), false);
        assert_forward(s.applied(outcome(3, 2, false)), 3, Payload::Remove);
    }

    #[test]
    fn a_replace_is_committed_at_once_and_relayed_unchanged() {
        let full = ForwardMode::FullReplace { version: 8, chunk_chain_ver: 4, len_bytes: 10, crc: 0x77 };
        // At the syncing tail.
        let c = chain(&[Serving, Serving, Syncing]);
        let mut s = WriteStep::new(Origin::Predecessor(TargetId(2)), &req(3, 2, UpdateOp::Remove, full));
        assert!(matches!(s.begin(Some(&c), Some(LeftOver { version: 3, tag: OTHER, crc: Some(1) })), Effect::ApplyReplace));
        assert_ack(s.replaced(Ok(8)), Applied { version: 8, len_bytes: 10, crc: 0x77, duplicate: false });
        // At a middle target (divergence repair): relayed; a failure is not
        // settled later (nothing pending here).
        let c = chain(&[Serving, Serving, Serving]);
        let mut s = WriteStep::new(Origin::Predecessor(TargetId(1)), &req(2, 1, UpdateOp::Remove, full));
        assert!(matches!(s.begin(Some(&c), None), Effect::ApplyReplace));
        assert_forward(s.replaced(Ok(8)), 3, Payload::Relay);
        assert!(!s.abandoned());
        assert_fail(s.forwarded(Err(forward_err(ErrorCode::ChunkVersionMismatch))), ErrorCode::ChunkVersionMismatch, false);
        let mut s = WriteStep::new(Origin::Predecessor(TargetId(1)), &req(2, 1, UpdateOp::Remove, ForwardMode::ReplaceRemove));
        assert!(matches!(s.begin(Some(&c), None), Effect::ApplyReplace));
        assert_forward(s.replaced(Ok(4)), 3, Payload::Relay);
        assert_ack(s.forwarded(Ok(())), Applied { version: 4, len_bytes: 0, crc: 0, duplicate: false });
        // A replace from a target that is not the predecessor is refused.
        let mut s = WriteStep::new(Origin::Predecessor(TargetId(1)), &req(3, 1, UpdateOp::Remove, full));
        assert_fail(s.begin(Some(&c), None), ErrorCode::TargetNotServing, false);
    }

    #[test]
    fn engine_failures_end_the_step_without_settling() {
        let c = chain(&[Serving, Serving]);
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        let e = StorageError::Engine(ChunkError::VersionMismatch {
            chunk: ChunkId::new(InodeId(3), 0),
            detail: "expected 3, committed 5".into(),
        });
        assert_fail(s.applied(Err(e)), ErrorCode::ChunkVersionMismatch, false);
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_forward(s.applied(outcome(3, 2, false)), 2, Payload::Update { version: 3 });
        assert!(matches!(s.forwarded(Ok(())), Effect::Commit { .. }));
        assert_fail(s.committed(Err(StorageError::Internal("disk".into()))), ErrorCode::Internal, false);
        // An impossible outcome is an error, not a panic.
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_fail(s.applied(outcome(2, 3, false)), ErrorCode::Internal, false);
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_fail(s.applied(outcome(0, 0, false)), ErrorCode::Internal, false);
        let mut s = WriteStep::new(Origin::Predecessor(TargetId(1)), &req(2, 1, WRITE, ForwardMode::ReplaceRemove));
        assert!(matches!(s.begin(Some(&c), None), Effect::ApplyReplace));
        assert_fail(s.replaced(Err(StorageError::Internal("disk".into()))), ErrorCode::Internal, false);
    }

    #[test]
    fn inputs_out_of_order_are_internal_errors() {
        let c = chain(&[Serving, Serving]);
        let mut s = client(1);
        assert_fail(s.committed(Ok(())), ErrorCode::Internal, false);
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_fail(s.begin(Some(&c), None), ErrorCode::Internal, false);
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_fail(s.tail_answered(Ok(None)), ErrorCode::Internal, false);
        // Out of order while a forward is out: still settled later.
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_forward(s.applied(outcome(1, 0, false)), 2, Payload::Update { version: 1 });
        assert_fail(s.replaced(Ok(1)), ErrorCode::Internal, true);
        // A finished step takes nothing more.
        let mut s = client(1);
        assert_apply(s.begin(Some(&c), None), None, false);
        assert_forward(s.applied(outcome(1, 0, false)), 2, Payload::Update { version: 1 });
        assert!(matches!(s.forwarded(Ok(())), Effect::Commit { .. }));
        assert_ack(s.committed(Ok(())), Applied { version: 1, len_bytes: 4, crc: 0xabcd, duplicate: false });
        assert_fail(s.forwarded(Ok(())), ErrorCode::Internal, false);
    }

    #[test]
    fn settle_pass_table() {
        let c = chain(&[Serving, Serving, Syncing]);
        let lo = Some(LeftOver { version: 3, tag: OTHER, crc: Some(0x1111) });
        let finished = |o| SettleEffect::Finished(o);
        // No left-over; the current request's own pending version.
        assert_eq!(SettleStep::new(TargetId(1), None, None).begin(Some(&c)), finished(SettleOutcome::Clean));
        assert_eq!(SettleStep::new(TargetId(1), lo, Some(OTHER)).begin(Some(&c)), finished(SettleOutcome::Clean));
        // Unknown chain: later.
        assert_eq!(SettleStep::new(TargetId(1), lo, None).begin(None), finished(SettleOutcome::Retry));
        // Not serving (syncing, offline, not in the chain): its sync replaces it.
        assert_eq!(SettleStep::new(TargetId(3), lo, None).begin(Some(&c)), finished(SettleOutcome::Clean));
        let down = chain(&[Offline, Waiting]);
        assert_eq!(SettleStep::new(TargetId(1), lo, None).begin(Some(&down)), finished(SettleOutcome::Clean));
        assert_eq!(SettleStep::new(TargetId(9), lo, None).begin(Some(&c)), finished(SettleOutcome::Clean));
        // The serving tail has nobody to ask: as the chain's last target it
        // commits its left-over; with a syncing target behind it, it waits
        // for the sync to send it (seed 403).
        let mut s = SettleStep::new(TargetId(2), lo, None);
        assert_eq!(s.begin(Some(&chain(&[Serving, Serving, Offline]))), SettleEffect::CommitLeftOver { version: 3 });
        assert_eq!(s.left_over_committed(Ok(())), finished(SettleOutcome::Clean));
        assert_eq!(SettleStep::new(TargetId(2), lo, None).begin(Some(&c)), finished(SettleOutcome::Retry));
        // Others ask the serving tail, never a syncing one.
        let mut s = SettleStep::new(TargetId(1), lo, None);
        assert_eq!(s.begin(Some(&c)), SettleEffect::QueryTail { tail: TargetId(2), node: NodeId(12) });
        assert_eq!(s.tail_answered(Err(StorageError::NoAddress(NodeId(12)))), finished(SettleOutcome::Retry));
        // The serving tail without it: not committed there; watched.
        let mut s = SettleStep::new(TargetId(1), lo, None);
        let _ = s.begin(Some(&c));
        assert_eq!(s.tail_answered(Ok(Some(remote(2, 0x1111)))), finished(SettleOutcome::Unresolved));
        let mut s = SettleStep::new(TargetId(1), lo, None);
        let _ = s.begin(Some(&c));
        assert_eq!(s.tail_answered(Ok(None)), finished(SettleOutcome::Unresolved));
        // A newer committed version there: superseded.
        let mut s = SettleStep::new(TargetId(1), lo, None);
        let _ = s.begin(Some(&c));
        assert_eq!(s.tail_answered(Ok(Some(remote(4, 0x1111)))), finished(SettleOutcome::Clean));
        // The serving tail holds it only pending: later (seed 133).
        let mut s = SettleStep::new(TargetId(1), lo, None);
        let _ = s.begin(Some(&c));
        let pending_there = RemoteChunkMeta { pending_ver: Some(3), ..remote(2, 0x9999) };
        assert_eq!(s.tail_answered(Ok(Some(pending_there))), finished(SettleOutcome::Retry));
        // The same version with other bytes is not the left-over.
        let mut s = SettleStep::new(TargetId(1), lo, None);
        let _ = s.begin(Some(&c));
        assert_eq!(s.tail_answered(Ok(Some(remote(3, 0x2222)))), finished(SettleOutcome::Clean));
        // Committed there: committed here.
        let mut s = SettleStep::new(TargetId(1), lo, None);
        let _ = s.begin(Some(&c));
        assert_eq!(s.tail_answered(Ok(Some(remote(3, 0x1111)))), SettleEffect::CommitLeftOver { version: 3 });
        assert_eq!(s.left_over_committed(Ok(())), finished(SettleOutcome::Clean));
        let mut s = SettleStep::new(TargetId(1), lo, None);
        let _ = s.begin(Some(&c));
        let _ = s.tail_answered(Ok(Some(remote(3, 0x1111))));
        assert_eq!(s.left_over_committed(Err(StorageError::Internal("disk".into()))), finished(SettleOutcome::Retry));
        // Out of order.
        let mut s = SettleStep::new(TargetId(1), lo, None);
        assert_eq!(s.left_over_committed(Ok(())), finished(SettleOutcome::Retry));
    }

    #[test]
    fn a_left_over_removal_is_settled_as_a_write_is() {
        let c = chain(&[Serving, Serving, Syncing]);
        let removal = Some(LeftOver { version: 3, tag: OTHER, crc: None });
        let finished = |o| SettleEffect::Finished(o);
        // The serving tail no longer has the chunk: it committed the
        // removal, so it commits here (seeds 209, 837, 895).
        let mut s = SettleStep::new(TargetId(1), removal, None);
        assert_eq!(s.begin(Some(&c)), SettleEffect::QueryTail { tail: TargetId(2), node: NodeId(12) });
        assert_eq!(s.tail_answered(Ok(None)), SettleEffect::CommitLeftOver { version: 3 });
        assert_eq!(s.left_over_committed(Ok(())), finished(SettleOutcome::Clean));
        // It still has the version before: not committed there; watched.
        let mut s = SettleStep::new(TargetId(1), removal, None);
        let _ = s.begin(Some(&c));
        assert_eq!(s.tail_answered(Ok(Some(remote(2, 0x1111)))), finished(SettleOutcome::Unresolved));
        // It holds the removal pending: later.
        let mut s = SettleStep::new(TargetId(1), removal, None);
        let _ = s.begin(Some(&c));
        let pending_there = RemoteChunkMeta { pending_ver: Some(3), ..remote(2, 0x1111) };
        assert_eq!(s.tail_answered(Ok(Some(pending_there))), finished(SettleOutcome::Retry));
        // The chain's last target commits it; with a syncing target after it, it waits.
        let mut s = SettleStep::new(TargetId(2), removal, None);
        assert_eq!(s.begin(Some(&chain(&[Serving, Serving, Offline]))), SettleEffect::CommitLeftOver { version: 3 });
        assert_eq!(SettleStep::new(TargetId(2), removal, None).begin(Some(&c)), finished(SettleOutcome::Retry));
        // A pending write is not settled by an absent chunk at the tail.
        let mut s = SettleStep::new(TargetId(1), Some(LeftOver { version: 3, tag: OTHER, crc: Some(0) }), None);
        let _ = s.begin(Some(&c));
        assert_eq!(s.tail_answered(Ok(None)), finished(SettleOutcome::Unresolved));
    }
}
