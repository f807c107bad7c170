//! The shared gateway layer's own parsing of credentials, on every public
//! port before any body is read: the `Authorization` scheme (SigV4, SigV2,
//! bearer, others), the SigV4 `Credential`/`SignedHeaders`/`Signature`
//! fields of the header and of a presigned query, `X-Amz-Date`,
//! `X-Amz-Expires`, the payload hash, the path canonicalisation used for
//! re-signing. The input is a request: its target on the first line,
//! `name: value` header lines, an empty line, the body.
//!
//! Properties: nothing panics; a precheck that accepts names `host` among
//! its signed headers, a 64-hex signature, and a presigned expiry of at
//! most 7 days; a canonical path is printable ASCII and canonicalising it
//! again changes nothing.
#![no_main]

use fskv_gateway::auth::sigv4::{self, SigV4Verifier, MAX_PRESIGN_SECS};
use fskv_gateway::{AccessKey, KeyStore};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

fn verifier() -> &'static SigV4Verifier {
    static V: OnceLock<SigV4Verifier> = OnceLock::new();
    V.get_or_init(|| {
        let keys = KeyStore::new(vec![AccessKey::new("AKIDFUZZ", "fuzz-secret")]).expect("one key");
        SigV4Verifier::new(Arc::new(keys), "us-east-1", &["s3", "kv", "sqs"])
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = sigv4::parse_amz_date(&text);
    let canonical = sigv4::s3_encode_path(&text);
    assert!(canonical.bytes().all(|b| b.is_ascii_graphic()), "{canonical:?}");
    assert_eq!(sigv4::s3_encode_path(&canonical), canonical, "canonicalisation is idempotent");

    let mut lines = data.split(|b| *b == b'\n');
    let Some(target) = lines.next() else { return };
    let Ok(mut builder) = std::str::from_utf8(target).map(|t| http::Request::builder().method("GET").uri(t.trim_end_matches('\r'))) else {
        return;
    };
    let mut body: &[u8] = &[];
    let mut consumed = target.len() + 1;
    for line in lines {
        consumed += line.len() + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            body = data.get(consumed.min(data.len())..).unwrap_or(&[]);
            break;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else { continue };
        let (Ok(name), Ok(value)) = (
            http::header::HeaderName::from_bytes(line[..colon].trim_ascii()),
            http::header::HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        builder = builder.header(name, value);
    }
    let Ok(req) = builder.body(()) else { return };
    let (parts, ()) = req.into_parts();
    let _ = sigv4::scheme(&parts);
    // A fixed clock: 2026-11-30.
    let now = UNIX_EPOCH + Duration::from_secs(1_796_000_000);
    let v = verifier();
    if let Ok(Some(r)) = v.precheck(&parts, now) {
        assert!(r.signed_headers.iter().any(|h| h == "host"), "{r:?}");
        assert!(r.signature.len() == 64 && r.signature.bytes().all(|b| b.is_ascii_hexdigit()), "{r:?}");
        assert!(r.presigned_expires_secs.is_none_or(|e| (1..=MAX_PRESIGN_SECS).contains(&e)), "{r:?}");
    }
    let _ = v.check(&parts, now);
    let _ = v.verify(&parts, Some(body), now);
    let _ = v.verify(&parts, None, now);
});
