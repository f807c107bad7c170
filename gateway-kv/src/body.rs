//! Value bytes in and out.
//!
//! **In** ([`ValueWriter`]): a value is kept in memory while it fits inline
//! (4 KiB: published inside the inode in one meta transaction); past that
//! it goes to a temp file in chunk-aligned writes, at most
//! `max_inflight_write_bytes` unacknowledged — a value of any size never
//! sits whole in the gateway.
//!
//! **Out** ([`KvBody`]): small responses are one buffer; values above
//! `whole_value_max_bytes` and batch responses stream from a producer task
//! through a bounded channel ([`stream_segments`]): chunk reads run ahead of
//! the client by a bounded number of bytes, and a failure (or a value
//! replaced and reclaimed while it was read) aborts the response instead of
//! ending it cleanly with wrong bytes.

use crate::error::{KvError, Result};
use crate::store::{Data, Store};
use bytes::{Bytes, BytesMut};
use fskv_client::FileHandle;
use fskv_proto::meta::DEFAULT_INLINE_MAX_BYTES;
use fskv_types::InodeId;
use futures::StreamExt;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// A response body.
pub enum KvBody {
    Full(Option<Bytes>),
    Stream { rx: mpsc::Receiver<Result<Bytes, std::io::Error>>, len: Option<u64> },
}

impl KvBody {
    pub fn empty() -> Self {
        KvBody::Full(None)
    }

    pub fn full(b: impl Into<Bytes>) -> Self {
        let b = b.into();
        KvBody::Full(Some(b).filter(|b| !b.is_empty()))
    }
}

impl Body for KvBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            KvBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            KvBody::Stream { rx, .. } => match rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, KvBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            KvBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            KvBody::Stream { len: Some(n), .. } => SizeHint::with_exact(*n),
            KvBody::Stream { .. } => SizeHint::default(),
        }
    }
}

/// A piece of a streamed response.
pub enum Segment {
    Ready(Bytes),
    /// `len` bytes of `handle` from `offset`.
    Read {
        handle: Arc<FileHandle>,
        offset: u64,
        len: u64,
    },
    /// After everything before it: fail the response if `inode` is no
    /// longer linked (its chunks may have been reclaimed while it was read).
    CheckLinked(InodeId),
}

/// Cuts `[start, end)` of `handle` into reads of at most `piece` bytes
/// (aligned to `piece` after the first).
pub fn read_segments(handle: &Arc<FileHandle>, start: u64, end: u64, piece: u64, out: &mut Vec<Segment>) {
    let piece = piece.max(4096);
    let mut pos = start;
    while pos < end {
        let next = ((pos / piece) + 1) * piece;
        let len = next.min(end) - pos;
        out.push(Segment::Read { handle: Arc::clone(handle), offset: pos, len });
        pos += len;
    }
}

/// Streams `segments` in order with up to `readahead` of them resolving at
/// once; `on_done` runs when the stream ends (or the client went away).
pub fn stream_segments(
    store: Store,
    segments: Vec<Segment>,
    readahead: usize,
    len: Option<u64>,
    on_done: impl FnOnce() + Send + 'static,
) -> KvBody {
    let (tx, rx) = mpsc::channel(readahead.max(1));
    tokio::spawn(async move {
        enum Out {
            Bytes(Bytes),
            Check(InodeId),
        }
        let mut pieces = futures::stream::iter(segments)
            .map(|s| async move {
                match s {
                    Segment::Ready(b) => Ok(Out::Bytes(b)),
                    Segment::Read { handle, offset, len } => match handle.read_at(offset, len).await {
                        Ok(b) if b.len() as u64 == len => Ok(Out::Bytes(b)),
                        Ok(b) => Err(std::io::Error::other(format!("value shrank while read: {} of {len} bytes", b.len()))),
                        Err(e) => Err(std::io::Error::other(e.to_string())),
                    },
                    // Checked below, once every read before it has returned.
                    Segment::CheckLinked(inode) => Ok(Out::Check(inode)),
                }
            })
            .buffered(readahead.max(1));
        while let Some(r) = pieces.next().await {
            let r = match r {
                Ok(Out::Check(inode)) => match store.fs.meta().stat(inode).await {
                    Ok(i) if i.nlink > 0 => continue,
                    _ => Err(std::io::Error::other("the value was replaced or removed while it was read")),
                },
                Ok(Out::Bytes(b)) => Ok(b),
                Err(e) => Err(e),
            };
            let failed = r.is_err();
            if let Err(e) = &r {
                tracing::warn!(error = %e, "streamed response failed; aborting it");
            }
            if tx.send(r).await.is_err() || failed {
                break;
            }
        }
        on_done();
    });
    KvBody::Stream { rx, len }
}

/// Receives one value: inline while it fits, then a temp file.
pub struct ValueWriter {
    store: Store,
    dir: InodeId,
    mode: u32,
    max_bytes: u64,
    max_inflight_bytes: u64,
    head: BytesMut,
    temp: Option<Arc<FileHandle>>,
    chunk: u64,
    block: BytesMut,
    offset: u64,
    writes: JoinSet<fskv_client::file::Result<()>>,
    pub size: u64,
}

impl ValueWriter {
    /// A value of at most `max_bytes`, its temp file (if needed) in `dir`
    /// with permission bits `mode`.
    pub fn new(store: Store, dir: InodeId, mode: u32, max_bytes: u64, max_inflight_bytes: u64) -> Self {
        ValueWriter {
            store,
            dir,
            mode,
            max_bytes,
            max_inflight_bytes,
            head: BytesMut::new(),
            temp: None,
            chunk: 0,
            block: BytesMut::new(),
            offset: 0,
            writes: JoinSet::new(),
            size: 0,
        }
    }

    pub async fn push(&mut self, piece: Bytes) -> Result<()> {
        self.size += piece.len() as u64;
        if self.size > self.max_bytes {
            return Err(KvError::ValueTooLarge { len: None, max: self.max_bytes });
        }
        if self.temp.is_none() {
            if self.head.len() + piece.len() <= DEFAULT_INLINE_MAX_BYTES {
                self.head.extend_from_slice(&piece);
                return Ok(());
            }
            let h = self
                .store
                .fs
                .create_temp(self.dir, self.mode)
                .await
                .map_err(|e| KvError::from_code(e.code(), "put", KvError::NoSuchKey))?;
            self.chunk = u64::from(h.layout().chunk_size_bytes).max(4096);
            self.temp = Some(Arc::new(h));
            let head = std::mem::take(&mut self.head).freeze();
            self.feed(head).await?;
        }
        self.feed(piece).await
    }

    async fn feed(&mut self, mut piece: Bytes) -> Result<()> {
        let max_inflight = (self.max_inflight_bytes / self.chunk).max(1) as usize;
        while !piece.is_empty() {
            let pos = self.offset + self.block.len() as u64;
            let want = (self.chunk - pos % self.chunk) as usize;
            let take = want.min(piece.len());
            self.block.extend_from_slice(&piece.split_to(take));
            if take == want {
                self.flush_block();
                while self.writes.len() >= max_inflight {
                    self.join_one().await?;
                }
            }
        }
        Ok(())
    }

    fn flush_block(&mut self) {
        if self.block.is_empty() {
            return;
        }
        let data = std::mem::replace(&mut self.block, BytesMut::with_capacity(self.chunk as usize)).freeze();
        let at = self.offset;
        self.offset += data.len() as u64;
        if let Some(h) = &self.temp {
            let h = Arc::clone(h);
            self.writes.spawn(async move { h.write_at(at, data).await });
        }
    }

    async fn join_one(&mut self) -> Result<()> {
        match self.writes.join_next().await {
            Some(Ok(Ok(()))) | None => Ok(()),
            Some(Ok(Err(e))) => Err(KvError::from_code(e.code(), "writing the value", KvError::NoSuchKey)),
            Some(Err(e)) => Err(KvError::Internal(format!("a chunk write task failed: {e}"))),
        }
    }

    /// Waits for every write; the value's data.
    pub async fn finish(mut self) -> Result<Data> {
        if self.temp.is_none() {
            return Ok(Data::Inline(self.head.freeze()));
        }
        self.flush_block();
        while !self.writes.is_empty() {
            self.join_one().await?;
        }
        match self.temp.take() {
            Some(h) => Ok(Data::Temp(h)),
            None => Err(KvError::Internal("temp file vanished".into())),
        }
    }
}
