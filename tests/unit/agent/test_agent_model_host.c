/* test_agent_model_host.c — agent/model_host.c, the job's model as host memory for the
 * collective, on the CPU backend and on "cuda-emu" (the CUDA backend's algorithm on the host
 * with device memory reachable only through upload / download, tests/unit/train/emu_backend.c):
 *  - CPU: the collective works on the model's own buffers (no mirror, no copy);
 *  - device: wg_model_host_params / _grads fill the mirror with the device buffer (equal to the
 * same model on the CPU), and what the collective writes into the mirror reaches the device through
 *    *_back (the parameters, the gradients before the update, and params | optimizer
 *    state of the global sync). A no-op download or upload fails these checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent/model_host.h"
#include "tests/unit/train/test_train.h"

typedef struct pair {
  wagma_backend_t *emu;
  wg_model_host_t cpu, dev;
} pair_t;

static void job_on(wg_model_host_t *j, wagma_backend_t *b) {
  char err[256];
  wagma_model_t *model;
  wagma_optim_t *optim;
  wagma_model_config_t mc = wagma_model_defaults(WAGMA_ARCH_MLP);
  mc.max_batch = 8;
  assert_int_equal(wagma_model_create_on(b, &mc, &model, err, sizeof err), 0);
  wagma_model_init(model, 42);
  wagma_optim_config_t oc = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  assert_int_equal(
      wagma_optim_create_on(b, &oc, wagma_model_param_count(model), &optim, err, sizeof err), 0);
  assert_int_equal(wg_model_host_init(j, model, optim), 0);
  assert_int_equal(j->nparams, wagma_model_param_count(model));
}

static void job_free(wg_model_host_t *j) {
  wagma_model_t *model = j->model;
  wagma_optim_t *optim = j->optim;
  wg_model_host_free(j);
  wagma_optim_destroy(optim);
  wagma_model_destroy(model);
}

static int setup(void **state) {
  pair_t *p = calloc(1, sizeof *p);
  p->emu = test_emu_backend_open();
  if (!p->emu)
    return -1;
  job_on(&p->cpu, wagma_backend_cpu());
  job_on(&p->dev, p->emu);
  *state = p;
  return 0;
}

static int teardown(void **state) {
  pair_t *p = *state;
  job_free(&p->cpu);
  job_free(&p->dev);
  wagma_backend_close(p->emu);
  free(p);
  return 0;
}

static void test_cpu_uses_the_model_in_place(void **state) {
  pair_t *p = *state;
  int e = -1;
  assert_null(p->cpu.params);
  assert_ptr_equal(wg_model_host_params(&p->cpu, &e), wagma_model_params(p->cpu.model));
  assert_int_equal(e, 0);
  assert_ptr_equal(wg_model_host_grads(&p->cpu, &e), wagma_model_grads(p->cpu.model));
  assert_int_equal(wg_model_host_params_back(&p->cpu), 0);
}

static void test_params_round_trip_through_the_device(void **state) {
  pair_t *p = *state;
  int e = -1;
  size_t n = p->dev.nparams;
  float *cpu = wg_model_host_params(&p->cpu, &e);
  float *host = wg_model_host_params(&p->dev, &e);
  assert_int_equal(e, 0);
  assert_non_null(host);
  assert_ptr_not_equal(host, wagma_model_params(p->dev.model)); /* a mirror */
  for (size_t i = 0; i < n; i++)
    assert_true(host[i] == cpu[i]); /* same init, downloaded */
  /* what the collective writes into the mirror reaches the device */
  for (size_t i = 0; i < n; i++)
    host[i] = 0.5f * host[i] + (float)(i % 7);
  assert_int_equal(wg_model_host_params_back(&p->dev), 0);
  float *check = malloc(n * sizeof *check);
  assert_int_equal(wagma_model_get_params(p->dev.model, check), 0);
  for (size_t i = 0; i < n; i++)
    assert_true(check[i] == 0.5f * cpu[i] + (float)(i % 7));
  /* and back: a later download sees the device's parameters, not a stale mirror */
  memset(host, 0, n * sizeof *host);
  assert_non_null(wg_model_host_params(&p->dev, &e));
  for (size_t i = 0; i < n; i++)
    assert_true(host[i] == check[i]);
  free(check);
}

/* The allreduce baseline: gradients averaged on the host are the ones the update uses. */
static void test_grads_written_back_drive_the_update(void **state) {
  pair_t *p = *state;
  int e = -1;
  size_t n = p->dev.nparams;
  float *before = malloc(n * sizeof *before), *after = malloc(n * sizeof *after);
  float x[8 * 784];
  int32_t y[8];
  for (int i = 0; i < 8 * 784; i++)
    x[i] = (float)((i * 37) % 101) / 101.0f;
  for (int i = 0; i < 8; i++)
    y[i] = i % 10;
  assert_int_equal(wagma_model_forward(p->dev.model, x, y, 8, NULL), 0);
  assert_int_equal(wagma_model_backward(p->dev.model), 0);
  float *g = wg_model_host_grads(&p->dev, &e);
  assert_non_null(g);
  double norm = 0;
  for (size_t i = 0; i < n; i++)
    norm += fabs(g[i]);
  assert_true(norm > 0); /* the device's gradient was downloaded */
  for (size_t i = 0; i < n; i++)
    g[i] = 1.0f; /* "the mean over the members" */
  assert_int_equal(wg_model_host_grads_back(&p->dev), 0);
  assert_int_equal(wagma_model_get_params(p->dev.model, before), 0);
  wagma_optim_step(p->dev.optim, 0, wagma_model_params(p->dev.model),
                   wagma_model_grads(p->dev.model));
  assert_int_equal(wagma_model_get_params(p->dev.model, after), 0);
  float lr = (float)wagma_lr_at(&wagma_optim_config(p->dev.optim)->schedule, 0);
  for (size_t i = 0; i < n; i++) /* first SGD step: velocity = g, w -= lr * g */
    assert_float_equal(after[i], before[i] - lr * 1.0f, 1e-5);
  free(before);
  free(after);
}

/* The global sync: params | optimizer state out to a host buffer and back. */
static void test_state_round_trip(void **state) {
  pair_t *p = *state;
  size_t n = p->dev.nparams + p->dev.nstate;
  assert_true(p->dev.nstate > 0); /* SGD with momentum: the velocity */
  float *buf = malloc(n * sizeof *buf), *state_back = malloc(p->dev.nstate * sizeof(float));
  assert_int_equal(wg_model_host_state_save(&p->dev, buf), 0);
  for (size_t i = 0; i < n; i++)
    buf[i] = (float)i * 0.001f;
  assert_int_equal(wg_model_host_state_load(&p->dev, buf), 0);
  float *params = malloc(p->dev.nparams * sizeof *params);
  assert_int_equal(wagma_model_get_params(p->dev.model, params), 0);
  assert_int_equal(wagma_optim_get_state(p->dev.optim, state_back), 0);
  for (size_t i = 0; i < p->dev.nparams; i++)
    assert_true(params[i] == buf[i]);
  for (size_t i = 0; i < p->dev.nstate; i++)
    assert_true(state_back[i] == buf[p->dev.nparams + i]);
  free(buf);
  free(state_back);
  free(params);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_uses_the_model_in_place),
      cmocka_unit_test(test_params_round_trip_through_the_device),
      cmocka_unit_test(test_grads_written_back_drive_the_update),
      cmocka_unit_test(test_state_round_trip),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
