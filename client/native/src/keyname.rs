//! Keys as file names: an order-preserving, reversible encoding of arbitrary
//! key bytes into names the filesystem accepts, and the split of long keys
//! into a chain of directories. Pure; no I/O. Used by every store that keeps
//! arbitrary byte keys as files of one directory and lists them in key
//! order: the KV gateway's namespaces and the S3 gateway's flat buckets
//! (walked in order by [`crate::keywalk`]).
//!
//! **Encoding** (each key byte on its own, so the code is a homomorphism):
//!
//! | key byte | name bytes | why |
//! |---|---|---|
//! | `0x22..=0x2D`, `0x30..=0x7D` (printable ASCII but `!` `.` `/` `~`) | the byte itself | readable names through FUSE and S3 |
//! | `0x00..=0x21` (controls, space, `!`) | `!` + 2 uppercase hex digits | `!` (0x21) sorts above every byte it stands for and below every literal |
//! | `.` (0x2E), `/` (0x2F) | `.` + 2 hex digits | no `/` in a name, no `.`/`..` names; `.` sorts between `-` and `0`, as the two bytes do |
//! | `0x7E..=0xFF` (`~`, DEL, non-ASCII) | `~` + 2 hex digits | `~` (0x7E) sorts above every literal |
//!
//! Every escape byte is itself escaped, so a name has exactly one parse.
//! The code of each byte is prefix-free and the codes are in the order of
//! the bytes, hence for keys `a < b` (bytewise) `encode(a) < encode(b)`:
//! a directory listing in name order is the key order. A key of `n` bytes
//! takes between `n` and `3n` name bytes.
//!
//! **Long keys.** A name holds at most 255 bytes. An encoded key `E` longer
//! than [`SEGMENT_BYTES`] (240) is cut into segments of exactly 240 bytes
//! (the cut may fall inside an escape) and a last segment of 1..=240 bytes:
//! every full segment is a directory named `segment + "+"` (241 bytes), the
//! last one the file. Within a directory, files have names of at most 240
//! bytes and continuation directories exactly 241, so they never collide,
//! and because every full segment has the same length, name order inside
//! each directory is still the order of the whole encoded keys (the `+` is
//! never compared: a file name either differs from a 240-byte segment
//! within its own length or is a prefix of it). A 4 KiB key of printable
//! ASCII is a file 17 directories deep, a 16 KiB key (the KV gateway's
//! hard limit) at most 205.

/// Bytes of each full segment of an encoded key.
pub const SEGMENT_BYTES: usize = 240;
/// Extended attribute of a directory whose files are keys named by this
/// encoding, and its value: an S3 flat bucket's directory, made with it,
/// and a KV namespace's, so an S3 gateway whose root is the KV root serves
/// each namespace as a flat bucket (docs/kv.md, "Through S3").
pub const LAYOUT_XATTR: &str = "user.s3.layout";
pub const FLAT_LAYOUT: &str = "flat";
/// The byte that ends a continuation directory's name.
pub const CONTINUATION: u8 = b'+';

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The escape byte of `b`, or `None` when `b` stands for itself.
fn escape_of(b: u8) -> Option<u8> {
    match b {
        0x00..=0x21 => Some(b'!'),
        b'.' | b'/' => Some(b'.'),
        0x7E..=0xFF => Some(b'~'),
        _ => None,
    }
}

/// Encodes key bytes into one (possibly long) name string.
pub fn encode(key: &[u8]) -> String {
    let mut out = Vec::with_capacity(key.len() + 8);
    for &b in key {
        match escape_of(b) {
            Some(e) => out.extend_from_slice(&[e, HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]),
            None => out.push(b),
        }
    }
    // Only ASCII bytes were pushed.
    String::from_utf8(out).unwrap_or_default()
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Decodes an encoded key; `None` unless `name` is exactly what [`encode`]
/// makes of some key (names made through FUSE or S3 that are not are not
/// keys: scans skip them and no key names them).
pub fn decode(name: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len());
    let mut i = 0;
    while i < name.len() {
        let c = name[i];
        if matches!(c, b'!' | b'.' | b'~') {
            let b = hex_val(*name.get(i + 1)?)? << 4 | hex_val(*name.get(i + 2)?)?;
            if escape_of(b) != Some(c) {
                return None;
            }
            out.push(b);
            i += 3;
        } else {
            if escape_of(c).is_some() {
                return None;
            }
            out.push(c);
            i += 1;
        }
    }
    Some(out)
}

/// Where a key lives below its namespace directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPath {
    /// Continuation directories, outermost first (each `SEGMENT_BYTES` + `+`).
    pub dirs: Vec<String>,
    /// The file's name (1..=`SEGMENT_BYTES` bytes).
    pub file: String,
}

impl KeyPath {
    /// The path of a non-empty key.
    pub fn of(key: &[u8]) -> KeyPath {
        let e = encode(key);
        let bytes = e.as_bytes();
        let mut dirs = Vec::new();
        let mut at = 0;
        while bytes.len() - at > SEGMENT_BYTES {
            // ASCII only: every index is a char boundary.
            dirs.push(format!("{}+", &e[at..at + SEGMENT_BYTES]));
            at += SEGMENT_BYTES;
        }
        KeyPath { dirs, file: e[at..].to_string() }
    }

    /// The key back from its path; `None` when the names are not a key's.
    pub fn key(dirs: &[&str], file: &str) -> Option<Vec<u8>> {
        let mut e = Vec::with_capacity(dirs.len() * SEGMENT_BYTES + file.len());
        for d in dirs {
            e.extend_from_slice(continuation_segment(d)?);
        }
        if file.is_empty() || file.len() > SEGMENT_BYTES {
            return None;
        }
        e.extend_from_slice(file.as_bytes());
        decode(&e)
    }
}

/// The segment a continuation directory's name stands for, if it is one.
pub fn continuation_segment(name: &str) -> Option<&[u8]> {
    let b = name.as_bytes();
    (b.len() == SEGMENT_BYTES + 1 && b[SEGMENT_BYTES] == CONTINUATION).then(|| &b[..SEGMENT_BYTES])
}

/// Whether `name` may be a key's file name (a key's last segment).
pub fn is_file_segment(name: &str) -> bool {
    !name.is_empty() && name.len() <= SEGMENT_BYTES
}

/// A `start_after` bound for readdir that lists every name `>= s` (readdir
/// lists names strictly after its bound): `s` with its last byte lowered by
/// one and followed by DEL. Names hold printable ASCII only (`!`..`~`), so
/// nothing lies between the bound and `s`.
pub fn bound_before(s: &str) -> String {
    let mut b = s.as_bytes().to_vec();
    match b.pop() {
        None => String::new(),
        Some(last) => {
            b.push(last.saturating_sub(1));
            b.push(0x7F);
            String::from_utf8(b).unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn readable_names_for_common_keys() {
        assert_eq!(encode(b"a1b2c3d4"), "a1b2c3d4");
        assert_eq!(encode(b"user/42/profile.json"), "user.2F42.2Fprofile.2Ejson");
        assert_eq!(encode(b"model@2@0@f00d@bf16"), "model@2@0@f00d@bf16");
        assert_eq!(encode(b"a b!~\x00\xff"), "a!20b!21~7E!00~FF");
        assert_eq!(encode(b".."), ".2E.2E");
        for k in [&b"a"[..], b"user/42/profile.json", b"\x00", b"~~..//!!", &[0xFF; 5]] {
            assert_eq!(decode(encode(k).as_bytes()).as_deref(), Some(k));
        }
    }

    #[test]
    fn names_that_are_not_encodings_are_refused() {
        for bad in [&b"hello.txt"[..], b"a!2", b"!41", b"~41", b".41", b"a/b", b"x y", b"!0g", b"\x7f", b".2e"] {
            assert_eq!(decode(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(decode(b""), Some(vec![]));
    }

    #[test]
    fn long_keys_become_directory_chains() {
        let key = vec![b'k'; 4096];
        let p = KeyPath::of(&key);
        assert_eq!(p.dirs.len(), 4096 / SEGMENT_BYTES);
        assert!(p.dirs.iter().all(|d| d.len() == SEGMENT_BYTES + 1 && d.ends_with('+')));
        assert_eq!(p.file.len(), 4096 % SEGMENT_BYTES);
        let dirs: Vec<&str> = p.dirs.iter().map(String::as_str).collect();
        assert_eq!(KeyPath::key(&dirs, &p.file), Some(key));
        // Exactly one and two segments.
        let one = KeyPath::of(&[b'x'; SEGMENT_BYTES]);
        assert!(one.dirs.is_empty() && one.file.len() == SEGMENT_BYTES);
        let two = KeyPath::of(&[b'x'; 2 * SEGMENT_BYTES]);
        assert_eq!((two.dirs.len(), two.file.len()), (1, SEGMENT_BYTES));
        // A cut inside an escape.
        let mut k = vec![b'a'; SEGMENT_BYTES - 1];
        k.push(0);
        let p = KeyPath::of(&k);
        assert_eq!(p.dirs[0], format!("{}!+", "a".repeat(SEGMENT_BYTES - 1)));
        assert_eq!(p.file, "00");
        assert_eq!(KeyPath::key(&[&p.dirs[0]], &p.file), Some(k));
    }

    #[test]
    fn bound_before_lists_the_name_itself() {
        assert_eq!(bound_before(""), "");
        let b = bound_before("ab");
        assert!(b.as_str() < "ab" && "aa~~~" < b.as_str());
    }

    /// Order of the directory walk: names compared per directory level,
    /// a file before anything in a directory it is a prefix of.
    fn walk_order(a: &KeyPath, b: &KeyPath) -> std::cmp::Ordering {
        let la: Vec<&str> = a.dirs.iter().map(String::as_str).chain([a.file.as_str()]).collect();
        let lb: Vec<&str> = b.dirs.iter().map(String::as_str).chain([b.file.as_str()]).collect();
        for (x, y) in la.iter().zip(&lb) {
            match x.as_bytes().cmp(y.as_bytes()) {
                std::cmp::Ordering::Equal => continue,
                o => return o,
            }
        }
        la.len().cmp(&lb.len())
    }

    proptest! {
        #[test]
        fn encoding_round_trips_and_keeps_order(a in proptest::collection::vec(any::<u8>(), 1..40), b in proptest::collection::vec(any::<u8>(), 1..40)) {
            let (ea, eb) = (encode(&a), encode(&b));
            prop_assert_eq!(decode(ea.as_bytes()), Some(a.clone()));
            prop_assert_eq!(a.cmp(&b), ea.as_bytes().cmp(eb.as_bytes()));
            prop_assert!(ea.bytes().all(|c| (0x21..0x7f).contains(&c)));
        }

        #[test]
        fn long_key_paths_keep_order(
            common in proptest::collection::vec(prop_oneof![Just(b'a'), Just(0u8), Just(b'/'), Just(0xFFu8), Just(b'z')], 0..600),
            ta in proptest::collection::vec(prop_oneof![Just(b'a'), Just(0u8), Just(b'.'), Just(0x80u8)], 0..300),
            tb in proptest::collection::vec(prop_oneof![Just(b'a'), Just(0u8), Just(b'.'), Just(0x80u8)], 0..300),
        ) {
            let a: Vec<u8> = common.iter().chain(&ta).copied().collect();
            let b: Vec<u8> = common.iter().chain(&tb).copied().collect();
            prop_assume!(!a.is_empty() && !b.is_empty());
            let (pa, pb) = (KeyPath::of(&a), KeyPath::of(&b));
            prop_assert_eq!(walk_order(&pa, &pb), a.cmp(&b));
            for (p, k) in [(&pa, &a), (&pb, &b)] {
                prop_assert!(p.dirs.iter().all(|d| continuation_segment(d).is_some()));
                prop_assert!(is_file_segment(&p.file) && p.file != "." && p.file != "..");
                let dirs: Vec<&str> = p.dirs.iter().map(String::as_str).collect();
                prop_assert_eq!(KeyPath::key(&dirs, &p.file), Some(k.clone()));
            }
        }
    }
}
