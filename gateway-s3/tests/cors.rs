//! Put/Get/DeleteBucketCors at the handler level: stored, given back as
//! put, validated, deleted. The preflight and response headers are tested
//! over HTTP by `conformance/s3/test_s3_features.py` and as pure functions
//! in `src/cors.rs`.

mod common;

use s3s::dto::*;
use s3s::S3ErrorCode;

fn rules(methods: &[&str]) -> CORSConfiguration {
    CORSConfiguration {
        cors_rules: vec![CORSRule {
            allowed_headers: Some(vec!["*".into()]),
            allowed_methods: methods.iter().map(|m| AllowedMethod::from(m.to_string())).collect(),
            allowed_origins: vec!["https://app.example.com".into()],
            expose_headers: Some(vec!["ETag".into()]),
            id: Some("r".into()),
            max_age_seconds: Some(60),
        }],
    }
}

fn put_input(cfg: CORSConfiguration) -> PutBucketCorsInput {
    PutBucketCorsInput {
        bucket: "bkt".into(),
        cors_configuration: cfg,
        checksum_algorithm: None,
        content_md5: None,
        expected_bucket_owner: None,
    }
}

#[tokio::test]
async fn cors_configuration_is_stored_validated_and_deleted() {
    let (gw, server) = common::gateway(|_| {}).await;
    let e = gw.get_cors("bkt").await.expect_err("none yet");
    assert_eq!(e.code(), &S3ErrorCode::NoSuchCORSConfiguration);
    gw.put_cors(&put_input(rules(&["GET", "PUT"]))).await.expect("put");
    let got = gw.get_cors("bkt").await.expect("get").cors_rules.expect("rules");
    assert_eq!(got, rules(&["GET", "PUT"]).cors_rules);
    // A refused configuration leaves the stored one as it was.
    let e = gw.put_cors(&put_input(rules(&["PATCH"]))).await.expect_err("bad method");
    assert_eq!(e.code(), &S3ErrorCode::InvalidRequest);
    assert_eq!(gw.get_cors("bkt").await.expect("get").cors_rules.expect("rules"), rules(&["GET", "PUT"]).cors_rules);
    gw.delete_cors("bkt").await.expect("delete");
    gw.delete_cors("bkt").await.expect("delete again");
    assert_eq!(gw.get_cors("bkt").await.expect_err("gone").code(), &S3ErrorCode::NoSuchCORSConfiguration);
    let e = gw.get_cors("nobucket").await.expect_err("no bucket");
    assert_eq!(e.code(), &S3ErrorCode::NoSuchBucket);
    server.shutdown().await;
}
