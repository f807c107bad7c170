//! Multipart uploads.
//!
//! An upload is a directory `ROOT/.fskv-uploads/<bucket>/<upload id>`; its
//! `user.s3.upload` xattr is the [`UploadRecord`] (key, headers, metadata,
//! tags, start time). Part `n` is the file `%05d` in it, published
//! atomically (a re-sent part replaces the old one) with its own
//! `user.s3.meta` record (ETag, size, checksums). Completion copies the
//! parts into one temp file inside the cluster (storage-side copy, no data
//! through the gateway), publishes it with the `-N` ETag, then removes the
//! upload directory. Abort removes it at once; uploads older than
//! `multipart_expiry_ms` are removed by the writer's expiry scan.

use super::object::{self, find_object, headers_from, parse, timestamp, user_meta};
use super::write::{self, Data};
use super::Gateway;
use crate::body::{self, Digests};
use crate::error;
use crate::objmeta::{self, Checksums, Headers, ObjectMeta, TagList, XATTR_META};
use crate::store::{DIR_MODE, FILE_MODE, UPLOADS_DIR};
use fskv_types::meta::{Inode, MetaOp, MetaReply, PublishAttrs, XattrFlag};
use fskv_types::{ErrorCode, InodeId};
use http::HeaderMap;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const XATTR_UPLOAD: &str = "user.s3.upload";

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct UploadRecord {
    pub key: String,
    pub initiated_ns: u64,
    #[serde(default)]
    pub headers: Headers,
    #[serde(default)]
    pub user: BTreeMap<String, String>,
    #[serde(default)]
    pub tags: TagList,
    #[serde(default)]
    pub checksum_algorithm: Option<String>,
}

fn part_name(n: i32) -> String {
    format!("{n:05}")
}

fn new_upload_id() -> String {
    use rand::Rng as _;
    let r: u128 = rand::thread_rng().gen();
    format!("{:016x}{:032x}", write::now_ns(), r)
}

fn check_upload_id(id: &str) -> Result<(), S3Error> {
    if id.len() == 48 && id.bytes().all(|c| c.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(error::no_such_upload(id))
    }
}

struct Upload {
    dir: InodeId,
    record: UploadRecord,
}

impl Gateway {
    fn check_part_number(&self, n: i32) -> Result<(), S3Error> {
        if n < 1 || n as u32 > self.cfg.limits.max_parts {
            return Err(error::invalid_argument(format!("part number {n}: parts are 1..={}", self.cfg.limits.max_parts)));
        }
        Ok(())
    }

    /// `ROOT/.fskv-uploads/<bucket>`, made when `create`.
    async fn uploads_dir(&self, bucket: &str, create: bool) -> Result<Option<InodeId>, S3Error> {
        let comps = [UPLOADS_DIR.to_string(), bucket.to_string()];
        if create {
            return self.store.ensure_dirs(self.store.root, &comps, bucket).await.map(Some);
        }
        Ok(self.store.ensure_dirs_existing(self.store.root, &comps).await)
    }

    async fn upload(&self, bucket: &str, key: &str, id: &str) -> Result<Upload, S3Error> {
        check_upload_id(id)?;
        self.store.bucket(bucket).await?;
        let dir = self.uploads_dir(bucket, false).await?.ok_or_else(|| error::no_such_upload(id))?;
        let up = match self.store.fs.meta().lookup(dir, id).await {
            Ok(i) if i.dir().is_some() => i,
            Ok(_) => return Err(error::no_such_upload(id)),
            Err(e) if e.code() == ErrorCode::NotFound => return Err(error::no_such_upload(id)),
            Err(e) => return Err(error::from_meta(e, id)),
        };
        let record = match self.store.fs.meta().get_xattr(up.id, XATTR_UPLOAD).await {
            Ok(b) => serde_json::from_slice::<UploadRecord>(&b).map_err(|_| error::no_such_upload(id))?,
            Err(e) if e.code() == ErrorCode::NotFound => return Err(error::no_such_upload(id)),
            Err(e) => return Err(error::from_meta(e, id)),
        };
        if record.key != key {
            return Err(error::no_such_upload(id));
        }
        Ok(Upload { dir: up.id, record })
    }

    pub async fn create_upload(&self, input: &CreateMultipartUploadInput) -> Result<CreateMultipartUploadOutput, S3Error> {
        let path = parse(&input.key)?;
        if path.dir_object {
            return Err(error::invalid_argument("multipart uploads of keys ending in '/' are not supported"));
        }
        self.store.bucket(&input.bucket).await?;
        let tags = match &input.tagging {
            Some(t) => objmeta::parse_tagging_header(t).map_err(error::invalid_argument)?,
            None => TagList::new(),
        };
        let record = UploadRecord {
            key: input.key.clone(),
            initiated_ns: write::now_ns(),
            headers: headers_from(
                input.content_type.clone(),
                input.content_encoding.clone(),
                input.content_disposition.clone(),
                input.content_language.clone(),
                input.cache_control.clone(),
                input.expires.as_ref(),
            ),
            user: user_meta(input.metadata.clone())?,
            tags,
            checksum_algorithm: input.checksum_algorithm.as_ref().map(|a| a.as_str().to_ascii_lowercase()),
        };
        let dir = self.uploads_dir(&input.bucket, true).await?.unwrap_or(self.store.root);
        let id = new_upload_id();
        let up = self.store.fs.meta().mkdir(dir, &id, DIR_MODE).await.map_err(|e| error::from_meta(e, &id))?;
        let bytes = serde_json::to_vec(&record).map_err(error::internal)?;
        if let Err(e) = self.store.fs.meta().set_xattr(up.id, XATTR_UPLOAD, &bytes, XattrFlag::Create).await {
            let _ = self.store.fs.meta().rmdir(dir, &id).await;
            return Err(error::from_meta(e, &id));
        }
        Ok(CreateMultipartUploadOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            upload_id: Some(id),
            checksum_algorithm: input.checksum_algorithm.clone(),
            ..CreateMultipartUploadOutput::default()
        })
    }

    pub async fn upload_part(
        &self,
        input: UploadPartInput,
        req_headers: &HeaderMap,
        trailers: Option<&s3s::TrailingHeaders>,
    ) -> Result<UploadPartOutput, S3Error> {
        self.check_part_number(input.part_number)?;
        let up = self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let mut algorithms = body::requested_algorithms(req_headers);
        if let Some(a) = &up.record.checksum_algorithm {
            if !algorithms.contains(a) {
                algorithms.push(a.clone());
            }
        }
        let mut digests = Digests::new(&algorithms);
        let limits = &self.cfg.limits;
        let data = write::receive(&self.store, up.dir, input.body, &mut digests, limits.max_part_bytes, limits).await?;
        let size = digests.size;
        let (md5, checksums) = digests.finish();
        let trailer_map = trailers.and_then(|t| t.take());
        body::verify(req_headers, trailer_map.as_ref(), &md5, &checksums)?;
        let meta = ObjectMeta { etag: hex::encode(md5), size, checksums, ..ObjectMeta::default() };
        let meta = self.publish_part(up.dir, input.part_number, &data, meta).await?;
        Ok(UploadPartOutput {
            e_tag: Some(ETag::Strong(meta.etag.clone())),
            checksum_crc32: meta.checksums.crc32.clone(),
            checksum_crc32c: meta.checksums.crc32c.clone(),
            checksum_crc64nvme: meta.checksums.crc64nvme.clone(),
            checksum_sha1: meta.checksums.sha1.clone(),
            checksum_sha256: meta.checksums.sha256.clone(),
            ..UploadPartOutput::default()
        })
    }

    async fn publish_part(&self, dir: InodeId, n: i32, data: &Data, mut meta: ObjectMeta) -> Result<ObjectMeta, S3Error> {
        meta.mtime_ns = write::now_ns();
        let attrs = PublishAttrs { length: None, mtime_ns: Some(meta.mtime_ns), xattrs: vec![(XATTR_META.into(), meta.encode())] };
        let name = part_name(n);
        let r = match data {
            Data::Inline(b) => self.store.fs.meta().create_write_publish(dir, &name, FILE_MODE, b, None, attrs).await.map_err(|e| (e.code(), e.to_string())),
            Data::Temp(h) => self.store.fs.publish(h, dir, &name, None, attrs).await.map_err(|e| (e.code(), e.to_string())),
        };
        match r {
            Ok(_) => Ok(meta),
            // The upload was completed or aborted meanwhile.
            Err((ErrorCode::NotFound, _)) => Err(error::no_such_upload("(this upload)")),
            Err((code, msg)) => Err(error::from_code(code, &name, &msg)),
        }
    }

    pub async fn upload_part_copy(&self, input: &UploadPartCopyInput) -> Result<UploadPartCopyOutput, S3Error> {
        self.check_part_number(input.part_number)?;
        let up = self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let CopySource::Bucket { bucket: src_bucket, key: src_key, .. } = &input.copy_source else {
            return Err(error::invalid_argument("copying from an access point is not supported"));
        };
        let src_path = parse(src_key)?;
        let sb = self.store.bucket(src_bucket).await?.id;
        let src = find_object(&self.store, sb, &src_path, src_key).await?.filter(|o| !o.dir).ok_or_else(|| error::no_such_key(src_key))?;
        object::check_read_conditions(
            &src.meta,
            input.copy_source_if_match.as_ref(),
            input.copy_source_if_none_match.as_ref(),
            input.copy_source_if_modified_since.as_ref(),
            input.copy_source_if_unmodified_since.as_ref(),
        )
        .map_err(|e| if e.code() == &S3ErrorCode::NotModified { error::precondition_failed("copy source condition") } else { e })?;
        let (start, end) = match &input.copy_source_range {
            None => (0, src.meta.size),
            Some(r) => parse_copy_range(r, src.meta.size)?,
        };
        if end - start > self.cfg.limits.max_part_bytes {
            return Err(S3Error::with_message(S3ErrorCode::EntityTooLarge, "the copied range is larger than a part may be"));
        }
        let data = self.copy_data(&src.inode, up.dir, start, end).await?;
        // The ETag of a part is the MD5 of its bytes. The copy itself stays
        // inside the cluster; the source range is read once here to hash it
        // (the source's own ETag is that MD5 when the whole single-part
        // source is copied).
        let whole = start == 0 && end == src.meta.size && !src.meta.etag.contains('-') && src.meta.etag.len() == 32;
        let etag = match (&data, whole) {
            (_, true) => src.meta.etag.clone(),
            (Data::Inline(b), false) => {
                let mut d = Digests::new(&[]);
                d.update(b);
                hex::encode(d.finish().0)
            }
            (Data::Temp(_), false) => self.md5_of(&src.inode, start, end).await?,
        };
        let meta = ObjectMeta { etag, size: end - start, ..ObjectMeta::default() };
        let meta = self.publish_part(up.dir, input.part_number, &data, meta).await?;
        Ok(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(meta.etag.clone())),
                last_modified: Some(timestamp(meta.mtime_ns)),
                ..CopyPartResult::default()
            }),
            ..UploadPartCopyOutput::default()
        })
    }

    /// MD5 (hex) of bytes `[start, end)` of `inode`, read with read-ahead.
    async fn md5_of(&self, inode: &Inode, start: u64, end: u64) -> Result<String, S3Error> {
        use futures::StreamExt;
        let handle = self.store.fs.reader(inode.clone()).map_err(|e| error::from_file(e, "copy source"))?;
        let chunk = u64::from(handle.layout().chunk_size_bytes).max(4096);
        let plan = body::ReadPlan { inode: inode.id, start, end, piece_bytes: chunk, readahead: self.cfg.limits.readahead_pieces };
        let mut stream = body::stream_range(self.store.fs.clone(), handle, plan);
        let mut d = Digests::new(&[]);
        while let Some(piece) = stream.next().await {
            let piece = piece.map_err(|e| error::internal(format_args!("reading the copy source: {e}")))?;
            d.update(&piece);
        }
        Ok(hex::encode(d.finish().0))
    }

    /// The parts of an upload, by number, with their records.
    async fn parts(&self, dir: InodeId, after: i32, limit: usize) -> Result<(Vec<(i32, Inode, ObjectMeta)>, bool), S3Error> {
        let cursor = if after > 0 { part_name(after) } else { String::new() };
        let want = u32::try_from(limit + 1).unwrap_or(u32::MAX).min(fskv_types::meta::MAX_READDIR_LIMIT);
        let (entries, more) = self.store.fs.meta().readdir(dir, &cursor, want, true).await.map_err(|e| error::from_meta(e, "parts"))?;
        let files: Vec<_> = entries.into_iter().filter_map(|e| Some((e.name.parse::<i32>().ok()?, e.attr?))).collect();
        let ops = files.iter().map(|(_, i)| MetaOp::GetXattr { inode: i.id, name: XATTR_META.into() }).collect::<Vec<_>>();
        let replies = if ops.is_empty() { Vec::new() } else { self.store.fs.meta().batch(ops).await.map_err(|e| error::from_meta(e, "parts"))? };
        let mut out = Vec::new();
        for ((n, inode), r) in files.into_iter().zip(replies) {
            let record = match r {
                Ok(MetaReply::Xattr(d)) => Some(d),
                _ => None,
            };
            let meta = objmeta::effective(&inode, record.as_deref());
            out.push((n, inode, meta));
        }
        let truncated = out.len() > limit || (more && out.len() == limit);
        out.truncate(limit);
        Ok((out, truncated))
    }

    pub async fn list_parts(&self, input: &ListPartsInput) -> Result<ListPartsOutput, S3Error> {
        let up = self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let max = input.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
        let after = input.part_number_marker.unwrap_or(0).max(0);
        let (parts, truncated) = self.parts(up.dir, after, max).await?;
        let next = parts.last().map(|(n, _, _)| *n);
        Ok(ListPartsOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            upload_id: Some(input.upload_id.clone()),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            part_number_marker: input.part_number_marker.clone(),
            next_part_number_marker: if truncated { next } else { None },
            parts: Some(
                parts
                    .into_iter()
                    .map(|(n, _, m)| Part {
                        part_number: Some(n),
                        size: Some(m.size as i64),
                        e_tag: Some(ETag::Strong(m.etag.clone())),
                        last_modified: Some(timestamp(m.mtime_ns)),
                        checksum_crc32: m.checksums.crc32.clone(),
                        checksum_crc32c: m.checksums.crc32c.clone(),
                        checksum_crc64nvme: m.checksums.crc64nvme.clone(),
                        checksum_sha1: m.checksums.sha1.clone(),
                        checksum_sha256: m.checksums.sha256.clone(),
                    })
                    .collect(),
            ),
            ..ListPartsOutput::default()
        })
    }

    pub async fn abort_upload(&self, input: &AbortMultipartUploadInput) -> Result<(), S3Error> {
        check_upload_id(&input.upload_id)?;
        self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let dir = self.uploads_dir(&input.bucket, false).await?.ok_or_else(|| error::no_such_upload(&input.upload_id))?;
        match self.store.fs.meta().remove_tree(dir, &input.upload_id).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => Err(error::no_such_upload(&input.upload_id)),
            Err(e) => Err(error::from_meta(e, &input.upload_id)),
        }
    }

    pub async fn complete_upload(&self, input: &CompleteMultipartUploadInput) -> Result<CompleteMultipartUploadOutput, S3Error> {
        let path = parse(&input.key)?;
        let bucket = self.store.bucket(&input.bucket).await?.id;
        let up = self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let wanted = input.multipart_upload.as_ref().and_then(|m| m.parts.as_ref()).filter(|p| !p.is_empty()).ok_or_else(|| {
            S3Error::with_message(S3ErrorCode::MalformedXML, "CompleteMultipartUpload lists no parts")
        })?;
        let (stored, _) = self.parts(up.dir, 0, self.cfg.limits.max_parts as usize).await?;
        let stored: BTreeMap<i32, (Inode, ObjectMeta)> = stored.into_iter().map(|(n, i, m)| (n, (i, m))).collect();
        // Every listed part must exist with its ETag before sizes are judged.
        let mut chosen: Vec<(Inode, ObjectMeta)> = Vec::with_capacity(wanted.len());
        let mut last = 0;
        for p in wanted.iter() {
            let n = p.part_number.ok_or_else(|| S3Error::with_message(S3ErrorCode::InvalidPart, "a part without a number"))?;
            if n <= last {
                return Err(S3Error::with_message(S3ErrorCode::InvalidPartOrder, "parts must be listed in ascending order of number"));
            }
            last = n;
            let (inode, meta) = stored.get(&n).cloned().ok_or_else(|| S3Error::with_message(S3ErrorCode::InvalidPart, format!("part {n} was not uploaded")))?;
            if let Some(e) = &p.e_tag {
                // The XML form may carry the quotes of the header form.
                if e.value().trim_matches('"') != meta.etag {
                    return Err(S3Error::with_message(S3ErrorCode::InvalidPart, format!("part {n}: the ETag does not match the uploaded part")));
                }
            }
            chosen.push((inode, meta));
        }
        for (i, (_, meta)) in chosen.iter().enumerate() {
            if i + 1 < chosen.len() && meta.size < self.cfg.limits.min_part_bytes {
                return Err(S3Error::with_message(
                    S3ErrorCode::EntityTooSmall,
                    format!("part {} has {} bytes; every part but the last needs at least {}", i + 1, meta.size, self.cfg.limits.min_part_bytes),
                ));
            }
        }
        let size: u64 = chosen.iter().map(|(_, m)| m.size).sum();
        if size > self.cfg.limits.max_object_bytes {
            return Err(S3Error::with_message(S3ErrorCode::EntityTooLarge, format!("the object would have {size} bytes")));
        }
        let expected = object::write_expectation(&self.store, bucket, &path, &input.key, input.if_match.as_ref(), input.if_none_match.as_ref()).await?;
        let parent = self.store.ensure_dirs(bucket, path.parent(), &input.key).await?;
        let data = self.concatenate(parent, &chosen, size).await?;
        let etags: Vec<String> = chosen.iter().map(|(_, m)| m.etag.clone()).collect();
        let etag = objmeta::multipart_etag(&etags).ok_or_else(|| error::internal("a part ETag is not hex"))?;
        let meta = ObjectMeta {
            etag,
            size,
            mtime_ns: 0,
            headers: up.record.headers.clone(),
            user: up.record.user.clone(),
            checksums: Checksums::default(),
            part_sizes: chosen.iter().map(|(_, m)| m.size).collect(),
        };
        let tags = (!up.record.tags.is_empty()).then_some(&up.record.tags);
        let (_, meta) = write::publish(&self.store, bucket, &path, &input.key, &data, meta, tags, expected).await?;
        if let Some(dir) = self.uploads_dir(&input.bucket, false).await? {
            if let Err(e) = self.store.fs.meta().remove_tree(dir, &input.upload_id).await {
                tracing::warn!(upload = %input.upload_id, error = %e, "completed, but the staged parts could not be removed now; the expiry scan will");
            }
        }
        Ok(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            e_tag: Some(ETag::Strong(meta.etag.clone())),
            location: Some(format!("/{}/{}", input.bucket, input.key)),
            ..CompleteMultipartUploadOutput::default()
        })
    }

    /// The parts' bytes, in order, as one new object's data.
    async fn concatenate(&self, parent: InodeId, parts: &[(Inode, ObjectMeta)], size: u64) -> Result<Data, S3Error> {
        if size <= fskv_types::meta::DEFAULT_INLINE_MAX_BYTES as u64 {
            let mut all = Vec::with_capacity(size as usize);
            for (inode, m) in parts {
                match self.copy_data(inode, parent, 0, m.size).await? {
                    Data::Inline(b) => all.extend_from_slice(&b),
                    Data::Temp(_) => return Err(error::internal("a small part was not inline")),
                }
            }
            return Ok(Data::Inline(all.into()));
        }
        let temp = Arc::new(self.store.fs.create_temp(parent, FILE_MODE).await.map_err(|e| error::from_file(e, "complete"))?);
        let mut offset = 0;
        let mut copies = Vec::new();
        for (inode, m) in parts {
            copies.push((inode.clone(), offset, m.size));
            offset += m.size;
        }
        use futures::StreamExt;
        let results: Vec<Result<(), S3Error>> = futures::stream::iter(copies.into_iter().map(|(inode, off, len)| {
            let temp = Arc::clone(&temp);
            async move {
                // Inline parts (readdir strips their bytes) are read through meta by the copy.
                let reader = self.store.fs.reader(inode).map_err(|e| error::from_file(e, "complete"))?;
                super::copy::copy_range(&reader, &temp, 0, off, len, &self.cfg.limits).await
            }
        }))
        .buffer_unordered(self.cfg.limits.copy_parallelism.max(1))
        .collect()
        .await;
        results.into_iter().collect::<Result<Vec<()>, S3Error>>()?;
        Ok(Data::Temp(temp))
    }

    pub async fn list_uploads(&self, input: &ListMultipartUploadsInput) -> Result<ListMultipartUploadsOutput, S3Error> {
        self.store.bucket(&input.bucket).await?;
        let max = input.max_uploads.unwrap_or(1000).clamp(0, 1000) as usize;
        let prefix = input.prefix.clone().unwrap_or_default();
        let mut all: Vec<(String, String, u64)> = Vec::new();
        if let Some(dir) = self.uploads_dir(&input.bucket, false).await? {
            let mut cursor = String::new();
            loop {
                let (entries, more) = self.store.fs.meta().readdir(dir, &cursor, 1000, false).await.map_err(|e| error::from_meta(e, "uploads"))?;
                let ops: Vec<MetaOp> = entries.iter().map(|e| MetaOp::GetXattr { inode: e.inode, name: XATTR_UPLOAD.into() }).collect();
                let replies = if ops.is_empty() { Vec::new() } else { self.store.fs.meta().batch(ops).await.map_err(|e| error::from_meta(e, "uploads"))? };
                for (e, r) in entries.iter().zip(replies) {
                    if let Ok(MetaReply::Xattr(d)) = r {
                        if let Ok(rec) = serde_json::from_slice::<UploadRecord>(&d) {
                            if rec.key.starts_with(&prefix) {
                                all.push((rec.key, e.name.clone(), rec.initiated_ns));
                            }
                        }
                    }
                }
                if all.len() > self.cfg.limits.max_uploads_listed {
                    return Err(error::invalid_request(format!(
                        "more than {} uploads in progress in this bucket; complete or abort some",
                        self.cfg.limits.max_uploads_listed
                    )));
                }
                match entries.last() {
                    Some(l) if more => cursor = l.name.clone(),
                    _ => break,
                }
            }
        }
        all.sort_by(|a, b| (a.0.as_str(), a.2, a.1.as_str()).cmp(&(b.0.as_str(), b.2, b.1.as_str())));
        let key_marker = input.key_marker.clone().unwrap_or_default();
        let id_marker = input.upload_id_marker.clone().unwrap_or_default();
        let rest: Vec<_> = all
            .into_iter()
            .filter(|(k, id, _)| k.as_str() > key_marker.as_str() || (k == &key_marker && !id_marker.is_empty() && id.as_str() > id_marker.as_str()))
            .collect();
        // Roll keys up at the delimiter after the prefix, as listings do.
        let delim = input.delimiter.as_deref().filter(|d| !d.is_empty());
        let mut prefixes: Vec<String> = Vec::new();
        let mut page = Vec::new();
        let mut truncated = false;
        for u in rest {
            if let Some(d) = delim {
                if let Some(i) = u.0[prefix.len()..].find(d) {
                    let cp = u.0[..prefix.len() + i + d.len()].to_string();
                    if prefixes.last() != Some(&cp) {
                        if page.len() + prefixes.len() >= max {
                            truncated = true;
                            break;
                        }
                        prefixes.push(cp);
                    }
                    continue;
                }
            }
            if page.len() + prefixes.len() >= max {
                truncated = true;
                break;
            }
            page.push(u);
        }
        Ok(ListMultipartUploadsOutput {
            bucket: Some(input.bucket.clone()),
            prefix: input.prefix.clone(),
            key_marker: input.key_marker.clone(),
            upload_id_marker: input.upload_id_marker.clone(),
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: if truncated { page.last().map(|p| p.0.clone()) } else { None },
            next_upload_id_marker: if truncated { page.last().map(|p| p.1.clone()) } else { None },
            common_prefixes: Some(prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(p) }).collect()),
            delimiter: input.delimiter.clone(),
            uploads: Some(
                page.into_iter()
                    .map(|(key, id, ns)| MultipartUpload { key: Some(key), upload_id: Some(id), initiated: Some(timestamp(ns)), ..MultipartUpload::default() })
                    .collect(),
            ),
            ..ListMultipartUploadsOutput::default()
        })
    }

    /// Removes uploads started more than `multipart_expiry_ms` ago, in every bucket.
    pub async fn expire_uploads(&self) -> usize {
        let Some(root) = self.store.ensure_dirs_existing(self.store.root, &[UPLOADS_DIR.to_string()]).await else { return 0 };
        let cutoff = write::now_ns().saturating_sub(self.cfg.limits.multipart_expiry_ms.saturating_mul(1_000_000));
        let mut removed = 0;
        let Ok((buckets, _)) = self.store.fs.meta().readdir(root, "", 4096, false).await else { return 0 };
        for b in buckets {
            let Ok((ups, _)) = self.store.fs.meta().readdir(b.inode, "", 4096, true).await else { continue };
            for u in ups {
                // The id starts with the start time; a directory without a
                // record (a crash between mkdir and setxattr) goes by its ctime.
                let started = u64::from_str_radix(u.name.get(..16).unwrap_or(""), 16).ok().or(u.attr.as_ref().map(|a| a.ctime_ns)).unwrap_or(0);
                if started < cutoff && self.store.fs.meta().remove_tree(b.inode, &u.name).await.is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// `bytes=a-b` of a copy source of `size` bytes, as `[a, b+1)`.
fn parse_copy_range(r: &str, size: u64) -> Result<(u64, u64), S3Error> {
    let bad = || S3Error::with_message(S3ErrorCode::InvalidArgument, format!("x-amz-copy-source-range {r:?}: expected bytes=first-last within the source"));
    let spec = r.strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    if a > b || b >= size {
        return Err(bad());
    }
    Ok((a, b + 1))
}
