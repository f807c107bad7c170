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
//!
//! A **user key file** (`fskv admin user-key`, format in
//! `fskv_rpc::auth::KeyFile`: the principal name on line 1, its derived key
//! on line 2) makes a client command claim that `user:<uid>:<gid>[:groups]`
//! principal instead of `client`: meta then acts as that user and storage
//! wants chunk capabilities. Every command that claims another name
//! (mgmtd, storage, meta, mount, gateways, front) refuses to start with
//! one: they need the cluster key itself.

use crate::config::Config;
use anyhow::Context;
use fskv_rpc::auth::{ClusterKey, KeyFile, ProcessIdentity, UserPrincipal};
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
        (Some(path), _) => match KeyFile::load(&path).map_err(anyhow::Error::msg)? {
            KeyFile::Cluster(key) => Some(Arc::new(key)),
            KeyFile::User { principal: user, key } if principal == "client" => {
                install_key(Some(Arc::new(key)), &user);
                return Ok(());
            }
            KeyFile::User { principal: user, .. } => anyhow::bail!(
                "{} is a user key (for {user}); this command runs as {principal:?} and needs the cluster key — \
                 user keys are for client commands (put, get, …) only",
                path.display()
            ),
        },
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

/// `fskv admin user-key`: writes the key of `user:<uid>:<gid>[:groups]`
/// (derived from this process's cluster key) to `out`, created with
/// `O_CREAT|O_EXCL` and mode 0600 and then given to `uid:gid`, so only that
/// user (and root) can read it. Returns the principal name.
pub fn write_user_key(uid: u32, gid: Option<u32>, groups: &[u32], out: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let identity = fskv_rpc::auth::current();
    let key = match identity.key {
        Some(key) if !fskv_rpc::auth::is_user_principal(&identity.principal) => key,
        Some(_) => anyhow::bail!("issuing a user key needs the cluster key, and this command was given a user key"),
        None => anyhow::bail!("issuing a user key needs the cluster key: pass --cluster-key-file FILE (or FSKV_CLUSTER_KEY_FILE)"),
    };
    let name = UserPrincipal { uid, gid: gid.unwrap_or(uid), groups: groups.to_vec() }.name().map_err(anyhow::Error::msg)?;
    let text = KeyFile::user_text(&name, &key.derive_user_key(&name));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("cannot create the user key file {} (it must not exist yet)", out.display()))?;
    let written = file
        .write_all(text.as_bytes())
        .and_then(|()| std::os::unix::fs::fchown(&file, Some(uid), Some(gid.unwrap_or(uid))))
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(out);
        return Err(e).with_context(|| format!("cannot write the user key file {} for {name} (chown needs root)", out.display()));
    }
    Ok(name)
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

    #[test]
    fn user_key_files_name_their_principal_and_services_refuse_them() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = ClusterKey::generate();
        let name = "user:65534:65534";
        let path = dir.path().join("user.key");
        std::fs::write(&path, KeyFile::user_text(name, &cluster.derive_user_key(name))).unwrap();
        let mut config = Config::default();
        config.up.data_dir = dir.path().join("none");
        for service in ["mgmtd", "node:1", "meta:1", "fuse", "gateway"] {
            let e = install(Some(&path), false, &config, service, Need::Optional).unwrap_err();
            assert!(format!("{e:#}").contains("is a user key (for user:65534:65534)"), "{service}: {e:#}");
        }
    }
}
