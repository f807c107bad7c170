//! The bincode body of every RPC method (core-fs/proto), request and
//! response, as the server (`decode_body` of the request) and the client (of
//! the response) decode it. The first byte picks the method, the second
//! whether the request or the response type is decoded; the rest is the body.
//!
//! Properties: decoding never panics and never allocates past the body's
//! length (bincode's limit is the body length; libFuzzer's `-rss_limit_mb`
//! and `-malloc_limit_mb` catch a reservation a length prefix claims); a
//! body that decodes re-encodes to bytes that decode again to the same
//! encoding (decode ∘ encode is the identity after one normalisation —
//! maps with repeated keys collapse once).
#![no_main]

use fskv_proto::{meta, mgmtd, storage};
use fskv_rpc::method::{decode_body, encode_body};
use fskv_rpc::Method;
use libfuzzer_sys::fuzz_target;

fn check<T: serde::Serialize + serde::de::DeserializeOwned>(body: &[u8]) {
    let Ok(v) = decode_body::<T>(body) else { return };
    let once = encode_body(&v).expect("a decoded message encodes");
    assert!(once.len() <= body.len(), "re-encoding grew the message: {} > {}", once.len(), body.len());
    let again = decode_body::<T>(&once).expect("an encoded message decodes");
    assert_eq!(encode_body(&again).expect("encodes"), once, "decode/encode is not stable");
}

fn method<M: Method>(resp: bool, body: &[u8]) {
    if resp {
        check::<M::Resp>(body)
    } else {
        check::<M::Req>(body)
    }
}

/// Every method of `fskv_proto::all_methods()`, in its order.
const DECODERS: &[fn(bool, &[u8])] = &[
    method::<meta::MetaCall>,
    method::<meta::MetaBatchCall>,
    method::<meta::MetaFsckCall>,
    method::<meta::MetaSyncCall>,
    method::<storage::WriteChunk>,
    method::<storage::ForwardChunk>,
    method::<storage::BatchRead>,
    method::<storage::CommitChunk>,
    method::<storage::QueryLastChunk>,
    method::<storage::RemoveChunks>,
    method::<storage::SpaceInfo>,
    method::<storage::DumpChunkMeta>,
    method::<storage::SyncStart>,
    method::<storage::SyncDone>,
    method::<storage::QueryChunk>,
    method::<storage::CopyRange>,
    method::<mgmtd::Heartbeat>,
    method::<mgmtd::GetRouting>,
    method::<mgmtd::MgmtdStatus>,
    method::<mgmtd::MetaHeartbeat>,
];

fuzz_target!(|data: &[u8]| {
    // A new method must be added above (the proto crate's own test keeps
    // all_methods() complete).
    assert_eq!(DECODERS.len(), fskv_proto::all_methods().len(), "rpc_messages misses a method of fskv_proto::all_methods()");
    let [which, flags, body @ ..] = data else { return };
    DECODERS[*which as usize % DECODERS.len()](flags & 1 == 1, body);
});
