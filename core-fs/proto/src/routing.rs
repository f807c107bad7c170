//! Routing information: which node serves which target, how targets form
//! chains, and the public state of every target (docs/mgmtd.md, "Target states").
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
//!
//! ## Chain roles
//!
//! Every role is defined once, in [`ChainRoles`], over the targets in chain
//! order; [`ChainInfo`] (routing, storage, clients, tools) and mgmtd's
//! `ChainView` implement it. The **write chain** is the writable (serving +
//! syncing) targets in chain order; a write enters at its first target and
//! is forwarded target by target to its last.
//!
//! | role | definition | under the ordering contract |
//! |---|---|---|
//! | `writable()` | serving or syncing targets, in chain order | serving ones, then the syncing one |
//! | `readable()` | serving targets, in chain order | the first targets of the chain |
//! | `head()` | the first writable target, if it is serving (takes client writes) | the first serving target |
//! | `tail()` | the last serving target (its data is committed) | the last serving target |
//! | `writable_tail()` | the last writable target (commits a write at once) | the syncing target if any, else `tail()` |
//! | `predecessor_of(t)` | the writable target before writable `t` | |
//! | `successor_of(t)` | the writable target after writable `t` | |
//! | `sync_source_of(t)` | `predecessor_of(t)`, when `t` is syncing and it is serving (it recovers `t`) | the last serving target |
//! | `sync_target_of(t)` | `successor_of(t)`, when `t` is serving and it is syncing (the inverse) | |
//!
//! A target that is not writable (waiting, lastsrv, offline, or not in the
//! chain) has no predecessor and no successor. A chain whose first writable
//! target is syncing (impossible under the contract) has no head: a syncing
//! target never takes client writes, and a serving one after it has a
//! predecessor.

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

/// A chain entry the role rules read: its target and its public state.
pub trait ChainMember {
    fn target_id(&self) -> TargetId;
    fn public_state(&self) -> PublicTargetState;
}

impl ChainMember for ChainTarget {
    fn target_id(&self) -> TargetId {
        self.target_id
    }
    fn public_state(&self) -> PublicTargetState {
        self.state
    }
}

/// The chain roles (table in the module doc), defined once over the
/// targets in chain order. Implemented by [`ChainInfo`], by a slice of
/// chain entries, and by mgmtd's chain view.
pub trait ChainRoles {
    type Member: ChainMember;

    /// The targets in chain order (per the ordering contract).
    fn members(&self) -> &[Self::Member];

    /// The entry of target `id`.
    fn member(&self, id: TargetId) -> Option<&Self::Member> {
        self.members().iter().find(|t| t.target_id() == id)
    }

    /// The write chain: targets that take writes (serving, syncing), in
    /// chain order.
    fn writable(&self) -> impl DoubleEndedIterator<Item = &Self::Member> {
        self.members().iter().filter(|t| t.public_state().can_write())
    }

    /// Targets that serve reads (serving), in chain order.
    fn readable(&self) -> impl DoubleEndedIterator<Item = &Self::Member> {
        self.members().iter().filter(|t| t.public_state().can_read())
    }

    /// The head: the first writable target, if it is serving. Client
    /// writes go here; under the ordering contract it is the first serving
    /// target.
    fn head(&self) -> Option<&Self::Member> {
        self.writable().next().filter(|t| t.public_state() == PublicTargetState::Serving)
    }

    /// The tail: the last serving target. It holds only committed data (a
    /// write is acknowledged only once it committed there).
    fn tail(&self) -> Option<&Self::Member> {
        self.readable().next_back()
    }

    /// The end of the write chain: the last writable target, which commits
    /// a write as soon as it applies it. The syncing target while one
    /// syncs, else [`Self::tail`].
    fn writable_tail(&self) -> Option<&Self::Member> {
        self.writable().next_back()
    }

    /// The writable target before `id` in the write chain; `None` for the
    /// first one and for a target that is not writable.
    fn predecessor_of(&self, id: TargetId) -> Option<&Self::Member> {
        let mut prev = None;
        for t in self.writable() {
            if t.target_id() == id {
                return prev;
            }
            prev = Some(t);
        }
        None
    }

    /// The writable target after `id` in the write chain; `None` for the
    /// last one and for a target that is not writable.
    fn successor_of(&self, id: TargetId) -> Option<&Self::Member> {
        let mut it = self.writable().skip_while(|t| t.target_id() != id);
        it.next()?;
        it.next()
    }

    /// The target that recovers syncing target `id`: its predecessor, if
    /// that one is serving. Under the ordering contract, the last serving
    /// target.
    fn sync_source_of(&self, id: TargetId) -> Option<&Self::Member> {
        if self.member(id)?.public_state() != PublicTargetState::Syncing {
            return None;
        }
        self.predecessor_of(id).filter(|p| p.public_state() == PublicTargetState::Serving)
    }

    /// The syncing target `id` must recover: its successor, if `id` is
    /// serving and the successor is syncing (the inverse of
    /// [`Self::sync_source_of`]).
    fn sync_target_of(&self, id: TargetId) -> Option<&Self::Member> {
        if self.member(id)?.public_state() != PublicTargetState::Serving {
            return None;
        }
        self.successor_of(id).filter(|s| s.public_state() == PublicTargetState::Syncing)
    }
}

impl ChainRoles for ChainInfo {
    type Member = ChainTarget;
    fn members(&self) -> &[ChainTarget] {
        &self.targets
    }
}

impl<M: ChainMember> ChainRoles for [M] {
    type Member = M;
    fn members(&self) -> &[M] {
        self
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
        self.chains.iter().find_map(|c| c.member(target).map(|t| (c, t)))
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

    use PublicTargetState::*;

    fn chain_of(states: &[PublicTargetState]) -> ChainInfo {
        ChainInfo {
            chain_id: ChainId(1),
            chain_version: 1,
            targets: states
                .iter()
                .enumerate()
                .map(|(i, &state)| ChainTarget { target_id: TargetId(i as u64 + 1), node_id: NodeId(i as u32 + 1), state })
                .collect(),
        }
    }

    fn id(t: Option<&ChainTarget>) -> Option<u64> {
        t.map(|t| t.target_id.0)
    }

    #[test]
    fn roles_of_a_chain_in_contract_order() {
        let c = chain_of(&[Serving, Serving, LastSrv, Syncing, Waiting, Offline]);
        assert_eq!(c.writable().map(|t| t.target_id.0).collect::<Vec<_>>(), vec![1, 2, 4]);
        assert_eq!(c.readable().map(|t| t.target_id.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(id(c.head()), Some(1));
        assert_eq!(id(c.tail()), Some(2));
        assert_eq!(id(c.writable_tail()), Some(4));
        assert_eq!((id(c.predecessor_of(TargetId(1))), id(c.successor_of(TargetId(1)))), (None, Some(2)));
        assert_eq!((id(c.predecessor_of(TargetId(2))), id(c.successor_of(TargetId(2)))), (Some(1), Some(4)));
        assert_eq!((id(c.predecessor_of(TargetId(4))), id(c.successor_of(TargetId(4)))), (Some(2), None));
        // Not writable, or not in the chain: no neighbours.
        for t in [3, 5, 6, 9] {
            assert_eq!((id(c.predecessor_of(TargetId(t))), id(c.successor_of(TargetId(t)))), (None, None), "target {t}");
        }
        assert_eq!(id(c.sync_source_of(TargetId(4))), Some(2));
        assert_eq!(id(c.sync_target_of(TargetId(2))), Some(4));
        assert_eq!(id(c.sync_target_of(TargetId(1))), None);
        assert_eq!(id(c.sync_source_of(TargetId(2))), None);
        // The slice of entries answers the same.
        assert_eq!(c.targets.head().map(|t| t.target_id.0), Some(1));
    }

    #[test]
    fn chains_without_serving_or_writable_targets_have_no_roles() {
        for c in [chain_of(&[]), chain_of(&[LastSrv, Waiting, Offline]), chain_of(&[Syncing, Waiting])] {
            assert_eq!((id(c.head()), id(c.tail())), (None, None), "{c:?}");
            assert_eq!(id(c.sync_source_of(TargetId(1))), None);
        }
        // Outside the contract a syncing target first in the write chain is
        // never the head, and the serving target after it has a predecessor.
        let c = chain_of(&[Syncing, Serving]);
        assert_eq!((id(c.head()), id(c.tail()), id(c.writable_tail())), (None, Some(2), Some(2)));
        assert_eq!(id(c.predecessor_of(TargetId(2))), Some(1));
    }

    /// Every chain of up to four targets in any state and any order.
    fn every_chain() -> impl Iterator<Item = ChainInfo> {
        const ALL: [PublicTargetState; 5] = [Serving, Syncing, Waiting, LastSrv, Offline];
        (0..=4u32).flat_map(|n| {
            (0..5usize.pow(n)).map(move |mut code| {
                let states: Vec<_> = (0..n)
                    .map(|_| {
                        let s = ALL[code % 5];
                        code /= 5;
                        s
                    })
                    .collect();
                chain_of(&states)
            })
        })
    }

    #[test]
    fn neighbours_and_sync_roles_are_inverse_in_every_chain() {
        for c in every_chain() {
            for a in &c.targets {
                for b in &c.targets {
                    let (a, b) = (a.target_id, b.target_id);
                    assert_eq!(id(c.successor_of(a)) == Some(b.0), id(c.predecessor_of(b)) == Some(a.0), "{c:?} {a} {b}");
                    assert_eq!(id(c.sync_target_of(a)) == Some(b.0), id(c.sync_source_of(b)) == Some(a.0), "{c:?} {a} {b}");
                }
            }
            if let Some(h) = c.head() {
                assert_eq!(c.predecessor_of(h.target_id), None);
            }
            if let Some(t) = c.writable_tail() {
                assert_eq!(c.successor_of(t.target_id), None);
            }
        }
    }

    #[test]
    fn under_the_ordering_contract_head_is_first_serving_and_the_sync_source_last_serving() {
        for mut c in every_chain() {
            c.targets.sort_by_key(|t| t.state.chain_order());
            let first_serving = c.targets.iter().find(|t| t.state == Serving);
            let last_serving = c.targets.iter().rev().find(|t| t.state == Serving);
            assert_eq!(id(c.head()), id(first_serving), "{c:?}");
            assert_eq!(id(c.tail()), id(last_serving), "{c:?}");
            let syncing: Vec<_> = c.targets.iter().filter(|t| t.state == Syncing).collect();
            if let [only] = syncing[..] {
                assert_eq!(id(c.sync_source_of(only.target_id)), id(last_serving), "{c:?}");
                assert_eq!(id(c.writable_tail()), Some(only.target_id.0));
            }
        }
    }
}
