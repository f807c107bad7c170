//! Messages and methods of the mgmtd RPCs (ids 3000–3999). Plain data
//! shared by mgmtd, storage services and clients.

use crate::routing::{LocalTargetState, NodeInfo, PublicTargetState, RoutingInfo};
use fskv_types::ids::{ChainId, NodeId, TargetId};
use serde::{Deserialize, Serialize};

/// A storage service's lease renewal and local-state report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatReq {
    pub node_id: NodeId,
    /// RPC address of the storage service, `host:port`.
    pub address: String,
    /// Picked anew at every start of the service (e.g. its start time in ns);
    /// a heartbeat older than the registered generation is fenced.
    pub generation: u64,
    pub targets: Vec<(TargetId, LocalTargetState)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResp {
    /// The routing version the node should have; pull routing if older.
    pub routing_version: u64,
    /// The lease granted, counted by the node from the moment it *sent* the
    /// heartbeat (T/2): without a renewal by then it stops serving and exits.
    pub lease_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetRoutingReq {
    /// The version the caller has (0: none).
    pub known_version: u64,
    /// Long poll: wait up to this long for a version newer than
    /// `known_version` (capped by the server; 0 answers at once).
    pub wait_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetRoutingResp {
    /// The current routing info if newer than `known_version`, else none.
    pub routing: Option<RoutingInfo>,
    /// The server's current routing version.
    pub version: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgmtdStatusReq {}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node_id: NodeId,
    pub address: String,
    pub generation: u64,
    pub alive: bool,
    /// Milliseconds since the last accepted heartbeat.
    pub last_heartbeat_age_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStatus {
    pub target_id: TargetId,
    pub node_id: NodeId,
    pub public: PublicTargetState,
    pub local: LocalTargetState,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainStatus {
    pub chain_id: ChainId,
    pub chain_version: u32,
    pub targets: Vec<TargetStatus>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgmtdStatusResp {
    /// This mgmtd's id (lease holder name).
    pub mgmtd_id: String,
    pub is_primary: bool,
    /// The primary named by the lease, if any: (id, address).
    pub primary: Option<(String, String)>,
    pub routing_version: u64,
    pub heartbeat_timeout_ms: u64,
    pub nodes: Vec<NodeStatus>,
    pub chains: Vec<ChainStatus>,
    /// The meta servers listed in routing info (registered and alive).
    pub meta_servers: Vec<NodeInfo>,
}

/// A meta server's registration and lease renewal (every
/// `MetaHeartbeatResp::interval_ms`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaHeartbeatReq {
    pub node_id: NodeId,
    /// RPC address clients should use, `host:port`.
    pub address: String,
    /// Picked anew at every start; an older generation is fenced.
    pub generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaHeartbeatResp {
    pub routing_version: u64,
    /// A server silent for this long is left out of routing info.
    pub timeout_ms: u64,
}

// ----- methods -----

fskv_rpc::rpc_method!(
    /// Storage service → primary mgmtd: lease renewal + local target states.
    "mgmtd", Heartbeat = 3001, HeartbeatReq => HeartbeatResp
);
fskv_rpc::rpc_method!(
    /// Anyone → primary mgmtd: routing info newer than a known version (long poll).
    "mgmtd", GetRouting = 3002, GetRoutingReq => GetRoutingResp
);
fskv_rpc::rpc_method!(
    /// Meta server → primary mgmtd: registration + renewal; the alive meta
    /// servers are listed in routing info (`RoutingInfo::meta_servers`).
    "mgmtd", MetaHeartbeat = 3004, MetaHeartbeatReq => MetaHeartbeatResp
);
fskv_rpc::rpc_method!(
    /// Anyone → any mgmtd: its view (primary or not) for `fskv admin status`.
    "mgmtd", MgmtdStatus = 3003, MgmtdStatusReq => MgmtdStatusResp
);
