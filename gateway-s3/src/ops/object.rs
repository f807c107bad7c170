//! PutObject, GetObject, HeadObject, DeleteObject, DeleteObjects, CopyObject.

use super::versioning::{Deleted, NewObject, Published};
use super::write::{self, Data};
use super::Gateway;
use crate::access::CannedAcl;
use crate::body::{self, BodyDigests, Digests, ReadPlan};
use crate::error;
use crate::objmeta::{self, Headers, ObjectMeta, TagList, XATTR_META, XATTR_TAGS};
use crate::paths::ObjectPath;
use crate::store::{Found, Store};
use fskv_proto::meta::{Expected, Inode, XattrFlag};
use fskv_types::{ErrorCode, InodeId};
use http::HeaderMap;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

pub fn timestamp(ns: u64) -> Timestamp {
    Timestamp::from(SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
}

fn unix_secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

/// The standard headers of a request input (PutObject, CopyObject,
/// CreateMultipartUpload: each has these fields under the same names).
#[macro_export]
macro_rules! input_headers {
    ($input:expr) => {
        $crate::ops::object::headers_from(
            $input.content_type.clone(),
            $input.content_encoding.clone(),
            $input.content_disposition.clone(),
            $input.content_language.clone(),
            $input.cache_control.clone(),
            $input.expires.as_ref(),
        )
    };
}

/// `Content-Encoding` without `aws-chunked`, which names the transfer of
/// the request body and is not the object's (S3 drops it).
fn object_encoding(e: Option<String>) -> Option<String> {
    let e = e?;
    let kept: Vec<&str> = e.split(',').map(str::trim).filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("aws-chunked")).collect();
    (!kept.is_empty()).then(|| kept.join(", "))
}

pub fn headers_from(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: Option<&Timestamp>,
) -> Headers {
    let expires = expires.and_then(|t| {
        let mut buf = Vec::new();
        t.format(TimestampFormat::HttpDate, &mut buf).ok()?;
        String::from_utf8(buf).ok()
    });
    let content_encoding = object_encoding(content_encoding);
    Headers { content_type, content_encoding, content_disposition, content_language, cache_control, expires }
}

pub fn expires_of(h: &Headers) -> Option<Timestamp> {
    h.expires.as_deref().and_then(|s| Timestamp::parse(TimestampFormat::HttpDate, s).ok())
}

pub fn user_meta(m: Option<Metadata>) -> Result<BTreeMap<String, String>, S3Error> {
    let user: BTreeMap<String, String> = m.unwrap_or_default().into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    let bytes: usize = user.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > objmeta::MAX_USER_META_BYTES {
        return Err(S3Error::with_message(
            S3ErrorCode::MetadataTooLarge,
            format!("user metadata of {bytes} bytes (at most {})", objmeta::MAX_USER_META_BYTES),
        ));
    }
    Ok(user)
}

/// An object as found, with its effective record.
pub struct Object {
    pub inode: Inode,
    pub meta: ObjectMeta,
    pub dir: bool,
}

impl Object {
    /// The object a key's entry holds, with its effective record.
    pub fn of(found: Found) -> Object {
        match found {
            Found::DirObject(inode, record) => {
                let meta = objmeta::effective_dir(&inode, Some(&record));
                Object { inode, meta, dir: true }
            }
            Found::File(inode, record) => {
                let meta = objmeta::effective(&inode, record.as_deref());
                Object { inode, meta, dir: false }
            }
        }
    }
}

pub async fn find_object(store: &Store, bucket: InodeId, path: &ObjectPath) -> Result<Option<Object>, S3Error> {
    Ok(store.find(bucket, path).await?.map(Object::of))
}

/// The conditional headers of a read.
struct ReadConditions<'a> {
    if_match: Option<&'a ETagCondition>,
    if_none_match: Option<&'a ETagCondition>,
    if_modified_since: Option<&'a Timestamp>,
    if_unmodified_since: Option<&'a Timestamp>,
}

/// The read preconditions of a HeadObject or GetObject input (same fields).
macro_rules! read_conditions {
    ($input:expr) => {
        ReadConditions {
            if_match: $input.if_match.as_ref(),
            if_none_match: $input.if_none_match.as_ref(),
            if_modified_since: $input.if_modified_since.as_ref(),
            if_unmodified_since: $input.if_unmodified_since.as_ref(),
        }
    };
}

/// Read-side preconditions (RFC 9110 order, as S3 applies them).
pub fn check_read_conditions(
    meta: &ObjectMeta,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> Result<(), S3Error> {
    let secs = (meta.mtime_ns / 1_000_000_000) as i64;
    let matches = |c: &ETagCondition| match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == meta.etag,
    };
    match if_match {
        Some(c) if !matches(c) => return Err(error::precondition_failed("If-Match: the ETag does not match")),
        Some(_) => {}
        None => {
            if let Some(t) = if_unmodified_since {
                if secs > unix_secs(t) {
                    return Err(error::precondition_failed("If-Unmodified-Since: the object was modified since"));
                }
            }
        }
    }
    match if_none_match {
        Some(c) if matches(c) => return Err(not_modified(meta)),
        Some(_) => {}
        None => {
            if let Some(t) = if_modified_since {
                if secs <= unix_secs(t) {
                    return Err(not_modified(meta));
                }
            }
        }
    }
    Ok(())
}

/// 304 Not Modified with the validators of the object (RFC 9110 §15.4.5:
/// the ETag and Last-Modified a 200 would have carried); no body.
fn not_modified(meta: &ObjectMeta) -> S3Error {
    let mut e = S3Error::new(S3ErrorCode::NotModified);
    e.set_status_code(http::StatusCode::NOT_MODIFIED);
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(&meta.quoted_etag()) {
        headers.insert(http::header::ETAG, v);
    }
    let mut date = Vec::new();
    if timestamp(meta.mtime_ns).format(TimestampFormat::HttpDate, &mut date).is_ok() {
        if let Ok(v) = http::HeaderValue::from_bytes(&date) {
            headers.insert(http::header::LAST_MODIFIED, v);
        }
    }
    e.set_headers(headers);
    e
}

/// The write precondition of a PUT (or Complete): `If-None-Match: *` or
/// `If-Match`, turned into the meta CAS that makes it atomic.
pub async fn write_expectation(
    store: &Store,
    bucket: InodeId,
    path: &ObjectPath,
    key: &str,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> Result<Option<Expected>, S3Error> {
    if let Some(c) = if_none_match {
        if !matches!(c, ETagCondition::Any) {
            return Err(error::invalid_argument("If-None-Match on a write takes only '*'"));
        }
        return Ok(Some(Expected::Absent));
    }
    let Some(c) = if_match else { return Ok(None) };
    let Some(cur) = find_object(store, bucket, path).await?.filter(|o| !o.dir) else {
        return Err(error::no_such_key(key));
    };
    if let ETagCondition::ETag(e) = c {
        if e.value() != cur.meta.etag {
            return Err(error::precondition_failed("If-Match: the ETag does not match"));
        }
    }
    Ok(Some(Expected::Inode { id: cur.inode.id, version: cur.inode.version }))
}

pub struct PutArgs<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    pub headers: Headers,
    pub user: BTreeMap<String, String>,
    pub tags: Option<TagList>,
    pub if_match: Option<&'a ETagCondition>,
    pub if_none_match: Option<&'a ETagCondition>,
    /// `x-amz-acl` (checked against the bucket's ownership controls).
    pub acl: Option<CannedAcl>,
}

impl Gateway {
    pub async fn put(
        &self,
        args: PutArgs<'_>,
        body: Option<StreamingBlob>,
        req_headers: &HeaderMap,
        trailers: Option<&s3s::TrailingHeaders>,
        payload_sha256: Option<[u8; 32]>,
    ) -> Result<Published, S3Error> {
        let (bucket_dir, path) = self.store.locate(args.bucket, args.key).await?;
        self.check_acl_allowed(&bucket_dir, args.bucket, args.acl).await?;
        let bucket = bucket_dir.id;
        if path.dir_object {
            // Directory objects are not versioned: the directory is the object.
            let meta = self.put_dir_object(bucket, &path, args, body).await?;
            return Ok(Published { meta, version_id: None });
        }
        let expected = write_expectation(&self.store, bucket, &path, args.key, args.if_match, args.if_none_match).await?;
        // Conflicts with the tree are found before the body is read.
        let parent = self.store.ensure_dirs(bucket, path.parent(), args.key).await?;
        let mut digests = BodyDigests::new(&body::requested_algorithms(req_headers)).expect_payload_sha256(payload_sha256);
        let limits = &self.cfg.limits;
        let data = write::receive(&self.store, parent, body, &mut digests, limits.max_object_bytes, limits).await?;
        let size = digests.size;
        let (md5, checksums) = digests.finish().await?;
        let trailer_map = trailers.and_then(|t| t.take());
        body::verify(req_headers, trailer_map.as_ref(), &md5, &checksums)?;
        let meta = ObjectMeta {
            etag: hex::encode(md5),
            size,
            mtime_ns: 0,
            headers: args.headers,
            user: args.user,
            checksums,
            part_sizes: Vec::new(),
            upload_id: None,
            part_checksums: Vec::new(),
            acl: args.acl.filter(|a| *a != CannedAcl::Private),
            ..ObjectMeta::default()
        };
        self.publish_object(args.bucket, bucket, &path, args.key, NewObject::Data(&data), meta, args.tags.as_ref(), expected).await
    }

    async fn put_dir_object(
        &self,
        bucket: InodeId,
        path: &ObjectPath,
        args: PutArgs<'_>,
        body: Option<StreamingBlob>,
    ) -> Result<ObjectMeta, S3Error> {
        let mut digests = Digests::new(&[]);
        if let Some(mut b) = body {
            use futures::StreamExt;
            while let Some(piece) = b.next().await {
                let piece = piece.map_err(|e| error::invalid_request(format!("reading the body: {e}")))?;
                digests.update(&piece);
                if digests.size > 0 {
                    return Err(error::invalid_argument(format!(
                        "{:?} ends in '/': such a key names a directory and takes no data",
                        args.key
                    )));
                }
            }
        }
        let dir = self.store.ensure_dirs(bucket, &path.components, args.key).await?;
        let meta = ObjectMeta {
            etag: objmeta::EMPTY_MD5.into(),
            size: 0,
            mtime_ns: write::now_ns(),
            headers: args.headers,
            user: args.user,
            acl: args.acl.filter(|a| *a != CannedAcl::Private),
            ..ObjectMeta::default()
        };
        let flag = if args.if_none_match.is_some() { XattrFlag::Create } else { XattrFlag::Any };
        match self.store.fs.meta().set_xattr(dir, XATTR_META, &meta.encode(), flag).await {
            Ok(()) => {}
            Err(e) if e.code() == ErrorCode::AlreadyExists => return Err(error::precondition_failed("If-None-Match: the object exists")),
            Err(e) => return Err(error::from_meta(e, args.key)),
        }
        if let Some(t) = args.tags.filter(|t| !t.is_empty()) {
            self.store
                .fs
                .meta()
                .set_xattr(dir, XATTR_TAGS, &objmeta::encode_tags(&t), XattrFlag::Any)
                .await
                .map_err(|e| error::from_meta(e, args.key))?;
        }
        Ok(meta)
    }

    /// The object a GET or HEAD reads (the current one, or `version`), its
    /// conditions checked; with its `x-amz-version-id`.
    async fn read_target(
        &self,
        bucket_name: &str,
        key: &str,
        version: Option<&str>,
        conds: &ReadConditions<'_>,
    ) -> Result<(Object, Option<String>), S3Error> {
        let (bucket_dir, _, obj) = self.locate_for_read(bucket_name, key, version).await?;
        let bucket = bucket_dir.id;
        let version_id = self.version_header(bucket, &obj.meta).await?;
        check_read_conditions(&obj.meta, conds.if_match, conds.if_none_match, conds.if_modified_since, conds.if_unmodified_since)?;
        Ok((obj, version_id))
    }

    pub async fn head(&self, input: &HeadObjectInput) -> Result<HeadObjectOutput, S3Error> {
        let conds = read_conditions!(input);
        let (obj, version_id) = self.read_target(&input.bucket, &input.key, input.version_id.as_deref(), &conds).await?;
        let m = &obj.meta;
        let want_sums = input.checksum_mode.as_ref().is_some_and(|c| c.as_str() == ChecksumMode::ENABLED);
        let (range, len) = match part_range(m, input.part_number)? {
            Some((s, e)) => (Some(format!("bytes {s}-{}/{}", e - 1, m.size)), e - s),
            None => (None, m.size),
        };
        let mut out = HeadObjectOutput {
            content_length: Some(len as i64),
            content_range: range,
            parts_count: (!m.part_sizes.is_empty() && input.part_number.is_some()).then_some(m.part_sizes.len() as i32),
            version_id,
            ..HeadObjectOutput::default()
        };
        crate::set_object_headers!(out, m);
        if want_sums {
            crate::set_checksums!(out, &m.checksums);
        }
        Ok(out)
    }

    pub async fn get(&self, input: &GetObjectInput) -> Result<GetObjectOutput, S3Error> {
        let conds = read_conditions!(input);
        let (obj, version_id) = self.read_target(&input.bucket, &input.key, input.version_id.as_deref(), &conds).await?;
        let m = &obj.meta;
        let (start, end, ranged) = match (&input.range, part_range(m, input.part_number)?) {
            (Some(r), _) => {
                let rr = r.check(m.size).map_err(|_| error::invalid_range(format!("the range is not satisfiable for {} bytes", m.size)))?;
                (rr.start, rr.end, true)
            }
            (None, Some((s, e))) => (s, e, true),
            (None, None) => (0, m.size, false),
        };
        let body = self.object_body(&obj, start, end).await?;
        let want_sums = input.checksum_mode.as_ref().is_some_and(|c| c.as_str() == ChecksumMode::ENABLED) && !ranged;
        let mut out = GetObjectOutput {
            body: Some(body),
            content_length: Some((end - start) as i64),
            content_range: ranged.then(|| format!("bytes {start}-{}/{}", end.saturating_sub(1), m.size)),
            parts_count: (!m.part_sizes.is_empty() && input.part_number.is_some()).then_some(m.part_sizes.len() as i32),
            version_id,
            ..GetObjectOutput::default()
        };
        crate::set_object_headers!(out, m);
        if want_sums {
            crate::set_checksums!(out, &m.checksums);
        }
        // Response header overrides (presigned downloads use them).
        out.content_type = input.response_content_type.clone().or(out.content_type);
        out.content_encoding = input.response_content_encoding.clone().or(out.content_encoding);
        out.content_disposition = input.response_content_disposition.clone().or(out.content_disposition);
        out.content_language = input.response_content_language.clone().or(out.content_language);
        out.cache_control = input.response_cache_control.clone().or(out.cache_control);
        out.expires = input.response_expires.clone().or(out.expires);
        Ok(out)
    }

    async fn object_body(&self, obj: &Object, start: u64, end: u64) -> Result<StreamingBlob, S3Error> {
        if obj.dir || start >= end {
            return Ok(StreamingBlob::wrap(futures::stream::empty::<Result<bytes::Bytes, std::io::Error>>()));
        }
        if let Some(inline) = obj.inode.file().and_then(|f| f.inline.as_ref()).filter(|b| b.len() as u64 == obj.inode.size_bytes()) {
            let s = (start as usize).min(inline.len());
            let e = (end as usize).min(inline.len());
            let data = bytes::Bytes::copy_from_slice(&inline[s..e]);
            return Ok(StreamingBlob::wrap(futures::stream::once(async move { Ok::<_, std::io::Error>(data) })));
        }
        let handle = self.store.fs.reader(obj.inode.clone()).map_err(|e| error::from_file(e, "object"))?;
        let chunk = u64::from(handle.layout().chunk_size_bytes).max(4096);
        let plan = ReadPlan { inode: obj.inode.id, start, end, piece_bytes: chunk, readahead: self.cfg.limits.readahead_pieces };
        Ok(StreamingBlob::wrap(body::stream_range(self.store.fs.clone(), handle, plan)))
    }

    /// Deletes `key`; a missing key is success, as in S3.
    pub async fn delete(&self, bucket_name: &str, key: &str) -> Result<(), S3Error> {
        self.delete_object(bucket_name, key, None).await.map(|_| ())
    }

    /// DeleteObject: of one version (`version`), or of the current object
    /// — in a versioned bucket by a delete marker (`ops/versioning.rs`).
    pub async fn delete_object(&self, bucket_name: &str, key: &str, version: Option<&str>) -> Result<Deleted, S3Error> {
        let (bucket_dir, path) = self.store.locate(bucket_name, key).await?;
        let bucket = bucket_dir.id;
        if let Some(v) = version {
            let v = super::versioning::parse_version(v)?;
            return self.delete_version(bucket_name, bucket, &path, key, &v).await;
        }
        let versioning = self.store.versioning_of(bucket).await?;
        if versioning != crate::versions::Versioning::Off && !path.dir_object {
            return self.delete_versioned(bucket_name, bucket, versioning, &path, key).await;
        }
        self.delete_unversioned(bucket, &path, key).await?;
        Ok(Deleted::default())
    }

    async fn delete_unversioned(&self, bucket: InodeId, path: &ObjectPath, key: &str) -> Result<(), S3Error> {
        match self.store.find(bucket, path).await? {
            None => return Ok(()),
            Some(Found::DirObject(dir, _)) => {
                for name in [XATTR_META, XATTR_TAGS] {
                    match self.store.fs.meta().remove_xattr(dir.id, name).await {
                        Ok(()) => {}
                        Err(e) if e.code() == ErrorCode::NotFound => {}
                        Err(e) => return Err(error::from_meta(e, key)),
                    }
                }
                self.store.remove_empty_dirs(bucket, &path.components).await;
            }
            Some(Found::File(..)) => {
                let parent = match self.store.ensure_dirs_existing(bucket, path.parent()).await {
                    Some(p) => p,
                    None => return Ok(()),
                };
                match self.store.fs.meta().unlink(parent, path.name()).await {
                    Ok(()) => {}
                    Err(e) if e.code() == ErrorCode::NotFound => {}
                    Err(e) => return Err(error::from_meta(e, key)),
                }
                self.store.remove_empty_dirs(bucket, path.parent()).await;
            }
        }
        Ok(())
    }

    pub async fn copy(&self, input: &CopyObjectInput) -> Result<CopyObjectOutput, S3Error> {
        let CopySource::Bucket { bucket: src_bucket, key: src_key, version_id: src_version } = &input.copy_source else {
            return Err(error::invalid_argument("copying from an access point is not supported"));
        };
        let (src_bucket_id_dir, src_path, src) = self.locate_for_read(src_bucket, src_key, src_version.as_deref()).await?;
        let src_bucket_id = src_bucket_id_dir.id;
        let copy_source_version_id = self.version_header(src_bucket_id, &src.meta).await?;
        check_read_conditions(
            &src.meta,
            input.copy_source_if_match.as_ref().map(|e| e as &ETagCondition),
            input.copy_source_if_none_match.as_ref().map(|e| e as &ETagCondition),
            input.copy_source_if_modified_since.as_ref(),
            input.copy_source_if_unmodified_since.as_ref(),
        )
        .map_err(|e| if e.code() == &S3ErrorCode::NotModified { error::precondition_failed("copy source condition") } else { e })?;
        let (dst_dir, dst_path) = self.store.locate(&input.bucket, &input.key).await?;
        let acl = super::acl::object_acl_input(input.acl.as_ref())?;
        self.check_acl_allowed(&dst_dir, &input.bucket, acl).await?;
        let dst_bucket = dst_dir.id;
        let replace_meta = input.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        // Copying an older version onto its key restores it: no change needed.
        let same = src_bucket_id == dst_bucket && src_path == dst_path && src_version.is_none();
        if same && !replace_meta {
            return Err(error::invalid_request("copying an object onto itself needs a change: set x-amz-metadata-directive: REPLACE"));
        }
        let (headers, user) = if replace_meta {
            let h = crate::input_headers!(input);
            (h, user_meta(input.metadata.clone())?)
        } else {
            (src.meta.headers.clone(), src.meta.user.clone())
        };
        let tags = if input.tagging_directive.as_ref().is_some_and(|d| d.as_str() == TaggingDirective::REPLACE) {
            Some(objmeta::parse_tagging_header(input.tagging.as_deref().unwrap_or("")).map_err(error::invalid_argument)?)
        } else {
            self.tags_of(src.inode.id).await?
        };
        if src.dir || dst_path.dir_object {
            return Err(error::invalid_argument("copying directory objects (keys ending in '/') is not supported"));
        }
        let parent = self.store.ensure_dirs(dst_bucket, dst_path.parent(), &input.key).await?;
        let data = self.copy_data(&src.inode, parent, 0, src.meta.size).await?;
        let meta = ObjectMeta {
            etag: src.meta.etag.clone(),
            size: src.meta.size,
            mtime_ns: 0,
            headers,
            user,
            checksums: src.meta.checksums.clone(),
            part_sizes: src.meta.part_sizes.clone(),
            // A copy is not the object the upload made.
            upload_id: None,
            part_checksums: src.meta.part_checksums.clone(),
            // As S3: a copy gets the ACL of the request, not the source's.
            acl: acl.filter(|a| *a != CannedAcl::Private),
            ..ObjectMeta::default()
        };
        let published = self
            .publish_object(&input.bucket, dst_bucket, &dst_path, &input.key, NewObject::Data(&data), meta, tags.as_ref(), None)
            .await?;
        let meta = published.meta;
        Ok(CopyObjectOutput {
            copy_object_result: Some({
                let mut r = CopyObjectResult {
                    e_tag: Some(ETag::Strong(meta.etag.clone())),
                    last_modified: Some(timestamp(meta.mtime_ns)),
                    ..CopyObjectResult::default()
                };
                crate::set_checksums!(r, &meta.checksums);
                r
            }),
            version_id: published.version_id,
            copy_source_version_id,
            ..CopyObjectOutput::default()
        })
    }

    pub async fn tags_of(&self, inode: InodeId) -> Result<Option<TagList>, S3Error> {
        match self.store.fs.meta().get_xattr(inode, XATTR_TAGS).await {
            Ok(b) => Ok(Some(objmeta::decode_tags(&b))),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(error::from_meta(e, "tags")),
        }
    }

    /// Bytes `[start, end)` of `src` as new object data in `temp_dir`,
    /// copied inside the cluster.
    pub async fn copy_data(&self, src: &Inode, temp_dir: InodeId, start: u64, end: u64) -> Result<Data, S3Error> {
        let len = end.saturating_sub(start);
        // Readdir strips inline bytes: use them only when they are all there.
        if let Some(inline) = src.file().and_then(|f| f.inline.as_ref()).filter(|b| b.len() as u64 == src.size_bytes()) {
            let s = (start as usize).min(inline.len());
            let e = (end as usize).min(inline.len());
            return Ok(Data::Inline(bytes::Bytes::copy_from_slice(&inline[s..e])));
        }
        if len <= fskv_proto::meta::DEFAULT_INLINE_MAX_BYTES as u64 {
            let reader = self.store.fs.reader(src.clone()).map_err(|e| error::from_file(e, "copy source"))?;
            let data = reader.read_at(start, len).await.map_err(|e| error::from_file(e, "copy source"))?;
            return Ok(Data::Inline(data));
        }
        let reader = self.store.fs.reader(src.clone()).map_err(|e| error::from_file(e, "copy source"))?;
        let temp = self.store.fs.create_temp(temp_dir, crate::store::FILE_MODE).await.map_err(|e| error::from_file(e, "copy"))?;
        super::copy::copy_range(&reader, &temp, start, 0, len, &self.cfg.limits).await?;
        Ok(Data::Temp(std::sync::Arc::new(temp)))
    }
}

/// The byte range of part `n` of a multipart object.
fn part_range(m: &ObjectMeta, part: Option<i32>) -> Result<Option<(u64, u64)>, S3Error> {
    let Some(n) = part else { return Ok(None) };
    if m.part_sizes.is_empty() {
        return if n == 1 { Ok(Some((0, m.size))) } else { Err(error::invalid_part_number(format!("part {n} of a single-part object"))) };
    }
    let idx = usize::try_from(n)
        .ok()
        .filter(|&i| (1..=m.part_sizes.len()).contains(&i))
        .ok_or_else(|| error::invalid_part_number(format!("part {n}: the object has {} parts", m.part_sizes.len())))?;
    let start: u64 = m.part_sizes[..idx - 1].iter().sum();
    Ok(Some((start, start + m.part_sizes[idx - 1])))
}

pub fn user_out(m: &ObjectMeta) -> Option<Metadata> {
    (!m.user.is_empty()).then(|| m.user.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}
