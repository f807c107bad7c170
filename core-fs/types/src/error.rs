//! Error codes that cross process boundaries.
//!
//! Every RPC failure carries an [`ErrorCode`]; a caller decides what to do from
//! the code alone ([`ErrorCode::is_retryable`], [`ErrorCode::needs_routing_refresh`]),
//! never by parsing the message.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Declares [`ErrorCode`] and the list of all its variants from one table, so
/// the decoder can never miss a variant.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $name:ident = $value:literal,)*) => {
        /// A stable numeric error code. Values are part of the wire format:
        /// never renumber, only add. On the wire a code travels as its
        /// number (a `u32`), not as a position in the enum, so adding a
        /// variant changes no other code's encoding and a code this build does
        /// not know (from a newer peer) decodes as [`ErrorCode::Internal`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum ErrorCode {
            $($(#[$doc])* $name = $value,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];
        }
    };
}

error_codes! {
    // --- transport / RPC (1xx) ---
    /// The connection could not be made or broke; the request may not have run.
    ConnectionFailed = 100,
    /// The deadline passed before a reply arrived; the request may have run.
    DeadlineExceeded = 101,
    /// The caller cancelled the request.
    Cancelled = 102,
    /// A frame was larger than the configured maximum.
    FrameTooLarge = 103,
    /// A frame or message body could not be decoded.
    MalformedMessage = 104,
    /// The server does not serve this method.
    UnknownMethod = 105,
    /// The server is at its in-flight limit; try again shortly.
    Overloaded = 106,
    /// The server is shutting down.
    ShuttingDown = 107,
    // --- generic (2xx) ---
    InvalidArgument = 200,
    NotFound = 201,
    AlreadyExists = 202,
    PermissionDenied = 203,
    Internal = 204,
    Unsupported = 205,
    ResourceExhausted = 206,
    // --- KV engine (3xx) ---
    /// A transaction conflicted with another; retry it.
    KvNotCommitted = 300,
    /// The commit may or may not have been applied.
    KvCommitUnknownResult = 301,
    /// The transaction's read version is too old.
    KvTransactionTooOld = 302,
    /// A key, value or transaction exceeded the engine limits.
    KvTooLarge = 303,
    // --- routing / replication (4xx) ---
    /// The request's chain version is not the one the server knows.
    StaleChainVersion = 400,
    /// The chunk has a pending version; retry or read relaxed.
    ChunkUncommitted = 401,
    /// The checksum of data did not match.
    ChecksumMismatch = 402,
    /// The target does not serve this operation in its current state.
    TargetNotServing = 403,
    /// A forwarded update's version does not follow the successor's committed
    /// version (replicas diverged); the predecessor repairs with a full-chunk replace.
    ChunkVersionMismatch = 404,
    // --- metadata (10xx) ---
    /// A path component or the operand is not a directory (ENOTDIR).
    NotDirectory = 1000,
    /// The operand is a directory where a non-directory is required (EISDIR).
    IsDirectory = 1001,
    /// The directory is not empty (ENOTEMPTY).
    NotEmpty = 1002,
    /// A name is longer than the limit (ENAMETOOLONG).
    NameTooLong = 1003,
    /// A compare-and-swap precondition (expected inode / version) did not hold.
    PreconditionFailed = 1004,
    /// A rename would move a directory into its own subtree (EINVAL in POSIX).
    WouldCreateCycle = 1005,
    // --- cluster manager (5xx) ---
    /// This mgmtd is not the primary; the message names the primary if
    /// known. Retry against another mgmtd.
    NotPrimary = 500,
    /// A heartbeat's node generation is older than the registered one: the
    /// sender was replaced and must stop (fencing).
    StaleNodeGeneration = 501,
}

impl ErrorCode {
    /// Whether the same request may succeed if sent again unchanged (possibly
    /// after a short backoff or to another server).
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::ConnectionFailed
                | ErrorCode::DeadlineExceeded
                | ErrorCode::Overloaded
                | ErrorCode::ShuttingDown
                | ErrorCode::KvNotCommitted
                | ErrorCode::KvCommitUnknownResult
                | ErrorCode::KvTransactionTooOld
                | ErrorCode::StaleChainVersion
                | ErrorCode::ChunkUncommitted
                | ErrorCode::TargetNotServing
                | ErrorCode::NotPrimary
        )
    }

    /// Whether the caller should refresh its routing info before retrying.
    pub fn needs_routing_refresh(self) -> bool {
        matches!(self, ErrorCode::StaleChainVersion | ErrorCode::TargetNotServing)
    }

    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// Decodes a wire value; unknown codes (from a newer peer) map to `Internal`.
    pub fn from_u32(v: u32) -> ErrorCode {
        ErrorCode::ALL.iter().copied().find(|c| c.as_u32() == v).unwrap_or(ErrorCode::Internal)
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(self.as_u32())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        u32::deserialize(deserializer).map(ErrorCode::from_u32)
    }
}

/// An error code with a human-readable message, as sent over the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct Status {
    pub code: ErrorCode,
    pub message: String,
}

impl Status {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Status { code, message: message.into() }
    }

    pub fn is_retryable(&self) -> bool {
        self.code.is_retryable()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_maps_to_internal() {
        for code in [ErrorCode::ConnectionFailed, ErrorCode::KvNotCommitted, ErrorCode::TargetNotServing] {
            assert_eq!(ErrorCode::from_u32(code.as_u32()), code);
        }
        assert_eq!(ErrorCode::from_u32(9999), ErrorCode::Internal);
        assert!(ErrorCode::StaleChainVersion.is_retryable());
        assert!(ErrorCode::StaleChainVersion.needs_routing_refresh());
        assert!(!ErrorCode::InvalidArgument.is_retryable());
    }

    #[test]
    fn every_code_round_trips_as_its_number() {
        let mut numbers = std::collections::BTreeSet::new();
        for &code in ErrorCode::ALL {
            assert!(numbers.insert(code.as_u32()), "{code:?} reuses a number");
            assert_eq!(ErrorCode::from_u32(code.as_u32()), code);
            // bincode (the RPC body codec: fixed-width little-endian) writes the number itself.
            let raw = bincode::serialize(&code).expect("encode");
            assert_eq!(raw, code.as_u32().to_le_bytes(), "{code:?} must travel as its number");
            assert_eq!(bincode::deserialize::<ErrorCode>(&raw).expect("decode"), code);
            let status = Status::new(code, "m");
            let raw = bincode::serialize(&status).expect("encode");
            assert_eq!(bincode::deserialize::<Status>(&raw).expect("decode"), status);
        }
    }

    #[test]
    fn an_unknown_code_from_a_newer_peer_decodes_as_internal() {
        let raw = bincode::serialize(&7777u32).expect("encode");
        assert_eq!(bincode::deserialize::<ErrorCode>(&raw).expect("decode"), ErrorCode::Internal);
        // A status carrying it keeps its message.
        let raw = bincode::serialize(&(7777u32, "from the future".to_string())).expect("encode");
        let status: Status = bincode::deserialize(&raw).expect("decode");
        assert_eq!(status, Status::new(ErrorCode::Internal, "from the future"));
    }
}
