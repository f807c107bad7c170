//! The crate's single error type.

use crate::frame::FrameError;
use fskv_types::{ErrorCode, Status};

/// Every failure of a call, a server or a transport. Each variant maps to a
/// stable [`ErrorCode`] through [`RpcError::code`]; callers decide from the
/// code alone (e.g. [`RpcError::is_retryable`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// The server (or its handler) answered with an error status.
    #[error("remote error {0}")]
    Remote(Status),
    /// The connection's handshake failed (a missing or different cluster
    /// key, or a peer refused): not retried, the request never ran.
    #[error("authentication with {addr} failed: {reason}")]
    Unauthenticated { addr: String, reason: String },
    /// The connection could not be made or broke; the request may not have run.
    #[error("connection to {addr} failed: {reason}")]
    ConnectionFailed { addr: String, reason: String },
    /// No reply within the call's timeout; a cancel was sent.
    #[error("deadline of {timeout_ms} ms exceeded")]
    DeadlineExceeded { timeout_ms: u64 },
    /// A frame violated the wire format or the size limit.
    #[error("frame error: {0}")]
    Frame(#[from] FrameError),
    /// A body could not be encoded or decoded.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The operation is not supported by this transport (e.g. remote memory on TCP).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The local side is shutting down.
    #[error("shutting down")]
    ShuttingDown,
}

impl RpcError {
    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            RpcError::Remote(s) => s.code,
            RpcError::ConnectionFailed { .. } => ErrorCode::ConnectionFailed,
            RpcError::Unauthenticated { .. } => ErrorCode::PermissionDenied,
            RpcError::DeadlineExceeded { .. } => ErrorCode::DeadlineExceeded,
            RpcError::Frame(FrameError::TooLarge { .. }) => ErrorCode::FrameTooLarge,
            RpcError::Frame(_) | RpcError::Malformed(_) => ErrorCode::MalformedMessage,
            RpcError::Unsupported(_) => ErrorCode::Unsupported,
            RpcError::ShuttingDown => ErrorCode::ShuttingDown,
        }
    }

    pub fn is_retryable(&self) -> bool {
        self.code().is_retryable()
    }

    /// The error as a wire [`Status`].
    pub fn to_status(&self) -> Status {
        match self {
            RpcError::Remote(s) => s.clone(),
            other => Status::new(other.code(), other.to_string()),
        }
    }

    pub(crate) fn connection(addr: &str, reason: impl std::fmt::Display) -> RpcError {
        RpcError::ConnectionFailed { addr: addr.to_string(), reason: reason.to_string() }
    }
}

impl From<Status> for RpcError {
    fn from(s: Status) -> Self {
        RpcError::Remote(s)
    }
}

pub type Result<T, E = RpcError> = std::result::Result<T, E>;
