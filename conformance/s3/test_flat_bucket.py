"""Flat buckets (issue 19): a bucket created with the header
`x-fskv-bucket-layout: flat` stores any set of keys, as S3 does: `a/b` and
`a/b/c` both, `dir/` holding data next to `dir/x`, keys a filesystem path
cannot be (`/lead`, `a//b`, `..`, a component over 255 bytes), listed in S3
order. On the reference (moto, which ignores the header) the same tests
state what S3 itself does, so every outcome here is S3's.

Through the FUSE mount (S3_FUSE_ROOT), a flat bucket's object is the file
named by the order-preserving encoding of its key (gateway-s3/src/paths.rs,
client/native/src/keyname.rs): `a/b` is `a.2Fb`.
"""

import concurrent.futures
import hashlib
import os

import pytest
from botocore.exceptions import ClientError

import s3util
from s3util import model_list

LAYOUT_HEADER = "x-fskv-bucket-layout"
FUSE_ROOT = os.environ.get("S3_FUSE_ROOT", "")

# Keys that form no tree, and keys a tree bucket refuses.
FIXED = ["a/b", "a/b/c", "a/b/", "dir/", "dir/x", "/lead", "a//b", "..", "x/" + "c" * 300 + "/y"]


def create_with_layout(client, name, layout):
    """CreateBucket with the layout header (added before signing)."""
    def add_header(request, **_):
        request.headers[LAYOUT_HEADER] = layout

    client.meta.events.register("before-sign.s3.CreateBucket", add_header)
    try:
        client.create_bucket(Bucket=name)
    finally:
        client.meta.events.unregister("before-sign.s3.CreateBucket", add_header)


@pytest.fixture
def flat():
    client = s3util.make_client()
    name = s3util.unique_bucket("flat")
    create_with_layout(client, name, "flat")
    yield client, name
    s3util.empty_and_delete(client, name)


def body_of(key, size):
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def list_all(client, bucket, prefix="", delimiter="", max_keys=1000):
    """Every entry of a paged ListObjectsV2, as model_list gives them."""
    out, token = [], None
    for _ in range(500):
        args = dict(Bucket=bucket, Prefix=prefix, MaxKeys=max_keys)
        if delimiter:
            args["Delimiter"] = delimiter
        if token:
            args["ContinuationToken"] = token
        r = client.list_objects_v2(**args)
        page = [("key", o["Key"]) for o in r.get("Contents", [])]
        page += [("prefix", p["Prefix"]) for p in r.get("CommonPrefixes", [])]
        out += sorted(page, key=lambda e: e[1].encode())
        if not r.get("IsTruncated"):
            return out
        token = r["NextContinuationToken"]
    raise AssertionError("listing did not end")


def test_keys_that_form_no_tree_are_objects_with_their_data(flat):
    client, bucket = flat
    sizes = {k: (i * 37_001) % 150_000 for i, k in enumerate(FIXED)}
    for k in FIXED:
        client.put_object(Bucket=bucket, Key=k, Body=body_of(k, sizes[k]))
    for k in FIXED:
        got = client.get_object(Bucket=bucket, Key=k)["Body"].read()
        assert got == body_of(k, sizes[k]), k
        assert client.head_object(Bucket=bucket, Key=k)["ContentLength"] == sizes[k]
    assert list_all(client, bucket) == model_list(FIXED)
    assert list_all(client, bucket, delimiter="/") == model_list(FIXED, delimiter="/")
    assert list_all(client, bucket, prefix="a/b", delimiter="/", max_keys=1) == model_list(FIXED, "a/b", "/")
    # Deleting `a/b` leaves `a/b/c` and `a/b/`.
    client.delete_object(Bucket=bucket, Key="a/b")
    left = [k for k in FIXED if k != "a/b"]
    assert list_all(client, bucket, prefix="a/") == model_list(left, "a/")
    with pytest.raises(ClientError) as e:
        client.get_object(Bucket=bucket, Key="a/b")
    assert s3util.error_code(e.value) == "NoSuchKey"


def test_random_keys_with_tree_conflicts_list_as_the_model(flat):
    client, bucket = flat
    rng = s3util.rng_for(19)
    base = s3util.random_keys(rng, 50, long_keys=1)
    # Every third key also gets keys below it: `k/` and `k/sub.o`.
    keys = set(base)
    for k in base[::3]:
        keys.update([k + "/", k + "/sub.o"])
    keys = sorted(keys)
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=body_of(k, 16)), keys))
    for prefix, delimiter, max_keys in [("", "", 7), ("", "/", 5), ("a", "/", 3), ("a/", "", 1000), ("caf", "/", 2), ("", "o", 4)]:
        got = list_all(client, bucket, prefix, delimiter, max_keys)
        assert got == model_list(keys, prefix, delimiter), (prefix, delimiter, max_keys)


def test_multipart_and_copy_between_flat_and_tree_buckets(flat, s3, bucket):
    client, fbucket = flat
    key = "m/n/"  # a key ending in '/', with data
    part1, part2 = os.urandom(5 * 1024 * 1024), os.urandom(1000)
    up = client.create_multipart_upload(Bucket=fbucket, Key=key)
    e1 = client.upload_part(Bucket=fbucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=part1)["ETag"]
    e2 = client.upload_part(Bucket=fbucket, Key=key, UploadId=up["UploadId"], PartNumber=2, Body=part2)["ETag"]
    client.complete_multipart_upload(
        Bucket=fbucket, Key=key, UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert client.get_object(Bucket=fbucket, Key=key)["Body"].read() == part1 + part2
    # Flat to tree and back.
    s3.copy_object(Bucket=bucket, Key="copied/obj", CopySource={"Bucket": fbucket, "Key": key})
    assert s3.get_object(Bucket=bucket, Key="copied/obj")["Body"].read() == part1 + part2
    client.copy_object(Bucket=fbucket, Key="copied/obj/again", CopySource={"Bucket": bucket, "Key": "copied/obj"})
    client.put_object(Bucket=fbucket, Key="copied/obj", Body=b"next to its own prefix")
    assert client.get_object(Bucket=fbucket, Key="copied/obj/again")["Body"].read() == part1 + part2
    assert [k for _, k in list_all(client, fbucket, prefix="copied/")] == ["copied/obj", "copied/obj/again"]


@pytest.mark.fs_only
def test_a_tree_bucket_still_refuses_what_a_flat_one_takes(s3, bucket):
    s3.put_object(Bucket=bucket, Key="a/b", Body=b"1")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="a/b/c", Body=b"2")
    assert s3util.http_status(e.value) == 409


@pytest.mark.fs_only
def test_an_unknown_layout_is_refused():
    client = s3util.make_client()
    name = s3util.unique_bucket("badlayout")
    with pytest.raises(ClientError) as e:
        create_with_layout(client, name, "sideways")
    assert s3util.http_status(e.value) == 400
    assert s3util.error_code(e.value) == "InvalidArgument"
    with pytest.raises(ClientError):
        client.head_bucket(Bucket=name)


def encode_key(key):
    """The file name of a flat bucket's key (short keys; keyname.rs)."""
    out = []
    for b in key.encode():
        if b <= 0x21:
            out.append("!%02X" % b)
        elif b in (0x2E, 0x2F):
            out.append(".%02X" % b)
        elif b >= 0x7E:
            out.append("~%02X" % b)
        else:
            out.append(chr(b))
    return "".join(out)


@pytest.mark.fs_only
@pytest.mark.skipif(not FUSE_ROOT, reason="S3_FUSE_ROOT not set (no FUSE mount of the cluster)")
def test_flat_objects_are_files_under_encoded_names_on_the_mount(flat):
    import time
    client, bucket = flat
    body = os.urandom(70_000)
    client.put_object(Bucket=bucket, Key="a/b", Body=body)
    client.put_object(Bucket=bucket, Key="a/b/c d", Body=b"small")
    path = os.path.join(FUSE_ROOT, bucket, encode_key("a/b"))
    assert os.path.basename(path) == "a.2Fb"
    deadline = time.time() + 10
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.1)
    with open(path, "rb") as f:
        assert f.read() == body
    with open(os.path.join(FUSE_ROOT, bucket, encode_key("a/b/c d")), "rb") as f:
        assert f.read() == b"small"
    assert "a.2Fb.2Fc!20d" in os.listdir(os.path.join(FUSE_ROOT, bucket))
