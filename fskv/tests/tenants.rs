//! Tenants, users and owners across the gateways of `fskv up` (real
//! processes: the cluster, the front and the gateway processes it starts):
//!
//! | what | how it is checked |
//! |---|---|
//! | `fskv admin tenant/user` | create (key and secret printed once), list (no secret), duplicates / unknown tenant / bad names refused with a clear error |
//! | a new user works on every gateway without a restart | its key is accepted by S3, KV and SQS within the poll bound |
//! | S3: another tenant's bucket | GET, PUT, DELETE, HEAD, ListObjects, DeleteBucket → 403 `AccessDenied`; the object is unchanged; ListBuckets shows only one's own buckets; CreateBucket of another's name → 409 `BucketAlreadyExists`, of one's own → 409 `BucketAlreadyOwnedByYou` |
//! | KV: another tenant's namespace | GET/PUT/DELETE of a key, PUT/GET/DELETE of the namespace → 403 `AccessDenied`; the value is unchanged; `GET /v1/ns` lists one's own only |
//! | MQ (SQS): another tenant's queue | GetQueueUrl, SendMessage, ReceiveMessage, DeleteQueue → 403 `AccessDenied`; ListQueues shows one's own only; the queue still holds its message |
//! | files on the filesystem | `/s3` and `/kv` 0711, `/kv/.fskv-kv` 0700; a tenant's bucket directory owned by the tenant's uid/gid, 0700; objects 0600; `/.fskv-admin` root's 0700, `users.json` 0600 |
//! | the mount (`fskv up --mount`, when FUSE is there; else reported skipped) | the bucket's uid/gid/mode and an object's mode through FUSE; `nobody` can read no object, list no bucket, `/s3`, a namespace, `/mq` or `users.json`; the tenant's uid lists its bucket |
//! | revocation | after `fskv admin user revoke`, the key is refused (403 `InvalidAccessKeyId`) within the poll interval (1 s) plus slack |

mod common;

use bytes::Bytes;
use common::{free_base_port, start_up_with, UpGuard};
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_types::InodeId;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a revoked key may keep working in this test: the 1 s poll plus
/// slack for a loaded 2-core machine.
const REVOKE_BOUND: Duration = Duration::from_secs(4);

type Reply = (StatusCode, Bytes);

#[derive(Clone)]
struct Key {
    ak: String,
    sk: String,
}

struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Http {
    fn signed(
        &self,
        key: &Key,
        service: &str,
        method: Method,
        (host, target): (&str, &str),
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Request<Full<Bytes>> {
        common::sigv4::signed_request((&key.ak, &key.sk), service, method, (host, target), headers, body)
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> Reply {
        let what = format!("{} {}", req.method(), req.uri());
        let run = async {
            let resp = self.client.request(req).await.map_err(|e| format!("transport: {e:?}"))?;
            let (head, body) = resp.into_parts();
            let body = body.collect().await.map_err(|e| format!("body: {e:?}"))?.to_bytes();
            Ok::<_, String>((head.status, body))
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, run).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => panic!("{what}: {e}"),
            Err(_) => panic!("{what}: hung for {REQUEST_TIMEOUT:?}"),
        }
    }

    async fn s3(&self, key: &Key, host: &str, method: Method, target: &str, body: &[u8]) -> Reply {
        self.send(self.signed(key, "s3", method, (host, target), &[], Bytes::copy_from_slice(body))).await
    }

    async fn kv(&self, key: &Key, host: &str, method: Method, target: &str, body: &[u8]) -> Reply {
        self.send(self.signed(key, "kv", method, (host, target), &[], Bytes::copy_from_slice(body))).await
    }

    async fn sqs(&self, key: &Key, host: &str, op: &str, body: serde_json::Value) -> (StatusCode, serde_json::Value) {
        let target = format!("AmazonSQS.{op}");
        let headers = [("content-type", "application/x-amz-json-1.0"), ("x-amz-target", target.as_str())];
        let req = self.signed(key, "sqs", Method::POST, (host, "/"), &headers, Bytes::from(body.to_string()));
        let (s, b) = self.send(req).await;
        (s, serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null))
    }
}

fn fskv(args: &[&str]) -> std::process::Output {
    common::fskv_cmd().args(args).env("FSKV_LOG", "warn").output().expect("run fskv")
}

fn fskv_ok(args: &[&str]) -> String {
    let out = fskv(args);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "fskv {args:?} failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

fn fskv_err(args: &[&str]) -> String {
    let out = fskv(args);
    assert!(!out.status.success(), "fskv {args:?} should fail: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn assert_code(r: &Reply, status: StatusCode, code: &str, what: &str) {
    let body = String::from_utf8_lossy(&r.1);
    assert_eq!(r.0, status, "{what}: {body}");
    assert!(body.contains(code), "{what}: want {code} in {body}");
}

#[test]
fn tenants_own_buckets_namespaces_and_queues() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    // The mount part needs FUSE; without it the rest still runs (the
    // owners and modes are then checked through meta only).
    let mnt =
        common::fuse_or_skip("tenants_own_buckets_namespaces_and_queues (files seen through the mount)").then(|| dir.path().join("mnt"));
    let extra: Vec<&str> = match &mnt {
        Some(m) => vec!["--mount", m.to_str().unwrap()],
        None => vec![],
    };
    let up = UpGuard { child: Some(start_up_with(&data, base, &extra)), mount: mnt.clone() };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(scenario(&data, base, mnt.as_deref()));
    up.stop();
}

/// What other local users see of the gateways' files through the mount
/// (`allow_other`): `nobody` gets into no bucket and lists no bucket names;
/// the tenant's local user gets into its own bucket.
fn check_mount(mnt: &Path, acme_uid: u32) {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let aliceb = std::fs::metadata(mnt.join("s3/aliceb")).expect("stat the bucket through the mount");
    assert_eq!((aliceb.uid(), aliceb.gid(), aliceb.mode() & 0o7777), (acme_uid, acme_uid, 0o700), "alice's bucket on the mount");
    let obj = std::fs::metadata(mnt.join("s3/adminb/dir/obj")).expect("stat an object through the mount");
    assert_eq!(obj.mode() & 0o7777, 0o600, "an object on the mount");
    let run_as = |uid: u32, script: String| Command::new("sh").args(["-c", &script]).uid(uid).gid(uid).output().unwrap();
    let nobody = 65534;
    for script in [
        format!("cat {}", mnt.join("s3/adminb/dir/obj").display()),
        format!("cat {}", mnt.join("s3/aliceb/k").display()),
        format!("ls {}", mnt.join("s3/aliceb").display()),
        format!("ls {}", mnt.join("s3").display()),
        format!("ls {}", mnt.join("kv/alicens").display()),
        format!("ls {}", mnt.join("mq").display()),
        format!("cat {}", mnt.join(".fskv-admin/users.json").display()),
    ] {
        let out = run_as(nobody, script.clone());
        assert!(!out.status.success(), "nobody ran `{script}`: {}", String::from_utf8_lossy(&out.stdout));
    }
    let out = run_as(acme_uid, format!("ls {}", mnt.join("s3/aliceb").display()));
    assert!(out.status.success(), "the tenant's local user lists its bucket: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains('k'), "{}", String::from_utf8_lossy(&out.stdout));
}

async fn scenario(data: &Path, base: u16, mnt: Option<&Path>) {
    let e: serde_json::Value = serde_json::from_slice(&std::fs::read(data.join("endpoints.json")).unwrap()).unwrap();
    let port = |off: u16| format!("127.0.0.1:{}", base + off);
    let (s3, kv, sqs, mgmtd) = (port(0), port(1), port(2), port(11));
    let admin = Key { ak: e["access_key"].as_str().unwrap().into(), sk: e["secret_key"].as_str().unwrap().into() };
    let h = Http { client: Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new()) };
    let store = ["--mgmtd", mgmtd.as_str()];
    let with =
        |args: &[&'static str]| -> Vec<String> { args.iter().map(|s| s.to_string()).chain(store.iter().map(|s| s.to_string())).collect() };
    let run_ok = |args: &[&'static str]| fskv_ok(&with(args).iter().map(String::as_str).collect::<Vec<_>>());
    let run_err = |args: &[&'static str]| fskv_err(&with(args).iter().map(String::as_str).collect::<Vec<_>>());

    // ---- The first gateway made the user store from credentials.json: the
    // key of endpoints.json is the admin user of tenant default. Start one.
    let (st, _) = h.s3(&admin, &s3, Method::PUT, "/adminb", b"").await;
    assert_eq!(st, StatusCode::OK, "admin creates a bucket");
    let users = run_ok(&["admin", "user", "list"]);
    assert!(users.contains("admin") && users.contains(&admin.ak), "{users}");
    assert!(!users.contains(&admin.sk), "list shows no secret: {users}");

    // ---- Tenants and users.
    let t: serde_json::Value = serde_json::from_str(&run_ok(&["admin", "tenant", "create", "acme", "--json"])).unwrap();
    let acme_uid = t["uid"].as_u64().unwrap() as u32;
    assert_eq!(acme_uid, 20_000);
    assert!(run_err(&["admin", "tenant", "create", "acme"]).contains("exists"));
    assert!(run_err(&["admin", "tenant", "create", "Bad/Name"]).contains("lowercase"));
    let u: serde_json::Value = serde_json::from_str(&run_ok(&["admin", "user", "create", "alice", "--tenant", "acme", "--json"])).unwrap();
    let alice = Key { ak: u["access_key"].as_str().unwrap().into(), sk: u["secret_key"].as_str().unwrap().into() };
    assert!(run_err(&["admin", "user", "create", "alice", "--tenant", "acme"]).contains("exists"));
    assert!(run_err(&["admin", "user", "create", "bob", "--tenant", "nope"]).contains("does not exist"));
    assert!(run_err(&["admin", "user", "revoke", "nobody"]).contains("no user"));
    let users = run_ok(&["admin", "user", "list"]);
    assert!(users.contains("alice") && users.contains(&alice.ak) && !users.contains(&alice.sk), "{users}");
    let tenants = run_ok(&["admin", "tenant", "list"]);
    assert!(tenants.contains("acme") && tenants.contains("20000") && tenants.contains("default"), "{tenants}");

    // ---- The new key works without a restart, on the reader and the
    // writer processes (started before the user was made: they learn it by
    // polling the user store) within the poll bound.
    let start = Instant::now();
    loop {
        let (st, b) = h.s3(&alice, &s3, Method::PUT, "/aliceb", b"").await;
        if st == StatusCode::OK {
            break;
        }
        assert_code(&(st, b), StatusCode::FORBIDDEN, "InvalidAccessKeyId", "alice before her key is known");
        assert!(start.elapsed() < REVOKE_BOUND, "alice's new key not accepted by the S3 writer after {:?}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("a new user's key was accepted by the running S3 writer after {:?}", start.elapsed());
    let (st, b) = h.s3(&alice, &s3, Method::GET, "/", b"").await;
    let text = String::from_utf8_lossy(&b);
    assert_eq!(st, StatusCode::OK, "{text}");
    assert!(!text.contains("adminb") && text.contains("aliceb"), "alice sees her bucket only: {text}");

    // ---- S3.
    let object = b"the admin's object".to_vec();
    assert_eq!(h.s3(&admin, &s3, Method::PUT, "/adminb/dir/obj", &object).await.0, StatusCode::OK);
    for (m, target, body) in [
        (Method::GET, "/adminb/dir/obj", &b""[..]),
        (Method::HEAD, "/adminb/dir/obj", b""),
        (Method::PUT, "/adminb/dir/obj", b"overwritten"),
        (Method::PUT, "/adminb/new", b"new"),
        (Method::DELETE, "/adminb/dir/obj", b""),
        (Method::GET, "/adminb?list-type=2", b""),
        (Method::HEAD, "/adminb", b""),
        (Method::DELETE, "/adminb", b""),
    ] {
        let r = h.s3(&alice, &s3, m.clone(), target, body).await;
        assert_eq!(r.0, StatusCode::FORBIDDEN, "alice {m} {target}: {}", String::from_utf8_lossy(&r.1));
        if m != Method::HEAD {
            assert!(String::from_utf8_lossy(&r.1).contains("AccessDenied"), "alice {m} {target}: {}", String::from_utf8_lossy(&r.1));
        }
    }
    let (st, b) = h.s3(&admin, &s3, Method::GET, "/adminb/dir/obj", b"").await;
    assert_eq!((st, b.to_vec()), (StatusCode::OK, object.clone()), "the admin's object is unchanged");
    assert_eq!(h.s3(&admin, &s3, Method::GET, "/adminb/new", b"").await.0, StatusCode::NOT_FOUND, "alice's PUT left nothing");
    assert_code(&h.s3(&alice, &s3, Method::PUT, "/adminb", b"").await, StatusCode::CONFLICT, "BucketAlreadyExists", "alice creates adminb");
    assert_code(&h.s3(&admin, &s3, Method::PUT, "/adminb", b"").await, StatusCode::CONFLICT, "BucketAlreadyOwnedByYou", "admin again");
    assert_code(&h.s3(&alice, &s3, Method::PUT, "/aliceb", b"").await, StatusCode::CONFLICT, "BucketAlreadyOwnedByYou", "alice again");
    assert_eq!(h.s3(&alice, &s3, Method::PUT, "/aliceb/k", b"alice's").await.0, StatusCode::OK);
    assert_code(&h.s3(&admin, &s3, Method::GET, "/aliceb/k", b"").await, StatusCode::FORBIDDEN, "AccessDenied", "admin reads alice's");
    let (_, b) = h.s3(&admin, &s3, Method::GET, "/", b"").await;
    let text = String::from_utf8_lossy(&b);
    assert!(text.contains("adminb") && !text.contains("aliceb"), "admin's ListBuckets: {text}");
    let (_, b) = h.s3(&alice, &s3, Method::GET, "/", b"").await;
    let text = String::from_utf8_lossy(&b);
    assert!(!text.contains("adminb") && text.contains("aliceb"), "alice's ListBuckets: {text}");

    // ---- KV.
    assert!(h.kv(&admin, &kv, Method::PUT, "/v1/ns/adminns", b"").await.0.is_success());
    assert!(h.kv(&admin, &kv, Method::PUT, "/v1/kv/adminns/k", b"v1").await.0.is_success());
    for (m, target, body) in [
        (Method::GET, "/v1/kv/adminns/k", &b""[..]),
        (Method::PUT, "/v1/kv/adminns/k", b"v2"),
        (Method::DELETE, "/v1/kv/adminns/k", b""),
        (Method::PUT, "/v1/ns/adminns", b""),
        (Method::GET, "/v1/ns/adminns", b""),
        (Method::DELETE, "/v1/ns/adminns", b""),
    ] {
        assert_code(
            &h.kv(&alice, &kv, m.clone(), target, body).await,
            StatusCode::FORBIDDEN,
            "AccessDenied",
            &format!("alice {m} {target}"),
        );
    }
    let (st, b) = h.kv(&admin, &kv, Method::GET, "/v1/kv/adminns/k", b"").await;
    assert_eq!((st, b.as_ref()), (StatusCode::OK, &b"v1"[..]), "the admin's value is unchanged");
    assert!(h.kv(&alice, &kv, Method::PUT, "/v1/ns/alicens", b"").await.0.is_success());
    let (_, b) = h.kv(&alice, &kv, Method::GET, "/v1/ns", b"").await;
    let text = String::from_utf8_lossy(&b);
    assert!(text.contains("alicens") && !text.contains("adminns"), "alice's namespaces: {text}");
    let (_, b) = h.kv(&admin, &kv, Method::GET, "/v1/ns", b"").await;
    let text = String::from_utf8_lossy(&b);
    assert!(!text.contains("alicens") && text.contains("adminns"), "admin's namespaces: {text}");

    // ---- MQ through SQS.
    let (st, v) = h.sqs(&admin, &sqs, "CreateQueue", serde_json::json!({"QueueName": "adminq"})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let url = v["QueueUrl"].as_str().unwrap().to_string();
    let (st, v) = h.sqs(&admin, &sqs, "SendMessage", serde_json::json!({"QueueUrl": url, "MessageBody": "hello"})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    for (op, body) in [
        ("GetQueueUrl", serde_json::json!({"QueueName": "adminq"})),
        ("SendMessage", serde_json::json!({"QueueUrl": url, "MessageBody": "intruder"})),
        ("ReceiveMessage", serde_json::json!({"QueueUrl": url})),
        ("GetQueueAttributes", serde_json::json!({"QueueUrl": url, "AttributeNames": ["All"]})),
        ("DeleteQueue", serde_json::json!({"QueueUrl": url})),
        ("CreateQueue", serde_json::json!({"QueueName": "adminq"})),
    ] {
        let (st, v) = h.sqs(&alice, &sqs, op, body).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "alice {op}: {v}");
        assert!(v.to_string().contains("AccessDenied"), "alice {op}: {v}");
    }
    let (st, v) = h.sqs(&alice, &sqs, "ListQueues", serde_json::json!({})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(!v.to_string().contains("adminq"), "alice's ListQueues: {v}");
    let (st, v) = h.sqs(&admin, &sqs, "ReceiveMessage", serde_json::json!({"QueueUrl": url, "MaxNumberOfMessages": 10})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let bodies: Vec<&str> = v["Messages"].as_array().map(|a| a.iter().filter_map(|m| m["Body"].as_str()).collect()).unwrap_or_default();
    assert_eq!(bodies, vec!["hello"], "the queue holds the admin's message only");

    // ---- Files on the filesystem.
    let meta = MetaClient::new(MetaClientConfig::new(vec![port(12)])).expect("meta client");
    let s3_root = meta.lookup(InodeId::ROOT, "s3").await.expect("/s3");
    assert_eq!(s3_root.acl.mode & 0o7777, 0o711, "/s3 mode");
    let aliceb = meta.lookup(s3_root.id, "aliceb").await.expect("/s3/aliceb");
    assert_eq!((aliceb.acl.uid, aliceb.acl.gid, aliceb.acl.mode & 0o7777), (acme_uid, acme_uid, 0o700), "alice's bucket");
    let adminb = meta.lookup(s3_root.id, "adminb").await.expect("/s3/adminb");
    assert_eq!((adminb.acl.uid, adminb.acl.mode & 0o7777), (0, 0o700), "the admin's bucket");
    let k = meta.lookup(aliceb.id, "k").await.expect("/s3/aliceb/k");
    assert_eq!(k.acl.mode & 0o7777, 0o600, "an object's mode");
    let objdir = meta.lookup(adminb.id, "dir").await.expect("/s3/adminb/dir");
    assert_eq!(objdir.acl.mode & 0o7777, 0o700, "a key prefix directory's mode");
    let kv_root = meta.lookup(InodeId::ROOT, "kv").await.expect("/kv");
    assert_eq!(kv_root.acl.mode & 0o7777, 0o711, "/kv mode");
    let kv_system = meta.lookup(kv_root.id, ".fskv-kv").await.expect("/kv/.fskv-kv");
    assert_eq!(kv_system.acl.mode & 0o7777, 0o700, "/kv/.fskv-kv mode");
    let adminns = meta.lookup(kv_root.id, "adminns").await.expect("/kv/adminns");
    assert_eq!((adminns.acl.uid, adminns.acl.mode & 0o7777), (0, 0o700), "the admin's namespace");
    let alicens = meta.lookup(kv_root.id, "alicens").await.expect("/kv/alicens");
    assert_eq!((alicens.acl.uid, alicens.acl.mode & 0o7777), (acme_uid, 0o700), "alice's namespace");
    let mq_root = meta.lookup(InodeId::ROOT, "mq").await.expect("/mq");
    assert_eq!(mq_root.acl.mode & 0o7777, 0o700, "/mq mode");
    let admin_dir = meta.lookup(InodeId::ROOT, ".fskv-admin").await.expect("/.fskv-admin");
    assert_eq!((admin_dir.acl.uid, admin_dir.acl.mode & 0o7777), (0, 0o700), "/.fskv-admin");
    let users_file = meta.lookup(admin_dir.id, "users.json").await.expect("users.json");
    assert_eq!((users_file.acl.uid, users_file.acl.mode & 0o7777), (0, 0o600), "users.json");

    if let Some(m) = mnt {
        let m = m.to_path_buf();
        tokio::task::spawn_blocking(move || check_mount(&m, acme_uid)).await.expect("mount checks");
    }

    // ---- Revocation: refused within the bound.
    run_ok(&["admin", "user", "revoke", "alice"]);
    let start = Instant::now();
    loop {
        let r = h.s3(&alice, &s3, Method::GET, "/aliceb/k", b"").await;
        if r.0 == StatusCode::FORBIDDEN {
            assert!(String::from_utf8_lossy(&r.1).contains("InvalidAccessKeyId"), "{}", String::from_utf8_lossy(&r.1));
            break;
        }
        assert_eq!(r.0, StatusCode::OK);
        assert!(start.elapsed() < REVOKE_BOUND, "the revoked key still works after {:?}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s3_after = start.elapsed();
    loop {
        let r = h.kv(&alice, &kv, Method::GET, "/v1/ns", b"").await;
        if r.0 == StatusCode::FORBIDDEN {
            break;
        }
        assert!(start.elapsed() < REVOKE_BOUND, "the revoked key still works on KV after {:?}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("a revoked key was refused after {s3_after:?} (S3) and {:?} (KV)", start.elapsed());
    assert!(!run_ok(&["admin", "user", "list"]).contains("alice"));
}
