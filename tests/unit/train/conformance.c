/* The conformance suite of a device backend against the CPU backend: every operation of the
 * table on random inputs, forward and backward, whole models, 300 training steps from one
 * seed, and device-independent checkpoints. It runs twice:
 *   - in test_train (label unit, every machine) against "cuda-emu" (emu_backend.c), the CUDA
 *     backend's algorithm on the host: layouts, GEMM mapping, kernel bodies, reductions;
 *   - in test_train_gpu (label gpu) against the real CUDA backend, where a GPU is present.
 *
 * Tolerances (errors relative to the largest magnitude of the CPU's result, "scaled", unless
 * said otherwise; every comparison prints its measured maximum error, so a GPU run also
 * calibrates them):
 *   - memory ops, staging (two alternating slots) and the snapshot download: exact;
 *   - GEMM (all transposes), bias gradient, dense and convolution layers (several shapes,
 *     LeNet's included): 2e-5 scaled (float32 sums in different orders);
 *   - bias broadcast, pooling (values and arg-max, ties included), ReLU: exact; tanh: 4e-7
 *     scaled (device tanhf vs glibc, a few ulp);
 *   - softmax cross-entropy: loss 1e-12 relative, d logits 1e-6 scaled, correct count exact;
 *   - SGD / Adam / AdamW: 1e-6 relative per element (the kernels are built with -fmad=false,
 *     the same float operations as the CPU's, so usually exact);
 *   - whole models (softmax, MLP, LeNet-5 with ReLU/max pool and tanh/avg pool): loss 1e-5
 *     relative, gradient 1e-4 relative norm;
 *   - 300 training steps from the same seed and batches (MLP with SGD + Nesterov + weight
 *     decay, LeNet-5 with Adam; 100 LeNet-5 steps on the slow host emulation): per step |loss_dev -
 * loss_cpu| <= 0.02 + 0.02 loss_cpu, mean over the run <= 0.005, test accuracy within 0.02;
 *   - checkpoints: the device model's checkpoint loads into a CPU model and the CPU writes the
 *     same bytes back, and the other way round. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/train/backend.h"
#include "agent/train/train.h"
#include "test_train.h"

static wagma_backend_t *dev; /* the backend under test */
static wagma_backend_t *cpu;

/* ------------------------------------------------------------------ helpers */

static float *rand_host(size_t n, double sd, wagma_rng_t *rng) {
  float *h = malloc((n ? n : 1) * sizeof(float));
  assert_non_null(h);
  for (size_t i = 0; i < n; i++)
    h[i] = (float)(sd * wagma_rng_normal(rng));
  return h;
}

static void *to_gpu(const void *h, size_t bytes) {
  void *d = dev->ops->alloc(dev, bytes);
  assert_non_null(d);
  assert_int_equal(dev->ops->upload(dev, d, h, bytes), 0);
  return d;
}

static void *from_gpu(const void *d, size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  assert_non_null(h);
  int rc = dev->ops->download(dev, h, d, bytes);
  if (rc)
    print_error("download: %s\n", wagma_backend_error(dev));
  assert_int_equal(rc, 0);
  return h;
}

static float *cpu_buf(size_t n) {
  float *h = calloc(n ? n : 1, sizeof(float));
  assert_non_null(h);
  return h;
}

/* |g - c| <= tol * max|c| for every element ("scaled"); prints the measured error. */
static void compare_scaled(const char *what, const float *c, const float *g, size_t n, double tol) {
  double scale = 0.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++)
    scale = fmax(scale, fabs(c[i]));
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)g[i] - (double)c[i]);
    if (!(d <= worst)) { /* NaN counts as worst */
      worst = d;
      at = i;
    }
  }
  double rel = scale > 0 ? worst / scale : worst;
  print_message("  %-40s n %-8zu max |dev-cpu| %.3g, scaled %.3g (tolerance %.1g)\n", what, n,
                worst, rel, tol);
  if (!(rel <= tol) || isnan(worst)) {
    print_error("%s: element %zu: cpu %.9g dev %.9g\n", what, at, (double)c[at], (double)g[at]);
    fail();
  }
}

/* |g - c| <= tol * |c| per element (0 = exactly equal). */
static void compare_rel(const char *what, const float *c, const float *g, size_t n, double tol) {
  double worst = 0.0;
  size_t at = 0, off = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)g[i] - (double)c[i]), r = d / fmax(fabs(c[i]), 1e-30);
    if (d == 0.0)
      r = 0.0;
    if (!(r <= worst)) {
      worst = r;
      at = i;
    }
    off += !(r <= tol);
  }
  print_message("  %-40s n %-8zu max relative error %.3g (tolerance %.1g)\n", what, n, worst, tol);
  if (off) {
    print_error("%s: %zu elements off; element %zu: cpu %.9g dev %.9g\n", what, off, at,
                (double)c[at], (double)g[at]);
    fail();
  }
}

/* ------------------------------------------------------------------ memory, staging, snapshot */

static void memory_staging_and_snapshot(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 1);
  const size_t n = 100003; /* not a multiple of anything */
  float *h = rand_host(n, 1.0, &rng);
  float *d = dev->ops->alloc(dev, n * sizeof(float));
  float *z = from_gpu(d, n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    assert_true(z[i] == 0.0f); /* alloc zeroes */
  free(z);
  assert_int_equal(dev->ops->upload(dev, d, h, n * sizeof(float)), 0);
  float *d2 = dev->ops->alloc(dev, n * sizeof(float));
  dev->ops->copy(dev, d2, d, n * sizeof(float));
  float *back = from_gpu(d2, n * sizeof(float));
  assert_memory_equal(back, h, n * sizeof(float));
  free(back);
  dev->ops->zero(dev, d2, n * sizeof(float) / 2);
  back = from_gpu(d2, n * sizeof(float));
  assert_true(back[0] == 0.0f && back[n / 2 - 1] == 0.0f && back[n - 1] == h[n - 1]);
  free(back);

  /* Staging: batches alternate between two slots; each comes back as given, also when the
   * next one is staged before the device read the previous one. */
  wg_stager_t *st = dev->ops->stager_create(dev, 4096, 64);
  assert_non_null(st);
  int32_t lab[64];
  for (int round = 0; round < 5; round++) {
    const float *sx[2];
    const int32_t *sy[2];
    for (int k = 0; k < 2; k++) {
      for (int i = 0; i < 64; i++)
        lab[i] = round * 100 + k * 10 + i;
      assert_int_equal(dev->ops->stage(dev, st, h + (size_t)(round * 2 + k) * 4096, 4096, lab, 64,
                                       &sx[k], &sy[k]),
                       0);
    }
    for (int k = 0; k < 2; k++) {
      float *gx = from_gpu(sx[k], 4096 * sizeof(float));
      int32_t *gy = from_gpu(sy[k], 64 * sizeof(int32_t));
      assert_memory_equal(gx, h + (size_t)(round * 2 + k) * 4096, 4096 * sizeof(float));
      assert_int_equal(gy[5], round * 100 + k * 10 + 5);
      free(gx);
      free(gy);
    }
  }
  assert_int_equal(dev->ops->stage(dev, st, h, 4097, lab, 64, NULL, NULL), WAGMA_ERANGE);
  dev->ops->stager_destroy(dev, st);

  /* Snapshot: download_async copies the state after the work queued before it, even when an
   * optimizer update of the same buffer is queued right after it. */
  float *snap = wagma_backend_host_alloc(dev, n * sizeof(float));
  float *g = to_gpu(h, n * sizeof(float));
  assert_non_null(snap);
  for (int round = 0; round < 3; round++) {
    float *before = from_gpu(d, n * sizeof(float));
    assert_int_equal(dev->ops->download_async(dev, snap, d, n * sizeof(float)), 0);
    for (int k = 0; k < 20; k++) /* d -= 0.5 * g, queued behind the copy */
      dev->ops->sgd(dev, n, d, g, NULL, 0.5f, 0.0f, 0.0f, 0);
    assert_int_equal(dev->ops->download_wait(dev), 0);
    assert_memory_equal(snap, before, n * sizeof(float));
    float *after = from_gpu(d, n * sizeof(float));
    assert_memory_not_equal(after, before, n * sizeof(float));
    free(before);
    free(after);
  }
  wagma_backend_host_free(dev, snap);
  dev->ops->free(dev, g);
  dev->ops->free(dev, d);
  dev->ops->free(dev, d2);
  free(h);
  assert_int_equal(wagma_backend_sync(dev), 0);
}

/* ------------------------------------------------------------------ GEMM and bias */

static void gemm_and_bias_ops(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 2);
  const size_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 256, 784}, {513, 10, 129}, {3, 700, 1}};
  for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        size_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        size_t lda = ta ? M : K, ldb = tb ? K : N;
        float *a = rand_host(M * K, 1.0, &rng), *b = rand_host(K * N, 1.0, &rng);
        float *c = rand_host(M * N, 1.0, &rng);
        float *da = to_gpu(a, M * K * 4), *db = to_gpu(b, K * N * 4), *dc = to_gpu(c, M * N * 4);
        cpu->ops->gemm(cpu, ta, tb, M, N, K, 0.75f, a, lda, b, ldb, 0.5f, c, N);
        dev->ops->gemm(dev, ta, tb, M, N, K, 0.75f, da, lda, db, ldb, 0.5f, dc, N);
        float *gc = from_gpu(dc, M * N * 4);
        char what[80];
        snprintf(what, sizeof(what), "gemm %zux%zux%zu %c%c", M, N, K, ta ? 'T' : 'N',
                 tb ? 'T' : 'N');
        compare_scaled(what, c, gc, M * N, 2e-5);
        free(a), free(b), free(c), free(gc);
        dev->ops->free(dev, da), dev->ops->free(dev, db), dev->ops->free(dev, dc);
      }
  /* bias broadcast (exact) and bias gradient (a sum: 2e-5 scaled) */
  const size_t n = 4096, out = 84;
  float *bias = rand_host(out, 1.0, &rng), *dy = rand_host(n * out, 1.0, &rng);
  float *y = cpu_buf(n * out), *dbias = cpu_buf(out);
  float *gbias = to_gpu(bias, out * 4), *gdy = to_gpu(dy, n * out * 4);
  float *gy = dev->ops->alloc(dev, n * out * 4), *gdb = dev->ops->alloc(dev, out * 4);
  cpu->ops->bias_rows(cpu, n, out, bias, y);
  dev->ops->bias_rows(dev, n, out, gbias, gy);
  cpu->ops->bias_grad(cpu, n, out, dy, dbias);
  dev->ops->bias_grad(dev, n, out, gdy, gdb);
  float *hy = from_gpu(gy, n * out * 4), *hdb = from_gpu(gdb, out * 4);
  compare_rel("bias_rows", y, hy, n * out, 0.0);
  compare_scaled("bias_grad", dbias, hdb, out, 2e-5);
  free(bias), free(dy), free(y), free(dbias), free(hy), free(hdb);
  dev->ops->free(dev, gbias), dev->ops->free(dev, gdy), dev->ops->free(dev, gy);
  dev->ops->free(dev, gdb);
  /* dense layer, composed of the above, both directions */
  const size_t in = 300, o2 = 70, nb = 33;
  float *x = rand_host(nb * in, 1.0, &rng), *w = rand_host(o2 * in, 0.1, &rng);
  float *b2 = rand_host(o2, 0.1, &rng), *r = rand_host(nb * o2, 1.0, &rng);
  float *cy = cpu_buf(nb * o2), *cdw = cpu_buf(o2 * in), *cdb = cpu_buf(o2),
        *cdx = cpu_buf(nb * in);
  float *gx = to_gpu(x, nb * in * 4), *gw = to_gpu(w, o2 * in * 4), *gb = to_gpu(b2, o2 * 4);
  float *gr = to_gpu(r, nb * o2 * 4), *gy2 = dev->ops->alloc(dev, nb * o2 * 4);
  float *gdw = dev->ops->alloc(dev, o2 * in * 4), *gdb2 = dev->ops->alloc(dev, o2 * 4);
  float *gdx = dev->ops->alloc(dev, nb * in * 4);
  wg_dense_forward(cpu, nb, in, o2, x, w, b2, cy);
  wg_dense_forward(dev, nb, in, o2, gx, gw, gb, gy2);
  wg_dense_backward(cpu, nb, in, o2, x, w, r, cdw, cdb, cdx);
  wg_dense_backward(dev, nb, in, o2, gx, gw, gr, gdw, gdb2, gdx);
  float *h1 = from_gpu(gy2, nb * o2 * 4), *h2 = from_gpu(gdw, o2 * in * 4);
  float *h3 = from_gpu(gdb2, o2 * 4), *h4 = from_gpu(gdx, nb * in * 4);
  compare_scaled("dense forward y", cy, h1, nb * o2, 2e-5);
  compare_scaled("dense backward dw", cdw, h2, o2 * in, 2e-5);
  compare_scaled("dense backward db", cdb, h3, o2, 2e-5);
  compare_scaled("dense backward dx", cdx, h4, nb * in, 2e-5);
  free(x), free(w), free(b2), free(r), free(cy), free(cdw), free(cdb), free(cdx);
  free(h1), free(h2), free(h3), free(h4);
  dev->ops->free(dev, gx), dev->ops->free(dev, gw), dev->ops->free(dev, gb);
  dev->ops->free(dev, gr), dev->ops->free(dev, gy2), dev->ops->free(dev, gdw);
  dev->ops->free(dev, gdb2), dev->ops->free(dev, gdx);
  assert_int_equal(wagma_backend_sync(dev), 0);
}

/* ------------------------------------------------------------------ convolution */

static void check_conv(size_t n, size_t c, size_t h, size_t w, size_t oc, size_t k, size_t pad,
                       wagma_rng_t *rng) {
  wg_conv_shape_t s;
  assert_int_equal(wg_conv_shape_init(&s, c, h, w, oc, k, pad), 0);
  size_t xl = n * c * h * w, wl = oc * c * k * k, yl = n * oc * s.oh * s.ow;
  float *x = rand_host(xl, 1.0, rng), *wt = rand_host(wl, 0.3, rng), *b = rand_host(oc, 0.3, rng);
  float *dy = rand_host(yl, 1.0, rng);
  float *y = cpu_buf(yl), *dw = cpu_buf(wl), *db = cpu_buf(oc), *dx = cpu_buf(xl);
  float *cols = cpu_buf(cpu->ops->conv_cols_len(&s, n)),
        *tmp = cpu_buf(cpu->ops->conv_tmp_len(&s, n));
  cpu->ops->conv_forward(cpu, &s, n, x, wt, b, y, cols, tmp);
  cpu->ops->conv_backward(cpu, &s, n, cols, wt, dy, dw, db, dx, tmp);
  float *gx = to_gpu(x, xl * 4), *gw = to_gpu(wt, wl * 4), *gb = to_gpu(b, oc * 4);
  float *gdy = to_gpu(dy, yl * 4), *gy = dev->ops->alloc(dev, yl * 4);
  float *gdw = dev->ops->alloc(dev, wl * 4), *gdb = dev->ops->alloc(dev, oc * 4);
  float *gdx = dev->ops->alloc(dev, xl * 4);
  float *gcols = dev->ops->alloc(dev, dev->ops->conv_cols_len(&s, n) * 4);
  float *gtmp = dev->ops->alloc(dev, dev->ops->conv_tmp_len(&s, n) * 4);
  assert_non_null(gcols);
  assert_non_null(gtmp);
  dev->ops->conv_forward(dev, &s, n, gx, gw, gb, gy, gcols, gtmp);
  dev->ops->conv_backward(dev, &s, n, gcols, gw, gdy, gdw, gdb, gdx, gtmp);
  float *hy = from_gpu(gy, yl * 4), *hdw = from_gpu(gdw, wl * 4), *hdb = from_gpu(gdb, oc * 4);
  float *hdx = from_gpu(gdx, xl * 4);
  char what[96];
  snprintf(what, sizeof(what), "conv n%zu %zux%zux%zu oc%zu k%zu p%zu y", n, c, h, w, oc, k, pad);
  compare_scaled(what, y, hy, yl, 2e-5);
  what[strlen(what) - 1] = '\0';
  strcat(what, "dw");
  compare_scaled(what, dw, hdw, wl, 2e-5);
  what[strlen(what) - 2] = '\0';
  strcat(what, "db");
  compare_scaled(what, db, hdb, oc, 2e-5);
  what[strlen(what) - 2] = '\0';
  strcat(what, "dx");
  compare_scaled(what, dx, hdx, xl, 2e-5);
  /* Without dx the parameter gradients are the same. */
  dev->ops->conv_backward(dev, &s, n, gcols, gw, gdy, gdw, gdb, NULL, gtmp);
  float *hdw2 = from_gpu(gdw, wl * 4);
  assert_memory_equal(hdw, hdw2, wl * 4);
  free(hdw2);
  free(x), free(wt), free(b), free(dy), free(y), free(dw), free(db), free(dx), free(cols);
  free(tmp), free(hy), free(hdw), free(hdb), free(hdx);
  dev->ops->free(dev, gx), dev->ops->free(dev, gw), dev->ops->free(dev, gb);
  dev->ops->free(dev, gdy), dev->ops->free(dev, gy), dev->ops->free(dev, gdw);
  dev->ops->free(dev, gdb), dev->ops->free(dev, gdx), dev->ops->free(dev, gcols);
  dev->ops->free(dev, gtmp);
}

static void conv_ops(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 3);
  check_conv(2, 2, 6, 5, 3, 3, 1, &rng);     /* non-square, padding */
  check_conv(3, 3, 7, 7, 2, 3, 0, &rng);     /* no padding */
  check_conv(64, 1, 28, 28, 6, 5, 2, &rng);  /* LeNet-5 conv 1 */
  check_conv(64, 6, 14, 14, 16, 5, 0, &rng); /* LeNet-5 conv 2 */
  check_conv(1, 1, 5, 5, 1, 5, 0, &rng);     /* one output pixel */
  assert_int_equal(wagma_backend_sync(dev), 0);
}

/* ------------------------------------------------------------------ pooling, activations */

static void pool_and_activation_ops(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 4);
  for (int mode = WAGMA_POOL_MAX; mode <= WAGMA_POOL_AVG; mode++) {
    wg_pool_shape_t s;
    assert_int_equal(wg_pool_shape_init(&s, 6, 29, 28, 2), 0); /* odd rows: a floor tail */
    const size_t n = 17, xl = n * 6 * 29 * 28, yl = n * 6 * s.oh * s.ow;
    float *x = rand_host(xl, 1.0, &rng), *dy = rand_host(yl, 1.0, &rng);
    for (size_t i = 0; i < xl; i += 7)
      x[i] = x[i + 1 < xl ? i + 1 : i]; /* ties inside windows: the first maximum wins */
    float *y = cpu_buf(yl), *dx = cpu_buf(xl);
    int32_t *am = calloc(yl, sizeof(int32_t));
    cpu->ops->pool_forward(cpu, &s, mode, n, x, y, am);
    cpu->ops->pool_backward(cpu, &s, mode, n, dy, am, dx);
    float *gx = to_gpu(x, xl * 4), *gdy = to_gpu(dy, yl * 4), *gy = dev->ops->alloc(dev, yl * 4);
    float *gdx = dev->ops->alloc(dev, xl * 4);
    int32_t *gam = dev->ops->alloc(dev, yl * 4);
    dev->ops->pool_forward(dev, &s, mode, n, gx, gy, gam);
    dev->ops->pool_backward(dev, &s, mode, n, gdy, gam, gdx);
    float *hy = from_gpu(gy, yl * 4), *hdx = from_gpu(gdx, xl * 4);
    compare_rel(mode == WAGMA_POOL_MAX ? "max pool y" : "avg pool y", y, hy, yl, 0.0);
    compare_rel(mode == WAGMA_POOL_MAX ? "max pool dx" : "avg pool dx", dx, hdx, xl, 0.0);
    if (mode == WAGMA_POOL_MAX) {
      int32_t *ham = from_gpu(gam, yl * 4);
      assert_memory_equal(am, ham, yl * 4);
      free(ham);
    }
    free(x), free(dy), free(y), free(dx), free(am), free(hy), free(hdx);
    dev->ops->free(dev, gx), dev->ops->free(dev, gdy), dev->ops->free(dev, gy);
    dev->ops->free(dev, gdx), dev->ops->free(dev, gam);
  }
  for (int fn = WAGMA_ACT_RELU; fn <= WAGMA_ACT_TANH; fn++) {
    const size_t len = 300001;
    float *x = rand_host(len, 2.0, &rng), *dy = rand_host(len, 1.0, &rng);
    float *y = cpu_buf(len), *dx = cpu_buf(len);
    cpu->ops->act_forward(cpu, fn, len, x, y);
    cpu->ops->act_backward(cpu, fn, len, y, dy, dx);
    float *gx = to_gpu(x, len * 4), *gdy = to_gpu(dy, len * 4);
    float *gy = dev->ops->alloc(dev, len * 4), *gdx = dev->ops->alloc(dev, len * 4);
    dev->ops->act_forward(dev, fn, len, gx, gy);
    /* backward from the CPU's y, so that the comparison is of the gradient formula alone */
    float *gyc = to_gpu(y, len * 4);
    dev->ops->act_backward(dev, fn, len, gyc, gdy, gdx);
    float *hy = from_gpu(gy, len * 4), *hdx = from_gpu(gdx, len * 4);
    if (fn == WAGMA_ACT_RELU) {
      compare_rel("relu y", y, hy, len, 0.0);
      compare_rel("relu dx", dx, hdx, len, 0.0);
    } else {
      compare_scaled("tanh y (device tanhf vs glibc)", y, hy, len, 4e-7);
      compare_rel("tanh dx", dx, hdx, len, 1e-6);
    }
    free(x), free(dy), free(y), free(dx), free(hy), free(hdx);
    dev->ops->free(dev, gx), dev->ops->free(dev, gdy), dev->ops->free(dev, gy);
    dev->ops->free(dev, gdx), dev->ops->free(dev, gyc);
  }
  assert_int_equal(wagma_backend_sync(dev), 0);
}

/* ------------------------------------------------------------------ loss, optimizers */

static void softmax_xent_and_optimizer_ops(void **state) {
  (void)state;
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 5);
  const size_t sizes[] = {1, 64, 4096};
  for (size_t k = 0; k < 3; k++) {
    const size_t n = sizes[k], classes = 10;
    float *z = rand_host(n * classes, 3.0, &rng), *d = cpu_buf(n * classes);
    int32_t *y = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
      y[i] = (int32_t)wagma_rng_below(&rng, classes);
    double closs, gloss;
    size_t ccorrect, gcorrect;
    assert_int_equal(cpu->ops->softmax_xent(cpu, n, classes, z, y, d, &closs, &ccorrect), 0);
    float *gz = to_gpu(z, n * classes * 4), *gd = dev->ops->alloc(dev, n * classes * 4);
    int32_t *gyl = to_gpu(y, n * 4);
    assert_int_equal(dev->ops->softmax_xent(dev, n, classes, gz, gyl, gd, &gloss, &gcorrect), 0);
    float *hd = from_gpu(gd, n * classes * 4);
    print_message("  softmax_xent n %-5zu loss cpu %.15g dev %.15g\n", n, closs, gloss);
    assert_true(fabs(gloss - closs) <= 1e-12 * fabs(closs));
    assert_int_equal(gcorrect, ccorrect);
    compare_scaled("softmax_xent dlogits", d, hd, n * classes, 1e-6);
    free(z), free(d), free(y), free(hd);
    dev->ops->free(dev, gz), dev->ops->free(dev, gd), dev->ops->free(dev, gyl);
  }
  /* Optimizers: 5 steps of each variant over a buffer, from the same state. */
  const size_t n = 65537;
  for (int variant = 0; variant < 6; variant++) {
    float *w = rand_host(n, 1.0, &rng), *g = rand_host(n, 1.0, &rng);
    float *m = cpu_buf(n), *v = cpu_buf(n);
    float *gw = to_gpu(w, n * 4), *gg = to_gpu(g, n * 4), *gm = to_gpu(m, n * 4);
    float *gv = to_gpu(v, n * 4);
    const char *name = "";
    for (int step = 1; step <= 5; step++) {
      if (variant < 3) { /* plain, momentum, nesterov */
        name = variant == 0   ? "sgd plain + wd"
               : variant == 1 ? "sgd momentum + wd"
                              : "sgd nesterov";
        cpu->ops->sgd(cpu, n, w, g, variant ? v : NULL, 0.05f, 0.9f, 1e-3f, variant == 2);
        dev->ops->sgd(dev, n, gw, gg, variant ? gv : NULL, 0.05f, 0.9f, 1e-3f, variant == 2);
      } else {
        name = variant == 3 ? "adam" : variant == 4 ? "adam + wd (L2)" : "adamw";
        wg_adam_consts_t c = {.lr = 1e-3f,
                              .b1 = 0.9f,
                              .b2 = 0.999f,
                              .eps = 1e-8f,
                              .wd = variant == 3 ? 0.0f : 0.01f,
                              .decoupled = variant == 5};
        c.c1 = (float)(1.0 / (1.0 - pow(0.9f, step)));
        c.c2 = (float)(1.0 / (1.0 - pow(0.999f, step)));
        cpu->ops->adam(cpu, n, w, g, m, v, &c);
        dev->ops->adam(dev, n, gw, gg, gm, gv, &c);
      }
    }
    float *hw = from_gpu(gw, n * 4), *hm = from_gpu(gm, n * 4), *hv = from_gpu(gv, n * 4);
    char what[64];
    snprintf(what, sizeof(what), "%s w", name);
    compare_rel(what, w, hw, n, 1e-6);
    if (variant) {
      snprintf(what, sizeof(what), "%s state", name);
      compare_rel(what, variant >= 3 ? m : v, variant >= 3 ? hm : hv, n, 1e-6);
      if (variant >= 3)
        compare_rel("adam second moment", v, hv, n, 1e-6);
    }
    free(w), free(g), free(m), free(v), free(hw), free(hm), free(hv);
    dev->ops->free(dev, gw), dev->ops->free(dev, gg), dev->ops->free(dev, gm);
    dev->ops->free(dev, gv);
  }
  assert_int_equal(wagma_backend_sync(dev), 0);
}

/* ------------------------------------------------------------------ whole models */

static wagma_model_t *model_on(wagma_backend_t *b, const char *spec, size_t max_batch,
                               uint64_t seed) {
  wagma_model_config_t cfg;
  wagma_model_t *m = NULL;
  char err[256];
  assert_int_equal(wagma_model_config_parse(spec, &cfg, err, sizeof(err)), 0);
  cfg.max_batch = max_batch;
  int rc = wagma_model_create_on(b, &cfg, &m, err, sizeof(err));
  if (rc)
    print_error("%s on %s: %s\n", spec, wagma_backend_name(b), err);
  assert_int_equal(rc, 0);
  wagma_model_init(m, seed);
  return m;
}

static void models_forward_backward(void **state) {
  (void)state;
  const char *specs[] = {"softmax", "mlp", "mlp:64-32,tanh", "lenet5", "lenet5,tanh,avgpool"};
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 6);
  const size_t n = 128, F = 784;
  float *x = rand_host(n * F, 1.0, &rng);
  int32_t y[128];
  for (size_t i = 0; i < n; i++)
    y[i] = (int32_t)wagma_rng_below(&rng, 10);
  for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++) {
    wagma_model_t *mc = model_on(cpu, specs[k], n, 9), *mg = model_on(dev, specs[k], n, 9);
    size_t P = wagma_model_param_count(mc);
    float *pc = cpu_buf(P), *pg = cpu_buf(P);
    assert_int_equal(wagma_model_get_params(mc, pc), 0);
    assert_int_equal(wagma_model_get_params(mg, pg), 0);
    assert_memory_equal(pc, pg, P * 4); /* the same initial bits */
    wagma_eval_t ec, eg;
    assert_int_equal(wagma_model_forward(mc, x, y, n, &ec), 0);
    assert_int_equal(wagma_model_forward(mg, x, y, n, &eg), 0);
    assert_int_equal(wagma_model_backward(mc), 0);
    assert_int_equal(wagma_model_backward(mg), 0);
    assert_int_equal(wagma_model_get_grads(mc, pc), 0);
    assert_int_equal(wagma_model_get_grads(mg, pg), 0);
    double diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < P; i++) {
      diff2 += ((double)pg[i] - pc[i]) * ((double)pg[i] - pc[i]);
      norm2 += (double)pc[i] * pc[i];
    }
    double rel = sqrt(diff2 / norm2);
    print_message("  model %-22s loss cpu %.7f dev %.7f, correct %zu/%zu, gradient relative "
                  "error %.3g (tolerance 1e-4)\n",
                  specs[k], ec.loss, eg.loss, ec.correct, eg.correct, rel);
    assert_true(fabs(eg.loss - ec.loss) <= 1e-5 * ec.loss);
    assert_true(rel <= 1e-4);
    free(pc), free(pg);
    wagma_model_destroy(mc);
    wagma_model_destroy(mg);
  }
  free(x);
}

/* ------------------------------------------------------------------ 300 training steps */

typedef struct run {
  double loss[300];
  double test_acc;
} run_t;

static void train_steps(wagma_backend_t *b, const char *spec, const wagma_optim_config_t *ocfg,
                        const wagma_dataset_t *tr, const wagma_dataset_t *te, size_t steps,
                        run_t *out) {
  const size_t batch = 64;
  wagma_model_t *m = model_on(b, spec, batch, 1);
  wagma_optim_t *o = NULL;
  char err[256];
  assert_int_equal(wagma_optim_create_on(b, ocfg, wagma_model_param_count(m), &o, err, sizeof(err)),
                   0);
  wagma_sampler_t s;
  wagma_batch_t bt;
  assert_int_equal(wagma_sampler_init(&s, tr->n, WAGMA_SAMPLE_SHUFFLE, 42), 0);
  assert_int_equal(wagma_batch_alloc(&bt, batch, tr->features), 0);
  for (size_t t = 0; t < steps; t++) {
    wagma_eval_t e;
    assert_int_equal(wagma_batch_draw(&bt, &s, tr, batch), 0);
    assert_int_equal(wagma_model_forward(m, bt.x, bt.y, bt.n, &e), 0);
    assert_int_equal(wagma_model_backward(m), 0);
    wagma_optim_step(o, t, wagma_model_params(m), wagma_model_grads(m));
    out->loss[t] = e.loss;
  }
  wagma_eval_t ev;
  assert_int_equal(wagma_model_evaluate(m, te, 0, 0, &ev), 0);
  out->test_acc = (double)ev.correct / (double)ev.n;
  assert_int_equal(wagma_backend_sync(b), 0);
  wagma_batch_free(&bt);
  wagma_sampler_free(&s);
  wagma_optim_destroy(o);
  wagma_model_destroy(m);
}

static void training_300_steps_cpu_vs_dev(void **state) {
  (void)state;
  wagma_dataset_t tr, te;
  char err[256];
  wagma_synthetic_config_t sc = wagma_synthetic_defaults(4000, 11, 0);
  assert_int_equal(wagma_dataset_synthetic(&tr, &sc, err, sizeof(err)), 0);
  sc.split = 1;
  sc.n = 1000;
  assert_int_equal(wagma_dataset_synthetic(&te, &sc, err, sizeof(err)), 0);
  struct {
    const char *spec;
    wagma_optim_config_t o;
  } runs[2] = {{"mlp", wagma_optim_defaults(WAGMA_OPTIM_SGD)},
               {"lenet5", wagma_optim_defaults(WAGMA_OPTIM_ADAM)}};
  runs[0].o.schedule.lr = 0.02f;
  runs[0].o.nesterov = 1;
  runs[0].o.weight_decay = 1e-4f;
  runs[0].o.schedule.warmup_steps = 20;
  runs[1].o.schedule.lr = 0.001f;
  static run_t rc, rg;
  for (int r = 0; r < 2; r++) {
    /* The host emulation's per-element index arithmetic is slow: 100 LeNet-5 steps there. */
    const size_t steps = r == 1 && !strcmp(dev->ops->kind, "cuda-emu") ? 100 : 300;
    train_steps(cpu, runs[r].spec, &runs[r].o, &tr, &te, steps, &rc);
    train_steps(dev, runs[r].spec, &runs[r].o, &tr, &te, steps, &rg);
    double worst = 0, sum = 0;
    size_t worst_at = 0, off = 0;
    for (size_t t = 0; t < steps; t++) {
      double d = fabs(rg.loss[t] - rc.loss[t]);
      sum += d;
      if (d > worst)
        worst = d, worst_at = t;
      off += !(d <= 0.02 + 0.02 * rc.loss[t]);
    }
    print_message("  %zu steps %-7s loss %.4f -> %.4f (cpu) vs %.4f -> %.4f (dev); max |diff| %.3g "
                  "at step %zu, mean %.3g; test accuracy cpu %.4f dev %.4f\n",
                  steps, runs[r].spec, rc.loss[0], rc.loss[steps - 1], rg.loss[0],
                  rg.loss[steps - 1], worst, worst_at, sum / (double)steps, rc.test_acc,
                  rg.test_acc);
    assert_int_equal(off, 0);
    assert_true(sum / (double)steps <= 0.005);
    assert_true(fabs(rg.test_acc - rc.test_acc) <= 0.02);
    assert_true(rc.loss[steps - 1] < rc.loss[0]); /* it did train */
  }
  wagma_dataset_free(&tr);
  wagma_dataset_free(&te);
}

/* ------------------------------------------------------------------ checkpoints */

static void *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = malloc(*len);
  assert_int_equal(fread(buf, 1, *len, f), *len);
  fclose(f);
  return buf;
}

static void checkpoints_are_device_independent(void **state) {
  (void)state;
  char dir[256], pg[300], pc[300], pg2[300], err[256];
  test_mkdtemp(dir, sizeof(dir));
  snprintf(pg, sizeof(pg), "%s/dev.ckpt", dir);
  snprintf(pc, sizeof(pc), "%s/cpu.ckpt", dir);
  snprintf(pg2, sizeof(pg2), "%s/gpu2.ckpt", dir);
  wagma_model_t *mg = model_on(dev, "lenet5", 32, 4), *mc = model_on(cpu, "lenet5", 32, 5);
  wagma_model_t *mg2 = model_on(dev, "lenet5", 32, 6);
  size_t P = wagma_model_param_count(mg);
  wagma_optim_t *og = NULL, *oc = NULL, *og2 = NULL;
  wagma_optim_config_t cfg = wagma_optim_defaults(WAGMA_OPTIM_ADAM);
  assert_int_equal(wagma_optim_create_on(dev, &cfg, P, &og, err, sizeof(err)), 0);
  assert_int_equal(wagma_optim_create_on(cpu, &cfg, P, &oc, err, sizeof(err)), 0);
  assert_int_equal(wagma_optim_create_on(dev, &cfg, P, &og2, err, sizeof(err)), 0);
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 8);
  float *x = rand_host(32 * 784, 1.0, &rng);
  int32_t y[32];
  for (int i = 0; i < 32; i++)
    y[i] = i % 10;
  for (int t = 0; t < 5; t++) { /* a non-trivial GPU model and Adam state */
    assert_int_equal(wagma_model_forward(mg, x, y, 32, NULL), 0);
    assert_int_equal(wagma_model_backward(mg), 0);
    wagma_optim_step(og, (uint64_t)t, wagma_model_params(mg), wagma_model_grads(mg));
  }
  /* GPU -> file -> CPU -> file: the same bytes. */
  assert_int_equal(wagma_checkpoint_save(pg, mg, og, 5, err, sizeof(err)), 0);
  uint64_t it = 0;
  assert_int_equal(wagma_checkpoint_load(pg, mc, oc, &it, err, sizeof(err)), 0);
  assert_int_equal(it, 5);
  assert_int_equal(wagma_checkpoint_save(pc, mc, oc, 5, err, sizeof(err)), 0);
  size_t lg, lc;
  void *bg = read_file(pg, &lg), *bc = read_file(pc, &lc);
  assert_int_equal(lg, lc);
  assert_memory_equal(bg, bc, lg);
  /* CPU file -> another GPU model -> file: the same bytes again. */
  assert_int_equal(wagma_checkpoint_load(pc, mg2, og2, &it, err, sizeof(err)), 0);
  assert_int_equal(wagma_checkpoint_save(pg2, mg2, og2, 5, err, sizeof(err)), 0);
  size_t l2;
  void *b2 = read_file(pg2, &l2);
  assert_int_equal(l2, lc);
  assert_memory_equal(b2, bc, lc);
  free(bg), free(bc), free(b2), free(x);
  wagma_optim_destroy(og), wagma_optim_destroy(oc), wagma_optim_destroy(og2);
  wagma_model_destroy(mg), wagma_model_destroy(mc), wagma_model_destroy(mg2);
  test_rmtree(dir);
}

int train_conformance_tests(wagma_backend_t *device) {
  dev = device;
  cpu = wagma_backend_cpu();
  char group[200];
  snprintf(group, sizeof(group), "train/conformance %s vs cpu", wagma_backend_name(dev));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(memory_staging_and_snapshot),
      cmocka_unit_test(gemm_and_bias_ops),
      cmocka_unit_test(conv_ops),
      cmocka_unit_test(pool_and_activation_ops),
      cmocka_unit_test(softmax_xent_and_optimizer_ops),
      cmocka_unit_test(models_forward_backward),
      cmocka_unit_test(training_300_steps_cpu_vs_dev),
      cmocka_unit_test(checkpoints_are_device_independent),
  };
  return cmocka_run_group_tests_name(group, tests, NULL, NULL);
}
