//! The crate's one error enum and its mapping to HTTP, in one place.
//!
//! | error | status | code |
//! |---|---|---|
//! | `InvalidKey` | 400 | `InvalidKey` |
//! | `KeyTooLong` | 400 | `KeyTooLong` |
//! | `InvalidNamespace` | 400 | `InvalidNamespaceName` |
//! | `InvalidArgument` | 400 | `InvalidArgument` |
//! | `InvalidFrame` | 400 | `InvalidBatchFrame` |
//! | `InvalidRange` | 400 | `InvalidRange` |
//! | `NoSuchNamespace` | 404 | `NoSuchNamespace` |
//! | `AccessDenied` | 403 | `AccessDenied` (a namespace of another tenant) |
//! | `NoSuchKey`, `NoSuchKeyAt` | 404 | `NoSuchKey` (`NoSuchKeyAt`: a watch's answer, with `X-Kv-Index`) |
//! | `MethodNotAllowed` | 405 | `MethodNotAllowed` |
//! | `KeyConflict` | 409 | `KeyConflict` (a name made outside the gateway is in the way) |
//! | `PreconditionFailed` | 412 | `PreconditionFailed` |
//! | `ValueTooLarge` | 413 | `ValueTooLarge` |
//! | `RangeNotSatisfiable` | 416 | `InvalidRange` (with `Content-Range: bytes */size`) |
//! | `NotImplemented` | 501 | `NotImplemented` |
//! | `Unavailable` | 503 | `ServiceUnavailable` (meta or storage unreachable or busy: retry) |
//! | `NamespaceFull` | 507 | `NamespaceFull` |
//! | `Gateway(..)` | the shared layer's table (docs/gateway.md) | |
//! | `Internal` | 500 | `InternalError` (text logged, never sent) |
//!
//! Filesystem errors map by their code ([`KvError::from_code`]): NotFound →
//! the caller's "no such" error, PreconditionFailed → 412, AlreadyExists →
//! 412 (a create-only put lost), IsDirectory/NotDirectory → 409,
//! KvTooLarge/NameTooLong/InvalidArgument → 400, retryable codes
//! (timeouts, overload, unreachable servers) and ResourceExhausted → 503,
//! anything else → 500.

use bytes::Bytes;
use fskv_gateway::{ErrorReply, GatewayError};
use fskv_types::ErrorCode;
use http::{Response, StatusCode};

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("{0}")]
    InvalidKey(String),
    #[error("the key is {len} bytes; at most {max} are accepted")]
    KeyTooLong { len: usize, max: usize },
    #[error("{0:?} is not a namespace name (1..=64 of A-Z a-z 0-9 . _ -, starting with a letter or digit)")]
    InvalidNamespace(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("bad batch frame: {0}")]
    InvalidFrame(String),
    #[error("{0}")]
    InvalidRange(String),
    /// A namespace of another tenant (every operation on it).
    #[error("{0}")]
    AccessDenied(String),
    #[error("no namespace {0:?}: create it with PUT /v1/ns/{0}")]
    NoSuchNamespace(String),
    #[error("no such key")]
    NoSuchKey,
    /// A watch that ended on a missing key: 404 with the index to wait on next.
    #[error("no such key")]
    NoSuchKeyAt { index: u64 },
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    KeyConflict(String),
    #[error("{0}")]
    PreconditionFailed(String),
    #[error("the value is {} bytes; at most {max} are accepted", len.map_or("more than that".to_string(), |l| l.to_string()))]
    ValueTooLarge { len: Option<u64>, max: u64 },
    #[error("the range is outside the value of {size} bytes")]
    RangeNotSatisfiable { size: u64 },
    #[error("{0}")]
    NotImplemented(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("namespace {ns:?} is full ({detail}); eviction could not make room in time")]
    NamespaceFull { ns: String, detail: String },
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// Logged where it is handled; the client sees "internal error".
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = KvError> = std::result::Result<T, E>;

impl KvError {
    /// A filesystem failure with `code` while doing `what`; `not_found` is
    /// what NotFound means there.
    /// A failed key walk (scan, maintenance) of a namespace.
    pub fn walk(e: fskv_client::MetaClientError) -> KvError {
        KvError::from_code(e.code(), "scan", KvError::NoSuchKey)
    }

    pub fn from_code(code: ErrorCode, what: impl std::fmt::Display, not_found: KvError) -> KvError {
        use ErrorCode as C;
        match code {
            C::NotFound => not_found,
            C::PreconditionFailed | C::AlreadyExists => KvError::PreconditionFailed(format!("{what}: the precondition does not hold")),
            C::IsDirectory | C::NotDirectory | C::NotEmpty => {
                KvError::KeyConflict(format!("{what}: a name made outside the KV gateway is in the way"))
            }
            C::KvTooLarge | C::NameTooLong => KvError::InvalidArgument(format!("{what}: too large")),
            C::InvalidArgument => KvError::InvalidArgument(format!("{what}: invalid argument")),
            c if c.is_retryable() || c == C::ResourceExhausted => {
                KvError::Unavailable(format!("{what}: the cluster did not answer in time ({code:?}); retry"))
            }
            other => KvError::Internal(format!("{what}: {other:?}")),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.reply().status
    }

    /// Status, stable code and a message safe to send.
    pub fn reply(&self) -> ErrorReply {
        use StatusCode as S;
        let (status, code) = match self {
            KvError::InvalidKey(_) => (S::BAD_REQUEST, "InvalidKey"),
            KvError::KeyTooLong { .. } => (S::BAD_REQUEST, "KeyTooLong"),
            KvError::InvalidNamespace(_) => (S::BAD_REQUEST, "InvalidNamespaceName"),
            KvError::InvalidArgument(_) => (S::BAD_REQUEST, "InvalidArgument"),
            KvError::InvalidFrame(_) => (S::BAD_REQUEST, "InvalidBatchFrame"),
            KvError::InvalidRange(_) => (S::BAD_REQUEST, "InvalidRange"),
            KvError::NoSuchNamespace(_) => (S::NOT_FOUND, "NoSuchNamespace"),
            KvError::AccessDenied(_) => (S::FORBIDDEN, "AccessDenied"),
            KvError::NoSuchKey | KvError::NoSuchKeyAt { .. } => (S::NOT_FOUND, "NoSuchKey"),
            KvError::MethodNotAllowed(_) => (S::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            KvError::KeyConflict(_) => (S::CONFLICT, "KeyConflict"),
            KvError::PreconditionFailed(_) => (S::PRECONDITION_FAILED, "PreconditionFailed"),
            KvError::ValueTooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "ValueTooLarge"),
            KvError::RangeNotSatisfiable { .. } => (S::RANGE_NOT_SATISFIABLE, "InvalidRange"),
            KvError::NotImplemented(_) => (S::NOT_IMPLEMENTED, "NotImplemented"),
            KvError::Unavailable(_) => (S::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
            KvError::NamespaceFull { .. } => (S::INSUFFICIENT_STORAGE, "NamespaceFull"),
            KvError::Gateway(g) => return g.reply(),
            KvError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "InternalError"),
        };
        let message = match self {
            KvError::Internal(_) => "internal error".to_string(),
            other => other.to_string(),
        };
        ErrorReply::new(status, code, message)
    }

    /// The JSON error response (`{"error": {code, message, request_id}}`).
    pub fn response(&self, request_id: &str) -> Response<Bytes> {
        if let KvError::Internal(text) = self {
            tracing::error!(error = %text, "request failed");
        } else if let KvError::Unavailable(text) = self {
            tracing::warn!(error = %text, "request failed: cluster unavailable");
        }
        let mut resp = self.reply().json(request_id);
        if let KvError::NoSuchKeyAt { index } = self {
            resp.headers_mut().insert("x-kv-index", http::HeaderValue::from(*index));
        }
        if let KvError::RangeNotSatisfiable { size } = self {
            if let Ok(v) = http::HeaderValue::from_str(&format!("bytes */{size}")) {
                resp.headers_mut().insert(http::header::CONTENT_RANGE, v);
            }
        }
        resp
    }
}

impl From<crate::frame::FrameError> for KvError {
    fn from(e: crate::frame::FrameError) -> Self {
        KvError::InvalidFrame(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_codes() {
        assert_eq!(KvError::NoSuchKey.status(), StatusCode::NOT_FOUND);
        assert_eq!(KvError::KeyTooLong { len: 5000, max: 4096 }.status(), StatusCode::BAD_REQUEST);
        assert_eq!(KvError::NamespaceFull { ns: "a".into(), detail: "x".into() }.status(), StatusCode::INSUFFICIENT_STORAGE);
        let ro = KvError::Gateway(GatewayError::ReadOnly { writer_endpoint: Some("http://w".into()) }).reply();
        assert_eq!((ro.status, ro.code.as_ref()), (StatusCode::FORBIDDEN, "ReadOnlyGateway"));
        assert!(ro.message.contains("http://w"));
        let r = KvError::Internal("meta 10.1.1.1 exploded".into()).reply();
        assert!(!r.message.contains("10.1.1.1"));
        assert_eq!(KvError::from_code(ErrorCode::DeadlineExceeded, "x", KvError::NoSuchKey).status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(KvError::from_code(ErrorCode::NotFound, "x", KvError::NoSuchKey).status(), StatusCode::NOT_FOUND);
        let resp = KvError::RangeNotSatisfiable { size: 10 }.response("id");
        assert_eq!(resp.headers()[http::header::CONTENT_RANGE], "bytes */10");
    }
}
