//! Put/Get/DeleteBucketCors: the rules live in the bucket directory's
//! `user.s3.cors` xattr, replaced whole by one meta call (a reader sees the
//! old configuration or the new one). Validation and the preflight and
//! response headers are `crate::cors` (pure).

use super::Gateway;
use crate::cors::{self, Rule, XATTR_CORS};
use crate::error;
use fskv_proto::meta::XattrFlag;
use fskv_types::{ErrorCode, InodeId};
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode};

fn no_configuration(bucket: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NoSuchCORSConfiguration, format!("bucket {bucket:?} has no CORS configuration"))
}

impl Gateway {
    pub async fn put_cors(&self, input: &PutBucketCorsInput) -> Result<(), S3Error> {
        let rules = cors::rules_from_dto(&input.cors_configuration.cors_rules);
        let stored = cors::validate(&rules)?;
        let b = self.store.bucket(&input.bucket).await?.id;
        self.store.fs.meta().set_xattr(b, XATTR_CORS, &stored, XattrFlag::Any).await.map_err(|e| error::from_meta(e, &input.bucket))
    }

    pub async fn get_cors(&self, bucket: &str) -> Result<GetBucketCorsOutput, S3Error> {
        let b = self.store.bucket(bucket).await?.id;
        match self.cors_rules(b, bucket).await? {
            Some(rules) if !rules.is_empty() => Ok(GetBucketCorsOutput { cors_rules: Some(rules.iter().map(Rule::to_dto).collect()) }),
            _ => Err(no_configuration(bucket)),
        }
    }

    pub async fn delete_cors(&self, bucket: &str) -> Result<(), S3Error> {
        let b = self.store.bucket(bucket).await?.id;
        match self.store.fs.meta().remove_xattr(b, XATTR_CORS).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
            Err(e) => Err(error::from_meta(e, bucket)),
        }
    }

    /// The rules of the bucket directory `dir`; `None` when it has none.
    pub async fn cors_rules(&self, dir: InodeId, bucket: &str) -> Result<Option<Vec<Rule>>, S3Error> {
        match self.store.fs.meta().get_xattr(dir, XATTR_CORS).await {
            Ok(bytes) => Ok(Some(cors::decode(&bytes))),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(error::from_meta(e, bucket)),
        }
    }
}
