//! The KV gateway: namespaces are directories, keys are order-preserving
//! file names, values are file data of the 3FS-KV filesystem; a native
//! binary-safe HTTP API with batch framing, eviction and TTL, and a
//! Consul-KV-compatible subset. See docs/kv.md.

pub mod body;
pub mod client;
pub mod config;
pub mod consul;
pub mod error;
pub mod frame;
pub mod index;
pub mod keys;
pub mod maintain;
pub mod ops;
pub mod recency;
pub mod record;
pub mod route;
pub mod server;
pub mod store;

pub use config::{KvConfig, Limits, Maintenance, NamespaceConfig};
pub use error::KvError;
pub use route::{classify, classify_consul};
pub use server::{start, start_on, KvHandle};
