//! `fskv bench meta`: creates, stats, readdir pages and renames per second
//! over loopback RPC (one meta server, `MetaClient`) with 1 and 32 concurrent
//! callers, next to the KV engine's raw small-commit rate measured in the
//! same run on the same engine (two 100-byte sets per transaction), so the
//! report shows what fraction of the engine's commit capacity a metadata
//! operation costs.
//!
//! All callers share one directory per concurrency level (creates there go
//! through the per-inode batch queue); renames move each caller's own files
//! inside that directory; readdir pages are 128 entries with attributes off.

use crate::ops::MetaConfig;
use crate::service::MetaService;
use crate::storage::NoStorage;
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_kv::bench::timed;
use fskv_kv::{KvEngine, RocksEngine, RocksOptions};
use fskv_types::InodeId;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct MetaBenchOptions {
    /// Directory under which a temporary RocksDB engine is created (and removed).
    pub dir: PathBuf,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Concurrent callers to measure.
    pub callers: Vec<usize>,
    /// fsync the WAL per commit batch.
    pub sync_writes: bool,
    /// Entries per readdir page.
    pub readdir_page_entries: u32,
    /// Per-inode batch queues of the server (0 = no batching).
    pub batch_shards: usize,
    /// A KV engine spec (`fskv_kv::open_engine`) to measure instead of a
    /// temporary RocksDB under `dir` — e.g. an etcd cluster. Its keyspace
    /// must be empty (for etcd: a fresh `prefix`).
    pub engine_spec: Option<String>,
}

impl Default for MetaBenchOptions {
    fn default() -> Self {
        MetaBenchOptions {
            dir: PathBuf::from("."),
            seconds: 3.0,
            callers: vec![1, 32],
            sync_writes: true,
            readdir_page_entries: 128,
            batch_shards: 8,
            engine_spec: None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MetaBenchRow {
    pub callers: usize,
    pub kv_small_commits_per_s: f64,
    pub creates_per_s: f64,
    pub stats_per_s: f64,
    pub readdir_pages_per_s: f64,
    pub renames_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct MetaBenchReport {
    pub engine: String,
    pub sync_writes: bool,
    pub seconds: f64,
    pub readdir_page_entries: u32,
    pub batch_shards: usize,
    pub rows: Vec<MetaBenchRow>,
}

impl fmt::Display for MetaBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Meta service over loopback RPC, engine {} (sync_writes={}), {} s per run, readdir pages of {} entries, batch_shards={}",
            self.engine, self.sync_writes, self.seconds, self.readdir_page_entries, self.batch_shards
        )?;
        writeln!(
            f,
            "{:>7} {:>14} {:>10} {:>10} {:>12} {:>10} {:>16} {:>16}",
            "callers", "kv commit/s", "create/s", "stat/s", "readdir pg/s", "rename/s", "create/kv commit", "rename/kv commit"
        )?;
        for r in &self.rows {
            let kv = r.kv_small_commits_per_s.max(1e-9);
            writeln!(
                f,
                "{:>7} {:>14.0} {:>10.0} {:>10.0} {:>12.0} {:>10.0} {:>16.2} {:>16.2}",
                r.callers,
                r.kv_small_commits_per_s,
                r.creates_per_s,
                r.stats_per_s,
                r.readdir_pages_per_s,
                r.renames_per_s,
                r.creates_per_s / kv,
                r.renames_per_s / kv
            )?;
        }
        write!(f, "create/kv commit = creates/s divided by raw small commits/s of the same engine and concurrency")
    }
}

pub async fn run(opts: MetaBenchOptions) -> anyhow::Result<MetaBenchReport> {
    std::fs::create_dir_all(&opts.dir)?;
    let root = opts.dir.join(format!("fskv-bench-meta-{}", std::process::id()));
    let result = run_in(&root, &opts).await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn run_in(root: &std::path::Path, opts: &MetaBenchOptions) -> anyhow::Result<MetaBenchReport> {
    let engine: Arc<dyn KvEngine> = match &opts.engine_spec {
        Some(spec) => fskv_kv::open_engine(spec)?,
        None => Arc::new(RocksEngine::open(root, RocksOptions { sync_writes: opts.sync_writes, ..RocksOptions::default() })?),
    };
    let cfg = MetaConfig { gc_interval_ms: 0, batch_shards: opts.batch_shards, ..MetaConfig::default() };
    let svc = MetaService::open(engine.clone(), Arc::new(NoStorage), cfg).await?;
    let server = svc.serve("127.0.0.1:0").await?;
    let client = MetaClient::new(MetaClientConfig::new(vec![server.local_addr().to_string()]))?;
    let duration = Duration::from_secs_f64(opts.seconds.max(0.1));
    let mut rows = Vec::new();
    for &callers in &opts.callers {
        let callers = callers.max(1);
        let kv = kv_small_commits(engine.clone(), callers, duration).await?;
        let dir = client.mkdir(InodeId::ROOT, &format!("bench-{callers}"), 0o755).await?.id;
        let created = Arc::new(parking_lot::Mutex::new(vec![Vec::new(); callers]));
        let creates = timed(callers, duration, {
            let (client, created) = (client.clone(), created.clone());
            move |w, i| {
                let (client, created) = (client.clone(), created.clone());
                async move {
                    let name = format!("w{w}-{i}");
                    let inode = client.create(dir, &name, 0o644, true).await?;
                    created.lock()[w].push((name, inode.id));
                    Ok(())
                }
            }
        })
        .await?;
        let files: Arc<Vec<Vec<(String, InodeId)>>> = Arc::new(created.lock().clone());
        let stats = timed(callers, duration, {
            let (client, files) = (client.clone(), files.clone());
            move |w, i| {
                let (client, files) = (client.clone(), files.clone());
                async move {
                    if let Some(mine) = files.get(w).filter(|v| !v.is_empty()) {
                        client.stat(mine[(i as usize) % mine.len()].1).await?;
                    }
                    Ok(())
                }
            }
        })
        .await?;
        let page = opts.readdir_page_entries;
        let cursor = Arc::new(parking_lot::Mutex::new(vec![String::new(); callers]));
        let readdirs = timed(callers, duration, {
            let (client, cursor) = (client.clone(), cursor.clone());
            move |w, _| {
                let (client, cursor) = (client.clone(), cursor.clone());
                async move {
                    let after = cursor.lock()[w].clone();
                    let (entries, more) = client.readdir(dir, &after, page, false).await?;
                    cursor.lock()[w] = if more { entries.last().map(|e| e.name.clone()).unwrap_or_default() } else { String::new() };
                    Ok(())
                }
            }
        })
        .await?;
        // Each caller renames its own files back and forth ("x" suffix toggles).
        let names = Arc::new(parking_lot::Mutex::new(
            files.iter().map(|v| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()).collect::<Vec<_>>(),
        ));
        let renames = timed(callers, duration, {
            let (client, names) = (client.clone(), names.clone());
            move |w, i| {
                let (client, names) = (client.clone(), names.clone());
                async move {
                    let current = {
                        let n = names.lock();
                        n.get(w).filter(|v| !v.is_empty()).map(|v| ((i as usize) % v.len(), v[(i as usize) % v.len()].clone()))
                    };
                    let Some((idx, from)) = current else { return Ok(()) };
                    let to = if let Some(base) = from.strip_suffix('x') { base.to_string() } else { format!("{from}x") };
                    client.rename(dir, &from, dir, &to).await?;
                    names.lock()[w][idx] = to;
                    Ok(())
                }
            }
        })
        .await?;
        rows.push(MetaBenchRow {
            callers,
            kv_small_commits_per_s: kv,
            creates_per_s: creates,
            stats_per_s: stats,
            readdir_pages_per_s: readdirs,
            renames_per_s: renames,
        });
    }
    server.shutdown().await;
    drop(svc);
    Ok(MetaBenchReport {
        engine: engine.name().to_string(),
        sync_writes: opts.sync_writes,
        seconds: duration.as_secs_f64(),
        readdir_page_entries: opts.readdir_page_entries,
        batch_shards: opts.batch_shards,
        rows,
    })
}

/// The engine's raw small-commit rate: two 100-byte blind sets per transaction.
async fn kv_small_commits(engine: Arc<dyn KvEngine>, workers: usize, duration: Duration) -> anyhow::Result<f64> {
    timed(workers, duration, move |w, i| {
        let engine = engine.clone();
        async move {
            let mut txn = engine.begin().await?;
            for k in 0..2u8 {
                txn.set(format!("benchkv/{w:04}/{i:012}/{k}").as_bytes(), &[0x5a; 100])?;
            }
            txn.commit().await?;
            Ok(())
        }
    })
    .await
}
