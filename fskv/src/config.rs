//! The TOML configuration shared by every `fskv` subcommand.
//!
//! Every option has a default; a file only needs the options it changes.
//! Unknown keys are errors (a typo must not be silently ignored).
//! `fskv config default` prints [`DEFAULT_TOML`], which documents each option.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The documented default configuration. A unit test checks that it parses to
/// exactly `Config::default()`.
pub const DEFAULT_TOML: &str = r#"# 3FS-KV configuration. Every option is shown with its default.

[log]
# tracing filter, e.g. "info", "debug", "fskv_kv=debug,info".
# The environment variable FSKV_LOG overrides it.
level = "info"

[kv]
# Transactional KV engine for metadata: "rocksdb" (embedded, the default),
# "memory" (tests only: nothing survives a restart) or "fdb" (FoundationDB;
# needs a build with the cargo feature `fdb`).
engine = "rocksdb"
# Directory of the embedded engine, relative to the data directory.
path = "kv"
# fsync the write-ahead log on every commit batch. Off: commits survive a
# process crash but not an OS crash or power loss.
sync_writes = true
# Cluster file for engine = "fdb"; empty means FoundationDB's default.
fdb_cluster_file = ""

[rpc]
# Largest frame (header + message + bulk payload) sent or accepted.
max_frame_bytes = 83886080
# TCP connections kept per peer address; calls are spread over them.
connections_per_peer = 4
# Requests served at once per connection; more get an "overloaded" error.
max_inflight_per_connection = 1024
connect_timeout_ms = 3000
# Deadline of a call that does not set its own.
default_call_timeout_ms = 30000

[gateway]
# HTTP limits of every gateway process (`fskv gateway s3`; `fskv up` passes
# its --config on to its gateways). See docs/gateway.md.
# Open client connections; further ones wait in the listen backlog.
max_connections = 4096
# Open connections from one peer IP address; a further one is closed at once.
max_connections_per_peer = 512
# From a connection's accept (or the first byte of its next request) to the
# end of the request head: a peer sending half a header is cut after this.
header_read_timeout_ms = 10000
# A kept-alive connection with no request in flight is closed after this.
idle_timeout_ms = 60000
# A handler waiting this long for request body bytes fails the request (408).
body_progress_timeout_ms = 30000
# A peer accepting no response bytes for this long is disconnected.
send_progress_timeout_ms = 30000
tls_handshake_timeout_ms = 10000
# At shutdown, how long requests in flight may still take.
shutdown_grace_ms = 10000
# Request line plus headers, and header fields per request (more: 431).
max_header_bytes = 65536
max_headers = 100
# Request target (path and query); longer: 414.
max_uri_bytes = 16384
# Body limits by the class the protocol gives a request: none expected
# (GET, HEAD, DELETE), control documents (XML, JSON, key batches), data
# (object or value bytes, 5 TiB; S3 applies its own object limits too).
max_body_bytes_bodiless = 1048576
max_body_bytes_control = 20971520
max_body_bytes_data = 5497558138880
# GET /metrics on the gateway's port: "open", "bearer" (a bearer token of
# the key store) or "off".
metrics_endpoint = "open"

[up]
# Data directory of `fskv up` (all state of the single-node cluster).
data_dir = "./data"
# Public ports: S3 on base_port, KV on +1, MQ on +2; internal services above +10.
base_port = 9000
"#;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub log: LogConfig,
    pub kv: KvConfig,
    pub rpc: RpcConfig,
    pub gateway: fskv_gateway::HttpLimits,
    pub up: UpConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into() }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    pub engine: String,
    pub path: PathBuf,
    pub sync_writes: bool,
    pub fdb_cluster_file: String,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig { engine: "rocksdb".into(), path: "kv".into(), sync_writes: true, fdb_cluster_file: String::new() }
    }
}

impl KvConfig {
    /// The engine spec understood by `fskv_kv::open_engine`, with the embedded
    /// engine's path resolved against `data_dir`.
    pub fn engine_spec(&self, data_dir: &Path) -> anyhow::Result<String> {
        match self.engine.as_str() {
            "rocksdb" => Ok(format!("rocksdb:{}", data_dir.join(&self.path).display())),
            "memory" => Ok("memory".into()),
            "fdb" => Ok(format!("fdb:{}", self.fdb_cluster_file)),
            other => anyhow::bail!("kv.engine = {other:?} is not one of \"rocksdb\", \"memory\", \"fdb\""),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RpcConfig {
    pub max_frame_bytes: u64,
    pub connections_per_peer: usize,
    pub max_inflight_per_connection: usize,
    pub connect_timeout_ms: u64,
    pub default_call_timeout_ms: u64,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            max_frame_bytes: 80 << 20,
            connections_per_peer: 4,
            max_inflight_per_connection: 1024,
            connect_timeout_ms: 3000,
            default_call_timeout_ms: 30_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpConfig {
    pub data_dir: PathBuf,
    pub base_port: u16,
}

impl Default for UpConfig {
    fn default() -> Self {
        UpConfig { data_dir: "./data".into(), base_port: 9000 }
    }
}

impl Config {
    /// Loads `path`, or the defaults when no file is given.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Config> {
        let Some(path) = path else { return Ok(Config::default()) };
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("invalid config file {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let config: Config = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.rpc.max_frame_bytes >= 4096, "rpc.max_frame_bytes must be at least 4096");
        anyhow::ensure!(self.rpc.max_frame_bytes <= 1 << 30, "rpc.max_frame_bytes must be at most 1 GiB");
        anyhow::ensure!(self.rpc.connections_per_peer >= 1, "rpc.connections_per_peer must be at least 1");
        anyhow::ensure!(self.rpc.max_inflight_per_connection >= 1, "rpc.max_inflight_per_connection must be at least 1");
        self.gateway.validate().map_err(anyhow::Error::msg)?;
        anyhow::ensure!(self.up.base_port <= 65535 - 20, "up.base_port leaves no room for the internal ports above it");
        self.kv.engine_spec(Path::new("."))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_default_is_the_default() {
        assert_eq!(Config::parse(DEFAULT_TOML).unwrap(), Config::default());
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let c = Config::parse("[up]\nbase_port = 19000\n").unwrap();
        assert_eq!(c.up.base_port, 19000);
        assert_eq!(c.kv, KvConfig::default());
    }

    #[test]
    fn typos_and_bad_values_are_clear_errors() {
        let e = Config::parse("[kv]\nengnie = \"memory\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("unknown field"), "{e:#}");
        let e = Config::parse("[kv]\nengine = \"sqlite\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("sqlite"), "{e:#}");
        let e = Config::parse("[rpc]\nmax_frame_bytes = 10\n").unwrap_err();
        assert!(format!("{e:#}").contains("max_frame_bytes"), "{e:#}");
        let e = Config::parse("[gateway]\nidle_timeout_ms = 0\n").unwrap_err();
        assert!(format!("{e:#}").contains("idle_timeout_ms"), "{e:#}");
        let e = Config::parse("[gateway]\nmetrics_endpoint = \"public\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("metrics_endpoint") || format!("{e:#}").contains("unknown variant"), "{e:#}");
    }
}
