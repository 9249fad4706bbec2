/* kernels_cuda.cu — the CUDA backend's own kernels: fills, bias broadcast and reduction,
 * im2col / col2im and the reorderings around the convolution GEMMs, pooling, and grid-stride
 * loops over the element-wise functions of elementwise.h (activations, softmax cross-entropy,
 * SGD, Adam) and the per-element layout bodies of kernel_index.h (checked on the host by the
 * unit tests' emulation of this backend). GEMMs are cuBLAS's (backend_cuda.cu).
 *
 * Owns nothing; no host state. Invariants: no atomics anywhere, every output element is
 * written by exactly one thread (gathers, not scatters) and every reduction has a fixed
 * order, so a run is deterministic on a given GPU; pooling compares and sums in the CPU's
 * order, so its values and arg-max are the CPU's exactly. */
#include "agent/train/cuda_internal.h"
#include "agent/train/kernel_index.h"

namespace wgk {
namespace {

#define GRID_STRIDE(i, n)                                                                          \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
       i += (size_t)gridDim.x * blockDim.x)

constexpr unsigned kThreads = 256;

__global__ void fill_k(size_t n, float value, float *p) {
  GRID_STRIDE(i, n) p[i] = value;
}

__global__ void bias_rows_k(size_t n, size_t out, const float *bias, float *y) {
  GRID_STRIDE(i, n * out) y[i] = bias[i % out];
}

/* One block per channel o; each thread sums a strided share in a fixed order, then a fixed
 * shared-memory tree. */
__global__ void channel_sum_k(size_t A, size_t O, size_t P, const float *dy, float *db) {
  __shared__ float part[kThreads];
  const size_t o = blockIdx.x, total = A * P;
  float s = 0.0f;
  for (size_t t = threadIdx.x; t < total; t += blockDim.x) {
    size_t a = t / P, p = t - a * P;
    s += dy[(a * O + o) * P + p];
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    db[o] = part[0];
}

/* The layout kernels: grid-stride loops over kernel_index.h (shapes passed by value). */
__global__ void im2col_k(wg_conv_shape_t s, size_t n, const float *x, float *cols) {
  GRID_STRIDE(i, s.c * s.k * s.k * n * s.oh * s.ow) cols[i] = wg_im2col_at(&s, n, x, i);
}

__global__ void col2im_k(wg_conv_shape_t s, size_t n, const float *dcols, float *dx) {
  GRID_STRIDE(i, n * s.c * s.h * s.w) dx[i] = wg_col2im_at(&s, n, dcols, i);
}

__global__ void conv_unfold_out_k(wg_conv_shape_t s, size_t n, const float *t, const float *bias,
                                  float *y) {
  GRID_STRIDE(i, n * s.oc * s.oh * s.ow) {
    size_t o;
    size_t at = wg_conv_t_index(&s, n, i, &o);
    y[i] = t[at] + bias[o];
  }
}

__global__ void conv_fold_dy_k(wg_conv_shape_t s, size_t n, const float *dy, float *t) {
  GRID_STRIDE(i, n * s.oc * s.oh * s.ow) {
    size_t o;
    t[wg_conv_t_index(&s, n, i, &o)] = dy[i];
  }
}

__global__ void pool_forward_k(wg_pool_shape_t s, int mode, size_t n, const float *x, float *y,
                               int32_t *argmax) {
  GRID_STRIDE(i, n * s.c * s.oh * s.ow) wg_pool_forward_at(&s, mode, x, i, y, argmax);
}

__global__ void pool_backward_k(wg_pool_shape_t s, int mode, size_t n, const float *dy,
                                const int32_t *argmax, float *dx) {
  GRID_STRIDE(i, n * s.c * s.h * s.w) dx[i] = wg_pool_backward_at(&s, mode, dy, argmax, i);
}

__global__ void act_forward_k(int fn, size_t len, const float *x, float *y) {
  GRID_STRIDE(i, len) y[i] = wg_act(fn, x[i]);
}

__global__ void act_backward_k(int fn, size_t len, const float *y, const float *dy, float *dx) {
  GRID_STRIDE(i, len) dx[i] = wg_act_grad(fn, y[i], dy[i]);
}

__global__ void softmax_xent_k(size_t n, size_t classes, const float *logits, const int32_t *y,
                               float *dlogits, double *loss, int32_t *hit) {
  GRID_STRIDE(i, n) {
    size_t best = 0;
    loss[i] = wg_xent_row(logits + i * classes, classes, y[i], (double)n,
                          dlogits ? dlogits + i * classes : nullptr, &best);
    hit[i] = best == (size_t)y[i];
  }
}

__global__ void sgd_momentum_k(size_t n, float *w, const float *g, float *v, float lr, float mu,
                               float wd, int nesterov) {
  GRID_STRIDE(i, n) wg_sgd_momentum(&w[i], &v[i], g[i], lr, mu, wd, nesterov);
}

__global__ void sgd_plain_k(size_t n, float *w, const float *g, float lr, float wd) {
  GRID_STRIDE(i, n) wg_sgd_plain(&w[i], g[i], lr, wd);
}

__global__ void adam_k(size_t n, float *w, const float *g, float *m, float *v, wg_adam_consts_t k) {
  GRID_STRIDE(i, n) wg_adam(&w[i], &m[i], &v[i], g[i], &k);
}

} // namespace

void fill(cudaStream_t st, unsigned blocks, size_t n, float value, float *p) {
  fill_k<<<grid_for(n, blocks), kThreads, 0, st>>>(n, value, p);
}

void bias_rows(cudaStream_t st, unsigned blocks, size_t n, size_t out, const float *bias,
               float *y) {
  bias_rows_k<<<grid_for(n * out, blocks), kThreads, 0, st>>>(n, out, bias, y);
}

void channel_sum(cudaStream_t st, size_t A, size_t O, size_t P, const float *dy, float *db) {
  channel_sum_k<<<(unsigned)O, kThreads, 0, st>>>(A, O, P, dy, db);
}

void im2col(cudaStream_t st, unsigned blocks, const wg_conv_shape_t *s, size_t n, const float *x,
            float *cols) {
  size_t total = s->c * s->k * s->k * n * s->oh * s->ow;
  im2col_k<<<grid_for(total, blocks), kThreads, 0, st>>>(*s, n, x, cols);
}

void col2im(cudaStream_t st, unsigned blocks, const wg_conv_shape_t *s, size_t n,
            const float *dcols, float *dx) {
  col2im_k<<<grid_for(n * s->c * s->h * s->w, blocks), kThreads, 0, st>>>(*s, n, dcols, dx);
}

void conv_unfold_out(cudaStream_t st, unsigned blocks, const wg_conv_shape_t *s, size_t n,
                     const float *t, const float *bias, float *y) {
  size_t total = n * s->oc * s->oh * s->ow;
  conv_unfold_out_k<<<grid_for(total, blocks), kThreads, 0, st>>>(*s, n, t, bias, y);
}

void conv_fold_dy(cudaStream_t st, unsigned blocks, const wg_conv_shape_t *s, size_t n,
                  const float *dy, float *t) {
  size_t total = n * s->oc * s->oh * s->ow;
  conv_fold_dy_k<<<grid_for(total, blocks), kThreads, 0, st>>>(*s, n, dy, t);
}

void pool_forward(cudaStream_t st, unsigned blocks, const wg_pool_shape_t *s, int mode, size_t n,
                  const float *x, float *y, int32_t *argmax) {
  size_t total = n * s->c * s->oh * s->ow;
  pool_forward_k<<<grid_for(total, blocks), kThreads, 0, st>>>(*s, mode, n, x, y, argmax);
}

void pool_backward(cudaStream_t st, unsigned blocks, const wg_pool_shape_t *s, int mode, size_t n,
                   const float *dy, const int32_t *argmax, float *dx) {
  size_t total = n * s->c * s->h * s->w;
  pool_backward_k<<<grid_for(total, blocks), kThreads, 0, st>>>(*s, mode, n, dy, argmax, dx);
}

void act_forward(cudaStream_t st, unsigned blocks, int fn, size_t len, const float *x, float *y) {
  act_forward_k<<<grid_for(len, blocks), kThreads, 0, st>>>(fn, len, x, y);
}

void act_backward(cudaStream_t st, unsigned blocks, int fn, size_t len, const float *y,
                  const float *dy, float *dx) {
  act_backward_k<<<grid_for(len, blocks), kThreads, 0, st>>>(fn, len, y, dy, dx);
}

void softmax_xent(cudaStream_t st, unsigned blocks, size_t n, size_t classes, const float *logits,
                  const int32_t *y, float *dlogits, double *loss, int32_t *hit) {
  softmax_xent_k<<<grid_for(n, blocks), kThreads, 0, st>>>(n, classes, logits, y, dlogits, loss,
                                                           hit);
}

void sgd(cudaStream_t st, unsigned blocks, size_t n, float *w, const float *g, float *v, float lr,
         float mu, float wd, int nesterov) {
  if (v)
    sgd_momentum_k<<<grid_for(n, blocks), kThreads, 0, st>>>(n, w, g, v, lr, mu, wd, nesterov);
  else
    sgd_plain_k<<<grid_for(n, blocks), kThreads, 0, st>>>(n, w, g, lr, wd);
}

void adam(cudaStream_t st, unsigned blocks, size_t n, float *w, const float *g, float *m, float *v,
          wg_adam_consts_t k) {
  adam_k<<<grid_for(n, blocks), kThreads, 0, st>>>(n, w, g, m, v, k);
}

} // namespace wgk
