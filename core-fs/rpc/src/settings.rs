//! Process-wide RPC settings: the `[rpc]` section of the `fskv`
//! configuration. The binary installs them once at start
//! ([`install`]); every [`ClientConfig`](crate::ClientConfig),
//! [`ServerConfig`](crate::ServerConfig) and [`CallOptions`](crate::CallOptions)
//! made with `default()` in the process starts from them, so each service
//! and client of the process follows the file without every library call
//! taking the section as an argument. Without [`install`] (tests, other
//! embedders) the built-in defaults apply.
//!
//! | setting | applies to | default |
//! |---|---|---|
//! | `max_frame_bytes` | largest frame sent or accepted, client and server | 80 MiB |
//! | `connections_per_peer` | client connections pooled per address | 4 |
//! | `max_in_flight_per_connection` | client calls outstanding / server requests running per connection | 1024 |
//! | `connect_timeout_ms` | client connection set-up | 3000 |
//! | `default_call_timeout_ms` | deadline of a call made with `CallOptions::default()` | 30000 |
//! | `max_connections` | server: connections open at once (more are closed at accept) | 4096 |
//! | `max_in_flight_bytes` | server: request bytes held at once over all connections (more answered `Overloaded`) | 1 GiB |
//! | `frame_read_timeout_ms` | server: a frame must arrive whole within this of its first byte | 60000 |
//! | `idle_timeout_ms` | server: a connection with nothing in flight and no frame for this long is closed (within two of it) | 600000 |
//! | `handshake_timeout_ms` | client and server: the authentication handshake ([`crate::auth`]) must finish within it | 5000 |
//! | `max_unauthenticated_connections` | server with a key: connections still in their handshake; one more closes the oldest | 1024 |

use crate::frame::DEFAULT_MAX_FRAME_BYTES;
use std::sync::OnceLock;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcSettings {
    pub max_frame_bytes: usize,
    pub connections_per_peer: usize,
    pub max_in_flight_per_connection: usize,
    pub connect_timeout_ms: u64,
    pub default_call_timeout_ms: u64,
    pub max_connections: usize,
    pub max_in_flight_bytes: usize,
    pub frame_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub handshake_timeout_ms: u64,
    pub max_unauthenticated_connections: usize,
}

impl RpcSettings {
    pub const BUILT_IN: RpcSettings = RpcSettings {
        max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        connections_per_peer: 4,
        max_in_flight_per_connection: 1024,
        connect_timeout_ms: 3_000,
        default_call_timeout_ms: 30_000,
        max_connections: 4096,
        max_in_flight_bytes: 1 << 30,
        frame_read_timeout_ms: 60_000,
        idle_timeout_ms: 600_000,
        handshake_timeout_ms: 5_000,
        max_unauthenticated_connections: 1024,
    };
}

impl Default for RpcSettings {
    fn default() -> Self {
        RpcSettings::BUILT_IN
    }
}

static SETTINGS: OnceLock<RpcSettings> = OnceLock::new();

/// Installs the process's settings; only the first call counts (it returns
/// `false` for a later one, whose settings are ignored).
pub fn install(settings: RpcSettings) -> bool {
    SETTINGS.set(settings).is_ok()
}

/// The installed settings, or the built-in defaults.
pub fn current() -> &'static RpcSettings {
    SETTINGS.get().unwrap_or(&RpcSettings::BUILT_IN)
}
