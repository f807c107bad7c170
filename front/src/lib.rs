//! The front (`fskv front`): the public listeners of 3FS-KV. Every request
//! is classified by its protocol's own classifier (the function each
//! gateway crate exports) and forwarded to a process of that protocol's
//! **reader pool** or **writer pool**. Pools start gateway processes on
//! demand (from zero), add processes under load, drain and stop idle ones,
//! and replace crashed ones; or they are static upstreams (gateways on other
//! hosts) with health checks.
//!
//! | module | what |
//! |---|---|
//! | [`machine`] | one pool as a pure state machine (injected clock, deterministic tests) |
//! | [`pool`] | its async shell: spawning and stopping processes, readiness, probes, held requests, metrics |
//! | [`proxy`] | a public listener: classification, routing, streaming both ways, retries of idempotent reads |
//! | [`protocols`] | the table of routed protocols (classifier, gateway command, error format) |
//! | [`admin`] | `GET /status` and `/metrics` on the admin listener; `fskv admin status --front` |
//! | [`config`] | the `[front]` configuration section |
//! | [`error`] | [`FrontError`] → status and code, in one place |
//! | [`metrics`] | the pools' Prometheus metrics |
//!
//! Every listener (public and admin) is an [`fskv_gateway`] server: the same
//! timeouts, connection caps, limits, request ids and `/metrics` as the
//! gateways. See docs/front.md.

pub mod admin;
pub mod config;
pub mod error;
pub mod machine;
pub mod metrics;
pub mod pool;
pub mod protocols;
pub mod proxy;

pub use config::FrontConfig;
pub use error::FrontError;

use crate::pool::{Launch, Pool, ShellTiming, Source};
use crate::protocols::ProtocolSpec;
use crate::proxy::{FrontProtocol, ListenMode, UpstreamSettings};
use fskv_gateway::{Authenticator, HttpLimits, KeyStore, Metrics, Role, ServerConfig, ServerHandle, TlsFiles};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// One public listener.
#[derive(Clone, Debug)]
pub struct ListenerSpec {
    pub protocol: &'static ProtocolSpec,
    pub addr: SocketAddr,
    pub mode: ListenMode,
}

/// How the front starts gateway processes.
#[derive(Clone, Debug)]
pub struct GatewayLaunch {
    /// The `fskv` binary.
    pub program: PathBuf,
    /// `--config FILE` for every gateway (the front's own).
    pub config_file: Option<PathBuf>,
    pub mgmtd: Vec<String>,
    pub credentials: PathBuf,
    pub region: String,
    /// Extra arguments per protocol name.
    pub extra_args: Vec<(String, String)>,
    /// Gateways' output goes to `DIR/gateway-<protocol>-<role>.log` (else the front's stderr).
    pub log_dir: Option<PathBuf>,
}

/// Everything `start` needs.
#[derive(Clone, Debug)]
pub struct FrontOptions {
    pub listeners: Vec<ListenerSpec>,
    pub admin: Option<SocketAddr>,
    pub launch: GatewayLaunch,
    pub config: FrontConfig,
    /// The `[gateway]` limits: the front's listeners use them too.
    pub http: HttpLimits,
    pub tls: Option<TlsFiles>,
    /// Where the gateway processes' Unix sockets go (`[front] unix_sockets`):
    /// this directory (made 0700, stale `*.sock` files removed at start:
    /// its owner must be this front alone, as `fskv up`'s data directory
    /// is), or `None` for a private temporary directory removed at a clean
    /// exit (a killed front leaves it behind, empty).
    pub socket_dir: Option<PathBuf>,
}

/// A running front.
pub struct FrontHandle {
    /// (protocol, mode, server) per public listener.
    pub listeners: Vec<(&'static str, ListenMode, ServerHandle)>,
    pub admin: Option<ServerHandle>,
    pub pools: Vec<Arc<Pool>>,
    /// The return sockets (Unix) of handed connections, stopped after the pools.
    return_listeners: Vec<ServerHandle>,
    stop_grace: Duration,
    /// The gateway processes' Unix sockets (removed after the pools stop).
    _socket_dir: Option<tempfile::TempDir>,
}

impl FrontHandle {
    /// The address of a public listener.
    pub fn addr(&self, protocol: &str, mode: ListenMode) -> Option<SocketAddr> {
        self.listeners.iter().find(|(p, m, _)| *p == protocol && *m == mode).map(|(_, _, s)| s.addr)
    }

    /// Stops accepting, lets requests in flight finish (the shared layer's
    /// `shutdown_grace_ms`), then drains and stops every gateway process.
    pub async fn stop(self) {
        for (_, _, s) in self.listeners {
            s.stop().await;
        }
        let bound = self.stop_grace + Duration::from_secs(2);
        let stops = self.pools.iter().map(|p| p.shutdown(bound));
        futures_join_all(stops).await;
        for s in self.return_listeners {
            s.stop().await;
        }
        if let Some(a) = self.admin {
            a.stop().await;
        }
    }
}

/// Room for `consul-reader-<id>.sock` within `sun_path` (108 bytes).
const MAX_SOCKET_DIR_BYTES: usize = 72;

/// The directory of the gateways' Unix sockets (see
/// [`FrontOptions::socket_dir`]) and, for a temporary one, its guard. `None`
/// (the gateways are reached over TCP, with a warning) when it cannot be made.
fn socket_directory(configured: Option<&Path>) -> (Option<PathBuf>, Option<tempfile::TempDir>) {
    use std::os::unix::fs::PermissionsExt;
    // 0700 whatever the umask: only the front's user may reach the sockets.
    let private = std::fs::Permissions::from_mode(0o700);
    let made = match configured {
        Some(dir) => prepare_socket_dir(dir, private).map(|()| (dir.to_path_buf(), None)),
        None => tempfile::Builder::new().prefix("fskv-front-").permissions(private).tempdir().map(|d| (d.path().to_path_buf(), Some(d))),
    };
    match made {
        Ok((dir, _)) if dir.as_os_str().len() > MAX_SOCKET_DIR_BYTES => {
            tracing::warn!(dir = %dir.display(), max_bytes = MAX_SOCKET_DIR_BYTES, "the socket directory's path is too long for Unix sockets; gateway processes are reached over TCP");
            (None, None)
        }
        Ok((dir, guard)) => (Some(dir), guard),
        Err(e) => {
            tracing::warn!(error = %e, "cannot make a directory for the gateways' Unix sockets; gateway processes are reached over TCP");
            (None, None)
        }
    }
}

/// Makes `dir` (a real directory, not a symlink), sets it 0700 and removes
/// the sockets a killed front left in it.
fn prepare_socket_dir(dir: &Path, private: std::fs::Permissions) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if !std::fs::symlink_metadata(dir)?.is_dir() {
        return Err(std::io::Error::other(format!("{} is not a directory", dir.display())));
    }
    std::fs::set_permissions(dir, private)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "sock") {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

async fn futures_join_all<F: std::future::Future<Output = ()>>(fs: impl Iterator<Item = F>) {
    let handles: Vec<_> = fs.collect();
    for f in handles {
        f.await;
    }
}

/// The arguments of one gateway process. `public_url`: the protocol's
/// routed listener (named in a reader's refusal of writes, and the URL the
/// gateway hands out when the protocol has a `public_url_flag`).
fn gateway_args(launch: &GatewayLaunch, spec: &ProtocolSpec, role: Role, public_url: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    if let Some(c) = &launch.config_file {
        args.extend(["--config".into(), c.display().to_string()]);
    }
    args.extend(spec.gateway_command.iter().map(|s| s.to_string()));
    args.extend(spec.fixed_args.iter().map(|s| s.to_string()));
    args.extend(["--role".into(), role.as_str().into(), "--listen".into(), "127.0.0.1:0".into()]);
    args.extend(["--mgmtd".into(), launch.mgmtd.join(","), "--credentials".into(), launch.credentials.display().to_string()]);
    if spec.gateway_takes_region {
        args.extend(["--region".into(), launch.region.clone()]);
    }
    match role {
        Role::Reader => {
            if let Some(w) = public_url {
                args.extend([spec.writer_endpoint_flag.to_string(), w.to_string()]);
            }
        }
        Role::Writer => args.extend(spec.writer_args.iter().map(|s| s.to_string())),
    }
    if let (Some(flag), Some(url)) = (spec.public_url_flag, public_url) {
        args.extend([flag.to_string(), url.to_string()]);
    }
    args.extend(launch.extra_args.iter().filter(|(p, _)| p == spec.name).map(|(_, a)| a.clone()));
    args
}

/// Starts the pools and binds every listener.
pub async fn start(opts: FrontOptions) -> Result<FrontHandle, FrontError> {
    let cfg = &opts.config;
    cfg.validate(opts.http.idle_timeout_ms).map_err(FrontError::Setup)?;
    opts.http.validate().map_err(FrontError::Setup)?;
    if opts.listeners.is_empty() {
        return Err(FrontError::Setup("no listener: give at least one of --s3-listen, --kv-listen, --consul-listen, --mq-listen".into()));
    }
    let keys = Arc::new(KeyStore::load(&opts.launch.credentials).map_err(|e| FrontError::Setup(e.to_string()))?);
    let mut registry_metrics = Metrics::new();
    let front_metrics = crate::metrics::FrontMetrics::register(registry_metrics.registry_mut());
    let metrics = Arc::new(registry_metrics);
    let timing = ShellTiming {
        connect_timeout: Duration::from_millis(cfg.upstream_connect_timeout_ms),
        stop_grace: Duration::from_millis(cfg.stop_grace_ms),
    };
    let upstream = UpstreamSettings {
        connect_timeout: Duration::from_millis(cfg.upstream_connect_timeout_ms),
        response_timeout: Duration::from_millis(cfg.upstream_response_timeout_ms),
        idle_timeout: Duration::from_millis(cfg.upstream_idle_timeout_ms),
        max_idle_per_process: cfg.max_idle_connections_per_process,
        max_retries: cfg.max_retries,
    };
    // Gateway processes started here serve on a Unix socket in a private
    // (0700) directory and the front sends their requests there.
    let (socket_dir, temp_socket_dir) = if cfg.unix_sockets { socket_directory(opts.socket_dir.as_deref()) } else { (None, None) };
    let unix_routes = pool::UnixRoutes::default();
    let client = proxy::upstream_client(&upstream, unix_routes.clone());
    let scheme = if opts.tls.is_some() { "https" } else { "http" };

    // One reader and one writer pool per protocol that has a listener.
    let mut protocols: Vec<&'static ProtocolSpec> = Vec::new();
    for l in &opts.listeners {
        if !protocols.iter().any(|p| p.name == l.protocol.name) {
            protocols.push(l.protocol);
        }
    }
    // Connection handover (proxy::FrontProtocol's Handoff) needs the Unix
    // socket directory for the return sockets; not over HTTPS (the TLS
    // session is the front's).
    let hand_over = cfg.hand_over_connections && opts.tls.is_none() && socket_dir.is_some();
    let return_socket = |protocol: &str| socket_dir.as_ref().filter(|_| hand_over).map(|d| d.join(format!("{protocol}-front.sock")));
    let mut pools: Vec<Arc<Pool>> = Vec::new();
    let mut by_protocol: Vec<(&'static str, Arc<Pool>, Arc<Pool>)> = Vec::new();
    for spec in &protocols {
        let pp = cfg.pools(spec.name).ok_or_else(|| FrontError::Setup(format!("no [front.{}] pools in the configuration", spec.name)))?;
        let writer_endpoint = opts
            .listeners
            .iter()
            .find(|l| l.protocol.name == spec.name && l.mode == ListenMode::Route)
            .map(|l| format!("{scheme}://{}", l.addr));
        let mut made = Vec::new();
        for role in [Role::Reader, Role::Writer] {
            let upstreams = pp.upstreams(role);
            let source = if upstreams.is_empty() {
                let log_file = opts.launch.log_dir.as_ref().map(|d| d.join(format!("gateway-{}-{}.log", spec.name, role.as_str())));
                Source::Managed(Launch {
                    program: opts.launch.program.clone(),
                    args: gateway_args(&opts.launch, spec, role, writer_endpoint.as_deref()),
                    log_file,
                    socket_dir: socket_dir.clone(),
                    handover: hand_over,
                    return_socket: return_socket(spec.name),
                    idle_timeout_ms: cfg.idle_timeout_ms,
                    handed_max_age_ms: cfg.handed_connection_max_age_ms,
                })
            } else {
                Source::Static(upstreams.to_vec())
            };
            if matches!(source, Source::Managed(_)) && opts.launch.mgmtd.is_empty() && pp.bounds(role).max > 0 {
                return Err(FrontError::Setup(format!(
                    "the {} {} pool starts gateway processes: --mgmtd is needed (or give it static upstreams)",
                    spec.name,
                    role.as_str()
                )));
            }
            let settings = cfg.pool_settings(pp.bounds(role));
            let pm = front_metrics.pool(spec.name, role.as_str());
            let pool = Pool::start(spec.name, role, settings, source, timing, unix_routes.clone(), pm)
                .map_err(|e| FrontError::Setup(e.to_string()))?;
            made.push(Arc::clone(&pool));
            pools.push(pool);
        }
        let writers = made.pop().ok_or_else(|| FrontError::Setup("pool set-up".into()))?;
        let readers = made.pop().ok_or_else(|| FrontError::Setup("pool set-up".into()))?;
        if !readers.can_serve() && !writers.can_serve() {
            return Err(FrontError::Setup(format!("[front.{}]: both pools have max 0 and no upstreams", spec.name)));
        }
        by_protocol.push((spec.name, readers, writers));
    }

    let mut listeners = Vec::new();
    let mut listener_status = Vec::new();
    let fail = |listeners: Vec<(&'static str, ListenMode, ServerHandle)>, pools: Vec<Arc<Pool>>, e: FrontError| async move {
        for (_, _, s) in listeners {
            s.stop().await;
        }
        for p in &pools {
            p.shutdown(Duration::from_secs(5)).await;
        }
        Err(e)
    };
    let auth_for = |spec: &ProtocolSpec| {
        let services: Vec<&str> = if spec.sigv4_services.is_empty() { vec!["none"] } else { spec.sigv4_services.to_vec() };
        Arc::new(Authenticator::new(Arc::clone(&keys), opts.launch.region.clone(), &services, true))
    };
    // The return sockets: requests of the other kind on a handed connection
    // (a mutation on a connection handed to a reader) come back here and
    // are routed as on the public listener.
    let mut return_listeners = Vec::new();
    for (name, readers, writers) in &by_protocol {
        let (Some(path), Some(spec)) = (return_socket(name), protocols.iter().find(|p| p.name == *name)) else { continue };
        let proto =
            Arc::new(FrontProtocol::new(spec, ListenMode::Route, Arc::clone(readers), Arc::clone(writers), client.clone(), upstream));
        let server_cfg = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), Role::Writer);
        let server_cfg = ServerConfig { limits: opts.http.clone(), ..server_cfg };
        match fskv_gateway::serve_unix(&path, server_cfg, proto, auth_for(spec), Arc::clone(&metrics)) {
            Ok(h) => return_listeners.push((*name, ListenMode::Route, h)),
            Err(e) => return fail(return_listeners, pools, FrontError::Setup(e.to_string())).await,
        }
    }
    for l in &opts.listeners {
        let Some((_, readers, writers)) = by_protocol.iter().find(|(n, _, _)| *n == l.protocol.name) else { continue };
        let proto = Arc::new(FrontProtocol::new(l.protocol, l.mode, Arc::clone(readers), Arc::clone(writers), client.clone(), upstream));
        let auth = auth_for(l.protocol);
        let server_cfg =
            ServerConfig { listen: l.addr, role: Role::Writer, writer_endpoint: None, tls: opts.tls.clone(), limits: opts.http.clone() };
        let served = if hand_over && l.mode == ListenMode::Route {
            let handoff: Arc<dyn fskv_gateway::Handoff> = Arc::clone(&proto) as Arc<dyn fskv_gateway::Handoff>;
            fskv_gateway::serve_with_handoff(server_cfg, proto, auth, Arc::clone(&metrics), handoff).await
        } else {
            fskv_gateway::serve(server_cfg, proto, auth, Arc::clone(&metrics)).await
        };
        match served {
            Ok(h) => {
                tracing::info!(protocol = l.protocol.name, mode = l.mode.as_str(), addr = %h.addr, "front listening");
                listener_status.push(admin::ListenerStatus {
                    protocol: l.protocol.name.to_string(),
                    mode: l.mode.as_str().to_string(),
                    address: format!("{scheme}://{}", h.addr),
                });
                listeners.push((l.protocol.name, l.mode, h));
            }
            Err(e) => {
                listeners.extend(return_listeners);
                return fail(listeners, pools, FrontError::Setup(e.to_string())).await;
            }
        }
    }
    let admin = match opts.admin {
        None => None,
        Some(addr) => {
            let proto = Arc::new(admin::Admin { listeners: listener_status, pools: pools.clone() });
            let auth = Arc::new(Authenticator::new(Arc::clone(&keys), opts.launch.region.clone(), &["none"], true));
            let server_cfg = ServerConfig { listen: addr, role: Role::Writer, writer_endpoint: None, tls: None, limits: opts.http.clone() };
            match fskv_gateway::serve(server_cfg, proto, auth, Arc::clone(&metrics)).await {
                Ok(h) => Some(h),
                Err(e) => {
                    listeners.extend(return_listeners);
                    return fail(listeners, pools, FrontError::Setup(e.to_string())).await;
                }
            }
        }
    };
    let return_listeners = return_listeners.into_iter().map(|(_, _, h)| h).collect();
    Ok(FrontHandle {
        listeners,
        return_listeners,
        admin,
        pools,
        stop_grace: Duration::from_millis(cfg.stop_grace_ms),
        _socket_dir: temp_socket_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> GatewayLaunch {
        GatewayLaunch {
            program: "fskv".into(),
            config_file: None,
            mgmtd: vec!["127.0.0.1:1".into()],
            credentials: "/c.json".into(),
            region: "us-east-1".into(),
            extra_args: vec![("mq".into(), "--lease-ms=5000".into())],
            log_dir: None,
        }
    }

    fn has_pair(args: &[String], flag: &str, value: &str) -> bool {
        args.windows(2).any(|w| w[0] == flag && w[1] == value)
    }

    #[test]
    fn gateway_arguments_per_protocol_and_role() {
        let url = Some("http://127.0.0.1:9002");
        let w = gateway_args(&launch(), &protocols::MQ, Role::Writer, url);
        assert!(has_pair(&w, "--writer-id", protocols::MQ_WRITER_ID), "{w:?}");
        assert!(has_pair(&w, "--public-url", "http://127.0.0.1:9002"), "{w:?}");
        assert!(!w.iter().any(|a| a == "--writer-endpoint"), "{w:?}");
        assert_eq!(w.last().map(String::as_str), Some("--lease-ms=5000"));
        let r = gateway_args(&launch(), &protocols::MQ, Role::Reader, url);
        assert!(has_pair(&r, "--writer-endpoint", "http://127.0.0.1:9002") && !r.iter().any(|a| a == "--writer-id"), "{r:?}");
        let c = gateway_args(&launch(), &protocols::CONSUL, Role::Reader, Some("http://127.0.0.1:9003"));
        assert_eq!(&c[..4], ["gateway", "kv", "--consul-only", "--no-maintenance"]);
        assert!(has_pair(&c, "--consul-writer-endpoint", "http://127.0.0.1:9003") && !c.iter().any(|a| a == "--public-url"), "{c:?}");
        assert!(!c.iter().any(|a| a == "--lease-ms=5000"), "extra arguments are per protocol");
        let k = gateway_args(&launch(), &protocols::KV, Role::Writer, Some("http://x"));
        assert_eq!(&k[..2], ["gateway", "kv"]);
        assert!(!k.iter().any(|a| a == "--no-maintenance" || a == "--writer-endpoint"), "{k:?}");
    }

    #[test]
    fn a_configured_socket_dir_is_private_and_loses_only_stale_sockets() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run").join("front");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("s3-reader-1.sock"), b"").unwrap();
        std::fs::write(dir.join("notes.txt"), b"kept").unwrap();
        let (got, guard) = socket_directory(Some(&dir));
        assert_eq!(got.as_deref(), Some(dir.as_path()));
        assert!(guard.is_none(), "a configured directory is not removed at exit");
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(!dir.join("s3-reader-1.sock").exists(), "a killed front's socket is removed");
        assert!(dir.join("notes.txt").exists(), "other files are left alone");
        // A symlink is refused: the gateways are then reached over TCP.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert_eq!(socket_directory(Some(&link)).0, None);
        // Too long for sun_path: TCP too.
        let long = tmp.path().join("x".repeat(MAX_SOCKET_DIR_BYTES));
        assert_eq!(socket_directory(Some(&long)).0, None);
        // Without one: a private temporary directory, removed with its guard.
        let (tmp_dir, guard) = socket_directory(None);
        let tmp_dir = tmp_dir.unwrap();
        assert_eq!(std::fs::metadata(&tmp_dir).unwrap().permissions().mode() & 0o777, 0o700);
        drop(guard);
        assert!(!tmp_dir.exists());
    }
}
