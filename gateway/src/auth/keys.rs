//! The key store: access key → secret and the user/tenant that owns it,
//! plus optional bearer tokens, loaded from the credentials file.
//!
//! File format (what `fskv up` writes to `DIR/credentials.json`, mode 0600):
//! one object or a list of objects
//!
//! | field | required | meaning |
//! |---|---|---|
//! | `access_key` | yes | the SigV4 access key id (unique in the file) |
//! | `secret_key` | yes | its secret |
//! | `user` | no (default: the access key) | the user requests signed with it act as |
//! | `tenant` | no (default `"default"`) | the tenant owning that user |
//! | `bearer_token` | no | a token accepted as `Authorization: Bearer <token>` for the same user (unique) |
//!
//! Secrets are kept in memory as given (SigV4 needs them); tokens only as
//! their SHA-256, looked up by the hash of the presented token. The store can
//! be replaced while serving ([`KeyStore::reload`]): requests in flight keep
//! the keys they started with.

use crate::error::GatewayError;
use parking_lot::RwLock;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One access key as configured.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessKey {
    pub access_key: String,
    pub secret_key: String,
    pub user: String,
    pub tenant: String,
    pub bearer_token: Option<String>,
}

impl AccessKey {
    /// A key of user `access_key` in tenant `default`, without a bearer token.
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        let access_key = access_key.into();
        AccessKey { user: access_key.clone(), access_key, secret_key: secret_key.into(), tenant: DEFAULT_TENANT.into(), bearer_token: None }
    }
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessKey")
            .field("access_key", &self.access_key)
            .field("user", &self.user)
            .field("tenant", &self.tenant)
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

pub const DEFAULT_TENANT: &str = "default";

/// How a request proved who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    SigV4Header,
    SigV4Presigned,
    Bearer,
}

/// Who a request acts as, once authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub access_key: String,
    pub user: String,
    pub tenant: String,
    pub method: AuthMethod,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    access_key: String,
    secret_key: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    bearer_token: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FileKeys {
    One(FileEntry),
    Many(Vec<FileEntry>),
}

#[derive(Default)]
struct Keys {
    by_access_key: HashMap<String, Arc<AccessKey>>,
    by_token_sha256: HashMap<[u8; 32], Arc<AccessKey>>,
    /// From the user store ([`crate::auth::users`]); empty for a store
    /// loaded from a credentials file alone.
    tenants: HashMap<String, TenantIds>,
}

/// The local identity a tenant's files are written as; the owner uid of a
/// bucket / namespace / topic directory names its tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantIds {
    pub uid: u32,
    pub gid: u32,
}

impl TenantIds {
    /// Tenant `default` when the user store does not say otherwise: root,
    /// which is what everything made before tenants is owned by.
    pub const DEFAULT: TenantIds = TenantIds { uid: 0, gid: 0 };
}

/// Access keys and bearer tokens; cheap to share (`Arc<KeyStore>`).
pub struct KeyStore {
    keys: RwLock<Arc<Keys>>,
}

impl std::fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyStore({} keys)", self.len())
    }
}

fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn build(list: Vec<AccessKey>) -> Result<Keys, GatewayError> {
    let mut keys = Keys::default();
    for k in list {
        let name = k.access_key.clone();
        let bad = |why: &str| GatewayError::Setup(format!("access key {name:?}: {why}"));
        if k.access_key.is_empty() || !k.access_key.bytes().all(|b| b.is_ascii_graphic() && b != b'/' && b != b',' && b != b'=') {
            return Err(bad("must be non-empty printable ASCII without '/', ',' or '='"));
        }
        if k.secret_key.is_empty() {
            return Err(bad("empty secret key"));
        }
        if k.user.is_empty() || k.tenant.is_empty() {
            return Err(bad("empty user or tenant"));
        }
        let k = Arc::new(k);
        if let Some(t) = &k.bearer_token {
            if t.len() < 16 {
                return Err(bad("bearer_token must be at least 16 characters"));
            }
            if keys.by_token_sha256.insert(token_hash(t), Arc::clone(&k)).is_some() {
                return Err(bad("bearer_token is also given to another key"));
            }
        }
        if keys.by_access_key.insert(k.access_key.clone(), Arc::clone(&k)).is_some() {
            return Err(GatewayError::Setup(format!("access key {:?} appears twice", k.access_key)));
        }
    }
    Ok(keys)
}

impl KeyStore {
    /// A store of `keys`; access keys and tokens must be unique.
    pub fn new(keys: Vec<AccessKey>) -> Result<KeyStore, GatewayError> {
        Ok(KeyStore { keys: RwLock::new(Arc::new(build(keys)?)) })
    }

    /// Parses the credentials file format (see the module docs).
    pub fn parse(json: &[u8]) -> Result<Vec<AccessKey>, GatewayError> {
        let parsed: FileKeys = serde_json::from_slice(json).map_err(|e| {
            GatewayError::Setup(format!(
                "expected {{\"access_key\", \"secret_key\"[, \"user\", \"tenant\", \"bearer_token\"]}} or a list of them: {e}"
            ))
        })?;
        let list = match parsed {
            FileKeys::One(k) => vec![k],
            FileKeys::Many(v) => v,
        };
        if list.is_empty() {
            return Err(GatewayError::Setup("no access keys".into()));
        }
        Ok(list
            .into_iter()
            .map(|e| AccessKey {
                user: e.user.unwrap_or_else(|| e.access_key.clone()),
                tenant: e.tenant.unwrap_or_else(|| DEFAULT_TENANT.into()),
                access_key: e.access_key,
                secret_key: e.secret_key,
                bearer_token: e.bearer_token,
            })
            .collect())
    }

    /// Loads the credentials file at `path`.
    pub fn load(path: &Path) -> Result<KeyStore, GatewayError> {
        KeyStore::new(Self::read_file(path)?)
    }

    fn read_file(path: &Path) -> Result<Vec<AccessKey>, GatewayError> {
        let text = std::fs::read(path).map_err(|e| GatewayError::Setup(format!("cannot read credentials {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| GatewayError::Setup(format!("{}: {e}", path.display())))
    }

    /// Replaces the keys with those of `path` (e.g. after a key was revoked);
    /// on an error the old keys stay.
    pub fn reload(&self, path: &Path) -> Result<(), GatewayError> {
        self.replace(Self::read_file(path)?)
    }

    /// Replaces the keys; on an error the old keys stay.
    pub fn replace(&self, keys: Vec<AccessKey>) -> Result<(), GatewayError> {
        self.replace_with_tenants(keys, Vec::new())
    }

    /// Replaces the keys and the tenants' uid/gid (the user store's
    /// [`crate::auth::users::UserDb::install`]); on an error the old stay.
    pub fn replace_with_tenants(&self, keys: Vec<AccessKey>, tenants: Vec<(String, TenantIds)>) -> Result<(), GatewayError> {
        let mut new = build(keys)?;
        new.tenants = tenants.into_iter().collect();
        *self.keys.write() = Arc::new(new);
        Ok(())
    }

    /// The uid/gid of `tenant`: the user store's, or for `default` without
    /// one [`TenantIds::DEFAULT`]; `None` for a tenant the store does not know.
    pub fn tenant(&self, tenant: &str) -> Option<TenantIds> {
        match self.keys.read().tenants.get(tenant) {
            Some(t) => Some(*t),
            None if tenant == DEFAULT_TENANT => Some(TenantIds::DEFAULT),
            None => None,
        }
    }

    /// The key record of `access_key`.
    pub fn get(&self, access_key: &str) -> Option<Arc<AccessKey>> {
        self.keys.read().by_access_key.get(access_key).cloned()
    }

    /// The key record a bearer token belongs to (looked up by its SHA-256).
    pub fn by_bearer_token(&self, token: &str) -> Option<Arc<AccessKey>> {
        self.keys.read().by_token_sha256.get(&token_hash(token)).cloned()
    }

    pub fn len(&self) -> usize {
        self.keys.read().by_access_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AccessKey {
    pub fn principal(&self, method: AuthMethod) -> Principal {
        Principal { access_key: self.access_key.clone(), user: self.user.clone(), tenant: self.tenant.clone(), method }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_file_fskv_up_writes_and_lists() {
        let one = KeyStore::parse(br#"{"access_key": "FSKVAK", "secret_key": "s3cr3t"}"#).unwrap();
        assert_eq!(one, vec![AccessKey::new("FSKVAK", "s3cr3t")]);
        let many = KeyStore::parse(
            br#"[{"access_key": "a", "secret_key": "x", "user": "alice", "tenant": "t1", "bearer_token": "0123456789abcdefXYZ"},
                 {"access_key": "b", "secret_key": "y"}]"#,
        )
        .unwrap();
        let store = KeyStore::new(many).unwrap();
        assert_eq!(store.len(), 2);
        let a = store.get("a").unwrap();
        assert_eq!((a.user.as_str(), a.tenant.as_str()), ("alice", "t1"));
        assert_eq!(store.by_bearer_token("0123456789abcdefXYZ").unwrap().access_key, "a");
        assert!(store.by_bearer_token("0123456789abcdefXYz").is_none());
        assert!(store.get("c").is_none());
    }

    #[test]
    fn bad_files_are_clear_errors() {
        for (text, want) in [
            (&br#"[]"#[..], "no access keys"),
            (br#"{"access_key": "a"}"#, "expected"),
            (br#"{"access_key": "a", "secret_key": "s", "secret": 1}"#, "expected"),
            (br#"[{"access_key": "a", "secret_key": "s"}, {"access_key": "a", "secret_key": "t"}]"#, "twice"),
            (br#"{"access_key": "a/b", "secret_key": "s"}"#, "without '/'"),
            (br#"{"access_key": "a", "secret_key": ""}"#, "empty secret"),
            (br#"{"access_key": "a", "secret_key": "s", "bearer_token": "short"}"#, "16"),
        ] {
            let e = KeyStore::parse(text).and_then(KeyStore::new).unwrap_err();
            assert!(e.to_string().contains(want), "{e} (want {want})");
        }
    }

    #[test]
    fn replace_keeps_old_keys_on_error() {
        let store = KeyStore::new(vec![AccessKey::new("a", "x")]).unwrap();
        assert!(store.replace(vec![AccessKey::new("", "x")]).is_err());
        assert!(store.get("a").is_some());
        store.replace(vec![AccessKey::new("b", "y")]).unwrap();
        assert!(store.get("a").is_none());
        assert!(store.get("b").is_some());
    }

    #[test]
    fn debug_hides_secrets() {
        let mut k = AccessKey::new("a", "supersecret");
        k.bearer_token = Some("tokentokentokentoken".into());
        let s = format!("{k:?}");
        assert!(!s.contains("supersecret") && !s.contains("tokentoken"), "{s}");
    }
}
