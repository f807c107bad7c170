//! `fskv-client`: the native client library of 3FS-KV.
//!
//! [`storage`] holds the storage RPC definitions and the [`storage::StorageClient`]
//! (writes to the chain head, reads from any serving target, retries on
//! uncommitted data and stale chain versions, read flow control).

pub mod mgmtd;
pub mod storage;
