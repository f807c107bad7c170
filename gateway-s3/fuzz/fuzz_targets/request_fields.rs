//! The gateway's own parsers of untrusted request fields (the HTTP, XML,
//! SigV4 and aws-chunked parsing is s3s's): object keys, the tagging header,
//! continuation tokens. None may panic; a key that parses must map to clean
//! path components.
#![no_main]

use fskv_gateway_s3::{list, objmeta, paths};
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
});
