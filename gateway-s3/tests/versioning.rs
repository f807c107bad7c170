//! S3 versioning against a model: random PUTs, DELETEs (markers),
//! deletes of one version, state changes (Enabled, Suspended), reads of the
//! current and of every version, and ListObjectVersions paged to the end,
//! compared after every step with what S3 defines. Tree and flat buckets.
//! Objects are small (inline), so only a meta service runs; the conformance
//! suite covers chunked objects, multipart and copies end to end.

mod common;

use fskv_gateway_s3::ops::Gateway;
use fskv_gateway_s3::paths::Layout;
use rand::{Rng, SeedableRng};
use s3s::dto::*;
use std::collections::BTreeMap;

/// One version in the model: its id and its data (`None`: a delete marker).
#[derive(Clone, Debug, PartialEq, Eq)]
struct V {
    id: String,
    data: Option<Vec<u8>>,
}

/// S3's versioning, per key the versions newest first.
#[derive(Default)]
struct Model {
    keys: BTreeMap<String, Vec<V>>,
}

impl Model {
    fn current(&self, key: &str) -> Option<&Vec<u8>> {
        self.keys.get(key).and_then(|vs| vs.first()).and_then(|v| v.data.as_ref())
    }

    /// A write (data) or a marker (None) with id `id`; a null one replaces
    /// the key's null version.
    fn push(&mut self, key: &str, id: String, data: Option<Vec<u8>>) {
        let vs = self.keys.entry(key.to_string()).or_default();
        if id == "null" {
            vs.retain(|v| v.id != "null");
        }
        vs.insert(0, V { id, data });
    }

    fn remove(&mut self, key: &str, id: &str) {
        if let Some(vs) = self.keys.get_mut(key) {
            vs.retain(|v| v.id != id);
            if vs.is_empty() {
                self.keys.remove(key);
            }
        }
    }

    /// ListObjectVersions of everything: (key, id, latest, is marker).
    fn listing(&self) -> Vec<(String, String, bool, bool)> {
        let mut out = Vec::new();
        for (k, vs) in &self.keys {
            for (i, v) in vs.iter().enumerate() {
                out.push((k.clone(), v.id.clone(), i == 0, v.data.is_none()));
            }
        }
        out
    }
}

async fn put(gw: &Gateway, bucket: &str, key: &str, data: &[u8]) -> Option<String> {
    let args = common::put_args(bucket, key);
    gw.put(args, Some(common::blob(data)), &http::HeaderMap::new(), None, None).await.expect("put").version_id
}

async fn get(gw: &Gateway, bucket: &str, key: &str, version: Option<&str>) -> Result<Vec<u8>, String> {
    let input = GetObjectInput { bucket: bucket.into(), key: key.into(), version_id: version.map(str::to_string), ..Default::default() };
    match gw.get(&input).await {
        Ok(out) => {
            use futures::StreamExt;
            let mut body = out.body.expect("body");
            let mut data = Vec::new();
            while let Some(piece) = body.next().await {
                data.extend_from_slice(&piece.expect("piece"));
            }
            Ok(data)
        }
        Err(e) => Err(e.code().as_str().to_string()),
    }
}

/// Every version, paged by `max` with the markers the gateway returns.
async fn list_all(gw: &Gateway, bucket: &str, max: i32) -> Vec<(String, String, bool, bool)> {
    let mut out = Vec::new();
    let (mut key_marker, mut vid_marker) = (None, None);
    for _ in 0..10_000 {
        let input = ListObjectVersionsInput {
            bucket: bucket.into(),
            max_keys: Some(max),
            key_marker: key_marker.clone(),
            version_id_marker: vid_marker.clone(),
            ..Default::default()
        };
        let (page, order) = gw.list_versions(&input).await.expect("list versions");
        // The page's entries in the order the XML gives them: the two
        // lists merged by the page's order.
        let mut versions = page.versions.unwrap_or_default().into_iter();
        let mut markers = page.delete_markers.unwrap_or_default().into_iter();
        let mut items: Vec<(String, String, bool, bool)> = Vec::new();
        for is_marker in order.0 {
            items.push(if is_marker {
                let m = markers.next().expect("a marker for the order");
                (m.key.expect("key"), m.version_id.expect("id"), m.is_latest.expect("latest"), true)
            } else {
                let v = versions.next().expect("a version for the order");
                (v.key.expect("key"), v.version_id.expect("id"), v.is_latest.expect("latest"), false)
            });
        }
        assert!(versions.next().is_none() && markers.next().is_none(), "the order covers every entry");
        assert!(items.len() <= max as usize);
        out.extend(items);
        if page.is_truncated != Some(true) {
            return out;
        }
        key_marker = page.next_key_marker;
        vid_marker = page.next_version_id_marker;
    }
    panic!("listing did not end");
}

async fn set_versioning(gw: &Gateway, bucket: &str, status: &str) {
    let conf = VersioningConfiguration { status: Some(BucketVersioningStatus::from(status.to_string())), ..Default::default() };
    let input = PutBucketVersioningInput::builder().bucket(bucket.into()).versioning_configuration(conf).build().expect("input");
    gw.put_bucket_versioning(&input).await.expect("put versioning");
}

async fn run_model(layout: Layout, seed: u64) {
    let (gw, server) = common::gateway(|_| {}).await;
    gw.create_bucket_with("ver", layout).await.expect("bucket");
    let keys = ["a", "a-b", "b/c", "b/d", "z"];
    let mut model = Model::default();
    // FSKV_VERSIONING_SEED replays another sequence.
    let seed = std::env::var("FSKV_VERSIONING_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(seed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Objects written before versioning are the null version.
    assert_eq!(put(&gw, "ver", "a", b"before").await, None, "no version id before versioning");
    model.push("a", "null".into(), Some(b"before".to_vec()));
    set_versioning(&gw, "ver", "Enabled").await;
    let out = gw.get_bucket_versioning("ver").await.expect("get versioning");
    assert_eq!(out.status.as_ref().map(|s| s.as_str()), Some("Enabled"));
    let mut enabled = true;
    for step in 0..160 {
        let key = keys[rng.gen_range(0..keys.len())];
        match rng.gen_range(0..100) {
            0..=39 => {
                let data = format!("{key}@{step}").into_bytes();
                // As AWS: a write while Suspended answers no version id.
                let id = put(&gw, "ver", key, &data).await;
                assert_eq!(id.is_some(), enabled, "step {step}");
                model.push(key, id.unwrap_or_else(|| "null".into()), Some(data));
            }
            40..=59 => {
                let d = gw.delete_object("ver", key, None).await.expect("delete");
                assert!(d.delete_marker, "step {step}: a delete makes a marker");
                let id = d.version_id.expect("marker id");
                assert_eq!(id == "null", !enabled);
                model.push(key, id, None);
            }
            60..=79 => {
                let Some(vs) = model.keys.get(key) else { continue };
                let v = vs[rng.gen_range(0..vs.len())].clone();
                let d = gw.delete_object("ver", key, Some(&v.id)).await.expect("delete version");
                assert_eq!((d.version_id.as_deref(), d.delete_marker), (Some(v.id.as_str()), v.data.is_none()), "step {step}");
                model.remove(key, &v.id);
            }
            80..=89 => {
                enabled = !enabled;
                set_versioning(&gw, "ver", if enabled { "Enabled" } else { "Suspended" }).await;
            }
            _ => {
                // Reads of every version of the key.
                for v in model.keys.get(key).cloned().unwrap_or_default() {
                    let got = get(&gw, "ver", key, Some(&v.id)).await;
                    match &v.data {
                        Some(d) => assert_eq!(got.as_ref(), Ok(d), "step {step}: {key} version {}", v.id),
                        None => assert_eq!(got, Err("MethodNotAllowed".into()), "step {step}: marker {}", v.id),
                    }
                }
                let missing = "00000000000000000000abcd";
                assert_eq!(get(&gw, "ver", key, Some(missing)).await, Err("NoSuchVersion".into()));
                assert_eq!(get(&gw, "ver", key, Some("not-an-id")).await, Err("InvalidArgument".into()));
            }
        }
        for k in keys {
            let got = get(&gw, "ver", k, None).await;
            match model.current(k) {
                Some(d) => assert_eq!(got.as_ref(), Ok(d), "step {step}: GET {k}"),
                None => assert_eq!(got, Err("NoSuchKey".into()), "step {step}: GET {k}"),
            }
        }
        if step % 20 == 19 {
            // In S3's order: key order, newest first within a key, versions
            // and markers interleaved.
            let want = model.listing();
            for max in [1, 3, 1000] {
                assert_eq!(list_all(&gw, "ver", max).await, want, "step {step}: versions paged by {max}");
            }
        }
    }
    // DeleteBucket refuses while versions are left; deleting every version empties it.
    assert_eq!(gw.delete_bucket("ver").await.map_err(|e| e.code().as_str().to_string()), Err("BucketNotEmpty".into()));
    for (k, vs) in model.keys.clone() {
        for v in vs {
            gw.delete_object("ver", &k, Some(&v.id)).await.expect("delete version");
        }
    }
    assert!(list_all(&gw, "ver", 1000).await.is_empty());
    gw.delete_bucket("ver").await.expect("an emptied versioned bucket deletes");
    server.shutdown().await;
}

#[tokio::test]
async fn versioning_matches_the_s3_model_in_a_tree_bucket() {
    run_model(Layout::Tree, 3).await;
}

#[tokio::test]
async fn versioning_matches_the_s3_model_in_a_flat_bucket() {
    run_model(Layout::Flat, 5).await;
}

/// A version restores by copying it onto its key; conditional reads apply
/// to the version asked for; a retried PUT under If-None-Match fails once
/// a version is current.
#[tokio::test]
async fn copy_restores_a_version_and_conditions_apply_per_version() {
    let (gw, server) = common::gateway(|_| {}).await;
    set_versioning(&gw, "bkt", "Enabled").await;
    let v1 = put(&gw, "bkt", "doc", b"one").await.expect("v1");
    let v2 = put(&gw, "bkt", "doc", b"two").await.expect("v2");
    assert_ne!(v1, v2);
    let source = CopySource::Bucket { bucket: "bkt".into(), key: "doc".into(), version_id: Some(v1.clone().into()) };
    let copy = CopyObjectInput::builder().bucket("bkt".into()).key("doc".into()).copy_source(source).build().expect("input");
    let out = gw.copy(&copy).await.expect("copy a version onto its key");
    assert_eq!(out.copy_source_version_id.as_deref(), Some(v1.as_str()));
    let v3 = out.version_id.expect("a new version");
    assert_eq!(get(&gw, "bkt", "doc", None).await, Ok(b"one".to_vec()));
    let plain = HeadObjectInput { bucket: "bkt".into(), key: "doc".into(), version_id: Some(v1.clone()), ..Default::default() };
    let etag_one = gw.head(&plain).await.expect("head v1").e_tag.expect("etag").value().to_string();
    let head = |v: &str, m: &str| HeadObjectInput {
        bucket: "bkt".into(),
        key: "doc".into(),
        version_id: Some(v.into()),
        if_match: Some(ETagCondition::ETag(ETag::Strong(m.into()))),
        ..Default::default()
    };
    assert!(gw.head(&head(&v3, &etag_one)).await.is_ok());
    let e = gw.head(&head(&v2, &etag_one)).await.expect_err("v2 is 'two'");
    assert_eq!(e.code().as_str(), "PreconditionFailed");
    let listed = list_all(&gw, "bkt", 1000).await;
    let ids: Vec<&str> = listed.iter().map(|(_, id, _, _)| id.as_str()).collect();
    assert_eq!(ids, [v3.as_str(), v2.as_str(), v1.as_str()]);
    server.shutdown().await;
}

/// In a tree bucket, a DELETE of a key whose path is blocked (a prefix of
/// other keys, or below an object) still makes a delete marker, as S3 does,
/// and touches nothing else.
#[tokio::test]
async fn deletes_of_blocked_tree_paths_make_markers() {
    let (gw, server) = common::gateway(|_| {}).await;
    set_versioning(&gw, "bkt", "Enabled").await;
    put(&gw, "bkt", "x/y", b"under x").await.expect("x/y");
    put(&gw, "bkt", "f", b"a file").await.expect("f");
    for key in ["x", "f/g"] {
        let d = gw.delete_object("bkt", key, None).await.expect("delete makes a marker");
        assert!(d.delete_marker && d.version_id.is_some(), "{key}: {d:?}");
    }
    assert_eq!(get(&gw, "bkt", "x/y", None).await, Ok(b"under x".to_vec()));
    assert_eq!(get(&gw, "bkt", "f", None).await, Ok(b"a file".to_vec()));
    let listed = list_all(&gw, "bkt", 1000).await;
    let markers: Vec<&str> = listed.iter().filter(|v| v.3).map(|v| v.0.as_str()).collect();
    assert_eq!(markers, ["f/g", "x"]);
    server.shutdown().await;
}

/// A state put through another gateway process applies to the very next
/// request here: the cached state is tied to the bucket directory's inode
/// version, which every request's bucket lookup sees.
#[tokio::test]
async fn a_state_put_elsewhere_applies_at_once() {
    let (gw, server) = common::gateway(|_| {}).await;
    let store2 = fskv_gateway_s3::store::Store::open(gw.store.fs.clone(), "/s3", false).await.expect("second store");
    let other = Gateway { store: store2, cfg: gw.cfg.clone(), access: Default::default() };
    assert_eq!(put(&gw, "bkt", "k", b"1").await, None, "unversioned: cached as Off here");
    set_versioning(&other, "bkt", "Enabled").await;
    assert!(put(&gw, "bkt", "k", b"2").await.is_some(), "the next PUT here makes a version");
    set_versioning(&other, "bkt", "Suspended").await;
    assert_eq!(put(&gw, "bkt", "k", b"3").await, None, "and the next one a null version");
    server.shutdown().await;
}
