//! The calling side of mgmtd: RPC method definitions (ids 3000–3999), a
//! client that follows the primary among several mgmtd addresses, and
//! [`MgmtdRoutingSource`], which keeps a [`RoutingPublisher`] up to date
//! from mgmtd (long poll + refresh on demand) for storage services and
//! clients alike.

use crate::storage::{RoutingHandle, RoutingPublisher, RoutingSource};
use bytes::Bytes;
use fskv_proto::mgmtd::*;
use fskv_proto::routing::RoutingInfo;
use fskv_rpc::{CallOptions, Method, RpcClient, RpcError};
use fskv_types::ErrorCode;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Limits of [`MgmtdClient`] and [`MgmtdRoutingSource`].
#[derive(Clone, Debug)]
pub struct MgmtdClientConfig {
    /// Deadline of one call (long polls add their wait).
    pub call_timeout_ms: u64,
    /// Long-poll wait of the routing source's background poll.
    pub routing_poll_wait_ms: u64,
    /// Pause after a failed poll before the next one.
    pub retry_delay_ms: u64,
}

impl Default for MgmtdClientConfig {
    fn default() -> Self {
        MgmtdClientConfig { call_timeout_ms: 2_000, routing_poll_wait_ms: 1_000, retry_delay_ms: 100 }
    }
}

/// Calls the primary among a list of mgmtd addresses: a call that fails
/// with `NotPrimary` or a transport error moves on to the next address.
#[derive(Clone)]
pub struct MgmtdClient {
    rpc: RpcClient,
    addrs: Arc<Vec<String>>,
    /// Index of the address that answered last (tried first).
    preferred: Arc<Mutex<usize>>,
    config: MgmtdClientConfig,
}

impl MgmtdClient {
    pub fn new(rpc: RpcClient, addrs: Vec<String>, config: MgmtdClientConfig) -> Self {
        MgmtdClient { rpc, addrs: Arc::new(addrs), preferred: Arc::new(Mutex::new(0)), config }
    }

    pub fn config(&self) -> &MgmtdClientConfig {
        &self.config
    }

    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// One call, trying every address once starting with the preferred one.
    pub async fn call<M: Method>(&self, req: &M::Req, extra_timeout_ms: u64) -> Result<M::Resp, RpcError> {
        let n = self.addrs.len();
        if n == 0 {
            return Err(RpcError::Remote(fskv_types::Status::new(ErrorCode::InvalidArgument, "no mgmtd address")));
        }
        let start = *self.preferred.lock();
        let opts = CallOptions { timeout_ms: self.config.call_timeout_ms + extra_timeout_ms };
        let mut last = None;
        for i in 0..n {
            let idx = (start + i) % n;
            match self.rpc.call::<M>(&self.addrs[idx], req, Bytes::new(), opts).await {
                Ok((resp, _)) => {
                    *self.preferred.lock() = idx;
                    return Ok(resp);
                }
                Err(e)
                    if e.code() == ErrorCode::NotPrimary
                        || e.code() == ErrorCode::ConnectionFailed
                        || e.code() == ErrorCode::DeadlineExceeded
                        || e.code() == ErrorCode::ShuttingDown =>
                {
                    debug!(addr = %self.addrs[idx], error = %e, "mgmtd call failed; trying the next address");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(RpcError::ShuttingDown))
    }

    pub async fn heartbeat(&self, req: &HeartbeatReq) -> Result<HeartbeatResp, RpcError> {
        self.call::<Heartbeat>(req, 0).await
    }

    pub async fn meta_heartbeat(&self, req: &MetaHeartbeatReq) -> Result<MetaHeartbeatResp, RpcError> {
        self.call::<MetaHeartbeat>(req, 0).await
    }

    pub async fn get_routing(&self, known_version: u64, wait_ms: u64) -> Result<GetRoutingResp, RpcError> {
        self.call::<GetRouting>(&GetRoutingReq { known_version, wait_ms }, wait_ms).await
    }

    /// Status of the mgmtd at `addr` (not only the primary).
    pub async fn status_of(&self, addr: &str) -> Result<MgmtdStatusResp, RpcError> {
        let opts = CallOptions { timeout_ms: self.config.call_timeout_ms };
        self.rpc.call::<MgmtdStatus>(addr, &MgmtdStatusReq {}, Bytes::new(), opts).await.map(|(r, _)| r)
    }
}

/// Feeds a [`RoutingPublisher`] from mgmtd: a background long poll plus
/// refreshes on demand (the [`RoutingSource`] of handles it creates).
pub struct MgmtdRoutingSource {
    client: MgmtdClient,
    publisher: RoutingPublisher,
    poller: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl MgmtdRoutingSource {
    /// Fetches the first routing info (retrying until `initial_timeout`),
    /// then starts the background poll.
    pub async fn start(client: MgmtdClient, initial_timeout: Duration) -> Result<Arc<Self>, RpcError> {
        let deadline = tokio::time::Instant::now() + initial_timeout;
        let first = loop {
            match client.get_routing(0, 0).await {
                Ok(GetRoutingResp { routing: Some(r), .. }) => break r,
                Ok(_) => {}
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(e) => debug!(error = %e, "waiting for mgmtd"),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RpcError::DeadlineExceeded { timeout_ms: initial_timeout.as_millis() as u64 });
            }
            tokio::time::sleep(Duration::from_millis(client.config.retry_delay_ms)).await;
        };
        info!(version = first.version, "routing from mgmtd");
        let (publisher, _) = RoutingPublisher::new(first);
        let source = Arc::new(MgmtdRoutingSource { client, publisher, poller: Mutex::new(None) });
        let weak = Arc::downgrade(&source);
        let poller = tokio::spawn(async move {
            loop {
                let Some(s) = weak.upgrade() else { return };
                let known = s.publisher.current().version;
                let wait_ms = s.client.config.routing_poll_wait_ms;
                let client = s.client.clone();
                drop(s);
                let result = client.get_routing(known, wait_ms).await;
                let Some(s) = weak.upgrade() else { return };
                match result {
                    Ok(resp) => {
                        if let Some(r) = resp.routing {
                            s.publish(r);
                        }
                    }
                    Err(e) => {
                        debug!(error = %e, "routing poll failed");
                        drop(s);
                        tokio::time::sleep(Duration::from_millis(client.config.retry_delay_ms)).await;
                    }
                }
            }
        });
        *source.poller.lock() = Some(poller);
        Ok(source)
    }

    fn publish(&self, r: RoutingInfo) {
        let version = r.version;
        if self.publisher.publish(r) {
            debug!(version, "routing updated");
        }
    }

    /// A handle that refreshes through this source.
    pub fn handle(self: &Arc<Self>) -> RoutingHandle {
        self.publisher.handle_with_source(self.clone())
    }

    pub fn current(&self) -> Arc<RoutingInfo> {
        self.publisher.current()
    }

    /// Wakes on every published routing change.
    pub fn subscribe(&self) -> fskv_rpc::watch::Receiver<Arc<RoutingInfo>> {
        self.publisher.handle().subscribe()
    }

    pub fn client(&self) -> &MgmtdClient {
        &self.client
    }

    /// Waits (at most `timeout`) until the routing lists at least `count`
    /// nodes with addresses: mgmtd shows a heartbeat at once, but the node's
    /// address enters the routing only at its next tick. Returns whether it did.
    pub async fn wait_for_nodes(&self, count: usize, timeout: Duration) -> bool {
        let mut rx = self.subscribe();
        let listed = |r: &RoutingInfo| r.nodes.iter().filter(|n| !n.address.is_empty()).count() >= count;
        tokio::time::timeout(timeout, async {
            while !listed(&rx.borrow_and_update()) {
                if rx.changed().await.is_err() {
                    return false;
                }
            }
            true
        })
        .await
        .unwrap_or(false)
    }

    /// The meta servers registered with mgmtd (`RoutingInfo::meta_servers`),
    /// waiting at most `timeout` for at least one: how a client finds meta
    /// when it was given no address. Empty if none registered in time.
    pub async fn wait_for_meta_servers(&self, timeout: Duration) -> Vec<String> {
        let mut rx = self.subscribe();
        let found = tokio::time::timeout(timeout, async {
            loop {
                let listed: Vec<String> = rx.borrow_and_update().meta_servers.iter().map(|n| n.address.clone()).collect();
                if !listed.is_empty() {
                    return listed;
                }
                if rx.changed().await.is_err() {
                    return Vec::new();
                }
            }
        })
        .await;
        found.unwrap_or_default()
    }

    /// Pulls routing now (e.g. a heartbeat ack announced a newer version).
    pub async fn refresh_now(&self) -> Result<(), RpcError> {
        let known = self.publisher.current().version;
        let resp = self.client.get_routing(known, 0).await?;
        if let Some(r) = resp.routing {
            self.publish(r);
        }
        Ok(())
    }

    /// Stops the background poll.
    pub fn stop(&self) {
        if let Some(p) = self.poller.lock().take() {
            p.abort();
        }
    }
}

impl Drop for MgmtdRoutingSource {
    fn drop(&mut self) {
        self.stop();
    }
}

impl RoutingSource for MgmtdRoutingSource {
    fn request_refresh(&self, known_version: u64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if self.publisher.current().version > known_version {
                return;
            }
            if let Err(e) = self.refresh_now().await {
                warn!(error = %e, "routing refresh from mgmtd failed");
            }
        })
    }
}
