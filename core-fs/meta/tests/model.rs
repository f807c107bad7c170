//! Model-based property test: random sequences of namespace operations
//! (including directory renames across the tree, hard links and recursive
//! removes) run against the service and against an in-memory POSIX model.
//! After every step: same result (ok / error code) as the model, the real
//! tree equals the model's, and fsck finds the tree acyclic, every entry
//! pointing to a live inode and nlink equal to the entries.

mod common;

use common::Fs;
use fskv_meta::fsck;
use fskv_proto::meta::*;
use fskv_types::{ErrorCode, InodeId};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Step {
    Create(u8, u8),
    Mkdir(u8, u8),
    Symlink(u8, u8),
    Unlink(u8, u8),
    Rmdir(u8, u8),
    Rename(u8, u8, u8, u8),
    Link(u8, u8, u8, u8),
    RemoveTree(u8, u8),
    /// CreateWritePublish without precondition: replaces a non-directory.
    Publish(u8, u8),
    /// OverwriteInline at the version a lookup just returned: the tree stays as it is.
    Overwrite(u8, u8),
}

fn step() -> impl Strategy<Value = Step> {
    let d = any::<u8>();
    let n = 0u8..3;
    prop_oneof![
        3 => (d, n.clone()).prop_map(|(d, n)| Step::Create(d, n)),
        4 => (d, n.clone()).prop_map(|(d, n)| Step::Mkdir(d, n)),
        1 => (d, n.clone()).prop_map(|(d, n)| Step::Symlink(d, n)),
        2 => (d, n.clone()).prop_map(|(d, n)| Step::Unlink(d, n)),
        2 => (d, n.clone()).prop_map(|(d, n)| Step::Rmdir(d, n)),
        6 => (d, n.clone(), d, n.clone()).prop_map(|(a, b, c, e)| Step::Rename(a, b, c, e)),
        2 => (d, n.clone(), d, n.clone()).prop_map(|(a, b, c, e)| Step::Link(a, b, c, e)),
        1 => (d, n.clone()).prop_map(|(d, n)| Step::RemoveTree(d, n)),
        2 => (d, n.clone()).prop_map(|(d, n)| Step::Publish(d, n)),
        2 => (d, n).prop_map(|(d, n)| Step::Overwrite(d, n)),
    ]
}

type Entry = (InodeId, InodeKind);

/// The POSIX model: children of every live directory, in creation order of directories.
struct Model {
    dirs: BTreeMap<InodeId, BTreeMap<String, Entry>>,
    dir_order: Vec<InodeId>,
}

impl Model {
    fn new() -> Self {
        let mut dirs = BTreeMap::new();
        dirs.insert(InodeId::ROOT, BTreeMap::new());
        Model { dirs, dir_order: vec![InodeId::ROOT] }
    }

    fn dir(&self, idx: u8) -> InodeId {
        self.dir_order[idx as usize % self.dir_order.len()]
    }

    fn entry(&self, dir: InodeId, name: &str) -> Option<Entry> {
        self.dirs.get(&dir).and_then(|c| c.get(name)).copied()
    }

    fn is_under(&self, dir: InodeId, ancestor: InodeId) -> bool {
        // Is `dir` equal to or inside `ancestor`?
        if dir == ancestor {
            return true;
        }
        let Some(children) = self.dirs.get(&ancestor) else { return false };
        children.values().any(|(id, kind)| *kind == InodeKind::Directory && self.is_under(dir, *id))
    }

    fn remove_subtree(&mut self, dir: InodeId) {
        if let Some(children) = self.dirs.remove(&dir) {
            self.dir_order.retain(|d| *d != dir);
            for (id, kind) in children.values() {
                if *kind == InodeKind::Directory {
                    self.remove_subtree(*id);
                }
            }
        }
    }

    fn add_dir(&mut self, id: InodeId) {
        self.dirs.insert(id, BTreeMap::new());
        self.dir_order.push(id);
    }

    fn live_inodes(&self) -> usize {
        let mut all: std::collections::HashSet<InodeId> = self.dirs.keys().copied().collect();
        for c in self.dirs.values() {
            all.extend(c.values().map(|(id, _)| *id));
        }
        all.len()
    }

    fn links(&self) -> HashMap<InodeId, u32> {
        let mut m = HashMap::new();
        for c in self.dirs.values() {
            for (id, _) in c.values() {
                *m.entry(*id).or_default() += 1;
            }
        }
        m
    }
}

fn err(code: ErrorCode) -> Result<(), ErrorCode> {
    Err(code)
}

async fn run_step(fs: &Fs, m: &mut Model, s: &Step) {
    let name = |i: u8| NAMES[i as usize % NAMES.len()].to_string();
    match s {
        Step::Create(d, n) | Step::Mkdir(d, n) | Step::Symlink(d, n) => {
            let (dir, name) = (m.dir(*d), name(*n));
            let expect = if m.entry(dir, &name).is_some() { err(ErrorCode::AlreadyExists) } else { Ok(()) };
            let (op, kind) = match s {
                Step::Create(..) => {
                    (MetaOp::Create { parent: dir, name: name.clone(), mode: 0o644, exclusive: true, write: false }, InodeKind::File)
                }
                Step::Mkdir(..) => (MetaOp::Mkdir { parent: dir, name: name.clone(), mode: 0o755, xattrs: vec![] }, InodeKind::Directory),
                _ => (MetaOp::Symlink { parent: dir, name: name.clone(), target: "t".into() }, InodeKind::Symlink),
            };
            let got = fs.inode(op).await;
            assert_eq!(got.as_ref().map(|_| ()).map_err(|e| e.code()), expect, "{s:?}");
            if let Ok(inode) = got {
                m.dirs.get_mut(&dir).unwrap().insert(name, (inode.id, kind));
                if kind == InodeKind::Directory {
                    m.add_dir(inode.id);
                }
            }
        }
        Step::Unlink(d, n) | Step::Rmdir(d, n) => {
            let (dir, name) = (m.dir(*d), name(*n));
            let rmdir = matches!(s, Step::Rmdir(..));
            let expect = match m.entry(dir, &name) {
                None => err(ErrorCode::NotFound),
                Some((_, k)) if rmdir && k != InodeKind::Directory => err(ErrorCode::NotDirectory),
                Some((_, k)) if !rmdir && k == InodeKind::Directory => err(ErrorCode::IsDirectory),
                Some((id, _)) if rmdir && !m.dirs[&id].is_empty() => err(ErrorCode::NotEmpty),
                Some(_) => Ok(()),
            };
            let op =
                if rmdir { MetaOp::Rmdir { parent: dir, name: name.clone() } } else { MetaOp::Unlink { parent: dir, name: name.clone() } };
            let got = fs.op(op).await.map(|_| ()).map_err(|e| e.code());
            assert_eq!(got, expect, "{s:?}");
            if got.is_ok() {
                if let Some((id, _)) = m.dirs.get_mut(&dir).unwrap().remove(&name) {
                    m.remove_subtree(id);
                }
            }
        }
        Step::RemoveTree(d, n) => {
            let (dir, name) = (m.dir(*d), name(*n));
            let expect = if m.entry(dir, &name).is_some() { Ok(()) } else { err(ErrorCode::NotFound) };
            let got = fs.op(MetaOp::RemoveTree { parent: dir, name: name.clone() }).await.map(|_| ()).map_err(|e| e.code());
            assert_eq!(got, expect, "{s:?}");
            if got.is_ok() {
                if let Some((id, _)) = m.dirs.get_mut(&dir).unwrap().remove(&name) {
                    m.remove_subtree(id);
                }
            }
        }
        Step::Publish(d, n) => {
            let (dir, name) = (m.dir(*d), name(*n));
            let expect = match m.entry(dir, &name) {
                Some((_, InodeKind::Directory)) => err(ErrorCode::IsDirectory),
                _ => Ok(()),
            };
            let op = MetaOp::CreateWritePublish {
                parent: dir,
                name: name.clone(),
                mode: 0o644,
                data: b"x".to_vec(),
                expected: None,
                attrs: Default::default(),
            };
            let got = fs.inode(op).await;
            assert_eq!(got.as_ref().map(|_| ()).map_err(|e| e.code()), expect, "{s:?}");
            if let Ok(inode) = got {
                m.dirs.get_mut(&dir).unwrap().insert(name, (inode.id, InodeKind::File));
            }
        }
        Step::Overwrite(d, n) => {
            let (dir, name) = (m.dir(*d), name(*n));
            let entry = m.entry(dir, &name);
            let current = match entry {
                Some(_) => Some(fs.lookup(dir, &name).await.unwrap()),
                None => None,
            };
            let expect = match (entry, &current) {
                (None, _) | (_, None) => err(ErrorCode::PreconditionFailed),
                (Some((_, InodeKind::Directory)), _) => err(ErrorCode::IsDirectory),
                (Some((_, InodeKind::File)), Some(i)) if i.file().is_some_and(|f| f.inline.is_some()) => Ok(()),
                (Some((_, InodeKind::File)), _) => err(ErrorCode::Unsupported),
                (Some(_), _) => err(ErrorCode::InvalidArgument),
            };
            let (inode, version) = current.as_ref().map_or((InodeId::ROOT, 0), |i| (i.id, i.version));
            let op = MetaOp::OverwriteInline { parent: dir, name: name.clone(), inode, version, data: b"yz".to_vec() };
            let got = fs.inode(op).await;
            assert_eq!(got.as_ref().map(|_| ()).map_err(|e| e.code()), expect, "{s:?}");
            if let (Ok(after), Some(before)) = (&got, &current) {
                assert_eq!(after.id, before.id, "{s:?}: overwritten in place");
                assert!(after.version > before.version, "{s:?}");
            }
        }
        Step::Link(sd, sn, dd, dn) => {
            let (sdir, sname, ddir, dname) = (m.dir(*sd), name(*sn), m.dir(*dd), name(*dn));
            let Some((src, kind)) = m.entry(sdir, &sname) else { return };
            let expect = if kind == InodeKind::Directory {
                err(ErrorCode::IsDirectory)
            } else if m.entry(ddir, &dname).is_some() {
                err(ErrorCode::AlreadyExists)
            } else {
                Ok(())
            };
            let got = fs.op(MetaOp::Link { inode: src, parent: ddir, name: dname.clone() }).await.map(|_| ()).map_err(|e| e.code());
            assert_eq!(got, expect, "{s:?}");
            if got.is_ok() {
                m.dirs.get_mut(&ddir).unwrap().insert(dname, (src, kind));
            }
        }
        Step::Rename(sd, sn, dd, dn) => {
            let (sdir, sname, ddir, dname) = (m.dir(*sd), name(*sn), m.dir(*dd), name(*dn));
            let src = m.entry(sdir, &sname);
            let dst = m.entry(ddir, &dname);
            let expect = match (src, dst) {
                (None, _) => err(ErrorCode::NotFound),
                _ if sdir == ddir && sname == dname => Ok(()),
                (Some((sid, InodeKind::Directory)), _) if sdir != ddir && m.is_under(ddir, sid) => err(ErrorCode::WouldCreateCycle),
                (Some((sid, _)), Some((did, _))) if sid == did => Ok(()),
                (Some((_, InodeKind::Directory)), Some((_, k))) if k != InodeKind::Directory => err(ErrorCode::NotDirectory),
                (Some((_, k)), Some((_, InodeKind::Directory))) if k != InodeKind::Directory => err(ErrorCode::IsDirectory),
                (Some(_), Some((did, InodeKind::Directory))) if !m.dirs[&did].is_empty() => err(ErrorCode::NotEmpty),
                _ => Ok(()),
            };
            let op = MetaOp::Rename { src_parent: sdir, src_name: sname.clone(), dst_parent: ddir, dst_name: dname.clone() };
            let got = fs.op(op).await.map(|_| ()).map_err(|e| e.code());
            assert_eq!(got, expect, "{s:?}");
            let noop = sdir == ddir && sname == dname || matches!((src, dst), (Some((a, _)), Some((b, _))) if a == b);
            if got.is_ok() && !noop {
                let moved = m.dirs.get_mut(&sdir).unwrap().remove(&sname).unwrap();
                if let Some((old, InodeKind::Directory)) = m.dirs.get_mut(&ddir).unwrap().insert(dname, moved) {
                    m.remove_subtree(old);
                }
            }
        }
    }
}

async fn check_against_model(fs: &Fs, m: &Model) {
    fs.svc.run_gc_until_idle().await.unwrap();
    let report = fsck::check(&**fs.svc.engine()).await.unwrap();
    assert!(report.problems.is_empty(), "fsck: {:#?}", report.problems);
    assert_eq!(report.gc_queued, 0);
    assert_eq!(report.inodes, m.live_inodes(), "inode count (orphans or leaks)");
    for (dir, children) in &m.dirs {
        let real: BTreeMap<String, Entry> = fs.readdir_all(*dir).await.unwrap().into_iter().map(|e| (e.name, (e.inode, e.kind))).collect();
        assert_eq!(&real, children, "entries of {dir}");
    }
    for (id, links) in m.links() {
        let inode = fs.stat(id).await.unwrap();
        if inode.kind() != InodeKind::Directory {
            assert_eq!(inode.nlink, links, "nlink of {id}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, max_shrink_iters: 500, ..ProptestConfig::default() })]
    #[test]
    fn random_operations_match_the_posix_model(steps in proptest::collection::vec(step(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let fs = Fs::new().await;
            let mut model = Model::new();
            for s in &steps {
                run_step(&fs, &mut model, s).await;
                check_against_model(&fs, &model).await;
            }
            if std::env::var("MODEL_DEBUG").is_ok() {
                eprintln!("steps {} dirs {} inodes {}", steps.len(), model.dirs.len(), model.live_inodes());
            }
        });
    }
}
