//! Classification of a request from its head alone: which operation, read
//! or mutation, which body class, who authenticates. [`classify`] is pure
//! and exported so the front routes with the very function the gateway
//! uses: reads may go to a reader pool, mutations go to writers.
//!
//! | request | operation | access | body |
//! |---|---|---|---|
//! | `GET /health` | `Health` | read (no auth) | none |
//! | `POST /` with `X-Amz-Target: AmazonSQS.<Op>` | `sqs.<Op>` | read for `GetQueueUrl`, `ListQueues`, `GetQueueAttributes`, `ListQueueTags`, `ListDeadLetterSourceQueues`, `ListMessageMoveTasks`; mutation for every other operation, **`ReceiveMessage` included** | control |
//! | `GET`/`HEAD` under `/v1/` | per path (`Fetch`, `Offsets`, `DescribeTopic`, …) | read | none |
//! | `POST …/records` | `Produce` | mutation | data |
//! | `POST /v1/groups/<g>/poll` | `Poll` (commit, then fetch) | mutation: it commits | control |
//! | other methods under `/v1/` | per path | mutation | control |
//!
//! Why `ReceiveMessage` (and the native queue `receive`) is a mutation: a
//! receive changes the queue's state — it acquires messages, increments
//! their delivery counts, starts their visibility timeouts, may move them
//! to a dead-letter topic — and that state lives in one place, the writer
//! that owns the partition's lease (it persists each change with the
//! partition's fencing). A reader has a read-only view of the log; a
//! receive served there could not make the delivery exclusive. So the
//! front must send it to the writer pool, like a produce.

use fskv_gateway::{Access, AuthPolicy, BodyClass, Route};
use http::request::Parts;
use http::Method;

/// A native API operation with its path parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeOp {
    Health,
    ListTopics,
    CreateTopic(String),
    DescribeTopic(String),
    UpdateTopic(String),
    DeleteTopic(String),
    ProduceByKey(String),
    Produce(String, u32),
    Fetch(String, u32),
    Offsets(String, u32),
    Takeover(String, u32),
    InitProducer,
    PutQueue(String, String),
    DeleteQueue(String, String),
    QueueStats(String, String),
    Receive(String, String),
    Ack(String, String),
    Nack(String, String),
    ChangeVisibility(String, String),
    ListGroups,
    DescribeGroup(String),
    DeleteGroup(String),
    JoinGroup(String),
    Heartbeat(String),
    LeaveGroup(String),
    CommitOffsets(String),
    /// Commit an offset of a group, then fetch from it (one request).
    Poll(String),
}

impl NativeOp {
    pub fn name(&self) -> &'static str {
        use NativeOp::*;
        match self {
            Health => "Health",
            ListTopics => "ListTopics",
            CreateTopic(_) => "CreateTopic",
            DescribeTopic(_) => "DescribeTopic",
            UpdateTopic(_) => "UpdateTopic",
            DeleteTopic(_) => "DeleteTopic",
            ProduceByKey(_) | Produce(..) => "Produce",
            Fetch(..) => "Fetch",
            Offsets(..) => "Offsets",
            Takeover(..) => "Takeover",
            InitProducer => "InitProducer",
            PutQueue(..) => "PutQueue",
            DeleteQueue(..) => "DeleteQueue",
            QueueStats(..) => "QueueStats",
            Receive(..) => "Receive",
            Ack(..) => "Ack",
            Nack(..) => "Nack",
            ChangeVisibility(..) => "ChangeVisibility",
            ListGroups => "ListGroups",
            DescribeGroup(_) => "DescribeGroup",
            DeleteGroup(_) => "DeleteGroup",
            JoinGroup(_) => "JoinGroup",
            Heartbeat(_) => "Heartbeat",
            LeaveGroup(_) => "LeaveGroup",
            CommitOffsets(_) => "CommitOffsets",
            Poll(_) => "Poll",
        }
    }
}

fn decode(seg: &str) -> String {
    percent_encoding::percent_decode_str(seg).decode_utf8_lossy().into_owned()
}

/// Parses a native API path (method and path; no query).
pub fn parse_native(method: &Method, path: &str) -> Option<NativeOp> {
    use NativeOp::*;
    let segs: Vec<String> = path.trim_start_matches('/').split('/').map(decode).collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let get = method == Method::GET || method == Method::HEAD;
    let part = |p: &str| p.parse::<u32>().ok();
    Some(match (s.as_slice(), method.clone()) {
        (["health"], _) if get => Health,
        (["v1", "topics"], _) if get => ListTopics,
        (["v1", "topics", t], m) => match m {
            _ if get => DescribeTopic(t.to_string()),
            Method::PUT => CreateTopic(t.to_string()),
            Method::PATCH => UpdateTopic(t.to_string()),
            Method::DELETE => DeleteTopic(t.to_string()),
            _ => return None,
        },
        (["v1", "topics", t, "records"], Method::POST) => ProduceByKey(t.to_string()),
        (["v1", "topics", t, "partitions", p, "records"], m) => match m {
            Method::POST => Produce(t.to_string(), part(p)?),
            _ if get => Fetch(t.to_string(), part(p)?),
            _ => return None,
        },
        (["v1", "topics", t, "partitions", p, "offsets"], _) if get => Offsets(t.to_string(), part(p)?),
        (["v1", "topics", t, "partitions", p, "takeover"], Method::POST) => Takeover(t.to_string(), part(p)?),
        (["v1", "producers"], Method::POST) => InitProducer,
        (["v1", "topics", t, "queues", q], m) => match m {
            _ if get => QueueStats(t.to_string(), q.to_string()),
            Method::PUT => PutQueue(t.to_string(), q.to_string()),
            Method::DELETE => DeleteQueue(t.to_string(), q.to_string()),
            _ => return None,
        },
        (["v1", "topics", t, "queues", q, op], Method::POST) => match *op {
            "receive" => Receive(t.to_string(), q.to_string()),
            "ack" => Ack(t.to_string(), q.to_string()),
            "nack" => Nack(t.to_string(), q.to_string()),
            "visibility" => ChangeVisibility(t.to_string(), q.to_string()),
            _ => return None,
        },
        (["v1", "groups"], _) if get => ListGroups,
        (["v1", "groups", g], m) => match m {
            _ if get => DescribeGroup(g.to_string()),
            Method::DELETE => DeleteGroup(g.to_string()),
            _ => return None,
        },
        (["v1", "groups", g, op], Method::POST) => match *op {
            "join" => JoinGroup(g.to_string()),
            "heartbeat" => Heartbeat(g.to_string()),
            "leave" => LeaveGroup(g.to_string()),
            "commit" => CommitOffsets(g.to_string()),
            "poll" => Poll(g.to_string()),
            _ => return None,
        },
        _ => return None,
    })
}

/// SQS operations that only read (everything else mutates).
const SQS_READS: [&str; 6] =
    ["GetQueueUrl", "ListQueues", "GetQueueAttributes", "ListQueueTags", "ListDeadLetterSourceQueues", "ListMessageMoveTasks"];

/// Every SQS operation of the API (the route names are `sqs.<Op>`).
pub const SQS_OPS: [(&str, &str); 23] = [
    ("AddPermission", "sqs.AddPermission"),
    ("CancelMessageMoveTask", "sqs.CancelMessageMoveTask"),
    ("ChangeMessageVisibility", "sqs.ChangeMessageVisibility"),
    ("ChangeMessageVisibilityBatch", "sqs.ChangeMessageVisibilityBatch"),
    ("CreateQueue", "sqs.CreateQueue"),
    ("DeleteMessage", "sqs.DeleteMessage"),
    ("DeleteMessageBatch", "sqs.DeleteMessageBatch"),
    ("DeleteQueue", "sqs.DeleteQueue"),
    ("GetQueueAttributes", "sqs.GetQueueAttributes"),
    ("GetQueueUrl", "sqs.GetQueueUrl"),
    ("ListDeadLetterSourceQueues", "sqs.ListDeadLetterSourceQueues"),
    ("ListMessageMoveTasks", "sqs.ListMessageMoveTasks"),
    ("ListQueueTags", "sqs.ListQueueTags"),
    ("ListQueues", "sqs.ListQueues"),
    ("PurgeQueue", "sqs.PurgeQueue"),
    ("ReceiveMessage", "sqs.ReceiveMessage"),
    ("RemovePermission", "sqs.RemovePermission"),
    ("SendMessage", "sqs.SendMessage"),
    ("SendMessageBatch", "sqs.SendMessageBatch"),
    ("SetQueueAttributes", "sqs.SetQueueAttributes"),
    ("StartMessageMoveTask", "sqs.StartMessageMoveTask"),
    ("TagQueue", "sqs.TagQueue"),
    ("UntagQueue", "sqs.UntagQueue"),
];

/// The SQS operation named by `X-Amz-Target`, if the request is one.
pub fn sqs_target(parts: &Parts) -> Option<&str> {
    let t = parts.headers.get("x-amz-target")?.to_str().ok()?;
    t.strip_prefix("AmazonSQS.")
}

/// The gateway's classification of a request (see the module table).
pub fn classify(parts: &Parts) -> Route {
    let required = |name, access, body| Route { name, access, body, auth: AuthPolicy::Required };
    if let Some(op) = sqs_target(parts) {
        let name = SQS_OPS.iter().find(|(o, _)| *o == op).map_or("sqs.Unknown", |(_, n)| n);
        let access = if SQS_READS.contains(&op) { Access::Read } else { Access::Mutation };
        return required(name, access, BodyClass::Control);
    }
    if parts.method == Method::POST && parts.uri.path() == "/" {
        // The SQS query protocol (form bodies): refused with a clear error.
        // The query protocol (form body) is refused by the handler; as a
        // POST whose operation only the body names, it counts as a mutation.
        return required("sqs.Query", Access::Mutation, BodyClass::Control);
    }
    let get = parts.method == Method::GET || parts.method == Method::HEAD;
    match parse_native(&parts.method, parts.uri.path()) {
        Some(NativeOp::Health) => Route { name: "Health", access: Access::Read, body: BodyClass::Bodiless, auth: AuthPolicy::Open },
        Some(op @ (NativeOp::Produce(..) | NativeOp::ProduceByKey(_))) => required(op.name(), Access::Mutation, BodyClass::Data),
        Some(op) if get => required(op.name(), Access::Read, BodyClass::Bodiless),
        Some(op @ (NativeOp::DeleteTopic(_) | NativeOp::DeleteGroup(_) | NativeOp::DeleteQueue(..))) => {
            required(op.name(), Access::Mutation, BodyClass::Bodiless)
        }
        Some(op) => required(op.name(), Access::Mutation, BodyClass::Control),
        None if get => required("Unknown", Access::Read, BodyClass::Bodiless),
        None => required("Unknown", Access::Mutation, BodyClass::Control),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: Method, uri: &str, target: Option<&str>) -> Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        if let Some(t) = target {
            b = b.header("x-amz-target", t);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn sqs_receive_is_a_mutation_and_reads_are_reads() {
        let r = classify(&parts(Method::POST, "/", Some("AmazonSQS.ReceiveMessage")));
        assert_eq!((r.name, r.access, r.body), ("sqs.ReceiveMessage", Access::Mutation, BodyClass::Control));
        for op in SQS_READS {
            assert_eq!(classify(&parts(Method::POST, "/", Some(&format!("AmazonSQS.{op}")))).access, Access::Read, "{op}");
        }
        for (op, name) in SQS_OPS {
            let r = classify(&parts(Method::POST, "/", Some(&format!("AmazonSQS.{op}"))));
            assert_eq!(r.name, name);
            assert_eq!(r.auth, AuthPolicy::Required);
            assert_eq!(r.access == Access::Read, SQS_READS.contains(&op), "{op}");
        }
        assert_eq!(classify(&parts(Method::POST, "/", Some("AmazonSQS.Nope"))).name, "sqs.Unknown");
        assert_eq!(classify(&parts(Method::POST, "/", None)).name, "sqs.Query");
    }

    #[test]
    fn native_routes() {
        let c = |m: Method, u: &str| {
            let r = classify(&parts(m, u, None));
            (r.name, r.access, r.body)
        };
        assert_eq!(c(Method::GET, "/v1/topics/t/partitions/0/records?offset=5"), ("Fetch", Access::Read, BodyClass::Bodiless));
        assert_eq!(c(Method::POST, "/v1/topics/t/partitions/3/records"), ("Produce", Access::Mutation, BodyClass::Data));
        assert_eq!(c(Method::POST, "/v1/topics/t/records"), ("Produce", Access::Mutation, BodyClass::Data));
        assert_eq!(c(Method::GET, "/v1/topics/t/partitions/0/offsets?at=latest"), ("Offsets", Access::Read, BodyClass::Bodiless));
        assert_eq!(c(Method::PUT, "/v1/topics/t"), ("CreateTopic", Access::Mutation, BodyClass::Control));
        assert_eq!(c(Method::DELETE, "/v1/topics/t"), ("DeleteTopic", Access::Mutation, BodyClass::Bodiless));
        assert_eq!(c(Method::POST, "/v1/topics/t/queues/q/receive"), ("Receive", Access::Mutation, BodyClass::Control));
        assert_eq!(c(Method::GET, "/v1/topics/t/queues/q"), ("QueueStats", Access::Read, BodyClass::Bodiless));
        assert_eq!(c(Method::POST, "/v1/groups/g/commit"), ("CommitOffsets", Access::Mutation, BodyClass::Control));
        assert_eq!(c(Method::POST, "/v1/groups/g/poll"), ("Poll", Access::Mutation, BodyClass::Control));
        assert_eq!(c(Method::GET, "/v1/groups/g"), ("DescribeGroup", Access::Read, BodyClass::Bodiless));
        assert_eq!(c(Method::GET, "/v1/nothing"), ("Unknown", Access::Read, BodyClass::Bodiless));
        assert_eq!(c(Method::POST, "/v1/topics/t/partitions/x/records"), ("Unknown", Access::Mutation, BodyClass::Control));
        let h = classify(&parts(Method::GET, "/health", None));
        assert_eq!(h.auth, AuthPolicy::Open);
        assert_eq!(parse_native(&Method::GET, "/v1/topics/a%2Eb"), Some(NativeOp::DescribeTopic("a.b".into())));
    }
}
