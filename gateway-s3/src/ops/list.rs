//! ListObjects, ListObjectsV2, ListObjectVersions.

use super::object::timestamp;
use super::versioning::{parse_version, version_name, StoreEntry};
use super::Gateway;
use crate::error;
use crate::list::{self, url_encode_key, ListPage, ListRequest, ListedObject, MAX_KEYS};
use crate::paths::Layout;
use crate::versions::{self, VersionRef};
use fskv_client::keywalk::Walker as KeyWalker;
use fskv_types::InodeId;
use s3s::dto::*;
use s3s::S3Error;
use std::collections::VecDeque;

fn max_keys(m: Option<i32>) -> Result<usize, S3Error> {
    match m {
        None => Ok(MAX_KEYS),
        Some(n) if n < 0 => Err(error::invalid_argument("max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(MAX_KEYS)),
    }
}

fn url_mode(e: &Option<EncodingType>) -> Result<bool, S3Error> {
    match e {
        None => Ok(false),
        Some(e) if e.as_str() == EncodingType::URL => Ok(true),
        Some(e) => Err(error::invalid_argument(format!("encoding-type {:?}: only 'url' is defined", e.as_str()))),
    }
}

fn enc(url: bool, s: &str) -> String {
    if url {
        url_encode_key(s)
    } else {
        s.to_string()
    }
}

/// The Contents of a page; `with_owner`: each names its owner (v1 always,
/// v2 with `fetch-owner=true`, as S3 does).
fn contents(page: &ListPage, url: bool, with_owner: bool) -> Vec<Object> {
    page.objects
        .iter()
        .map(|o| Object {
            key: Some(enc(url, &o.key)),
            size: Some(o.meta.size as i64),
            e_tag: Some(ETag::Strong(o.meta.etag.clone())),
            last_modified: Some(timestamp(o.meta.mtime_ns)),
            storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
            owner: with_owner.then(super::owner),
            ..Object::default()
        })
        .collect()
}

/// The delimiter as requested: an empty `delimiter=` is no delimiter (no
/// roll-up and no Delimiter element), as S3 treats it.
fn delimiter(d: &Option<String>) -> Option<String> {
    d.clone().filter(|d| !d.is_empty())
}

fn prefixes(page: &ListPage, url: bool) -> Vec<CommonPrefix> {
    page.common_prefixes.iter().map(|p| CommonPrefix { prefix: Some(enc(url, p)) }).collect()
}

impl Gateway {
    async fn list_page(&self, bucket: &str, req: ListRequest) -> Result<ListPage, S3Error> {
        let b = self.store.bucket(bucket).await?;
        match self.store.layout(b.id).await? {
            Layout::Tree => list::list(&self.store.fs, b.id, &req).await,
            Layout::Flat => list::list_flat(&self.store.fs, b.id, &req).await,
        }
    }

    pub async fn list_v1(&self, input: &ListObjectsInput) -> Result<ListObjectsOutput, S3Error> {
        let url = url_mode(&input.encoding_type)?;
        let req = ListRequest {
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: delimiter(&input.delimiter),
            after: input.marker.clone().unwrap_or_default().into_bytes(),
            max_keys: max_keys(input.max_keys)?,
        };
        let page = self.list_page(&input.bucket, req.clone()).await?;
        let has_delim = req.delimiter.is_some();
        Ok(ListObjectsOutput {
            name: Some(input.bucket.clone()),
            prefix: Some(enc(url, &req.prefix)),
            marker: Some(enc(url, input.marker.as_deref().unwrap_or(""))),
            max_keys: Some(input.max_keys.unwrap_or(MAX_KEYS as i32)),
            is_truncated: Some(page.truncated),
            next_marker: (page.truncated && has_delim).then(|| page.last.clone().map(|k| enc(url, &k))).flatten(),
            contents: Some(contents(&page, url, true)),
            common_prefixes: Some(prefixes(&page, url)),
            delimiter: req.delimiter.as_ref().map(|d| enc(url, d)),
            encoding_type: input.encoding_type.clone(),
            ..ListObjectsOutput::default()
        })
    }

    pub async fn list_v2(&self, input: &ListObjectsV2Input) -> Result<ListObjectsV2Output, S3Error> {
        let url = url_mode(&input.encoding_type)?;
        let after = match (&input.continuation_token, &input.start_after) {
            (Some(t), _) => list::decode_token(t)?,
            (None, Some(s)) => s.clone().into_bytes(),
            (None, None) => Vec::new(),
        };
        let req = ListRequest {
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: delimiter(&input.delimiter),
            after,
            max_keys: max_keys(input.max_keys)?,
        };
        let page = self.list_page(&input.bucket, req.clone()).await?;
        let key_count = (page.objects.len() + page.common_prefixes.len()) as i32;
        Ok(ListObjectsV2Output {
            name: Some(input.bucket.clone()),
            prefix: Some(enc(url, &req.prefix)),
            max_keys: Some(input.max_keys.unwrap_or(MAX_KEYS as i32)),
            key_count: Some(key_count),
            continuation_token: input.continuation_token.clone(),
            is_truncated: Some(page.truncated),
            next_continuation_token: page.next_after.as_deref().map(list::encode_token),
            contents: Some(contents(&page, url, input.fetch_owner == Some(true))),
            common_prefixes: Some(prefixes(&page, url)),
            delimiter: req.delimiter.as_ref().map(|d| enc(url, d)),
            encoding_type: input.encoding_type.clone(),
            start_after: input.start_after.clone().map(|s| enc(url, &s)),
            ..ListObjectsV2Output::default()
        })
    }

    /// ListObjectVersions: the current objects (each the latest version of
    /// its key) merged in key order with the bucket's version store
    /// (`crate::versions`: per key, newest first). A page is computed from
    /// its markers alone: `key-marker` resumes after every version of that
    /// key, with `version-id-marker` after that version of it. Roll-up by
    /// delimiter skips, in both streams, every key under a common prefix.
    pub async fn list_versions(&self, input: &ListObjectVersionsInput) -> Result<(ListObjectVersionsOutput, VersionsOrder), S3Error> {
        let url = url_mode(&input.encoding_type)?;
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let delim = delimiter(&input.delimiter);
        let key_marker = input.key_marker.clone().filter(|k| !k.is_empty());
        let vid_marker = input.version_id_marker.clone().filter(|v| !v.is_empty());
        let vref = match (&key_marker, &vid_marker) {
            (None, Some(_)) => return Err(error::invalid_argument("a version-id-marker needs a key-marker")),
            (_, Some(v)) => Some(parse_version(v)?),
            _ => None,
        };
        self.store.bucket(&input.bucket).await?;
        let store = self.version_store(&input.bucket, false).await?;
        let mut merge = VersionMerge {
            current: VecDeque::new(),
            current_after: key_marker.clone().unwrap_or_default().into_bytes(),
            current_done: false,
            noncurrent: None,
            store,
            bucket: input.bucket.clone(),
            prefix: prefix.clone(),
            page_hint: (max + 1).min(MAX_KEYS),
        };
        // Where the store walk starts: after the marker version (a null one
        // is found by its time), or after every entry of the key marker.
        let start = match (&key_marker, &vref) {
            (Some(k), Some(VersionRef::Id(id))) => (versions::store_key(k, id), false),
            (Some(k), Some(VersionRef::Null)) => match store {
                Some(s) => match self.store_null(s, k).await? {
                    Some(e) => (versions::store_key(k, &e.sort), false),
                    None => (versions::store_prefix(k), true),
                },
                None => (Vec::new(), true),
            },
            (Some(k), None) => {
                let mut b = versions::store_prefix(k);
                b.push(0xFF);
                (b, false)
            }
            (None, _) => (Vec::new(), true),
        };
        let start = if start.0.as_slice() < prefix.as_bytes() { (prefix.as_bytes().to_vec(), true) } else { start };
        merge.restart_store(self, &start.0, start.1);

        let mut items: Vec<VersionItem> = Vec::new();
        let mut current_key: Option<String> = None;
        let mut newest_seen: Option<String> = None;
        while items.len() <= max {
            let Some(next) = merge.next(self).await? else { break };
            let key = next.key().to_string();
            if let Some(d) = delim.as_deref() {
                if let Some(i) = key[prefix.len()..].find(d) {
                    let cp = format!("{prefix}{}", &key[prefix.len()..prefix.len() + i + d.len()]);
                    if key_marker.as_deref().map_or(true, |m| cp.as_str() > m) {
                        items.push(VersionItem::Prefix(cp.clone()));
                    }
                    let mut after = cp.into_bytes();
                    after.push(0xFF);
                    merge.skip_past(self, &after);
                    continue;
                }
            }
            match next {
                Next::Current(o) => {
                    current_key = Some(o.key.clone());
                    newest_seen = Some(o.key.clone());
                    items.push(VersionItem::Current(o));
                }
                Next::Store(e) => {
                    // The newest entry of a key without a current version is
                    // its latest (a delete marker, by the store's invariant);
                    // entries after a marker within the key never are.
                    let resumed = key_marker.as_deref() == Some(e.key.as_str()) && vref.is_some();
                    let latest =
                        !resumed && current_key.as_deref() != Some(e.key.as_str()) && newest_seen.as_deref() != Some(e.key.as_str());
                    newest_seen = Some(e.key.clone());
                    items.push(VersionItem::Stored { latest, entry: e });
                }
            }
        }
        let truncated = items.len() > max;
        items.truncate(max);
        let mut entries: Vec<StoreEntry> = items
            .iter()
            .filter_map(|i| match i {
                VersionItem::Stored { entry, .. } => Some(StoreEntry::clone(entry)),
                _ => None,
            })
            .collect();
        self.fill_store_records(&mut entries).await?;
        let mut filled = entries.into_iter();
        let mut out = ListObjectVersionsOutput {
            name: Some(input.bucket.clone()),
            prefix: Some(enc(url, &prefix)),
            key_marker: input.key_marker.clone().map(|k| enc(url, &k)),
            version_id_marker: input.version_id_marker.clone(),
            max_keys: Some(input.max_keys.unwrap_or(MAX_KEYS as i32)),
            is_truncated: Some(truncated),
            delimiter: delim.as_ref().map(|d| enc(url, d)),
            encoding_type: input.encoding_type.clone(),
            ..ListObjectVersionsOutput::default()
        };
        let (mut versions_out, mut markers, mut cps) = (Vec::new(), Vec::new(), Vec::new());
        let mut order = VersionsOrder(Vec::new());
        let mut last: Option<(String, Option<String>)> = None;
        for item in items {
            match item {
                VersionItem::Prefix(p) => {
                    last = Some((p.clone(), None));
                    cps.push(CommonPrefix { prefix: Some(enc(url, &p)) });
                }
                VersionItem::Current(o) => {
                    let vid = version_name(&o.meta);
                    last = Some((o.key.clone(), Some(vid.clone())));
                    versions_out.push(object_version(url, &o.key, &vid, true, &o.meta));
                    order.0.push(false);
                }
                VersionItem::Stored { latest, .. } => {
                    let Some(e) = filled.next() else { continue };
                    let vid = e.version_id().to_string();
                    last = Some((e.key.clone(), Some(vid.clone())));
                    if e.meta.delete_marker {
                        markers.push(DeleteMarkerEntry {
                            is_latest: Some(latest),
                            key: Some(enc(url, &e.key)),
                            last_modified: Some(timestamp(e.meta.mtime_ns)),
                            owner: Some(super::owner()),
                            version_id: Some(vid),
                        });
                        order.0.push(true);
                    } else {
                        versions_out.push(object_version(url, &e.key, &vid, latest, &e.meta));
                        order.0.push(false);
                    }
                }
            }
        }
        if truncated {
            if let Some((k, v)) = last {
                out.next_key_marker = Some(enc(url, &k));
                out.next_version_id_marker = v;
            }
        }
        out.versions = Some(versions_out);
        out.delete_markers = Some(markers);
        out.common_prefixes = Some(cps);
        Ok((out, order))
    }
}

/// The order of a ListObjectVersions page's entries (`true`: a delete
/// marker, `false`: a version), which s3s's two lists lose: the server puts
/// it back into the XML (`server::interleave_versions`), so that the
/// entries come in key order, newest first within a key, as AWS sends them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionsOrder(pub Vec<bool>);

fn object_version(url: bool, key: &str, vid: &str, latest: bool, meta: &crate::objmeta::ObjectMeta) -> ObjectVersion {
    ObjectVersion {
        key: Some(enc(url, key)),
        version_id: Some(vid.to_string()),
        is_latest: Some(latest),
        size: Some(meta.size as i64),
        e_tag: Some(ETag::Strong(meta.etag.clone())),
        last_modified: Some(timestamp(meta.mtime_ns)),
        storage_class: Some(ObjectVersionStorageClass::from_static(ObjectVersionStorageClass::STANDARD)),
        owner: Some(super::owner()),
        ..ObjectVersion::default()
    }
}

/// An entry of a ListObjectVersions page.
enum VersionItem {
    /// A current object: the latest version of its key.
    Current(Box<ListedObject>),
    /// A version or delete marker of the store (its record read later).
    Stored {
        latest: bool,
        entry: Box<StoreEntry>,
    },
    Prefix(String),
}

enum Next {
    Current(Box<ListedObject>),
    Store(Box<StoreEntry>),
}

impl Next {
    fn key(&self) -> &str {
        match self {
            Next::Current(o) => &o.key,
            Next::Store(e) => &e.key,
        }
    }
}

/// The two ordered streams of ListObjectVersions.
struct VersionMerge {
    current: VecDeque<ListedObject>,
    /// Where the next page of current objects starts (exclusive).
    current_after: Vec<u8>,
    current_done: bool,
    noncurrent: Option<(KeyWalker, Option<StoreEntry>)>,
    store: Option<InodeId>,
    bucket: String,
    prefix: String,
    page_hint: usize,
}

impl VersionMerge {
    fn restart_store(&mut self, gw: &Gateway, start: &[u8], inclusive: bool) {
        self.noncurrent = self.store.map(|s| {
            let start = (!start.is_empty()).then_some((start, inclusive));
            (KeyWalker::new(gw.store.fs.clone(), s, start), None)
        });
    }

    /// Drops everything before `after` (exclusive) from both streams.
    fn skip_past(&mut self, gw: &Gateway, after: &[u8]) {
        self.current.clear();
        self.current_after = after.to_vec();
        self.current_done = false;
        self.restart_store(gw, after, false);
    }

    async fn head_current(&mut self, gw: &Gateway, bucket: &str) -> Result<Option<&ListedObject>, S3Error> {
        if self.current.is_empty() && !self.current_done {
            let req =
                ListRequest { prefix: self.prefix.clone(), delimiter: None, after: self.current_after.clone(), max_keys: self.page_hint };
            let page = gw.list_page(bucket, req).await?;
            self.current_done = !page.truncated;
            if let Some(n) = page.next_after {
                self.current_after = n;
            }
            self.current.extend(page.objects);
        }
        Ok(self.current.front())
    }

    async fn head_store(&mut self) -> Result<Option<&StoreEntry>, S3Error> {
        let Some((walker, head)) = &mut self.noncurrent else { return Ok(None) };
        while head.is_none() {
            let Some(found) = walker.next().await.map_err(|e| error::from_meta(e, "versions"))? else { break };
            let Some((key, sort)) = versions::split_store_key(&found.key) else { continue };
            if !key.starts_with(&self.prefix) {
                if key.as_str() > self.prefix.as_str() {
                    break;
                }
                continue;
            }
            let Some(inode) = found.entry.attr else { continue };
            head.replace(StoreEntry { key, sort, parent: found.dir, name: found.entry.name, inode, meta: Default::default() });
        }
        Ok(head.as_ref())
    }

    async fn next(&mut self, gw: &Gateway) -> Result<Option<Next>, S3Error> {
        let bucket = self.bucket.clone();
        let a = self.head_current(gw, &bucket).await?.map(|o| o.key.clone());
        let b = self.head_store().await?.map(|e| e.key.clone());
        let take_current = match (&a, &b) {
            (None, None) => return Ok(None),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => a.as_bytes() <= b.as_bytes(),
        };
        if take_current {
            Ok(self.current.pop_front().map(|o| Next::Current(Box::new(o))))
        } else {
            Ok(self.noncurrent.as_mut().and_then(|(_, h)| h.take()).map(|e| Next::Store(Box::new(e))))
        }
    }
}
