//! The conformance suite against FoundationDB. Compiled only with the `fdb`
//! feature (which needs libfdb_c to link); runs only when FDB_CLUSTER_FILE
//! names a cluster file, and says why it is skipped otherwise.
#![cfg(feature = "fdb")]

use fskv_kv::{conformance, FdbEngine};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fdb_conformance() {
    let Ok(cluster) = std::env::var("FDB_CLUSTER_FILE") else {
        eprintln!("SKIPPED fdb_conformance: FDB_CLUSTER_FILE is not set (no FoundationDB cluster to test against)");
        return;
    };
    let engine = FdbEngine::open(Some(&cluster)).expect("open FoundationDB");
    let prefix = format!("fskv-conformance-{}/", std::process::id());
    conformance::run_all(Arc::new(engine), &prefix).await;
}
