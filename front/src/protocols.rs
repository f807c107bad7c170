//! The protocols the front routes: one line per protocol.
//!
//! | protocol | classifier | gateway command | SigV4 prechecked at the front | errors |
//! |---|---|---|---|---|
//! | `s3` | `fskv_gateway_s3::route::classify` | `fskv gateway s3` | service `s3` (scheme, scope, dates, presign expiry: the shared layer's `Delegated` checks) | S3 XML |
//! | `kv` | not built yet (issue 15: `fskv_gateway_kv::route::classify`) | `fskv gateway kv` | — | JSON |
//! | `mq` | not built yet (issue 16: `fskv_gateway_mq::route::classify`) | `fskv gateway mq` | — | JSON |
//!
//! Adding a protocol is one [`ProtocolSpec`] in [`PROTOCOLS`] (and its
//! `[front.<name>]` pools in [`crate::config::FrontConfig::pools`]). The
//! front never verifies a signature itself: the gateway does, on the
//! request exactly as the client sent it. With `sigv4_services` set, the
//! checks that need no key (SigV2 refused, credential scope, dates) run at
//! the front too, so a request the gateway would refuse anyway does not
//! start a process; with it empty every route is `Open` at the front.

use bytes::Bytes;
use fskv_gateway::{ErrorReply, GatewayError, Route};
use http::request::Parts;
use http::Response;

/// How a protocol's error responses look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorFormat {
    /// `<Error><Code>…</Code><Message>…</Message><RequestId>…</RequestId></Error>`.
    S3Xml,
    /// `{"error": {"code", "message", "request_id"}}` (KV and MQ native APIs).
    Json,
}

/// Everything the front needs to know about a protocol.
#[derive(Debug)]
pub struct ProtocolSpec {
    /// `s3`, `kv`, `mq`: the `[front.<name>]` section, the metrics label.
    pub name: &'static str,
    /// The gateway crate's own classifier (pure, from the head alone).
    pub classify: fn(&Parts) -> Route,
    /// Arguments of `fskv` that run one gateway process of the protocol
    /// (followed by `--role`, `--listen`, `--mgmtd`, `--credentials`, …).
    pub gateway_command: &'static [&'static str],
    /// Whether that command takes `--region`.
    pub gateway_takes_region: bool,
    /// SigV4 services of the key-free prechecks at the front (empty: none).
    pub sigv4_services: &'static [&'static str],
    pub error_format: ErrorFormat,
}

/// S3 (`gateway-s3`).
pub const S3: ProtocolSpec = ProtocolSpec {
    name: "s3",
    classify: fskv_gateway_s3::route::classify,
    gateway_command: &["gateway", "s3"],
    gateway_takes_region: true,
    sigv4_services: &["s3"],
    error_format: ErrorFormat::S3Xml,
};

/// Every protocol this build routes. KV (issue 15) and MQ (issue 16) join
/// with one line each once their gateway crates export `route::classify`.
pub const PROTOCOLS: &[&ProtocolSpec] = &[
    &S3,
    // &KV,  // issue 15: fskv_gateway_kv::route::classify, `fskv gateway kv`, JSON errors
    // &MQ,  // issue 16: fskv_gateway_mq::route::classify, `fskv gateway mq`, JSON errors
];

/// The protocol named `name`, if this build routes it.
pub fn lookup(name: &str) -> Option<&'static ProtocolSpec> {
    PROTOCOLS.iter().copied().find(|p| p.name == name)
}

impl ProtocolSpec {
    /// A reply in the protocol's format, with `Retry-After` when given.
    pub fn render(&self, reply: &ErrorReply, request_id: &str, retry_after_s: Option<u64>) -> Response<Bytes> {
        let mut resp = match self.error_format {
            ErrorFormat::Json => reply.json(request_id),
            ErrorFormat::S3Xml => {
                use s3s::{S3Error, S3ErrorCode};
                let code =
                    S3ErrorCode::from_bytes(reply.code.as_bytes()).unwrap_or_else(|| S3ErrorCode::Custom(reply.code.to_string().into()));
                let mut err = S3Error::with_message(code, reply.message.clone());
                err.set_status_code(reply.status);
                fskv_gateway_s3::error::xml_response(err, request_id)
            }
        };
        if let Some(s) = retry_after_s {
            resp.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from(s));
        }
        resp
    }

    /// A refusal of the shared layer at the front, as the gateway would render it.
    pub fn render_gateway_error(&self, err: &GatewayError, request_id: &str) -> Response<Bytes> {
        match self.error_format {
            ErrorFormat::S3Xml => fskv_gateway_s3::error::xml_response(fskv_gateway_s3::error::from_gateway(err), request_id),
            ErrorFormat::Json => err.reply().json(request_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_gateway::Access;

    #[test]
    fn s3_routes_with_its_own_classifier() {
        let p = lookup("s3").unwrap();
        let parts = |m: &str, u: &str| http::Request::builder().method(m).uri(u).body(()).unwrap().into_parts().0;
        assert_eq!((p.classify)(&parts("GET", "/b/k")).access, Access::Read);
        assert_eq!((p.classify)(&parts("POST", "/b?delete")).access, Access::Mutation);
        assert!(lookup("nope").is_none());
    }

    #[test]
    fn errors_render_in_the_protocol_format() {
        let reply = ErrorReply::new(http::StatusCode::SERVICE_UNAVAILABLE, "SlowDown", "busy");
        let r = S3.render(&reply, "RID", Some(1));
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[http::header::RETRY_AFTER], "1");
        let body = String::from_utf8_lossy(r.body());
        assert!(body.contains("<Code>SlowDown</Code>") && body.contains("RID"), "{body}");
        let json = ProtocolSpec { error_format: ErrorFormat::Json, ..S3 };
        let r = json.render(&reply, "RID", None);
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["error"]["code"], "SlowDown");
        assert!(r.headers().get(http::header::RETRY_AFTER).is_none());
    }
}
