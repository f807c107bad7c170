//! SigV4 (header, presigned query, aws-chunked chunk signatures) is verified
//! by s3s with the secrets of the shared key store ([`fskv_gateway::KeyStore`])
//! — except large signed-payload PUTs, verified by the shared layer's
//! verifier before s3s runs (`server::PreVerified`). The reader role, SigV2
//! refusal, credential scope and presigned expiry are the shared layer's,
//! before s3s runs (see `route.rs` and docs/gateway.md). Here s3s learns
//! secrets, and [`Access`] decides every request with `crate::access::decide`.

use crate::access::{self, Action, CannedAcl, Decision, Facts, Ownership, Policy, Principal, Resource};
use crate::ops::Gateway;
use crate::server::PreVerified;
use fskv_gateway::KeyStore;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Result};
use std::sync::Arc;

/// The shared key store as s3s's source of secrets.
pub struct Keys(pub Arc<KeyStore>);

#[async_trait::async_trait]
impl S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.0.get(access_key) {
            Some(k) => Ok(SecretKey::from(k.secret_key.as_str())),
            None => Err(S3Error::with_message(S3ErrorCode::InvalidAccessKeyId, "the access key is not known to this gateway")),
        }
    }
}

/// A request allowed on a bucket its principal's tenant does not own (by
/// an ACL or the bucket policy), anonymous ones included: the handler acts
/// as the bucket's owner ([`Gateway::for_request`]). Set only by [`Access`].
#[derive(Clone, Copy, Debug)]
pub struct Acting {
    pub uid: u32,
    pub gid: u32,
}

/// What a DeleteObjects handler needs to decide each key on its own, set by
/// [`Access`] when the bucket has a policy: the up-front check sees no
/// keys (they are in the body) and decides `s3:DeleteObject` on any object
/// of the bucket; each key is then decided again as `s3:DeleteObject` or,
/// with a version id, `s3:DeleteObjectVersion` on that object, so a policy
/// that denies deleting versions holds for batch deletes too.
#[derive(Clone, Debug)]
pub struct PerKeyAccess {
    pub principal: Principal,
    pub owner: bool,
    pub bucket_acl: CannedAcl,
    pub ownership: Ownership,
    pub policy: Arc<Policy>,
}

impl PerKeyAccess {
    /// Whether deleting `key` (at `version_id`) of `bucket` is allowed.
    pub fn allows_delete(&self, bucket: &str, key: &str, version_id: Option<&str>) -> bool {
        let action = Action::of_request("DeleteObject", version_id.is_some());
        let facts = Facts {
            owner: self.owner,
            bucket_acl: self.bucket_acl,
            object_acl: None,
            ownership: self.ownership,
            policy: Some(&self.policy),
        };
        access::decide(&self.principal, &action, &Resource::Object(bucket.to_string(), key.to_string()), &facts) == Decision::Allow
    }
}

/// Every request is decided here, after s3s checked its signature (if any)
/// and before its handler runs:
///
/// | request | decision |
/// |---|---|
/// | unsigned, on no bucket (ListBuckets) or CreateBucket | 403 AccessDenied |
/// | signed, on no bucket or CreateBucket | allowed (the handler acts for the key's tenant) |
/// | on a bucket that does not exist | signed: the handler answers NoSuchBucket; unsigned: 404 NoSuchBucket |
/// | on a bucket | `access::decide` (owner, policy, ACLs); Deny → 403 AccessDenied |
pub struct Access(pub Gateway);

fn denied(why: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::AccessDenied, why.to_string())
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let keys = &self.0.cfg.keys;
        let access_key = match cx.credentials() {
            Some(c) => Some(c.access_key.clone()),
            None => cx.extensions_mut().get::<PreVerified>().map(|p| p.access_key.clone()),
        };
        let (principal, ids) = match access_key {
            Some(k) => {
                let key = keys.get(&k).ok_or_else(|| denied("the access key is not known to this gateway"))?;
                let ids = keys.tenant(&key.tenant).ok_or_else(|| denied("the key's tenant is not known to this gateway"))?;
                (Principal::User { tenant: key.tenant.clone(), user: key.user.clone() }, Some(ids))
            }
            None => (Principal::Anonymous, None),
        };
        let op = cx.s3_op().name();
        let (bucket, key) = match cx.s3_path() {
            S3Path::Root => (None, None),
            S3Path::Bucket { bucket } => (Some(bucket.to_string()), None),
            S3Path::Object { bucket, key } => (Some(bucket.to_string()), Some(key.to_string())),
        };
        let Some(bucket) = bucket.filter(|_| op != "CreateBucket") else {
            return match ids {
                Some(_) => Ok(()),
                None => Err(denied("the request is not signed")),
            };
        };
        let Some((dir, settings)) = self.0.bucket_for_access(&bucket).await? else {
            return match ids {
                Some(_) => Ok(()),
                None => Err(crate::error::no_such_bucket(&bucket)),
            };
        };
        let owner = ids.is_some_and(|i| i.uid == dir.acl.uid);
        let version = key.as_ref().and_then(|_| version_id_of(cx.uri()));
        let action = Action::of_request(op, version.is_some());
        let resource = match (op, key.clone()) {
            ("DeleteObjects", _) => Resource::AnyObject(bucket.clone()),
            (_, Some(k)) => Resource::Object(bucket.clone(), k),
            (_, None) => Resource::Bucket(bucket.clone()),
        };
        let mut facts =
            Facts { owner, bucket_acl: settings.acl, object_acl: None, ownership: settings.ownership(), policy: settings.policy.as_ref() };
        if access::needs_object_acl(&action, &facts) {
            if let Some(k) = &key {
                facts.object_acl = self.0.object_acl_for_access(&dir, &bucket, k, version.as_deref()).await?;
            }
        }
        match access::decide(&principal, &action, &resource, &facts) {
            Decision::Allow => {
                let per_key = (op == "DeleteObjects").then_some(()).and(settings.policy.as_ref()).map(|policy| PerKeyAccess {
                    principal: principal.clone(),
                    owner,
                    bucket_acl: facts.bucket_acl,
                    ownership: facts.ownership,
                    policy: Arc::new(policy.clone()),
                });
                if !owner {
                    cx.extensions_mut().insert(Acting { uid: dir.acl.uid, gid: dir.acl.gid });
                }
                if let Some(per_key) = per_key {
                    cx.extensions_mut().insert(per_key);
                }
                Ok(())
            }
            Decision::Deny { explicit } => {
                tracing::debug!(?principal, action = action.name, %bucket, explicit, "access denied");
                Err(denied("Access Denied"))
            }
        }
    }
}

/// The `versionId` query parameter of a request (its version's ACL is the
/// one an object access is checked against), percent-decoded.
fn version_id_of(uri: &http::Uri) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let v = kv.strip_prefix("versionId=")?;
        Some(percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::{version_id_of, PerKeyAccess};
    use crate::access::{CannedAcl, Ownership, Policy, Principal};
    use std::sync::Arc;

    #[test]
    fn a_batch_delete_is_decided_per_key_and_version() {
        let policy = Policy::parse(
            r#"{"Version":"2012-10-17","Statement":[
                {"Effect":"Deny","Principal":"*","Action":"s3:DeleteObjectVersion","Resource":"arn:aws:s3:::b/*"},
                {"Effect":"Deny","Principal":"*","Action":"s3:DeleteObject","Resource":"arn:aws:s3:::b/keep/*"}]}"#,
            Some("b"),
        )
        .expect("policy");
        let owner = PerKeyAccess {
            principal: Principal::User { tenant: "t".into(), user: "u".into() },
            owner: true,
            bucket_acl: CannedAcl::Private,
            ownership: Ownership::BucketOwnerEnforced,
            policy: Arc::new(policy),
        };
        assert!(owner.allows_delete("b", "x", None));
        assert!(!owner.allows_delete("b", "x", Some("v1")), "s3:DeleteObjectVersion is denied, even to the owner");
        assert!(!owner.allows_delete("b", "keep/x", None), "a Deny on a prefix holds per key");
        // A non-owner allowed on a prefix only: the batch passed the
        // up-front check; each key outside the prefix is refused here.
        let allow_tmp = Policy::parse(
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:DeleteObject","Resource":"arn:aws:s3:::b/tmp/*"}}"#,
            Some("b"),
        )
        .expect("policy");
        let other = PerKeyAccess { owner: false, ownership: Ownership::ObjectWriter, policy: Arc::new(allow_tmp), ..owner };
        assert!(other.allows_delete("b", "tmp/x", None));
        assert!(!other.allows_delete("b", "x", None));
    }

    #[test]
    fn the_version_id_is_read_from_the_query() {
        let v = |u: &str| version_id_of(&u.parse::<http::Uri>().unwrap());
        assert_eq!(v("/b/k?versionId=abc&x=1").as_deref(), Some("abc"));
        assert_eq!(v("/b/k?acl&versionId=a%2Bb").as_deref(), Some("a+b"));
        assert_eq!(v("/b/k?xversionId=abc"), None);
        assert_eq!(v("/b/k?versionId").as_deref(), None);
        assert_eq!(v("/b/k"), None);
    }
}
