"""rclone as a client, through a remote 'conf' configured by environment
variables (provider Other, path-style, SigV4)."""

import json
import os

import pytest

import s3util
from conftest import run_cli, tool


@pytest.fixture
def rclone(cli_env):
    exe = tool("rclone")

    def run(*args, check=True):
        return run_cli(cli_env, [exe, "--retries", "1", "--low-level-retries", "2",
                                 "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M", *args],
                       check=check, timeout=180)
    return run


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    files = {
        "top.txt": b"top",
        "a dir/one.txt": b"1" * 10,
        "a dir/\u00e9t\u00e9/two+%.txt": b"2" * 20,
        "deep/er/est/three~.bin": os.urandom(3000),
        "big.bin": os.urandom(11 * 1024 * 1024),  # multipart at 5M chunks
    }
    for rel, body in files.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body)
    return src, files


def test_copy_lsjson_check(rclone, s3, bucket, tree, tmp_path):
    src, files = tree
    rclone("copy", str(src), f"conf:{bucket}/r")
    listed = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert listed == {f"r/{k}": len(v) for k, v in files.items()}
    out = json.loads(rclone("lsjson", "-R", "--files-only", f"conf:{bucket}/r").stdout)
    assert {e["Path"]: e["Size"] for e in out} == {k: len(v) for k, v in files.items()}
    top = json.loads(rclone("lsjson", f"conf:{bucket}/r").stdout)
    assert sorted((e["Name"], e["IsDir"]) for e in top) == [
        ("a dir", True), ("big.bin", False), ("deep", True), ("top.txt", False)]
    rclone("check", str(src), f"conf:{bucket}/r")
    dst = tmp_path / "back"
    rclone("copy", f"conf:{bucket}/r", str(dst))
    for rel, body in files.items():
        assert (dst / rel).read_bytes() == body


def test_sync_deletes_and_check_detects_difference(rclone, s3, bucket, tree):
    src, files = tree
    rclone("sync", str(src), f"conf:{bucket}/s")
    (src / "top.txt").unlink()
    (src / "new.txt").write_bytes(b"new")
    rclone("sync", str(src), f"conf:{bucket}/s")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert "s/top.txt" not in keys and "s/new.txt" in keys
    rclone("check", str(src), f"conf:{bucket}/s")
    s3.put_object(Bucket=bucket, Key="s/new.txt", Body=b"changed")
    r = rclone("check", str(src), f"conf:{bucket}/s", check=False)
    assert r.returncode != 0


def test_mkdir_purge(rclone, s3):
    name = s3util.unique_bucket("rcl")
    try:
        rclone("mkdir", f"conf:{name}")
        s3.head_bucket(Bucket=name)
        s3.put_object(Bucket=name, Key="x/y.txt", Body=b"y")
        rclone("purge", f"conf:{name}")
    finally:
        s3util.empty_and_delete(s3, name)
