//! Which KV operation a request head is: parsed once here (method, path,
//! query), for the handlers, for the shared layer's reader guard and body
//! limits, for the `route` label of metrics, and for the front's
//! reader/writer routing ([`classify`], [`classify_consul`]). No I/O.
//!
//! **Native API** (port `--listen`):
//!
//! | method | path | query | operation | access | body |
//! |---|---|---|---|---|---|
//! | GET | `/health` | | `Health` (no credentials) | read | none |
//! | GET | `/v1/ns` | | `ListNamespaces` | read | none |
//! | GET | `/v1/ns/{ns}` | | `GetNamespace` (settings + stats) | read | none |
//! | PUT | `/v1/ns/{ns}` | | `PutNamespace` (create / set settings; JSON body, may be empty) | mutation | control |
//! | DELETE | `/v1/ns/{ns}` | | `DeleteNamespace` (and every key in it) | mutation | none |
//! | GET | `/v1/kv/{ns}/{key}` | | `Get` (`Range`, `If-None-Match`, `If-Match`) | read | none |
//! | GET | `/v1/kv/{ns}/{key}` | `watch` | `Watch` (long poll: `index`, `wait_ms`) | read | none |
//! | HEAD | `/v1/kv/{ns}/{key}` | | `Head` | read | none |
//! | PUT | `/v1/kv/{ns}/{key}` | `ttl_ms` | `Put` (`If-Match`, `If-None-Match: *`, `X-Kv-Ttl-Ms`) | mutation | data |
//! | DELETE | `/v1/kv/{ns}/{key}` | | `Delete` (`If-Match`) | mutation | none |
//! | GET | `/v1/kv/{ns}` | `prefix`, `start`, `start_after`, `end`, `limit`, `values` | `Scan` | read | none |
//! | GET | `/v1/kv/{ns}` | `watch`, `prefix`, `index`, `wait_ms` | `WatchPrefix` | read | none |
//! | DELETE | `/v1/kv/{ns}` | `prefix` (required; empty = every key) | `DeletePrefix` | mutation | none |
//! | POST | `/v1/kv/{ns}` | `batch=get` / `batch=exists` | `BatchGet` / `BatchExists` | read (a lease is not a change of data) | control |
//! | POST | `/v1/kv/{ns}` | `batch=delete` | `BatchDelete` | mutation | control |
//! | POST | `/v1/kv/{ns}` | `batch=put` | `BatchPut` | mutation | data |
//! | anything else | | | `Unknown` (404 / 405) | GET/HEAD read, else mutation | none |
//!
//! The key is the rest of the path after `{ns}/`, percent-decoded (so any
//! bytes; a raw `/` is part of the key). Keys in queries are percent-encoded.
//! Every native route but `Health` is `AuthPolicy::Required` (SigV4 with
//! service `kv`, or a bearer token).
//!
//! **Consul API** (port `--consul-listen`; keys in the Consul namespace):
//!
//! | method | path | operation | access | body |
//! |---|---|---|---|---|
//! | GET | `/v1/kv/{key}` (`recurse`, `keys`, `separator`, `raw`, `index`, `wait`) | `ConsulGet` | read | none |
//! | PUT | `/v1/kv/{key}` (`flags`, `cas`) | `ConsulPut` | mutation | data |
//! | DELETE | `/v1/kv/{key}` (`recurse`, `cas`) | `ConsulDelete` | mutation | none |
//! | GET | `/v1/status/leader`, `/v1/status/peers` | `ConsulStatus` | read | none |
//! | anything else | | `ConsulUnknown` | GET/HEAD read, else mutation | none |
//!
//! Consul routes are `AuthPolicy::Open` for the shared layer: Consul clients
//! send their token as `X-Consul-Token` (or `Authorization: Bearer`, or
//! `?token=`), which the Consul handler checks against the key store's
//! bearer tokens before it reads a body.

use crate::error::KvError;
use crate::frame::Op;
use fskv_gateway::{Access, AuthPolicy, BodyClass, Route};
use http::request::Parts;
use http::Method;

/// A native request, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeOp {
    Health,
    ListNamespaces,
    GetNamespace { ns: String },
    PutNamespace { ns: String },
    DeleteNamespace { ns: String },
    Get { ns: String, key: Vec<u8> },
    Head { ns: String, key: Vec<u8> },
    Put { ns: String, key: Vec<u8> },
    Delete { ns: String, key: Vec<u8> },
    Watch { ns: String, key: Vec<u8> },
    Scan { ns: String },
    WatchPrefix { ns: String },
    DeletePrefix { ns: String },
    Batch { ns: String, op: Op },
}

impl NativeOp {
    pub fn name(&self) -> &'static str {
        match self {
            NativeOp::Health => "Health",
            NativeOp::ListNamespaces => "ListNamespaces",
            NativeOp::GetNamespace { .. } => "GetNamespace",
            NativeOp::PutNamespace { .. } => "PutNamespace",
            NativeOp::DeleteNamespace { .. } => "DeleteNamespace",
            NativeOp::Get { .. } => "Get",
            NativeOp::Head { .. } => "Head",
            NativeOp::Put { .. } => "Put",
            NativeOp::Delete { .. } => "Delete",
            NativeOp::Watch { .. } => "Watch",
            NativeOp::Scan { .. } => "Scan",
            NativeOp::WatchPrefix { .. } => "WatchPrefix",
            NativeOp::DeletePrefix { .. } => "DeletePrefix",
            NativeOp::Batch { op: Op::Get, .. } => "BatchGet",
            NativeOp::Batch { op: Op::Put, .. } => "BatchPut",
            NativeOp::Batch { op: Op::Delete, .. } => "BatchDelete",
            NativeOp::Batch { op: Op::Exists, .. } => "BatchExists",
            NativeOp::Batch { op: Op::Scan, .. } => "Scan",
        }
    }

    fn access_body(&self) -> (Access, BodyClass) {
        use Access::{Mutation, Read};
        use BodyClass::{Bodiless, Control, Data};
        match self {
            NativeOp::PutNamespace { .. } => (Mutation, Control),
            NativeOp::DeleteNamespace { .. } | NativeOp::Delete { .. } | NativeOp::DeletePrefix { .. } => (Mutation, Bodiless),
            NativeOp::Put { .. } | NativeOp::Batch { op: Op::Put, .. } => (Mutation, Data),
            NativeOp::Batch { op: Op::Delete, .. } => (Mutation, Control),
            NativeOp::Batch { .. } => (Read, Control),
            _ => (Read, Bodiless),
        }
    }
}

/// Query parameters, percent-decoded (`+` is a plus, not a space).
#[derive(Clone, Debug, Default)]
pub struct Query(Vec<(String, Vec<u8>)>);

impl Query {
    pub fn parse(q: Option<&str>) -> Query {
        let mut out = Vec::new();
        for p in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let k = percent_encoding::percent_decode_str(k).decode_utf8_lossy().into_owned();
            out.push((k, percent_encoding::percent_decode_str(v).collect()));
        }
        Query(out)
    }

    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }

    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.bytes(name).and_then(|b| std::str::from_utf8(b).ok())
    }

    /// A non-negative integer parameter; a malformed one is a 400.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, KvError> {
        match self.bytes(name) {
            None => Ok(None),
            Some(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(Some)
                .ok_or_else(|| KvError::InvalidArgument(format!("query parameter {name} must be a non-negative integer"))),
        }
    }

    /// A boolean flag: present without a value, or `1`/`true`.
    pub fn flag(&self, name: &str) -> bool {
        matches!(self.bytes(name), Some(b"" | b"1" | b"true"))
    }
}

fn decode_key(raw: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(raw).collect()
}

/// Parses a native request head.
pub fn parse_native(method: &Method, path: &str, query: &Query) -> Result<NativeOp, KvError> {
    let not_found = || KvError::MethodNotAllowed(format!("{method} {path} is not an operation of the KV API (see docs/kv.md)"));
    if path == "/health" {
        return if method == Method::GET || method == Method::HEAD { Ok(NativeOp::Health) } else { Err(not_found()) };
    }
    if path == "/v1/ns" || path == "/v1/ns/" {
        return if method == Method::GET { Ok(NativeOp::ListNamespaces) } else { Err(not_found()) };
    }
    if let Some(rest) = path.strip_prefix("/v1/ns/") {
        let ns = percent_encoding::percent_decode_str(rest.trim_end_matches('/')).decode_utf8_lossy().into_owned();
        return match *method {
            Method::GET | Method::HEAD => Ok(NativeOp::GetNamespace { ns }),
            Method::PUT => Ok(NativeOp::PutNamespace { ns }),
            Method::DELETE => Ok(NativeOp::DeleteNamespace { ns }),
            _ => Err(not_found()),
        };
    }
    let Some(rest) = path.strip_prefix("/v1/kv/") else { return Err(not_found()) };
    let (ns_raw, key_raw) = match rest.split_once('/') {
        Some((n, k)) => (n, Some(k)),
        None => (rest, None),
    };
    let ns = percent_encoding::percent_decode_str(ns_raw).decode_utf8_lossy().into_owned();
    match key_raw {
        Some(k) => {
            let key = decode_key(k);
            match *method {
                Method::GET if query.has("watch") => Ok(NativeOp::Watch { ns, key }),
                Method::GET => Ok(NativeOp::Get { ns, key }),
                Method::HEAD => Ok(NativeOp::Head { ns, key }),
                Method::PUT => Ok(NativeOp::Put { ns, key }),
                Method::DELETE => Ok(NativeOp::Delete { ns, key }),
                _ => Err(not_found()),
            }
        }
        None => match *method {
            Method::GET if query.has("watch") => Ok(NativeOp::WatchPrefix { ns }),
            Method::GET => Ok(NativeOp::Scan { ns }),
            Method::DELETE => Ok(NativeOp::DeletePrefix { ns }),
            Method::POST => match query.str("batch").and_then(Op::parse_name) {
                Some(op) => Ok(NativeOp::Batch { ns, op }),
                None => Err(KvError::InvalidArgument("POST /v1/kv/{ns} needs ?batch=get|put|delete|exists".into())),
            },
            _ => Err(not_found()),
        },
    }
}

fn fallback(method: &Method, name: &'static str) -> (Access, BodyClass, &'static str) {
    if method == Method::GET || method == Method::HEAD {
        (Access::Read, BodyClass::Bodiless, name)
    } else {
        (Access::Mutation, BodyClass::Bodiless, name)
    }
}

/// The route of a native KV request (pure; the front routes with it too).
/// A batch get or exists over POST is a read.
pub fn classify(parts: &Parts) -> Route {
    let query = Query::parse(parts.uri.query());
    let (access, body, name) = match parse_native(&parts.method, parts.uri.path(), &query) {
        Ok(op) => {
            let (a, b) = op.access_body();
            (a, b, op.name())
        }
        Err(_) => fallback(&parts.method, "Unknown"),
    };
    let auth = if name == "Health" { AuthPolicy::Open } else { AuthPolicy::Required };
    Route { name, access, body, auth }
}

/// A Consul API request, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsulOp {
    Get { key: String },
    Put { key: String },
    Delete { key: String },
    Status,
}

pub fn parse_consul(method: &Method, path: &str) -> Result<ConsulOp, KvError> {
    if let Some(k) = path.strip_prefix("/v1/kv/").or_else(|| (path == "/v1/kv").then_some("")) {
        let key = percent_encoding::percent_decode_str(k).decode_utf8().map_err(|_| KvError::InvalidKey("Consul keys are UTF-8".into()))?;
        let key = key.into_owned();
        return match *method {
            Method::GET | Method::HEAD => Ok(ConsulOp::Get { key }),
            Method::PUT | Method::POST => Ok(ConsulOp::Put { key }),
            Method::DELETE => Ok(ConsulOp::Delete { key }),
            _ => Err(KvError::MethodNotAllowed(format!("{method} is not allowed on /v1/kv"))),
        };
    }
    if matches!(path, "/v1/status/leader" | "/v1/status/peers") && method == Method::GET {
        return Ok(ConsulOp::Status);
    }
    Err(KvError::MethodNotAllowed(format!("{method} {path} is not part of the Consul KV subset served here")))
}

/// The route of a Consul API request (pure).
pub fn classify_consul(parts: &Parts) -> Route {
    let (access, body, name) = match parse_consul(&parts.method, parts.uri.path()) {
        Ok(ConsulOp::Get { .. }) => (Access::Read, BodyClass::Bodiless, "ConsulGet"),
        Ok(ConsulOp::Put { .. }) => (Access::Mutation, BodyClass::Data, "ConsulPut"),
        Ok(ConsulOp::Delete { .. }) => (Access::Mutation, BodyClass::Bodiless, "ConsulDelete"),
        Ok(ConsulOp::Status) => (Access::Read, BodyClass::Bodiless, "ConsulStatus"),
        Err(_) => fallback(&parts.method, "ConsulUnknown"),
    };
    Route { name, access, body, auth: AuthPolicy::Open }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str) -> Parts {
        http::Request::builder().method(method).uri(uri).body(()).unwrap().into_parts().0
    }

    #[test]
    fn native_routes() {
        use Access::{Mutation, Read};
        use BodyClass::{Bodiless, Control, Data};
        let cases: &[(&str, &str, &str, Access, BodyClass)] = &[
            ("GET", "/health", "Health", Read, Bodiless),
            ("GET", "/v1/ns", "ListNamespaces", Read, Bodiless),
            ("GET", "/v1/ns/a", "GetNamespace", Read, Bodiless),
            ("PUT", "/v1/ns/a", "PutNamespace", Mutation, Control),
            ("DELETE", "/v1/ns/a", "DeleteNamespace", Mutation, Bodiless),
            ("GET", "/v1/kv/a/k", "Get", Read, Bodiless),
            ("GET", "/v1/kv/a/k?watch&index=5", "Watch", Read, Bodiless),
            ("HEAD", "/v1/kv/a/k", "Head", Read, Bodiless),
            ("PUT", "/v1/kv/a/k?ttl_ms=5", "Put", Mutation, Data),
            ("DELETE", "/v1/kv/a/k", "Delete", Mutation, Bodiless),
            ("GET", "/v1/kv/a?prefix=x&limit=5", "Scan", Read, Bodiless),
            ("GET", "/v1/kv/a?watch&prefix=x", "WatchPrefix", Read, Bodiless),
            ("DELETE", "/v1/kv/a?prefix=x", "DeletePrefix", Mutation, Bodiless),
            ("POST", "/v1/kv/a?batch=get", "BatchGet", Read, Control),
            ("POST", "/v1/kv/a?batch=exists", "BatchExists", Read, Control),
            ("POST", "/v1/kv/a?batch=delete", "BatchDelete", Mutation, Control),
            ("POST", "/v1/kv/a?batch=put", "BatchPut", Mutation, Data),
            ("POST", "/v1/kv/a?batch=nope", "Unknown", Mutation, Bodiless),
            ("PATCH", "/v1/kv/a/k", "Unknown", Mutation, Bodiless),
            ("GET", "/elsewhere", "Unknown", Read, Bodiless),
        ];
        for (m, uri, name, access, body) in cases {
            let r = classify(&parts(m, uri));
            assert_eq!((r.name, r.access, r.body), (*name, *access, *body), "{m} {uri}");
            assert_eq!(r.auth, if *name == "Health" { AuthPolicy::Open } else { AuthPolicy::Required });
        }
    }

    #[test]
    fn every_non_read_method_is_a_mutation_but_read_batches() {
        for m in ["PUT", "DELETE", "PATCH"] {
            for uri in ["/", "/v1/kv/a", "/v1/kv/a/k", "/v1/ns/a", "/v1/kv/a?batch=get"] {
                assert_eq!(classify(&parts(m, uri)).access, Access::Mutation, "{m} {uri}");
            }
        }
        for uri in ["/v1/kv/a?batch=put", "/v1/kv/a?batch=delete", "/v1/kv/a", "/v1/kv/a/k"] {
            assert_eq!(classify(&parts("POST", uri)).access, Access::Mutation, "POST {uri}");
        }
    }

    #[test]
    fn keys_are_percent_decoded_from_the_path() {
        let q = Query::default();
        assert_eq!(
            parse_native(&Method::GET, "/v1/kv/ns/a%2Fb/c%00%FF+", &q).unwrap(),
            NativeOp::Get { ns: "ns".into(), key: b"a/b/c\x00\xff+".to_vec() }
        );
        let q = Query::parse(Some("prefix=a%2B%20b&limit=3&values&x=%ZZ"));
        assert_eq!(q.bytes("prefix"), Some(&b"a+ b"[..]));
        assert_eq!(q.u64("limit").unwrap(), Some(3));
        assert!(q.flag("values"));
        assert!(Query::parse(Some("limit=-1")).u64("limit").is_err());
    }

    #[test]
    fn consul_routes() {
        let cases: &[(&str, &str, &str, Access, BodyClass)] = &[
            ("GET", "/v1/kv/a/b?recurse", "ConsulGet", Access::Read, BodyClass::Bodiless),
            ("GET", "/v1/kv/?keys&separator=/", "ConsulGet", Access::Read, BodyClass::Bodiless),
            ("PUT", "/v1/kv/a?cas=0", "ConsulPut", Access::Mutation, BodyClass::Data),
            ("DELETE", "/v1/kv/a?recurse", "ConsulDelete", Access::Mutation, BodyClass::Bodiless),
            ("GET", "/v1/status/leader", "ConsulStatus", Access::Read, BodyClass::Bodiless),
            ("GET", "/v1/agent/self", "ConsulUnknown", Access::Read, BodyClass::Bodiless),
            ("POST", "/v1/txn", "ConsulUnknown", Access::Mutation, BodyClass::Bodiless),
        ];
        for (m, uri, name, access, body) in cases {
            let r = classify_consul(&parts(m, uri));
            assert_eq!((r.name, r.access, r.body, r.auth), (*name, *access, *body, AuthPolicy::Open), "{m} {uri}");
        }
        assert_eq!(parse_consul(&Method::GET, "/v1/kv/a%2Fb").unwrap(), ConsulOp::Get { key: "a/b".into() });
    }
}
