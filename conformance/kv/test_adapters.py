"""The KV-cache engine adapters (clients/python/sglang_fskv.py, lmcache_fskv.py)
against a running KV gateway, without torch (runs in CI through run.sh).

Real: the gateway (an `fskv up`), the thin client, the adapters' own code —
key mapping, rank isolation, batching and request splitting, prefix-count
exists with a lease, create-only writes, zero-copy reads into raw memory
addresses, LMCache value headers, the thread pool under asyncio.

Stand-ins (torch and the engines are not installed in CI): SGLang's host KV
pool (`HostPool`: two ctypes arrays playing the K and V buffers of a
page-first pool, handing raw addresses from `get_page_buffer_meta` as SGLang's
does), SGLang's `HiCacheStorageConfig` (a SimpleNamespace with its fields),
the base classes (the adapters' fallbacks), LMCache's `CacheEngineKey`,
`MemoryObj` and local CPU backend (`allocate`), and its connector context.
The same adapters are tested with the real engine objects and torch by
deploy/kv-adapter-tests.sh (conformance/kv/adapters/).
"""

import asyncio
import ctypes
import os
import sys
import threading
import types
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
from fskv_kv import KvClient  # noqa: E402
import lmcache_fskv  # noqa: E402
import sglang_fskv  # noqa: E402

URL, TOKEN = os.environ.get("KV_URL"), os.environ.get("KV_TOKEN")


class HostPool:
    """Stand-in for SGLang's page-first MHA host pool: K and V buffers of
    `slots` tokens, `token_bytes` each; a page is `page_size` consecutive slots."""

    def __init__(self, slots=64, page_size=4, token_bytes=256, parts=2):
        self.page_size, self.token_bytes, self.parts = page_size, token_bytes, parts
        self.bufs = [(ctypes.c_char * (slots * token_bytes))() for _ in range(parts)]

    def get_page_buffer_meta(self, indices):
        idx = list(indices)
        assert len(idx) % self.page_size == 0
        ptrs, sizes = [], []
        for i in range(0, len(idx), self.page_size):
            for b in self.bufs:
                ptrs.append(ctypes.addressof(b) + idx[i] * self.token_bytes)
                sizes.append(self.page_size * self.token_bytes)
        return ptrs, sizes

    def page_bytes(self, first_slot, part):
        n = self.page_size * self.token_bytes
        return bytes(memoryview(self.bufs[part]).cast("B")[first_slot * self.token_bytes : first_slot * self.token_bytes + n])

    def fill(self, first_slot, seed):
        n = self.page_size * self.token_bytes
        for part, b in enumerate(self.bufs):
            data = bytes((seed * 7 + part * 13 + j) % 251 for j in range(n))
            memoryview(b).cast("B")[first_slot * self.token_bytes : first_slot * self.token_bytes + n] = data


def storage_config(ns, tp_rank=0, tp_size=1, mla=False, model="org/model-8b", **extra):
    cfg = {"url": URL, "token": TOKEN, "namespace": ns, "interface_v1": 1, "exists_lease_ms": 2000}
    cfg.update(extra)
    return types.SimpleNamespace(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=model, dp_rank=0, dp_size=1, extra_config=cfg,
    )


def slots(pages, page_size=4):
    return [p * page_size + j for p in pages for j in range(page_size)]


class CountingClient(KvClient):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.requests = 0

    def _batch(self, *a, **k):
        self.requests += 1
        return super()._batch(*a, **k)


class KeyMappingTest(unittest.TestCase):
    """Pure key mapping (no gateway)."""

    def test_prefixes_isolate_models_and_ranks(self):
        c = types.SimpleNamespace(model_name="org/m", tp_rank=1, tp_size=4, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False)
        self.assertEqual(sglang_fskv.key_prefix(c), "org-m/tp1of4/")
        c.is_mla_model = True
        self.assertEqual(sglang_fskv.key_prefix(c), "org-m/mla/")
        c.pp_rank, c.pp_size, c.attn_cp_rank, c.attn_cp_size = 1, 2, 0, 2
        self.assertEqual(sglang_fskv.key_prefix(c), "org-m/mla-pp1of2-cp0of2/")
        self.assertEqual(sglang_fskv.part_suffixes(2, False), [".k", ".v"])
        self.assertEqual(sglang_fskv.part_suffixes(1, True), [".kv"])
        self.assertEqual(sglang_fskv.part_suffixes(3, False), [".p0", ".p1", ".p2"])

    def test_lmcache_header_and_url(self):
        h = lmcache_fskv.encode_header((2, 32, 256, 1024), "torch.bfloat16", 1)
        self.assertEqual(len(h), 64)
        self.assertEqual(lmcache_fskv.decode_header(h), ((2, 32, 256, 1024), "bfloat16", 1))
        with self.assertRaises(ValueError):
            lmcache_fskv.decode_header(b"x" * 64)
        with self.assertRaises(ValueError):
            lmcache_fskv.encode_header((1,) * 6, "float16", 0)
        self.assertEqual(lmcache_fskv.parse_url("fskv://127.0.0.1:9001/cache?lease_ms=5"), ("http://127.0.0.1:9001", "cache", {"lease_ms": "5"}))
        for bad in ("redis://h:1/x", "fskv://h/x", "fskv://h:1/", "fskv://h:1/a/b"):
            with self.assertRaises(ValueError):
                lmcache_fskv.parse_url(bad)
        self.assertTrue(lmcache_fskv.FskvConnectorAdapter().can_parse("fskv://h:1/x"))
        self.assertFalse(lmcache_fskv.FskvConnectorAdapter().can_parse("fs:///tmp"))


@unittest.skipUnless(URL and TOKEN, "KV_URL / KV_TOKEN not set (run through conformance/kv/run.sh)")
class SglangBackendTest(unittest.TestCase):
    NS = "sglang-ci"

    def setUp(self):
        self.admin = KvClient(URL, TOKEN)
        self.admin.put_namespace(self.NS)
        self.admin.delete_prefix(self.NS, b"")

    def tearDown(self):
        self.admin.close()

    def backend(self, pool, **kw):
        b = sglang_fskv.FskvHiCacheStorage(storage_config(self.NS, **kw), {})
        b.register_mem_pool_host(pool)
        return b

    def test_v1_round_trip_into_host_memory(self):
        pool = HostPool()
        b = self.backend(pool, tp_rank=1, tp_size=2)
        self.assertEqual(b.parts, 2)
        hashes = ["%064x" % (i + 1) for i in range(5)]
        for p in range(5):
            pool.fill(p * 4, p)
        self.assertEqual(b.batch_set_v1(hashes, slots(range(5))), [True] * 5)
        keys = self.admin.scan_all(self.NS, b"org-model-8b/tp1of2/")
        self.assertEqual(len(keys), 10)
        self.assertIn(("org-model-8b/tp1of2/" + hashes[0] + ".v").encode(), keys)
        # Read them into other host slots (pages 8..12): the bytes land in the pool's memory.
        self.assertEqual(b.batch_get_v1(hashes, slots(range(8, 13))), [True] * 5)
        for p in range(5):
            for part in range(2):
                self.assertEqual(pool.page_bytes((8 + p) * 4, part), pool.page_bytes(p * 4, part))
        # A missing page: it and the ones after it fail (not even read), earlier ones load.
        self.assertEqual(b.batch_get_v1(hashes[:2] + ["%064x" % 99] + hashes[2:3], slots(range(8, 12))), [True, True, False, False])
        stats = b.get_stats()
        self.assertEqual((stats["set_pages"], stats["get_pages"]), (5, 7))
        self.assertEqual(stats["set_bytes"], 5 * 2 * 1024)
        # The namespace's stats are published by the KV writer every
        # stats_interval_ms (1 s): a namespace this new may have none yet.
        ns_stats = stats["namespace"]["stats"]
        deadline = time.monotonic() + 10
        while ns_stats is None and time.monotonic() < deadline:
            time.sleep(0.2)
            ns_stats = b.get_stats()["namespace"]["stats"]
        self.assertIsNotNone(ns_stats, "the namespace's stats were not published within 10 s")
        self.assertIn("keys", ns_stats)  # published periodically: not asserted exact
        self.assertEqual(b.get_stats()["get_pages"], 0)  # reset by the previous call

    def test_batch_exists_counts_whole_leading_pages(self):
        pool = HostPool()
        b = self.backend(pool)
        hashes = ["h%02d" % i for i in range(6)]
        self.assertEqual(b.batch_set_v1(hashes[:5], slots(range(5))), [True] * 5)
        self.assertEqual(b.batch_exists(hashes), 5)
        self.assertTrue(b.exists(hashes[0]))
        self.assertFalse(b.exists(hashes[5]))
        # Page 2 lost its V part: pages 0 and 1 count, page 2 and later do not.
        self.assertTrue(self.admin.delete(self.NS, b"org-model-8b/tp0of1/h02.v"))
        self.assertEqual(b.batch_exists(hashes), 2)
        self.assertEqual(b.batch_exists([]), 0)

    def test_ranks_and_models_are_isolated_and_clear_is_per_rank(self):
        pool0, pool1 = HostPool(), HostPool()
        r0, r1 = self.backend(pool0, tp_rank=0, tp_size=2), self.backend(pool1, tp_rank=1, tp_size=2)
        other_model = self.backend(HostPool(), tp_rank=0, tp_size=2, model="org/other")
        pool0.fill(0, 1)
        pool1.fill(0, 2)
        self.assertEqual(r0.batch_set_v1(["same"], slots([0])), [True])
        self.assertEqual(r1.batch_set_v1(["same"], slots([0])), [True])
        self.assertEqual(other_model.batch_exists(["same"]), 0)
        self.assertEqual(r0.batch_get_v1(["same"], slots([1])), [True])
        self.assertEqual(r1.batch_get_v1(["same"], slots([1])), [True])
        self.assertEqual(pool0.page_bytes(4, 0), pool0.page_bytes(0, 0))
        self.assertEqual(pool1.page_bytes(4, 0), pool1.page_bytes(0, 0))
        self.assertNotEqual(pool0.page_bytes(4, 0), pool1.page_bytes(4, 0))
        r0.clear()
        self.assertEqual(r0.batch_exists(["same"]), 0)
        self.assertEqual(r1.batch_exists(["same"]), 1)

    def test_mla_pages_are_shared_by_ranks(self):
        p0, p3 = HostPool(parts=1), HostPool(parts=1)
        r0 = self.backend(p0, tp_rank=0, tp_size=4, mla=True)
        r3 = self.backend(p3, tp_rank=3, tp_size=4, mla=True)
        p0.fill(0, 5)
        self.assertEqual(r0.batch_set_v1(["m0"], slots([0])), [True])
        self.assertEqual(r3.batch_exists(["m0"]), 1)
        self.assertEqual(r3.batch_get_v1(["m0"], slots([2])), [True])
        self.assertEqual(p3.page_bytes(8, 0), p0.page_bytes(0, 0))
        self.assertEqual(self.admin.scan_all(self.NS), [b"org-model-8b/mla/m0.kv"])

    def test_large_batches_are_split_and_writes_are_create_only(self):
        pool = HostPool(slots=4 * 140)
        b = self.backend(pool, max_request_bytes=40 * 1024)  # 20 parts of 1 KiB... 40 parts per request
        b.client = CountingClient(URL, TOKEN)
        hashes = ["big%03d" % i for i in range(130)]
        for p in range(130):
            pool.fill(p * 4, p)
        self.assertEqual(b.batch_set_v1(hashes, slots(range(130))), [True] * 130)
        puts = b.client.requests
        self.assertGreaterEqual(puts, 7)  # 260 KiB of parts in ≤ 40 KiB requests (+ the exists probe)
        # Again: every page is already there, so nothing is sent but the exists probe.
        b.client.requests = 0
        self.assertEqual(b.batch_set_v1(hashes, slots(range(130))), [True] * 130)
        self.assertEqual(b.client.requests, 1)
        self.assertEqual(b.batch_exists(hashes), 130)
        out = HostPool(slots=4 * 140)
        b.register_mem_pool_host(out)
        self.assertEqual(b.batch_get_v1(hashes, slots(range(130))), [True] * 130)
        self.assertEqual(out.page_bytes(129 * 4, 1), pool.page_bytes(129 * 4, 1))

    def test_generic_calls_and_create_only(self):
        b = sglang_fskv.FskvHiCacheStorage(storage_config(self.NS, interface_v1=0), {})
        page = bytearray(os.urandom(4096))
        self.assertTrue(b.set("g1", page))
        self.assertTrue(b.batch_set(["g1", "g2"], [bytearray(b"x" * 4096), bytearray(b"y" * 4096)]))
        target = bytearray(4096)
        self.assertIs(b.get("g1", target), target)
        self.assertEqual(target, page)  # create-only: the second write of g1 did not replace it
        t2, t3 = bytearray(4096), bytearray(4096)
        self.assertEqual(b.batch_get(["g2", "g3"], [t2, t3]), [t2, None])
        self.assertEqual(bytes(t2), b"y" * 4096)
        self.assertEqual(b.batch_get(["g1"]), [bytes(page)])  # no target, no host pool: bytes
        self.assertEqual(b.batch_exists(["g1", "g2", "g3"]), 2)
        self.assertFalse(b.batch_set(["g4"], None))

    def test_gateway_errors_are_misses_not_exceptions(self):
        cfg = storage_config(self.NS, url="http://127.0.0.1:9", create_namespace=False)
        b = sglang_fskv.FskvHiCacheStorage(cfg, {})
        b.register_mem_pool_host(HostPool())
        with self.assertLogs("sglang_fskv", "WARNING") as logs:
            self.assertEqual(b.batch_exists(["a", "b"]), 0)
            self.assertEqual(b.batch_get_v1(["a"], slots([0])), [False])
            self.assertEqual(b.batch_set_v1(["a"], slots([0])), [False])
            self.assertIsNone(b.get("a", bytearray(16)))
            self.assertGreaterEqual(b.get_stats()["errors"], 4)
        # One line per failed call, naming the call.
        self.assertTrue(any("batch_exists failed" in m for m in logs.output), logs.output)
        self.assertTrue(any("batch_get_v1 failed" in m for m in logs.output), logs.output)
        with self.assertRaises(ValueError):
            sglang_fskv.FskvHiCacheStorage(types.SimpleNamespace(extra_config={}), {})


class Key:
    """Stand-in for LMCache's CacheEngineKey."""

    def __init__(self, h, worker=0):
        self.h, self.worker = h, worker

    def to_string(self):
        return "org/model@2@%d@%s@bfloat16" % (self.worker, self.h)


class MemoryObj:
    """Stand-in for LMCache's MemoryObj (bytes in a bytearray)."""

    def __init__(self, shape, dtype="bfloat16", fmt=1, data=None):
        n = 2
        for d in shape:
            n *= d
        self.shape, self.dtype, self.fmt = tuple(shape), dtype, fmt
        self.byte_array = bytearray(data if data is not None else n)
        self.refs = 1

    def get_shape(self):
        return self.shape

    def get_dtype(self):
        return self.dtype

    def get_memory_format(self):
        return self.fmt

    def ref_count_down(self):
        self.refs -= 1


class CpuBackend:
    """Stand-in for LMCache's LocalCPUBackend: `allocate` or None when full."""

    def __init__(self, budget=8):
        self.budget, self.allocated = budget, []

    def allocate(self, shape, dtype, fmt):
        if len(self.allocated) >= self.budget:
            return None
        obj = MemoryObj(shape, dtype, fmt)
        self.allocated.append(obj)
        return obj


@unittest.skipUnless(URL and TOKEN, "KV_URL / KV_TOKEN not set (run through conformance/kv/run.sh)")
class LmcacheConnectorTest(unittest.TestCase):
    NS = "lmcache-ci"

    def run_async(self, coro_fn):
        return asyncio.run(coro_fn())

    def make(self, cpu, loop):
        ctx = types.SimpleNamespace(
            url="fskv://%s/%s?lease_ms=1500" % (URL.split("://", 1)[1].rstrip("/"), self.NS),
            loop=loop, local_cpu_backend=cpu, config=types.SimpleNamespace(extra_config={"fskv.token": TOKEN, "fskv.threads": 4}),
        )
        return lmcache_fskv.FskvConnectorAdapter().create_connector(ctx)

    def setUp(self):
        self.admin = KvClient(URL, TOKEN)
        self.admin.put_namespace(self.NS)
        self.admin.delete_prefix(self.NS, b"")

    def tearDown(self):
        self.admin.close()

    def test_put_get_exists_list_remove_ping(self):
        cpu = CpuBackend()

        async def go():
            c = self.make(cpu, asyncio.get_running_loop())
            try:
                obj = MemoryObj((2, 4, 16, 8), data=os.urandom(2 * 4 * 16 * 8 * 2))
                k = Key("00ab")
                self.assertFalse(await c.exists(k))
                await c.put(k, obj)
                self.assertTrue(await c.exists(k))
                self.assertTrue(c.exists_sync(k))
                got = await c.get(k)
                self.assertEqual((got.shape, got.dtype, got.fmt), ((2, 4, 16, 8), "bfloat16", 1))
                self.assertEqual(bytes(got.byte_array), bytes(obj.byte_array))
                # One value holds header and payload: raw key bytes are the LMCache key.
                raw = self.admin.get(self.NS, k.to_string().encode())
                self.assertEqual(len(raw), 64 + len(obj.byte_array))
                self.assertIsNone(await c.get(Key("missing")))
                self.assertEqual(await c.list(), [k.to_string()])
                self.assertEqual(await c.ping(), 0)
                self.assertTrue(c.remove_sync(k))
                self.assertFalse(c.remove_sync(k))
                self.assertFalse(await c.exists(k))
            finally:
                await c.close()

        self.run_async(go)

    def test_batches_hit_count_and_thread_pool(self):
        cpu = CpuBackend(budget=100)

        async def go():
            loop = asyncio.get_running_loop()
            c = self.make(cpu, loop)
            threads = set()
            real = c.client.batch_exists

            def spy(*a, **k):
                threads.add(threading.current_thread().name)
                return real(*a, **k)

            c.client.batch_exists = spy
            try:
                keys = [Key("%04x" % i, worker=1) for i in range(20)]
                objs = [MemoryObj((2, 1, 8, 4), data=bytes([i]) * 128) for i in range(20)]
                self.assertTrue(c.support_batched_put() and c.support_batched_get() and c.support_batched_async_contains())
                await c.batched_put(keys[:15], objs[:15])
                await c.batched_put(keys[:3], objs[:3])  # duplicates: create-only, no error
                self.assertEqual(await c.batched_async_contains("req-1", keys, pin=True), 15)
                self.assertEqual(await c.batched_async_contains("req-2", [keys[16]] + keys, pin=False), 0)
                self.assertTrue(threads and all(t.startswith("fskv-lmcache") for t in threads), threads)
                # The synchronous calls run on the caller's thread (LMCache calls them off its loop).
                self.assertEqual(c.batched_contains(keys[13:17]), [True, True, False, False])
                self.assertEqual(c.batched_contains([keys[16], keys[0]], stop_after_first_not_exits=False), [False, True])
                got = await c.batched_get(keys[12:17])
                self.assertEqual([g is not None for g in got], [True, True, True, False, False])
                self.assertEqual(bytes(got[2].byte_array), bytes([14]) * 128)
                self.assertIn(threading.current_thread().name, threads)
            finally:
                await c.close()

        self.run_async(go)

    def test_foreign_values_and_full_cpu_backend(self):
        cpu = CpuBackend(budget=1)

        async def go():
            c = self.make(cpu, asyncio.get_running_loop())
            try:
                self.admin.put(self.NS, Key("bad").to_string(), b"not an lmcache value" * 10)
                bad_len = lmcache_fskv.encode_header((2, 8), "bfloat16", 1) + b"x" * 10  # header says 32 bytes
                self.admin.put(self.NS, Key("short").to_string(), bad_len)
                with self.assertLogs("lmcache_fskv", "WARNING") as logs:
                    self.assertIsNone(await c.get(Key("bad")))
                    self.assertIsNone(await c.get(Key("short")))
                self.assertIn("not an LMCache value", logs.output[0])
                self.assertIn("header says 32", logs.output[1])
                for h in ("a", "b"):
                    await c.put(Key(h), MemoryObj((4,), data=b"12345678"))
                got = await c.batched_get([Key("a"), Key("b")])
                # The backend had room for one object: the other is a miss, not an error.
                self.assertEqual([g is not None for g in got], [True, False])
            finally:
                await c.close()

        self.run_async(go)


if __name__ == "__main__":
    unittest.main()
