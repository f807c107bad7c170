//! The SQS facade: the AWS JSON 1.0 protocol (`POST /`, `X-Amz-Target:
//! AmazonSQS.<Op>`, SigV4 with service `sqs`, verified by the shared layer)
//! over the same topics and queues as the native API. boto3's SQS client
//! works unchanged against it.
//!
//! **Mapping** (docs/mq.md, "SQS facade"):
//!
//! | SQS | here |
//! |---|---|
//! | queue `Q` | topic `Q` with one partition, `TopicMeta.sqs` = its attributes, and one queue named `sqs` over it |
//! | queue URL | `<public URL>/<account id>/<Q>` (the last path segment names the queue) |
//! | message | a record: value = body; headers `sqs-attrs` (message attributes, JSON), `sqs-sender`, `fskv-delay-ms`, `fskv-group`, `fskv-dedup-id` |
//! | `MessageId` | derived from the topic's uid and the record's offset (the same at send and receive) |
//! | `SequenceNumber` (FIFO) | the offset, 20 digits |
//! | receipt handle | base64url(`r1:<uid>:<partition>:<offset>:<nonce>`): the nonce changes at every receive |
//! | `DelaySeconds` (queue or message) | stamped on the record at send (`fskv-delay-ms`) |
//! | `RedrivePolicy` | the queue's `max_deliveries` and dead-letter topic (the DLQ's name from its ARN) |
//! | `MessageRetentionPeriod` | the topic's `retention_ms` (whole segments deleted; older messages are not delivered) |
//! | FIFO, `ContentBasedDeduplication` | topic `fifo`; dedup id = SHA-256 of the body when none is given |
//!
//! **Limits and errors** (AWS's): body and attributes ≤ `MaximumMessageSize`
//! (default and maximum 1 MiB), batches of 1 to 10 entries with distinct
//! ids and ≤ 1 MiB in all, `MaxNumberOfMessages` 1..10, `WaitTimeSeconds`
//! 0..20, `VisibilityTimeout` 0..43200 s, `DelaySeconds` 0..900 s. Errors
//! carry AWS's shape name in `__type` and the query-compatible code in
//! `x-amzn-query-error` (what boto3 reports as `Error.Code`).

use crate::api::{read_body, Mq};
use crate::error::{MqError, Result};
use crate::partition::{QueueOp, QueueReply, ReceivedMessage};
use crate::queue::AckResult;
use crate::record::{Record, HEADER_DEDUP_ID, HEADER_DELAY_MS, HEADER_GROUP};
use crate::route::sqs_target;
use crate::store::{now_ms, QueueMeta, TopicMeta};
use base64::Engine;
use bytes::Bytes;
use fskv_gateway::{GatewayError, RequestBody, RequestContext};
use http::header::{HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Response, StatusCode};
use md5::Digest;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The queue (share group) name an SQS queue's topic carries.
pub const SQS_QUEUE: &str = "sqs";
const HEADER_ATTRS: &str = "sqs-attrs";
const HEADER_SENDER: &str = "sqs-sender";

const MAX_BATCH: usize = 10;
const MAX_BATCH_BYTES: usize = 1 << 20;
const MAX_MESSAGE_BYTES: u64 = 1 << 20;
const MAX_VISIBILITY_S: u64 = 43_200;
const MAX_DELAY_S: u64 = 900;
const MAX_WAIT_S: u64 = 20;
const MAX_ATTRIBUTES: usize = 10;

fn err(shape: &'static str, query_code: &'static str, status: u16, message: impl Into<String>) -> MqError {
    MqError::Sqs { shape, query_code, status, message: message.into() }
}

fn invalid(message: impl Into<String>) -> MqError {
    err("InvalidParameterValue", "InvalidParameterValue", 400, message)
}

fn missing(name: &str) -> MqError {
    err("MissingParameter", "MissingParameter", 400, format!("The request must contain the parameter {name}."))
}

fn no_queue() -> MqError {
    err("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", 400, "The specified queue does not exist.")
}

fn bad_receipt(h: &str) -> MqError {
    err("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 400, format!("The input receipt handle \"{h}\" is not a valid receipt handle."))
}

/// Answers one SQS request.
pub async fn handle(mq: &Mq, parts: &Parts, body: RequestBody, cx: &RequestContext) -> Response<Bytes> {
    let r = match sqs_target(parts) {
        Some(op) => {
            let op = op.to_string();
            match read_body(body, mq.cfg.limits.max_control_bytes).await {
                Ok(b) => match serde_json::from_slice::<Value>(if b.is_empty() { b"{}" } else { &b }) {
                    Ok(v) if v.is_object() => Sqs { mq, parts, cx }.dispatch(&op, &v).await,
                    Ok(_) => Err(err("SerializationException", "SerializationException", 400, "the request body must be a JSON object")),
                    Err(e) => Err(err("SerializationException", "SerializationException", 400, format!("invalid JSON: {e}"))),
                },
                Err(e) => Err(e),
            }
        }
        None => Err(err(
            "InvalidAction",
            "InvalidAction",
            400,
            "only the AWS JSON 1.0 protocol (X-Amz-Target: AmazonSQS.<Operation>) is served; the query protocol is not",
        )),
    };
    match r {
        Ok(v) => {
            let mut resp = Response::new(Bytes::from(v.to_string()));
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.0"));
            add_request_id(&mut resp, cx);
            resp
        }
        Err(e) => {
            crate::server::log_error(&e);
            let mut resp = e.sqs_response();
            add_request_id(&mut resp, cx);
            resp
        }
    }
}

fn add_request_id(resp: &mut Response<Bytes>, cx: &RequestContext) {
    if let Ok(v) = HeaderValue::from_str(&cx.request_id) {
        resp.headers_mut().insert("x-amzn-requestid", v);
    }
}

/// An error of the shared layer (auth, role, limits) in SQS's shape.
pub fn gateway_error(e: &GatewayError) -> Response<Bytes> {
    let r = e.reply();
    let (shape, code): (&'static str, &'static str) = match r.code.as_ref() {
        "InvalidAccessKeyId" => ("InvalidClientTokenId", "InvalidClientTokenId"),
        "SignatureDoesNotMatch" => ("SignatureDoesNotMatch", "SignatureDoesNotMatch"),
        "AccessDenied" | "ReadOnlyGateway" => ("AccessDenied", "AccessDenied"),
        "RequestTimeTooSkewed" => ("RequestExpired", "RequestExpired"),
        "EntityTooLarge" => ("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong"),
        "InternalError" => ("InternalError", "InternalError"),
        _ => ("InvalidParameterValue", "InvalidParameterValue"),
    };
    let mut resp = err(shape, code, r.status.as_u16(), r.message).sqs_response();
    *resp.status_mut() = r.status;
    resp
}

struct Sqs<'a> {
    mq: &'a Mq,
    parts: &'a Parts,
    cx: &'a RequestContext,
}

fn s<'v>(v: &'v Value, k: &str) -> Option<&'v str> {
    v.get(k).and_then(Value::as_str)
}

fn req_s<'v>(v: &'v Value, k: &str) -> Result<&'v str> {
    match v.get(k) {
        None | Some(Value::Null) => Err(missing(k)),
        Some(Value::String(x)) => Ok(x),
        Some(_) => Err(invalid(format!("{k} must be a string"))),
    }
}

fn opt_u64(v: &Value, k: &str) -> Result<Option<u64>> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or_else(|| invalid(format!("Value {x} for parameter {k} is invalid."))),
    }
}

fn string_list(v: &Value, k: &str) -> Result<Vec<String>> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => {
            a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| invalid(format!("{k} must be a list of strings")))).collect()
        }
        Some(_) => Err(invalid(format!("{k} must be a list of strings"))),
    }
}

/// SQS queue names: 1 to 80 of `A-Za-z0-9_-`, `.fifo` at the end for FIFO queues.
fn check_queue_name(name: &str, fifo: bool) -> Result<()> {
    let base = if fifo { name.strip_suffix(".fifo") } else { Some(name) };
    let ok =
        name.len() <= 80 && base.is_some_and(|b| !b.is_empty() && b.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
    if ok {
        Ok(())
    } else if fifo {
        Err(invalid("The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length."))
    } else {
        Err(invalid("Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"))
    }
}

/// Characters SQS accepts in a body or string attribute.
fn check_chars(s: &str) -> Result<()> {
    let ok = s.chars().all(|c| matches!(c as u32, 0x9 | 0xA | 0xD | 0x20..=0xD7FF | 0xE000..=0xFFFD | 0x10000..=0x10FFFF));
    if ok {
        Ok(())
    } else {
        Err(err("InvalidMessageContents", "InvalidMessageContents", 400, "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF"))
    }
}

fn md5_hex(b: &[u8]) -> String {
    hex::encode(md5::Md5::digest(b))
}

/// A message attribute: data type, and its string or binary value.
#[derive(Clone, Debug, PartialEq)]
struct Attr {
    data_type: String,
    string: Option<String>,
    binary: Option<Vec<u8>>,
}

fn parse_attrs(v: Option<&Value>) -> Result<BTreeMap<String, Attr>> {
    let mut out = BTreeMap::new();
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(out) };
    let m = v.as_object().ok_or_else(|| invalid("MessageAttributes must be a map"))?;
    if m.len() > MAX_ATTRIBUTES {
        return Err(invalid(format!("Number of message attributes [{}] exceeds the allowed maximum [{MAX_ATTRIBUTES}].", m.len())));
    }
    for (name, a) in m {
        if name.is_empty()
            || name.len() > 256
            || name.starts_with("AWS.")
            || name.starts_with("Amazon.")
            || name.starts_with('.')
            || name.ends_with('.')
            || name.contains("..")
            || !name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.')
        {
            return Err(invalid(format!("Message attribute name '{name}' is invalid.")));
        }
        let data_type = s(a, "DataType")
            .ok_or_else(|| invalid(format!("The message attribute '{name}' must contain non-empty message attribute type.")))?;
        let kind = data_type.split('.').next().unwrap_or("");
        let attr = match kind {
            "String" | "Number" => {
                let sv = s(a, "StringValue").ok_or_else(|| invalid(format!("The message attribute '{name}' with type '{kind}' must use field 'String'.")))?;
                check_chars(sv)?;
                if kind == "Number" && sv.trim().parse::<f64>().is_err() {
                    return Err(invalid(format!("Can't cast the value of message (user) attribute '{name}' to a number.")));
                }
                Attr { data_type: data_type.to_string(), string: Some(sv.to_string()), binary: None }
            }
            "Binary" => {
                let bv = s(a, "BinaryValue").ok_or_else(|| invalid(format!("The message attribute '{name}' with type 'Binary' must use field 'Binary'.")))?;
                let b = base64::engine::general_purpose::STANDARD.decode(bv).map_err(|_| invalid(format!("The binary value of message attribute '{name}' is not base64.")))?;
                Attr { data_type: data_type.to_string(), string: None, binary: Some(b) }
            }
            _ => return Err(invalid(format!("The type of message (user) attribute '{name}' is invalid. You must use only the following supported type prefixes: Binary, Number, String."))),
        };
        out.insert(name.clone(), attr);
    }
    Ok(out)
}

fn attrs_size(attrs: &BTreeMap<String, Attr>) -> usize {
    attrs
        .iter()
        .map(|(n, a)| n.len() + a.data_type.len() + a.string.as_ref().map_or(0, String::len) + a.binary.as_ref().map_or(0, Vec::len))
        .sum()
}

/// SQS's MD5 of message attributes: over the attributes sorted by name,
/// each as name, type, transport byte (1 string, 2 binary), value, every
/// part with a 4-byte big-endian length.
fn attrs_md5(attrs: &BTreeMap<String, Attr>) -> Option<String> {
    if attrs.is_empty() {
        return None;
    }
    let mut buf = Vec::new();
    let put = |b: &[u8], buf: &mut Vec<u8>| {
        buf.extend_from_slice(&(b.len() as u32).to_be_bytes());
        buf.extend_from_slice(b);
    };
    for (name, a) in attrs {
        put(name.as_bytes(), &mut buf);
        put(a.data_type.as_bytes(), &mut buf);
        match (&a.string, &a.binary) {
            (Some(sv), _) => {
                buf.push(1);
                put(sv.as_bytes(), &mut buf);
            }
            (None, Some(b)) => {
                buf.push(2);
                put(b, &mut buf);
            }
            (None, None) => {}
        }
    }
    Some(md5_hex(&buf))
}

fn attrs_to_header(attrs: &BTreeMap<String, Attr>) -> Vec<u8> {
    let m: Map<String, Value> = attrs
        .iter()
        .map(|(n, a)| {
            let v = match (&a.string, &a.binary) {
                (Some(sv), _) => json!({"DataType": a.data_type, "StringValue": sv}),
                (None, Some(b)) => json!({"DataType": a.data_type, "BinaryValue": base64::engine::general_purpose::STANDARD.encode(b)}),
                _ => json!({"DataType": a.data_type}),
            };
            (n.clone(), v)
        })
        .collect();
    Value::Object(m).to_string().into_bytes()
}

fn message_id(uid: u64, partition: u32, offset: u64) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        uid >> 32,
        (uid >> 16) & 0xffff,
        uid & 0xffff,
        partition & 0xffff,
        offset & 0xffff_ffff_ffff
    )
}

fn receipt_handle(uid: u64, partition: u32, offset: u64, nonce: u64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("r1:{uid}:{partition}:{offset}:{nonce}"))
}

fn parse_receipt_handle(h: &str, uid: u64) -> Result<(u32, u64, u64)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(h).map_err(|_| bad_receipt(h))?;
    let text = String::from_utf8(raw).map_err(|_| bad_receipt(h))?;
    let f: Vec<&str> = text.split(':').collect();
    match f.as_slice() {
        ["r1", u, p, o, n] => {
            let u: u64 = u.parse().map_err(|_| bad_receipt(h))?;
            if u != uid {
                return Err(bad_receipt(h));
            }
            Ok((p.parse().map_err(|_| bad_receipt(h))?, o.parse().map_err(|_| bad_receipt(h))?, n.parse().map_err(|_| bad_receipt(h))?))
        }
        _ => Err(bad_receipt(h)),
    }
}

/// The attributes an SQS queue has, with their defaults and bounds.
const QUEUE_ATTRIBUTES: [&str; 11] = [
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "VisibilityTimeout",
    "RedrivePolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
    "Policy",
];

fn default_attributes(fifo: bool) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("DelaySeconds".into(), "0".into());
    m.insert("MaximumMessageSize".into(), MAX_MESSAGE_BYTES.to_string());
    m.insert("MessageRetentionPeriod".into(), "345600".into());
    m.insert("ReceiveMessageWaitTimeSeconds".into(), "0".into());
    m.insert("VisibilityTimeout".into(), "30".into());
    m.insert("SqsManagedSseEnabled".into(), "false".into());
    if fifo {
        m.insert("FifoQueue".into(), "true".into());
        m.insert("ContentBasedDeduplication".into(), "false".into());
        m.insert("DeduplicationScope".into(), "queue".into());
        m.insert("FifoThroughputLimit".into(), "perQueue".into());
    }
    m
}

fn bad_value(name: &str) -> MqError {
    err("InvalidAttributeValue", "InvalidAttributeValue", 400, format!("Invalid value for the parameter {name}."))
}

fn bounded(name: &str, v: &str, lo: u64, hi: u64) -> Result<u64> {
    match v.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(bad_value(name)),
    }
}

fn bad_attr_name(name: &str) -> MqError {
    err("InvalidAttributeName", "InvalidAttributeName", 400, format!("Unknown Attribute {name}."))
}

impl Sqs<'_> {
    async fn dispatch(&self, op: &str, v: &Value) -> Result<Value> {
        match op {
            "CreateQueue" => self.create_queue(v).await,
            "GetQueueUrl" => {
                let name = req_s(v, "QueueName")?;
                let meta = self.queue_by_name_fresh(name).await?;
                Ok(json!({ "QueueUrl": self.queue_url(&meta.name) }))
            }
            "ListQueues" => self.list_queues(v).await,
            "DeleteQueue" => {
                let meta = self.queue(v).await?;
                self.mq.store.delete_topic(&meta.name).await?;
                Ok(json!({}))
            }
            "GetQueueAttributes" => self.get_attributes(v).await,
            "SetQueueAttributes" => self.set_attributes(v).await,
            "PurgeQueue" => {
                let meta = self.queue(v).await?;
                self.mq.writer.queue(&meta.name, 0, SQS_QUEUE, QueueOp::Purge).await?;
                Ok(json!({}))
            }
            "SendMessage" => {
                let meta = self.queue(v).await?;
                let m = self.prepare_message(&meta, v)?;
                let (sent, _) = self.send(&meta, vec![m]).await?;
                Ok(sent.into_iter().next().unwrap_or_else(|| json!({})))
            }
            "SendMessageBatch" => self.send_batch(v).await,
            "ReceiveMessage" => self.receive(v).await,
            "DeleteMessage" => {
                let meta = self.queue(v).await?;
                let h = req_s(v, "ReceiptHandle")?;
                let (p, off, nonce) = parse_receipt_handle(h, meta.uid)?;
                let r = self.settle(&meta, p, vec![(off, nonce, 0)], true).await?;
                r.into_iter().next().unwrap_or(Ok(())).map(|()| json!({}))
            }
            "DeleteMessageBatch" | "ChangeMessageVisibilityBatch" => self.settle_batch(op == "DeleteMessageBatch", v).await,
            "ChangeMessageVisibility" => {
                let meta = self.queue(v).await?;
                let h = req_s(v, "ReceiptHandle")?;
                let t = opt_u64(v, "VisibilityTimeout")?.ok_or_else(|| missing("VisibilityTimeout"))?;
                if t > MAX_VISIBILITY_S {
                    return Err(invalid(format!(
                        "Value {t} for parameter VisibilityTimeout is invalid. Reason: Must be between 0 and 43200."
                    )));
                }
                let (p, off, nonce) = parse_receipt_handle(h, meta.uid)?;
                let r = self.settle(&meta, p, vec![(off, nonce, t * 1000)], false).await?;
                r.into_iter().next().unwrap_or(Ok(())).map(|()| json!({}))
            }
            "TagQueue" => {
                let meta = self.queue(v).await?;
                let tags = v.get("Tags").and_then(Value::as_object).ok_or_else(|| missing("Tags"))?;
                let mut add = BTreeMap::new();
                for (k, t) in tags {
                    let t = t.as_str().ok_or_else(|| invalid("tag values must be strings"))?;
                    add.insert(k.clone(), t.to_string());
                }
                self.mq
                    .edit_topic(&meta.name, |m| {
                        m.tags.extend(add.clone());
                        if m.tags.len() > 50 {
                            return Err(invalid("Too many tags added for queue"));
                        }
                        Ok(())
                    })
                    .await?;
                Ok(json!({}))
            }
            "UntagQueue" => {
                let meta = self.queue(v).await?;
                let keys = string_list(v, "TagKeys")?;
                self.mq
                    .edit_topic(&meta.name, |m| {
                        for k in &keys {
                            m.tags.remove(k);
                        }
                        Ok(())
                    })
                    .await?;
                Ok(json!({}))
            }
            "ListQueueTags" => {
                let meta = self.queue_fresh(v).await?;
                if meta.tags.is_empty() {
                    Ok(json!({}))
                } else {
                    Ok(json!({ "Tags": meta.tags }))
                }
            }
            "ListDeadLetterSourceQueues" => {
                let meta = self.queue_fresh(v).await?;
                let mut urls = Vec::new();
                for name in self.mq.store.list_topics().await? {
                    if let Ok(m) = self.mq.store.topic(&name).await {
                        if m.sqs.is_some()
                            && m.queues.get(SQS_QUEUE).and_then(|q| q.dead_letter_topic.as_deref()) == Some(meta.name.as_str())
                        {
                            urls.push(self.queue_url(&name));
                        }
                    }
                }
                Ok(json!({ "queueUrls": urls }))
            }
            "AddPermission" | "RemovePermission" | "StartMessageMoveTask" | "CancelMessageMoveTask" | "ListMessageMoveTasks" => Err(err(
                "UnsupportedOperation",
                "AWS.SimpleQueueService.UnsupportedOperation",
                400,
                format!("{op} is not supported by this gateway"),
            )),
            _ => Err(err("InvalidAction", "InvalidAction", 400, format!("The action {op} is not valid for this endpoint."))),
        }
    }

    /// `<public URL or http://Host>/<account>/<name>`.
    fn queue_url(&self, name: &str) -> String {
        let base = if self.mq.cfg.public_url.is_empty() {
            let host = self.parts.headers.get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
            format!("http://{host}")
        } else {
            self.mq.cfg.public_url.trim_end_matches('/').to_string()
        };
        format!("{base}/{}/{name}", self.mq.cfg.account_id)
    }

    fn arn(&self, name: &str) -> String {
        format!("arn:aws:sqs:{}:{}:{name}", self.mq.cfg.region, self.mq.cfg.account_id)
    }

    async fn queue_by_name(&self, name: &str) -> Result<std::sync::Arc<TopicMeta>> {
        if name.is_empty() || name.len() > 80 || crate::store::check_topic_name(name).is_err() {
            return Err(no_queue());
        }
        match self.mq.store.topic(name).await {
            Ok(m) if m.sqs.is_some() => {
                m.check_owner(self.tenant())?;
                Ok(m)
            }
            Ok(_) | Err(MqError::TopicNotFound(_)) => Err(no_queue()),
            Err(e) => Err(e),
        }
    }

    /// The tenant the request acts for (SQS routes are authenticated).
    fn tenant(&self) -> &str {
        self.cx.principal.as_ref().map_or("", |p| p.tenant.as_str())
    }

    /// The queue a request's `QueueUrl` names, read from the store now (not
    /// from the configuration cache), for the read-only operations
    /// (`GetQueueAttributes`, `ListQueueTags`, `GetQueueUrl`,
    /// `ListDeadLetterSourceQueues`): a read right after a change
    /// (`SetQueueAttributes`, `TagQueue`, …) must see it, also on a reader (behind the front,
    /// the attribute write went to the writer process and the read to a
    /// reader, whose cache may be up to `CACHE_TTL_MS` old).
    async fn queue_fresh(&self, v: &Value) -> Result<std::sync::Arc<TopicMeta>> {
        let url = req_s(v, "QueueUrl")?;
        let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        self.queue_by_name_fresh(name).await
    }

    /// [`Self::queue_by_name`] read from the store now (see [`Self::queue_fresh`]).
    async fn queue_by_name_fresh(&self, name: &str) -> Result<std::sync::Arc<TopicMeta>> {
        if name.is_empty() || name.len() > 80 || crate::store::check_topic_name(name).is_err() {
            return Err(no_queue());
        }
        match self.mq.store.topic_versioned(name).await {
            Ok(m) if m.value.sqs.is_some() => {
                m.value.check_owner(self.tenant())?;
                Ok(std::sync::Arc::new(m.value))
            }
            Ok(_) | Err(MqError::TopicNotFound(_)) => Err(no_queue()),
            Err(e) => Err(e),
        }
    }

    /// The queue a request's `QueueUrl` names.
    async fn queue(&self, v: &Value) -> Result<std::sync::Arc<TopicMeta>> {
        let url = req_s(v, "QueueUrl")?;
        let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        self.queue_by_name(name).await
    }

    async fn create_queue(&self, v: &Value) -> Result<Value> {
        let name = req_s(v, "QueueName")?;
        let mut given: BTreeMap<String, String> = BTreeMap::new();
        if let Some(a) = v.get("Attributes").filter(|a| !a.is_null()) {
            for (k, x) in a.as_object().ok_or_else(|| invalid("Attributes must be a map"))? {
                given.insert(k.clone(), x.as_str().ok_or_else(|| invalid(format!("attribute {k} must be a string")))?.to_string());
            }
        }
        let fifo = match given.get("FifoQueue").map(String::as_str) {
            None => false,
            Some("true") => true,
            Some("false") => {
                given.remove("FifoQueue");
                false
            }
            Some(_) => return Err(bad_value("FifoQueue")),
        };
        if name.ends_with(".fifo") && !fifo {
            return Err(invalid("Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"));
        }
        check_queue_name(name, fifo)?;
        let mut attrs = default_attributes(fifo);
        for (k, x) in &given {
            attrs.insert(k.clone(), x.clone());
        }
        let (queue, retention_ms) = self.validate_attributes(&attrs, fifo).await?;
        let mut tags = BTreeMap::new();
        if let Some(t) = v.get("tags").and_then(Value::as_object) {
            for (k, x) in t {
                tags.insert(k.clone(), x.as_str().unwrap_or_default().to_string());
            }
        }
        let now = now_ms();
        attrs.insert("CreatedTimestamp".into(), (now / 1000).to_string());
        attrs.insert("LastModifiedTimestamp".into(), (now / 1000).to_string());
        let d = &self.mq.cfg.defaults;
        let meta = TopicMeta {
            name: name.to_string(),
            uid: rand::random(),
            partitions: 1,
            retention_ms: Some(retention_ms),
            retention_bytes: None,
            segment_bytes: d.segment_bytes,
            segment_ms: d.segment_ms,
            max_message_bytes: MAX_MESSAGE_BYTES,
            fifo,
            dedup_window_ms: 5 * 60 * 1000,
            dedup_by_group: attrs.get("DeduplicationScope").is_some_and(|s| s == "messageGroup"),
            queues: [(SQS_QUEUE.to_string(), queue)].into_iter().collect(),
            sqs: Some(attrs.clone()),
            tags,
            tenant: self.cx.principal.as_ref().map(|p| p.tenant.clone()).unwrap_or_default(),
            created_ms: now,
            modified_ms: now,
        };
        match self.mq.store.create_topic(&meta).await {
            Ok(()) => Ok(json!({ "QueueUrl": self.queue_url(name) })),
            Err(MqError::TopicExists(_)) => {
                // Same attributes: the existing queue's URL; different: QueueNameExists.
                let cur = self.mq.store.topic(name).await?;
                cur.check_owner(self.tenant())?;
                let Some(cur_attrs) = &cur.sqs else {
                    return Err(err(
                        "QueueNameExists",
                        "QueueAlreadyExists",
                        400,
                        format!("A topic named {name} exists and is not an SQS queue."),
                    ));
                };
                let same = given.iter().all(|(k, x)| cur_attrs.get(k) == Some(x) || (k == "FifoQueue" && x == "true" && cur.fifo));
                if same {
                    Ok(json!({ "QueueUrl": self.queue_url(name) }))
                } else {
                    Err(err(
                        "QueueNameExists",
                        "QueueAlreadyExists",
                        400,
                        format!("A queue already exists with the same name and a different value for attribute(s) of {name}"),
                    ))
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Checks settable attributes; returns the queue settings and retention.
    async fn validate_attributes(&self, attrs: &BTreeMap<String, String>, fifo: bool) -> Result<(QueueMeta, u64)> {
        let mut q = QueueMeta::default();
        let mut retention_ms = 345_600_000;
        for (k, x) in attrs {
            match k.as_str() {
                "DelaySeconds" => {
                    bounded(k, x, 0, MAX_DELAY_S)?;
                }
                "MaximumMessageSize" => {
                    bounded(k, x, 1024, MAX_MESSAGE_BYTES)?;
                }
                "MessageRetentionPeriod" => retention_ms = bounded(k, x, 60, 1_209_600)? * 1000,
                "ReceiveMessageWaitTimeSeconds" => {
                    bounded(k, x, 0, MAX_WAIT_S)?;
                }
                "VisibilityTimeout" => q.visibility_ms = bounded(k, x, 0, MAX_VISIBILITY_S)? * 1000,
                "RedrivePolicy" => {
                    if x.is_empty() {
                        continue;
                    }
                    let p: Value = serde_json::from_str(x).map_err(|_| {
                        err(
                            "InvalidAttributeValue",
                            "InvalidAttributeValue",
                            400,
                            "Invalid value for the parameter RedrivePolicy. Reason: Redrive policy is not a valid JSON map.",
                        )
                    })?;
                    let target = p.get("deadLetterTargetArn").and_then(Value::as_str).ok_or_else(|| {
                        err("InvalidAttributeValue", "InvalidAttributeValue", 400, "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy does not contain mandatory attribute: deadLetterTargetArn.")
                    })?;
                    let count = match p.get("maxReceiveCount") {
                        Some(Value::Number(n)) => n.as_u64(),
                        Some(Value::String(s)) => s.parse().ok(),
                        _ => None,
                    }
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| err("InvalidAttributeValue", "InvalidAttributeValue", 400, "Value for parameter RedrivePolicy is invalid. Reason: Invalid value for maxReceiveCount: must be an integer from 1 to 1000."))?;
                    let dlq = target.rsplit(':').next().unwrap_or("");
                    let dmeta = self.queue_by_name(dlq).await.map_err(|_| {
                        err(
                            "InvalidParameterValue",
                            "InvalidParameterValue",
                            400,
                            format!("Value {x} for parameter RedrivePolicy is invalid. Reason: Dead letter target does not exist."),
                        )
                    })?;
                    if dmeta.fifo != fifo {
                        return Err(invalid("Value for parameter RedrivePolicy is invalid. Reason: The dead-letter queue of a FIFO queue must also be a FIFO queue (and of a standard queue, a standard queue)."));
                    }
                    q.max_deliveries = Some(count as u32);
                    q.dead_letter_topic = Some(dmeta.name.clone());
                }
                "FifoQueue" => {
                    if x != "true" || !fifo {
                        return Err(bad_attr_name(k));
                    }
                }
                "ContentBasedDeduplication" if fifo => {
                    if x != "true" && x != "false" {
                        return Err(bad_value(k));
                    }
                }
                "DeduplicationScope" if fifo => {
                    if x != "queue" && x != "messageGroup" {
                        return Err(bad_value(k));
                    }
                }
                "FifoThroughputLimit" if fifo => {
                    if x != "perQueue" && x != "perMessageGroupId" {
                        return Err(bad_value(k));
                    }
                }
                "Policy" | "SqsManagedSseEnabled" | "KmsMasterKeyId" | "KmsDataKeyReusePeriodSeconds" | "RedriveAllowPolicy" => {}
                "CreatedTimestamp" | "LastModifiedTimestamp" => {}
                _ => return Err(bad_attr_name(k)),
            }
        }
        Ok((q, retention_ms))
    }

    async fn list_queues(&self, v: &Value) -> Result<Value> {
        let prefix = s(v, "QueueNamePrefix").unwrap_or("");
        let max = match opt_u64(v, "MaxResults")? {
            None => None,
            Some(n @ 1..=1000) => Some(n as usize),
            Some(n) => {
                return Err(invalid(format!(
                    "Value {n} for parameter MaxResults is invalid. Reason: MaxResults must be an integer between 1 and 1000."
                )))
            }
        };
        let after = s(v, "NextToken").map(str::to_string);
        let mut names = self.mq.store.list_topics().await?;
        names.sort();
        let mut urls = Vec::new();
        let mut next = None;
        for name in names.into_iter().filter(|n| n.starts_with(prefix)) {
            if after.as_ref().is_some_and(|a| name.as_str() <= a.as_str()) {
                continue;
            }
            match self.mq.store.topic(&name).await {
                Ok(m) if m.sqs.is_some() && m.owner() == self.tenant() => {}
                _ => continue,
            }
            if max.is_some_and(|m| urls.len() >= m) {
                next = urls.last().map(|_| name.clone());
                break;
            }
            urls.push((name.clone(), self.queue_url(&name)));
        }
        let mut out = json!({});
        if !urls.is_empty() {
            if next.is_some() {
                out["NextToken"] = json!(urls.last().map(|(n, _)| n.clone()));
            }
            out["QueueUrls"] = json!(urls.into_iter().map(|(_, u)| u).collect::<Vec<_>>());
        }
        Ok(out)
    }

    async fn get_attributes(&self, v: &Value) -> Result<Value> {
        let meta = self.queue_fresh(v).await?;
        let names = string_list(v, "AttributeNames")?;
        let Some(stored) = &meta.sqs else { return Err(no_queue()) };
        let mut all: BTreeMap<String, String> = stored.clone();
        all.insert("QueueArn".into(), self.arn(&meta.name));
        if let Some(q) = meta.queues.get(SQS_QUEUE) {
            if let (Some(d), Some(n)) = (&q.dead_letter_topic, q.max_deliveries) {
                all.insert("RedrivePolicy".into(), json!({"deadLetterTargetArn": self.arn(d), "maxReceiveCount": n}).to_string());
            }
        }
        let wants_counts = names.iter().any(|n| n == "All" || n.starts_with("ApproximateNumberOfMessages"));
        if wants_counts {
            let c = self.mq.queue_counts(&meta.name, 0, SQS_QUEUE).await?;
            all.insert("ApproximateNumberOfMessages".into(), c.visible.to_string());
            all.insert("ApproximateNumberOfMessagesNotVisible".into(), c.in_flight.to_string());
            all.insert("ApproximateNumberOfMessagesDelayed".into(), c.delayed.to_string());
        }
        let mut out = Map::new();
        for n in &names {
            if n == "All" {
                for (k, x) in &all {
                    out.insert(k.clone(), json!(x));
                }
                continue;
            }
            let known = QUEUE_ATTRIBUTES.contains(&n.as_str())
                || matches!(
                    n.as_str(),
                    "QueueArn"
                        | "ApproximateNumberOfMessages"
                        | "ApproximateNumberOfMessagesNotVisible"
                        | "ApproximateNumberOfMessagesDelayed"
                        | "CreatedTimestamp"
                        | "LastModifiedTimestamp"
                        | "SqsManagedSseEnabled"
                        | "KmsMasterKeyId"
                        | "KmsDataKeyReusePeriodSeconds"
                        | "RedriveAllowPolicy"
                );
            if !known {
                return Err(bad_attr_name(n));
            }
            if let Some(x) = all.get(n) {
                out.insert(n.clone(), json!(x));
            }
        }
        if out.is_empty() {
            return Ok(json!({}));
        }
        Ok(json!({ "Attributes": out }))
    }

    async fn set_attributes(&self, v: &Value) -> Result<Value> {
        let meta = self.queue(v).await?;
        let mut given: BTreeMap<String, String> = BTreeMap::new();
        for (k, x) in v.get("Attributes").and_then(Value::as_object).ok_or_else(|| missing("Attributes"))? {
            given.insert(k.clone(), x.as_str().ok_or_else(|| invalid(format!("attribute {k} must be a string")))?.to_string());
        }
        if given.contains_key("FifoQueue") {
            return Err(bad_attr_name("FifoQueue"));
        }
        let mut attrs = meta.sqs.clone().unwrap_or_default();
        attrs.extend(given.clone());
        let (queue, retention_ms) = self.validate_attributes(&attrs, meta.fifo).await?;
        let clear_redrive = given.get("RedrivePolicy").is_some_and(String::is_empty);
        self.mq
            .edit_topic(&meta.name, |m| {
                let mut a = attrs.clone();
                a.insert("LastModifiedTimestamp".into(), (now_ms() / 1000).to_string());
                if clear_redrive {
                    a.remove("RedrivePolicy");
                }
                m.dedup_by_group = a.get("DeduplicationScope").is_some_and(|s| s == "messageGroup");
                m.sqs = Some(a);
                m.retention_ms = Some(retention_ms);
                m.queues.insert(SQS_QUEUE.to_string(), queue.clone());
                Ok(())
            })
            .await?;
        Ok(json!({}))
    }

    /// Checks one SendMessage(-BatchEntry) and turns it into a record.
    fn prepare_message(&self, meta: &TopicMeta, v: &Value) -> Result<(Record, Value)> {
        let attrs_cfg = meta.sqs.as_ref();
        let body = req_s(v, "MessageBody")?;
        if body.is_empty() {
            return Err(missing("MessageBody"));
        }
        check_chars(body)?;
        let attrs = parse_attrs(v.get("MessageAttributes"))?;
        let max: usize =
            attrs_cfg.and_then(|a| a.get("MaximumMessageSize")).and_then(|x| x.parse().ok()).unwrap_or(MAX_MESSAGE_BYTES as usize);
        if body.len() + attrs_size(&attrs) > max {
            return Err(invalid(format!("One or more parameters are invalid. Reason: Message must be shorter than {max} bytes.")));
        }
        let queue_delay: u64 = attrs_cfg.and_then(|a| a.get("DelaySeconds")).and_then(|x| x.parse().ok()).unwrap_or(0);
        let delay = match opt_u64(v, "DelaySeconds")? {
            Some(_) if meta.fifo => return Err(invalid(
                "Value for parameter DelaySeconds is invalid. Reason: The request include parameter that is not valid for this queue type.",
            )),
            Some(d) if d > MAX_DELAY_S => {
                return Err(invalid(format!(
                    "Value {d} for parameter DelaySeconds is invalid. Reason: DelaySeconds must be >= 0 and <= 900."
                )))
            }
            Some(d) => d,
            None => queue_delay,
        };
        let mut headers: Vec<(String, Bytes)> = Vec::new();
        if !attrs.is_empty() {
            headers.push((HEADER_ATTRS.into(), Bytes::from(attrs_to_header(&attrs))));
        }
        if let Some(p) = &self.cx.principal {
            headers.push((HEADER_SENDER.into(), Bytes::from(p.access_key.clone())));
        }
        if delay > 0 {
            headers.push((HEADER_DELAY_MS.into(), Bytes::from((delay * 1000).to_string())));
        }
        let group = s(v, "MessageGroupId");
        let dedup = s(v, "MessageDeduplicationId");
        if meta.fifo {
            let g = group.ok_or_else(|| missing("MessageGroupId"))?;
            check_token("MessageGroupId", g)?;
            headers.push((HEADER_GROUP.into(), Bytes::from(g.to_string())));
            let content_based = attrs_cfg.and_then(|a| a.get("ContentBasedDeduplication")).is_some_and(|x| x == "true");
            let d = match dedup {
                Some(d) => {
                    check_token("MessageDeduplicationId", d)?;
                    d.to_string()
                }
                None if content_based => hex::encode(sha2::Sha256::digest(body.as_bytes())),
                None => {
                    return Err(invalid(
                        "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly",
                    ))
                }
            };
            headers.push((HEADER_DEDUP_ID.into(), Bytes::from(d)));
        } else if dedup.is_some() {
            return Err(invalid("Value for parameter MessageDeduplicationId is invalid. Reason: The request includes a parameter that is not valid for this queue type."));
        } else if let Some(g) = group {
            // Standard queues accept a group id (fair queues) and ignore it for ordering.
            check_token("MessageGroupId", g)?;
        }
        let mut echo = json!({ "MD5OfMessageBody": md5_hex(body.as_bytes()) });
        if let Some(m) = attrs_md5(&attrs) {
            echo["MD5OfMessageAttributes"] = json!(m);
        }
        let record = Record { timestamp_ms: -1, key: None, value: Bytes::from(body.to_string()), headers };
        Ok((record, echo))
    }

    /// Appends prepared messages; the answer of each (in order).
    async fn send(&self, meta: &TopicMeta, msgs: Vec<(Record, Value)>) -> Result<(Vec<Value>, u64)> {
        let (records, echoes): (Vec<Record>, Vec<Value>) = msgs.into_iter().unzip();
        let r = self.mq.writer.produce(&meta.name, 0, None, records).await?;
        let mut out = Vec::with_capacity(echoes.len());
        for (i, mut e) in echoes.into_iter().enumerate() {
            let off = r.offsets.get(i).copied().unwrap_or(r.base_offset + i as u64);
            e["MessageId"] = json!(message_id(meta.uid, 0, off));
            if meta.fifo {
                e["SequenceNumber"] = json!(format!("{off:020}"));
            }
            out.push(e);
        }
        Ok((out, r.base_offset))
    }

    fn batch_entries<'v>(&self, v: &'v Value) -> Result<&'v Vec<Value>> {
        let entries = match v.get("Entries") {
            None | Some(Value::Null) => return Err(missing("Entries")),
            Some(Value::Array(a)) => a,
            Some(_) => return Err(invalid("Entries must be a list")),
        };
        if entries.is_empty() {
            return Err(err(
                "EmptyBatchRequest",
                "AWS.SimpleQueueService.EmptyBatchRequest",
                400,
                "There should be at least one SendMessageBatchRequestEntry in the request.",
            ));
        }
        if entries.len() > MAX_BATCH {
            return Err(err(
                "TooManyEntriesInBatchRequest",
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                400,
                format!("Maximum number of entries per request are {MAX_BATCH}. You have sent {}.", entries.len()),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for e in entries {
            let id = s(e, "Id").ok_or_else(|| missing("Id"))?;
            if id.is_empty() || id.len() > 80 || !id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
                return Err(err("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId", 400, "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long."));
            }
            if !seen.insert(id) {
                return Err(err(
                    "BatchEntryIdsNotDistinct",
                    "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                    400,
                    format!("Id {id} repeated."),
                ));
            }
        }
        Ok(entries)
    }

    async fn send_batch(&self, v: &Value) -> Result<Value> {
        let meta = self.queue(v).await?;
        let entries = self.batch_entries(v)?;
        let total: usize = entries
            .iter()
            .map(|e| s(e, "MessageBody").map_or(0, str::len) + parse_attrs(e.get("MessageAttributes")).map_or(0, |a| attrs_size(&a)))
            .sum();
        if total > MAX_BATCH_BYTES {
            return Err(err(
                "BatchRequestTooLong",
                "AWS.SimpleQueueService.BatchRequestTooLong",
                400,
                format!("Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. You have sent {total} bytes."),
            ));
        }
        let mut ok_ids = Vec::new();
        let mut prepared = Vec::new();
        let mut failed = Vec::new();
        for e in entries {
            let id = s(e, "Id").unwrap_or_default().to_string();
            match self.prepare_message(&meta, e) {
                Ok(m) => {
                    ok_ids.push(id);
                    prepared.push(m);
                }
                Err(er) => failed.push(failure(&id, &er)),
            }
        }
        let mut successful = Vec::new();
        if !prepared.is_empty() {
            let (sent, _) = self.send(&meta, prepared).await?;
            for (id, mut s) in ok_ids.into_iter().zip(sent) {
                s["Id"] = json!(id);
                successful.push(s);
            }
        }
        Ok(json!({ "Successful": successful, "Failed": failed }))
    }

    async fn receive(&self, v: &Value) -> Result<Value> {
        let meta = self.queue(v).await?;
        let max = match opt_u64(v, "MaxNumberOfMessages")? {
            None => 1,
            Some(n @ 1..=10) => n as usize,
            Some(n) => {
                return Err(invalid(format!(
                    "Value {n} for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided."
                )));
            }
        };
        let vis = match opt_u64(v, "VisibilityTimeout")? {
            Some(t) if t > MAX_VISIBILITY_S => {
                return Err(invalid(format!(
                    "Value {t} for parameter VisibilityTimeout is invalid. Reason: Must be between 0 and 43200, if provided."
                )))
            }
            t => t.map(|t| t * 1000),
        };
        let queue_wait: u64 =
            meta.sqs.as_ref().and_then(|a| a.get("ReceiveMessageWaitTimeSeconds")).and_then(|x| x.parse().ok()).unwrap_or(0);
        let wait = match opt_u64(v, "WaitTimeSeconds")? {
            Some(w) if w > MAX_WAIT_S => {
                return Err(invalid(format!(
                    "Value {w} for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, if provided."
                )))
            }
            Some(w) => w,
            None => queue_wait,
        };
        let mut sys_names = string_list(v, "AttributeNames")?;
        sys_names.extend(string_list(v, "MessageSystemAttributeNames")?);
        let attr_names = string_list(v, "MessageAttributeNames")?;
        let msgs = self.mq.receive(&meta.name, SQS_QUEUE, max, vis, wait * 1000).await?;
        let out: Vec<Value> = msgs.iter().map(|(p, m)| self.message_json(&meta, *p, m, &sys_names, &attr_names)).collect();
        if out.is_empty() {
            return Ok(json!({}));
        }
        Ok(json!({ "Messages": out }))
    }

    fn message_json(&self, meta: &TopicMeta, p: u32, m: &ReceivedMessage, sys: &[String], wanted: &[String]) -> Value {
        let body = String::from_utf8_lossy(&m.record.value).into_owned();
        let mut out = json!({
            "MessageId": message_id(meta.uid, p, m.offset),
            "ReceiptHandle": receipt_handle(meta.uid, p, m.offset, m.nonce),
            "MD5OfBody": md5_hex(body.as_bytes()),
            "Body": body,
        });
        let all_sys = sys.iter().any(|n| n == "All");
        let mut sa = Map::new();
        let mut put = |name: &str, val: String| {
            if all_sys || sys.iter().any(|n| n == name) {
                sa.insert(name.to_string(), json!(val));
            }
        };
        put("ApproximateReceiveCount", m.count.to_string());
        put("SentTimestamp", m.record.timestamp_ms.max(0).to_string());
        put("ApproximateFirstReceiveTimestamp", m.first_receive_ms.to_string());
        if let Some(sender) = m.record.header_str(HEADER_SENDER) {
            put("SenderId", sender.to_string());
        }
        if meta.fifo {
            if let Some(g) = m.record.header_str(HEADER_GROUP) {
                put("MessageGroupId", g.to_string());
            }
            if let Some(d) = m.record.header_str(HEADER_DEDUP_ID) {
                put("MessageDeduplicationId", d.to_string());
            }
            put("SequenceNumber", format!("{:020}", m.offset));
        }
        if !sa.is_empty() {
            out["Attributes"] = Value::Object(sa);
        }
        let stored: BTreeMap<String, Attr> = m
            .record
            .header(HEADER_ATTRS)
            .and_then(|h| serde_json::from_slice::<Value>(h).ok())
            .and_then(|v| parse_attrs(Some(&v)).ok())
            .unwrap_or_default();
        if !stored.is_empty() {
            // MD5OfMessageAttributes covers every attribute; the map only the ones asked for.
            if let Some(md5) = attrs_md5(&stored) {
                out["MD5OfMessageAttributes"] = json!(md5);
            }
            let all = wanted.iter().any(|n| n == "All" || n == ".*");
            let picked: BTreeMap<String, Attr> = stored
                .into_iter()
                .filter(|(n, _)| {
                    all || wanted.iter().any(|w| w == n || w.strip_suffix(".*").is_some_and(|pfx| n.starts_with(&format!("{pfx}."))))
                })
                .collect();
            if !picked.is_empty() {
                let m: Map<String, Value> = picked
                    .into_iter()
                    .map(|(n, a)| {
                        let v = match (a.string, a.binary) {
                            (Some(sv), _) => json!({"DataType": a.data_type, "StringValue": sv}),
                            (None, Some(b)) => {
                                json!({"DataType": a.data_type, "BinaryValue": base64::engine::general_purpose::STANDARD.encode(b)})
                            }
                            _ => json!({"DataType": a.data_type}),
                        };
                        (n, v)
                    })
                    .collect();
                out["MessageAttributes"] = Value::Object(m);
            }
        }
        out
    }

    /// Deletes (`delete`) or changes the visibility of received messages
    /// of one partition; a result per item.
    async fn settle(&self, meta: &TopicMeta, p: u32, items: Vec<(u64, u64, u64)>, delete: bool) -> Result<Vec<Result<()>>> {
        if p >= meta.partitions {
            return Ok(items.iter().map(|_| Err(bad_receipt("?"))).collect());
        }
        let op =
            if delete { QueueOp::Ack(items.iter().map(|(o, n, _)| (*o, *n)).collect()) } else { QueueOp::ChangeVisibility(items.clone()) };
        let reply = self.mq.writer.queue(&meta.name, p, SQS_QUEUE, op).await?;
        let out = match reply {
            QueueReply::Acked(v) => v.into_iter().map(|r| r.map(|_: AckResult| ()).map_err(sqs_item_error)).collect(),
            QueueReply::Changed(v) => v.into_iter().map(|r| r.map_err(sqs_item_error)).collect(),
            other => return Err(MqError::Internal(format!("unexpected queue reply {other:?}"))),
        };
        Ok(out)
    }

    async fn settle_batch(&self, delete: bool, v: &Value) -> Result<Value> {
        let meta = self.queue(v).await?;
        let entries = self.batch_entries(v)?;
        let mut failed = Vec::new();
        let mut successful = Vec::new();
        for e in entries {
            let id = s(e, "Id").unwrap_or_default().to_string();
            let r: Result<()> = async {
                let h = req_s(e, "ReceiptHandle")?;
                let t = if delete {
                    0
                } else {
                    match opt_u64(e, "VisibilityTimeout")? {
                        Some(t) if t <= MAX_VISIBILITY_S => t * 1000,
                        Some(t) => {
                            return Err(invalid(format!(
                                "Value {t} for parameter VisibilityTimeout is invalid. Reason: Must be between 0 and 43200."
                            )))
                        }
                        None => return Err(missing("VisibilityTimeout")),
                    }
                };
                let (p, off, nonce) = parse_receipt_handle(h, meta.uid)?;
                self.settle(&meta, p, vec![(off, nonce, t)], delete).await?.into_iter().next().unwrap_or(Ok(()))
            }
            .await;
            match r {
                Ok(()) => successful.push(json!({ "Id": id })),
                Err(er) if er.retryable() || matches!(er, MqError::Internal(_) | MqError::Corrupt(_)) => return Err(er),
                Err(er) => failed.push(failure(&id, &er)),
            }
        }
        Ok(json!({ "Successful": successful, "Failed": failed }))
    }
}

fn check_token(name: &str, v: &str) -> Result<()> {
    if v.is_empty() || v.len() > 128 || !v.bytes().all(|c| (0x21..=0x7e).contains(&c)) {
        return Err(invalid(format!("Value {v} for parameter {name} is invalid. Reason: it must be 1 to 128 printable ASCII characters.")));
    }
    Ok(())
}

/// Per-message errors of DeleteMessage / ChangeMessageVisibility in SQS's terms.
fn sqs_item_error(e: MqError) -> MqError {
    match e {
        MqError::InvalidReceipt(h) => bad_receipt(&h),
        MqError::NotInFlight(m) => err("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", 400, m),
        other => other,
    }
}

fn failure(id: &str, e: &MqError) -> Value {
    let (_, code, status) = e.sqs();
    json!({ "Id": id, "SenderFault": !status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE, "Code": code, "Message": e.public_message() })
}

/// Entry points of the fuzz target `mq_sqs` (gateway-mq/fuzz) into the pure
/// parsers of request fields above; not an API (their behaviour is the
/// private functions', unchanged).
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// A `MessageAttributes` value as SendMessage takes it: `None` if it is
    /// refused, else its size as counted against `MaximumMessageSize`, its
    /// MD5 and the record header it is stored as (which ReceiveMessage
    /// parses back with the same function).
    pub fn message_attributes(v: &Value) -> Option<(usize, Option<String>, Vec<u8>)> {
        let attrs = parse_attrs(Some(v)).ok()?;
        Some((attrs_size(&attrs), attrs_md5(&attrs), attrs_to_header(&attrs)))
    }

    pub fn receipt_handle(uid: u64, partition: u32, offset: u64, nonce: u64) -> String {
        super::receipt_handle(uid, partition, offset, nonce)
    }

    pub fn parse_receipt_handle(h: &str, uid: u64) -> Option<(u32, u64, u64)> {
        super::parse_receipt_handle(h, uid).ok()
    }

    pub fn queue_name_ok(name: &str, fifo: bool) -> bool {
        check_queue_name(name, fifo).is_ok()
    }

    pub fn chars_ok(s: &str) -> bool {
        check_chars(s).is_ok()
    }

    pub fn token_ok(s: &str) -> bool {
        check_token("Id", s).is_ok()
    }

    /// The typed request fields read from a JSON body (`opt_u64`,
    /// `string_list`, `req_s`): whether each was accepted.
    pub fn fields(v: &Value, k: &str) -> (bool, bool, bool) {
        (opt_u64(v, k).is_ok(), string_list(v, k).is_ok(), req_s(v, k).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_md5_matches_aws() {
        // The encoding spelled out; conformance/mq compares the MD5s with moto's for several types.
        let mut a = BTreeMap::new();
        a.insert("a".to_string(), Attr { data_type: "String".into(), string: Some("b".into()), binary: None });
        let mut buf = Vec::new();
        for part in [b"a".as_slice(), b"String".as_slice()] {
            buf.extend_from_slice(&(part.len() as u32).to_be_bytes());
            buf.extend_from_slice(part);
        }
        buf.push(1);
        buf.extend_from_slice(&1u32.to_be_bytes());
        buf.extend_from_slice(b"b");
        assert_eq!(attrs_md5(&a), Some(md5_hex(&buf)));
        assert_eq!(attrs_md5(&BTreeMap::new()), None);
    }

    #[test]
    fn receipts_round_trip_and_reject_other_queues() {
        let h = receipt_handle(42, 0, 7, 9);
        assert_eq!(parse_receipt_handle(&h, 42).ok(), Some((0, 7, 9)));
        assert!(parse_receipt_handle(&h, 43).is_err());
        assert!(parse_receipt_handle("garbage!", 42).is_err());
        assert!(parse_receipt_handle("", 42).is_err());
    }

    #[test]
    fn names_and_characters() {
        assert!(check_queue_name("orders", false).is_ok());
        assert!(check_queue_name("orders.fifo", true).is_ok());
        assert!(check_queue_name("orders", true).is_err());
        assert!(check_queue_name("a.b", false).is_err());
        assert!(check_queue_name(&"x".repeat(81), false).is_err());
        assert!(check_chars("ok\tfine\n").is_ok());
        assert!(check_chars("bad\u{1}").is_err());
    }

    #[test]
    fn attributes_parse_and_limits() {
        let v = json!({"n": {"DataType": "Number", "StringValue": "12"}, "b": {"DataType": "Binary", "BinaryValue": "AAE="}});
        let a = parse_attrs(Some(&v)).unwrap();
        assert_eq!(a["b"].binary.as_deref(), Some(&[0u8, 1][..]));
        assert!(parse_attrs(Some(&json!({"n": {"DataType": "Number", "StringValue": "x"}}))).is_err());
        assert!(parse_attrs(Some(&json!({"AWS.x": {"DataType": "String", "StringValue": "x"}}))).is_err());
        let many: Map<String, Value> = (0..11).map(|i| (format!("a{i}"), json!({"DataType": "String", "StringValue": "x"}))).collect();
        assert!(parse_attrs(Some(&Value::Object(many))).is_err());
    }
}
