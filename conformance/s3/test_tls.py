"""HTTPS: a gateway started with --tls-cert/--tls-key serves the same
buckets over TLS. Over HTTPS botocore sends its uploads as aws-chunked
bodies with an unsigned payload and a checksum trailer
(STREAMING-UNSIGNED-PAYLOAD-TRAILER) — the way current SDKs upload.

Needs S3_TLS_ENDPOINT (https://127.0.0.1:PORT) and S3_TLS_CA (the PEM file
that signs the gateway's certificate)."""

import hashlib
import os

import boto3
import pytest
from botocore.config import Config

import s3util

URL = os.environ.get("S3_TLS_ENDPOINT", "")
CA = os.environ.get("S3_TLS_CA", "")
pytestmark = pytest.mark.skipif(not (URL and CA), reason="S3_TLS_ENDPOINT / S3_TLS_CA not set (no HTTPS gateway)")


def tls_client(**cfg):
    s3util.check_loopback(URL)
    return boto3.client(
        "s3", endpoint_url=URL, verify=CA,
        aws_access_key_id=s3util.access_key(), aws_secret_access_key=s3util.secret_key(),
        config=Config(region_name=s3util.REGION, signature_version="s3v4", s3={"addressing_style": "path"},
                      retries={"max_attempts": 1, "mode": "standard"}, **cfg))


def test_https_round_trip_with_trailing_checksums(s3, bucket):
    c = tls_client(request_checksum_calculation="when_supported")
    body = os.urandom(3 * 1024 * 1024 + 5)
    r = c.put_object(Bucket=bucket, Key="over/tls.bin", Body=body, ChecksumAlgorithm="CRC32C")
    assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    assert r.get("ChecksumCRC32C")
    got = c.get_object(Bucket=bucket, Key="over/tls.bin", ChecksumMode="ENABLED")
    assert got["Body"].read() == body
    assert got.get("ChecksumCRC32C") == r["ChecksumCRC32C"]
    # The same object through the plain-HTTP gateway: one store behind both.
    assert s3.get_object(Bucket=bucket, Key="over/tls.bin")["Body"].read() == body
    assert "aws-chunked" not in (s3.head_object(Bucket=bucket, Key="over/tls.bin").get("ContentEncoding") or "")


def test_https_multipart_and_listing(s3, bucket):
    c = tls_client()
    uid = c.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    parts = [os.urandom(5 * 1024 * 1024), b"tail"]
    etags = [c.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=i + 1, Body=p)["ETag"] for i, p in enumerate(parts)]
    c.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
    assert [o["Key"] for o in c.list_objects_v2(Bucket=bucket)["Contents"]] == ["mp"]
    assert c.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"".join(parts)


def test_plain_http_to_the_tls_port_is_refused():
    import urllib.request
    with pytest.raises(Exception):
        urllib.request.urlopen(URL.replace("https://", "http://") + "/", timeout=5).read()
