//! Deferred closes of never-written handles.
//!
//! Every `open(O_CREAT)` + `close` through the mount ends a write session
//! in meta. When the handle wrote nothing, that close reports nothing: it
//! only removes the session record. The kernel does not wait for RELEASE,
//! so nobody waits for this close either; what it costs is one meta round
//! trip and one transaction on the two CPUs the next create needs. This
//! queue gathers such closes and sends them as one batch request.
//!
//! | rule | value |
//! |---|---|
//! | which closes wait here | a handle that never attempted a write, never saw a write fail and holds a session ([`fskv_client::FileHandle::into_quiet_close`]); every other close is sent at release, as before |
//! | when a batch leaves | `close_batch_delay_ms` after the first close of the batch arrived, or at once when `max_close_batch` are waiting |
//! | queue full (`max_queued_closes`) | the close is sent alone, from a task (no close is dropped, no release waits on the queue) |
//! | unmount | every queued close is sent before the mount's `destroy` returns |
//! | a close that fails | logged once per batch (count and first error); the session then expires after meta's `session_ttl_ms`, as a session of a client that died |
//! | what another client sees meanwhile | the file as if still open by this mount for at most the delay: a writer's close elsewhere measures the length on storage instead of trusting its own end; GC of an unlinked file waits for the session; nothing else |

use fskv_client::{CloseEnd, MetaClient, QuietClose};
use fskv_types::InodeId;
use std::future::Future;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// One deferred close: the inode, its write session and what the close reports.
pub type Close = (InodeId, u64, CloseEnd);

/// Where batches go: meta's batch request (tests record them instead).
pub trait CloseSink: Clone + Send + Sync + 'static {
    /// Sends `batch` as one request; the reasons of the closes that
    /// failed, with their inodes (empty: all done).
    fn close_many(&self, batch: &[Close]) -> impl Future<Output = Vec<String>> + Send;
}

impl CloseSink for MetaClient {
    async fn close_many(&self, batch: &[Close]) -> Vec<String> {
        match MetaClient::close_many(self, batch).await {
            Ok(results) => {
                results.iter().zip(batch).filter_map(|(r, (inode, _, _))| r.as_ref().err().map(|e| format!("{inode}: {e}"))).collect()
            }
            Err(e) => vec![format!("the batch request: {e}")],
        }
    }
}

/// Bounds of the queue.
#[derive(Clone, Copy, Debug)]
pub struct CloseQueueLimits {
    pub close_batch_delay_ms: u64,
    pub max_close_batch: usize,
    pub max_queued_closes: usize,
}

enum Msg {
    Close(QuietClose),
    /// Send everything queued before this message, then answer.
    Flush(oneshot::Sender<()>),
}

/// The sending side; the batching task stops when it is dropped.
pub(crate) struct CloseQueue<S: CloseSink = MetaClient> {
    tx: mpsc::Sender<Msg>,
    meta: S,
    rt: tokio::runtime::Handle,
}

impl<S: CloseSink> CloseQueue<S> {
    /// Starts the batching task on the current runtime.
    pub fn start(meta: S, limits: CloseQueueLimits) -> CloseQueue<S> {
        let (tx, rx) = mpsc::channel(limits.max_queued_closes.max(1));
        let rt = tokio::runtime::Handle::current();
        rt.spawn(run(meta.clone(), limits, rx));
        CloseQueue { tx, meta, rt }
    }

    /// Queues `close` without waiting (callable from any thread); when the
    /// queue is full (or stopped) the close is sent alone, from a task.
    pub fn push(&self, close: QuietClose) {
        let close = match self.tx.try_send(Msg::Close(close)) {
            Ok(()) => return,
            Err(e) => match e.into_inner() {
                Msg::Close(c) => c,
                Msg::Flush(_) => return,
            },
        };
        let meta = self.meta.clone();
        self.rt.spawn(async move { send(&meta, &[(close.inode, close.session, close.end)]).await });
    }

    /// Returns once every close queued before the call was sent (or the
    /// task is gone).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

async fn run<S: CloseSink>(meta: S, limits: CloseQueueLimits, mut rx: mpsc::Receiver<Msg>) {
    let max_batch = limits.max_close_batch.clamp(1, fskv_proto::meta::MAX_BATCH_OPS);
    let delay = Duration::from_millis(limits.close_batch_delay_ms);
    let mut batch: Vec<Close> = Vec::with_capacity(max_batch);
    while let Some(first) = rx.recv().await {
        let mut flushed = Vec::new();
        match first {
            Msg::Close(c) => batch.push((c.inode, c.session, c.end)),
            Msg::Flush(done) => flushed.push(done),
        }
        let deadline = tokio::time::Instant::now() + delay;
        while flushed.is_empty() && batch.len() < max_batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Msg::Close(c))) => batch.push((c.inode, c.session, c.end)),
                Ok(Some(Msg::Flush(done))) => flushed.push(done),
                Ok(None) | Err(_) => break,
            }
        }
        if !batch.is_empty() {
            send(&meta, &batch).await;
            batch.clear();
        }
        for done in flushed {
            let _ = done.send(());
        }
    }
}

/// Sends one batch; failures are logged here, once per batch.
async fn send<S: CloseSink>(meta: &S, batch: &[Close]) {
    let failed = meta.close_many(batch).await;
    if let Some(first) = failed.first() {
        tracing::warn!(
            failed = failed.len(),
            batch = batch.len(),
            first = %first,
            "deferred closes failed; their sessions expire after meta's session TTL"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::sync::Arc;

    /// Records every batch; each request waits until `gate` opens.
    #[derive(Clone)]
    struct Recorder {
        batches: Arc<Mutex<Vec<Vec<u64>>>>,
        gate: Arc<tokio::sync::Semaphore>,
    }

    impl CloseSink for Recorder {
        async fn close_many(&self, batch: &[Close]) -> Vec<String> {
            drop(self.gate.acquire().await);
            self.batches.lock().push(batch.iter().map(|(_, session, _)| *session).collect());
            Vec::new()
        }
    }

    fn close(session: u64) -> QuietClose {
        QuietClose { inode: InodeId(session), session, end: CloseEnd::default() }
    }

    fn recorder(open: bool) -> Recorder {
        let gate = Arc::new(tokio::sync::Semaphore::new(if open { tokio::sync::Semaphore::MAX_PERMITS } else { 0 }));
        Recorder { batches: Arc::default(), gate }
    }

    fn sent(r: &Recorder) -> Vec<u64> {
        let mut all: Vec<u64> = r.batches.lock().iter().flatten().copied().collect();
        all.sort_unstable();
        all
    }

    #[tokio::test(start_paused = true)]
    async fn closes_wait_for_the_delay_or_a_full_batch() {
        let r = recorder(true);
        let limits = CloseQueueLimits { close_batch_delay_ms: 50, max_close_batch: 3, max_queued_closes: 16 };
        let q = CloseQueue::start(r.clone(), limits);
        for s in 1..=4 {
            q.push(close(s));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*r.batches.lock(), vec![vec![1, 2, 3]], "a full batch leaves at once, the fourth waits");
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(r.batches.lock().len(), 2);
        assert_eq!(sent(&r), vec![1, 2, 3, 4]);
    }

    /// A full queue sends the close that does not fit from a task of its
    /// own: no close is lost and `push` never waits.
    #[tokio::test(start_paused = true)]
    async fn a_full_queue_sends_the_close_alone() {
        let r = recorder(false);
        let limits = CloseQueueLimits { close_batch_delay_ms: 1, max_close_batch: 1, max_queued_closes: 2 };
        let q = CloseQueue::start(r.clone(), limits);
        q.push(close(1));
        // The batching task takes close 1 and waits on the closed gate.
        tokio::time::sleep(Duration::from_millis(5)).await;
        for s in 2..=6 {
            q.push(close(s));
        }
        r.gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
        q.flush().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(sent(&r), vec![1, 2, 3, 4, 5, 6], "every close sent once");
        let alone = r.batches.lock().iter().filter(|b| b.len() == 1 && b[0] >= 4).count();
        assert_eq!(alone, 3, "closes 4-6 found the queue (2 slots, closes 2 and 3) full");
    }

    #[tokio::test(start_paused = true)]
    async fn flush_returns_after_everything_queued_before_it() {
        let r = recorder(true);
        let limits = CloseQueueLimits { close_batch_delay_ms: 60_000, max_close_batch: 256, max_queued_closes: 16 };
        let q = CloseQueue::start(r.clone(), limits);
        q.push(close(7));
        q.push(close(8));
        q.flush().await;
        assert_eq!(sent(&r), vec![7, 8], "sent at flush, not after the minute-long delay");
    }
}
