//! The crate's one error enum and its HTTP mapping, in one place.
//!
//! [`GatewayError`] is what the shared layer refuses a request with (limits,
//! role, authentication) and what set-up fails with. [`GatewayError::reply`]
//! gives the default status and a stable code; each protocol renders the
//! reply in its own format (S3 XML, JSON for KV/MQ via [`ErrorReply::json`])
//! and may map a code to another status in its own one place.
//!
//! | error | status | code |
//! |---|---|---|
//! | `ReadOnly` | 403 | `ReadOnlyGateway` |
//! | `UriTooLong` | 414 | `UriTooLong` |
//! | `BodyTooLarge` | 413 | `EntityTooLarge` |
//! | `BodyStalled` | 408 | `RequestTimeout` |
//! | `BodyRead` | 400 | `IncompleteBody` |
//! | `Auth(Missing)` | 403 | `AccessDenied` |
//! | `Auth(SigV2Refused)`, `Auth(UnsupportedAlgorithm)` | 400 | `InvalidRequest` |
//! | `Auth(MalformedHeader)`, `Auth(WrongRegion)`, `Auth(WrongService)` | 400 | `AuthorizationHeaderMalformed` |
//! | `Auth(MalformedQuery)`, `Auth(ExpiresTooLong)` | 400 | `AuthorizationQueryParametersError` |
//! | `Auth(UnknownAccessKey)` | 403 | `InvalidAccessKeyId` |
//! | `Auth(SignatureMismatch)` | 403 | `SignatureDoesNotMatch` |
//! | `Auth(Expired)`, `Auth(NotYetValid)` | 403 | `AccessDenied` |
//! | `Auth(TimeSkewed)` | 403 | `RequestTimeTooSkewed` |
//! | `Auth(SessionToken)` | 403 | `InvalidToken` |
//! | `Auth(ContentSha256Mismatch)` | 400 | `XAmzContentSHA256Mismatch` |
//! | `Auth(NeedsBody)` | 500 | `InternalError` (a protocol bug: see [`AuthError::NeedsBody`]) |
//! | `Auth(BadBearerToken)` | 401 | `InvalidToken` |
//! | `Internal`, `Setup` | 500 | `InternalError` (details never sent) |

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use std::borrow::Cow;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("this gateway serves reads only (--role reader){}", writer_hint(.writer_endpoint))]
    ReadOnly { writer_endpoint: Option<String> },
    #[error("the request target is {len} bytes; at most {max} are accepted")]
    UriTooLong { len: usize, max: usize },
    #[error("the request body is {} bytes; at most {max} are accepted for this request", body_len(*.len))]
    BodyTooLarge {
        /// Known length, or `None` when the limit was passed while streaming.
        len: Option<u64>,
        max: u64,
    },
    #[error("no byte of the request body arrived for {timeout_ms} ms")]
    BodyStalled { timeout_ms: u64 },
    #[error("the request body could not be read: {0}")]
    BodyRead(String),
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A failure inside the gateway; the text is logged, never sent.
    #[error("internal error: {0}")]
    Internal(String),
    /// Start-up failed (listen address, TLS files, key file, limits).
    #[error("{0}")]
    Setup(String),
}

fn writer_hint(w: &Option<String>) -> String {
    match w {
        Some(w) => format!("; send writes to the writer gateway at {w}"),
        None => String::new(),
    }
}

fn body_len(len: Option<u64>) -> String {
    match len {
        Some(n) => n.to_string(),
        None => "more than that".into(),
    }
}

/// Why a request's credentials were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("the request is not signed")]
    Missing,
    #[error("signature version 2 is not accepted; sign with AWS4-HMAC-SHA256 (SigV4)")]
    SigV2Refused,
    #[error("unsupported authorization: {0}")]
    UnsupportedAlgorithm(String),
    #[error("malformed Authorization header: {0}")]
    MalformedHeader(String),
    #[error("malformed presigned query: {0}")]
    MalformedQuery(String),
    #[error("the access key is not known to this gateway")]
    UnknownAccessKey,
    #[error("the signature does not match the request and the key's secret")]
    SignatureMismatch,
    #[error("the presigned request has expired")]
    Expired,
    #[error("the presigned request is not valid yet (its date is in the future)")]
    NotYetValid,
    #[error("X-Amz-Expires is {secs} s; at most 604800 (7 days) are accepted")]
    ExpiresTooLong { secs: u64 },
    #[error("the request time is more than 15 minutes away from the server's time")]
    TimeSkewed,
    #[error("the credential scope's region {got:?} is wrong; expecting {expected:?}")]
    WrongRegion { got: String, expected: String },
    #[error("the credential scope's service {got:?} is not served here; expecting {expected}")]
    WrongService { got: String, expected: String },
    #[error("session tokens (temporary credentials) are not accepted")]
    SessionToken,
    #[error("the x-amz-content-sha256 header does not match the body")]
    ContentSha256Mismatch,
    /// Header auth without `x-amz-content-sha256`: the payload hash is the
    /// body's, so the caller must read the body and verify again with it.
    #[error("the signature covers the body: it must be read before verifying")]
    NeedsBody,
    #[error("the bearer token is not valid")]
    BadBearerToken,
}

/// What a client is told about a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReply {
    pub status: StatusCode,
    /// Stable machine-readable code (AWS names where AWS has one).
    pub code: Cow<'static, str>,
    /// Safe to send: no internal details.
    pub message: String,
}

impl ErrorReply {
    pub fn new(status: StatusCode, code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        ErrorReply { status, code: code.into(), message: message.into() }
    }

    /// `{"error": {"code": .., "message": .., "request_id": ..}}` with the
    /// status; the JSON shape of the KV and MQ native APIs.
    pub fn json(&self, request_id: &str) -> Response<Bytes> {
        let body = serde_json::json!({
            "error": { "code": self.code, "message": self.message, "request_id": request_id }
        });
        let mut resp = Response::new(Bytes::from(body.to_string()));
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        resp
    }
}

impl GatewayError {
    /// Status, code and a message safe to send (see the table above).
    pub fn reply(&self) -> ErrorReply {
        use StatusCode as S;
        let (status, code): (StatusCode, &'static str) = match self {
            GatewayError::ReadOnly { .. } => (S::FORBIDDEN, "ReadOnlyGateway"),
            GatewayError::UriTooLong { .. } => (S::URI_TOO_LONG, "UriTooLong"),
            GatewayError::BodyTooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "EntityTooLarge"),
            GatewayError::BodyStalled { .. } => (S::REQUEST_TIMEOUT, "RequestTimeout"),
            GatewayError::BodyRead(_) => (S::BAD_REQUEST, "IncompleteBody"),
            GatewayError::Auth(a) => a.status_code(),
            GatewayError::Internal(_) | GatewayError::Setup(_) => (S::INTERNAL_SERVER_ERROR, "InternalError"),
        };
        let message = match self {
            GatewayError::Internal(_) | GatewayError::Setup(_) | GatewayError::Auth(AuthError::NeedsBody) => "internal error".to_string(),
            other => other.to_string(),
        };
        ErrorReply::new(status, code, message)
    }

    /// The shared layer's error behind a request body's error, if it is one
    /// (a handler reading [`crate::RequestBody`] gets these as `BoxError`).
    pub fn from_body_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a GatewayError> {
        e.downcast_ref::<GatewayError>()
    }
}

impl AuthError {
    fn status_code(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            AuthError::Missing => (S::FORBIDDEN, "AccessDenied"),
            AuthError::SigV2Refused | AuthError::UnsupportedAlgorithm(_) => (S::BAD_REQUEST, "InvalidRequest"),
            AuthError::MalformedHeader(_) | AuthError::WrongRegion { .. } | AuthError::WrongService { .. } => {
                (S::BAD_REQUEST, "AuthorizationHeaderMalformed")
            }
            AuthError::MalformedQuery(_) | AuthError::ExpiresTooLong { .. } => (S::BAD_REQUEST, "AuthorizationQueryParametersError"),
            AuthError::UnknownAccessKey => (S::FORBIDDEN, "InvalidAccessKeyId"),
            AuthError::SignatureMismatch => (S::FORBIDDEN, "SignatureDoesNotMatch"),
            AuthError::Expired | AuthError::NotYetValid => (S::FORBIDDEN, "AccessDenied"),
            AuthError::TimeSkewed => (S::FORBIDDEN, "RequestTimeTooSkewed"),
            AuthError::SessionToken => (S::FORBIDDEN, "InvalidToken"),
            AuthError::ContentSha256Mismatch => (S::BAD_REQUEST, "XAmzContentSHA256Mismatch"),
            AuthError::NeedsBody => (S::INTERNAL_SERVER_ERROR, "InternalError"),
            AuthError::BadBearerToken => (S::UNAUTHORIZED, "InvalidToken"),
        }
    }

    /// A short label for metrics (`fskv_gateway_requests_refused_total{reason}`).
    pub fn label(&self) -> &'static str {
        match self {
            AuthError::Missing => "auth_missing",
            AuthError::SigV2Refused => "auth_sigv2",
            AuthError::UnsupportedAlgorithm(_) => "auth_algorithm",
            AuthError::MalformedHeader(_) | AuthError::MalformedQuery(_) => "auth_malformed",
            AuthError::UnknownAccessKey => "auth_unknown_key",
            AuthError::SignatureMismatch => "auth_signature",
            AuthError::Expired | AuthError::NotYetValid | AuthError::ExpiresTooLong { .. } => "auth_expiry",
            AuthError::TimeSkewed => "auth_skew",
            AuthError::WrongRegion { .. } | AuthError::WrongService { .. } => "auth_scope",
            AuthError::SessionToken => "auth_session_token",
            AuthError::ContentSha256Mismatch => "auth_payload_hash",
            AuthError::NeedsBody => "auth_needs_body",
            AuthError::BadBearerToken => "auth_bearer",
        }
    }
}

impl GatewayError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            GatewayError::ReadOnly { .. } => "read_only",
            GatewayError::UriTooLong { .. } => "uri_too_long",
            GatewayError::BodyTooLarge { .. } => "body_too_large",
            GatewayError::BodyStalled { .. } => "body_stalled",
            GatewayError::BodyRead(_) => "body_read",
            GatewayError::Auth(a) => a.label(),
            GatewayError::Internal(_) | GatewayError::Setup(_) => "internal",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_details_are_not_sent() {
        let r = GatewayError::Internal("meta at 10.0.0.1:9012 refused".into()).reply();
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!r.message.contains("10.0.0.1"));
        let resp = r.json("ID1");
        let v: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
        assert_eq!(v["error"]["code"], "InternalError");
        assert_eq!(v["error"]["request_id"], "ID1");
    }

    #[test]
    fn read_only_names_the_writer() {
        let r = GatewayError::ReadOnly { writer_endpoint: Some("http://127.0.0.1:9000".into()) }.reply();
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert_eq!(r.code, "ReadOnlyGateway");
        assert!(r.message.contains("http://127.0.0.1:9000"), "{}", r.message);
    }
}
