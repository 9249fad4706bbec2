/* agent/trainer/main.c — wagma-train, the built-in trainer as a program: a built-in job
 * (model, dataset, optimizer from the spec) trained through libwagma exactly as a user's
 * program is (docs/programs.md). wagma-agent --trainer program launches it for the built-in
 * jobs of the algorithms libwagma runs (wagma, allreduce, local-sgd); its options are the
 * agent's that shape training (launcher.c, trainer_argv): --device, --checkpoint-root,
 * --data-dir, --synthetic-train/-test, --eval-samples, --threads, --slow-factor, --sleep-prob,
 * --sleep-ms, --log-level.
 *
 * Owns: the job's data, model, optimizer, sampler, gradient delay line and the model's host
 * mirror (model_host.h) for libwagma, which holds the communicator, the epochs and the reports.
 * The iteration is libwagma's (round == iteration): the optimizer's update count and the data
 * stream follow it whenever an epoch begins (a joiner, a survivor counting again from the
 * plan's start_round), as on the agent's runner thread. Rank 0 writes checkpoints below the
 * checkpoint root (ckroot.h) and libwagma tells the agent, which records them in etcd; a
 * restart of the whole job resumes from the recorded one (libwagma's restore hook).
 *
 * Threads: main (training) plus libwagma's. Exit status: 0 after reporting done, failed or
 * unavailable, or when stopped; 1 when the agent cannot be reached or libwagma fails. */
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/trainer/trainer.h"
#include "wagma/clock_internal.h"

static int log_level = WAGMA_LOG_INFO;

/* libwagma's log lines and ours: stderr, which the agent logs line by line (its last lines
 * go into a failure's reason). */
static void log_line(void *user, int level, const char *msg) {
  (void)user;
  static const char *const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  if (level < log_level)
    return;
  fprintf(stderr, "wagma-train %s %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}

void wg_trainer_log(int level, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  log_line(NULL, level, msg);
}

/* ---- options ------------------------------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f, "usage: wagma-train [options]   (launched by wagma-agent for a built-in job, with\n"
             "                                $WAGMA_AGENT_SOCKET set; not run by hand)\n"
             "\n"
             "The agent's options that shape training (docs/programs.md):\n"
             "  --device cpu|cuda       the backend (the agent's --device)\n"
             "  --checkpoint-root DIR   checkpoints only below DIR\n"
             "  --data-dir DIR          Fashion-MNIST directory (default: the Debian package's)\n"
             "  --synthetic-train N     samples of the synthetic training set (default 20000)\n"
             "  --synthetic-test N      samples of the synthetic test set (default 2000)\n"
             "  --eval-samples N        test samples of the periodic evaluation (default 1000)\n"
             "  --threads N             BLAS threads (default 1)\n"
             "  --slow-factor F         straggler: compute takes F times longer (default 1)\n"
             "  --sleep-prob P          transient imbalance: pause with probability P per step\n"
             "  --sleep-ms D            ... for D milliseconds (default 0)\n"
             "  --log-level N           0 debug, 1 info (default), 2 warn, 3 error\n"
             "  --listen-host HOST:PORT the agent's data-plane address: adpsgd's and the\n"
             "                          parameter server's endpoints listen on an ephemeral\n"
             "                          port of HOST\n"
             "  --round-deadline S      deadline of one exchange with a peer's endpoint\n"
             "                          (default 1)\n"
             "  --help                  this text\n"
             "\n"
             "Exit status: 0 after reporting done, failed or unavailable, or when stopped; 1 when\n"
             "the agent cannot be reached or libwagma fails; 2 usage error.\n");
}

static int parse_options(int argc, char **argv, wg_trainer_opts_t *o) {
  static const struct option longs[] = {{"device", required_argument, 0, 'D'},
                                        {"checkpoint-root", required_argument, 0, 'K'},
                                        {"data-dir", required_argument, 0, 'd'},
                                        {"synthetic-train", required_argument, 0, 'S'},
                                        {"synthetic-test", required_argument, 0, 'T'},
                                        {"eval-samples", required_argument, 0, 'V'},
                                        {"threads", required_argument, 0, 't'},
                                        {"slow-factor", required_argument, 0, 'f'},
                                        {"sleep-prob", required_argument, 0, 'b'},
                                        {"sleep-ms", required_argument, 0, 'm'},
                                        {"log-level", required_argument, 0, 'v'},
                                        {"listen-host", required_argument, 0, 'L'},
                                        {"round-deadline", required_argument, 0, 'R'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->synthetic_train = 20000;
  o->synthetic_test = 2000;
  o->eval_samples = 1000;
  o->threads = 1;
  o->slow_factor = 1;
  o->log_level = WAGMA_LOG_INFO;
  o->round_deadline = 1.0;
  int c;
  while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
    switch (c) {
    case 'D': o->cuda = strcmp(optarg, "cuda") == 0; break;
    case 'K': snprintf(o->checkpoint_root, sizeof o->checkpoint_root, "%s", optarg); break;
    case 'd': snprintf(o->data_dir, sizeof o->data_dir, "%s", optarg); break;
    case 'S': o->synthetic_train = strtoull(optarg, NULL, 10); break;
    case 'T': o->synthetic_test = strtoull(optarg, NULL, 10); break;
    case 'V': o->eval_samples = strtoull(optarg, NULL, 10); break;
    case 't': o->threads = atoi(optarg); break;
    case 'f': o->slow_factor = atof(optarg); break;
    case 'b': o->sleep_prob = atof(optarg); break;
    case 'm': o->sleep_ms = atof(optarg); break;
    case 'v': o->log_level = atoi(optarg); break;
    case 'L': wg_trainer_host_of(optarg, o->listen_host, sizeof o->listen_host); break;
    case 'R': o->round_deadline = atof(optarg); break;
    case 'h': usage(stdout); return 1;
    default: usage(stderr); return -1;
    }
  }
  return 0;
}

/* ---- setup --------------------------------------------------------------------------------- */

/* Builds the job from the spec: 0, or a status with why; *mine says the failure is this
 * agent's (its data, its device): "unavailable", else the job's: "failed". */
static int setup(wg_trainer_t *t, char *why, size_t len, int *mine) {
  const wagma_job_spec_t *s = &t->spec;
  int e;
  *mine = 0;
  if ((s->device == WAGMA_DEVICE_CUDA) != t->o.cuda) {
    snprintf(why, len, "the job runs on %s, this agent on %s", wagma_device_name(s->device),
             t->o.cuda ? "cuda" : "cpu");
    *mine = 1;
    return WAGMA_ENOSYS;
  }
  if ((e = wagma_backend_open(t->o.cuda ? "cuda" : "cpu", &t->backend, why, len))) {
    *mine = 1;
    return e;
  }
  if (t->o.threads > 0)
    wagma_train_set_threads(t->o.threads);
  if ((e = wg_ckroot_open(t->o.checkpoint_root, &t->root, why, len))) {
    *mine = 1;
    return e;
  }
  if (s->dataset == WAGMA_DATASET_SYNTHETIC) {
    wagma_synthetic_config_t tr = wagma_synthetic_defaults(t->o.synthetic_train, s->seed, 0);
    wagma_synthetic_config_t te = wagma_synthetic_defaults(t->o.synthetic_test, s->seed, 1);
    if ((e = wagma_dataset_synthetic(&t->train, &tr, why, len)) ||
        (e = wagma_dataset_synthetic(&t->test, &te, why, len)))
      return e;
  } else if ((e = wagma_dataset_load_fashion_mnist(t->o.data_dir[0] ? t->o.data_dir : NULL,
                                                   &t->train, &t->test, why, len))) {
    *mine = 1; /* another agent's --data-dir may hold it */
    return e;
  }
  int arch = s->model == WAGMA_MODEL_MLP      ? WAGMA_ARCH_MLP
             : s->model == WAGMA_MODEL_LENET5 ? WAGMA_ARCH_LENET5
                                              : WAGMA_ARCH_SOFTMAX;
  wagma_model_config_t mc = wagma_model_defaults(arch);
  if ((size_t)s->batch_size > mc.max_batch)
    mc.max_batch = (size_t)s->batch_size;
  if ((e = wagma_model_create_on(t->backend, &mc, &t->model, why, len)))
    return e;
  wagma_model_init(t->model, s->seed);
  wagma_optim_config_t oc = wagma_optim_defaults(
      s->optimizer.type == WAGMA_OPT_ADAM ? WAGMA_OPTIM_ADAM : WAGMA_OPTIM_SGD);
  oc.schedule.lr = (float)s->optimizer.lr;
  oc.schedule.warmup_steps = s->optimizer.warmup;
  oc.momentum = (float)s->optimizer.momentum;
  oc.nesterov = s->optimizer.nesterov;
  oc.weight_decay = (float)s->optimizer.weight_decay;
  size_t n = wagma_model_param_count(t->model);
  if ((e = wagma_optim_create_on(t->backend, &oc, n, &t->optim, why, len)))
    return e;
  if ((e = wg_model_host_init(&t->host, t->model, t->optim))) {
    snprintf(why, len, "out of page-locked memory for %zu parameters", n);
    return e;
  }
  /* the parameter server's workers push host gradients: their delay line is in host memory */
  int ps = s->algorithm == WAGMA_ALGO_ASGD || s->algorithm == WAGMA_ALGO_DC_ASGD;
  if (s->gradient_delay > 0 &&
      (e = wagma_grad_delay_create_on(ps ? NULL : t->backend, n, (unsigned)s->gradient_delay,
                                      &t->delay, why, len)))
    return e;
  if ((e = wg_own_setup(t, why, len))) {
    *mine = 1;
    return e;
  }
  if ((e = wagma_sampler_init(&t->sampler, t->train.n, WAGMA_SAMPLE_SHUFFLE,
                              wagma_seed_derive(s->seed, t->cfg.agent))) ||
      (e = wagma_batch_alloc(&t->batch, (size_t)s->batch_size, t->train.features))) {
    snprintf(why, len, "out of memory for the sampler and a batch of %d", s->batch_size);
    return e;
  }
  wagma_rng_seed(&t->straggler_rng, wagma_seed_derive(s->seed ^ 0x5157u, t->cfg.agent));
  wg_trainer_log(
      WAGMA_LOG_INFO, "job %s: %s, %zu parameters, %zu training / %zu test samples, batch %d",
      t->cfg.job, wagma_model_describe(t->model), n, t->train.n, t->test.n, s->batch_size);
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES"); /* the agent's --gpu, or inherited */
  if (cvd)
    wg_trainer_log(WAGMA_LOG_INFO, "job %s: CUDA_VISIBLE_DEVICES=%s (device 0 is its first)",
                   t->cfg.job, cvd);
  return 0;
}

static void teardown(wg_trainer_t *t) {
  wg_own_teardown(t);
  wg_model_host_free(&t->host);
  wagma_grad_delay_destroy(t->delay);
  wagma_model_destroy(t->model);
  wagma_optim_destroy(t->optim);
  wagma_sampler_free(&t->sampler);
  wagma_batch_free(&t->batch);
  wagma_dataset_free(&t->train);
  wagma_dataset_free(&t->test);
  wg_ckroot_close(&t->root);
  wagma_backend_close(t->backend);
}

/* ---- libwagma's hooks ------------------------------------------------------------------------ */

static size_t state_size(void *user) {
  return ((wg_trainer_t *)user)->host.nstate;
}

static void state_save(void *user, float *buf) {
  wg_trainer_t *t = user;
  wagma_optim_get_state(t->optim, buf);
}

static void state_load(void *user, const float *buf) {
  wg_trainer_t *t = user;
  wagma_optim_set_state(t->optim, buf);
}

/* A restart of the whole job from its checkpoint: the model and optimizer from the file, then
 * the host mirror libwagma averages. */
static int restore(void *user, const char *path, uint64_t *iteration) {
  wg_trainer_t *t = user;
  char err[512];
  int e = wg_ckroot_load(&t->root, path, t->model, t->optim, iteration, err, sizeof err);
  if (e) {
    wg_trainer_log(WAGMA_LOG_WARN, "job %s: cannot resume from %s: %s", t->cfg.job, path, err);
    return e;
  }
  wg_model_host_params(&t->host, &e);
  return e;
}

/* ---- the loop ----------------------------------------------------------------------------------
 */

void wg_trainer_straggle(wg_trainer_t *t, double compute_s) {
  double pause = 0;
  if (t->o.slow_factor > 1.0)
    pause += (t->o.slow_factor - 1.0) * compute_s;
  if (t->o.sleep_prob > 0 && wagma_rng_uniform(&t->straggler_rng) < t->o.sleep_prob)
    pause += t->o.sleep_ms / 1000.0;
  if (pause > 0)
    wg_sleep_s(pause);
}

static void evaluate(wg_trainer_t *t, size_t count) {
  wagma_eval_t ev;
  if (t->test.n == 0)
    return;
  if (count > t->test.n)
    count = 0;
  if (wagma_model_evaluate(t->model, &t->test, 0, count, &ev) == 0 && ev.n)
    t->accuracy = (double)ev.correct / (double)ev.n;
}

/* A new epoch began inside libwagma (at register or in a step): the optimizer's update count
 * (the lr schedule) and the data stream follow the plan's start_round; an algorithm of
 * wagma-train's own sets its endpoint up for the epoch's members. */
static void follow_epoch(wg_trainer_t *t) {
  wagma_worker_status_t st;
  wagma_worker_status(t->w, &st);
  if (st.epoch == t->epoch)
    return;
  t->epoch = st.epoch;
  t->rank = st.rank;
  t->size = st.size;
  t->entered_at = wg_mono();
  wagma_optim_set_updates(t->optim, st.iteration);
  wagma_sampler_seek(&t->sampler, st.iteration * (uint64_t)t->spec.batch_size);
  if (wg_own_algorithm(t) && st.rank >= 0)
    wg_own_enter_epoch(t);
}

static void checkpoint(wg_trainer_t *t, uint64_t iteration) {
  char name[WAGMA_API_NAME_MAX + 8], path[WAGMA_API_CHECKPOINT_PATH_MAX], err[512];
  snprintf(name, sizeof name, "%s.ckpt", t->cfg.job);
  if (snprintf(path, sizeof path, "%s/%s", t->spec.checkpoint.path, name) >= (int)sizeof path) {
    wg_trainer_log(WAGMA_LOG_WARN, "job %s: checkpoint path longer than %zu bytes", t->cfg.job,
                   sizeof path - 1);
    return;
  }
  if (wg_ckroot_save(&t->root, t->spec.checkpoint.path, name, t->model, t->optim, iteration, err,
                     sizeof err) != 0) {
    wg_trainer_log(WAGMA_LOG_WARN, "job %s: checkpoint failed: %s", t->cfg.job, err);
    return;
  }
  if (wagma_worker_checkpoint_saved(t->w, path, iteration) != 0)
    wg_trainer_log(WAGMA_LOG_WARN, "job %s: %s", t->cfg.job, wagma_worker_last_error(t->w));
}

void wg_trainer_after_step(wg_trainer_t *t, uint64_t it_before) {
  wagma_worker_status_t st;
  follow_epoch(t);
  wagma_worker_status(t->w, &st);
  uint64_t every = t->spec.eval_every;
  if (every && st.iteration / every != it_before / every)
    evaluate(t, t->o.eval_samples);
  wagma_worker_report(t->w, t->loss_ema, t->accuracy);
  if (wg_own_algorithm(t))
    wg_own_report(t);
  if (wagma_worker_checkpoint_due(t->w))
    checkpoint(t, st.iteration);
}

/* One iteration: compute, the gradient allreduce (allreduce), the optimizer step, then the
 * averaging (libwagma's; adpsgd's pairwise one first). 0, WAGMA_ECANCELED when stopped, or a
 * compute failure. */
static int iteration(wg_trainer_t *t) {
  wagma_worker_status_t st;
  wagma_eval_t ev;
  float *host;
  int e;
  if (t->ps && t->ps_shards > 0 && t->rank >= 0)
    return wg_own_ps_iteration(t);
  double t0 = wg_mono();
  wagma_worker_status(t->w, &st);
  uint64_t it = st.iteration;
  if ((e = wagma_batch_draw(&t->batch, &t->sampler, &t->train, (size_t)t->spec.batch_size)) ||
      (e = wagma_model_forward(t->model, t->batch.x, t->batch.y, t->batch.n, &ev)) ||
      (e = wagma_model_backward(t->model)))
    return e;
  int allreduce = t->spec.algorithm == WAGMA_ALGO_ALLREDUCE;
  if (allreduce) {
    /* the straggler's delay is its compute's, before the collective */
    wg_trainer_straggle(t, wg_mono() - t0);
    if (!(host = wg_model_host_grads(&t->host, &e)))
      return e;
    if ((e = wagma_worker_average_gradients(t->w, host)) ||
        (e = wg_model_host_grads_back(&t->host)))
      return e;
    follow_epoch(t);
    wagma_worker_status(t->w, &st);
    it = st.iteration;
  }
  if (t->delay)
    wagma_optim_step_delayed(t->optim, t->delay, it, wagma_model_params(t->model),
                             wagma_model_grads(t->model));
  else
    wagma_optim_step(t->optim, it, wagma_model_params(t->model), wagma_model_grads(t->model));
  if (!allreduce)
    wg_trainer_straggle(t, wg_mono() - t0);
  if (ev.n && isfinite(ev.loss))
    t->loss_ema = isfinite(t->loss_ema) ? 0.95 * t->loss_ema + 0.05 * ev.loss : ev.loss;
  if (!(host = wg_model_host_params(&t->host, &e)))
    return e;
  if (t->gossip)
    wg_own_gossip(t, host);
  e = wagma_worker_step(t->w);
  int back = wg_model_host_params_back(&t->host); /* what the averaging wrote, whatever it said */
  if (e)
    return e;
  if (back)
    return back;
  wg_trainer_after_step(t, it);
  return 0;
}

static int train(wg_trainer_t *t) {
  wagma_worker_state_fns_t fns = {state_size, state_save, state_load};
  int e;
  float *host = wg_model_host_params(&t->host, &e);
  if (!host) {
    wagma_worker_fail(t->w, "cannot read the model's parameters");
    return e;
  }
  wagma_worker_set_restore(t->w, restore, t);
  t->total = t->spec.iterations;
  if (t->total == 0) { /* docs/api.md: an epoch counts the samples of all workers */
    double per_epoch = (double)t->train.n / ((double)t->spec.batch_size * (double)t->spec.workers);
    t->total = (uint64_t)ceil((double)t->spec.epochs * per_epoch);
    wagma_worker_set_iterations(t->w, t->total);
  }
  e = wagma_worker_register(t->w, host, t->host.nparams, &fns, t);
  if (e == 0)
    e = wg_model_host_params_back(&t->host);
  if (e)
    return e;
  t->epoch = 0;
  follow_epoch(t);
  while (!wagma_worker_should_stop(t->w)) {
    e = iteration(t);
    if (e == WAGMA_ECANCELED)
      return e;
    if (e) {
      wg_trainer_log(WAGMA_LOG_ERROR, "job %s: iteration failed: %s (%s)", t->cfg.job,
                     wagma_strerror(e), wagma_worker_last_error(t->w));
      wg_sleep_s(0.1);
    }
  }
  wagma_worker_status_t st;
  wagma_worker_status(t->w, &st);
  if (st.iteration < t->total)
    return WAGMA_ECANCELED; /* stopped by the agent, or failed (reported) */
  e = wg_own_final_model(t);
  if (e == WAGMA_ECANCELED)
    return e;
  if (e)
    wg_trainer_log(WAGMA_LOG_WARN, "job %s: final model average: %s", t->cfg.job,
                   wagma_worker_last_error(t->w));
  evaluate(t, 0);
  if (t->test.n && !isfinite(t->accuracy)) {
    char why[200];
    snprintf(why, sizeof why,
             "the final model at iteration %llu is not finite (NaN or Inf): not reporting it as "
             "the job's result",
             (unsigned long long)st.iteration);
    return wagma_worker_fail(t->w, why);
  }
  wg_trainer_log(WAGMA_LOG_INFO, "job %s: done at iteration %llu, loss %.4f, test accuracy %.4f",
                 t->cfg.job, (unsigned long long)st.iteration, t->loss_ema, t->accuracy);
  return wagma_worker_done(t->w, t->loss_ema, t->accuracy);
}

int main(int argc, char **argv) {
  static wg_trainer_t t;
  char why[512] = "";
  int mine;
  int p = parse_options(argc, argv, &t.o);
  if (p)
    return p > 0 ? 0 : 2;
  log_level = t.o.log_level;
  t.loss_ema = t.accuracy = NAN;
  int e = wagma_worker_open(NULL, log_line, NULL, &t.w);
  if (e) {
    fprintf(stderr, "wagma-train: cannot reach the agent: %s\n", wagma_strerror(e));
    return 1;
  }
  wagma_worker_config(t.w, &t.cfg);
  wagma_api_error_t aerr;
  const char *spec = wagma_worker_spec(t.w);
  if (wagma_job_spec_from_json(spec, strlen(spec), &t.spec, &aerr) != 0) {
    snprintf(why, sizeof why, "the agent sent a bad spec: %s: %s", aerr.field, aerr.message);
    wagma_worker_fail(t.w, why);
    wagma_worker_close(t.w);
    return 1;
  }
  if ((e = setup(&t, why, sizeof why, &mine)) != 0) {
    char msg[600];
    snprintf(msg, sizeof msg, "setup failed: %s", why[0] ? why : wagma_strerror(e));
    wg_trainer_log(WAGMA_LOG_ERROR, "job %s: %s", t.cfg.job, msg);
    if (mine)
      wagma_worker_unavailable(t.w, msg);
    else
      wagma_worker_fail(t.w, msg);
  } else {
    e = train(&t);
    if (e && e != WAGMA_ECANCELED)
      wg_trainer_log(WAGMA_LOG_ERROR, "job %s: %s", t.cfg.job, wagma_worker_last_error(t.w));
  }
  wagma_worker_close(t.w); /* after done: lingers for the peers until the agent says stop */
  teardown(&t);
  return e && e != WAGMA_ECANCELED && !why[0] ? 1 : 0;
}
