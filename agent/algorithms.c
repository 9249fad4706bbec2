/* agent/algorithms.c — one training iteration of each algorithm (docs/design.md §8), on
 * the runner thread (the communicator's "compute thread"):
 *   wagma      local step, then wagma_comm_step: a group round, or every tau rounds the global
 *              round in the plan's global_sync mode; the iteration IS the comm's round
 *              counter (round == iteration: both start at the plan's start_round, and the
 *              iteration jumps when the engine skips rounds); the round and my group in it
 *              are kept for the progress record;
 *   allreduce  gradients averaged over all members every step (wagma_comm_allreduce), then the
 *              step: the synchronous data-parallel baseline;
 *   local-sgd  local steps, model mean over all members every tau iterations.
 * Straggler injection sits between the local step and the averaging: --slow-factor F sleeps
 * (F-1) x the measured compute time (a persistently slower node), --sleep-prob p --sleep-ms D
 * pauses D ms with probability p (transient imbalance). */
#include <math.h>
#include <string.h>

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

int wg_algo_iteration(wg_runner_ctx_t *r) {
  wg_job_t *j = &r->job;
  wagma_eval_t ev;
  float *host;
  int e;
  double t0 = wg_mono();

  if ((e = wagma_batch_draw(&j->batch, &j->sampler, &j->train, (size_t)j->cfg.batch_size)))
    return e;
  if ((e = wagma_model_forward(j->model, j->batch.x, j->batch.y, j->batch.n, &ev)))
    return e;
  if ((e = wagma_model_backward(j->model)))
    return e;
  if (j->cfg.algorithm == WAGMA_ALGO_ALLREDUCE) {
    /* The straggler's delay belongs to its compute, before it joins the collective. */
    straggle(r, wg_mono() - t0);
    if (!(host = wg_job_grads_to_host(j, &e)))
      return e;
    if ((e = wagma_comm_allreduce(j->comm, host, j->nparams, WAGMA_REDUCE_MEAN))) {
      wg_runner_warn_comm(r, "gradient allreduce", e);
      return e;
    }
    if ((e = wg_job_grads_from_host(j)))
      return e;
  }
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
    if (!(host = wg_job_params_to_host(j, &e)))
      return e;
    e = wagma_comm_step(j->comm, host, &st);
    /* what the engine wrote (corrections, a result) goes back whatever it returned */
    int back = wg_job_params_from_host(j);
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
      if (!(host = wg_job_params_to_host(j, &e)))
        return e;
      e = wagma_comm_allreduce(j->comm, host, j->nparams, WAGMA_REDUCE_MEAN);
      int back = wg_job_params_from_host(j);
      if (e == 0)
        e = back;
      if (e)
        wg_runner_warn_comm(r, "model average", e);
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
