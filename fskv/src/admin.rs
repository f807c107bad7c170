//! `fskv admin …`: cluster administration: planning a chain table, the
//! cluster status (nodes, chains with target states, space per target) and
//! the metadata consistency check (`fskv admin fsck`).

use bytes::Bytes;
use clap::{Args, Subcommand};
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig};
use fskv_mgmtd::chain_table::{generate, ChainTableSpec};
use fskv_proto::mgmtd::MgmtdStatusResp;
use fskv_proto::storage::SpaceInfo;
use fskv_proto::storage::{SpaceInfoReq, TargetSpace};
use fskv_rpc::{CallOptions, ClientConfig, RpcClient, TcpTransport};
use std::sync::Arc;

/// Deadline of one status / space call.
const ADMIN_CALL_TIMEOUT_MS: u64 = 3_000;

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Generate a balanced chain table and print it with the worst survivor's
    /// extra read load when one node fails (against the ideal 1/(N-1)).
    ChainTable(ChainTableArgs),
    /// Show the cluster: nodes, chains with their targets' public/local
    /// states (in chain order), and space per target; with --front, the
    /// front's pools of gateway processes too.
    Status(StatusArgs),
    /// Check the metadata for consistency (dangling entries, orphans, nlink,
    /// unreachable directories, undecodable records) on a meta server, then
    /// the chunks on storage against it (orphan, misplaced and past-the-end
    /// chunks). Exit code 0: clean; 1: problems found; 2: the check could not run.
    Fsck(FsckArgs),
    /// Print a service's Prometheus metrics (OpenMetrics text), fetched with
    /// `GET /metrics` on its RPC port (mgmtd, meta, storage; `fskv up`:
    /// P+11, P+12, P+13..), or on the FUSE mount's `--metrics-listen`
    /// address (`fskv up --mount`: P+16).
    Metrics(MetricsArgs),
    /// Gateway users (S3, KV, MQ keys) in the cluster's user store: create, list, revoke.
    #[command(subcommand)]
    User(UserCommand),
    /// Tenants of the user store: each owns buckets, namespaces and topics, and maps to a local uid/gid.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Issue an RPC key for a local user (needs the cluster key): `fskv` commands given it
    /// (--cluster-key-file) act as that uid/gid toward meta, and storage checks chunk
    /// capabilities (docs/security.md). Written O_EXCL, mode 0600, owned by uid:gid.
    UserKey(UserKeyArgs),
}

#[derive(Args)]
pub struct UserKeyArgs {
    /// The user's uid.
    #[arg(long)]
    uid: u32,
    /// The user's primary gid (default: the uid).
    #[arg(long)]
    gid: Option<u32>,
    /// Supplementary groups, comma-separated (the principal name stays within 64 bytes).
    #[arg(long, value_delimiter = ',')]
    groups: Vec<u32>,
    /// The key file to create (must not exist).
    #[arg(long)]
    out: std::path::PathBuf,
}

/// How `fskv admin user|tenant` reaches the cluster.
#[derive(Args)]
pub struct StoreArgs {
    /// mgmtd address(es), `host:port`; repeat or separate with commas.
    #[arg(long, required = true, value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Meta server address(es); optional (the ones registered with mgmtd are used).
    #[arg(long, value_delimiter = ',')]
    meta: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a user with a new access key and secret, printed once (keep them: they are not shown again).
    Create {
        /// User name: 1-64 of a-z 0-9 . _ - (starting with a letter or digit).
        name: String,
        /// The tenant the user acts for.
        #[arg(long, default_value = fskv_gateway::auth::DEFAULT_TENANT)]
        tenant: String,
        /// Also make a bearer token (KV/MQ native APIs), printed once.
        #[arg(long)]
        bearer_token: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List users (never their secrets).
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Revoke a user: its key and token are refused by every gateway within its poll interval (1 s by default).
    Revoke {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Create a tenant; its files are written as --uid (gid = uid; default: the first free from 20000).
    Create {
        name: String,
        #[arg(long)]
        uid: Option<u32>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List tenants with their uid/gid.
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Args)]
pub struct MetricsArgs {
    /// The service's RPC address, `host:port`.
    #[arg(long)]
    addr: String,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = ADMIN_CALL_TIMEOUT_MS)]
    timeout_ms: u64,
}

#[derive(Args)]
pub struct FsckArgs {
    /// mgmtd address(es), `host:port`; repeat or separate with commas (its
    /// routing version is shown; the check runs without it if unreachable).
    #[arg(long, required = true, value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Meta server address(es), `host:port`; the check runs on the first that answers.
    /// Optional: without it, the meta servers registered with mgmtd are used.
    #[arg(long, value_delimiter = ',')]
    meta: Vec<String>,
    /// Problems to list (all are counted; the server lists at most 10000).
    #[arg(long, default_value_t = fskv_proto::meta::DEFAULT_FSCK_PROBLEMS)]
    max_problems: u32,
    /// Deadline of the check, in seconds (a large namespace takes long).
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Check the metadata only (skip the chunk scan of every chain).
    #[arg(long)]
    meta_only: bool,
}

/// An error (or a finding) with the process exit code it stands for; `main`
/// exits with `code` when it finds one in the error.
#[derive(Debug)]
pub struct ExitStatus {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ExitStatus {}

#[derive(Args)]
pub struct ChainTableArgs {
    /// Storage nodes.
    #[arg(long)]
    nodes: usize,
    /// Targets (disks) per node.
    #[arg(long, default_value_t = 1)]
    targets_per_node: usize,
    /// Replication factor (targets per chain).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Print the plan as JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct StatusArgs {
    /// mgmtd address(es), `host:port`; repeat or separate with commas.
    #[arg(long, required_unless_present = "front", value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Admin address(es) of fronts (`fskv front --admin-listen`; `fskv up`: P+10): show their pools.
    #[arg(long, value_delimiter = ',')]
    front: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(cmd: AdminCommand) -> anyhow::Result<()> {
    match cmd {
        AdminCommand::ChainTable(a) => {
            let table = generate(&ChainTableSpec::new(a.nodes, a.targets_per_node, a.replicas))?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&table)?);
            } else {
                println!("{table}");
            }
            Ok(())
        }
        AdminCommand::Status(a) => status(a).await,
        AdminCommand::User(c) => user(c).await,
        AdminCommand::Tenant(c) => tenant(c).await,
        AdminCommand::UserKey(a) => {
            let name = crate::identity::write_user_key(a.uid, a.gid, &a.groups, &a.out)?;
            println!("wrote the key of {name} to {}", a.out.display());
            Ok(())
        }
        AdminCommand::Metrics(a) => {
            let text = fskv_rpc::http::scrape(&a.addr, std::time::Duration::from_millis(a.timeout_ms)).await?;
            print!("{text}");
            Ok(())
        }
        AdminCommand::Fsck(a) => {
            let problems = fsck(&a).await.map_err(|e| e.context(ExitStatus { code: 2, message: "fsck could not run".into() }))?;
            if problems == 0 {
                Ok(())
            } else {
                let message = format!("fsck found {problems} problem(s)");
                Err(anyhow::Error::new(ExitStatus { code: 1, message }))
            }
        }
    }
}

/// Pause between two progress lines of a long fsck.
const FSCK_PROGRESS_INTERVAL_MS: u64 = 2_000;

/// The meta servers registered with mgmtd (`--meta` not given).
async fn discover_meta(mgmtd: &MgmtdClient) -> anyhow::Result<Vec<String>> {
    let resp = mgmtd.get_routing(0, 0).await.map_err(|e| anyhow::anyhow!("routing from mgmtd {:?}: {e}", mgmtd.addrs()))?;
    let addrs: Vec<String> = resp.routing.map(|r| r.meta_servers.into_iter().map(|n| n.address).collect()).unwrap_or_default();
    anyhow::ensure!(!addrs.is_empty(), "no meta server is registered with mgmtd {:?}; pass --meta", mgmtd.addrs());
    Ok(addrs)
}

/// Runs `meta.Fsck`, then the chunk scan, and prints both; returns the
/// number of problems (the caller maps them to exit 1).
async fn fsck(a: &FsckArgs) -> anyhow::Result<u64> {
    use anyhow::Context;
    use fskv_client::meta::{MetaClient, MetaClientConfig};
    use fskv_proto::meta::FsckRequest;
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
    let config = MgmtdClientConfig { call_timeout_ms: ADMIN_CALL_TIMEOUT_MS, ..Default::default() };
    let mgmtd = MgmtdClient::new(rpc.clone(), a.mgmtd.clone(), config);
    let routing_version = match primary_status(&mgmtd).await {
        Ok(st) => Some(st.routing_version),
        Err(e) => {
            eprintln!("fskv: warning: {e:#}; checking the metadata anyway");
            None
        }
    };
    let meta_addrs = if a.meta.is_empty() { discover_meta(&mgmtd).await? } else { a.meta.clone() };
    let mut cfg = MetaClientConfig::new(meta_addrs.clone());
    // Read-only, but a full re-run: at most one attempt per server.
    cfg.max_attempts = meta_addrs.len().clamp(1, 8) as u32;
    let client = MetaClient::new(cfg).context("meta client")?;
    let req = FsckRequest { max_problems: a.max_problems, page_keys: 0 };
    let timeout_ms = a.timeout_secs.saturating_mul(1000).max(1);
    let started = std::time::Instant::now();
    let call = client.fsck(&req, timeout_ms);
    tokio::pin!(call);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(FSCK_PROGRESS_INTERVAL_MS));
    tick.tick().await; // the first tick is immediate
    let reply = loop {
        tokio::select! {
            r = &mut call => break r.with_context(|| format!("fsck on meta {meta_addrs:?}"))?,
            _ = tick.tick() => eprintln!("fsck: scanning the metadata… {} s", started.elapsed().as_secs()),
        }
    };
    let storage = if a.meta_only {
        None
    } else {
        eprintln!("fsck: scanning the chunks of every chain…");
        let routing = mgmtd
            .get_routing(0, 0)
            .await
            .with_context(|| format!("routing info from mgmtd {:?} (needed for the chunk scan; --meta-only skips it)", a.mgmtd))?
            .routing
            .context("mgmtd sent no routing info")?;
        Some(crate::fsck_chunks::scan(&rpc, &routing, &client, a.max_problems as usize).await?)
    };
    let problems = reply.problems_total + storage.as_ref().map_or(0, |s| s.problems_total);
    if a.json {
        let out = serde_json::json!({
            "clean": problems == 0,
            "routing_version": routing_version,
            "fsck": &reply,
            "storage": &storage,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render_fsck(&reply, routing_version));
        if let Some(s) = &storage {
            print!("{}", crate::fsck_chunks::render(s));
        }
        println!("{}", if problems == 0 { "clean" } else { "PROBLEMS FOUND" });
    }
    Ok(problems)
}

fn render_fsck(r: &fskv_proto::meta::FsckReply, routing_version: Option<u64>) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    if let Some(v) = routing_version {
        let _ = writeln!(s, "routing v{v}");
    }
    let _ = writeln!(
        s,
        "inodes {}, entries {}, queued for GC {}, problems {} ({} ms, {} read transaction(s))",
        r.inodes, r.entries, r.gc_queued, r.problems_total, r.elapsed_ms, r.transactions
    );
    if r.transactions > 1 {
        let _ =
            writeln!(s, "note: the scan used several read transactions; changes made meanwhile can show as problems (re-run to confirm)");
    }
    for p in &r.problems {
        let _ = writeln!(s, "  {:<24} {:<14} {}", wire_name(&p.kind), p.inode.to_string(), p.detail);
    }
    if (r.problems.len() as u64) < r.problems_total {
        let _ = writeln!(s, "  … {} more not listed (--max-problems)", r.problems_total - r.problems.len() as u64);
    }
    s
}

/// Space of one storage node, or why it is unknown.
#[derive(serde::Serialize)]
struct NodeSpace {
    node_id: fskv_types::NodeId,
    address: String,
    targets: Vec<TargetSpace>,
    error: Option<String>,
}

async fn status(a: StatusArgs) -> anyhow::Result<()> {
    let cluster = if a.mgmtd.is_empty() {
        None
    } else {
        let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
        let config = MgmtdClientConfig { call_timeout_ms: ADMIN_CALL_TIMEOUT_MS, ..Default::default() };
        let mgmtd = MgmtdClient::new(rpc.clone(), a.mgmtd.clone(), config);
        let st = primary_status(&mgmtd).await?;
        let space = node_space(&rpc, &st).await;
        Some((st, space))
    };
    let timeout = std::time::Duration::from_millis(ADMIN_CALL_TIMEOUT_MS);
    let mut fronts = Vec::new();
    for addr in &a.front {
        fronts.push((addr.clone(), fskv_front::admin::fetch_status(addr, timeout).await));
    }
    if a.json {
        let fronts: Vec<_> = fronts
            .iter()
            .map(|(addr, r)| match r {
                Ok(st) => serde_json::json!({ "address": addr, "status": st }),
                Err(e) => serde_json::json!({ "address": addr, "error": e }),
            })
            .collect();
        let mut out = serde_json::json!({ "fronts": fronts });
        if let Some((st, space)) = &cluster {
            out["mgmtd"] = serde_json::to_value(st)?;
            out["space"] = serde_json::to_value(space)?;
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        if let Some((st, space)) = &cluster {
            print!("{}", render(st, space));
        }
        for (addr, r) in &fronts {
            match r {
                Ok(st) => print!("{}", fskv_front::admin::render_status(addr, st)),
                Err(e) => println!("front {addr}: unreachable ({e})"),
            }
        }
    }
    let failed: Vec<&str> = fronts.iter().filter(|(_, r)| r.is_err()).map(|(a, _)| a.as_str()).collect();
    anyhow::ensure!(failed.is_empty(), "front(s) not reachable: {}", failed.join(", "));
    Ok(())
}

/// The primary's view: asks each address, follows the lease to the primary.
async fn primary_status(mgmtd: &MgmtdClient) -> anyhow::Result<MgmtdStatusResp> {
    let mut fallback = None;
    let mut errors = Vec::new();
    for addr in mgmtd.addrs() {
        match mgmtd.status_of(addr).await {
            Ok(st) if st.is_primary => return Ok(st),
            Ok(st) => fallback = Some(st),
            Err(e) => errors.push(format!("{addr}: {e}")),
        }
    }
    let Some(st) = fallback else {
        anyhow::bail!("no mgmtd answered ({}); check the --mgmtd addresses and that mgmtd runs", errors.join("; "));
    };
    if let Some((_, addr)) = &st.primary {
        if let Ok(p) = mgmtd.status_of(addr).await {
            return Ok(p);
        }
    }
    eprintln!("fskv: warning: no primary mgmtd reachable; showing the view of {}", st.mgmtd_id);
    Ok(st)
}

async fn node_space(rpc: &RpcClient, st: &MgmtdStatusResp) -> Vec<NodeSpace> {
    let calls = st.nodes.iter().map(|n| async move {
        let opts = CallOptions { timeout_ms: ADMIN_CALL_TIMEOUT_MS };
        let r = rpc.call::<SpaceInfo>(&n.address, &SpaceInfoReq {}, Bytes::new(), opts).await;
        let (targets, error) = match r {
            Ok((resp, _)) => (resp.targets, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        NodeSpace { node_id: n.node_id, address: n.address.clone(), targets, error }
    });
    futures::future::join_all(calls).await
}

fn render(st: &MgmtdStatusResp, space: &[NodeSpace]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let primary = st.primary.as_ref().map(|(id, addr)| format!("{id} at {addr}")).unwrap_or_else(|| "none".into());
    let _ = writeln!(s, "mgmtd {} (primary: {primary}), routing v{}", st.mgmtd_id, st.routing_version);
    let _ = writeln!(s, "nodes ({}):", st.nodes.len());
    for n in &st.nodes {
        let alive = if n.alive { "alive" } else { "DEAD" };
        let _ = writeln!(
            s,
            "  {:<8} {:<22} {:<5} heartbeat {} ms ago, generation {}",
            n.node_id.to_string(),
            n.address,
            alive,
            n.last_heartbeat_age_ms,
            n.generation
        );
    }
    let _ = writeln!(s, "meta servers ({}):", st.meta_servers.len());
    for m in &st.meta_servers {
        let _ = writeln!(s, "  {:<8} {}", m.node_id.to_string(), m.address);
    }
    let _ = writeln!(s, "chains ({}):", st.chains.len());
    for c in &st.chains {
        let targets: Vec<String> =
            c.targets.iter().map(|t| format!("{}@{} {}/{}", t.target_id, t.node_id, wire_name(&t.public), wire_name(&t.local))).collect();
        let _ = writeln!(s, "  {:<10} v{:<4} {}", c.chain_id.to_string(), c.chain_version, targets.join(" -> "));
    }
    let _ = writeln!(s, "space:");
    for n in space {
        if let Some(e) = &n.error {
            let _ = writeln!(s, "  {} {}: unknown ({e})", n.node_id, n.address);
            continue;
        }
        for t in &n.targets {
            let sc = &t.scrub;
            let _ = writeln!(
                s,
                "  {:<10} on {}: {} used of {}; scrub: {} passes, this pass {}/{} chunks, {} checked, {} corrupt found, {} repaired",
                t.target.to_string(),
                n.node_id,
                mib(t.used_bytes),
                mib(t.capacity_bytes),
                sc.passes,
                sc.pass_chunks_done,
                sc.pass_chunks_total,
                mib(sc.bytes_checked),
                sc.corrupt_found,
                sc.repaired
            );
        }
    }
    s
}

/// A state's name as in the JSON output (`serving`, `up-to-date`, …).
fn wire_name(state: &impl serde::Serialize) -> String {
    match serde_json::to_value(state) {
        Ok(serde_json::Value::String(name)) => name,
        _ => "?".into(),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

async fn user_store(a: &StoreArgs) -> anyhow::Result<(crate::users::ClusterUsers, fskv_client::FsClient)> {
    let fs = fskv_client::FsClient::connect(a.mgmtd.clone(), a.meta.clone(), fskv_client::file::FsClientConfig::default())
        .await
        .map_err(|e| anyhow::anyhow!("connecting to mgmtd {:?}: {e}", a.mgmtd))?;
    Ok((crate::users::ClusterUsers::new(fs.clone()), fs))
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

async fn user(cmd: UserCommand) -> anyhow::Result<()> {
    match cmd {
        UserCommand::Create { name, tenant, bearer_token, store } => {
            let (users, fs) = user_store(&store).await?;
            let r = users.edit(|db| Ok(db.create_user(&name, &tenant, bearer_token, now_ns())?)).await;
            fs.shutdown();
            let (creds, token) = r?;
            if store.json {
                let v = serde_json::json!({"user": name, "tenant": tenant, "access_key": creds.access_key,
                    "secret_key": creds.secret_key, "bearer_token": token});
                println!("{v}");
            } else {
                println!("user {name} (tenant {tenant}) created; the secret is shown only now");
                println!("access_key: {}", creds.access_key);
                println!("secret_key: {}", creds.secret_key);
                if let Some(t) = token {
                    println!("bearer_token: {t}");
                }
            }
            Ok(())
        }
        UserCommand::List { store } => {
            let (users, fs) = user_store(&store).await?;
            let r = users.load().await;
            fs.shutdown();
            let list = match r? {
                Some((_, db)) => db.list_users(),
                None => Vec::new(),
            };
            if store.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<24} {:<16} {:<22} {:<6} {:<5}", "USER", "TENANT", "ACCESS KEY", "TOKEN", "ADMIN");
                for u in list {
                    println!("{:<24} {:<16} {:<22} {:<6} {:<5}", u.name, u.tenant, u.access_key, u.has_bearer_token, u.admin);
                }
            }
            Ok(())
        }
        UserCommand::Revoke { name, store } => {
            let (users, fs) = user_store(&store).await?;
            let r = users.edit(|db| Ok(db.revoke_user(&name)?)).await;
            fs.shutdown();
            let u = r?;
            println!("user {name} (tenant {}, access key {}) revoked", u.tenant, u.access_key);
            Ok(())
        }
    }
}

async fn tenant(cmd: TenantCommand) -> anyhow::Result<()> {
    match cmd {
        TenantCommand::Create { name, uid, store } => {
            let (users, fs) = user_store(&store).await?;
            let r = users.edit(|db| Ok(db.create_tenant(&name, uid)?)).await;
            fs.shutdown();
            let t = r?;
            if store.json {
                println!("{}", serde_json::json!({"tenant": name, "uid": t.uid, "gid": t.gid}));
            } else {
                println!("tenant {name} created (uid {}, gid {})", t.uid, t.gid);
            }
            Ok(())
        }
        TenantCommand::List { store } => {
            let (users, fs) = user_store(&store).await?;
            let r = users.load().await;
            fs.shutdown();
            let tenants: Vec<(String, u32, u32)> = match r? {
                Some((_, db)) => db.tenants.iter().map(|(n, t)| (n.clone(), t.uid, t.gid)).collect(),
                None => Vec::new(),
            };
            if store.json {
                let v: Vec<_> = tenants.iter().map(|(n, u, g)| serde_json::json!({"tenant": n, "uid": u, "gid": g})).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{:<24} {:>10} {:>10}", "TENANT", "UID", "GID");
                for (n, u, g) in tenants {
                    println!("{n:<24} {u:>10} {g:>10}");
                }
            }
            Ok(())
        }
    }
}
