//! Frame reading and writing over a connection's halves, shared by client
//! and server.

use crate::error::{Result, RpcError};
use crate::frame::{Frame, FrameDecoder, FrameHeader, FrameKind, OutFrame};
use crate::transport::{BoxRead, BoxWrite};
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Bytes to make room for when the next frame's header is not known yet.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Upper bound on slices handed to one vectored write (IOV_MAX is 1024).
pub(crate) const MAX_IOVECS: usize = 64;

/// What a server's reader hands on.
pub(crate) enum Incoming {
    /// A whole frame, with its share of the in-flight byte budget (held
    /// until the request is answered; `None` where there is no budget).
    Frame(Frame, Option<OwnedSemaphorePermit>),
    /// A request frame refused for want of budget: its bytes were read and
    /// dropped; the caller answers `Overloaded`.
    Refused(FrameHeader),
}

/// Reads frames from one connection.
///
/// A server's reader charges every request frame to a byte budget shared by
/// all of the server's connections, as soon as its header is known and
/// before its body is held in memory; a frame that does not fit is read
/// and dropped (the stream stays in sync) and refused. Refusing instead of
/// waiting matters: two storage services heading each other's chains could
/// otherwise each wait for budget held by handlers waiting on the other.
pub(crate) struct FrameReader {
    read: BoxRead,
    buf: BytesMut,
    decoder: FrameDecoder,
    peer: String,
    budget: Option<Arc<Semaphore>>,
    /// A frame must arrive whole within this of its first byte (server side).
    frame_read_timeout: Option<std::time::Duration>,
    /// Budget taken for the frame being read.
    permit: Option<OwnedSemaphorePermit>,
    /// A refused frame being skipped: its header and the bytes still to drop.
    discard: Option<(FrameHeader, u64)>,
    /// When the first byte of the frame being read arrived.
    frame_started: Option<Instant>,
    /// When the last whole frame arrived (or the connection opened).
    last_frame: Instant,
}

impl FrameReader {
    pub fn new(read: BoxRead, max_frame_bytes: usize, peer: String) -> Self {
        FrameReader {
            read,
            buf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            decoder: FrameDecoder::new(max_frame_bytes),
            peer,
            budget: None,
            frame_read_timeout: None,
            permit: None,
            discard: None,
            frame_started: None,
            last_frame: Instant::now(),
        }
    }

    /// Reserves every frame whole at its header (a client reading replies
    /// to its own requests).
    pub fn trusting_frame_sizes(mut self) -> Self {
        self.decoder = self.decoder.with_eager_reserve(usize::MAX);
        self
    }

    /// Charges request frames to `budget` (permits are bytes).
    pub fn with_budget(mut self, budget: Arc<Semaphore>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Fails the read (a connection error) when a frame has not arrived
    /// whole within `timeout` of its first byte.
    pub fn with_frame_read_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.frame_read_timeout = Some(timeout);
        self
    }

    /// When the frame being read started arriving, if one is.
    pub fn frame_started(&self) -> Option<Instant> {
        self.frame_started
    }

    /// Starts with `prefix`, bytes of the first frame already read from the
    /// stream (the server's protocol sniffing); its frame-read timer runs from now.
    pub fn with_prefix(mut self, prefix: &[u8]) -> Self {
        if !prefix.is_empty() {
            self.buf.extend_from_slice(prefix);
            self.frame_started = Some(Instant::now());
        }
        self
    }

    pub fn last_frame(&self) -> Instant {
        self.last_frame
    }

    /// The next frame; `Ok(None)` on a clean end of stream between frames.
    /// Cancel-safe: bytes read stay in the buffer for the next call.
    pub async fn next(&mut self) -> Result<Option<Frame>> {
        match self.next_incoming().await? {
            Some(Incoming::Frame(frame, _)) => Ok(Some(frame)),
            Some(Incoming::Refused(_)) => Err(RpcError::connection(&self.peer, "a frame was refused without a budget")),
            None => Ok(None),
        }
    }

    /// [`FrameReader::next`] with the budget's verdict.
    ///
    /// The buffer grows as bytes arrive (the decoder at most doubles it), so
    /// the kernel copies straight into it and the frame is split off without
    /// another copy.
    pub async fn next_incoming(&mut self) -> Result<Option<Incoming>> {
        loop {
            if let Some((header, left)) = self.discard.as_mut() {
                let take = (self.buf.len() as u64).min(*left);
                // Cannot truncate: take <= buf.len().
                self.buf.advance(take as usize);
                *left -= take;
                if *left == 0 {
                    let header = *header;
                    self.discard = None;
                    self.frame_done();
                    return Ok(Some(Incoming::Refused(header)));
                }
            } else {
                self.admit()?;
                if self.discard.is_some() {
                    continue;
                }
                if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                    let permit = self.permit.take();
                    self.frame_done();
                    return Ok(Some(Incoming::Frame(frame, permit)));
                }
            }
            if self.buf.capacity() - self.buf.len() < READ_CHUNK_BYTES / 4 {
                self.buf.reserve(READ_CHUNK_BYTES);
            }
            let read = self.read.read_buf(&mut self.buf);
            let n = match (self.frame_started, self.frame_read_timeout) {
                (Some(started), Some(timeout)) => match tokio::time::timeout_at(started + timeout, read).await {
                    Ok(r) => r,
                    Err(_) => return Err(RpcError::connection(&self.peer, format!("a frame did not arrive whole within {timeout:?}"))),
                },
                _ => read.await,
            }
            .map_err(|e| RpcError::connection(&self.peer, e))?;
            if n == 0 {
                if self.buf.is_empty() && self.discard.is_none() {
                    return Ok(None);
                }
                return Err(RpcError::connection(&self.peer, "connection closed in the middle of a frame"));
            }
            if self.frame_started.is_none() {
                self.frame_started = Some(Instant::now());
            }
        }
    }

    /// Takes budget for the request frame at the front of the buffer once
    /// its header is there, or starts discarding it.
    fn admit(&mut self) -> Result<()> {
        let Some(budget) = &self.budget else { return Ok(()) };
        if self.permit.is_some() {
            return Ok(());
        }
        let Some(header) = self.decoder.peek_header(&self.buf)? else { return Ok(()) };
        if header.kind != FrameKind::Request {
            return Ok(());
        }
        // Cannot truncate: frame_bytes <= max_frame_bytes, which the server
        // keeps within u32 (ServerConfig::validate).
        let bytes = u32::try_from(header.frame_bytes()).unwrap_or(u32::MAX);
        match budget.clone().try_acquire_many_owned(bytes) {
            Ok(permit) => self.permit = Some(permit),
            Err(_) => self.discard = Some((header, header.frame_bytes())),
        }
        Ok(())
    }

    fn frame_done(&mut self) {
        let now = Instant::now();
        self.last_frame = now;
        // Bytes of the next frame may already be here.
        self.frame_started = (!self.buf.is_empty()).then_some(now);
    }
}

pub(crate) fn push(queue: &mut VecDeque<Bytes>, frame: OutFrame) -> usize {
    let len = frame.len();
    queue.push_back(frame.head);
    if !frame.payload.is_empty() {
        queue.push_back(frame.payload);
    }
    len
}

pub(crate) async fn write_all_vectored(write: &mut BoxWrite, queue: &mut VecDeque<Bytes>) -> std::io::Result<()> {
    while !queue.is_empty() {
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
        let n = fill_slices(queue, &mut slices);
        let written = write.write_vectored(&slices[..n]).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        advance(queue, written);
    }
    write.flush().await
}

/// Points `slices` at the first buffers of `queue` (no allocation per
/// write); returns how many it filled.
fn fill_slices<'a>(queue: &'a VecDeque<Bytes>, slices: &mut [IoSlice<'a>; MAX_IOVECS]) -> usize {
    let mut n = 0;
    for (slot, b) in slices.iter_mut().zip(queue.iter()) {
        *slot = IoSlice::new(b);
        n += 1;
    }
    n
}

/// Drops `written` bytes from the front of `queue`.
fn advance(queue: &mut VecDeque<Bytes>, mut written: usize) {
    while written > 0 {
        let Some(front) = queue.front_mut() else { break };
        if written >= front.len() {
            written -= front.len();
            queue.pop_front();
        } else {
            front.advance(written);
            written = 0;
        }
    }
}

/// Writes as much of `queue` as the stream takes without waiting (one
/// non-blocking attempt per vectored write, no waker kept), then flushes
/// the same way. `Ok(true)`: everything is written and flushed; `Ok(false)`:
/// the stream is full (what is left stays in `queue`) or its flush is not
/// done, and a task must finish with [`write_all_vectored`].
pub(crate) fn write_now(write: &mut BoxWrite, queue: &mut VecDeque<Bytes>) -> std::io::Result<bool> {
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::AsyncWrite;
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    while !queue.is_empty() {
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
        let n = fill_slices(queue, &mut slices);
        match Pin::new(&mut *write).poll_write_vectored(&mut cx, &slices[..n]) {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => advance(queue, n),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(false),
        }
    }
    match Pin::new(&mut *write).poll_flush(&mut cx) {
        Poll::Ready(Ok(())) => Ok(true),
        Poll::Ready(Err(e)) => Err(e),
        Poll::Pending => Ok(false),
    }
}
