/*
 * USRBIO conformance: the C interface of hf3fs_usrbio.h against a 3FS-KV
 * mount, every result checked against the same operation through the FUSE
 * mount (pread / pwrite / stat).
 *
 *   usrbio_conformance MOUNT WORKDIR            run every check; prints
 *                                               "ok NAME" / "FAIL NAME: why" and
 *                                               "usrbio-c: N passed, M failed"
 *   usrbio_conformance --hold MOUNT FILE N      prepare N 1 MiB reads of FILE,
 *                                               submit, print "READY", sleep
 *                                               (to be killed with SIGKILL)
 *
 * Build: cc -O2 -Wall -o usrbio_conformance usrbio_conformance.c \
 *          $(pkg-config --cflags --libs hf3fs_usrbio)
 */
#define _GNU_SOURCE
#include <hf3fs_usrbio.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* The layout 3FS's header gives these structs on 64-bit Linux. */
_Static_assert(sizeof(struct hf3fs_iov) == 312, "hf3fs_iov size");
_Static_assert(offsetof(struct hf3fs_iov, id) == 16, "hf3fs_iov.id");
_Static_assert(offsetof(struct hf3fs_iov, mount_point) == 32, "hf3fs_iov.mount_point");
_Static_assert(offsetof(struct hf3fs_iov, size) == 288, "hf3fs_iov.size");
_Static_assert(offsetof(struct hf3fs_iov, block_size) == 296, "hf3fs_iov.block_size");
_Static_assert(offsetof(struct hf3fs_iov, numa) == 304, "hf3fs_iov.numa");
_Static_assert(sizeof(struct hf3fs_ior) == 600, "hf3fs_ior size");
_Static_assert(offsetof(struct hf3fs_ior, iorh) == 312, "hf3fs_ior.iorh");
_Static_assert(offsetof(struct hf3fs_ior, mount_point) == 320, "hf3fs_ior.mount_point");
_Static_assert(offsetof(struct hf3fs_ior, for_read) == 576, "hf3fs_ior.for_read");
_Static_assert(offsetof(struct hf3fs_ior, io_depth) == 580, "hf3fs_ior.io_depth");
_Static_assert(offsetof(struct hf3fs_ior, priority) == 584, "hf3fs_ior.priority");
_Static_assert(offsetof(struct hf3fs_ior, timeout) == 588, "hf3fs_ior.timeout");
_Static_assert(offsetof(struct hf3fs_ior, flags) == 592, "hf3fs_ior.flags");
_Static_assert(sizeof(struct hf3fs_cqe) == 24, "hf3fs_cqe size");
_Static_assert(offsetof(struct hf3fs_cqe, result) == 8, "hf3fs_cqe.result");
_Static_assert(offsetof(struct hf3fs_cqe, userdata) == 16, "hf3fs_cqe.userdata");
_Static_assert(HF3FS_IOR_ALLOW_READ_UNCOMMITTED == 1 && HF3FS_IOR_FORBID_READ_HOLES == 2, "flags");
_Static_assert(HF3FS_SUPER_MAGIC == 0x8f3f5fff, "magic");

#define MIB (1024 * 1024)

static const char *g_mount;
static const char *g_dir;
static int g_passed, g_failed;
static char g_why[10000];
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

#define FAILF(...)                                  \
  do {                                              \
    snprintf(g_why, sizeof(g_why), __VA_ARGS__);    \
    return 0;                                       \
  } while (0)
#define CHECK(cond, ...)   \
  do {                     \
    if (!(cond)) FAILF(__VA_ARGS__); \
  } while (0)

static void run(const char *name, int (*fn)(void)) {
  g_why[0] = 0;
  if (fn()) {
    g_passed++;
    printf("ok %s\n", name);
  } else {
    g_failed++;
    printf("FAIL %s: %s\n", name, g_why);
  }
  fflush(stdout);
}

static void path_of(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", g_dir, name); }

static void fill(uint64_t seed, uint64_t off, uint8_t *buf, size_t len) {
  for (size_t i = 0; i < len; i++) {
    uint64_t x = (off + i) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;
    buf[i] = (uint8_t)(x >> 29);
  }
}

/* Writes `len` bytes of pattern `seed` through FUSE; returns an O_RDWR fd. */
static int make_file(const char *name, uint64_t seed, size_t len) {
  char p[4096];
  path_of(p, sizeof(p), name);
  int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  uint8_t *buf = malloc(MIB);
  for (size_t off = 0; off < len; off += MIB) {
    size_t n = len - off < MIB ? len - off : MIB;
    fill(seed, off, buf, n);
    if (pwrite(fd, buf, n, off) != (ssize_t)n) {
      free(buf);
      close(fd);
      return -1;
    }
  }
  free(buf);
  fsync(fd);
  return fd;
}

static struct timespec deadline_in_ms(long ms) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Collects exactly n completions (10 s bound); returns how many came. */
static int wait_n(struct hf3fs_ior *ior, struct hf3fs_cqe *cqes, int n) {
  int got = 0;
  struct timespec dl = deadline_in_ms(10000);
  while (got < n) {
    int r = hf3fs_wait_for_ios(ior, cqes + got, n - got, n - got, &dl);
    if (r <= 0) break;
    got += r;
  }
  return got;
}

/* Number of links in 3fs-virt/iovs besides submit-ios. */
static int registrations(void) {
  char p[4096];
  snprintf(p, sizeof(p), "%s/3fs-virt/iovs", g_mount);
  DIR *d = opendir(p);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "submit-ios")) n++;
  }
  closedir(d);
  return n;
}

/* ---- checks ---- */

static int t_identify(void) {
  char p[4096];
  path_of(p, sizeof(p), "ident");
  int fd = open(p, O_RDWR | O_CREAT, 0644);
  CHECK(fd >= 0, "create %s: %s", p, strerror(errno));
  CHECK(hf3fs_is_hf3fs(fd), "a file of the mount is not recognised");
  int nul = open("/dev/null", O_RDONLY);
  CHECK(!hf3fs_is_hf3fs(nul), "/dev/null recognised as a mount file");
  CHECK(!hf3fs_is_hf3fs(-1), "fd -1 recognised");
  char mp[4096];
  int r = hf3fs_extract_mount_point(mp, sizeof(mp), p);
  CHECK(r == (int)strlen(g_mount) + 1, "extract_mount_point returned %d, want %zu", r, strlen(g_mount) + 1);
  CHECK(strcmp(mp, g_mount) == 0, "mount point %s, want %s", mp, g_mount);
  char small[4] = "xyz";
  r = hf3fs_extract_mount_point(small, sizeof(small), p);
  CHECK(r == (int)strlen(g_mount) + 1 && strcmp(small, "xyz") == 0, "too small a buffer: %d, buffer changed to %s", r, small);
  CHECK(hf3fs_extract_mount_point(mp, sizeof(mp), "/proc") == -1, "/proc is on a mount");
  close(nul);
  close(fd);
  return 1;
}

static int t_iov_lifecycle(void) {
  struct hf3fs_iov iov, other;
  memset(&iov, 0, sizeof(iov));
  int before = registrations();
  int r = hf3fs_iovcreate(&iov, g_mount, 8 * MIB, 0, -1);
  CHECK(r == 0, "iovcreate: %d", r);
  CHECK(iov.base && iov.iovh && iov.size == 8 * MIB && strcmp(iov.mount_point, g_mount) == 0, "iov fields");
  CHECK(registrations() == before + 1, "the iov is not listed in 3fs-virt/iovs");
  r = hf3fs_iovopen(&other, (const uint8_t *)iov.id, g_mount, 8 * MIB, 0, -1);
  CHECK(r == 0, "iovopen: %d", r);
  iov.base[12345] = 0x5a;
  CHECK(other.base[12345] == 0x5a, "iovopen does not share the memory");
  hf3fs_iovdestroy(&other); /* an opened iov: unmapped, the original stays registered */
  CHECK(registrations() == before + 1, "destroying an opened iov deregistered the original");
  hf3fs_iovunlink(&iov);
  r = hf3fs_iovopen(&other, (const uint8_t *)iov.id, g_mount, 8 * MIB, 0, -1);
  CHECK(r < 0, "iovopen after iovunlink: %d", r);
  hf3fs_iovdestroy(&iov);
  CHECK(iov.iovh == NULL, "iovh not cleared");
  CHECK(registrations() == before, "the iov is still listed after iovdestroy");
  CHECK(hf3fs_iovcreate(&iov, g_mount, 0, 0, -1) < 0, "an iov of 0 bytes");
  char longmp[300];
  memset(longmp, 'a', sizeof(longmp) - 1);
  longmp[sizeof(longmp) - 1] = 0;
  CHECK(hf3fs_iovcreate(&iov, longmp, MIB, 0, -1) == -EINVAL, "a mount point of 299 bytes");
  struct hf3fs_iov w;
  uint8_t id[16] = {1};
  CHECK(hf3fs_iovwrap(&w, iov.base, id, g_mount, MIB, 0, -1) == 0 && w.iovh == NULL, "iovwrap");
  hf3fs_iovdestroy(&w); /* a wrapped iov is not freed: no crash */
  return 1;
}

static int t_reg_fd(void) {
  int fd = make_file("regfd", 3, 4096);
  CHECK(fd >= 0, "create: %s", strerror(errno));
  int r = hf3fs_reg_fd(fd, 0);
  CHECK(r <= 0, "reg_fd returned %d (success is <= 0)", r);
  CHECK(r < 0 && -r != fd && fcntl(-r, F_GETFD) >= 0, "reg_fd did not return minus a duplicate descriptor: %d", r);
  CHECK(hf3fs_reg_fd(fd, 0) == EINVAL, "a second registration is not a positive EINVAL");
  int nul = open("/dev/null", O_RDWR);
  CHECK(hf3fs_reg_fd(nul, 0) == EBADF, "/dev/null: want positive EBADF");
  CHECK(hf3fs_reg_fd(-1, 0) == EBADF, "fd -1: want positive EBADF");
  char d[4096];
  path_of(d, sizeof(d), ".");
  int dfd = open(d, O_RDONLY | O_DIRECTORY);
  CHECK(hf3fs_reg_fd(dfd, 0) > 0, "a directory was registered");
  hf3fs_dereg_fd(fd);
  r = hf3fs_reg_fd(fd, 0);
  CHECK(r <= 0, "registering again after dereg: %d", r);
  hf3fs_dereg_fd(fd);
  hf3fs_dereg_fd(fd); /* twice: harmless */
  close(dfd);
  close(nul);
  close(fd);
  return 1;
}

/* Random reads of several files through USRBIO vs pread through FUSE. */
static int read_matrix(int io_depth, int timeout, int flags, int rounds) {
  enum { NFILES = 5, PER = 32 };
  size_t sizes[NFILES] = {0, 1, 4095, 3 * MIB + 17, 12 * MIB + 4099};
  int fds[NFILES];
  for (int i = 0; i < NFILES; i++) {
    char name[64];
    snprintf(name, sizeof(name), "rm-%d-%d", i, io_depth);
    fds[i] = make_file(name, 100 + i, sizes[i]);
    CHECK(fds[i] >= 0, "create %s", name);
    CHECK(hf3fs_reg_fd(fds[i], 0) <= 0, "reg %s", name);
  }
  struct hf3fs_iov iov;
  CHECK(hf3fs_iovcreate(&iov, g_mount, PER * 2 * MIB, 0, -1) == 0, "iovcreate");
  struct hf3fs_ior ior;
  int r = hf3fs_iorcreate4(&ior, g_mount, PER, true, io_depth, timeout, -1, flags);
  CHECK(r == 0, "iorcreate4(depth %d): %d", io_depth, r);
  CHECK(hf3fs_io_entries(&ior) >= PER, "io_entries %d < %d", hf3fs_io_entries(&ior), PER);
  uint8_t *want = malloc(2 * MIB);
  struct hf3fs_cqe cqes[PER];
  int ok = 1;
  for (int round = 0; round < rounds && ok; round++) {
    struct {
      int file;
      uint64_t off;
      size_t len;
      uint8_t *buf;
    } req[PER];
    for (int i = 0; i < PER; i++) {
      int f = rnd() % NFILES;
      uint64_t off = sizes[f] ? rnd() % (sizes[f] + 5000) : rnd() % 100;
      size_t len = 1 + rnd() % (rnd() % 2 ? 4096 : 2 * MIB - 1);
      uint8_t *buf = iov.base + (size_t)i * 2 * MIB + (rnd() % 2 ? 0 : rnd() % 64); /* unaligned buffers too */
      if (buf + len > iov.base + iov.size) len = iov.base + iov.size - buf;
      req[i].file = f;
      req[i].off = off;
      req[i].len = len;
      req[i].buf = buf;
      int idx = hf3fs_prep_io(&ior, &iov, true, buf, fds[f], off, len, &req[i]);
      if (idx < 0) {
        snprintf(g_why, sizeof(g_why), "prep_io %d: %d", i, idx);
        ok = 0;
        break;
      }
    }
    if (!ok) break;
    CHECK(hf3fs_submit_ios(&ior) == 0, "submit");
    int got = wait_n(&ior, cqes, PER);
    CHECK(got == PER, "round %d: %d of %d completions", round, got, PER);
    for (int i = 0; i < PER && ok; i++) {
      typeof(&req[0]) q = (void *)cqes[i].userdata;
      ssize_t n = pread(fds[q->file], want, q->len, q->off);
      if (cqes[i].result != n) {
        snprintf(g_why, sizeof(g_why), "read of %zu at %lu of a %zu-byte file: usrbio %ld, pread %zd", q->len,
                 (unsigned long)q->off, sizes[q->file], (long)cqes[i].result, n);
        ok = 0;
      } else if (n > 0 && memcmp(want, q->buf, n) != 0) {
        snprintf(g_why, sizeof(g_why), "data of a read of %zu at %lu differs", q->len, (unsigned long)q->off);
        ok = 0;
      }
    }
  }
  free(want);
  hf3fs_iordestroy(&ior);
  hf3fs_iovdestroy(&iov);
  for (int i = 0; i < NFILES; i++) {
    hf3fs_dereg_fd(fds[i]);
    close(fds[i]);
  }
  return ok;
}

static int t_reads_depth0(void) { return read_matrix(0, 0, 0, 6); }
static int t_reads_depth_exact(void) { return read_matrix(32, 0, 0, 4); }
static int t_reads_depth_negative(void) { return read_matrix(-8, 5, 0, 4); }
static int t_reads_uncommitted_flag(void) { return read_matrix(0, 0, HF3FS_IOR_ALLOW_READ_UNCOMMITTED, 2); }

/* Random writes through USRBIO; after fsync FUSE reads the model. */
static int t_writes(void) {
  size_t len = 6 * MIB + 333;
  int fd = make_file("writes", 7, len);
  CHECK(fd >= 0, "create");
  CHECK(hf3fs_reg_fd(fd, 0) <= 0, "reg");
  size_t cap = len + 4 * MIB;
  uint8_t *model = calloc(1, cap);
  fill(7, 0, model, len);
  size_t model_len = len;
  struct hf3fs_iov iov;
  CHECK(hf3fs_iovcreate(&iov, g_mount, 16 * MIB, 0, -1) == 0, "iovcreate");
  struct hf3fs_ior ior;
  CHECK(hf3fs_iorcreate(&ior, g_mount, 16, false, 0, -1) == 0, "iorcreate (write)");
  struct hf3fs_cqe cqe;
  for (int i = 0; i < 60; i++) {
    uint64_t off = rnd() % (len + 3 * MIB);
    size_t n = 1 + rnd() % (rnd() % 2 ? 5000 : MIB);
    uint8_t *buf = iov.base + (rnd() % 8) * MIB + rnd() % 100;
    fill(1000 + i, off, buf, n);
    memcpy(model + off, buf, n);
    if (off + n > model_len) model_len = off + n;
    int idx = hf3fs_prep_io(&ior, &iov, false, buf, fd, off, n, NULL);
    CHECK(idx >= 0, "prep write: %d", idx);
    CHECK(hf3fs_submit_ios(&ior) == 0, "submit");
    CHECK(wait_n(&ior, &cqe, 1) == 1, "write %d: no completion", i);
    CHECK(cqe.result == (int64_t)n, "write of %zu at %lu: result %ld", n, (unsigned long)off, (long)cqe.result);
  }
  CHECK(fsync(fd) == 0, "fsync: %s", strerror(errno));
  char p[4096];
  path_of(p, sizeof(p), "writes");
  struct stat st;
  CHECK(stat(p, &st) == 0 && (size_t)st.st_size == model_len, "size after fsync %ld, want %zu", (long)st.st_size, model_len);
  int fresh = open(p, O_RDONLY);
  uint8_t *back = malloc(model_len);
  ssize_t got = 0;
  while ((size_t)got < model_len) {
    ssize_t r = pread(fresh, back + got, model_len - got, got);
    if (r <= 0) break;
    got += r;
  }
  CHECK((size_t)got == model_len && memcmp(back, model, model_len) == 0, "content after fsync differs (%zd of %zu bytes read)", got,
        model_len);
  /* The writing descriptor reads it too (the kernel's cached pages were dropped). */
  CHECK(pread(fd, back, model_len, 0) == (ssize_t)model_len && memcmp(back, model, model_len) == 0, "content through the writer's fd");
  close(fresh);
  free(back);
  free(model);
  hf3fs_iordestroy(&ior);
  hf3fs_iovdestroy(&iov);
  hf3fs_dereg_fd(fd);
  close(fd);
  return 1;
}

static int t_holes(void) {
  char p[4096];
  path_of(p, sizeof(p), "holes");
  int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0, "create");
  uint8_t a[1000], b[1000];
  memset(a, 7, sizeof(a));
  memset(b, 9, sizeof(b));
  CHECK(pwrite(fd, a, sizeof(a), 0) == sizeof(a) && pwrite(fd, b, sizeof(b), 3 * MIB) == sizeof(b), "pwrite");
  fsync(fd);
  CHECK(hf3fs_reg_fd(fd, 0) <= 0, "reg");
  struct hf3fs_iov iov;
  CHECK(hf3fs_iovcreate(&iov, g_mount, 4 * MIB, 0, -1) == 0, "iovcreate");
  struct hf3fs_ior plain, strict;
  CHECK(hf3fs_iorcreate4(&plain, g_mount, 8, true, 0, 0, -1, 0) == 0, "plain ring");
  CHECK(hf3fs_iorcreate4(&strict, g_mount, 8, true, 0, 0, -1, HF3FS_IOR_FORBID_READ_HOLES) == 0, "strict ring");
  struct hf3fs_cqe c[3];
  uint8_t *want = malloc(4 * MIB);
  /* Across the hole. */
  CHECK(hf3fs_prep_io(&plain, &iov, true, iov.base, fd, 0, 4 * MIB, NULL) >= 0, "prep");
  hf3fs_submit_ios(&plain);
  CHECK(wait_n(&plain, c, 1) == 1, "plain: no completion");
  ssize_t n = pread(fd, want, 4 * MIB, 0);
  CHECK(c[0].result == n && n == 3 * MIB + 1000, "plain read across the hole: %ld, pread %zd", (long)c[0].result, n);
  CHECK(memcmp(want, iov.base, n) == 0, "plain: data differs from pread (the hole must read as zeros)");
  CHECK(hf3fs_prep_io(&strict, &iov, true, iov.base, fd, 0, 4 * MIB, NULL) >= 0, "prep");
  CHECK(hf3fs_prep_io(&strict, &iov, true, iov.base, fd, 0, 1000, NULL) >= 0, "prep");
  CHECK(hf3fs_prep_io(&strict, &iov, true, iov.base + 2 * MIB, fd, 3 * MIB, 1000, NULL) >= 0, "prep");
  hf3fs_submit_ios(&strict);
  CHECK(wait_n(&strict, c, 3) == 3, "strict: completions");
  int enodata = 0, full = 0;
  for (int i = 0; i < 3; i++) {
    if (c[i].result == -ENODATA) enodata++;
    if (c[i].result == 1000) full++;
  }
  CHECK(enodata == 1 && full == 2, "strict: want one -ENODATA and two full reads, got %ld %ld %ld", (long)c[0].result,
        (long)c[1].result, (long)c[2].result);
  /* Entirely past EOF: 0, like pread. */
  CHECK(hf3fs_prep_io(&plain, &iov, true, iov.base, fd, 10 * MIB, 100, NULL) >= 0, "prep");
  hf3fs_submit_ios(&plain);
  CHECK(wait_n(&plain, c, 1) == 1 && c[0].result == 0 && pread(fd, want, 100, 10 * MIB) == 0, "past EOF: %ld", (long)c[0].result);
  free(want);
  hf3fs_iordestroy(&plain);
  hf3fs_iordestroy(&strict);
  hf3fs_iovdestroy(&iov);
  hf3fs_dereg_fd(fd);
  close(fd);
  return 1;
}

static int t_bad_arguments(void) {
  int fd = make_file("bad", 5, MIB);
  CHECK(fd >= 0, "create");
  int ro = -1;
  char p[4096];
  path_of(p, sizeof(p), "bad");
  ro = open(p, O_RDONLY);
  struct hf3fs_iov iov;
  CHECK(hf3fs_iovcreate(&iov, g_mount, MIB, 0, -1) == 0, "iovcreate");
  struct hf3fs_ior rd, wr;
  CHECK(hf3fs_iorcreate(&rd, g_mount, 4, true, 0, -1) == 0, "read ring");
  CHECK(hf3fs_iorcreate(&wr, g_mount, 4, false, 0, -1) == 0, "write ring");
  /* Not registered. */
  int r = hf3fs_prep_io(&rd, &iov, true, iov.base, fd, 0, 100, NULL);
  CHECK(r == -EBADF, "unregistered fd: %d", r);
  CHECK(hf3fs_reg_fd(fd, 0) <= 0 && hf3fs_reg_fd(ro, 0) <= 0, "reg");
  /* Buffers outside the iov. */
  CHECK(hf3fs_prep_io(&rd, &iov, true, iov.base - 1, fd, 0, 10, NULL) == -EINVAL, "a pointer before the iov");
  CHECK(hf3fs_prep_io(&rd, &iov, true, iov.base + MIB, fd, 0, 1, NULL) == -EINVAL, "a pointer past the iov");
  CHECK(hf3fs_prep_io(&rd, &iov, true, iov.base + MIB - 10, fd, 0, 11, NULL) == -EINVAL, "a buffer crossing the end of the iov");
  CHECK(hf3fs_prep_io(&rd, &iov, true, (void *)0x1000, fd, 0, 10, NULL) == -EINVAL, "a pointer far outside");
  CHECK(hf3fs_prep_io(&rd, &iov, true, NULL, fd, 0, 10, NULL) == -EINVAL, "NULL");
  CHECK(hf3fs_prep_io(&rd, &iov, true, iov.base, fd, 0, 0, NULL) == -EINVAL, "len 0");
  CHECK(hf3fs_prep_io(&rd, &iov, false, iov.base, fd, 0, 10, NULL) == -EINVAL, "a write on a read ring");
  CHECK(hf3fs_prep_io(&wr, &iov, false, iov.base, ro, 0, 10, NULL) == -EACCES, "a write to an O_RDONLY file");
  CHECK(hf3fs_prep_io(&rd, &iov, true, iov.base, 9999, 0, 10, NULL) == -EBADF, "a descriptor never registered");
  struct hf3fs_cqe c[4];
  CHECK(hf3fs_wait_for_ios(&rd, c, 0, 0, NULL) == -EINVAL, "cqec 0");
  /* An iov the daemon does not know (wrapped with an unregistered id): the request completes with -EACCES. */
  struct hf3fs_iov fake;
  uint8_t id[16] = {0xde, 0xad};
  CHECK(hf3fs_iovwrap(&fake, iov.base, id, g_mount, MIB, 0, -1) == 0, "iovwrap");
  CHECK(hf3fs_prep_io(&rd, &fake, true, iov.base, fd, 0, 10, NULL) >= 0, "prep with an unknown iov");
  hf3fs_submit_ios(&rd);
  CHECK(wait_n(&rd, c, 1) == 1 && c[0].result == -EACCES, "unknown iov: %ld", (long)c[0].result);
  /* A registered descriptor closed: its duplicate keeps the registration (as in 3FS). */
  r = hf3fs_reg_fd(fd, 0);
  CHECK(r == EINVAL, "registered twice: %d", r);
  int dup_neg = 0;
  hf3fs_dereg_fd(fd);
  dup_neg = hf3fs_reg_fd(fd, 0);
  CHECK(dup_neg <= 0, "re-register");
  close(fd);
  CHECK(hf3fs_prep_io(&rd, &iov, true, iov.base, dup_neg, 0, 10, NULL) >= 0, "prep through -dupfd after close(fd)");
  hf3fs_submit_ios(&rd);
  CHECK(wait_n(&rd, c, 1) == 1 && c[0].result == 10, "read through the duplicate: %ld", (long)c[0].result);
  hf3fs_dereg_fd(-dup_neg);
  CHECK(hf3fs_prep_io(&rd, &iov, true, iov.base, dup_neg, 0, 10, NULL) == -EBADF, "after dereg");
  hf3fs_dereg_fd(ro);
  close(ro);
  hf3fs_iordestroy(&rd);
  hf3fs_iordestroy(&wr);
  hf3fs_iovdestroy(&iov);
  /* Bad ring parameters. */
  struct hf3fs_ior bad;
  CHECK(hf3fs_iorcreate(&bad, g_mount, 4, true, 5, -1) == -EINVAL, "io_depth > entries");
  CHECK(hf3fs_iorcreate3(&bad, g_mount, 4, true, 0, 0, -1, -1) == -EINVAL, "negative timeout");
  CHECK(hf3fs_iorcreate(&bad, g_mount, 0, true, 0, -1) == -EINVAL, "0 entries");
  CHECK(hf3fs_iorcreate4(&bad, g_mount, 4, true, 0, 0, -1, 8) == -EINVAL, "unknown flags");
  CHECK(hf3fs_ior_size(0) == 0 && hf3fs_ior_size(16) > 0, "ior_size");
  return 1;
}

static int t_ring_overflow(void) {
  int fd = make_file("ovf", 9, MIB);
  CHECK(fd >= 0 && hf3fs_reg_fd(fd, 0) <= 0, "create/reg");
  struct hf3fs_iov iov;
  CHECK(hf3fs_iovcreate(&iov, g_mount, MIB, 0, -1) == 0, "iovcreate");
  struct hf3fs_ior ior;
  CHECK(hf3fs_iorcreate(&ior, g_mount, 4, true, 0, -1) == 0, "ring of 4");
  int n = hf3fs_io_entries(&ior), idx[64];
  CHECK(n >= 4 && n < 64, "io_entries %d", n);
  for (int i = 0; i < n; i++) {
    idx[i] = hf3fs_prep_io(&ior, &iov, true, iov.base + i * 100, fd, i * 100, 100, NULL);
    CHECK(idx[i] >= 0 && idx[i] < n, "prep %d: %d", i, idx[i]);
  }
  int r = hf3fs_prep_io(&ior, &iov, true, iov.base, fd, 0, 100, NULL);
  CHECK(r == -EAGAIN, "one more than the ring holds: %d", r);
  hf3fs_submit_ios(&ior);
  struct hf3fs_cqe c[64];
  CHECK(wait_n(&ior, c, n) == n, "completions");
  for (int i = 0; i < n; i++) CHECK(c[i].result == 100, "result %ld", (long)c[i].result);
  /* Slots are free again. */
  for (int i = 0; i < n; i++) CHECK(hf3fs_prep_io(&ior, &iov, true, iov.base, fd, 0, 100, NULL) >= 0, "prep after the completions");
  hf3fs_submit_ios(&ior);
  CHECK(wait_n(&ior, c, n) == n, "second round");
  hf3fs_iordestroy(&ior);
  hf3fs_iovdestroy(&iov);
  hf3fs_dereg_fd(fd);
  close(fd);
  return 1;
}

static int t_io_depth_semantics(void) {
  int fd = make_file("depth", 11, MIB);
  CHECK(fd >= 0 && hf3fs_reg_fd(fd, 0) <= 0, "create/reg");
  struct hf3fs_iov iov;
  CHECK(hf3fs_iovcreate(&iov, g_mount, MIB, 0, -1) == 0, "iovcreate");
  struct hf3fs_cqe c[8];
  /* io_depth 4: three requests wait for a fourth. */
  struct hf3fs_ior exact;
  CHECK(hf3fs_iorcreate(&exact, g_mount, 8, true, 4, -1) == 0, "ring");
  for (int i = 0; i < 3; i++) CHECK(hf3fs_prep_io(&exact, &iov, true, iov.base, fd, 0, 10, NULL) >= 0, "prep");
  hf3fs_submit_ios(&exact);
  struct timespec dl = deadline_in_ms(400);
  int r = hf3fs_wait_for_ios(&exact, c, 8, 1, &dl);
  CHECK(r == 0, "io_depth 4 with 3 prepared: %d completions after 400 ms (want 0)", r);
  CHECK(hf3fs_prep_io(&exact, &iov, true, iov.base, fd, 0, 10, NULL) >= 0, "prep the fourth");
  hf3fs_submit_ios(&exact);
  CHECK(wait_n(&exact, c, 4) == 4, "io_depth 4: the batch of four");
  hf3fs_iordestroy(&exact);
  /* io_depth -4 with a 300 ms timeout: two requests wait for the timeout. */
  struct hf3fs_ior neg;
  CHECK(hf3fs_iorcreate3(&neg, g_mount, 8, true, -4, 0, 300, -1) == 0, "ring");
  double t0 = now_ms();
  for (int i = 0; i < 2; i++) CHECK(hf3fs_prep_io(&neg, &iov, true, iov.base, fd, 0, 10, NULL) >= 0, "prep");
  hf3fs_submit_ios(&neg);
  CHECK(wait_n(&neg, c, 2) == 2, "io_depth -4: completions");
  double waited = now_ms() - t0;
  CHECK(waited >= 250, "io_depth -4, timeout 300: completed after %.0f ms", waited);
  /* Four at once go without waiting for the timeout. */
  t0 = now_ms();
  for (int i = 0; i < 4; i++) CHECK(hf3fs_prep_io(&neg, &iov, true, iov.base, fd, 0, 10, NULL) >= 0, "prep");
  hf3fs_submit_ios(&neg);
  CHECK(wait_n(&neg, c, 4) == 4, "full batch");
  waited = now_ms() - t0;
  CHECK(waited < 250, "a full batch of -io_depth waited %.0f ms", waited);
  hf3fs_iordestroy(&neg);
  /* io_depth 0 with priorities: everything completes. */
  struct hf3fs_ior hi, lo;
  CHECK(hf3fs_iorcreate2(&hi, g_mount, 8, true, 0, -1, -1) == 0 && hf3fs_iorcreate2(&lo, g_mount, 8, true, 0, 1, -1) == 0, "rings");
  for (int i = 0; i < 8; i++) {
    CHECK(hf3fs_prep_io(&hi, &iov, true, iov.base, fd, 0, 10, NULL) >= 0, "prep");
    CHECK(hf3fs_prep_io(&lo, &iov, true, iov.base + 100, fd, 0, 10, NULL) >= 0, "prep");
  }
  hf3fs_submit_ios(&hi);
  hf3fs_submit_ios(&lo);
  CHECK(wait_n(&hi, c, 8) == 8 && wait_n(&lo, c, 8) == 8, "priorities: completions");
  hf3fs_iordestroy(&hi);
  hf3fs_iordestroy(&lo);
  hf3fs_iovdestroy(&iov);
  hf3fs_dereg_fd(fd);
  close(fd);
  return 1;
}

static int t_nothing_left(void) {
  int n = registrations();
  CHECK(n == 0, "%d registrations left in 3fs-virt/iovs", n);
  char p[4096];
  snprintf(p, sizeof(p), "%s", g_mount);
  DIR *d = opendir(p);
  struct dirent *e;
  while (d && (e = readdir(d))) CHECK(strcmp(e->d_name, "3fs-virt") != 0, "3fs-virt is listed in the root");
  if (d) closedir(d);
  char prefix[64];
  snprintf(prefix, sizeof(prefix), "fskv-usrbio.%d.", getpid());
  d = opendir("/dev/shm");
  while (d && (e = readdir(d))) CHECK(strncmp(e->d_name, prefix, strlen(prefix)) != 0, "left in /dev/shm: %s", e->d_name);
  if (d) closedir(d);
  return 1;
}

static int hold(const char *mount, const char *file, int n) {
  int fd = open(file, O_RDONLY);
  if (fd < 0 || hf3fs_reg_fd(fd, 0) > 0) {
    fprintf(stderr, "hold: cannot open/register %s\n", file);
    return 2;
  }
  struct hf3fs_iov iov;
  struct hf3fs_ior ior;
  if (hf3fs_iovcreate(&iov, mount, (size_t)n * MIB, 0, -1) || hf3fs_iorcreate(&ior, mount, n, true, 0, -1)) {
    fprintf(stderr, "hold: cannot create the iov or ring\n");
    return 2;
  }
  for (int i = 0; i < n; i++) {
    if (hf3fs_prep_io(&ior, &iov, true, iov.base + (size_t)i * MIB, fd, (size_t)i * MIB, MIB, NULL) < 0) {
      fprintf(stderr, "hold: prep %d failed\n", i);
      return 2;
    }
  }
  hf3fs_submit_ios(&ior);
  printf("READY %d\n", getpid());
  fflush(stdout);
  for (;;) pause();
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 5 && strcmp(argv[1], "--hold") == 0) return hold(argv[2], argv[3], atoi(argv[4]));
  if (argc != 3) {
    fprintf(stderr, "usage: %s MOUNT WORKDIR | --hold MOUNT FILE N\n", argv[0]);
    return 2;
  }
  g_mount = argv[1];
  g_dir = argv[2];
  mkdir(g_dir, 0755);
  run("identify_mount", t_identify);
  run("iov_create_open_unlink_destroy", t_iov_lifecycle);
  run("reg_fd_return_values", t_reg_fd);
  run("random_reads_io_depth_0", t_reads_depth0);
  run("random_reads_io_depth_32", t_reads_depth_exact);
  run("random_reads_io_depth_minus_8_timeout", t_reads_depth_negative);
  run("random_reads_allow_read_uncommitted", t_reads_uncommitted_flag);
  run("random_writes_visible_after_fsync", t_writes);
  run("holes_and_forbid_read_holes", t_holes);
  run("bad_fd_bad_pointer_bad_arguments", t_bad_arguments);
  run("ring_overflow", t_ring_overflow);
  run("io_depth_semantics_and_priorities", t_io_depth_semantics);
  run("nothing_left_behind", t_nothing_left);
  printf("usrbio-c: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
