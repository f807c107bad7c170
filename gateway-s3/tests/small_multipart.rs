//! Multipart uploads whose object is small enough to be inline (only a meta
//! service runs): part bytes come back in order, ETags as AWS computes them.

mod common;

use futures::StreamExt;
use s3s::dto::*;

fn blob(data: &[u8]) -> StreamingBlob {
    let b = bytes::Bytes::copy_from_slice(data);
    StreamingBlob::wrap(futures::stream::once(async move { Ok::<_, std::io::Error>(b) }))
}

#[tokio::test]
async fn small_multipart_objects_keep_their_bytes() {
    let (gw, server) = common::gateway(|c| c.limits.min_part_bytes = 1).await;
    let create = CreateMultipartUploadInput { bucket: "bkt".into(), key: "k".into(), ..Default::default() };
    let id = gw.create_upload(&create).await.expect("create").upload_id.expect("id");
    let parts: Vec<Vec<u8>> = vec![vec![1u8; 1001], vec![2u8; 7]];
    let mut etags = Vec::new();
    for (i, p) in parts.iter().enumerate().rev() {
        let input = UploadPartInput {
            bucket: "bkt".into(),
            key: "k".into(),
            upload_id: id.clone(),
            part_number: i as i32 + 1,
            body: Some(blob(p)),
            ..Default::default()
        };
        let out = gw.upload_part(input, &http::HeaderMap::new(), None, None).await.expect("part");
        etags.insert(0, out.e_tag.expect("etag"));
    }
    let completed = CompletedMultipartUpload {
        parts: Some(
            etags
                .iter()
                .enumerate()
                .map(|(i, e)| CompletedPart { part_number: Some(i as i32 + 1), e_tag: Some(e.clone()), ..Default::default() })
                .collect(),
        ),
    };
    let input = CompleteMultipartUploadInput {
        bucket: "bkt".into(),
        key: "k".into(),
        upload_id: id,
        multipart_upload: Some(completed),
        ..Default::default()
    };
    let done = gw.complete_upload(&input).await.expect("complete");
    let etag = done.e_tag.expect("etag");
    assert!(etag.value().ends_with("-2"), "{etag:?}");
    let get = GetObjectInput { bucket: "bkt".into(), key: "k".into(), ..Default::default() };
    let out = gw.get(&get).await.expect("get");
    assert_eq!(out.e_tag.as_ref().map(|e| e.value().to_string()), Some(etag.value().to_string()));
    let mut body = out.body.expect("body");
    let mut got = Vec::new();
    while let Some(b) = body.next().await {
        got.extend_from_slice(&b.expect("bytes"));
    }
    assert_eq!(got, [parts[0].clone(), parts[1].clone()].concat());
    server.shutdown().await;
}
