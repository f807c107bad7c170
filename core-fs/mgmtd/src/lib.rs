//! mgmtd, the cluster manager (docs/mgmtd.md).
//!
//! Pure logic — no I/O, no clock — tested row by row and drivable by a
//! simulation:
//!
//! * [`state`]: the target state machine. From each target's local state
//!   (reported in heartbeats) and the chain's current public states, compute
//!   the next public states, the new chain order and whether the chain version
//!   is bumped.
//! * [`cluster`]: the cluster state — heartbeats as leases fenced by node
//!   generation, failure detection after T, chain recomputation, routing
//!   version bumps and sync orders for predecessors.
//! * [`chain_table`]: chain table generation for N nodes × T targets per node
//!   × replication factor R, balanced so that the read load of a failed node
//!   spreads over as many survivors as possible.
//!
//! The service around them:
//!
//! * [`service`]: RPCs (Heartbeat, GetRouting, Status), the primary lease,
//!   the ticker and routing publication; time through [`clock::Clock`].
//! * [`store`]: the state in the KV engine (key prefixes documented there
//!   and in docs/mgmtd.md); [`layout`]: bootstrap layout and id scheme.

pub mod chain_table;
pub mod clock;
pub mod cluster;
pub mod error;
pub mod layout;
pub mod meta_registry;
pub mod service;
pub mod state;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::MgmtdError;
pub use layout::Layout;
pub use service::{Mgmtd, MgmtdConfig, RunningMgmtd};
