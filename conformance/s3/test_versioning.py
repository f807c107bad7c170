"""S3 versioning (issue 19) with boto3, on the gateway and on the reference
(moto): the outcomes asserted here are S3's, so they hold on both.

Put/GetBucketVersioning, version ids on PUT, copy and multipart completion,
GET/HEAD/DELETE by versionId, delete markers (404 on GET, 405 on GET of the
marker's version, removing the marker brings the object back),
ListObjectVersions with every version and marker and its pagination,
conditional reads per version, Suspended (null versions replaced),
DeleteObjects with version ids, DeleteBucket refused while versions are
left. Objects above the 4 KiB inline limit and a multipart upload, so the
chunked data path and in-place completion are versioned too.

On the gateway, the current version stays the file at the key's path: the
FUSE test checks that the mount sees the current data only.
"""

import json
import os
import re
import time

import pytest
from botocore.exceptions import ClientError

import s3util
from s3util import error_code, http_status

FUSE_ROOT = os.environ.get("S3_FUSE_ROOT", "")
# Where the reference (moto) differs from AWS, the test states both; AWS's
# answer is what the gateway gives (AWS API reference, GetObject).
ON_MOTO = s3util.target_kind() in ("moto", "moto-auth")


def enable(s3, bucket, status="Enabled"):
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": status})


def all_versions(s3, bucket, prefix="", max_keys=1000):
    """Every (key, version id, is latest, is marker), paged with the markers."""
    out, km, vm = [], None, None
    for _ in range(200):
        kw = dict(Bucket=bucket, Prefix=prefix, MaxKeys=max_keys)
        if km is not None:
            kw["KeyMarker"] = km
            if vm is not None:
                kw["VersionIdMarker"] = vm
        r = s3.list_object_versions(**kw)
        out += [(v["Key"], v["VersionId"], v["IsLatest"], False) for v in r.get("Versions", [])]
        out += [(m["Key"], m["VersionId"], m["IsLatest"], True) for m in r.get("DeleteMarkers", [])]
        if not r["IsTruncated"]:
            return sorted(out)
        km, vm = r["NextKeyMarker"], r.get("NextVersionIdMarker")
    raise AssertionError("listing did not end")


def body(tag, size=200_000):
    return (tag.encode() * (size // len(tag) + 1))[:size]


def test_versions_markers_and_reads_by_version(s3, bucket):
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="doc", Body=body("zero"))  # the null version
    enable(s3, bucket)
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    v1 = s3.put_object(Bucket=bucket, Key="doc", Body=body("one"))["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="doc", Body=body("two", 100))["VersionId"]
    assert v1 != v2 and "null" not in (v1, v2)
    assert s3.get_object(Bucket=bucket, Key="doc")["Body"].read() == body("two", 100)
    g = s3.get_object(Bucket=bucket, Key="doc", VersionId=v1)
    assert g["VersionId"] == v1 and g["Body"].read() == body("one")
    assert s3.get_object(Bucket=bucket, Key="doc", VersionId="null")["Body"].read() == body("zero")
    assert s3.head_object(Bucket=bucket, Key="doc", VersionId=v1)["ContentLength"] == 200_000
    assert all_versions(s3, bucket) == sorted([("doc", v2, True, False), ("doc", v1, False, False), ("doc", "null", False, False)])

    # A delete makes a marker; the object is gone but every version stays.
    d = s3.delete_object(Bucket=bucket, Key="doc")
    marker = d["VersionId"]
    assert d["DeleteMarker"] is True
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="doc")
    assert error_code(e.value) == "NoSuchKey"
    # AWS names the marker in the 404's headers (moto does not).
    hdrs = e.value.response["ResponseMetadata"]["HTTPHeaders"]
    assert ON_MOTO or (hdrs.get("x-amz-delete-marker") == "true" and hdrs.get("x-amz-version-id") == marker)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="doc", VersionId=marker)
    # AWS: 405 MethodNotAllowed for a delete marker's version; moto: 404.
    assert http_status(e.value) == (404 if ON_MOTO else 405)
    if not ON_MOTO:
        assert e.value.response["ResponseMetadata"]["HTTPHeaders"].get("x-amz-delete-marker") == "true"
    assert s3.get_object(Bucket=bucket, Key="doc", VersionId=v2)["Body"].read() == body("two", 100)
    listed = all_versions(s3, bucket)
    assert ("doc", marker, True, True) in listed and len(listed) == 4
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0

    # Removing the marker brings v2 back; removing v2 then makes v1 current.
    d = s3.delete_object(Bucket=bucket, Key="doc", VersionId=marker)
    # AWS says the removed version was a marker; moto leaves the header out.
    assert d["VersionId"] == marker and (ON_MOTO or d.get("DeleteMarker") is True)
    assert s3.get_object(Bucket=bucket, Key="doc")["Body"].read() == body("two", 100)
    s3.delete_object(Bucket=bucket, Key="doc", VersionId=v2)
    assert s3.get_object(Bucket=bucket, Key="doc")["Body"].read() == body("one")
    assert all_versions(s3, bucket) == sorted([("doc", v1, True, False), ("doc", "null", False, False)])


def test_errors_for_versions_that_do_not_exist(s3, bucket):
    enable(s3, bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="k", VersionId="not-a-version-id")
    # AWS: 400 InvalidArgument "Invalid version id specified"; moto: 404.
    assert http_status(e.value) == (404 if ON_MOTO else 400)
    # A delete of a version that is not there is no error (S3 answers 204).
    assert s3.delete_object(Bucket=bucket, Key="gone", VersionId="null")["ResponseMetadata"]["HTTPStatusCode"] == 204


def tags(s3, bucket, key, **kw):
    r = s3.get_object_tagging(Bucket=bucket, Key=key, **kw)
    return r.get("VersionId"), {t["Key"]: t["Value"] for t in r["TagSet"]}


def public_read(grants):
    return any(g["Grantee"].get("URI", "").endswith("/AllUsers") and g["Permission"] == "READ" for g in grants)


def test_tagging_and_acls_apply_to_the_version_asked_for(s3, bucket):
    enable(s3, bucket)
    v1 = s3.put_object(Bucket=bucket, Key="t", Body=body("one"), Tagging="t=one")["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="t", Body=body("two"), Tagging="t=two")["VersionId"]
    assert tags(s3, bucket, "t") == (v2, {"t": "two"})
    assert tags(s3, bucket, "t", VersionId=v1) == (v1, {"t": "one"})
    # Put and delete of a noncurrent version's tags leave the current one's alone.
    put = s3.put_object_tagging(Bucket=bucket, Key="t", VersionId=v1, Tagging={"TagSet": [{"Key": "t", "Value": "changed"}]})
    # AWS names the version tagged (x-amz-version-id); moto sends no header.
    assert put.get("VersionId") == (None if ON_MOTO else v1)
    assert tags(s3, bucket, "t", VersionId=v1) == (v1, {"t": "changed"})
    assert tags(s3, bucket, "t") == (v2, {"t": "two"})
    assert s3.delete_object_tagging(Bucket=bucket, Key="t", VersionId=v1).get("VersionId") == v1
    assert tags(s3, bucket, "t", VersionId=v1) == (v1, {})
    assert tags(s3, bucket, "t") == (v2, {"t": "two"})
    # Without a version id the current version is tagged, and says which it is.
    put = s3.put_object_tagging(Bucket=bucket, Key="t", Tagging={"TagSet": [{"Key": "c", "Value": "1"}]})
    assert put.get("VersionId") == (None if ON_MOTO else v2)
    assert tags(s3, bucket, "t", VersionId=v2) == (v2, {"c": "1"})
    # A version's tags move with it when a newer version supersedes it.
    v3 = s3.put_object(Bucket=bucket, Key="t", Body=body("three"))["VersionId"]
    assert tags(s3, bucket, "t", VersionId=v2) == (v2, {"c": "1"})
    assert tags(s3, bucket, "t") == (v3, {})

    # Object ACLs are per version too (AWS, PutObjectAcl `versionId`; moto
    # ignores the version id of PutObjectAcl).
    s3.put_object_acl(Bucket=bucket, Key="t", VersionId=v1, ACL="public-read")
    if not ON_MOTO:
        assert public_read(s3.get_object_acl(Bucket=bucket, Key="t", VersionId=v1)["Grants"])
        assert not public_read(s3.get_object_acl(Bucket=bucket, Key="t")["Grants"])
        assert not public_read(s3.get_object_acl(Bucket=bucket, Key="t", VersionId=v2)["Grants"])

    # A version the key does not have, and a delete marker's version.
    marker = s3.delete_object(Bucket=bucket, Key="t")["VersionId"]
    missing = v3[:-1] + ("0" if v3[-1] != "0" else "1")
    for call in (
        lambda v: s3.get_object_tagging(Bucket=bucket, Key="t", VersionId=v),
        lambda v: s3.put_object_tagging(Bucket=bucket, Key="t", VersionId=v, Tagging={"TagSet": []}),
        lambda v: s3.get_object_acl(Bucket=bucket, Key="t", VersionId=v),
    ):
        with pytest.raises(ClientError) as e:
            call(missing)
        assert (http_status(e.value), error_code(e.value)) == (404, "NoSuchVersion")
        with pytest.raises(ClientError) as e:
            call(marker)
        # AWS: 405 MethodNotAllowed on a delete marker; moto answers 404 to
        # some of these calls (getmoto/moto#9401).
        if ON_MOTO:
            assert http_status(e.value) in (404, 405)
        else:
            assert (http_status(e.value), error_code(e.value)) == (405, "MethodNotAllowed")
    # The noncurrent versions keep their tags behind the marker.
    assert tags(s3, bucket, "t", VersionId=v3) == (v3, {})
    assert tags(s3, bucket, "t", VersionId=v2) == (v2, {"c": "1"})


@pytest.mark.moto_gap  # moto does not check anonymous access
def test_anonymous_reads_follow_the_acl_of_the_version_asked_for(s3, bucket):
    from botocore import UNSIGNED

    enable(s3, bucket)
    v1 = s3.put_object(Bucket=bucket, Key="p", Body=b"public old", ACL="public-read")["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="p", Body=b"private new")["VersionId"]
    a = s3util.make_client(signature_version=UNSIGNED)
    assert a.get_object(Bucket=bucket, Key="p", VersionId=v1)["Body"].read() == b"public old"
    for kw in ({}, {"VersionId": v2}, {"VersionId": v2[:-1] + ("0" if v2[-1] != "0" else "1")}):
        with pytest.raises(ClientError) as e:
            a.get_object(Bucket=bucket, Key="p", **kw)
        assert (http_status(e.value), error_code(e.value)) == (403, "AccessDenied"), kw

    # A policy's s3:GetObject covers reads of the current version only; a
    # read naming a version is s3:GetObjectVersion (as AWS).
    def anon_status(**kw):
        try:
            a.get_object(Bucket=bucket, Key="p", **kw)["Body"].read()
            return 200
        except ClientError as e:
            return http_status(e)

    def policy(action):
        s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": "*", "Action": action, "Resource": f"arn:aws:s3:::{bucket}/*"}]}))

    def settle(want, **kw):  # other gateway processes see a new policy within 2 s
        deadline = time.time() + 5
        while anon_status(**kw) != want and time.time() < deadline:
            time.sleep(0.1)
        return anon_status(**kw)

    policy("s3:GetObject")
    assert settle(200) == 200
    assert anon_status(VersionId=v2) == 403
    policy("s3:GetObjectVersion")
    assert settle(200, VersionId=v2) == 200
    assert anon_status() == 403


@pytest.mark.moto_gap  # moto does not evaluate bucket policies
def test_batch_deletes_honour_a_policy_that_protects_versions(s3, bucket):
    # A common guard: nobody, the owner included, deletes versions for good.
    enable(s3, bucket)
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"one")["VersionId"]
    s3.put_object(Bucket=bucket, Key="k", Body=b"two")
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObjectVersion", "Resource": f"arn:aws:s3:::{bucket}/*"}]}))

    try:
        # Other gateway processes see a new policy within 2 s: probe with
        # throwaway versions until a versioned delete is refused.
        deadline = time.time() + 5
        while True:
            probe = s3.put_object(Bucket=bucket, Key="probe", Body=b"p")["VersionId"]
            try:
                s3.delete_object(Bucket=bucket, Key="probe", VersionId=probe)
            except ClientError as e:
                assert (http_status(e), error_code(e)) == (403, "AccessDenied")
                break
            assert time.time() < deadline, "the Deny policy never took effect"
            time.sleep(0.1)

        r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k", "VersionId": v1}, {"Key": "k"}]})
        assert [(e["Key"], e.get("VersionId"), e["Code"]) for e in r.get("Errors", [])] == [("k", v1, "AccessDenied")]
        # The delete without a version id is allowed: it only adds a marker.
        assert [(d["Key"], d.get("DeleteMarker")) for d in r.get("Deleted", [])] == [("k", True)]
        assert s3.get_object(Bucket=bucket, Key="k", VersionId=v1)["Body"].read() == b"one"
    finally:
        s3.delete_bucket_policy(Bucket=bucket)  # so the bucket can be emptied


def test_conditional_reads_apply_to_the_version_asked_for(s3, bucket):
    enable(s3, bucket)
    v1 = s3.put_object(Bucket=bucket, Key="c", Body=b"first")
    s3.put_object(Bucket=bucket, Key="c", Body=b"second")
    got = s3.get_object(Bucket=bucket, Key="c", VersionId=v1["VersionId"], IfMatch=v1["ETag"])
    assert got["Body"].read() == b"first"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfMatch=v1["ETag"])
    assert http_status(e.value) == 412


def test_suspended_writes_replace_the_null_version_only(s3, bucket):
    enable(s3, bucket)
    v1 = s3.put_object(Bucket=bucket, Key="s", Body=b"v1")["VersionId"]
    enable(s3, bucket, "Suspended")
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Suspended"
    r = s3.put_object(Bucket=bucket, Key="s", Body=b"null-1")
    # AWS answers a write while Suspended without x-amz-version-id.
    assert "VersionId" not in r
    s3.put_object(Bucket=bucket, Key="s", Body=b"null-2")
    if ON_MOTO:
        pytest.skip("moto drops the Enabled-era version once a Suspended write lands; AWS keeps it")
    assert all_versions(s3, bucket) == sorted([("s", "null", True, False), ("s", v1, False, False)])
    assert s3.get_object(Bucket=bucket, Key="s")["Body"].read() == b"null-2"
    # A delete while Suspended: the null version becomes a null marker.
    d = s3.delete_object(Bucket=bucket, Key="s")
    assert d["DeleteMarker"] is True and d["VersionId"] == "null"
    assert all_versions(s3, bucket) == sorted([("s", "null", True, True), ("s", v1, False, False)])


def test_copy_and_multipart_make_versions(s3, bucket):
    enable(s3, bucket)
    v1 = s3.put_object(Bucket=bucket, Key="src", Body=body("src-1"))["VersionId"]
    s3.put_object(Bucket=bucket, Key="src", Body=body("src-2"))
    c = s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src", "VersionId": v1})
    assert c["CopySourceVersionId"] == v1 and c["VersionId"] not in (None, "null")
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == body("src-1")
    # Restoring an old version: copy it onto its own key.
    s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src", "VersionId": v1})
    assert s3.get_object(Bucket=bucket, Key="src")["Body"].read() == body("src-1")
    assert len([v for v in all_versions(s3, bucket, "src") if v[0] == "src"]) == 3

    first = s3.put_object(Bucket=bucket, Key="mp", Body=b"before the upload")["VersionId"]
    part1, part2 = os.urandom(5 * 1024 * 1024), os.urandom(1000)
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp")
    e1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up["UploadId"], PartNumber=1, Body=part1)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up["UploadId"], PartNumber=2, Body=part2)["ETag"]
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="mp", UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert done["VersionId"] not in (None, "null", first)
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == part1 + part2
    assert s3.get_object(Bucket=bucket, Key="mp", VersionId=first)["Body"].read() == b"before the upload"


def test_listing_pages_and_delete_objects_by_version(s3, bucket):
    enable(s3, bucket)
    made = []
    for k in ["a", "b/c", "b/d", "e"]:
        for i in range(3):
            made.append((k, s3.put_object(Bucket=bucket, Key=k, Body=f"{k}{i}".encode())["VersionId"]))
    s3.delete_object(Bucket=bucket, Key="e")
    full = all_versions(s3, bucket)
    assert len(full) == 13
    assert all_versions(s3, bucket, max_keys=2) == full
    # With a delimiter: b/ rolls up.
    r = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["b/"]
    assert {v["Key"] for v in r["Versions"]} == {"a", "e"}
    # DeleteObjects removes versions for good and reports each.
    objs = [{"Key": k, "VersionId": v} for k, v in made if k in ("a", "b/c")]
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": objs})
    assert len(r.get("Deleted", [])) == 6 and not r.get("Errors")
    keys_left = {k for k, _, _, _ in all_versions(s3, bucket)}
    assert keys_left == {"b/d", "e"}
    # The bucket is not empty while versions are left.
    with pytest.raises(ClientError) as e:
        for k, v, _, _ in all_versions(s3, bucket):
            if k == "e":
                continue
            s3.delete_object(Bucket=bucket, Key=k, VersionId=v)
        s3.delete_bucket(Bucket=bucket)
    assert error_code(e.value) == "BucketNotEmpty"


@pytest.mark.fs_only
@pytest.mark.skipif(not FUSE_ROOT, reason="S3_FUSE_ROOT not set (no FUSE mount of the cluster)")
def test_the_mount_sees_the_current_version_only(s3, bucket):
    enable(s3, bucket)
    s3.put_object(Bucket=bucket, Key="dir/f", Body=b"old")
    s3.put_object(Bucket=bucket, Key="dir/f", Body=b"new")
    path = os.path.join(FUSE_ROOT, bucket, "dir", "f")
    deadline = time.time() + 10
    while time.time() < deadline:
        if os.path.exists(path) and open(path, "rb").read() == b"new":
            break
        time.sleep(0.1)
    assert open(path, "rb").read() == b"new"
    assert os.listdir(os.path.join(FUSE_ROOT, bucket, "dir")) == ["f"]
    s3.delete_object(Bucket=bucket, Key="dir/f")
    deadline = time.time() + 10
    while os.path.exists(path) and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(path), "a delete marker leaves no file at the key"


@pytest.mark.moto_gap  # moto writes every version, then every marker
def test_versions_and_markers_come_interleaved_in_key_order(s3, raw, bucket):
    """AWS's XML lists a key's versions and delete markers together, newest
    first (order-keeping parsers such as minio-go's show them as sent)."""
    enable(s3, bucket)
    old = s3.put_object(Bucket=bucket, Key="a", Body=b"1")["VersionId"]
    marker = s3.delete_object(Bucket=bucket, Key="a")["VersionId"]
    new = s3.put_object(Bucket=bucket, Key="a", Body=b"2")["VersionId"]
    b = s3.put_object(Bucket=bucket, Key="b", Body=b"3")["VersionId"]
    status, _, xml = raw.request("GET", f"/{bucket}", query=[("versions", "")])
    assert status == 200, xml
    entries = re.findall(rb"<(Version|DeleteMarker)>.*?<VersionId>([^<]*)</VersionId>", xml)
    assert [(kind.decode(), vid.decode()) for kind, vid in entries] == [
        ("Version", new), ("DeleteMarker", marker), ("Version", old), ("Version", b)]
    # Pages keep the order too.
    status, _, xml = raw.request("GET", f"/{bucket}", query=[("versions", ""), ("max-keys", "2")])
    entries = re.findall(rb"<(Version|DeleteMarker)>.*?<VersionId>([^<]*)</VersionId>", xml)
    assert [vid.decode() for _, vid in entries] == [new, marker]
