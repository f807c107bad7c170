//! SigV4-signed HTTP requests for the tests that talk to the gateways
//! through real sockets (payload hash in `x-amz-content-sha256`, region
//! `us-east-1`, S3-style single percent-encoding).

use aws_sigv4::http_request::{sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use std::time::SystemTime;

/// `method http://host/target` with `headers` and `body`, signed for
/// `service` (`s3`, `kv`, `sqs`, …) with the key `(access_key, secret)`.
pub fn signed_request(
    (access_key, secret): (&str, &str),
    service: &str,
    method: Method,
    (host, target): (&str, &str),
    headers: &[(&str, &str)],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let creds = aws_credential_types::Credentials::new(access_key, secret, None, None, "test");
    let identity = creds.into();
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name(service)
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .expect("signing parameters")
        .into();
    let mut all: Vec<(&str, &str)> = vec![("host", host)];
    all.extend_from_slice(headers);
    let signable =
        SignableRequest::new(method.as_str(), target, all.iter().copied(), SignableBody::Bytes(&body)).expect("signable request");
    let (instr, _) = sign(signable, &params).expect("sign").into_parts();
    let mut req = Request::builder().method(method).uri(format!("http://{host}{target}"));
    for (k, v) in all {
        req = req.header(k, v);
    }
    for (k, v) in instr.headers() {
        req = req.header(k, v);
    }
    req.body(Full::new(body)).expect("request")
}
