//! `fskv-meta`: the metadata service of 3FS-KV (design note
//! `docs/meta.md`).
//!
//! * [`schema`]: the 3FS key schema (`INOD` + inode id LE, `DENT` + parent
//!   id LE + name, …) and the versioned value encoding.
//! * [`ops`]: every operation as a function over one KV transaction.
//! * [`alloc`]: sharded inode-id allocation in batches.
//! * [`perm`]: uid/gid/mode checks, sticky bit.
//! * [`storage`]: the storage side as a trait (+ fakes).
//! * [`gc`]: background reclamation of unlinked files and removed trees.
//! * [`service`]: preparation, idempotency records, per-inode batching, the
//!   RPC router.
//! * [`bench`]: `fskv bench meta`.

pub mod alloc;
/// `fskv bench meta` (feature `bench`).
#[cfg(feature = "bench")]
pub mod bench;
pub mod caller;
pub mod chain_storage;
pub mod error;
pub mod fsck;
pub mod gc;
pub mod metrics;
pub mod mgmtd_link;
pub mod ops;
pub mod perm;
pub mod schema;
pub mod service;
pub mod storage;

pub use chain_storage::ChainStorage;
pub use error::{MetaError, MetaResult};
pub use ops::MetaConfig;
pub use service::MetaService;
pub use storage::{FakeStorage, NoStorage, StorageBackend};
