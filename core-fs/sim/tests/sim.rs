//! Deterministic simulation (turmoil) of two mgmtd instances (primary +
//! standby on one KV engine) + 3–6 storage nodes + 2 writing clients (4 KiB
//! writes; one chunk removal and one truncation in [`REMOVE_ONE_IN`]
//! operations) + the meta service (on the deterministic in-memory KV engine)
//! and 2 file clients (create/overwrite/unlink whole files through meta and
//! storage) + the KV gateway (its native HTTP API served on turmoil's TCP,
//! over its own `FsClient`) and a KV client (puts, deletes, reads) under
//! random crashes, restarts, pauses longer than T and partitions (the
//! primary mgmtd crashed, isolated and paused too), disk faults (a target's
//! block-file reads or writes fail with EIO through the chunk engine's
//! fault-injection seam, until its node restarts), power cuts of one storage
//! node or of all (the chunk engine's power-loss model, landing inside an
//! update through an armed crash point) and jumps of an mgmtd instance's
//! clock, crashes of meta, crashes and isolation of the KV gateway. Every
//! seed replays bit-exactly. See docs/mgmtd.md, "Simulation".
//!
//! * `cargo test -p fskv-sim --test sim` runs `FSKV_SIM_SEEDS` seeds
//!   (default [`DEFAULT_SEEDS`]) starting at `FSKV_SIM_FIRST_SEED` (default 1),
//!   or `FSKV_SIM_HOURS` cluster-hours of them, every n-th from the k-th
//!   with `FSKV_SIM_SHARD=k/n` ([`SeedPlan`]; `deploy/sim-soak.sh` runs a
//!   shard per core);
//! * `FSKV_SIM_SEED=<n>` replays one seed (with `RUST_LOG=info` for a trace).
//!
//! Checked after healing: every acknowledged write's latest value is on
//! every replica, every file whose last operation was acknowledged reads
//! back as written (or is absent after an unlink) and meta's fsck is clean,
//! every KV key reads back through the gateway as its history allows, and,
//! once meta and the gateway are stopped and storage has settled,
//! replicas are byte-identical, every chain is back to all
//! serving within [`SERVING_BOUND_MS`], and no two observers ever saw
//! different contents (hence heads) for one chain version. During the run:
//! a standby takes over within [`TAKEOVER_BOUND_MS`] of the primary's fault,
//! chain versions never go backwards as the routing version grows, and a
//! target whose disk failed (fail-stop) is out of serving in the routing
//! within [`DISK_FAULT_OFFLINE_BOUND_MS`] of the failed I/O, and every
//! read through the KV gateway sees no stale or torn value.

use async_trait::async_trait;
use bytes::Bytes;
use fskv_chunk_engine::{ChunkEngine, CrashPoint, EngineConfig, IoOp, ReadMode};
use fskv_client::meta::{MetaClient, MetaClientConfig};
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig, MgmtdRoutingSource};
use fskv_client::storage::{StorageClient, StorageClientConfig};
use fskv_client::{FsClient, FsClientConfig, OpenFlags};
use fskv_kv::{KeyValue, KvEngine, KvResult, RangeRequest, RangeResult, Transaction};
use fskv_meta::{ChainStorage, MetaConfig, MetaService};
use fskv_mgmtd::{Clock, Layout, Mgmtd, MgmtdConfig};
use fskv_proto::meta::{FsckRequest, LayoutPolicy};
use fskv_proto::routing::{ChainRoles, ChainTarget, LocalTargetState, PublicTargetState, RoutingInfo};
use fskv_rpc::{ClientConfig, RpcClient, SimTransport};
use fskv_storage::mgmtd_link::{self, MgmtdLinkConfig};
use fskv_storage::{StorageConfig, StorageService};
use fskv_types::{ChainId, ChunkId, InodeId, NodeId, TargetId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEFAULT_SEEDS: u64 = 24;
/// T: a storage node silent this long is failed (its lease is T/2).
const HEARTBEAT_TIMEOUT_MS: u64 = 3_000;
const MGMTD_TICK_MS: u64 = 200;
/// mgmtd's primary lease: a standby takes over within lease + lease/3 of
/// the primary's death ([`TAKEOVER_BOUND_MS`]); kept below the storage
/// lease (T/2) so storage services usually survive a takeover.
const MGMTD_LEASE_MS: u64 = 900;
/// A standby must be primary within this of the primary's crash, isolation
/// or pause (lease + one lease round + scheduling slack).
const TAKEOVER_BOUND_MS: u64 = MGMTD_LEASE_MS + MGMTD_LEASE_MS / 3 + 20 + 2 * TICK_MS;
/// mgmtd instances (one primary by lease, the others standby) sharing one KV engine.
const MGMTD_INSTANCES: u32 = 2;
const STORAGE_HEARTBEAT_MS: u64 = 300;
/// Faults happen in `[FAULT_START_MS, FAULT_END_MS)` of simulated time;
/// writers write during the same window.
const FAULT_START_MS: u64 = 1_500;
const FAULT_END_MS: u64 = 16_000;
/// A target whose disk failed must be out of serving in the routing within
/// this of the failed I/O: its service reports it offline on the next
/// heartbeat, mgmtd applies that on its next tick (plus the network: the
/// heartbeat's and the routing's trip).
const DISK_FAULT_OFFLINE_BOUND_MS: u64 = STORAGE_HEARTBEAT_MS + 2 * MGMTD_TICK_MS + 500 + 2 * MAX_LATENCY_MS;
/// errno of an I/O error (Linux).
const EIO: i32 = 5;
/// Every chain must be all serving within this after healing.
const SERVING_BOUND_MS: u64 = 45_000;
/// A supervisor restarts an exited storage service after this.
const RESTART_DELAY_MS: u64 = 300;
const REGION_BYTES: usize = 4096;
const REGIONS_PER_CHUNK: u64 = 4;
const CHUNKS_PER_WRITER: u64 = 4;
const WRITERS: u64 = 2;
/// A writer's operation is a chunk removal one time in this many, and a
/// truncation as often.
const REMOVE_ONE_IN: u32 = 12;
const MGMTD_PORT: u16 = 9000;
const STORAGE_PORT: u16 = 9100;
const META_PORT: u16 = 9200;
/// Inode of writer w's chunks: `WRITER_INODE_BASE + w`.
const WRITER_INODE_BASE: u64 = 1 << 40;
const META_HOST: &str = "meta";
/// Clients writing files through meta and storage (the native client).
const FILE_CLIENTS: u64 = 2;
/// Chunk size of the files (two chunks for the largest file size below).
const FILE_CHUNK_BYTES: u32 = 64 << 10;
/// File sizes drawn: inline in the inode, one chunk, two chunks.
const FILE_SIZES: [usize; 3] = [700, 9_000, 100_000];
const TICK_MS: u64 = 5;
const MAX_LATENCY_MS: u64 = 5 * TICK_MS;
/// The KV gateway's host (a writer gateway over meta and storage, as
/// `fskv kv-gateway`), its port, and the client host that speaks its
/// native HTTP API.
const KV_GATEWAY_HOST: &str = "kvgw";
const KV_PORT: u16 = 9300;
const KV_CLIENT_HOST: &str = "kvclient";
const KV_NAMESPACE: &str = "sim";
const KV_TOKEN: &str = "sim-kv-bearer-token-0001";
/// Keys the KV client writes, deletes and reads (values of [`FILE_SIZES`]: inline
/// in the inode, or a file written through storage and published).
const KV_KEYS: u64 = 10;
/// A KV client call gives up after this (connect, request, response).
const KV_CALL_TIMEOUT_MS: u64 = 3_000;

// ---------------------------------------------------------------- KV engine

/// A single-process KV engine without threads (the memory engine has a
/// commit thread, whose real-time completion would make the schedule depend
/// on the machine). Transactions see a copy of the map taken at their first
/// operation and apply their writes at commit. The mgmtd instances share it;
/// its futures never yield, so on turmoil's single thread a transaction runs
/// from begin to commit without another one in between. A commit that finds
/// a commit since its view was taken fails anyway (a non-retryable error:
/// the KV crate's retry jitter reads the real clock), and is counted.
#[derive(Default)]
struct SimKv {
    map: Mutex<BTreeMap<Bytes, Bytes>>,
    version: AtomicU64,
    conflicts: AtomicU64,
}

enum Op {
    Set(Bytes, Bytes),
    Clear(Bytes),
    ClearRange(Bytes, Bytes),
}

struct SimTxn {
    kv: Arc<SimKv>,
    /// Set while this mgmtd instance is cut from the engine.
    cut: Arc<AtomicBool>,
    /// The map at the first operation, and the engine's commit count then.
    view: Option<BTreeMap<Bytes, Bytes>>,
    read_version: u64,
    ops: Vec<Op>,
}

impl SimTxn {
    fn view(&mut self) -> &mut BTreeMap<Bytes, Bytes> {
        let kv = &self.kv;
        let read_version = &mut self.read_version;
        self.view.get_or_insert_with(|| {
            let map = kv.map.lock().unwrap();
            *read_version = kv.version.load(Ordering::SeqCst);
            map.clone()
        })
    }

    fn apply(map: &mut BTreeMap<Bytes, Bytes>, op: &Op) {
        match op {
            Op::Set(k, v) => {
                map.insert(k.clone(), v.clone());
            }
            Op::Clear(k) => {
                map.remove(k);
            }
            Op::ClearRange(b, e) => {
                let keys: Vec<Bytes> = map.range(b.clone()..e.clone()).map(|(k, _)| k.clone()).collect();
                for k in keys {
                    map.remove(&k);
                }
            }
        }
    }

    /// The 8-byte little-endian operand at `key` (absent = 0; shorter
    /// zero-extended, longer truncated), as FoundationDB's atomic ops read it.
    fn le8(&mut self, key: &[u8]) -> [u8; 8] {
        let mut cur = [0u8; 8];
        if let Some(v) = self.view().get(key) {
            let n = v.len().min(8);
            cur[..n].copy_from_slice(&v[..n]);
        }
        cur
    }

    fn push(&mut self, op: Op) {
        Self::apply(self.view(), &op);
        self.ops.push(op);
    }

    fn range(&mut self, r: &RangeRequest) -> RangeResult {
        let mut kvs: Vec<KeyValue> = self.view().range(r.begin.clone()..r.end.clone()).map(|(k, v)| (k.clone(), v.clone())).collect();
        if r.reverse {
            kvs.reverse();
        }
        let more = r.limit > 0 && kvs.len() > r.limit;
        if more {
            kvs.truncate(r.limit);
        }
        RangeResult { kvs, more }
    }
}

/// [`SimKv`] as one mgmtd instance's [`KvEngine`] (survives its restarts);
/// `cut` makes every transaction fail (the instance is isolated or paused).
struct SimKvEngine {
    kv: Arc<SimKv>,
    cut: Arc<AtomicBool>,
}

fn kv_cut() -> fskv_kv::KvError {
    fskv_kv::KvError::Storage("simulation: this mgmtd is cut from the KV engine".into())
}

#[async_trait]
impl KvEngine for SimKvEngine {
    fn name(&self) -> &'static str {
        "sim"
    }

    async fn begin(&self) -> KvResult<Box<dyn Transaction>> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(kv_cut());
        }
        Ok(Box::new(SimTxn { kv: self.kv.clone(), cut: self.cut.clone(), view: None, read_version: 0, ops: Vec::new() }))
    }
}

#[async_trait]
impl Transaction for SimTxn {
    async fn get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        Ok(self.view().get(key).cloned())
    }
    async fn snapshot_get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        Ok(self.view().get(key).cloned())
    }
    async fn get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        Ok(self.range(range))
    }
    async fn snapshot_get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        Ok(self.range(range))
    }
    fn set(&mut self, key: &[u8], value: &[u8]) -> KvResult<()> {
        self.push(Op::Set(Bytes::copy_from_slice(key), Bytes::copy_from_slice(value)));
        Ok(())
    }
    fn clear(&mut self, key: &[u8]) -> KvResult<()> {
        self.push(Op::Clear(Bytes::copy_from_slice(key)));
        Ok(())
    }
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        self.push(Op::ClearRange(Bytes::copy_from_slice(begin), Bytes::copy_from_slice(end)));
        Ok(())
    }
    fn atomic_add(&mut self, key: &[u8], delta: i64) -> KvResult<()> {
        let next = i64::from_le_bytes(self.le8(key)).wrapping_add(delta);
        self.push(Op::Set(Bytes::copy_from_slice(key), Bytes::copy_from_slice(&next.to_le_bytes())));
        Ok(())
    }
    fn atomic_max(&mut self, key: &[u8], value: u64) -> KvResult<()> {
        let next = u64::from_le_bytes(self.le8(key)).max(value);
        self.push(Op::Set(Bytes::copy_from_slice(key), Bytes::copy_from_slice(&next.to_le_bytes())));
        Ok(())
    }
    fn add_read_conflict_range(&mut self, _begin: &[u8], _end: &[u8]) -> KvResult<()> {
        Ok(())
    }
    fn add_write_conflict_range(&mut self, _begin: &[u8], _end: &[u8]) -> KvResult<()> {
        Ok(())
    }
    async fn commit(self: Box<Self>) -> KvResult<u64> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(kv_cut());
        }
        let mut map = self.kv.map.lock().unwrap();
        if self.view.is_some() && self.kv.version.load(Ordering::SeqCst) != self.read_version {
            self.kv.conflicts.fetch_add(1, Ordering::SeqCst);
            return Err(fskv_kv::KvError::Storage("simulation: conflicting commit".into()));
        }
        for op in &self.ops {
            SimTxn::apply(&mut map, op);
        }
        Ok(self.kv.version.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

// ---------------------------------------------------------------- clock

/// mgmtd's clock: simulated milliseconds (shared by every host, so it stays
/// monotonic across mgmtd restarts).
/// An mgmtd instance's wall clock: simulated time plus the instance's
/// offset, which a [`Fault::ClockJump`] steps away from zero and back (what
/// an NTP step, a VM resume or an operator's `date -s` does to a real
/// clock).
struct SimClock {
    offset_ms: Arc<AtomicI64>,
}

/// [`SimClock`] at the start of the simulation.
const SIM_CLOCK_BASE_MS: u64 = 1_000_000;

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        (SIM_CLOCK_BASE_MS + now_ms()).saturating_add_signed(self.offset_ms.load(Ordering::SeqCst))
    }
    /// Simulated time: a clock jump moves only the wall reading.
    fn monotonic_ms(&self) -> u64 {
        SIM_CLOCK_BASE_MS + now_ms()
    }
}

/// The mgmtd instance named by the lease record, and the lease's expiry
/// (read straight from the engine, outside the simulation).
fn lease_holder(kv: &SimKv) -> Option<(u32, u64)> {
    let raw = kv.map.lock().unwrap().get(fskv_mgmtd::store::KEY_LEASE).cloned()?;
    let lease: fskv_mgmtd::store::LeaseRecord = serde_json::from_slice(&raw).ok()?;
    let i = (1..=MGMTD_INSTANCES).find(|i| mgmtd_id(*i) == lease.holder)?;
    Some((i, lease.expires_ms))
}

fn now_ms() -> u64 {
    turmoil::sim_elapsed().map_or(0, |d| d.as_millis() as u64)
}

// ---------------------------------------------------------------- shared state

/// One client write, removal or truncation, in issue order per writer (a
/// removal is recorded in every region of its chunk, a truncation in every
/// region it cuts off).
#[derive(Clone, Debug)]
struct WriteRecord {
    writer: u64,
    seq: u64,
    acked: bool,
    /// The chunk's removal, or its truncation at or below this region: the
    /// region reads as nothing or as zeros after it.
    removal: bool,
}

impl WriteRecord {
    /// Whether `got` (the region's bytes, `None` past the chunk's end) is
    /// what this operation left there.
    fn left(&self, got: Option<&[u8]>) -> bool {
        match got {
            _ if self.removal => got.is_none_or(|b| b.iter().all(|x| *x == 0)),
            Some(bytes) => bytes == &pattern(self.writer, self.seq)[..],
            None => false,
        }
    }
}

/// Key of a 4 KiB region: (chain, chunk, region index).
type Region = (ChainId, ChunkId, u64);

#[derive(Default)]
struct Shared {
    /// (chain, chain version) → the chain's targets and states as first seen, and by whom.
    chain_versions: BTreeMap<(ChainId, u32), (Vec<ChainTarget>, String)>,
    violations: Vec<String>,
    writes: BTreeMap<Region, Vec<WriteRecord>>,
    acked: u64,
    failed: u64,
    exits: Vec<String>,
    /// Per storage node: when its service last decided to exit (from then
    /// on it answers new requests `ShuttingDown`; in-flight ones finish,
    /// up to the forward timeout, before its engines close).
    exited_at: BTreeMap<NodeId, u64>,
    /// Simulated ms at which every chain was all serving after the heal.
    all_serving_at_ms: Option<u64>,
    /// mgmtd's status the last time the checker found it unhealthy.
    last_status: Option<String>,
    /// A log of events for the replay trace (compared across runs of a seed).
    trace: Vec<String>,
    /// chain → routing version → chain version, over every observation:
    /// chain versions must never go backwards as the routing version grows.
    chain_history: BTreeMap<ChainId, BTreeMap<u64, u32>>,
    /// Measured takeovers: simulated ms from the primary's fault to a
    /// standby holding the lease.
    takeovers_ms: Vec<u64>,
    /// The engines of the running storage services (for disk faults); weak,
    /// so a crashed service's engines close and its restart can reopen them.
    engines: BTreeMap<TargetId, std::sync::Weak<ChunkEngine>>,
    /// Per storage node: chunks waiting for its settle pass, and when that
    /// was read (a task on the node reads it every 50 ms; a crashed node's
    /// entry goes stale). The checker waits for them to drain.
    unsettled: BTreeMap<NodeId, (usize, u64)>,
    /// Disk faults being watched: target → (injected at, the first failed
    /// I/O at, first seen out of serving in a routing at).
    disk_faults: BTreeMap<TargetId, (u64, Option<u64>, Option<u64>)>,
    /// Measured disk faults: (ms from injection to the failed I/O, ms from
    /// the failed I/O to the target out of serving in the routing).
    disk_fault_ms: Vec<(u64, u64)>,
    /// Unsynced sectors the power cuts (see [`power_cut`]) rolled back, and kept.
    power_cut_sectors: (u64, u64),
    /// Engines a power cut found stopped inside an update (at their armed crash point).
    power_cuts_inside_update: u64,
    /// File name → every operation on it through meta, in issue order (each
    /// name belongs to one file client).
    files: BTreeMap<String, Vec<FileOp>>,
    /// File operations acknowledged / failed.
    file_ops: (u64, u64),
    /// What the file checker found: files read back, files skipped (their
    /// last operation failed, so any outcome of it is allowed), fsck's inode count.
    file_check: Option<(u64, u64, u64)>,
    /// Key → every put (content) or delete (`None`) through the KV gateway,
    /// in issue order.
    kv_ops: BTreeMap<String, Vec<FileOp>>,
    /// KV puts and deletes acknowledged / failed.
    kv_counts: (u64, u64),
    /// KV reads during the run checked / failed (5xx, timeout).
    kv_reads: (u64, u64),
    /// What the KV checker found: keys read back as their last acknowledged
    /// operation left them, keys holding the outcome of a failed one.
    kv_check: Option<(u64, u64)>,
}

/// One operation on a file through meta and storage: content written (a
/// create or an overwrite) or `None` for an unlink.
#[derive(Clone, Debug)]
struct FileOp {
    seq: u64,
    content: Option<Bytes>,
    acked: bool,
}

#[derive(Clone)]
struct Ctx {
    seed: u64,
    layout: Layout,
    root: PathBuf,
    shared: Arc<Mutex<Shared>>,
    kv: Arc<SimKv>,
    /// Per mgmtd instance (index = instance - 1): cut from the KV engine.
    kv_cut: Vec<Arc<AtomicBool>>,
    /// Per mgmtd instance (index = instance - 1): its clock's offset from
    /// simulated time, in ms.
    clock_offset_ms: Vec<Arc<AtomicI64>>,
    storage_generation: Arc<AtomicU64>,
    healed: Arc<AtomicBool>,
    /// Writers whose last write has returned (a write issued before the
    /// heal may retry well after it).
    writers_done: Arc<AtomicU64>,
    /// Meta's KV engine (survives meta's restarts, as a FoundationDB
    /// cluster would): the in-memory engine, committing inline on
    /// simulated time.
    meta_kv: Arc<dyn KvEngine>,
    /// Starts of the meta service (each gets a new storage client id and
    /// random seed).
    meta_generation: Arc<AtomicU64>,
    /// File clients whose last operation has returned.
    file_clients_done: Arc<AtomicU64>,
    /// Starts of the KV gateway (each gets new client ids).
    kv_generation: Arc<AtomicU64>,
    /// Set once the KV client's last operation has returned.
    kv_client_done: Arc<AtomicBool>,
    /// Checkers (cluster, files, KV) that have finished.
    checkers_done: Arc<AtomicU64>,
    /// Set by [`run_quiesce`]: the driver stops meta and the KV gateway.
    quiesce: Arc<AtomicBool>,
}

impl Ctx {
    fn observe(&self, who: &str, routing: &RoutingInfo) {
        let mut s = self.shared.lock().unwrap();
        let now = now_ms();
        let mut seen_out = Vec::new();
        for (target, (_, failed, out)) in &s.disk_faults {
            if failed.is_some() && out.is_none() {
                let serving = routing
                    .chains
                    .iter()
                    .flat_map(|c| c.targets.iter())
                    .any(|t| t.target_id == *target && t.state == PublicTargetState::Serving);
                if !serving {
                    seen_out.push(*target);
                }
            }
        }
        for target in seen_out {
            if let Some(entry) = s.disk_faults.get_mut(&target) {
                entry.2 = Some(now);
            }
            s.trace.push(format!("{now} {who} sees {target} out of serving after its disk fault"));
        }
        for chain in &routing.chains {
            let history = s.chain_history.entry(chain.chain_id).or_default();
            let cv = chain.chain_version;
            let backwards = match history.get(&routing.version) {
                Some(seen) if *seen != cv => {
                    Some(format!("routing version {} carries {}@{seen} and {}@{cv}", routing.version, chain.chain_id, chain.chain_id))
                }
                _ => {
                    let before = history.range(..routing.version).next_back().filter(|(_, v)| **v > cv);
                    let after = history.range(routing.version + 1..).next().filter(|(_, v)| **v < cv);
                    before.or(after).map(|(rv, v)| {
                        format!(
                            "{}: routing version {rv} has chain version {v}, routing version {} has {cv} ({who})",
                            chain.chain_id, routing.version
                        )
                    })
                }
            };
            history.insert(routing.version, cv);
            if let Some(msg) = backwards {
                s.violations.push(format!("chain version went backwards: {msg}"));
            }
            let key = (chain.chain_id, chain.chain_version);
            match s.chain_versions.get(&key) {
                None => {
                    let heads = chain.head().map(|h| h.target_id);
                    s.trace.push(format!("{} {who} sees {}@{} head {heads:?}", now_ms(), chain.chain_id, chain.chain_version));
                    s.chain_versions.insert(key, (chain.targets.clone(), who.to_string()));
                }
                Some((targets, first)) if *targets != chain.targets => {
                    let msg = format!(
                        "{}@{}: {first} saw {:?} (head {:?}) but {who} saw {:?} (head {:?})",
                        chain.chain_id,
                        chain.chain_version,
                        targets,
                        targets.head().map(|t| t.target_id),
                        chain.targets,
                        chain.head().map(|h| h.target_id)
                    );
                    s.violations.push(format!("two views of one chain version: {msg}"));
                }
                Some(_) => {}
            }
        }
    }

    fn node_targets(&self, node: NodeId) -> Vec<TargetId> {
        (0..self.layout.targets_per_node).map(|k| fskv_mgmtd::layout::target_id(node, k)).collect()
    }

    fn trace(&self, line: String) {
        self.shared.lock().unwrap().trace.push(format!("{} {line}", now_ms()));
    }
}

fn mgmtd_host(i: u32) -> String {
    format!("mgmtd{i}")
}

fn mgmtd_id(i: u32) -> String {
    format!("mgmtd-{i}")
}

fn mgmtd_addrs() -> Vec<String> {
    (1..=MGMTD_INSTANCES).map(|i| format!("{}:{MGMTD_PORT}", mgmtd_host(i))).collect()
}

/// A client of every mgmtd instance (it follows the primary: `NotPrimary`
/// or an unreachable address moves it to the next one).
fn mgmtd_client(rpc: RpcClient) -> MgmtdClient {
    let config = MgmtdClientConfig { call_timeout_ms: 300, routing_poll_wait_ms: 500, retry_delay_ms: 100 };
    MgmtdClient::new(rpc, mgmtd_addrs(), config)
}

fn sim_rpc() -> RpcClient {
    RpcClient::new(Arc::new(SimTransport::new()), ClientConfig::default())
}

/// Publishes every routing the source sees into the observations.
fn spawn_observer(ctx: &Ctx, who: String, source: &Arc<MgmtdRoutingSource>) {
    let ctx = ctx.clone();
    let mut rx = source.subscribe();
    tokio::spawn(async move {
        loop {
            let r = rx.borrow_and_update().clone();
            ctx.observe(&who, &r);
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
}

// ---------------------------------------------------------------- hosts

async fn run_mgmtd(ctx: Ctx, i: u32) -> turmoil::Result {
    let config = MgmtdConfig {
        heartbeat_timeout_ms: HEARTBEAT_TIMEOUT_MS,
        tick_interval_ms: MGMTD_TICK_MS,
        lease_ms: MGMTD_LEASE_MS,
        max_routing_wait_ms: 1_000,
        ..MgmtdConfig::new(mgmtd_id(i))
    };
    let who = mgmtd_host(i);
    let engine = SimKvEngine { kv: ctx.kv.clone(), cut: ctx.kv_cut[(i - 1) as usize].clone() };
    let mgmtd =
        Mgmtd::new(config, ctx.layout, Arc::new(engine), Arc::new(SimClock { offset_ms: ctx.clock_offset_ms[(i - 1) as usize].clone() }))?;
    // Advertise the name peers reach it by (NotPrimary answers name it).
    let running = mgmtd.serve_on(Arc::new(SimTransport::new()), &format!("0.0.0.0:{MGMTD_PORT}")).await?;
    running.mgmtd.set_address(&format!("{who}:{MGMTD_PORT}"));
    ctx.trace(format!("{who} up"));
    let mut was_primary = false;
    loop {
        let primary = running.mgmtd.is_primary();
        if primary != was_primary {
            ctx.trace(format!("{who} {}", if primary { "primary" } else { "standby" }));
            was_primary = primary;
        }
        let r = running.mgmtd.routing();
        if r.version > 0 {
            ctx.observe(&who, &r);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One start of a storage service, like `fskv storage --mgmtd`: returns
/// when it would exit (a supervisor restarts it).
async fn run_storage(ctx: Ctx, node: NodeId) {
    let who = format!("storage{}", node.0);
    let rpc = sim_rpc();
    let source = match MgmtdRoutingSource::start(mgmtd_client(rpc.clone()), Duration::from_secs(5)).await {
        Ok(s) => s,
        Err(e) => {
            ctx.trace(format!("{who} exits: no routing ({e})"));
            return;
        }
    };
    spawn_observer(&ctx, who.clone(), &source);
    let targets = ctx.node_targets(node);
    if let Err(e) = mgmtd_link::wait_until_safe_to_start(&source, node, &targets, 10_000).await {
        ctx.trace(format!("{who} exits: {e}"));
        source.stop();
        return;
    }
    let config = StorageConfig { inline_engine_io: true, forward_timeout_ms: 2_000, ..StorageConfig::new(node) };
    let engine_config = sim_engine_config();
    let dir = ctx.root.join(format!("node-{}", node.0));
    let service = match StorageService::open(config, &dir, &targets, engine_config, source.handle(), rpc) {
        Ok(s) => s,
        Err(e) => panic!("{who}: opening engines: {e:#}"),
    };
    {
        let mut s = ctx.shared.lock().unwrap();
        for t in &targets {
            if let Some(engine) = service.engine(*t) {
                engine.enable_power_loss_model();
                s.engines.insert(*t, Arc::downgrade(&engine));
            }
        }
    }
    let running = service.serve_on(Arc::new(SimTransport::new()), &format!("0.0.0.0:{STORAGE_PORT}")).await.expect("bind");
    {
        // Dies with the host on a crash (so it never keeps the engines open).
        let (service, shared) = (running.service.clone(), ctx.shared.clone());
        tokio::spawn(async move {
            loop {
                let n = service.unsettled_chunks();
                shared.lock().unwrap().unsettled.insert(node, (n, now_ms()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    let generation = ctx.storage_generation.fetch_add(1, Ordering::SeqCst);
    ctx.trace(format!("{who} serving (generation {generation})"));
    let link = MgmtdLinkConfig {
        heartbeat_interval_ms: STORAGE_HEARTBEAT_MS,
        generation,
        initial_lease_ms: HEARTBEAT_TIMEOUT_MS / 2,
        max_start_wait_ms: 10_000,
    };
    let address = format!("storage{}:{STORAGE_PORT}", node.0);
    let reason = mgmtd_link::run_heartbeats(running.service.clone(), source.clone(), address, link).await;
    ctx.trace(format!("{who} exits: {reason}"));
    {
        let mut s = ctx.shared.lock().unwrap();
        s.exits.push(format!("{} {who}: {reason}", now_ms()));
        s.exited_at.insert(node, now_ms());
    }
    source.stop();
    running.shutdown().await;
}

/// `sync_writes` as in production: a power cut keeps exactly what was synced.
/// Small preallocations (on `/dev/shm` they are real memory, zeroed at every
/// engine open): a 64 KiB memtable (RocksDB's WAL and MANIFEST) and 64 KiB
/// journal regions (which also makes checkpoints frequent).
fn sim_engine_config() -> EngineConfig {
    EngineConfig { sync_writes: true, blocks_per_grow: 4, meta_write_buffer_bytes: 64 << 10, journal_region_bytes: 64 << 10 }
}

/// A replica's committed state: chunk → (committed version, bytes).
type ReplicaState = BTreeMap<ChunkId, (u64, Bytes)>;

fn pattern(writer: u64, seq: u64) -> Bytes {
    let word = (writer << 48) | seq;
    let mut out = Vec::with_capacity(REGION_BYTES);
    while out.len() < REGION_BYTES {
        out.extend_from_slice(&word.to_le_bytes());
    }
    Bytes::from(out)
}

/// Region `r` of a chunk's bytes, if the chunk is that long.
fn region_of(data: &[u8], r: u64) -> Option<&[u8]> {
    let start = usize::try_from(r).ok()?.checked_mul(REGION_BYTES)?;
    data.get(start..start.checked_add(REGION_BYTES)?)
}

/// What a region holds, in the writers' terms: `(writer, seq)` when it is one
/// write's pattern, else the first word and whether the region is uniform.
fn describe_region(bytes: &[u8]) -> String {
    let word = |i: usize| bytes.get(i * 8..i * 8 + 8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
    let first = word(0).unwrap_or(0);
    let uniform = (0..bytes.len() / 8).all(|i| word(i) == Some(first));
    if uniform && first != 0 {
        format!("write ({}, {})", first >> 48, first & ((1 << 48) - 1))
    } else if uniform {
        "zeros".to_string()
    } else {
        format!("mixed bytes starting {first:x}")
    }
}

/// How two replicas' committed states differ, one line per chunk: the
/// versions, lengths and the regions whose bytes differ (with what each
/// replica holds there).
fn replica_differences(a: &ReplicaState, b: &ReplicaState) -> Vec<String> {
    let mut out = Vec::new();
    let chunks: std::collections::BTreeSet<&ChunkId> = a.keys().chain(b.keys()).collect();
    for chunk in chunks {
        match (a.get(chunk), b.get(chunk)) {
            (Some(x), Some(y)) if x == y => {}
            (Some((va, da)), Some((vb, db))) => {
                let regions = da.len().max(db.len()).div_ceil(REGION_BYTES) as u64;
                let differing: Vec<String> = (0..regions)
                    .filter(|r| region_of(da, *r) != region_of(db, *r))
                    .map(|r| {
                        let show = |d: &[u8]| region_of(d, r).map_or_else(|| "nothing".to_string(), describe_region);
                        format!("region {r}: {} / {}", show(da), show(db))
                    })
                    .collect();
                out.push(format!("{chunk} v{va} ({} bytes) / v{vb} ({} bytes), {differing:?}", da.len(), db.len()));
            }
            (x, y) => out.push(format!(
                "{chunk} {} / {}",
                x.map_or_else(|| "absent".to_string(), |(v, d)| format!("v{v} ({} bytes)", d.len())),
                y.map_or_else(|| "absent".to_string(), |(v, d)| format!("v{v} ({} bytes)", d.len())),
            )),
        }
    }
    out
}

fn writer_regions(writer: u64, chains: u32) -> Vec<Region> {
    let mut out = Vec::new();
    for c in 0..CHUNKS_PER_WRITER {
        let chain = ChainId(((writer * CHUNKS_PER_WRITER + c) % chains as u64) as u32 + 1);
        // Far above the inode ids meta hands out (the files' chunks).
        let chunk = ChunkId::new(InodeId(WRITER_INODE_BASE + writer), c);
        for r in 0..REGIONS_PER_CHUNK {
            out.push((chain, chunk, r));
        }
    }
    out
}

/// The storage client settings of every client in the world (writers,
/// meta, file clients): few, short attempts; the write channels' seqs from
/// 1 (the default reads the wall clock, which a replay must not).
fn storage_config(client_id: u64) -> StorageClientConfig {
    StorageClientConfig {
        client_id,
        max_attempts: 8,
        retry_backoff_ms: 20,
        call_timeout_ms: 2_000,
        routing_wait_ms: 500,
        first_write_seq: 1,
        ..StorageClientConfig::default()
    }
}

async fn run_writer(ctx: Ctx, writer: u64) -> turmoil::Result {
    let who = format!("writer{writer}");
    let mut rng = StdRng::seed_from_u64(ctx.seed.wrapping_mul(1_000_003).wrapping_add(writer));
    let rpc = sim_rpc();
    let source = MgmtdRoutingSource::start(mgmtd_client(rpc.clone()), Duration::from_secs(30)).await?;
    spawn_observer(&ctx, who.clone(), &source);
    let client = StorageClient::new(rpc, source.handle(), storage_config(0x5151_0000 + writer));
    let regions = writer_regions(writer, ctx.layout.nodes * ctx.layout.targets_per_node / ctx.layout.replicas);
    let mut seq = 0u64;
    while now_ms() < FAULT_END_MS {
        seq += 1;
        let region = regions[rng.gen_range(0..regions.len())];
        let (chain, chunk, r) = region;
        // One in REMOVE_ONE_IN operations removes the whole chunk (as an
        // unlink does), so versions restart and removals can be left
        // pending as writes are; as many truncate it to a region boundary
        // (as a truncate does: the regions from there on are cut off).
        let (removal, cut_from) = match rng.gen_range(0..REMOVE_ONE_IN) {
            0 => (true, 0),
            1 => (false, r),
            _ => (false, REGIONS_PER_CHUNK),
        };
        let result = if removal {
            client.remove(chain, chunk).await
        } else if cut_from < REGIONS_PER_CHUNK {
            client.truncate(chain, chunk, cut_from * REGION_BYTES as u64).await
        } else {
            client.write(chain, chunk, r * REGION_BYTES as u64, pattern(writer, seq)).await
        };
        let acked = result.is_ok();
        {
            let mut s = ctx.shared.lock().unwrap();
            let record = WriteRecord { writer, seq, acked, removal: removal || cut_from < REGIONS_PER_CHUNK };
            if record.removal {
                for r in cut_from..REGIONS_PER_CHUNK {
                    s.writes.entry((chain, chunk, r)).or_default().push(record.clone());
                }
            } else {
                s.writes.entry(region).or_default().push(record);
            }
            if acked {
                s.acked += 1;
            } else {
                s.failed += 1;
            }
        }
        let what = if removal {
            format!("removal {seq} of {chain} {chunk}")
        } else if cut_from < REGIONS_PER_CHUNK {
            format!("truncation {seq} of {chain} {chunk} to region {cut_from}")
        } else {
            format!("write {seq} to {chain} {chunk} region {r}")
        };
        match result {
            Ok(_) => ctx.trace(format!("{who} {what} acked")),
            Err(e) => ctx.trace(format!("{who} {what} failed: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(5..40))).await;
    }
    source.stop();
    ctx.writers_done.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// One start of the meta service, like `fskv meta --mgmtd`: its chain
/// table from mgmtd's routing, chunks through the storage client, state in
/// [`Ctx::meta_kv`]; runs until its host crashes.
async fn run_meta(ctx: Ctx) -> turmoil::Result {
    let generation = ctx.meta_generation.fetch_add(1, Ordering::SeqCst);
    let rpc = sim_rpc();
    let source = MgmtdRoutingSource::start(mgmtd_client(rpc.clone()), Duration::from_secs(30)).await?;
    let table = loop {
        match source.current().chain_tables.first() {
            Some(t) if !t.chains.is_empty() => break t.clone(),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let base = MetaConfig::over_chain_table(&table);
    let cfg = MetaConfig {
        root_layout: LayoutPolicy {
            chunk_size_bytes: FILE_CHUNK_BYTES,
            stripe_size: base.root_layout.stripe_size.min(2),
            ..base.root_layout
        },
        gc_interval_ms: 500,
        rng_seed: Some(ctx.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(generation)),
        // mtimes and every expiry on simulated time.
        wall_clock_ns: Some(|| (SIM_CLOCK_BASE_MS + now_ms()) * 1_000_000),
        ..base
    };
    let storage = StorageClient::new(
        rpc,
        source.handle(),
        // A new id per start: request ids restart at 1 (a retried update is
        // recognised by its (client, request) tag).
        storage_config(0x4d45_5441_0000 + generation),
    );
    let service = MetaService::open(ctx.meta_kv.clone(), Arc::new(ChainStorage::new(storage)), cfg).await?;
    let _server = service.serve_on(Arc::new(SimTransport::new()), &format!("0.0.0.0:{META_PORT}")).await?;
    ctx.trace(format!("meta serving (generation {generation})"));
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A native filesystem client (meta + storage) with its own ids.
async fn file_client(ids: u64) -> Result<(FsClient, Arc<MgmtdRoutingSource>), Box<dyn std::error::Error>> {
    let rpc = sim_rpc();
    let source = MgmtdRoutingSource::start(mgmtd_client(rpc.clone()), Duration::from_secs(30)).await?;
    let storage = StorageClient::new(rpc.clone(), source.handle(), storage_config(0x4649_4c45_0000 + ids));
    let meta_config = MetaClientConfig {
        call_timeout_ms: 2_000,
        max_attempts: 8,
        retry_backoff_ms: 20,
        ..MetaClientConfig::new(vec![format!("{META_HOST}:{META_PORT}")])
    };
    let meta = MetaClient::over(rpc, meta_config, 0x4649_4c45_1000 + ids)?;
    let config = FsClientConfig { length_report_interval_ms: 0, ..FsClientConfig::default() };
    Ok((FsClient::new(meta, storage, config), source))
}

/// The bytes file client `client` writes in its operation `seq`.
fn file_content(client: u64, seq: u64, len: usize) -> Bytes {
    let salt = client.wrapping_mul(0x100_0000_01b3).wrapping_add(seq.wrapping_mul(0x9e37_79b9));
    (0..len as u64).map(|i| (i.wrapping_mul(31).wrapping_add(salt) ^ (salt >> 17)) as u8).collect::<Vec<u8>>().into()
}

/// Writes whole files under `/` through meta and storage until the faults
/// end: a new file (create, write, close), an overwrite of one of its files
/// (open with truncate, write, close) or an unlink, each recorded with
/// whether it was acknowledged.
async fn run_files(ctx: Ctx, client: u64) -> turmoil::Result {
    let who = format!("files{client}");
    let mut rng = StdRng::seed_from_u64(ctx.seed.wrapping_mul(2_000_003).wrapping_add(client));
    let (fs, source) = file_client(client).await?;
    let mut mine: Vec<String> = Vec::new();
    let mut seq = 0u64;
    while now_ms() < FAULT_END_MS {
        seq += 1;
        let pick = rng.gen_range(0..10);
        let (name, content) = if mine.is_empty() || pick < 6 {
            let name = format!("c{client}-{seq}");
            mine.push(name.clone());
            (name, Some(file_content(client, seq, FILE_SIZES[rng.gen_range(0..FILE_SIZES.len())])))
        } else if pick < 9 {
            (mine[rng.gen_range(0..mine.len())].clone(), Some(file_content(client, seq, FILE_SIZES[rng.gen_range(0..FILE_SIZES.len())])))
        } else {
            (mine.swap_remove(rng.gen_range(0..mine.len())), None)
        };
        let result: Result<(), String> = match &content {
            Some(data) => {
                async {
                    let h = fs.open_at(InodeId::ROOT, &name, OpenFlags::create_truncate()).await.map_err(|e| format!("open: {e}"))?;
                    h.write_at(0, data.clone()).await.map_err(|e| format!("write: {e}"))?;
                    h.close().await.map_err(|e| format!("close: {e}"))?;
                    Ok(())
                }
                .await
            }
            None => fs.meta().unlink(InodeId::ROOT, &name).await.map_err(|e| format!("unlink: {e}")),
        };
        let what = match &content {
            Some(d) => format!("write {seq} of {} bytes to {name}", d.len()),
            None => format!("unlink {seq} of {name}"),
        };
        match &result {
            Ok(()) => ctx.trace(format!("{who} {what} acked")),
            Err(e) => ctx.trace(format!("{who} {what} failed: {e}")),
        }
        {
            let mut s = ctx.shared.lock().unwrap();
            s.files.entry(name).or_default().push(FileOp { seq, content, acked: result.is_ok() });
            if result.is_ok() {
                s.file_ops.0 += 1;
            } else {
                s.file_ops.1 += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..60))).await;
    }
    source.stop();
    ctx.file_clients_done.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Waits (bounded) until the checker found the cluster healthy and `done`
/// holds; false if that did not happen within the serving bound (the
/// cluster is then reported unhealthy).
async fn healthy_and(ctx: &Ctx, done: impl Fn() -> bool) -> bool {
    let healed_at = now_ms();
    loop {
        let healthy = ctx.shared.lock().unwrap().all_serving_at_ms.is_some();
        if healthy && done() {
            return true;
        }
        if now_ms() > healed_at + SERVING_BOUND_MS + 5_000 {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After the heal, once the cluster is healthy (the checker says so) and
/// every file client is done: every file whose last operation was
/// acknowledged reads back as that operation left it (its bytes, or absent
/// after an unlink), and meta's fsck finds no problem.
async fn run_file_checker(ctx: Ctx) -> turmoil::Result {
    if !healthy_and(&ctx, || ctx.file_clients_done.load(Ordering::SeqCst) == FILE_CLIENTS).await {
        return Ok(());
    }
    let (fs, source) = file_client(FILE_CLIENTS).await?;
    let files = ctx.shared.lock().unwrap().files.clone();
    let (mut checked, mut skipped) = (0u64, 0u64);
    let mut problems = Vec::new();
    for (name, ops) in &files {
        let Some(last) = ops.last() else { continue };
        if !last.acked {
            // A failed write may have left the file anywhere between before and after.
            skipped += 1;
            continue;
        }
        checked += 1;
        let mut attempt = 0;
        let got: Result<Option<Bytes>, String> = loop {
            attempt += 1;
            let r = async {
                let h = match fs.open_at(InodeId::ROOT, name, OpenFlags::read_only()).await {
                    Ok(h) => h,
                    Err(e) if e.code() == fskv_types::ErrorCode::NotFound => return Ok(None),
                    Err(e) => return Err(format!("open: {e}")),
                };
                h.read_at(0, h.len()).await.map(Some).map_err(|e| format!("read: {e}"))
            }
            .await;
            match r {
                Err(e) if attempt < 10 => {
                    ctx.trace(format!("file checker: {name}: {e}; again"));
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                other => break other,
            }
        };
        let describe = |c: &Option<Bytes>| c.as_ref().map_or_else(|| "absent".to_string(), |b| format!("{} bytes", b.len()));
        match got {
            Ok(g) if g == last.content => {}
            Ok(g) => problems.push(format!(
                "file {name}: acknowledged operation {} left {} but it reads as {}",
                last.seq,
                describe(&last.content),
                if g.as_ref().is_some_and(|b| last.content.as_ref().is_some_and(|c| b.len() == c.len())) {
                    "other bytes of that length".to_string()
                } else {
                    describe(&g)
                }
            )),
            Err(e) => problems.push(format!("file {name}: unreadable after the heal: {e}")),
        }
    }
    let inodes = match fs.meta().fsck(&FsckRequest { max_problems: 10, page_keys: 0 }, 10_000).await {
        Ok(r) => {
            if r.problems_total > 0 {
                problems.push(format!("meta fsck: {} problems: {:?}", r.problems_total, r.problems));
            }
            r.inodes
        }
        Err(e) => {
            problems.push(format!("meta fsck failed: {e}"));
            0
        }
    };
    source.stop();
    ctx.trace(format!("file checker: {checked} files read back, {skipped} skipped, fsck over {inodes} inodes"));
    let mut s = ctx.shared.lock().unwrap();
    s.file_check = Some((checked, skipped, inodes));
    s.violations.extend(problems);
    Ok(())
}

// ---------------------------------------------------------------- KV gateway

/// turmoil's TCP listener as the gateway layer's [`fskv_gateway::Listener`].
struct SimListener(turmoil::net::TcpListener);

impl fskv_gateway::Listener for SimListener {
    type Stream = turmoil::net::TcpStream;
    async fn accept(&self) -> std::io::Result<(turmoil::net::TcpStream, std::net::SocketAddr)> {
        self.0.accept().await
    }
}

/// One start of the KV gateway, like `fskv kv-gateway --role writer`: the
/// native API on the shared HTTP layer (connection limits, timeouts,
/// bearer-token authentication) over an [`FsClient`] of its own; its
/// maintenance loop runs. Runs until its host crashes.
async fn run_kv_gateway(ctx: Ctx) -> turmoil::Result {
    let generation = ctx.kv_generation.fetch_add(1, Ordering::SeqCst);
    // Ids apart from the file clients' (0..=FILE_CLIENTS).
    let (fs, source) = file_client(0x100 + generation).await?;
    let key = fskv_gateway::AccessKey { bearer_token: Some(KV_TOKEN.into()), ..fskv_gateway::AccessKey::new("SIMKV", "sim-kv-secret") };
    let keys = Arc::new(fskv_gateway::KeyStore::new(vec![key])?);
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], KV_PORT));
    let cfg = fskv_gateway_kv::KvConfig::new(addr, fskv_gateway::Role::Writer, keys);
    // Opening the store needs meta: a start during meta's crash waits for
    // it (a failed start drops its listener; the next binds again).
    let _handle = loop {
        let listener = SimListener(turmoil::net::TcpListener::bind(addr).await?);
        match fskv_gateway_kv::start_on(cfg.clone(), fs.clone(), listener, addr).await {
            Ok(h) => break h,
            Err(e) => {
                ctx.trace(format!("kv gateway cannot start: {e}; again"));
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    ctx.trace(format!("kv gateway serving (generation {generation})"));
    let _source = source;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One HTTP/1.1 exchange with the KV gateway on a new connection (bearer
/// token), bounded by [`KV_CALL_TIMEOUT_MS`]: the status and the body.
async fn kv_call(method: http::Method, path: &str, body: Bytes) -> Result<(http::StatusCode, Bytes), String> {
    use http_body_util::BodyExt;
    let exchange = async {
        let stream = turmoil::net::TcpStream::connect((KV_GATEWAY_HOST, KV_PORT)).await.map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, KV_GATEWAY_HOST)
            .header(http::header::AUTHORIZATION, format!("Bearer {KV_TOKEN}"))
            .body(http_body_util::Full::new(body))
            .map_err(|e| format!("request: {e}"))?;
        let resp = sender.send_request(req).await.map_err(|e| format!("send: {e}"))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(|e| format!("response body: {e}"))?.to_bytes();
        Ok((status, bytes))
    };
    tokio::time::timeout(Duration::from_millis(KV_CALL_TIMEOUT_MS), exchange).await.map_err(|_| "timed out".to_string())?
}

/// GET of a key through the gateway: its bytes, `None` on 404, or why the
/// read did not answer (another status with its error code, a transport
/// failure, a timeout).
async fn kv_get(key: &str) -> Result<Option<Bytes>, String> {
    match kv_call(http::Method::GET, &format!("/v1/kv/{KV_NAMESPACE}/{key}"), Bytes::new()).await? {
        (st, body) if st == http::StatusCode::OK => Ok(Some(body)),
        (st, _) if st == http::StatusCode::NOT_FOUND => Ok(None),
        (st, body) => Err(format!("HTTP {} {}", st.as_u16(), kv_error_code(&body))),
    }
}

/// The gateway's error code from a JSON error body (not its message, which
/// carries a request id).
fn kv_error_code(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|v| v["error"]["code"].as_str().map(str::to_string)).unwrap_or_default()
}

/// Puts, deletes and reads [`KV_KEYS`] keys of one namespace through the
/// KV gateway until the faults end. Each put and delete is recorded with
/// whether it was acknowledged (2xx; a delete of an absent key, 404, too);
/// each read that answers (200 or 404) must see what [`kv_allowed`]
/// allows at that moment (through the gateway's `FsClient` and storage
/// client's read path, under the faults).
async fn run_kv_client(ctx: Ctx) -> turmoil::Result {
    let who = KV_CLIENT_HOST;
    let mut rng = StdRng::seed_from_u64(ctx.seed.wrapping_mul(3_000_017).wrapping_add(7));
    // The namespace, before the first key (a put into a missing namespace is 404).
    loop {
        match kv_call(http::Method::PUT, &format!("/v1/ns/{KV_NAMESPACE}"), Bytes::new()).await {
            Ok((st, _)) if st.is_success() => break,
            Ok((st, body)) => ctx.trace(format!("{who}: namespace: HTTP {} {}", st.as_u16(), kv_error_code(&body))),
            Err(e) => ctx.trace(format!("{who}: namespace: {e}")),
        }
        if now_ms() >= FAULT_END_MS {
            ctx.kv_client_done.store(true, Ordering::SeqCst);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ctx.trace(format!("{who}: namespace {KV_NAMESPACE} made"));
    let mut seq = 0u64;
    while now_ms() < FAULT_END_MS {
        seq += 1;
        let key = format!("k{}", rng.gen_range(0..KV_KEYS));
        let pick = rng.gen_range(0..10);
        if pick < 3 {
            kv_read_during_faults(&ctx, &key, seq).await;
            tokio::time::sleep(Duration::from_millis(rng.gen_range(10..60))).await;
            continue;
        }
        let content = if pick < 9 { Some(file_content(KV_CLIENT_SALT, seq, FILE_SIZES[rng.gen_range(0..FILE_SIZES.len())])) } else { None };
        let path = format!("/v1/kv/{KV_NAMESPACE}/{key}");
        let (what, r) = match &content {
            Some(d) => (format!("put {seq} of {} bytes to {key}", d.len()), kv_call(http::Method::PUT, &path, d.clone()).await),
            None => (format!("delete {seq} of {key}"), kv_call(http::Method::DELETE, &path, Bytes::new()).await),
        };
        let acked = match &r {
            Ok((st, _)) => st.is_success() || (content.is_none() && *st == http::StatusCode::NOT_FOUND),
            Err(_) => false,
        };
        match &r {
            Ok((st, body)) => ctx.trace(format!(
                "{who} {what}: HTTP {}{}",
                st.as_u16(),
                if st.is_success() { String::new() } else { format!(" {}", kv_error_code(body)) }
            )),
            Err(e) => ctx.trace(format!("{who} {what} failed: {e}")),
        }
        {
            let mut s = ctx.shared.lock().unwrap();
            s.kv_ops.entry(key).or_default().push(FileOp { seq, content, acked });
            if acked {
                s.kv_counts.0 += 1;
            } else {
                s.kv_counts.1 += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..60))).await;
    }
    ctx.kv_client_done.store(true, Ordering::SeqCst);
    Ok(())
}

/// Whether a read of a key may see `got` (`None`: absent) after the
/// operations `ops` (all returned: the client is sequential): what the
/// last acknowledged one left, or what any failed one left (it may take
/// effect at any time after it was issued); before any acknowledged
/// operation, absent too.
fn kv_allowed(ops: &[FileOp], got: &Option<Bytes>) -> bool {
    let last_acked = ops.iter().rposition(|o| o.acked);
    let as_last = match last_acked {
        Some(i) => ops[i].content == *got,
        None => got.is_none(),
    };
    as_last || ops.iter().any(|o| !o.acked && o.content == *got)
}

/// One GET of `key` during the run, checked against the key's history:
/// an answer the history does not allow (a stale or torn value) is a
/// violation; a failed read (5xx, timeout) is only counted.
async fn kv_read_during_faults(ctx: &Ctx, key: &str, seq: u64) {
    let got = match kv_get(key).await {
        Ok(got) => got,
        Err(e) => {
            ctx.trace(format!("{KV_CLIENT_HOST} get {seq} of {key} failed: {e}"));
            ctx.shared.lock().unwrap().kv_reads.1 += 1;
            return;
        }
    };
    ctx.trace(format!(
        "{KV_CLIENT_HOST} get {seq} of {key}: {}",
        got.as_ref().map_or_else(|| "absent".to_string(), |b| format!("{} bytes", b.len()))
    ));
    let mut s = ctx.shared.lock().unwrap();
    s.kv_reads.0 += 1;
    let ops = s.kv_ops.get(key).cloned().unwrap_or_default();
    if !kv_allowed(&ops, &got) {
        s.violations.push(format!(
            "kv key {key}: get {seq} at {} ms read {} after operations {:?} (seq, acked, bytes)",
            now_ms(),
            got.as_ref().map_or_else(|| "absent".to_string(), |b| format!("{} bytes", b.len())),
            ops.iter().map(|o| (o.seq, o.acked, o.content.as_ref().map(|b| b.len()))).collect::<Vec<_>>()
        ));
    }
}

/// Salt of the KV client's values in [`file_content`] (apart from the file clients').
const KV_CLIENT_SALT: u64 = 0x4b56;

/// After the heal, once the cluster is healthy and the KV client is done:
/// every key reads back through the gateway as its last acknowledged
/// operation left it (its bytes, or 404 after a delete), or as an
/// operation that failed left it ([`kv_allowed`]: a call that timed out or
/// failed may still take effect after the client gave up, even after a
/// later acknowledged one).
async fn run_kv_checker(ctx: Ctx) -> turmoil::Result {
    if !healthy_and(&ctx, || ctx.kv_client_done.load(Ordering::SeqCst)).await {
        return Ok(());
    }
    let ops = ctx.shared.lock().unwrap().kv_ops.clone();
    let (mut exact, mut late) = (0u64, 0u64);
    let mut problems = Vec::new();
    for (key, ops) in &ops {
        let mut attempt = 0;
        let got: Result<Option<Bytes>, String> = loop {
            attempt += 1;
            match kv_get(key).await {
                Err(e) if attempt < 20 => {
                    ctx.trace(format!("kv checker: {key}: {e}; again"));
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                other => break other,
            }
        };
        let got = match got {
            Ok(g) => g,
            Err(e) => {
                problems.push(format!("kv key {key}: unreadable through the gateway after the heal: {e}"));
                continue;
            }
        };
        let last_acked = ops.iter().rposition(|o| o.acked);
        let matches_last = match last_acked {
            Some(i) => ops[i].content == got,
            None => got.is_none(),
        };
        if matches_last {
            exact += 1;
            continue;
        }
        if kv_allowed(ops, &got) {
            late += 1;
            continue;
        }
        let describe = |c: &Option<Bytes>| c.as_ref().map_or_else(|| "absent".to_string(), |b| format!("{} bytes", b.len()));
        problems.push(format!(
            "kv key {key}: reads as {} but its last acknowledged operation {} left {} (operations {:?})",
            describe(&got),
            last_acked.map_or(0, |i| ops[i].seq),
            last_acked.map_or_else(|| "absent".to_string(), |i| describe(&ops[i].content)),
            ops.iter().map(|o| (o.seq, o.acked, o.content.as_ref().map(|b| b.len()))).collect::<Vec<_>>()
        ));
    }
    ctx.trace(format!("kv checker: {exact} keys as last acknowledged, {late} as a failed operation left them"));
    let mut s = ctx.shared.lock().unwrap();
    s.kv_check = Some((exact, late));
    s.violations.extend(problems);
    Ok(())
}

/// Bound on storage settling what meta and the KV gateway left in flight
/// when they stop at the end of a run ([`run_quiesce`]).
const QUIESCE_BOUND_MS: u64 = 10_000;

/// Runs `checker` and counts it in [`Ctx::checkers_done`] when it returns.
async fn counted(ctx: Ctx, checker: impl std::future::Future<Output = turmoil::Result>) -> turmoil::Result {
    let r = checker.await;
    ctx.checkers_done.fetch_add(1, Ordering::SeqCst);
    r
}

/// The end of a run: once the three checkers are done, meta and the KV
/// gateway stop (the driver crashes them: meta's garbage collection may be
/// removing chunks, the gateway writing access logs), and storage must
/// settle what that cut off — an update its head was forwarding when its
/// client's connection closed — within [`QUIESCE_BOUND_MS`]. Without this
/// the run ended with such an update half-forwarded (the successors
/// committed a removal the head still held pending), and the replica check
/// after the run compared storage in motion.
async fn run_quiesce(ctx: Ctx) -> turmoil::Result {
    while ctx.checkers_done.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ctx.quiesce.store(true, Ordering::SeqCst);
    let stopped_at = now_ms();
    ctx.trace("quiesce: meta and the KV gateway stop".to_string());
    // A handler cut off mid-forward is queued for settling once its
    // forward returns (at most the RPC deadline).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let mut quiet_since: Option<u64> = None;
    loop {
        let settled = ctx.shared.lock().unwrap().unsettled.values().all(|(n, at)| *n == 0 || *at + 200 < now_ms());
        if settled {
            let since = *quiet_since.get_or_insert(now_ms());
            if now_ms() >= since + 500 {
                ctx.trace(format!("quiesce: storage settled {} ms after meta stopped", now_ms() - stopped_at));
                return Ok(());
            }
        } else {
            quiet_since = None;
        }
        if now_ms() > stopped_at + QUIESCE_BOUND_MS {
            ctx.shared
                .lock()
                .unwrap()
                .violations
                .push(format!("storage still settling {QUIESCE_BOUND_MS} ms after meta and the KV gateway stopped"));
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After the heal: waits (bounded) until every writer's last write has
/// returned, no storage service has a chunk waiting to be settled, and
/// mgmtd shows every node alive and heartbeating and every target serving
/// and up to date, continuously for T (so a node that died
/// just before the heal, which mgmtd only notices after T, cannot pass for
/// healthy, and a write still retrying at the heal has T to settle on every
/// replica: seed 2357 ended 65 ms after such a write, before a middle
/// target's settle pass had its next turn).
async fn run_checker(ctx: Ctx) -> turmoil::Result {
    let client = mgmtd_client(sim_rpc());
    let healed_at = now_ms();
    let mut stable_since: Option<u64> = None;
    loop {
        if let Ok(resp) = client.get_routing(0, 0).await {
            if let Some(r) = resp.routing {
                ctx.observe("checker", &r);
            }
        }
        // The primary's status (the instances are asked in order).
        let mut primary_status = None;
        for addr in mgmtd_addrs() {
            if let Ok(st) = client.status_of(&addr).await {
                if st.is_primary {
                    primary_status = Some(st);
                    break;
                }
            }
        }
        let healthy = match primary_status {
            Some(st) => {
                let nodes_ok = st.nodes.len() == ctx.layout.nodes as usize
                    && st.nodes.iter().all(|n| n.alive && n.last_heartbeat_age_ms <= 3 * STORAGE_HEARTBEAT_MS);
                let chains_ok = !st.chains.is_empty()
                    && st
                        .chains
                        .iter()
                        .all(|c| c.targets.iter().all(|t| t.public == PublicTargetState::Serving && t.local == LocalTargetState::UpToDate));
                let writers_done = ctx.writers_done.load(Ordering::SeqCst) == WRITERS;
                // Every left-over whose fate was unknown has been settled
                // (seed 2275: a middle target's settle pass waited on a
                // silent connection while the run ended).
                let settled = ctx.shared.lock().unwrap().unsettled.values().all(|(n, at)| *n == 0 || *at + 200 < now_ms());
                let healthy = st.is_primary && nodes_ok && chains_ok && writers_done && settled;
                if !healthy {
                    ctx.shared.lock().unwrap().last_status = Some(format!("nodes {:?} chains {:?}", st.nodes, st.chains));
                }
                healthy
            }
            None => false,
        };
        if healthy {
            let since = *stable_since.get_or_insert(now_ms());
            if now_ms() >= since + HEARTBEAT_TIMEOUT_MS {
                ctx.shared.lock().unwrap().all_serving_at_ms = Some(since);
                return Ok(());
            }
        } else {
            stable_since = None;
        }
        if now_ms() > healed_at + SERVING_BOUND_MS {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------- faults

#[derive(Clone, Debug)]
enum Fault {
    /// Crash storage node (1-based) and restart it after the duration.
    CrashStorage(u32),
    /// Cut every link of a storage node for the duration.
    PartitionStorage(u32),
    /// Hold every link of a storage node (messages queue, delivered on
    /// release) for longer than T: a pause, as the network sees it.
    PauseStorage(u32),
    /// Cut one link between two storage nodes.
    PartitionPair(u32, u32),
    /// Cut every link of the primary mgmtd (the lease holder when the fault
    /// starts); with `kv`, its access to the KV engine too (so a standby
    /// takes over), else it keeps its lease while unreachable.
    IsolateMgmtd { kv: bool },
    /// Crash the primary mgmtd and restart it (its state is in the KV engine).
    CrashMgmtd,
    /// Pause the primary mgmtd: hold its links and cut its KV access (a
    /// standby takes over; on release the held messages reach a deposed
    /// instance).
    PauseMgmtd,
    /// Every block-file I/O `op` of one target fails with EIO from now on
    /// (the engine stops: fail-stop); at the end its node restarts with
    /// the disk working again (the engine reopens and the target re-syncs).
    Disk(TargetId, IoOp),
    /// [`POWER_CUT_ARM_MS`] before a power cut: each engine of the node
    /// (`None`: of every node) stops at a random crash point of its next
    /// update (after allocating, before or after the data sync, after the
    /// metadata write, around a commit), so the cut lands inside an update
    /// rather than between two (with inline engine I/O and `sync_writes`,
    /// a step boundary never finds an unsynced write).
    ArmPowerCut(Option<u32>),
    /// Power cut of a storage node (`None`: of every node at once, a room
    /// losing power): every block-file and journal sector its targets wrote
    /// since the file's last sync rolls back to a random point of its
    /// history (the chunk engine's power-loss model, with `sync_writes` on
    /// as in production), then the node crashes; it restarts after the
    /// duration.
    PowerCut(Option<u32>),
    /// The wall clock of mgmtd instance `instance` steps by `delta_ms`
    /// (either way) and steps back after the duration; its monotonic clock
    /// runs on.
    ClockJump { instance: u32, delta_ms: i64 },
    /// Crash the meta service and restart it after the duration (its state
    /// is in its KV engine; file clients retry against the new process).
    CrashMeta,
    /// Crash the KV gateway and restart it after the duration (it keeps no
    /// state of its own: a new process opens the store).
    CrashKvGateway,
    /// Cut every link of the KV gateway (to its client, meta and storage)
    /// for the duration.
    IsolateKvGateway,
}

impl Fault {
    fn hits_mgmtd(&self) -> bool {
        matches!(self, Fault::IsolateMgmtd { .. } | Fault::CrashMgmtd | Fault::PauseMgmtd)
    }
}

#[derive(Clone, Debug)]
struct Event {
    at_ms: u64,
    duration_ms: u64,
    fault: Fault,
}

/// Disk faults, power cuts and clock jumps come from random streams of
/// their own, so adding them kept every seed's other faults as they were.
const DISK_FAULT_STREAM: u64 = 0xd15c_fa17;
const POWER_CUT_STREAM: u64 = 0x9_0e11_c0ff;
const CLOCK_JUMP_STREAM: u64 = 0xc10c_0a55;
const META_CRASH_STREAM: u64 = 0x3e7a_c7a5;
const KV_GATEWAY_STREAM: u64 = 0x4b76_6777;
/// How long before a power cut its engines' crash points are armed.
const POWER_CUT_ARM_MS: u64 = 400;
/// The crash points a power cut is armed at: any.
const POWER_CUT_POINTS: [CrashPoint; 6] = CrashPoint::ALL;

fn schedule(rng: &mut StdRng, nodes: u32, seed: u64, targets_per_node: u32) -> Vec<Event> {
    let count = rng.gen_range(3..=8);
    let mut events: Vec<Event> = (0..count)
        .map(|_| {
            let node = rng.gen_range(1..=nodes);
            let (fault, duration_ms) = match rng.gen_range(0..12) {
                0..=2 => (Fault::CrashStorage(node), rng.gen_range(100..2 * HEARTBEAT_TIMEOUT_MS)),
                3..=4 => (Fault::PartitionStorage(node), rng.gen_range(200..2 * HEARTBEAT_TIMEOUT_MS)),
                5 => (Fault::PauseStorage(node), rng.gen_range(HEARTBEAT_TIMEOUT_MS + 200..2 * HEARTBEAT_TIMEOUT_MS)),
                6 => {
                    let other = (node % nodes) + 1;
                    (Fault::PartitionPair(node, other), rng.gen_range(200..2 * HEARTBEAT_TIMEOUT_MS))
                }
                7..=8 => (Fault::IsolateMgmtd { kv: true }, rng.gen_range(200..2 * HEARTBEAT_TIMEOUT_MS)),
                9 => (Fault::IsolateMgmtd { kv: false }, rng.gen_range(200..2 * HEARTBEAT_TIMEOUT_MS)),
                10 => (Fault::PauseMgmtd, rng.gen_range(200..2 * HEARTBEAT_TIMEOUT_MS)),
                _ => (Fault::CrashMgmtd, rng.gen_range(100..HEARTBEAT_TIMEOUT_MS)),
            };
            let at_ms = rng.gen_range(FAULT_START_MS..FAULT_END_MS - 1_000);
            Event { at_ms, duration_ms: duration_ms.min(FAULT_END_MS - at_ms), fault }
        })
        .collect();
    // Half of the seeds: one disk fault, on writes (mostly) or reads.
    let mut disk = StdRng::seed_from_u64(seed ^ DISK_FAULT_STREAM);
    if disk.gen_bool(0.5) {
        let node = NodeId(disk.gen_range(1..=nodes));
        let target = fskv_mgmtd::layout::target_id(node, disk.gen_range(0..targets_per_node));
        let op = if disk.gen_bool(0.75) { IoOp::Write } else { IoOp::Read };
        let at_ms = disk.gen_range(FAULT_START_MS..FAULT_END_MS - 3_000);
        let duration_ms = disk.gen_range(2 * HEARTBEAT_TIMEOUT_MS / 3..2 * HEARTBEAT_TIMEOUT_MS).min(FAULT_END_MS - at_ms);
        events.push(Event { at_ms, duration_ms, fault: Fault::Disk(target, op) });
    }
    // Half of the seeds: a power cut, of one node (3 in 4) or of all.
    let mut power = StdRng::seed_from_u64(seed ^ POWER_CUT_STREAM);
    if power.gen_bool(0.5) {
        let which = if power.gen_bool(0.25) { None } else { Some(power.gen_range(1..=nodes)) };
        let at_ms = power.gen_range(FAULT_START_MS..FAULT_END_MS - 1_000);
        let duration_ms = power.gen_range(100..2 * HEARTBEAT_TIMEOUT_MS).min(FAULT_END_MS - at_ms);
        events.push(Event { at_ms: at_ms - POWER_CUT_ARM_MS, duration_ms: 0, fault: Fault::ArmPowerCut(which) });
        events.push(Event { at_ms, duration_ms, fault: Fault::PowerCut(which) });
    }
    // Two seeds in five: one mgmtd instance's clock steps forward or back
    // by up to 2T (beyond the lease and beyond T).
    let mut clock = StdRng::seed_from_u64(seed ^ CLOCK_JUMP_STREAM);
    if clock.gen_bool(0.4) {
        let instance = clock.gen_range(1..=MGMTD_INSTANCES);
        let magnitude = clock.gen_range(200..2 * HEARTBEAT_TIMEOUT_MS) as i64;
        let delta_ms = if clock.gen_bool(0.5) { magnitude } else { -magnitude };
        let at_ms = clock.gen_range(FAULT_START_MS..FAULT_END_MS - 1_000);
        let duration_ms = clock.gen_range(200..2 * HEARTBEAT_TIMEOUT_MS).min(FAULT_END_MS - at_ms);
        events.push(Event { at_ms, duration_ms, fault: Fault::ClockJump { instance, delta_ms } });
    }
    // Half of the seeds: the meta service crashes and restarts.
    let mut meta = StdRng::seed_from_u64(seed ^ META_CRASH_STREAM);
    if meta.gen_bool(0.5) {
        let at_ms = meta.gen_range(FAULT_START_MS..FAULT_END_MS - 1_000);
        let duration_ms = meta.gen_range(100..HEARTBEAT_TIMEOUT_MS).min(FAULT_END_MS - at_ms);
        events.push(Event { at_ms, duration_ms, fault: Fault::CrashMeta });
    }
    // Half of the seeds: the KV gateway crashes and restarts (2 in 3) or is cut off.
    let mut kv = StdRng::seed_from_u64(seed ^ KV_GATEWAY_STREAM);
    if kv.gen_bool(0.5) {
        let fault = if kv.gen_bool(2.0 / 3.0) { Fault::CrashKvGateway } else { Fault::IsolateKvGateway };
        let at_ms = kv.gen_range(FAULT_START_MS..FAULT_END_MS - 1_000);
        let duration_ms = kv.gen_range(100..HEARTBEAT_TIMEOUT_MS).min(FAULT_END_MS - at_ms);
        events.push(Event { at_ms, duration_ms, fault });
    }
    events.sort_by_key(|e| e.at_ms);
    events
}

// ---------------------------------------------------------------- one seed

struct Outcome {
    trace_hash: u64,
    summary: String,
    /// Simulated time the seed ran, in ms.
    simulated_ms: u64,
}

/// One run of a seed, for the replay check: its event trace (whether the
/// checks passed or not; a failure shows up in the trace too).
fn run_seed_trace(seed: u64) -> Vec<String> {
    // (A marker for diffing the logs of the two runs.)
    tracing::info!("replay run of seed {seed} starts");
    let trace = Arc::new(Mutex::new(Vec::new()));
    let result = run_seed_with(seed, Some(trace.clone()));
    let mut out = std::mem::take(&mut *trace.lock().unwrap());
    out.push(match result {
        Ok(o) => format!("passed {:016x}", o.trace_hash),
        Err(e) => format!("failed: {}", e.lines().next().unwrap_or("")),
    });
    out
}

fn run_seed(seed: u64) -> Result<Outcome, String> {
    run_seed_with(seed, None)
}

/// Serializes the simulations of this process: the tests run on parallel
/// threads, and tokio's task ids (see [`align_task_ids`]) are process-wide.
static SIM_LOCK: Mutex<()> = Mutex::new(());

/// Advances tokio's process-wide task id counter to a multiple of 4.
///
/// A current-thread runtime keeps its tasks in 4 lists picked by task id,
/// and a crash in turmoil drops the host's runtime list by list: the order
/// in which the host's sockets send their FIN/RST (each drawing a latency
/// from the seeded RNG) follows the task ids. Starting every run at the same
/// residue gives its tasks the same lists in every run, in or across
/// processes.
fn align_task_ids() {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else { return };
    for _ in 0..8 {
        let id: u64 = rt.spawn(async {}).id().to_string().parse().unwrap_or(3);
        if id % 4 == 3 {
            break;
        }
    }
}

fn storage_host(n: u32) -> String {
    format!("storage{n}")
}

/// Arms a crash point, drawn from the seed, in every running engine of
/// `node` (see [`Fault::ArmPowerCut`]).
fn arm_power_cut(ctx: &Ctx, node: u32, elapsed_ms: u64) {
    let mut s = ctx.shared.lock().unwrap();
    for t in ctx.node_targets(NodeId(node)) {
        let Some(engine) = s.engines.get(&t).and_then(std::sync::Weak::upgrade) else { continue };
        let mut rng = StdRng::seed_from_u64(ctx.seed ^ POWER_CUT_STREAM ^ t.0);
        let point = POWER_CUT_POINTS[rng.gen_range(0..POWER_CUT_POINTS.len())];
        engine.inject_crash(point);
        s.trace.push(format!("{elapsed_ms} {t} armed at {point:?} for a power cut"));
    }
}

/// The power-loss model's cut on every running engine of `node` (the
/// caller then crashes the host): unsynced block-file and journal writes
/// roll back sector by sector, as a drive's cache loses them.
fn power_cut(ctx: &Ctx, node: u32, elapsed_ms: u64) {
    let mut s = ctx.shared.lock().unwrap();
    for t in ctx.node_targets(NodeId(node)) {
        let Some(engine) = s.engines.remove(&t).and_then(|w| w.upgrade()) else { continue };
        let cut_seed = ctx.seed ^ (t.0 << 32) ^ elapsed_ms;
        let inside = engine.is_failed();
        let stopped = if inside { "inside an update" } else { "between updates" };
        match engine.power_cut(cut_seed) {
            Ok(st) => {
                s.power_cut_sectors.0 += st.sectors_lost;
                s.power_cuts_inside_update += u64::from(inside);
                s.power_cut_sectors.1 += st.sectors_kept;
                s.trace.push(format!(
                    "{elapsed_ms} power cut of {t} {stopped}: {} unsynced writes in {} files, {} sectors lost, {} kept",
                    st.writes, st.files, st.sectors_lost, st.sectors_kept
                ));
            }
            Err(e) => s.violations.push(format!("power cut of {t} failed: {e}")),
        }
    }
}

fn run_seed_with(seed: u64, trace_out: Option<Arc<Mutex<Vec<String>>>>) -> Result<Outcome, String> {
    let _one_at_a_time = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    align_task_ids();
    let mut rng = StdRng::seed_from_u64(seed);
    let nodes = rng.gen_range(3..=6u32);
    let layout = Layout { nodes, targets_per_node: 3, replicas: 3 };
    let chains = nodes * 3 / 3;
    // On tmpfs where there is one: the power-loss model, not the disk,
    // decides what a cut keeps, and fsync there costs nothing.
    let shm = std::path::Path::new("/dev/shm");
    let tmp = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.map_err(|e| e.to_string())?;
    let ctx = Ctx {
        seed,
        layout,
        root: tmp.path().to_path_buf(),
        shared: Arc::new(Mutex::new(Shared::default())),
        kv: Arc::new(SimKv::default()),
        kv_cut: (0..MGMTD_INSTANCES).map(|_| Arc::new(AtomicBool::new(false))).collect(),
        clock_offset_ms: (0..MGMTD_INSTANCES).map(|_| Arc::new(AtomicI64::new(0))).collect(),
        storage_generation: Arc::new(AtomicU64::new(1)),
        healed: Arc::new(AtomicBool::new(false)),
        writers_done: Arc::new(AtomicU64::new(0)),
        meta_kv: Arc::new(fskv_kv::MemoryEngine::deterministic(Arc::new(now_ms))),
        meta_generation: Arc::new(AtomicU64::new(1)),
        file_clients_done: Arc::new(AtomicU64::new(0)),
        kv_generation: Arc::new(AtomicU64::new(1)),
        kv_client_done: Arc::new(AtomicBool::new(false)),
        checkers_done: Arc::new(AtomicU64::new(0)),
        quiesce: Arc::new(AtomicBool::new(false)),
    };
    // The KV layer's retry delays (meta's inode allocator) from the seed.
    fskv_kv::seed_retry_jitter(seed);
    let events = schedule(&mut rng, nodes, seed, layout.targets_per_node);

    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_millis(FAULT_END_MS + SERVING_BOUND_MS + 20_000 + QUIESCE_BOUND_MS))
        .tick_duration(Duration::from_millis(TICK_MS))
        .min_message_latency(Duration::from_micros(100))
        .max_message_latency(Duration::from_millis(MAX_LATENCY_MS))
        .enable_random_order()
        .rng_seed(seed)
        .build();

    for i in 1..=MGMTD_INSTANCES {
        let c = ctx.clone();
        sim.host(mgmtd_host(i), move || run_mgmtd(c.clone(), i));
    }
    for n in 1..=nodes {
        let c = ctx.clone();
        sim.host(storage_host(n), move || {
            let c = c.clone();
            async move {
                run_storage(c, NodeId(n)).await;
                Ok(())
            }
        });
    }
    for w in 0..WRITERS {
        let c = ctx.clone();
        sim.client(format!("writer{w}"), run_writer(c, w));
    }
    {
        let c = ctx.clone();
        sim.host(META_HOST, move || run_meta(c.clone()));
    }
    for f in 0..FILE_CLIENTS {
        let c = ctx.clone();
        sim.client(format!("files{f}"), run_files(c, f));
    }
    {
        let c = ctx.clone();
        sim.host(KV_GATEWAY_HOST, move || run_kv_gateway(c.clone()));
        let c = ctx.clone();
        sim.client(KV_CLIENT_HOST, run_kv_client(c));
    }
    let mut all_hosts: Vec<String> = (1..=MGMTD_INSTANCES).map(mgmtd_host).collect();
    all_hosts.extend((1..=nodes).map(storage_host));
    all_hosts.extend((0..WRITERS).map(|w| format!("writer{w}")));
    all_hosts.push(META_HOST.to_string());
    all_hosts.extend((0..FILE_CLIENTS).map(|f| format!("files{f}")));
    all_hosts.push(KV_GATEWAY_HOST.to_string());
    all_hosts.push(KV_CLIENT_HOST.to_string());
    // (The checker host only exists after the heal.)

    // Driver state.
    let mut pending = events.clone();
    pending.reverse();
    // (end time, what to undo, the mgmtd instance it hit (0: none))
    let mut undo: Vec<(u64, Fault, u32)> = Vec::new();
    let mut crashed: BTreeMap<String, u64> = BTreeMap::new();
    let mut exited_since: BTreeMap<u32, u64> = BTreeMap::new();
    let mut checker_started = false;
    // Meta and the KV gateway stopped for the end of the run (run_quiesce).
    let mut quiesced = false;
    let mut elapsed_ms = 0u64;
    // (deposed instance, fault time): a standby must take the lease within
    // TAKEOVER_BOUND_MS while the deposed one stays dead to the lease.
    let mut takeover_watch: Option<(u32, u64)> = None;
    // The lease holder at the last step (for the check that only a fault of
    // mgmtd moves the lease).
    let mut last_holder: Option<u32> = None;
    // The nodes the armed power cut will hit.
    let mut power_cut_nodes: Vec<u32> = Vec::new();
    // The last simulated ms at which a fault of mgmtd was in force.
    let mut mgmtd_faulty_until_ms = 0u64;

    let others = |me: &str| all_hosts.iter().filter(|h| h.as_str() != me).cloned().collect::<Vec<_>>();
    let mut step_result: Result<bool, String>;
    loop {
        step_result = sim.step().map_err(|e| format!("simulation error: {e}"));
        let finished = match &step_result {
            Ok(f) => *f,
            Err(_) => break,
        };
        elapsed_ms += TICK_MS;
        if finished && checker_started {
            break;
        }
        // Whether instance i cannot hold the lease (crashed or cut from the KV engine).
        let dead = |i: u32, crashed: &BTreeMap<String, u64>| {
            crashed.contains_key(&mgmtd_host(i)) || ctx.kv_cut[(i - 1) as usize].load(Ordering::SeqCst)
        };
        // Start due faults.
        while pending.last().is_some_and(|e| e.at_ms <= elapsed_ms) {
            let Some(e) = pending.pop() else { break };
            let end = elapsed_ms + e.duration_ms;
            // A fault of "the primary" hits the lease holder now.
            let target = if e.fault.hits_mgmtd() { lease_holder(&ctx.kv).map_or(1, |(i, _)| i) } else { 0 };
            let m = mgmtd_host(target.max(1));
            ctx.shared.lock().unwrap().trace.push(format!(
                "{elapsed_ms} fault {:?}{} for {} ms",
                e.fault,
                if target > 0 { format!(" on {m}") } else { String::new() },
                e.duration_ms
            ));
            match &e.fault {
                Fault::CrashStorage(n) => {
                    let h = storage_host(*n);
                    if sim.is_host_running(h.as_str()) {
                        sim.crash(h.as_str());
                    }
                    crashed.insert(h, end);
                }
                Fault::CrashMgmtd => {
                    if sim.is_host_running(m.as_str()) {
                        sim.crash(m.as_str());
                    }
                    crashed.insert(m.clone(), end);
                }
                Fault::CrashMeta => {
                    if sim.is_host_running(META_HOST) {
                        sim.crash(META_HOST);
                    }
                    crashed.insert(META_HOST.to_string(), end);
                }
                Fault::CrashKvGateway => {
                    if sim.is_host_running(KV_GATEWAY_HOST) {
                        sim.crash(KV_GATEWAY_HOST);
                    }
                    crashed.insert(KV_GATEWAY_HOST.to_string(), end);
                }
                Fault::IsolateKvGateway => {
                    for o in others(KV_GATEWAY_HOST) {
                        sim.partition(KV_GATEWAY_HOST, o.as_str());
                    }
                }
                Fault::PartitionStorage(n) => {
                    for o in others(&storage_host(*n)) {
                        sim.partition(storage_host(*n).as_str(), o.as_str());
                    }
                }
                Fault::PauseStorage(n) => {
                    for o in others(&storage_host(*n)) {
                        sim.hold(storage_host(*n).as_str(), o.as_str());
                    }
                }
                Fault::PartitionPair(a, b) => sim.partition(storage_host(*a).as_str(), storage_host(*b).as_str()),
                Fault::IsolateMgmtd { kv } => {
                    for o in others(&m) {
                        sim.partition(m.as_str(), o.as_str());
                    }
                    if *kv {
                        ctx.kv_cut[(target - 1) as usize].store(true, Ordering::SeqCst);
                    }
                }
                Fault::PauseMgmtd => {
                    for o in others(&m) {
                        sim.hold(m.as_str(), o.as_str());
                    }
                    ctx.kv_cut[(target - 1) as usize].store(true, Ordering::SeqCst);
                }
                Fault::Disk(t, op) => {
                    let mut s = ctx.shared.lock().unwrap();
                    if let Some(engine) = s.engines.get(t).and_then(std::sync::Weak::upgrade) {
                        engine.inject_io_fault(*op, EIO);
                        s.disk_faults.insert(*t, (elapsed_ms, None, None));
                    }
                }
                Fault::ArmPowerCut(which) => {
                    // A cut of one node hits the drawn node, or the next
                    // one running if another fault has it down (so that
                    // the cut finds live engines).
                    power_cut_nodes = match which {
                        None => (1..=nodes).collect(),
                        Some(n) => {
                            let order = (0..nodes).map(|k| (n - 1 + k) % nodes + 1);
                            let running = order.clone().find(|m| sim.is_host_running(storage_host(*m).as_str()));
                            vec![running.unwrap_or(*n)]
                        }
                    };
                    for n in &power_cut_nodes {
                        arm_power_cut(&ctx, *n, elapsed_ms);
                    }
                }
                Fault::PowerCut(_) => {
                    for n in std::mem::take(&mut power_cut_nodes) {
                        power_cut(&ctx, n, elapsed_ms);
                        let h = storage_host(n);
                        if sim.is_host_running(h.as_str()) {
                            sim.crash(h.as_str());
                        }
                        crashed.insert(h, end);
                    }
                }
                Fault::ClockJump { instance, delta_ms } => {
                    // Must change nothing: mgmtd measures every duration on
                    // its monotonic clock (checked below: the lease never
                    // moves without a fault of mgmtd, takeovers keep their bound).
                    ctx.clock_offset_ms[(*instance - 1) as usize].store(*delta_ms, Ordering::SeqCst);
                }
            }
            if !matches!(
                e.fault,
                Fault::CrashStorage(_)
                    | Fault::CrashMgmtd
                    | Fault::CrashMeta
                    | Fault::CrashKvGateway
                    | Fault::ArmPowerCut(_)
                    | Fault::PowerCut(_)
            ) {
                undo.push((end, e.fault.clone(), target));
            }
            if target > 0
                && takeover_watch.is_none()
                && dead(target, &crashed)
                && (1..=MGMTD_INSTANCES).any(|i| i != target && !dead(i, &crashed))
            {
                takeover_watch = Some((target, elapsed_ms));
            }
        }
        // Undo due faults.
        let heal_all = elapsed_ms >= FAULT_END_MS && !ctx.healed.load(Ordering::SeqCst);
        let mut i = 0;
        while i < undo.len() {
            if undo[i].0 <= elapsed_ms || heal_all {
                let (_, fault, target) = undo.remove(i);
                let m = mgmtd_host(target.max(1));
                match fault {
                    Fault::PartitionStorage(n) => {
                        for o in others(&storage_host(n)) {
                            sim.repair(storage_host(n).as_str(), o.as_str());
                        }
                    }
                    Fault::PauseStorage(n) => {
                        for o in others(&storage_host(n)) {
                            sim.release(storage_host(n).as_str(), o.as_str());
                        }
                    }
                    Fault::PartitionPair(a, b) => sim.repair(storage_host(a).as_str(), storage_host(b).as_str()),
                    Fault::IsolateMgmtd { .. } => {
                        for o in others(&m) {
                            sim.repair(m.as_str(), o.as_str());
                        }
                        ctx.kv_cut[(target - 1) as usize].store(false, Ordering::SeqCst);
                    }
                    Fault::PauseMgmtd => {
                        for o in others(&m) {
                            sim.release(m.as_str(), o.as_str());
                        }
                        ctx.kv_cut[(target - 1) as usize].store(false, Ordering::SeqCst);
                    }
                    Fault::Disk(t, _) => {
                        // The disk works again: restart its node (the
                        // engine reopens without the fault and re-syncs).
                        let mut s = ctx.shared.lock().unwrap();
                        s.disk_faults.remove(&t);
                        s.engines.remove(&t);
                        drop(s);
                        let n = fskv_mgmtd::layout::node_of(t);
                        let h = storage_host(n.0);
                        if sim.is_host_running(h.as_str()) {
                            sim.crash(h.as_str());
                        }
                        crashed.insert(h, elapsed_ms + RESTART_DELAY_MS);
                    }
                    Fault::ClockJump { instance, .. } => {
                        ctx.clock_offset_ms[(instance - 1) as usize].store(0, Ordering::SeqCst);
                    }
                    Fault::IsolateKvGateway => {
                        for o in others(KV_GATEWAY_HOST) {
                            sim.repair(KV_GATEWAY_HOST, o.as_str());
                        }
                    }
                    Fault::CrashStorage(_)
                    | Fault::CrashMgmtd
                    | Fault::CrashMeta
                    | Fault::CrashKvGateway
                    | Fault::ArmPowerCut(_)
                    | Fault::PowerCut(_) => {}
                }
            } else {
                i += 1;
            }
        }
        let restart: Vec<String> = crashed.iter().filter(|(_, end)| **end <= elapsed_ms || heal_all).map(|(h, _)| h.clone()).collect();
        for h in restart {
            crashed.remove(&h);
            ctx.shared.lock().unwrap().trace.push(format!("{elapsed_ms} restart {h}"));
            sim.bounce(h.as_str());
        }
        // Takeover: a standby holds the lease within the bound of the
        // primary's fault (unless the deposed one came back first, or no
        // standby could take over).
        if let Some((old, since)) = takeover_watch {
            let holder = lease_holder(&ctx.kv);
            if !dead(old, &crashed) || (1..=MGMTD_INSTANCES).all(|i| i == old || dead(i, &crashed)) {
                takeover_watch = None;
            } else if let Some((new, _)) = holder.filter(|(i, _)| *i != old) {
                let took = elapsed_ms - since;
                let mut s = ctx.shared.lock().unwrap();
                s.trace.push(format!("{elapsed_ms} {} took over from {} after {took} ms", mgmtd_host(new), mgmtd_host(old)));
                s.takeovers_ms.push(took);
                if took > TAKEOVER_BOUND_MS {
                    s.violations.push(format!("takeover after {took} ms (bound {TAKEOVER_BOUND_MS} ms) at {elapsed_ms} ms"));
                }
                takeover_watch = None;
            } else if elapsed_ms - since > TAKEOVER_BOUND_MS {
                ctx.shared
                    .lock()
                    .unwrap()
                    .violations
                    .push(format!("no standby took over within {TAKEOVER_BOUND_MS} ms of the fault of {} at {since} ms", mgmtd_host(old)));
                takeover_watch = None;
            }
        }
        // Disk faults: when the engine met the fault, and the bound on the
        // target leaving serving. The bound runs from the later of the
        // failed I/O and the end of any fault of mgmtd (while the primary
        // is crashed, cut off or paused, nobody may act; a clock jump is
        // not such a fault).
        let mgmtd_faulty =
            undo.iter().any(|(_, f, _)| f.hits_mgmtd()) || (1..=MGMTD_INSTANCES).any(|i| crashed.contains_key(&mgmtd_host(i)));
        if mgmtd_faulty {
            mgmtd_faulty_until_ms = elapsed_ms;
        }
        // Only a fault of mgmtd moves the lease (a clock jump must not):
        // a move with none in force, or within two leases of one, fails.
        let holder_now = lease_holder(&ctx.kv).map(|(i, _)| i);
        if holder_now != last_holder {
            if let (Some(from), Some(to)) = (last_holder, holder_now) {
                if !mgmtd_faulty && elapsed_ms > mgmtd_faulty_until_ms + 2 * MGMTD_LEASE_MS {
                    ctx.shared.lock().unwrap().violations.push(format!(
                        "the lease moved from {} to {} at {elapsed_ms} ms with no fault of mgmtd since {mgmtd_faulty_until_ms} ms",
                        mgmtd_host(from),
                        mgmtd_host(to)
                    ));
                }
            }
            last_holder = holder_now;
        }
        {
            let mut s = ctx.shared.lock().unwrap();
            let mut measured = Vec::new();
            let mut late = Vec::new();
            let watched: Vec<TargetId> = s.disk_faults.keys().copied().collect();
            let s_exited_at = s.exited_at.clone();
            let mut exited = Vec::new();
            // Storage nodes cut off from mgmtd now (partitioned or paused):
            // a failed target there cannot report itself, and mgmtd takes
            // the whole node out after T instead, which the serving bound
            // covers; the disk fault's own bound no longer applies.
            let cut_off: Vec<u32> = undo
                .iter()
                .filter_map(|(_, f, _)| match f {
                    Fault::PartitionStorage(n) | Fault::PauseStorage(n) => Some(*n),
                    _ => None,
                })
                .collect();
            for t in watched {
                if cut_off.iter().any(|n| ctx.node_targets(NodeId(*n)).contains(&t)) {
                    exited.push(t);
                    continue;
                }
                let engine = s.engines.get(&t).and_then(std::sync::Weak::upgrade);
                let failed_now = engine.as_ref().is_some_and(|e| e.is_failed());
                let Some(entry) = s.disk_faults.get_mut(&t) else { continue };
                if entry.1.is_none() && failed_now {
                    entry.1 = Some(elapsed_ms);
                }
                // The failed engine is gone before mgmtd took the target out:
                // its service exited (another fault, or its mgmtd lease ran
                // out), which stops the target too, and a restart opens the
                // engine on a working disk. Nothing left to measure. The
                // service stops serving when it decides to exit, before its
                // in-flight requests finish and its engines close (seed
                // 2484 of the first soak with the KV gateway: 2.3 s).
                let node_exited = s_exited_at.get(&fskv_mgmtd::layout::node_of(t)).is_some_and(|at| *at >= entry.0);
                if entry.1.is_some() && entry.2.is_none() && (!failed_now || node_exited) {
                    exited.push(t);
                }
            }
            for t in exited {
                s.disk_faults.remove(&t);
                s.trace.push(format!("{elapsed_ms} {t}: its service stopped or its node was cut off before mgmtd took it out of serving"));
            }
            let watched: Vec<TargetId> = s.disk_faults.keys().copied().collect();
            for t in watched {
                let Some(entry) = s.disk_faults.get_mut(&t) else { continue };
                match *entry {
                    (at, Some(failed), Some(out)) => measured.push((t, failed - at, out.saturating_sub(failed))),
                    (_, Some(failed), None) if elapsed_ms > failed.max(mgmtd_faulty_until_ms) + DISK_FAULT_OFFLINE_BOUND_MS => late.push((
                        t,
                        format!(
                            "{t}: still serving in every routing {} ms after its disk failed at {failed} ms (bound {DISK_FAULT_OFFLINE_BOUND_MS} ms)",
                            elapsed_ms - failed
                        ),
                    )),
                    _ => {}
                }
            }
            // Each fault is measured (or found late) once.
            for (t, to_fail, to_out) in measured {
                s.disk_faults.remove(&t);
                s.trace.push(format!("{elapsed_ms} {t} failed {to_fail} ms after its disk fault, out of serving {to_out} ms later"));
                s.disk_fault_ms.push((to_fail, to_out));
            }
            let late: Vec<String> = late
                .into_iter()
                .map(|(t, msg)| {
                    s.disk_faults.remove(&t);
                    msg
                })
                .collect();
            s.violations.extend(late);
        }
        // Supervisor: restart exited storage services.
        for n in 1..=nodes {
            let h = storage_host(n);
            if crashed.contains_key(&h) || sim.is_host_running(h.as_str()) {
                exited_since.remove(&n);
                continue;
            }
            let since = *exited_since.entry(n).or_insert(elapsed_ms);
            if elapsed_ms >= since + RESTART_DELAY_MS {
                exited_since.remove(&n);
                ctx.shared.lock().unwrap().trace.push(format!("{elapsed_ms} supervisor restarts {h}"));
                sim.bounce(h.as_str());
            }
        }
        if ctx.quiesce.load(Ordering::SeqCst) && !quiesced {
            quiesced = true;
            for h in [META_HOST, KV_GATEWAY_HOST] {
                if sim.is_host_running(h) {
                    sim.crash(h);
                }
            }
        }
        if heal_all {
            // Full heal: repair every link (also ones cut by overlapping faults).
            for a in &all_hosts {
                for b in &all_hosts {
                    if a < b {
                        sim.repair(a.as_str(), b.as_str());
                        sim.release(a.as_str(), b.as_str());
                    }
                }
            }
            for cut in &ctx.kv_cut {
                cut.store(false, Ordering::SeqCst);
            }
            for offset in &ctx.clock_offset_ms {
                offset.store(0, Ordering::SeqCst);
            }
            takeover_watch = None;
            ctx.healed.store(true, Ordering::SeqCst);
            let c = ctx.clone();
            sim.client("checker", counted(c.clone(), run_checker(c)));
            let c = ctx.clone();
            sim.client("file-checker", counted(c.clone(), run_file_checker(c)));
            let c = ctx.clone();
            sim.client("kv-checker", counted(c.clone(), run_kv_checker(c)));
            let c = ctx.clone();
            sim.client("quiesce", run_quiesce(c));
            checker_started = true;
        }
    }
    let healed_at = FAULT_END_MS;
    let simulated_ms = elapsed_ms;
    drop(sim);
    step_result?;

    // ---- checks
    let shared = ctx.shared.lock().unwrap();
    let mut problems: Vec<String> = shared.violations.clone();
    let conflicts = ctx.kv.conflicts.load(Ordering::SeqCst);
    if conflicts > 0 {
        problems.push(format!("{conflicts} KV transactions interleaved (the simulated engine assumes none)"));
    }
    match shared.all_serving_at_ms {
        None => problems.push(format!(
            "cluster not healthy (all nodes heartbeating, all targets serving and up to date, for T) within {SERVING_BOUND_MS} ms of the heal: last status {:?}",
            shared.last_status
        )),
        Some(t) => {
            if t > healed_at + SERVING_BOUND_MS {
                problems.push(format!("chains all serving only {} ms after the heal", t - healed_at));
            }
            if shared.kv_check.is_none() {
                problems.push("the KV checker did not run (the KV client never finished)".to_string());
            }
        }
    }
    // Open every target's engine from disk (all hosts are stopped).
    let mut engines: BTreeMap<TargetId, ChunkEngine> = BTreeMap::new();
    for n in 1..=nodes {
        for t in ctx.node_targets(NodeId(n)) {
            let dir = ctx.root.join(format!("node-{n}")).join(format!("target-{}", t.0));
            let engine = ChunkEngine::open(&dir, sim_engine_config()).map_err(|e| format!("reopen {t}: {e}"))?;
            engines.insert(t, engine);
        }
    }
    // Chain membership from the last layout (targets never change chains).
    let mut chain_targets: BTreeMap<ChainId, Vec<TargetId>> = BTreeMap::new();
    for ((chain, _), (targets, _)) in shared.chain_versions.iter() {
        chain_targets.insert(*chain, targets.iter().map(|t| t.target_id).collect());
    }
    // Replicas byte-identical: committed version and content of every chunk.
    // Every replica's state is kept: the acknowledged-write check reads each.
    let mut replicas: BTreeMap<ChainId, Vec<(TargetId, ReplicaState)>> = BTreeMap::new();
    let mut stale_pending: Vec<String> = Vec::new();
    for (chain, targets) in &chain_targets {
        let mut states: Vec<(TargetId, ReplicaState)> = Vec::new();
        for t in targets {
            let engine = &engines[t];
            let mut chunks = ReplicaState::new();
            for (chunk, meta) in engine.dump().map_err(|e| format!("dump {t}: {e}"))? {
                if let Some((pv, _)) = meta.pending {
                    // Not a failure: an unacknowledged write whose chain broke
                    // stays pending until the chunk's next write replaces it
                    // (reads there see "uncommitted"); reported in the summary.
                    stale_pending.push(format!("{t} {chunk} v{pv}"));
                }
                if meta.committed_ver == 0 {
                    // Only a pending first version: nothing a reader sees
                    // (as sync counts it: absent).
                    continue;
                }
                let data =
                    engine.read(chunk, 0, u64::MAX >> 1, ReadMode::CommittedOnly).map_err(|e| format!("read {t} {chunk}: {e}"))?.data;
                chunks.insert(chunk, (meta.committed_ver, Bytes::from(data)));
            }
            if let Some((rt, rchunks)) = states.first() {
                for difference in replica_differences(rchunks, &chunks) {
                    problems.push(format!("{chain}: replicas differ: {rt} vs {t}: {difference}"));
                }
            }
            states.push((*t, chunks));
        }
        replicas.insert(*chain, states);
    }
    // Every acknowledged write's latest value reads back, from every replica.
    for ((chain, chunk, r), writes) in &shared.writes {
        let last_acked = writes.iter().rposition(|w| w.acked);
        let allowed: Vec<&WriteRecord> = match last_acked {
            Some(i) => writes[i..].iter().collect(),
            None => writes.iter().collect(),
        };
        for (t, state) in replicas.get(chain).map(Vec::as_slice).unwrap_or_default() {
            let got = state.get(chunk).and_then(|(_, d)| region_of(d, *r));
            // Before any acknowledged operation the region may still be as
            // it started: nothing, or zeros.
            let ok = allowed.iter().any(|w| w.left(got)) || (last_acked.is_none() && got.is_none_or(|b| b.iter().all(|x| *x == 0)));
            if !ok {
                problems.push(format!(
                    "{chain} {chunk} region {r} on {t}: lost acknowledged write: expected one of {:?} (last acked {:?}), found {}",
                    allowed.iter().map(|w| (w.writer, w.seq, w.acked, w.removal)).collect::<Vec<_>>(),
                    last_acked.map(|i| writes[i].seq),
                    got.map_or_else(|| "nothing".to_string(), describe_region),
                ));
            }
        }
    }
    let trace_hash = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        shared.trace.hash(&mut h);
        h.finish()
    };
    let summary = format!(
        "seed {seed}: {nodes} nodes, {chains} chains, {} faults, takeovers after {:?} ms, disk faults (ms to the failed I/O, then out of serving) {:?}, {} acked / {} failed writes, files: {} acked / {} failed operations, checked (read back, skipped, fsck inodes) {:?}, KV: {} acked / {} failed operations, {} reads checked ({} failed), keys (as last acked, as a failed operation left them) {:?}, {} exits, all serving {} ms after heal, clock jumps (ms) {:?}, power cuts of nodes {:?}, {} of them inside an update, rolled back {} unsynced sectors (kept {}), stale pending versions {:?}, {:.1} s simulated",
        events.len(),
        shared.takeovers_ms,
        shared.disk_fault_ms,
        shared.acked,
        shared.failed,
        shared.file_ops.0,
        shared.file_ops.1,
        shared.file_check,
        shared.kv_counts.0,
        shared.kv_counts.1,
        shared.kv_reads.0,
        shared.kv_reads.1,
        shared.kv_check,
        shared.exits.len(),
        shared.all_serving_at_ms.map_or(-1, |t| t as i64 - healed_at as i64),
        events.iter().filter_map(|e| if let Fault::ClockJump { delta_ms, .. } = e.fault { Some(delta_ms) } else { None }).collect::<Vec<_>>(),
        events.iter().filter_map(|e| if let Fault::PowerCut(which) = e.fault { Some(which.map_or_else(|| "all".to_string(), |n| n.to_string())) } else { None }).collect::<Vec<_>>(),
        shared.power_cuts_inside_update,
        shared.power_cut_sectors.0,
        shared.power_cut_sectors.1,
        stale_pending,
        simulated_ms as f64 / 1000.0,
    );
    if let Some(out) = &trace_out {
        *out.lock().unwrap() = shared.trace.clone();
    }
    if let Ok(path) = std::env::var("FSKV_SIM_TRACE_FILE") {
        let _ = std::fs::write(format!("{path}.{seed}"), shared.trace.join("\n"));
    }
    if problems.is_empty() {
        Ok(Outcome { trace_hash, summary, simulated_ms })
    } else {
        if std::env::var("FSKV_SIM_TRACE").is_ok() {
            for line in &shared.trace {
                eprintln!("  {line}");
            }
        }
        Err(format!("{summary}\n  faults: {events:?}\n  exits: {:?}\n  {}", shared.exits, problems.join("\n  ")))
    }
}

/// Log timestamps in simulated ms (so the logs of two runs of a seed diff).
struct SimTimer;

impl tracing_subscriber::fmt::time::FormatTime for SimTimer {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{:>6}ms", now_ms())
    }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_timer(SimTimer)
        .with_ansi(false)
        .with_test_writer()
        .try_init();
}

/// Which seeds a run takes: `FSKV_SIM_SEED` (one), else from
/// `FSKV_SIM_FIRST_SEED` (default 1) every `n`-th seed from `k` on for
/// `FSKV_SIM_SHARD=k/n` (default `0/1`), `FSKV_SIM_SEEDS` of them (default
/// [`DEFAULT_SEEDS`]), or, with `FSKV_SIM_HOURS`, as many as it takes to
/// simulate that many cluster-hours (deploy/sim-soak.sh runs one shard per
/// core so).
struct SeedPlan {
    single: Option<u64>,
    first: u64,
    shard: u64,
    shards: u64,
    count: u64,
    hours: Option<f64>,
}

impl SeedPlan {
    fn from_env() -> SeedPlan {
        let var = |name: &str| std::env::var(name).ok();
        let num = |name: &str| var(name).map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")));
        let (shard, shards) = match var("FSKV_SIM_SHARD") {
            None => (0, 1),
            Some(v) => {
                let parsed = v.split_once('/').and_then(|(k, n)| Some((k.parse::<u64>().ok()?, n.parse::<u64>().ok()?)));
                match parsed {
                    Some((k, n)) if n > 0 && k < n => (k, n),
                    _ => panic!("FSKV_SIM_SHARD must be k/n with k < n, got {v:?}"),
                }
            }
        };
        let hours = var("FSKV_SIM_HOURS").map(|v| match v.parse::<f64>() {
            Ok(h) if h > 0.0 && h.is_finite() => h,
            _ => panic!("FSKV_SIM_HOURS must be a positive number, got {v:?}"),
        });
        SeedPlan {
            single: num("FSKV_SIM_SEED"),
            first: num("FSKV_SIM_FIRST_SEED").unwrap_or(1),
            shard,
            shards,
            count: num("FSKV_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS),
            hours,
        }
    }

    /// The `i`-th seed of the plan, or `None` once it is done (given the
    /// simulated ms run so far).
    fn seed(&self, i: u64, simulated_ms: u64) -> Option<u64> {
        if let Some(s) = self.single {
            return (i == 0).then_some(s);
        }
        let more = match self.hours {
            Some(h) => (simulated_ms as f64) < h * 3_600_000.0,
            None => i < self.count,
        };
        more.then(|| self.first + self.shard + i * self.shards)
    }
}

#[test]
fn simulated_cluster_survives_random_faults() {
    init_tracing();
    let plan = SeedPlan::from_env();
    let mut failures = Vec::new();
    let all_started = std::time::Instant::now();
    // Simulated time of the passing seeds (reported), and of all (the budget).
    let mut simulated_ms = 0u64;
    let mut budget_ms = 0u64;
    let mut seeds = 0u64;
    while let Some(seed) = plan.seed(seeds, budget_ms) {
        seeds += 1;
        let started = std::time::Instant::now();
        match run_seed(seed) {
            Ok(o) => {
                simulated_ms += o.simulated_ms;
                budget_ms += o.simulated_ms;
                eprintln!("{} (trace {:016x}, {:.1} s)", o.summary, o.trace_hash, started.elapsed().as_secs_f64())
            }
            Err(e) => {
                eprintln!("FAILED {e}\n  replay: FSKV_SIM_SEED={seed} cargo test -p fskv-sim --test sim");
                failures.push(seed);
                // A failing seed's time counts against a budget in hours too.
                budget_ms += FAULT_END_MS + SERVING_BOUND_MS;
            }
        }
    }
    let real_s = all_started.elapsed().as_secs_f64();
    let hours = simulated_ms as f64 / 3_600_000.0;
    eprintln!(
        "simulated cluster time of the passing seeds: {hours:.3} cluster-hours over {seeds} seeds ({} failed) in {real_s:.0} s ({:.3} cluster-hours per minute)",
        failures.len(),
        hours / (real_s / 60.0)
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?} (replay with FSKV_SIM_SEED=<seed>)");
}

/// Seeds replayed by [`a_seed_replays_exactly`] (`FSKV_SIM_SEED` picks one).
const REPLAY_SEEDS: &[u64] = &[1, 7, 24, 99, 3, 42];

/// A seed replays exactly: two runs give the same event trace (every
/// routing first seen, write outcome, fault, exit and restart, with its
/// simulated ms). On failure the two traces are written to
/// `$TMPDIR/fskv-sim-replay.<seed>.{a,b}` for a diff.
#[test]
fn a_seed_replays_exactly() {
    init_tracing();
    let seeds: Vec<u64> = match std::env::var("FSKV_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("FSKV_SIM_SEED must be a number")],
        Err(_) => REPLAY_SEEDS.to_vec(),
    };
    let mut differ = Vec::new();
    for seed in seeds {
        let started = std::time::Instant::now();
        let a = run_seed_trace(seed);
        let b = run_seed_trace(seed);
        if a != b {
            let dir = std::env::temp_dir();
            let _ = std::fs::write(dir.join(format!("fskv-sim-replay.{seed}.a")), a.join("\n"));
            let _ = std::fs::write(dir.join(format!("fskv-sim-replay.{seed}.b")), b.join("\n"));
            let first = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            eprintln!("seed {seed}: traces differ at line {first}: {:?} vs {:?}", a.get(first), b.get(first));
            differ.push(seed);
        } else {
            eprintln!("seed {seed}: {} trace lines, identical ({:.1} s for two runs)", a.len(), started.elapsed().as_secs_f64());
        }
    }
    assert!(differ.is_empty(), "seeds {differ:?} did not replay identically");
}
