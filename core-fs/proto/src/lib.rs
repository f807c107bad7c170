//! `fskv-proto`: what the services say to each other — every RPC message and
//! method declaration, and the routing info mgmtd publishes.
//!
//! | module | service | method ids |
//! |---|---|---|
//! | [`meta`] | metadata service | 1000–1999 |
//! | [`storage`] | storage service | 2000–2999 |
//! | [`mgmtd`] | cluster manager | 3000–3999 |
//! | [`routing`] | (data carried by mgmtd's `GetRouting`) | — |
//! | [`cap`] | chunk capabilities (meta issues, storage checks) | — |
//!
//! **API Boundary**: a server and its callers share only this crate. A server
//! implements the methods declared here; a client calls them; neither links
//! the other. Method ids are part of the wire format: never reuse one for a
//! different message shape (the test below checks they are unique across
//! every service, since one process may serve several routers on one port).
//!
//! Plain data and pure functions only: no I/O, no async.

pub mod cap;
pub mod meta;
pub mod mgmtd;
pub mod routing;
pub mod storage;

/// `(id, name)` of every method declared in this crate.
pub fn all_methods() -> Vec<(u16, &'static str)> {
    use fskv_rpc::Method;
    fn m<M: Method>() -> (u16, &'static str) {
        (M::ID, M::NAME)
    }
    vec![
        m::<meta::MetaCall>(),
        m::<meta::MetaBatchCall>(),
        m::<meta::MetaFsckCall>(),
        m::<meta::MetaSyncCall>(),
        m::<meta::MetaIssueCap>(),
        m::<storage::WriteChunk>(),
        m::<storage::ForwardChunk>(),
        m::<storage::BatchRead>(),
        m::<storage::CommitChunk>(),
        m::<storage::QueryLastChunk>(),
        m::<storage::RemoveChunks>(),
        m::<storage::SpaceInfo>(),
        m::<storage::DumpChunkMeta>(),
        m::<storage::SyncStart>(),
        m::<storage::SyncDone>(),
        m::<storage::QueryChunk>(),
        m::<storage::CopyRange>(),
        m::<storage::InjectDiskFault>(),
        m::<storage::InjectBitRot>(),
        m::<mgmtd::Heartbeat>(),
        m::<mgmtd::GetRouting>(),
        m::<mgmtd::MgmtdStatus>(),
        m::<mgmtd::MetaHeartbeat>(),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    #[test]
    fn method_ids_are_unique_across_services_and_in_their_service_range() {
        let mut seen: BTreeMap<u16, &str> = BTreeMap::new();
        for (id, name) in super::all_methods() {
            if let Some(other) = seen.insert(id, name) {
                panic!("method id {id} declared twice: {other} and {name}");
            }
            let range = match name.split('.').next() {
                Some("meta") => 1000..2000,
                Some("storage") => 2000..3000,
                Some("mgmtd") => 3000..4000,
                _ => panic!("method {name} has no service prefix"),
            };
            assert!(range.contains(&id), "{name} = {id} is outside its service's range {range:?}");
        }
        // Every declaration in the sources is listed above (a new method must
        // be added to `all_methods`, or this count catches it).
        let declared: usize = [include_str!("meta.rs"), include_str!("storage.rs"), include_str!("mgmtd.rs")]
            .iter()
            .map(|src| src.matches("fskv_rpc::rpc_method!(").count())
            .sum();
        assert_eq!(declared, seen.len(), "a declared method is missing from all_methods()");
    }
}
