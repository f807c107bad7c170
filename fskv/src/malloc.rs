//! glibc malloc settings for every fskv process (servers, gateways, the
//! front, clients and benches alike), made before the first thread starts.
//!
//! | setting | glibc default | here | why |
//! |---|---|---|---|
//! | `M_MMAP_THRESHOLD` | 128 KiB, raised on each free of a larger mapped block (dynamic) | [`MMAP_THRESHOLD_BYTES`] (fixed) | chunk-sized buffers (512 KiB–4 MiB: RPC replies, HTTP frames) come from the heap, not from a fresh `mmap` whose pages fault in again on every use |
//! | `M_TRIM_THRESHOLD` | 2 × the mmap threshold (dynamic: ~1 MiB here) | [`TRIM_THRESHOLD_BYTES`] | memory freed by one streamed read stays for the next instead of going back to the kernel after every burst |
//!
//! Measured (docs/BENCHMARKS.md, "Batch get: the client's copy, 4 MiB
//! pieces and malloc settings"): a KV batch get of 16 × 4 MiB went
//! 1805 → 1979 MiB/s straight to one gateway process and 1113 → 1424 MiB/s
//! through the front; S3 GET 64 MiB +12–28 %. Before, ~9 % of the gateway's
//! samples were page faults of fresh buffers.
//!
//! The cost: a process keeps up to its peak heap (at most
//! [`TRIM_THRESHOLD_BYTES`] of free space at the top of an arena) after a
//! burst. An operator who wants other settings sets `GLIBC_TUNABLES` with
//! any `glibc.malloc.` tunable; then nothing here is changed.

/// Allocations up to this size come from the heap.
pub const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;
/// Free space kept at the top of an arena before it is given back.
pub const TRIM_THRESHOLD_BYTES: i32 = 256 << 20;

/// Applies the table above, unless `GLIBC_TUNABLES` sets malloc tunables.
/// Call it before any thread starts (mallopt is not meant to race allocations).
pub fn tune() {
    if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called from main
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}
