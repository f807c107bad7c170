//! Batches in the binary framing of `frame.rs`: get, put, delete, exists.
//!
//! | batch | how |
//! |---|---|
//! | get | lookups of all keys in batched meta calls (short keys: one call per 1024), then one streamed response: item heads and values in request order, chunk reads running ahead by at most `batch_readahead_bytes` across items; `PREFIX` mode answers `Skipped` after the first missing key |
//! | exists | as get without values; answers per-key statuses **and** the prefix count (trailer and `X-Kv-Prefix-Count`); with `lease_ms` the leading existing keys are pinned against eviction: the lease is written (an access log flagged `LEASE`) *before* the keys are looked up, and a key the evictor has condemned counts as missing |
//! | put | the body streams through the incremental decoder: each value goes to memory (≤ 4 KiB) or a temp file as it arrives; **only once the whole body decoded cleanly** are the items published (in parallel, `batch_parallelism`), each atomically with its own precondition (`IF_ABSENT` → `Exists` when the key is there, `IF_MATCH` → `PreconditionFailed`). A bad frame (400) publishes nothing |
//! | delete | unlinks in parallel; `IF_MATCH` is a compare-and-delete |

use super::{collect, next_data, respond, Kv, FRAME_CONTENT_TYPE, H_PREFIX_COUNT};
use crate::body::{read_segments, stream_segments, KvBody, Segment, ValueWriter};
use crate::error::{KvError, Result};
use crate::frame::{self, BatchHeader, Event, ItemHead, Op, RequestDecoder, Status, Tally, Version};
use crate::keys::KeyPath;
use crate::recency::{Log, LogEntry};
use crate::record::{self, version_of, Record};
use crate::store::{self, Data, Namespace};
use bytes::Bytes;
use fskv_gateway::RequestBody;
use fskv_proto::meta::{Expected, Inode};
use fskv_types::InodeId;
use futures::StreamExt;
use http::header::{HeaderName, CONTENT_TYPE};
use http::{Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn frame_headers(extra: Vec<(HeaderName, String)>) -> Vec<(HeaderName, String)> {
    let mut h = vec![(CONTENT_TYPE, FRAME_CONTENT_TYPE.to_string())];
    h.extend(extra);
    h
}

fn expected_of(h: &ItemHead) -> Option<Expected> {
    if h.if_absent {
        Some(Expected::Absent)
    } else {
        h.if_match.map(|v| Expected::Inode { id: InodeId(v.inode), version: v.version })
    }
}

/// What a lookup of a batch found.
enum Found {
    Live(Inode),
    Missing,
    Failed,
}

impl Kv {
    pub async fn batch(&self, ns: &str, op: Op, body: RequestBody) -> Result<Response<KvBody>> {
        let ns = self.store.namespace(ns).await?;
        if op == Op::Put {
            return self.batch_put(&ns, body).await;
        }
        let bytes = collect(body).await?;
        let (header, items) = frame::decode_request(op, self.cfg.limits.frame(), &bytes)?;
        match op {
            Op::Get => self.batch_get(&ns, header, items).await,
            Op::Exists => self.batch_exists(&ns, header, items).await,
            _ => self.batch_delete(&ns, header, items).await,
        }
    }

    /// Looks up every key: `Live` unless missing or expired.
    async fn find_many(&self, ns: &Namespace, items: &[(ItemHead, Bytes)]) -> Vec<Found> {
        let paths: Vec<KeyPath> = items.iter().map(|(h, _)| KeyPath::of(&h.key)).collect();
        let now = record::now_ns();
        self.store
            .lookup_many(ns, &paths)
            .await
            .into_iter()
            .map(|r| match r {
                Ok(Some((inode, rec))) if !rec.expired(now) => Found::Live(inode),
                Ok(_) => Found::Missing,
                Err(e) => {
                    tracing::warn!(error = %e, "batch lookup failed");
                    Found::Failed
                }
            })
            .collect()
    }

    async fn batch_get(&self, ns: &Namespace, header: BatchHeader, items: Vec<(ItemHead, Bytes)>) -> Result<Response<KvBody>> {
        let found = self.find_many(ns, &items).await;
        let mut statuses = Vec::with_capacity(found.len());
        let mut broken = false;
        for f in &found {
            let s = match f {
                _ if broken => Status::Skipped,
                Found::Live(_) => Status::Ok,
                Found::Missing => Status::NotFound,
                Found::Failed => Status::Error,
            };
            if s != Status::Ok && header.prefix_mode() {
                broken = true;
            }
            statuses.push(s);
        }
        let mut tally = Tally::default();
        let mut segments = vec![Segment::Ready(frame::response_header(Op::Get, statuses.len() as u32))];
        let mut total = frame::HEADER_BYTES as u64 + frame::TRAILER_BYTES as u64;
        let mut checks = Vec::new();
        // The largest chunk of the values read: the readahead counts reads of it.
        let mut chunk_bytes = 4096u64;
        let mut streamed: Vec<Vec<u8>> = Vec::new();
        {
            let mut acc = self.accesses.lock();
            let now = record::now_ns();
            for ((item, f), s) in items.iter().zip(found).zip(&statuses) {
                tally.add(*s);
                total += frame::ITEM_HEAD_BYTES as u64;
                let (Found::Live(inode), Status::Ok) = (f, s) else {
                    if *s == Status::NotFound {
                        acc.miss(&ns.name);
                    }
                    segments.push(Segment::Ready(frame::response_item(*s, b"", Version::default(), 0, 0)));
                    continue;
                };
                let size = inode.size_bytes();
                total += size;
                acc.hit(&ns.name, &item.0.key, inode.id.0, now);
                segments.push(Segment::Ready(frame::response_item(Status::Ok, b"", version_of(&inode), inode.mtime_ns, size)));
                if let Some(d) = inode.file().and_then(|f| f.inline.as_ref()) {
                    segments.push(Segment::Ready(Bytes::copy_from_slice(d)));
                    continue;
                }
                let id = inode.id;
                let handle = match self.store.fs.reader(inode) {
                    Ok(h) => Arc::new(h),
                    Err(e) => return Err(KvError::from_code(e.code(), "batch get", KvError::NoSuchKey)),
                };
                // One read per chunk, as a single GET: each reply goes out
                // as it came, never concatenated into a bigger buffer.
                let chunk = u64::from(handle.layout().chunk_size_bytes).max(4096);
                chunk_bytes = chunk_bytes.max(chunk);
                read_segments(&handle, 0, size, chunk, &mut segments);
                checks.push(id);
                acc.begin_read(&ns.name, &item.0.key, id.0, now);
                streamed.push(item.0.key.to_vec());
            }
        }
        segments.extend(checks.into_iter().map(Segment::CheckLinked));
        segments.push(Segment::Ready(frame::trailer(tally.ok, tally.prefix, 0)));
        let readahead = (self.cfg.limits.batch_readahead_bytes / chunk_bytes).max(2) as usize;
        let kv = self.clone();
        let ns_name = ns.name.clone();
        let body = stream_segments(self.store.clone(), segments, readahead, Some(total), move || {
            let mut acc = kv.accesses.lock();
            let now = record::now_ns();
            for k in &streamed {
                acc.end_read(&ns_name, k, now);
            }
        });
        Ok(respond(StatusCode::OK, frame_headers(vec![(H_PREFIX_COUNT, tally.prefix.to_string())]), body))
    }

    async fn batch_exists(&self, ns: &Namespace, header: BatchHeader, items: Vec<(ItemHead, Bytes)>) -> Result<Response<KvBody>> {
        let lease = header.lease_ms > 0;
        if lease {
            // The lease is recorded before the keys are looked up (see maintain.rs).
            let until = record::now_ns() + u64::from(header.lease_ms) * 1_000_000;
            let keys: Vec<&[u8]> = items.iter().map(|(h, _)| &h.key[..]).collect();
            self.write_lease(ns, &keys, until).await?;
        }
        let found = self.find_many(ns, &items).await;
        let mut body = Vec::with_capacity(frame::HEADER_BYTES + items.len() * frame::ITEM_HEAD_BYTES + frame::TRAILER_BYTES);
        body.extend_from_slice(&frame::response_header(Op::Exists, items.len() as u32));
        let mut tally = Tally::default();
        let mut broken = false;
        {
            let mut acc = self.accesses.lock();
            let now = record::now_ns();
            for ((item, _), f) in items.iter().zip(&found) {
                let (s, inode) = match f {
                    _ if broken => (Status::Skipped, None),
                    Found::Live(i) if lease && record::is_condemned(i) => (Status::NotFound, None),
                    Found::Live(i) => (Status::Ok, Some(i)),
                    Found::Missing => (Status::NotFound, None),
                    Found::Failed => (Status::Error, None),
                };
                if s != Status::Ok && header.prefix_mode() {
                    broken = true;
                }
                tally.add(s);
                match inode {
                    Some(i) => {
                        acc.hit(&ns.name, &item.key, i.id.0, now);
                        body.extend_from_slice(&frame::response_item(s, b"", version_of(i), i.mtime_ns, 0));
                    }
                    None => {
                        if s == Status::NotFound {
                            acc.miss(&ns.name);
                        }
                        body.extend_from_slice(&frame::response_item(s, b"", Version::default(), 0, 0));
                    }
                }
            }
        }
        body.extend_from_slice(&frame::trailer(tally.ok, tally.prefix, 0));
        Ok(respond(StatusCode::OK, frame_headers(vec![(H_PREFIX_COUNT, tally.prefix.to_string())]), KvBody::full(body)))
    }

    /// Records a lease on `keys` until `until_ns`: an access log flagged
    /// `LEASE`, published before the caller looks the keys up.
    pub async fn write_lease(&self, ns: &Namespace, keys: &[&[u8]], until_ns: u64) -> Result<()> {
        let now = record::now_ns();
        let log = Log {
            process: self.process_id,
            seq: self.log_seq.fetch_add(1, Ordering::Relaxed),
            at_ns: now,
            hits: 0,
            misses: 0,
            entries: keys
                .iter()
                .map(|k| LogEntry { key: k.to_vec(), last_ns: now, lease_until_ns: until_ns, ..Default::default() })
                .collect(),
        };
        if let Some(m) = &self.maint {
            m.pin(&ns.name, keys, until_ns);
        }
        let dir = self.recency_dir(&ns.name).await?;
        self.store.write_file(dir, &log.file_name(), log.encode()).await
    }

    /// `ROOT/.fskv-kv/recency/<ns>`, made if missing.
    pub async fn recency_dir(&self, ns: &str) -> Result<InodeId> {
        store::mkdir_p(&self.store.fs, self.store.system.recency, ns).await.map_err(KvError::Unavailable)
    }

    async fn batch_delete(&self, ns: &Namespace, _header: BatchHeader, items: Vec<(ItemHead, Bytes)>) -> Result<Response<KvBody>> {
        let _writing: Vec<_> = match &self.maint {
            Some(m) => items.iter().map(|(h, _)| m.write_guard(&ns.name, &h.key)).collect(),
            None => Vec::new(),
        };
        let heads: Vec<ItemHead> = items.into_iter().map(|(h, _)| h).collect();
        let statuses: Vec<Status> = futures::stream::iter(heads)
            .map(|h: ItemHead| async move {
                let path = KeyPath::of(&h.key);
                match self.store.unlink(ns, &path, expected_of(&h)).await {
                    Ok(true) => {
                        if let Some(m) = &self.maint {
                            m.on_delete(&ns.name, &h.key);
                        }
                        Status::Ok
                    }
                    Ok(false) => Status::NotFound,
                    Err(KvError::PreconditionFailed(_)) => Status::PreconditionFailed,
                    Err(e) => {
                        tracing::warn!(error = %e, "batch delete item failed");
                        Status::Error
                    }
                }
            })
            .buffered(self.cfg.limits.batch_parallelism)
            .collect()
            .await;
        if statuses.contains(&Status::Ok) {
            self.notify_change();
        }
        Ok(self.statuses_response(Op::Delete, &statuses, &[]))
    }

    fn statuses_response(&self, op: Op, statuses: &[Status], inodes: &[Option<Inode>]) -> Response<KvBody> {
        let mut body = Vec::with_capacity(frame::HEADER_BYTES + statuses.len() * frame::ITEM_HEAD_BYTES + frame::TRAILER_BYTES);
        body.extend_from_slice(&frame::response_header(op, statuses.len() as u32));
        let mut tally = Tally::default();
        for (i, s) in statuses.iter().enumerate() {
            tally.add(*s);
            let (v, index) = match inodes.get(i).and_then(Option::as_ref) {
                Some(inode) => (version_of(inode), inode.mtime_ns),
                None => (Version::default(), 0),
            };
            body.extend_from_slice(&frame::response_item(*s, b"", v, index, 0));
        }
        body.extend_from_slice(&frame::trailer(tally.ok, tally.prefix, 0));
        respond(StatusCode::OK, frame_headers(vec![]), KvBody::full(body))
    }

    async fn batch_put(&self, ns: &Namespace, mut body: RequestBody) -> Result<Response<KvBody>> {
        let limits = &self.cfg.limits;
        let mut dec = RequestDecoder::new(Op::Put, limits.frame());
        struct Pending {
            head: ItemHead,
            rec: Record,
            data: Option<Data>,
            size: u64,
        }
        let mut done: Vec<Pending> = Vec::new();
        let mut cur: Option<(ItemHead, Record, ValueWriter, u64)> = None;
        let mut guards = Vec::new();
        let default_ttl = (ns.config.default_ttl_ms > 0).then_some(ns.config.default_ttl_ms);
        // Temp inodes of the values: the namespace's tenant's.
        let owned = self.store.owned_by(ns);
        let mut ended = false;
        loop {
            while let Some(ev) = dec.next()? {
                match ev {
                    Event::Header(_) | Event::End => {}
                    Event::Item(h) => {
                        let now = record::now_ns();
                        let ttl = h.ttl_ms.or(default_ttl);
                        let rec = Record { expires_ns: ttl.map(|t| now.saturating_add(t.saturating_mul(1_000_000))), ..Default::default() };
                        if let Some(m) = &self.maint {
                            guards.push(m.write_guard(&ns.name, &h.key));
                            m.admit(ns, &h.key, h.value_len).await?;
                        }
                        let w = ValueWriter::new(
                            owned.clone(),
                            ns.dir,
                            store::value_mode(&rec),
                            limits.max_value_bytes,
                            limits.max_inflight_write_bytes,
                        );
                        let left = h.value_len;
                        if left == 0 {
                            done.push(Pending { head: h, rec, data: Some(w.finish().await?), size: 0 });
                        } else {
                            cur = Some((h, rec, w, left));
                        }
                    }
                    Event::Value(v) => {
                        let Some((_, _, w, left)) = cur.as_mut() else {
                            return Err(KvError::InvalidFrame("value bytes outside an item".into()));
                        };
                        *left -= v.len() as u64;
                        w.push(v).await?;
                        if *left == 0 {
                            if let Some((h, rec, w, _)) = cur.take() {
                                let size = w.size;
                                done.push(Pending { head: h, rec, data: Some(w.finish().await?), size });
                            }
                        }
                    }
                }
            }
            if ended {
                break;
            }
            match next_data(&mut body).await {
                Some(piece) => dec.push(&piece?),
                None => ended = true,
            }
        }
        dec.finish()?;
        // The whole body decoded: publish.
        let results: Vec<(Status, Option<Inode>)> = futures::stream::iter(done)
            .map(|mut p: Pending| async move {
                let Some(data) = p.data.take() else { return (Status::Error, None) };
                let path = KeyPath::of(&p.head.key);
                let index = self.clock.next();
                match self.store.publish(ns, &path, &data, &p.rec, expected_of(&p.head), index).await {
                    Ok(inode) => {
                        if let Some(m) = &self.maint {
                            m.on_put(&ns.name, &p.head.key, p.size, version_of(&inode), p.rec.expires_ns);
                        }
                        (Status::Ok, Some(inode))
                    }
                    Err(KvError::PreconditionFailed(_)) if p.head.if_absent => (Status::Exists, None),
                    Err(KvError::PreconditionFailed(_)) => (Status::PreconditionFailed, None),
                    Err(e) => {
                        tracing::warn!(error = %e, "batch put item failed");
                        (Status::Error, None)
                    }
                }
            })
            .buffered(limits.batch_parallelism)
            .collect()
            .await;
        drop(guards);
        if results.iter().any(|(s, _)| *s == Status::Ok) {
            self.notify_change();
        }
        let (statuses, inodes): (Vec<Status>, Vec<Option<Inode>>) = results.into_iter().unzip();
        Ok(self.statuses_response(Op::Put, &statuses, &inodes))
    }
}
