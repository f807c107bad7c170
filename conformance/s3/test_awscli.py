"""awscli (v1) as a client: aws s3 cp/ls/sync/rm/mb/rb, s3api calls, presign."""

import hashlib
import json
import os

import pytest
import requests

import s3util
from conftest import run_cli, tool


@pytest.fixture
def aws(cli_env):
    exe = tool("aws")

    def run(*args, check=True):
        return run_cli(cli_env, [exe, "--endpoint-url", s3util.endpoint(), *args], check=check)
    return run


def test_mb_ls_rb(aws, s3):
    name = s3util.unique_bucket("cli")
    aws("s3", "mb", f"s3://{name}")
    try:
        assert name in aws("s3", "ls").stdout
    finally:
        aws("s3", "rb", f"s3://{name}", "--force")
    assert name not in aws("s3", "ls").stdout


def test_cp_up_down_and_ls(aws, s3, bucket, tmp_path):
    small = tmp_path / "small file.txt"
    small.write_bytes(b"hello awscli\n")
    big = tmp_path / "big.bin"
    data = os.urandom(20 * 1024 * 1024)
    big.write_bytes(data)
    aws("s3", "cp", str(small), f"s3://{bucket}/dir one/small file.txt")
    aws("s3", "cp", str(big), f"s3://{bucket}/dir one/big.bin")  # multipart (8 MiB parts)
    h = s3.head_object(Bucket=bucket, Key="dir one/big.bin")
    assert h["ContentLength"] == len(data)
    assert h["ETag"].endswith('-3"')
    out = aws("s3", "ls", f"s3://{bucket}/dir one/").stdout
    assert "small file.txt" in out and "big.bin" in out
    out = aws("s3", "ls", f"s3://{bucket}/", "--recursive").stdout
    assert "dir one/small file.txt" in out
    down = tmp_path / "down.bin"
    aws("s3", "cp", f"s3://{bucket}/dir one/big.bin", str(down))
    assert hashlib.sha256(down.read_bytes()).digest() == hashlib.sha256(data).digest()
    aws("s3", "cp", f"s3://{bucket}/dir one/small file.txt", f"s3://{bucket}/copied \u00e9.txt")
    assert s3.get_object(Bucket=bucket, Key="copied \u00e9.txt")["Body"].read() == b"hello awscli\n"


def test_sync_and_rm(aws, s3, bucket, tmp_path):
    src = tmp_path / "src"
    files = {"a.txt": b"a", "sub/b c.txt": b"bc", "sub/deeper/\u00fc+%.txt": b"odd", "z": b"z" * 3000}
    for rel, body in files.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body)
        # Older than the upload, so that the second sync sees nothing newer
        # (LastModified has one-second resolution).
        os.utime(p, (p.stat().st_atime - 3600, p.stat().st_mtime - 3600))
    aws("s3", "sync", str(src), f"s3://{bucket}/s")
    listed = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert listed == {f"s/{k}": len(v) for k, v in files.items()}
    # A second sync transfers nothing.
    out = aws("s3", "sync", str(src), f"s3://{bucket}/s").stdout
    assert "upload:" not in out
    dst = tmp_path / "dst"
    aws("s3", "sync", f"s3://{bucket}/s", str(dst))
    for rel, body in files.items():
        assert (dst / rel).read_bytes() == body
    (src / "a.txt").unlink()
    aws("s3", "sync", str(src), f"s3://{bucket}/s", "--delete")
    assert "s/a.txt" not in {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    aws("s3", "rm", f"s3://{bucket}/s", "--recursive")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_s3api_calls(aws, bucket, tmp_path):
    f = tmp_path / "body"
    f.write_bytes(b"s3api body")
    r = json.loads(aws("s3api", "put-object", "--bucket", bucket, "--key", "api/k+1",
                       "--body", str(f), "--metadata", "x=y").stdout)
    assert r["ETag"] == '"%s"' % hashlib.md5(b"s3api body").hexdigest()
    r = json.loads(aws("s3api", "head-object", "--bucket", bucket, "--key", "api/k+1").stdout)
    assert r["ContentLength"] == 10 and r["Metadata"] == {"x": "y"}
    out = tmp_path / "out"
    aws("s3api", "get-object", "--bucket", bucket, "--key", "api/k+1", "--range", "bytes=0-4", str(out))
    assert out.read_bytes() == b"s3api"
    r = json.loads(aws("s3api", "list-objects-v2", "--bucket", bucket, "--prefix", "api/").stdout)
    assert [o["Key"] for o in r["Contents"]] == ["api/k+1"]
    r = json.loads(aws("s3api", "list-objects", "--bucket", bucket, "--delimiter", "/").stdout)
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["api/"]
    r = json.loads(aws("s3api", "get-bucket-location", "--bucket", bucket).stdout)
    assert r.get("LocationConstraint") in (None, "", s3util.REGION)
    aws("s3api", "put-object-tagging", "--bucket", bucket, "--key", "api/k+1",
        "--tagging", "TagSet=[{Key=t,Value=v}]")
    r = json.loads(aws("s3api", "get-object-tagging", "--bucket", bucket, "--key", "api/k+1").stdout)
    assert r["TagSet"] == [{"Key": "t", "Value": "v"}]
    r = json.loads(aws("s3api", "list-object-versions", "--bucket", bucket).stdout)
    assert [(v["Key"], v["VersionId"]) for v in r["Versions"]] == [("api/k+1", "null")]
    aws("s3api", "delete-object", "--bucket", bucket, "--key", "api/k+1")
    r = aws("s3api", "head-object", "--bucket", bucket, "--key", "api/k+1", check=False)
    assert r.returncode != 0 and ("404" in r.stderr or "Not Found" in r.stderr)


def test_s3api_multipart(aws, s3, bucket, tmp_path):
    up = json.loads(aws("s3api", "create-multipart-upload", "--bucket", bucket, "--key", "mp").stdout)
    uid = up["UploadId"]
    p1 = tmp_path / "p1"
    p1.write_bytes(os.urandom(5 * 1024 * 1024))
    p2 = tmp_path / "p2"
    p2.write_bytes(b"last")
    e2 = json.loads(aws("s3api", "upload-part", "--bucket", bucket, "--key", "mp", "--upload-id", uid,
                        "--part-number", "2", "--body", str(p2)).stdout)["ETag"]
    e1 = json.loads(aws("s3api", "upload-part", "--bucket", bucket, "--key", "mp", "--upload-id", uid,
                        "--part-number", "1", "--body", str(p1)).stdout)["ETag"]
    parts = json.loads(aws("s3api", "list-parts", "--bucket", bucket, "--key", "mp",
                           "--upload-id", uid).stdout)["Parts"]
    assert [p["PartNumber"] for p in parts] == [1, 2]
    spec = tmp_path / "mpu.json"
    spec.write_text(json.dumps({"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]}))
    r = json.loads(aws("s3api", "complete-multipart-upload", "--bucket", bucket, "--key", "mp",
                       "--upload-id", uid, "--multipart-upload", f"file://{spec}").stdout)
    assert r["ETag"] == s3util.multipart_etag([p1.read_bytes(), b"last"])


def test_presign(aws, s3, bucket):
    s3.put_object(Bucket=bucket, Key="p r", Body=b"presigned by awscli")
    url = aws("s3", "presign", f"s3://{bucket}/p r", "--expires-in", "300").stdout.strip()
    assert url.startswith(s3util.endpoint())
    r = requests.get(url, timeout=30)
    assert r.status_code == 200, r.text
    assert r.content == b"presigned by awscli"
