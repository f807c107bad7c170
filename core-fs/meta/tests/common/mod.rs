#![allow(dead_code)]
//! Helpers shared by the integration tests.

use fskv_kv::{KvEngine, MemoryEngine};
use fskv_meta::{fsck, FakeStorage, MetaConfig, MetaResult, MetaService, StorageBackend};
use fskv_proto::meta::*;
use fskv_types::InodeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub fn test_config() -> MetaConfig {
    MetaConfig { gc_interval_ms: 0, ..MetaConfig::default() }
}

/// A service on an in-memory engine with fake storage, acting as `user`.
pub struct Fs {
    pub svc: MetaService,
    pub storage: Arc<FakeStorage>,
    pub user: UserInfo,
    pub client_id: u64,
    /// `MetaRequest::owner` of every request.
    pub owner: Option<NewOwner>,
    next: Arc<AtomicU64>,
}

impl Fs {
    pub async fn new() -> Fs {
        Fs::with(Arc::new(MemoryEngine::new()), test_config()).await
    }

    pub async fn with(engine: Arc<dyn KvEngine>, cfg: MetaConfig) -> Fs {
        let storage = Arc::new(FakeStorage::new());
        let svc = MetaService::open(engine, storage.clone() as Arc<dyn StorageBackend>, cfg).await.unwrap();
        // Random like a real client: two Fs on one engine must not share request ids.
        Fs { svc, storage, user: UserInfo::root(), client_id: rand::random::<u64>() | 1, owner: None, next: Arc::new(AtomicU64::new(1)) }
    }

    /// Acting as root on an existing service (whose storage is not the fake).
    pub fn over(svc: MetaService) -> Fs {
        Fs {
            svc,
            storage: Arc::new(FakeStorage::new()),
            user: UserInfo::root(),
            client_id: rand::random::<u64>() | 1,
            owner: None,
            next: Arc::new(AtomicU64::new(1)),
        }
    }

    pub fn as_user(&self, uid: u32, gid: u32) -> Fs {
        Fs {
            svc: self.svc.clone(),
            storage: self.storage.clone(),
            user: UserInfo::new(uid, gid),
            client_id: self.client_id + u64::from(uid) * 1000,
            owner: None,
            next: self.next.clone(),
        }
    }

    /// The same user, every inode it creates owned by `uid`/`gid`.
    pub fn owning_as(&self, uid: u32, gid: u32) -> Fs {
        Fs {
            svc: self.svc.clone(),
            storage: self.storage.clone(),
            user: self.user.clone(),
            client_id: self.client_id + 7,
            owner: Some(NewOwner { uid, gid }),
            next: self.next.clone(),
        }
    }

    pub fn req(&self, op: MetaOp) -> MetaRequest {
        MetaRequest {
            client_id: self.client_id,
            request_id: self.next.fetch_add(1, Ordering::Relaxed),
            user: self.user.clone(),
            op,
            relaxed: false,
            owner: self.owner,
        }
    }

    pub async fn op(&self, op: MetaOp) -> MetaResult<MetaReply> {
        self.svc.execute(self.req(op)).await
    }

    pub async fn inode(&self, op: MetaOp) -> MetaResult<Inode> {
        match self.op(op).await? {
            MetaReply::Inode(i) | MetaReply::Opened { inode: i, .. } => Ok(i),
            other => panic!("expected an inode, got {other:?}"),
        }
    }

    pub async fn create(&self, parent: InodeId, name: &str) -> MetaResult<Inode> {
        self.inode(MetaOp::Create { parent, name: name.into(), mode: 0o644, exclusive: true, write: false }).await
    }

    pub async fn mkdir(&self, parent: InodeId, name: &str) -> MetaResult<Inode> {
        self.inode(MetaOp::Mkdir { parent, name: name.into(), mode: 0o755, xattrs: vec![] }).await
    }

    pub async fn lookup(&self, parent: InodeId, name: &str) -> MetaResult<Inode> {
        self.inode(MetaOp::Lookup { parent, name: name.into() }).await
    }

    pub async fn stat(&self, inode: InodeId) -> MetaResult<Inode> {
        self.inode(MetaOp::Stat { inode }).await
    }

    pub async fn readdir_all(&self, dir: InodeId) -> MetaResult<Vec<DirEntry>> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            match self.op(MetaOp::Readdir { dir, start_after: after.clone(), limit: 3, with_attrs: false }).await? {
                MetaReply::Entries { entries, more } => {
                    if let Some(last) = entries.last() {
                        after = last.name.clone();
                    }
                    out.extend(entries);
                    if !more {
                        return Ok(out);
                    }
                }
                other => panic!("expected entries, got {other:?}"),
            }
        }
    }

    pub async fn fsck_clean(&self) {
        let report = fsck::check(&**self.svc.engine()).await.unwrap();
        assert!(report.problems.is_empty(), "fsck: {:#?}", report.problems);
    }
}
