/* layers.c — layer kernels: dense, convolution (im2col + sgemm), pooling, activations and
 * softmax cross-entropy, forward and backward.
 *
 * Owns nothing: every buffer is the caller's (models.c sizes them for its max batch). No
 * threads of its own; OpenBLAS may use its own pool (see wagma_train_set_threads). Invariant:
 * backward kernels overwrite parameter gradients, so a backward pass needs no zeroing. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "agent/train/layers.h"
#include "agent/train/train.h"

/* ------------------------------------------------------------------ dense */

void wg_dense_forward(size_t n, size_t in, size_t out, const float *x, const float *w,
                      const float *b, float *y) {
  for (size_t i = 0; i < n; i++)
    memcpy(y + i * out, b, out * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)in, 1.0f, x, (int)in,
              w, (int)in, 1.0f, y, (int)out);
}

void wg_dense_backward(size_t n, size_t in, size_t out, const float *x, const float *w,
                       const float *dy, float *dw, float *db, float *dx) {
  /* dw[out][in] = dy^T . x */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)out, (int)in, (int)n, 1.0f, dy,
              (int)out, x, (int)in, 0.0f, dw, (int)in);
  for (size_t o = 0; o < out; o++)
    db[o] = 0.0f;
  for (size_t i = 0; i < n; i++)
    for (size_t o = 0; o < out; o++)
      db[o] += dy[i * out + o];
  if (dx) /* dx[n][in] = dy . w */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)in, (int)out, 1.0f, dy,
                (int)out, w, (int)in, 0.0f, dx, (int)in);
}

/* ------------------------------------------------------------------ convolution */

int wg_conv_shape_init(wg_conv_shape_t *s, size_t c, size_t h, size_t w, size_t oc, size_t k,
                       size_t pad) {
  memset(s, 0, sizeof(*s));
  if (c == 0 || oc == 0 || k == 0 || h + 2 * pad < k || w + 2 * pad < k)
    return -1;
  s->c = c;
  s->h = h;
  s->w = w;
  s->oc = oc;
  s->k = k;
  s->pad = pad;
  s->oh = h + 2 * pad - k + 1;
  s->ow = w + 2 * pad - k + 1;
  return 0;
}

size_t wg_conv_cols_len(const wg_conv_shape_t *s, size_t n) {
  return s->c * s->k * s->k * n * s->oh * s->ow;
}

size_t wg_conv_tmp_len(const wg_conv_shape_t *s, size_t n) {
  return s->oc * n * s->oh * s->ow;
}

/* cols[(ci*k + ki)*k + kj][img*oh*ow + oy*ow + ox] = x[img][ci][oy+ki-pad][ox+kj-pad] (0 outside)
 */
static void im2col(const wg_conv_shape_t *s, size_t n, const float *x, float *cols) {
  const size_t ohw = s->oh * s->ow, row_len = n * ohw;
  for (size_t ci = 0; ci < s->c; ci++)
    for (size_t ki = 0; ki < s->k; ki++)
      for (size_t kj = 0; kj < s->k; kj++) {
        float *row = cols + ((ci * s->k + ki) * s->k + kj) * row_len;
        for (size_t img = 0; img < n; img++) {
          const float *plane = x + (img * s->c + ci) * s->h * s->w;
          for (size_t oy = 0; oy < s->oh; oy++) {
            float *dst = row + img * ohw + oy * s->ow;
            long iy = (long)oy + (long)ki - (long)s->pad;
            if (iy < 0 || iy >= (long)s->h) {
              memset(dst, 0, s->ow * sizeof(float));
              continue;
            }
            const float *src = plane + (size_t)iy * s->w;
            for (size_t ox = 0; ox < s->ow; ox++) {
              long ix = (long)ox + (long)kj - (long)s->pad;
              dst[ox] = (ix < 0 || ix >= (long)s->w) ? 0.0f : src[ix];
            }
          }
        }
      }
}

/* The adjoint of im2col: dx = sum of the column entries that read each input element. */
static void col2im(const wg_conv_shape_t *s, size_t n, const float *cols, float *dx) {
  const size_t ohw = s->oh * s->ow, row_len = n * ohw;
  memset(dx, 0, n * s->c * s->h * s->w * sizeof(float));
  for (size_t ci = 0; ci < s->c; ci++)
    for (size_t ki = 0; ki < s->k; ki++)
      for (size_t kj = 0; kj < s->k; kj++) {
        const float *row = cols + ((ci * s->k + ki) * s->k + kj) * row_len;
        for (size_t img = 0; img < n; img++) {
          float *plane = dx + (img * s->c + ci) * s->h * s->w;
          for (size_t oy = 0; oy < s->oh; oy++) {
            long iy = (long)oy + (long)ki - (long)s->pad;
            if (iy < 0 || iy >= (long)s->h)
              continue;
            const float *src = row + img * ohw + oy * s->ow;
            float *dst = plane + (size_t)iy * s->w;
            for (size_t ox = 0; ox < s->ow; ox++) {
              long ix = (long)ox + (long)kj - (long)s->pad;
              if (ix >= 0 && ix < (long)s->w)
                dst[ix] += src[ox];
            }
          }
        }
      }
}

void wg_conv_forward(const wg_conv_shape_t *s, size_t n, const float *x, const float *w,
                     const float *b, float *y, float *cols, float *tmp) {
  const size_t ohw = s->oh * s->ow, ckk = s->c * s->k * s->k, cols_n = n * ohw;
  im2col(s, n, x, cols);
  /* tmp[oc][n*ohw] = w[oc][ckk] . cols[ckk][n*ohw] */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)s->oc, (int)cols_n, (int)ckk, 1.0f, w,
              (int)ckk, cols, (int)cols_n, 0.0f, tmp, (int)cols_n);
  for (size_t img = 0; img < n; img++)
    for (size_t o = 0; o < s->oc; o++) {
      const float *src = tmp + o * cols_n + img * ohw;
      float *dst = y + (img * s->oc + o) * ohw;
      for (size_t p = 0; p < ohw; p++)
        dst[p] = src[p] + b[o];
    }
}

void wg_conv_backward(const wg_conv_shape_t *s, size_t n, float *cols, const float *w,
                      const float *dy, float *dw, float *db, float *dx, float *tmp) {
  const size_t ohw = s->oh * s->ow, ckk = s->c * s->k * s->k, cols_n = n * ohw;
  for (size_t o = 0; o < s->oc; o++)
    db[o] = 0.0f;
  for (size_t img = 0; img < n; img++)
    for (size_t o = 0; o < s->oc; o++) {
      const float *src = dy + (img * s->oc + o) * ohw;
      float *dst = tmp + o * cols_n + img * ohw;
      float sum = 0.0f;
      for (size_t p = 0; p < ohw; p++) {
        dst[p] = src[p];
        sum += src[p];
      }
      db[o] += sum;
    }
  /* dw[oc][ckk] = tmp[oc][n*ohw] . cols^T */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)s->oc, (int)ckk, (int)cols_n, 1.0f, tmp,
              (int)cols_n, cols, (int)cols_n, 0.0f, dw, (int)ckk);
  if (!dx)
    return;
  /* dcols[ckk][n*ohw] = w^T . tmp, then col2im. dw no longer needs the forward's cols, so
   * dcols reuses their memory. */
  float *dcols = cols;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)ckk, (int)cols_n, (int)s->oc, 1.0f, w,
              (int)ckk, tmp, (int)cols_n, 0.0f, dcols, (int)cols_n);
  col2im(s, n, dcols, dx);
}

/* ------------------------------------------------------------------ pooling */

int wg_pool_shape_init(wg_pool_shape_t *s, size_t c, size_t h, size_t w, size_t k) {
  memset(s, 0, sizeof(*s));
  if (c == 0 || k == 0 || h < k || w < k)
    return -1;
  s->c = c;
  s->h = h;
  s->w = w;
  s->k = k;
  s->oh = h / k;
  s->ow = w / k;
  return 0;
}

void wg_pool_forward(const wg_pool_shape_t *s, int mode, size_t n, const float *x, float *y,
                     int32_t *argmax) {
  const size_t planes = n * s->c, k = s->k;
  const float inv = 1.0f / (float)(k * k);
  for (size_t pl = 0; pl < planes; pl++) {
    const float *in = x + pl * s->h * s->w;
    float *out = y + pl * s->oh * s->ow;
    int32_t *am = argmax ? argmax + pl * s->oh * s->ow : NULL;
    for (size_t oy = 0; oy < s->oh; oy++)
      for (size_t ox = 0; ox < s->ow; ox++) {
        size_t base = oy * k * s->w + ox * k;
        if (mode == WAGMA_POOL_MAX) {
          size_t best = base;
          for (size_t i = 0; i < k; i++)
            for (size_t j = 0; j < k; j++) {
              size_t at = base + i * s->w + j;
              if (in[at] > in[best])
                best = at;
            }
          out[oy * s->ow + ox] = in[best];
          am[oy * s->ow + ox] = (int32_t)best;
        } else {
          float sum = 0.0f;
          for (size_t i = 0; i < k; i++)
            for (size_t j = 0; j < k; j++)
              sum += in[base + i * s->w + j];
          out[oy * s->ow + ox] = sum * inv;
        }
      }
  }
}

void wg_pool_backward(const wg_pool_shape_t *s, int mode, size_t n, const float *dy,
                      const int32_t *argmax, float *dx) {
  const size_t planes = n * s->c, k = s->k;
  const float inv = 1.0f / (float)(k * k);
  memset(dx, 0, planes * s->h * s->w * sizeof(float));
  for (size_t pl = 0; pl < planes; pl++) {
    float *din = dx + pl * s->h * s->w;
    const float *dout = dy + pl * s->oh * s->ow;
    if (mode == WAGMA_POOL_MAX) {
      const int32_t *am = argmax + pl * s->oh * s->ow;
      for (size_t p = 0; p < s->oh * s->ow; p++)
        din[am[p]] += dout[p];
      continue;
    }
    for (size_t oy = 0; oy < s->oh; oy++)
      for (size_t ox = 0; ox < s->ow; ox++) {
        float g = dout[oy * s->ow + ox] * inv;
        size_t base = oy * k * s->w + ox * k;
        for (size_t i = 0; i < k; i++)
          for (size_t j = 0; j < k; j++)
            din[base + i * s->w + j] += g;
      }
  }
}

/* ------------------------------------------------------------------ activations */

void wg_act_forward(int fn, size_t len, const float *x, float *y) {
  if (fn == WAGMA_ACT_TANH) {
    for (size_t i = 0; i < len; i++)
      y[i] = tanhf(x[i]);
  } else {
    for (size_t i = 0; i < len; i++)
      y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
}

void wg_act_backward(int fn, size_t len, const float *y, const float *dy, float *dx) {
  if (fn == WAGMA_ACT_TANH) {
    for (size_t i = 0; i < len; i++)
      dx[i] = dy[i] * (1.0f - y[i] * y[i]);
  } else {
    for (size_t i = 0; i < len; i++)
      dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

/* ------------------------------------------------------------------ softmax cross-entropy */

double wg_softmax_xent(size_t n, size_t classes, const float *logits, const int32_t *y,
                       float *dlogits, size_t *correct) {
  double total = 0.0;
  size_t hits = 0;
  for (size_t i = 0; i < n; i++) {
    const float *z = logits + i * classes;
    size_t best = 0;
    for (size_t c = 1; c < classes; c++)
      if (z[c] > z[best])
        best = c;
    double sum = 0.0;
    for (size_t c = 0; c < classes; c++)
      sum += exp((double)z[c] - (double)z[best]);
    double lse = (double)z[best] + log(sum);
    total += lse - (double)z[y[i]];
    hits += best == (size_t)y[i];
    if (dlogits) {
      float *d = dlogits + i * classes;
      for (size_t c = 0; c < classes; c++) {
        double p = exp((double)z[c] - lse);
        d[c] = (float)((p - (c == (size_t)y[i] ? 1.0 : 0.0)) / (double)n);
      }
    }
  }
  if (correct)
    *correct = hits;
  return n ? total / (double)n : 0.0;
}
