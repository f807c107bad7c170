//! Frame reading and writing over a connection's halves, shared by client
//! and server.

use crate::error::{Result, RpcError};
use crate::frame::{Frame, FrameDecoder, OutFrame};
use crate::transport::{BoxRead, BoxWrite};
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::IoSlice;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Bytes to make room for when the next frame's header is not known yet.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Stop batching more queued frames into one write once this much is queued.
const WRITE_BATCH_BYTES: usize = 4 << 20;
/// Upper bound on slices handed to one vectored write (IOV_MAX is 1024).
const MAX_IOVECS: usize = 64;

/// Reads frames from one connection.
pub(crate) struct FrameReader {
    read: BoxRead,
    buf: BytesMut,
    decoder: FrameDecoder,
    peer: String,
}

impl FrameReader {
    pub fn new(read: BoxRead, max_frame_bytes: usize, peer: String) -> Self {
        FrameReader { read, buf: BytesMut::with_capacity(READ_CHUNK_BYTES), decoder: FrameDecoder::new(max_frame_bytes), peer }
    }

    /// The next frame; `Ok(None)` on a clean end of stream between frames.
    ///
    /// Once a header is decoded the buffer is reserved for the whole frame
    /// (by the decoder), so the kernel copies straight into it and the frame
    /// is split off without another copy.
    pub async fn next(&mut self) -> Result<Option<Frame>> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(frame));
            }
            if self.buf.capacity() - self.buf.len() < READ_CHUNK_BYTES / 4 {
                self.buf.reserve(READ_CHUNK_BYTES);
            }
            let n = self.read.read_buf(&mut self.buf).await.map_err(|e| RpcError::connection(&self.peer, e))?;
            if n == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(RpcError::connection(&self.peer, "connection closed in the middle of a frame"));
            }
        }
    }
}

/// Writes every frame received on `rx` until all senders are gone, then
/// shuts the write half down. Frames queued at the same time are batched
/// into vectored writes; payloads are written from their own buffers.
pub(crate) async fn write_loop(mut write: BoxWrite, mut rx: mpsc::Receiver<OutFrame>) -> std::io::Result<()> {
    let mut queue: VecDeque<Bytes> = VecDeque::new();
    while let Some(frame) = rx.recv().await {
        let mut queued_bytes = push(&mut queue, frame);
        while queued_bytes < WRITE_BATCH_BYTES {
            match rx.try_recv() {
                Ok(frame) => queued_bytes += push(&mut queue, frame),
                Err(_) => break,
            }
        }
        write_all_vectored(&mut write, &mut queue).await?;
    }
    write.shutdown().await
}

fn push(queue: &mut VecDeque<Bytes>, frame: OutFrame) -> usize {
    let len = frame.len();
    queue.push_back(frame.head);
    if !frame.payload.is_empty() {
        queue.push_back(frame.payload);
    }
    len
}

async fn write_all_vectored(write: &mut BoxWrite, queue: &mut VecDeque<Bytes>) -> std::io::Result<()> {
    while !queue.is_empty() {
        let slices: Vec<IoSlice<'_>> = queue.iter().take(MAX_IOVECS).map(|b| IoSlice::new(b)).collect();
        let mut written = write.write_vectored(&slices).await?;
        drop(slices);
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
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
    write.flush().await
}
