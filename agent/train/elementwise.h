/* agent/train/elementwise.h — the element-wise math of wagma_train, written once for every
 * backend: activations and their gradients, softmax cross-entropy of one sample, and the
 * per-parameter updates of SGD (momentum, Nesterov, weight decay), Adam and AdamW.
 *
 * Compiles as C (static inline, the CPU backend loops over these functions) and as CUDA
 * (__host__ __device__, the CUDA backend's kernels are grid-stride loops over the same
 * functions), so the CPU unit tests check the kernels' arithmetic. Pure functions: no state,
 * no allocation, no library calls other than tanhf / sqrtf / exp / log, which exist on both.
 *
 * The expressions are the ones the CPU code always used, in the same order, so the CPU
 * results are bit-for-bit those of the code before this header. Under nvcc the compiler may
 * contract a*b+c into an FMA (its default), so device results can differ in the last bits. */
#ifndef WAGMA_AGENT_TRAIN_ELEMENTWISE_H
#define WAGMA_AGENT_TRAIN_ELEMENTWISE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define WG_HD static __host__ __device__ __forceinline__
#else
#define WG_HD static inline
#endif

/* Activation functions (enum wagma_activation in train.h: 0 = ReLU, 1 = tanh). */
#define WG_ACT_RELU 0
#define WG_ACT_TANH 1

WG_HD float wg_relu(float x) {
  return x > 0.0f ? x : 0.0f;
}

/* d relu / dx from the OUTPUT y (y > 0 exactly where x > 0). */
WG_HD float wg_relu_grad(float y, float dy) {
  return y > 0.0f ? dy : 0.0f;
}

WG_HD float wg_tanh(float x) {
  return tanhf(x);
}

/* d tanh / dx from the OUTPUT y: 1 - y^2. */
WG_HD float wg_tanh_grad(float y, float dy) {
  return dy * (1.0f - y * y);
}

WG_HD float wg_act(int fn, float x) {
  return fn == WG_ACT_TANH ? wg_tanh(x) : wg_relu(x);
}

WG_HD float wg_act_grad(int fn, float y, float dy) {
  return fn == WG_ACT_TANH ? wg_tanh_grad(y, dy) : wg_relu_grad(y, dy);
}

/* Softmax cross-entropy of one sample: logits z[0..classes), label y. Returns the loss
 * log(sum_c exp z_c) - z_y (double accumulation, shifted by the largest logit so that huge
 * logits stay finite), stores the arg-max (first one on ties) in *argmax and, when d is not
 * NULL, writes d loss_mean / d z = (softmax - onehot) / n, n = the batch size. */
WG_HD double wg_xent_row(const float *z, size_t classes, int32_t y, double n, float *d,
                         size_t *argmax) {
  size_t best = 0;
  for (size_t c = 1; c < classes; c++)
    if (z[c] > z[best])
      best = c;
  double sum = 0.0;
  for (size_t c = 0; c < classes; c++)
    sum += exp((double)z[c] - (double)z[best]);
  double lse = (double)z[best] + log(sum);
  if (d)
    for (size_t c = 0; c < classes; c++) {
      double p = exp((double)z[c] - lse);
      d[c] = (float)((p - (c == (size_t)y ? 1.0 : 0.0)) / n);
    }
  *argmax = best;
  return lse - (double)z[y];
}

/* SGD (PyTorch conventions) on one parameter w with gradient grad:
 *   g = grad + wd * w; v = mu * v + g; w -= lr * (nesterov ? g + mu * v : v).
 * Without momentum (no velocity buffer) use wg_sgd_plain: w -= lr * (grad + wd * w). */
WG_HD void wg_sgd_momentum(float *w, float *v, float grad, float lr, float mu, float wd,
                           int nesterov) {
  float g = grad + wd * *w;
  *v = mu * *v + g;
  *w -= lr * (nesterov ? g + mu * *v : *v);
}

WG_HD void wg_sgd_plain(float *w, float grad, float lr, float wd) {
  *w -= lr * (grad + wd * *w);
}

/* The per-step constants of Adam: c1 = 1 / (1 - b1^k), c2 = 1 / (1 - b2^k), k = updates taken
 * before this one + 1. Host-side (double pow), passed to every element. */
typedef struct wg_adam_consts {
  float lr, b1, b2, eps, wd, c1, c2;
  int decoupled; /* AdamW: w -= lr * wd * w before the step, g = grad */
} wg_adam_consts_t;

/* Adam / AdamW on one parameter: g = grad (+ wd * w for Adam); m = b1 m + (1 - b1) g;
 * v = b2 v + (1 - b2) g^2; w -= lr * (m c1) / (sqrt(v c2) + eps). */
WG_HD void wg_adam(float *w, float *m, float *v, float grad, const wg_adam_consts_t *k) {
  float g = grad;
  if (k->decoupled)
    *w -= k->lr * k->wd * *w;
  else
    g += k->wd * *w;
  *m = k->b1 * *m + (1.0f - k->b1) * g;
  *v = k->b2 * *v + (1.0f - k->b2) * g * g;
  *w -= k->lr * (*m * k->c1) / (sqrtf(*v * k->c2) + k->eps);
}

#endif
