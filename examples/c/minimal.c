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

#include "minimal_data.h" /* DIM, SAMPLES, X, Y, rng, make_data, evaluate */

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
