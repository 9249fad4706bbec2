/* agent/trainer/own.c — wagma-train's own averaging algorithms (docs/design.md §8), on the
 * program's side of libwagma (wagma_worker_advance and friends: libwagma keeps the epochs,
 * their opening sync, the iteration count and the reports):
 *   adpsgd     after the optimizer step an even rank averages its model with one odd rank
 *              drawn at random, an odd rank publishes its model and takes the averagings it
 *              answered meanwhile (agent/adpsgd.h); a silent peer is skipped after the round
 *              deadline;
 *   asgd       (Downpour, agent/ps.h) the first ps_shards ranks are parameter-server shards
 *   dc-asgd    that apply the workers' pushes at once (dc-asgd with delay compensation); a
 *              worker pulls the model, computes a gradient there and pushes it, no local step;
 *              the push's delay is the staleness shown; a shard's iteration follows its
 *              workers'. At the end the shards' slices are the model.
 * The endpoints listen on ephemeral ports of the agent's --listen host; their ports and fresh
 * tokens travel at each epoch's start over libwagma's allreduce (authenticated like every
 * collective of the epoch), the first collective of the epoch on every member.
 *
 * Threads: the training thread (main); the endpoints run threads of their own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "agent/trainer/trainer.h"
#include "wagma/clock_internal.h"

/* How long a worker waits, without a warning, for a shard to enter the epoch they both
 * entered (the shard leaves the epoch's opening sync a moment after it). */
#define PS_ENTRY_GRACE_S 2.0

static int is_ps(const wg_trainer_t *t) {
  return t->spec.algorithm == WAGMA_ALGO_ASGD || t->spec.algorithm == WAGMA_ALGO_DC_ASGD;
}

int wg_own_algorithm(const wg_trainer_t *t) {
  return is_ps(t) || t->spec.algorithm == WAGMA_ALGO_ADPSGD;
}

static void log_line(void *user, int level, const char *msg) {
  (void)user;
  wg_trainer_log(level, "%s", msg);
}

int wg_own_setup(wg_trainer_t *t, char *why, size_t len) {
  const char *host = t->o.listen_host[0] ? t->o.listen_host : NULL;
  size_t n = t->host.nparams;
  int e;
  if (t->spec.algorithm == WAGMA_ALGO_ADPSGD) {
    if ((e = wg_adpsgd_open(host, n, log_line, NULL, &t->gossip))) {
      snprintf(why, len, "adpsgd: cannot listen on %s: %s", host ? host : "any address",
               wagma_strerror(e));
      return WAGMA_EUNAVAIL;
    }
    wagma_rng_seed(&t->gossip_rng, wagma_seed_derive(t->spec.seed ^ 0xad95u, t->cfg.agent));
  } else if (is_ps(t)) {
    double lambda = t->spec.algorithm == WAGMA_ALGO_DC_ASGD ? t->spec.dc_lambda : 0.0;
    if ((e = wg_ps_open(host, n, wagma_optim_config(t->optim), lambda, log_line, NULL, &t->ps))) {
      snprintf(why, len, "%s: cannot listen on %s: %s", wagma_algorithm_name(t->spec.algorithm),
               host ? host : "any address", wagma_strerror(e));
      return WAGMA_EUNAVAIL;
    }
    wg_ps_set_adaptive(t->ps, t->spec.algorithm == WAGMA_ALGO_DC_ASGD && t->spec.dc_adaptive);
  }
  return 0;
}

void wg_own_teardown(wg_trainer_t *t) {
  wg_adpsgd_close(t->gossip);
  t->gossip = NULL;
  wg_ps_close(t->ps);
  t->ps = NULL;
}

/* A failed exchange with a peer, at most every 2 s. */
static void warn(wg_trainer_t *t, const char *what, int e, const char *detail) {
  if (wg_mono() - t->last_warn < 2.0)
    return;
  t->last_warn = wg_mono();
  wg_trainer_log(WAGMA_LOG_WARN, "job %s epoch %llu: %s: %s (%s)", t->cfg.job,
                 (unsigned long long)t->epoch, what, wagma_strerror(e), detail);
}

void wg_own_note_staleness(wg_trainer_t *t, uint64_t staleness) {
  double now = wg_mono();
  if (now - t->window_start >= 1.0) {
    t->staleness_shown = t->staleness_max;
    t->staleness_max = 0;
    t->window_start = now;
  }
  if (staleness > t->staleness_max)
    t->staleness_max = staleness;
}

/* ---- epochs ------------------------------------------------------------------------------ */

void wg_trainer_host_of(const char *address, char *out, size_t len) {
  const char *colon = strrchr(address, ':');
  size_t n = colon ? (size_t)(colon - address) : strlen(address);
  if (n >= 2 && address[0] == '[' && address[n - 1] == ']') {
    address++;
    n -= 2;
  }
  snprintf(out, len, "%.*s", (int)n, address);
}

/* Every member's endpoint port and a fresh token, over libwagma's allreduce. Ownership:
 * *peers (size entries) is the caller's (free); after a failed exchange every port is 0 (no
 * peer reachable this epoch). */
static int exchange_endpoints(wg_trainer_t *t, uint16_t my_port, uint64_t *token,
                              wg_adpsgd_peer_t **peers) {
  int n = t->size, e;
  *token = 0;
  if (RAND_bytes((unsigned char *)token, sizeof *token) != 1)
    *token = wagma_rng_next(&t->gossip_rng) ^ wagma_mix64((uint64_t)(wg_mono() * 1e9));
  float *buf = calloc((size_t)n * WG_ADPSGD_EXCHANGE_FLOATS, sizeof(float));
  *peers = calloc((size_t)n, sizeof **peers);
  if (!buf || !*peers) {
    free(buf);
    free(*peers);
    *peers = NULL;
    return WAGMA_ENOMEM;
  }
  wg_adpsgd_exchange_encode(buf, t->rank, my_port, *token);
  e = wagma_worker_allreduce(t->w, buf, (size_t)n * WG_ADPSGD_EXCHANGE_FLOATS, WAGMA_WORKER_SUM);
  if (e) {
    warn(t, "endpoint exchange", e, wagma_worker_last_error(t->w));
    memset(buf, 0, (size_t)n * WG_ADPSGD_EXCHANGE_FLOATS * sizeof(float)); /* no peer known */
  }
  for (int i = 0; i < n; i++) {
    char address[320] = "";
    wagma_worker_member_address(t->w, i, address, sizeof address);
    wg_trainer_host_of(address, (*peers)[i].host, sizeof(*peers)[i].host);
    wg_adpsgd_exchange_decode(buf, i, &(*peers)[i].port, &(*peers)[i].token);
  }
  free(buf);
  return e;
}

void wg_own_enter_epoch(wg_trainer_t *t) {
  wg_adpsgd_peer_t *peers = NULL;
  wagma_worker_status_t st;
  uint64_t token;
  int e = 0;
  double deadline = t->o.round_deadline > 0 ? t->o.round_deadline : 1.0;
  if (!t->gossip && !t->ps)
    return;
  exchange_endpoints(t, t->gossip ? wg_adpsgd_port(t->gossip) : wg_ps_port(t->ps), &token, &peers);
  if (!peers) {
    e = WAGMA_ENOMEM;
    goto out;
  }
  float *host = wg_model_host_params(&t->host, &e);
  if (!host)
    goto out;
  if (t->gossip) {
    /* averagings answered in the last epoch (after its last step) still belong to this model:
     * take them before the endpoint forgets them */
    if (wg_adpsgd_publish(t->gossip, host) > 0 && (e = wg_model_host_params_back(&t->host)))
      goto out;
    e = wg_adpsgd_set_epoch(t->gossip, t->epoch, t->rank, t->size, peers, token, deadline,
                            deadline * 5 > 2 ? deadline * 5 : 2, host);
  } else {
    t->ps_shards = wg_ps_shards(t->spec.ps_shards, t->size);
    t->ps_done_sent = 0;
    e = wg_ps_set_epoch(t->ps, t->epoch, t->rank, t->size, t->ps_shards, peers, token,
                        deadline > 1 ? deadline : 1, host);
    wagma_worker_status(t->w, &st);
    if (e == 0 && t->rank >= t->ps_shards && st.iteration >= t->total) {
      wg_ps_done(t->ps); /* done already: the shards must not wait for this worker */
      t->ps_done_sent = 1;
    }
  }
out:
  if (e)
    wg_trainer_log(WAGMA_LOG_WARN, "job %s epoch %llu: %s endpoint not set up: %s", t->cfg.job,
                   (unsigned long long)t->epoch, wagma_algorithm_name(t->spec.algorithm),
                   wagma_strerror(e));
  free(peers);
}

/* ---- iterations -------------------------------------------------------------------------- */

void wg_own_gossip(wg_trainer_t *t, float *model) {
  if (t->rank < 0)
    return;
  if (wg_adpsgd_rank_active(t->rank))
    wg_adpsgd_average(t->gossip, model, &t->gossip_rng, NULL); /* skipped: model unchanged */
  else
    wg_adpsgd_publish(t->gossip, model);
}

/* libwagma's boundary with `count` iterations more, around the registered parameters (the
 * opening sync of a new epoch reads and writes them). */
static int advance(wg_trainer_t *t, uint64_t count) {
  int e;
  if (!wg_model_host_params(&t->host, &e))
    return e;
  e = wagma_worker_advance(t->w, count);
  int back = wg_model_host_params_back(&t->host);
  return e ? e : back;
}

/* A shard: the pushes arrive on the endpoint's threads; this thread reports. Its iteration
 * follows the workers' (the largest pushed) and reaches the job's end once every worker of
 * the epoch said it is done. */
static int shard_iteration(wg_trainer_t *t) {
  wagma_worker_status_t st;
  wg_ps_shard_stats_t ps;
  int e;
  wg_sleep_s(0.002);
  wg_ps_shard_stats(t->ps, &ps);
  wg_own_note_staleness(t, ps.max_delay);
  t->ps_pushed = ps.pushes;
  if (isfinite(ps.loss))
    t->loss_ema = ps.loss;
  wagma_worker_status(t->w, &st);
  uint64_t cur = st.iteration;
  uint64_t it = ps.max_iteration > cur ? ps.max_iteration : cur;
  if (ps.workers_done >= t->size - t->ps_shards)
    it = it > t->total ? it : t->total;
  else if (t->total && it >= t->total)
    it = t->total - 1; /* a worker is still at it */
  /* an evaluation at this crossing reads t->model: make it the model the shards hold now
   * (pulled like a worker; this shard's slice from itself) */
  uint64_t every = t->spec.eval_every;
  if (every && it / every != cur / every) {
    float *host = wg_model_host_params(&t->host, &e);
    if (host && wg_ps_pull(t->ps, host) == 0)
      wg_model_host_params_back(&t->host);
  }
  if ((e = advance(t, it > cur ? it - cur : 0)))
    return e;
  wg_trainer_after_step(t, cur);
  return 0;
}

/* A worker: pull, the gradient at the pulled model, push (the gradient of d steps ago with a
 * gradient_delay). A shard that does not answer costs at most its deadline and the step does
 * not count; the epoch change that follows its death reassigns the shard. */
static int worker_iteration(wg_trainer_t *t) {
  wagma_worker_status_t st;
  wagma_eval_t ev;
  int e;
  double t0 = wg_mono();
  wagma_worker_status(t->w, &st);
  uint64_t cur = st.iteration;
  float *host = wg_model_host_params(&t->host, &e);
  if (!host)
    return e;
  int pulled = wg_ps_pull(t->ps, host);
  if ((e = wg_model_host_params_back(&t->host)))
    return e;
  if ((e = wagma_batch_draw(&t->batch, &t->sampler, &t->train, (size_t)t->spec.batch_size)) ||
      (e = wagma_model_forward(t->model, t->batch.x, t->batch.y, t->batch.n, &ev)) ||
      (e = wagma_model_backward(t->model)))
    return e;
  wg_trainer_straggle(t, wg_mono() - t0);
  const float *g = wg_model_host_grads(&t->host, &e);
  if (!g)
    return e;
  if (t->delay)
    g = wagma_grad_delay_push(t->delay, g); /* NULL during the first d steps: nothing pushed */
  uint64_t delay = 0;
  int e2 = pulled ? pulled : g ? wg_ps_push(t->ps, g, cur, ev.n ? ev.loss : NAN, &delay) : 0;
  if (e2) {
    /* the step trained nothing and does not count: wait a little (a dead shard refuses at
     * once) and try again, until the plan that follows its death reassigns the shard; a shard
     * that has not entered the epoch yet is no fault for a while */
    if (e2 != WAGMA_EBUSY || wg_mono() - t->entered_at > PS_ENTRY_GRACE_S)
      warn(t, "parameter-server pull or push", e2, wg_ps_last_error(t->ps));
    wg_sleep_s(0.02);
    if ((e = advance(t, 0)) == 0)
      wg_trainer_after_step(t, cur); /* a newer plan (the shard's death) is followed there */
    return e;
  }
  wg_own_note_staleness(t, delay);
  if (g)
    t->ps_pushed++;
  if (ev.n && isfinite(ev.loss))
    t->loss_ema = isfinite(t->loss_ema) ? 0.95 * t->loss_ema + 0.05 * ev.loss : ev.loss;
  uint64_t epoch = t->epoch;
  if ((e = advance(t, 1)))
    return e;
  wagma_worker_status(t->w, &st);
  if (st.epoch == epoch && st.iteration >= t->total && !t->ps_done_sent) {
    wg_ps_done(t->ps);
    t->ps_done_sent = 1;
  }
  wg_trainer_after_step(t, cur);
  return 0;
}

int wg_own_ps_iteration(wg_trainer_t *t) {
  return t->rank < t->ps_shards ? shard_iteration(t) : worker_iteration(t);
}

/* ---- reports and the end ----------------------------------------------------------------- */

void wg_own_report(wg_trainer_t *t) {
  wagma_worker_algorithm_stats_t s = {0};
  if (t->gossip) {
    wg_adpsgd_counters_t gc;
    wg_adpsgd_counters(t->gossip, &gc);
    s.role = t->rank < 0 ? NULL : wg_adpsgd_rank_active(t->rank) ? "active" : "passive";
    s.averaged = gc.averaged;
    s.served = gc.served;
    s.skipped = gc.skipped;
  } else if (t->ps) {
    int shard = t->rank >= 0 && t->rank < t->ps_shards;
    s.role = shard ? "server" : "worker";
    if (shard)
      s.served = t->ps_pushed; /* the pushes this shard applied */
    else
      s.averaged = t->ps_pushed; /* the pushes of this worker its shards applied */
  }
  wg_own_note_staleness(t, 0);
  s.staleness = t->staleness_shown > t->staleness_max ? t->staleness_shown : t->staleness_max;
  wagma_worker_report_algorithm(t->w, &s);
}

/* The parameter server's final model: one SUM allreduce of [shards' slices | workers' models |
 * a flag per shard | workers]: each slice is its shard's, or, when the shard died during the
 * call (the collective then runs on the survivors), the workers' mean of their latest pulls. */
static int ps_final(wg_trainer_t *t, float *params) {
  size_t n = t->host.nparams, S = (size_t)t->ps_shards, len = 2 * n + S + 1;
  float *buf = calloc(len, sizeof(float));
  if (!buf)
    return WAGMA_ENOMEM;
  if (t->rank < t->ps_shards) {
    wg_ps_shard_slice(t->ps, buf);
    buf[2 * n + (size_t)t->rank] = 1.0f;
  } else {
    memcpy(buf + n, params, n * sizeof(float));
    buf[2 * n + S] = 1.0f;
  }
  int e = wagma_worker_allreduce(t->w, buf, len, WAGMA_WORKER_SUM);
  if (e == 0) {
    float workers = buf[2 * n + S];
    for (int k = 0; k < t->ps_shards; k++) {
      size_t first, slen;
      wg_ps_slice(n, t->ps_shards, k, &first, &slen);
      int have = buf[2 * n + (size_t)k] > 0.5f;
      for (size_t i = first; i < first + slen; i++)
        params[i] = have ? buf[i] : workers > 0 ? buf[n + i] / workers : params[i];
    }
  }
  free(buf);
  return e;
}

int wg_own_final_model(wg_trainer_t *t) {
  int e;
  if (!t->ps || t->ps_shards == 0) {
    if (!wg_model_host_params(&t->host, &e))
      return e;
    e = wagma_worker_final_average(t->w);
    return e ? e : wg_model_host_params_back(&t->host);
  }
  for (int attempt = 0; attempt < 3; attempt++) {
    float *params = wg_model_host_params(&t->host, &e);
    if (!params)
      return e;
    e = ps_final(t, params);
    if (e == 0)
      return wg_model_host_params_back(&t->host);
    if (e != WAGMA_ECANCELED)
      return e;
    if ((e = advance(t, 0))) /* a newer plan: the final model among its members */
      return e;
    wg_trainer_after_step(t, t->total);
  }
  return WAGMA_ECANCELED;
}
