//! Types shared by every 3FS-KV crate: identifiers in the vocabulary of 3FS
//! (node, target, chain, inode, chunk) and the error codes that cross process
//! boundaries.
//!
//! This crate has no I/O and no async code; it is the leaf of the dependency
//! graph so that clients never link a server or an engine.

pub mod error;
pub mod ids;
pub mod meta;
pub mod mgmtd;
pub mod routing;
pub mod storage;

pub use error::{ErrorCode, Status};
pub use ids::{ChainId, ChunkId, InodeId, NodeId, TargetId};
