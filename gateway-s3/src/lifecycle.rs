//! Lifecycle rules of a bucket (Put/Get/DeleteBucketLifecycleConfiguration,
//! kept as JSON in the bucket directory's `user.s3.lifecycle` xattr, written
//! in one meta call) and when they apply. Pure: no I/O, no clock — the
//! writer's scan (`ops/lifecycle.rs`) passes the time and the length of a
//! day (`lifecycle_day_ms`, 24 h; tests shorten it).
//!
//! **Validation** ([`from_dto`], as AWS where AWS says):
//!
//! | input | answer |
//! |---|---|
//! | no rule, more than [`MAX_RULES`] | 400 `MalformedXML` |
//! | `Status` not `Enabled` / `Disabled` | 400 `MalformedXML` |
//! | `ID` over 255 characters, the same `ID` twice | 400 `InvalidArgument` |
//! | a rule without an action | 400 `InvalidRequest` |
//! | `Expiration` with both or neither of `Days` and `Date`; `Days` ≤ 0; a `Date` not at midnight UTC | 400 `MalformedXML` / `InvalidArgument` |
//! | `AbortIncompleteMultipartUpload` with `DaysAfterInitiation` ≤ 0 or missing | 400 `InvalidArgument` |
//! | `AbortIncompleteMultipartUpload` with a tag or size filter | 400 `InvalidRequest` (uploads have no tags or size yet) |
//! | both the rule's legacy `Prefix` and a `Filter`; a `Filter` with more than one of Prefix, Tag, sizes, And | 400 `MalformedXML` |
//! | `ObjectSizeGreaterThan` ≥ `ObjectSizeLessThan` | 400 `InvalidArgument` |
//! | `NoncurrentVersionExpiration` with `NoncurrentDays` ≤ 0 or missing, `NewerNoncurrentVersions` outside 1..=100 | 400 `InvalidArgument` |
//! | `ExpiredObjectDeleteMarker=true` with `Days` or `Date`; with a tag filter | 400 `MalformedXML`; 400 `InvalidRequest` |
//! | `NoncurrentVersionTransition`, `Transition` | 501 `NotImplemented`: one storage class |
//!
//! **When a rule applies** (enabled rules only; a rule's filter is its
//! prefix, its tags (all must be on the object), and its size bounds):
//!
//! | action | applies to | when |
//! |---|---|---|
//! | `Expiration.Days = N` | an object matching the filter | `now ≥ mtime + N days` |
//! | `Expiration.Date = D` | an object matching the filter | `now ≥ D` |
//! | `AbortIncompleteMultipartUpload.DaysAfterInitiation = N` | an upload whose key has the prefix | `now ≥ initiated + N days` |
//! | `NoncurrentVersionExpiration.NoncurrentDays = N` (`NewerNoncurrentVersions = K`) | a noncurrent version matching the filter, with at least K noncurrent versions of its key newer than it | `now ≥ (the time the next newer version was made) + N days` |
//! | `Expiration.ExpiredObjectDeleteMarker = true` | a delete marker of a key with the prefix that is the key's only version | at once |
//!
//! AWS rounds an expiry up to the next midnight UTC; here it is exact (a
//! difference of less than a day, which lets tests shorten days).

use crate::error;
use crate::objmeta::TagList;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode};
use serde::{Deserialize, Serialize};
use std::time::SystemTime;

/// The xattr of a bucket directory that holds its lifecycle rules.
pub const XATTR_LIFECYCLE: &str = "user.s3.lifecycle";
/// Most rules in a configuration (S3's).
pub const MAX_RULES: usize = 1000;
/// Largest `NewerNoncurrentVersions`, as AWS limits it.
pub const MAX_NEWER_NONCURRENT: i32 = 100;
const MAX_ID_CHARS: usize = 255;
const NS_PER_DAY: u64 = 86_400 * 1_000_000_000;

/// A filter as given (kept in that form so GET gives it back).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_gt: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_lt: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub and: Option<And>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct And {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: TagList,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_gt: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_lt: Option<i64>,
}

/// One stored rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub enabled: bool,
    /// The rule's own `Prefix` (the legacy form, outside `Filter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_days: Option<i32>,
    /// `Expiration.Date`, ns since the epoch (midnight UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_date_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_days: Option<i32>,
    /// `NoncurrentVersionExpiration.NoncurrentDays`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noncurrent_days: Option<i32>,
    /// `NoncurrentVersionExpiration.NewerNoncurrentVersions`: that many
    /// newer noncurrent versions are kept whatever their age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newer_noncurrent: Option<i32>,
    /// `Expiration.ExpiredObjectDeleteMarker`: a delete marker that is the
    /// only version of its key is removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expired_marker: bool,
}

/// What a rule's filter asks of an object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Criteria {
    pub prefix: String,
    pub tags: TagList,
    pub size_gt: Option<i64>,
    pub size_lt: Option<i64>,
}

impl Rule {
    pub fn criteria(&self) -> Criteria {
        let mut c = Criteria { prefix: self.legacy_prefix.clone().unwrap_or_default(), ..Criteria::default() };
        if let Some(f) = &self.filter {
            if let Some(p) = &f.prefix {
                c.prefix = p.clone();
            }
            c.tags.extend(f.tag.iter().cloned());
            c.size_gt = f.size_gt;
            c.size_lt = f.size_lt;
            if let Some(a) = &f.and {
                c.prefix = a.prefix.clone().unwrap_or_default();
                c.tags = a.tags.clone();
                c.size_gt = a.size_gt;
                c.size_lt = a.size_lt;
            }
        }
        c
    }

    /// Whether the object (`key`, `size`, last modified `mtime_ns`, its
    /// tags — needed only when the filter has tags) expires at `now_ns`.
    pub fn expires_object(&self, key: &str, size: u64, mtime_ns: u64, tags: Option<&TagList>, now_ns: u64, day_ms: u64) -> bool {
        if !self.enabled || (self.expiration_days.is_none() && self.expiration_date_ns.is_none()) {
            return false;
        }
        if !self.matches(key, size, tags) {
            return false;
        }
        match (self.expiration_days, self.expiration_date_ns) {
            (Some(days), _) => now_ns >= mtime_ns.saturating_add(days_ns(days, day_ms)),
            (None, Some(date)) => now_ns >= date,
            (None, None) => false,
        }
    }

    /// Whether the rule's filter takes `key` with `size` and `tags` (tags
    /// needed only when the filter has tags).
    fn matches(&self, key: &str, size: u64, tags: Option<&TagList>) -> bool {
        let c = self.criteria();
        let size = i64::try_from(size).unwrap_or(i64::MAX);
        key.starts_with(&c.prefix)
            && c.size_gt.map_or(true, |g| size > g)
            && c.size_lt.map_or(true, |l| size < l)
            && c.tags.iter().all(|t| tags.is_some_and(|have| have.contains(t)))
    }

    /// Whether a noncurrent version of `key` (`size`, `tags`) that became
    /// noncurrent at `noncurrent_since_ns` (when the next newer version was
    /// made), with `newer_noncurrent` noncurrent versions newer than it,
    /// expires at `now_ns`.
    #[allow(clippy::too_many_arguments)]
    pub fn expires_noncurrent(
        &self,
        key: &str,
        size: u64,
        tags: Option<&TagList>,
        noncurrent_since_ns: u64,
        newer_noncurrent: usize,
        now_ns: u64,
        day_ms: u64,
    ) -> bool {
        let Some(days) = self.noncurrent_days.filter(|_| self.enabled) else { return false };
        let kept = usize::try_from(self.newer_noncurrent.unwrap_or(0)).unwrap_or(0);
        newer_noncurrent >= kept && self.matches(key, size, tags) && now_ns >= noncurrent_since_ns.saturating_add(days_ns(days, day_ms))
    }

    /// Whether a delete marker of `key` that is its only version goes.
    pub fn removes_lone_marker(&self, key: &str) -> bool {
        self.enabled && self.expired_marker && key.starts_with(&self.criteria().prefix)
    }

    /// Whether the rule acts on noncurrent versions or delete markers.
    pub fn acts_on_versions(&self) -> bool {
        self.enabled && (self.noncurrent_days.is_some() || self.expired_marker)
    }

    /// Whether the upload of `key` started at `initiated_ns` is aborted at `now_ns`.
    pub fn aborts_upload(&self, key: &str, initiated_ns: u64, now_ns: u64, day_ms: u64) -> bool {
        match self.abort_days {
            Some(days) if self.enabled => {
                key.starts_with(&self.criteria().prefix) && now_ns >= initiated_ns.saturating_add(days_ns(days, day_ms))
            }
            _ => false,
        }
    }

    pub fn needs_tags(&self) -> bool {
        !self.criteria().tags.is_empty()
    }
}

fn days_ns(days: i32, day_ms: u64) -> u64 {
    u64::try_from(days).unwrap_or(0).saturating_mul(day_ms).saturating_mul(1_000_000)
}

fn malformed(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::MalformedXML, msg.into())
}

fn not_implemented(msg: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NotImplemented, msg.to_string())
}

fn tag_of(t: &Tag) -> Result<(String, String), S3Error> {
    match (&t.key, &t.value) {
        (Some(k), v) if !k.is_empty() => Ok((k.clone(), v.clone().unwrap_or_default())),
        _ => Err(malformed("a lifecycle Tag needs a Key")),
    }
}

fn size_bounds(gt: Option<i64>, lt: Option<i64>) -> Result<(), S3Error> {
    if gt.is_some_and(|g| g < 0) || lt.is_some_and(|l| l <= 0) {
        return Err(error::invalid_argument("ObjectSizeGreaterThan must be ≥ 0 and ObjectSizeLessThan > 0"));
    }
    if let (Some(g), Some(l)) = (gt, lt) {
        if g >= l {
            return Err(error::invalid_argument("ObjectSizeGreaterThan must be less than ObjectSizeLessThan"));
        }
    }
    Ok(())
}

fn filter_from(f: &LifecycleRuleFilter) -> Result<Filter, S3Error> {
    let given =
        [f.prefix.is_some(), f.tag.is_some(), f.object_size_greater_than.is_some(), f.object_size_less_than.is_some(), f.and.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(malformed("a lifecycle Filter takes one of Prefix, Tag, ObjectSizeGreaterThan, ObjectSizeLessThan or And"));
    }
    let and = match &f.and {
        None => None,
        Some(a) => {
            let tags = a.tags.iter().flatten().map(tag_of).collect::<Result<TagList, _>>()?;
            crate::objmeta::check_tags(&tags).map_err(error::invalid_argument)?;
            size_bounds(a.object_size_greater_than, a.object_size_less_than)?;
            Some(And { prefix: a.prefix.clone(), tags, size_gt: a.object_size_greater_than, size_lt: a.object_size_less_than })
        }
    };
    size_bounds(f.object_size_greater_than, f.object_size_less_than)?;
    Ok(Filter {
        prefix: f.prefix.clone(),
        tag: f.tag.as_ref().map(tag_of).transpose()?,
        size_gt: f.object_size_greater_than,
        size_lt: f.object_size_less_than,
        and,
    })
}

fn date_ns(d: &Timestamp) -> Result<u64, S3Error> {
    let t = time::OffsetDateTime::from(d.clone());
    let ns = u64::try_from(t.unix_timestamp_nanos()).map_err(|_| error::invalid_argument("an Expiration Date before 1970"))?;
    if ns % NS_PER_DAY != 0 {
        return Err(error::invalid_argument("'Date' must be at midnight GMT"));
    }
    Ok(ns)
}

/// Checks a configuration (module table) and gives its rules.
pub fn from_dto(rules: &[LifecycleRule]) -> Result<Vec<Rule>, S3Error> {
    if rules.is_empty() || rules.len() > MAX_RULES {
        return Err(malformed(format!("a lifecycle configuration has 1 to {MAX_RULES} rules, not {}", rules.len())));
    }
    let mut out: Vec<Rule> = Vec::with_capacity(rules.len());
    for r in rules {
        let enabled = match r.status.as_str() {
            ExpirationStatus::ENABLED => true,
            ExpirationStatus::DISABLED => false,
            other => return Err(malformed(format!("Status {other:?}: Enabled or Disabled"))),
        };
        if let Some(id) = &r.id {
            if id.chars().count() > MAX_ID_CHARS {
                return Err(error::invalid_argument("ID length should not exceed allowed limit of 255"));
            }
            if out.iter().any(|o| o.id.as_ref() == Some(id)) {
                return Err(error::invalid_argument("Rule ID must be unique. Found same ID for more than one rule"));
            }
        }
        if r.noncurrent_version_transitions.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(not_implemented("NoncurrentVersionTransition rules: this gateway has one storage class (STANDARD)"));
        }
        if r.transitions.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(not_implemented("Transition rules: this gateway has one storage class (STANDARD)"));
        }
        let mut rule = Rule { id: r.id.clone(), enabled, legacy_prefix: r.prefix.clone(), ..Rule::default() };
        if let Some(n) = &r.noncurrent_version_expiration {
            match n.noncurrent_days {
                Some(d) if d > 0 => rule.noncurrent_days = Some(d),
                _ => {
                    return Err(error::invalid_argument(
                        "'NoncurrentDays' for NoncurrentVersionExpiration action must be a positive integer",
                    ))
                }
            }
            match n.newer_noncurrent_versions {
                None => {}
                Some(k) if (1..=MAX_NEWER_NONCURRENT).contains(&k) => rule.newer_noncurrent = Some(k),
                Some(_) => {
                    return Err(error::invalid_argument(format!(
                        "'NewerNoncurrentVersions' for NoncurrentVersionExpiration action must be 1..={MAX_NEWER_NONCURRENT}"
                    )))
                }
            }
        }
        if let Some(e) = &r.expiration {
            if e.expired_object_delete_marker == Some(true) {
                if e.days.is_some() || e.date.is_some() {
                    return Err(malformed(
                        "ExpiredObjectDeleteMarker cannot be specified with Days or Date in a Lifecycle Expiration Policy",
                    ));
                }
                rule.expired_marker = true;
            }
            match (e.days, &e.date) {
                (Some(_), Some(_)) => return Err(malformed("Expiration takes Days or Date, not both")),
                (Some(d), None) if d <= 0 => {
                    return Err(error::invalid_argument("'Days' for Expiration action must be a positive integer"))
                }
                (Some(d), None) => rule.expiration_days = Some(d),
                (None, Some(date)) => rule.expiration_date_ns = Some(date_ns(date)?),
                (None, None) if e.expired_object_delete_marker.is_some() => {}
                (None, None) => return Err(malformed("Expiration needs Days or Date")),
            }
        }
        if let Some(a) = &r.abort_incomplete_multipart_upload {
            match a.days_after_initiation {
                Some(d) if d > 0 => rule.abort_days = Some(d),
                _ => {
                    return Err(error::invalid_argument(
                        "'DaysAfterInitiation' for AbortIncompleteMultipartUpload action must be a positive integer",
                    ))
                }
            }
        }
        if let Some(f) = &r.filter {
            if r.prefix.is_some() {
                return Err(malformed("a rule takes a Prefix or a Filter, not both"));
            }
            rule.filter = Some(filter_from(f)?);
        }
        if rule.expiration_days.is_none()
            && rule.expiration_date_ns.is_none()
            && rule.abort_days.is_none()
            && rule.noncurrent_days.is_none()
            && !rule.expired_marker
        {
            return Err(error::invalid_request("At least one action needs to be specified in a rule"));
        }
        let c = rule.criteria();
        if rule.expired_marker && !c.tags.is_empty() {
            return Err(error::invalid_request("ExpiredObjectDeleteMarker cannot be specified with Tags (delete markers have none)"));
        }
        if rule.abort_days.is_some() && (!c.tags.is_empty() || c.size_gt.is_some() || c.size_lt.is_some()) {
            return Err(error::invalid_request(
                "AbortIncompleteMultipartUpload cannot be specified with Tags or object size filters (uploads have neither)",
            ));
        }
        out.push(rule);
    }
    Ok(out)
}

fn tag_dto((k, v): &(String, String)) -> Tag {
    Tag { key: Some(k.clone()), value: Some(v.clone()) }
}

/// The rule as GetBucketLifecycleConfiguration gives it back.
pub fn to_dto(r: &Rule) -> LifecycleRule {
    let expiration = (r.expiration_days.is_some() || r.expiration_date_ns.is_some() || r.expired_marker).then(|| LifecycleExpiration {
        days: r.expiration_days,
        date: r.expiration_date_ns.map(|ns| Timestamp::from(SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(ns))),
        expired_object_delete_marker: r.expired_marker.then_some(true),
    });
    let filter = r.filter.as_ref().map(|f| LifecycleRuleFilter {
        prefix: f.prefix.clone(),
        tag: f.tag.as_ref().map(tag_dto),
        object_size_greater_than: f.size_gt,
        object_size_less_than: f.size_lt,
        and: f.and.as_ref().map(|a| LifecycleRuleAndOperator {
            prefix: a.prefix.clone(),
            tags: (!a.tags.is_empty()).then(|| a.tags.iter().map(tag_dto).collect()),
            object_size_greater_than: a.size_gt,
            object_size_less_than: a.size_lt,
        }),
    });
    LifecycleRule {
        abort_incomplete_multipart_upload: r.abort_days.map(|d| AbortIncompleteMultipartUpload { days_after_initiation: Some(d) }),
        expiration,
        filter,
        id: r.id.clone(),
        noncurrent_version_expiration: r
            .noncurrent_days
            .map(|d| NoncurrentVersionExpiration { noncurrent_days: Some(d), newer_noncurrent_versions: r.newer_noncurrent }),
        noncurrent_version_transitions: None,
        prefix: r.legacy_prefix.clone(),
        status: ExpirationStatus::from_static(if r.enabled { ExpirationStatus::ENABLED } else { ExpirationStatus::DISABLED }),
        transitions: None,
    }
}

/// The stored form, bounded by the xattr limit.
pub fn encode(rules: &[Rule]) -> Result<Vec<u8>, S3Error> {
    let bytes = serde_json::to_vec(rules).map_err(error::internal)?;
    if bytes.len() > fskv_proto::meta::MAX_XATTR_VALUE_BYTES {
        return Err(error::invalid_request(format!(
            "the lifecycle configuration takes {} bytes stored (at most {})",
            bytes.len(),
            fskv_proto::meta::MAX_XATTR_VALUE_BYTES
        )));
    }
    Ok(bytes)
}

/// The stored rules; an unreadable record counts as none (and is logged).
pub fn decode(bytes: &[u8]) -> Vec<Rule> {
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "unreadable lifecycle configuration ignored");
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MS: u64 = 1000;
    const DAY_NS: u64 = DAY_MS * 1_000_000;

    fn enabled() -> LifecycleRule {
        LifecycleRule {
            abort_incomplete_multipart_upload: None,
            expiration: None,
            filter: None,
            id: None,
            noncurrent_version_expiration: None,
            noncurrent_version_transitions: None,
            prefix: None,
            status: ExpirationStatus::from_static(ExpirationStatus::ENABLED),
            transitions: None,
        }
    }

    fn expire(days: i32, filter: Option<LifecycleRuleFilter>) -> LifecycleRule {
        LifecycleRule { expiration: Some(LifecycleExpiration { days: Some(days), ..Default::default() }), filter, ..enabled() }
    }

    fn code(r: Result<Vec<Rule>, S3Error>) -> String {
        r.unwrap_err().code().as_str().to_string()
    }

    fn tag(k: &str, v: &str) -> Tag {
        Tag { key: Some(k.into()), value: Some(v.into()) }
    }

    #[test]
    fn validation_follows_s3() {
        assert!(from_dto(&[expire(1, None)]).is_ok());
        assert_eq!(code(from_dto(&[])), "MalformedXML");
        assert_eq!(code(from_dto(&[expire(0, None)])), "InvalidArgument");
        let mut r = expire(1, None);
        r.status = ExpirationStatus::from("On".to_string());
        assert_eq!(code(from_dto(&[r])), "MalformedXML");
        let mut r = expire(1, None);
        r.id = Some("same".into());
        assert_eq!(code(from_dto(&[r.clone(), r.clone()])), "InvalidArgument");
        r.noncurrent_version_expiration = Some(NoncurrentVersionExpiration { noncurrent_days: Some(0), newer_noncurrent_versions: None });
        assert_eq!(code(from_dto(&[r.clone()])), "InvalidArgument");
        r.noncurrent_version_expiration =
            Some(NoncurrentVersionExpiration { noncurrent_days: Some(3), newer_noncurrent_versions: Some(101) });
        assert_eq!(code(from_dto(&[r.clone()])), "InvalidArgument");
        r.noncurrent_version_expiration =
            Some(NoncurrentVersionExpiration { noncurrent_days: Some(3), newer_noncurrent_versions: Some(2) });
        let ok = from_dto(&[r.clone()]).expect("noncurrent rule");
        assert_eq!((ok[0].noncurrent_days, ok[0].newer_noncurrent), (Some(3), Some(2)));
        assert_eq!(to_dto(&ok[0]).noncurrent_version_expiration.and_then(|n| n.newer_noncurrent_versions), Some(2));
        let marker_and_days = LifecycleExpiration { days: Some(1), expired_object_delete_marker: Some(true), ..Default::default() };
        assert_eq!(code(from_dto(&[LifecycleRule { expiration: Some(marker_and_days), ..enabled() }])), "MalformedXML");
        let none = enabled();
        assert_eq!(code(from_dto(&[none])), "InvalidRequest");
        let two = LifecycleRuleFilter { prefix: Some("a/".into()), tag: Some(tag("k", "v")), ..Default::default() };
        assert_eq!(code(from_dto(&[expire(1, Some(two))])), "MalformedXML");
        let mut abort = expire(1, Some(LifecycleRuleFilter { tag: Some(tag("k", "v")), ..Default::default() }));
        abort.abort_incomplete_multipart_upload = Some(AbortIncompleteMultipartUpload { days_after_initiation: Some(2) });
        assert_eq!(code(from_dto(&[abort])), "InvalidRequest");
        let sizes = LifecycleRuleFilter {
            and: Some(LifecycleRuleAndOperator {
                object_size_greater_than: Some(10),
                object_size_less_than: Some(10),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(code(from_dto(&[expire(1, Some(sizes))])), "InvalidArgument");
        let mut both = expire(1, Some(LifecycleRuleFilter::default()));
        both.prefix = Some("x".into());
        assert_eq!(code(from_dto(&[both])), "MalformedXML");
        let date = Timestamp::from(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(86_400 * 20_000 + 5));
        let mut d = expire(1, None);
        d.expiration = Some(LifecycleExpiration { date: Some(date), ..Default::default() });
        assert_eq!(code(from_dto(&[d])), "InvalidArgument");
    }

    #[test]
    fn expiry_by_days_prefix_tags_and_size() {
        let f = LifecycleRuleFilter {
            and: Some(LifecycleRuleAndOperator {
                prefix: Some("logs/".into()),
                tags: Some(vec![tag("class", "tmp")]),
                object_size_greater_than: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        };
        let rules = from_dto(&[expire(3, Some(f))]).unwrap();
        let r = &rules[0];
        assert!(r.needs_tags());
        let tags: TagList = vec![("class".into(), "tmp".into()), ("x".into(), "y".into())];
        let t0 = 1_000 * DAY_NS;
        let at = |days: u64| t0 + days * DAY_NS;
        assert!(!r.expires_object("logs/a", 5, t0, Some(&tags), at(2), DAY_MS), "too young");
        assert!(r.expires_object("logs/a", 5, t0, Some(&tags), at(3), DAY_MS));
        assert!(!r.expires_object("data/a", 5, t0, Some(&tags), at(9), DAY_MS), "prefix");
        assert!(!r.expires_object("logs/a", 1, t0, Some(&tags), at(9), DAY_MS), "size not > 1");
        assert!(!r.expires_object("logs/a", 5, t0, Some(&vec![]), at(9), DAY_MS), "tag missing");
        assert!(!r.expires_object("logs/a", 5, t0, None, at(9), DAY_MS), "tags unknown");
        let mut off = r.clone();
        off.enabled = false;
        assert!(!off.expires_object("logs/a", 5, t0, Some(&tags), at(9), DAY_MS), "disabled");
    }

    #[test]
    fn noncurrent_versions_expire_after_their_successor_and_beyond_the_kept_ones() {
        let rule = Rule { enabled: true, noncurrent_days: Some(2), newer_noncurrent: Some(1), ..Rule::default() };
        let since = 10 * DAY_NS;
        // Too young, or young enough, or one of the kept newest.
        assert!(!rule.expires_noncurrent("k", 1, None, since, 1, since + DAY_NS, DAY_MS));
        assert!(rule.expires_noncurrent("k", 1, None, since, 1, since + 2 * DAY_NS, DAY_MS));
        assert!(!rule.expires_noncurrent("k", 1, None, since, 0, since + 9 * DAY_NS, DAY_MS), "the newest noncurrent one is kept");
        let off = Rule { enabled: false, ..rule.clone() };
        assert!(!off.expires_noncurrent("k", 1, None, since, 5, since + 9 * DAY_NS, DAY_MS));
        let marker = Rule { enabled: true, expired_marker: true, legacy_prefix: Some("logs/".into()), ..Rule::default() };
        assert!(marker.removes_lone_marker("logs/a") && !marker.removes_lone_marker("data/a"));
        assert!(marker.acts_on_versions() && rule.acts_on_versions() && !off.acts_on_versions());
    }

    #[test]
    fn expiry_by_date_and_upload_abort() {
        let date_ns = 20_000 * NS_PER_DAY;
        let mut r = expire(1, None);
        r.expiration = Some(LifecycleExpiration {
            date: Some(Timestamp::from(SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(date_ns))),
            ..Default::default()
        });
        r.abort_incomplete_multipart_upload = Some(AbortIncompleteMultipartUpload { days_after_initiation: Some(2) });
        r.prefix = Some("up/".into());
        let rule = from_dto(&[r]).unwrap().remove(0);
        assert!(!rule.expires_object("up/k", 1, 0, None, date_ns - 1, DAY_MS));
        assert!(rule.expires_object("up/k", 1, date_ns + 5, None, date_ns, DAY_MS), "the date, whatever the age");
        assert!(!rule.aborts_upload("up/k", 10, 10 + 2 * DAY_NS - 1, DAY_MS));
        assert!(rule.aborts_upload("up/k", 10, 10 + 2 * DAY_NS, DAY_MS));
        assert!(!rule.aborts_upload("other", 10, 10 + 9 * DAY_NS, DAY_MS));
        // Round trip through GET's form and storage.
        let back = from_dto(&[to_dto(&rule)]).unwrap().remove(0);
        assert_eq!(back, rule);
        assert_eq!(decode(&encode(std::slice::from_ref(&rule)).unwrap()), vec![rule]);
    }
}
