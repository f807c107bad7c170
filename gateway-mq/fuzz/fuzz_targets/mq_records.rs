//! The MQ gateway's binary formats (record.rs, index.rs, state.rs): produce
//! request bodies from clients (`FMQ1`), stored batches read back from
//! segment files and returned by fetches (CRC-checked; the target also fixes
//! the CRC up so the record decoder behind it is reached), fetch response
//! headers (`FMQF`, what clients decode), sparse index files and segment
//! file names from directory listings.
//!
//! The first byte picks the parser. None may panic. A produce request that
//! parses respects its limits and re-encodes to a body that parses to the
//! same request; a batch that scans is within the buffer and decodes to
//! `record_count` records at offsets at or above its base; a fetch header
//! round-trips; index entries strictly increase; a segment name that parses
//! is the one name of its (base, epoch).
#![no_main]

use bytes::{Bytes, BytesMut};
use fskv_gateway_mq::record::{self, FetchHeader, ProduceRequest, RecordLimits, Scan, BATCH_HEADER_BYTES};
use fskv_gateway_mq::{index, state};
use libfuzzer_sys::fuzz_target;

fn produce(sel: u8, body: &[u8]) {
    let limits = if sel & 0x10 != 0 {
        RecordLimits::default()
    } else {
        RecordLimits { max_records: 8, max_record_bytes: 256, max_key_bytes: 32, max_headers: 4, max_header_name_bytes: 16 }
    };
    let body = Bytes::copy_from_slice(body);
    let Ok(req) = ProduceRequest::parse(&body, &limits) else { return };
    assert!(!req.records.is_empty() && req.records.len() <= limits.max_records);
    for r in &req.records {
        assert!(r.timestamp_ms >= -1);
        assert!(r.key.as_ref().is_none_or(|k| k.len() <= limits.max_key_bytes));
        assert!(r.headers.len() <= limits.max_headers);
        assert!(r.headers.iter().all(|(n, _)| n.len() <= limits.max_header_name_bytes));
        assert!(r.encoded_len() <= limits.max_record_bytes + record::RECORD_FIXED_BYTES);
    }
    let again = req.encode();
    assert_eq!(again.len(), body.len());
    assert_eq!(ProduceRequest::parse(&again, &limits).as_ref().ok(), Some(&req), "produce request round trip");
}

fn batches(sel: u8, data: &[u8]) {
    let mut buf = data.to_vec();
    // Give the batch at the start a valid CRC (a batch a writer made, or a
    // forged file / fetch response with a correct CRC).
    if sel & 0x10 != 0 && buf.len() >= BATCH_HEADER_BYTES {
        let total = (u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize).saturating_add(12).min(buf.len());
        if total >= 16 {
            let crc = crc32c::crc32c(&buf[16..total]);
            buf[12..16].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let max_batch_bytes = if sel & 0x20 != 0 { usize::MAX } else { 1 << 20 };
    let buf = Bytes::from(buf);
    match record::scan_batch(&buf, max_batch_bytes) {
        Scan::Batch(h) => {
            let total = h.total_bytes as usize;
            assert!(total >= BATCH_HEADER_BYTES && total <= buf.len() && total <= max_batch_bytes);
            assert!(h.record_count > 0);
            let _ = h.next_offset();
            let _ = h.last_sequence();
            if let Ok((h2, recs)) = record::decode_batch(&buf.slice(..total)) {
                assert_eq!(h2, h);
                assert_eq!(recs.len(), h.record_count as usize);
                assert!(recs.iter().all(|r| r.offset >= h.base_offset));
            }
        }
        Scan::NeedBytes(n) => assert!(n > buf.len()),
        Scan::Invalid(_) => {}
    }
    let from = buf.first().map_or(0, |b| u64::from(*b));
    let _ = record::decode_batches(buf, from);
}

fn fetch_header(data: &[u8]) {
    if let Some(h) = FetchHeader::parse(data) {
        let mut out = BytesMut::new();
        h.encode(&mut out);
        assert_eq!(FetchHeader::parse(&out), Some(h));
    }
}

fn index_file(data: &[u8]) {
    let entries = index::decode(data);
    assert!(entries.len() * index::INDEX_ENTRY_BYTES <= data.len());
    for w in entries.windows(2) {
        assert!(w[0].rel_offset < w[1].rel_offset && w[0].position < w[1].position);
    }
    let [a, b, c, ..] = data else { return };
    let committed = u64::from(*a) << (b % 40);
    let (rel, pos) = index::position_for_offset(&entries, u64::from(*c) << (a % 40), committed);
    assert!(pos == 0 || pos < committed);
    let _ = rel;
    let p = index::position_for_time(&entries, i64::from(*b) << (c % 60), committed);
    assert!(p == 0 || p < committed);
}

fn segment_names(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let names: Vec<String> = s.split('/').map(str::to_string).collect();
    for n in &names {
        if let Some((base, epoch)) = state::parse_segment_name(n, "log") {
            assert_eq!(&state::segment_name(base, epoch), n, "a segment has one file name");
        }
        if let Some((base, epoch)) = state::parse_segment_name(n, "idx") {
            assert_eq!(&state::index_name(base, epoch), n, "an index has one file name");
        }
    }
    let max_epoch = u64::from(data.first().copied().unwrap_or(0));
    let segs = state::valid_segments(names, max_epoch);
    for w in segs.windows(2) {
        assert!(w[0].base < w[1].base);
    }
    assert!(segs.iter().all(|s| s.epoch <= max_epoch));
}

fuzz_target!(|data: &[u8]| {
    let [sel, rest @ ..] = data else { return };
    match sel % 5 {
        0 => produce(*sel, rest),
        1 => batches(*sel, rest),
        2 => fetch_header(rest),
        3 => index_file(rest),
        _ => segment_names(rest),
    }
});
