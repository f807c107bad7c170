//! Request bodies in (digests, checksum checks) and object data out
//! (a bounded read-ahead stream).

use crate::error;
use crate::objmeta::Checksums;
use base64::Engine as _;
use bytes::Bytes;
use fskv_client::{FileHandle, FsClient};
use fskv_types::InodeId;
use futures::StreamExt;
use http::HeaderMap;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Crc32, Crc32c, Crc64Nvme, Md5, Sha1, Sha256};
use s3s::S3Error;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The checksum algorithms S3 defines, by the suffix of their header.
pub const ALGORITHMS: [&str; 5] = ["crc32", "crc32c", "crc64nvme", "sha1", "sha256"];

/// Digests computed over a body as it streams in, on the caller's thread
/// (copies, small bodies; [`BodyDigests`] for request bodies).
pub struct Digests {
    md5: Md5,
    sums: ChecksumHasher,
    /// The SHA-256 of the payload, when the request signed it and the
    /// gateway (not s3s) checks it ([`crate::server::PreVerified`]).
    payload: Option<Sha256>,
    pub size: u64,
}

impl Digests {
    /// MD5 always; the checksums named in `algorithms` (lowercase suffixes).
    pub fn new(algorithms: &[String]) -> Digests {
        let mut sums = ChecksumHasher::default();
        for a in algorithms {
            match a.as_str() {
                "crc32" => sums.crc32 = Some(Crc32::new()),
                "crc32c" => sums.crc32c = Some(Crc32c::new()),
                "crc64nvme" => sums.crc64nvme = Some(Crc64Nvme::new()),
                "sha1" => sums.sha1 = Some(Sha1::new()),
                "sha256" => sums.sha256 = Some(Sha256::new()),
                _ => {}
            }
        }
        Digests { md5: Md5::new(), sums, payload: None, size: 0 }
    }

    pub fn update(&mut self, data: &[u8]) {
        self.md5.update(data);
        self.sums.update(data);
        if let Some(p) = &mut self.payload {
            p.update(data);
        }
        self.size += data.len() as u64;
    }

    /// (binary MD5, checksums as base64).
    pub fn finish(self) -> ([u8; 16], Checksums) {
        let c = self.sums.finalize();
        let sums = Checksums {
            crc32: c.checksum_crc32,
            crc32c: c.checksum_crc32c,
            crc64nvme: c.checksum_crc64nvme,
            sha1: c.checksum_sha1,
            sha256: c.checksum_sha256,
            kind: None,
        };
        (self.md5.finalize(), sums)
    }

    /// [`Digests::finish`], also checking the payload SHA-256 against
    /// `want` when the payload hash is the gateway's to check.
    fn finish_checked(mut self, want: Option<&[u8; 32]>) -> Result<([u8; 16], Checksums), S3Error> {
        if let (Some(want), Some(p)) = (want, self.payload.take()) {
            if p.finalize().as_slice() != want.as_slice() {
                return Err(error::payload_sha256_mismatch());
            }
        }
        Ok(self.finish())
    }
}

/// Bodies up to this size are hashed on the request's task; beyond it
/// [`BodyDigests`] moves the hashing to a blocking-pool thread.
pub const OFFLOAD_MIN_BYTES: u64 = 1 << 20;
/// Pieces queued for the hashing thread (hyper's pieces are at most a few
/// hundred KiB, so this bounds the queue to a few MiB per request).
pub const OFFLOAD_QUEUE_PIECES: usize = 16;

/// The digests of a request body, computed off the request's critical path:
///
/// | body so far | where the pieces are hashed |
/// |---|---|
/// | < [`OFFLOAD_MIN_BYTES`] | inline, on the request's task (no thread hop for small objects) |
/// | ≥ [`OFFLOAD_MIN_BYTES`] | on one blocking-pool thread fed through a bounded channel of `Bytes` (no copy), pipelined with receiving and the chain writes; a full queue makes the receiver wait (back-pressure) |
///
/// Hashed: MD5 (the ETag, Content-MD5), the checksums the request asks
/// for, and the payload SHA-256 only when the gateway checks it
/// ([`BodyDigests::expect_payload_sha256`]: a signed payload the shared
/// layer pre-verified; s3s checks the others, and `UNSIGNED-PAYLOAD` has none).
/// [`BodyDigests::finish`] waits for the thread, so nothing is published
/// before every digest is known and checked.
pub struct BodyDigests {
    inline: Option<Digests>,
    offload: Option<(tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<Digests>)>,
    payload_sha256: Option<[u8; 32]>,
    pub size: u64,
}

impl BodyDigests {
    pub fn new(algorithms: &[String]) -> BodyDigests {
        BodyDigests { inline: Some(Digests::new(algorithms)), offload: None, payload_sha256: None, size: 0 }
    }

    /// Also hash the payload with SHA-256 and fail [`BodyDigests::finish`]
    /// with `XAmzContentSHA256Mismatch` unless it is `want`.
    pub fn expect_payload_sha256(mut self, want: Option<[u8; 32]>) -> BodyDigests {
        if let (Some(w), Some(d)) = (want, self.inline.as_mut()) {
            d.payload = Some(Sha256::new());
            self.payload_sha256 = Some(w);
        }
        self
    }

    /// Hashes `piece` (inline or on the hashing thread).
    pub async fn feed(&mut self, piece: &Bytes) -> Result<(), S3Error> {
        self.size += piece.len() as u64;
        if let Some(d) = self.inline.as_mut() {
            d.update(piece);
            if self.size >= OFFLOAD_MIN_BYTES {
                if let Some(d) = self.inline.take() {
                    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(OFFLOAD_QUEUE_PIECES);
                    let done = tokio::task::spawn_blocking(move || {
                        let mut d = d;
                        while let Some(b) = rx.blocking_recv() {
                            d.update(&b);
                        }
                        d
                    });
                    self.offload = Some((tx, done));
                }
            }
            return Ok(());
        }
        match &self.offload {
            Some((tx, _)) => tx.send(piece.clone()).await.map_err(|_| error::internal("the hashing thread of the body stopped")),
            None => Err(error::internal("body digests fed after they finished")),
        }
    }

    /// (binary MD5, checksums as base64), once every piece is hashed.
    pub async fn finish(mut self) -> Result<([u8; 16], Checksums), S3Error> {
        let want = self.payload_sha256;
        if let Some(d) = self.inline.take() {
            return d.finish_checked(want.as_ref());
        }
        let Some((tx, done)) = self.offload.take() else { return Err(error::internal("body digests finished twice")) };
        drop(tx);
        let d = done.await.map_err(|e| error::internal(format_args!("the hashing thread of the body failed: {e}")))?;
        d.finish_checked(want.as_ref())
    }
}

/// The checksums a request asks for: values sent in headers, algorithms
/// named by `x-amz-sdk-checksum-algorithm` / `x-amz-checksum-algorithm`, and
/// those announced as trailers (`x-amz-trailer`).
pub fn requested_algorithms(headers: &HeaderMap) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |a: &str| {
        let a = a.trim().to_ascii_lowercase();
        if ALGORITHMS.contains(&a.as_str()) && !out.contains(&a) {
            out.push(a);
        }
    };
    for a in ALGORITHMS {
        if headers.contains_key(format!("x-amz-checksum-{a}").as_str()) {
            add(a);
        }
    }
    for h in ["x-amz-sdk-checksum-algorithm", "x-amz-checksum-algorithm"] {
        if let Some(v) = headers.get(h).and_then(|v| v.to_str().ok()) {
            add(v);
        }
    }
    if let Some(v) = headers.get("x-amz-trailer").and_then(|v| v.to_str().ok()) {
        for t in v.split(',') {
            if let Some(a) = t.trim().to_ascii_lowercase().strip_prefix("x-amz-checksum-") {
                add(a);
            }
        }
    }
    out
}

/// Checks the computed checksums against the values the client sent in
/// headers or trailers, and Content-MD5. A checksum announced in
/// `x-amz-trailer` must be in the trailers: a body that ends without it
/// (a cut request, a client bug) is refused as AWS does, rather than stored
/// unchecked.
pub fn verify(headers: &HeaderMap, trailers: Option<&HeaderMap>, md5: &[u8; 16], sums: &Checksums) -> Result<(), S3Error> {
    if let Some(v) = headers.get("x-amz-trailer") {
        let announced = v.to_str().map_err(|_| error::malformed_trailer("x-amz-trailer is not ASCII".into()))?;
        for name in announced.split(',').map(|t| t.trim().to_ascii_lowercase()).filter(|t| t.starts_with("x-amz-checksum-")) {
            if !trailers.is_some_and(|t| t.contains_key(name.as_str())) {
                return Err(error::malformed_trailer(format!("the body ended without the trailer {name} that x-amz-trailer announced")));
            }
        }
    }
    if let Some(v) = headers.get("content-md5") {
        let want = v.to_str().ok().and_then(|s| base64::engine::general_purpose::STANDARD.decode(s.trim()).ok());
        match want {
            Some(w) if w.as_slice() == md5.as_slice() => {}
            Some(_) => return Err(bad_digest_md5()),
            None => return Err(S3Error::with_message(s3s::S3ErrorCode::InvalidDigest, "Content-MD5 is not base64 of 16 bytes")),
        }
    }
    for (alg, got) in
        [("crc32", &sums.crc32), ("crc32c", &sums.crc32c), ("crc64nvme", &sums.crc64nvme), ("sha1", &sums.sha1), ("sha256", &sums.sha256)]
    {
        let name = format!("x-amz-checksum-{alg}");
        let sent = headers.get(name.as_str()).or_else(|| trailers.and_then(|t| t.get(name.as_str())));
        let Some(sent) = sent.and_then(|v| v.to_str().ok()) else { continue };
        if got.as_deref() != Some(sent.trim()) {
            return Err(error::bad_digest(format!("the {} you specified did not match the calculated checksum", alg.to_ascii_uppercase())));
        }
    }
    Ok(())
}

fn bad_digest_md5() -> S3Error {
    error::bad_digest("the Content-MD5 you specified did not match what we received")
}

/// A `Stream` over a channel: `Send + Sync`, as s3s wants response bodies.
pub struct ChannelStream(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl futures::Stream for ChannelStream {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// How an object's bytes `[start, end)` are streamed out.
pub struct ReadPlan {
    pub inode: InodeId,
    pub start: u64,
    pub end: u64,
    /// Bytes per read; pieces never cross a chunk boundary when this is the chunk size.
    pub piece_bytes: u64,
    /// Reads in flight ahead of the client.
    pub readahead: usize,
}

/// Streams `plan`'s range of `handle`, reading ahead; at the end checks
/// that the inode is still linked (a file replaced or removed during the
/// read may have had chunks reclaimed: the stream then fails instead of
/// ending with bytes that were never written).
pub fn stream_range(fs: FsClient, handle: FileHandle, plan: ReadPlan) -> ChannelStream {
    let (tx, rx) = tokio::sync::mpsc::channel(plan.readahead.max(1));
    let handle = Arc::new(handle);
    tokio::spawn(async move {
        let piece = plan.piece_bytes.max(4096);
        let mut offsets = Vec::new();
        let mut pos = plan.start;
        while pos < plan.end {
            // Align pieces after the first to `piece` so each read stays in one chunk.
            let next = ((pos / piece) + 1) * piece;
            let len = next.min(plan.end) - pos;
            offsets.push((pos, len));
            pos += len;
        }
        let mut reads = futures::stream::iter(offsets)
            .map(|(off, len)| {
                let h = Arc::clone(&handle);
                async move { h.read_at(off, len).await.map(|b| (b, len)) }
            })
            .buffered(plan.readahead.max(1));
        while let Some(r) = reads.next().await {
            let item = match r {
                Ok((b, len)) if b.len() as u64 == len => Ok(b),
                Ok((b, len)) => Err(std::io::Error::other(format!("object shrank while read: {} of {len} bytes", b.len()))),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                return;
            }
        }
        match fs.meta().stat(plan.inode).await {
            Ok(i) if i.nlink > 0 => {}
            _ => {
                tracing::warn!(inode = %plan.inode, "object replaced or removed while streamed; failing the response");
                let _ = tx.send(Err(std::io::Error::other("the object was replaced or removed while being read"))).await;
            }
        }
    });
    ChannelStream(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use s3s::S3ErrorCode;

    fn pieces(total: usize, piece: usize) -> Vec<Bytes> {
        let data: Vec<u8> = (0..total).map(|i| (i * 7 + i / 251) as u8).collect();
        data.chunks(piece).map(Bytes::copy_from_slice).collect()
    }

    fn inline(pieces: &[Bytes], algorithms: &[String]) -> ([u8; 16], Checksums) {
        let mut d = Digests::new(algorithms);
        for p in pieces {
            d.update(p);
        }
        d.finish()
    }

    fn sha256(pieces: &[Bytes]) -> [u8; 32] {
        let mut h = Sha256::new();
        for p in pieces {
            h.update(p);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(h.finalize().as_slice());
        out
    }

    #[tokio::test]
    async fn offloaded_digests_equal_inline_ones_on_both_sides_of_the_threshold() {
        let algs = vec!["crc32c".to_string(), "sha1".to_string()];
        let threshold = OFFLOAD_MIN_BYTES as usize;
        for (total, piece) in [(0, 1), (1000, 100), (threshold - 1, 65_536), (threshold, 65_536), (3 * threshold + 17, 100_003)] {
            let ps = pieces(total, piece);
            let mut d = BodyDigests::new(&algs).expect_payload_sha256(Some(sha256(&ps)));
            for p in &ps {
                d.feed(p).await.unwrap();
            }
            assert_eq!(d.size, total as u64);
            assert_eq!(d.offload.is_some(), total >= threshold, "offloaded past the threshold only ({total})");
            let (md5, sums) = d.finish().await.unwrap();
            let (want_md5, want_sums) = inline(&ps, &algs);
            assert_eq!(md5, want_md5, "{total}");
            assert_eq!(sums.crc32c, want_sums.crc32c);
            assert_eq!(sums.sha1, want_sums.sha1);
        }
    }

    #[tokio::test]
    async fn a_wrong_payload_sha256_fails_finish_inline_and_offloaded() {
        for total in [10, 2 * OFFLOAD_MIN_BYTES as usize] {
            let ps = pieces(total, 50_000);
            let mut wrong = sha256(&ps);
            wrong[0] ^= 1;
            let mut d = BodyDigests::new(&[]).expect_payload_sha256(Some(wrong));
            for p in &ps {
                d.feed(p).await.unwrap();
            }
            let e = d.finish().await.unwrap_err();
            assert_eq!(e.code().as_str(), "XAmzContentSHA256Mismatch", "{total}");
            assert_eq!(e.status_code(), Some(http::StatusCode::BAD_REQUEST));
            // Without an expected hash nothing is checked.
            let mut d = BodyDigests::new(&[]);
            for p in &ps {
                d.feed(p).await.unwrap();
            }
            assert!(d.finish().await.is_ok());
        }
    }

    #[test]
    fn an_announced_trailer_must_arrive() {
        let data = pieces(1000, 100);
        let algorithms = vec!["crc32".to_string()];
        let (md5, sums) = inline(&data, &algorithms);
        let mut headers = HeaderMap::new();
        headers.insert("x-amz-trailer", "x-amz-checksum-crc32".parse().unwrap());
        let missing = |t: Option<&HeaderMap>| verify(&headers, t, &md5, &sums).unwrap_err();
        // No trailers at all, and trailers without the announced one.
        assert_eq!(missing(None).code(), &S3ErrorCode::Custom("MalformedTrailerError".into()));
        let mut other = HeaderMap::new();
        other.insert("x-amz-checksum-sha1", "AAAA".parse().unwrap());
        assert_eq!(missing(Some(&other)).code(), &S3ErrorCode::Custom("MalformedTrailerError".into()));
        // Present and right; present and wrong.
        let mut right = HeaderMap::new();
        right.insert("x-amz-checksum-crc32", sums.crc32.clone().unwrap().parse().unwrap());
        verify(&headers, Some(&right), &md5, &sums).unwrap();
        let mut wrong = HeaderMap::new();
        wrong.insert("x-amz-checksum-crc32", "AAAAAA==".parse().unwrap());
        assert_eq!(verify(&headers, Some(&wrong), &md5, &sums).unwrap_err().code(), &S3ErrorCode::BadDigest);
        // Nothing announced, nothing required.
        verify(&HeaderMap::new(), None, &md5, &sums).unwrap();
    }
}
