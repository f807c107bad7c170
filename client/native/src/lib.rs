//! `fskv-client`: the native client library of 3FS-KV.
//!
//! * [`meta`]: the metadata client ([`meta::MetaClient`]): typed calls over
//!   `fskv-rpc` to a list of meta servers, with failover and idempotent retries.
//! * [`mgmtd`]: mgmtd RPC definitions, [`mgmtd::MgmtdClient`] (follows the
//!   primary) and [`mgmtd::MgmtdRoutingSource`] (routing info for everyone).
//! * [`storage`]: the storage RPC definitions and [`storage::StorageClient`]
//!   (writes to the chain head, reads from any serving target, retries on
//!   uncommitted data and stale chain versions, read flow control).
//! * [`file`]: [`file::FsClient`] and [`file::FileHandle`]: open / read_at /
//!   write_at / fsync / truncate / close over meta + storage, striped over
//!   chains with a bounded number of chunk pieces in flight.
//!
//! * [`keyname`], [`keywalk`]: arbitrary byte keys as file names of one
//!   directory (order-preserving, long keys as continuation directories)
//!   and their walk in key order; the KV gateway's namespaces and the S3
//!   gateway's flat buckets.
//!
//! * [`caps`]: the chunk capabilities a `user:` principal's client gets
//!   from meta and attaches to storage requests.
//!
//! It links neither a server nor the KV engine.

pub mod caps;
pub mod file;
pub mod keyname;
pub mod keywalk;
pub mod meta;
pub mod mgmtd;
pub mod storage;

pub use file::{FileError, FileHandle, FsClient, FsClientConfig, OpenFlags, QuietClose, ReadInto, ReadIntoOptions};
pub use meta::{CloseEnd, MetaClient, MetaClientConfig, MetaClientError};
