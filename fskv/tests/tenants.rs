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
//! | files written as the tenant | alice's objects (small inline, large chunked), prefix directories, both multipart completions (in place, and copied after a re-sent part), KV values (inline and chunked) and continuation directories: owned by the tenant's uid/gid, 0600 / 0700, through meta; the staging `.fskv-uploads/<bucket>` stays root's; through the mount the tenant's uid reads its objects and `nobody` cannot |
//! | MQ consumer groups | a group is its creator's tenant's: bob (tenant beta) gets 403 on join / heartbeat / commit / describe / delete of alice's group and does not list it; nobody joins a group with another tenant's topic; a dead-letter topic of another tenant is refused (403) |
//! | Consul with tenants | each tenant's token works in its own namespace (`consul` for default, `consul.<uid>` otherwise): bob does not see, list or overwrite alice's key; the native API cannot take another tenant's Consul namespace |
//! | revocation | after `fskv admin user revoke`, the key is refused (403 `InvalidAccessKeyId`) within the poll interval (1 s) plus slack |

mod common;

use bytes::Bytes;
use common::{free_base_port, start_up_with, UpGuard};
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_types::InodeId;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
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
        let (status, _, body) = common::http::send(&self.client, req, REQUEST_TIMEOUT).await;
        (status, body)
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
    let u: serde_json::Value =
        serde_json::from_str(&run_ok(&["admin", "user", "create", "alice", "--tenant", "acme", "--bearer-token", "--json"])).unwrap();
    let alice = Key { ak: u["access_key"].as_str().unwrap().into(), sk: u["secret_key"].as_str().unwrap().into() };
    let alice_token = u["bearer_token"].as_str().expect("alice's bearer token").to_string();
    let t: serde_json::Value = serde_json::from_str(&run_ok(&["admin", "tenant", "create", "beta", "--json"])).unwrap();
    let beta_uid = t["uid"].as_u64().unwrap() as u32;
    let u: serde_json::Value =
        serde_json::from_str(&run_ok(&["admin", "user", "create", "bob", "--tenant", "beta", "--bearer-token", "--json"])).unwrap();
    let bob = Key { ak: u["access_key"].as_str().unwrap().into(), sk: u["secret_key"].as_str().unwrap().into() };
    let bob_token = u["bearer_token"].as_str().expect("bob's bearer token").to_string();
    assert!(run_err(&["admin", "user", "create", "alice", "--tenant", "acme"]).contains("exists"));
    assert!(run_err(&["admin", "user", "create", "carol", "--tenant", "nope"]).contains("does not exist"));
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
    written_as_the_tenant(&h, &meta, (&s3, &kv), (&alice, &bob), (acme_uid, beta_uid)).await;
    groups_and_dead_letters(&h, &port(2), (&alice_token, &bob_token)).await;
    consul_per_tenant(&h, (&port(3), &kv), (&alice_token, &bob_token), (&alice, &bob), beta_uid).await;
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
        let (m1, m2) = (m.to_path_buf(), m.to_path_buf());
        tokio::task::spawn_blocking(move || check_mount(&m1, acme_uid)).await.expect("mount checks");
        tokio::task::spawn_blocking(move || tenant_reads_through_the_mount(&m2, acme_uid)).await.expect("tenant reads through the mount");
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

/// A 5 MiB part 1 (the minimum for a part that is not the last) and more.
fn big_part() -> Vec<u8> {
    (0..(5u32 << 20)).map(|i| (i % 251) as u8).collect()
}

/// The bytes of an XML element's text (`<Tag>text</Tag>`), first match.
fn xml_text(body: &Bytes, tag: &str) -> String {
    let text = String::from_utf8_lossy(body);
    let open = format!("<{tag}>");
    let start = text.find(&open).unwrap_or_else(|| panic!("no <{tag}> in {text}")) + open.len();
    let end = text[start..].find(&format!("</{tag}>")).unwrap_or_else(|| panic!("no </{tag}> in {text}")) + start;
    text[start..end].to_string()
}

/// Owner and mode of an inode as a tuple for assertions.
fn owner_mode(i: &fskv_proto::meta::Inode) -> (u32, u32, u32) {
    (i.acl.uid, i.acl.gid, i.acl.mode & 0o777)
}

/// Alice's objects, prefix directories, multipart objects and KV values
/// are the tenant's (uid/gid acme, 0600 files / 0700 directories) from the
/// transaction that made them; the gateway's staging stays root's.
async fn written_as_the_tenant(h: &Http, meta: &MetaClient, (s3, kv): (&str, &str), (alice, bob): (&Key, &Key), (acme, beta): (u32, u32)) {
    let _ = beta;
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(h.s3(alice, s3, Method::PUT, "/aliceb/p/q/small", b"small").await.0, StatusCode::OK);
    assert_eq!(h.s3(alice, s3, Method::PUT, "/aliceb/p/big", &big).await.0, StatusCode::OK);

    // Multipart, completed in place: part 1 of 5 MiB, part 2 small.
    let (st, b) = h.s3(alice, s3, Method::POST, "/aliceb/mp/inplace?uploads", b"").await;
    assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let id = xml_text(&b, "UploadId");
    let part1 = big_part();
    let mut etags = Vec::new();
    for (n, body) in [(1, &part1[..]), (2, &b"tail"[..])] {
        let (st, b) = h.s3(alice, s3, Method::PUT, &format!("/aliceb/mp/inplace?partNumber={n}&uploadId={id}"), body).await;
        assert_eq!(st, StatusCode::OK, "part {n}: {}", String::from_utf8_lossy(&b));
        // No ETag listed: the attempt that started last (docs/s3.md).
        etags.push(format!("<Part><PartNumber>{n}</PartNumber></Part>"));
    }
    // Another tenant cannot add a part to it (the bucket is not bob's).
    let r = h.s3(bob, s3, Method::PUT, &format!("/aliceb/mp/inplace?partNumber=3&uploadId={id}"), b"x").await;
    assert_code(&r, StatusCode::FORBIDDEN, "AccessDenied", "bob uploads a part to alice's upload");
    let done = format!("<CompleteMultipartUpload>{}</CompleteMultipartUpload>", etags.concat());
    let (st, b) = h.s3(alice, s3, Method::POST, &format!("/aliceb/mp/inplace?uploadId={id}"), done.as_bytes()).await;
    assert_eq!(st, StatusCode::OK, "complete in place: {}", String::from_utf8_lossy(&b));
    assert!(!String::from_utf8_lossy(&b).contains("<Error>"), "{}", String::from_utf8_lossy(&b));

    // Multipart, completed by a copy: part 1 sent twice (the second
    // attempt is a file of its own, so completion assembles a new file).
    let (st, b) = h.s3(alice, s3, Method::POST, "/aliceb/mp/copied?uploads", b"").await;
    assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let id2 = xml_text(&b, "UploadId");
    for body in [&b"first attempt"[..], b"second attempt"] {
        let (st, b) = h.s3(alice, s3, Method::PUT, &format!("/aliceb/mp/copied?partNumber=1&uploadId={id2}"), body).await;
        assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    }
    let done = "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part></CompleteMultipartUpload>".to_string();
    let (st, b) = h.s3(alice, s3, Method::POST, &format!("/aliceb/mp/copied?uploadId={id2}"), done.as_bytes()).await;
    assert_eq!(st, StatusCode::OK, "complete by copy: {}", String::from_utf8_lossy(&b));
    assert!(!String::from_utf8_lossy(&b).contains("<Error>"), "{}", String::from_utf8_lossy(&b));
    let (st, b) = h.s3(alice, s3, Method::GET, "/aliceb/mp/copied", b"").await;
    assert_eq!((st, b.as_ref()), (StatusCode::OK, &b"second attempt"[..]));
    let (st, b) = h.s3(alice, s3, Method::GET, "/aliceb/mp/inplace", b"").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(b.len(), part1.len() + 4, "the in-place object's length");

    // An upload left open: its directory is the tenant's, in root's staging.
    let (st, b) = h.s3(alice, s3, Method::POST, "/aliceb/mp/open?uploads", b"").await;
    assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let id3 = xml_text(&b, "UploadId");
    assert_eq!(h.s3(alice, s3, Method::PUT, &format!("/aliceb/mp/open?partNumber=1&uploadId={id3}"), b"p").await.0, StatusCode::OK);

    let s3_root = meta.lookup(InodeId::ROOT, "s3").await.expect("/s3");
    let bucket = meta.lookup(s3_root.id, "aliceb").await.expect("/s3/aliceb");
    let p = meta.lookup(bucket.id, "p").await.expect("prefix p");
    let q = meta.lookup(p.id, "q").await.expect("prefix p/q");
    let mp = meta.lookup(bucket.id, "mp").await.expect("prefix mp");
    for (what, inode, want) in [
        ("prefix directory p", p.clone(), (acme, acme, 0o700)),
        ("prefix directory p/q", q.clone(), (acme, acme, 0o700)),
        ("small object", meta.lookup(q.id, "small").await.unwrap(), (acme, acme, 0o600)),
        ("large object", meta.lookup(p.id, "big").await.unwrap(), (acme, acme, 0o600)),
        ("multipart object (in place)", meta.lookup(mp.id, "inplace").await.unwrap(), (acme, acme, 0o600)),
        ("multipart object (copied)", meta.lookup(mp.id, "copied").await.unwrap(), (acme, acme, 0o600)),
    ] {
        assert_eq!(owner_mode(&inode), want, "{what}");
    }
    let staging = meta.lookup(s3_root.id, ".fskv-uploads").await.expect("the staging directory");
    assert_eq!(owner_mode(&staging), (0, 0, 0o700), "the multipart staging is root's");
    let per_bucket = meta.lookup(staging.id, "aliceb").await.expect("the bucket's staging");
    assert_eq!(owner_mode(&per_bucket), (0, 0, 0o700), "the bucket's staging is root's");
    let upload = meta.lookup(per_bucket.id, &id3).await.expect("the open upload");
    assert_eq!(owner_mode(&upload), (acme, acme, 0o700), "an upload directory");
    let (entries, _) = meta.readdir(upload.id, "", 100, true).await.expect("list the upload");
    assert!(entries.len() >= 2, "data and part 1: {entries:?}");
    for e in &entries {
        let a = e.attr.as_ref().expect("attrs");
        assert_eq!((a.acl.uid, a.acl.gid, a.acl.mode & 0o777), (acme, acme, 0o600), "upload file {}", e.name);
    }

    // KV: inline and chunked values, a long key's continuation directory.
    let long_key = format!("/v1/kv/alicens/{}", "l".repeat(400));
    let big_value = vec![7u8; 100_000];
    for (target, body) in [("/v1/kv/alicens/v", &b"value"[..]), ("/v1/kv/alicens/big", &big_value[..]), (long_key.as_str(), b"long")] {
        let (st, b) = h.kv(alice, kv, Method::PUT, target, body).await;
        assert!(st.is_success(), "alice PUT {target}: {st} {}", String::from_utf8_lossy(&b));
    }
    let kv_root = meta.lookup(InodeId::ROOT, "kv").await.expect("/kv");
    let ns = meta.lookup(kv_root.id, "alicens").await.expect("/kv/alicens");
    let mut seen = (0, 0);
    let mut dirs = vec![ns.id];
    while let Some(d) = dirs.pop() {
        let (entries, _) = meta.readdir(d, "", 1000, true).await.expect("list the namespace");
        for e in entries {
            let a = e.attr.as_ref().expect("attrs");
            if e.kind == fskv_proto::meta::InodeKind::Directory {
                assert_eq!((a.acl.uid, a.acl.gid, a.acl.mode & 0o777), (acme, acme, 0o700), "continuation directory {}", e.name);
                dirs.push(e.inode);
                seen.1 += 1;
            } else {
                assert_eq!((a.acl.uid, a.acl.gid, a.acl.mode & 0o777), (acme, acme, 0o600), "value {}", e.name);
                seen.0 += 1;
            }
        }
    }
    assert!(seen.0 >= 3 && seen.1 >= 1, "values and continuation directories seen: {seen:?}");
}

/// Consumer groups belong to the tenant that made them; dead-letter topics
/// must be the queue's tenant's.
async fn groups_and_dead_letters(h: &Http, mq: &str, (alice, bob): (&str, &str)) {
    let call = |token: &str, method: Method, target: &str, body: serde_json::Value| {
        let auth = format!("Bearer {token}");
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{mq}{target}"))
            .header("host", mq)
            .header("authorization", auth)
            .header("content-type", "application/json");
        if body.is_null() {
            req = req.header("content-length", "0");
        }
        let body = if body.is_null() { Bytes::new() } else { Bytes::from(body.to_string()) };
        req.body(Full::new(body)).unwrap()
    };
    let null = serde_json::Value::Null;
    for (token, topic) in [(alice, "alicet"), (alice, "alicedlq"), (bob, "bobt")] {
        let r = h.send(call(token, Method::PUT, &format!("/v1/topics/{topic}"), serde_json::json!({"partitions": 1}))).await;
        assert!(r.0.is_success(), "create {topic}: {} {}", r.0, String::from_utf8_lossy(&r.1));
    }
    let join = serde_json::json!({"topics": ["alicet"], "member_id": "a1"});
    let r = h.send(call(alice, Method::POST, "/v1/groups/ag/join", join)).await;
    assert_eq!(r.0, StatusCode::OK, "alice joins her group: {}", String::from_utf8_lossy(&r.1));
    let v: serde_json::Value = serde_json::from_slice(&r.1).unwrap();
    let generation = v["generation"].as_u64().expect("generation");
    let commit =
        serde_json::json!({"member_id": "a1", "generation": generation, "offsets": [{"topic": "alicet", "partition": 0, "offset": 0}]});
    let r = h.send(call(alice, Method::POST, "/v1/groups/ag/commit", commit.clone())).await;
    assert_eq!(r.0, StatusCode::OK, "alice commits: {}", String::from_utf8_lossy(&r.1));
    for (what, method, target, body) in [
        ("join", Method::POST, "/v1/groups/ag/join", serde_json::json!({"topics": ["bobt"], "member_id": "b1"})),
        ("heartbeat", Method::POST, "/v1/groups/ag/heartbeat", serde_json::json!({"member_id": "a1"})),
        ("leave", Method::POST, "/v1/groups/ag/leave", serde_json::json!({"member_id": "a1"})),
        ("commit", Method::POST, "/v1/groups/ag/commit", commit.clone()),
        (
            "commit standalone",
            Method::POST,
            "/v1/groups/ag/commit",
            serde_json::json!({"offsets": [{"topic": "bobt", "partition": 0, "offset": 0}]}),
        ),
        ("describe (fetch offsets)", Method::GET, "/v1/groups/ag", null.clone()),
        ("delete", Method::DELETE, "/v1/groups/ag", null.clone()),
        ("join with alice's topic", Method::POST, "/v1/groups/bg/join", serde_json::json!({"topics": ["alicet"]})),
        (
            "commit to alice's topic",
            Method::POST,
            "/v1/groups/bg/commit",
            serde_json::json!({"offsets": [{"topic": "alicet", "partition": 0, "offset": 0}]}),
        ),
        (
            "dead letters to alice's topic",
            Method::PUT,
            "/v1/topics/bobt/queues/q",
            serde_json::json!({"dead_letter_topic": "alicedlq", "max_deliveries": 2}),
        ),
        (
            "topic update with alice's dead-letter topic",
            Method::PATCH,
            "/v1/topics/bobt",
            serde_json::json!({"queues": {"q2": {"dead_letter_topic": "alicedlq"}}}),
        ),
        (
            "topic creation with alice's dead-letter topic",
            Method::PUT,
            "/v1/topics/bobt2",
            serde_json::json!({"queues": {"q": {"dead_letter_topic": "alicedlq"}}}),
        ),
    ] {
        let r = h.send(call(bob, method.clone(), target, body)).await;
        assert_code(&r, StatusCode::FORBIDDEN, "AccessDenied", &format!("bob: {what} ({method} {target})"));
    }
    let r = h.send(call(bob, Method::GET, "/v1/topics/bobt2", null.clone())).await;
    assert_eq!(r.0, StatusCode::NOT_FOUND, "the refused topic was not created: {}", String::from_utf8_lossy(&r.1));
    let r = h.send(call(bob, Method::GET, "/v1/groups/bg", null.clone())).await;
    assert_eq!(r.0, StatusCode::NOT_FOUND, "the refused join made no group: {}", String::from_utf8_lossy(&r.1));
    let r = h.send(call(bob, Method::GET, "/v1/groups", null.clone())).await;
    assert!(r.0.is_success() && !String::from_utf8_lossy(&r.1).contains("\"ag\""), "bob's ListGroups: {}", String::from_utf8_lossy(&r.1));
    let r = h.send(call(alice, Method::GET, "/v1/groups", null.clone())).await;
    assert!(r.0.is_success() && String::from_utf8_lossy(&r.1).contains("\"ag\""), "alice's ListGroups: {}", String::from_utf8_lossy(&r.1));
    // Alice's group is intact: one member, her committed offset.
    let r = h.send(call(alice, Method::GET, "/v1/groups/ag", null.clone())).await;
    assert_eq!(r.0, StatusCode::OK, "{}", String::from_utf8_lossy(&r.1));
    let text = String::from_utf8_lossy(&r.1);
    assert!(text.contains("a1") && !text.contains("b1"), "alice's group after bob's attempts: {text}");
    // Her own dead-letter topic is accepted.
    let r = h
        .send(call(
            alice,
            Method::PUT,
            "/v1/topics/alicet/queues/q",
            serde_json::json!({"dead_letter_topic": "alicedlq", "max_deliveries": 2}),
        ))
        .await;
    assert!(r.0.is_success(), "alice's own dead-letter topic: {}", String::from_utf8_lossy(&r.1));
}

/// Each tenant's Consul token works in its own namespace.
async fn consul_per_tenant(
    h: &Http,
    (consul, kv): (&str, &str),
    (alice, bob): (&str, &str),
    (alice_key, bob_key): (&Key, &Key),
    beta: u32,
) {
    let req = |token: &str, method: Method, target: &str, body: &'static [u8]| {
        Request::builder()
            .method(method)
            .uri(format!("http://{consul}{target}"))
            .header("host", consul)
            .header("x-consul-token", token)
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    };
    let r = h.send(req(alice, Method::PUT, "/v1/kv/shared/name", b"alice's")).await;
    assert_eq!((r.0, r.1.as_ref()), (StatusCode::OK, &b"true"[..]), "alice's Consul PUT");
    let r = h.send(req(bob, Method::GET, "/v1/kv/shared/name?raw", b"")).await;
    assert_eq!(r.0, StatusCode::NOT_FOUND, "bob does not see alice's key: {}", String::from_utf8_lossy(&r.1));
    let r = h.send(req(bob, Method::GET, "/v1/kv/?recurse", b"")).await;
    assert!(!String::from_utf8_lossy(&r.1).contains("shared/name"), "bob's listing: {}", String::from_utf8_lossy(&r.1));
    let r = h.send(req(bob, Method::GET, "/v1/kv/?keys", b"")).await;
    assert!(!String::from_utf8_lossy(&r.1).contains("shared/name"), "bob's key names: {}", String::from_utf8_lossy(&r.1));
    let r = h.send(req(bob, Method::PUT, "/v1/kv/shared/name", b"bob's")).await;
    assert_eq!((r.0, r.1.as_ref()), (StatusCode::OK, &b"true"[..]), "bob's Consul PUT (his own key)");
    let r = h.send(req(bob, Method::DELETE, "/v1/kv/shared?recurse", b"")).await;
    assert_eq!(r.0, StatusCode::OK, "bob deletes his prefix");
    let r = h.send(req(alice, Method::GET, "/v1/kv/shared/name?raw", b"")).await;
    assert_eq!((r.0, r.1.as_ref()), (StatusCode::OK, &b"alice's"[..]), "alice's key is unchanged");
    // A blocking query of bob's on the name returns on his changes only,
    // and never shows alice's value.
    let r = h.send(req(bob, Method::GET, "/v1/kv/shared/name?index=1&wait=100ms", b"")).await;
    assert_eq!(r.0, StatusCode::NOT_FOUND, "bob's watch: {}", String::from_utf8_lossy(&r.1));
    // The namespaces: alice's (tenant acme) and bob's are apart, each owned.
    let bobs = format!("/v1/ns/consul.{beta}");
    let r = h.kv(alice_key, kv, Method::PUT, &bobs, b"").await;
    assert_code(&r, StatusCode::FORBIDDEN, "AccessDenied", "alice takes bob's Consul namespace natively");
    let r = h.kv(alice_key, kv, Method::GET, &format!("/v1/kv/consul.{beta}/shared/name"), b"").await;
    assert_eq!(r.0, StatusCode::FORBIDDEN, "alice reads bob's Consul namespace natively: {}", String::from_utf8_lossy(&r.1));
    let r = h.kv(bob_key, kv, Method::GET, "/v1/ns", b"").await;
    assert!(String::from_utf8_lossy(&r.1).contains(&format!("consul.{beta}")), "bob's namespaces: {}", String::from_utf8_lossy(&r.1));
}

/// Through the mount (`allow_other`): the tenant's local user reads its
/// objects (written by the gateway as the tenant); `nobody` cannot.
fn tenant_reads_through_the_mount(mnt: &Path, acme_uid: u32) {
    use std::os::unix::process::CommandExt;
    let run_as = |uid: u32, script: String| Command::new("sh").args(["-c", &script]).uid(uid).gid(uid).output().unwrap();
    for (path, want) in [("s3/aliceb/k", &b"alice's"[..]), ("s3/aliceb/p/q/small", b"small"), ("s3/aliceb/mp/copied", b"second attempt")] {
        let p = mnt.join(path);
        let out = run_as(acme_uid, format!("cat {}", p.display()));
        assert!(out.status.success(), "the tenant's uid reads {path}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, want, "{path} through the mount");
        let out = run_as(65534, format!("cat {}", p.display()));
        assert!(!out.status.success(), "nobody read {path}");
    }
    let out = run_as(acme_uid, format!("wc -c < {}", mnt.join("s3/aliceb/mp/inplace").display()));
    assert!(out.status.success(), "the tenant reads its multipart object: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), ((5u64 << 20) + 4).to_string());
    let out = run_as(acme_uid, format!("ls {}", mnt.join("kv/alicens").display()));
    assert!(out.status.success(), "the tenant lists its namespace: {}", String::from_utf8_lossy(&out.stderr));
    let out = run_as(acme_uid, format!("cat {}", mnt.join("kv/alicens/v").display()));
    assert!(out.status.success() && out.stdout == b"value", "the tenant reads its value: {}", String::from_utf8_lossy(&out.stderr));
}
