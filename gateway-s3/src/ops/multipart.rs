//! Multipart uploads.
//!
//! An upload is a directory `ROOT/.fskv-uploads/<bucket>/<upload id>`; its
//! `user.s3.upload` xattr is the [`UploadRecord`] (key, headers, metadata,
//! tags, start time). It holds a file `data` and one entry `%05d` per part,
//! whose `user.s3.part` xattr is the [`PartRecord`] (ETag, size, checksums,
//! and where the bytes are).
//!
//! **In place.** Clients cut an object into parts of one size P (all but
//! the last). The first part to arrive fixes P for the upload
//! (`user.s3.partsize`, set once). A part of at most P bytes whose entry the
//! request creates first (an exclusive create: one writer per part) is
//! written straight into `data` at `(n - 1) * P`; its entry records that
//! offset. Completion then has nothing to copy when every listed part sits
//! at its final offset: `data` is cut to the total length, gets its mtime
//! and metadata, and is renamed onto the key in one meta transaction.
//!
//! **Elsewhere.** A part that does not fit (larger than P, unknown length,
//! a re-sent part, UploadPartCopy) is a file of its own, published
//! atomically as `%05d.<etag>`. When any listed part is not in place, an
//! in-place write is still running (an entry `%05d` without a record), or
//! the completion is conditional, completion copies every part into a new
//! temp file inside the cluster (storage-side copy; no data through the
//! gateway) and publishes that.
//!
//! **Attempts.** Every finished UploadPart (or UploadPartCopy) of part `n`
//! is an *attempt* with its own entry and record (`started_ns` when the
//! request arrived, `mtime_ns` when it finished). An SDK that times out
//! re-sends a part while the first request may still be running, and lists
//! the ETag of the answer it got — which need not be the attempt that
//! finished last. So attempts are not overwritten; the rules
//! ([`current_attempt`], [`choose_attempt`], [`stale_attempts`]):
//!
//! | situation | rule |
//! |---|---|
//! | attempt Y of part n finishes | attempts of n that finished before Y started are stale: their entries are removed (a stale in-place claim too: its region may be claimed again) — a sequential re-upload replaces the part, as in S3 |
//! | attempts overlapped in time (a retry raced the first request) | all kept |
//! | ListParts | per part, the attempt that started last (ties: finished last) |
//! | Complete lists part n with an ETag | the kept attempt of n with that ETag (the latest-started if several); none: `InvalidPart` |
//! | Complete lists part n without an ETag | the attempt that started last |
//! | in-place write fails (short body, bad digest) | its claim `%05d` is removed; the part counts as not uploaded |
//!
//! **Completion is idempotent.** The object's `user.s3.meta` record names
//! the upload that made it (`upload_id`), published in the same transaction
//! as the object. A CompleteMultipartUpload of an upload that is gone (an
//! SDK retry after a lost answer, or two completions racing) is answered
//! with the same ETag and location when the current object at the key was
//! made by that upload from the same part list (its ETag is the multipart
//! ETag of the listed part ETags). The record lives as long as that object:
//! no time limit, survives gateway restarts; once the key is overwritten or
//! deleted, a retry gets `NoSuchUpload`.
//!
//! Abort removes the directory at once; uploads older than
//! `multipart_expiry_ms` are removed by the writer's expiry scan.

use super::object::{self, find_object, timestamp, user_meta};
use super::write::{self, Data};
use super::Gateway;
use crate::body::{self, BodyDigests, Digests};
use crate::error;
use crate::objmeta::{self, Checksums, Headers, ObjectMeta, TagList, XATTR_META};
use crate::store::{DIR_MODE, FILE_MODE, UPLOADS_DIR};
use fskv_proto::meta::{Inode, MetaOp, MetaReply, PublishAttrs, XattrFlag};
use fskv_types::{ErrorCode, InodeId};
use http::HeaderMap;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const XATTR_UPLOAD: &str = "user.s3.upload";
pub const XATTR_PART: &str = "user.s3.part";
pub const XATTR_PART_SIZE: &str = "user.s3.partsize";
/// The file in an upload directory that in-place parts are written into.
const DATA_FILE: &str = "data";

/// What is known of one uploaded part.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PartRecord {
    pub etag: String,
    pub size: u64,
    pub mtime_ns: u64,
    #[serde(default)]
    pub checksums: Checksums,
    /// Offset of the bytes in the upload's `data` file; `None`: the entry
    /// itself is the part's file.
    #[serde(default)]
    pub offset: Option<u64>,
    /// When the request of this attempt arrived (`mtime_ns`: when it finished).
    #[serde(default)]
    pub started_ns: u64,
}

impl PartRecord {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

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
    /// `x-amz-acl` of CreateMultipartUpload: the completed object's ACL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<crate::access::CannedAcl>,
}

/// The in-place claim of part `n` (also where a readdir of its attempts starts).
fn part_name(n: i32) -> String {
    format!("{n:05}")
}

/// The entry of an attempt of part `n` with a file of its own: named by
/// its ETag, so identical re-sends share one entry.
fn attempt_name(n: i32, etag: &str) -> String {
    format!("{n:05}.{etag}")
}

/// The part number of an entry (`%05d` or `%05d.<etag>`); `None` for `data`.
fn part_of(name: &str) -> Option<i32> {
    let num = name.split_once('.').map_or(name, |(n, _)| n);
    (num.len() == 5).then(|| num.parse().ok()).flatten()
}

/// One finished attempt of a part.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub name: String,
    pub inode: Inode,
    pub record: PartRecord,
}

/// The attempt that started last (ties: finished last): what ListParts shows.
pub fn current_attempt(attempts: &[Attempt]) -> Option<&Attempt> {
    attempts.iter().max_by_key(|a| (a.record.started_ns, a.record.mtime_ns))
}

/// The attempt a completion uses for a listed part: the kept attempt with
/// the listed ETag (unquoted), or the current one when none is listed.
pub fn choose_attempt<'a>(attempts: &'a [Attempt], listed_etag: Option<&str>) -> Option<&'a Attempt> {
    match listed_etag {
        None => current_attempt(attempts),
        Some(e) => attempts.iter().filter(|a| a.record.etag == e).max_by_key(|a| (a.record.started_ns, a.record.mtime_ns)),
    }
}

/// The attempts made stale by an attempt that started at `started_ns`:
/// those that finished before it started.
pub fn stale_attempts(attempts: &[Attempt], started_ns: u64) -> Vec<&Attempt> {
    attempts.iter().filter(|a| a.record.mtime_ns < started_ns).collect()
}

/// The finished attempts of an upload's parts, by part number, and whether
/// an in-place write is still running (a claim without a record).
#[derive(Debug, Default)]
struct Attempts {
    parts: BTreeMap<i32, Vec<Attempt>>,
    in_flight: bool,
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
            // Root's, whoever asks: the staging is shared by every bucket.
            return self.store.system().ensure_dirs(self.store.root, &comps, bucket).await.map(Some);
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
        let (bucket_dir, path) = self.store.locate(&input.bucket, &input.key).await?;
        if path.dir_object {
            return Err(error::invalid_argument("multipart uploads of keys ending in '/' are not supported"));
        }
        let acl = super::acl::object_acl_input(input.acl.as_ref())?;
        self.check_acl_allowed(&bucket_dir, &input.bucket, acl).await?;
        let tags = match &input.tagging {
            Some(t) => objmeta::parse_tagging_header(t).map_err(error::invalid_argument)?,
            None => TagList::new(),
        };
        let record = UploadRecord {
            key: input.key.clone(),
            initiated_ns: write::now_ns(),
            headers: crate::input_headers!(input),
            user: user_meta(input.metadata.clone())?,
            tags,
            checksum_algorithm: input.checksum_algorithm.as_ref().map(|a| a.as_str().to_ascii_lowercase()),
            acl: acl.filter(|a| *a != crate::access::CannedAcl::Private),
        };
        let dir = self.uploads_dir(&input.bucket, true).await?.unwrap_or(self.store.root);
        let id = new_upload_id();
        let up = self.store.fs.meta().mkdir(dir, &id, DIR_MODE).await.map_err(|e| error::from_meta(e, &id))?;
        let bytes = serde_json::to_vec(&record).map_err(error::internal)?;
        let made = async {
            self.store.fs.meta().create(up.id, DATA_FILE, FILE_MODE, true).await?;
            self.store.fs.meta().set_xattr(up.id, XATTR_UPLOAD, &bytes, XattrFlag::Create).await
        };
        if let Err(e) = made.await {
            let _ = self.store.fs.meta().remove_tree(dir, &id).await;
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
        payload_sha256: Option<[u8; 32]>,
    ) -> Result<UploadPartOutput, S3Error> {
        self.check_part_number(input.part_number)?;
        let started_ns = write::now_ns();
        let up = self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let mut algorithms = body::requested_algorithms(req_headers);
        if let Some(a) = &up.record.checksum_algorithm {
            if !algorithms.contains(a) {
                algorithms.push(a.clone());
            }
        }
        let mut digests = BodyDigests::new(&algorithms).expect_payload_sha256(payload_sha256);
        let limits = &self.cfg.limits;
        let length = input.content_length.and_then(|l| u64::try_from(l).ok());
        let n = input.part_number;
        let mut body = input.body;
        let placed = match self.in_place_slot(&up, n, length).await? {
            Some((offset, size)) => match self.write_in_place(&up, n, offset, size, body.take(), &mut digests).await {
                Ok(()) => Some(offset),
                Err(e) => {
                    // An internal error may leave writes running: the claim then stays.
                    if e.code() != &S3ErrorCode::InternalError {
                        self.drop_claim(up.dir, n, &e).await;
                    }
                    return Err(e);
                }
            },
            None => None,
        };
        let data = match placed {
            Some(_) => None,
            None => Some(write::receive(&self.store, up.dir, body, &mut digests, limits.max_part_bytes, limits).await?),
        };
        let size = digests.size;
        let finished = digests.finish().await;
        let trailer_map = trailers.and_then(|t| t.take());
        let verified = finished
            .and_then(|(md5, checksums)| body::verify(req_headers, trailer_map.as_ref(), &md5, &checksums).map(|()| (md5, checksums)));
        let (md5, checksums) = match verified {
            Ok(v) => v,
            Err(e) => {
                if placed.is_some() {
                    self.drop_claim(up.dir, n, &e).await;
                }
                return Err(e);
            }
        };
        let record = PartRecord { etag: hex::encode(md5), size, mtime_ns: write::now_ns(), checksums, offset: placed, started_ns };
        match &data {
            Some(d) => self.publish_part(up.dir, n, d, &record).await?,
            None => self.record_in_place(up.dir, n, &record).await?,
        }
        self.remove_stale(up.dir, n, &record).await;
        let mut out = UploadPartOutput { e_tag: Some(ETag::Strong(record.etag.clone())), ..UploadPartOutput::default() };
        crate::set_checksums!(out, &record.checksums);
        Ok(out)
    }

    /// The upload's part size P: fixed by the first part of at least
    /// `min_part_bytes` that tells its length (smaller parts can only be the
    /// last one); 0 while unknown.
    async fn part_size(&self, up: &Upload, length: u64) -> Result<u64, S3Error> {
        let meta = self.store.fs.meta();
        if length >= self.cfg.limits.min_part_bytes {
            match meta.set_xattr(up.dir, XATTR_PART_SIZE, &length.to_le_bytes(), XattrFlag::Create).await {
                Ok(()) => return Ok(length),
                Err(e) if e.code() == ErrorCode::AlreadyExists => {}
                Err(e) => return Err(error::from_meta(e, "part size")),
            }
        }
        match meta.get_xattr(up.dir, XATTR_PART_SIZE).await {
            Ok(v) => Ok(v.as_slice().try_into().map(u64::from_le_bytes).unwrap_or(0)),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(0),
            Err(e) => Err(error::from_meta(e, "part size")),
        }
    }

    /// Where part `n` of `length` bytes goes in `data`, if it may go there:
    /// its length is known and at most P, and this request created the
    /// part's entry (so no other writer uses that region).
    async fn in_place_slot(&self, up: &Upload, n: i32, length: Option<u64>) -> Result<Option<(u64, u64)>, S3Error> {
        let Some(len) = length.filter(|&l| l > 0 && l <= self.cfg.limits.max_part_bytes) else {
            return Ok(None);
        };
        let p = self.part_size(up, len).await?;
        if p == 0 || len > p {
            return Ok(None);
        }
        let Some(offset) = (n as u64 - 1).checked_mul(p).filter(|o| o.saturating_add(len) <= self.cfg.limits.max_object_bytes) else {
            return Ok(None);
        };
        match self.store.fs.meta().create(up.dir, &part_name(n), FILE_MODE, true).await {
            Ok(_) => Ok(Some((offset, len))),
            Err(e) if e.code() == ErrorCode::AlreadyExists => Ok(None),
            Err(e) if e.code() == ErrorCode::NotFound => Err(error::no_such_upload("(this upload)")),
            Err(e) => Err(error::from_meta(e, "part")),
        }
    }

    async fn write_in_place(
        &self,
        up: &Upload,
        n: i32,
        offset: u64,
        size: u64,
        body: Option<StreamingBlob>,
        digests: &mut BodyDigests,
    ) -> Result<(), S3Error> {
        let flags = fskv_client::OpenFlags::read_write();
        let handle = Arc::new(self.store.fs.open_at(up.dir, DATA_FILE, flags).await.map_err(|e| error::from_file(e, "upload data"))?);
        let limits = &self.cfg.limits;
        let wrote = write::receive_at(&handle, offset, body, digests, size, limits).await;
        let closed = match Arc::try_unwrap(handle) {
            Ok(h) => h.close().await.map(|_| ()).map_err(|e| error::from_file(e, "upload data")),
            Err(_) => Err(error::internal("a write of the part is still running")),
        };
        wrote?;
        closed?;
        if digests.size != size {
            // The caller removes the claim: the part counts as not uploaded.
            return Err(S3Error::with_message(
                S3ErrorCode::IncompleteBody,
                format!("part {n}: {} bytes received, Content-Length said {size}", digests.size),
            ));
        }
        Ok(())
    }

    /// Removes the in-place claim of part `n` whose write failed with `why`,
    /// so that it neither counts nor keeps completion from working in place.
    async fn drop_claim(&self, dir: InodeId, n: i32, why: &S3Error) {
        if let Err(e) = self.store.fs.meta().unlink(dir, &part_name(n)).await {
            tracing::debug!(part = n, error = %e, failed = %why.code().as_str(), "could not remove the claim of a failed in-place part");
        }
    }

    /// After `record` of part `n` finished: forgets the attempts of `n` that
    /// finished before it started (best effort; see the module's rules).
    async fn remove_stale(&self, dir: InodeId, n: i32, record: &PartRecord) {
        let attempts = match self.attempts(dir, n - 1, Some(n)).await {
            Ok(a) => a.parts.into_iter().next().map(|(_, v)| v).unwrap_or_default(),
            Err(e) => {
                tracing::debug!(part = n, error = %e.code().as_str(), "could not read the part's attempts");
                return;
            }
        };
        for a in stale_attempts(&attempts, record.started_ns) {
            // A stale in-place claim goes too: its write is over, so its
            // region of `data` may be claimed again.
            if let Err(e) = self.store.fs.meta().unlink(dir, &a.name).await {
                tracing::debug!(part = n, entry = %a.name, error = %e, "could not remove a stale attempt");
            }
        }
    }

    /// Makes an in-place part count: its record on the entry it created.
    async fn record_in_place(&self, dir: InodeId, n: i32, record: &PartRecord) -> Result<(), S3Error> {
        let entry = self.store.fs.meta().lookup(dir, &part_name(n)).await.map_err(|_| error::no_such_upload("(this upload)"))?;
        match self.store.fs.meta().set_xattr(entry.id, XATTR_PART, &record.encode(), XattrFlag::Any).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => Err(S3Error::with_message(
                S3ErrorCode::InternalError,
                format!("part {n} was replaced by a concurrent upload of the same part; send it again"),
            )),
            Err(e) => Err(error::from_meta(e, "part")),
        }
    }

    async fn publish_part(&self, dir: InodeId, n: i32, data: &Data, record: &PartRecord) -> Result<(), S3Error> {
        let attrs = PublishAttrs { length: None, mtime_ns: Some(record.mtime_ns), xattrs: vec![(XATTR_PART.into(), record.encode())] };
        let name = attempt_name(n, &record.etag);
        let r = match data {
            Data::Inline(b) => self
                .store
                .fs
                .meta()
                .create_write_publish(dir, &name, FILE_MODE, b, None, attrs)
                .await
                .map_err(|e| (e.code(), e.to_string())),
            Data::Temp(h) => self.store.fs.publish(h, dir, &name, None, attrs).await.map_err(|e| (e.code(), e.to_string())),
        };
        match r {
            Ok(_) => Ok(()),
            // The upload was completed or aborted meanwhile.
            Err((ErrorCode::NotFound, _)) => Err(error::no_such_upload("(this upload)")),
            Err((code, msg)) => Err(error::from_code(code, &name, &msg)),
        }
    }

    pub async fn upload_part_copy(&self, input: &UploadPartCopyInput) -> Result<UploadPartCopyOutput, S3Error> {
        self.check_part_number(input.part_number)?;
        let started_ns = write::now_ns();
        let up = self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let CopySource::Bucket { bucket: src_bucket, key: src_key, version_id: src_version } = &input.copy_source else {
            return Err(error::invalid_argument("copying from an access point is not supported"));
        };
        let (_, _, src) = self.locate_for_read(src_bucket, src_key, src_version.as_deref()).await?;
        if src.dir {
            return Err(error::no_such_key(src_key));
        }
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
        let record = PartRecord { etag, size: end - start, mtime_ns: write::now_ns(), started_ns, ..PartRecord::default() };
        self.publish_part(up.dir, input.part_number, &data, &record).await?;
        self.remove_stale(up.dir, input.part_number, &record).await;
        Ok(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(record.etag.clone())),
                last_modified: Some(timestamp(record.mtime_ns)),
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

    /// The finished attempts of the parts numbered above `after` (up to
    /// part `until` when given), with whether an in-place write is running.
    /// Entries without a record are attempts that did not finish.
    async fn attempts(&self, dir: InodeId, after: i32, until: Option<i32>) -> Result<Attempts, S3Error> {
        let mut out = Attempts::default();
        let mut cursor = if after > 0 { format!("{}/", part_name(after)) } else { String::new() };
        loop {
            let (entries, more) = self.store.fs.meta().readdir(dir, &cursor, 1000, true).await.map_err(|e| error::from_meta(e, "parts"))?;
            if let Some(last) = entries.last() {
                cursor = last.name.clone();
            }
            let mut past_end = false;
            let files: Vec<_> = entries
                .into_iter()
                .filter_map(|e| {
                    let n = part_of(&e.name)?;
                    if until.is_some_and(|u| n > u) {
                        past_end = true;
                        return None;
                    }
                    (n > after).then_some((n, e.name, e.attr?))
                })
                .collect();
            let ops = files.iter().map(|(_, _, i)| MetaOp::GetXattr { inode: i.id, name: XATTR_PART.into() }).collect::<Vec<_>>();
            let replies = if ops.is_empty() {
                Vec::new()
            } else {
                self.store.fs.meta().batch(ops).await.map_err(|e| error::from_meta(e, "parts"))?
            };
            for ((n, name, inode), r) in files.into_iter().zip(replies) {
                let record = match r {
                    Ok(MetaReply::Xattr(d)) => serde_json::from_slice::<PartRecord>(&d).ok(),
                    _ => None,
                };
                match record {
                    Some(record) => out.parts.entry(n).or_default().push(Attempt { name, inode, record }),
                    None if !name.contains('.') => out.in_flight = true,
                    None => {}
                }
            }
            if !more || past_end {
                return Ok(out);
            }
        }
    }

    pub async fn list_parts(&self, input: &ListPartsInput) -> Result<ListPartsOutput, S3Error> {
        let up = self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let max = input.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
        let after = input.part_number_marker.unwrap_or(0).max(0);
        let all = self.attempts(up.dir, after, None).await?;
        let mut parts: Vec<(i32, PartRecord)> =
            all.parts.iter().filter_map(|(n, a)| Some((*n, current_attempt(a)?.record.clone()))).take(max.saturating_add(1)).collect();
        let truncated = parts.len() > max;
        parts.truncate(max);
        let next = parts.last().map(|(n, _)| *n);
        Ok(ListPartsOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            upload_id: Some(input.upload_id.clone()),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: if truncated { next } else { None },
            initiator: Some(super::initiator()),
            owner: Some(super::owner()),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            parts: Some(
                parts
                    .into_iter()
                    .map(|(n, m)| {
                        let mut part = Part {
                            part_number: Some(n),
                            size: Some(m.size as i64),
                            e_tag: Some(ETag::Strong(m.etag.clone())),
                            last_modified: Some(timestamp(m.mtime_ns)),
                            ..Part::default()
                        };
                        crate::set_checksums!(part, &m.checksums);
                        part
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
        match self.complete_once(input).await {
            Ok(out) => Ok(out),
            // The upload is gone or lost its parts under this request: it
            // may have been completed (a retry, or two completions racing).
            Err(e) if matches!(e.code(), S3ErrorCode::NoSuchUpload | S3ErrorCode::NoSuchKey | S3ErrorCode::InvalidPart) => {
                match self.completed_before(input).await {
                    Some(out) => {
                        tracing::info!(upload = %input.upload_id, key = %input.key, "completion repeated: answered from the object it made");
                        Ok(out)
                    }
                    None => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The answer of an earlier completion of this upload with the same
    /// part list, if the current object at the key is the one it made.
    async fn completed_before(&self, input: &CompleteMultipartUploadInput) -> Option<CompleteMultipartUploadOutput> {
        check_upload_id(&input.upload_id).ok()?;
        let (dir, path) = self.store.locate(&input.bucket, &input.key).await.ok()?;
        let bucket = dir.id;
        let obj = find_object(&self.store, bucket, &path).await.ok()??;
        if obj.dir || obj.meta.upload_id.as_deref() != Some(input.upload_id.as_str()) {
            return None;
        }
        let listed = input.multipart_upload.as_ref()?.parts.as_ref()?;
        if listed.len() != obj.meta.part_sizes.len() {
            return None;
        }
        let etags: Option<Vec<String>> = listed.iter().map(|p| p.e_tag.as_ref().map(|e| e.value().trim_matches('"').to_string())).collect();
        if let Some(etags) = etags {
            if objmeta::multipart_etag(&etags).as_deref() != Some(obj.meta.etag.as_str()) {
                return None;
            }
        }
        Some(completed_output(input, &obj.meta.etag))
    }

    async fn complete_once(&self, input: &CompleteMultipartUploadInput) -> Result<CompleteMultipartUploadOutput, S3Error> {
        let (bucket_dir, path) = self.store.locate(&input.bucket, &input.key).await?;
        let bucket = bucket_dir.id;
        let up = self.upload(&input.bucket, &input.key, &input.upload_id).await?;
        let wanted = input
            .multipart_upload
            .as_ref()
            .and_then(|m| m.parts.as_ref())
            .filter(|p| !p.is_empty())
            .ok_or_else(|| S3Error::with_message(S3ErrorCode::MalformedXML, "CompleteMultipartUpload lists no parts"))?;
        let stored = self.attempts(up.dir, 0, None).await?;
        // Every listed part must exist with its ETag before sizes are judged.
        let mut chosen: Vec<(Inode, PartRecord)> = Vec::with_capacity(wanted.len());
        let mut last = 0;
        for p in wanted.iter() {
            let n = p.part_number.ok_or_else(|| S3Error::with_message(S3ErrorCode::InvalidPart, "a part without a number"))?;
            if n <= last {
                return Err(S3Error::with_message(S3ErrorCode::InvalidPartOrder, "parts must be listed in ascending order of number"));
            }
            last = n;
            let attempts = stored
                .parts
                .get(&n)
                .ok_or_else(|| S3Error::with_message(S3ErrorCode::InvalidPart, format!("part {n} was not uploaded")))?;
            // The XML form may carry the quotes of the header form.
            let listed = p.e_tag.as_ref().map(|e| e.value().trim_matches('"').to_string());
            let a = choose_attempt(attempts, listed.as_deref()).ok_or_else(|| {
                S3Error::with_message(S3ErrorCode::InvalidPart, format!("part {n}: the ETag does not match the uploaded part"))
            })?;
            chosen.push((a.inode.clone(), a.record.clone()));
        }
        for (i, (_, rec)) in chosen.iter().enumerate() {
            if i + 1 < chosen.len() && rec.size < self.cfg.limits.min_part_bytes {
                return Err(S3Error::with_message(
                    S3ErrorCode::EntityTooSmall,
                    format!(
                        "part {} has {} bytes; every part but the last needs at least {}",
                        i + 1,
                        rec.size,
                        self.cfg.limits.min_part_bytes
                    ),
                ));
            }
        }
        let size: u64 = chosen.iter().map(|(_, m)| m.size).sum();
        if size > self.cfg.limits.max_object_bytes {
            return Err(S3Error::with_message(S3ErrorCode::EntityTooLarge, format!("the object would have {size} bytes")));
        }
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
            upload_id: Some(input.upload_id.clone()),
            part_checksums: objmeta::kept_part_checksums(chosen.iter().map(|(_, m)| &m.checksums)),
            acl: up.record.acl,
            ..ObjectMeta::default()
        };
        let tags = (!up.record.tags.is_empty()).then_some(&up.record.tags);
        let conditional = input.if_match.is_some() || input.if_none_match.is_some();
        let published = if !conditional
            && !stored.in_flight
            && all_in_place(&chosen)
            && size > fskv_proto::meta::DEFAULT_INLINE_MAX_BYTES as u64
        {
            self.complete_in_place(&input.bucket, bucket, &path, &input.key, up.dir, meta, tags).await?
        } else {
            let expected =
                object::write_expectation(&self.store, bucket, &path, &input.key, input.if_match.as_ref(), input.if_none_match.as_ref())
                    .await?;
            let parent = self.store.ensure_dirs(bucket, path.parent(), &input.key).await?;
            tracing::info!(key = %input.key, bytes = size, parts = chosen.len(), conditional, "multipart upload completed by copying its parts inside the cluster");
            let data = self.concatenate(parent, up.dir, &chosen, size).await?;
            let new = super::versioning::NewObject::Data(&data);
            self.publish_object(&input.bucket, bucket, &path, &input.key, new, meta, tags, expected).await?
        };
        if let Some(dir) = self.uploads_dir(&input.bucket, false).await? {
            if let Err(e) = self.store.fs.meta().remove_tree(dir, &input.upload_id).await {
                tracing::warn!(upload = %input.upload_id, error = %e, "completed, but the staged parts could not be removed now; the expiry scan will");
            }
        }
        let mut out = completed_output(input, &published.meta.etag);
        out.version_id = published.version_id;
        Ok(out)
    }

    /// Every part in place: `data` becomes the object without a copy. It is
    /// cut to the object's length, given its mtime and metadata while still
    /// in the upload directory, then renamed onto the key (one transaction,
    /// atomically replacing an old object).
    #[allow(clippy::too_many_arguments)]
    async fn complete_in_place(
        &self,
        bucket_name: &str,
        bucket: InodeId,
        path: &crate::paths::ObjectPath,
        key: &str,
        dir: InodeId,
        mut meta: ObjectMeta,
        tags: Option<&TagList>,
    ) -> Result<super::versioning::Published, S3Error> {
        let fs = &self.store.fs;
        let handle =
            fs.open_at(dir, DATA_FILE, fskv_client::OpenFlags::read_write()).await.map_err(|e| error::from_file(e, "upload data"))?;
        handle.truncate(meta.size).await.map_err(|e| error::from_file(e, "upload data"))?;
        let closed = handle.close().await.map_err(|e| error::from_file(e, "upload data"))?;
        if closed != meta.size {
            return Err(error::internal(format_args!("the assembled object has {closed} bytes, expected {}", meta.size)));
        }
        let data = fs.meta().lookup(dir, DATA_FILE).await.map_err(|e| error::from_meta(e, "upload data"))?;
        meta.mtime_ns = write::now_ns();
        // The owner too: `data` of an upload started before objects were
        // created owned by their tenant is root's; it becomes the tenant's
        // here, in the call that sets the mtime (no extra call).
        let (uid, gid) = self.store.owner_attr();
        let attr =
            fskv_proto::meta::SetAttr { mtime_ns: Some(meta.mtime_ns), atime_ns: Some(meta.mtime_ns), uid, gid, ..Default::default() };
        fs.meta().setattr(data.id, attr).await.map_err(|e| error::from_meta(e, key))?;
        fs.meta().set_xattr(data.id, XATTR_META, &meta.encode(), XattrFlag::Any).await.map_err(|e| error::from_meta(e, key))?;
        if let Some(t) = tags {
            fs.meta()
                .set_xattr(data.id, objmeta::XATTR_TAGS, &objmeta::encode_tags(t), XattrFlag::Any)
                .await
                .map_err(|e| error::from_meta(e, key))?;
        }
        if self.store.versioning_of(bucket).await? != crate::versions::Versioning::Off {
            let new = super::versioning::NewObject::Move { dir, name: DATA_FILE, inode: data.id };
            let published = self.publish_object(bucket_name, bucket, path, key, new, meta, tags, None).await?;
            tracing::info!(%key, bytes = published.meta.size, "multipart upload completed in place (no copy), versioned");
            return Ok(published);
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let parent = self.store.ensure_dirs(bucket, path.parent(), key).await?;
            match fs.meta().rename(dir, DATA_FILE, parent, path.name()).await {
                Ok(()) => {
                    tracing::info!(%key, bytes = meta.size, parts = meta.part_sizes.len(), "multipart upload completed in place (no copy)");
                    return Ok(super::versioning::Published { meta, version_id: None });
                }
                Err(e) if e.code() == ErrorCode::NotFound && attempt < 3 => self.store.dirs.clear(),
                Err(e) if e.code() == ErrorCode::IsDirectory => return Err(error::exists_as_prefix(key)),
                Err(e) => return Err(error::from_meta(e, key)),
            }
        }
    }

    /// The parts' bytes, in order, as one new object's data (copied inside
    /// the cluster: from the upload's `data` file for in-place parts, from
    /// the part's own file otherwise).
    async fn concatenate(&self, parent: InodeId, dir: InodeId, parts: &[(Inode, PartRecord)], size: u64) -> Result<Data, S3Error> {
        let data_file = if parts.iter().any(|(_, r)| r.offset.is_some()) {
            let d = self.store.fs.meta().lookup(dir, DATA_FILE).await.map_err(|e| error::from_meta(e, "upload data"))?;
            Some(self.store.fs.reader(d).map_err(|e| error::from_file(e, "upload data"))?)
        } else {
            None
        };
        if size <= fskv_proto::meta::DEFAULT_INLINE_MAX_BYTES as u64 {
            let mut all = Vec::with_capacity(size as usize);
            for (inode, rec) in parts {
                let bytes = match (rec.offset, &data_file) {
                    (Some(off), Some(d)) => d.read_at(off, rec.size).await.map_err(|e| error::from_file(e, "upload data"))?,
                    _ => self
                        .store
                        .fs
                        .reader(inode.clone())
                        .map_err(|e| error::from_file(e, "part"))?
                        .read_at(0, rec.size)
                        .await
                        .map_err(|e| error::from_file(e, "part"))?,
                };
                all.extend_from_slice(&bytes);
            }
            return Ok(Data::Inline(all.into()));
        }
        let temp = Arc::new(self.store.fs.create_temp(parent, FILE_MODE).await.map_err(|e| error::from_file(e, "complete"))?);
        let mut jobs = Vec::new();
        let mut offset = 0;
        for (inode, rec) in parts {
            jobs.push((inode.clone(), rec.offset, offset, rec.size));
            offset += rec.size;
        }
        use futures::StreamExt;
        let data_file = &data_file;
        let results: Vec<Result<(), S3Error>> = futures::stream::iter(jobs.into_iter().map(|(inode, src_off, dst_off, len)| {
            let temp = Arc::clone(&temp);
            async move {
                match (src_off, data_file) {
                    (Some(off), Some(d)) => super::copy::copy_range(d, &temp, off, dst_off, len, &self.cfg.limits).await,
                    _ => {
                        // Inline parts (readdir strips their bytes) are read through meta by the copy.
                        let reader = self.store.fs.reader(inode).map_err(|e| error::from_file(e, "complete"))?;
                        super::copy::copy_range(&reader, &temp, 0, dst_off, len, &self.cfg.limits).await
                    }
                }
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
                let (entries, more) =
                    self.store.fs.meta().readdir(dir, &cursor, 1000, false).await.map_err(|e| error::from_meta(e, "uploads"))?;
                let ops: Vec<MetaOp> = entries.iter().map(|e| MetaOp::GetXattr { inode: e.inode, name: XATTR_UPLOAD.into() }).collect();
                let replies = if ops.is_empty() {
                    Vec::new()
                } else {
                    self.store.fs.meta().batch(ops).await.map_err(|e| error::from_meta(e, "uploads"))?
                };
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
            .filter(|(k, id, _)| {
                k.as_str() > key_marker.as_str() || (k == &key_marker && !id_marker.is_empty() && id.as_str() > id_marker.as_str())
            })
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
            delimiter: delim.map(str::to_string),
            uploads: Some(
                page.into_iter()
                    .map(|(key, id, ns)| MultipartUpload {
                        key: Some(key),
                        upload_id: Some(id),
                        initiated: Some(timestamp(ns)),
                        initiator: Some(super::initiator()),
                        owner: Some(super::owner()),
                        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                        ..MultipartUpload::default()
                    })
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
                let started =
                    u64::from_str_radix(u.name.get(..16).unwrap_or(""), 16).ok().or(u.attr.as_ref().map(|a| a.ctime_ns)).unwrap_or(0);
                if started < cutoff && self.store.fs.meta().remove_tree(b.inode, &u.name).await.is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

fn completed_output(input: &CompleteMultipartUploadInput, etag: &str) -> CompleteMultipartUploadOutput {
    CompleteMultipartUploadOutput {
        bucket: Some(input.bucket.clone()),
        key: Some(input.key.clone()),
        e_tag: Some(ETag::Strong(etag.to_string())),
        location: Some(format!("/{}/{}", input.bucket, input.key)),
        ..CompleteMultipartUploadOutput::default()
    }
}

/// Whether every part sits in `data` at its final offset.
fn all_in_place(parts: &[(Inode, PartRecord)]) -> bool {
    let mut at = 0u64;
    for (_, r) in parts {
        if r.offset != Some(at) {
            return false;
        }
        at += r.size;
    }
    true
}

/// `bytes=a-b` of a copy source of `size` bytes, as `[a, b+1)`: a
/// malformed value is 400 `InvalidArgument`, a range not within the source
/// 416 `InvalidRange` (as S3 answers both).
pub fn parse_copy_range(r: &str, size: u64) -> Result<(u64, u64), S3Error> {
    let bad = || error::invalid_argument(format!("x-amz-copy-source-range {r:?}: expected bytes=first-last"));
    let spec = r.strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    if a > b {
        return Err(bad());
    }
    if b >= size {
        return Err(error::invalid_range(format!("x-amz-copy-source-range {r:?} is not within the source's {size} bytes")));
    }
    Ok((a, b + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(etag: &str, started_ns: u64, mtime_ns: u64) -> Attempt {
        let record = PartRecord { etag: etag.into(), started_ns, mtime_ns, ..PartRecord::default() };
        let inode = Inode {
            id: InodeId(1),
            data: fskv_proto::meta::InodeData::Symlink { target: String::new() },
            acl: fskv_proto::meta::Acl { uid: 0, gid: 0, mode: 0o644 },
            nlink: 1,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            version: 0,
        };
        Attempt { name: attempt_name(1, etag), inode, record }
    }

    #[test]
    fn racing_attempts_are_both_kept_and_the_listed_one_is_used() {
        // A started at 10, B (a retry) at 20; A finished last (at 40).
        let a = rec("aa", 10, 40);
        let b = rec("bb", 20, 30);
        let both = vec![a.clone(), b.clone()];
        assert!(stale_attempts(&both, 20).is_empty(), "A finished after B started: kept");
        assert_eq!(current_attempt(&both).map(|x| x.record.etag.as_str()), Some("bb"), "ListParts shows the later-started");
        assert_eq!(choose_attempt(&both, Some("aa")).map(|x| x.record.etag.as_str()), Some("aa"));
        assert_eq!(choose_attempt(&both, Some("bb")).map(|x| x.record.etag.as_str()), Some("bb"));
        assert_eq!(choose_attempt(&both, None).map(|x| x.record.etag.as_str()), Some("bb"));
        assert!(choose_attempt(&both, Some("cc")).is_none(), "an ETag no attempt has: InvalidPart");
    }

    #[test]
    fn a_sequential_reupload_makes_the_earlier_attempt_stale() {
        let a = rec("aa", 10, 15);
        let b = rec("bb", 20, 30);
        let both = vec![a, b];
        let stale: Vec<&str> = stale_attempts(&both, 20).iter().map(|x| x.record.etag.as_str()).collect();
        assert_eq!(stale, ["aa"]);
    }

    #[test]
    fn entry_names_give_part_numbers() {
        assert_eq!(part_of("00007"), Some(7));
        assert_eq!(part_of(&attempt_name(10000, "0cc175b9c0f1b6a831c399e269772661")), Some(10000));
        assert_eq!(part_of("data"), None);
        assert_eq!(part_of("7"), None);
        // A readdir from `%05d/` skips every attempt of that part and no other.
        let after = format!("{}/", part_name(3));
        assert!(attempt_name(3, "ff").as_str() < after.as_str() && part_name(3).as_str() < after.as_str());
        assert!(part_name(4).as_str() > after.as_str());
    }

    #[test]
    fn copy_ranges_out_of_the_source_are_invalid_range() {
        assert_eq!(parse_copy_range("bytes=0-9", 10).ok(), Some((0, 10)));
        assert_eq!(parse_copy_range("bytes=0-10", 10).err().map(|e| e.code().clone()), Some(S3ErrorCode::InvalidRange));
        assert_eq!(parse_copy_range("bytes=50-60", 10).err().map(|e| e.code().clone()), Some(S3ErrorCode::InvalidRange));
        assert_eq!(parse_copy_range("bytes=5-2", 10).err().map(|e| e.code().clone()), Some(S3ErrorCode::InvalidArgument));
        assert_eq!(parse_copy_range("0-2", 10).err().map(|e| e.code().clone()), Some(S3ErrorCode::InvalidArgument));
    }
}
