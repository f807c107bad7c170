//! GET and HEAD find the bucket, the key and its record in one meta call
//! once the gateway has seen the bucket (`Store::locate_find`, a meta
//! `WalkXattr`): what they answer must not depend on that, also when
//! another gateway process deletes the bucket or makes it again with
//! another layout under the same name.

mod common;

use fskv_gateway_s3::paths::Layout;
use futures::StreamExt;
use http::HeaderMap;
use s3s::dto::{GetObjectInput, HeadObjectInput};
use s3s::{S3Error, S3ErrorCode};

async fn put(gw: &fskv_gateway_s3::ops::Gateway, bucket: &str, key: &str, data: &[u8]) {
    let body = common::blob(data);
    gw.put(common::put_args(bucket, key), Some(body), &HeaderMap::new(), None, None).await.expect("put");
}

/// The body of `bucket/key` through `gw`, or the error it answers.
async fn get(gw: &fskv_gateway_s3::ops::Gateway, bucket: &str, key: &str) -> Result<Vec<u8>, S3Error> {
    let out = gw.get(&GetObjectInput { bucket: bucket.into(), key: key.into(), ..Default::default() }).await?;
    let mut body = out.body.expect("body");
    let mut got = Vec::new();
    while let Some(b) = body.next().await {
        got.extend_from_slice(&b.expect("bytes"));
    }
    Ok(got)
}

fn code<T>(r: Result<T, S3Error>) -> S3ErrorCode {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.code().clone(),
    }
}

#[tokio::test]
async fn reads_follow_a_bucket_another_gateway_deletes_or_makes_again() {
    let (reader, server) = common::gateway(|_| {}).await;
    let other = common::gateway_on(&server, |_| {}).await;
    put(&other, "bkt", "a/b", b"tree a/b").await;
    put(&other, "bkt", "top", b"tree top").await;
    put(&other, "bkt", "d/", b"").await;
    // Twice each: the first read learns the bucket's directory and layout,
    // the second walks from the root in one call.
    for _ in 0..2 {
        assert_eq!(get(&reader, "bkt", "a/b").await.expect("get"), b"tree a/b");
        assert_eq!(get(&reader, "bkt", "top").await.expect("get"), b"tree top");
        assert!(reader.head(&HeadObjectInput { bucket: "bkt".into(), key: "d/".into(), ..Default::default() }).await.is_ok());
        assert_eq!(code(get(&reader, "bkt", "a/b/c").await), S3ErrorCode::NoSuchKey, "a file where a directory would be");
        assert_eq!(code(get(&reader, "bkt", "a").await), S3ErrorCode::NoSuchKey, "a directory that is no object");
        assert_eq!(code(get(&reader, "bkt", "missing/x").await), S3ErrorCode::NoSuchKey);
    }
    // Another gateway empties and deletes the bucket: NoSuchBucket.
    for key in ["a/b", "top", "d/"] {
        other.delete("bkt", key).await.expect("delete");
    }
    other.delete_bucket("bkt").await.expect("delete bucket");
    assert_eq!(code(get(&reader, "bkt", "a/b").await), S3ErrorCode::NoSuchBucket);
    // ... and makes it again, flat: `a/b` and `a/b/c` both objects, which
    // a walk by the old tree layout would not find.
    other.create_bucket_with("bkt", Layout::Flat).await.expect("flat bucket");
    put(&other, "bkt", "a/b", b"flat a/b").await;
    put(&other, "bkt", "a/b/c", b"flat a/b/c").await;
    for _ in 0..2 {
        assert_eq!(get(&reader, "bkt", "a/b/c").await.expect("get"), b"flat a/b/c");
        assert_eq!(get(&reader, "bkt", "a/b").await.expect("get"), b"flat a/b");
        assert_eq!(code(get(&reader, "bkt", "top").await), S3ErrorCode::NoSuchKey);
    }
    server.shutdown().await;
}
