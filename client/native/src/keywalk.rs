//! Keys of a directory written with [`crate::keyname`] (a KV namespace, an
//! S3 flat bucket) in key order from a start position: a depth-first
//! walk of the namespace directory and its continuation directories, each
//! read with meta's readdir (name order). Because names preserve key order
//! and a continuation directory sorts where its keys do ([`crate::keyname`]), the
//! walk yields keys in byte order of the keys; a page costs O(keys returned
//! + depth) meta calls, not O(namespace).
//!
//! | start position | how the walk begins in a directory on its path (prefix `P` of encoded segments) |
//! |---|---|
//! | none | every entry |
//! | encoded key `S`, rest `R = S - P` longer than one segment | at the continuation directory `R[..240] + "+"` (inclusive), then into it |
//! | rest `R` within one segment, inclusive | at `R` itself ([`keys::bound_before`]) |
//! | rest `R` within one segment, exclusive | after `R` |
//!
//! Names that are not encodings of keys (made through FUSE or S3) are
//! skipped.

use crate::keyname::{self as keys, SEGMENT_BYTES};
use crate::meta::MetaClientError;
use crate::FsClient;
use fskv_proto::meta::{DirEntry, InodeKind};
use fskv_types::InodeId;
use std::collections::VecDeque;

/// Entries asked of one readdir.
pub const PAGE_ENTRIES: u32 = 512;

struct Frame {
    dir: InodeId,
    /// Encoded segments of the keys below this directory.
    prefix: String,
    after: String,
    buf: VecDeque<DirEntry>,
    more: bool,
}

/// One key found by the walk.
#[derive(Clone, Debug)]
pub struct Found {
    pub key: Vec<u8>,
    /// The file's inode as readdir gives it (no inline bytes).
    pub entry: DirEntry,
    /// The directory holding the file (the walked one or a continuation
    /// directory below it).
    pub dir: InodeId,
}

pub struct Walker {
    fs: FsClient,
    frames: Vec<Frame>,
    /// Encoded start key and whether it is included.
    start: Option<(String, bool)>,
    /// Largest mtime of the continuation directories seen (watch indexes).
    pub max_dir_mtime_ns: u64,
}

impl Walker {
    /// A walk of the namespace directory `dir` from `start` (key bytes,
    /// inclusive?) on.
    pub fn new(fs: FsClient, dir: InodeId, start: Option<(&[u8], bool)>) -> Walker {
        let start = start.filter(|(k, _)| !k.is_empty()).map(|(k, incl)| (keys::encode(k), incl));
        let mut w = Walker { fs, frames: Vec::new(), start, max_dir_mtime_ns: 0 };
        let after = w.start_after(String::new().as_str());
        w.frames.push(Frame { dir, prefix: String::new(), after, buf: VecDeque::new(), more: true });
        w
    }

    /// Where readdir starts in a directory whose keys begin with `prefix`.
    fn start_after(&self, prefix: &str) -> String {
        let Some((s, incl)) = &self.start else { return String::new() };
        let Some(rest) = s.strip_prefix(prefix) else { return String::new() };
        if rest.len() > SEGMENT_BYTES {
            keys::bound_before(&format!("{}+", &rest[..SEGMENT_BYTES]))
        } else if *incl {
            keys::bound_before(rest)
        } else {
            rest.to_string()
        }
    }

    fn before_start(&self, encoded: &str) -> bool {
        match &self.start {
            None => false,
            Some((s, incl)) => encoded < s.as_str() || (!incl && encoded == s.as_str()),
        }
    }

    /// The next key in order, or `None` at the end of the namespace.
    pub async fn next(&mut self) -> Result<Option<Found>, MetaClientError> {
        loop {
            let Some(top) = self.frames.last_mut() else { return Ok(None) };
            let Some(e) = top.buf.pop_front() else {
                if !top.more {
                    self.frames.pop();
                    continue;
                }
                let (entries, more) = self.fs.meta().readdir(top.dir, &top.after, PAGE_ENTRIES, true).await?;
                top.more = more && !entries.is_empty();
                if let Some(last) = entries.last() {
                    top.after = last.name.clone();
                }
                top.buf.extend(entries);
                continue;
            };
            match e.kind {
                InodeKind::Directory => {
                    let Some(seg) = keys::continuation_segment(&e.name) else { continue };
                    let prefix = format!("{}{}", top.prefix, String::from_utf8_lossy(seg));
                    if let Some(a) = &e.attr {
                        self.max_dir_mtime_ns = self.max_dir_mtime_ns.max(a.mtime_ns);
                    }
                    // A directory wholly before the start has nothing to give.
                    if let Some((s, _)) = &self.start {
                        if prefix.as_str() < s.as_str() && !s.starts_with(&prefix) {
                            continue;
                        }
                    }
                    let after = self.start_after(&prefix);
                    self.frames.push(Frame { dir: e.inode, prefix, after, buf: VecDeque::new(), more: true });
                }
                InodeKind::File if keys::is_file_segment(&e.name) => {
                    let encoded = format!("{}{}", top.prefix, e.name);
                    let dir = top.dir;
                    if self.before_start(&encoded) {
                        continue;
                    }
                    if let Some(key) = keys::decode(encoded.as_bytes()) {
                        return Ok(Some(Found { key, entry: e, dir }));
                    }
                }
                _ => {}
            }
        }
    }
}
