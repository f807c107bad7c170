//! The meta server's link to mgmtd: registration, so clients find meta
//! through routing info (`RoutingInfo::meta_servers`) as in 3FS.
//!
//! | step | rule |
//! |---|---|
//! | start | a generation picked anew (start time in ns) |
//! | every `timeout_ms / 3` (mgmtd's answer; `initial_interval_ms` until the first) | `MetaHeartbeat { node_id, address, generation }` to the primary |
//! | mgmtd unreachable or not primary | retried at the next period; meta keeps serving (its state is all in the KV engine, so a meta server needs no lease) |
//! | fenced (a newer generation of this node id registered) | stop registering and log once: another process owns this node id |
//!
//! Meta servers hold no lease because they hold no state: two of them
//! serving at once is the normal case.

use fskv_client::mgmtd::MgmtdClient;
use fskv_proto::mgmtd::MetaHeartbeatReq;
use fskv_types::{ErrorCode, NodeId};
use std::time::Duration;
use tracing::{debug, info, warn};

#[derive(Clone, Debug)]
pub struct MetaRegistration {
    pub node_id: NodeId,
    /// The address clients should use.
    pub address: String,
    /// This start's generation; must grow across restarts.
    pub generation: u64,
    /// Period before mgmtd has said its timeout.
    pub initial_interval_ms: u64,
}

/// Heartbeats until fenced; run it as a task and abort it at shutdown.
pub async fn run_registration(mgmtd: MgmtdClient, reg: MetaRegistration) {
    let req = MetaHeartbeatReq { node_id: reg.node_id, address: reg.address.clone(), generation: reg.generation };
    let mut interval_ms = reg.initial_interval_ms.max(50);
    let mut registered = false;
    loop {
        match mgmtd.meta_heartbeat(&req).await {
            Ok(resp) => {
                if !registered {
                    info!(node = %reg.node_id, address = %reg.address, "registered with mgmtd");
                    registered = true;
                }
                interval_ms = (resp.timeout_ms / 3).max(50);
            }
            Err(e) if e.code() == ErrorCode::StaleNodeGeneration => {
                warn!(node = %reg.node_id, error = %e, "mgmtd fenced this meta server's generation; no longer registering");
                return;
            }
            Err(e) => {
                debug!(node = %reg.node_id, error = %e, "meta heartbeat failed; retrying");
                registered = false;
            }
        }
        tokio::time::sleep(Duration::from_millis(interval_ms)).await;
    }
}
