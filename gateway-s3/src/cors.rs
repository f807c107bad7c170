//! CORS: a bucket's rules (Put/Get/DeleteBucketCors, kept as JSON in the
//! bucket directory's `user.s3.cors` xattr, written in one meta call), the
//! preflight `OPTIONS` answer, and the `Access-Control-*` headers of actual
//! requests that carry an `Origin`. Pure: no I/O; `server.rs` reads the
//! rules and applies the answers.
//!
//! **Validation** ([`validate`], as AWS):
//!
//! | input | answer |
//! |---|---|
//! | no rule, more than [`MAX_RULES`] rules | 400 `MalformedXML` |
//! | a rule without `AllowedMethod` or `AllowedOrigin` | 400 `MalformedXML` |
//! | a method other than GET, PUT, POST, DELETE, HEAD (case-sensitive) | 400 `InvalidRequest` "Found unsupported HTTP method in CORS config" |
//! | an `AllowedOrigin` or `AllowedHeader` with more than one `*` | 400 `InvalidRequest` |
//! | an `ExposeHeader` with a `*` | 400 `InvalidRequest` |
//! | `MaxAgeSeconds` negative | 400 `MalformedXML` |
//! | `ID` over 255 characters | 400 `InvalidArgument` |
//! | the stored form over 64 KiB (the xattr limit; AWS: 64 KB of XML) | 400 `InvalidRequest` |
//!
//! **Preflight** ([`preflight`]): the first rule whose origin pattern
//! matches `Origin`, whose methods include `Access-Control-Request-Method`
//! and whose header patterns match every name of
//! `Access-Control-Request-Headers` (case-insensitive) answers:
//!
//! | case | answer |
//! |---|---|
//! | no `Origin` / no or unknown `Access-Control-Request-Method` | 400 `BadRequest` |
//! | no such bucket | 403 `AccessForbidden` "CORSResponse: Bucket not found" |
//! | the bucket has no CORS configuration | 403 `AccessForbidden` "CORSResponse: CORS is not enabled for this bucket." |
//! | no rule matches | 403 `AccessForbidden` "CORSResponse: This CORS request is not allowed…" |
//! | a rule matches | 200, no body: `Access-Control-Allow-Origin` (`*` when the matching pattern is `*`, else the origin and `Access-Control-Allow-Credentials: true`), `-Allow-Methods` (the rule's), `-Allow-Headers` (the requested ones), `-Expose-Headers`, `-Max-Age` (when set), `Vary` |
//!
//! A preflight is unauthenticated (browsers send no credentials with it):
//! it goes through the shared layer's limits like every request (route
//! `Options`, read, bodiless) and its body is never read.
//!
//! **Actual requests** ([`actual`]): a request with an `Origin` gets the
//! headers of the first rule whose origin pattern matches and whose
//! methods include the request's method (without `-Allow-Headers`); no
//! match: no CORS headers. Error responses get them too.

use crate::error;
use s3s::dto::{CORSRule, CORSRules};
use s3s::{S3Error, S3ErrorCode};
use serde::{Deserialize, Serialize};

/// The xattr of a bucket directory that holds its CORS rules.
pub const XATTR_CORS: &str = "user.s3.cors";
/// Most rules in a configuration (S3's).
pub const MAX_RULES: usize = 100;
/// Largest stored configuration (the meta service's xattr value limit).
pub const MAX_STORED_BYTES: usize = fskv_proto::meta::MAX_XATTR_VALUE_BYTES;
/// The methods a rule may allow (S3's, case-sensitive).
pub const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];
const MAX_ID_CHARS: usize = 255;

/// One stored rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub methods: Vec<String>,
    pub origins: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_seconds: Option<i32>,
}

impl Rule {
    pub fn from_dto(r: &CORSRule) -> Rule {
        Rule {
            id: r.id.clone(),
            methods: r.allowed_methods.iter().map(|m| m.as_str().to_string()).collect(),
            origins: r.allowed_origins.clone(),
            allowed_headers: r.allowed_headers.clone().unwrap_or_default(),
            expose_headers: r.expose_headers.clone().unwrap_or_default(),
            max_age_seconds: r.max_age_seconds,
        }
    }

    pub fn to_dto(&self) -> CORSRule {
        let some = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        CORSRule {
            id: self.id.clone(),
            allowed_methods: self.methods.iter().map(|m| s3s::dto::AllowedMethod::from(m.clone())).collect(),
            allowed_origins: self.origins.clone(),
            allowed_headers: some(&self.allowed_headers),
            expose_headers: some(&self.expose_headers),
            max_age_seconds: self.max_age_seconds,
        }
    }
}

pub fn rules_from_dto(rules: &CORSRules) -> Vec<Rule> {
    rules.iter().map(Rule::from_dto).collect()
}

fn malformed(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::MalformedXML, msg.into())
}

/// Checks a configuration as S3 does (module table) and gives its stored form.
pub fn validate(rules: &[Rule]) -> Result<Vec<u8>, S3Error> {
    if rules.is_empty() || rules.len() > MAX_RULES {
        return Err(malformed(format!("a CORS configuration has 1 to {MAX_RULES} rules, not {}", rules.len())));
    }
    for r in rules {
        if r.methods.is_empty() || r.origins.is_empty() {
            return Err(malformed("every CORSRule needs an AllowedMethod and an AllowedOrigin"));
        }
        if let Some(m) = r.methods.iter().find(|m| !METHODS.contains(&m.as_str())) {
            return Err(error::invalid_request(format!("Found unsupported HTTP method in CORS config. Unsupported method is {m}")));
        }
        if let Some(o) = r.origins.iter().find(|o| o.matches('*').count() > 1) {
            return Err(error::invalid_request(format!("AllowedOrigin \"{o}\" can not have more than one wildcard.")));
        }
        if let Some(h) = r.allowed_headers.iter().find(|h| h.matches('*').count() > 1) {
            return Err(error::invalid_request(format!("AllowedHeader \"{h}\" can not have more than one wildcard.")));
        }
        if let Some(h) = r.expose_headers.iter().find(|h| h.contains('*')) {
            return Err(error::invalid_request(format!(
                "ExposeHeader \"{h}\" contains wildcard. We currently do not support wildcard for ExposeHeader."
            )));
        }
        if r.max_age_seconds.is_some_and(|s| s < 0) {
            return Err(malformed("MaxAgeSeconds must not be negative"));
        }
        if r.id.as_ref().is_some_and(|id| id.chars().count() > MAX_ID_CHARS) {
            return Err(error::invalid_argument(format!("a CORSRule ID has at most {MAX_ID_CHARS} characters")));
        }
    }
    let bytes = serde_json::to_vec(rules).map_err(error::internal)?;
    if bytes.len() > MAX_STORED_BYTES {
        return Err(error::invalid_request(format!(
            "the CORS configuration takes {} bytes stored (at most {MAX_STORED_BYTES})",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The stored rules; an unreadable record counts as none (and is logged).
pub fn decode(bytes: &[u8]) -> Vec<Rule> {
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "unreadable CORS configuration ignored");
        Vec::new()
    })
}

/// Whether `s` matches `pattern`, which may hold one `*` (any run of bytes).
pub fn wildcard_match(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((pre, post)) => s.len() >= pre.len() + post.len() && s.starts_with(pre) && s.ends_with(post),
    }
}

fn header_allowed(rule: &Rule, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    rule.allowed_headers.iter().any(|p| wildcard_match(&p.to_ascii_lowercase(), &name))
}

/// Why a preflight is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    NoOrigin,
    BadMethod,
    NoBucket,
    NotEnabled,
    NotAllowed,
}

impl Refusal {
    pub fn to_error(self) -> S3Error {
        let forbidden = |msg: &str| {
            let mut e = S3Error::with_message(S3ErrorCode::Custom("AccessForbidden".into()), msg.to_string());
            e.set_status_code(http::StatusCode::FORBIDDEN);
            e
        };
        let bad = |msg: &str| {
            let mut e = S3Error::with_message(S3ErrorCode::Custom("BadRequest".into()), msg.to_string());
            e.set_status_code(http::StatusCode::BAD_REQUEST);
            e
        };
        match self {
            Refusal::NoOrigin => bad("Insufficient information. Origin request header needed."),
            Refusal::BadMethod => bad("Invalid Access-Control-Request-Method (one of GET, PUT, POST, DELETE, HEAD is needed)"),
            Refusal::NoBucket => forbidden("CORSResponse: Bucket not found"),
            Refusal::NotEnabled => forbidden("CORSResponse: CORS is not enabled for this bucket."),
            Refusal::NotAllowed => forbidden(
                "CORSResponse: This CORS request is not allowed. This is usually because the evalution of Origin, request method / \
                 Access-Control-Request-Method or Access-Control-Request-Headers are not whitelisted by the resource's CORS spec.",
            ),
        }
    }
}

/// `Vary` of every CORS answer.
pub const VARY: &str = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method";

fn common_headers(rule: &Rule, origin: &str, out: &mut Vec<(&'static str, String)>) {
    let any = rule.origins.iter().any(|o| o == "*");
    out.push(("access-control-allow-origin", if any { "*".to_string() } else { origin.to_string() }));
    if !any {
        out.push(("access-control-allow-credentials", "true".into()));
    }
    out.push(("access-control-allow-methods", rule.methods.join(", ")));
    if !rule.expose_headers.is_empty() {
        out.push(("access-control-expose-headers", rule.expose_headers.join(", ")));
    }
    if let Some(s) = rule.max_age_seconds {
        out.push(("access-control-max-age", s.to_string()));
    }
    out.push(("vary", VARY.into()));
}

/// The checks of a preflight made before its bucket is looked up: an
/// `Origin` and a known `Access-Control-Request-Method`.
pub fn check_request(origin: Option<&str>, method: Option<&str>) -> Result<(), Refusal> {
    origin.filter(|o| !o.is_empty()).ok_or(Refusal::NoOrigin)?;
    method.filter(|m| METHODS.contains(m)).ok_or(Refusal::BadMethod)?;
    Ok(())
}

/// The preflight answer: response headers, or why it is refused. `rules`
/// is `None` when the bucket has no CORS configuration.
pub fn preflight(
    rules: Option<&[Rule]>,
    origin: Option<&str>,
    method: Option<&str>,
    request_headers: Option<&str>,
) -> Result<Vec<(&'static str, String)>, Refusal> {
    check_request(origin, method)?;
    let (origin, method) = (origin.unwrap_or_default(), method.unwrap_or_default());
    let rules = rules.filter(|r| !r.is_empty()).ok_or(Refusal::NotEnabled)?;
    let wanted: Vec<&str> = request_headers.unwrap_or("").split(',').map(str::trim).filter(|h| !h.is_empty()).collect();
    let rule = rules
        .iter()
        .find(|r| {
            r.origins.iter().any(|p| wildcard_match(p, origin))
                && r.methods.iter().any(|m| m == method)
                && wanted.iter().all(|h| header_allowed(r, h))
        })
        .ok_or(Refusal::NotAllowed)?;
    let mut out = Vec::with_capacity(7);
    common_headers(rule, origin, &mut out);
    if !wanted.is_empty() {
        out.push(("access-control-allow-headers", wanted.join(", ").to_ascii_lowercase()));
    }
    Ok(out)
}

/// The CORS headers of an actual request with `Origin` and `method`.
pub fn actual(rules: &[Rule], origin: &str, method: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(rule) = rules.iter().find(|r| r.origins.iter().any(|p| wildcard_match(p, origin)) && r.methods.iter().any(|m| m == method))
    {
        common_headers(rule, origin, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(methods: &[&str], origins: &[&str], headers: &[&str]) -> Rule {
        Rule {
            methods: methods.iter().map(|s| s.to_string()).collect(),
            origins: origins.iter().map(|s| s.to_string()).collect(),
            allowed_headers: headers.iter().map(|s| s.to_string()).collect(),
            ..Rule::default()
        }
    }

    fn code(e: S3Error) -> String {
        e.code().as_str().to_string()
    }

    #[test]
    fn validation_follows_s3() {
        assert!(validate(&[rule(&["GET", "PUT"], &["https://*.example.com"], &["*"])]).is_ok());
        assert_eq!(code(validate(&[]).unwrap_err()), "MalformedXML");
        assert_eq!(code(validate(&vec![rule(&["GET"], &["*"], &[]); 101]).unwrap_err()), "MalformedXML");
        assert!(validate(&vec![rule(&["GET"], &["*"], &[]); 100]).is_ok());
        assert_eq!(code(validate(&[rule(&["get"], &["*"], &[])]).unwrap_err()), "InvalidRequest");
        assert_eq!(code(validate(&[rule(&["PATCH"], &["*"], &[])]).unwrap_err()), "InvalidRequest");
        assert_eq!(code(validate(&[rule(&["GET"], &["https://*.*.com"], &[])]).unwrap_err()), "InvalidRequest");
        assert_eq!(code(validate(&[rule(&["GET"], &["*"], &["x-*-*"])]).unwrap_err()), "InvalidRequest");
        assert_eq!(code(validate(&[rule(&[], &["*"], &[])]).unwrap_err()), "MalformedXML");
        assert_eq!(code(validate(&[rule(&["GET"], &[], &[])]).unwrap_err()), "MalformedXML");
        let mut r = rule(&["GET"], &["*"], &[]);
        r.expose_headers = vec!["*".into()];
        assert_eq!(code(validate(std::slice::from_ref(&r)).unwrap_err()), "InvalidRequest");
        r.expose_headers = vec!["ETag".into()];
        r.max_age_seconds = Some(-1);
        assert_eq!(code(validate(std::slice::from_ref(&r)).unwrap_err()), "MalformedXML");
        r.max_age_seconds = Some(3000);
        r.id = Some("x".repeat(256));
        assert_eq!(code(validate(std::slice::from_ref(&r)).unwrap_err()), "InvalidArgument");
        // Too large to store.
        let big = rule(&["GET"], &[&"o".repeat(1000)], &[]);
        assert_eq!(code(validate(&vec![big; 100]).unwrap_err()), "InvalidRequest");
    }

    #[test]
    fn wildcards_take_one_star() {
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("https://*.example.com", "https://a.b.example.com"));
        assert!(!wildcard_match("https://*.example.com", "https://example.com"));
        assert!(wildcard_match("http://localhost:*", "http://localhost:8080"));
        assert!(!wildcard_match("ab*ba", "aba"), "prefix and suffix must not overlap");
        assert!(wildcard_match("exact", "exact") && !wildcard_match("exact", "exactly"));
    }

    #[test]
    fn preflight_uses_the_first_matching_rule() {
        let mut a = rule(&["GET"], &["https://app.example.com"], &[]);
        a.max_age_seconds = Some(60);
        let mut b = rule(&["PUT", "POST"], &["https://*.example.com"], &["content-*", "x-amz-*"]);
        b.expose_headers = vec!["ETag".into()];
        let c = rule(&["PUT"], &["*"], &["*"]);
        let rules = vec![a, b, c];
        let get = |h: &[(&str, String)], n: &str| h.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        let h = preflight(Some(&rules), Some("https://app.example.com"), Some("GET"), None).unwrap();
        assert_eq!(get(&h, "access-control-allow-origin").as_deref(), Some("https://app.example.com"));
        assert_eq!(get(&h, "access-control-allow-credentials").as_deref(), Some("true"));
        assert_eq!(get(&h, "access-control-max-age").as_deref(), Some("60"));
        let h = preflight(Some(&rules), Some("https://app.example.com"), Some("PUT"), Some("Content-Type, X-Amz-Date")).unwrap();
        assert_eq!(get(&h, "access-control-allow-methods").as_deref(), Some("PUT, POST"));
        assert_eq!(get(&h, "access-control-allow-headers").as_deref(), Some("content-type, x-amz-date"));
        assert_eq!(get(&h, "access-control-expose-headers").as_deref(), Some("ETag"));
        // A header rule b does not allow: rule c (any origin) answers.
        let h = preflight(Some(&rules), Some("https://app.example.com"), Some("PUT"), Some("authorization")).unwrap();
        assert_eq!(get(&h, "access-control-allow-origin").as_deref(), Some("*"));
        assert_eq!(get(&h, "access-control-allow-credentials"), None);
        // Refusals.
        assert_eq!(preflight(Some(&rules), Some("https://evil.test"), Some("DELETE"), None), Err(Refusal::NotAllowed));
        assert_eq!(preflight(Some(&rules[..1]), Some("https://app.example.com"), Some("PUT"), None), Err(Refusal::NotAllowed));
        assert_eq!(preflight(Some(&rules), None, Some("GET"), None), Err(Refusal::NoOrigin));
        assert_eq!(preflight(Some(&rules), Some("o"), None, None), Err(Refusal::BadMethod));
        assert_eq!(preflight(Some(&rules), Some("o"), Some("PATCH"), None), Err(Refusal::BadMethod));
        assert_eq!(preflight(None, Some("o"), Some("GET"), None), Err(Refusal::NotEnabled));
        assert_eq!(Refusal::NotAllowed.to_error().status_code(), Some(http::StatusCode::FORBIDDEN));
        assert_eq!(Refusal::NoOrigin.to_error().status_code(), Some(http::StatusCode::BAD_REQUEST));
    }

    #[test]
    fn actual_requests_match_origin_and_method() {
        let rules = vec![rule(&["GET"], &["https://a.test"], &[]), rule(&["PUT"], &["*"], &[])];
        assert_eq!(actual(&rules, "https://a.test", "GET")[0], ("access-control-allow-origin", "https://a.test".to_string()));
        assert_eq!(actual(&rules, "https://b.test", "PUT")[0], ("access-control-allow-origin", "*".to_string()));
        assert!(actual(&rules, "https://b.test", "GET").is_empty());
        assert!(actual(&rules, "https://a.test", "DELETE").is_empty());
    }

    #[test]
    fn rules_round_trip_through_the_dto_and_storage() {
        let mut r = rule(&["GET", "HEAD"], &["*"], &["*"]);
        r.id = Some("r1".into());
        r.expose_headers = vec!["ETag".into(), "x-amz-request-id".into()];
        r.max_age_seconds = Some(3000);
        assert_eq!(Rule::from_dto(&r.to_dto()), r);
        let stored = validate(std::slice::from_ref(&r)).unwrap();
        assert_eq!(decode(&stored), vec![r]);
        assert!(decode(b"not json").is_empty());
    }
}
