//! The S3 gateway: an S3-compatible object store over the filesystem.
//!
//! Buckets are directories under a root directory; an object key is a path
//! below its bucket; object data is file data; metadata (headers, user
//! metadata, ETag, checksums, tags) lives in xattrs. A PUT writes a temp
//! inode and publishes data, length and metadata in one meta transaction,
//! so readers see the old object or the new one. The protocol (routing,
//! XML, SigV4, aws-chunked bodies) is `s3s`; `ops/` holds the operations,
//! `error.rs` maps every failure to an S3 error.
//!
//! Code map: `paths` (keys → paths), `objmeta` (the xattr records, ETags),
//! `store` (buckets and directories), `walk` + `list` (listing in S3 order
//! from a position), `body` (digests in, read-ahead stream out),
//! `ops/*` (one file per group of operations), `auth` (s3s's keys from the
//! shared key store; every request's access decision), `access` (ACLs,
//! ownership controls, bucket policies: the pure decision), `route` (which S3 operation a request head is: read or
//! mutation, body class), `server` (the protocol on the shared gateway layer,
//! `fskv-gateway`: connections, timeouts, limits, reader guard, metrics).

pub mod access;
pub mod auth;
pub mod body;
pub mod config;
pub mod cors;
pub mod error;
pub mod lifecycle;
pub mod list;
pub mod objmeta;
pub mod ops;
pub mod paths;
pub mod route;
pub mod s3;
pub mod server;
pub mod store;
pub mod versions;
pub mod vhost;
pub mod walk;

pub use config::{AccessKey, GatewayConfig, HttpLimits, KeyStore, Limits, Role};
pub use server::{start, GatewayHandle};
