//! A walk of a bucket's tree in S3 key order, from a lower bound, costing
//! O(entries returned + depth) meta calls rather than O(bucket).
//!
//! S3 orders keys by their bytes. A directory `a` holds the keys that start
//! with `a/`, so it sorts where `a/` does: after `a-b` and `a.b` (bytes below
//! `/`), before `a0`. Names come from meta's readdir in byte order; a
//! directory is held back in `pending` until the names read pass `name/`.
//!
//! Starting at a bound `b` inside a directory, with `c` the first
//! component of `b`: entries after `c` come from readdir; `c` itself and the
//! directories whose name is a proper prefix `p` of `c` with the next byte
//! of `c` below `/` (their `p/` sorts after `c`) are looked up, in one
//! batch. Bounds are byte strings: the lister skips a whole common prefix
//! `cp` with the bound `cp ++ 0xFF`, which no UTF-8 key reaches.

use crate::objmeta::XATTR_META;
use fskv_client::FsClient;
use fskv_proto::meta::{DirEntry, Inode, InodeKind, MetaOp, MetaReply};
use fskv_types::{ErrorCode, InodeId};
use std::collections::{BTreeMap, VecDeque};

/// Where a walk starts: keys `> key` (or `>= key` when inclusive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    pub key: Vec<u8>,
    pub inclusive: bool,
}

impl Bound {
    fn admits_file(&self, name: &[u8]) -> bool {
        name > self.key.as_slice() || (self.inclusive && name == self.key.as_slice())
    }

    /// For a directory `name`: `None` if its subtree is wholly before the
    /// bound, `Some(None)` if wholly after, `Some(Some(b))` if the bound
    /// falls inside it (`b` relative to the directory).
    fn for_dir(&self, name: &[u8]) -> Option<Option<Bound>> {
        let mut s = name.to_vec();
        s.push(b'/');
        if let Some(rest) = self.key.strip_prefix(s.as_slice()) {
            return Some(Some(Bound { key: rest.to_vec(), inclusive: self.inclusive }));
        }
        (s.as_slice() > self.key.as_slice()).then_some(None)
    }
}

/// What the walk meets, in key order.
#[derive(Clone, Debug)]
pub enum Event {
    /// A file: the object `key`.
    Object { key: String, inode: Inode },
    /// A directory whose subtree holds the keys starting with `key` (which
    /// ends in `/`). The walk enters it on the next call unless
    /// [`Walker::skip_dir`] is called first. `record` is its `user.s3.meta`
    /// xattr (a directory object) when `key` itself is within the bound.
    Dir { key: String, inode: Inode, record: Option<Vec<u8>> },
}

struct Frame {
    dir: InodeId,
    /// Key prefix of this directory's entries ("" or "a/b/").
    prefix: String,
    bound: Option<Bound>,
    cursor: String,
    exhausted: bool,
    buf: VecDeque<DirEntry>,
    /// Directories by `name/`, each with the bound that applies inside it.
    pending: BTreeMap<Vec<u8>, (DirEntry, Option<Bound>)>,
}

pub struct Walker<'a> {
    fs: &'a FsClient,
    stack: Vec<Frame>,
    /// A directory returned by the last `next`, entered on the next call.
    to_enter: Option<(InodeId, String, Option<Bound>)>,
    page: u32,
}

/// Meta calls of a walk go through this to become S3 errors in one place.
pub type WalkResult<T> = Result<T, (ErrorCode, String)>;

fn meta_err(e: fskv_client::MetaClientError) -> (ErrorCode, String) {
    (e.code(), e.to_string())
}

impl<'a> Walker<'a> {
    /// A walk of directory `dir` whose entries have key prefix `prefix`,
    /// starting at `bound` (relative to `prefix`).
    pub async fn new(fs: &'a FsClient, dir: InodeId, prefix: String, bound: Option<Bound>, page: u32) -> WalkResult<Walker<'a>> {
        let mut w = Walker { fs, stack: Vec::new(), to_enter: None, page: page.clamp(16, 1000) };
        w.push(dir, prefix, bound).await?;
        Ok(w)
    }

    /// Do not enter the directory of the last [`Event::Dir`].
    pub fn skip_dir(&mut self) {
        self.to_enter = None;
    }

    pub async fn next(&mut self) -> WalkResult<Option<Event>> {
        if let Some((dir, prefix, bound)) = self.to_enter.take() {
            self.push(dir, prefix, bound).await?;
        }
        loop {
            let Some(frame) = self.stack.last_mut() else { return Ok(None) };
            let prefix = frame.prefix.clone();
            match next_in_frame(self.fs, frame, self.page).await? {
                None => {
                    self.stack.pop();
                }
                Some(Cand::File(e)) => {
                    let Some(inode) = e.attr else { continue };
                    return Ok(Some(Event::Object { key: format!("{prefix}{}", e.name), inode }));
                }
                Some(Cand::Dir(e, inner)) => {
                    let Some(inode) = e.attr else { continue };
                    let key = format!("{prefix}{}/", e.name);
                    // The directory's own key is inside the bound unless the
                    // bound lies within its subtree (then `key` < bound),
                    // or equals it exclusively.
                    let key_admitted = match &inner {
                        None => true,
                        Some(b) => b.key.is_empty() && b.inclusive,
                    };
                    let record = if key_admitted { self.dir_record(e.inode).await? } else { None };
                    self.to_enter = Some((e.inode, key.clone(), inner));
                    return Ok(Some(Event::Dir { key, inode, record }));
                }
            }
        }
    }

    async fn dir_record(&self, dir: InodeId) -> WalkResult<Option<Vec<u8>>> {
        match self.fs.meta().get_xattr(dir, XATTR_META).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(meta_err(e)),
        }
    }

    async fn push(&mut self, dir: InodeId, prefix: String, bound: Option<Bound>) -> WalkResult<()> {
        let mut frame = Frame {
            dir,
            prefix,
            bound: bound.clone(),
            cursor: String::new(),
            exhausted: false,
            buf: VecDeque::new(),
            pending: BTreeMap::new(),
        };
        if let Some(b) = bound.filter(|b| !b.key.is_empty()) {
            let first = first_component(&b.key);
            frame.cursor = readdir_cursor(first);
            if first.first() == Some(&0xFF) {
                frame.exhausted = true; // every name sorts before the bound
            }
            self.seed_from_lookups(&mut frame, first, &b).await?;
        }
        self.stack.push(frame);
        Ok(())
    }

    /// Looks up `c` and the names that sort after `c` only as directories.
    async fn seed_from_lookups(&self, frame: &mut Frame, c: &[u8], b: &Bound) -> WalkResult<()> {
        let mut names: Vec<String> = Vec::new();
        for i in 1..c.len() {
            if c[i] < b'/' {
                if let Ok(p) = std::str::from_utf8(&c[..i]) {
                    names.push(p.to_string());
                }
            }
        }
        if let Ok(whole) = std::str::from_utf8(c) {
            names.push(whole.to_string());
        }
        if names.is_empty() {
            return Ok(());
        }
        let ops = names.iter().map(|n| MetaOp::Lookup { parent: frame.dir, name: n.clone() }).collect();
        let replies = self.fs.meta().batch(ops).await.map_err(meta_err)?;
        for (name, reply) in names.into_iter().zip(replies) {
            let inode = match reply {
                Ok(MetaReply::Inode(i)) => i,
                Ok(_) => continue,
                Err(s) if s.code == ErrorCode::NotFound => continue,
                Err(s) => return Err((s.code, s.message)),
            };
            let entry = DirEntry { name: name.clone(), inode: inode.id, kind: inode.kind(), attr: Some(inode) };
            match entry.kind {
                InodeKind::Directory => {
                    if let Some(inner) = b.for_dir(name.as_bytes()) {
                        frame.pending.insert(dir_sort_key(&name), (entry, inner));
                    }
                }
                InodeKind::File if name.as_bytes() == c && b.admits_file(c) => frame.buf.push_front(entry),
                _ => {}
            }
        }
        Ok(())
    }
}

enum Cand {
    File(DirEntry),
    Dir(DirEntry, Option<Bound>),
}

fn dir_sort_key(name: &str) -> Vec<u8> {
    let mut s = name.as_bytes().to_vec();
    s.push(b'/');
    s
}

fn first_component(key: &[u8]) -> &[u8] {
    match key.iter().position(|&c| c == b'/') {
        Some(i) => &key[..i],
        None => key,
    }
}

/// The readdir position for names after `c`: `c` itself when it is UTF-8;
/// otherwise its UTF-8 prefix followed by the largest character (names in
/// between sort before `c` and are filtered out).
fn readdir_cursor(c: &[u8]) -> String {
    match std::str::from_utf8(c) {
        Ok(s) => s.to_string(),
        Err(e) => {
            let valid = std::str::from_utf8(&c[..e.valid_up_to()]).unwrap_or_default();
            format!("{valid}\u{10FFFF}")
        }
    }
}

async fn next_in_frame(fs: &FsClient, frame: &mut Frame, page: u32) -> WalkResult<Option<Cand>> {
    loop {
        if frame.buf.is_empty() && !frame.exhausted {
            refill(fs, frame, page).await?;
        }
        let buf_name = frame.buf.front().map(|e| e.name.as_bytes().to_vec());
        let pending_first = frame.pending.keys().next().cloned();
        match (buf_name, pending_first) {
            (None, None) => return Ok(None),
            (b, Some(p)) if b.as_ref().map_or(true, |b| p < *b) => {
                let Some((entry, inner)) = frame.pending.remove(&p) else { return Ok(None) };
                return Ok(Some(Cand::Dir(entry, inner)));
            }
            _ => {
                let Some(e) = frame.buf.pop_front() else { return Ok(None) };
                if e.kind == InodeKind::Directory {
                    let inner = match &frame.bound {
                        None => Some(None),
                        Some(b) => b.for_dir(e.name.as_bytes()),
                    };
                    if let Some(inner) = inner {
                        frame.pending.insert(dir_sort_key(&e.name), (e, inner));
                    }
                    continue;
                }
                if e.kind == InodeKind::File {
                    return Ok(Some(Cand::File(e)));
                }
                // Symlinks and other kinds are not objects.
            }
        }
    }
}

async fn refill(fs: &FsClient, frame: &mut Frame, page: u32) -> WalkResult<()> {
    let (entries, more) = match fs.meta().readdir(frame.dir, &frame.cursor, page, true).await {
        Ok(r) => r,
        // The directory went away under the walk: it holds nothing now.
        Err(e) if e.code() == ErrorCode::NotFound => (Vec::new(), false),
        Err(e) => return Err(meta_err(e)),
    };
    if let Some(last) = entries.last() {
        frame.cursor = last.name.clone();
    }
    frame.exhausted = !more || entries.is_empty();
    for e in entries {
        let keep = match (&frame.bound, e.kind) {
            (None, _) => true,
            (Some(_), InodeKind::Directory) => true, // checked when it leaves the buffer
            (Some(b), _) => b.admits_file(e.name.as_bytes()),
        };
        if keep {
            frame.buf.push_back(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_place_directories_by_name_slash() {
        let b = Bound { key: b"a-b".to_vec(), inclusive: false };
        assert_eq!(b.for_dir(b"a"), Some(None), "a/ sorts after a-b");
        assert_eq!(b.for_dir(b"a-"), None, "a-/ sorts before a-b");
        let inside = Bound { key: b"a/x".to_vec(), inclusive: false };
        assert_eq!(inside.for_dir(b"a"), Some(Some(Bound { key: b"x".to_vec(), inclusive: false })));
        assert!(b.admits_file(b"a0"));
        assert!(!b.admits_file(b"a-b"));
        assert!(Bound { key: b"a-b".to_vec(), inclusive: true }.admits_file(b"a-b"));
        let skip = Bound { key: b"logs/\xFF".to_vec(), inclusive: false };
        assert_eq!(skip.for_dir(b"logs"), Some(Some(Bound { key: b"\xFF".to_vec(), inclusive: false })));
    }

    #[test]
    fn cursors_stay_utf8() {
        assert_eq!(readdir_cursor(b"abc"), "abc");
        assert_eq!(readdir_cursor(b"ab\xFF"), "ab\u{10FFFF}");
        assert_eq!(first_component(b"a/b/c"), b"a");
    }
}
