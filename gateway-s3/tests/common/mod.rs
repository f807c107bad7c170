//! A gateway over an in-process meta service (memory KV, no storage):
//! enough for everything that stays inline (objects up to 4 KiB).

use fskv_client::storage::{RoutingPublisher, StorageClient, StorageClientConfig};
use fskv_client::{FsClient, FsClientConfig, MetaClient, MetaClientConfig};
use fskv_gateway_s3::ops::Gateway;
use fskv_gateway_s3::store::Store;
use fskv_gateway_s3::{AccessKey, GatewayConfig, KeyStore, Role};
use fskv_meta::{MetaConfig, MetaService, NoStorage, StorageBackend};
use fskv_proto::routing::RoutingInfo;
use std::sync::Arc;

/// A writer gateway with bucket `bkt`, changed by `tune` first; the meta
/// server must be shut down by the caller.
pub async fn gateway(tune: impl FnOnce(&mut GatewayConfig)) -> (Gateway, fskv_rpc::Server) {
    let cfg = MetaConfig { gc_interval_ms: 0, ..MetaConfig::default() };
    let svc =
        MetaService::open(Arc::new(fskv_kv::MemoryEngine::new()), Arc::new(NoStorage) as Arc<dyn StorageBackend>, cfg).await.expect("meta");
    let server = svc.serve("127.0.0.1:0").await.expect("serve");
    let gw = gateway_on(&server, tune).await;
    gw.create_bucket("bkt").await.expect("bucket");
    (gw, server)
}

/// A writer gateway of its own (its own caches, as another gateway process
/// has) over the meta service `server`.
pub async fn gateway_on(server: &fskv_rpc::Server, tune: impl FnOnce(&mut GatewayConfig)) -> Gateway {
    let meta = MetaClient::new(MetaClientConfig::new(vec![server.local_addr().to_string()])).expect("client");
    let (publisher, _) = RoutingPublisher::new(RoutingInfo::default());
    let rpc = fskv_rpc::RpcClient::new(Arc::new(fskv_rpc::TcpTransport::new()), fskv_rpc::ClientConfig::default());
    let storage = StorageClient::new(rpc, publisher.handle(), StorageClientConfig::default());
    let fs = FsClient::new(meta, storage, FsClientConfig::default());
    let store = Store::open(fs, "/s3", true).await.expect("store");
    let keys = Arc::new(KeyStore::new(vec![AccessKey::new("a", "b")]).expect("keys"));
    let mut cfg = GatewayConfig::new("127.0.0.1:0".parse().expect("addr"), Role::Writer, keys);
    tune(&mut cfg);
    Gateway { store, cfg: Arc::new(cfg), access: Arc::default() }
}

/// A body of `data` in one piece.
#[allow(dead_code)] // not every test file sends bodies
pub fn blob(data: &[u8]) -> s3s::dto::StreamingBlob {
    let b = bytes::Bytes::copy_from_slice(data);
    s3s::dto::StreamingBlob::wrap(futures::stream::once(async move { Ok::<_, std::io::Error>(b) }))
}

/// A plain PutObject of `key` into `bucket`: no headers, tags, ACL or condition.
#[allow(dead_code)] // not every test file puts
pub fn put_args<'a>(bucket: &'a str, key: &'a str) -> fskv_gateway_s3::ops::object::PutArgs<'a> {
    fskv_gateway_s3::ops::object::PutArgs {
        bucket,
        key,
        headers: Default::default(),
        user: Default::default(),
        tags: None,
        if_match: None,
        if_none_match: None,
        acl: None,
    }
}
