//! The one mapping from fskv errors to errno values.

use fskv_client::{FileError, MetaClientError};
use fskv_types::ErrorCode;
use fuser::Errno;
use std::fmt::Display;

/// An error of one FUSE operation: the errno the kernel gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsError(pub Errno);

pub type FsResult<T> = Result<T, FsError>;

/// The errno of an fskv error code. Codes without a POSIX meaning become
/// EIO and their cause is logged (so the errno is never the only trace).
pub fn errno_for(code: ErrorCode, cause: &dyn Display) -> Errno {
    match code {
        ErrorCode::NotFound => Errno::ENOENT,
        ErrorCode::AlreadyExists => Errno::EEXIST,
        ErrorCode::PermissionDenied => Errno::EACCES,
        ErrorCode::NotDirectory => Errno::ENOTDIR,
        ErrorCode::IsDirectory => Errno::EISDIR,
        ErrorCode::NotEmpty => Errno::ENOTEMPTY,
        ErrorCode::NameTooLong => Errno::ENAMETOOLONG,
        ErrorCode::WouldCreateCycle | ErrorCode::InvalidArgument => Errno::EINVAL,
        ErrorCode::Unsupported => Errno::EOPNOTSUPP,
        ErrorCode::ResourceExhausted => Errno::ENOSPC,
        other => {
            tracing::warn!(code = ?other, %cause, "fskv error without a POSIX meaning; returning EIO");
            Errno::EIO
        }
    }
}

impl From<MetaClientError> for FsError {
    fn from(e: MetaClientError) -> Self {
        FsError(errno_for(e.code(), &e))
    }
}

impl From<FileError> for FsError {
    fn from(e: FileError) -> Self {
        FsError(errno_for(e.code(), &e))
    }
}

impl FsError {
    /// For xattr calls: a missing attribute is ENODATA, not ENOENT.
    pub fn for_xattr(self) -> Self {
        if self.0 == Errno::ENOENT {
            FsError(Errno::ENODATA)
        } else {
            self
        }
    }

    /// For chmod/chown/utimes: a caller that is not the owner gets EPERM.
    pub fn for_setattr(self) -> Self {
        if self.0 == Errno::EACCES {
            FsError(Errno::EPERM)
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_posix_errnos() {
        let c = &"test";
        assert_eq!(errno_for(ErrorCode::NotFound, c), Errno::ENOENT);
        assert_eq!(errno_for(ErrorCode::AlreadyExists, c), Errno::EEXIST);
        assert_eq!(errno_for(ErrorCode::PermissionDenied, c), Errno::EACCES);
        assert_eq!(errno_for(ErrorCode::NotDirectory, c), Errno::ENOTDIR);
        assert_eq!(errno_for(ErrorCode::IsDirectory, c), Errno::EISDIR);
        assert_eq!(errno_for(ErrorCode::NotEmpty, c), Errno::ENOTEMPTY);
        assert_eq!(errno_for(ErrorCode::NameTooLong, c), Errno::ENAMETOOLONG);
        assert_eq!(errno_for(ErrorCode::WouldCreateCycle, c), Errno::EINVAL);
        assert_eq!(errno_for(ErrorCode::InvalidArgument, c), Errno::EINVAL);
        assert_eq!(errno_for(ErrorCode::KvNotCommitted, c), Errno::EIO);
        assert_eq!(FsError(Errno::ENOENT).for_xattr(), FsError(Errno::ENODATA));
        assert_eq!(FsError(Errno::EACCES).for_setattr(), FsError(Errno::EPERM));
    }
}
