//! Types shared by every 3FS-KV crate: identifiers in the vocabulary of 3FS
//! (node, target, chain, inode, chunk) and the error codes that cross process
//! boundaries. The messages and methods of the services are in `fskv-proto`.
//!
//! This crate has no I/O and no async code; it is the leaf of the dependency
//! graph.

pub mod error;
pub mod ids;

pub use error::{ErrorCode, Status};
pub use ids::{ChainId, ChunkId, InodeId, NodeId, TargetId};
