/* bench_train — single-process CPU training throughput of wagma_train (samples/s).
 *
 * One training step = draw a minibatch (gather + standardize), forward, backward, optimizer
 * step (SGD, momentum 0.9). Prints one line per model in a fixed format that run.sh parses:
 *   wagma <model> batch <B> threads <T> steps <N> samples/s <X> loss <first> -> <last>
 *         params <P> cpu_samples/s <Y>
 * samples/s is per wall-clock second, cpu_samples/s per second of this process's CPU time
 * (less sensitive to other load on the machine).
 * Usage: bench_train [--model lenet5|mlp|softmax|SPEC]... [--batch 64] [--steps 300]
 *                    [--warmup 20] [--threads 1] [--data fashion|synthetic] [--eval]
 * Data: Fashion-MNIST when installed (default), else synthetic data of the same shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/train/train.h"

static double now(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int run_model(const char *spec, const wagma_dataset_t *tr, const wagma_dataset_t *te,
                     size_t batch, size_t steps, size_t warmup, int eval) {
  char err[256];
  wagma_model_config_t cfg;
  wagma_model_t *m = NULL;
  wagma_optim_t *o = NULL;
  wagma_sampler_t s = {0};
  wagma_batch_t b = {0};
  int rc;
  if ((rc = wagma_model_config_parse(spec, &cfg, err, sizeof(err))))
    goto out;
  cfg.max_batch = batch;
  if ((rc = wagma_model_create(&cfg, &m, err, sizeof(err))))
    goto out;
  wagma_model_init(m, 1);
  wagma_optim_config_t ocfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  ocfg.schedule.lr = 0.02f;
  if ((rc = wagma_optim_create(&ocfg, wagma_model_param_count(m), &o, err, sizeof(err))) ||
      (rc = wagma_sampler_init(&s, tr->n, WAGMA_SAMPLE_SHUFFLE, wagma_seed_derive(1, "bench"))) ||
      (rc = wagma_batch_alloc(&b, batch, tr->features)))
    goto out;
  double first = 0, last = 0, t0 = 0, c0 = 0;
  for (size_t t = 0; t < warmup + steps; t++) {
    if (t == warmup) {
      t0 = now(CLOCK_MONOTONIC);
      c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    }
    wagma_eval_t e;
    if ((rc = wagma_batch_draw(&b, &s, tr, batch)) ||
        (rc = wagma_model_forward(m, b.x, b.y, batch, &e)) || (rc = wagma_model_backward(m)))
      goto out;
    wagma_optim_step(o, t, wagma_model_params(m), wagma_model_grads(m));
    if (t == 0)
      first = e.loss;
    last = e.loss;
  }
  double secs = now(CLOCK_MONOTONIC) - t0, cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
  printf("wagma %s batch %zu threads %d steps %zu samples/s %.0f loss %.3f -> %.3f params %zu "
         "cpu_samples/s %.0f\n",
         spec, batch, wagma_train_threads(), steps, (double)(steps * batch) / secs, first, last,
         wagma_model_param_count(m), (double)(steps * batch) / cpu);
  if (eval && te) {
    wagma_eval_t e;
    if ((rc = wagma_model_evaluate(m, te, 0, 0, &e)))
      goto out;
    printf("wagma %s test loss %.3f accuracy %.4f after %zu steps\n", spec, e.loss,
           (double)e.correct / (double)e.n, warmup + steps);
  }
out:
  if (rc)
    fprintf(stderr, "bench_train: %s: %s (%s)\n", spec, err, wagma_strerror(rc));
  wagma_batch_free(&b);
  wagma_sampler_free(&s);
  wagma_optim_destroy(o);
  wagma_model_destroy(m);
  return rc;
}

int main(int argc, char **argv) {
  const char *models[8];
  size_t n_models = 0, batch = 64, steps = 300, warmup = 20;
  int threads = 1, eval = 0;
  const char *data = "fashion";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--eval")) {
      eval = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "bench_train: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (!strcmp(a, "--model") && n_models < 8)
      models[n_models++] = v;
    else if (!strcmp(a, "--batch"))
      batch = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--steps"))
      steps = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--warmup"))
      warmup = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--threads"))
      threads = atoi(v);
    else if (!strcmp(a, "--data"))
      data = v;
    else {
      fprintf(stderr, "bench_train: unknown option %s\n", a);
      return 2;
    }
  }
  if (!n_models)
    models[n_models++] = "lenet5";
  if (batch == 0 || steps == 0 || wagma_train_set_threads(threads)) {
    fprintf(stderr, "bench_train: batch, steps and threads must be positive\n");
    return 2;
  }
  wagma_dataset_t tr = {0}, te = {0};
  char err[512];
  int rc = -1;
  if (!strcmp(data, "fashion"))
    rc = wagma_dataset_load_fashion_mnist(NULL, &tr, &te, err, sizeof(err));
  if (rc) {
    if (!strcmp(data, "fashion"))
      fprintf(stderr, "bench_train: %s; using synthetic data\n", err);
    wagma_synthetic_config_t c = wagma_synthetic_defaults(10000, 1, 0);
    if ((rc = wagma_dataset_synthetic(&tr, &c, err, sizeof(err)))) {
      fprintf(stderr, "bench_train: %s\n", err);
      return 1;
    }
    c = wagma_synthetic_defaults(2000, 1, 1);
    if ((rc = wagma_dataset_synthetic(&te, &c, err, sizeof(err)))) {
      fprintf(stderr, "bench_train: %s\n", err);
      return 1;
    }
    data = "synthetic";
  }
  printf("data %s train %zu test %zu\n", data, tr.n, te.n);
  for (size_t k = 0; k < n_models && !rc; k++)
    rc = run_model(models[k], &tr, &te, batch, steps, warmup, eval);
  wagma_dataset_free(&tr);
  wagma_dataset_free(&te);
  return rc ? 1 : 0;
}
