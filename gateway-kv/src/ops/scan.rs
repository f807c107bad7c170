//! Scans by prefix or range, and delete by prefix.
//!
//! `GET /v1/kv/{ns}?prefix=P&start=S&start_after=A&end=E&limit=N&values=1`:
//! keys `k` in byte order with `k` starting with `P`, `k >= S` (or `> A`),
//! `k < E`; at most `N` (default 1000, at most `max_scan_limit`). The
//! answer is the batch response framing with op 5: every item carries its
//! key, version and index, and with `values=1` its value when that is at
//! most `max_scan_value_bytes` (else status `TooLarge`). The trailer's
//! `MORE` flag (and `X-Kv-More: true`) says the page stopped at its limit:
//! ask again with `start_after` = the last key. A page costs O(keys + depth)
//! meta calls (`walk.rs`). Expired keys are not listed.
//!
//! `DELETE /v1/kv/{ns}?prefix=P` removes every key with the prefix (each
//! with a compare-and-delete on the version the scan saw, so a key
//! rewritten meanwhile stays) and answers `{"deleted": n}`.

use super::{json, respond, Kv, FRAME_CONTENT_TYPE, H_INDEX, H_MORE};
use crate::body::KvBody;
use crate::error::{KvError, Result};
use crate::frame::{self, Op, Status, Version};
use crate::keys::KeyPath;
use crate::record::{self, Record, XATTR_RECORD};
use crate::route::Query;
use crate::store::Namespace;
use bytes::Bytes;
use fskv_client::keywalk::Walker;
use fskv_proto::meta::{Expected, MetaOp, MetaReply, DEFAULT_INLINE_MAX_BYTES};
use fskv_types::InodeId;
use futures::StreamExt;
use http::header::CONTENT_TYPE;
use http::{Response, StatusCode};
use std::collections::HashMap;

/// What a scan asks for.
#[derive(Clone, Debug, Default)]
pub struct ScanParams {
    pub prefix: Vec<u8>,
    /// Start key and whether it is included.
    pub start: Option<(Vec<u8>, bool)>,
    /// First key not returned.
    pub end: Option<Vec<u8>>,
    pub limit: usize,
    pub values: bool,
}

impl ScanParams {
    pub fn from_query(q: &Query, max_limit: u32) -> Result<ScanParams> {
        let limit = q.u64("limit")?.unwrap_or(1000);
        if limit == 0 || limit > u64::from(max_limit) {
            return Err(KvError::InvalidArgument(format!("limit must be 1..={max_limit}")));
        }
        if q.has("start") && q.has("start_after") {
            return Err(KvError::InvalidArgument("start and start_after together".into()));
        }
        let start = q.bytes("start").map(|s| (s.to_vec(), true)).or_else(|| q.bytes("start_after").map(|s| (s.to_vec(), false)));
        Ok(ScanParams {
            prefix: q.bytes("prefix").unwrap_or_default().to_vec(),
            start,
            end: q.bytes("end").map(<[u8]>::to_vec),
            limit: limit as usize,
            values: q.flag("values"),
        })
    }

    /// Where the walk starts: the later of `start` and the prefix.
    fn effective_start(&self) -> Option<(Vec<u8>, bool)> {
        match &self.start {
            Some((s, incl)) if s.as_slice() >= self.prefix.as_slice() => Some((s.clone(), *incl)),
            _ if self.prefix.is_empty() => None,
            _ => Some((self.prefix.clone(), true)),
        }
    }
}

/// One key a scan found.
#[derive(Clone, Debug)]
pub struct ScanItem {
    pub key: Vec<u8>,
    pub inode: InodeId,
    pub version: Version,
    pub index: u64,
    pub size: u64,
    pub record: Record,
    pub status: Status,
    pub value: Option<Bytes>,
}

#[derive(Clone, Debug, Default)]
pub struct ScanPage {
    pub items: Vec<ScanItem>,
    pub more: bool,
    /// Largest mtime of the continuation directories walked.
    pub max_dir_mtime_ns: u64,
}

impl Kv {
    /// One page of a scan (values read when asked).
    pub async fn scan_page(&self, ns: &Namespace, p: &ScanParams) -> Result<ScanPage> {
        let start = p.effective_start();
        let mut walker = Walker::new(self.store.fs.clone(), ns.dir, start.as_ref().map(|(k, i)| (k.as_slice(), *i)));
        let mut page = ScanPage::default();
        while let Some(f) = walker.next().await.map_err(KvError::walk)? {
            if !f.key.starts_with(&p.prefix) || p.end.as_ref().is_some_and(|e| f.key >= *e) {
                break;
            }
            if page.items.len() == p.limit {
                page.more = true;
                break;
            }
            let Some(attr) = f.entry.attr else { continue };
            page.items.push(ScanItem {
                key: f.key,
                inode: attr.id,
                version: record::version_of(&attr),
                index: attr.mtime_ns,
                size: attr.size_bytes(),
                record: if record::has_record(&attr) {
                    Record { expires_ns: Some(u64::MAX), ..Default::default() }
                } else {
                    Record::default()
                },
                status: Status::Ok,
                value: None,
            });
        }
        page.max_dir_mtime_ns = walker.max_dir_mtime_ns;
        self.fill_records(&mut page.items).await?;
        let now = record::now_ns();
        page.items.retain(|i| !i.record.expired(now));
        if p.values {
            self.fill_values(&mut page.items).await?;
        }
        Ok(page)
    }

    /// Reads the records of the items whose files have one.
    async fn fill_records(&self, items: &mut [ScanItem]) -> Result<()> {
        let idx: Vec<usize> = (0..items.len()).filter(|i| items[*i].record.expires_ns == Some(u64::MAX)).collect();
        for group in idx.chunks(1024) {
            let ops = group.iter().map(|i| MetaOp::GetXattr { inode: items[*i].inode, name: XATTR_RECORD.into() }).collect();
            let results = self.store.fs.meta().batch(ops).await.map_err(|e| KvError::from_code(e.code(), "scan", KvError::NoSuchKey))?;
            for (i, r) in group.iter().zip(results) {
                items[*i].record = match r {
                    Ok(MetaReply::Xattr(v)) => Record::decode(&v),
                    _ => Record::default(),
                };
            }
        }
        Ok(())
    }

    async fn fill_values(&self, items: &mut [ScanItem]) -> Result<()> {
        let max = self.cfg.limits.max_scan_value_bytes;
        // Small values are inline: one batched stat brings their bytes.
        let small: Vec<usize> = (0..items.len()).filter(|i| items[*i].size <= DEFAULT_INLINE_MAX_BYTES as u64).collect();
        let mut inodes: HashMap<usize, fskv_proto::meta::Inode> = HashMap::new();
        for group in small.chunks(1024) {
            let ops = group.iter().map(|i| MetaOp::Stat { inode: items[*i].inode }).collect();
            let results = self.store.fs.meta().batch(ops).await.map_err(|e| KvError::from_code(e.code(), "scan", KvError::NoSuchKey))?;
            for (i, r) in group.iter().zip(results) {
                if let Ok(MetaReply::Inode(inode)) = r {
                    inodes.insert(*i, inode);
                }
            }
        }
        let store = &self.store;
        let reads: Vec<(usize, Result<Bytes>)> = futures::stream::iter(0..items.len())
            .map(|i| {
                let inode = inodes.remove(&i);
                let size = items[i].size;
                let id = items[i].inode;
                async move {
                    if size > max {
                        return (i, Err(KvError::ValueTooLarge { len: Some(size), max }));
                    }
                    let inode = match inode {
                        Some(x) => x,
                        None => match store.fs.meta().stat(id).await {
                            Ok(x) => x,
                            Err(e) => return (i, Err(KvError::from_code(e.code(), "scan", KvError::NoSuchKey))),
                        },
                    };
                    (i, store.read_whole(inode, max).await)
                }
            })
            .buffer_unordered(self.cfg.limits.batch_parallelism)
            .collect()
            .await;
        for (i, r) in reads {
            match r {
                Ok(b) => items[i].value = Some(b),
                Err(KvError::ValueTooLarge { .. }) => items[i].status = Status::TooLarge,
                Err(KvError::NoSuchKey) => items[i].status = Status::NotFound,
                Err(e) => {
                    tracing::warn!(error = %e, "scan could not read a value");
                    items[i].status = Status::Error;
                }
            }
        }
        Ok(())
    }

    pub async fn scan(&self, ns: &str, q: &Query) -> Result<Response<KvBody>> {
        let ns = self.store.namespace(ns).await?;
        let p = ScanParams::from_query(q, self.cfg.limits.max_scan_limit)?;
        let page = self.scan_page(&ns, &p).await?;
        let mut body = Vec::new();
        body.extend_from_slice(&frame::response_header(Op::Scan, page.items.len() as u32));
        let mut max_index = 0;
        for i in &page.items {
            max_index = max_index.max(i.index);
            let v = i.value.as_ref().filter(|_| i.status == Status::Ok);
            body.extend_from_slice(&frame::response_item(i.status, &i.key, i.version, i.index, v.map_or(0, |b| b.len() as u64)));
            if let Some(b) = v {
                body.extend_from_slice(b);
            }
        }
        let n = page.items.len() as u32;
        body.extend_from_slice(&frame::trailer(n, n, if page.more { frame::TRAILER_MORE } else { 0 }));
        let headers =
            vec![(CONTENT_TYPE, FRAME_CONTENT_TYPE.to_string()), (H_MORE, page.more.to_string()), (H_INDEX, max_index.to_string())];
        Ok(respond(StatusCode::OK, headers, KvBody::full(body)))
    }

    /// Removes every key starting with `prefix`; how many were removed.
    pub async fn delete_prefix_keys(&self, ns: &Namespace, prefix: &[u8]) -> Result<u64> {
        let mut p = ScanParams { prefix: prefix.to_vec(), start: None, end: None, limit: 1024, values: false };
        let mut deleted = 0u64;
        loop {
            let page = self.scan_page(ns, &p).await?;
            let n: Vec<bool> = futures::stream::iter(page.items.iter().cloned())
                .map(|i: ScanItem| async move {
                    let path = KeyPath::of(&i.key);
                    let expected = Expected::Inode { id: i.inode, version: i.version.version };
                    match self.store.unlink(ns, &path, Some(expected)).await {
                        Ok(true) => {
                            if let Some(m) = &self.maint {
                                m.on_delete(&ns.name, &i.key);
                            }
                            true
                        }
                        Ok(false) | Err(KvError::PreconditionFailed(_)) => false,
                        Err(e) => {
                            tracing::warn!(error = %e, "delete by prefix: a key could not be removed");
                            false
                        }
                    }
                })
                .buffer_unordered(self.cfg.limits.batch_parallelism)
                .collect()
                .await;
            deleted += n.iter().filter(|x| **x).count() as u64;
            match page.items.last() {
                Some(last) if page.more => p.start = Some((last.key.clone(), false)),
                _ => break,
            }
        }
        if deleted > 0 {
            self.notify_change();
        }
        Ok(deleted)
    }

    pub async fn delete_prefix(&self, ns: &str, q: &Query) -> Result<Response<KvBody>> {
        let ns = self.store.namespace(ns).await?;
        let Some(prefix) = q.bytes("prefix") else {
            return Err(KvError::InvalidArgument("DELETE /v1/kv/{ns} needs ?prefix= (empty: every key)".into()));
        };
        let deleted = self.delete_prefix_keys(&ns, prefix).await?;
        Ok(json(StatusCode::OK, &serde_json::json!({ "deleted": deleted })))
    }
}
