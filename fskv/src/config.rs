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
# "memory" (tests only: nothing survives a restart), "etcd" (an etcd v3
# cluster shared by several meta and mgmtd processes; see etcd_* below) or
# "fdb" (FoundationDB; needs a build with the cargo feature `fdb`).
engine = "rocksdb"
# Directory of the embedded engine, relative to the data directory.
path = "kv"
# fsync the write-ahead log on every commit batch. Off: commits survive a
# process crash but not an OS crash or power loss.
sync_writes = true
# Cluster file for engine = "fdb"; empty means FoundationDB's default.
fdb_cluster_file = ""
# engine = "etcd": the members' client URLs (http://HOST:PORT).
etcd_endpoints = []
# Prefix of every key in etcd (one etcd cluster can hold several clusters).
etcd_prefix = "fskv/"
# The etcd cluster's --max-txn-ops and --max-request-bytes (etcd's defaults
# here; deploy/ raises them to 10000 and 11534336). Larger transactions are
# refused before they are sent.
etcd_max_txn_ops = 128
etcd_max_request_bytes = 1572864

[rpc]
# Every RPC client and server of the process (services, gateways, mount,
# admin commands) starts from these; `fskv up` passes its configuration on to
# every process it starts (DIR/effective-config.toml).
# Largest frame (header + message + bulk payload) sent or accepted.
max_frame_bytes = 83886080
# TCP connections kept per peer address; calls are spread over them.
connections_per_peer = 4
# Requests served at once per connection; more get an "overloaded" error.
max_inflight_per_connection = 1024
connect_timeout_ms = 3000
# Deadline of a call that does not set its own.
default_call_timeout_ms = 30000
# Servers: connections open at once; more are closed as they are accepted.
max_connections = 4096
# Servers: bytes of requests held at once over all connections (being read
# or handled); a request that does not fit is answered "overloaded" (the
# caller retries). At least max_frame_bytes.
max_in_flight_bytes = 1073741824
# Servers: a frame must arrive whole within this of its first byte.
frame_read_timeout_ms = 60000
# Servers: a connection with nothing in flight and no frame for this long is
# closed (clients reconnect on their next call).
idle_timeout_ms = 600000
# Client and server: the authentication handshake that starts every
# connection (see [security]) must finish within this.
handshake_timeout_ms = 5000
# Servers with a cluster key: connections that have not finished the
# handshake yet; one more closes the oldest of them (silent or slow peers
# cannot take the places of authenticated ones).
max_unauthenticated_connections = 1024

[security]
# The cluster key (64 hex digits; 0600): every RPC connection between
# processes is authenticated with it (docs/security.md). `fskv up` creates
# DIR/cluster.key and sets this in the configuration it passes to its
# children. Empty: the flag --cluster-key-file, the environment variable
# FSKV_CLUSTER_KEY_FILE, else DIR/cluster.key of a command that knows its
# data directory.
cluster_key_file = ""

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

[s3]
# The S3 gateway (`fskv gateway s3`; docs/s3.md). Virtual-hosted-style
# addressing: a request whose Host is <bucket>.<domain> (any port) for one of
# these domains names the bucket in the host and the key in the path; every
# other host (an IP address, a domain itself) is path style. "localhost":
# *.localhost resolves to loopback on most systems (RFC 6761), so
# http://bucket.localhost:9000 works with `fskv up` without DNS set-up.
# [] turns virtual-hosted style off.
virtual_host_domains = ["localhost"]
# Lifecycle rules (PutBucketLifecycleConfiguration) are applied by the S3
# writer: a scan every lifecycle_scan_interval_ms, at most
# lifecycle_max_actions_per_second deletes and aborts per second. Rules count
# in days of lifecycle_day_ms (24 h; shorter only for tests).
lifecycle_scan_interval_ms = 3600000
lifecycle_max_actions_per_second = 100
lifecycle_day_ms = 86400000

[front]
# `fskv front` (and `fskv up`, which runs everything through it): pools of
# gateway processes per protocol and role, started on demand. See docs/front.md.
# Requests in flight per process a pool aims at; above it the pool grows.
scale_up_in_flight = 32
# How long the load must want another process before one is added (a pool
# with no process starts one at once: the first request is held meanwhile).
scale_up_after_ms = 200
# Requests in flight on one process at most; beyond, requests are held.
max_in_flight_per_process = 256
# A process with nothing in flight this long is drained and stopped.
idle_timeout_ms = 60000
# Bound on a process's start (spawn to serving).
start_timeout_ms = 10000
# Requests held per pool while no process can take them, and for how long;
# beyond either: 503 with Retry-After.
max_queue = 1024
queue_timeout_ms = 15000
# After a crash or a failed start the next start waits this long, doubling
# per consecutive failure up to the maximum.
restart_backoff_ms = 200
max_restart_backoff_ms = 5000
# Static upstreams are probed (TCP connect) this often.
health_interval_ms = 2000
# SIGTERM to SIGKILL when a process is stopped.
stop_grace_ms = 10000
upstream_connect_timeout_ms = 2000
# Request sent to the gateway's response head (long polls included).
upstream_response_timeout_ms = 300000
# Idle pooled connections to a gateway are dropped after this (below
# gateway.idle_timeout_ms), and at most this many are kept per process.
upstream_idle_timeout_ms = 20000
max_idle_connections_per_process = 64
# An idempotent read (GET/HEAD without body) whose process failed before
# answering is sent again this many times.
max_retries = 1
# Gateway processes started by the front are reached over Unix sockets in a
# private temporary directory (cheaper per request than loopback TCP).
unix_sockets = true
# Threads of the front's runtime (0: a quarter of the CPUs, at least 1).
worker_threads = 0

# Per protocol: processes per pool (min..max; min 0 = start from zero), or
# static upstreams ("host:port" of gateways elsewhere) instead of processes.
[front.s3]
reader = { min = 0, max = 4 }
writer = { min = 0, max = 2 }
reader_upstreams = []
writer_upstreams = []

# KV native API: one writer (it runs the maintenance: eviction, TTL, stats).
[front.kv]
reader = { min = 0, max = 4 }
writer = { min = 0, max = 1 }
reader_upstreams = []
writer_upstreams = []

# The Consul API (`fskv gateway kv --consul-only --no-maintenance`).
[front.consul]
reader = { min = 0, max = 4 }
writer = { min = 0, max = 2 }
reader_upstreams = []
writer_upstreams = []

# MQ and SQS: at most one writer (it owns the partition leases; writer id mq-writer).
[front.mq]
reader = { min = 0, max = 4 }
writer = { min = 0, max = 1 }
reader_upstreams = []
writer_upstreams = []

[up]
# Data directory of `fskv up` (all state of the single-node cluster).
data_dir = "./data"
# Public ports (the front): S3 on base_port, KV on +1, MQ/SQS on +2, Consul on +3; internal services above +10.
base_port = 9000
"#;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub log: LogConfig,
    pub kv: KvConfig,
    pub rpc: RpcConfig,
    pub security: SecurityConfig,
    pub gateway: fskv_gateway::HttpLimits,
    pub front: fskv_front::FrontConfig,
    pub s3: S3Config,
    pub up: UpConfig,
}

/// `[s3]`: options of the S3 gateway that are not HTTP limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    pub virtual_host_domains: Vec<String>,
    pub lifecycle_scan_interval_ms: u64,
    pub lifecycle_max_actions_per_second: u32,
    pub lifecycle_day_ms: u64,
}

impl Default for S3Config {
    fn default() -> Self {
        let limits = fskv_gateway_s3::Limits::default();
        S3Config {
            virtual_host_domains: vec!["localhost".into()],
            lifecycle_scan_interval_ms: limits.lifecycle_scan_interval_ms,
            lifecycle_max_actions_per_second: limits.lifecycle_max_actions_per_second,
            lifecycle_day_ms: limits.lifecycle_day_ms,
        }
    }
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
    pub etcd_endpoints: Vec<String>,
    pub etcd_prefix: String,
    pub etcd_max_txn_ops: usize,
    pub etcd_max_request_bytes: usize,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            engine: "rocksdb".into(),
            path: "kv".into(),
            sync_writes: true,
            fdb_cluster_file: String::new(),
            etcd_endpoints: Vec::new(),
            etcd_prefix: "fskv/".into(),
            etcd_max_txn_ops: fskv_kv::etcd::ETCD_DEFAULT_MAX_TXN_OPS,
            etcd_max_request_bytes: fskv_kv::etcd::ETCD_DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

impl KvConfig {
    /// The engine spec understood by `fskv_kv::open_engine`, with the embedded
    /// engine's path resolved against `data_dir`.
    pub fn engine_spec(&self, data_dir: &Path) -> anyhow::Result<String> {
        match self.engine.as_str() {
            "rocksdb" => Ok(format!(
                "rocksdb:{}{}",
                data_dir.join(&self.path).display(),
                if self.sync_writes { "" } else { fskv_kv::ROCKSDB_NO_SYNC_SUFFIX }
            )),
            "memory" => Ok("memory".into()),
            "fdb" => Ok(format!("fdb:{}", self.fdb_cluster_file)),
            "etcd" => {
                anyhow::ensure!(!self.etcd_endpoints.is_empty(), "kv.engine = \"etcd\" needs kv.etcd_endpoints");
                anyhow::ensure!(
                    !self.etcd_prefix.is_empty() && !self.etcd_prefix.contains(['&', '?', '=']),
                    "kv.etcd_prefix must be non-empty and free of '&', '?' and '='"
                );
                let spec = format!(
                    "etcd:{}?prefix={}&max_txn_ops={}&max_request_bytes={}",
                    self.etcd_endpoints.join(","),
                    self.etcd_prefix,
                    self.etcd_max_txn_ops,
                    self.etcd_max_request_bytes
                );
                fskv_kv::EtcdOptions::parse(&spec["etcd:".len()..]).map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(spec)
            }
            other => anyhow::bail!("kv.engine = {other:?} is not one of \"rocksdb\", \"memory\", \"etcd\", \"fdb\""),
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
    pub max_connections: usize,
    pub max_in_flight_bytes: u64,
    pub frame_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub handshake_timeout_ms: u64,
    pub max_unauthenticated_connections: usize,
}

/// `[security]`: where the cluster key is (docs/security.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// Empty: not set here.
    pub cluster_key_file: PathBuf,
}

impl RpcConfig {
    /// The settings every RPC client and server of the process starts from.
    pub fn settings(&self) -> fskv_rpc::settings::RpcSettings {
        fskv_rpc::settings::RpcSettings {
            max_frame_bytes: usize::try_from(self.max_frame_bytes).unwrap_or(usize::MAX),
            connections_per_peer: self.connections_per_peer,
            max_in_flight_per_connection: self.max_inflight_per_connection,
            connect_timeout_ms: self.connect_timeout_ms,
            default_call_timeout_ms: self.default_call_timeout_ms,
            max_connections: self.max_connections,
            max_in_flight_bytes: usize::try_from(self.max_in_flight_bytes).unwrap_or(usize::MAX),
            frame_read_timeout_ms: self.frame_read_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            handshake_timeout_ms: self.handshake_timeout_ms,
            max_unauthenticated_connections: self.max_unauthenticated_connections,
        }
    }
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            max_frame_bytes: 80 << 20,
            connections_per_peer: 4,
            max_inflight_per_connection: 1024,
            connect_timeout_ms: 3000,
            default_call_timeout_ms: 30_000,
            max_connections: 4096,
            max_in_flight_bytes: 1 << 30,
            frame_read_timeout_ms: 60_000,
            idle_timeout_ms: 600_000,
            handshake_timeout_ms: 5_000,
            max_unauthenticated_connections: 1024,
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
        anyhow::ensure!(self.rpc.connect_timeout_ms >= 1, "rpc.connect_timeout_ms must be at least 1");
        anyhow::ensure!(self.rpc.max_connections >= 1, "rpc.max_connections must be at least 1");
        anyhow::ensure!(
            self.rpc.max_in_flight_bytes >= self.rpc.max_frame_bytes,
            "rpc.max_in_flight_bytes must be at least rpc.max_frame_bytes"
        );
        anyhow::ensure!(self.rpc.frame_read_timeout_ms >= 100, "rpc.frame_read_timeout_ms must be at least 100");
        anyhow::ensure!(self.rpc.idle_timeout_ms >= 1000, "rpc.idle_timeout_ms must be at least 1000");
        anyhow::ensure!(self.rpc.handshake_timeout_ms >= 100, "rpc.handshake_timeout_ms must be at least 100");
        anyhow::ensure!(self.rpc.max_unauthenticated_connections >= 1, "rpc.max_unauthenticated_connections must be at least 1");
        self.gateway.validate().map_err(anyhow::Error::msg)?;
        self.front.validate(self.gateway.idle_timeout_ms).map_err(anyhow::Error::msg)?;
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
    fn etcd_engine_spec_from_the_config() {
        let c = Config::parse("[kv]\nengine = \"etcd\"\netcd_endpoints = [\"http://10.77.0.11:2379\", \"http://10.77.0.12:2379\"]\netcd_max_txn_ops = 10000\n").unwrap();
        assert_eq!(
            c.kv.engine_spec(Path::new("/d")).unwrap(),
            "etcd:http://10.77.0.11:2379,http://10.77.0.12:2379?prefix=fskv/&max_txn_ops=10000&max_request_bytes=1572864"
        );
    }

    #[test]
    fn typos_and_bad_values_are_clear_errors() {
        let e = Config::parse("[kv]\nengnie = \"memory\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("unknown field"), "{e:#}");
        let e = Config::parse("[kv]\nengine = \"sqlite\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("sqlite"), "{e:#}");
        let e = Config::parse("[kv]\nengine = \"etcd\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("etcd_endpoints"), "{e:#}");
        let e = Config::parse("[kv]\nengine = \"etcd\"\netcd_endpoints = [\"https://a:2379\"]\n").unwrap_err();
        assert!(format!("{e:#}").contains("TLS"), "{e:#}");
        let e = Config::parse("[rpc]\nmax_frame_bytes = 10\n").unwrap_err();
        assert!(format!("{e:#}").contains("max_frame_bytes"), "{e:#}");
        let e = Config::parse("[gateway]\nidle_timeout_ms = 0\n").unwrap_err();
        assert!(format!("{e:#}").contains("idle_timeout_ms"), "{e:#}");
        let e = Config::parse("[front.s3]\nreader = { min = 2, max = 1 }\n").unwrap_err();
        assert!(format!("{e:#}").contains("front.s3.reader"), "{e:#}");
        let e = Config::parse("[front]\nupstream_idle_timeout_ms = 90000\n").unwrap_err();
        assert!(format!("{e:#}").contains("upstream_idle_timeout_ms"), "{e:#}");
        let e = Config::parse("[gateway]\nmetrics_endpoint = \"public\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("metrics_endpoint") || format!("{e:#}").contains("unknown variant"), "{e:#}");
    }
}
