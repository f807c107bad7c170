//! Gateway settings and limits, every one with its default. Connection and
//! HTTP limits (timeouts, caps, header/URI/body sizes) are the shared
//! layer's [`HttpLimits`]; the limits here are S3's own.

pub use fskv_gateway::{AccessKey, HttpLimits, KeyStore, Role, TlsFiles};
use std::net::SocketAddr;
use std::sync::Arc;

/// Limits on requests, with S3's own where S3 has one.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest object a single PUT or a completed multipart upload makes.
    pub max_object_bytes: u64,
    /// Largest part of a multipart upload.
    pub max_part_bytes: u64,
    /// Smallest part but the last (S3: 5 MiB).
    pub min_part_bytes: u64,
    /// Part numbers are 1..=max_parts.
    pub max_parts: u32,
    /// Unacknowledged chunk writes of one PUT, in bytes.
    pub max_inflight_write_bytes: u64,
    /// Chunk reads of one GET in flight ahead of the client.
    pub readahead_pieces: usize,
    /// A multipart upload older than this is removed with its parts.
    pub multipart_expiry_ms: u64,
    /// Pause between scans for expired uploads.
    pub expiry_scan_interval_ms: u64,
    /// In-progress uploads listed per bucket (ListMultipartUploads reads them all).
    pub max_uploads_listed: usize,
    /// Keys in one DeleteObjects request (S3: 1000).
    pub max_delete_keys: usize,
    /// Part copies of one CompleteMultipartUpload / CopyObject in flight.
    pub copy_parallelism: usize,
    /// The length of a lifecycle "day" (rules count in days; tests shorten it).
    pub lifecycle_day_ms: u64,
    /// Pause between the writer's lifecycle scans.
    pub lifecycle_scan_interval_ms: u64,
    /// Deletes and aborts of a lifecycle scan per second, at most.
    pub lifecycle_max_actions_per_second: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_object_bytes: 5 << 40,
            max_part_bytes: 5 << 30,
            min_part_bytes: 5 << 20,
            max_parts: 10_000,
            max_inflight_write_bytes: 32 << 20,
            readahead_pieces: 8,
            multipart_expiry_ms: 7 * 24 * 3600 * 1000,
            expiry_scan_interval_ms: 3600 * 1000,
            max_uploads_listed: 10_000,
            max_delete_keys: 1000,
            copy_parallelism: 4,
            lifecycle_day_ms: 24 * 3600 * 1000,
            lifecycle_scan_interval_ms: 3600 * 1000,
            lifecycle_max_actions_per_second: 100,
        }
    }
}

#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    pub role: Role,
    /// Filesystem directory whose subdirectories are the buckets.
    pub root_path: String,
    /// Region reported by GetBucketLocation and expected in signatures.
    pub region: String,
    /// Named in a reader's refusal of writes.
    pub writer_endpoint: Option<String>,
    /// The access keys (the shared key store; s3s verifies signatures with them).
    pub keys: Arc<KeyStore>,
    pub limits: Limits,
    /// Connections, timeouts and request sizes (the shared layer's).
    pub http: HttpLimits,
    /// Serve HTTPS instead of HTTP.
    pub tls: Option<TlsFiles>,
    /// Domains under which `Host: <bucket>.<domain>` names the bucket
    /// (virtual-hosted style, `vhost.rs`); empty: path style only.
    pub virtual_host_domains: Vec<String>,
}

impl GatewayConfig {
    pub fn new(listen: SocketAddr, role: Role, keys: Arc<KeyStore>) -> Self {
        GatewayConfig {
            listen,
            role,
            root_path: "/s3".into(),
            region: "us-east-1".into(),
            writer_endpoint: None,
            keys,
            limits: Limits::default(),
            http: HttpLimits::default(),
            tls: None,
            virtual_host_domains: Vec::new(),
        }
    }
}
