"""py-consul (PyPI, unchanged client code) against the KV gateway's Consul API.

Environment: CONSUL_URL (the writer's Consul API), CONSUL_READER_URL, KV_TOKEN.
"""

import os
import threading
import time
import unittest
import urllib.parse

try:
    import consul
except ImportError:  # reported as skipped by run.sh
    consul = None

URL, READER, TOKEN = os.environ.get("CONSUL_URL"), os.environ.get("CONSUL_READER_URL"), os.environ.get("KV_TOKEN")


def client(url):
    u = urllib.parse.urlsplit(url)
    return consul.Consul(host=u.hostname, port=u.port, token=TOKEN)


@unittest.skipUnless(consul is not None and URL and TOKEN, "py-consul or CONSUL_URL / KV_TOKEN missing")
class ConsulTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = client(URL)
        cls.r = client(READER or URL)
        cls.c.kv.delete("pyc/", recurse=True)

    def test_put_get_flags(self):
        self.assertTrue(self.c.kv.put("pyc/a", "1", flags=7))
        index, data = self.r.kv.get("pyc/a")
        self.assertEqual((data["Key"], data["Value"], data["Flags"]), ("pyc/a", b"1", 7))
        self.assertGreater(int(index), 0)
        self.assertEqual(self.r.kv.get("pyc/missing")[1], None)

    def test_recurse_and_keys(self):
        for k in ("pyc/r/x", "pyc/r/y/1", "pyc/r/y/2"):
            self.c.kv.put(k, k)
        _, items = self.r.kv.get("pyc/r/", recurse=True)
        self.assertEqual([i["Key"] for i in items], ["pyc/r/x", "pyc/r/y/1", "pyc/r/y/2"])
        _, keys = self.r.kv.get("pyc/r/", keys=True, separator="/")
        self.assertEqual(keys, ["pyc/r/x", "pyc/r/y/"])

    def test_cas(self):
        self.assertTrue(self.c.kv.put("pyc/cas", "0", cas=0))
        self.assertFalse(self.c.kv.put("pyc/cas", "x", cas=0))
        _, d = self.c.kv.get("pyc/cas")
        self.assertFalse(self.c.kv.put("pyc/cas", "stale", cas=d["ModifyIndex"] - 1))
        self.assertTrue(self.c.kv.put("pyc/cas", "1", cas=d["ModifyIndex"]))
        self.assertEqual(self.c.kv.get("pyc/cas")[1]["Value"], b"1")

    def test_cas_counter_no_lost_update(self):
        self.c.kv.put("pyc/counter", "0")

        def worker():
            c = client(URL)
            for _ in range(5):
                while True:
                    _, d = c.kv.get("pyc/counter")
                    if c.kv.put("pyc/counter", str(int(d["Value"]) + 1), cas=d["ModifyIndex"]):
                        break

        ts = [threading.Thread(target=worker) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(self.c.kv.get("pyc/counter")[1]["Value"], b"20")

    def test_delete(self):
        self.c.kv.put("pyc/d/1", "x")
        self.c.kv.put("pyc/d/2", "x")
        self.assertTrue(self.c.kv.delete("pyc/d/1"))
        self.assertIsNone(self.c.kv.get("pyc/d/1")[1])
        self.assertTrue(self.c.kv.delete("pyc/d/", recurse=True))
        self.assertIsNone(self.c.kv.get("pyc/d/", recurse=True)[1])

    def test_blocking_query(self):
        self.c.kv.put("pyc/watch", "a")
        index, _ = self.r.kv.get("pyc/watch")
        out = {}

        def wait():
            t = time.time()
            out["res"] = self.r.kv.get("pyc/watch", index=index, wait="10s")
            out["t"] = time.time() - t

        th = threading.Thread(target=wait)
        th.start()
        time.sleep(0.3)
        self.c.kv.put("pyc/watch", "b")
        th.join(15)
        new_index, d = out["res"]
        self.assertEqual(d["Value"], b"b")
        self.assertNotEqual(new_index, index)
        self.assertLess(out["t"], 5)
        # No change: answers after the wait with the same index.
        t = time.time()
        same, _ = self.r.kv.get("pyc/watch", index=new_index, wait="500ms")
        self.assertEqual(same, new_index)
        self.assertGreaterEqual(time.time() - t, 0.4)


if __name__ == "__main__":
    unittest.main()
