"""An SGLang HiCache storage backend (the L3 tier) on the 3FS-KV KV gateway.

Built on the thin client ``fskv_kv.py`` (standard library only). SGLang loads
it as a ``dynamic`` backend:

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "fskv",
            "module_path": "sglang_fskv", "class_name": "FskvHiCacheStorage",
            "interface_v1": 1, "url": "http://127.0.0.1:9001",
            "namespace": "hicache", "token_env": "FSKV_KV_TOKEN"}'

(``clients/python`` on ``PYTHONPATH``.) SGLang builds it as
``FskvHiCacheStorage(storage_config, kwargs)`` and then calls
``register_mem_pool_host(host_pool)``; ``interface_v1: 1`` makes SGLang call
the zero-copy ``batch_get_v1`` / ``batch_set_v1`` with host-pool indices.

Extra config (JSON) read here:

| key | default | meaning |
|---|---|---|
| ``url`` | ``$FSKV_KV_URL`` | the KV gateway's native API (writer; reads go there too) |
| ``token`` / ``token_env`` | ``$FSKV_KV_TOKEN`` | bearer token, or the variable holding it |
| ``namespace`` | ``hicache`` | the KV namespace (created if missing; its capacity and LRU eviction are the gateway's) |
| ``exists_lease_ms`` | 10000 | lease taken by ``batch_exists`` on the pages it counts, so they cannot be evicted before the prefetch reads them |
| ``ttl_ms`` | none | TTL of every page written |
| ``max_request_bytes`` | 64 MiB | values per batch request (a 128-page batch of 8 MiB pages is split) |
| ``pool_size`` / ``timeout_s`` | 16 / 60 | client connections kept / per-request timeout |

Keys: ``<model>/<rank>/<page hash><suffix>`` where ``<rank>`` isolates what
differs between ranks: ``tp<r>of<n>`` (MHA models: each TP rank holds other
heads), ``mla`` (MLA models: every TP rank holds the same latent cache, only
rank 0 writes, all read), plus ``-pp<r>of<n>`` / ``-cp<r>of<n>`` when pipeline /
context parallel. ``<suffix>`` names the part of the page: in the v1 layout the
host pool hands one buffer per part (``.k`` and ``.v`` for MHA, ``.kv`` for
MLA, ``.p<j>`` for other layouts), the generic calls store one flat page
(``.page``). Attention-DP replicas share keys (same model, same pages).

| call | gateway request(s) |
|---|---|
| ``batch_exists`` / ``exists`` | batch exists, ``PREFIX`` mode with a lease; pages = leading keys found // parts per page |
| ``batch_get_v1`` | batch get in ``PREFIX`` mode (stops at the first missing part: SGLang uses the leading pages only) reading each part straight into the host pool's page memory (no copy) |
| ``batch_set_v1`` | batch exists (skip pages already stored), then create-only batch put (``Exists`` counts as success): duplicate writers of a page are harmless |
| ``get`` / ``batch_get`` | (batch) get into the caller's flat page tensor's memory |
| ``set`` / ``batch_set`` | create-only (batch) put of flat pages |
| ``clear`` | delete by prefix ``<model>/<rank>/`` (this rank's pages only) |
| ``get_stats`` | pages and bytes read / written since the last call, and the namespace's stats |

The set path copies each page once into the request body; the get path does
not copy. No call raises to SGLang on a gateway error: a failed page is
``False`` / ``None`` / not counted (SGLang then treats it as a miss), and the
error is logged once per call.
"""

import ctypes
import logging
import os
import threading
import time

from fskv_kv import KvClient, KvError, Status

logger = logging.getLogger(__name__)

try:  # the real base class when SGLang (and torch) are importable
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base

    HAVE_SGLANG = True
except Exception:  # noqa: BLE001 - ImportError, or torch/CUDA import failures inside SGLang
    HAVE_SGLANG = False

    class _Base:
        """Stand-in for sglang's HiCacheStorage when SGLang is not installed
        (the tests without torch use it); same registration hook."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host


DEFAULT_NAMESPACE = "hicache"
DEFAULT_EXISTS_LEASE_MS = 10_000
DEFAULT_MAX_REQUEST_BYTES = 64 << 20
# The gateway's default max_batch_items is 1024; stay well below.
MAX_ITEMS_PER_REQUEST = 512
_OK = (Status.OK, Status.EXISTS)


def _cfg_get(cfg, name, default=None):
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def key_prefix(storage_config):
    """``<model>/<rank>/``: the part of every key that isolates models and ranks."""
    model = _cfg_get(storage_config, "model_name") or "model"
    model = model.replace("/", "-")
    if _cfg_get(storage_config, "is_mla_model", False):
        rank = "mla"
    else:
        rank = "tp%dof%d" % (_cfg_get(storage_config, "tp_rank", 0), _cfg_get(storage_config, "tp_size", 1))
    pp_size = _cfg_get(storage_config, "pp_size", 1) or 1
    if pp_size > 1:
        rank += "-pp%dof%d" % (_cfg_get(storage_config, "pp_rank", 0), pp_size)
    cp_size = _cfg_get(storage_config, "attn_cp_size", 1) or 1
    if cp_size > 1:
        rank += "-cp%dof%d" % (_cfg_get(storage_config, "attn_cp_rank", 0), cp_size)
    return "%s/%s/" % (model, rank)


def part_suffixes(parts, is_mla):
    """Key suffixes of the parts of one page in the v1 layout."""
    if parts == 2 and not is_mla:
        return [".k", ".v"]
    if parts == 1:
        return [".kv"] if is_mla else [".k"]
    return [".p%d" % j for j in range(parts)]


def _memory_at(ptr, size):
    """A writable memoryview of ``size`` bytes at address ``ptr`` (host-pool memory)."""
    if size <= 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_char * size).from_address(int(ptr))).cast("B")


def _tensor_memory(t):
    """(memoryview over a CPU tensor's bytes) — or the buffer itself for non-tensors."""
    if hasattr(t, "data_ptr"):
        if getattr(t, "is_cuda", False) or str(getattr(t, "device", "cpu")) != "cpu":
            raise ValueError("tensor must be in host memory")
        if not t.is_contiguous():
            raise ValueError("tensor must be contiguous")
        return _memory_at(t.data_ptr(), t.numel() * t.element_size())
    return memoryview(t).cast("B")


def _indices_list(indices):
    return indices.tolist() if hasattr(indices, "tolist") else list(indices)


class FskvHiCacheStorage(_Base):
    def __init__(self, storage_config, kwargs=None, client=None):
        extra = _cfg_get(storage_config, "extra_config") or {}
        url = extra.get("url") or os.environ.get("FSKV_KV_URL")
        if client is None and not url:
            raise ValueError("fskv HiCache backend: set 'url' in the extra config or FSKV_KV_URL")
        token = extra.get("token")
        if token is None:
            token = os.environ.get(extra.get("token_env", "FSKV_KV_TOKEN"))
        self.ns = extra.get("namespace", DEFAULT_NAMESPACE)
        self.exists_lease_ms = int(extra.get("exists_lease_ms", DEFAULT_EXISTS_LEASE_MS))
        self.ttl_ms = extra.get("ttl_ms")
        self.max_request_bytes = int(extra.get("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES))
        if self.max_request_bytes <= 0:
            raise ValueError("max_request_bytes must be > 0")
        self.client = client or KvClient(url, token, pool_size=int(extra.get("pool_size", 16)), timeout=float(extra.get("timeout_s", 60)))
        self.is_mla = bool(_cfg_get(storage_config, "is_mla_model", False))
        self.prefix = key_prefix(storage_config)
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        self.parts = None  # buffers per page in the v1 layout, known once the host pool is registered
        self.mem_pool_host = None
        self._stats_lock = threading.Lock()
        self._stats = {"get_pages": 0, "get_bytes": 0, "get_s": 0.0, "set_pages": 0, "set_bytes": 0, "set_s": 0.0, "errors": 0}
        if bool(extra.get("create_namespace", True)):
            try:
                self.client.namespace(self.ns)
            except KvError as e:
                if e.status != 404:
                    raise
                self.client.put_namespace(self.ns)
        logger.info("fskv HiCache backend: namespace %s, keys %s*, v1=%s", self.ns, self.prefix, self.interface_v1)

    # ----- keys -----

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self.mem_pool_host = mem_pool_host
        if self.interface_v1:
            self.parts = self._probe_parts(mem_pool_host)

    @staticmethod
    def _probe_parts(pool):
        """How many buffers the host pool hands per page (its v1 layout)."""
        n = int(pool.page_size)
        try:
            import torch

            idx = torch.arange(n, dtype=torch.int64)
        except ImportError:
            idx = list(range(n))
        ptrs, _ = pool.get_page_buffer_meta(idx)
        if not ptrs:
            raise ValueError("host pool gave no buffers for a page")
        return len(ptrs)

    def _page_keys(self, h):
        """The gateway keys of one page."""
        if self.interface_v1:
            if self.parts is None:
                raise RuntimeError("fskv HiCache backend: interface_v1 needs register_mem_pool_host first")
            return [self.prefix + h + s for s in part_suffixes(self.parts, self.is_mla)]
        return [self.prefix + h + ".page"]

    def _chunks(self, n_items, sizes):
        """Splits items [0, n) into request-sized runs (items and bytes)."""
        start, acc = 0, 0
        for i in range(n_items):
            sz = sizes[i] if sizes else 0
            if i > start and (i - start >= MAX_ITEMS_PER_REQUEST or acc + sz > self.max_request_bytes):
                yield start, i
                start, acc = i, 0
            acc += sz
        if start < n_items:
            yield start, n_items

    def _count(self, kind, pages, nbytes, seconds):
        with self._stats_lock:
            self._stats[kind + "_pages"] += pages
            self._stats[kind + "_bytes"] += nbytes
            self._stats[kind + "_s"] += seconds

    def _failed(self, what, e):
        with self._stats_lock:
            self._stats["errors"] += 1
        logger.warning("fskv HiCache backend: %s failed: %s", what, e)

    # ----- existence -----

    def exists(self, key):
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys, extra_info=None):
        """The number of leading pages all of whose parts exist; they are leased."""
        if not keys:
            return 0
        per_page = len(self._page_keys(keys[0]))
        flat = [k for h in keys for k in self._page_keys(h)]
        found = 0
        try:
            for a, b in self._chunks(len(flat), None):
                _, prefix = self.client.batch_exists(self.ns, flat[a:b], prefix=True, lease_ms=self.exists_lease_ms)
                found += prefix
                if prefix < b - a:
                    break
        except (KvError, OSError, ValueError) as e:
            self._failed("batch_exists", e)
        return found // per_page

    # ----- zero-copy v1 -----

    def _page_buffers(self, keys, host_indices):
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if not keys or len(ptrs) % len(keys) or len(ptrs) != len(sizes):
            raise ValueError("host pool gave %d buffers for %d pages" % (len(ptrs), len(keys)))
        parts = len(ptrs) // len(keys)
        if self.parts is None:
            self.parts = parts
        elif parts != self.parts:
            raise ValueError("host pool gave %d buffers per page, %d at registration" % (parts, self.parts))
        flat_keys = [k for h in keys for k in self._page_keys(h)]
        return flat_keys, [_memory_at(p, s) for p, s in zip(ptrs, sizes)], [int(s) for s in sizes], parts

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Reads pages straight into the host pool's memory; per page True/False."""
        if not keys:
            return []
        t0 = time.monotonic()
        try:
            flat_keys, bufs, sizes, parts = self._page_buffers(keys, host_indices)
        except (ValueError, RuntimeError) as e:
            self._failed("batch_get_v1", e)
            return [False] * len(keys)
        ok_item = [False] * len(flat_keys)
        for a, b in self._chunks(len(flat_keys), sizes):
            try:
                lens = self.client.batch_get_into(self.ns, flat_keys[a:b], bufs[a:b], prefix=True)
            except (KvError, OSError, ValueError) as e:
                self._failed("batch_get_v1", e)
                break
            for j, n in enumerate(lens):
                ok_item[a + j] = n == sizes[a + j]
            if not all(ok_item[a:b]):
                break  # SGLang uses the leading pages only
        res = [all(ok_item[i * parts : (i + 1) * parts]) for i in range(len(keys))]
        got = sum(res)
        self._count("get", got, got * parts * (sizes[0] if sizes else 0), time.monotonic() - t0)
        return res

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Writes pages from the host pool's memory (create-only); per page True/False."""
        if not keys:
            return []
        t0 = time.monotonic()
        try:
            flat_keys, bufs, sizes, parts = self._page_buffers(keys, host_indices)
        except (ValueError, RuntimeError) as e:
            self._failed("batch_set_v1", e)
            return [False] * len(keys)
        ok_item = [False] * len(flat_keys)
        try:
            statuses = []
            for a, b in self._chunks(len(flat_keys), None):
                st, _ = self.client.batch_exists(self.ns, flat_keys[a:b])
                statuses.extend(st)
            for i, s in enumerate(statuses):
                ok_item[i] = s == Status.OK
        except (KvError, OSError, ValueError) as e:
            self._failed("batch_set_v1 (exists)", e)
        todo = [i for i in range(len(flat_keys)) if not ok_item[i]]
        written = 0
        for a, b in self._chunks(len(todo), [sizes[i] for i in todo]):
            idx = todo[a:b]
            try:
                st = self.client.batch_put(self.ns, [(flat_keys[i], bufs[i]) for i in idx], if_absent=True, ttl_ms=self.ttl_ms)
            except (KvError, OSError, ValueError) as e:
                self._failed("batch_set_v1", e)
                continue
            for i, s in zip(idx, st):
                ok_item[i] = s in _OK
                written += sizes[i] if s == Status.OK else 0
        res = [all(ok_item[i * parts : (i + 1) * parts]) for i in range(len(keys))]
        self._count("set", sum(res), written, time.monotonic() - t0)
        return res

    # ----- generic (flat page) calls -----

    def get(self, key, target_location=None, target_sizes=None):
        res = self.batch_get([key], [target_location] if target_location is not None else None)
        return res[0] if res else None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Flat pages into ``target_locations`` (tensors or buffers); None for a miss."""
        if not keys:
            return []
        t0 = time.monotonic()
        flat = [self.prefix + h + ".page" for h in keys]
        out = [None] * len(keys)
        nbytes = 0
        try:
            if target_locations is None:
                vals = self.client.batch_get(self.ns, flat)
                out = [self._as_page(v) if v is not None else None for v in vals]
                nbytes = sum(len(v) for v in vals if v is not None)
            else:
                bufs = [_tensor_memory(t) for t in target_locations]
                sizes = [len(b) for b in bufs]
                for a, b in self._chunks(len(flat), sizes):
                    lens = self.client.batch_get_into(self.ns, flat[a:b], bufs[a:b])
                    for j, n in enumerate(lens):
                        if n == sizes[a + j]:
                            out[a + j] = target_locations[a + j]
                            nbytes += n
        except (KvError, OSError, ValueError) as e:
            self._failed("batch_get", e)
        self._count("get", sum(v is not None for v in out), nbytes, time.monotonic() - t0)
        return out

    def _as_page(self, data):
        dtype = getattr(self.mem_pool_host, "dtype", None)
        if dtype is None:
            return data
        import torch

        return torch.frombuffer(bytearray(data), dtype=dtype)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Create-only puts of flat pages; True when every page is stored."""
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            return False
        t0 = time.monotonic()
        flat = [self.prefix + h + ".page" for h in keys]
        try:
            bufs = [_tensor_memory(v) for v in values]
        except (ValueError, TypeError) as e:
            self._failed("batch_set", e)
            return False
        ok = True
        written = 0
        for a, b in self._chunks(len(flat), [len(x) for x in bufs]):
            try:
                st = self.client.batch_put(self.ns, list(zip(flat[a:b], bufs[a:b])), if_absent=True, ttl_ms=self.ttl_ms)
            except (KvError, OSError, ValueError) as e:
                self._failed("batch_set", e)
                return False
            ok = ok and all(s in _OK for s in st)
            written += sum(len(bufs[a + j]) for j, s in enumerate(st) if s == Status.OK)
        self._count("set", len(keys) if ok else 0, written, time.monotonic() - t0)
        return ok

    # ----- housekeeping -----

    def clear(self):
        """Removes this rank's pages (the key prefix ``<model>/<rank>/``)."""
        try:
            n = self.client.delete_prefix(self.ns, self.prefix)
            logger.info("fskv HiCache backend: cleared %d keys under %s", n, self.prefix)
        except (KvError, OSError) as e:
            self._failed("clear", e)

    def get_stats(self):
        """Pages/bytes read and written since the last call (then reset), the
        bandwidth of those calls (bytes/s), and the namespace's stats."""
        with self._stats_lock:
            s = dict(self._stats)
            for k in self._stats:
                self._stats[k] = 0 if isinstance(self._stats[k], int) else 0.0
        s["get_bandwidth"] = s["get_bytes"] / s["get_s"] if s["get_s"] else 0.0
        s["set_bandwidth"] = s["set_bytes"] / s["set_s"] if s["set_s"] else 0.0
        try:
            s["namespace"] = self.client.namespace(self.ns)
        except (KvError, OSError) as e:
            s["namespace"] = None
            self._failed("get_stats", e)
        return s

    def close(self):
        self.client.close()
