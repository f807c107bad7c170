//! Put/Get/DeleteBucketLifecycleConfiguration (the rules live in the
//! bucket directory's `user.s3.lifecycle` xattr, replaced whole by one meta
//! call) and the writer's lifecycle scan, which applies them.
//!
//! **The scan** ([`Gateway::run_lifecycle`], every
//! `lifecycle_scan_interval_ms` on a writer; the time is a parameter):
//!
//! | step | what |
//! |---|---|
//! | buckets | every bucket directory with a `user.s3.lifecycle` xattr |
//! | objects | per enabled rule with an expiration: a ListObjectsV2 walk of the rule's prefix, 1000 keys a page; a key whose listed size and mtime make it due is looked up again (fresh inode, record, tags when the filter has tags) and judged again |
//! | delete | a file: unlinked only if the name still points to the inode at the version judged (`unlink_expected`): an object overwritten meanwhile is kept; emptied directories removed as DeleteObject does. A directory object: its record removed (DeleteObject) |
//! | uploads | per enabled rule with `AbortIncompleteMultipartUpload`: ListMultipartUploads of the prefix, each due upload aborted |
//! | versions | per enabled rule with `NoncurrentVersionExpiration` or `ExpiredObjectDeleteMarker`: a walk of the bucket's version store from the prefix (per key newest first, the current object looked up once per key); a due noncurrent version, or a delete marker that is its key's only version, removed by compare-and-delete of the entry judged |
//! | pace | at most `lifecycle_max_actions_per_second` deletes and aborts per second; listing is not paced (it is what a client listing costs) |
//! | progress | metrics `fskv_gateway_s3_lifecycle_*`: scans, objects examined, expired, uploads aborted, errors |
//!
//! A failed action is counted, logged and left for the next scan.

use super::object::find_object;
use super::versioning::StoreEntry;
use super::Gateway;
use crate::error;
use crate::lifecycle::{self, Rule, XATTR_LIFECYCLE};
use crate::paths;
use crate::versions;
use fskv_client::keywalk::Walker as KeyWalker;
use fskv_proto::meta::{Expected, InodeKind};
use fskv_types::{ErrorCode, InodeId};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode};
use std::time::Duration;

/// Progress of the lifecycle scans (registered under `fskv_gateway_s3_lifecycle_`).
#[derive(Clone, Debug, Default)]
pub struct LifecycleMetrics {
    pub scans: Counter,
    pub objects_examined: Counter,
    pub objects_expired: Counter,
    pub uploads_aborted: Counter,
    pub versions_expired: Counter,
    pub errors: Counter,
}

impl LifecycleMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("s3_lifecycle");
        r.register("scans", "Lifecycle scans finished", self.scans.clone());
        r.register("objects_examined", "Objects listed by lifecycle scans under a rule's prefix", self.objects_examined.clone());
        r.register("objects_expired", "Objects deleted by lifecycle expiration rules", self.objects_expired.clone());
        r.register("uploads_aborted", "Incomplete multipart uploads aborted by lifecycle rules", self.uploads_aborted.clone());
        r.register(
            "versions_expired",
            "Noncurrent versions and lone delete markers removed by lifecycle rules",
            self.versions_expired.clone(),
        );
        r.register("errors", "Lifecycle actions that failed (retried by the next scan)", self.errors.clone());
    }
}

/// What one scan did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    pub buckets: u64,
    pub examined: u64,
    pub expired: u64,
    pub aborted: u64,
    /// Noncurrent versions and lone delete markers removed.
    pub versions_expired: u64,
    pub errors: u64,
}

/// One key's store entries as the version walk meets them.
#[derive(Default)]
struct VersionGroup {
    key: Option<String>,
    /// mtime of the version just newer than the next entry (`None`: no
    /// current object and no entry yet).
    newer_mtime_ns: Option<u64>,
    /// Noncurrent entries met so far.
    noncurrent: usize,
    entries: usize,
    /// The newest entry when there is no current object (the latest version).
    latest: Option<StoreEntry>,
}

/// Spaces actions `1 / per_second` apart.
struct Pacer {
    every: Duration,
    next: tokio::time::Instant,
}

impl Pacer {
    fn new(per_second: u32) -> Pacer {
        Pacer { every: Duration::from_secs(1) / per_second.max(1), next: tokio::time::Instant::now() }
    }

    async fn wait(&mut self) {
        let now = tokio::time::Instant::now();
        if self.next > now {
            tokio::time::sleep_until(self.next).await;
        }
        self.next = self.next.max(now) + self.every;
    }
}

fn ts_ns(t: &Timestamp) -> u64 {
    u64::try_from(time::OffsetDateTime::from(t.clone()).unix_timestamp_nanos()).unwrap_or(0)
}

impl Gateway {
    pub async fn put_lifecycle(&self, input: &PutBucketLifecycleConfigurationInput) -> Result<(), S3Error> {
        let config = input
            .lifecycle_configuration
            .as_ref()
            .ok_or_else(|| S3Error::with_message(S3ErrorCode::MalformedXML, "no LifecycleConfiguration in the body"))?;
        let rules = lifecycle::from_dto(&config.rules)?;
        let stored = lifecycle::encode(&rules)?;
        let b = self.store.bucket(&input.bucket).await?.id;
        self.store
            .fs
            .meta()
            .set_xattr(b, XATTR_LIFECYCLE, &stored, fskv_proto::meta::XattrFlag::Any)
            .await
            .map_err(|e| error::from_meta(e, &input.bucket))
    }

    pub async fn get_lifecycle(&self, bucket: &str) -> Result<GetBucketLifecycleConfigurationOutput, S3Error> {
        let b = self.store.bucket(bucket).await?.id;
        match self.lifecycle_rules(b, bucket).await? {
            Some(rules) if !rules.is_empty() => Ok(GetBucketLifecycleConfigurationOutput {
                rules: Some(rules.iter().map(lifecycle::to_dto).collect()),
                transition_default_minimum_object_size: None,
            }),
            _ => Err(S3Error::with_message(
                S3ErrorCode::NoSuchLifecycleConfiguration,
                format!("bucket {bucket:?} has no lifecycle configuration"),
            )),
        }
    }

    pub async fn delete_lifecycle(&self, bucket: &str) -> Result<(), S3Error> {
        let b = self.store.bucket(bucket).await?.id;
        match self.store.fs.meta().remove_xattr(b, XATTR_LIFECYCLE).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
            Err(e) => Err(error::from_meta(e, bucket)),
        }
    }

    async fn lifecycle_rules(&self, dir: InodeId, bucket: &str) -> Result<Option<Vec<Rule>>, S3Error> {
        match self.store.fs.meta().get_xattr(dir, XATTR_LIFECYCLE).await {
            Ok(bytes) => Ok(Some(lifecycle::decode(&bytes))),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(error::from_meta(e, bucket)),
        }
    }

    /// One lifecycle scan of every bucket at time `now_ns` (module table).
    /// Call on a gateway without a caller (the writer's own work).
    pub async fn run_lifecycle(&self, now_ns: u64, m: &LifecycleMetrics) -> ScanReport {
        let mut report = ScanReport::default();
        let mut pacer = Pacer::new(self.cfg.limits.lifecycle_max_actions_per_second);
        let meta = self.store.fs.meta();
        let mut cursor = String::new();
        loop {
            let (entries, more) = match meta.readdir(self.store.root, &cursor, 1000, false).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "lifecycle scan: cannot list the buckets");
                    report.errors += 1;
                    break;
                }
            };
            for e in &entries {
                if e.kind != InodeKind::Directory || !paths::is_bucket_name(&e.name) {
                    continue;
                }
                let rules = match self.lifecycle_rules(e.inode, &e.name).await {
                    Ok(Some(r)) => r,
                    Ok(None) => continue,
                    Err(err) => {
                        tracing::warn!(bucket = %e.name, error = %err, "lifecycle scan: cannot read the rules");
                        report.errors += 1;
                        continue;
                    }
                };
                report.buckets += 1;
                for rule in rules.iter().filter(|r| r.enabled) {
                    self.expire_objects(&e.name, rule, now_ns, &mut pacer, &mut report).await;
                    if rule.acts_on_versions() {
                        if let Err(err) = self.expire_versions(&e.name, rule, now_ns, &mut pacer, &mut report).await {
                            tracing::warn!(bucket = %e.name, error = %err, "lifecycle scan: walking the versions failed");
                            report.errors += 1;
                        }
                    }
                    self.abort_uploads(&e.name, rule, now_ns, &mut pacer, &mut report).await;
                }
            }
            match entries.last() {
                Some(last) if more => cursor = last.name.clone(),
                _ => break,
            }
        }
        m.scans.inc();
        m.objects_examined.inc_by(report.examined);
        m.objects_expired.inc_by(report.expired);
        m.uploads_aborted.inc_by(report.aborted);
        m.versions_expired.inc_by(report.versions_expired);
        m.errors.inc_by(report.errors);
        report
    }

    async fn expire_objects(&self, bucket: &str, rule: &Rule, now_ns: u64, pacer: &mut Pacer, report: &mut ScanReport) {
        if rule.expiration_days.is_none() && rule.expiration_date_ns.is_none() {
            return;
        }
        let day_ms = self.cfg.limits.lifecycle_day_ms;
        let prefix = rule.criteria().prefix;
        let mut token = None;
        loop {
            let input = ListObjectsV2Input {
                bucket: bucket.to_string(),
                prefix: (!prefix.is_empty()).then(|| prefix.clone()),
                continuation_token: token.take(),
                max_keys: Some(1000),
                ..Default::default()
            };
            let page = match self.list_v2(&input).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(bucket, error = %e, "lifecycle scan: listing failed");
                    report.errors += 1;
                    return;
                }
            };
            for o in page.contents.iter().flatten() {
                let (Some(key), Some(mtime)) = (&o.key, &o.last_modified) else { continue };
                report.examined += 1;
                let size = u64::try_from(o.size.unwrap_or(0)).unwrap_or(0);
                // The listing cannot show tags: judge those after the lookup.
                let tags_unknown = rule.needs_tags().then(|| rule.criteria().tags);
                if !rule.expires_object(key, size, ts_ns(mtime), tags_unknown.as_ref(), now_ns, day_ms) {
                    continue;
                }
                pacer.wait().await;
                match self.expire_one(bucket, key, rule, now_ns).await {
                    Ok(true) => {
                        report.expired += 1;
                        tracing::info!(bucket, key, rule = rule.id.as_deref().unwrap_or(""), "lifecycle: object expired");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(bucket, key, error = %e, "lifecycle: expiring an object failed");
                        report.errors += 1;
                    }
                }
            }
            match page.next_continuation_token {
                Some(t) if page.is_truncated == Some(true) => token = Some(t),
                _ => return,
            }
        }
    }

    /// Noncurrent versions and lone delete markers of the rule's prefix: one
    /// walk of the bucket's version store (per key newest first; the
    /// current object, if any, is looked up at the key's first entry). A
    /// noncurrent version became noncurrent when the next newer one was
    /// made. Each removal is a compare-and-delete of the entry seen.
    async fn expire_versions(
        &self,
        bucket: &str,
        rule: &Rule,
        now_ns: u64,
        pacer: &mut Pacer,
        report: &mut ScanReport,
    ) -> Result<(), S3Error> {
        let Some(store) = self.version_store(bucket, false).await? else { return Ok(()) };
        let dir = self.store.bucket(bucket).await?;
        let day_ms = self.cfg.limits.lifecycle_day_ms;
        let prefix = rule.criteria().prefix;
        let start = (!prefix.is_empty()).then_some((prefix.as_bytes(), true));
        let mut walker = KeyWalker::new(self.store.fs.clone(), store, start);
        let mut group = VersionGroup::default();
        loop {
            let found = walker.next().await.map_err(|e| error::from_meta(e, "versions"))?;
            let entry = match found {
                None => None,
                Some(f) => {
                    let Some((key, sort)) = versions::split_store_key(&f.key) else { continue };
                    if !key.starts_with(&prefix) {
                        if key.as_str() > prefix.as_str() {
                            None
                        } else {
                            continue;
                        }
                    } else {
                        let Some(inode) = f.entry.attr else { continue };
                        Some(StoreEntry { key, sort, parent: f.dir, name: f.entry.name, inode, meta: Default::default() })
                    }
                }
            };
            let Some(mut entry) = entry else {
                self.finish_group(bucket, rule, &mut group, pacer, report).await;
                return Ok(());
            };
            if group.key.as_deref() != Some(entry.key.as_str()) {
                self.finish_group(bucket, rule, &mut group, pacer, report).await;
                let path = self.store.path_in(&dir, &entry.key).await?;
                let current = find_object(&self.store, dir.id, &path).await?.filter(|o| !o.dir);
                group = VersionGroup {
                    key: Some(entry.key.clone()),
                    newer_mtime_ns: current.as_ref().map(|c| c.meta.mtime_ns),
                    ..VersionGroup::default()
                };
            }
            self.fill_store_records(std::slice::from_mut(&mut entry)).await?;
            report.examined += 1;
            group.entries += 1;
            let Some(since) = group.newer_mtime_ns else {
                // No current object: this newest entry is the latest version.
                group.newer_mtime_ns = Some(entry.meta.mtime_ns);
                group.latest = Some(entry);
                continue;
            };
            group.newer_mtime_ns = Some(entry.meta.mtime_ns);
            let newer = group.noncurrent;
            group.noncurrent += 1;
            let tags = if rule.needs_tags() { Some(self.tags_of(entry.inode.id).await?.unwrap_or_default()) } else { None };
            if rule.expires_noncurrent(&entry.key, entry.meta.size, tags.as_ref(), since, newer, now_ns, day_ms) {
                pacer.wait().await;
                self.expire_entry(bucket, &entry, "noncurrent version expired", report).await;
            }
        }
    }

    /// The end of one key's entries: a delete marker that was its only
    /// version goes under `ExpiredObjectDeleteMarker`.
    async fn finish_group(&self, bucket: &str, rule: &Rule, group: &mut VersionGroup, pacer: &mut Pacer, report: &mut ScanReport) {
        let g = std::mem::take(group);
        if let (Some(latest), 1) = (g.latest, g.entries) {
            if latest.meta.delete_marker && rule.removes_lone_marker(&latest.key) {
                pacer.wait().await;
                self.expire_entry(bucket, &latest, "lone delete marker removed", report).await;
            }
        }
    }

    async fn expire_entry(&self, bucket: &str, e: &StoreEntry, what: &str, report: &mut ScanReport) {
        let expected = Expected::Inode { id: e.inode.id, version: e.inode.version };
        match self.store.fs.meta().unlink_expected(e.parent, &e.name, expected).await {
            Ok(()) => {
                report.versions_expired += 1;
                tracing::info!(bucket, key = %e.key, version = e.version_id(), "lifecycle: {what}");
            }
            // Changed or gone since it was judged: the next scan judges again.
            Err(err) if matches!(err.code(), ErrorCode::PreconditionFailed | ErrorCode::NotFound) => {}
            Err(err) => {
                tracing::warn!(bucket, key = %e.key, error = %err, "lifecycle: removing a version failed");
                report.errors += 1;
            }
        }
    }

    /// Deletes `key` if it is still due under `rule`; whether it did.
    async fn expire_one(&self, bucket: &str, key: &str, rule: &Rule, now_ns: u64) -> Result<bool, S3Error> {
        let (b_dir, path) = self.store.locate(bucket, key).await?;
        let b = b_dir.id;
        let Some(obj) = find_object(&self.store, b, &path).await? else { return Ok(false) };
        let tags = if rule.needs_tags() { Some(self.tags_of(obj.inode.id).await?.unwrap_or_default()) } else { None };
        if !rule.expires_object(key, obj.meta.size, obj.meta.mtime_ns, tags.as_ref(), now_ns, self.cfg.limits.lifecycle_day_ms) {
            return Ok(false);
        }
        if obj.dir {
            self.delete(bucket, key).await?;
            return Ok(true);
        }
        let versioning = self.store.versioning_of(b).await?;
        if versioning != crate::versions::Versioning::Off {
            // As S3: expiring the current version of a versioned bucket
            // makes it noncurrent under a delete marker.
            self.delete_versioned(bucket, b, versioning, &path, key).await?;
            return Ok(true);
        }
        let Some(parent) = self.store.ensure_dirs_existing(b, path.parent()).await else { return Ok(false) };
        let expected = Expected::Inode { id: obj.inode.id, version: obj.inode.version };
        match self.store.fs.meta().unlink_expected(parent, path.name(), expected).await {
            Ok(()) => {}
            // Replaced or deleted since it was judged: not this rule's to delete.
            Err(e) if matches!(e.code(), ErrorCode::PreconditionFailed | ErrorCode::NotFound) => return Ok(false),
            Err(e) => return Err(error::from_meta(e, key)),
        }
        self.store.remove_empty_dirs(b, path.parent()).await;
        Ok(true)
    }

    async fn abort_uploads(&self, bucket: &str, rule: &Rule, now_ns: u64, pacer: &mut Pacer, report: &mut ScanReport) {
        if rule.abort_days.is_none() {
            return;
        }
        let prefix = rule.criteria().prefix;
        let (mut key_marker, mut id_marker) = (None, None);
        loop {
            let input = ListMultipartUploadsInput {
                bucket: bucket.to_string(),
                prefix: (!prefix.is_empty()).then(|| prefix.clone()),
                key_marker: key_marker.take(),
                upload_id_marker: id_marker.take(),
                max_uploads: Some(1000),
                ..Default::default()
            };
            let page = match self.list_uploads(&input).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(bucket, error = %e, "lifecycle scan: listing uploads failed");
                    report.errors += 1;
                    return;
                }
            };
            for u in page.uploads.iter().flatten() {
                let (Some(key), Some(id), Some(at)) = (&u.key, &u.upload_id, &u.initiated) else { continue };
                if !rule.aborts_upload(key, ts_ns(at), now_ns, self.cfg.limits.lifecycle_day_ms) {
                    continue;
                }
                pacer.wait().await;
                let abort =
                    AbortMultipartUploadInput { bucket: bucket.to_string(), key: key.clone(), upload_id: id.clone(), ..Default::default() };
                match self.abort_upload(&abort).await {
                    Ok(()) => {
                        report.aborted += 1;
                        tracing::info!(bucket, key, upload = %id, "lifecycle: incomplete multipart upload aborted");
                    }
                    Err(e) if e.code() == &S3ErrorCode::NoSuchUpload => {}
                    Err(e) => {
                        tracing::warn!(bucket, key, upload = %id, error = %e, "lifecycle: aborting an upload failed");
                        report.errors += 1;
                    }
                }
            }
            match (page.is_truncated, page.next_key_marker, page.next_upload_id_marker) {
                (Some(true), Some(k), i) => {
                    key_marker = Some(k);
                    id_marker = i;
                }
                _ => return,
            }
        }
    }
}
