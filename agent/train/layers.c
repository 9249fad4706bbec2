/* layers.c — the CPU backend's layer kernels: convolution (im2col + sgemm per image), pooling,
 * activations and softmax cross-entropy, forward and backward. The element-wise math is that of
 * elementwise.h (shared with the CUDA kernels); dense layers are backend-generic (backend.c).
 *
 * Owns nothing: every buffer is the caller's (models.c sizes them for its max batch). No
 * threads of its own; OpenBLAS may use its own pool (see wagma_train_set_threads). Invariant:
 * backward kernels overwrite parameter gradients, so a backward pass needs no zeroing. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "agent/train/elementwise.h"
#include "agent/train/layers.h"
#include "agent/train/train.h"

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
  (void)n;
  return s->c * s->k * s->k * s->oh * s->ow;
}

/* Output columns ox whose input column ox + kj - pad lies inside 0..w-1: [*lo, *hi). */
static void valid_cols(const wg_conv_shape_t *s, size_t kj, size_t *lo, size_t *hi) {
  long a = (long)s->pad - (long)kj, b = (long)s->w + (long)s->pad - (long)kj;
  *lo = a < 0 ? 0 : (size_t)a;
  *hi = b > (long)s->ow ? s->ow : (b < 0 ? 0 : (size_t)b);
  if (*hi < *lo)
    *hi = *lo;
}

/* One image: cols[(ci*k + ki)*k + kj][oy*ow + ox] = x[ci][oy+ki-pad][ox+kj-pad] (0 outside). */
static void im2col(const wg_conv_shape_t *s, const float *x, float *cols) {
  const size_t ohw = s->oh * s->ow;
  for (size_t ci = 0; ci < s->c; ci++)
    for (size_t ki = 0; ki < s->k; ki++)
      for (size_t kj = 0; kj < s->k; kj++) {
        float *row = cols + ((ci * s->k + ki) * s->k + kj) * ohw;
        const float *plane = x + ci * s->h * s->w;
        size_t lo, hi;
        valid_cols(s, kj, &lo, &hi);
        for (size_t oy = 0; oy < s->oh; oy++) {
          float *dst = row + oy * s->ow;
          long iy = (long)oy + (long)ki - (long)s->pad;
          if (iy < 0 || iy >= (long)s->h) {
            memset(dst, 0, s->ow * sizeof(float));
            continue;
          }
          const float *src = plane + (size_t)iy * s->w;
          for (size_t ox = 0; ox < lo; ox++)
            dst[ox] = 0.0f;
          for (size_t ox = lo; ox < hi; ox++) /* ox + kj >= pad for ox >= lo */
            dst[ox] = src[ox + kj - s->pad];
          for (size_t ox = hi; ox < s->ow; ox++)
            dst[ox] = 0.0f;
        }
      }
}

/* The adjoint of im2col for one image: dx = sum of the column entries reading each input. */
static void col2im(const wg_conv_shape_t *s, const float *cols, float *dx) {
  const size_t ohw = s->oh * s->ow;
  memset(dx, 0, s->c * s->h * s->w * sizeof(float));
  for (size_t ci = 0; ci < s->c; ci++)
    for (size_t ki = 0; ki < s->k; ki++)
      for (size_t kj = 0; kj < s->k; kj++) {
        const float *row = cols + ((ci * s->k + ki) * s->k + kj) * ohw;
        float *plane = dx + ci * s->h * s->w;
        size_t lo, hi;
        valid_cols(s, kj, &lo, &hi);
        for (size_t oy = 0; oy < s->oh; oy++) {
          long iy = (long)oy + (long)ki - (long)s->pad;
          if (iy < 0 || iy >= (long)s->h)
            continue;
          const float *src = row + oy * s->ow;
          float *dst = plane + (size_t)iy * s->w;
          for (size_t ox = lo; ox < hi; ox++)
            dst[ox + kj - s->pad] += src[ox];
        }
      }
}

/* Per image (its columns stay in cache between im2col and sgemm): y_img[oc][oh*ow] =
 * w[oc][c*k*k] . cols_img[c*k*k][oh*ow] + b. */
void wg_conv_forward(const wg_conv_shape_t *s, size_t n, const float *x, const float *w,
                     const float *b, float *y, float *cols, float *tmp) {
  (void)tmp;
  const size_t ohw = s->oh * s->ow, ckk = s->c * s->k * s->k;
  for (size_t img = 0; img < n; img++) {
    float *ci = cols + img * ckk * ohw, *yi = y + img * s->oc * ohw;
    im2col(s, x + img * s->c * s->h * s->w, ci);
    for (size_t o = 0; o < s->oc; o++)
      for (size_t p = 0; p < ohw; p++)
        yi[o * ohw + p] = b[o];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)s->oc, (int)ohw, (int)ckk, 1.0f, w,
                (int)ckk, ci, (int)ohw, 1.0f, yi, (int)ohw);
  }
}

void wg_conv_backward(const wg_conv_shape_t *s, size_t n, const float *cols, const float *w,
                      const float *dy, float *dw, float *db, float *dx, float *tmp) {
  const size_t ohw = s->oh * s->ow, ckk = s->c * s->k * s->k;
  for (size_t o = 0; o < s->oc; o++)
    db[o] = 0.0f;
  for (size_t img = 0; img < n; img++) {
    const float *dyi = dy + img * s->oc * ohw, *ci = cols + img * ckk * ohw;
    for (size_t o = 0; o < s->oc; o++) {
      float sum = 0.0f;
      for (size_t p = 0; p < ohw; p++)
        sum += dyi[o * ohw + p];
      db[o] += sum;
    }
    /* dw[oc][ckk] (+)= dy_img[oc][ohw] . cols_img^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)s->oc, (int)ckk, (int)ohw, 1.0f, dyi,
                (int)ohw, ci, (int)ohw, img ? 1.0f : 0.0f, dw, (int)ckk);
    if (!dx)
      continue;
    /* dcols[ckk][ohw] = w^T . dy_img, then col2im */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)ckk, (int)ohw, (int)s->oc, 1.0f, w,
                (int)ckk, dyi, (int)ohw, 0.0f, tmp, (int)ohw);
    col2im(s, tmp, dx + img * s->c * s->h * s->w);
  }
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
      y[i] = wg_tanh(x[i]);
  } else {
    for (size_t i = 0; i < len; i++) /* unconditional loads + select: vectorizes */
      y[i] = wg_relu(x[i]);
  }
}

void wg_act_backward(int fn, size_t len, const float *y, const float *dy, float *dx) {
  if (fn == WAGMA_ACT_TANH) {
    for (size_t i = 0; i < len; i++)
      dx[i] = wg_tanh_grad(y[i], dy[i]);
  } else {
    for (size_t i = 0; i < len; i++)
      dx[i] = wg_relu_grad(y[i], dy[i]);
  }
}

/* ------------------------------------------------------------------ softmax cross-entropy */

double wg_softmax_xent(size_t n, size_t classes, const float *logits, const int32_t *y,
                       float *dlogits, size_t *correct) {
  double total = 0.0;
  size_t hits = 0;
  for (size_t i = 0; i < n; i++) {
    size_t best;
    total += wg_xent_row(logits + i * classes, classes, y[i], (double)n,
                         dlogits ? dlogits + i * classes : NULL, &best);
    hits += best == (size_t)y[i];
  }
  if (correct)
    *correct = hits;
  return n ? total / (double)n : 0.0;
}
