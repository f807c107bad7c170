//! Binary formats of records: the produce request body, the stored batch
//! (the unit of a log append, also what a fetch returns), and the fetch
//! response header. Pure: no I/O. All integers little-endian.
//!
//! **Record** (inside a produce request and inside a stored batch):
//!
//! | bytes | field |
//! |---|---|
//! | 4 | `len` u32: bytes of the record after this field |
//! | 8 | `timestamp_ms` i64 (produce: -1 = the gateway's append time) |
//! | 4 | `offset_delta` u32 (produce: ignored, 0; stored: index in the batch) |
//! | 4 | `key_len` i32 (-1 = no key) |
//! | key_len | key |
//! | 4 | `value_len` u32 |
//! | value_len | value |
//! | 2 | `header_count` u16 |
//! | … | per header: u16 name length, name (UTF-8), u32 value length, value |
//!
//! **Produce request** (`POST …/records`, `application/vnd.fskv.mq.batch`):
//! a 32-byte header, then `record_count` records.
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `FMQ1` |
//! | 4 | `record_count` u32 |
//! | 8 | `producer_id` i64 (-1 = not idempotent) |
//! | 2 | `producer_epoch` i16 |
//! | 2 | reserved, 0 |
//! | 4 | `base_sequence` i32 (the first record's sequence number) |
//! | 8 | reserved, 0 |
//!
//! **Stored batch** (what one produce request becomes in a segment file,
//! and what a fetch returns byte for byte): a 56-byte header, then the
//! records with offsets and timestamps filled in.
//!
//! | bytes | field |
//! |---|---|
//! | 8 | `base_offset` u64 |
//! | 4 | `batch_len` u32: bytes after this field (the batch is `12 + batch_len` bytes) |
//! | 4 | `crc` u32: CRC32C of every byte after this field |
//! | 1 | magic 1 |
//! | 1 | flags (0) |
//! | 2 | reserved |
//! | 4 | `record_count` u32 |
//! | 8 | `first_timestamp_ms` i64 |
//! | 8 | `max_timestamp_ms` i64 |
//! | 8 | `producer_id` i64 |
//! | 2 | `producer_epoch` i16 |
//! | 4 | `base_sequence` i32 |
//! | 2 | reserved |
//!
//! A batch is valid when its length fits, its magic is 1 and its CRC
//! matches; anything else at a position (a torn tail, zeros past the end)
//! ends the scan there ([`scan_batch`]).

use crate::error::MqError;
use bytes::{BufMut, Bytes, BytesMut};

pub const PRODUCE_MAGIC: &[u8; 4] = b"FMQ1";
pub const PRODUCE_HEADER_BYTES: usize = 32;
pub const BATCH_HEADER_BYTES: usize = 56;
pub const BATCH_MAGIC: u8 = 1;
pub const FETCH_MAGIC: &[u8; 4] = b"FMQF";
pub const FETCH_HEADER_BYTES: usize = 40;
/// Fixed bytes of a record besides key, value and headers.
pub const RECORD_FIXED_BYTES: usize = 4 + 8 + 4 + 4 + 4 + 2;

/// Headers the gateway gives a meaning to (queue semantics).
pub const HEADER_DEDUP_ID: &str = "fskv-dedup-id";
pub const HEADER_GROUP: &str = "fskv-group";
pub const HEADER_DELAY_MS: &str = "fskv-delay-ms";

/// Limits a produce request is checked against.
#[derive(Clone, Copy, Debug)]
pub struct RecordLimits {
    pub max_records: usize,
    pub max_record_bytes: usize,
    pub max_key_bytes: usize,
    pub max_headers: usize,
    pub max_header_name_bytes: usize,
}

impl Default for RecordLimits {
    fn default() -> Self {
        RecordLimits {
            max_records: 100_000,
            max_record_bytes: 1 << 20,
            max_key_bytes: 64 << 10,
            max_headers: 64,
            max_header_name_bytes: 256,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// -1 in a produce request: the append time.
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub value: Bytes,
    pub headers: Vec<(String, Bytes)>,
}

impl Record {
    pub fn new(value: impl Into<Bytes>) -> Record {
        Record { timestamp_ms: -1, key: None, value: value.into(), headers: Vec::new() }
    }

    pub fn header(&self, name: &str) -> Option<&Bytes> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Bytes this record takes when encoded.
    pub fn encoded_len(&self) -> usize {
        RECORD_FIXED_BYTES
            + self.key.as_ref().map_or(0, |k| k.len())
            + self.value.len()
            + self.headers.iter().map(|(n, v)| 2 + n.len() + 4 + v.len()).sum::<usize>()
    }

    fn encode_into(&self, out: &mut BytesMut, timestamp_ms: i64, offset_delta: u32) {
        out.put_u32_le((self.encoded_len() - 4) as u32);
        out.put_i64_le(timestamp_ms);
        out.put_u32_le(offset_delta);
        match &self.key {
            Some(k) => {
                out.put_i32_le(k.len() as i32);
                out.put_slice(k);
            }
            None => out.put_i32_le(-1),
        }
        out.put_u32_le(self.value.len() as u32);
        out.put_slice(&self.value);
        out.put_u16_le(self.headers.len() as u16);
        for (n, v) in &self.headers {
            out.put_u16_le(n.len() as u16);
            out.put_slice(n.as_bytes());
            out.put_u32_le(v.len() as u32);
            out.put_slice(v);
        }
    }
}

/// The idempotent producer fields of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerFields {
    pub id: i64,
    pub epoch: i16,
    pub base_sequence: i32,
}

/// A parsed produce request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceRequest {
    pub producer: Option<ProducerFields>,
    pub records: Vec<Record>,
}

impl ProduceRequest {
    /// Encodes a produce request body (clients and tests).
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(PRODUCE_HEADER_BYTES + self.records.iter().map(Record::encoded_len).sum::<usize>());
        out.put_slice(PRODUCE_MAGIC);
        out.put_u32_le(self.records.len() as u32);
        let p = self.producer.unwrap_or(ProducerFields { id: -1, epoch: 0, base_sequence: 0 });
        out.put_i64_le(p.id);
        out.put_i16_le(p.epoch);
        out.put_u16_le(0);
        out.put_i32_le(p.base_sequence);
        out.put_u64_le(0);
        for r in &self.records {
            r.encode_into(&mut out, r.timestamp_ms, 0);
        }
        out.freeze()
    }

    /// Parses and checks a produce request body.
    pub fn parse(body: &Bytes, limits: &RecordLimits) -> Result<ProduceRequest, MqError> {
        let bad = |m: String| MqError::InvalidRecord(m);
        if body.len() < PRODUCE_HEADER_BYTES {
            return Err(bad(format!("the body is {} bytes; a produce request has a {PRODUCE_HEADER_BYTES}-byte header", body.len())));
        }
        if &body[..4] != PRODUCE_MAGIC {
            return Err(bad("the body does not start with the magic FMQ1 (see docs/mq.md, \"Produce request\")".into()));
        }
        let mut c = Cursor::new(body, 4);
        let count = c.u32()? as usize;
        let id = c.i64()?;
        let epoch = c.i16()?;
        c.skip(2)?;
        let base_sequence = c.i32()?;
        c.skip(8)?;
        if count == 0 {
            return Err(bad("a produce request needs at least one record".into()));
        }
        if count > limits.max_records {
            return Err(MqError::LimitExceeded(format!("{count} records in one request; at most {}", limits.max_records)));
        }
        let producer = if id >= 0 {
            if epoch < 0 || base_sequence < 0 {
                return Err(bad(format!("producer epoch {epoch} / base sequence {base_sequence} must not be negative")));
            }
            Some(ProducerFields { id, epoch, base_sequence })
        } else if id == -1 {
            None
        } else {
            return Err(bad(format!("producer id {id}: -1 (none) or a non-negative id")));
        };
        let mut records = Vec::with_capacity(count.min(4096));
        for i in 0..count {
            let r = c.record(limits).map_err(|e| match e {
                MqError::InvalidRecord(m) => MqError::InvalidRecord(format!("record {i}: {m}")),
                other => other,
            })?;
            records.push(r.1);
        }
        if c.pos != body.len() {
            return Err(bad(format!("{} bytes after the last of {count} records", body.len() - c.pos)));
        }
        Ok(ProduceRequest { producer, records })
    }
}

/// The fixed header of a stored batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: u64,
    /// The whole batch in bytes (header included).
    pub total_bytes: u32,
    pub crc: u32,
    pub record_count: u32,
    pub first_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

impl BatchHeader {
    /// The offset after the batch's last record.
    pub fn next_offset(&self) -> u64 {
        // Saturating: the header may come from a damaged or forged file.
        self.base_offset.saturating_add(u64::from(self.record_count))
    }

    pub fn last_sequence(&self) -> i32 {
        seq_add(self.base_sequence, self.record_count.saturating_sub(1))
    }

    /// Parses a header (length and magic checked, not the CRC).
    pub fn parse(b: &[u8]) -> Option<BatchHeader> {
        if b.len() < BATCH_HEADER_BYTES || b[16] != BATCH_MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3], b[o + 4], b[o + 5], b[o + 6], b[o + 7]]);
        let batch_len = u32_at(8);
        let total = batch_len.checked_add(12)?;
        if (total as usize) < BATCH_HEADER_BYTES {
            return None;
        }
        Some(BatchHeader {
            base_offset: u64_at(0),
            total_bytes: total,
            crc: u32_at(12),
            record_count: u32_at(20),
            first_timestamp_ms: u64_at(24) as i64,
            max_timestamp_ms: u64_at(32) as i64,
            producer_id: u64_at(40) as i64,
            producer_epoch: i16::from_le_bytes([b[48], b[49]]),
            base_sequence: u32_at(50) as i32,
        })
    }
}

/// Sequence numbers wrap from `i32::MAX` to 0 (as Kafka's).
pub fn seq_add(seq: i32, n: u32) -> i32 {
    ((i64::from(seq) + i64::from(n)) % (i64::from(i32::MAX) + 1)) as i32
}

/// What is at a position of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scan {
    /// A whole, valid batch.
    Batch(BatchHeader),
    /// The buffer ends inside a batch that looks valid so far: read at least
    /// this many bytes from the position and scan again.
    NeedBytes(usize),
    /// Not a valid batch (zeros past the end, a torn or corrupt batch).
    Invalid(&'static str),
}

/// Looks at the batch starting at `buf[0]`. `max_batch_bytes` bounds the
/// length a header may claim (a torn header must not make a reader read
/// gigabytes).
pub fn scan_batch(buf: &[u8], max_batch_bytes: usize) -> Scan {
    if buf.len() < BATCH_HEADER_BYTES {
        if buf.len() >= 17 && buf[16] != BATCH_MAGIC {
            return Scan::Invalid("bad magic");
        }
        return Scan::NeedBytes(BATCH_HEADER_BYTES);
    }
    let Some(h) = BatchHeader::parse(buf) else { return Scan::Invalid("bad batch header") };
    let total = h.total_bytes as usize;
    if total > max_batch_bytes {
        return Scan::Invalid("batch length beyond the largest batch");
    }
    if h.record_count == 0 {
        return Scan::Invalid("batch without records");
    }
    if buf.len() < total {
        return Scan::NeedBytes(total);
    }
    if crc32c::crc32c(&buf[16..total]) != h.crc {
        return Scan::Invalid("CRC mismatch");
    }
    Scan::Batch(h)
}

/// What a batch was built from, for the caller's bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuiltBatch {
    pub header: BatchHeader,
}

/// Encodes `records` as a stored batch at `base_offset`; records without a
/// timestamp get `append_time_ms`.
pub fn encode_batch(
    base_offset: u64,
    producer: Option<ProducerFields>,
    records: &[Record],
    append_time_ms: i64,
    out: &mut BytesMut,
) -> BuiltBatch {
    let start = out.len();
    let body: usize = records.iter().map(Record::encoded_len).sum();
    out.reserve(BATCH_HEADER_BYTES + body);
    let ts = |r: &Record| if r.timestamp_ms < 0 { append_time_ms } else { r.timestamp_ms };
    let first_ts = records.first().map_or(append_time_ms, ts);
    let max_ts = records.iter().map(ts).max().unwrap_or(append_time_ms);
    let p = producer.unwrap_or(ProducerFields { id: -1, epoch: 0, base_sequence: 0 });
    out.put_u64_le(base_offset);
    out.put_u32_le((BATCH_HEADER_BYTES + body - 12) as u32);
    out.put_u32_le(0); // CRC, filled below
    out.put_u8(BATCH_MAGIC);
    out.put_u8(0);
    out.put_u16_le(0);
    out.put_u32_le(records.len() as u32);
    out.put_i64_le(first_ts);
    out.put_i64_le(max_ts);
    out.put_i64_le(p.id);
    out.put_i16_le(p.epoch);
    out.put_i32_le(p.base_sequence);
    out.put_u16_le(0);
    for (i, r) in records.iter().enumerate() {
        r.encode_into(out, ts(r), i as u32);
    }
    let crc = crc32c::crc32c(&out[start + 16..]);
    out[start + 12..start + 16].copy_from_slice(&crc.to_le_bytes());
    let header = BatchHeader {
        base_offset,
        total_bytes: (BATCH_HEADER_BYTES + body) as u32,
        crc,
        record_count: records.len() as u32,
        first_timestamp_ms: first_ts,
        max_timestamp_ms: max_ts,
        producer_id: p.id,
        producer_epoch: p.epoch,
        base_sequence: p.base_sequence,
    };
    BuiltBatch { header }
}

/// A record with its offset, decoded from a stored batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    pub record: Record,
}

/// Decodes the records of one valid stored batch (`batch` is exactly the
/// batch's bytes, already checked by [`scan_batch`]).
pub fn decode_batch(batch: &Bytes) -> Result<(BatchHeader, Vec<StoredRecord>), MqError> {
    let h = BatchHeader::parse(batch).ok_or_else(|| MqError::Corrupt("bad batch header".into()))?;
    let mut c = Cursor::new(batch, BATCH_HEADER_BYTES);
    let limits = RecordLimits {
        max_records: usize::MAX,
        max_record_bytes: usize::MAX,
        max_key_bytes: usize::MAX,
        max_headers: usize::MAX,
        max_header_name_bytes: usize::MAX,
    };
    // `record_count` is read from the file (or a fetch response): reserve
    // only for the records the bytes can hold.
    let mut out = Vec::with_capacity((h.record_count as usize).min(batch.len() / RECORD_FIXED_BYTES));
    for _ in 0..h.record_count {
        let (delta, record) = c.record(&limits).map_err(|e| MqError::Corrupt(format!("batch at offset {}: {e}", h.base_offset)))?;
        let offset = h
            .base_offset
            .checked_add(u64::from(delta))
            .ok_or_else(|| MqError::Corrupt(format!("batch at offset {}: offset delta {delta} overflows", h.base_offset)))?;
        out.push(StoredRecord { offset, record });
    }
    Ok((h, out))
}

/// Splits a run of stored batches (a fetch response body) into records,
/// skipping those below `from_offset`.
pub fn decode_batches(mut data: Bytes, from_offset: u64) -> Result<Vec<StoredRecord>, MqError> {
    let mut out = Vec::new();
    while !data.is_empty() {
        match scan_batch(&data, usize::MAX) {
            Scan::Batch(h) => {
                let batch = data.split_to(h.total_bytes as usize);
                let (_, recs) = decode_batch(&batch)?;
                out.extend(recs.into_iter().filter(|r| r.offset >= from_offset));
            }
            Scan::NeedBytes(_) => return Err(MqError::Corrupt("truncated batch".into())),
            Scan::Invalid(why) => return Err(MqError::Corrupt(why.into())),
        }
    }
    Ok(out)
}

/// The header of a binary fetch response: magic `FMQF`, u32 reserved,
/// then `high_watermark`, `log_start_offset`, `next_offset` (u64 each) and
/// u64 reserved; the stored batches follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchHeader {
    pub high_watermark: u64,
    pub log_start_offset: u64,
    pub next_offset: u64,
}

impl FetchHeader {
    pub fn encode(&self, out: &mut BytesMut) {
        out.put_slice(FETCH_MAGIC);
        out.put_u32_le(0);
        out.put_u64_le(self.high_watermark);
        out.put_u64_le(self.log_start_offset);
        out.put_u64_le(self.next_offset);
        out.put_u64_le(0);
    }

    pub fn parse(b: &[u8]) -> Option<FetchHeader> {
        if b.len() < FETCH_HEADER_BYTES || &b[..4] != FETCH_MAGIC {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        Some(FetchHeader { high_watermark: u64_at(8), log_start_offset: u64_at(16), next_offset: u64_at(24) })
    }
}

/// A bounds-checked reader over a buffer.
struct Cursor<'a> {
    b: &'a Bytes,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(b: &'a Bytes, pos: usize) -> Self {
        Cursor { b, pos }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MqError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| MqError::InvalidRecord("truncated".into()))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn slice(&mut self, n: usize) -> Result<Bytes, MqError> {
        let start = self.pos;
        self.take(n)?;
        Ok(self.b.slice(start..start + n))
    }

    fn skip(&mut self, n: usize) -> Result<(), MqError> {
        self.take(n).map(drop)
    }

    fn u16(&mut self) -> Result<u16, MqError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn i16(&mut self) -> Result<i16, MqError> {
        Ok(self.u16()? as i16)
    }

    fn u32(&mut self) -> Result<u32, MqError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn i32(&mut self) -> Result<i32, MqError> {
        Ok(self.u32()? as i32)
    }

    fn i64(&mut self) -> Result<i64, MqError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(i64::from_le_bytes(a))
    }

    /// One record; returns its offset delta too.
    fn record(&mut self, limits: &RecordLimits) -> Result<(u32, Record), MqError> {
        let bad = |m: String| MqError::InvalidRecord(m);
        let len = self.u32()? as usize;
        if len + 4 > limits.max_record_bytes.saturating_add(RECORD_FIXED_BYTES) {
            return Err(MqError::LimitExceeded(format!(
                "a record of {len} bytes; at most {} bytes of key, value and headers",
                limits.max_record_bytes
            )));
        }
        let end = self
            .pos
            .checked_add(len)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| bad(format!("record length {len} runs past the body")))?;
        let timestamp_ms = self.i64()?;
        if timestamp_ms < -1 {
            return Err(bad(format!("timestamp {timestamp_ms}: -1 (append time) or milliseconds since the epoch")));
        }
        let delta = self.u32()?;
        let key_len = self.i32()?;
        let key = match key_len {
            -1 => None,
            n if n < 0 => return Err(bad(format!("key length {n}"))),
            n if n as usize > limits.max_key_bytes => {
                return Err(MqError::LimitExceeded(format!("a key of {n} bytes; at most {}", limits.max_key_bytes)))
            }
            n => Some(self.slice(n as usize)?),
        };
        let value_len = self.u32()? as usize;
        let value = self.slice(value_len)?;
        let header_count = self.u16()? as usize;
        if header_count > limits.max_headers {
            return Err(MqError::LimitExceeded(format!("{header_count} headers; at most {}", limits.max_headers)));
        }
        let mut headers = Vec::with_capacity(header_count);
        for _ in 0..header_count {
            let n = self.u16()? as usize;
            if n > limits.max_header_name_bytes {
                return Err(MqError::LimitExceeded(format!("a header name of {n} bytes; at most {}", limits.max_header_name_bytes)));
            }
            let name = std::str::from_utf8(self.take(n)?).map_err(|_| bad("a header name is not UTF-8".into()))?.to_string();
            let vl = self.u32()? as usize;
            headers.push((name, self.slice(vl)?));
        }
        if self.pos != end {
            return Err(bad(format!("record length {len} does not match its fields")));
        }
        Ok((delta, Record { timestamp_ms, key, value, headers }))
    }
}

/// Kafka's partitioner hash (murmur2, seed 0x9747b28c), so keys land on the
/// partitions Kafka clients would pick: `(murmur2(key) & 0x7fffffff) % n`.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = 0x9747_b28c ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a key among `partitions`.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(v: &str) -> Record {
        Record {
            timestamp_ms: -1,
            key: Some(Bytes::from_static(b"k")),
            value: Bytes::copy_from_slice(v.as_bytes()),
            headers: vec![("h".into(), Bytes::from_static(b"x"))],
        }
    }

    #[test]
    fn murmur2_matches_kafka() {
        // Kafka's UtilsTest vectors.
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"), -58897971);
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    #[test]
    fn produce_round_trip_and_limits() {
        let req =
            ProduceRequest { producer: Some(ProducerFields { id: 7, epoch: 1, base_sequence: 3 }), records: vec![rec("a"), rec("bb")] };
        let body = req.encode();
        assert_eq!(ProduceRequest::parse(&body, &RecordLimits::default()).unwrap(), req);
        let tight = RecordLimits { max_records: 1, ..RecordLimits::default() };
        assert!(matches!(ProduceRequest::parse(&body, &tight), Err(MqError::LimitExceeded(_))));
        // Every truncation is an error, never a panic.
        for n in 0..body.len() {
            assert!(ProduceRequest::parse(&body.slice(..n), &RecordLimits::default()).is_err(), "{n}");
        }
        let mut extra = BytesMut::from(&body[..]);
        extra.put_u8(0);
        assert!(ProduceRequest::parse(&extra.freeze(), &RecordLimits::default()).is_err());
    }

    #[test]
    fn batches_round_trip_and_torn_tails_are_detected() {
        let mut out = BytesMut::new();
        let recs = vec![rec("one"), Record { timestamp_ms: 5, ..rec("two") }];
        let b1 = encode_batch(10, None, &recs, 1000, &mut out);
        let b2 = encode_batch(12, Some(ProducerFields { id: 1, epoch: 0, base_sequence: 0 }), &[rec("three")], 1001, &mut out);
        let data = out.freeze();
        assert_eq!(b1.header.first_timestamp_ms, 1000);
        assert_eq!(b1.header.max_timestamp_ms, 1000);
        assert_eq!(scan_batch(&data, 1 << 20), Scan::Batch(b1.header));
        let all = decode_batches(data.clone(), 11).unwrap();
        assert_eq!(all.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![11, 12]);
        assert_eq!(all[0].record.timestamp_ms, 5);
        assert_eq!(&all[1].record.value[..], b"three");
        // A torn second batch: the first is found, the second needs bytes.
        let cut = data.slice(..data.len() - 3);
        let first = b1.header.total_bytes as usize;
        assert_eq!(scan_batch(&cut[first..], 1 << 20), Scan::NeedBytes(b2.header.total_bytes as usize));
        // A flipped byte fails the CRC.
        let mut bad = BytesMut::from(&data[..]);
        bad[first + 70] ^= 1;
        assert_eq!(scan_batch(&bad[first..], 1 << 20), Scan::Invalid("CRC mismatch"));
        // Zeros are not a batch.
        assert!(matches!(scan_batch(&[0u8; 64], 1 << 20), Scan::Invalid(_)));
    }

    #[test]
    fn batch_headers_from_disk_cannot_make_the_decoder_allocate_or_overflow() {
        // Found by the fuzz target mq_records: a batch with a valid CRC and
        // record_count 4 billion reserved room for 4 billion records (an
        // abort on allocation failure); a base offset near u64::MAX
        // overflowed when the offset delta was added.
        let forge = |base_offset: u64, record_count: u32| {
            let mut out = BytesMut::new();
            encode_batch(base_offset, None, &[rec("x")], 1, &mut out);
            out[20..24].copy_from_slice(&record_count.to_le_bytes());
            let mut raw = out.to_vec();
            let crc = crc32c::crc32c(&raw[16..]);
            raw[12..16].copy_from_slice(&crc.to_le_bytes());
            Bytes::from(raw)
        };
        let b = forge(0, u32::MAX);
        assert!(matches!(scan_batch(&b, 1 << 20), Scan::Batch(_)));
        assert!(matches!(decode_batch(&b), Err(MqError::Corrupt(_))));
        assert!(decode_batches(b, 0).is_err());
        let mut out = BytesMut::new();
        encode_batch(u64::MAX, None, &[rec("a"), rec("b")], 1, &mut out);
        let b = out.freeze();
        assert!(matches!(decode_batch(&b), Err(MqError::Corrupt(m)) if m.contains("overflows")));
        assert_eq!(BatchHeader::parse(&b).map(|h| h.next_offset()), Some(u64::MAX));
    }

    #[test]
    fn sequences_wrap() {
        assert_eq!(seq_add(i32::MAX, 1), 0);
        assert_eq!(seq_add(5, 3), 8);
    }
}
