//! Listing against a model: random key sets (odd characters, names that
//! sort around `/`, directory objects), every prefix/delimiter/page size
//! combination paged to the end, compared with S3's definition computed on
//! the sorted key set. Objects are empty (inline), so only a meta service
//! runs.

mod common;

use fskv_gateway_s3::list::{self, ListRequest};
use fskv_gateway_s3::ops::Gateway;
use fskv_gateway_s3::paths::Layout;
use http::HeaderMap;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;

async fn gateway() -> (Gateway, fskv_rpc::Server) {
    common::gateway(|_| {}).await
}

async fn put(gw: &Gateway, key: &str) -> bool {
    put_in(gw, "bkt", key).await
}

async fn put_in(gw: &Gateway, bucket: &str, key: &str) -> bool {
    gw.put(common::put_args(bucket, key), None, &HeaderMap::new(), None, None).await.is_ok()
}

#[derive(Debug, PartialEq, Eq, Clone)]
enum Item {
    Key(String),
    Prefix(String),
}

fn item_key(i: &Item) -> &str {
    match i {
        Item::Key(k) | Item::Prefix(k) => k,
    }
}

/// S3's listing of `keys` (all of them, no page limit).
fn model(keys: &BTreeSet<Vec<u8>>, prefix: &str, delim: Option<&str>) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::new();
    for k in keys {
        let k = String::from_utf8(k.clone()).expect("utf8");
        if !k.starts_with(prefix) {
            continue;
        }
        if let Some(d) = delim {
            if let Some(i) = k[prefix.len()..].find(d) {
                let cp = format!("{prefix}{}", &k[prefix.len()..prefix.len() + i + d.len()]);
                if out.last() != Some(&Item::Prefix(cp.clone())) {
                    out.push(Item::Prefix(cp));
                }
                continue;
            }
        }
        out.push(Item::Key(k));
    }
    out
}

async fn paged(gw: &Gateway, bucket: fskv_types::InodeId, prefix: &str, delim: Option<&str>, max: usize) -> Vec<Item> {
    paged_in(gw, Layout::Tree, bucket, prefix, delim, max).await
}

async fn paged_in(gw: &Gateway, layout: Layout, bucket: fskv_types::InodeId, prefix: &str, delim: Option<&str>, max: usize) -> Vec<Item> {
    let mut out = Vec::new();
    let mut after = Vec::new();
    for _ in 0..10_000 {
        let req = ListRequest { prefix: prefix.into(), delimiter: delim.map(str::to_string), after: after.clone(), max_keys: max };
        let page = match layout {
            Layout::Tree => list::list(&gw.store.fs, bucket, &req).await,
            Layout::Flat => list::list_flat(&gw.store.fs, bucket, &req).await,
        }
        .expect("list");
        assert!(page.objects.len() + page.common_prefixes.len() <= max);
        // Within a page, objects and prefixes interleave in key order.
        let mut items: Vec<Item> = page
            .objects
            .iter()
            .map(|o| Item::Key(o.key.clone()))
            .chain(page.common_prefixes.iter().map(|p| Item::Prefix(p.clone())))
            .collect();
        items.sort_by(|a, b| item_key(a).as_bytes().cmp(item_key(b).as_bytes()));
        out.extend(items);
        match page.next_after {
            Some(n) if page.truncated => after = n,
            _ => return out,
        }
    }
    panic!("listing did not end");
}

#[tokio::test]
async fn listing_matches_the_s3_model_for_random_trees() {
    let (gw, server) = gateway().await;
    let bucket = gw.store.bucket("bkt").await.expect("bucket").id;
    let alphabet = ["a", "b", "a-", "a.", "0", " ", "é", "%", "+", "/", "/", "ab", "~"];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut keys: BTreeSet<Vec<u8>> = BTreeSet::new();
    for _ in 0..220 {
        let n = rng.gen_range(1..6);
        let mut k: String = (0..n).map(|_| alphabet[rng.gen_range(0..alphabet.len())]).collect();
        if rng.gen_bool(0.1) && !k.ends_with('/') {
            k.push('/');
        }
        if put(&gw, &k).await {
            keys.insert(k.into_bytes());
        }
    }
    assert!(keys.len() > 60, "{} keys stored", keys.len());
    for prefix in ["", "a", "a/", "a-", "ab/", "b", "é", "zz"] {
        for delim in [None, Some("/"), Some("-"), Some("a/")] {
            let want = model(&keys, prefix, delim);
            for max in [1, 2, 7, 1000] {
                let got = paged(&gw, bucket, prefix, delim, max).await;
                assert_eq!(got, want, "prefix {prefix:?} delimiter {delim:?} max-keys {max}");
            }
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn tree_conflicts_are_refused_and_emptied_directories_disappear() {
    let (gw, server) = gateway().await;
    let bucket = gw.store.bucket("bkt").await.expect("bucket").id;
    assert!(put(&gw, "x/y").await);
    assert!(!put(&gw, "x/y/z").await, "x/y is an object");
    assert!(!put(&gw, "x").await, "x holds objects");
    assert!(put(&gw, "x/d/").await);
    assert!(put(&gw, "x/d/e").await);
    gw.delete("bkt", "x/d/e").await.expect("delete");
    // x/d/ is still an object (a directory object), x/y too.
    let all = paged(&gw, bucket, "", None, 1000).await;
    assert_eq!(all, vec![Item::Key("x/d/".into()), Item::Key("x/y".into())]);
    gw.delete("bkt", "x/d/").await.expect("delete dir object");
    gw.delete("bkt", "x/y").await.expect("delete");
    assert!(paged(&gw, bucket, "", Some("/"), 1000).await.is_empty());
    let (entries, _) = gw.store.fs.meta().readdir(bucket, "", 10, false).await.expect("readdir");
    assert!(entries.is_empty(), "no directories left behind: {entries:?}");
    gw.delete_bucket("bkt").await.expect("empty bucket deletes");
    server.shutdown().await;
}

/// A flat bucket stores any key set, `a/b` with `a/b/c`, `dir/` with
/// `dir/x`, keys a tree refuses (`/a`, `a//b`, `..`) and a "component"
/// over 255 bytes, and lists it exactly as S3's model does for every
/// prefix, delimiter and page size; deleting every key leaves the bucket
/// directory empty (no continuation directory behind).
#[tokio::test]
async fn flat_bucket_listing_matches_the_s3_model_for_keys_that_form_no_tree() {
    let (gw, server) = gateway().await;
    gw.create_bucket_with("flat", Layout::Flat).await.expect("flat bucket");
    let bucket = gw.store.bucket("flat").await.expect("bucket").id;
    assert_eq!(gw.store.layout(bucket).await.expect("layout"), Layout::Flat);
    let long = "L".repeat(300);
    let alphabet = ["a", "b", "a-", "a.", "0", " ", "é", "%", "+", "/", "/", "ab", "~", "..", long.as_str()];
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut keys: BTreeSet<Vec<u8>> = BTreeSet::new();
    for fixed in ["a/b", "a/b/c", "a/b/", "dir/", "dir/x", "/a", "a//b", ".."] {
        assert!(put_in(&gw, "flat", fixed).await, "{fixed:?} is a key of a flat bucket");
        keys.insert(fixed.as_bytes().to_vec());
    }
    for _ in 0..200 {
        let n = rng.gen_range(1..6);
        let k: String = (0..n).map(|_| alphabet[rng.gen_range(0..alphabet.len())]).collect();
        if k.len() > 1024 {
            continue;
        }
        assert!(put_in(&gw, "flat", &k).await, "{k:?} is a key of a flat bucket");
        keys.insert(k.into_bytes());
    }
    for prefix in ["", "a", "a/", "a/b", "a/b/", "/", "a-", "L", "é", "zz"] {
        for delim in [None, Some("/"), Some("-"), Some("a/"), Some("L")] {
            let want = model(&keys, prefix, delim);
            for max in [1, 3, 1000] {
                let got = paged_in(&gw, Layout::Flat, bucket, prefix, delim, max).await;
                assert_eq!(got, want, "prefix {prefix:?} delimiter {delim:?} max-keys {max}");
            }
        }
    }
    // Each object reads back by its key.
    for k in keys.iter().take(40) {
        let k = String::from_utf8(k.clone()).expect("utf8");
        let input = s3s::dto::HeadObjectInput { bucket: "flat".into(), key: k.clone(), ..Default::default() };
        let h = gw.head(&input).await;
        assert!(h.is_ok(), "HEAD {k:?}: {:?}", h.err());
    }
    for k in &keys {
        gw.delete("flat", std::str::from_utf8(k).expect("utf8")).await.expect("delete");
    }
    assert!(paged_in(&gw, Layout::Flat, bucket, "", None, 1000).await.is_empty());
    let (entries, _) = gw.store.fs.meta().readdir(bucket, "", 10, false).await.expect("readdir");
    assert!(entries.is_empty(), "nothing left behind: {entries:?}");
    server.shutdown().await;
}
