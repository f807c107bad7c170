//! `fskv-rpc`: one message format for every 3FS-KV service, multiplexed over
//! pooled connections, with deadlines, cancellation and a bulk payload that
//! is never re-encoded.
//!
//! # Frame layout
//!
//! A 32-byte little-endian header (magic `3FSR`, version, kind =
//! request/response/cancel, flags, request id `u64`, method id or status
//! code, timeout in ms, body length, payload length), then the body (bincode
//! of the typed message, or the UTF-8 message of an error), then the raw
//! payload. See [`frame`] for the exact table. The decoder is pure (no I/O),
//! checks the sizes from the header against `max_frame_bytes` before
//! allocating, and returns body and payload as zero-copy [`bytes::Bytes`]
//! slices of the receive buffer.
//!
//! # Threading model
//!
//! * Client ([`RpcClient`]): per address a pool of `connections_per_addr`
//!   connections used round-robin; per connection a reader task and a writer
//!   task. Calls register a oneshot in the connection's pending map (request
//!   id → waiter), so any number of calls share one connection and replies
//!   may come in any order. A call that times out or whose future is dropped
//!   removes its entry and sends a Cancel frame (drop guard). A broken
//!   connection fails all its pending calls with `ConnectionFailed`; the
//!   next call on that slot reconnects.
//! * Server ([`Server`]): an accept task; per connection a reader and a
//!   writer task; per request a handler task, which writes its own reply
//!   when nothing else is being written (the writer task finishes what a
//!   full socket did not take; `outgoing.rs`, shared with the client). The server enforces the
//!   request's deadline (`DeadlineExceeded`), aborts a handler on Cancel,
//!   answers `Overloaded` beyond its per-connection in-flight limit,
//!   `UnknownMethod` / `MalformedMessage` for bad requests (the connection
//!   stays up), and closes the connection on a corrupt or oversized header.
//! * Reads land in one buffer that grows as the frame's bytes arrive (one
//!   copy from the kernel); writes are vectored (header+body from a small
//!   buffer, payload from the caller's `Bytes`).
//!
//! # Limits (all with units in their names)
//!
//! `max_frame_bytes` (default 80 MiB: a 64 MiB chunk plus headers),
//! `max_in_flight_per_connection` (client: calls wait for a slot; server:
//! excess answered `Overloaded`), `connect_timeout_ms`,
//! `CallOptions::timeout_ms`, `shutdown_grace_ms`; and against untrusted
//! peers on the server: `max_connections` (closed at accept beyond it),
//! `max_in_flight_bytes` (request bytes held over all connections; a request
//! that does not fit is read, dropped and answered `Overloaded` — refused,
//! not waited for, so services calling each other cannot deadlock on it),
//! `frame_read_timeout_ms` (a frame must arrive whole within it of its first
//! byte) and `idle_timeout_ms`. A server reserves a request frame whole at its
//! header only up to 4 MiB (charged to the budget first); a larger one's
//! buffer grows as its bytes arrive, never to the size a header merely
//! claims. Defaults and the `[rpc]` keys:
//! [`settings`].
//!
//! # Transport seam
//!
//! Client and server only see the [`Transport`] trait (connect / bind /
//! accept yielding boxed read and write halves). [`TcpTransport`] is the
//! implementation today; an RDMA transport (`ibverbs`, behind a feature) and a
//! simulated network (`turmoil`) plug in the same way. RDMA-style one-sided
//! transfers go through [`transport::RemoteMemory`] and the [`RemoteBuf`]
//! descriptor a payload may carry instead of bytes
//! ([`frame::FLAG_PAYLOAD_REMOTE`]); TCP reports no remote memory. Time comes
//! from `tokio::time` only, which a simulator can drive.

pub mod auth;
/// `fskv bench rpc` (feature `bench`).
#[cfg(feature = "bench")]
pub mod bench;
pub mod client;
pub mod error;
pub mod frame;
pub mod http;
mod io;
pub mod method;
pub mod metrics;
mod outgoing;
/// RDMA one-sided transfers behind the seam (device shell: feature `rdma`).
pub mod rdma;
pub mod server;
pub mod settings;
#[cfg(feature = "sim")]
pub mod sim;
pub mod transport;
pub mod watch;

pub use client::{CallOptions, ClientConfig, RpcClient};

/// A hash map with a fixed hasher: its iteration order (e.g. the order in
/// which the pending calls of a broken connection are failed) is the same
/// in every run, which a deterministic simulation needs. Keys are our own
/// request ids, so hash flooding is not a concern.
pub type DetHashMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>>;
pub use error::RpcError;
pub use fskv_types::{ErrorCode, Status};
pub use method::Method;
pub use metrics::MetricsRegistry;
pub use server::{ConnLocal, RequestContext, Router, Server, ServerConfig};
#[cfg(feature = "sim")]
pub use sim::SimTransport;
pub use transport::{RemoteBuf, TcpTransport, Transport};
