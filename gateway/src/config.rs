//! Settings of a gateway's HTTP server: role, TLS and every limit, each with
//! its default. The limits are one serde struct, so the `fskv` config file
//! carries them as its `[gateway]` section.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// What a gateway process serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Reads only; a request its protocol classifies as a mutation gets the
    /// "read-only gateway" error naming the writer endpoint.
    Reader,
    /// Everything.
    Writer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reader" => Ok(Role::Reader),
            "writer" => Ok(Role::Writer),
            other => Err(format!("role {other:?}: expected reader or writer")),
        }
    }
}

/// Limits and timeouts of the HTTP server. Everything a peer controls is
/// bounded here; see docs/gateway.md for the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpLimits {
    /// Open client connections at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Open connections from one peer IP address; a further one is closed at once.
    pub max_connections_per_peer: usize,
    /// From a connection's accept (or the first byte of a next request on a
    /// kept-alive connection) to the end of the request head. A peer that
    /// sends half a header and stops is disconnected after this.
    pub header_read_timeout_ms: u64,
    /// A kept-alive connection with no request in flight and no byte of a
    /// next request is closed after this.
    pub idle_timeout_ms: u64,
    /// While a handler waits for request body bytes, none arriving for this
    /// long fails the body (the request is cut).
    pub body_progress_timeout_ms: u64,
    /// While response bytes wait to be sent, the peer not accepting any for
    /// this long closes the connection.
    pub send_progress_timeout_ms: u64,
    /// Bound on a TLS handshake.
    pub tls_handshake_timeout_ms: u64,
    /// At shutdown, how long requests in flight may take to finish before
    /// their connections are closed.
    pub shutdown_grace_ms: u64,
    /// Request line plus headers, in bytes (larger: 431).
    pub max_header_bytes: usize,
    /// Header fields in one request (more: 431).
    pub max_headers: usize,
    /// Request target (path and query), in bytes (larger: 414).
    pub max_uri_bytes: usize,
    /// Body of a request its protocol expects no body for (GET, HEAD, DELETE, ...).
    pub max_body_bytes_bodiless: u64,
    /// Body of a control request (XML or JSON documents, batches of keys).
    pub max_body_bytes_control: u64,
    /// Body of a data request (object or value bytes). A protocol may apply
    /// tighter limits of its own.
    pub max_body_bytes_data: u64,
    /// Who may read `GET /metrics`: "open" (anyone who reaches the port),
    /// "bearer" (a bearer token of the key store) or "off".
    pub metrics_endpoint: MetricsEndpoint,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 4096,
            max_connections_per_peer: 512,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            body_progress_timeout_ms: 30_000,
            send_progress_timeout_ms: 30_000,
            tls_handshake_timeout_ms: 10_000,
            shutdown_grace_ms: 10_000,
            max_header_bytes: 64 << 10,
            max_headers: 100,
            max_uri_bytes: 16 << 10,
            max_body_bytes_bodiless: 1 << 20,
            max_body_bytes_control: 20 << 20,
            max_body_bytes_data: 5 << 40,
            metrics_endpoint: MetricsEndpoint::Open,
        }
    }
}

impl HttpLimits {
    /// Checks values that would make the server useless or hyper panic.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_connections", self.max_connections as u64),
            ("max_connections_per_peer", self.max_connections_per_peer as u64),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("body_progress_timeout_ms", self.body_progress_timeout_ms),
            ("send_progress_timeout_ms", self.send_progress_timeout_ms),
            ("tls_handshake_timeout_ms", self.tls_handshake_timeout_ms),
            ("max_headers", self.max_headers as u64),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("gateway.{name} must be at least 1"));
            }
        }
        if self.max_connections > u32::MAX as usize >> 3 {
            return Err("gateway.max_connections is too large".into());
        }
        if self.max_header_bytes < 1024 {
            return Err("gateway.max_header_bytes must be at least 1024".into());
        }
        if self.max_uri_bytes < 256 {
            return Err("gateway.max_uri_bytes must be at least 256".into());
        }
        Ok(())
    }

    /// The body limit of a class of requests.
    pub fn max_body_bytes(&self, class: BodyClass) -> u64 {
        match class {
            BodyClass::Bodiless => self.max_body_bytes_bodiless,
            BodyClass::Control => self.max_body_bytes_control,
            BodyClass::Data => self.max_body_bytes_data,
        }
    }
}

/// The kind of body a request carries, as its protocol classifies it; each
/// has its own size limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyClass {
    /// None expected (reads, deletes).
    Bodiless,
    /// A document the handler reads whole (XML, JSON, key batches).
    Control,
    /// Object or value bytes, streamed.
    Data,
}

/// Access to `GET /metrics` on the gateway's port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsEndpoint {
    /// No authentication: counts by route, method and status carry no secrets.
    Open,
    /// `Authorization: Bearer <token>` with a token of the key store.
    Bearer,
    /// Not served (the request goes to the protocol like any other).
    Off,
}

/// PEM files of the certificate chain and private key for HTTPS.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

/// One HTTP server of a gateway.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub role: Role,
    /// Named in a reader's refusal of mutations.
    pub writer_endpoint: Option<String>,
    /// Serve HTTPS instead of HTTP.
    pub tls: Option<TlsFiles>,
    pub limits: HttpLimits,
}

impl ServerConfig {
    pub fn new(listen: SocketAddr, role: Role) -> Self {
        ServerConfig { listen, role, writer_endpoint: None, tls: None, limits: HttpLimits::default() }
    }
}
