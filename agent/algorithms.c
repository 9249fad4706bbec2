/* agent/algorithms.c — one training iteration of each algorithm (docs/design.md §8), on
 * the runner thread (the communicator's "compute thread"):
 *   wagma      local step, then wagma_comm_step: a group round, or every tau rounds the global
 *              round in the plan's global_sync mode; the iteration IS the comm's round
 *              counter (round == iteration: both start at the plan's start_round, and the
 *              iteration jumps when the engine skips rounds); the round and my group in it
 *              are kept for the progress record;
 *   allreduce  gradients averaged over all members every step (wagma_comm_allreduce), then the
 *              step: the synchronous data-parallel baseline;
 *   local-sgd  local steps, model mean over all members every tau iterations;
 *   adpsgd     local step, then (AD-PSGD, adpsgd.h) an even rank averages its model with one
 *              odd rank drawn at random, an odd rank publishes its model and takes the
 *              averagings it answered meanwhile; no barrier, a silent peer is skipped after
 *              the --round-deadline. Ports and tokens of the endpoints travel at each epoch's
 *              start over the communicator (an allreduce of 5 floats per rank).
 *   asgd       (Downpour, ps.h) the first ps_shards ranks are parameter-server shards: they
 *   dc-asgd    apply the workers' pushes at once (dc-asgd with delay compensation); a
 *              worker pulls the model, computes a gradient there and pushes it, no local step;
 *              the push's delay (updates between pull and push) is the progress' staleness.
 *              At the end the shards' slices are the model (wg_algo_final_model).
 * Any algorithm: with the spec's gradient_delay d the optimizer takes the gradient of d steps
 * ago from a FIFO of gradients in the device's memory (wagma_grad_delay_t; the first d steps of
 * a job take no update; the FIFO lives as long as the job on this agent, across epochs).
 * Straggler injection sits between the local step and the averaging: --slow-factor F sleeps
 * (F-1) x the measured compute time (a persistently slower node), --sleep-prob p --sleep-ms D
 * pauses D ms with probability p (transient imbalance). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "agent/runner.h"
#include "wagma/log_internal.h"

static void straggle(wg_runner_ctx_t *r, double compute_s) {
  const wg_agent_options_t *o = r->opt;
  double pause = 0;
  if (o->slow_factor > 1.0)
    pause += (o->slow_factor - 1.0) * compute_s;
  if (o->sleep_prob > 0 && wagma_rng_uniform(&r->job.straggler_rng) < o->sleep_prob)
    pause += o->sleep_ms / 1000.0;
  if (pause > 0)
    wg_sleep_s(pause);
}

/* Keeps the round a step ran and my group in it (the plan's, as the engine used it). */
static void note_round(wg_job_t *j, const wagma_round_stats_t *st) {
  const int *ranks = NULL;
  j->have_round = 1;
  j->last_round = st->round;
  j->last_round_global = st->kind == WAGMA_ROUND_GLOBAL;
  j->last_ngroup = 0;
  if (j->last_round_global)
    return;
  int n = wagma_plan_group(&j->plan, st->round, j->rank, NULL, &ranks);
  if (n > 0 && n <= WAGMA_API_PROGRESS_GROUP_MAX) {
    memcpy(j->last_group, ranks, (size_t)n * sizeof *ranks);
    j->last_ngroup = n;
  }
}

/* How long a worker waits, without a warning, for a shard to enter the epoch they both
 * entered (the shard leaves the epoch's opening sync a moment after it). */
#define PS_ENTRY_GRACE_S 2.0

static int is_ps(const wg_job_t *j) {
  return j->cfg.algorithm == WAGMA_ALGO_ASGD || j->cfg.algorithm == WAGMA_ALGO_DC_ASGD;
}

static void note_loss(wg_job_t *j, double loss) {
  if (isfinite(loss))
    j->loss_ema = isfinite(j->loss_ema) ? 0.95 * j->loss_ema + 0.05 * loss : loss;
}

/* A shard's iteration: the pushes arrive on the endpoint's threads; this thread reports. Its
 * iteration follows the workers' (the largest pushed), and reaches the job's end once every
 * worker of the epoch said it is done. */
static int shard_iteration(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  wg_ps_shard_stats_t st;
  wg_sleep_s(0.002);
  wg_ps_shard_stats(j->ps, &st);
  if (st.max_delay > j->staleness_window)
    j->staleness_window = st.max_delay;
  if (isfinite(st.loss))
    j->loss_ema = st.loss;
  uint64_t it = st.max_iteration > j->iteration ? st.max_iteration : j->iteration;
  if (st.workers_done >= j->plan.nranks - j->ps_shards)
    it = it > j->total_iterations ? it : j->total_iterations;
  else if (j->total_iterations && it >= j->total_iterations)
    it = j->total_iterations - 1; /* a worker is still at it */
  /* the runner evaluates j->model when the iteration crosses eval_every: make it the model the
   * shards hold now (pulled like a worker, this shard's slice from itself) */
  if (j->cfg.eval_every && it / j->cfg.eval_every != j->iteration / j->cfg.eval_every) {
    int e;
    float *host = wg_model_host_params(&j->host, &e);
    if (host && wg_ps_pull(j->ps, host) == 0)
      wg_model_host_params_back(&j->host);
  }
  j->iteration = it;
  return 0;
}

/* A worker's iteration: pull, gradient at the pulled model, push (the gradient of d steps ago
 * with a gradient_delay). A shard that does not answer costs at most its deadline and the
 * step does not count (see below); the epoch change that follows its death reassigns it. */
static int worker_iteration(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  wagma_eval_t ev;
  int e, e2;
  double t0 = wg_mono();
  float *host = wg_model_host_params(&j->host, &e);
  if (!host)
    return e;
  int pulled = wg_ps_pull(j->ps, host);
  if ((e = wg_model_host_params_back(&j->host)))
    return e;
  if ((e = wagma_batch_draw(&j->batch, &j->sampler, &j->train, (size_t)j->cfg.batch_size)) ||
      (e = wagma_model_forward(j->model, j->batch.x, j->batch.y, j->batch.n, &ev)) ||
      (e = wagma_model_backward(j->model)))
    return e;
  straggle(r, wg_mono() - t0);
  const float *g = wg_model_host_grads(&j->host, &e);
  if (!g)
    return e;
  if (j->delay)
    g = wagma_grad_delay_push(j->delay, g); /* a host delay line for asgd (wg_algo_setup) */
  uint64_t delay = 0;
  e2 = pulled ? pulled : g ? wg_ps_push(j->ps, g, j->iteration, ev.n ? ev.loss : NAN, &delay) : 0;
  if (e2) {
    /* a shard did not answer (dead, stopped, not in this epoch yet): the step trained nothing
     * and does not count; wait a little (a dead shard refuses at once) and try again, until
     * the plan that follows its death reassigns the shard. A shard that has not entered the
     * epoch yet (it left the opening sync after this worker) is no fault for a while. */
    if (e2 != WAGMA_EBUSY || wg_mono() - j->entered_at > PS_ENTRY_GRACE_S)
      wg_runner_warn(r, "parameter-server pull or push", e2, wg_ps_last_error(j->ps));
    wg_sleep_s(0.02);
    return e2;
  }
  if (delay > j->staleness_window)
    j->staleness_window = delay;
  note_loss(j, ev.n ? ev.loss : NAN);
  j->iteration++;
  if (j->iteration >= j->total_iterations && !j->ps_done_sent) {
    wg_ps_done(j->ps);
    j->ps_done_sent = 1;
  }
  double dt = wg_mono() - t0;
  j->step_ema = isfinite(j->step_ema) ? 0.9 * j->step_ema + 0.1 * dt : dt;
  return 0;
}

int wg_algo_iteration(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  wagma_eval_t ev;
  float *host;
  int e;
  double t0 = wg_mono();

  if (is_ps(j) && j->ps && j->ps_shards > 0) /* else: alone in the plan, local steps */
    return j->rank < j->ps_shards ? shard_iteration(r) : worker_iteration(r);

  if ((e = wagma_batch_draw(&j->batch, &j->sampler, &j->train, (size_t)j->cfg.batch_size)))
    return e;
  if ((e = wagma_model_forward(j->model, j->batch.x, j->batch.y, j->batch.n, &ev)))
    return e;
  if ((e = wagma_model_backward(j->model)))
    return e;
  if (j->cfg.algorithm == WAGMA_ALGO_ALLREDUCE) {
    /* The straggler's delay belongs to its compute, before it joins the collective. */
    straggle(r, wg_mono() - t0);
    if (!(host = wg_model_host_grads(&j->host, &e)))
      return e;
    if ((e = wagma_comm_allreduce(j->comm, host, j->nparams, WAGMA_REDUCE_MEAN))) {
      wg_runner_warn_comm(r, "gradient allreduce", e);
      return e;
    }
    if ((e = wg_model_host_grads_back(&j->host)))
      return e;
  }
  if (j->delay)
    wagma_optim_step_delayed(j->optim, j->delay, j->iteration, wagma_model_params(j->model),
                             wagma_model_grads(j->model));
  else
    wagma_optim_step(j->optim, j->iteration, wagma_model_params(j->model),
                     wagma_model_grads(j->model));
  if (j->cfg.algorithm != WAGMA_ALGO_ALLREDUCE)
    straggle(r, wg_mono() - t0);

  double loss = ev.n ? ev.loss : NAN;
  if (isfinite(loss))
    j->loss_ema = isfinite(j->loss_ema) ? 0.95 * j->loss_ema + 0.05 * loss : loss;

  switch (j->cfg.algorithm) {
  case WAGMA_ALGO_WAGMA: {
    wagma_round_stats_t st;
    memset(&st, 0, sizeof st);
    if (!(host = wg_model_host_params(&j->host, &e)))
      return e;
    e = wagma_comm_step(j->comm, host, &st);
    /* what the engine wrote (corrections, a result) goes back whatever it returned */
    int back = wg_model_host_params_back(&j->host);
    if (e == 0)
      e = back;
    if (e == 0 && st.max_staleness > j->staleness_window)
      j->staleness_window = st.max_staleness;
    if (e == 0)
      note_round(j, &st);
    j->iteration = wagma_comm_round(j->comm);
    if (e)
      wg_runner_warn_comm(r, "wagma round", e);
    break;
  }
  case WAGMA_ALGO_LOCAL_SGD:
    j->iteration++;
    if (j->cfg.staleness_bound > 0 && j->iteration % (uint64_t)j->cfg.staleness_bound == 0) {
      if (!(host = wg_model_host_params(&j->host, &e)))
        return e;
      e = wagma_comm_allreduce(j->comm, host, j->nparams, WAGMA_REDUCE_MEAN);
      int back = wg_model_host_params_back(&j->host);
      if (e == 0)
        e = back;
      if (e)
        wg_runner_warn_comm(r, "model average", e);
    }
    break;
  case WAGMA_ALGO_ADPSGD:
    j->iteration++;
    e = 0;
    if (!j->gossip || !(host = wg_model_host_params(&j->host, &e)))
      break;
    if (wg_adpsgd_rank_active(j->rank)) {
      /* a skipped averaging (silent or refusing peer) leaves the model as it was: go on */
      if (wg_adpsgd_average(j->gossip, host, &j->gossip_rng, NULL) == 0)
        e = wg_model_host_params_back(&j->host);
    } else if (wg_adpsgd_publish(j->gossip, host) > 0) {
      e = wg_model_host_params_back(&j->host);
    }
    break;
  default:
    j->iteration++;
    e = 0;
    break;
  }
  double dt = wg_mono() - t0;
  j->step_ema = isfinite(j->step_ema) ? 0.9 * j->step_ema + 0.1 * dt : dt;
  return e;
}

/* ---- setup, epochs, roles ---------------------------------------------------------------- */

/* The host part of "host:port" or "[v6]:port" into out ("" = any). */
static void address_host(const char *address, char *out, size_t len) {
  const char *colon = strrchr(address, ':');
  size_t n = colon ? (size_t)(colon - address) : strlen(address);
  if (n >= 2 && address[0] == '[' && address[n - 1] == ']') {
    address++;
    n -= 2;
  }
  snprintf(out, len, "%.*s", (int)n, address);
}

int wg_algo_setup(wg_runner_ctx_t *r, char *err, size_t err_len) {
  wg_job_t *j = &r->job;
  char host[WAGMA_ADDRESS_MAX];
  int e;
  /* asgd workers push host gradients: their delay line is in host memory */
  if (j->cfg.gradient_delay > 0 &&
      (e = wagma_grad_delay_create_on(is_ps(j) ? NULL : r->backend, j->nparams,
                                      (unsigned)j->cfg.gradient_delay, &j->delay, err, err_len)))
    return e;
  address_host(r->opt->listen, host, sizeof host);
  if (j->cfg.algorithm == WAGMA_ALGO_ADPSGD) {
    if ((e = wg_adpsgd_open(host[0] ? host : NULL, j->nparams, wg_agent_log, (void *)r->opt->name,
                            &j->gossip))) {
      snprintf(err, err_len, "adpsgd: cannot listen on the host of --listen %s: %s", r->opt->listen,
               wagma_strerror(e));
      return WAGMA_EUNAVAIL;
    }
    wagma_rng_seed(&j->gossip_rng, wagma_seed_derive(j->cfg.seed ^ 0xad95u, r->opt->name));
  }
  if (is_ps(j)) {
    double lambda = j->cfg.algorithm == WAGMA_ALGO_DC_ASGD ? j->cfg.dc_lambda : 0.0;
    if ((e = wg_ps_open(host[0] ? host : NULL, j->nparams, wagma_optim_config(j->optim), lambda,
                        wg_agent_log, (void *)r->opt->name, &j->ps))) {
      snprintf(err, err_len, "%s: cannot listen on the host of --listen %s: %s",
               wagma_algorithm_name(j->cfg.algorithm), r->opt->listen, wagma_strerror(e));
      return WAGMA_EUNAVAIL;
    }
    wg_ps_set_adaptive(j->ps, j->cfg.algorithm == WAGMA_ALGO_DC_ASGD && j->cfg.dc_adaptive);
  }
  return 0;
}

void wg_algo_teardown(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  wg_adpsgd_close(j->gossip);
  j->gossip = NULL;
  wg_ps_close(j->ps);
  j->ps = NULL;
  wagma_grad_delay_destroy(j->delay);
  j->delay = NULL;
}

/* Every member's endpoint port and a fresh token, exchanged over the epoch's communicator.
 * Ownership: *peers (nranks entries) is the caller's (free); on a failed exchange every port
 * is 0 (no peer reachable this epoch) and the status is returned. */
static int exchange_endpoints(wg_runner_ctx_t *r, uint16_t my_port, uint64_t *token,
                              wg_adpsgd_peer_t **peers) {
  wg_job_t *j = &r->job;
  int n = j->plan.nranks, e;
  *token = 0;
  if (RAND_bytes((unsigned char *)token, sizeof *token) != 1)
    *token = wagma_rng_next(&j->gossip_rng) ^ wagma_mix64((uint64_t)(wg_mono() * 1e9));
  float *buf = calloc((size_t)n * WG_ADPSGD_EXCHANGE_FLOATS, sizeof(float));
  *peers = calloc((size_t)n, sizeof **peers);
  if (!buf || !*peers) {
    free(buf);
    free(*peers);
    *peers = NULL;
    return WAGMA_ENOMEM;
  }
  wg_adpsgd_exchange_encode(buf, j->rank, my_port, *token);
  e = wagma_comm_allreduce(j->comm, buf, (size_t)n * WG_ADPSGD_EXCHANGE_FLOATS, WAGMA_REDUCE_SUM);
  if (e) {
    wg_runner_warn_comm(r, "endpoint exchange", e);
    memset(buf, 0, (size_t)n * WG_ADPSGD_EXCHANGE_FLOATS * sizeof(float)); /* no peer known */
  }
  for (int i = 0; i < n; i++) {
    address_host(j->plan.members[i].address, (*peers)[i].host, sizeof(*peers)[i].host);
    wg_adpsgd_exchange_decode(buf, i, &(*peers)[i].port, &(*peers)[i].token);
  }
  free(buf);
  return e;
}

void wg_algo_enter_epoch(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  wg_adpsgd_peer_t *peers = NULL;
  uint64_t token;
  int e = 0, n = j->plan.nranks;
  if ((!j->gossip && !j->ps) || !j->comm || j->rank < 0)
    return;
  double deadline = r->opt->round_deadline_s;
  exchange_endpoints(r, j->gossip ? wg_adpsgd_port(j->gossip) : wg_ps_port(j->ps), &token, &peers);
  if (!peers) {
    e = WAGMA_ENOMEM;
    goto out;
  }
  float *host = wg_model_host_params(&j->host, &e);
  if (!host)
    goto out;
  if (j->gossip) {
    /* Averagings answered in the last epoch (after its last step) still belong to this model:
     * take them before the endpoint forgets them. */
    if (wg_adpsgd_publish(j->gossip, host) > 0 && (e = wg_model_host_params_back(&j->host)))
      goto out;
    e = wg_adpsgd_set_epoch(j->gossip, j->epoch, j->rank, n, peers, token, deadline,
                            deadline * 5 > 2 ? deadline * 5 : 2, host);
  } else {
    j->ps_shards = wg_ps_shards(j->cfg.ps_shards, n);
    j->ps_done_sent = 0;
    e = wg_ps_set_epoch(j->ps, j->epoch, j->rank, n, j->ps_shards, peers, token,
                        deadline > 1 ? deadline : 1, host);
    if (e == 0 && j->rank >= j->ps_shards && j->iteration >= j->total_iterations) {
      wg_ps_done(j->ps); /* done already: the shards must not wait for this worker */
      j->ps_done_sent = 1;
    }
  }
out:
  if (e)
    wg_logf(wg_agent_log, (void *)r->opt->name, WAGMA_LOG_WARN,
            "job %s epoch %llu: %s endpoint not set up: %s", j->cfg.job,
            (unsigned long long)j->epoch, wagma_algorithm_name(j->cfg.algorithm),
            wagma_strerror(e));
  free(peers);
}

const char *wg_algo_role(const wg_job_t *j) {
  if (j->cfg.algorithm == WAGMA_ALGO_ADPSGD)
    return wg_adpsgd_rank_active(j->rank) ? "active" : "passive";
  if (is_ps(j) && j->rank >= 0 && j->rank < j->ps_shards)
    return "server";
  return "worker";
}

int wg_algo_final_model(wg_runner_ctx_t *r, float *params) {
  wg_job_t *j = &r->job;
  if (!is_ps(j) || !j->ps || j->ps_shards == 0)
    return wagma_comm_average(j->comm, params, j->nparams, 1.0f);
  /* One SUM allreduce of [shards' slices | workers' models | a flag per shard | workers]: each
   * slice is its shard's, or, when the shard died during this call (the collective then runs
   * on the survivors), the workers' mean of their latest pulls. */
  size_t n = j->nparams, S = (size_t)j->ps_shards, len = 2 * n + S + 1;
  float *buf = calloc(len, sizeof(float));
  if (!buf)
    return WAGMA_ENOMEM;
  if (j->rank < j->ps_shards) {
    wg_ps_shard_slice(j->ps, buf);
    buf[2 * n + (size_t)j->rank] = 1.0f;
  } else {
    memcpy(buf + n, params, n * sizeof(float));
    buf[2 * n + S] = 1.0f;
  }
  int e = wagma_comm_allreduce(j->comm, buf, len, WAGMA_REDUCE_SUM);
  if (e == 0) {
    float workers = buf[2 * n + S];
    for (int k = 0; k < j->ps_shards; k++) {
      size_t first, slen;
      wg_ps_slice(n, j->ps_shards, k, &first, &slen);
      int have = buf[2 * n + (size_t)k] > 0.5f;
      for (size_t i = first; i < first + slen; i++)
        params[i] = have ? buf[i] : workers > 0 ? buf[n + i] / workers : params[i];
    }
  }
  free(buf);
  return e;
}
