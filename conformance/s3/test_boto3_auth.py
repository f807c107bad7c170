"""Authentication: presigned GET/PUT (SigV4 query), bad and missing
signatures (403 with S3 error XML), and a check of the harness's own SigV4
signer against botocore's, so the raw-request tests are trustworthy."""

import datetime
import hashlib
import os
import urllib.parse
import xml.etree.ElementTree as ET

import pytest
import requests
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

import s3util


def error_xml_code(body):
    root = ET.fromstring(body)
    assert root.tag.endswith("Error"), body
    code = root.find("Code")
    assert code is not None and code.text, body
    return code.text


def test_presigned_get(s3, bucket):
    data = os.urandom(5000)
    key = "pre signed/\u00e9+%.bin"
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)
    assert "X-Amz-Signature=" in url and "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url
    r = requests.get(url, timeout=30)
    assert r.status_code == 200, r.text
    assert r.content == data
    r = requests.get(url, headers={"Range": "bytes=0-99"}, timeout=30)
    assert r.status_code == 206
    assert r.content == data[:100]


def test_presigned_head(s3, bucket):
    s3.put_object(Bucket=bucket, Key="h", Body=b"12345")
    url = s3.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": "h"}, ExpiresIn=300)
    r = requests.head(url, timeout=30)
    assert r.status_code == 200
    assert r.headers["Content-Length"] == "5"


def test_presigned_put(s3, bucket):
    data = os.urandom(7000)
    key = "upload via url"
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)
    r = requests.put(url, data=data, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers.get("ETag") == '"%s"' % hashlib.md5(data).hexdigest()
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def test_presigned_put_with_content_type(s3, bucket):
    url = s3.generate_presigned_url("put_object", ExpiresIn=300, Params={
        "Bucket": bucket, "Key": "typed", "ContentType": "text/plain"})
    r = requests.put(url, data=b"hi", headers={"Content-Type": "text/plain"}, timeout=30)
    assert r.status_code == 200, r.text
    assert s3.head_object(Bucket=bucket, Key="typed")["ContentType"] == "text/plain"


@pytest.mark.moto_gap
def test_presigned_tampered_signature(s3, bucket):
    # moto does not verify signatures.
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=300)
    sig = url.split("X-Amz-Signature=")[1][:64]
    bad = url.replace(sig, ("0" if sig[0] != "0" else "1") + sig[1:])
    r = requests.get(bad, timeout=30)
    assert r.status_code == 403
    assert error_xml_code(r.content) == "SignatureDoesNotMatch"


@pytest.mark.moto_gap
def test_presigned_expired(s3, bucket):
    # moto does not check X-Amz-Expires.
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    raw = s3util.Raw()
    when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=2)
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    scope = f"{amz_date[:8]}/{s3util.REGION}/s3/aws4_request"
    q = {
        "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": f"{s3util.access_key()}/{scope}",
        "X-Amz-Date": amz_date, "X-Amz-Expires": "60", "X-Amz-SignedHeaders": "host",
    }
    path = f"/{bucket}/k"
    canon_q = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                       for k, v in sorted(q.items()))
    canon = "\n".join(["GET", path, canon_q, f"host:{raw.hostport}\n", "host", "UNSIGNED-PAYLOAD"])
    sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canon.encode()).hexdigest()])
    import hmac
    key = s3util._signing_key(s3util.secret_key(), amz_date[:8])
    q["X-Amz-Signature"] = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
    status, _, body = raw.send("GET", path, list(q.items()), {"host": raw.hostport}, b"")
    assert status == 403, body
    assert error_xml_code(body) == "AccessDenied"


@pytest.mark.auth_proof
@pytest.mark.moto_gap
def test_wrong_secret_key(bucket):
    # moto does not verify signatures.
    bad = s3util.Raw(sk="definitely-not-the-secret")
    status, _, body = bad.request("GET", f"/{bucket}", query=[("list-type", "2")])
    assert status == 403, body
    assert error_xml_code(body) == "SignatureDoesNotMatch"
    status, _, body = bad.request("PUT", f"/{bucket}/should-not-exist", body=b"x")
    assert status == 403
    assert error_xml_code(body) == "SignatureDoesNotMatch"


@pytest.mark.auth_proof
@pytest.mark.moto_gap
def test_unknown_access_key(bucket):
    bad = s3util.Raw(ak="AKIDNOSUCHKEY0000000")
    status, _, body = bad.request("GET", f"/{bucket}")
    assert status == 403, body
    assert error_xml_code(body) in ("InvalidAccessKeyId", "SignatureDoesNotMatch")


@pytest.mark.moto_gap
def test_anonymous_request_denied(bucket, s3):
    s3.put_object(Bucket=bucket, Key="private", Body=b"x")
    raw = s3util.Raw()
    status, _, body = raw.request("GET", f"/{bucket}/private", sign=False, headers={"host": raw.hostport})
    assert status == 403, body
    assert error_xml_code(body) == "AccessDenied"
    status, _, body = raw.request("PUT", f"/{bucket}/anon", body=b"x", sign=False,
                                  headers={"host": raw.hostport})
    assert status == 403
    with pytest.raises(Exception):
        s3.head_object(Bucket=bucket, Key="anon")


@pytest.mark.auth_proof
def test_error_body_is_s3_xml(raw, bucket):
    status, hdrs, body = raw.request("GET", f"/{bucket}/no such key")
    assert status == 404
    assert error_xml_code(body) == "NoSuchKey"
    status, hdrs, body = raw.request("GET", f"/{s3util.unique_bucket('none')}", query=[("list-type", "2")])
    assert status == 404
    assert error_xml_code(body) == "NoSuchBucket"


# ---------------------------------------------------------------- harness self-check

@pytest.mark.parametrize("method,path,query,body", [
    ("GET", "/bkt", [("list-type", "2"), ("prefix", "a b/\u00e9+%"), ("delimiter", "/")], b""),
    ("PUT", "/bkt/key with space/caf\u00e9+%25~", [], b"data"),
    ("DELETE", "/bkt/k", [], b""),
    ("POST", "/bkt", [("delete", "")], b"<Delete/>"),
])
def test_harness_signer_matches_botocore(method, path, query, body):
    """The raw signer must produce exactly botocore's SigV4 signature."""
    ph = hashlib.sha256(body).hexdigest()
    qs = urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
    url = "http://127.0.0.1:9" + urllib.parse.quote(path, safe="/-_.~") + ("?" + qs if qs else "")
    req = AWSRequest(method=method, url=url, data=body, headers={
        "x-amz-meta-a": "1", "x-amz-content-sha256": ph})
    S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret/EXAMPLE+key"), "s3", s3util.REGION).add_auth(req)
    theirs = req.headers["Authorization"]
    when = datetime.datetime.strptime(req.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.timezone.utc)
    raw = s3util.Raw(url="http://127.0.0.1:9", ak="AKIDEXAMPLE", sk="secret/EXAMPLE+key")
    headers = {"x-amz-meta-a": "1"}
    raw.sign(method, path, query, headers, ph, when=when)
    assert headers["Authorization"] == theirs


def test_harness_chunk_signer_matches_aws_example():
    """The streaming chunk signatures of the example in AWS's SigV4 streaming
    documentation (64 KiB + 1 KiB of 'a', 2013-05-24, examplebucket)."""
    raw = s3util.Raw(url="http://127.0.0.1:9", ak="AKIAIOSFODNN7EXAMPLE",
                     sk="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    raw.hostport = "s3.amazonaws.com"
    captured = {}

    def fake_send(method, path, query, headers, body):
        captured["headers"], captured["body"] = headers, body
        return 200, {}, b""

    raw.send = fake_send
    when = datetime.datetime(2013, 5, 24, 0, 0, 0, tzinfo=datetime.timezone.utc)
    orig_sign = raw.sign
    raw.sign = lambda *a, **k: orig_sign(*a, when=when)
    raw.put_chunked_signed("/examplebucket/chunkObject.txt", b"a" * 66560, chunk=65536,
                           extra_headers={"x-amz-storage-class": "REDUCED_REDUNDANCY"})
    h, body = captured["headers"], captured["body"]
    assert h["content-length"] == "66824"
    assert h["Authorization"].endswith(
        "Signature=4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9")
    sigs = [line.split(b"chunk-signature=")[1] for line in body.split(b"\r\n") if b"chunk-signature=" in line]
    assert sigs == [
        b"ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
        b"0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
        b"b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
    ]
