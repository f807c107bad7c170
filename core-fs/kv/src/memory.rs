//! The in-memory engine: a persistent ordered map (`imbl::OrdMap`) whose
//! snapshots are O(1) clones, behind the shared transaction layer.

use crate::local::{LocalEngine, Mutation, Store, StoreSnapshot};
use crate::{KeyValue, KvEngine, KvResult, Transaction};
use async_trait::async_trait;
use bytes::Bytes;
use imbl::OrdMap;
use parking_lot::RwLock;
use std::ops::Bound;

type Map = OrdMap<Bytes, Bytes>;

pub(crate) struct MemStore {
    map: RwLock<Map>,
}

pub(crate) struct MemSnapshot {
    map: Map,
}

impl StoreSnapshot for MemSnapshot {
    fn get(&self, key: &[u8]) -> KvResult<Option<Bytes>> {
        Ok(self.map.get(key).cloned())
    }

    fn range(&self, begin: &[u8], end: &[u8], limit: usize, reverse: bool) -> KvResult<(Vec<KeyValue>, bool)> {
        if begin >= end {
            return Ok((Vec::new(), false));
        }
        let bounds = (Bound::Included(begin), Bound::Excluded(end));
        let iter = self.map.range::<_, [u8]>(bounds).map(|(k, v)| (k.clone(), v.clone()));
        let mut rows: Vec<KeyValue> =
            if reverse { iter.rev().take(limit.saturating_add(1)).collect() } else { iter.take(limit.saturating_add(1)).collect() };
        let more = rows.len() > limit;
        rows.truncate(limit);
        Ok((rows, more))
    }
}

impl Store for MemStore {
    type Snapshot = MemSnapshot;

    fn snapshot(&self) -> MemSnapshot {
        MemSnapshot { map: self.map.read().clone() }
    }

    fn get_latest(&self, key: &[u8]) -> KvResult<Option<Bytes>> {
        Ok(self.map.read().get(key).cloned())
    }

    fn sync(&self) -> KvResult<()> {
        Ok(())
    }

    fn apply(&self, mutations: &[Mutation], _commit_version: u64, _sync: bool) -> KvResult<()> {
        let mut next = self.map.read().clone();
        for m in mutations {
            match m {
                Mutation::Set(k, v) => {
                    next.insert(k.clone(), v.clone());
                }
                Mutation::Clear(k) => {
                    next.remove(k);
                }
                Mutation::ClearRange(b, e) => {
                    let doomed: Vec<Bytes> =
                        next.range::<_, Bytes>((Bound::Included(b), Bound::Excluded(e))).map(|(k, _)| k.clone()).collect();
                    for k in doomed {
                        next.remove(&k);
                    }
                }
            }
        }
        *self.map.write() = next;
        Ok(())
    }
}

/// An engine that keeps everything in memory; for unit tests.
#[derive(Clone)]
pub struct MemoryEngine {
    engine: LocalEngine<MemStore>,
}

impl MemoryEngine {
    pub fn new() -> Self {
        let store = MemStore { map: RwLock::new(Map::new()) };
        // Starting a thread only fails when the process is out of resources.
        let engine = LocalEngine::start(store, 0, "memory", None).expect("start the in-memory engine's commit thread");
        MemoryEngine { engine }
    }

    /// An in-memory engine for deterministic simulation: no commit thread,
    /// the conflict window on `now_ms` ([`LocalEngine::start_inline`]).
    pub fn deterministic(now_ms: std::sync::Arc<dyn Fn() -> u64 + Send + Sync>) -> Self {
        let store = MemStore { map: RwLock::new(Map::new()) };
        MemoryEngine { engine: LocalEngine::start_inline(store, 0, now_ms) }
    }
}

impl Default for MemoryEngine {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl KvEngine for MemoryEngine {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn begin(&self) -> KvResult<Box<dyn Transaction>> {
        Ok(Box::new(self.engine.begin_local()))
    }
}
