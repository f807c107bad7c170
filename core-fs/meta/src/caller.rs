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
//! | `user:<uid>:<gid>[:<g1>,<g2>…]` | uid `<uid>`, gid `<gid>`, supplementary groups `<g…>` — whatever the request says | a user principal (a key from `fskv admin user-key`, proven with its own derived key) acts as itself |
//! | `user:` anything else | refused (`PermissionDenied`) | malformed (the RPC handshake already refuses it) |
//! | any other name | refused (`PermissionDenied`) | unknown principals get nothing |
//!
//! | method | user principals |
//! |---|---|
//! | `meta.Call`, `meta.Batch` | as the user above (every op's permission check applies) |
//! | `meta.IssueCap` | as the user above: a capability only for what the user may read / write |
//! | `meta.Sync` | allowed (a durability barrier, changes nothing) |
//! | `meta.Fsck` | refused ([`refuse_users`]): an admin scan of the whole namespace |

use crate::error::MetaError;
use fskv_proto::meta::UserInfo;
use fskv_rpc::auth::{Principal, UserPrincipal, USER_PREFIX};

/// The user a request of `principal` acts as, given the user it `claimed`.
pub fn acting_user(principal: Option<&Principal>, claimed: UserInfo) -> Result<UserInfo, MetaError> {
    let Some(p) = principal else { return Ok(claimed) };
    let name = p.name();
    if name.starts_with(USER_PREFIX) {
        let user = UserPrincipal::parse(name).ok_or_else(|| MetaError::PermissionDenied(format!("malformed user principal {name:?}")))?;
        return Ok(UserInfo { uid: user.uid, gid: user.gid, groups: user.groups });
    }
    let trusted = matches!(name, "fuse" | "gateway" | "client" | "mgmtd")
        || name.strip_prefix("node:").or_else(|| name.strip_prefix("meta:")).is_some_and(|id| id.parse::<u32>().is_ok());
    if trusted {
        Ok(claimed)
    } else {
        Err(MetaError::PermissionDenied(format!("principal {name:?} may not call meta")))
    }
}

/// Refuses `method` to user principals (admin methods).
pub fn refuse_users(principal: Option<&Principal>, method: &str) -> Result<(), MetaError> {
    match principal.filter(|p| p.is_user()) {
        Some(p) => Err(MetaError::PermissionDenied(format!("{p} may not call meta.{method} (an admin method)"))),
        None => Ok(()),
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
            assert!(refuse_users(Some(&p(trusted)), "Fsck").is_ok());
        }
        // A user principal acts as itself, whatever it claims.
        assert_eq!(acting_user(Some(&p("user:1000:100")), root()).unwrap(), UserInfo { uid: 1000, gid: 100, groups: vec![] });
        assert_eq!(acting_user(Some(&p("user:1000:100:27,4")), root()).unwrap(), UserInfo { uid: 1000, gid: 100, groups: vec![27, 4] });
        assert!(matches!(refuse_users(Some(&p("user:1000:100")), "Fsck"), Err(MetaError::PermissionDenied(_))));
        for refused in ["user:x", "user:1000", "user:1:2:3:4", "user:01:1", "node:abc", "stranger", "meta:"] {
            assert!(matches!(acting_user(Some(&p(refused)), root()), Err(MetaError::PermissionDenied(_))), "{refused}");
        }
    }
}
