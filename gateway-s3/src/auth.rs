//! SigV4 (header, presigned query, aws-chunked chunk signatures) is verified
//! by s3s with the secrets of the shared key store ([`fskv_gateway::KeyStore`]).
//! The reader role, SigV2 refusal, credential scope and presigned expiry are
//! the shared layer's, before s3s runs (see `route.rs` and docs/gateway.md);
//! here s3s learns secrets and refuses anonymous requests.

use fskv_gateway::KeyStore;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
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

/// Every request must be signed by a known key.
pub struct Access;

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_none() {
            return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "the request is not signed"));
        }
        Ok(())
    }
}
