//! Starting the work of a request on the thread that received it.
//!
//! The FUSE reader threads and the USRBIO dispatcher are not tokio
//! workers. Handing a request's future to tokio wakes a parked worker
//! (tens of µs on a small VM) before the request does anything, and the
//! RPC it sends leaves only after that wake-up. [`start_here`] polls the
//! future once on the receiving thread instead: its first step — resolving
//! the handle, building the call, writing the frame (the RPC client writes
//! from the caller's thread when the connection is idle) — runs at once,
//! and the worker's wake-up overlaps the server's work.
//!
//! | the first poll | then |
//! |---|---|
//! | finishes the work | nothing is spawned: the reply was sent from this thread |
//! | waits | the future is spawned; the task polls it again at once and registers its own waker (nothing keeps the no-op waker of the first poll) |
//! | panics | logged once here; the future is dropped (a FUSE reply dropped unsent answers EIO), the thread goes on, as a panicking tokio task would leave it |

use std::future::Future;
use std::task::{Context, Poll};

/// Runs `fut` until its first wait on this thread (inside `rt`'s context),
/// then on `rt` (see the module doc).
pub fn start_here<F: Future<Output = ()> + Send + 'static>(rt: &tokio::runtime::Handle, what: &'static str, fut: F) {
    let mut task = Box::pin(fut);
    let _entered = rt.enter();
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.as_mut().poll(&mut cx))) {
        Ok(Poll::Ready(())) => {}
        Ok(Poll::Pending) => {
            rt.spawn(task);
        }
        Err(_) => tracing::error!(what, "a request panicked in its first step; it is dropped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn work_that_never_waits_runs_on_this_thread_and_waiting_work_finishes_on_tokio() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let here = std::thread::current().id();
        let ran_on = Arc::new(parking_lot::Mutex::new(None));
        let r = ran_on.clone();
        start_here(rt.handle(), "test", async move {
            *r.lock() = Some(std::thread::current().id());
        });
        assert_eq!(*ran_on.lock(), Some(here), "finished in the first poll, on the caller's thread");

        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let d = done.clone();
        start_here(rt.handle(), "test", async move {
            d.fetch_add(1, Ordering::SeqCst);
            let _ = rx.await;
            d.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 1, "the first step ran before start_here returned");
        tx.send(()).expect("send");
        rt.block_on(async {
            for _ in 0..200 {
                if done.load(Ordering::SeqCst) == 2 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            panic!("the spawned rest never woke up");
        });
    }

    #[test]
    fn a_panic_in_the_first_step_is_contained() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        start_here(rt.handle(), "test", async { panic!("boom") });
        // This thread goes on.
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        start_here(rt.handle(), "test", async move {
            d.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }
}
