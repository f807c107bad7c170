"""USRBIO from Python: the ``hf3fs_fuse.io`` interface of 3FS, for 3FS-KV.

Programs written for 3FS (for example SGLang's HiCache 3FS backend) use::

    from hf3fs_fuse.io import make_iovec, make_ioring, register_fd, deregister_fd, extract_mount_point

    fd = os.open(path, os.O_RDWR)
    register_fd(fd)
    mount = extract_mount_point(path)
    shm = multiprocessing.shared_memory.SharedMemory(size=n, create=True)
    iov = make_iovec(shm, mount)            # registers the shared memory with the daemon
    ior = make_ioring(mount, entries, for_read=True)
    ior.prepare(iov[0:4096], True, fd, offset)
    done = ior.submit().wait(min_results=1) # list of iovec slices, each with .result
    data = shm.buf[0:done[0].result]

This module is written for 3FS-KV over the C library ``libhf3fs_api_shared.so``
with ctypes (standard library only). The library is found through the
``HF3FS_USRBIO_LIB`` environment variable, else where ``deploy/install-usrbio.sh``
installed it, else on the system's library path.
"""

import ctypes
import ctypes.util
import datetime
import errno as _errno
import multiprocessing.shared_memory
import os
import os.path
import time
import uuid

__all__ = [
    "iovec",
    "ioring",
    "IorPriority",
    "make_iovec",
    "make_ioring",
    "register_fd",
    "deregister_fd",
    "extract_mount_point",
    "force_fsync",
    "hardlink",
    "punch_hole",
    "read_file",
    "HF3FS_IOR_ALLOW_READ_UNCOMMITTED",
    "HF3FS_IOR_FORBID_READ_HOLES",
]

HF3FS_IOR_ALLOW_READ_UNCOMMITTED = 1
HF3FS_IOR_FORBID_READ_HOLES = 2


def _library_path():
    env = os.environ.get("HF3FS_USRBIO_LIB")
    if env:
        return env
    try:
        from . import _installed  # written by deploy/install-usrbio.sh

        if os.path.exists(_installed.LIBRARY):
            return _installed.LIBRARY
    except ImportError:
        pass
    found = ctypes.util.find_library("hf3fs_api_shared")
    if found:
        return found
    raise ImportError("libhf3fs_api_shared.so not found: set HF3FS_USRBIO_LIB or run deploy/install-usrbio.sh")


class _Iov(ctypes.Structure):
    _fields_ = [
        ("base", ctypes.c_void_p),
        ("iovh", ctypes.c_void_p),
        ("id", ctypes.c_ubyte * 16),
        ("mount_point", ctypes.c_char * 256),
        ("size", ctypes.c_size_t),
        ("block_size", ctypes.c_size_t),
        ("numa", ctypes.c_int),
    ]


class _Ior(ctypes.Structure):
    _fields_ = [
        ("iov", _Iov),
        ("iorh", ctypes.c_void_p),
        ("mount_point", ctypes.c_char * 256),
        ("for_read", ctypes.c_bool),
        ("io_depth", ctypes.c_int),
        ("priority", ctypes.c_int),
        ("timeout", ctypes.c_int),
        ("flags", ctypes.c_uint64),
    ]


class _Cqe(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("result", ctypes.c_int64),
        ("userdata", ctypes.c_void_p),
    ]


assert ctypes.sizeof(_Iov) == 312 and ctypes.sizeof(_Ior) == 600 and ctypes.sizeof(_Cqe) == 24

_lib = ctypes.CDLL(_library_path(), use_errno=True)


def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_P = ctypes.POINTER
_extract = _fn("hf3fs_extract_mount_point", ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p)
_iovwrap = _fn(
    "hf3fs_iovwrap", ctypes.c_int, _P(_Iov), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int
)
_ior_size = _fn("hf3fs_ior_size", ctypes.c_size_t, ctypes.c_int)
_iorcreate3 = _fn(
    "hf3fs_iorcreate3", ctypes.c_int, _P(_Ior), ctypes.c_char_p, ctypes.c_int, ctypes.c_bool, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int
)
_iorcreate4 = _fn(
    "hf3fs_iorcreate4",
    ctypes.c_int,
    _P(_Ior),
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_bool,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_uint64,
)
_iordestroy = _fn("hf3fs_iordestroy", None, _P(_Ior))
_reg_fd = _fn("hf3fs_reg_fd", ctypes.c_int, ctypes.c_int, ctypes.c_uint64)
_dereg_fd = _fn("hf3fs_dereg_fd", None, ctypes.c_int)
_io_entries = _fn("hf3fs_io_entries", ctypes.c_int, _P(_Ior))
_prep_io = _fn(
    "hf3fs_prep_io",
    ctypes.c_int,
    _P(_Ior),
    _P(_Iov),
    ctypes.c_bool,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_size_t,
    ctypes.c_uint64,
    ctypes.c_void_p,
)
_submit = _fn("hf3fs_submit_ios", ctypes.c_int, _P(_Ior))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_wait = _fn("hf3fs_wait_for_ios", ctypes.c_int, _P(_Ior), _P(_Cqe), ctypes.c_int, ctypes.c_int, _P(_Timespec))
_hardlink = _fn("hf3fs_hardlink", ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)


def _oserror(code, what=None):
    return OSError(code, os.strerror(code) if what is None else f"{os.strerror(code)}: {what}")


def extract_mount_point(path):
    """The mount point of the 3FS(-KV) mount holding ``path``, or None."""
    buf = ctypes.create_string_buffer(4096)
    res = _extract(buf, len(buf), os.fsencode(path))
    if res < 0:
        return None
    if res > len(buf):
        raise _oserror(_errno.ENAMETOOLONG)
    return buf.value.decode()


def register_fd(fd, flags=0):
    """Registers an open file of the mount for USRBIO (a file may be
    registered once until deregistered). Raises OSError on failure."""
    res = _reg_fd(fd, flags)
    if res > 0:
        raise _oserror(res, f"fd {fd}")


def deregister_fd(fd):
    """Forgets the registration of ``fd`` (do it before closing the file)."""
    _dereg_fd(fd)


def force_fsync(fd):
    """Makes the file's length visible to other clients (``fsync`` through
    the mount reports the length of USRBIO writes)."""
    os.fsync(fd)
    return 0


def hardlink(target, link_name):
    res = _hardlink(os.fsencode(target), os.fsencode(link_name))
    if res != 0:
        raise _oserror(res)


def punch_hole(*args, **kwargs):
    """Not supported by 3FS-KV."""
    raise _oserror(_errno.EOPNOTSUPP, "punch_hole")


class iovec:
    """A buffer in shared memory registered with the mount's daemon, or a
    slice of one (``iov[a:b]``). After ``ioring.wait`` a slice carries
    ``result`` (bytes transferred, or -errno) and ``userdata``."""

    def __init__(self, address, size, iov_id, mount, block_size=0, numa=-1, link=None, owner=None, root=None):
        self._address = address
        self._size = size
        self._id = bytes(iov_id)
        self._mount = mount
        self._block_size = block_size
        self._numa = numa
        self._link = link
        self._owner = owner  # keeps the memory (e.g. a SharedMemory) alive
        self._root = root  # the whole iov, for slices
        self.result = 0
        self.userdata = None
        self._struct = None
        if root is None:
            s = _Iov()
            res = _iovwrap(ctypes.byref(s), address, self._id, os.fsencode(mount), size, block_size, numa)
            if res < 0:
                raise _oserror(-res, "iovwrap")
            self._struct = s

    @property
    def base_off(self):
        return self._address - self._root._address if self._root is not None else 0

    @property
    def buf(self):
        """The bytes as a writable memoryview (no copy)."""
        if self._size == 0:
            return memoryview(bytearray())
        arr = (ctypes.c_ubyte * self._size).from_address(self._address)
        return memoryview(arr).cast("B")

    def __buffer__(self, flags):
        return self.buf

    def __len__(self):
        return self._size

    def __bytes__(self):
        return bytes(self.buf)

    def __getitem__(self, key):
        if not isinstance(key, slice):
            raise TypeError("iovec indices must be slices")
        start, stop, step = key.indices(self._size)
        if step != 1:
            raise ValueError("step not 1 when slicing iovec")
        length = max(0, stop - start)
        root = self._root if self._root is not None else self
        return iovec(self._address + start, length, self._id, self._mount, self._block_size, self._numa, root=root)

    def __setitem__(self, key, value):
        if not isinstance(key, slice):
            raise TypeError("iovec indices must be slices")
        self.buf[key] = value

    def slice_by(self, buf):
        """The slice of this iovec that ``buf`` (a buffer inside it) covers."""
        mv = memoryview(buf)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mv)) if not mv.readonly else None
        if addr is None or addr < self._address or addr + mv.nbytes > self._address + self._size:
            raise IndexError("given buf is out of range")
        return self[addr - self._address : addr - self._address + mv.nbytes]

    def _root_struct(self):
        return (self._root if self._root is not None else self)._struct

    def __del__(self):
        link = getattr(self, "_link", None)
        if link:
            try:
                os.unlink(link)
            except OSError:
                pass
            self._link = None


class IorPriority(object):
    HIGH = -1
    NORMAL = 0
    LOW = 1


def _buffer_address(buf):
    """Address of a writable buffer, without keeping it exported (so the
    owner, e.g. a SharedMemory, can still be closed later)."""
    c = ctypes.c_char.from_buffer(buf)
    addr = ctypes.addressof(c)
    del c
    return addr


def make_iovec(shm, hf3fs_mount_point, block_size=0, numa=-1):
    """Registers a ``multiprocessing.shared_memory.SharedMemory`` (or any
    object with ``.name`` naming a /dev/shm file and a writable ``.buf``)
    with the mount and returns an ``iovec`` over it. The registration goes
    when the iovec is deleted; the shared memory may be unlinked right after
    this call (the daemon keeps its mapping)."""
    iov_id = uuid.uuid4()
    target = os.path.normpath(f"/dev/shm/{shm.name.lstrip('/')}")
    link = f"{hf3fs_mount_point}/3fs-virt/iovs/{iov_id}{f'.b{block_size}' if block_size > 0 else ''}"
    os.symlink(target, link)
    try:
        buf = shm.buf
        return iovec(_buffer_address(buf), len(buf), iov_id.bytes, hf3fs_mount_point, block_size, numa, link=link, owner=shm)
    except BaseException:
        os.unlink(link)
        raise


def _deadline(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout)
    t = time.time() + max(0.0, seconds)
    return _Timespec(int(t), int((t - int(t)) * 1e9))


class ioring:
    """An I/O ring of the mount (see ``make_ioring``)."""

    def __init__(self, hf3fs_mount_point, entries, for_read=True, io_depth=0, priority=None, timeout=None, numa=-1, flags=0):
        self._ior = _Ior()
        mp = os.fsencode(hf3fs_mount_point)
        if priority is not None and not flags:
            res = _iorcreate3(ctypes.byref(self._ior), mp, entries, for_read, io_depth, int(priority), int(timeout or 0), numa)
        else:
            res = _iorcreate4(ctypes.byref(self._ior), mp, entries, for_read, io_depth, int(timeout or 0), numa, flags)
        if res < 0:
            raise _oserror(-res, "ioring")
        self._live = True
        self._inflight = {}
        self._cqes = (_Cqe * max(1, self.entries))()

    @staticmethod
    def size_for_entries(entries):
        return _ior_size(entries)

    @property
    def entries(self):
        return _io_entries(ctypes.byref(self._ior))

    def prepare(self, iov, read, fd, off, userdata=None):
        """Queues a read into (``read=True``) or a write from ``iov`` (an
        iovec or a slice of one; its whole length) at offset ``off`` of the
        registered ``fd``. Returns the ring. Raises OSError (EINVAL, EBADF,
        EACCES, EAGAIN when the ring is full)."""
        root = iov._root_struct()
        if root is None:
            raise _oserror(_errno.EINVAL, "not an iovec of make_iovec")
        res = _prep_io(ctypes.byref(self._ior), ctypes.byref(root), read, iov._address, fd, off, len(iov), None)
        if res < 0:
            raise _oserror(-res, "prepare")
        iov.result = 0
        iov.userdata = userdata
        self._inflight[res] = iov
        return self

    def submit(self):
        res = _submit(ctypes.byref(self._ior))
        if res < 0:
            raise _oserror(-res, "submit")
        return self

    def wait(self, *, max_results=0, min_results=0, timeout=None):
        """Waits for at least ``min_results`` completions (at most
        ``timeout``: a timedelta or seconds; None = no limit) and returns
        the completed iovecs (``.result``, ``.userdata``), up to
        ``max_results`` if given."""
        if max_results < min_results:
            max_results = min_results
        deadline = _deadline(timeout)
        now = _deadline(0)
        cap = max_results if max_results > 0 else (min_results if min_results > 0 else 1)
        cap = min(cap, len(self._cqes))
        out = []
        while True:
            want = min_results - len(out)
            dl = deadline if len(out) < min_results else now
            res = _wait(
                ctypes.byref(self._ior), self._cqes, cap, max(0, want), ctypes.byref(dl) if dl is not None else None
            )
            if res < 0:
                if not out:
                    raise _oserror(-res, "wait")
                return out
            for i in range(res):
                c = self._cqes[i]
                iov = self._inflight.pop(c.index, None)
                if iov is None:
                    continue
                iov.result = c.result
                out.append(iov)
            if res == 0 or len(out) >= max_results:
                return out

    def destroy(self):
        if getattr(self, "_live", False):
            self._live = False
            _iordestroy(ctypes.byref(self._ior))

    def __del__(self):
        self.destroy()


def make_ioring(hf3fs_mount_point, entries, for_read=True, io_depth=0, priority=None, timeout=None, numa=-1, flags=0):
    """Creates an I/O ring of ``entries`` requests.

    io_depth = 0: the daemon takes whatever is prepared; > 0: exactly
    io_depth at a time (make sure enough are prepared, or wait() blocks);
    < 0: up to -io_depth at a time, waiting at most ``timeout`` ms for a
    batch to fill. ``flags``: HF3FS_IOR_ALLOW_READ_UNCOMMITTED (1),
    HF3FS_IOR_FORBID_READ_HOLES (2: a read meeting a hole fails with -ENODATA
    instead of reading zeros). ``priority`` (IorPriority) is used when no
    flags are given."""
    return ioring(hf3fs_mount_point, entries, for_read, io_depth, priority, timeout, numa, flags)


def read_file(fn, hf3fs_mount_point=None, block_size=1 << 30, off=0, priority=None, cb=None):
    """Reads a whole file through USRBIO in blocks of ``block_size``; returns
    the bytes, or with ``cb(buf, offset)`` hands each block to it."""
    if hf3fs_mount_point is None:
        hf3fs_mount_point = extract_mount_point(fn)
    bufs = []
    fd = None
    registered = False
    shm = None
    iov = None
    ior = None
    try:
        fd = os.open(fn, os.O_RDONLY)
        register_fd(fd)
        registered = True
        shm = multiprocessing.shared_memory.SharedMemory(size=block_size, create=True)
        iov = make_iovec(shm, hf3fs_mount_point)
        ior = make_ioring(hf3fs_mount_point, 1, priority=priority)
        roff = off
        while True:
            ior.prepare(iov[:], True, fd, roff)
            done = ior.submit().wait(min_results=1)[0]
            if done.result < 0:
                raise _oserror(-done.result)
            if done.result == 0:
                break
            if cb is None:
                bufs.append(bytes(shm.buf[: done.result]))
            else:
                res = cb(shm.buf[: done.result], roff)
                if type(res) == int:
                    roff = res
                    continue
                elif res:
                    return None
            if done.result < block_size:
                break
            roff += block_size
        if cb is not None:
            return None
        return bufs[0] if len(bufs) == 1 else b"".join(bufs)
    finally:
        if registered:
            deregister_fd(fd)
        if fd is not None:
            os.close(fd)
        if ior is not None:
            ior.destroy()
        del iov
        if shm is not None:
            shm.close()
            shm.unlink()
