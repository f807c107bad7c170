//! The async mgmtd service around [`ClusterState`]: RPC handlers, the
//! primary lease, the ticker, persistence and routing publication.
//!
//! * **Lease.** Every `lease_ms / 3` the lease loop runs a KV transaction
//!   on `mgmtd/lease` (holder id, address, renewal count). Every duration
//!   is measured on the instance's own monotonic clock
//!   ([`Clock::monotonic_ms`]), never compared across processes, so a clock
//!   that jumps cannot move the primary:
//!
//!   | who | rule |
//!   |---|---|
//!   | holder | renews (a new record); may act until `lease_ms` after the *start* of its last successful renewal; steps down at the first check past that |
//!   | standby | remembers the record it reads and when it first read it (*after* the read); takes the lease over only once that same record has been unchanged for `lease_ms` |
//!   | anyone | takes the lease at once if there is no record (first start, clean release) or the record names itself |
//!
//!   The standby's first read of a record comes after the holder began
//!   the renewal that wrote it, so the holder has stopped acting before
//!   the standby can take over (clock *rates* must agree, not readings).
//!   Takeover: within `lease_ms` + one renewal period (plus the
//!   transactions' time) of the primary's last renewal. Every write of a primary checks, in its transaction,
//!   that the record still names it. The primary loads (or bootstraps) the
//!   state from the KV engine, ticks and answers heartbeats and routing
//!   requests; others answer `NotPrimary` naming the primary.
//! * **Takeover grace.** A new primary knows no local states: it assumes
//!   them from the public states and gives every node a fresh heartbeat at
//!   takeover, so nodes have T to report before anything is declared failed.
//! * **Ticker.** Every `tick_interval_ms` the primary calls
//!   [`ClusterState::tick`], bumps the routing version also when a node's
//!   address changed, writes the changed chains, nodes and routing version
//!   in one transaction that checks the lease, and only then publishes the
//!   new [`RoutingInfo`]. Sync orders reach the predecessors through that
//!   routing info: a storage service syncs its successor when it sees it
//!   syncing.
//! * **Who may heartbeat.** With service identity on (a cluster key,
//!   `fskv_rpc::auth`), a heartbeat is accepted only over a connection whose
//!   proven principal is the node it speaks for; mgmtd's layout (the known
//!   node ids, checked by [`ClusterState`]) then decides whether that node
//!   exists:
//!
//!   | method | request for | accepted from principal |
//!   |---|---|---|
//!   | `Heartbeat` (storage) | node `N` | `node:N` |
//!   | `MetaHeartbeat` | meta server `N` | `meta:N` |
//!   | either | any | nobody else (`client`, `fuse`, `gateway`, `user:…`, another node): `PermissionDenied` |
//!   | either, server without a key | any | anyone (no authentication: tests, simulation) |
//!
//!   With one cluster key every holder of the key can claim any name: this
//!   stops forged heartbeats from processes that hold no key or claim to be
//!   clients, not a malicious key holder (per-node keys are the next step).
//!
//!   A `user:` principal (a per-user key, docs/security.md) reaches only
//!   what a client needs to find the cluster: `GetRouting` and
//!   `MgmtdStatus` (read-only); both heartbeats refuse it as above. Those
//!   are all of mgmtd's methods: any method added later must say whether
//!   users may call it.

use crate::clock::Clock;
use crate::cluster::{ClusterConfig, ClusterState, Heartbeat};
use crate::error::{MgmtdError, Result};
use crate::layout::Layout;
use crate::meta_registry::MetaRegistry;
use crate::state::ChainView;
use crate::store::{self, Changes, NodeRecordKv};
use bytes::Bytes;
use fskv_kv::KvEngine;
use fskv_proto::mgmtd::*;
use fskv_proto::mgmtd::{GetRouting, Heartbeat as HeartbeatMethod, MgmtdStatus};
use fskv_proto::routing::{ChainInfo, ChainTable, ChainTarget, NodeInfo, PublicTargetState, RoutingInfo};
use fskv_rpc::auth::Principal;
use fskv_rpc::metrics::{MetricsRegistry, Snapshot};
use fskv_rpc::watch;
use fskv_rpc::{RequestContext, Router, Server, ServerConfig, TcpTransport, Transport};
use fskv_types::{NodeId, Status};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info, info_span, warn, Instrument};

#[derive(Clone, Debug)]
pub struct MgmtdConfig {
    /// This instance's id (the lease holder name); unique per mgmtd.
    pub id: String,
    /// T: a storage node silent this long is failed (its lease is T/2).
    pub heartbeat_timeout_ms: u64,
    /// Period of the chain recomputation.
    pub tick_interval_ms: u64,
    /// The primary lease; renewed every third of it.
    pub lease_ms: u64,
    /// Cap on a GetRouting long poll.
    pub max_routing_wait_ms: u64,
    /// A meta server silent this long is left out of routing info (meta
    /// servers heartbeat every third of it).
    pub meta_timeout_ms: u64,
}

impl MgmtdConfig {
    pub fn new(id: impl Into<String>) -> Self {
        MgmtdConfig {
            id: id.into(),
            heartbeat_timeout_ms: 60_000,
            tick_interval_ms: 1_000,
            lease_ms: 10_000,
            max_routing_wait_ms: 5_000,
            meta_timeout_ms: 6_000,
        }
    }
}

/// State held only while primary.
struct Primary {
    cluster: ClusterState,
    /// Monotonic ms until which this instance may act as primary.
    lease_until_ms: u64,
    /// (address, generation) last persisted per node.
    persisted_nodes: BTreeMap<NodeId, NodeRecordKv>,
    /// Node addresses in the published routing info.
    published_nodes: Vec<NodeInfo>,
    meta: MetaRegistry,
    persisted_meta: BTreeMap<NodeId, NodeRecordKv>,
    /// Meta servers in the published routing info.
    published_meta: Vec<NodeInfo>,
}

struct Inner {
    config: MgmtdConfig,
    layout: Layout,
    engine: Arc<dyn KvEngine>,
    clock: Arc<dyn Clock>,
    /// The advertised RPC address (set once bound).
    address: Mutex<String>,
    primary: Mutex<Option<Primary>>,
    /// Last lease record seen (names the primary in `NotPrimary`).
    lease_seen: Mutex<Option<store::LeaseRecord>>,
    /// A standby's watch: another holder's record and the monotonic ms of
    /// its first read (see "Lease" above).
    lease_watch: Mutex<Option<(store::LeaseRecord, u64)>>,
    routing_tx: watch::Sender<Arc<RoutingInfo>>,
    /// Serializes lease changes and ticks (both may swap `primary`).
    step: tokio::sync::Mutex<()>,
    /// Served on `GET /metrics` with the RPC server's metrics.
    registry: Arc<MetricsRegistry>,
}

/// One mgmtd instance (cheap to clone).
#[derive(Clone)]
pub struct Mgmtd {
    inner: Arc<Inner>,
}

/// A running instance: RPC server plus lease and tick loops.
pub struct RunningMgmtd {
    pub mgmtd: Mgmtd,
    server: Server,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningMgmtd {
    pub fn local_addr(&self) -> &str {
        self.server.local_addr()
    }

    /// Stops the loops and the server without releasing the lease (a crash,
    /// as far as the other instances can tell).
    pub async fn kill(self) {
        for t in &self.tasks {
            t.abort();
        }
        *self.mgmtd.inner.primary.lock() = None;
        self.server.shutdown().await;
    }

    /// Clean stop: releases the lease so a standby takes over at once.
    pub async fn shutdown(self) {
        let m = self.mgmtd.clone();
        for t in &self.tasks {
            t.abort();
        }
        let was_primary = m.inner.primary.lock().take().is_some();
        if was_primary {
            if let Err(e) = store::release_lease(&*m.inner.engine, &m.inner.config.id).await {
                warn!(error = %e, "releasing the lease failed");
            }
        }
        self.server.shutdown().await;
    }
}

fn routing_of(cluster: &ClusterState, nodes: &[NodeInfo], meta_servers: &[NodeInfo]) -> RoutingInfo {
    let placement = cluster.placement();
    let chains: Vec<ChainInfo> = cluster
        .chains()
        .iter()
        .map(|(id, view)| ChainInfo {
            chain_id: *id,
            chain_version: view.version,
            targets: view
                .targets
                .iter()
                .map(|t| ChainTarget {
                    target_id: t.target,
                    node_id: placement.get(&t.target).map_or(crate::layout::node_of(t.target), |p| p.node),
                    state: t.public,
                })
                .collect(),
        })
        .collect();
    let table = ChainTable { table_id: 1, table_version: 1, chains: chains.iter().map(|c| c.chain_id).collect() };
    RoutingInfo {
        version: cluster.routing_version(),
        nodes: nodes.to_vec(),
        chains,
        chain_tables: vec![table],
        meta_servers: meta_servers.to_vec(),
    }
}

fn node_infos(cluster: &ClusterState) -> Vec<NodeInfo> {
    cluster.nodes().values().filter(|n| !n.address.is_empty()).map(|n| NodeInfo { node_id: n.node, address: n.address.clone() }).collect()
}

const ALL_STATES: [PublicTargetState; 5] = [
    PublicTargetState::Serving,
    PublicTargetState::LastSrv,
    PublicTargetState::Syncing,
    PublicTargetState::Waiting,
    PublicTargetState::Offline,
];

/// The `state` label of a public target state.
fn state_label(state: PublicTargetState) -> &'static str {
    match state {
        PublicTargetState::Serving => "serving",
        PublicTargetState::LastSrv => "lastsrv",
        PublicTargetState::Syncing => "syncing",
        PublicTargetState::Waiting => "waiting",
        PublicTargetState::Offline => "offline",
    }
}

impl Mgmtd {
    pub fn new(config: MgmtdConfig, layout: Layout, engine: Arc<dyn KvEngine>, clock: Arc<dyn Clock>) -> Result<Self> {
        layout.validate().map_err(MgmtdError::Layout)?;
        let (routing_tx, _) = watch::channel(Arc::new(RoutingInfo::default()));
        let mgmtd = Mgmtd {
            inner: Arc::new(Inner {
                config,
                layout,
                engine,
                clock,
                address: Mutex::new(String::new()),
                primary: Mutex::new(None),
                lease_seen: Mutex::new(None),
                lease_watch: Mutex::new(None),
                routing_tx,
                step: tokio::sync::Mutex::new(()),
                registry: MetricsRegistry::new(),
            }),
        };
        // Weak: the registry lives in `Inner`.
        let weak = Arc::downgrade(&mgmtd.inner);
        mgmtd.inner.registry.register_snapshot(move |snap| {
            if let Some(inner) = weak.upgrade() {
                Mgmtd { inner }.snapshot_metrics(snap);
            }
        });
        Ok(mgmtd)
    }

    /// The registry served on `GET /metrics` of this instance's port.
    pub fn metrics(&self) -> &Arc<MetricsRegistry> {
        &self.inner.registry
    }

    /// The values read at scrape time (table in docs/metrics.md, "mgmtd"):
    /// from the routing info last published and, on the primary, the node
    /// records. A standby reports `fskv_mgmtd_primary 0` and no chains.
    fn snapshot_metrics(&self, snap: &mut Snapshot) {
        let routing = self.routing();
        snap.gauge("fskv_mgmtd_primary", "1 if this instance is the primary", vec![], f64::from(u8::from(self.is_primary())));
        snap.gauge("fskv_mgmtd_routing_version", "Version of the routing info last published", vec![], routing.version as f64);
        let mut per_state: BTreeMap<&'static str, u64> = ALL_STATES.iter().map(|s| (state_label(*s), 0)).collect();
        for chain in &routing.chains {
            let chain_label = chain.chain_id.0.to_string();
            snap.gauge("fskv_mgmtd_chain_version", "Chain version", vec![("chain", chain_label.clone())], f64::from(chain.chain_version));
            for t in &chain.targets {
                let labels =
                    vec![("chain", chain_label.clone()), ("target", t.target_id.0.to_string()), ("state", state_label(t.state).into())];
                snap.gauge("fskv_mgmtd_target_state", "1 for the public state a target is in (one series per target)", labels, 1.0);
                *per_state.entry(state_label(t.state)).or_default() += 1;
            }
        }
        for (state, n) in per_state {
            snap.gauge("fskv_mgmtd_targets", "Targets by public state", vec![("state", state.into())], n as f64);
        }
        let (alive, dead) = match self.inner.primary.lock().as_ref() {
            Some(p) => {
                let alive = p.cluster.nodes().values().filter(|n| n.alive).count();
                (alive, p.cluster.nodes().len() - alive)
            }
            None => (0, 0),
        };
        snap.gauge(
            "fskv_mgmtd_storage_nodes",
            "Storage nodes known to the primary, by liveness",
            vec![("alive", "true".into())],
            alive as f64,
        );
        snap.gauge(
            "fskv_mgmtd_storage_nodes",
            "Storage nodes known to the primary, by liveness",
            vec![("alive", "false".into())],
            dead as f64,
        );
        snap.gauge("fskv_mgmtd_meta_servers", "Meta servers in the routing info", vec![], routing.meta_servers.len() as f64);
    }

    pub fn id(&self) -> &str {
        &self.inner.config.id
    }

    pub fn config(&self) -> &MgmtdConfig {
        &self.inner.config
    }

    pub fn is_primary(&self) -> bool {
        self.inner.primary.lock().is_some()
    }

    /// The routing info last published (empty while not primary).
    pub fn routing(&self) -> Arc<RoutingInfo> {
        self.inner.routing_tx.borrow().clone()
    }

    pub fn set_address(&self, addr: &str) {
        *self.inner.address.lock() = addr.to_string();
    }

    /// Binds `addr`, serves the RPCs and starts the lease and tick loops.
    pub async fn serve(self, addr: &str) -> anyhow::Result<RunningMgmtd> {
        self.serve_on(Arc::new(TcpTransport::new()), addr).await
    }

    pub async fn serve_on(self, transport: Arc<dyn Transport>, addr: &str) -> anyhow::Result<RunningMgmtd> {
        let server = Server::bind(transport, addr, self.router(), ServerConfig::default()).await?;
        self.set_address(server.local_addr());
        let span = info_span!("mgmtd", id = %self.id());
        let lease = tokio::spawn(self.clone().lease_loop().instrument(span.clone()));
        let ticker = tokio::spawn(self.clone().tick_loop().instrument(span));
        info!(addr = server.local_addr(), id = %self.id(), "mgmtd up");
        Ok(RunningMgmtd { mgmtd: self, server, tasks: vec![lease, ticker] })
    }

    async fn lease_loop(self) {
        let period = Duration::from_millis((self.inner.config.lease_ms / 3).max(1));
        loop {
            if let Err(e) = self.renew_lease_once().await {
                warn!(error = %e, "lease round failed");
            }
            tokio::time::sleep(period).await;
        }
    }

    async fn tick_loop(self) {
        let period = Duration::from_millis(self.inner.config.tick_interval_ms.max(1));
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = self.tick_once().await {
                warn!(error = %e, "tick failed");
            }
        }
    }

    /// One lease round: take or renew the lease; become primary (loading
    /// the state) or step down accordingly. Returns whether primary after.
    pub async fn renew_lease_once(&self) -> Result<bool> {
        let _step = self.inner.step.lock().await;
        let cfg = &self.inner.config;
        let clock = &self.inner.clock;
        // Before the transaction: the holder's lease runs from here.
        let started = clock.monotonic_ms();
        let stale = self
            .inner
            .lease_watch
            .lock()
            .as_ref()
            .filter(|(_, since)| started.saturating_sub(*since) >= cfg.lease_ms)
            .map(|(record, _)| record.clone());
        let address = self.inner.address.lock().clone();
        let lease = match store::acquire_lease(&*self.inner.engine, &cfg.id, &address, clock.now_ms(), cfg.lease_ms, stale.as_ref()).await {
            Ok(l) => l,
            Err(e) => {
                self.step_down_if_expired(clock.monotonic_ms());
                return Err(e);
            }
        };
        *self.inner.lease_seen.lock() = Some(lease.clone());
        if lease.holder != cfg.id {
            {
                // After the transaction: the record was written before this.
                let mut watch = self.inner.lease_watch.lock();
                if watch.as_ref().is_none_or(|(record, _)| *record != lease) {
                    *watch = Some((lease.clone(), clock.monotonic_ms()));
                }
            }
            if self.inner.primary.lock().take().is_some() {
                warn!(primary = %lease.holder, "lost the primary lease; standing by");
            }
            return Ok(false);
        }
        *self.inner.lease_watch.lock() = None;
        if stale.is_some() {
            info!(previous = ?stale.as_ref().map(|l| &l.holder), "took over the lease: its record was unchanged for a whole lease");
        }
        let until = started.saturating_add(cfg.lease_ms);
        let was_primary = {
            let mut p = self.inner.primary.lock();
            if let Some(p) = p.as_mut() {
                p.lease_until_ms = until;
                true
            } else {
                false
            }
        };
        if !was_primary {
            self.become_primary(until).await?;
        }
        Ok(true)
    }

    fn step_down_if_expired(&self, now: u64) {
        let mut p = self.inner.primary.lock();
        if p.as_ref().is_some_and(|p| p.lease_until_ms <= now) {
            warn!("primary lease expired without renewal; standing by");
            *p = None;
        }
    }

    async fn become_primary(&self, lease_until_ms: u64) -> Result<()> {
        let cfg = &self.inner.config;
        let persisted = store::load_or_bootstrap(&*self.inner.engine, &cfg.id, self.inner.layout).await?;
        let now = self.inner.clock.monotonic_ms();
        let placement = Layout::placement(&persisted.chains);
        let mut cluster =
            ClusterState::new(ClusterConfig { heartbeat_timeout_ms: cfg.heartbeat_timeout_ms }, persisted.chains.clone(), placement);
        // A new routing version, so everyone notices the new primary's view.
        let version = persisted.routing_version + 1;
        cluster.set_routing_version(version);
        for node in persisted.layout.node_ids() {
            let rec = persisted.nodes.get(&node).cloned().unwrap_or(NodeRecordKv { address: String::new(), generation: 0 });
            cluster.restore_node(node, rec.address, rec.generation, now);
        }
        cluster.assume_local_states_from_public();
        let mut meta = MetaRegistry::default();
        for (node, rec) in &persisted.meta_servers {
            meta.restore(*node, rec.address.clone(), rec.generation, now);
        }
        let published_meta = meta.alive(now, cfg.meta_timeout_ms);
        store::write_changes(&*self.inner.engine, &cfg.id, &Changes { routing_version: Some(version), ..Default::default() }).await?;
        let published_nodes = node_infos(&cluster);
        let routing = routing_of(&cluster, &published_nodes, &published_meta);
        info!(routing_version = version, chains = persisted.chains.len(), "became primary");
        *self.inner.primary.lock() = Some(Primary {
            cluster,
            lease_until_ms,
            persisted_nodes: persisted.nodes,
            published_nodes,
            meta,
            persisted_meta: persisted.meta_servers,
            published_meta,
        });
        self.inner.routing_tx.send_replace(Arc::new(routing));
        Ok(())
    }

    /// One tick (primary only): expire nodes, recompute chains, persist,
    /// publish. Returns whether the routing changed.
    pub async fn tick_once(&self) -> Result<bool> {
        let _step = self.inner.step.lock().await;
        let now = self.inner.clock.monotonic_ms();
        let (changes, routing) = {
            let mut guard = self.inner.primary.lock();
            let Some(p) = guard.as_mut() else { return Ok(false) };
            if p.lease_until_ms <= now {
                warn!("primary lease expired; standing by");
                *guard = None;
                return Ok(false);
            }
            let out = p.cluster.tick(now);
            for n in &out.failed_nodes {
                warn!(node = %n, "no heartbeat for T; node failed");
            }
            for o in &out.sync_orders {
                info!(chain = %o.chain, chain_ver = o.chain_version, predecessor = %o.predecessor, target = %o.target, "sync order");
            }
            let nodes = node_infos(&p.cluster);
            let meta_servers = p.meta.alive(now, self.inner.config.meta_timeout_ms);
            let nodes_changed = nodes != p.published_nodes || meta_servers != p.published_meta;
            if nodes_changed && out.changed_chains.is_empty() {
                p.cluster.bump_routing_version();
            }
            let mut changes = Changes::default();
            for n in p.cluster.nodes().values() {
                let rec = NodeRecordKv { address: n.address.clone(), generation: n.generation };
                if !n.address.is_empty() && p.persisted_nodes.get(&n.node) != Some(&rec) {
                    changes.nodes.push((n.node, rec));
                }
            }
            for (id, r) in p.meta.records() {
                let rec = NodeRecordKv { address: r.address.clone(), generation: r.generation };
                if p.persisted_meta.get(id) != Some(&rec) {
                    changes.meta_servers.push((*id, rec));
                }
            }
            if out.changed_chains.is_empty() && !nodes_changed && changes.nodes.is_empty() && changes.meta_servers.is_empty() {
                return Ok(false);
            }
            for id in &out.changed_chains {
                if let Some(view) = p.cluster.chains().get(id) {
                    let view: &ChainView = view;
                    info!(chain = %id, chain_ver = view.version, targets = ?view.targets.iter().map(|t| (t.target.0, t.public)).collect::<Vec<_>>(), "chain changed");
                    changes.chains.push((*id, view.clone()));
                }
            }
            let routing_changed = !out.changed_chains.is_empty() || nodes_changed;
            if routing_changed {
                changes.routing_version = Some(p.cluster.routing_version());
                p.published_nodes = nodes.clone();
                p.published_meta = meta_servers.clone();
            }
            let routing = routing_changed.then(|| routing_of(&p.cluster, &nodes, &meta_servers));
            (changes, routing)
        };
        if let Err(e) = store::write_changes(&*self.inner.engine, &self.inner.config.id, &changes).await {
            error!(error = %e, "persisting mgmtd state failed; standing by");
            *self.inner.primary.lock() = None;
            return Err(e);
        }
        if let Some(p) = self.inner.primary.lock().as_mut() {
            for (id, rec) in &changes.nodes {
                p.persisted_nodes.insert(*id, rec.clone());
            }
            for (id, rec) in &changes.meta_servers {
                p.persisted_meta.insert(*id, rec.clone());
            }
        }
        match routing {
            Some(r) => {
                info!(routing_version = r.version, "routing published");
                self.inner.routing_tx.send_replace(Arc::new(r));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn not_primary(&self) -> MgmtdError {
        let primary = self.inner.lease_seen.lock().as_ref().map(|l| format!("{} at {}", l.holder, l.address));
        MgmtdError::NotPrimary { primary }
    }

    /// The Heartbeat RPC. The first heartbeat of a new node generation (or
    /// address) is persisted before it is acknowledged, so a primary dying
    /// right after still leaves the next one fencing the old process.
    pub async fn heartbeat(&self, req: &HeartbeatReq) -> Result<HeartbeatResp> {
        if self.is_unpersisted_generation(req) {
            let _step = self.inner.step.lock().await;
            self.persist_node(req).await?;
        }
        self.apply_heartbeat(req)
    }

    /// Whether `req` names a generation (or address) of its node newer than
    /// what this primary persisted, and not older than the one it knows.
    fn is_unpersisted_generation(&self, req: &HeartbeatReq) -> bool {
        let guard = self.inner.primary.lock();
        let Some(p) = guard.as_ref() else { return false };
        // Only nodes of the layout (their targets are placed): a stray node
        // id is rejected by the heartbeat itself, unpersisted.
        if !p.cluster.placement().values().any(|t| t.node == req.node_id) {
            return false;
        }
        let known = p.cluster.nodes().get(&req.node_id).map_or(0, |n| n.generation);
        let persisted = p.persisted_nodes.get(&req.node_id);
        req.generation >= known
            && persisted.is_none_or(|r| r.generation < req.generation || (r.generation == req.generation && r.address != req.address))
    }

    /// Writes `req`'s node record (lease-checked) and remembers it as persisted.
    async fn persist_node(&self, req: &HeartbeatReq) -> Result<()> {
        if !self.is_unpersisted_generation(req) {
            return Ok(()); // persisted meanwhile (by a tick or a concurrent heartbeat)
        }
        let rec = NodeRecordKv { address: req.address.clone(), generation: req.generation };
        let changes = Changes { nodes: vec![(req.node_id, rec.clone())], ..Default::default() };
        if let Err(e) = store::write_changes(&*self.inner.engine, &self.inner.config.id, &changes).await {
            error!(node = %req.node_id, generation = req.generation, error = %e, "persisting a new node generation failed; standing by");
            *self.inner.primary.lock() = None;
            return Err(e);
        }
        if let Some(p) = self.inner.primary.lock().as_mut() {
            p.persisted_nodes.insert(req.node_id, rec);
        }
        Ok(())
    }

    fn apply_heartbeat(&self, req: &HeartbeatReq) -> Result<HeartbeatResp> {
        let now = self.inner.clock.monotonic_ms();
        let mut guard = self.inner.primary.lock();
        let Some(p) = guard.as_mut() else { return Err(self.not_primary()) };
        if p.lease_until_ms <= now {
            return Err(self.not_primary());
        }
        let hb = Heartbeat { node: req.node_id, address: req.address.clone(), generation: req.generation, targets: req.targets.clone() };
        match p.cluster.heartbeat(&hb, now) {
            Ok(ack) => Ok(HeartbeatResp { routing_version: ack.routing_version, lease_ms: ack.lease_expires_ms.saturating_sub(now) }),
            Err(e) => {
                warn!(node = %req.node_id, generation = req.generation, error = %e, "heartbeat rejected");
                Err(e.into())
            }
        }
    }

    /// The MetaHeartbeat RPC (primary only): a meta server registers or
    /// renews; the next tick publishes a changed list of meta servers.
    pub fn meta_heartbeat(&self, req: &MetaHeartbeatReq) -> Result<MetaHeartbeatResp> {
        let now = self.inner.clock.monotonic_ms();
        let mut guard = self.inner.primary.lock();
        let Some(p) = guard.as_mut() else { return Err(self.not_primary()) };
        if p.lease_until_ms <= now {
            return Err(self.not_primary());
        }
        if let Err(e) = p.meta.heartbeat(req.node_id, &req.address, req.generation, now) {
            warn!(node = %req.node_id, generation = req.generation, error = %e, "meta heartbeat rejected");
            return Err(e.into());
        }
        Ok(MetaHeartbeatResp { routing_version: p.cluster.routing_version(), timeout_ms: self.inner.config.meta_timeout_ms })
    }

    /// The GetRouting RPC (long poll, bounded).
    pub async fn get_routing(&self, req: &GetRoutingReq) -> Result<GetRoutingResp> {
        if !self.is_primary() {
            return Err(self.not_primary());
        }
        let mut rx = self.inner.routing_tx.subscribe();
        let wait = Duration::from_millis(req.wait_ms.min(self.inner.config.max_routing_wait_ms));
        if rx.borrow().version <= req.known_version && !wait.is_zero() {
            let _ = tokio::time::timeout(wait, rx.wait_for(|r| r.version > req.known_version)).await;
        }
        if !self.is_primary() {
            return Err(self.not_primary());
        }
        let current = self.routing();
        let version = current.version;
        Ok(GetRoutingResp { routing: (version > req.known_version).then(|| (*current).clone()), version })
    }

    /// The Status RPC (any instance).
    pub fn status(&self) -> MgmtdStatusResp {
        let now = self.inner.clock.monotonic_ms();
        // The primary as last seen: this instance while it holds the lease,
        // else the holder of a record seen changing within the last lease.
        let watched_live =
            self.inner.lease_watch.lock().as_ref().is_none_or(|(_, since)| now.saturating_sub(*since) < self.inner.config.lease_ms);
        let me_primary = self.is_primary();
        let primary = self
            .inner
            .lease_seen
            .lock()
            .as_ref()
            .filter(|l| if l.holder == self.inner.config.id { me_primary } else { watched_live })
            .map(|l| (l.holder.clone(), l.address.clone()));
        let guard = self.inner.primary.lock();
        let meta_servers = guard.as_ref().map(|p| p.published_meta.clone()).unwrap_or_default();
        let (nodes, chains, routing_version) = match guard.as_ref() {
            Some(p) => {
                let nodes = p
                    .cluster
                    .nodes()
                    .values()
                    .map(|n| NodeStatus {
                        node_id: n.node,
                        address: n.address.clone(),
                        generation: n.generation,
                        alive: n.alive,
                        last_heartbeat_age_ms: now.saturating_sub(n.last_heartbeat_ms),
                    })
                    .collect();
                let chains = p
                    .cluster
                    .chains()
                    .iter()
                    .map(|(id, v)| ChainStatus {
                        chain_id: *id,
                        chain_version: v.version,
                        targets: v
                            .targets
                            .iter()
                            .map(|t| TargetStatus {
                                target_id: t.target,
                                node_id: crate::layout::node_of(t.target),
                                public: t.public,
                                local: t.local,
                            })
                            .collect(),
                    })
                    .collect();
                (nodes, chains, p.cluster.routing_version())
            }
            None => (Vec::new(), Vec::new(), 0),
        };
        MgmtdStatusResp {
            mgmtd_id: self.inner.config.id.clone(),
            is_primary: guard.is_some(),
            primary,
            routing_version,
            heartbeat_timeout_ms: self.inner.config.heartbeat_timeout_ms,
            nodes,
            chains,
            meta_servers,
        }
    }

    pub fn router(&self) -> Router {
        let m = self.clone();
        let router = Router::new().with_metrics(self.inner.registry.clone()).route::<HeartbeatMethod, _, _>(
            move |ctx: RequestContext, req: HeartbeatReq, _payload| {
                let m = m.clone();
                async move {
                    authorize_heartbeat(ctx.principal.as_ref(), &format!("node:{}", req.node_id.0))?;
                    m.heartbeat(&req).await.map(|r| (r, Bytes::new())).map_err(Status::from)
                }
            },
        );
        let m = self.clone();
        let router = router.route::<GetRouting, _, _>(move |_ctx, req: GetRoutingReq, _payload| {
            let m = m.clone();
            async move { m.get_routing(&req).await.map(|r| (r, Bytes::new())).map_err(Status::from) }
        });
        let m = self.clone();
        let router = router.route::<MetaHeartbeat, _, _>(move |ctx: RequestContext, req: MetaHeartbeatReq, _payload| {
            let m = m.clone();
            async move {
                authorize_heartbeat(ctx.principal.as_ref(), &format!("meta:{}", req.node_id.0))?;
                m.meta_heartbeat(&req).map(|r| (r, Bytes::new())).map_err(Status::from)
            }
        });
        let m = self.clone();
        router.route::<MgmtdStatus, _, _>(move |_ctx, _req: MgmtdStatusReq, _payload| {
            let m = m.clone();
            async move { Ok((m.status(), Bytes::new())) }
        })
    }
}

/// "Who may heartbeat" (module doc): `expected` is the principal name of the
/// node the heartbeat speaks for; `None` is a server without authentication.
fn authorize_heartbeat(principal: Option<&Principal>, expected: &str) -> std::result::Result<(), Status> {
    match principal {
        Some(p) if p.name() != expected => {
            let e = MgmtdError::WrongPrincipal { claimed: expected.to_string(), principal: p.name().to_string() };
            warn!(error = %e, "heartbeat refused");
            Err(e.into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod authorize_tests {
    use super::*;

    #[test]
    fn heartbeats_only_from_the_node_itself() {
        let p = |n: &str| Principal::new(n).unwrap();
        assert!(authorize_heartbeat(Some(&p("node:5")), "node:5").is_ok());
        assert!(authorize_heartbeat(None, "node:5").is_ok(), "no authentication configured");
        for wrong in ["node:6", "client", "meta:5", "gateway", "fuse"] {
            let e = authorize_heartbeat(Some(&p(wrong)), "node:5").unwrap_err();
            assert_eq!(e.code, fskv_types::ErrorCode::PermissionDenied, "{wrong}");
        }
        assert!(authorize_heartbeat(Some(&p("meta:1")), "meta:1").is_ok());
        assert!(authorize_heartbeat(Some(&p("node:1")), "meta:1").is_err());
    }
}
