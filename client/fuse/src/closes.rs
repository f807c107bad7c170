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
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

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
pub(crate) struct CloseQueue {
    tx: mpsc::Sender<Msg>,
    meta: MetaClient,
    rt: tokio::runtime::Handle,
}

impl CloseQueue {
    /// Starts the batching task on the current runtime.
    pub fn start(meta: MetaClient, limits: CloseQueueLimits) -> CloseQueue {
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

async fn run(meta: MetaClient, limits: CloseQueueLimits, mut rx: mpsc::Receiver<Msg>) {
    let max_batch = limits.max_close_batch.clamp(1, fskv_proto::meta::MAX_BATCH_OPS);
    let delay = Duration::from_millis(limits.close_batch_delay_ms);
    let mut batch: Vec<(InodeId, u64, CloseEnd)> = Vec::with_capacity(max_batch);
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
async fn send(meta: &MetaClient, batch: &[(InodeId, u64, CloseEnd)]) {
    let failed: Vec<String> = match meta.close_many(batch).await {
        Ok(results) => {
            results.iter().zip(batch).filter_map(|(r, (inode, _, _))| r.as_ref().err().map(|e| format!("{inode}: {e}"))).collect()
        }
        Err(e) => vec![format!("the batch request: {e}")],
    };
    if let Some(first) = failed.first() {
        tracing::warn!(
            failed = failed.len(),
            batch = batch.len(),
            first = %first,
            "deferred closes failed; their sessions expire after meta's session TTL"
        );
    }
}
