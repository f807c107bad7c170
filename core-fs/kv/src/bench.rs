//! `fskv bench kv`: commits per second of small transactions on the embedded
//! engine, next to raw RocksDB write batches with the same durability (WAL
//! fsync per batch) in the same run, with 1 and 16 concurrent committers.
//!
//! Both sides write the same keys and values (two 24-byte keys with 100-byte
//! values per transaction). The raw side is the ceiling: our engine adds the
//! resolver, the transaction overlay and a thread hop per commit.

use crate::{KvEngine, RocksEngine, RocksOptions};
use rocksdb::{Options, WriteBatch, WriteOptions, DB};
use serde::Serialize;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct KvBenchOptions {
    /// Directory under which the two databases are created (and removed).
    pub dir: PathBuf,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Concurrency levels to measure.
    pub committers: Vec<usize>,
    /// fsync the WAL per commit batch (true matches the engine's default).
    pub sync_writes: bool,
}

impl Default for KvBenchOptions {
    fn default() -> Self {
        KvBenchOptions { dir: PathBuf::from("."), seconds: 5.0, committers: vec![1, 16], sync_writes: true }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct KvBenchRow {
    pub committers: usize,
    pub engine_commits_per_s: f64,
    pub engine_read_write_commits_per_s: f64,
    pub raw_batches_per_s: f64,
    pub ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct KvBenchReport {
    pub sync_writes: bool,
    pub seconds: f64,
    pub rows: Vec<KvBenchRow>,
}

impl fmt::Display for KvBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "KV engine: small transactions (2 keys x 100 B), sync_writes={}, {} s per run", self.sync_writes, self.seconds)?;
        writeln!(f, "{:>10} {:>16} {:>20} {:>16} {:>8}", "committers", "engine commit/s", "engine rmw commit/s", "raw batch/s", "ratio")?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>10} {:>16.0} {:>20.0} {:>16.0} {:>8.2}",
                r.committers, r.engine_commits_per_s, r.engine_read_write_commits_per_s, r.raw_batches_per_s, r.ratio
            )?;
        }
        write!(f, "ratio = engine blind-write commits / raw RocksDB write batches (goal >= 0.5)")
    }
}

const VALUE: [u8; 100] = [0x5a; 100];

fn key(worker: usize, i: u64, k: u8) -> Vec<u8> {
    format!("bench/{worker:04}/{i:012}/{k}").into_bytes()
}

/// Runs the whole comparison. Bounded by `seconds` per measurement.
pub async fn run(opts: KvBenchOptions) -> anyhow::Result<KvBenchReport> {
    let root = opts.dir.join(format!(".fskv-bench-kv-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let result = run_in(&root, &opts).await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn run_in(root: &std::path::Path, opts: &KvBenchOptions) -> anyhow::Result<KvBenchReport> {
    let duration = Duration::from_secs_f64(opts.seconds.max(0.2));
    let engine = Arc::new(RocksEngine::open(root.join("engine"), RocksOptions { sync_writes: opts.sync_writes, ..Default::default() })?);
    let raw = Arc::new(open_raw(&root.join("raw"))?);
    let mut rows = Vec::new();
    for &n in &opts.committers {
        let raw_rate = raw_batches(raw.clone(), n, duration, opts.sync_writes).await?;
        let engine_rate = engine_commits(engine.clone(), n, duration, false).await?;
        let rmw_rate = engine_commits(engine.clone(), n, duration, true).await?;
        rows.push(KvBenchRow {
            committers: n,
            engine_commits_per_s: engine_rate,
            engine_read_write_commits_per_s: rmw_rate,
            raw_batches_per_s: raw_rate,
            ratio: if raw_rate > 0.0 { engine_rate / raw_rate } else { 0.0 },
        });
    }
    Ok(KvBenchReport { sync_writes: opts.sync_writes, seconds: duration.as_secs_f64(), rows })
}

fn open_raw(path: &std::path::Path) -> anyhow::Result<DB> {
    let mut o = Options::default();
    o.create_if_missing(true);
    o.set_max_background_jobs(2);
    o.set_bytes_per_sync(1 << 20);
    Ok(DB::open(&o, path)?)
}

async fn raw_batches(db: Arc<DB>, workers: usize, duration: Duration, sync: bool) -> anyhow::Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut threads = Vec::new();
    for w in 0..workers {
        let (db, stop, count) = (db.clone(), stop.clone(), count.clone());
        threads.push(std::thread::spawn(move || -> anyhow::Result<()> {
            let mut wo = WriteOptions::default();
            wo.set_sync(sync);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut b = WriteBatch::default();
                b.put(key(w, i, 0), VALUE);
                b.put(key(w, i, 1), VALUE);
                db.write_opt(b, &wo)?;
                count.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            Ok(())
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("raw writer thread panicked"))??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

async fn engine_commits(engine: Arc<RocksEngine>, workers: usize, duration: Duration, read_first: bool) -> anyhow::Result<f64> {
    timed(workers, duration, move |w, i| {
        let engine = engine.clone();
        async move {
            let mut t = engine.begin().await?;
            if read_first {
                t.get(&key(w + 1000, i, 0)).await?;
            }
            t.set(&key(w, i, 0), &VALUE)?;
            t.set(&key(w, i, 1), &VALUE)?;
            t.commit().await?;
            Ok(())
        }
    })
    .await
}

/// Runs `op(worker, iteration)` on `workers` tasks for `duration`; ops per second.
pub async fn timed<F, Fut>(workers: usize, duration: Duration, op: F) -> anyhow::Result<f64>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static + Clone,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (stop, count, op) = (stop.clone(), count.clone(), op.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                op(w, i).await?;
                count.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}
