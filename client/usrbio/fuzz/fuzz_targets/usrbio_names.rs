//! The names a program creates in the mount's virtual directory
//! `3fs-virt/iovs/` to register iovs and rings (proto.rs, `IovKey::parse`):
//! the FUSE daemon parses them from `symlink`/`unlink` calls of any local
//! process. Never panics; a name that parses prints back to a name that
//! parses to the same key (the C library's spelling is canonical); ring
//! flags are only known ones; ids parse from 32 hex digits (dashes allowed).
#![no_main]

use fskv_usrbio::proto::{self, IovKey, KNOWN_FLAGS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else { return };
    if let Some(id) = proto::parse_id(name) {
        assert_eq!(proto::parse_id(&proto::id_hex(&id)), Some(id));
    }
    let Ok(key) = IovKey::parse(name) else { return };
    if let Some(r) = key.ring {
        assert_eq!(r.flags & !KNOWN_FLAGS, 0);
    }
    let printed = key.to_string();
    assert_eq!(IovKey::parse(&printed), Ok(key), "{name:?} printed as {printed:?}");
});
