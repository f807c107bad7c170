//! The mgmtd service in one process: fencing over RPC, primary takeover
//! between two instances on one KV engine, state surviving a restart.

use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig};
use fskv_kv::KvEngine;
use fskv_mgmtd::{Layout, ManualClock, Mgmtd, MgmtdConfig, SystemClock};
use fskv_proto::mgmtd::HeartbeatReq;
use fskv_proto::routing::{LocalTargetState, PublicTargetState};
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use fskv_types::{ErrorCode, NodeId, TargetId};
use std::sync::Arc;
use std::time::Duration;

const LAYOUT: Layout = Layout { nodes: 3, targets_per_node: 1, replicas: 3 };

fn config(id: &str, timeout_ms: u64, lease_ms: u64) -> MgmtdConfig {
    MgmtdConfig { heartbeat_timeout_ms: timeout_ms, tick_interval_ms: 50, lease_ms, ..MgmtdConfig::new(id) }
}

fn hb(node: u32, generation: u64, local: LocalTargetState) -> HeartbeatReq {
    HeartbeatReq {
        node_id: NodeId(node),
        address: format!("127.0.0.1:{}", 9000 + node),
        generation,
        targets: vec![(TargetId(node as u64 * 100 + 1), local)],
    }
}

fn rpc() -> RpcClient {
    RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default())
}

/// Advances the clock by `ms` in steps shorter than a lease third,
/// renewing the lease and heartbeating `nodes` at each step.
async fn run_for(m: &Mgmtd, clock: &ManualClock, ms: u64, nodes: &[u32]) {
    let mut left = ms;
    while left > 0 {
        let step = left.min(300);
        clock.advance(step);
        left -= step;
        assert!(m.renew_lease_once().await.unwrap());
        for n in nodes {
            m.heartbeat(&hb(*n, 1, LocalTargetState::UpToDate)).await.unwrap();
        }
    }
}

#[tokio::test]
async fn old_generation_heartbeat_is_fenced_over_rpc() {
    let engine: Arc<dyn KvEngine> = Arc::new(fskv_kv::MemoryEngine::new());
    let m = Mgmtd::new(config("m1", 3_000, 1_500), LAYOUT, engine, Arc::new(SystemClock)).unwrap();
    let running = m.serve("127.0.0.1:0").await.unwrap();
    let client = MgmtdClient::new(rpc(), vec![running.local_addr().to_string()], MgmtdClientConfig::default());
    // The lease loop makes it primary at once; wait (bounded) for it.
    let mut ack = None;
    for _ in 0..100 {
        if let Ok(a) = client.heartbeat(&hb(1, 5, LocalTargetState::UpToDate)).await {
            ack = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ack = ack.expect("heartbeat accepted within 2 s");
    assert_eq!(ack.lease_ms, 1_500, "the lease is T/2");
    let err = client.heartbeat(&hb(1, 4, LocalTargetState::UpToDate)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::StaleNodeGeneration);
    // The newer generation (a restart) is accepted.
    client.heartbeat(&hb(1, 6, LocalTargetState::Online)).await.unwrap();
    // A target of another node is rejected.
    let mut bad = hb(1, 6, LocalTargetState::Online);
    bad.targets = vec![(TargetId(201), LocalTargetState::Online)];
    assert_eq!(client.heartbeat(&bad).await.unwrap_err().code(), ErrorCode::InvalidArgument);
    running.shutdown().await;
}

#[tokio::test]
async fn standby_takes_over_within_the_lease_and_keeps_versions_monotonic() {
    let engine: Arc<dyn KvEngine> = Arc::new(fskv_kv::MemoryEngine::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let a = Mgmtd::new(config("a", 3_000, 1_000), LAYOUT, engine.clone(), clock.clone()).unwrap();
    let b = Mgmtd::new(config("b", 3_000, 1_000), LAYOUT, engine.clone(), clock.clone()).unwrap();
    assert!(a.renew_lease_once().await.unwrap());
    assert!(!b.renew_lease_once().await.unwrap());
    let err = b.heartbeat(&hb(1, 1, LocalTargetState::UpToDate)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotPrimary);
    assert!(err.to_string().contains('a'), "names the primary: {err}");
    for n in 1..=3 {
        a.heartbeat(&hb(n, 1, LocalTargetState::UpToDate)).await.unwrap();
    }
    a.tick_once().await.unwrap();
    // Node 3 goes silent past T: its target moves to the end, offline.
    run_for(&a, &clock, 3_100, &[1, 2]).await;
    assert!(a.tick_once().await.unwrap());
    let ra = a.routing();
    let chain = &ra.chains[0];
    assert_eq!(chain.targets.last().map(|t| (t.target_id, t.state)), Some((TargetId(301), PublicTargetState::Offline)));
    let chain_ver_a = chain.chain_version;
    // a stops renewing (crash). b first reads a's last record now; for a
    // whole lease of its own clock it cannot take over...
    assert!(!b.renew_lease_once().await.unwrap());
    clock.advance(500);
    assert!(!b.renew_lease_once().await.unwrap());
    // ... then, the record unchanged, b does, with the persisted chains and
    // a newer routing version.
    clock.advance(600);
    assert!(b.renew_lease_once().await.unwrap());
    let rb = b.routing();
    assert!(rb.version > ra.version, "routing version {} after takeover, was {}", rb.version, ra.version);
    assert_eq!(rb.chains[0].chain_version, chain_ver_a);
    assert_eq!(rb.chains[0].targets, ra.chains[0].targets);
    // The deposed primary finds out at its next round and stops acting.
    assert!(!a.renew_lease_once().await.unwrap());
    assert!(!a.is_primary());
    assert_eq!(a.heartbeat(&hb(1, 1, LocalTargetState::UpToDate)).await.unwrap_err().code(), ErrorCode::NotPrimary);
    // Node 3's generation was persisted: fencing survives the takeover.
    b.heartbeat(&hb(1, 1, LocalTargetState::UpToDate)).await.unwrap();
    assert_eq!(b.heartbeat(&hb(1, 0, LocalTargetState::UpToDate)).await.unwrap_err().code(), ErrorCode::StaleNodeGeneration);
    // The takeover grace: nothing changes at b's first tick.
    assert!(!b.tick_once().await.unwrap() || b.routing().chains[0].chain_version == chain_ver_a);
}

#[tokio::test]
async fn a_restarted_mgmtd_on_rocksdb_keeps_chain_versions() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("rocksdb:{}", dir.path().join("kv").display());
    let clock = Arc::new(ManualClock::new(5_000_000));
    let (version, chain_ver) = {
        let engine = fskv_kv::open_engine(&spec).unwrap();
        let m = Mgmtd::new(config("m", 1_000, 1_000), LAYOUT, engine, clock.clone()).unwrap();
        assert!(m.renew_lease_once().await.unwrap());
        run_for(&m, &clock, 1_200, &[1, 2]).await;
        assert!(m.tick_once().await.unwrap());
        let r = m.routing();
        (r.version, r.chains[0].chain_version)
    };
    assert!(chain_ver > 1);
    // Another instance, once it has watched the dead holder's record for a
    // lease: reloads from RocksDB.
    clock.advance(2_000);
    let engine = fskv_kv::open_engine(&spec).unwrap();
    let m = Mgmtd::new(config("m2", 1_000, 1_000), LAYOUT, engine.clone(), clock.clone()).unwrap();
    assert!(!m.renew_lease_once().await.unwrap(), "a new instance first watches the lease record");
    clock.advance(1_000);
    assert!(m.renew_lease_once().await.unwrap());
    let r = m.routing();
    assert!(r.version > version);
    assert_eq!(r.chains[0].chain_version, chain_ver);
    // A different layout on the same state is refused.
    drop(m);
    clock.advance(2_000);
    let other = Layout { nodes: 4, targets_per_node: 3, replicas: 3 };
    let m3 = Mgmtd::new(config("m3", 1_000, 1_000), other, engine, clock.clone()).unwrap();
    assert!(!m3.renew_lease_once().await.unwrap());
    clock.advance(1_000);
    assert!(m3.renew_lease_once().await.is_err());
}

/// A node restarted with a new generation is fenced by the next primary even
/// when the old primary dies before its next tick: the first heartbeat of a
/// generation is persisted before it is acknowledged.
#[tokio::test]
async fn a_new_generation_is_persisted_by_its_first_heartbeat() {
    let engine: Arc<dyn KvEngine> = Arc::new(fskv_kv::MemoryEngine::new());
    let clock = Arc::new(ManualClock::new(2_000_000));
    let a = Mgmtd::new(config("a", 3_000, 1_000), LAYOUT, engine.clone(), clock.clone()).unwrap();
    let b = Mgmtd::new(config("b", 3_000, 1_000), LAYOUT, engine.clone(), clock.clone()).unwrap();
    assert!(a.renew_lease_once().await.unwrap());
    for n in 1..=3 {
        a.heartbeat(&hb(n, 1, LocalTargetState::UpToDate)).await.unwrap();
    }
    a.tick_once().await.unwrap();
    // Node 2 restarts as generation 2; a acknowledges it and dies, no tick.
    a.heartbeat(&hb(2, 2, LocalTargetState::Online)).await.unwrap();
    assert!(!b.renew_lease_once().await.unwrap());
    clock.advance(1_100);
    assert!(b.renew_lease_once().await.unwrap());
    // The old process of node 2 (generation 1) is refused by b.
    assert_eq!(b.heartbeat(&hb(2, 1, LocalTargetState::UpToDate)).await.unwrap_err().code(), ErrorCode::StaleNodeGeneration);
    b.heartbeat(&hb(2, 2, LocalTargetState::Online)).await.unwrap();
    // A node the layout does not have is refused and not recorded.
    assert!(b.heartbeat(&hb(9, 1, LocalTargetState::UpToDate)).await.is_err());
}

/// Meta servers register by heartbeat, appear in routing info at the next
/// tick (routing version bumped), drop out after `meta_timeout_ms` of
/// silence, are fenced by generation, and survive a takeover.
#[tokio::test]
async fn meta_servers_register_expire_and_survive_a_takeover() {
    use fskv_proto::mgmtd::MetaHeartbeatReq;
    let engine: Arc<dyn KvEngine> = Arc::new(fskv_kv::MemoryEngine::new());
    let clock = Arc::new(ManualClock::new(3_000_000));
    let cfg = |id: &str| MgmtdConfig { meta_timeout_ms: 2_000, ..config(id, 3_000, 1_000) };
    let a = Mgmtd::new(cfg("a"), LAYOUT, engine.clone(), clock.clone()).unwrap();
    let b = Mgmtd::new(cfg("b"), LAYOUT, engine.clone(), clock.clone()).unwrap();
    let meta =
        |node: u32, generation: u64| MetaHeartbeatReq { node_id: NodeId(node), address: format!("127.0.0.1:{}", 7000 + node), generation };
    // Not primary: refused, naming nobody yet.
    assert_eq!(a.meta_heartbeat(&meta(1, 1)).unwrap_err().code(), ErrorCode::NotPrimary);
    assert!(a.renew_lease_once().await.unwrap());
    assert!(a.routing().meta_servers.is_empty());
    let v0 = a.routing().version;
    let ack = a.meta_heartbeat(&meta(1, 10)).unwrap();
    assert_eq!(ack.timeout_ms, 2_000);
    a.meta_heartbeat(&meta(2, 10)).unwrap();
    assert!(a.tick_once().await.unwrap(), "a new meta server changes the routing");
    let r = a.routing();
    assert!(r.version > v0);
    assert_eq!(r.meta_servers.iter().map(|n| n.address.as_str()).collect::<Vec<_>>(), vec!["127.0.0.1:7001", "127.0.0.1:7002"]);
    assert_eq!(a.status().meta_servers, r.meta_servers);
    // An older generation of server 1 is fenced.
    assert_eq!(a.meta_heartbeat(&meta(1, 9)).unwrap_err().code(), ErrorCode::StaleNodeGeneration);
    // Server 2 goes silent past the timeout: dropped at the next tick.
    for _ in 0..5 {
        clock.advance(500);
        assert!(a.renew_lease_once().await.unwrap());
        a.meta_heartbeat(&meta(1, 10)).unwrap();
        a.tick_once().await.unwrap();
    }
    assert_eq!(a.routing().meta_servers.iter().map(|n| n.node_id).collect::<Vec<_>>(), vec![NodeId(1)]);
    // a dies; b takes over and lists server 1 from the persisted record
    // (server 2's record is there too: it gets the takeover grace).
    assert!(!b.renew_lease_once().await.unwrap());
    clock.advance(1_100);
    assert!(b.renew_lease_once().await.unwrap());
    let ids: Vec<NodeId> = b.routing().meta_servers.iter().map(|n| n.node_id).collect();
    assert!(ids.contains(&NodeId(1)), "the persisted meta server is listed after takeover: {ids:?}");
    // Fencing survives the takeover.
    assert_eq!(b.meta_heartbeat(&meta(1, 9)).unwrap_err().code(), ErrorCode::StaleNodeGeneration);
    // Without heartbeats, the grace runs out.
    for _ in 0..5 {
        clock.advance(500);
        assert!(b.renew_lease_once().await.unwrap());
        b.tick_once().await.unwrap();
    }
    assert!(b.routing().meta_servers.is_empty());
}

/// A clock whose wall reading can jump while its monotonic reading runs on.
struct JumpClock {
    wall_ms: std::sync::atomic::AtomicI64,
    mono_ms: std::sync::atomic::AtomicU64,
}

impl JumpClock {
    fn new() -> Self {
        JumpClock { wall_ms: 1_700_000_000_000.into(), mono_ms: 0.into() }
    }
    fn advance(&self, ms: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.mono_ms.fetch_add(ms, SeqCst);
        self.wall_ms.fetch_add(ms as i64, SeqCst);
    }
    fn jump(&self, ms: i64) {
        self.wall_ms.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
    }
}

impl fskv_mgmtd::Clock for JumpClock {
    fn now_ms(&self) -> u64 {
        self.wall_ms.load(std::sync::atomic::Ordering::SeqCst).max(0) as u64
    }
    fn monotonic_ms(&self) -> u64 {
        self.mono_ms.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Wall-clock jumps (either way, far beyond the lease) move no lease: a
/// standby whose wall clock runs an hour ahead does not take over from a
/// renewing primary, a primary whose clock went back an hour keeps acting
/// only while it renews, and after the primary's crash the standby takes
/// over after one lease of its own monotonic time.
#[tokio::test]
async fn wall_clock_jumps_move_no_lease() {
    let engine: Arc<dyn KvEngine> = Arc::new(fskv_kv::MemoryEngine::new());
    let clock_a = Arc::new(JumpClock::new());
    let clock_b = Arc::new(JumpClock::new());
    let a = Mgmtd::new(config("a", 3_000, 1_000), LAYOUT, engine.clone(), clock_a.clone()).unwrap();
    let b = Mgmtd::new(config("b", 3_000, 1_000), LAYOUT, engine.clone(), clock_b.clone()).unwrap();
    assert!(a.renew_lease_once().await.unwrap());
    clock_b.jump(3_600_000);
    clock_a.jump(-3_600_000);
    for _ in 0..10 {
        clock_a.advance(300);
        clock_b.advance(300);
        assert!(a.renew_lease_once().await.unwrap(), "a renews whatever its wall clock says");
        assert!(!b.renew_lease_once().await.unwrap(), "b never takes over from a renewing primary");
        a.heartbeat(&hb(1, 1, LocalTargetState::UpToDate)).await.unwrap();
    }
    assert_eq!(b.status().primary.map(|(holder, _)| holder).as_deref(), Some("a"));
    // a stops renewing: it stops acting one lease after its last renewal
    // started, on its own monotonic clock...
    clock_a.advance(999);
    a.heartbeat(&hb(1, 1, LocalTargetState::UpToDate)).await.unwrap();
    clock_a.advance(1);
    assert_eq!(a.heartbeat(&hb(1, 1, LocalTargetState::UpToDate)).await.unwrap_err().code(), ErrorCode::NotPrimary);
    // ... and b, which read that record after it was written, takes over
    // only a whole lease after that read.
    clock_b.advance(999);
    assert!(!b.renew_lease_once().await.unwrap());
    clock_b.advance(1);
    assert!(b.renew_lease_once().await.unwrap());
    assert!(!a.renew_lease_once().await.unwrap(), "the deposed primary sees the new holder");
    assert!(!a.is_primary());
}
