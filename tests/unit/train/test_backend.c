/* The backend interface with the CPU backend: names and probing (a CUDA name is refused with its
 * cause on a machine or build without a GPU), the operations the models do not already cover
 * (GEMM in all transpose combinations, bias ops, copies, staging, the asynchronous download),
 * and the host get/set calls that checkpoints and the agent use. Runs everywhere. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/train/backend.h"
#include "agent/train/train.h"
#include "test_train.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void names_probe_and_open(void **state) {
  (void)state;
  char err[256];
  wagma_backend_t *b = NULL;
  assert_int_equal(wagma_backend_probe("cpu", err, sizeof(err)), 0);
  assert_int_equal(wagma_backend_open("cpu", &b, err, sizeof(err)), 0);
  assert_ptr_equal(b, wagma_backend_cpu());
  assert_string_equal(wagma_backend_name(b), "cpu");
  assert_int_equal(wagma_backend_host_memory(b), 1);
  assert_int_equal(wagma_backend_sync(b), 0);
  assert_string_equal(wagma_backend_error(b), "");
  wagma_backend_close(b); /* the singleton stays */
  assert_string_equal(wagma_backend_name(wagma_backend_cpu()), "cpu");
  const char *bad[] = {"gpu", "", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "CPU", "cuda0"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = '\0';
    assert_int_equal(wagma_backend_probe(bad[i], err, sizeof(err)), WAGMA_EINVAL);
    assert_non_null(strstr(err, "unknown device"));
    assert_int_equal(wagma_backend_open(bad[i], &b, err, sizeof(err)), WAGMA_EINVAL);
    assert_null(b);
  }
  /* CUDA: refused with its cause where it cannot work (this build, or no GPU), quickly. */
  double t0 = now_s();
  err[0] = '\0';
  int rc = wagma_backend_probe("cuda", err, sizeof(err));
  double took = now_s() - t0;
  print_message("probe cuda: %s (%.3f s)%s%s\n", rc ? wagma_strerror(rc) : "ok", took,
                rc ? ": " : "", rc ? err : "");
  assert_true(took < 5.0);
  if (!wagma_train_have_cuda()) {
    assert_int_equal(rc, WAGMA_ENOSYS);
    assert_non_null(strstr(err, "no CUDA backend"));
  } else if (rc) {
    assert_int_equal(rc, WAGMA_EUNAVAIL);
    assert_true(strlen(err) > 10);
    assert_int_equal(wagma_backend_open("cuda", &b, err, sizeof(err)), WAGMA_EUNAVAIL);
    assert_null(b);
  }
  /* A device number beyond any machine's. */
  rc = wagma_backend_probe("cuda:1000", err, sizeof(err));
  assert_true(rc == WAGMA_ENOSYS || rc == WAGMA_EUNAVAIL);
}

static void gemm_all_transposes(void **state) {
  (void)state;
  wagma_backend_t *b = wagma_backend_cpu();
  enum { M = 5, N = 4, K = 3 };
  float a[M * K], bt[K * N], c[M * N], c0[M * N];
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 1);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      for (size_t i = 0; i < M * K; i++)
        a[i] = (float)wagma_rng_normal(&rng);
      for (size_t i = 0; i < K * N; i++)
        bt[i] = (float)wagma_rng_normal(&rng);
      for (size_t i = 0; i < M * N; i++)
        c[i] = c0[i] = (float)wagma_rng_normal(&rng);
      /* Stored shapes: A is M x K (or K x M when ta), B is K x N (or N x K when tb). */
      size_t lda = ta ? M : K, ldb = tb ? K : N;
      b->ops->gemm(b, ta, tb, M, N, K, 0.5f, a, lda, bt, ldb, 2.0f, c, N);
      for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++) {
          double s = 0.0;
          for (size_t k = 0; k < K; k++)
            s += (double)(ta ? a[k * lda + i] : a[i * lda + k]) *
                 (double)(tb ? bt[j * ldb + k] : bt[k * ldb + j]);
          double expect = 0.5 * s + 2.0 * c0[i * N + j];
          assert_true(fabs(c[i * N + j] - expect) < 1e-5 * (1 + fabs(expect)));
        }
    }
}

static void bias_copy_zero_and_staging(void **state) {
  (void)state;
  wagma_backend_t *b = wagma_backend_cpu();
  const float bias[3] = {1, 2, 3};
  float y[6], db[3];
  b->ops->bias_rows(b, 2, 3, bias, y);
  for (int i = 0; i < 6; i++)
    assert_true(y[i] == bias[i % 3]);
  const float dy[6] = {1, 2, 3, 10, 20, 30};
  b->ops->bias_grad(b, 2, 3, dy, db);
  assert_true(db[0] == 11 && db[1] == 22 && db[2] == 33);
  float *d = b->ops->alloc(b, 6 * sizeof(float));
  for (int i = 0; i < 6; i++)
    assert_true(d[i] == 0.0f); /* zeroed */
  b->ops->copy(b, d, dy, sizeof(dy));
  assert_memory_equal(d, dy, sizeof(dy));
  b->ops->zero(b, d, sizeof(dy));
  assert_true(d[5] == 0.0f);
  b->ops->free(b, d);
  wg_stager_t *st = b->ops->stager_create(b, 8, 2);
  assert_non_null(st);
  const float x[4] = {1, 2, 3, 4};
  const int32_t lab[2] = {7, 8};
  const float *sx;
  const int32_t *sy;
  assert_int_equal(b->ops->stage(b, st, x, 4, lab, 2, &sx, &sy), 0);
  assert_memory_equal(sx, x, sizeof(x));
  assert_memory_equal(sy, lab, sizeof(lab));
  assert_int_equal(b->ops->stage(b, st, x, 9, lab, 2, &sx, &sy), WAGMA_ERANGE);
  b->ops->stager_destroy(b, st);
}

static void host_get_set_and_async_download(void **state) {
  (void)state;
  char err[256];
  wagma_model_config_t cfg;
  wagma_model_t *m = NULL;
  assert_int_equal(wagma_model_config_parse("mlp:16-8", &cfg, err, sizeof(err)), 0);
  cfg.max_batch = 4;
  assert_int_equal(wagma_model_create_on(wagma_backend_cpu(), &cfg, &m, err, sizeof(err)), 0);
  assert_ptr_equal(wagma_model_backend(m), wagma_backend_cpu());
  wagma_model_init(m, 3);
  size_t n = wagma_model_param_count(m);
  float *h = malloc(n * sizeof(float)),
        *snap = wagma_backend_host_alloc(wagma_backend_cpu(), n * sizeof(float));
  assert_int_equal(wagma_model_get_params(m, h), 0);
  assert_memory_equal(h, wagma_model_params(m), n * sizeof(float));
  assert_int_equal(wagma_model_params_download_async(m, snap), 0);
  assert_int_equal(wagma_model_params_download_wait(m), 0);
  assert_memory_equal(snap, h, n * sizeof(float));
  h[0] = 42.0f;
  assert_int_equal(wagma_model_set_params(m, h), 0);
  assert_true(wagma_model_params(m)[0] == 42.0f);
  assert_int_equal(wagma_model_get_grads(m, h), 0);
  assert_true(h[0] == 0.0f); /* init zeroes the gradients */
  wagma_optim_t *o = NULL;
  wagma_optim_config_t oc = wagma_optim_defaults(WAGMA_OPTIM_ADAM);
  assert_int_equal(wagma_optim_create_on(NULL, &oc, n, &o, err, sizeof(err)), 0);
  assert_ptr_equal(wagma_optim_backend(o), wagma_backend_cpu());
  float *s = malloc(2 * n * sizeof(float));
  for (size_t i = 0; i < 2 * n; i++)
    s[i] = (float)i;
  assert_int_equal(wagma_optim_set_state(o, s), 0);
  memset(s, 0, 2 * n * sizeof(float));
  assert_int_equal(wagma_optim_get_state(o, s), 0);
  assert_true(s[2 * n - 1] == (float)(2 * n - 1));
  assert_memory_equal(s, wagma_optim_state(o, NULL), 2 * n * sizeof(float));
  free(s);
  free(h);
  wagma_backend_host_free(wagma_backend_cpu(), snap);
  wagma_optim_destroy(o);
  wagma_model_destroy(m);
}

int train_backend_tests(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names_probe_and_open),
      cmocka_unit_test(gemm_all_transposes),
      cmocka_unit_test(bias_copy_zero_and_staging),
      cmocka_unit_test(host_get_set_and_async_download),
  };
  return cmocka_run_group_tests_name("train/backend", tests, NULL, NULL);
}
