/*
 * hf3fs_usrbio.h — USRBIO, the shared-memory ring I/O of 3FS, as served by
 * a 3FS-KV mount (`fskv mount` / `fskv up --mount`). Link with
 * -lhf3fs_api_shared (pkg-config: hf3fs_usrbio).
 *
 * Written for 3FS-KV. Names, signatures, structure layouts and return
 * conventions follow 3FS's public interface of the same name, so programs
 * written for 3FS build and run against this library unchanged.
 *
 * Model: an iov is a buffer in shared memory that the FUSE daemon maps too;
 * a ring (ior) holds submission and completion queues in shared memory.
 * Register the files to use (hf3fs_reg_fd), prepare requests whose buffers
 * lie inside an iov (hf3fs_prep_io), tell the daemon (hf3fs_submit_ios) and
 * collect completions (hf3fs_wait_for_ios). The data moves between the
 * storage service and the iov without passing through the kernel's FUSE
 * path. See docs/usrbio.md of 3FS-KV.
 */
#ifndef HF3FS_USRBIO_H
#define HF3FS_USRBIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What ioctl(fd, <magic query>) answers for a file of the mount. */
#define HF3FS_SUPER_MAGIC 0x8f3f5fff

/* Opaque library state behind an iov / a ring. */
typedef void *hf3fs_iov_handle;
typedef void *hf3fs_ior_handle;

/* A shared-memory buffer region. Allocate the struct yourself (stack or
 * heap); the functions below fill it in. */
struct hf3fs_iov {
  uint8_t *base;          /* first byte of the region in this process */
  hf3fs_iov_handle iovh;  /* NULL for a wrapped region */
  char id[16];            /* identity of the region (names it to the daemon) */
  char mount_point[256];
  size_t size;
  size_t block_size;      /* kept for compatibility; 0 = one block */
  int numa;               /* kept for compatibility; not used */
};

/* An I/O ring. Its own memory is an iov. */
struct hf3fs_ior {
  struct hf3fs_iov iov;
  hf3fs_ior_handle iorh;
  char mount_point[256];
  bool for_read;          /* a ring only reads or only writes */
  /* io_depth > 0: the daemon takes requests in batches of exactly io_depth
   *               (fewer wait until more are prepared);
   * io_depth == 0: it takes whatever is prepared;
   * io_depth < 0: batches of up to -io_depth, waiting at most `timeout` ms
   *               for a batch to fill.
   * hf3fs_submit_ios() wakes the daemon; it may also find prepared requests
   * on its own. */
  int io_depth;
  int priority;           /* < 0 high, 0 normal, > 0 low */
  int timeout;            /* ms, for io_depth < 0 */
  uint64_t flags;         /* HF3FS_IOR_* */
};

/* One completion. */
struct hf3fs_cqe {
  int32_t index;          /* what hf3fs_prep_io returned for the request */
  int32_t reserved;
  int64_t result;         /* bytes transferred (short at end of file), or -errno */
  const void *userdata;   /* as given to hf3fs_prep_io */
};

/* Ring flags (hf3fs_iorcreate4). */
#define HF3FS_IOR_ALLOW_READ_UNCOMMITTED 1 /* reads may return data not yet committed on every replica */
#define HF3FS_IOR_FORBID_READ_HOLES 2      /* a read meeting a hole fails with -ENODATA instead of reading zeros */

/* 1 if fd is a file or directory of a 3FS-KV mount, else 0. */
bool hf3fs_is_hf3fs(int fd);

/* Finds the mount point of the mount holding `path`. Returns its length + 1
 * (and copies it, NUL-terminated, if that fits in `size`), or -1 if `path`
 * is not on a mount. A return value larger than `size` means the buffer was
 * too small and nothing was copied. */
int hf3fs_extract_mount_point(char *hf3fs_mount_point, int size, const char *path);

/* Iovs. These return 0 or -errno. */

/* Creates a region of `size` bytes in /dev/shm and registers it with the
 * mount's daemon. The mount point is copied into iov->mount_point (it must
 * be shorter than 256 bytes). */
int hf3fs_iovcreate(struct hf3fs_iov *iov, const char *hf3fs_mount_point, size_t size, size_t block_size, int numa);
/* Maps a region another process created and registered, by its id. */
int hf3fs_iovopen(struct hf3fs_iov *iov, const uint8_t id[16], const char *hf3fs_mount_point, size_t size, size_t block_size,
                  int numa);
/* Describes memory that is already a registered region (mapped by this
 * process from the /dev/shm file registered under `id`); registers nothing.
 * Such an iov is not freed by hf3fs_iovdestroy. Keep the memory mapped while
 * requests use it. */
int hf3fs_iovwrap(struct hf3fs_iov *iov, void *base, const uint8_t id[16], const char *hf3fs_mount_point, size_t size,
                  size_t block_size, int numa);
/* Removes the region's /dev/shm file (the mappings stay; hf3fs_iovopen of it
 * fails from now on). */
void hf3fs_iovunlink(struct hf3fs_iov *iov);
/* Deregisters the region, unmaps it and removes its file. The struct itself
 * is not freed. */
void hf3fs_iovdestroy(struct hf3fs_iov *iov);

/* Rings. */

/* Bytes of shared memory a ring of `entries` uses. */
size_t hf3fs_ior_size(int entries);
/* 0 or -errno. -EINVAL for entries < 1, |io_depth| > entries, timeout < 0,
 * unknown flags. */
int hf3fs_iorcreate(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries, bool for_read, int io_depth, int numa);
int hf3fs_iorcreate2(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries, bool for_read, int io_depth, int priority,
                     int numa);
int hf3fs_iorcreate3(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries, bool for_read, int io_depth, int priority,
                     int timeout, int numa);
int hf3fs_iorcreate4(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries, bool for_read, int io_depth, int timeout,
                     int numa, uint64_t flags);
/* Deregisters and unmaps the ring. The struct itself is not freed. */
void hf3fs_iordestroy(struct hf3fs_ior *ior);

/* Files. */

/* Registers an open file of the mount for use in hf3fs_prep_io. Note the
 * convention: returns a value <= 0 on success (minus a duplicate of the
 * descriptor, which keeps the file open while registered; either the
 * descriptor or that value may be passed as `fd` to hf3fs_prep_io), and a
 * POSITIVE errno on failure: EBADF if fd is not on a mount, EINVAL if it is
 * registered already. */
int hf3fs_reg_fd(int fd, uint64_t flags);
void hf3fs_dereg_fd(int fd);

/* Requests. */

/* How many requests the ring holds (prepared + in flight + completed and not
 * yet collected). */
int hf3fs_io_entries(const struct hf3fs_ior *ior);
/* Prepares a read into (or write from) [ptr, ptr + len) of `iov` at offset
 * `off` of the registered file `fd`. Returns the request's index (>= 0) or
 * -EINVAL (bad arguments, `read` differs from the ring's direction, len 0,
 * buffer not inside the iov), -EBADF (fd not registered), -EACCES (fd not
 * open for that direction), -EAGAIN (ring full). Not thread-safe for one
 * ring: use a ring per thread. */
int hf3fs_prep_io(const struct hf3fs_ior *ior, const struct hf3fs_iov *iov, bool read, void *ptr, int fd, size_t off, uint64_t len,
                  const void *userdata);
/* Wakes the daemon for the prepared requests. 0 or -errno. */
int hf3fs_submit_ios(const struct hf3fs_ior *ior);
/* Collects completions into cqes[0..cqec): waits until at least
 * min_results are collected or the CLOCK_REALTIME instant abs_timeout passes
 * (NULL: no limit). Returns how many were collected (possibly fewer than
 * ready: call again), or -errno (-EINVAL for cqec < 1; -ENOTCONN if the
 * daemon went away before any completion). */
int hf3fs_wait_for_ios(const struct hf3fs_ior *ior, struct hf3fs_cqe *cqes, int cqec, int min_results,
                       const struct timespec *abs_timeout);

/* Other calls of the 3FS interface. They return 0 or a POSITIVE errno. */

/* Hard link `link_name` to `target` (link(2) through the mount). */
int hf3fs_hardlink(const char *target, const char *link_name);
/* Not supported by 3FS-KV: returns EOPNOTSUPP. */
int hf3fs_punchhole(int fd, int n, const size_t *start, const size_t *end, size_t flags);

/* Device (GPU) memory is not supported: these report host memory only. */
enum hf3fs_mem_type {
  HF3FS_MEM_HOST = 0,
  HF3FS_MEM_DEVICE = 1,
  HF3FS_MEM_MANAGED = 2,
};
/* -ENOTSUP. */
int hf3fs_iovcreate_device(struct hf3fs_iov *iov, const char *hf3fs_mount_point, size_t size, size_t block_size, int device_id);
bool hf3fs_gdr_available(void);                               /* false */
int hf3fs_gdr_device_count(void);                             /* 0 */
enum hf3fs_mem_type hf3fs_iov_mem_type(const struct hf3fs_iov *iov); /* HF3FS_MEM_HOST */
int hf3fs_iov_device_id(const struct hf3fs_iov *iov);         /* -1 */
int hf3fs_iovsync(const struct hf3fs_iov *iov, int direction); /* 0 (-EINVAL for NULL) */

#ifdef __cplusplus
}
#endif

#endif /* HF3FS_USRBIO_H */
