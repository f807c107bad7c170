//! `fskv-fuse`: the FUSE mount of 3FS-KV, a [`fuser::Filesystem`] over the
//! native client ([`fskv_client::FsClient`]).
//!
//! * [`fs`]: the filesystem; every callback spawns its work on tokio and
//!   replies from the task (the mount serves many requests at once).
//! * [`errno`]: the one mapping from fskv error codes to errno values.
//! * [`handles`]: open file / directory handles keyed by the kernel's `fh`.
//! * [`attr`]: inode → `FileAttr`.
//! * [`writeback`]: write-behind buffering of small writes per open file.
//! * [`metrics`]: per-operation counts and latencies (Prometheus).
//! * [`usrbio`]: USRBIO — the virtual directory `3fs-virt/iovs/`, iov, ring
//!   and file registration, the ring dispatcher, cleanup after a program dies.
//!
//! Inode numbers are fskv inode ids (the root, 1, is `FUSE_ROOT_ID`).
//! See `docs/fuse.md` for the supported operations, caching and limits.

pub mod attr;
pub mod closes;
pub mod errno;
pub mod fs;
pub mod handles;
pub mod metrics;
pub mod readaround;
pub mod start;
pub mod usrbio;
pub mod writeback;

/// One step of a seeded xorshift64 (`state` must not be 0): the unit
/// tests' reproducible pseudo-random numbers.
#[cfg(test)]
pub(crate) fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

use fskv_client::FsClient;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Limits and timeouts of one mount; units are in the names.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// How long the kernel caches attributes (getattr replies).
    pub attr_ttl_ms: u64,
    /// How long the kernel caches name → inode entries (lookup replies).
    pub entry_ttl_ms: u64,
    /// Open files + directories at once; more opens fail with EMFILE.
    pub max_open_handles: usize,
    /// Largest write the kernel sends in one request.
    pub max_write_bytes: u32,
    /// Kernel readahead window of the mount: offered at FUSE init and
    /// written to the mount's `/sys/class/bdi/MAJ:MIN/read_ahead_kb` once
    /// mounted (the kernel starts a FUSE mount at 128 KiB whatever init
    /// says; see [`set_read_ahead`]). Sequential reads keep this much in
    /// flight as requests of up to `max_pages` (1 MiB).
    pub max_readahead_bytes: u32,
    /// A small read that misses the page cache reads this aligned window
    /// around it and gives the kernel the rest as cached pages (a power of
    /// two; 0 = off). See [`readaround`].
    pub read_around_bytes: u32,
    /// Entries per readdir page asked of meta.
    pub readdir_page_entries: u32,
    /// Threads reading requests from /dev/fuse (work runs on tokio).
    pub reader_threads: usize,
    /// Let other users (and root) use the mount (`allow_other`).
    pub allow_other: bool,
    /// Keep the kernel's page cache of a file across opens while its inode
    /// version is unchanged (close-to-open consistency); off = drop it at
    /// every open.
    pub keep_page_cache: bool,
    /// Files whose last-open version the mount remembers (for the above).
    pub max_cache_stamps: usize,
    /// USRBIO limits; `None` turns USRBIO off (no `3fs-virt`).
    pub usrbio: Option<usrbio::UsrbioConfig>,
    /// Write-behind run size cap (runs are the file's chunk size, at most
    /// this); 0 turns buffering off: every write goes to storage before it
    /// returns. See [`writeback`].
    pub write_buffer_bytes: u64,
    /// A partial run is flushed this long after its first byte.
    pub write_flush_delay_ms: u64,
    /// Buffered + in-flight bytes of one open file before writes wait.
    pub max_dirty_bytes_per_file: u64,
    /// Background flushes of one open file at once.
    pub max_flushes_in_flight_per_file: usize,
    /// Buffered + in-flight bytes of all open files together (at least
    /// `max_write_bytes`, so any one write fits).
    pub max_dirty_bytes_total: u64,
    /// Namespace changes (create, mkdir, rename, close, …) are acknowledged
    /// before meta fsyncs them; fsync(2) / fsyncdir(2) are the barrier.
    /// Off: every change is fsync'ed before its reply.
    pub relaxed_metadata: bool,
    /// Where the mount registers its metrics ([`metrics`]); `None`: a
    /// private registry nobody reads.
    pub metrics: Option<Arc<fskv_rpc::MetricsRegistry>>,
    /// Closes of never-written handles wait this long for others to share
    /// one meta request ([`closes`]); 0 sends each close at its release.
    pub close_batch_delay_ms: u64,
    /// Closes in one such request.
    pub max_close_batch: usize,
    /// Closes waiting at once; a release past it sends its own close.
    pub max_queued_closes: usize,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            attr_ttl_ms: 1_000,
            entry_ttl_ms: 1_000,
            max_open_handles: 65_536,
            max_write_bytes: 1 << 20,
            max_readahead_bytes: 4 << 20,
            read_around_bytes: 32 << 10,
            readdir_page_entries: 256,
            reader_threads: 2,
            allow_other: true,
            keep_page_cache: true,
            max_cache_stamps: 1 << 20,
            usrbio: Some(usrbio::UsrbioConfig::default()),
            write_buffer_bytes: 4 << 20,
            write_flush_delay_ms: 50,
            max_dirty_bytes_per_file: 8 << 20,
            max_flushes_in_flight_per_file: 4,
            max_dirty_bytes_total: 256 << 20,
            relaxed_metadata: true,
            metrics: None,
            close_batch_delay_ms: 2,
            max_close_batch: 256,
            max_queued_closes: 4096,
        }
    }
}

fn fuser_config(cfg: &MountConfig) -> fuser::Config {
    let mut c = fuser::Config::default();
    c.mount_options =
        vec![fuser::MountOption::FSName("fskv".into()), fuser::MountOption::Subtype("fskv".into()), fuser::MountOption::DefaultPermissions];
    c.acl = if cfg.allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    c.n_threads = Some(cfg.reader_threads.max(1));
    c
}

/// Mounts `client` at `mountpoint`, serves until `shutdown` completes (or
/// the mount goes away, e.g. `umount`), then unmounts. `on_mounted` runs
/// once the kernel handshake is done. Must be called inside a tokio runtime.
pub async fn serve<S, M>(client: FsClient, mountpoint: &Path, cfg: MountConfig, on_mounted: M, shutdown: S) -> std::io::Result<()>
where
    S: Future<Output = ()>,
    M: FnOnce(),
{
    let rt = tokio::runtime::Handle::current();
    let client = if cfg.relaxed_metadata { client.with_relaxed_metadata() } else { client };
    let registry = cfg.metrics.clone().unwrap_or_else(fskv_rpc::MetricsRegistry::new);
    let closes = (cfg.close_batch_delay_ms > 0).then(|| {
        let limits = closes::CloseQueueLimits {
            close_batch_delay_ms: cfg.close_batch_delay_ms,
            max_close_batch: cfg.max_close_batch,
            max_queued_closes: cfg.max_queued_closes,
        };
        closes::CloseQueue::start(client.meta().clone(), limits)
    });
    let shared = Arc::new(fs::Shared {
        metrics: metrics::FuseMetrics::register(&registry),
        closes,
        client,
        handles: handles::HandleTable::new(cfg.max_open_handles),
        cache_stamps: handles::CacheStamps::new(cfg.max_cache_stamps),
        absent_xattrs: handles::AbsentXattrCache::new(cfg.attr_ttl_ms, cfg.max_cache_stamps),
        dir_attrs: handles::DirAttrCache::new(cfg.attr_ttl_ms, cfg.max_cache_stamps),
        cfg: cfg.clone(),
        usrbio: std::sync::OnceLock::new(),
        notifier: std::sync::OnceLock::new(),
        store_gate: readaround::StoreGate::new(),
        dirty_files: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        dirty_budget: Arc::new(tokio::sync::Semaphore::new(
            usize::try_from(cfg.max_dirty_bytes_total.max(u64::from(cfg.max_write_bytes)))
                .unwrap_or(usize::MAX >> 4)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        )),
    });
    let filesystem = fs::FskvFs::new(shared.clone(), rt.clone());
    let options = fuser_config(&cfg);
    let path: PathBuf = mountpoint.to_path_buf();
    // Resolved before mounting: afterwards a lookup of the mount point
    // would wait for this daemon.
    let resolved = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| path.clone());
    // The handshake blocks on /dev/fuse; keep it off the async workers.
    let mut session =
        tokio::task::spawn_blocking(move || fuser::Session::new(filesystem, &path, &options)).await.map_err(std::io::Error::other)??;
    let mut unmounter = session.unmount_callable();
    match set_read_ahead(&resolved, cfg.max_readahead_bytes) {
        Ok(kb) => tracing::info!(read_ahead_kb = kb, "kernel readahead window set"),
        Err(e) => tracing::info!(error = %e, "kernel readahead window left at the kernel's default (128 KiB)"),
    }
    let _ = shared.notifier.set(session.notifier());
    if let Some(ucfg) = cfg.usrbio.clone() {
        match usrbio::Server::start(ucfg, rt.clone(), Arc::downgrade(&shared)) {
            Ok(server) => {
                let _ = shared.usrbio.set(server);
            }
            Err(e) => tracing::warn!(error = %e, "usrbio could not start (no /dev/shm?); the mount serves without it"),
        }
    }
    tracing::info!(mountpoint = %mountpoint.display(), "mounted");
    on_mounted();
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    let runner = std::thread::Builder::new().name("fskv-fuse".into()).spawn(move || {
        let r = session.run();
        let _ = done_tx.send(());
        r
    })?;
    let mut ended = false;
    tokio::select! {
        _ = shutdown => tracing::info!("unmounting"),
        _ = &mut done_rx => {
            tracing::info!("the mount went away");
            ended = true;
        }
    }
    if let Some(u) = shared.usrbio.get() {
        u.shutdown();
    }
    if let Err(e) = unmounter.unmount() {
        tracing::warn!(error = %e, "unmount failed (busy?); detaching lazily");
        detach(mountpoint)?;
    }
    if !ended && tokio::time::timeout(std::time::Duration::from_millis(SESSION_END_TIMEOUT_MS), done_rx).await.is_err() {
        // Files still open on a detached mount keep the session alive;
        // exiting closes /dev/fuse, which ends it.
        tracing::warn!("the FUSE session did not end in time; leaving it to process exit");
        return Ok(());
    }
    runner.join().map_err(|_| std::io::Error::other("the FUSE session thread panicked"))?
}

/// Sets the kernel readahead window of the FUSE mount at `mountpoint` to
/// `bytes` (rounded up to KiB) through `/sys/class/bdi/MAJ:MIN/read_ahead_kb`;
/// the device number comes from `/proc/self/mountinfo` (a `stat` of the
/// mount point would wait for this very daemon). Needs root; returns the
/// KiB written.
pub fn set_read_ahead(mountpoint: &Path, bytes: u32) -> std::io::Result<u32> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dev = mount_device(&mountinfo, mountpoint).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("{} not in /proc/self/mountinfo", mountpoint.display()))
    })?;
    let kb = bytes.div_ceil(1024).max(4);
    std::fs::write(format!("/sys/class/bdi/{dev}/read_ahead_kb"), kb.to_string())?;
    Ok(kb)
}

/// The `MAJ:MIN` of the last mount at `mountpoint` in a mountinfo text
/// (proc(5): field 3 is the device, field 5 the mount point, with space,
/// tab, newline and backslash escaped as octal).
fn mount_device(mountinfo: &str, mountpoint: &Path) -> Option<String> {
    let want = mountpoint.to_str()?.trim_end_matches('/');
    mountinfo.lines().rev().find_map(|line| {
        let mut f = line.split(' ');
        let dev = f.nth(2)?;
        let point = f.nth(1)?;
        let point = point.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\");
        (point == want && dev.contains(':')).then(|| dev.to_string())
    })
}

/// Bound on the wait for the session thread after unmount.
const SESSION_END_TIMEOUT_MS: u64 = 10_000;

/// Lazy unmount (`MNT_DETACH`): the mount leaves the namespace at once.
fn detach(mountpoint: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_device_is_the_last_mount_at_the_exact_path() {
        let info = "22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
                    40 22 0:40 / /tmp/m rw,nosuid,nodev,relatime shared:20 - fuse.fskv fskv rw,user_id=0\n\
                    41 22 0:41 / /tmp/m2 rw - fuse.fskv fskv rw\n\
                    42 40 0:44 / /tmp/m rw - fuse.fskv fskv rw\n\
                    43 22 0:45 / /tmp/with\\040space rw - fuse.fskv fskv rw\n";
        assert_eq!(mount_device(info, Path::new("/tmp/m")).as_deref(), Some("0:44"));
        assert_eq!(mount_device(info, Path::new("/tmp/m/")).as_deref(), Some("0:44"));
        assert_eq!(mount_device(info, Path::new("/tmp/m2")).as_deref(), Some("0:41"));
        assert_eq!(mount_device(info, Path::new("/tmp/with space")).as_deref(), Some("0:45"));
        assert_eq!(mount_device(info, Path::new("/tmp/none")), None);
        assert_eq!(mount_device("garbage\n\n1 2\n", Path::new("/tmp/m")), None);
    }
}
