"""The SGLang HiCache backend (clients/python/sglang_fskv.py) with SGLang's own
modules and torch, against a running KV gateway. Run by deploy/kv-adapter-tests.sh.

Real: torch (CPU), SGLang's `HiCacheStorage` base class and
`HiCacheStorageConfig`, SGLang's `StorageBackendFactory` building the backend
from the `dynamic` extra config exactly as `--hicache-storage-backend dynamic`
does, the gateway. Stand-in: the host KV pool (`TorchHostPool`: torch tensors
in a page-first layout, answering `get_page_buffer_meta` with the tensors'
data pointers as SGLang's host pools do): importing SGLang's real host pool
(`sglang.srt.mem_cache.pool_host.mha`) pulls in the model configs and
torchvision (tried 2026-12-01: `MHATokenToKVPoolHost` stops at
`import torchvision`), far beyond the storage interface this test is about.

Environment: KV_URL, KV_TOKEN; FSKV_SGLANG_UNAVAILABLE (set by the script when
SGLang could not be installed: the tests print SKIPPED with that reason).
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "clients", "python"))

URL, TOKEN = os.environ.get("KV_URL"), os.environ.get("KV_TOKEN")
REASON = os.environ.get("FSKV_SGLANG_UNAVAILABLE", "")
try:
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
except Exception as e:  # noqa: BLE001
    REASON = REASON or "SGLang or torch does not import here: %s" % e
if REASON:
    print("SKIPPED: sglang adapter tests: %s" % REASON)


class TorchHostPool:
    """Page-first MHA host pool on torch tensors: kv_buffer[2, slots, layers, heads, dim]."""

    def __init__(self, slots=512, page_size=16, layers=2, heads=2, dim=32, dtype=None):
        self.page_size, self.dtype = page_size, dtype or torch.bfloat16
        self.layout = "page_first"
        self.size = slots
        self.kv_buffer = torch.zeros((2, slots, layers, heads, dim), dtype=self.dtype)
        self.token_bytes = layers * heads * dim * self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        assert len(idx) % self.page_size == 0
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            ptrs.append(self.kv_buffer[0, idx[i]].data_ptr())
            ptrs.append(self.kv_buffer[1, idx[i]].data_ptr())
        return ptrs, [self.page_size * self.token_bytes] * len(ptrs)

    def page(self, first):
        return self.kv_buffer[:, first : first + self.page_size]

    def get_dummy_flat_data_page(self):
        return torch.zeros(2 * self.page_size * self.token_bytes // self.kv_buffer.element_size(), dtype=self.dtype)


def config(ns, tp_rank=0, tp_size=1, v1=True):
    extra = {
        "backend_name": "fskv", "module_path": "sglang_fskv", "class_name": "FskvHiCacheStorage",
        "interface_v1": 1 if v1 else 0, "url": URL, "token": TOKEN, "namespace": ns,
    }
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="meta-llama/Llama-3.1-8B", extra_config=extra,
    )


def token_indices(pages, page_size):
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size, dtype=torch.int64) for p in pages])


@unittest.skipIf(REASON, REASON)
@unittest.skipUnless(URL and TOKEN, "KV_URL / KV_TOKEN not set (run through deploy/kv-adapter-tests.sh)")
class SglangRealTest(unittest.TestCase):
    NS = "sglang-real"

    def make(self, pool, **kw):
        try:
            from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
        except Exception as e:  # noqa: BLE001 - the factory's package may import GPU-only modules
            self.skipTest("SGLang's StorageBackendFactory does not import here: %s" % e)
        b = StorageBackendFactory.create_backend("dynamic", config(self.NS, **kw), pool)
        b.register_mem_pool_host(pool)  # as HiCacheController.attach_storage_backend does
        return b

    def test_factory_builds_a_hicache_storage(self):
        import sglang_fskv

        self.assertTrue(sglang_fskv.HAVE_SGLANG)
        self.assertTrue(issubclass(sglang_fskv.FskvHiCacheStorage, HiCacheStorage))
        b = self.make(TorchHostPool())
        self.assertIsInstance(b, HiCacheStorage)
        self.assertEqual((b.parts, b.prefix), (2, "meta-llama-Llama-3.1-8B/tp0of1/"))

    def test_v1_zero_copy_round_trip_of_bf16_pages(self):
        pool = TorchHostPool()
        b = self.make(pool)
        b.clear()
        n = 10
        for p in range(n):
            pool.page(p * pool.page_size).copy_(torch.randn_like(pool.page(0), dtype=torch.float32).to(pool.dtype))
        keys = ["%064x" % (0xABC000 + p) for p in range(n)]
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_set_v1(keys, token_indices(range(n), pool.page_size)), [True] * n)
        self.assertEqual(b.batch_exists(keys + ["%064x" % 1]), n)
        self.assertEqual(b.batch_get_v1(keys, token_indices(range(16, 16 + n), pool.page_size)), [True] * n)
        for p in range(n):
            self.assertTrue(torch.equal(pool.page((16 + p) * pool.page_size), pool.page(p * pool.page_size)), p)

    def test_generic_path_with_flat_pages(self):
        pool = TorchHostPool()
        b = self.make(pool, v1=False)
        b.clear()  # puts are create-only: start without this rank's pages
        page = torch.randn(pool.get_dummy_flat_data_page().numel()).to(pool.dtype)
        self.assertTrue(b.set("flat-1", page))
        target = pool.get_dummy_flat_data_page()
        got = b.get("flat-1", target)
        self.assertIs(got, target)
        self.assertTrue(torch.equal(target, page))
        no_target = b.batch_get(["flat-1", "flat-missing"])
        self.assertTrue(torch.equal(no_target[0], page))
        self.assertIsNone(no_target[1])


if __name__ == "__main__":
    unittest.main()
