//! Offline consistency check of the whole namespace (tests, `fskv meta`
//! tooling). Reads everything in one snapshot; meant for small trees.
//!
//! Invariants checked:
//! * every entry points to an existing inode of the entry's kind;
//! * a directory's `parent`/`name` match its one entry (root excepted);
//! * a non-directory's nlink equals the number of entries naming it;
//! * following directory parents from any directory reaches the root (acyclic);
//! * every inode is the root, named by an entry, or queued for GC.

use crate::error::MetaResult;
use crate::schema::*;
use fskv_kv::{KvEngine, RangeRequest};
use fskv_types::meta::{Inode, InodeData, InodeKind};
use fskv_types::InodeId;
use std::collections::{BTreeMap, HashMap, HashSet};

#[derive(Debug, Default)]
pub struct FsckReport {
    pub inodes: usize,
    pub entries: usize,
    pub gc_queued: usize,
    pub problems: Vec<String>,
}

pub async fn check(engine: &dyn KvEngine) -> MetaResult<FsckReport> {
    let mut txn = engine.begin().await?;
    let mut inodes: BTreeMap<InodeId, Inode> = BTreeMap::new();
    for (k, v) in txn.snapshot_get_range(&RangeRequest::prefix(PREFIX_INODE)).await?.kvs {
        let inode: Inode = decode(&k, &v)?;
        inodes.insert(id_from_key(&k)?, inode);
    }
    let mut entries: Vec<(InodeId, String, DentryValue)> = Vec::new();
    for (k, v) in txn.snapshot_get_range(&RangeRequest::prefix(PREFIX_DENTRY)).await?.kvs {
        entries.push((id_from_key(&k)?, name_from_key(&k)?, decode(&k, &v)?));
    }
    let mut gc: HashSet<InodeId> = HashSet::new();
    for (k, _) in txn.snapshot_get_range(&RangeRequest::prefix(PREFIX_GC)).await?.kvs {
        gc.insert(id_from_key(&k)?);
    }
    let mut report = FsckReport { inodes: inodes.len(), entries: entries.len(), gc_queued: gc.len(), problems: Vec::new() };
    let p = &mut report.problems;
    let mut links: HashMap<InodeId, u32> = HashMap::new();
    for (parent, name, e) in &entries {
        *links.entry(e.inode).or_default() += 1;
        match inodes.get(parent) {
            Some(pi) if pi.kind() == InodeKind::Directory => {}
            _ => p.push(format!("entry {parent}/{name}: parent is not a directory inode")),
        }
        let Some(inode) = inodes.get(&e.inode) else {
            p.push(format!("entry {parent}/{name} -> {}: no such inode", e.inode));
            continue;
        };
        if inode.kind() != e.kind {
            p.push(format!("entry {parent}/{name}: kind {:?} but inode is {:?}", e.kind, inode.kind()));
        }
        if let InodeData::Directory(d) = &inode.data {
            if d.parent != *parent || d.name != *name {
                p.push(format!("dir {} named {parent}/{name} records {}/{}", e.inode, d.parent, d.name));
            }
        }
    }
    for (id, inode) in &inodes {
        let n = links.get(id).copied().unwrap_or(0);
        match &inode.data {
            InodeData::Directory(_) if *id == InodeId::ROOT => {}
            InodeData::Directory(_) => {
                if n > 1 {
                    p.push(format!("dir {id} has {n} entries"));
                }
                if n == 0 && !gc.contains(id) && inode.nlink > 0 {
                    p.push(format!("dir {id} is an orphan"));
                }
            }
            _ => {
                if inode.nlink != n {
                    p.push(format!("{id}: nlink {} but {n} entries", inode.nlink));
                }
                if n == 0 && !gc.contains(id) {
                    p.push(format!("{id} is an orphan (no entry, not queued for GC)"));
                }
            }
        }
        if let InodeData::Directory(_) = &inode.data {
            if inode.nlink > 0 && !reaches_root(&inodes, *id) {
                p.push(format!("dir {id} does not reach the root (cycle or dangling parent)"));
            }
        }
    }
    Ok(report)
}

fn reaches_root(inodes: &BTreeMap<InodeId, Inode>, start: InodeId) -> bool {
    let mut cur = start;
    for _ in 0..=inodes.len() {
        if cur == InodeId::ROOT {
            return true;
        }
        match inodes.get(&cur).and_then(|i| i.dir()) {
            Some(d) => cur = d.parent,
            None => return false,
        }
    }
    false
}
