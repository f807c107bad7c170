"""boto3's SQS client, unchanged, against the MQ gateway's SQS facade; and
differential runs: the same random operation sequences against the gateway
and against moto's SQS (moto_server started here), compared on what both
define (moto's semantics are the reference)."""

import hashlib
import random
import socket
import time
import uuid

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError


def qname(prefix="q"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def make_client(url, ak, sk):
    cfg = botocore.config.Config(retries={"max_attempts": 2, "mode": "standard"}, read_timeout=40)
    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1", aws_access_key_id=ak, aws_secret_access_key=sk, config=cfg)


@pytest.fixture(scope="module")
def sqs(endpoints):
    return make_client(endpoints["sqs"], endpoints["access_key"], endpoints["secret_key"])


@pytest.fixture(scope="module")
def moto_sqs():
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        pytest.skip("SKIPPED: moto[server] is not installed")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield make_client(f"http://127.0.0.1:{port}", "testing", "testing")
    server.stop()


def code(e):
    return e.value.response["Error"]["Code"]


def test_queue_lifecycle_and_attributes(sqs):
    n = qname()
    url = sqs.create_queue(QueueName=n, Attributes={"VisibilityTimeout": "7", "DelaySeconds": "0", "MessageRetentionPeriod": "3600"})["QueueUrl"]
    assert url.endswith("/" + n)
    assert sqs.get_queue_url(QueueName=n)["QueueUrl"] == url
    # Same attributes again: the same URL; different: QueueNameExists.
    assert sqs.create_queue(QueueName=n, Attributes={"VisibilityTimeout": "7"})["QueueUrl"] == url
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=n, Attributes={"VisibilityTimeout": "8"})
    assert code(e) == "QueueAlreadyExists"
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert a["VisibilityTimeout"] == "7" and a["MessageRetentionPeriod"] == "3600"
    assert a["QueueArn"].endswith(":" + n) and a["ApproximateNumberOfMessages"] == "0"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "9"})
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]
    assert a == {"VisibilityTimeout": "9"}
    with pytest.raises(ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "99999"})
    assert code(e) == "InvalidAttributeValue"
    with pytest.raises(ClientError) as e:
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Bogus"])
    assert code(e) == "InvalidAttributeName"
    assert url in sqs.list_queues(QueueNamePrefix=n)["QueueUrls"]
    sqs.tag_queue(QueueUrl=url, Tags={"team": "mq"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "mq"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=n)
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=n)


def test_bad_names_and_limits(sqs):
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="bad name")
    assert code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="x" * 81)
    assert code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=qname() + ".fifo")
    assert code(e) == "InvalidParameterValue"
    url = sqs.create_queue(QueueName=qname())["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x" * ((1 << 20) + 1))
    assert code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(11)])
    assert code(e) == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "m"}, {"Id": "a", "MessageBody": "n"}])
    assert code(e) == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[])
    assert code(e) == "AWS.SimpleQueueService.EmptyBatchRequest"
    with pytest.raises(ClientError) as e:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert code(e) == "ReceiptHandleIsInvalid"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="bad \x01 char")
    assert code(e) == "InvalidMessageContents"
    # A 1 MiB message is accepted.
    sqs.send_message(QueueUrl=url, MessageBody="y" * (1 << 20))
    m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"][0]
    assert len(m["Body"]) == 1 << 20 and m["MD5OfBody"] == hashlib.md5(m["Body"].encode()).hexdigest()


def test_send_receive_delete_visibility(sqs):
    url = sqs.create_queue(QueueName=qname(), Attributes={"VisibilityTimeout": "2"})["QueueUrl"]
    attrs = {"n": {"DataType": "Number", "StringValue": "42"}, "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="hello", MessageAttributes=attrs)
    assert sent["MD5OfMessageBody"] == hashlib.md5(b"hello").hexdigest()
    r = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"], WaitTimeSeconds=1)
    (m,) = r["Messages"]
    assert m["MessageId"] == sent["MessageId"] and m["Body"] == "hello"
    assert m["MessageAttributes"]["n"]["StringValue"] == "42" and m["MessageAttributes"]["b"]["BinaryValue"] == b"\x00\x01"
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    # Visibility expires: received again with count 2; the old handle no longer changes visibility.
    time.sleep(2.3)
    r2 = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["ApproximateReceiveCount"], WaitTimeSeconds=1)["Messages"][0]
    assert r2["Attributes"]["ApproximateReceiveCount"] == "2"
    with pytest.raises(ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=10)
    assert code(e) == "AWS.SimpleQueueService.MessageNotInflight"
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=r2["ReceiptHandle"], VisibilityTimeout=0)
    r3 = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"][0]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=r3["ReceiptHandle"])
    # Deleting with a stale handle succeeds (as SQS).
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    time.sleep(0.2)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)


def test_batches_long_poll_and_purge(sqs):
    url = sqs.create_queue(QueueName=qname())["QueueUrl"]
    r = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(10)])
    assert len(r["Successful"]) == 10 and not r.get("Failed")
    got = []
    for _ in range(5):
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    assert sorted(m["Body"] for m in got) == sorted(f"m{i}" for i in range(10))
    d = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
    assert len(d["Successful"]) == 10
    c = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[{"Id": "x", "ReceiptHandle": "garbage", "VisibilityTimeout": 1}])
    assert c["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    # Long poll: a receive waiting 10 s returns as soon as a message arrives.
    import threading

    def later():
        time.sleep(1.0)
        sqs.send_message(QueueUrl=url, MessageBody="late")

    th = threading.Thread(target=later)
    th.start()
    t0 = time.monotonic()
    r = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)
    el = time.monotonic() - t0
    th.join()
    assert [m["Body"] for m in r["Messages"]] == ["late"] and 0.8 < el < 5, el
    sqs.send_message(QueueUrl=url, MessageBody="to purge")
    sqs.purge_queue(QueueUrl=url)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    with pytest.raises(ClientError) as e:
        sqs.purge_queue(QueueUrl=url)
    assert code(e) == "AWS.SimpleQueueService.PurgeQueueInProgress"


def test_delay_and_dead_letter_queue(sqs):
    dlq = sqs.create_queue(QueueName=qname("dlq"))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    import json

    url = sqs.create_queue(
        QueueName=qname(), Attributes={"VisibilityTimeout": "1", "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2})}
    )["QueueUrl"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for i in range(2):
        m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=3, MessageSystemAttributeNames=["ApproximateReceiveCount"])["Messages"][0]
        assert m["Attributes"]["ApproximateReceiveCount"] == str(i + 1)
        time.sleep(1.2)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    m = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=5)["Messages"][0]
    assert m["Body"] == "poison"
    # Per-message delay.
    sqs.send_message(QueueUrl=url, MessageBody="delayed", DelaySeconds=2)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"])["Attributes"]
    assert a["ApproximateNumberOfMessagesDelayed"] == "1"
    t0 = time.monotonic()
    m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    assert m["Body"] == "delayed" and time.monotonic() - t0 > 0.5


def test_fifo_order_groups_and_dedup(sqs):
    url = sqs.create_queue(QueueName=qname() + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="no group")
    assert code(e) == "MissingParameter"
    ids = []
    for i in range(4):
        ids.append(sqs.send_message(QueueUrl=url, MessageBody=f"a{i}", MessageGroupId="A")["MessageId"])
    dup = sqs.send_message(QueueUrl=url, MessageBody="a0", MessageGroupId="A")  # content-based duplicate
    assert dup["MessageId"] == ids[0]
    sqs.send_message(QueueUrl=url, MessageBody="b0", MessageGroupId="B", MessageDeduplicationId="b0")
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, MessageSystemAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in first] == ["a0", "a1"]
    assert first[0]["Attributes"]["MessageGroupId"] == "A" and "SequenceNumber" in first[0]["Attributes"]
    # Group A is blocked while a0, a1 are in flight; B is served.
    nxt = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in nxt] == ["b0"]
    sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(first)])
    rest = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in rest] == ["a2", "a3"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="A", DelaySeconds=1)
    assert code(e) == "InvalidParameterValue"


def test_unauthenticated_and_wrong_key_refused(endpoints):
    bad = make_client(endpoints["sqs"], endpoints["access_key"], "wrong-secret")
    with pytest.raises(ClientError) as e:
        bad.list_queues()
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_reader_refuses_receive(endpoints):
    """ReceiveMessage mutates queue state: a reader gateway refuses it."""
    reader = make_client(endpoints["mq_reader"], endpoints["access_key"], endpoints["secret_key"])
    w = make_client(endpoints["sqs"], endpoints["access_key"], endpoints["secret_key"])
    url = w.create_queue(QueueName=qname())["QueueUrl"]
    assert reader.get_queue_url(QueueName=url.rsplit("/", 1)[1])["QueueUrl"].endswith(url.rsplit("/", 1)[1])
    with pytest.raises(ClientError) as e:
        reader.receive_message(QueueUrl=url)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


# ---- differential runs against moto


def run_sequence(client, rng, fifo):
    """A random operation sequence; returns an observation log of what is
    deterministic in SQS's semantics (bodies received, errors codes, counts)."""
    name = f"diff-{rng.randrange(1 << 30):08x}" + (".fifo" if fifo else "")
    attrs = {"VisibilityTimeout": "30"}
    if fifo:
        attrs.update({"FifoQueue": "true", "ContentBasedDeduplication": "true"})
    url = client.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
    obs = []
    held = []  # receipt handles of in-flight messages, with bodies
    for step in range(40):
        op = rng.choice(["send", "send", "batch", "receive", "receive", "delete", "vis0", "bad_delete", "bad_receive", "attrs"])
        try:
            if op == "send":
                body = f"m{step}-{rng.randrange(3)}"
                kw = {"MessageGroupId": rng.choice("AB")} if fifo else {}
                client.send_message(QueueUrl=url, MessageBody=body, **kw)
                obs.append(("send", "ok"))
            elif op == "batch":
                n = rng.randrange(1, 4)
                entries = [{"Id": f"i{j}", "MessageBody": f"b{step}-{j}"} for j in range(n)]
                if fifo:
                    for e in entries:
                        e["MessageGroupId"] = "C"
                r = client.send_message_batch(QueueUrl=url, Entries=entries)
                obs.append(("batch", len(r.get("Successful", [])), len(r.get("Failed", []))))
            elif op == "receive":
                r = client.receive_message(QueueUrl=url, MaxNumberOfMessages=rng.randrange(1, 11), MessageSystemAttributeNames=["ApproximateReceiveCount"])
                msgs = r.get("Messages", [])
                held += [(m["ReceiptHandle"], m["Body"]) for m in msgs]
                bodies = [m["Body"] for m in msgs]
                # Standard queues do not promise an order: compare as a multiset.
                obs.append(("receive", bodies if fifo else sorted(bodies), sorted(m["Attributes"]["ApproximateReceiveCount"] for m in msgs)))
            elif op == "delete" and held:
                h, b = held.pop(rng.randrange(len(held)))
                client.delete_message(QueueUrl=url, ReceiptHandle=h)
                obs.append(("delete", b))
            elif op == "vis0" and held:
                h, b = held.pop(rng.randrange(len(held)))
                client.change_message_visibility(QueueUrl=url, ReceiptHandle=h, VisibilityTimeout=0)
                obs.append(("vis0", b))
            elif op == "bad_delete":
                client.delete_message(QueueUrl=url, ReceiptHandle="bogus")
                obs.append(("bad_delete", "ok"))
            elif op == "bad_receive":
                client.receive_message(QueueUrl=url, MaxNumberOfMessages=0)
                obs.append(("bad_receive", "ok"))
            elif op == "attrs":
                a = client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
                obs.append(("attrs", a["Attributes"]["ApproximateNumberOfMessages"], a["Attributes"]["ApproximateNumberOfMessagesNotVisible"]))
        except ClientError as e:
            obs.append((op, "error", e.response["Error"]["Code"]))
    client.delete_queue(QueueUrl=url)
    return obs


@pytest.mark.parametrize("seed", range(6))
def test_differential_against_moto(sqs, moto_sqs, seed):
    fifo = seed % 2 == 1
    ours = run_sequence(sqs, random.Random(seed), fifo)
    theirs = run_sequence(moto_sqs, random.Random(seed), fifo)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"seed {seed} step {i}: gateway {a} != moto {b}\n gateway: {ours[: i + 1]}\n moto: {theirs[: i + 1]}"
    assert len(ours) == len(theirs)


def test_md5_of_message_attributes_matches_moto(sqs, moto_sqs):
    attrs = {
        "s": {"DataType": "String", "StringValue": "héllo"},
        "n": {"DataType": "Number.float", "StringValue": "3.25"},
        "b": {"DataType": "Binary", "BinaryValue": b"\x00\xff\x10"},
        "c": {"DataType": "String.custom", "StringValue": "x"},
    }
    out = []
    for client in (sqs, moto_sqs):
        url = client.create_queue(QueueName=qname("md5"))["QueueUrl"]
        sent = client.send_message(QueueUrl=url, MessageBody="body", MessageAttributes=attrs)
        got = client.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=1)["Messages"][0]
        out.append((sent["MD5OfMessageBody"], sent["MD5OfMessageAttributes"], got["MD5OfMessageAttributes"], got["MessageAttributes"]))
        client.delete_queue(QueueUrl=url)
    assert out[0] == out[1]
