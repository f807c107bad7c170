//! The one error type of the KV crate.

use fskv_types::{ErrorCode, Status};

/// Errors of every engine. The variants mirror FoundationDB's error classes so
/// that code written against the embedded engine handles FoundationDB unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The transaction conflicted with a concurrent commit (FDB 1020). Retry.
    #[error("transaction not committed: it conflicted with a concurrent transaction")]
    NotCommitted,
    /// The commit may or may not have been applied (FDB 1021). Retry only
    /// idempotent transactions.
    #[error("commit result unknown: the transaction may or may not have been applied")]
    CommitUnknownResult,
    /// The read version is older than the engine keeps conflict history for (FDB 1007).
    #[error("transaction too old: its read version is older than the conflict history kept")]
    TransactionTooOld,
    #[error("key of {len} bytes exceeds the limit of {limit} bytes")]
    KeyTooLarge { len: usize, limit: usize },
    #[error("value of {len} bytes exceeds the limit of {limit} bytes")]
    ValueTooLarge { len: usize, limit: usize },
    #[error("transaction of {size} bytes exceeds the limit of {limit} bytes")]
    TransactionTooLarge { size: usize, limit: usize },
    /// More compares or mutations than the engine can put in one transaction
    /// (etcd's `--max-txn-ops`).
    #[error(
        "transaction needs {ops} operations (compares or mutations) but the engine allows {limit} per transaction (etcd --max-txn-ops)"
    )]
    TooManyOperations { ops: usize, limit: usize },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The transaction was already committed or its engine was closed.
    #[error("transaction used after commit or engine closed")]
    Closed,
    /// A storage or engine error (disk, corruption, FoundationDB client error).
    #[error("storage error: {0}")]
    Storage(String),
    /// Another retryable engine error (e.g. an FDB retryable code).
    #[error("retryable engine error {code}: {message}")]
    Retryable { code: i32, message: String },
}

impl KvError {
    /// Whether running the whole transaction again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, KvError::NotCommitted | KvError::TransactionTooOld | KvError::CommitUnknownResult | KvError::Retryable { .. })
    }

    /// Whether the transaction may have been applied although an error came back.
    pub fn maybe_committed(&self) -> bool {
        matches!(self, KvError::CommitUnknownResult)
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            KvError::NotCommitted | KvError::Retryable { .. } => ErrorCode::KvNotCommitted,
            KvError::CommitUnknownResult => ErrorCode::KvCommitUnknownResult,
            KvError::TransactionTooOld => ErrorCode::KvTransactionTooOld,
            KvError::KeyTooLarge { .. }
            | KvError::ValueTooLarge { .. }
            | KvError::TransactionTooLarge { .. }
            | KvError::TooManyOperations { .. } => ErrorCode::KvTooLarge,
            KvError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            KvError::Closed => ErrorCode::ShuttingDown,
            KvError::Storage(_) => ErrorCode::Internal,
        }
    }
}

impl From<KvError> for Status {
    fn from(e: KvError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

pub type KvResult<T> = Result<T, KvError>;
