//! SigV4 (header and presigned query) is verified by s3s; this supplies the
//! secret of each access key and, for a reader gateway, refuses mutations.

use crate::config::{AccessKey, Role};
use crate::error;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::{S3Error, S3ErrorCode, S3Result};
use std::collections::HashMap;

pub struct Keys(HashMap<String, String>);

impl Keys {
    pub fn new(keys: &[AccessKey]) -> Keys {
        Keys(keys.iter().map(|k| (k.access_key.clone(), k.secret_key.clone())).collect())
    }
}

#[async_trait::async_trait]
impl S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.0.get(access_key) {
            Some(s) => Ok(SecretKey::from(s.as_str())),
            None => Err(S3Error::with_message(S3ErrorCode::InvalidAccessKeyId, "the access key is not known to this gateway")),
        }
    }
}

/// Operations a reader serves.
const READ_OPS: &[&str] = &[
    "ListBuckets",
    "HeadBucket",
    "GetBucketLocation",
    "GetObject",
    "HeadObject",
    "ListObjects",
    "ListObjectsV2",
    "ListObjectVersions",
    "ListParts",
    "ListMultipartUploads",
    "GetObjectTagging",
    "GetObjectAcl",
    "GetBucketAcl",
    "GetBucketPolicy",
    "GetBucketCors",
];

pub struct Access {
    pub role: Role,
    pub writer_endpoint: Option<String>,
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_none() {
            return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "the request is not signed"));
        }
        if self.role == Role::Reader && !READ_OPS.contains(&cx.s3_op().name()) {
            return Err(error::read_only(self.writer_endpoint.as_deref()));
        }
        Ok(())
    }
}
