//! The protocols the front routes: one line per protocol.
//!
//! | protocol | classifier | gateway command | SigV4 prechecked at the front | errors |
//! |---|---|---|---|---|
//! | `s3` | `fskv_gateway_s3::route::classify` | `fskv gateway s3` | service `s3` (scheme, scope, dates, presign expiry: the shared layer's `Delegated` checks) | S3 XML |
//! | `kv` | `fskv_gateway_kv::classify` (batch get/exists over POST: read) | `fskv gateway kv` (writers keep the maintenance: eviction, TTL, stats) | service `kv` (bearer tokens pass to the gateway) | JSON |
//! | `consul` | `fskv_gateway_kv::classify_consul` | `fskv gateway kv --consul-only --no-maintenance` (the KV writers maintain the Consul namespace) | — (the token is checked by the gateway) | plain text (Consul's) |
//! | `mq` | `fskv_gateway_mq::classify` (SQS `ReceiveMessage` and native `receive`: **mutation**, see below) | `fskv gateway mq --public-url <front>`; writers `--writer-id mq-writer` | services `sqs`, `mq` | JSON |
//!
//! Why a receive goes to the MQ **writer** pool: it changes the queue's
//! state (acquires messages, counts deliveries, starts visibility timeouts,
//! may dead-letter), and that state lives with the writer that owns the
//! partition's lease; a reader has a read-only view of the log and refuses
//! it. The MQ writer pool has at most one process (checked in
//! [`crate::config::FrontConfig::validate`]): a second writer would fight
//! the first for the leases. Its fixed writer id lets a replacement (after a
//! crash or an idle stop) take the leases back at once instead of waiting
//! for them to expire.
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
    /// The message as `text/plain` (the Consul API).
    PlainText,
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
    /// Arguments every process of the protocol gets after the command.
    pub fixed_args: &'static [&'static str],
    /// Arguments writer processes get too.
    pub writer_args: &'static [&'static str],
    /// The flag naming the public endpoint in a reader's refusal of writes.
    pub writer_endpoint_flag: &'static str,
    /// The flag that gets the public (routed) URL of the protocol, for URLs
    /// the gateway hands out (SQS queue URLs).
    pub public_url_flag: Option<&'static str>,
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
    fixed_args: &[],
    writer_args: &[],
    writer_endpoint_flag: "--writer-endpoint",
    public_url_flag: None,
    gateway_takes_region: true,
    sigv4_services: &["s3"],
    error_format: ErrorFormat::S3Xml,
};

/// The KV native API (`gateway-kv`).
pub const KV: ProtocolSpec = ProtocolSpec {
    name: "kv",
    classify: fskv_gateway_kv::classify,
    gateway_command: &["gateway", "kv"],
    fixed_args: &[],
    writer_args: &[],
    writer_endpoint_flag: "--writer-endpoint",
    public_url_flag: None,
    gateway_takes_region: true,
    sigv4_services: &["kv"],
    error_format: ErrorFormat::Json,
};

/// The Consul-compatible API of the KV gateway: its own processes, serving
/// only that API. Maintenance stays with the KV writers.
pub const CONSUL: ProtocolSpec = ProtocolSpec {
    name: "consul",
    classify: fskv_gateway_kv::classify_consul,
    gateway_command: &["gateway", "kv"],
    fixed_args: &["--consul-only", "--no-maintenance"],
    writer_args: &[],
    writer_endpoint_flag: "--consul-writer-endpoint",
    public_url_flag: None,
    gateway_takes_region: true,
    sigv4_services: &[],
    error_format: ErrorFormat::PlainText,
};

/// The writer id of the front's MQ writer (one process at most).
pub const MQ_WRITER_ID: &str = "mq-writer";

/// MQ: the native API and the SQS facade on one port (`gateway-mq`).
pub const MQ: ProtocolSpec = ProtocolSpec {
    name: "mq",
    classify: fskv_gateway_mq::classify,
    gateway_command: &["gateway", "mq"],
    fixed_args: &[],
    writer_args: &["--writer-id", MQ_WRITER_ID],
    writer_endpoint_flag: "--writer-endpoint",
    public_url_flag: Some("--public-url"),
    gateway_takes_region: true,
    sigv4_services: &["sqs", "mq"],
    error_format: ErrorFormat::Json,
};

/// Every protocol this build routes.
pub const PROTOCOLS: &[&ProtocolSpec] = &[&S3, &KV, &CONSUL, &MQ];

/// The protocol named `name`, if this build routes it.
pub fn lookup(name: &str) -> Option<&'static ProtocolSpec> {
    PROTOCOLS.iter().copied().find(|p| p.name == name)
}

impl ProtocolSpec {
    /// A reply in the protocol's format, with `Retry-After` when given.
    pub fn render(&self, reply: &ErrorReply, request_id: &str, retry_after_s: Option<u64>) -> Response<Bytes> {
        let mut resp = match self.error_format {
            ErrorFormat::Json => reply.json(request_id),
            ErrorFormat::PlainText => plain(reply.status, &reply.message),
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
            ErrorFormat::PlainText => {
                let r = err.reply();
                plain(r.status, &r.message)
            }
        }
    }
}

fn plain(status: http::StatusCode, message: &str) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from(message.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
    r
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

    fn head(m: &str, u: &str, target: Option<&str>) -> Parts {
        let mut b = http::Request::builder().method(m).uri(u);
        if let Some(t) = target {
            b = b.header("x-amz-target", t);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn kv_consul_and_mq_route_with_their_gateways_classifiers() {
        let kv = lookup("kv").unwrap();
        let c = |p: &ProtocolSpec, m: &str, u: &str| (p.classify)(&head(m, u, None)).access;
        assert_eq!(c(kv, "GET", "/v1/kv/ns/k"), Access::Read);
        assert_eq!(c(kv, "POST", "/v1/kv/ns?batch=get"), Access::Read, "batch get over POST is a read");
        assert_eq!(c(kv, "POST", "/v1/kv/ns?batch=put"), Access::Mutation);
        assert_eq!(c(kv, "PUT", "/v1/kv/ns/k"), Access::Mutation);
        let consul = lookup("consul").unwrap();
        assert_eq!(c(consul, "GET", "/v1/kv/a/b?recurse"), Access::Read);
        assert_eq!(c(consul, "PUT", "/v1/kv/a/b"), Access::Mutation);
        assert!(consul.sigv4_services.is_empty(), "Consul tokens are the gateway's to check");
        assert_eq!(consul.writer_endpoint_flag, "--consul-writer-endpoint");
        let mq = lookup("mq").unwrap();
        let sqs = |op: &str| (mq.classify)(&head("POST", "/", Some(&format!("AmazonSQS.{op}")))).access;
        assert_eq!(sqs("ReceiveMessage"), Access::Mutation, "a receive changes the queue's state: the writer's");
        assert_eq!(sqs("SendMessage"), Access::Mutation);
        assert_eq!(sqs("GetQueueAttributes"), Access::Read);
        assert_eq!(c(mq, "POST", "/v1/topics/t/queues/q/receive"), Access::Mutation);
        assert_eq!(c(mq, "GET", "/v1/topics/t/partitions/0/records?offset=0"), Access::Read);
        assert_eq!(mq.writer_args, &["--writer-id", MQ_WRITER_ID]);
        assert_eq!(mq.sigv4_services, &["sqs", "mq"]);
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
        let r = CONSUL.render(&reply, "RID", Some(1));
        assert_eq!((r.status(), &r.body()[..]), (http::StatusCode::SERVICE_UNAVAILABLE, &b"busy"[..]));
        assert_eq!(r.headers()[http::header::CONTENT_TYPE], "text/plain; charset=utf-8");
    }
}
