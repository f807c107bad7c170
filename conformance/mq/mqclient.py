"""A small client of the MQ gateway's native API (docs/mq.md): SigV4-signed
requests (botocore's signer, service "mq"), the binary produce format and
the binary fetch response. Used by the conformance tests and the bench."""

import json
import struct
import urllib.parse

import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

PRODUCE_MAGIC = b"FMQ1"
FETCH_MAGIC = b"FMQF"
BATCH_HEADER = 56


class MqError(Exception):
    def __init__(self, status, body):
        self.status = status
        self.body = body
        try:
            err = json.loads(body).get("error", {})
        except ValueError:
            err = {}
        self.code = err.get("code") if isinstance(err, dict) else None
        super().__init__(f"HTTP {status}: {body[:300]!r}")


def encode_record(value, key=None, headers=None, timestamp_ms=-1):
    if isinstance(value, str):
        value = value.encode()
    if isinstance(key, str):
        key = key.encode()
    body = struct.pack("<qI", timestamp_ms, 0)
    body += struct.pack("<i", -1) if key is None else struct.pack("<i", len(key)) + key
    body += struct.pack("<I", len(value)) + value
    headers = headers or {}
    body += struct.pack("<H", len(headers))
    for name, v in headers.items():
        n = name.encode()
        v = v.encode() if isinstance(v, str) else v
        body += struct.pack("<H", len(n)) + n + struct.pack("<I", len(v)) + v
    return struct.pack("<I", len(body)) + body


def encode_produce(records, producer_id=-1, epoch=0, base_sequence=0):
    """records: list of dicts {value, key?, headers?, timestamp_ms?} or bytes/str values."""
    out = [PRODUCE_MAGIC, struct.pack("<Iqhhiq", len(records), producer_id, epoch, 0, base_sequence, 0)]
    for r in records:
        if isinstance(r, dict):
            out.append(encode_record(r["value"], r.get("key"), r.get("headers"), r.get("timestamp_ms", -1)))
        else:
            out.append(encode_record(r))
    return b"".join(out)


def decode_fetch(body):
    """Returns (header dict, list of records {offset, timestamp_ms, key, value, headers})."""
    if len(body) < 40 or body[:4] != FETCH_MAGIC:
        raise ValueError("not a fetch response")
    hw, log_start, next_offset = struct.unpack_from("<QQQ", body, 8)
    pos = 40
    records = []
    while pos + 12 <= len(body):
        base_offset, batch_len = struct.unpack_from("<QI", body, pos)
        end = pos + 12 + batch_len
        count = struct.unpack_from("<I", body, pos + 20)[0]
        rp = pos + BATCH_HEADER
        for _ in range(count):
            (rlen,) = struct.unpack_from("<I", body, rp)
            ts, delta, klen = struct.unpack_from("<qIi", body, rp + 4)
            p = rp + 20
            key = None
            if klen >= 0:
                key = body[p : p + klen]
                p += klen
            (vlen,) = struct.unpack_from("<I", body, p)
            value = body[p + 4 : p + 4 + vlen]
            p += 4 + vlen
            (hc,) = struct.unpack_from("<H", body, p)
            p += 2
            hdrs = {}
            for _ in range(hc):
                (nl,) = struct.unpack_from("<H", body, p)
                name = body[p + 2 : p + 2 + nl].decode()
                p += 2 + nl
                (vl,) = struct.unpack_from("<I", body, p)
                hdrs[name] = body[p + 4 : p + 4 + vl]
                p += 4 + vl
            records.append({"offset": base_offset + delta, "timestamp_ms": ts, "key": key, "value": value, "headers": hdrs})
            rp += 4 + rlen
        pos = end
    return {"high_watermark": hw, "log_start_offset": log_start, "next_offset": next_offset}, records


class MqClient:
    def __init__(self, endpoint, access_key, secret_key, region="us-east-1", timeout=60):
        self.endpoint = endpoint.rstrip("/")
        self.creds = Credentials(access_key, secret_key)
        self.region = region
        self.session = requests.Session()
        self.timeout = timeout

    def request(self, method, path, body=b"", params=None, content_type="application/json", expect=(200, 201)):
        url = self.endpoint + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        req = AWSRequest(method=method, url=url, data=body, headers={"Content-Type": content_type} if body else {})
        SigV4Auth(self.creds, "mq", self.region).add_auth(req)
        r = self.session.request(method, url, data=body, headers=dict(req.headers.items()), timeout=self.timeout)
        if expect is not None and r.status_code not in expect:
            raise MqError(r.status_code, r.content)
        return r

    def json(self, method, path, body=b"", params=None):
        return self.request(method, path, body, params).json()

    # topics
    def create_topic(self, name, **cfg):
        return self.json("PUT", f"/v1/topics/{name}", cfg)

    def describe_topic(self, name):
        return self.json("GET", f"/v1/topics/{name}")

    def delete_topic(self, name):
        return self.json("DELETE", f"/v1/topics/{name}")

    def list_topics(self):
        return self.json("GET", "/v1/topics")["topics"]

    # records
    def produce(self, topic, partition, records, producer_id=-1, epoch=0, base_sequence=0):
        body = encode_produce(records, producer_id, epoch, base_sequence)
        path = f"/v1/topics/{topic}/records" if partition is None else f"/v1/topics/{topic}/partitions/{partition}/records"
        return self.request("POST", path, body, content_type="application/vnd.fskv.mq.batch").json()

    def fetch(self, topic, partition, offset, max_bytes=None, wait_ms=None):
        params = {"offset": offset}
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        if wait_ms is not None:
            params["wait_ms"] = wait_ms
        r = self.request("GET", f"/v1/topics/{topic}/partitions/{partition}/records", params=params)
        return decode_fetch(r.content)

    def offsets(self, topic, partition, **params):
        return self.json("GET", f"/v1/topics/{topic}/partitions/{partition}/offsets", params=params)

    def init_producer(self):
        return self.json("POST", "/v1/producers", {})

    # groups
    def join(self, group, topics, member_id=None, session_timeout_ms=None):
        b = {"topics": topics}
        if member_id:
            b["member_id"] = member_id
        if session_timeout_ms:
            b["session_timeout_ms"] = session_timeout_ms
        return self.json("POST", f"/v1/groups/{group}/join", b)

    def heartbeat(self, group, member_id):
        return self.json("POST", f"/v1/groups/{group}/heartbeat", {"member_id": member_id})

    def leave(self, group, member_id):
        return self.json("POST", f"/v1/groups/{group}/leave", {"member_id": member_id})

    def commit(self, group, offsets, member_id=None, generation=None):
        b = {"offsets": offsets}
        if member_id is not None:
            b["member_id"] = member_id
            b["generation"] = generation
        return self.json("POST", f"/v1/groups/{group}/commit", b)

    def poll(self, group, topic, partition, offset, member_id=None, generation=None, max_bytes=None, wait_ms=None):
        """Commits `offset` for the group, then fetches from it (one request)."""
        b = {"topic": topic, "partition": partition, "offset": offset}
        if member_id is not None:
            b["member_id"] = member_id
            b["generation"] = generation
        if max_bytes is not None:
            b["max_bytes"] = max_bytes
        if wait_ms is not None:
            b["wait_ms"] = wait_ms
        r = self.request("POST", f"/v1/groups/{group}/poll", b)
        return decode_fetch(r.content)

    def describe_group(self, group):
        return self.json("GET", f"/v1/groups/{group}")

    # queues
    def put_queue(self, topic, queue, **cfg):
        return self.json("PUT", f"/v1/topics/{topic}/queues/{queue}", cfg)

    def receive(self, topic, queue, **b):
        return self.json("POST", f"/v1/topics/{topic}/queues/{queue}/receive", b)["messages"]

    def ack(self, topic, queue, receipts):
        return self.json("POST", f"/v1/topics/{topic}/queues/{queue}/ack", {"receipts": receipts})["results"]

    def nack(self, topic, queue, receipts, delay_ms=0):
        return self.json("POST", f"/v1/topics/{topic}/queues/{queue}/nack", {"receipts": receipts, "delay_ms": delay_ms})["results"]

    def queue_stats(self, topic, queue):
        return self.json("GET", f"/v1/topics/{topic}/queues/{queue}")
