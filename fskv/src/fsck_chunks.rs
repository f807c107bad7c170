//! The storage half of `fskv admin fsck`: chunks no file owns.
//!
//! For every chain of the routing info one serving target (the tail,
//! `ChainRoles::tail`: it holds only committed data) is asked for its chunk metadata
//! (`DumpChunkMeta`); the inodes named by the chunk ids are then looked up
//! in meta. A chunk is a problem when
//! * `orphan_chunk`: its inode does not exist, is not a regular file, or
//!   keeps its bytes inline;
//! * `misplaced_chunk`: the file's layout puts that chunk index on another
//!   chain;
//! * `chunk_past_length`: the chunk starts at or beyond the file's length
//!   (a leftover of a failed truncate — or a writer that has not reported
//!   its length yet, so re-run once writers have closed).
//!
//! Files being removed (nlink 0: queued for GC, or an S3 upload not yet
//! published) are skipped: GC removes their chunks.

use fskv_client::meta::MetaClient;
use fskv_proto::meta::{chain_for_chunk, Inode, InodeData};
use fskv_proto::routing::{ChainRoles, RoutingInfo};
use fskv_proto::storage::DumpChunkMeta;
use fskv_proto::storage::DumpChunkMetaReq;
use fskv_rpc::{CallOptions, RpcClient};
use fskv_types::{ChainId, ErrorCode, InodeId};
use futures::StreamExt;
use std::collections::BTreeMap;

/// Distinct inodes the scan holds in memory.
pub const MAX_SCAN_INODES: usize = 1 << 20;
/// Meta lookups in flight.
const STAT_CONCURRENCY: usize = 32;
/// Deadline of one target's dump.
const DUMP_TIMEOUT_MS: u64 = 120_000;

#[derive(Clone, Debug, serde::Serialize)]
pub struct ChunkProblem {
    pub kind: &'static str,
    pub inode: InodeId,
    pub chain: ChainId,
    /// Chunks of this inode on this chain with the problem.
    pub chunks: u64,
    pub detail: String,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct ChunkScan {
    pub chains_scanned: u64,
    pub chunks: u64,
    pub inodes: u64,
    pub problems_total: u64,
    pub problems: Vec<ChunkProblem>,
    /// Chains that could not be scanned, and why.
    pub skipped_chains: Vec<(ChainId, String)>,
}

/// Chunk indexes of one inode on one chain.
type Found = BTreeMap<InodeId, BTreeMap<ChainId, Vec<u64>>>;

pub async fn scan(rpc: &RpcClient, routing: &RoutingInfo, meta: &MetaClient, max_problems: usize) -> anyhow::Result<ChunkScan> {
    let mut out = ChunkScan::default();
    let mut found: Found = BTreeMap::new();
    for chain in &routing.chains {
        let Some(tail) = chain.tail() else {
            out.skipped_chains.push((chain.chain_id, "no serving target".into()));
            continue;
        };
        let Some(node) = routing.nodes.iter().find(|n| n.node_id == tail.node_id) else {
            out.skipped_chains
                .push((chain.chain_id, format!("node {} of target {} is not in the routing info", tail.node_id, tail.target_id)));
            continue;
        };
        let opts = CallOptions { timeout_ms: DUMP_TIMEOUT_MS };
        let dump =
            match rpc.call::<DumpChunkMeta>(&node.address, &DumpChunkMetaReq { target: tail.target_id }, bytes::Bytes::new(), opts).await {
                Ok((resp, _)) => resp,
                Err(e) => {
                    out.skipped_chains.push((chain.chain_id, format!("dump of target {} on {}: {e}", tail.target_id, node.address)));
                    continue;
                }
            };
        out.chains_scanned += 1;
        for (chunk, _) in dump.chunks {
            out.chunks += 1;
            if !found.contains_key(&chunk.inode) && found.len() >= MAX_SCAN_INODES {
                anyhow::bail!("the chunks name more than {MAX_SCAN_INODES} files; the storage check holds at most that many");
            }
            found.entry(chunk.inode).or_default().entry(chain.chain_id).or_default().push(chunk.index);
        }
    }
    out.inodes = found.len() as u64;
    let lookups = futures::stream::iter(found.keys().copied().map(|id| async move { (id, meta.stat(id).await) }))
        .buffer_unordered(STAT_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let mut owners = BTreeMap::new();
    for (id, r) in lookups {
        match r {
            Ok(inode) => {
                owners.insert(id, Some(inode));
            }
            Err(e) if e.code() == ErrorCode::NotFound => {
                owners.insert(id, None);
            }
            Err(e) => anyhow::bail!("meta lookup of {id}: {e}"),
        }
    }
    for (id, chains) in &found {
        let owner = owners.get(id).and_then(|o| o.as_ref());
        for (chain, indexes) in chains {
            for p in judge(*id, owner, *chain, indexes) {
                out.problems_total += 1;
                if out.problems.len() < max_problems {
                    out.problems.push(p);
                }
            }
        }
    }
    Ok(out)
}

/// The problems of the chunks `indexes` of inode `id` found on `chain`.
fn judge(id: InodeId, owner: Option<&Inode>, chain: ChainId, indexes: &[u64]) -> Vec<ChunkProblem> {
    let n = indexes.len() as u64;
    let problem = |kind, chunks, detail: String| ChunkProblem { kind, inode: id, chain, chunks, detail };
    let Some(inode) = owner else {
        return vec![problem("orphan_chunk", n, format!("{n} chunk(s) of {id}, which does not exist"))];
    };
    if inode.nlink == 0 {
        return Vec::new(); // being removed: GC takes its chunks
    }
    let InodeData::File(f) = &inode.data else {
        return vec![problem("orphan_chunk", n, format!("{n} chunk(s) of {id}, which is a {:?}, not a file", inode.kind()))];
    };
    if f.inline.is_some() {
        return vec![problem("orphan_chunk", n, format!("{n} chunk(s) of {id}, whose bytes are inline in its inode"))];
    }
    let chunk_bytes = u64::from(f.layout.chunk_size_bytes.max(1));
    let misplaced: Vec<u64> = indexes.iter().copied().filter(|i| chain_for_chunk(&f.layout, *i) != Some(chain)).collect();
    let past: Vec<u64> = indexes.iter().copied().filter(|i| i.saturating_mul(chunk_bytes) >= f.length).collect();
    let mut out = Vec::new();
    if let Some(first) = misplaced.first() {
        let detail =
            format!("{} chunk(s) of {id} (first index {first}) on {chain}, which its layout does not use for them", misplaced.len());
        out.push(problem("misplaced_chunk", misplaced.len() as u64, detail));
    }
    if let Some(first) = past.first() {
        let detail = format!(
            "{} chunk(s) of {id} (first index {first}) at or past its length {} (a writer may not have reported it yet)",
            past.len(),
            f.length
        );
        out.push(problem("chunk_past_length", past.len() as u64, detail));
    }
    out
}

pub fn render(s: &ChunkScan) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "storage: {} chunk(s) of {} file(s) on {} chain(s), problems {}",
        s.chunks, s.inodes, s.chains_scanned, s.problems_total
    );
    for (chain, why) in &s.skipped_chains {
        let _ = writeln!(out, "  not scanned: {chain}: {why}");
    }
    for p in &s.problems {
        let _ = writeln!(out, "  {:<24} {:<14} {}", p.kind, p.inode.to_string(), p.detail);
    }
    if (s.problems.len() as u64) < s.problems_total {
        let _ = writeln!(out, "  … {} more not listed (--max-problems)", s.problems_total - s.problems.len() as u64);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_proto::meta::{Acl, FileData, FileLayout};

    fn file(length: u64, chains: Vec<ChainId>, inline: bool) -> Inode {
        let layout = FileLayout { table_id: 1, table_version: 1, chunk_size_bytes: 100, chains, seed: 0 };
        Inode {
            id: InodeId(7),
            data: InodeData::File(FileData { length, truncate_version: 0, layout, dyn_stripe: 1, inline: inline.then(Vec::new) }),
            acl: Acl { uid: 0, gid: 0, mode: 0o644 },
            nlink: 1,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            version: 1,
        }
    }

    #[test]
    fn chunks_are_judged_against_the_owning_file() {
        let c = ChainId(3);
        let f = file(250, vec![c], false);
        assert!(judge(InodeId(7), Some(&f), c, &[0, 1, 2]).is_empty(), "chunks 0..=2 hold bytes 0..250");
        let past = judge(InodeId(7), Some(&f), c, &[0, 3, 4]);
        assert_eq!(past.len(), 1);
        assert_eq!((past[0].kind, past[0].chunks), ("chunk_past_length", 2));
        let elsewhere = judge(InodeId(7), Some(&f), ChainId(9), &[1]);
        assert_eq!(elsewhere[0].kind, "misplaced_chunk");
        assert_eq!(judge(InodeId(7), None, c, &[0])[0].kind, "orphan_chunk");
        assert_eq!(judge(InodeId(7), Some(&file(0, vec![c], true)), c, &[0])[0].kind, "orphan_chunk");
        let mut gone = f.clone();
        gone.nlink = 0;
        assert!(judge(InodeId(7), Some(&gone), c, &[5]).is_empty(), "GC owns the chunks of a removed file");
    }
}
