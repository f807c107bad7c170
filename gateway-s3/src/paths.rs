//! Object keys as filesystem paths, by the bucket's [`Layout`]:
//!
//! | layout | key `k` is | refused (400) |
//! |---|---|---|
//! | tree (default) | the path `k` below the bucket: `/`-separated components; a key ending in `/` (`photos/`) is a *directory object*, the directory itself with the object's metadata in its xattrs | what maps to no clean path (never normalised): an empty component (`a//b`, a leading `/`), `.` or `..`, NUL, a component over 255 bytes; a key over 1024 bytes |
//! | flat | one file named by the order-preserving encoding of `k`'s bytes ([`fskv_client::keyname`]); a key whose encoding is over 240 bytes is a chain of continuation directories (`<240 bytes>+`) ending in its file | an empty key, NUL (the version store's separator, `crate::versions`), a key over 1024 bytes |
//!
//! In a flat bucket keys need not form a tree: `a/b` and `a/b/c` are both
//! objects, `dir/` is an object like any other, a key may have a "component"
//! of any length. A file's name (at most 240 bytes) and a continuation
//! directory's (exactly 241, ending in `+`) never collide, so no key is in
//! another's way. The layout is chosen when the bucket is created and never
//! changes: the bucket directory is made with the xattr [`XATTR_LAYOUT`] in
//! the same meta transaction.

use fskv_client::keyname::KeyPath;
use fskv_proto::meta::MAX_NAME_BYTES;

/// Extended attribute of a bucket directory naming its layout (`flat`);
/// absent for a tree bucket. KV namespaces carry it too.
pub const XATTR_LAYOUT: &str = fskv_client::keyname::LAYOUT_XATTR;
/// Request header of CreateBucket that chooses the layout (`tree`, `flat`).
pub const LAYOUT_HEADER: &str = "x-fskv-bucket-layout";

/// How a bucket maps keys to paths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Keys are paths: what FUSE users see as a directory tree.
    #[default]
    Tree,
    /// Keys are encoded names: any set of keys, no tree rules.
    Flat,
}

impl Layout {
    pub fn parse(s: &str) -> Option<Layout> {
        match s {
            "tree" => Some(Layout::Tree),
            "flat" => Some(Layout::Flat),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Tree => "tree",
            Layout::Flat => fskv_client::keyname::FLAT_LAYOUT,
        }
    }

    /// The layout a bucket's [`XATTR_LAYOUT`] value names (absent: tree).
    pub fn of_xattr(value: Option<&[u8]>) -> Layout {
        match value {
            Some(v) if v == fskv_client::keyname::FLAT_LAYOUT.as_bytes() => Layout::Flat,
            _ => Layout::Tree,
        }
    }
}

/// Longest key S3 allows (bytes of UTF-8).
pub const MAX_KEY_BYTES: usize = 1024;

/// A checked key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectPath {
    /// The path components; never empty.
    pub components: Vec<String>,
    /// The key ends in `/`: the object is the directory named by `components`.
    pub dir_object: bool,
}

impl ObjectPath {
    /// Components of the directory holding the object's entry.
    pub fn parent(&self) -> &[String] {
        &self.components[..self.components.len() - 1]
    }

    /// Name of the object's entry in its parent.
    pub fn name(&self) -> &str {
        &self.components[self.components.len() - 1]
    }
}

/// The path of `key` in a bucket of `layout`, or why it was refused.
pub fn parse_key_in(layout: Layout, key: &str) -> Result<ObjectPath, &'static str> {
    match layout {
        Layout::Tree => parse_key(key),
        Layout::Flat => parse_flat_key(key),
    }
}

/// A key of a flat bucket: its continuation directories and file.
fn parse_flat_key(key: &str) -> Result<ObjectPath, &'static str> {
    if key.is_empty() {
        return Err("the key is empty");
    }
    if key.contains('\0') {
        return Err("the key contains NUL");
    }
    if key.len() > MAX_KEY_BYTES {
        return Err("the key is longer than 1024 bytes");
    }
    let p = KeyPath::of(key.as_bytes());
    let mut components = p.dirs;
    components.push(p.file);
    Ok(ObjectPath { components, dir_object: false })
}

/// The path of `key` in a tree bucket, or why it was refused.
pub fn parse_key(key: &str) -> Result<ObjectPath, &'static str> {
    if key.is_empty() {
        return Err("the key is empty");
    }
    if key.len() > MAX_KEY_BYTES {
        return Err("the key is longer than 1024 bytes");
    }
    if key.contains('\0') {
        return Err("the key contains NUL");
    }
    let (body, dir_object) = match key.strip_suffix('/') {
        Some(b) => (b, true),
        None => (key, false),
    };
    if body.is_empty() {
        return Err("the key is only '/'");
    }
    let mut components = Vec::new();
    for c in body.split('/') {
        match c {
            "" => return Err("the key has an empty path component ('//' or a leading '/')"),
            "." | ".." => return Err("the key has a '.' or '..' path component"),
            c if c.len() > MAX_NAME_BYTES => return Err("a path component is longer than 255 bytes"),
            c => components.push(c.to_string()),
        }
    }
    Ok(ObjectPath { components, dir_object })
}

/// Whether `name` is a bucket name we serve: S3's rules (3..=63 bytes,
/// lowercase letters, digits, `-` and `.`, starting and ending with a letter
/// or digit). Directories under the root with other names (the staging
/// directory of multipart uploads, for one) are not buckets.
pub fn is_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_keys_map_to_components() {
        let p = parse_key("a/b c/ünï%+~.txt").unwrap();
        assert_eq!(p.components, vec!["a", "b c", "ünï%+~.txt"]);
        assert!(!p.dir_object);
        assert_eq!(p.parent(), ["a".to_string(), "b c".to_string()]);
        let d = parse_key("photos/2024/").unwrap();
        assert!(d.dir_object);
        assert_eq!(d.name(), "2024");
        assert_eq!(parse_key("...").unwrap().components, vec!["..."]);
    }

    #[test]
    fn keys_that_escape_or_normalise_are_refused() {
        for bad in ["", "/", "/a", "a//b", "a/./b", "a/../b", "..", "../x", "a/..", "a\0b", "//"] {
            assert!(parse_key(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(parse_key(&"k".repeat(1025)).is_err());
        assert!(parse_key(&format!("{}/x", "c".repeat(256))).is_err());
        assert!(parse_key(&format!("{}/x", "c".repeat(255))).is_ok());
    }

    proptest::proptest! {
        /// A key that parses maps to exactly one clean path; nothing panics.
        #[test]
        fn parsed_keys_are_clean_and_round_trip(s in "[a./\\x00é%+ -]{0,40}") {
            if let Ok(p) = parse_key(&s) {
                for c in &p.components {
                    proptest::prop_assert!(!c.is_empty() && c != "." && c != ".." && !c.contains('/') && !c.contains('\0'));
                }
                let rebuilt = format!("{}{}", p.components.join("/"), if p.dir_object { "/" } else { "" });
                proptest::prop_assert_eq!(rebuilt, s);
            }
        }
    }

    #[test]
    fn flat_keys_need_not_form_a_tree() {
        let f = |k: &str| parse_key_in(Layout::Flat, k).expect(k);
        let (ab, abc, dir) = (f("a/b"), f("a/b/c"), f("dir/"));
        assert_eq!(ab.components, vec!["a.2Fb"]);
        assert_eq!(abc.components, vec!["a.2Fb.2Fc"]);
        assert!(!dir.dir_object && dir.components == vec!["dir.2F"]);
        // Keys a tree bucket refuses, and a component over 255 bytes.
        for k in ["/a", "a//b", "a/../b", "."] {
            assert!(parse_key_in(Layout::Flat, k).is_ok(), "{k:?}");
        }
        let long = format!("{}/x", "c".repeat(600));
        let p = f(&long);
        assert_eq!(p.components.len(), 3);
        assert!(p.parent().iter().all(|d| d.len() == 241 && d.ends_with('+')));
        assert!(parse_key_in(Layout::Flat, "").is_err());
        assert!(parse_key_in(Layout::Flat, "x\0y").is_err());
        assert!(parse_key_in(Layout::Flat, &"k".repeat(1025)).is_err());
        assert_eq!(Layout::of_xattr(Some(b"flat")), Layout::Flat);
        assert_eq!(Layout::of_xattr(None), Layout::Tree);
        assert_eq!(Layout::parse("flat").map(Layout::as_str), Some("flat"));
    }

    #[test]
    fn bucket_names_follow_s3_rules() {
        assert!(is_bucket_name("my-bucket.1"));
        for bad in ["ab", ".fskv-uploads", "Upper", "a..b", "-a-", &"b".repeat(64)] {
            assert!(!is_bucket_name(bad), "{bad}");
        }
    }
}
