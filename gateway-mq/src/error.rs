//! The crate's one error enum and its mapping to the wire — both the native
//! API's JSON error body and the SQS facade's AWS JSON 1.0 error — in one
//! table ([`MqError::native`], [`MqError::sqs`]).
//!
//! | error | native status / code | SQS shape (query code) |
//! |---|---|---|
//! | `TopicNotFound` | 404 `TopicNotFound` | `QueueDoesNotExist` (`AWS.SimpleQueueService.NonExistentQueue`) |
//! | `TopicExists` | 409 `TopicAlreadyExists` | `QueueNameExists` (`QueueAlreadyExists`) |
//! | `PartitionNotFound` | 404 `PartitionNotFound` | `InvalidParameterValue` |
//! | `InvalidRequest`, `InvalidRecord` | 400 `InvalidRequest` / `InvalidRecord` | `InvalidParameterValue` |
//! | `LimitExceeded` | 413 `LimitExceeded` | `InvalidParameterValue` |
//! | `OffsetOutOfRange` | 416 `OffsetOutOfRange` | — |
//! | `NotPartitionWriter` | 421 `NotPartitionWriter` (names the owner) | `RequestThrottled` (503, retried by the SDK) |
//! | `Fenced` | 503 `WriterFenced` (retry: the next attempt re-acquires or is redirected) | `RequestThrottled` |
//! | `ProducerFenced`, `OutOfOrderSequence`, `UnknownProducerId` | 409, same codes | — |
//! | `GroupNotFound`, `UnknownMember` | 404 `GroupNotFound` / `UnknownMemberId` | — |
//! | `IllegalGeneration` | 409 `IllegalGeneration` | — |
//! | `InvalidReceipt` | 400 `InvalidReceipt` | `ReceiptHandleIsInvalid` (404) |
//! | `NotInFlight` | 409 `MessageNotInFlight` | `MessageNotInflight` (`AWS.SimpleQueueService.MessageNotInflight`) |
//! | `NotFound` | 404 `NotFound` | `InvalidAddress` |
//! | `AccessDenied` | 403 `AccessDenied` (a topic / queue of another tenant) | `AccessDenied` (403) |
//! | `MethodNotAllowed` | 405 `MethodNotAllowed` | — |
//! | `Unavailable` | 503 `Unavailable` | `ServiceUnavailable` (503) |
//! | `Conflict` | 409 `Conflict` | `RequestThrottled` |
//! | `Sqs` | 400 with its code | as given |
//! | `Corrupt`, `Internal` | 500 `InternalError` (text logged, never sent) | `InternalError` (500) |

use bytes::Bytes;
use fskv_client::file::FileError;
use fskv_client::MetaClientError;
use fskv_types::ErrorCode;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

#[derive(Debug, thiserror::Error)]
pub enum MqError {
    #[error("topic {0:?} does not exist")]
    TopicNotFound(String),
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    #[error("topic {topic:?} has no partition {partition}")]
    PartitionNotFound { topic: String, partition: u32 },
    #[error("{0}")]
    InvalidRequest(String),
    #[error("invalid record batch: {0}")]
    InvalidRecord(String),
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    #[error("offset {offset} is out of range: the log holds [{log_start}, {high_watermark})")]
    OffsetOutOfRange { offset: u64, log_start: u64, high_watermark: u64 },
    #[error("this gateway does not own the partition; its writer is {owner} (lease valid for {lease_ms} ms more)")]
    NotPartitionWriter { owner: String, lease_ms: u64 },
    #[error("this gateway lost the partition to another writer: {0}; retry")]
    Fenced(String),
    #[error("producer {producer_id} epoch {epoch} is fenced by epoch {current}")]
    ProducerFenced { producer_id: i64, epoch: i16, current: i16 },
    #[error("producer {producer_id}: sequence {got} does not follow {last}")]
    OutOfOrderSequence { producer_id: i64, got: i32, last: i32 },
    #[error("producer {0} is not known at this partition (expired or never seen): start it with sequence 0")]
    UnknownProducerId(i64),
    #[error("consumer group {0:?} does not exist")]
    GroupNotFound(String),
    #[error("member {0:?} is not in the group (it left or timed out): join again")]
    UnknownMember(String),
    #[error("generation {got} is not the group's current generation {current}: rejoin")]
    IllegalGeneration { got: u64, current: u64 },
    #[error("the receipt {0:?} is not valid")]
    InvalidReceipt(String),
    #[error("message is not in flight: {0}")]
    NotInFlight(String),
    #[error("{0} not found")]
    NotFound(String),
    /// A topic or queue of another tenant (every operation on it).
    #[error("{0}")]
    AccessDenied(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("conflict: {0}")]
    Conflict(String),
    /// An SQS error with its AWS shape name, query code, status and message.
    #[error("{message}")]
    Sqs { shape: &'static str, query_code: &'static str, status: u16, message: String },
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = MqError> = std::result::Result<T, E>;

impl MqError {
    /// Native API status and code.
    pub fn native(&self) -> (StatusCode, &'static str) {
        use MqError::*;
        use StatusCode as S;
        match self {
            TopicNotFound(_) => (S::NOT_FOUND, "TopicNotFound"),
            TopicExists(_) => (S::CONFLICT, "TopicAlreadyExists"),
            PartitionNotFound { .. } => (S::NOT_FOUND, "PartitionNotFound"),
            InvalidRequest(_) => (S::BAD_REQUEST, "InvalidRequest"),
            InvalidRecord(_) => (S::BAD_REQUEST, "InvalidRecord"),
            LimitExceeded(_) => (S::PAYLOAD_TOO_LARGE, "LimitExceeded"),
            OffsetOutOfRange { .. } => (S::RANGE_NOT_SATISFIABLE, "OffsetOutOfRange"),
            NotPartitionWriter { .. } => (S::MISDIRECTED_REQUEST, "NotPartitionWriter"),
            Fenced(_) => (S::SERVICE_UNAVAILABLE, "WriterFenced"),
            ProducerFenced { .. } => (S::CONFLICT, "ProducerFenced"),
            OutOfOrderSequence { .. } => (S::CONFLICT, "OutOfOrderSequence"),
            UnknownProducerId(_) => (S::CONFLICT, "UnknownProducerId"),
            GroupNotFound(_) => (S::NOT_FOUND, "GroupNotFound"),
            UnknownMember(_) => (S::NOT_FOUND, "UnknownMemberId"),
            IllegalGeneration { .. } => (S::CONFLICT, "IllegalGeneration"),
            InvalidReceipt(_) => (S::BAD_REQUEST, "InvalidReceipt"),
            NotInFlight(_) => (S::CONFLICT, "MessageNotInFlight"),
            NotFound(_) => (S::NOT_FOUND, "NotFound"),
            AccessDenied(_) => (S::FORBIDDEN, "AccessDenied"),
            MethodNotAllowed(_) => (S::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            Unavailable(_) => (S::SERVICE_UNAVAILABLE, "Unavailable"),
            Conflict(_) => (S::CONFLICT, "Conflict"),
            Sqs { status, query_code, .. } => (StatusCode::from_u16(*status).unwrap_or(S::BAD_REQUEST), query_code),
            Corrupt(_) | Internal(_) => (S::INTERNAL_SERVER_ERROR, "InternalError"),
        }
    }

    /// The message safe to send (internal details are logged, not sent).
    pub fn public_message(&self) -> String {
        match self {
            MqError::Corrupt(_) | MqError::Internal(_) => "internal error".into(),
            other => other.to_string(),
        }
    }

    /// SQS shape name (`__type` after `com.amazonaws.sqs#`), query code
    /// (`x-amzn-query-error`), status.
    pub fn sqs(&self) -> (&'static str, &'static str, StatusCode) {
        use MqError::*;
        use StatusCode as S;
        match self {
            Sqs { shape, query_code, status, .. } => (shape, query_code, StatusCode::from_u16(*status).unwrap_or(S::BAD_REQUEST)),
            TopicNotFound(_) => ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", S::BAD_REQUEST),
            TopicExists(_) => ("QueueNameExists", "QueueAlreadyExists", S::BAD_REQUEST),
            InvalidReceipt(_) => ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", S::NOT_FOUND),
            NotInFlight(_) => ("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", S::BAD_REQUEST),
            NotFound(_) => ("InvalidAddress", "InvalidAddress", S::NOT_FOUND),
            AccessDenied(_) => ("AccessDenied", "AccessDenied", S::FORBIDDEN),
            NotPartitionWriter { .. } | Fenced(_) | Conflict(_) => ("RequestThrottled", "RequestThrottled", S::SERVICE_UNAVAILABLE),
            Unavailable(_) => ("ServiceUnavailable", "ServiceUnavailable", S::SERVICE_UNAVAILABLE),
            Corrupt(_) | Internal(_) => ("InternalError", "InternalError", S::INTERNAL_SERVER_ERROR),
            LimitExceeded(_) | InvalidRequest(_) | InvalidRecord(_) | PartitionNotFound { .. } | OffsetOutOfRange { .. } => {
                ("InvalidParameterValue", "InvalidParameterValue", S::BAD_REQUEST)
            }
            _ => ("InvalidParameterValue", "InvalidParameterValue", S::BAD_REQUEST),
        }
    }

    /// Whether a client may retry the same request.
    pub fn retryable(&self) -> bool {
        matches!(self, MqError::Unavailable(_) | MqError::Fenced(_) | MqError::Conflict(_))
    }

    /// The native JSON error response.
    pub fn native_response(&self, request_id: &str) -> Response<Bytes> {
        let (status, code) = self.native();
        let mut err = serde_json::json!({ "code": code, "message": self.public_message(), "request_id": request_id });
        match self {
            MqError::NotPartitionWriter { owner, .. } => err["writer"] = serde_json::json!(owner),
            MqError::OffsetOutOfRange { log_start, high_watermark, .. } => {
                err["log_start_offset"] = serde_json::json!(log_start);
                err["high_watermark"] = serde_json::json!(high_watermark);
            }
            _ => {}
        }
        json_response(status, &serde_json::json!({ "error": err }))
    }

    /// The AWS JSON 1.0 error response of the SQS facade.
    pub fn sqs_response(&self) -> Response<Bytes> {
        let (shape, query, status) = self.sqs();
        let body = serde_json::json!({ "__type": format!("com.amazonaws.sqs#{shape}"), "message": self.public_message() });
        let mut resp = Response::new(Bytes::from(body.to_string()));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.0"));
        let fault = if status.is_server_error() { "Receiver" } else { "Sender" };
        if let Ok(v) = HeaderValue::from_str(&format!("{query};{fault}")) {
            h.insert("x-amzn-query-error", v);
        }
        resp
    }
}

/// A JSON response with `status`.
pub fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::from(v.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Maps a meta error of an operation on `what`.
pub fn from_meta(e: MetaClientError, what: &str) -> MqError {
    classify(e.code(), format!("{what}: {e}"))
}

/// Maps a file (data path) error of an operation on `what`.
pub fn from_file(e: FileError, what: &str) -> MqError {
    classify(e.code(), format!("{what}: {e}"))
}

fn classify(code: ErrorCode, text: String) -> MqError {
    match code {
        ErrorCode::NotFound => MqError::NotFound(text),
        ErrorCode::PreconditionFailed => MqError::Conflict(text),
        ErrorCode::AlreadyExists => MqError::Conflict(text),
        ErrorCode::InvalidArgument => MqError::Internal(text),
        _ => MqError::Unavailable(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_text_is_not_sent() {
        let r = MqError::Internal("meta at 10.0.0.1 said no".into()).native_response("R1");
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!String::from_utf8_lossy(r.body()).contains("10.0.0.1"));
    }

    #[test]
    fn sqs_errors_carry_type_and_query_code() {
        let r = MqError::TopicNotFound("q".into()).sqs_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["__type"], "com.amazonaws.sqs#QueueDoesNotExist");
        assert_eq!(r.headers()["x-amzn-query-error"], "AWS.SimpleQueueService.NonExistentQueue;Sender");
    }
}
