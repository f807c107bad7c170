//! The native HTTP API (docs/mq.md, "Native API"): JSON for control,
//! the binary formats of [`crate::record`] for records.

use crate::config::MqConfig;
use crate::error::{json_response, MqError, Result};
use crate::group::{GroupLimits, GroupState, MemberView};
use crate::log::{Fetched, LogReader};
use crate::partition::{QueueOp, QueueReply, ReceivedMessage, Writer};
use crate::record::{decode_batches, partition_for_key, FetchHeader, ProduceRequest, RecordLimits, FETCH_HEADER_BYTES};
use crate::route::NativeOp;
use crate::state::PartitionState;
use crate::store::{check_topic_name, list_names, now_ms, read_json, write_json, QueueMeta, Store, TopicMeta, Versioned};
use crate::watch::HwWatcher;
use base64::Engine;
use bytes::{Bytes, BytesMut};
use fskv_gateway::RequestBody;
use fskv_proto::meta::Expected;
use fskv_types::ErrorCode;
use http::request::Parts;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

pub const BATCH_CONTENT_TYPE: &str = "application/vnd.fskv.mq.batch";
pub const FETCH_CONTENT_TYPE: &str = "application/vnd.fskv.mq.fetch";

/// Everything a gateway process serves with (cheap to clone).
#[derive(Clone)]
pub struct Mq {
    pub cfg: Arc<MqConfig>,
    pub store: Store,
    pub log: LogReader,
    pub writer: Writer,
    pub watcher: HwWatcher,
    /// Offset commits waiting per group (see [`Mq::commit_coalesced`]).
    pub commits: Arc<parking_lot::Mutex<HashMap<String, Vec<PendingCommit>>>>,
    /// The group files this process wrote last, as written (see
    /// [`Mq::group_update_inner`]); at most [`MAX_CACHED_GROUPS`].
    pub written_groups: Arc<parking_lot::Mutex<HashMap<String, Versioned<GroupState>>>>,
}

/// Bound on [`Mq::written_groups`]; when full it is emptied (a miss only
/// costs the read it saves).
const MAX_CACHED_GROUPS: usize = 1024;

/// The partition a fetch reads: its topic, number and directory.
#[derive(Clone, Copy)]
struct PartitionAt<'a> {
    topic: &'a str,
    partition: u32,
    pdir: fskv_types::InodeId,
}

/// One offset commit waiting for its group's next CAS.
pub struct PendingCommit {
    /// The tenant the commit is made for (checked against the group's owner).
    tenant: String,
    member: Option<(String, u64)>,
    offsets: Vec<(String, u32, u64, String)>,
    reply: tokio::sync::oneshot::Sender<Result<()>>,
}

pub fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

pub fn query(parts: &Parts) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if let Some(q) = parts.uri.query() {
        for kv in q.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let d = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
            out.insert(d(k), d(v));
        }
    }
    out
}

fn q_u64(q: &HashMap<String, String>, name: &str) -> Result<Option<u64>> {
    match q.get(name) {
        None => Ok(None),
        Some(v) => v
            .parse::<u64>()
            .map(Some)
            .map_err(|_| MqError::InvalidRequest(format!("query parameter {name}={v:?} is not a non-negative integer"))),
    }
}

/// Reads a body of at most `max` bytes.
pub async fn read_body(body: RequestBody, max: u64) -> Result<Bytes> {
    let limited = http_body_util::Limited::new(body, max as usize);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                Err(MqError::LimitExceeded(format!("the request body is larger than {max} bytes")))
            } else if let Some(g) = e.downcast_ref::<fskv_gateway::GatewayError>() {
                Err(MqError::InvalidRequest(g.to_string()))
            } else {
                Err(MqError::InvalidRequest(format!("reading the request body: {e}")))
            }
        }
    }
}

async fn read_json_body<T: for<'de> Deserialize<'de>>(body: RequestBody, max: u64, allow_empty: bool) -> Result<T> {
    let b = read_body(body, max).await?;
    let b: &[u8] = if b.is_empty() && allow_empty { b"{}" } else { &b };
    serde_json::from_slice(b).map_err(|e| MqError::InvalidRequest(format!("invalid JSON body: {e}")))
}

fn ok(v: Value) -> Response<Bytes> {
    json_response(StatusCode::OK, &v)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct QueueBody {
    pub max_deliveries: Option<u32>,
    pub dead_letter_topic: Option<String>,
    pub visibility_ms: Option<u64>,
    pub delay_ms: Option<u64>,
}

/// How a group file write is made durable (see [`Mq::group_commit_update`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// Acknowledged when fsync'ed in meta (joins, heartbeats, leaves).
    Synced,
    /// Acknowledged when in meta's log; fsync'ed within meta's relaxed interval (offset commits).
    Relaxed,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TopicBody {
    partitions: Option<u32>,
    retention_ms: Option<u64>,
    retention_bytes: Option<u64>,
    segment_bytes: Option<u64>,
    segment_ms: Option<u64>,
    max_message_bytes: Option<u64>,
    fifo: Option<bool>,
    dedup_window_ms: Option<u64>,
    dedup_scope: Option<String>,
    queues: Option<BTreeMap<String, QueueBody>>,
    tags: Option<BTreeMap<String, String>>,
}

impl Mq {
    /// Serves a native request of `tenant`. Ownership (the tenant recorded
    /// in `topic.json` at creation; `default` when none is):
    ///
    /// | operation | on another tenant's topic |
    /// |---|---|
    /// | `ListTopics` | not listed |
    /// | `CreateTopic` | 409 `TopicAlreadyExists` (as for one's own: names are global) |
    /// | every other operation naming the topic (describe, update, delete, produce, fetch, offsets, takeover, queues) | 403 `AccessDenied`, nothing read or changed |
    pub async fn native(&self, op: NativeOp, parts: &Parts, body: RequestBody, tenant: &str) -> Result<Response<Bytes>> {
        use NativeOp::*;
        let ctl = self.cfg.limits.max_control_bytes;
        match &op {
            DescribeTopic(t) | UpdateTopic(t) | DeleteTopic(t) | ProduceByKey(t) => self.store.topic(t).await?.check_owner(tenant)?,
            Produce(t, _) | Fetch(t, _) | Offsets(t, _) | Takeover(t, _) => self.store.topic(t).await?.check_owner(tenant)?,
            PutQueue(t, _) | DeleteQueue(t, _) | QueueStats(t, _) | Receive(t, _) | Ack(t, _) | Nack(t, _) | ChangeVisibility(t, _) => {
                self.store.topic(t).await?.check_owner(tenant)?
            }
            _ => {}
        }
        match op {
            Health => Ok(ok(json!({"status": "ok", "role": self.cfg.role.as_str()}))),
            ListTopics => {
                let mut names = Vec::new();
                for name in self.store.list_topics().await? {
                    match self.store.topic(&name).await {
                        Ok(m) if m.owner() == tenant => names.push(name),
                        _ => {}
                    }
                }
                Ok(ok(json!({ "topics": names })))
            }
            CreateTopic(t) => {
                let b: TopicBody = read_json_body(body, ctl, true).await?;
                self.check_dead_letter_targets(&t, b.queues.iter().flatten().filter_map(|(_, q)| q.dead_letter_topic.as_deref()), tenant)
                    .await?;
                let meta = self.topic_from_body(&t, b, tenant)?;
                self.store.create_topic(&meta).await?;
                Ok(json_response(StatusCode::CREATED, &topic_json(&meta)))
            }
            DescribeTopic(t) => self.describe_topic(&t).await,
            UpdateTopic(t) => {
                let b: TopicBody = read_json_body(body, ctl, false).await?;
                self.check_dead_letter_targets(&t, b.queues.iter().flatten().filter_map(|(_, q)| q.dead_letter_topic.as_deref()), tenant)
                    .await?;
                self.update_topic(&t, b).await
            }
            DeleteTopic(t) => {
                self.store.delete_topic(&t).await?;
                Ok(ok(json!({ "deleted": t })))
            }
            Produce(t, p) => self.produce(&t, Some(p), parts, body).await,
            ProduceByKey(t) => self.produce(&t, None, parts, body).await,
            Fetch(t, p) => self.fetch(&t, p, parts).await,
            Offsets(t, p) => self.offsets(&t, p, parts).await,
            Takeover(t, p) => {
                let q = query(parts);
                let force = q.get("force").is_some_and(|v| v == "true" || v == "1");
                self.check_partition(&t, p).await?;
                let epoch = self.writer.takeover(&t, p, force).await?;
                Ok(ok(json!({ "topic": t, "partition": p, "epoch": epoch })))
            }
            InitProducer => {
                let id = (rand::random::<u64>() >> 1) as i64;
                Ok(ok(json!({ "producer_id": id, "producer_epoch": 0 })))
            }
            PutQueue(t, q) => {
                let b: QueueBody = read_json_body(body, ctl, true).await?;
                self.put_queue(&t, &q, b, tenant).await
            }
            DeleteQueue(t, q) => {
                self.edit_topic(&t, |m| m.queues.remove(&q).map(drop).ok_or_else(|| MqError::NotFound(format!("queue {q:?}")))).await?;
                Ok(ok(json!({ "deleted": q })))
            }
            QueueStats(t, q) => self.queue_stats(&t, &q).await,
            Receive(t, q) => {
                #[derive(Deserialize, Default)]
                #[serde(deny_unknown_fields)]
                struct B {
                    max_messages: Option<usize>,
                    visibility_ms: Option<u64>,
                    wait_ms: Option<u64>,
                }
                let b: B = read_json_body(body, ctl, true).await?;
                let max = b.max_messages.unwrap_or(10);
                if max == 0 || max > self.cfg.limits.max_receive {
                    return Err(MqError::InvalidRequest(format!("max_messages {max}: 1 to {}", self.cfg.limits.max_receive)));
                }
                let msgs = self.receive(&t, &q, max, b.visibility_ms, b.wait_ms.unwrap_or(0)).await?;
                let out: Vec<Value> = msgs
                    .iter()
                    .map(|(p, m)| {
                        json!({
                            "receipt": format!("{p}:{}:{}", m.offset, m.nonce),
                            "partition": p,
                            "offset": m.offset,
                            "timestamp_ms": m.record.timestamp_ms,
                            "key": m.record.key.as_ref().map(|k| b64(k)),
                            "value": b64(&m.record.value),
                            "headers": m.record.headers.iter().map(|(n, v)| (n.clone(), Value::String(b64(v)))).collect::<serde_json::Map<_, _>>(),
                            "delivery_count": m.count,
                            "first_receive_ms": m.first_receive_ms,
                        })
                    })
                    .collect();
                Ok(ok(json!({ "messages": out })))
            }
            Ack(t, q) | Nack(t, q) | ChangeVisibility(t, q) => {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct B {
                    receipts: Vec<String>,
                    delay_ms: Option<u64>,
                    visibility_ms: Option<u64>,
                }
                let kind = op_kind(parts);
                let b: B = read_json_body(body, ctl, false).await?;
                if b.receipts.is_empty() || b.receipts.len() > self.cfg.limits.max_receive {
                    return Err(MqError::InvalidRequest(format!("1 to {} receipts", self.cfg.limits.max_receive)));
                }
                let results = self.settle(&t, &q, kind, &b.receipts, b.delay_ms.or(b.visibility_ms).unwrap_or(0)).await?;
                Ok(ok(json!({ "results": results })))
            }
            ListGroups => {
                let mut mine = Vec::new();
                for name in list_names(&self.store.fs, self.store.groups).await? {
                    match read_json::<GroupState>(&self.store.fs, self.store.groups, &name).await {
                        Ok(Some(s)) if s.value.owner() == tenant => mine.push(name),
                        _ => {}
                    }
                }
                Ok(ok(json!({ "groups": mine })))
            }
            DescribeGroup(g) => self.describe_group(&g, tenant).await,
            DeleteGroup(g) => {
                check_topic_name(&g)?;
                self.written_groups.lock().remove(&g);
                let cur = read_json::<GroupState>(&self.store.fs, self.store.groups, &g)
                    .await?
                    .ok_or_else(|| MqError::GroupNotFound(g.clone()))?;
                cur.value.check_owner(tenant, &g)?;
                // Removed only if it is still the file whose owner was checked.
                match self.store.fs.meta().unlink_expected(self.store.groups, &g, cur.expected()).await {
                    Ok(()) => Ok(ok(json!({ "deleted": g }))),
                    Err(e) if e.code() == ErrorCode::NotFound => Err(MqError::GroupNotFound(g)),
                    Err(e) if e.code() == ErrorCode::PreconditionFailed => {
                        Err(MqError::Conflict(format!("group {g:?} changed while it was deleted; retry")))
                    }
                    Err(e) => Err(crate::error::from_meta(e, &g)),
                }
            }
            Poll(g) => {
                let v: Value = read_json_body(body, ctl, false).await?;
                self.poll(&g, v, tenant).await
            }
            JoinGroup(g) | Heartbeat(g) | LeaveGroup(g) | CommitOffsets(g) => {
                let v: Value = read_json_body(body, ctl, false).await?;
                self.group_op(&g, op_kind(parts), v, tenant).await
            }
        }
    }

    fn topic_from_body(&self, name: &str, b: TopicBody, tenant: &str) -> Result<TopicMeta> {
        check_topic_name(name)?;
        let l = &self.cfg.limits;
        let d = &self.cfg.defaults;
        let partitions = b.partitions.unwrap_or(d.partitions);
        if partitions == 0 || partitions > l.max_partitions {
            return Err(MqError::InvalidRequest(format!("partitions {partitions}: 1 to {}", l.max_partitions)));
        }
        let segment_bytes = b.segment_bytes.unwrap_or(d.segment_bytes);
        if !(l.min_segment_bytes..=l.max_segment_bytes).contains(&segment_bytes) {
            return Err(MqError::InvalidRequest(format!(
                "segment_bytes {segment_bytes}: {} to {}",
                l.min_segment_bytes, l.max_segment_bytes
            )));
        }
        let max_message_bytes = b.max_message_bytes.unwrap_or(l.max_message_bytes);
        if max_message_bytes == 0 || max_message_bytes > l.max_message_bytes {
            return Err(MqError::InvalidRequest(format!("max_message_bytes {max_message_bytes}: 1 to {}", l.max_message_bytes)));
        }
        let dedup_by_group = match b.dedup_scope.as_deref() {
            None | Some("topic") => false,
            Some("group") => true,
            Some(o) => return Err(MqError::InvalidRequest(format!("dedup_scope {o:?}: topic or group"))),
        };
        let mut queues = BTreeMap::new();
        for (q, qb) in b.queues.unwrap_or_default() {
            queues.insert(q.clone(), self.queue_meta(&q, qb, None)?);
        }
        let now = now_ms();
        Ok(TopicMeta {
            name: name.to_string(),
            uid: rand::random(),
            partitions,
            retention_ms: b.retention_ms,
            retention_bytes: b.retention_bytes,
            segment_bytes,
            segment_ms: b.segment_ms.unwrap_or(d.segment_ms).max(1),
            max_message_bytes,
            fifo: b.fifo.unwrap_or(false),
            dedup_window_ms: b.dedup_window_ms.unwrap_or(d.dedup_window_ms),
            dedup_by_group,
            queues,
            sqs: None,
            tags: b.tags.unwrap_or_default(),
            tenant: tenant.to_string(),
            created_ms: now,
            modified_ms: now,
        })
    }

    fn queue_meta(&self, name: &str, b: QueueBody, old: Option<&QueueMeta>) -> Result<QueueMeta> {
        check_topic_name(name)?;
        let mut q = old.cloned().unwrap_or_default();
        if let Some(v) = b.visibility_ms {
            if v > self.cfg.limits.max_visibility_ms {
                return Err(MqError::InvalidRequest(format!("visibility_ms {v}: at most {}", self.cfg.limits.max_visibility_ms)));
            }
            q.visibility_ms = v;
        }
        if let Some(m) = b.max_deliveries {
            if m == 0 {
                return Err(MqError::InvalidRequest("max_deliveries must be at least 1".into()));
            }
            q.max_deliveries = Some(m);
        }
        if let Some(t) = b.dead_letter_topic {
            check_topic_name(&t)?;
            q.dead_letter_topic = Some(t);
        }
        if let Some(d) = b.delay_ms {
            q.delay_ms = d.min(self.cfg.limits.max_visibility_ms);
        }
        Ok(q)
    }

    /// Changes a topic's configuration with CAS (retried on conflicts).
    pub async fn edit_topic(&self, topic: &str, mut f: impl FnMut(&mut TopicMeta) -> Result<()>) -> Result<TopicMeta> {
        for attempt in 0..8u64 {
            let cur = self.store.topic_versioned(topic).await?;
            let mut m = cur.value.clone();
            f(&mut m)?;
            m.modified_ms = now_ms();
            match self.store.update_topic(&cur, &m).await {
                Ok(()) => return Ok(m),
                Err(MqError::Conflict(_)) => tokio::time::sleep(Duration::from_millis(5 * (attempt + 1))).await,
                Err(e) => return Err(e),
            }
        }
        Err(MqError::Conflict(format!("topic {topic:?} kept changing")))
    }

    async fn update_topic(&self, t: &str, b: TopicBody) -> Result<Response<Bytes>> {
        if b.partitions.is_some() || b.fifo.is_some() || b.segment_bytes.is_some() && b.segment_bytes == Some(0) {
            return Err(MqError::InvalidRequest("partitions and fifo cannot change after creation".into()));
        }
        let queues = b.queues;
        let l = self.cfg.limits.clone();
        let this = self.clone();
        let m = self
            .edit_topic(t, |m| {
                if let Some(v) = b.retention_ms {
                    m.retention_ms = if v == 0 { None } else { Some(v) };
                }
                if let Some(v) = b.retention_bytes {
                    m.retention_bytes = if v == 0 { None } else { Some(v) };
                }
                if let Some(v) = b.segment_bytes {
                    if !(l.min_segment_bytes..=l.max_segment_bytes).contains(&v) {
                        return Err(MqError::InvalidRequest(format!(
                            "segment_bytes {v}: {} to {}",
                            l.min_segment_bytes, l.max_segment_bytes
                        )));
                    }
                    m.segment_bytes = v;
                }
                if let Some(v) = b.segment_ms {
                    m.segment_ms = v.max(1);
                }
                if let Some(v) = b.max_message_bytes {
                    if v == 0 || v > l.max_message_bytes {
                        return Err(MqError::InvalidRequest(format!("max_message_bytes {v}: 1 to {}", l.max_message_bytes)));
                    }
                    m.max_message_bytes = v;
                }
                if let Some(v) = b.dedup_window_ms {
                    m.dedup_window_ms = v;
                }
                if let Some(tags) = &b.tags {
                    m.tags = tags.clone();
                }
                if let Some(qs) = &queues {
                    for (name, qb) in qs {
                        let qb = QueueBody {
                            max_deliveries: qb.max_deliveries,
                            dead_letter_topic: qb.dead_letter_topic.clone(),
                            visibility_ms: qb.visibility_ms,
                            delay_ms: qb.delay_ms,
                        };
                        let q = this.queue_meta(name, qb, m.queues.get(name))?;
                        m.queues.insert(name.clone(), q);
                    }
                }
                Ok(())
            })
            .await?;
        Ok(ok(topic_json(&m)))
    }

    /// A queue's dead-letter topic must be another topic of the same
    /// tenant: one of another tenant is refused (403 `AccessDenied`), as a
    /// missing one is by `PUT …/queues/{q}` (404). Create and update of a
    /// topic accept a target that does not exist yet; the move itself
    /// checks the owners again (`partition::dead_letter_copy`), so a topic
    /// another tenant creates later under that name never receives them.
    async fn check_dead_letter_targets<'a>(&self, t: &str, targets: impl Iterator<Item = &'a str>, tenant: &str) -> Result<()> {
        for d in targets {
            if d == t {
                return Err(MqError::InvalidRequest("a queue's dead-letter topic must be another topic".into()));
            }
            match self.store.topic(d).await {
                Ok(m) => m.check_owner(tenant)?,
                Err(MqError::TopicNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn put_queue(&self, t: &str, q: &str, b: QueueBody, tenant: &str) -> Result<Response<Bytes>> {
        if let Some(d) = &b.dead_letter_topic {
            if d == t {
                return Err(MqError::InvalidRequest("a queue's dead-letter topic must be another topic".into()));
            }
            self.store.topic(d).await?.check_owner(tenant)?;
        }
        let this = self.clone();
        let mut b = Some(b);
        let m = self
            .edit_topic(t, |m| {
                let qb = b.take().unwrap_or_default();
                let meta = this.queue_meta(q, qb, m.queues.get(q))?;
                m.queues.insert(q.to_string(), meta);
                Ok(())
            })
            .await?;
        Ok(ok(json!({ "topic": t, "queue": q, "config": m.queues.get(q) })))
    }

    async fn describe_topic(&self, t: &str) -> Result<Response<Bytes>> {
        check_topic_name(t)?;
        let m = self.store.topic_versioned(t).await?.value;
        let mut parts = Vec::new();
        for p in 0..m.partitions {
            let pdir = self.store.partition_dir(t, p).await?;
            let s = self.store.read_state(pdir).await?.value;
            parts.push(json!({
                "partition": p,
                "log_start_offset": s.log_start,
                "high_watermark": s.hw,
                "writer": s.writer,
                "writer_endpoint": s.endpoint,
                "epoch": s.epoch,
                "lease_until_ms": s.lease_until_ms,
                "active_segment": s.seg,
            }));
        }
        let mut v = topic_json(&m);
        v["partition_states"] = Value::Array(parts);
        Ok(ok(v))
    }

    pub async fn check_partition(&self, t: &str, p: u32) -> Result<Arc<TopicMeta>> {
        check_topic_name(t)?;
        let m = self.store.topic(t).await?;
        if p >= m.partitions {
            return Err(MqError::PartitionNotFound { topic: t.into(), partition: p });
        }
        Ok(m)
    }

    async fn produce(&self, t: &str, partition: Option<u32>, parts: &Parts, body: RequestBody) -> Result<Response<Bytes>> {
        let l = &self.cfg.limits;
        if let Some(len) = parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
        {
            if len > l.max_produce_bytes {
                return Err(MqError::LimitExceeded(format!("a produce body of {len} bytes; at most {}", l.max_produce_bytes)));
            }
        }
        check_topic_name(t)?;
        let meta = self.store.topic(t).await?;
        let body = read_body(body, l.max_produce_bytes).await?;
        let limits = RecordLimits {
            max_records: l.max_records_per_produce,
            max_record_bytes: meta.max_message_bytes as usize + (64 << 10),
            ..RecordLimits::default()
        };
        let req = ProduceRequest::parse(&body, &limits)?;
        match partition {
            Some(p) => {
                if p >= meta.partitions {
                    return Err(MqError::PartitionNotFound { topic: t.into(), partition: p });
                }
                let r = self.writer.produce(t, p, req.producer, req.records).await?;
                Ok(ok(produced_json(&r)))
            }
            None => {
                // Group by key hash; keyless records go to one random partition.
                let keyless = rand::random::<u32>() % meta.partitions;
                let mut by_part: BTreeMap<u32, Vec<(usize, crate::record::Record)>> = BTreeMap::new();
                for (i, r) in req.records.into_iter().enumerate() {
                    let p = r.key.as_ref().map_or(keyless, |k| partition_for_key(k, meta.partitions));
                    by_part.entry(p).or_default().push((i, r));
                }
                if req.producer.is_some() && by_part.len() > 1 {
                    return Err(MqError::InvalidRequest(
                        "an idempotent batch must go to one partition: compute partitions with murmur2 (docs/mq.md) and produce to each"
                            .into(),
                    ));
                }
                let n: usize = by_part.values().map(Vec::len).sum();
                let mut partitions = vec![0u32; n];
                let mut offsets = vec![0u64; n];
                let futs = by_part.into_iter().map(|(p, recs)| {
                    let idx: Vec<usize> = recs.iter().map(|(i, _)| *i).collect();
                    let records = recs.into_iter().map(|(_, r)| r).collect();
                    let w = self.writer.clone();
                    let producer = req.producer;
                    async move { (p, idx, w.produce(t, p, producer, records).await) }
                });
                let mut results = Vec::new();
                for (p, idx, r) in futures::future::join_all(futs).await {
                    let r = r?;
                    for (j, i) in idx.iter().enumerate() {
                        partitions[*i] = p;
                        offsets[*i] = r.offsets.get(j).copied().unwrap_or(r.base_offset + j as u64);
                    }
                    results.push(produced_json(&r));
                }
                Ok(ok(json!({ "results": results, "partitions": partitions, "offsets": offsets })))
            }
        }
    }

    /// The state of a partition, after waiting up to `wait_ms` for records
    /// past `offset` when there are none yet.
    ///
    /// An offset below the high watermark of a state read for a fetch less
    /// than [`crate::log::FETCH_STATE_MAX_AGE_MS`] ago is served with that
    /// state (`true`: a consumer with a backlog reads on without a metadata
    /// call per fetch); anything else reads the state (and keeps it).
    async fn state_for_fetch(&self, at: PartitionAt<'_>, offset: u64, wait_ms: u64) -> Result<(PartitionState, bool)> {
        if let Some(s) = self.log.recent_state(at.pdir) {
            if s.log_start <= offset && offset < s.hw {
                return Ok((s, true));
            }
        }
        let cur = self.store.read_state(at.pdir).await?.value;
        Ok((self.wait_for_records(at, offset, wait_ms, cur).await?, false))
    }

    /// `cur` (just read), or the state once records past `offset` are
    /// there, waiting up to `wait_ms` for them; kept for
    /// [`LogReader::recent_state`].
    async fn wait_for_records(&self, at: PartitionAt<'_>, offset: u64, wait_ms: u64, cur: PartitionState) -> Result<PartitionState> {
        let pdir = at.pdir;
        let state = async {
            if cur.hw > offset || wait_ms == 0 || offset < cur.log_start {
                return Ok(cur);
            }
            let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
            if let Some(mut rx) = self.writer.watch_hw(at.topic, at.partition) {
                loop {
                    if *rx.borrow_and_update() > offset {
                        return Ok(self.store.read_state(pdir).await?.value);
                    }
                    match tokio::time::timeout_at(deadline, rx.changed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => break,
                        Err(_) => return Ok(self.store.read_state(pdir).await?.value),
                    }
                }
            }
            self.watcher.wait_beyond(pdir, offset, deadline, cur).await
        }
        .await?;
        self.log.remember_state(pdir, &state);
        Ok(state)
    }

    async fn fetch(&self, t: &str, p: u32, parts: &Parts) -> Result<Response<Bytes>> {
        let q = query(parts);
        self.check_partition(t, p).await?;
        let (max_bytes, wait_ms) = self.fetch_bounds(q_u64(&q, "max_bytes")?, q_u64(&q, "wait_ms")?)?;
        let pdir = self.store.partition_dir(t, p).await?;
        let offset = match q.get("offset").map(String::as_str) {
            None => return Err(MqError::InvalidRequest("the offset query parameter is required (a number, earliest or latest)".into())),
            Some("earliest") => self.store.read_state(pdir).await?.value.log_start,
            Some("latest") => self.store.read_state(pdir).await?.value.hw,
            Some(_) => q_u64(&q, "offset")?.unwrap_or(0),
        };
        let at = PartitionAt { topic: t, partition: p, pdir };
        let (state, recent) = self.state_for_fetch(at, offset, wait_ms).await?;
        let f = self.fetch_on(at, &state, recent, offset, max_bytes).await?;
        if q.get("format").map(String::as_str) == Some("json") {
            let recs = decode_batches(f.data.clone(), offset)?;
            let out: Vec<Value> = recs
                .iter()
                .map(|r| {
                    json!({
                        "offset": r.offset,
                        "timestamp_ms": r.record.timestamp_ms,
                        "key": r.record.key.as_ref().map(|k| b64(k)),
                        "value": b64(&r.record.value),
                        "headers": r.record.headers.iter().map(|(n, v)| (n.clone(), Value::String(b64(v)))).collect::<serde_json::Map<_, _>>(),
                    })
                })
                .collect();
            return Ok(ok(json!({
                "high_watermark": f.high_watermark,
                "log_start_offset": f.log_start,
                "next_offset": f.next_offset,
                "records": out,
            })));
        }
        Ok(fetch_response(&f))
    }

    /// A fetch's `max_bytes` and `wait_ms` (defaults applied), checked
    /// against the limits.
    fn fetch_bounds(&self, max_bytes: Option<u64>, wait_ms: Option<u64>) -> Result<(u64, u64)> {
        let l = &self.cfg.limits;
        let max_bytes = max_bytes.unwrap_or(l.default_fetch_bytes);
        if max_bytes == 0 || max_bytes > l.max_fetch_bytes {
            return Err(MqError::InvalidRequest(format!("max_bytes {max_bytes}: 1 to {}", l.max_fetch_bytes)));
        }
        let wait_ms = wait_ms.unwrap_or(0);
        if wait_ms > l.max_wait_ms {
            return Err(MqError::InvalidRequest(format!("wait_ms {wait_ms}: at most {}", l.max_wait_ms)));
        }
        Ok((max_bytes, wait_ms))
    }

    /// Fetches from `offset` on `state` (`recent`: a kept one, see
    /// [`Mq::state_for_fetch`]).
    async fn fetch_on(&self, at: PartitionAt<'_>, state: &PartitionState, recent: bool, offset: u64, max_bytes: u64) -> Result<Fetched> {
        match self.log.fetch(at.pdir, state, offset, max_bytes).await {
            Ok(f) => Ok(f),
            // The kept state may predate a retention pass that removed the
            // segment: decide on the state as it is now.
            Err(_) if recent => {
                self.log.forget_state(at.pdir);
                let cur = self.store.read_state(at.pdir).await?.value;
                let state = self.wait_for_records(at, offset, 0, cur).await?;
                self.log.fetch(at.pdir, &state, offset, max_bytes).await
            }
            Err(e) => Err(e),
        }
    }

    /// `POST /v1/groups/<g>/poll`: commits `offset` of one partition for
    /// the group (as `commit` with one entry: everything before it is
    /// consumed) and fetches from it, in one request. The commit and the
    /// fetch run together; a refused commit (fenced generation, unknown
    /// member) fails the poll and returns no records. An offset outside
    /// `[log_start, hw]` is refused (416) before anything is committed.
    /// Served by writers (it commits), which fetch as readers do.
    async fn poll(&self, g: &str, v: Value, tenant: &str) -> Result<Response<Bytes>> {
        check_topic_name(g)?;
        let topic = v.get("topic").and_then(Value::as_str).ok_or_else(|| MqError::InvalidRequest("poll needs \"topic\"".into()))?;
        check_topic_name(topic)?;
        let partition = v
            .get("partition")
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| MqError::InvalidRequest("poll needs \"partition\" (a number)".into()))?;
        let offset = v
            .get("offset")
            .and_then(Value::as_u64)
            .ok_or_else(|| MqError::InvalidRequest("poll needs \"offset\" (a number: committed, then fetched from)".into()))?;
        let who = member_of(&v)?;
        let metadata = v.get("metadata").and_then(Value::as_str).unwrap_or("").to_string();
        let (max_bytes, wait_ms) =
            self.fetch_bounds(v.get("max_bytes").and_then(Value::as_u64), v.get("wait_ms").and_then(Value::as_u64))?;
        self.store.topic(topic).await?.check_owner(tenant)?;
        self.check_partition(topic, partition).await?;
        let pdir = self.store.partition_dir(topic, partition).await?;
        let at = PartitionAt { topic, partition, pdir };
        let (state, recent) = self.state_for_fetch(at, offset, 0).await?;
        if offset < state.log_start || offset > state.hw {
            return Err(MqError::OffsetOutOfRange { offset, log_start: state.log_start, high_watermark: state.hw });
        }
        let commit = self.commit_coalesced(g, tenant, who, vec![(topic.to_string(), partition, offset, metadata)]);
        let fetch = async {
            if offset < state.hw || wait_ms == 0 {
                self.fetch_on(at, &state, recent, offset, max_bytes).await
            } else {
                // At the end of the log (`state` was read afresh: `recent`
                // only serves offsets below `hw`): wait for a record, as a
                // fetch does, from the state in hand.
                let state = self.wait_for_records(at, offset, wait_ms, state.clone()).await?;
                self.fetch_on(at, &state, false, offset, max_bytes).await
            }
        };
        let ((), f) = tokio::try_join!(commit, fetch)?;
        Ok(fetch_response(&f))
    }

    async fn offsets(&self, t: &str, p: u32, parts: &Parts) -> Result<Response<Bytes>> {
        let q = query(parts);
        self.check_partition(t, p).await?;
        let pdir = self.store.partition_dir(t, p).await?;
        let state = self.store.read_state(pdir).await?.value;
        let (offset, how) = if let Some(ts) = q.get("timestamp") {
            let ts: i64 = ts.parse().map_err(|_| MqError::InvalidRequest(format!("timestamp={ts:?}: milliseconds since the epoch")))?;
            (self.log.offset_for_time(pdir, &state, ts).await?, "timestamp")
        } else {
            match q.get("at").map(String::as_str).unwrap_or("latest") {
                "earliest" => (state.log_start, "earliest"),
                "latest" => (state.hw, "latest"),
                o => return Err(MqError::InvalidRequest(format!("at={o:?}: earliest or latest (or give timestamp=)"))),
            }
        };
        Ok(ok(
            json!({ "topic": t, "partition": p, "offset": offset, "by": how, "log_start_offset": state.log_start, "high_watermark": state.hw }),
        ))
    }

    /// Receives up to `max` messages of a queue over the topic's partitions,
    /// waiting up to `wait_ms` for one when there are none.
    pub async fn receive(
        &self,
        t: &str,
        q: &str,
        max: usize,
        visibility_ms: Option<u64>,
        wait_ms: u64,
    ) -> Result<Vec<(u32, ReceivedMessage)>> {
        let meta = self.store.topic(t).await?;
        let qm = meta.queues.get(q).cloned().ok_or_else(|| MqError::NotFound(format!("queue {q:?} of topic {t:?}")))?;
        let vis = visibility_ms.unwrap_or(qm.visibility_ms);
        if vis > self.cfg.limits.max_visibility_ms {
            return Err(MqError::InvalidRequest(format!("visibility_ms {vis}: at most {}", self.cfg.limits.max_visibility_ms)));
        }
        if wait_ms > self.cfg.limits.max_wait_ms {
            return Err(MqError::InvalidRequest(format!("wait_ms {wait_ms}: at most {}", self.cfg.limits.max_wait_ms)));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        let n = meta.partitions;
        let first = rand::random::<u32>() % n;
        loop {
            let mut out = Vec::new();
            for i in 0..n {
                let p = (first + i) % n;
                if out.len() >= max {
                    break;
                }
                match self.writer.queue(t, p, q, QueueOp::Receive { max: max - out.len(), visibility_ms: vis }).await? {
                    QueueReply::Received(msgs) => out.extend(msgs.into_iter().map(|m| (p, m))),
                    other => return Err(MqError::Internal(format!("unexpected queue reply {other:?}"))),
                }
            }
            if !out.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(out);
            }
            // Wake on a new record in any partition, or at least every 100 ms
            // (delayed messages and expiring visibility do not signal).
            let mut watches: Vec<_> = (0..n).filter_map(|p| self.writer.watch_hw(t, p)).collect();
            let step = tokio::time::Instant::now() + Duration::from_millis(100);
            let until = step.min(deadline);
            if watches.is_empty() {
                tokio::time::sleep_until(until).await;
            } else {
                let changed = futures::future::select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
                let _ = tokio::time::timeout_at(until, changed).await;
            }
        }
    }

    async fn settle(&self, t: &str, q: &str, kind: &str, receipts: &[String], arg: u64) -> Result<Vec<Value>> {
        let meta = self.store.topic(t).await?;
        if !meta.queues.contains_key(q) {
            return Err(MqError::NotFound(format!("queue {q:?} of topic {t:?}")));
        }
        if (kind == "visibility" || kind == "nack") && arg > self.cfg.limits.max_visibility_ms {
            return Err(MqError::InvalidRequest(format!("{arg} ms: at most {}", self.cfg.limits.max_visibility_ms)));
        }
        let mut by_part: BTreeMap<u32, Vec<(usize, u64, u64)>> = BTreeMap::new();
        let mut out: Vec<Value> = receipts.iter().map(|r| json!({ "receipt": r })).collect();
        for (i, r) in receipts.iter().enumerate() {
            match parse_receipt(r) {
                Some((p, off, nonce)) if p < meta.partitions => by_part.entry(p).or_default().push((i, off, nonce)),
                _ => {
                    out[i]["ok"] = json!(false);
                    out[i]["error"] = json!({"code": "InvalidReceipt", "message": format!("{r:?} is not a receipt of this queue")});
                }
            }
        }
        for (p, items) in by_part {
            let op = match kind {
                "ack" => QueueOp::Ack(items.iter().map(|(_, o, n)| (*o, *n)).collect()),
                "nack" => QueueOp::Release(items.iter().map(|(_, o, n)| (*o, *n, arg)).collect()),
                _ => QueueOp::ChangeVisibility(items.iter().map(|(_, o, n)| (*o, *n, arg)).collect()),
            };
            let reply = self.writer.queue(t, p, q, op).await?;
            let results: Vec<std::result::Result<bool, MqError>> = match reply {
                QueueReply::Acked(v) => v.into_iter().map(|r| r.map(|a| a == crate::queue::AckResult::Deleted)).collect(),
                QueueReply::Changed(v) => v.into_iter().map(|r| r.map(|()| true)).collect(),
                other => return Err(MqError::Internal(format!("unexpected queue reply {other:?}"))),
            };
            for ((i, _, _), r) in items.iter().zip(results) {
                match r {
                    Ok(applied) => {
                        out[*i]["ok"] = json!(true);
                        out[*i]["applied"] = json!(applied);
                    }
                    Err(e) => {
                        out[*i]["ok"] = json!(false);
                        out[*i]["error"] = json!({"code": e.native().1, "message": e.public_message()});
                    }
                }
            }
        }
        Ok(out)
    }

    async fn queue_stats(&self, t: &str, q: &str) -> Result<Response<Bytes>> {
        let meta = self.store.topic(t).await?;
        let qm = meta.queues.get(q).cloned().ok_or_else(|| MqError::NotFound(format!("queue {q:?} of topic {t:?}")))?;
        let (mut visible, mut in_flight, mut delayed) = (0u64, 0u64, 0u64);
        for p in 0..meta.partitions {
            let c = self.queue_counts(t, p, q).await?;
            visible += c.visible;
            in_flight += c.in_flight;
            delayed += c.delayed;
        }
        Ok(ok(json!({ "topic": t, "queue": q, "config": qm, "visible": visible, "in_flight": in_flight, "delayed": delayed })))
    }

    /// Queue counts of a partition: from the owner when this gateway owns
    /// it, else from the stored state log (what a reader can see).
    pub async fn queue_counts(&self, t: &str, p: u32, q: &str) -> Result<crate::queue::QueueCounts> {
        if self.writer.watch_hw(t, p).is_some() {
            if let Ok(QueueReply::Counts { counts, .. }) = self.writer.queue(t, p, q, QueueOp::Counts).await {
                return Ok(counts);
            }
        }
        let pdir = self.store.partition_dir(t, p).await?;
        let state = self.store.read_state(pdir).await?.value;
        let qs = crate::partition::read_queue_state(&self.store, pdir, q).await?.unwrap_or_default();
        let mut qs = qs;
        qs.scan = qs.scan.max(state.log_start);
        Ok(qs.counts(state.hw, now_ms()))
    }

    async fn describe_group(&self, g: &str, tenant: &str) -> Result<Response<Bytes>> {
        check_topic_name(g)?;
        let s = read_json::<GroupState>(&self.store.fs, self.store.groups, g).await?.ok_or_else(|| MqError::GroupNotFound(g.into()))?.value;
        s.check_owner(tenant, g)?;
        Ok(ok(group_json(g, &s)))
    }

    /// Runs one group transition with CAS, retried on conflicts. The group
    /// must be `tenant`'s (403 otherwise); one it creates is `tenant`'s,
    /// recorded in the same CAS (`Expected::Absent`) that creates it.
    pub async fn group_update<R>(
        &self,
        g: &str,
        tenant: &str,
        create: bool,
        extra_topics: &BTreeSet<String>,
        mut f: impl FnMut(&mut GroupState, &dyn Fn(&str) -> u32) -> Result<R>,
    ) -> Result<R> {
        self.group_update_inner(g, tenant, true, create, extra_topics, |st, parts| f(st, parts), |_| true, Durability::Synced).await
    }

    /// [`Mq::group_update`] for the commit leader: no owner check of an
    /// existing group (its closure checks each queued commit's tenant on
    /// its own; a group it creates is still `tenant`'s), and the write is
    /// **relaxed**: acknowledged once in meta's log, fsync'ed within meta's
    /// `relaxed_sync_interval_ms` (docs/mq.md, "Consumer groups": an OS
    /// crash in that window rolls the offsets back and redelivers; a
    /// process crash loses nothing). `settled` says whether an outcome may
    /// stand when it was reached on the copy this process last wrote
    /// (`written_groups`): one that refuses something is made again on a
    /// fresh read.
    async fn group_commit_update<R>(
        &self,
        g: &str,
        tenant: &str,
        create: bool,
        extra_topics: &BTreeSet<String>,
        f: impl FnMut(&mut GroupState, &dyn Fn(&str) -> u32) -> Result<R>,
        settled: impl Fn(&R) -> bool,
    ) -> Result<R> {
        self.group_update_inner(g, tenant, false, create, extra_topics, f, settled, Durability::Relaxed).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn group_update_inner<R>(
        &self,
        g: &str,
        tenant: &str,
        check_owner: bool,
        create: bool,
        extra_topics: &BTreeSet<String>,
        mut f: impl FnMut(&mut GroupState, &dyn Fn(&str) -> u32) -> Result<R>,
        settled: impl Fn(&R) -> bool,
        durability: Durability,
    ) -> Result<R> {
        check_topic_name(g)?;
        let fs = match durability {
            Durability::Synced => &self.store.fs,
            Durability::Relaxed => &self.store.fs_relaxed,
        };
        for attempt in 0..32u64 {
            // The group as this process last wrote it, if it did: the CAS
            // below fails if anyone changed it since, and the next attempt
            // reads it (at once, without the conflict's pause). A steady
            // committer thus pays one metadata call per commit, not two.
            let written = if attempt == 0 { self.written_groups.lock().get(g).cloned() } else { None };
            let from_cache = written.is_some();
            let cur = match written {
                Some(w) => Some(w),
                None => read_json::<GroupState>(&self.store.fs, self.store.groups, g).await?,
            };
            if cur.is_none() && !create {
                return Err(MqError::GroupNotFound(g.into()));
            }
            let mut state = match &cur {
                Some(c) => {
                    if check_owner {
                        match c.value.check_owner(tenant, g) {
                            Ok(()) => {}
                            // A refusal stands only on what the file holds now.
                            Err(_) if from_cache => {
                                self.written_groups.lock().remove(g);
                                continue;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    c.value.clone()
                }
                None => GroupState { tenant: tenant.to_string(), ..GroupState::default() },
            };
            let mut counts: HashMap<String, u32> = HashMap::new();
            for t in state.subscribed_topics().iter().chain(extra_topics) {
                if !counts.contains_key(t) {
                    let n = match self.store.topic(t).await {
                        Ok(m) => m.partitions,
                        Err(MqError::TopicNotFound(_)) => 0,
                        Err(e) => return Err(e),
                    };
                    counts.insert(t.clone(), n);
                }
            }
            let parts = |t: &str| counts.get(t).copied().unwrap_or(0);
            // An outcome reached on the kept copy that refuses something
            // (a fenced generation, an unknown member) is not answered from
            // it: the file may have moved on elsewhere; read it and decide
            // again. An accepted one is checked by the CAS.
            let r = match f(&mut state, &parts) {
                Ok(r) if !from_cache || settled(&r) => r,
                Err(e) if !from_cache => return Err(e),
                _ => {
                    self.written_groups.lock().remove(g);
                    continue;
                }
            };
            let expected = cur.as_ref().map_or(Expected::Absent, |c| c.expected());
            match write_json(fs, self.store.groups, g, &state, Some(expected)).await {
                Ok(inode) => {
                    let mut cache = self.written_groups.lock();
                    if cache.len() >= MAX_CACHED_GROUPS && !cache.contains_key(g) {
                        cache.clear();
                    }
                    cache.insert(g.to_string(), Versioned { value: state, inode: inode.id, version: inode.version });
                    return Ok(r);
                }
                Err(MqError::Conflict(_)) => {
                    self.written_groups.lock().remove(g);
                    if !from_cache {
                        let jitter = rand::random::<u64>() % (2 * (attempt + 1));
                        tokio::time::sleep(Duration::from_millis(1 + jitter)).await;
                    }
                }
                Err(e) => {
                    self.written_groups.lock().remove(g);
                    return Err(e);
                }
            }
        }
        Err(MqError::Conflict(format!("group {g:?} kept changing")))
    }

    /// Commits offsets of `g` with group commit: concurrent commits to one
    /// group in this process share one CAS of the group file instead of
    /// conflicting with each other. The first commit to arrive leads: it
    /// takes every commit queued so far, applies each to the group state in
    /// turn (each checked on its own — a fenced generation fails alone),
    /// writes once, answers them, and repeats while more arrived meanwhile.
    ///
    /// | step | rule |
    /// |---|---|
    /// | a commit arrives, no leader for `g` | it becomes the leader |
    /// | a commit arrives, a leader runs | it queues and waits for its answer |
    /// | leader round | take the queue; read the group; apply each commit to a copy, keeping it only if it succeeds; one CAS (retried from a fresh read on conflict); answer each |
    /// | queue empty after a round | the leader leaves (under the same lock the queue is checked with) |
    pub async fn commit_coalesced(
        &self,
        g: &str,
        tenant: &str,
        member: Option<(String, u64)>,
        offsets: Vec<(String, u32, u64, String)>,
    ) -> Result<()> {
        let tenant = tenant.to_string();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let lead = {
            let mut m = self.commits.lock();
            match m.get_mut(g) {
                Some(q) => {
                    q.push(PendingCommit { tenant, member, offsets, reply: tx });
                    false
                }
                None => {
                    m.insert(g.to_string(), vec![PendingCommit { tenant, member, offsets, reply: tx }]);
                    true
                }
            }
        };
        if lead {
            // The leader runs in its own task: a caller that goes away (its
            // connection closed) must not strand the commits queued behind it.
            let this = self.clone();
            let g = g.to_string();
            tokio::spawn(async move { this.lead_commits(&g).await });
        }
        rx.await.map_err(|_| MqError::Unavailable("the group commit leader stopped".into()))?
    }

    /// The leader's rounds of [`Mq::commit_coalesced`] for group `g`.
    async fn lead_commits(&self, g: &str) {
        let limits = GroupLimits::default();
        loop {
            let batch = {
                let mut m = self.commits.lock();
                match m.get_mut(g) {
                    Some(q) if !q.is_empty() => std::mem::take(q),
                    _ => {
                        m.remove(g);
                        break;
                    }
                }
            };
            let now = now_ms();
            // A group this round creates is the first commit's tenant's;
            // every commit is checked against the owner on its own.
            let creator = batch.first().map(|c| c.tenant.clone()).unwrap_or_default();
            let r = self
                .group_commit_update(
                    g,
                    &creator,
                    true,
                    &BTreeSet::new(),
                    |st, parts| {
                        let mut results = Vec::with_capacity(batch.len());
                        for c in &batch {
                            if let Err(e) = st.check_owner(&c.tenant, g) {
                                results.push(Err(e));
                                continue;
                            }
                            let mut trial = st.clone();
                            let who = c.member.as_ref().map(|(m, gen)| (m.as_str(), *gen));
                            match trial.commit(who, &c.offsets, now, parts, &limits) {
                                Ok(()) => {
                                    *st = trial;
                                    results.push(Ok(()));
                                }
                                Err(e) => results.push(Err(e)),
                            }
                        }
                        Ok(results)
                    },
                    |results: &Vec<Result<()>>| results.iter().all(|r| r.is_ok()),
                )
                .await;
            match r {
                Ok(results) => {
                    for (c, r) in batch.into_iter().zip(results) {
                        let _ = c.reply.send(r);
                    }
                }
                Err(e) => {
                    for c in batch {
                        let _ = c.reply.send(Err(crate::partition::clone_err(&e)));
                    }
                }
            }
        }
    }

    async fn group_op(&self, g: &str, kind: &str, v: Value, tenant: &str) -> Result<Response<Bytes>> {
        let limits = GroupLimits::default();
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let now = now_ms();
        match kind {
            "join" => {
                let topics: BTreeSet<String> = match v.get("topics").and_then(Value::as_array) {
                    Some(a) => a
                        .iter()
                        .map(|t| t.as_str().map(str::to_string).ok_or_else(|| MqError::InvalidRequest("topics must be strings".into())))
                        .collect::<Result<_>>()?,
                    None => return Err(MqError::InvalidRequest("join needs \"topics\": [..]".into())),
                };
                for t in &topics {
                    self.store.topic(t).await?.check_owner(tenant)?;
                }
                let member = s("member_id").filter(|m| !m.is_empty()).unwrap_or_else(|| format!("m-{:016x}", rand::random::<u64>()));
                if member.len() > 255 {
                    return Err(MqError::InvalidRequest("member_id: at most 255 bytes".into()));
                }
                let client = s("client_id").unwrap_or_default();
                let timeout = v.get("session_timeout_ms").and_then(Value::as_u64).unwrap_or(10_000);
                let view = self
                    .group_update(g, tenant, true, &topics, |st, parts| {
                        st.join(&member, &client, topics.clone(), timeout, now, parts, &limits)
                    })
                    .await?;
                Ok(ok(view_json(&view)))
            }
            "heartbeat" => {
                let member = s("member_id").ok_or_else(|| MqError::InvalidRequest("heartbeat needs member_id".into()))?;
                let view: MemberView =
                    self.group_update(g, tenant, false, &BTreeSet::new(), |st, parts| st.heartbeat(&member, now, parts)).await?;
                Ok(ok(view_json(&view)))
            }
            "leave" => {
                let member = s("member_id").ok_or_else(|| MqError::InvalidRequest("leave needs member_id".into()))?;
                self.group_update(g, tenant, false, &BTreeSet::new(), |st, parts| st.leave(&member, now, parts)).await?;
                Ok(ok(json!({ "left": member })))
            }
            _ => {
                let who = member_of(&v)?;
                let list = v
                    .get("offsets")
                    .and_then(Value::as_array)
                    .ok_or_else(|| MqError::InvalidRequest("commit needs \"offsets\": [..]".into()))?;
                let mut offsets = Vec::with_capacity(list.len());
                let mut checked = BTreeSet::new();
                for o in list {
                    let topic = o
                        .get("topic")
                        .and_then(Value::as_str)
                        .ok_or_else(|| MqError::InvalidRequest("offset entry without topic".into()))?;
                    let partition = o
                        .get("partition")
                        .and_then(Value::as_u64)
                        .ok_or_else(|| MqError::InvalidRequest("offset entry without partition".into()))?;
                    let offset = o
                        .get("offset")
                        .and_then(Value::as_u64)
                        .ok_or_else(|| MqError::InvalidRequest("offset entry without offset".into()))?;
                    let metadata = o.get("metadata").and_then(Value::as_str).unwrap_or("").to_string();
                    check_topic_name(topic)?;
                    if !checked.contains(topic) {
                        self.store.topic(topic).await?.check_owner(tenant)?;
                        checked.insert(topic.to_string());
                    }
                    let partition = u32::try_from(partition).map_err(|_| MqError::InvalidRequest("partition out of range".into()))?;
                    offsets.push((topic.to_string(), partition, offset, metadata));
                }
                if offsets.is_empty() {
                    return Err(MqError::InvalidRequest("commit needs at least one offset".into()));
                }
                let n = offsets.len();
                self.commit_coalesced(g, tenant, who, offsets).await?;
                Ok(ok(json!({ "committed": n })))
            }
        }
    }
}

/// The member and generation a commit (or poll) is made as: both or neither.
fn member_of(v: &Value) -> Result<Option<(String, u64)>> {
    let member = v.get("member_id").and_then(Value::as_str).filter(|m| !m.is_empty());
    match (member, v.get("generation").and_then(Value::as_u64)) {
        (Some(m), Some(gen)) => Ok(Some((m.to_string(), gen))),
        (None, None) => Ok(None),
        _ => Err(MqError::InvalidRequest("a commit needs both member_id and generation, or neither".into())),
    }
}

/// The binary fetch response (docs/mq.md, "Fetch"): header, then the batches.
fn fetch_response(f: &Fetched) -> Response<Bytes> {
    let mut out = BytesMut::with_capacity(FETCH_HEADER_BYTES + f.data.len());
    FetchHeader { high_watermark: f.high_watermark, log_start_offset: f.log_start, next_offset: f.next_offset }.encode(&mut out);
    out.extend_from_slice(&f.data);
    let mut resp = Response::new(out.freeze());
    let h = resp.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(FETCH_CONTENT_TYPE));
    for (name, v) in
        [("x-fskv-high-watermark", f.high_watermark), ("x-fskv-next-offset", f.next_offset), ("x-fskv-log-start-offset", f.log_start)]
    {
        if let Ok(v) = HeaderValue::from_str(&v.to_string()) {
            h.insert(name, v);
        }
    }
    resp
}

/// The last path segment of a POST names the queue or group operation.
fn op_kind(parts: &Parts) -> &str {
    parts.uri.path().rsplit('/').next().unwrap_or("")
}

/// `partition:offset:nonce`.
pub fn parse_receipt(r: &str) -> Option<(u32, u64, u64)> {
    let mut it = r.split(':');
    let p = it.next()?.parse().ok()?;
    let o = it.next()?.parse().ok()?;
    let n = it.next()?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((p, o, n))
}

pub fn produced_json(r: &crate::partition::Produced) -> Value {
    let mut v = json!({
        "partition": r.partition,
        "base_offset": r.base_offset,
        "count": r.count,
        "duplicate": r.duplicate,
        "log_append_time_ms": r.append_time_ms,
    });
    if r.deduplicated.iter().any(|d| *d) {
        v["offsets"] = json!(r.offsets);
        v["deduplicated"] = json!(r.deduplicated);
    }
    v
}

pub fn topic_json(m: &TopicMeta) -> Value {
    json!({
        "name": m.name,
        "partitions": m.partitions,
        "retention_ms": m.retention_ms,
        "retention_bytes": m.retention_bytes,
        "segment_bytes": m.segment_bytes,
        "segment_ms": m.segment_ms,
        "max_message_bytes": m.max_message_bytes,
        "fifo": m.fifo,
        "dedup_window_ms": m.dedup_window_ms,
        "dedup_scope": if m.dedup_by_group { "group" } else { "topic" },
        "queues": m.queues,
        "tags": m.tags,
        "created_ms": m.created_ms,
        "sqs_queue": m.sqs.is_some(),
    })
}

fn view_json(v: &MemberView) -> Value {
    json!({
        "member_id": v.member_id,
        "generation": v.generation,
        "assignment": v.assignment.iter().map(|(t, p)| json!({"topic": t, "partition": p})).collect::<Vec<_>>(),
        "members": v.members,
    })
}

fn group_json(g: &str, s: &GroupState) -> Value {
    json!({
        "group": g,
        "generation": s.generation,
        "members": s.members.iter().map(|(id, m)| json!({
            "member_id": id,
            "client_id": m.client_id,
            "topics": m.topics,
            "session_timeout_ms": m.session_timeout_ms,
            "last_seen_ms": m.last_seen_ms,
            "assignment": s.assignment.get(id).map(|a| a.iter().map(|(t, p)| json!({"topic": t, "partition": p})).collect::<Vec<_>>()).unwrap_or_default(),
        })).collect::<Vec<_>>(),
        "offsets": s.offsets.iter().map(|(k, c)| {
            let (t, p) = k.rsplit_once('/').unwrap_or((k.as_str(), "0"));
            json!({"topic": t, "partition": p.parse::<u32>().unwrap_or(0), "offset": c.offset, "metadata": c.metadata, "committed_ms": c.committed_ms})
        }).collect::<Vec<_>>(),
    })
}
