"""Issue 19 features with real clients: GetObjectAttributes, CORS (config,
a browser-style preflight and presigned upload with `requests`),
virtual-hosted-style addressing (boto3 `addressing_style: virtual`), and
lifecycle configurations. Compared with the reference (moto) where moto
implements the operation; the cases moto does not implement are marked
`moto_gap` (and listed in README.md).
"""

import base64
import os
import socket
import urllib.parse
import zlib

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

import s3util
from s3util import error_code, http_status, md5_hex

MiB = 1024 * 1024
REF = os.environ.get("S3_REFERENCE_ENDPOINT", "")
ORIGIN = "https://app.example.com"


def reference():
    if not REF:
        pytest.skip("no reference endpoint (run.sh --reference moto)")
    s3util.check_loopback(REF)
    return s3util.make_client(REF)


def outcome(fn):
    """(status, error code) of a call; (200, None) when it succeeds."""
    try:
        r = fn()
        return (r.get("ResponseMetadata", {}).get("HTTPStatusCode", 200), None)
    except ClientError as e:
        return (http_status(e), error_code(e))


def crc32_b64(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


# ------------------------------------------------------ GetObjectAttributes

ALL_ATTRS = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]


def test_object_attributes_of_a_single_put(s3, bucket):
    data = b"attributes of a plain object"
    s3.put_object(Bucket=bucket, Key="plain", Body=data, ChecksumAlgorithm="CRC32")
    r = s3.get_object_attributes(Bucket=bucket, Key="plain", ObjectAttributes=ALL_ATTRS)
    assert r["ETag"] == md5_hex(data)
    assert r["ObjectSize"] == len(data)
    assert r["StorageClass"] == "STANDARD"
    assert r["Checksum"]["ChecksumCRC32"] == crc32_b64(data)
    assert "ObjectParts" not in r
    assert "LastModified" in r
    only = s3.get_object_attributes(Bucket=bucket, Key="plain", ObjectAttributes=["ObjectSize"])
    assert only["ObjectSize"] == len(data) and "ETag" not in only and "StorageClass" not in only


def test_object_attributes_against_reference(s3, bucket):
    ref = reference()
    rb = s3util.unique_bucket("attr")
    ref.create_bucket(Bucket=rb)
    try:
        data = os.urandom(3000)
        results = []
        for c, b in ((s3, bucket), (ref, rb)):
            c.put_object(Bucket=b, Key="k", Body=data)
            r = c.get_object_attributes(Bucket=b, Key="k", ObjectAttributes=["ETag", "ObjectSize", "StorageClass"])
            missing = outcome(lambda: c.get_object_attributes(Bucket=b, Key="nope", ObjectAttributes=["ETag"]))
            nobucket = outcome(lambda: c.get_object_attributes(Bucket=b + "-x", Key="k", ObjectAttributes=["ETag"]))
            results.append((r["ETag"], r["ObjectSize"], r["StorageClass"], missing, nobucket))
        assert results[0] == results[1]
        assert results[0][3] == (404, "NoSuchKey")
    finally:
        s3util.empty_and_delete(ref, rb)


@pytest.mark.moto_gap
def test_object_attributes_pages_the_parts_of_a_multipart_object(s3, bucket):
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1234)]
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp", ChecksumAlgorithm="CRC32")
    done = []
    for i, p in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up["UploadId"], PartNumber=i, Body=p, ChecksumAlgorithm="CRC32")
        done.append({"PartNumber": i, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
    c = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"], MultipartUpload={"Parts": done})
    r = s3.get_object_attributes(Bucket=bucket, Key="mp", ObjectAttributes=ALL_ATTRS)
    assert r["ETag"] == c["ETag"].strip('"')
    assert r["ObjectSize"] == sum(len(p) for p in parts)
    op = r["ObjectParts"]
    assert op["TotalPartsCount"] == 3 and op["IsTruncated"] is False
    assert [(p["PartNumber"], p["Size"], p["ChecksumCRC32"]) for p in op["Parts"]] == \
        [(i, len(p), crc32_b64(p)) for i, p in enumerate(parts, 1)]
    seen, marker = [], 0
    for _ in range(5):
        page = s3.get_object_attributes(Bucket=bucket, Key="mp", ObjectAttributes=["ObjectParts"],
                                        MaxParts=1, PartNumberMarker=marker)["ObjectParts"]
        assert page["MaxParts"] == 1 and page["PartNumberMarker"] == marker
        seen += [p["PartNumber"] for p in page["Parts"]]
        if not page["IsTruncated"]:
            break
        marker = page["NextPartNumberMarker"]
    assert seen == [1, 2, 3]


@pytest.mark.moto_gap
def test_object_attributes_rejects_unknown_names(s3, raw, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    status, _, body = raw.request("GET", f"/{bucket}/k", query=[("attributes", "")],
                                  headers={"x-amz-object-attributes": "ETag,Colour"})
    assert status == 400 and b"InvalidArgument" in body


# ------------------------------------------------------------------- CORS

RULES = [
    {"ID": "uploads", "AllowedOrigins": [ORIGIN, "https://*.example.org"], "AllowedMethods": ["PUT", "GET", "HEAD"],
     "AllowedHeaders": ["content-type", "x-amz-*"], "ExposeHeaders": ["ETag", "x-amz-request-id"], "MaxAgeSeconds": 600},
    {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]},
]


def test_cors_configuration_round_trip(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_bucket_cors(Bucket=bucket)
    assert (http_status(e.value), error_code(e.value)) == (404, "NoSuchCORSConfiguration")
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": RULES})
    got = s3.get_bucket_cors(Bucket=bucket)["CORSRules"]
    assert got == RULES
    s3.delete_bucket_cors(Bucket=bucket)
    with pytest.raises(ClientError):
        s3.get_bucket_cors(Bucket=bucket)
    s3.delete_bucket_cors(Bucket=bucket)  # deleting nothing succeeds


def cors_cases():
    rule = {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}
    return {
        "ok": [rule],
        "bad-method": [{"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}],
        "too-many-rules": [rule] * 101,
    }


def test_cors_validation_against_reference(s3, bucket):
    ref = reference()
    rb = s3util.unique_bucket("cors")
    ref.create_bucket(Bucket=rb)
    try:
        for name, rules in cors_cases().items():
            ours = outcome(lambda: s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": rules}))
            theirs = outcome(lambda: ref.put_bucket_cors(Bucket=rb, CORSConfiguration={"CORSRules": rules}))
            assert ours == theirs, name
        # A refused PUT leaves the stored rules as they were (moto empties them first).
        if s3util.target_kind() not in ("moto", "moto-auth"):
            assert s3.get_bucket_cors(Bucket=bucket)["CORSRules"] == cors_cases()["ok"]
    finally:
        s3util.empty_and_delete(ref, rb)


@pytest.mark.moto_gap
def test_cors_validation_beyond_reference(s3, bucket):
    # Checked by AWS, not by moto.
    cases = [
        {"AllowedOrigins": ["https://*.*.example.com"], "AllowedMethods": ["GET"]},
        {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"], "AllowedHeaders": ["x-*-*"]},
        {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"], "ExposeHeaders": ["*"]},
    ]
    for rule in cases:
        assert outcome(lambda: s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [rule]})) == \
            (400, "InvalidRequest"), rule


def preflight(url, origin=ORIGIN, method="PUT", headers="content-type"):
    h = {}
    if origin:
        h["Origin"] = origin
    if method:
        h["Access-Control-Request-Method"] = method
    if headers:
        h["Access-Control-Request-Headers"] = headers
    return requests.options(url, headers=h, timeout=30)


@pytest.mark.moto_gap
def test_browser_preflight_and_presigned_upload(s3, bucket):
    key = "uploads/photo.jpg"
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key, "ContentType": "image/jpeg"},
                                    ExpiresIn=600)
    # No CORS configuration: refused as AWS does.
    r = preflight(url)
    assert r.status_code == 403 and b"AccessForbidden" in r.content
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": RULES})
    # The browser's preflight (unauthenticated, no body).
    r = preflight(url, headers="Content-Type")
    assert r.status_code == 200, r.content
    assert r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert r.headers["Access-Control-Allow-Methods"] == "PUT, GET, HEAD"
    assert r.headers["Access-Control-Allow-Headers"] == "content-type"
    assert r.headers["Access-Control-Max-Age"] == "600"
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    assert "Origin" in r.headers["Vary"]
    # The upload itself, as a browser sends it (Origin, the signed content type).
    body = os.urandom(70_000)
    r = requests.put(url, data=body, headers={"Origin": ORIGIN, "Content-Type": "image/jpeg"}, timeout=30)
    assert r.status_code == 200, r.content
    assert r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert r.headers["Access-Control-Expose-Headers"] == "ETag, x-amz-request-id"
    assert r.headers["ETag"] == f'"{md5_hex(body)}"'
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    # A GET from another origin matches the second rule (any origin, GET only).
    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=600)
    r = requests.get(get_url, headers={"Origin": "https://elsewhere.test"}, timeout=30)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in r.headers
    # Wildcard origin of the first rule.
    assert preflight(url, origin="https://cdn.example.org").status_code == 200
    # Refusals: an origin no rule allows, a method, a header; no Origin at all.
    for args in ({"origin": "https://evil.test"}, {"method": "DELETE"}, {"headers": "authorization"}):
        r = preflight(url, **args)
        assert r.status_code == 403 and b"AccessForbidden" in r.content, args
    r = preflight(url, origin=None)
    assert r.status_code == 400
    # A request without Origin gets no CORS headers.
    r = requests.get(get_url, timeout=30)
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    # No such bucket.
    r = preflight(url.replace(bucket, bucket + "-none", 1))
    assert r.status_code == 403
    # Deleted configuration: refused again.
    s3.delete_bucket_cors(Bucket=bucket)
    assert preflight(url).status_code == 403


@pytest.mark.moto_gap
def test_preflight_body_is_not_read(s3, bucket):
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": RULES})
    url = f"{s3util.endpoint()}/{bucket}/k"
    # A (pointless) body on a preflight: answered from the head, as the shared layer bounds it.
    r = requests.options(url, data=b"x" * 1000, timeout=30,
                         headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == ORIGIN


# ------------------------------------------------- virtual-hosted style

@pytest.fixture
def localhost_resolves(monkeypatch):
    """*.localhost → 127.0.0.1 in this process (RFC 6761; glibc does not
    resolve subdomains of localhost, browsers and systemd-resolved do)."""
    real = socket.getaddrinfo

    def fake(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


@pytest.mark.moto_gap
def test_virtual_hosted_style_with_boto3(s3, bucket, localhost_resolves):
    ep = urllib.parse.urlsplit(s3util.endpoint())
    if ep.hostname not in ("127.0.0.1", "localhost"):
        pytest.skip("SKIPPED: virtual-hosted style needs the endpoint on localhost")
    url = f"{ep.scheme}://localhost:{ep.port}"
    sent_hosts = []
    v = s3util.make_client(url, s3={"addressing_style": "virtual"})
    v.meta.events.register("before-send.s3", lambda request, **kw: sent_hosts.append(urllib.parse.urlsplit(request.url).netloc))
    data = os.urandom(10_000)
    v.put_object(Bucket=bucket, Key="dir/vhost.bin", Body=data)
    assert sent_hosts[-1] == f"{bucket}.localhost:{ep.port}", "boto3 sent a virtual-hosted request"
    assert v.get_object(Bucket=bucket, Key="dir/vhost.bin")["Body"].read() == data
    assert v.head_object(Bucket=bucket, Key="dir/vhost.bin")["ContentLength"] == len(data)
    keys = [o["Key"] for o in v.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["dir/vhost.bin"]
    # Path style sees the same object.
    assert s3.get_object(Bucket=bucket, Key="dir/vhost.bin")["Body"].read() == data
    # Multipart and tagging through virtual-hosted requests.
    up = v.create_multipart_upload(Bucket=bucket, Key="mp")
    p = v.upload_part(Bucket=bucket, Key="mp", UploadId=up["UploadId"], PartNumber=1, Body=b"part")
    v.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"],
                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p["ETag"]}]})
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"part"
    v.put_object_tagging(Bucket=bucket, Key="mp", Tagging={"TagSet": [{"Key": "a", "Value": "b"}]})
    assert s3.get_object_tagging(Bucket=bucket, Key="mp")["TagSet"] == [{"Key": "a", "Value": "b"}]
    # A presigned virtual-hosted URL verifies too (the Host is signed).
    purl = v.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "mp"}, ExpiresIn=300)
    assert urllib.parse.urlsplit(purl).hostname == f"{bucket}.localhost"
    r = requests.get(purl.replace(f"{bucket}.localhost", "127.0.0.1", 1), headers={"Host": f"{bucket}.localhost:{ep.port}"},
                     timeout=30)
    assert r.status_code == 200 and r.content == b"part"
    # A wrong secret still fails: the signature is checked on the virtual host.
    bad = boto3.client("s3", endpoint_url=url, aws_access_key_id=s3util.access_key(), aws_secret_access_key="wrong-secret",
                       config=Config(region_name=s3util.REGION, signature_version="s3v4", s3={"addressing_style": "virtual"},
                                     retries={"max_attempts": 1, "mode": "standard"}))
    with pytest.raises(ClientError) as e:
        bad.get_object(Bucket=bucket, Key="mp")
    assert http_status(e.value) == 403
    # Delete through the virtual host.
    v.delete_object(Bucket=bucket, Key="mp")
    v.delete_object(Bucket=bucket, Key="dir/vhost.bin")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


@pytest.mark.moto_gap
def test_virtual_hosted_bucket_operations(s3, localhost_resolves):
    ep = urllib.parse.urlsplit(s3util.endpoint())
    if ep.hostname not in ("127.0.0.1", "localhost"):
        pytest.skip("SKIPPED: virtual-hosted style needs the endpoint on localhost")
    v = s3util.make_client(f"{ep.scheme}://localhost:{ep.port}", s3={"addressing_style": "virtual"})
    name = s3util.unique_bucket("vh")
    v.create_bucket(Bucket=name)
    try:
        assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
        v.head_bucket(Bucket=name)
        v.put_bucket_cors(Bucket=name, CORSConfiguration={"CORSRules": RULES[1:]})
        assert v.get_bucket_cors(Bucket=name)["CORSRules"] == RULES[1:]
    finally:
        v.delete_bucket(Bucket=name)
    with pytest.raises(ClientError):
        s3.head_bucket(Bucket=name)


# -------------------------------------------------------------- lifecycle

LIFECYCLE = [
    {"ID": "tmp", "Status": "Enabled", "Filter": {"Prefix": "tmp/"}, "Expiration": {"Days": 7}},
    {"ID": "tagged", "Status": "Disabled",
     "Filter": {"And": {"Prefix": "logs/", "Tags": [{"Key": "class", "Value": "scratch"}]}}, "Expiration": {"Days": 30}},
    {"ID": "uploads", "Status": "Enabled", "Filter": {"Prefix": ""}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2}},
]


def test_lifecycle_configuration_round_trip(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_bucket_lifecycle_configuration(Bucket=bucket)
    assert (http_status(e.value), error_code(e.value)) == (404, "NoSuchLifecycleConfiguration")
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": LIFECYCLE})
    got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert got == LIFECYCLE
    s3.delete_bucket_lifecycle(Bucket=bucket)
    with pytest.raises(ClientError):
        s3.get_bucket_lifecycle_configuration(Bucket=bucket)


LC_OK = {"ID": "a", "Status": "Enabled", "Filter": {"Prefix": "x/"}, "Expiration": {"Days": 1}}


def test_lifecycle_against_reference(s3, bucket):
    ref = reference()
    rb = s3util.unique_bucket("lc")
    ref.create_bucket(Bucket=rb)
    try:
        results = []
        for c, b in ((s3, bucket), (ref, rb)):
            missing = outcome(lambda: c.get_bucket_lifecycle_configuration(Bucket=b))
            put = outcome(lambda: c.put_bucket_lifecycle_configuration(Bucket=b, LifecycleConfiguration={"Rules": LIFECYCLE}))
            got = c.get_bucket_lifecycle_configuration(Bucket=b)["Rules"]
            c.delete_bucket_lifecycle(Bucket=b)
            gone = outcome(lambda: c.get_bucket_lifecycle_configuration(Bucket=b))
            results.append((missing, put, got, gone))
        assert results[0] == results[1]
    finally:
        s3util.empty_and_delete(ref, rb)


@pytest.mark.moto_gap
def test_lifecycle_validation_as_aws(s3, bucket):
    # moto accepts both (no check of Days or of duplicate IDs).
    cases = {
        "zero-days": [dict(LC_OK, Expiration={"Days": 0})],
        "duplicate-id": [LC_OK, dict(LC_OK)],
    }
    for name, rules in cases.items():
        assert outcome(lambda: s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})) == \
            (400, "InvalidArgument"), name
    assert outcome(lambda: s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [LC_OK]}))[0] == 200


@pytest.mark.moto_gap
def test_lifecycle_versions_rules_round_trip_and_transitions_are_refused(s3, bucket):
    rule = {"ID": "nc", "Status": "Enabled", "Filter": {"Prefix": ""},
            "NoncurrentVersionExpiration": {"NoncurrentDays": 3, "NewerNoncurrentVersions": 2}}
    marker = {"ID": "dm", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"ExpiredObjectDeleteMarker": True}}
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [rule, marker]})
    got = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
    assert got["nc"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 3, "NewerNoncurrentVersions": 2}
    assert got["dm"]["Expiration"] == {"ExpiredObjectDeleteMarker": True}
    transition = {"ID": "t", "Status": "Enabled", "Filter": {"Prefix": ""},
                  "NoncurrentVersionTransitions": [{"NoncurrentDays": 3, "StorageClass": "GLACIER"}]}
    assert outcome(lambda: s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [transition]})) == \
        (501, "NotImplemented")
    tagged_abort = {"ID": "t", "Status": "Enabled", "Filter": {"Tag": {"Key": "k", "Value": "v"}},
                    "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}
    assert outcome(lambda: s3.put_bucket_lifecycle_configuration(Bucket=bucket,
                                                                 LifecycleConfiguration={"Rules": [tagged_abort]}))[0] == 400
