"""Objects are files: what S3 writes is a file on the FUSE mount, what the
mount writes is an object, with a stable ETag that changes when the file does.

Needs S3_FUSE_ROOT: the bucket root (the gateway's --root, `/s3` for
`fskv up`) as seen through a FUSE mount of the same cluster."""

import hashlib
import os
import time

import pytest

ROOT = os.environ.get("S3_FUSE_ROOT", "")
pytestmark = pytest.mark.skipif(not ROOT, reason="S3_FUSE_ROOT not set (no FUSE mount of the cluster)")


def wait_for(pred, what, timeout_s=10.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_object_written_by_s3_is_a_file(s3, bucket):
    body = os.urandom(3 * 1024 * 1024 + 17)
    s3.put_object(Bucket=bucket, Key="dir/sub/obj.bin", Body=body)
    path = os.path.join(ROOT, bucket, "dir", "sub", "obj.bin")
    wait_for(lambda: os.path.exists(path) and os.path.getsize(path) == len(body), path)
    with open(path, "rb") as f:
        assert f.read() == body
    # The object's metadata lives in xattrs, next to the data.
    assert b"etag" in os.getxattr(path, "user.s3.meta")
    s3.delete_object(Bucket=bucket, Key="dir/sub/obj.bin")
    wait_for(lambda: not os.path.exists(os.path.join(ROOT, bucket, "dir")), "emptied directories to disappear")


def test_file_written_through_fuse_is_an_object_with_a_stable_etag(s3, bucket):
    d = os.path.join(ROOT, bucket, "from-fuse")
    wait_for(lambda: os.path.isdir(os.path.join(ROOT, bucket)), "the bucket directory")
    os.makedirs(d, exist_ok=True)
    data = b"written through the mount\n" * 1000
    with open(os.path.join(d, "f.txt"), "wb") as f:
        f.write(data)
    # The kernel sends the release (which closes the write session and sets
    # the final length and mtime) after close(2) returns: wait until that
    # has landed, then the ETag must not change while the file does not.
    head = lambda: s3.head_object(Bucket=bucket, Key="from-fuse/f.txt")
    wait_for(lambda: head()["ContentLength"] == len(data), "the length after close")
    seen = []

    def settled():
        seen.append(head()["ETag"])
        time.sleep(0.3)
        return len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]

    wait_for(settled, "the file's metadata to settle after close")
    e1 = seen[-1]
    got = s3.get_object(Bucket=bucket, Key="from-fuse/f.txt")
    assert got["Body"].read() == data
    time.sleep(1.0)
    e2 = head()["ETag"]
    assert e1 == e2, "the ETag of an unchanged file is stable"
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="from-fuse/")["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [("from-fuse/f.txt", len(data), e1)]
    time.sleep(1.1)  # mtime has a resolution the ETag must see past
    with open(os.path.join(d, "f.txt"), "ab") as f:
        f.write(b"more")
    wait_for(lambda: s3.head_object(Bucket=bucket, Key="from-fuse/f.txt")["ContentLength"] == len(data) + 4, "the new length")
    assert s3.head_object(Bucket=bucket, Key="from-fuse/f.txt")["ETag"] != e1


def test_s3_object_changed_through_fuse_drops_its_stale_etag(s3, bucket):
    body = b"x" * 10000
    etag = '"%s"' % hashlib.md5(body).hexdigest()
    assert s3.put_object(Bucket=bucket, Key="k", Body=body)["ETag"] == etag
    path = os.path.join(ROOT, bucket, "k")
    wait_for(lambda: os.path.exists(path), path)
    time.sleep(1.1)
    with open(path, "r+b") as f:
        f.write(b"y")
    # The mount reports the write to meta when the kernel releases the file,
    # which it does after close(2) returns.
    wait_for(lambda: s3.head_object(Bucket=bucket, Key="k")["ETag"] != etag,
             "a file modified through POSIX to lose the MD5 of its old content")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"y" + body[1:]
