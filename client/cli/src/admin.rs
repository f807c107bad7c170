//! `fskv admin …`: cluster administration: planning a chain table and the
//! cluster status (nodes, chains with target states, space per target).

use bytes::Bytes;
use clap::{Args, Subcommand};
use fskv_client::mgmtd::{MgmtdClient, MgmtdClientConfig};
use fskv_client::storage::SpaceInfo;
use fskv_mgmtd::chain_table::{generate, ChainTableSpec};
use fskv_rpc::{CallOptions, ClientConfig, RpcClient, TcpTransport};
use fskv_types::mgmtd::MgmtdStatusResp;
use fskv_types::storage::{SpaceInfoReq, TargetSpace};
use std::sync::Arc;

/// Deadline of one status / space call.
const ADMIN_CALL_TIMEOUT_MS: u64 = 3_000;

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Generate a balanced chain table and print it with the worst survivor's
    /// extra read load when one node fails (against the ideal 1/(N-1)).
    ChainTable(ChainTableArgs),
    /// Show the cluster: nodes, chains with their targets' public/local
    /// states (in chain order), and space per target.
    Status(StatusArgs),
}

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
    #[arg(long, required = true, value_delimiter = ',')]
    mgmtd: Vec<String>,
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
    }
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
    let rpc = RpcClient::new(Arc::new(TcpTransport::new()), ClientConfig::default());
    let config = MgmtdClientConfig { call_timeout_ms: ADMIN_CALL_TIMEOUT_MS, ..Default::default() };
    let mgmtd = MgmtdClient::new(rpc.clone(), a.mgmtd.clone(), config);
    let st = primary_status(&mgmtd).await?;
    let space = node_space(&rpc, &st).await;
    if a.json {
        let out = serde_json::json!({ "mgmtd": st, "space": space });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render(&st, &space));
    }
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
            let _ = writeln!(s, "  {:<10} on {}: {} used of {}", t.target.to_string(), n.node_id, mib(t.used_bytes), mib(t.capacity_bytes));
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
