/* agent/runner.c — the runner thread of wagma-agent: it trains the assigned job.
 *
 * Owns the job state (wg_job_t): data, model, optimizer, sampler, the communicator of the
 * current plan epoch and the statistics. It follows what the control thread publishes in
 * wg_shared_t (assignment -> job config, plan, checkpoint record):
 *  - a new job: load the data, build model and optimizer (nothing trained yet);
 *  - a plan of another epoch in which I am a member: destroy the old communicator (rounds in
 *    flight are aborted), create the new one and begin with a GLOBAL SYNC: a weighted average
 *    of (parameters | optimizer state) in which joiners have weight 0, so a joiner receives
 *    the model from its peers and survivors keep their training — no restart, no disk. When
 *    every member is a joiner (a fresh start, or a restart from nothing) all start from the
 *    job's checkpoint if one is recorded, else from the seed. Then every member sets its
 *    iteration to the plan's start_round, the communicator's first round: round ==
 *    iteration from there on, the same number on every member and in the coordinator's
 *    GET /v1/jobs/{id}/groups?iteration=T (a survivor that had run past start_round counts
 *    those iterations again; its model keeps their training);
 *  - then one iteration after another (algorithms.c) until the job's iteration count; at the
 *    end a final model average (not for allreduce: models are equal), an evaluation on the
 *    whole test set and the completion signal (progress state "done"). A finished agent keeps
 *    its communicator (its round thread answers peers) until released or linger_s passes.
 * Rank 0 writes checkpoints every checkpoint.every iterations (atomic file, then a record in
 * etcd through the control thread), below the agent's checkpoint root only (ckroot.c): the
 * spec's checkpoint.path and the record's path are relative to it.
 * The communicator of an epoch is created with the epoch's data-plane secret (read by the
 * control thread with the plan; docs/collective.md "Peer authentication"); the runner's copies
 * are wiped (OPENSSL_cleanse) once the communicator exists or the epoch is given up.
 * An agent that cannot serve the job says so with the progress state "unavailable" and the
 * reason, and the coordinator replans without it: when its data set cannot be loaded from its
 * --data-dir, or when the communicator of a plan cannot be created (typically: --listen is
 * taken) for --listen-timeout seconds (retried every second until then). Failures that would
 * be the same on every agent (the model cannot be built) are "failed": the job fails.
 *
 * Invariants: only this thread touches the job state and calls the communicator's compute
 * functions; every wait is bounded (the communicator's deadlines, 200 ms waits on the shared
 * condition variable), so stop requests and new plans are seen promptly. The communicator in
 * use is also published in wg_shared_t.comm (cleared under the shared mutex before destroy):
 * the control side aborts it when a new plan epoch, a release or a stop arrives, so a round
 * blocked on a frozen peer returns WAGMA_ECANCELED at once instead of at its deadline; the
 * runner then closes it and follows the new state. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "agent/launcher.h"
#include "agent/runner.h"
#include "wagma/fingerprint_internal.h"
#include "wagma/log_internal.h"

struct wg_runner {
  wg_runner_ctx_t ctx;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finished;
};

#define RLOG(r, lvl, ...) wg_logf(wg_agent_log, (void *)(r)->opt->name, lvl, __VA_ARGS__)

void wg_runner_warn_comm(wg_runner_ctx_t *r, const char *what, int status) {
  wg_runner_warn(r, what, status, NULL);
}

void wg_runner_warn(wg_runner_ctx_t *r, const char *what, int status, const char *detail) {
  wg_job_t *j = &r->job;
  if (status == WAGMA_ECANCELED)
    return; /* aborted by the control side for a newer plan or a stop: not a fault */
  j->comm_errors++;
  if (wg_mono() - j->last_comm_warn < 2.0)
    return;
  j->last_comm_warn = wg_mono();
  RLOG(r, WAGMA_LOG_WARN, "job %s epoch %llu: %s: %s (%s)", j->cfg.job,
       (unsigned long long)j->epoch, what, wagma_strerror(status),
       detail    ? detail
       : j->comm ? wagma_comm_last_error(j->comm)
                 : "no communicator");
}

/* ---- progress ---------------------------------------------------------------------------- */

static void share_progress(wg_runner_ctx_t *r, int state, const char *error, int urgent) {
  wg_job_t *j = &r->job;
  wagma_comm_counters_t cc;
  double now = wg_mono();
  if (!urgent && now - j->last_share < 0.25)
    return;
  j->last_share = now;
  memset(&cc, 0, sizeof cc);
  if (j->comm)
    wagma_comm_counters(j->comm, &cc);
  if (now - j->window_start >= 1.0) {
    j->staleness_shown = j->staleness_window;
    j->staleness_window = 0;
    j->window_start = now;
  }
  pthread_mutex_lock(&r->shared->mu);
  wg_progress_snap_t *p = &r->shared->progress;
  memset(p, 0, sizeof *p);
  snprintf(p->job, sizeof p->job, "%s", j->cfg.job);
  p->state = state;
  p->epoch = j->epoch;
  p->iteration = j->iteration;
  p->loss = j->loss_ema;
  p->accuracy = j->accuracy;
  p->step_time = j->step_ema;
  p->staleness =
      j->staleness_shown > j->staleness_window ? j->staleness_shown : j->staleness_window;
  p->rounds_activated = j->base.rounds_activated + cc.rounds_activated;
  p->rounds_joined = j->base.rounds_joined + cc.rounds_joined;
  p->rounds_left_out = j->base.rounds_left_out + cc.rounds_left_out;
  p->rounds_skipped = j->base.rounds_skipped + cc.rounds_skipped;
  if (j->gossip) { /* adpsgd: averagings asked (active) and answered (passive), and skipped */
    wg_adpsgd_counters_t gc;
    wg_adpsgd_counters(j->gossip, &gc);
    p->rounds_activated += gc.averaged;
    p->rounds_joined += gc.served;
    p->rounds_skipped += gc.skipped;
  }
  if (j->rank >= 0)
    snprintf(p->role, sizeof p->role, "%s", wg_algo_role(j));
  p->has_round = j->have_round;
  p->round = j->last_round;
  p->round_global = j->last_round_global;
  p->ngroup = j->last_ngroup;
  memcpy(p->group, j->last_group, sizeof p->group);
  if (state == WG_STATE_DONE) {
    p->nfingerprint = j->nfingerprint;
    memcpy(p->fingerprint, j->fingerprint, sizeof p->fingerprint);
  }
  if (error)
    snprintf(p->error, sizeof p->error, "%.250s", error);
  r->shared->progress_dirty = 1;
  if (urgent)
    r->shared->progress_urgent = 1;
  pthread_mutex_unlock(&r->shared->mu);
}

/* ---- job setup and teardown -------------------------------------------------------------- */

static void close_comm(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  if (!j->comm)
    return;
  pthread_mutex_lock(&r->shared->mu);
  r->shared->comm = NULL; /* no abort can reach it any more */
  pthread_mutex_unlock(&r->shared->mu);
  wagma_comm_counters_t cc;
  wagma_comm_counters(j->comm, &cc);
  j->base.rounds_activated += cc.rounds_activated;
  j->base.rounds_joined += cc.rounds_joined;
  j->base.rounds_left_out += cc.rounds_left_out;
  j->base.rounds_skipped += cc.rounds_skipped;
  wagma_comm_destroy(j->comm);
  j->comm = NULL;
}

static void job_teardown(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  if (j->active || j->broken)
    RLOG(r, WAGMA_LOG_INFO, "job %s: stopping (iteration %llu)", j->cfg.job,
         (unsigned long long)j->iteration);
  close_comm(r);
  wagma_plan_free(&j->plan);
  OPENSSL_cleanse(j->secret, sizeof j->secret);
  wg_model_host_free(&j->host);
  wg_algo_teardown(r);
  wagma_model_destroy(j->model);
  wagma_optim_destroy(j->optim);
  wagma_sampler_free(&j->sampler);
  wagma_batch_free(&j->batch);
  wagma_dataset_free(&j->train);
  wagma_dataset_free(&j->test);
  free(j->sync_buf);
  memset(j, 0, sizeof *j);
}

static int job_setup(wg_runner_ctx_t *r, const wg_job_config_t *cfg) {
  wg_job_t *j = &r->job;
  char err[256] = "";
  int e, mine = 0; /* mine: the failure is this agent's (its data), not the job's */
  double t0 = wg_mono();
  memset(j, 0, sizeof *j);
  j->cfg = *cfg;
  j->rank = -1;
  j->loss_ema = j->step_ema = j->accuracy = NAN;
  j->window_start = wg_mono();
  if (cfg->device != (r->opt->device_cuda ? WAGMA_DEVICE_CUDA : WAGMA_DEVICE_CPU)) {
    /* the scheduler places a job on agents of its device only: an older coordinator? */
    snprintf(err, sizeof err, "the job runs on %s, this agent on %s",
             wagma_device_name(cfg->device), r->opt->device_cuda ? "cuda" : "cpu");
    e = WAGMA_ENOSYS;
    mine = 1;
    goto out;
  }
  if (cfg->dataset == WAGMA_DATASET_SYNTHETIC) {
    wagma_synthetic_config_t tr = wagma_synthetic_defaults(r->opt->synthetic_train, cfg->seed, 0);
    wagma_synthetic_config_t te = wagma_synthetic_defaults(r->opt->synthetic_test, cfg->seed, 1);
    if ((e = wagma_dataset_synthetic(&j->train, &tr, err, sizeof err)) ||
        (e = wagma_dataset_synthetic(&j->test, &te, err, sizeof err)))
      goto out;
  } else if ((e = wagma_dataset_load_fashion_mnist(r->opt->data_dir[0] ? r->opt->data_dir : NULL,
                                                   &j->train, &j->test, err, sizeof err))) {
    mine = 1; /* another agent's --data-dir may hold it */
    goto out;
  }
  /* the one place a spec's model kind becomes the training library's architecture */
  int arch = cfg->model == WAGMA_MODEL_MLP      ? WAGMA_ARCH_MLP
             : cfg->model == WAGMA_MODEL_LENET5 ? WAGMA_ARCH_LENET5
                                                : WAGMA_ARCH_SOFTMAX;
  wagma_model_config_t mc = wagma_model_defaults(arch);
  if ((size_t)cfg->batch_size > mc.max_batch)
    mc.max_batch = (size_t)cfg->batch_size;
  if ((e = wagma_model_create_on(r->backend, &mc, &j->model, err, sizeof err)))
    goto out;
  wagma_model_init(j->model, cfg->seed);
  wagma_optim_config_t oc =
      wagma_optim_defaults(cfg->optimizer == WAGMA_OPT_ADAM ? WAGMA_OPTIM_ADAM : WAGMA_OPTIM_SGD);
  oc.schedule.lr = (float)cfg->lr;
  oc.schedule.warmup_steps = cfg->warmup;
  oc.momentum = (float)cfg->momentum;
  oc.nesterov = cfg->nesterov;
  oc.weight_decay = (float)cfg->weight_decay;
  j->nparams = wagma_model_param_count(j->model);
  if ((e = wagma_optim_create_on(r->backend, &oc, j->nparams, &j->optim, err, sizeof err)))
    goto out;
  if ((e = wg_model_host_init(&j->host, j->model, j->optim)))
    goto out;
  wagma_optim_state(j->optim, &j->nstate);
  if ((e = wagma_sampler_init(&j->sampler, j->train.n, WAGMA_SAMPLE_SHUFFLE,
                              wagma_seed_derive(cfg->seed, r->opt->name))) ||
      (e = wagma_batch_alloc(&j->batch, (size_t)cfg->batch_size, j->train.features)))
    goto out;
  j->sync_buf = malloc((j->nparams + j->nstate) * sizeof(float));
  if (!j->sync_buf) {
    e = WAGMA_ENOMEM;
    goto out;
  }
  if ((e = wg_algo_setup(r, err, sizeof err))) {
    mine = e == WAGMA_EUNAVAIL; /* adpsgd's endpoint cannot listen on this agent's host */
    goto out;
  }
  wagma_rng_seed(&j->straggler_rng, wagma_seed_derive(cfg->seed ^ 0x5157u, r->opt->name));
  j->active = 1;
  RLOG(r, WAGMA_LOG_INFO,
       "job %s: %s, %zu parameters, %zu training / %zu test samples, batch %d (%.2f s)", cfg->job,
       wagma_model_describe(j->model), j->nparams, j->train.n, j->test.n, cfg->batch_size,
       wg_mono() - t0);
out:
  if (e) {
    char why[300];
    snprintf(why, sizeof why, "setup failed: %s", err[0] ? err : wagma_strerror(e));
    RLOG(r, WAGMA_LOG_ERROR, "job %s: %s", cfg->job, why);
    wg_job_config_t keep = *cfg;
    job_teardown(r);
    j->cfg = keep;
    j->broken = 1;
    j->unavailable = mine;
    share_progress(r, mine ? WG_STATE_UNAVAILABLE : WG_STATE_FAILED, why, 1);
  }
  return e;
}

/* ---- epochs ------------------------------------------------------------------------------ */

static uint64_t total_iterations(const wg_job_t *j) {
  if (j->cfg.iterations)
    return j->cfg.iterations;
  /* docs/api.md: an epoch counts the samples of all spec.workers workers. */
  int workers = j->cfg.workers > 0 ? j->cfg.workers : j->plan.nranks;
  double per_epoch = (double)j->train.n / ((double)j->cfg.batch_size * (double)workers);
  return (uint64_t)ceil((double)j->cfg.epochs * per_epoch);
}

static void evaluate(wg_runner_ctx_t *r, size_t count) {
  wg_job_t *j = &r->job;
  wagma_eval_t ev;
  if (j->test.n == 0)
    return;
  if (count > j->test.n)
    count = 0;
  if (wagma_model_evaluate(j->model, &j->test, 0, count, &ev) == 0 && ev.n)
    j->accuracy = (double)ev.correct / (double)ev.n;
}

/* Ends the job on this member without a result to report: "failed" with why, so the job fails
 * loudly instead of succeeding with a model that is not the job's (docs/design.md §7). */
static void finish_failed(wg_runner_ctx_t *r, const char *why) {
  wg_job_t *j = &r->job;
  j->done = 1;
  j->done_at = wg_mono();
  RLOG(r, WAGMA_LOG_ERROR, "job %s: %s", j->cfg.job, why);
  share_progress(r, WG_STATE_FAILED, why, 1);
}

/* Whether every parameter of the job's model is finite (the host copy; 1 when it cannot be
 * read: the failed read is reported elsewhere). */
static int model_finite(wg_job_t *j) {
  int e;
  const float *p = wg_model_host_params(&j->host, &e);
  for (size_t i = 0; p && i < j->nparams; i++)
    if (!isfinite(p[i]))
      return 0;
  return 1;
}

static void finish(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  /* The models as trained (before the final average makes them equal): how far apart the
   * members ended shows whether the averaging during training worked. */
  int e;
  float *params = wg_model_host_params(&j->host, &e);
  if (params)
    wg_fingerprint(params, j->nparams, j->fingerprint, &j->nfingerprint);
  if (params && j->cfg.algorithm != WAGMA_ALGO_ALLREDUCE && j->comm) {
    e = wg_algo_final_model(r, params);
    if (e == 0)
      e = wg_model_host_params_back(&j->host);
    if (e)
      wg_runner_warn_comm(r, "final model average", e);
  }
  evaluate(r, 0);
  if (!model_finite(j) || (j->test.n && !isfinite(j->accuracy))) {
    char why[200];
    snprintf(why, sizeof why,
             "the final model at iteration %llu is not finite (NaN or Inf): not reporting it "
             "as the job's result",
             (unsigned long long)j->iteration);
    finish_failed(r, why);
    return;
  }
  j->done = 1;
  j->done_at = wg_mono();
  RLOG(r, WAGMA_LOG_INFO, "job %s: done at iteration %llu, loss %.4f, test accuracy %.4f",
       j->cfg.job, (unsigned long long)j->iteration, j->loss_ema, j->accuracy);
  share_progress(r, WG_STATE_DONE, NULL, 1);
}

static int load_checkpoint(wg_runner_ctx_t *r, const wg_checkpoint_rec_t *ck) {
  wg_job_t *j = &r->job;
  char err[256];
  uint64_t it = 0;
  /* ck->path comes from etcd: relative to the checkpoint root, which it cannot leave */
  int e =
      wg_ckroot_load(&r->opt->checkpoint_root, ck->path, j->model, j->optim, &it, err, sizeof err);
  if (e) {
    RLOG(r, WAGMA_LOG_WARN, "job %s: cannot resume from %s: %s", j->cfg.job, ck->path, err);
    return e;
  }
  j->iteration = it;
  j->have_model = 1;
  RLOG(r, WAGMA_LOG_INFO, "job %s: resumed from checkpoint %s (iteration %llu)", j->cfg.job,
       ck->path, (unsigned long long)it);
  return 0;
}

/* Adopts the plan of a new epoch (a copy the job takes over) and its secret (moved: the
 * caller's copy is wiped); connect_epoch does the rest. */
static void enter_epoch(wg_runner_ctx_t *r, wagma_plan_t *plan, int have_ck,
                        const wg_checkpoint_rec_t *ck, uint8_t *secret, size_t secret_len) {
  wg_job_t *j = &r->job;
  close_comm(r);
  wagma_plan_free(&j->plan);
  j->plan = *plan;
  memset(plan, 0, sizeof *plan);
  OPENSSL_cleanse(j->secret, sizeof j->secret);
  j->secret_len = secret_len <= sizeof j->secret ? secret_len : 0;
  if (j->secret_len)
    memcpy(j->secret, secret, j->secret_len);
  OPENSSL_cleanse(secret, secret_len);
  j->authenticated = 0;
  j->epoch = j->plan.epoch;
  j->have_ck = have_ck;
  if (have_ck)
    j->ck = *ck;
  j->rank = wagma_plan_rank_of(&j->plan, r->opt->name);
  j->have_round = 0; /* no round of this epoch yet */
  j->need_connect = j->rank >= 0;
  j->connect_at = 0;
  j->connect_failures = 0;
  j->unavailable = 0;
  if (j->rank < 0) {
    OPENSSL_cleanse(j->secret, sizeof j->secret);
    j->secret_len = 0;
    RLOG(r, WAGMA_LOG_INFO, "job %s: not a member of epoch %llu; idle", j->cfg.job,
         (unsigned long long)j->epoch);
  }
}

/* The epoch's secret is no longer needed: the communicator exists, or the epoch is given up. */
static void wipe_secret(wg_job_t *j) {
  OPENSSL_cleanse(j->secret, sizeof j->secret);
  j->secret_len = 0;
}

/* The communicators' log: the agent's log, and the last error line kept for the progress
 * record (any thread of a communicator may log). */
static void comm_log(void *user, int level, const char *msg) {
  wg_runner_ctx_t *r = user;
  if (level >= WAGMA_LOG_ERROR) {
    pthread_mutex_lock(&r->comm_log_mu);
    snprintf(r->comm_error, sizeof r->comm_error, "%s", msg);
    pthread_mutex_unlock(&r->comm_log_mu);
  }
  wg_agent_log((void *)r->opt->name, level, msg);
}

/* wagma_comm_options_t.cancelled: the epoch being set up is superseded (a newer plan, a
 * release or a stop), so wagma_comm_create gives up at once instead of waiting out
 * --connect-timeout for members of an old epoch. */
static int epoch_superseded(void *user) {
  wg_runner_ctx_t *r = user;
  pthread_mutex_lock(&r->shared->mu);
  int gone = r->shared->stop || !r->shared->assigned ||
             (r->shared->have_plan && r->shared->plan.epoch > r->job.epoch);
  pthread_mutex_unlock(&r->shared->mu);
  return gone;
}

/* Creates the communicator of the adopted plan and runs the opening global sync. When the
 * communicator cannot be created (e.g. the listen port is taken) it tries again every second
 * for --listen-timeout seconds, then gives up on the epoch and reports "unavailable" with the
 * reason: the coordinator replans without this agent. A newer plan that lists it again tries
 * afresh. */
static void connect_epoch(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  wagma_comm_options_t co;
  const wg_checkpoint_rec_t *ck = &j->ck;
  int e, all_joiners = 1, have_ck = j->have_ck;
  for (int i = 0; i < j->plan.nranks; i++)
    all_joiners &= j->plan.members[i].joiner;
  if (!j->secret_len) {
    /* The coordinator writes every plan's secret in the plan's own Txn: a plan without one
     * here means this agent could not read it (etcd permissions, an etcd failure; the control
     * thread logged why). Running the epoch unauthenticated would open its data plane to
     * anyone who can reach the port: this agent drops out instead. */
    char why[200];
    snprintf(why, sizeof why,
             "no data-plane secret for epoch %llu (unreadable in etcd): not running the data "
             "plane unauthenticated",
             (unsigned long long)j->epoch);
    RLOG(r, WAGMA_LOG_ERROR, "job %s: %s; reporting this agent unavailable for the job", j->cfg.job,
         why);
    j->need_connect = 0;
    j->unavailable = 1;
    share_progress(r, WG_STATE_UNAVAILABLE, why, 1);
    return;
  }
  wagma_comm_options_init(&co);
  co.plan = &j->plan;
  co.rank = j->rank;
  co.count = j->nparams;
  co.connect_timeout_s = r->opt->connect_timeout_s;
  co.round_deadline_floor_s = r->opt->round_deadline_s;
  co.global_timeout_s = r->opt->collective_timeout_s;
  co.log = comm_log;
  co.log_user = r;
  co.cancelled = epoch_superseded;
  co.cancel_user = r;
  /* the epoch's secret: every member proves it in the handshake (docs/collective.md "Peer
   * authentication") */
  co.secret = j->secret;
  co.secret_len = j->secret_len;
  co.encrypt = r->opt->encrypt_data_plane; /* sealed frames (docs/collective.md "Encryption") */
  /* --transport nccl: large payloads over NCCL on the backend's device ("cuda" = device 0) */
  co.transport = r->opt->transport_nccl ? WAGMA_TRANSPORT_NCCL : WAGMA_TRANSPORT_TCP;
  co.device = 0;
  co.use_listen_fd = r->opt->listen_fd >= 0; /* the agent's, bound at start (--programs) */
  co.listen_fd = r->opt->listen_fd;
  double t0 = wg_mono();
  pthread_mutex_lock(&r->comm_log_mu);
  r->comm_error[0] = '\0';
  pthread_mutex_unlock(&r->comm_log_mu);
  /* The plan holds the address peers dial (--advertise); the transport binds my own member's
   * address, so the communicator gets a copy of the plan with mine set to --listen. */
  char advertised[WAGMA_ADDRESS_MAX];
  snprintf(advertised, sizeof advertised, "%s", j->plan.members[j->rank].address);
  snprintf(j->plan.members[j->rank].address, sizeof j->plan.members[j->rank].address, "%s",
           r->opt->listen);
  e = wagma_comm_create(&co, &j->comm); /* copies the plan */
  snprintf(j->plan.members[j->rank].address, sizeof j->plan.members[j->rank].address, "%s",
           advertised);
  if (e != 0) {
    char cause[sizeof r->comm_error], why[300];
    double now = wg_mono();
    j->comm = NULL;
    if (e == WAGMA_ECANCELED) { /* superseded: the runner loop takes the newer state */
      RLOG(r, WAGMA_LOG_INFO, "job %s epoch %llu: setup abandoned for a newer plan or a stop",
           j->cfg.job, (unsigned long long)j->epoch);
      j->need_connect = 0;
      wipe_secret(j);
      return;
    }
    pthread_mutex_lock(&r->comm_log_mu);
    snprintf(cause, sizeof cause, "%s", r->comm_error[0] ? r->comm_error : wagma_strerror(e));
    pthread_mutex_unlock(&r->comm_log_mu);
    if (j->connect_failures++ == 0)
      j->connect_first_failure = now;
    double left = j->connect_first_failure + r->opt->listen_timeout_s - now;
    if (left <= 0) {
      snprintf(why, sizeof why, "cannot create the communicator of epoch %llu for %.0f s: %s",
               (unsigned long long)j->epoch, now - j->connect_first_failure, cause);
      RLOG(r, WAGMA_LOG_ERROR, "job %s: %s; reporting this agent unavailable for the job",
           j->cfg.job, why);
      j->need_connect = 0;
      j->unavailable = 1;
      wipe_secret(j);
      share_progress(r, WG_STATE_UNAVAILABLE, why, 1);
      return;
    }
    j->connect_at = now + (left < 1.0 ? left : 1.0);
    if (j->connect_failures % 30 == 1)
      RLOG(r, WAGMA_LOG_WARN,
           "job %s epoch %llu: cannot create the communicator: %s; retrying for %.0f s", j->cfg.job,
           (unsigned long long)j->epoch, cause, left);
    return;
  }
  j->need_connect = 0;
  j->authenticated = j->secret_len > 0;
  wipe_secret(j); /* read by wagma_comm_create only */
  pthread_mutex_lock(&r->shared->mu);
  r->shared->comm = j->comm; /* abortable from now on */
  r->shared->comm_epoch = j->epoch;
  if (r->shared->stop || !r->shared->assigned ||
      (r->shared->have_plan && r->shared->plan.epoch > j->epoch))
    wagma_comm_abort(j->comm); /* superseded while it was being created */
  pthread_mutex_unlock(&r->shared->mu);

  /* Global sync: joiners (weight 0) receive the model from the others. A member without a
   * model that the plan does not mark as a joiner is part of a fresh start (the coordinator
   * marks no joiner when nobody survived): it begins from the job's checkpoint when one is
   * recorded (every member loads the same file, and the coordinator made the plan's
   * start_round its iteration), else from the seed (the same on every member; weight 0 below).
   * The iteration does not travel in the sync: every member takes the plan's start_round. */
  int plan_joiner = j->plan.members[j->rank].joiner && !all_joiners, seeded = 0;
  if (!j->have_model) {
    if (!plan_joiner && have_ck && ck->path[0] && load_checkpoint(r, ck) == 0) {
      if (j->iteration != j->plan.start_round)
        RLOG(r, WAGMA_LOG_INFO,
             "job %s epoch %llu: checkpoint holds iteration %llu, the plan starts at round "
             "%llu: counting from there",
             j->cfg.job, (unsigned long long)j->epoch, (unsigned long long)j->iteration,
             (unsigned long long)j->plan.start_round);
    } else {
      wagma_model_init(j->model, j->cfg.seed);
      wagma_optim_reset(j->optim);
      j->have_model = !plan_joiner;
      seeded = !plan_joiner;
    }
  }
  /* A member without a model of the job takes weight 0 and receives the others' model: a
   * joiner, and also a member the plan counts as a survivor whose joining sync never completed
   * (it drew the seed above; weighted 1, the seed would dilute the trained model). When no
   * member has a model every weight is 0 (WAGMA_EINVAL on every member): a fresh start, and
   * every member keeps the seed's model it drew (the same on all). */
  int joiner = plan_joiner, fresh = 0;
  float weight = joiner || seeded ? 0.0f : 1.0f;
  size_t n = j->nparams + j->nstate;
  e = wg_model_host_state_save(&j->host, j->sync_buf);
  if (e == 0)
    e = wagma_comm_average(j->comm, j->sync_buf, n, weight);
  if (e == WAGMA_EINVAL && weight == 0.0f) {
    /* Every live member had weight 0: nobody had a model (a fresh start, whose members all
     * hold the same seed), unless the plan's survivors are out of reach: then a joiner got
     * no model and must not train from its seed (below). */
    int survivor_lost = 0;
    for (int i = 0; plan_joiner && i < j->plan.nranks; i++)
      survivor_lost |= !j->plan.members[i].joiner && !wagma_comm_peer_alive(j->comm, i);
    if (!survivor_lost) {
      fresh = 1; /* sync_buf is still this member's (seed) state */
      e = 0;
    }
  }
  if (e == WAGMA_ECANCELED) {
    RLOG(r, WAGMA_LOG_INFO, "job %s epoch %llu: global sync aborted (newer plan or stop)",
         j->cfg.job, (unsigned long long)j->epoch);
    close_comm(r); /* aborted by the control side: a newer plan or a stop is waiting */
    return;
  }
  if (e == 0 && (e = wg_model_host_state_load(&j->host, j->sync_buf)) == 0) {
    j->have_model = 1;
  } else if (plan_joiner) {
    /* A joiner (the plan has members with the job's model) that got none: training on the
     * seed would average it into theirs at full weight. This agent drops out (the
     * coordinator replans without it); the job goes on with the members that have its model.
     * (A member without a model in a fresh start keeps the seed, which all share.) */
    char why[240];
    snprintf(why, sizeof why,
             "the joining sync of epoch %llu brought no model of the job (%s): not training "
             "from the seed",
             (unsigned long long)j->epoch, wagma_strerror(e));
    RLOG(r, WAGMA_LOG_ERROR, "job %s: %s; reporting this agent unavailable for the job", j->cfg.job,
         why);
    close_comm(r);
    j->have_model = 0;
    j->unavailable = 1;
    share_progress(r, WG_STATE_UNAVAILABLE, why, 1);
    return;
  } else {
    wg_runner_warn_comm(r, "global sync", e);
  }
  /* round == iteration: the communicator's first round is the plan's start_round. The
   * optimizer's update count (lr schedule) and the data stream follow the iteration. */
  j->iteration = j->plan.start_round;
  wagma_optim_set_updates(j->optim, j->iteration);
  wagma_sampler_seek(&j->sampler, j->iteration * (uint64_t)j->cfg.batch_size);
  j->total_iterations = total_iterations(j);
  j->done = 0;
  j->entered_at = wg_mono();
  wg_algo_enter_epoch(r);
  RLOG(r, WAGMA_LOG_INFO,
       "job %s: epoch %llu joined as rank %d/%d (%s, weight %.0f), iteration %llu of %llu, "
       "sync %.3f s, data plane %s",
       j->cfg.job, (unsigned long long)j->epoch, j->rank, j->plan.nranks,
       joiner   ? "joiner"
       : fresh  ? "fresh start"
       : seeded ? "survivor without a model"
                : "survivor",
       weight, (unsigned long long)j->iteration, (unsigned long long)j->total_iterations,
       wg_mono() - t0,
       !j->authenticated            ? "UNAUTHENTICATED"
       : r->opt->encrypt_data_plane ? "authenticated and encrypted"
                                    : "authenticated");
  share_progress(r, WG_STATE_RUNNING, NULL, 1);
  if (j->iteration >= j->total_iterations && fresh && j->iteration > 0) {
    /* A fresh start (no member had a model, no checkpoint loaded) at the job's last
     * iteration: no iteration is left to train, so the "result" would be the seed's model. */
    char why[240];
    snprintf(why, sizeof why,
             "epoch %llu starts at the job's last iteration %llu with no trained model (no "
             "survivor, no checkpoint): the job's model is lost",
             (unsigned long long)j->epoch, (unsigned long long)j->iteration);
    finish_failed(r, why);
  } else if (j->iteration >= j->total_iterations) {
    finish(r);
  }
}

static void maybe_checkpoint(wg_runner_ctx_t *r, uint64_t before) {
  wg_job_t *j = &r->job;
  uint64_t every = j->cfg.checkpoint_every;
  char path[WAGMA_API_CHECKPOINT_PATH_MAX], name[WAGMA_NAME_MAX + 8], err[512];
  if (j->rank != 0 || every == 0 || !j->cfg.checkpoint_dir[0])
    return;
  if (before / every == j->iteration / every && j->iteration < j->total_iterations)
    return;
  /* <root>/<checkpoint.path>/<job>.ckpt; the record holds the path relative to the root, so
   * every agent resolves it under its own --checkpoint-root (docs/agent.md) */
  snprintf(name, sizeof name, "%s.ckpt", j->cfg.job);
  if (snprintf(path, sizeof path, "%s/%s", j->cfg.checkpoint_dir, name) >= (int)sizeof path) {
    RLOG(r, WAGMA_LOG_WARN, "job %s: checkpoint path longer than %d bytes", j->cfg.job,
         (int)sizeof path - 1);
    return;
  }
  if (wg_ckroot_save(&r->opt->checkpoint_root, j->cfg.checkpoint_dir, name, j->model, j->optim,
                     j->iteration, err, sizeof err) != 0) {
    RLOG(r, WAGMA_LOG_WARN, "job %s: checkpoint failed: %s", j->cfg.job, err);
    return;
  }
  pthread_mutex_lock(&r->shared->mu);
  wg_checkpoint_rec_t *c = &r->shared->checkpoint_out;
  snprintf(c->job, sizeof c->job, "%s", j->cfg.job);
  snprintf(c->path, sizeof c->path, "%s", path);
  c->iteration = j->iteration;
  c->epoch = j->epoch;
  r->shared->checkpoint_dirty = 1;
  pthread_mutex_unlock(&r->shared->mu);
}

static void train_once(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  uint64_t before = j->iteration;
  int e = wg_algo_iteration(r);
  j->have_model = 1; /* trained: from now on this is the job's model, to keep */
  if (e == WAGMA_ECLOSED || e == WAGMA_ECANCELED) {
    if (e == WAGMA_ECANCELED)
      RLOG(r, WAGMA_LOG_INFO, "job %s epoch %llu: communicator aborted (newer plan or stop)",
           j->cfg.job, (unsigned long long)j->epoch);
    close_comm(r); /* unusable (or aborted for a newer plan): wait for the next plan */
    return;
  }
  if (e && e != WAGMA_ETIMEDOUT && e != WAGMA_EPEER && e != WAGMA_EUNAVAIL && e != WAGMA_EIO &&
      e != WAGMA_EEPOCH && e != WAGMA_EINVAL && e != WAGMA_EBUSY) {
    RLOG(r, WAGMA_LOG_ERROR, "job %s: iteration failed: %s", j->cfg.job, wagma_strerror(e));
    wg_sleep_s(0.1);
  }
  if (j->cfg.eval_every && j->iteration / j->cfg.eval_every != before / j->cfg.eval_every)
    evaluate(r, r->opt->eval_samples);
  maybe_checkpoint(r, before);
  share_progress(r, WG_STATE_RUNNING, NULL, 0);
  if (j->iteration >= j->total_iterations)
    finish(r);
}

/* ---- thread ------------------------------------------------------------------------------ */

static void wait_shared(wg_runner_ctx_t *r, uint64_t gen, double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* shared->cv uses CLOCK_MONOTONIC (wg_shared_init) */
  long ns = ts.tv_nsec + (long)(seconds * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  pthread_mutex_lock(&r->shared->mu);
  if (!r->shared->stop && r->shared->generation == gen)
    pthread_cond_timedwait(&r->shared->cv, &r->shared->mu, &ts);
  pthread_mutex_unlock(&r->shared->mu);
}

static void *runner_main(void *arg) {
  struct wg_runner *self = arg;
  wg_runner_ctx_t *r = &self->ctx;
  wg_job_t *j = &r->job;
  uint64_t seen = UINT64_MAX;
  int assigned = 0, have_plan = 0, have_ck = 0;
  wg_job_config_t cfg;
  wagma_plan_t plan;
  wg_checkpoint_rec_t ck;
  uint8_t secret[WAGMA_API_SECRET_LEN]; /* plan's epoch secret, taken from shared with it */
  size_t secret_len = 0;
  memset(&plan, 0, sizeof plan);
  memset(&cfg, 0, sizeof cfg);
  j->rank = -1;
  for (;;) {
    uint64_t gen;
    pthread_mutex_lock(&r->shared->mu);
    int stop = r->shared->stop;
    gen = r->shared->generation;
    if (gen != seen) {
      assigned = r->shared->assigned;
      cfg = r->shared->job;
      have_plan = r->shared->have_plan;
      wagma_plan_free(&plan);
      if (have_plan && wagma_plan_copy(&plan, &r->shared->plan) != 0)
        have_plan = 0;
      /* the secret moves here with the plan (wiped in shared; a newer plan brings its own) */
      OPENSSL_cleanse(secret, sizeof secret);
      secret_len = 0;
      if (have_plan && r->shared->secret_len <= sizeof secret) {
        secret_len = r->shared->secret_len;
        memcpy(secret, r->shared->secret, secret_len);
      }
      OPENSSL_cleanse(r->shared->secret, sizeof r->shared->secret);
      r->shared->secret_len = 0;
      have_ck = r->shared->have_checkpoint;
      ck = r->shared->checkpoint;
      seen = gen;
    }
    pthread_mutex_unlock(&r->shared->mu);
    if (stop)
      break;
    if (assigned && (cfg.program.name[0] || wg_trainer_runs(r->opt, &cfg))) {
      /* a program job, or a built-in one in wagma-train: launcher.c runs it */
      if (j->active || j->broken)
        job_teardown(r);
      if (!r->launcher && wg_launcher_new(r->opt, r->shared, &r->launcher) != 0) {
        wait_shared(r, gen, 1.0);
        continue;
      }
      wg_launcher_turn(r->launcher, &cfg, have_plan ? &plan : NULL, secret, secret_len,
                       have_ck ? &ck : NULL, 0.05);
      have_plan = 0; /* the launcher keeps it, with the secret, until the program has it */
      OPENSSL_cleanse(secret, sizeof secret);
      secret_len = 0;
      continue;
    }
    wg_launcher_release(r->launcher, assigned ? "a job without a program" : "released");
    if (!assigned) {
      if (j->active || j->broken)
        job_teardown(r);
      wait_shared(r, gen, 0.2);
      continue;
    }
    if ((!j->active && !j->broken) || strcmp(j->cfg.job, cfg.job) != 0) {
      job_teardown(r);
      job_setup(r, &cfg);
    }
    if (j->broken) {
      wait_shared(r, gen, 0.2);
      continue;
    }
    if (have_plan && plan.epoch != j->epoch) {
      enter_epoch(r, &plan, have_ck, &ck, secret, secret_len);
      have_plan = 0; /* taken over, with the secret */
      secret_len = 0;
    }
    if (j->need_connect && wg_mono() >= j->connect_at)
      connect_epoch(r);
    if (!j->comm || j->done) {
      if (j->done && j->comm && wg_mono() - j->done_at > r->opt->linger_s) {
        RLOG(r, WAGMA_LOG_INFO, "job %s: finished %.0f s ago; closing the communicator", j->cfg.job,
             r->opt->linger_s);
        close_comm(r);
      }
      wait_shared(r, gen, 0.2);
      continue;
    }
    train_once(r);
  }
  if (j->active && !j->done && !j->unavailable && j->rank >= 0)
    share_progress(r, WG_STATE_RUNNING, NULL, 1); /* (a non-member keeps its last report) */
  job_teardown(r);
  wg_launcher_free(r->launcher); /* stops a program still running */
  r->launcher = NULL;
  wagma_plan_free(&plan);
  OPENSSL_cleanse(secret, sizeof secret);
  pthread_mutex_lock(&self->mu);
  self->finished = 1;
  pthread_cond_broadcast(&self->cv);
  pthread_mutex_unlock(&self->mu);
  return NULL;
}

int wg_runner_start(const wg_agent_options_t *opt, wg_shared_t *shared, wg_runner_t **out) {
  struct wg_runner *r = calloc(1, sizeof *r);
  *out = NULL;
  if (!r)
    return WAGMA_ENOMEM;
  r->ctx.opt = opt;
  r->ctx.shared = shared;
  /* main.c probed --device cuda before registering; opening can still fail (memory) */
  char why[256] = "";
  int e = wagma_backend_open(opt->device_cuda ? "cuda" : "cpu", &r->ctx.backend, why, sizeof why);
  if (e) {
    wg_logf(wg_agent_log, (void *)opt->name, WAGMA_LOG_ERROR, "--device %s: %s",
            opt->device_cuda ? "cuda" : "cpu", why[0] ? why : wagma_strerror(e));
    free(r);
    return e;
  }
  wg_logf(wg_agent_log, (void *)opt->name, WAGMA_LOG_INFO, "training on %s",
          wagma_backend_name(r->ctx.backend));
  pthread_mutex_init(&r->ctx.comm_log_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* a wall-clock step must not stretch join */
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&r->thread, NULL, runner_main, r) != 0) {
    wagma_backend_close(r->ctx.backend);
    pthread_mutex_destroy(&r->ctx.comm_log_mu);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    return WAGMA_EIO;
  }
  *out = r;
  return 0;
}

int wg_runner_join(wg_runner_t *r, double timeout_s) {
  struct timespec ts;
  int finished;
  if (!r)
    return 0;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += (time_t)timeout_s;
  pthread_mutex_lock(&r->mu);
  while (!r->finished)
    if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0)
      break;
  finished = r->finished;
  pthread_mutex_unlock(&r->mu);
  if (!finished)
    return WAGMA_ETIMEDOUT;
  pthread_join(r->thread, NULL);
  wagma_backend_close(r->ctx.backend); /* after its models and optimizers (job_teardown) */
  pthread_mutex_destroy(&r->ctx.comm_log_mu);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
  return 0;
}
