//! Keys and namespaces of the KV gateway. The key encoding (an
//! order-preserving name for any key bytes, long keys as chains of
//! continuation directories) is shared with the S3 gateway's flat buckets
//! and lives in [`fskv_client::keyname`]; this module re-exports it and adds
//! what is the KV gateway's own: namespace names and the key-length bound.

pub use fskv_client::keyname::*;

/// Hard upper bound on `max_key_bytes` (the configured limit; default 4096).
pub const MAX_KEY_BYTES_LIMIT: usize = 16 << 10;

/// Namespace names: 1..=64 bytes of `[A-Za-z0-9._-]`, starting with a letter
/// or digit (so never `.`/`..`, and the gateway's own `.fskv-kv` directory
/// is not a namespace).
pub fn is_namespace_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names() {
        for ok in ["a", "kv-cache", "T1.x_y", &"n".repeat(64)] {
            assert!(is_namespace_name(ok), "{ok}");
        }
        for bad in ["", ".fskv-kv", "-a", "a/b", "a b", "é", &"n".repeat(65)] {
            assert!(!is_namespace_name(bad), "{bad}");
        }
    }
}
