//! Wire messages and methods of the storage service (docs/storage.md), ids 2000–2999.
//!
//! Bulk data never goes in these bodies: it travels as the RPC payload, and
//! each message that describes data carries its length and CRC32C, checked
//! at every hop.

pub use crate::cap::{CapRights, ChunkCap};
use fskv_types::ids::{ChainId, ChunkId, InodeId, TargetId};
use fskv_types::Status;
use serde::{Deserialize, Serialize};

/// Identifies one client request so a retry is applied once: the storage
/// service stores it as the chunk engine's update tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestTag {
    pub client: u64,
    pub request: u64,
}

/// The write channel a client request travels on, so that a retry is
/// recognised however many versions of its chunk came after it
/// (`fskv_storage::channels`). A client holds a channel from a write's
/// first attempt to its last and numbers the writes of each channel in
/// increasing `seq`; a lower `seq` on a channel whose later write a target
/// has seen is a write the client has finished with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WriteChannel {
    /// Below [`MAX_WRITE_CHANNELS`].
    pub id: u32,
    pub seq: u64,
}

/// Channels one client may use (ids `0..MAX_WRITE_CHANNELS`): its most
/// concurrent writes.
pub const MAX_WRITE_CHANNELS: u32 = 1024;

/// What a write does to a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateOp {
    /// Write the payload (of `len_bytes`, CRC32C `crc`) at `offset_bytes`.
    Write { offset_bytes: u64, len_bytes: u32, crc: u32 },
    /// Cut or zero-extend the chunk to `len_bytes`.
    Truncate { len_bytes: u64 },
    /// Remove the chunk.
    Remove,
}

/// A client write, sent to the head of the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReq {
    pub chain_id: ChainId,
    /// The chain version the client routed with.
    pub chain_ver: u32,
    /// The head target the client believes in.
    pub target: TargetId,
    pub chunk: ChunkId,
    pub op: UpdateOp,
    pub tag: RequestTag,
    /// The file layout's chunk size, if known (block sizing hint).
    pub chunk_size_hint_bytes: Option<u64>,
    /// Required from `user:` principals: a read-write capability for the
    /// chunk's inode (`crate::cap`); ignored for trusted principals.
    pub cap: Option<ChunkCap>,
    /// The client's write channel (none: recognised by `tag` only, within
    /// the chunk's last few versions).
    #[serde(default)]
    pub channel: Option<WriteChannel>,
}

/// The head's answer once every target of the chain committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteResp {
    /// The committed version the write produced.
    pub version: u64,
    /// Length and CRC32C of the chunk after the write (0, 0 after a remove).
    pub len_bytes: u32,
    pub crc: u32,
    /// The request had already been applied (a retry).
    pub duplicate: bool,
}

/// How a forwarded write is applied by the successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ForwardMode {
    /// Apply `op` as pending version `version` (must be the successor's
    /// committed + 1), forward, commit on the ack.
    Update { version: u64 },
    /// Replace the whole chunk with the payload as committed version
    /// `version` (to a syncing target, by recovery, or to repair a
    /// diverged successor). `op` is ignored.
    /// `chunk_chain_ver` is recorded as the chunk's chain version (recovery
    /// keeps the predecessor's, so replicas end with equal metadata).
    FullReplace { version: u64, chunk_chain_ver: u32, len_bytes: u32, crc: u32 },
    /// Remove the chunk if present (recovery's "delete"); committed at once.
    ReplaceRemove,
}

/// A write forwarded by a predecessor to its successor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardReq {
    pub chain_id: ChainId,
    pub chain_ver: u32,
    pub from: TargetId,
    pub to: TargetId,
    pub chunk: ChunkId,
    pub op: UpdateOp,
    pub mode: ForwardMode,
    pub tag: RequestTag,
    pub chunk_size_hint_bytes: Option<u64>,
    /// `FullReplace` only: the tags of the chunk's older committed versions
    /// at the sender (oldest first, at most 8: the chunk engine's
    /// `RECENT_COMMITS`), kept with the replaced chunk so a late retry of
    /// one of them is recognised there too. Empty otherwise.
    #[serde(default)]
    pub recent: Vec<RecentTag>,
    /// `Update` only: the client write's channel, recorded by each target
    /// that commits it (so a retry that reaches a new head is recognised).
    #[serde(default)]
    pub channel: Option<WriteChannel>,
}

/// An older committed version's request tag (see [`ForwardReq::recent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentTag {
    pub tag: RequestTag,
    pub version: u64,
    pub len_bytes: u32,
    pub crc: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardResp {
    /// The version the successor (and everything after it) committed.
    pub committed_ver: u64,
}

/// One read of a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadIo {
    pub chain_id: ChainId,
    pub chain_ver: u32,
    pub target: TargetId,
    pub chunk: ChunkId,
    pub offset_bytes: u64,
    pub len_bytes: u32,
    /// Return the pending version if there is one (instead of `ChunkUncommitted`).
    pub relaxed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReadReq {
    pub ios: Vec<ReadIo>,
    /// Required from `user:` principals: a capability for the inode of
    /// every io's chunk (at most `MAX_CAPS_PER_REQUEST`); empty otherwise.
    pub caps: Vec<ChunkCap>,
}

/// The data of one successful read; its bytes are the next `len_bytes` of
/// the reply payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadOk {
    pub len_bytes: u32,
    pub crc: u32,
    pub version: u64,
    pub chunk_len_bytes: u32,
    pub uncommitted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReadResp {
    /// One per request io, in order; the payload holds the data of the `Ok`
    /// results back to back.
    pub results: Vec<Result<ReadOk, Status>>,
}

/// Commits a pending version on one target (repair / admin; the write path
/// commits on the acknowledgement without this call).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitReq {
    pub target: TargetId,
    pub chunk: ChunkId,
    pub version: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitResp {
    pub committed_ver: u64,
}

/// Chunk metadata as another target sees it (recovery compares these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteChunkMeta {
    pub chain_ver: u32,
    pub committed_ver: u64,
    /// `None` when there is no pending version.
    pub pending_ver: Option<u64>,
    pub len_bytes: u32,
    pub crc: u32,
}

impl RemoteChunkMeta {
    /// The latest version the target has (pending if any, else committed):
    /// 3FS's "update version".
    pub fn update_ver(&self) -> u64 {
        self.pending_ver.unwrap_or(self.committed_ver)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryLastChunkReq {
    pub chain_id: ChainId,
    pub chain_ver: u32,
    pub target: TargetId,
    pub inode: InodeId,
    /// Required from `user:` principals: a capability for `inode`.
    pub cap: Option<ChunkCap>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryLastChunkResp {
    pub last: Option<(ChunkId, RemoteChunkMeta)>,
}

/// One chunk's metadata on one target (peer to peer: a target settling a
/// left-over pending version asks the chain's serving tail).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryChunkReq {
    pub target: TargetId,
    pub chunk: ChunkId,
    /// The asker's chain version: the target answers only if its own
    /// routing has its chain at this version with the target serving
    /// (else `StaleChainVersion` / `TargetNotServing`), so an asker with
    /// stale routing never takes a dropped target's answer for the tail's.
    pub chain_ver: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryChunkResp {
    pub meta: Option<RemoteChunkMeta>,
}

/// Removes every chunk of `inode` with index `>= from_index` through the
/// chain (sent to the head), at most `max_chunks` per call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveChunksReq {
    pub chain_id: ChainId,
    pub chain_ver: u32,
    pub target: TargetId,
    pub inode: InodeId,
    pub from_index: u64,
    pub max_chunks: u32,
    pub tag: RequestTag,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveChunksResp {
    pub removed: u32,
    /// More chunks remain (call again).
    pub more: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceInfoReq {}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetSpace {
    pub target: TargetId,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// The scrubber's progress on this target (all zero when it is off).
    pub scrub: ScrubProgress,
}

/// What the scrubber (background checksum verification) did on one target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubProgress {
    /// Completed passes over every committed chunk.
    pub passes: u64,
    /// Chunks of the current (or last) pass, and how many are checked.
    pub pass_chunks_total: u64,
    pub pass_chunks_done: u64,
    /// Totals since the service started.
    pub chunks_checked: u64,
    pub bytes_checked: u64,
    /// Chunks whose page checksum failed (by the scrubber).
    pub corrupt_found: u64,
    /// Chunks rewritten from another replica (by the scrubber or a read).
    pub repaired: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceInfoResp {
    pub targets: Vec<TargetSpace>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpChunkMetaReq {
    pub target: TargetId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpChunkMetaResp {
    pub chunks: Vec<(ChunkId, RemoteChunkMeta)>,
}

/// Recovery start / end, sent by the predecessor to the syncing target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncReq {
    pub chain_id: ChainId,
    pub chain_ver: u32,
    pub from: TargetId,
    pub target: TargetId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncResp {}

/// Where a [`CopyRangeReq`] takes its bytes from: a range of one chunk on
/// another (or the same) chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopySource {
    pub chain_id: ChainId,
    pub chunk: ChunkId,
    pub offset_bytes: u64,
    /// Bytes to copy (> 0, at most the largest chunk).
    pub len_bytes: u32,
}

/// A server-side copy, sent to the head of the destination chain: the head
/// reads `src` (committed data, from a serving replica of the source chain)
/// and writes it at `offset_bytes` of `chunk` exactly as a client
/// [`WriteReq`] would (same version, forwarding, commit and idempotency by
/// `tag`). A missing source chunk, or the part of the range past the source
/// chunk's end, is written as zeros. The data never passes through the
/// caller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyRangeReq {
    pub chain_id: ChainId,
    /// The destination chain version the caller routed with.
    pub chain_ver: u32,
    /// The head target of the destination chain the caller believes in.
    pub target: TargetId,
    pub chunk: ChunkId,
    pub offset_bytes: u64,
    pub src: CopySource,
    pub tag: RequestTag,
    /// The destination layout's chunk size, if known (block sizing hint).
    pub chunk_size_hint_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyRangeResp {
    /// The write on the destination chain (`duplicate` for a retry of a
    /// copy already applied).
    pub write: WriteResp,
    /// Bytes of the range the source chunk held (the rest was written as
    /// zeros); 0 for a missing source chunk.
    pub src_found_bytes: u32,
}

/// Which block-file I/O of a target an injected disk fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskFaultOp {
    Read,
    Write,
    Sync,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectDiskFaultReq {
    pub target: TargetId,
    pub op: DiskFaultOp,
    /// The errno the I/O fails with (5 = EIO, 28 = ENOSPC).
    pub errno: i32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectDiskFaultResp {}

/// Bit rot, injected (test builds only): one byte of a committed chunk's
/// content is flipped in its block file, its checksums left as they were.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectBitRotReq {
    pub target: TargetId,
    /// `None`: the target's first chunk with committed content.
    pub chunk: Option<ChunkId>,
    /// Taken modulo the chunk's committed length.
    pub offset_bytes: u64,
}

/// Which byte was flipped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectBitRotResp {
    pub chunk: ChunkId,
    pub offset_bytes: u64,
}

// ----- methods -----

fskv_rpc::rpc_method!(
    /// Client write at the head; payload = data of a `Write` op.
    "storage", WriteChunk = 2001, WriteReq => WriteResp
);
fskv_rpc::rpc_method!(
    /// Predecessor → successor; payload = data (op data or full chunk).
    "storage", ForwardChunk = 2002, ForwardReq => ForwardResp
);
fskv_rpc::rpc_method!(
    /// Reads; reply payload = data of the successful reads back to back.
    "storage", BatchRead = 2003, BatchReadReq => BatchReadResp
);
fskv_rpc::rpc_method!("storage", CommitChunk = 2004, CommitReq => CommitResp);
fskv_rpc::rpc_method!("storage", QueryLastChunk = 2005, QueryLastChunkReq => QueryLastChunkResp);
fskv_rpc::rpc_method!("storage", RemoveChunks = 2006, RemoveChunksReq => RemoveChunksResp);
fskv_rpc::rpc_method!("storage", SpaceInfo = 2007, SpaceInfoReq => SpaceInfoResp);
fskv_rpc::rpc_method!("storage", DumpChunkMeta = 2008, DumpChunkMetaReq => DumpChunkMetaResp);
fskv_rpc::rpc_method!("storage", SyncStart = 2009, SyncReq => SyncResp);
fskv_rpc::rpc_method!("storage", SyncDone = 2010, SyncReq => SyncResp);
fskv_rpc::rpc_method!(
    /// Peer → tail: one chunk's metadata (settling a left-over pending version).
    "storage", QueryChunk = 2011, QueryChunkReq => QueryChunkResp
);
fskv_rpc::rpc_method!(
    /// Server-side copy at the destination head: it reads the source range
    /// from the source chain and writes it like a `WriteChunk`; no payload.
    "storage", CopyRange = 2012, CopyRangeReq => CopyRangeResp
);
fskv_rpc::rpc_method!(
    /// Tests only: every later block-file I/O `op` of the target fails with
    /// `errno` (the engine stops: fail-stop) until the service restarts.
    /// Routed only by a storage service built with the `fault-injection`
    /// feature, which release builds never enable; elsewhere it is an
    /// unknown method.
    "storage", InjectDiskFault = 2013, InjectDiskFaultReq => InjectDiskFaultResp
);
fskv_rpc::rpc_method!(
    /// Test builds only: flip a byte of a committed chunk (bit rot).
    "storage", InjectBitRot = 2014, InjectBitRotReq => InjectBitRotResp
);
