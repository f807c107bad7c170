//! A disk that starts failing under a real `fskv up`: every block-file write
//! of the three targets of storage node 2 fails with EIO from one instant
//! (injected through the chunk engine's fault seam by the test-only
//! `storage.InjectDiskFault` RPC). The engines stop (fail-stop), node 2
//! reports its targets offline, mgmtd takes them out of their chains, and
//! writes and reads go on with the other replicas: no write is lost and no
//! wrong byte is read. Then node 2 restarts with a working disk (kill -9; its
//! supervisor restarts it), its targets sync back, and every byte reads
//! back again. Prints the times from the first write after the fault to the
//! targets out of serving, and from the restart to all serving.

mod common;

use bytes::Bytes;
use common::{free_base_port, fskv_ok, random_file, start_up, stop_up, wait_cluster_healthy};
use fskv_proto::mgmtd::MgmtdStatus;
use fskv_proto::routing::PublicTargetState;
use fskv_proto::storage::{DiskFaultOp, InjectDiskFault, InjectDiskFaultReq};
use fskv_rpc::{CallOptions, ClientConfig, ErrorCode, RpcClient, TcpTransport};
use fskv_types::TargetId;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// errno EIO.
const EIO: i32 = 5;
/// Bound on a failed disk's targets leaving serving, from the first write
/// after the fault (heartbeat every second + mgmtd's tick, with slack for a
/// loaded CI machine).
const OFFLINE_BOUND: Duration = Duration::from_secs(15);

fn get(mgmtd: &str, remote: &str, local: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(local);
    fskv_ok(&["get", "--mgmtd", mgmtd, remote, local.to_str().unwrap()]);
    std::fs::read(local).unwrap()
}

/// Node 2's targets (`target = node*100 + i + 1`) that some chain still
/// lists as serving.
fn node2_serving(rt: &tokio::runtime::Runtime, rpc: &RpcClient, mgmtd: &str) -> Vec<TargetId> {
    let opts = CallOptions { timeout_ms: 5_000 };
    let Ok((st, _)) = rt.block_on(rpc.call::<MgmtdStatus>(mgmtd, &Default::default(), Bytes::new(), opts)) else {
        return vec![TargetId(0)];
    };
    st.chains
        .iter()
        .flat_map(|c| c.targets.iter())
        .filter(|t| t.node_id.0 == 2 && t.public == PublicTargetState::Serving)
        .map(|t| t.target_id)
        .collect()
}

#[test]
fn a_failing_disk_takes_its_targets_out_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = start_up(&data, base);
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let node2 = format!("127.0.0.1:{}", base + 14);
    wait_cluster_healthy(&mgmtd, Duration::from_secs(60));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());

    // Before the fault: 6 MiB written and read back.
    let a = random_file(&dir.path().join("a"), 6 << 20, 1);
    fskv_ok(&["put", "--mgmtd", &mgmtd, "--meta", &format!("127.0.0.1:{}", base + 12), dir.path().join("a").to_str().unwrap(), "/a.bin"]);

    // The disk of node 2 starts failing every block-file write.
    let targets: Vec<TargetId> = (1..=3).map(|i| TargetId(200 + i)).collect();
    for t in &targets {
        let req = InjectDiskFaultReq { target: *t, op: DiskFaultOp::Write, errno: EIO };
        match rt.block_on(rpc.call::<InjectDiskFault>(&node2, &req, Bytes::new(), CallOptions { timeout_ms: 5_000 })) {
            Ok(_) => {}
            Err(e) if e.code() == ErrorCode::UnknownMethod => {
                stop_up(up);
                common::skip(
                    "a_failing_disk_takes_its_targets_out_and_nothing_is_lost",
                    &format!("this fskv binary has no InjectDiskFault (built without the storage crate's fault-injection feature): {e}"),
                );
                return;
            }
            Err(e) => panic!("InjectDiskFault on {t}: {e}"),
        }
    }

    // Writes go on: the first ones meet the failing disk, the client retries
    // on the chains without it.
    let written_at = Instant::now();
    let b = random_file(&dir.path().join("b"), 6 << 20, 2);
    fskv_ok(&["put", "--mgmtd", &mgmtd, "--meta", &format!("127.0.0.1:{}", base + 12), dir.path().join("b").to_str().unwrap(), "/b.bin"]);
    let put_took = written_at.elapsed();
    let offline_after = loop {
        let serving = node2_serving(&rt, &rpc, &mgmtd);
        if serving.is_empty() {
            break written_at.elapsed();
        }
        assert!(written_at.elapsed() < OFFLINE_BOUND, "node 2's targets {serving:?} still serving {OFFLINE_BOUND:?} after its disk failed");
        std::thread::sleep(Duration::from_millis(20));
    };
    // No wrong byte, nothing lost, while the failed targets are out.
    assert!(get(&mgmtd, "/a.bin", &dir.path().join("a.back")) == a, "a.bin read back wrong while node 2's disk failed");
    assert!(get(&mgmtd, "/b.bin", &dir.path().join("b.back")) == b, "b.bin read back wrong while node 2's disk failed");

    // The disk works again: node 2 restarts (its supervisor restarts it after
    // kill -9), its engines reopen and its targets sync back.
    let pid = common::child_pid(&data, "storage-2").expect("pid of storage-2");
    // SAFETY: kill(2) with a pid of a child of `fskv up`.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let healthy_after = wait_cluster_healthy(&mgmtd, Duration::from_secs(120));
    assert!(get(&mgmtd, "/a.bin", &dir.path().join("a.back")) == a, "a.bin read back wrong after the resync");
    assert!(get(&mgmtd, "/b.bin", &dir.path().join("b.back")) == b, "b.bin read back wrong after the resync");
    println!(
        "MEASURE disk_fault_put_ms={} disk_fault_to_offline_ms={} restart_to_all_serving_ms={}",
        put_took.as_millis(),
        offline_after.as_millis(),
        healthy_after.as_millis()
    );
    stop_up(up);
}
