//! The SQS facade's own parsing of AWS JSON 1.0 request bodies (sqs.rs; the
//! JSON syntax itself is serde_json's): message attributes (names, types,
//! Number values, base64 Binary values, the 10-attribute limit), receipt
//! handles (base64url of `r1:uid:partition:offset:nonce`), queue names,
//! message characters, batch entry ids, typed fields.
//!
//! The first byte picks the parser; the rest is a JSON body or a string.
//! None may panic. Attributes that parse are stored as a record header that
//! parses back to the same attributes (same size, MD5 and header); a
//! receipt handle round-trips and is refused for another queue; an accepted
//! queue name or token has only the allowed characters.
#![no_main]

use fskv_gateway_mq::sqs::fuzzing as sqs;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else { return };
    match which % 4 {
        0 => {
            let Ok(v) = serde_json::from_slice::<Value>(rest) else { return };
            // The body's MessageAttributes, or the whole body as the map.
            let attrs = v.get("MessageAttributes").unwrap_or(&v);
            if let Some((size, md5, header)) = sqs::message_attributes(attrs) {
                let stored: Value = serde_json::from_slice(&header).expect("the stored header is JSON");
                assert_eq!(sqs::message_attributes(&stored), Some((size, md5, header)), "stored attributes read back differently");
            }
            for k in ["DelaySeconds", "AttributeNames", "QueueUrl", "MessageBody", "Entries"] {
                let _ = sqs::fields(&v, k);
            }
        }
        1 => {
            let Ok(s) = std::str::from_utf8(rest) else { return };
            let uid = s.len() as u64;
            if let Some((p, o, n)) = sqs::parse_receipt_handle(s, uid) {
                let h = sqs::receipt_handle(uid, p, o, n);
                assert_eq!(sqs::parse_receipt_handle(&h, uid), Some((p, o, n)));
                assert_eq!(sqs::parse_receipt_handle(&h, uid + 1), None, "a receipt of another queue");
            }
        }
        2 => {
            let [a, b, c, d, ..] = rest else { return };
            let (uid, p, o, n) =
                (u64::from(*a) << 56 | u64::from(*b), u32::from(*c), u64::from(*d) * 0x0101_0101_0101, u64::MAX - u64::from(*a));
            let h = sqs::receipt_handle(uid, p, o, n);
            assert_eq!(sqs::parse_receipt_handle(&h, uid), Some((p, o, n)));
        }
        _ => {
            let Ok(s) = std::str::from_utf8(rest) else { return };
            for fifo in [false, true] {
                if sqs::queue_name_ok(s, fifo) {
                    assert!(!s.is_empty() && s.len() <= 80);
                    let base = if fifo { s.strip_suffix(".fifo").expect("a FIFO name ends with .fifo") } else { s };
                    assert!(base.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
                }
            }
            if sqs::token_ok(s) {
                assert!(!s.is_empty() && s.len() <= 128 && s.bytes().all(|c| c.is_ascii_graphic()));
            }
            let _ = sqs::chars_ok(s);
        }
    }
});
