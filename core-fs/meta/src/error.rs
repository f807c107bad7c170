//! The one error type of the meta crate, mapped to [`ErrorCode`] in [`MetaError::code`].

use fskv_kv::KvError;
use fskv_types::{ErrorCode, InodeId, Status};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    #[error("not a directory: {0}")]
    NotDirectory(InodeId),
    #[error("is a directory: {0}")]
    IsDirectory(InodeId),
    #[error("directory not empty: {0}")]
    NotEmpty(InodeId),
    #[error("name of {len} bytes exceeds the limit of {limit} bytes")]
    NameTooLong { len: usize, limit: usize },
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("rename would move directory {moved} into its own subtree")]
    WouldCreateCycle { moved: InodeId },
    #[error("precondition failed: {0}")]
    PreconditionFailed(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("limit exceeded: {0}")]
    TooLarge(String),
    /// A stored key or value could not be decoded.
    #[error("corrupt metadata at {key}: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("storage backend: {0}")]
    Storage(#[from] crate::storage::StorageError),
    #[error("kv: {0}")]
    Kv(#[from] KvError),
    #[error("internal: {0}")]
    Internal(String),
    /// What an op prepared outside its transaction (e.g. Close's exact length
    /// from storage) was overtaken by a commit (a truncate); prepare again.
    #[error("prepared state is stale: {0}")]
    StalePrepare(String),
}

impl MetaError {
    /// The one place meta errors become wire codes.
    pub fn code(&self) -> ErrorCode {
        match self {
            MetaError::NotFound(_) => ErrorCode::NotFound,
            MetaError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            MetaError::NotDirectory(_) => ErrorCode::NotDirectory,
            MetaError::IsDirectory(_) => ErrorCode::IsDirectory,
            MetaError::NotEmpty(_) => ErrorCode::NotEmpty,
            MetaError::NameTooLong { .. } => ErrorCode::NameTooLong,
            MetaError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            MetaError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            MetaError::WouldCreateCycle { .. } => ErrorCode::WouldCreateCycle,
            MetaError::PreconditionFailed(_) => ErrorCode::PreconditionFailed,
            MetaError::Unsupported(_) => ErrorCode::Unsupported,
            MetaError::TooLarge(_) => ErrorCode::ResourceExhausted,
            MetaError::Corrupt { .. } | MetaError::Internal(_) => ErrorCode::Internal,
            MetaError::Storage(e) => e.code,
            MetaError::Kv(e) => e.code(),
            MetaError::StalePrepare(_) => ErrorCode::KvNotCommitted,
        }
    }

    /// Whether re-running the whole transaction may succeed.
    pub fn is_retryable_kv(&self) -> bool {
        matches!(self, MetaError::Kv(e) if e.is_retryable())
    }

    pub fn is_maybe_committed(&self) -> bool {
        matches!(self, MetaError::Kv(e) if e.maybe_committed())
    }
}

impl From<MetaError> for Status {
    fn from(e: MetaError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

pub type MetaResult<T> = Result<T, MetaError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StorageError;

    #[test]
    fn a_storage_failure_keeps_its_typed_code() {
        for code in [ErrorCode::ChunkUncommitted, ErrorCode::ConnectionFailed, ErrorCode::ChecksumMismatch, ErrorCode::InvalidArgument] {
            let e = MetaError::from(StorageError::new(code, "remove chunks of 7 on chain 3"));
            assert_eq!(e.code(), code);
            assert_eq!(Status::from(e).code, code);
        }
    }
}
