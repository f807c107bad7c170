//! The SQS facade (placeholder while it is built).

use crate::api::Mq;
use bytes::Bytes;
use fskv_gateway::{GatewayError, RequestBody, RequestContext};
use http::request::Parts;
use http::Response;

pub async fn handle(_mq: &Mq, _parts: &Parts, _body: RequestBody, _cx: &RequestContext) -> Response<Bytes> {
    crate::error::MqError::InvalidRequest("not yet".into()).sqs_response()
}

pub fn gateway_error(err: &GatewayError) -> Response<Bytes> {
    crate::error::MqError::InvalidRequest(err.to_string()).sqs_response()
}
