//! The process's service identity: which cluster key its RPC clients and
//! servers use and which principal name it claims (docs/security.md,
//! `fskv_rpc::auth`).
//!
//! Where the key comes from, first match wins:
//!
//! | source | set by |
//! |---|---|
//! | `--cluster-key-file FILE` / env `FSKV_CLUSTER_KEY_FILE` | the operator, deploy scripts, tests |
//! | `[security] cluster_key_file` of `--config` | `fskv up` (its effective configuration, read by every child) |
//! | `cluster.key` in the command's data directory (`up.data_dir`, default `./data`) if the file exists | `fskv up` on its first start |
//!
//! | command | principal | without a key |
//! |---|---|---|
//! | `mgmtd` | `mgmtd` | refuses to start unless `--insecure-no-auth` |
//! | `storage --node-id N` | `node:N` | refuses to start unless `--insecure-no-auth` |
//! | `meta --node-id N` | `meta:N` (meta ids overlap storage node ids) | refuses to start unless `--insecure-no-auth` |
//! | `mount` | `fuse` | talks without authentication (only an unauthenticated cluster answers) |
//! | `gateway …`, `front` | `gateway` | same |
//! | `up` | `client` | creates `DIR/cluster.key` (0600, `O_EXCL`) on its first start |
//! | everything else | `client` | same as mount |
//!
//! A key file that exists but cannot be read (an untrusted user) is always
//! an error with exit code 2, never a silent fallback.

use crate::config::Config;
use anyhow::Context;
use fskv_rpc::auth::{ClusterKey, ProcessIdentity};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File name of the key in a data directory.
pub const KEY_FILE: &str = "cluster.key";

/// What a command needs.
pub enum Need {
    /// A service: a key, or `--insecure-no-auth`.
    Required,
    /// A client: the key if one is found.
    Optional,
}

/// The explicitly configured key file: the flag (or its env), else `[security]`.
pub fn explicit_key_file(flag: Option<&Path>, config: &Config) -> Option<PathBuf> {
    flag.map(Path::to_path_buf)
        .or_else(|| (!config.security.cluster_key_file.as_os_str().is_empty()).then(|| config.security.cluster_key_file.clone()))
}

/// Finds, loads and installs the process's identity.
pub fn install(flag: Option<&Path>, insecure: bool, config: &Config, principal: &str, need: Need) -> anyhow::Result<()> {
    let path = explicit_key_file(flag, config).or_else(|| {
        let in_data = config.up.data_dir.join(KEY_FILE);
        // Exists (even if unreadable: then the load below says why).
        std::fs::symlink_metadata(&in_data).is_ok().then_some(in_data)
    });
    let key = match (path, need) {
        (Some(_), _) if insecure => {
            tracing::warn!("--insecure-no-auth: RPC connections are NOT authenticated (tests and development only)");
            None
        }
        (Some(path), _) => Some(Arc::new(ClusterKey::load(&path).map_err(anyhow::Error::msg)?)),
        (None, Need::Required) if insecure => {
            tracing::warn!("--insecure-no-auth: RPC connections are NOT authenticated (tests and development only)");
            None
        }
        (None, Need::Required) => anyhow::bail!(
            "no cluster key: pass --cluster-key-file FILE (or FSKV_CLUSTER_KEY_FILE, or [security] cluster_key_file); \
             --insecure-no-auth runs without authentication (tests and development only)"
        ),
        (None, Need::Optional) => None,
    };
    install_key(key, principal);
    Ok(())
}

/// Installs `key` and `principal` for every RPC client and server made with
/// `default()` from now on.
pub fn install_key(key: Option<Arc<ClusterKey>>, principal: &str) {
    fskv_rpc::auth::install(ProcessIdentity { key, principal: principal.into() });
}

/// Loads `DIR/cluster.key`, creating it first if it does not exist: 32
/// random bytes in hex, created with `O_CREAT|O_EXCL` and mode 0600 so no
/// other user can ever read it (no window between create and chmod).
pub fn load_or_create(dir: &Path) -> anyhow::Result<(PathBuf, Arc<ClusterKey>)> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(KEY_FILE);
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
        Ok(mut file) => {
            let key = ClusterKey::generate();
            let written = file.write_all(key.to_hex().as_bytes()).and_then(|()| file.sync_all());
            if let Err(e) = written {
                // Never leave a half-written key behind for the next start.
                let _ = std::fs::remove_file(&path);
                return Err(e).with_context(|| format!("cannot write the cluster key {}", path.display()));
            }
            Ok((path, Arc::new(key)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let key = ClusterKey::load(&path).map_err(anyhow::Error::msg)?;
            Ok((path, Arc::new(key)))
        }
        Err(e) => Err(e).with_context(|| format!("cannot create the cluster key {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_once_with_mode_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, first) = load_or_create(dir.path()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (_, again) = load_or_create(dir.path()).unwrap();
        assert_eq!(first.to_hex(), again.to_hex());
        // A corrupt file is an error, not a silent new key.
        std::fs::write(&path, "not a key").unwrap();
        let e = load_or_create(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("is invalid"), "{e:#}");
    }
}
