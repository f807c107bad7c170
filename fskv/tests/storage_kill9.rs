//! Kill -9 of a real `fskv storage` process in the middle of a stream of
//! writes: every write acknowledged to the client reads back intact, from
//! the surviving replicas and, after online recovery, from the restarted one.

mod common;

use bytes::Bytes;
use common::acked::{check_acked, pattern, Written, REGION_BYTES};
use common::free_port;
use fskv_client::storage::{RoutingPublisher, StorageClient, StorageClientConfig};
use fskv_proto::routing::{ChainInfo, ChainTarget, NodeInfo, PublicTargetState, RoutingInfo};
use fskv_proto::storage::DumpChunkMeta;
use fskv_proto::storage::DumpChunkMetaReq;
use fskv_rpc::{CallOptions, ClientConfig, RpcClient, TcpTransport};
use fskv_types::{ChainId, ChunkId, InodeId, NodeId, TargetId};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CHAIN: ChainId = ChainId(1);
const WRITERS: u64 = 4;
const REGIONS_PER_CHUNK: u64 = 256;

struct Node {
    child: Option<Child>,
    port: u16,
    data: PathBuf,
    id: u32,
}

struct Cluster {
    nodes: Vec<Node>,
    routing_file: PathBuf,
    publisher: RoutingPublisher,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn write_routing(path: &Path, info: &RoutingInfo) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(info).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

impl Cluster {
    fn spawn(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let log = std::fs::File::create(self.dir.join(format!("node-{}.log", n.id))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_fskv"))
            // The test's in-process clients hold no key: services without authentication.
            .args(["storage", "--insecure-no-auth", "--listen", &format!("127.0.0.1:{}", n.port), "--node-id", &n.id.to_string()])
            .arg("--data")
            .arg(&n.data)
            .arg("--routing")
            .arg(&self.routing_file)
            .args(["--routing-poll-ms", "50", "--no-sync-writes"])
            .env("FSKV_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fskv storage");
        n.child = Some(child);
    }

    async fn wait_listening(&self, i: usize) {
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.nodes[i].port)).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("node {} never listened", self.nodes[i].id);
    }

    fn kill9(&mut self, i: usize) {
        let mut c = self.nodes[i].child.take().expect("running");
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
    }

    /// Changes the routing as mgmtd would, in the file (for the services)
    /// and in the client's publisher.
    fn set_state(&self, target: TargetId, state: PublicTargetState) {
        let next = self.publisher.update(|r| {
            let chain = &mut r.chains[0];
            if let Some(t) = chain.targets.iter_mut().find(|t| t.target_id == target) {
                t.state = state;
            }
            chain.chain_version += 1;
            fskv_storage::cluster::reorder(chain);
        });
        write_routing(&self.routing_file, &next);
    }
}

const WRITTEN: Written = Written { chain: CHAIN, inode: InodeId(5), regions_per_chunk: REGIONS_PER_CHUNK };

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_mid_writes_keeps_every_acked_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let nodes: Vec<Node> = (1..=3).map(|id| Node { child: None, port: free_port(), data: dir.join(format!("n{id}")), id }).collect();
    let routing = RoutingInfo {
        version: 1,
        nodes: nodes.iter().map(|n| NodeInfo { node_id: NodeId(n.id), address: format!("127.0.0.1:{}", n.port) }).collect(),
        chains: vec![ChainInfo {
            chain_id: CHAIN,
            chain_version: 1,
            targets: nodes
                .iter()
                .map(|n| ChainTarget { target_id: TargetId(n.id as u64), node_id: NodeId(n.id), state: PublicTargetState::Serving })
                .collect(),
        }],
        chain_tables: vec![],
        meta_servers: vec![],
    };
    let routing_file = dir.join("routing.json");
    write_routing(&routing_file, &routing);
    let (publisher, handle) = RoutingPublisher::new(routing);
    let mut cluster = Cluster { nodes, routing_file, publisher, dir: dir.clone() };
    for i in 0..3 {
        cluster.spawn(i);
    }
    for i in 0..3 {
        cluster.wait_listening(i).await;
    }
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
    let client = StorageClient::new(
        rpc.clone(),
        handle,
        StorageClientConfig { max_attempts: 60, retry_backoff_ms: 5, call_timeout_ms: 2_000, routing_wait_ms: 300, ..Default::default() },
    );

    let outcome = tokio::time::timeout(Duration::from_secs(90), async {
        let stop = Arc::new(AtomicBool::new(false));
        let acked_count = Arc::new(AtomicU64::new(0));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (c, stop, count) = (client.clone(), stop.clone(), acked_count.clone());
            writers.push(tokio::spawn(async move {
                let mut acked = BTreeMap::new();
                let chunk = ChunkId::new(InodeId(5), w);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (r, generation) = (n % REGIONS_PER_CHUNK, n / REGIONS_PER_CHUNK);
                    let data = pattern(w, r, generation);
                    c.write(CHAIN, chunk, r * REGION_BYTES, data).await.expect("write not acked after retries");
                    acked.insert(r, generation);
                    count.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
                (w, acked)
            }));
        }
        // Writes stream before the kill (a count, not a fixed sleep: on a
        // loaded machine 300 ms gave as few as 4 acks).
        let streaming_by = tokio::time::Instant::now() + Duration::from_secs(30);
        while acked_count.load(Ordering::Relaxed) <= 10 && tokio::time::Instant::now() < streaming_by {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // kill -9 the middle of the chain while writes stream; mgmtd would
        // then mark it offline.
        let before_kill = acked_count.load(Ordering::Relaxed);
        cluster.kill9(1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        cluster.set_state(TargetId(2), PublicTargetState::Offline);
        tokio::time::sleep(Duration::from_millis(700)).await;
        stop.store(true, Ordering::Relaxed);
        let mut acked = BTreeMap::new();
        for w in writers {
            let (id, regions) = w.await.unwrap();
            acked.insert(id, regions);
        }
        let total = acked_count.load(Ordering::Relaxed);
        assert!(before_kill > 10 && total > before_kill + 10, "writes must stream across the kill: {before_kill} then {total}");
        // Every acked write is on the survivors.
        check_acked(&client, &WRITTEN, &acked, 4).await;

        // Restart the killed process on its data; it syncs, then serves.
        cluster.spawn(1);
        cluster.wait_listening(1).await;
        cluster.set_state(TargetId(2), PublicTargetState::Syncing);
        let dump = |port: u16, target: u64| {
            let rpc = rpc.clone();
            async move {
                let addr = format!("127.0.0.1:{port}");
                rpc.call::<DumpChunkMeta>(&addr, &DumpChunkMetaReq { target: TargetId(target) }, Bytes::new(), CallOptions::default())
                    .await
                    .map(|(r, _)| r.chunks)
            }
        };
        let (p1, p2) = (cluster.nodes[0].port, cluster.nodes[1].port);
        let mut synced = false;
        for _ in 0..200 {
            if let (Ok(a), Ok(b)) = (dump(p1, 1).await, dump(p2, 2).await) {
                if a == b {
                    synced = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(synced, "restarted target never caught up");
        cluster.set_state(TargetId(2), PublicTargetState::Serving);
        tokio::time::sleep(Duration::from_millis(300)).await;
        check_acked(&client, &WRITTEN, &acked, 6).await;
        total
    })
    .await;
    let total = outcome.unwrap_or_else(|_| panic!("timed out; logs in {}", dir.display()));
    eprintln!("{total} acked writes verified after kill -9 and recovery");
}
