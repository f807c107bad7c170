"""Object operations through boto3: put/get/head/delete, multi-delete, copy,
range GET, user metadata, conditional requests, tagging, odd keys."""

import datetime
import hashlib
import os

import pytest
from botocore.exceptions import ClientError

import s3util
from s3util import error_code, http_status

ODD_KEYS = [
    "plain",
    "with space",
    "dir/sub dir/file name.txt",
    "caf\u00e9/\u65e5\u672c\u8a9e/\U0001F600.bin",
    "percent%20literal%",
    "plus+sign+",
    "tilde~and=equals&amp",
    "semi;colon,comma'quote\"",
    "brackets[1]{2}(3)",
    "star*question?hash#",
    "x" * 200 + "/" + "y" * 200 + "/" + "z" * 200 + "/" + "w" * 200 + "/" + "v" * 190,
]


def etag_of(data):
    return '"%s"' % hashlib.md5(data).hexdigest()


@pytest.mark.auth_proof
@pytest.mark.parametrize("key", ODD_KEYS, ids=range(len(ODD_KEYS)))
def test_put_get_head_delete_odd_keys(s3, bucket, key):
    data = os.urandom(1000) + key.encode()
    r = s3.put_object(Bucket=bucket, Key=key, Body=data)
    assert r["ETag"] == etag_of(data)
    g = s3.get_object(Bucket=bucket, Key=key)
    assert g["Body"].read() == data
    assert g["ETag"] == etag_of(data)
    assert g["ContentLength"] == len(data)
    h = s3.head_object(Bucket=bucket, Key=key)
    assert h["ContentLength"] == len(data)
    assert h["ETag"] == etag_of(data)
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [(key, len(data), etag_of(data))]
    s3.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    assert http_status(e.value) == 404
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_empty_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    g = s3.get_object(Bucket=bucket, Key="empty")
    assert g["Body"].read() == b""
    assert g["ETag"] == etag_of(b"")


def test_overwrite_is_whole(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"a" * 5000)
    s3.put_object(Bucket=bucket, Key="k", Body=b"bb")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"bb"


def test_metadata_and_content_type(s3, bucket):
    s3.put_object(Bucket=bucket, Key="m", Body=b"hello", ContentType="text/x-conf",
                  Metadata={"color": "blue", "n": "42"}, CacheControl="no-cache",
                  ContentDisposition="attachment; filename=x.txt")
    h = s3.head_object(Bucket=bucket, Key="m")
    assert h["ContentType"] == "text/x-conf"
    assert h["Metadata"] == {"color": "blue", "n": "42"}
    assert h["CacheControl"] == "no-cache"
    assert h["ContentDisposition"] == "attachment; filename=x.txt"
    assert isinstance(h["LastModified"], datetime.datetime)


def test_get_missing_key(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="nope")
    assert error_code(e.value) == "NoSuchKey"
    assert http_status(e.value) == 404


def test_delete_missing_key_is_204(s3, bucket):
    r = s3.delete_object(Bucket=bucket, Key="never-existed")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204


@pytest.mark.auth_proof
@pytest.mark.parametrize("rng,expect", [
    ("bytes=0-9", (0, 10)),
    ("bytes=10-19", (10, 20)),
    ("bytes=990-", (990, 1000)),
    ("bytes=-7", (993, 1000)),
    ("bytes=995-5000", (995, 1000)),
])
def test_range_get(s3, bucket, rng, expect):
    data = bytes(range(256)) * 3 + os.urandom(232)
    s3.put_object(Bucket=bucket, Key="r", Body=data)
    g = s3.get_object(Bucket=bucket, Key="r", Range=rng)
    assert g["ResponseMetadata"]["HTTPStatusCode"] == 206
    lo, hi = expect
    assert g["Body"].read() == data[lo:hi]
    assert g["ContentRange"] == f"bytes {lo}-{hi - 1}/{len(data)}"
    assert g["ContentLength"] == hi - lo


def test_range_not_satisfiable(s3, bucket):
    s3.put_object(Bucket=bucket, Key="r", Body=b"0123456789")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", Range="bytes=100-200")
    assert http_status(e.value) == 416
    assert error_code(e.value) == "InvalidRange"


def test_delete_objects(s3, bucket):
    keys = [f"d/{i:03d} k+%" for i in range(30)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    r = s3.delete_objects(Bucket=bucket, Delete={
        "Objects": [{"Key": k} for k in keys[:20]] + [{"Key": "d/missing"}]})
    deleted = sorted(d["Key"] for d in r.get("Deleted", []))
    assert deleted == sorted(keys[:20] + ["d/missing"])
    assert not r.get("Errors")
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert left == s3util.s3_sort(keys[20:])
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[20:]]})
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


@pytest.mark.moto_gap
def test_delete_objects_quiet(s3, bucket):
    # moto lists every deleted key even in quiet mode.
    for k in ("q1", "q2"):
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    r = s3.delete_objects(Bucket=bucket, Delete={
        "Objects": [{"Key": "q1"}, {"Key": "q2"}], "Quiet": True})
    assert not r.get("Deleted") and not r.get("Errors")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_copy_object(s3, bucket):
    data = os.urandom(3000)
    s3.put_object(Bucket=bucket, Key="src key+%", Body=data, ContentType="a/b",
                  Metadata={"m": "1"})
    r = s3.copy_object(Bucket=bucket, Key="dst/key \u00e9",
                       CopySource={"Bucket": bucket, "Key": "src key+%"})
    assert r["CopyObjectResult"]["ETag"] == etag_of(data)
    g = s3.get_object(Bucket=bucket, Key="dst/key \u00e9")
    assert g["Body"].read() == data
    assert g["Metadata"] == {"m": "1"}
    assert g["ContentType"] == "a/b"
    # REPLACE directive replaces metadata.
    s3.copy_object(Bucket=bucket, Key="dst2", CopySource={"Bucket": bucket, "Key": "src key+%"},
                   MetadataDirective="REPLACE", Metadata={"z": "9"}, ContentType="c/d")
    h = s3.head_object(Bucket=bucket, Key="dst2")
    assert h["Metadata"] == {"z": "9"}
    assert h["ContentType"] == "c/d"


def test_copy_across_buckets(s3, bucket):
    other = s3util.unique_bucket("cp")
    s3.create_bucket(Bucket=other)
    try:
        s3.put_object(Bucket=bucket, Key="a", Body=b"payload")
        s3.copy_object(Bucket=other, Key="b", CopySource={"Bucket": bucket, "Key": "a"})
        assert s3.get_object(Bucket=other, Key="b")["Body"].read() == b"payload"
    finally:
        s3util.empty_and_delete(s3, other)


def test_copy_missing_source(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="b", CopySource={"Bucket": bucket, "Key": "none"})
    assert error_code(e.value) == "NoSuchKey"
    assert http_status(e.value) == 404


def test_copy_onto_itself_replace(s3, bucket):
    s3.put_object(Bucket=bucket, Key="self", Body=b"same", Metadata={"a": "1"})
    s3.copy_object(Bucket=bucket, Key="self", CopySource={"Bucket": bucket, "Key": "self"},
                   MetadataDirective="REPLACE", Metadata={"a": "2"})
    g = s3.get_object(Bucket=bucket, Key="self")
    assert g["Body"].read() == b"same"
    assert g["Metadata"] == {"a": "2"}


# ---------------------------------------------------------------- conditional

@pytest.fixture
def cond_obj(s3, bucket):
    r = s3.put_object(Bucket=bucket, Key="c", Body=b"conditional")
    h = s3.head_object(Bucket=bucket, Key="c")
    return bucket, r["ETag"], h["LastModified"]


def test_if_match(s3, cond_obj):
    bucket, etag, _ = cond_obj
    assert s3.get_object(Bucket=bucket, Key="c", IfMatch=etag)["Body"].read() == b"conditional"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert http_status(e.value) == 412
    assert error_code(e.value) == "PreconditionFailed"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="c", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert http_status(e.value) == 412


def test_if_none_match_get(s3, cond_obj):
    bucket, etag, _ = cond_obj
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert http_status(e.value) == 304
    g = s3.get_object(Bucket=bucket, Key="c", IfNoneMatch='"0123456789abcdef0123456789abcdef"')
    assert g["Body"].read() == b"conditional"


def test_if_modified_since(s3, cond_obj):
    # LastModified itself, as a client that caches it sends it back: S3
    # compares at one-second resolution, so the object is not modified since.
    bucket, _, lm = cond_obj
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=lm)
    assert http_status(e.value) == 304
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="c", IfModifiedSince=lm)
    assert http_status(e.value) == 304
    g = s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=lm - datetime.timedelta(hours=1))
    assert g["Body"].read() == b"conditional"


def test_if_unmodified_since(s3, cond_obj):
    bucket, _, lm = cond_obj
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfUnmodifiedSince=lm - datetime.timedelta(hours=1))
    assert http_status(e.value) == 412
    assert error_code(e.value) == "PreconditionFailed"
    g = s3.get_object(Bucket=bucket, Key="c", IfUnmodifiedSince=lm)
    assert g["Body"].read() == b"conditional"


def test_put_if_none_match_star(s3, bucket):
    s3.put_object(Bucket=bucket, Key="once", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="once", Body=b"second", IfNoneMatch="*")
    assert http_status(e.value) == 412
    assert error_code(e.value) == "PreconditionFailed"
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"first"


def test_put_if_match(s3, bucket):
    r = s3.put_object(Bucket=bucket, Key="cas", Body=b"v1")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="cas", Body=b"v2", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert http_status(e.value) == 412
    s3.put_object(Bucket=bucket, Key="cas", Body=b"v3", IfMatch=r["ETag"])
    assert s3.get_object(Bucket=bucket, Key="cas")["Body"].read() == b"v3"


@pytest.mark.moto_gap
def test_copy_source_if_match(s3, bucket):
    r = s3.put_object(Bucket=bucket, Key="s", Body=b"src")
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="d", CopySource={"Bucket": bucket, "Key": "s"},
                       CopySourceIfMatch='"0123456789abcdef0123456789abcdef"')
    assert http_status(e.value) == 412
    s3.copy_object(Bucket=bucket, Key="d", CopySource={"Bucket": bucket, "Key": "s"},
                   CopySourceIfMatch=r["ETag"])
    assert s3.get_object(Bucket=bucket, Key="d")["Body"].read() == b"src"


# ---------------------------------------------------------------- tagging

def test_object_tagging(s3, bucket):
    s3.put_object(Bucket=bucket, Key="t", Body=b"x", Tagging="a=1&b=two%20words")
    tags = {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"]}
    assert tags == {"a": "1", "b": "two words"}
    s3.put_object_tagging(Bucket=bucket, Key="t", Tagging={"TagSet": [{"Key": "k", "Value": "v"}]})
    tags = s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"]
    assert tags == [{"Key": "k", "Value": "v"}]
    assert s3.head_object(Bucket=bucket, Key="t").get("ResponseMetadata", {}) \
        .get("HTTPHeaders", {}).get("x-amz-tagging-count") in (None, "1")
    s3.delete_object_tagging(Bucket=bucket, Key="t")
    assert s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"] == []


def test_tagging_missing_key(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_object_tagging(Bucket=bucket, Key="none")
    assert http_status(e.value) == 404


# ---------------------------------------------------------------- versions

def test_list_object_versions_current_objects(s3, bucket):
    keys = ["a", "b/c", "b/d", "e f"]
    etags = {}
    for k in keys:
        etags[k] = s3.put_object(Bucket=bucket, Key=k, Body=k.encode() * 3)["ETag"]
    r = s3.list_object_versions(Bucket=bucket)
    vs = r.get("Versions", [])
    assert [v["Key"] for v in vs] == keys
    for v in vs:
        assert v["VersionId"] == "null"
        assert v["IsLatest"] is True
        assert v["ETag"] == etags[v["Key"]]
        assert v["Size"] == len(v["Key"]) * 3
    assert not r.get("DeleteMarkers")
    r = s3.list_object_versions(Bucket=bucket, Prefix="b/", Delimiter="/")
    assert [v["Key"] for v in r.get("Versions", [])] == ["b/c", "b/d"]
    r = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["b/"]
    assert [v["Key"] for v in r.get("Versions", [])] == ["a", "e f"]


def test_key_of_1024_bytes(s3, bucket):
    # 1024 bytes of UTF-8 (the S3 limit), path components below 255 bytes.
    key = "/".join(["k" * 200] * 5) + "/" + "\u00e9" * 9 + "x"
    assert len(key.encode()) == 1024
    s3.put_object(Bucket=bucket, Key=key, Body=b"longest")
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"longest"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == [key]


@pytest.mark.moto_gap
def test_key_too_long(raw, bucket):
    # moto accepts keys over 1024 bytes.
    key = "/".join(["k" * 200] * 5) + "/" + "x" * 30
    assert len(key.encode()) > 1024
    status, _, body = raw.request("PUT", f"/{bucket}/{key}", body=b"x")
    assert status == 400, body
    assert b"KeyTooLongError" in body


def test_list_object_versions_pagination(s3, bucket):
    keys = [f"v/{i:02d}" for i in range(7)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"v")
    seen, km, vm = [], None, None
    for _ in range(20):
        kw = {"Bucket": bucket, "MaxKeys": 3}
        if km is not None:
            kw.update(KeyMarker=km, VersionIdMarker=vm)
        r = s3.list_object_versions(**kw)
        vs = r.get("Versions", [])
        assert len(vs) <= 3
        seen += [v["Key"] for v in vs]
        if not r["IsTruncated"]:
            break
        km, vm = r["NextKeyMarker"], r.get("NextVersionIdMarker", "null")
    assert seen == keys


def test_response_header_overrides(s3, bucket):
    s3.put_object(Bucket=bucket, Key="o", Body=b"override", ContentType="text/plain")
    g = s3.get_object(Bucket=bucket, Key="o", ResponseContentType="application/x-over",
                      ResponseContentDisposition='attachment; filename="o.bin"',
                      ResponseCacheControl="max-age=5")
    assert g["ContentType"] == "application/x-over"
    assert g["ContentDisposition"] == 'attachment; filename="o.bin"'
    assert g["CacheControl"] == "max-age=5"
    assert g["Body"].read() == b"override"
    # The stored object is unchanged.
    assert s3.head_object(Bucket=bucket, Key="o")["ContentType"] == "text/plain"
