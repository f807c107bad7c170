//! Routing information: which node serves which target, how targets form
//! chains, and the public state of every target (SPEC §6).
//!
//! mgmtd produces a [`RoutingInfo`]; every storage service and client caches
//! the latest one and refreshes it when a request fails with a stale chain
//! version. The types are plain data (no I/O) so that the producer (mgmtd),
//! the consumers (storage service, storage client) and tests share them.
//!
//! Ordering contract (mgmtd keeps it): the targets of a chain are listed
//! serving first, then lastsrv, syncing, waiting, offline, keeping the old
//! order inside each group. So the head is the first serving target and a
//! syncing target always comes after every serving one.

use fskv_types::ids::{ChainId, NodeId, TargetId};
use serde::{Deserialize, Serialize};

/// The public state of a target, as listed in the chain table.
///
/// | state   | read | write | meaning |
/// |---------|------|-------|---------|
/// | Serving | yes  | yes   | alive, serving clients |
/// | Syncing | no   | yes   | alive, recovery in progress (receives full-chunk replaces) |
/// | Waiting | no   | no    | alive, recovery not started |
/// | LastSrv | no   | no    | down, and it was the last serving target of its chain |
/// | Offline | no   | no    | down, or its medium failed |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PublicTargetState {
    Serving,
    Syncing,
    Waiting,
    LastSrv,
    Offline,
}

impl PublicTargetState {
    /// Position of the state's group in a chain: serving, lastsrv, syncing,
    /// waiting, offline (the ordering contract above).
    pub fn chain_order(self) -> u8 {
        match self {
            PublicTargetState::Serving => 0,
            PublicTargetState::LastSrv => 1,
            PublicTargetState::Syncing => 2,
            PublicTargetState::Waiting => 3,
            PublicTargetState::Offline => 4,
        }
    }

    /// Whether a target in this state serves reads.
    pub fn can_read(self) -> bool {
        self == PublicTargetState::Serving
    }

    /// Whether a target in this state takes writes (from a client at the
    /// head, or forwarded by its predecessor).
    pub fn can_write(self) -> bool {
        matches!(self, PublicTargetState::Serving | PublicTargetState::Syncing)
    }
}

/// The local state a storage service reports for one of its targets in
/// heartbeats (kept in mgmtd's memory, not in the chain table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalTargetState {
    /// Serving clients with complete data.
    UpToDate,
    /// Alive, but its data may be behind (syncing or waiting).
    Online,
    /// Service down or medium failed.
    Offline,
}

/// A process known to mgmtd and where to reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node_id: NodeId,
    /// RPC address, `host:port`.
    pub address: String,
}

/// One target in a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainTarget {
    pub target_id: TargetId,
    /// The storage node hosting the target.
    pub node_id: NodeId,
    pub state: PublicTargetState,
}

/// An ordered chain of targets holding the same chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainInfo {
    pub chain_id: ChainId,
    /// Bumped by mgmtd on every change of the chain (order or states).
    /// Requests carry it; a mismatch is answered `StaleChainVersion`.
    pub chain_version: u32,
    /// Ordered per the module-level ordering contract.
    pub targets: Vec<ChainTarget>,
}

impl ChainInfo {
    /// The head: the first serving target (writes from clients go here).
    pub fn head(&self) -> Option<&ChainTarget> {
        self.targets.iter().find(|t| t.state == PublicTargetState::Serving)
    }

    /// Targets that serve reads, in chain order.
    pub fn readable(&self) -> impl Iterator<Item = &ChainTarget> {
        self.targets.iter().filter(|t| t.state.can_read())
    }

    pub fn target(&self, id: TargetId) -> Option<&ChainTarget> {
        self.targets.iter().find(|t| t.target_id == id)
    }
}

/// A named list of chains a file layout picks from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainTable {
    pub table_id: u32,
    pub table_version: u32,
    pub chains: Vec<ChainId>,
}

/// Everything a client or service needs to route a request. Versioned as a
/// whole: any change produces a higher `version`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingInfo {
    pub version: u64,
    pub nodes: Vec<NodeInfo>,
    pub chains: Vec<ChainInfo>,
    #[serde(default)]
    pub chain_tables: Vec<ChainTable>,
    /// The meta servers that heartbeat to mgmtd recently, in node-id order:
    /// where clients find meta without being told (`--meta` is optional).
    #[serde(default)]
    pub meta_servers: Vec<NodeInfo>,
}

impl RoutingInfo {
    pub fn chain(&self, id: ChainId) -> Option<&ChainInfo> {
        self.chains.iter().find(|c| c.chain_id == id)
    }

    pub fn node_address(&self, id: NodeId) -> Option<&str> {
        self.nodes.iter().find(|n| n.node_id == id).map(|n| n.address.as_str())
    }

    /// The chain holding `target` and the target's entry in it.
    pub fn locate_target(&self, target: TargetId) -> Option<(&ChainInfo, &ChainTarget)> {
        self.chains.iter().find_map(|c| c.target(target).map(|t| (c, t)))
    }

    /// Targets hosted by `node`.
    pub fn targets_of_node(&self, node: NodeId) -> Vec<TargetId> {
        self.chains.iter().flat_map(|c| c.targets.iter()).filter(|t| t.node_id == node).map(|t| t.target_id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_is_first_serving_and_states_gate_io() {
        let chain = ChainInfo {
            chain_id: ChainId(1),
            chain_version: 3,
            targets: vec![
                ChainTarget { target_id: TargetId(10), node_id: NodeId(1), state: PublicTargetState::Offline },
                ChainTarget { target_id: TargetId(11), node_id: NodeId(2), state: PublicTargetState::Serving },
                ChainTarget { target_id: TargetId(12), node_id: NodeId(3), state: PublicTargetState::Syncing },
            ],
        };
        assert_eq!(chain.head().map(|t| t.target_id), Some(TargetId(11)));
        assert_eq!(chain.readable().count(), 1);
        assert!(PublicTargetState::Syncing.can_write() && !PublicTargetState::Syncing.can_read());
        assert!(!PublicTargetState::Waiting.can_write());
        let info = RoutingInfo { version: 1, chains: vec![chain], ..Default::default() };
        assert_eq!(info.locate_target(TargetId(12)).map(|(c, _)| c.chain_id), Some(ChainId(1)));
        assert_eq!(info.targets_of_node(NodeId(2)), vec![TargetId(11)]);
    }
}
