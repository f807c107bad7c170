//! `fskv`: the one binary of 3FS-KV. Every process is a subcommand, so one
//! build installs everything.

mod admin;
mod bench;
mod caps_bench;
mod config;
mod dir_lock;
mod failover_bench;
mod front_bench;
mod front_cmd;
mod fsck_chunks;
mod gateway_cmd;
mod identity;
mod kv_gateway_bench;
mod malloc;
mod meta_cmd;
mod mgmtd_cmd;
mod mount_cmd;
mod mq_bench;
mod storage_cmd;
mod supervisor;
mod transfer;
mod up;
mod users;
mod usrbio_bench;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "fskv", version, about = "3FS-KV: a distributed filesystem with S3, KV and MQ gateways", long_about = None)]
struct Cli {
    /// TOML configuration file (see `fskv config default` for every option and its default).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The cluster key (docs/security.md); default: [security] cluster_key_file, else DATA_DIR/cluster.key.
    #[arg(long, global = true, value_name = "FILE", env = "FSKV_CLUSTER_KEY_FILE")]
    cluster_key_file: Option<PathBuf>,
    /// Run without RPC authentication, even if a key is found (tests and development only; logged as a warning).
    #[arg(long, global = true)]
    insecure_no_auth: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a whole single-node cluster from one data directory (the main job).
    Up(up::UpArgs),
    /// Benchmarks, each next to its baseline measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Cluster administration.
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// Run one cluster manager (heartbeats, target states, routing info).
    Mgmtd(mgmtd_cmd::MgmtdArgs),
    /// Run one storage service (chunk engines + CRAQ replication).
    Storage(storage_cmd::StorageArgs),
    /// Serve the metadata service on one KV engine.
    Meta(meta_cmd::MetaArgs),
    /// Upload a local file: `fskv put --mgmtd A --meta A LOCAL /remote/path`.
    Put(transfer::PutArgs),
    /// Download a file: `fskv get --mgmtd A --meta A /remote/path LOCAL`.
    Get(transfer::GetArgs),
    /// Mount the filesystem with FUSE: `fskv mount --mgmtd A --meta A PATH`.
    Mount(mount_cmd::MountArgs),
    /// Run a gateway process: `fskv gateway s3|kv --role reader|writer ...`.
    #[command(subcommand)]
    Gateway(gateway_cmd::GatewayCommand),
    /// The public listeners: routes each request to a reader or writer pool of gateway processes started on demand.
    Front(front_cmd::FrontArgs),
    /// Show the configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the default configuration file, with every option documented.
    Default,
    /// Print the effective configuration (defaults merged with --config).
    Show,
}

/// The log filter: `FSKV_LOG` or the command's level, with the s3s crate's
/// own logging off unless the filter names it. s3s logs every request it
/// refuses or whose handler returned an error (an unsigned request, a
/// missing key) at ERROR, which would let any client fill the logs; the S3
/// gateway logs its own internal errors where it handles them.
fn log_filter(env: Option<String>, level: &str) -> String {
    let mut filter = env.unwrap_or_else(|| level.to_string());
    if !filter.contains("s3s") {
        filter.push_str(",s3s=off");
    }
    filter
}

fn init_logging(level: &str) {
    let filter = log_filter(std::env::var("FSKV_LOG").ok(), level);
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("fskv: invalid log filter {filter:?} ({e}); using \"info\"");
        tracing_subscriber::EnvFilter::new("info")
    });
    // Colours only on a terminal: log files (`fskv up` children) stay plain,
    // and the request span of every gateway request is formatted without them.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).with_ansi(ansi).init();
}

fn main() -> std::process::ExitCode {
    malloc::tune();
    let cli = Cli::parse();
    let mut config = match config::Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fskv: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(&config.log.level);
    // Every RPC client and server of this process follows [rpc].
    fskv_rpc::settings::install(config.rpc.settings());
    // Every RPC client and server of this process authenticates with the
    // cluster key (identity.rs: where it comes from, who needs it).
    use identity::Need;
    let who = match &cli.command {
        Command::Mgmtd(_) => Some(("mgmtd".to_string(), Need::Required)),
        Command::Storage(a) => Some((format!("node:{}", a.node_id()), Need::Required)),
        Command::Meta(a) => Some((format!("meta:{}", a.node_id()), Need::Required)),
        Command::Mount(_) => Some(("fuse".into(), Need::Optional)),
        Command::Gateway(_) | Command::Front(_) => Some(("gateway".into(), Need::Optional)),
        // `up` creates its key; benches that start clusters install theirs;
        // `config` prints or checks a configuration and talks to nobody (a key
        // named there need not exist on the machine that checks it).
        Command::Up(_) | Command::Bench(_) | Command::Config(_) => None,
        _ => Some(("client".into(), Need::Optional)),
    };
    match who {
        Some((principal, need)) => {
            if let Err(e) = identity::install(cli.cluster_key_file.as_deref(), cli.insecure_no_auth, &config, &principal, need) {
                eprintln!("fskv: {e:#}");
                return std::process::ExitCode::from(2);
            }
        }
        None => {
            if let Some(file) = identity::explicit_key_file(cli.cluster_key_file.as_deref(), &config) {
                config.security.cluster_key_file = file;
            }
            if cli.insecure_no_auth {
                eprintln!("fskv: --insecure-no-auth applies to services and clients, not to `up` or benches");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if matches!(cli.command, Command::Front(_)) {
        // The front forwards bytes; its threads should not compete with the
        // gateways' for the cores (see `[front] worker_threads`).
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        builder.worker_threads(config.front.runtime_threads(cpus));
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fskv: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let config_path = cli.config.clone();
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Up(args) => up::run(args, &config).await,
            Command::Bench(cmd) => bench::run(cmd, &config).await,
            Command::Admin(cmd) => admin::run(cmd).await,
            Command::Put(args) => transfer::put(args).await,
            Command::Get(args) => transfer::get(args).await,
            Command::Mount(args) => mount_cmd::run(args).await,
            Command::Gateway(cmd) => gateway_cmd::run(cmd, &config).await,
            Command::Front(args) => front_cmd::run(args, &config, config_path.as_deref()).await,
            Command::Mgmtd(args) => mgmtd_cmd::run(args, &config).await,
            Command::Storage(args) => storage_cmd::run(args).await,
            Command::Meta(args) => meta_cmd::run(args, &config).await,
            Command::Config(ConfigCommand::Default) => {
                print!("{}", config::DEFAULT_TOML);
                Ok(())
            }
            Command::Config(ConfigCommand::Show) => {
                print!("{}", toml::to_string_pretty(&config)?);
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fskv: {e:#}");
            match e.downcast_ref::<admin::ExitStatus>() {
                Some(status) => std::process::ExitCode::from(status.code),
                None => std::process::ExitCode::FAILURE,
            }
        }
    }
}

/// A process generation that grows across restarts (the start time in ns),
/// as mgmtd's fencing of storage and meta heartbeats requires.
fn generation_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn s3s_logging_is_off_unless_asked_for() {
        assert_eq!(super::log_filter(None, "info"), "info,s3s=off");
        assert_eq!(super::log_filter(Some("warn".into()), "info"), "warn,s3s=off");
        assert_eq!(super::log_filter(Some("debug,s3s=debug".into()), "info"), "debug,s3s=debug");
        assert!(tracing_subscriber::EnvFilter::try_new(super::log_filter(None, "info")).is_ok());
    }
}
