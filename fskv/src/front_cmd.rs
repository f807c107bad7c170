//! `fskv front`: the public listeners, routing every request to a reader or
//! writer pool of gateway processes (started on demand) or of static
//! upstreams. See docs/front.md.

use crate::config::Config;
use anyhow::Context;
use clap::Args;
use fskv_front::proxy::ListenMode;
use fskv_front::{FrontOptions, GatewayLaunch, ListenerSpec};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct FrontArgs {
    /// Public S3 listener: reads go to the S3 reader pool, mutations to the writer pool.
    #[arg(long, value_name = "ADDR")]
    s3_listen: Option<SocketAddr>,
    /// Public KV listener (native API): reads to the KV reader pool, mutations to the writer pool.
    #[arg(long, value_name = "ADDR")]
    kv_listen: Option<SocketAddr>,
    /// Public Consul-compatible listener (processes of `fskv gateway kv --consul-only`).
    #[arg(long, value_name = "ADDR")]
    consul_listen: Option<SocketAddr>,
    /// Public MQ listener (native API and SQS; receives go to the writer).
    #[arg(long, value_name = "ADDR")]
    mq_listen: Option<SocketAddr>,
    /// A read-only S3 endpoint: every request goes to the reader pool (mutations are refused there).
    #[arg(long, value_name = "ADDR")]
    s3_reader_listen: Option<SocketAddr>,
    /// A read-only KV endpoint.
    #[arg(long, value_name = "ADDR")]
    kv_reader_listen: Option<SocketAddr>,
    /// A read-only Consul endpoint.
    #[arg(long, value_name = "ADDR")]
    consul_reader_listen: Option<SocketAddr>,
    /// A read-only MQ endpoint.
    #[arg(long, value_name = "ADDR")]
    mq_reader_listen: Option<SocketAddr>,
    /// Admin listener: GET /status (pools, processes; read by `fskv admin status --front`) and /metrics.
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// mgmtd address(es) for the gateway processes it starts; repeat or separate with commas.
    #[arg(long, value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Access keys (JSON, as for `fskv gateway`): passed to the gateways; the front itself verifies no signature.
    #[arg(long)]
    credentials: PathBuf,
    /// Region of the SigV4 scope (the front's prechecks and the S3 gateways it starts).
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// An extra argument for every gateway process of a protocol, `PROTO=ARG` (e.g. `s3=--root=/buckets`); repeatable.
    #[arg(long = "gateway-arg", value_name = "PROTO=ARG")]
    gateway_args: Vec<String>,
    /// A static upstream instead of processes started here: `PROTO:ROLE=HOST:PORT` (e.g. `s3:reader=10.0.3.5:9000`); repeatable.
    #[arg(long = "upstream", value_name = "PROTO:ROLE=HOST:PORT")]
    upstreams: Vec<String>,
    /// Append each pool's gateway output to DIR/gateway-PROTO-ROLE.log (default: the front's stderr).
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// Directory of the gateway processes' Unix sockets (`[front] unix_sockets`): made 0700, stale
    /// sockets in it removed at start, so only this front may use it (`fskv up` passes DATA/run/front).
    /// Default: a private temporary directory, removed at a clean exit.
    #[arg(long, value_name = "DIR")]
    socket_dir: Option<PathBuf>,
    /// Serve the public listeners over HTTPS: PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn protocol(name: &str) -> anyhow::Result<&'static fskv_front::protocols::ProtocolSpec> {
    fskv_front::protocols::lookup(name).with_context(|| {
        let built: Vec<&str> = fskv_front::protocols::PROTOCOLS.iter().map(|p| p.name).collect();
        format!("--{name}-listen: this build has no {name} gateway to route to (routed here: {})", built.join(", "))
    })
}

/// The listeners the flags ask for.
fn listeners(a: &FrontArgs) -> anyhow::Result<Vec<ListenerSpec>> {
    let mut out = Vec::new();
    for (name, addr, mode) in [
        ("s3", a.s3_listen, ListenMode::Route),
        ("kv", a.kv_listen, ListenMode::Route),
        ("consul", a.consul_listen, ListenMode::Route),
        ("mq", a.mq_listen, ListenMode::Route),
        ("s3", a.s3_reader_listen, ListenMode::Readers),
        ("kv", a.kv_reader_listen, ListenMode::Readers),
        ("consul", a.consul_reader_listen, ListenMode::Readers),
        ("mq", a.mq_reader_listen, ListenMode::Readers),
    ] {
        if let Some(addr) = addr {
            out.push(ListenerSpec { protocol: protocol(name)?, addr, mode });
        }
    }
    Ok(out)
}

/// `--upstream PROTO:ROLE=HOST:PORT` into the configuration.
fn apply_upstreams(cfg: &mut fskv_front::FrontConfig, upstreams: &[String]) -> anyhow::Result<()> {
    for u in upstreams {
        let parsed = u.split_once('=').and_then(|(pr, addr)| pr.split_once(':').map(|(p, r)| (p, r, addr)));
        let Some((proto, role, addr)) = parsed else {
            anyhow::bail!("--upstream {u:?}: expected PROTO:ROLE=HOST:PORT");
        };
        let role: fskv_gateway::Role = role.parse().map_err(|e| anyhow::anyhow!("--upstream {u:?}: {e}"))?;
        let pools = cfg.pools_mut(proto).with_context(|| format!("--upstream {u:?}: unknown protocol {proto:?}"))?;
        match role {
            fskv_gateway::Role::Reader => pools.reader_upstreams.push(addr.to_string()),
            fskv_gateway::Role::Writer => pools.writer_upstreams.push(addr.to_string()),
        }
    }
    Ok(())
}

pub async fn run(args: FrontArgs, config: &Config, config_file: Option<&Path>) -> anyhow::Result<()> {
    let listeners = listeners(&args)?;
    let mut front = config.front.clone();
    // The S3 classifier routes virtual-hosted requests (Host: <bucket>.<domain>) by their key too.
    let vhosts = fskv_gateway_s3::vhost::VirtualHosts::new(&config.s3.virtual_host_domains).map_err(anyhow::Error::msg)?;
    fskv_gateway_s3::route::set_virtual_host_domains(vhosts);
    apply_upstreams(&mut front, &args.upstreams)?;
    let mut extra_args = Vec::new();
    for g in &args.gateway_args {
        let (p, a) = g.split_once('=').with_context(|| format!("--gateway-arg {g:?}: expected PROTO=ARG"))?;
        extra_args.push((p.to_string(), a.to_string()));
    }
    if let Some(d) = &args.log_dir {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create --log-dir {}", d.display()))?;
    }
    let config_file = config_file.map(|p| p.canonicalize().unwrap_or_else(|_| p.to_path_buf()));
    let launch = GatewayLaunch {
        program: std::env::current_exe().context("cannot find the fskv executable")?,
        config_file,
        mgmtd: args.mgmtd.clone(),
        credentials: args.credentials.canonicalize().with_context(|| format!("--credentials {}", args.credentials.display()))?,
        region: args.region.clone(),
        extra_args,
        log_dir: args.log_dir.clone(),
    };
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert_path), Some(key_path)) => Some(fskv_gateway::TlsFiles { cert_path, key_path }),
        _ => None,
    };
    let opts = FrontOptions {
        listeners,
        admin: args.admin_listen,
        launch,
        config: front,
        http: config.gateway.clone(),
        tls,
        socket_dir: args.socket_dir.clone(),
    };
    let handle = fskv_front::start(opts).await?;
    for (p, mode, s) in &handle.listeners {
        println!("front: {p} ({}) on {}", mode.as_str(), s.addr);
    }
    if let Some(a) = &handle.admin {
        println!("front: admin (GET /status, /metrics) on {}", a.addr);
    }
    println!("front: serving");
    let _ = std::io::stdout().flush();
    crate::storage_cmd::wait_for_signal().await;
    handle.stop().await;
    Ok(())
}
