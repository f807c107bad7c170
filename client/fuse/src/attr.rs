//! Inode → `FileAttr` conversion.

use fskv_proto::meta::{Inode, InodeKind, SpecialKind};
use fuser::{FileAttr, FileType, INodeNo};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `st_blksize` reported for every inode: large, so stdio and `cp` issue
/// big reads/writes.
pub const BLKSIZE_BYTES: u32 = 1 << 20;

pub fn file_type(kind: InodeKind) -> FileType {
    match kind {
        InodeKind::File => FileType::RegularFile,
        InodeKind::Directory => FileType::Directory,
        InodeKind::Symlink => FileType::Symlink,
        InodeKind::Special(SpecialKind::Fifo) => FileType::NamedPipe,
        InodeKind::Special(SpecialKind::Socket) => FileType::Socket,
        InodeKind::Special(SpecialKind::CharDevice) => FileType::CharDevice,
        InodeKind::Special(SpecialKind::BlockDevice) => FileType::BlockDevice,
    }
}

/// A `mknod(2)` file type this filesystem cannot make (e.g. a directory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnsupportedFileType(pub u32);

/// The special-file kind of a `mknod(2)` mode (`None` for a regular file).
pub fn special_kind_of_mode(mode: u32) -> Result<Option<SpecialKind>, UnsupportedFileType> {
    match mode & libc::S_IFMT {
        0 | libc::S_IFREG => Ok(None),
        libc::S_IFIFO => Ok(Some(SpecialKind::Fifo)),
        libc::S_IFSOCK => Ok(Some(SpecialKind::Socket)),
        libc::S_IFCHR => Ok(Some(SpecialKind::CharDevice)),
        libc::S_IFBLK => Ok(Some(SpecialKind::BlockDevice)),
        other => Err(UnsupportedFileType(other)),
    }
}

pub fn time_of(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

/// Nanoseconds since the epoch (0 for times before it).
pub fn ns_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// The attributes of `inode`, with the size raised to `min_size_bytes`
/// (the end of writes still open in this mount).
pub fn to_attr(inode: &Inode, min_size_bytes: u64) -> FileAttr {
    let size = inode.size_bytes().max(min_size_bytes);
    FileAttr {
        ino: INodeNo(inode.id.0),
        size,
        blocks: size.div_ceil(512),
        atime: time_of(inode.atime_ns),
        mtime: time_of(inode.mtime_ns),
        ctime: time_of(inode.ctime_ns),
        crtime: time_of(inode.ctime_ns),
        kind: file_type(inode.kind()),
        perm: (inode.acl.mode & 0o7777) as u16,
        nlink: inode.nlink,
        uid: inode.acl.uid,
        gid: inode.acl.gid,
        rdev: u32::try_from(inode.rdev()).unwrap_or(0),
        blksize: BLKSIZE_BYTES,
        flags: 0,
    }
}
