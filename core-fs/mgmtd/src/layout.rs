//! The cluster layout mgmtd is started with, and the bootstrap chain table.
//!
//! Ids (deterministic, documented in docs/mgmtd.md):
//! * storage nodes are `NodeId(1..=N)`;
//! * target `i` (0-based) of node `n` is `TargetId(n * 100 + i + 1)`, so a
//!   node hosts at most 99 targets and the node of a target is `id / 100`;
//! * chain `k` (0-based) of the generated table is `ChainId(k + 1)`; the
//!   single chain table is `table_id 1`.

use crate::chain_table::{self, ChainTableSpec};
use crate::cluster::TargetPlacement;
use crate::state::{ChainView, LocalState, PublicState, TargetView};
use fskv_types::{ChainId, NodeId, TargetId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Targets one node may host under the id scheme.
pub const MAX_TARGETS_PER_NODE: u32 = 99;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub nodes: u32,
    pub targets_per_node: u32,
    pub replicas: u32,
}

pub fn target_id(node: NodeId, index: u32) -> TargetId {
    TargetId(node.0 as u64 * 100 + index as u64 + 1)
}

pub fn node_of(target: TargetId) -> NodeId {
    NodeId((target.0 / 100) as u32)
}

impl Layout {
    pub fn validate(&self) -> Result<(), String> {
        if self.targets_per_node == 0 || self.targets_per_node > MAX_TARGETS_PER_NODE {
            return Err(format!("targets per node must be 1..={MAX_TARGETS_PER_NODE}, got {}", self.targets_per_node));
        }
        Ok(())
    }

    pub fn node_ids(&self) -> Vec<NodeId> {
        (1..=self.nodes).map(NodeId).collect()
    }

    /// The bootstrap chains: the generated table, every target serving.
    pub fn initial_chains(&self) -> Result<BTreeMap<ChainId, ChainView>, String> {
        self.validate()?;
        let spec = ChainTableSpec::new(self.nodes as usize, self.targets_per_node as usize, self.replicas as usize);
        let table = chain_table::generate(&spec).map_err(|e| e.to_string())?;
        let mut chains = BTreeMap::new();
        for (k, planned) in table.chains.iter().enumerate() {
            let targets = planned
                .nodes
                .iter()
                .zip(&planned.target_index)
                .map(|(&n, &i)| TargetView {
                    target: target_id(NodeId(n as u32 + 1), i as u32),
                    public: PublicState::Serving,
                    local: LocalState::UpToDate,
                })
                .collect();
            chains.insert(ChainId(k as u32 + 1), ChainView { version: 1, targets });
        }
        Ok(chains)
    }

    /// Where every target of `chains` lives.
    pub fn placement(chains: &BTreeMap<ChainId, ChainView>) -> BTreeMap<TargetId, TargetPlacement> {
        chains
            .iter()
            .flat_map(|(c, v)| v.targets.iter().map(move |t| (t.target, TargetPlacement { node: node_of(t.target), chain: *c })))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_documented_scheme() {
        let layout = Layout { nodes: 3, targets_per_node: 2, replicas: 3 };
        let chains = layout.initial_chains().unwrap();
        assert_eq!(chains.len(), 2);
        let placement = Layout::placement(&chains);
        assert_eq!(placement.len(), 6);
        for node in 1..=3u32 {
            for i in 0..2 {
                let t = target_id(NodeId(node), i);
                assert_eq!(placement[&t].node, NodeId(node));
                assert_eq!(node_of(t), NodeId(node));
            }
        }
        assert_eq!(target_id(NodeId(2), 0), TargetId(201));
        assert!(Layout { nodes: 3, targets_per_node: 100, replicas: 3 }.initial_chains().is_err());
    }
}
