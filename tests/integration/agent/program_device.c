/* program_device.c — a test program (test_agent_programs) for libwagma's device buffers
 * without a GPU: examples/c/minimal's logistic regression with its parameters and gradients in
 * "device" memory of tests/fake_cudart (PROT_NONE except inside the fake's copies), registered
 * with wagma_worker_use_cuda. libwagma must stage them through its host mirrors: a direct read
 * or write of a device pointer is a SIGSEGV (the member fails), a copy in the wrong direction
 * is refused. The program computes on its own host copy and moves it with cudaMemcpy, and
 * checks that the library copied too: every wagma step downloads and uploads the parameters,
 * every allreduce step the gradients; otherwise it reports "failed". Its last stdout line says
 * "device: library copies H to host, D to device over S steps". Same data, loss and result
 * contract as minimal (final model, test accuracy). The agent sets WAGMA_CUDART to the fake. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wagma/worker.h"

int cudaMalloc(void **p, size_t bytes);
int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind);
void fake_cudart_counts(unsigned long *to_device, unsigned long *to_host);
enum { H2D = 1, D2H = 2 };

#include "examples/c/minimal_data.h" /* minimal.c's data set and evaluation */

static void log_line(void *user, int level, const char *msg) {
  (void)user;
  fprintf(stderr, "device: [%d] %s\n", level, msg);
}

/* This program's own copies, to tell them from the library's. */
static unsigned long own_d, own_h;

static void put(float *dev, const float *host) {
  if (cudaMemcpy(dev, host, (DIM + 1) * sizeof(float), H2D) != 0)
    abort();
  own_d++;
}

static void get(float *host, const float *dev) {
  if (cudaMemcpy(host, dev, (DIM + 1) * sizeof(float), D2H) != 0)
    abort();
  own_h++;
}

int main(void) {
  wagma_worker_t *w;
  wagma_worker_config_t cfg;
  int e = wagma_worker_open(NULL, log_line, NULL, &w);
  if (e) {
    fprintf(stderr, "device: cannot open the worker: %s\n", wagma_strerror(e));
    return 1;
  }
  wagma_worker_config(w, &cfg);
  make_data();
  float params[DIM + 1] = {0}, grad[DIM + 1];
  float *dparams, *dgrad;
  if (cudaMalloc((void **)&dparams, sizeof params) || cudaMalloc((void **)&dgrad, sizeof grad))
    return 1;
  put(dparams, params);
  if ((e = wagma_worker_use_cuda(w, NULL)) ||
      (e = wagma_worker_register(w, dparams, DIM + 1, NULL, NULL))) {
    fprintf(stderr, "device: %s\n", wagma_worker_last_error(w));
    wagma_worker_close(w);
    return 1;
  }
  get(params, dparams); /* a joiner's model came through the library */
  int allreduce = strcmp(cfg.algorithm, "allreduce") == 0, wagma = !strcmp(cfg.algorithm, "wagma");
  uint64_t s = cfg.seed + 1000u * (uint64_t)(cfg.agent[strlen(cfg.agent) - 1]);
  int batch = cfg.batch_size > 0 && cfg.batch_size < SAMPLES ? cfg.batch_size : 32;
  unsigned long steps = 0, staged_h = 0, staged_d = 0, before_d, before_h, after_d, after_h;
  const char *broken = NULL;
  while (!broken && !wagma_worker_should_stop(w)) {
    memset(grad, 0, sizeof grad);
    double loss = 0;
    for (int b = 0; b < batch; b++) {
      int i = (int)(rng(&s) % (SAMPLES * 3 / 4));
      double z = params[DIM];
      for (int d = 0; d < DIM; d++)
        z += params[d] * X[i][d];
      double p = 1.0 / (1.0 + exp(-z)), g = p - Y[i];
      loss -= Y[i] ? log(p + 1e-12) : log(1 - p + 1e-12);
      for (int d = 0; d < DIM; d++)
        grad[d] += (float)(g * X[i][d] / batch);
      grad[DIM] += (float)(g / batch);
    }
    put(dgrad, grad);
    fake_cudart_counts(&before_d, &before_h);
    if ((e = wagma_worker_average_gradients(w, dgrad)))
      break;
    fake_cudart_counts(&after_d, &after_h);
    if (allreduce && (after_d == before_d || after_h == before_h))
      broken = "the gradients were not staged through the library's mirror";
    get(grad, dgrad);
    for (int d = 0; d <= DIM; d++)
      params[d] -= 0.5f * grad[d];
    put(dparams, params);
    fake_cudart_counts(&before_d, &before_h);
    if ((e = wagma_worker_step(w)))
      break;
    fake_cudart_counts(&after_d, &after_h);
    staged_d += after_d - before_d;
    staged_h += after_h - before_h;
    if (wagma && (after_d == before_d || after_h == before_h))
      broken = "a wagma step did not stage the parameters through the library's mirror";
    get(params, dparams); /* what the averaging wrote */
    steps++;
    wagma_worker_report(w, loss / batch, NAN);
  }
  if (broken) {
    fprintf(stderr, "device: %s\n", broken);
    wagma_worker_fail(w, broken);
  } else if (e && e != WAGMA_ECANCELED) {
    fprintf(stderr, "device: %s\n", wagma_worker_last_error(w));
    wagma_worker_fail(w, wagma_worker_last_error(w));
  } else if (!e) {
    double loss, acc;
    if ((e = wagma_worker_final_average(w)) == 0) {
      get(params, dparams);
      evaluate(params, SAMPLES * 3 / 4, SAMPLES, &loss, &acc);
      printf("device: library copies %lu to host, %lu to device over %lu steps\n", staged_h,
             staged_d, steps);
      fflush(stdout);
      e = wagma_worker_done(w, loss, acc);
    }
    if (e)
      fprintf(stderr, "device: %s\n", wagma_worker_last_error(w));
  }
  wagma_worker_close(w);
  return e && e != WAGMA_ECANCELED ? 1 : 0;
}
