//! The target state machine (docs/mgmtd.md, "Transition table"), as a pure function over one chain.
//!
//! mgmtd calls [`next_chain`] for every chain about once a second with the
//! local states from the latest heartbeats. The result is the chain's new
//! target order and public states; the chain version is bumped if anything
//! (a state or the order) changed. The rules, applied to the targets grouped
//! by their *current* public state in the order serving, lastsrv, syncing,
//! waiting, offline (the same table is in docs/mgmtd.md):
//!
//! | current | local | condition | next |
//! |---|---|---|---|
//! | serving | up-to-date / online | — | serving |
//! | serving | offline | some serving target stays serving | offline |
//! | serving | offline | none stays serving, first such target in chain order | lastsrv |
//! | serving | offline | none stays serving, not the first | offline |
//! | lastsrv | any | chain now has a serving target, or a serving target just became lastsrv | offline |
//! | lastsrv | up-to-date / online | no serving target | serving |
//! | lastsrv | offline | no serving target | lastsrv |
//! | syncing | up-to-date | — | serving |
//! | syncing | online | chain has a serving target | syncing |
//! | syncing | online | no serving target | waiting |
//! | syncing | offline | — | offline |
//! | waiting / offline | online | chain has a serving target and no syncing one | syncing (one per pass) |
//! | waiting / offline | online / up-to-date | otherwise | waiting |
//! | waiting / offline | offline | — | offline |
//!
//! Finally, if the chain has a serving target, any target still lastsrv
//! becomes offline. The new order lists serving, lastsrv, syncing, waiting,
//! offline, keeping the old relative order inside each group, so a failed
//! target moves to the end of its chain.
//!
//! "Has a serving target" is always judged on the *next* states computed so
//! far in the pass, so a target that returns to serving from syncing counts.

use fskv_types::TargetId;
use serde::{Deserialize, Serialize};

use fskv_proto::routing::{ChainMember, ChainRoles};
pub use fskv_proto::routing::{LocalTargetState as LocalState, PublicTargetState as PublicState};

/// Position of a state's group in the chain order.
fn group(state: PublicState) -> u8 {
    state.chain_order()
}

/// One target of a chain as mgmtd sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetView {
    pub target: TargetId,
    pub public: PublicState,
    pub local: LocalState,
}

/// A chain: its version and its targets in chain order (head first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainView {
    pub version: u32,
    pub targets: Vec<TargetView>,
}

impl ChainMember for TargetView {
    fn target_id(&self) -> TargetId {
        self.target
    }
    fn public_state(&self) -> PublicState {
        self.public
    }
}

/// The chain roles (head, tail, predecessor, sync source, …) of mgmtd's
/// view are the routing info's: one definition, `ChainRoles`.
impl ChainRoles for ChainView {
    type Member = TargetView;
    fn members(&self) -> &[TargetView] {
        &self.targets
    }
}

/// Computes the chain's next public states and order. Pure and deterministic.
pub fn next_chain(chain: &ChainView) -> ChainView {
    let mut next: Vec<Option<PublicState>> = vec![None; chain.targets.len()];
    let indices_in = |state: PublicState| -> Vec<usize> {
        chain.targets.iter().enumerate().filter(|(_, t)| t.public == state).map(|(i, _)| i).collect()
    };
    let has = |next: &[Option<PublicState>], s: PublicState| next.contains(&Some(s));

    // 1. serving
    let serving = indices_in(PublicState::Serving);
    let any_stays = serving.iter().any(|&i| chain.targets[i].local != LocalState::Offline);
    let mut lastsrv_given = false;
    for &i in &serving {
        next[i] = Some(match chain.targets[i].local {
            LocalState::UpToDate | LocalState::Online => PublicState::Serving,
            LocalState::Offline if !any_stays && !lastsrv_given => {
                lastsrv_given = true;
                PublicState::LastSrv
            }
            LocalState::Offline => PublicState::Offline,
        });
    }
    // 2. lastsrv
    for i in indices_in(PublicState::LastSrv) {
        // A serving target that just became lastsrv holds newer data than an
        // older lastsrv, which therefore steps down.
        next[i] = Some(if has(&next, PublicState::Serving) || lastsrv_given {
            PublicState::Offline
        } else if chain.targets[i].local == LocalState::Offline {
            PublicState::LastSrv
        } else {
            PublicState::Serving
        });
    }
    // 3. syncing
    for i in indices_in(PublicState::Syncing) {
        next[i] = Some(match chain.targets[i].local {
            LocalState::UpToDate => PublicState::Serving,
            LocalState::Online if has(&next, PublicState::Serving) => PublicState::Syncing,
            LocalState::Online => PublicState::Waiting,
            LocalState::Offline => PublicState::Offline,
        });
    }
    // 4. waiting, then offline
    for state in [PublicState::Waiting, PublicState::Offline] {
        for i in indices_in(state) {
            let local = chain.targets[i].local;
            let may_sync = has(&next, PublicState::Serving) && !has(&next, PublicState::Syncing);
            next[i] = Some(match local {
                LocalState::Online if may_sync => PublicState::Syncing,
                LocalState::Online | LocalState::UpToDate => PublicState::Waiting,
                LocalState::Offline => PublicState::Offline,
            });
        }
    }
    // 5. a lastsrv is moot once the chain serves again
    if has(&next, PublicState::Serving) {
        for n in next.iter_mut() {
            if *n == Some(PublicState::LastSrv) {
                *n = Some(PublicState::Offline);
            }
        }
    }

    let mut targets: Vec<TargetView> =
        chain.targets.iter().zip(&next).map(|(t, n)| TargetView { public: n.unwrap_or(t.public), ..*t }).collect();
    // Stable sort keeps the old order inside each group.
    targets.sort_by_key(|t| group(t.public));
    debug_assert!(targets.iter().filter(|t| t.public == PublicState::Syncing).count() <= 1 || chain_had_two_syncing(chain));
    let changed = targets != chain.targets;
    ChainView { version: if changed { chain.version.wrapping_add(1) } else { chain.version }, targets }
}

/// Several syncing targets can only come from an input that already had them
/// (never produced by `next_chain` itself).
fn chain_had_two_syncing(chain: &ChainView) -> bool {
    chain.targets.iter().filter(|t| t.public == PublicState::Syncing).count() > 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use LocalState as L;
    use PublicState as P;

    fn chain(targets: &[(u64, P, L)]) -> ChainView {
        ChainView {
            version: 7,
            targets: targets.iter().map(|&(id, public, local)| TargetView { target: TargetId(id), public, local }).collect(),
        }
    }

    /// (id, next public state) in the new chain order.
    fn result(c: &ChainView) -> Vec<(u64, P)> {
        next_chain(c).targets.iter().map(|t| (t.target.0, t.public)).collect()
    }

    #[test]
    fn serving_stays_serving_when_up_to_date_or_online() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Serving, L::Online), (3, P::Serving, L::UpToDate)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Serving), (3, P::Serving)]);
        assert_eq!(next_chain(&c).version, 7, "no change, no version bump");
    }

    #[test]
    fn serving_offline_with_survivors_goes_offline_and_to_the_end() {
        let c = chain(&[(1, P::Serving, L::Offline), (2, P::Serving, L::UpToDate), (3, P::Serving, L::UpToDate)]);
        assert_eq!(result(&c), vec![(2, P::Serving), (3, P::Serving), (1, P::Offline)]);
        assert_eq!(next_chain(&c).version, 8);
        assert_eq!(next_chain(&c).head().map(|t| t.target), Some(TargetId(2)));
    }

    #[test]
    fn last_serving_target_lost_becomes_lastsrv_only_the_first() {
        let c = chain(&[(1, P::Serving, L::Offline), (2, P::Serving, L::Offline), (3, P::Offline, L::Offline)]);
        assert_eq!(result(&c), vec![(1, P::LastSrv), (2, P::Offline), (3, P::Offline)]);
    }

    #[test]
    fn lastsrv_goes_offline_when_the_chain_serves_again() {
        let c = chain(&[(2, P::Serving, L::UpToDate), (1, P::LastSrv, L::Online)]);
        assert_eq!(result(&c), vec![(2, P::Serving), (1, P::Offline)]);
    }

    #[test]
    fn lastsrv_returns_to_serving_when_it_comes_back_first() {
        for local in [L::Online, L::UpToDate] {
            let c = chain(&[(1, P::LastSrv, local), (2, P::Offline, L::Offline), (3, P::Offline, L::Online)]);
            // 1 serves again; 3 (online) may now start syncing in the same pass.
            assert_eq!(result(&c), vec![(1, P::Serving), (3, P::Syncing), (2, P::Offline)]);
        }
    }

    #[test]
    fn lastsrv_stays_while_down_and_nothing_serves() {
        let c = chain(&[(1, P::LastSrv, L::Offline), (2, P::Waiting, L::Online)]);
        assert_eq!(result(&c), vec![(1, P::LastSrv), (2, P::Waiting)]);
    }

    #[test]
    fn syncing_up_to_date_becomes_serving() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Syncing, L::UpToDate)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Serving)]);
    }

    #[test]
    fn syncing_online_keeps_syncing_while_the_chain_serves() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Syncing, L::Online)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Syncing)]);
        assert_eq!(next_chain(&c).version, 7);
    }

    #[test]
    fn syncing_online_waits_when_nothing_serves() {
        let c = chain(&[(1, P::Serving, L::Offline), (2, P::Syncing, L::Online)]);
        assert_eq!(result(&c), vec![(1, P::LastSrv), (2, P::Waiting)]);
    }

    #[test]
    fn syncing_offline_goes_offline() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Syncing, L::Offline)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Offline)]);
    }

    #[test]
    fn waiting_online_starts_syncing_one_at_a_time() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Waiting, L::Online), (3, P::Offline, L::Online)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Syncing), (3, P::Waiting)]);
    }

    #[test]
    fn waiting_does_not_sync_while_another_target_syncs() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Syncing, L::Online), (3, P::Waiting, L::Online)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Syncing), (3, P::Waiting)]);
    }

    #[test]
    fn waiting_without_a_serving_target_keeps_waiting() {
        let c = chain(&[(1, P::LastSrv, L::Offline), (2, P::Waiting, L::Online), (3, P::Waiting, L::UpToDate)]);
        assert_eq!(result(&c), vec![(1, P::LastSrv), (2, P::Waiting), (3, P::Waiting)]);
    }

    #[test]
    fn waiting_offline_goes_offline() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Waiting, L::Offline)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Offline)]);
    }

    #[test]
    fn offline_online_starts_syncing_offline_up_to_date_waits() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Offline, L::Online)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Syncing)]);
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Syncing, L::Online), (3, P::Offline, L::UpToDate)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Syncing), (3, P::Waiting)]);
    }

    #[test]
    fn offline_stays_offline_while_down() {
        let c = chain(&[(1, P::Serving, L::UpToDate), (2, P::Offline, L::Offline)]);
        assert_eq!(result(&c), vec![(1, P::Serving), (2, P::Offline)]);
    }

    #[test]
    fn order_is_by_group_keeping_old_order_inside_groups() {
        let c = chain(&[
            (5, P::Offline, L::Offline),
            (4, P::Waiting, L::Online),
            (3, P::Serving, L::UpToDate),
            (2, P::Syncing, L::Online),
            (1, P::Serving, L::Online),
        ]);
        assert_eq!(result(&c), vec![(3, P::Serving), (1, P::Serving), (2, P::Syncing), (4, P::Waiting), (5, P::Offline)]);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn any_public() -> impl Strategy<Value = P> {
            prop_oneof![Just(P::Serving), Just(P::LastSrv), Just(P::Syncing), Just(P::Waiting), Just(P::Offline)]
        }
        fn any_local() -> impl Strategy<Value = L> {
            prop_oneof![Just(L::UpToDate), Just(L::Online), Just(L::Offline)]
        }

        proptest! {
            /// From any reachable-or-not input: at most one syncing target
            /// (unless the input already had several), never serving and
            /// lastsrv together, order by group, the same targets, version
            /// bumped exactly when something changed, and a fixed point is
            /// reached within a few passes when local states stay put.
            #[test]
            fn invariants(states in proptest::collection::vec((any_public(), any_local()), 1..6)) {
                let c = ChainView {
                    version: 1,
                    targets: states.iter().enumerate().map(|(i, &(public, local))| TargetView { target: TargetId(i as u64), public, local }).collect(),
                };
                let n = next_chain(&c);
                let count = |s: P| n.targets.iter().filter(|t| t.public == s).count();
                let had_syncing = c.targets.iter().filter(|t| t.public == P::Syncing).count();
                prop_assert!(count(P::Syncing) <= had_syncing.max(1));
                prop_assert!(!(count(P::Serving) > 0 && count(P::LastSrv) > 0));
                prop_assert!(count(P::LastSrv) <= 1 || c.targets.iter().filter(|t| t.public == P::LastSrv).count() > 1);
                prop_assert!(count(P::LastSrv) <= c.targets.iter().filter(|t| t.public == P::LastSrv).count().max(1));
                prop_assert!(n.targets.windows(2).all(|w| group(w[0].public) <= group(w[1].public)));
                let mut ids: Vec<u64> = n.targets.iter().map(|t| t.target.0).collect();
                ids.sort();
                prop_assert_eq!(ids, (0..states.len() as u64).collect::<Vec<_>>());
                prop_assert_eq!(n.version != c.version, n.targets != c.targets);
                // Offline locals are never readable or writable.
                prop_assert!(n.targets.iter().all(|t| t.local != L::Offline || !t.public.can_write()));
                let mut cur = n;
                for _ in 0..4 {
                    cur = next_chain(&cur);
                }
                prop_assert_eq!(next_chain(&cur).version, cur.version, "no fixed point: {:?}", cur);
            }
        }
    }
}
