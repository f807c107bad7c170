//! The `fuser::Filesystem` over the native client.
//!
//! Every callback turns its arguments into owned values, builds a per-call
//! [`Ctx`] (the client acting as the caller's uid/gid) and spawns the async
//! work on the tokio runtime; the task sends the reply. The kernel's reader
//! thread never waits for the cluster, so slow operations do not block others.

use crate::attr::{ns_of, special_kind_of_mode, to_attr};
use crate::errno::{FsError, FsResult};
use crate::handles::{CacheStamps, DirState, HandleTable, ListedEntry, OpenDir, OpenFile};
use crate::MountConfig;
use bytes::Bytes;
use fskv_client::{FsClient, OpenFlags as FskvOpenFlags};
use fskv_proto::meta::{Inode, InodeData, SetAttr, UserInfo, XattrFlag};
use fskv_types::InodeId;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle as Fh, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner, OpenAccMode,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing::Instrument;

/// Block size reported by statfs.
const STATFS_BLOCK_BYTES: u64 = 4096;
/// Free inodes reported by statfs (ids are 64-bit; this is "plenty").
const STATFS_FREE_INODES: u64 = 1 << 32;

/// State shared by every request of one mount.
pub(crate) struct Shared {
    pub client: FsClient,
    pub metrics: Arc<crate::metrics::FuseMetrics>,
    pub handles: HandleTable,
    pub cache_stamps: CacheStamps,
    pub cfg: MountConfig,
    /// USRBIO (set once the mount is up, unless disabled).
    pub usrbio: std::sync::OnceLock<Arc<crate::usrbio::Server>>,
    /// Tells the kernel to drop cached pages (set once the session exists).
    pub notifier: std::sync::OnceLock<fuser::Notifier>,
    /// Stores of pages read around small reads against changes of their
    /// files (see [`crate::readaround`]).
    pub store_gate: Arc<crate::readaround::StoreGate>,
    /// Files known to lack the xattrs the kernel and `ls -l` probe (see `PROBED_XATTRS`).
    pub absent_xattrs: crate::handles::AbsentXattrCache,
    /// Directories' attributes for the kernel's GETATTR after each change
    /// of their entries (see `DirAttrCache`).
    pub dir_attrs: crate::handles::DirAttrCache,
    /// Open files with buffered writes (reads and truncates look only when
    /// it is non-zero).
    pub dirty_files: Arc<std::sync::atomic::AtomicUsize>,
    /// The mount-wide budget of buffered bytes (`max_dirty_bytes_total`).
    pub dirty_budget: crate::writeback::DirtyBudget,
    /// Closes of never-written handles, sent in batches (`None`: each at
    /// its release). See [`crate::closes`].
    pub closes: Option<crate::closes::CloseQueue>,
}

impl Shared {
    fn usrbio(&self) -> Option<&Arc<crate::usrbio::Server>> {
        self.usrbio.get()
    }

    /// Waits until the writes buffered for `inode` by any handle of this
    /// mount are on storage (before a read or truncate of it).
    pub async fn settle_writers(&self, inode: InodeId) {
        if self.dirty_files.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return;
        }
        for f in self.handles.writers_of(inode) {
            f.settle().await;
        }
    }

    /// A write-behind buffer for a new writable handle of a file with
    /// `chunk_bytes` chunks, unless buffering is off.
    fn write_behind(&self, chunk_bytes: u64) -> Option<Arc<crate::writeback::WriteBehind>> {
        let cfg = &self.cfg;
        if cfg.write_buffer_bytes == 0 {
            return None;
        }
        let limits = crate::writeback::WriteBufferLimits {
            run_bytes: chunk_bytes.clamp(1, cfg.write_buffer_bytes),
            max_dirty_bytes: cfg.max_dirty_bytes_per_file,
            max_flushes_in_flight: cfg.max_flushes_in_flight_per_file,
        };
        Some(crate::writeback::WriteBehind::new(limits, cfg.write_flush_delay_ms, self.dirty_files.clone(), self.dirty_budget.clone()))
    }

    /// Drops the kernel's cached attributes of `inode` (not its pages;
    /// `FUSE_NOTIFY_INVAL_INODE` with a negative offset takes no page lock,
    /// so a request handler may send it before its reply).
    pub fn invalidate_attributes(&self, inode: InodeId) {
        if let Some(notifier) = self.notifier.get() {
            notify_inval_inode(notifier, inode.0, -1, 0);
        }
    }

    /// Drops the kernel's cached pages and attributes of `(inode, (start,
    /// end))` ranges written behind its back (USRBIO writes); returns once the
    /// kernel has done it. Runs off the async workers (the kernel may wait
    /// for page locks held by reads this mount is serving).
    pub async fn invalidate_cached(&self, ranges: Vec<(u64, (u64, u64))>) {
        let Some(notifier) = self.notifier.get().cloned() else { return };
        if ranges.is_empty() {
            return;
        }
        let mut blocks = Vec::with_capacity(ranges.len());
        for (inode, _) in &ranges {
            self.cache_stamps.forget(InodeId(*inode));
            // Pages read around before the write are not stored after the
            // drop (crate::readaround).
            blocks.push(self.store_gate.block(InodeId(*inode)).await);
        }
        let done = tokio::task::spawn_blocking(move || {
            for (inode, (start, end)) in ranges {
                let len = i64::try_from(end - start).unwrap_or(i64::MAX);
                notify_inval_inode(&notifier, inode, i64::try_from(start).unwrap_or(i64::MAX), len);
            }
        });
        if done.await.is_err() {
            tracing::warn!("the cache invalidation task failed");
        }
        drop(blocks);
    }

    /// Gives the kernel the pages read around a small read, after its
    /// reply, on the blocking pool (the kernel may wait there for page locks
    /// of reads this mount is serving).
    fn store_around(self: &Arc<Self>, around: AroundPages) {
        let Some(notifier) = self.notifier.get().cloned() else { return };
        let shared = self.clone();
        tokio::task::spawn_blocking(move || {
            let stored = around.store(&notifier);
            shared.metrics.read_around(stored);
        });
    }
}

/// The window read around a small read: the bytes, and which of them the
/// read itself returned (never stored: the kernel holds those pages locked
/// until the reply).
pub(crate) struct AroundPages {
    ticket: crate::readaround::Ticket,
    inode: InodeId,
    start: u64,
    data: Bytes,
    own: std::ops::Range<usize>,
}

impl AroundPages {
    /// Stores the pages before and after the read's own (unless a change
    /// of the file cancelled the ticket); the bytes stored.
    fn store(self, notifier: &fuser::Notifier) -> u64 {
        let AroundPages { ticket, inode, start, data, own } = self;
        ticket.store(|| {
            let before = (start, &data[..own.start]);
            let after = (start + own.end as u64, &data[own.end..]);
            let mut stored = 0;
            for (offset, bytes) in [before, after] {
                if bytes.is_empty() {
                    continue;
                }
                match notifier.store(INodeNo(inode.0), offset, bytes) {
                    Ok(()) => stored += bytes.len() as u64,
                    // ENOENT: the kernel has forgotten the inode meanwhile.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => tracing::debug!(%inode, offset, error = %e, "storing pages read around failed"),
                }
            }
            stored
        })
    }
}

/// Who made a request, for USRBIO.
fn caller(req: &Request) -> crate::usrbio::Caller {
    crate::usrbio::Caller { uid: req.uid(), gid: req.gid(), tid: req.pid() }
}

/// Whether `name` in `parent` is the virtual directory's reserved name.
fn is_reserved(parent: INodeNo, name: &OsStr) -> bool {
    parent.0 == 1 && name.as_encoded_bytes() == fskv_usrbio::proto::VIRT_DIR.as_bytes()
}

/// The mounted filesystem.
pub struct FskvFs {
    shared: Arc<Shared>,
    rt: tokio::runtime::Handle,
}

/// One request's view: the client acting as the caller.
struct Ctx {
    client: FsClient,
    shared: Arc<Shared>,
}

fn name_str(name: &OsStr) -> FsResult<String> {
    name.to_str().map(str::to_string).ok_or(FsError(Errno::EINVAL))
}

fn ino(i: INodeNo) -> InodeId {
    InodeId(i.0)
}

fn to_time_ns(t: TimeOrNow) -> u64 {
    match t {
        TimeOrNow::SpecificTime(t) => ns_of(t),
        TimeOrNow::Now => ns_of(SystemTime::now()),
    }
}

impl FskvFs {
    pub(crate) fn new(shared: Arc<Shared>, rt: tokio::runtime::Handle) -> Self {
        FskvFs { shared, rt }
    }

    fn ctx(&self, req: &Request) -> Ctx {
        let user = UserInfo::new(req.uid(), req.gid());
        Ctx { client: self.shared.client.with_user(user), shared: self.shared.clone() }
    }

    /// Runs the work of operation `op` (it replies when done), timed into
    /// the mount's metrics: its first step here, on the FUSE thread, up to
    /// its first wait, the rest on tokio ([`crate::start`]).
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, op: &'static str, span: tracing::Span, fut: F) {
        let timer = crate::metrics::OpTimer::start(&self.shared.metrics, op);
        let work = async move {
            fut.await;
            drop(timer);
        };
        crate::start::start_here(&self.rt, op, work.instrument(span));
    }

    /// The USRBIO server, when `parent`/`name` or `ino` is in the virtual
    /// directory (`None`: an ordinary request, or USRBIO is off).
    fn virt(&self, ino: INodeNo, name: Option<&OsStr>) -> Option<&Arc<crate::usrbio::Server>> {
        let u = self.shared.usrbio()?;
        let hit = crate::usrbio::is_virtual(ino.0) || name.is_some_and(|n| is_reserved(ino, n));
        hit.then_some(u)
    }

    /// Releases `fh` on the FUSE thread when nothing about it waits: its
    /// flush has nothing to do (`OpenFile::flush_is_noop`), no request on
    /// it is still running, and its close — none for a read-only handle —
    /// goes to the close queue. `false`: nothing was done, release as
    /// usual.
    fn release_now(&self, fh: u64) -> bool {
        let shared = &self.shared;
        let Ok(file) = shared.handles.file(fh) else { return false };
        if !file.flush_is_noop() || (file.writable && shared.closes.is_none()) {
            return false;
        }
        let Ok(mut slot) = file.handle.try_write() else { return false };
        let handle = slot.take();
        drop(slot);
        shared.handles.remove_file(fh);
        forget_released(shared, fh, &file);
        // A read-only handle's close is local (no session): dropping it is
        // the close. A writable one passed `flush_is_noop`, so it never
        // wrote and its close goes to the queue.
        if let (Some(handle), true) = (handle, file.writable) {
            if let Some(handle) = queue_quiet_close(handle, shared.closes.as_ref()) {
                let inode = file.inode;
                self.rt.spawn(async move {
                    if let Err(e) = close_handle(inode, handle).await {
                        tracing::warn!(error = ?e, "close failed");
                    }
                });
            }
        }
        true
    }

    fn virt_ttl(&self, attr: &FileAttr) -> Duration {
        // Registrations come and go: never cache them in the kernel.
        if attr.kind == fuser::FileType::Directory {
            Duration::from_millis(self.shared.cfg.entry_ttl_ms)
        } else {
            Duration::ZERO
        }
    }

    fn reply_virt_entry(&self, reply: ReplyEntry, r: Result<FileAttr, Errno>) {
        match r {
            Ok(attr) => reply.entry(&self.virt_ttl(&attr), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

impl Ctx {
    fn meta(&self) -> &fskv_client::MetaClient {
        self.client.meta()
    }

    fn attr_ttl(&self) -> Duration {
        Duration::from_millis(self.shared.cfg.attr_ttl_ms)
    }

    fn entry_ttl(&self) -> Duration {
        Duration::from_millis(self.shared.cfg.entry_ttl_ms)
    }

    /// Attributes of `inode`, sized to cover writes still open in this mount.
    fn attr_of(&self, inode: &Inode) -> FileAttr {
        let mut open_end = 0;
        if matches!(inode.data, InodeData::File(_)) {
            for f in self.shared.handles.writers_of(inode.id) {
                open_end = open_end.max(f.written_end().unwrap_or(0));
            }
            self.shared.cache_stamps.on_attrs(inode.id, inode.version);
        }
        to_attr(inode, open_end)
    }

    /// After a create, mknod, symlink, link or unlink in `dir`: its cached
    /// attributes get the change's times, or are dropped if it failed
    /// (it may have committed).
    fn entries_changed(&self, dir: InodeId, ok: bool) {
        if ok {
            self.shared.dir_attrs.touched(dir, ns_of(SystemTime::now()));
        } else {
            self.shared.dir_attrs.forget(dir);
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, r: FsResult<Inode>) {
        match r {
            Ok(inode) => reply.entry(&self.entry_ttl(), &self.attr_of(&inode), Generation(0)),
            Err(e) => reply.error(e.0),
        }
    }

    fn reply_attr(&self, reply: ReplyAttr, r: FsResult<Inode>) {
        match r {
            Ok(inode) => reply.attr(&self.attr_ttl(), &self.attr_of(&inode)),
            Err(e) => reply.error(e.0),
        }
    }

    async fn setattr(&self, inode: InodeId, a: SetAttrArgs) -> FsResult<Inode> {
        if let Some(size) = a.size {
            self.truncate(inode, size, a.fh).await?;
        }
        let change = SetAttr { mode: a.mode.map(|m| m & 0o7777), uid: a.uid, gid: a.gid, atime_ns: a.atime_ns, mtime_ns: a.mtime_ns };
        if change != SetAttr::default() {
            return self.meta().setattr(inode, change).await.map_err(|e| FsError::from(e).for_setattr());
        }
        Ok(self.meta().stat(inode).await?)
    }

    /// Truncates through the open handle `fh` if it is writable, else
    /// through a temporary write handle (close makes the length exact).
    async fn truncate(&self, inode: InodeId, size: u64, fh: Option<u64>) -> FsResult<()> {
        // No page read around before the truncate is stored after it.
        let _block = self.shared.store_gate.block(inode).await;
        // Buffered writes land first: none may re-extend the file after it.
        self.shared.settle_writers(inode).await;
        if let Some(file) = fh.and_then(|fh| self.shared.handles.file(fh).ok()).filter(|f| f.writable) {
            let guard = file.handle.read().await;
            let handle = guard.as_ref().ok_or(FsError(Errno::EBADF))?;
            handle.truncate(size).await?;
        } else {
            let handle = self.client.open_inode(inode, FskvOpenFlags { read: false, write: true, ..Default::default() }).await?;
            let result = handle.truncate(size).await;
            let closed = handle.close().await;
            result?;
            closed?;
        }
        self.refresh_writers(inode).await;
        Ok(())
    }

    /// Lets the other open writers of `inode` see a truncate (so their
    /// written end no longer props up the size this mount reports).
    async fn refresh_writers(&self, inode: InodeId) {
        for f in self.shared.handles.writers_of(inode) {
            let guard = f.handle.read().await;
            if let Some(h) = guard.as_ref() {
                if let Err(e) = h.refresh_len().await {
                    tracing::debug!(%inode, error = %e, "refreshing an open writer after truncate failed");
                }
            }
        }
    }

    /// Opens `inode`; also whether the kernel may keep its page cache of
    /// the file (unchanged since this mount's last open of it).
    async fn open(&self, inode: InodeId, flags: OpenFlags) -> FsResult<(u64, FopenFlags)> {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let truncate = write && flags.0 & libc::O_TRUNC != 0;
        let open_flags = FskvOpenFlags { read: true, write, truncate, ..Default::default() };
        let handle = self.client.open_inode(inode, open_flags).await?;
        let may_keep = self.shared.cfg.keep_page_cache && !truncate;
        let at_open = self.shared.cache_stamps.on_open(inode, handle.opened_version(), may_keep);
        if at_open.drop_attrs {
            // Before the reply: the caller's first stat or read after
            // open(2) asks meta for the size instead of using the old one.
            self.shared.invalidate_attributes(inode);
        }
        let keep = at_open.keep_pages;
        if !keep && !write {
            // The kernel drops the file's cache at this open's reply; no
            // page read around before it (perhaps of an older version) may
            // be stored after (a writer's open blocks in insert_handle).
            drop(self.shared.store_gate.block(inode).await);
        }
        let fh = self.insert_handle(inode, write, handle).await?;
        Ok((fh, if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() }))
    }

    async fn insert_handle(&self, inode: InodeId, writable: bool, handle: fskv_client::FileHandle) -> FsResult<u64> {
        let wb = if writable { self.shared.write_behind(u64::from(handle.layout().chunk_size_bytes)) } else { None };
        let file = OpenFile { inode, writable, handle: tokio::sync::RwLock::new(None), wb };
        let fh = self.shared.handles.insert_file(file);
        if writable && fh.is_ok() {
            // Registered as a writer first, so no new read-around starts;
            // stores already being made finish before the open returns (and
            // with it the first write), the others are cancelled. See
            // crate::readaround.
            drop(self.shared.store_gate.block(inode).await);
        }
        match fh {
            Ok(fh) => {
                if let Ok(f) = self.shared.handles.file(fh) {
                    *f.handle.write().await = Some(handle);
                }
                Ok(fh)
            }
            Err(e) => {
                if let Err(err) = handle.close().await {
                    tracing::warn!(%inode, error = %err, "closing a handle over the limit failed");
                }
                Err(e)
            }
        }
    }

    async fn create(&self, parent: InodeId, name: &str, mode: u32, flags: i32) -> FsResult<(Inode, u64)> {
        let exclusive = flags & libc::O_EXCL != 0;
        let handle = self.client.create_at(parent, name, mode & 0o7777, exclusive).await?;
        // The create's reply carries the attributes: no stat round trip.
        let inode = handle.opened_inode().clone();
        let fh = self.insert_handle(inode.id, true, handle).await?;
        Ok((inode, fh))
    }

    /// The bytes of a read, and the pages read around it for the kernel's
    /// cache (see [`crate::readaround`]; `direct`: opened `O_DIRECT`, never
    /// widened).
    async fn read(&self, fh: u64, offset: u64, size: u32, direct: bool) -> FsResult<(Bytes, Option<AroundPages>)> {
        let file = self.shared.handles.file(fh)?;
        // Read-your-writes inside the mount: buffered bytes land first.
        self.shared.settle_writers(file.inode).await;
        let guard = file.handle.read().await;
        let handle = guard.as_ref().ok_or(FsError(Errno::EBADF))?;
        let end = offset.saturating_add(u64::from(size));
        if end > handle.len() {
            // Writes by other handles show up once reported; look again.
            handle.refresh_len().await?;
            if end > handle.len() {
                // Writes of this mount's other handles that meta has not
                // heard of yet (read-your-writes inside the mount).
                let local = self.shared.handles.writers_of(file.inode).iter().filter_map(|f| f.written_end()).max();
                if let Some(local) = local {
                    handle.raise_len(local);
                }
            }
        }
        let window_bytes = if direct { 0 } else { u64::from(self.shared.cfg.read_around_bytes) };
        if let Some((start, end)) = crate::readaround::window(offset, size, handle.len(), window_bytes) {
            let shared = &self.shared;
            if let Some(ticket) = shared.store_gate.try_enter(file.inode, || shared.handles.has_writer(file.inode)) {
                let data = handle.read_at(start, end - start).await?;
                // `offset >= start`: the window starts at or before the read.
                let own_start = usize::try_from(offset - start).unwrap_or(usize::MAX).min(data.len());
                let own_end = own_start.saturating_add(size as usize).min(data.len());
                let own = data.slice(own_start..own_end);
                return Ok((own, Some(AroundPages { ticket, inode: file.inode, start, data, own: own_start..own_end })));
            }
        }
        Ok((handle.read_at(offset, u64::from(size)).await?, None))
    }

    async fn write(&self, fh: u64, offset: u64, data: Bytes) -> FsResult<u32> {
        let file = self.shared.handles.file(fh)?;
        let len = u32::try_from(data.len()).map_err(|_| FsError(Errno::EINVAL))?;
        if let Some(wb) = &file.wb {
            wb.write(&file, offset, data).await.map_err(FsError)?;
            return Ok(len);
        }
        let guard = file.handle.read().await;
        let handle = guard.as_ref().ok_or(FsError(Errno::EBADF))?;
        handle.write_at(offset, data).await?;
        Ok(len)
    }

    /// close(2)'s flush: writes out the buffer, then reports the written
    /// end to meta (the data is committed on every replica once its write
    /// returned), so other clients see it.
    async fn flush(&self, fh: u64) -> FsResult<()> {
        let file = self.shared.handles.file(fh)?;
        if !file.writable {
            return Ok(());
        }
        file.drain().await?;
        let guard = file.handle.read().await;
        let handle = guard.as_ref().ok_or(FsError(Errno::EBADF))?;
        Ok(handle.fsync().await?)
    }

    /// fsync(2): the flush, then meta's durability barrier (namespace
    /// changes are committed relaxed; this makes them, and the length just
    /// reported, durable).
    async fn fsync(&self, fh: u64) -> FsResult<()> {
        self.flush(fh).await?;
        self.sync_meta().await
    }

    async fn sync_meta(&self) -> FsResult<()> {
        if !self.shared.cfg.relaxed_metadata {
            return Ok(());
        }
        Ok(self.meta().sync().await?)
    }

    async fn release(&self, fh: u64) -> FsResult<()> {
        // A writer's buffered bytes may still be on their way to storage
        // when its handle leaves the table (and stops counting as a
        // writer): the file stays blocked for read-around until they are
        // there, else a window read meanwhile could store older bytes over
        // the kernel's newer pages (crate::readaround).
        let block = match self.shared.handles.file(fh) {
            Ok(f) if f.writable => Some(self.shared.store_gate.block(f.inode).await),
            _ => None,
        };
        let Some(file) = self.shared.handles.remove_file(fh) else { return Err(FsError(Errno::EBADF)) };
        let drained = file.drain().await;
        drop(block);
        forget_released(&self.shared, fh, &file);
        let closed = close_file(&file, self.shared.closes.as_ref()).await;
        drained.and(closed)
    }

    async fn opendir(&self, inode: InodeId) -> FsResult<u64> {
        if crate::usrbio::is_virtual(inode.0) {
            let u = self.shared.usrbio().ok_or(FsError(Errno::ENOENT))?;
            let entries = u.dir_entries(inode.0).map_err(FsError)?;
            let state = DirState { entries, more: false, ..Default::default() };
            return self.shared.handles.insert_dir(OpenDir { inode, state: tokio::sync::Mutex::new(state) });
        }
        let dir = self.meta().stat(inode).await?;
        let InodeData::Directory(d) = &dir.data else { return Err(FsError(Errno::ENOTDIR)) };
        let mut state = DirState { more: true, ..Default::default() };
        let parent = d.parent;
        // readdirplus: the kernel ignores the attributes of "." and "..".
        let attr = Some(Box::new(dir.clone()));
        state.entries.push(ListedEntry { name: ".".into(), inode, kind: fuser::FileType::Directory, attr: attr.clone() });
        state.entries.push(ListedEntry { name: "..".into(), inode: parent, kind: fuser::FileType::Directory, attr });
        let open = OpenDir { inode, state: tokio::sync::Mutex::new(state) };
        self.shared.handles.insert_dir(open)
    }

    /// Fills `reply` from entry index `offset` on, reading pages from meta
    /// (`start_after` the last name read) as needed.
    async fn readdir(&self, fh: u64, offset: u64, mut reply: ReplyDirectory) {
        let dir = match self.shared.handles.dir(fh) {
            Ok(d) => d,
            Err(e) => return reply.error(e.0),
        };
        let mut state = dir.state.lock().await;
        let mut index = usize::try_from(offset).unwrap_or(usize::MAX);
        loop {
            while index >= state.entries.len() && state.more {
                if let Err(e) = self.read_dir_page(dir.inode, &mut state).await {
                    return reply.error(e.0);
                }
            }
            let Some(entry) = state.entries.get(index) else { break };
            if reply.add(INodeNo(entry.inode.0), index as u64 + 1, entry.kind, &entry.name) {
                break;
            }
            index += 1;
        }
        reply.ok();
    }

    /// readdirplus: like readdir, each entry with its attributes (meta lists
    /// them in the same page), so `ls -l` and `find` need no lookup per
    /// entry.
    async fn readdirplus(&self, fh: u64, offset: u64, mut reply: fuser::ReplyDirectoryPlus) {
        let dir = match self.shared.handles.dir(fh) {
            Ok(d) => d,
            Err(e) => return reply.error(e.0),
        };
        let mut state = dir.state.lock().await;
        let mut index = usize::try_from(offset).unwrap_or(usize::MAX);
        let ttl = self.entry_ttl();
        loop {
            while index >= state.entries.len() && state.more {
                if let Err(e) = self.read_dir_page(dir.inode, &mut state).await {
                    return reply.error(e.0);
                }
            }
            let Some(entry) = state.entries.get(index) else { break };
            let attr = match &entry.attr {
                Some(inode) => self.attr_of(inode),
                None => match self.shared.usrbio().map(|u| u.getattr(entry.inode.0)) {
                    Some(Ok(a)) => a,
                    _ => match self.meta().stat(entry.inode).await {
                        Ok(inode) => self.attr_of(&inode),
                        Err(e) => return reply.error(FsError::from(e).0),
                    },
                },
            };
            if reply.add(INodeNo(entry.inode.0), index as u64 + 1, &entry.name, &ttl, &attr, Generation(0)) {
                break;
            }
            index += 1;
        }
        reply.ok();
    }

    async fn read_dir_page(&self, dir: InodeId, state: &mut DirState) -> FsResult<()> {
        let limit = self.shared.cfg.readdir_page_entries;
        let (entries, more) = self.meta().readdir(dir, &state.last_name, limit, true).await?;
        if let Some(last) = entries.last() {
            state.last_name = last.name.clone();
        }
        state.more = more && !entries.is_empty();
        tracing::trace!(%dir, n = entries.len(), more, "readdir page");
        state.entries.extend(entries.into_iter().map(|e| ListedEntry {
            name: e.name,
            inode: e.inode,
            kind: crate::attr::file_type(e.kind),
            attr: e.attr.map(Box::new),
        }));
        Ok(())
    }

    async fn rename(&self, parent: InodeId, name: &str, new_parent: InodeId, new_name: &str, flags: RenameFlags) -> FsResult<()> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) || flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return Err(FsError(Errno::EINVAL));
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            // Not atomic with the rename: a racing create can still be replaced.
            match self.meta().lookup(new_parent, new_name).await {
                Ok(_) => return Err(FsError(Errno::EEXIST)),
                Err(e) if FsError::from(e.clone()).0 == Errno::ENOENT => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(self.meta().rename(parent, name, new_parent, new_name).await?)
    }

    async fn statfs(&self, reply: ReplyStatfs) {
        match self.meta().statfs().await {
            Ok(s) => {
                let blocks = s.capacity_bytes / STATFS_BLOCK_BYTES;
                let free = s.capacity_bytes.saturating_sub(s.used_bytes) / STATFS_BLOCK_BYTES;
                let bsize = STATFS_BLOCK_BYTES as u32;
                let name_max = fskv_proto::meta::MAX_NAME_BYTES as u32;
                reply.statfs(blocks, free, free, s.inodes + STATFS_FREE_INODES, STATFS_FREE_INODES, bsize, name_max, bsize);
            }
            Err(e) => reply.error(FsError::from(e).0),
        }
    }

    async fn setxattr(&self, inode: InodeId, name: &str, value: Vec<u8>, flags: i32) -> FsResult<()> {
        let flag = if flags & libc::XATTR_CREATE != 0 {
            XattrFlag::Create
        } else if flags & libc::XATTR_REPLACE != 0 {
            XattrFlag::Replace
        } else {
            XattrFlag::Any
        };
        self.meta().set_xattr(inode, name, &value, flag).await.map_err(|e| FsError::from(e).for_xattr())
    }
}

/// What a release undoes besides the close: the handle's USRBIO
/// registration, and for a writable handle what this mount cached of the
/// file (the close moves the inode's version, so those cache stamps would
/// not be compared with other writers' data).
fn forget_released(shared: &Shared, fh: u64, file: &OpenFile) {
    if let Some(u) = shared.usrbio() {
        u.forget_file(fh);
    }
    if file.writable {
        shared.cache_stamps.forget(file.inode);
    }
}

/// Hands the close of a handle that never wrote to `queue` (see
/// [`crate::closes`]); any other handle, or any handle without a queue,
/// comes back to be closed with [`close_handle`].
fn queue_quiet_close(handle: fskv_client::FileHandle, queue: Option<&crate::closes::CloseQueue>) -> Option<fskv_client::FileHandle> {
    let Some(queue) = queue else { return Some(handle) };
    match handle.into_quiet_close() {
        Ok(quiet) => {
            queue.push(quiet);
            None
        }
        Err(handle) => Some(handle),
    }
}

async fn close_handle(inode: InodeId, handle: fskv_client::FileHandle) -> FsResult<()> {
    handle.close().await.map(|len| tracing::debug!(%inode, len, "closed")).map_err(FsError::from)
}

/// Closes an open file after its in-flight calls finish; with a `queue`, a
/// handle that never wrote leaves its close to it.
pub(crate) async fn close_file(file: &OpenFile, queue: Option<&crate::closes::CloseQueue>) -> FsResult<()> {
    let Some(handle) = file.handle.write().await.take() else { return Ok(()) };
    match queue_quiet_close(handle, queue) {
        Some(handle) => close_handle(file.inode, handle).await,
        None => Ok(()),
    }
}

/// Replies to an xattr read: the size when asked for it, ERANGE when the
/// caller's buffer is too small.
fn reply_xattr(reply: ReplyXattr, size: u32, data: FsResult<Vec<u8>>) {
    match data {
        Err(e) => reply.error(e.0),
        Ok(d) if size == 0 => reply.size(u32::try_from(d.len()).unwrap_or(u32::MAX)),
        Ok(d) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(d) => reply.data(&d),
    }
}

/// The arguments of one setattr call.
struct SetAttrArgs {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime_ns: Option<u64>,
    mtime_ns: Option<u64>,
    fh: Option<u64>,
}

impl Filesystem for FskvFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_write(self.shared.cfg.max_write_bytes) {
            tracing::info!(max, "kernel caps max_write");
            let _ = config.set_max_write(max);
        }
        if self.shared.cfg.keep_page_cache {
            // The kernel drops a file's cached pages when a getattr shows a
            // new mtime or size (another client's change seen while open).
            if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_AUTO_INVAL_DATA) {
                tracing::info!(?missing, "kernel lacks FUSE_AUTO_INVAL_DATA; cached pages refresh at open only");
            }
        }
        // O_DIRECT reads and writes through AIO (libaio, io_uring) stay
        // asynchronous: the kernel sends their requests without waiting for
        // each to finish (the mount serves requests concurrently anyway).
        if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO) {
            tracing::info!(?missing, "kernel lacks FUSE_ASYNC_DIO; asynchronous direct I/O is served one request at a time");
        }
        // `ls -l`, `find`, `du`: entries come with their attributes.
        if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_DO_READDIRPLUS) {
            tracing::info!(?missing, "kernel lacks readdirplus; listings look entries up one by one");
        }
        if let Err(max) = config.set_max_readahead(self.shared.cfg.max_readahead_bytes) {
            let _ = config.set_max_readahead(max);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        let shared = self.shared.clone();
        let files = shared.handles.drain_files();
        if !files.is_empty() {
            tracing::info!(n = files.len(), "closing files still open at unmount");
        }
        self.rt.block_on(async move {
            for f in files {
                if let Err(e) = f.drain().await {
                    tracing::warn!(inode = %f.inode, error = ?e, "buffered writes failed at unmount");
                }
                if let Err(e) = close_file(&f, None).await {
                    tracing::warn!(inode = %f.inode, error = ?e, "close at unmount failed");
                }
            }
            // Closes released before the unmount and still waiting for their batch.
            if let Some(queue) = &shared.closes {
                queue.flush().await;
            }
        });
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if let Some(u) = self.virt(parent, Some(name)) {
            return self.reply_virt_entry(reply, u.lookup(parent.0, name));
        }
        let (ctx, name) = (self.ctx(req), name_str(name));
        self.spawn("lookup", tracing::debug_span!("lookup", parent = parent.0), async move {
            let r = match name {
                Ok(n) => ctx.meta().lookup(ino(parent), &n).await.map_err(FsError::from),
                Err(e) => Err(e),
            };
            ctx.reply_entry(reply, r);
        });
    }

    fn getattr(&self, req: &Request, i: INodeNo, _fh: Option<Fh>, reply: ReplyAttr) {
        if let Some(u) = self.virt(i, None) {
            return match u.getattr(i.0) {
                Ok(attr) => reply.attr(&self.virt_ttl(&attr), &attr),
                Err(e) => reply.error(e),
            };
        }
        if let Some((inode, ttl)) = self.shared.dir_attrs.get(ino(i)) {
            return reply.attr(&ttl, &to_attr(&inode, 0));
        }
        let ctx = self.ctx(req);
        self.spawn("getattr", tracing::debug_span!("getattr", inode = i.0), async move {
            let epoch = ctx.shared.dir_attrs.epoch();
            let r = ctx.meta().stat(ino(i)).await.map_err(FsError::from);
            if let Ok(inode) = &r {
                ctx.shared.dir_attrs.note(inode, epoch);
            }
            ctx.reply_attr(reply, r);
        });
    }

    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<Fh>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if self.virt(i, None).is_some() {
            return reply.error(Errno::EPERM);
        }
        let ctx = self.ctx(req);
        let args =
            SetAttrArgs { mode, uid, gid, size, atime_ns: atime.map(to_time_ns), mtime_ns: mtime.map(to_time_ns), fh: fh.map(|f| f.0) };
        self.spawn("setattr", tracing::debug_span!("setattr", inode = i.0), async move {
            let r = ctx.setattr(ino(i), args).await;
            // After the change: a getattr that read before it is not kept.
            ctx.shared.dir_attrs.forget(ino(i));
            ctx.reply_attr(reply, r);
        });
    }

    fn readlink(&self, req: &Request, i: INodeNo, reply: ReplyData) {
        if let Some(u) = self.virt(i, None) {
            return match u.readlink(i.0) {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(e),
            };
        }
        let ctx = self.ctx(req);
        self.spawn("readlink", tracing::debug_span!("readlink", inode = i.0), async move {
            match ctx.meta().readlink(ino(i)).await {
                Ok(t) => reply.data(t.as_bytes()),
                Err(e) => reply.error(FsError::from(e).0),
            }
        });
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        if self.virt(parent, Some(name)).is_some() {
            return reply.error(if is_reserved(parent, name) { Errno::EEXIST } else { Errno::EPERM });
        }
        let Ok(special) = special_kind_of_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        let (ctx, name) = (self.ctx(req), name_str(name));
        self.spawn("mknod", tracing::debug_span!("mknod", parent = parent.0), async move {
            let perm = mode & !umask & 0o7777;
            let r = match (name, special) {
                (Ok(n), None) => ctx.meta().create(ino(parent), &n, perm, true).await.map_err(FsError::from),
                (Ok(n), Some(kind)) => ctx.meta().mknod(ino(parent), &n, perm, kind, u64::from(rdev)).await.map_err(FsError::from),
                (Err(e), _) => Err(e),
            };
            ctx.entries_changed(ino(parent), r.is_ok());
            ctx.reply_entry(reply, r);
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        if self.virt(parent, Some(name)).is_some() {
            return reply.error(if is_reserved(parent, name) { Errno::EEXIST } else { Errno::EPERM });
        }
        let (ctx, name) = (self.ctx(req), name_str(name));
        self.spawn("mkdir", tracing::debug_span!("mkdir", parent = parent.0), async move {
            let r = match name {
                Ok(n) => ctx.meta().mkdir(ino(parent), &n, mode & !umask & 0o7777).await.map_err(FsError::from),
                Err(e) => Err(e),
            };
            ctx.shared.dir_attrs.clear();
            ctx.reply_entry(reply, r);
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if let Some(u) = self.virt(parent, Some(name)) {
            return match u.unlink(caller(req), parent.0, name) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        let (ctx, name) = (self.ctx(req), name_str(name));
        self.spawn("unlink", tracing::debug_span!("unlink", parent = parent.0), async move {
            let r = match name {
                Ok(n) => ctx.meta().unlink(ino(parent), &n).await.map_err(FsError::from),
                Err(e) => Err(e),
            };
            ctx.entries_changed(ino(parent), r.is_ok());
            reply_empty(reply, r);
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self.virt(parent, Some(name)).is_some() {
            return reply.error(Errno::EPERM);
        }
        let (ctx, name) = (self.ctx(req), name_str(name));
        self.spawn("rmdir", tracing::debug_span!("rmdir", parent = parent.0), async move {
            let r = match name {
                Ok(n) => ctx.meta().rmdir(ino(parent), &n).await.map_err(FsError::from),
                Err(e) => Err(e),
            };
            ctx.shared.dir_attrs.clear();
            reply_empty(reply, r);
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        if let Some(u) = self.virt(parent, Some(link_name)) {
            if is_reserved(parent, link_name) {
                return reply.error(Errno::EEXIST);
            }
            let r = u.symlink(caller(req), parent.0, link_name, target);
            return self.reply_virt_entry(reply, r);
        }
        let (ctx, name, target) = (self.ctx(req), name_str(link_name), name_str(target.as_os_str()));
        self.spawn("symlink", tracing::debug_span!("symlink", parent = parent.0), async move {
            let r = match (name, target) {
                (Ok(n), Ok(t)) => ctx.meta().symlink(ino(parent), &n, &t).await.map_err(FsError::from),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            ctx.entries_changed(ino(parent), r.is_ok());
            ctx.reply_entry(reply, r);
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if self.virt(parent, Some(name)).is_some() || self.virt(newparent, Some(newname)).is_some() {
            return reply.error(Errno::EPERM);
        }
        let (ctx, name, newname) = (self.ctx(req), name_str(name), name_str(newname));
        self.spawn("rename", tracing::debug_span!("rename", parent = parent.0, newparent = newparent.0), async move {
            let r = match (name, newname) {
                (Ok(n), Ok(nn)) => ctx.rename(ino(parent), &n, ino(newparent), &nn, flags).await,
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            ctx.shared.dir_attrs.clear();
            reply_empty(reply, r);
        });
    }

    fn link(&self, req: &Request, i: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        if self.virt(i, None).is_some() || self.virt(newparent, Some(newname)).is_some() {
            return reply.error(Errno::EPERM);
        }
        let (ctx, name) = (self.ctx(req), name_str(newname));
        self.spawn("link", tracing::debug_span!("link", inode = i.0, newparent = newparent.0), async move {
            let r = match name {
                Ok(n) => ctx.meta().link(ino(i), ino(newparent), &n).await.map_err(FsError::from),
                Err(e) => Err(e),
            };
            ctx.entries_changed(ino(newparent), r.is_ok());
            ctx.reply_entry(reply, r);
        });
    }

    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.virt(i, None).is_some() {
            return reply.error(Errno::EPERM);
        }
        let ctx = self.ctx(req);
        self.spawn("open", tracing::debug_span!("open", inode = i.0), async move {
            match ctx.open(ino(i), flags).await {
                Ok((fh, cache)) => reply.opened(Fh(fh), cache),
                Err(e) => reply.error(e.0),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let ctx = self.ctx(req);
        self.spawn("read", tracing::debug_span!("read", inode = i.0, offset, size), async move {
            match ctx.read(fh.0, offset, size, flags.0 & libc::O_DIRECT != 0).await {
                Ok((data, around)) => {
                    reply.data(&data);
                    if let Some(around) = around {
                        ctx.shared.store_around(around);
                    }
                }
                Err(e) => reply.error(e.0),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut data = Bytes::copy_from_slice(data);
        // Fast path: a buffered write is answered from this thread.
        if let Ok(file) = self.shared.handles.file(fh.0) {
            if let Some(wb) = &file.wb {
                let len = data.len() as u32;
                let _rt = self.rt.enter();
                match wb.try_write(&file, offset, data) {
                    crate::writeback::TryWrite::Done => {
                        self.shared.metrics.buffered_write(u64::from(len));
                        return reply.written(len);
                    }
                    crate::writeback::TryWrite::Failed(e) => return reply.error(e),
                    crate::writeback::TryWrite::BufferedOverBudget => {
                        let wb = wb.clone();
                        return self.spawn("write_wait", tracing::debug_span!("write_wait", inode = i.0), async move {
                            wb.wait_for_room().await;
                            reply.written(len);
                        });
                    }
                    crate::writeback::TryWrite::NoBudget(d) => data = d,
                }
            }
        }
        let ctx = self.ctx(req);
        self.spawn("write", tracing::debug_span!("write", inode = i.0, offset, len = data.len()), async move {
            match ctx.write(fh.0, offset, data).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e.0),
            }
        });
    }

    fn flush(&self, req: &Request, i: INodeNo, fh: Fh, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Most closes of files read or never written: answered here, without
        // the hand-off to a tokio worker.
        if self.shared.handles.file(fh.0).is_ok_and(|f| f.flush_is_noop()) {
            let _timer = crate::metrics::OpTimer::start(&self.shared.metrics, "flush");
            return reply.ok();
        }
        let ctx = self.ctx(req);
        self.spawn("flush", tracing::debug_span!("flush", inode = i.0), async move {
            let r = ctx.flush(fh.0).await;
            reply_empty(reply, r);
        });
    }

    fn release(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if self.release_now(fh.0) {
            let _timer = crate::metrics::OpTimer::start(&self.shared.metrics, "release");
            return reply.ok();
        }
        let ctx = self.ctx(req);
        self.spawn("release", tracing::debug_span!("release", inode = i.0), async move {
            let r = ctx.release(fh.0).await;
            if let Err(e) = &r {
                tracing::warn!(error = ?e, "close failed");
            }
            reply_empty(reply, r);
        });
    }

    fn fsync(&self, req: &Request, i: INodeNo, fh: Fh, _datasync: bool, reply: ReplyEmpty) {
        let ctx = self.ctx(req);
        self.spawn("fsync", tracing::debug_span!("fsync", inode = i.0), async move {
            let r = ctx.fsync(fh.0).await;
            reply_empty(reply, r);
        });
    }

    fn opendir(&self, req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let ctx = self.ctx(req);
        self.spawn("opendir", tracing::debug_span!("opendir", inode = i.0), async move {
            match ctx.opendir(ino(i)).await {
                Ok(fh) => reply.opened(Fh(fh), FopenFlags::empty()),
                Err(e) => reply.error(e.0),
            }
        });
    }

    fn readdir(&self, req: &Request, i: INodeNo, fh: Fh, offset: u64, reply: ReplyDirectory) {
        let ctx = self.ctx(req);
        self.spawn("readdir", tracing::debug_span!("readdir", inode = i.0, offset), async move {
            ctx.readdir(fh.0, offset, reply).await;
        });
    }

    fn readdirplus(&self, req: &Request, i: INodeNo, fh: Fh, offset: u64, reply: fuser::ReplyDirectoryPlus) {
        let ctx = self.ctx(req);
        self.spawn("readdirplus", tracing::debug_span!("readdirplus", inode = i.0, offset), async move {
            ctx.readdirplus(fh.0, offset, reply).await;
        });
    }

    fn releasedir(&self, _req: &Request, _i: INodeNo, fh: Fh, _flags: OpenFlags, reply: ReplyEmpty) {
        self.shared.handles.remove_dir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, i: INodeNo, _fh: Fh, _datasync: bool, reply: ReplyEmpty) {
        // Namespace changes are committed relaxed: the barrier makes every
        // change acknowledged so far durable.
        let ctx = self.ctx(req);
        self.spawn("fsyncdir", tracing::debug_span!("fsyncdir", inode = i.0), async move {
            let r = ctx.sync_meta().await;
            reply_empty(reply, r);
        });
    }

    fn statfs(&self, req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        let ctx = self.ctx(req);
        self.spawn("statfs", tracing::debug_span!("statfs"), async move { ctx.statfs(reply).await });
    }

    fn setxattr(&self, req: &Request, i: INodeNo, name: &OsStr, value: &[u8], flags: i32, _position: u32, reply: ReplyEmpty) {
        if self.virt(i, None).is_some() {
            return reply.error(Errno::EPERM);
        }
        if crate::handles::is_acl_xattr(name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        self.shared.absent_xattrs.forget(ino(i));
        self.shared.dir_attrs.forget(ino(i));
        let (ctx, name, value) = (self.ctx(req), name_str(name), value.to_vec());
        self.spawn("setxattr", tracing::debug_span!("setxattr", inode = i.0), async move {
            let r = match name {
                Ok(n) => ctx.setxattr(ino(i), &n, value, flags).await,
                Err(e) => Err(e),
            };
            ctx.shared.dir_attrs.forget(ino(i));
            reply_empty(reply, r);
        });
    }

    fn getxattr(&self, req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if self.virt(i, None).is_some() {
            return reply.error(Errno::ENODATA);
        }
        if crate::handles::is_acl_xattr(name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let probed = crate::handles::probed_xattr(name);
        if probed.is_some_and(|w| self.shared.absent_xattrs.known_absent(ino(i), w)) {
            return reply.error(Errno::ENODATA);
        }
        let (ctx, name) = (self.ctx(req), name_str(name));
        self.spawn("getxattr", tracing::debug_span!("getxattr", inode = i.0), async move {
            let r = match name {
                Ok(n) => ctx.meta().get_xattr(ino(i), &n).await.map_err(|e| FsError::from(e).for_xattr()),
                Err(e) => Err(e),
            };
            if let (Some(w), Err(FsError(Errno::ENODATA))) = (probed, &r) {
                ctx.shared.absent_xattrs.note_absent(ino(i), w);
            }
            reply_xattr(reply, size, r);
        });
    }

    fn listxattr(&self, req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        if self.virt(i, None).is_some() {
            return reply_xattr(reply, size, Ok(Vec::new()));
        }
        let ctx = self.ctx(req);
        self.spawn("listxattr", tracing::debug_span!("listxattr", inode = i.0), async move {
            let r = ctx.meta().list_xattr(ino(i)).await.map_err(FsError::from).map(|names| {
                let mut out = Vec::new();
                for n in names {
                    out.extend_from_slice(n.as_bytes());
                    out.push(0);
                }
                out
            });
            reply_xattr(reply, size, r);
        });
    }

    fn removexattr(&self, req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self.virt(i, None).is_some() {
            return reply.error(Errno::EPERM);
        }
        self.shared.absent_xattrs.forget(ino(i));
        self.shared.dir_attrs.forget(ino(i));
        let (ctx, name) = (self.ctx(req), name_str(name));
        self.spawn("removexattr", tracing::debug_span!("removexattr", inode = i.0), async move {
            let r = match name {
                Ok(n) => ctx.meta().remove_xattr(ino(i), &n).await.map_err(|e| FsError::from(e).for_xattr()),
                Err(e) => Err(e),
            };
            ctx.shared.dir_attrs.forget(ino(i));
            reply_empty(reply, r);
        });
    }

    fn access(&self, _req: &Request, _i: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Mounted with `default_permissions`: the kernel checks mode bits.
        reply.ok();
    }

    fn ioctl(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        use fskv_usrbio::proto::{HF3FS_SUPER_MAGIC, IOC_DEREG_FD, IOC_GET_MAGIC, IOC_REG_FD};
        let Some(u) = self.shared.usrbio().cloned() else { return reply.error(Errno::ENOTTY) };
        match cmd {
            IOC_GET_MAGIC if out_size >= 4 => reply.ioctl(0, &HF3FS_SUPER_MAGIC.to_ne_bytes()),
            IOC_REG_FD if out_size as usize >= std::mem::size_of::<fskv_usrbio::proto::RegFdReply>() => {
                if self.shared.handles.file(fh.0).is_err() {
                    return reply.error(Errno::EBADF);
                }
                match u.register_file(caller(req), i.0, fh.0) {
                    Ok(r) => {
                        let mut out = Vec::with_capacity(24);
                        out.extend_from_slice(&r.magic.to_ne_bytes());
                        out.extend_from_slice(&r.flags.to_ne_bytes());
                        out.extend_from_slice(&r.inode.to_ne_bytes());
                        out.extend_from_slice(&r.file.to_ne_bytes());
                        reply.ioctl(0, &out)
                    }
                    Err(e) => reply.error(e),
                }
            }
            IOC_DEREG_FD if out_size >= 4 => {
                u.deregister_file(caller(req), fh.0);
                reply.ioctl(0, &HF3FS_SUPER_MAGIC.to_ne_bytes())
            }
            _ => reply.error(Errno::ENOTTY),
        }
    }

    fn create(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        if self.virt(parent, Some(name)).is_some() {
            return reply.error(if is_reserved(parent, name) { Errno::EEXIST } else { Errno::EPERM });
        }
        let (ctx, name) = (self.ctx(req), name_str(name));
        self.spawn("create", tracing::debug_span!("create", parent = parent.0), async move {
            let r = match name {
                Ok(n) => ctx.create(ino(parent), &n, mode & !umask, flags).await,
                Err(e) => Err(e),
            };
            ctx.entries_changed(ino(parent), r.is_ok());
            match r {
                Ok((inode, fh)) => {
                    // A file this mount just made has no xattrs: the
                    // capability probe before its first write is answered here.
                    ctx.shared.absent_xattrs.note_new_inode(inode.id);
                    reply.created(&ctx.entry_ttl(), &ctx.attr_of(&inode), Generation(0), Fh(fh), FopenFlags::empty())
                }
                Err(e) => reply.error(e.0),
            }
        });
    }
}

fn reply_empty(reply: ReplyEmpty, r: FsResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e.0),
    }
}

/// `FUSE_NOTIFY_INVAL_INODE`: the kernel drops `inode`'s cached attributes
/// and, for `offset >= 0`, its pages in `offset..offset + len` (0 = to the
/// end). ENOENT (no cached inode: nothing to drop) is not an error.
fn notify_inval_inode(notifier: &fuser::Notifier, inode: u64, offset: i64, len: i64) {
    if let Err(e) = notifier.inval_inode(INodeNo(inode), offset, len) {
        if e.raw_os_error() != Some(libc::ENOENT) {
            tracing::debug!(inode, error = %e, "cache invalidation failed");
        }
    }
}
