/* checkpoint.c — parameters + optimizer state + iteration in one file, written atomically.
 *
 * Layout (little-endian), a 96-byte header then the payload:
 *   0 magic "WGMACKPT" | 8 u32 version (1) | 12 u32 header length (96) | 16 u64 model signature
 *   24 u64 parameter count | 32 u32 optimizer kind (UINT32_MAX: none) | 36 u32 zero
 *   40 u64 optimizer state floats | 48 u64 optimizer updates | 56 u64 iteration
 *   64 u32 payload CRC32 | 68..92 zero | 92 u32 CRC32 of bytes 0..92
 *   payload: parameter floats, then optimizer state floats (IEEE-754 binary32, little-endian).
 *
 * The bytes do not depend on the backend: parameters and state are downloaded to the host in
 * their one layout (wagma_model_get_params / wagma_optim_get_state) before they are written,
 * and uploaded from the host after a load, so a checkpoint written on CUDA resumes on the CPU
 * and back.
 *
 * Owns nothing past a call. No threads. Invariants: a file is published only by rename(2)
 * after fsync, so readers see an old or a new checkpoint whole; load validates all of the file
 * into temporary buffers before it changes the model or the optimizer. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "agent/train/backend.h"
#include "agent/train/internal.h"
#include "agent/train/train.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.c writes floats in host order and assumes a little-endian host"
#endif

#define CKPT_MAGIC "WGMACKPT"
#define CKPT_VERSION 1u
#define CKPT_HEADER 96u
#define CKPT_NO_OPTIM UINT32_MAX

typedef struct ckpt_header {
  uint32_t version, header_len, optim_kind;
  uint64_t signature, n_params, state_len, updates, iteration;
  uint32_t payload_crc;
} ckpt_header_t;

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static void encode_header(unsigned char *b, const ckpt_header_t *h) {
  memset(b, 0, CKPT_HEADER);
  memcpy(b, CKPT_MAGIC, 8);
  put32(b + 8, h->version);
  put32(b + 12, h->header_len);
  put64(b + 16, h->signature);
  put64(b + 24, h->n_params);
  put32(b + 32, h->optim_kind);
  put64(b + 40, h->state_len);
  put64(b + 48, h->updates);
  put64(b + 56, h->iteration);
  put32(b + 64, h->payload_crc);
  put32(b + 92, (uint32_t)crc32_z(0, b, 92));
}

static uint32_t crc_floats(uint32_t crc, const float *x, size_t n) {
  return (uint32_t)crc32_z(crc, (const unsigned char *)x, n * sizeof(float));
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len) {
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

/* Opens the directory holding path and points *name at path's last component (inside path).
 * Returns the directory's fd or -1 with errno set. */
static int open_parent(const char *path, const char **name) {
  char copy[PATH_MAX];
  const char *slash = strrchr(path, '/');
  *name = slash ? slash + 1 : path;
  if (!slash)
    return open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (slash == path)
    return open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  snprintf(copy, sizeof(copy), "%.*s", (int)(slash - path), path);
  return open(copy, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* A file name for *_at: one non-empty component, not "." or "..". */
static int name_ok(const char *name) {
  return name && name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* Saves into dirfd/name (tmp file, fsync, renameat, directory fsync); shows `path` in messages.
 * nofollow: the file is created with O_NOFOLLOW (a symbolic link planted at the temporary name
 * is refused, never written through). */
static int save_at(int dirfd, const char *name, const char *path, int nofollow, wagma_model_t *m,
                   wagma_optim_t *o, uint64_t iteration, char *err, size_t err_len) {
  int rc = WAGMA_EIO, fd = -1;
  char tmp[NAME_MAX + 1];
  unsigned char head[CKPT_HEADER];
  if (!m || !name_ok(name) || strlen(name) + 32 > NAME_MAX) {
    wg_errf(err, err_len, "missing model or bad checkpoint path");
    return WAGMA_EINVAL;
  }
  snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", name, (long)getpid());
  size_t state_len = 0;
  const float *state = o ? wagma_optim_state(o, &state_len) : NULL;
  const float *params = wagma_model_params(m);
  float *host = NULL; /* host copies of a device model's parameters and state */
  if (!wagma_backend_host_memory(wagma_model_backend(m)) ||
      (o && !wagma_backend_host_memory(wagma_optim_backend(o)))) {
    size_t np = wagma_model_param_count(m);
    host = malloc((np + state_len) * sizeof(float) + 1);
    if (!host) {
      wg_errf(err, err_len, "out of memory for a host copy of the model");
      return WAGMA_ENOMEM;
    }
    int e = wagma_model_get_params(m, host);
    if (!e && o)
      e = wagma_optim_get_state(o, host + np);
    if (e) {
      wg_errf(err, err_len, "cannot copy the model to the host: %s",
              wagma_backend_error(wagma_model_backend(m)));
      free(host);
      return e;
    }
    params = host;
    state = o ? host + np : NULL;
  }
  ckpt_header_t h = {
      .version = CKPT_VERSION,
      .header_len = CKPT_HEADER,
      .optim_kind = o ? (uint32_t)wagma_optim_config(o)->kind : CKPT_NO_OPTIM,
      .signature = wagma_model_signature(m),
      .n_params = wagma_model_param_count(m),
      .state_len = state_len,
      .updates = o ? wagma_optim_updates(o) : 0,
      .iteration = iteration,
  };
  h.payload_crc = crc_floats(0, params, h.n_params);
  if (state_len) /* crc32_z(crc, NULL, 0) is 0, not crc: no optimizer must not reset it */
    h.payload_crc = crc_floats(h.payload_crc, state, state_len);
  encode_header(head, &h);
  fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0),
              0644);
  if (fd < 0) {
    wg_errf(err, err_len, "%s.tmp.%ld: cannot create: %s", path, (long)getpid(), strerror(errno));
    goto out;
  }
  if (write_all(fd, head, sizeof(head)) || write_all(fd, params, h.n_params * sizeof(float)) ||
      (state_len && write_all(fd, state, state_len * sizeof(float)))) {
    wg_errf(err, err_len, "%s.tmp.%ld: write failed: %s", path, (long)getpid(), strerror(errno));
    goto out;
  }
  if (fsync(fd) != 0) {
    wg_errf(err, err_len, "%s.tmp.%ld: fsync failed: %s", path, (long)getpid(), strerror(errno));
    goto out;
  }
  int closed = close(fd);
  fd = -1;
  if (closed != 0 || renameat(dirfd, tmp, dirfd, name) != 0) {
    wg_errf(err, err_len, "%s: cannot publish: %s", path, strerror(errno));
    goto out;
  }
  if (fsync(dirfd) != 0) {
    wg_errf(err, err_len, "%s: directory fsync failed: %s", path, strerror(errno));
    goto out; /* the file is in place but its durability is unknown */
  }
  rc = WAGMA_OK;
out:
  if (fd >= 0)
    close(fd);
  if (rc)
    unlinkat(dirfd, tmp, 0); /* harmless after a successful rename: tmp no longer exists */
  free(host);
  return rc;
}

int wagma_checkpoint_save(const char *path, wagma_model_t *m, wagma_optim_t *o, uint64_t iteration,
                          char *err, size_t err_len) {
  const char *name;
  if (!path || !m || strlen(path) + 32 >= PATH_MAX) {
    wg_errf(err, err_len, "missing model or bad checkpoint path");
    return WAGMA_EINVAL;
  }
  int dirfd = open_parent(path, &name);
  if (dirfd < 0) {
    wg_errf(err, err_len, "%s: cannot open its directory: %s", path, strerror(errno));
    return WAGMA_EIO;
  }
  int rc = save_at(dirfd, name, path, 0, m, o, iteration, err, err_len);
  close(dirfd);
  return rc;
}

int wagma_checkpoint_save_at(int dirfd, const char *name, wagma_model_t *m, wagma_optim_t *o,
                             uint64_t iteration, char *err, size_t err_len) {
  return save_at(dirfd, name, name ? name : "", 1, m, o, iteration, err, err_len);
}

/* Loads from the open file fd (closed here); shows `path` in messages.
 * Ownership: m and o stay the caller's; they are written only when the whole file is valid. */
static int load_fd(int fd, const char *path, wagma_model_t *m, wagma_optim_t *o,
                   uint64_t *iteration, char *err, size_t err_len) {
  int rc = WAGMA_EPROTO;
  float *payload = NULL;
  unsigned char b[CKPT_HEADER];
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    int saved = errno;
    wg_errf(err, err_len, "%s: %s", path,
            saved == ELOOP ? "is a symbolic link (not followed)" : strerror(saved));
    rc = saved == ENOENT ? WAGMA_ENOTFOUND : saved == ELOOP ? WAGMA_EPERM : WAGMA_EIO;
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    wg_errf(err, err_len, "%s: not a regular file", path);
    goto out;
  }
  if ((size_t)st.st_size < CKPT_HEADER || read_all(fd, b, CKPT_HEADER)) {
    wg_errf(err, err_len, "%s: shorter than a checkpoint header", path);
    goto out;
  }
  if (memcmp(b, CKPT_MAGIC, 8) != 0) {
    wg_errf(err, err_len, "%s: not a wagma checkpoint (bad magic)", path);
    goto out;
  }
  ckpt_header_t h = {
      .version = get32(b + 8),
      .header_len = get32(b + 12),
      .signature = get64(b + 16),
      .n_params = get64(b + 24),
      .optim_kind = get32(b + 32),
      .state_len = get64(b + 40),
      .updates = get64(b + 48),
      .iteration = get64(b + 56),
      .payload_crc = get32(b + 64),
  };
  if (h.version != CKPT_VERSION || h.header_len != CKPT_HEADER) {
    wg_errf(err, err_len, "%s: unsupported checkpoint version %u (header %u bytes)", path,
            h.version, h.header_len);
    goto out;
  }
  if (get32(b + 92) != (uint32_t)crc32_z(0, b, 92)) {
    wg_errf(err, err_len, "%s: checkpoint header checksum mismatch", path);
    goto out;
  }
  if (h.n_params > ((uint64_t)1 << 34) || h.state_len > ((uint64_t)1 << 35) ||
      (uint64_t)st.st_size != CKPT_HEADER + (h.n_params + h.state_len) * sizeof(float)) {
    wg_errf(err, err_len, "%s: file is %lld bytes, header says %llu parameters + %llu state", path,
            (long long)st.st_size, (unsigned long long)h.n_params, (unsigned long long)h.state_len);
    goto out;
  }
  rc = WAGMA_EINVAL; /* a valid file, but for another model or optimizer */
  if (h.n_params != wagma_model_param_count(m) || h.signature != wagma_model_signature(m)) {
    wg_errf(err, err_len, "%s: checkpoint of another model (%llu parameters) than %s (%zu)", path,
            (unsigned long long)h.n_params, wagma_model_describe(m), wagma_model_param_count(m));
    goto out;
  }
  size_t o_len = 0;
  if (o) {
    wagma_optim_state(o, &o_len);
    if (h.optim_kind != (uint32_t)wagma_optim_config(o)->kind || h.state_len != o_len) {
      wg_errf(err, err_len,
              "%s: optimizer state is kind %u with %llu floats, this optimizer is kind %d "
              "with %zu",
              path, h.optim_kind, (unsigned long long)h.state_len, wagma_optim_config(o)->kind,
              o_len);
      goto out;
    }
  }
  rc = WAGMA_ENOMEM;
  size_t total = (size_t)(h.n_params + h.state_len);
  payload = malloc(total * sizeof(float));
  if (!payload) {
    wg_errf(err, err_len, "%s: out of memory for the payload", path);
    goto out;
  }
  rc = WAGMA_EPROTO;
  if (read_all(fd, payload, total * sizeof(float))) {
    wg_errf(err, err_len, "%s: short read: %s", path, strerror(errno));
    rc = WAGMA_EIO;
    goto out;
  }
  if (crc_floats(0, payload, total) != h.payload_crc) {
    wg_errf(err, err_len, "%s: checkpoint payload checksum mismatch", path);
    goto out;
  }
  if ((rc = wagma_model_set_params(m, payload)) ||
      (o && o_len && (rc = wagma_optim_set_state(o, payload + h.n_params)))) {
    wg_errf(err, err_len, "%s: cannot copy the checkpoint to the device: %s", path,
            wagma_backend_error(wagma_model_backend(m)));
    goto out;
  }
  if (o)
    wagma_optim_set_updates(o, h.updates);
  if (iteration)
    *iteration = h.iteration;
  rc = WAGMA_OK;
out:
  if (fd >= 0)
    close(fd);
  free(payload);
  return rc;
}

int wagma_checkpoint_load(const char *path, wagma_model_t *m, wagma_optim_t *o, uint64_t *iteration,
                          char *err, size_t err_len) {
  if (!path || !m) {
    wg_errf(err, err_len, "missing model or checkpoint path");
    return WAGMA_EINVAL;
  }
  /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is then refused as not a
   * regular file); it changes nothing for a regular file. */
  return load_fd(open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), path, m, o, iteration, err,
                 err_len);
}

int wagma_checkpoint_load_at(int dirfd, const char *name, wagma_model_t *m, wagma_optim_t *o,
                             uint64_t *iteration, char *err, size_t err_len) {
  if (!m || !name_ok(name)) {
    wg_errf(err, err_len, "missing model or bad checkpoint name");
    return WAGMA_EINVAL;
  }
  return load_fd(openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW), name, m, o,
                 iteration, err, err_len);
}
