//! `fskv-sim`: the deterministic simulation of a whole cluster (two mgmtd
//! instances, storage services, writing clients) over turmoil's simulated
//! network, in `tests/sim.rs`. It lives in a crate of its own because it
//! drives every service and the client together; no library crate depends on
//! another for the sake of this test. See docs/mgmtd.md, "Simulation".
