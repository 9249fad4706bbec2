/* bench_delay — the delayed-gradient study: how a constant gradient delay d affects SGD with
 * momentum and Adam (the literature's claim: SGD with momentum breaks past a delay of about
 * 32 while Adam holds much longer).
 *
 * Each cell trains the MLP (784-256-128-10, ReLU) on Fashion-MNIST for --steps steps of batch
 * --batch from the same seed and the same minibatch stream, with the optimizer's gradient taken
 * from the training library's delay line (wagma_optim_step_delayed: step t applies g(t - d);
 * the first d steps apply nothing), and reports the final test accuracy on the whole test set.
 * Baseline: the same optimizer and learning rate at delay 0, in the same run; the table gives
 * each cell's accuracy and its ratio to that baseline.
 *
 * Usage: bench_delay [--steps 2000] [--batch 64] [--delays 0,8,32,128] [--data DIR]
 *        [--synthetic N] [--threads 1] [--rows all|sgd|adam] [--sgd-momentum 0.9]
 * (--sgd-momentum 0 --rows sgd: the control without momentum.)
 * Output: a markdown table on stdout, one line per cell on stderr as it finishes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/train/train.h"

typedef struct setting {
  const char *name;
  int kind;
  float lr;
} setting_t;

static float sgd_momentum = 0.9f;

static const setting_t settings[] = {
    {"SGD", WAGMA_OPTIM_SGD, 0.01f},   {"SGD", WAGMA_OPTIM_SGD, 0.05f},
    {"SGD", WAGMA_OPTIM_SGD, 0.2f},    {"Adam", WAGMA_OPTIM_ADAM, 3e-4f},
    {"Adam", WAGMA_OPTIM_ADAM, 1e-3f}, {"Adam", WAGMA_OPTIM_ADAM, 3e-3f},
};
#define NSETTINGS ((int)(sizeof settings / sizeof settings[0]))
#define MAX_DELAYS 16

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *err) {
  fprintf(stderr, "bench_delay: %s: %s\n", what, err);
  exit(1);
}

/* One cell: final test accuracy (and the last 100 steps' mean training loss in *loss). */
static double run_cell(const wagma_dataset_t *train, const wagma_dataset_t *test,
                       const setting_t *s, unsigned delay, int steps, int batch, double *loss) {
  char err[256] = "";
  wagma_model_config_t mc;
  wagma_model_t *m = NULL;
  wagma_optim_t *o = NULL;
  wagma_grad_delay_t *q = NULL;
  if (wagma_model_config_parse("mlp", &mc, err, sizeof err))
    die("model", err);
  mc.max_batch = (size_t)batch;
  if (wagma_model_create(&mc, &m, err, sizeof err))
    die("model", err);
  wagma_model_init(m, 1);
  size_t n = wagma_model_param_count(m);
  wagma_optim_config_t oc = wagma_optim_defaults(s->kind);
  oc.schedule.lr = s->lr;
  if (s->kind == WAGMA_OPTIM_SGD)
    oc.momentum = sgd_momentum;
  if (wagma_optim_create(&oc, n, &o, err, sizeof err) ||
      wagma_grad_delay_create_on(NULL, n, delay, &q, err, sizeof err))
    die("optimizer", err);
  wagma_sampler_t sampler;
  wagma_batch_t b;
  if (wagma_sampler_init(&sampler, train->n, WAGMA_SAMPLE_SHUFFLE, wagma_seed_derive(1, "w0")) ||
      wagma_batch_alloc(&b, (size_t)batch, train->features))
    die("sampler", "out of memory");
  double tail = 0;
  int tail_n = 0;
  for (int t = 0; t < steps; t++) {
    wagma_eval_t ev;
    if (wagma_batch_draw(&b, &sampler, train, (size_t)batch) ||
        wagma_model_forward(m, b.x, b.y, b.n, &ev) || wagma_model_backward(m))
      die("step", "forward/backward failed");
    wagma_optim_step_delayed(o, q, (uint64_t)t, wagma_model_params(m), wagma_model_grads(m));
    if (t >= steps - 100) {
      tail += ev.loss;
      tail_n++;
    }
  }
  wagma_eval_t te;
  if (wagma_model_evaluate(m, test, 0, 0, &te))
    die("evaluate", "failed");
  *loss = tail_n ? tail / tail_n : 0;
  wagma_batch_free(&b);
  wagma_sampler_free(&sampler);
  wagma_grad_delay_destroy(q);
  wagma_optim_destroy(o);
  wagma_model_destroy(m);
  return te.n ? (double)te.correct / (double)te.n : 0;
}

int main(int argc, char **argv) {
  int steps = 2000, batch = 64, threads = 1, ndelays = 0;
  size_t synthetic = 0;
  unsigned delays[MAX_DELAYS];
  const char *data = NULL, *dlist = "0,8,32,128", *rows = "all";
  char err[256] = "";
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "usage: see bench/delay/bench_delay.c\n");
      return 2;
    }
    if (!strcmp(argv[i], "--steps"))
      steps = atoi(v);
    else if (!strcmp(argv[i], "--batch"))
      batch = atoi(v);
    else if (!strcmp(argv[i], "--delays"))
      dlist = v;
    else if (!strcmp(argv[i], "--data"))
      data = v;
    else if (!strcmp(argv[i], "--synthetic"))
      synthetic = (size_t)atol(v);
    else if (!strcmp(argv[i], "--threads"))
      threads = atoi(v);
    else if (!strcmp(argv[i], "--rows"))
      rows = v;
    else if (!strcmp(argv[i], "--sgd-momentum"))
      sgd_momentum = (float)atof(v);
    else {
      fprintf(stderr, "bench_delay: unknown option %s\n", argv[i]);
      return 2;
    }
    i++;
  }
  for (const char *p = dlist; *p && ndelays < MAX_DELAYS;) {
    delays[ndelays++] = (unsigned)strtoul(p, (char **)&p, 10);
    if (*p == ',')
      p++;
  }
  if (steps < 1 || batch < 1 || batch > 4096 || ndelays == 0 || wagma_train_set_threads(threads))
    die("arguments", "bad --steps, --batch, --delays or --threads");
  wagma_dataset_t train, test;
  memset(&train, 0, sizeof train);
  memset(&test, 0, sizeof test);
  if (synthetic) {
    wagma_synthetic_config_t a = wagma_synthetic_defaults(synthetic, 7, 0);
    wagma_synthetic_config_t b = wagma_synthetic_defaults(synthetic / 4 + 1, 7, 1);
    if (wagma_dataset_synthetic(&train, &a, err, sizeof err) ||
        wagma_dataset_synthetic(&test, &b, err, sizeof err))
      die("synthetic data", err);
  } else if (wagma_dataset_load_fashion_mnist(data, &train, &test, err, sizeof err)) {
    die("Fashion-MNIST", err);
  }
  fprintf(stderr, "bench_delay: mlp, %s (%zu train / %zu test), batch %d, %d steps\n",
          synthetic ? "synthetic" : "Fashion-MNIST", train.n, test.n, batch, steps);
  double acc[NSETTINGS][MAX_DELAYS];
  double t0 = now_s();
  int use[NSETTINGS];
  for (int s = 0; s < NSETTINGS; s++)
    use[s] = !strcmp(rows, "all") ||
             (!strcmp(rows, "sgd") ? settings[s].kind == WAGMA_OPTIM_SGD
                                   : !strcmp(rows, "adam") && settings[s].kind != WAGMA_OPTIM_SGD);
  for (int s = 0; s < NSETTINGS; s++)
    for (int d = 0; d < ndelays && use[s]; d++) {
      double loss, t = now_s();
      acc[s][d] = run_cell(&train, &test, &settings[s], delays[d], steps, batch, &loss);
      fprintf(stderr,
              "  %-9s m %.2g lr %-6g delay %4u: test accuracy %.4f, last-100 train loss %.4f "
              "(%.1f s)\n",
              settings[s].name, (double)sgd_momentum, (double)settings[s].lr, delays[d], acc[s][d],
              loss, now_s() - t);
    }
  printf("| optimizer | lr |");
  for (int d = 0; d < ndelays; d++)
    printf(" d = %u |", delays[d]);
  printf("\n|---|---|");
  for (int d = 0; d < ndelays; d++)
    printf("---|");
  printf("\n");
  for (int s = 0; s < NSETTINGS; s++) {
    if (!use[s])
      continue;
    if (settings[s].kind == WAGMA_OPTIM_SGD)
      printf("| SGD m=%g | %g |", (double)sgd_momentum, (double)settings[s].lr);
    else
      printf("| %s | %g |", settings[s].name, (double)settings[s].lr);
    for (int d = 0; d < ndelays; d++) {
      if (d == 0 || acc[s][0] <= 0)
        printf(" %.4f |", acc[s][d]);
      else
        printf(" %.4f (%.2fx) |", acc[s][d], acc[s][d] / acc[s][0]);
    }
    printf("\n");
  }
  fprintf(stderr, "bench_delay: %.0f s in all; ratios are to delay %u of the same row\n",
          now_s() - t0, delays[0]);
  wagma_dataset_free(&train);
  wagma_dataset_free(&test);
  return 0;
}
