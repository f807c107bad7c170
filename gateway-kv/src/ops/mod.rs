//! The operations, one file per group: `single` (get, head, put, delete of
//! one key), `batch` (framed get/put/delete/exists), `scan` (range and
//! prefix scans, delete by prefix), `watch` (long polls), `namespace`
//! (create, settings, stats, delete). [`Kv`] is the state they share.

pub mod batch;
pub mod namespace;
pub mod scan;
pub mod single;
pub mod watch;

use crate::body::KvBody;
use crate::config::KvConfig;
use crate::error::{KvError, Result};
use crate::keys::KeyPath;
use crate::maintain::Maintainer;
use crate::recency::Accesses;
use crate::record::{self, IndexClock};
use crate::store::Store;
use bytes::Bytes;
use fskv_gateway::{GatewayError, RequestBody};
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body::Body;
use parking_lot::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

pub const H_INDEX: HeaderName = HeaderName::from_static("x-kv-index");
pub const H_EXPIRES: HeaderName = HeaderName::from_static("x-kv-expires-at-ms");
pub const H_TTL: HeaderName = HeaderName::from_static("x-kv-ttl-ms");
pub const H_PREFIX_COUNT: HeaderName = HeaderName::from_static("x-kv-prefix-count");
pub const H_MORE: HeaderName = HeaderName::from_static("x-kv-more");
pub const FRAME_CONTENT_TYPE: &str = "application/x-fskv-batch";

/// What every operation shares.
pub struct KvState {
    pub store: Store,
    pub cfg: Arc<KvConfig>,
    /// Modify indexes this process hands out.
    pub clock: IndexClock,
    /// Accesses served since the last access-log flush.
    pub accesses: Mutex<Accesses>,
    /// Random per process: names its access logs.
    pub process_id: u64,
    pub log_seq: AtomicU64,
    /// The writer's index, eviction and expiry (`None` on readers).
    pub maint: Option<Arc<Maintainer>>,
    /// Woken by every change made through this process (watches).
    pub changed: tokio::sync::Notify,
}

#[derive(Clone)]
pub struct Kv(pub Arc<KvState>);

impl std::ops::Deref for Kv {
    type Target = KvState;
    fn deref(&self) -> &KvState {
        &self.0
    }
}

impl Kv {
    /// The path of a key, after the key checks (non-empty, `max_key_bytes`).
    pub fn key_path(&self, key: &[u8]) -> Result<KeyPath> {
        if key.is_empty() {
            return Err(KvError::InvalidKey("the key is empty".into()));
        }
        let max = self.cfg.limits.max_key_bytes;
        if key.len() > max {
            return Err(KvError::KeyTooLong { len: key.len(), max });
        }
        Ok(KeyPath::of(key))
    }

    pub fn hit(&self, ns: &str, key: &[u8], inode: u64) {
        self.accesses.lock().hit(ns, key, inode, record::now_ns());
    }

    pub fn miss(&self, ns: &str) {
        self.accesses.lock().miss(ns);
    }

    /// Something changed: wake the watches of this process.
    pub fn notify_change(&self) {
        self.changed.notify_waiters();
    }
}

/// The next data piece of a request body (`None` at its end).
pub async fn next_data(body: &mut RequestBody) -> Option<Result<Bytes>> {
    loop {
        let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx)).await?;
        match frame {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    return Some(Ok(d));
                }
            }
            Err(e) => {
                let err = match GatewayError::from_body_error(e.as_ref()) {
                    Some(GatewayError::BodyTooLarge { len, max }) => KvError::ValueTooLarge { len: *len, max: *max },
                    Some(GatewayError::BodyStalled { timeout_ms }) => {
                        KvError::Gateway(GatewayError::BodyStalled { timeout_ms: *timeout_ms })
                    }
                    _ => KvError::Gateway(GatewayError::BodyRead(e.to_string())),
                };
                return Some(Err(err));
            }
        }
    }
}

/// A whole (control-sized) request body.
pub async fn collect(mut body: RequestBody) -> Result<Bytes> {
    let mut parts: Vec<Bytes> = Vec::new();
    while let Some(d) = next_data(&mut body).await {
        parts.push(d?);
    }
    Ok(match parts.len() {
        0 => Bytes::new(),
        1 => parts.pop().unwrap_or_default(),
        _ => Bytes::from(parts.concat()),
    })
}

/// A response with `status`, `body` and `headers`.
pub fn respond(status: StatusCode, headers: Vec<(HeaderName, String)>, body: KvBody) -> Response<KvBody> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    for (k, v) in headers {
        if let Ok(v) = HeaderValue::from_str(&v) {
            r.headers_mut().append(k, v);
        }
    }
    r
}

/// A JSON response.
pub fn json(status: StatusCode, v: &serde_json::Value) -> Response<KvBody> {
    respond(status, vec![(http::header::CONTENT_TYPE, "application/json".into())], KvBody::full(v.to_string()))
}

/// A header's value as text (`None` when absent or not visible ASCII).
pub fn header<'a>(parts: &'a http::request::Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}
