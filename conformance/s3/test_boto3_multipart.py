"""Multipart uploads through boto3: create, upload part (in any order, with
gaps, re-uploaded), upload part copy, complete, abort, list parts, list
uploads; AWS-style -N ETags everywhere."""

import os
import random

import pytest
from botocore.exceptions import ClientError

import s3util
from s3util import error_code, http_status, multipart_etag

MiB = 1024 * 1024


def part_bytes(i, size=5 * MiB):
    # Distinct, cheap-to-make content per part.
    return (i.to_bytes(4, "big") + os.urandom(4092)) * (size // 4096) + os.urandom(size % 4096)


def test_multipart_many_parts_out_of_order(s3, bucket):
    key = "big/multi part \u00e9+%.bin"
    n = 8
    parts = [part_bytes(i) for i in range(1, n)] + [b"tail" * 1000]
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, ContentType="app/x-test",
                                    Metadata={"origin": "mpu"})
    uid = up["UploadId"]
    order = list(range(1, n + 1))
    random.Random(7).shuffle(order)
    etags = {}
    for pn in order:
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=pn, Body=parts[pn - 1])
        etags[pn] = r["ETag"]
        assert r["ETag"] == '"%s"' % s3util.md5_hex(parts[pn - 1])
    # The upload is listed while in progress, and the object does not exist yet.
    ups = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [(key, uid)]
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    assert http_status(e.value) == 404
    # ListParts is ordered by part number, whatever the upload order.
    lp = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    assert [p["PartNumber"] for p in lp["Parts"]] == list(range(1, n + 1))
    assert [p["Size"] for p in lp["Parts"]] == [len(p) for p in parts]
    assert [p["ETag"] for p in lp["Parts"]] == [etags[i] for i in range(1, n + 1)]
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": i, "ETag": etags[i]} for i in range(1, n + 1)]})
    want = multipart_etag(parts)
    assert done["ETag"] == want
    h = s3.head_object(Bucket=bucket, Key=key)
    assert h["ETag"] == want
    assert h["ContentLength"] == sum(map(len, parts))
    assert h["ContentType"] == "app/x-test"
    assert h["Metadata"] == {"origin": "mpu"}
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["ETag"], o["Size"]) for o in listed] == [(key, want, h["ContentLength"])]
    g = s3.get_object(Bucket=bucket, Key=key)
    assert g["ETag"] == want
    body = g["Body"].read()
    assert body == b"".join(parts)
    # A range across a part boundary.
    lo = 5 * MiB - 10
    rg = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={lo}-{lo + 19}")["Body"].read()
    assert rg == body[lo:lo + 20]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_multipart_gaps_and_reupload(s3, bucket):
    key = "gaps"
    p1, p1b, p5, p9 = part_bytes(1), part_bytes(11), part_bytes(5), b"last-part"
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=p1)
    e1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=p1b)["ETag"]
    e5 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=5, Body=p5)["ETag"]
    e9 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=9, Body=p9)["ETag"]
    lp = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["ETag"]) for p in lp] == [(1, e1), (5, e5), (9, e9)]
    page = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid, MaxParts=2)
    assert [p["PartNumber"] for p in page["Parts"]] == [1, 5]
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 5, "ETag": e5},
                                   {"PartNumber": 9, "ETag": e9}]})
    assert done["ETag"] == multipart_etag([p1b, p5, p9])
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == p1b + p5 + p9


@pytest.mark.moto_gap
def test_list_parts_pagination(s3, bucket):
    # moto answers IsTruncated=false on a truncated page.
    uid = s3.create_multipart_upload(Bucket=bucket, Key="lp")["UploadId"]
    for pn in (4, 2, 9, 1, 7):
        s3.upload_part(Bucket=bucket, Key="lp", UploadId=uid, PartNumber=pn, Body=b"p%d" % pn)
    seen, marker = [], 0
    for _ in range(10):
        page = s3.list_parts(Bucket=bucket, Key="lp", UploadId=uid, MaxParts=2,
                             PartNumberMarker=marker)
        seen += [p["PartNumber"] for p in page.get("Parts", [])]
        if not page["IsTruncated"]:
            break
        assert len(page["Parts"]) == 2
        marker = page["NextPartNumberMarker"]
    assert seen == [1, 2, 4, 7, 9]
    s3.abort_multipart_upload(Bucket=bucket, Key="lp", UploadId=uid)


def test_complete_with_subset_of_parts(s3, bucket):
    p1, p2, p3 = part_bytes(1), part_bytes(2), b"three"
    uid = s3.create_multipart_upload(Bucket=bucket, Key="sub")["UploadId"]
    es = [s3.upload_part(Bucket=bucket, Key="sub", UploadId=uid, PartNumber=i + 1, Body=p)["ETag"]
          for i, p in enumerate([p1, p2, p3])]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="sub", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": es[0]}, {"PartNumber": 3, "ETag": es[2]}]})
    assert s3.get_object(Bucket=bucket, Key="sub")["Body"].read() == p1 + p3


def test_complete_errors(s3, bucket):
    small = b"small"
    uid = s3.create_multipart_upload(Bucket=bucket, Key="err")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="err", UploadId=uid, PartNumber=1, Body=small)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="err", UploadId=uid, PartNumber=2, Body=small)["ETag"]
    # Wrong ETag for a part.
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="err", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]})
    assert error_code(e.value) == "InvalidPart"
    assert http_status(e.value) == 400
    # A part that was never uploaded (alone, so that no size rule applies).
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="err", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 7, "ETag": e1}]})
    assert error_code(e.value) == "InvalidPart"
    # A part other than the last below 5 MiB.
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="err", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert error_code(e.value) == "EntityTooSmall"
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="err")
    s3.abort_multipart_upload(Bucket=bucket, Key="err", UploadId=uid)


@pytest.mark.moto_gap
def test_complete_parts_out_of_order(s3, bucket):
    # moto completes a part list that is not in ascending order.
    big1, big2 = part_bytes(1), part_bytes(2)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="ord")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="ord", UploadId=uid, PartNumber=1, Body=big1)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="ord", UploadId=uid, PartNumber=2, Body=big2)["ETag"]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="ord", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]})
    assert error_code(e.value) == "InvalidPartOrder"
    assert http_status(e.value) == 400
    s3.abort_multipart_upload(Bucket=bucket, Key="ord", UploadId=uid)


def test_abort(s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="ab")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="ab", UploadId=uid, PartNumber=1, Body=b"x" * 1000)
    s3.abort_multipart_upload(Bucket=bucket, Key="ab", UploadId=uid)
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key="ab", UploadId=uid)
    assert error_code(e.value) == "NoSuchUpload"
    assert http_status(e.value) == 404
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    # Nothing left behind: the bucket can be deleted.


@pytest.mark.moto_gap
def test_unknown_upload_id(s3, bucket):
    # moto answers UploadPart on an unknown or aborted upload with a 500.
    uid = s3.create_multipart_upload(Bucket=bucket, Key="ab")["UploadId"]
    s3.abort_multipart_upload(Bucket=bucket, Key="ab", UploadId=uid)
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="ab", UploadId=uid, PartNumber=2, Body=b"y")
    assert error_code(e.value) == "NoSuchUpload"
    assert http_status(e.value) == 404
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="x", UploadId="no-such-upload-id", PartNumber=1, Body=b"x")
    assert error_code(e.value) == "NoSuchUpload"
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="x", UploadId="no-such-upload-id",
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"a"'}]})
    assert error_code(e.value) == "NoSuchUpload"


def test_list_multipart_uploads(s3, bucket):
    keys = ["u/a", "u/b", "u/b", "v/c", "w"]
    ids = []
    for k in keys:
        ids.append((k, s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"]))
    try:
        r = s3.list_multipart_uploads(Bucket=bucket)
        got = [(u["Key"], u["UploadId"]) for u in r["Uploads"]]
        assert [g[0] for g in got] == sorted(keys)
        assert sorted(got) == sorted(ids)
        r = s3.list_multipart_uploads(Bucket=bucket, Prefix="u/")
        assert [u["Key"] for u in r["Uploads"]] == ["u/a", "u/b", "u/b"]
    finally:
        for k, u in ids:
            s3.abort_multipart_upload(Bucket=bucket, Key=k, UploadId=u)


@pytest.mark.moto_gap
def test_list_multipart_uploads_delimiter(s3, bucket):
    # moto ignores the delimiter of ListMultipartUploads.
    for k in ["u/a", "u/b", "v/c", "w"]:
        s3.create_multipart_upload(Bucket=bucket, Key=k)
    r = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [u["Key"] for u in r.get("Uploads", [])] == ["w"]
    assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["u/", "v/"]


def test_upload_part_copy(s3, bucket):
    src = part_bytes(3, 6 * MiB)
    s3.put_object(Bucket=bucket, Key="src obj", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    r1 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1,
                             CopySource={"Bucket": bucket, "Key": "src obj"},
                             CopySourceRange=f"bytes=0-{5 * MiB - 1}")
    e1 = r1["CopyPartResult"]["ETag"]
    assert e1 == '"%s"' % s3util.md5_hex(src[:5 * MiB])
    r2 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=2,
                             CopySource={"Bucket": bucket, "Key": "src obj"})
    e2 = r2["CopyPartResult"]["ETag"]
    tail = b"and a normal part"
    e3 = s3.upload_part(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=3, Body=tail)["ETag"]
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="dst", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2},
                                   {"PartNumber": 3, "ETag": e3}]})
    assert done["ETag"] == multipart_etag([src[:5 * MiB], src, tail])
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == src[:5 * MiB] + src + tail


def test_copy_of_multipart_object_keeps_content(s3, bucket):
    parts = [part_bytes(1), b"end"]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
    es = [s3.upload_part(Bucket=bucket, Key="m", UploadId=uid, PartNumber=i + 1, Body=p)["ETag"]
          for i, p in enumerate(parts)]
    s3.complete_multipart_upload(Bucket=bucket, Key="m", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(es)]})
    s3.copy_object(Bucket=bucket, Key="m2", CopySource={"Bucket": bucket, "Key": "m"})
    assert s3.get_object(Bucket=bucket, Key="m2")["Body"].read() == b"".join(parts)


def test_transfer_manager_multipart(s3, bucket, tmp_path):
    """boto3's managed upload_file/download_file split into parts concurrently."""
    from boto3.s3.transfer import TransferConfig
    data = os.urandom(13 * MiB)
    f = tmp_path / "up.bin"
    f.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=4)
    s3.upload_file(str(f), bucket, "managed/obj", Config=cfg)
    h = s3.head_object(Bucket=bucket, Key="managed/obj")
    assert h["ETag"] == multipart_etag([data[:5 * MiB], data[5 * MiB:10 * MiB], data[10 * MiB:]])
    out = tmp_path / "down.bin"
    s3.download_file(bucket, "managed/obj", str(out), Config=cfg)
    assert out.read_bytes() == data


@pytest.mark.parametrize("order,resend,listed", [
    ([1, 2, 3], None, [1, 2, 3]),   # in order: the gateway places parts in place
    ([2, 1, 3], None, [1, 2, 3]),   # out of order, same part size
    ([3, 1, 2], None, [1, 2, 3]),   # the short last part first
    ([1, 2, 3], 2, [1, 2, 3]),      # a part sent twice
    ([1, 2, 3], None, [1, 3]),      # a part left out of the completion
])
def test_completion_keeps_bytes_whatever_the_part_order(s3, bucket, order, resend, listed):
    parts = {1: part_bytes(11), 2: part_bytes(12), 3: b"the short last part" * 40}
    uid = s3.create_multipart_upload(Bucket=bucket, Key="o")["UploadId"]
    etags = {}
    for n in order:
        etags[n] = s3.upload_part(Bucket=bucket, Key="o", UploadId=uid, PartNumber=n, Body=parts[n])["ETag"]
    if resend:
        parts[resend] = part_bytes(13)
        etags[resend] = s3.upload_part(Bucket=bucket, Key="o", UploadId=uid, PartNumber=resend, Body=parts[resend])["ETag"]
    done = s3.complete_multipart_upload(Bucket=bucket, Key="o", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": etags[n]} for n in listed]})
    want = b"".join(parts[n] for n in listed)
    assert done["ETag"] == multipart_etag([parts[n] for n in listed])
    assert s3.head_object(Bucket=bucket, Key="o")["ETag"] == done["ETag"]
    assert s3.get_object(Bucket=bucket, Key="o")["Body"].read() == want
