//! Operation-level tests on the service (no RPC): permissions, xattrs,
//! pagination, CAS replace, recursive remove + GC, idempotent retries,
//! lengths, inline data.

mod common;

use common::Fs;
use fskv_meta::MetaError;
use fskv_proto::meta::*;
use fskv_types::{ErrorCode, InodeId};

const ROOT: InodeId = InodeId::ROOT;

fn code<T: std::fmt::Debug>(r: Result<T, MetaError>) -> ErrorCode {
    r.expect_err("expected an error").code()
}

#[tokio::test]
async fn root_exists_and_basic_namespace_ops() {
    let fs = Fs::new().await;
    let root = fs.stat(ROOT).await.unwrap();
    assert_eq!(root.kind(), InodeKind::Directory);
    let d = fs.mkdir(ROOT, "d").await.unwrap();
    let f = fs.create(d.id, "f").await.unwrap();
    assert_eq!(fs.lookup(d.id, "f").await.unwrap().id, f.id);
    assert_eq!(code(fs.create(d.id, "f").await), ErrorCode::AlreadyExists);
    // Non-exclusive create opens the existing file.
    let again = fs.inode(MetaOp::Create { parent: d.id, name: "f".into(), mode: 0o644, exclusive: false, write: false }).await.unwrap();
    assert_eq!(again.id, f.id);
    assert_eq!(code(fs.op(MetaOp::Rmdir { parent: ROOT, name: "d".into() }).await), ErrorCode::NotEmpty);
    assert_eq!(code(fs.op(MetaOp::Unlink { parent: ROOT, name: "d".into() }).await), ErrorCode::IsDirectory);
    assert_eq!(code(fs.op(MetaOp::Rmdir { parent: d.id, name: "f".into() }).await), ErrorCode::NotDirectory);
    assert_eq!(code(fs.create(f.id, "x").await), ErrorCode::NotDirectory);
    assert_eq!(code(fs.create(ROOT, &"n".repeat(256)).await), ErrorCode::NameTooLong);
    assert_eq!(code(fs.create(ROOT, "a/b").await), ErrorCode::InvalidArgument);

    let s = fs.inode(MetaOp::Symlink { parent: d.id, name: "s".into(), target: "../t".into() }).await.unwrap();
    assert_eq!(fs.op(MetaOp::Readlink { inode: s.id }).await.unwrap(), MetaReply::Target("../t".into()));
    let l = fs.inode(MetaOp::Link { inode: f.id, parent: ROOT, name: "hard".into() }).await.unwrap();
    assert_eq!(l.nlink, 2);
    fs.op(MetaOp::Unlink { parent: d.id, name: "f".into() }).await.unwrap();
    assert_eq!(fs.stat(f.id).await.unwrap().nlink, 1);
    assert_eq!(code(fs.op(MetaOp::Link { inode: d.id, parent: ROOT, name: "dl".into() }).await), ErrorCode::IsDirectory);

    // Rename over an existing file replaces it; a dir over a file is refused.
    let g = fs.create(ROOT, "g").await.unwrap();
    fs.op(MetaOp::Rename { src_parent: ROOT, src_name: "hard".into(), dst_parent: ROOT, dst_name: "g".into() }).await.unwrap();
    assert_eq!(fs.lookup(ROOT, "g").await.unwrap().id, f.id);
    assert_eq!(fs.stat(g.id).await.unwrap().nlink, 0, "the replaced file waits for GC");
    fs.svc.run_gc_until_idle().await.unwrap();
    assert_eq!(code(fs.stat(g.id).await), ErrorCode::NotFound);
    assert_eq!(
        code(fs.op(MetaOp::Rename { src_parent: ROOT, src_name: "d".into(), dst_parent: ROOT, dst_name: "g".into() }).await),
        ErrorCode::NotDirectory
    );
    let e = fs.mkdir(ROOT, "e").await.unwrap();
    fs.op(MetaOp::Rename { src_parent: ROOT, src_name: "d".into(), dst_parent: e.id, dst_name: "d".into() }).await.unwrap();
    // d is now under e; moving e into d is a cycle.
    assert_eq!(
        code(fs.op(MetaOp::Rename { src_parent: ROOT, src_name: "e".into(), dst_parent: d.id, dst_name: "e".into() }).await),
        ErrorCode::WouldCreateCycle
    );
    assert_eq!(
        code(fs.op(MetaOp::Rename { src_parent: ROOT, src_name: "e".into(), dst_parent: e.id, dst_name: "e".into() }).await),
        ErrorCode::WouldCreateCycle
    );
    let moved = fs.stat(d.id).await.unwrap();
    assert_eq!(moved.dir().map(|x| x.parent), Some(e.id));
    fs.fsck_clean().await;
}

/// `Mkdir` with xattrs sets them in the creating transaction; a refused
/// attribute creates nothing.
#[tokio::test]
async fn mkdir_sets_its_xattrs_in_the_same_transaction() {
    let fs = Fs::new().await;
    let xattrs = vec![("user.s3.layout".to_string(), b"flat".to_vec())];
    let d = fs.inode(MetaOp::Mkdir { parent: ROOT, name: "b".into(), mode: 0o700, xattrs }).await.unwrap();
    let got = fs.op(MetaOp::GetXattr { inode: d.id, name: "user.s3.layout".into() }).await.unwrap();
    assert_eq!(got, MetaReply::Xattr(b"flat".to_vec()));
    let too_many = (0..=MAX_PUBLISH_XATTRS).map(|i| (format!("user.x{i}"), vec![])).collect();
    assert_eq!(
        code(fs.op(MetaOp::Mkdir { parent: ROOT, name: "c".into(), mode: 0o700, xattrs: too_many }).await),
        ErrorCode::ResourceExhausted
    );
    let empty_name = vec![(String::new(), vec![])];
    assert_eq!(
        code(fs.op(MetaOp::Mkdir { parent: ROOT, name: "c".into(), mode: 0o700, xattrs: empty_name }).await),
        ErrorCode::InvalidArgument
    );
    assert_eq!(code(fs.op(MetaOp::Lookup { parent: ROOT, name: "c".into() }).await), ErrorCode::NotFound);
    fs.fsck_clean().await;
}

/// `Txn`: ops commit together, each seeing the ones before it; one
/// failing op commits nothing. The S3 versioning move: link the current
/// object into a store, publish over it expecting that very inode, and a
/// delete marker beside it.
#[tokio::test]
async fn a_txn_commits_all_its_ops_or_none() {
    let fs = Fs::new().await;
    let dir = fs.mkdir(ROOT, "b").await.unwrap();
    let store = fs.mkdir(ROOT, "v").await.unwrap();
    let old = fs.create(dir.id, "k").await.unwrap();
    let publish = |expected| MetaOp::CreateWritePublish {
        parent: dir.id,
        name: "k".into(),
        mode: 0o600,
        data: b"new".to_vec(),
        expected: Some(expected),
        attrs: PublishAttrs::default(),
    };
    let was_old = Expected::Inode { id: old.id, version: old.version };
    let guard = MetaOp::Expect { parent: dir.id, name: "k".into(), expected: was_old.clone() };
    let keep_old = MetaOp::Rename { src_parent: dir.id, src_name: "k".into(), dst_parent: store.id, dst_name: "k.v1".into() };
    let ok = fs.op(MetaOp::Txn { ops: vec![guard.clone(), keep_old.clone(), publish(Expected::Absent)] }).await.unwrap();
    let MetaReply::Many(replies) = ok else { panic!("{ok:?}") };
    assert_eq!(replies.len(), 3);
    let kept = fs.op(MetaOp::Lookup { parent: store.id, name: "k.v1".into() }).await.unwrap();
    let MetaReply::Inode(kept) = kept else { panic!() };
    assert_eq!((kept.id, kept.nlink), (old.id, 1), "the old inode lives on in the store only");
    // A failing op commits nothing of the ops before it.
    let again = MetaOp::Link { inode: old.id, parent: store.id, name: "k.v2".into() };
    let stale = fs.op(MetaOp::Txn { ops: vec![again, publish(Expected::Absent)] }).await;
    assert_eq!(code(stale), ErrorCode::PreconditionFailed);
    assert_eq!(code(fs.op(MetaOp::Txn { ops: vec![guard] }).await), ErrorCode::PreconditionFailed, "k is the new inode now");
    assert_eq!(code(fs.op(MetaOp::Lookup { parent: store.id, name: "k.v2".into() }).await), ErrorCode::NotFound);
    // Refused shapes.
    assert_eq!(code(fs.op(MetaOp::Txn { ops: vec![] }).await), ErrorCode::InvalidArgument);
    let nested = MetaOp::Txn { ops: vec![MetaOp::Txn { ops: vec![] }] };
    assert_eq!(code(fs.op(nested).await), ErrorCode::InvalidArgument);
    let read = MetaOp::Txn { ops: vec![MetaOp::StatFs] };
    assert_eq!(code(fs.op(read).await), ErrorCode::InvalidArgument);
    let too_many = MetaOp::Txn { ops: vec![MetaOp::Unlink { parent: dir.id, name: "x".into() }; MAX_TXN_OPS + 1] };
    assert_eq!(code(fs.op(too_many).await), ErrorCode::InvalidArgument);
    fs.fsck_clean().await;
}

/// `MetaRequest::owner`: root creates inodes owned by another uid/gid in
/// the creating transaction (the gateways' tenants); nobody else may.
#[tokio::test]
async fn an_owner_named_by_root_owns_what_it_creates() {
    let fs = Fs::new().await;
    let tenant = fs.owning_as(20001, 20001);
    let bucket = tenant.inode(MetaOp::Mkdir { parent: ROOT, name: "b".into(), mode: 0o700, xattrs: vec![] }).await.unwrap();
    assert_eq!((bucket.acl.uid, bucket.acl.gid, bucket.acl.mode), (20001, 20001, 0o700));
    // A setgid parent does not override the named owner's gid.
    let sg = fs.mkdir(ROOT, "sg").await.unwrap();
    fs.op(MetaOp::SetAttr { inode: sg.id, attr: SetAttr { mode: Some(0o2711), gid: Some(5), ..Default::default() } }).await.unwrap();
    let f = tenant.create(sg.id, "f").await.unwrap();
    assert_eq!((f.acl.uid, f.acl.gid), (20001, 20001));
    let temp = tenant.inode(MetaOp::CreateUnlinked { parent: bucket.id, mode: 0o600 }).await.unwrap();
    assert_eq!((temp.acl.uid, temp.acl.gid), (20001, 20001));
    let small = tenant
        .inode(MetaOp::CreateWritePublish {
            parent: bucket.id,
            name: "small".into(),
            mode: 0o600,
            data: b"x".to_vec(),
            expected: None,
            attrs: PublishAttrs::default(),
        })
        .await
        .unwrap();
    assert_eq!((small.acl.uid, small.acl.gid), (20001, 20001));
    // Without an owner, root's creations stay root's.
    assert_eq!(fs.create(bucket.id, "g").await.unwrap().acl.uid, 0);
    // Any other user naming an owner is refused and nothing is created.
    let alice = fs.as_user(1000, 1000).owning_as(1000, 1000);
    let home = fs.mkdir(ROOT, "home").await.unwrap();
    fs.op(MetaOp::SetAttr { inode: home.id, attr: SetAttr { uid: Some(1000), gid: Some(1000), ..Default::default() } }).await.unwrap();
    assert_eq!(code(alice.mkdir(home.id, "d").await), ErrorCode::PermissionDenied);
    assert_eq!(code(alice.create(home.id, "f").await), ErrorCode::PermissionDenied);
    assert_eq!(code(fs.lookup(home.id, "d").await), ErrorCode::NotFound);
    assert_eq!(code(fs.lookup(home.id, "f").await), ErrorCode::NotFound);
    fs.fsck_clean().await;
}

#[tokio::test]
async fn permission_checks() {
    let fs = Fs::new().await;
    let alice = fs.as_user(1000, 1000);
    let bob = fs.as_user(1001, 1001);
    // Root-owned 0755 root: others cannot create there.
    assert_eq!(code(alice.create(ROOT, "x").await), ErrorCode::PermissionDenied);
    let home = fs.mkdir(ROOT, "home").await.unwrap();
    fs.op(MetaOp::SetAttr { inode: home.id, attr: SetAttr { uid: Some(1000), gid: Some(1000), ..Default::default() } }).await.unwrap();
    let f = alice.create(home.id, "f").await.unwrap();
    assert_eq!(f.acl.uid, 1000);
    // Bob can look up (x for other) but not create or unlink.
    assert!(bob.lookup(home.id, "f").await.is_ok());
    assert_eq!(code(bob.create(home.id, "g").await), ErrorCode::PermissionDenied);
    assert_eq!(code(bob.op(MetaOp::Unlink { parent: home.id, name: "f".into() }).await), ErrorCode::PermissionDenied);
    // Mode 0600: bob cannot open for read; alice can.
    alice.op(MetaOp::SetAttr { inode: f.id, attr: SetAttr { mode: Some(0o600), ..Default::default() } }).await.unwrap();
    assert_eq!(code(bob.op(MetaOp::Open { inode: f.id, write: false }).await), ErrorCode::PermissionDenied);
    assert!(alice.op(MetaOp::Open { inode: f.id, write: false }).await.is_ok());
    // Only the owner chmods; only root chowns.
    assert_eq!(
        code(bob.op(MetaOp::SetAttr { inode: f.id, attr: SetAttr { mode: Some(0o777), ..Default::default() } }).await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(alice.op(MetaOp::SetAttr { inode: f.id, attr: SetAttr { uid: Some(1001), ..Default::default() } }).await),
        ErrorCode::PermissionDenied
    );
    // Group class: bob in group 1000 may read a 0640 file.
    alice.op(MetaOp::SetAttr { inode: f.id, attr: SetAttr { mode: Some(0o640), ..Default::default() } }).await.unwrap();
    let mut bob_in_group = fs.as_user(1001, 1001);
    bob_in_group.user.groups = vec![1000];
    assert!(bob_in_group.op(MetaOp::Open { inode: f.id, write: false }).await.is_ok());
    assert_eq!(code(bob_in_group.op(MetaOp::Open { inode: f.id, write: true }).await), ErrorCode::PermissionDenied);
    // Sticky /tmp: bob cannot remove alice's file, alice can.
    let tmp = fs.mkdir(ROOT, "tmp").await.unwrap();
    fs.op(MetaOp::SetAttr { inode: tmp.id, attr: SetAttr { mode: Some(0o1777), ..Default::default() } }).await.unwrap();
    alice.create(tmp.id, "a").await.unwrap();
    assert_eq!(code(bob.op(MetaOp::Unlink { parent: tmp.id, name: "a".into() }).await), ErrorCode::PermissionDenied);
    assert_eq!(
        code(bob.op(MetaOp::Rename { src_parent: tmp.id, src_name: "a".into(), dst_parent: tmp.id, dst_name: "b".into() }).await),
        ErrorCode::PermissionDenied
    );
    alice.op(MetaOp::Unlink { parent: tmp.id, name: "a".into() }).await.unwrap();
    fs.fsck_clean().await;
}

#[tokio::test]
async fn lookup_xattr_answers_what_lookup_then_getxattr_answer() {
    let fs = Fs::new().await;
    let f = fs.create(ROOT, "f").await.unwrap();
    fs.op(MetaOp::SetXattr { inode: f.id, name: "user.s3.meta".into(), value: b"etag".to_vec(), flag: XattrFlag::Any }).await.unwrap();
    let d = fs.mkdir(ROOT, "d").await.unwrap();
    let lx = |parent: InodeId, name: &str, xattr: &str| MetaOp::LookupXattr { parent, name: name.into(), xattr: xattr.into() };
    let f_now = fs.lookup(ROOT, "f").await.unwrap();
    assert_eq!(
        fs.op(lx(ROOT, "f", "user.s3.meta")).await.unwrap(),
        MetaReply::InodeXattr { inode: f_now.clone(), value: Some(b"etag".to_vec()) }
    );
    // No such attribute: the inode alone, not NotFound.
    assert_eq!(fs.op(lx(ROOT, "f", "user.other")).await.unwrap(), MetaReply::InodeXattr { inode: f_now, value: None });
    assert_eq!(fs.op(lx(ROOT, "d", "user.s3.meta")).await.unwrap(), MetaReply::InodeXattr { inode: d.clone(), value: None });
    // No such name, a bad attribute name: as Lookup and GetXattr fail.
    assert_eq!(code(fs.op(lx(ROOT, "missing", "user.s3.meta")).await), ErrorCode::NotFound);
    assert_eq!(code(fs.op(lx(ROOT, "f", "")).await), code(fs.op(MetaOp::GetXattr { inode: f.id, name: "".into() }).await));
    // Permissions: x on the directory, r on the inode, whether or not it has the attribute.
    let bob = fs.as_user(1001, 1001);
    let private = |mode| MetaOp::SetAttr { inode: f.id, attr: SetAttr { mode: Some(mode), ..SetAttr::default() } };
    fs.op(private(0o600)).await.unwrap();
    assert_eq!(code(bob.op(lx(ROOT, "f", "user.s3.meta")).await), ErrorCode::PermissionDenied);
    assert_eq!(code(bob.op(lx(ROOT, "f", "user.other")).await), ErrorCode::PermissionDenied);
    fs.op(private(0o644)).await.unwrap();
    assert!(matches!(bob.op(lx(ROOT, "f", "user.s3.meta")).await.unwrap(), MetaReply::InodeXattr { value: Some(_), .. }));
    fs.op(MetaOp::SetAttr { inode: d.id, attr: SetAttr { mode: Some(0o700), ..SetAttr::default() } }).await.unwrap();
    fs.create(d.id, "g").await.unwrap();
    assert_eq!(code(bob.op(lx(d.id, "g", "user.s3.meta")).await), ErrorCode::PermissionDenied);
}

#[tokio::test]
async fn walk_xattr_answers_what_lookups_then_getxattr_answer() {
    let fs = Fs::new().await;
    let b = fs.mkdir(ROOT, "b").await.unwrap();
    let d = fs.mkdir(b.id, "d").await.unwrap();
    let f = fs.create(d.id, "f").await.unwrap();
    fs.op(MetaOp::SetXattr { inode: f.id, name: "user.s3.meta".into(), value: b"etag".to_vec(), flag: XattrFlag::Any }).await.unwrap();
    let walk = |names: &[&str], xattr: &str| MetaOp::WalkXattr {
        parent: ROOT,
        names: names.iter().map(|n| n.to_string()).collect(),
        xattr: xattr.into(),
    };
    let (b, d, f) = (fs.lookup(ROOT, "b").await.unwrap(), fs.lookup(b.id, "d").await.unwrap(), fs.lookup(d.id, "f").await.unwrap());
    let found = |inodes: Vec<&Inode>, value: Option<&[u8]>| MetaReply::Walk {
        inodes: inodes.into_iter().cloned().collect(),
        value: value.map(<[u8]>::to_vec),
    };
    // Every name found: every inode, as Lookup answers it (directories
    // with their nlink), and the last one's attribute.
    assert_eq!(fs.op(walk(&["b", "d", "f"], "user.s3.meta")).await.unwrap(), found(vec![&b, &d, &f], Some(b"etag")));
    assert_eq!(fs.op(walk(&["b", "d", "f"], "user.other")).await.unwrap(), found(vec![&b, &d, &f], None));
    assert_eq!(fs.op(walk(&["b"], "user.s3.meta")).await.unwrap(), found(vec![&b], None));
    // A name absent: the walk stops there, without an error.
    assert_eq!(fs.op(walk(&["missing", "d"], "user.s3.meta")).await.unwrap(), found(vec![], None));
    assert_eq!(fs.op(walk(&["b", "missing", "f"], "user.s3.meta")).await.unwrap(), found(vec![&b], None));
    assert_eq!(fs.op(walk(&["b", "d", "missing"], "user.s3.meta")).await.unwrap(), found(vec![&b, &d], None));
    // A file where a directory is needed: it is the last inode answered.
    assert_eq!(fs.op(walk(&["b", "d", "f", "g"], "user.s3.meta")).await.unwrap(), found(vec![&b, &d, &f], None));
    // Bad input fails as Lookup or GetXattr would, and the name count is bounded.
    assert_eq!(
        code(fs.op(walk(&["b", "x/y"], "user.s3.meta")).await),
        code(fs.op(MetaOp::Lookup { parent: b.id, name: "x/y".into() }).await)
    );
    assert_eq!(code(fs.op(walk(&["b", "d", "f"], "")).await), code(fs.op(MetaOp::GetXattr { inode: f.id, name: "".into() }).await));
    assert_eq!(code(fs.op(walk(&[], "user.s3.meta")).await), ErrorCode::InvalidArgument);
    let deep = vec!["d"; MAX_WALK_NAMES + 1];
    assert_eq!(code(fs.op(walk(&deep, "user.s3.meta")).await), ErrorCode::InvalidArgument);
    // Permissions: x on every directory walked, r on the last inode.
    let bob = fs.as_user(1001, 1001);
    let mode = |inode: InodeId, mode| MetaOp::SetAttr { inode, attr: SetAttr { mode: Some(mode), ..SetAttr::default() } };
    assert!(matches!(bob.op(walk(&["b", "d", "f"], "user.s3.meta")).await.unwrap(), MetaReply::Walk { value: Some(_), .. }));
    fs.op(mode(f.id, 0o600)).await.unwrap();
    assert_eq!(code(bob.op(walk(&["b", "d", "f"], "user.s3.meta")).await), ErrorCode::PermissionDenied);
    fs.op(mode(f.id, 0o644)).await.unwrap();
    fs.op(mode(d.id, 0o700)).await.unwrap();
    assert_eq!(code(bob.op(walk(&["b", "d", "f"], "user.s3.meta")).await), ErrorCode::PermissionDenied);
    // Without x on `d` the walk fails even where the next name is absent.
    assert_eq!(code(bob.op(walk(&["b", "d", "missing"], "user.s3.meta")).await), ErrorCode::PermissionDenied);
}

#[tokio::test]
async fn xattrs() {
    let fs = Fs::new().await;
    let f = fs.create(ROOT, "f").await.unwrap();
    let set = |name: &str, v: &[u8], flag| MetaOp::SetXattr { inode: f.id, name: name.into(), value: v.to_vec(), flag };
    fs.op(set("user.a", b"1", XattrFlag::Create)).await.unwrap();
    assert_eq!(code(fs.op(set("user.a", b"2", XattrFlag::Create)).await), ErrorCode::AlreadyExists);
    assert_eq!(code(fs.op(set("user.b", b"2", XattrFlag::Replace)).await), ErrorCode::NotFound);
    fs.op(set("user.a", b"3", XattrFlag::Replace)).await.unwrap();
    fs.op(set("user.b", &[7u8; 1000], XattrFlag::Any)).await.unwrap();
    assert_eq!(fs.op(MetaOp::GetXattr { inode: f.id, name: "user.a".into() }).await.unwrap(), MetaReply::Xattr(b"3".to_vec()));
    assert_eq!(fs.op(MetaOp::ListXattr { inode: f.id }).await.unwrap(), MetaReply::XattrNames(vec!["user.a".into(), "user.b".into()]));
    assert_eq!(code(fs.op(set("user.big", &vec![0u8; MAX_XATTR_VALUE_BYTES + 1], XattrFlag::Any)).await), ErrorCode::ResourceExhausted);
    fs.op(MetaOp::RemoveXattr { inode: f.id, name: "user.a".into() }).await.unwrap();
    assert_eq!(code(fs.op(MetaOp::RemoveXattr { inode: f.id, name: "user.a".into() }).await), ErrorCode::NotFound);
    assert_eq!(code(fs.op(MetaOp::GetXattr { inode: f.id, name: "user.a".into() }).await), ErrorCode::NotFound);
    // Others without write permission cannot set.
    let bob = fs.as_user(1001, 1001);
    assert_eq!(code(bob.op(set("user.c", b"x", XattrFlag::Any)).await), ErrorCode::PermissionDenied);
}

#[tokio::test]
async fn readdir_pagination_and_attrs() {
    let fs = Fs::new().await;
    let d = fs.mkdir(ROOT, "d").await.unwrap();
    let mut names: Vec<String> = (0..25).map(|i| format!("n{i:02}")).collect();
    for n in &names {
        fs.create(d.id, n).await.unwrap();
    }
    names.sort();
    let all = fs.readdir_all(d.id).await.unwrap();
    assert_eq!(all.iter().map(|e| e.name.clone()).collect::<Vec<_>>(), names);
    match fs.op(MetaOp::Readdir { dir: d.id, start_after: "n10".into(), limit: 5, with_attrs: true }).await.unwrap() {
        MetaReply::Entries { entries, more } => {
            assert!(more);
            assert_eq!(entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["n11", "n12", "n13", "n14", "n15"]);
            assert!(entries.iter().all(|e| e.attr.as_ref().is_some_and(|a| a.id == e.inode)));
        }
        other => panic!("{other:?}"),
    }
    match fs.op(MetaOp::Readdir { dir: d.id, start_after: "n24".into(), limit: 5, with_attrs: false }).await.unwrap() {
        MetaReply::Entries { entries, more } => assert!(entries.is_empty() && !more),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn cas_replace_and_create_write_publish() {
    let fs = Fs::new().await;
    let v1 = fs
        .inode(MetaOp::CreateWritePublish {
            parent: ROOT,
            name: "obj".into(),
            mode: 0o644,
            data: b"one".to_vec(),
            expected: Some(Expected::Absent),
            attrs: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(v1.size_bytes(), 3);
    assert_eq!(
        code(
            fs.op(MetaOp::CreateWritePublish {
                parent: ROOT,
                name: "obj".into(),
                mode: 0o644,
                data: b"x".to_vec(),
                expected: Some(Expected::Absent),
                attrs: Default::default()
            })
            .await
        ),
        ErrorCode::PreconditionFailed
    );
    // Temp inode, written, then published with the right expectation.
    let tmp = fs.inode(MetaOp::CreateUnlinked { parent: ROOT, mode: 0o644 }).await.unwrap();
    assert_eq!(tmp.nlink, 0);
    fs.inode(MetaOp::WriteInline { inode: tmp.id, offset: 0, data: b"two!".to_vec() }).await.unwrap();
    let wrong = Expected::Inode { id: v1.id, version: v1.version + 5 };
    assert_eq!(
        code(
            fs.op(MetaOp::Replace { parent: ROOT, name: "obj".into(), inode: tmp.id, expected: Some(wrong), attrs: Default::default() })
                .await
        ),
        ErrorCode::PreconditionFailed
    );
    let right = Expected::Inode { id: v1.id, version: v1.version };
    let v2 = fs
        .inode(MetaOp::Replace {
            parent: ROOT,
            name: "obj".into(),
            inode: tmp.id,
            expected: Some(right.clone()),
            attrs: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(v2.nlink, 1);
    assert_eq!(fs.lookup(ROOT, "obj").await.unwrap().id, tmp.id);
    assert_eq!(fs.op(MetaOp::ReadInline { inode: tmp.id, offset: 0, len: 100 }).await.unwrap(), MetaReply::Data(b"two!".to_vec()));
    // The old inline inode is gone at once; a second replace with the stale expectation fails.
    assert_eq!(code(fs.stat(v1.id).await), ErrorCode::NotFound);
    let tmp2 = fs.inode(MetaOp::CreateUnlinked { parent: ROOT, mode: 0o644 }).await.unwrap();
    assert_eq!(
        code(
            fs.op(MetaOp::Replace { parent: ROOT, name: "obj".into(), inode: tmp2.id, expected: Some(right), attrs: Default::default() })
                .await
        ),
        ErrorCode::PreconditionFailed
    );
    // Inline size limit.
    assert_eq!(
        code(
            fs.op(MetaOp::CreateWritePublish {
                parent: ROOT,
                name: "big".into(),
                mode: 0o644,
                data: vec![0; 5000],
                expected: None,
                attrs: Default::default()
            })
            .await
        ),
        ErrorCode::ResourceExhausted
    );
    fs.fsck_clean().await;
}

#[tokio::test]
async fn publish_sets_length_mtime_and_xattrs_in_the_same_transaction() {
    let fs = Fs::new().await;
    let attrs = PublishAttrs {
        length: Some(123_456),
        mtime_ns: Some(1_700_000_000_000_000_000),
        xattrs: vec![("user.s3.meta".into(), b"etag".to_vec()), ("user.s3.tags".into(), b"k=v".to_vec())],
    };
    let tmp = fs.inode(MetaOp::CreateUnlinked { parent: ROOT, mode: 0o644 }).await.unwrap();
    let published = fs
        .inode(MetaOp::Replace { parent: ROOT, name: "obj".into(), inode: tmp.id, expected: Some(Expected::Absent), attrs: attrs.clone() })
        .await
        .unwrap();
    assert_eq!(published.size_bytes(), 123_456);
    assert_eq!(published.mtime_ns, 1_700_000_000_000_000_000);
    assert_eq!(fs.op(MetaOp::GetXattr { inode: tmp.id, name: "user.s3.meta".into() }).await.unwrap(), MetaReply::Xattr(b"etag".to_vec()));
    // Inline publish: xattrs and mtime too; the length is the data's.
    let inline = fs
        .inode(MetaOp::CreateWritePublish {
            parent: ROOT,
            name: "small".into(),
            mode: 0o644,
            data: b"abc".to_vec(),
            expected: None,
            attrs: attrs.clone(),
        })
        .await
        .unwrap();
    assert_eq!((inline.size_bytes(), inline.mtime_ns), (3, 1_700_000_000_000_000_000));
    assert_eq!(fs.op(MetaOp::GetXattr { inode: inline.id, name: "user.s3.tags".into() }).await.unwrap(), MetaReply::Xattr(b"k=v".to_vec()));
    // Bad attributes fail the whole publish: nothing becomes visible.
    let bad = PublishAttrs { xattrs: vec![("".into(), Vec::new())], ..Default::default() };
    let tmp2 = fs.inode(MetaOp::CreateUnlinked { parent: ROOT, mode: 0o644 }).await.unwrap();
    assert!(fs.op(MetaOp::Replace { parent: ROOT, name: "other".into(), inode: tmp2.id, expected: None, attrs: bad }).await.is_err());
    assert_eq!(code(fs.lookup(ROOT, "other").await), ErrorCode::NotFound);
    let many =
        PublishAttrs { xattrs: (0..=MAX_PUBLISH_XATTRS).map(|i| (format!("user.x{i}"), Vec::new())).collect(), ..Default::default() };
    assert_eq!(
        code(
            fs.op(MetaOp::CreateWritePublish {
                parent: ROOT,
                name: "many".into(),
                mode: 0o644,
                data: Vec::new(),
                expected: None,
                attrs: many
            })
            .await
        ),
        ErrorCode::ResourceExhausted
    );
}

#[tokio::test]
async fn recursive_remove_reclaims_chunks() {
    let fs = Fs::new().await;
    let top = fs.mkdir(ROOT, "top").await.unwrap();
    let mut files = Vec::new();
    let mut parent = top.id;
    for depth in 0..4 {
        let sub = fs.mkdir(parent, &format!("sub{depth}")).await.unwrap();
        for i in 0..5 {
            let f = fs.create(sub.id, &format!("f{i}")).await.unwrap();
            let layout = f.file().unwrap().layout.clone();
            fs.storage.write_file(f.id, &layout, 3 * 512 * 1024 + 10);
            files.push(f.id);
        }
        parent = sub.id;
    }
    // A hard link from outside keeps one file alive.
    fs.inode(MetaOp::Link { inode: files[0], parent: ROOT, name: "keep".into() }).await.unwrap();
    assert_eq!(fs.storage.total_chunks(), 20 * 4);
    fs.op(MetaOp::RemoveTree { parent: ROOT, name: "top".into() }).await.unwrap();
    assert_eq!(code(fs.lookup(ROOT, "top").await), ErrorCode::NotFound);
    // Creating inside the detached tree fails.
    assert_eq!(code(fs.create(top.id, "late").await), ErrorCode::NotFound);
    let stats = fs.svc.run_gc_until_idle().await.unwrap();
    assert_eq!(stats.dirs_removed, 5);
    assert_eq!(stats.files_removed, 19);
    assert_eq!(fs.storage.total_chunks(), 4, "only the hard-linked file keeps its chunks");
    assert_eq!(fs.stat(files[0]).await.unwrap().nlink, 1);
    for f in &files[1..] {
        assert_eq!(code(fs.stat(*f).await), ErrorCode::NotFound);
    }
    fs.fsck_clean().await;
    match fs.op(MetaOp::StatFs).await.unwrap() {
        MetaReply::StatFs(s) => assert_eq!(s.inodes, 2, "root + the kept file"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn idempotent_retry_returns_the_first_result() {
    let fs = Fs::new().await;
    let create = fs.req(MetaOp::Create { parent: ROOT, name: "once".into(), mode: 0o644, exclusive: true, write: false });
    let first = fs.svc.execute(create.clone()).await.unwrap();
    let retry = fs.svc.execute(create.clone()).await.unwrap();
    assert_eq!(first, retry, "a retried exclusive create returns the original inode, not EEXIST");
    // A new request id is a new create.
    assert_eq!(code(fs.create(ROOT, "once").await), ErrorCode::AlreadyExists);
    let unlink = fs.req(MetaOp::Unlink { parent: ROOT, name: "once".into() });
    fs.svc.execute(unlink.clone()).await.unwrap();
    assert_eq!(fs.svc.execute(unlink).await.unwrap(), MetaReply::Done, "retried unlink does not say ENOENT");
    fs.create(ROOT, "a").await.unwrap();
    let rename = fs.req(MetaOp::Rename { src_parent: ROOT, src_name: "a".into(), dst_parent: ROOT, dst_name: "b".into() });
    fs.svc.execute(rename.clone()).await.unwrap();
    fs.svc.execute(rename.clone()).await.unwrap();
    // The same request id for a different op is refused, not answered with the rename's reply.
    let mut reused = fs.req(MetaOp::Mkdir { parent: ROOT, name: "x".into(), mode: 0o755, xattrs: vec![] });
    reused.request_id = rename.request_id;
    assert_eq!(code(fs.svc.execute(reused).await), ErrorCode::InvalidArgument);
    fs.fsck_clean().await;
}

#[tokio::test]
async fn lengths_sessions_truncate_versions() {
    let fs = Fs::new().await;
    let (f, session) =
        match fs.op(MetaOp::Create { parent: ROOT, name: "f".into(), mode: 0o644, exclusive: true, write: true }).await.unwrap() {
            MetaReply::Opened { inode, session } => (inode, session),
            other => panic!("{other:?}"),
        };
    let layout = f.file().unwrap().layout.clone();
    let chunk = u64::from(layout.chunk_size_bytes);
    // Periodic reports raise the length and the dynamic stripe.
    let r = fs.inode(MetaOp::ReportLength { inode: f.id, length: 40 * chunk, truncate_version: 0 }).await.unwrap();
    assert_eq!(r.size_bytes(), 40 * chunk);
    // Truncate wins over a stale report.
    let t = fs.inode(MetaOp::Truncate { inode: f.id, length: 100, session: 0 }).await.unwrap();
    assert_eq!(t.file().unwrap().truncate_version, 1);
    let stale = fs.inode(MetaOp::ReportLength { inode: f.id, length: 50 * chunk, truncate_version: 0 }).await.unwrap();
    assert_eq!(stale.size_bytes(), 100);
    // Close asks storage for the exact length (beyond the first 16 chains).
    fs.storage.write_file(f.id, &layout, 20 * chunk + 7);
    let closed = fs
        .inode(MetaOp::Close { inode: f.id, session, length_hint: None, truncate_version: 0, wrote: true, writes_settled: false })
        .await
        .unwrap();
    assert_eq!(closed.size_bytes(), 20 * chunk + 7);
    // Unlink with the file closed: GC removes its chunks.
    fs.op(MetaOp::Unlink { parent: ROOT, name: "f".into() }).await.unwrap();
    fs.svc.run_gc_until_idle().await.unwrap();
    assert_eq!(fs.storage.chunk_count(f.id), 0);
    assert_eq!(code(fs.stat(f.id).await), ErrorCode::NotFound);
}

#[tokio::test]
async fn open_session_defers_gc_of_unlinked_file() {
    let fs = Fs::new().await;
    let (f, session) =
        match fs.op(MetaOp::Create { parent: ROOT, name: "f".into(), mode: 0o644, exclusive: true, write: true }).await.unwrap() {
            MetaReply::Opened { inode, session } => (inode, session),
            other => panic!("{other:?}"),
        };
    fs.storage.write_file(f.id, &f.file().unwrap().layout, 10);
    fs.op(MetaOp::Unlink { parent: ROOT, name: "f".into() }).await.unwrap();
    let s = fs.svc.run_gc_once().await.unwrap();
    assert_eq!(s.deferred, 1);
    assert_eq!(fs.storage.chunk_count(f.id), 1);
    fs.op(MetaOp::Close { inode: f.id, session, length_hint: None, truncate_version: 0, wrote: true, writes_settled: false })
        .await
        .unwrap();
    fs.svc.run_gc_until_idle().await.unwrap();
    assert_eq!(fs.storage.chunk_count(f.id), 0);
    fs.fsck_clean().await;
}

#[tokio::test]
async fn layouts_are_shuffled_round_robin_stripes() {
    let fs = Fs::new().await;
    let a = fs.create(ROOT, "a").await.unwrap();
    let b = fs.create(ROOT, "b").await.unwrap();
    let la = &a.file().unwrap().layout;
    let lb = &b.file().unwrap().layout;
    assert_eq!(la.stripe_size(), 16);
    // Consecutive chains, and the next file starts one chain later.
    let start = la.chains[0].0;
    assert!(la.chains.iter().enumerate().all(|(i, c)| c.0 == (start - 1 + i as u32) % 64 + 1));
    assert_eq!(lb.chains[0].0, start % 64 + 1);
    assert_ne!(la.seed, lb.seed);
    // Chunk 0 is the first shuffled chain.
    assert_eq!(chain_for_chunk(la, 0), la.shuffled_chains().first().copied());
}

#[tokio::test]
async fn exact_length_on_close_widens_the_dynamic_stripe() {
    let mut cfg = common::test_config();
    cfg.root_layout.stripe_size = 64;
    cfg.root_layout.chunk_size_bytes = 4096;
    let fs = Fs::with(std::sync::Arc::new(fskv_kv::MemoryEngine::new()), cfg).await;
    let (f, session) =
        match fs.op(MetaOp::Create { parent: ROOT, name: "big".into(), mode: 0o644, exclusive: true, write: true }).await.unwrap() {
            MetaReply::Opened { inode, session } => (inode, session),
            other => panic!("{other:?}"),
        };
    let data = f.file().unwrap();
    assert_eq!((data.layout.stripe_size(), data.dyn_stripe), (64, 16));
    // 40 chunks written, no length report: chains 17..40 (shuffled order) are beyond the hint.
    fs.storage.write_file(f.id, &data.layout, 40 * 4096 - 100);
    let closed = fs
        .inode(MetaOp::Close { inode: f.id, session, length_hint: None, truncate_version: 0, wrote: true, writes_settled: false })
        .await
        .unwrap();
    assert_eq!(closed.size_bytes(), 40 * 4096 - 100);
    assert_eq!(closed.file().unwrap().dyn_stripe, 64);
}

/// A close that wrote nothing, or whose writes all settled, asks storage
/// for the length only while another write session is open on the inode
/// (that writer's data counts) or a truncate came since the handle's
/// truncate version; otherwise storage is not asked, so bytes that appear
/// on storage without a session are not picked up.
#[tokio::test]
async fn a_close_with_known_writes_measures_the_length_only_while_another_writer_is_open() {
    let mut cfg = common::test_config();
    cfg.root_layout.chunk_size_bytes = 4096;
    let fs = Fs::with(std::sync::Arc::new(fskv_kv::MemoryEngine::new()), cfg).await;
    let (f, s1) =
        opened(fs.op(MetaOp::Create { parent: ROOT, name: "f".into(), mode: 0o644, exclusive: true, write: true }).await.unwrap());
    let layout = f.file().unwrap().layout.clone();
    let (_, s2) = opened(fs.op(MetaOp::Open { inode: f.id, write: true }).await.unwrap());
    // The second writer's data, not reported yet.
    fs.storage.write_file(f.id, &layout, 10_000);
    let close =
        |session, wrote| MetaOp::Close { inode: f.id, session, length_hint: None, truncate_version: 0, wrote, writes_settled: false };
    let closed = fs.inode(close(s1, false)).await.unwrap();
    assert_eq!(closed.size_bytes(), 10_000, "another writer is open: its data is measured");
    assert_eq!(fs.inode(close(s2, true)).await.unwrap().size_bytes(), 10_000);
    // No other writer: a close without writes keeps the stored length.
    let (_, s3) = opened(fs.op(MetaOp::Open { inode: f.id, write: true }).await.unwrap());
    fs.storage.write_file(f.id, &layout, 20_000);
    assert_eq!(fs.inode(close(s3, false)).await.unwrap().size_bytes(), 10_000);
    // A close that wrote measures it.
    let (_, s4) = opened(fs.op(MetaOp::Open { inode: f.id, write: true }).await.unwrap());
    assert_eq!(fs.inode(close(s4, true)).await.unwrap().size_bytes(), 20_000);
    // Writes that all succeeded: their end is the hint, storage is not asked.
    let settled = |session, hint, truncate_version| MetaOp::Close {
        inode: f.id,
        session,
        length_hint: Some(hint),
        truncate_version,
        wrote: true,
        writes_settled: true,
    };
    let (_, s5) = opened(fs.op(MetaOp::Open { inode: f.id, write: true }).await.unwrap());
    fs.storage.write_file(f.id, &layout, 30_000);
    assert_eq!(fs.inode(settled(s5, 25_000, 0)).await.unwrap().size_bytes(), 25_000);
    // A truncate by someone else since the handle's truncate version: measured.
    let (_, s6) = opened(fs.op(MetaOp::Open { inode: f.id, write: true }).await.unwrap());
    let truncated = fs.inode(MetaOp::Truncate { inode: f.id, length: 5_000, session: 0 }).await.unwrap();
    assert_eq!(truncated.file().unwrap().truncate_version, 1);
    fs.storage.write_file(f.id, &layout, 12_000);
    assert_eq!(fs.inode(settled(s6, 25_000, 0)).await.unwrap().size_bytes(), 12_000);
}

#[tokio::test]
async fn idempotency_records_expire_through_the_time_index() {
    let cfg = fskv_meta::MetaConfig { idempotency_ttl_ms: 0, ..common::test_config() };
    let fs = Fs::with(std::sync::Arc::new(fskv_kv::MemoryEngine::new()), cfg).await;
    for i in 0..10 {
        fs.create(ROOT, &format!("f{i}")).await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let stats = fs.svc.run_gc_once().await.unwrap();
    assert_eq!(stats.idempotency_expired, 10);
    let mut txn = fs.svc.engine().begin().await.unwrap();
    for prefix in [&b"IDEM"[..], &b"IDEX"[..]] {
        let left = txn.snapshot_get_range(&fskv_kv::RangeRequest::prefix(prefix)).await.unwrap();
        assert!(left.kvs.is_empty(), "{} records left", left.kvs.len());
    }
}

#[tokio::test]
async fn unpublished_temp_inodes_are_reclaimed_after_their_ttl() {
    let cfg = fskv_meta::MetaConfig { temp_inode_ttl_ms: 0, ..common::test_config() };
    let fs = Fs::with(std::sync::Arc::new(fskv_kv::MemoryEngine::new()), cfg).await;
    let tmp = fs.inode(MetaOp::CreateUnlinked { parent: ROOT, mode: 0o644 }).await.unwrap();
    // Written through the data path (chunks), then abandoned.
    fs.storage.write_file(tmp.id, &tmp.file().unwrap().layout, 100_000);
    let published = fs.inode(MetaOp::CreateUnlinked { parent: ROOT, mode: 0o644 }).await.unwrap();
    fs.inode(MetaOp::Replace { parent: ROOT, name: "kept".into(), inode: published.id, expected: None, attrs: Default::default() })
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    fs.svc.run_gc_until_idle().await.unwrap();
    assert_eq!(code(fs.stat(tmp.id).await), ErrorCode::NotFound);
    assert_eq!(fs.storage.chunk_count(tmp.id), 0);
    assert_eq!(fs.lookup(ROOT, "kept").await.unwrap().id, published.id);
    fs.fsck_clean().await;
}

fn opened(reply: MetaReply) -> (Inode, u64) {
    match reply {
        MetaReply::Opened { inode, session } => (inode, session),
        other => panic!("expected an open session, got {other:?}"),
    }
}

/// Every namespace change moves the parent directory's mtime and ctime (the
/// directory's `DTIM` key, folded into its attributes on every read), and an
/// explicit mtime on the directory wins over earlier changes.
#[tokio::test]
async fn namespace_changes_move_the_parent_directory_times() {
    let fs = Fs::new().await;
    let d = fs.mkdir(ROOT, "d").await.unwrap();
    let e = fs.mkdir(ROOT, "e").await.unwrap();
    let mut last = fs.stat(d.id).await.unwrap();
    let ops: Vec<(&str, MetaOp)> = vec![
        ("create", MetaOp::Create { parent: d.id, name: "f".into(), mode: 0o644, exclusive: true, write: false }),
        ("mkdir", MetaOp::Mkdir { parent: d.id, name: "sub".into(), mode: 0o755, xattrs: vec![] }),
        ("symlink", MetaOp::Symlink { parent: d.id, name: "s".into(), target: "f".into() }),
        ("rename within", MetaOp::Rename { src_parent: d.id, src_name: "s".into(), dst_parent: d.id, dst_name: "s2".into() }),
        ("rename out", MetaOp::Rename { src_parent: d.id, src_name: "s2".into(), dst_parent: e.id, dst_name: "s2".into() }),
        ("unlink", MetaOp::Unlink { parent: d.id, name: "f".into() }),
        ("rmdir", MetaOp::Rmdir { parent: d.id, name: "sub".into() }),
    ];
    for (what, op) in ops {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        fs.op(op).await.unwrap_or_else(|err| panic!("{what}: {err}"));
        let now = fs.stat(d.id).await.unwrap();
        assert!(now.mtime_ns > last.mtime_ns, "{what} must move the parent's mtime");
        assert!(now.ctime_ns > last.ctime_ns, "{what} must move the parent's ctime");
        assert_eq!(fs.lookup(ROOT, "d").await.unwrap().mtime_ns, now.mtime_ns, "lookup sees the same times");
        last = now;
    }
    let e_after = fs.stat(e.id).await.unwrap();
    assert!(e_after.mtime_ns > e.mtime_ns, "the destination of a rename moves too");
    // readdir with attributes reports the folded times as well.
    let listed = match fs.op(MetaOp::Readdir { dir: ROOT, start_after: String::new(), limit: 10, with_attrs: true }).await.unwrap() {
        MetaReply::Entries { entries, .. } => entries,
        other => panic!("{other:?}"),
    };
    let d_attr = listed.iter().find(|x| x.name == "d").and_then(|x| x.attr.clone()).unwrap();
    assert_eq!(d_attr.mtime_ns, last.mtime_ns);
    // utimes on the directory: the explicit mtime wins.
    fs.op(MetaOp::SetAttr { inode: d.id, attr: SetAttr { mtime_ns: Some(1_000), ..Default::default() } }).await.unwrap();
    assert_eq!(fs.stat(d.id).await.unwrap().mtime_ns, 1_000);
    // Hard link into d moves it again.
    let g = fs.create(ROOT, "g").await.unwrap();
    fs.op(MetaOp::Link { inode: g.id, parent: d.id, name: "g".into() }).await.unwrap();
    assert!(fs.stat(d.id).await.unwrap().mtime_ns > 1_000);
    fs.fsck_clean().await;
}

/// Creates in one directory read the directory's inode but only blindly
/// max its time key: two transactions creating there both commit.
#[tokio::test]
async fn concurrent_creates_in_one_directory_do_not_conflict() {
    use fskv_meta::ops::{self, OpCtx, Prepared};
    let fs = Fs::new().await;
    let d = fs.mkdir(ROOT, "d").await.unwrap();
    let engine = fs.svc.engine().clone();
    let cfg = fs.svc.config().clone();
    let user = UserInfo::root();
    let preps: Vec<Prepared> = (0..2u64)
        .map(|i| Prepared { now_ns: 10_000_000_000_000_000_000 + i, new_id: Some(InodeId(1 << 40 | i)), ..Prepared::default() })
        .collect();
    let mut t1 = engine.begin().await.unwrap();
    let mut t2 = engine.begin().await.unwrap();
    for (txn, (prep, name)) in [(&mut t1, (&preps[0], "a")), (&mut t2, (&preps[1], "b"))] {
        let ctx = OpCtx { cfg: &cfg, user: &user, client_id: 1, prep, owner: None };
        let op = MetaOp::Create { parent: d.id, name: name.into(), mode: 0o644, exclusive: true, write: false };
        ops::apply(&mut **txn, &ctx, &op).await.unwrap();
    }
    t2.commit().await.unwrap();
    t1.commit().await.expect("a create must not conflict with another create in the same directory");
    let after = fs.stat(d.id).await.unwrap();
    assert_eq!(after.mtime_ns, 10_000_000_000_000_000_001, "the later time wins whatever the commit order");
}

/// Close moves mtime/ctime only when the handle wrote or the length changed;
/// a stale handle's length hint (older truncate version) is ignored.
#[tokio::test]
async fn close_without_writes_keeps_times_and_stale_hints_are_ignored() {
    let fs = Fs::new().await;
    let (f, session) =
        opened(fs.op(MetaOp::Create { parent: ROOT, name: "f".into(), mode: 0o644, exclusive: true, write: true }).await.unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let closed = fs
        .inode(MetaOp::Close { inode: f.id, session, length_hint: None, truncate_version: 0, wrote: false, writes_settled: false })
        .await
        .unwrap();
    assert_eq!((closed.ctime_ns, closed.mtime_ns), (f.ctime_ns, f.mtime_ns), "a close with no writes changes no time");

    fs.storage.write_file(f.id, &f.file().unwrap().layout, 100);
    let (_, s2) = opened(fs.op(MetaOp::Open { inode: f.id, write: true }).await.unwrap());
    let (_, s3) = opened(fs.op(MetaOp::Open { inode: f.id, write: true }).await.unwrap());
    let t = fs.inode(MetaOp::Truncate { inode: f.id, length: 5, session: s3 }).await.unwrap();
    assert_eq!(t.file().unwrap().truncate_version, 1);
    // s2 last saw truncate version 0: its hint of 1000 predates the truncate.
    let c2 = fs
        .inode(MetaOp::Close { inode: f.id, session: s2, length_hint: Some(1000), truncate_version: 0, wrote: true, writes_settled: false })
        .await
        .unwrap();
    assert_eq!(c2.size_bytes(), 5);
    let c3 = fs
        .inode(MetaOp::Close { inode: f.id, session: s3, length_hint: Some(9), truncate_version: 1, wrote: true, writes_settled: false })
        .await
        .unwrap();
    assert!(c3.mtime_ns > closed.mtime_ns);
}

/// ftruncate through a descriptor opened for writing needs no write
/// permission on the mode (POSIX: the open checked it); a session of another
/// client or a closed one does not count.
#[tokio::test]
async fn truncate_through_an_open_write_session_skips_the_mode_check() {
    let fs = Fs::new().await;
    let home = fs.mkdir(ROOT, "home").await.unwrap();
    fs.op(MetaOp::SetAttr { inode: home.id, attr: SetAttr { uid: Some(1000), gid: Some(1000), ..Default::default() } }).await.unwrap();
    let alice = fs.as_user(1000, 1000);
    let (f, session) =
        opened(alice.op(MetaOp::Create { parent: home.id, name: "f".into(), mode: 0, exclusive: true, write: true }).await.unwrap());
    assert_eq!(code(alice.op(MetaOp::Truncate { inode: f.id, length: 3, session: 0 }).await), ErrorCode::PermissionDenied);
    let t = alice.inode(MetaOp::Truncate { inode: f.id, length: 3, session }).await.unwrap();
    assert_eq!(t.size_bytes(), 3);
    let bob = fs.as_user(1001, 1001);
    assert_eq!(code(bob.op(MetaOp::Truncate { inode: f.id, length: 1, session }).await), ErrorCode::PermissionDenied);
    alice
        .op(MetaOp::Close { inode: f.id, session, length_hint: None, truncate_version: 1, wrote: false, writes_settled: false })
        .await
        .unwrap();
    assert_eq!(code(alice.op(MetaOp::Truncate { inode: f.id, length: 1, session }).await), ErrorCode::PermissionDenied);
}

/// A truncate cuts storage before its length commits, so a close measuring
/// the exact length afterwards never brings the cut bytes back.
#[tokio::test]
async fn truncate_cuts_storage_before_the_length_commits() {
    let fs = Fs::new().await;
    let (f, session) =
        opened(fs.op(MetaOp::Create { parent: ROOT, name: "f".into(), mode: 0o644, exclusive: true, write: true }).await.unwrap());
    let layout = f.file().unwrap().layout.clone();
    fs.storage.write_file(f.id, &layout, 23_456);
    let (_, s2) = opened(fs.op(MetaOp::Open { inode: f.id, write: true }).await.unwrap());
    fs.op(MetaOp::Truncate { inode: f.id, length: 1, session: s2 }).await.unwrap();
    let closed = fs
        .inode(MetaOp::Close { inode: f.id, session, length_hint: Some(23_456), truncate_version: 0, wrote: true, writes_settled: false })
        .await
        .unwrap();
    assert_eq!(closed.size_bytes(), 1);
}

/// A directory's nlink is 2 + its subdirectories (counted with atomic adds
/// in `DSUB`, never by writing the directory's inode), through mkdir, rmdir,
/// rename across parents, rename over an empty directory and remove-tree.
#[tokio::test]
async fn directory_nlink_counts_subdirectories() {
    let fs = Fs::new().await;
    let nlink = |id: InodeId| {
        let fs = &fs;
        async move { fs.stat(id).await.unwrap().nlink }
    };
    let a = fs.mkdir(ROOT, "a").await.unwrap();
    assert_eq!(a.nlink, 2, "a new directory");
    let b = fs.mkdir(ROOT, "b").await.unwrap();
    fs.mkdir(a.id, "x").await.unwrap();
    fs.mkdir(a.id, "y").await.unwrap();
    fs.create(a.id, "file").await.unwrap();
    assert_eq!(nlink(a.id).await, 4, "files do not count");
    assert_eq!(nlink(ROOT).await, 4);
    fs.op(MetaOp::Rename { src_parent: a.id, src_name: "x".into(), dst_parent: b.id, dst_name: "x".into() }).await.unwrap();
    assert_eq!((nlink(a.id).await, nlink(b.id).await), (3, 3));
    fs.op(MetaOp::Rename { src_parent: a.id, src_name: "y".into(), dst_parent: a.id, dst_name: "y2".into() }).await.unwrap();
    assert_eq!(nlink(a.id).await, 3, "a rename inside one directory changes nothing");
    // y2 replaces the empty b/x: b keeps one subdirectory, a loses one.
    fs.op(MetaOp::Rename { src_parent: a.id, src_name: "y2".into(), dst_parent: b.id, dst_name: "x".into() }).await.unwrap();
    assert_eq!((nlink(a.id).await, nlink(b.id).await), (2, 3));
    fs.op(MetaOp::Rmdir { parent: b.id, name: "x".into() }).await.unwrap();
    assert_eq!(nlink(b.id).await, 2);
    fs.mkdir(b.id, "t").await.unwrap();
    fs.op(MetaOp::RemoveTree { parent: ROOT, name: "b".into() }).await.unwrap();
    assert_eq!(nlink(ROOT).await, 3);
    let listed = match fs.op(MetaOp::Readdir { dir: ROOT, start_after: String::new(), limit: 10, with_attrs: true }).await.unwrap() {
        MetaReply::Entries { entries, .. } => entries,
        other => panic!("{other:?}"),
    };
    assert_eq!(listed.iter().find(|e| e.name == "a").and_then(|e| e.attr.as_ref()).map(|i| i.nlink), Some(2));
    fs.svc.run_gc_until_idle().await.unwrap();
    fs.fsck_clean().await;
}

/// FIFOs, sockets and device nodes are metadata-only inodes; only root makes
/// device nodes, and they cannot be opened as files here.
#[tokio::test]
async fn special_files_are_made_by_mknod() {
    let fs = Fs::new().await;
    let fifo = fs.inode(MetaOp::Mknod { parent: ROOT, name: "p".into(), mode: 0o640, kind: SpecialKind::Fifo, rdev: 7 }).await.unwrap();
    assert_eq!(fifo.kind(), InodeKind::Special(SpecialKind::Fifo));
    assert_eq!((fifo.rdev(), fifo.size_bytes(), fifo.acl.mode), (0, 0, 0o640), "rdev only for devices");
    let dev = fs
        .inode(MetaOp::Mknod { parent: ROOT, name: "d".into(), mode: 0o600, kind: SpecialKind::BlockDevice, rdev: 0x0801 })
        .await
        .unwrap();
    assert_eq!(fs.lookup(ROOT, "d").await.unwrap().rdev(), 0x0801);
    assert_eq!(
        code(fs.op(MetaOp::Mknod { parent: ROOT, name: "p".into(), mode: 0o600, kind: SpecialKind::Socket, rdev: 0 }).await),
        ErrorCode::AlreadyExists
    );
    let home = fs.mkdir(ROOT, "home").await.unwrap();
    fs.op(MetaOp::SetAttr { inode: home.id, attr: SetAttr { uid: Some(1000), gid: Some(1000), ..Default::default() } }).await.unwrap();
    let alice = fs.as_user(1000, 1000);
    assert_eq!(
        code(alice.op(MetaOp::Mknod { parent: home.id, name: "c".into(), mode: 0o600, kind: SpecialKind::CharDevice, rdev: 1 }).await),
        ErrorCode::PermissionDenied
    );
    alice.op(MetaOp::Mknod { parent: home.id, name: "s".into(), mode: 0o600, kind: SpecialKind::Socket, rdev: 0 }).await.unwrap();
    assert_eq!(code(fs.op(MetaOp::Open { inode: dev.id, write: true }).await), ErrorCode::InvalidArgument);
    assert_eq!(code(fs.op(MetaOp::Truncate { inode: fifo.id, length: 0, session: 0 }).await), ErrorCode::InvalidArgument);
    fs.op(MetaOp::Link { inode: fifo.id, parent: home.id, name: "p2".into() }).await.unwrap();
    fs.op(MetaOp::Unlink { parent: ROOT, name: "p".into() }).await.unwrap();
    fs.op(MetaOp::Unlink { parent: home.id, name: "p2".into() }).await.unwrap();
    assert_eq!(code(fs.stat(fifo.id).await), ErrorCode::NotFound, "the last unlink deletes a special file at once");
    fs.fsck_clean().await;
}

/// A retried create-only xattr set or xattr remove (same request id, as a
/// client retries after a lost reply) returns the first result.
#[tokio::test]
async fn retried_xattr_changes_return_the_first_result() {
    let fs = Fs::new().await;
    let f = fs.create(ROOT, "f").await.unwrap();
    let set = fs.req(MetaOp::SetXattr { inode: f.id, name: "user.k".into(), value: b"v".to_vec(), flag: XattrFlag::Create });
    assert_eq!(fs.svc.execute(set.clone()).await.unwrap(), MetaReply::Done);
    assert_eq!(fs.svc.execute(set).await.unwrap(), MetaReply::Done, "not AlreadyExists");
    let remove = fs.req(MetaOp::RemoveXattr { inode: f.id, name: "user.k".into() });
    assert_eq!(fs.svc.execute(remove.clone()).await.unwrap(), MetaReply::Done);
    assert_eq!(fs.svc.execute(remove).await.unwrap(), MetaReply::Done, "not NotFound");
}

#[tokio::test]
async fn unlink_expected_is_compare_and_delete() {
    let fs = Fs::new().await;
    let publish = |data: &[u8]| MetaOp::CreateWritePublish {
        parent: ROOT,
        name: "k".into(),
        mode: 0o644,
        data: data.to_vec(),
        expected: None,
        attrs: Default::default(),
    };
    let v1 = fs.inode(publish(b"one")).await.unwrap();
    let v2 = fs.inode(publish(b"two")).await.unwrap();
    // The old version no longer matches: nothing is removed.
    let stale = Expected::Inode { id: v1.id, version: v1.version };
    assert_eq!(
        code(fs.op(MetaOp::UnlinkExpected { parent: ROOT, name: "k".into(), expected: stale }).await),
        ErrorCode::PreconditionFailed
    );
    assert_eq!(fs.lookup(ROOT, "k").await.unwrap().id, v2.id);
    // "Absent" on an existing name fails; on a missing name it is NotFound (nothing to unlink).
    assert_eq!(
        code(fs.op(MetaOp::UnlinkExpected { parent: ROOT, name: "k".into(), expected: Expected::Absent }).await),
        ErrorCode::PreconditionFailed
    );
    let current = Expected::Inode { id: v2.id, version: v2.version };
    fs.op(MetaOp::UnlinkExpected { parent: ROOT, name: "k".into(), expected: current.clone() }).await.unwrap();
    assert_eq!(code(fs.lookup(ROOT, "k").await), ErrorCode::NotFound);
    assert_eq!(
        code(fs.op(MetaOp::UnlinkExpected { parent: ROOT, name: "k".into(), expected: current }).await),
        ErrorCode::PreconditionFailed
    );
    // Directories are refused like Unlink.
    let d = fs.inode(MetaOp::Mkdir { parent: ROOT, name: "d".into(), mode: 0o755, xattrs: vec![] }).await.unwrap();
    let dir = Expected::Inode { id: d.id, version: d.version };
    assert_eq!(code(fs.op(MetaOp::UnlinkExpected { parent: ROOT, name: "d".into(), expected: dir }).await), ErrorCode::IsDirectory);
}

/// Overwriting an inline file deletes the old inode with every key under its
/// id (xattrs): `delete_inode` clears them one by one (no range clear below
/// `POINT_CLEAR_MAX_KEYS`), and `clear_prefix` clears a range above it.
#[tokio::test]
async fn overwrite_deletes_the_old_inodes_xattrs() {
    use fskv_kv::{KvEngine, MemoryEngine, RangeRequest};
    use fskv_meta::ops::{clear_prefix, POINT_CLEAR_MAX_KEYS};
    use fskv_meta::schema::xattr_prefix;
    use std::sync::Arc;
    let engine = Arc::new(MemoryEngine::new());
    let fs = Fs::with(engine.clone(), common::test_config()).await;
    let publish = |data: &'static [u8], n: usize| MetaOp::CreateWritePublish {
        parent: ROOT,
        name: "k".into(),
        mode: 0o644,
        data: data.to_vec(),
        expected: None,
        attrs: PublishAttrs { xattrs: (0..n).map(|i| (format!("user.x{i}"), b"v".to_vec())).collect(), ..Default::default() },
    };
    let count = |id: InodeId| {
        let engine = engine.clone();
        async move {
            let mut txn = engine.begin().await.unwrap();
            txn.get_range(&RangeRequest::prefix(&xattr_prefix(id))).await.unwrap().kvs.len()
        }
    };
    let v1 = fs.inode(publish(b"one", 3)).await.unwrap();
    assert_eq!(count(v1.id).await, 3);
    let v2 = fs.inode(publish(b"two", 2)).await.unwrap();
    assert_eq!(count(v1.id).await, 0, "the replaced inode's xattrs are gone");
    assert_eq!(count(v2.id).await, 2);
    assert_eq!(
        fs.svc.execute(fs.req(MetaOp::GetXattr { inode: v2.id, name: "user.x1".into() })).await.unwrap(),
        MetaReply::Xattr(b"v".to_vec())
    );
    // Above the point-clear limit: one range clear, same result.
    let many = POINT_CLEAR_MAX_KEYS + 5;
    let mut txn = engine.begin().await.unwrap();
    let id = InodeId(0xdead);
    for i in 0..many {
        let mut k = xattr_prefix(id);
        k.extend_from_slice(format!("user.{i}").as_bytes());
        txn.set(&k, b"v").unwrap();
    }
    txn.commit().await.unwrap();
    assert_eq!(count(id).await, many);
    let mut txn = engine.begin().await.unwrap();
    clear_prefix(&mut *txn, &xattr_prefix(id)).await.unwrap();
    txn.commit().await.unwrap();
    assert_eq!(count(id).await, 0);
    assert_eq!(count(v2.id).await, 2, "a neighbour's keys are untouched");
}

/// Fake storage whose `remove_chunks` stops until the test lets it go: GC
/// is held exactly between its claim of a temp inode and the removal of the
/// inode, the window in which a publish used to succeed for removed data.
struct PausingStorage {
    inner: fskv_meta::FakeStorage,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl fskv_meta::StorageBackend for PausingStorage {
    fn knows_lengths(&self) -> bool {
        true
    }
    async fn last_chunk(
        &self,
        i: InodeId,
        c: fskv_types::ChainId,
    ) -> Result<Option<fskv_meta::storage::LastChunk>, fskv_meta::storage::StorageError> {
        self.inner.last_chunk(i, c).await
    }
    async fn remove_chunks(&self, i: InodeId, l: &FileLayout) -> Result<u64, fskv_meta::storage::StorageError> {
        self.entered.notify_one();
        self.release.notified().await;
        self.inner.remove_chunks(i, l).await
    }
    async fn truncate_chunks(&self, i: InodeId, l: &FileLayout, len: u64) -> Result<(), fskv_meta::storage::StorageError> {
        self.inner.truncate_chunks(i, l, len).await
    }
    async fn capacity_bytes(&self) -> (u64, u64) {
        self.inner.capacity_bytes().await
    }
}

#[tokio::test]
async fn a_leased_temp_inode_survives_gc_and_a_publish_racing_its_reclaim_fails() {
    let ttl_ms = 200;
    let cfg = fskv_meta::MetaConfig { temp_inode_ttl_ms: ttl_ms, ..common::test_config() };
    let storage = std::sync::Arc::new(PausingStorage {
        inner: fskv_meta::FakeStorage::new(),
        entered: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let engine: std::sync::Arc<dyn fskv_kv::KvEngine> = std::sync::Arc::new(fskv_kv::MemoryEngine::new());
    let svc = fskv_meta::MetaService::open(engine, storage.clone(), cfg).await.unwrap();
    let fs = Fs::over(svc);

    // A slow upload: the writer renews its lease more often than the TTL, so
    // GC passes well past the TTL since creation leave it alone.
    let slow = fs.inode(MetaOp::CreateUnlinked { parent: ROOT, mode: 0o644 }).await.unwrap();
    storage.inner.write_file(slow.id, &slow.file().unwrap().layout, 100_000);
    let written = storage.inner.chunk_count(slow.id);
    assert!(written > 0);
    for _ in 0..4 {
        tokio::time::sleep(std::time::Duration::from_millis(ttl_ms / 2)).await;
        assert_eq!(fs.op(MetaOp::RenewTemp { inode: slow.id }).await.unwrap(), MetaReply::Done);
        let stats = fs.svc.run_gc_once().await.unwrap();
        assert_eq!(stats.files_removed, 0, "a renewed temp inode must not be reclaimed");
    }
    fs.inode(MetaOp::Replace { parent: ROOT, name: "slow".into(), inode: slow.id, expected: None, attrs: Default::default() })
        .await
        .expect("publish after a long, leased upload");
    assert_eq!(storage.inner.chunk_count(slow.id), written, "the published data is intact");

    // An abandoned temp inode: GC claims it; a publish arriving while GC is
    // removing its chunks must fail, not report success for removed data.
    let abandoned = fs.inode(MetaOp::CreateUnlinked { parent: ROOT, mode: 0o644 }).await.unwrap();
    storage.inner.write_file(abandoned.id, &abandoned.file().unwrap().layout, 100_000);
    tokio::time::sleep(std::time::Duration::from_millis(ttl_ms + 20)).await;
    let gc = {
        let svc = fs.svc.clone();
        tokio::spawn(async move { svc.run_gc_once().await })
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), storage.entered.notified()).await.expect("GC reaches remove_chunks");
    let publish = fs
        .inode(MetaOp::Replace { parent: ROOT, name: "late".into(), inode: abandoned.id, expected: None, attrs: Default::default() })
        .await;
    assert_eq!(code(publish), ErrorCode::NotFound, "a publish after GC's claim is refused");
    assert_eq!(code(fs.op(MetaOp::RenewTemp { inode: abandoned.id }).await), ErrorCode::NotFound, "so is a renewal");
    storage.release.notify_one();
    let stats = gc.await.unwrap().unwrap();
    assert_eq!(stats.files_removed, 1);
    assert_eq!(code(fs.lookup(ROOT, "late").await), ErrorCode::NotFound, "nothing was published");
    assert_eq!(code(fs.stat(abandoned.id).await), ErrorCode::NotFound);
    assert_eq!(storage.inner.chunk_count(abandoned.id), 0);
    fs.fsck_clean().await;
}

/// `OverwriteInline`: the gateways' CAS files rewritten in place. Same
/// inode, a higher version, bytes replaced whole (shorter too); every
/// refusal changes nothing; after a restart of meta the version jumps past
/// every version issued before it (a relaxed overwrite that power loss
/// took can never be matched again).
#[tokio::test]
async fn an_inline_file_is_overwritten_in_place_under_its_version() {
    let engine: std::sync::Arc<dyn fskv_kv::KvEngine> = std::sync::Arc::new(fskv_kv::MemoryEngine::new());
    let fs = Fs::with(engine.clone(), common::test_config()).await;
    let dir = fs.mkdir(ROOT, "g").await.unwrap();
    let cwp = MetaOp::CreateWritePublish {
        parent: dir.id,
        name: "s".into(),
        mode: 0o644,
        data: b"first version".to_vec(),
        expected: Some(Expected::Absent),
        attrs: PublishAttrs::default(),
    };
    let v1 = fs.inode(cwp).await.unwrap();
    let dir_before = fs.stat(dir.id).await.unwrap();
    let over = |at: &Inode, data: &[u8]| MetaOp::OverwriteInline {
        parent: dir.id,
        name: "s".into(),
        inode: at.id,
        version: at.version,
        data: data.to_vec(),
    };
    let v2 = fs.inode(over(&v1, b"2nd")).await.unwrap();
    assert_eq!(v2.id, v1.id, "same inode");
    assert!(v2.version > v1.version);
    let seen = fs.lookup(dir.id, "s").await.unwrap();
    assert_eq!((seen.version, seen.file().unwrap().inline.as_deref(), seen.size_bytes()), (v2.version, Some(&b"2nd"[..]), 3));
    assert_eq!(fs.stat(dir.id).await.unwrap().version, dir_before.version, "the directory is untouched");

    // Refusals: a stale version, another inode, no such name, too large, a directory.
    assert_eq!(code(fs.op(over(&v1, b"stale")).await), ErrorCode::PreconditionFailed);
    let other = Inode { id: dir.id, ..v2.clone() };
    assert_eq!(code(fs.op(over(&other, b"x")).await), ErrorCode::PreconditionFailed);
    let missing = MetaOp::OverwriteInline { parent: dir.id, name: "nope".into(), inode: v2.id, version: v2.version, data: vec![] };
    assert_eq!(code(fs.op(missing).await), ErrorCode::PreconditionFailed);
    let big = vec![7u8; fs.svc.config().inline_max_bytes + 1];
    assert_eq!(code(fs.op(over(&v2, &big)).await), ErrorCode::ResourceExhausted);
    let sub = fs.mkdir(dir.id, "sub").await.unwrap();
    let at_dir = MetaOp::OverwriteInline { parent: dir.id, name: "sub".into(), inode: sub.id, version: sub.version, data: vec![] };
    assert_eq!(code(fs.op(at_dir).await), ErrorCode::IsDirectory);
    // A file created for the data path (its bytes go to chunks) is not rewritten here.
    let chunked = fs.create(dir.id, "c").await.unwrap();
    assert_eq!(chunked.file().unwrap().inline, None);
    let at_chunked =
        MetaOp::OverwriteInline { parent: dir.id, name: "c".into(), inode: chunked.id, version: chunked.version, data: vec![] };
    assert_eq!(code(fs.op(at_chunked).await), ErrorCode::Unsupported);
    // Permissions: x on the directory, w on the file.
    let stranger = fs.as_user(4242, 4242);
    assert_eq!(code(stranger.op(over(&v2, b"mine")).await), ErrorCode::PermissionDenied);
    assert_eq!(fs.lookup(dir.id, "s").await.unwrap().version, v2.version, "no refusal changed the file");

    // A restart of meta: the next overwrite is above every version issued before.
    drop(stranger);
    drop(fs);
    let fs = Fs::with(engine, common::test_config()).await;
    let v3 = fs.inode(over(&v2, b"after a restart")).await.unwrap();
    assert_eq!(v3.id, v1.id);
    assert!(v3.version >= 2 << 40 && v3.version > v2.version, "v{} after a restart, v{} before", v3.version, v2.version);
    let v4 = fs.inode(over(&v3, b"and on")).await.unwrap();
    assert_eq!(v4.version, v3.version + 1);
    fs.fsck_clean().await;
}
