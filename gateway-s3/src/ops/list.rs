//! ListObjects, ListObjectsV2, ListObjectVersions.

use super::object::timestamp;
use super::Gateway;
use crate::error;
use crate::list::{self, url_encode_key, ListPage, ListRequest, MAX_KEYS};
use crate::paths::Layout;
use s3s::dto::*;
use s3s::S3Error;

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

    /// The current objects, each as version `null` (no versioning).
    pub async fn list_versions(&self, input: &ListObjectVersionsInput) -> Result<ListObjectVersionsOutput, S3Error> {
        let url = url_mode(&input.encoding_type)?;
        if input.version_id_marker.as_deref().is_some_and(|v| !v.is_empty() && v != "null") {
            return Err(error::invalid_argument("version-id-marker: this store has only version 'null'"));
        }
        let req = ListRequest {
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: delimiter(&input.delimiter),
            after: input.key_marker.clone().unwrap_or_default().into_bytes(),
            max_keys: max_keys(input.max_keys)?,
        };
        let page = self.list_page(&input.bucket, req.clone()).await?;
        let versions = page
            .objects
            .iter()
            .map(|o| ObjectVersion {
                key: Some(enc(url, &o.key)),
                version_id: Some("null".into()),
                is_latest: Some(true),
                size: Some(o.meta.size as i64),
                e_tag: Some(ETag::Strong(o.meta.etag.clone())),
                last_modified: Some(timestamp(o.meta.mtime_ns)),
                storage_class: Some(ObjectVersionStorageClass::from_static(ObjectVersionStorageClass::STANDARD)),
                owner: Some(super::owner()),
                ..ObjectVersion::default()
            })
            .collect();
        Ok(ListObjectVersionsOutput {
            name: Some(input.bucket.clone()),
            prefix: Some(enc(url, &req.prefix)),
            key_marker: input.key_marker.clone().map(|k| enc(url, &k)),
            version_id_marker: input.version_id_marker.clone(),
            max_keys: Some(input.max_keys.unwrap_or(MAX_KEYS as i32)),
            is_truncated: Some(page.truncated),
            next_key_marker: page.truncated.then(|| page.last.clone().map(|k| enc(url, &k))).flatten(),
            next_version_id_marker: page.truncated.then(|| "null".to_string()),
            versions: Some(versions),
            common_prefixes: Some(prefixes(&page, url)),
            delimiter: req.delimiter.as_ref().map(|d| enc(url, d)),
            encoding_type: input.encoding_type.clone(),
            ..ListObjectVersionsOutput::default()
        })
    }
}
