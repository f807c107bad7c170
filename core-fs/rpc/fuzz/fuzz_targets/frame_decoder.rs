//! Feeds arbitrary bytes, split at an arbitrary point, to the frame decoder
//! with an arbitrary size limit. The decoder must never panic, never grow the
//! buffer past the limit, and every frame it yields must fit the limit.
#![no_main]

use bytes::BytesMut;
use fskv_rpc::frame::FrameDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    // First 4 bytes: the limit (capped so the fuzzer cannot make us reserve
    // gigabytes legitimately); next 2: where to split the rest.
    let max_frame_bytes = (u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize) % (1 << 20);
    let split = u16::from_le_bytes([data[4], data[5]]) as usize;
    let rest = &data[6..];
    let split = split.min(rest.len());
    let decoder = FrameDecoder::new(max_frame_bytes);
    let mut buf = BytesMut::new();
    for part in [&rest[..split], &rest[split..]] {
        buf.extend_from_slice(part);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    let total = fskv_rpc::frame::HEADER_BYTES + frame.body.len() + frame.payload.len();
                    assert!(total <= max_frame_bytes);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
