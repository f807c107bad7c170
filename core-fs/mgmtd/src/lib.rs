//! mgmtd, the cluster manager (SPEC §6).
//!
//! This crate starts with its two pieces of pure logic — no I/O, no clock —
//! so they can be tested row by row and driven by a simulation:
//!
//! * [`state`]: the target state machine. From each target's local state
//!   (reported in heartbeats) and the chain's current public states, compute
//!   the next public states, the new chain order and whether the chain version
//!   is bumped.
//! * [`chain_table`]: chain table generation for N nodes × T targets per node
//!   × replication factor R, balanced so that the read load of a failed node
//!   spreads over as many survivors as possible.
//!
//! The service around them (heartbeats, leases, routing info, recovery
//! orchestration) is issue #6's remaining work.

pub mod chain_table;
pub mod state;
