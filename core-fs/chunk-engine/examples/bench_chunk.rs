//! Stand-in for `fskv bench chunk` until the CLI exists:
//! `cargo run --release -p fskv-chunk-engine --example bench_chunk -- [DIR] [SECONDS] [MIB] [ROUNDS] [--sync]`

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let positional: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let mut opts = fskv_chunk_engine::bench::ChunkBenchOptions::default();
    if let Some(d) = positional.first() {
        opts.dir = Some(d.into());
    }
    if let Some(s) = positional.get(1) {
        opts.seconds_per_workload = s.parse()?;
    }
    if let Some(m) = positional.get(2) {
        opts.data_bytes = m.parse::<u64>()? * 1024 * 1024;
    }
    if let Some(r) = positional.get(3) {
        opts.rounds = r.parse()?;
    }
    opts.sync_writes = args.iter().any(|a| a == "--sync");
    let report = fskv_chunk_engine::bench::run(opts)?;
    println!("{report}");
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
