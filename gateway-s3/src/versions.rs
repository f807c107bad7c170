//! Object versions (S3 versioning) over the filesystem: the names and ids,
//! pure; the moves are `ops/versioning.rs`.
//!
//! **Where versions live.** The current version of a key stays the file at
//! the key's path (FUSE sees objects as files, whatever the bucket's
//! versioning). Every other version and every delete marker is a file of
//! the bucket's *version store* `ROOT/.fskv-versions/<bucket>` (root-owned
//! 0700 directories; the files keep their tenant's ownership), named by
//! the order-preserving key encoding ([`fskv_client::keyname`]) of the
//! store key `key ‖ 0x00 ‖ sort`:
//!
//! | version | `sort` | S3 version id |
//! |---|---|---|
//! | made while versioning is Enabled | its id: 16 hex digits of `u64::MAX - mtime_ns`, then 8 random hex digits | the same 24 characters |
//! | the null version (written while Off or Suspended) | 16 hex digits of `u64::MAX - mtime_ns`, then `null` | `null` |
//!
//! Keys hold no NUL (tree and flat buckets refuse it), so store keys sort
//! by key first, then by `sort`, newest first: one walk of the store gives
//! ListObjectVersions its order, and the newest noncurrent entry of a key
//! is the first at `key ‖ 0x00`. A version with a real id is found by one
//! lookup; the null one by a walk of the names of the key's entries.
//!
//! **State** (xattr `user.s3.versioning` of the bucket directory): absent
//! (never enabled), `Enabled` or `Suspended`; once set it is never absent
//! again, as in S3. Cached by `store::VersioningCache` against the bucket
//! directory's inode version (exact, not time-bounded).
//!
//! **Moves** (each one `MetaOp::Txn`, guarded by an `Expect` on the
//! current file, so it commits whole or not at all):
//!
//! | request | versioning | what moves |
//! |---|---|---|
//! | PUT, copy, complete upload | Enabled | current → store under its own sort; new file → key path with a new id |
//! | same | Suspended | a current with a real id → store; a current null version is replaced; a noncurrent null version is unlinked; new file → key path as null |
//! | DELETE | Enabled | current → store; a new delete marker (empty file with a record saying so) into the store |
//! | DELETE | Suspended | as Enabled, but the marker is the null version (an older null version, current or not, is removed) |
//! | DELETE `versionId` of the current | any | current unlinked; the newest noncurrent entry, if it is a version (not a marker), → key path |
//! | DELETE `versionId` of a store entry | any | unlinked; if it was the newest entry, a marker, and there is no current, the next entry, if a version, → key path |
//!
//! Hence the invariant the reads rely on: when a key has no current file,
//! its newest store entry (if any) is a delete marker.

/// Extended attribute of a bucket directory: its versioning state.
pub const XATTR_VERSIONING: &str = "user.s3.versioning";
/// Directory under the root holding one version store per bucket (not a
/// valid bucket name, so never listed as one).
pub const VERSIONS_DIR: &str = ".fskv-versions";
/// The S3 name of the null version.
pub const NULL_VERSION: &str = "null";
/// Length of a version id this gateway makes.
pub const VERSION_ID_LEN: usize = 24;

/// A bucket's versioning state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Versioning {
    /// Never enabled: a write replaces the object, there are no versions.
    #[default]
    Off,
    Enabled,
    Suspended,
}

impl Versioning {
    pub fn of_xattr(value: Option<&[u8]>) -> Versioning {
        match value {
            Some(b"Enabled") => Versioning::Enabled,
            Some(b"Suspended") => Versioning::Suspended,
            _ => Versioning::Off,
        }
    }

    /// The S3 status, `None` while never enabled.
    pub fn status(self) -> Option<&'static str> {
        match self {
            Versioning::Off => None,
            Versioning::Enabled => Some("Enabled"),
            Versioning::Suspended => Some("Suspended"),
        }
    }
}

/// A version a request names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionRef {
    Null,
    Id(String),
}

impl VersionRef {
    /// `versionId` of a request; `None` when it is not one this gateway
    /// could have made (S3: 400 InvalidArgument "Invalid version id").
    pub fn parse(s: &str) -> Option<VersionRef> {
        if s == NULL_VERSION {
            return Some(VersionRef::Null);
        }
        (s.len() == VERSION_ID_LEN && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))).then(|| VersionRef::Id(s.into()))
    }

    /// Whether a record's version id (`None`: null) is this one.
    pub fn names(&self, record_version: Option<&str>) -> bool {
        match (self, record_version) {
            (VersionRef::Null, None) => true,
            (VersionRef::Id(a), Some(b)) => a == b,
            _ => false,
        }
    }
}

/// A new version id made at `now_ns`: newer ids sort first.
pub fn new_version_id(now_ns: u64, random: u32) -> String {
    format!("{:016x}{random:08x}", u64::MAX - now_ns)
}

/// The `sort` of a version: its id, or for the null version its time.
pub fn sort_of(version_id: Option<&str>, mtime_ns: u64) -> String {
    match version_id {
        Some(id) => id.to_string(),
        None => format!("{:016x}{NULL_VERSION}", u64::MAX - mtime_ns),
    }
}

/// The version id a `sort` stands for (`None`: null).
pub fn version_of_sort(sort: &str) -> Option<&str> {
    (!(sort.len() == 16 + NULL_VERSION.len() && sort.ends_with(NULL_VERSION))).then_some(sort)
}

/// The store key of version `sort` of `key`.
pub fn store_key(key: &str, sort: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1 + sort.len());
    k.extend_from_slice(key.as_bytes());
    k.push(0);
    k.extend_from_slice(sort.as_bytes());
    k
}

/// Where the store entries of `key` begin (inclusive).
pub fn store_prefix(key: &str) -> Vec<u8> {
    store_key(key, "")
}

/// `(key, sort)` of a store key; `None` for a name that is not one.
pub fn split_store_key(k: &[u8]) -> Option<(String, String)> {
    let at = k.iter().position(|b| *b == 0)?;
    let key = std::str::from_utf8(&k[..at]).ok()?;
    let sort = std::str::from_utf8(&k[at + 1..]).ok()?;
    (!key.is_empty() && !sort.is_empty()).then(|| (key.to_string(), sort.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_versions_sort_first_and_ids_round_trip() {
        let old = new_version_id(1_000, 7);
        let new = new_version_id(2_000, 3);
        assert!(new < old);
        assert_eq!(VersionRef::parse(&new), Some(VersionRef::Id(new.clone())));
        assert_eq!(VersionRef::parse("null"), Some(VersionRef::Null));
        for bad in ["", "NULL", "abc", &"g".repeat(24), &"A".repeat(24)] {
            assert_eq!(VersionRef::parse(bad), None, "{bad:?}");
        }
        let null_sort = sort_of(None, 1_500);
        assert!(new < null_sort && null_sort < old, "the null version sorts by its time among the others");
        assert_eq!(version_of_sort(&null_sort), None);
        assert_eq!(version_of_sort(&new), Some(new.as_str()));
        assert!(VersionRef::Null.names(None) && VersionRef::Id(new.clone()).names(Some(&new)) && !VersionRef::Null.names(Some(&new)));
    }

    #[test]
    fn store_keys_sort_by_key_then_newest_first() {
        let (a1, a2) = (new_version_id(2, 0), new_version_id(1, 0));
        let mut keys = [store_key("a/b", &a2), store_key("a", &a2), store_key("a/b", &a1), store_key("a", &a1), store_key("a-", &a1)];
        keys.sort();
        let split: Vec<(String, String)> = keys.iter().map(|k| split_store_key(k).expect("store key")).collect();
        let want = [("a", &a1), ("a", &a2), ("a-", &a1), ("a/b", &a1), ("a/b", &a2)];
        assert_eq!(split, want.map(|(k, s)| (k.to_string(), s.to_string())));
        assert!(store_prefix("a") < store_key("a", &a1) && store_key("a", &a2) < store_prefix("a-"));
        assert_eq!(split_store_key(b"no-separator"), None);
    }

    #[test]
    fn states() {
        assert_eq!(Versioning::of_xattr(None), Versioning::Off);
        assert_eq!(Versioning::of_xattr(Some(b"Enabled")).status(), Some("Enabled"));
        assert_eq!(Versioning::of_xattr(Some(b"Suspended")).status(), Some("Suspended"));
    }
}
