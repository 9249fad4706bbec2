/* agent/train/layers.h — the CPU backend's layer kernels (internal to wagma_train and its
 * tests), and the shapes every backend uses. Pure functions over caller-owned host buffers: no
 * allocation, no state. Dense layers are backend-generic: wg_dense_* in backend.h.
 *
 * Layout: a batch of n samples is sample-major; an image sample is channel-major (NCHW).
 * Backward kernels WRITE (not accumulate) parameter gradients; dx may be NULL when the input
 * gradient is not needed (first layer). */
#ifndef WAGMA_AGENT_TRAIN_LAYERS_H
#define WAGMA_AGENT_TRAIN_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Convolution, stride 1, square kernel k, zero padding pad. Weights w[oc][c][k][k], bias b[oc]. */
typedef struct wg_conv_shape {
  size_t c, h, w; /* input */
  size_t oc, k, pad;
  size_t oh, ow; /* output: h + 2 pad - k + 1 */
} wg_conv_shape_t;

/* Fills oh/ow; returns 0, or -1 when the kernel does not fit. */
int wg_conv_shape_init(wg_conv_shape_t *s, size_t c, size_t h, size_t w, size_t oc, size_t k,
                       size_t pad);
/* Scratch floats the conv kernels need for a batch of n: cols (n images x c*k*k x oh*ow) kept
 * from forward to backward, and tmp (c*k*k x oh*ow, backward only). */
size_t wg_conv_cols_len(const wg_conv_shape_t *s, size_t n);
size_t wg_conv_tmp_len(const wg_conv_shape_t *s, size_t n);
/* Forward through im2col + sgemm image by image (an image's columns stay in cache between the
 * two); leaves the im2col matrices in cols. tmp is unused (may be NULL). */
void wg_conv_forward(const wg_conv_shape_t *s, size_t n, const float *x, const float *w,
                     const float *b, float *y, float *cols, float *tmp);
/* cols must hold what wg_conv_forward left for the same x (they are only read). */
void wg_conv_backward(const wg_conv_shape_t *s, size_t n, const float *cols, const float *w,
                      const float *dy, float *dw, float *db, float *dx, float *tmp);

/* Pooling, window k x k with stride k (floor of the output size). argmax (n*c*oh*ow) records the
 * winner of each max window and is unused (may be NULL) for average pooling. */
typedef struct wg_pool_shape {
  size_t c, h, w, k, oh, ow;
} wg_pool_shape_t;

int wg_pool_shape_init(wg_pool_shape_t *s, size_t c, size_t h, size_t w, size_t k);
void wg_pool_forward(const wg_pool_shape_t *s, int mode, size_t n, const float *x, float *y,
                     int32_t *argmax);
/* Writes the whole dx (zero where no window reads). */
void wg_pool_backward(const wg_pool_shape_t *s, int mode, size_t n, const float *dy,
                      const int32_t *argmax, float *dx);

/* Element-wise activation (enum wagma_activation); backward from the OUTPUT y. */
void wg_act_forward(int fn, size_t len, const float *x, float *y);
void wg_act_backward(int fn, size_t len, const float *y, const float *dy, float *dx);

/* Softmax cross-entropy over logits[n][classes] with labels y. Returns the MEAN loss (double
 * accumulation), counts correct arg-max predictions in *correct (may be NULL) and, when dlogits
 * is not NULL, writes d(mean loss)/d logits = (softmax - onehot) / n. */
double wg_softmax_xent(size_t n, size_t classes, const float *logits, const int32_t *y,
                       float *dlogits, size_t *correct);

#ifdef __cplusplus
}
#endif
#endif
