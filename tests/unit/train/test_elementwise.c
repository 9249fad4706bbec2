/* The shared element-wise functions (agent/train/elementwise.h) that both the CPU loops and the
 * CUDA kernels run: values computed here by hand, derivatives against central finite
 * differences. These run on every machine and check the arithmetic of the GPU kernels too. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "agent/train/elementwise.h"
#include "agent/train/train.h"
#include "test_train.h"

#define assert_near(a, b, tol)                                                                     \
  do {                                                                                             \
    double a_ = (a), b_ = (b);                                                                     \
    if (!(fabs(a_ - b_) <= (tol))) {                                                               \
      print_error("%s = %.9g, expected %.9g (tolerance %g)\n", #a, a_, b_, (double)(tol));         \
      fail();                                                                                      \
    }                                                                                              \
  } while (0)

static void activations_by_hand(void **state) {
  (void)state;
  assert_true(wg_relu(2.5f) == 2.5f);
  assert_true(wg_relu(-1.0f) == 0.0f);
  assert_true(wg_relu(0.0f) == 0.0f);
  assert_true(wg_relu_grad(3.0f, 0.7f) == 0.7f);   /* output > 0: passes the gradient */
  assert_true(wg_relu_grad(0.0f, 0.7f) == 0.0f);   /* output 0 (input <= 0): stops it */
  assert_near(wg_tanh(0.5f), 0.46211715726, 1e-7); /* tanh(1/2) */
  assert_near(wg_tanh(-2.0f), -0.96402758008, 1e-7);
  assert_near(wg_tanh_grad(0.5f, 2.0f), 2.0 * (1.0 - 0.25), 1e-7); /* dy (1 - y^2) */
  /* The dispatchers pick the right function; the numbering matches train.h. */
  assert_int_equal(WG_ACT_RELU, WAGMA_ACT_RELU);
  assert_int_equal(WG_ACT_TANH, WAGMA_ACT_TANH);
  assert_true(wg_act(WG_ACT_RELU, -3.0f) == 0.0f);
  assert_true(wg_act(WG_ACT_TANH, 0.5f) == wg_tanh(0.5f));
  assert_true(wg_act_grad(WG_ACT_RELU, 1.0f, 0.3f) == 0.3f);
  assert_true(wg_act_grad(WG_ACT_TANH, 0.5f, 2.0f) == wg_tanh_grad(0.5f, 2.0f));
}

static void activation_gradients_by_finite_differences(void **state) {
  (void)state;
  const double eps = 1e-3;
  for (int fn = WG_ACT_RELU; fn <= WG_ACT_TANH; fn++)
    for (double x = -2.05; x < 2.1; x += 0.1) { /* never on ReLU's kink at 0 */
      double up = wg_act(fn, (float)(x + eps)), down = wg_act(fn, (float)(x - eps));
      double numeric = (up - down) / (2 * eps);
      double analytic = wg_act_grad(fn, wg_act(fn, (float)x), 1.0f);
      assert_near(analytic, numeric, 2e-3);
    }
}

static void xent_row_by_hand(void **state) {
  (void)state;
  /* z = (1, 2, 3), label 0: lse = log(e + e^2 + e^3) = 3.40760596444; loss = lse - 1;
   * softmax = (0.09003057, 0.24472847, 0.66524096); with a batch of n = 2 the gradient is
   * (softmax - onehot) / 2. */
  const float z[3] = {1.0f, 2.0f, 3.0f};
  float d[3];
  size_t best = 99;
  double loss = wg_xent_row(z, 3, 0, 2.0, d, &best);
  assert_near(loss, 2.40760596444, 1e-9);
  assert_int_equal(best, 2);
  assert_near(d[0], (0.09003057317 - 1.0) / 2, 1e-7);
  assert_near(d[1], 0.24472847105 / 2, 1e-7);
  assert_near(d[2], 0.66524095577 / 2, 1e-7);
  /* The gradient of a row sums to zero. */
  assert_near((double)d[0] + d[1] + d[2], 0.0, 1e-7);
  /* Without d the loss is the same; ties give the first arg-max. */
  const float tie[4] = {0.5f, 2.0f, 2.0f, -1.0f};
  loss = wg_xent_row(tie, 4, 1, 1.0, NULL, &best);
  assert_int_equal(best, 1);
  double s = exp(0.5) + 2 * exp(2.0) + exp(-1.0);
  assert_near(loss, log(s) - 2.0, 1e-9);
  /* Huge logits stay finite (the largest is subtracted first). */
  const float big[3] = {1e4f, -1e4f, 9990.0f};
  loss = wg_xent_row(big, 3, 2, 1.0, d, &best);
  assert_near(loss, 10.0, 1e-3); /* log(1 + e^-10) + 10 */
  assert_true(isfinite(d[0]) && isfinite(d[1]) && isfinite(d[2]));
}

static void xent_row_gradient_by_finite_differences(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 3);
  enum { C = 7 };
  float z[C], d[C];
  for (int trial = 0; trial < 20; trial++) {
    for (int c = 0; c < C; c++)
      z[c] = (float)(2.0 * wagma_rng_normal(&rng));
    int32_t y = (int32_t)wagma_rng_below(&rng, C);
    size_t best;
    wg_xent_row(z, C, y, 1.0, d, &best);
    for (int c = 0; c < C; c++) {
      const float keep = z[c];
      const double eps = 1e-2;
      z[c] = keep + (float)eps;
      double up = wg_xent_row(z, C, y, 1.0, NULL, &best);
      z[c] = keep - (float)eps;
      double down = wg_xent_row(z, C, y, 1.0, NULL, &best);
      z[c] = keep;
      assert_near(d[c], (up - down) / (2 * eps), 1e-4);
    }
  }
}

static void sgd_by_hand(void **state) {
  (void)state;
  /* Momentum 0.9, lr 0.1, grad 0.5, w = 1: v = 0.5, w = 0.95; then v = 0.95, w = 0.855. */
  float w = 1.0f, v = 0.0f;
  wg_sgd_momentum(&w, &v, 0.5f, 0.1f, 0.9f, 0.0f, 0);
  assert_near(w, 0.95, 1e-7);
  assert_near(v, 0.5, 1e-7);
  wg_sgd_momentum(&w, &v, 0.5f, 0.1f, 0.9f, 0.0f, 0);
  assert_near(w, 0.855, 1e-7);
  assert_near(v, 0.95, 1e-7);
  /* Nesterov: the step is g + mu v: 0.5 + 0.45 = 0.95 -> w = 0.905. */
  w = 1.0f, v = 0.0f;
  wg_sgd_momentum(&w, &v, 0.5f, 0.1f, 0.9f, 0.0f, 1);
  assert_near(w, 0.905, 1e-7);
  /* Weight decay 0.1 adds 0.1 w to the gradient: g = 0.5 + 0.2 = 0.7 at w = 2. */
  w = 2.0f, v = 0.0f;
  wg_sgd_momentum(&w, &v, 0.5f, 0.1f, 0.9f, 0.1f, 0);
  assert_near(v, 0.7, 1e-7);
  assert_near(w, 1.93, 1e-6);
  w = 2.0f;
  wg_sgd_plain(&w, 0.5f, 0.1f, 0.1f);
  assert_near(w, 1.93, 1e-6);
}

static void sgd_descends_a_quadratic(void **state) {
  (void)state;
  /* f(w) = (w - 3)^2 / 2 with gradient w - 3 (checked by finite differences): every variant
   * converges to 3. */
  for (int variant = 0; variant < 3; variant++) {
    float w = -1.0f, v = 0.0f;
    for (int t = 0; t < 300; t++) {
      double eps = 1e-3, numeric = ((w + eps - 3) * (w + eps - 3) - (w - eps - 3) * (w - eps - 3)) /
                                   (2 * eps) / 2;
      float g = w - 3.0f;
      assert_near(g, numeric, 1e-3);
      if (variant == 0)
        wg_sgd_plain(&w, g, 0.1f, 0.0f);
      else
        wg_sgd_momentum(&w, &v, g, 0.05f, 0.9f, 0.0f, variant == 2);
    }
    assert_near(w, 3.0, 1e-3);
  }
}

static void adam_by_hand(void **state) {
  (void)state;
  /* lr 0.01, betas 0.9 / 0.999, eps 1e-8. Step 1 with g = 0.5: m = 0.05, v = 0.00025,
   * m^ = 0.5, v^ = 0.25: w -= 0.01 * 0.5 / 0.5 = 0.01. */
  wg_adam_consts_t k = {.lr = 0.01f, .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f, .wd = 0.0f};
  k.c1 = (float)(1.0 / (1.0 - pow(0.9f, 1.0)));
  k.c2 = (float)(1.0 / (1.0 - pow(0.999f, 1.0)));
  float w = 1.0f, m = 0.0f, v = 0.0f;
  wg_adam(&w, &m, &v, 0.5f, &k);
  assert_near(w, 0.99, 1e-6);
  assert_near(m, 0.05, 1e-7); /* 1 - 0.9f and 1 - 0.999f are inexact in float */
  assert_near(v, 0.00025, 1e-8);
  /* Step 2 with g = -1: m = -0.055, v = 0.00124975, w = 0.99366102 (see test_optim.c). */
  k.c1 = (float)(1.0 / (1.0 - pow(0.9f, 2.0)));
  k.c2 = (float)(1.0 / (1.0 - pow(0.999f, 2.0)));
  wg_adam(&w, &m, &v, -1.0f, &k);
  assert_near(w, 0.99366102, 2e-6);
  assert_near(m, -0.055, 1e-7);
  assert_near(v, 0.00124975, 1e-7);
  /* Adam folds weight decay into g; AdamW decays w by lr * wd * w first. With a zero gradient
   * and wd 0.5 at w = 2: AdamW moves only by the decay (0.01 * 0.5 * 2 = 0.01); Adam sees
   * g = 1, whose first step is lr * 1 / (1 + eps) ~ 0.01 too, but its moments are not zero. */
  k.c1 = (float)(1.0 / (1.0 - pow(0.9f, 1.0)));
  k.c2 = (float)(1.0 / (1.0 - pow(0.999f, 1.0)));
  k.wd = 0.5f;
  k.decoupled = 1;
  w = 2.0f, m = 0.0f, v = 0.0f;
  wg_adam(&w, &m, &v, 0.0f, &k);
  assert_near(w, 1.99, 1e-6);
  assert_true(m == 0.0f && v == 0.0f);
  k.decoupled = 0;
  w = 2.0f, m = 0.0f, v = 0.0f;
  wg_adam(&w, &m, &v, 0.0f, &k);
  assert_near(w, 1.99, 1e-5);
  assert_near(m, 0.1, 1e-7); /* (1 - b1) * (wd * w) */
}

int train_elementwise_tests(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(activations_by_hand),
      cmocka_unit_test(activation_gradients_by_finite_differences),
      cmocka_unit_test(xent_row_by_hand),
      cmocka_unit_test(xent_row_gradient_by_finite_differences),
      cmocka_unit_test(sgd_by_hand),
      cmocka_unit_test(sgd_descends_a_quadratic),
      cmocka_unit_test(adam_by_hand),
  };
  return cmocka_run_group_tests_name("train/elementwise", tests, NULL, NULL);
}
