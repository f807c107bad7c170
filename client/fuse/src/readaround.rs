//! Read-around: a small read that the kernel's page cache missed fetches the
//! aligned window around it from storage, answers the read from it, and
//! hands the kernel the rest of the window as cached pages
//! (`FUSE_NOTIFY_STORE`) — what a local filesystem's readahead does around a
//! small read of its backing device. The next small reads near it are then
//! served by the kernel without a request to this mount or to storage. The
//! cost is bandwidth: a read of `size` bytes moves up to `read_around_bytes`
//! from storage (on a cold, purely random read of a large file the extra
//! pages are rarely used; see docs/fuse.md).
//!
//! | rule | why |
//! |---|---|
//! | widened only when the read is smaller than the window, starts on a page and is whole pages (or ends at EOF), is not `O_DIRECT`, and no handle of this mount has the file open for writing | a page-cache miss of a reader; writers' pages are the kernel's to keep |
//! | the read's own pages are never stored, and the rest is stored after the read's reply | the kernel holds the read's pages locked until the reply: storing them first would deadlock |
//! | stores run on the blocking pool | storing waits for page locks that reads in flight hold until this mount answers them |
//! | stored ranges end where the bytes read end (the file's length then) | a store past the kernel's size would extend it |
//! | an open for writing, an open whose reply drops the kernel's cache (the file changed), a truncate, a USRBIO write's cache drop, and the release of a writable handle (until its buffered bytes are on storage) first [`StoreGate::block`] the file: stores not yet begun are cancelled (also those whose storage read is still running: a block never waits for storage), those being made are waited for, and none starts until the block ends | bytes read before a change must never land in the cache after it |
//!
//! Writes by other clients are seen as with any cached page: at the next
//! open after the file changed (close-to-open, `keep_page_cache`).

use fskv_types::InodeId;
use std::collections::HashMap;
use std::sync::Arc;

/// The kernel's page size for this purpose (FUSE pages are 4 KiB here).
pub const PAGE_BYTES: u64 = 4096;

/// Largest window accepted (`MountConfig::read_around_bytes`).
pub const MAX_WINDOW_BYTES: u32 = 1 << 20;

/// Checks a configured window: 0 (off) or a power of two from two pages
/// to [`MAX_WINDOW_BYTES`].
pub fn check_window_bytes(bytes: u32) -> Result<(), String> {
    let min = 2 * PAGE_BYTES as u32;
    if bytes == 0 || (bytes.is_power_of_two() && (min..=MAX_WINDOW_BYTES).contains(&bytes)) {
        return Ok(());
    }
    Err(format!("the read-around window must be 0 (off) or a power of two from {min} to {MAX_WINDOW_BYTES} bytes, not {bytes}"))
}

/// The window `(start, end)` a read of `size` bytes at `offset` of a file
/// `len` bytes long is widened to, or `None` when it is not widened (see
/// the module's table; `window_bytes` is a power of two ≥ 2 pages, or 0 =
/// off).
pub fn window(offset: u64, size: u32, len: u64, window_bytes: u64) -> Option<(u64, u64)> {
    let size = u64::from(size);
    if window_bytes < 2 * PAGE_BYTES || !window_bytes.is_power_of_two() || size == 0 || size >= window_bytes {
        return None;
    }
    let end = offset.checked_add(size)?;
    if !offset.is_multiple_of(PAGE_BYTES) || (!size.is_multiple_of(PAGE_BYTES) && end < len) || offset >= len {
        return None;
    }
    let start = offset - offset % window_bytes;
    let aligned_end = end.checked_add(window_bytes - 1)? & !(window_bytes - 1);
    let win_end = aligned_end.min(len);
    // Nothing around the read: not worth a store.
    (win_end > end.min(len) || start < offset).then_some((start, win_end))
}

/// Per-file bookkeeping of read-arounds against changes (see the module's
/// table). An entry exists only while a ticket or a block of the file is
/// held, so the map holds at most the files being read around or changed
/// right now.
#[derive(Default)]
pub struct StoreGate {
    files: parking_lot::Mutex<HashMap<InodeId, GateEntry>>,
    /// Notified whenever a store finishes (a block waits for it).
    store_done: tokio::sync::Notify,
}

#[derive(Default, Debug)]
struct GateEntry {
    /// Tickets held (from before their storage read until their store).
    tickets: u32,
    /// Of those, the ones storing pages right now.
    storing: u32,
    blocks: u32,
    /// Bumped by every block: tickets taken before it store nothing.
    epoch: u64,
}

impl GateEntry {
    fn idle(&self) -> bool {
        self.tickets == 0 && self.blocks == 0
    }
}

/// The right to store pages of one file read around, taken before its
/// storage read; [`Ticket::store`] uses it once.
pub struct Ticket {
    gate: Arc<StoreGate>,
    inode: InodeId,
    epoch: u64,
}

impl Ticket {
    /// Runs `store` (which stores the pages and returns the bytes stored)
    /// unless a block came since the ticket was taken — then the bytes read
    /// under it may predate a change, and 0 is returned. A block that comes
    /// while `store` runs waits for it.
    pub fn store(self, store: impl FnOnce() -> u64) -> u64 {
        {
            let mut files = self.gate.files.lock();
            match files.get_mut(&self.inode) {
                // A block bumps the epoch, and none is given while one is held.
                Some(e) if e.epoch == self.epoch => e.storing += 1,
                _ => return 0,
            }
        }
        let stored = store();
        if let Some(e) = self.gate.files.lock().get_mut(&self.inode) {
            debug_assert!(e.storing > 0, "a store outlived its count");
            e.storing = e.storing.saturating_sub(1);
        }
        self.gate.store_done.notify_waiters();
        stored
    }

    /// Whether a block came since the ticket was taken (tests).
    #[cfg(test)]
    fn cancelled(&self) -> bool {
        self.gate.files.lock().get(&self.inode).is_none_or(|e| e.epoch != self.epoch)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.leave(self.inode, |e| {
            debug_assert!(e.tickets > 0, "a ticket outlived its count");
            e.tickets = e.tickets.saturating_sub(1);
        });
    }
}

/// A file held blocked: no store starts until it is dropped.
pub struct Block {
    gate: Arc<StoreGate>,
    inode: InodeId,
}

impl Drop for Block {
    fn drop(&mut self) {
        self.gate.leave(self.inode, |e| {
            debug_assert!(e.blocks > 0, "a block outlived its count");
            e.blocks = e.blocks.saturating_sub(1);
        });
    }
}

impl StoreGate {
    pub fn new() -> Arc<StoreGate> {
        Arc::new(StoreGate::default())
    }

    /// Applies a ticket's or block's end to `inode`'s entry, and drops the
    /// entry once nothing holds it.
    fn leave(&self, inode: InodeId, end: impl FnOnce(&mut GateEntry)) {
        let mut files = self.files.lock();
        if let Some(e) = files.get_mut(&inode) {
            end(e);
            if e.idle() {
                files.remove(&inode);
            }
        }
    }

    /// A ticket to read `inode` around, unless the file is blocked or
    /// `has_writer()` (asked under the gate's lock, so an open for writing
    /// that registers its handle and then blocks cannot slip between).
    pub fn try_enter(self: &Arc<Self>, inode: InodeId, has_writer: impl FnOnce() -> bool) -> Option<Ticket> {
        let mut files = self.files.lock();
        if files.get(&inode).is_some_and(|e| e.blocks > 0) || has_writer() {
            return None;
        }
        let e = files.entry(inode).or_default();
        e.tickets += 1;
        Some(Ticket { gate: self.clone(), inode, epoch: e.epoch })
    }

    /// Blocks `inode`: cancels the stores not yet begun (whatever their
    /// storage reads are doing), waits for those being made, and keeps new
    /// ones from starting until the [`Block`] is dropped.
    pub async fn block(self: &Arc<Self>, inode: InodeId) -> Block {
        {
            let mut files = self.files.lock();
            let e = files.entry(inode).or_default();
            e.blocks += 1;
            e.epoch += 1;
        }
        let block = Block { gate: self.clone(), inode };
        loop {
            let done = self.store_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.files.lock().get(&inode).is_none_or(|e| e.storing == 0) {
                return block;
            }
            done.await;
        }
    }

    /// Files with an entry (tests: the map does not grow).
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.files.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    #[test]
    fn windows() {
        let len = 1 << 30;
        // A 4 KiB read in the middle of a 16 KiB window.
        assert_eq!(window(20 * K, 4096, len, 16 * K), Some((16 * K, 32 * K)));
        // At the window's start and end.
        assert_eq!(window(16 * K, 4096, len, 16 * K), Some((16 * K, 32 * K)));
        assert_eq!(window(28 * K, 4096, len, 16 * K), Some((16 * K, 32 * K)));
        // Across a window boundary: both windows.
        assert_eq!(window(28 * K, 8192, len, 16 * K), Some((16 * K, 48 * K)));
        // Clipped at EOF; a short last page is fine; nothing around: none.
        assert_eq!(window(20 * K, 4096, 26 * K, 16 * K), Some((16 * K, 26 * K)));
        assert_eq!(window(24 * K, 4096, 26 * K, 16 * K), Some((16 * K, 26 * K)));
        assert_eq!(window(0, 4096, 4096, 16 * K), None);
        assert_eq!(window(0, 2000, 2000, 16 * K), None);
        // Not widened: off, not a power of two, too large a read, unaligned
        // offset or size, past EOF, empty.
        assert_eq!(window(20 * K, 4096, len, 0), None);
        assert_eq!(window(20 * K, 4096, len, 4 * K), None);
        assert_eq!(window(20 * K, 4096, len, 24 * K), None);
        assert_eq!(window(0, 16384, len, 16 * K), None);
        assert_eq!(window(20 * K + 512, 4096, len, 16 * K), None);
        assert_eq!(window(20 * K, 1000, len, 16 * K), None);
        assert_eq!(window(len, 4096, len, 16 * K), None);
        assert_eq!(window(20 * K, 0, len, 16 * K), None);
        assert_eq!(window(u64::MAX - 4095, 4096, u64::MAX, 16 * K), None);
    }

    #[test]
    fn window_sizes_checked() {
        for ok in [0, 8192, 32 << 10, 1 << 20] {
            assert!(check_window_bytes(ok).is_ok(), "{ok}");
        }
        for bad in [1, 4096, 48 << 10, 2 << 20, u32::MAX] {
            let err = check_window_bytes(bad).expect_err("accepted");
            assert!(err.contains(&bad.to_string()), "{err}");
        }
    }

    #[test]
    fn writers_and_blocks_keep_tickets_out() {
        let gate = StoreGate::new();
        let a = InodeId(7);
        assert!(gate.try_enter(a, || true).is_none(), "an open writer: no read-around");
        let t = gate.try_enter(a, || false).expect("no writer");
        assert!(!t.cancelled());
        assert_eq!(t.store(|| 4096), 4096, "an uncontested store runs");
        assert_eq!(gate.entries(), 0, "an idle file leaves no entry");
        drop(gate.try_enter(a, || false));
        assert_eq!(gate.entries(), 0, "a ticket given up leaves no entry");
    }

    #[tokio::test]
    async fn a_block_cancels_tickets_without_waiting_for_their_reads() {
        let gate = StoreGate::new();
        let (a, b) = (InodeId(1), InodeId(2));
        // Taken before the block: its storage read is "still running".
        let t = gate.try_enter(a, || false).expect("ticket");
        let other = gate.try_enter(b, || false).expect("ticket of another file");
        let block = tokio::time::timeout(std::time::Duration::from_secs(5), gate.block(a)).await.expect("a block waited for a read");
        assert!(gate.try_enter(a, || false).is_none(), "a ticket was given during a block");
        assert_eq!(t.store(|| panic!("a cancelled ticket stored")), 0);
        assert!(!other.cancelled(), "a block of one file cancelled another's");
        drop(block);
        let t2 = gate.try_enter(a, || false).expect("a ticket after the block");
        assert_eq!(t2.store(|| 1), 1);
        drop(other);
        assert_eq!(gate.entries(), 0);
    }

    #[tokio::test]
    async fn a_block_waits_for_a_store_being_made() {
        let gate = StoreGate::new();
        let a = InodeId(5);
        let t = gate.try_enter(a, || false).expect("ticket");
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
        let storing = std::thread::spawn(move || {
            t.store(|| {
                started_tx.send(()).expect("send");
                finish_rx.recv().expect("recv");
                8192
            })
        });
        started_rx.recv().expect("the store started");
        let blocking = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.block(a).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!blocking.is_finished(), "a block returned while a store was being made");
        finish_tx.send(()).expect("send");
        assert_eq!(storing.join().expect("store thread"), 8192);
        let block = tokio::time::timeout(std::time::Duration::from_secs(5), blocking).await.expect("block waits forever").expect("task");
        drop(block);
        assert_eq!(gate.entries(), 0);
    }

    #[tokio::test]
    async fn a_block_with_nothing_in_flight_returns_at_once() {
        let gate = StoreGate::new();
        let block = tokio::time::timeout(std::time::Duration::from_secs(5), gate.block(InodeId(3))).await.expect("block waited");
        drop(block);
        assert_eq!(gate.entries(), 0);
    }
}
