//! `fskv-client`: the native client library of 3FS-KV.
//!
//! Today it holds the metadata client ([`meta::MetaClient`]): typed calls over
//! `fskv-rpc` to a list of meta servers, with failover and idempotent retries.
//! It links neither the meta server nor the KV engine.

pub mod meta;

pub use meta::{MetaBatchCall, MetaCall, MetaClient, MetaClientConfig, MetaClientError};
