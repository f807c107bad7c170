"""The Python module hf3fs_fuse.io against a 3FS-KV mount: the cases of the
C conformance program, each checked against the same operation through
FUSE (os.pread / os.pwrite / os.stat), and SGLang HiCache's usage.

    USRBIO_MOUNT=/mnt USRBIO_WORKDIR=/mnt/dir python3 test_hf3fs_fuse_io.py

Prints "ok NAME" / "FAIL NAME: ..." per test and "usrbio-py: N passed, M failed".
"""

import datetime
import errno
import multiprocessing.shared_memory
import os
import random
import sys
import time
import traceback
import unittest

from hf3fs_fuse.io import (
    HF3FS_IOR_FORBID_READ_HOLES,
    IorPriority,
    deregister_fd,
    extract_mount_point,
    force_fsync,
    make_ioring,
    make_iovec,
    read_file,
    register_fd,
)

MOUNT = os.environ.get("USRBIO_MOUNT", "")
WORK = os.environ.get("USRBIO_WORKDIR", "")
MIB = 1 << 20


def pattern(seed, off, n):
    rng = random.Random(seed * 1_000_003 + off)
    return rng.randbytes(n)


def make_file(name, seed, size):
    path = os.path.join(WORK, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    off = 0
    while off < size:
        n = min(MIB, size - off)
        os.pwrite(fd, pattern(seed, off, n), off)
        off += n
    os.fsync(fd)
    return path, fd


def registrations():
    return sorted(n for n in os.listdir(os.path.join(MOUNT, "3fs-virt", "iovs")) if n != "submit-ios")


class Usrbio(unittest.TestCase):
    def setUp(self):
        self.shms = []

    def tearDown(self):
        for s in self.shms:
            try:
                s.close()
            except BufferError:
                pass
            try:
                s.unlink()
            except FileNotFoundError:
                pass

    def shm(self, size):
        s = multiprocessing.shared_memory.SharedMemory(size=size, create=True)
        self.shms.append(s)
        return s

    def test_extract_mount_point(self):
        path, fd = make_file("mp", 1, 10)
        os.close(fd)
        self.assertEqual(extract_mount_point(path), MOUNT)
        self.assertIsNone(extract_mount_point("/proc"))

    def test_register_fd_errors(self):
        path, fd = make_file("reg", 2, 10)
        register_fd(fd)
        with self.assertRaises(OSError) as e:
            register_fd(fd)
        self.assertEqual(e.exception.errno, errno.EINVAL)
        with open("/dev/null", "rb") as f:
            with self.assertRaises(OSError) as e:
                register_fd(f.fileno())
            self.assertEqual(e.exception.errno, errno.EBADF)
        deregister_fd(fd)
        register_fd(fd)  # again after deregistering
        deregister_fd(fd)
        os.close(fd)

    def test_iovec_slices_and_registration(self):
        before = registrations()
        shm = self.shm(4 * MIB)
        iov = make_iovec(shm, MOUNT)
        self.assertEqual(len(registrations()), len(before) + 1)
        part = iov[100:200]
        self.assertEqual(len(part), 100)
        self.assertEqual(part.base_off, 100)
        part[0:3] = b"abc"
        self.assertEqual(bytes(shm.buf[100:103]), b"abc")
        self.assertEqual(len(iov[4 * MIB : 4 * MIB + 10]), 0)
        with self.assertRaises(ValueError):
            iov[0:10:2]
        del part, iov
        self.assertEqual(registrations(), before)

    def read_matrix(self, io_depth, timeout=None, rounds=3):
        sizes = [0, 1, 4095, 3 * MIB + 17, 9 * MIB + 4099]
        files = [make_file(f"pyrm-{i}-{io_depth}", 10 + i, s) for i, s in enumerate(sizes)]
        for _, fd in files:
            register_fd(fd)
        per = 32
        shm = self.shm(per * 2 * MIB)
        iov = make_iovec(shm, MOUNT)
        ior = make_ioring(MOUNT, per, for_read=True, io_depth=io_depth, timeout=timeout)
        rng = random.Random(io_depth + 100)
        try:
            for _ in range(rounds):
                want = []
                for i in range(per):
                    f = rng.randrange(len(files))
                    off = rng.randrange(sizes[f] + 5000) if sizes[f] else rng.randrange(100)
                    n = 1 + rng.randrange(4096 if rng.random() < 0.5 else 2 * MIB - 1)
                    start = i * 2 * MIB + rng.randrange(64)
                    n = min(n, per * 2 * MIB - start)
                    ior.prepare(iov[start : start + n], True, files[f][1], off, userdata=(f, off, n, start))
                done = ior.submit().wait(min_results=per, timeout=datetime.timedelta(seconds=30))
                self.assertEqual(len(done), per)
                for d in done:
                    f, off, n, start = d.userdata
                    via_fuse = os.pread(files[f][1], n, off)
                    self.assertEqual(d.result, len(via_fuse), f"read of {n} at {off} of a {sizes[f]}-byte file")
                    self.assertEqual(bytes(shm.buf[start : start + d.result]), via_fuse, f"data of a read of {n} at {off}")
        finally:
            ior.destroy()
            del iov
            for _, fd in files:
                deregister_fd(fd)
                os.close(fd)

    def test_random_reads_io_depth_0(self):
        self.read_matrix(0)

    def test_random_reads_io_depth_32(self):
        self.read_matrix(32)

    def test_random_reads_io_depth_minus_8(self):
        self.read_matrix(-8, timeout=5)

    def test_random_writes_visible_after_fsync(self):
        size = 5 * MIB + 333
        path, fd = make_file("pywrites", 3, size)
        register_fd(fd)
        model = bytearray(os.pread(fd, size, 0))
        shm = self.shm(8 * MIB)
        iov = make_iovec(shm, MOUNT)
        ior = make_ioring(MOUNT, 8, for_read=False)
        rng = random.Random(7)
        for i in range(30):
            off = rng.randrange(size + 2 * MIB)
            data = pattern(200 + i, off, 1 + rng.randrange(MIB))
            start = rng.randrange(4) * MIB + rng.randrange(100)
            shm.buf[start : start + len(data)] = data
            ior.prepare(iov[start : start + len(data)], False, fd, off)
            (d,) = ior.submit().wait(min_results=1, timeout=30)
            self.assertEqual(d.result, len(data))
            if len(model) < off + len(data):
                model.extend(bytes(off + len(data) - len(model)))
            model[off : off + len(data)] = data
        force_fsync(fd)
        self.assertEqual(os.stat(path).st_size, len(model))
        with open(path, "rb") as f:
            self.assertEqual(f.read(), bytes(model))
        ior.destroy()
        del iov
        deregister_fd(fd)
        os.close(fd)

    def test_holes_and_forbid_read_holes(self):
        path = os.path.join(WORK, "pyholes")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(fd, b"\x07" * 1000, 0)
        os.pwrite(fd, b"\x09" * 1000, 3 * MIB)
        os.fsync(fd)
        register_fd(fd)
        shm = self.shm(4 * MIB)
        iov = make_iovec(shm, MOUNT)
        plain = make_ioring(MOUNT, 4, for_read=True)
        strict = make_ioring(MOUNT, 4, for_read=True, flags=HF3FS_IOR_FORBID_READ_HOLES)
        (d,) = plain.prepare(iov[:], True, fd, 0).submit().wait(min_results=1)
        self.assertEqual(d.result, 3 * MIB + 1000)
        self.assertEqual(bytes(shm.buf[: d.result]), os.pread(fd, 4 * MIB, 0))
        (d,) = strict.prepare(iov[:], True, fd, 0).submit().wait(min_results=1)
        self.assertEqual(d.result, -errno.ENODATA)
        (d,) = strict.prepare(iov[0:1000], True, fd, 0).submit().wait(min_results=1)
        self.assertEqual(d.result, 1000)
        (d,) = plain.prepare(iov[0:100], True, fd, 10 * MIB).submit().wait(min_results=1)
        self.assertEqual(d.result, 0, "past EOF")
        plain.destroy()
        strict.destroy()
        del iov
        deregister_fd(fd)
        os.close(fd)

    def test_bad_fd_and_ring_overflow(self):
        path, fd = make_file("pybad", 4, MIB)
        shm = self.shm(MIB)
        iov = make_iovec(shm, MOUNT)
        ior = make_ioring(MOUNT, 4, for_read=True)
        with self.assertRaises(OSError) as e:
            ior.prepare(iov[0:10], True, fd, 0)
        self.assertEqual(e.exception.errno, errno.EBADF, "an unregistered fd")
        register_fd(fd)
        with self.assertRaises(OSError) as e:
            ior.prepare(iov[0:10], False, fd, 0)
        self.assertEqual(e.exception.errno, errno.EINVAL, "a write on a read ring")
        with self.assertRaises(OSError) as e:
            ior.prepare(iov[MIB : MIB + 10], True, fd, 0)
        self.assertEqual(e.exception.errno, errno.EINVAL, "an empty slice past the iov")
        n = ior.entries
        for i in range(n):
            ior.prepare(iov[i * 10 : i * 10 + 10], True, fd, i * 10)
        with self.assertRaises(OSError) as e:
            ior.prepare(iov[0:10], True, fd, 0)
        self.assertEqual(e.exception.errno, errno.EAGAIN, "ring overflow")
        done = ior.submit().wait(min_results=n)
        self.assertEqual(sorted(d.result for d in done), [10] * n)
        ior.destroy()
        del iov
        deregister_fd(fd)
        os.close(fd)

    def test_io_depth_exact_batches_and_priority(self):
        path, fd = make_file("pydepth", 5, MIB)
        register_fd(fd)
        shm = self.shm(MIB)
        iov = make_iovec(shm, MOUNT)
        ior = make_ioring(MOUNT, 8, for_read=True, io_depth=4)
        for i in range(3):
            ior.prepare(iov[i * 10 : i * 10 + 10], True, fd, 0)
        self.assertEqual(ior.submit().wait(min_results=1, timeout=0.4), [], "three of a batch of four wait")
        ior.prepare(iov[30:40], True, fd, 0)
        self.assertEqual(len(ior.submit().wait(min_results=4, timeout=30)), 4)
        ior.destroy()
        hi = make_ioring(MOUNT, 4, for_read=True, priority=IorPriority.HIGH)
        (d,) = hi.prepare(iov[0:10], True, fd, 0).submit().wait(min_results=1)
        self.assertEqual(d.result, 10)
        hi.destroy()
        del iov
        deregister_fd(fd)
        os.close(fd)

    def test_read_file_helper(self):
        path, fd = make_file("pyreadfile", 6, 3 * MIB + 5)
        os.close(fd)
        with open(path, "rb") as f:
            self.assertEqual(read_file(path, block_size=MIB), f.read())

    def test_sglang_hicache_usage(self):
        """Hf3fsUsrBioClient's sequence: O_RDWR|O_CREAT + ftruncate, register,
        two rings with timeout=1, two iovecs whose shm is unlinked at once,
        batch writes then batch reads of pages, fsync, close."""
        path = os.path.join(WORK, "hicache.bin")
        page, entries = 64 * 1024, 8
        size = page * entries * 4
        fd = os.open(path, os.O_RDWR | os.O_CREAT)
        os.ftruncate(fd, size)
        register_fd(fd)
        mp = extract_mount_point(path)
        shm_r = multiprocessing.shared_memory.SharedMemory(size=page * entries, create=True)
        shm_w = multiprocessing.shared_memory.SharedMemory(size=page * entries, create=True)
        ior_r = make_ioring(mp, entries, for_read=True, timeout=1, numa=-1)
        ior_w = make_ioring(mp, entries, for_read=False, timeout=1, numa=-1)
        iov_r = make_iovec(shm_r, mp)
        iov_w = make_iovec(shm_w, mp)
        shm_r.unlink()
        shm_w.unlink()
        offsets = [page * i * 3 for i in range(entries)]
        pages = [pattern(300 + i, 0, page) for i in range(entries)]
        for i, p in enumerate(pages):
            shm_w.buf[i * page : (i + 1) * page] = p
        for i, off in enumerate(offsets):
            ior_w.prepare(iov_w[i * page : (i + 1) * page], False, fd, off)
        resv = ior_w.submit().wait(min_results=entries, timeout=datetime.timedelta(seconds=30))
        self.assertEqual([r.result for r in resv], [page] * entries)
        for i, off in enumerate(offsets):
            ior_r.prepare(iov_r[i * page : (i + 1) * page], True, fd, off)
        resv = ior_r.submit().wait(min_results=entries, timeout=datetime.timedelta(seconds=30))
        self.assertEqual([r.result for r in resv], [page] * entries)
        for i in range(entries):
            self.assertEqual(bytes(shm_r.buf[i * page : (i + 1) * page]), pages[i])
        # A page never written reads as zeros (the file was ftruncate'd).
        ior_r.prepare(iov_r[0:page], True, fd, page)
        (d,) = ior_r.submit().wait(min_results=1, timeout=datetime.timedelta(seconds=30))
        self.assertEqual(d.result, page)
        self.assertEqual(bytes(shm_r.buf[0:page]), bytes(page))
        os.fsync(fd)
        with open(path, "rb") as f:
            f.seek(offsets[3])
            self.assertEqual(f.read(page), pages[3])
        deregister_fd(fd)
        os.close(fd)
        del ior_r, ior_w, iov_r, iov_w
        shm_r.close()
        shm_w.close()

    def test_zz_nothing_left(self):
        self.assertEqual(registrations(), [])
        prefix = f"fskv-usrbio.{os.getpid()}."
        self.assertEqual([n for n in os.listdir("/dev/shm") if n.startswith(prefix)], [])


class Result(unittest.TextTestResult):
    pass


def main():
    if not MOUNT or not WORK:
        print("set USRBIO_MOUNT and USRBIO_WORKDIR")
        return 2
    os.makedirs(WORK, exist_ok=True)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Usrbio)
    passed = failed = 0
    for test in suite:
        name = test.id().rsplit(".", 1)[-1]
        result = unittest.TestResult()
        t0 = time.time()
        test.run(result)
        problems = result.failures + result.errors
        if problems:
            failed += 1
            why = problems[0][1].strip().splitlines()[-1]
            print(f"FAIL {name}: {why}")
            print(problems[0][1], file=sys.stderr)
        else:
            passed += 1
            print(f"ok {name} ({time.time() - t0:.2f} s)")
        sys.stdout.flush()
    print(f"usrbio-py: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        print("usrbio-py: 0 passed, 1 failed")
        sys.exit(1)
