"""s3cmd as a client (SigV4, path-style, plain HTTP)."""

import os

import pytest

import s3util
from conftest import run_cli, tool


@pytest.fixture
def s3cmd(cli_env):
    exe = tool("s3cmd")

    def run(*args, check=True):
        return run_cli(cli_env, [exe, "-c", cli_env["_S3CFG"], "--no-progress", *args], check=check)
    return run


def test_mb_ls_rb(s3cmd):
    name = s3util.unique_bucket("s3cmd")
    s3cmd("mb", f"s3://{name}")
    try:
        assert f"s3://{name}" in s3cmd("ls").stdout
    finally:
        s3cmd("rb", f"s3://{name}", "--recursive", "--force", check=False)


def test_put_get_ls_del(s3cmd, s3, bucket, tmp_path):
    f = tmp_path / "file with space.txt"
    f.write_bytes(b"s3cmd data")
    s3cmd("put", str(f), f"s3://{bucket}/d/file with space.txt")
    s3cmd("put", str(f), f"s3://{bucket}/d/\u00fcml+aut%.txt")
    assert s3.get_object(Bucket=bucket, Key="d/file with space.txt")["Body"].read() == b"s3cmd data"
    out = s3cmd("ls", f"s3://{bucket}/d/").stdout
    assert "file with space.txt" in out and "\u00fcml+aut%.txt" in out
    out = s3cmd("ls", f"s3://{bucket}/").stdout
    assert "DIR" in out and f"s3://{bucket}/d/" in out
    dl = tmp_path / "dl"
    s3cmd("get", f"s3://{bucket}/d/\u00fcml+aut%.txt", str(dl))
    assert dl.read_bytes() == b"s3cmd data"
    info = s3cmd("info", f"s3://{bucket}/d/file with space.txt").stdout
    assert "MD5" in info
    s3cmd("del", f"s3://{bucket}/d/file with space.txt")
    s3cmd("del", f"s3://{bucket}/d/\u00fcml+aut%.txt")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_multipart_put(s3cmd, s3, bucket, tmp_path):
    data = os.urandom(12 * 1024 * 1024)
    f = tmp_path / "big"
    f.write_bytes(data)
    s3cmd("put", "--multipart-chunk-size-mb=5", str(f), f"s3://{bucket}/big")
    h = s3.head_object(Bucket=bucket, Key="big")
    assert h["ContentLength"] == len(data)
    assert h["ETag"] == s3util.multipart_etag([data[:5 << 20], data[5 << 20:10 << 20], data[10 << 20:]])
    dl = tmp_path / "dl"
    s3cmd("get", f"s3://{bucket}/big", str(dl))
    assert dl.read_bytes() == data


def test_sync_cp_mv(s3cmd, s3, bucket, tmp_path):
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    (src / "x" / "1.txt").write_bytes(b"1")
    (src / "2 two.txt").write_bytes(b"22")
    s3cmd("sync", str(src) + "/", f"s3://{bucket}/sync/")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["sync/2 two.txt", "sync/x/1.txt"]
    s3cmd("cp", f"s3://{bucket}/sync/2 two.txt", f"s3://{bucket}/copy.txt")
    s3cmd("mv", f"s3://{bucket}/copy.txt", f"s3://{bucket}/moved.txt")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["moved.txt", "sync/2 two.txt", "sync/x/1.txt"]
    s3cmd("del", "--recursive", "--force", f"s3://{bucket}/")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
