/* bench_train_gpu — training throughput on the CUDA backend against the CPU backend in the same
 * run: samples/s of each model at each batch size, and the GPU / CPU ratio.
 *
 * One step = draw a minibatch on the host (gather), forward (the batch is staged through
 * page-locked memory), backward, optimizer step (SGD, momentum 0.9). Two GPU figures:
 *   gpu      the whole step as the agent runs it (host sampling included);
 *   gpu-dev  the same batch over and over (no sampling or gather on the host): the device's
 *            own rate, staging and loss download included. Where gpu-dev barely grows with
 *            the batch, the step is bound by launches and synchronisation, not by the GPU.
 * The CPU runs with --cpu-threads BLAS threads (default: every online core).
 *
 * Output, one line per measurement (scripts/gpu-check.sh prints them as they come):
 *   <gpu|gpu-dev|cpu> <model> batch <B> steps <N> samples/s <X> step_ms <Y>
 *   ratio <model> batch <B> gpu/cpu <R> gpu-dev/cpu <R2>
 * Without a usable GPU it prints "SKIP: <cause>" and exits 77.
 * Usage: bench_train_gpu [--model mlp|lenet5|SPEC]... [--batch 64,512,4096] [--seconds 2]
 *                        [--max-steps 300] [--cpu-threads N] [--data synthetic|fashion]
 *                        [--device cuda|cuda:N|cpu]   (cpu: checks this harness without a GPU) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/train/train.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct result {
  size_t steps;
  double samples_per_s, step_ms;
} result_t;

/* mode 0: draw a new batch every step; 1: the same batch every step. */
static int run(wagma_backend_t *be, const char *spec, const wagma_dataset_t *tr, size_t batch,
               double seconds, size_t max_steps, int same_batch, result_t *out) {
  char err[256] = "";
  wagma_model_config_t cfg;
  wagma_model_t *m = NULL;
  wagma_optim_t *o = NULL;
  wagma_sampler_t s = {0};
  wagma_batch_t b = {0};
  int rc;
  if ((rc = wagma_model_config_parse(spec, &cfg, err, sizeof(err))))
    goto out;
  cfg.max_batch = batch;
  if ((rc = wagma_model_create_on(be, &cfg, &m, err, sizeof(err))))
    goto out;
  wagma_model_init(m, 1);
  wagma_optim_config_t ocfg = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  ocfg.schedule.lr = 0.01f;
  if ((rc = wagma_optim_create_on(be, &ocfg, wagma_model_param_count(m), &o, err, sizeof(err))) ||
      (rc = wagma_sampler_init(&s, tr->n, WAGMA_SAMPLE_SHUFFLE, 7)) ||
      (rc = wagma_batch_alloc(&b, batch, tr->features)) ||
      (rc = wagma_batch_draw(&b, &s, tr, batch)))
    goto out;
  const size_t warmup = 5;
  double t0 = 0;
  size_t t = 0, timed = 0;
  for (;; t++) {
    if (t == warmup) {
      if ((rc = wagma_backend_sync(be)))
        goto out;
      t0 = now();
    }
    if (t >= warmup) {
      timed = t - warmup;
      if (timed >= 3 && (now() - t0 >= seconds || timed >= max_steps))
        break;
    }
    wagma_eval_t e;
    if ((!same_batch && (rc = wagma_batch_draw(&b, &s, tr, batch))) ||
        (rc = wagma_model_forward(m, b.x, b.y, batch, &e)) || (rc = wagma_model_backward(m)))
      goto out;
    wagma_optim_step(o, t, wagma_model_params(m), wagma_model_grads(m));
  }
  if ((rc = wagma_backend_sync(be)))
    goto out;
  double secs = now() - t0;
  out->steps = timed;
  out->samples_per_s = (double)(timed * batch) / secs;
  out->step_ms = secs / (double)timed * 1e3;
out:
  if (rc)
    fprintf(stderr, "bench_train_gpu: %s batch %zu on %s: %s (%s) %s\n", spec, batch,
            wagma_backend_name(be), err, wagma_strerror(rc), wagma_backend_error(be));
  wagma_batch_free(&b);
  wagma_sampler_free(&s);
  wagma_optim_destroy(o);
  wagma_model_destroy(m);
  return rc;
}

int main(int argc, char **argv) {
  const char *models[16];
  size_t n_models = 0, batches[16] = {64, 512, 4096}, n_batches = 3, max_steps = 300;
  double seconds = 2.0;
  int cpu_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  const char *data = "synthetic", *device = "cuda";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--model") && v && n_models < 16)
      models[n_models++] = v, i++;
    else if (!strcmp(a, "--batch") && v) {
      n_batches = 0;
      for (char *p = argv[++i]; *p && n_batches < 16;) {
        char *end;
        unsigned long x = strtoul(p, &end, 10);
        if (end == p || x == 0 || x > 65536) {
          fprintf(stderr, "bad --batch %s\n", v);
          return 2;
        }
        batches[n_batches++] = x;
        p = *end == ',' ? end + 1 : end;
      }
    } else if (!strcmp(a, "--seconds") && v)
      seconds = atof(argv[++i]);
    else if (!strcmp(a, "--max-steps") && v)
      max_steps = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(a, "--cpu-threads") && v)
      cpu_threads = atoi(argv[++i]);
    else if (!strcmp(a, "--data") && v)
      data = argv[++i];
    else if (!strcmp(a, "--device") && v) /* cuda:N; "cpu" checks the harness without a GPU */
      device = argv[++i];
    else {
      fprintf(stderr,
              "usage: bench_train_gpu [--model mlp|lenet5|SPEC]... [--batch 64,512,4096] "
              "[--seconds 2] [--max-steps 300] [--cpu-threads N] [--data synthetic|fashion] "
              "[--device cuda|cuda:N|cpu]\n");
      return 2;
    }
  }
  if (!n_models) {
    models[n_models++] = "mlp";
    models[n_models++] = "lenet5";
  }
  char err[512] = "";
  wagma_backend_t *gpu = NULL;
  int rc = wagma_backend_open(device, &gpu, err, sizeof(err));
  if (rc) {
    printf("SKIP: no CUDA GPU for the GPU benchmark: %s (%s)\n", err, wagma_strerror(rc));
    return 77;
  }
  if (cpu_threads < 1)
    cpu_threads = 1;
  wagma_train_set_threads(cpu_threads);

  size_t biggest = 0;
  for (size_t k = 0; k < n_batches; k++)
    biggest = batches[k] > biggest ? batches[k] : biggest;
  wagma_dataset_t tr = {0};
  if (!strcmp(data, "fashion")) {
    rc = wagma_dataset_load_fashion_mnist(NULL, &tr, NULL, err, sizeof(err));
  } else {
    wagma_synthetic_config_t sc =
        wagma_synthetic_defaults(biggest * 2 > 16384 ? biggest * 2 : 16384, 1, 0);
    rc = wagma_dataset_synthetic(&tr, &sc, err, sizeof(err));
  }
  if (rc) {
    fprintf(stderr, "bench_train_gpu: data: %s\n", err);
    return 1;
  }
  printf("bench_train_gpu: %s vs cpu (%d BLAS threads), data %s (%zu samples), >= %.1f s or %zu "
         "steps per point\n",
         wagma_backend_name(gpu), cpu_threads, data, tr.n, seconds, max_steps);
  fflush(stdout);
  int failed = 0;
  for (size_t mi = 0; mi < n_models; mi++)
    for (size_t bi = 0; bi < n_batches; bi++) {
      const size_t batch = batches[bi];
      result_t g = {0}, gd = {0}, c = {0};
      struct {
        const char *label;
        wagma_backend_t *be;
        int same;
        result_t *r;
      } runs[3] = {
          {"gpu", gpu, 0, &g}, {"gpu-dev", gpu, 1, &gd}, {"cpu", wagma_backend_cpu(), 0, &c}};
      for (int k = 0; k < 3; k++) {
        if (run(runs[k].be, models[mi], &tr, batch, seconds, max_steps, runs[k].same, runs[k].r)) {
          failed = 1;
          continue;
        }
        printf("%-7s %s batch %zu steps %zu samples/s %.0f step_ms %.3f\n", runs[k].label,
               models[mi], batch, runs[k].r->steps, runs[k].r->samples_per_s, runs[k].r->step_ms);
        fflush(stdout);
      }
      if (c.samples_per_s > 0)
        printf("ratio   %s batch %zu gpu/cpu %.2f gpu-dev/cpu %.2f\n", models[mi], batch,
               g.samples_per_s / c.samples_per_s, gd.samples_per_s / c.samples_per_s);
      fflush(stdout);
    }
  wagma_dataset_free(&tr);
  wagma_backend_close(gpu);
  return failed;
}
