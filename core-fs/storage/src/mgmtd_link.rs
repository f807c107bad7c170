//! The storage service's link to mgmtd (docs/storage.md "Recovery", docs/mgmtd.md "Heartbeats, leases, fencing").
//!
//! * **Restart rule.** Before serving, [`wait_until_safe_to_start`] waits
//!   until mgmtd's routing shows every target of this node offline or
//!   lastsrv (or the node was never registered): a restarted service then
//!   reports its targets online and each goes through recovery.
//! * **Heartbeats.** [`run_heartbeats`] sends a heartbeat every
//!   `heartbeat_interval_ms` with this start's generation and each target's
//!   local state; an ack grants a lease of T/2 counted from when the
//!   heartbeat was *sent*, and announces the routing version (pulled at once
//!   if newer).
//! * **Exit.** It returns an [`ExitReason`] — the caller stops serving and
//!   exits — when the lease runs out without renewal (mgmtd unreachable for
//!   T/2), when mgmtd fences this generation, or when routing shows one of
//!   this node's targets lastsrv/offline after it had been brought back in
//!   (it was declared dead, e.g. while partitioned).

use crate::service::StorageService;
use fskv_client::mgmtd::MgmtdRoutingSource;
use fskv_proto::mgmtd::HeartbeatReq;
use fskv_proto::routing::{PublicTargetState, RoutingInfo};
use fskv_types::{ErrorCode, NodeId, TargetId};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

#[derive(Clone, Debug)]
pub struct MgmtdLinkConfig {
    pub heartbeat_interval_ms: u64,
    /// This start's generation (e.g. start time in ns); must grow across restarts.
    pub generation: u64,
    /// Lease assumed before the first ack (mgmtd tells T/2 in every ack).
    pub initial_lease_ms: u64,
    /// Bound on the wait of [`wait_until_safe_to_start`].
    pub max_start_wait_ms: u64,
}

/// Why the storage service must stop.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExitReason {
    #[error("could not renew the mgmtd lease for {lease_ms} ms (mgmtd unreachable); stopping to avoid split brain")]
    LeaseExpired { lease_ms: u64 },
    #[error("mgmtd fenced generation {generation}: {message}")]
    Fenced { generation: u64, message: String },
    #[error("routing shows {target} {state:?}: this node was declared dead; stopping (restart goes through recovery)")]
    DeclaredDead { target: TargetId, state: PublicTargetState },
}

fn down(state: PublicTargetState) -> bool {
    matches!(state, PublicTargetState::Offline | PublicTargetState::LastSrv)
}

/// Whether routing lets a (re)started node begin: never registered, or
/// every target of it offline / lastsrv (or not in any chain).
pub fn safe_to_start(routing: &RoutingInfo, node: NodeId, targets: &[TargetId]) -> bool {
    if routing.node_address(node).is_none() {
        return true;
    }
    targets.iter().all(|t| routing.locate_target(*t).is_none_or(|(_, ct)| down(ct.state)))
}

/// Waits (bounded) until [`safe_to_start`] holds on mgmtd's routing.
pub async fn wait_until_safe_to_start(
    source: &MgmtdRoutingSource,
    node: NodeId,
    targets: &[TargetId],
    max_wait_ms: u64,
) -> anyhow::Result<()> {
    let mut rx = source.subscribe();
    let deadline = Instant::now() + Duration::from_millis(max_wait_ms);
    let mut logged = false;
    loop {
        if safe_to_start(&source.current(), node, targets) {
            return Ok(());
        }
        if !logged {
            info!(%node, "waiting for mgmtd to mark this node's targets offline before serving (recovery)");
            logged = true;
        }
        anyhow::ensure!(Instant::now() < deadline, "{node}: targets still not offline in mgmtd's routing after {max_wait_ms} ms");
        let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
    }
}

/// Heartbeats until the service must stop; returns why.
pub async fn run_heartbeats(
    service: StorageService,
    source: Arc<MgmtdRoutingSource>,
    address: String,
    config: MgmtdLinkConfig,
) -> ExitReason {
    let node = service.node_id();
    let targets = service.target_ids();
    let interval = Duration::from_millis(config.heartbeat_interval_ms.max(1));
    let mut lease_ms = config.initial_lease_ms;
    let mut lease_until = Instant::now() + Duration::from_millis(lease_ms);
    let mut rx = source.subscribe();
    // Targets mgmtd has brought back in since this start.
    let mut alive_seen: HashSet<TargetId> = HashSet::new();
    let mut next_beat = Instant::now();
    loop {
        // Declared dead?
        let routing = source.current();
        for t in &targets {
            let Some((_, ct)) = routing.locate_target(*t) else { continue };
            if down(ct.state) {
                if alive_seen.contains(t) {
                    return ExitReason::DeclaredDead { target: *t, state: ct.state };
                }
            } else {
                alive_seen.insert(*t);
            }
        }
        let now = Instant::now();
        if now >= lease_until {
            return ExitReason::LeaseExpired { lease_ms };
        }
        if now >= next_beat {
            next_beat = now + interval;
            let req = HeartbeatReq {
                node_id: node,
                address: address.clone(),
                generation: config.generation,
                targets: targets.iter().filter_map(|t| service.local_state(*t).map(|s| (*t, s))).collect(),
            };
            let sent = Instant::now();
            match source.client().heartbeat(&req).await {
                Ok(ack) => {
                    lease_ms = ack.lease_ms;
                    lease_until = sent + Duration::from_millis(ack.lease_ms);
                    debug!(%node, routing_version = ack.routing_version, lease_ms, "heartbeat acked");
                    if ack.routing_version > source.current().version {
                        if let Err(e) = source.refresh_now().await {
                            warn!(%node, error = %e, "routing pull after heartbeat failed");
                        }
                    }
                }
                Err(e) if e.code() == ErrorCode::StaleNodeGeneration => {
                    return ExitReason::Fenced { generation: config.generation, message: e.to_string() };
                }
                Err(e) => warn!(%node, error = %e, "heartbeat failed"),
            }
            continue;
        }
        let wake = next_beat.min(lease_until);
        let _ = tokio::time::timeout_at(wake, rx.changed()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_proto::routing::{ChainInfo, ChainTarget, NodeInfo};
    use fskv_types::ChainId;

    fn routing(registered: bool, state: PublicTargetState) -> RoutingInfo {
        RoutingInfo {
            version: 3,
            nodes: if registered { vec![NodeInfo { node_id: NodeId(2), address: "127.0.0.1:1".into() }] } else { vec![] },
            chains: vec![ChainInfo {
                chain_id: ChainId(1),
                chain_version: 2,
                targets: vec![
                    ChainTarget { target_id: TargetId(101), node_id: NodeId(1), state: PublicTargetState::Serving },
                    ChainTarget { target_id: TargetId(201), node_id: NodeId(2), state },
                ],
            }],
            chain_tables: vec![],
            meta_servers: vec![],
        }
    }

    #[test]
    fn a_restarted_node_starts_only_once_its_targets_are_down_or_it_was_never_registered() {
        let t = [TargetId(201)];
        assert!(safe_to_start(&routing(false, PublicTargetState::Serving), NodeId(2), &t));
        assert!(!safe_to_start(&routing(true, PublicTargetState::Serving), NodeId(2), &t));
        assert!(!safe_to_start(&routing(true, PublicTargetState::Syncing), NodeId(2), &t));
        assert!(safe_to_start(&routing(true, PublicTargetState::Offline), NodeId(2), &t));
        assert!(safe_to_start(&routing(true, PublicTargetState::LastSrv), NodeId(2), &t));
    }
}
