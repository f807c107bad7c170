//! ListObjects (v1, v2) and ListObjectVersions over [`crate::walk`] (tree
//! buckets) or [`fskv_client::keywalk`] (flat buckets).
//!
//! A page is computed from its start position alone: the continuation
//! token is the position (the last key, or a common prefix followed by
//! 0xFF, which skips every key below it), base64url-encoded. Nothing is
//! kept between requests, so any gateway can serve the next page.

use crate::error;
use crate::objmeta::{self, ObjectMeta, XATTR_META};
use crate::walk::{Bound, Event, Walker};
use base64::Engine as _;
use fskv_client::keywalk::Walker as KeyWalker;
use fskv_client::FsClient;
use fskv_proto::meta::{Inode, MetaOp, MetaReply, MAX_BATCH_OPS};
use fskv_types::{ErrorCode, InodeId};
use s3s::S3Error;

/// Most keys one page returns, as S3 caps it.
pub const MAX_KEYS: usize = 1000;

/// What to list.
#[derive(Clone, Debug, Default)]
pub struct ListRequest {
    pub prefix: String,
    /// `None` or empty: no roll-up.
    pub delimiter: Option<String>,
    /// Keys strictly after this position (bytes; may end in 0xFF).
    pub after: Vec<u8>,
    pub max_keys: usize,
}

#[derive(Clone, Debug)]
pub struct ListedObject {
    pub key: String,
    pub meta: ObjectMeta,
}

#[derive(Clone, Debug, Default)]
pub struct ListPage {
    pub objects: Vec<ListedObject>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
    /// The last key or common prefix of the page (S3 v1 NextMarker).
    pub last: Option<String>,
    /// Where the next page starts (v2 continuation token), when truncated.
    pub next_after: Option<Vec<u8>>,
}

pub fn encode_token(after: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(after)
}

pub fn decode_token(token: &str) -> Result<Vec<u8>, S3Error> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| error::invalid_argument("the continuation token is not one this gateway made"))
}

enum Item {
    Object { key: String, inode: Inode, record: Option<Vec<u8>>, dir: bool },
    Prefix(String),
}

impl Item {
    fn key(&self) -> &str {
        match self {
            Item::Object { key, .. } | Item::Prefix(key) => key,
        }
    }
}

/// Lists `bucket` (its directory inode) as `req` asks.
pub async fn list(fs: &FsClient, bucket: InodeId, req: &ListRequest) -> Result<ListPage, S3Error> {
    if req.max_keys == 0 {
        return Ok(ListPage::default());
    }
    let max = req.max_keys.min(MAX_KEYS);
    if !prefix_can_match(&req.prefix) {
        return Ok(ListPage::default());
    }
    let delim = req.delimiter.as_deref().filter(|d| !d.is_empty());
    // The directory the prefix fully names, and the prefix of its keys.
    let (dir_part, base) = match req.prefix.rfind('/') {
        Some(i) => (&req.prefix[..i], req.prefix[..=i].to_string()),
        None => ("", String::new()),
    };
    let Some(start_dir) = resolve_dir(fs, bucket, dir_part).await? else {
        return Ok(ListPage::default());
    };
    // The bound: after `after`, and at least `prefix` (inclusive).
    let prefix_b = req.prefix.as_bytes();
    let absolute = if req.after.as_slice() >= prefix_b {
        Bound { key: req.after.clone(), inclusive: false }
    } else {
        Bound { key: prefix_b.to_vec(), inclusive: true }
    };
    let Some(rel) = absolute.key.strip_prefix(base.as_bytes()) else {
        // The bound is past every key under `base`.
        return Ok(ListPage::default());
    };
    let bound = Bound { key: rel.to_vec(), inclusive: absolute.inclusive };
    let page_hint = u32::try_from(max + 1).unwrap_or(1000);
    let mut walker = Walker::new(fs, start_dir, base.clone(), Some(bound), page_hint).await.map_err(walk_err)?;

    let mut items: Vec<Item> = Vec::new();
    let mut last_prefix: Option<String> = None;
    // A prefix ending in '/' names a directory that may itself be an object
    // (`d/`): it is the first key of the listing.
    if !base.is_empty() && base == req.prefix && base.as_bytes() > req.after.as_slice() {
        if let Some(record) = dir_record(fs, start_dir).await? {
            if let Ok(inode) = fs.meta().stat(start_dir).await {
                items.push(Item::Object { key: base.clone(), inode, record: Some(record), dir: true });
            }
        }
    }
    while items.len() <= max {
        let Some(ev) = walker.next().await.map_err(walk_err)? else { break };
        let (key, is_dir) = match &ev {
            Event::Object { key, .. } => (key.clone(), false),
            Event::Dir { key, .. } => (key.clone(), true),
        };
        if !key.starts_with(&req.prefix) {
            if is_dir && req.prefix.starts_with(&key) {
                continue; // a directory on the way to the prefix
            }
            if key.as_str() > req.prefix.as_str() {
                break; // past every key with the prefix
            }
            walker.skip_dir();
            continue;
        }
        let rest = &key[req.prefix.len()..];
        if let Some(d) = delim {
            if let Some(i) = rest.find(d) {
                let cp = format!("{}{}", req.prefix, &rest[..i + d.len()]);
                let whole_subtree = is_dir && i + d.len() <= rest.len();
                if last_prefix.as_deref() != Some(cp.as_str()) && cp.as_bytes() > req.after.as_slice() {
                    let nonempty = match &ev {
                        Event::Dir { inode, record, .. } if whole_subtree => record.is_some() || has_entries(fs, inode.id).await?,
                        _ => true,
                    };
                    if nonempty {
                        items.push(Item::Prefix(cp.clone()));
                        last_prefix = Some(cp.clone());
                    }
                }
                if whole_subtree {
                    walker.skip_dir();
                } else if !is_dir || i + d.len() <= rest.len() {
                    // Skip every key under the common prefix: restart after it.
                    let mut after = cp.into_bytes();
                    after.push(0xFF);
                    let rel = after.strip_prefix(base.as_bytes()).map(<[u8]>::to_vec).unwrap_or_default();
                    walker = Walker::new(fs, start_dir, base.clone(), Some(Bound { key: rel, inclusive: false }), page_hint)
                        .await
                        .map_err(walk_err)?;
                }
                continue;
            }
        }
        match ev {
            Event::Object { key, inode } => items.push(Item::Object { key, inode, record: None, dir: false }),
            Event::Dir { key, inode, record: Some(r) } => items.push(Item::Object { key, inode, record: Some(r), dir: true }),
            Event::Dir { .. } => {}
        }
    }
    into_page(fs, items, max).await
}

/// The page of the first `max` of `items` (one more means truncated),
/// their records read in batches.
async fn into_page(fs: &FsClient, mut items: Vec<Item>, max: usize) -> Result<ListPage, S3Error> {
    let truncated = items.len() > max;
    items.truncate(max);
    let mut page = ListPage { truncated, ..ListPage::default() };
    page.last = items.last().map(|i| i.key().to_string());
    if truncated {
        page.next_after = items.last().map(|i| match i {
            Item::Prefix(p) => {
                let mut v = p.as_bytes().to_vec();
                v.push(0xFF);
                v
            }
            Item::Object { key, .. } => key.as_bytes().to_vec(),
        });
    }
    fill_records(fs, &mut items).await?;
    for item in items {
        match item {
            Item::Prefix(p) => page.common_prefixes.push(p),
            Item::Object { key, inode, record, dir } => {
                let meta =
                    if dir { objmeta::effective_dir(&inode, record.as_deref()) } else { objmeta::effective(&inode, record.as_deref()) };
                page.objects.push(ListedObject { key, meta });
            }
        }
    }
    Ok(page)
}

/// Lists the flat bucket `bucket` (its directory inode) as `req` asks:
/// a [`fskv_client::keywalk`] walk of the encoded names from
/// `max(after, prefix)`, which yields keys in byte order, so the first key
/// without the prefix ends the page. A common prefix is rolled up from the
/// first key under it, and the walk then starts again after every key
/// under it (the prefix followed by 0xFF, a byte no UTF-8 key has): a page
/// costs O(entries returned + common prefixes × depth) meta calls.
pub async fn list_flat(fs: &FsClient, bucket: InodeId, req: &ListRequest) -> Result<ListPage, S3Error> {
    if req.max_keys == 0 || req.prefix.len() > crate::paths::MAX_KEY_BYTES {
        return Ok(ListPage::default());
    }
    let max = req.max_keys.min(MAX_KEYS);
    let delim = req.delimiter.as_deref().filter(|d| !d.is_empty());
    let prefix_b = req.prefix.as_bytes();
    let start = if req.after.as_slice() >= prefix_b { (req.after.clone(), false) } else { (prefix_b.to_vec(), true) };
    let mut walker = KeyWalker::new(fs.clone(), bucket, Some((&start.0, start.1)));
    let mut items: Vec<Item> = Vec::new();
    while items.len() <= max {
        let Some(found) = walker.next().await.map_err(|e| error::from_meta(e, "listing"))? else { break };
        // Names that are not a UTF-8 key's (made through the mount) are no object.
        let (Ok(key), Some(inode)) = (String::from_utf8(found.key), found.entry.attr) else { continue };
        let Some(rest) = key.strip_prefix(req.prefix.as_str()) else { break };
        // Keys no S3 request can name (a KV namespace's, docs/kv.md) are no object either.
        if key.len() > crate::paths::MAX_KEY_BYTES || key.contains('\0') {
            continue;
        }
        if let Some(i) = delim.and_then(|d| rest.find(d).map(|i| i + d.len())) {
            let cp = format!("{}{}", req.prefix, &rest[..i]);
            let mut after = cp.clone().into_bytes();
            after.push(0xFF);
            if cp.as_bytes() > req.after.as_slice() {
                items.push(Item::Prefix(cp));
            }
            walker = KeyWalker::new(fs.clone(), bucket, Some((&after, false)));
            continue;
        }
        items.push(Item::Object { key, inode, record: None, dir: false });
    }
    into_page(fs, items, max).await
}

fn walk_err((code, msg): (ErrorCode, String)) -> S3Error {
    error::from_code(code, "listing", &msg)
}

async fn dir_record(fs: &FsClient, dir: InodeId) -> Result<Option<Vec<u8>>, S3Error> {
    match fs.meta().get_xattr(dir, XATTR_META).await {
        Ok(r) => Ok(Some(r)),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(error::from_meta(e, "listing")),
    }
}

async fn has_entries(fs: &FsClient, dir: InodeId) -> Result<bool, S3Error> {
    match fs.meta().readdir(dir, "", 1, false).await {
        Ok((entries, _)) => Ok(!entries.is_empty()),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(false),
        Err(e) => Err(error::from_meta(e, "listing")),
    }
}

/// Whether some key the gateway accepts ([`crate::paths::parse_key`]) can
/// start with `prefix`: every component before its last `/` must be one a
/// key may have (not empty — so no leading `/` and no `//` —, not `.` or
/// `..`, no NUL, at most 255 bytes), and the rest must fit in a component.
/// A prefix that names no path matches nothing (it must not be resolved
/// as if the empty components were not there).
pub fn prefix_can_match(prefix: &str) -> bool {
    if prefix.len() > crate::paths::MAX_KEY_BYTES || prefix.contains('\0') {
        return false;
    }
    let (dirs, last) = match prefix.rfind('/') {
        Some(i) => (Some(&prefix[..i]), &prefix[i + 1..]),
        None => (None, prefix),
    };
    let component_ok = |c: &str| !c.is_empty() && c != "." && c != ".." && c.len() <= fskv_proto::meta::MAX_NAME_BYTES;
    dirs.map_or(true, |d| d.split('/').all(component_ok)) && last.len() <= fskv_proto::meta::MAX_NAME_BYTES
}

/// The directory `path` (components joined by `/`) below `bucket`, if it is one.
async fn resolve_dir(fs: &FsClient, bucket: InodeId, path: &str) -> Result<Option<InodeId>, S3Error> {
    let mut cur = bucket;
    for name in path.split('/').filter(|c| !c.is_empty()) {
        match fs.meta().lookup(cur, name).await {
            Ok(i) if i.dir().is_some() => cur = i.id,
            Ok(_) => return Ok(None),
            Err(e) if e.code() == ErrorCode::NotFound || e.code() == ErrorCode::InvalidArgument || e.code() == ErrorCode::NameTooLong => {
                return Ok(None)
            }
            Err(e) => return Err(error::from_meta(e, "listing")),
        }
    }
    Ok(Some(cur))
}

/// Reads the `user.s3.meta` records of the page's files in batches.
async fn fill_records(fs: &FsClient, items: &mut [Item]) -> Result<(), S3Error> {
    let wanted: Vec<usize> =
        items.iter().enumerate().filter(|(_, i)| matches!(i, Item::Object { record: None, dir: false, .. })).map(|(n, _)| n).collect();
    for batch in wanted.chunks(MAX_BATCH_OPS.min(256)) {
        let ops = batch
            .iter()
            .filter_map(|&n| match &items[n] {
                Item::Object { inode, .. } => Some(MetaOp::GetXattr { inode: inode.id, name: XATTR_META.into() }),
                Item::Prefix(_) => None,
            })
            .collect();
        let replies = fs.meta().batch(ops).await.map_err(|e| error::from_meta(e, "listing"))?;
        for (&n, reply) in batch.iter().zip(replies) {
            if let (Item::Object { record, .. }, Ok(MetaReply::Xattr(d))) = (&mut items[n], reply) {
                *record = Some(d);
            }
        }
    }
    Ok(())
}

/// S3's `encoding-type=url` form of a key: every byte but unreserved
/// characters and `/` percent-encoded.
pub fn url_encode_key(key: &str) -> String {
    const SET: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');
    percent_encoding::utf8_percent_encode(key, SET).to_string()
}

#[cfg(test)]
mod tests {
    use super::prefix_can_match;

    #[test]
    fn prefixes_that_name_no_path_match_nothing() {
        for ok in ["", "a", "a/", "a/b", "a/b/", ".", "..", "a/.", "a/..x", "a/.b/", "é/"] {
            assert!(prefix_can_match(ok), "{ok:?} can start a key");
        }
        for bad in ["/", "//", "/a", "a//b", "a//", "./x", "../", "a/./b", "a/../", "a\0b"] {
            assert!(!prefix_can_match(bad), "{bad:?} starts no key");
        }
        assert!(!prefix_can_match(&format!("{}/", "c".repeat(256))));
        assert!(!prefix_can_match(&"c".repeat(256)));
        assert!(prefix_can_match(&format!("{}/", "c".repeat(255))));
    }
}
