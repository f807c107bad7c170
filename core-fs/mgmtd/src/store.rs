//! mgmtd's state in the KV engine. Every key starts with `mgmtd/`:
//!
//! | key | value (JSON) | written |
//! |---|---|---|
//! | `mgmtd/layout` | [`Layout`] | once, at bootstrap |
//! | `mgmtd/lease` | [`LeaseRecord`] (holder, address, wall-clock expiry ms for display, renewal count) | by the lease loop every lease/3 |
//! | `mgmtd/routing_version` | `u64` | with every routing change |
//! | `mgmtd/chain/<chain id, 10 digits>` | [`ChainView`] (version, order, public states) | when the chain changes |
//! | `mgmtd/node/<node id, 10 digits>` | [`NodeRecordKv`] (address, generation) | when a node's address or generation changes |
//! | `mgmtd/meta/<node id, 10 digits>` | [`NodeRecordKv`] of a meta server | when a meta server's address or generation changes |
//!
//! Local states are not stored (docs/mgmtd.md, "Target states": they live in memory and come back
//! with the next heartbeats). Every write of a primary checks, in the same
//! transaction, that the lease is still its own, so a deposed primary cannot
//! overwrite its successor's state.

use crate::error::{MgmtdError, Result};
use crate::layout::Layout;
use crate::state::ChainView;
use bytes::Bytes;
use fskv_kv::{run_transaction, KvEngine, KvError, RangeRequest, RetryOptions, Transaction};
use fskv_types::{ChainId, NodeId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const KEY_LAYOUT: &[u8] = b"mgmtd/layout";
pub const KEY_LEASE: &[u8] = b"mgmtd/lease";
pub const KEY_ROUTING_VERSION: &[u8] = b"mgmtd/routing_version";
pub const PREFIX_CHAIN: &[u8] = b"mgmtd/chain/";
pub const PREFIX_NODE: &[u8] = b"mgmtd/node/";
pub const PREFIX_META: &[u8] = b"mgmtd/meta/";

fn chain_key(id: ChainId) -> Vec<u8> {
    format!("mgmtd/chain/{:010}", id.0).into_bytes()
}

fn node_key(id: NodeId) -> Vec<u8> {
    format!("mgmtd/node/{:010}", id.0).into_bytes()
}

fn meta_key(id: NodeId) -> Vec<u8> {
    format!("mgmtd/meta/{:010}", id.0).into_bytes()
}

/// The primary lease. Nothing compares `expires_ms` across processes any
/// more (it is the holder's wall clock, shown by status): a standby takes
/// the lease over only after it has seen one record, unchanged, for a whole
/// lease of its own monotonic time, and every renewal changes the record
/// (`renewal` counts up). See `service.rs`, "Lease".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub holder: String,
    pub address: String,
    pub expires_ms: u64,
    /// Writes of the record so far (absent in records of older versions: 0).
    #[serde(default)]
    pub renewal: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecordKv {
    pub address: String,
    pub generation: u64,
}

/// Everything a new primary loads.
#[derive(Clone, Debug)]
pub struct Persisted {
    pub layout: Layout,
    pub routing_version: u64,
    pub chains: BTreeMap<ChainId, ChainView>,
    pub nodes: BTreeMap<NodeId, NodeRecordKv>,
    pub meta_servers: BTreeMap<NodeId, NodeRecordKv>,
}

/// A batch of changes a primary writes in one transaction.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub routing_version: Option<u64>,
    pub chains: Vec<(ChainId, ChainView)>,
    pub nodes: Vec<(NodeId, NodeRecordKv)>,
    pub meta_servers: Vec<(NodeId, NodeRecordKv)>,
}

fn encode<T: Serialize>(v: &T) -> std::result::Result<Vec<u8>, KvError> {
    serde_json::to_vec(v).map_err(|e| KvError::Storage(format!("encode: {e}")))
}

fn decode<T: for<'de> Deserialize<'de>>(key: &[u8], raw: &[u8]) -> Result<T> {
    serde_json::from_slice(raw).map_err(|e| MgmtdError::Corrupt { key: String::from_utf8_lossy(key).into_owned(), detail: e.to_string() })
}

fn decode_lease(raw: Option<Bytes>) -> std::result::Result<Option<LeaseRecord>, KvError> {
    match raw {
        None => Ok(None),
        Some(raw) => serde_json::from_slice(&raw).map(Some).map_err(|e| KvError::Storage(format!("corrupt lease record: {e}"))),
    }
}

/// Whether `me` is the lease holder, read inside the caller's transaction:
/// a standby that took the lease over has changed the holder, so a deposed
/// primary's write conflicts and fails. (Whether `me`'s lease still runs is
/// its own monotonic-clock check, before it writes.)
async fn check_lease(txn: &mut dyn Transaction, me: &str) -> std::result::Result<bool, KvError> {
    let lease = decode_lease(txn.get(KEY_LEASE).await?)?;
    Ok(lease.is_some_and(|l| l.holder == me))
}

fn retry() -> RetryOptions {
    RetryOptions { max_attempts: 10, ..RetryOptions::default() }
}

/// Takes or renews the lease for `me` if there is none, if it is already
/// ours, or if it is still exactly `stale`: the record the caller has seen
/// unchanged for a whole lease (its holder stopped renewing). Returns the
/// lease record in force after the transaction. `now_ms` (wall clock) only
/// fills the record's displayed expiry.
pub async fn acquire_lease(
    engine: &dyn KvEngine,
    me: &str,
    address: &str,
    now_ms: u64,
    lease_ms: u64,
    stale: Option<&LeaseRecord>,
) -> Result<LeaseRecord> {
    let me = me.to_string();
    let address = address.to_string();
    let stale = stale.cloned();
    let out = run_transaction(engine, &retry(), |txn| {
        let (me, address, stale) = (me.clone(), address.clone(), stale.clone());
        Box::pin(async move {
            let current = decode_lease(txn.get(KEY_LEASE).await?)?;
            match current {
                Some(l) if l.holder != me && stale.as_ref() != Some(&l) => Ok(l),
                previous => {
                    let renewal = previous.map_or(0, |l| l.renewal.wrapping_add(1));
                    let next = LeaseRecord { holder: me, address, expires_ms: now_ms.saturating_add(lease_ms), renewal };
                    txn.set(KEY_LEASE, &encode(&next)?)?;
                    Ok(next)
                }
            }
        })
    })
    .await?;
    Ok(out)
}

/// The lease record, if any (for status and `NotPrimary` answers).
pub async fn read_lease(engine: &dyn KvEngine) -> Result<Option<LeaseRecord>> {
    let out = run_transaction(engine, &retry(), |txn| Box::pin(async move { decode_lease(txn.snapshot_get(KEY_LEASE).await?) })).await?;
    Ok(out)
}

/// Releases the lease if `me` holds it (clean shutdown: a standby takes
/// over at once instead of after the lease time).
pub async fn release_lease(engine: &dyn KvEngine, me: &str) -> Result<()> {
    let me = me.to_string();
    run_transaction(engine, &retry(), |txn| {
        let me = me.clone();
        Box::pin(async move {
            if decode_lease(txn.get(KEY_LEASE).await?)?.is_some_and(|l| l.holder == me) {
                txn.clear(KEY_LEASE)?;
            }
            Ok(())
        })
    })
    .await?;
    Ok(())
}

/// Loads the persisted state, writing the bootstrap state first if the
/// engine has none (only while `me` holds the lease).
pub async fn load_or_bootstrap(engine: &dyn KvEngine, me: &str, layout: Layout) -> Result<Persisted> {
    let initial = layout.initial_chains().map_err(MgmtdError::Layout)?;
    let me = me.to_string();
    type Raw = (Option<Bytes>, Option<Bytes>, Vec<(Bytes, Bytes)>, Vec<(Bytes, Bytes)>, Vec<(Bytes, Bytes)>);
    let raw: Option<Raw> = run_transaction(engine, &retry(), |txn| {
        let (me, initial) = (me.clone(), initial.clone());
        Box::pin(async move {
            if !check_lease(txn, &me).await? {
                return Ok(None);
            }
            let mut layout_raw = txn.get(KEY_LAYOUT).await?;
            let mut version_raw = txn.get(KEY_ROUTING_VERSION).await?;
            if layout_raw.is_none() {
                let l = encode(&layout)?;
                txn.set(KEY_LAYOUT, &l)?;
                let v = encode(&1u64)?;
                txn.set(KEY_ROUTING_VERSION, &v)?;
                for (id, chain) in &initial {
                    txn.set(&chain_key(*id), &encode(chain)?)?;
                }
                layout_raw = Some(Bytes::from(l));
                version_raw = Some(Bytes::from(v));
            }
            let chains = read_all(txn, PREFIX_CHAIN).await?;
            let nodes = read_all(txn, PREFIX_NODE).await?;
            let metas = read_all(txn, PREFIX_META).await?;
            Ok(Some((layout_raw, version_raw, chains, nodes, metas)))
        })
    })
    .await?;
    let Some((layout_raw, version_raw, chain_kvs, node_kvs, meta_kvs)) = raw else { return Err(MgmtdError::LeaseLost) };
    let stored: Layout = decode(KEY_LAYOUT, layout_raw.as_deref().unwrap_or_default())?;
    if stored != layout {
        return Err(MgmtdError::Layout(format!("the KV engine holds layout {stored:?}, mgmtd was started with {layout:?}")));
    }
    let routing_version: u64 = decode(KEY_ROUTING_VERSION, version_raw.as_deref().unwrap_or(b"1"))?;
    let mut chains = BTreeMap::new();
    for (k, v) in chain_kvs {
        let view: ChainView = decode(&k, &v)?;
        let id = parse_id(&k, PREFIX_CHAIN)?;
        chains.insert(ChainId(id), view);
    }
    let mut nodes = BTreeMap::new();
    for (k, v) in node_kvs {
        let rec: NodeRecordKv = decode(&k, &v)?;
        nodes.insert(NodeId(parse_id(&k, PREFIX_NODE)?), rec);
    }
    let mut meta_servers = BTreeMap::new();
    for (k, v) in meta_kvs {
        let rec: NodeRecordKv = decode(&k, &v)?;
        meta_servers.insert(NodeId(parse_id(&k, PREFIX_META)?), rec);
    }
    Ok(Persisted { layout: stored, routing_version, chains, nodes, meta_servers })
}

fn parse_id(key: &[u8], prefix: &[u8]) -> Result<u32> {
    let corrupt = || MgmtdError::Corrupt { key: String::from_utf8_lossy(key).into_owned(), detail: "bad id".into() };
    let tail = key.strip_prefix(prefix).ok_or_else(corrupt)?;
    std::str::from_utf8(tail).ok().and_then(|s| s.parse().ok()).ok_or_else(corrupt)
}

async fn read_all(txn: &mut dyn Transaction, prefix: &[u8]) -> std::result::Result<Vec<(Bytes, Bytes)>, KvError> {
    let mut out = Vec::new();
    let mut range = RangeRequest::prefix(prefix).limit(1000);
    loop {
        let page = txn.get_range(&range).await?;
        let last = page.kvs.last().map(|(k, _)| k.clone());
        out.extend(page.kvs);
        match (page.more, last) {
            (true, Some(last)) => range.begin = fskv_kv::key_after(&last),
            _ => return Ok(out),
        }
    }
}

/// Writes `changes` if `me` still holds the lease.
pub async fn write_changes(engine: &dyn KvEngine, me: &str, changes: &Changes) -> Result<()> {
    let me = me.to_string();
    let changes = std::sync::Arc::new(changes.clone());
    let ok = run_transaction(engine, &retry(), |txn| {
        let (me, changes) = (me.clone(), changes.clone());
        Box::pin(async move {
            if !check_lease(txn, &me).await? {
                return Ok(false);
            }
            if let Some(v) = changes.routing_version {
                txn.set(KEY_ROUTING_VERSION, &encode(&v)?)?;
            }
            for (id, chain) in &changes.chains {
                txn.set(&chain_key(*id), &encode(chain)?)?;
            }
            for (id, rec) in &changes.nodes {
                txn.set(&node_key(*id), &encode(rec)?)?;
            }
            for (id, rec) in &changes.meta_servers {
                txn.set(&meta_key(*id), &encode(rec)?)?;
            }
            Ok(true)
        })
    })
    .await?;
    if ok {
        Ok(())
    } else {
        Err(MgmtdError::LeaseLost)
    }
}
