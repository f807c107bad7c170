//! Making an object: receive the body (digests on the fly, chunk writes
//! pipelined into a temp file) and publish data, length and metadata in
//! one meta transaction. Shared by PutObject, CopyObject, UploadPart and
//! CompleteMultipartUpload.

use crate::body::BodyDigests;
use crate::config::Limits;
use crate::error;
use crate::objmeta::{self, ObjectMeta, TagList, XATTR_META, XATTR_TAGS};
use crate::paths::ObjectPath;
use crate::store::{Store, FILE_MODE};
use bytes::{Bytes, BytesMut};
use fskv_client::FileHandle;
use fskv_proto::meta::{Expected, Inode, PublishAttrs, DEFAULT_INLINE_MAX_BYTES};
use fskv_types::{ErrorCode, InodeId};
use futures::StreamExt;
use s3s::dto::StreamingBlob;
use s3s::S3Error;
use std::sync::Arc;
use tokio::task::JoinSet;

/// Where a new object's bytes are.
pub enum Data {
    /// Small enough to live in the inode.
    Inline(Bytes),
    /// Written to a temp file (see `FsClient::create_temp`).
    Temp(Arc<FileHandle>),
}

pub fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Reads `body` into a new object's data: inline if it ends within the
/// inline limit, else chunk-sized writes into a temp file in `temp_dir`
/// with at most `limits.max_inflight_write_bytes` unacknowledged.
pub async fn receive(
    store: &Store,
    temp_dir: InodeId,
    body: Option<StreamingBlob>,
    digests: &mut BodyDigests,
    max_bytes: u64,
    limits: &Limits,
) -> Result<Data, S3Error> {
    let Some(mut body) = body else { return Ok(Data::Inline(Bytes::new())) };
    let mut head = BytesMut::new();
    let mut rest_first: Option<Bytes> = None;
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(body_error)?;
        account(digests, &piece, max_bytes).await?;
        if head.len() + piece.len() > DEFAULT_INLINE_MAX_BYTES {
            rest_first = Some(piece);
            break;
        }
        head.extend_from_slice(&piece);
    }
    let Some(first) = rest_first else { return Ok(Data::Inline(head.freeze())) };
    let temp = Arc::new(store.fs.create_temp(temp_dir, FILE_MODE).await.map_err(|e| error::from_file(e, "new object"))?);
    pump(&temp, 0, &head, Some(first), &mut body, digests, max_bytes, limits).await?;
    Ok(Data::Temp(temp))
}

/// Reads `body` into `handle` from byte `base` on (a region of an existing
/// file: an in-place multipart part), with the pipelining of [`receive`].
pub async fn receive_at(
    handle: &Arc<FileHandle>,
    base: u64,
    body: Option<StreamingBlob>,
    digests: &mut BodyDigests,
    max_bytes: u64,
    limits: &Limits,
) -> Result<(), S3Error> {
    let Some(mut body) = body else { return Ok(()) };
    pump(handle, base, &[], None, &mut body, digests, max_bytes, limits).await
}

/// Writes `head`, `first` and the rest of `body` at `base..` of `handle` in
/// blocks aligned to the file's chunks, at most
/// `limits.max_inflight_write_bytes` unacknowledged.
#[allow(clippy::too_many_arguments)]
async fn pump(
    handle: &Arc<FileHandle>,
    base: u64,
    head: &[u8],
    first: Option<Bytes>,
    body: &mut StreamingBlob,
    digests: &mut BodyDigests,
    max_bytes: u64,
    limits: &Limits,
) -> Result<(), S3Error> {
    let chunk = u64::from(handle.layout().chunk_size_bytes).max(4096);
    let max_inflight = (limits.max_inflight_write_bytes / chunk).max(1) as usize;
    // Chunk writes run as tasks so they progress while the body is read.
    let mut writes: JoinSet<fskv_client::file::Result<()>> = JoinSet::new();
    let mut offset = base;
    let block_len = |at: u64| (chunk - at % chunk) as usize;
    let mut block = BytesMut::with_capacity(block_len(offset));
    let (mut next_piece, mut pending_first) = if head.is_empty() { (first, None) } else { (Some(Bytes::copy_from_slice(head)), first) };
    loop {
        if let Some(mut piece) = next_piece.take() {
            while !piece.is_empty() {
                let want = block_len(offset);
                let take = (want - block.len()).min(piece.len());
                block.extend_from_slice(&piece.split_to(take));
                if block.len() == want {
                    let data = std::mem::replace(&mut block, BytesMut::with_capacity(chunk as usize)).freeze();
                    let h = Arc::clone(handle);
                    let at = offset;
                    writes.spawn(async move { h.write_at(at, data).await });
                    offset += want as u64;
                    while writes.len() >= max_inflight {
                        join_one(&mut writes).await?;
                    }
                }
            }
        }
        if let Some(f) = pending_first.take() {
            next_piece = Some(f);
            continue;
        }
        match body.next().await {
            Some(piece) => {
                let piece = piece.map_err(body_error)?;
                account(digests, &piece, max_bytes).await?;
                next_piece = Some(piece);
            }
            None => break,
        }
    }
    if !block.is_empty() {
        let h = Arc::clone(handle);
        let data = block.split().freeze();
        writes.spawn(async move { h.write_at(offset, data).await });
    }
    while !writes.is_empty() {
        join_one(&mut writes).await?;
    }
    Ok(())
}

async fn join_one(writes: &mut JoinSet<fskv_client::file::Result<()>>) -> Result<(), S3Error> {
    match writes.join_next().await {
        Some(Ok(Ok(()))) | None => Ok(()),
        Some(Ok(Err(e))) => Err(error::from_file(e, "new object")),
        Some(Err(e)) => Err(error::internal(format_args!("a chunk write task failed: {e}"))),
    }
}

async fn account(digests: &mut BodyDigests, piece: &Bytes, max_bytes: u64) -> Result<(), S3Error> {
    digests.feed(piece).await?;
    if digests.size > max_bytes {
        return Err(S3Error::with_message(s3s::S3ErrorCode::EntityTooLarge, format!("the body is larger than {max_bytes} bytes")));
    }
    Ok(())
}

fn body_error(e: s3s::StdError) -> S3Error {
    // The shared layer's limits (size, progress timeout) on the body.
    if let Some(g) = fskv_gateway::GatewayError::from_body_error(e.as_ref()) {
        tracing::debug!(error = %g, "request body cut");
        return error::from_gateway(g);
    }
    // A signature or checksum failure inside an aws-chunked body surfaces here.
    let msg = e.to_string();
    tracing::debug!(error = %msg, "request body failed");
    if msg.contains("Sha256Mismatch") {
        return error::payload_sha256_mismatch();
    }
    if msg.contains("signature") || msg.contains("Signature") {
        return S3Error::with_message(s3s::S3ErrorCode::SignatureDoesNotMatch, msg);
    }
    S3Error::with_message(s3s::S3ErrorCode::IncompleteBody, format!("reading the request body: {msg}"))
}

/// Publishes `data` as `path` in `bucket` with `meta` (its etag and size
/// filled by the caller) and `tags`, if `expected` holds. Makes missing
/// parent directories; retries when a concurrent delete removed one.
#[allow(clippy::too_many_arguments)]
pub async fn publish(
    store: &Store,
    bucket: InodeId,
    path: &ObjectPath,
    key: &str,
    data: &Data,
    mut meta: ObjectMeta,
    tags: Option<&TagList>,
    expected: Option<Expected>,
) -> Result<(Inode, ObjectMeta), S3Error> {
    meta.mtime_ns = now_ns();
    let mut xattrs = vec![(XATTR_META.to_string(), meta.encode())];
    if let Some(t) = tags.filter(|t| !t.is_empty()) {
        xattrs.push((XATTR_TAGS.to_string(), objmeta::encode_tags(t)));
    }
    let attrs = PublishAttrs { length: None, mtime_ns: Some(meta.mtime_ns), xattrs };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let parent = store.ensure_dirs(bucket, path.parent(), key).await?;
        let result = match data {
            Data::Inline(b) => store
                .fs
                .meta()
                .create_write_publish(parent, path.name(), FILE_MODE, b, expected.clone(), attrs.clone())
                .await
                .map_err(|e| (e.code(), e.to_string())),
            Data::Temp(h) => {
                store.fs.publish(h, parent, path.name(), expected.clone(), attrs.clone()).await.map_err(|e| (e.code(), e.to_string()))
            }
        };
        match result {
            Ok(inode) => return Ok((inode, meta)),
            Err((ErrorCode::NotFound, msg)) if attempt < 3 => {
                tracing::debug!(%key, error = %msg, "parent directory vanished during publish; retrying");
                store.dirs.clear();
            }
            Err((ErrorCode::IsDirectory, _)) => return Err(error::exists_as_prefix(key)),
            Err((code, msg)) => return Err(error::from_code(code, key, &msg)),
        }
    }
}
