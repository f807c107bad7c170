//! Permission checks (docs/meta.md, "Permissions").
//!
//! Classic UNIX rules: the owner class if the caller's uid owns the inode,
//! else the group class if the inode's gid is the caller's gid or one of its
//! supplementary groups, else other. uid 0 bypasses every check. The sticky
//! bit on a directory restricts unlink/rename/rmdir of an entry to the owner
//! of the entry, the owner of the directory, or root.

use crate::error::{MetaError, MetaResult};
use fskv_proto::meta::{Inode, UserInfo, MODE_STICKY};

pub const READ: u32 = 4;
pub const WRITE: u32 = 2;
pub const EXEC: u32 = 1;

pub fn allowed(inode: &Inode, user: &UserInfo, want: u32) -> bool {
    if user.uid == 0 {
        return true;
    }
    let acl = &inode.acl;
    let bits = if user.uid == acl.uid {
        acl.mode >> 6
    } else if user.in_group(acl.gid) {
        acl.mode >> 3
    } else {
        acl.mode
    };
    bits & 7 & want == want
}

pub fn check(inode: &Inode, user: &UserInfo, want: u32) -> MetaResult<()> {
    if allowed(inode, user, want) {
        Ok(())
    } else {
        Err(MetaError::PermissionDenied(format!(
            "uid {} needs {}{}{} on {} (mode {:o}, owner {}:{})",
            user.uid,
            if want & READ != 0 { "r" } else { "" },
            if want & WRITE != 0 { "w" } else { "" },
            if want & EXEC != 0 { "x" } else { "" },
            inode.id,
            inode.acl.mode,
            inode.acl.uid,
            inode.acl.gid
        )))
    }
}

/// Only the owner (or root) may change mode, times, or xattrs without write permission.
pub fn check_owner(inode: &Inode, user: &UserInfo) -> MetaResult<()> {
    if user.uid == 0 || user.uid == inode.acl.uid {
        Ok(())
    } else {
        Err(MetaError::PermissionDenied(format!("uid {} does not own {}", user.uid, inode.id)))
    }
}

/// The sticky-bit rule for removing or renaming `victim` out of `dir`.
pub fn check_sticky(dir: &Inode, victim: &Inode, user: &UserInfo) -> MetaResult<()> {
    if dir.acl.mode & MODE_STICKY == 0 || user.uid == 0 || user.uid == dir.acl.uid || user.uid == victim.acl.uid {
        return Ok(());
    }
    Err(MetaError::PermissionDenied(format!("sticky directory {}: uid {} owns neither it nor {}", dir.id, user.uid, victim.id)))
}
