//! The meta servers mgmtd knows, as a pure state machine (no I/O, no clock:
//! `now_ms` is an argument), so clients find meta through routing info as
//! in 3FS instead of needing `--meta`.
//!
//! | event | rule |
//! |---|---|
//! | heartbeat, unknown server | registered, alive, listed from the next publish |
//! | heartbeat, generation older than registered | refused (`StaleGeneration`): a replaced process cannot re-announce itself |
//! | heartbeat, same or newer generation | renews; a new address or generation replaces the old |
//! | no heartbeat for `timeout_ms` | not alive: left out of routing info (kept registered, so its generation still fences) |
//! | takeover | a new primary restores the persisted servers as alive from `now`, so each has `timeout_ms` to report |
//!
//! Routing info lists the alive servers in node-id order
//! ([`MetaRegistry::alive`]); mgmtd bumps the routing version when that list
//! changes.

use crate::cluster::HeartbeatError;
use fskv_proto::routing::NodeInfo;
use fskv_types::NodeId;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaServerRecord {
    pub address: String,
    pub generation: u64,
    pub last_heartbeat_ms: u64,
}

#[derive(Clone, Debug, Default)]
pub struct MetaRegistry {
    servers: BTreeMap<NodeId, MetaServerRecord>,
}

impl MetaRegistry {
    /// Accepts (or fences) a meta server's heartbeat.
    pub fn heartbeat(&mut self, node: NodeId, address: &str, generation: u64, now_ms: u64) -> Result<(), HeartbeatError> {
        if let Some(r) = self.servers.get(&node) {
            if generation < r.generation {
                return Err(HeartbeatError::StaleGeneration { node, got: generation, registered: r.generation });
            }
        }
        self.servers.insert(node, MetaServerRecord { address: address.to_string(), generation, last_heartbeat_ms: now_ms });
        Ok(())
    }

    /// Takeover grace: `node` counts as alive from `now_ms`.
    pub fn restore(&mut self, node: NodeId, address: String, generation: u64, now_ms: u64) {
        self.servers.insert(node, MetaServerRecord { address, generation, last_heartbeat_ms: now_ms });
    }

    /// The servers that heartbeat within `timeout_ms` of `now_ms`, in node-id order.
    pub fn alive(&self, now_ms: u64, timeout_ms: u64) -> Vec<NodeInfo> {
        self.servers
            .iter()
            .filter(|(_, r)| now_ms.saturating_sub(r.last_heartbeat_ms) < timeout_ms && !r.address.is_empty())
            .map(|(id, r)| NodeInfo { node_id: *id, address: r.address.clone() })
            .collect()
    }

    pub fn records(&self) -> &BTreeMap<NodeId, MetaServerRecord> {
        &self.servers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_renews_fences_and_expires() {
        let mut r = MetaRegistry::default();
        r.heartbeat(NodeId(2), "127.0.0.1:2", 5, 1_000).expect("register");
        r.heartbeat(NodeId(1), "127.0.0.1:1", 7, 1_000).expect("register");
        let ids = |v: Vec<NodeInfo>| v.into_iter().map(|n| (n.node_id.0, n.address)).collect::<Vec<_>>();
        assert_eq!(ids(r.alive(1_500, 1_000)), vec![(1, "127.0.0.1:1".into()), (2, "127.0.0.1:2".into())]);
        // An older generation of node 1 is fenced and changes nothing.
        assert!(matches!(
            r.heartbeat(NodeId(1), "127.0.0.1:9", 6, 1_200),
            Err(HeartbeatError::StaleGeneration { got: 6, registered: 7, .. })
        ));
        // A restart (newer generation) on another address replaces the record.
        r.heartbeat(NodeId(2), "127.0.0.1:22", 6, 1_900).expect("restart");
        // Node 1 stops: gone after the timeout, node 2 still listed.
        assert_eq!(ids(r.alive(2_100, 1_000)), vec![(2, "127.0.0.1:22".into())]);
        // ... and its generation still fences a stale process.
        assert!(r.heartbeat(NodeId(1), "127.0.0.1:1", 6, 2_200).is_err());
        // Takeover grace.
        let mut fresh = MetaRegistry::default();
        fresh.restore(NodeId(1), "127.0.0.1:1".into(), 7, 10_000);
        assert_eq!(fresh.alive(10_999, 1_000).len(), 1);
        assert_eq!(fresh.alive(11_000, 1_000).len(), 0);
    }
}
