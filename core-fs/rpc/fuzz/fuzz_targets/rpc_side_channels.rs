//! The other bytes an RPC port parses from a peer besides frames and
//! message bodies: the payload of a frame flagged `FLAG_PAYLOAD_REMOTE`
//! (a list of RDMA buffer descriptors) and the HTTP head of a `GET ` on the
//! port (`/metrics`). Neither may panic; a descriptor list round-trips; the
//! HTTP head parser answers `TooLarge` only past its limit and never
//! `Incomplete` past it.
#![no_main]

use fskv_rpc::http::{parse_head, Head, MAX_HTTP_REQUEST_BYTES};
use fskv_rpc::RemoteBuf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else { return };
    if which & 1 == 0 {
        match RemoteBuf::decode_list(rest) {
            Some(list) => {
                assert_eq!(list.len() * RemoteBuf::ENCODED_BYTES, rest.len());
                assert_eq!(&RemoteBuf::encode_list(&list)[..], rest);
            }
            None => assert_ne!(rest.len() % RemoteBuf::ENCODED_BYTES, 0),
        }
    } else {
        // The server hands the parser what it buffered so far, at most the
        // limit; repeat the input to reach the limit sometimes.
        let mut buf = rest.to_vec();
        if which & 2 != 0 {
            while !buf.is_empty() && buf.len() < MAX_HTTP_REQUEST_BYTES {
                buf.extend_from_slice(rest);
            }
        }
        match parse_head(&buf) {
            Head::TooLarge => assert!(buf.len() >= MAX_HTTP_REQUEST_BYTES),
            Head::Request { path, .. } => assert!(!path.contains('?')),
            Head::Incomplete | Head::Malformed => {}
        }
    }
});
