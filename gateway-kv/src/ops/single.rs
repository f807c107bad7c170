//! GET, HEAD, PUT and DELETE of one key.
//!
//! | request | rule |
//! |---|---|
//! | PUT | atomic: the value is written to a temp inode (or kept in memory up to 4 KiB) and published in one meta transaction with its record; a failed body leaves nothing visible |
//! | PUT `If-None-Match: *` | create-only: 412 if the key exists (checked in the publishing transaction) |
//! | PUT `If-Match: <etag>` | compare-and-swap: 412 unless the key has exactly that version (checked in the publishing transaction) |
//! | PUT `?ttl_ms=` / `X-Kv-Ttl-Ms` | expires that long after the put (else the namespace's `default_ttl_ms`) |
//! | GET / HEAD | 404 for a missing or expired key; `Range: bytes=a-b`, `bytes=a-` or `bytes=-n` (one range) → 206, 416 outside the value; `If-None-Match` → 304, `If-Match` → 412 |
//! | DELETE | 204; 404 if there was no key; `If-Match` → compare-and-delete (412) |
//!
//! Every value response carries `ETag` (the version), `X-Kv-Index` (the
//! modify index) and, with a TTL, `X-Kv-Expires-At-Ms`.

use super::{header, next_data, respond, Kv, H_EXPIRES, H_INDEX, H_TTL};
use crate::body::{read_segments, stream_segments, KvBody, Segment, ValueWriter};
use crate::error::{KvError, Result};
use crate::frame::Version;
use crate::record::{self, etag, parse_etag, version_of, Record};
use crate::route::Query;
use crate::store::{self, Namespace};
use bytes::Bytes;
use fskv_gateway::RequestBody;
use fskv_proto::meta::{Expected, Inode};
use http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG};
use http::request::Parts;
use http::{Response, StatusCode};
use std::sync::Arc;

/// The ETags of an `If-Match` / `If-None-Match` header (`*` = any).
pub enum Condition {
    Any,
    Versions(Vec<Version>),
}

pub fn condition(parts: &Parts, name: &str) -> Result<Option<Condition>> {
    let Some(v) = parts.headers.get(name) else { return Ok(None) };
    let s = v.to_str().map_err(|_| KvError::InvalidArgument(format!("{name} is not ASCII")))?.trim();
    if s == "*" {
        return Ok(Some(Condition::Any));
    }
    let mut out = Vec::new();
    for t in s.split(',') {
        out.push(parse_etag(t).ok_or_else(|| KvError::InvalidArgument(format!("{name}: {t:?} is not a version this gateway made")))?);
    }
    Ok(Some(Condition::Versions(out)))
}

impl Condition {
    fn holds(&self, v: Version) -> bool {
        match self {
            Condition::Any => true,
            Condition::Versions(vs) => vs.contains(&v),
        }
    }
}

/// The precondition of a put / delete from `If-Match` and `If-None-Match: *`.
pub fn write_expectation(parts: &Parts) -> Result<Option<Expected>> {
    let if_match = condition(parts, "if-match")?;
    let if_none = condition(parts, "if-none-match")?;
    match (if_match, if_none) {
        (Some(_), Some(_)) => Err(KvError::InvalidArgument("If-Match and If-None-Match together".into())),
        (None, Some(Condition::Any)) => Ok(Some(Expected::Absent)),
        (None, Some(Condition::Versions(_))) => Err(KvError::InvalidArgument("a write takes If-None-Match: * only".into())),
        (Some(Condition::Versions(v)), None) if v.len() == 1 => {
            Ok(Some(Expected::Inode { id: fskv_types::InodeId(v[0].inode), version: v[0].version }))
        }
        (Some(Condition::Any), None) => Err(KvError::InvalidArgument("If-Match: * is not supported; give the version".into())),
        (Some(_), None) => Err(KvError::InvalidArgument("If-Match takes one version".into())),
        (None, None) => Ok(None),
    }
}

/// `Range: bytes=…` against a value of `size` bytes: `[start, end)`.
pub fn parse_range(v: Option<&http::HeaderValue>, size: u64) -> Result<Option<(u64, u64)>> {
    let Some(v) = v else { return Ok(None) };
    let bad = || KvError::InvalidRange("Range must be bytes=FIRST-LAST, bytes=FIRST- or bytes=-SUFFIX (one range)".into());
    let s = v.to_str().map_err(|_| bad())?.trim();
    let spec = s.strip_prefix("bytes=").ok_or_else(bad)?;
    if spec.contains(',') {
        return Err(bad());
    }
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let num = |x: &str| x.trim().parse::<u64>().map_err(|_| bad());
    let (start, end) = match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, true) => return Err(bad()),
        (true, false) => {
            let n = num(b)?;
            if n == 0 || size == 0 {
                return Err(KvError::RangeNotSatisfiable { size });
            }
            (size.saturating_sub(n), size)
        }
        (false, true) => (num(a)?, size),
        (false, false) => {
            let (x, y) = (num(a)?, num(b)?);
            if y < x {
                return Err(bad());
            }
            (x, y.saturating_add(1).min(size))
        }
    };
    if start >= size {
        return Err(KvError::RangeNotSatisfiable { size });
    }
    Ok(Some((start, end)))
}

/// TTL of a put: `?ttl_ms=`, `X-Kv-Ttl-Ms`, else the namespace default.
pub fn ttl_ms(kv: &Kv, parts: &Parts, query: &Query, ns: &Namespace) -> Result<Option<u64>> {
    let from_header = match header(parts, "x-kv-ttl-ms") {
        None => None,
        Some(s) => Some(s.trim().parse::<u64>().map_err(|_| KvError::InvalidArgument(format!("{H_TTL} must be an integer")))?),
    };
    let t = query.u64("ttl_ms")?.or(from_header).or((ns.config.default_ttl_ms > 0).then_some(ns.config.default_ttl_ms));
    match t {
        Some(0) => Err(KvError::InvalidArgument("ttl_ms must be at least 1".into())),
        Some(t) if t > kv.cfg.limits.max_ttl_ms => {
            Err(KvError::InvalidArgument(format!("ttl_ms is above the limit {}", kv.cfg.limits.max_ttl_ms)))
        }
        t => Ok(t),
    }
}

/// Headers of a value: version, index, expiry.
pub fn value_headers(inode: &Inode, rec: &Record) -> Vec<(http::HeaderName, String)> {
    let mut h = vec![(ETAG, etag(version_of(inode))), (H_INDEX, inode.mtime_ns.to_string())];
    if let Some(x) = rec.expires_ns {
        h.push((H_EXPIRES, (x / 1_000_000).to_string()));
    }
    h
}

impl Kv {
    /// The live file of a key (absent or expired: `None`).
    pub async fn find(&self, ns: &Namespace, key: &[u8]) -> Result<Option<(Inode, Record)>> {
        let path = self.key_path(key)?;
        let Some(inode) = self.store.lookup(ns, &path).await? else { return Ok(None) };
        let rec = self.store.record(&inode).await?;
        if rec.expired(record::now_ns()) {
            return Ok(None);
        }
        Ok(Some((inode, rec)))
    }

    pub async fn get(&self, ns: &str, key: &[u8], parts: &Parts, head_only: bool) -> Result<Response<KvBody>> {
        let ns = self.store.namespace(ns).await?;
        let Some((inode, rec)) = self.find(&ns, key).await? else {
            self.miss(&ns.name);
            return Err(KvError::NoSuchKey);
        };
        self.value_response(&ns, key, inode, rec, parts, head_only).await
    }

    /// The response for a found value (GET, HEAD, a watch that fired).
    pub async fn value_response(
        &self,
        ns: &Namespace,
        key: &[u8],
        inode: Inode,
        rec: Record,
        parts: &Parts,
        head_only: bool,
    ) -> Result<Response<KvBody>> {
        let version = version_of(&inode);
        if let Some(c) = condition(parts, "if-match")? {
            if !c.holds(version) {
                return Err(KvError::PreconditionFailed("If-Match: the key has another version".into()));
            }
        }
        if let Some(c) = condition(parts, "if-none-match")? {
            if c.holds(version) {
                return Ok(respond(StatusCode::NOT_MODIFIED, value_headers(&inode, &rec), KvBody::empty()));
            }
        }
        let size = inode.size_bytes();
        let range = parse_range(parts.headers.get(http::header::RANGE), size)?;
        let (start, end) = range.unwrap_or((0, size));
        let len = end - start;
        let mut headers = value_headers(&inode, &rec);
        headers.push((CONTENT_TYPE, "application/octet-stream".into()));
        headers.push((ACCEPT_RANGES, "bytes".into()));
        headers.push((CONTENT_LENGTH, len.to_string()));
        let status = if range.is_some() {
            headers.push((CONTENT_RANGE, format!("bytes {start}-{}/{size}", end.saturating_sub(1))));
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        };
        if head_only {
            self.hit(&ns.name, key, inode.id.0);
            return Ok(respond(status, headers, KvBody::empty()));
        }
        let inline = inode.file().and_then(|f| f.inline.as_ref()).map(|d| Bytes::copy_from_slice(d));
        if let Some(data) = inline {
            self.hit(&ns.name, key, inode.id.0);
            let e = (end as usize).min(data.len());
            let s = (start as usize).min(e);
            return Ok(respond(status, headers, KvBody::full(data.slice(s..e))));
        }
        let inode_id = inode.id;
        let handle = Arc::new(self.store.fs.reader(inode).map_err(|e| KvError::from_code(e.code(), "get", KvError::NoSuchKey))?);
        let limits = &self.cfg.limits;
        if len <= limits.whole_value_max_bytes {
            self.hit(&ns.name, key, inode_id.0);
            let data = handle.read_at(start, len).await.map_err(|e| KvError::from_code(e.code(), "get", KvError::NoSuchKey))?;
            // Replaced or removed meanwhile (its chunks may be gone): not this value.
            match self.store.fs.meta().stat(inode_id).await {
                Ok(i) if i.nlink > 0 && data.len() as u64 == len => {}
                _ => return Err(KvError::Unavailable("the value changed while it was read; retry".into())),
            }
            return Ok(respond(status, headers, KvBody::full(data)));
        }
        // Streamed: a read in flight, reported as such in every access log until done.
        {
            let mut a = self.accesses.lock();
            let now = record::now_ns();
            a.hit(&ns.name, key, inode_id.0, now);
            a.begin_read(&ns.name, key, inode_id.0, now);
        }
        let chunk = u64::from(handle.layout().chunk_size_bytes).max(4096);
        let mut segments = Vec::new();
        read_segments(&handle, start, end, chunk, &mut segments);
        segments.push(Segment::CheckLinked(inode_id));
        let kv = self.clone();
        let (ns_name, key_owned) = (ns.name.clone(), key.to_vec());
        let body = stream_segments(self.store.clone(), segments, limits.readahead_chunks, Some(len), move || {
            kv.accesses.lock().end_read(&ns_name, &key_owned, record::now_ns());
        });
        Ok(respond(status, headers, body))
    }

    pub async fn put(&self, ns: &str, key: &[u8], parts: &Parts, query: &Query, mut body: RequestBody) -> Result<Response<KvBody>> {
        let ns = self.store.namespace(ns).await?;
        let path = self.key_path(key)?;
        let expected = write_expectation(parts)?;
        let ttl = ttl_ms(self, parts, query, &ns)?;
        let max = self.cfg.limits.max_value_bytes;
        let declared = header(parts, "content-length").and_then(|s| s.trim().parse::<u64>().ok());
        if let Some(len) = declared.filter(|l| *l > max) {
            return Err(KvError::ValueTooLarge { len: Some(len), max });
        }
        let now = record::now_ns();
        let rec = Record { expires_ns: ttl.map(|t| now.saturating_add(t.saturating_mul(1_000_000))), ..Default::default() };
        let _writing = self.maint.as_ref().map(|m| m.write_guard(&ns.name, key));
        if let Some(m) = &self.maint {
            m.admit(&ns, key, declared.unwrap_or(0)).await?;
        }
        let limits = &self.cfg.limits;
        let mut w = ValueWriter::new(self.store.owned_by(&ns), ns.dir, store::value_mode(&rec), max, limits.max_inflight_write_bytes);
        while let Some(piece) = next_data(&mut body).await {
            w.push(piece?).await?;
        }
        let size = w.size;
        let data = w.finish().await?;
        let index = self.clock.next();
        let inode = self.store.publish(&ns, &path, &data, &rec, expected, index).await?;
        if let Some(m) = &self.maint {
            m.on_put(&ns.name, key, size, version_of(&inode), rec.expires_ns);
        }
        self.notify_change();
        Ok(respond(StatusCode::OK, value_headers(&inode, &rec), KvBody::empty()))
    }

    pub async fn delete(&self, ns: &str, key: &[u8], parts: &Parts) -> Result<Response<KvBody>> {
        let ns = self.store.namespace(ns).await?;
        let path = self.key_path(key)?;
        let expected = write_expectation(parts)?;
        if matches!(expected, Some(Expected::Absent)) {
            return Err(KvError::InvalidArgument("a delete takes If-Match, not If-None-Match".into()));
        }
        let _writing = self.maint.as_ref().map(|m| m.write_guard(&ns.name, key));
        let removed = self.store.unlink(&ns, &path, expected).await?;
        if !removed {
            return Err(KvError::NoSuchKey);
        }
        if let Some(m) = &self.maint {
            m.on_delete(&ns.name, key);
        }
        self.notify_change();
        Ok(respond(StatusCode::NO_CONTENT, vec![], KvBody::empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> http::HeaderValue {
        http::HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range(Some(&hv("bytes=0-9")), 100).unwrap(), Some((0, 10)));
        assert_eq!(parse_range(Some(&hv("bytes=90-")), 100).unwrap(), Some((90, 100)));
        assert_eq!(parse_range(Some(&hv("bytes=-10")), 100).unwrap(), Some((90, 100)));
        assert_eq!(parse_range(Some(&hv("bytes=-1000")), 100).unwrap(), Some((0, 100)));
        assert_eq!(parse_range(Some(&hv("bytes=50-1000")), 100).unwrap(), Some((50, 100)));
        assert_eq!(parse_range(None, 100).unwrap(), None);
        for (r, status) in [
            ("bytes=100-", 416),
            ("bytes=-0", 416),
            ("bytes=5-1", 400),
            ("bytes=0-1,3-4", 400),
            ("items=0-1", 400),
            ("bytes=x-1", 400),
            ("bytes=-", 400),
        ] {
            assert_eq!(parse_range(Some(&hv(r)), 100).unwrap_err().status().as_u16(), status, "{r}");
        }
        assert_eq!(parse_range(Some(&hv("bytes=0-")), 0).unwrap_err().status().as_u16(), 416);
    }
}
