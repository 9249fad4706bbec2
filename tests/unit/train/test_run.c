/* Models as the agent uses them: configuration parsing and validation, deterministic
 * initialisation, and short training runs (synthetic data; Fashion-MNIST when installed) whose
 * loss and accuracy must reach stated bounds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/train/train.h"
#include "test_train.h"

static wagma_model_t *make_model(const char *spec, size_t max_batch, uint64_t seed) {
  wagma_model_config_t cfg;
  wagma_model_t *m = NULL;
  char err[256] = "";
  assert_int_equal(wagma_model_config_parse(spec, &cfg, err, sizeof(err)), 0);
  cfg.max_batch = max_batch;
  int rc = wagma_model_create(&cfg, &m, err, sizeof(err));
  if (rc)
    print_error("%s: %s\n", spec, err);
  assert_int_equal(rc, 0);
  wagma_model_init(m, seed);
  return m;
}

static void model_specs_parse_and_validate(void **state) {
  (void)state;
  wagma_model_config_t cfg;
  char err[256];
  assert_int_equal(wagma_model_config_parse("mlp:512-256-128,tanh", &cfg, err, sizeof(err)), 0);
  assert_int_equal(cfg.arch, WAGMA_ARCH_MLP);
  assert_int_equal(cfg.n_hidden, 3);
  assert_int_equal(cfg.hidden[2], 128);
  assert_int_equal(cfg.activation, WAGMA_ACT_TANH);
  assert_int_equal(wagma_model_config_parse("lenet,avgpool", &cfg, err, sizeof(err)), 0);
  assert_int_equal(cfg.arch, WAGMA_ARCH_LENET5);
  assert_int_equal(cfg.pool, WAGMA_POOL_AVG);
  const char *bad[] = {
      "",           "resnet",         "mlp:",        "mlp:0", "mlp:12-", "mlp:1-2-3-4-5-6-7-8-9",
      "softmax:10", "lenet5,sigmoid", "mlp:99999999"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = '\0';
    if (wagma_model_config_parse(bad[i], &cfg, err, sizeof(err)) != WAGMA_EINVAL) {
      print_error("spec '%s' accepted\n", bad[i]);
      fail();
    }
    assert_true(strlen(err) > 0);
  }

  /* Parameter counts of the standard architectures (weights + biases, layer by layer). */
  wagma_model_t *m = make_model("softmax", 4, 1);
  assert_int_equal(wagma_model_param_count(m), 784 * 10 + 10);
  wagma_model_destroy(m);
  m = make_model("mlp", 4, 1);
  assert_int_equal(wagma_model_param_count(m), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  wagma_model_destroy(m);
  m = make_model("lenet5", 4, 1);
  assert_int_equal(wagma_model_param_count(m), (6 * 25 + 6) + (16 * 6 * 25 + 16) +
                                                   (16 * 5 * 5 * 120 + 120) + (120 * 84 + 84) +
                                                   (84 * 10 + 10));
  assert_non_null(strstr(wagma_model_describe(m), "conv5x5x6"));
  wagma_model_destroy(m);

  /* Shapes that do not work are refused with a message. */
  cfg = wagma_model_defaults(WAGMA_ARCH_LENET5);
  cfg.rows = cfg.cols = 8;
  err[0] = '\0';
  assert_int_equal(wagma_model_create(&cfg, &m, err, sizeof(err)), WAGMA_EINVAL);
  assert_null(m);
  assert_non_null(strstr(err, "does not fit"));
  cfg = wagma_model_defaults(WAGMA_ARCH_SOFTMAX);
  cfg.classes = 1;
  assert_int_equal(wagma_model_create(&cfg, &m, err, sizeof(err)), WAGMA_EINVAL);
  cfg = wagma_model_defaults(WAGMA_ARCH_SOFTMAX);
  cfg.max_batch = 0;
  assert_int_equal(wagma_model_create(&cfg, &m, err, sizeof(err)), WAGMA_EINVAL);
}

static void forward_rejects_bad_batches(void **state) {
  (void)state;
  wagma_model_t *m = make_model("softmax", 4, 1);
  float x[5 * 784] = {0};
  int32_t y[5] = {0, 1, 2, 3, 4};
  assert_int_equal(wagma_model_backward(m), WAGMA_EINVAL);               /* no forward yet */
  assert_int_equal(wagma_model_forward(m, x, y, 5, NULL), WAGMA_EINVAL); /* > max_batch */
  assert_int_equal(wagma_model_forward(m, x, y, 0, NULL), WAGMA_EINVAL);
  y[1] = 10;
  assert_int_equal(wagma_model_forward(m, x, y, 2, NULL), WAGMA_EINVAL);
  y[1] = -1;
  assert_int_equal(wagma_model_forward(m, x, y, 2, NULL), WAGMA_EINVAL);
  y[1] = 1;
  wagma_eval_t e;
  assert_int_equal(wagma_model_forward(m, x, y, 4, &e), 0);
  /* Zero input and zero biases: uniform softmax, loss ln(10). */
  assert_true(fabs(e.loss - log(10.0)) < 1e-6);
  assert_int_equal(e.n, 4);
  wagma_model_destroy(m);
}

static void init_is_deterministic(void **state) {
  (void)state;
  const char *specs[] = {"softmax", "mlp", "lenet5"};
  for (size_t k = 0; k < 3; k++) {
    wagma_model_t *a = make_model(specs[k], 4, 17), *b = make_model(specs[k], 4, 17);
    wagma_model_t *c = make_model(specs[k], 4, 18);
    size_t n = wagma_model_param_count(a);
    assert_memory_equal(wagma_model_params(a), wagma_model_params(b), n * sizeof(float));
    assert_memory_not_equal(wagma_model_params(a), wagma_model_params(c), n * sizeof(float));
    assert_true(wagma_model_signature(a) == wagma_model_signature(c));
    /* Weights lie within the init bound, and not all are zero. */
    const float *p = wagma_model_params(a);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) {
      assert_true(fabsf(p[i]) < 1.0f);
      nonzero += p[i] != 0.0f;
    }
    assert_true(nonzero > n / 2);
    wagma_model_destroy(a);
    wagma_model_destroy(b);
    wagma_model_destroy(c);
  }
}

/* Trains on ds for `steps` minibatches; returns the model (caller destroys). */
static wagma_model_t *train(const char *spec, const wagma_optim_config_t *ocfg,
                            const wagma_dataset_t *ds, size_t steps, size_t batch, uint64_t seed,
                            wagma_eval_t *first_batch) {
  wagma_model_t *m = make_model(spec, batch, seed);
  wagma_optim_t *o = NULL;
  char err[256];
  assert_int_equal(wagma_optim_create(ocfg, wagma_model_param_count(m), &o, err, sizeof(err)), 0);
  wagma_sampler_t s;
  wagma_batch_t b;
  assert_int_equal(
      wagma_sampler_init(&s, ds->n, WAGMA_SAMPLE_SHUFFLE, wagma_seed_derive(seed, "worker-0")), 0);
  assert_int_equal(wagma_batch_alloc(&b, batch, ds->features), 0);
  for (size_t t = 0; t < steps; t++) {
    wagma_eval_t e;
    assert_int_equal(wagma_batch_draw(&b, &s, ds, batch), 0);
    assert_int_equal(wagma_model_forward(m, b.x, b.y, b.n, &e), 0);
    assert_true(isfinite(e.loss));
    if (t == 0 && first_batch)
      *first_batch = e;
    assert_int_equal(wagma_model_backward(m), 0);
    wagma_optim_step(o, t, wagma_model_params(m), wagma_model_grads(m));
  }
  wagma_batch_free(&b);
  wagma_sampler_free(&s);
  wagma_optim_destroy(o);
  return m;
}

static void training_on_synthetic_data_converges(void **state) {
  (void)state;
  wagma_dataset_t tr, te;
  char err[256];
  wagma_synthetic_config_t cfg = wagma_synthetic_defaults(2000, 7, 0);
  assert_int_equal(wagma_dataset_synthetic(&tr, &cfg, err, sizeof(err)), 0);
  cfg.split = 1;
  cfg.n = 500;
  assert_int_equal(wagma_dataset_synthetic(&te, &cfg, err, sizeof(err)), 0);
  struct {
    const char *spec;
    int optim;
    float lr;
    size_t steps;
  } runs[] = {
      {"softmax", WAGMA_OPTIM_SGD, 0.02f, 150},
      {"mlp:64-32", WAGMA_OPTIM_SGD, 0.02f, 150},
      {"mlp:64-32", WAGMA_OPTIM_ADAM, 0.002f, 150},
      {"lenet5", WAGMA_OPTIM_SGD, 0.005f, 150},
  };
  for (size_t r = 0; r < sizeof(runs) / sizeof(runs[0]); r++) {
    wagma_optim_config_t ocfg = wagma_optim_defaults(runs[r].optim);
    ocfg.schedule.lr = runs[r].lr;
    ocfg.schedule.warmup_steps = 10;
    wagma_eval_t first, after;
    wagma_model_t *m = train(runs[r].spec, &ocfg, &tr, runs[r].steps, 32, 1, &first);
    assert_int_equal(wagma_model_evaluate(m, &te, 0, 0, &after), 0);
    assert_int_equal(after.n, 500);
    double acc = (double)after.correct / (double)after.n;
    print_message("synthetic %-10s %s: loss %.3f -> test loss %.3f, accuracy %.3f\n", runs[r].spec,
                  runs[r].optim == WAGMA_OPTIM_SGD ? "sgd " : "adam", first.loss, after.loss, acc);
    /* Chance is loss ln(10) = 2.30 and accuracy 0.1. */
    assert_true(first.loss > 1.0);
    assert_true(after.loss < 0.5);
    assert_true(acc > 0.85);
    wagma_model_destroy(m);
  }
  wagma_dataset_free(&tr);
  wagma_dataset_free(&te);
}

static void training_is_deterministic(void **state) {
  (void)state;
  wagma_dataset_t tr;
  char err[256];
  wagma_synthetic_config_t cfg = wagma_synthetic_defaults(500, 3, 0);
  assert_int_equal(wagma_dataset_synthetic(&tr, &cfg, err, sizeof(err)), 0);
  wagma_optim_config_t ocfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  ocfg.nesterov = 1;
  ocfg.weight_decay = 1e-4f;
  wagma_model_t *a = train("lenet5", &ocfg, &tr, 20, 16, 5, NULL);
  wagma_model_t *b = train("lenet5", &ocfg, &tr, 20, 16, 5, NULL);
  wagma_model_t *c = train("lenet5", &ocfg, &tr, 20, 16, 6, NULL);
  size_t n = wagma_model_param_count(a);
  assert_memory_equal(wagma_model_params(a), wagma_model_params(b), n * sizeof(float));
  assert_memory_not_equal(wagma_model_params(a), wagma_model_params(c), n * sizeof(float));
  wagma_model_destroy(a);
  wagma_model_destroy(b);
  wagma_model_destroy(c);
  wagma_dataset_free(&tr);
}

static void mlp_learns_fashion_mnist(void **state) {
  (void)state;
  if (access(WAGMA_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
    print_message("fashion-mnist not installed under %s: skipped\n", WAGMA_FASHION_MNIST_DIR);
    skip();
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  wagma_dataset_t tr, te;
  char err[512];
  assert_int_equal(wagma_dataset_load_fashion_mnist(NULL, &tr, &te, err, sizeof(err)), 0);
  wagma_optim_config_t ocfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  ocfg.schedule.lr = 0.02f;
  ocfg.schedule.warmup_steps = 20;
  wagma_model_t *m = train("mlp", &ocfg, &tr, 300, 64, 1, NULL);
  wagma_eval_t e;
  assert_int_equal(wagma_model_evaluate(m, &te, 0, 2000, &e), 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double acc = (double)e.correct / (double)e.n;
  print_message("fashion-mnist mlp, 300 steps of 64: test loss %.3f, accuracy %.3f (%.1f s)\n",
                e.loss, acc, (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
  /* 300 steps is under a third of an epoch; chance is 0.1, a trained MLP reaches ~0.88. */
  assert_true(acc > 0.75);
  assert_true(e.loss < 0.7);
  wagma_model_destroy(m);
  wagma_dataset_free(&tr);
  wagma_dataset_free(&te);
}

int train_run_tests(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(model_specs_parse_and_validate),
      cmocka_unit_test(forward_rejects_bad_batches),
      cmocka_unit_test(init_is_deterministic),
      cmocka_unit_test(training_on_synthetic_data_converges),
      cmocka_unit_test(training_is_deterministic),
      cmocka_unit_test(mlp_learns_fashion_mnist),
  };
  return cmocka_run_group_tests_name("train/models+training", tests, NULL, NULL);
}
