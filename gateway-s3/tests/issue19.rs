//! Handler-level checks of the issue-19 fixes that need no storage (inline
//! objects): repeated completion, stale part attempts, path-less prefixes,
//! and the body limit on a body of unknown length. The same behaviours are
//! tested with real clients in `conformance/s3/test_issue19.py`.

mod common;

use futures::StreamExt;
use s3s::dto::*;
use s3s::S3ErrorCode;

/// A body in `pieces`, with no length known in advance (as a chunked request's).
fn unsized_blob(pieces: &[&'static [u8]]) -> StreamingBlob {
    let pieces: Vec<Result<bytes::Bytes, std::io::Error>> = pieces.iter().map(|p| Ok(bytes::Bytes::from_static(p))).collect();
    StreamingBlob::wrap(futures::stream::iter(pieces))
}

async fn part(gw: &fskv_gateway_s3::ops::Gateway, id: &str, n: i32, data: &[u8]) -> ETag {
    let input = UploadPartInput {
        bucket: "bkt".into(),
        key: "k".into(),
        upload_id: id.into(),
        part_number: n,
        // No length: the part is a file of its own (inline; the in-place
        // `data` file would need storage).
        body: Some(common::blob(data)),
        ..Default::default()
    };
    gw.upload_part(input, &http::HeaderMap::new(), None, None).await.expect("part").e_tag.expect("etag")
}

fn complete_input(id: &str, etags: &[ETag]) -> CompleteMultipartUploadInput {
    let parts = etags
        .iter()
        .enumerate()
        .map(|(i, e)| CompletedPart { part_number: Some(i as i32 + 1), e_tag: Some(e.clone()), ..Default::default() })
        .collect();
    CompleteMultipartUploadInput {
        bucket: "bkt".into(),
        key: "k".into(),
        upload_id: id.into(),
        multipart_upload: Some(CompletedMultipartUpload { parts: Some(parts) }),
        ..Default::default()
    }
}

async fn new_upload(gw: &fskv_gateway_s3::ops::Gateway) -> String {
    let create = CreateMultipartUploadInput { bucket: "bkt".into(), key: "k".into(), ..Default::default() };
    gw.create_upload(&create).await.expect("create").upload_id.expect("id")
}

#[tokio::test]
async fn a_repeated_completion_gets_the_first_answer_while_the_object_is_current() {
    let (gw, server) = common::gateway(|c| c.limits.min_part_bytes = 1).await;
    let id = new_upload(&gw).await;
    let etags = vec![part(&gw, &id, 1, b"first part").await, part(&gw, &id, 2, b"second").await];
    let first = gw.complete_upload(&complete_input(&id, &etags)).await.expect("complete");
    let again = gw.complete_upload(&complete_input(&id, &etags)).await.expect("completion retried");
    assert_eq!(first.e_tag, again.e_tag);
    assert_eq!(first.location, again.location);
    // Another part list is another request: the upload is gone.
    let other = gw.complete_upload(&complete_input(&id, &etags[..1])).await.expect_err("other list");
    assert_eq!(other.code(), &S3ErrorCode::NoSuchUpload);
    // Overwritten: the completion is forgotten.
    let put = PutObjectInput { bucket: "bkt".into(), key: "k".into(), ..Default::default() };
    let args = common::put_args(&put.bucket, &put.key);
    gw.put(args, Some(common::blob(b"newer")), &http::HeaderMap::new(), None, None).await.expect("put");
    let gone = gw.complete_upload(&complete_input(&id, &etags)).await.expect_err("after overwrite");
    assert_eq!(gone.code(), &S3ErrorCode::NoSuchUpload);
    server.shutdown().await;
}

#[tokio::test]
async fn a_part_uploaded_again_later_replaces_the_earlier_one() {
    let (gw, server) = common::gateway(|c| c.limits.min_part_bytes = 1).await;
    let id = new_upload(&gw).await;
    let old = part(&gw, &id, 1, b"old bytes").await;
    let new = part(&gw, &id, 1, b"new bytes!").await;
    let listed = gw
        .list_parts(&ListPartsInput { bucket: "bkt".into(), key: "k".into(), upload_id: id.clone(), ..Default::default() })
        .await
        .expect("list parts");
    let parts = listed.parts.expect("parts");
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].e_tag.as_ref().map(|e| e.value().to_string()), Some(new.value().to_string()));
    let stale = gw.complete_upload(&complete_input(&id, &[old])).await.expect_err("stale ETag");
    assert_eq!(stale.code(), &S3ErrorCode::InvalidPart);
    gw.complete_upload(&complete_input(&id, &[new])).await.expect("complete");
    let out = gw.get(&GetObjectInput { bucket: "bkt".into(), key: "k".into(), ..Default::default() }).await.expect("get");
    let mut body = out.body.expect("body");
    let mut got = Vec::new();
    while let Some(b) = body.next().await {
        got.extend_from_slice(&b.expect("bytes"));
    }
    assert_eq!(got, b"new bytes!");
    server.shutdown().await;
}

#[tokio::test]
async fn prefixes_naming_no_path_list_nothing() {
    let (gw, server) = common::gateway(|_| {}).await;
    for key in ["b/a/r", "g"] {
        let args = common::put_args("bkt", key);
        gw.put(args, Some(common::blob(b"x")), &http::HeaderMap::new(), None, None).await.expect("put");
    }
    for prefix in ["/", "//", "/b", "b//", "b//a", "./", "b/../"] {
        for delimiter in [Some("d"), Some("/"), None] {
            let input = ListObjectsV2Input {
                bucket: "bkt".into(),
                prefix: Some(prefix.into()),
                delimiter: delimiter.map(str::to_string),
                ..Default::default()
            };
            let out = gw.list_v2(&input).await.expect("list");
            assert_eq!(out.key_count, Some(0), "prefix {prefix:?} delimiter {delimiter:?}: {out:?}");
        }
    }
    let all =
        gw.list_v2(&ListObjectsV2Input { bucket: "bkt".into(), delimiter: Some("d".into()), ..Default::default() }).await.expect("list");
    let keys: Vec<String> = all.contents.unwrap_or_default().into_iter().filter_map(|o| o.key).collect();
    assert_eq!(keys, ["b/a/r", "g"]);
    // An empty delimiter is no delimiter.
    let empty =
        gw.list_v2(&ListObjectsV2Input { bucket: "bkt".into(), delimiter: Some(String::new()), ..Default::default() }).await.expect("list");
    assert_eq!(empty.delimiter, None);
    assert_eq!(empty.key_count, Some(2));
    server.shutdown().await;
}

#[tokio::test]
async fn a_body_of_unknown_length_stops_at_the_object_limit() {
    let (gw, server) = common::gateway(|c| c.limits.max_object_bytes = 10).await;
    let args = common::put_args("bkt", "big");
    let err = gw
        .put(args, Some(unsized_blob(&[b"12345", b"67890", b"x", b"never read"])), &http::HeaderMap::new(), None, None)
        .await
        .expect_err("too large");
    assert_eq!(err.code(), &S3ErrorCode::EntityTooLarge);
    let head = gw.head(&HeadObjectInput { bucket: "bkt".into(), key: "big".into(), ..Default::default() }).await.expect_err("nothing");
    assert_eq!(head.code(), &S3ErrorCode::NoSuchKey);
    // At the limit it is stored.
    let args = common::put_args("bkt", "fits");
    let meta = gw.put(args, Some(unsized_blob(&[b"12345", b"67890"])), &http::HeaderMap::new(), None, None).await.expect("fits").meta;
    assert_eq!(meta.size, 10);
    server.shutdown().await;
}
