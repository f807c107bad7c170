//! Consistency check of the whole namespace: the `meta.Fsck` admin RPC
//! (`fskv admin fsck`) and the tests (the property test runs it after every
//! step).
//!
//! Invariants checked:
//! * every entry's parent is a directory inode;
//! * every entry points to an existing inode of the entry's kind;
//! * a directory's `parent`/`name` match its one entry (root excepted);
//! * a non-directory's nlink equals the number of entries naming it;
//! * following directory parents from any live directory reaches the root (acyclic);
//! * every inode is the root, named by an entry, or queued for GC;
//! * every `INOD`/`DENT`/`GCQU` key and value decodes.
//!
//! Bounds: the KV is read in range reads of at most `page_keys` keys, all in
//! one read transaction (snapshot reads, no conflicts, nothing written); if
//! the engine declares the transaction too old (FoundationDB: after 5 s) the
//! scan continues in a new one and the reply says how many were used (then
//! changes made during the scan can show up as problems: re-run to confirm).
//! Memory: a small summary per inode (kind, nlink, a directory's parent and
//! name) and a link count per named inode; a namespace of more than
//! `max_inodes` inodes is refused (`ResourceExhausted`). The reply lists at
//! most `max_problems` problems and counts all of them.

use crate::error::{MetaError, MetaResult};
use crate::schema::*;
use bytes::Bytes;
use fskv_kv::{key_after, KeyValue, KvEngine, KvError, RangeRequest, Transaction};
use fskv_proto::meta::{FsckProblem, FsckProblemKind, FsckReply, Inode, InodeKind, DEFAULT_FSCK_PROBLEMS, MAX_FSCK_INODES};
use fskv_types::InodeId;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// Default keys per range read.
pub const DEFAULT_PAGE_KEYS: usize = 1024;
/// Most keys per range read (values are ≤ 100 kB, so a page stays ≤ ~1.6 GB
/// only in the absurd worst case; inodes and entries are ~100 bytes).
pub const MAX_PAGE_KEYS: usize = 16_384;
/// A progress line in the log every this many keys.
const PROGRESS_EVERY_KEYS: u64 = 100_000;

/// Bounds of one check.
#[derive(Clone, Debug)]
pub struct FsckOptions {
    /// Problems listed (all are counted).
    pub max_problems: usize,
    /// Keys per range read (clamped to 1..=[`MAX_PAGE_KEYS`]).
    pub page_keys: usize,
    /// Most inodes held in memory; more → `ResourceExhausted`.
    pub max_inodes: u64,
}

impl Default for FsckOptions {
    fn default() -> Self {
        FsckOptions { max_problems: DEFAULT_FSCK_PROBLEMS as usize, page_keys: DEFAULT_PAGE_KEYS, max_inodes: MAX_FSCK_INODES }
    }
}

/// The result of [`check`] (tests): counts and every problem as text.
#[derive(Debug, Default)]
pub struct FsckReport {
    pub inodes: usize,
    pub entries: usize,
    pub gc_queued: usize,
    pub problems: Vec<String>,
}

/// Checks everything, listing every problem (tests and small trees).
pub async fn check(engine: &dyn KvEngine) -> MetaResult<FsckReport> {
    let opts = FsckOptions { max_problems: usize::MAX, ..Default::default() };
    let r = run(engine, &opts).await?;
    Ok(FsckReport {
        inodes: r.inodes as usize,
        entries: r.entries as usize,
        gc_queued: r.gc_queued as usize,
        problems: r.problems.iter().map(|p| format!("{:?} {}: {}", p.kind, p.inode, p.detail)).collect(),
    })
}

/// What fsck keeps of an inode.
struct Node {
    kind: InodeKind,
    nlink: u32,
    /// A directory's recorded parent and name.
    dir: Option<(InodeId, String)>,
}

struct Problems {
    max: usize,
    total: u64,
    list: Vec<FsckProblem>,
}

impl Problems {
    fn push(&mut self, kind: FsckProblemKind, inode: InodeId, detail: String) {
        self.total += 1;
        if self.list.len() < self.max {
            self.list.push(FsckProblem { kind, inode, detail });
        }
    }
}

/// Paged snapshot reads over one prefix, renewing the transaction if it grows too old.
struct Scanner<'a> {
    engine: &'a dyn KvEngine,
    txn: Box<dyn Transaction>,
    transactions: u32,
    page_keys: usize,
    keys_read: u64,
    started: Instant,
}

impl<'a> Scanner<'a> {
    async fn new(engine: &'a dyn KvEngine, page_keys: usize) -> MetaResult<Self> {
        let txn = engine.begin().await?;
        Ok(Scanner { engine, txn, transactions: 1, page_keys: page_keys.clamp(1, MAX_PAGE_KEYS), keys_read: 0, started: Instant::now() })
    }

    /// Calls `f` on every key and value under `prefix`, a page at a time.
    async fn for_each(&mut self, prefix: &[u8], mut f: impl FnMut(Bytes, Bytes) -> MetaResult<()>) -> MetaResult<()> {
        let (mut begin, end) = prefix_bounds(prefix);
        loop {
            let page = self.page(&mut begin, &end).await?;
            if page.is_empty() {
                return Ok(());
            }
            for (k, v) in page {
                f(k, v)?;
            }
        }
    }

    /// The next page of `[*begin, end)`; advances `begin`; empty at the end.
    async fn page(&mut self, begin: &mut Vec<u8>, end: &[u8]) -> MetaResult<Vec<KeyValue>> {
        if begin.as_slice() >= end {
            return Ok(Vec::new());
        }
        let req = RangeRequest::new(begin.clone(), end.to_vec()).limit(self.page_keys);
        let res = match self.txn.snapshot_get_range(&req).await {
            Err(KvError::TransactionTooOld) => {
                self.txn = self.engine.begin().await?;
                self.transactions = self.transactions.saturating_add(1);
                tracing::info!(transactions = self.transactions, "fsck: read transaction too old; continuing in a new one");
                self.txn.snapshot_get_range(&req).await?
            }
            r => r?,
        };
        match (res.more, res.kvs.last()) {
            (true, Some((k, _))) => *begin = key_after(k).to_vec(),
            _ => *begin = end.to_vec(),
        }
        let before = self.keys_read / PROGRESS_EVERY_KEYS;
        self.keys_read += res.kvs.len() as u64;
        if self.keys_read / PROGRESS_EVERY_KEYS > before {
            tracing::info!(keys = self.keys_read, elapsed_ms = self.started.elapsed().as_millis() as u64, "fsck: scanning");
        }
        Ok(res.kvs)
    }
}

fn prefix_bounds(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let r = RangeRequest::prefix(prefix);
    (r.begin.to_vec(), r.end.to_vec())
}

/// Runs the check with `opts`' bounds.
pub async fn run(engine: &dyn KvEngine, opts: &FsckOptions) -> MetaResult<FsckReply> {
    let started = Instant::now();
    let mut scan = Scanner::new(engine, opts.page_keys).await?;
    let mut p = Problems { max: opts.max_problems, total: 0, list: Vec::new() };

    // 1. Inodes.
    let mut nodes: HashMap<InodeId, Node> = HashMap::new();
    let mut undecodable: HashSet<InodeId> = HashSet::new();
    scan.for_each(PREFIX_INODE, |k, v| {
        let id = match id_from_key(&k) {
            Ok(id) => id,
            Err(e) => {
                p.push(FsckProblemKind::Undecodable, InodeId(0), e.to_string());
                return Ok(());
            }
        };
        let inode: Inode = match decode(&k, &v) {
            Ok(i) => i,
            Err(e) => {
                undecodable.insert(id);
                p.push(FsckProblemKind::Undecodable, id, e.to_string());
                return Ok(());
            }
        };
        if nodes.len() as u64 >= opts.max_inodes {
            return Err(MetaError::TooLarge(format!("fsck holds at most {} inodes in memory; the namespace has more", opts.max_inodes)));
        }
        let dir = inode.dir().map(|d| (d.parent, d.name.clone()));
        nodes.insert(id, Node { kind: inode.kind(), nlink: inode.nlink, dir });
        Ok(())
    })
    .await?;

    // 2. GC queue.
    let mut gc: HashSet<InodeId> = HashSet::new();
    scan.for_each(PREFIX_GC, |k, _| {
        match id_from_key(&k) {
            Ok(id) => {
                if gc.len() as u64 >= opts.max_inodes {
                    return Err(MetaError::TooLarge(format!("fsck holds at most {} GC entries in memory", opts.max_inodes)));
                }
                gc.insert(id);
            }
            Err(e) => p.push(FsckProblemKind::Undecodable, InodeId(0), e.to_string()),
        }
        Ok(())
    })
    .await?;

    // 3. Entries, streamed: checked against the inodes, links counted.
    let mut entries: u64 = 0;
    let mut links: HashMap<InodeId, u32> = HashMap::new();
    let mut subdirs: HashMap<InodeId, i64> = HashMap::new();
    scan.for_each(PREFIX_DENTRY, |k, v| {
        entries += 1;
        let (parent, name, e) = match (id_from_key(&k), name_from_key(&k)) {
            (Ok(parent), Ok(name)) => match decode::<DentryValue>(&k, &v) {
                Ok(e) => (parent, name, e),
                Err(err) => {
                    p.push(FsckProblemKind::Undecodable, parent, err.to_string());
                    return Ok(());
                }
            },
            (Err(err), _) | (_, Err(err)) => {
                p.push(FsckProblemKind::Undecodable, InodeId(0), err.to_string());
                return Ok(());
            }
        };
        let count = links.entry(e.inode).or_default();
        *count = count.saturating_add(1);
        if e.kind == InodeKind::Directory {
            *subdirs.entry(parent).or_default() += 1;
        }
        match nodes.get(&parent) {
            Some(pn) if pn.kind == InodeKind::Directory => {}
            _ if undecodable.contains(&parent) => {}
            _ => p.push(FsckProblemKind::ParentNotDirectory, parent, format!("entry {parent}/{name}: parent is not a directory inode")),
        }
        let Some(node) = nodes.get(&e.inode) else {
            if !undecodable.contains(&e.inode) {
                p.push(FsckProblemKind::DanglingEntry, parent, format!("entry {parent}/{name} -> {}: no such inode", e.inode));
            }
            return Ok(());
        };
        if node.kind != e.kind {
            p.push(
                FsckProblemKind::KindMismatch,
                e.inode,
                format!("entry {parent}/{name}: kind {:?} but inode is {:?}", e.kind, node.kind),
            );
        }
        if let Some((dp, dn)) = &node.dir {
            if *dp != parent || *dn != name {
                p.push(FsckProblemKind::DirectoryNameMismatch, e.inode, format!("dir {} named {parent}/{name} records {dp}/{dn}", e.inode));
            }
        }
        Ok(())
    })
    .await?;

    // 3b. Subdirectory counters (directory nlink) against the entries.
    let mut counted: HashMap<InodeId, i64> = HashMap::new();
    scan.for_each(PREFIX_DIR_SUBDIRS, |k, v| {
        match (id_from_key(&k), decode_i64(&k, &v)) {
            (Ok(id), Ok(n)) => {
                if counted.len() as u64 >= opts.max_inodes {
                    return Err(MetaError::TooLarge(format!("fsck holds at most {} counters in memory", opts.max_inodes)));
                }
                counted.insert(id, n);
            }
            (Err(e), _) | (_, Err(e)) => p.push(FsckProblemKind::Undecodable, InodeId(0), e.to_string()),
        }
        Ok(())
    })
    .await?;
    let mut dirs: Vec<(InodeId, &Node)> =
        nodes.iter().filter(|(_, n)| n.kind == InodeKind::Directory && n.nlink > 0).map(|(id, n)| (*id, n)).collect();
    dirs.sort_unstable_by_key(|(id, _)| *id);
    for (id, _) in dirs {
        let (stored, real) = (counted.get(&id).copied().unwrap_or(0), subdirs.get(&id).copied().unwrap_or(0));
        if stored != real {
            p.push(FsckProblemKind::SubdirCountMismatch, id, format!("dir {id}: subdirectory counter {stored} but {real} subdirectories"));
        }
    }

    // 4. Per inode: links, orphans, reachability.
    let mut reach = Reach::default();
    let mut ids: Vec<InodeId> = nodes.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let Some(node) = nodes.get(&id) else { continue };
        let n = links.get(&id).copied().unwrap_or(0);
        match node.kind {
            InodeKind::Directory if id == InodeId::ROOT => {}
            InodeKind::Directory => {
                if n > 1 {
                    p.push(FsckProblemKind::DirectoryMultiplyNamed, id, format!("dir {id} has {n} entries"));
                }
                if n == 0 && !gc.contains(&id) && node.nlink > 0 {
                    p.push(FsckProblemKind::Orphan, id, format!("dir {id} is an orphan (no entry, not queued for GC)"));
                }
            }
            _ => {
                if node.nlink != n {
                    p.push(FsckProblemKind::NlinkMismatch, id, format!("{id}: nlink {} but {n} entries", node.nlink));
                }
                if n == 0 && !gc.contains(&id) {
                    p.push(FsckProblemKind::Orphan, id, format!("{id} is an orphan (no entry, not queued for GC)"));
                }
            }
        }
        if node.kind == InodeKind::Directory && node.nlink > 0 && !reach.reaches_root(&nodes, id) {
            p.push(FsckProblemKind::Unreachable, id, format!("dir {id} does not reach the root (cycle or dangling parent)"));
        }
    }

    Ok(FsckReply {
        inodes: nodes.len() as u64 + undecodable.len() as u64,
        entries,
        gc_queued: gc.len() as u64,
        problems_total: p.total,
        problems: p.list,
        transactions: scan.transactions,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// Memo of directories known to reach the root or not, so the walk over all
/// directories is linear, not quadratic, in the tree size.
#[derive(Default)]
struct Reach {
    good: HashSet<InodeId>,
    bad: HashSet<InodeId>,
}

impl Reach {
    fn reaches_root(&mut self, nodes: &HashMap<InodeId, Node>, start: InodeId) -> bool {
        let mut path = Vec::new();
        let mut cur = start;
        let mut ok = false;
        // A parent chain longer than the number of inodes has a cycle.
        for _ in 0..=nodes.len() {
            if cur == InodeId::ROOT || self.good.contains(&cur) {
                ok = true;
                break;
            }
            if self.bad.contains(&cur) {
                break;
            }
            path.push(cur);
            match nodes.get(&cur).and_then(|n| n.dir.as_ref()) {
                Some((parent, _)) => cur = *parent,
                None => break,
            }
        }
        if ok {
            self.good.extend(path);
        } else {
            self.bad.extend(path);
        }
        ok
    }
}
