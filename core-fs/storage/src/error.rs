//! The crate's single error enum, mapped to wire codes in one place.

use crate::chain::RouteReject;
use fskv_chunk_engine::ChunkError;
use fskv_types::{ChainId, ChunkId, ErrorCode, NodeId, Status, TargetId};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{target} on {chain}: {reject:?}")]
    Route { chain: ChainId, target: TargetId, reject: RouteReject },
    #[error("{0} is not hosted here")]
    UnknownTarget(TargetId),
    #[error("{0} is not in the routing info")]
    UnknownChain(ChainId),
    #[error("{chunk}: payload checksum mismatch: expected {expected:#010x}, got {actual:#010x}")]
    Checksum { chunk: ChunkId, expected: u32, actual: u32 },
    #[error("{chunk}: successor diverged: {detail}")]
    VersionMismatch { chunk: ChunkId, detail: String },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("chunk engine: {0}")]
    Engine(#[from] ChunkError),
    #[error("forward to {to} failed: {status}")]
    Forward { to: TargetId, status: Status },
    /// The routing info has no address for a node of the chain yet (e.g.
    /// mgmtd has not published it); retryable once routing catches up.
    #[error("{0} has no address in the routing info yet")]
    NoAddress(NodeId),
    /// Reading the source range of a `CopyRange` failed (after the peer
    /// read client's retries); the source's code is passed through, so a
    /// retryable failure there is retryable for the caller too.
    #[error("copy source {chunk} on {chain}: {status}")]
    CopySource { chain: ChainId, chunk: ChunkId, status: Status },
    /// The target's chunk engine stopped after a disk fault (fail-stop):
    /// it serves nothing until its process restarts; the service reports
    /// it offline, so mgmtd takes it out of its chain.
    #[error("{target} failed (disk fault: {cause}); it serves nothing until restarted")]
    TargetFailed { target: TargetId, cause: String },
    /// A `user:` principal without a valid chunk capability, or calling a
    /// method users may not call (`crate::access`).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The chunk holds a pending version of another request whose fate is
    /// not known yet (the serving tail could not be asked or holds it only
    /// pending, or this target is the serving tail with a syncing target
    /// after it): a write there would reuse its version number for other
    /// bytes, so it waits (retryable; `craq.rs`, `SettleStep`).
    #[error("{target}: left-over pending version {version} not settled yet")]
    Unsettled { target: TargetId, version: u64 },
    /// A client write older than the last one its channel committed here:
    /// the client has finished with it (`crate::channels`), so it is not
    /// applied (a late duplicate would put old bytes over newer ones).
    #[error("write {seq} of client {client:#x} on channel {channel} arrived after its write {latest}: the client has finished with it")]
    Superseded { client: u64, channel: u32, seq: u64, latest: u64 },
    #[error("internal: {0}")]
    Internal(String),
}

impl StorageError {
    /// The wire code of this error (the one mapping of this crate).
    pub fn code(&self) -> ErrorCode {
        match self {
            StorageError::Route { reject, .. } => match reject {
                RouteReject::StaleChainVersion { .. } => ErrorCode::StaleChainVersion,
                RouteReject::NotInChain | RouteReject::NotServing { .. } | RouteReject::NotHead | RouteReject::WrongPredecessor { .. } => {
                    ErrorCode::TargetNotServing
                }
            },
            StorageError::UnknownTarget(_)
            | StorageError::UnknownChain(_)
            | StorageError::NoAddress(_)
            | StorageError::TargetFailed { .. } => ErrorCode::TargetNotServing,
            StorageError::Checksum { .. } => ErrorCode::ChecksumMismatch,
            StorageError::VersionMismatch { .. } => ErrorCode::ChunkVersionMismatch,
            StorageError::Invalid(_) => ErrorCode::InvalidArgument,
            StorageError::Engine(ChunkError::VersionMismatch { .. }) => ErrorCode::ChunkVersionMismatch,
            StorageError::Engine(e) => e.code(),
            // A successor's failure is passed through with its code, so the
            // client sees e.g. StaleChainVersion from anywhere in the chain.
            StorageError::Forward { status, .. } => status.code,
            StorageError::CopySource { status, .. } => status.code,
            StorageError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            StorageError::Unsettled { .. } => ErrorCode::ChunkUncommitted,
            StorageError::Superseded { .. } => ErrorCode::Cancelled,
            StorageError::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<StorageError> for Status {
    fn from(e: StorageError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;
