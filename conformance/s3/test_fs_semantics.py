"""Semantics where a filesystem-backed gateway is at risk. The tests marked
fs_only are ours only (AWS and moto accept those keys); the others hold on
any S3 and are run against moto too."""

import os
import xml.etree.ElementTree as ET

import pytest
from botocore.exceptions import ClientError

import s3util
from s3util import http_status


def xml_code(body):
    root = ET.fromstring(body)
    return root.findtext("Code")


# ---------------------------------------------------------------- on any S3

def test_emptied_directories_disappear(s3, bucket):
    keys = ["p/q/r/s.txt", "p/q/t.txt", "p/u.txt", "v/w/x/y/z.txt"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    s3.delete_object(Bucket=bucket, Key="p/q/r/s.txt")
    r = s3.list_objects_v2(Bucket=bucket, Prefix="p/q/", Delimiter="/")
    assert [o["Key"] for o in r.get("Contents", [])] == ["p/q/t.txt"]
    assert r.get("CommonPrefixes", []) == []
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[1:]]})
    for prefix, delim in [("", "/"), ("p/", "/"), ("", "")]:
        r = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter=delim)
        assert r["KeyCount"] == 0, r
        assert r.get("CommonPrefixes", []) == []
    r = s3.list_objects(Bucket=bucket, Delimiter="/")
    assert r.get("CommonPrefixes", []) == [] and r.get("Contents", []) == []


def test_delete_bucket_after_deleting_all(s3):
    name = s3util.unique_bucket("dd")
    s3.create_bucket(Bucket=name)
    try:
        for k in ["a/b/c/d", "a/b/e", "f", "g/h"]:
            s3.put_object(Bucket=name, Key=k, Body=b"1")
        uid = s3.create_multipart_upload(Bucket=name, Key="m/p")["UploadId"]
        s3.upload_part(Bucket=name, Key="m/p", UploadId=uid, PartNumber=1, Body=b"z" * 100)
        s3.abort_multipart_upload(Bucket=name, Key="m/p", UploadId=uid)
        for k in ["a/b/c/d", "a/b/e", "f", "g/h"]:
            s3.delete_object(Bucket=name, Key=k)
        s3.delete_bucket(Bucket=name)
    finally:
        s3util.empty_and_delete(s3, name)
    with pytest.raises(ClientError):
        s3.head_bucket(Bucket=name)


def test_implicit_directory_is_not_an_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="e/x", Body=b"x")
    for k in ("e", "e/"):
        with pytest.raises(ClientError) as e:
            s3.head_object(Bucket=bucket, Key=k)
        assert http_status(e.value) == 404
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=bucket, Key=k)
        assert http_status(e.value) == 404
    # Deleting the implied directory is a no-op and keeps its contents.
    s3.delete_object(Bucket=bucket, Key="e/")
    s3.delete_object(Bucket=bucket, Key="e")
    assert s3.get_object(Bucket=bucket, Key="e/x")["Body"].read() == b"x"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["e/x"]


def test_dir_marker_objects(s3, bucket):
    s3.put_object(Bucket=bucket, Key="d/", Body=b"")
    s3.put_object(Bucket=bucket, Key="d/x", Body=b"1")
    s3.put_object(Bucket=bucket, Key="d/sub/", Body=b"")
    r = s3.list_objects_v2(Bucket=bucket)
    assert [(o["Key"], o["Size"]) for o in r["Contents"]] == [("d/", 0), ("d/sub/", 0), ("d/x", 1)]
    assert r["Contents"][0]["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'
    r = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["d/"]
    r = s3.list_objects_v2(Bucket=bucket, Prefix="d/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["d/", "d/x"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["d/sub/"]
    assert s3.head_object(Bucket=bucket, Key="d/")["ContentLength"] == 0
    s3.delete_object(Bucket=bucket, Key="d/x")
    # The explicit marker stays after its contents are gone.
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["d/", "d/sub/"]
    s3.delete_object(Bucket=bucket, Key="d/sub/")
    s3.delete_object(Bucket=bucket, Key="d/")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_dir_marker_with_metadata(s3, bucket):
    s3.put_object(Bucket=bucket, Key="m/", Body=b"", Metadata={"kind": "folder"})
    s3.put_object(Bucket=bucket, Key="m/child", Body=b"c")
    assert s3.head_object(Bucket=bucket, Key="m/")["Metadata"] == {"kind": "folder"}


# ---------------------------------------------------------------- ours only

@pytest.mark.fs_only
def test_file_then_child_conflicts(raw, s3, bucket):
    s3.put_object(Bucket=bucket, Key="a/b", Body=b"file")
    status, _, body = raw.request("PUT", f"/{bucket}/a/b/c", body=b"child")
    assert status == 409, body
    assert xml_code(body)
    assert s3.get_object(Bucket=bucket, Key="a/b")["Body"].read() == b"file"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["a/b"]


@pytest.mark.fs_only
def test_child_then_file_conflicts(raw, s3, bucket):
    s3.put_object(Bucket=bucket, Key="a/b/c", Body=b"child")
    status, _, body = raw.request("PUT", f"/{bucket}/a/b", body=b"file")
    assert status == 409, body
    assert xml_code(body)
    status, _, body = raw.request("PUT", f"/{bucket}/a", body=b"file")
    assert status == 409, body
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["a/b/c"]


@pytest.mark.fs_only
def test_conflicts_through_copy_and_multipart(s3, bucket):
    s3.put_object(Bucket=bucket, Key="x/y", Body=b"file")
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="x/y/z", CopySource={"Bucket": bucket, "Key": "x/y"})
    assert http_status(e.value) == 409
    try:
        uid = s3.create_multipart_upload(Bucket=bucket, Key="x/y/w")["UploadId"]
    except ClientError as e:
        assert http_status(e) == 409  # refusing at create time is fine too
        return
    et = s3.upload_part(Bucket=bucket, Key="x/y/w", UploadId=uid, PartNumber=1, Body=b"p")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="x/y/w", UploadId=uid,
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": et}]})
    assert http_status(e.value) == 409
    s3.abort_multipart_upload(Bucket=bucket, Key="x/y/w", UploadId=uid)


@pytest.mark.fs_only
def test_conflict_after_delete_is_cleared(s3, bucket):
    s3.put_object(Bucket=bucket, Key="a/b", Body=b"file")
    s3.delete_object(Bucket=bucket, Key="a/b")
    s3.put_object(Bucket=bucket, Key="a/b/c", Body=b"now fine")
    s3.delete_object(Bucket=bucket, Key="a/b/c")
    s3.put_object(Bucket=bucket, Key="a/b", Body=b"fine again")
    assert s3.get_object(Bucket=bucket, Key="a/b")["Body"].read() == b"fine again"


BAD_KEYS = [
    "../evil",
    "a/../../evil",
    "a/../b",
    "..",
    "a/..",
    "a//b",
    "/leading",
    "nul\x00byte",
    "./dot",
    "a/./b",
]


@pytest.mark.fs_only
@pytest.mark.parametrize("key", BAD_KEYS, ids=range(len(BAD_KEYS)))
def test_bad_keys_rejected(raw, s3, bucket, key):
    before = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    status, _, body = raw.request("PUT", f"/{bucket}/{key}", body=b"escape")
    assert status == 400, (status, body)
    assert xml_code(body)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    assert {b["Name"] for b in s3.list_buckets()["Buckets"]} == before
    status, _, body = raw.request("GET", f"/{bucket}/{key}")
    assert status in (400, 404), (status, body)


# ---------------------------------------------------------------- reader role

@pytest.fixture
def reader_raw():
    return s3util.Raw(url=os.environ["S3_READER_ENDPOINT"])


@pytest.mark.reader
def test_reader_serves_reads(s3, bucket):
    s3.put_object(Bucket=bucket, Key="r/k", Body=b"readable")
    rd = s3util.make_client(os.environ["S3_READER_ENDPOINT"])
    assert rd.get_object(Bucket=bucket, Key="r/k")["Body"].read() == b"readable"
    assert [o["Key"] for o in rd.list_objects_v2(Bucket=bucket)["Contents"]] == ["r/k"]
    rd.head_bucket(Bucket=bucket)


@pytest.mark.reader
def test_reader_rejects_mutations(s3, bucket, reader_raw):
    s3.put_object(Bucket=bucket, Key="keep", Body=b"x")
    attempts = [
        ("PUT", f"/{bucket}/new", [], b"data"),
        ("DELETE", f"/{bucket}/keep", [], b""),
        ("PUT", f"/{s3util.unique_bucket('rd')}", [], b""),
        ("DELETE", f"/{bucket}", [], b""),
        ("POST", f"/{bucket}/mpu", [("uploads", "")], b""),
        ("POST", f"/{bucket}", [("delete", "")],
         b"<Delete><Object><Key>keep</Key></Object></Delete>"),
    ]
    for method, path, query, body in attempts:
        status, _, rbody = reader_raw.request(method, path, query=query, body=body)
        assert status in (403, 405), (method, path, status, rbody)
        assert xml_code(rbody), rbody
    assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == b"x"
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="new")
