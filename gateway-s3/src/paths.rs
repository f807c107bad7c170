//! Object keys as filesystem paths.
//!
//! A key is `/`-separated components below the bucket directory. A key
//! ending in `/` (`photos/`) is a *directory object*: the directory itself,
//! with the object's metadata in its xattrs. Keys that do not map to one
//! clean path inside the bucket are refused (400), never normalised: an
//! empty component (`a//b`, a leading `/`), `.` or `..`, NUL, a component
//! longer than the filesystem allows, or a key over 1024 bytes.

use fskv_proto::meta::MAX_NAME_BYTES;

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

/// Why a key was refused.
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
    fn bucket_names_follow_s3_rules() {
        assert!(is_bucket_name("my-bucket.1"));
        for bad in ["ab", ".fskv-uploads", "Upper", "a..b", "-a-", &"b".repeat(64)] {
            assert!(!is_bucket_name(bad), "{bad}");
        }
    }
}
