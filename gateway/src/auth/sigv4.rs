//! SigV4 verification by re-signing: the received request is signed again
//! with the AWS signer (`aws-sigv4`) and the key store's secret, and the two
//! signatures are compared in constant time. Pure: the caller passes `now`.
//!
//! | step | rule | refusal |
//! |---|---|---|
//! | scheme | `Authorization: AWS4-HMAC-SHA256 …` or the `X-Amz-*` presigned query, not both | `MalformedHeader` |
//! | | `Authorization: AWS …` or `?Signature=…&AWSAccessKeyId=…` (SigV2: no expiry, replayable) | `SigV2Refused` |
//! | | another scheme (SigV4a, Basic, …) | `UnsupportedAlgorithm` |
//! | parse | `Credential=AK/YYYYMMDD/region/service/aws4_request`, `SignedHeaders=a;b`, `Signature=<64 hex>` | `MalformedHeader` / `MalformedQuery` |
//! | | `x-amz-security-token` / `X-Amz-Security-Token` present | `SessionToken` |
//! | scope | service one of the verifier's; region the verifier's | `WrongService` / `WrongRegion` |
//! | date | `x-amz-date` / `X-Amz-Date` is `YYYYMMDDTHHMMSSZ`, its day equals the scope's | `Malformed*` |
//! | time (header) | within 15 min of `now` | `TimeSkewed` |
//! | time (presigned) | `1 ≤ X-Amz-Expires ≤ 604800` (7 days); date ≤ now + 15 min; now ≤ date + expires | `ExpiresTooLong` / `NotYetValid` / `Expired` |
//! | headers | `host` signed; every signed header present, visible ASCII | `Malformed*` |
//! | key | the access key is in the store | `UnknownAccessKey` |
//! | payload | header auth: `x-amz-content-sha256` as sent (a hex hash, `UNSIGNED-PAYLOAD`, `STREAMING-…`); without it the SHA-256 of the body the caller passes (no body: `NeedsBody`); a hex hash must equal the passed body's. Presigned: `UNSIGNED-PAYLOAD` | `NeedsBody` / `ContentSha256Mismatch` |
//! | signature | re-signed over the signed headers only, the path percent-decoded and S3-encoded once (no `.`/`..`/`//` normalisation), the query minus `X-Amz-Signature`, compared in constant time; when the path as sent differs from its canonical encoding (reserved characters sent raw) the path as sent is tried too | `SignatureMismatch` |

use super::keys::{AuthMethod, KeyStore, Principal};
use crate::error::AuthError;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SessionTokenMode, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
    UriPathNormalizationMode,
};
use http::request::Parts;
use http::HeaderMap;
use percent_encoding::{percent_decode_str, AsciiSet, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use subtle::ConstantTimeEq;

pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// Largest distance between a request's date and the server's clock.
pub const MAX_SKEW_SECS: u64 = 15 * 60;
/// Longest validity of a presigned request (AWS's limit).
pub const MAX_PRESIGN_SECS: u64 = 7 * 24 * 3600;
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// Presigned-query parameters the signer adds back itself.
const PRESIGN_PARAMS: [&str; 6] =
    ["X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature"];

/// Bytes kept as they are in a canonical S3 path: unreserved and `/`.
const S3_PATH: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');

/// The credentials a request carries, judged from its head alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheme<'a> {
    /// No `Authorization` header and no signature in the query.
    Anonymous,
    /// `Authorization: Bearer <token>`.
    Bearer(&'a str),
    /// `Authorization: AWS4-HMAC-SHA256 …`.
    SigV4Header(&'a str),
    /// `X-Amz-Algorithm=…` in the query.
    SigV4Query,
}

/// Classifies the credentials of a request; SigV2, other schemes and
/// ambiguous requests are refused here.
pub fn scheme(parts: &Parts) -> Result<Scheme<'_>, AuthError> {
    let mut auth = parts.headers.get_all(http::header::AUTHORIZATION).iter();
    let header = match (auth.next(), auth.next()) {
        (None, _) => None,
        (Some(v), None) => Some(v.to_str().map_err(|_| AuthError::MalformedHeader("not visible ASCII".into()))?),
        (Some(_), Some(_)) => return Err(AuthError::MalformedHeader("more than one Authorization header".into())),
    };
    let mut v4_query = false;
    let mut v2_query = false;
    if let Some(q) = parts.uri.query() {
        for (k, _) in query_pairs(q) {
            match k.as_str() {
                "X-Amz-Algorithm" | "X-Amz-Signature" | "X-Amz-Credential" => v4_query = true,
                "Signature" | "AWSAccessKeyId" => v2_query = true,
                _ => {}
            }
        }
    }
    match header {
        Some(h) => {
            if v4_query || v2_query {
                return Err(AuthError::MalformedHeader("credentials both in the Authorization header and in the query".into()));
            }
            let (word, rest) = h.split_once(' ').unwrap_or((h, ""));
            match word {
                ALGORITHM => Ok(Scheme::SigV4Header(rest)),
                "AWS" => Err(AuthError::SigV2Refused),
                w if w.eq_ignore_ascii_case("bearer") => Ok(Scheme::Bearer(rest.trim())),
                w => Err(AuthError::UnsupportedAlgorithm(w.chars().take(40).collect())),
            }
        }
        None if v4_query => Ok(Scheme::SigV4Query),
        None if v2_query => Err(AuthError::SigV2Refused),
        None => Ok(Scheme::Anonymous),
    }
}

/// `k=v` pairs of a raw query, percent-decoded (`+` stays `+`).
fn query_pairs(q: &str) -> impl Iterator<Item = (String, String)> + '_ {
    q.split('&').filter(|p| !p.is_empty()).map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        (percent_decode_str(k).decode_utf8_lossy().into_owned(), percent_decode_str(v).decode_utf8_lossy().into_owned())
    })
}

/// A SigV4 request parsed and checked for everything but its signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigV4Request {
    pub access_key: String,
    /// `YYYYMMDDTHHMMSSZ` as sent.
    pub amz_date: String,
    pub time: SystemTime,
    pub region: String,
    pub service: String,
    /// Lowercase names, in the order sent.
    pub signed_headers: Vec<String>,
    /// Lowercase hex, as sent.
    pub signature: String,
    /// `X-Amz-Expires` of a presigned request; `None` for header auth.
    pub presigned_expires_secs: Option<u64>,
}

/// A request whose signature verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub principal: Principal,
    pub request: SigV4Request,
    /// The payload hash the signature covers (hex, `UNSIGNED-PAYLOAD` or a `STREAMING-…` marker).
    pub payload_hash: String,
}

/// Verifies SigV4 requests against a [`KeyStore`] for one region and a set
/// of services (`s3`, `sqs`, …).
#[derive(Clone, Debug)]
pub struct SigV4Verifier {
    keys: Arc<KeyStore>,
    region: String,
    services: Vec<String>,
}

impl SigV4Verifier {
    pub fn new(keys: Arc<KeyStore>, region: impl Into<String>, services: &[&str]) -> Self {
        SigV4Verifier { keys, region: region.into(), services: services.iter().map(|s| s.to_string()).collect() }
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.keys
    }

    /// Parses the SigV4 credentials of a request and checks everything that
    /// needs neither the key nor an HMAC (scheme, scope, dates, expiry).
    /// `Ok(None)`: no SigV4 credentials (anonymous or bearer).
    pub fn precheck(&self, parts: &Parts, now: SystemTime) -> Result<Option<SigV4Request>, AuthError> {
        Ok(self.parse_checked(parts, now)?.map(Parsed::into_owned))
    }

    /// [`SigV4Verifier::precheck`] without its result: no allocation for
    /// header auth (what the shared layer runs on every delegated request).
    pub fn check(&self, parts: &Parts, now: SystemTime) -> Result<(), AuthError> {
        self.parse_checked(parts, now).map(drop)
    }

    fn parse_checked<'a>(&self, parts: &'a Parts, now: SystemTime) -> Result<Option<Parsed<'a>>, AuthError> {
        let req = match scheme(parts)? {
            Scheme::Anonymous | Scheme::Bearer(_) => return Ok(None),
            Scheme::SigV4Header(rest) => self.parse_header(rest, &parts.headers)?,
            Scheme::SigV4Query => self.parse_query(parts.uri.query().unwrap_or(""))?,
        };
        check_time(req.time, req.presigned_expires_secs, now)?;
        Ok(Some(req))
    }

    /// Verifies a request's SigV4 signature. `body`: the whole body when the
    /// caller has read it (needed when the request has no
    /// `x-amz-content-sha256`; checked against it when it has a hash).
    pub fn verify(&self, parts: &Parts, body: Option<&[u8]>, now: SystemTime) -> Result<Verified, AuthError> {
        let req = self.precheck(parts, now)?.ok_or(AuthError::Missing)?;
        let key = self.keys.get(&req.access_key).ok_or(AuthError::UnknownAccessKey)?;
        let payload_hash = match req.presigned_expires_secs {
            Some(_) => UNSIGNED_PAYLOAD.to_string(),
            None => payload_hash(&parts.headers, body)?,
        };
        let headers = signed_header_values(&req, &parts.headers)?;
        let raw_path = parts.uri.path();
        let canonical_path = s3_encode_path(raw_path);
        let query = match req.presigned_expires_secs {
            Some(_) => strip_presign_params(parts.uri.query().unwrap_or("")),
            None => parts.uri.query().unwrap_or("").to_string(),
        };
        let check = |path: &str| -> Result<bool, AuthError> {
            let sig = self.sign(parts.method.as_str(), path, &query, &headers, &payload_hash, &req, &key.access_key, &key.secret_key)?;
            Ok(bool::from(sig.as_bytes().ct_eq(req.signature.as_bytes())))
        };
        let ok = check(&canonical_path)? || (canonical_path != raw_path && check(raw_path)?);
        if !ok {
            tracing::debug!(access_key = %req.access_key, "SigV4 signature mismatch");
            return Err(AuthError::SignatureMismatch);
        }
        let method = if req.presigned_expires_secs.is_some() { AuthMethod::SigV4Presigned } else { AuthMethod::SigV4Header };
        Ok(Verified { principal: key.principal(method), request: req, payload_hash })
    }

    #[allow(clippy::too_many_arguments)]
    fn sign(
        &self,
        method: &str,
        path: &str,
        query: &str,
        headers: &[(&str, &str)],
        payload_hash: &str,
        req: &SigV4Request,
        access_key: &str,
        secret_key: &str,
    ) -> Result<String, AuthError> {
        let creds = aws_credential_types::Credentials::new(access_key, secret_key, None, None, "fskv-key-store");
        let identity = creds.into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
        settings.excluded_headers = None;
        settings.session_token_mode = SessionTokenMode::Exclude;
        match req.presigned_expires_secs {
            Some(secs) => {
                settings.signature_location = SignatureLocation::QueryParams;
                settings.expires_in = Some(Duration::from_secs(secs));
            }
            None => settings.signature_location = SignatureLocation::Headers,
        }
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&req.region)
            .name(&req.service)
            .time(req.time)
            .settings(settings)
            .build()
            .map_err(|e| AuthError::MalformedHeader(e.to_string()))?
            .into();
        let uri = if query.is_empty() { path.to_string() } else { format!("{path}?{query}") };
        let body = match payload_hash {
            UNSIGNED_PAYLOAD => SignableBody::UnsignedPayload,
            h => SignableBody::Precomputed(h.to_string()),
        };
        let signable = SignableRequest::new(method, uri, headers.iter().copied(), body)
            .map_err(|e| AuthError::MalformedHeader(format!("cannot re-sign the request: {e}")))?;
        let out = sign(signable, &params).map_err(|e| AuthError::MalformedHeader(format!("cannot re-sign the request: {e}")))?;
        Ok(out.signature().to_string())
    }

    /// `(access key, day, region, service)` of a credential scope.
    fn check_scope<'a>(&self, cred: &'a str, malformed: fn(String) -> AuthError) -> Result<[&'a str; 4], AuthError> {
        let mut it = cred.rsplitn(5, '/');
        let (Some(term), Some(service), Some(region), Some(day), Some(ak)) = (it.next(), it.next(), it.next(), it.next(), it.next()) else {
            return Err(malformed(format!("Credential {cred:?} is not AK/YYYYMMDD/region/service/aws4_request")));
        };
        if term != "aws4_request" || ak.is_empty() || day.len() != 8 {
            return Err(malformed(format!("Credential {cred:?} is not AK/YYYYMMDD/region/service/aws4_request")));
        }
        if !self.services.iter().any(|s| s == service) {
            return Err(AuthError::WrongService { got: service.to_string(), expected: self.services.join(" or ") });
        }
        if region != self.region {
            return Err(AuthError::WrongRegion { got: region.to_string(), expected: self.region.clone() });
        }
        Ok([ak, day, region, service])
    }

    fn parse_header<'a>(&self, rest: &'a str, headers: &'a HeaderMap) -> Result<Parsed<'a>, AuthError> {
        let bad = AuthError::MalformedHeader;
        let (mut cred, mut signed, mut sig) = (None, None, None);
        for part in rest.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (k, v) = part.split_once('=').ok_or_else(|| bad(format!("{part:?} is not key=value")))?;
            let slot = match k.trim() {
                "Credential" => &mut cred,
                "SignedHeaders" => &mut signed,
                "Signature" => &mut sig,
                other => return Err(bad(format!("unknown component {:?}", other.chars().take(40).collect::<String>()))),
            };
            if slot.replace(v.trim()).is_some() {
                return Err(bad(format!("{k} given twice")));
            }
        }
        let (Some(cred), Some(signed), Some(sig)) = (cred, signed, sig) else {
            return Err(bad("Credential, SignedHeaders and Signature are all required".into()));
        };
        if headers.contains_key("x-amz-security-token") {
            return Err(AuthError::SessionToken);
        }
        let [access_key, day, region, service] = self.check_scope(cred, bad)?;
        let amz_date = single_header(headers, "x-amz-date")?.ok_or_else(|| bad("the x-amz-date header is required".into()))?;
        let time = parse_amz_date(amz_date).ok_or_else(|| bad(format!("x-amz-date {amz_date:?} is not YYYYMMDDTHHMMSSZ")))?;
        if !amz_date.starts_with(day) {
            return Err(bad(format!("the credential scope's date {day} is not the day of x-amz-date {amz_date}")));
        }
        check_signed_headers(signed, bad)?;
        check_signature(sig, bad)?;
        Ok(Parsed {
            access_key: Cow::Borrowed(access_key),
            amz_date: Cow::Borrowed(amz_date),
            time,
            region: Cow::Borrowed(region),
            service: Cow::Borrowed(service),
            signed_headers: Cow::Borrowed(signed),
            signature: Cow::Borrowed(sig),
            presigned_expires_secs: None,
        })
    }

    fn parse_query(&self, query: &str) -> Result<Parsed<'static>, AuthError> {
        let bad = AuthError::MalformedQuery;
        let mut found: [Option<String>; 6] = Default::default();
        for (k, v) in query_pairs(query) {
            if k == "X-Amz-Security-Token" {
                return Err(AuthError::SessionToken);
            }
            if let Some(i) = PRESIGN_PARAMS.iter().position(|p| *p == k) {
                if found[i].replace(v).is_some() {
                    return Err(bad(format!("{k} given twice")));
                }
            }
        }
        let [Some(alg), Some(cred), Some(amz_date), Some(expires), Some(signed), Some(sig)] = found else {
            return Err(bad(format!("presigned requests need all of {}", PRESIGN_PARAMS.join(", "))));
        };
        if alg != ALGORITHM {
            return Err(AuthError::UnsupportedAlgorithm(alg.chars().take(40).collect()));
        }
        let [access_key, day, region, service] = self.check_scope(&cred, bad)?;
        let time = parse_amz_date(&amz_date).ok_or_else(|| bad(format!("X-Amz-Date {amz_date:?} is not YYYYMMDDTHHMMSSZ")))?;
        if !amz_date.starts_with(day) {
            return Err(bad(format!("the credential scope's date {day} is not the day of X-Amz-Date {amz_date}")));
        }
        let secs: u64 = expires.parse().map_err(|_| bad(format!("X-Amz-Expires {expires:?} is not a number of seconds")))?;
        if secs == 0 {
            return Err(bad("X-Amz-Expires must be at least 1".into()));
        }
        if secs > MAX_PRESIGN_SECS {
            return Err(AuthError::ExpiresTooLong { secs });
        }
        check_signed_headers(&signed, bad)?;
        check_signature(&sig, bad)?;
        Ok(Parsed {
            access_key: Cow::Owned(access_key.to_string()),
            region: Cow::Owned(region.to_string()),
            service: Cow::Owned(service.to_string()),
            amz_date: Cow::Owned(amz_date),
            time,
            signed_headers: Cow::Owned(signed),
            signature: Cow::Owned(sig),
            presigned_expires_secs: Some(secs),
        })
    }
}

/// A request's SigV4 credentials as parsed, borrowed from its head where
/// they can be.
struct Parsed<'a> {
    access_key: Cow<'a, str>,
    amz_date: Cow<'a, str>,
    time: SystemTime,
    region: Cow<'a, str>,
    service: Cow<'a, str>,
    /// Checked by [`check_signed_headers`].
    signed_headers: Cow<'a, str>,
    signature: Cow<'a, str>,
    presigned_expires_secs: Option<u64>,
}

impl Parsed<'_> {
    fn into_owned(self) -> SigV4Request {
        SigV4Request {
            signed_headers: self.signed_headers.split(';').map(str::to_string).collect(),
            access_key: self.access_key.into_owned(),
            amz_date: self.amz_date.into_owned(),
            time: self.time,
            region: self.region.into_owned(),
            service: self.service.into_owned(),
            signature: self.signature.into_owned(),
            presigned_expires_secs: self.presigned_expires_secs,
        }
    }
}

fn check_time(time: SystemTime, presigned_expires_secs: Option<u64>, now: SystemTime) -> Result<(), AuthError> {
    let t = unix_secs(time);
    let now = unix_secs(now);
    match presigned_expires_secs {
        None if t.abs_diff(now) > MAX_SKEW_SECS => Err(AuthError::TimeSkewed),
        None => Ok(()),
        Some(_) if t > now + MAX_SKEW_SECS as i64 => Err(AuthError::NotYetValid),
        Some(secs) if now > t + secs as i64 => Err(AuthError::Expired),
        Some(_) => Ok(()),
    }
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

fn single_header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, AuthError> {
    let mut all = headers.get_all(name).iter();
    match (all.next(), all.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => v.to_str().map(Some).map_err(|_| AuthError::MalformedHeader(format!("{name} is not visible ASCII"))),
        _ => Err(AuthError::MalformedHeader(format!("more than one {name} header"))),
    }
}

fn check_signed_headers(s: &str, bad: fn(String) -> AuthError) -> Result<(), AuthError> {
    let valid = |h: &str| !h.is_empty() && h.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if !s.split(';').all(valid) {
        return Err(bad(format!("SignedHeaders {s:?} must be lowercase header names separated by ';'")));
    }
    if !s.split(';').any(|h| h == "host") {
        return Err(bad("the host header must be signed".into()));
    }
    Ok(())
}

fn check_signature(s: &str, bad: fn(String) -> AuthError) -> Result<(), AuthError> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(bad("Signature must be 64 lowercase hex digits".into()));
    }
    Ok(())
}

/// `(name, value)` of every signed header, as the signer takes them.
fn signed_header_values<'a>(req: &'a SigV4Request, headers: &'a HeaderMap) -> Result<Vec<(&'a str, &'a str)>, AuthError> {
    let mut out = Vec::with_capacity(req.signed_headers.len() + 1);
    for name in &req.signed_headers {
        let mut any = false;
        for v in headers.get_all(name.as_str()) {
            let v = v.to_str().map_err(|_| AuthError::MalformedHeader(format!("signed header {name} is not visible ASCII")))?;
            out.push((name.as_str(), v));
            any = true;
        }
        if !any {
            return Err(AuthError::MalformedHeader(format!("signed header {name} is not in the request")));
        }
    }
    Ok(out)
}

fn payload_hash(headers: &HeaderMap, body: Option<&[u8]>) -> Result<String, AuthError> {
    match single_header(headers, "x-amz-content-sha256")? {
        Some(h) => {
            let is_hash = h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit());
            if is_hash {
                if let Some(body) = body {
                    if !hex::encode(Sha256::digest(body)).eq_ignore_ascii_case(h) {
                        return Err(AuthError::ContentSha256Mismatch);
                    }
                }
            } else if h != UNSIGNED_PAYLOAD && !h.starts_with("STREAMING-") {
                return Err(AuthError::MalformedHeader(format!("x-amz-content-sha256 {h:?} is neither a SHA-256 nor a known marker")));
            }
            Ok(h.to_string())
        }
        None => match body {
            Some(b) => Ok(hex::encode(Sha256::digest(b))),
            None => Err(AuthError::NeedsBody),
        },
    }
}

/// The path percent-decoded and encoded once as S3 canonicalises it.
pub fn s3_encode_path(raw: &str) -> String {
    let bytes: Vec<u8> = percent_decode_str(raw).collect();
    percent_encoding::percent_encode(&bytes, S3_PATH).to_string()
}

/// The raw query without the parameters the signer adds back.
fn strip_presign_params(q: &str) -> String {
    q.split('&')
        .filter(|p| {
            let k = p.split_once('=').map_or(*p, |(k, _)| k);
            let k = percent_decode_str(k).decode_utf8_lossy();
            !p.is_empty() && !PRESIGN_PARAMS.contains(&k.as_ref())
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// `YYYYMMDDTHHMMSSZ` → time.
pub fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = &b[r];
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let (y, mo, d, h, mi, se) = (num(0..4)?, num(4..6)?, num(6..8)?, num(9..11)?, num(11..13)?, num(13..15)?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&mo) || d < 1 || d > month_days[(mo - 1) as usize] || h > 23 || mi > 59 || se > 59
    {
        return None;
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se;
    Some(UNIX_EPOCH + Duration::from_secs(secs as u64))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates() {
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(UNIX_EPOCH));
        assert_eq!(unix_secs(parse_amz_date("20130524T000000Z").unwrap()), 1_369_353_600);
        assert_eq!(unix_secs(parse_amz_date("20240229T235959Z").unwrap()), 1_709_251_199);
        for bad in
            ["20130524T000000", "2013-05-24T00:00:00Z", "20130230T000000Z", "20131324T000000Z", "20130524T240000Z", "2013052aT000000Z", ""]
        {
            assert_eq!(parse_amz_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn path_encoding() {
        assert_eq!(s3_encode_path("/b/a%20b/caf%C3%A9+%25~"), "/b/a%20b/caf%C3%A9%2B%25~");
        assert_eq!(s3_encode_path("/b/test$file.text"), "/b/test%24file.text");
        assert_eq!(s3_encode_path("/b//./../k"), "/b//./../k");
    }

    #[test]
    fn presign_params_stripped() {
        let q = "X-Amz-Algorithm=AWS4-HMAC-SHA256&prefix=a%2Bb&X-Amz-Signature=00&uploads&X-Amz-Date=1";
        assert_eq!(strip_presign_params(q), "prefix=a%2Bb&uploads");
    }
}
