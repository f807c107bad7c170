//! etcd's v3 API through its JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`)
//! over HTTP/1.1: the request and response shapes, endpoint failover, and the
//! one mapping of etcd errors to [`KvError`].
//!
//! Bytes travel as base64 and 64-bit integers as decimal strings (the proto3
//! JSON mapping); a field at its default value is left out of responses.
//!
//! Failover (every call has a deadline, `request_timeout_ms`):
//!
//! | outcome of one attempt | read (`range`) | commit (`txn` with writes) |
//! |---|---|---|
//! | connection refused / connect timeout | next endpoint | next endpoint (nothing was sent) |
//! | etcd refused before proposing (`no leader`, `too many requests`, `not capable`) | next endpoint | next endpoint |
//! | connection lost or timed out after sending; `request timed out`, `leader changed` | next endpoint | [`KvError::CommitUnknownResult`] |
//! | `required revision has been compacted` | [`KvError::TransactionTooOld`] | same |
//! | `too many operations in txn request` | — | [`KvError::TooManyOperations`] |
//! | `request is too large` | [`KvError::TransactionTooLarge`] | same |
//! | `database space exceeded` | — | [`KvError::Storage`] naming the quota |
//! | deadline passed without an answer | [`KvError::Retryable`] | [`KvError::Retryable`] if never sent, else unknown result |
//!
//! The endpoint that answered last is tried first by the next call.

use crate::{KvError, KvResult};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize, Serializer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Largest response body accepted (a range page of 256 values of 100 kB is
/// about 34 MB in base64).
pub(crate) const MAX_RESPONSE_BYTES: usize = 64 << 20;

fn b64<S: Serializer>(v: &Bytes, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&B64.encode(v))
}

fn b64_opt<S: Serializer>(v: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&B64.encode(v)),
        None => s.serialize_none(),
    }
}

fn int_str<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// `RangeRequest` (only the fields used).
#[derive(Serialize, Debug, Clone)]
pub(crate) struct RangeReq {
    #[serde(serialize_with = "b64")]
    pub key: Bytes,
    #[serde(serialize_with = "b64_opt", skip_serializing_if = "Option::is_none")]
    pub range_end: Option<Bytes>,
    #[serde(serialize_with = "int_str", skip_serializing_if = "is_zero")]
    pub limit: i64,
    #[serde(serialize_with = "int_str", skip_serializing_if = "is_zero")]
    pub revision: i64,
    /// "DESCEND" for reverse reads (etcd then sorts the whole range before limiting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sort_order: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sort_target: Option<&'static str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub keys_only: bool,
    /// Served by the member from its own state, without a round through the
    /// leader: right for reads at a fixed past revision (immutable).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub serializable: bool,
}

impl RangeReq {
    pub fn key(key: Bytes) -> Self {
        RangeReq { key, range_end: None, limit: 0, revision: 0, sort_order: None, sort_target: None, keys_only: false, serializable: false }
    }
}

#[derive(Serialize, Debug, Clone)]
pub(crate) struct PutReq {
    #[serde(serialize_with = "b64")]
    pub key: Bytes,
    #[serde(serialize_with = "b64")]
    pub value: Bytes,
}

#[derive(Serialize, Debug, Clone)]
pub(crate) struct DeleteReq {
    #[serde(serialize_with = "b64")]
    pub key: Bytes,
    #[serde(serialize_with = "b64_opt", skip_serializing_if = "Option::is_none")]
    pub range_end: Option<Bytes>,
}

#[derive(Serialize, Debug, Clone)]
pub(crate) struct CompareReq {
    #[serde(serialize_with = "b64")]
    pub key: Bytes,
    #[serde(serialize_with = "b64_opt", skip_serializing_if = "Option::is_none")]
    pub range_end: Option<Bytes>,
    pub target: &'static str,
    pub result: &'static str,
    #[serde(serialize_with = "int_str")]
    pub mod_revision: i64,
}

#[derive(Serialize, Debug, Clone)]
pub(crate) enum RequestOp {
    #[serde(rename = "request_range")]
    Range(RangeReq),
    #[serde(rename = "request_put")]
    Put(PutReq),
    #[serde(rename = "request_delete_range")]
    DeleteRange(DeleteReq),
    #[serde(rename = "request_txn")]
    Txn(TxnReq),
}

#[derive(Serialize, Debug, Clone, Default)]
pub(crate) struct TxnReq {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compare: Vec<CompareReq>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub success: Vec<RequestOp>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failure: Vec<RequestOp>,
}

fn de_i64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        S(String),
        I(i64),
    }
    match N::deserialize(d)? {
        N::S(s) => s.parse().map_err(serde::de::Error::custom),
        N::I(i) => Ok(i),
    }
}

fn de_b64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
    let s = String::deserialize(d)?;
    B64.decode(s.as_bytes()).map(Bytes::from).map_err(serde::de::Error::custom)
}

#[derive(Deserialize, Debug, Clone, Default)]
pub(crate) struct Header {
    #[serde(default, deserialize_with = "de_i64")]
    pub revision: i64,
}

#[derive(Deserialize, Debug, Clone)]
pub(crate) struct Kv {
    #[serde(deserialize_with = "de_b64")]
    pub key: Bytes,
    #[serde(default, deserialize_with = "de_b64")]
    pub value: Bytes,
    #[serde(default, deserialize_with = "de_i64")]
    pub mod_revision: i64,
}

#[derive(Deserialize, Debug, Clone, Default)]
pub(crate) struct RangeResp {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub kvs: Vec<Kv>,
    #[serde(default)]
    pub more: bool,
}

#[derive(Deserialize, Debug, Clone, Default)]
pub(crate) struct ResponseOp {
    #[serde(default)]
    pub response_range: Option<RangeResp>,
    #[serde(default)]
    pub response_txn: Option<TxnResp>,
}

#[derive(Deserialize, Debug, Clone, Default)]
pub(crate) struct TxnResp {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<ResponseOp>,
}

#[derive(Deserialize, Debug, Default)]
struct ErrorBody {
    #[serde(default)]
    error: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    code: i32,
}

/// Whether a call may have changed the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallKind {
    Read,
    Commit,
}

/// What one failed attempt means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Nothing was applied; another endpoint may answer.
    TryNext(String),
    /// The request reached etcd and may have been applied; another endpoint
    /// may answer a read.
    Ambiguous(String),
    /// A final answer.
    Final(KvError),
}

/// Classifies an error answer of etcd (`code` is the gRPC status code).
pub(crate) fn classify(code: i32, message: &str) -> Failure {
    let m = message.trim_start_matches("etcdserver: ");
    if m.contains("required revision has been compacted") {
        return Failure::Final(KvError::TransactionTooOld);
    }
    if m.contains("too many operations in txn request") {
        return Failure::Final(KvError::TooManyOperations { ops: 0, limit: 0 });
    }
    if m.contains("request is too large") {
        return Failure::Final(KvError::TransactionTooLarge { size: 0, limit: 0 });
    }
    if m.contains("database space exceeded") {
        return Failure::Final(KvError::Storage(
            "etcd database space exceeded (--quota-backend-bytes): compact, defragment and disarm the NOSPACE alarm, or raise the quota"
                .into(),
        ));
    }
    // Refused before a proposal was made: nothing applied.
    if m.contains("no leader") || m.contains("too many requests") || m.contains("not capable") || m.contains("unhealthy cluster") {
        return Failure::TryNext(message.to_string());
    }
    // gRPC Unavailable / DeadlineExceeded / Canceled / Unknown: the proposal may be in the log.
    if matches!(code, 14 | 4 | 1 | 2) || m.contains("timed out") || m.contains("leader changed") {
        return Failure::Ambiguous(message.to_string());
    }
    Failure::Final(KvError::Storage(format!("etcd error {code}: {message}")))
}

/// A client of one etcd cluster (a list of endpoints).
pub(crate) struct EtcdHttp {
    endpoints: Vec<String>,
    current: AtomicUsize,
    http: Client<HttpConnector, Full<Bytes>>,
    request_timeout: Duration,
    attempt_timeout: Duration,
}

impl EtcdHttp {
    pub fn new(endpoints: Vec<String>, connect_timeout_ms: u64, request_timeout_ms: u64) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_millis(connect_timeout_ms.max(1))));
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(64).build(connector);
        let request_timeout = Duration::from_millis(request_timeout_ms.max(1));
        // One attempt may take most of the deadline (a proposal waits for an
        // election), but leaves time to try another endpoint.
        let attempt_timeout = (request_timeout * 2 / 3).max(Duration::from_millis(1));
        EtcdHttp { endpoints, current: AtomicUsize::new(0), http, request_timeout, attempt_timeout }
    }

    /// One attempt at `endpoint`.
    async fn attempt(&self, endpoint: &str, path: &str, body: Bytes, kind: CallKind) -> Result<Bytes, Failure> {
        let uri = format!("{endpoint}{path}");
        let req = hyper::Request::post(&uri)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| Failure::Final(KvError::InvalidArgument(format!("bad etcd endpoint {endpoint:?}: {e}"))))?;
        let sent = tokio::time::timeout(self.attempt_timeout, async {
            let resp = self.http.request(req).await.map_err(|e| {
                if e.is_connect() {
                    Failure::TryNext(format!("cannot connect to {endpoint}: {e}"))
                } else {
                    Failure::Ambiguous(format!("{endpoint}: {e}"))
                }
            })?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| Failure::Ambiguous(format!("{endpoint}: reading the response: {e}")))?
                .to_bytes();
            Ok::<_, Failure>((status, body))
        })
        .await;
        let (status, body) = match sent {
            Ok(r) => r?,
            Err(_) => return Err(Failure::Ambiguous(format!("{endpoint}: no answer within {} ms", self.attempt_timeout.as_millis()))),
        };
        if status.is_success() {
            return Ok(body);
        }
        let err: ErrorBody = serde_json::from_slice(&body).unwrap_or_default();
        let message = if err.message.is_empty() { err.error } else { err.message };
        if message.is_empty() {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            // A proxy or a server without the gateway: not an etcd answer.
            return Err(match kind {
                CallKind::Read => Failure::TryNext(format!("{endpoint}: HTTP {status}: {text}")),
                CallKind::Commit => Failure::Ambiguous(format!("{endpoint}: HTTP {status}: {text}")),
            });
        }
        Err(classify(err.code, &message))
    }

    /// Calls `path` with `req`, failing over between endpoints (see the module doc).
    pub async fn call<Req: Serialize, Resp: for<'de> Deserialize<'de>>(&self, path: &str, req: &Req, kind: CallKind) -> KvResult<Resp> {
        let body = Bytes::from(serde_json::to_vec(req).map_err(|e| KvError::Storage(format!("encoding an etcd request: {e}")))?);
        let deadline = Instant::now() + self.request_timeout;
        let n = self.endpoints.len().max(1);
        let mut index = self.current.load(Ordering::Relaxed) % n;
        let mut backoff = Duration::from_millis(20);
        let mut last: String;
        let mut tried = 0usize;
        loop {
            let endpoint = &self.endpoints[index];
            match self.attempt(endpoint, path, body.clone(), kind).await {
                Ok(bytes) => {
                    self.current.store(index, Ordering::Relaxed);
                    return serde_json::from_slice(&bytes).map_err(|e| {
                        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
                        tracing::error!(endpoint = %endpoint, path, error = %e, response = %text, "undecodable etcd response");
                        match kind {
                            // etcd answered 200: the transaction was applied or not, unknown to us.
                            CallKind::Commit => KvError::CommitUnknownResult,
                            CallKind::Read => KvError::Storage(format!("undecodable etcd response from {endpoint}{path}: {e}: {text}")),
                        }
                    });
                }
                Err(Failure::Final(e)) => return Err(e),
                Err(Failure::Ambiguous(m)) if kind == CallKind::Commit => {
                    tracing::warn!(endpoint = %endpoint, error = %m, "etcd commit outcome unknown");
                    return Err(KvError::CommitUnknownResult);
                }
                Err(Failure::Ambiguous(m)) | Err(Failure::TryNext(m)) => {
                    last = m;
                }
            }
            tried += 1;
            index = (index + 1) % n;
            self.current.store(index, Ordering::Relaxed);
            if Instant::now() >= deadline {
                break;
            }
            // A round over every endpoint failed: wait a little (an election takes about a second).
            if tried.is_multiple_of(n) {
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(backoff.min(left)).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
        // Only failures before anything was applied get here (an ambiguous
        // commit returned above), so the whole transaction may be retried.
        Err(KvError::Retryable {
            code: 14,
            message: format!("etcd unavailable after {} ms at {:?}: {last}", self.request_timeout.as_millis(), self.endpoints),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_map_to_kv_errors() {
        assert_eq!(classify(11, "etcdserver: mvcc: required revision has been compacted"), Failure::Final(KvError::TransactionTooOld));
        assert!(matches!(classify(3, "etcdserver: too many operations in txn request"), Failure::Final(KvError::TooManyOperations { .. })));
        assert!(matches!(classify(3, "etcdserver: request is too large"), Failure::Final(KvError::TransactionTooLarge { .. })));
        assert!(
            matches!(classify(8, "etcdserver: mvcc: database space exceeded"), Failure::Final(KvError::Storage(m)) if m.contains("quota"))
        );
        assert!(matches!(classify(14, "etcdserver: no leader"), Failure::TryNext(_)));
        assert!(matches!(classify(14, "etcdserver: request timed out"), Failure::Ambiguous(_)));
        assert!(matches!(classify(14, "etcdserver: leader changed"), Failure::Ambiguous(_)));
        assert!(matches!(classify(3, "etcdserver: duplicate key given in txn request"), Failure::Final(KvError::Storage(_))));
    }

    #[test]
    fn requests_encode_bytes_as_base64_and_revisions_as_strings() {
        let txn = TxnReq {
            compare: vec![CompareReq {
                key: Bytes::from_static(b"a"),
                range_end: Some(Bytes::from_static(b"b")),
                target: "MOD",
                result: "LESS",
                mod_revision: 11,
            }],
            success: vec![RequestOp::Put(PutReq { key: Bytes::from_static(b"k"), value: Bytes::from_static(b"\x00\xff") })],
            failure: vec![],
        };
        let json = serde_json::to_string(&txn).unwrap();
        assert_eq!(
            json,
            r#"{"compare":[{"key":"YQ==","range_end":"Yg==","target":"MOD","result":"LESS","mod_revision":"11"}],"success":[{"request_put":{"key":"aw==","value":"AP8="}}]}"#
        );
    }

    #[test]
    fn responses_decode_with_defaults_left_out() {
        let r: TxnResp = serde_json::from_str(
            r#"{"header":{"revision":"7"},"succeeded":true,"responses":[{"response_txn":{"header":{},"responses":[{"response_range":{"header":{"revision":"7"},"kvs":[{"key":"aw==","mod_revision":"5","value":"AP8="}]}}]}}]}"#,
        )
        .unwrap();
        assert_eq!(r.header.revision, 7);
        let inner = r.responses[0].response_txn.as_ref().unwrap();
        assert!(!inner.succeeded);
        let range = inner.responses[0].response_range.as_ref().unwrap();
        assert_eq!(range.kvs[0].mod_revision, 5);
        assert_eq!(&range.kvs[0].value[..], b"\x00\xff");
        let empty: RangeResp = serde_json::from_str(r#"{"header":{"revision":"3"}}"#).unwrap();
        assert!(empty.kvs.is_empty() && !empty.more);
    }
}
