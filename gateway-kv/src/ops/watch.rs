//! Watches by long poll (native API and Consul blocking queries).
//!
//! | watched | index | returns when |
//! |---|---|---|
//! | a key | its modify index (mtime ns); the namespace directory's mtime while the key is absent | the index differs from the `index` given, or `wait_ms` passed (the current state is returned either way) |
//! | a prefix | max(modify indexes of its keys, mtimes of the directories holding them) + the number of keys (so removing a key changes it too) | same |
//!
//! Readers serve watches; nothing in a reader learns of a change made by
//! the writer process, so a watch looks again every
//! `watch_poll_interval_ms` (one lookup for a key, one scan of at most
//! `max_watch_keys` keys for a prefix); a change made through the same
//! process wakes it at once. Directory mtimes move in 1 ms steps (meta's
//! `DIR_TIME_GRANULARITY_NS`), which the `+ count` term makes harmless for
//! single removals.

use super::scan::{ScanItem, ScanParams};
use super::{respond, Kv, FRAME_CONTENT_TYPE, H_INDEX};
use crate::body::KvBody;
use crate::error::{KvError, Result};
use crate::frame::{self, Op};
use crate::record::Record;
use crate::route::Query;
use crate::store::Namespace;
use fskv_proto::meta::Inode;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{Response, StatusCode};
use std::future::Future;
use std::time::Duration;

impl Kv {
    /// A key's index and live file.
    pub async fn key_state(&self, ns: &Namespace, key: &[u8]) -> Result<(u64, Option<(Inode, Record)>)> {
        match self.find(ns, key).await? {
            Some((inode, rec)) => Ok((inode.mtime_ns, Some((inode, rec)))),
            None => {
                let dir = self
                    .store
                    .fs
                    .meta()
                    .stat(ns.dir)
                    .await
                    .map_err(|e| KvError::from_code(e.code(), "watch", KvError::NoSuchNamespace(ns.name.clone())))?;
                Ok((dir.mtime_ns, None))
            }
        }
    }

    /// Every key with `prefix` (at most `max_watch_keys`) and the prefix's index.
    pub async fn prefix_state(&self, ns: &Namespace, prefix: &[u8], values: bool) -> Result<(u64, Vec<ScanItem>)> {
        let max = self.cfg.limits.max_watch_keys;
        let p = ScanParams { prefix: prefix.to_vec(), start: None, end: None, limit: max, values };
        let page = self.scan_page(ns, &p).await?;
        if page.more {
            return Err(KvError::InvalidArgument(format!("more than {max} keys under this prefix; watch or list a narrower one")));
        }
        let dir = self
            .store
            .fs
            .meta()
            .stat(ns.dir)
            .await
            .map_err(|e| KvError::from_code(e.code(), "watch", KvError::NoSuchNamespace(ns.name.clone())))?;
        let max_index = page.items.iter().map(|i| i.index).chain([dir.mtime_ns, page.max_dir_mtime_ns]).max().unwrap_or(0);
        Ok((max_index.wrapping_add(page.items.len() as u64), page.items))
    }

    /// Probes until the index differs from `index` (none: at once) or
    /// `wait_ms` passed; the last probe's answer.
    pub async fn wait_change<T, F, Fut>(&self, index: Option<u64>, wait_ms: u64, mut probe: F) -> Result<(u64, T)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(u64, T)>>,
    {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms.min(self.cfg.limits.max_watch_wait_ms));
        let poll = Duration::from_millis(self.cfg.limits.watch_poll_interval_ms);
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (now_index, t) = probe().await?;
            if index != Some(now_index) || tokio::time::Instant::now() >= deadline {
                return Ok((now_index, t));
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(poll) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    fn watch_args(&self, q: &Query) -> Result<(Option<u64>, u64)> {
        let wait = q.u64("wait_ms")?.unwrap_or(self.cfg.limits.default_watch_wait_ms);
        if wait > self.cfg.limits.max_watch_wait_ms {
            return Err(KvError::InvalidArgument(format!("wait_ms is above the limit {}", self.cfg.limits.max_watch_wait_ms)));
        }
        Ok((q.u64("index")?, wait))
    }

    /// `GET /v1/kv/{ns}/{key}?watch&index=I&wait_ms=T`: the key (as a GET
    /// answers) once its index is not `I`.
    pub async fn watch(&self, ns: &str, key: &[u8], parts: &Parts, q: &Query) -> Result<Response<KvBody>> {
        let ns = self.store.namespace(ns).await?;
        self.key_path(key)?;
        let (index, wait) = self.watch_args(q)?;
        let (now_index, found) = self.wait_change(index, wait, || self.key_state(&ns, key)).await?;
        match found {
            Some((inode, rec)) => self.value_response(&ns, key, inode, rec, parts, false).await,
            None => Err(KvError::NoSuchKeyAt { index: now_index }),
        }
    }

    /// `GET /v1/kv/{ns}?watch&prefix=P&index=I&wait_ms=T`: the keys of the
    /// prefix (scan framing, no values) once the prefix's index is not `I`.
    pub async fn watch_prefix(&self, ns: &str, q: &Query) -> Result<Response<KvBody>> {
        let ns = self.store.namespace(ns).await?;
        let (index, wait) = self.watch_args(q)?;
        let prefix = q.bytes("prefix").unwrap_or_default().to_vec();
        let (now_index, items) = self.wait_change(index, wait, || self.prefix_state(&ns, &prefix, false)).await?;
        let mut body = Vec::new();
        body.extend_from_slice(&frame::response_header(Op::Scan, items.len() as u32));
        for i in &items {
            body.extend_from_slice(&frame::response_item(i.status, &i.key, i.version, i.index, 0));
        }
        let n = items.len() as u32;
        body.extend_from_slice(&frame::trailer(n, n, 0));
        Ok(respond(StatusCode::OK, vec![(CONTENT_TYPE, FRAME_CONTENT_TYPE.into()), (H_INDEX, now_index.to_string())], KvBody::full(body)))
    }
}
