//! Key schema and value encoding (documented in `docs/meta.md`).
//!
//! Every key starts with a 4-byte ASCII prefix. Inode ids inside keys are
//! 8 bytes little-endian (as 3FS: consecutive ids spread across shards).
//! Values are one version byte ([`VALUE_VERSION`]) followed by bincode with
//! fixed-width little-endian integers.

use crate::error::{MetaError, MetaResult};
use bincode::Options;
use fskv_proto::meta::{InodeKind, MetaReply};
use fskv_types::InodeId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub const PREFIX_INODE: &[u8; 4] = b"INOD";
pub const PREFIX_DENTRY: &[u8; 4] = b"DENT";
pub const PREFIX_XATTR: &[u8; 4] = b"XATR";
pub const PREFIX_SESSION: &[u8; 4] = b"SESS";
pub const PREFIX_IDEMPOTENCY: &[u8; 4] = b"IDEM";
/// Time index of idempotency records (for expiry without a full scan).
pub const PREFIX_IDEMPOTENCY_EXPIRY: &[u8; 4] = b"IDEX";
pub const PREFIX_GC: &[u8; 4] = b"GCQU";
pub const PREFIX_ALLOC: &[u8; 4] = b"IALC";
pub const PREFIX_STATS: &[u8; 4] = b"MSTA";
/// A directory's last namespace change (ns, 8-byte LE, written with atomic
/// max so that creates in one directory never conflict on it).
pub const PREFIX_DIR_TIME: &[u8; 4] = b"DTIM";
/// A directory's number of subdirectories (i64 LE, atomic add), so its
/// nlink (2 + subdirectories) needs no write of the directory's inode.
pub const PREFIX_DIR_SUBDIRS: &[u8; 4] = b"DSUB";
/// Counter of live inodes (8-byte LE, maintained with atomic adds).
pub const KEY_INODE_COUNT: &[u8] = b"MSTAinodes";
/// Counter of meta server starts (i64 LE, read and bumped in a synced
/// transaction at each start): the floor of in-place overwrite versions.
pub const KEY_META_BOOTS: &[u8] = b"MSTAboots";
/// Bits of an inode version below the boot count ([`crate::ops::Prepared::version_floor`]).
pub const VERSION_FLOOR_SHIFT: u32 = 40;

/// Version byte in front of every encoded value.
pub const VALUE_VERSION: u8 = 1;

fn with_prefix(prefix: &[u8; 4], id: InodeId, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(12 + rest.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(&id.0.to_le_bytes());
    k.extend_from_slice(rest);
    k
}

pub fn inode_key(id: InodeId) -> Vec<u8> {
    with_prefix(PREFIX_INODE, id, &[])
}

pub fn dentry_key(parent: InodeId, name: &str) -> Vec<u8> {
    with_prefix(PREFIX_DENTRY, parent, name.as_bytes())
}

/// Prefix of every entry of directory `parent`.
pub fn dentry_prefix(parent: InodeId) -> Vec<u8> {
    with_prefix(PREFIX_DENTRY, parent, &[])
}

pub fn xattr_key(id: InodeId, name: &str) -> Vec<u8> {
    with_prefix(PREFIX_XATTR, id, name.as_bytes())
}

pub fn xattr_prefix(id: InodeId) -> Vec<u8> {
    with_prefix(PREFIX_XATTR, id, &[])
}

pub fn session_key(id: InodeId, session: u64) -> Vec<u8> {
    with_prefix(PREFIX_SESSION, id, &session.to_be_bytes())
}

pub fn session_prefix(id: InodeId) -> Vec<u8> {
    with_prefix(PREFIX_SESSION, id, &[])
}

pub fn dir_time_key(dir: InodeId) -> Vec<u8> {
    with_prefix(PREFIX_DIR_TIME, dir, &[])
}

pub fn dir_subdirs_key(dir: InodeId) -> Vec<u8> {
    with_prefix(PREFIX_DIR_SUBDIRS, dir, &[])
}

pub fn gc_key(id: InodeId) -> Vec<u8> {
    with_prefix(PREFIX_GC, id, &[])
}

pub fn idempotency_key(client_id: u64, request_id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(20);
    k.extend_from_slice(PREFIX_IDEMPOTENCY);
    k.extend_from_slice(&client_id.to_be_bytes());
    k.extend_from_slice(&request_id.to_be_bytes());
    k
}

/// `IDEX` + created ns (u64 BE) + client id (u64 BE) + request id (u64 BE).
pub fn idempotency_expiry_key(created_ns: u64, client_id: u64, request_id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(28);
    k.extend_from_slice(PREFIX_IDEMPOTENCY_EXPIRY);
    k.extend_from_slice(&created_ns.to_be_bytes());
    k.extend_from_slice(&client_id.to_be_bytes());
    k.extend_from_slice(&request_id.to_be_bytes());
    k
}

/// The `IDEM` key named by an `IDEX` key.
pub fn idempotency_key_of_expiry(expiry_key: &[u8]) -> MetaResult<Vec<u8>> {
    let ids = expiry_key.get(12..28).filter(|_| expiry_key.len() == 28).ok_or_else(|| corrupt(expiry_key, "expiry key is not 28 bytes"))?;
    let mut k = PREFIX_IDEMPOTENCY.to_vec();
    k.extend_from_slice(ids);
    Ok(k)
}

pub fn alloc_key(shard: u8) -> Vec<u8> {
    let mut k = PREFIX_ALLOC.to_vec();
    k.push(shard);
    k
}

/// The inode id in an `INOD`/`GCQU`/... key (bytes 4..12).
pub fn id_from_key(key: &[u8]) -> MetaResult<InodeId> {
    let raw: [u8; 8] = key.get(4..12).and_then(|s| s.try_into().ok()).ok_or_else(|| corrupt(key, "key shorter than prefix + inode id"))?;
    Ok(InodeId(u64::from_le_bytes(raw)))
}

/// The name in a `DENT`/`XATR` key (bytes 12..).
pub fn name_from_key(key: &[u8]) -> MetaResult<String> {
    let raw = key.get(12..).ok_or_else(|| corrupt(key, "key shorter than prefix + inode id"))?;
    String::from_utf8(raw.to_vec()).map_err(|_| corrupt(key, "name is not UTF-8"))
}

/// Value of a `DENT` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DentryValue {
    pub inode: InodeId,
    pub kind: InodeKind,
}

/// Value of a `SESS` key: an open-for-write session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionValue {
    pub client_id: u64,
    pub opened_ns: u64,
}

/// What the GC must do with a `GCQU` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GcKind {
    /// An unlinked file: remove its chunks, then the inode.
    File,
    /// A detached directory tree: empty it entry by entry, then remove it.
    Tree,
    /// A file created unlinked for a later Replace: reclaim it as a File if
    /// it is still unpublished after the temp TTL.
    Temp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcValue {
    pub kind: GcKind,
    pub queued_ns: u64,
}

/// Value of an `IDEM` key: the first successful reply of a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyValue {
    pub created_ns: u64,
    /// Name of the op that recorded it: a request id reused for another op is refused.
    pub op: String,
    pub reply: MetaReply,
}

fn opts() -> impl Options {
    bincode::DefaultOptions::new().with_fixint_encoding().with_little_endian()
}

pub fn encode<T: Serialize>(value: &T) -> MetaResult<Vec<u8>> {
    let mut out = vec![VALUE_VERSION];
    opts().serialize_into(&mut out, value).map_err(|e| MetaError::Internal(format!("encode: {e}")))?;
    Ok(out)
}

pub fn decode<T: DeserializeOwned>(key: &[u8], raw: &[u8]) -> MetaResult<T> {
    match raw.split_first() {
        Some((&VALUE_VERSION, body)) => {
            let limited = opts().with_limit(body.len() as u64 + 64);
            limited.deserialize(body).map_err(|e| corrupt(key, &format!("bad value: {e}")))
        }
        Some((v, _)) => Err(corrupt(key, &format!("unknown value version {v}"))),
        None => Err(corrupt(key, "empty value")),
    }
}

pub fn corrupt(key: &[u8], reason: &str) -> MetaError {
    MetaError::Corrupt { key: String::from_utf8_lossy(key).into_owned(), reason: reason.to_string() }
}

pub fn decode_i64(key: &[u8], raw: &[u8]) -> MetaResult<i64> {
    let arr: [u8; 8] = raw.try_into().map_err(|_| corrupt(key, "counter is not 8 bytes"))?;
    Ok(i64::from_le_bytes(arr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_3fs_schema() {
        assert_eq!(inode_key(InodeId(0x0102)), b"INOD\x02\x01\0\0\0\0\0\0".to_vec());
        assert_eq!(dentry_key(InodeId(1), "ab"), b"DENT\x01\0\0\0\0\0\0\0ab".to_vec());
        assert_eq!(id_from_key(&inode_key(InodeId(77))).ok(), Some(InodeId(77)));
        assert_eq!(name_from_key(&dentry_key(InodeId(5), "x.txt")).ok(), Some("x.txt".to_string()));
    }

    #[test]
    fn decode_rejects_garbage_with_clear_errors() {
        let v = DentryValue { inode: InodeId(9), kind: InodeKind::File };
        let raw = encode(&v).unwrap();
        assert_eq!(decode::<DentryValue>(b"k", &raw).unwrap(), v);
        assert!(matches!(decode::<DentryValue>(b"k", &[]), Err(MetaError::Corrupt { .. })));
        assert!(matches!(decode::<DentryValue>(b"k", &[9, 1, 2]), Err(MetaError::Corrupt { .. })));
        assert!(matches!(decode::<DentryValue>(b"k", &raw[..raw.len() - 1]), Err(MetaError::Corrupt { .. })));
        let mut trailing = raw.clone();
        trailing.push(0);
        assert!(matches!(decode::<DentryValue>(b"k", &trailing), Err(MetaError::Corrupt { .. })));
        // A corrupt length prefix must not allocate gigabytes.
        let mut huge = encode(&IdempotencyValue { created_ns: 1, op: String::new(), reply: MetaReply::Data(vec![1, 2, 3]) }).unwrap();
        let len_at = huge.len() - 3 - 8;
        huge[len_at..len_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode::<IdempotencyValue>(b"k", &huge), Err(MetaError::Corrupt { .. })));
    }
}
