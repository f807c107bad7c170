//! `fskv-usrbio`: USRBIO, the zero-copy ring I/O of 3FS, for 3FS-KV.
//!
//! A program shares memory with the FUSE daemon (`fskv mount`): **iovs**
//! (its data buffers, `/dev/shm` files both map) and **rings** (submission
//! and completion queues in another shared file). It registers both through
//! symlinks in the mount's virtual directory `3fs-virt/iovs/`, registers the
//! files it reads or writes (an `ioctl` on the open descriptor), prepares
//! requests in a ring, rings the daemon's doorbell and waits for completions
//! (futexes in the shared memory). The daemon reads chunk data straight into
//! the iov and writes from it; no data passes through the kernel's FUSE path.
//!
//! * [`proto`]: what both sides agree on (names, layouts, ioctls).
//! * [`ring`]: both ends of a ring ([`ring::Producer`], [`ring::Consumer`]).
//! * [`batch`]: when the daemon takes a batch (`io_depth`), a pure function.
//! * [`sys`]: futexes and shared mappings.
//! * [`client`]: the program's side below the APIs (regions, rings, files),
//!   shared by the C library (`client/usrbio/capi`, `libhf3fs_api_shared.so`).
//! * [`api`]: the safe Rust API ([`Iov`], [`IoBuf`], [`Ring`], [`File`]).
//!
//! See `docs/usrbio.md`; measured in docs/BENCHMARKS.md (`fskv bench usrbio`).

pub mod api;
pub mod batch;
pub mod client;
pub mod proto;
pub mod ring;
pub mod sys;

pub use api::{Completion, File, IoBuf, Iov, Ring, RingOptions, UsrbioError};
pub use proto::Priority;
