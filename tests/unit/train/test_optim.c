/* Optimizers against hand-computed steps, learning-rate schedules, and checkpoints (round
 * trip, atomic publication, rejection of corrupt or foreign files). */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/train/train.h"
#include "test_train.h"

#define assert_near(a, b, tol)                                                                     \
  do {                                                                                             \
    double a_ = (a), b_ = (b);                                                                     \
    if (fabs(a_ - b_) > (tol)) {                                                                   \
      print_error("%s = %.9g, expected %.9g\n", #a, a_, b_);                                       \
      fail();                                                                                      \
    }                                                                                              \
  } while (0)

static wagma_optim_t *make_optim(wagma_optim_config_t cfg, size_t n) {
  wagma_optim_t *o = NULL;
  char err[256] = "";
  int rc = wagma_optim_create(&cfg, n, &o, err, sizeof(err));
  if (rc)
    print_error("%s\n", err);
  assert_int_equal(rc, 0);
  return o;
}

static void sgd_momentum_steps_by_hand(void **state) {
  (void)state;
  wagma_optim_config_t cfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  cfg.schedule.lr = 0.1f;
  cfg.momentum = 0.9f;
  wagma_optim_t *o = make_optim(cfg, 2);
  float w[2] = {1.0f, -2.0f}, g[2] = {0.5f, 1.0f};
  size_t len = 0;
  assert_non_null(wagma_optim_state(o, &len));
  assert_int_equal(len, 2);
  /* v = 0.5; w = 1 - 0.1 * 0.5 = 0.95. Then v = 0.45 + 0.5 = 0.95; w = 0.95 - 0.095 = 0.855 */
  wagma_optim_step(o, 0, w, g);
  assert_near(w[0], 0.95, 1e-6);
  assert_near(w[1], -2.1, 1e-6);
  wagma_optim_step(o, 1, w, g);
  assert_near(w[0], 0.855, 1e-6);
  assert_near(w[1], -2.29, 1e-6); /* v = 1.9, w = -2.1 - 0.19 */
  assert_int_equal(wagma_optim_updates(o), 2);
  wagma_optim_destroy(o);
}

static void sgd_nesterov_steps_by_hand(void **state) {
  (void)state;
  wagma_optim_config_t cfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  cfg.schedule.lr = 0.1f;
  cfg.momentum = 0.9f;
  cfg.nesterov = 1;
  wagma_optim_t *o = make_optim(cfg, 1);
  float w = 1.0f, g = 0.5f;
  /* v = 0.5, step = 0.5 + 0.45 = 0.95, w = 0.905; v = 0.95, step = 0.5 + 0.855, w = 0.7695 */
  wagma_optim_step(o, 0, &w, &g);
  assert_near(w, 0.905, 1e-6);
  wagma_optim_step(o, 1, &w, &g);
  assert_near(w, 0.7695, 1e-6);
  wagma_optim_destroy(o);
}

static void sgd_weight_decay_without_momentum(void **state) {
  (void)state;
  wagma_optim_config_t cfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  cfg.schedule.lr = 0.1f;
  cfg.momentum = 0.0f;
  cfg.weight_decay = 0.1f;
  wagma_optim_t *o = make_optim(cfg, 1);
  size_t len = 7;
  assert_null(wagma_optim_state(o, &len));
  assert_int_equal(len, 0);
  float w = 1.0f, g = 0.5f;
  wagma_optim_step(o, 0, &w, &g); /* g' = 0.5 + 0.1 = 0.6; w = 1 - 0.06 */
  assert_near(w, 0.94, 1e-6);
  wagma_optim_destroy(o);
}

static void adam_steps_by_hand(void **state) {
  (void)state;
  wagma_optim_config_t cfg = wagma_optim_defaults(WAGMA_OPTIM_ADAM);
  cfg.schedule.lr = 0.01f;
  wagma_optim_t *o = make_optim(cfg, 1);
  size_t len = 0;
  wagma_optim_state(o, &len);
  assert_int_equal(len, 2);
  float w = 1.0f, g = 0.5f;
  /* Step 1: m = 0.05, v = 0.00025; m^ = 0.5, v^ = 0.25: w -= 0.01 * 0.5 / 0.5 */
  wagma_optim_step(o, 0, &w, &g);
  assert_near(w, 0.99, 1e-6);
  /* Step 2 with g = -1: m = 0.045 - 0.1 = -0.055, m^ = -0.055 / 0.19 = -0.28947368;
   * v = 0.00024975 + 0.001 = 0.00124975, v^ = 0.00124975 / 0.001999 = 0.62518759,
   * sqrt = 0.79068804; w += 0.01 * 0.28947368 / 0.79068804 = 0.00366102 */
  g = -1.0f;
  wagma_optim_step(o, 1, &w, &g);
  assert_near(w, 0.99366102, 2e-6);
  float *st = wagma_optim_state(o, NULL);
  assert_near(st[0], -0.055, 1e-7);
  assert_near(st[1], 0.00124975, 1e-7); /* 0.999f and 1 - 0.999f are inexact in float */
  wagma_optim_destroy(o);
}

static void adamw_decays_decoupled(void **state) {
  (void)state;
  wagma_optim_config_t cfg = wagma_optim_defaults(WAGMA_OPTIM_ADAMW);
  cfg.schedule.lr = 0.01f;
  cfg.weight_decay = 0.5f;
  wagma_optim_t *o = make_optim(cfg, 1);
  float w = 2.0f, g = 0.0f;
  /* Zero gradient: Adam's step is 0 / (0 + eps) = 0; only the decay: w -= 0.01 * 0.5 * 2. */
  wagma_optim_step(o, 0, &w, &g);
  assert_near(w, 1.99, 1e-6);
  /* Plain Adam folds the decay into the gradient instead: the first step moves by ~lr. */
  wagma_optim_destroy(o);
  cfg.kind = WAGMA_OPTIM_ADAM;
  o = make_optim(cfg, 1);
  w = 2.0f;
  wagma_optim_step(o, 0, &w, &g);
  assert_near(w, 1.99, 1e-5);
  wagma_optim_reset(o);
  assert_int_equal(wagma_optim_updates(o), 0);
  assert_true(wagma_optim_state(o, NULL)[0] == 0.0f);
  wagma_optim_destroy(o);
}

static void bad_optimizer_configs_are_rejected(void **state) {
  (void)state;
  wagma_optim_t *o = NULL;
  char err[256];
  wagma_optim_config_t cfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  cfg.momentum = 1.0f;
  assert_int_equal(wagma_optim_create(&cfg, 4, &o, err, sizeof(err)), WAGMA_EINVAL);
  assert_non_null(strstr(err, "momentum"));
  cfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  cfg.schedule.lr = NAN;
  assert_int_equal(wagma_optim_create(&cfg, 4, &o, err, sizeof(err)), WAGMA_EINVAL);
  cfg = wagma_optim_defaults(WAGMA_OPTIM_ADAM);
  cfg.nesterov = 1;
  assert_int_equal(wagma_optim_create(&cfg, 4, &o, err, sizeof(err)), WAGMA_EINVAL);
  cfg = wagma_optim_defaults(WAGMA_OPTIM_ADAM);
  cfg.beta2 = 1.0f;
  assert_int_equal(wagma_optim_create(&cfg, 4, &o, err, sizeof(err)), WAGMA_EINVAL);
  cfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  assert_int_equal(wagma_optim_create(&cfg, 0, &o, err, sizeof(err)), WAGMA_EINVAL);
  assert_null(o);
}

static void schedule_warmup_and_step_decay(void **state) {
  (void)state;
  wagma_lr_schedule_t s = {.lr = 1.0f, .warmup_steps = 4, .decay_every = 10, .decay = 0.5f};
  assert_near(wagma_lr_at(&s, 0), 0.25, 1e-12);
  assert_near(wagma_lr_at(&s, 1), 0.5, 1e-12);
  assert_near(wagma_lr_at(&s, 3), 1.0, 1e-12);
  assert_near(wagma_lr_at(&s, 4), 1.0, 1e-12);
  assert_near(wagma_lr_at(&s, 9), 1.0, 1e-12);
  assert_near(wagma_lr_at(&s, 10), 0.5, 1e-12);
  assert_near(wagma_lr_at(&s, 25), 0.25, 1e-12);
  wagma_lr_schedule_t flat = {.lr = 0.3f, .decay = 0.1f};
  assert_near(wagma_lr_at(&flat, 0), 0.3, 1e-7);
  assert_near(wagma_lr_at(&flat, 1000000), 0.3, 1e-7);
  /* The optimizer uses the iteration it is given: SGD without momentum moves by lr(t) * g. */
  wagma_optim_config_t cfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  cfg.momentum = 0.0f;
  cfg.schedule = s;
  wagma_optim_t *o = make_optim(cfg, 1);
  float w = 0.0f, g = 1.0f;
  wagma_optim_step(o, 0, &w, &g);
  assert_near(w, -0.25, 1e-7);
  wagma_optim_step(o, 20, &w, &g);
  assert_near(w, -0.5, 1e-7);
  wagma_optim_destroy(o);
}

/* ------------------------------------------------------------------ checkpoints */

static wagma_model_t *make_model(const char *spec, uint64_t seed) {
  wagma_model_config_t cfg;
  wagma_model_t *m = NULL;
  char err[256];
  assert_int_equal(wagma_model_config_parse(spec, &cfg, err, sizeof(err)), 0);
  cfg.max_batch = 8;
  assert_int_equal(wagma_model_create(&cfg, &m, err, sizeof(err)), 0);
  wagma_model_init(m, seed);
  return m;
}

/* Gives an Adam optimizer a non-trivial state: a few steps with pseudo-random gradients. */
static void take_steps(wagma_model_t *m, wagma_optim_t *o, int steps) {
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 9);
  size_t n = wagma_model_param_count(m);
  float *g = wagma_model_grads(m);
  for (int s = 0; s < steps; s++) {
    for (size_t i = 0; i < n; i++)
      g[i] = (float)wagma_rng_normal(&rng);
    wagma_optim_step(o, (uint64_t)s, wagma_model_params(m), g);
  }
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void flip_byte(const char *path, long at) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, at), 1);
  b ^= 0x5a;
  assert_int_equal(pwrite(fd, &b, 1, at), 1);
  close(fd);
}

static void checkpoint_round_trip_and_rejections(void **state) {
  (void)state;
  char dir[256], path[300], copy[300], err[256];
  test_mkdtemp(dir, sizeof(dir));
  snprintf(path, sizeof(path), "%s/ckpt", dir);
  snprintf(copy, sizeof(copy), "%s/ckpt-copy", dir);
  wagma_model_t *m = make_model("mlp:32-16", 1);
  size_t n = wagma_model_param_count(m);
  wagma_optim_t *o = make_optim(wagma_optim_defaults(WAGMA_OPTIM_ADAM), n);
  take_steps(m, o, 3);
  assert_int_equal(wagma_checkpoint_save(path, m, o, 1234, err, sizeof(err)), 0);
  assert_int_equal(file_size(path), 96 + (long)(3 * n * sizeof(float)));

  /* No temporary file is left behind. */
  char tmp[400];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
  assert_int_equal(access(tmp, F_OK), -1);

  /* Round trip into a different initialisation and a fresh optimizer: bit-identical. */
  wagma_model_t *m2 = make_model("mlp:32-16", 2);
  wagma_optim_t *o2 = make_optim(wagma_optim_defaults(WAGMA_OPTIM_ADAM), n);
  uint64_t it = 0;
  assert_int_equal(wagma_checkpoint_load(path, m2, o2, &it, err, sizeof(err)), 0);
  assert_int_equal(it, 1234);
  assert_memory_equal(wagma_model_params(m), wagma_model_params(m2), n * sizeof(float));
  assert_memory_equal(wagma_optim_state(o, NULL), wagma_optim_state(o2, NULL),
                      2 * n * sizeof(float));
  assert_int_equal(wagma_optim_updates(o2), 3);
  /* The restored pair continues exactly like the original. */
  take_steps(m, o, 1);
  take_steps(m2, o2, 1);
  assert_memory_equal(wagma_model_params(m), wagma_model_params(m2), n * sizeof(float));

  /* Parameters only. */
  assert_int_equal(wagma_checkpoint_load(path, m2, NULL, NULL, err, sizeof(err)), 0);

  /* Corruptions: payload byte, header byte, magic, truncation. The model stays untouched. */
  wagma_model_t *fresh = make_model("mlp:32-16", 3);
  float *before = malloc(n * sizeof(float));
  memcpy(before, wagma_model_params(fresh), n * sizeof(float));
  const long offsets[] = {96 + 40, 30, 2};
  for (size_t k = 0; k < sizeof(offsets) / sizeof(offsets[0]); k++) {
    assert_int_equal(wagma_checkpoint_save(copy, m, o, 7, err, sizeof(err)), 0);
    flip_byte(copy, offsets[k]);
    err[0] = '\0';
    assert_int_equal(wagma_checkpoint_load(copy, fresh, NULL, NULL, err, sizeof(err)),
                     WAGMA_EPROTO);
    assert_true(strlen(err) > 0);
    assert_memory_equal(before, wagma_model_params(fresh), n * sizeof(float));
  }
  assert_int_equal(wagma_checkpoint_save(copy, m, o, 7, err, sizeof(err)), 0);
  assert_int_equal(truncate(copy, file_size(copy) - 4), 0);
  assert_int_equal(wagma_checkpoint_load(copy, fresh, NULL, NULL, err, sizeof(err)), WAGMA_EPROTO);
  assert_int_equal(truncate(copy, 50), 0);
  assert_int_equal(wagma_checkpoint_load(copy, fresh, NULL, NULL, err, sizeof(err)), WAGMA_EPROTO);
  assert_memory_equal(before, wagma_model_params(fresh), n * sizeof(float));

  /* Another architecture, another optimizer: a valid file, the wrong target. */
  wagma_model_t *other = make_model("mlp:32-16,tanh", 1); /* same layout, another model */
  assert_int_equal(wagma_model_param_count(other), n);
  assert_int_equal(wagma_checkpoint_load(path, other, NULL, NULL, err, sizeof(err)), WAGMA_EINVAL);
  wagma_optim_t *sgd = make_optim(wagma_optim_defaults(WAGMA_OPTIM_SGD), n);
  assert_int_equal(wagma_checkpoint_load(path, m2, sgd, NULL, err, sizeof(err)), WAGMA_EINVAL);
  assert_non_null(strstr(err, "optimizer"));

  /* Missing file. */
  snprintf(copy, sizeof(copy), "%s/absent", dir);
  assert_int_equal(wagma_checkpoint_load(copy, m2, NULL, NULL, err, sizeof(err)), WAGMA_ENOTFOUND);
  /* Saving into a missing directory fails cleanly. */
  snprintf(copy, sizeof(copy), "%s/no/such/dir/ckpt", dir);
  assert_int_equal(wagma_checkpoint_save(copy, m, o, 1, err, sizeof(err)), WAGMA_EIO);

  free(before);
  wagma_optim_destroy(sgd);
  wagma_model_destroy(other);
  wagma_model_destroy(fresh);
  wagma_optim_destroy(o2);
  wagma_model_destroy(m2);
  wagma_optim_destroy(o);
  wagma_model_destroy(m);
  test_rmtree(dir);
}

int train_optim_tests(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sgd_momentum_steps_by_hand),
      cmocka_unit_test(sgd_nesterov_steps_by_hand),
      cmocka_unit_test(sgd_weight_decay_without_momentum),
      cmocka_unit_test(adam_steps_by_hand),
      cmocka_unit_test(adamw_decays_decoupled),
      cmocka_unit_test(bad_optimizer_configs_are_rejected),
      cmocka_unit_test(schedule_warmup_and_step_decay),
      cmocka_unit_test(checkpoint_round_trip_and_rejections),
  };
  return cmocka_run_group_tests_name("train/optim+checkpoint", tests, NULL, NULL);
}
