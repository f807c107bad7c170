//! The Consul-KV-compatible subset, on its own port, over one namespace per
//! tenant: a Consul key (UTF-8) is the KV key with the same bytes, so
//! `GET /v1/kv/consul/<key>` on the native API reads what a Consul client
//! of tenant `default` put, and the value is the same file (readable
//! through FUSE as `ROOT/consul/<encoded name>`).
//!
//! Tenants ([`consul_namespace_for`]): the token's user's tenant picks the
//! namespace, owned by that tenant like any other (made by its first
//! Consul PUT, owned from the transaction that makes it; before it, reads
//! answer 404 and deletes `true`):
//!
//! | token of a user of | namespace (`C` = `consul_namespace`, default `consul`) |
//! |---|---|
//! | tenant `default` (uid 0) | `C` (as before tenants) |
//! | any other tenant, uid `U` | `C.U` (e.g. `consul.20001`: uids are unique and short; tenant names may be 64 bytes, too long for a namespace name) |
//! | a tenant the gateway does not know | 403 |
//!
//! A tenant's token reads, writes, lists and watches only its namespace:
//! another tenant's keys are not addressable from the Consul port. Names
//! `C.<anything>` are reserved: the native `PUT /v1/ns/C.U` is refused (403)
//! to every tenant but the one of uid `U`, so nobody can take another
//! tenant's Consul namespace first.
//!
//! | Consul | here |
//! |---|---|
//! | `GET /v1/kv/<key>` | `[{"Key", "Value" (base64, null when empty), "Flags", "CreateIndex", "ModifyIndex", "LockIndex": 0}]`, 404 when missing; `X-Consul-Index` always |
//! | `?recurse` | every key with the prefix `<key>`, in key order (404 when none) |
//! | `?keys[&separator=S]` | key names with the prefix, each cut after the first `S` past the prefix, without duplicates |
//! | `?raw` | the value's bytes |
//! | `?index=I&wait=T` (`T`: `10s`, `500ms`, `5m`; default 5 min, at most `max_watch_wait_ms`) | blocking query: answers once the index is not `I` (see `ops/watch.rs` for the index of a key and of a prefix) or after `T` |
//! | `PUT /v1/kv/<key>[?flags=F][&cas=I]` | `true` / `false`; `cas=0`: only if absent; `cas=I`: only if the key's `ModifyIndex` is `I` (checked against the version in the publishing transaction) |
//! | `DELETE /v1/kv/<key>[?recurse][&cas=I]` | `true` / `false` |
//! | `GET /v1/status/leader`, `/v1/status/peers` | this gateway's address (clients probe them) |
//! | `ModifyIndex` | the file's modify index (ns, `X-Kv-Index` of the native API) |
//! | `CreateIndex` | the modify index of the put that created the key (kept in the key's record over Consul overwrites) |
//! | token | `X-Consul-Token`, `Authorization: Bearer`, or `?token=`: a bearer token of the key store (401 without, 403 wrong) |
//! | not supported | sessions / locks (`acquire`, `release`: 400), transactions, `dc` other than the default, `ns` |

use crate::body::{KvBody, ValueWriter};
use crate::error::{KvError, Result};
use crate::ops::scan::ScanItem;
use crate::ops::Kv;
use crate::record::{self, Record};
use crate::route::{self, ConsulOp, Query};
use crate::store::{self, Namespace};
use base64::Engine;
use bytes::Bytes;
use fskv_gateway::{GatewayError, Protocol, RequestBody, RequestContext, Route};
use fskv_proto::meta::Expected;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Request, Response, StatusCode};

pub const H_CONSUL_INDEX: HeaderName = HeaderName::from_static("x-consul-index");
/// Consul's default blocking-query wait.
pub const DEFAULT_WAIT_MS: u64 = 300_000;

/// The Consul API on the shared layer.
pub struct ConsulHttp {
    pub kv: Kv,
}

impl Protocol for ConsulHttp {
    type Body = KvBody;

    fn name(&self) -> &'static str {
        "consul"
    }

    fn classify(&self, parts: &Parts) -> Route {
        route::classify_consul(parts)
    }

    async fn handle(&self, req: Request<RequestBody>, cx: RequestContext) -> Response<KvBody> {
        let (parts, body) = req.into_parts();
        match self.serve(&parts, body).await {
            Ok(r) => r,
            Err(e) => error_response(&e, &cx.request_id),
        }
    }

    fn error_response(&self, err: &GatewayError, _cx: &RequestContext) -> Response<Bytes> {
        let r = err.reply();
        plain(r.status, r.message.to_string())
    }
}

/// Consul answers errors as plain text.
fn plain(status: StatusCode, text: String) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from(text));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn error_response(e: &KvError, request_id: &str) -> Response<KvBody> {
    let reply = e.reply();
    if reply.status.is_server_error() {
        tracing::warn!(request_id, error = %e, "Consul request failed");
    }
    let mut r = plain(reply.status, reply.message.to_string()).map(KvBody::full);
    if let KvError::NoSuchKeyAt { index } = e {
        r.headers_mut().insert(H_CONSUL_INDEX, HeaderValue::from(*index));
    }
    r
}

/// `10s`, `1.5m`, `500ms`, `2h`, or bare seconds.
pub fn parse_wait(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (s, 1000.0)
    };
    let v: f64 = num.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some((v * mult) as u64)
}

/// The namespace the Consul API of tenant uid `uid` works in (see the
/// module doc): `base` for uid 0 (tenant `default`), `base.<uid>` otherwise.
pub fn consul_namespace_for(base: &str, uid: u32) -> String {
    if uid == 0 {
        base.to_string()
    } else {
        format!("{base}.{uid}")
    }
}

/// Whether the native API may create or change namespace `name` for the
/// tenant of uid `uid`: names `base.<x>` are the Consul namespaces, each
/// reserved to its tenant.
pub fn native_may_use(base: &str, name: &str, uid: u32) -> bool {
    match name.strip_prefix(base).and_then(|r| r.strip_prefix('.')) {
        Some(_) => name == consul_namespace_for(base, uid),
        None => true,
    }
}

/// The token a Consul client sent.
fn token<'a>(parts: &'a Parts, q: &'a Query) -> Option<&'a str> {
    if let Some(t) = crate::ops::header(parts, "x-consul-token") {
        return Some(t.trim());
    }
    if let Some(t) = crate::ops::header(parts, "authorization").and_then(|a| a.strip_prefix("Bearer ")) {
        return Some(t.trim());
    }
    q.str("token")
}

/// Keys of a `?keys` listing: cut after the first `sep` past `prefix`, deduplicated.
pub fn fold_keys<'a>(prefix: &str, sep: Option<&str>, keys: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for k in keys {
        let cut = match sep.filter(|s| !s.is_empty()) {
            Some(s) => match k[prefix.len().min(k.len())..].find(s) {
                Some(at) => &k[..prefix.len() + at + s.len()],
                None => k,
            },
            None => k,
        };
        if out.last().map(String::as_str) != Some(cut) {
            out.push(cut.to_string());
        }
    }
    out
}

fn entry_json(key: &str, value: Option<&Bytes>, rec: &Record, index: u64) -> serde_json::Value {
    let v = value.filter(|b| !b.is_empty()).map(|b| base64::engine::general_purpose::STANDARD.encode(b));
    serde_json::json!({
        "Key": key,
        "Value": v,
        "Flags": rec.flags,
        "CreateIndex": rec.create_index.unwrap_or(index),
        "ModifyIndex": index,
        "LockIndex": 0,
    })
}

fn with_index(status: StatusCode, index: u64, content_type: &str, body: impl Into<Bytes>) -> Response<KvBody> {
    let mut r = Response::new(KvBody::full(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(H_CONSUL_INDEX, HeaderValue::from(index.max(1)));
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

impl ConsulHttp {
    async fn serve(&self, parts: &Parts, body: RequestBody) -> Result<Response<KvBody>> {
        let q = Query::parse(parts.uri.query());
        let op = route::parse_consul(&parts.method, parts.uri.path())?;
        if let ConsulOp::Status = op {
            let addr = format!("\"{}\"", self.kv.cfg.listen);
            let body = if parts.uri.path().ends_with("peers") { format!("[{addr}]") } else { addr };
            return Ok(with_index(StatusCode::OK, 1, "application/json", body));
        }
        let key = match token(parts, &q) {
            None => return Err(KvError::Gateway(GatewayError::Auth(fskv_gateway::AuthError::Missing))),
            Some(t) => match self.kv.cfg.keys.by_bearer_token(t) {
                Some(k) => k,
                None => return Err(KvError::Gateway(GatewayError::Auth(fskv_gateway::AuthError::BadBearerToken))),
            },
        };
        let ids = self
            .kv
            .cfg
            .keys
            .tenant(&key.tenant)
            .ok_or_else(|| KvError::AccessDenied("the token's tenant is not known to this gateway".into()))?;
        if q.has("acquire") || q.has("release") {
            return Err(KvError::InvalidArgument("sessions and locks (acquire/release) are not supported".into()));
        }
        let ns = match self.tenant_namespace(ids, matches!(op, ConsulOp::Put { .. })).await {
            Ok(ns) => ns,
            // Nothing put yet: nothing to delete (Consul answers `true`).
            Err(KvError::NoSuchKey) if matches!(op, ConsulOp::Delete { .. }) => return Ok(bool_response(true)),
            Err(e) => return Err(e),
        };
        match op {
            ConsulOp::Get { key } => self.get(&ns, &key, &q).await,
            ConsulOp::Put { key } => self.put(&ns, &key, &q, body).await,
            ConsulOp::Delete { key } => self.delete(&ns, &key, &q).await,
            ConsulOp::Status => Err(KvError::Internal("unreachable".into())),
        }
    }

    /// The Consul namespace of the tenant `ids`, made (owned by it) by its
    /// first PUT (reads and deletes before that answer as for a missing key,
    /// and create nothing: a reader process writes nothing); one owned by
    /// anybody else is refused (403).
    async fn tenant_namespace(&self, ids: fskv_gateway::TenantIds, create: bool) -> Result<std::sync::Arc<Namespace>> {
        let name = consul_namespace_for(&self.kv.cfg.consul_namespace, ids.uid);
        let ns = match self.kv.store.namespace(&name).await {
            Ok(ns) => ns,
            Err(KvError::NoSuchNamespace(_)) if !create => return Err(KvError::NoSuchKey),
            Err(KvError::NoSuchNamespace(_)) => {
                let (ns, created) = self.kv.store.put_namespace(&name, &Default::default(), ids).await?;
                if let Some(m) = &self.kv.maint {
                    m.namespace_changed(&ns, created);
                }
                ns
            }
            Err(e) => return Err(e),
        };
        if ns.owner_uid != ids.uid {
            return Err(KvError::AccessDenied(format!("namespace {name:?} belongs to another tenant")));
        }
        Ok(ns)
    }

    async fn get(&self, ns: &Namespace, key: &str, q: &Query) -> Result<Response<KvBody>> {
        let kv = &self.kv;
        let index = q.u64("index")?;
        let wait = match q.str("wait") {
            Some(w) => parse_wait(w).ok_or_else(|| KvError::InvalidArgument(format!("wait={w:?}: a duration like 10s or 500ms")))?,
            None => DEFAULT_WAIT_MS,
        }
        .min(kv.cfg.limits.max_watch_wait_ms);
        let wait = if index.is_some() { wait } else { 0 };
        if q.has("recurse") || q.has("keys") {
            let values = !q.has("keys");
            let (now_index, items) = kv.wait_change(index, wait, || kv.prefix_state(ns, key.as_bytes(), values)).await?;
            let mut items: Vec<ScanItem> = items.into_iter().filter(|i| std::str::from_utf8(&i.key).is_ok()).collect();
            // Values above the scan's inline limit (up to Consul's 512 KiB): read one by one.
            let max = kv.cfg.limits.max_consul_value_bytes;
            for i in items.iter_mut().filter(|i| values && i.status == crate::frame::Status::TooLarge) {
                if let Ok(inode) = kv.store.fs.meta().stat(i.inode).await {
                    if let Ok(b) = kv.store.read_whole(inode, max).await {
                        i.value = Some(b);
                        i.status = crate::frame::Status::Ok;
                    }
                }
            }
            if items.is_empty() {
                return Err(KvError::NoSuchKeyAt { index: now_index.max(1) });
            }
            let json = if q.has("keys") {
                let names = fold_keys(key, q.str("separator"), items.iter().filter_map(|i| std::str::from_utf8(&i.key).ok()));
                serde_json::json!(names)
            } else {
                let mut out = Vec::with_capacity(items.len());
                for i in &items {
                    let k = std::str::from_utf8(&i.key).unwrap_or_default();
                    out.push(entry_json(k, i.value.as_ref(), &i.record, i.index));
                }
                serde_json::Value::Array(out)
            };
            return Ok(with_index(StatusCode::OK, now_index, "application/json", json.to_string()));
        }
        if key.is_empty() {
            return Err(KvError::InvalidArgument("Missing key name".into()));
        }
        let (now_index, found) = kv.wait_change(index, wait, || kv.key_state(ns, key.as_bytes())).await?;
        let Some((inode, rec)) = found else {
            kv.miss(&ns.name);
            return Err(KvError::NoSuchKeyAt { index: now_index.max(1) });
        };
        kv.hit(&ns.name, key.as_bytes(), inode.id.0);
        let max = kv.cfg.limits.max_consul_value_bytes.max(kv.cfg.limits.whole_value_max_bytes);
        let mod_index = inode.mtime_ns;
        let value = kv.store.read_whole(inode, max).await?;
        if q.has("raw") {
            return Ok(with_index(StatusCode::OK, mod_index, "application/octet-stream", value));
        }
        let json = serde_json::json!([entry_json(key, Some(&value), &rec, mod_index)]);
        Ok(with_index(StatusCode::OK, mod_index, "application/json", json.to_string()))
    }

    async fn put(&self, ns: &Namespace, key: &str, q: &Query, mut body: RequestBody) -> Result<Response<KvBody>> {
        let kv = &self.kv;
        if key.is_empty() {
            return Err(KvError::InvalidArgument("Missing key name".into()));
        }
        let path = kv.key_path(key.as_bytes())?;
        let flags = q.u64("flags")?.unwrap_or(0);
        let cas = q.u64("cas")?;
        let current = kv.find(ns, key.as_bytes()).await?;
        let expected = match (cas, &current) {
            (Some(0), Some(_)) => return Ok(bool_response(false)),
            (Some(0), None) => Some(Expected::Absent),
            (Some(_), None) => return Ok(bool_response(false)),
            (Some(i), Some((inode, _))) if inode.mtime_ns != i => return Ok(bool_response(false)),
            (Some(_), Some((inode, _))) => Some(Expected::Inode { id: inode.id, version: inode.version }),
            (None, _) => None,
        };
        let index = kv.clock.next();
        let create_index = current.as_ref().map(|(inode, rec)| rec.create_index.unwrap_or(inode.mtime_ns));
        let rec = Record { expires_ns: None, flags, create_index };
        let max = kv.cfg.limits.max_consul_value_bytes;
        let _writing = kv.maint.as_ref().map(|m| m.write_guard(&ns.name, key.as_bytes()));
        if let Some(m) = &kv.maint {
            m.admit(ns, key.as_bytes(), 0).await?;
        }
        let mut w = ValueWriter::new(kv.store.owned_by(ns), ns.dir, store::value_mode(&rec), max, kv.cfg.limits.max_inflight_write_bytes);
        while let Some(piece) = crate::ops::next_data(&mut body).await {
            w.push(piece?).await?;
        }
        let size = w.size;
        let data = w.finish().await?;
        match kv.store.publish(ns, &path, &data, &rec, expected, index).await {
            Ok(inode) => {
                if let Some(m) = &kv.maint {
                    m.on_put(&ns.name, key.as_bytes(), size, record::version_of(&inode), None);
                }
                kv.notify_change();
                Ok(bool_response(true))
            }
            Err(KvError::PreconditionFailed(_)) if cas.is_some() => Ok(bool_response(false)),
            Err(e) => Err(e),
        }
    }

    async fn delete(&self, ns: &Namespace, key: &str, q: &Query) -> Result<Response<KvBody>> {
        let kv = &self.kv;
        if q.has("recurse") {
            kv.delete_prefix_keys(ns, key.as_bytes()).await?;
            return Ok(bool_response(true));
        }
        if key.is_empty() {
            return Err(KvError::InvalidArgument("Missing key name".into()));
        }
        let path = kv.key_path(key.as_bytes())?;
        let expected = match q.u64("cas")? {
            None => None,
            Some(i) => match kv.find(ns, key.as_bytes()).await? {
                Some((inode, _)) if inode.mtime_ns == i => Some(Expected::Inode { id: inode.id, version: inode.version }),
                _ => return Ok(bool_response(false)),
            },
        };
        let _writing = kv.maint.as_ref().map(|m| m.write_guard(&ns.name, key.as_bytes()));
        match kv.store.unlink(ns, &path, expected).await {
            Ok(removed) => {
                if removed {
                    if let Some(m) = &kv.maint {
                        m.on_delete(&ns.name, key.as_bytes());
                    }
                    kv.notify_change();
                }
                Ok(bool_response(true))
            }
            Err(KvError::PreconditionFailed(_)) => Ok(bool_response(false)),
            Err(e) => Err(e),
        }
    }
}

fn bool_response(ok: bool) -> Response<KvBody> {
    let mut r = Response::new(KvBody::full(if ok { "true" } else { "false" }));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_has_its_consul_namespace() {
        assert_eq!(consul_namespace_for("consul", 0), "consul");
        assert_eq!(consul_namespace_for("consul", 20001), "consul.20001");
        assert!(crate::keys::is_namespace_name(&consul_namespace_for("consul", u32::MAX)));
        // Reserved names: only their tenant may take them natively.
        assert!(native_may_use("consul", "consul.20001", 20001));
        assert!(!native_may_use("consul", "consul.20001", 20002));
        assert!(!native_may_use("consul", "consul.20001", 0));
        assert!(!native_may_use("consul", "consul.x", 20001));
        assert!(native_may_use("consul", "consul", 0));
        assert!(native_may_use("consul", "consulx", 20001));
        assert!(native_may_use("consul", "other", 20001));
    }

    #[test]
    fn waits() {
        assert_eq!(parse_wait("10s"), Some(10_000));
        assert_eq!(parse_wait("500ms"), Some(500));
        assert_eq!(parse_wait("1.5m"), Some(90_000));
        assert_eq!(parse_wait("2"), Some(2000));
        assert_eq!(parse_wait("x"), None);
        assert_eq!(parse_wait("-1s"), None);
    }

    #[test]
    fn keys_fold_at_the_separator() {
        let keys = ["a/b", "a/c/d", "a/c/e", "a/f/", "b"];
        assert_eq!(fold_keys("a/", Some("/"), keys[..4].iter().copied()), vec!["a/b", "a/c/", "a/f/"]);
        assert_eq!(fold_keys("", Some("/"), keys.iter().copied()), vec!["a/", "b"]);
        assert_eq!(fold_keys("", None, keys.iter().copied()).len(), 5);
    }

    #[test]
    fn entries_have_the_consul_shape() {
        let rec = Record { flags: 7, ..Default::default() };
        let v = entry_json("k", Some(&Bytes::from_static(b"hi")), &rec, 42);
        assert_eq!(v["Value"], "aGk=");
        assert_eq!((v["Flags"].as_u64(), v["CreateIndex"].as_u64(), v["ModifyIndex"].as_u64()), (Some(7), Some(42), Some(42)));
        assert!(entry_json("k", Some(&Bytes::new()), &rec, 1)["Value"].is_null());
    }
}
