//! Every error of the gateway becomes an S3 error here, in one place: the
//! filesystem's [`ErrorCode`]s, the key and request checks, the shared
//! HTTP layer's refusals ([`from_gateway`]) and our own conflict codes.
//! Handlers return [`S3Error`] built by these functions and never format
//! status codes themselves.

use bytes::Bytes;
use fskv_client::file::FileError;
use fskv_client::meta::MetaClientError;
use fskv_gateway::GatewayError;
use fskv_types::ErrorCode;
use s3s::{S3Error, S3ErrorCode};

/// A key names an object below a path that is itself an object (`a/b`
/// exists as an object, the request is for `a/b/c`).
pub const PARENT_IS_OBJECT: &str = "ParentIsObject";
/// A key names a path that is a directory of other objects (`a/b/c`
/// exists, the request is for object `a/b`).
pub const OBJECT_EXISTS_AS_PREFIX: &str = "ObjectExistsAsPrefix";

fn custom(code: &'static str, status: http::StatusCode, msg: String) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::Custom(code.into()), msg);
    e.set_status_code(status);
    e
}

pub fn parent_is_object(key: &str, parent: &str) -> S3Error {
    custom(
        PARENT_IS_OBJECT,
        http::StatusCode::CONFLICT,
        format!("cannot store {key:?}: {parent:?} is an object, so it cannot also be a prefix"),
    )
}

pub fn exists_as_prefix(key: &str) -> S3Error {
    custom(OBJECT_EXISTS_AS_PREFIX, http::StatusCode::CONFLICT, format!("cannot store {key:?}: other objects exist under {key:?}/"))
}

pub fn invalid_key(key: &str, why: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, format!("object key {key:?} is not accepted: {why}"))
}

/// The body's SHA-256 is not the signed `x-amz-content-sha256` (AWS: 400
/// `XAmzContentSHA256Mismatch`; s3s has no such code).
pub fn payload_sha256_mismatch() -> S3Error {
    custom(
        "XAmzContentSHA256Mismatch",
        http::StatusCode::BAD_REQUEST,
        "The provided 'x-amz-content-sha256' header does not match what was computed.".into(),
    )
}

pub fn no_such_key(key: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NoSuchKey, format!("no object {key:?}"))
}

/// A bucket of another tenant (every operation on it).
pub fn access_denied(bucket: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::AccessDenied, format!("bucket {bucket:?} belongs to another tenant"))
}

pub fn no_such_bucket(bucket: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NoSuchBucket, format!("no bucket {bucket:?}"))
}

pub fn no_such_upload(id: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NoSuchUpload, format!("no multipart upload {id:?} (completed, aborted or expired)"))
}

pub fn precondition_failed(what: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::PreconditionFailed, what.into())
}

/// A trailer announced in `x-amz-trailer` is missing from the aws-chunked
/// body (or the body carries none at all).
pub fn malformed_trailer(what: String) -> S3Error {
    custom("MalformedTrailerError", http::StatusCode::BAD_REQUEST, what)
}

pub fn bad_digest(what: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::BadDigest, what.into())
}

pub fn invalid_argument(what: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, what.into())
}

pub fn invalid_request(what: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, what.into())
}

pub fn internal(what: impl std::fmt::Display) -> S3Error {
    tracing::error!(error = %what, "internal error");
    S3Error::with_message(S3ErrorCode::InternalError, format!("internal error: {what}"))
}

/// 400 `InvalidURI`: a request path that is not UTF-8 once percent-decoded
/// (a key S3 cannot have), as AWS answers it.
pub fn invalid_uri() -> S3Error {
    let mut e =
        S3Error::with_message(S3ErrorCode::InvalidURI, "Couldn't parse the specified URI: the path is not UTF-8 once percent-decoded");
    e.set_status_code(http::StatusCode::BAD_REQUEST);
    e
}

/// 416 `InvalidRange`: a range (GET `Range`, `x-amz-copy-source-range`)
/// outside the object.
pub fn invalid_range(msg: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRange, msg)
}

pub fn invalid_part_number(msg: String) -> S3Error {
    custom("InvalidPartNumber", http::StatusCode::RANGE_NOT_SATISFIABLE, msg)
}

pub fn read_only(writer: Option<&str>) -> S3Error {
    let where_ = match writer {
        Some(w) => format!("; send writes to the writer gateway at {w}"),
        None => String::new(),
    };
    custom("ReadOnlyGateway", http::StatusCode::FORBIDDEN, format!("this gateway serves reads only (--role reader){where_}"))
}

/// Maps a filesystem error code to S3 for a request about `what` (a key or a bucket).
pub fn from_code(code: ErrorCode, what: &str, detail: &dyn std::fmt::Display) -> S3Error {
    match code {
        ErrorCode::NotFound => no_such_key(what),
        ErrorCode::AlreadyExists => custom("AlreadyExists", http::StatusCode::CONFLICT, format!("{what}: {detail}")),
        ErrorCode::PermissionDenied => S3Error::with_message(S3ErrorCode::AccessDenied, format!("{what}: {detail}")),
        ErrorCode::PreconditionFailed => {
            tracing::debug!(%what, %detail, "precondition failed");
            precondition_failed(format!("{what}: the object changed or exists, so the condition of the request does not hold"))
        }
        ErrorCode::NotDirectory => parent_is_object(what, "a parent"),
        ErrorCode::IsDirectory | ErrorCode::NotEmpty => exists_as_prefix(what),
        ErrorCode::NameTooLong => S3Error::with_message(S3ErrorCode::KeyTooLongError, format!("{what}: {detail}")),
        ErrorCode::InvalidArgument => invalid_argument(format!("{what}: {detail}")),
        ErrorCode::ResourceExhausted | ErrorCode::KvTooLarge => {
            custom("ResourceExhausted", http::StatusCode::INSUFFICIENT_STORAGE, format!("{what}: {detail}"))
        }
        c if c.is_retryable() => {
            tracing::warn!(%what, error = %detail, "unavailable");
            S3Error::with_message(S3ErrorCode::ServiceUnavailable, format!("{what}: {detail}; retry"))
        }
        _ => internal(format_args!("{what}: {detail}")),
    }
}

pub fn from_file(e: FileError, what: &str) -> S3Error {
    from_code(e.code(), what, &e)
}

pub fn from_meta(e: MetaClientError, what: &str) -> S3Error {
    from_code(e.code(), what, &e)
}

/// A refusal of the shared HTTP layer (limits, reader role, credentials
/// checked before s3s) as S3 reports it: S3's codes and statuses where S3
/// has them, the shared table's otherwise.
pub fn from_gateway(e: &GatewayError) -> S3Error {
    let reply = e.reply();
    match e {
        GatewayError::ReadOnly { writer_endpoint } => read_only(writer_endpoint.as_deref()),
        // S3 answers 400 for both.
        GatewayError::BodyTooLarge { .. } => S3Error::with_message(S3ErrorCode::EntityTooLarge, reply.message),
        GatewayError::BodyStalled { .. } => S3Error::with_message(S3ErrorCode::RequestTimeout, reply.message),
        _ => {
            let code = S3ErrorCode::from_bytes(reply.code.as_bytes()).unwrap_or_else(|| S3ErrorCode::Custom(reply.code.to_string().into()));
            let mut err = S3Error::with_message(code, reply.message);
            err.set_status_code(reply.status);
            err
        }
    }
}

/// The S3 error XML of `err`, with `request_id`.
pub fn xml_response(mut err: S3Error, request_id: &str) -> http::Response<Bytes> {
    use s3s::xml::Serialize as _;
    err.set_request_id(request_id);
    let status = err.status_code().unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut buf = Vec::with_capacity(256);
    let mut ser = s3s::xml::Serializer::new(&mut buf);
    if ser.decl().and_then(|()| err.serialize(&mut ser)).is_err() {
        buf = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code></Error>".to_vec();
    }
    let mut resp = http::Response::new(Bytes::from(buf));
    *resp.status_mut() = status;
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
    resp
}
