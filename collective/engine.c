/* engine.c — the communicator of libwagma_collective: creation over a transport, destroy and
 * abort, counters, the round/group helpers every engine file uses, and wagma_comm_step, which
 * dispatches one round to the member side (group rounds, wait-avoiding global rounds), to
 * engine_global.c (barrier global rounds, catch-up) or skips ahead.
 *
 * Owns: struct wagma_comm (engine_internal.h): the plan copy, the transport, the round thread
 * (engine_thread.c), the mutex and condition variable.
 * Threads: the caller's compute thread (every wagma_comm_* call that takes a buffer), the
 * round thread, the transport's progress thread; wagma_comm_abort and _counters from any.
 *
 * The algorithm, its invariants and the exact conditions under which they hold are in
 * docs/design.md ("The engine"). In short: each group round has a fixed leader (the lowest
 * live, unsuspected rank of the group) that decides who contributed; each member has at most
 * one contribution outstanding; corrections A - C are applied exactly once and sum to zero
 * over a round's contributors; a round ends the same way for all of them.
 *
 * Invariants: every wait has a deadline; destroy interrupts the transport (every recv returns
 * WAGMA_ECLOSED), joins the round thread, closes the transport, then frees. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "engine_internal.h"
#include "wagma/log_internal.h"

#define COLL_ROUND (UINT64_MAX - 1)
#define COLL_CHUNK_MIN_FLOATS ((size_t)1 << 20) /* 4 MiB */

void wagma_comm_options_init(wagma_comm_options_t *options) {
  if (!options)
    return;
  memset(options, 0, sizeof(*options));
  options->transport = WAGMA_TRANSPORT_TCP;
}

/* ---------------------------------------------------------------- timing and groups */

int wg_engine_is_global(const wagma_comm_t *c, uint64_t round) {
  return (round + 1) % c->tau == 0;
}

int wg_engine_group_of(const wagma_comm_t *c, uint64_t round, int rank, uint32_t *group,
                       const int **ranks) {
  if (wg_engine_is_global(c, round)) {
    *group = 0;
    *ranks = c->all_ranks;
    return c->nranks;
  }
  int g = 0;
  int n = wagma_plan_group(&c->plan, round, rank, &g, ranks);
  if (n > 0)
    *group = (uint32_t)g;
  return n;
}

int wg_engine_same_group(const wagma_comm_t *c, uint64_t round, uint32_t group, int src) {
  const int *ranks = NULL;
  uint32_t mine = 0;
  int n = wg_engine_group_of(c, round, c->rank, &mine, &ranks);
  if (n <= 0 || mine != group)
    return 0;
  for (int i = 0; i < n; i++)
    if (ranks[i] == src)
      return 1;
  return 0;
}

int wg_engine_leader_of(wagma_comm_t *c, const int *ranks, int n) {
  for (int i = 0; i < n; i++) {
    int m = ranks[i];
    if (m == c->rank || (!c->suspect[m] && c->ops->peer_alive(c->tp, m)))
      return m;
  }
  return ranks[0];
}

double wg_engine_leader_timeout(const wagma_comm_t *c) {
  double t = c->factor * c->ewma_leader;
  return t > c->floor_s ? t : c->floor_s;
}

double wg_engine_member_timeout(const wagma_comm_t *c) {
  double t = c->factor * (c->ewma_member > c->ewma_leader ? c->ewma_member : c->ewma_leader);
  if (t < c->floor_s)
    t = c->floor_s;
  /* an allreduce round's data takes time with the model's size: wait for it too */
  double data = c->rounds_allreduce ? (double)(c->count * sizeof(float)) / 100e6 : 0.0;
  return 1.5 * t + 0.1 + data;
}

void wg_engine_ewma(double *avg, double sample) {
  *avg = *avg == 0.0 ? sample : 0.8 * *avg + 0.2 * sample;
}

int wg_engine_wait(wagma_comm_t *c, double deadline) {
  struct timespec ts;
  ts.tv_sec = (time_t)deadline;
  ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  if (!c->stopping)
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
  return c->stopping ? WAGMA_ECLOSED : 0;
}

/* ---------------------------------------------------------------- lifecycle */

static void comm_free(wagma_comm_t *c) {
  wg_entry_t *e = c->entries;
  while (e) {
    wg_entry_t *n = e->next;
    wg_member_entry_free(e);
    e = n;
  }
  wg_leader_free_all(c);
  wg_outbox_discard(c);
  wg_snapshot_free(&c->snap);
  free(c->global_mean);
  free(c->work);
  free(c->delta);
  free(c->suspect);
  free(c->all_ranks);
  wagma_plan_free(&c->plan);
  free(c);
}

/* Ownership: *out is the caller's (wagma_comm_destroy); nothing is left behind on error. */
int wg_comm_create_with(const wagma_comm_options_t *o, const wg_transport_ops_t *ops,
                        wagma_comm_t **out) {
  int rc = 0;
  wagma_comm_t *c = NULL;
  int mu_init = 0, cv_init = 0;
  if (!out)
    return WAGMA_EINVAL;
  *out = NULL;
  if (!o || !o->plan || !ops || o->count == 0 || o->count > (SIZE_MAX / 8) / sizeof(float))
    return WAGMA_EINVAL;
  if (wagma_plan_validate(o->plan, NULL, 0) != 0 || o->rank < 0 || o->rank >= o->plan->nranks)
    return WAGMA_EINVAL;
  if (o->round_deadline_floor_s < 0 || o->round_deadline_factor < 0 || o->global_timeout_s < 0 ||
      o->connect_timeout_s < 0)
    return WAGMA_EINVAL;
  c = calloc(1, sizeof(*c));
  if (!c)
    return WAGMA_ENOMEM;
  rc = wagma_plan_copy(&c->plan, o->plan);
  if (rc != 0) {
    free(c);
    return rc;
  }
  c->rank = o->rank;
  c->nranks = c->plan.nranks;
  c->count = o->count;
  c->epoch = c->plan.epoch;
  c->tau = c->plan.staleness_bound > 0 ? (uint64_t)c->plan.staleness_bound : 1;
  c->mode = c->plan.global_sync;
  c->floor_s = o->round_deadline_floor_s > 0 ? o->round_deadline_floor_s : 1.0;
  c->factor = o->round_deadline_factor > 0 ? o->round_deadline_factor : 8.0;
  c->global_timeout_s = o->global_timeout_s > 0 ? o->global_timeout_s : 60.0;
  c->connect_timeout_s = o->connect_timeout_s > 0 ? o->connect_timeout_s : 10.0;
  c->log = o->log;
  c->log_user = o->log_user;
  c->ops = ops;
  c->mem = &wg_memops_host;
  int rounds = o->rounds;
  const char *env = getenv("WAGMA_ENGINE_ROUNDS");
  if (rounds == WAGMA_ROUNDS_DEFAULT && env && env[0])
    rounds = strcmp(env, "allreduce") == 0 ? WAGMA_ROUNDS_ALLREDUCE
             : strcmp(env, "star") == 0    ? WAGMA_ROUNDS_STAR
                                           : -1;
  /* measured over TCP: docs/benchmarks.md "Rounds as an allreduce"; a transport with
   * collectives of its own (NCCL's group communicators) runs a whole group's round as one */
  if (rounds == WAGMA_ROUNDS_DEFAULT)
    rounds = ops->group_allreduce || o->count * sizeof(float) >= WG_ROUNDS_ALLREDUCE_MIN_BYTES
                 ? WAGMA_ROUNDS_ALLREDUCE
                 : WAGMA_ROUNDS_STAR;
  if (rounds != WAGMA_ROUNDS_STAR && rounds != WAGMA_ROUNDS_ALLREDUCE) {
    wagma_plan_free(&c->plan);
    free(c);
    return WAGMA_EINVAL;
  }
  c->rounds_allreduce = rounds == WAGMA_ROUNDS_ALLREDUCE;
  c->highest_src = -1;
  c->coll_chunk = c->count > COLL_CHUNK_MIN_FLOATS ? c->count : COLL_CHUNK_MIN_FLOATS;
  /* The epoch starts from a global mean (the agents' weighted average): the model counts as
   * containing a global mean of the round before start_round. */
  c->model_global = c->plan.start_round;
  c->mixed_round = c->plan.start_round;
  atomic_store(&c->cur_round, c->plan.start_round);
  snprintf(c->err, sizeof(c->err), "no error");
  c->global_mean = calloc(c->count, sizeof(float));
  c->suspect = calloc((size_t)c->nranks, 1);
  c->all_ranks = malloc((size_t)c->nranks * sizeof(int));
  if (c->rounds_allreduce) {
    c->work = calloc(c->count, sizeof(float));
    c->delta = calloc(c->count, sizeof(float));
  }
  if (wg_snapshot_init(&c->snap, c->count) != 0 || !c->global_mean || !c->suspect ||
      !c->all_ranks || (c->rounds_allreduce && (!c->work || !c->delta))) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  for (int i = 0; i < c->nranks; i++)
    c->all_ranks[i] = i;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (pthread_mutex_init(&c->mu, NULL) == 0)
    mu_init = 1;
  if (mu_init && pthread_cond_init(&c->cv, &ca) == 0)
    cv_init = 1;
  pthread_condattr_destroy(&ca);
  if (!cv_init) {
    rc = WAGMA_ENOMEM;
    goto out;
  }

  wg_transport_config_t cfg = {0};
  cfg.plan = &c->plan;
  cfg.rank = c->rank;
  cfg.epoch = c->epoch;
  size_t frame = c->count * sizeof(float);
  if (frame < WG_COLL_SEGMENT_BYTES)
    frame = WG_COLL_SEGMENT_BYTES; /* blocking collectives of any count move such segments */
  frame += (size_t)c->nranks * 12 + 4096;
  cfg.max_payload = frame;
  cfg.max_queued_bytes = 64 * frame + (64u << 20);
  cfg.connect_timeout_s = c->connect_timeout_s;
  cfg.auth =
      (wg_transport_auth_t){.secret = o->secret, .secret_len = o->secret_len, .seal = o->encrypt};
  cfg.device = o->device;
  cfg.cancelled = o->cancelled;
  cfg.cancel_user = o->cancel_user;
  cfg.use_listen_fd = o->use_listen_fd;
  cfg.listen_fd = o->listen_fd;
  cfg.log = c->log;
  cfg.log_user = c->log_user;
  rc = ops->open(&cfg, &c->tp);
  if (rc != 0)
    goto out;
  if (pthread_create(&c->round_thread, NULL, wg_engine_round_main, c) != 0) {
    ops->close(c->tp);
    c->tp = NULL;
    rc = WAGMA_ENOMEM;
    goto out;
  }
  c->round_thread_started = 1;
  if (c->rounds_allreduce) {
    if (pthread_create(&c->data_thread, NULL, wg_engine_data_main, c) != 0) {
      *out = c; /* the round thread runs: destroy stops it */
      wagma_comm_destroy(c);
      *out = NULL;
      return WAGMA_ENOMEM;
    }
    c->data_thread_started = 1;
  }
  *out = c;
  return 0;
out:
  if (cv_init)
    pthread_cond_destroy(&c->cv);
  if (mu_init)
    pthread_mutex_destroy(&c->mu);
  comm_free(c);
  return rc;
}

int wagma_comm_create(const wagma_comm_options_t *options, wagma_comm_t **comm) {
  if (comm)
    *comm = NULL;
  if (!options || !comm)
    return WAGMA_EINVAL;
  if (options->encrypt && (options->secret == NULL || options->transport != WAGMA_TRANSPORT_TCP)) {
    wg_logf(options->log, options->log_user, WAGMA_LOG_ERROR,
            "rank %d: data-plane encryption needs %s", options->rank,
            options->secret == NULL ? "the epoch's secret (its keys come from it)"
                                    : "the tcp transport (NCCL moves payloads unencrypted)");
    return WAGMA_EINVAL;
  }
  if (options->transport == WAGMA_TRANSPORT_NCCL) {
#ifdef WAGMA_HAVE_NCCL
    return wg_comm_create_with(options, &wg_nccl_transport, comm);
#else
    char err[160];
    int rc = wagma_comm_transport_check(options->transport, options->device, err, sizeof err);
    wg_logf(options->log, options->log_user, WAGMA_LOG_ERROR, "rank %d: %s", options->rank, err);
    return rc;
#endif
  }
  if (options->transport != WAGMA_TRANSPORT_TCP)
    return WAGMA_EINVAL;
  return wg_comm_create_with(options, &wg_tcp_transport, comm);
}

int wagma_comm_transport_check(wagma_transport_kind_t kind, int device, char *err, size_t err_len) {
  if (kind == WAGMA_TRANSPORT_TCP) {
    wg_errf(err, err_len, "ok");
    return 0;
  }
  if (kind != WAGMA_TRANSPORT_NCCL) {
    wg_errf(err, err_len, "unknown transport %d", (int)kind);
    return WAGMA_EINVAL;
  }
#ifdef WAGMA_HAVE_NCCL
  int rc = wg_nccl_device_check(device, err, err_len);
  if (rc == 0)
    wg_errf(err, err_len, "ok");
  return rc;
#else
  (void)device;
  wg_errf(err, err_len,
          "transport nccl: this build has no NCCL (built with WAGMA_WITH_CUDA=OFF, or CUDA or "
          "NCCL was not found); use the tcp transport");
  return WAGMA_ENOSYS;
#endif
}

void wagma_comm_abort(wagma_comm_t *c) {
  if (!c)
    return;
  atomic_store(&c->aborted, 1);
  pthread_mutex_lock(&c->mu);
  c->stopping = 1; /* wakes every wait on cv; the round thread ends too */
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (c->tp)
    c->ops->interrupt(c->tp); /* every recv, now and later, returns WAGMA_ECLOSED */
}

/* rc, or WAGMA_ECANCELED when the communicator was aborted and rc is an error. */
static int cancel_rc(wagma_comm_t *c, int rc) {
  return rc != 0 && atomic_load(&c->aborted) ? WAGMA_ECANCELED : rc;
}

void wagma_comm_destroy(wagma_comm_t *c) {
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  c->stopping = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (c->tp)
    c->ops->interrupt(c->tp);
  if (c->round_thread_started)
    pthread_join(c->round_thread, NULL);
  if (c->data_thread_started)
    pthread_join(c->data_thread, NULL);
  if (c->tp)
    c->ops->close(c->tp);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  comm_free(c);
}

uint64_t wagma_comm_round(const wagma_comm_t *comm) {
  if (!comm)
    return 0;
  return atomic_load(&((wagma_comm_t *)comm)->cur_round);
}

int wagma_comm_peer_alive(const wagma_comm_t *comm, int rank) {
  if (!comm || rank < 0 || rank >= comm->nranks)
    return 0;
  if (rank == comm->rank)
    return 1;
  wagma_comm_t *c = (wagma_comm_t *)comm;
  return c->ops->peer_alive(c->tp, rank) != 0;
}

int wagma_comm_peer_unreachable(const wagma_comm_t *comm, int rank, double *seconds) {
  double since = 0;
  if (!comm || rank < 0 || rank >= comm->nranks || rank == comm->rank ||
      !comm->ops->peer_unreachable || !comm->ops->peer_unreachable(comm->tp, rank, &since))
    return 0;
  if (seconds) {
    double d = wg_now() - since;
    *seconds = d > 0 ? d : 0;
  }
  return 1;
}

void wagma_comm_counters(const wagma_comm_t *comm, wagma_comm_counters_t *counters) {
  if (!counters)
    return;
  memset(counters, 0, sizeof(*counters));
  if (!comm)
    return;
  wagma_comm_t *c = (wagma_comm_t *)comm;
  pthread_mutex_lock(&c->mu);
  *counters = c->counters;
  pthread_mutex_unlock(&c->mu);
  wg_transport_stats_t ts = {0};
  c->ops->stats(c->tp, &ts);
  counters->bytes_sent = ts.bytes_sent;
  counters->bytes_received = ts.bytes_received;
  counters->frames_rejected += ts.frames_rejected;
}

const char *wagma_comm_last_error(const wagma_comm_t *comm) {
  return comm ? comm->err : "no communicator";
}

/* ---------------------------------------------------------------- the step */

/* The version to publish the model under at round r: r, or the newest global round whose mean
 * the model already includes when that is later (a member that jumped ahead). (mu) */
static uint64_t model_version(const wagma_comm_t *c, uint64_t r) {
  return c->model_global > r + 1 ? c->model_global - 1 : r;
}

int wagma_comm_step(wagma_comm_t *c, float *model, wagma_round_stats_t *stats) {
  int rc = 0;
  wagma_round_stats_t st;
  if (!c || !model)
    return WAGMA_EINVAL;
  if (atomic_load(&c->aborted))
    return WAGMA_ECANCELED;
  memset(&st, 0, sizeof(st));
  double t0 = wg_now();
  wg_transport_stats_t ts0 = {0}, ts1 = {0};
  c->ops->stats(c->tp, &ts0);
  uint64_t r = atomic_load(&c->cur_round);
  uint64_t next = r + 1;
  int global = wg_engine_is_global(c, r);
  st.round = r;
  st.kind = global ? WAGMA_ROUND_GLOBAL : WAGMA_ROUND_GROUP;
  st.activator = -1;

  pthread_mutex_lock(&c->mu);
  if (c->stopping) {
    pthread_mutex_unlock(&c->mu);
    return cancel_rc(c, WAGMA_ECLOSED);
  }
  wg_member_prune(c, r);
  /* A wait-avoiding global round G > r my round thread contributed to: skip to G + 1. Its
   * correction is applied now or at a later step. */
  uint64_t jump_to = 0;
  if (c->mode == WAGMA_GLOBAL_WAIT_AVOIDING)
    for (wg_entry_t *e = c->entries; e; e = e->next)
      if (e->global && e->round > r && e->state != WG_ENTRY_VOID)
        jump_to = e->round;
  if (jump_to && jump_to + 1 > c->model_global) {
    if (!c->jump_global) /* the oldest claim's value: what the model surely includes */
      c->model_global_before_jump = c->model_global;
    c->jump_global = jump_to + 1;
    c->model_global = jump_to + 1; /* claimed ahead of the correction: see jump_global */
  }
  uint64_t version = model_version(c, r);
  /* Behind: a peer runs more than tau rounds ahead of my model, or my model misses the last
   * global round (left out of it) while a peer is past it. */
  int have_last = r / c->tau >= 1;
  uint64_t last_global = have_last ? (r / c->tau) * c->tau - 1 : 0; /* newest global < r */
  int missed_global = c->mode == WAGMA_GLOBAL_WAIT_AVOIDING && have_last &&
                      last_global >= c->plan.start_round && c->model_global < last_global + 1 &&
                      c->highest_seen > last_global;
  wg_entry_t *mine = missed_global ? wg_member_entry(c, last_global) : NULL;
  if (mine && mine->state != WG_ENTRY_VOID)
    missed_global = 0; /* I am in that round: its correction is coming */
  int behind = !jump_to && (c->highest_seen > version + c->tau || missed_global);
  pthread_mutex_unlock(&c->mu);

  if (jump_to) {
    st.corrections_applied = wg_snapshot_publish(c, model, version, 1);
    next = jump_to + 1;
    st.kind = WAGMA_ROUND_GLOBAL;
    st.members = c->nranks;
    goto done;
  }
  if (behind && wg_global_catch_up(c, model, r, &next) == 0) {
    st.caught_up = 1;
    goto done;
  }
  if (atomic_load(&c->aborted))
    return WAGMA_ECANCELED;
  next = r + 1;
  st.corrections_applied = wg_snapshot_publish(c, model, version, 1);
  if (global && c->mode == WAGMA_GLOBAL_BARRIER)
    rc = wg_global_barrier(c, model, r, &st);
  else
    rc = wg_member_group_round(c, model, r, global, &st);
  rc = cancel_rc(c, rc);
  if (rc == WAGMA_ECLOSED || rc == WAGMA_ECANCELED)
    return rc;

done:
  pthread_mutex_lock(&c->mu);
  atomic_store(&c->cur_round, next);
  c->counters.rounds_completed++;
  st.rounds_skipped = next - r - 1;
  c->counters.rounds_skipped += st.rounds_skipped;
  st.global_age = c->model_global > 0 && next > c->model_global ? next - c->model_global : 0;
  st.alone_rounds = c->nranks > 1 && next > c->mixed_round ? next - c->mixed_round : 0;
  pthread_mutex_unlock(&c->mu);
  c->ops->stats(c->tp, &ts1);
  st.next_round = next;
  st.wait_s = wg_now() - t0;
  st.bytes_sent = ts1.bytes_sent - ts0.bytes_sent;
  st.bytes_received = ts1.bytes_received - ts0.bytes_received;
  if (stats)
    *stats = st;
  return rc;
}

int wg_comm_apply_pending(wagma_comm_t *c, float *model) {
  if (!c || !model)
    return WAGMA_EINVAL;
  int n = 0;
  pthread_mutex_lock(&c->mu);
  float *taken = wg_snapshot_take(c, &n);
  pthread_mutex_unlock(&c->mu);
  wg_snapshot_add_taken(c, model, taken); /* outside mu */
  return n;
}

int wg_comm_busy(wagma_comm_t *c) {
  int n = 0;
  pthread_mutex_lock(&c->mu);
  n += c->outstanding != NULL;
  for (wg_lround_t *lr = c->lrounds; lr; lr = lr->next)
    n++;
  for (wg_lround_t *lr = c->drounds; lr; lr = lr->next)
    n++;
  pthread_mutex_unlock(&c->mu);
  return n;
}

/* ---------------------------------------------------------------- blocking collectives */

static int public_coll(wagma_comm_t *c, enum wg_coll_op op, float *buf, size_t count,
                       wagma_reduce_op_t rop, int root, float weight) {
  if (!c || (!buf && count > 0) || count > SIZE_MAX / (2 * sizeof(float)))
    return WAGMA_EINVAL;
  if (atomic_load(&c->aborted))
    return WAGMA_ECANCELED;
  if (count == 0)
    return 0;
  if (op == WG_COLL_BROADCAST && (root < 0 || root >= c->nranks))
    return WAGMA_EINVAL;
  uint32_t group = (uint32_t)c->coll_calls++;
  size_t chunk = c->coll_chunk > 0 ? c->coll_chunk : count;
  int rc = cancel_rc(c, wg_global_coll_live(c, op, COLL_ROUND, group, buf, count, chunk, rop, root,
                                            weight, NULL, NULL));
  if (rc != 0)
    snprintf(c->err, sizeof(c->err), "blocking collective %s: %s",
             op == WG_COLL_ALLREDUCE   ? "allreduce"
             : op == WG_COLL_BROADCAST ? "broadcast"
                                       : "average",
             wagma_strerror(rc));
  return rc;
}

int wagma_comm_allreduce(wagma_comm_t *comm, float *buf, size_t count, wagma_reduce_op_t op) {
  if (op != WAGMA_REDUCE_SUM && op != WAGMA_REDUCE_MEAN)
    return WAGMA_EINVAL;
  return public_coll(comm, WG_COLL_ALLREDUCE, buf, count, op, 0, 0);
}

int wagma_comm_broadcast(wagma_comm_t *comm, float *buf, size_t count, int root) {
  return public_coll(comm, WG_COLL_BROADCAST, buf, count, WAGMA_REDUCE_SUM, root, 0);
}

int wagma_comm_average(wagma_comm_t *comm, float *buf, size_t count, float weight) {
  if (!(weight >= 0))
    return WAGMA_EINVAL;
  return public_coll(comm, WG_COLL_AVERAGE, buf, count, WAGMA_REDUCE_SUM, 0, weight);
}
