//! `fskv mount --mgmtd A --meta A PATH`: the FUSE mount, with USRBIO in
//! `PATH/3fs-virt` unless `--no-usrbio`. Serves until SIGTERM / Ctrl-C, then
//! unmounts (also when serving fails).

use anyhow::Context;
use clap::Args;
use fskv_client::file::{FsClient, FsClientConfig};
use fskv_fuse::MountConfig;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct MountArgs {
    /// mgmtd address(es), `host:port`; repeat or separate with commas.
    #[arg(long, required = true, value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Meta server address(es), `host:port`; repeat or separate with commas.
    /// Optional: without it, the meta servers registered with mgmtd are used.
    #[arg(long, value_delimiter = ',')]
    meta: Vec<String>,
    /// Kernel attribute and entry cache timeout.
    #[arg(long, default_value_t = 1_000)]
    attr_ttl_ms: u64,
    /// Only the mounting user may use the mount (no `allow_other`).
    #[arg(long)]
    private: bool,
    /// Do not serve USRBIO (no `3fs-virt` directory, no ring dispatcher).
    #[arg(long)]
    no_usrbio: bool,
    /// Write-behind: small writes to an open file are gathered into runs of
    /// the file's chunk size (at most this many bytes) and written in the
    /// background; fsync(2) and close(2) wait for them. 0 = every write goes
    /// to storage before it returns.
    #[arg(long, env = "FSKV_MOUNT_WRITE_BUFFER_BYTES", default_value_t = MountConfig::default().write_buffer_bytes)]
    write_buffer_bytes: u64,
    /// A partial run is written this long after its first byte.
    #[arg(long, default_value_t = MountConfig::default().write_flush_delay_ms)]
    write_flush_delay_ms: u64,
    /// Kernel readahead window of the mount (sequential reads keep this
    /// much in flight); written to the mount's
    /// `/sys/class/bdi/MAJ:MIN/read_ahead_kb` (needs root; otherwise the
    /// kernel's 128 KiB stays).
    #[arg(long, env = "FSKV_MOUNT_READAHEAD_BYTES", default_value_t = MountConfig::default().max_readahead_bytes)]
    readahead_bytes: u32,
    /// A small read that misses the page cache reads the aligned window of
    /// this many bytes around it and stores the rest of it in the kernel's
    /// page cache, as a local filesystem's readahead does (a power of two
    /// from 8 KiB to 1 MiB; 0 = off; docs/fuse.md "Read-around").
    #[arg(long, env = "FSKV_MOUNT_READ_AROUND_BYTES", default_value_t = MountConfig::default().read_around_bytes)]
    read_around_bytes: u32,
    /// fsync every namespace change (create, mkdir, rename, close, …) before
    /// replying. Default: changes are acknowledged once in meta's log (they
    /// survive a crash of meta) and fsync(2) / fsyncdir(2) make them durable
    /// across power loss; meta fsyncs them within 100 ms anyway.
    #[arg(long, env = "FSKV_MOUNT_SYNCED_METADATA")]
    synced_metadata: bool,
    /// The close of a file opened for writing but never written (`touch`,
    /// `: > f`) waits this long for others to share one meta request; the
    /// kernel does not wait for it, and until it is sent meta sees the file
    /// as still open. 0 = each close is sent at its release.
    #[arg(long, default_value_t = MountConfig::default().close_batch_delay_ms)]
    close_batch_delay_ms: u64,
    /// Serve the mount's Prometheus metrics (`GET /metrics`: per-operation
    /// counts and latencies, docs/metrics.md) on this address.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// The directory to mount on.
    path: PathBuf,
}

pub async fn run(args: MountArgs) -> anyhow::Result<()> {
    fskv_fuse::readaround::check_window_bytes(args.read_around_bytes).map_err(|e| anyhow::anyhow!("--read-around-bytes: {e}"))?;
    let client = FsClient::connect(args.mgmtd.clone(), args.meta.clone(), FsClientConfig::default())
        .await
        .with_context(|| format!("connecting to mgmtd {:?} / meta {:?}", args.mgmtd, args.meta))?;
    let mut cfg = MountConfig {
        attr_ttl_ms: args.attr_ttl_ms,
        entry_ttl_ms: args.attr_ttl_ms,
        allow_other: !args.private,
        write_buffer_bytes: args.write_buffer_bytes,
        write_flush_delay_ms: args.write_flush_delay_ms,
        max_readahead_bytes: args.readahead_bytes,
        read_around_bytes: args.read_around_bytes,
        relaxed_metadata: !args.synced_metadata,
        close_batch_delay_ms: args.close_batch_delay_ms,
        ..Default::default()
    };
    if args.no_usrbio {
        cfg.usrbio = None;
    }
    let _metrics_server = match &args.metrics_listen {
        Some(addr) => {
            let registry = fskv_rpc::MetricsRegistry::new();
            cfg.metrics = Some(registry.clone());
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for metrics on {addr} (--metrics-listen)"))?;
            let timeout = std::time::Duration::from_millis(fskv_rpc::settings::current().frame_read_timeout_ms);
            Some(AbortOnDrop(tokio::spawn(fskv_rpc::http::serve_metrics(listener, registry, timeout))))
        }
        None => None,
    };
    let path = args.path.clone();
    let on_mounted = move || {
        println!("mounted {}; SIGTERM or Ctrl-C unmounts", path.display());
        let _ = std::io::stdout().flush();
    };
    let result = fskv_fuse::serve(client.clone(), &args.path, cfg, on_mounted, crate::storage_cmd::wait_for_signal()).await;
    client.shutdown();
    result.with_context(|| format!("mount at {}", args.path.display()))
}

/// Stops the metrics listener when the mount ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
