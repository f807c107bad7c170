//! Write-behind: the FUSE daemon's per-file buffer of small writes.
//!
//! Without it every `write(2)` through the mount is one synchronous,
//! replicated chain write (4 KiB sequential writes ran at ~1 MiB/s). With
//! it, writes to one open file are gathered into **runs** of up to
//! `run_bytes` (the file's chunk size, capped) and written to storage in the
//! background, several runs of a file at once; `write(2)` returns once its
//! bytes are in the buffer.
//!
//! [`WriteBuffer`] is the pure state (no I/O, no clock): it decides what to
//! flush and when a flush may start. [`WriteBehind`] is its thin async shell:
//! it runs the flushes on tokio through a [`FlushSink`] and arms the timer.
//!
//! | event | rule |
//! | --- | --- |
//! | write inside or right after the open run, run stays ≤ `run_bytes` | merged into the run (overwrite in place or extend) |
//! | any other write | the open run is queued for flushing; the write opens a new run |
//! | run reaches `run_bytes` or ends on a multiple of it | queued for flushing |
//! | first byte of a run | timer armed: after `flush_delay_ms` the run is queued, whatever its size |
//! | fsync(2), close(2) (FUSE `flush`), release, truncate, a read of the file in this mount | run queued, then wait until nothing of the file is buffered or in flight |
//! | a queued flush starts | when no earlier unfinished flush overlaps its range (so overlapping writes reach storage in order) and fewer than `max_flushes_in_flight` of the file run |
//! | buffered + in-flight bytes over `max_dirty_bytes` | `write(2)` waits until flushes bring it under (memory stays bounded) |
//! | the mount's buffered + in-flight bytes (all files) would pass its budget | `write(2)` waits for budget before it is buffered |
//! | a background flush fails | its errno is kept and returned once, by the next write, fsync, close or truncate of that handle; the bytes of that flush are lost (as a local filesystem's page cache loses them after a writeback error) |
//!
//! Durability and visibility (see `docs/fuse.md`):
//! * the same mount sees buffered bytes at once: `getattr` reports the
//!   buffered end, and a read of the file first waits for its buffer;
//! * other clients see the bytes once close(2) or fsync(2) returned (both
//!   drain the buffer, then report the length to meta), as before;
//! * fsync(2) returns once every byte written before it is committed on
//!   every replica of its chain;
//! * a crash (kill -9) of the FUSE daemon loses at most the bytes that were
//!   not yet flushed: at most `max_dirty_bytes` per open file, written less
//!   than `flush_delay_ms` (plus the flush's own time) before the crash.

use bytes::{Bytes, BytesMut};
use fuser::Errno;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Limits of one file's buffer; units in the names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteBufferLimits {
    /// Largest run gathered before it is flushed (runs are also cut at
    /// multiples of this, so they line up with chunks).
    pub run_bytes: u64,
    /// Buffered + in-flight bytes of one file before `write(2)` waits.
    pub max_dirty_bytes: u64,
    /// Flushes of one file running at once.
    pub max_flushes_in_flight: usize,
}

/// One flush handed to the sink: `data` at `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushJob {
    pub id: u64,
    pub offset: u64,
    pub data: Bytes,
}

/// The run being gathered.
#[derive(Debug)]
struct Run {
    start: u64,
    buf: BytesMut,
}

impl Run {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
}

/// A run handed over for flushing, until its flush finished.
#[derive(Debug)]
struct Queued {
    id: u64,
    start: u64,
    end: u64,
    /// `None` once started (the job owns the bytes).
    data: Option<Bytes>,
}

/// What a write asks of the shell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Start the flush timer (a new run began and no timer runs).
    pub arm_timer: bool,
    /// How much the dirty bytes grew (an overwrite inside the run adds
    /// less than its length).
    pub added_bytes: u64,
}

/// The pure buffer of one open file. See the module docs for the rules.
#[derive(Debug)]
pub struct WriteBuffer {
    limits: WriteBufferLimits,
    run: Option<Run>,
    /// In id order (the order runs were handed over).
    queued: Vec<Queued>,
    next_id: u64,
    started: usize,
    dirty_bytes: u64,
    error: Option<Errno>,
    timer_armed: bool,
}

impl WriteBuffer {
    pub fn new(limits: WriteBufferLimits) -> Self {
        let limits = WriteBufferLimits {
            run_bytes: limits.run_bytes.max(1),
            max_dirty_bytes: limits.max_dirty_bytes.max(limits.run_bytes.max(1)),
            max_flushes_in_flight: limits.max_flushes_in_flight.max(1),
        };
        WriteBuffer { limits, run: None, queued: Vec::new(), next_id: 0, started: 0, dirty_bytes: 0, error: None, timer_armed: false }
    }

    /// Takes `data` at `offset` into the buffer; the error of an earlier
    /// failed flush instead, once (the write is then not taken).
    pub fn write(&mut self, offset: u64, data: Bytes) -> Result<WriteOutcome, Errno> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if data.is_empty() {
            return Ok(WriteOutcome::default());
        }
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        let cap = self.limits.run_bytes;
        let dirty_before = self.dirty_bytes;
        let merged = match self.run.as_mut() {
            Some(run) if offset >= run.start && offset <= run.end() && end - run.start <= cap => {
                let at = (offset - run.start) as usize;
                let old_len = run.buf.len();
                let overlap = (old_len - at).min(data.len());
                run.buf[at..at + overlap].copy_from_slice(&data[..overlap]);
                run.buf.extend_from_slice(&data[overlap..]);
                self.dirty_bytes += (run.buf.len() - old_len) as u64;
                true
            }
            _ => false,
        };
        let mut outcome = WriteOutcome::default();
        if !merged {
            self.queue_run();
            self.dirty_bytes += data.len() as u64;
            if data.len() as u64 >= cap {
                // Already a whole run: no copy, straight to the queue.
                self.push_queued(offset, data);
                outcome.added_bytes = self.dirty_bytes - dirty_before;
                return Ok(outcome);
            }
            let mut buf = BytesMut::with_capacity(cap as usize);
            buf.extend_from_slice(&data);
            self.run = Some(Run { start: offset, buf });
            if !self.timer_armed {
                self.timer_armed = true;
                outcome.arm_timer = true;
            }
        }
        if let Some(run) = &self.run {
            let run_end = run.end();
            if run.buf.len() as u64 >= cap || run_end % cap == 0 {
                self.queue_run();
            }
        }
        outcome.added_bytes = self.dirty_bytes - dirty_before;
        Ok(outcome)
    }

    /// Hands the open run (if any) over for flushing.
    pub fn queue_run(&mut self) {
        if let Some(run) = self.run.take() {
            let start = run.start;
            self.push_queued(start, run.buf.freeze());
        }
    }

    fn push_queued(&mut self, start: u64, data: Bytes) {
        let id = self.next_id;
        self.next_id += 1;
        self.queued.push(Queued { id, start, end: start + data.len() as u64, data: Some(data) });
    }

    /// The flush timer fired: the open run goes to the queue.
    pub fn timer_fired(&mut self) {
        self.timer_armed = false;
        self.queue_run();
    }

    /// Marks as started and returns the queued flushes that may start now.
    pub fn startable(&mut self) -> Vec<FlushJob> {
        let mut jobs = Vec::new();
        for i in 0..self.queued.len() {
            if self.started >= self.limits.max_flushes_in_flight {
                break;
            }
            if self.queued[i].data.is_none() {
                continue;
            }
            let (start, end) = (self.queued[i].start, self.queued[i].end);
            let blocked = self.queued[..i].iter().any(|q| q.start < end && start < q.end);
            if blocked {
                continue;
            }
            if let Some(data) = self.queued[i].data.take() {
                self.started += 1;
                jobs.push(FlushJob { id: self.queued[i].id, offset: start, data });
            }
        }
        jobs
    }

    /// The flush `id` ended; a failure is kept for the next caller.
    /// Returns how many dirty bytes it freed.
    pub fn finished(&mut self, id: u64, result: Result<(), Errno>) -> u64 {
        let mut freed = 0;
        if let Some(i) = self.queued.iter().position(|q| q.id == id && q.data.is_none()) {
            let q = self.queued.remove(i);
            self.started -= 1;
            freed = q.end - q.start;
            self.dirty_bytes -= freed;
        }
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
        freed
    }

    /// Whether `write(2)` must wait for flushes before returning.
    pub fn over_budget(&self) -> bool {
        self.dirty_bytes > self.limits.max_dirty_bytes
    }

    /// Nothing buffered and nothing in flight.
    pub fn is_clean(&self) -> bool {
        self.run.is_none() && self.queued.is_empty()
    }

    /// The error of a failed flush, once.
    pub fn take_error(&mut self) -> Option<Errno> {
        self.error.take()
    }

    /// The end of the furthest byte buffered or in flight (0 if none).
    pub fn end(&self) -> u64 {
        let queued = self.queued.iter().map(|q| q.end).max().unwrap_or(0);
        self.run.as_ref().map_or(0, Run::end).max(queued)
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }
}

/// Where flushes go: the open file's storage writes.
pub trait FlushSink: Clone + Send + Sync + 'static {
    fn write_at(&self, offset: u64, data: Bytes) -> impl Future<Output = Result<(), Errno>> + Send;
}

/// What [`WriteBehind::try_write`] did.
#[derive(Debug)]
pub enum TryWrite {
    /// Buffered; reply now.
    Done,
    /// Buffered, but the file is over its dirty budget: reply after
    /// [`WriteBehind::wait_for_room`].
    BufferedOverBudget,
    /// Not taken: the mount-wide budget is full; take the async path.
    NoBudget(Bytes),
    /// Not taken: the error of an earlier flush, or a bad write.
    Failed(Errno),
}

/// The mount-wide bound on buffered + in-flight bytes (all files), in
/// bytes: a write takes its length from it before it is buffered, and a
/// finished flush gives its bytes back.
pub type DirtyBudget = Arc<tokio::sync::Semaphore>;

/// The async shell of one file's [`WriteBuffer`].
pub struct WriteBehind {
    state: parking_lot::Mutex<WriteBuffer>,
    budget: DirtyBudget,
    changed: tokio::sync::Notify,
    flush_delay: Duration,
    /// Files of the mount with buffered bytes (reads check it first).
    dirty_files: Arc<AtomicUsize>,
    dirty: std::sync::atomic::AtomicBool,
}

impl WriteBehind {
    pub fn new(limits: WriteBufferLimits, flush_delay_ms: u64, dirty_files: Arc<AtomicUsize>, budget: DirtyBudget) -> Arc<Self> {
        Arc::new(WriteBehind {
            state: parking_lot::Mutex::new(WriteBuffer::new(limits)),
            budget,
            changed: tokio::sync::Notify::new(),
            flush_delay: Duration::from_millis(flush_delay_ms),
            dirty_files,
            dirty: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Buffers a write; returns once it is buffered and the file is under
    /// its dirty budget.
    pub async fn write<S: FlushSink>(self: &Arc<Self>, sink: &S, offset: u64, data: Bytes) -> Result<(), Errno> {
        let len = data.len() as u64;
        let want = u32::try_from(len).map_err(|_| Errno::EFBIG)?;
        // The mount-wide budget first (the budget is larger than any write:
        // see MountConfig); what the write did not add is given back.
        self.budget.acquire_many(want).await.map_err(|_| Errno::EIO)?.forget();
        let outcome = {
            let mut st = self.state.lock();
            let outcome = st.write(offset, data);
            self.sync_dirty(&st);
            outcome
        };
        let added = outcome.as_ref().map_or(0, |o| o.added_bytes);
        self.budget.add_permits((len - added.min(len)) as usize);
        let outcome = outcome?;
        if outcome.arm_timer {
            self.arm_timer(sink.clone());
        }
        self.start_flushes(sink);
        self.wait_until(|b| !b.over_budget()).await;
        Ok(())
    }

    /// The write path without a task: buffers the write if the mount-wide
    /// budget has room right now. Called on the kernel's request thread
    /// (inside the runtime's context, for the flush tasks), it saves the hop
    /// to a tokio worker and back for the common small write.
    pub fn try_write<S: FlushSink>(self: &Arc<Self>, sink: &S, offset: u64, data: Bytes) -> TryWrite {
        let len = data.len() as u64;
        let Ok(want) = u32::try_from(len) else { return TryWrite::Failed(Errno::EFBIG) };
        let Ok(permit) = self.budget.try_acquire_many(want) else { return TryWrite::NoBudget(data) };
        permit.forget();
        let (outcome, over) = {
            let mut st = self.state.lock();
            let outcome = st.write(offset, data);
            self.sync_dirty(&st);
            (outcome, st.over_budget())
        };
        let added = outcome.as_ref().map_or(0, |o| o.added_bytes);
        self.budget.add_permits((len - added.min(len)) as usize);
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => return TryWrite::Failed(e),
        };
        if outcome.arm_timer {
            self.arm_timer(sink.clone());
        }
        self.start_flushes(sink);
        if over {
            TryWrite::BufferedOverBudget
        } else {
            TryWrite::Done
        }
    }

    /// Waits until this file is under its dirty budget (after
    /// [`TryWrite::BufferedOverBudget`]).
    pub async fn wait_for_room(&self) {
        self.wait_until(|b| !b.over_budget()).await;
    }

    /// Flushes everything buffered and waits for it; the error of any failed
    /// flush since the last report.
    pub async fn drain<S: FlushSink>(self: &Arc<Self>, sink: &S) -> Result<(), Errno> {
        self.settle(sink).await;
        self.state.lock().take_error().map_or(Ok(()), Err)
    }

    /// Flushes everything buffered and waits for it, leaving a failure for
    /// the next write, fsync or close (a read of the file settles it first).
    pub async fn settle<S: FlushSink>(self: &Arc<Self>, sink: &S) {
        self.state.lock().queue_run();
        self.start_flushes(sink);
        self.wait_until(WriteBuffer::is_clean).await;
    }

    /// Whether anything is buffered or in flight.
    pub fn is_dirty(&self) -> bool {
        !self.state.lock().is_clean()
    }

    /// Nothing buffered, in flight, or failed and not yet reported: a
    /// drain would return `Ok` at once.
    pub fn is_settled_ok(&self) -> bool {
        let st = self.state.lock();
        st.is_clean() && st.error.is_none()
    }

    /// The end of the furthest byte buffered or in flight.
    pub fn end(&self) -> u64 {
        self.state.lock().end()
    }

    /// Keeps the mount's count of dirty files in step; called with the
    /// state locked, so the flag never lags behind a concurrent change.
    fn sync_dirty(&self, st: &WriteBuffer) {
        let dirty = !st.is_clean();
        if self.dirty.swap(dirty, Ordering::AcqRel) != dirty {
            if dirty {
                self.dirty_files.fetch_add(1, Ordering::AcqRel);
            } else {
                self.dirty_files.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn arm_timer<S: FlushSink>(self: &Arc<Self>, sink: S) {
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(this.flush_delay).await;
            this.state.lock().timer_fired();
            this.start_flushes(&sink);
        });
    }

    fn start_flushes<S: FlushSink>(self: &Arc<Self>, sink: &S) {
        let jobs = self.state.lock().startable();
        for job in jobs {
            let (this, sink) = (self.clone(), sink.clone());
            tokio::spawn(async move {
                let result = sink.write_at(job.offset, job.data).await;
                if let Err(e) = result {
                    tracing::warn!(offset = job.offset, errno = ?e, "a buffered write failed; reported at the next write, fsync or close");
                }
                let freed = {
                    let mut st = this.state.lock();
                    let freed = st.finished(job.id, result);
                    this.sync_dirty(&st);
                    freed
                };
                this.budget.add_permits(freed as usize);
                this.changed.notify_waiters();
                this.start_flushes(&sink);
            });
        }
    }

    async fn wait_until(&self, done: impl Fn(&WriteBuffer) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                if done(&st) {
                    return;
                }
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> WriteBufferLimits {
        WriteBufferLimits { run_bytes: 16, max_dirty_bytes: 64, max_flushes_in_flight: 2 }
    }

    fn b(n: usize, v: u8) -> Bytes {
        Bytes::from(vec![v; n])
    }

    #[test]
    fn sequential_small_writes_gather_into_aligned_runs() {
        let mut w = WriteBuffer::new(limits());
        assert!(w.write(0, b(4, 1)).unwrap().arm_timer);
        assert!(!w.write(4, b(4, 2)).unwrap().arm_timer);
        assert!(w.startable().is_empty(), "nothing flushes before the run is full");
        assert_eq!(w.end(), 8);
        w.write(8, b(8, 3)).unwrap();
        let jobs = w.startable();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].offset, 0);
        assert_eq!(&jobs[0].data[..], &[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]);
        // A run starting mid-way is cut at the next multiple of run_bytes.
        w.write(20, b(12, 4)).unwrap();
        let jobs = w.startable();
        assert_eq!((jobs[0].offset, jobs[0].data.len()), (20, 12));
    }

    #[test]
    fn overwrite_inside_the_run_is_merged_in_place() {
        let mut w = WriteBuffer::new(limits());
        w.write(0, b(8, 1)).unwrap();
        w.write(2, b(2, 9)).unwrap();
        w.write(6, b(4, 7)).unwrap();
        assert_eq!(w.dirty_bytes(), 10);
        w.queue_run();
        let jobs = w.startable();
        assert_eq!(&jobs[0].data[..], &[1, 1, 9, 9, 1, 1, 7, 7, 7, 7]);
    }

    #[test]
    fn overlapping_flushes_reach_storage_in_order() {
        let mut w = WriteBuffer::new(limits());
        w.write(0, b(4, 1)).unwrap();
        w.write(100, b(4, 2)).unwrap(); // not contiguous: [0,4) queued
        w.write(2, b(4, 3)).unwrap(); // [100,104) queued; overlaps the first
        w.queue_run();
        let first = w.startable();
        assert_eq!(first.iter().map(|j| j.offset).collect::<Vec<_>>(), vec![0, 100]);
        assert!(w.startable().is_empty(), "[2,6) waits for [0,4), and two run already");
        w.finished(first[1].id, Ok(()));
        assert!(w.startable().is_empty(), "a free slot is not enough: [0,4) still overlaps");
        w.finished(first[0].id, Ok(()));
        let next = w.startable();
        assert_eq!((next[0].offset, &next[0].data[..]), (2, &[3u8, 3, 3, 3][..]));
        w.finished(next[0].id, Ok(()));
        assert!(w.is_clean());
        assert_eq!(w.dirty_bytes(), 0);
    }

    #[test]
    fn a_write_of_a_whole_run_is_queued_without_a_copy() {
        let mut w = WriteBuffer::new(limits());
        let data = b(40, 5);
        w.write(0, data.clone()).unwrap();
        let jobs = w.startable();
        assert_eq!(jobs[0].data.as_ptr(), data.as_ptr());
    }

    #[test]
    fn a_failed_flush_is_reported_once_by_the_next_caller() {
        let mut w = WriteBuffer::new(limits());
        w.write(0, b(16, 1)).unwrap();
        let jobs = w.startable();
        w.finished(jobs[0].id, Err(Errno::EIO));
        assert!(w.is_clean());
        assert_eq!(w.write(16, b(1, 1)), Err(Errno::EIO));
        assert_eq!(w.write(16, b(1, 1)), Ok(WriteOutcome { arm_timer: true, added_bytes: 1 }));
        assert_eq!(w.take_error(), None);
    }

    #[test]
    fn dirty_bytes_bound_the_buffer() {
        let mut w = WriteBuffer::new(limits());
        for i in 0..5u64 {
            w.write(i * 16, b(16, 1)).unwrap();
        }
        assert!(w.over_budget(), "80 bytes dirty over a 64-byte budget");
        let jobs = w.startable();
        assert_eq!(jobs.len(), 2, "at most two flushes of a file at once");
        for j in jobs {
            w.finished(j.id, Ok(()));
        }
        assert!(!w.over_budget());
    }

    #[test]
    fn the_timer_flushes_a_partial_run() {
        let mut w = WriteBuffer::new(limits());
        w.write(0, b(3, 1)).unwrap();
        w.timer_fired();
        let jobs = w.startable();
        assert_eq!(jobs.len(), 1);
        // The next run arms a timer again.
        assert!(w.write(3, b(1, 1)).unwrap().arm_timer);
    }

    /// A sink recording writes into a model file, failing where told.
    #[derive(Clone)]
    struct Model {
        file: Arc<parking_lot::Mutex<Vec<u8>>>,
        fail_at: Option<u64>,
    }

    impl FlushSink for Model {
        async fn write_at(&self, offset: u64, data: Bytes) -> Result<(), Errno> {
            tokio::task::yield_now().await;
            if self.fail_at == Some(offset) {
                return Err(Errno::EIO);
            }
            let mut f = self.file.lock();
            let end = offset as usize + data.len();
            if f.len() < end {
                f.resize(end, 0);
            }
            f[offset as usize..end].copy_from_slice(&data);
            Ok(())
        }
    }

    #[tokio::test]
    async fn random_writes_through_the_shell_match_a_model() {
        // Seeded xorshift: the same sequence every run.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || crate::xorshift(&mut seed);
        let dirty = Arc::new(AtomicUsize::new(0));
        let budget = Arc::new(tokio::sync::Semaphore::new(300));
        let limits = WriteBufferLimits { run_bytes: 64, max_dirty_bytes: 256, max_flushes_in_flight: 3 };
        let wb = WriteBehind::new(limits, 5, dirty.clone(), budget.clone());
        let sink = Model { file: Arc::new(parking_lot::Mutex::new(Vec::new())), fail_at: None };
        let mut expect = vec![0u8; 0];
        for i in 0..2_000u64 {
            let r = next();
            let offset = if r % 3 == 0 { expect.len() as u64 } else { r % 1_024 };
            let len = (next() % 100 + 1) as usize;
            let v = (i % 251) as u8;
            let end = offset as usize + len;
            if expect.len() < end {
                expect.resize(end, 0);
            }
            expect[offset as usize..end].fill(v);
            wb.write(&sink, offset, Bytes::from(vec![v; len])).await.unwrap();
            if i % 97 == 0 {
                wb.drain(&sink).await.unwrap();
                assert_eq!(dirty.load(Ordering::Acquire), 0);
            }
        }
        wb.drain(&sink).await.unwrap();
        assert_eq!(budget.available_permits(), 300, "every byte of the mount-wide budget is back");
        let got = sink.file.lock().clone();
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "file differs from the model");
        assert_eq!(dirty.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_failed_background_flush_surfaces_at_drain() {
        let dirty = Arc::new(AtomicUsize::new(0));
        let wb = WriteBehind::new(limits(), 1_000, dirty, Arc::new(tokio::sync::Semaphore::new(1 << 20)));
        let sink = Model { file: Arc::new(parking_lot::Mutex::new(Vec::new())), fail_at: Some(16) };
        assert!(wb.is_settled_ok(), "a fresh buffer: close(2)'s flush may skip it");
        wb.write(&sink, 0, b(16, 1)).await.unwrap();
        assert!(!wb.is_settled_ok(), "bytes buffered");
        wb.write(&sink, 16, b(16, 2)).await.unwrap();
        wb.settle(&sink).await;
        assert!(!wb.is_dirty());
        assert!(!wb.is_settled_ok(), "clean, but the failed flush is still to be reported");
        assert_eq!(wb.drain(&sink).await, Err(Errno::EIO));
        assert!(wb.is_settled_ok());
        assert_eq!(wb.drain(&sink).await, Ok(()), "reported once");
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_writes_a_partial_run_without_a_drain() {
        let dirty = Arc::new(AtomicUsize::new(0));
        let wb = WriteBehind::new(limits(), 50, dirty, Arc::new(tokio::sync::Semaphore::new(1 << 20)));
        let sink = Model { file: Arc::new(parking_lot::Mutex::new(Vec::new())), fail_at: None };
        wb.write(&sink, 0, b(3, 7)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(sink.file.lock().is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(&sink.file.lock()[..], &[7, 7, 7]);
        assert!(!wb.is_dirty());
    }
}
