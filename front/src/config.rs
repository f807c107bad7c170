//! The `[front]` section of the `fskv` configuration: how pools grow,
//! shrink and hold requests, the upstream connections, and per protocol the
//! bounds of its reader and writer pools (or their static upstreams).

use crate::machine::PoolSettings;
use fskv_gateway::Role;
use serde::{Deserialize, Serialize};

/// Bounds of one pool's number of processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolBounds {
    pub min: usize,
    pub max: usize,
}

/// The pools of one protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProtocolPools {
    pub reader: PoolBounds,
    pub writer: PoolBounds,
    /// Gateways on other hosts (`host:port`) serving this protocol's reads:
    /// when set, the reader pool is static (no process is started here).
    pub reader_upstreams: Vec<String>,
    /// Same for writes.
    pub writer_upstreams: Vec<String>,
}

impl Default for ProtocolPools {
    fn default() -> Self {
        ProtocolPools {
            reader: PoolBounds { min: 0, max: 4 },
            writer: PoolBounds { min: 0, max: 2 },
            reader_upstreams: Vec::new(),
            writer_upstreams: Vec::new(),
        }
    }
}

impl ProtocolPools {
    pub fn bounds(&self, role: Role) -> PoolBounds {
        match role {
            Role::Reader => self.reader,
            Role::Writer => self.writer,
        }
    }

    pub fn upstreams(&self, role: Role) -> &[String] {
        match role {
            Role::Reader => &self.reader_upstreams,
            Role::Writer => &self.writer_upstreams,
        }
    }
}

/// Every option of the front, with its default (docs/front.md has the table).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FrontConfig {
    /// Requests in flight per process a pool aims at; more and it grows.
    pub scale_up_in_flight: usize,
    /// How long the load must want another process before one is added to a
    /// pool that has one already (an empty pool starts one at once).
    pub scale_up_after_ms: u64,
    /// Requests in flight on one process at most; beyond, requests are held.
    pub max_in_flight_per_process: usize,
    /// A process with nothing in flight this long is drained and stopped.
    pub idle_timeout_ms: u64,
    /// Bound on a process's start (spawn to serving).
    pub start_timeout_ms: u64,
    /// Requests held per pool while no process can take them.
    pub max_queue: usize,
    /// Bound on a held request's wait; then 503 with Retry-After.
    pub queue_timeout_ms: u64,
    /// Delay before starting again after a crash or a failed start; doubles
    /// per consecutive failure up to `max_restart_backoff_ms`.
    pub restart_backoff_ms: u64,
    pub max_restart_backoff_ms: u64,
    /// Health probes of static upstreams (a TCP connect), this often.
    pub health_interval_ms: u64,
    /// SIGTERM to SIGKILL for a process being stopped.
    pub stop_grace_ms: u64,
    /// Connecting to a gateway process (or a probe).
    pub upstream_connect_timeout_ms: u64,
    /// Request sent to the response head from the gateway (long polls included).
    pub upstream_response_timeout_ms: u64,
    /// Idle pooled connections to a gateway are dropped after this; keep it
    /// below the gateways' `gateway.idle_timeout_ms`.
    pub upstream_idle_timeout_ms: u64,
    /// Idle pooled connections kept per gateway process.
    pub max_idle_connections_per_process: usize,
    /// An idempotent read (GET/HEAD without a body) whose process failed
    /// before answering is sent again, at most this many times.
    pub max_retries: u32,
    /// Reach the gateway processes the front starts over Unix sockets (in a
    /// private temporary directory) rather than loopback TCP.
    pub unix_sockets: bool,
    /// Hand accepted client connections on the routed listeners to the
    /// gateway process their first request goes to (needs `unix_sockets`;
    /// not with HTTPS): the front leaves that connection's data path.
    pub hand_over_connections: bool,
    /// A handed connection this old is closed after its next response
    /// (`Connection: close`), so that clients that keep connections open
    /// spread over the processes a pool has by then.
    pub handed_connection_max_age_ms: u64,
    /// Threads of the front's async runtime (0: a quarter of the CPUs, at
    /// least 1). The front's work per request is small; on a machine whose
    /// cores the gateways and storage need, fewer threads hand work between
    /// each other less.
    pub worker_threads: usize,
    pub s3: ProtocolPools,
    pub kv: ProtocolPools,
    /// The Consul-compatible API (processes of `fskv gateway kv --consul-only`).
    pub consul: ProtocolPools,
    pub mq: ProtocolPools,
}

impl Default for FrontConfig {
    fn default() -> Self {
        let p = PoolSettings::default();
        FrontConfig {
            scale_up_in_flight: p.scale_up_in_flight,
            scale_up_after_ms: p.scale_up_after_ms,
            max_in_flight_per_process: p.max_in_flight_per_process,
            idle_timeout_ms: p.idle_timeout_ms,
            start_timeout_ms: p.start_timeout_ms,
            max_queue: p.max_queue,
            queue_timeout_ms: p.queue_timeout_ms,
            restart_backoff_ms: p.restart_backoff_ms,
            max_restart_backoff_ms: p.max_restart_backoff_ms,
            health_interval_ms: p.health_interval_ms,
            stop_grace_ms: 10_000,
            upstream_connect_timeout_ms: 2_000,
            upstream_response_timeout_ms: 300_000,
            upstream_idle_timeout_ms: 20_000,
            max_idle_connections_per_process: 64,
            max_retries: 1,
            unix_sockets: true,
            hand_over_connections: true,
            handed_connection_max_age_ms: fskv_gateway::handover::DEFAULT_HANDED_MAX_AGE_MS,
            worker_threads: 0,
            s3: ProtocolPools::default(),
            // One KV writer: each writer runs the maintenance (eviction, TTL,
            // stats) on its own index; two would evict more than needed.
            kv: ProtocolPools { writer: PoolBounds { min: 0, max: 1 }, ..ProtocolPools::default() },
            consul: ProtocolPools::default(),
            mq: ProtocolPools { writer: PoolBounds { min: 0, max: 1 }, ..ProtocolPools::default() },
        }
    }
}

impl FrontConfig {
    /// The pools of a protocol by name.
    pub fn pools(&self, protocol: &str) -> Option<&ProtocolPools> {
        match protocol {
            "s3" => Some(&self.s3),
            "kv" => Some(&self.kv),
            "consul" => Some(&self.consul),
            "mq" => Some(&self.mq),
            _ => None,
        }
    }

    pub fn pools_mut(&mut self, protocol: &str) -> Option<&mut ProtocolPools> {
        match protocol {
            "s3" => Some(&mut self.s3),
            "kv" => Some(&mut self.kv),
            "consul" => Some(&mut self.consul),
            "mq" => Some(&mut self.mq),
            _ => None,
        }
    }

    /// The state machine's settings of one pool.
    pub fn pool_settings(&self, bounds: PoolBounds) -> PoolSettings {
        PoolSettings {
            min_processes: bounds.min,
            max_processes: bounds.max,
            scale_up_in_flight: self.scale_up_in_flight,
            scale_up_after_ms: self.scale_up_after_ms,
            max_in_flight_per_process: self.max_in_flight_per_process,
            idle_timeout_ms: self.idle_timeout_ms,
            start_timeout_ms: self.start_timeout_ms,
            max_queue: self.max_queue,
            queue_timeout_ms: self.queue_timeout_ms,
            restart_backoff_ms: self.restart_backoff_ms,
            max_restart_backoff_ms: self.max_restart_backoff_ms,
            health_interval_ms: self.health_interval_ms,
        }
    }

    /// Checks every value; `gateway_idle_timeout_ms` is the gateways'
    /// keep-alive bound (`gateway.idle_timeout_ms`).
    /// The front runtime's worker threads: `worker_threads`, or for 0 a
    /// quarter of `cpus` (at least 1).
    pub fn runtime_threads(&self, cpus: usize) -> usize {
        if self.worker_threads > 0 {
            self.worker_threads
        } else {
            (cpus / 4).max(1)
        }
    }

    pub fn validate(&self, gateway_idle_timeout_ms: u64) -> Result<(), String> {
        if self.worker_threads > 1024 {
            return Err(format!("front.worker_threads = {}: at most 1024", self.worker_threads));
        }
        for (name, pools) in [("s3", &self.s3), ("kv", &self.kv), ("consul", &self.consul), ("mq", &self.mq)] {
            for role in [Role::Reader, Role::Writer] {
                self.pool_settings(pools.bounds(role)).validate().map_err(|e| format!("front.{name}.{role}: {e}"))?;
                for u in pools.upstreams(role) {
                    if u.rsplit_once(':').and_then(|(h, p)| (!h.is_empty()).then(|| p.parse::<u16>().ok()).flatten()).is_none() {
                        return Err(format!("front.{name}.{role}_upstreams: {u:?} is not host:port"));
                    }
                }
            }
        }
        for (name, v) in [
            ("stop_grace_ms", self.stop_grace_ms),
            ("upstream_connect_timeout_ms", self.upstream_connect_timeout_ms),
            ("upstream_response_timeout_ms", self.upstream_response_timeout_ms),
            ("upstream_idle_timeout_ms", self.upstream_idle_timeout_ms),
            ("handed_connection_max_age_ms", self.handed_connection_max_age_ms),
        ] {
            if v == 0 {
                return Err(format!("front.{name} must be at least 1"));
            }
        }
        if self.upstream_idle_timeout_ms >= gateway_idle_timeout_ms {
            return Err(format!(
                "front.upstream_idle_timeout_ms ({}) must be below gateway.idle_timeout_ms ({gateway_idle_timeout_ms}): \
                 a pooled connection the gateway already closed would fail the request sent on it",
                self.upstream_idle_timeout_ms
            ));
        }
        if self.mq.writer.max > 1 && self.mq.writer_upstreams.is_empty() {
            return Err(format!(
                "front.mq.writer.max = {}: at most 1 (a second MQ writer would fight the first for the partition leases)",
                self.mq.writer.max
            ));
        }
        if self.max_restart_backoff_ms < self.restart_backoff_ms {
            return Err("front.max_restart_backoff_ms must be at least restart_backoff_ms".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        FrontConfig::default().validate(60_000).unwrap();
        let mut c = FrontConfig::default();
        c.s3.reader = PoolBounds { min: 3, max: 2 };
        assert!(c.validate(60_000).unwrap_err().contains("front.s3.reader"));
        let mut c = FrontConfig::default();
        c.kv.writer_upstreams = vec!["nohost".into()];
        assert!(c.validate(60_000).unwrap_err().contains("host:port"));
        let c = FrontConfig { upstream_idle_timeout_ms: 60_000, ..FrontConfig::default() };
        assert!(c.validate(60_000).unwrap_err().contains("upstream_idle_timeout_ms"));
        let c = FrontConfig { scale_up_in_flight: 0, ..FrontConfig::default() };
        assert!(c.validate(60_000).unwrap_err().contains("scale_up_in_flight"));
        let mut c = FrontConfig::default();
        c.mq.writer.max = 2;
        assert!(c.validate(60_000).unwrap_err().contains("front.mq.writer.max"));
        c.mq.writer_upstreams = vec!["10.0.0.1:9002".into()];
        c.validate(60_000).unwrap();
        let mut c = FrontConfig::default();
        c.consul.reader = PoolBounds { min: 2, max: 1 };
        assert!(c.validate(60_000).unwrap_err().contains("front.consul.reader"));
        let parsed: FrontConfig = toml_like_json(r#"{"consul": {"reader": {"min": 1, "max": 3}}}"#);
        assert_eq!(parsed.consul.reader, PoolBounds { min: 1, max: 3 });
        assert_eq!(parsed.kv.writer.max, 1);
    }

    fn toml_like_json(s: &str) -> FrontConfig {
        serde_json::from_str(s).unwrap()
    }
}
