//! What a protocol tells the shared layer about a request before handling
//! it, and the reader/writer guard.
//!
//! | role | `Access::Read` | `Access::Mutation` |
//! |---|---|---|
//! | `Writer` | served | served |
//! | `Reader` | served | refused before the handler and before the body is read: `GatewayError::ReadOnly` naming the writer endpoint (403 `ReadOnlyGateway`) |
//!
//! The classification is the protocol's (a function of the request head
//! alone, exported by each gateway crate so the front can route with it);
//! the guard is this one.

use crate::config::{BodyClass, Role};
use crate::error::GatewayError;

/// Whether a request changes state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Mutation,
}

/// Who checks a request's credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthPolicy {
    /// Nobody (health checks, public documents).
    Open,
    /// The protocol verifies signatures itself (the S3 gateway: s3s does,
    /// chunk signatures included). The shared layer still applies the
    /// checks that need no key before the handler: SigV2 refused, credential
    /// scope, dates and presigned expiry ([`crate::auth::SigV4Verifier::precheck`]).
    Delegated,
    /// The shared layer authenticates (SigV4 or bearer) before the handler;
    /// the handler finds the principal in [`crate::RequestContext`]. A SigV4
    /// request without `x-amz-content-sha256` has its body read first (it is
    /// signed) within the route's body limit.
    Required,
}

/// A request as its protocol classifies it from the head alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The operation's name: the `route` label of metrics and logs (keep the
    /// set small and fixed).
    pub name: &'static str,
    pub access: Access,
    pub body: BodyClass,
    pub auth: AuthPolicy,
}

/// The reader/writer guard.
pub fn guard(role: Role, access: Access, writer_endpoint: Option<&str>) -> Result<(), GatewayError> {
    match (role, access) {
        (Role::Reader, Access::Mutation) => Err(GatewayError::ReadOnly { writer_endpoint: writer_endpoint.map(str::to_string) }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mutations_on_readers_are_refused() {
        assert!(guard(Role::Writer, Access::Mutation, None).is_ok());
        assert!(guard(Role::Writer, Access::Read, None).is_ok());
        assert!(guard(Role::Reader, Access::Read, None).is_ok());
        match guard(Role::Reader, Access::Mutation, Some("http://w:1")) {
            Err(GatewayError::ReadOnly { writer_endpoint }) => assert_eq!(writer_endpoint.as_deref(), Some("http://w:1")),
            other => panic!("{other:?}"),
        }
    }
}
