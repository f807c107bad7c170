"""s5cmd as a client: cp/ls/rm, many small objects in parallel, a multipart
object."""

import os

import pytest

import s3util
from conftest import run_cli, tool


@pytest.fixture
def s5(cli_env):
    exe = tool("s5cmd")

    def run(*args, check=True):
        return run_cli(cli_env, [exe, "--endpoint-url", s3util.endpoint(), "--retry-count", "1",
                                 "--numworkers", "16", *args], check=check, timeout=180)
    return run


def test_many_small_objects(s5, s3, bucket, tmp_path):
    src = tmp_path / "many"
    n = 300
    for i in range(n):
        d = src / f"g{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"obj {i:04d}+.txt").write_bytes(b"%d" % i)
    s5("cp", str(src) + "/", f"s3://{bucket}/many/")
    keys = []
    token = None
    for _ in range(10):
        kw = {"Bucket": bucket, "Prefix": "many/"}
        if token:
            kw["ContinuationToken"] = token
        r = s3.list_objects_v2(**kw)
        keys += [o["Key"] for o in r.get("Contents", [])]
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert len(keys) == n
    out = s5("ls", f"s3://{bucket}/many/g3/*").stdout
    assert len([line for line in out.splitlines() if line.strip()]) == len(range(3, n, 7))
    out = s5("ls", f"s3://{bucket}/many/").stdout
    assert "DIR  g0/" in out.replace("  ", "  ") or "g0/" in out
    s5("rm", f"s3://{bucket}/many/*")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_multipart_object(s5, s3, bucket, tmp_path):
    data = os.urandom(16 * 1024 * 1024)
    f = tmp_path / "big.bin"
    f.write_bytes(data)
    s5("cp", "--part-size", "5", "--concurrency", "3", str(f), f"s3://{bucket}/big.bin")
    h = s3.head_object(Bucket=bucket, Key="big.bin")
    assert h["ContentLength"] == len(data)
    m = 5 << 20
    assert h["ETag"] == s3util.multipart_etag([data[:m], data[m:2 * m], data[2 * m:3 * m], data[3 * m:]])
    out = tmp_path / "down.bin"
    s5("cp", "--part-size", "5", f"s3://{bucket}/big.bin", str(out))
    assert out.read_bytes() == data


def test_cp_ls_rm_single(s5, s3, bucket, tmp_path):
    f = tmp_path / "one file.txt"
    f.write_bytes(b"s5cmd")
    s5("cp", str(f), f"s3://{bucket}/x/one file.txt")
    out = s5("ls", f"s3://{bucket}/x/").stdout
    assert "one file.txt" in out
    # Server-side copy. s5cmd escapes a space as '+' in x-amz-copy-source, so
    # the copied key has none (how a server should read '+' there is unclear).
    s5("cp", str(f), f"s3://{bucket}/x/one_file.txt")
    s5("cp", f"s3://{bucket}/x/one_file.txt", f"s3://{bucket}/y/copied.txt")
    assert s3.get_object(Bucket=bucket, Key="y/copied.txt")["Body"].read() == b"s5cmd"
    s5("rm", f"s3://{bucket}/x/one file.txt")
    s5("rm", f"s3://{bucket}/x/one_file.txt")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["y/copied.txt"]
    buckets = s5("ls").stdout
    assert bucket in buckets
