//! The MQ writer's relaxed state changes through `fskv up` (real processes).
//!
//! A flush of produces writes its batches to the segment (durable on every
//! replica) and then moves the partition state's `hw` with a relaxed meta
//! change, answered before meta's fsync. Power loss may take such a change
//! although its produces were acknowledged. This test makes that happen by
//! hand: it puts an older state back (a CAS through meta, as a rolled-back
//! WAL leaves it) and has a writer take the partition over.
//!
//! | what | how it is checked |
//! |---|---|
//! | no acknowledged record is lost | after the takeover, offsets 0..10 fetch as the ten records produced, in order |
//! | no offset is handed out twice | the next produce gets offset 10, and fetches as itself |
//! | the state says so | the topic's `high_watermark` is 11 |
//!
//! On the code before adoption the takeover started the new segment at the
//! rolled-back `hw` (5): records 5..9 vanished and offset 5 was reused.

mod common;

use bytes::Bytes;
use common::{free_base_port, start_up, UpGuard};
use fskv_client::{MetaClient, MetaClientConfig};
use fskv_gateway_mq::record::{ProduceRequest, Record};
use fskv_proto::meta::{Expected, PublishAttrs};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::time::Duration;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

struct Mq {
    client: Client<HttpConnector, Full<Bytes>>,
    host: String,
    bearer: String,
}

impl Mq {
    async fn call(&self, method: Method, target: &str, content_type: &str, body: Bytes) -> (StatusCode, Bytes) {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{}{target}", self.host))
            .header("host", &self.host)
            .header("authorization", &self.bearer)
            .header("content-type", content_type)
            .body(Full::new(body))
            .unwrap();
        let (status, _, body) = common::http::send(&self.client, req, REQUEST_TIMEOUT).await;
        (status, body)
    }

    async fn json(&self, method: Method, target: &str, body: serde_json::Value) -> serde_json::Value {
        let body = if body.is_null() { Bytes::new() } else { Bytes::from(body.to_string()) };
        let (s, b) = self.call(method, target, "application/json", body).await;
        assert!(s.is_success(), "{target}: {s} {}", String::from_utf8_lossy(&b));
        serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null)
    }

    /// Produces one record; its offset.
    async fn produce(&self, value: &str) -> u64 {
        let body = ProduceRequest { producer: None, records: vec![Record::new(value.as_bytes().to_vec())] }.encode();
        let (s, b) = self.call(Method::POST, "/v1/topics/rb/partitions/0/records", "application/vnd.fskv.mq.batch", body).await;
        assert!(s.is_success(), "produce {value}: {s} {}", String::from_utf8_lossy(&b));
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        v["base_offset"].as_u64().unwrap_or_else(|| panic!("no base_offset in {v}"))
    }

    /// Every record from `offset` to `end` (exclusive; the log must reach
    /// it): (offset, value). A fetch below the high watermark may answer
    /// from a state up to 50 ms old (docs/mq.md): it fetches on from where
    /// the last one ended.
    async fn fetch_all(&self, mut offset: u64, end: u64) -> Vec<(u64, String)> {
        use base64::Engine as _;
        let mut out = Vec::new();
        for _ in 0..100 {
            let target = format!("/v1/topics/rb/partitions/0/records?offset={offset}&format=json&max_bytes=1048576");
            let v = self.json(Method::GET, &target, serde_json::Value::Null).await;
            for r in v["records"].as_array().unwrap() {
                let value = base64::engine::general_purpose::STANDARD.decode(r["value"].as_str().unwrap()).unwrap();
                out.push((r["offset"].as_u64().unwrap(), String::from_utf8(value).unwrap()));
            }
            offset = v["next_offset"].as_u64().unwrap();
            if offset >= end {
                return out;
            }
        }
        panic!("fetching did not reach offset {end} in 100 fetches: {out:?}");
    }
}

fn records(range: std::ops::Range<u64>) -> Vec<(u64, String)> {
    range.map(|i| (i, format!("r{i}"))).collect()
}

#[test]
fn a_takeover_adopts_the_batches_past_a_rolled_back_state() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port();
    let data = dir.path().join("up");
    let guard = UpGuard { child: Some(start_up(&data, base)), mount: None };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let e: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(data.join("endpoints.json")).unwrap()).unwrap();
        let host = e["mq"].as_str().unwrap().trim_start_matches("http://").to_string();
        let bearer = format!("Bearer {}", e["bearer_token"].as_str().unwrap());
        let mq = Mq { client: Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new()), host, bearer };
        let meta = MetaClient::new(MetaClientConfig::new(vec![format!("127.0.0.1:{}", base + 12)])).expect("meta client");

        mq.json(Method::PUT, "/v1/topics/rb", serde_json::json!({"partitions": 1})).await;
        for i in 0..5 {
            assert_eq!(mq.produce(&format!("r{i}")).await, i);
        }
        let pdir = meta.resolve("/mq/topics/rb/0").await.expect("the partition directory");
        let read_state = || async {
            let s = meta.lookup(pdir.id, "state").await.expect("the partition state");
            let bytes = meta.read_inline(s.id, 0, s.size_bytes() as u32).await.expect("the state's bytes");
            (s, bytes)
        };
        let (_, old) = read_state().await;
        let old_json: serde_json::Value = serde_json::from_slice(&old).unwrap();
        assert_eq!(old_json["hw"], 5, "{old_json}");
        for i in 5..10 {
            assert_eq!(mq.produce(&format!("r{i}")).await, i);
        }
        // The state as power loss would leave it had it taken the last five
        // (relaxed) steps: hw 5, the segment's committed end before them.
        let (cur, _) = read_state().await;
        let expected = Expected::Inode { id: cur.id, version: cur.version };
        meta.create_write_publish(pdir.id, "state", 0o644, &old, Some(expected), PublishAttrs::default())
            .await
            .expect("put the older state back");
        let v = mq.json(Method::POST, "/v1/topics/rb/partitions/0/takeover?force=true", serde_json::Value::Null).await;
        assert!(v["epoch"].as_u64().is_some(), "{v}");

        assert_eq!(mq.fetch_all(0, 10).await, records(0..10), "every acknowledged record, once, in order");
        assert_eq!(mq.produce("r10").await, 10, "the next offset after the adopted batches");
        assert_eq!(mq.fetch_all(0, 11).await, records(0..11));
        let t = mq.json(Method::GET, "/v1/topics/rb", serde_json::Value::Null).await;
        assert_eq!(t["partition_states"][0]["high_watermark"], 11, "{t}");
    });
    guard.stop();
}
