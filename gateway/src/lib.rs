//! The HTTP layer every gateway shares (S3, KV, MQ and the front).
//!
//! A protocol crate implements [`Protocol`] (classify a request head into a
//! [`Route`], handle a request, render the shared layer's refusals in its
//! own format) and calls [`serve`]. This crate then owns:
//!
//! | concern | where | what |
//! |---|---|---|
//! | connections | [`server`], [`conn`] | accept loop, total and per-peer caps, TLS, header-read / idle / send-progress timeouts, graceful shutdown |
//! | handover | [`handover`] | the front passing accepted connections to gateway processes (`SCM_RIGHTS`), and their side of it |
//! | limits | [`config::HttpLimits`] | header bytes and count, URI bytes, body bytes per [`BodyClass`], body-progress timeout ([`body`]) |
//! | roles | [`route`] | `Role::Reader` refuses `Access::Mutation` with "read-only gateway" naming the writer |
//! | authentication | [`auth`] | key store, SigV4 verifier (header and presigned), bearer tokens, per [`AuthPolicy`] |
//! | metrics | [`metrics`] | Prometheus (OpenMetrics text) on `GET /metrics` |
//! | request ids | [`server`] | a random id per request, in the tracing span and a response header |
//! | errors | [`error`] | [`GatewayError`] → status and code in one table; JSON rendering helper |
//!
//! See docs/gateway.md for the limits table and the API boundary.

pub mod auth;
pub mod body;
pub mod config;
pub mod conn;
pub mod error;
pub mod handover;
pub mod metrics;
pub mod route;
pub mod server;
pub mod tls;

pub use auth::{AccessKey, Authenticator, KeyStore, Principal, SigV4Verifier, TenantIds};
pub use body::{BoxError, RequestBody, ResponseBody};
pub use config::{BodyClass, HttpLimits, MetricsEndpoint, Role, ServerConfig, TlsFiles};
pub use error::{AuthError, ErrorReply, GatewayError};
pub use handover::Handoff;
pub use metrics::Metrics;
pub use route::{Access, AuthPolicy, Route};
pub use server::{
    new_request_id, serve, serve_listener, serve_on, serve_unix, serve_with_handoff, Listener, Protocol, RequestContext, ServerHandle,
};
