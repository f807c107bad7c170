//! Access policies as stored and served: Get/PutBucketAcl, Get/PutObjectAcl,
//! Get/Put/DeleteBucketOwnershipControls, Get/Put/DeleteBucketPolicy, and
//! the reads `crate::auth::Access` needs to decide a request. The decision
//! itself is `crate::access::decide` (pure).
//!
//! | what | where | written by |
//! |---|---|---|
//! | bucket canned ACL | bucket directory xattr `user.s3.acl` (the canned name) | CreateBucket `x-amz-acl`, PutBucketAcl |
//! | ownership controls | bucket directory xattr `user.s3.ownership` | CreateBucket `x-amz-object-ownership`, Put/DeleteBucketOwnershipControls |
//! | bucket policy | bucket directory xattr `user.s3.policy` (the JSON as sent, validated) | Put/DeleteBucketPolicy |
//! | object canned ACL | the `acl` field of the object's `user.s3.meta` record | PutObject, CopyObject, CreateMultipartUpload (`x-amz-acl`), PutObjectAcl |
//!
//! Three xattrs, not one record: concurrent puts of different settings
//! never lose one another (each is one meta call). What a request is
//! decided on is cached per bucket name for [`ACCESS_CACHE_TTL_MS`] (the
//! hot path of the owner's requests reads nothing); a put through this
//! gateway process drops the entry at once, other processes see it within
//! the TTL.

use super::Gateway;
use crate::access::{BucketAccess, CannedAcl, Group, Ownership, Permission, Policy, ALL_USERS_URI, AUTHENTICATED_USERS_URI};
use crate::error;
use crate::objmeta::XATTR_META;
use fskv_proto::meta::{Inode, XattrFlag};
use fskv_types::{ErrorCode, InodeId};
use s3s::dto::{self, *};
use s3s::{S3Error, S3ErrorCode};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const XATTR_ACL: &str = "user.s3.acl";
pub const XATTR_OWNERSHIP: &str = "user.s3.ownership";
pub const XATTR_POLICY: &str = "user.s3.policy";

pub const ACCESS_CACHE_TTL_MS: u64 = 2_000;
pub const ACCESS_CACHE_MAX_ENTRIES: usize = 16_384;

/// A cached bucket: its directory, its settings, when they were read.
type CachedBucket = (Inode, Arc<BucketAccess>, Instant);

/// The bucket directory and its access settings, by bucket name.
#[derive(Default)]
pub struct AccessCache {
    map: parking_lot::Mutex<HashMap<String, CachedBucket>>,
}

impl AccessCache {
    fn get(&self, name: &str) -> Option<(Inode, Arc<BucketAccess>)> {
        let map = self.map.lock();
        let (dir, access, at) = map.get(name)?;
        (at.elapsed() < Duration::from_millis(ACCESS_CACHE_TTL_MS)).then(|| (dir.clone(), Arc::clone(access)))
    }

    fn put(&self, name: &str, dir: Inode, access: Arc<BucketAccess>) {
        let mut map = self.map.lock();
        if map.len() >= ACCESS_CACHE_MAX_ENTRIES {
            map.clear();
        }
        map.insert(name.to_string(), (dir, access, Instant::now()));
    }

    pub fn forget(&self, name: &str) {
        self.map.lock().remove(name);
    }
}

/// `x-amz-acl` of an object write as a canned ACL.
pub fn object_acl_input(acl: Option<&ObjectCannedACL>) -> Result<Option<CannedAcl>, S3Error> {
    acl.map(|a| canned(a.as_str())).transpose()
}

fn canned(s: &str) -> Result<CannedAcl, S3Error> {
    CannedAcl::parse(s).ok_or_else(|| {
        S3Error::with_message(S3ErrorCode::InvalidArgument, format!("x-amz-acl {s:?} is not a canned ACL this gateway keeps"))
    })
}

fn acl_not_supported() -> S3Error {
    S3Error::with_message(S3ErrorCode::AccessControlListNotSupported, "The bucket does not allow ACLs")
}

fn not_implemented_grants() -> S3Error {
    S3Error::with_message(
        S3ErrorCode::NotImplemented,
        "only grants that a canned ACL expresses (private, public-read, public-read-write, authenticated-read) are kept",
    )
}

/// The ACL as S3 shows it: the owner's FULL_CONTROL and the canned ACL's group grants.
fn grants_of(acl: CannedAcl) -> (Option<Owner>, Option<Grants>) {
    let owner = super::owner();
    let mut grants = vec![Grant {
        grantee: Some(Grantee {
            display_name: owner.display_name.clone(),
            email_address: None,
            id: owner.id.clone(),
            type_: dto::Type::from_static(dto::Type::CANONICAL_USER),
            uri: None,
        }),
        permission: Some(dto::Permission::from_static(dto::Permission::FULL_CONTROL)),
    }];
    for (group, perm) in acl.grants() {
        let uri = match group {
            Group::AllUsers => ALL_USERS_URI,
            Group::AuthenticatedUsers => AUTHENTICATED_USERS_URI,
        };
        let p = match perm {
            Permission::Read => dto::Permission::READ,
            Permission::Write => dto::Permission::WRITE,
            Permission::ReadAcp => dto::Permission::READ_ACP,
            Permission::WriteAcp => dto::Permission::WRITE_ACP,
        };
        grants.push(group_grant(uri, p));
    }
    (Some(owner), Some(grants))
}

/// A grant of `perm` to the group named by `uri`.
fn group_grant(uri: &str, perm: &'static str) -> Grant {
    Grant {
        grantee: Some(Grantee {
            display_name: None,
            email_address: None,
            id: None,
            type_: dto::Type::from_static(dto::Type::GROUP),
            uri: Some(uri.into()),
        }),
        permission: Some(dto::Permission::from_static(perm)),
    }
}

/// The canned ACL an `AccessControlPolicy` body expresses: owner grants
/// (FULL_CONTROL to the owner's canonical id) are implied and skipped;
/// group grants must form a canned ACL.
fn canned_from_policy(p: &AccessControlPolicy) -> Result<CannedAcl, S3Error> {
    let mut groups = Vec::new();
    for g in p.grants.iter().flatten() {
        let (Some(grantee), Some(perm)) = (&g.grantee, &g.permission) else {
            return Err(S3Error::with_message(S3ErrorCode::MalformedACLError, "a Grant needs a Grantee and a Permission"));
        };
        let perm = match perm.as_str() {
            "READ" => Permission::Read,
            "WRITE" => Permission::Write,
            "READ_ACP" => Permission::ReadAcp,
            "WRITE_ACP" => Permission::WriteAcp,
            "FULL_CONTROL" => {
                if grantee.id.as_deref() == Some(super::OWNER_ID) {
                    continue;
                }
                return Err(not_implemented_grants());
            }
            other => return Err(S3Error::with_message(S3ErrorCode::MalformedACLError, format!("unknown permission {other:?}"))),
        };
        match grantee.uri.as_deref() {
            Some(ALL_USERS_URI) => groups.push((Group::AllUsers, perm)),
            Some(AUTHENTICATED_USERS_URI) => groups.push((Group::AuthenticatedUsers, perm)),
            _ => return Err(not_implemented_grants()),
        }
    }
    CannedAcl::from_grants(&groups).ok_or_else(not_implemented_grants)
}

/// The canned ACL `x-amz-grant-*` headers express (`uri="…"` groups and
/// `id="<owner>"` for FULL_CONTROL); `None` when none is sent.
fn canned_from_grant_headers(
    full_control: Option<&str>,
    read: Option<&str>,
    write: Option<&str>,
    read_acp: Option<&str>,
    write_acp: Option<&str>,
) -> Result<Option<CannedAcl>, S3Error> {
    if [full_control, read, write, read_acp, write_acp].iter().all(Option::is_none) {
        return Ok(None);
    }
    let mut groups = Vec::new();
    let entries = |v: &str| -> Vec<(String, String)> {
        v.split(',')
            .filter_map(|e| e.split_once('='))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"').to_string()))
            .collect()
    };
    if let Some(v) = full_control {
        if entries(v).iter().any(|(k, id)| !(k == "id" && id == super::OWNER_ID)) {
            return Err(not_implemented_grants());
        }
    }
    for (v, perm) in
        [(read, Permission::Read), (write, Permission::Write), (read_acp, Permission::ReadAcp), (write_acp, Permission::WriteAcp)]
    {
        let Some(v) = v else { continue };
        for (k, val) in entries(v) {
            match (k.as_str(), val.as_str()) {
                ("uri", ALL_USERS_URI) => groups.push((Group::AllUsers, perm)),
                ("uri", AUTHENTICATED_USERS_URI) => groups.push((Group::AuthenticatedUsers, perm)),
                _ => return Err(not_implemented_grants()),
            }
        }
    }
    CannedAcl::from_grants(&groups).map(Some).ok_or_else(not_implemented_grants)
}

/// The ACL a Put*Acl request sets: exactly one of `x-amz-acl`, the grant
/// headers or an `AccessControlPolicy` body.
fn requested_acl(
    canned_header: Option<&str>,
    headers: Result<Option<CannedAcl>, S3Error>,
    body: Option<&AccessControlPolicy>,
) -> Result<CannedAcl, S3Error> {
    let headers = headers?;
    let given = usize::from(canned_header.is_some()) + usize::from(headers.is_some()) + usize::from(body.is_some());
    if given != 1 {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "send exactly one of x-amz-acl, x-amz-grant-* headers or an AccessControlPolicy body",
        ));
    }
    match (canned_header, headers, body) {
        (Some(c), _, _) => canned(c),
        (_, Some(c), _) => Ok(c),
        (_, _, Some(p)) => canned_from_policy(p),
        _ => Err(error::internal("no ACL in the request")),
    }
}

fn not_found_ok(r: Result<(), fskv_client::meta::MetaClientError>, what: &str) -> Result<(), S3Error> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(error::from_meta(e, what)),
    }
}

impl Gateway {
    /// The bucket directory named `name` (whoever owns it) and its access
    /// settings, cached; `None`: no such bucket.
    pub async fn bucket_for_access(&self, name: &str) -> Result<Option<(Inode, Arc<BucketAccess>)>, S3Error> {
        if let Some(hit) = self.access.get(name) {
            return Ok(Some(hit));
        }
        if !crate::paths::is_bucket_name(name) {
            return Ok(None);
        }
        let dir = match self.store.fs.meta().lookup(self.store.root, name).await {
            Ok(i) if i.dir().is_some() => i,
            Ok(_) => return Ok(None),
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(error::from_meta(e, name)),
        };
        let access = Arc::new(self.read_access(dir.id, name).await?);
        self.access.put(name, dir.clone(), Arc::clone(&access));
        Ok(Some((dir, access)))
    }

    async fn read_access(&self, dir: InodeId, name: &str) -> Result<BucketAccess, S3Error> {
        let meta = self.store.fs.meta();
        let get = |attr: &'static str| async move {
            match meta.get_xattr(dir, attr).await {
                Ok(v) => Ok(Some(v)),
                Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
                Err(e) => Err(error::from_meta(e, name)),
            }
        };
        let (acl, ownership, policy) = futures::join!(get(XATTR_ACL), get(XATTR_OWNERSHIP), get(XATTR_POLICY));
        let text = |v: Option<Vec<u8>>| v.and_then(|b| String::from_utf8(b).ok());
        let policy_json = text(policy?);
        Ok(BucketAccess {
            acl: text(acl?).and_then(|s| CannedAcl::parse(&s)).unwrap_or_default(),
            ownership: text(ownership?).and_then(|s| Ownership::parse(&s)),
            policy: policy_json.as_deref().and_then(|j| Policy::parse(j, None).ok()),
            policy_json,
        })
    }

    /// The canned ACL of the version `version` (`None`: the current one) of
    /// object `key` of bucket `bucket`, directory `dir` (`None`: no such
    /// version, which grants nothing).
    pub async fn object_acl_for_access(
        &self,
        dir: &Inode,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> Result<Option<CannedAcl>, S3Error> {
        let layout = self.store.layout(dir.id).await?;
        let Ok(path) = crate::paths::parse_key_in(layout, key) else { return Ok(None) };
        let Some(version) = version else {
            return Ok(super::object::find_object(&self.store, dir.id, &path).await?.map(|o| o.meta.acl.unwrap_or_default()));
        };
        match self.find_for_read(bucket, dir.id, &path, key, Some(version)).await {
            Ok(o) => Ok(Some(o.meta.acl.unwrap_or_default())),
            // No such version (or a marker, or a malformed id): grants
            // nothing; the operation itself gives the error to the caller
            // it lets through.
            Err(e) if e.status_code().is_some_and(|s| s.is_client_error()) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Refuses an ACL other than private/bucket-owner-full-control on a
    /// bucket whose ownership is `BucketOwnerEnforced`.
    pub async fn check_acl_allowed(&self, dir: &Inode, bucket: &str, acl: Option<CannedAcl>) -> Result<(), S3Error> {
        let Some(acl) = acl else { return Ok(()) };
        if acl.allowed_when_enforced() {
            return Ok(());
        }
        let access = self.read_access(dir.id, bucket).await?;
        if access.ownership() == Ownership::BucketOwnerEnforced {
            return Err(acl_not_supported());
        }
        Ok(())
    }

    async fn set_bucket_xattr(&self, bucket: &str, name: &str, value: Option<&[u8]>) -> Result<(), S3Error> {
        let dir = self.store.bucket(bucket).await?.id;
        let meta = self.store.fs.meta();
        let r = match value {
            Some(v) => meta.set_xattr(dir, name, v, XattrFlag::Any).await.map_err(|e| error::from_meta(e, bucket)),
            None => not_found_ok(meta.remove_xattr(dir, name).await, bucket),
        };
        self.access.forget(bucket);
        r
    }

    /// CreateBucket's `x-amz-acl` and `x-amz-object-ownership`, checked
    /// before the bucket is made.
    pub fn bucket_access_input(
        acl: Option<&BucketCannedACL>,
        ownership: Option<&ObjectOwnership>,
    ) -> Result<(Option<CannedAcl>, Option<Ownership>), S3Error> {
        let acl = acl.map(|a| canned(a.as_str())).transpose()?;
        let ownership = match ownership {
            Some(o) => Some(
                Ownership::parse(o.as_str())
                    .ok_or_else(|| error::invalid_argument(format!("unknown object ownership {:?}", o.as_str())))?,
            ),
            None => None,
        };
        if ownership == Some(Ownership::BucketOwnerEnforced) && acl.is_some_and(|a| !a.allowed_when_enforced()) {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidBucketAclWithObjectOwnership,
                "Bucket cannot have ACLs set with ObjectOwnership's BucketOwnerEnforced setting",
            ));
        }
        Ok((acl, ownership))
    }

    /// Sets what [`Gateway::bucket_access_input`] accepted on the new bucket.
    pub async fn init_bucket_access(&self, bucket: &str, (acl, ownership): (Option<CannedAcl>, Option<Ownership>)) -> Result<(), S3Error> {
        if let Some(o) = ownership {
            self.set_bucket_xattr(bucket, XATTR_OWNERSHIP, Some(o.as_str().as_bytes())).await?;
        }
        if let Some(a) = acl.filter(|a| *a != CannedAcl::Private) {
            self.set_bucket_xattr(bucket, XATTR_ACL, Some(a.as_str().as_bytes())).await?;
        }
        Ok(())
    }

    pub async fn get_bucket_acl(&self, bucket: &str) -> Result<GetBucketAclOutput, S3Error> {
        let dir = self.store.bucket(bucket).await?;
        let access = self.read_access(dir.id, bucket).await?;
        let (owner, grants) = grants_of(access.acl);
        Ok(GetBucketAclOutput { owner, grants })
    }

    pub async fn put_bucket_acl(&self, input: &PutBucketAclInput) -> Result<(), S3Error> {
        let headers = canned_from_grant_headers(
            input.grant_full_control.as_deref(),
            input.grant_read.as_deref(),
            input.grant_write.as_deref(),
            input.grant_read_acp.as_deref(),
            input.grant_write_acp.as_deref(),
        );
        let acl = requested_acl(input.acl.as_ref().map(|a| a.as_str()), headers, input.access_control_policy.as_ref())?;
        let dir = self.store.bucket(&input.bucket).await?;
        self.check_acl_allowed(&dir, &input.bucket, Some(acl)).await?;
        let value = (acl != CannedAcl::Private).then(|| acl.as_str().as_bytes());
        self.set_bucket_xattr(&input.bucket, XATTR_ACL, value).await
    }

    /// The ACL of the version named by `versionId` (the current one
    /// without it; the errors of `find_for_read`).
    pub async fn get_object_acl(&self, input: &GetObjectAclInput) -> Result<GetObjectAclOutput, S3Error> {
        let (_, _, obj) = self.locate_for_read(&input.bucket, &input.key, input.version_id.as_deref()).await?;
        let (owner, grants) = grants_of(obj.meta.acl.unwrap_or_default());
        Ok(GetObjectAclOutput { owner, grants, ..GetObjectAclOutput::default() })
    }

    /// Rewrites the `user.s3.meta` record of the inode of the version
    /// named by `versionId` (the current one without it) with the new ACL
    /// (a version replaced meanwhile keeps its own).
    pub async fn put_object_acl(&self, input: &PutObjectAclInput) -> Result<(), S3Error> {
        let headers = canned_from_grant_headers(
            input.grant_full_control.as_deref(),
            input.grant_read.as_deref(),
            None,
            input.grant_read_acp.as_deref(),
            input.grant_write_acp.as_deref(),
        );
        let acl = requested_acl(input.acl.as_ref().map(|a| a.as_str()), headers, input.access_control_policy.as_ref())?;
        let dir = self.store.bucket(&input.bucket).await?;
        self.check_acl_allowed(&dir, &input.bucket, Some(acl)).await?;
        let path = self.store.path_in(&dir, &input.key).await?;
        let obj = self.find_for_read(&input.bucket, dir.id, &path, &input.key, input.version_id.as_deref()).await?;
        let mut meta = obj.meta;
        meta.acl = (acl != CannedAcl::Private).then_some(acl);
        self.store
            .fs
            .meta()
            .set_xattr(obj.inode.id, XATTR_META, &meta.encode(), XattrFlag::Any)
            .await
            .map_err(|e| error::from_meta(e, &input.key))
    }

    pub async fn get_ownership(&self, bucket: &str) -> Result<GetBucketOwnershipControlsOutput, S3Error> {
        let dir = self.store.bucket(bucket).await?;
        let access = self.read_access(dir.id, bucket).await?;
        let Some(o) = access.ownership else {
            return Err(S3Error::with_message(S3ErrorCode::OwnershipControlsNotFoundError, "The bucket ownership controls were not found"));
        };
        Ok(GetBucketOwnershipControlsOutput {
            ownership_controls: Some(OwnershipControls {
                rules: vec![OwnershipControlsRule { object_ownership: ObjectOwnership::from(o.as_str().to_string()) }],
            }),
        })
    }

    pub async fn put_ownership(&self, input: &PutBucketOwnershipControlsInput) -> Result<(), S3Error> {
        let rules = &input.ownership_controls.rules;
        let [rule] = rules.as_slice() else {
            return Err(S3Error::with_message(S3ErrorCode::MalformedXML, "OwnershipControls takes exactly one Rule"));
        };
        let o = Ownership::parse(rule.object_ownership.as_str())
            .ok_or_else(|| S3Error::with_message(S3ErrorCode::MalformedXML, "unknown ObjectOwnership"))?;
        self.set_bucket_xattr(&input.bucket, XATTR_OWNERSHIP, Some(o.as_str().as_bytes())).await
    }

    pub async fn delete_ownership(&self, bucket: &str) -> Result<(), S3Error> {
        self.set_bucket_xattr(bucket, XATTR_OWNERSHIP, None).await
    }

    pub async fn get_policy(&self, bucket: &str) -> Result<GetBucketPolicyOutput, S3Error> {
        let dir = self.store.bucket(bucket).await?;
        let access = self.read_access(dir.id, bucket).await?;
        match access.policy_json {
            Some(p) => Ok(GetBucketPolicyOutput { policy: Some(p) }),
            None => Err(S3Error::with_message(S3ErrorCode::NoSuchBucketPolicy, "The bucket policy does not exist")),
        }
    }

    pub async fn put_policy(&self, input: &PutBucketPolicyInput) -> Result<(), S3Error> {
        Policy::parse(&input.policy, Some(&input.bucket)).map_err(|why| S3Error::with_message(S3ErrorCode::MalformedPolicy, why))?;
        self.set_bucket_xattr(&input.bucket, XATTR_POLICY, Some(input.policy.as_bytes())).await
    }

    pub async fn delete_policy(&self, bucket: &str) -> Result<(), S3Error> {
        self.set_bucket_xattr(bucket, XATTR_POLICY, None).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_forms_map_to_canned_acls() {
        for acl in [CannedAcl::Private, CannedAcl::PublicRead, CannedAcl::PublicReadWrite, CannedAcl::AuthenticatedRead] {
            let (owner, grants) = grants_of(acl);
            let policy = AccessControlPolicy { grants, owner };
            assert_eq!(canned_from_policy(&policy).unwrap(), acl);
        }
        let odd = AccessControlPolicy { grants: Some(vec![group_grant(ALL_USERS_URI, dto::Permission::WRITE)]), owner: None };
        assert_eq!(canned_from_policy(&odd).unwrap_err().code(), &S3ErrorCode::NotImplemented);
        let h = canned_from_grant_headers(Some("id=\"fskv\""), Some(&format!("uri=\"{ALL_USERS_URI}\"")), None, None, None).unwrap();
        assert_eq!(h, Some(CannedAcl::PublicRead));
        assert_eq!(canned_from_grant_headers(None, None, None, None, None).unwrap(), None);
        assert!(canned_from_grant_headers(None, Some("id=\"someone\""), None, None, None).is_err());
        assert_eq!(requested_acl(Some("public-read"), Ok(None), None).unwrap(), CannedAcl::PublicRead);
        assert!(requested_acl(Some("public-read"), Ok(Some(CannedAcl::Private)), None).is_err());
        assert!(requested_acl(None, Ok(None), None).is_err());
        assert!(requested_acl(Some("log-delivery-write"), Ok(None), None).is_err());
    }
}
