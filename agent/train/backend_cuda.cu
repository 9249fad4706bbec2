/* backend_cuda.cu — the CUDA backend of wagma_train: device memory, a compute stream and a
 * transfer stream, cuBLAS GEMMs (strict FP32, no TF32), im2col + GEMM convolution and the
 * kernels of kernels_cuda.cu, behind the operation table of backend.h.
 *
 * tests/unit/train/emu_backend.c runs this file's algorithm (the same GEMM argument mapping,
 * scratch layouts, per-element bodies and reduction order) on the host, so that the unit tests
 * check it against the CPU backend on every machine: keep the two in step.
 *
 * Owns (per backend): the CUDA device it was opened on (cudaSetDevice on every entry), two
 * non-blocking streams, a cuBLAS handle bound to the compute stream, a vector of ones (bias
 * gradients as a GEMM), the softmax scratch (device + page-locked host), and the event of the
 * snapshot copy. Per stager: two device and two page-locked host slots with their events.
 * Threads: none of its own; the caller's one thread at a time (download_wait may be called
 * from a second thread: it only waits on an event).
 *
 * Invariants:
 *  - every math operation is queued on the compute stream; only download / softmax_xent /
 *    sync / stage (for its page-locked slot) block the host;
 *  - the transfer stream carries batch uploads and the snapshot download; a batch upload into
 *    device slot s waits (on the device) for the compute work that last read slot s, a
 *    snapshot download waits for the compute work queued before it, and the operations that
 *    write parameters or optimizer state (upload, copy, zero, sgd, adam) wait for the snapshot
 *    download on the compute stream, so the snapshot is consistent and nothing blocks the host;
 *  - the first CUDA or cuBLAS error is kept (sticky): status() and every blocking call return
 *    WAGMA_EIO from then on, with the message in b->err. */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "agent/train/cuda_internal.h"
#include "agent/train/kernel_index.h"
extern "C" {
#include "agent/train/internal.h"
}

namespace {

struct cuda_ctx {
  int device;
  unsigned blocks; /* grid cap of the grid-stride kernels: 32 x SMs */
  cudaStream_t compute, transfer;
  cublasHandle_t blas;
  cudaEvent_t snap_ready, snap_done;
  int failed; /* 0 or the first error's WAGMA code */
  float *ones;
  size_t ones_len;
  double *d_loss, *h_loss;
  int32_t *d_hit, *h_hit;
  size_t xent_cap;
};

cuda_ctx *ctx_of(wagma_backend_t *b) {
  return static_cast<cuda_ctx *>(b->ctx);
}

/* Records the first error; returns WAGMA_EIO when e is an error, else 0. */
int check(wagma_backend_t *b, cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return WAGMA_OK;
  cuda_ctx *c = ctx_of(b);
  if (!c->failed) {
    c->failed = WAGMA_EIO;
    snprintf(b->err, sizeof(b->err), "%s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
  }
  return WAGMA_EIO;
}

int check_blas(wagma_backend_t *b, cublasStatus_t e, const char *what) {
  if (e == CUBLAS_STATUS_SUCCESS)
    return WAGMA_OK;
  cuda_ctx *c = ctx_of(b);
  if (!c->failed) {
    c->failed = WAGMA_EIO;
    snprintf(b->err, sizeof(b->err), "%s: cuBLAS status %d", what, (int)e);
  }
  return WAGMA_EIO;
}

/* After a kernel launch: launch errors (bad configuration, no kernel image for this GPU). */
void launched(wagma_backend_t *b, const char *what) {
  check(b, cudaGetLastError(), what);
}

cuda_ctx *enter(wagma_backend_t *b) {
  cuda_ctx *c = ctx_of(b);
  cudaSetDevice(c->device);
  return c;
}

/* The compute stream waits for the snapshot download in flight, if any (a no-op otherwise):
 * called before every operation that writes parameters or optimizer state. */
void after_snapshot(wagma_backend_t *b, cuda_ctx *c) {
  check(b, cudaStreamWaitEvent(c->compute, c->snap_done, 0), "cudaStreamWaitEvent(snapshot)");
}

/* ------------------------------------------------------------------ lifetime */

void cuda_close(wagma_backend_t *b) {
  cuda_ctx *c = enter(b);
  cudaStreamSynchronize(c->compute);
  cudaStreamSynchronize(c->transfer);
  cudaFree(c->ones);
  cudaFree(c->d_loss);
  cudaFree(c->d_hit);
  cudaFreeHost(c->h_loss);
  cudaFreeHost(c->h_hit);
  if (c->blas)
    cublasDestroy(c->blas);
  cudaEventDestroy(c->snap_ready);
  cudaEventDestroy(c->snap_done);
  cudaStreamDestroy(c->compute);
  cudaStreamDestroy(c->transfer);
  free(c);
  free(b);
}

int cuda_status(wagma_backend_t *b) {
  return ctx_of(b)->failed;
}

int cuda_sync(wagma_backend_t *b) {
  cuda_ctx *c = enter(b);
  check(b, cudaStreamSynchronize(c->compute), "cudaStreamSynchronize(compute)");
  return c->failed;
}

/* ------------------------------------------------------------------ memory */

void *cuda_alloc(wagma_backend_t *b, size_t bytes) {
  cuda_ctx *c = enter(b);
  void *p = nullptr;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError(); /* out of memory is reported as NULL, not as a sticky error */
    return nullptr;
  }
  check(b, cudaMemsetAsync(p, 0, bytes, c->compute), "cudaMemsetAsync");
  return p;
}

void cuda_free(wagma_backend_t *b, void *p) {
  if (!p)
    return;
  enter(b);
  cudaFree(p); /* synchronizes the device */
}

int cuda_upload(wagma_backend_t *b, void *dst, const void *src, size_t bytes) {
  cuda_ctx *c = enter(b);
  after_snapshot(b, c);
  check(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->compute), "upload");
  check(b, cudaStreamSynchronize(c->compute), "upload: cudaStreamSynchronize");
  return c->failed;
}

int cuda_download(wagma_backend_t *b, void *dst, const void *src, size_t bytes) {
  cuda_ctx *c = enter(b);
  check(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->compute), "download");
  check(b, cudaStreamSynchronize(c->compute), "download: cudaStreamSynchronize");
  return c->failed;
}

void cuda_copy(wagma_backend_t *b, void *dst, const void *src, size_t bytes) {
  cuda_ctx *c = enter(b);
  after_snapshot(b, c);
  check(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->compute), "copy");
}

void cuda_zero(wagma_backend_t *b, void *p, size_t bytes) {
  cuda_ctx *c = enter(b);
  after_snapshot(b, c);
  check(b, cudaMemsetAsync(p, 0, bytes, c->compute), "zero");
}

void *cuda_host_alloc(wagma_backend_t *b, size_t bytes) {
  enter(b);
  void *p = nullptr;
  if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void cuda_host_free(wagma_backend_t *b, void *p) {
  enter(b);
  cudaFreeHost(p);
}

int cuda_download_async(wagma_backend_t *b, void *dst, const void *src, size_t bytes) {
  cuda_ctx *c = enter(b);
  cudaError_t q = cudaEventQuery(c->snap_done);
  if (q == cudaErrorNotReady)
    return WAGMA_EBUSY;
  if (check(b, q, "snapshot: cudaEventQuery"))
    return WAGMA_EIO;
  check(b, cudaEventRecord(c->snap_ready, c->compute), "snapshot: cudaEventRecord");
  check(b, cudaStreamWaitEvent(c->transfer, c->snap_ready, 0), "snapshot: cudaStreamWaitEvent");
  check(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->transfer),
        "snapshot: cudaMemcpyAsync");
  check(b, cudaEventRecord(c->snap_done, c->transfer), "snapshot: cudaEventRecord");
  return c->failed;
}

int cuda_download_wait(wagma_backend_t *b) {
  cuda_ctx *c = ctx_of(b); /* no sticky-error bookkeeping: may run on a second thread */
  cudaSetDevice(c->device);
  return cudaEventSynchronize(c->snap_done) == cudaSuccess ? WAGMA_OK : WAGMA_EIO;
}

/* ------------------------------------------------------------------ batches */

} // namespace

struct wg_stager {
  float *dx[2], *hx[2];
  int32_t *dy[2], *hy[2];
  cudaEvent_t h2d_done[2]; /* the upload from host slot s is done */
  cudaEvent_t free_at[2];  /* compute work that last read device slot s */
  size_t x_floats, n_max;
  int next;
};

namespace {

void cuda_stager_destroy(wagma_backend_t *b, wg_stager_t *s) {
  if (!s)
    return;
  cuda_ctx *c = enter(b);
  cudaStreamSynchronize(c->transfer);
  for (int k = 0; k < 2; k++) {
    cudaFree(s->dx[k]);
    cudaFree(s->dy[k]);
    cudaFreeHost(s->hx[k]);
    cudaFreeHost(s->hy[k]);
    if (s->h2d_done[k])
      cudaEventDestroy(s->h2d_done[k]);
    if (s->free_at[k])
      cudaEventDestroy(s->free_at[k]);
  }
  free(s);
}

wg_stager_t *cuda_stager_create(wagma_backend_t *b, size_t x_floats, size_t n_max) {
  enter(b);
  wg_stager_t *s = static_cast<wg_stager_t *>(calloc(1, sizeof(wg_stager_t)));
  if (!s)
    return nullptr;
  s->x_floats = x_floats;
  s->n_max = n_max;
  bool ok = true;
  for (int k = 0; k < 2 && ok; k++)
    ok = cudaMalloc(&s->dx[k], (x_floats ? x_floats : 1) * sizeof(float)) == cudaSuccess &&
         cudaMalloc(&s->dy[k], (n_max ? n_max : 1) * sizeof(int32_t)) == cudaSuccess &&
         cudaMallocHost(&s->hx[k], (x_floats ? x_floats : 1) * sizeof(float)) == cudaSuccess &&
         cudaMallocHost(&s->hy[k], (n_max ? n_max : 1) * sizeof(int32_t)) == cudaSuccess &&
         cudaEventCreateWithFlags(&s->h2d_done[k], cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&s->free_at[k], cudaEventDisableTiming) == cudaSuccess;
  if (!ok) {
    cudaGetLastError();
    cuda_stager_destroy(b, s);
    return nullptr;
  }
  return s;
}

/* Batch t goes to slot s = t mod 2. Device slot s was last read by batch t-2's work, all of
 * it queued before batch t-1's stage(), which recorded free_at[s]: the upload waits for that
 * and so overlaps batch t-1's compute. Host slot s was last uploaded by batch t-2's stage(). */
int cuda_stage(wagma_backend_t *b, wg_stager_t *s, const float *host_x, size_t x_floats,
               const int32_t *host_y, size_t n, const float **x, const int32_t **y) {
  cuda_ctx *c = enter(b);
  if (x_floats > s->x_floats || n > s->n_max)
    return WAGMA_ERANGE;
  if (c->failed)
    return c->failed;
  const int k = s->next;
  s->next = 1 - k;
  check(b, cudaEventRecord(s->free_at[1 - k], c->compute), "stage: cudaEventRecord");
  check(b, cudaEventSynchronize(s->h2d_done[k]), "stage: cudaEventSynchronize");
  memcpy(s->hx[k], host_x, x_floats * sizeof(float));
  memcpy(s->hy[k], host_y, n * sizeof(int32_t));
  check(b, cudaStreamWaitEvent(c->transfer, s->free_at[k], 0), "stage: cudaStreamWaitEvent");
  check(b,
        cudaMemcpyAsync(s->dx[k], s->hx[k], x_floats * sizeof(float), cudaMemcpyHostToDevice,
                        c->transfer),
        "stage: cudaMemcpyAsync");
  check(
      b,
      cudaMemcpyAsync(s->dy[k], s->hy[k], n * sizeof(int32_t), cudaMemcpyHostToDevice, c->transfer),
      "stage: cudaMemcpyAsync");
  check(b, cudaEventRecord(s->h2d_done[k], c->transfer), "stage: cudaEventRecord");
  check(b, cudaStreamWaitEvent(c->compute, s->h2d_done[k], 0), "stage: cudaStreamWaitEvent");
  *x = s->dx[k];
  *y = s->dy[k];
  return c->failed;
}

/* ------------------------------------------------------------------ math */

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands. */
void cuda_gemm(wagma_backend_t *b, int ta, int tb, size_t M, size_t N, size_t K, float alpha,
               const float *A, size_t lda, const float *B, size_t ldb, float beta, float *C,
               size_t ldc) {
  cuda_ctx *c = enter(b);
  if (M == 0 || N == 0)
    return;
  check_blas(b,
             cublasSgemm(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                         (int)N, (int)M, (int)K, &alpha, B, (int)ldb, A, (int)lda, &beta, C,
                         (int)ldc),
             "cublasSgemm");
}

void cuda_bias_rows(wagma_backend_t *b, size_t n, size_t out, const float *bias, float *y) {
  cuda_ctx *c = enter(b);
  wgk::bias_rows(c->compute, c->blocks, n, out, bias, y);
  launched(b, "bias_rows kernel");
}

/* A vector of at least n ones in device memory (grown on demand), or NULL (error recorded). */
const float *ones(wagma_backend_t *b, cuda_ctx *c, size_t n) {
  if (c->ones_len >= n)
    return c->ones;
  size_t len = n < 1024 ? 1024 : n;
  float *p = nullptr;
  if (check(b, cudaMalloc(&p, len * sizeof(float)), "cudaMalloc(ones)"))
    return nullptr;
  cudaFree(c->ones);
  c->ones = p;
  c->ones_len = len;
  wgk::fill(c->compute, c->blocks, len, 1.0f, p);
  launched(b, "fill kernel");
  return p;
}

/* db[1][out] = ones[1][n] . dy[n][out]: a GEMM with M = 1. */
void cuda_bias_grad(wagma_backend_t *b, size_t n, size_t out, const float *dy, float *db) {
  cuda_ctx *c = enter(b);
  const float *one = ones(b, c, n);
  if (one)
    cuda_gemm(b, 0, 0, 1, out, n, 1.0f, one, n, dy, out, 0.0f, db, out);
}

size_t cuda_conv_cols_len(const wg_conv_shape_t *s, size_t n) {
  return wg_batch_conv_cols_len(s, n);
}

size_t cuda_conv_tmp_len(const wg_conv_shape_t *s, size_t n) {
  return wg_batch_conv_tmp_len(s, n);
}

/* cols[ckk][n*ohw] = im2col(x); tmp[oc][n*ohw] = w[oc][ckk] . cols; y = reorder(tmp) + bias. */
void cuda_conv_forward(wagma_backend_t *b, const wg_conv_shape_t *s, size_t n, const float *x,
                       const float *w, const float *bias, float *y, float *cols, float *tmp) {
  cuda_ctx *c = enter(b);
  const size_t ncols = n * s->oh * s->ow, ckk = s->c * s->k * s->k;
  wgk::im2col(c->compute, c->blocks, s, n, x, cols);
  launched(b, "im2col kernel");
  cuda_gemm(b, 0, 0, s->oc, ncols, ckk, 1.0f, w, ckk, cols, ncols, 0.0f, tmp, ncols);
  wgk::conv_unfold_out(c->compute, c->blocks, s, n, tmp, bias, y);
  launched(b, "conv_unfold_out kernel");
}

/* dyT[oc][n*ohw] = reorder(dy); dw = dyT . cols^T; db = sums of dy; dcols = w^T . dyT; dx =
 * col2im(dcols). dyT and dcols are the two parts of tmp. */
void cuda_conv_backward(wagma_backend_t *b, const wg_conv_shape_t *s, size_t n, const float *cols,
                        const float *w, const float *dy, float *dw, float *db, float *dx,
                        float *tmp) {
  cuda_ctx *c = enter(b);
  const size_t ohw = s->oh * s->ow, ncols = n * ohw, ckk = s->c * s->k * s->k;
  float *dyt = tmp, *dcols = tmp + s->oc * ncols;
  wgk::conv_fold_dy(c->compute, c->blocks, s, n, dy, dyt);
  launched(b, "conv_fold_dy kernel");
  cuda_gemm(b, 0, 1, s->oc, ckk, ncols, 1.0f, dyt, ncols, cols, ncols, 0.0f, dw, ckk);
  wgk::channel_sum(c->compute, n, s->oc, ohw, dy, db);
  launched(b, "channel_sum kernel");
  if (!dx)
    return;
  cuda_gemm(b, 1, 0, ckk, ncols, s->oc, 1.0f, w, ckk, dyt, ncols, 0.0f, dcols, ncols);
  wgk::col2im(c->compute, c->blocks, s, n, dcols, dx);
  launched(b, "col2im kernel");
}

void cuda_pool_forward(wagma_backend_t *b, const wg_pool_shape_t *s, int mode, size_t n,
                       const float *x, float *y, int32_t *argmax) {
  cuda_ctx *c = enter(b);
  wgk::pool_forward(c->compute, c->blocks, s, mode, n, x, y, argmax);
  launched(b, "pool_forward kernel");
}

void cuda_pool_backward(wagma_backend_t *b, const wg_pool_shape_t *s, int mode, size_t n,
                        const float *dy, const int32_t *argmax, float *dx) {
  cuda_ctx *c = enter(b);
  wgk::pool_backward(c->compute, c->blocks, s, mode, n, dy, argmax, dx);
  launched(b, "pool_backward kernel");
}

void cuda_act_forward(wagma_backend_t *b, int fn, size_t len, const float *x, float *y) {
  cuda_ctx *c = enter(b);
  wgk::act_forward(c->compute, c->blocks, fn, len, x, y);
  launched(b, "act_forward kernel");
}

void cuda_act_backward(wagma_backend_t *b, int fn, size_t len, const float *y, const float *dy,
                       float *dx) {
  cuda_ctx *c = enter(b);
  wgk::act_backward(c->compute, c->blocks, fn, len, y, dy, dx);
  launched(b, "act_backward kernel");
}

/* Per-sample losses and hits on the device, summed on the host in sample order (the CPU's
 * order: the mean is the CPU's whenever the per-sample losses are). */
int cuda_softmax_xent(wagma_backend_t *b, size_t n, size_t classes, const float *logits,
                      const int32_t *y, float *dlogits, double *loss, size_t *correct) {
  cuda_ctx *c = enter(b);
  if (c->failed)
    return c->failed;
  if (n > c->xent_cap) {
    cudaFree(c->d_loss);
    cudaFree(c->d_hit);
    cudaFreeHost(c->h_loss);
    cudaFreeHost(c->h_hit);
    c->d_loss = c->h_loss = nullptr;
    c->d_hit = c->h_hit = nullptr;
    c->xent_cap = 0;
    if (check(b, cudaMalloc(&c->d_loss, n * sizeof(double)), "cudaMalloc(xent)") ||
        check(b, cudaMalloc(&c->d_hit, n * sizeof(int32_t)), "cudaMalloc(xent)") ||
        check(b, cudaMallocHost(&c->h_loss, n * sizeof(double)), "cudaMallocHost(xent)") ||
        check(b, cudaMallocHost(&c->h_hit, n * sizeof(int32_t)), "cudaMallocHost(xent)"))
      return c->failed;
    c->xent_cap = n;
  }
  wgk::softmax_xent(c->compute, c->blocks, n, classes, logits, y, dlogits, c->d_loss, c->d_hit);
  launched(b, "softmax_xent kernel");
  check(
      b,
      cudaMemcpyAsync(c->h_loss, c->d_loss, n * sizeof(double), cudaMemcpyDeviceToHost, c->compute),
      "xent: cudaMemcpyAsync");
  check(
      b,
      cudaMemcpyAsync(c->h_hit, c->d_hit, n * sizeof(int32_t), cudaMemcpyDeviceToHost, c->compute),
      "xent: cudaMemcpyAsync");
  check(b, cudaStreamSynchronize(c->compute), "xent: cudaStreamSynchronize");
  if (c->failed)
    return c->failed;
  double total = 0.0;
  size_t hits = 0;
  for (size_t i = 0; i < n; i++) {
    total += c->h_loss[i];
    hits += c->h_hit[i] != 0;
  }
  *loss = n ? total / (double)n : 0.0;
  if (correct)
    *correct = hits;
  return WAGMA_OK;
}

void cuda_sgd(wagma_backend_t *b, size_t n, float *w, const float *g, float *v, float lr, float mu,
              float wd, int nesterov) {
  cuda_ctx *c = enter(b);
  after_snapshot(b, c);
  wgk::sgd(c->compute, c->blocks, n, w, g, v, lr, mu, wd, nesterov);
  launched(b, "sgd kernel");
}

void cuda_adam(wagma_backend_t *b, size_t n, float *w, const float *g, float *m, float *v,
               const wg_adam_consts_t *k) {
  cuda_ctx *c = enter(b);
  after_snapshot(b, c);
  wgk::adam(c->compute, c->blocks, n, w, g, m, v, *k);
  launched(b, "adam kernel");
}

const wg_backend_ops_t cuda_ops = {
    /* kind */ "cuda",
    /* host_memory */ 0, cuda_close,         cuda_status,        cuda_alloc,
    cuda_free,           cuda_upload,        cuda_download,      cuda_copy,
    cuda_zero,           cuda_sync,          cuda_host_alloc,    cuda_host_free,
    cuda_download_async, cuda_download_wait, cuda_stager_create, cuda_stager_destroy,
    cuda_stage,          cuda_gemm,          cuda_bias_rows,     cuda_bias_grad,
    cuda_conv_cols_len,  cuda_conv_tmp_len,  cuda_conv_forward,  cuda_conv_backward,
    cuda_pool_forward,   cuda_pool_backward, cuda_act_forward,   cuda_act_backward,
    cuda_softmax_xent,   cuda_sgd,           cuda_adam,
};

} // namespace

/* ------------------------------------------------------------------ probe and open */

extern "C" int wg_cuda_probe(int ordinal, char *err, size_t err_len) {
  int driver = 0, runtime = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    cudaGetLastError();
    wg_errf(err, err_len,
            "no NVIDIA driver: libcuda.so.1 is not installed or not loadable (this build's CUDA "
            "runtime is %d.%d)",
            runtime / 1000, runtime % 1000 / 10);
    return WAGMA_EUNAVAIL;
  }
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    wg_errf(
        err, err_len, "no usable CUDA GPU: %s (%s; driver supports CUDA %d.%d, runtime %d.%d%s%s)",
        cudaGetErrorString(e), cudaGetErrorName(e), driver / 1000, driver % 1000 / 10,
        runtime / 1000, runtime % 1000 / 10, vis ? ", CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "");
    return WAGMA_EUNAVAIL;
  }
  if (count == 0) {
    wg_errf(err, err_len, "no CUDA GPU visible to this process");
    return WAGMA_EUNAVAIL;
  }
  if (ordinal >= count) {
    wg_errf(err, err_len, "cuda:%d: this machine has %d CUDA GPU%s (cuda:0..cuda:%d)", ordinal,
            count, count == 1 ? "" : "s", count - 1);
    return WAGMA_EUNAVAIL;
  }
  return WAGMA_OK;
}

extern "C" int wg_cuda_open(int ordinal, wagma_backend_t **out, char *err, size_t err_len) {
  *out = nullptr;
  int rc = wg_cuda_probe(ordinal, err, err_len);
  if (rc)
    return rc;
  wagma_backend_t *b = static_cast<wagma_backend_t *>(calloc(1, sizeof(wagma_backend_t)));
  cuda_ctx *c = static_cast<cuda_ctx *>(calloc(1, sizeof(cuda_ctx)));
  if (!b || !c) {
    free(b);
    free(c);
    wg_errf(err, err_len, "out of memory");
    return WAGMA_ENOMEM;
  }
  b->ops = &cuda_ops;
  b->ctx = c;
  c->device = ordinal;
  cudaDeviceProp prop;
  cudaError_t e = cudaSetDevice(ordinal);
  if (e == cudaSuccess)
    e = cudaGetDeviceProperties(&prop, ordinal);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&c->transfer, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&c->snap_ready, cudaEventDisableTiming);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&c->snap_done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cudaGetLastError();
    wg_errf(err, err_len, "cuda:%d: cannot set up the device: %s", ordinal, cudaGetErrorString(e));
    free(c);
    free(b);
    return WAGMA_EIO;
  }
  cublasStatus_t be = cublasCreate(&c->blas);
  if (be == CUBLAS_STATUS_SUCCESS)
    be = cublasSetStream(c->blas, c->compute);
  if (be == CUBLAS_STATUS_SUCCESS) /* strict FP32: no TF32 tensor-core rounding */
    be = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
  if (be != CUBLAS_STATUS_SUCCESS) {
    wg_errf(err, err_len, "cuda:%d: cuBLAS initialisation failed (status %d)", ordinal, (int)be);
    cuda_close(b);
    return WAGMA_EIO;
  }
  c->blocks = 32u * (unsigned)(prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1);
  snprintf(b->name, sizeof(b->name), "cuda:%d %.96s (sm_%d%d, %.0f GiB)", ordinal, prop.name,
           prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  *out = b;
  return WAGMA_OK;
}
