/* backend.c — the public face of the backends: names, probing, opening, the CPU singleton and
 * the calls of train.h that forward to the operation table (backend.h).
 *
 * Owns nothing but the CPU singleton (static, stateless). No threads. Invariant: the CPU
 * backend is never freed; a CUDA backend is freed by wagma_backend_close (backend_cuda.cu). */
#include <stdlib.h>
#include <string.h>

#include "agent/train/backend.h"
#include "agent/train/internal.h"
#include "agent/train/kernel_index.h"

_Static_assert(WG_ACT_RELU == WAGMA_ACT_RELU && WG_ACT_TANH == WAGMA_ACT_TANH,
               "elementwise.h and train.h number the activations alike");
_Static_assert(WG_POOL_MAX == WAGMA_POOL_MAX && WG_POOL_AVG == WAGMA_POOL_AVG,
               "kernel_index.h and train.h number the pooling modes alike");

static wagma_backend_t cpu_backend = {.ops = &wg_cpu_ops, .ctx = NULL, .name = "cpu"};

wagma_backend_t *wagma_backend_cpu(void) {
  return &cpu_backend;
}

int wagma_train_have_cuda(void) {
#ifdef WAGMA_TRAIN_CUDA
  return 1;
#else
  return 0;
#endif
}

/* "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N; -2 when the name is not a backend. */
static int parse_name(const char *name) {
  if (!name)
    return -2;
  if (!strcmp(name, "cpu"))
    return -1;
  if (!strcmp(name, "cuda"))
    return 0;
  if (!strncmp(name, "cuda:", 5) && name[5] >= '0' && name[5] <= '9') {
    char *end = NULL;
    long v = strtol(name + 5, &end, 10);
    if (*end == '\0' && v >= 0 && v < 1024)
      return (int)v;
  }
  return -2;
}

int wagma_backend_probe(const char *name, char *err, size_t err_len) {
  int ordinal = parse_name(name);
  if (ordinal == -2) {
    wg_errf(err, err_len, "unknown device '%s' (cpu, cuda, cuda:N)", name ? name : "(null)");
    return WAGMA_EINVAL;
  }
  if (ordinal == -1)
    return WAGMA_OK;
#ifdef WAGMA_TRAIN_CUDA
  return wg_cuda_probe(ordinal, err, err_len);
#else
  wg_errf(err, err_len,
          "device '%s': this build has no CUDA backend (CMake did not find CUDA, or "
          "WAGMA_WITH_CUDA=OFF)",
          name);
  return WAGMA_ENOSYS;
#endif
}

int wagma_backend_open(const char *name, wagma_backend_t **out, char *err, size_t err_len) {
  if (!out) {
    wg_errf(err, err_len, "missing argument");
    return WAGMA_EINVAL;
  }
  *out = NULL;
  int rc = wagma_backend_probe(name, err, err_len);
  if (rc)
    return rc;
  int ordinal = parse_name(name);
  if (ordinal == -1) {
    *out = &cpu_backend;
    return WAGMA_OK;
  }
#ifdef WAGMA_TRAIN_CUDA
  return wg_cuda_open(ordinal, out, err, err_len);
#else
  return WAGMA_ENOSYS; /* not reached: probe refused it */
#endif
}

void wagma_backend_close(wagma_backend_t *b) {
  if (b && b != &cpu_backend && b->ops->close)
    b->ops->close(b);
}

const char *wagma_backend_name(const wagma_backend_t *b) {
  return b->name;
}

int wagma_backend_host_memory(const wagma_backend_t *b) {
  return b->ops->host_memory;
}

int wagma_backend_sync(wagma_backend_t *b) {
  return b->ops->sync(b);
}

const char *wagma_backend_error(const wagma_backend_t *b) {
  return b->err;
}

void *wagma_backend_host_alloc(wagma_backend_t *b, size_t bytes) {
  return b->ops->host_alloc(b, bytes);
}

void wagma_backend_host_free(wagma_backend_t *b, void *p) {
  if (p)
    b->ops->host_free(b, p);
}

/* ------------------------------------------------------------------ dense layers */

void wg_dense_forward(wagma_backend_t *b, size_t n, size_t in, size_t out, const float *x,
                      const float *w, const float *bias, float *y) {
  b->ops->bias_rows(b, n, out, bias, y);
  b->ops->gemm(b, 0, 1, n, out, in, 1.0f, x, in, w, in, 1.0f, y, out);
}

void wg_dense_backward(wagma_backend_t *b, size_t n, size_t in, size_t out, const float *x,
                       const float *w, const float *dy, float *dw, float *db, float *dx) {
  b->ops->gemm(b, 1, 0, out, in, n, 1.0f, dy, out, x, in, 0.0f, dw, in); /* dw = dy^T . x */
  b->ops->bias_grad(b, n, out, dy, db);
  if (dx) /* dx[n][in] = dy . w */
    b->ops->gemm(b, 0, 0, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}
