//! The file handle API over a real meta service (served over loopback RPC,
//! `ChainStorage` backend) and a loopback cluster of three storage services
//! with four chains of three replicas.

mod common;

use bytes::Bytes;
use fskv_chunk_engine::EngineConfig;
use fskv_client::file::{FsClient, FsClientConfig, OpenFlags};
use fskv_client::storage::StorageClientConfig;
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_meta::{ChainStorage, MetaConfig, MetaService, StorageBackend};
use fskv_proto::meta::LayoutPolicy;
use fskv_proto::routing::PublicTargetState;
use fskv_storage::cluster::{ClusterOptions, LocalCluster};
use fskv_types::{ChainId, ErrorCode, InodeId, TargetId};
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const CHUNK: u64 = 4096;
const STRIPE: u32 = 4;

struct Env {
    fs: FsClient,
    cluster: LocalCluster,
    server: fskv_rpc::Server,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn start(config: FsClientConfig) -> Env {
        Env::start_with(config, false).await
    }

    async fn start_with(config: FsClientConfig, lagging_routing: bool) -> Env {
        Env::start_layout(config, lagging_routing, STRIPE, 3).await
    }

    async fn start_layout(config: FsClientConfig, lagging_routing: bool, stripe: u32, replicas: usize) -> Env {
        Env::start_meta(config, lagging_routing, stripe, replicas, |_| {}).await
    }

    /// `stripe` chains of `replicas` targets over three nodes.
    /// As `start_layout`, with meta's configuration adjusted by `tweak`.
    async fn start_meta(
        config: FsClientConfig,
        lagging_routing: bool,
        stripe: u32,
        replicas: usize,
        tweak: impl FnOnce(&mut MetaConfig),
    ) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        // Chain c: targets c*10+1.. on the three nodes, heads rotated.
        let chains = common::chain_placement(stripe, replicas);
        let options = ClusterOptions::new(EngineConfig { blocks_per_grow: 8, sync_writes: false, ..EngineConfig::default() });
        let cluster = LocalCluster::start(dir.path(), 3, &chains, options).await.expect("storage cluster");
        let storage = cluster.client(StorageClientConfig { max_attempts: 20, retry_backoff_ms: 2, ..Default::default() });
        let backend = Arc::new(ChainStorage::new(storage.clone()));
        let cfg = MetaConfig {
            gc_interval_ms: 0,
            chains: (1..=stripe).map(ChainId).collect(),
            root_layout: LayoutPolicy { table_id: 1, table_version: 1, chunk_size_bytes: CHUNK as u32, stripe_size: stripe },
            ..MetaConfig::default()
        };
        let mut cfg = cfg;
        tweak(&mut cfg);
        let svc =
            MetaService::open(Arc::new(fskv_kv::MemoryEngine::new()), backend as Arc<dyn StorageBackend>, cfg).await.expect("meta service");
        let server = svc.serve("127.0.0.1:0").await.expect("serve meta");
        let meta = MetaClient::new(MetaClientConfig::new(vec![server.local_addr().to_string()])).expect("meta client");
        let storage = if lagging_routing {
            common::lagging_storage_client(&cluster, StorageClientConfig { max_attempts: 20, retry_backoff_ms: 2, ..Default::default() })
        } else {
            storage
        };
        let fs = FsClient::new(meta, storage, config);
        Env { fs, cluster, server, _dir: dir }
    }

    /// Chains holding at least one chunk of `inode` (from the heads' engines).
    fn chains_with_chunks(&self, inode: InodeId) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for c in 1..=STRIPE {
            for r in 1..=3 {
                let engine = self.cluster.engine(TargetId(u64::from(c * 10 + r))).expect("engine");
                if engine.dump().expect("dump").iter().any(|(id, _)| id.inode == inode) {
                    out.insert(c);
                }
            }
        }
        out
    }

    async fn stop(self) {
        self.server.shutdown().await;
        self.cluster.shutdown().await;
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(131) ^ seed.wrapping_mul(17)) as u8 | 1).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_of_many_sizes_round_trip() {
    let env = Env::start(FsClientConfig { max_inflight_chunks: 4, ..Default::default() }).await;
    let c = CHUNK as usize;
    let big = 2 * STRIPE as usize * c + c / 3; // more than one stripe of chunks
    let sizes = [0, 1, c - 1, c, c + 1, 3 * c + 100, big];
    for (i, &size) in sizes.iter().enumerate() {
        let path = format!("/f{i}");
        let data = pattern(i as u64, size);
        let w = env.fs.open(&path, OpenFlags::create_new()).await.expect("create");
        w.write_at(0, Bytes::from(data.clone())).await.expect("write");
        assert_eq!(w.len(), size as u64);
        assert_eq!(w.read_at(0, size as u64).await.expect("read own write"), data, "{path} through the writer");
        assert_eq!(w.close().await.expect("close"), size as u64, "{path}: exact length on close");

        let r = env.fs.open(&path, OpenFlags::read_only()).await.expect("open");
        assert_eq!(r.len(), size as u64);
        assert_eq!(r.read_at(0, size as u64 + 100).await.expect("read"), data, "{path} whole, past EOF");
        assert!(r.read_at(size as u64, 10).await.expect("read at EOF").is_empty());
        if size > 2 {
            let (off, len) = (size as u64 / 3, size as u64 / 2);
            let got = r.read_at(off, len).await.expect("read middle");
            assert_eq!(got, data[off as usize..(off + len) as usize], "{path} middle");
        }
        if size == big {
            let touched = env.chains_with_chunks(r.inode());
            assert_eq!(touched.len(), STRIPE as usize, "a multi-stripe file uses every chain: {touched:?}");
        }
        r.close().await.expect("close reader");
    }
    let peak = env.fs.stats().peak_inflight_chunks.load(Ordering::Relaxed);
    assert!((2..=4).contains(&peak), "chunk pieces in flight at once: {peak} (bound 4)");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_overwrites_holes_and_truncate_match_a_model() {
    let env = Env::start(FsClientConfig::default()).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let h = env.fs.open("/model", OpenFlags::create_new()).await.expect("create");
    let mut model: Vec<u8> = Vec::new();
    let span = 10 * CHUNK;
    for round in 0..40u64 {
        let off = rng.gen_range(0..span);
        let len = rng.gen_range(1..=2 * CHUNK);
        let data = pattern(round + 100, len as usize);
        h.write_at(off, Bytes::from(data.clone())).await.expect("write");
        let end = (off + len) as usize;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(&data);
        if round % 8 == 7 {
            assert_eq!(h.read_at(0, u64::MAX / 2).await.expect("read"), model, "after round {round}");
        }
    }
    // A hole: far past the end; zeros in between.
    let far = 30 * CHUNK + 5;
    h.write_at(far, Bytes::from_static(b"tail")).await.expect("write far");
    model.resize(far as usize, 0);
    model.extend_from_slice(b"tail");
    assert_eq!(h.read_at(0, far + 100).await.expect("read holes"), model);

    // Truncate down inside a chunk, then up (zeros past the old end).
    h.truncate(CHUNK + 3).await.expect("truncate down");
    model.truncate((CHUNK + 3) as usize);
    assert_eq!(h.len(), CHUNK + 3);
    assert_eq!(h.read_at(0, 100 * CHUNK).await.expect("read after truncate"), model);
    h.truncate(5 * CHUNK).await.expect("truncate up");
    model.resize(5 * CHUNK as usize, 0);
    assert_eq!(h.read_at(0, 100 * CHUNK).await.expect("read after extend"), model);
    assert_eq!(h.close().await.expect("close"), 5 * CHUNK, "close keeps the extended length");

    let r = env.fs.open("/model", OpenFlags::read_only()).await.expect("reopen");
    assert_eq!(r.read_at(0, 100 * CHUNK).await.expect("read"), model, "another handle sees the model");
    // Truncate on open.
    let t = env.fs.open("/model", OpenFlags::create_truncate()).await.expect("open truncate");
    assert_eq!(t.len(), 0);
    assert_eq!(t.close().await.expect("close"), 0);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_handle_sees_writes_after_fsync_report_and_close() {
    let env = Env::start(FsClientConfig { length_report_interval_ms: 100, ..Default::default() }).await;
    let w = env.fs.open("/shared", OpenFlags::create_new()).await.expect("create");
    let first = pattern(1, 3 * CHUNK as usize + 10);
    w.write_at(0, Bytes::from(first.clone())).await.expect("write");
    w.fsync().await.expect("fsync");
    let r = env.fs.open("/shared", OpenFlags::read_only()).await.expect("open reader");
    assert_eq!(r.len(), first.len() as u64, "fsync reported the length");
    assert_eq!(r.read_at(0, 1 << 20).await.expect("read"), first);

    // The periodic report makes a later append visible without fsync.
    let more = pattern(2, 100);
    w.write_at(first.len() as u64, Bytes::from(more.clone())).await.expect("append");
    let want = (first.len() + more.len()) as u64;
    let mut seen = 0;
    for _ in 0..50 {
        seen = r.refresh_len().await.expect("refresh");
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, want, "periodic length report");
    assert_eq!(w.close().await.expect("close"), want);
    let r2 = env.fs.open("/shared", OpenFlags::read_only()).await.expect("reopen");
    let got = r2.read_at(0, 1 << 20).await.expect("read");
    assert_eq!(&got[..first.len()], &first[..]);
    assert_eq!(&got[first.len()..], &more[..]);

    // Mode and state errors name the file.
    let err = r2.write_at(0, Bytes::from_static(b"x")).await.expect_err("read-only handle");
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    assert!(err.to_string().contains("/shared"), "{err}");
    let err = env.fs.open("/missing", OpenFlags::read_only()).await.err().expect("missing file");
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(env.fs.open("/shared", OpenFlags::create_new()).await.is_err(), "exclusive create of an existing file");
    env.stop().await;
}

/// Only a write handle through which nothing was written may end with a
/// quiet close (the FUSE mount queues those): one that wrote, even a write
/// that failed, is handed back and its close reports the length.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_untouched_write_handles_close_quietly() {
    let env = Env::start(FsClientConfig::default()).await;
    let untouched = env.fs.open("/quiet", OpenFlags::create_new()).await.expect("create");
    assert!(untouched.never_wrote());
    let session = untouched.session();
    let Ok(quiet) = untouched.into_quiet_close() else { panic!("an untouched handle closes quietly") };
    assert_eq!((quiet.session, quiet.end.wrote, quiet.end.length_hint), (session, false, Some(0)));
    let results = env.fs.meta().close_many(&[(quiet.inode, quiet.session, quiet.end)]).await.expect("batch");
    assert!(matches!(results.as_slice(), [Ok(())]), "{results:?}");

    let w = env.fs.open("/written", OpenFlags::create_new()).await.expect("create");
    let data = pattern(7, 5000);
    w.write_at(0, Bytes::from(data.clone())).await.expect("write");
    assert!(!w.never_wrote());
    let w = w.into_quiet_close().expect_err("a handle that wrote is handed back");
    assert_eq!(w.close().await.expect("close"), data.len() as u64, "its close reports the length");

    let ro = env.fs.open("/written", OpenFlags::read_only()).await.expect("open");
    assert!(ro.into_quiet_close().is_err(), "a read-only handle has no session to end");
    let quiet_file = env.fs.open("/quiet", OpenFlags::read_only()).await.expect("open");
    assert_eq!(quiet_file.len(), 0);
    env.stop().await;
}

/// `O_TRUNC` empties a file whose writer never reported its length (it
/// failed or died before closing: meta still shows 0 bytes while its chunks
/// hold data). Before, the open skipped the truncate for an "empty" file, and
/// the next close measured the old chunks on storage: the file came back
/// with the dead writer's bytes after the new ones (found by the simulation).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn truncating_open_cuts_chunks_a_dead_writer_left_unreported() {
    let env = Env::start(FsClientConfig { length_report_interval_ms: 0, ..Default::default() }).await;
    let dead = env.fs.open("/abandoned", OpenFlags::create_new()).await.expect("create");
    dead.write_at(0, Bytes::from(pattern(7, 3 * CHUNK as usize))).await.expect("write");
    drop(dead); // never closed, never reported
    let h = env.fs.open("/abandoned", OpenFlags::create_truncate()).await.expect("open with truncate");
    assert_eq!(h.len(), 0);
    h.write_at(0, Bytes::from_static(b"new")).await.expect("write");
    assert_eq!(h.close().await.expect("close"), 3, "the truncated file measured with the dead writer's chunks");
    let r = env.fs.open("/abandoned", OpenFlags::read_only()).await.expect("reopen");
    assert_eq!(&r.read_at(0, 1 << 20).await.expect("read")[..], b"new");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inline_files_read_and_refuse_writes() {
    let env = Env::start(FsClientConfig::default()).await;
    let body = b"small inline body".to_vec();
    env.fs.meta().create_write_publish(InodeId::ROOT, "inline", 0o644, &body, None, Default::default()).await.expect("create inline");
    let r = env.fs.open("/inline", OpenFlags::read_only()).await.expect("open");
    assert_eq!(r.len(), body.len() as u64);
    assert_eq!(r.read_at(0, 1000).await.expect("read inline"), body);
    assert_eq!(r.read_at(6, 6).await.expect("read inline part"), body[6..12]);
    let w = env.fs.open("/inline", OpenFlags::read_write()).await.expect("open for write");
    let err = w.write_at(0, Bytes::from_static(b"x")).await.expect_err("inline write");
    assert_eq!(err.code(), ErrorCode::Unsupported);
    w.close().await.expect("close");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_and_writes_follow_chain_version_changes() {
    let env = Env::start_with(FsClientConfig { relaxed_reads: true, ..Default::default() }, true).await;
    let data = pattern(9, 6 * CHUNK as usize + 77);
    let h = env.fs.open("/moving", OpenFlags::create_new()).await.expect("create");
    h.write_at(0, Bytes::from(data.clone())).await.expect("write");
    let before = env.fs.storage().routing().current().version;

    // Every chain loses a target (its version bumps); the client's cached
    // routing still names the old heads and versions.
    for c in 1..=u64::from(STRIPE) {
        env.cluster.set_state(TargetId(c * 10 + 1), PublicTargetState::Offline);
    }
    assert_eq!(env.fs.storage().routing().current().version, before, "the client's routing lags");
    assert_eq!(h.read_at(0, 1 << 20).await.expect("read after the change"), data);
    let mut model = data.clone();
    let patch = pattern(10, 2 * CHUNK as usize);
    h.write_at(CHUNK / 2, Bytes::from(patch.clone())).await.expect("write after the change");
    model[(CHUNK / 2) as usize..(CHUNK / 2) as usize + patch.len()].copy_from_slice(&patch);
    assert!(env.fs.storage().routing().current().version > before, "the client refreshed its routing");
    assert_eq!(h.close().await.expect("close"), model.len() as u64);
    let r = env.fs.open("/moving", OpenFlags::read_only()).await.expect("reopen");
    assert_eq!(r.read_at(0, 1 << 20).await.expect("read"), model);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn close_finds_a_chunk_past_the_initial_dynamic_stripe() {
    // 20 chains: meta's exact-length scan starts with the first 16.
    let env = Env::start_layout(FsClientConfig::default(), false, 20, 1).await;
    let h = env.fs.open("/sparse", OpenFlags::create_new()).await.expect("create");
    let index = (0..64u64)
        .find(|&i| {
            let chain = fskv_proto::meta::chain_for_chunk(h.layout(), i).expect("chain");
            h.layout().shuffled_chains().iter().position(|c| *c == chain).unwrap_or(0) >= 16
        })
        .expect("a chunk beyond the first 16 shuffled chains");
    let offset = index * CHUNK + 10;
    h.write_at(offset, Bytes::from_static(b"far")).await.expect("write far");
    assert_eq!(h.close().await.expect("close"), offset + 3, "exact length reaches chunk {index}");
    let r = env.fs.open("/sparse", OpenFlags::read_only()).await.expect("reopen");
    let got = r.read_at(0, offset + 100).await.expect("read");
    assert_eq!(got.len() as u64, offset + 3);
    assert!(got[..offset as usize].iter().all(|&b| b == 0));
    assert_eq!(&got[offset as usize..], b"far");
    env.stop().await;
}

/// A write that fails part way may leave chunks past the handle's written
/// end: its close must not claim that its writes settled, so meta measures
/// the length on storage and the chunk that did land counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_close_after_a_failed_write_measures_the_length_on_storage() {
    let env = Env::start_layout(FsClientConfig::default(), false, STRIPE, 1).await;
    let h = env.fs.open("/half", OpenFlags::create_new()).await.expect("create");
    // Chunk 0's chain loses its only target; chunk 1's chain is fine.
    let chain0 = fskv_proto::meta::chain_for_chunk(h.layout(), 0).expect("chain of chunk 0");
    let chain1 = fskv_proto::meta::chain_for_chunk(h.layout(), 1).expect("chain of chunk 1");
    assert_ne!(chain0, chain1);
    let target0 = TargetId(u64::from(chain0.0) * 10 + 1);
    env.cluster.set_state(target0, PublicTargetState::Offline);
    let data = pattern(3, CHUNK as usize + 100);
    h.write_at(0, Bytes::from(data.clone())).await.expect_err("chunk 0 has no serving target");
    let engine1 = env.cluster.engine(TargetId(u64::from(chain1.0) * 10 + 1)).expect("chunk 1's engine");
    assert!(engine1.dump().expect("dump").iter().any(|(id, _)| id.inode == h.inode()), "chunk 1 landed");
    env.cluster.set_state(target0, PublicTargetState::Serving);
    assert_eq!(h.close().await.expect("close"), CHUNK + 100, "meta measured chunk 1 on storage");
    env.stop().await;
}

/// `read_many_into`: many reads of several files in one call, into caller
/// buffers — against `read_at` and a model: unaligned ranges across chunk
/// boundaries, past EOF, entirely past EOF, holes as zeros and as errors
/// under `forbid_holes`, an inline file, a write-only handle, and lengths
/// another handle grew (re-read from meta).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_many_into_matches_read_at_holes_and_eof() {
    use fskv_client::file::{FileError, ReadInto, ReadIntoOptions};
    let env = Env::start(FsClientConfig { max_inflight_chunks: 3, ..Default::default() }).await;
    let c = CHUNK as usize;
    // Dense file: 9 chunks + a bit.
    let dense = pattern(21, 9 * c + 123);
    let w = env.fs.open("/dense", OpenFlags::create_new()).await.expect("create");
    w.write_at(0, Bytes::from(dense.clone())).await.expect("write");
    w.close().await.expect("close");
    // Sparse file: chunk 0 written, chunks 1-2 missing, chunk 3 half written.
    let w = env.fs.open("/sparse", OpenFlags::create_new()).await.expect("create");
    let head = pattern(22, c);
    let tail = pattern(23, c / 2);
    w.write_at(0, Bytes::from(head.clone())).await.expect("write head");
    w.write_at(3 * CHUNK, Bytes::from(tail.clone())).await.expect("write tail");
    w.close().await.expect("close");
    let mut sparse = head.clone();
    sparse.resize(3 * c, 0);
    sparse.extend_from_slice(&tail);
    let body = b"inline body bytes".to_vec();
    env.fs.meta().create_write_publish(InodeId::ROOT, "inl", 0o644, &body, None, Default::default()).await.expect("inline");

    let d = env.fs.open("/dense", OpenFlags::read_only()).await.expect("open");
    let s = env.fs.open("/sparse", OpenFlags::read_only()).await.expect("open");
    let i = env.fs.open("/inl", OpenFlags::read_only()).await.expect("open");
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // (handle, model, offset, len)
    let mut cases: Vec<(&fskv_client::FileHandle, &[u8], u64, usize)> = Vec::new();
    for _ in 0..40 {
        let off = rng.gen_range(0..dense.len() as u64 + 10);
        cases.push((&d, &dense, off, rng.gen_range(1..3 * c)));
    }
    cases.push((&d, &dense, 0, dense.len()));
    cases.push((&d, &dense, dense.len() as u64 - 5, 100)); // short at EOF
    cases.push((&d, &dense, dense.len() as u64 + 7, 100)); // entirely past EOF
    cases.push((&s, &sparse, 0, sparse.len() + 50)); // across the hole
    cases.push((&s, &sparse, CHUNK + 1, 10)); // inside the hole
    cases.push((&i, &body, 3, 100));
    let mut bufs: Vec<Vec<u8>> = cases.iter().map(|(_, _, _, len)| vec![0xAB; *len]).collect();
    let mut reads: Vec<ReadInto<'_>> =
        cases.iter().zip(bufs.iter_mut()).map(|((h, _, off, _), buf)| ReadInto { handle: h, offset: *off, buf }).collect();
    let results = env.fs.read_many_into(&mut reads, ReadIntoOptions::default()).await;
    drop(reads);
    for (k, ((h, model, off, len), r)) in cases.iter().zip(results).enumerate() {
        let n = r.unwrap_or_else(|e| panic!("case {k}: {e}"));
        let start = (*off as usize).min(model.len());
        let end = (*off as usize + len).min(model.len());
        assert_eq!(n, end - start, "case {k}: bytes read at {off}+{len} of {}", model.len());
        assert_eq!(&bufs[k][..n], &model[start..end], "case {k}: data");
        assert!(bufs[k][n..].iter().all(|&b| b == 0xAB), "case {k}: bytes past the result untouched");
        let via_read_at = h.read_at(*off, *len as u64).await.expect("read_at");
        assert_eq!(&via_read_at[..], &bufs[k][..n], "case {k}: same as read_at");
    }
    assert!(env.fs.stats().chunks_read.load(Ordering::Relaxed) > 40);

    // forbid_holes: the reads crossing or inside the hole fail, the others do not.
    let mut a = vec![0u8; 2 * c];
    let mut b = vec![0u8; 10];
    let mut e = vec![0u8; c];
    let mut reads = vec![
        ReadInto { handle: &s, offset: c as u64 - 5, buf: &mut a },
        ReadInto { handle: &s, offset: 2 * CHUNK, buf: &mut b },
        ReadInto { handle: &s, offset: 3 * CHUNK, buf: &mut e },
    ];
    let results = env.fs.read_many_into(&mut reads, ReadIntoOptions { forbid_holes: true, relaxed: false }).await;
    drop(reads);
    match &results[0] {
        Err(FileError::Hole { offset, .. }) => assert_eq!(*offset, CHUNK, "the hole starts at chunk 1"),
        other => panic!("read across the hole: {other:?}"),
    }
    assert!(matches!(results[1], Err(FileError::Hole { .. })), "read inside the hole: {:?}", results[1]);
    // The last chunk is written up to the file length: no hole.
    assert_eq!(results[2].as_ref().ok(), Some(&(c / 2)), "tail read");
    assert_eq!(&e[..c / 2], &tail[..]);

    // A writer grows the file; a reader's handle learns the new length.
    let g = env.fs.open("/dense", OpenFlags::read_write()).await.expect("open writer");
    g.write_at(dense.len() as u64, Bytes::from_static(b"more")).await.expect("append");
    g.fsync().await.expect("fsync");
    let mut buf = vec![0u8; 10];
    assert_eq!(d.read_into(dense.len() as u64 - 2, &mut buf).await.expect("read_into"), 6, "the length was re-read from meta");
    assert_eq!(&buf[..6], &[dense[dense.len() - 2], dense[dense.len() - 1], b'm', b'o', b'r', b'e']);
    g.close().await.expect("close");

    // A handle not opened for reading.
    let wo = env.fs.open("/dense", OpenFlags { write: true, ..Default::default() }).await.expect("open write-only");
    let err = wo.read_into(0, &mut buf).await.expect_err("write-only handle");
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    wo.close().await.expect("close");
    env.stop().await;
}

/// A temp file written slowly (far longer than meta's temp TTL) keeps its
/// data: the handle renews its lease while GC runs every 50 ms. A temp
/// handle that stops renewing (dropped without publish) is reclaimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_temp_upload_keeps_its_lease_and_an_abandoned_one_is_reclaimed() {
    let ttl_ms = 300;
    let config = FsClientConfig { temp_lease_renew_interval_ms: 50, ..Default::default() };
    let env = Env::start_meta(config, false, STRIPE, 3, |m| {
        m.temp_inode_ttl_ms = ttl_ms;
        m.gc_interval_ms = 50;
    })
    .await;
    let data = pattern(7, 3 * CHUNK as usize + 11);
    let slow = env.fs.create_temp(InodeId::ROOT, 0o600).await.expect("create temp");
    let abandoned = env.fs.create_temp(InodeId::ROOT, 0o600).await.expect("create temp");
    let abandoned_id = abandoned.inode();
    abandoned.write_at(0, Bytes::from(data.clone())).await.expect("write abandoned");
    drop(abandoned);
    // Four TTLs of a slow upload, one piece at a time.
    for (i, piece) in data.chunks(data.len() / 4 + 1).enumerate() {
        tokio::time::sleep(std::time::Duration::from_millis(ttl_ms)).await;
        let off = (i * (data.len() / 4 + 1)) as u64;
        slow.write_at(off, Bytes::from(piece.to_vec())).await.expect("slow write");
    }
    env.fs.publish(&slow, InodeId::ROOT, "slow", None, Default::default()).await.expect("publish after a slow upload");
    let r = env.fs.open("/slow", OpenFlags::read_only()).await.expect("open");
    assert_eq!(r.read_at(0, data.len() as u64).await.expect("read"), data);
    let gone = env.fs.meta().stat(abandoned_id).await.expect_err("the abandoned temp inode is reclaimed");
    assert_eq!(gone.code(), ErrorCode::NotFound);
    assert!(env.chains_with_chunks(abandoned_id).is_empty(), "its chunks are removed");
    env.stop().await;
}
