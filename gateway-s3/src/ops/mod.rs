//! The S3 operations, one file per group, on a [`Gateway`].

pub mod acl;
pub mod attributes;
pub mod bucket;
pub mod copy;
pub mod cors;
pub mod lifecycle;
pub mod list;
pub mod multipart;
pub mod object;
pub mod tagging;
pub mod versioning;
pub mod write;

use crate::config::GatewayConfig;
use crate::store::Store;
use std::sync::Arc;

/// The one owner of every bucket, object and upload: the gateway keeps no
/// ACLs; signed requests by any configured key have full control. Listings
/// (ListObjects v1, v2 with `fetch-owner=true`, ListObjectVersions,
/// ListBuckets, ListMultipartUploads, ListParts) and ACLs name it.
pub fn owner() -> s3s::dto::Owner {
    s3s::dto::Owner { display_name: Some(OWNER_ID.into()), id: Some(OWNER_ID.into()) }
}

/// The owner's canonical id and display name.
pub const OWNER_ID: &str = "fskv";

/// The initiator of every multipart upload (the owner).
pub fn initiator() -> s3s::dto::Initiator {
    s3s::dto::Initiator { display_name: Some(OWNER_ID.into()), id: Some(OWNER_ID.into()) }
}

/// Everything a request handler needs; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub store: Store,
    pub cfg: Arc<GatewayConfig>,
    /// Bucket access settings by bucket name (`ops/acl.rs`).
    pub access: Arc<acl::AccessCache>,
}

impl Gateway {
    /// The gateway acting for the tenant of the request's key: its store
    /// sees only that tenant's buckets (others: 403 AccessDenied). A key
    /// revoked since s3s checked the signature, or of a tenant the user
    /// store does not know, is refused.
    /// A request that `crate::auth::Access` allowed on a bucket of
    /// another tenant (an ACL or the bucket policy) acts as that bucket's
    /// owner (`crate::auth::Acting`).
    pub fn for_request<T>(&self, req: &s3s::S3Request<T>) -> Result<Gateway, s3s::S3Error> {
        let denied = |why: &str| s3s::S3Error::with_message(s3s::S3ErrorCode::AccessDenied, why.to_string());
        if let Some(a) = req.extensions.get::<crate::auth::Acting>() {
            let ids = fskv_gateway::TenantIds { uid: a.uid, gid: a.gid };
            let caller = crate::store::Caller { tenant: format!("uid:{}", a.uid), ids };
            return Ok(self.with_store(self.store.for_caller(caller)));
        }
        let access_key = match (&req.credentials, req.extensions.get::<crate::server::PreVerified>()) {
            (Some(c), _) => c.access_key.as_str(),
            (None, Some(p)) => p.access_key.as_str(),
            (None, None) => return Err(denied("the request is not signed")),
        };
        let key = self.cfg.keys.get(access_key).ok_or_else(|| denied("the access key is not known to this gateway"))?;
        let ids = self.cfg.keys.tenant(&key.tenant).ok_or_else(|| denied("the key's tenant is not known to this gateway"))?;
        let caller = crate::store::Caller { tenant: key.tenant.clone(), ids };
        Ok(self.with_store(self.store.for_caller(caller)))
    }

    fn with_store(&self, store: Store) -> Gateway {
        Gateway { store, cfg: Arc::clone(&self.cfg), access: Arc::clone(&self.access) }
    }
}
