//! A single-value broadcast channel like `tokio::sync::watch`, without
//! randomness.
//!
//! `tokio::sync::watch` parks each waiting receiver in one of eight wait
//! lists picked by tokio's thread-local RNG, and a send wakes the lists in
//! order, so the order in which receivers wake differs from run to run
//! (that RNG can only be seeded with `--cfg tokio_unstable`). This channel
//! keeps a version counter and one [`tokio::sync::Notify`] (a FIFO wait list,
//! no RNG): receivers wake in the order they started waiting, which makes a
//! deterministic simulation replay bit-exactly.
//!
//! The API is the subset of `tokio::sync::watch` the services use, with the
//! same meaning: [`Receiver::changed`] waits for a value newer than the last
//! one this receiver marked seen (by `changed` or [`Receiver::borrow_and_update`])
//! and fails once every [`Sender`] is gone and nothing new is left.

use parking_lot::{RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

struct Shared<T> {
    value: RwLock<T>,
    /// Bumped by every send (under the value's write lock).
    version: AtomicU64,
    senders: AtomicUsize,
    notify: Notify,
}

/// The sending half (cloneable; the channel closes when the last is dropped).
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// A receiving half; each clone tracks what it has seen on its own.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
}

/// Every sender was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("watch channel closed")
    }
}

impl std::error::Error for Closed {}

/// A channel holding `init`.
pub fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared =
        Arc::new(Shared { value: RwLock::new(init), version: AtomicU64::new(0), senders: AtomicUsize::new(1), notify: Notify::new() });
    (Sender { shared: shared.clone() }, Receiver { shared, seen: 0 })
}

impl<T> Sender<T> {
    /// Replaces the value, wakes every waiting receiver, returns the old value.
    pub fn send_replace(&self, value: T) -> T {
        let old = {
            let mut guard = self.shared.value.write();
            let old = std::mem::replace(&mut *guard, value);
            self.shared.version.fetch_add(1, Ordering::SeqCst);
            old
        };
        self.shared.notify.notify_waiters();
        old
    }

    /// Replaces the value and wakes every waiting receiver (never fails;
    /// returns `Result` for drop-in use where tokio's `send` was).
    pub fn send(&self, value: T) -> Result<(), Closed> {
        self.send_replace(value);
        Ok(())
    }

    /// The current value.
    pub fn borrow(&self) -> RwLockReadGuard<'_, T> {
        self.shared.value.read()
    }

    /// A receiver that has seen the current value.
    pub fn subscribe(&self) -> Receiver<T> {
        let seen = self.shared.version.load(Ordering::SeqCst);
        Receiver { shared: self.shared.clone(), seen }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::SeqCst);
        Sender { shared: self.shared.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.notify.notify_waiters();
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver { shared: self.shared.clone(), seen: self.seen }
    }
}

impl<T> Receiver<T> {
    /// The current value (not marked seen).
    pub fn borrow(&self) -> RwLockReadGuard<'_, T> {
        self.shared.value.read()
    }

    /// The current value, marked seen.
    pub fn borrow_and_update(&mut self) -> RwLockReadGuard<'_, T> {
        let guard = self.shared.value.read();
        self.seen = self.shared.version.load(Ordering::SeqCst);
        guard
    }

    /// Whether a value newer than the last seen one is there.
    pub fn has_changed(&self) -> bool {
        self.shared.version.load(Ordering::SeqCst) != self.seen
    }

    /// Waits for a value newer than the last seen one and marks it seen;
    /// fails if every sender is gone and no newer value is there.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            // Register before checking, so a send between the check and the
            // wait is not missed.
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let version = self.shared.version.load(Ordering::SeqCst);
            if version != self.seen {
                self.seen = version;
                return Ok(());
            }
            if self.shared.senders.load(Ordering::SeqCst) == 0 {
                return Err(Closed);
            }
            notified.await;
        }
    }

    /// Waits until `pred` holds for the current value (checked at once, then
    /// after every change); marks the value seen. Fails if every sender is
    /// gone first.
    pub async fn wait_for(&mut self, mut pred: impl FnMut(&T) -> bool) -> Result<(), Closed> {
        loop {
            if pred(&self.borrow_and_update()) {
                return Ok(());
            }
            self.changed().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn changed_sees_every_send_and_closes_with_the_last_sender() {
        let (tx, mut rx) = channel(1u32);
        assert!(!rx.has_changed());
        tx.send_replace(2);
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow(), 2);
        let waiter = tokio::spawn(async move {
            rx.wait_for(|v| *v == 4).await.unwrap();
            rx
        });
        tokio::task::yield_now().await;
        tx.send_replace(3);
        tx.send_replace(4);
        let mut rx = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        let tx2 = tx.clone();
        drop(tx);
        tx2.send_replace(5);
        drop(tx2);
        // The unseen value 5 is reported before the close.
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow(), 5);
        assert_eq!(rx.changed().await, Err(Closed));
    }

    async fn wake_order() -> Vec<u32> {
        let (tx, rx) = channel(0u32);
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..16 {
            let mut rx = rx.clone();
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                rx.changed().await.unwrap();
                order.lock().push(i);
            }));
            tokio::task::yield_now().await;
        }
        tx.send_replace(1);
        for t in tasks {
            t.await.unwrap();
        }
        let got = order.lock().clone();
        got
    }

    #[tokio::test]
    async fn waiters_wake_in_the_same_order_every_time() {
        let first = wake_order().await;
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, (0..16).collect::<Vec<_>>());
        for _ in 0..5 {
            assert_eq!(wake_order().await, first);
        }
    }
}
