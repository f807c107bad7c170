//! The KV gateway's key encoding (keys.rs): arbitrary key bytes become file
//! names (order-preserving escapes) and long keys a chain of continuation
//! directories. Names read back from a directory listing are untrusted (any
//! FUSE or S3 client can create them), so decoding sees arbitrary bytes too.
//!
//! Properties, for keys `a` and `b` taken from the input:
//! * `decode(encode(a)) == a`; encoded names are printable ASCII without `/`;
//! * `a < b` ⇔ `encode(a) < encode(b)`, and the directory walk order of
//!   their paths is the key order;
//! * a path has only 241-byte continuation directories ending in `+` and a
//!   file name of 1..=240 bytes, never `.`/`..`, and maps back to the key;
//! * any name that decodes is the one encoding of its key (one parse); any
//!   path `KeyPath::key` accepts is the one path of its key.
#![no_main]

use fskv_gateway_kv::keys::{self, KeyPath, SEGMENT_BYTES};
use libfuzzer_sys::fuzz_target;
use std::cmp::Ordering;

const STRETCH_BYTES: usize = 2 << 10;

fn walk_order(a: &KeyPath, b: &KeyPath) -> Ordering {
    let la: Vec<&str> = a.dirs.iter().map(String::as_str).chain([a.file.as_str()]).collect();
    let lb: Vec<&str> = b.dirs.iter().map(String::as_str).chain([b.file.as_str()]).collect();
    for (x, y) in la.iter().zip(&lb) {
        match x.as_bytes().cmp(y.as_bytes()) {
            Ordering::Equal => continue,
            o => return o,
        }
    }
    la.len().cmp(&lb.len())
}

fn check_key(k: &[u8]) -> KeyPath {
    let e = keys::encode(k);
    assert!(e.len() >= k.len() && e.len() <= 3 * k.len());
    assert!(e.bytes().all(|c| (0x21..0x7f).contains(&c) && c != b'/'), "{e:?}");
    assert_eq!(keys::decode(e.as_bytes()).as_deref(), Some(k));
    let p = KeyPath::of(k);
    for d in &p.dirs {
        assert_eq!(keys::continuation_segment(d).map(<[u8]>::len), Some(SEGMENT_BYTES));
    }
    assert!(keys::is_file_segment(&p.file) && p.file != "." && p.file != "..");
    let dirs: Vec<&str> = p.dirs.iter().map(String::as_str).collect();
    assert_eq!(KeyPath::key(&dirs, &p.file).as_deref(), Some(k));
    p
}

fuzz_target!(|data: &[u8]| {
    let [mode, rest @ ..] = data else { return };
    match mode % 3 {
        // Two keys: round trip, order.
        0 => {
            let [split, rest @ ..] = rest else { return };
            let at = (*split as usize * rest.len() / 255).min(rest.len());
            let (a, b) = rest.split_at(at);
            // Long keys (a quarter of the runs): the input repeated, up to
            // 2 KiB (up to 6 KiB encoded: 25 continuation directories).
            let stretch = |k: &[u8]| -> Vec<u8> {
                if k.is_empty() || mode & 0xC0 != 0xC0 {
                    return k.to_vec();
                }
                k.iter().copied().cycle().take(STRETCH_BYTES.min(k.len() * 97)).collect()
            };
            let (a, b) = (stretch(a), stretch(b));
            if a.is_empty() || b.is_empty() {
                return;
            }
            let (pa, pb) = (check_key(&a), check_key(&b));
            let (ea, eb) = (keys::encode(&a), keys::encode(&b));
            assert_eq!(a.cmp(&b), ea.as_bytes().cmp(eb.as_bytes()));
            assert_eq!(a.cmp(&b), walk_order(&pa, &pb));
        }
        // A name from a listing.
        1 => {
            if let Some(k) = keys::decode(rest) {
                assert_eq!(keys::encode(&k).as_bytes(), rest, "a name has one parse");
            }
            if let Ok(s) = std::str::from_utf8(rest) {
                let _ = keys::is_namespace_name(s);
                let b = keys::bound_before(s);
                if !s.is_empty() && s.bytes().all(|c| (0x21..0x7f).contains(&c)) {
                    assert!(b.as_str() < s);
                }
            }
        }
        // A path from a directory walk: names separated by `/`.
        _ => {
            let Ok(s) = std::str::from_utf8(rest) else { return };
            let mut names: Vec<&str> = s.split('/').collect();
            let Some(file) = names.pop() else { return };
            if let Some(k) = KeyPath::key(&names, file) {
                let p = check_key(&k);
                assert_eq!(p.file, file);
                assert_eq!(p.dirs, names, "a key has one path");
            }
        }
    }
});
