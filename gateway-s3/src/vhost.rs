//! Virtual-hosted-style addressing: `Host: <bucket>.<domain>[:port]` names
//! the bucket when `<domain>` is one of the configured domains
//! (`[s3] virtual_host_domains`); every other host (an IP address, the
//! domain itself, any other name) is path style. Pure: the `Host` header
//! in, the bucket out.
//!
//! | Host (domains `["localhost", "s3.example.com"]`) | addressing | bucket |
//! |---|---|---|
//! | `127.0.0.1:9000`, `[::1]:9000` | path | first path component |
//! | `localhost:9000`, `s3.example.com` | path | first path component |
//! | `photos.localhost:9000` | virtual | `photos` |
//! | `my.photos.s3.example.com` | virtual | `my.photos` |
//! | `Photos.LOCALHOST` | virtual | `photos` (host names are case-insensitive; bucket names lowercase) |
//! | `.localhost`, `x_y.localhost` (not a bucket name) | path | first path component (the request then names whatever its path names) |
//! | `other.example.org` | path | first path component |
//!
//! The longest matching domain wins. s3s parses requests with
//! [`VirtualHosts`] as its `S3Host`; `route.rs` classifies with the bucket
//! it gives; SigV4 signs the `Host` header as the client sent it, so a
//! virtual-hosted request verifies like any other.

use crate::paths;
use s3s::host::{S3Host, VirtualHost};
use s3s::S3Result;

#[derive(Clone, Debug, Default)]
pub struct VirtualHosts {
    /// Lowercase, without a port; longest first.
    domains: Vec<String>,
}

impl VirtualHosts {
    /// Checks the domains: non-empty labels of letters, digits and `-`, no port.
    pub fn new<S: AsRef<str>>(domains: &[S]) -> Result<VirtualHosts, String> {
        let mut out = Vec::new();
        for d in domains {
            let d = d.as_ref().trim().trim_end_matches('.').to_ascii_lowercase();
            let ok = !d.is_empty()
                && d.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
            if !ok {
                return Err(format!("virtual host domain {d:?}: a DNS name without a port (e.g. \"localhost\", \"s3.example.com\")"));
            }
            if !out.contains(&d) {
                out.push(d);
            }
        }
        out.sort_by_key(|d: &String| std::cmp::Reverse(d.len()));
        Ok(VirtualHosts { domains: out })
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    pub fn domains(&self) -> &[String] {
        &self.domains
    }

    /// The bucket a `Host` header names (module table), lowercase.
    pub fn bucket_of_host(&self, host: &str) -> Option<String> {
        if self.domains.is_empty() || host.starts_with('[') {
            return None;
        }
        let name = match host.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        for d in &self.domains {
            let Some(bucket) = name.strip_suffix(d.as_str()).and_then(|p| p.strip_suffix('.')) else { continue };
            return paths::is_bucket_name(bucket).then(|| bucket.to_string());
        }
        None
    }

    /// The bucket the `Host` header of a request names, if any.
    pub fn bucket_of(&self, headers: &http::HeaderMap) -> Option<String> {
        self.bucket_of_host(headers.get(http::header::HOST)?.to_str().ok()?)
    }
}

impl S3Host for VirtualHosts {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        Ok(match self.bucket_of_host(host) {
            Some(b) => VirtualHost::new(host).with_bucket(b),
            None => VirtualHost::new(host),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_buckets_under_configured_domains_only() {
        let v = VirtualHosts::new(&["localhost", "s3.example.com", "example.com"]).unwrap();
        let b = |h: &str| v.bucket_of_host(h);
        assert_eq!(b("127.0.0.1:9000"), None);
        assert_eq!(b("[::1]:9000"), None);
        assert_eq!(b("localhost:9000"), None);
        assert_eq!(b("s3.example.com"), None, "the longest domain wins: not bucket `s3` of example.com");
        assert_eq!(b("photos.localhost:9000").as_deref(), Some("photos"));
        assert_eq!(b("Photos.LOCALHOST").as_deref(), Some("photos"));
        assert_eq!(b("my.photos.s3.example.com").as_deref(), Some("my.photos"));
        assert_eq!(b("data.example.com").as_deref(), Some("data"));
        assert_eq!(b("photos.localhost.:80").as_deref(), Some("photos"));
        assert_eq!(b(".localhost"), None);
        assert_eq!(b("x_y.localhost"), None);
        assert_eq!(b("other.example.org"), None);
        assert_eq!(b("notlocalhost"), None);
        assert_eq!(VirtualHosts::default().bucket_of_host("photos.localhost"), None);
    }

    #[test]
    fn domains_are_checked() {
        assert!(VirtualHosts::new(&["localhost:9000"]).is_err());
        assert!(VirtualHosts::new(&[""]).is_err());
        assert!(VirtualHosts::new(&["a..b"]).is_err());
        assert!(VirtualHosts::new(&["*.example.com"]).is_err());
        assert_eq!(VirtualHosts::new(&["LocalHost."]).unwrap().domains(), ["localhost"]);
    }
}
