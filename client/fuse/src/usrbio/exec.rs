//! The dispatcher thread and the execution of batches.
//!
//! One thread waits on the doorbell (a futex in shared memory that programs
//! bump after submitting; a finishing batch bumps it only if the dispatcher
//! found every batch slot busy). Each time it
//! wakes it looks at every ring, highest priority first (rotating among
//! rings of equal priority), asks the ring's [`Batcher`] what to take
//! (`io_depth` rule) and spawns each batch as a tokio task, at most
//! `max_inflight_batches` at once. It sleeps until the doorbell rings, a
//! ring's batch timeout ends, or `idle_scan_ms` passes.
//!
//! A batch resolves its requests (iov by id, file by token), then:
//! reads go through `FsClient::read_many_into` straight into the iov (the
//! chunk pieces of the whole batch as batched storage reads); writes go
//! through `FileHandle::write_at` of the FUSE handle of the registered file
//! with the iov range as the payload (`Bytes::from_owner`: no copy in the
//! daemon), then the kernel's cached pages of the written ranges are
//! dropped. Completions are posted in submission order of the batch.
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
use futures::FutureExt;
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
                    s.runtime().spawn(tracing::Instrument::instrument(
                        async move {
                            run_batch(&server, &r, items).await;
                            r.running.fetch_sub(1, Ordering::AcqRel);
                            drop(permit);
                            if server.starved.swap(false, Ordering::SeqCst) {
                                server.wake();
                            }
                        },
                        span,
                    ));
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
    let results = match s.files() {
        Some(shared) => match std::panic::AssertUnwindSafe(execute(s, &shared, ring, &items)).catch_unwind().await {
            Ok(r) => r,
            Err(_) => {
                tracing::error!(ring = ring.ino, "usrbio: a batch panicked; its requests fail with EIO");
                vec![-i64::from(libc::EIO); items.len()]
            }
        },
        None => vec![-i64::from(libc::ESHUTDOWN); items.len()],
    };
    if ring.map.poisoned() {
        s.break_ring(ring, "the ring's file was shrunk under the daemon");
        return;
    }
    let cqes: Vec<Cqe> =
        items.iter().zip(results).map(|(t, result)| Cqe { index: t.slot as i32, reserved: 0, result, userdata: t.args.userdata }).collect();
    ring.consumer.lock().complete(&cqes);
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

fn errno_of(e: FileError) -> i64 {
    if matches!(e, FileError::Hole { .. }) {
        return -i64::from(libc::ENODATA);
    }
    -i64::from(FsError::from(e).0.code())
}

async fn execute(s: &Arc<Server>, shared: &Arc<crate::fs::Shared>, ring: &Arc<RingEntry>, items: &[Taken]) -> Vec<i64> {
    let mut results = vec![0i64; items.len()];
    let mut iovs: HashMap<[u8; 16], Result<Arc<super::Region>, i32>> = HashMap::new();
    let mut files: Vec<(u64, Arc<OpenFile>)> = Vec::new();
    let mut jobs = Vec::with_capacity(items.len());
    for (idx, t) in items.iter().enumerate() {
        let a = &t.args;
        let iov = iovs.entry(a.iov_id).or_insert_with(|| s.iov(&a.iov_id, &ring.owner)).clone();
        let iov = match iov {
            Ok(r) => r,
            Err(e) => {
                results[idx] = -i64::from(e);
                continue;
            }
        };
        let in_iov = a.iov_offset.checked_add(a.len).is_some_and(|end| end <= iov.map.len() as u64);
        let in_file = a.file_offset.checked_add(a.len).is_some_and(|end| end <= i64::MAX as u64);
        if a.len == 0 || !in_iov || !in_file {
            results[idx] = -i64::from(libc::EINVAL);
            continue;
        }
        if !s.file_registered(ring.owner.tgid, a.file) {
            results[idx] = -i64::from(libc::EBADF);
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
                    results[idx] = -i64::from(libc::EBADF);
                    continue;
                }
            },
        };
        jobs.push(Job { idx, iov, file, iov_offset: a.iov_offset as usize, len: a.len as usize, file_offset: a.file_offset });
    }
    // In-flight calls hold the open files shared: a close waits for them.
    let guards = futures::future::join_all(files.iter().map(|(_, f)| f.handle.read())).await;
    let handle = |i: usize| -> Option<&FileHandle> { guards.get(i).and_then(|g| g.as_ref()) };
    if ring.key.for_read {
        let options = ReadIntoOptions {
            relaxed: ring.key.flags & FLAG_ALLOW_READ_UNCOMMITTED != 0 || shared.client.config().relaxed_reads,
            forbid_holes: ring.key.flags & FLAG_FORBID_READ_HOLES != 0,
        };
        let mut reads = Vec::with_capacity(jobs.len());
        let mut owners = Vec::with_capacity(jobs.len());
        for job in &jobs {
            let Some(h) = handle(job.file) else {
                results[job.idx] = -i64::from(libc::EBADF);
                continue;
            };
            // SAFETY: the range lies inside the mapping (checked above) and
            // the mapping outlives this call (`job.iov` holds it). The memory
            // is shared with the program, which must not touch a buffer while
            // its request is in flight (as with any DMA).
            let buf = unsafe { std::slice::from_raw_parts_mut(job.iov.map.as_ptr().add(job.iov_offset), job.len) };
            reads.push(ReadInto { handle: h, offset: job.file_offset, buf });
            owners.push(job.idx);
        }
        let out = shared.client.read_many_into(&mut reads, options).await;
        for (idx, r) in owners.into_iter().zip(out) {
            results[idx] = match r {
                Ok(n) => n as i64,
                Err(e) => errno_of(e),
            };
        }
    } else {
        let writes = jobs.iter().filter_map(|job| {
            let h = handle(job.file)?;
            let data = Bytes::from_owner(IovSlice { map: job.iov.map.clone(), offset: job.iov_offset, len: job.len });
            Some(async move { (job.idx, h.write_at(job.file_offset, data).await.map(|()| job.len)) })
        });
        let mut written: HashMap<u64, (u64, u64)> = HashMap::new();
        for (idx, r) in futures::future::join_all(writes).await {
            results[idx] = match r {
                Ok(n) => n as i64,
                Err(e) => errno_of(e),
            };
        }
        for job in &jobs {
            if results[job.idx] > 0 {
                let inode = files[job.file].1.inode.0;
                let end = job.file_offset + job.len as u64;
                let e = written.entry(inode).or_insert((job.file_offset, end));
                *e = (e.0.min(job.file_offset), e.1.max(end));
            }
        }
        for job in &jobs {
            if handle(job.file).is_none() && results[job.idx] == 0 {
                results[job.idx] = -i64::from(libc::EBADF);
            }
        }
        drop(guards);
        shared.invalidate_cached(written.into_iter().collect());
        for job in &jobs {
            if job.iov.map.poisoned() {
                results[job.idx] = -i64::from(libc::EFAULT);
            }
        }
        return results;
    }
    for job in &jobs {
        if job.iov.map.poisoned() {
            results[job.idx] = -i64::from(libc::EFAULT);
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_usrbio::proto::{Priority, RingKey};

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
