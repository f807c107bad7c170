//! The cluster state mgmtd keeps, as a pure state machine: heartbeats in,
//! routing changes and recovery orders out. No I/O and no clock — `now_ms`
//! is an argument — so a simulation drives it exactly as the service does.
//!
//! * A heartbeat is a lease: it carries the node's **generation** (a number
//!   the storage service picks anew at every start, e.g. its start time). A
//!   heartbeat from an older generation than the one registered is rejected
//!   (`StaleGeneration`), so a replaced node cannot act. A newer generation
//!   means the node restarted: its targets' local states are taken from the
//!   new heartbeat.
//! * `tick(now_ms)` marks every node without a heartbeat for
//!   `heartbeat_timeout_ms` (T) as failed — its targets' local state becomes
//!   offline — then recomputes every chain with [`next_chain`]. Each changed
//!   chain bumps the routing version. A target that becomes syncing yields a
//!   [`SyncOrder`] for its sync source (`ChainRoles::sync_source_of`: its
//!   serving predecessor, the last serving target before it).

use crate::state::{next_chain, ChainView, LocalState, PublicState};
use fskv_proto::routing::ChainRoles;
use fskv_types::{ChainId, NodeId, TargetId};
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// T: a node with no heartbeat for this long is marked failed. Its storage
    /// service stops serving after T/2 without reaching mgmtd.
    pub heartbeat_timeout_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig { heartbeat_timeout_ms: 60_000 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRecord {
    pub node: NodeId,
    pub address: String,
    pub generation: u64,
    pub last_heartbeat_ms: u64,
    pub alive: bool,
}

/// A heartbeat from a storage service.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub node: NodeId,
    pub address: String,
    pub generation: u64,
    pub targets: Vec<(TargetId, LocalState)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatAck {
    /// The routing version the node should have; it pulls routing info if older.
    pub routing_version: u64,
    /// The node must stop serving if it cannot renew before this time (T/2).
    pub lease_expires_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatError {
    #[error("{node} heartbeat of generation {got} is older than the registered generation {registered}")]
    StaleGeneration { node: NodeId, got: u64, registered: u64 },
    /// The node was declared failed while this generation was registered:
    /// that process has stopped (it exits at T/2 without renewal), so the
    /// heartbeat is a stale one delivered late (e.g. from a socket buffer
    /// after a partition heals). Only a new generation brings the node back.
    #[error(
        "{node} heartbeat of generation {generation}, which was declared failed; only a restarted process (a newer generation) is accepted"
    )]
    DeclaredFailed { node: NodeId, generation: u64 },
    #[error("{node} reports {target}, which is not in any chain or belongs to another node")]
    UnknownTarget { node: NodeId, target: TargetId },
}

/// mgmtd's instruction to a predecessor: sync `target` of `chain`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncOrder {
    pub chain: ChainId,
    pub chain_version: u32,
    pub predecessor: TargetId,
    pub target: TargetId,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TickOutcome {
    pub failed_nodes: Vec<NodeId>,
    pub changed_chains: Vec<ChainId>,
    pub sync_orders: Vec<SyncOrder>,
}

/// Placement of a target: which node hosts it and which chain it is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetPlacement {
    pub node: NodeId,
    pub chain: ChainId,
}

pub struct ClusterState {
    config: ClusterConfig,
    nodes: BTreeMap<NodeId, NodeRecord>,
    placement: BTreeMap<TargetId, TargetPlacement>,
    chains: BTreeMap<ChainId, ChainView>,
    routing_version: u64,
}

impl ClusterState {
    /// A cluster whose chains start as given (e.g. from a generated chain
    /// table, every target serving with local state offline until it reports).
    pub fn new(config: ClusterConfig, chains: BTreeMap<ChainId, ChainView>, placement: BTreeMap<TargetId, TargetPlacement>) -> Self {
        ClusterState { config, nodes: BTreeMap::new(), placement, chains, routing_version: 1 }
    }

    pub fn routing_version(&self) -> u64 {
        self.routing_version
    }

    pub fn chains(&self) -> &BTreeMap<ChainId, ChainView> {
        &self.chains
    }

    pub fn nodes(&self) -> &BTreeMap<NodeId, NodeRecord> {
        &self.nodes
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    pub fn placement(&self) -> &BTreeMap<TargetId, TargetPlacement> {
        &self.placement
    }

    /// Restores the routing version persisted by a previous primary (a new
    /// primary continues from it so versions stay monotonic).
    pub fn set_routing_version(&mut self, version: u64) {
        self.routing_version = version;
    }

    /// Bumps the routing version for a change outside the chains (a node's
    /// address).
    pub fn bump_routing_version(&mut self) {
        self.routing_version += 1;
    }

    /// Takeover grace: registers `node` as alive with a heartbeat at
    /// `now_ms` (so it has T to report to the new primary before it is
    /// declared failed), keeping the generation a previous primary saw.
    pub fn restore_node(&mut self, node: NodeId, address: String, generation: u64, now_ms: u64) {
        self.nodes.insert(node, NodeRecord { node, address, generation, last_heartbeat_ms: now_ms, alive: true });
    }

    /// Takeover: until the first heartbeats, assume each target's local
    /// state matches its public state (serving → up-to-date, syncing /
    /// waiting → online, lastsrv / offline → offline), so the first tick
    /// changes nothing by itself.
    pub fn assume_local_states_from_public(&mut self) {
        for chain in self.chains.values_mut() {
            for t in chain.targets.iter_mut() {
                t.local = match t.public {
                    PublicState::Serving => LocalState::UpToDate,
                    PublicState::Syncing | PublicState::Waiting => LocalState::Online,
                    PublicState::LastSrv | PublicState::Offline => LocalState::Offline,
                };
            }
        }
    }

    /// Accepts (or fences) a heartbeat and records its targets' local states.
    pub fn heartbeat(&mut self, hb: &Heartbeat, now_ms: u64) -> Result<HeartbeatAck, HeartbeatError> {
        if let Some(n) = self.nodes.get(&hb.node) {
            if hb.generation < n.generation {
                return Err(HeartbeatError::StaleGeneration { node: hb.node, got: hb.generation, registered: n.generation });
            }
            if !n.alive && hb.generation == n.generation {
                return Err(HeartbeatError::DeclaredFailed { node: hb.node, generation: hb.generation });
            }
        }
        for (t, _) in &hb.targets {
            if self.placement.get(t).map(|p| p.node) != Some(hb.node) {
                return Err(HeartbeatError::UnknownTarget { node: hb.node, target: *t });
            }
        }
        self.nodes.insert(
            hb.node,
            NodeRecord { node: hb.node, address: hb.address.clone(), generation: hb.generation, last_heartbeat_ms: now_ms, alive: true },
        );
        for (t, local) in &hb.targets {
            self.set_local(*t, *local);
        }
        Ok(HeartbeatAck { routing_version: self.routing_version, lease_expires_ms: now_ms + self.config.heartbeat_timeout_ms / 2 })
    }

    fn set_local(&mut self, target: TargetId, local: LocalState) {
        let Some(p) = self.placement.get(&target) else { return };
        if let Some(chain) = self.chains.get_mut(&p.chain) {
            for t in chain.targets.iter_mut().filter(|t| t.target == target) {
                t.local = local;
            }
        }
    }

    /// Expires dead nodes and recomputes every chain.
    pub fn tick(&mut self, now_ms: u64) -> TickOutcome {
        let mut out = TickOutcome::default();
        let timeout = self.config.heartbeat_timeout_ms;
        let mut dead_targets = Vec::new();
        for n in self.nodes.values_mut().filter(|n| n.alive) {
            if now_ms.saturating_sub(n.last_heartbeat_ms) >= timeout {
                n.alive = false;
                out.failed_nodes.push(n.node);
            }
        }
        for (t, p) in &self.placement {
            let node_alive = self.nodes.get(&p.node).is_some_and(|n| n.alive);
            if !node_alive {
                dead_targets.push(*t);
            }
        }
        for t in dead_targets {
            self.set_local(t, LocalState::Offline);
        }
        for (id, chain) in self.chains.iter_mut() {
            let next = next_chain(chain);
            if next.version == chain.version {
                continue;
            }
            for t in &next.targets {
                let was_syncing = chain.member(t.target).is_some_and(|o| o.public == PublicState::Syncing);
                if t.public == PublicState::Syncing && !was_syncing {
                    if let Some(pred) = next.sync_source_of(t.target) {
                        out.sync_orders.push(SyncOrder {
                            chain: *id,
                            chain_version: next.version,
                            predecessor: pred.target,
                            target: t.target,
                        });
                    }
                }
            }
            *chain = next;
            out.changed_chains.push(*id);
        }
        if !out.changed_chains.is_empty() {
            self.routing_version += 1;
        }
        out
    }

    /// The head of `chain` (`ChainRoles::head`).
    pub fn head(&self, chain: ChainId) -> Option<TargetId> {
        self.chains.get(&chain).and_then(|c| c.head()).map(|t| t.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::TargetView;

    /// One chain of three targets on nodes 1..=3, all serving but not yet reported.
    fn cluster(timeout_ms: u64) -> ClusterState {
        let chain = ChainView {
            version: 1,
            targets: (1..=3)
                .map(|i| TargetView { target: TargetId(i), public: PublicState::Serving, local: LocalState::UpToDate })
                .collect(),
        };
        let placement = (1..=3).map(|i| (TargetId(i), TargetPlacement { node: NodeId(i as u32), chain: ChainId(1) })).collect();
        ClusterState::new(ClusterConfig { heartbeat_timeout_ms: timeout_ms }, [(ChainId(1), chain)].into(), placement)
    }

    fn hb(node: u32, generation: u64, local: LocalState) -> Heartbeat {
        Heartbeat {
            node: NodeId(node),
            address: format!("127.0.0.1:{}", 9000 + node),
            generation,
            targets: vec![(TargetId(node as u64), local)],
        }
    }

    fn states(c: &ClusterState) -> Vec<(u64, PublicState)> {
        c.chains()[&ChainId(1)].targets.iter().map(|t| (t.target.0, t.public)).collect()
    }

    #[test]
    fn silent_node_fails_after_timeout_and_moves_to_the_end() {
        let mut c = cluster(1_000);
        for n in 1..=3 {
            c.heartbeat(&hb(n, 1, LocalState::UpToDate), 0).unwrap();
        }
        assert!(c.tick(500).changed_chains.is_empty());
        c.heartbeat(&hb(2, 1, LocalState::UpToDate), 900).unwrap();
        c.heartbeat(&hb(3, 1, LocalState::UpToDate), 900).unwrap();
        let v = c.routing_version();
        let out = c.tick(1_000);
        assert_eq!(out.failed_nodes, vec![NodeId(1)]);
        assert_eq!(states(&c), vec![(2, PublicState::Serving), (3, PublicState::Serving), (1, PublicState::Offline)]);
        assert_eq!(c.routing_version(), v + 1);
        assert_eq!(c.head(ChainId(1)), Some(TargetId(2)));
    }

    #[test]
    fn restarted_node_syncs_from_its_predecessor_then_serves() {
        let mut c = cluster(1_000);
        for n in 1..=3 {
            c.heartbeat(&hb(n, 1, LocalState::UpToDate), 0).unwrap();
        }
        for n in 2..=3 {
            c.heartbeat(&hb(n, 1, LocalState::UpToDate), 900).unwrap();
        }
        c.tick(1_000);
        // Node 1 comes back with a new generation, data behind: online.
        c.heartbeat(&hb(1, 2, LocalState::Online), 1_100).unwrap();
        let out = c.tick(1_100);
        assert_eq!(states(&c), vec![(2, PublicState::Serving), (3, PublicState::Serving), (1, PublicState::Syncing)]);
        assert_eq!(out.sync_orders.len(), 1);
        assert_eq!(out.sync_orders[0].predecessor, TargetId(3));
        assert_eq!(out.sync_orders[0].target, TargetId(1));
        // After sync-done it reports up-to-date and becomes serving.
        for n in 2..=3 {
            c.heartbeat(&hb(n, 1, LocalState::UpToDate), 1_200).unwrap();
        }
        c.heartbeat(&hb(1, 2, LocalState::UpToDate), 1_200).unwrap();
        c.tick(1_200);
        assert_eq!(states(&c), vec![(2, PublicState::Serving), (3, PublicState::Serving), (1, PublicState::Serving)]);
    }

    #[test]
    fn stale_generation_is_fenced() {
        let mut c = cluster(1_000);
        c.heartbeat(&hb(1, 5, LocalState::UpToDate), 0).unwrap();
        let err = c.heartbeat(&hb(1, 4, LocalState::UpToDate), 10).unwrap_err();
        assert!(matches!(err, HeartbeatError::StaleGeneration { got: 4, registered: 5, .. }));
        // A stale heartbeat does not renew the lease.
        assert_eq!(c.nodes()[&NodeId(1)].last_heartbeat_ms, 0);
    }

    /// A heartbeat of a generation that was declared failed arrives late
    /// (it sat in a socket buffer during a partition): it must not revive
    /// the node; the restarted process (a newer generation) is accepted.
    #[test]
    fn a_failed_generation_is_fenced() {
        let mut c = cluster(1_000);
        c.heartbeat(&hb(1, 5, LocalState::UpToDate), 0).unwrap();
        let out = c.tick(1_000);
        assert_eq!(out.failed_nodes, vec![NodeId(1)]);
        let err = c.heartbeat(&hb(1, 5, LocalState::UpToDate), 1_100).unwrap_err();
        assert!(matches!(err, HeartbeatError::DeclaredFailed { generation: 5, .. }), "{err}");
        assert!(!c.nodes()[&NodeId(1)].alive, "the late heartbeat revived the node");
        c.heartbeat(&hb(1, 6, LocalState::Online), 1_200).unwrap();
        assert!(c.nodes()[&NodeId(1)].alive);
    }

    #[test]
    fn a_target_of_another_node_is_rejected() {
        let mut c = cluster(1_000);
        let bad = Heartbeat { node: NodeId(1), address: "x".into(), generation: 1, targets: vec![(TargetId(2), LocalState::UpToDate)] };
        assert!(matches!(c.heartbeat(&bad, 0), Err(HeartbeatError::UnknownTarget { .. })));
    }

    #[test]
    fn lease_is_half_the_timeout() {
        let mut c = cluster(60_000);
        let ack = c.heartbeat(&hb(1, 1, LocalState::UpToDate), 1_000).unwrap();
        assert_eq!(ack.lease_expires_ms, 31_000);
    }
}
