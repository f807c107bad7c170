"""The LMCache remote-storage plugin (clients/python/lmcache_fskv.py) with
LMCache's own modules and torch, against a running KV gateway. Run by
deploy/kv-adapter-tests.sh.

Real: torch (CPU), LMCache's `CreateConnector` loading the plugin from
`remote_storage_plugins` + `extra_config` (module path, class name) and
wrapping it in its `InstrumentedRemoteConnector`, LMCache's
`LMCacheEngineConfig`, `CacheEngineKey`, `MemoryFormat` and memory objects
(`TensorMemoryAllocator` over a CPU tensor), the gateway. Stand-in: the local
CPU backend (`CpuBackend`, only `allocate` from that allocator): LMCache's
`LocalCPUBackend` is built by its storage manager from an engine.

Environment: KV_URL, KV_TOKEN; FSKV_LMCACHE_UNAVAILABLE (set by the script when
LMCache could not be installed: the tests print SKIPPED with that reason).
"""

import asyncio
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "clients", "python"))

URL, TOKEN = os.environ.get("KV_URL"), os.environ.get("KV_TOKEN")
REASON = os.environ.get("FSKV_LMCACHE_UNAVAILABLE", "")
try:
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import MemoryFormat

    try:
        from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
    except ImportError:  # older LMCache
        from lmcache.v1.memory_management import TensorMemoryAllocator
    from lmcache.v1.storage_backend.connector import CreateConnector
except Exception as e:  # noqa: BLE001
    REASON = REASON or "LMCache or torch does not import here: %s" % e
if REASON:
    print("SKIPPED: lmcache adapter tests: %s" % REASON)


class CpuBackend:
    def __init__(self, nbytes=64 << 20):
        self.allocator = TensorMemoryAllocator(torch.empty(nbytes, dtype=torch.uint8))

    def allocate(self, shape, dtype, fmt=None, **_):
        return self.allocator.allocate(shape, dtype, fmt)


def engine_config(url):
    try:
        cfg = LMCacheEngineConfig.from_defaults(chunk_size=256, remote_url=url, remote_serde="naive")
    except TypeError:
        cfg = LMCacheEngineConfig.from_defaults()
        cfg.remote_url = url
    cfg.remote_storage_plugins = ["fskv"]
    cfg.extra_config = {
        "remote_storage_plugin.fskv.module_path": "lmcache_fskv",
        "remote_storage_plugin.fskv.class_name": "FskvConnectorAdapter",
        "fskv.token": TOKEN,
        "fskv.threads": 4,
    }
    return cfg


def make_key(i):
    fields = CacheEngineKey.__dataclass_fields__ if hasattr(CacheEngineKey, "__dataclass_fields__") else {}
    kw = {"fmt": "vllm", "model_name": "meta-llama/Llama-3.1-8B", "world_size": 2, "worker_id": 1, "chunk_hash": 0x1234 + i}
    if "dtype" in fields:
        kw["dtype"] = torch.bfloat16
    if "request_configs" in fields:
        kw["request_configs"] = None
    return CacheEngineKey(**{k: v for k, v in kw.items() if not fields or k in fields})


@unittest.skipIf(REASON, REASON)
@unittest.skipUnless(URL and TOKEN, "KV_URL / KV_TOKEN not set (run through deploy/kv-adapter-tests.sh)")
class LmcacheRealTest(unittest.TestCase):
    def test_plugin_round_trip_through_lmcache(self):
        url = "fskv://%s/lmcache-real" % URL.split("://", 1)[1].rstrip("/")
        from fskv_kv import KvClient

        admin = KvClient(URL, TOKEN)
        admin.put_namespace("lmcache-real")
        admin.delete_prefix("lmcache-real", b"")  # puts are create-only: start empty
        admin.close()
        cpu = CpuBackend()

        async def go():
            conn = CreateConnector(url, asyncio.get_running_loop(), cpu, engine_config(url))
            try:
                self.assertIn("Fskv", repr(conn) + repr(getattr(conn, "connector", "")) + type(getattr(conn, "connector", conn)).__name__)
                keys = [make_key(i) for i in range(4)]
                objs = []
                for i in range(3):
                    obj = cpu.allocate(torch.Size([2, 4, 256, 64]), torch.bfloat16, MemoryFormat.KV_2LTD)
                    obj.tensor.copy_(torch.randn(obj.tensor.shape).to(torch.bfloat16))
                    objs.append(obj)
                expected = [o.tensor.clone() for o in objs]
                await conn.batched_put(keys[:3], objs)  # LMCache's wrapper releases the objects after the put
                self.assertEqual(await conn.batched_async_contains("lookup-1", keys, pin=True), 3)
                self.assertTrue(await conn.exists(keys[0]))
                got = await conn.get(keys[1])
                self.assertEqual(tuple(got.get_shape()), (2, 4, 256, 64))
                self.assertEqual(got.get_dtype(), torch.bfloat16)
                self.assertEqual(got.get_memory_format(), MemoryFormat.KV_2LTD)
                self.assertTrue(torch.equal(got.tensor, expected[1]))
                many = await conn.batched_get(keys)
                self.assertIsNone(many[3])
                self.assertTrue(torch.equal(many[2].tensor, expected[2]))
                self.assertEqual(len(await conn.list()), 3)
                self.assertEqual(await conn.ping(), 0)
                self.assertTrue(conn.remove_sync(keys[0]))
                self.assertFalse(await conn.exists(keys[0]))
            finally:
                await conn.close()

        asyncio.run(go())


if __name__ == "__main__":
    unittest.main()
