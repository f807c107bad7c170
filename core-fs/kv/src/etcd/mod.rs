//! The etcd engine: [`KvEngine`] over an etcd v3 cluster (Raft), through
//! etcd's JSON gateway over HTTP/1.1 (`wire.rs`). A distributed engine that
//! runs here (Debian's `etcd-server`), so several meta and mgmtd processes
//! share their state for real.
//!
//! Semantics are the other engines' (checked by the same conformance suite):
//!
//! | property | how |
//! |---|---|
//! | snapshot reads | the first read is a linearizable read at the current revision R; every later read of the transaction names `revision: R` and is served by the member locally (serializable: revision R is immutable) |
//! | read-your-writes | the same overlay rules as the embedded engines (sets, clears, range clears, atomic ops folded over the snapshot value) |
//! | serializable | commit is ONE etcd transaction whose compares check that every key and range read is unchanged since R (`plan.rs`); a failed compare → [`KvError::NotCommitted`] |
//! | range conflicts | a compare `mod_revision < R+1` over the part of the range read, plus one compare per key it returned (deletions) |
//! | atomic add / max | blind: the base is guessed (last value seen by this engine), compared in an outer transaction and re-read on a wrong guess; never a conflict |
//! | durability | etcd acknowledges after a majority of members fsynced the Raft entry |
//! | limits | FoundationDB's, client-side, as every engine; plus etcd's `--max-txn-ops` and `--max-request-bytes`, given in the spec (defaults: etcd's defaults) |
//!
//! Spec: `etcd:http://HOST:PORT[,http://HOST:PORT...][?prefix=P&max_txn_ops=N&max_request_bytes=N&request_timeout_ms=N&connect_timeout_ms=N]`.
//! Every key is stored under `prefix` (default `fskv/`), so one etcd cluster
//! can hold several 3FS-KV clusters.
//!
//! Not supported: `add_write_conflict_range` (etcd detects conflicts only
//! through revisions of keys that were written; it is refused with
//! `InvalidArgument`), TLS and etcd authentication (use a private network).

mod plan;
/// A local etcd cluster for tests (feature `testkit`).
#[cfg(feature = "testkit")]
pub mod testkit;
mod wire;

use crate::limits::{check_key, check_range, check_value, grow_transaction};
use crate::local::{add_le, max_le};
use crate::{key_after, KeyValue, KvEngine, KvError, KvResult, RangeRequest, RangeResult, Transaction};
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use plan::{Compare, Op, PlanLimits, TxnSets, Write};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use wire::{CallKind, CompareReq, DeleteReq, EtcdHttp, PutReq, RangeReq, RangeResp, RequestOp, TxnReq, TxnResp};

/// etcd's default `--max-txn-ops`.
pub const ETCD_DEFAULT_MAX_TXN_OPS: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const ETCD_DEFAULT_MAX_REQUEST_BYTES: usize = 1_572_864;
/// Rows fetched per step of a range read.
const RANGE_PAGE_ROWS: usize = 256;
/// Rounds of a commit whose atomic bases were guessed wrong before it gives
/// up with `NotCommitted` (retryable).
const MAX_ATOMIC_ROUNDS: usize = 16;
/// Atomic bases remembered by an engine (the table is emptied when full).
const MAX_CACHED_ATOMIC_BASES: usize = 4096;

/// Where and how to reach an etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs (`http://host:port`), tried in order, the last one that
    /// answered first.
    pub endpoints: Vec<String>,
    /// Prefix of every key this engine stores (non-empty).
    pub prefix: Vec<u8>,
    /// The cluster's `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// The cluster's `--max-request-bytes`.
    pub max_request_bytes: usize,
    pub connect_timeout_ms: u64,
    /// Deadline of one request, over every endpoint tried.
    pub request_timeout_ms: u64,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: Vec::new(),
            prefix: b"fskv/".to_vec(),
            max_txn_ops: ETCD_DEFAULT_MAX_TXN_OPS,
            max_request_bytes: ETCD_DEFAULT_MAX_REQUEST_BYTES,
            connect_timeout_ms: 1_000,
            request_timeout_ms: 10_000,
        }
    }
}

impl EtcdOptions {
    /// Parses the part of an engine spec after `etcd:`.
    pub fn parse(spec: &str) -> KvResult<Self> {
        let bad = |m: String| KvError::InvalidArgument(format!("etcd engine spec {spec:?}: {m}"));
        let (urls, query) = spec.split_once('?').unwrap_or((spec, ""));
        let mut opts = EtcdOptions::default();
        for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            if url.starts_with("https://") {
                return Err(bad(format!("{url}: TLS is not supported; use http:// on a private network")));
            }
            let Some(hostport) = url.strip_prefix("http://") else {
                return Err(bad(format!("{url}: expected http://HOST:PORT")));
            };
            let hostport = hostport.trim_end_matches('/');
            if hostport.is_empty() || hostport.contains('/') {
                return Err(bad(format!("{url}: expected http://HOST:PORT")));
            }
            opts.endpoints.push(format!("http://{hostport}"));
        }
        if opts.endpoints.is_empty() {
            return Err(bad("no endpoint (expected etcd:http://HOST:PORT[,http://HOST:PORT...])".into()));
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| bad(format!("option {pair:?} is not KEY=VALUE")))?;
            let num = |v: &str| v.parse::<u64>().map_err(|_| bad(format!("{k}={v} is not a number")));
            match k {
                "prefix" => opts.prefix = v.as_bytes().to_vec(),
                "max_txn_ops" => opts.max_txn_ops = num(v)? as usize,
                "max_request_bytes" => opts.max_request_bytes = num(v)? as usize,
                "connect_timeout_ms" => opts.connect_timeout_ms = num(v)?,
                "request_timeout_ms" => opts.request_timeout_ms = num(v)?,
                _ => {
                    return Err(bad(format!(
                        "unknown option {k:?} (known: prefix, max_txn_ops, max_request_bytes, connect_timeout_ms, request_timeout_ms)"
                    )))
                }
            }
        }
        if opts.prefix.is_empty() {
            return Err(bad("prefix must not be empty (etcd has no empty key)".into()));
        }
        if opts.max_txn_ops < 2 {
            return Err(bad("max_txn_ops must be at least 2".into()));
        }
        Ok(opts)
    }
}

struct Inner {
    http: EtcdHttp,
    opts: EtcdOptions,
    /// etcd key → (mod_revision, value) last seen: the guessed base of an atomic op.
    atomic_bases: Mutex<HashMap<Bytes, (i64, Option<Bytes>)>>,
}

/// An etcd cluster as a transactional engine.
#[derive(Clone)]
pub struct EtcdEngine {
    inner: Arc<Inner>,
}

impl EtcdEngine {
    /// A client of the cluster; nothing is sent until the first transaction.
    pub fn open(opts: EtcdOptions) -> KvResult<Self> {
        if opts.endpoints.is_empty() {
            return Err(KvError::InvalidArgument("etcd engine without endpoints".into()));
        }
        let http = EtcdHttp::new(opts.endpoints.clone(), opts.connect_timeout_ms, opts.request_timeout_ms);
        Ok(EtcdEngine { inner: Arc::new(Inner { http, opts, atomic_bases: Mutex::new(HashMap::new()) }) })
    }

    pub fn options(&self) -> &EtcdOptions {
        &self.inner.opts
    }

    /// The cluster's current revision (a linearizable read).
    pub async fn current_revision(&self) -> KvResult<u64> {
        let resp: RangeResp =
            self.inner.http.call("/v3/kv/range", &RangeReq::key(Bytes::from(self.inner.opts.prefix.clone())), CallKind::Read).await?;
        Ok(resp.header.revision.max(0) as u64)
    }
}

#[async_trait]
impl KvEngine for EtcdEngine {
    fn name(&self) -> &'static str {
        "etcd"
    }

    async fn begin(&self) -> KvResult<Box<dyn Transaction>> {
        Ok(Box::new(EtcdTransaction {
            inner: self.inner.clone(),
            revision: None,
            overlay: BTreeMap::new(),
            cleared: Vec::new(),
            observed: BTreeMap::new(),
            ranges: Vec::new(),
            conflict_ranges: Vec::new(),
            size_bytes: 0,
        }))
    }
}

/// One row of a snapshot read: user key, value, mod_revision.
type Row = (Bytes, Bytes, i64);

struct EtcdTransaction {
    inner: Arc<Inner>,
    /// The snapshot revision R, fixed by the first read.
    revision: Option<i64>,
    overlay: BTreeMap<Bytes, Write>,
    cleared: Vec<(Bytes, Bytes)>,
    /// Keys read with conflict → mod_revision at R (0 = absent).
    observed: BTreeMap<Bytes, i64>,
    /// Ranges read with conflict (the part read).
    ranges: Vec<(Bytes, Bytes)>,
    /// `add_read_conflict_range` ranges: their keys are read at R at commit.
    conflict_ranges: Vec<(Bytes, Bytes)>,
    size_bytes: usize,
}

fn resolve_own(op: &Write, base: Option<&Bytes>) -> Option<Bytes> {
    match op {
        Write::Set(v) => Some(v.clone()),
        Write::Clear => None,
        Write::Add(d) => Some(add_le(base.map(|b| &b[..]), *d)),
        Write::Max(m) => Some(max_le(base.map(|b| &b[..]), *m)),
    }
}

impl EtcdTransaction {
    fn ek(&self, key: &[u8]) -> Bytes {
        let mut v = Vec::with_capacity(self.inner.opts.prefix.len() + key.len());
        v.extend_from_slice(&self.inner.opts.prefix);
        v.extend_from_slice(key);
        Bytes::from(v)
    }

    fn user_key(&self, key: &Bytes) -> KvResult<Bytes> {
        let p = self.inner.opts.prefix.len();
        if key.len() < p || key[..p] != self.inner.opts.prefix[..] {
            return Err(KvError::Storage(format!(
                "etcd returned a key outside the prefix {:?}",
                String::from_utf8_lossy(&self.inner.opts.prefix)
            )));
        }
        Ok(key.slice(p..))
    }

    fn grow(&mut self, bytes: usize) -> KvResult<()> {
        grow_transaction(&mut self.size_bytes, bytes)
    }

    fn is_cleared(&self, key: &[u8]) -> bool {
        self.cleared.iter().any(|(b, e)| &b[..] <= key && key < &e[..])
    }

    /// A range read at the snapshot revision (fixing it at the first read):
    /// rows of `[lo, hi)` (`hi` None: the single key `lo`), at most `limit`.
    async fn fetch(&mut self, lo: &[u8], hi: Option<&[u8]>, limit: usize, reverse: bool, keys_only: bool) -> KvResult<(Vec<Row>, bool)> {
        let mut req = RangeReq::key(self.ek(lo));
        req.range_end = hi.map(|h| self.ek(h));
        req.limit = i64::try_from(limit).unwrap_or(i64::MAX);
        req.revision = self.revision.unwrap_or(0);
        req.keys_only = keys_only;
        if reverse {
            req.sort_order = Some("DESCEND");
            req.sort_target = Some("KEY");
        }
        // The first read is linearizable (it must see every commit acknowledged
        // before it); later ones read the immutable revision R wherever they
        // land. A member that has not applied R yet (after a failover) refuses
        // ("future revision"): read through the leader then.
        req.serializable = self.revision.is_some();
        let resp: RangeResp = match self.inner.http.call("/v3/kv/range", &req, CallKind::Read).await {
            Err(e) if req.serializable && e != KvError::TransactionTooOld => {
                tracing::debug!(error = %e, "serializable read at the snapshot revision failed; reading through the leader");
                req.serializable = false;
                self.inner.http.call("/v3/kv/range", &req, CallKind::Read).await?
            }
            r => r?,
        };
        if self.revision.is_none() {
            if resp.header.revision <= 0 {
                return Err(KvError::Storage("etcd answered a read without a revision".into()));
            }
            self.revision = Some(resp.header.revision);
        }
        let mut rows = Vec::with_capacity(resp.kvs.len());
        for kv in resp.kvs {
            rows.push((self.user_key(&kv.key)?, kv.value, kv.mod_revision));
        }
        Ok((rows, resp.more))
    }

    async fn point_read(&mut self, key: &[u8], conflict: bool) -> KvResult<Option<Bytes>> {
        check_key(key)?;
        let pending = match self.overlay.get(key) {
            Some(Write::Set(v)) => return Ok(Some(v.clone())),
            Some(Write::Clear) => return Ok(None),
            Some(op) => Some(op.clone()),
            None if self.is_cleared(key) => return Ok(None),
            None => None,
        };
        let (rows, _) = self.fetch(key, None, 0, false, false).await?;
        let (base, mod_revision) = match rows.into_iter().next() {
            Some((_, v, m)) => (Some(v), m),
            None => (None, 0),
        };
        if conflict {
            self.grow(key.len())?;
            self.observed.insert(Bytes::copy_from_slice(key), mod_revision);
        }
        Ok(match pending {
            Some(op) => resolve_own(&op, base.as_ref()),
            None => base,
        })
    }

    async fn range_read(&mut self, req: &RangeRequest, conflict: bool) -> KvResult<RangeResult> {
        check_range(&req.begin, &req.end)?;
        if req.begin == req.end {
            if self.revision.is_none() {
                // Fix the snapshot anyway: a later read must see the same state.
                self.fetch(&req.begin, None, 1, false, true).await?;
            }
            return Ok(RangeResult::default());
        }
        let limit = if req.limit == 0 { usize::MAX } else { req.limit };
        let (result, raw) = self.merged_range(req, limit).await?;
        if conflict {
            let (b, e) = match (result.more, result.kvs.last(), req.reverse) {
                (true, Some((last, _)), false) => (req.begin.clone(), key_after(last)),
                (true, Some((last, _)), true) => (last.clone(), req.end.clone()),
                _ => (req.begin.clone(), req.end.clone()),
            };
            self.grow(b.len() + e.len())?;
            for (k, _, m) in raw {
                if b <= k && k < e {
                    self.grow(k.len())?;
                    self.observed.insert(k, m);
                }
            }
            self.ranges.push((b, e));
        }
        Ok(result)
    }

    /// Merges the snapshot's rows with this transaction's own writes, in
    /// order (the embedded engines' algorithm, with etcd pages); also returns
    /// every snapshot row fetched (for conflicts).
    async fn merged_range(&mut self, req: &RangeRequest, limit: usize) -> KvResult<(RangeResult, Vec<Row>)> {
        let reverse = req.reverse;
        let before = |a: &[u8], b: &[u8]| if reverse { a > b } else { a < b };
        let mut own: Vec<(Bytes, Write)> = self
            .overlay
            .range::<[u8], _>((std::ops::Bound::Included(&req.begin[..]), std::ops::Bound::Excluded(&req.end[..])))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if reverse {
            own.reverse();
        }
        let mut own_i = 0;
        let (mut lo, mut hi) = (req.begin.clone(), req.end.clone());
        let mut out: Vec<KeyValue> = Vec::new();
        let mut raw: Vec<Row> = Vec::new();
        loop {
            let page_rows = (limit - out.len()).saturating_add(16).min(RANGE_PAGE_ROWS);
            let (page, page_more) = self.fetch(&lo, Some(&hi), page_rows, reverse, false).await?;
            let raw_start = raw.len();
            raw.extend(page);
            let page = &raw[raw_start..];
            // Rows up to `boundary` (inclusive) are fully known: merge own writes up to it.
            let boundary = if page_more { page.last().map(|(k, _, _)| k.clone()) } else { None };
            let within = |k: &[u8]| boundary.as_ref().is_none_or(|b| !before(b, k));
            let mut page_i = 0;
            loop {
                let next_own = own.get(own_i).filter(|(k, _)| within(k));
                let next_page = page.get(page_i);
                let (key, value) = match (next_own, next_page) {
                    (None, None) => break,
                    (Some((ok, op)), Some((pk, pv, _))) if ok == pk => {
                        own_i += 1;
                        page_i += 1;
                        (ok.clone(), resolve_own(op, Some(pv)))
                    }
                    (Some((ok, op)), Some((pk, _, _))) if before(ok, pk) => {
                        own_i += 1;
                        (ok.clone(), resolve_own(op, None))
                    }
                    (Some((ok, op)), None) => {
                        own_i += 1;
                        (ok.clone(), resolve_own(op, None))
                    }
                    (_, Some((pk, pv, _))) => {
                        page_i += 1;
                        let v = if self.is_cleared(pk) { None } else { Some(pv.clone()) };
                        (pk.clone(), v)
                    }
                };
                if let Some(v) = value {
                    out.push((key, v));
                    if out.len() >= limit {
                        let rest = page_i < page.len() || page_more || own_i < own.len();
                        return Ok((RangeResult { kvs: out, more: rest }, raw));
                    }
                }
            }
            match boundary {
                None => return Ok((RangeResult { kvs: out, more: false }, raw)),
                Some(b) => {
                    if reverse {
                        hi = b;
                    } else {
                        lo = key_after(&b);
                    }
                }
            }
        }
    }

    fn atomic(&mut self, key: &[u8], op: Write) -> KvResult<()> {
        check_key(key)?;
        self.grow(key.len() + 8)?;
        let next = match (self.overlay.get(key), &op) {
            (Some(Write::Set(v)), _) => Write::Set(resolve_own(&op, Some(v)).unwrap_or_default()),
            (Some(Write::Clear), _) => Write::Set(resolve_own(&op, None).unwrap_or_default()),
            (None, _) if self.is_cleared(key) => Write::Set(resolve_own(&op, None).unwrap_or_default()),
            (Some(Write::Add(a)), Write::Add(d)) => Write::Add(a.wrapping_add(*d)),
            (Some(Write::Max(a)), Write::Max(m)) => Write::Max((*a).max(*m)),
            (Some(_), _) => {
                return Err(KvError::InvalidArgument(format!(
                    "atomic add and atomic max on one key ({} bytes) in one transaction",
                    key.len()
                )))
            }
            (None, _) => op,
        };
        self.overlay.insert(Bytes::copy_from_slice(key), next);
        Ok(())
    }

    /// Reads the keys of every `add_read_conflict_range` range at the
    /// snapshot revision, so that the commit compares them like a range read.
    async fn resolve_conflict_ranges(&mut self) -> KvResult<()> {
        let ranges = std::mem::take(&mut self.conflict_ranges);
        let cap = self.inner.opts.max_txn_ops;
        for (b, e) in ranges {
            if b < e {
                let (rows, more) = self.fetch(&b, Some(&e), cap + 1, false, true).await?;
                if more || rows.len() > cap {
                    return Err(KvError::TooManyOperations { ops: rows.len() + 1, limit: cap });
                }
                for (k, _, m) in rows {
                    self.observed.insert(k, m);
                }
            }
            self.ranges.push((b, e));
        }
        Ok(())
    }
}

fn compare_req(c: &Compare) -> CompareReq {
    match c {
        Compare::ModEquals { key, mod_revision } => {
            CompareReq { key: key.clone(), range_end: None, target: "MOD", result: "EQUAL", mod_revision: *mod_revision }
        }
        Compare::RangeModBelow { begin, end, below } => {
            CompareReq { key: begin.clone(), range_end: Some(end.clone()), target: "MOD", result: "LESS", mod_revision: *below }
        }
    }
}

fn op_req(op: &Op) -> RequestOp {
    match op {
        Op::Put { key, value } => RequestOp::Put(PutReq { key: key.clone(), value: value.clone() }),
        Op::Delete { key, end } => RequestOp::DeleteRange(DeleteReq { key: key.clone(), range_end: end.clone() }),
    }
}

#[async_trait]
impl Transaction for EtcdTransaction {
    async fn get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        self.point_read(key, true).await
    }

    async fn snapshot_get(&mut self, key: &[u8]) -> KvResult<Option<Bytes>> {
        self.point_read(key, false).await
    }

    async fn get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        self.range_read(range, true).await
    }

    async fn snapshot_get_range(&mut self, range: &RangeRequest) -> KvResult<RangeResult> {
        self.range_read(range, false).await
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> KvResult<()> {
        check_key(key)?;
        check_value(value)?;
        self.grow(key.len() + value.len())?;
        self.overlay.insert(Bytes::copy_from_slice(key), Write::Set(Bytes::copy_from_slice(value)));
        Ok(())
    }

    fn clear(&mut self, key: &[u8]) -> KvResult<()> {
        check_key(key)?;
        self.grow(key.len())?;
        self.overlay.insert(Bytes::copy_from_slice(key), Write::Clear);
        Ok(())
    }

    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        check_range(begin, end)?;
        if begin == end {
            return Ok(());
        }
        self.grow(begin.len() + end.len())?;
        let doomed: Vec<Bytes> = self
            .overlay
            .range::<[u8], _>((std::ops::Bound::Included(begin), std::ops::Bound::Excluded(end)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.overlay.remove(&k);
        }
        self.cleared.push((Bytes::copy_from_slice(begin), Bytes::copy_from_slice(end)));
        Ok(())
    }

    fn atomic_add(&mut self, key: &[u8], delta: i64) -> KvResult<()> {
        self.atomic(key, Write::Add(delta))
    }

    fn atomic_max(&mut self, key: &[u8], value: u64) -> KvResult<()> {
        self.atomic(key, Write::Max(value))
    }

    fn add_read_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> KvResult<()> {
        check_range(begin, end)?;
        self.grow(begin.len() + end.len())?;
        self.conflict_ranges.push((Bytes::copy_from_slice(begin), Bytes::copy_from_slice(end)));
        Ok(())
    }

    fn add_write_conflict_range(&mut self, _begin: &[u8], _end: &[u8]) -> KvResult<()> {
        Err(KvError::InvalidArgument(
            "add_write_conflict_range is not supported by the etcd engine (etcd detects conflicts only through revisions of keys written)"
                .into(),
        ))
    }

    async fn commit(mut self: Box<Self>) -> KvResult<u64> {
        if !self.conflict_ranges.is_empty() {
            self.resolve_conflict_ranges().await?;
        }
        if self.overlay.is_empty() && self.cleared.is_empty() {
            return match self.revision {
                Some(r) => Ok(r.max(0) as u64),
                None => EtcdEngine { inner: self.inner.clone() }.current_revision().await,
            };
        }
        let limits = PlanLimits { max_txn_ops: self.inner.opts.max_txn_ops, max_request_bytes: self.inner.opts.max_request_bytes };
        let this = *self;
        let sets = TxnSets {
            read_revision: this.revision,
            observed: this.observed,
            ranges: this.ranges,
            writes: this.overlay,
            cleared: this.cleared,
        };
        let plan = plan::plan(&sets, &this.inner.opts.prefix, limits)?;
        let inner = this.inner;
        let reads: Vec<CompareReq> = plan.compares.iter().map(compare_req).collect();
        let mut ops: Vec<RequestOp> = plan.ops.iter().map(op_req).collect();
        // Fill in etcd's refusals with what the plan counted.
        let refine = |e: KvError| match e {
            KvError::TooManyOperations { .. } => KvError::TooManyOperations { ops: plan.ops_needed, limit: limits.max_txn_ops },
            KvError::TransactionTooLarge { .. } => {
                KvError::TransactionTooLarge { size: plan.request_bytes, limit: limits.max_request_bytes }
            }
            e => e,
        };
        if plan.atomics.is_empty() {
            let req = TxnReq { compare: reads, success: ops, failure: Vec::new() };
            let resp: TxnResp = inner.http.call("/v3/kv/txn", &req, CallKind::Commit).await.map_err(refine)?;
            return if resp.succeeded { Ok(resp.header.revision.max(0) as u64) } else { Err(KvError::NotCommitted) };
        }
        let mut bases: Vec<(i64, Option<Bytes>)> = {
            let cache = inner.atomic_bases.lock();
            plan.atomics.iter().map(|(k, _)| cache.get(k).cloned().unwrap_or((0, None))).collect()
        };
        let plain_ops = ops.len();
        for _round in 0..MAX_ATOMIC_ROUNDS {
            ops.truncate(plain_ops);
            let mut values = Vec::with_capacity(plan.atomics.len());
            let mut guards = Vec::with_capacity(plan.atomics.len());
            let mut refresh = Vec::with_capacity(plan.atomics.len());
            for ((key, op), (mod_revision, base)) in plan.atomics.iter().zip(&bases) {
                let value = resolve_own(op, base.as_ref()).unwrap_or_default();
                ops.push(RequestOp::Put(PutReq { key: key.clone(), value: value.clone() }));
                values.push(value);
                guards.push(compare_req(&Compare::ModEquals { key: key.clone(), mod_revision: *mod_revision }));
                refresh.push(RequestOp::Range(RangeReq::key(key.clone())));
            }
            let req = TxnReq {
                compare: guards,
                success: vec![RequestOp::Txn(TxnReq { compare: reads.clone(), success: ops.clone(), failure: Vec::new() })],
                failure: refresh,
            };
            let resp: TxnResp = inner.http.call("/v3/kv/txn", &req, CallKind::Commit).await.map_err(refine)?;
            if resp.succeeded {
                let committed = resp.responses.first().and_then(|r| r.response_txn.as_ref()).is_some_and(|t| t.succeeded);
                if !committed {
                    return Err(KvError::NotCommitted);
                }
                let revision = resp.header.revision;
                let mut cache = inner.atomic_bases.lock();
                if cache.len() + plan.atomics.len() > MAX_CACHED_ATOMIC_BASES {
                    cache.clear();
                }
                for ((key, _), value) in plan.atomics.iter().zip(values) {
                    cache.insert(key.clone(), (revision, Some(value)));
                }
                return Ok(revision.max(0) as u64);
            }
            // A guessed base was wrong: the failure branch read the current ones.
            if resp.responses.len() != plan.atomics.len() {
                return Err(KvError::Storage(format!(
                    "etcd answered {} reads for {} atomic keys",
                    resp.responses.len(),
                    plan.atomics.len()
                )));
            }
            let mut cache = inner.atomic_bases.lock();
            if cache.len() + plan.atomics.len() > MAX_CACHED_ATOMIC_BASES {
                cache.clear();
            }
            for (i, r) in resp.responses.iter().enumerate() {
                let kv = r.response_range.as_ref().and_then(|rr| rr.kvs.first());
                bases[i] = match kv {
                    Some(kv) => (kv.mod_revision, Some(kv.value.clone())),
                    None => (0, None),
                };
                cache.insert(plan.atomics[i].0.clone(), bases[i].clone());
            }
        }
        Err(KvError::NotCommitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing() {
        let o = EtcdOptions::parse("http://10.0.0.1:2379,http://10.0.0.2:2379/?prefix=c1/&max_txn_ops=1000&max_request_bytes=10485760")
            .unwrap();
        assert_eq!(o.endpoints, vec!["http://10.0.0.1:2379".to_string(), "http://10.0.0.2:2379".to_string()]);
        assert_eq!(o.prefix, b"c1/");
        assert_eq!(o.max_txn_ops, 1000);
        assert_eq!(o.max_request_bytes, 10_485_760);
        let d = EtcdOptions::parse("http://a:1").unwrap();
        assert_eq!((d.max_txn_ops, d.max_request_bytes, &d.prefix[..]), (128, 1_572_864, &b"fskv/"[..]));
        for bad in ["", "https://a:1", "a:1", "http://a:1?bogus=1", "http://a:1?max_txn_ops=x", "http://a:1?prefix=", "http:///x"] {
            assert!(matches!(EtcdOptions::parse(bad), Err(KvError::InvalidArgument(_))), "{bad:?} accepted");
        }
    }
}
