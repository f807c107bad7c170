//! The writer side of a partition: one task ("actor") per partition this
//! gateway owns. It is the partition's sequencer: it holds the lease,
//! assigns offsets, checks idempotent producers and FIFO dedup ids, keeps
//! the queues' delivery state, and makes everything durable before it
//! answers.
//!
//! **A flush** (group commit): the actor takes every request waiting
//! (produces and queue operations, up to `flush_max_bytes`), then
//!
//! | step | what | durable when |
//! |---|---|---|
//! | 1 | append the new batches to the active segment, index entries to its index, queue deltas to the queues' state logs — concurrently, each one `write_at` | the storage client returns: every replica of each chain committed the bytes (chunk engine: data `fdatasync`, then its journal `fdatasync`) |
//! | 2 | CAS the state file: `hw` and `seg_bytes` past the new batches, lease extended | with a queue operation: meta's transaction committed (RocksDB WAL synced); produces only: a relaxed change (WAL written, synced within meta's `relaxed_sync_interval_ms`) — power loss may take it, acquire re-finds its batches ([`adopt_tail`]) |
//! | 3 | answer every request of the flush | — |
//!
//! Step 1 of flush k+1 runs while step 2 of flush k is in flight (two-stage
//! pipeline); the CASes chain on the version each one wrote. A failure in
//! either step fails the requests of the flushes not yet answered and drops
//! the ownership; the next request re-acquires (a new epoch and segment),
//! rebuilding every in-memory table from what is durable.
//!
//! **Acquire** (first request, or after a failure): read the state; apply
//! the lease rules ([`crate::state::decide_acquire`]); adopt the whole,
//! valid batches past the state's end of the previous active segment that
//! continue its offsets ([`adopt_tail`]); create the new
//! segment `<hw>-<epoch>.log` and its index (exclusive create; an existing
//! name means a crashed attempt: a higher epoch is taken); seal the
//! previous active segment in the manifest (CAS); CAS the state (new epoch,
//! owner, lease, active segment). Then rebuild the producer table and the
//! dedup window from the newest snapshot plus the batches after it.
//!
//! **Housekeeping** between flushes: renew the lease when a third of it is
//! left; roll the segment at `segment_bytes` / `segment_ms` (producer
//! snapshot, new segment, manifest, state); retention (drop whole sealed
//! segments by age or size: manifest, then `log_start` in the state, then
//! unlink); release the partition after `idle_release_ms` without requests.

use crate::error::{from_file, from_meta, MqError, Result};
use crate::index::IndexBuilder;
use crate::log::{read_manifest, write_manifest, LogReader, SealedSegment};
use crate::producer::{DedupTable, ProducerTable, SeqCheck};
use crate::queue::{AckResult, Changes, Entry, QueueCounts, QueueRules, QueueState, RecordInfo};
use crate::record::{
    encode_batch, scan_batch, BatchHeader, ProducerFields, Record, Scan, StoredRecord, HEADER_DEDUP_ID, HEADER_DELAY_MS, HEADER_GROUP,
};
use crate::state::{decide_acquire, index_name, parse_segment_name, segment_name, Acquire, PartitionState};
use crate::store::{list_names, now_ms, read_json, reader, write_json, Store, TopicMeta, Versioned, FILE_MODE};
use bytes::{Bytes, BytesMut};
use fskv_client::file::FileHandle;
use fskv_proto::meta::{Expected, InodeData};
use fskv_types::{ErrorCode, InodeId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Settings of the writer side (see docs/mq.md, "Limits").
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// This gateway's writer id: a restart with the same id takes its partitions back at once.
    pub writer_id: String,
    /// The URL other gateways name when they redirect to this one.
    pub endpoint: String,
    pub lease_ms: u64,
    pub flush_max_bytes: usize,
    pub index_interval_bytes: u64,
    pub idle_release_ms: u64,
    pub housekeeping_ms: u64,
    pub producer_expiry_ms: u64,
    pub max_producers: usize,
    pub max_dedup_keys: usize,
    pub max_recovery_scan_bytes: u64,
    pub queue_compact_bytes: u64,
    pub max_batch_bytes: usize,
    pub tail_cache_bytes: usize,
    pub max_queued_requests: usize,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            writer_id: "writer".into(),
            endpoint: String::new(),
            lease_ms: 10_000,
            flush_max_bytes: 8 << 20,
            index_interval_bytes: 4096,
            idle_release_ms: 60_000,
            housekeeping_ms: 1000,
            producer_expiry_ms: 24 * 3600 * 1000,
            max_producers: 10_000,
            max_dedup_keys: 1_000_000,
            max_recovery_scan_bytes: 1 << 30,
            queue_compact_bytes: 4 << 20,
            max_batch_bytes: 16 << 20,
            tail_cache_bytes: 32 << 20,
            max_queued_requests: 4096,
        }
    }
}

/// The answer to a produce.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Produced {
    pub partition: u32,
    /// Offset of the first record written (or, for a duplicate batch, of the original).
    pub base_offset: u64,
    pub count: u32,
    /// The whole batch was a retry of one already written (idempotent producer).
    pub duplicate: bool,
    /// Per record, its offset (records dropped as FIFO duplicates have their original's).
    pub offsets: Vec<u64>,
    /// Per record, whether it was a FIFO duplicate.
    pub deduplicated: Vec<bool>,
    pub append_time_ms: i64,
}

/// One message handed out by a receive.
#[derive(Clone, Debug)]
pub struct ReceivedMessage {
    pub offset: u64,
    pub record: Record,
    pub count: u32,
    pub nonce: u64,
    pub first_receive_ms: u64,
}

#[derive(Clone, Debug)]
pub enum QueueOp {
    Receive { max: usize, visibility_ms: u64 },
    Ack(Vec<(u64, u64)>),
    ChangeVisibility(Vec<(u64, u64, u64)>),
    Release(Vec<(u64, u64, u64)>),
    Purge,
    Counts,
    Moved { offset: u64, ok: bool },
}

#[derive(Debug)]
pub enum QueueReply {
    Received(Vec<ReceivedMessage>),
    Acked(Vec<Result<AckResult>>),
    Changed(Vec<Result<()>>),
    Purged,
    Counts { counts: QueueCounts, high_watermark: u64 },
    Done,
}

enum Cmd {
    Produce { producer: Option<ProducerFields>, records: Vec<Record>, reply: oneshot::Sender<Result<Produced>> },
    Queue { queue: String, op: QueueOp, reply: oneshot::Sender<Result<QueueReply>> },
    Takeover { force: bool, reply: oneshot::Sender<Result<u64>> },
}

impl Cmd {
    fn fail(self, e: MqError) {
        match self {
            Cmd::Produce { reply, .. } => drop(reply.send(Err(e))),
            Cmd::Queue { reply, .. } => drop(reply.send(Err(e))),
            Cmd::Takeover { reply, .. } => drop(reply.send(Err(e))),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Cmd::Produce { records, .. } => records.iter().map(Record::encoded_len).sum::<usize>() + 64,
            _ => 256,
        }
    }
}

type Key = (String, u32);

/// The writer side of a gateway: its partition actors.
#[derive(Clone)]
pub struct Writer {
    inner: Arc<WriterInner>,
}

struct WriterInner {
    store: Store,
    log: LogReader,
    cfg: WriterConfig,
    actors: Mutex<HashMap<Key, mpsc::Sender<Cmd>>>,
    /// Committed high watermarks of owned partitions (local long polls).
    hws: Mutex<HashMap<Key, watch::Receiver<u64>>>,
}

impl Writer {
    pub fn new(store: Store, log: LogReader, cfg: WriterConfig) -> Writer {
        Writer { inner: Arc::new(WriterInner { store, log, cfg, actors: Mutex::default(), hws: Mutex::default() }) }
    }

    pub fn config(&self) -> &WriterConfig {
        &self.inner.cfg
    }

    /// The committed high watermark of a partition this gateway owns now.
    pub fn watch_hw(&self, topic: &str, partition: u32) -> Option<watch::Receiver<u64>> {
        self.inner.hws.lock().get(&(topic.to_string(), partition)).cloned()
    }

    async fn send(&self, topic: &str, partition: u32, make: impl Fn(&mut Option<Cmd>)) -> Result<()> {
        let key = (topic.to_string(), partition);
        for _ in 0..3 {
            let tx = {
                let mut actors = self.inner.actors.lock();
                match actors.get(&key) {
                    Some(tx) if !tx.is_closed() => tx.clone(),
                    _ => {
                        let (tx, rx) = mpsc::channel(self.inner.cfg.max_queued_requests);
                        actors.insert(key.clone(), tx.clone());
                        let actor = Actor::new(self.clone(), key.clone(), rx);
                        let span = tracing::info_span!("partition", topic = %key.0, partition = key.1);
                        tokio::spawn(tracing::Instrument::instrument(actor.run(), span));
                        tx
                    }
                }
            };
            let mut cmd = None;
            make(&mut cmd);
            let Some(cmd) = cmd else { return Err(MqError::Internal("no command".into())) };
            match tx.try_send(cmd) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Full(c)) => {
                    // Back-pressure: wait for room.
                    if let Err(e) = tx.send(c).await {
                        e.0.fail(MqError::Unavailable("the partition writer stopped".into()));
                    }
                    return Ok(());
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    let mut actors = self.inner.actors.lock();
                    if actors.get(&key).is_some_and(|t| t.same_channel(&tx)) {
                        actors.remove(&key);
                    }
                }
            }
        }
        Err(MqError::Unavailable("the partition writer could not be started".into()))
    }

    /// Appends records (one batch) to a partition.
    pub async fn produce(&self, topic: &str, partition: u32, producer: Option<ProducerFields>, records: Vec<Record>) -> Result<Produced> {
        let (tx, rx) = oneshot::channel();
        let slot = Mutex::new(Some((tx, records)));
        self.send(topic, partition, |c| {
            if let Some((reply, records)) = slot.lock().take() {
                *c = Some(Cmd::Produce { producer, records, reply });
            }
        })
        .await?;
        rx.await.map_err(|_| MqError::Unavailable("the partition writer stopped".into()))?
    }

    /// Runs a queue operation on a partition.
    pub async fn queue(&self, topic: &str, partition: u32, queue: &str, op: QueueOp) -> Result<QueueReply> {
        let (tx, rx) = oneshot::channel();
        let slot = Mutex::new(Some(tx));
        self.send(topic, partition, |c| {
            if let Some(reply) = slot.lock().take() {
                *c = Some(Cmd::Queue { queue: queue.to_string(), op: op.clone(), reply });
            }
        })
        .await?;
        rx.await.map_err(|_| MqError::Unavailable("the partition writer stopped".into()))?
    }

    /// Takes a partition over (with `force`, even from a live owner: it is
    /// fenced); returns the new epoch.
    pub async fn takeover(&self, topic: &str, partition: u32, force: bool) -> Result<u64> {
        let (tx, rx) = oneshot::channel();
        let slot = Mutex::new(Some(tx));
        self.send(topic, partition, |c| {
            if let Some(reply) = slot.lock().take() {
                *c = Some(Cmd::Takeover { force, reply });
            }
        })
        .await?;
        rx.await.map_err(|_| MqError::Unavailable("the partition writer stopped".into()))?
    }
}

/// A queue's delivery state as the owner holds it, with its state log.
struct QueueHolder {
    state: QueueState,
    file: FileHandle,
    file_name: String,
    bytes: u64,
    seq: u64,
    changes: Changes,
}

/// Frames of a queue state log: `u32 len, u32 crc32c, JSON`.
#[derive(Serialize, Deserialize)]
enum QFrame {
    Snapshot(QueueState),
    Delta { scan: u64, next_nonce: u64, purged_ms: u64, changes: Vec<(u64, Option<Entry>)> },
}

fn frame(f: &QFrame) -> Result<Vec<u8>> {
    let json = serde_json::to_vec(f).map_err(|e| MqError::Internal(e.to_string()))?;
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&json).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// The valid frames at the start of `data` (stops at the first torn or zero one).
fn frames(data: &[u8]) -> Vec<QFrame> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 8 <= data.len() {
        let len = u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize;
        let crc = u32::from_le_bytes([data[at + 4], data[at + 5], data[at + 6], data[at + 7]]);
        if len == 0 || at + 8 + len > data.len() {
            break;
        }
        let body = &data[at + 8..at + 8 + len];
        if crc32c::crc32c(body) != crc {
            break;
        }
        match serde_json::from_slice::<QFrame>(body) {
            Ok(f) => out.push(f),
            Err(_) => break,
        }
        at += 8 + len;
    }
    out
}

fn queue_file_name(queue: &str, epoch: u64, seq: u64) -> String {
    format!("queue-{queue}-{epoch:010}-{seq:06}.q")
}

fn parse_queue_file(name: &str, queue: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix("queue-")?.strip_suffix(".q")?;
    let (q, tail) = rest.rsplit_once('-').and_then(|(a, seq)| a.rsplit_once('-').map(|(q, e)| (q, (e, seq))))?;
    if q != queue {
        return None;
    }
    Some((tail.0.parse().ok()?, tail.1.parse().ok()?))
}

/// Producer table and dedup window as of an offset (`producers-<offset>.snap`).
#[derive(Serialize, Deserialize)]
struct ProducerSnapshot {
    offset: u64,
    producers: ProducerTable,
    dedup: DedupTable,
}

fn snapshot_name(offset: u64) -> String {
    format!("producers-{offset:020}.snap")
}

/// Recent batches, so deliveries of fresh messages read no storage.
#[derive(Default)]
struct Tail {
    batches: VecDeque<(BatchHeader, Bytes)>,
    bytes: usize,
}

impl Tail {
    fn push(&mut self, h: BatchHeader, b: Bytes, max: usize) {
        self.bytes += b.len();
        self.batches.push_back((h, b));
        while self.bytes > max {
            match self.batches.pop_front() {
                Some((_, b)) => self.bytes -= b.len(),
                None => break,
            }
        }
    }

    fn first_offset(&self) -> Option<u64> {
        self.batches.front().map(|(h, _)| h.base_offset)
    }
}

/// What the partition owner holds.
struct Owned {
    /// The state as last committed (CAS'd), and the version it was written at.
    state: PartitionState,
    version: (InodeId, u64),
    epoch: u64,
    seg: FileHandle,
    idx: FileHandle,
    /// Uncommitted ends (past the committed ones while a flush is in flight).
    next_offset: u64,
    seg_bytes: u64,
    seg_max_ts: i64,
    /// Bytes of the index file written.
    idx_bytes: u64,
    /// Index entries not written yet (fewer than [`INDEX_WRITE_BYTES`]).
    idx_pending: Vec<u8>,
    index: IndexBuilder,
    producers: ProducerTable,
    dedup: DedupTable,
    queues: HashMap<String, QueueHolder>,
    tail: Tail,
    hw_tx: watch::Sender<u64>,
}

enum Waiter {
    Produce(oneshot::Sender<Result<Produced>>, Produced),
    Queue(oneshot::Sender<Result<QueueReply>>, Result<QueueReply>),
}

impl Waiter {
    fn succeed(self) {
        match self {
            Waiter::Produce(tx, p) => drop(tx.send(Ok(p))),
            Waiter::Queue(tx, r) => drop(tx.send(r)),
        }
    }

    fn fail(self, e: MqError) {
        match self {
            Waiter::Produce(tx, _) => drop(tx.send(Err(e))),
            Waiter::Queue(tx, _) => drop(tx.send(Err(e))),
        }
    }
}

/// A flush whose CAS is in flight.
struct Committing {
    task: JoinHandle<Result<Versioned<PartitionState>>>,
    waiters: Vec<Waiter>,
    batches: Vec<(BatchHeader, Bytes)>,
    dead_letters: Vec<DeadLetter>,
}

/// A message to copy to a dead-letter topic once its flush committed.
struct DeadLetter {
    target: String,
    queue: String,
    offset: u64,
    record: StoredRecord,
}

struct Actor {
    writer: Writer,
    key: Key,
    rx: mpsc::Receiver<Cmd>,
    pdir: Option<InodeId>,
    owned: Option<Owned>,
    committing: Option<Committing>,
    last_request: Instant,
    last_housekeeping: Instant,
}

fn lost(e: &MqError) -> bool {
    matches!(e, MqError::Conflict(_) | MqError::Fenced(_))
}

impl Actor {
    fn new(writer: Writer, key: Key, rx: mpsc::Receiver<Cmd>) -> Actor {
        Actor {
            writer,
            key,
            rx,
            pdir: None,
            owned: None,
            committing: None,
            last_request: Instant::now(),
            last_housekeeping: Instant::now(),
        }
    }

    fn cfg(&self) -> &WriterConfig {
        &self.writer.inner.cfg
    }

    fn store(&self) -> &Store {
        &self.writer.inner.store
    }

    async fn run(mut self) {
        let tick = Duration::from_millis(self.cfg().housekeeping_ms.max(10));
        loop {
            let cmd = tokio::select! {
                c = self.rx.recv() => match c {
                    Some(c) => Some(c),
                    None => break,
                },
                r = async { match self.committing.as_mut() { Some(c) => (&mut c.task).await, None => std::future::pending().await } } => {
                    // A failed commit was answered to its requests and logged there.
                    let _ = self.finish_commit(r).await;
                    continue;
                }
                _ = tokio::time::sleep(tick) => None,
            };
            match cmd {
                Some(c) => {
                    self.last_request = Instant::now();
                    let mut cmds = vec![c];
                    let mut bytes = cmds[0].bytes();
                    while bytes < self.cfg().flush_max_bytes {
                        match self.rx.try_recv() {
                            Ok(c) => {
                                bytes += c.bytes();
                                cmds.push(c);
                            }
                            Err(_) => break,
                        }
                    }
                    self.flush(cmds).await;
                    // Under steady load the channel is never empty: roll,
                    // retention and lease renewal still run every tick (or at
                    // once when the active segment is full), between flushes.
                    if self.last_housekeeping.elapsed() >= tick || self.segment_full().await {
                        let _ = self.drain_commit().await;
                        if self.housekeeping().await {
                            break;
                        }
                    }
                }
                None => {
                    if self.committing.is_none() && self.housekeeping().await {
                        break;
                    }
                }
            }
        }
        self.stop().await;
    }

    /// Waits for the in-flight CAS and answers its flush.
    async fn drain_commit(&mut self) -> Result<()> {
        if let Some(c) = self.committing.as_mut() {
            let r = (&mut c.task).await;
            return self.finish_commit(r).await;
        }
        Ok(())
    }

    async fn finish_commit(&mut self, r: std::result::Result<Result<Versioned<PartitionState>>, tokio::task::JoinError>) -> Result<()> {
        let Some(c) = self.committing.take() else { return Ok(()) };
        let r = r.map_err(|e| MqError::Internal(format!("commit task: {e}"))).and_then(|r| r);
        match r {
            Ok(v) => {
                if let Some(o) = self.owned.as_mut() {
                    o.state = v.value.clone();
                    o.version = (v.inode, v.version);
                    let max = self.writer.inner.cfg.tail_cache_bytes;
                    for (h, b) in c.batches {
                        o.tail.push(h, b, max);
                    }
                    let _ = o.hw_tx.send(v.value.hw);
                }
                for w in c.waiters {
                    w.succeed();
                }
                for d in c.dead_letters {
                    self.spawn_dead_letter(d);
                }
                Ok(())
            }
            Err(e) => {
                let e = if matches!(e, MqError::Conflict(_)) {
                    MqError::Fenced("the partition state changed under this writer".into())
                } else {
                    e
                };
                tracing::warn!(error = %e, "commit failed; dropping the partition");
                for w in c.waiters {
                    w.fail(clone_err(&e));
                }
                self.drop_ownership().await;
                Err(e)
            }
        }
    }

    async fn drop_ownership(&mut self) {
        if let Some(o) = self.owned.take() {
            self.writer.inner.hws.lock().remove(&self.key);
            tokio::spawn(async move {
                let _ = o.seg.close().await;
                write_index_tail(&o.idx, o.idx_bytes, o.idx_pending).await;
                let _ = o.idx.close().await;
                for (_, q) in o.queues {
                    let _ = q.file.close().await;
                }
            });
        }
    }

    async fn stop(&mut self) {
        let _ = self.drain_commit().await;
        if let Some(o) = self.owned.as_ref() {
            // Release the lease so another writer may take over at once.
            let mut s = o.state.clone();
            s.lease_until_ms = 0;
            let pdir = self.pdir;
            let expected = Expected::Inode { id: o.version.0, version: o.version.1 };
            if let Some(pdir) = pdir {
                if let Err(e) = self.store().write_state(pdir, &s, expected).await {
                    tracing::debug!(error = %e, "release of the lease failed");
                }
            }
        }
        self.drop_ownership().await;
        self.rx.close();
        while let Ok(c) = self.rx.try_recv() {
            c.fail(MqError::Unavailable("the partition writer is stopping; retry".into()));
        }
        let mut actors = self.writer.inner.actors.lock();
        if actors.get(&self.key).is_some_and(|t| t.is_closed()) {
            actors.remove(&self.key);
        }
    }

    async fn pdir(&mut self) -> Result<InodeId> {
        if let Some(p) = self.pdir {
            return Ok(p);
        }
        let p = self.store().partition_dir(&self.key.0, self.key.1).await?;
        self.pdir = Some(p);
        Ok(p)
    }

    async fn topic(&self) -> Result<Arc<TopicMeta>> {
        self.store().topic(&self.key.0).await
    }

    /// Takes ownership (see the module docs).
    async fn acquire(&mut self, force: bool) -> Result<()> {
        let pdir = self.pdir().await?;
        let cfg = self.cfg().clone();
        let store = self.store().clone();
        let topic = self.topic().await?;
        let mut last_err = None;
        for attempt in 0..5 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
            }
            let cur = match store.read_state(pdir).await {
                Ok(s) => s,
                Err(MqError::NotFound(_)) => return Err(MqError::TopicNotFound(self.key.0.clone())),
                Err(e) => return Err(e),
            };
            let names = list_names(&store.fs, pdir).await?;
            let max_seen = names.iter().filter_map(|n| parse_segment_name(n, "log")).map(|(_, e)| e).max().unwrap_or(0);
            let now = now_ms();
            let epoch = match decide_acquire(&cur.value, &cfg.writer_id, now, force, max_seen + 1) {
                Acquire::Take { epoch } => epoch,
                Acquire::Refuse { owner, remaining_ms } => return Err(MqError::NotPartitionWriter { owner, lease_ms: remaining_ms }),
            };
            let s = &cur.value;
            let adopted = adopt_tail(&store, pdir, s, &cfg).await?;
            if adopted.hw > s.hw {
                tracing::warn!(
                    segment = %s.seg,
                    from = s.hw,
                    to = adopted.hw,
                    bytes = adopted.seg_bytes - s.seg_bytes,
                    "batches past the partition state adopted (a relaxed state change lost to power loss, or a fenced writer's last flush)"
                );
            }
            let base = adopted.hw;
            let seg_name = segment_name(base, epoch);
            let seg = match store.fs.create_at(pdir, &seg_name, FILE_MODE, true).await {
                Ok(h) => h,
                Err(e) if e.code() == ErrorCode::AlreadyExists => {
                    last_err = Some(MqError::Conflict(format!("{seg_name} exists")));
                    continue;
                }
                Err(e) => return Err(from_file(e, &seg_name)),
            };
            let idx = store.fs.create_at(pdir, &index_name(base, epoch), FILE_MODE, false).await.map_err(|e| from_file(e, "index"))?;
            // Seal the previous active segment (an empty one is dropped).
            if !s.seg.is_empty() && adopted.seg_bytes > 0 {
                let manifest = read_manifest(&store, pdir).await?;
                let mut m = manifest.as_ref().map(|v| v.value.clone()).unwrap_or_default();
                m.seal(SealedSegment {
                    name: s.seg.clone(),
                    base: s.seg_base,
                    end: adopted.seg_bytes,
                    next: adopted.hw,
                    max_ts: adopted.max_ts,
                });
                if let Err(e) = write_manifest(&store, pdir, &m, manifest.as_ref()).await {
                    discard(&store, pdir, seg, idx, &seg_name).await;
                    last_err = Some(e);
                    continue;
                }
            }
            let new = PartitionState {
                v: 1,
                epoch,
                writer: cfg.writer_id.clone(),
                endpoint: cfg.endpoint.clone(),
                lease_until_ms: now + cfg.lease_ms,
                log_start: s.log_start,
                hw: adopted.hw,
                seg: seg_name.clone(),
                seg_base: base,
                seg_bytes: 0,
                seg_max_ts: -1,
                seg_created_ms: now,
                snap: s.snap,
            };
            let v = match store.write_state(pdir, &new, cur.expected()).await {
                Ok(v) => v,
                Err(e) => {
                    discard(&store, pdir, seg, idx, &seg_name).await;
                    last_err = Some(e);
                    continue;
                }
            };
            self.writer.inner.log.forget(pdir);
            if !s.seg.is_empty() && adopted.seg_bytes == 0 {
                let _ = store.fs.meta().unlink(pdir, &s.seg).await;
                let _ = store.fs.meta().unlink(pdir, &s.seg.replace(".log", ".idx")).await;
            }
            let (producers, dedup) = self.recover_producers(pdir, &v.value, &topic).await?;
            let (hw_tx, hw_rx) = watch::channel(v.value.hw);
            self.writer.inner.hws.lock().insert(self.key.clone(), hw_rx);
            tracing::info!(epoch, hw = v.value.hw, segment = %seg_name, previous_writer = %s.writer, "partition acquired");
            self.owned = Some(Owned {
                next_offset: v.value.hw,
                seg_bytes: 0,
                seg_max_ts: -1,
                idx_bytes: 0,
                idx_pending: Vec::new(),
                index: IndexBuilder::new(cfg.index_interval_bytes, -1),
                state: v.value,
                version: (v.inode, v.version),
                epoch,
                seg,
                idx,
                producers,
                dedup,
                queues: HashMap::new(),
                tail: Tail::default(),
                hw_tx,
            });
            return Ok(());
        }
        Err(last_err.unwrap_or_else(|| MqError::Conflict("could not acquire the partition".into())))
    }

    /// The producer table and dedup window: the newest snapshot, then the
    /// batches after it (at most `max_recovery_scan_bytes` of them).
    async fn recover_producers(&self, pdir: InodeId, state: &PartitionState, topic: &TopicMeta) -> Result<(ProducerTable, DedupTable)> {
        let store = self.store();
        let mut from = state.log_start;
        let (mut producers, mut dedup) = (ProducerTable::default(), DedupTable::default());
        if let Some(snap) = state.snap {
            if let Some(v) = read_json::<ProducerSnapshot>(&store.fs, pdir, &snapshot_name(snap)).await? {
                producers = v.value.producers;
                dedup = v.value.dedup;
                from = v.value.offset.max(state.log_start);
            }
        }
        let log = &self.writer.inner.log;
        let mut offset = from;
        let mut scanned = 0u64;
        let now = now_ms();
        if state.hw > offset {
            // Bound the scan: producers idle that long are forgotten anyway.
            let segs = log.segments(pdir, state).await?;
            let mut acc = 0u64;
            for s in segs.iter().rev().filter(|s| s.next > offset) {
                acc += s.end;
                if acc > self.cfg().max_recovery_scan_bytes {
                    tracing::warn!(from = offset, to = s.next, "producer state recovery skips old segments (max_recovery_scan_bytes)");
                    offset = s.next.max(offset);
                    break;
                }
            }
        }
        while offset < state.hw {
            let (batches, next) = log.records(pdir, state, offset, 4 << 20).await?;
            if batches.is_empty() || next <= offset {
                break;
            }
            for (h, recs) in &batches {
                scanned += u64::from(h.total_bytes);
                if h.producer_id >= 0 {
                    let p = ProducerFields { id: h.producer_id, epoch: h.producer_epoch, base_sequence: h.base_sequence };
                    producers.record(p, h.record_count, h.base_offset, h.max_timestamp_ms.max(0) as u64);
                }
                if topic.fifo {
                    for r in recs {
                        if let Some(id) = r.record.header_str(HEADER_DEDUP_ID) {
                            let key = DedupTable::key(id, r.record.header_str(HEADER_GROUP), topic.dedup_by_group);
                            dedup.insert(key, r.offset, r.record.timestamp_ms.max(0) as u64);
                        }
                    }
                }
            }
            offset = next;
        }
        producers.expire(now, self.cfg().producer_expiry_ms, self.cfg().max_producers);
        dedup.expire(now, topic.dedup_window_ms, self.cfg().max_dedup_keys);
        tracing::debug!(scanned, producers = producers.producers.len(), dedup = dedup.len(), "producer state recovered");
        Ok((producers, dedup))
    }

    /// Ensures ownership, acquiring if needed.
    async fn ensure_owned(&mut self) -> Result<()> {
        if self.owned.is_some() {
            // A lease about to run out without renewal (meta unreachable):
            // stop acting before another writer may take over.
            let left = self.owned.as_ref().map_or(0, |o| o.state.lease_until_ms.saturating_sub(now_ms()));
            if left > self.cfg().lease_ms / 10 {
                return Ok(());
            }
            self.drain_commit().await.ok();
            if self.owned.is_some() {
                self.renew().await?;
                return Ok(());
            }
        }
        self.acquire(false).await
    }

    /// One flush (see the module docs).
    async fn flush(&mut self, cmds: Vec<Cmd>) {
        // A takeover request is handled alone, between flushes.
        let (takeovers, cmds): (Vec<Cmd>, Vec<Cmd>) = cmds.into_iter().partition(|c| matches!(c, Cmd::Takeover { .. }));
        for t in takeovers {
            if let Cmd::Takeover { force, reply } = t {
                let _ = self.drain_commit().await;
                let r = if self.owned.is_some() && !force {
                    Ok(self.owned.as_ref().map_or(0, |o| o.epoch))
                } else {
                    self.drop_ownership().await;
                    self.acquire(force).await.map(|_| self.owned.as_ref().map_or(0, |o| o.epoch))
                };
                let _ = reply.send(r);
            }
        }
        if cmds.is_empty() {
            return;
        }
        if let Err(e) = self.ensure_owned().await {
            for c in cmds {
                c.fail(clone_err(&e));
            }
            return;
        }
        let topic = match self.topic().await {
            Ok(t) => t,
            Err(e) => {
                for c in cmds {
                    c.fail(clone_err(&e));
                }
                return;
            }
        };
        let mut waiters = Vec::with_capacity(cmds.len());
        let mut data = BytesMut::new();
        let mut idx_data = Vec::new();
        let mut batches = Vec::new();
        let mut dead_letters = Vec::new();
        let append_time = now_ms() as i64;
        // Queue operations first need their queues loaded (I/O), before the
        // in-memory part of the flush.
        for c in &cmds {
            if let Cmd::Queue { queue, .. } = c {
                if let Err(e) = self.load_queue(queue, &topic).await {
                    tracing::warn!(queue, error = %e, "cannot load the queue state");
                }
            }
        }
        for c in cmds {
            match c {
                Cmd::Produce { producer, records, reply } => {
                    match self.prepare_produce(&topic, producer, records, append_time, &mut data, &mut idx_data, &mut batches) {
                        Ok(p) => waiters.push(Waiter::Produce(reply, p)),
                        Err(e) => drop(reply.send(Err(e))),
                    }
                }
                Cmd::Queue { queue, op, reply } => {
                    let r = self.prepare_queue(&topic, &queue, op, &mut dead_letters).await;
                    waiters.push(Waiter::Queue(reply, r));
                }
                Cmd::Takeover { .. } => {}
            }
        }
        if waiters.is_empty() {
            return;
        }
        // Step 1: the writes, concurrently.
        let Some(o) = self.owned.as_mut() else { return };
        let seg_pos = o.seg_bytes;
        let data = data.freeze();
        let batches: Vec<(BatchHeader, Bytes)> = batches.into_iter().map(|(h, s, l)| (h, data.slice(s..s + l))).collect();
        let mut writes: Vec<futures::future::BoxFuture<'_, Result<()>>> = Vec::new();
        if !data.is_empty() {
            let seg = &o.seg;
            let d = data.clone();
            writes.push(Box::pin(async move { seg.write_at(seg_pos, d).await.map_err(|e| from_file(e, "segment")) }));
        }
        // Index entries are a hint (a reader scans on from the last one
        // written): they go out in pieces of INDEX_WRITE_BYTES, not a
        // storage write per flush.
        o.idx_pending.extend_from_slice(&idx_data);
        let idx_piece = if o.idx_pending.len() >= INDEX_WRITE_BYTES { std::mem::take(&mut o.idx_pending) } else { Vec::new() };
        let idx_written = idx_piece.len() as u64;
        if idx_written > 0 {
            let idx = &o.idx;
            let pos = o.idx_bytes;
            let d = Bytes::from(idx_piece);
            writes.push(Box::pin(async move { idx.write_at(pos, d).await.map_err(|e| from_file(e, "index")) }));
        }
        let mut queue_ends = Vec::new();
        for (name, q) in o.queues.iter_mut() {
            if q.changes.is_empty() {
                continue;
            }
            let changes: Vec<(u64, Option<Entry>)> = std::mem::take(&mut q.changes).into_iter().collect();
            let f =
                match frame(&QFrame::Delta { scan: q.state.scan, next_nonce: q.state.next_nonce, purged_ms: q.state.purged_ms, changes }) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::error!(error = %e, "queue delta");
                        continue;
                    }
                };
            let pos = q.bytes;
            q.bytes += f.len() as u64;
            queue_ends.push(name.clone());
            let file = &q.file;
            writes.push(Box::pin(async move { file.write_at(pos, Bytes::from(f)).await.map_err(|e| from_file(e, "queue state")) }));
        }
        let results = futures::future::join_all(writes).await;
        if let Some(e) = results.into_iter().find_map(|r| r.err()) {
            tracing::warn!(error = %e, "flush write failed; dropping the partition");
            let _ = self.drain_commit().await;
            for w in waiters {
                w.fail(clone_err(&e));
            }
            self.drop_ownership().await;
            return;
        }
        let Some(o) = self.owned.as_mut() else { return };
        o.seg_bytes += data.len() as u64;
        o.idx_bytes += idx_written;
        // Step 2: chain the CAS after the previous one.
        if self.drain_commit().await.is_err() {
            for w in waiters {
                w.fail(MqError::Fenced("an earlier flush failed".into()));
            }
            return;
        }
        let Some(o) = self.owned.as_mut() else {
            for w in waiters {
                w.fail(MqError::Fenced("the partition was lost".into()));
            }
            return;
        };
        let mut next = o.state.clone();
        next.hw = o.next_offset;
        next.seg_bytes = o.seg_bytes;
        next.seg_max_ts = o.seg_max_ts;
        next.lease_until_ms = now_ms() + self.writer.inner.cfg.lease_ms;
        let expected = Expected::Inode { id: o.version.0, version: o.version.1 };
        let store = self.writer.inner.store.clone();
        let Some(pdir) = self.pdir else { return };
        // A flush of produces only moves `hw` over batches already durable
        // in the segment: a relaxed change (acquire re-finds them if power
        // loss takes it). Queue deltas lean on the state: synced.
        let relaxed = queue_ends.is_empty() && dead_letters.is_empty() && waiters.iter().all(|w| matches!(w, Waiter::Produce(..)));
        let task = tokio::spawn(async move {
            if relaxed {
                store.write_state_relaxed(pdir, &next, expected).await
            } else {
                store.write_state(pdir, &next, expected).await
            }
        });
        self.committing = Some(Committing { task, waiters, batches, dead_letters });
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_produce(
        &mut self,
        topic: &TopicMeta,
        producer: Option<ProducerFields>,
        records: Vec<Record>,
        append_time: i64,
        data: &mut BytesMut,
        idx_data: &mut Vec<u8>,
        batches: &mut Vec<(BatchHeader, usize, usize)>,
    ) -> Result<Produced> {
        let cfg = self.writer.inner.cfg.clone();
        let partition = self.key.1;
        let o = self.owned.as_mut().ok_or_else(|| MqError::Fenced("not the owner".into()))?;
        let count = records.len() as u32;
        if let Some(r) = records.iter().find(|r| r.value.len() as u64 > topic.max_message_bytes) {
            return Err(MqError::LimitExceeded(format!(
                "a message of {} bytes; the topic allows {}",
                r.value.len(),
                topic.max_message_bytes
            )));
        }
        if let Some(p) = producer {
            if let SeqCheck::Duplicate { base_offset } = o.producers.check(p, count)? {
                let offsets = (base_offset..base_offset + u64::from(count)).collect();
                return Ok(Produced {
                    partition,
                    base_offset,
                    count,
                    duplicate: true,
                    offsets,
                    deduplicated: vec![false; count as usize],
                    append_time_ms: append_time,
                });
            }
        }
        // FIFO dedup: drop records whose dedup key is in the window.
        let now = append_time.max(0) as u64;
        let mut keep = Vec::with_capacity(records.len());
        let mut offsets = Vec::with_capacity(records.len());
        let mut deduplicated = Vec::with_capacity(records.len());
        let mut next = o.next_offset;
        let mut batch_keys: HashMap<String, u64> = HashMap::new();
        for r in records {
            let key = if topic.fifo {
                r.header_str(HEADER_DEDUP_ID).map(|id| DedupTable::key(id, r.header_str(HEADER_GROUP), topic.dedup_by_group))
            } else {
                None
            };
            if let Some(k) = &key {
                if let Some(orig) = o.dedup.get(k, now, topic.dedup_window_ms).or_else(|| batch_keys.get(k).copied()) {
                    offsets.push(orig);
                    deduplicated.push(true);
                    continue;
                }
                batch_keys.insert(k.clone(), next);
            }
            offsets.push(next);
            deduplicated.push(false);
            next += 1;
            keep.push(r);
        }
        let base = o.next_offset;
        if !keep.is_empty() {
            let start = data.len();
            let built = encode_batch(base, producer, &keep, append_time, data);
            let len = data.len() - start;
            if len > cfg.max_batch_bytes {
                data.truncate(start);
                return Err(MqError::LimitExceeded(format!("a batch of {len} bytes; at most {}", cfg.max_batch_bytes)));
            }
            let pos = o.seg_bytes + start as u64;
            if let Some(e) = o.index.on_batch(base - o.state.seg_base, pos, built.header.max_timestamp_ms) {
                e.encode(idx_data);
            }
            o.next_offset = next;
            o.seg_max_ts = o.seg_max_ts.max(built.header.max_timestamp_ms);
            batches.push((built.header, start, len));
            if let Some(p) = producer {
                o.producers.record(p, keep.len() as u32, base, now);
            }
            for (k, off) in batch_keys {
                o.dedup.insert(k, off, now);
            }
            o.producers.expire(now, cfg.producer_expiry_ms, cfg.max_producers);
            if topic.fifo {
                o.dedup.expire(now, topic.dedup_window_ms, cfg.max_dedup_keys);
            }
        }
        Ok(Produced {
            partition,
            base_offset: offsets.first().copied().unwrap_or(base),
            count,
            duplicate: false,
            offsets,
            deduplicated,
            append_time_ms: append_time,
        })
    }

    /// Loads a queue's state into the owner (once per ownership): the newest
    /// state log of an epoch up to ours, replayed, then written as a
    /// snapshot into a new log of our epoch.
    async fn load_queue(&mut self, queue: &str, topic: &TopicMeta) -> Result<()> {
        if self.owned.as_ref().is_some_and(|o| o.queues.contains_key(queue)) {
            return Ok(());
        }
        if !topic.queues.contains_key(queue) {
            return Err(MqError::NotFound(format!("queue {queue:?} of topic {:?}", topic.name)));
        }
        let pdir = self.pdir().await?;
        let store = self.store().clone();
        let Some(o) = self.owned.as_ref() else { return Err(MqError::Fenced("not the owner".into())) };
        let epoch = o.epoch;
        let log_start = o.state.log_start;
        let names = list_names(&store.fs, pdir).await?;
        let mut files: Vec<((u64, u64), String)> =
            names.iter().filter_map(|n| parse_queue_file(n, queue).map(|v| (v, n.clone()))).filter(|((e, _), _)| *e <= epoch).collect();
        files.sort();
        let mut state = QueueState { scan: log_start, ..QueueState::default() };
        if let Some((_, name)) = files.last() {
            let inode = store.fs.meta().lookup(pdir, name).await.map_err(|e| from_meta(e, name))?;
            for f in read_frames_file(&store, &inode).await? {
                match f {
                    QFrame::Snapshot(s) => state = s,
                    QFrame::Delta { scan, next_nonce, purged_ms, changes } => {
                        let ch: Changes = changes.into_iter().collect();
                        state.apply(scan, next_nonce, purged_ms, &ch);
                    }
                }
            }
        }
        let mut ch = Changes::new();
        state.truncated(log_start, &mut ch);
        let seq = files.last().map_or(0, |((e, s), _)| if *e == epoch { s + 1 } else { 0 });
        let name = queue_file_name(queue, epoch, seq);
        let (file, bytes) = write_queue_snapshot(&store, pdir, &name, &state).await?;
        for (_, old) in &files {
            let _ = store.fs.meta().unlink(pdir, old).await;
        }
        if let Some(o) = self.owned.as_mut() {
            o.queues.insert(queue.to_string(), QueueHolder { state, file, file_name: name, bytes, seq, changes: Changes::new() });
        }
        Ok(())
    }

    /// The rules of a queue from the topic configuration.
    fn rules(topic: &TopicMeta, queue: &str) -> (QueueRules, u64, Option<String>, u64) {
        let q = topic.queues.get(queue).cloned().unwrap_or_default();
        let rules = QueueRules {
            max_deliveries: q.max_deliveries,
            dead_letter: q.dead_letter_topic.is_some(),
            fifo: topic.fifo,
            retention_ms: topic.retention_ms,
            max_in_flight: if topic.fifo { 20_000 } else { 120_000 },
            max_tracked: 200_000,
        };
        (rules, q.visibility_ms, q.dead_letter_topic, q.delay_ms)
    }

    async fn prepare_queue(
        &mut self,
        topic: &TopicMeta,
        queue: &str,
        op: QueueOp,
        dead_letters: &mut Vec<DeadLetter>,
    ) -> Result<QueueReply> {
        if !self.owned.as_ref().is_some_and(|o| o.queues.contains_key(queue)) {
            return Err(MqError::NotFound(format!("queue {queue:?} of topic {:?}", topic.name)));
        }
        let now = now_ms();
        let (rules, _default_vis, dlq, delay_ms) = Self::rules(topic, queue);
        match op {
            QueueOp::Receive { max, visibility_ms } => {
                // Fresh records from the queue's scan point up to the committed hw.
                let (scan, hw) = {
                    let o = self.owned.as_ref().ok_or_else(|| MqError::Fenced("not the owner".into()))?;
                    (o.queues.get(queue).map_or(0, |q| q.state.scan), o.state.hw)
                };
                let want = (max * 4).clamp(64, 4096) as u64;
                let fresh = if scan < hw { self.read_records(scan, want.min(hw - scan)).await? } else { Vec::new() };
                let infos: Vec<RecordInfo> = fresh
                    .iter()
                    .map(|r| {
                        let delay = r.record.header_str(HEADER_DELAY_MS).and_then(|d| d.parse::<u64>().ok()).unwrap_or(delay_ms);
                        RecordInfo {
                            offset: r.offset,
                            ts_ms: r.record.timestamp_ms,
                            visible_at_ms: (r.record.timestamp_ms.max(0) as u64).saturating_add(delay),
                            group: r.record.header_str(HEADER_GROUP).map(str::to_string),
                        }
                    })
                    .collect();
                let o = self.owned.as_mut().ok_or_else(|| MqError::Fenced("not the owner".into()))?;
                let q = o.queues.get_mut(queue).ok_or_else(|| MqError::NotFound(queue.into()))?;
                let got = q.state.receive(now, max, visibility_ms, &rules, &infos, &mut q.changes);
                let by_offset: HashMap<u64, &StoredRecord> = fresh.iter().map(|r| (r.offset, r)).collect();
                let mut out = Vec::with_capacity(got.delivered.len());
                let mut missing = Vec::new();
                for d in &got.delivered {
                    match by_offset.get(&d.offset) {
                        Some(r) => out.push(ReceivedMessage {
                            offset: d.offset,
                            record: r.record.clone(),
                            count: d.count,
                            nonce: d.nonce,
                            first_receive_ms: d.first_receive_ms,
                        }),
                        None => missing.push(d.clone()),
                    }
                }
                let mut dl: Vec<u64> = got.to_dead_letter.clone();
                for d in missing {
                    match self.read_records(d.offset, 1).await?.into_iter().next() {
                        Some(r) if r.offset == d.offset => out.push(ReceivedMessage {
                            offset: d.offset,
                            record: r.record,
                            count: d.count,
                            nonce: d.nonce,
                            first_receive_ms: d.first_receive_ms,
                        }),
                        _ => {
                            // Gone (retention): forget it.
                            if let Some(o) = self.owned.as_mut() {
                                if let Some(q) = o.queues.get_mut(queue) {
                                    q.state.entries.remove(&d.offset);
                                    q.changes.insert(d.offset, None);
                                }
                            }
                        }
                    }
                }
                out.sort_by_key(|m| m.offset);
                if let Some(dlq) = dlq {
                    for off in dl.drain(..) {
                        let rec = match by_offset.get(&off) {
                            Some(r) => Some((*r).clone()),
                            None => self.read_records(off, 1).await?.into_iter().find(|r| r.offset == off),
                        };
                        match rec {
                            Some(r) => {
                                dead_letters.push(DeadLetter { target: dlq.clone(), queue: queue.to_string(), offset: off, record: r })
                            }
                            None => {
                                if let Some(o) = self.owned.as_mut() {
                                    if let Some(q) = o.queues.get_mut(queue) {
                                        q.state.moved(off, true, now, &mut q.changes);
                                    }
                                }
                            }
                        }
                    }
                }
                Ok(QueueReply::Received(out))
            }
            op => {
                let o = self.owned.as_mut().ok_or_else(|| MqError::Fenced("not the owner".into()))?;
                let hw = o.state.hw;
                let q = o.queues.get_mut(queue).ok_or_else(|| MqError::NotFound(queue.into()))?;
                Ok(match op {
                    QueueOp::Receive { .. } => QueueReply::Done,
                    QueueOp::Ack(items) => {
                        QueueReply::Acked(items.into_iter().map(|(off, nonce)| q.state.ack(off, nonce, &mut q.changes)).collect())
                    }
                    QueueOp::ChangeVisibility(items) => QueueReply::Changed(
                        items.into_iter().map(|(off, nonce, t)| q.state.change_visibility(off, nonce, t, now, &mut q.changes)).collect(),
                    ),
                    QueueOp::Release(items) => QueueReply::Changed(
                        items.into_iter().map(|(off, nonce, d)| q.state.release(off, nonce, d, now, &mut q.changes)).collect(),
                    ),
                    QueueOp::Purge => {
                        if now < q.state.purged_ms + 60_000 && topic.sqs.is_some() {
                            return Err(MqError::Sqs {
                                shape: "PurgeQueueInProgress",
                                query_code: "AWS.SimpleQueueService.PurgeQueueInProgress",
                                status: 403,
                                message: format!("Only one PurgeQueue operation on {} is allowed every 60 seconds.", topic.name),
                            });
                        }
                        q.state.purge(hw, now, &mut q.changes);
                        QueueReply::Purged
                    }
                    QueueOp::Counts => {
                        q.state.expire(now, &mut q.changes);
                        QueueReply::Counts { counts: q.state.counts(hw, now), high_watermark: hw }
                    }
                    QueueOp::Moved { offset, ok } => {
                        q.state.moved(offset, ok, now, &mut q.changes);
                        QueueReply::Done
                    }
                })
            }
        }
    }

    /// Committed records from `offset`, at most `max` of them (tail cache first).
    async fn read_records(&self, offset: u64, max: u64) -> Result<Vec<StoredRecord>> {
        let Some(o) = self.owned.as_ref() else { return Err(MqError::Fenced("not the owner".into())) };
        let mut out = Vec::new();
        if o.tail.first_offset().is_some_and(|f| f <= offset) {
            for (h, b) in &o.tail.batches {
                if h.next_offset() <= offset {
                    continue;
                }
                if h.base_offset >= o.state.hw {
                    break;
                }
                let (_, recs) = crate::record::decode_batch(b)?;
                out.extend(recs.into_iter().filter(|r| r.offset >= offset && r.offset < o.state.hw));
                if out.len() as u64 >= max {
                    break;
                }
            }
            out.truncate(max as usize);
            return Ok(out);
        }
        let Some(pdir) = self.pdir else { return Ok(out) };
        let state = o.state.clone();
        let log = &self.writer.inner.log;
        let mut at = offset;
        while (out.len() as u64) < max && at < state.hw {
            let (batches, next) = log.records(pdir, &state, at, 1 << 20).await?;
            if batches.is_empty() || next <= at {
                break;
            }
            for (_, recs) in batches {
                out.extend(recs.into_iter().filter(|r| r.offset >= at));
            }
            at = next;
        }
        out.truncate(max as usize);
        Ok(out)
    }

    fn spawn_dead_letter(&self, d: DeadLetter) {
        let writer = self.writer.clone();
        let (topic, partition) = self.key.clone();
        let DeadLetter { target: dlq, queue, offset, record: rec } = d;
        tokio::spawn(async move {
            let ok = match dead_letter_copy(&writer, &topic, &dlq, &rec).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(dead_letter_topic = %dlq, offset, error = %e, "moving a message to its dead-letter topic failed; it stays in the queue");
                    false
                }
            };
            let _ = writer.queue(&topic, partition, &queue, QueueOp::Moved { offset, ok }).await;
        });
    }

    /// Renews the lease (when no flush is in flight).
    async fn renew(&mut self) -> Result<()> {
        let Some(pdir) = self.pdir else { return Ok(()) };
        let Some(o) = self.owned.as_mut() else { return Ok(()) };
        let mut next = o.state.clone();
        next.lease_until_ms = now_ms() + self.writer.inner.cfg.lease_ms;
        let expected = Expected::Inode { id: o.version.0, version: o.version.1 };
        match self.writer.inner.store.write_state(pdir, &next, expected).await {
            Ok(v) => {
                o.state = v.value;
                o.version = (v.inode, v.version);
                Ok(())
            }
            Err(e) => {
                let e = if lost(&e) { MqError::Fenced("lease renewal: the state changed".into()) } else { e };
                tracing::warn!(error = %e, "lease renewal failed; dropping the partition");
                self.drop_ownership().await;
                Err(e)
            }
        }
    }

    /// Whether the active segment has reached the topic's `segment_bytes`.
    async fn segment_full(&self) -> bool {
        let Some(o) = self.owned.as_ref() else { return false };
        let seg_bytes = o.state.seg_bytes.max(o.seg_bytes);
        match self.topic().await {
            Ok(t) => seg_bytes >= t.segment_bytes,
            Err(_) => false,
        }
    }

    /// Periodic work; returns true when the actor should stop.
    async fn housekeeping(&mut self) -> bool {
        self.last_housekeeping = Instant::now();
        let idle = self.last_request.elapsed() > Duration::from_millis(self.cfg().idle_release_ms);
        if self.owned.is_none() {
            return idle;
        }
        if idle {
            return true;
        }
        let lease_ms = self.cfg().lease_ms;
        let left = self.owned.as_ref().map_or(0, |o| o.state.lease_until_ms.saturating_sub(now_ms()));
        if left < lease_ms * 2 / 3 && self.renew().await.is_err() {
            return false;
        }
        let topic = match self.topic().await {
            Ok(t) => t,
            Err(MqError::TopicNotFound(_)) => return true,
            Err(_) => return false,
        };
        if let Err(e) = self.maybe_roll(&topic).await {
            tracing::warn!(error = %e, "segment roll failed");
        }
        if let Err(e) = self.retention(&topic).await {
            tracing::warn!(error = %e, "retention failed");
        }
        if let Err(e) = self.compact_queues().await {
            tracing::warn!(error = %e, "queue state compaction failed");
        }
        false
    }

    /// Rolls the active segment when it is full or old enough.
    async fn maybe_roll(&mut self, topic: &TopicMeta) -> Result<()> {
        let Some(pdir) = self.pdir else { return Ok(()) };
        let Some(o) = self.owned.as_ref() else { return Ok(()) };
        let s = &o.state;
        let old_enough = now_ms().saturating_sub(s.seg_created_ms) >= topic.segment_ms;
        if s.seg_bytes == 0 || (s.seg_bytes < topic.segment_bytes && !old_enough) {
            return Ok(());
        }
        let store = self.store().clone();
        let (base, epoch) = (s.hw, o.epoch);
        // The old index whole (the pending entries are dropped below).
        write_index_tail(&o.idx, o.idx_bytes, o.idx_pending.clone()).await;
        // Producer snapshot as of the new base (the table is committed: no flush in flight).
        let snap = ProducerSnapshot { offset: base, producers: o.producers.clone(), dedup: o.dedup.clone() };
        write_json(&store.fs, pdir, &snapshot_name(base), &snap, None).await?;
        let seg_name = segment_name(base, epoch);
        let seg = store.fs.create_at(pdir, &seg_name, FILE_MODE, true).await.map_err(|e| from_file(e, &seg_name))?;
        let idx = store.fs.create_at(pdir, &index_name(base, epoch), FILE_MODE, false).await.map_err(|e| from_file(e, "index"))?;
        let manifest = read_manifest(&store, pdir).await?;
        let mut m = manifest.as_ref().map(|v| v.value.clone()).unwrap_or_default();
        m.seal(SealedSegment { name: s.seg.clone(), base: s.seg_base, end: s.seg_bytes, next: s.hw, max_ts: s.seg_max_ts });
        write_manifest(&store, pdir, &m, manifest.as_ref()).await?;
        let mut next = s.clone();
        let old_snap = s.snap;
        next.seg = seg_name.clone();
        next.seg_base = base;
        next.seg_bytes = 0;
        next.seg_max_ts = -1;
        next.seg_created_ms = now_ms();
        next.snap = Some(base);
        next.lease_until_ms = now_ms() + self.cfg().lease_ms;
        let expected = Expected::Inode { id: o.version.0, version: o.version.1 };
        let v = match store.write_state(pdir, &next, expected).await {
            Ok(v) => v,
            Err(e) => {
                self.drop_ownership().await;
                return Err(e);
            }
        };
        self.writer.inner.log.forget(pdir);
        let interval = self.cfg().index_interval_bytes;
        if let Some(o) = self.owned.as_mut() {
            let old_seg = std::mem::replace(&mut o.seg, seg);
            let old_idx = std::mem::replace(&mut o.idx, idx);
            tokio::spawn(async move {
                let _ = old_seg.close().await;
                let _ = old_idx.close().await;
            });
            o.state = v.value;
            o.version = (v.inode, v.version);
            o.seg_bytes = 0;
            o.seg_max_ts = -1;
            o.idx_bytes = 0;
            o.idx_pending.clear();
            o.index = IndexBuilder::new(interval, -1);
        }
        if let Some(old) = old_snap {
            let _ = store.fs.meta().unlink(pdir, &snapshot_name(old)).await;
        }
        tracing::info!(segment = %seg_name, "segment rolled");
        Ok(())
    }

    /// Deletes whole sealed segments past the topic's retention.
    async fn retention(&mut self, topic: &TopicMeta) -> Result<()> {
        if topic.retention_ms.is_none() && topic.retention_bytes.is_none() {
            return Ok(());
        }
        let Some(pdir) = self.pdir else { return Ok(()) };
        let Some(o) = self.owned.as_ref() else { return Ok(()) };
        let store = self.store().clone();
        let Some(manifest) = read_manifest(&store, pdir).await? else { return Ok(()) };
        let s = o.state.clone();
        let mut sealed: Vec<SealedSegment> =
            manifest.value.sealed.iter().filter(|x| x.base < s.seg_base && x.next > s.log_start).cloned().collect();
        sealed.sort_by_key(|x| x.base);
        let mut total: u64 = sealed.iter().map(|x| x.end).sum::<u64>() + s.seg_bytes;
        let now = now_ms() as i64;
        let mut drop_n = 0;
        for x in &sealed {
            let by_time = topic.retention_ms.is_some_and(|r| x.max_ts >= 0 && x.max_ts.saturating_add(r as i64) < now);
            let by_size = topic.retention_bytes.is_some_and(|r| total.saturating_sub(x.end) >= r);
            if !(by_time || by_size) {
                break;
            }
            total -= x.end;
            drop_n += 1;
        }
        if drop_n == 0 {
            return Ok(());
        }
        let gone: Vec<SealedSegment> = sealed[..drop_n].to_vec();
        let log_start = gone.last().map_or(s.log_start, |x| x.next);
        let mut m = manifest.value.clone();
        m.sealed.retain(|x| !gone.iter().any(|g| g.name == x.name));
        write_manifest(&store, pdir, &m, Some(&manifest)).await?;
        let mut next = s.clone();
        next.log_start = log_start.max(s.log_start);
        next.lease_until_ms = now_ms() + self.cfg().lease_ms;
        let expected = Expected::Inode { id: o.version.0, version: o.version.1 };
        let v = match store.write_state(pdir, &next, expected).await {
            Ok(v) => v,
            Err(e) => {
                self.drop_ownership().await;
                return Err(e);
            }
        };
        self.writer.inner.log.forget(pdir);
        if let Some(o) = self.owned.as_mut() {
            o.state = v.value;
            o.version = (v.inode, v.version);
            for q in o.queues.values_mut() {
                q.state.truncated(log_start, &mut q.changes);
            }
        }
        for g in &gone {
            let _ = store.fs.meta().unlink(pdir, &g.name).await;
            let _ = store.fs.meta().unlink(pdir, &g.name.replace(".log", ".idx")).await;
        }
        tracing::info!(segments = gone.len(), log_start, "retention deleted segments");
        Ok(())
    }

    /// Rewrites queue state logs that grew past `queue_compact_bytes` as a
    /// fresh snapshot.
    async fn compact_queues(&mut self) -> Result<()> {
        let Some(pdir) = self.pdir else { return Ok(()) };
        let limit = self.cfg().queue_compact_bytes;
        let store = self.store().clone();
        let Some(o) = self.owned.as_mut() else { return Ok(()) };
        let epoch = o.epoch;
        for (name, q) in o.queues.iter_mut() {
            if q.bytes < limit || !q.changes.is_empty() {
                continue;
            }
            let seq = q.seq + 1;
            let file_name = queue_file_name(name, epoch, seq);
            let (file, bytes) = write_queue_snapshot(&store, pdir, &file_name, &q.state).await?;
            let old = std::mem::replace(&mut q.file, file);
            let old_name = std::mem::replace(&mut q.file_name, file_name);
            q.bytes = bytes;
            q.seq = seq;
            let fs = store.fs.clone();
            tokio::spawn(async move {
                let _ = old.close().await;
                let _ = fs.meta().unlink(pdir, &old_name).await;
            });
        }
        Ok(())
    }
}

/// The frames of a queue state log. Meta's length of the file lags its
/// appends, so it is read by the frames' own lengths (in growing reads).
async fn read_frames_file(store: &Store, inode: &fskv_proto::meta::Inode) -> Result<Vec<QFrame>> {
    if !matches!(inode.data, InodeData::File(_)) {
        return Ok(Vec::new());
    }
    let mut len = inode.size_bytes().max(1 << 20);
    loop {
        let d = crate::store::read_file(&store.fs, inode, Some(len)).await?;
        let used = frames_len(&d);
        if used + (64 << 10) < d.len() || len >= 1 << 30 {
            return Ok(frames(&d[..used]));
        }
        len *= 4;
    }
}

fn frames_len(d: &[u8]) -> usize {
    let mut at = 0usize;
    while at + 8 <= d.len() {
        let len = u32::from_le_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]]) as usize;
        if len == 0 || at + 8 + len > d.len() {
            break;
        }
        at += 8 + len;
    }
    at
}

async fn write_queue_snapshot(store: &Store, pdir: InodeId, name: &str, state: &QueueState) -> Result<(FileHandle, u64)> {
    let f = frame(&QFrame::Snapshot(state.clone()))?;
    let h = store.fs.create_at(pdir, name, FILE_MODE, false).await.map_err(|e| from_file(e, name))?;
    if !h.is_empty() {
        h.truncate(0).await.map_err(|e| from_file(e, name))?;
    }
    h.write_at(0, Bytes::from(f.clone())).await.map_err(|e| from_file(e, name))?;
    Ok((h, f.len() as u64))
}

/// Index entries of the active segment are written once this many bytes of
/// them wait (64 entries of 16 bytes: with `index_interval_bytes` 4 KiB, a
/// reader finding a position scans at most ~256 KiB past the last entry
/// written; docs/mq.md).
const INDEX_WRITE_BYTES: usize = 1024;

/// Writes the index entries still waiting, when a segment is sealed or
/// left. Best effort: the index is a hint.
async fn write_index_tail(idx: &FileHandle, at: u64, pending: Vec<u8>) {
    if pending.is_empty() {
        return;
    }
    if let Err(e) = idx.write_at(at, Bytes::from(pending)).await {
        tracing::debug!(error = %e, "index tail not written (readers scan instead)");
    }
}

/// Bytes of the previous active segment read per step when acquire looks
/// past the state for batches to adopt.
const ADOPT_READ_BYTES: u64 = 1 << 20;

/// The previous active segment as acquire seals it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Adopted {
    /// The offset after its last record.
    hw: u64,
    seg_bytes: u64,
    max_ts: i64,
}

/// The whole, valid batches at the start of `buf` whose offsets go on from
/// `next` without a gap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Continuation {
    bytes: u64,
    next: u64,
    max_ts: i64,
    /// The buffer ends inside a batch that looks valid so far: this many
    /// bytes from the end of the continuation hold it.
    need: Option<usize>,
}

fn continuation(buf: &[u8], next: u64, max_batch_bytes: usize) -> Continuation {
    let mut c = Continuation { bytes: 0, next, max_ts: -1, need: None };
    loop {
        let at = usize::try_from(c.bytes).unwrap_or(usize::MAX).min(buf.len());
        match scan_batch(&buf[at..], max_batch_bytes) {
            Scan::Batch(h) if h.base_offset == c.next => {
                c.bytes += u64::from(h.total_bytes);
                c.next = h.next_offset();
                c.max_ts = c.max_ts.max(h.max_timestamp_ms);
            }
            Scan::NeedBytes(n) => {
                c.need = Some(n);
                return c;
            }
            // Zeros past the last write, a torn batch, or one that does not
            // continue the offsets (never acknowledged): the end.
            _ => return c,
        }
    }
}

/// The previous active segment `s.seg` as the state has it, grown by the
/// batches written right after `s.seg_bytes` that continue from `s.hw`:
/// a flush's segment write is durable before its state change, and that
/// change may be relaxed (lost to power loss although answered). A fenced
/// writer's last batches, never answered with success, may be adopted too
/// (a produce that failed may have been written, as with any ambiguous
/// error; an idempotent producer's retry is still recognised: the producer
/// table is rebuilt from the batches).
async fn adopt_tail(store: &Store, pdir: InodeId, s: &PartitionState, cfg: &WriterConfig) -> Result<Adopted> {
    let mut a = Adopted { hw: s.hw, seg_bytes: s.seg_bytes, max_ts: s.seg_max_ts };
    if s.seg.is_empty() {
        return Ok(a);
    }
    let inode = match store.fs.meta().lookup(pdir, &s.seg).await {
        Ok(i) => i,
        Err(e) if e.code() == ErrorCode::NotFound => return Ok(a),
        Err(e) => return Err(from_meta(e, &s.seg)),
    };
    let mut want = ADOPT_READ_BYTES;
    while a.seg_bytes - s.seg_bytes < cfg.max_recovery_scan_bytes {
        let h = reader(&store.fs, &inode, a.seg_bytes + want)?;
        let buf = h.read_at(a.seg_bytes, want).await.map_err(|e| from_file(e, &s.seg))?;
        let c = continuation(&buf, a.hw, cfg.max_batch_bytes);
        a.seg_bytes += c.bytes;
        a.hw = c.next;
        a.max_ts = a.max_ts.max(c.max_ts);
        match c.need {
            // The read ended inside a batch: read on from its start (all
            // of it at once, however large; `scan_batch` bounds it).
            Some(n) if c.bytes > 0 || n as u64 > want => want = want.max(n as u64),
            _ => break,
        }
    }
    Ok(a)
}

/// Removes a segment created by an acquire that lost its race.
async fn discard(store: &Store, pdir: InodeId, seg: FileHandle, idx: FileHandle, name: &str) {
    let _ = seg.close().await;
    let _ = idx.close().await;
    let _ = store.fs.meta().unlink(pdir, name).await;
    let _ = store.fs.meta().unlink(pdir, &name.replace(".log", ".idx")).await;
}

/// Copies a message of `topic` to its dead-letter topic (partition by key
/// hash, 0 without a key), only if both belong to the same tenant (a target
/// named before another tenant created a topic of that name is refused:
/// the message stays in its queue).
async fn dead_letter_copy(writer: &Writer, topic: &str, dlq: &str, rec: &StoredRecord) -> Result<()> {
    let meta = writer.inner.store.topic(dlq).await?;
    let source = writer.inner.store.topic(topic).await?;
    if meta.owner() != source.owner() {
        return Err(MqError::AccessDenied(format!("dead-letter topic {dlq:?} belongs to another tenant than {topic:?}")));
    }
    let partition = match &rec.record.key {
        Some(k) => crate::record::partition_for_key(k, meta.partitions),
        None => 0,
    };
    let mut r = rec.record.clone();
    // The copy keeps its timestamp but not its delay.
    r.headers.retain(|(n, _)| n != HEADER_DELAY_MS);
    writer.produce(dlq, partition, None, vec![r]).await.map(drop)
}

/// Errors are not `Clone` (they may hold causes); waiters get an equal one.
pub fn clone_err(e: &MqError) -> MqError {
    use MqError::*;
    match e {
        TopicNotFound(s) => TopicNotFound(s.clone()),
        TopicExists(s) => TopicExists(s.clone()),
        PartitionNotFound { topic, partition } => PartitionNotFound { topic: topic.clone(), partition: *partition },
        InvalidRequest(s) => InvalidRequest(s.clone()),
        InvalidRecord(s) => InvalidRecord(s.clone()),
        LimitExceeded(s) => LimitExceeded(s.clone()),
        OffsetOutOfRange { offset, log_start, high_watermark } => {
            OffsetOutOfRange { offset: *offset, log_start: *log_start, high_watermark: *high_watermark }
        }
        NotPartitionWriter { owner, lease_ms } => NotPartitionWriter { owner: owner.clone(), lease_ms: *lease_ms },
        Fenced(s) => Fenced(s.clone()),
        ProducerFenced { producer_id, epoch, current } => ProducerFenced { producer_id: *producer_id, epoch: *epoch, current: *current },
        OutOfOrderSequence { producer_id, got, last } => OutOfOrderSequence { producer_id: *producer_id, got: *got, last: *last },
        UnknownProducerId(p) => UnknownProducerId(*p),
        GroupNotFound(s) => GroupNotFound(s.clone()),
        UnknownMember(s) => UnknownMember(s.clone()),
        IllegalGeneration { got, current } => IllegalGeneration { got: *got, current: *current },
        InvalidReceipt(s) => InvalidReceipt(s.clone()),
        NotInFlight(s) => NotInFlight(s.clone()),
        NotFound(s) => NotFound(s.clone()),
        AccessDenied(s) => AccessDenied(s.clone()),
        MethodNotAllowed(s) => MethodNotAllowed(s.clone()),
        Unavailable(s) => Unavailable(s.clone()),
        Conflict(s) => Conflict(s.clone()),
        Sqs { shape, query_code, status, message } => Sqs { shape, query_code, status: *status, message: message.clone() },
        Corrupt(s) => Corrupt(s.clone()),
        Internal(s) => Internal(s.clone()),
    }
}

/// Reads a queue's delivery state as stored (readers answer queue
/// attributes with it): the newest state log, replayed.
pub async fn read_queue_state(store: &Store, pdir: InodeId, queue: &str) -> Result<Option<QueueState>> {
    let names = list_names(&store.fs, pdir).await?;
    let mut files: Vec<((u64, u64), String)> = names.iter().filter_map(|n| parse_queue_file(n, queue).map(|v| (v, n.clone()))).collect();
    files.sort();
    let Some((_, name)) = files.last() else { return Ok(None) };
    let inode = match store.fs.meta().lookup(pdir, name).await {
        Ok(i) => i,
        Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(from_meta(e, name)),
    };
    let mut state = QueueState::default();
    for f in read_frames_file(store, &inode).await? {
        match f {
            QFrame::Snapshot(s) => state = s,
            QFrame::Delta { scan, next_nonce, purged_ms, changes } => {
                let ch: BTreeMap<u64, Option<Entry>> = changes.into_iter().collect();
                state.apply(scan, next_nonce, purged_ms, &ch);
            }
        }
    }
    Ok(Some(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_file_names() {
        let n = queue_file_name("my-q", 7, 3);
        assert_eq!(parse_queue_file(&n, "my-q"), Some((7, 3)));
        assert_eq!(parse_queue_file(&n, "my"), None);
        assert_eq!(parse_queue_file(&queue_file_name("a-b-c", 1, 0), "a-b-c"), Some((1, 0)));
    }

    #[test]
    fn frames_stop_at_a_torn_tail() {
        let mut d = frame(&QFrame::Snapshot(QueueState::default())).unwrap();
        d.extend(frame(&QFrame::Delta { scan: 5, next_nonce: 2, purged_ms: 0, changes: vec![(1, None)] }).unwrap());
        let full = d.len();
        assert_eq!(frames(&d).len(), 2);
        assert_eq!(frames_len(&d), full);
        d.truncate(full - 2);
        assert_eq!(frames(&d).len(), 1);
        d.extend([0u8; 100]);
        assert_eq!(frames(&d).len(), 1);
    }

    #[test]
    fn continuation_takes_whole_batches_that_go_on_from_the_offset() {
        let batch = |base: u64, n: usize, ts: i64, out: &mut BytesMut| {
            let records: Vec<Record> = (0..n).map(|i| Record::new(vec![b'x'; 10 + i])).collect();
            encode_batch(base, None, &records, ts, out).header.total_bytes as u64
        };
        let mut d = BytesMut::new();
        let a = batch(10, 2, 500, &mut d);
        let b = batch(12, 1, 700, &mut d);
        let whole = Continuation { bytes: a + b, next: 13, max_ts: 700, need: Some(crate::record::BATCH_HEADER_BYTES) };
        assert_eq!(continuation(&d, 10, 1 << 20), whole);
        // Zeros past the last write end it.
        let mut z = d.clone();
        z.extend_from_slice(&[0u8; 200]);
        assert_eq!(continuation(&z, 10, 1 << 20), Continuation { need: None, ..whole });
        // A batch that does not continue the offsets (a gap) ends it.
        let mut g = d.clone();
        batch(20, 1, 900, &mut g);
        assert_eq!(continuation(&g, 10, 1 << 20), Continuation { need: None, ..whole });
        // Offsets that do not start where the state ended: nothing.
        assert_eq!(continuation(&d, 11, 1 << 20).bytes, 0);
        // A batch cut short: taken up to it, and how much it needs.
        let mut t = d.clone();
        let c = batch(13, 3, 800, &mut t);
        let cut = &t[..t.len() - 5];
        assert_eq!(continuation(cut, 10, 1 << 20), Continuation { need: Some(c as usize), ..whole });
        // The same batch with a byte flipped (CRC): not taken.
        let mut f = t.clone();
        let last = f.len() - 1;
        f[last] ^= 1;
        assert_eq!(continuation(&f, 10, 1 << 20), Continuation { need: None, ..whole });
        // All of it whole.
        assert_eq!(continuation(&t, 10, 1 << 20), Continuation { bytes: a + b + c, next: 16, max_ts: 800, need: whole.need });
    }
}
