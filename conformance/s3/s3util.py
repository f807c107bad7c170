"""Shared helpers of the S3 conformance harness: configuration, clients, a raw
SigV4 signer (for requests botocore will not make over plain HTTP, such as
aws-chunked bodies), checksums and the in-memory listing model."""

import base64
import datetime
import hashlib
import hmac
import http.client
import os
import random
import urllib.parse
import uuid

import boto3
from botocore.config import Config

REGION = os.environ.get("S3_REGION", "us-east-1")


def endpoint():
    return os.environ["S3_ENDPOINT"]


def access_key():
    return os.environ.get("S3_ACCESS_KEY", "testing")


def secret_key():
    return os.environ.get("S3_SECRET_KEY", "testing")


def target_kind():
    """'moto' when the target is the reference server, 'moto-auth' for the
    self-test's pass against moto with signature checking on, else 'gateway'."""
    return os.environ.get("S3_TARGET", "gateway")


def check_loopback(url):
    host = urllib.parse.urlsplit(url).hostname or ""
    if not (host == "localhost" or host.startswith("127.") or host == "::1"):
        raise SystemExit(f"refusing non-loopback endpoint {url}")


def make_client(url=None, **cfg):
    url = url or endpoint()
    check_loopback(url)
    conf = dict(
        region_name=REGION,
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
    )
    conf.update(cfg)
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=access_key(),
        aws_secret_access_key=secret_key(),
        config=Config(**conf),
    )


def unique_bucket(tag="t"):
    # S3 bucket names: 3-63 chars, lowercase letters, digits, hyphens.
    return f"conf-{tag}-{uuid.uuid4().hex[:16]}"[:63]


def empty_and_delete(client, bucket):
    """Best-effort cleanup: abort uploads, delete every object, delete the bucket."""
    try:
        for _ in range(100):
            r = client.list_multipart_uploads(Bucket=bucket)
            ups = r.get("Uploads", [])
            for u in ups:
                client.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
            if not r.get("IsTruncated"):
                break
    except Exception:
        pass
    try:
        for _ in range(1000):
            r = client.list_objects_v2(Bucket=bucket, MaxKeys=1000)
            keys = [{"Key": o["Key"]} for o in r.get("Contents", [])]
            if not keys:
                break
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    except Exception:
        pass
    try:
        # Versions and delete markers of a versioned bucket.
        for _ in range(1000):
            r = client.list_object_versions(Bucket=bucket, MaxKeys=1000)
            objs = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in r.get("Versions", []) + r.get("DeleteMarkers", [])]
            if not objs:
                break
            client.delete_objects(Bucket=bucket, Delete={"Objects": objs, "Quiet": True})
    except Exception:
        pass
    try:
        client.delete_bucket(Bucket=bucket)
    except Exception:
        pass


def error_code(exc):
    return exc.response.get("Error", {}).get("Code")


def http_status(exc):
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def outcome(fn):
    """("ok",) if fn() succeeds, else ("error", HTTP status, S3 error code)."""
    from botocore.exceptions import ClientError
    try:
        fn()
        return ("ok",)
    except ClientError as e:
        return ("error", http_status(e), error_code(e))


# ---------------------------------------------------------------- checksums

def md5_hex(data):
    return hashlib.md5(data).hexdigest()


def multipart_etag(parts):
    """AWS multipart ETag: MD5 of the concatenated binary MD5s of the parts, then -N."""
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    return f'"{digest}-{len(parts)}"'


def checksum_b64(algo, data):
    from awscrt import checksums as crt

    algo = algo.upper()
    if algo == "CRC32":
        raw = crt.crc32(data).to_bytes(4, "big")
    elif algo == "CRC32C":
        raw = crt.crc32c(data).to_bytes(4, "big")
    elif algo == "CRC64NVME":
        raw = crt.crc64nvme(data).to_bytes(8, "big")
    elif algo == "SHA1":
        raw = hashlib.sha1(data).digest()
    elif algo == "SHA256":
        raw = hashlib.sha256(data).digest()
    else:
        raise ValueError(algo)
    return base64.b64encode(raw).decode()


# ---------------------------------------------------------------- raw SigV4

def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _signing_key(secret, date):
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, REGION)
    k = _hmac(k, "s3")
    return _hmac(k, "aws4_request")


def _uri_encode(s, keep_slash):
    safe = "-_.~" + ("/" if keep_slash else "")
    return urllib.parse.quote(s, safe=safe)


class Raw:
    """A hand-built SigV4 request over http.client, so that headers and body go
    on the wire exactly as written (botocore rewrites or refuses some)."""

    def __init__(self, url=None, ak=None, sk=None):
        self.url = url or endpoint()
        check_loopback(self.url)
        u = urllib.parse.urlsplit(self.url)
        self.host = u.hostname
        self.port = u.port or 80
        self.hostport = u.netloc
        self.ak = ak or access_key()
        self.sk = sk or secret_key()

    def sign(self, method, path, query, headers, payload_hash, when=None):
        """Add Authorization, x-amz-date and x-amz-content-sha256; return
        (signature, amz_date, scope)."""
        when = when or datetime.datetime.now(datetime.timezone.utc)
        amz_date = when.strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        headers["host"] = self.hostport
        headers["x-amz-date"] = amz_date
        headers["x-amz-content-sha256"] = payload_hash
        lower = {k.lower(): str(v).strip() for k, v in headers.items()}
        signed = sorted(lower)
        canon_headers = "".join(f"{k}:{lower[k]}\n" for k in signed)
        q = sorted((_uri_encode(k, False), _uri_encode(v, False)) for k, v in query)
        canon_query = "&".join(f"{k}={v}" for k, v in q)
        canon = "\n".join([
            method, _uri_encode(path, True), canon_query, canon_headers,
            ";".join(signed), payload_hash,
        ])
        scope = f"{date}/{REGION}/s3/aws4_request"
        sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canon.encode()).hexdigest()])
        key = _signing_key(self.sk, date)
        sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.ak}/{scope}, "
            f"SignedHeaders={';'.join(signed)}, Signature={sig}")
        return sig, amz_date, scope, key

    def request(self, method, path, query=(), headers=None, body=b"",
                payload_hash=None, sign=True):
        headers = dict(headers or {})
        if payload_hash is None:
            payload_hash = hashlib.sha256(body).hexdigest()
        if sign:
            self.sign(method, path, query, headers, payload_hash)
        return self.send(method, path, query, headers, body)

    def send(self, method, path, query, headers, body):
        qs = urllib.parse.urlencode(list(query), quote_via=urllib.parse.quote)
        target = _uri_encode(path, True) + (("?" + qs) if qs else "")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            if body or method in ("PUT", "POST"):
                if not any(k.lower() == "content-length" for k in headers):
                    conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            if body:
                conn.send(body)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    # aws-chunked bodies ---------------------------------------------------

    def put_chunked_signed(self, path, data, chunk=64 * 1024, extra_headers=None, query=()):
        """PUT with x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD."""
        headers = {
            "content-encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(data)),
        }
        headers.update(extra_headers or {})
        pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] + [b""]
        sig_len = 64
        total = sum(len(f"{len(p):x};chunk-signature=") + sig_len + 2 + len(p) + 2 for p in pieces)
        headers["content-length"] = str(total)
        prev, amz_date, scope, key = self.sign(
            "PUT", path, query, headers, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
        empty = hashlib.sha256(b"").hexdigest()
        body = b""
        for p in pieces:
            sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, prev, empty,
                             hashlib.sha256(p).hexdigest()])
            prev = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
            body += f"{len(p):x};chunk-signature={prev}\r\n".encode() + p + b"\r\n"
        assert len(body) == total
        return self.send("PUT", path, query, headers, body)

    def put_chunked_unsigned_trailer(self, path, data, algo="CRC32", chunk=64 * 1024,
                                     bad_checksum=False, omit_trailer=False, query=()):
        """PUT with x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER and an
        x-amz-checksum-* trailer, as recent SDKs send over HTTPS
        (`omit_trailer`: announced in x-amz-trailer, but the body ends without it)."""
        name = f"x-amz-checksum-{algo.lower()}"
        value = checksum_b64(algo, data if not bad_checksum else data + b"x")
        headers = {
            "content-encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(data)),
            "x-amz-trailer": name,
            "x-amz-sdk-checksum-algorithm": algo.upper(),
        }
        body = b""
        for i in range(0, len(data), chunk):
            p = data[i:i + chunk]
            body += f"{len(p):x}\r\n".encode() + p + b"\r\n"
        body += b"0\r\n" + (b"" if omit_trailer else f"{name}:{value}\r\n".encode()) + b"\r\n"
        headers["content-length"] = str(len(body))
        self.sign("PUT", path, query, headers, "STREAMING-UNSIGNED-PAYLOAD-TRAILER")
        return self.send("PUT", path, query, headers, body), value


# ---------------------------------------------------------------- listing model

def s3_sort(keys):
    """S3 lists keys in the byte order of their UTF-8 encoding."""
    return sorted(keys, key=lambda k: k.encode("utf-8"))


def model_list(keys, prefix="", delimiter="", start_after=""):
    """Expected full (unpaginated) listing: ordered entries of ('key', k) or
    ('prefix', p), in S3 byte order, as ListObjects returns them."""
    out = []
    seen = set()
    sb = start_after.encode()
    for k in s3_sort(keys):
        if not k.startswith(prefix):
            continue
        if start_after and k.encode() <= sb:
            continue
        rest = k[len(prefix):]
        if delimiter and delimiter in rest:
            cp = prefix + rest[: rest.index(delimiter) + len(delimiter)]
            if start_after and cp.encode() <= sb:
                # AWS skips a common prefix that sorts at or before start-after.
                continue
            if cp not in seen:
                seen.add(cp)
                out.append(("prefix", cp))
        else:
            out.append(("key", k))
    return out


ODD_PIECES = [
    "a", "b", "a b", "sp ace", "caf\u00e9", "\u65e5\u672c", "\U0001F600", "pct%20", "%",
    "plus+plus", "+", "tilde~", "x=y", "semi;colon", "comma,", "amp&", "at@", "dol$",
    "quote'", "paren(1)", "star*", "under_", "dash-", "dot.d", "A", "Z", "0", "9", "~",
    "!bang", "#hash", "[br]", "{c}", "^", "`tick`", "a-b", "a.b", "a0",
]


def random_keys(rng, n, max_depth=3, long_keys=0, sep="/"):
    """Random key set with odd characters. Never produces tree conflicts (a key
    that is also a 'directory' of another key), so it is valid on a
    filesystem-backed gateway too: leaves end with '.o'; directories never do."""
    keys = set()
    attempts = 0
    while len(keys) < n and attempts < n * 20:
        attempts += 1
        depth = rng.randint(0, max_depth)
        parts = [rng.choice(ODD_PIECES) for _ in range(depth)]
        leaf = rng.choice(ODD_PIECES) + ".o"
        keys.add(sep.join(parts + [leaf]))
    for i in range(long_keys):
        # Keys near the 1024-byte limit, components below 255 bytes each.
        comps = [f"L{i}-{j}-" + "x" * 190 for j in range(5)]
        k = "/".join(comps)
        k += "y" * (1022 - 2 * i - len(k.encode())) + ".o"
        keys.add(k)
    return sorted(keys)


def rng_for(seed):
    return random.Random(seed)
