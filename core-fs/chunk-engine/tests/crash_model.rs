//! Property test against an in-memory model: random update / commit / read
//! / remove sequences with simulated crashes (an injected failure at a crash
//! point, then drop without graceful shutdown, then reopen).
//!
//! After every reopen each chunk must be exactly its state before the
//! interrupted operation or its state after it (committed *and* pending
//! content and versions), and the block bitmaps must equal the set of blocks
//! referenced by the metadata (no leak, no double allocation).
//!
//! The same runs under **power cuts** (the `*_power_cuts` tests): the engine
//! syncs (`sync_writes`), the power-loss model (`fskv_chunk_engine::power`)
//! remembers every unsynced block-file and journal write, and every crash is
//! preceded by a power cut that rolls each such sector back to a random
//! point of its history. Every acknowledged operation must survive exactly
//! (a crash between operations must find the model's state, not merely
//! "before or after"), and an interrupted one must be before or after.

use fskv_chunk_engine::{
    ChunkEngine, ChunkError, CrashPoint, EngineConfig, PendingState, ReadMode, UpdateKind, UpdateOptions, UpdateRequest, UpdateTag,
    MAX_CHUNK_BYTES,
};
use fskv_types::{ChunkId, InodeId};
use proptest::prelude::*;
use std::collections::BTreeMap;

const CHUNKS: u64 = 4;

#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct ChunkState {
    /// `None`: no committed content.
    committed: Option<Vec<u8>>,
    committed_ver: u64,
    /// `(version, content)`; content `None` is a pending remove.
    pending: Option<(u64, Option<Vec<u8>>)>,
}

type Model = BTreeMap<u64, ChunkState>;

#[derive(Clone, Debug)]
enum Kind {
    Append { len: usize, byte: u8 },
    WriteAt { offset: u64, len: usize, byte: u8 },
    Truncate { len: u64 },
    Remove,
}

#[derive(Clone, Debug)]
enum Op {
    Update {
        chunk: u64,
        kind: Kind,
    },
    /// The fused `update_and_commit` (one metadata batch), passing the
    /// payload's CRC for the engine to check.
    UpdateCommit {
        chunk: u64,
        kind: Kind,
    },
    /// A write whose caller-given CRC is wrong: must fail and change nothing.
    BadCrcWrite {
        chunk: u64,
        kind: Kind,
        commit: bool,
    },
    Commit {
        chunk: u64,
    },
    Read {
        chunk: u64,
    },
    /// Run `op` with a crash injected at `point` (if the op reaches it), then crash.
    CrashDuring {
        point: usize,
        op: Box<Op>,
    },
    /// Crash between operations.
    Crash,
}

const POINTS: [CrashPoint; 6] = CrashPoint::ALL;

fn kind_strategy() -> impl Strategy<Value = Kind> {
    prop_oneof![
        4 => (0usize..20_000, any::<u8>()).prop_map(|(len, byte)| Kind::Append { len, byte }),
        1 => (60_000usize..80_000, any::<u8>()).prop_map(|(len, byte)| Kind::Append { len, byte }),
        // Large enough to span several 64-entry page-table segments.
        1 => (200_000usize..300_000, any::<u8>()).prop_map(|(len, byte)| Kind::Append { len, byte }),
        3 => (0u64..70_000, 0usize..10_000, any::<u8>()).prop_map(|(offset, len, byte)| Kind::WriteAt { offset, len, byte }),
        1 => (0u64..600_000).prop_map(|len| Kind::Truncate { len }),
        1 => Just(Kind::Remove),
    ]
}

fn base_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..CHUNKS, kind_strategy()).prop_map(|(chunk, kind)| Op::Update { chunk, kind }),
        2 => (0..CHUNKS, kind_strategy()).prop_map(|(chunk, kind)| Op::UpdateCommit { chunk, kind }),
        // The chain tail's appends (in place, committed by a journal record
        // unless the journal is full).
        4 => (0..CHUNKS, 1usize..9_000, any::<u8>()).prop_map(|(chunk, len, byte)| Op::UpdateCommit { chunk, kind: Kind::Append { len, byte } }),
        1 => (0..CHUNKS, 0u64..70_000, 1usize..80_000, any::<bool>(), any::<bool>()).prop_map(|(chunk, offset, len, append, commit)| {
            let kind = if append { Kind::Append { len, byte: 5 } } else { Kind::WriteAt { offset, len, byte: 6 } };
            Op::BadCrcWrite { chunk, kind, commit }
        }),
        3 => (0..CHUNKS).prop_map(|chunk| Op::Commit { chunk }),
        2 => (0..CHUNKS).prop_map(|chunk| Op::Read { chunk }),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => base_op(),
        2 => (0..POINTS.len(), base_op()).prop_map(|(point, op)| Op::CrashDuring { point, op: Box::new(op) }),
        1 => Just(Op::Crash),
    ]
}

/// Mostly appends (a tail's, and a head's update + commit) and rare
/// crashes: long runs of journal records, so regions fill, switch,
/// checkpoint and run out of room.
fn journal_heavy_op_strategy() -> impl Strategy<Value = Op> {
    let append = || (0..CHUNKS, 1usize..9_000, any::<u8>());
    prop_oneof![
        6 => append().prop_map(|(chunk, len, byte)| Op::UpdateCommit { chunk, kind: Kind::Append { len, byte } }),
        3 => append().prop_map(|(chunk, len, byte)| Op::Update { chunk, kind: Kind::Append { len, byte } }),
        3 => (0..CHUNKS).prop_map(|chunk| Op::Commit { chunk }),
        4 => base_op(),
        1 => (0..POINTS.len(), base_op()).prop_map(|(point, op)| Op::CrashDuring { point, op: Box::new(op) }),
        1 => Just(Op::Crash),
    ]
}

fn cid(chunk: u64) -> ChunkId {
    ChunkId::new(InodeId(100), chunk)
}

/// Journal regions of the tests: small, so that regions fill, switch and
/// are checkpointed often (a record may take a quarter of a region: at 512
/// bytes no record carries appended bytes, every append syncs its block).
const SMALL_REGION_BYTES: u64 = 512;
/// Regions whose records carry the bytes of appends up to 16 KiB (then the
/// block file is not synced for the append: the record restores them).
const DATA_REGION_BYTES: u64 = 64 << 10;

/// Opens the engine; `power`: synced writes and the power-loss model on.
fn open(dir: &std::path::Path, power: bool, region_bytes: u64) -> ChunkEngine {
    let e = ChunkEngine::open(
        dir,
        EngineConfig { blocks_per_grow: 256, sync_writes: power, journal_region_bytes: region_bytes, ..EngineConfig::default() },
    )
    .expect("reopen");
    if power {
        e.enable_power_loss_model();
    }
    e
}

/// The model's result of applying an update kind to a chunk; `None` when the
/// engine must reject it (remove of a chunk without committed content).
fn apply_update(s: &ChunkState, kind: &Kind) -> Option<ChunkState> {
    let base = s.committed.clone().unwrap_or_default();
    let content = match kind {
        Kind::Remove if s.committed.is_none() => return None,
        Kind::Remove => None,
        Kind::Append { len, byte } => {
            let mut c = base;
            c.extend(std::iter::repeat_n(*byte, *len));
            Some(c)
        }
        Kind::WriteAt { offset, len, byte } => {
            let mut c = base;
            let end = *offset as usize + len;
            if c.len() < end {
                c.resize(end, 0);
            }
            c[*offset as usize..end].fill(*byte);
            Some(c)
        }
        Kind::Truncate { len } => {
            let mut c = base;
            c.resize(*len as usize, 0);
            Some(c)
        }
    };
    Some(ChunkState { pending: Some((s.committed_ver + 1, content)), ..s.clone() })
}

fn apply_commit(s: &ChunkState) -> Option<ChunkState> {
    let (ver, content) = s.pending.clone()?;
    Some(match content {
        None => ChunkState::default(),
        Some(c) => ChunkState { committed: Some(c), committed_ver: ver, pending: None },
    })
}

/// `crc_xor`: `Some(x)` passes the payload's CRC32C xor `x` as `data_crc`.
fn engine_update(e: &ChunkEngine, chunk: u64, kind: &Kind, tag: u64, commit: bool, crc_xor: Option<u32>) -> Result<(), ChunkError> {
    let len = e.meta(cid(chunk)).map_or(0, |m| m.committed.len_bytes as u64);
    let buf;
    let kind = match kind {
        Kind::Append { len: n, byte } => {
            buf = vec![*byte; *n];
            UpdateKind::Write { offset_bytes: len, data: &buf }
        }
        Kind::WriteAt { offset, len: n, byte } => {
            buf = vec![*byte; *n];
            UpdateKind::Write { offset_bytes: *offset, data: &buf }
        }
        Kind::Truncate { len } => UpdateKind::Truncate { len_bytes: *len },
        Kind::Remove => UpdateKind::Remove,
    };
    let req = UpdateRequest {
        chunk: cid(chunk),
        chain_ver: 1,
        kind,
        tag: UpdateTag { client: 7, request: tag },
        expected_ver: None,
        chunk_size_hint_bytes: None,
    };
    let data_crc = match (req.kind, crc_xor) {
        (UpdateKind::Write { data, .. }, Some(x)) => Some(crc32c::crc32c(data) ^ x),
        _ => None,
    };
    let out = e.update_with(&req, UpdateOptions { commit, data_crc })?;
    if commit {
        assert_eq!(out.pending_ver, out.committed_ver, "fused op left a pending version");
    }
    Ok(())
}

/// The full state of a chunk as the engine reports it.
fn engine_state(e: &ChunkEngine, chunk: u64) -> ChunkState {
    let Some(meta) = e.meta(cid(chunk)) else { return ChunkState::default() };
    let committed =
        (meta.committed_ver > 0).then(|| e.read(cid(chunk), 0, MAX_CHUNK_BYTES, ReadMode::CommittedOnly).expect("committed read").data);
    let pending = meta.pending.as_ref().map(|(ver, state)| {
        let content = match state {
            PendingState::Removed { .. } => None,
            PendingState::Data(_) => Some(e.read(cid(chunk), 0, MAX_CHUNK_BYTES, ReadMode::Relaxed).expect("relaxed read").data),
        };
        (*ver, content)
    });
    ChunkState { committed, committed_ver: meta.committed_ver, pending }
}

fn check_strict_read(e: &ChunkEngine, chunk: u64, s: &ChunkState) -> Result<(), TestCaseError> {
    let r = e.read(cid(chunk), 0, MAX_CHUNK_BYTES, ReadMode::Strict);
    match (&s.pending, &s.committed, r) {
        (Some(_), _, Err(ChunkError::Uncommitted { .. })) => {}
        (None, None, Err(ChunkError::NotFound(_))) => {}
        (None, Some(c), Ok(r)) => {
            prop_assert_eq!(&r.data, c);
            prop_assert_eq!(r.version, s.committed_ver);
        }
        (p, c, r) => prop_assert!(
            false,
            "strict read of {} gave {:?}; model pending {:?} committed len {:?}",
            chunk,
            r.map(|r| r.data.len()),
            p.as_ref().map(|p| p.0),
            c.as_ref().map(Vec::len)
        ),
    }
    Ok(())
}

struct Harness {
    dir: tempfile::TempDir,
    engine: Option<ChunkEngine>,
    model: Model,
    tag: u64,
    /// `Some(seed)`: every crash is a power cut (seeded per crash).
    power_seed: Option<u64>,
    /// Sectors the power cuts rolled back, over the case.
    sectors_lost: u64,
    region_bytes: u64,
}

impl Harness {
    /// A fresh engine in a new directory; `power_seed`: crashes are power cuts.
    fn new(power_seed: Option<u64>, region_bytes: u64) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = open(dir.path(), power_seed.is_some(), region_bytes);
        Harness { dir, engine: Some(engine), model: Model::new(), tag: 0, power_seed, sectors_lost: 0, region_bytes }
    }

    fn engine(&self) -> &ChunkEngine {
        self.engine.as_ref().expect("engine open")
    }

    /// Runs a base op against engine and model. Returns the model's state of
    /// the touched chunk before and after, or an injected-crash error.
    fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.tag += 1;
        let tag = self.tag;
        match op {
            Op::Update { chunk, kind } => {
                let before = self.model.get(chunk).cloned().unwrap_or_default();
                let r = engine_update(self.engine(), *chunk, kind, tag, false, None);
                match (apply_update(&before, kind), r) {
                    (Some(after), Ok(())) => {
                        self.model.insert(*chunk, after);
                    }
                    (None, Err(ChunkError::NotFound(_))) => {}
                    (_, Err(ChunkError::InjectedCrash(p))) => return Err(TestCaseError::reject(format!("{p:?}"))),
                    (want, got) => prop_assert!(false, "update {:?}: model {:?}, engine {:?}", kind, want.is_some(), got),
                }
            }
            Op::UpdateCommit { chunk, kind } => {
                let before = self.model.get(chunk).cloned().unwrap_or_default();
                let r = engine_update(self.engine(), *chunk, kind, tag, true, Some(0));
                match (apply_update(&before, kind).as_ref().and_then(apply_commit), r) {
                    (Some(after), Ok(())) => {
                        // Nothing pending may be left behind.
                        prop_assert!(self.engine().meta(cid(*chunk)).is_none_or(|m| m.pending.is_none()));
                        self.model.insert(*chunk, after);
                    }
                    (None, Err(ChunkError::NotFound(_))) => {}
                    (_, Err(ChunkError::InjectedCrash(p))) => return Err(TestCaseError::reject(format!("{p:?}"))),
                    (want, got) => prop_assert!(false, "update+commit {:?}: model {:?}, engine {:?}", kind, want.is_some(), got),
                }
            }
            Op::BadCrcWrite { chunk, kind, commit } => {
                match engine_update(self.engine(), *chunk, kind, tag, *commit, Some(0x8000_0001)) {
                    Err(ChunkError::ChecksumMismatch { .. }) => {}
                    Err(ChunkError::InjectedCrash(p)) => return Err(TestCaseError::reject(format!("{p:?}"))),
                    other => prop_assert!(false, "write with a wrong CRC gave {:?}", other),
                }
                let s = self.model.get(chunk).cloned().unwrap_or_default();
                prop_assert!(engine_state(self.engine(), *chunk) == s, "a rejected write changed chunk {}", chunk);
            }
            Op::Commit { chunk } => {
                let before = self.model.get(chunk).cloned().unwrap_or_default();
                let Some((ver, _)) = before.pending.clone() else { return Ok(()) };
                match self.engine().commit(cid(*chunk), ver) {
                    Ok(v) => prop_assert_eq!(v, ver),
                    Err(ChunkError::InjectedCrash(p)) => return Err(TestCaseError::reject(format!("{p:?}"))),
                    Err(e) => prop_assert!(false, "commit failed: {}", e),
                }
                let after = apply_commit(&before).expect("pending exists");
                self.model.insert(*chunk, after);
            }
            Op::Read { chunk } => {
                let s = self.model.get(chunk).cloned().unwrap_or_default();
                check_strict_read(self.engine(), *chunk, &s)?;
            }
            Op::CrashDuring { .. } | Op::Crash => unreachable!("handled by step"),
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Crash => {
                self.crash_and_reopen(&self.model.clone(), &self.model.clone())?;
            }
            Op::CrashDuring { point, op } => {
                let before = self.model.clone();
                self.engine().inject_crash(POINTS[*point]);
                let crashed = match self.run(op) {
                    Ok(()) => false,
                    Err(TestCaseError::Reject(_)) => true,
                    Err(e) => return Err(e),
                };
                let mut after = self.model.clone();
                if crashed {
                    // The model did not apply the op; compute its effect.
                    self.model = before.clone();
                    let _ = self.run_model_only(op, &mut after);
                }
                self.crash_and_reopen(&before, &after)?;
            }
            op => {
                self.run(op)?;
                self.engine().check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
        }
        Ok(())
    }

    fn run_model_only(&self, op: &Op, model: &mut Model) -> Option<()> {
        match op {
            Op::Update { chunk, kind } => {
                let s = model.get(chunk).cloned().unwrap_or_default();
                model.insert(*chunk, apply_update(&s, kind)?);
            }
            Op::Commit { chunk } => {
                let s = model.get(chunk).cloned().unwrap_or_default();
                model.insert(*chunk, apply_commit(&s)?);
            }
            Op::UpdateCommit { chunk, kind } => {
                let s = model.get(chunk).cloned().unwrap_or_default();
                model.insert(*chunk, apply_commit(&apply_update(&s, kind)?)?);
            }
            _ => {}
        }
        Some(())
    }

    /// Drops the engine without shutdown, reopens, and requires every chunk
    /// to be in its `before` or its `after` state; adopts what it finds.
    fn crash_and_reopen(&mut self, before: &Model, after: &Model) -> Result<(), TestCaseError> {
        if let Some(e) = self.engine.take() {
            if let Some(seed) = self.power_seed.as_mut() {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let stats = e.power_cut(*seed).map_err(|err| TestCaseError::fail(format!("power cut: {err}")))?;
                self.sectors_lost += stats.sectors_lost;
            }
            e.simulate_crash();
        }
        let e = open(self.dir.path(), self.power_seed.is_some(), self.region_bytes);
        e.check_invariants().map_err(|err| TestCaseError::fail(format!("after reopen: {err}")))?;
        let mut adopted = Model::new();
        for chunk in 0..CHUNKS {
            let got = engine_state(&e, chunk);
            let b = before.get(&chunk).cloned().unwrap_or_default();
            let a = after.get(&chunk).cloned().unwrap_or_default();
            prop_assert!(
                got == b || got == a,
                "chunk {} after crash: committed v{} len {:?}, pending {:?}; before v{} pending {:?}; after v{} pending {:?}",
                chunk,
                got.committed_ver,
                got.committed.as_ref().map(Vec::len),
                got.pending.as_ref().map(|p| (p.0, p.1.as_ref().map(Vec::len))),
                b.committed_ver,
                b.pending.as_ref().map(|p| p.0),
                a.committed_ver,
                a.pending.as_ref().map(|p| p.0)
            );
            if got != ChunkState::default() {
                adopted.insert(chunk, got);
            }
        }
        self.model = adopted;
        self.engine = Some(e);
        Ok(())
    }
}

/// Runs `ops` on a fresh engine and model, then a last crash after which
/// everything must have survived exactly. `power_seed`: crashes are power
/// cuts (see the module doc).
fn run_case(ops: &[Op], power_seed: Option<u64>, region_bytes: u64) -> Result<(), TestCaseError> {
    let mut h = Harness::new(power_seed, region_bytes);
    for op in ops {
        h.step(op)?;
    }
    let m = h.model.clone();
    h.crash_and_reopen(&m, &m)?;
    for chunk in 0..CHUNKS {
        let s = h.model.get(&chunk).cloned().unwrap_or_default();
        check_strict_read(h.engine(), chunk, &s)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(40),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_model_across_crashes(ops in proptest::collection::vec(op_strategy(), 1..40)) {
        run_case(&ops, None, SMALL_REGION_BYTES)?;
    }

    #[test]
    fn journal_heavy_runs_match_the_model_across_crashes(ops in proptest::collection::vec(journal_heavy_op_strategy(), 1..120)) {
        run_case(&ops, None, SMALL_REGION_BYTES)?;
    }

    #[test]
    fn engine_matches_model_across_power_cuts(ops in proptest::collection::vec(op_strategy(), 1..40), seed in any::<u64>()) {
        run_case(&ops, Some(seed), SMALL_REGION_BYTES)?;
    }

    #[test]
    fn journal_heavy_runs_match_the_model_across_power_cuts(
        ops in proptest::collection::vec(journal_heavy_op_strategy(), 1..120),
        seed in any::<u64>(),
    ) {
        run_case(&ops, Some(seed), SMALL_REGION_BYTES)?;
    }

    /// As above with regions large enough for records that carry the
    /// appended bytes: a cut may take those bytes from the block file, and
    /// the reopen must put them back from the records.
    #[test]
    fn journal_heavy_runs_with_data_in_records_match_the_model_across_power_cuts(
        ops in proptest::collection::vec(journal_heavy_op_strategy(), 1..120),
        seed in any::<u64>(),
    ) {
        run_case(&ops, Some(seed), DATA_REGION_BYTES)?;
    }
}

/// The power-loss model is not vacuous: unsynced writes exist at a cut and
/// some sectors are rolled back. An update stopped right after its data
/// write (before its fdatasync) loses bytes at the cut, and the chunk is
/// found in its state before the update.
#[test]
fn a_power_cut_rolls_back_unsynced_data_and_the_chunk_is_as_before() {
    let mut h = Harness::new(Some(1), SMALL_REGION_BYTES);
    h.step(&Op::UpdateCommit { chunk: 0, kind: Kind::Append { len: 70_000, byte: 1 } }).expect("first write");
    let acked = h.model.get(&0).cloned().expect("chunk 0 in the model");
    for round in 0..16u8 {
        // Point 1 = UpdateBeforeDataSync: the new bytes are written, not yet synced.
        let op = Op::CrashDuring { point: 1, op: Box::new(Op::Update { chunk: 1, kind: Kind::Append { len: 70_000, byte: round } }) };
        h.step(&op).expect("crash during a data write, then a power cut");
        assert_eq!(engine_state(h.engine(), 0), acked, "an acknowledged write survives every cut");
        assert_eq!(engine_state(h.engine(), 1), ChunkState::default(), "the interrupted update left nothing");
    }
    assert!(h.sectors_lost > 0, "16 power cuts after unsynced 70 KB writes rolled no sector back");
}

/// A small acknowledged append is not synced in its block file: its bytes
/// ride in its journal record. Power cuts right after such appends roll
/// their sectors back, and every reopen restores them from the records.
#[test]
fn a_power_cut_after_small_appends_keeps_them_through_the_journal_records() {
    let mut h = Harness::new(Some(7), DATA_REGION_BYTES);
    h.step(&Op::UpdateCommit { chunk: 0, kind: Kind::Append { len: 3000, byte: 1 } }).expect("first write");
    for round in 0..16u8 {
        for chunk in 0..2 {
            h.step(&Op::UpdateCommit { chunk, kind: Kind::Append { len: 1000 + usize::from(round) * 37, byte: round } }).expect("append");
        }
        // The journal records are synced; the appended bytes in the block files are not.
        h.step(&Op::Crash).expect("a power cut, then a reopen that finds every acknowledged append");
    }
    assert!(h.sectors_lost > 0, "16 power cuts after unsynced small appends rolled no sector back");
}
