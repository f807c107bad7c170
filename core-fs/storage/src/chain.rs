//! Pure chain logic (no I/O, no clock): where a target sits in its chain,
//! whether it may take a write or a read, and where a write goes next.
//!
//! The roles themselves (head, predecessor, successor, writable tail, sync
//! source) are defined once, by `fskv_proto::routing::ChainRoles` on
//! [`ChainInfo`]; this module turns them into a target's [`ChainPosition`]
//! and the admission checks. Every routing decision of the service goes
//! through these functions (the write path through the CRAQ step,
//! [`crate::craq`]), so a simulator can drive them deterministically.

use fskv_proto::routing::{ChainInfo, ChainRoles, ChainTarget, PublicTargetState};
use fskv_types::{NodeId, TargetId};

/// Where a write came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A client: only the head takes it.
    Client,
    /// Forwarded by this predecessor target.
    Predecessor(TargetId),
}

/// How a write is forwarded to the successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardKind {
    /// Same update, applied as pending `committed + 1` (CRAQ).
    Update,
    /// The whole chunk content as committed version: the successor is
    /// syncing (docs/storage.md: a syncing target takes full-chunk-replace writes).
    FullReplace,
}

/// The next target of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Successor {
    pub target: TargetId,
    pub node: NodeId,
    pub kind: ForwardKind,
}

/// A target's place among the targets that take writes (serving and
/// syncing, in chain order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainPosition {
    pub state: PublicTargetState,
    /// First writable target (the head takes client writes).
    pub is_head: bool,
    pub predecessor: Option<TargetId>,
    /// `None`: this target is the tail (commits at once).
    pub successor: Option<Successor>,
}

/// Why a request is refused by routing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteReject {
    /// The target is not in the chain.
    NotInChain,
    /// The request's chain version differs from the known one.
    StaleChainVersion { request: u32, current: u32 },
    /// The public state does not allow the operation.
    NotServing { state: PublicTargetState },
    /// A client write reached a target that is not the head.
    NotHead,
    /// A forward came from a target that is not this one's predecessor.
    WrongPredecessor { expected: Option<TargetId>, got: TargetId },
}

fn successor(t: &ChainTarget) -> Successor {
    let kind = if t.state == PublicTargetState::Syncing { ForwardKind::FullReplace } else { ForwardKind::Update };
    Successor { target: t.target_id, node: t.node_id, kind }
}

/// The position of `me` in `chain`, or `None` if it is not in the chain.
pub fn position(chain: &ChainInfo, me: TargetId) -> Option<ChainPosition> {
    let entry = chain.member(me)?;
    Some(ChainPosition {
        state: entry.state,
        is_head: chain.head().is_some_and(|h| h.target_id == me),
        predecessor: chain.predecessor_of(me).map(|t| t.target_id),
        successor: chain.successor_of(me).map(successor),
    })
}

fn check_version(chain: &ChainInfo, request: u32) -> Result<(), RouteReject> {
    if request != chain.chain_version {
        return Err(RouteReject::StaleChainVersion { request, current: chain.chain_version });
    }
    Ok(())
}

/// Decides whether `me` takes a write routed with `chain_ver` from `origin`,
/// and where it goes next. Order of checks: chain version (stale first, so
/// the client refreshes), membership, public state, then the role.
pub fn check_write(chain: &ChainInfo, me: TargetId, chain_ver: u32, origin: Origin) -> Result<ChainPosition, RouteReject> {
    check_version(chain, chain_ver)?;
    let pos = position(chain, me).ok_or(RouteReject::NotInChain)?;
    if !pos.state.can_write() {
        return Err(RouteReject::NotServing { state: pos.state });
    }
    match origin {
        Origin::Client if !pos.is_head => Err(RouteReject::NotHead),
        Origin::Predecessor(from) if pos.predecessor != Some(from) => {
            Err(RouteReject::WrongPredecessor { expected: pos.predecessor, got: from })
        }
        _ => Ok(pos),
    }
}

/// Decides whether `me` serves a read routed with `chain_ver`: only serving
/// targets do.
pub fn check_read(chain: &ChainInfo, me: TargetId, chain_ver: u32) -> Result<(), RouteReject> {
    check_version(chain, chain_ver)?;
    let entry = chain.member(me).ok_or(RouteReject::NotInChain)?;
    if !entry.state.can_read() {
        return Err(RouteReject::NotServing { state: entry.state });
    }
    Ok(())
}

/// The target `me` must recover, if any: `me` is serving and its successor
/// is syncing (the predecessor of a syncing target drives its recovery).
pub fn sync_successor(chain: &ChainInfo, me: TargetId) -> Option<Successor> {
    chain.sync_target_of(me).map(successor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_types::ChainId;
    use PublicTargetState::*;

    fn chain(states: &[PublicTargetState]) -> ChainInfo {
        ChainInfo {
            chain_id: ChainId(7),
            chain_version: 5,
            targets: states
                .iter()
                .enumerate()
                .map(|(i, s)| ChainTarget { target_id: TargetId(i as u64 + 1), node_id: NodeId(i as u32 + 1), state: *s })
                .collect(),
        }
    }

    #[test]
    fn three_serving_targets_have_head_middle_tail() {
        let c = chain(&[Serving, Serving, Serving]);
        let head = position(&c, TargetId(1)).unwrap();
        assert!(head.is_head && head.predecessor.is_none());
        assert_eq!(head.successor.map(|s| (s.target, s.kind)), Some((TargetId(2), ForwardKind::Update)));
        let mid = position(&c, TargetId(2)).unwrap();
        assert!(!mid.is_head);
        assert_eq!(mid.predecessor, Some(TargetId(1)));
        assert_eq!(mid.successor.map(|s| s.target), Some(TargetId(3)));
        let tail = position(&c, TargetId(3)).unwrap();
        assert_eq!(tail.successor, None);
        assert_eq!(position(&c, TargetId(9)), None);
    }

    #[test]
    fn offline_and_waiting_targets_are_skipped_and_syncing_gets_full_replace() {
        let c = chain(&[Serving, Serving, Syncing, Waiting, Offline]);
        let pos = position(&c, TargetId(2)).unwrap();
        assert_eq!(pos.successor.map(|s| (s.target, s.kind)), Some((TargetId(3), ForwardKind::FullReplace)));
        assert_eq!(sync_successor(&c, TargetId(2)).map(|s| s.target), Some(TargetId(3)));
        assert_eq!(sync_successor(&c, TargetId(1)), None);
        let syncing = position(&c, TargetId(3)).unwrap();
        assert_eq!(syncing.predecessor, Some(TargetId(2)));
        assert_eq!(syncing.successor, None);
        let waiting = position(&c, TargetId(4)).unwrap();
        assert_eq!((waiting.predecessor, waiting.successor), (None, None));
    }

    #[test]
    fn write_checks_version_first_then_state_then_role() {
        let c = chain(&[Serving, Serving, Offline]);
        assert_eq!(check_write(&c, TargetId(3), 4, Origin::Client), Err(RouteReject::StaleChainVersion { request: 4, current: 5 }));
        assert_eq!(check_write(&c, TargetId(3), 5, Origin::Client), Err(RouteReject::NotServing { state: Offline }));
        assert_eq!(check_write(&c, TargetId(2), 5, Origin::Client), Err(RouteReject::NotHead));
        assert!(check_write(&c, TargetId(1), 5, Origin::Client).is_ok());
        assert!(check_write(&c, TargetId(2), 5, Origin::Predecessor(TargetId(1))).is_ok());
        assert_eq!(
            check_write(&c, TargetId(2), 5, Origin::Predecessor(TargetId(3))),
            Err(RouteReject::WrongPredecessor { expected: Some(TargetId(1)), got: TargetId(3) })
        );
        assert_eq!(check_write(&c, TargetId(8), 5, Origin::Client), Err(RouteReject::NotInChain));
    }

    #[test]
    fn reads_only_on_serving_targets() {
        let c = chain(&[Serving, Syncing]);
        assert!(check_read(&c, TargetId(1), 5).is_ok());
        assert_eq!(check_read(&c, TargetId(2), 5), Err(RouteReject::NotServing { state: Syncing }));
        assert!(matches!(check_read(&c, TargetId(1), 6), Err(RouteReject::StaleChainVersion { .. })));
        // A syncing target takes forwarded writes but never client writes.
        assert!(check_write(&c, TargetId(2), 5, Origin::Predecessor(TargetId(1))).is_ok());
        assert_eq!(check_write(&c, TargetId(2), 5, Origin::Client), Err(RouteReject::NotHead));
    }

    #[test]
    fn single_target_chain_is_head_and_tail() {
        let c = chain(&[Serving]);
        let p = check_write(&c, TargetId(1), 5, Origin::Client).unwrap();
        assert!(p.is_head && p.successor.is_none());
    }
}
