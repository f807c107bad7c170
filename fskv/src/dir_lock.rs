//! One owner per data directory.
//!
//! `fskv up` and every service that keeps state in a directory (mgmtd,
//! meta, storage) take an exclusive `flock(2)` on `DIR/owner.lock` before
//! touching anything else there, and write their pid and role into it. A
//! second process started on a directory in use refuses at once, naming the
//! owner, instead of crash-looping on RocksDB's lock, appending to the
//! running cluster's logs or overwriting its pid files.
//!
//! | situation | result |
//! |---|---|
//! | directory unused, or its owner died (even by kill -9) | lock taken; the file now names this process |
//! | owner alive | error naming the owner's role and pid |
//! | the lock file cannot be created or locked (permissions, no flock) | error naming the file |
//!
//! Taking the lock also restricts the directory to its owner (mode 0700):
//! block files, RocksDB, logs, keys and credentials live below it, and no
//! other local user may read them, whatever the umask of the process that
//! created them.
//!
//! The kernel drops a `flock` when its process dies, so a crashed owner
//! never blocks a restart; the file is opened close-on-exec, so children
//! of `fskv up` do not inherit its lock.

use anyhow::Context;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Name of the lock file inside a data directory.
pub const LOCK_FILE: &str = "owner.lock";

/// Holds the lock until dropped (or the process exits).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes `dir`'s lock for `role` (e.g. "fskv up", "storage node-2").
    pub fn acquire(dir: &Path, role: &str) -> anyhow::Result<DirLock> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict the data directory {} to its owner (mode 0700)", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        // SAFETY: flock(2) on a descriptor this function owns.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut owner = String::new();
                // Bounded: the file is a line or two; a garbled one is shown as is.
                let _ = (&mut file).take(256).read_to_string(&mut owner);
                let owner = owner.split_whitespace().collect::<Vec<_>>().join(" ");
                let owner = if owner.is_empty() { "another process".to_string() } else { owner };
                anyhow::bail!(
                    "data directory {} is in use by {owner}; stop it first or choose another directory (lock file {})",
                    dir.display(),
                    path.display()
                );
            }
            return Err(err).with_context(|| format!("cannot lock {}", path.display()));
        }
        file.set_len(0).and_then(|()| file.seek(SeekFrom::Start(0))).with_context(|| format!("cannot rewrite {}", path.display()))?;
        writeln!(file, "{role} (pid {})", std::process::id()).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_is_refused_with_the_first_ones_name_and_the_lock_frees_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let first = DirLock::acquire(dir.path(), "fskv up").expect("first owner");
        let mode = std::fs::metadata(dir.path()).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the owner restricts the data directory to itself");
        // flock locks belong to the open file description: a second open in
        // the same process conflicts like another process would.
        let err = DirLock::acquire(dir.path(), "storage node-1").expect_err("second owner must be refused");
        let msg = format!("{err:#}");
        assert!(msg.contains("in use by fskv up (pid "), "{msg}");
        assert!(msg.contains(&std::process::id().to_string()), "{msg}");
        drop(first);
        // Another test of this binary spawning a child at that moment holds a
        // copy of the descriptor from its fork until its exec (close-on-exec),
        // which keeps the lock for that instant (failed once in CI): retry,
        // bounded. A real owner holds its lock for its whole life.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let _again = loop {
            match DirLock::acquire(dir.path(), "storage node-1") {
                Ok(lock) => break lock,
                Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(10)),
                Err(e) => panic!("still locked 5 s after the owner dropped it: {e:#}"),
            }
        };
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).expect("read lock file");
        assert!(text.starts_with("storage node-1 (pid "), "{text}");
    }
}
