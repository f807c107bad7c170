//! `fskv-storage`: the storage service of 3FS-KV (docs/storage.md).
//!
//! A service hosts several targets (one chunk engine each) and replicates
//! writes along chains with CRAQ; a returning target is recovered online by
//! its predecessor. The decisions are pure: [`chain`] (a target's position
//! and admission, over the roles of `fskv_proto::routing::ChainRoles`),
//! [`craq`] (the CRAQ step as a state machine: inputs in, effects out) and
//! [`sync`] (the recovery planner); [`service`] is the async shell that
//! executes them (RPC handlers, chunk locks, forwarding, the sync worker).
//! See `docs/storage.md`.

pub mod access;
/// `fskv bench storage` (feature `bench`).
#[cfg(feature = "bench")]
pub mod bench;
pub mod chain;
pub mod channels;
/// `LocalCluster`: services in one process on loopback (feature `testkit`).
#[cfg(feature = "testkit")]
pub mod cluster;
pub mod craq;
pub mod error;
pub mod inflight;
pub mod locks;
pub mod metrics;
pub mod mgmtd_link;
pub mod service;
pub mod sync;

pub use error::{Result, StorageError};
pub use service::{RunningStorage, StorageConfig, StorageService};
