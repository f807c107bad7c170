//! mgmtd, the cluster manager (SPEC §6).
//!
//! This crate starts with its pure logic — no I/O, no clock —
//! so they can be tested row by row and driven by a simulation:
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
//! The async service around them (RPC, persistence in the KV engine, routing
//! info distribution, primary lease) is issue #6's remaining work.

pub mod chain_table;
pub mod cluster;
pub mod state;
