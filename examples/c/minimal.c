/* examples/c/minimal.c — the smallest wagma program in C: logistic regression on a synthetic,
 * linearly separable data set, trained in a wagma job through the worker library (libwagma,
 * wagma/worker.h). The agent launches it (wagma-agent --programs DIR); a job spec names it:
 *   {"program": {"name": "minimal"}, "algorithm": "wagma", "workers": 4, "iterations": 500}
 * Build: cc minimal.c $(pkg-config --cflags --libs wagma) -lm -o minimal
 * Arguments: --lr X (default 0.5), --echo-args (print argv, one per line, and go on). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wagma/worker.h"

#define DIM 16
#define SAMPLES 4096

static uint64_t rng(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *s) {
  return (double)(rng(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* The data is the same on every member (a fixed seed): x uniform, y = [w_true . x > 0]. */
static float X[SAMPLES][DIM];
static int Y[SAMPLES];

static void make_data(void) {
  uint64_t s = 42;
  double truth[DIM];
  for (int d = 0; d < DIM; d++)
    truth[d] = uniform(&s);
  for (int i = 0; i < SAMPLES; i++) {
    double dot = 0;
    for (int d = 0; d < DIM; d++)
      dot += truth[d] * (X[i][d] = (float)uniform(&s));
    Y[i] = dot > 0;
  }
}

/* Loss and accuracy of w (DIM weights + bias) on samples [from, to). */
static void evaluate(const float *w, int from, int to, double *loss, double *acc) {
  double l = 0;
  int right = 0;
  for (int i = from; i < to; i++) {
    double z = w[DIM];
    for (int d = 0; d < DIM; d++)
      z += w[d] * X[i][d];
    double p = 1.0 / (1.0 + exp(-z));
    l -= Y[i] ? log(p + 1e-12) : log(1 - p + 1e-12);
    right += (p > 0.5) == Y[i];
  }
  *loss = l / (to - from);
  *acc = (double)right / (to - from);
}

static void log_line(void *user, int level, const char *msg) {
  (void)user;
  fprintf(stderr, "minimal: [%d] %s\n", level, msg);
}

int main(int argc, char **argv) {
  double lr = 0.5;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--lr") == 0 && i + 1 < argc)
      lr = atof(argv[++i]);
    else if (strcmp(argv[i], "--echo-args") == 0)
      for (int k = 1; k < argc; k++)
        printf("arg %d: %s\n", k, argv[k]);
  }
  fflush(stdout);
  wagma_worker_t *w;
  wagma_worker_config_t cfg;
  int e = wagma_worker_open(NULL, log_line, NULL, &w);
  if (e) {
    fprintf(stderr, "minimal: cannot open the worker: %s\n", wagma_strerror(e));
    return 1;
  }
  wagma_worker_config(w, &cfg);
  make_data();
  float params[DIM + 1] = {0}; /* the same start on every member */
  if ((e = wagma_worker_register(w, params, DIM + 1, NULL, NULL))) {
    fprintf(stderr, "minimal: %s\n", wagma_worker_last_error(w));
    wagma_worker_close(w);
    return 1;
  }
  uint64_t s = cfg.seed + 1000u * (uint64_t)(cfg.agent[strlen(cfg.agent) - 1]);
  int batch = cfg.batch_size > 0 && cfg.batch_size < SAMPLES ? cfg.batch_size : 32;
  float grad[DIM + 1];
  while (!wagma_worker_should_stop(w)) {
    memset(grad, 0, sizeof grad);
    double loss = 0;
    for (int b = 0; b < batch; b++) {
      int i = (int)(rng(&s) % (SAMPLES * 3 / 4)); /* the last quarter is the test set */
      double z = params[DIM];
      for (int d = 0; d < DIM; d++)
        z += params[d] * X[i][d];
      double p = 1.0 / (1.0 + exp(-z)), g = p - Y[i];
      loss -= Y[i] ? log(p + 1e-12) : log(1 - p + 1e-12);
      for (int d = 0; d < DIM; d++)
        grad[d] += (float)(g * X[i][d] / batch);
      grad[DIM] += (float)(g / batch);
    }
    if ((e = wagma_worker_average_gradients(w, grad)))
      break;
    for (int d = 0; d <= DIM; d++)
      params[d] -= (float)lr * grad[d];
    if ((e = wagma_worker_step(w)))
      break;
    wagma_worker_report(w, loss / batch, NAN);
  }
  if (e && e != WAGMA_ECANCELED) {
    fprintf(stderr, "minimal: %s\n", wagma_worker_last_error(w));
    wagma_worker_fail(w, wagma_worker_last_error(w));
  } else if (!e) {
    double loss, acc;
    if ((e = wagma_worker_final_average(w)) == 0) {
      evaluate(params, SAMPLES * 3 / 4, SAMPLES, &loss, &acc);
      printf("final: loss %.4f, test accuracy %.4f\n", loss, acc);
      e = wagma_worker_done(w, loss, acc);
    }
    if (e)
      fprintf(stderr, "minimal: %s\n", wagma_worker_last_error(w));
  }
  wagma_worker_close(w);
  return e && e != WAGMA_ECANCELED ? 1 : 0;
}
