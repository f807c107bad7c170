//! The KV batch framing (frame.rs): the gateway's incremental decoder of a
//! batch request body (`FKVB`), fed in pieces as a body streams in, and the
//! client's decoder of a batch response (`FKVR` … `FKVE`).
//!
//! Input: 1 byte selector, 1 byte piece size, 16 bytes of limits, the body.
//!
//! Request properties: the decoder never panics; fed in pieces it agrees
//! with the whole-body decoder; it buffers at most one item head and key
//! beyond the last piece; every item respects the limits (key length,
//! value length, item count, batch value bytes, TTL, lease); values arrive
//! whole (their pieces add up to `value_len`); a body that decodes is
//! exactly what `encode_request` makes of what was decoded.
//!
//! Response properties: never panics; a response that decodes re-encodes to
//! the same bytes.
#![no_main]

use bytes::Bytes;
use fskv_gateway_kv::frame::{self, Event, FrameLimits, Op, RequestDecoder, RequestItem};
use libfuzzer_sys::fuzz_target;

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn request(op: Op, piece: usize, limits: FrameLimits, body: &[u8]) {
    let whole = frame::decode_request(op, limits, body);
    let mut d = RequestDecoder::new(op, limits);
    let mut header = None;
    let mut items: Vec<(frame::ItemHead, Vec<u8>)> = Vec::new();
    let mut value_bytes = 0u64;
    let mut streamed: Result<(), frame::FrameError> = Ok(());
    'feed: for chunk in body.chunks(piece) {
        d.push(chunk);
        loop {
            match d.next() {
                Ok(None) => break,
                Ok(Some(Event::Header(h))) => {
                    assert!(header.is_none(), "two headers");
                    assert_eq!(h.op, op);
                    assert!(h.count >= 1 && h.count <= limits.max_items);
                    assert!(h.lease_ms <= limits.max_lease_ms);
                    header = Some(h);
                }
                Ok(Some(Event::Item(i))) => {
                    let h = header.expect("an item before the header");
                    assert!(items.len() < h.count as usize, "more items than the header's count");
                    assert!(!i.key.is_empty() && i.key.len() <= limits.max_key_bytes);
                    assert!(i.value_len <= limits.max_value_bytes);
                    assert!(i.ttl_ms.is_none_or(|t| t >= 1 && t <= limits.max_ttl_ms));
                    assert!(!(i.if_absent && i.if_match.is_some()));
                    if let Some(last) = items.last() {
                        assert_eq!(last.1.len() as u64, last.0.value_len, "an item before the previous value ended");
                    }
                    value_bytes += i.value_len;
                    assert!(value_bytes <= limits.max_batch_put_bytes);
                    items.push((i, Vec::new()));
                }
                Ok(Some(Event::Value(v))) => {
                    let last = items.last_mut().expect("a value before its item");
                    last.1.extend_from_slice(&v);
                    assert!(last.1.len() as u64 <= last.0.value_len, "a value longer than its value_len");
                }
                Ok(Some(Event::End)) => unreachable!("next() never yields End"),
                Err(e) => {
                    streamed = Err(e);
                    break 'feed;
                }
            }
            // At most one item head (36 bytes) and its key held beyond the piece.
            assert!(d.buffered() <= piece + 36 + limits.max_key_bytes, "buffered {} bytes", d.buffered());
        }
    }
    if streamed.is_ok() {
        streamed = d.finish().map(|e| assert_eq!(e, Event::End));
    }
    match (&whole, &streamed) {
        (Ok((h, all)), Ok(())) => {
            assert_eq!(Some(*h), header);
            assert_eq!(all.len(), h.count as usize);
            assert_eq!(all.len(), items.len());
            for ((a, av), (b, bv)) in all.iter().zip(&items) {
                assert_eq!(a, b);
                assert_eq!(&av[..], &bv[..]);
            }
            let req: Vec<RequestItem<'_>> = all
                .iter()
                .map(|(i, v)| RequestItem {
                    key: &i.key,
                    if_absent: i.if_absent,
                    if_match: i.if_match,
                    ttl_ms: i.ttl_ms,
                    value: (op == Op::Put).then_some(&v[..]),
                })
                .collect();
            assert_eq!(frame::encode_request(op, h.flags, h.lease_ms, &req), body, "decode/encode round trip");
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("whole-body decode {a:?} but streamed decode {b:?}"),
    }
}

fn response(body: &[u8]) {
    let body = Bytes::copy_from_slice(body);
    let Ok(r) = frame::decode_response(&body) else { return };
    let mut again = Vec::new();
    again.extend_from_slice(&frame::response_header(r.op, r.items.len() as u32));
    for i in &r.items {
        again.extend_from_slice(&frame::response_item(i.status, &i.key, i.version, i.index, i.value.len() as u64));
        again.extend_from_slice(&i.value);
    }
    again.extend_from_slice(&frame::trailer(r.ok, r.prefix, u32::from(r.more)));
    // Reserved fields are not kept: compare what the decoder reads.
    let again = Bytes::from(again);
    assert_eq!(frame::decode_response(&again).as_ref(), Ok(&r));
    assert!(again.len() <= body.len());
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 18 {
        return;
    }
    let (sel, piece, lim, body) = (data[0], data[1], &data[2..18], &data[18..]);
    if sel & 0x80 != 0 {
        return response(&data[1..]);
    }
    let op = match sel % 4 {
        0 => Op::Get,
        1 => Op::Put,
        2 => Op::Delete,
        _ => Op::Exists,
    };
    // Small limits (the fuzzer reaches them) or, with bit 0x40, huge ones
    // (a configuration may allow anything up to u64::MAX).
    let huge = sel & 0x40 != 0;
    let limits = FrameLimits {
        max_items: 1 + u32::from(lim[0] % 16),
        max_key_bytes: 1 + usize::from(lim[1]) * 4,
        max_value_bytes: if huge { u64_at(lim, 2) } else { u64::from(lim[2]) * 8 },
        max_batch_put_bytes: if huge { u64::MAX - u64::from(lim[10]) } else { u64::from(lim[3]) * 16 },
        max_ttl_ms: if huge { u64::MAX } else { u64::from(lim[11]) * 1000 },
        max_lease_ms: u32::from(lim[12]) * 100,
    };
    request(op, 1 + usize::from(piece), limits, body);
});
