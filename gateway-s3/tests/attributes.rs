//! GetObjectAttributes at the handler level (inline objects, no storage):
//! ETag, size, storage class, checksums, and the parts of a multipart
//! object paged by `MaxParts` / `PartNumberMarker`. The same with boto3 in
//! `conformance/s3/test_s3_features.py`.

mod common;

use s3s::dto::*;
use s3s::S3ErrorCode;

fn attrs(key: &str, names: &[&str], marker: Option<i32>, max: Option<i32>) -> GetObjectAttributesInput {
    GetObjectAttributesInput {
        bucket: "bkt".into(),
        key: key.into(),
        object_attributes: names.iter().map(|n| ObjectAttributes::from(n.to_string())).collect(),
        part_number_marker: marker,
        max_parts: max,
        ..Default::default()
    }
}

async fn multipart(gw: &fskv_gateway_s3::ops::Gateway, key: &str, parts: &[&[u8]], algorithm: Option<&str>) -> String {
    let create = CreateMultipartUploadInput {
        bucket: "bkt".into(),
        key: key.into(),
        checksum_algorithm: algorithm.map(|a| ChecksumAlgorithm::from(a.to_string())),
        ..Default::default()
    };
    let id = gw.create_upload(&create).await.expect("create").upload_id.expect("id");
    let mut done = Vec::new();
    for (i, data) in parts.iter().enumerate() {
        let input = UploadPartInput {
            bucket: "bkt".into(),
            key: key.into(),
            upload_id: id.clone(),
            part_number: i as i32 + 1,
            body: Some(common::blob(data)),
            ..Default::default()
        };
        let e = gw.upload_part(input, &http::HeaderMap::new(), None, None).await.expect("part").e_tag;
        done.push(CompletedPart { part_number: Some(i as i32 + 1), e_tag: e, ..Default::default() });
    }
    let complete = CompleteMultipartUploadInput {
        bucket: "bkt".into(),
        key: key.into(),
        upload_id: id,
        multipart_upload: Some(CompletedMultipartUpload { parts: Some(done) }),
        ..Default::default()
    };
    gw.complete_upload(&complete).await.expect("complete").e_tag.expect("etag").value().to_string()
}

#[tokio::test]
async fn single_put_objects() {
    let (gw, server) = common::gateway(|_| {}).await;
    let args = common::put_args("bkt", "k");
    let mut headers = http::HeaderMap::new();
    // CRC32 of "hello" is 0x3610a686.
    headers.insert("x-amz-checksum-crc32", http::HeaderValue::from_static("NhCmhg=="));
    gw.put(args, Some(common::blob(b"hello")), &headers, None, None).await.expect("put");
    let all = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"];
    let out = gw.object_attributes(&attrs("k", &all, None, None)).await.expect("attributes");
    // As the header arrives: one comma-separated list.
    let joined = gw.object_attributes(&attrs("k", &[&all.join(",")], None, None)).await.expect("one header value");
    assert_eq!((joined.e_tag.is_some(), joined.object_size, joined.storage_class.is_some()), (true, Some(5), true));
    assert_eq!(out.e_tag.as_ref().map(|e| e.value()), Some("5d41402abc4b2a76b9719d911017c592"));
    assert_eq!(out.object_size, Some(5));
    assert_eq!(out.storage_class.as_ref().map(|s| s.as_str()), Some("STANDARD"));
    let sum = out.checksum.expect("checksum");
    assert_eq!(sum.checksum_crc32.as_deref(), Some("NhCmhg=="));
    assert_eq!(sum.checksum_type.as_ref().map(|t| t.as_str()), Some("FULL_OBJECT"));
    assert!(out.object_parts.is_none(), "a single PUT has no parts");
    assert!(out.last_modified.is_some());
    // Only what was asked for.
    let out = gw.object_attributes(&attrs("k", &["ObjectSize"], None, None)).await.expect("size only");
    assert!(out.e_tag.is_none() && out.checksum.is_none() && out.storage_class.is_none());
    assert_eq!(out.object_size, Some(5));
    // Errors.
    let e = gw.object_attributes(&attrs("k", &["Size"], None, None)).await.expect_err("bad name");
    assert_eq!(e.code(), &S3ErrorCode::InvalidArgument);
    let e = gw.object_attributes(&attrs("k", &["ETag"], None, Some(-1))).await.expect_err("negative");
    assert_eq!(e.code(), &S3ErrorCode::InvalidArgument);
    let e = gw.object_attributes(&attrs("missing", &["ETag"], None, None)).await.expect_err("missing");
    assert_eq!(e.code(), &S3ErrorCode::NoSuchKey);
    server.shutdown().await;
}

#[tokio::test]
async fn multipart_parts_are_paged() {
    let (gw, server) = common::gateway(|c| c.limits.min_part_bytes = 1).await;
    let parts: Vec<Vec<u8>> = (0..5u8).map(|i| vec![b'a' + i; 10 + i as usize]).collect();
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let etag = multipart(&gw, "mp", &refs, Some("CRC32")).await;
    let all = ["ETag", "ObjectParts", "ObjectSize"];
    let out = gw.object_attributes(&attrs("mp", &all, None, None)).await.expect("attributes");
    assert_eq!(out.e_tag.as_ref().map(|e| e.value()), Some(etag.trim_matches('"')));
    assert_eq!(out.object_size, Some(parts.iter().map(|p| p.len() as i64).sum()));
    let p = out.object_parts.expect("parts");
    assert_eq!((p.total_parts_count, p.is_truncated), (Some(5), Some(false)));
    let listed = p.parts.expect("part list");
    assert_eq!(listed.len(), 5);
    for (i, part) in listed.iter().enumerate() {
        assert_eq!(part.part_number, Some(i as i32 + 1));
        assert_eq!(part.size, Some(parts[i].len() as i64));
        assert!(part.checksum_crc32.is_some(), "part {} has its CRC32", i + 1);
    }
    // Pages of two.
    let mut marker = None;
    let mut seen = Vec::new();
    for _ in 0..5 {
        let p = gw.object_attributes(&attrs("mp", &["ObjectParts"], marker, Some(2))).await.expect("page").object_parts.expect("parts");
        seen.extend(p.parts.unwrap_or_default().iter().filter_map(|x| x.part_number));
        if p.is_truncated != Some(true) {
            break;
        }
        marker = p.next_part_number_marker;
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5]);
    // Without checksums: the count only, as S3.
    let etag2 = multipart(&gw, "plain", &refs[..3], None).await;
    assert!(etag2.ends_with("-3\"") || etag2.ends_with("-3"));
    let p = gw.object_attributes(&attrs("plain", &["ObjectParts"], None, None)).await.expect("plain").object_parts.expect("parts");
    assert_eq!(p.total_parts_count, Some(3));
    assert!(p.parts.is_none());
    server.shutdown().await;
}
