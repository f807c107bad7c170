//! Lifecycle rules at the handler level (inline objects, no storage), with
//! the scan's clock passed in and a day of 1 s: expiration by prefix and
//! tags, disabled rules, incomplete uploads aborted, configuration errors,
//! and the metrics of the scan. Never sleeps a day.

mod common;

use fskv_gateway_s3::ops::lifecycle::LifecycleMetrics;
use fskv_gateway_s3::ops::write::now_ns;
use s3s::dto::*;
use s3s::S3ErrorCode;

const DAY_MS: u64 = 1000;
const DAY_NS: u64 = DAY_MS * 1_000_000;

async fn put(gw: &fskv_gateway_s3::ops::Gateway, key: &str, tags: Option<Vec<(String, String)>>) {
    let args = fskv_gateway_s3::ops::object::PutArgs { tags, ..common::put_args("bkt", key) };
    gw.put(args, Some(common::blob(b"data")), &http::HeaderMap::new(), None, None).await.expect("put");
}

async fn keys(gw: &fskv_gateway_s3::ops::Gateway) -> Vec<String> {
    let out = gw.list_v2(&ListObjectsV2Input { bucket: "bkt".into(), ..Default::default() }).await.expect("list");
    out.contents.unwrap_or_default().into_iter().filter_map(|o| o.key).collect()
}

fn rule(id: &str, status: &str) -> LifecycleRule {
    LifecycleRule {
        abort_incomplete_multipart_upload: None,
        expiration: None,
        filter: None,
        id: Some(id.into()),
        noncurrent_version_expiration: None,
        noncurrent_version_transitions: None,
        prefix: None,
        status: ExpirationStatus::from(status.to_string()),
        transitions: None,
    }
}

fn config(rules: Vec<LifecycleRule>) -> PutBucketLifecycleConfigurationInput {
    PutBucketLifecycleConfigurationInput {
        bucket: "bkt".into(),
        checksum_algorithm: None,
        expected_bucket_owner: None,
        lifecycle_configuration: Some(BucketLifecycleConfiguration { rules }),
        transition_default_minimum_object_size: None,
    }
}

#[tokio::test]
async fn rules_expire_objects_and_abort_uploads_on_the_scan_clock() {
    let (gw, server) = common::gateway(|c| {
        c.limits.lifecycle_day_ms = DAY_MS;
        c.limits.lifecycle_max_actions_per_second = 10_000;
    })
    .await;
    let t0 = now_ns();
    put(&gw, "tmp/a", None).await;
    put(&gw, "tmp/deep/b", None).await;
    put(&gw, "keep/c", None).await;
    put(&gw, "logs/scratch", Some(vec![("class".into(), "scratch".into())])).await;
    put(&gw, "logs/kept", Some(vec![("class".into(), "gold".into())])).await;
    put(&gw, "off/x", None).await;
    let create = CreateMultipartUploadInput { bucket: "bkt".into(), key: "tmp/upload".into(), ..Default::default() };
    let upload = gw.create_upload(&create).await.expect("create").upload_id.expect("id");

    let mut tmp = rule("tmp", "Enabled");
    tmp.filter = Some(LifecycleRuleFilter { prefix: Some("tmp/".into()), ..Default::default() });
    tmp.expiration = Some(LifecycleExpiration { days: Some(2), ..Default::default() });
    tmp.abort_incomplete_multipart_upload = Some(AbortIncompleteMultipartUpload { days_after_initiation: Some(1) });
    let mut tagged = rule("tagged", "Enabled");
    tagged.filter = Some(LifecycleRuleFilter {
        and: Some(LifecycleRuleAndOperator {
            prefix: Some("logs/".into()),
            tags: Some(vec![Tag { key: Some("class".into()), value: Some("scratch".into()) }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    tagged.expiration = Some(LifecycleExpiration { days: Some(1), ..Default::default() });
    let mut off = rule("off", "Disabled");
    off.prefix = Some("off/".into());
    off.expiration = Some(LifecycleExpiration { days: Some(1), ..Default::default() });
    gw.put_lifecycle(&config(vec![tmp, tagged, off])).await.expect("put lifecycle");
    let got = gw.get_lifecycle("bkt").await.expect("get").rules.expect("rules");
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].id.as_deref(), Some("tmp"));

    let m = LifecycleMetrics::default();
    // Nothing is due yet.
    let r = gw.run_lifecycle(t0, &m).await;
    assert_eq!((r.buckets, r.expired, r.aborted, r.errors), (1, 0, 0, 0));
    assert_eq!(keys(&gw).await.len(), 6);
    // A day and a bit later: the upload (1 day) and the scratch log (1 day, tag) go.
    let r = gw.run_lifecycle(t0 + DAY_NS + DAY_NS / 2, &m).await;
    assert_eq!((r.expired, r.aborted, r.errors), (1, 1, 0), "{r:?}");
    assert_eq!(keys(&gw).await, vec!["keep/c", "logs/kept", "off/x", "tmp/a", "tmp/deep/b"]);
    let ups = gw.list_uploads(&ListMultipartUploadsInput { bucket: "bkt".into(), ..Default::default() }).await.expect("uploads");
    assert!(ups.uploads.unwrap_or_default().iter().all(|u| u.upload_id.as_deref() != Some(upload.as_str())));
    // Three days: tmp/ goes (its emptied directory too); the disabled rule keeps off/x.
    let r = gw.run_lifecycle(t0 + 3 * DAY_NS, &m).await;
    assert_eq!((r.expired, r.aborted, r.errors), (2, 0, 0), "{r:?}");
    assert_eq!(keys(&gw).await, vec!["keep/c", "logs/kept", "off/x"]);
    let listed =
        gw.list_v2(&ListObjectsV2Input { bucket: "bkt".into(), delimiter: Some("/".into()), ..Default::default() }).await.expect("list");
    let prefixes: Vec<String> = listed.common_prefixes.unwrap_or_default().into_iter().filter_map(|p| p.prefix).collect();
    assert_eq!(prefixes, vec!["keep/", "logs/", "off/"], "tmp/ was emptied and removed");
    // Progress in the metrics.
    assert_eq!((m.scans.get(), m.objects_expired.get(), m.uploads_aborted.get(), m.errors.get()), (3, 3, 1, 0));
    assert!(m.objects_examined.get() >= 6);
    // An object written after the rule's age is kept: its mtime is new.
    put(&gw, "tmp/new", None).await;
    let r = gw.run_lifecycle(now_ns() + DAY_NS, &m).await;
    assert_eq!(r.expired, 0);
    // Deleting the configuration stops everything.
    gw.delete_lifecycle("bkt").await.expect("delete");
    let e = gw.get_lifecycle("bkt").await.expect_err("gone");
    assert_eq!(e.code(), &S3ErrorCode::NoSuchLifecycleConfiguration);
    let r = gw.run_lifecycle(now_ns() + 100 * DAY_NS, &m).await;
    assert_eq!((r.buckets, r.expired), (0, 0));
    server.shutdown().await;
}

#[tokio::test]
async fn bad_configurations_are_refused() {
    let (gw, server) = common::gateway(|_| {}).await;
    let mut nc = rule("nc", "Enabled");
    nc.noncurrent_version_expiration = Some(NoncurrentVersionExpiration { noncurrent_days: Some(0), newer_noncurrent_versions: None });
    let e = gw.put_lifecycle(&config(vec![nc])).await.expect_err("noncurrent days 0");
    assert_eq!(e.code(), &S3ErrorCode::InvalidArgument);
    let e = gw.put_lifecycle(&config(vec![rule("empty", "Enabled")])).await.expect_err("no action");
    assert_eq!(e.code(), &S3ErrorCode::InvalidRequest);
    let e = gw.put_lifecycle(&config(vec![])).await.expect_err("no rules");
    assert_eq!(e.code(), &S3ErrorCode::MalformedXML);
    let e = gw.get_lifecycle("bkt").await.expect_err("nothing stored");
    assert_eq!(e.code(), &S3ErrorCode::NoSuchLifecycleConfiguration);
    server.shutdown().await;
}

#[tokio::test]
async fn a_writer_runs_the_scan_by_itself_and_reports_it_in_metrics() {
    let (gw, server) = common::gateway(|_| {}).await;
    let mut cfg = (*gw.cfg).clone();
    cfg.limits.lifecycle_day_ms = 1;
    cfg.limits.lifecycle_scan_interval_ms = 100;
    let handle = fskv_gateway_s3::start(cfg, gw.store.fs.clone()).await.expect("start");
    let served = &handle.gateway;
    put(served, "old/x", None).await;
    let mut r = rule("old", "Enabled");
    r.prefix = Some("old/".into());
    r.expiration = Some(LifecycleExpiration { days: Some(1), ..Default::default() });
    served.put_lifecycle(&config(vec![r])).await.expect("put lifecycle");
    // A day of 1 ms, a scan every 100 ms: gone within a few scans (bounded wait).
    let mut gone = false;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if keys(served).await.is_empty() {
            gone = true;
            break;
        }
    }
    assert!(gone, "the writer's lifecycle scan did not expire old/x within 5 s");
    // The scan adds its counts when it ends, after its deletes are visible:
    // wait (bounded) for the scan that deleted old/x to report it.
    let mut expired = String::new();
    for _ in 0..50 {
        let text = handle.metrics.render();
        expired = text.lines().find(|l| l.starts_with("fskv_gateway_s3_lifecycle_objects_expired_total")).expect("metric").to_string();
        if expired.ends_with(" 1") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(expired.ends_with(" 1"), "{expired}");
    handle.stop().await;
    server.shutdown().await;
}

/// Versioned bucket: noncurrent versions expire N days after they became
/// noncurrent (the next newer version's time), the K newest noncurrent ones
/// are kept, expiring the current object leaves a delete marker, and a
/// marker that is its key's only version is removed.
#[tokio::test]
async fn noncurrent_versions_and_lone_markers_expire() {
    let (gw, server) = common::gateway(|c| {
        c.limits.lifecycle_day_ms = DAY_MS;
        c.limits.lifecycle_max_actions_per_second = 10_000;
    })
    .await;
    let conf = VersioningConfiguration {
        status: Some(BucketVersioningStatus::from_static(BucketVersioningStatus::ENABLED)),
        ..Default::default()
    };
    let input = PutBucketVersioningInput::builder().bucket("bkt".into()).versioning_configuration(conf).build().expect("input");
    gw.put_bucket_versioning(&input).await.expect("versioning");
    let t0 = now_ns();
    for _ in 0..4 {
        put(&gw, "doc", None).await; // doc: 1 current + 3 noncurrent
    }
    put(&gw, "gone", None).await;
    gw.delete("bkt", "gone").await.expect("delete"); // gone: marker + 1 noncurrent
    let mut nc = rule("nc", "Enabled");
    nc.noncurrent_version_expiration = Some(NoncurrentVersionExpiration { noncurrent_days: Some(1), newer_noncurrent_versions: Some(1) });
    let mut markers = rule("markers", "Enabled");
    markers.expiration = Some(LifecycleExpiration { expired_object_delete_marker: Some(true), ..Default::default() });
    gw.put_lifecycle(&config(vec![nc, markers])).await.expect("put lifecycle");
    let versions = |gw: fskv_gateway_s3::ops::Gateway| async move {
        let (out, _) = gw.list_versions(&ListObjectVersionsInput { bucket: "bkt".into(), ..Default::default() }).await.expect("versions");
        (out.versions.unwrap_or_default().len(), out.delete_markers.unwrap_or_default().len())
    };
    assert_eq!(versions(gw.clone()).await, (5, 1));
    let m = LifecycleMetrics::default();
    let r = gw.run_lifecycle(t0, &m).await;
    assert_eq!((r.versions_expired, r.errors), (0, 0), "nothing is a day old");
    // Two days on: doc keeps its current and its newest noncurrent version;
    // gone's only noncurrent version is the one kept.
    let r = gw.run_lifecycle(t0 + 2 * DAY_NS, &m).await;
    assert_eq!((r.versions_expired, r.errors), (2, 0), "{r:?}");
    assert_eq!(versions(gw.clone()).await, (3, 1));
    // Without the kept count, gone's version goes too, and then its lone marker.
    let mut nc = rule("nc", "Enabled");
    nc.noncurrent_version_expiration = Some(NoncurrentVersionExpiration { noncurrent_days: Some(1), newer_noncurrent_versions: None });
    let mut markers = rule("markers", "Enabled");
    markers.expiration = Some(LifecycleExpiration { expired_object_delete_marker: Some(true), ..Default::default() });
    gw.put_lifecycle(&config(vec![nc, markers])).await.expect("put lifecycle");
    // The rules run in order: once `nc` removed gone's version, `markers`
    // finds its marker alone and removes it in the same scan.
    let r = gw.run_lifecycle(t0 + 3 * DAY_NS, &m).await;
    assert_eq!((r.versions_expired, r.errors), (3, 0), "{r:?}");
    assert_eq!(versions(gw.clone()).await, (1, 0), "doc's current only");
    assert_eq!(m.versions_expired.get(), 5);
    // Expiring a current version in a versioned bucket leaves a marker.
    let mut cur = rule("cur", "Enabled");
    cur.expiration = Some(LifecycleExpiration { days: Some(1), ..Default::default() });
    gw.put_lifecycle(&config(vec![cur])).await.expect("put lifecycle");
    let r = gw.run_lifecycle(t0 + 5 * DAY_NS, &m).await;
    assert_eq!(r.expired, 1);
    assert_eq!(versions(gw.clone()).await, (1, 1));
    assert!(keys(&gw).await.is_empty());
    server.shutdown().await;
}
