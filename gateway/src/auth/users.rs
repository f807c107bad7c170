//! The user store every gateway process shares: tenants (each mapped to
//! the local uid/gid the gateway writes its files as) and users (each in one
//! tenant, with an access key, its secret and an optional bearer token).
//!
//! It lives in the cluster as one JSON document ([`UserDb`]; `fskv` keeps it
//! at `/.fskv-admin/users.json`, dir 0700, file 0600, replaced atomically)
//! so gateways started on any host see the same users. This module is pure:
//! the document, its checks and edits, and [`watch`], which polls a
//! [`UserSource`] and swaps a [`KeyStore`]'s keys when the document changes.
//!
//! | rule | why |
//! |---|---|
//! | tenant and user names: 1-64 of `a-z 0-9 . _ -`, starting with a letter or digit | names appear in paths, logs and CLI output |
//! | a tenant's uid is unique among tenants | ownership is the owner uid of a bucket / namespace / topic directory |
//! | tenant `default` exists, uid 0 gid 0 unless set otherwise | what existed before tenants (written as root) belongs to it |
//! | access keys and bearer tokens are unique | one key → one user |
//! | a revoked user is removed from the document | its key is refused once every gateway re-read the document (≤ the poll interval) |
//! | an unreadable or invalid document keeps the keys a gateway has | a bad edit never locks everyone out |

use super::keys::{AccessKey, KeyStore, TenantIds, DEFAULT_TENANT};
use crate::error::GatewayError;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Format version of the document.
pub const USER_DB_FORMAT: u32 = 1;
/// Default interval between two polls of the document by a gateway: the
/// bound on how long a revoked key keeps working (plus one meta lookup).
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 1_000;
/// The uid (and gid) given to a tenant created without one: the first free
/// one from here.
pub const FIRST_TENANT_UID: u32 = 20_000;
/// Largest document accepted (a gateway reads it whole).
pub const MAX_USER_DB_BYTES: u64 = 16 << 20;

/// A tenant: who owns buckets, namespaces and topics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    pub uid: u32,
    pub gid: u32,
}

/// A user: one key of one tenant.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub tenant: String,
    pub access_key: String,
    pub secret_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<String>,
    /// Created by the bootstrap from the credentials file.
    #[serde(default)]
    pub admin: bool,
    /// Nanoseconds since the Unix epoch.
    #[serde(default)]
    pub created_ns: u64,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User").field("tenant", &self.tenant).field("access_key", &self.access_key).field("admin", &self.admin).finish()
    }
}

/// What `list` shows of a user: never its secret or token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UserSummary {
    pub name: String,
    pub tenant: String,
    pub access_key: String,
    pub has_bearer_token: bool,
    pub admin: bool,
    pub created_ns: u64,
}

/// The document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserDb {
    pub format: u32,
    /// Bumped by every edit.
    pub version: u64,
    pub tenants: BTreeMap<String, Tenant>,
    pub users: BTreeMap<String, User>,
}

/// The key and secret of a new user, shown once.
#[derive(Clone, PartialEq, Eq)]
pub struct NewCredentials {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for NewCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NewCredentials({})", self.access_key)
    }
}

/// Checks a tenant or user name.
pub fn check_name(kind: &str, name: &str) -> Result<(), GatewayError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(GatewayError::Setup(format!(
            "{kind} name {name:?}: 1-64 of lowercase letters, digits, '.', '_', '-', starting with a letter or digit"
        )))
    }
}

fn random_string(alphabet: &[u8], len: usize) -> String {
    let mut rng = rand::thread_rng();
    (0..len).map(|_| alphabet[rng.gen_range(0..alphabet.len())] as char).collect()
}

/// A new access key id: `FSKV` + 16 uppercase letters and digits.
pub fn new_access_key() -> String {
    format!("FSKV{}", random_string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 16))
}

/// A new secret: 40 letters and digits (~238 bits).
pub fn new_secret() -> String {
    random_string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", 40)
}

impl UserDb {
    /// An empty document with tenant `default` (uid 0, gid 0).
    pub fn empty() -> Self {
        let mut tenants = BTreeMap::new();
        tenants.insert(DEFAULT_TENANT.to_string(), Tenant { uid: 0, gid: 0 });
        UserDb { format: USER_DB_FORMAT, version: 1, tenants, users: BTreeMap::new() }
    }

    /// The first document, from the keys of the credentials file: each key
    /// becomes an admin user (named by its `user`, or `admin` when the file
    /// names none) of its tenant; tenants other than `default` get the first
    /// free uids from [`FIRST_TENANT_UID`].
    pub fn bootstrap(keys: &[AccessKey], now_ns: u64) -> Result<Self, GatewayError> {
        let mut db = UserDb::empty();
        for k in keys {
            if !db.tenants.contains_key(&k.tenant) {
                db.create_tenant(&k.tenant, None)?;
            }
            let mut name = if k.user == k.access_key { "admin".to_string() } else { k.user.clone() };
            if db.users.contains_key(&name) {
                name = format!("{name}-{}", db.users.len());
            }
            check_name("user", &name)?;
            db.users.insert(
                name,
                User {
                    tenant: k.tenant.clone(),
                    access_key: k.access_key.clone(),
                    secret_key: k.secret_key.clone(),
                    bearer_token: k.bearer_token.clone(),
                    admin: true,
                    created_ns: now_ns,
                },
            );
        }
        db.validate()?;
        Ok(db)
    }

    /// Parses and checks a document.
    pub fn parse(json: &[u8]) -> Result<Self, GatewayError> {
        let db: UserDb = serde_json::from_slice(json).map_err(|e| GatewayError::Setup(format!("user store: {e}")))?;
        if db.format != USER_DB_FORMAT {
            return Err(GatewayError::Setup(format!("user store format {} is not supported (expected {USER_DB_FORMAT})", db.format)));
        }
        db.validate()?;
        Ok(db)
    }

    /// The document as stored.
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Checks every rule of the module table.
    pub fn validate(&self) -> Result<(), GatewayError> {
        let mut uids = BTreeMap::new();
        for (name, t) in &self.tenants {
            check_name("tenant", name)?;
            if let Some(other) = uids.insert(t.uid, name) {
                return Err(GatewayError::Setup(format!("tenants {other:?} and {name:?} have the same uid {}", t.uid)));
            }
        }
        if !self.tenants.contains_key(DEFAULT_TENANT) {
            return Err(GatewayError::Setup(format!("user store: tenant {DEFAULT_TENANT:?} is missing")));
        }
        for (name, u) in &self.users {
            check_name("user", name)?;
            if !self.tenants.contains_key(&u.tenant) {
                return Err(GatewayError::Setup(format!("user {name:?} is in tenant {:?}, which does not exist", u.tenant)));
            }
        }
        // Key syntax and uniqueness: the key store's own checks.
        KeyStore::new(self.keys()).map(drop)
    }

    /// The access keys of every user.
    pub fn keys(&self) -> Vec<AccessKey> {
        self.users
            .iter()
            .map(|(name, u)| AccessKey {
                access_key: u.access_key.clone(),
                secret_key: u.secret_key.clone(),
                user: name.clone(),
                tenant: u.tenant.clone(),
                bearer_token: u.bearer_token.clone(),
            })
            .collect()
    }

    /// Tenant name → uid/gid.
    pub fn tenant_ids(&self) -> Vec<(String, TenantIds)> {
        self.tenants.iter().map(|(n, t)| (n.clone(), TenantIds { uid: t.uid, gid: t.gid })).collect()
    }

    /// Adds tenant `name` with `uid` (gid = uid), or the first free uid from
    /// [`FIRST_TENANT_UID`].
    pub fn create_tenant(&mut self, name: &str, uid: Option<u32>) -> Result<Tenant, GatewayError> {
        check_name("tenant", name)?;
        if self.tenants.contains_key(name) {
            return Err(GatewayError::Setup(format!("tenant {name:?} exists")));
        }
        let uid = match uid {
            Some(uid) => {
                if let Some((other, _)) = self.tenants.iter().find(|(_, t)| t.uid == uid) {
                    return Err(GatewayError::Setup(format!("uid {uid} is tenant {other:?}'s")));
                }
                uid
            }
            None => (FIRST_TENANT_UID..u32::MAX)
                .find(|u| !self.tenants.values().any(|t| t.uid == *u))
                .ok_or_else(|| GatewayError::Setup("no free uid".into()))?,
        };
        let t = Tenant { uid, gid: uid };
        self.tenants.insert(name.to_string(), t.clone());
        self.version += 1;
        Ok(t)
    }

    /// Adds user `name` to `tenant` with a new key and secret (and a bearer
    /// token when `bearer_token`); returns them (shown once, never logged).
    pub fn create_user(
        &mut self,
        name: &str,
        tenant: &str,
        bearer_token: bool,
        now_ns: u64,
    ) -> Result<(NewCredentials, Option<String>), GatewayError> {
        check_name("user", name)?;
        if self.users.contains_key(name) {
            return Err(GatewayError::Setup(format!("user {name:?} exists")));
        }
        if !self.tenants.contains_key(tenant) {
            return Err(GatewayError::Setup(format!(
                "tenant {tenant:?} does not exist (create it with `fskv admin tenant create {tenant}`)"
            )));
        }
        let mut access_key = new_access_key();
        while self.users.values().any(|u| u.access_key == access_key) {
            access_key = new_access_key();
        }
        let secret_key = new_secret();
        let token = bearer_token.then(|| format!("fskv_{}", new_secret()));
        self.users.insert(
            name.to_string(),
            User {
                tenant: tenant.to_string(),
                access_key: access_key.clone(),
                secret_key: secret_key.clone(),
                bearer_token: token.clone(),
                admin: false,
                created_ns: now_ns,
            },
        );
        self.version += 1;
        Ok((NewCredentials { access_key, secret_key }, token))
    }

    /// Removes user `name`: its key and token stop working once gateways
    /// re-read the document.
    pub fn revoke_user(&mut self, name: &str) -> Result<User, GatewayError> {
        let u = self.users.remove(name).ok_or_else(|| GatewayError::Setup(format!("no user {name:?}")))?;
        self.version += 1;
        Ok(u)
    }

    /// Users without secrets, by name.
    pub fn list_users(&self) -> Vec<UserSummary> {
        self.users
            .iter()
            .map(|(name, u)| UserSummary {
                name: name.clone(),
                tenant: u.tenant.clone(),
                access_key: u.access_key.clone(),
                has_bearer_token: u.bearer_token.is_some(),
                admin: u.admin,
                created_ns: u.created_ns,
            })
            .collect()
    }

    /// Makes `store` serve this document's keys and tenants.
    pub fn install(&self, store: &KeyStore) -> Result<(), GatewayError> {
        store.replace_with_tenants(self.keys(), self.tenant_ids())
    }
}

/// Where a gateway reads the user store from (the cluster file, in `fskv`).
pub trait UserSource: Send + Sync + 'static {
    /// A stamp that changes whenever the document changes (e.g. the file's
    /// inode id and version); `None` when there is no document.
    fn stamp(&self) -> impl Future<Output = Result<Option<u64>, String>> + Send;
    /// The document's bytes and their stamp; `None` when there is none.
    fn read(&self) -> impl Future<Output = Result<Option<(u64, Vec<u8>)>, String>> + Send;
}

/// Polls `source` every `interval` and installs each new document into
/// `store` (keeps the old keys, logging once, when a document is bad or
/// cannot be read). Runs until `stop` turns true or is dropped.
pub async fn watch<S: UserSource>(
    source: Arc<S>,
    store: Arc<KeyStore>,
    mut known: Option<u64>,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            r = stop.changed() => if r.is_err() || *stop.borrow() { return },
        }
        let r = async {
            let stamp = source.stamp().await?;
            if stamp.is_none() || stamp == known {
                return Ok(false);
            }
            let Some((stamp, bytes)) = source.read().await? else { return Ok(false) };
            let db = UserDb::parse(&bytes).map_err(|e| e.to_string())?;
            db.install(&store).map_err(|e| e.to_string())?;
            known = Some(stamp);
            tracing::info!(version = db.version, users = db.users.len(), tenants = db.tenants.len(), "user store reloaded");
            Ok::<bool, String>(true)
        }
        .await;
        match r {
            Ok(_) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot reload the user store; keeping the keys in use");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_makes_the_credentials_key_the_admin_of_default() {
        let db = UserDb::bootstrap(&[AccessKey::new("FSKVAK", "s3cr3t")], 7).unwrap();
        assert_eq!(db.tenants[DEFAULT_TENANT], Tenant { uid: 0, gid: 0 });
        let admin = &db.users["admin"];
        assert!(admin.admin);
        assert_eq!((admin.tenant.as_str(), admin.access_key.as_str(), admin.secret_key.as_str()), ("default", "FSKVAK", "s3cr3t"));
        let again = UserDb::parse(&db.to_json()).unwrap();
        assert_eq!(again, db);
    }

    #[test]
    fn users_and_tenants_are_created_listed_and_revoked() {
        let mut db = UserDb::bootstrap(&[AccessKey::new("FSKVAK", "s")], 0).unwrap();
        let t = db.create_tenant("acme", None).unwrap();
        assert_eq!(t.uid, FIRST_TENANT_UID);
        assert_eq!(db.create_tenant("beta", None).unwrap().uid, FIRST_TENANT_UID + 1);
        let v = db.version;
        let (creds, token) = db.create_user("alice", "acme", true, 5).unwrap();
        assert!(db.version > v);
        assert!(creds.access_key.starts_with("FSKV") && creds.access_key.len() == 20);
        assert_eq!(creds.secret_key.len(), 40);
        let token = token.unwrap();
        let list = db.list_users();
        assert_eq!(list.len(), 2);
        let text = serde_json::to_string(&list).unwrap();
        assert!(!text.contains(&creds.secret_key) && !text.contains(&token), "{text}");
        assert!(!format!("{:?} {:?}", db.users["alice"], creds).contains(&creds.secret_key));

        let store = KeyStore::new(vec![]).unwrap();
        db.install(&store).unwrap();
        assert_eq!(store.get(&creds.access_key).unwrap().tenant, "acme");
        assert_eq!(store.tenant("acme"), Some(TenantIds { uid: FIRST_TENANT_UID, gid: FIRST_TENANT_UID }));
        assert_eq!(store.by_bearer_token(&token).unwrap().user, "alice");
        db.revoke_user("alice").unwrap();
        db.install(&store).unwrap();
        assert!(store.get(&creds.access_key).is_none());
        assert!(store.by_bearer_token(&token).is_none());
    }

    #[test]
    fn bad_edits_are_clear_errors() {
        let mut db = UserDb::bootstrap(&[AccessKey::new("FSKVAK", "s")], 0).unwrap();
        db.create_tenant("acme", Some(1234)).unwrap();
        db.create_user("alice", "acme", false, 0).unwrap();
        for (e, want) in [
            (db.clone().create_tenant("acme", None).unwrap_err(), "exists"),
            (db.clone().create_tenant("other", Some(1234)).unwrap_err(), "uid 1234"),
            (db.clone().create_tenant("Bad Name", None).unwrap_err(), "lowercase"),
            (db.clone().create_user("alice", "acme", false, 0).unwrap_err(), "exists"),
            (db.clone().create_user("bob", "nope", false, 0).unwrap_err(), "does not exist"),
            (db.clone().create_user("../x", "acme", false, 0).unwrap_err(), "lowercase"),
            (db.clone().revoke_user("nobody").unwrap_err(), "no user"),
        ] {
            assert!(e.to_string().contains(want), "{e} (want {want})");
        }
    }

    #[test]
    fn bad_documents_are_refused() {
        let db = UserDb::bootstrap(&[AccessKey::new("FSKVAK", "s")], 0).unwrap();
        let mut no_default = db.clone();
        no_default.tenants.clear();
        no_default.users.clear();
        let mut same_uid = db.clone();
        same_uid.tenants.insert("t2".into(), Tenant { uid: 0, gid: 0 });
        let mut dup_key = db.clone();
        let mut u = dup_key.users["admin"].clone();
        u.admin = false;
        dup_key.users.insert("copy".into(), u);
        for (d, want) in [(no_default, "missing"), (same_uid, "same uid"), (dup_key, "twice")] {
            let e = UserDb::parse(&d.to_json()).unwrap_err();
            assert!(e.to_string().contains(want), "{e} (want {want})");
        }
        assert!(UserDb::parse(b"{").is_err());
        assert!(UserDb::parse(br#"{"format": 9, "version": 1, "tenants": {}, "users": {}}"#).unwrap_err().to_string().contains("format 9"));
    }
}
