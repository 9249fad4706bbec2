/* agent/train/cuda_internal.h — the CUDA kernels of the training backend (kernels_cuda.cu) as
 * the backend (backend_cuda.cu) launches them. CUDA C++ only; internal to wagma_train.
 *
 * Every launcher queues its kernel on `st` and returns; launch errors are read by the caller
 * (cudaGetLastError). `blocks` caps the grid of the grid-stride kernels (the backend passes a
 * multiple of the device's SM count). Layouts are those of backend.h / layers.h; the
 * convolution's scratch is the CUDA backend's own:
 *   cols  [c*k*k][n*oh*ow]   im2col of the whole batch, one column per output pixel
 *   tmp   [oc][n*oh*ow] then [c*k*k][n*oh*ow]: the GEMM output of forward; dy reordered and the
 *         input-gradient columns of backward. */
#ifndef WAGMA_AGENT_TRAIN_CUDA_INTERNAL_H
#define WAGMA_AGENT_TRAIN_CUDA_INTERNAL_H

#include <cuda_runtime.h>

#include "agent/train/backend.h"

namespace wgk {

/* Grid of a grid-stride loop over n elements: enough blocks of 256 threads, at most cap. */
static inline unsigned grid_for(size_t n, unsigned cap) {
  size_t b = (n + 255) / 256;
  if (b < 1)
    b = 1;
  return (unsigned)(b < cap ? b : cap);
}

void fill(cudaStream_t st, unsigned blocks, size_t n, float value, float *p);
/* y[i][o] = bias[o]. */
void bias_rows(cudaStream_t st, unsigned blocks, size_t n, size_t out, const float *bias, float *y);
/* db[o] = sum over a < A, p < P of dy[(a*O + o)*P + p]: one block per o, a fixed reduction
 * tree (deterministic). */
void channel_sum(cudaStream_t st, size_t A, size_t O, size_t P, const float *dy, float *db);

void im2col(cudaStream_t st, unsigned blocks, const wg_conv_shape_t *s, size_t n, const float *x,
            float *cols);
/* dx[img][c][h][w] = sum of the dcols entries that read it (a gather: no atomics). */
void col2im(cudaStream_t st, unsigned blocks, const wg_conv_shape_t *s, size_t n,
            const float *dcols, float *dx);
/* y[img][o][p] = t[o][img*ohw + p] + bias[o]. */
void conv_unfold_out(cudaStream_t st, unsigned blocks, const wg_conv_shape_t *s, size_t n,
                     const float *t, const float *bias, float *y);
/* t[o][img*ohw + p] = dy[img][o][p]. */
void conv_fold_dy(cudaStream_t st, unsigned blocks, const wg_conv_shape_t *s, size_t n,
                  const float *dy, float *t);

void pool_forward(cudaStream_t st, unsigned blocks, const wg_pool_shape_t *s, int mode, size_t n,
                  const float *x, float *y, int32_t *argmax);
void pool_backward(cudaStream_t st, unsigned blocks, const wg_pool_shape_t *s, int mode, size_t n,
                   const float *dy, const int32_t *argmax, float *dx);

void act_forward(cudaStream_t st, unsigned blocks, int fn, size_t len, const float *x, float *y);
void act_backward(cudaStream_t st, unsigned blocks, int fn, size_t len, const float *y,
                  const float *dy, float *dx);

/* Per sample: loss[i] (double), hit[i] = arg-max == label, and dlogits when not NULL. */
void softmax_xent(cudaStream_t st, unsigned blocks, size_t n, size_t classes, const float *logits,
                  const int32_t *y, float *dlogits, double *loss, int32_t *hit);

void sgd(cudaStream_t st, unsigned blocks, size_t n, float *w, const float *g, float *v, float lr,
         float mu, float wd, int nesterov);
void adam(cudaStream_t st, unsigned blocks, size_t n, float *w, const float *g, float *m, float *v,
          wg_adam_consts_t k);

} // namespace wgk

#endif
