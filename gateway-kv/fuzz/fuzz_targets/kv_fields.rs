//! The KV gateway's other parsers of untrusted bytes. From files any
//! filesystem client can write below the gateway's root: recency access
//! logs (`FKRL`), recency checkpoints (`FKCP`), per-key records (JSON xattr
//! `user.kv.meta`). From HTTP requests: the query string, ETags
//! (`If-Match`), `Range`, Consul's `?wait=` and `?keys&separator=` folding.
//!
//! The first byte picks the parser. None may panic; a log that decodes
//! re-encodes to the same bytes; a record, an ETag round-trip; a range is
//! inside the value; folded keys are prefixes of listed keys.
#![no_main]

use fskv_gateway_kv::{consul, maintain, ops, recency, record, route};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else { return };
    let text = std::str::from_utf8(rest).ok();
    match which % 7 {
        0 => {
            if let Some(log) = recency::Log::decode(rest) {
                assert_eq!(&log.encode()[..], rest, "an access log re-encodes to its bytes");
            }
        }
        1 => {
            if let Some((keys, _counters)) = maintain::decode_checkpoint(rest) {
                assert!(keys.len() * 10 <= rest.len());
            }
        }
        2 => {
            let r = record::Record::decode(rest);
            assert_eq!(record::Record::decode(&r.encode()), r);
        }
        3 => {
            let Some(s) = text else { return };
            if let Some(v) = record::parse_etag(s) {
                assert_eq!(record::parse_etag(&record::etag(v)), Some(v));
            }
            let _ = consul::parse_wait(s);
        }
        4 => {
            let Some(s) = text else { return };
            let q = route::Query::parse(Some(s));
            for name in ["batch", "ttl_ms", "limit", "index", "wait", "keys", "recurse", "separator", "cas", "flags"] {
                let _ = q.u64(name);
                let _ = q.flag(name);
                let _ = q.str(name);
            }
        }
        5 => {
            let [s0, s1, rest @ ..] = rest else { return };
            let size = u64::from(u16::from_le_bytes([*s0, *s1])) << (s0 % 40);
            let Ok(v) = http::HeaderValue::from_bytes(rest) else { return };
            if let Ok(Some((start, end))) = ops::single::parse_range(Some(&v), size) {
                assert!(start < end && end <= size, "{start}..{end} of {size}");
            }
        }
        _ => {
            // `prefix \0 separator \0 key \0 key ...`: listed keys all start
            // with the prefix (a scan of it), in order.
            let Some(s) = text else { return };
            let mut parts = s.split('\0');
            let (Some(prefix), Some(sep)) = (parts.next(), parts.next()) else { return };
            let mut keys: Vec<String> = parts.map(|k| format!("{prefix}{k}")).collect();
            keys.sort();
            let sep = (!sep.is_empty()).then_some(sep);
            for f in consul::fold_keys(prefix, sep, keys.iter().map(String::as_str)) {
                assert!(keys.iter().any(|k| k.starts_with(&f)), "{f:?} is not a prefix of a listed key");
            }
        }
    }
});
