/* backend_cpu.c — the CPU backend: OpenBLAS sgemm, the kernels of layers.c and loops over the
 * element-wise functions of elementwise.h, behind the operation table of backend.h.
 *
 * Owns: nothing but what alloc / stager_create hand out (host memory, calloc'ed). No threads
 * of its own (OpenBLAS may run its pool inside sgemm, see wagma_train_set_threads).
 * Invariant: every operation is complete when it returns, so sync / download_wait are no-ops
 * and there is never a sticky error. The arithmetic is the one wagma_train always used, bit
 * for bit. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "agent/train/backend.h"

/* ------------------------------------------------------------------ BLAS threads */

static atomic_int blas_threads; /* 0 = never set by this library */

int wagma_train_set_threads(int n) {
  if (n < 1)
    return WAGMA_EINVAL;
  openblas_set_num_threads(n);
  atomic_store(&blas_threads, n);
  return WAGMA_OK;
}

int wagma_train_threads(void) {
  int n = atomic_load(&blas_threads);
  return n ? n : 1;
}

/* The first model on the CPU sets one BLAS thread unless the process chose. */
static void default_threads(void) {
  if (atomic_load(&blas_threads) == 0)
    wagma_train_set_threads(1);
}

/* ------------------------------------------------------------------ memory */

static void cpu_close(wagma_backend_t *b) {
  (void)b;
}

static int cpu_status(wagma_backend_t *b) {
  (void)b;
  return WAGMA_OK;
}

static void *cpu_alloc(wagma_backend_t *b, size_t bytes) {
  (void)b;
  default_threads();
  return calloc(1, bytes ? bytes : 1);
}

static void cpu_free(wagma_backend_t *b, void *p) {
  (void)b;
  free(p);
}

static int cpu_upload(wagma_backend_t *b, void *dst, const void *src, size_t bytes) {
  (void)b;
  if (bytes && dst != src)
    memcpy(dst, src, bytes);
  return WAGMA_OK;
}

static void cpu_copy(wagma_backend_t *b, void *dst, const void *src, size_t bytes) {
  (void)b;
  if (bytes && dst != src)
    memmove(dst, src, bytes);
}

static void cpu_zero(wagma_backend_t *b, void *p, size_t bytes) {
  (void)b;
  memset(p, 0, bytes);
}

static int cpu_sync(wagma_backend_t *b) {
  (void)b;
  return WAGMA_OK;
}

static void *cpu_host_alloc(wagma_backend_t *b, size_t bytes) {
  (void)b;
  return malloc(bytes ? bytes : 1);
}

/* ------------------------------------------------------------------ batches */

struct wg_stager {
  float *x;
  int32_t *y;
  size_t x_floats, n_max;
};

static wg_stager_t *cpu_stager_create(wagma_backend_t *b, size_t x_floats, size_t n_max) {
  (void)b;
  wg_stager_t *s = calloc(1, sizeof(*s));
  if (!s)
    return NULL;
  s->x = malloc((x_floats ? x_floats : 1) * sizeof(float));
  s->y = malloc((n_max ? n_max : 1) * sizeof(int32_t));
  s->x_floats = x_floats;
  s->n_max = n_max;
  if (!s->x || !s->y) {
    free(s->x);
    free(s->y);
    free(s);
    return NULL;
  }
  return s;
}

static void cpu_stager_destroy(wagma_backend_t *b, wg_stager_t *s) {
  (void)b;
  if (!s)
    return;
  free(s->x);
  free(s->y);
  free(s);
}

static int cpu_stage(wagma_backend_t *b, wg_stager_t *s, const float *host_x, size_t x_floats,
                     const int32_t *host_y, size_t n, const float **x, const int32_t **y) {
  (void)b;
  if (x_floats > s->x_floats || n > s->n_max)
    return WAGMA_ERANGE;
  memcpy(s->x, host_x, x_floats * sizeof(float));
  memcpy(s->y, host_y, n * sizeof(int32_t));
  *x = s->x;
  *y = s->y;
  return WAGMA_OK;
}

/* ------------------------------------------------------------------ math */

static void cpu_gemm(wagma_backend_t *b, int ta, int tb, size_t M, size_t N, size_t K, float alpha,
                     const float *A, size_t lda, const float *B, size_t ldb, float beta, float *C,
                     size_t ldc) {
  (void)b;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M,
              (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

static void cpu_bias_rows(wagma_backend_t *b, size_t n, size_t out, const float *bias, float *y) {
  (void)b;
  for (size_t i = 0; i < n; i++)
    memcpy(y + i * out, bias, out * sizeof(float));
}

static void cpu_bias_grad(wagma_backend_t *b, size_t n, size_t out, const float *dy, float *db) {
  (void)b;
  for (size_t o = 0; o < out; o++)
    db[o] = 0.0f;
  for (size_t i = 0; i < n; i++)
    for (size_t o = 0; o < out; o++)
      db[o] += dy[i * out + o];
}

static void cpu_conv_forward(wagma_backend_t *b, const wg_conv_shape_t *s, size_t n, const float *x,
                             const float *w, const float *bias, float *y, float *cols, float *tmp) {
  (void)b;
  wg_conv_forward(s, n, x, w, bias, y, cols, tmp);
}

static void cpu_conv_backward(wagma_backend_t *b, const wg_conv_shape_t *s, size_t n,
                              const float *cols, const float *w, const float *dy, float *dw,
                              float *db, float *dx, float *tmp) {
  (void)b;
  wg_conv_backward(s, n, cols, w, dy, dw, db, dx, tmp);
}

static void cpu_pool_forward(wagma_backend_t *b, const wg_pool_shape_t *s, int mode, size_t n,
                             const float *x, float *y, int32_t *argmax) {
  (void)b;
  wg_pool_forward(s, mode, n, x, y, argmax);
}

static void cpu_pool_backward(wagma_backend_t *b, const wg_pool_shape_t *s, int mode, size_t n,
                              const float *dy, const int32_t *argmax, float *dx) {
  (void)b;
  wg_pool_backward(s, mode, n, dy, argmax, dx);
}

static void cpu_act_forward(wagma_backend_t *b, int fn, size_t len, const float *x, float *y) {
  (void)b;
  wg_act_forward(fn, len, x, y);
}

static void cpu_act_backward(wagma_backend_t *b, int fn, size_t len, const float *y,
                             const float *dy, float *dx) {
  (void)b;
  wg_act_backward(fn, len, y, dy, dx);
}

static int cpu_softmax_xent(wagma_backend_t *b, size_t n, size_t classes, const float *logits,
                            const int32_t *y, float *dlogits, double *loss, size_t *correct) {
  (void)b;
  *loss = wg_softmax_xent(n, classes, logits, y, dlogits, correct);
  return WAGMA_OK;
}

static void cpu_sgd(wagma_backend_t *b, size_t n, float *w, const float *g, float *v, float lr,
                    float mu, float wd, int nesterov) {
  (void)b;
  if (!v) {
    for (size_t i = 0; i < n; i++)
      wg_sgd_plain(&w[i], g[i], lr, wd);
    return;
  }
  for (size_t i = 0; i < n; i++)
    wg_sgd_momentum(&w[i], &v[i], g[i], lr, mu, wd, nesterov);
}

static void cpu_adam(wagma_backend_t *b, size_t n, float *w, const float *g, float *m, float *v,
                     const wg_adam_consts_t *k) {
  (void)b;
  const wg_adam_consts_t c = *k; /* a local copy: the loop need not reload it */
  for (size_t i = 0; i < n; i++)
    wg_adam(&w[i], &m[i], &v[i], g[i], &c);
}

const wg_backend_ops_t wg_cpu_ops = {
    .kind = "cpu",
    .host_memory = 1,
    .close = cpu_close,
    .status = cpu_status,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_upload, /* both are memcpy on the host */
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .download_async = cpu_upload,
    .download_wait = cpu_sync,
    .stager_create = cpu_stager_create,
    .stager_destroy = cpu_stager_destroy,
    .stage = cpu_stage,
    .gemm = cpu_gemm,
    .bias_rows = cpu_bias_rows,
    .bias_grad = cpu_bias_grad,
    .conv_cols_len = wg_conv_cols_len,
    .conv_tmp_len = wg_conv_tmp_len,
    .conv_forward = cpu_conv_forward,
    .conv_backward = cpu_conv_backward,
    .pool_forward = cpu_pool_forward,
    .pool_backward = cpu_pool_backward,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .softmax_xent = cpu_softmax_xent,
    .sgd = cpu_sgd,
    .adam = cpu_adam,
};
