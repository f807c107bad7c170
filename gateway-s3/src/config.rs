//! Gateway settings and limits, every one with its default.

use std::net::SocketAddr;

/// What a gateway process serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reads only; mutations get 403 ReadOnlyGateway naming the writer.
    Reader,
    /// Everything.
    Writer,
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
    /// Open client connections; more wait in the listen backlog.
    pub max_connections: usize,
    /// Part copies of one CompleteMultipartUpload / CopyObject in flight.
    pub copy_parallelism: usize,
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
            max_connections: 4096,
            copy_parallelism: 4,
        }
    }
}

/// One access key.
#[derive(Clone, Debug)]
pub struct AccessKey {
    pub access_key: String,
    pub secret_key: String,
}

/// PEM files of the certificate chain and private key for HTTPS.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert_path: std::path::PathBuf,
    pub key_path: std::path::PathBuf,
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
    pub keys: Vec<AccessKey>,
    pub limits: Limits,
    /// Serve HTTPS instead of HTTP.
    pub tls: Option<TlsFiles>,
}

impl GatewayConfig {
    pub fn new(listen: SocketAddr, role: Role, keys: Vec<AccessKey>) -> Self {
        GatewayConfig {
            listen,
            role,
            root_path: "/s3".into(),
            region: "us-east-1".into(),
            writer_endpoint: None,
            keys,
            limits: Limits::default(),
            tls: None,
        }
    }
}
