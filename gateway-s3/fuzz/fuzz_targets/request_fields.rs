//! The gateway's own parsers of untrusted request fields (the HTTP, XML,
//! SigV4 and aws-chunked parsing is s3s's): object keys, the tagging header,
//! continuation tokens, the `Host` header of virtual-hosted-style requests,
//! the CORS preflight headers (`Origin`, `Access-Control-Request-Method`,
//! `Access-Control-Request-Headers`) matched against rules. None may panic;
//! a key that parses must map to clean path components; a bucket taken
//! from a `Host` is a valid bucket name.
#![no_main]

use fskv_gateway_s3::{cors, list, objmeta, paths, vhost};
use std::sync::OnceLock;

fn hosts() -> &'static vhost::VirtualHosts {
    static H: OnceLock<vhost::VirtualHosts> = OnceLock::new();
    H.get_or_init(|| vhost::VirtualHosts::new(&["localhost", "s3.example.com"]).expect("valid domains"))
}

fn rules() -> &'static [cors::Rule] {
    static R: OnceLock<Vec<cors::Rule>> = OnceLock::new();
    R.get_or_init(|| {
        vec![
            cors::Rule {
                methods: vec!["GET".into(), "PUT".into()],
                origins: vec!["https://*.example.com".into()],
                allowed_headers: vec!["x-amz-*".into(), "content-type".into()],
                ..Default::default()
            },
            cors::Rule { methods: vec!["GET".into()], origins: vec!["*".into()], ..Default::default() },
        ]
    })
}
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        let _ = list::decode_token(&String::from_utf8_lossy(data));
        return;
    };
    if let Ok(p) = paths::parse_key(s) {
        assert!(!p.components.is_empty());
        for c in &p.components {
            assert!(!c.is_empty() && c != "." && c != ".." && !c.contains('/') && !c.contains('\0'));
        }
        let rebuilt = format!("{}{}", p.components.join("/"), if p.dir_object { "/" } else { "" });
        assert_eq!(rebuilt, s, "a key maps to exactly one path");
    }
    let _ = objmeta::parse_tagging_header(s);
    if let Ok(t) = list::decode_token(s) {
        assert_eq!(list::decode_token(&list::encode_token(&t)).ok(), Some(t));
    }
    let _ = paths::is_bucket_name(s);
    if let Some(b) = hosts().bucket_of_host(s) {
        assert!(paths::is_bucket_name(&b), "{s:?} gave bucket {b:?}");
    }
    // Preflight: the input split into origin, method and requested headers.
    let mut f = s.splitn(3, '\n');
    let (origin, method, headers) = (f.next(), f.next(), f.next());
    let _ = cors::preflight(Some(rules()), origin, method, headers);
    let _ = cors::actual(rules(), origin.unwrap_or(""), method.unwrap_or(""));
});
