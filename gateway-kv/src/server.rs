//! The process: the native API (and the Consul API when configured) on the
//! shared gateway layer (`fskv-gateway`: connections, timeouts, limits,
//! reader guard, authentication, metrics, request ids), the access-log
//! flusher every process runs, and the writer's maintenance loop.
//!
//! | task | who | what |
//! |---|---|---|
//! | native API | every process, `--listen` | [`KvHttp`]: classify by [`crate::route::classify`], dispatch by [`NativeOp`], errors as JSON |
//! | Consul API | every process with `--consul-listen`; with `--consul-only` on `--listen` instead of the native API (a process of the front's Consul pools) | [`crate::consul::ConsulHttp`] |
//! | access-log flush | every process | every `recency_flush_interval_ms` (or early past `recency_max_entries` keys): one log file per namespace with the accesses served (recency, hits, misses, reads in flight) |
//! | maintenance | the writer unless `--no-maintenance` | `maintain.rs`: merge, TTL expiry, eviction, stats, checkpoints |

use crate::body::KvBody;
use crate::config::KvConfig;
use crate::error::KvError;
use crate::maintain::Maintainer;
use crate::ops::{Kv, KvState};
use crate::record::{self, IndexClock};
use crate::route::{self, NativeOp, Query};
use crate::store::Store;
use bytes::Bytes;
use fskv_client::FsClient;
use fskv_gateway::{Authenticator, GatewayError, Metrics, Protocol, RequestBody, RequestContext, Role, Route, ServerConfig, ServerHandle};
use http::request::Parts;
use http::{Request, Response};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The native KV protocol on the shared layer.
pub struct KvHttp {
    pub kv: Kv,
}

impl Protocol for KvHttp {
    type Body = KvBody;

    fn name(&self) -> &'static str {
        "kv"
    }

    fn classify(&self, parts: &Parts) -> Route {
        route::classify(parts)
    }

    async fn handle(&self, req: Request<RequestBody>, cx: RequestContext) -> Response<KvBody> {
        let (parts, body) = req.into_parts();
        match dispatch(&self.kv, &parts, body, cx.principal.as_ref()).await {
            Ok(r) => r,
            Err(e) => e.response(&cx.request_id).map(KvBody::full),
        }
    }

    fn error_response(&self, err: &GatewayError, cx: &RequestContext) -> Response<Bytes> {
        err.reply().json(&cx.request_id)
    }
}

/// The uid/gid of the tenant a request acts for (every native route but
/// `Health` is authenticated by the shared layer).
fn caller(kv: &Kv, principal: Option<&fskv_gateway::Principal>) -> Result<fskv_gateway::TenantIds, KvError> {
    let p = principal.ok_or_else(|| KvError::AccessDenied("the request is not authenticated".into()))?;
    kv.cfg.keys.tenant(&p.tenant).ok_or_else(|| KvError::AccessDenied("the key's tenant is not known to this gateway".into()))
}

/// Ownership: a namespace is its directory's owner uid's (the tenant's).
///
/// | operation | another tenant's namespace |
/// |---|---|
/// | `GET /v1/ns` | not listed |
/// | `PUT /v1/ns/{ns}` | 403 `AccessDenied` (a new namespace is the caller's) |
/// | every other operation on `{ns}` | 403 `AccessDenied`, nothing read or changed |
async fn authorize(kv: &Kv, ns: &str, owner: fskv_gateway::TenantIds) -> Result<(), KvError> {
    let n = kv.store.namespace(ns).await?;
    if n.owner_uid != owner.uid {
        return Err(KvError::AccessDenied(format!("namespace {ns:?} belongs to another tenant")));
    }
    Ok(())
}

async fn dispatch(
    kv: &Kv,
    parts: &Parts,
    body: RequestBody,
    principal: Option<&fskv_gateway::Principal>,
) -> Result<Response<KvBody>, KvError> {
    let query = Query::parse(parts.uri.query());
    let op = route::parse_native(&parts.method, parts.uri.path(), &query)?;
    let owner = match &op {
        NativeOp::Health => None,
        _ => Some(caller(kv, principal)?),
    };
    if let (
        NativeOp::GetNamespace { ns }
        | NativeOp::DeleteNamespace { ns }
        | NativeOp::Get { ns, .. }
        | NativeOp::Head { ns, .. }
        | NativeOp::Put { ns, .. }
        | NativeOp::Delete { ns, .. }
        | NativeOp::Watch { ns, .. }
        | NativeOp::Scan { ns }
        | NativeOp::WatchPrefix { ns }
        | NativeOp::DeletePrefix { ns }
        | NativeOp::Batch { ns, .. },
        Some(owner),
    ) = (&op, owner)
    {
        authorize(kv, ns, owner).await?;
    }
    let owner = owner.unwrap_or(fskv_gateway::TenantIds::DEFAULT);
    match op {
        NativeOp::Health => {
            Ok(crate::ops::json(http::StatusCode::OK, &serde_json::json!({ "status": "ok", "role": kv.cfg.role.as_str() })))
        }
        NativeOp::ListNamespaces => kv.list_namespaces(owner).await,
        NativeOp::GetNamespace { ns } => kv.get_namespace(&ns).await,
        NativeOp::PutNamespace { ns } => kv.put_namespace(&ns, body, owner).await,
        NativeOp::DeleteNamespace { ns } => kv.delete_namespace(&ns).await,
        NativeOp::Get { ns, key } => kv.get(&ns, &key, parts, false).await,
        NativeOp::Head { ns, key } => kv.get(&ns, &key, parts, true).await,
        NativeOp::Put { ns, key } => kv.put(&ns, &key, parts, &query, body).await,
        NativeOp::Delete { ns, key } => kv.delete(&ns, &key, parts).await,
        NativeOp::Watch { ns, key } => kv.watch(&ns, &key, parts, &query).await,
        NativeOp::Scan { ns } => kv.scan(&ns, &query).await,
        NativeOp::WatchPrefix { ns } => kv.watch_prefix(&ns, &query).await,
        NativeOp::DeletePrefix { ns } => kv.delete_prefix(&ns, &query).await,
        NativeOp::Batch { ns, op } => kv.batch(&ns, op, body).await,
    }
}

/// A running KV gateway; [`KvHandle::stop`] stops it gracefully.
pub struct KvHandle {
    pub addr: SocketAddr,
    pub consul_addr: Option<SocketAddr>,
    pub kv: Kv,
    pub metrics: Arc<Metrics>,
    server: ServerHandle,
    consul: Option<ServerHandle>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl KvHandle {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.server.stop().await;
        if let Some(c) = self.consul {
            c.stop().await;
        }
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        // What was served since the last flush.
        flush_accesses(&self.kv).await;
    }
}

/// What a gateway process has before it serves: the store opened, the
/// writer's maintainer, the key store and the metrics.
struct Opened {
    kv: Kv,
    maint: Option<Arc<Maintainer>>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
}

async fn open(cfg: &KvConfig, fs: FsClient) -> Result<Opened, String> {
    if cfg.keys.is_empty() {
        return Err("no access keys configured: every request must be authenticated".into());
    }
    cfg.limits.validate()?;
    cfg.http.validate()?;
    let store = Store::open(fs, &cfg.root_path).await?;
    let maint = (cfg.role == Role::Writer && cfg.maintenance.enabled)
        .then(|| Maintainer::new(store.clone(), cfg.maintenance.clone(), cfg.limits.clone()));
    let kv = Kv(Arc::new(KvState {
        store,
        cfg: Arc::new(cfg.clone()),
        clock: IndexClock::default(),
        accesses: Default::default(),
        process_id: rand::random(),
        log_seq: AtomicU64::new(0),
        maint: maint.clone(),
        changed: tokio::sync::Notify::new(),
    }));
    if cfg.role == Role::Writer {
        // The Consul namespace exists before the first Consul request.
        if kv.store.namespace(&cfg.consul_namespace).await.is_err() {
            kv.store
                .put_namespace(&cfg.consul_namespace, &Default::default(), fskv_gateway::TenantIds::DEFAULT)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    let auth = Arc::new(Authenticator::new(Arc::clone(&cfg.keys), cfg.region.clone(), &["kv"], true));
    Ok(Opened { kv, maint, auth, metrics: Arc::new(Metrics::new()) })
}

fn server_config(cfg: &KvConfig, listen: SocketAddr, writer_endpoint: Option<String>) -> ServerConfig {
    ServerConfig { listen, role: cfg.role, writer_endpoint, tls: cfg.tls.clone(), limits: cfg.http.clone() }
}

/// Starts the access-log flusher and the writer's maintenance loop.
fn background(kv: &Kv, maint: Option<Arc<Maintainer>>) -> (watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>) {
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = vec![tokio::spawn(flush_loop(kv.clone(), stop_rx.clone()))];
    if let Some(m) = maint {
        tasks.push(tokio::spawn(m.run(stop_rx)));
    }
    (stop, tasks)
}

/// Opens the store, binds the ports and serves until stopped.
pub async fn start(cfg: KvConfig, fs: FsClient) -> Result<KvHandle, String> {
    let Opened { kv, maint, auth, metrics } = open(&cfg, fs).await?;
    if cfg.consul_only {
        // The Consul API alone, on `listen` (the front's Consul pools).
        let c = server_config(&cfg, cfg.listen, cfg.consul_writer_endpoint.clone());
        let proto = Arc::new(crate::consul::ConsulHttp { kv: kv.clone() });
        let server = fskv_gateway::serve(c, proto, auth, Arc::clone(&metrics)).await.map_err(|e| e.to_string())?;
        let (stop, tasks) = background(&kv, maint);
        tracing::info!(consul = %server.addr, role = %cfg.role, root = %cfg.root_path, "KV gateway serving the Consul API only");
        return Ok(KvHandle { addr: server.addr, consul_addr: Some(server.addr), kv, metrics, server, consul: None, stop, tasks });
    }
    let server_cfg = server_config(&cfg, cfg.listen, cfg.writer_endpoint.clone());
    let server = fskv_gateway::serve(server_cfg, Arc::new(KvHttp { kv: kv.clone() }), Arc::clone(&auth), Arc::clone(&metrics))
        .await
        .map_err(|e| e.to_string())?;
    let consul = match cfg.consul_listen {
        Some(listen) => {
            let c = server_config(&cfg, listen, cfg.consul_writer_endpoint.clone());
            let proto = Arc::new(crate::consul::ConsulHttp { kv: kv.clone() });
            Some(fskv_gateway::serve(c, proto, auth, Arc::clone(&metrics)).await.map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let (stop, tasks) = background(&kv, maint);
    tracing::info!(addr = %server.addr, consul = ?consul.as_ref().map(|c| c.addr), role = %cfg.role, root = %cfg.root_path, "KV gateway serving");
    Ok(KvHandle { addr: server.addr, consul_addr: consul.as_ref().map(|c| c.addr), kv, metrics, server, consul, stop, tasks })
}

/// Opens the store and serves the native API on `listener` (whose address
/// is `addr`), without the Consul API: the gateway host of the
/// deterministic simulation (`core-fs/sim`), whose network is not the OS's.
pub async fn start_on<L: fskv_gateway::Listener>(cfg: KvConfig, fs: FsClient, listener: L, addr: SocketAddr) -> Result<KvHandle, String> {
    if cfg.consul_only || cfg.consul_listen.is_some() {
        return Err("start_on serves the native API only (no Consul API)".into());
    }
    let Opened { kv, maint, auth, metrics } = open(&cfg, fs).await?;
    let server_cfg = server_config(&cfg, addr, cfg.writer_endpoint.clone());
    let server = fskv_gateway::serve_listener(listener, addr, server_cfg, Arc::new(KvHttp { kv: kv.clone() }), auth, Arc::clone(&metrics))
        .map_err(|e| e.to_string())?;
    let (stop, tasks) = background(&kv, maint);
    tracing::info!(%addr, role = %cfg.role, root = %cfg.root_path, "KV gateway serving");
    Ok(KvHandle { addr, consul_addr: None, kv, metrics, server, consul: None, stop, tasks })
}

/// Writes the accesses served since the last flush: one log per namespace.
pub async fn flush_accesses(kv: &Kv) {
    let logs = {
        let mut a = kv.accesses.lock();
        if a.is_empty() {
            return;
        }
        let mut seq = 0;
        let mut logs = a.take(kv.process_id, &mut seq, record::now_ns());
        // Sequence numbers shared with the lease logs (`ops/batch.rs`).
        for (_, log) in &mut logs {
            log.seq = kv.log_seq.fetch_add(1, Ordering::Relaxed);
        }
        logs
    };
    for (ns, log) in logs {
        let r = async {
            let dir = kv.recency_dir(&ns).await?;
            kv.store.write_file(dir, &log.file_name(), log.encode()).await
        }
        .await;
        if let Err(e) = r {
            tracing::warn!(namespace = %ns, error = %e, "could not write an access log; its recency is lost");
        }
    }
}

async fn flush_loop(kv: Kv, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(kv.cfg.maintenance.recency_flush_interval_ms.max(10));
    let check = every.min(Duration::from_millis(50));
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(check) => {}
            r = stop.changed() => if r.is_err() || *stop.borrow() { return },
        }
        let full = kv.accesses.lock().len() >= kv.cfg.maintenance.recency_max_entries;
        if full || last.elapsed() >= every {
            last = tokio::time::Instant::now();
            flush_accesses(&kv).await;
        }
    }
}
