//! A loopback cluster of storage services in one process, fed by a fixed
//! routing table (the pre-mgmtd path). Used by the tests and the bench;
//! production services get routing from mgmtd through a `RoutingHandle`.

use crate::service::{RunningStorage, StorageConfig, StorageService};
use fskv_chunk_engine::{ChunkEngine, EngineConfig};
use fskv_client::storage::{RoutingPublisher, StorageClient, StorageClientConfig};
use fskv_proto::routing::{ChainInfo, ChainTarget, NodeInfo, PublicTargetState, RoutingInfo};
use fskv_rpc::{ClientConfig, RpcClient, TcpTransport};
use fskv_types::{ChainId, NodeId, TargetId};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long a restarted node retries opening engines still held by tasks
/// of its previous incarnation.
const REOPEN_RETRY_MS: u64 = 5_000;

/// One chain of the cluster: `(target, node index)` in chain order.
pub type ChainSpec = Vec<(TargetId, usize)>;

/// Settings of every service of a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub engine: EngineConfig,
    /// See [`StorageConfig::sync_pause_between_chunks_ms`].
    pub sync_pause_between_chunks_ms: u64,
    /// See [`StorageConfig::scrub_bytes_per_sec`] (0: no scrubber).
    pub scrub_bytes_per_sec: u64,
    /// See [`StorageConfig::scrub_pause_between_passes_ms`].
    pub scrub_pause_between_passes_ms: u64,
}

impl ClusterOptions {
    pub fn new(engine: EngineConfig) -> Self {
        ClusterOptions { engine, sync_pause_between_chunks_ms: 0, scrub_bytes_per_sec: 0, scrub_pause_between_passes_ms: 60_000 }
    }
}

pub struct LocalCluster {
    root: PathBuf,
    options: ClusterOptions,
    publisher: RoutingPublisher,
    nodes: Vec<Option<RunningStorage>>,
    node_targets: Vec<Vec<TargetId>>,
}

fn node_id(index: usize) -> NodeId {
    NodeId(index as u32 + 1)
}

/// Reorders a chain per the mgmtd ordering contract (serving, lastsrv,
/// syncing, waiting, offline; stable inside each group).
pub fn reorder(chain: &mut ChainInfo) {
    chain.targets.sort_by_key(|t| t.state.chain_order());
}

impl LocalCluster {
    /// Starts `node_count` services under `root`, each hosting its targets
    /// of `chains` (chain ids 1, 2, …), every target serving.
    pub async fn start(root: &Path, node_count: usize, chains: &[ChainSpec], options: ClusterOptions) -> anyhow::Result<Self> {
        let mut node_targets = vec![Vec::new(); node_count];
        let mut infos = Vec::new();
        for (i, spec) in chains.iter().enumerate() {
            let mut targets = Vec::new();
            for &(t, n) in spec {
                anyhow::ensure!(n < node_count, "node index {n} out of range");
                node_targets[n].push(t);
                targets.push(ChainTarget { target_id: t, node_id: node_id(n), state: PublicTargetState::Serving });
            }
            infos.push(ChainInfo { chain_id: ChainId(i as u32 + 1), chain_version: 1, targets });
        }
        let routing = RoutingInfo { version: 1, chains: infos, ..Default::default() };
        let (publisher, _) = RoutingPublisher::new(routing);
        let mut cluster =
            LocalCluster { root: root.to_path_buf(), options, publisher, nodes: (0..node_count).map(|_| None).collect(), node_targets };
        for n in 0..node_count {
            cluster.start_node(n, false).await?;
        }
        Ok(cluster)
    }

    pub fn publisher(&self) -> &RoutingPublisher {
        &self.publisher
    }

    pub fn routing(&self) -> Arc<RoutingInfo> {
        self.publisher.current()
    }

    pub fn node_dir(&self, n: usize) -> PathBuf {
        self.root.join(format!("node-{}", n + 1))
    }

    pub fn service(&self, n: usize) -> Option<&StorageService> {
        self.nodes.get(n)?.as_ref().map(|r| &r.service)
    }

    /// The engine of `target`, on whichever running node hosts it.
    pub fn engine(&self, target: TargetId) -> Option<Arc<ChunkEngine>> {
        self.nodes.iter().flatten().find_map(|r| r.service.engine(target))
    }

    pub fn client(&self, config: StorageClientConfig) -> StorageClient {
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        StorageClient::new(rpc, self.publisher.handle(), config)
    }

    /// Starts node `n` on a fresh loopback port (publishing its address);
    /// `wipe` deletes its data first (a replaced disk).
    pub async fn start_node(&mut self, n: usize, wipe: bool) -> anyhow::Result<()> {
        anyhow::ensure!(self.nodes[n].is_none(), "node {n} is running");
        let dir = self.node_dir(n);
        if wipe && dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        let deadline = tokio::time::Instant::now() + Duration::from_millis(REOPEN_RETRY_MS);
        let service = loop {
            let config = StorageConfig {
                sync_pause_between_chunks_ms: self.options.sync_pause_between_chunks_ms,
                scrub_bytes_per_sec: self.options.scrub_bytes_per_sec,
                scrub_pause_between_passes_ms: self.options.scrub_pause_between_passes_ms,
                ..StorageConfig::new(node_id(n))
            };
            let opened = StorageService::open(
                config,
                &dir,
                &self.node_targets[n],
                self.options.engine.clone(),
                self.publisher.handle(),
                rpc.clone(),
            );
            match opened {
                Ok(s) => break s,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "engine still held; retrying open");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let running = service.serve("127.0.0.1:0").await?;
        let addr = running.local_addr().to_string();
        self.publisher.update(|r| {
            r.nodes.retain(|x| x.node_id != node_id(n));
            r.nodes.push(NodeInfo { node_id: node_id(n), address: addr });
        });
        self.nodes[n] = Some(running);
        Ok(())
    }

    /// Stops node `n` (its engines are closed once in-flight work ends).
    pub async fn stop_node(&mut self, n: usize) {
        if let Some(running) = self.nodes[n].take() {
            running.shutdown().await;
        }
    }

    /// Sets the public state of `target` as mgmtd would: reorder the chain
    /// and bump its chain version.
    pub fn set_state(&self, target: TargetId, state: PublicTargetState) {
        self.publisher.update(|r| {
            for chain in &mut r.chains {
                if let Some(t) = chain.targets.iter_mut().find(|t| t.target_id == target) {
                    t.state = state;
                    chain.chain_version += 1;
                    reorder(chain);
                }
            }
        });
    }

    pub async fn shutdown(mut self) {
        for n in 0..self.nodes.len() {
            self.stop_node(n).await;
        }
    }
}
