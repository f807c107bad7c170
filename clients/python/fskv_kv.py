"""A thin client of the 3FS-KV KV gateway's native API (docs/kv.md).

Standard library only. Connections are pooled (HTTP/1.1 keep-alive, one
connection per concurrent call, at most ``pool_size`` kept idle); values are
raw bytes on the wire; ``get_into`` / ``batch_get_into`` read a value straight
into the caller's buffer (a ``bytearray``, ``memoryview`` or anything with the
buffer protocol, e.g. a pinned tensor's memory) without an intermediate copy.

    c = KvClient("http://127.0.0.1:9001", token="...")
    c.put_namespace("cache")
    c.put("cache", b"key", b"value")
    c.get("cache", b"key")                    # b"value"
    n = c.get_into("cache", b"key", buf)       # bytes written into buf
    c.batch_exists("cache", keys, prefix=True) # (statuses, prefix_count)
"""

import http.client
import json
import queue
import struct
import threading
import urllib.parse

__all__ = ["KvClient", "KvError", "Status", "Version"]

OP_GET, OP_PUT, OP_DELETE, OP_EXISTS, OP_SCAN = 1, 2, 3, 4, 5
FLAG_PREFIX = 1
ITEM_IF_ABSENT, ITEM_IF_MATCH, ITEM_TTL = 1, 2, 4
TRAILER_MORE = 1
_HEADER = struct.Struct("<4sBBHII")
_ITEM_HEAD = struct.Struct("<BBHQQQQ")
_TRAILER = struct.Struct("<4sIII")


class Status:
    OK, NOT_FOUND, EXISTS, PRECONDITION_FAILED, SKIPPED, ERROR, TOO_LARGE = range(7)
    NAMES = ["Ok", "NotFound", "Exists", "PreconditionFailed", "Skipped", "Error", "TooLarge"]


class Version(tuple):
    """A key's version (the ETag): (inode, version)."""

    def __new__(cls, inode, version):
        return super().__new__(cls, (inode, version))

    @property
    def etag(self):
        return '"%x-%x"' % (self[0], self[1])

    @classmethod
    def parse(cls, etag):
        s = etag.strip()
        if s.startswith("W/"):
            s = s[2:]
        s = s.strip('"')
        a, b = s.split("-")
        return cls(int(a, 16), int(b, 16))


class KvError(Exception):
    """An HTTP error of the gateway: ``status``, ``code`` (e.g. ``NoSuchKey``), ``message``."""

    def __init__(self, status, code, message):
        super().__init__("HTTP %d %s: %s" % (status, code, message))
        self.status, self.code, self.message = status, code, message


def _q(b):
    if isinstance(b, str):
        b = b.encode()
    return urllib.parse.quote(b, safe="")


def _key(k):
    return k.encode() if isinstance(k, str) else bytes(k)


class KvClient:
    def __init__(self, base_url, token=None, pool_size=16, timeout=60.0):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise ValueError("base_url must be http:// or https://")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._token = token
        self._timeout = timeout
        self._idle = queue.LifoQueue(maxsize=pool_size)
        self._lock = threading.Lock()

    # ----- connections -----

    def _conn(self):
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            return cls(self._host, self._port, timeout=self._timeout)

    def _release(self, conn):
        try:
            self._idle.put_nowait(conn)
        except queue.Full:
            conn.close()

    def close(self):
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def _request(self, method, path, body=None, headers=None):
        """Sends a request; returns (conn, response) with the body unread.
        The caller reads the body and calls ``_done``."""
        h = {"Host": "%s:%d" % (self._host, self._port)}
        if self._token:
            h["Authorization"] = "Bearer " + self._token
        if headers:
            h.update(headers)
        if body is None and method in ("PUT", "POST"):
            body = b""
        for attempt in (0, 1):
            conn = self._conn()
            try:
                conn.request(method, path, body=body, headers=h)
                resp = conn.getresponse()
                return conn, resp
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # An idle pooled connection the server closed: retry once on a new one
                # (only when the body can be sent again).
                conn.close()
                if attempt == 1 or not (body is None or isinstance(body, (bytes, bytearray, memoryview))):
                    raise
            except Exception:
                conn.close()
                raise

    def _done(self, conn, resp):
        if resp.will_close:
            conn.close()
        else:
            self._release(conn)

    def _call(self, method, path, body=None, headers=None, ok=(200, 201, 204, 206, 304)):
        conn, resp = self._request(method, path, body, headers)
        try:
            data = resp.read()
        except Exception:
            conn.close()
            raise
        self._done(conn, resp)
        if resp.status not in ok:
            raise _error(resp.status, data)
        return resp, data

    # ----- namespaces -----

    def put_namespace(self, ns, **settings):
        """Creates a namespace or sets its settings (capacity_bytes, capacity_keys,
        high_watermark, low_watermark, default_ttl_ms)."""
        body = json.dumps(settings).encode() if settings else b""
        _, data = self._call("PUT", "/v1/ns/" + _q(ns), body)
        return json.loads(data)

    def namespace(self, ns):
        """Settings and stats (keys, bytes, hits, misses, evictions, expirations)."""
        return json.loads(self._call("GET", "/v1/ns/" + _q(ns))[1])

    def delete_namespace(self, ns):
        self._call("DELETE", "/v1/ns/" + _q(ns))

    # ----- one key -----

    def _path(self, ns, key):
        return "/v1/kv/%s/%s" % (_q(ns), _q(_key(key)))

    def put(self, ns, key, value, if_absent=False, if_match=None, ttl_ms=None):
        """Writes a value (bytes, or a file object with a known length given as
        ``(fileobj, length)``). Returns the new Version. ``if_absent``: 412 if the
        key exists; ``if_match``: 412 unless the key has that Version."""
        h = {"Content-Type": "application/octet-stream"}
        if isinstance(value, tuple):
            value, length = value
            h["Content-Length"] = str(length)
        if if_absent:
            h["If-None-Match"] = "*"
        if if_match is not None:
            h["If-Match"] = Version(*if_match).etag
        if ttl_ms is not None:
            h["X-Kv-Ttl-Ms"] = str(int(ttl_ms))
        resp, _ = self._call("PUT", self._path(ns, key), value, h)
        return Version.parse(resp.getheader("ETag"))

    def get(self, ns, key, range=None):
        """The value (bytes), or None when the key is missing. ``range``: (first, last) inclusive."""
        h = {"Range": "bytes=%d-%d" % range} if range else None
        try:
            return self._call("GET", self._path(ns, key), headers=h)[1]
        except KvError as e:
            if e.status == 404 and e.code == "NoSuchKey":
                return None
            raise

    def get_with_version(self, ns, key):
        """(value, Version) or None."""
        try:
            resp, data = self._call("GET", self._path(ns, key))
        except KvError as e:
            if e.status == 404 and e.code == "NoSuchKey":
                return None
            raise
        return data, Version.parse(resp.getheader("ETag"))

    def get_into(self, ns, key, buffer, offset=0):
        """Reads the value straight into ``buffer`` (at ``offset``); returns its
        length, or -1 when the key is missing. Raises ValueError (after draining
        the response) when the buffer is too small."""
        conn, resp = self._request("GET", self._path(ns, key))
        try:
            if resp.status != 200:
                data = resp.read()
                self._done(conn, resp)
                if resp.status == 404:
                    err = _error(resp.status, data)
                    if err.code == "NoSuchKey":
                        return -1
                    raise err
                raise _error(resp.status, data)
            length = int(resp.getheader("Content-Length"))
            view = memoryview(buffer).cast("B")
            if offset + length > len(view):
                resp.read()
                self._done(conn, resp)
                raise ValueError("buffer too small: the value has %d bytes" % length)
            _readinto_exact(resp, view[offset : offset + length])
        except Exception:
            conn.close()
            raise
        self._done(conn, resp)
        return length

    def head(self, ns, key):
        """(size, Version) or None."""
        conn, resp = self._request("HEAD", self._path(ns, key))
        resp.read()
        self._done(conn, resp)
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise KvError(resp.status, "", "HEAD failed")
        return int(resp.getheader("Content-Length")), Version.parse(resp.getheader("ETag"))

    def delete(self, ns, key, if_match=None):
        """True if a key was removed."""
        h = {"If-Match": Version(*if_match).etag} if if_match is not None else None
        try:
            self._call("DELETE", self._path(ns, key), headers=h)
            return True
        except KvError as e:
            if e.status == 404 and e.code == "NoSuchKey":
                return False
            raise

    # ----- batches -----

    def _batch(self, ns, op, name, items, flags=0, lease_ms=0):
        body = _encode_request(op, flags, lease_ms, items)
        return self._request("POST", "/v1/kv/%s?batch=%s" % (_q(ns), name), body, {"Content-Type": "application/x-fskv-batch"})

    def _batch_decode(self, ns, op, name, items, flags=0, lease_ms=0, into=None):
        conn, resp = self._batch(ns, op, name, items, flags, lease_ms)
        try:
            if resp.status != 200:
                data = resp.read()
                self._done(conn, resp)
                raise _error(resp.status, data)
            out = _decode_response(resp, into)
        except Exception:
            conn.close()
            raise
        self._done(conn, resp)
        return out

    def batch_get(self, ns, keys):
        """Values in key order (None for a missing key)."""
        items = [(_key(k), None, 0, None, None) for k in keys]
        res = self._batch_decode(ns, OP_GET, "get", items)
        return [v if s == Status.OK else None for (s, _, _, _, v) in res["items"]]

    def batch_get_into(self, ns, keys, buffers, prefix=False):
        """Reads each value straight into ``buffers[i]``; returns the lengths
        (-1 for a missing key). A buffer too small raises ValueError.
        ``prefix=True``: the gateway stops at the first missing key (later
        keys answer -1 without being read)."""
        items = [(_key(k), None, 0, None, None) for k in keys]
        flags = FLAG_PREFIX if prefix else 0
        res = self._batch_decode(ns, OP_GET, "get", items, flags, into=[memoryview(b).cast("B") for b in buffers])
        return [n if s == Status.OK else -1 for (s, _, _, _, n) in res["items"]]

    def batch_get_alloc(self, ns, keys, alloc, head_bytes=0):
        """Reads values whose destination is known only once their first bytes
        (a header the writer put in front) have arrived. For each present key,
        the first ``min(head_bytes, length)`` bytes are read, then
        ``alloc(i, head, rest_len)`` is called: it returns a buffer of at least
        ``rest_len`` bytes that the rest is read into (straight, no copy), or
        None to drop the value. Returns, per key, alloc's buffer's owner as
        returned by ``alloc`` (see below), None for a missing or dropped key.

        ``alloc`` may return ``(owner, buffer)``: ``owner`` is what the result
        list holds (e.g. an engine's memory object), ``buffer`` what is filled."""
        items = [(_key(k), None, 0, None, None) for k in keys]
        conn, resp = self._batch(ns, OP_GET, "get", items)
        try:
            if resp.status != 200:
                data = resp.read()
                self._done(conn, resp)
                raise _error(resp.status, data)
            out = _decode_response(resp, None, alloc=(alloc, head_bytes))
        except Exception:
            conn.close()
            raise
        self._done(conn, resp)
        return [v if s == Status.OK else None for (s, _, _, _, v) in out["items"]]

    def batch_put(self, ns, pairs, if_absent=False, ttl_ms=None):
        """Writes ``[(key, value), ...]`` atomically per key; returns the statuses
        (Status.OK, or Status.EXISTS for a create-only put of an existing key,
        which counts as success)."""
        items = [(_key(k), bytes(v), ITEM_IF_ABSENT if if_absent else 0, None, ttl_ms) for k, v in pairs]
        return [s for (s, _, _, _, _) in self._batch_decode(ns, OP_PUT, "put", items)["items"]]

    def batch_exists(self, ns, keys, prefix=False, lease_ms=0):
        """(statuses, prefix_count): the number of leading keys that exist.
        ``prefix=True`` stops at the first missing key (later ones: Skipped);
        ``lease_ms`` pins the leading existing keys against eviction."""
        items = [(_key(k), None, 0, None, None) for k in keys]
        res = self._batch_decode(ns, OP_EXISTS, "exists", items, FLAG_PREFIX if prefix else 0, lease_ms)
        return [s for (s, _, _, _, _) in res["items"]], res["prefix"]

    def batch_delete(self, ns, keys):
        items = [(_key(k), None, 0, None, None) for k in keys]
        return [s for (s, _, _, _, _) in self._batch_decode(ns, OP_DELETE, "delete", items)["items"]]

    def delete_prefix(self, ns, prefix):
        """Removes every key starting with ``prefix``; how many."""
        _, data = self._call("DELETE", "/v1/kv/%s?prefix=%s" % (_q(ns), _q(_key(prefix))))
        return json.loads(data)["deleted"]

    def scan(self, ns, prefix=b"", start_after=None, limit=1000, values=False):
        """One page: ([(key, value or None), ...], more)."""
        q = {"prefix": _key(prefix), "limit": str(limit)}
        if start_after is not None:
            q["start_after"] = _key(start_after)
        if values:
            q["values"] = "1"
        qs = "&".join("%s=%s" % (k, _q(v)) for k, v in q.items())
        conn, resp = self._request("GET", "/v1/kv/%s?%s" % (_q(ns), qs))
        try:
            if resp.status != 200:
                data = resp.read()
                self._done(conn, resp)
                raise _error(resp.status, data)
            res = _decode_response(resp, None)
        except Exception:
            conn.close()
            raise
        self._done(conn, resp)
        return [(k, v if values and s == Status.OK else None) for (s, k, _, _, v) in res["items"]], res["more"]

    def scan_all(self, ns, prefix=b""):
        """Every key with the prefix (pages through)."""
        out, after = [], None
        while True:
            page, more = self.scan(ns, prefix, after)
            out.extend(k for k, _ in page)
            if not more or not page:
                return out
            after = page[-1][0]


def _error(status, data):
    try:
        e = json.loads(data)["error"]
        return KvError(status, e.get("code", ""), e.get("message", ""))
    except Exception:
        return KvError(status, "", data[:200].decode("utf-8", "replace"))


def _readinto_exact(resp, view):
    got = 0
    while got < len(view):
        n = resp.readinto(view[got:])
        if not n:
            raise ConnectionError("response cut after %d of %d bytes" % (got, len(view)))
        got += n


def _read_exact(resp, n):
    buf = bytearray(n)
    _readinto_exact(resp, memoryview(buf))
    return bytes(buf)


def _read_alloc(resp, alloc, i, value_len):
    fn, head_bytes = alloc
    head = _read_exact(resp, min(head_bytes, value_len))
    rest = value_len - len(head)
    got = fn(i, head, rest)
    owner, buf = got if isinstance(got, tuple) else (got, got)
    if owner is None:
        _skip(resp, rest)
        return None
    view = memoryview(buf).cast("B")
    if len(view) < rest:
        raise ValueError("buffer %d too small: the value has %d bytes after its header" % (i, rest))
    _readinto_exact(resp, view[:rest])
    return owner


def _skip(resp, n):
    scratch = memoryview(bytearray(min(n, 1 << 20) or 1))
    while n > 0:
        _readinto_exact(resp, scratch[: min(n, len(scratch))])
        n -= min(n, len(scratch))


def _encode_request(op, flags, lease_ms, items):
    """items: (key, value, item_flags, if_match, ttl_ms)."""
    parts = [_HEADER.pack(b"FKVB", 1, op, flags, len(items), lease_ms)]
    for key, value, f, if_match, ttl in items:
        if if_match is not None:
            f |= ITEM_IF_MATCH
        if ttl is not None:
            f |= ITEM_TTL
        parts.append(struct.pack("<HBB", len(key), f, 0))
        if if_match is not None:
            parts.append(struct.pack("<QQ", if_match[0], if_match[1]))
        if ttl is not None:
            parts.append(struct.pack("<Q", ttl))
        if op == OP_PUT:
            parts.append(struct.pack("<Q", len(value)))
        parts.append(key)
        if op == OP_PUT:
            parts.append(value)
    return b"".join(parts)


def _decode_response(resp, into, alloc=None):
    """Reads a framed response from ``resp`` incrementally. With ``into``,
    item i's value goes into ``into[i]`` and its length is returned in place of bytes.
    With ``alloc`` = (function, head_bytes): see ``KvClient.batch_get_alloc``."""
    magic, version, op, _, count, _ = _HEADER.unpack(_read_exact(resp, _HEADER.size))
    if magic != b"FKVR" or version != 1:
        raise ConnectionError("not a batch response")
    items = []
    for i in range(count):
        status, _, key_len, inode, ver, index, value_len = _ITEM_HEAD.unpack(_read_exact(resp, _ITEM_HEAD.size))
        key = _read_exact(resp, key_len) if key_len else b""
        if alloc is not None:
            value = _read_alloc(resp, alloc, i, value_len) if value_len else None
        elif into is not None and value_len:
            if value_len > len(into[i]):
                raise ValueError("buffer %d too small: the value has %d bytes" % (i, value_len))
            _readinto_exact(resp, into[i][:value_len])
            value = value_len
        elif into is not None:
            value = 0
        else:
            value = _read_exact(resp, value_len) if value_len else b""
        items.append((status, key, Version(inode, ver), index, value))
    magic, ok, prefix, flags = _TRAILER.unpack(_read_exact(resp, _TRAILER.size))
    if magic != b"FKVE":
        raise ConnectionError("response without its trailer (incomplete)")
    return {"items": items, "ok": ok, "prefix": prefix, "more": bool(flags & TRAILER_MORE)}
