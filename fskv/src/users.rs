//! The gateways' user store in the cluster (`fskv_gateway::auth::users`):
//! one JSON document at `/.fskv-admin/users.json`, read by every gateway
//! process and edited by `fskv admin user|tenant …`.
//!
//! | what | rule |
//! |---|---|
//! | `/.fskv-admin` | root's, mode 0700 (made so, and put back to 0700 if found otherwise) |
//! | `users.json` | mode 0600; written to a temp inode and published over the old one in one meta transaction (`Expected` = the inode and version read), so readers see the old document or the new one and two concurrent edits cannot lose one another (the loser re-reads and retries) |
//! | first gateway start | no document: the credentials file's keys become admin users of tenant `default` (published with `Expected::Absent`; a gateway that loses the race reads the winner's) |
//! | gateways | poll the file's inode id and version every `DEFAULT_POLL_INTERVAL_MS` (1 s): a revoked key stops working within that plus one lookup |

use anyhow::Context;
use fskv_client::FsClient;
use fskv_gateway::auth::users::{UserDb, UserSource, MAX_USER_DB_BYTES};
use fskv_gateway::AccessKey;
use fskv_proto::meta::{Expected, Inode, PublishAttrs, SetAttr};
use fskv_types::{ErrorCode, InodeId};

/// The reserved root-only directory under the filesystem root.
pub const ADMIN_DIR: &str = ".fskv-admin";
/// The user store's file name in it.
pub const USERS_FILE: &str = "users.json";
const ADMIN_DIR_MODE: u32 = 0o700;
const USERS_FILE_MODE: u32 = 0o600;
/// Attempts of an edit that loses a race with another edit.
const MAX_EDIT_ATTEMPTS: usize = 8;

/// The user store of one cluster, through a client acting as root.
#[derive(Clone)]
pub struct ClusterUsers {
    fs: FsClient,
}

fn stamp_of(inode: &Inode) -> u64 {
    inode.id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ inode.version
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

impl ClusterUsers {
    pub fn new(fs: FsClient) -> Self {
        ClusterUsers { fs }
    }

    /// The admin directory (made 0700 when `create`).
    async fn dir(&self, create: bool) -> anyhow::Result<Option<InodeId>> {
        let meta = self.fs.meta();
        let dir = match meta.lookup(InodeId::ROOT, ADMIN_DIR).await {
            Ok(i) => i,
            Err(e) if e.code() == ErrorCode::NotFound && create => match meta.mkdir(InodeId::ROOT, ADMIN_DIR, ADMIN_DIR_MODE).await {
                Ok(i) => i,
                Err(e) if e.code() == ErrorCode::AlreadyExists => meta.lookup(InodeId::ROOT, ADMIN_DIR).await?,
                Err(e) => return Err(e).context(format!("cannot make /{ADMIN_DIR}")),
            },
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e).context(format!("/{ADMIN_DIR}")),
        };
        anyhow::ensure!(dir.dir().is_some(), "/{ADMIN_DIR} is not a directory");
        if create && (dir.acl.uid != 0 || dir.acl.mode != ADMIN_DIR_MODE) {
            let attr = SetAttr { mode: Some(ADMIN_DIR_MODE), uid: Some(0), gid: Some(0), ..SetAttr::default() };
            meta.setattr(dir.id, attr).await.context(format!("cannot make /{ADMIN_DIR} root's and 0700"))?;
        }
        Ok(Some(dir.id))
    }

    /// The document's inode, if there is one.
    async fn file(&self) -> anyhow::Result<Option<Inode>> {
        let Some(dir) = self.dir(false).await? else { return Ok(None) };
        match self.fs.meta().lookup(dir, USERS_FILE).await {
            Ok(i) => Ok(Some(i)),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e).context(format!("/{ADMIN_DIR}/{USERS_FILE}")),
        }
    }

    /// The document and the inode it was read from.
    pub async fn load(&self) -> anyhow::Result<Option<(Inode, UserDb)>> {
        let Some(inode) = self.file().await? else { return Ok(None) };
        let reader = self.fs.reader(inode.clone())?;
        let len = reader.len();
        anyhow::ensure!(len <= MAX_USER_DB_BYTES, "/{ADMIN_DIR}/{USERS_FILE} is {len} bytes; at most {MAX_USER_DB_BYTES} are read");
        let bytes = reader.read_at(0, len).await?;
        let db = UserDb::parse(&bytes)?;
        Ok(Some((inode, db)))
    }

    /// Publishes `db` if the file still is `expected`.
    async fn store(&self, db: &UserDb, expected: Expected) -> anyhow::Result<Result<Inode, ()>> {
        let dir = self.dir(true).await?.context("admin directory")?;
        let temp = self.fs.create_temp(dir, USERS_FILE_MODE).await?;
        temp.write_at(0, bytes::Bytes::from(db.to_json())).await?;
        match self.fs.publish(&temp, dir, USERS_FILE, Some(expected), PublishAttrs::default()).await {
            Ok(i) => Ok(Ok(i)),
            Err(e) if e.code() == ErrorCode::PreconditionFailed => Ok(Err(())),
            Err(e) => Err(e).context(format!("cannot publish /{ADMIN_DIR}/{USERS_FILE}")),
        }
    }

    /// The document, made from `keys` (the credentials file) when there is
    /// none yet.
    pub async fn bootstrap(&self, keys: &[AccessKey]) -> anyhow::Result<(u64, UserDb)> {
        for _ in 0..MAX_EDIT_ATTEMPTS {
            if let Some((inode, db)) = self.load().await? {
                return Ok((stamp_of(&inode), db));
            }
            let db = UserDb::bootstrap(keys, now_ns())?;
            if let Ok(inode) = self.store(&db, Expected::Absent).await? {
                tracing::info!(users = db.users.len(), "user store created from the credentials file");
                return Ok((stamp_of(&inode), db));
            }
        }
        anyhow::bail!("the user store keeps changing; try again")
    }

    /// Applies `edit` to the document and publishes it (re-read and retried
    /// when another edit won meanwhile). Fails when there is no document yet.
    pub async fn edit<T>(&self, mut edit: impl FnMut(&mut UserDb) -> anyhow::Result<T>) -> anyhow::Result<T> {
        for _ in 0..MAX_EDIT_ATTEMPTS {
            let Some((inode, mut db)) = self.load().await? else {
                anyhow::bail!("no user store yet (/{ADMIN_DIR}/{USERS_FILE}): start a gateway once (`fskv up`) so it is made from the credentials file")
            };
            let out = edit(&mut db)?;
            db.validate()?;
            if self.store(&db, Expected::Inode { id: inode.id, version: inode.version }).await?.is_ok() {
                return Ok(out);
            }
        }
        anyhow::bail!("the user store keeps changing; try again")
    }
}

impl UserSource for ClusterUsers {
    async fn stamp(&self) -> Result<Option<u64>, String> {
        self.file().await.map(|f| f.as_ref().map(stamp_of)).map_err(|e| format!("{e:#}"))
    }

    async fn read(&self) -> Result<Option<(u64, Vec<u8>)>, String> {
        let Some(inode) = self.file().await.map_err(|e| format!("{e:#}"))? else { return Ok(None) };
        let reader = self.fs.reader(inode.clone()).map_err(|e| e.to_string())?;
        let len = reader.len();
        if len > MAX_USER_DB_BYTES {
            return Err(format!("/{ADMIN_DIR}/{USERS_FILE} is {len} bytes; at most {MAX_USER_DB_BYTES} are read"));
        }
        let bytes = reader.read_at(0, len).await.map_err(|e| e.to_string())?;
        Ok(Some((stamp_of(&inode), bytes.to_vec())))
    }
}
