//! Which S3 operation a request is, from its head alone (method, path
//! level, query subresources, `x-amz-copy-source`, content type): for the
//! shared layer's reader guard and body limits, the `route` label of
//! metrics, and the front's reader/writer routing. No I/O.
//!
//! | method | access | body class |
//! |---|---|---|
//! | GET, HEAD, OPTIONS | read | bodiless |
//! | POST `?select` (SelectObjectContent) | read | control |
//! | PUT object, UploadPart | mutation | data |
//! | POST form upload (PostObject) | mutation | control, and signed in the header ([`AuthPolicy::Required`]) |
//! | CopyObject, UploadPartCopy, CreateMultipartUpload, DELETE | mutation | bodiless |
//! | every other PUT / POST (XML documents: DeleteObjects, CompleteMultipartUpload, tagging, bucket configuration) | mutation | control |
//! | any other method | mutation | bodiless |
//!
//! Signatures are verified by s3s (chunk signatures included), so every
//! route but one is `AuthPolicy::Delegated`: the shared layer refuses SigV2,
//! bad credential scopes and over-long presigned URLs before s3s runs. The
//! exception is the browser form upload: s3s reads a form (up to its 5 GiB
//! file limit) *before* it can check the signature inside it, so an
//! anonymous client could make the gateway buffer gigabytes. Browser POST
//! policies are not supported here, so a form POST must carry a SigV4
//! header that the shared layer verifies from the head, and its body is a
//! control body (`max_body_bytes_control`); an unsigned one is refused
//! before a byte of its body is read.

use fskv_gateway::{Access, AuthPolicy, BodyClass, Route};
use http::request::Parts;
use http::Method;

/// The route of an S3 request, with the virtual-hosted-style domains set
/// for this process by [`set_virtual_host_domains`] (the front's
/// classifier; a gateway classifies with its own, [`classify_hosted`]).
pub fn classify(parts: &Parts) -> Route {
    let bucket = PROCESS_DOMAINS.get().and_then(|v| v.bucket_of(&parts.headers));
    classify_hosted(parts, bucket.as_deref())
}

static PROCESS_DOMAINS: std::sync::OnceLock<crate::vhost::VirtualHosts> = std::sync::OnceLock::new();

/// The domains [`classify`] resolves `Host: <bucket>.<domain>` under; the
/// first call wins (a process serves one configuration).
pub fn set_virtual_host_domains(v: crate::vhost::VirtualHosts) {
    let _ = PROCESS_DOMAINS.set(v);
}

/// The route of an S3 request whose `Host` names `vhost_bucket`
/// (virtual-hosted style: the path is the key), or of a path-style one.
pub fn classify_hosted(parts: &Parts, vhost_bucket: Option<&str>) -> Route {
    let query = parts.uri.query().unwrap_or("");
    let (name, access, body) = match vhost_bucket {
        Some(b) => operation(&parts.method, &format!("/{b}{}", parts.uri.path()), query, &parts.headers),
        None => operation(&parts.method, parts.uri.path(), query, &parts.headers),
    };
    let auth = if name == "PostObject" { AuthPolicy::Required } else { AuthPolicy::Delegated };
    Route { name, access, body, auth }
}

/// Query parameter names (subresources) present, percent-decoding not
/// needed: every S3 subresource name is plain ASCII.
fn has(query: &str, name: &str) -> bool {
    query.split('&').any(|p| p.split_once('=').map_or(p, |(k, _)| k) == name)
}

fn operation(method: &Method, path: &str, query: &str, headers: &http::HeaderMap) -> (&'static str, Access, BodyClass) {
    use Access::{Mutation, Read};
    use BodyClass::{Bodiless, Control, Data};
    let rest = path.strip_prefix('/').unwrap_or(path);
    let level = match rest.split_once('/') {
        None if rest.is_empty() => Level::Service,
        None => Level::Bucket,
        Some((_, "")) => Level::Bucket,
        Some(_) => Level::Object,
    };
    let q = |n| has(query, n);
    let copy = headers.contains_key("x-amz-copy-source");
    let form = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("multipart/form-data"));
    match (method, level) {
        (&Method::OPTIONS, _) => ("Options", Read, Bodiless),
        (&Method::GET, Level::Service) => ("ListBuckets", Read, Bodiless),
        (&Method::HEAD, Level::Service) => ("HeadService", Read, Bodiless),
        (&Method::GET, Level::Bucket) => {
            let name = if q("location") {
                "GetBucketLocation"
            } else if q("uploads") {
                "ListMultipartUploads"
            } else if q("versions") {
                "ListObjectVersions"
            } else if q("acl") {
                "GetBucketAcl"
            } else if q("policy") {
                "GetBucketPolicy"
            } else if q("cors") {
                "GetBucketCors"
            } else if q("lifecycle") {
                "GetBucketLifecycle"
            } else if query.split('&').any(|p| p == "list-type=2") {
                "ListObjectsV2"
            } else if query.split('&').any(|p| {
                matches!(
                    p.split_once('=').map_or(p, |(k, _)| k),
                    "prefix" | "delimiter" | "marker" | "max-keys" | "encoding-type" | "list-type" | ""
                )
            }) {
                "ListObjects"
            } else {
                "GetBucketConfig"
            };
            (name, Read, Bodiless)
        }
        (&Method::HEAD, Level::Bucket) => ("HeadBucket", Read, Bodiless),
        (&Method::GET, Level::Object) => {
            let name = if q("uploadId") {
                "ListParts"
            } else if q("tagging") {
                "GetObjectTagging"
            } else if q("acl") {
                "GetObjectAcl"
            } else if q("attributes") {
                "GetObjectAttributes"
            } else {
                "GetObject"
            };
            (name, Read, Bodiless)
        }
        (&Method::HEAD, Level::Object) => ("HeadObject", Read, Bodiless),
        (&Method::PUT, Level::Bucket) if query.is_empty() => ("CreateBucket", Mutation, Control),
        (&Method::PUT, Level::Bucket) if q("cors") => ("PutBucketCors", Mutation, Control),
        (&Method::PUT, Level::Bucket) if q("lifecycle") => ("PutBucketLifecycle", Mutation, Control),
        (&Method::PUT, Level::Bucket) => ("PutBucketConfig", Mutation, Control),
        (&Method::DELETE, Level::Bucket) if query.is_empty() => ("DeleteBucket", Mutation, Bodiless),
        (&Method::DELETE, Level::Bucket) if q("cors") => ("DeleteBucketCors", Mutation, Bodiless),
        (&Method::DELETE, Level::Bucket) if q("lifecycle") => ("DeleteBucketLifecycle", Mutation, Bodiless),
        (&Method::DELETE, Level::Bucket) => ("DeleteBucketConfig", Mutation, Bodiless),
        (&Method::POST, Level::Bucket) if q("delete") => ("DeleteObjects", Mutation, Control),
        (&Method::POST, Level::Bucket) if form => ("PostObject", Mutation, Control),
        (&Method::PUT, Level::Object) if q("uploadId") && copy => ("UploadPartCopy", Mutation, Bodiless),
        (&Method::PUT, Level::Object) if q("uploadId") => ("UploadPart", Mutation, Data),
        (&Method::PUT, Level::Object) if q("tagging") => ("PutObjectTagging", Mutation, Control),
        (&Method::PUT, Level::Object) if q("acl") => ("PutObjectAcl", Mutation, Control),
        (&Method::PUT, Level::Object) if copy => ("CopyObject", Mutation, Bodiless),
        (&Method::PUT, Level::Object) => ("PutObject", Mutation, Data),
        (&Method::DELETE, Level::Object) if q("uploadId") => ("AbortMultipartUpload", Mutation, Bodiless),
        (&Method::DELETE, Level::Object) if q("tagging") => ("DeleteObjectTagging", Mutation, Bodiless),
        (&Method::DELETE, Level::Object) => ("DeleteObject", Mutation, Bodiless),
        (&Method::POST, Level::Object) if q("uploads") => ("CreateMultipartUpload", Mutation, Bodiless),
        (&Method::POST, Level::Object) if q("uploadId") => ("CompleteMultipartUpload", Mutation, Control),
        (&Method::POST, Level::Object) if q("select") => ("SelectObjectContent", Read, Control),
        (&Method::POST, _) => ("PostOther", Mutation, Control),
        (&Method::PUT, Level::Service) | (&Method::DELETE, Level::Service) => ("ServiceOther", Mutation, Bodiless),
        _ => ("Other", Mutation, Bodiless),
    }
}

#[derive(Clone, Copy)]
enum Level {
    Service,
    Bucket,
    Object,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: &str, uri: &str, headers: &[(&str, &str)]) -> Route {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        classify(&b.body(()).unwrap().into_parts().0)
    }

    /// method, URI, headers, expected name, access, body class.
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str, Access, BodyClass);

    #[test]
    fn operations() {
        use Access::{Mutation, Read};
        use BodyClass::{Bodiless, Control, Data};
        let cases: &[Case] = &[
            ("GET", "/", &[], "ListBuckets", Read, Bodiless),
            ("GET", "/b", &[], "ListObjects", Read, Bodiless),
            ("GET", "/b/", &[("x", "y")], "ListObjects", Read, Bodiless),
            ("GET", "/b?list-type=2&prefix=a", &[], "ListObjectsV2", Read, Bodiless),
            ("GET", "/b?prefix=a&delimiter=%2F", &[], "ListObjects", Read, Bodiless),
            ("GET", "/b?location", &[], "GetBucketLocation", Read, Bodiless),
            ("GET", "/b?uploads", &[], "ListMultipartUploads", Read, Bodiless),
            ("GET", "/b?versions", &[], "ListObjectVersions", Read, Bodiless),
            ("GET", "/b?versioning", &[], "GetBucketConfig", Read, Bodiless),
            ("HEAD", "/b", &[], "HeadBucket", Read, Bodiless),
            ("GET", "/b/k/with/slashes", &[], "GetObject", Read, Bodiless),
            ("GET", "/b/k?uploadId=x", &[], "ListParts", Read, Bodiless),
            ("GET", "/b/k?tagging", &[], "GetObjectTagging", Read, Bodiless),
            ("HEAD", "/b/k", &[], "HeadObject", Read, Bodiless),
            ("OPTIONS", "/b/k", &[], "Options", Read, Bodiless),
            ("PUT", "/b", &[], "CreateBucket", Mutation, Control),
            ("PUT", "/b?cors", &[], "PutBucketCors", Mutation, Control),
            ("GET", "/b?cors", &[], "GetBucketCors", Read, Bodiless),
            ("DELETE", "/b?cors", &[], "DeleteBucketCors", Mutation, Bodiless),
            ("PUT", "/b?lifecycle", &[], "PutBucketLifecycle", Mutation, Control),
            ("GET", "/b?lifecycle", &[], "GetBucketLifecycle", Read, Bodiless),
            ("DELETE", "/b?lifecycle", &[], "DeleteBucketLifecycle", Mutation, Bodiless),
            ("GET", "/b/k?attributes", &[], "GetObjectAttributes", Read, Bodiless),
            ("DELETE", "/b", &[], "DeleteBucket", Mutation, Bodiless),
            ("POST", "/b?delete", &[], "DeleteObjects", Mutation, Control),
            ("POST", "/b", &[("content-type", "multipart/form-data; boundary=x")], "PostObject", Mutation, Control),
            ("PUT", "/b/k", &[], "PutObject", Mutation, Data),
            ("PUT", "/b/k", &[("x-amz-copy-source", "/a/b")], "CopyObject", Mutation, Bodiless),
            ("PUT", "/b/k?partNumber=1&uploadId=u", &[], "UploadPart", Mutation, Data),
            ("PUT", "/b/k?partNumber=1&uploadId=u", &[("x-amz-copy-source", "/a/b")], "UploadPartCopy", Mutation, Bodiless),
            ("PUT", "/b/k?tagging", &[], "PutObjectTagging", Mutation, Control),
            ("DELETE", "/b/k", &[], "DeleteObject", Mutation, Bodiless),
            ("DELETE", "/b/k?uploadId=u", &[], "AbortMultipartUpload", Mutation, Bodiless),
            ("DELETE", "/b/k?tagging", &[], "DeleteObjectTagging", Mutation, Bodiless),
            ("POST", "/b/k?uploads", &[], "CreateMultipartUpload", Mutation, Bodiless),
            ("POST", "/b/k?uploadId=u", &[], "CompleteMultipartUpload", Mutation, Control),
            ("POST", "/b/k?select&select-type=2", &[], "SelectObjectContent", Read, Control),
            ("PATCH", "/b/k", &[], "Other", Mutation, Bodiless),
        ];
        for (m, uri, h, name, access, body) in cases {
            let r = route(m, uri, h);
            assert_eq!((r.name, r.access, r.body), (*name, *access, *body), "{m} {uri}");
            let auth = if *name == "PostObject" { AuthPolicy::Required } else { AuthPolicy::Delegated };
            assert_eq!(r.auth, auth, "{m} {uri}: only a form upload is authenticated by the shared layer from its head");
        }
    }

    #[test]
    fn virtual_hosted_requests_name_the_bucket_in_the_host() {
        let hosted = |m: &str, uri: &str| {
            let parts = http::Request::builder().method(m).uri(uri).body(()).unwrap().into_parts().0;
            let r = classify_hosted(&parts, Some("b"));
            (r.name, r.access, r.body)
        };
        assert_eq!(hosted("PUT", "/k"), ("PutObject", Access::Mutation, BodyClass::Data));
        assert_eq!(hosted("PUT", "/a/b/c?partNumber=1&uploadId=u"), ("UploadPart", Access::Mutation, BodyClass::Data));
        assert_eq!(hosted("PUT", "/"), ("CreateBucket", Access::Mutation, BodyClass::Control));
        assert_eq!(hosted("GET", "/?list-type=2"), ("ListObjectsV2", Access::Read, BodyClass::Bodiless));
        assert_eq!(hosted("GET", "/k"), ("GetObject", Access::Read, BodyClass::Bodiless));
        assert_eq!(hosted("DELETE", "/?cors"), ("DeleteBucketCors", Access::Mutation, BodyClass::Bodiless));
    }

    #[test]
    fn every_state_change_is_a_mutation() {
        // Whatever the path and query, only GET/HEAD/OPTIONS (and SELECT) read.
        for m in ["PUT", "POST", "DELETE", "PATCH"] {
            for uri in ["/", "/b", "/b/k", "/b?acl", "/b/k?acl", "/b/k?restore", "/b?lifecycle"] {
                let r = route(m, uri, &[]);
                assert_eq!(r.access, Access::Mutation, "{m} {uri}");
            }
        }
        for m in ["GET", "HEAD"] {
            for uri in ["/", "/b", "/b/k", "/b?acl", "/b/k?acl", "/b?uploads", "/b/k?uploadId=1"] {
                assert_eq!(route(m, uri, &[]).access, Access::Read, "{m} {uri}");
            }
        }
    }
}
