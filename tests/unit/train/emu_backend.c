/* emu_backend.c — "cuda-emu": the CUDA backend's algorithm (agent/train/backend_cuda.cu) run on
 * the host, so that the conformance suite (conformance.c) checks it against the CPU backend on
 * every machine, GPU or not.
 *
 * What is the CUDA backend's, exactly: the column-major GEMM argument mapping of cuda_gemm (here
 * through cblas in column-major order, which has cuBLAS's semantics), the bias gradient as a
 * GEMM with a vector of ones, the whole-batch im2col / col2im scratch layouts and the per-element
 * bodies of kernel_index.h and elementwise.h (the very functions the kernels loop over), the
 * fixed reduction tree of the channel sums, the per-sample losses summed on the host in sample
 * order, two alternating staging slots, and "device" memory that the library may only reach
 * through upload / download (host_memory 0, so models.c and checkpoint.c take their device
 * paths). What it cannot check: the CUDA runtime itself (streams, events, launches, pinned
 * memory), which only test_train_gpu on a GPU does.
 *
 * Keep in step with backend_cuda.cu. */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "agent/train/backend.h"
#include "agent/train/kernel_index.h"
#include "test_train.h"

typedef struct emu_ctx {
  float *ones;
  size_t ones_len;
} emu_ctx_t;

static void emu_close(wagma_backend_t *b) {
  emu_ctx_t *c = b->ctx;
  free(c->ones);
  free(c);
  free(b);
}

static int emu_status(wagma_backend_t *b) {
  (void)b;
  return WAGMA_OK;
}

static void *emu_alloc(wagma_backend_t *b, size_t bytes) {
  (void)b;
  return calloc(1, bytes ? bytes : 1);
}

static void emu_free(wagma_backend_t *b, void *p) {
  (void)b;
  free(p);
}

static int emu_memcpy(wagma_backend_t *b, void *dst, const void *src, size_t bytes) {
  (void)b;
  if (bytes)
    memmove(dst, src, bytes);
  return WAGMA_OK;
}

static void emu_copy(wagma_backend_t *b, void *dst, const void *src, size_t bytes) {
  emu_memcpy(b, dst, src, bytes);
}

static void emu_zero(wagma_backend_t *b, void *p, size_t bytes) {
  (void)b;
  memset(p, 0, bytes);
}

static int emu_sync(wagma_backend_t *b) {
  (void)b;
  return WAGMA_OK;
}

static void *emu_host_alloc(wagma_backend_t *b, size_t bytes) {
  (void)b;
  return malloc(bytes ? bytes : 1);
}

struct wg_stager {
  float *x[2];
  int32_t *y[2];
  size_t x_floats, n_max;
  int next;
};

static void emu_stager_destroy(wagma_backend_t *b, wg_stager_t *s) {
  (void)b;
  if (!s)
    return;
  for (int k = 0; k < 2; k++) {
    free(s->x[k]);
    free(s->y[k]);
  }
  free(s);
}

static wg_stager_t *emu_stager_create(wagma_backend_t *b, size_t x_floats, size_t n_max) {
  wg_stager_t *s = calloc(1, sizeof(*s));
  if (!s)
    return NULL;
  s->x_floats = x_floats;
  s->n_max = n_max;
  for (int k = 0; k < 2; k++) {
    s->x[k] = calloc(x_floats ? x_floats : 1, sizeof(float));
    s->y[k] = calloc(n_max ? n_max : 1, sizeof(int32_t));
    if (!s->x[k] || !s->y[k]) {
      emu_stager_destroy(b, s);
      return NULL;
    }
  }
  return s;
}

static int emu_stage(wagma_backend_t *b, wg_stager_t *s, const float *host_x, size_t x_floats,
                     const int32_t *host_y, size_t n, const float **x, const int32_t **y) {
  (void)b;
  if (x_floats > s->x_floats || n > s->n_max)
    return WAGMA_ERANGE;
  const int k = s->next;
  s->next = 1 - k;
  memcpy(s->x[k], host_x, x_floats * sizeof(float));
  memcpy(s->y[k], host_y, n * sizeof(int32_t));
  *x = s->x[k];
  *y = s->y[k];
  return WAGMA_OK;
}

/* cuda_gemm: row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T. */
static void emu_gemm(wagma_backend_t *b, int ta, int tb, size_t M, size_t N, size_t K, float alpha,
                     const float *A, size_t lda, const float *B, size_t ldb, float beta, float *C,
                     size_t ldc) {
  (void)b;
  if (M == 0 || N == 0)
    return;
  cblas_sgemm(CblasColMajor, tb ? CblasTrans : CblasNoTrans, ta ? CblasTrans : CblasNoTrans, (int)N,
              (int)M, (int)K, alpha, B, (int)ldb, A, (int)lda, beta, C, (int)ldc);
}

static void emu_bias_rows(wagma_backend_t *b, size_t n, size_t out, const float *bias, float *y) {
  (void)b;
  for (size_t i = 0; i < n * out; i++)
    y[i] = bias[i % out];
}

/* cuda_bias_grad: db[1][out] = ones[1][n] . dy[n][out]. */
static void emu_bias_grad(wagma_backend_t *b, size_t n, size_t out, const float *dy, float *db) {
  emu_ctx_t *c = b->ctx;
  if (c->ones_len < n) {
    free(c->ones);
    c->ones_len = n < 1024 ? 1024 : n;
    c->ones = malloc(c->ones_len * sizeof(float));
    for (size_t i = 0; i < c->ones_len; i++)
      c->ones[i] = 1.0f;
  }
  emu_gemm(b, 0, 0, 1, out, n, 1.0f, c->ones, n, dy, out, 0.0f, db, out);
}

/* wgk::channel_sum: block o, 256 threads each summing t = thread, thread + 256, ...; then the
 * shared-memory tree half = 128, 64, ..., 1. */
static void emu_channel_sum(size_t A, size_t O, size_t P, const float *dy, float *db) {
  enum { T = 256 };
  float part[T];
  const size_t total = A * P;
  for (size_t o = 0; o < O; o++) {
    for (size_t th = 0; th < T; th++) {
      float s = 0.0f;
      for (size_t t = th; t < total; t += T) {
        size_t a = t / P, p = t - a * P;
        s += dy[(a * O + o) * P + p];
      }
      part[th] = s;
    }
    for (size_t half = T / 2; half > 0; half /= 2)
      for (size_t th = 0; th < half; th++)
        part[th] += part[th + half];
    db[o] = part[0];
  }
}

static size_t emu_conv_cols_len(const wg_conv_shape_t *s, size_t n) {
  return wg_batch_conv_cols_len(s, n);
}

static size_t emu_conv_tmp_len(const wg_conv_shape_t *s, size_t n) {
  return wg_batch_conv_tmp_len(s, n);
}

static void emu_conv_forward(wagma_backend_t *b, const wg_conv_shape_t *s, size_t n, const float *x,
                             const float *w, const float *bias, float *y, float *cols, float *tmp) {
  const size_t ncols = n * s->oh * s->ow, ckk = s->c * s->k * s->k;
  for (size_t i = 0; i < ckk * ncols; i++)
    cols[i] = wg_im2col_at(s, n, x, i);
  emu_gemm(b, 0, 0, s->oc, ncols, ckk, 1.0f, w, ckk, cols, ncols, 0.0f, tmp, ncols);
  for (size_t i = 0; i < n * s->oc * s->oh * s->ow; i++) {
    size_t o;
    size_t at = wg_conv_t_index(s, n, i, &o);
    y[i] = tmp[at] + bias[o];
  }
}

static void emu_conv_backward(wagma_backend_t *b, const wg_conv_shape_t *s, size_t n,
                              const float *cols, const float *w, const float *dy, float *dw,
                              float *db, float *dx, float *tmp) {
  const size_t ohw = s->oh * s->ow, ncols = n * ohw, ckk = s->c * s->k * s->k;
  float *dyt = tmp, *dcols = tmp + s->oc * ncols;
  for (size_t i = 0; i < n * s->oc * ohw; i++) {
    size_t o;
    dyt[wg_conv_t_index(s, n, i, &o)] = dy[i];
  }
  emu_gemm(b, 0, 1, s->oc, ckk, ncols, 1.0f, dyt, ncols, cols, ncols, 0.0f, dw, ckk);
  emu_channel_sum(n, s->oc, ohw, dy, db);
  if (!dx)
    return;
  emu_gemm(b, 1, 0, ckk, ncols, s->oc, 1.0f, w, ckk, dyt, ncols, 0.0f, dcols, ncols);
  for (size_t i = 0; i < n * s->c * s->h * s->w; i++)
    dx[i] = wg_col2im_at(s, n, dcols, i);
}

static void emu_pool_forward(wagma_backend_t *b, const wg_pool_shape_t *s, int mode, size_t n,
                             const float *x, float *y, int32_t *argmax) {
  (void)b;
  for (size_t i = 0; i < n * s->c * s->oh * s->ow; i++)
    wg_pool_forward_at(s, mode, x, i, y, argmax);
}

static void emu_pool_backward(wagma_backend_t *b, const wg_pool_shape_t *s, int mode, size_t n,
                              const float *dy, const int32_t *argmax, float *dx) {
  (void)b;
  for (size_t i = 0; i < n * s->c * s->h * s->w; i++)
    dx[i] = wg_pool_backward_at(s, mode, dy, argmax, i);
}

static void emu_act_forward(wagma_backend_t *b, int fn, size_t len, const float *x, float *y) {
  (void)b;
  for (size_t i = 0; i < len; i++)
    y[i] = wg_act(fn, x[i]);
}

static void emu_act_backward(wagma_backend_t *b, int fn, size_t len, const float *y,
                             const float *dy, float *dx) {
  (void)b;
  for (size_t i = 0; i < len; i++)
    dx[i] = wg_act_grad(fn, y[i], dy[i]);
}

static int emu_softmax_xent(wagma_backend_t *b, size_t n, size_t classes, const float *logits,
                            const int32_t *y, float *dlogits, double *loss, size_t *correct) {
  (void)b;
  double *per = malloc((n ? n : 1) * sizeof(double));
  int32_t *hit = malloc((n ? n : 1) * sizeof(int32_t));
  if (!per || !hit) {
    free(per);
    free(hit);
    return WAGMA_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) { /* the kernel */
    size_t best = 0;
    per[i] = wg_xent_row(logits + i * classes, classes, y[i], (double)n,
                         dlogits ? dlogits + i * classes : NULL, &best);
    hit[i] = best == (size_t)y[i];
  }
  double total = 0.0; /* the host's sum */
  size_t hits = 0;
  for (size_t i = 0; i < n; i++) {
    total += per[i];
    hits += hit[i] != 0;
  }
  *loss = n ? total / (double)n : 0.0;
  if (correct)
    *correct = hits;
  free(per);
  free(hit);
  return WAGMA_OK;
}

static void emu_sgd(wagma_backend_t *b, size_t n, float *w, const float *g, float *v, float lr,
                    float mu, float wd, int nesterov) {
  (void)b;
  for (size_t i = 0; i < n; i++) {
    if (v)
      wg_sgd_momentum(&w[i], &v[i], g[i], lr, mu, wd, nesterov);
    else
      wg_sgd_plain(&w[i], g[i], lr, wd);
  }
}

static void emu_adam(wagma_backend_t *b, size_t n, float *w, const float *g, float *m, float *v,
                     const wg_adam_consts_t *k) {
  (void)b;
  for (size_t i = 0; i < n; i++)
    wg_adam(&w[i], &m[i], &v[i], g[i], k);
}

static const wg_backend_ops_t emu_ops = {
    .kind = "cuda-emu",
    .host_memory = 0,
    .close = emu_close,
    .status = emu_status,
    .alloc = emu_alloc,
    .free = emu_free,
    .upload = emu_memcpy,
    .download = emu_memcpy,
    .copy = emu_copy,
    .zero = emu_zero,
    .sync = emu_sync,
    .host_alloc = emu_host_alloc,
    .host_free = emu_free,
    .download_async = emu_memcpy,
    .download_wait = emu_sync,
    .stager_create = emu_stager_create,
    .stager_destroy = emu_stager_destroy,
    .stage = emu_stage,
    .gemm = emu_gemm,
    .bias_rows = emu_bias_rows,
    .bias_grad = emu_bias_grad,
    .conv_cols_len = emu_conv_cols_len,
    .conv_tmp_len = emu_conv_tmp_len,
    .conv_forward = emu_conv_forward,
    .conv_backward = emu_conv_backward,
    .pool_forward = emu_pool_forward,
    .pool_backward = emu_pool_backward,
    .act_forward = emu_act_forward,
    .act_backward = emu_act_backward,
    .softmax_xent = emu_softmax_xent,
    .sgd = emu_sgd,
    .adam = emu_adam,
};

wagma_backend_t *test_emu_backend_open(void) {
  wagma_backend_t *b = calloc(1, sizeof(*b));
  emu_ctx_t *c = calloc(1, sizeof(*c));
  if (!b || !c) {
    free(b);
    free(c);
    return NULL;
  }
  b->ops = &emu_ops;
  b->ctx = c;
  strcpy(b->name, "cuda-emu (the CUDA backend's algorithm on the host)");
  return b;
}
