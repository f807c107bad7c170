//! The recovery planner (pure, no I/O): compares the predecessor's chunk
//! metadata with the syncing target's dump and decides per chunk.
//!
//! | # | condition | action |
//! |---|-----------|--------|
//! | 1 | chunk only on the local (predecessor) side | send |
//! | 2 | chunk only on the remote (syncing) side | delete |
//! | 3 | local chain version newer than remote's | send |
//! | 3b | remote chain version newer than local's | send |
//! | 4 | same chain version, local committed ≠ remote pending (update) version | send |
//! | 4b | same chain version, local committed = remote pending, remote still holds that version only as pending | send |
//! | 4c | same chain version and committed version, nothing pending remotely, committed length or CRC differ | send |
//! | 5 | otherwise | skip |
//!
//! Rule 4b is ours (3FS skips there): a syncing target applies the writes
//! it receives as full-chunk-replace, so a pending version it holds is a
//! leftover of a write interrupted before it joined (e.g. it was the head
//! when it was cut off, the successors committed and the ack never came
//! back). Nothing would ever commit it; skipping left it committed at the
//! old version, and when it later synced its own successor it sent that
//! older version, so replicas diverged (simulation seed 6).
//!
//! Rule 3b is ours too (3FS skips there): the remote wrote the chunk under a
//! chain version its predecessor never wrote it under, so it holds a branch
//! the chain dropped. Simulation seed 232 (5 ms ticks): the tail committed
//! a write whose ack was lost, then lost power; the head kept the write
//! pending, synced a rejoining target without it, and when the old tail
//! came back behind that target its newer version was skipped, so the
//! replicas differed for good. A syncing target's data is never the
//! authority: after a sync it must equal its predecessor.
//!
//! Rule 4c is ours (3FS compares versions only): one version number must
//! never name two contents, but if it ever does, skipping would leave the
//! replicas different for good. Simulation seed 3103 (5 ms ticks) gave a
//! version number other bytes at the head (fixed in `craq.rs`: a left-over
//! is never replaced while its fate is unknown); this rule is the second
//! line, so a sync always leaves the syncing target equal to its
//! predecessor.
//!
//! Before deciding, the predecessor completes a left-over pending version
//! of the chunk as a write would (`service/sync_worker.rs`): it is the
//! serving tail, so it sends the pending content to the syncing target and
//! then commits it, since a former tail may have committed it (seeds 7646,
//! 3221); committing without sending let the syncing target turn serving
//! without it (seed 403).
//!
//! "Local" counts only committed data (a local chunk with committed version
//! 0 holds nothing a reader may see, so it counts as absent). The remote's
//! "pending" version is its pending version if it has one, else its committed
//! one (3FS's update version).
//!
//! The plan is made from a dump taken before the transfers, while writes go
//! on; the shell re-checks each chunk under its lock (a chunk planned for
//! delete that now exists locally is sent instead), so a stale plan never
//! deletes live data.

use fskv_chunk_engine::ChunkMeta;
use fskv_proto::storage::RemoteChunkMeta;
use fskv_types::ChunkId;
use std::collections::BTreeMap;

/// Why a chunk is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendReason {
    /// Rule 1.
    LocalOnly,
    /// Rule 3.
    NewerChainVersion,
    /// Rule 3b.
    RemoteNewerChainVersion,
    /// Rule 4.
    CommittedNeRemotePending,
    /// Rule 4b.
    RemotePendingLeftOver,
    /// Rule 4c.
    ContentDiffers,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncAction {
    Send(ChunkId, SendReason),
    /// Rule 2.
    Delete(ChunkId),
    /// Rule 5.
    Skip(ChunkId),
}

impl SyncAction {
    pub fn chunk(&self) -> ChunkId {
        match self {
            SyncAction::Send(c, _) | SyncAction::Delete(c) | SyncAction::Skip(c) => *c,
        }
    }
}

/// The local facts the planner uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalChunk {
    pub chain_ver: u32,
    pub committed_ver: u64,
    /// Length and CRC32C of the committed version (rule 4c).
    pub len_bytes: u32,
    pub crc: u32,
}

impl From<&ChunkMeta> for LocalChunk {
    fn from(m: &ChunkMeta) -> Self {
        LocalChunk { chain_ver: m.chain_ver, committed_ver: m.committed_ver, len_bytes: m.committed.len_bytes, crc: m.committed.crc }
    }
}

/// The metadata of a local chunk as sent to a peer.
pub fn remote_meta(m: &ChunkMeta) -> RemoteChunkMeta {
    RemoteChunkMeta {
        chain_ver: m.chain_ver,
        committed_ver: m.committed_ver,
        pending_ver: m.pending_ver(),
        len_bytes: m.committed.len_bytes,
        crc: m.committed.crc,
    }
}

/// Decides one chunk by the rules of the module doc's table.
pub fn decide(chunk: ChunkId, local: Option<LocalChunk>, remote: Option<&RemoteChunkMeta>) -> Option<SyncAction> {
    let local = local.filter(|l| l.committed_ver > 0);
    Some(match (local, remote) {
        (None, None) => return None,
        (Some(_), None) => SyncAction::Send(chunk, SendReason::LocalOnly),
        (None, Some(_)) => SyncAction::Delete(chunk),
        (Some(l), Some(r)) if l.chain_ver > r.chain_ver => SyncAction::Send(chunk, SendReason::NewerChainVersion),
        (Some(l), Some(r)) if l.chain_ver < r.chain_ver => SyncAction::Send(chunk, SendReason::RemoteNewerChainVersion),
        (Some(l), Some(r)) if l.chain_ver == r.chain_ver && l.committed_ver != r.update_ver() => {
            SyncAction::Send(chunk, SendReason::CommittedNeRemotePending)
        }
        (Some(l), Some(r)) if l.chain_ver == r.chain_ver && r.pending_ver.is_some() => {
            SyncAction::Send(chunk, SendReason::RemotePendingLeftOver)
        }
        (Some(l), Some(r)) if (l.len_bytes, l.crc) != (r.len_bytes, r.crc) => SyncAction::Send(chunk, SendReason::ContentDiffers),
        (Some(_), Some(_)) => SyncAction::Skip(chunk),
    })
}

/// Plans a sync: one action per chunk present on either side, in chunk order.
pub fn plan_sync(local: &[(ChunkId, ChunkMeta)], remote: &[(ChunkId, RemoteChunkMeta)]) -> Vec<SyncAction> {
    let mut all: BTreeMap<ChunkId, (Option<LocalChunk>, Option<&RemoteChunkMeta>)> = BTreeMap::new();
    for (id, m) in local {
        all.entry(*id).or_default().0 = Some(LocalChunk::from(m));
    }
    for (id, m) in remote {
        all.entry(*id).or_default().1 = Some(m);
    }
    all.into_iter().filter_map(|(id, (l, r))| decide(id, l, r)).collect()
}

/// Counts of a plan's actions (for logs and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PlanSummary {
    pub send: u64,
    pub delete: u64,
    pub skip: u64,
}

pub fn summarize(plan: &[SyncAction]) -> PlanSummary {
    let mut s = PlanSummary::default();
    for a in plan {
        match a {
            SyncAction::Send(..) => s.send += 1,
            SyncAction::Delete(_) => s.delete += 1,
            SyncAction::Skip(_) => s.skip += 1,
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_chunk_engine::VersionData;
    use fskv_types::InodeId;

    fn id(i: u64) -> ChunkId {
        ChunkId::new(InodeId(9), i)
    }

    fn local(chain_ver: u32, committed_ver: u64) -> ChunkMeta {
        ChunkMeta { chain_ver, committed_ver, committed: VersionData::default(), pending: None, recent: Vec::new() }
    }

    fn remote(chain_ver: u32, committed_ver: u64, pending_ver: Option<u64>) -> RemoteChunkMeta {
        RemoteChunkMeta { chain_ver, committed_ver, pending_ver, len_bytes: 0, crc: 0 }
    }

    #[test]
    fn rule_1_local_only_is_sent() {
        assert_eq!(plan_sync(&[(id(1), local(3, 2))], &[]), vec![SyncAction::Send(id(1), SendReason::LocalOnly)]);
    }

    #[test]
    fn rule_2_remote_only_is_deleted() {
        assert_eq!(plan_sync(&[], &[(id(1), remote(3, 2, None))]), vec![SyncAction::Delete(id(1))]);
        // A local chunk never committed counts as absent.
        assert_eq!(plan_sync(&[(id(1), local(3, 0))], &[(id(1), remote(3, 2, None))]), vec![SyncAction::Delete(id(1))]);
        assert_eq!(plan_sync(&[(id(2), local(3, 0))], &[]), vec![]);
    }

    #[test]
    fn rule_3_newer_local_chain_version_is_sent() {
        assert_eq!(
            plan_sync(&[(id(1), local(4, 2))], &[(id(1), remote(3, 2, None))]),
            vec![SyncAction::Send(id(1), SendReason::NewerChainVersion)]
        );
    }

    #[test]
    fn rule_4_committed_differs_from_remote_pending_is_sent() {
        // Remote has v2 committed and v3 pending; local committed v2 (the v3 write failed) → send.
        assert_eq!(
            plan_sync(&[(id(1), local(3, 2))], &[(id(1), remote(3, 2, Some(3)))]),
            vec![SyncAction::Send(id(1), SendReason::CommittedNeRemotePending)]
        );
        // Remote is behind.
        assert_eq!(
            plan_sync(&[(id(1), local(3, 5))], &[(id(1), remote(3, 4, None))]),
            vec![SyncAction::Send(id(1), SendReason::CommittedNeRemotePending)]
        );
    }

    #[test]
    fn rule_4b_a_left_over_remote_pending_equal_to_local_committed_is_sent() {
        // Remote holds v3 only as pending (an interrupted write); local committed v3.
        assert_eq!(
            plan_sync(&[(id(1), local(3, 3))], &[(id(1), remote(3, 2, Some(3)))]),
            vec![SyncAction::Send(id(1), SendReason::RemotePendingLeftOver)]
        );
    }

    #[test]
    fn rule_4c_same_version_other_bytes_is_sent() {
        // Seed 3103's shape: both committed v31, written by different requests.
        let mut l = local(3, 31);
        l.committed.len_bytes = 16384;
        l.committed.crc = 0x1111;
        let r = RemoteChunkMeta { len_bytes: 16384, crc: 0x2222, ..remote(3, 31, None) };
        assert_eq!(plan_sync(&[(id(1), l.clone())], &[(id(1), r)]), vec![SyncAction::Send(id(1), SendReason::ContentDiffers)]);
        let r = RemoteChunkMeta { len_bytes: 8192, crc: 0x1111, ..remote(3, 31, None) };
        assert_eq!(plan_sync(&[(id(1), l.clone())], &[(id(1), r)]), vec![SyncAction::Send(id(1), SendReason::ContentDiffers)]);
        // The same bytes: skipped.
        let r = RemoteChunkMeta { len_bytes: 16384, crc: 0x1111, ..remote(3, 31, None) };
        assert_eq!(plan_sync(&[(id(1), l)], &[(id(1), r)]), vec![SyncAction::Skip(id(1))]);
    }

    #[test]
    fn rule_5_otherwise_skip() {
        // Equal versions.
        assert_eq!(plan_sync(&[(id(1), local(3, 2))], &[(id(1), remote(3, 2, None))]), vec![SyncAction::Skip(id(1))]);
    }

    #[test]
    fn rule_3b_newer_remote_chain_version_is_sent() {
        // Seed 232's shape: the remote committed v15 under chain version 2,
        // the predecessor has only v14 from chain version 1.
        assert_eq!(
            plan_sync(&[(id(1), local(1, 14))], &[(id(1), remote(2, 15, None))]),
            vec![SyncAction::Send(id(1), SendReason::RemoteNewerChainVersion)]
        );
        // Even with a lower committed version there (a dropped branch is
        // replaced, never kept).
        assert_eq!(
            plan_sync(&[(id(1), local(3, 2))], &[(id(1), remote(4, 1, None))]),
            vec![SyncAction::Send(id(1), SendReason::RemoteNewerChainVersion)]
        );
    }

    #[test]
    fn plan_covers_the_union_in_chunk_order() {
        let l = vec![(id(1), local(3, 1)), (id(3), local(3, 1)), (id(4), local(5, 1))];
        let r = vec![(id(2), remote(3, 1, None)), (id(3), remote(3, 1, None)), (id(4), remote(3, 1, None))];
        let plan = plan_sync(&l, &r);
        assert_eq!(plan.iter().map(|a| a.chunk()).collect::<Vec<_>>(), vec![id(1), id(2), id(3), id(4)]);
        assert_eq!(summarize(&plan), PlanSummary { send: 2, delete: 1, skip: 1 });
    }
}
