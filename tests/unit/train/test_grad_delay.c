/* test_train_delay: the gradient delay line (agent/train/grad_delay.c).
 *
 * - the FIFO hands back g(t - d) at push t and nothing during the first d pushes, on the CPU
 *   and on the host emulation of the CUDA backend (buffers reached only through upload and
 *   download);
 * - a training run with delay d reproduces, loss for loss, plain SGD fed the gradients of d
 *   steps ago computed directly (w -= lr * g(t - d) by hand on the host, from a history of
 *   every gradient), and momentum SGD and Adam fed that history;
 * - out-of-range delays are refused with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/train/backend.h"
#include "agent/train/train.h"
#include "test_train.h"

#define STEPS 48
#define BATCH 16

static wagma_grad_delay_t *make_line(wagma_backend_t *b, size_t n, unsigned d) {
  wagma_grad_delay_t *q = NULL;
  char err[256] = "";
  int rc = wagma_grad_delay_create_on(b, n, d, &q, err, sizeof err);
  if (rc)
    print_error("%s\n", err);
  assert_int_equal(rc, 0);
  return q;
}

/* Pushes g_t = (t, t + 0.5, ...) and checks what comes back, reading the backend's buffers
 * only through download. */
static void check_fifo_order(wagma_backend_t *b) {
  enum { N = 5 };
  for (unsigned d = 0; d <= 7; d++) {
    wagma_grad_delay_t *q = make_line(b, N, d);
    float *dev = b->ops->alloc(b, N * sizeof(float));
    assert_non_null(dev);
    assert_int_equal(wagma_grad_delay_length(q), d);
    for (int t = 0; t < 30; t++) {
      float host[N], got[N];
      for (int i = 0; i < N; i++)
        host[i] = (float)t + 0.5f * (float)i;
      assert_int_equal(b->ops->upload(b, dev, host, sizeof host), 0);
      const float *g = wagma_grad_delay_push(q, dev);
      if ((unsigned)t < d) {
        assert_null(g);
        continue;
      }
      assert_non_null(g);
      /* The input buffer is overwritten before the next push: the line must have copied. */
      assert_int_equal(b->ops->download(b, got, g, sizeof got), 0);
      for (int i = 0; i < N; i++)
        assert_true(got[i] == (float)(t - (int)d) + 0.5f * (float)i);
    }
    assert_int_equal(wagma_grad_delay_pushed(q), 30);
    wagma_grad_delay_clear(q);
    if (d > 0) {
      float host[N] = {1, 2, 3, 4, 5};
      assert_int_equal(b->ops->upload(b, dev, host, sizeof host), 0);
      assert_null(wagma_grad_delay_push(q, dev));
    }
    b->ops->free(b, dev);
    wagma_grad_delay_destroy(q);
  }
}

static void fifo_returns_gradient_of_d_pushes_ago_cpu(void **state) {
  (void)state;
  check_fifo_order(wagma_backend_cpu());
}

static void fifo_returns_gradient_of_d_pushes_ago_emulated_device(void **state) {
  (void)state;
  wagma_backend_t *emu = test_emu_backend_open();
  assert_non_null(emu);
  check_fifo_order(emu);
  wagma_backend_close(emu);
}

static void bad_delays_are_refused(void **state) {
  (void)state;
  wagma_grad_delay_t *q = (wagma_grad_delay_t *)&q;
  char err[256] = "";
  assert_int_equal(
      wagma_grad_delay_create_on(NULL, 10, WAGMA_GRAD_DELAY_MAX + 1, &q, err, sizeof err),
      WAGMA_EINVAL);
  assert_non_null(strstr(err, "delay"));
  err[0] = '\0';
  assert_int_equal(wagma_grad_delay_create_on(NULL, 0, 3, &q, err, sizeof err), WAGMA_EINVAL);
  assert_true(strlen(err) > 0);
  q = make_line(NULL, 10, WAGMA_GRAD_DELAY_MAX);
  wagma_grad_delay_destroy(q);
}

/* The training fixture: synthetic data, a softmax model, one fixed batch stream. */
typedef struct run_fixture {
  wagma_dataset_t ds;
  wagma_batch_t batch[STEPS];
} run_fixture_t;

static void fixture_init(run_fixture_t *f) {
  char err[256] = "";
  wagma_synthetic_config_t cfg = wagma_synthetic_defaults(1000, 11, 0);
  memset(f, 0, sizeof *f);
  assert_int_equal(wagma_dataset_synthetic(&f->ds, &cfg, err, sizeof err), 0);
  wagma_sampler_t s;
  assert_int_equal(wagma_sampler_init(&s, f->ds.n, WAGMA_SAMPLE_SHUFFLE, 5), 0);
  for (int t = 0; t < STEPS; t++) {
    assert_int_equal(wagma_batch_alloc(&f->batch[t], BATCH, f->ds.features), 0);
    assert_int_equal(wagma_batch_draw(&f->batch[t], &s, &f->ds, BATCH), 0);
  }
  wagma_sampler_free(&s);
}

static void fixture_free(run_fixture_t *f) {
  for (int t = 0; t < STEPS; t++)
    wagma_batch_free(&f->batch[t]);
  wagma_dataset_free(&f->ds);
}

static wagma_model_t *make_model(wagma_backend_t *b) {
  wagma_model_config_t cfg = wagma_model_defaults(WAGMA_ARCH_SOFTMAX);
  wagma_model_t *m = NULL;
  char err[256] = "";
  cfg.max_batch = BATCH;
  int rc = wagma_model_create_on(b, &cfg, &m, err, sizeof err);
  if (rc)
    print_error("%s\n", err);
  assert_int_equal(rc, 0);
  wagma_model_init(m, 3);
  return m;
}

static wagma_optim_t *make_optim(wagma_backend_t *b, const wagma_optim_config_t *cfg, size_t n) {
  wagma_optim_t *o = NULL;
  char err[256] = "";
  int rc = wagma_optim_create_on(b, cfg, n, &o, err, sizeof err);
  if (rc)
    print_error("%s\n", err);
  assert_int_equal(rc, 0);
  return o;
}

/* The run under test: the library's delay line in front of the optimizer, on backend b.
 * loss[t] = the loss of batch t at the parameters before step t. */
static void run_with_delay_line(const run_fixture_t *f, wagma_backend_t *b,
                                const wagma_optim_config_t *cfg, unsigned d, double *loss) {
  wagma_model_t *m = make_model(b);
  size_t n = wagma_model_param_count(m);
  wagma_optim_t *o = make_optim(b, cfg, n);
  wagma_grad_delay_t *q = make_line(b, n, d);
  int steps = 0;
  for (int t = 0; t < STEPS; t++) {
    wagma_eval_t ev;
    assert_int_equal(wagma_model_forward(m, f->batch[t].x, f->batch[t].y, BATCH, &ev), 0);
    assert_int_equal(wagma_model_backward(m), 0);
    loss[t] = ev.loss;
    steps +=
        wagma_optim_step_delayed(o, q, (uint64_t)t, wagma_model_params(m), wagma_model_grads(m));
  }
  assert_int_equal(steps, STEPS - (int)d);
  assert_int_equal(wagma_optim_updates(o), (uint64_t)(STEPS - (int)d));
  wagma_grad_delay_destroy(q);
  wagma_optim_destroy(o);
  wagma_model_destroy(m);
}

/* The direct computation, on the CPU: every gradient kept in a host history; at step t >= d
 * the parameters move by g(t - d): by hand (w -= lr * g) when optim is NULL, else through an
 * optimizer fed the history's entry. */
static void run_direct(const run_fixture_t *f, const wagma_optim_config_t *cfg, int by_hand,
                       unsigned d, double *loss) {
  wagma_model_t *m = make_model(NULL);
  size_t n = wagma_model_param_count(m);
  wagma_optim_t *o = by_hand ? NULL : make_optim(NULL, cfg, n);
  float *history = malloc((size_t)STEPS * n * sizeof(float));
  float *w = malloc(n * sizeof(float));
  assert_non_null(history);
  assert_non_null(w);
  for (int t = 0; t < STEPS; t++) {
    wagma_eval_t ev;
    assert_int_equal(wagma_model_forward(m, f->batch[t].x, f->batch[t].y, BATCH, &ev), 0);
    assert_int_equal(wagma_model_backward(m), 0);
    loss[t] = ev.loss;
    assert_int_equal(wagma_model_get_grads(m, history + (size_t)t * n), 0);
    if ((unsigned)t < d)
      continue;
    const float *old = history + (size_t)(t - (int)d) * n;
    if (by_hand) {
      assert_int_equal(wagma_model_get_params(m, w), 0);
      for (size_t i = 0; i < n; i++)
        w[i] -= cfg->schedule.lr * old[i];
      assert_int_equal(wagma_model_set_params(m, w), 0);
    } else {
      wagma_optim_step(o, (uint64_t)t, wagma_model_params(m), old);
    }
  }
  free(w);
  free(history);
  wagma_optim_destroy(o);
  wagma_model_destroy(m);
}

static double max_abs_diff(const double *a, const double *b) {
  double worst = 0;
  for (int t = 0; t < STEPS; t++)
    worst = fmax(worst, fabs(a[t] - b[t]));
  return worst;
}

static void delayed_sgd_loss_matches_direct_computation(void **state) {
  (void)state;
  run_fixture_t f;
  fixture_init(&f);
  wagma_optim_config_t sgd = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  sgd.schedule.lr = 0.2f;
  sgd.momentum = 0.0f;
  double with_line[STEPS], direct[STEPS], undelayed[STEPS];
  const unsigned delays[] = {0, 1, 5, 13};
  for (size_t k = 0; k < sizeof delays / sizeof delays[0]; k++) {
    const unsigned d = delays[k];
    run_with_delay_line(&f, NULL, &sgd, d, with_line);
    run_direct(&f, &sgd, 1, d, direct);
    double diff = max_abs_diff(with_line, direct);
    print_message("delay %2u: plain SGD, max |loss - direct| = %.3g, final loss %.4f\n", d, diff,
                  with_line[STEPS - 1]);
    assert_true(diff <= 1e-5);
  }
  /* The property is not vacuous: a delay changes the trajectory (and d - 1 is not d). */
  run_with_delay_line(&f, NULL, &sgd, 0, undelayed);
  run_with_delay_line(&f, NULL, &sgd, 13, with_line);
  assert_true(max_abs_diff(with_line, undelayed) > 1e-3);
  run_direct(&f, &sgd, 1, 12, direct);
  assert_true(max_abs_diff(with_line, direct) > 1e-4);
  fixture_free(&f);
}

static void delayed_momentum_and_adam_match_an_optimizer_fed_old_gradients(void **state) {
  (void)state;
  run_fixture_t f;
  fixture_init(&f);
  wagma_optim_config_t cfgs[2] = {wagma_optim_defaults(WAGMA_OPTIM_SGD),
                                  wagma_optim_defaults(WAGMA_OPTIM_ADAM)};
  cfgs[0].schedule.lr = 0.05f;
  cfgs[0].momentum = 0.9f;
  cfgs[1].schedule.lr = 0.01f;
  double with_line[STEPS], direct[STEPS];
  for (int c = 0; c < 2; c++) {
    run_with_delay_line(&f, NULL, &cfgs[c], 6, with_line);
    run_direct(&f, &cfgs[c], 0, 6, direct);
    double diff = max_abs_diff(with_line, direct);
    print_message("delay 6: %s, max |loss - direct| = %.3g\n", c ? "adam" : "sgd momentum 0.9",
                  diff);
    assert_true(diff <= 1e-6);
  }
  fixture_free(&f);
}

/* The delay line on the emulated device backend (device buffers, stream-ordered copies)
 * against the direct computation on the CPU. */
static void delayed_run_on_emulated_device_matches_cpu(void **state) {
  (void)state;
  run_fixture_t f;
  fixture_init(&f);
  wagma_backend_t *emu = test_emu_backend_open();
  assert_non_null(emu);
  wagma_optim_config_t sgd = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  sgd.schedule.lr = 0.05f;
  double with_line[STEPS], direct[STEPS];
  run_with_delay_line(&f, emu, &sgd, 4, with_line);
  run_direct(&f, &sgd, 0, 4, direct);
  double diff = max_abs_diff(with_line, direct);
  print_message("delay 4 on cuda-emu: max |loss - cpu direct| = %.3g\n", diff);
  assert_true(diff <= 1e-4);
  wagma_backend_close(emu);
  fixture_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fifo_returns_gradient_of_d_pushes_ago_cpu),
      cmocka_unit_test(fifo_returns_gradient_of_d_pushes_ago_emulated_device),
      cmocka_unit_test(bad_delays_are_refused),
      cmocka_unit_test(delayed_sgd_loss_matches_direct_computation),
      cmocka_unit_test(delayed_momentum_and_adam_match_an_optimizer_fed_old_gradients),
      cmocka_unit_test(delayed_run_on_emulated_device_matches_cpu),
  };
  return cmocka_run_group_tests_name("train_grad_delay", tests, NULL, NULL);
}
