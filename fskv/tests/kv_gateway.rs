//! The KV gateway through `fskv up` with real processes: the front's
//! routed KV port P+1 (reads to the reader pool, writes to the writer pool)
//! and read-only P+6, the Consul API on P+3 / P+8, gateway processes started
//! on demand by the front, storage of the real cluster. One cluster per
//! test function (each takes a few seconds).

mod common;

use bytes::Bytes;
use common::{free_base_port, start_up};
use fskv_gateway_kv::client::{KvClient, PutOptions};
use fskv_gateway_kv::frame::{self, Op, RequestItem, Status, Version};
use http::{Method, StatusCode};
use std::path::Path;
use std::time::{Duration, Instant};

struct Cluster {
    writer: KvClient,
    reader: KvClient,
    consul: KvClient,
    consul_reader: KvClient,
    token: String,
    base: u16,
}

fn endpoints(data: &Path, base: u16) -> Cluster {
    let text = std::fs::read_to_string(data.join("endpoints.json")).expect("endpoints.json");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let token = v["bearer_token"].as_str().expect("a bearer token in endpoints.json").to_string();
    assert_eq!(v["kv"], format!("http://127.0.0.1:{}", base + 1));
    assert_eq!(v["kv_reader"], format!("http://127.0.0.1:{}", base + 6));
    let c = |k: &str| KvClient::new(v[k].as_str().unwrap(), Some(token.clone())).with_timeout_ms(30_000);
    Cluster { writer: c("kv"), reader: c("kv_reader"), consul: c("consul"), consul_reader: c("consul_reader"), token, base }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn status(r: Result<impl std::fmt::Debug, fskv_gateway_kv::client::ClientError>) -> u16 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.status().map(|s| s.as_u16()).unwrap_or_else(|| panic!("not an HTTP error: {e}")),
    }
}

async fn single_key_ops(c: &Cluster) {
    let w = &c.writer;
    w.put_namespace("t", &serde_json::json!({})).await.unwrap();
    // Put, get on the writer and the reader; binary keys.
    let key: &[u8] = b"a/b\x00\xff c";
    let v1 = w.put("t", key, "hello", &PutOptions::default()).await.unwrap();
    let got = w.get("t", key).await.unwrap().unwrap();
    assert_eq!((&got.bytes[..], got.version), (&b"hello"[..], v1.version));
    assert_eq!(&c.reader.get("t", key).await.unwrap().unwrap().bytes[..], b"hello");
    // The reader refuses writes, naming the writer.
    match c.reader.put("t", b"x", "y", &PutOptions::default()).await {
        Err(fskv_gateway_kv::client::ClientError::Status { status, code, message }) => {
            assert_eq!((status, code.as_str()), (StatusCode::FORBIDDEN, "ReadOnlyGateway"));
            assert!(message.contains(&format!("127.0.0.1:{}", c.base + 1)), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Create-only.
    assert_eq!(status(w.put("t", key, "again", &PutOptions { if_absent: true, ..Default::default() }).await), 412);
    let created = w.put("t", b"fresh", "1", &PutOptions { if_absent: true, ..Default::default() }).await.unwrap();
    // Compare-and-swap: the current version wins once, the stale one fails.
    let v2 = w.put("t", key, "world", &PutOptions { if_match: Some(v1.version), ..Default::default() }).await.unwrap();
    assert_ne!(v2.version, v1.version);
    assert!(v2.index > v1.index, "modify index grows");
    assert_eq!(status(w.put("t", key, "lost", &PutOptions { if_match: Some(v1.version), ..Default::default() }).await), 412);
    assert_eq!(&w.get("t", key).await.unwrap().unwrap().bytes[..], b"world");
    // Ranges.
    let r = w.get_with("t", key, &[("range", "bytes=1-3".into())]).await.unwrap().unwrap();
    assert_eq!(&r.bytes[..], b"orl");
    let r = w.get_with("t", key, &[("range", "bytes=-2".into())]).await.unwrap().unwrap();
    assert_eq!(&r.bytes[..], b"ld");
    assert_eq!(status(w.get_with("t", key, &[("range", "bytes=10-".into())]).await), 416);
    // Conditional GET.
    let r = w
        .raw(Method::GET, "/v1/kv/t/fresh", &[("if-none-match", fskv_gateway_kv::record::etag(created.version))], Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    // HEAD.
    let r = w.raw(Method::HEAD, "/v1/kv/t/fresh", &[], Bytes::new()).await.unwrap();
    assert_eq!((r.status(), r.headers()["content-length"].to_str().unwrap()), (StatusCode::OK, "1"));
    // Compare-and-delete, delete, 404.
    assert_eq!(status(w.delete("t", key, Some(v1.version)).await), 412);
    assert!(w.delete("t", key, Some(v2.version)).await.unwrap());
    assert!(!w.delete("t", key, None).await.unwrap());
    assert!(w.get("t", key).await.unwrap().is_none());
    assert!(c.reader.get("t", key).await.unwrap().is_none());
    // A 4 KiB key (longer than one 255-byte name).
    let long: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    w.put("t", &long, "long", &PutOptions::default()).await.unwrap();
    assert_eq!(&c.reader.get("t", &long).await.unwrap().unwrap().bytes[..], b"long");
    assert!(w.delete("t", &long, None).await.unwrap());
    // A value streamed in and out (10 MiB: above whole_value_max_bytes).
    let big: Vec<u8> = (0..10 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    w.put("t", b"big", big.clone(), &PutOptions::default()).await.unwrap();
    let got = c.reader.get("t", b"big").await.unwrap().unwrap();
    assert!(got.bytes == big, "10 MiB value read back identical");
    let r = c.reader.get_with("t", b"big", &[("range", format!("bytes={}-{}", 5 << 20, (5 << 20) + 99))]).await.unwrap().unwrap();
    assert_eq!(&r.bytes[..], &big[5 << 20..(5 << 20) + 100]);
    // A batch get streams a many-chunk value chunk by chunk, in order, next
    // to a small and a missing key.
    w.put("t", b"small", "s", &PutOptions::default()).await.unwrap();
    let r = c.reader.batch_get("t", &[b"big", b"nope", b"small", b"big"]).await.unwrap();
    assert_eq!(r.ok, 3);
    assert!(r.items[0].status == Status::Ok && r.items[0].value == big, "10 MiB value in a batch, identical");
    assert_eq!(r.items[1].status, Status::NotFound);
    assert_eq!((r.items[2].status, &r.items[2].value[..]), (Status::Ok, &b"s"[..]));
    assert!(r.items[3].value == big, "the same value twice in one batch");
    // TTL.
    w.put("t", b"ttl", "x", &PutOptions { ttl_ms: Some(300), ..Default::default() }).await.unwrap();
    assert!(w.get("t", b"ttl").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(w.get("t", b"ttl").await.unwrap().is_none(), "expired key is gone for readers at once");
    assert!(c.reader.get("t", b"ttl").await.unwrap().is_none());
}

async fn errors(c: &Cluster) {
    let w = &c.writer;
    let bad = |m, p: &str, h: Vec<(&'static str, String)>, b: &'static [u8]| {
        let w = w.clone();
        let p = p.to_string();
        async move {
            let r = w.raw(m, &p, &h, Bytes::from_static(b)).await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap_or_default();
            (r.status().as_u16(), v["error"]["code"].as_str().unwrap_or("").to_string())
        }
    };
    let long = "k".repeat(4097);
    assert_eq!(bad(Method::PUT, &format!("/v1/kv/t/{long}"), vec![], b"x").await, (400, "KeyTooLong".into()));
    assert_eq!(bad(Method::GET, "/v1/kv/nope/k", vec![], b"").await, (404, "NoSuchNamespace".into()));
    assert_eq!(bad(Method::PUT, "/v1/ns/bad%20name", vec![], b"").await, (400, "InvalidNamespaceName".into()));
    assert_eq!(bad(Method::POST, "/v1/kv/t?batch=get", vec![], b"garbage").await, (400, "InvalidBatchFrame".into()));
    assert_eq!(bad(Method::PUT, "/v1/kv/t/k", vec![("if-match", "\"zz\"".into())], b"x").await, (400, "InvalidArgument".into()));
    assert_eq!(bad(Method::PUT, "/v1/ns/t", vec![], b"{\"capacity\": 1}").await.0, 400);
    assert_eq!(bad(Method::PATCH, "/v1/kv/t/k", vec![], b"").await, (405, "MethodNotAllowed".into()));
    // A batch put with a bad frame in the middle publishes nothing.
    let mut body = frame::encode_request(
        Op::Put,
        0,
        0,
        &[
            RequestItem { key: b"p1", value: Some(b"a"), ..Default::default() },
            RequestItem { key: b"p2", value: Some(b"b"), ..Default::default() },
        ],
    );
    body.push(0);
    let r = w.raw(Method::POST, "/v1/kv/t?batch=put", &[], Bytes::from(body)).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(w.get("t", b"p1").await.unwrap().is_none(), "nothing partial becomes visible");
    // Without credentials / with a wrong token.
    let anon = KvClient::new(&format!("http://127.0.0.1:{}", c.base + 1), None);
    assert_eq!(anon.raw(Method::GET, "/v1/kv/t/fresh", &[], Bytes::new()).await.unwrap().status(), StatusCode::FORBIDDEN);
    let wrong = KvClient::new(&format!("http://127.0.0.1:{}", c.base + 1), Some("nope".into()));
    assert!(wrong.raw(Method::GET, "/v1/kv/t/fresh", &[], Bytes::new()).await.unwrap().status().is_client_error());
    let health = anon.raw(Method::GET, "/health", &[], Bytes::new()).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
}

async fn batches_and_scans(c: &Cluster) {
    let w = &c.writer;
    w.put_namespace("b", &serde_json::json!({})).await.unwrap();
    let keys: Vec<Vec<u8>> = (0..200).map(|i| format!("blk/{i:04}").into_bytes()).collect();
    let values: Vec<Vec<u8>> = (0..200).map(|i| vec![i as u8; if i % 50 == 0 { 100_000 } else { 1024 }]).collect();
    let items: Vec<RequestItem> =
        keys.iter().zip(&values).map(|(k, v)| RequestItem { key: k, value: Some(v), if_absent: true, ..Default::default() }).collect();
    let r = w.batch("b", Op::Put, 0, 0, &items).await.unwrap();
    assert_eq!((r.items.len(), r.ok), (200, 200));
    // Create-only again: every item answers Exists, which counts as success.
    let r = w.batch("b", Op::Put, 0, 0, &items[..10]).await.unwrap();
    assert!(r.items.iter().all(|i| i.status == Status::Exists));
    assert_eq!(r.ok, 10);
    // Batch get from the reader: every value, in order.
    let krefs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let r = c.reader.batch_get("b", &krefs[..150]).await.unwrap();
    for (i, item) in r.items.iter().enumerate() {
        assert_eq!((item.status, &item.value[..]), (Status::Ok, &values[i][..]), "item {i}");
    }
    // Exists with the prefix count: 150 present, then a missing one, then present ones.
    let mut probe: Vec<&[u8]> = krefs[..150].to_vec();
    probe.push(b"missing");
    probe.extend_from_slice(&krefs[150..160]);
    let r = c.reader.batch_exists("b", &probe, false, 0).await.unwrap();
    assert_eq!((r.prefix, r.ok), (150, 160));
    assert_eq!(r.items[150].status, Status::NotFound);
    let r = c.reader.batch_exists("b", &probe, true, 5_000).await.unwrap();
    assert_eq!(r.prefix, 150);
    assert!(r.items[151..].iter().all(|i| i.status == Status::Skipped));
    // Scan pages by prefix with start_after.
    let mut seen = Vec::new();
    let mut q = "prefix=blk%2F&limit=64".to_string();
    loop {
        let page = c.reader.scan("b", &q).await.unwrap();
        seen.extend(page.items.iter().map(|i| i.key.to_vec()));
        if !page.more {
            break;
        }
        let last = page.items.last().unwrap().key.clone();
        q = format!("prefix=blk%2F&limit=64&start_after={}", fskv_gateway_kv::client::encode_component(&last));
    }
    assert_eq!(seen, keys, "a scan returns every key once, in byte order");
    let page = c.reader.scan("b", "start=blk%2F0010&end=blk%2F0013&values=1").await.unwrap();
    let got: Vec<(&[u8], &[u8])> = page.items.iter().map(|i| (&i.key[..], &i.value[..])).collect();
    assert_eq!(got, (10..13).map(|i| (&keys[i][..], &values[i][..])).collect::<Vec<_>>());
    // Batch delete with a compare-and-delete that fails.
    let del = [
        RequestItem { key: &keys[0], ..Default::default() },
        RequestItem { key: &keys[1], if_match: Some(Version { inode: 1, version: 1 }), ..Default::default() },
        RequestItem { key: b"missing", ..Default::default() },
    ];
    let r = w.batch("b", Op::Delete, 0, 0, &del).await.unwrap();
    let st: Vec<Status> = r.items.iter().map(|i| i.status).collect();
    assert_eq!(st, vec![Status::Ok, Status::PreconditionFailed, Status::NotFound]);
    // Delete by prefix.
    let r = w.raw(Method::DELETE, "/v1/kv/b?prefix=blk%2F01", &[], Bytes::new()).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
    assert_eq!(v["deleted"], 100);
    let page = c.reader.scan("b", "prefix=blk%2F&limit=1000").await.unwrap();
    assert_eq!(page.items.len(), 99);
}

async fn cas_counters(c: &Cluster) {
    // N clients increment one counter with compare-and-swap: no lost update.
    let w = &c.writer;
    w.put("t", b"counter", "0", &PutOptions::default()).await.unwrap();
    const CLIENTS: usize = 6;
    const INCREMENTS: usize = 8;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            let mut retries = 0;
            for _ in 0..INCREMENTS {
                loop {
                    let cur = w.get("t", b"counter").await.unwrap().unwrap();
                    let n: u64 = std::str::from_utf8(&cur.bytes).unwrap().parse().unwrap();
                    match w
                        .put("t", b"counter", (n + 1).to_string(), &PutOptions { if_match: Some(cur.version), ..Default::default() })
                        .await
                    {
                        Ok(_) => break,
                        Err(e) if e.status() == Some(StatusCode::PRECONDITION_FAILED) => retries += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            retries
        }));
    }
    let mut retries = 0;
    for t in tasks {
        retries += t.await.unwrap();
    }
    let v = w.get("t", b"counter").await.unwrap().unwrap();
    assert_eq!(std::str::from_utf8(&v.bytes).unwrap(), (CLIENTS * INCREMENTS).to_string(), "no lost update ({retries} CAS retries)");
}

async fn watch(c: &Cluster) {
    let w = c.writer.clone();
    let v = w.put("t", b"w", "1", &PutOptions::default()).await.unwrap();
    let reader = c.reader.clone();
    let started = Instant::now();
    let h = tokio::spawn(async move {
        reader.raw(Method::GET, &format!("/v1/kv/t/w?watch&index={}&wait_ms=10000", v.index), &[], Bytes::new()).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.put("t", b"w", "2", &PutOptions::default()).await.unwrap();
    let r = h.await.unwrap().unwrap();
    assert_eq!((r.status(), &r.body()[..]), (StatusCode::OK, &b"2"[..]));
    assert!(started.elapsed() < Duration::from_secs(5), "the watch answered on the change, not at its timeout");
    // A prefix watch wakes on a new key under the prefix, and answers its
    // keys. It may also wake on other changes of the namespace's directory
    // (docs/kv.md, "Watches"): then the client watches again from the new index.
    let pr = c.reader.raw(Method::GET, "/v1/kv/t?watch&prefix=wp%2F&wait_ms=0", &[], Bytes::new()).await.unwrap();
    let pidx = pr.headers()["x-kv-index"].to_str().unwrap().to_string();
    let reader = c.reader.clone();
    let pstarted = Instant::now();
    let ph = tokio::spawn(async move {
        let mut idx = pidx;
        loop {
            let r = reader
                .raw(Method::GET, &format!("/v1/kv/t?watch&prefix=wp%2F&index={idx}&wait_ms=10000"), &[], Bytes::new())
                .await
                .unwrap();
            let page = frame::decode_response(r.body()).unwrap();
            if !page.items.is_empty() {
                return page.items.iter().map(|i| i.key.to_vec()).collect::<Vec<_>>();
            }
            idx = r.headers()["x-kv-index"].to_str().unwrap().to_string();
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.put("t", b"wp/1", "x", &PutOptions::default()).await.unwrap();
    let keys = tokio::time::timeout(Duration::from_secs(10), ph).await.expect("the prefix watch answered").unwrap();
    assert!(pstarted.elapsed() < Duration::from_secs(5), "the prefix watch answered on the change, not at its timeout");
    assert_eq!(keys, vec![b"wp/1".to_vec()]);
    // Unchanged prefix: the watch blocks until its wait ends, with the same index.
    let r0 = c.reader.raw(Method::GET, "/v1/kv/t?watch&prefix=wp%2F&wait_ms=0", &[], Bytes::new()).await.unwrap();
    let i0 = r0.headers()["x-kv-index"].to_str().unwrap().to_string();
    let t0 = Instant::now();
    let r1 = c.reader.raw(Method::GET, &format!("/v1/kv/t?watch&prefix=wp%2F&index={i0}&wait_ms=500"), &[], Bytes::new()).await.unwrap();
    assert_eq!(r1.headers()["x-kv-index"].to_str().unwrap(), i0, "the index of an unchanged prefix is stable");
    assert!(t0.elapsed() >= Duration::from_millis(450), "an unchanged prefix watch waits");
    // Unchanged: answers at the timeout with the same index.
    let r = c
        .reader
        .raw(Method::GET, &format!("/v1/kv/t/w?watch&index={}&wait_ms=300", r.headers()["x-kv-index"].to_str().unwrap()), &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(&r.body()[..], b"2");
}

async fn consul(c: &Cluster) {
    let (w, r) = (&c.consul, &c.consul_reader);
    let put = |path: &str, body: &'static str| {
        let w = w.clone();
        let p = path.to_string();
        async move {
            let resp = w.raw(Method::PUT, &p, &[], Bytes::from_static(body.as_bytes())).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{p}");
            String::from_utf8(resp.body().to_vec()).unwrap()
        }
    };
    assert_eq!(put("/v1/kv/app/db/host?flags=42", "db1").await, "true");
    assert_eq!(put("/v1/kv/app/db/port", "5432").await, "true");
    assert_eq!(put("/v1/kv/app/name", "x").await, "true");
    let g = r.raw(Method::GET, "/v1/kv/app/db/host", &[], Bytes::new()).await.unwrap();
    assert_eq!(g.status(), StatusCode::OK);
    let idx: u64 = g.headers()["x-consul-index"].to_str().unwrap().parse().unwrap();
    let v: serde_json::Value = serde_json::from_slice(g.body()).unwrap();
    assert_eq!((v[0]["Key"].as_str(), v[0]["Value"].as_str(), v[0]["Flags"].as_u64()), (Some("app/db/host"), Some("ZGIx"), Some(42)));
    let modify = v[0]["ModifyIndex"].as_u64().unwrap();
    assert_eq!(v[0]["CreateIndex"].as_u64(), Some(modify));
    assert!(idx >= 1);
    let raw = r.raw(Method::GET, "/v1/kv/app/db/host?raw", &[], Bytes::new()).await.unwrap();
    assert_eq!(&raw.body()[..], b"db1");
    let rec = r.raw(Method::GET, "/v1/kv/app/?recurse", &[], Bytes::new()).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(rec.body()).unwrap();
    let keys: Vec<&str> = v.as_array().unwrap().iter().map(|e| e["Key"].as_str().unwrap()).collect();
    assert_eq!(keys, vec!["app/db/host", "app/db/port", "app/name"]);
    let ks = r.raw(Method::GET, "/v1/kv/app/?keys&separator=/", &[], Bytes::new()).await.unwrap();
    assert_eq!(serde_json::from_slice::<serde_json::Value>(ks.body()).unwrap(), serde_json::json!(["app/db/", "app/name"]));
    // CAS: a stale index fails, the current one wins; cas=0 is create-only.
    assert_eq!(put(&format!("/v1/kv/app/db/host?cas={}", modify - 1), "no").await, "false");
    assert_eq!(put(&format!("/v1/kv/app/db/host?cas={modify}"), "db2").await, "true");
    assert_eq!(put("/v1/kv/app/db/host?cas=0", "no").await, "false");
    let v: serde_json::Value =
        serde_json::from_slice(r.raw(Method::GET, "/v1/kv/app/db/host", &[], Bytes::new()).await.unwrap().body()).unwrap();
    assert_eq!(v[0]["CreateIndex"].as_u64(), Some(modify), "CreateIndex survives an overwrite");
    assert!(v[0]["ModifyIndex"].as_u64().unwrap() > modify);
    // The same key through the native API (namespace "consul").
    assert_eq!(&c.writer.get("consul", b"app/db/host").await.unwrap().unwrap().bytes[..], b"db2");
    // Blocking query on the reader wakes on a write through the writer.
    let cur: u64 = r.raw(Method::GET, "/v1/kv/app/name", &[], Bytes::new()).await.unwrap().headers()["x-consul-index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let rr = r.clone();
    let started = Instant::now();
    let h = tokio::spawn(async move { rr.raw(Method::GET, &format!("/v1/kv/app/name?index={cur}&wait=10s"), &[], Bytes::new()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(put("/v1/kv/app/name", "y").await, "true");
    let b = h.await.unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_slice(b.body()).unwrap();
    assert_eq!(v[0]["Value"].as_str(), Some("eQ=="));
    assert!(started.elapsed() < Duration::from_secs(5));
    // Delete, recurse delete, 404 with an index; the reader refuses writes.
    let d = w.raw(Method::DELETE, "/v1/kv/app/name", &[], Bytes::new()).await.unwrap();
    assert_eq!(&d.body()[..], b"true");
    let d = w.raw(Method::DELETE, "/v1/kv/app/?recurse", &[], Bytes::new()).await.unwrap();
    assert_eq!(&d.body()[..], b"true");
    let g = r.raw(Method::GET, "/v1/kv/app/db/host", &[], Bytes::new()).await.unwrap();
    assert_eq!(g.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.raw(Method::PUT, "/v1/kv/x", &[], Bytes::from_static(b"1")).await.unwrap().status(), StatusCode::FORBIDDEN);
    let anon = KvClient::new(&format!("http://127.0.0.1:{}", c.base + 3), None);
    assert_eq!(anon.raw(Method::GET, "/v1/kv/x", &[], Bytes::new()).await.unwrap().status().as_u16() / 100, 4);
    let tok = KvClient::new(&format!("http://127.0.0.1:{}", c.base + 3), None);
    let q = tok.raw(Method::GET, &format!("/v1/kv/app?recurse&token={}", c.token), &[], Bytes::new()).await.unwrap();
    assert_eq!(q.status(), StatusCode::NOT_FOUND, "a valid ?token= is accepted (nothing left under app)");
}

async fn eviction(c: &Cluster) {
    let w = &c.writer;
    // 20 keys at most; evict above 15 down to 10.
    w.put_namespace("ev", &serde_json::json!({"capacity_keys": 20, "high_watermark": 0.75, "low_watermark": 0.5})).await.unwrap();
    let key = |i: usize| format!("k{i:02}").into_bytes();
    for i in 0..10 {
        w.put("ev", &key(i), vec![b'x'; 100], &PutOptions::default()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Recently read through the reader: k00..k02. Leased: k05.
    for i in 0..3 {
        assert!(c.reader.get("ev", &key(i)).await.unwrap().is_some());
    }
    let leased = key(5);
    let r = c.reader.batch_exists("ev", &[&leased], false, 30_000).await.unwrap();
    assert_eq!(r.prefix, 1);
    // Wait for the reader's access log to reach the writer (flush 500 ms + merge 500 ms).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 10..16 {
        w.put("ev", &key(i), vec![b'y'; 100], &PutOptions::default()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 16 keys > 15: eviction down to 10 removes 6. GetNamespace through the
    // front is served by the writer (exact) or by a reader with the stats
    // the writer last published (at most stats_interval_ms old), whichever
    // pool the connection was handed to: wait for the eviction to show,
    // not only for a key count that may predate the puts.
    let ns = stats_until(w, 20, |keys, evictions| keys.is_some_and(|k| k <= 10) && evictions.is_some_and(|e| e > 0)).await;
    let stats = (ns["stats"]["keys"].as_u64(), ns["stats"]["evictions"].as_u64());
    assert_eq!(stats, (Some(10), Some(6)), "evicted down to the low watermark: {ns:#} {:#?}", kv_pools(c).await);
    let mut present = Vec::new();
    for i in 0..16 {
        if w.get("ev", &key(i)).await.unwrap().is_some() {
            present.push(i);
        }
    }
    // Exact LRU: the least recently used unleased keys are k03, k04, k06..k09.
    assert_eq!(present, vec![0, 1, 2, 5, 10, 11, 12, 13, 14, 15], "evicted set is exact LRU, leased and recently read keys survive");
    // Through the front a connection goes to the pool of its first request
    // (handover): this read may be answered by the writer (exact stats) or
    // by a reader (the stats last published, at most stats_interval_ms old),
    // so wait for the published ones to catch up.
    let ns = stats_until(w, 10, |_, evictions| evictions == Some(6)).await;
    assert_eq!(ns["stats"]["evictions"].as_u64(), Some(6), "{ns:#} {:#?}", kv_pools(c).await);

    // A writer that stops leaves its counters to the next one (a checkpoint
    // at stop; the periodic one is 60 s away): stop the KV writer with
    // SIGTERM, write through the writer the front starts next, and the
    // stats that one publishes still count the 6 evictions.
    let pools = kv_pools(c).await;
    let pids: Vec<u32> = pools.iter().filter(|p| p.role == "writer").flat_map(|p| p.processes.iter().filter_map(|x| x.pid)).collect();
    assert_eq!(pids.len(), 1, "one KV writer: {pools:#?}");
    // SAFETY: a signal to a process id the front reported as its child.
    assert_eq!(unsafe { libc::kill(pids[0] as i32, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while kv_pools(c).await.iter().any(|p| p.processes.iter().any(|x| x.pid == Some(pids[0]))) {
        assert!(Instant::now() < deadline, "the stopped KV writer is still listed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = w.put("ev", &key(16), vec![b'z'; 100], &PutOptions::default()).await {
        assert!(Instant::now() < deadline, "no put through a new writer: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // k16 is known only to the new writer: its stats are the ones with 11
    // keys. (A kept connection handed to the stopped writer fails once.)
    let ns = stats_until(w, 20, |keys, _| keys == Some(11)).await;
    assert_eq!((ns["stats"]["keys"].as_u64(), ns["stats"]["evictions"].as_u64()), (Some(11), Some(6)), "the new writer's stats: {ns:#}");
}

/// Namespace `ev` as read through the front, once `done(keys, evictions)`
/// holds for its stats or after `secs` seconds (the caller asserts on what
/// it got). A read that fails is retried until then: a kept connection may
/// have been handed to a writer that was stopped since.
async fn stats_until(w: &KvClient, secs: u64, done: impl Fn(Option<u64>, Option<u64>) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match w.namespace("ev").await {
            Ok(ns) if done(ns["stats"]["keys"].as_u64(), ns["stats"]["evictions"].as_u64()) || Instant::now() >= deadline => return ns,
            Ok(_) => {}
            Err(e) if Instant::now() < deadline => eprintln!("namespace read failed, retrying: {e}"),
            Err(e) => panic!("no namespace read within {secs} s: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The front's KV pools (its admin listener, P+10).
async fn kv_pools(c: &Cluster) -> Vec<fskv_front::pool::PoolStatus> {
    let admin = format!("127.0.0.1:{}", c.base + 10);
    let st = fskv_front::admin::fetch_status(&admin, Duration::from_secs(5)).await.expect("front status");
    st.pools.into_iter().filter(|p| p.protocol == "kv").collect()
}

/// An S3 gateway process whose root is the KV root (`fskv gateway s3
/// --root /kv`), killed on drop.
struct S3OverKv {
    child: std::process::Child,
    host: String,
    keys: (String, String),
    http: hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, http_body_util::Full<Bytes>>,
}

impl S3OverKv {
    fn start(data: &Path, base: u16) -> S3OverKv {
        use std::io::BufRead;
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(data.join("endpoints.json")).unwrap()).unwrap();
        let keys = (v["access_key"].as_str().unwrap().to_string(), v["secret_key"].as_str().unwrap().to_string());
        let port = common::free_port();
        let mut child = common::fskv_cmd()
            .args(["gateway", "s3", "--role", "writer", "--root", "/kv", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--mgmtd", &format!("127.0.0.1:{}", base + 11)])
            .arg("--credentials")
            .arg(data.join("credentials.json"))
            .arg("--cluster-key-file")
            .arg(data.join("cluster.key"))
            .env("FSKV_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start fskv gateway s3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.contains("serving on"), "fskv gateway s3 --root /kv did not start: {line:?}");
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        S3OverKv { child, host: format!("127.0.0.1:{port}"), keys, http }
    }

    async fn call(&self, method: Method, target: &str, body: &'static [u8]) -> (StatusCode, Bytes) {
        use http_body_util::BodyExt;
        let req =
            common::sigv4::signed_request((&self.keys.0, &self.keys.1), "s3", method, (&self.host, target), &[], Bytes::from_static(body));
        let resp = tokio::time::timeout(Duration::from_secs(30), self.http.request(req)).await.expect("S3 request hung").unwrap();
        let status = resp.status();
        (status, resp.into_body().collect().await.unwrap().to_bytes())
    }

    async fn ok(&self, method: Method, target: &str, body: &'static [u8]) -> Bytes {
        let (status, body) = self.call(method.clone(), target, body).await;
        assert!(status.is_success(), "S3 {method} {target}: {status} {}", String::from_utf8_lossy(&body));
        body
    }
}

impl Drop for S3OverKv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `<Key>` and `<Prefix>` elements of a listing, in order.
fn xml_elements(xml: &[u8], tag: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(xml);
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    text.split(&open).skip(1).filter_map(|rest| rest.split(&close).next().map(str::to_string)).collect()
}

/// Namespaces are S3 flat buckets: an S3 gateway whose root is the KV root
/// serves KV values as objects (keys with `/` included, `a/b` next to
/// `a/b/c`), and what it writes or deletes is what KV reads.
async fn through_s3(c: &Cluster, data: &Path) {
    let w = &c.writer;
    w.put_namespace("objects", &serde_json::json!({})).await.unwrap();
    let big: Vec<u8> = (0..5u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for (key, value) in
        [(&b"dir/small"[..], b"small value".to_vec()), (b"a/b", b"ab".to_vec()), (b"a/b/c", b"abc".to_vec()), (b"v~1", b"tilde".to_vec())]
    {
        w.put("objects", key, value, &PutOptions::default()).await.unwrap();
    }
    w.put("objects", b"big", big.clone(), &PutOptions::default()).await.unwrap();
    // Keys no S3 request can name (NUL, over 1024 bytes): not listed.
    w.put("objects", b"nul\0key", "n", &PutOptions::default()).await.unwrap();
    w.put("objects", &[b'k'; 1100], "long", &PutOptions::default()).await.unwrap();
    let s3 = S3OverKv::start(data, c.base);
    assert_eq!(&s3.ok(Method::GET, "/objects/dir/small", b"").await[..], b"small value");
    assert_eq!(&s3.ok(Method::GET, "/objects/a/b", b"").await[..], b"ab");
    assert_eq!(&s3.ok(Method::GET, "/objects/a/b/c", b"").await[..], b"abc");
    assert_eq!(&s3.ok(Method::GET, "/objects/v~1", b"").await[..], b"tilde");
    assert!(s3.ok(Method::GET, "/objects/big", b"").await[..] == big[..], "a 5 MiB KV value read through S3");
    let listing = s3.ok(Method::GET, "/objects?list-type=2", b"").await;
    assert_eq!(xml_elements(&listing, "Key"), ["a/b", "a/b/c", "big", "dir/small", "v~1"]);
    let rolled = s3.ok(Method::GET, "/objects?list-type=2&delimiter=%2F", b"").await;
    assert_eq!(xml_elements(&rolled, "Key"), ["big", "v~1"]);
    let prefixes: Vec<String> = xml_elements(&rolled, "Prefix").into_iter().filter(|p| !p.is_empty()).collect();
    assert_eq!(prefixes, ["a/", "dir/"], "the common prefixes");
    // The namespaces are the buckets; the KV gateway's own directory is none.
    let buckets = xml_elements(&s3.ok(Method::GET, "/", b"").await, "Name");
    assert!(buckets.contains(&"objects".to_string()) && buckets.iter().all(|b| !b.starts_with('.')), "{buckets:?}");
    // Written and deleted through S3, read through KV.
    s3.ok(Method::PUT, "/objects/from/s3", b"written through S3").await;
    assert_eq!(&c.reader.get("objects", b"from/s3").await.unwrap().expect("an S3 PUT is a key").bytes[..], b"written through S3");
    s3.ok(Method::DELETE, "/objects/dir/small", b"").await;
    assert!(c.reader.get("objects", b"dir/small").await.unwrap().is_none(), "deleted through S3");
    let (status, _) = s3.call(Method::GET, "/objects/dir/small", b"").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[test]
fn kv_gateway_through_fskv_up() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_base_port();
    let up = common::UpGuard { child: Some(start_up(&data, base)), mount: None };
    let c = endpoints(&data, base);
    let rt = rt();
    rt.block_on(async {
        single_key_ops(&c).await;
        errors(&c).await;
        batches_and_scans(&c).await;
        cas_counters(&c).await;
        watch(&c).await;
        consul(&c).await;
        eviction(&c).await;
        through_s3(&c, &data).await;
    });
    drop(rt);
    up.stop();
}

/// Values are files: written through KV, read through the FUSE mount of the
/// same cluster (`fskv up --mount`), and the reverse.
#[test]
fn kv_values_are_files_through_fuse() {
    if !common::fuse_or_skip("kv_values_are_files_through_fuse") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mnt = dir.path().join("mnt");
    let base = free_base_port();
    let up =
        common::UpGuard { child: Some(common::start_up_with(&data, base, &["--mount", mnt.to_str().unwrap()])), mount: Some(mnt.clone()) };
    assert!(common::is_mounted(&mnt), "fskv up --mount did not mount");
    let c = endpoints(&data, base);
    let rt = rt();
    rt.block_on(async {
        let w = &c.writer;
        w.put_namespace("files", &serde_json::json!({})).await.unwrap();
        let small = b"small value".to_vec();
        let big: Vec<u8> = (0..5 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
        w.put("files", b"dir/small", small.clone(), &PutOptions::default()).await.unwrap();
        w.put("files", b"big", big.clone(), &PutOptions::default()).await.unwrap();
        // The key `dir/small` is the file `dir.2Fsmall` (docs/kv.md, "Keys as names").
        let ns_dir = mnt.join("kv").join("files");
        assert_eq!(std::fs::read(ns_dir.join("dir.2Fsmall")).unwrap(), small);
        assert!(std::fs::read(ns_dir.join("big")).unwrap() == big, "5 MiB value read through FUSE");
        // A file written through FUSE is a key.
        std::fs::write(ns_dir.join("from-fuse"), b"written by the kernel").unwrap();
        assert_eq!(&c.reader.get("files", b"from-fuse").await.unwrap().unwrap().bytes[..], b"written by the kernel");
        let page = c.reader.scan("files", "limit=10").await.unwrap();
        let keys: Vec<&[u8]> = page.items.iter().map(|i| &i.key[..]).collect();
        assert_eq!(keys, vec![&b"big"[..], b"dir/small", b"from-fuse"]);
        // A KV overwrite (a new inode published over the name) is seen
        // through FUSE once the kernel's cached entry expires; until then an
        // open may name the replaced inode (ENOENT) or return the old bytes.
        w.put("files", b"dir/small", "v2", &PutOptions::default()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read(ns_dir.join("dir.2Fsmall")).ok().as_deref() != Some(&b"v2"[..]) {
            assert!(Instant::now() < deadline, "FUSE never saw the overwrite");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    drop(rt);
    up.stop();
}
