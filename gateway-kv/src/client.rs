//! A Rust client of the native KV API (tests, `fskv bench kv-gateway`,
//! applications): pooled HTTP/1.1 keep-alive connections (hyper's pool),
//! bearer-token authentication, raw bytes on the wire, the batch framing of
//! `frame.rs`. Every call has a timeout (`request_timeout_ms`).

use crate::frame::{self, Op, RequestItem, Response as FrameResponse, Version};
use crate::record;
use bytes::{Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// A failed call: an HTTP status with the gateway's error code, or a transport failure.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("HTTP {status}: {code}: {message}")]
    Status { status: StatusCode, code: String, message: String },
    #[error("transport: {0}")]
    Transport(String),
    #[error("timed out after {0} ms")]
    Timeout(u64),
    #[error("bad response: {0}")]
    BadResponse(String),
}

impl ClientError {
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// A value read with its version.
#[derive(Clone, Debug)]
pub struct Value {
    pub bytes: Bytes,
    pub version: Version,
    pub index: u64,
}

/// What a write answered.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub version: Version,
    pub index: u64,
}

/// Options of one put.
#[derive(Clone, Debug, Default)]
pub struct PutOptions {
    pub if_absent: bool,
    pub if_match: Option<Version>,
    pub ttl_ms: Option<u64>,
}

#[derive(Clone)]
pub struct KvClient {
    base: String,
    token: Option<String>,
    http: Client<HttpConnector, Full<Bytes>>,
    timeout_ms: u64,
}

/// A response body's announced length is allocated up front up to this
/// (a peer's `Content-Length` alone never reserves more).
const PREALLOCATE_MAX_BYTES: u64 = 256 << 20;

fn enc(b: &[u8]) -> String {
    percent_encoding::percent_encode(b, percent_encoding::NON_ALPHANUMERIC).to_string()
}

impl KvClient {
    /// `base`: `http://host:port`; `token`: a bearer token of the key store.
    pub fn new(base: &str, token: Option<String>) -> KvClient {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).pool_max_idle_per_host(256).build(conn);
        KvClient { base: base.trim_end_matches('/').to_string(), token, http, timeout_ms: 60_000 }
    }

    pub fn with_timeout_ms(mut self, ms: u64) -> Self {
        self.timeout_ms = ms;
        self
    }

    async fn call(&self, method: Method, path_q: &str, headers: &[(&str, String)], body: Bytes) -> Result<http::Response<Bytes>> {
        let mut b = Request::builder().method(method).uri(format!("{}{}", self.base, path_q));
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        let req = b.body(Full::new(body)).map_err(|e| ClientError::Transport(e.to_string()))?;
        let fut = async {
            let resp = self.http.request(req).await.map_err(|e| ClientError::Transport(e.to_string()))?;
            let (parts, mut body) = resp.into_parts();
            // One buffer of the announced length, filled as frames arrive:
            // each received frame is freed at once (hyper reuses its read
            // buffer) instead of all of them being kept and then copied.
            let announced =
                parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
            let mut bytes = BytesMut::with_capacity(announced.unwrap_or(0).min(PREALLOCATE_MAX_BYTES) as usize);
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| ClientError::Transport(e.to_string()))?;
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            Ok(http::Response::from_parts(parts, bytes.freeze()))
        };
        let resp = tokio::time::timeout(Duration::from_millis(self.timeout_ms), fut)
            .await
            .map_err(|_| ClientError::Timeout(self.timeout_ms))??;
        if resp.status().is_success() || resp.status() == StatusCode::NOT_MODIFIED {
            return Ok(resp);
        }
        let v: serde_json::Value = serde_json::from_slice(resp.body()).unwrap_or_default();
        Err(ClientError::Status {
            status: resp.status(),
            code: v["error"]["code"].as_str().unwrap_or("").to_string(),
            message: v["error"]["message"].as_str().unwrap_or("").to_string(),
        })
    }

    fn written(resp: &http::Response<Bytes>) -> Result<Written> {
        let etag = resp.headers().get("etag").and_then(|v| v.to_str().ok()).and_then(record::parse_etag);
        let index = resp.headers().get("x-kv-index").and_then(|v| v.to_str().ok()).and_then(|s| s.parse().ok());
        match (etag, index) {
            (Some(version), Some(index)) => Ok(Written { version, index }),
            _ => Err(ClientError::BadResponse("no ETag / X-Kv-Index".into())),
        }
    }

    /// Creates a namespace (or sets its settings): `settings` is the JSON of `NamespaceConfig`.
    pub async fn put_namespace(&self, ns: &str, settings: &serde_json::Value) -> Result<()> {
        self.call(Method::PUT, &format!("/v1/ns/{}", enc(ns.as_bytes())), &[], Bytes::from(settings.to_string())).await.map(drop)
    }

    /// The namespace's settings and stats.
    pub async fn namespace(&self, ns: &str) -> Result<serde_json::Value> {
        let r = self.call(Method::GET, &format!("/v1/ns/{}", enc(ns.as_bytes())), &[], Bytes::new()).await?;
        serde_json::from_slice(r.body()).map_err(|e| ClientError::BadResponse(e.to_string()))
    }

    pub async fn put(&self, ns: &str, key: &[u8], value: impl Into<Bytes>, opts: &PutOptions) -> Result<Written> {
        let mut h = Vec::new();
        if opts.if_absent {
            h.push(("if-none-match", "*".to_string()));
        }
        if let Some(v) = opts.if_match {
            h.push(("if-match", record::etag(v)));
        }
        if let Some(t) = opts.ttl_ms {
            h.push(("x-kv-ttl-ms", t.to_string()));
        }
        let r = self.call(Method::PUT, &format!("/v1/kv/{}/{}", enc(ns.as_bytes()), enc(key)), &h, value.into()).await?;
        Self::written(&r)
    }

    /// The value, `None` when the key is missing.
    pub async fn get(&self, ns: &str, key: &[u8]) -> Result<Option<Value>> {
        self.get_with(ns, key, &[]).await
    }

    /// A GET with extra headers (`Range`, `If-None-Match`, ...).
    pub async fn get_with(&self, ns: &str, key: &[u8], headers: &[(&str, String)]) -> Result<Option<Value>> {
        match self.call(Method::GET, &format!("/v1/kv/{}/{}", enc(ns.as_bytes()), enc(key)), headers, Bytes::new()).await {
            Ok(r) => {
                let w = Self::written(&r)?;
                Ok(Some(Value { bytes: r.into_body(), version: w.version, index: w.index }))
            }
            Err(ClientError::Status { status: StatusCode::NOT_FOUND, code, .. }) if code == "NoSuchKey" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `true` if there was a key to delete.
    pub async fn delete(&self, ns: &str, key: &[u8], if_match: Option<Version>) -> Result<bool> {
        let h: Vec<(&str, String)> = if_match.map(|v| ("if-match", record::etag(v))).into_iter().collect();
        match self.call(Method::DELETE, &format!("/v1/kv/{}/{}", enc(ns.as_bytes()), enc(key)), &h, Bytes::new()).await {
            Ok(_) => Ok(true),
            Err(ClientError::Status { status: StatusCode::NOT_FOUND, code, .. }) if code == "NoSuchKey" => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One framed batch (`items` per `op`).
    pub async fn batch(&self, ns: &str, op: Op, flags: u16, lease_ms: u32, items: &[RequestItem<'_>]) -> Result<FrameResponse> {
        let name = match op {
            Op::Get => "get",
            Op::Put => "put",
            Op::Delete => "delete",
            Op::Exists => "exists",
            Op::Scan => return Err(ClientError::BadResponse("scan is not a batch".into())),
        };
        let body = Bytes::from(frame::encode_request(op, flags, lease_ms, items));
        let r = self.call(Method::POST, &format!("/v1/kv/{}?batch={name}", enc(ns.as_bytes())), &[], body).await?;
        frame::decode_response(r.body()).map_err(|e| ClientError::BadResponse(e.0))
    }

    pub async fn batch_get(&self, ns: &str, keys: &[&[u8]]) -> Result<FrameResponse> {
        let items: Vec<RequestItem> = keys.iter().map(|k| RequestItem { key: k, ..Default::default() }).collect();
        self.batch(ns, Op::Get, 0, 0, &items).await
    }

    /// Exists: per-key statuses and the prefix count; `lease_ms` pins the leading existing keys.
    pub async fn batch_exists(&self, ns: &str, keys: &[&[u8]], prefix_mode: bool, lease_ms: u32) -> Result<FrameResponse> {
        let items: Vec<RequestItem> = keys.iter().map(|k| RequestItem { key: k, ..Default::default() }).collect();
        self.batch(ns, Op::Exists, if prefix_mode { frame::FLAG_PREFIX } else { 0 }, lease_ms, &items).await
    }

    /// A scan page: `query` is the query string (`prefix=..&limit=..`), percent-encoded by the caller.
    pub async fn scan(&self, ns: &str, query: &str) -> Result<FrameResponse> {
        let r = self.call(Method::GET, &format!("/v1/kv/{}?{query}", enc(ns.as_bytes())), &[], Bytes::new()).await?;
        frame::decode_response(r.body()).map_err(|e| ClientError::BadResponse(e.0))
    }

    /// Any request (tests of the error table): status, headers, body.
    pub async fn raw(&self, method: Method, path_q: &str, headers: &[(&str, String)], body: Bytes) -> Result<http::Response<Bytes>> {
        match self.call(method, path_q, headers, body).await {
            Ok(r) => Ok(r),
            Err(ClientError::Status { status, code, message }) => {
                let mut r = http::Response::new(Bytes::from(serde_json::json!({"error": {"code": code, "message": message}}).to_string()));
                *r.status_mut() = status;
                Ok(r)
            }
            Err(e) => Err(e),
        }
    }
}

/// Percent-encodes bytes for a path segment or a query value.
pub fn encode_component(b: &[u8]) -> String {
    enc(b)
}
