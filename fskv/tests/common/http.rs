//! One HTTP exchange with a bound, for the tests that talk to gateways.

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::time::Duration;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Sends `req` and reads the whole answer; panics naming the request if the
/// transport fails or no answer comes within `timeout`.
pub async fn send(client: &HttpClient, req: Request<Full<Bytes>>, timeout: Duration) -> (StatusCode, HeaderMap, Bytes) {
    let what = format!("{} {}", req.method(), req.uri());
    let run = async {
        let resp = client.request(req).await.map_err(|e| format!("transport: {e:?}"))?;
        let (head, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| format!("body: {e:?}"))?.to_bytes();
        Ok::<_, String>((head.status, head.headers, body))
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => panic!("{what}: no answer within {timeout:?}"),
    }
}
