//! Gateway settings and limits, every one with its default. Connection and
//! HTTP limits (timeouts, caps, header/URI/body sizes) are the shared
//! layer's [`HttpLimits`]; the limits here are the KV API's own, and
//! [`Maintenance`] paces the writer's background work. Per-namespace
//! settings (capacity, watermarks, default TTL) are [`NamespaceConfig`],
//! stored with the namespace.

use crate::frame::FrameLimits;
pub use fskv_gateway::{AccessKey, HttpLimits, KeyStore, Role, TlsFiles};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;

/// Limits of the KV API (see docs/kv.md, "Limits").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes (at most [`crate::keys::MAX_KEY_BYTES_LIMIT`]).
    pub max_key_bytes: usize,
    /// Largest value of a PUT or of one batch item.
    pub max_value_bytes: u64,
    /// Items in one batch request.
    pub max_batch_items: u32,
    /// Sum of the values of one batch put.
    pub max_batch_put_bytes: u64,
    /// Longest TTL.
    pub max_ttl_ms: u64,
    /// Longest exists-lease.
    pub max_lease_ms: u32,
    /// Items one scan page returns at most (`limit`).
    pub max_scan_limit: u32,
    /// Largest value a scan with `values=1` returns inline (larger: status TooLarge).
    pub max_scan_value_bytes: u64,
    /// Values up to this size are read whole before the response starts;
    /// larger ones stream in chunk-sized pieces with `readahead_chunks` in
    /// flight (memory per GET bounded by readahead × chunk size).
    pub whole_value_max_bytes: u64,
    /// Chunk reads of one streamed GET in flight ahead of the client.
    pub readahead_chunks: usize,
    /// Bytes of a batch get read ahead of the client (across its items).
    pub batch_readahead_bytes: u64,
    /// Unacknowledged chunk writes of one value.
    pub max_inflight_write_bytes: u64,
    /// Meta calls (lookups, publishes, deletes) of one batch in flight.
    pub batch_parallelism: usize,
    /// Longest `wait_ms` of a watch / Consul blocking query.
    pub max_watch_wait_ms: u64,
    /// `wait_ms` of a native watch that names none.
    pub default_watch_wait_ms: u64,
    /// How often a watch looks again (a change made through this process
    /// wakes it at once).
    pub watch_poll_interval_ms: u64,
    /// Keys a prefix watch or Consul recurse/keys query covers at most.
    pub max_watch_keys: usize,
    /// Largest Consul value (Consul's own limit: 512 KiB).
    pub max_consul_value_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 4096,
            max_value_bytes: 4 << 30,
            max_batch_items: 1024,
            max_batch_put_bytes: 4 << 30,
            max_ttl_ms: 10 * 365 * 24 * 3600 * 1000,
            max_lease_ms: 60_000,
            max_scan_limit: 10_000,
            max_scan_value_bytes: 64 << 10,
            whole_value_max_bytes: 4 << 20,
            readahead_chunks: 8,
            batch_readahead_bytes: 64 << 20,
            max_inflight_write_bytes: 32 << 20,
            batch_parallelism: 64,
            max_watch_wait_ms: 600_000,
            default_watch_wait_ms: 30_000,
            watch_poll_interval_ms: 100,
            max_watch_keys: 10_000,
            max_consul_value_bytes: 512 << 10,
        }
    }
}

impl Limits {
    pub fn frame(&self) -> FrameLimits {
        FrameLimits {
            max_items: self.max_batch_items,
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
            max_batch_put_bytes: self.max_batch_put_bytes,
            max_ttl_ms: self.max_ttl_ms,
            max_lease_ms: self.max_lease_ms,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.max_key_bytes == 0 || self.max_key_bytes > crate::keys::MAX_KEY_BYTES_LIMIT {
            return Err(format!("max_key_bytes must be 1..={}", crate::keys::MAX_KEY_BYTES_LIMIT));
        }
        if self.max_key_bytes > u16::MAX as usize {
            return Err("max_key_bytes must fit the frame's 16-bit key length".into());
        }
        if self.max_batch_items == 0 || self.readahead_chunks == 0 || self.batch_parallelism == 0 || self.watch_poll_interval_ms == 0 {
            return Err("max_batch_items, readahead_chunks, batch_parallelism and watch_poll_interval_ms must be at least 1".into());
        }
        Ok(())
    }
}

/// The writer's background work (recency merge, TTL expiry, eviction,
/// stats); readers only flush their access logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Maintenance {
    /// Run the writer's background work (one writer per cluster should;
    /// `fskv gateway kv --no-maintenance` on the others).
    pub enabled: bool,
    /// Every process writes the accesses it served (recency, hits, misses,
    /// in-flight reads) as one log file this often — not one metadata
    /// commit per GET.
    pub recency_flush_interval_ms: u64,
    /// Distinct keys an access log holds before it is flushed early.
    pub recency_max_entries: usize,
    /// How often the writer reads new access logs.
    pub merge_interval_ms: u64,
    /// How often expired keys are removed.
    pub ttl_sweep_interval_ms: u64,
    /// How often the writer rescans its namespaces (changes made through
    /// FUSE, S3 or other writers; new namespaces).
    pub rescan_interval_ms: u64,
    /// How often the merged recency is written as a checkpoint (access logs
    /// it covers are then removed).
    pub checkpoint_interval_ms: u64,
    /// Between picking eviction victims and removing them: accesses and
    /// leases reported meanwhile spare a victim. At least two flush intervals.
    pub eviction_confirm_ms: u64,
    /// Victims removed per eviction round at most.
    pub eviction_batch: usize,
    /// How often the writer publishes namespace stats for the readers.
    pub stats_interval_ms: u64,
    /// A PUT into a full namespace waits this long for eviction to make
    /// room before it fails (507).
    pub full_wait_ms: u64,
}

impl Default for Maintenance {
    fn default() -> Self {
        Maintenance {
            enabled: true,
            recency_flush_interval_ms: 500,
            recency_max_entries: 1_000_000,
            merge_interval_ms: 500,
            ttl_sweep_interval_ms: 250,
            rescan_interval_ms: 60_000,
            checkpoint_interval_ms: 60_000,
            eviction_confirm_ms: 1_500,
            eviction_batch: 1024,
            stats_interval_ms: 1_000,
            full_wait_ms: 5_000,
        }
    }
}

/// Settings of one namespace (stored as JSON in the xattr `user.kv.ns` of
/// its directory; `PUT /v1/ns/{ns}` sets them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Bytes of values the namespace holds at most (0: no limit).
    pub capacity_bytes: u64,
    /// Keys the namespace holds at most (0: no limit).
    pub capacity_keys: u64,
    /// Eviction starts above this fraction of a capacity...
    pub high_watermark: f64,
    /// ...and stops at or below this one.
    pub low_watermark: f64,
    /// TTL of a PUT that names none (0: none).
    pub default_ttl_ms: u64,
}

impl Default for NamespaceConfig {
    fn default() -> Self {
        NamespaceConfig { capacity_bytes: 0, capacity_keys: 0, high_watermark: 0.9, low_watermark: 0.8, default_ttl_ms: 0 }
    }
}

impl NamespaceConfig {
    pub fn validate(&self, limits: &Limits) -> Result<(), String> {
        if !(self.low_watermark > 0.0 && self.low_watermark < self.high_watermark && self.high_watermark <= 1.0) {
            return Err(format!(
                "watermarks must satisfy 0 < low_watermark < high_watermark <= 1 (got {} and {})",
                self.low_watermark, self.high_watermark
            ));
        }
        if self.default_ttl_ms > limits.max_ttl_ms {
            return Err(format!("default_ttl_ms is above max_ttl_ms ({})", limits.max_ttl_ms));
        }
        Ok(())
    }

    pub fn limited(&self) -> bool {
        self.capacity_bytes > 0 || self.capacity_keys > 0
    }
}

/// Everything one KV gateway process needs.
#[derive(Clone, Debug)]
pub struct KvConfig {
    pub listen: SocketAddr,
    /// The Consul-compatible API on its own port (None: not served).
    pub consul_listen: Option<SocketAddr>,
    /// The namespace Consul keys live in (made at start by a writer).
    pub consul_namespace: String,
    /// Serve the Consul API on `listen` and no native API (`consul_listen`
    /// unused): a process of the front's Consul pools, which learns one
    /// address per process.
    pub consul_only: bool,
    pub role: Role,
    /// Directory whose subdirectories are the namespaces.
    pub root_path: String,
    /// Named in a reader's refusal of writes (native API).
    pub writer_endpoint: Option<String>,
    /// Named in a reader's refusal of writes (Consul API).
    pub consul_writer_endpoint: Option<String>,
    /// Region expected in SigV4 signatures (service `kv`).
    pub region: String,
    pub keys: Arc<KeyStore>,
    pub limits: Limits,
    pub maintenance: Maintenance,
    /// Connections, timeouts and request sizes (the shared layer's).
    pub http: HttpLimits,
    pub tls: Option<TlsFiles>,
}

impl KvConfig {
    pub fn new(listen: SocketAddr, role: Role, keys: Arc<KeyStore>) -> Self {
        KvConfig {
            listen,
            consul_listen: None,
            consul_namespace: "consul".into(),
            consul_only: false,
            role,
            root_path: "/kv".into(),
            writer_endpoint: None,
            consul_writer_endpoint: None,
            region: "us-east-1".into(),
            keys,
            limits: Limits::default(),
            maintenance: Maintenance::default(),
            http: HttpLimits::default(),
            tls: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_config_checks() {
        let l = Limits::default();
        assert!(NamespaceConfig::default().validate(&l).is_ok());
        let bad = NamespaceConfig { low_watermark: 0.9, high_watermark: 0.8, ..Default::default() };
        assert!(bad.validate(&l).unwrap_err().contains("watermarks"));
        let parsed: NamespaceConfig = serde_json::from_str(r#"{"capacity_bytes": 100}"#).unwrap();
        assert_eq!(parsed.capacity_bytes, 100);
        assert!(serde_json::from_str::<NamespaceConfig>(r#"{"capacity": 1}"#).is_err());
        assert!(Limits::default().validate().is_ok());
        assert!(Limits { max_key_bytes: 70_000, ..Default::default() }.validate().is_err());
    }
}
