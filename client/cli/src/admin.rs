//! `fskv admin …`: cluster administration. Today: planning a chain table.

use clap::{Args, Subcommand};
use fskv_mgmtd::chain_table::{generate, ChainTableSpec};

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Generate a balanced chain table and print it with the worst survivor's
    /// extra read load when one node fails (against the ideal 1/(N-1)).
    ChainTable(ChainTableArgs),
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

pub fn run(cmd: AdminCommand) -> anyhow::Result<()> {
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
    }
}
