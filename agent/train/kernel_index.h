/* agent/train/kernel_index.h — the per-element bodies of the CUDA backend's layout kernels
 * (im2col / col2im over the whole batch, the reorderings around the convolution GEMMs,
 * pooling), written once for host and device like elementwise.h.
 *
 * kernels_cuda.cu runs each as a grid-stride loop over i; the unit tests run the same functions
 * in a host loop (tests/unit/train/emu_backend.c, an emulation of the CUDA backend's algorithm)
 * and compare against the CPU backend, so the index arithmetic of the GPU path is checked on
 * every machine. Pure functions: element i of the output from the inputs, no writes except
 * where a pointer says so.
 *
 * The CUDA backend's convolution scratch (see cuda_internal.h):
 *   cols  [c*k*k][n*oh*ow]   column j = img*oh*ow + oy*ow + ox of the whole batch
 *   t     [oc][n*oh*ow]      the GEMM output w . cols (forward) / dy reordered (backward) */
#ifndef WAGMA_AGENT_TRAIN_KERNEL_INDEX_H
#define WAGMA_AGENT_TRAIN_KERNEL_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "agent/train/elementwise.h"
#include "agent/train/layers.h"

/* Scratch floats of the CUDA backend's convolution for a batch of n (conv_cols_len /
 * conv_tmp_len of its table): cols, and t followed by the input-gradient columns. */
WG_HD size_t wg_batch_conv_cols_len(const wg_conv_shape_t *s, size_t n) {
  return s->c * s->k * s->k * n * s->oh * s->ow;
}

WG_HD size_t wg_batch_conv_tmp_len(const wg_conv_shape_t *s, size_t n) {
  return (s->oc + s->c * s->k * s->k) * n * s->oh * s->ow;
}

/* Pooling modes of train.h (enum wagma_pool_mode). */
#define WG_POOL_MAX 0
#define WG_POOL_AVG 1

/* cols[i] for i < c*k*k * n*oh*ow: x[img][ci][oy+ki-pad][ox+kj-pad], 0 outside the image. */
WG_HD float wg_im2col_at(const wg_conv_shape_t *s, size_t n, const float *x, size_t i) {
  const size_t ohw = s->oh * s->ow, ncols = n * ohw, kk = s->k * s->k;
  size_t r = i / ncols, j = i - r * ncols;
  size_t img = j / ohw, p = j - img * ohw;
  size_t oy = p / s->ow, ox = p - oy * s->ow;
  size_t ci = r / kk, rem = r - ci * kk, ki = rem / s->k, kj = rem - ki * s->k;
  long iy = (long)oy + (long)ki - (long)s->pad, ix = (long)ox + (long)kj - (long)s->pad;
  if (iy < 0 || iy >= (long)s->h || ix < 0 || ix >= (long)s->w)
    return 0.0f;
  return x[((img * s->c + ci) * s->h + (size_t)iy) * s->w + (size_t)ix];
}

/* dx[i] for i < n*c*h*w: the sum of the dcols entries that read input i, in (ki, kj) order (a
 * gather: every output element is one thread's, no atomics). */
WG_HD float wg_col2im_at(const wg_conv_shape_t *s, size_t n, const float *dcols, size_t i) {
  const size_t ohw = s->oh * s->ow, ncols = n * ohw, hw = s->h * s->w;
  size_t img = i / (s->c * hw), rem = i - img * s->c * hw;
  size_t ci = rem / hw, q = rem - ci * hw, iy = q / s->w, ix = q - iy * s->w;
  float sum = 0.0f;
  for (size_t ki = 0; ki < s->k; ki++) {
    long oy = (long)iy + (long)s->pad - (long)ki;
    if (oy < 0 || oy >= (long)s->oh)
      continue;
    for (size_t kj = 0; kj < s->k; kj++) {
      long ox = (long)ix + (long)s->pad - (long)kj;
      if (ox < 0 || ox >= (long)s->ow)
        continue;
      size_t r = (ci * s->k + ki) * s->k + kj;
      sum += dcols[r * ncols + img * ohw + (size_t)oy * s->ow + (size_t)ox];
    }
  }
  return sum;
}

/* For i < n*oc*oh*ow (NCHW index of y / dy): the index of the same element in t[oc][n*oh*ow].
 * Forward: y[i] = t[at] + bias[o]; backward: t[at] = dy[i]. */
WG_HD size_t wg_conv_t_index(const wg_conv_shape_t *s, size_t n, size_t i, size_t *o) {
  const size_t ohw = s->oh * s->ow;
  size_t img = i / (s->oc * ohw), rem = i - img * s->oc * ohw, oc = rem / ohw, p = rem - oc * ohw;
  *o = oc;
  return oc * n * ohw + img * ohw + p;
}

/* Output i < n*c*oh*ow of a k x k / stride k pooling: the CPU's window scan (row-major,
 * strict >, the first maximum wins), so value and arg-max (offset in the plane) are the CPU's. */
WG_HD void wg_pool_forward_at(const wg_pool_shape_t *s, int mode, const float *x, size_t i,
                              float *y, int32_t *argmax) {
  const size_t ohw = s->oh * s->ow, k = s->k;
  size_t pl = i / ohw, p = i - pl * ohw, oy = p / s->ow, ox = p - oy * s->ow;
  const float *in = x + pl * s->h * s->w;
  size_t base = oy * k * s->w + ox * k;
  if (mode == WG_POOL_MAX) {
    size_t best = base;
    for (size_t a = 0; a < k; a++)
      for (size_t b = 0; b < k; b++) {
        size_t at = base + a * s->w + b;
        if (in[at] > in[best])
          best = at;
      }
    y[i] = in[best];
    argmax[i] = (int32_t)best;
  } else {
    const float inv = 1.0f / (float)(k * k);
    float sum = 0.0f;
    for (size_t a = 0; a < k; a++)
      for (size_t b = 0; b < k; b++)
        sum += in[base + a * s->w + b];
    y[i] = sum * inv;
  }
}

/* dx[i] for i < n*c*h*w: windows do not overlap (stride k), so input i lies in at most one;
 * 0 in the floor tail. */
WG_HD float wg_pool_backward_at(const wg_pool_shape_t *s, int mode, const float *dy,
                                const int32_t *argmax, size_t i) {
  const size_t hw = s->h * s->w, ohw = s->oh * s->ow, k = s->k;
  size_t pl = i / hw, q = i - pl * hw, iy = q / s->w, ix = q - iy * s->w;
  size_t oy = iy / k, ox = ix / k;
  if (oy >= s->oh || ox >= s->ow)
    return 0.0f;
  size_t at = pl * ohw + oy * s->ow + ox;
  if (mode == WG_POOL_MAX)
    return argmax[at] == (int32_t)q ? dy[at] : 0.0f;
  return dy[at] * (1.0f / (float)(k * k));
}

#endif
