//! Limits shared by every engine, equal to FoundationDB's so that code written
//! against the embedded engine runs unchanged on FoundationDB.

/// Largest key, in bytes (FoundationDB: 10,000).
pub const MAX_KEY_BYTES: usize = 10_000;
/// Largest value, in bytes (FoundationDB: 100,000).
pub const MAX_VALUE_BYTES: usize = 100_000;
/// Largest transaction (mutations plus conflict ranges), in bytes
/// (FoundationDB: 10,000,000).
pub const MAX_TRANSACTION_BYTES: usize = 10_000_000;

use crate::{KvError, KvResult};

pub fn check_key(key: &[u8]) -> KvResult<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(KvError::KeyTooLarge { len: key.len(), limit: MAX_KEY_BYTES });
    }
    Ok(())
}

pub fn check_value(value: &[u8]) -> KvResult<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(KvError::ValueTooLarge { len: value.len(), limit: MAX_VALUE_BYTES });
    }
    Ok(())
}

pub fn check_range(begin: &[u8], end: &[u8]) -> KvResult<()> {
    // FoundationDB allows range ends one byte past the key limit (strinc of a max key).
    if begin.len() > MAX_KEY_BYTES + 1 || end.len() > MAX_KEY_BYTES + 1 {
        return Err(KvError::KeyTooLarge { len: begin.len().max(end.len()), limit: MAX_KEY_BYTES });
    }
    if begin > end {
        return Err(KvError::InvalidArgument("range begin is after its end".into()));
    }
    Ok(())
}

/// Adds `bytes` to a transaction's running size, refusing to pass
/// [`MAX_TRANSACTION_BYTES`] (mutations plus conflict ranges, as FoundationDB counts).
pub fn grow_transaction(size_bytes: &mut usize, bytes: usize) -> KvResult<()> {
    let size = size_bytes.saturating_add(bytes);
    if size > MAX_TRANSACTION_BYTES {
        return Err(KvError::TransactionTooLarge { size, limit: MAX_TRANSACTION_BYTES });
    }
    *size_bytes = size;
    Ok(())
}
