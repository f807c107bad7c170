//! Runs the RPC loopback bench: `cargo run --release -p fskv-rpc --example bench -- [SECONDS] [--json] [--auth] [--no-iperf3]`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut opts = fskv_rpc::bench::BenchOptions::default();
    let mut json = false;
    for arg in std::env::args().skip(1) {
        if arg == "--json" {
            json = true;
        } else if arg == "--auth" {
            opts.auth_comparison = true;
        } else if arg == "--no-iperf3" {
            opts.run_iperf3 = false;
        } else {
            opts.seconds = arg.parse()?;
        }
    }
    let report = fskv_rpc::bench::run(opts).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    Ok(())
}
