"""An LMCache remote-storage plugin on the 3FS-KV KV gateway.

A ``ConnectorAdapter`` for URLs ``fskv://host:port/namespace`` and the
``RemoteConnector`` it creates, on the thin client ``fskv_kv.py``. LMCache
configuration (YAML), with ``clients/python`` on ``PYTHONPATH``:

    remote_url: "fskv://127.0.0.1:9001/lmcache"
    remote_serde: "naive"
    remote_storage_plugins: ["fskv"]
    extra_config:
      remote_storage_plugin.fskv.module_path: lmcache_fskv
      remote_storage_plugin.fskv.class_name: FskvConnectorAdapter
      fskv.token_env: FSKV_KV_TOKEN      # or fskv.token: "..."; default $FSKV_KV_TOKEN
      fskv.exists_lease_ms: 10000         # lease of batched_async_contains(pin=True)
      fskv.threads: 8                     # the thread pool running the blocking calls

URL query parameters ``?token_env=…&lease_ms=…&threads=…&https=1`` override
the extra config.

Values: one gateway value per LMCache key = a 64-byte header (the memory
object's shape, dtype and format) followed by its bytes. Writes are atomic
(temp inode + replace on the gateway), so a reader never sees a header
without its payload — unlike a store that keeps them under two keys.

| header field | bytes |
|---|---|
| magic ``FKLC`` | 4 |
| format (LMCache ``MemoryFormat`` value) | 2 |
| ndim (≤ 5) | 2 |
| dtype name (``bfloat16`` …, NUL-padded) | 16 |
| dims, u64 each (unused = 0) | 40 |

Keys: ``CacheEngineKey.to_string()`` (e.g. ``model@world_size@worker_id@chunk_hash@dtype``,
may contain ``/``) as the raw key bytes — the gateway takes binary keys, so
nothing is escaped; isolation between models and workers is in the key
itself, tenants are separated by namespace.

The client is blocking (``http.client``): every call runs on this connector's
thread pool (``loop.run_in_executor``), never on the event loop.
``get`` allocates the memory object from LMCache's local CPU backend once the
header has arrived and reads the payload straight into it (no copy); ``put``
copies the object's bytes once into the request body.
"""

import asyncio
import concurrent.futures
import logging
import os
import struct
import urllib.parse

from fskv_kv import KvClient, KvError, Status

logger = logging.getLogger(__name__)

try:  # LMCache's real bases when it is installed
    from lmcache.v1.storage_backend.connector import ConnectorAdapter as _AdapterBase
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector as _ConnectorBase

    HAVE_LMCACHE = True
except Exception:  # noqa: BLE001 - ImportError, or torch/CUDA failures inside LMCache
    HAVE_LMCACHE = False

    class _ConnectorBase:
        """Stand-in for LMCache's RemoteConnector (tests without torch)."""

    class _AdapterBase:
        """Stand-in for LMCache's ConnectorAdapter (tests without torch)."""

        def __init__(self, schema=""):
            self.schema = schema

        def can_parse(self, url):
            return self.schema != "" and url.startswith(self.schema)


SCHEME = "fskv://"
HEADER = struct.Struct("<4sHH16s5Q")
HEADER_MAGIC = b"FKLC"
DEFAULT_EXISTS_LEASE_MS = 10_000
MAX_ITEMS_PER_REQUEST = 512
_OK = (Status.OK, Status.EXISTS)


def encode_header(shape, dtype, fmt):
    dims = [int(d) for d in shape]
    if len(dims) > 5:
        raise ValueError("at most 5 dimensions, got %d" % len(dims))
    name = str(dtype).split(".")[-1].encode()
    if len(name) > 16:
        raise ValueError("dtype name too long: %r" % name)
    fmt_value = int(getattr(fmt, "value", fmt))
    return HEADER.pack(HEADER_MAGIC, fmt_value, len(dims), name, *(dims + [0] * (5 - len(dims))))


def decode_header(head):
    """(shape tuple, dtype name, format value); ValueError on a foreign value."""
    if len(head) != HEADER.size:
        raise ValueError("value shorter than its header")
    magic, fmt, ndim, name, *dims = HEADER.unpack(head)
    if magic != HEADER_MAGIC or ndim > 5:
        raise ValueError("not an LMCache value written by this connector")
    return tuple(dims[:ndim]), name.rstrip(b"\0").decode(), fmt


def _payload_bytes(shape, dtype_name):
    sizes = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
    n = sizes.get(dtype_name)
    if n is None:
        return None
    for d in shape:
        n *= d
    return n


def parse_url(url):
    """(base http URL, namespace, query dict) from ``fskv://host:port/namespace?...``."""
    if not url.startswith(SCHEME):
        raise ValueError("not an fskv:// URL: %r" % url)
    u = urllib.parse.urlsplit(url)
    if not u.hostname or not u.port:
        raise ValueError("fskv URL needs host:port: %r" % url)
    ns = u.path.strip("/")
    if not ns or "/" in ns:
        raise ValueError("fskv URL needs one namespace as its path: %r" % url)
    q = {k: v[-1] for k, v in urllib.parse.parse_qs(u.query).items()}
    scheme = "https" if q.get("https") in ("1", "true") else "http"
    return "%s://%s:%d" % (scheme, u.hostname, u.port), ns, q


def _key_bytes(key):
    return (key.to_string() if hasattr(key, "to_string") else str(key)).encode()


class FskvConnector(_ConnectorBase):
    """LMCache RemoteConnector on one KV gateway namespace."""

    def __init__(self, base_url, namespace, loop, local_cpu_backend, token=None, exists_lease_ms=DEFAULT_EXISTS_LEASE_MS, threads=8, client=None):
        self.ns = namespace
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.exists_lease_ms = int(exists_lease_ms)
        self.client = client or KvClient(base_url, token, pool_size=max(16, int(threads)))
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=int(threads), thread_name_prefix="fskv-lmcache")
        try:
            self.client.namespace(namespace)
        except KvError as e:
            if e.status != 404:
                raise
            self.client.put_namespace(namespace)

    def _run(self, fn, *args):
        """Runs a blocking client call on the thread pool, off the event loop."""
        return asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # ----- values -----

    def _alloc(self, head, rest):
        """Allocates the memory object a value's header describes; (obj, its bytes) or None."""
        shape, dtype_name, fmt = decode_header(head)
        expect = _payload_bytes(shape, dtype_name)
        if expect is not None and expect != rest:
            raise ValueError("value has %d payload bytes, its header says %d" % (rest, expect))
        dtype, fmt_obj = _engine_types(dtype_name, fmt)
        obj = self.local_cpu_backend.allocate(_shape(shape), dtype, fmt_obj)
        if obj is None:
            logger.debug("fskv connector: local CPU backend could not allocate %s", shape)
            return None
        buf = obj.byte_array
        if len(memoryview(buf).cast("B")) < rest:
            obj.ref_count_down()
            raise ValueError("allocated object smaller than the value")
        return obj, buf

    def _get_many(self, keys):
        allocated = []

        def alloc(i, head, rest):
            got = self._alloc(head, rest)
            if got is not None:
                allocated.append(got[0])
            return got if got is not None else (None, None)

        try:
            out = []
            for a in range(0, len(keys), MAX_ITEMS_PER_REQUEST):
                out.extend(self.client.batch_get_alloc(self.ns, [_key_bytes(k) for k in keys[a : a + MAX_ITEMS_PER_REQUEST]], alloc, HEADER.size))
            return out
        except Exception:
            for obj in allocated:  # a cut response: give the memory back
                obj.ref_count_down()
            raise

    def _put_many(self, keys, objs):
        pairs = []
        for k, obj in zip(keys, objs):
            head = encode_header(obj.get_shape(), obj.get_dtype(), obj.get_memory_format())
            pairs.append((_key_bytes(k), head + bytes(memoryview(obj.byte_array).cast("B"))))
        st = []
        for a in range(0, len(pairs), MAX_ITEMS_PER_REQUEST):
            st.extend(self.client.batch_put(self.ns, pairs[a : a + MAX_ITEMS_PER_REQUEST], if_absent=True))
        bad = [i for i, s in enumerate(st) if s not in _OK]
        if bad:
            raise IOError("fskv connector: %d of %d puts failed (status %s)" % (len(bad), len(st), Status.NAMES[st[bad[0]]]))

    def _prefix_count(self, keys, lease_ms):
        found = 0
        for a in range(0, len(keys), MAX_ITEMS_PER_REQUEST):
            chunk = [_key_bytes(k) for k in keys[a : a + MAX_ITEMS_PER_REQUEST]]
            _, n = self.client.batch_exists(self.ns, chunk, prefix=True, lease_ms=lease_ms)
            found += n
            if n < len(chunk):
                break
        return found

    # ----- RemoteConnector -----

    async def exists(self, key):
        return await self._run(self.exists_sync, key)

    def exists_sync(self, key):
        return self._prefix_count([key], 0) == 1

    async def get(self, key):
        try:
            return (await self._run(self._get_many, [key]))[0]
        except (KvError, OSError, ValueError) as e:
            logger.warning("fskv connector: get failed: %s", e)
            return None

    async def put(self, key, memory_obj):
        # The caller (LMCache's remote backend) releases memory_obj after this returns.
        await self._run(self._put_many, [key], [memory_obj])

    def support_batched_get(self):
        return True

    async def batched_get(self, keys):
        try:
            return await self._run(self._get_many, list(keys))
        except (KvError, OSError, ValueError) as e:
            logger.warning("fskv connector: batched_get failed: %s", e)
            return [None] * len(keys)

    def support_batched_put(self):
        return True

    async def batched_put(self, keys, memory_objs):
        await self._run(self._put_many, list(keys), list(memory_objs))

    def support_batched_async_contains(self):
        return True

    async def batched_async_contains(self, lookup_id, keys, pin=False):
        """Leading keys present (the hit count); ``pin`` leases them against eviction."""
        return await self._run(self._prefix_count, list(keys), self.exists_lease_ms if pin else 0)

    def support_batched_contains(self):
        return True

    def batched_contains(self, keys, stop_after_first_not_exits=True):
        if stop_after_first_not_exits:
            n = self._prefix_count(list(keys), 0)
            return [i < n for i in range(len(keys))]
        out = []
        for a in range(0, len(keys), MAX_ITEMS_PER_REQUEST):
            st, _ = self.client.batch_exists(self.ns, [_key_bytes(k) for k in keys[a : a + MAX_ITEMS_PER_REQUEST]])
            out.extend(s == Status.OK for s in st)
        return out

    async def list(self):
        keys = await self._run(self.client.scan_all, self.ns)
        return [k.decode("utf-8", "replace") for k in keys]

    def remove_sync(self, key):
        try:
            return self.client.delete(self.ns, _key_bytes(key))
        except (KvError, OSError) as e:
            logger.warning("fskv connector: remove failed: %s", e)
            return False

    def support_ping(self):
        return True

    async def ping(self):
        """0 when the namespace answers, else the HTTP status (or -1 unreachable)."""

        def probe():
            try:
                self.client.namespace(self.ns)
                return 0
            except KvError as e:
                return e.status
            except OSError:
                return -1

        return await self._run(probe)

    async def close(self):
        self.pool.shutdown(wait=True)
        self.client.close()

    def __repr__(self):
        return "<FskvConnector ns=%s>" % self.ns


def _shape(dims):
    try:
        import torch

        return torch.Size(dims)
    except ImportError:
        return tuple(dims)


def _engine_types(dtype_name, fmt):
    """(torch dtype, LMCache MemoryFormat) when they are installed, else the names."""
    try:
        import torch

        dtype = getattr(torch, dtype_name)
    except (ImportError, AttributeError):
        dtype = dtype_name
    if HAVE_LMCACHE:
        from lmcache.v1.memory_management import MemoryFormat

        return dtype, MemoryFormat(fmt)
    return dtype, fmt


class FskvConnectorAdapter(_AdapterBase):
    """Creates an FskvConnector for ``fskv://host:port/namespace`` URLs."""

    def __init__(self):
        super().__init__(SCHEME)

    def create_connector(self, context):
        base, ns, q = parse_url(context.url)
        extra = getattr(getattr(context, "config", None), "extra_config", None) or {}
        token = q.get("token") or extra.get("fskv.token")
        if token is None:
            token = os.environ.get(q.get("token_env") or extra.get("fskv.token_env", "FSKV_KV_TOKEN"))
        lease = int(q.get("lease_ms") or extra.get("fskv.exists_lease_ms", DEFAULT_EXISTS_LEASE_MS))
        threads = int(q.get("threads") or extra.get("fskv.threads", 8))
        logger.info("fskv connector: %s namespace %s", base, ns)
        return FskvConnector(base, ns, context.loop, context.local_cpu_backend, token=token, exists_lease_ms=lease, threads=threads)
