//! Who a meta request acts as: the user named in the request (`MetaRequest::user`)
//! is trusted only from principals that may act for users (service identity,
//! `fskv_rpc::auth`; docs/security.md).
//!
//! | connection's principal | acts as | why |
//! |---|---|---|
//! | none (server without a cluster key) | the request's user | no authentication configured (tests, simulation) |
//! | `fuse` | the request's user | the FUSE daemon acts for the calling process (its uid, gid, supplementary groups from the kernel) |
//! | `gateway` | the request's user | gateways act for the mapped tenant user |
//! | `client`, `node:N`, `meta:N`, `mgmtd` | the request's user | holders of the cluster key are trusted processes of the cluster (root's or the operator's `fskv` commands, peers) |
//! | `user:<uid>` | uid `<uid>`, gid `<uid>`, no supplementary groups — whatever the request says | a user principal acts as itself (per-user keys: not issued yet) |
//! | any other name | refused (`PermissionDenied`) | unknown principals get nothing |
//!
//! Today every principal that can connect holds the one cluster key, so the
//! rule that matters is the refusal of every peer without it (before any
//! handler, in `fskv-rpc`); the table makes the future user principal act as
//! itself without another change here.

use crate::error::MetaError;
use fskv_proto::meta::UserInfo;
use fskv_rpc::auth::Principal;

/// The user a request of `principal` acts as, given the user it `claimed`.
pub fn acting_user(principal: Option<&Principal>, claimed: UserInfo) -> Result<UserInfo, MetaError> {
    let Some(p) = principal else { return Ok(claimed) };
    let name = p.name();
    if let Some(uid) = name.strip_prefix("user:") {
        let uid: u32 = uid.parse().map_err(|_| MetaError::PermissionDenied(format!("malformed user principal {name:?}")))?;
        return Ok(UserInfo { uid, gid: uid, groups: Vec::new() });
    }
    let trusted = matches!(name, "fuse" | "gateway" | "client" | "mgmtd")
        || name.strip_prefix("node:").or_else(|| name.strip_prefix("meta:")).is_some_and(|id| id.parse::<u32>().is_ok());
    if trusted {
        Ok(claimed)
    } else {
        Err(MetaError::PermissionDenied(format!("principal {name:?} may not call meta")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> UserInfo {
        UserInfo { uid: 0, gid: 0, groups: vec![1, 2] }
    }

    #[test]
    fn the_table_holds() {
        let p = |n: &str| Principal::new(n).unwrap();
        assert_eq!(acting_user(None, root()).unwrap(), root());
        for trusted in ["fuse", "gateway", "client", "mgmtd", "node:3", "meta:1"] {
            assert_eq!(acting_user(Some(&p(trusted)), root()).unwrap(), root(), "{trusted}");
        }
        // A user principal acts as itself, whatever it claims.
        assert_eq!(acting_user(Some(&p("user:1000")), root()).unwrap(), UserInfo { uid: 1000, gid: 1000, groups: vec![] });
        for refused in ["user:x", "node:abc", "stranger", "meta:"] {
            assert!(matches!(acting_user(Some(&p(refused)), root()), Err(MetaError::PermissionDenied(_))), "{refused}");
        }
    }
}
