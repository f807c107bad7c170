//! Long polling on readers: how a fetch waits for records without reading
//! the writer's memory. One poller task per partition with waiting fetches
//! re-reads the partition's state file every `poll_interval_ms` (one meta
//! lookup, whatever the number of waiters) and publishes it; waiters wake
//! when the high watermark passes their offset or their `wait_ms` ends. The
//! poller stops when its last waiter is gone. On a writer that owns the
//! partition, fetches wait on the writer's committed high watermark instead
//! (woken by the commit itself).

use crate::error::Result;
use crate::state::PartitionState;
use crate::store::Store;
use fskv_types::InodeId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

type Published = Option<Arc<PartitionState>>;

#[derive(Clone)]
pub struct HwWatcher {
    store: Store,
    poll: Duration,
    pollers: Arc<Mutex<HashMap<InodeId, watch::Sender<Published>>>>,
}

impl HwWatcher {
    pub fn new(store: Store, poll_interval_ms: u64) -> HwWatcher {
        HwWatcher { store, poll: Duration::from_millis(poll_interval_ms.max(1)), pollers: Arc::default() }
    }

    fn subscribe(&self, pdir: InodeId) -> watch::Receiver<Published> {
        let mut pollers = self.pollers.lock();
        if let Some(tx) = pollers.get(&pdir) {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(None);
        pollers.insert(pdir, tx.clone());
        let this = self.clone();
        tokio::spawn(async move { this.poll_loop(pdir, tx).await });
        rx
    }

    async fn poll_loop(&self, pdir: InodeId, tx: watch::Sender<Published>) {
        loop {
            match self.store.read_state(pdir).await {
                Ok(v) => {
                    tx.send_if_modified(|cur| {
                        let changed = match cur.as_ref() {
                            None => true,
                            Some(c) => c.hw != v.value.hw || c.log_start != v.value.log_start || c.seg != v.value.seg,
                        };
                        if changed {
                            *cur = Some(Arc::new(v.value.clone()));
                        }
                        changed
                    });
                }
                Err(e) => tracing::debug!(error = %e, "long-poll state read failed"),
            }
            tokio::time::sleep(self.poll).await;
            let mut pollers = self.pollers.lock();
            if tx.receiver_count() == 0 {
                pollers.remove(&pdir);
                return;
            }
        }
    }

    /// Waits until the state's high watermark passes `offset` or `deadline`
    /// comes; returns the newest state seen (or `current` if none newer).
    pub async fn wait_beyond(&self, pdir: InodeId, offset: u64, deadline: Instant, current: PartitionState) -> Result<PartitionState> {
        let mut rx = self.subscribe(pdir);
        let mut best = current;
        loop {
            if let Some(s) = rx.borrow_and_update().as_ref() {
                if s.hw > best.hw || s.log_start != best.log_start {
                    best = (**s).clone();
                }
            }
            if best.hw > offset {
                return Ok(best);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return Ok(best),
            }
        }
    }
}
