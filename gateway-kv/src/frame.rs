//! The binary framing of batch requests and responses (and scan results).
//! Pure: an incremental request decoder (a put batch streams through it, so
//! values are never buffered whole) and the response encoder/decoder. All
//! integers little-endian.
//!
//! **Request** (`POST /v1/kv/{ns}?batch=get|put|delete|exists`):
//!
//! | field | bytes | rule |
//! |---|---|---|
//! | magic | 4 | `FKVB` |
//! | version | 1 | 1 |
//! | op | 1 | 1 get, 2 put, 3 delete, 4 exists; must match `?batch=` |
//! | flags | 2 | bit 0 `PREFIX` (get, exists): stop at the first key that is missing, later items answer `Skipped`; other bits 0 |
//! | count | 4 | 1..=`max_batch_items` |
//! | lease_ms | 4 | exists only (else 0): pin the leading existing keys against eviction this long (≤ `max_lease_ms`) |
//! | *count items:* | | |
//! | key_len | 2 | 1..=`max_key_bytes` |
//! | item_flags | 1 | put: bit 0 `IF_ABSENT` (create-only; an existing key answers `Exists`, nothing written), bit 1 `IF_MATCH`, bit 2 `TTL`; delete: bit 1 `IF_MATCH`; get/exists: 0 |
//! | reserved | 1 | 0 |
//! | if_match | 16 | with `IF_MATCH`: the version (inode id u64, inode version u64) the key must have |
//! | ttl_ms | 8 | with `TTL`: 1..=`max_ttl_ms` |
//! | value_len | 8 | put only: ≤ `max_value_bytes`; the values of a batch ≤ `max_batch_put_bytes` |
//! | key | key_len | |
//! | value | value_len | put only |
//!
//! The body must end right after the last item. `IF_ABSENT` and `IF_MATCH`
//! together are refused.
//!
//! **Response** (status 200 whenever the request was well-formed; each item
//! has its own status):
//!
//! | field | bytes | |
//! |---|---|---|
//! | magic, version, op, reserved | 4+1+1+2 | `FKVR`, 1, the request's op (5 for a scan) |
//! | count, reserved | 4+4 | items that follow (a batch: one per request item, in order) |
//! | *count items:* status, reserved, key_len | 1+1+2 | status per the table below; key_len > 0 in scans (the key follows) |
//! | version | 16 | inode id, inode version (the ETag; zeros when absent) |
//! | index | 8 | the key's modify index (mtime, ns); 0 when absent |
//! | value_len | 8 | get / scan with values: the value bytes that follow; else 0 |
//! | key, value | key_len + value_len | |
//! | trailer | 16 | `FKVE`, ok (u32: items `Ok` or `Exists`), prefix (u32: leading such items), flags (u32: bit 0 `MORE` — a scan stopped at its limit) |
//!
//! A response cut before its trailer is incomplete (a storage failure while
//! a value was streamed aborts the connection): clients must treat it as an
//! error.
//!
//! | status | code | meaning |
//! |---|---|---|
//! | `Ok` | 0 | done / found |
//! | `NotFound` | 1 | no such key (or expired) |
//! | `Exists` | 2 | create-only put of a key that exists: nothing written (a success for idempotent writers) |
//! | `PreconditionFailed` | 3 | `IF_MATCH` did not hold |
//! | `Skipped` | 4 | after the first missing key in `PREFIX` mode |
//! | `Error` | 5 | this item failed inside the cluster (retry it) |
//! | `TooLarge` | 6 | scan with values: the value is above `max_scan_value_bytes` (GET it) |

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const REQUEST_MAGIC: &[u8; 4] = b"FKVB";
pub const RESPONSE_MAGIC: &[u8; 4] = b"FKVR";
pub const TRAILER_MAGIC: &[u8; 4] = b"FKVE";
pub const VERSION: u8 = 1;
pub const HEADER_BYTES: usize = 16;
pub const TRAILER_BYTES: usize = 16;
/// Fixed part of a response item.
pub const ITEM_HEAD_BYTES: usize = 36;

pub const FLAG_PREFIX: u16 = 1;
pub const ITEM_IF_ABSENT: u8 = 1;
pub const ITEM_IF_MATCH: u8 = 2;
pub const ITEM_TTL: u8 = 4;
pub const TRAILER_MORE: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get = 1,
    Put = 2,
    Delete = 3,
    Exists = 4,
    Scan = 5,
}

impl Op {
    pub fn from_u8(b: u8) -> Option<Op> {
        Some(match b {
            1 => Op::Get,
            2 => Op::Put,
            3 => Op::Delete,
            4 => Op::Exists,
            5 => Op::Scan,
            _ => return None,
        })
    }

    /// The `?batch=` name.
    pub fn parse_name(s: &str) -> Option<Op> {
        Some(match s {
            "get" => Op::Get,
            "put" => Op::Put,
            "delete" => Op::Delete,
            "exists" => Op::Exists,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    Exists = 2,
    PreconditionFailed = 3,
    Skipped = 4,
    Error = 5,
    TooLarge = 6,
}

impl Status {
    pub fn from_u8(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::Exists,
            3 => Status::PreconditionFailed,
            4 => Status::Skipped,
            5 => Status::Error,
            6 => Status::TooLarge,
            _ => return None,
        })
    }

    /// Counts toward `ok` and `prefix` in the trailer.
    pub fn is_success(self) -> bool {
        matches!(self, Status::Ok | Status::Exists)
    }
}

/// A version as the frames carry it (the ETag's two numbers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Version {
    pub inode: u64,
    pub version: u64,
}

/// Limits the decoder enforces (from the gateway's configuration).
#[derive(Clone, Copy, Debug)]
pub struct FrameLimits {
    pub max_items: u32,
    pub max_key_bytes: usize,
    pub max_value_bytes: u64,
    pub max_batch_put_bytes: u64,
    pub max_ttl_ms: u64,
    pub max_lease_ms: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub op: Op,
    pub flags: u16,
    pub count: u32,
    pub lease_ms: u32,
}

impl BatchHeader {
    pub fn prefix_mode(&self) -> bool {
        self.flags & FLAG_PREFIX != 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemHead {
    pub key: Bytes,
    pub if_absent: bool,
    pub if_match: Option<Version>,
    pub ttl_ms: Option<u64>,
    /// Put only.
    pub value_len: u64,
}

/// What the decoder found next.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Header(BatchHeader),
    /// An item; for a put, `value_len` bytes of `Value` events follow.
    Item(ItemHead),
    Value(Bytes),
    /// The body ended right after the last item.
    End,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FrameError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, FrameError> {
    Err(FrameError(msg.into()))
}

#[derive(Debug)]
enum State {
    Header,
    ItemHead,
    Value { left: u64 },
    Done,
}

/// Incremental decoder of a request body: push bytes with
/// [`RequestDecoder::push`], take events with [`RequestDecoder::next`];
/// after the body ends, [`RequestDecoder::finish`].
#[derive(Debug)]
pub struct RequestDecoder {
    limits: FrameLimits,
    /// The op the URL names.
    expect: Op,
    buf: BytesMut,
    state: State,
    header: Option<BatchHeader>,
    items_seen: u32,
    value_bytes: u64,
}

impl RequestDecoder {
    pub fn new(expect: Op, limits: FrameLimits) -> Self {
        RequestDecoder { limits, expect, buf: BytesMut::new(), state: State::Header, header: None, items_seen: 0, value_bytes: 0 }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes held, not yet decoded (at most one item head, or a value piece).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next event the bytes pushed so far allow, or `None` (push more).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Event>, FrameError> {
        match self.state {
            State::Done => Ok(None),
            State::Header => {
                if self.buf.len() < HEADER_BYTES {
                    return Ok(None);
                }
                let mut h = self.buf.split_to(HEADER_BYTES);
                if &h[..4] != REQUEST_MAGIC {
                    return err("not a batch request: the body must start with FKVB");
                }
                h.advance(4);
                let version = h.get_u8();
                if version != VERSION {
                    return err(format!("batch frame version {version}: only 1 is known"));
                }
                let op = Op::from_u8(h.get_u8()).filter(|o| *o != Op::Scan);
                let flags = h.get_u16_le();
                let count = h.get_u32_le();
                let lease_ms = h.get_u32_le();
                let Some(op) = op else { return err("unknown batch op") };
                if op != self.expect {
                    return err(format!("the frame's op is {op:?}, the URL says {:?}", self.expect));
                }
                if flags & !FLAG_PREFIX != 0 || (flags & FLAG_PREFIX != 0 && !matches!(op, Op::Get | Op::Exists)) {
                    return err(format!("flags {flags:#x} are not valid for {op:?}"));
                }
                if count == 0 || count > self.limits.max_items {
                    return err(format!("{count} items; a batch has 1..={}", self.limits.max_items));
                }
                if lease_ms != 0 && op != Op::Exists {
                    return err("lease_ms is for exists batches only");
                }
                if lease_ms > self.limits.max_lease_ms {
                    return err(format!("lease_ms {lease_ms} is above the limit {}", self.limits.max_lease_ms));
                }
                let header = BatchHeader { op, flags, count, lease_ms };
                self.header = Some(header);
                self.state = State::ItemHead;
                Ok(Some(Event::Header(header)))
            }
            State::ItemHead => {
                let Some(h) = self.header else { return err("no header") };
                if self.items_seen == h.count {
                    if !self.buf.is_empty() {
                        return err("bytes after the last item");
                    }
                    return Ok(None);
                }
                if self.buf.len() < 4 {
                    return Ok(None);
                }
                let key_len = u16::from_le_bytes([self.buf[0], self.buf[1]]) as usize;
                let flags = self.buf[2];
                if self.buf[3] != 0 {
                    return err("item reserved byte must be 0");
                }
                let allowed = match h.op {
                    Op::Put => ITEM_IF_ABSENT | ITEM_IF_MATCH | ITEM_TTL,
                    Op::Delete => ITEM_IF_MATCH,
                    _ => 0,
                };
                if flags & !allowed != 0 {
                    return err(format!("item flags {flags:#x} are not valid for {:?}", h.op));
                }
                if flags & ITEM_IF_ABSENT != 0 && flags & ITEM_IF_MATCH != 0 {
                    return err("IF_ABSENT and IF_MATCH together");
                }
                if key_len == 0 || key_len > self.limits.max_key_bytes {
                    return err(format!("key of {key_len} bytes; keys have 1..={} bytes", self.limits.max_key_bytes));
                }
                let fixed = 4
                    + if flags & ITEM_IF_MATCH != 0 { 16 } else { 0 }
                    + if flags & ITEM_TTL != 0 { 8 } else { 0 }
                    + if h.op == Op::Put { 8 } else { 0 };
                if self.buf.len() < fixed + key_len {
                    return Ok(None);
                }
                let mut b = self.buf.split_to(fixed + key_len);
                b.advance(4);
                let if_match = (flags & ITEM_IF_MATCH != 0).then(|| Version { inode: b.get_u64_le(), version: b.get_u64_le() });
                let ttl_ms = if flags & ITEM_TTL != 0 {
                    let t = b.get_u64_le();
                    if t == 0 || t > self.limits.max_ttl_ms {
                        return err(format!("ttl_ms {t}: 1..={}", self.limits.max_ttl_ms));
                    }
                    Some(t)
                } else {
                    None
                };
                let value_len = if h.op == Op::Put { b.get_u64_le() } else { 0 };
                if value_len > self.limits.max_value_bytes {
                    return err(format!("a value of {value_len} bytes; at most {} are accepted", self.limits.max_value_bytes));
                }
                self.value_bytes += value_len;
                if self.value_bytes > self.limits.max_batch_put_bytes {
                    return err(format!("the batch's values are above {} bytes", self.limits.max_batch_put_bytes));
                }
                let key = b.freeze();
                self.items_seen += 1;
                if h.op == Op::Put && value_len > 0 {
                    self.state = State::Value { left: value_len };
                } else if self.items_seen == h.count {
                    self.state = State::Done;
                }
                Ok(Some(Event::Item(ItemHead { key, if_absent: flags & ITEM_IF_ABSENT != 0, if_match, ttl_ms, value_len })))
            }
            State::Value { left } => {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let n = (left as usize).min(self.buf.len());
                let piece = self.buf.split_to(n).freeze();
                let left = left - n as u64;
                self.state = match (left, self.header) {
                    (0, Some(h)) if self.items_seen == h.count => State::Done,
                    (0, _) => State::ItemHead,
                    (l, _) => State::Value { left: l },
                };
                Ok(Some(Event::Value(piece)))
            }
        }
    }

    /// Called once the body ended: `Ok(Event::End)` if it ended exactly
    /// after the last item.
    pub fn finish(&mut self) -> Result<Event, FrameError> {
        if let Some(e) = self.next()? {
            return err(format!("unexpected {e:?} at the end"));
        }
        match self.state {
            State::Done if self.buf.is_empty() => Ok(Event::End),
            State::Done => err("bytes after the last item"),
            State::Header => err("the body ended inside the batch header"),
            State::ItemHead => err(format!("the body ended after {} of {} items", self.items_seen, self.header.map_or(0, |h| h.count))),
            State::Value { left } => err(format!("the body ended {left} bytes before the end of a value")),
        }
    }
}

/// Decodes a whole (small) request body into its header and items.
pub fn decode_request(expect: Op, limits: FrameLimits, body: &[u8]) -> Result<(BatchHeader, Vec<(ItemHead, Bytes)>), FrameError> {
    let mut d = RequestDecoder::new(expect, limits);
    d.push(body);
    let mut header = None;
    let mut items: Vec<(ItemHead, BytesMut)> = Vec::new();
    while let Some(e) = d.next()? {
        match e {
            Event::Header(h) => header = Some(h),
            Event::Item(i) => items.push((i, BytesMut::new())),
            Event::Value(v) => {
                if let Some(last) = items.last_mut() {
                    last.1.extend_from_slice(&v);
                }
            }
            Event::End => {}
        }
    }
    d.finish()?;
    let header = header.ok_or_else(|| FrameError("no header".into()))?;
    Ok((header, items.into_iter().map(|(i, v)| (i, v.freeze())).collect()))
}

// ----- encoding (clients and tests make requests; the gateway responses) -----

/// A request item to encode.
#[derive(Clone, Debug, Default)]
pub struct RequestItem<'a> {
    pub key: &'a [u8],
    pub if_absent: bool,
    pub if_match: Option<Version>,
    pub ttl_ms: Option<u64>,
    /// Put only.
    pub value: Option<&'a [u8]>,
}

pub fn encode_request(op: Op, flags: u16, lease_ms: u32, items: &[RequestItem<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + items.iter().map(|i| 40 + i.key.len() + i.value.map_or(0, <[u8]>::len)).sum::<usize>());
    out.extend_from_slice(REQUEST_MAGIC);
    out.push(VERSION);
    out.push(op as u8);
    out.put_u16_le(flags);
    out.put_u32_le(items.len() as u32);
    out.put_u32_le(lease_ms);
    for i in items {
        out.put_u16_le(i.key.len() as u16);
        let mut f = 0;
        if i.if_absent {
            f |= ITEM_IF_ABSENT;
        }
        if i.if_match.is_some() {
            f |= ITEM_IF_MATCH;
        }
        if i.ttl_ms.is_some() {
            f |= ITEM_TTL;
        }
        out.push(f);
        out.push(0);
        if let Some(v) = i.if_match {
            out.put_u64_le(v.inode);
            out.put_u64_le(v.version);
        }
        if let Some(t) = i.ttl_ms {
            out.put_u64_le(t);
        }
        if op == Op::Put {
            out.put_u64_le(i.value.map_or(0, |v| v.len() as u64));
        }
        out.extend_from_slice(i.key);
        if op == Op::Put {
            out.extend_from_slice(i.value.unwrap_or_default());
        }
    }
    out
}

pub fn response_header(op: Op, count: u32) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER_BYTES);
    b.extend_from_slice(RESPONSE_MAGIC);
    b.put_u8(VERSION);
    b.put_u8(op as u8);
    b.put_u16_le(0);
    b.put_u32_le(count);
    b.put_u32_le(0);
    b.freeze()
}

/// One response item's head (and key); the value's bytes follow separately.
pub fn response_item(status: Status, key: &[u8], version: Version, index: u64, value_len: u64) -> Bytes {
    let mut b = BytesMut::with_capacity(ITEM_HEAD_BYTES + key.len());
    b.put_u8(status as u8);
    b.put_u8(0);
    b.put_u16_le(key.len() as u16);
    b.put_u64_le(version.inode);
    b.put_u64_le(version.version);
    b.put_u64_le(index);
    b.put_u64_le(value_len);
    b.extend_from_slice(key);
    b.freeze()
}

pub fn trailer(ok: u32, prefix: u32, flags: u32) -> Bytes {
    let mut b = BytesMut::with_capacity(TRAILER_BYTES);
    b.extend_from_slice(TRAILER_MAGIC);
    b.put_u32_le(ok);
    b.put_u32_le(prefix);
    b.put_u32_le(flags);
    b.freeze()
}

/// Counts for the trailer while items are answered in order.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub ok: u32,
    pub prefix: u32,
    broken: bool,
}

impl Tally {
    pub fn add(&mut self, s: Status) {
        if s.is_success() {
            self.ok += 1;
            if !self.broken {
                self.prefix += 1;
            }
        } else {
            self.broken = true;
        }
    }
}

/// A decoded response item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseItem {
    pub status: Status,
    pub key: Bytes,
    pub version: Version,
    pub index: u64,
    pub value: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub op: Op,
    pub items: Vec<ResponseItem>,
    pub ok: u32,
    pub prefix: u32,
    pub more: bool,
}

/// Decodes a whole response (clients, tests). Values are slices of `body`
/// (no copy: a 16 × 4 MiB batch get is not copied again after the receive).
pub fn decode_response(body: &Bytes) -> Result<Response, FrameError> {
    let mut b: &[u8] = body;
    if b.len() < HEADER_BYTES || &b[..4] != RESPONSE_MAGIC {
        return err("not a batch response");
    }
    b.advance(4);
    if b.get_u8() != VERSION {
        return err("unknown response version");
    }
    let op = Op::from_u8(b.get_u8()).ok_or_else(|| FrameError("unknown op".into()))?;
    b.advance(2);
    let count = b.get_u32_le();
    b.advance(4);
    // Room for the items the body can hold, not for what `count` claims.
    let mut items = Vec::with_capacity((count as usize).min(b.len() / ITEM_HEAD_BYTES));
    for i in 0..count {
        if b.len() < ITEM_HEAD_BYTES {
            return err(format!("response cut in item {i}"));
        }
        let status = Status::from_u8(b.get_u8()).ok_or_else(|| FrameError("unknown status".into()))?;
        b.advance(1);
        let key_len = b.get_u16_le() as usize;
        let version = Version { inode: b.get_u64_le(), version: b.get_u64_le() };
        let index = b.get_u64_le();
        let value_len = b.get_u64_le();
        // `value_len` comes from the peer: any u64 (the sum must not wrap).
        if (key_len as u64).checked_add(value_len).filter(|&n| n <= b.len() as u64).is_none() {
            return err(format!("response cut in item {i}"));
        }
        let key = Bytes::copy_from_slice(&b[..key_len]);
        b.advance(key_len);
        let at = body.len() - b.len();
        let value = body.slice(at..at + value_len as usize);
        b.advance(value_len as usize);
        items.push(ResponseItem { status, key, version, index, value });
    }
    if b.len() != TRAILER_BYTES || &b[..4] != TRAILER_MAGIC {
        return err("response without its trailer (incomplete)");
    }
    b.advance(4);
    let ok = b.get_u32_le();
    let prefix = b.get_u32_le();
    let flags = b.get_u32_le();
    Ok(Response { op, items, ok, prefix, more: flags & TRAILER_MORE != 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> FrameLimits {
        FrameLimits { max_items: 8, max_key_bytes: 64, max_value_bytes: 100, max_batch_put_bytes: 150, max_ttl_ms: 1000, max_lease_ms: 500 }
    }

    #[test]
    fn put_batch_streams_byte_by_byte() {
        let items = [
            RequestItem { key: b"a", value: Some(b"hello"), ..Default::default() },
            RequestItem { key: b"b", if_absent: true, value: Some(b""), ..Default::default() },
            RequestItem {
                key: b"c",
                if_match: Some(Version { inode: 7, version: 9 }),
                ttl_ms: Some(5),
                value: Some(b"xyz"),
                ..Default::default()
            },
        ];
        let body = encode_request(Op::Put, 0, 0, &items);
        let mut d = RequestDecoder::new(Op::Put, limits());
        let mut events = Vec::new();
        for byte in &body {
            d.push(&[*byte]);
            while let Some(e) = d.next().unwrap() {
                events.push(e);
            }
            assert!(d.buffered() <= 64 + 40);
        }
        assert_eq!(d.finish().unwrap(), Event::End);
        let mut values: Vec<Vec<u8>> = Vec::new();
        let mut heads = Vec::new();
        for e in events {
            match e {
                Event::Item(i) => {
                    heads.push(i);
                    values.push(Vec::new());
                }
                Event::Value(v) => values.last_mut().unwrap().extend_from_slice(&v),
                Event::Header(h) => assert_eq!((h.op, h.count), (Op::Put, 3)),
                Event::End => unreachable!(),
            }
        }
        assert_eq!(values, vec![b"hello".to_vec(), vec![], b"xyz".to_vec()]);
        assert!(heads[1].if_absent);
        assert_eq!(heads[2].if_match, Some(Version { inode: 7, version: 9 }));
        assert_eq!(heads[2].ttl_ms, Some(5));
        let (h, all) = decode_request(Op::Put, limits(), &body).unwrap();
        assert_eq!(h.count, 3);
        assert_eq!(&all[2].1[..], b"xyz");
    }

    #[test]
    fn bad_frames_are_refused_with_a_reason() {
        let good = encode_request(Op::Get, FLAG_PREFIX, 0, &[RequestItem { key: b"k", ..Default::default() }]);
        let check = |body: Vec<u8>, expect: Op, want: &str| {
            let e = decode_request(expect, limits(), &body).unwrap_err();
            assert!(e.0.contains(want), "{e} (want {want})");
        };
        check(b"XXXX".repeat(4), Op::Get, "FKVB");
        check(good.clone(), Op::Exists, "URL says");
        check(good[..good.len() - 1].to_vec(), Op::Get, "ended");
        check([&good[..], b"x"].concat(), Op::Get, "after the last item");
        check(encode_request(Op::Put, FLAG_PREFIX, 0, &[RequestItem { key: b"k", ..Default::default() }]), Op::Put, "flags");
        check(encode_request(Op::Get, 0, 0, &[]), Op::Get, "items");
        let nine: Vec<RequestItem> = (0..9).map(|_| RequestItem { key: b"k", ..Default::default() }).collect();
        check(encode_request(Op::Get, 0, 0, &nine), Op::Get, "items");
        check(encode_request(Op::Get, 0, 0, &[RequestItem { key: b"", ..Default::default() }]), Op::Get, "key of 0");
        check(encode_request(Op::Get, 0, 0, &[RequestItem { key: &[1; 65], ..Default::default() }]), Op::Get, "key of 65");
        check(encode_request(Op::Get, 0, 0, &[RequestItem { key: b"k", ttl_ms: Some(1), ..Default::default() }]), Op::Get, "item flags");
        check(
            encode_request(Op::Put, 0, 0, &[RequestItem { key: b"k", value: Some(&[0; 101]), ..Default::default() }]),
            Op::Put,
            "101 bytes",
        );
        let two = [
            RequestItem { key: b"a", value: Some(&[0; 80]), ..Default::default() },
            RequestItem { key: b"b", value: Some(&[0; 80]), ..Default::default() },
        ];
        check(encode_request(Op::Put, 0, 0, &two), Op::Put, "batch's values");
        check(
            encode_request(Op::Put, 0, 0, &[RequestItem { key: b"k", ttl_ms: Some(0), value: Some(b""), ..Default::default() }]),
            Op::Put,
            "ttl_ms 0",
        );
        check(
            encode_request(
                Op::Put,
                0,
                0,
                &[RequestItem { key: b"k", if_absent: true, if_match: Some(Version::default()), value: Some(b""), ..Default::default() }],
            ),
            Op::Put,
            "together",
        );
        check(encode_request(Op::Get, 0, 10, &[RequestItem { key: b"k", ..Default::default() }]), Op::Get, "exists batches only");
        check(encode_request(Op::Exists, 0, 501, &[RequestItem { key: b"k", ..Default::default() }]), Op::Exists, "lease_ms 501");
        let mut v2 = good.clone();
        v2[4] = 2;
        check(v2, Op::Get, "version 2");
        let mut reserved = good;
        reserved[HEADER_BYTES + 3] = 1;
        check(reserved, Op::Get, "reserved");
    }

    #[test]
    fn responses_round_trip() {
        let mut body = Vec::new();
        body.extend_from_slice(&response_header(Op::Get, 3));
        let mut t = Tally::default();
        for (s, v) in [(Status::Ok, &b"value"[..]), (Status::NotFound, b""), (Status::Ok, b"x")] {
            t.add(s);
            body.extend_from_slice(&response_item(s, b"", Version { inode: 1, version: 2 }, 3, v.len() as u64));
            body.extend_from_slice(v);
        }
        body.extend_from_slice(&trailer(t.ok, t.prefix, 0));
        let body = Bytes::from(body);
        let r = decode_response(&body).unwrap();
        assert_eq!((r.ok, r.prefix, r.more), (2, 1, false));
        assert_eq!(&r.items[0].value[..], b"value");
        assert_eq!(&r.items[2].value[..], b"x");
        assert_eq!(r.items[1].status, Status::NotFound);
        assert!(decode_response(&body.slice(..body.len() - 1)).is_err());
        assert!(decode_response(&body.slice(..body.len() - TRAILER_BYTES)).is_err());
    }

    #[test]
    fn response_lengths_near_u64_max_are_refused() {
        // Found by the fuzz target kv_batch: key_len + value_len wrapped
        // (overflow panic in debug builds, a slice out of bounds in release).
        for value_len in [u64::MAX, u64::MAX - 1, u64::MAX / 2 + 1, 1 << 40] {
            let mut body = Vec::new();
            body.extend_from_slice(&response_header(Op::Get, 2));
            body.extend_from_slice(&response_item(Status::Ok, b"k", Version::default(), 0, value_len));
            body.extend_from_slice(&trailer(1, 1, 0));
            let e = decode_response(&Bytes::from(body)).unwrap_err();
            assert!(e.0.contains("cut in item 0"), "{e}");
        }
        // A count far above what the body holds is refused without reserving for it.
        let mut body = response_header(Op::Get, u32::MAX).to_vec();
        body.extend_from_slice(&trailer(0, 0, 0));
        assert!(decode_response(&Bytes::from(body)).is_err());
    }
}
