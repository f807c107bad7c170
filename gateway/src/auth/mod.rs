//! Authentication: the key store, the SigV4 verifier and bearer tokens.
//!
//! | credentials | accepted when | result |
//! |---|---|---|
//! | `Authorization: AWS4-HMAC-SHA256 …` | the signature verifies ([`sigv4`]) | the key's [`Principal`] |
//! | `X-Amz-Algorithm=AWS4-HMAC-SHA256&…` (presigned) | as above, not expired, valid ≤ 7 days | the key's [`Principal`] |
//! | `Authorization: Bearer <token>` | bearer tokens are allowed and the token is in the store | the token's key's [`Principal`] |
//! | SigV2 (`Authorization: AWS …`, `?Signature=&AWSAccessKeyId=`) | never | `SigV2Refused` |
//! | none | never | `Missing` |

pub mod keys;
pub mod sigv4;
pub mod users;

pub use keys::{AccessKey, AuthMethod, KeyStore, Principal, TenantIds, DEFAULT_TENANT};
pub use sigv4::{SigV4Request, SigV4Verifier, Verified};

use crate::error::AuthError;
use http::request::Parts;
use std::sync::Arc;
use std::time::SystemTime;

/// Checks the credentials of requests for a protocol.
#[derive(Clone, Debug)]
pub struct Authenticator {
    sigv4: SigV4Verifier,
    allow_bearer: bool,
}

impl Authenticator {
    /// SigV4 for `region` and `services`; bearer tokens too when `allow_bearer`.
    pub fn new(keys: Arc<KeyStore>, region: impl Into<String>, services: &[&str], allow_bearer: bool) -> Self {
        Authenticator { sigv4: SigV4Verifier::new(keys, region, services), allow_bearer }
    }

    pub fn sigv4(&self) -> &SigV4Verifier {
        &self.sigv4
    }

    pub fn keys(&self) -> &Arc<KeyStore> {
        self.sigv4.keys()
    }

    /// Authenticates a request from its head (and its whole body when the
    /// caller has read it; see [`SigV4Verifier::verify`]).
    pub fn authenticate(&self, parts: &Parts, body: Option<&[u8]>, now: SystemTime) -> Result<Principal, AuthError> {
        match sigv4::scheme(parts)? {
            sigv4::Scheme::Anonymous => Err(AuthError::Missing),
            sigv4::Scheme::Bearer(token) if self.allow_bearer => self.bearer(token),
            sigv4::Scheme::Bearer(_) => Err(AuthError::UnsupportedAlgorithm("Bearer".into())),
            sigv4::Scheme::SigV4Header(_) | sigv4::Scheme::SigV4Query => Ok(self.sigv4.verify(parts, body, now)?.principal),
        }
    }

    /// Checks a bearer token.
    pub fn bearer(&self, token: &str) -> Result<Principal, AuthError> {
        match self.keys().by_bearer_token(token) {
            Some(k) => Ok(k.principal(AuthMethod::Bearer)),
            None => Err(AuthError::BadBearerToken),
        }
    }
}
