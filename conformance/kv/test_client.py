"""The Python client (clients/python/fskv_kv.py) against a running KV gateway.

Environment: KV_URL (writer), KV_READER_URL, KV_TOKEN (a bearer token).
Run by conformance/kv/run.sh (deploy/kv-conformance.sh starts a fresh fskv up).
"""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
from fskv_kv import KvClient, KvError, Status  # noqa: E402

URL, READER, TOKEN = os.environ.get("KV_URL"), os.environ.get("KV_READER_URL"), os.environ.get("KV_TOKEN")


@unittest.skipUnless(URL and TOKEN, "KV_URL / KV_TOKEN not set (run through conformance/kv/run.sh)")
class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = KvClient(URL, TOKEN)
        cls.r = KvClient(READER or URL, TOKEN)
        cls.w.put_namespace("py")

    @classmethod
    def tearDownClass(cls):
        cls.w.close()
        cls.r.close()

    def test_put_get_head_delete(self):
        key = b"bin\x00\xff/key"
        v1 = self.w.put("py", key, b"hello")
        self.assertEqual(self.r.get("py", key), b"hello")
        self.assertEqual(self.r.head("py", key), (5, v1))
        self.assertEqual(self.r.get("py", key, range=(1, 3)), b"ell")
        with self.assertRaises(KvError) as e:
            self.w.put("py", key, b"x", if_absent=True)
        self.assertEqual(e.exception.status, 412)
        v2 = self.w.put("py", key, b"world", if_match=v1)
        with self.assertRaises(KvError) as e:
            self.w.put("py", key, b"lost", if_match=v1)
        self.assertEqual(e.exception.code, "PreconditionFailed")
        self.assertEqual(self.w.get_with_version("py", key), (b"world", v2))
        self.assertFalse(self.w.delete("py", b"missing"))
        self.assertTrue(self.w.delete("py", key, if_match=v2))
        self.assertIsNone(self.r.get("py", key))

    def test_reader_refuses_writes(self):
        if not READER:
            self.skipTest("no reader")
        with self.assertRaises(KvError) as e:
            self.r.put("py", b"k", b"v")
        self.assertEqual((e.exception.status, e.exception.code), (403, "ReadOnlyGateway"))

    def test_get_into_large_value(self):
        value = os.urandom(3 << 20) * 2  # 6 MiB: streamed by the gateway
        self.w.put("py", b"large", value)
        buf = bytearray(8 << 20)
        n = self.r.get_into("py", b"large", buf, offset=100)
        self.assertEqual(n, len(value))
        self.assertEqual(bytes(buf[100 : 100 + n]), value)
        self.assertEqual(self.r.get_into("py", b"nope", buf), -1)
        with self.assertRaises(ValueError):
            self.r.get_into("py", b"large", bytearray(10))
        # The connection stays usable after the refused read.
        self.assertEqual(self.r.get_into("py", b"large", buf), len(value))

    def test_batches_of_128_and_prefix_exists(self):
        keys = [b"blk-%04d" % i for i in range(160)]
        pairs = [(k, bytes([i % 256]) * 1000) for i, k in enumerate(keys[:128])]
        self.assertEqual(self.w.batch_put("py", pairs, if_absent=True), [Status.OK] * 128)
        # Create-only again: Exists (a success for idempotent writers).
        self.assertEqual(set(self.w.batch_put("py", pairs[:5], if_absent=True)), {Status.EXISTS})
        statuses, prefix = self.r.batch_exists("py", keys, prefix=False)
        self.assertEqual(prefix, 128)
        self.assertEqual(statuses[128], Status.NOT_FOUND)
        statuses, prefix = self.r.batch_exists("py", keys, prefix=True, lease_ms=2000)
        self.assertEqual((prefix, statuses[129]), (128, Status.SKIPPED))
        values = self.r.batch_get("py", keys[:130])
        self.assertEqual(values[:128], [v for _, v in pairs])
        self.assertEqual(values[128:], [None, None])
        bufs = [bytearray(1000) for _ in range(3)]
        self.assertEqual(self.r.batch_get_into("py", [keys[0], b"nope", keys[2]], bufs), [1000, -1, 1000])
        self.assertEqual(bytes(bufs[2]), pairs[2][1])
        page, more = self.r.scan("py", b"blk-", limit=100)
        self.assertTrue(more)
        self.assertEqual([k for k, _ in page], keys[:100])
        self.assertEqual(self.r.scan_all("py", b"blk-"), keys[:128])
        self.assertEqual(self.w.batch_delete("py", keys[:2] + [b"nope"]), [Status.OK, Status.OK, Status.NOT_FOUND])
        self.assertEqual(self.w.delete_prefix("py", b"blk-"), 126)
        self.assertEqual(self.r.scan_all("py", b"blk-"), [])

    def test_ttl(self):
        self.w.put("py", b"ttl", b"x", ttl_ms=300)
        self.assertEqual(self.w.get("py", b"ttl"), b"x")
        # Expiry is judged on the gateways' wall clock, the sleep on this
        # process's monotonic one: allow them to drift apart by up to 3 s
        # (one CI run saw the value 400 ms later), but the key must go.
        time.sleep(0.4)
        deadline = time.monotonic() + 3.0
        while self.r.get("py", b"ttl") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertIsNone(self.r.get("py", b"ttl"))

    def test_errors(self):
        with self.assertRaises(KvError) as e:
            self.w.get("nosuchns", b"k")
        self.assertEqual((e.exception.status, e.exception.code), (404, "NoSuchNamespace"))
        with self.assertRaises(KvError) as e:
            self.w.put("py", b"k" * 5000, b"v")
        self.assertEqual((e.exception.status, e.exception.code), (400, "KeyTooLong"))
        bad = KvClient(URL, "wrong-token")
        with self.assertRaises(KvError) as e:
            bad.get("py", b"k")
        bad.close()
        self.assertIn(e.exception.status, (401, 403))

    def test_concurrent_cas_counter(self):
        self.w.put("py", b"counter", b"0")
        errors = []

        def worker():
            c = KvClient(URL, TOKEN)
            try:
                for _ in range(5):
                    while True:
                        v, ver = c.get_with_version("py", b"counter")
                        try:
                            c.put("py", b"counter", str(int(v) + 1).encode(), if_match=ver)
                            break
                        except KvError as e:
                            if e.status != 412:
                                raise
            except Exception as e:  # noqa: BLE001
                errors.append(e)
            finally:
                c.close()

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(self.w.get("py", b"counter"), b"20")


if __name__ == "__main__":
    unittest.main()
