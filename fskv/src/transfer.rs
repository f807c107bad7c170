//! `fskv put` / `fskv get`: copy a file between the local disk and the
//! cluster through the native client's file handle API, in blocks, with a
//! progress line on stderr every `PROGRESS_INTERVAL_MS` for long transfers.

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use fskv_client::file::{FsClient, FsClientConfig, OpenFlags};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Bytes per read_at / write_at call (striped over chains inside).
const BLOCK_BYTES: usize = 8 << 20;
/// Pause between two progress lines.
const PROGRESS_INTERVAL_MS: u64 = 1_000;

#[derive(Args)]
pub struct ClusterArgs {
    /// mgmtd address(es), `host:port`; repeat or separate with commas.
    #[arg(long, required = true, value_delimiter = ',')]
    mgmtd: Vec<String>,
    /// Meta server address(es), `host:port`; repeat or separate with commas.
    /// Optional: without it, the meta servers registered with mgmtd are used.
    #[arg(long, value_delimiter = ',')]
    meta: Vec<String>,
}

#[derive(Args)]
pub struct PutArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The local file to upload.
    local: PathBuf,
    /// Absolute path in the filesystem (its directory must exist); replaced if present.
    remote: String,
}

#[derive(Args)]
pub struct GetArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Absolute path in the filesystem.
    remote: String,
    /// The local file to write (replaced if present).
    local: PathBuf,
}

async fn connect(c: &ClusterArgs) -> anyhow::Result<FsClient> {
    FsClient::connect(c.mgmtd.clone(), c.meta.clone(), FsClientConfig::default())
        .await
        .with_context(|| format!("connecting to mgmtd {:?} / meta {:?}", c.mgmtd, c.meta))
}

/// Prints `verb: done/total` at most every `PROGRESS_INTERVAL_MS`.
struct Progress {
    verb: &'static str,
    total: u64,
    started: Instant,
    last: Instant,
}

impl Progress {
    fn new(verb: &'static str, total: u64) -> Self {
        let now = Instant::now();
        Progress { verb, total, started: now, last: now }
    }

    fn tick(&mut self, done: u64) {
        if self.last.elapsed() < Duration::from_millis(PROGRESS_INTERVAL_MS) {
            return;
        }
        self.last = Instant::now();
        let pct = if self.total == 0 { 100.0 } else { done as f64 * 100.0 / self.total as f64 };
        eprintln!("{}: {} / {} bytes ({pct:.0}%), {:.1} MiB/s", self.verb, done, self.total, self.rate_mib_s(done));
    }

    fn rate_mib_s(&self, done: u64) -> f64 {
        done as f64 / (1024.0 * 1024.0) / self.started.elapsed().as_secs_f64().max(1e-6)
    }
}

pub async fn put(a: PutArgs) -> anyhow::Result<()> {
    let mut file = std::fs::File::open(&a.local).with_context(|| format!("cannot open {}", a.local.display()))?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    let fs = connect(&a.cluster).await?;
    let handle = fs.open(&a.remote, OpenFlags::create_truncate()).await?;
    let mut progress = Progress::new("put", total);
    let mut offset = 0u64;
    let mut buf = vec![0u8; BLOCK_BYTES];
    loop {
        let n = read_full(&mut file, &mut buf).with_context(|| format!("reading {}", a.local.display()))?;
        if n == 0 {
            break;
        }
        handle.write_at(offset, Bytes::copy_from_slice(&buf[..n])).await?;
        offset += n as u64;
        progress.tick(offset);
    }
    let len = handle.close().await?;
    fs.shutdown();
    anyhow::ensure!(len == offset, "{}: length after close is {len}, wrote {offset} bytes; retry the upload", a.remote);
    println!("put {} -> {}: {offset} bytes, {:.1} MiB/s", a.local.display(), a.remote, progress.rate_mib_s(offset));
    Ok(())
}

/// Fills `buf` unless the reader ends first; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

pub async fn get(a: GetArgs) -> anyhow::Result<()> {
    let fs = connect(&a.cluster).await?;
    let handle = fs.open(&a.remote, OpenFlags::read_only()).await?;
    let total = handle.len();
    let mut out = std::fs::File::create(&a.local).with_context(|| format!("cannot create {}", a.local.display()))?;
    let mut progress = Progress::new("get", total);
    let mut offset = 0u64;
    while offset < total {
        let data = handle.read_at(offset, BLOCK_BYTES as u64).await?;
        anyhow::ensure!(!data.is_empty(), "{}: read at {offset} returned nothing before the length {total}", a.remote);
        out.write_all(&data).with_context(|| format!("writing {}", a.local.display()))?;
        offset += data.len() as u64;
        progress.tick(offset);
    }
    out.sync_all().with_context(|| format!("syncing {}", a.local.display()))?;
    handle.close().await?;
    fs.shutdown();
    println!("get {} -> {}: {offset} bytes, {:.1} MiB/s", a.remote, a.local.display(), progress.rate_mib_s(offset));
    Ok(())
}
