//! Settings of one MQ gateway process, each with its default (docs/mq.md,
//! "Limits", has the table).

use crate::partition::WriterConfig;
use fskv_gateway::{HttpLimits, KeyStore, Role, TlsFiles};
use std::net::SocketAddr;
use std::sync::Arc;

/// Limits on what a client may ask for.
#[derive(Clone, Debug)]
pub struct MqLimits {
    /// Largest record value (topic default; a topic may set less).
    pub max_message_bytes: u64,
    /// Largest produce request body.
    pub max_produce_bytes: u64,
    /// Records in one produce request.
    pub max_records_per_produce: usize,
    /// Largest JSON control body.
    pub max_control_bytes: u64,
    /// Largest `max_bytes` of a fetch (and the default).
    pub max_fetch_bytes: u64,
    pub default_fetch_bytes: u64,
    /// Longest `wait_ms` of a fetch or receive.
    pub max_wait_ms: u64,
    pub max_partitions: u32,
    /// Messages one native receive may return.
    pub max_receive: usize,
    /// Longest visibility timeout (SQS: 12 hours).
    pub max_visibility_ms: u64,
    /// Segment size bounds a topic may choose.
    pub min_segment_bytes: u64,
    pub max_segment_bytes: u64,
}

impl Default for MqLimits {
    fn default() -> Self {
        MqLimits {
            max_message_bytes: 1 << 20,
            max_produce_bytes: 8 << 20,
            max_records_per_produce: 100_000,
            max_control_bytes: 4 << 20,
            max_fetch_bytes: 16 << 20,
            default_fetch_bytes: 1 << 20,
            max_wait_ms: 30_000,
            max_partitions: 1024,
            max_receive: 1000,
            max_visibility_ms: 12 * 3600 * 1000,
            min_segment_bytes: 4096,
            max_segment_bytes: 1 << 30,
        }
    }
}

/// Topic defaults for creates that do not say.
#[derive(Clone, Debug)]
pub struct TopicDefaults {
    pub partitions: u32,
    pub segment_bytes: u64,
    pub segment_ms: u64,
    pub dedup_window_ms: u64,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults { partitions: 1, segment_bytes: 64 << 20, segment_ms: 7 * 24 * 3600 * 1000, dedup_window_ms: 5 * 60 * 1000 }
    }
}

#[derive(Clone)]
pub struct MqConfig {
    pub listen: SocketAddr,
    pub role: Role,
    /// The writer a reader names when it refuses a mutation.
    pub writer_endpoint: Option<String>,
    pub tls: Option<TlsFiles>,
    pub http: HttpLimits,
    pub keys: Arc<KeyStore>,
    /// Region in SigV4 scopes (and in queue ARNs).
    pub region: String,
    /// The account id in SQS queue URLs and ARNs.
    pub account_id: String,
    /// Filesystem directory of the gateway's data.
    pub root_path: String,
    /// The public URL of this gateway (queue URLs; redirects). Empty: from the Host header.
    pub public_url: String,
    pub limits: MqLimits,
    pub defaults: TopicDefaults,
    pub writer: WriterConfig,
    /// How often a reader re-reads a partition's state while fetches wait on it.
    pub poll_interval_ms: u64,
}

impl MqConfig {
    pub fn new(listen: SocketAddr, role: Role, keys: Arc<KeyStore>) -> MqConfig {
        MqConfig {
            listen,
            role,
            writer_endpoint: None,
            tls: None,
            http: HttpLimits::default(),
            keys,
            region: "us-east-1".into(),
            account_id: "000000000000".into(),
            root_path: "/mq".into(),
            public_url: String::new(),
            limits: MqLimits::default(),
            defaults: TopicDefaults::default(),
            writer: WriterConfig::default(),
            poll_interval_ms: 5,
        }
    }
}
