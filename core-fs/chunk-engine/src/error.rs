//! The crate's single error enum and its mapping to wire error codes.

use fskv_types::{ChunkId, ErrorCode, Status};

/// Everything the chunk engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("{0}: chunk not found")]
    NotFound(ChunkId),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{chunk}: request chain version {request} is older than the chunk's {current}")]
    StaleChainVersion { chunk: ChunkId, request: u32, current: u32 },
    #[error("{chunk}: has pending version {pending} over committed {committed}; retry or read relaxed")]
    Uncommitted { chunk: ChunkId, committed: u64, pending: u64 },
    #[error("{chunk}: version mismatch: {detail}")]
    VersionMismatch { chunk: ChunkId, detail: String },
    #[error("{chunk}: checksum mismatch in {what}: expected {expected:#010x}, got {actual:#010x}")]
    ChecksumMismatch { chunk: ChunkId, what: String, expected: u32, actual: u32 },
    #[error("corrupt metadata: {0}")]
    CorruptMetadata(String),
    #[error("I/O error while {context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("metadata store error: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("no space: {0}")]
    NoSpace(String),
    #[error("injected crash at {0:?}")]
    InjectedCrash(crate::engine::CrashPoint),
    #[error("engine is poisoned after a failed metadata write or an injected crash; drop and reopen it")]
    Poisoned,
}

pub type Result<T, E = ChunkError> = std::result::Result<T, E>;

impl ChunkError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ChunkError::Io { context: context.into(), source }
    }

    /// The wire error code a storage service sends for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ChunkError::NotFound(_) => ErrorCode::NotFound,
            ChunkError::InvalidArgument(_) | ChunkError::VersionMismatch { .. } => ErrorCode::InvalidArgument,
            ChunkError::StaleChainVersion { .. } => ErrorCode::StaleChainVersion,
            ChunkError::Uncommitted { .. } => ErrorCode::ChunkUncommitted,
            ChunkError::ChecksumMismatch { .. } => ErrorCode::ChecksumMismatch,
            ChunkError::NoSpace(_) => ErrorCode::ResourceExhausted,
            ChunkError::CorruptMetadata(_)
            | ChunkError::Io { .. }
            | ChunkError::Rocks(_)
            | ChunkError::InjectedCrash(_)
            | ChunkError::Poisoned => ErrorCode::Internal,
        }
    }

    pub fn to_status(&self) -> Status {
        Status::new(self.code(), self.to_string())
    }
}

impl From<ChunkError> for Status {
    fn from(e: ChunkError) -> Status {
        e.to_status()
    }
}
