//! A connection's outgoing side, shared by client and server: a frame is
//! written by the thread that sends it whenever nothing else is being
//! written, so a call (client) or a reply (server) does not wait for a
//! writer task to be scheduled (a thread wake-up, tens of µs on a small VM,
//! on every request).
//!
//! | state | a frame sent |
//! |---|---|
//! | idle: the write half is here, nothing queued | a frame of at most [`MAX_DIRECT_WRITE_BYTES`] is written now without waiting (one non-blocking attempt); what the socket does not take is queued, and the writer task takes the half to finish it |
//! | busy: the writer task holds the half, or a larger frame | queued; the writer writes it before it hands the half back |
//! | closed (`close`, or a write failed) | refused |
//!
//! **Invariant**: a sender writes only when nothing is queued and no flush
//! is owed, and the writer task takes the half whenever something is (after
//! a sender's partial write the half stays here, with the rest of the frame
//! queued, until the writer takes it); so frames never interleave on the
//! stream.
//!
//! Bounds: `max_queued_parts` buffers (a frame is one or two). A client's
//! requests are bounded by its calls in flight and it drops cancels at the
//! cap ([`Outgoing::send_cancel`]); a server's replies wait for room
//! ([`Outgoing::send_bounded`]), which keeps the request's in-flight slot
//! taken, so a peer that stops reading stops being served.

use crate::frame::OutFrame;
use crate::io::{push, write_all_vectored, write_now};
use crate::transport::BoxWrite;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::Notify;

/// Largest frame a sender writes itself. A larger one goes to the writer
/// task, which writes without holding the state's lock: a sender copying
/// megabytes into the socket under the lock would stall every other
/// sender's thread meanwhile, and for such a frame the copy, not the
/// wake-up, is the cost.
pub(crate) const MAX_DIRECT_WRITE_BYTES: usize = 64 << 10;

pub(crate) struct Outgoing {
    state: Mutex<OutState>,
    wake_writer: Notify,
    /// Woken when the writer empties the queue (senders waiting for room).
    room: Notify,
    max_queued_parts: usize,
}

struct OutState {
    /// The write half while no write is under way.
    write: Option<BoxWrite>,
    queue: VecDeque<Bytes>,
    /// Written, not yet flushed (the transport buffers).
    needs_flush: bool,
    /// No more frames: `close` was called (the writer sends what is queued
    /// and shuts the half down) or a write failed (nothing more is sent).
    closed: bool,
}

impl Outgoing {
    pub(crate) fn new(write: BoxWrite, max_queued_parts: usize) -> Self {
        Outgoing {
            state: Mutex::new(OutState { write: Some(write), queue: VecDeque::new(), needs_flush: false, closed: false }),
            wake_writer: Notify::new(),
            room: Notify::new(),
            max_queued_parts: max_queued_parts.max(2),
        }
    }

    /// Sends a Cancel frame unless the queue is full (see the module doc).
    pub(crate) fn send_cancel(&self, request_id: u64) {
        let _ = self.enqueue(OutFrame::cancel(request_id), true);
    }

    /// Waits while the queue is full, then sends `frame`.
    pub(crate) async fn send_bounded(&self, frame: OutFrame) -> std::io::Result<()> {
        loop {
            // Registered before the check, so a wake-up between the two is kept.
            let room = self.room.notified();
            {
                let st = self.state.lock();
                if st.closed || st.queue.len() < self.max_queued_parts {
                    break;
                }
            }
            room.await;
        }
        self.send(frame)
    }

    /// Sends `frame` (see the table); an error means the connection is
    /// broken or closed.
    pub(crate) fn send(&self, frame: OutFrame) -> std::io::Result<()> {
        self.enqueue(frame, false)
    }

    /// `send`; with `drop_at_cap`, a frame that finds the queue full is
    /// dropped instead (best-effort frames).
    fn enqueue(&self, frame: OutFrame, drop_at_cap: bool) -> std::io::Result<()> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "connection closed"));
        }
        if drop_at_cap && st.queue.len() >= self.max_queued_parts {
            return Ok(());
        }
        let small = frame.len() <= MAX_DIRECT_WRITE_BYTES;
        let idle = small && st.queue.is_empty() && !st.needs_flush;
        // Idle, the queue is empty and holds just this frame while it is
        // written here (no queue of its own per send).
        let OutState { write, queue, needs_flush, .. } = &mut *st;
        push(queue, frame);
        if let (true, Some(write)) = (idle, write.as_mut()) {
            match write_now(write, queue) {
                Ok(true) => return Ok(()),
                Ok(false) => *needs_flush = queue.is_empty(),
                Err(e) => {
                    st.closed = true;
                    st.write = None;
                    st.queue.clear();
                    drop(st);
                    self.wake_writer.notify_one();
                    self.room.notify_waiters();
                    return Err(e);
                }
            }
        }
        drop(st);
        self.wake_writer.notify_one();
        Ok(())
    }

    /// No more frames; the writer finishes what is queued, then shuts the
    /// half down.
    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
        self.wake_writer.notify_one();
        self.room.notify_waiters();
    }

    /// Buffers queued (tests).
    #[cfg(test)]
    fn queued_parts(&self) -> usize {
        self.state.lock().queue.len()
    }
}

/// The writer task: takes the write half whenever frames are queued (or a
/// flush is owed), writes until the queue is empty, then hands it back.
/// `on_fail` runs once if a write fails (the queue is dropped and nothing
/// more is sent).
pub(crate) async fn writer(out: Arc<Outgoing>, on_fail: impl FnOnce(&str)) {
    /// What the writer does next.
    enum Next {
        /// Write this batch with the half, then hand the half back.
        Write(BoxWrite, VecDeque<Bytes>),
        /// Closed with nothing left: end the stream (FIN).
        Finish(BoxWrite),
        /// Nothing to do ever again (a failed write dropped the half).
        Stop,
    }
    loop {
        let next = loop {
            {
                let mut st = out.state.lock();
                if st.queue.is_empty() && !st.needs_flush {
                    if st.closed {
                        break st.write.take().map_or(Next::Stop, Next::Finish);
                    }
                } else if let Some(w) = st.write.take() {
                    st.needs_flush = false;
                    break Next::Write(w, std::mem::take(&mut st.queue));
                } else {
                    break Next::Stop;
                }
            }
            out.wake_writer.notified().await;
        };
        let (mut write, mut batch) = match next {
            Next::Write(write, batch) => (write, batch),
            Next::Finish(mut write) => {
                use tokio::io::AsyncWriteExt;
                let _ = write.shutdown().await;
                return;
            }
            Next::Stop => return,
        };
        out.room.notify_waiters();
        loop {
            if let Err(e) = write_all_vectored(&mut write, &mut batch).await {
                {
                    let mut st = out.state.lock();
                    st.closed = true;
                    st.queue.clear();
                }
                out.room.notify_waiters();
                on_fail(&format!("write failed: {e}"));
                return;
            }
            let mut st = out.state.lock();
            if st.queue.is_empty() {
                st.write = Some(write);
                break;
            }
            batch = std::mem::take(&mut st.queue);
            drop(st);
            out.room.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// What the stream took, the room left, the writer waiting for room.
    type PipeState = (Vec<u8>, usize, Option<std::task::Waker>);

    /// A stream that takes at most `room` more bytes (then `Pending`) and
    /// keeps what it took.
    #[derive(Clone, Default)]
    struct Pipe(Arc<Mutex<PipeState>>);

    impl Pipe {
        fn make_room(&self, n: usize) {
            let mut p = self.0.lock();
            p.1 += n;
            if let Some(w) = p.2.take() {
                w.wake();
            }
        }
        fn taken(&self) -> Vec<u8> {
            self.0.lock().0.clone()
        }
    }

    impl tokio::io::AsyncWrite for Pipe {
        fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            let mut p = self.0.lock();
            if p.1 == 0 {
                p.2 = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = p.1.min(buf.len());
            p.0.extend_from_slice(&buf[..n]);
            p.1 -= n;
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn frame(byte: u8, len: usize) -> OutFrame {
        OutFrame { head: Bytes::from(vec![byte; len]), payload: Bytes::new() }
    }

    /// A frame cut by a full stream is finished before any later frame,
    /// even when the stream has room again before the writer task runs.
    #[tokio::test]
    async fn a_frame_cut_by_a_full_stream_is_finished_before_the_next() {
        let pipe = Pipe::default();
        pipe.make_room(10);
        let out = Arc::new(Outgoing::new(Box::new(pipe.clone()), 16));
        out.send(frame(b'a', 30)).expect("send");
        assert_eq!(pipe.taken(), vec![b'a'; 10], "the caller wrote what fit");
        pipe.make_room(100);
        out.send(frame(b'b', 5)).expect("send");
        assert_eq!(pipe.taken().len(), 10, "the second frame waits behind the rest of the first");
        let task = tokio::spawn(writer(out.clone(), |_| {}));
        out.close();
        task.await.expect("writer");
        let mut want = vec![b'a'; 30];
        want.extend_from_slice(&[b'b'; 5]);
        assert_eq!(pipe.taken(), want);
    }

    /// A peer that stopped reading cannot grow the queue without bound:
    /// cancels stop being queued at the cap (requests are bounded by the
    /// calls in flight).
    #[tokio::test]
    async fn cancels_are_dropped_once_the_queue_is_full() {
        let pipe = Pipe::default();
        let out = Outgoing::new(Box::new(pipe.clone()), 16);
        for id in 0..100 {
            out.send_cancel(id);
        }
        assert_eq!(out.queued_parts(), 16);
        out.send(frame(b'r', 8)).expect("a request is still queued");
        assert_eq!(out.queued_parts(), 17);
        assert!(pipe.taken().is_empty());
    }

    /// An idle connection is written by the caller: nothing waits for the
    /// writer task.
    #[tokio::test]
    async fn an_idle_connection_is_written_by_the_caller() {
        let pipe = Pipe::default();
        pipe.make_room(1 << 20);
        let out = Outgoing::new(Box::new(pipe.clone()), 16);
        out.send(frame(b'x', 64)).expect("send");
        out.send(frame(b'y', 64)).expect("send");
        assert_eq!(pipe.taken().len(), 128);
        assert_eq!(out.queued_parts(), 0);
    }

    /// A large frame is left to the writer task even on an idle
    /// connection (no copy of megabytes under the lock).
    #[tokio::test]
    async fn a_large_frame_goes_to_the_writer_task() {
        let pipe = Pipe::default();
        pipe.make_room(1 << 20);
        let out = Arc::new(Outgoing::new(Box::new(pipe.clone()), 16));
        out.send(frame(b'l', MAX_DIRECT_WRITE_BYTES + 1)).expect("send");
        assert!(pipe.taken().is_empty(), "not written by the sender");
        assert_eq!(out.queued_parts(), 1);
        out.send(frame(b's', 8)).expect("send");
        assert_eq!(out.queued_parts(), 2, "a small frame queues behind it");
        let task = tokio::spawn(writer(out.clone(), |_| {}));
        out.close();
        task.await.expect("writer");
        let mut want = vec![b'l'; MAX_DIRECT_WRITE_BYTES + 1];
        want.extend_from_slice(&[b's'; 8]);
        assert_eq!(pipe.taken(), want);
    }

    /// A server's replies wait for room once the queue is full (a peer that
    /// stopped reading), and go out in order once it drains.
    #[tokio::test]
    async fn bounded_sends_wait_for_room() {
        let pipe = Pipe::default();
        let out = Arc::new(Outgoing::new(Box::new(pipe.clone()), 4));
        for b in [b'a', b'b', b'c', b'd'] {
            out.send_bounded(frame(b, 2)).await.expect("room");
        }
        assert_eq!(out.queued_parts(), 4);
        let o = out.clone();
        let mut blocked = tokio::spawn(async move { o.send_bounded(frame(b'e', 2)).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!blocked.is_finished(), "a fifth reply waits while the peer reads nothing");
        assert_eq!(out.queued_parts(), 4);
        let task = tokio::spawn(writer(out.clone(), |_| {}));
        pipe.make_room(1 << 10);
        tokio::time::timeout(std::time::Duration::from_secs(5), &mut blocked)
            .await
            .expect("released once the writer took the queue")
            .expect("task")
            .expect("sent");
        out.close();
        task.await.expect("writer");
        assert_eq!(pipe.taken(), b"aabbccddee".to_vec());
    }

    /// A stream that takes nothing until it breaks.
    #[derive(Clone, Default)]
    struct Breaks(Arc<Mutex<(bool, Option<std::task::Waker>)>>);

    impl tokio::io::AsyncWrite for Breaks {
        fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, _buf: &[u8]) -> Poll<std::io::Result<usize>> {
            let mut s = self.0.lock();
            if s.0 {
                return Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()));
            }
            s.1 = Some(cx.waker().clone());
            Poll::Pending
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A write that fails closes the side: a sender waiting for room gets
    /// the error instead of waiting for ever, `on_fail` runs once.
    #[tokio::test]
    async fn a_failed_write_releases_waiting_senders() {
        let stream = Breaks::default();
        let out = Arc::new(Outgoing::new(Box::new(stream.clone()), 2));
        let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let f = failed.clone();
        let task = tokio::spawn(writer(out.clone(), move |_| {
            f.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        out.send(frame(b'a', 2)).expect("queued");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        // The writer holds 'a', stuck; two more fill the queue.
        out.send(frame(b'b', 2)).expect("queued");
        out.send(frame(b'c', 2)).expect("queued");
        let o = out.clone();
        let mut waiting = tokio::spawn(async move { o.send_bounded(frame(b'd', 2)).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "the queue is full");
        {
            let mut s = stream.0.lock();
            s.0 = true;
            if let Some(w) = s.1.take() {
                w.wake();
            }
        }
        let sent = tokio::time::timeout(std::time::Duration::from_secs(5), &mut waiting).await.expect("released").expect("task");
        assert!(sent.is_err(), "the waiting sender learns the connection is broken");
        task.await.expect("writer");
        assert_eq!(failed.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(out.send(frame(b'e', 2)).is_err(), "nothing is sent after a failed write");
    }
}
