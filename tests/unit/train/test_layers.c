/* Gradient checks: every layer kernel and every whole model against central finite
 * differences. Losses are accumulated in double; tolerances are those float32 arithmetic
 * allows: |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|) per coordinate, and
 * the relative error of the whole gradient vector below rel_norm. Piecewise-linear models (ReLU,
 * max pool) may cross a kink inside +-eps: there a few coordinates may be off, the vector not. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/train/backend.h"
#include "agent/train/layers.h"
#include "agent/train/train.h"
#include "test_train.h"

typedef struct tol {
  double atol, rtol, rel_norm;
  double max_off; /* fraction of coordinates allowed outside atol/rtol (kinks), usually 0 */
} tol_t;

static void fill_normal(float *x, size_t n, double sd, wagma_rng_t *rng) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(sd * wagma_rng_normal(rng));
}

/* Values away from ReLU's kink: |x| >= 0.1. */
static void fill_away_from_zero(float *x, size_t n, wagma_rng_t *rng) {
  for (size_t i = 0; i < n; i++) {
    double v = 0.1 + wagma_rng_uniform(rng);
    x[i] = (float)(wagma_rng_next(rng) & 1 ? v : -v);
  }
}

/* Distinct values 0.05 apart in random order: no ties inside a max-pool window. */
static void fill_distinct(float *x, size_t n, wagma_rng_t *rng) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(0.05 * (double)i - 0.025 * (double)n);
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = (size_t)wagma_rng_below(rng, i + 1);
    float t = x[i];
    x[i] = x[j];
    x[j] = t;
  }
}

static double dot(const float *a, const float *b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += (double)a[i] * (double)b[i];
  return s;
}

static void compare(const char *what, const float *analytic, const double *numeric, size_t n,
                    tol_t t) {
  double diff2 = 0.0, norm2 = 0.0;
  size_t worst_at = 0, bad = 0;
  for (size_t i = 0; i < n; i++) {
    double a = analytic[i], d = fabs(a - numeric[i]);
    double allowed = t.atol + t.rtol * fmax(fabs(a), fabs(numeric[i]));
    diff2 += d * d;
    norm2 += fmax(a * a, numeric[i] * numeric[i]);
    if (d > allowed && bad++ == 0) /* report the first offender */
      worst_at = i;
  }
  double rel = norm2 > 0 ? sqrt(diff2 / norm2) : 0.0;
  if ((double)bad > t.max_off * (double)n || rel > t.rel_norm) {
    print_error("%s: %zu of %zu coordinates off (first #%zu: analytic %.6g numeric %.6g), "
                "relative error %.3g\n",
                what, bad, n, worst_at, (double)analytic[worst_at], numeric[worst_at], rel);
    fail();
  }
}

/* ------------------------------------------------------------------ dense */

typedef struct dense_ctx {
  size_t n, in, out;
  float *x, *w, *b, *y, *r;
} dense_ctx_t;

static double dense_loss(dense_ctx_t *c) {
  wg_dense_forward(wagma_backend_cpu(), c->n, c->in, c->out, c->x, c->w, c->b, c->y);
  return dot(c->y, c->r, c->n * c->out);
}

/* Numeric gradient of loss(ctx) with respect to p[0..len). */
#define NUMERIC_GRAD(loss_fn, ctx, p, len, eps, out)                                               \
  do {                                                                                             \
    for (size_t i_ = 0; i_ < (len); i_++) {                                                        \
      float keep_ = (p)[i_];                                                                       \
      (p)[i_] = keep_ + (float)(eps);                                                              \
      double up_ = loss_fn(ctx);                                                                   \
      (p)[i_] = keep_ - (float)(eps);                                                              \
      double down_ = loss_fn(ctx);                                                                 \
      (p)[i_] = keep_;                                                                             \
      (out)[i_] = (up_ - down_) / (2.0 * (eps));                                                   \
    }                                                                                              \
  } while (0)

static void dense_gradients_match_finite_differences(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 11);
  dense_ctx_t c = {.n = 3, .in = 7, .out = 5};
  float x[21], w[35], b[5], y[15], r[15], dw[35], db[5], dx[21];
  double num[35];
  c.x = x, c.w = w, c.b = b, c.y = y, c.r = r;
  fill_normal(x, 21, 1.0, &rng);
  fill_normal(w, 35, 0.5, &rng);
  fill_normal(b, 5, 0.5, &rng);
  fill_normal(r, 15, 1.0, &rng);
  dense_loss(&c);
  wg_dense_backward(wagma_backend_cpu(), c.n, c.in, c.out, x, w, r, dw, db, dx);
  const tol_t t = {1e-3, 1e-2, 1e-3, 0};
  NUMERIC_GRAD(dense_loss, &c, w, 35, 1e-2, num);
  compare("dense dw", dw, num, 35, t);
  NUMERIC_GRAD(dense_loss, &c, b, 5, 1e-2, num);
  compare("dense db", db, num, 5, t);
  NUMERIC_GRAD(dense_loss, &c, x, 21, 1e-2, num);
  compare("dense dx", dx, num, 21, t);
}

/* ------------------------------------------------------------------ convolution */

typedef struct conv_ctx {
  wg_conv_shape_t s;
  size_t n;
  float *x, *w, *b, *y, *r, *cols, *tmp;
} conv_ctx_t;

static double conv_loss(conv_ctx_t *c) {
  wg_conv_forward(&c->s, c->n, c->x, c->w, c->b, c->y, c->cols, c->tmp);
  return dot(c->y, c->r, c->n * c->s.oc * c->s.oh * c->s.ow);
}

static void check_conv(size_t n, size_t ch, size_t h, size_t w, size_t oc, size_t k, size_t pad) {
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 100 + k + pad);
  conv_ctx_t c = {.n = n};
  assert_int_equal(wg_conv_shape_init(&c.s, ch, h, w, oc, k, pad), 0);
  assert_int_equal(c.s.oh, h + 2 * pad - k + 1);
  size_t xl = n * ch * h * w, wl = oc * ch * k * k, yl = n * oc * c.s.oh * c.s.ow;
  c.x = malloc(xl * sizeof(float));
  c.w = malloc(wl * sizeof(float));
  c.b = malloc(oc * sizeof(float));
  c.y = malloc(yl * sizeof(float));
  c.r = malloc(yl * sizeof(float));
  c.cols = malloc(wg_conv_cols_len(&c.s, n) * sizeof(float));
  c.tmp = malloc(wg_conv_tmp_len(&c.s, n) * sizeof(float));
  float *dw = malloc(wl * sizeof(float)), *db = malloc(oc * sizeof(float));
  float *dx = malloc(xl * sizeof(float));
  double *num = malloc((xl > wl ? xl : wl) * sizeof(double));
  fill_normal(c.x, xl, 1.0, &rng);
  fill_normal(c.w, wl, 0.3, &rng);
  fill_normal(c.b, oc, 0.3, &rng);
  fill_normal(c.r, yl, 1.0, &rng);
  conv_loss(&c);
  wg_conv_backward(&c.s, n, c.cols, c.w, c.r, dw, db, dx, c.tmp);
  const tol_t t = {2e-3, 1e-2, 1e-3, 0};
  char what[64];
  snprintf(what, sizeof(what), "conv k%zu pad%zu dw", k, pad);
  NUMERIC_GRAD(conv_loss, &c, c.w, wl, 1e-2, num);
  compare(what, dw, num, wl, t);
  snprintf(what, sizeof(what), "conv k%zu pad%zu db", k, pad);
  NUMERIC_GRAD(conv_loss, &c, c.b, oc, 1e-2, num);
  compare(what, db, num, oc, t);
  snprintf(what, sizeof(what), "conv k%zu pad%zu dx", k, pad);
  NUMERIC_GRAD(conv_loss, &c, c.x, xl, 1e-2, num);
  compare(what, dx, num, xl, t);
  /* Without dx, the parameter gradients are the same. */
  float *dw2 = malloc(wl * sizeof(float)), db2[16];
  conv_loss(&c);
  wg_conv_backward(&c.s, n, c.cols, c.w, c.r, dw2, db2, NULL, c.tmp);
  conv_loss(&c);
  wg_conv_backward(&c.s, n, c.cols, c.w, c.r, dw, db, dx, c.tmp);
  assert_memory_equal(dw, dw2, wl * sizeof(float));
  free(dw2);
  free(c.x), free(c.w), free(c.b), free(c.y), free(c.r), free(c.cols), free(c.tmp);
  free(dw), free(db), free(dx), free(num);
}

static void conv_gradients_match_finite_differences(void **state) {
  (void)state;
  check_conv(2, 2, 6, 5, 3, 3, 1); /* non-square input, padding */
  check_conv(2, 3, 7, 7, 2, 3, 0); /* no padding */
  check_conv(1, 1, 8, 8, 4, 5, 2); /* LeNet's first layer shape, smaller */
}

/* ------------------------------------------------------------------ pooling */

typedef struct pool_ctx {
  wg_pool_shape_t s;
  int mode;
  size_t n;
  float *x, *y, *r;
  int32_t *argmax;
} pool_ctx_t;

static double pool_loss(pool_ctx_t *c) {
  wg_pool_forward(&c->s, c->mode, c->n, c->x, c->y, c->argmax);
  return dot(c->y, c->r, c->n * c->s.c * c->s.oh * c->s.ow);
}

static void pool_gradients_match_finite_differences(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 21);
  for (int mode = WAGMA_POOL_MAX; mode <= WAGMA_POOL_AVG; mode++) {
    pool_ctx_t c = {.mode = mode, .n = 2};
    assert_int_equal(wg_pool_shape_init(&c.s, 3, 5, 6, 2), 0); /* odd rows: floor tail */
    assert_int_equal(c.s.oh, 2);
    assert_int_equal(c.s.ow, 3);
    enum { XL = 2 * 3 * 5 * 6, YL = 2 * 3 * 2 * 3 };
    float x[XL], y[YL], r[YL], dx[XL];
    int32_t argmax[YL];
    double num[XL];
    c.x = x, c.y = y, c.r = r, c.argmax = argmax;
    fill_distinct(x, XL, &rng);
    fill_normal(r, YL, 1.0, &rng);
    pool_loss(&c);
    wg_pool_backward(&c.s, mode, c.n, r, argmax, dx);
    NUMERIC_GRAD(pool_loss, &c, x, XL, 1e-2, num);
    compare(mode == WAGMA_POOL_MAX ? "max pool dx" : "avg pool dx", dx, num, XL,
            (tol_t){1e-3, 1e-2, 1e-3, 0});
  }
}

/* ------------------------------------------------------------------ activations */

typedef struct act_ctx {
  int fn;
  size_t len;
  float *x, *y, *r;
} act_ctx_t;

static double act_loss(act_ctx_t *c) {
  wg_act_forward(c->fn, c->len, c->x, c->y);
  return dot(c->y, c->r, c->len);
}

static void activation_gradients_match_finite_differences(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 31);
  for (int fn = WAGMA_ACT_RELU; fn <= WAGMA_ACT_TANH; fn++) {
    enum { L = 40 };
    float x[L], y[L], r[L], dx[L];
    double num[L];
    act_ctx_t c = {.fn = fn, .len = L, .x = x, .y = y, .r = r};
    fill_away_from_zero(x, L, &rng);
    fill_normal(r, L, 1.0, &rng);
    act_loss(&c);
    wg_act_backward(fn, L, y, r, dx);
    NUMERIC_GRAD(act_loss, &c, x, L, 1e-3, num);
    compare(fn == WAGMA_ACT_RELU ? "relu dx" : "tanh dx", dx, num, L, (tol_t){1e-3, 1e-2, 1e-3, 0});
  }
}

/* ------------------------------------------------------------------ softmax cross-entropy */

typedef struct xent_ctx {
  size_t n, classes;
  float *z;
  int32_t *y;
} xent_ctx_t;

static double xent_loss(xent_ctx_t *c) {
  return wg_softmax_xent(c->n, c->classes, c->z, c->y, NULL, NULL);
}

static void softmax_xent_gradient_and_value(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 41);
  enum { N = 4, C = 6 };
  float z[N * C], dz[N * C];
  int32_t y[N] = {0, 5, 2, 2};
  double num[N * C];
  fill_normal(z, N * C, 2.0, &rng);
  xent_ctx_t c = {N, C, z, y};
  size_t correct = 0;
  double loss = wg_softmax_xent(N, C, z, y, dz, &correct);
  /* The value against the definition, computed here independently. */
  double expect = 0.0;
  size_t expect_correct = 0;
  for (size_t i = 0; i < N; i++) {
    double s = 0.0;
    size_t best = 0;
    for (size_t k = 0; k < C; k++) {
      s += exp(z[i * C + k]);
      if (z[i * C + k] > z[i * C + best])
        best = k;
    }
    expect += -log(exp(z[i * C + y[i]]) / s) / N;
    expect_correct += best == (size_t)y[i];
  }
  assert_true(fabs(loss - expect) < 1e-9 * fmax(1.0, expect));
  assert_int_equal(correct, expect_correct);
  NUMERIC_GRAD(xent_loss, &c, z, N * C, 1e-3, num);
  compare("softmax-xent dlogits", dz, num, N * C, (tol_t){1e-4, 1e-2, 1e-3, 0});
  /* Huge logits stay finite. */
  for (size_t i = 0; i < N * C; i++)
    z[i] = (float)(i % 2 ? 1e4 : -1e4);
  loss = wg_softmax_xent(N, C, z, y, dz, NULL);
  assert_true(isfinite(loss));
  for (size_t i = 0; i < N * C; i++)
    assert_true(isfinite(dz[i]));
}

/* ------------------------------------------------------------------ whole models */

typedef struct model_ctx {
  wagma_model_t *m;
  float *x;
  int32_t *y;
  size_t n;
} model_ctx_t;

static double model_loss(model_ctx_t *c) {
  wagma_eval_t e;
  assert_int_equal(wagma_model_forward(c->m, c->x, c->y, c->n, &e), 0);
  return e.loss;
}

/* Checks `samples` coordinates of the model gradient (all when the model is smaller), plus
 * the first and last ones. Coordinates where the loss has a kink within eps (ReLU, max pool:
 * the one-sided slopes disagree) are skipped; at most 10% may be. */
static void check_model(const char *spec, size_t rows, size_t n, size_t samples, double eps,
                        tol_t t) {
  char err[256] = "";
  wagma_model_config_t cfg;
  assert_int_equal(wagma_model_config_parse(spec, &cfg, err, sizeof(err)), 0);
  cfg.rows = cfg.cols = rows;
  cfg.max_batch = n;
  model_ctx_t c = {.n = n};
  int rc = wagma_model_create(&cfg, &c.m, err, sizeof(err));
  if (rc)
    print_error("%s: %s\n", spec, err);
  assert_int_equal(rc, 0);
  wagma_model_init(c.m, 5);
  size_t P = wagma_model_param_count(c.m), F = rows * rows;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 77);
  c.x = malloc(n * F * sizeof(float));
  c.y = malloc(n * sizeof(int32_t));
  fill_normal(c.x, n * F, 1.0, &rng);
  for (size_t i = 0; i < n; i++)
    c.y[i] = (int32_t)wagma_rng_below(&rng, 10);
  /* Biases start at zero, which puts ReLU units of a bias-only input on their kink: move them. */
  float *p = wagma_model_params(c.m);
  for (size_t i = 0; i < P; i++)
    p[i] += (float)(0.01 * wagma_rng_normal(&rng));
  model_loss(&c);
  assert_int_equal(wagma_model_backward(c.m), 0);
  assert_int_equal(wagma_model_backward(c.m), WAGMA_EINVAL); /* once per forward */
  const float *g = wagma_model_grads(c.m);
  size_t count = samples < P ? samples : P;
  float *analytic = calloc(count, sizeof(float));
  double *numeric = calloc(count, sizeof(double));
  size_t kept = 0, skipped = 0;
  for (size_t s = 0; s < count; s++) {
    size_t i = count == P ? s : s == 0 ? 0 : s == 1 ? P - 1 : (size_t)wagma_rng_below(&rng, P);
    float keep = p[i];
    double f0 = model_loss(&c);
    p[i] = keep + (float)eps;
    double up = model_loss(&c);
    p[i] = keep - (float)eps;
    double down = model_loss(&c);
    p[i] = keep;
    double slope_up = (up - f0) / eps, slope_down = (f0 - down) / eps;
    double central = (up - down) / (2 * eps);
    if (fabs(slope_up - slope_down) > 10 * (t.atol + t.rtol * fabs(central)) + 50 * eps) {
      skipped++;
      continue;
    }
    analytic[kept] = g[i];
    numeric[kept++] = central;
  }
  char what[128];
  snprintf(what, sizeof(what), "%s (%zux%zu, %zu params) gradient", spec, rows, rows, P);
  compare(what, analytic, numeric, kept, t);
  if (skipped * 10 > count) {
    print_error("%s: %zu of %zu coordinates at a kink\n", what, skipped, count);
    fail();
  }
  free(analytic), free(numeric), free(c.x), free(c.y);
  wagma_model_destroy(c.m);
}

static void softmax_model_gradient(void **state) {
  (void)state;
  check_model("softmax", 28, 3, 400, 1e-2, (tol_t){2e-4, 2e-2, 1e-2, 0});
}

static void mlp_model_gradient(void **state) {
  (void)state;
  check_model("mlp:16-8,tanh", 28, 3, 400, 1e-2, (tol_t){2e-4, 2e-2, 1e-2, 0});
  /* ReLU (and max pool below): eps small enough to cross few kinks, large enough for float
   * rounding; a few coordinates may then be off, the whole vector may not. */
  check_model("mlp:16-8", 28, 3, 400, 1e-3, (tol_t){2e-4, 2e-2, 1e-2, 0.05});
  check_model("mlp", 28, 2, 300, 1e-3, (tol_t){2e-4, 2e-2, 1e-2, 0.05});
}

static void lenet5_model_gradient(void **state) {
  (void)state;
  /* All parameters of the smallest LeNet-5 (12x12), a sample of the 28x28 one. */
  check_model("lenet5,tanh,avgpool", 12, 2, 100000, 1e-2, (tol_t){2e-4, 2e-2, 1e-2, 0});
  check_model("lenet5,tanh,avgpool", 28, 2, 300, 1e-2, (tol_t){2e-4, 2e-2, 1e-2, 0});
  check_model("lenet5", 28, 2, 300, 1e-3, (tol_t){2e-4, 2e-2, 1e-2, 0.05});
}

int train_layer_tests(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dense_gradients_match_finite_differences),
      cmocka_unit_test(conv_gradients_match_finite_differences),
      cmocka_unit_test(pool_gradients_match_finite_differences),
      cmocka_unit_test(activation_gradients_match_finite_differences),
      cmocka_unit_test(softmax_xent_gradient_and_value),
      cmocka_unit_test(softmax_model_gradient),
      cmocka_unit_test(mlp_model_gradient),
      cmocka_unit_test(lenet5_model_gradient),
  };
  return cmocka_run_group_tests_name("train/layers", tests, NULL, NULL);
}
