/* agent/train/backend.h — the backend interface of wagma_train (internal to the library and
 * its tests): the table of operations the models and optimizers are written against once.
 *
 *   cpu   backend_cpu.c: OpenBLAS sgemm and the loops of layers.c; memory is host memory and
 *         every operation is done when it returns.
 *   cuda  backend_cuda.cu + kernels_cuda.cu (built when CMake finds CUDA): cuBLAS sgemm,
 *         im2col + GEMM convolution, its own kernels (grid-stride loops over elementwise.h);
 *         memory is device memory and operations are queued on the backend's compute stream.
 *
 * Ordering: every math operation is stream-ordered: it runs after the operations issued
 * before it on the same backend and may still be running when the call returns (cpu: never).
 * download(), softmax_xent() and sync() wait for the compute stream. Errors of queued work
 * are sticky: status() returns the first one (WAGMA_EIO, message in wagma_backend_error()),
 * and every later call that reports a status returns it too.
 *
 * Pointers passed to math operations are the backend's memory (alloc()), except where a
 * parameter is named host. Layouts are the CPU's (row-major, NCHW, see layers.h) for every
 * buffer the model shares between operations; scratch buffers (conv cols / tmp) have a
 * backend-specific layout and size (conv_cols_len / conv_tmp_len).
 *
 * Threads: a backend handle is used by one thread at a time, except download_async /
 * download_wait, which the same thread or one other thread may call between operations of
 * the training thread (see wagma_model_params_download_async in train.h). */
#ifndef WAGMA_AGENT_TRAIN_BACKEND_H
#define WAGMA_AGENT_TRAIN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "agent/train/elementwise.h"
#include "agent/train/layers.h"
#include "agent/train/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A batch stager: device buffers the next batches are uploaded into (backend-defined). */
typedef struct wg_stager wg_stager_t;

typedef struct wg_backend_ops {
  const char *kind; /* "cpu" or "cuda" */
  int host_memory;  /* 1: alloc() returns host memory the caller may read and write directly */

  void (*close)(wagma_backend_t *b);
  int (*status)(wagma_backend_t *b);

  /* ---- memory. alloc returns zeroed memory of `bytes` (NULL when out of memory). */
  void *(*alloc)(wagma_backend_t *b, size_t bytes);
  void (*free)(wagma_backend_t *b, void *p);
  /* host -> backend; src may be reused when it returns. */
  int (*upload)(wagma_backend_t *b, void *dst, const void *host_src, size_t bytes);
  /* backend -> host after all work issued so far; host_dst is complete when it returns. */
  int (*download)(wagma_backend_t *b, void *host_dst, const void *src, size_t bytes);
  void (*copy)(wagma_backend_t *b, void *dst, const void *src, size_t bytes);
  void (*zero)(wagma_backend_t *b, void *p, size_t bytes);
  int (*sync)(wagma_backend_t *b);
  /* Page-locked host memory (cuda: cudaMallocHost) for download_async; cpu: malloc. */
  void *(*host_alloc)(wagma_backend_t *b, size_t bytes);
  void (*host_free)(wagma_backend_t *b, void *p);
  /* Starts copying src (the state after all work issued so far on the compute stream) to
   * host_dst on the backend's transfer stream and returns; the compute stream is not blocked.
   * Later upload / copy / zero / sgd / adam calls (the operations that write parameters or
   * optimizer state) wait for the copy on the device before they write; any other write to
   * src must come after download_wait(). One download in flight at a time (WAGMA_EBUSY). cpu:
   * copies at once. */
  int (*download_async)(wagma_backend_t *b, void *host_dst, const void *src, size_t bytes);
  /* Waits for the download_async in flight (none: returns at once). */
  int (*download_wait)(wagma_backend_t *b);

  /* ---- batches. A stager holds room for batches of up to x_floats inputs and n_max labels;
   * stage() copies a host batch in and returns where it lies in backend memory. cuda: two
   * pinned host slots and two device slots used in turn, the copy on the transfer stream, so
   * the upload of batch t+1 overlaps the compute of batch t; the slot returned stays valid
   * until the second stage() after this one. */
  wg_stager_t *(*stager_create)(wagma_backend_t *b, size_t x_floats, size_t n_max);
  void (*stager_destroy)(wagma_backend_t *b, wg_stager_t *s);
  int (*stage)(wagma_backend_t *b, wg_stager_t *s, const float *host_x, size_t x_floats,
               const int32_t *host_y, size_t n, const float **x, const int32_t **y);

  /* ---- math. Row-major GEMM: C[M][N] = alpha op(A)[M][K] . op(B)[K][N] + beta C, op = transpose
   * when ta / tb; lda, ldb, ldc are the row strides of A, B, C as stored. */
  void (*gemm)(wagma_backend_t *b, int ta, int tb, size_t M, size_t N, size_t K, float alpha,
               const float *A, size_t lda, const float *B, size_t ldb, float beta, float *C,
               size_t ldc);
  /* y[i][o] = bias[o] for i < n, o < out (dense forward adds the GEMM with beta 1). */
  void (*bias_rows)(wagma_backend_t *b, size_t n, size_t out, const float *bias, float *y);
  /* db[o] = sum over i < n of dy[i][o]. */
  void (*bias_grad)(wagma_backend_t *b, size_t n, size_t out, const float *dy, float *db);
  /* Convolution (stride 1, zero padding) as in layers.h; cols / tmp are this backend's
   * scratch, conv_cols_len / conv_tmp_len floats for a batch of n. cols is kept from forward
   * to backward. */
  size_t (*conv_cols_len)(const wg_conv_shape_t *s, size_t n);
  size_t (*conv_tmp_len)(const wg_conv_shape_t *s, size_t n);
  void (*conv_forward)(wagma_backend_t *b, const wg_conv_shape_t *s, size_t n, const float *x,
                       const float *w, const float *bias, float *y, float *cols, float *tmp);
  void (*conv_backward)(wagma_backend_t *b, const wg_conv_shape_t *s, size_t n, const float *cols,
                        const float *w, const float *dy, float *dw, float *db, float *dx,
                        float *tmp);
  void (*pool_forward)(wagma_backend_t *b, const wg_pool_shape_t *s, int mode, size_t n,
                       const float *x, float *y, int32_t *argmax);
  void (*pool_backward)(wagma_backend_t *b, const wg_pool_shape_t *s, int mode, size_t n,
                        const float *dy, const int32_t *argmax, float *dx);
  void (*act_forward)(wagma_backend_t *b, int fn, size_t len, const float *x, float *y);
  void (*act_backward)(wagma_backend_t *b, int fn, size_t len, const float *y, const float *dy,
                       float *dx);
  /* Mean softmax cross-entropy of logits[n][classes] against labels y (backend memory) into
   * *loss (double), the count of correct arg-max predictions into *correct (may be NULL),
   * and, when dlogits is not NULL, d mean loss / d logits. Waits for the result. */
  int (*softmax_xent)(wagma_backend_t *b, size_t n, size_t classes, const float *logits,
                      const int32_t *y, float *dlogits, double *loss, size_t *correct);
  /* Optimizer updates over n parameters (elementwise.h): SGD with velocity v, or without
   * (v NULL: plain SGD with weight decay); Adam / AdamW with moments m, v. */
  void (*sgd)(wagma_backend_t *b, size_t n, float *w, const float *g, float *v, float lr, float mu,
              float wd, int nesterov);
  void (*adam)(wagma_backend_t *b, size_t n, float *w, const float *g, float *m, float *v,
               const wg_adam_consts_t *k);
} wg_backend_ops_t;

struct wagma_backend {
  const wg_backend_ops_t *ops;
  void *ctx;      /* backend-private state */
  char name[160]; /* e.g. "cpu", "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)" */
  char err[256];  /* detail of the first sticky error */
};

/* Dense layer on any backend: y[n][out] = x[n][in] . w[out][in]^T + bias[out] (bias_rows, then
 * gemm with beta 1); backward writes dw = dy^T . x, db = column sums of dy and, when dx is not
 * NULL, dx = dy . w (gemm, bias_grad, gemm). */
void wg_dense_forward(wagma_backend_t *b, size_t n, size_t in, size_t out, const float *x,
                      const float *w, const float *bias, float *y);
void wg_dense_backward(wagma_backend_t *b, size_t n, size_t in, size_t out, const float *x,
                       const float *w, const float *dy, float *dw, float *db, float *dx);

/* The CPU backend's table (backend_cpu.c). */
extern const wg_backend_ops_t wg_cpu_ops;

#ifdef WAGMA_TRAIN_CUDA
/* backend_cuda.cu. probe: 0 when device `ordinal` can be used, else WAGMA_EUNAVAIL with the
 * cause in err (no driver, no device, ordinal out of range, driver/runtime mismatch). */
int wg_cuda_probe(int ordinal, char *err, size_t err_len);
int wg_cuda_open(int ordinal, wagma_backend_t **out, char *err, size_t err_len);
#endif

#ifdef __cplusplus
}
#endif
#endif
