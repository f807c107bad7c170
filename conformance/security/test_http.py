"""Attacks on the public HTTP ports of a running `fskv up` (the front's
listeners of S3, KV, Consul and MQ/SQS, writer and reader, and its admin
port), with real sockets. Standard library only.

Environment: FSKV_ENDPOINTS (the endpoints.json of the cluster), and
optionally FSKV_HEADER_READ_TIMEOUT_MS (the cluster's
`gateway.header_read_timeout_ms`, default 10000). Run by
conformance/security/run.sh (deploy/security-conformance.sh starts a fresh
fskv up). Each test says which attack of issue #18 it plays.
"""

import datetime
import hashlib
import hmac
import json
import os
import socket
import sys
import threading
import time
import unittest
import urllib.parse
import uuid

ENDPOINTS = os.environ.get("FSKV_ENDPOINTS")
HEADER_READ_TIMEOUT_S = int(os.environ.get("FSKV_HEADER_READ_TIMEOUT_MS", "10000")) / 1000.0
# What a closing connection may take beyond the timeout (scheduling on a
# loaded 2-core machine).
SLACK_S = 5.0


def load_endpoints():
    with open(ENDPOINTS) as f:
        return json.load(f)


def host_port(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port


def public_ports(e):
    """(name, host, port) of every public listener."""
    out = []
    for name in ["s3", "s3_reader", "kv", "kv_reader", "consul", "consul_reader", "mq", "mq_reader", "front"]:
        url = e.get(name)
        if url:
            h, p = host_port(url if "://" in url else "http://" + url)
            if (h, p) not in [(x[1], x[2]) for x in out]:
                out.append((name, h, p))
    return out


# ---------- a small SigV4 signer (S3 semantics: no path normalization) ----------


def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _signing_key(secret, date, region, service):
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _canonical_query(params):
    enc = lambda s: urllib.parse.quote(s, safe="-_.~")  # noqa: E731
    return "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(params))


def sign_headers(method, host, path, access, secret, region="us-east-1", service="s3", query=(), payload_hash="UNSIGNED-PAYLOAD",
                 now=None, extra=None):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    headers = {"host": host, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
    headers.update({k.lower(): v for k, v in (extra or {}).items()})
    signed = sorted(headers)
    canonical = "\n".join([
        method, urllib.parse.quote(urllib.parse.unquote(path), safe="/~"), _canonical_query(query), "".join(f"{k}:{headers[k].strip()}\n" for k in signed), ";".join(signed), payload_hash
    ])
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    sig = hmac.new(_signing_key(secret, date, region, service), to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = f"AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders={';'.join(signed)}, Signature={sig}"
    return headers


def presign(method, host, path, access, secret, expires, region="us-east-1", service="s3", now=None):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    scope = f"{date}/{region}/{service}/aws4_request"
    query = [("X-Amz-Algorithm", "AWS4-HMAC-SHA256"), ("X-Amz-Credential", f"{access}/{scope}"), ("X-Amz-Date", amz_date),
             ("X-Amz-Expires", str(expires)), ("X-Amz-SignedHeaders", "host")]
    canonical = "\n".join([method, path, _canonical_query(query), f"host:{host}\n", "host", "UNSIGNED-PAYLOAD"])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    sig = hmac.new(_signing_key(secret, date, region, service), to_sign.encode(), hashlib.sha256).hexdigest()
    return path + "?" + _canonical_query(query + [("X-Amz-Signature", sig)])


# ---------- raw HTTP ----------


def read_response(sock, timeout=10.0):
    """(status, headers dict, body bytes) of one response; reads the body by
    Content-Length (responses here are small)."""
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head ({buf[:200]!r})")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:n]


def request(host, port, method, path, headers=None, body=b"", timeout=10.0, source=None):
    s = socket.create_connection((host, port), timeout=timeout, source_address=(source, 0) if source else None)
    try:
        h = {"Content-Length": str(len(body))}
        h.update(headers or {})
        if not any(k.lower() == "host" for k in h):
            h["Host"] = f"{host}:{port}"
        s.sendall((f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode() + body)
        return read_response(s, timeout)
    finally:
        s.close()


def wait_closed(sock, deadline_s):
    """Seconds until the peer closes `sock` (a response, e.g. 408, may come
    first), or None if it stays open past `deadline_s`."""
    start = time.monotonic()
    sock.settimeout(0.5)
    while time.monotonic() - start < deadline_s:
        try:
            data = sock.recv(65536)
            if not data:
                return time.monotonic() - start
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - start
    return None


def honest_get_rate(case, bucket, seconds=3.0, threads=4):
    """Signed S3 GETs of `bucket`/obj4k (4 KiB) per second by `threads`
    threads for `seconds`, through `case.s3`; any failed GET fails `case`."""
    counts = [0] * threads
    errors = []
    end = time.monotonic() + seconds

    def worker(i):
        while time.monotonic() < end:
            try:
                st, _, body = case.s3("GET", f"/{bucket}/obj4k")
                if st != 200 or len(body) != 4096:
                    errors.append(st)
                else:
                    counts[i] += 1
            except OSError as err:
                errors.append(repr(err))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    case.assertEqual(errors, [], "honest requests failed")
    return sum(counts) / seconds


# Measured figures, printed once after the tests (not inside unittest's
# "... ok" lines, which run.sh counts).
FIGURES = []


class S3Case(unittest.TestCase):
    """A test class with a bucket holding a 4 KiB object `obj4k` and signed
    S3 requests with the cluster's admin key; prints FIGURES at its end."""
    BUCKET_PREFIX = "sec-"
    FIGURES = FIGURES

    @classmethod
    def setUpClass(cls):
        cls.e = load_endpoints()
        cls.s3_host, cls.s3_port = host_port(cls.e["s3"])
        cls.ak, cls.sk = cls.e["access_key"], cls.e["secret_key"]
        cls.bucket = cls.BUCKET_PREFIX + uuid.uuid4().hex[:12]
        st, _, body = cls.s3("PUT", f"/{cls.bucket}")
        assert st == 200, (st, body)
        st, _, body = cls.s3("PUT", f"/{cls.bucket}/obj4k", body=b"x" * 4096)
        assert st == 200, (st, body)

    @classmethod
    def tearDownClass(cls):
        for line in cls.FIGURES:
            sys.stderr.write(line + "\n")

    @classmethod
    def s3(cls, method, path, body=b"", query=(), extra=None, source=None, host_port_=None):
        host, port = host_port_ or (cls.s3_host, cls.s3_port)
        h = sign_headers(method, f"{host}:{port}", path, cls.ak, cls.sk, query=query, extra=extra)
        target = path + ("?" + _canonical_query(query) if query else "")
        return request(host, port, method, target, h, body, source=source)


@unittest.skipUnless(ENDPOINTS, "FSKV_ENDPOINTS not set (run through conformance/security/run.sh)")
class PublicPorts(S3Case):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ports = public_ports(cls.e)

    # --- slow-loris: half a header, and a header trickled forever ---

    def test_half_and_trickled_headers_are_cut_on_every_public_port(self):
        """Attack: a connection that sends half a request header and then
        nothing (or a byte every 0.5 s, forever) must be closed within
        header_read_timeout on every public port."""
        results = {}

        def play(name, host, port, trickle):
            s = socket.create_connection((host, port), timeout=5)
            try:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                if not trickle:
                    results[(name, trickle)] = wait_closed(s, HEADER_READ_TIMEOUT_S + SLACK_S)
                    return
                start = time.monotonic()
                while time.monotonic() - start < HEADER_READ_TIMEOUT_S + SLACK_S:
                    try:
                        s.sendall(b"a")
                    except (BrokenPipeError, ConnectionResetError):
                        results[(name, trickle)] = time.monotonic() - start
                        return
                    closed = wait_closed(s, 0.5)
                    if closed is not None:
                        results[(name, trickle)] = time.monotonic() - start
                        return
                results[(name, trickle)] = None
            finally:
                s.close()

        threads = [threading.Thread(target=play, args=(n, h, p, t)) for (n, h, p) in self.ports for t in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(HEADER_READ_TIMEOUT_S + 3 * SLACK_S)
        self.assertEqual(len(results), 2 * len(self.ports), results)
        for (name, trickle), took in sorted(results.items()):
            with self.subTest(port=name, trickle=trickle):
                self.assertIsNotNone(took, f"{name}: {'trickled' if trickle else 'half'} header still open after "
                                           f"{HEADER_READ_TIMEOUT_S + SLACK_S:.0f} s")
                self.assertLessEqual(took, HEADER_READ_TIMEOUT_S + SLACK_S)

    def test_honest_clients_keep_their_throughput_during_a_slowloris(self):
        """Attack: 400 slow-loris connections from another address (127.0.0.2)
        held open on the S3 port, each trickling a byte a second, reopened
        as they are cut (by another process). Honest signed GETs
        from 127.0.0.1 keep >= 0.8 of their rate without the attack (rounds
        interleaved: quiet, attack, quiet, attack)."""
        def attacker(stop, ready, host, port):
            # A separate process (no share of this process's GIL); each
            # connection trickles a byte a second and is reopened when cut.
            held = []
            while not stop.is_set():
                while len(held) < 400 and not stop.is_set():
                    try:
                        c = socket.create_connection((host, port), timeout=2, source_address=("127.0.0.2", 0))
                        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                        held.append(c)
                    except OSError:
                        time.sleep(0.01)
                        break
                if len(held) >= 400:
                    ready.set()
                for c in list(held):
                    try:
                        c.sendall(b"a")
                    except OSError:
                        held.remove(c)
                        c.close()
                stop.wait(1.0)
            for c in held:
                c.close()

        import multiprocessing
        ctx = multiprocessing.get_context("fork")
        quiet, attacked = [], []
        for _ in range(2):
            quiet.append(honest_get_rate(self, self.bucket))
            stop, ready = ctx.Event(), ctx.Event()
            proc = ctx.Process(target=attacker, args=(stop, ready, self.s3_host, self.s3_port))
            proc.start()
            self.assertTrue(ready.wait(15), "the attacker could not hold 400 connections")
            attacked.append(honest_get_rate(self, self.bucket))
            stop.set()
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        ratio = (sum(attacked) / len(attacked)) / (sum(quiet) / len(quiet))
        FIGURES.append(f"slowloris: honest GET 4K rate quiet {quiet} /s, under 400 slow connections {attacked} /s, ratio {ratio:.2f}")
        self.assertGreaterEqual(ratio, 0.8, f"honest throughput fell to {ratio:.2f} of quiet")

    # --- oversized requests ---

    def test_oversized_headers_and_uris_are_refused_on_every_public_port(self):
        """Attack: a 100 KiB header and a 32 KiB request target: 431 / 414
        (or the connection closed), never a hang, on every public port."""
        for name, host, port in self.ports:
            with self.subTest(port=name, what="header"):
                try:
                    st, _, _ = request(host, port, "GET", "/", {"X-Big": "a" * (100 << 10)})
                    self.assertEqual(st, 431)
                except (ConnectionError, BrokenPipeError, ConnectionResetError):
                    pass
            with self.subTest(port=name, what="uri"):
                try:
                    st, _, _ = request(host, port, "GET", "/" + "a" * (32 << 10))
                    self.assertIn(st, (414, 431))
                except (ConnectionError, BrokenPipeError, ConnectionResetError):
                    pass
            with self.subTest(port=name, what="many headers"):
                try:
                    st, _, _ = request(host, port, "GET", "/", {f"X-H{i}": "v" for i in range(300)})
                    self.assertEqual(st, 431)
                except (ConnectionError, BrokenPipeError, ConnectionResetError):
                    pass

    def _refused_before_body(self, method, path, headers, host=None, port=None):
        """Sends only the head of a request announcing 512 MiB; the answer
        must come without the body being sent."""
        host, port = host or self.s3_host, port or self.s3_port
        s = socket.create_connection((host, port), timeout=10)
        try:
            h = {"Host": f"{host}:{port}", "Content-Length": str(512 << 20)}
            h.update(headers)
            s.sendall((f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode())
            start = time.monotonic()
            st, _, body = read_response(s, timeout=10)
            return st, body, time.monotonic() - start
        finally:
            s.close()

    def test_unauthenticated_large_bodies_are_refused_before_the_body_is_read(self):
        """Attack: an unsigned 512 MiB multipart/form-data POST (browser
        upload form) and an unsigned 512 MiB PUT to the S3 port: refused
        at once from the head, the body never read; and the same on KV and MQ."""
        cases = [
            ("S3 form POST", "POST", f"/{self.bucket}", {"Content-Type": "multipart/form-data; boundary=xyz"}, None),
            ("S3 unsigned PUT", "PUT", f"/{self.bucket}/big", {}, None),
            ("S3 SigV2 PUT", "PUT", f"/{self.bucket}/big2", {"Authorization": f"AWS {self.ak}:c2lnbmF0dXJl"}, None),
        ]
        kv_host, kv_port = host_port(self.e["kv"])
        cases.append(("KV unauthenticated PUT", "PUT", "/v1/kv/secns/k", {}, (kv_host, kv_port)))
        mq_host, mq_port = host_port(self.e["mq"])
        cases.append(("MQ unauthenticated produce", "POST", "/v1/topics/sectopic/records", {}, (mq_host, mq_port)))
        for what, method, path, headers, hp in cases:
            with self.subTest(what=what):
                host, port = hp or (None, None)
                st, body, took = self._refused_before_body(method, path, headers, host, port)
                self.assertIn(st, (400, 401, 403, 411, 413), f"{what}: {st} {body[:200]!r}")
                self.assertLess(took, 5.0, f"{what}: the refusal took {took:.1f} s")
        st, _, body = self.s3("GET", f"/{self.bucket}", query=[("list-type", "2")])
        self.assertEqual(st, 200)
        self.assertNotIn(b"<Key>big", body, "nothing of the refused uploads is visible")

    def test_oversized_batches_are_refused_without_being_buffered(self):
        """Attack: batch headers that claim 2^31 items (KV batch get, MQ
        produce), and a KV batch put announcing 8 GiB: refused (4xx), fast,
        and the gateway keeps serving."""
        import struct
        kv_host, kv_port = host_port(self.e["kv"])
        auth = {"Authorization": f"Bearer {self.e['bearer_token']}"}
        ns = "secbatch" + uuid.uuid4().hex[:6]
        st, _, body = request(kv_host, kv_port, "PUT", f"/v1/ns/{ns}", auth, b"")
        self.assertIn(st, (200, 201, 204), body)
        huge = b"FKVB" + struct.pack("<BBHII", 1, 1, 0, 0x7FFFFFFF, 0)
        start = time.monotonic()
        st, _, body = request(kv_host, kv_port, "POST", f"/v1/kv/{ns}?batch=get", auth, huge)
        self.assertEqual(st, 400, body)
        put = b"FKVB" + struct.pack("<BBHII", 1, 2, 0, 1, 0) + struct.pack("<HBB", 1, 0, 0) + b"k" + struct.pack("<Q", 8 << 30)
        st, _, body = request(kv_host, kv_port, "POST", f"/v1/kv/{ns}?batch=put", auth, put)
        self.assertGreaterEqual(st, 400, body)
        self.assertLess(st, 500, body)
        self.assertLess(time.monotonic() - start, 5.0)
        st, _, _ = request(kv_host, kv_port, "GET", f"/v1/ns/{ns}", auth)
        self.assertEqual(st, 200, "the KV gateway still serves")

        mq_host, mq_port = host_port(self.e["mq"])
        topic = "secbatch" + uuid.uuid4().hex[:6]
        spec = json.dumps({"partitions": 1}).encode()
        h = sign_headers("PUT", f"{mq_host}:{mq_port}", f"/v1/topics/{topic}", self.ak, self.sk, service="mq",
                         payload_hash=hashlib.sha256(spec).hexdigest())
        st, _, body = request(mq_host, mq_port, "PUT", f"/v1/topics/{topic}", h, spec)
        self.assertIn(st, (200, 201), body)
        batch = b"FMQ1" + struct.pack("<Iqhhiq", 0x7FFFFFFF, -1, 0, 0, 0, 0)
        path = f"/v1/topics/{topic}/partitions/0/records"
        h = sign_headers("POST", f"{mq_host}:{mq_port}", path, self.ak, self.sk, service="mq",
                         payload_hash=hashlib.sha256(batch).hexdigest(), extra={"content-type": "application/vnd.fskv.mq.batch"})
        st, _, body = request(mq_host, mq_port, "POST", path, h, batch)
        self.assertGreaterEqual(st, 400, body)
        self.assertLess(st, 500, body)

    # --- credentials ---

    def test_sigv2_is_refused(self):
        """Attack: SigV2 (no expiry, replayable) in the header and the query."""
        st, _, body = request(self.s3_host, self.s3_port, "GET", f"/{self.bucket}/obj4k",
                              {"Authorization": f"AWS {self.ak}:c2lnbmF0dXJl", "Date": "Tue, 01 Dec 2026 00:00:00 GMT"})
        self.assertEqual(st, 400, body)
        self.assertIn(b"InvalidRequest", body)
        st, _, body = request(self.s3_host, self.s3_port, "GET",
                              f"/{self.bucket}/obj4k?AWSAccessKeyId={self.ak}&Expires=9999999999&Signature=c2ln")
        self.assertEqual(st, 400, body)

    def test_presigned_urls_valid_over_7_days_are_refused(self):
        """Attack: a presigned URL valid for 140 days; 7 days is the cap.
        Positive control: the same URL valid 1 hour works."""
        hostport = f"{self.s3_host}:{self.s3_port}"
        ok = presign("GET", hostport, f"/{self.bucket}/obj4k", self.ak, self.sk, 3600)
        st, _, body = request(self.s3_host, self.s3_port, "GET", ok)
        self.assertEqual((st, len(body)), (200, 4096))
        week = presign("GET", hostport, f"/{self.bucket}/obj4k", self.ak, self.sk, 604800)
        self.assertEqual(request(self.s3_host, self.s3_port, "GET", week)[0], 200)
        for secs in (604801, 140 * 86400):
            st, _, body = request(self.s3_host, self.s3_port, "GET",
                                  presign("GET", hostport, f"/{self.bucket}/obj4k", self.ak, self.sk, secs))
            self.assertIn(st, (400, 403), f"X-Amz-Expires={secs}: {st}")
            self.assertNotEqual(len(body), 4096)

    def test_credential_scope_must_name_our_region_and_service(self):
        """A correct signature under another region or service is refused."""
        host, port = self.s3_host, self.s3_port
        for region, service in [("eu-west-1", "s3"), ("us-east-1", "sqs")]:
            with self.subTest(region=region, service=service):
                h = sign_headers("GET", f"{host}:{port}", f"/{self.bucket}/obj4k", self.ak, self.sk, region=region, service=service)
                st, _, body = request(host, port, "GET", f"/{self.bucket}/obj4k", h)
                self.assertIn(st, (400, 403), body)
                self.assertNotEqual(len(body), 4096)

    def test_a_wrong_secret_and_an_unknown_key_are_refused_on_every_protocol(self):
        host, port = self.s3_host, self.s3_port
        h = sign_headers("GET", f"{host}:{port}", f"/{self.bucket}/obj4k", self.ak, self.sk + "x")
        self.assertEqual(request(host, port, "GET", f"/{self.bucket}/obj4k", h)[0], 403)
        h = sign_headers("GET", f"{host}:{port}", f"/{self.bucket}/obj4k", "NOSUCHKEY", self.sk)
        self.assertEqual(request(host, port, "GET", f"/{self.bucket}/obj4k", h)[0], 403)
        kv_host, kv_port = host_port(self.e["kv"])
        st, _, _ = request(kv_host, kv_port, "GET", "/v1/kv/secns/k", {"Authorization": "Bearer fskv-not-a-token"})
        self.assertIn(st, (401, 403))

    def test_error_bodies_carry_no_internal_detail(self):
        """Error responses name an error code, not a file path, a backtrace
        or an internal address."""
        bad = [
            self.s3("GET", f"/{self.bucket}/no-such-object"),
            self.s3("GET", "/no-such-bucket-" + uuid.uuid4().hex[:8] + "/x"),
            request(self.s3_host, self.s3_port, "GET", f"/{self.bucket}/obj4k", {"Authorization": "AWS4-HMAC-SHA256 garbage"}),
        ]
        for st, _, body in bad:
            self.assertGreaterEqual(st, 400)
            for leak in (b"/tmp/", b"/work/", b"panicked", b"src/", b".rs:", b"127.0.0.1:"):
                self.assertNotIn(leak, body, f"{st}: {body[:300]!r}")

    # --- path tricks ---

    def test_path_tricks_stay_inside_the_bucket(self):
        """Keys with `..`, `.`, encoded slashes and NUL: refused or stored as
        plain keys of this bucket, never a path outside it."""
        other = "sec-other-" + uuid.uuid4().hex[:8]
        self.assertEqual(self.s3("PUT", f"/{other}")[0], 200)
        tricks = ["../" + other + "/escaped", "..%2F" + other + "%2Fescaped2", "a/../../" + other + "/escaped3", "./dot", "nul%00byte",
                  "%2e%2e/" + other + "/escaped4"]
        for key in tricks:
            with self.subTest(key=key):
                st, _, body = self.s3("PUT", f"/{self.bucket}/{key}", body=b"trick")
                self.assertIn(st, (200, 400), body)
        st, _, body = self.s3("GET", f"/{other}", query=[("list-type", "2")])
        self.assertEqual(st, 200)
        self.assertNotIn(b"<Key>", body, f"a key escaped into another bucket: {body[:400]!r}")
        st, _, body = self.s3("GET", "/")
        self.assertEqual(st, 200)
        self.assertNotIn(b"<Name>escaped", body)
        self.assertNotIn(b"<Name>..", body)

    def test_path_tricks_on_kv_and_mq_names(self):
        """Namespace and topic names that are paths are refused (4xx), and
        create nothing."""
        kv_host, kv_port = host_port(self.e["kv"])
        token = self.e.get("bearer_token")
        auth = {"Authorization": f"Bearer {token}"}
        for ns in ["..", ".", "%2e%2e", "a%2Fb", "..%2F..%2Fetc"]:
            with self.subTest(kv_namespace=ns):
                st, _, body = request(kv_host, kv_port, "PUT", f"/v1/ns/{ns}", auth, b"")
                self.assertGreaterEqual(st, 400, body)
                self.assertLess(st, 500, body)
        st, _, body = request(kv_host, kv_port, "GET", "/v1/ns", auth)
        self.assertEqual(st, 200, body)
        self.assertNotIn(b'".."', body)
        mq_host, mq_port = host_port(self.e["mq"])
        for topic in ["..", "%2e%2e", "a%2Fb", "..%2F..%2Fetc"]:
            with self.subTest(mq_topic=topic):
                path = f"/v1/topics/{topic}"
                h = sign_headers("PUT", f"{mq_host}:{mq_port}", path, self.ak, self.sk, service="mq", payload_hash=hashlib.sha256(b"{}").hexdigest())
                st, _, body = request(mq_host, mq_port, "PUT", path, h, b"{}")
                self.assertGreaterEqual(st, 400, body)
                self.assertLess(st, 500, body)


if __name__ == "__main__":
    unittest.main()
