//! What an object carries besides its data, kept in xattrs of its inode.
//!
//! * `user.s3.meta`: [`ObjectMeta`] as JSON — ETag, standard headers, user
//!   metadata, checksums, and the `(size, mtime_ns)` the record was made
//!   for. The record is published with the data in one meta transaction.
//! * `user.s3.tags`: the object's tag set as JSON.
//! * the object's canned ACL is a field of `user.s3.meta` (published with
//!   the data; PutObjectAcl rewrites the record of that inode). A file
//!   changed through FUSE loses its record, and so its ACL: it is private.
//!
//! A file changed through POSIX (FUSE) keeps a record that no longer
//! matches its size or mtime; such a record is ignored and the file gets
//! the ETag of a file without one: a stable digest of (inode, size,
//! mtime), so a file made through FUSE has an ETag that changes exactly
//! when the file does.

use fskv_proto::meta::Inode;
use s3s::crypto::{Checksum as _, Md5};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const XATTR_META: &str = "user.s3.meta";
pub const XATTR_TAGS: &str = "user.s3.tags";
/// Most user metadata (names and values, bytes), as S3 limits it.
pub const MAX_USER_META_BYTES: usize = 2048;
/// Most tags on an object, as S3 limits it.
pub const MAX_TAGS: usize = 10;

/// Checksums of an object's data, base64 as S3 sends them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checksums {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc64nvme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha1: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// "FULL_OBJECT" or "COMPOSITE" (multipart checksums of checksums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Sets the five `checksum_*` fields of an s3s output struct from
/// [`Checksums`] (each output type has its own fields of the same names).
#[macro_export]
macro_rules! set_checksums {
    ($out:expr, $sums:expr) => {{
        let sums: &$crate::objmeta::Checksums = $sums;
        $out.checksum_crc32 = sums.crc32.clone();
        $out.checksum_crc32c = sums.crc32c.clone();
        $out.checksum_crc64nvme = sums.crc64nvme.clone();
        $out.checksum_sha1 = sums.sha1.clone();
        $out.checksum_sha256 = sums.sha256.clone();
    }};
}

/// Sets the object headers shared by HeadObject and GetObject outputs.
#[macro_export]
macro_rules! set_object_headers {
    ($out:expr, $meta:expr) => {{
        let m: &$crate::objmeta::ObjectMeta = $meta;
        $out.e_tag = Some(s3s::dto::ETag::Strong(m.etag.clone()));
        $out.last_modified = Some($crate::ops::object::timestamp(m.mtime_ns));
        $out.content_type = m.headers.content_type.clone().or_else(|| Some("binary/octet-stream".into()));
        $out.content_encoding = m.headers.content_encoding.clone();
        $out.content_disposition = m.headers.content_disposition.clone();
        $out.content_language = m.headers.content_language.clone();
        $out.cache_control = m.headers.cache_control.clone();
        $out.expires = $crate::ops::object::expires_of(&m.headers);
        $out.metadata = $crate::ops::object::user_out(m);
    }};
}

impl Checksums {
    pub fn is_empty(&self) -> bool {
        self.crc32.is_none() && self.crc32c.is_none() && self.crc64nvme.is_none() && self.sha1.is_none() && self.sha256.is_none()
    }
}

/// The standard headers an object keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// `Expires`, as the HTTP date the client sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

/// The `user.s3.meta` record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// Hex MD5 of the data, or of the part MD5s followed by `-N`; unquoted.
    pub etag: String,
    pub size: u64,
    pub mtime_ns: u64,
    #[serde(default)]
    pub headers: Headers,
    #[serde(default)]
    pub user: BTreeMap<String, String>,
    #[serde(default)]
    pub checksums: Checksums,
    /// Sizes of the parts of a multipart object (for `partNumber` reads).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub part_sizes: Vec<u64>,
    /// The multipart upload that made the object: a retried
    /// CompleteMultipartUpload of that upload is answered from this record
    /// while it is the current object at the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
    /// Checksums of the parts of a multipart object, in part order, when
    /// any part was uploaded with one (GetObjectAttributes lists parts only
    /// then, as S3 does); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub part_checksums: Vec<Checksums>,
    /// The object's canned ACL (`crate::access`); absent: `private`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<crate::access::CannedAcl>,
    /// The version id (`crate::versions`); absent: the null version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    /// A delete marker: an empty file of the version store.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_marker: bool,
}

impl ObjectMeta {
    pub fn encode(&self) -> Vec<u8> {
        // Serialising a struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The record if it is readable and still describes `inode`.
    pub fn decode_for(bytes: &[u8], inode: &Inode) -> Option<ObjectMeta> {
        let m: ObjectMeta = serde_json::from_slice(bytes).ok()?;
        (m.size == inode.size_bytes() && m.mtime_ns == inode.mtime_ns).then_some(m)
    }

    /// The quoted ETag of the HTTP header.
    pub fn quoted_etag(&self) -> String {
        format!("\"{}\"", self.etag)
    }
}

/// The ETag of a file without a valid record: stable while the file's
/// inode, size and mtime are.
pub fn synthetic_etag(inode: &Inode) -> String {
    let mut h = Md5::new();
    h.update(&inode.id.0.to_le_bytes());
    h.update(&inode.size_bytes().to_le_bytes());
    h.update(&inode.mtime_ns.to_le_bytes());
    hex::encode(h.finalize())
}

/// The record of `inode` from its xattr, or the one a plain file gets.
pub fn effective(inode: &Inode, record: Option<&[u8]>) -> ObjectMeta {
    if let Some(m) = record.and_then(|b| ObjectMeta::decode_for(b, inode)) {
        return m;
    }
    ObjectMeta { etag: synthetic_etag(inode), size: inode.size_bytes(), mtime_ns: inode.mtime_ns, ..ObjectMeta::default() }
}

/// The ETag of a multipart object: MD5 of the parts' binary MD5s, `-N`.
pub fn multipart_etag(part_etags_hex: &[String]) -> Option<String> {
    let mut h = Md5::new();
    for e in part_etags_hex {
        h.update(&hex::decode(e).ok()?);
    }
    Some(format!("{}-{}", hex::encode(h.finalize()), part_etags_hex.len()))
}

/// The part checksums a multipart object keeps: every part's, in order,
/// when at least one part has a checksum; none otherwise.
pub fn kept_part_checksums<'a>(parts: impl Iterator<Item = &'a Checksums> + Clone) -> Vec<Checksums> {
    if parts.clone().all(Checksums::is_empty) {
        return Vec::new();
    }
    parts.cloned().collect()
}

/// Tags as stored in `user.s3.tags`.
pub type TagList = Vec<(String, String)>;

pub fn encode_tags(tags: &TagList) -> Vec<u8> {
    serde_json::to_vec(tags).unwrap_or_default()
}

pub fn decode_tags(bytes: &[u8]) -> TagList {
    serde_json::from_slice(bytes).unwrap_or_default()
}

/// Parses the `x-amz-tagging` header (URL query form) and checks S3's limits.
pub fn parse_tagging_header(h: &str) -> Result<TagList, String> {
    let mut tags = TagList::new();
    for pair in h.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| format!("tag {s:?} is not UTF-8"))
        };
        tags.push((dec(k)?, dec(v)?));
    }
    check_tags(&tags)?;
    Ok(tags)
}

pub fn check_tags(tags: &TagList) -> Result<(), String> {
    if tags.len() > MAX_TAGS {
        return Err(format!("{} tags (at most {MAX_TAGS})", tags.len()));
    }
    for (i, (k, v)) in tags.iter().enumerate() {
        if k.is_empty() || k.chars().count() > 128 || v.chars().count() > 256 {
            return Err(format!("tag {k:?}: keys are 1..=128 characters, values at most 256"));
        }
        if tags[..i].iter().any(|(k2, _)| k2 == k) {
            return Err(format!("tag key {k:?} appears twice"));
        }
    }
    Ok(())
}

/// The record of a directory object: a directory's mtime changes with its
/// entries, so only readability is checked; a directory without a record
/// is not an object.
pub fn effective_dir(inode: &Inode, record: Option<&[u8]>) -> ObjectMeta {
    let parsed = record.and_then(|b| serde_json::from_slice::<ObjectMeta>(b).ok());
    parsed.unwrap_or_else(|| ObjectMeta { etag: EMPTY_MD5.into(), size: 0, mtime_ns: inode.mtime_ns, ..ObjectMeta::default() })
}

/// MD5 of no bytes: the ETag of an empty object.
pub const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_etag_is_md5_of_part_md5s() {
        // Two parts whose MD5s are those of "a" and "b".
        let a = "0cc175b9c0f1b6a831c399e269772661".to_string();
        let b = "92eb5ffee6ae2fec3ad71c777531578f".to_string();
        let e = multipart_etag(&[a, b]).unwrap();
        assert!(e.ends_with("-2"));
        assert_eq!(e.len(), 32 + 2);
        assert!(multipart_etag(&["zz".into()]).is_none());
    }

    #[test]
    fn part_checksums_are_kept_only_when_a_part_has_one() {
        let none = [Checksums::default(), Checksums::default()];
        assert!(kept_part_checksums(none.iter()).is_empty());
        let one = [Checksums::default(), Checksums { crc32: Some("AAAAAA==".into()), ..Checksums::default() }];
        assert_eq!(kept_part_checksums(one.iter()), one.to_vec());
        // Records written before the field existed read as "no part checksums".
        let old: ObjectMeta = serde_json::from_str(r#"{"etag":"e","size":1,"mtime_ns":2,"part_sizes":[1]}"#).unwrap();
        assert!(old.part_checksums.is_empty());
    }

    #[test]
    fn tagging_header_is_parsed_and_checked() {
        assert_eq!(parse_tagging_header("a=1&b%20c=x+y").unwrap(), vec![("a".into(), "1".into()), ("b c".into(), "x y".into())]);
        assert!(parse_tagging_header("a=1&a=2").is_err());
        assert!(parse_tagging_header(&(0..11).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join("&")).is_err());
    }
}
