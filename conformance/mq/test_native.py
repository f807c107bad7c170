"""The MQ gateway's native API against a running `fskv up` (MQ_ENDPOINTS names
its endpoints.json). Every test uses its own topic names."""

import contextlib
import os
import socket
import subprocess
import threading
import time
import urllib.request
import uuid

import pytest

from mqclient import MqClient, MqError


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def values(recs):
    return [r["value"] for r in recs]


def test_produce_fetch_order_per_partition(mq, mq_reader):
    t = name("order")
    mq.create_topic(t, partitions=3)
    sent = {p: [] for p in range(3)}
    for i in range(30):
        p = i % 3
        v = f"m{i}".encode()
        r = mq.produce(t, p, [v])
        assert r["base_offset"] == len(sent[p])
        sent[p].append(v)
    for p in range(3):
        for client in (mq, mq_reader):
            hdr, recs = client.fetch(t, p, 0)
            assert values(recs) == sent[p]
            assert [r["offset"] for r in recs] == list(range(10))
            assert hdr["high_watermark"] == 10
    # Keyed produce: one key always lands on one partition, in order.
    r = mq.produce(t, None, [{"value": f"k{i}", "key": "same-key"} for i in range(5)])
    parts = set(r["partitions"])
    assert len(parts) == 1
    p = parts.pop()
    _, recs = mq.fetch(t, p, 10)
    assert values(recs) == [f"k{i}".encode() for i in range(5)]
    assert recs[0]["key"] == b"same-key"


def _rpc_metric(addr, name, label=""):
    """The sum of a counter on an RPC port's /metrics (meta, storage)."""
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_consumer_with_a_backlog_reads_on_without_a_meta_or_storage_call_per_fetch(mq, mq_reader, endpoints):
    # A reader keeps a partition state for 50 ms and a 64 KiB read-ahead
    # window per segment (gateway-mq/src/log.rs): one-record fetches over a
    # backlog must return every record in order across segment ends, cost far
    # fewer than one metadata lookup and one storage read each, and a fetch
    # at the high watermark must still see a record produced just before it.
    t = name("backlog")
    mq.create_topic(t, segment_bytes=32 << 10)
    sent = [f"b{i}-".encode() + b"v" * (300 + 7 * (i % 50)) for i in range(400)]
    for v in sent:
        mq.produce(t, 0, [v])
    hdr, got = mq_reader.fetch(t, 0, 0, max_bytes=1)
    meta, storage = endpoints["meta"], endpoints["storage"]

    def counts():
        lookups = _rpc_metric(meta, "fskv_meta_ops_total", 'op="lookup"')
        reads = sum(_rpc_metric(s, "fskv_rpc_requests_total", 'method="storage.BatchRead"') for s in storage)
        return lookups, reads

    lookups0, reads0 = counts()
    fetches = 0
    while hdr["next_offset"] < len(sent):
        hdr, recs = mq_reader.fetch(t, 0, hdr["next_offset"], max_bytes=1)
        assert len(recs) == 1
        got += recs
        fetches += 1
    lookups1, reads1 = counts()
    assert values(got) == sent
    assert [r["offset"] for r in got] == list(range(len(sent)))
    assert lookups1 - lookups0 < fetches / 2, (lookups1 - lookups0, fetches)
    assert reads1 - reads0 < fetches / 4, (reads1 - reads0, fetches)
    # At the high watermark the state is read afresh: a new record shows at once.
    mq.produce(t, 0, [b"tail"])
    hdr, recs = mq_reader.fetch(t, 0, len(sent))
    assert values(recs) == [b"tail"] and hdr["high_watermark"] == len(sent) + 1


def test_fetch_max_bytes_and_offsets_out_of_range(mq):
    t = name("maxb")
    mq.create_topic(t)
    for i in range(20):
        mq.produce(t, 0, [b"x" * 1000])
    hdr, recs = mq.fetch(t, 0, 0, max_bytes=2500)
    assert 1 <= len(recs) < 20
    assert hdr["next_offset"] == recs[-1]["offset"] + 1
    # Continue from next_offset to the end.
    got = len(recs)
    off = hdr["next_offset"]
    while off < 20:
        hdr, recs = mq.fetch(t, 0, off, max_bytes=2500)
        assert recs and recs[0]["offset"] == off
        got += len(recs)
        off = hdr["next_offset"]
    assert got == 20
    with pytest.raises(MqError) as e:
        mq.fetch(t, 0, 0, max_bytes=0)
    assert e.value.status == 400
    with pytest.raises(MqError) as e:
        mq.fetch(t, 7, 0)
    assert e.value.status == 404


def test_bad_input_gets_4xx(mq):
    t = name("bad")
    with pytest.raises(MqError) as e:
        mq.create_topic(t, partitions=0)
    assert e.value.status == 400
    with pytest.raises(MqError) as e:
        mq.create_topic("bad%20name%21")
    assert 400 <= e.value.status < 500
    mq.create_topic(t)
    with pytest.raises(MqError) as e:
        mq.create_topic(t)
    assert e.value.status == 409
    r = mq.request("POST", f"/v1/topics/{t}/partitions/0/records", b"garbage", content_type="application/octet-stream", expect=None)
    assert r.status_code == 400 and b"error" in r.content
    r = mq.request("PUT", f"/v1/topics/{name('j')}", b"{not json", expect=None)
    assert r.status_code == 400
    with pytest.raises(MqError) as e:
        mq.fetch(name("missing"), 0, 0)
    assert e.value.status == 404
    # Unauthenticated requests are refused.
    import requests

    r = requests.get(mq.endpoint + f"/v1/topics/{t}", timeout=10)
    assert r.status_code in (401, 403)


def test_idempotent_producer_retry_written_once(mq):
    t = name("idem")
    mq.create_topic(t)
    pid = mq.init_producer()
    p, ep = pid["producer_id"], pid["producer_epoch"]
    r1 = mq.produce(t, 0, [b"a", b"b"], producer_id=p, epoch=ep, base_sequence=0)
    r2 = mq.produce(t, 0, [b"a", b"b"], producer_id=p, epoch=ep, base_sequence=0)  # a retry
    assert r1["base_offset"] == r2["base_offset"] == 0
    assert r2["duplicate"] is True
    r3 = mq.produce(t, 0, [b"c"], producer_id=p, epoch=ep, base_sequence=2)
    assert r3["base_offset"] == 2
    with pytest.raises(MqError) as e:  # a gap in the sequence
        mq.produce(t, 0, [b"e"], producer_id=p, epoch=ep, base_sequence=9)
    assert e.value.status == 409
    _, recs = mq.fetch(t, 0, 0)
    assert values(recs) == [b"a", b"b", b"c"]


def test_long_poll_wakes_on_produce(mq, mq_reader):
    t = name("poll")
    mq.create_topic(t)
    for client in (mq, mq_reader):
        hdr, _ = client.fetch(t, 0, "latest")
        start_off = hdr["high_watermark"]
        out = {}

        def waiter():
            t0 = time.monotonic()
            out["res"] = client.fetch(t, 0, start_off, wait_ms=10_000)
            out["elapsed"] = time.monotonic() - t0

        th = threading.Thread(target=waiter)
        th.start()
        time.sleep(0.5)
        mq.produce(t, 0, [b"wake"])
        th.join(15)
        assert not th.is_alive()
        assert values(out["res"][1]) == [b"wake"]
        assert 0.3 < out["elapsed"] < 5.0, out["elapsed"]
    # Nothing produced: the wait ends at wait_ms with no records.
    t0 = time.monotonic()
    _, recs = mq_reader.fetch(t, 0, 2, wait_ms=600)
    assert recs == [] and 0.5 < time.monotonic() - t0 < 5.0


def test_offsets_by_time_and_earliest_latest(mq):
    t = name("time")
    mq.create_topic(t)
    mq.produce(t, 0, [{"value": "old", "timestamp_ms": 1_000_000}])
    mq.produce(t, 0, [{"value": "mid", "timestamp_ms": 2_000_000}])
    mq.produce(t, 0, [{"value": "new", "timestamp_ms": 3_000_000}])
    assert mq.offsets(t, 0, timestamp=1_500_000)["offset"] == 1
    assert mq.offsets(t, 0, timestamp=0)["offset"] == 0
    assert mq.offsets(t, 0, timestamp=9_000_000)["offset"] == 3
    assert mq.offsets(t, 0, at="earliest")["offset"] == 0
    assert mq.offsets(t, 0, at="latest")["offset"] == 3


def test_retention_drops_whole_old_segments(mq):
    t = name("ret")
    mq.create_topic(t, segment_bytes=4096, retention_bytes=8192)
    for i in range(40):
        mq.produce(t, 0, [b"r" * 1000])
    deadline = time.time() + 20
    while time.time() < deadline:
        start = mq.offsets(t, 0, at="earliest")["offset"]
        if start > 0:
            break
        time.sleep(0.5)
    assert start > 0, "no segment was dropped"
    # Retention runs in the background: the log start may move again between
    # reading it and fetching from it (OffsetOutOfRange), as for any
    # consumer; re-read it then, a bounded number of times.
    for _ in range(20):
        try:
            hdr, recs = mq.fetch(t, 0, start)
            break
        except MqError as e:
            assert e.code == "OffsetOutOfRange", e.body
            start = mq.offsets(t, 0, at="earliest")["offset"]
            time.sleep(0.2)
    else:
        raise AssertionError("the log start kept moving for 20 fetches")
    # A fetch never skips silently past dropped records: it starts exactly at
    # the offset asked for (or fails OffsetOutOfRange, retried above).
    assert recs[0]["offset"] == start and hdr["high_watermark"] == 40
    r = mq.request("GET", f"/v1/topics/{t}/partitions/0/records", params={"offset": 0}, expect=None)
    assert r.status_code == 416 or (r.status_code == 200), r.content


def test_group_rebalance_and_generation_fencing(mq):
    t = name("grp")
    g = name("g")
    mq.create_topic(t, partitions=4)
    a = mq.join(g, [t], member_id="a", session_timeout_ms=2000)
    assert len(a["assignment"]) == 4
    gen1 = a["generation"]
    mq.commit(g, [{"topic": t, "partition": 0, "offset": 5}], member_id="a", generation=gen1)
    b = mq.join(g, [t], member_id="b", session_timeout_ms=30_000)
    assert b["generation"] > gen1
    a2 = mq.heartbeat(g, "a")
    assert a2["generation"] == b["generation"]
    pa = {(x["topic"], x["partition"]) for x in a2["assignment"]}
    pb = {(x["topic"], x["partition"]) for x in b["assignment"]}
    assert len(pa) == 2 and len(pb) == 2 and not (pa & pb)
    # A consumer of the old generation cannot commit.
    with pytest.raises(MqError) as e:
        mq.commit(g, [{"topic": t, "partition": 0, "offset": 9}], member_id="a", generation=gen1)
    assert e.value.status == 409
    # a stops heartbeating: after its session timeout b gets everything.
    deadline = time.time() + 10
    while time.time() < deadline:
        b2 = mq.heartbeat(g, "b")
        if len(b2["assignment"]) == 4:
            break
        time.sleep(0.3)
    assert len(b2["assignment"]) == 4
    desc = mq.describe_group(g)
    offs = {(o["topic"], o["partition"]): o["offset"] for o in desc["offsets"]}
    assert offs[(t, 0)] == 5
    mq.leave(g, "b")


def test_queue_visibility_ack_nack_delay_dlq(mq):
    t = name("q")
    dlq = name("dlq")
    mq.create_topic(t)
    mq.create_topic(dlq)
    mq.put_queue(t, "work", visibility_ms=1000, max_deliveries=2, dead_letter_topic=dlq)
    mq.produce(t, 0, [b"one", b"two"])
    got = mq.receive(t, "work", max_messages=10)
    assert sorted(m["value"] for m in got) == ["b25l", "dHdv"]  # base64 of one, two
    assert all(m["delivery_count"] == 1 for m in got)
    assert mq.receive(t, "work", max_messages=10) == []  # in flight
    one = [m for m in got if m["value"] == "b25l"][0]
    two = [m for m in got if m["value"] == "dHdv"][0]
    res = mq.ack(t, "work", [one["receipt"]])
    assert res[0]["ok"]
    res = mq.nack(t, "work", [two["receipt"]], delay_ms=0)
    assert res[0]["ok"]
    again = mq.receive(t, "work", max_messages=10)
    assert [m["value"] for m in again] == ["dHdv"] and again[0]["delivery_count"] == 2
    # Let visibility expire: the third receive moves it to the dead-letter topic.
    time.sleep(1.3)
    assert mq.receive(t, "work", max_messages=10, wait_ms=500) == []
    deadline = time.time() + 10
    while time.time() < deadline:
        _, recs = mq.fetch(dlq, 0, 0)
        if recs:
            break
        time.sleep(0.2)
    assert values(recs) == [b"two"]
    # Bad receipts are reported per entry.
    res = mq.ack(t, "work", ["nonsense"])
    assert res[0]["ok"] is False
    # Delayed delivery.
    mq.produce(t, 0, [{"value": "later", "headers": {"fskv-delay-ms": "1500"}}])
    assert mq.receive(t, "work") == []
    t0 = time.monotonic()
    got = mq.receive(t, "work", wait_ms=5000)
    assert [m["value"] for m in got] == ["bGF0ZXI="] and time.monotonic() - t0 > 0.5


def test_fifo_groups_and_dedup(mq):
    t = name("fifo")
    mq.create_topic(t, fifo=True)
    mq.put_queue(t, "q", visibility_ms=5000)
    recs = [
        {"value": "a1", "headers": {"fskv-group": "A", "fskv-dedup-id": "d1"}},
        {"value": "a2", "headers": {"fskv-group": "A", "fskv-dedup-id": "d2"}},
        {"value": "b1", "headers": {"fskv-group": "B", "fskv-dedup-id": "d3"}},
    ]
    mq.produce(t, 0, recs)
    r = mq.produce(t, 0, [{"value": "a1-again", "headers": {"fskv-group": "A", "fskv-dedup-id": "d1"}}])
    assert r.get("deduplicated") == [True] and r["offsets"] == [0]
    _, log = mq.fetch(t, 0, 0)
    assert values(log) == [b"a1", b"a2", b"b1"]
    first = mq.receive(t, "q", max_messages=1)
    assert [m["value"] for m in first] == ["YTE="]  # a1
    # Group A is blocked while a1 is in flight; B is not.
    nxt = mq.receive(t, "q", max_messages=10)
    assert [m["value"] for m in nxt] == ["YjE="]
    mq.ack(t, "q", [first[0]["receipt"]])
    nxt = mq.receive(t, "q", max_messages=10)
    assert [m["value"] for m in nxt] == ["YTI="]


def test_poll_commits_then_fetches_in_one_request(mq, mq_reader):
    t = name("poll")
    g = name("pg")
    mq.create_topic(t, partitions=2)
    sent = [f"p{i}".encode() for i in range(30)]
    for v in sent:
        mq.produce(t, 1, [v])
    # A consumer polling one record at a time: each poll commits what the
    # previous one returned and fetches the next.
    got, off = [], 0
    while off < len(sent):
        hdr, recs = mq.poll(g, t, 1, off, max_bytes=1)
        assert recs and recs[0]["offset"] == off
        got += recs
        off = hdr["next_offset"]
        offs = {(o["topic"], o["partition"]): o["offset"] for o in mq.describe_group(g)["offsets"]}
        assert offs[(t, 1)] == recs[0]["offset"]
    assert values(got) == sent
    # At the end: the last commit, nothing to fetch; a long poll wakes on a produce.
    hdr, recs = mq.poll(g, t, 1, off)
    assert recs == [] and hdr["high_watermark"] == len(sent)
    threading.Timer(0.3, lambda: mq.produce(t, 1, [b"late"])).start()
    t0 = time.time()
    hdr, recs = mq.poll(g, t, 1, off, wait_ms=5000)
    assert values(recs) == [b"late"] and time.time() - t0 < 4
    offs = {(o["topic"], o["partition"]): o["offset"] for o in mq.describe_group(g)["offsets"]}
    assert offs[(t, 1)] == len(sent)
    # An offset past the end is refused before anything is committed.
    with pytest.raises(MqError) as e:
        mq.poll(g, t, 1, len(sent) + 5)
    assert e.value.status == 416 and e.value.code == "OffsetOutOfRange"
    offs = {(o["topic"], o["partition"]): o["offset"] for o in mq.describe_group(g)["offsets"]}
    assert offs[(t, 1)] == len(sent)
    # A member of an old generation is fenced: 409, no records, the offset stays.
    a = mq.join(g, [t], member_id="a", session_timeout_ms=30_000)
    mq.join(g, [t], member_id="b", session_timeout_ms=30_000)
    with pytest.raises(MqError) as e:
        mq.poll(g, t, 1, off + 1, member_id="a", generation=a["generation"])
    assert e.value.status == 409
    offs = {(o["topic"], o["partition"]): o["offset"] for o in mq.describe_group(g)["offsets"]}
    assert offs[(t, 1)] == len(sent)
    # Bad input: 4xx with a code, nothing committed.
    for body, status in [({"topic": t, "partition": 1}, 400), ({"topic": t, "offset": 1}, 400),
                         ({"topic": t, "partition": 9, "offset": 0}, 404), ({"topic": t, "partition": 1, "offset": 0, "max_bytes": 0}, 400),
                         ({"partition": 1, "offset": 0}, 400), ({"topic": t, "partition": 1, "offset": 0, "member_id": "a"}, 400)]:
        r = mq.request("POST", f"/v1/groups/{g}/poll", body, expect=None)
        assert r.status_code == status, (body, r.status_code, r.content)
        assert r.json()["error"]["code"], r.content
    # It commits: the read-only port refuses it, as it refuses a commit.
    with pytest.raises(MqError) as e:
        mq_reader.poll(g, t, 1, 0)
    assert e.value.status == 403 and e.value.code == "ReadOnlyGateway", e.value.body
    mq.leave(g, "a")
    mq.leave(g, "b")


def test_writer_fencing_by_takeover(mq):
    """A forced takeover bumps the partition's epoch; appends continue at the
    next offset, nothing acknowledged is lost."""
    t = name("fence")
    mq.create_topic(t)
    mq.produce(t, 0, [b"before"])
    e1 = mq.describe_topic(t)["partition_states"][0]["epoch"]
    r = mq.json("POST", f"/v1/topics/{t}/partitions/0/takeover", {}, params={"force": "true"})
    assert r["epoch"] > e1
    mq.produce(t, 0, [b"after"])
    _, recs = mq.fetch(t, 0, 0)
    assert values(recs) == [b"before", b"after"]


def test_concurrent_commits_to_one_group_all_land(mq):
    """Commits of many consumers of one group at once (group commit in the
    gateway): every one succeeds and every offset is stored."""
    t = name("cc")
    g = name("g")
    mq.create_topic(t, partitions=16)
    from concurrent.futures import ThreadPoolExecutor

    def commit(p):
        c = MqClient(mq.endpoint, mq.creds.access_key, mq.creds.secret_key)
        for off in range(1, 6):
            c.commit(g, [{"topic": t, "partition": p, "offset": off * 10 + p}])
        return p

    with ThreadPoolExecutor(16) as ex:
        assert sorted(ex.map(commit, range(16))) == list(range(16))
    offs = {o["partition"]: o["offset"] for o in mq.describe_group(g)["offsets"] if o["topic"] == t}
    assert offs == {p: 50 + p for p in range(16)}


@contextlib.contextmanager
def second_writer_gateway(mq, endpoints, writer_id):
    """A second MQ writer gateway process on the same cluster (not behind
    the front), as an MqClient; skipped without MQ_FSKV_BIN."""
    binary = os.environ.get("MQ_FSKV_BIN")
    if not binary:
        pytest.skip("SKIPPED: MQ_FSKV_BIN (the fskv binary) is not set")
    creds = os.path.join(os.path.dirname(os.environ["MQ_ENDPOINTS"]), "credentials.json")
    # The cluster's RPC key (fskv up made it in its data directory): a
    # gateway without it is refused by mgmtd, meta and storage.
    key = os.path.join(os.path.dirname(os.environ["MQ_ENDPOINTS"]), "cluster.key")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen(
        [binary, "gateway", "mq", "--role", "writer", "--listen", f"127.0.0.1:{port}", "--mgmtd", endpoints["mgmtd"],
         "--credentials", creds, "--writer-id", writer_id, "--cluster-key-file", key],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "FSKV_LOG": "warn"})
    try:
        line = p.stdout.readline().decode()
        assert "serving on" in line, line
        yield MqClient(f"http://127.0.0.1:{port}", mq.creds.access_key, mq.creds.secret_key)
    finally:
        p.terminate()
        p.wait(30)


def test_second_writer_gateway_fences_the_first(mq, endpoints):
    """A second writer gateway (another writer id) forces a takeover of a
    partition: the first can no longer append to it (it answers 421/503
    naming the owner, never acknowledges), and the log holds exactly what
    was acknowledged by either."""
    with second_writer_gateway(mq, endpoints, "second-writer") as second:
        t = name("fence2")
        mq.create_topic(t)
        mq.produce(t, 0, [b"first-1"])
        # Without force the live lease of the first writer is respected.
        with pytest.raises(MqError) as e:
            second.produce(t, 0, [b"refused"])
        assert e.value.status == 421 and e.value.code == "NotPartitionWriter"
        second.json("POST", f"/v1/topics/{t}/partitions/0/takeover", {}, params={"force": "true"})
        second.produce(t, 0, [b"second-1"])
        # The first writer is fenced: its appends are refused, not acknowledged.
        for _ in range(2):
            with pytest.raises(MqError) as e:
                mq.produce(t, 0, [b"from-fenced-writer"])
            assert e.value.status in (421, 503), e.value
        second.produce(t, 0, [b"second-2"])
        _, recs = second.fetch(t, 0, 0)
        assert values(recs) == [b"first-1", b"second-1", b"second-2"]
        assert mq.describe_topic(t)["partition_states"][0]["writer"] == "second-writer"


def test_commits_through_two_writer_gateways_keep_each_other(mq, endpoints):
    """Each writer process keeps the group file it last wrote and commits
    on it without reading it again; when another process changed the file
    meanwhile, its compare-and-swap fails and it commits on a fresh read:
    no commit made elsewhere is lost."""
    with second_writer_gateway(mq, endpoints, "commit-writer") as second:
        t = name("c2w")
        g = name("g2w")
        mq.create_topic(t, partitions=2)
        mq.commit(g, [{"topic": t, "partition": 0, "offset": 5}])
        mq.commit(g, [{"topic": t, "partition": 0, "offset": 6}])
        second.commit(g, [{"topic": t, "partition": 1, "offset": 7}])
        # The front's writer last wrote the file before the second changed it.
        mq.commit(g, [{"topic": t, "partition": 0, "offset": 8}])
        second.commit(g, [{"topic": t, "partition": 1, "offset": 9}])
        mq.commit(g, [{"topic": t, "partition": 0, "offset": 10}])
        offs = {o["partition"]: o["offset"] for o in mq.describe_group(g)["offsets"] if o["topic"] == t}
        assert offs == {0: 10, 1: 9}
        # A group deleted elsewhere: the next commit here makes it anew.
        second.json("DELETE", f"/v1/groups/{g}")
        mq.commit(g, [{"topic": t, "partition": 0, "offset": 11}])
        offs = {o["partition"]: o["offset"] for o in mq.describe_group(g)["offsets"] if o["topic"] == t}
        assert offs == {0: 11}
        # A member that joined elsewhere heartbeats and commits here: the
        # copy this process kept does not know it yet, and must not refuse
        # it (an unknown member, from stale state).
        g2 = name("g2w")
        a = mq.join(g2, [t], member_id="a", session_timeout_ms=30_000)
        mq.commit(g2, [{"topic": t, "partition": 0, "offset": 1}], member_id="a", generation=a["generation"])
        b = second.join(g2, [t], member_id="b", session_timeout_ms=30_000)
        assert b["generation"] > a["generation"]
        assert mq.heartbeat(g2, "b")["generation"] == b["generation"]
        mq.commit(g2, [{"topic": t, "partition": 1, "offset": 2}], member_id="b", generation=b["generation"])
        # And a refusal that the file itself gives still stands.
        with pytest.raises(MqError) as e:
            mq.commit(g2, [{"topic": t, "partition": 0, "offset": 3}], member_id="a", generation=a["generation"])
        assert e.value.status == 409
        offs = {o["partition"]: o["offset"] for o in mq.describe_group(g2)["offsets"] if o["topic"] == t}
        assert offs == {0: 1, 1: 2}
