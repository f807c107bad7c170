//! The front's one error enum and its HTTP mapping, in one place.
//!
//! | error | status | code | `Retry-After` | when |
//! |---|---|---|---|---|
//! | `Rejected(QueueFull)` | 503 | `SlowDown` | 1 s | the pool's queue holds `max_queue` requests |
//! | `Rejected(QueueTimeout)` | 503 | `SlowDown` | 1 s | held `queue_timeout_ms` with no process to take it |
//! | `Rejected(NoProcess)` | 503 | `ServiceUnavailable` | 5 s | the pool may have no process, or every static upstream is down |
//! | `Rejected(ShuttingDown)` | 503 | `ServiceUnavailable` | 1 s | the front is stopping |
//! | `Upstream` | 502 | `BadGateway` | — | the gateway process failed before its response head (after retries for idempotent reads) |
//! | `UpstreamTimeout` | 504 | `GatewayTimeout` | — | no response head within `upstream_response_timeout_ms` |
//! | `Setup` | — | — | — | start-up (listen addresses, key file, configuration) |
//!
//! S3 SDKs back off and retry 503 `SlowDown` and retry 502/503/504; the
//! body is rendered in the protocol's format ([`crate::protocols::ProtocolSpec::render`]).
//! Failures after the response head was sent (a gateway dying while
//! streaming a body) cannot change the status: the client connection is
//! closed before the announced length, which every HTTP client reports.

use crate::machine::Reject;
use fskv_gateway::ErrorReply;
use http::StatusCode;

#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    #[error("{}", reject_message(*.0))]
    Rejected(Reject),
    #[error("the gateway process failed before answering: {0}")]
    Upstream(String),
    #[error("the gateway process did not answer within {timeout_ms} ms")]
    UpstreamTimeout { timeout_ms: u64 },
    #[error("{0}")]
    Setup(String),
}

fn reject_message(r: Reject) -> &'static str {
    match r {
        Reject::QueueFull => "too many requests are waiting for a gateway process; retry later",
        Reject::QueueTimeout => "no gateway process could take the request in time; retry later",
        Reject::NoProcess => "no gateway process is available for this kind of request",
        Reject::ShuttingDown => "the front is shutting down",
    }
}

impl FrontError {
    /// Status, code, a message safe to send, and the `Retry-After` seconds.
    pub fn reply(&self) -> (ErrorReply, Option<u64>) {
        use StatusCode as S;
        let (status, code, retry_after) = match self {
            FrontError::Rejected(Reject::QueueFull | Reject::QueueTimeout) => (S::SERVICE_UNAVAILABLE, "SlowDown", Some(1)),
            FrontError::Rejected(Reject::NoProcess) => (S::SERVICE_UNAVAILABLE, "ServiceUnavailable", Some(5)),
            FrontError::Rejected(Reject::ShuttingDown) => (S::SERVICE_UNAVAILABLE, "ServiceUnavailable", Some(1)),
            FrontError::Upstream(_) => (S::BAD_GATEWAY, "BadGateway", None),
            FrontError::UpstreamTimeout { .. } => (S::GATEWAY_TIMEOUT, "GatewayTimeout", None),
            FrontError::Setup(_) => (S::INTERNAL_SERVER_ERROR, "InternalError", None),
        };
        let message = match self {
            // Upstream details (addresses, OS errors) are logged, not sent.
            FrontError::Upstream(_) => "the gateway process failed before answering".to_string(),
            FrontError::Setup(_) => "internal error".to_string(),
            other => other.to_string(),
        };
        (ErrorReply::new(status, code, message), retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table() {
        let (r, ra) = FrontError::Rejected(Reject::QueueFull).reply();
        assert_eq!((r.status.as_u16(), &*r.code, ra), (503, "SlowDown", Some(1)));
        let (r, ra) = FrontError::Rejected(Reject::NoProcess).reply();
        assert_eq!((r.status.as_u16(), &*r.code, ra), (503, "ServiceUnavailable", Some(5)));
        let (r, ra) = FrontError::Upstream("connect to 127.0.0.1:4000: refused".into()).reply();
        assert_eq!((r.status.as_u16(), &*r.code, ra), (502, "BadGateway", None));
        assert!(!r.message.contains("127.0.0.1"), "no internal detail in {}", r.message);
        let (r, _) = FrontError::UpstreamTimeout { timeout_ms: 5 }.reply();
        assert_eq!(r.status.as_u16(), 504);
    }
}
