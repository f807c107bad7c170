//! Shared by the cluster tests of the file API: chain placement over three
//! storage nodes and a client routing cache that lags the cluster's.

use fskv_client::storage::{RoutingHandle, RoutingPublisher, RoutingSource, StorageClient, StorageClientConfig};
use fskv_storage::cluster::LocalCluster;
use fskv_types::TargetId;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// `stripe` chains of `replicas` targets over three nodes: chain c has
/// targets c*10+1.. with heads rotated across the nodes.
pub fn chain_placement(stripe: u32, replicas: usize) -> Vec<Vec<(TargetId, usize)>> {
    (1..=stripe).map(|c| (0..replicas).map(|r| (TargetId(u64::from(c) * 10 + r as u64 + 1), (c as usize + r) % 3)).collect()).collect()
}

/// A client-side routing cache that only learns the cluster's routing when
/// asked (after a stale-version error), like a client whose mgmtd poll lags.
pub struct LaggingSource {
    cluster: RoutingHandle,
    client: RoutingPublisher,
}

impl RoutingSource for LaggingSource {
    fn request_refresh(&self, _known: u64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.client.publish((*self.cluster.current()).clone());
        })
    }
}

/// A storage client of `cluster` whose routing lags (see [`LaggingSource`]).
pub fn lagging_storage_client(cluster: &LocalCluster, config: StorageClientConfig) -> StorageClient {
    let (client, _) = RoutingPublisher::new((*cluster.routing()).clone());
    let source = Arc::new(LaggingSource { cluster: cluster.publisher().handle(), client });
    let handle = source.client.handle_with_source(source.clone());
    let rpc = fskv_rpc::RpcClient::new(Arc::new(fskv_rpc::TcpTransport::new()), fskv_rpc::ClientConfig::default());
    StorageClient::new(rpc, handle, config)
}
