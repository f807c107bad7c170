//! The dispatcher thread and the execution of batches.
//!
//! One thread waits on the doorbell (a futex in shared memory that programs
//! bump after submitting; a finishing batch bumps it only if the dispatcher
//! found every batch slot busy). Each time it
//! wakes it looks at every ring, highest priority first (rotating among
//! rings of equal priority), asks the ring's [`Batcher`] what to take
//! (`io_depth` rule) and starts each batch (its first step on this thread,
//! the rest as a tokio task: `crate::start`), at most
//! `max_inflight_batches` at once. It sleeps until the doorbell rings, a
//! ring's batch timeout ends, or `idle_scan_ms` passes.
//!
//! A batch resolves its requests (iov by id, file by token), then:
//! reads go through `FsClient::read_many_into` straight into the iov, in
//! groups of up to 64 requests / 4 MiB (each group's chunk pieces as batched
//! storage reads); writes go through `FileHandle::write_at` of the FUSE
//! handle of the registered file with the iov range as the payload
//! (`Bytes::from_owner`: no copy in the daemon), then the kernel's cached
//! pages of the written range are dropped. Completions are posted in the
//! batch's submission order, as soon as a request and all before it are done
//! (a large batch completes progressively, so a program can refill early).
//!
//! | request | result |
//! |---|---|
//! | `len == 0`, range outside its iov, offset overflow | `-EINVAL` |
//! | unknown iov, another user's iov, a ring's memory as buffer | `-EACCES` |
//! | file not registered by the ring's process, closed, or not writable (write ring) | `-EBADF` |
//! | read meets a hole, ring has `FORBID_READ_HOLES` | `-ENODATA` |
//! | the iov's file was shrunk under the daemon | `-EFAULT` |
//! | storage / meta failure | the errno of `errno::errno_for` (mostly `-EIO`) |

use super::{RingEntry, Server};
use crate::errno::FsError;
use crate::handles::OpenFile;
use bytes::Bytes;
use fskv_client::{FileError, FileHandle, ReadInto, ReadIntoOptions};
use fskv_usrbio::batch::Decision;
use fskv_usrbio::proto::{Cqe, FLAG_ALLOW_READ_UNCOMMITTED, FLAG_FORBID_READ_HOLES};
use fskv_usrbio::ring::Taken;
use fskv_usrbio::sys::futex_wait;
use futures::{FutureExt, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

pub(super) struct Dispatcher {
    thread: std::thread::JoinHandle<()>,
}

impl Dispatcher {
    pub(super) fn start(server: &Arc<Server>) -> std::io::Result<Dispatcher> {
        let weak = Arc::downgrade(server);
        let permits = Arc::new(Semaphore::new(server.config().max_inflight_batches.max(1)));
        let thread = std::thread::Builder::new().name("fskv-usrbio".into()).spawn(move || run(weak, permits))?;
        Ok(Dispatcher { thread })
    }

    pub(super) fn join(self) {
        if self.thread.join().is_err() {
            tracing::error!("usrbio: the dispatcher thread panicked");
        }
    }
}

fn run(server: Weak<Server>, permits: Arc<Semaphore>) {
    let mut rotation = 0usize;
    loop {
        let Some(s) = server.upgrade() else { return };
        if s.stopping() {
            return;
        }
        let bell = s.doorbell();
        let seq = bell.seq.load(Ordering::SeqCst);
        let (next, took) = scan(&s, &permits, &mut rotation);
        let mut sleep = Duration::from_millis(s.config().idle_scan_ms.max(1));
        if let Some(at) = next {
            sleep = sleep.min(at.saturating_duration_since(Instant::now()));
        }
        if sleep.is_zero() {
            continue;
        }
        // Busy: poll the doorbell a moment before sleeping (a program that
        // submits again soon then needs no futex wake, and we no wake-up).
        let spin = Duration::from_micros(s.config().dispatch_spin_us);
        if took && !spin.is_zero() {
            let until = Instant::now() + spin;
            while bell.seq.load(Ordering::Acquire) == seq && Instant::now() < until {
                std::hint::spin_loop();
            }
            if bell.seq.load(Ordering::Acquire) != seq {
                continue;
            }
        }
        bell.waiters.store(1, Ordering::SeqCst);
        if bell.seq.load(Ordering::SeqCst) == seq {
            futex_wait(&bell.seq, seq, Some(sleep));
        }
        bell.waiters.store(0, Ordering::SeqCst);
    }
}

/// Rings in priority order, each priority's rings rotated by `rotation`.
fn dispatch_order(rings: Vec<Arc<RingEntry>>, rotation: usize) -> Vec<Arc<RingEntry>> {
    let mut out = Vec::with_capacity(rings.len());
    let mut start = 0;
    while start < rings.len() {
        let p = rings[start].key.priority;
        let end = start + rings[start..].iter().take_while(|r| r.key.priority == p).count();
        let group = &rings[start..end];
        let k = rotation % group.len();
        out.extend(group[k..].iter().cloned());
        out.extend(group[..k].iter().cloned());
        start = end;
    }
    out
}

/// Takes every batch the rings allow now; returns the earliest instant a
/// ring waits for (a short batch's timeout) and whether it took a batch.
fn scan(s: &Arc<Server>, permits: &Arc<Semaphore>, rotation: &mut usize) -> (Option<Instant>, bool) {
    let rings = s.rings();
    if rings.is_empty() {
        return (None, false);
    }
    let mut took = false;
    *rotation = rotation.wrapping_add(1);
    let now = Instant::now();
    let mut earliest: Option<Instant> = None;
    for ring in dispatch_order(rings, *rotation) {
        loop {
            if ring.closed.load(Ordering::Acquire) {
                break;
            }
            if permits.available_permits() == 0 {
                // Every batch slot is busy: the next batch to finish rings
                // the bell (set before looking again, so none is missed).
                s.starved.store(true, Ordering::SeqCst);
                if permits.available_permits() == 0 {
                    return (earliest, took);
                }
            }
            let decision = {
                let consumer = ring.consumer.lock();
                let state = consumer.ready().and_then(|ready| consumer.cq_space().map(|space| (ready, space)));
                match state {
                    Ok((ready, space)) => ring.batcher.lock().decide(ready, space, now),
                    Err(broken) => {
                        drop(consumer);
                        s.break_ring(&ring, broken.0);
                        break;
                    }
                }
            };
            match decision {
                Decision::Take(n) => {
                    let Ok(permit) = permits.clone().try_acquire_owned() else { return (earliest, took) };
                    took = true;
                    let taken = ring.consumer.lock().take(n);
                    let items = match taken {
                        Ok(items) => items,
                        Err(broken) => {
                            s.break_ring(&ring, broken.0);
                            break;
                        }
                    };
                    ring.running.fetch_add(1, Ordering::AcqRel);
                    let (server, r) = (s.clone(), ring.clone());
                    let span = tracing::debug_span!("usrbio_batch", ring = ring.ino, tgid = ring.owner.tgid, n);
                    let rt = s.runtime().clone();
                    let batch = async move {
                        run_batch(&server, &r, items).await;
                        r.running.fetch_sub(1, Ordering::AcqRel);
                        drop(permit);
                        if server.starved.swap(false, Ordering::SeqCst) {
                            server.wake();
                        }
                    };
                    // Its reads leave from this thread ([`crate::start`]).
                    crate::start::start_here(&rt, "usrbio batch", tracing::Instrument::instrument(batch, span));
                }
                Decision::WaitUntil(at) => {
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                    break;
                }
                Decision::Idle => break,
            }
        }
    }
    (earliest, took)
}

async fn run_batch(s: &Arc<Server>, ring: &Arc<RingEntry>, items: Vec<Taken>) {
    let posted = Posted::new(s, ring, &items);
    if let Some(shared) = s.files() {
        if std::panic::AssertUnwindSafe(execute(s, &shared, ring, &items, &posted)).catch_unwind().await.is_err() {
            tracing::error!(ring = ring.ino, "usrbio: a batch panicked; its requests fail with EIO");
        }
    }
    // Whatever was not posted (shutdown, a panic) fails.
    let rest = if s.files().is_some() { -i64::from(libc::EIO) } else { -i64::from(libc::ESHUTDOWN) };
    posted.finish(rest);
}

/// Posts a batch's completions in submission order as groups of them finish.
struct Posted<'a> {
    server: &'a Arc<Server>,
    ring: &'a Arc<RingEntry>,
    items: &'a [Taken],
    state: parking_lot::Mutex<PostState>,
}

struct PostState {
    results: Vec<Option<i64>>,
    /// Items before this index are posted.
    next: usize,
}

impl<'a> Posted<'a> {
    fn new(server: &'a Arc<Server>, ring: &'a Arc<RingEntry>, items: &'a [Taken]) -> Self {
        Posted { server, ring, items, state: parking_lot::Mutex::new(PostState { results: vec![None; items.len()], next: 0 }) }
    }

    /// Records results and posts every completion whose predecessors are done.
    fn set(&self, done: impl IntoIterator<Item = (usize, i64)>) {
        let mut st = self.state.lock();
        for (i, r) in done {
            if let Some(slot) = st.results.get_mut(i) {
                slot.get_or_insert(r);
            }
        }
        let from = st.next;
        while st.next < st.results.len() && st.results[st.next].is_some() {
            st.next += 1;
        }
        if st.next > from {
            self.post(&st.results[from..st.next], from);
        }
    }

    fn post(&self, results: &[Option<i64>], from: usize) {
        if self.ring.map.poisoned() {
            self.server.break_ring(self.ring, "the ring's file was shrunk under the daemon");
            return;
        }
        let cqes: Vec<Cqe> = results
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let t = &self.items[from + k];
                Cqe { index: t.slot as i32, reserved: 0, result: r.unwrap_or(-i64::from(libc::EIO)), userdata: t.args.userdata }
            })
            .collect();
        self.ring.consumer.lock().complete(&cqes);
    }

    /// Posts everything still open with `result`.
    fn finish(&self, result: i64) {
        let open: Vec<(usize, i64)> = {
            let st = self.state.lock();
            st.results.iter().enumerate().filter(|(_, r)| r.is_none()).map(|(i, _)| (i, result)).collect()
        };
        self.set(open);
    }
}

/// An iov range as a `Bytes` payload (keeps the mapping alive; no copy).
struct IovSlice {
    map: Arc<super::sigbus::GuardedMap>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for IovSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range was checked against the mapping's length, and the
        // mapping lives as long as this value.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.offset), self.len) }
    }
}

/// One request, resolved.
struct Job {
    idx: usize,
    iov: Arc<super::Region>,
    /// Index into the batch's distinct files.
    file: usize,
    iov_offset: usize,
    len: usize,
    file_offset: u64,
}

/// Reads of one batch run in groups of at most this many bytes ...
const READ_GROUP_BYTES: usize = 4 << 20;
/// ... and requests; each group is one `read_many_into` (its chunk pieces
/// batched per storage node) and its completions are posted when it ends,
/// so large batches complete progressively.
const READ_GROUP_REQUESTS: usize = 64;

fn errno_of(e: FileError) -> i64 {
    if matches!(e, FileError::Hole { .. }) {
        return -i64::from(libc::ENODATA);
    }
    -i64::from(FsError::from(e).0.code())
}

/// Cuts `jobs` (in submission order) into read groups.
fn read_groups(jobs: &[Job]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, j) in jobs.iter().enumerate() {
        if i > start && (i - start >= READ_GROUP_REQUESTS || bytes + j.len > READ_GROUP_BYTES) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += j.len;
    }
    if start < jobs.len() {
        out.push(start..jobs.len());
    }
    out
}

async fn execute(s: &Arc<Server>, shared: &Arc<crate::fs::Shared>, ring: &Arc<RingEntry>, items: &[Taken], posted: &Posted<'_>) {
    let mut failed: Vec<(usize, i64)> = Vec::new();
    let mut iovs: HashMap<[u8; 16], Result<Arc<super::Region>, i32>> = HashMap::new();
    let mut files: Vec<(u64, Arc<OpenFile>)> = Vec::new();
    let mut jobs = Vec::with_capacity(items.len());
    for (idx, t) in items.iter().enumerate() {
        let a = &t.args;
        let iov = iovs.entry(a.iov_id).or_insert_with(|| s.iov(&a.iov_id, &ring.owner)).clone();
        let iov = match iov {
            Ok(r) => r,
            Err(e) => {
                failed.push((idx, -i64::from(e)));
                continue;
            }
        };
        let in_iov = a.iov_offset.checked_add(a.len).is_some_and(|end| end <= iov.map.len() as u64);
        let in_file = a.file_offset.checked_add(a.len).is_some_and(|end| end <= i64::MAX as u64);
        if a.len == 0 || !in_iov || !in_file {
            failed.push((idx, -i64::from(libc::EINVAL)));
            continue;
        }
        if !s.file_registered(ring.owner.tgid, a.file) {
            failed.push((idx, -i64::from(libc::EBADF)));
            continue;
        }
        let file = match files.iter().position(|(fh, _)| *fh == a.file) {
            Some(i) => i,
            None => match shared.handles.file(a.file) {
                Ok(f) if ring.key.for_read || f.writable => {
                    files.push((a.file, f));
                    files.len() - 1
                }
                _ => {
                    failed.push((idx, -i64::from(libc::EBADF)));
                    continue;
                }
            },
        };
        jobs.push(Job { idx, iov, file, iov_offset: a.iov_offset as usize, len: a.len as usize, file_offset: a.file_offset });
    }
    posted.set(failed);
    // Writes buffered through the mount on these handles land first, so
    // ring I/O is ordered after them.
    for (_, f) in &files {
        f.settle().await;
    }
    // In-flight calls hold the open files shared: a close waits for them.
    let guards = futures::future::join_all(files.iter().map(|(_, f)| f.handle.read())).await;
    let handle = |i: usize| -> Option<&FileHandle> { guards.get(i).and_then(|g| g.as_ref()) };
    let files = &files;
    let efault = |job: &Job, r: i64| if job.iov.map.poisoned() { -i64::from(libc::EFAULT) } else { r };
    let mut running = futures::stream::FuturesUnordered::new();
    if ring.key.for_read {
        let options = ReadIntoOptions {
            relaxed: ring.key.flags & FLAG_ALLOW_READ_UNCOMMITTED != 0 || shared.client.config().relaxed_reads,
            forbid_holes: ring.key.flags & FLAG_FORBID_READ_HOLES != 0,
        };
        for group in read_groups(&jobs) {
            let group = &jobs[group];
            running.push(
                async move {
                    let mut out = Vec::with_capacity(group.len());
                    let mut reads = Vec::with_capacity(group.len());
                    let mut owners = Vec::with_capacity(group.len());
                    for job in group {
                        let Some(h) = handle(job.file) else {
                            out.push((job.idx, -i64::from(libc::EBADF)));
                            continue;
                        };
                        // SAFETY: the range lies inside the mapping (checked
                        // above) and the mapping outlives this call (`job.iov`
                        // holds it). The memory is shared with the program,
                        // which must not touch a buffer while its request is
                        // in flight (as with any DMA).
                        let buf = unsafe { std::slice::from_raw_parts_mut(job.iov.map.as_ptr().add(job.iov_offset), job.len) };
                        reads.push(ReadInto { handle: h, offset: job.file_offset, buf });
                        owners.push(job);
                    }
                    let results = shared.client.read_many_into(&mut reads, options).await;
                    drop(reads);
                    for (job, r) in owners.into_iter().zip(results) {
                        out.push((job.idx, efault(job, r.map_or_else(errno_of, |n| n as i64))));
                    }
                    out
                }
                .boxed(),
            );
        }
    } else {
        for job in &jobs {
            running.push(
                async move {
                    let Some(h) = handle(job.file) else { return vec![(job.idx, -i64::from(libc::EBADF))] };
                    let data = Bytes::from_owner(IovSlice { map: job.iov.map.clone(), offset: job.iov_offset, len: job.len });
                    let r = match h.write_at(job.file_offset, data).await {
                        Ok(()) => {
                            // Readers of this mount see it once it completes.
                            let end = job.file_offset + job.len as u64;
                            shared.invalidate_cached(vec![(files[job.file].1.inode.0, (job.file_offset, end))]).await;
                            job.len as i64
                        }
                        Err(e) => errno_of(e),
                    };
                    vec![(job.idx, efault(job, r))]
                }
                .boxed(),
            );
        }
    }
    while let Some(done) = running.next().await {
        posted.set(done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_usrbio::proto::{Priority, RingKey};

    #[test]
    fn read_groups_cut_by_requests_and_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fd = fskv_usrbio::sys::create_file(&dir.path().join("iov"), 4096).expect("create");
        let map = super::super::sigbus::GuardedMap::map(&fd, 4096).expect("map");
        let region = Arc::new(super::super::Region::for_tests(map));
        let job = |idx: usize, len: usize| Job { idx, iov: region.clone(), file: 0, iov_offset: 0, len, file_offset: 0 };
        let small: Vec<Job> = (0..130).map(|i| job(i, 4096)).collect();
        assert_eq!(read_groups(&small), vec![0..64, 64..128, 128..130]);
        let big: Vec<Job> = (0..10).map(|i| job(i, 1 << 20)).collect();
        assert_eq!(read_groups(&big), vec![0..4, 4..8, 8..10]);
        let huge = vec![job(0, 64 << 20), job(1, 10)];
        assert_eq!(read_groups(&huge), vec![0..1, 1..2], "one request larger than a group is a group");
        assert!(read_groups(&[]).is_empty());
    }

    #[test]
    fn errors_of_reads_map_to_errnos() {
        assert_eq!(errno_of(FileError::Hole { path: "f".into(), offset: 3 }), -i64::from(libc::ENODATA));
        assert_eq!(errno_of(FileError::InvalidArgument("x".into())), -i64::from(libc::EINVAL));
        assert_eq!(errno_of(FileError::WrongMode { path: "f".into(), mode: "reading" }), -i64::from(libc::EACCES));
    }

    #[test]
    fn dispatch_order_is_by_priority_and_rotates_within_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mk = |ino: u64, priority: Priority| {
            let bytes = fskv_usrbio::proto::RingLayout::new(4).expect("layout").bytes;
            let fd = fskv_usrbio::sys::create_file(&dir.path().join(ino.to_string()), bytes).expect("create");
            let map = super::super::sigbus::GuardedMap::map(&fd, bytes).expect("map");
            let view = fskv_usrbio::ring::RingView::init(map.mapping().clone(), 4).expect("init");
            let key = RingKey { for_read: true, io_depth: 0, priority, timeout_ms: 0, flags: 0 };
            Arc::new(RingEntry {
                ino,
                key,
                owner: super::super::Owner { tgid: 1, uid: 0, gid: 0 },
                map,
                consumer: parking_lot::Mutex::new(fskv_usrbio::ring::Consumer::new(view)),
                batcher: parking_lot::Mutex::new(fskv_usrbio::batch::Batcher::new(0, 0, 16)),
                closed: std::sync::atomic::AtomicBool::new(false),
                running: std::sync::atomic::AtomicU32::new(0),
            })
        };
        let rings =
            vec![mk(1, Priority::High), mk(2, Priority::Normal), mk(3, Priority::Normal), mk(4, Priority::Normal), mk(5, Priority::Low)];
        let order = |rot| dispatch_order(rings.clone(), rot).iter().map(|r| r.ino).collect::<Vec<_>>();
        assert_eq!(order(0), vec![1, 2, 3, 4, 5]);
        assert_eq!(order(1), vec![1, 3, 4, 2, 5]);
        assert_eq!(order(2), vec![1, 4, 2, 3, 5]);
    }
}
