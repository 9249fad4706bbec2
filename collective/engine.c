/* engine.c — the communicator of libwagma_collective: the wait-avoiding group allreduce of
 * ARCHITECTURE.md §5 on one fused float32 buffer, and blocking collectives on live members.
 *
 * Owns: the plan copy, the transport, the round thread (engine_round.c), the double-buffered
 * snapshot, my pending contributions ("entries"), the rounds I lead, the latest global mean.
 *
 * Threads:
 *  - the caller's compute thread: every wagma_comm_* call that takes a buffer;
 *  - the transport's progress thread (tcp.c): sockets -> mailbox;
 *  - the engine's round thread: answers ACTIVATE with the latest snapshot at once, leads
 *    rounds, turns RESULT frames into corrections, answers CATCHUP_REQ.
 *
 * A group round (epoch e, round r, group g) has a fixed leader: the lowest rank of the group
 * that is alive and not suspected (a rank is suspected when it missed a deadline, until any
 * frame from it arrives). A member arriving at r sends CONTRIB (its snapshot, version r) to the
 * leader, or opens the round if it is the leader. The leader, when the round opens, sends
 * ACTIVATE to the other members; their round threads answer at once with their latest
 * snapshot (version v <= r). The leader waits until every expected member contributed or the
 * deadline max(floor, factor x measured round latency), takes the mean A over contributors and
 * sends RESULT (A, contributors, versions) to each contributor. Each contributor turns the
 * contribution C it kept into the correction A - C; the compute thread applies every
 * correction exactly once, in round order, at its next step. An on-time member waits for its
 * own round's result (bounded), so W <- A. A member whose round thread already contributed to
 * round r does not contribute again when its compute reaches r; it moves on. Contributions that
 * arrive after the round finished get RESULT|EXCLUDED: no correction. Because each round's
 * corrections sum to zero over its contributors, the sum of all models is conserved.
 *
 * Snapshot rule: when a result comes back and the snapshot I contributed is still my latest,
 * the snapshot becomes A (version = that round), so a slow member that is activated again
 * contributes the averaged model, and a persistent straggler's contributions stay within tau.
 *
 * Global rounds ((r+1) mod tau == 0):
 *  - barrier: my earlier rounds are resolved first (bounded wait), then W <- mean over the
 *    live ranks with wg_coll_allreduce (deadline global_timeout_s; retried on a smaller live
 *    set when a peer dies; each live set has its own seq space so attempts never mix).
 *  - wait-avoiding: a group round over all members (leader: lowest live rank). A member whose
 *    round thread contributed to a global round G > r skips to G + 1 at its next step
 *    (rounds_skipped), after applying its corrections.
 * Catch-up (§5.2): when a frame of a round beyond r + tau was seen, the member asks the peer
 * that sent it (CATCHUP_REQ) for the latest global mean M of round G and that peer's current
 * round R. It adopts W <- M exactly (its local progress since its last global round is dropped,
 * and so are corrections of rounds before the new round), publishes M as version G and jumps
 * to max(G + 1, R). This is the one place the sum of models is not conserved.
 *
 * Blocking collectives (wagma_comm_allreduce/_broadcast/_average) take any count: the buffer
 * moves in chunks of max(count option, COLL_CHUNK_MIN_FLOATS) floats, one coll operation each,
 * so no frame exceeds the transport's max_payload and no outbound queue its bound. Chunk k
 * uses COLL frames with round UINT64_MAX - 1 - k and group = call counter; barrier global
 * rounds use round = the round and group UINT32_MAX; group rounds use no COLL frames. So none
 * of them mix. A live set is one attempt: when a participant dies mid-way (EPEER, directly or
 * by a failure notice, coll.h), the whole buffer is restored and every chunk runs again on the
 * smaller set, so all chunks are reduced over the same members.
 *
 * Abort: wagma_comm_abort (any thread) sets `aborted`, wakes the waits on cv and interrupts
 * the transport, so whatever the compute thread is blocked in returns at once; every public
 * call then reports WAGMA_ECANCELED. Destroy stays the owner's.
 *
 * Invariants: every wait has a deadline; wagma_comm_destroy interrupts the transport (every
 * recv returns WAGMA_ECLOSED), joins the round thread, closes the transport, then frees. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "engine_internal.h"
#include "wagma/log_internal.h"

#define COLL_ROUND (UINT64_MAX - 1)
#define BARRIER_GROUP UINT32_MAX
#define COLL_CHUNK_MIN_FLOATS ((size_t)1 << 20) /* 4 MiB */

static void set_err(wagma_comm_t *c, const char *fmt, const char *what, int rc) {
  snprintf(c->err, sizeof(c->err), fmt, what, wagma_strerror(rc));
}

void wagma_comm_options_init(wagma_comm_options_t *options) {
  if (!options)
    return;
  memset(options, 0, sizeof(*options));
  options->transport = WAGMA_TRANSPORT_TCP;
}

static void abs_timespec(double t_mono, struct timespec *ts) {
  ts->tv_sec = (time_t)t_mono;
  ts->tv_nsec = (long)((t_mono - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static void comm_free(wagma_comm_t *c) {
  wg_entry_t *e = c->entries;
  while (e) {
    wg_entry_t *n = e->next;
    wg_engine_entry_free(e);
    e = n;
  }
  wg_lround_t *lr = c->lrounds;
  while (lr) {
    wg_lround_t *n = lr->next;
    free(lr->contributed);
    free(lr->expected);
    free(lr->versions);
    free(lr->sum);
    free(lr);
    lr = n;
  }
  free(c->snap[0]);
  free(c->snap[1]);
  free(c->global_mean);
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
  int mu_init = 0, snap_init = 0, cv_init = 0;
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
  c->highest_src = -1;
  c->coll_chunk = c->count > COLL_CHUNK_MIN_FLOATS ? c->count : COLL_CHUNK_MIN_FLOATS;
  atomic_store(&c->cur_round, c->plan.start_round);
  snprintf(c->err, sizeof(c->err), "no error");
  c->snap[0] = calloc(c->count, sizeof(float));
  c->snap[1] = calloc(c->count, sizeof(float));
  c->global_mean = calloc(c->count, sizeof(float));
  c->suspect = calloc((size_t)c->nranks, 1);
  c->all_ranks = malloc((size_t)c->nranks * sizeof(int));
  if (!c->snap[0] || !c->snap[1] || !c->global_mean || !c->suspect || !c->all_ranks) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  for (int i = 0; i < c->nranks; i++)
    c->all_ranks[i] = i;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (pthread_mutex_init(&c->mu, NULL) != 0)
    goto nomem;
  mu_init = 1;
  if (pthread_mutex_init(&c->snap_mu, NULL) != 0)
    goto nomem;
  snap_init = 1;
  if (pthread_cond_init(&c->cv, &ca) != 0)
    goto nomem;
  cv_init = 1;
  pthread_condattr_destroy(&ca);

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
  *out = c;
  return 0;
nomem:
  pthread_condattr_destroy(&ca);
  rc = WAGMA_ENOMEM;
out:
  if (cv_init)
    pthread_cond_destroy(&c->cv);
  if (snap_init)
    pthread_mutex_destroy(&c->snap_mu);
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
  if (options->transport == WAGMA_TRANSPORT_NCCL)
    return WAGMA_ENOSYS;
  if (options->transport != WAGMA_TRANSPORT_TCP)
    return WAGMA_EINVAL;
  return wg_comm_create_with(options, &wg_tcp_transport, comm);
}

void wagma_comm_abort(wagma_comm_t *c) {
  if (!c)
    return;
  atomic_store(&c->aborted, 1);
  pthread_mutex_lock(&c->mu);
  c->stopping = 1; /* wakes wait_entry; the round thread ends too */
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
  if (c->tp)
    c->ops->close(c->tp);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->snap_mu);
  pthread_mutex_destroy(&c->mu);
  comm_free(c);
}

uint64_t wagma_comm_round(const wagma_comm_t *comm) {
  if (!comm)
    return 0;
  return atomic_load(&((wagma_comm_t *)comm)->cur_round);
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

/* ---------------------------------------------------------------- snapshot */

/* Publishes model as the snapshot of version. Compute thread only; writes the back buffer
 * outside the lock (readers only read the front under snap_mu) and swaps. */
static void publish(wagma_comm_t *c, const float *model, uint64_t version) {
  pthread_mutex_lock(&c->snap_mu);
  c->snap_publishing = 1;
  int back = 1 - c->snap_front;
  pthread_mutex_unlock(&c->snap_mu);
  memcpy(c->snap[back], model, c->count * sizeof(float));
  pthread_mutex_lock(&c->snap_mu);
  c->snap_front = back;
  c->snap_version = version;
  c->snap_seq++;
  c->snap_have = 1;
  c->snap_publishing = 0;
  pthread_mutex_unlock(&c->snap_mu);
}

/* The version to publish the model under at round r: r, or the newest global round whose mean
 * the model already includes when that is later (a member that jumped or applied a global
 * correction ahead of its compute). Staleness is measured against it. (mu) */
static uint64_t model_version(const wagma_comm_t *c, uint64_t r) {
  return c->model_global > r + 1 ? c->model_global - 1 : r;
}

/* ---------------------------------------------------------------- corrections */

/* Adds a resolved entry's correction (A - C) to model and marks the entry applied. (mu) */
static void apply_correction(const wagma_comm_t *c, wg_entry_t *e, float *model) {
  for (size_t i = 0; i < c->count; i++)
    model[i] += e->delta[i];
  free(e->delta);
  e->delta = NULL;
  e->state = WG_ENTRY_APPLIED;
}

/* Applies every resolved correction in round order; drops expired waits; frees entries of
 * rounds the compute thread has passed. Returns the corrections applied. (mu) */
static int apply_resolved(wagma_comm_t *c, float *model, uint64_t cur, double now) {
  int applied = 0;
  double expiry = 4.0 * wg_engine_member_timeout(c) + 1.0;
  wg_entry_t **p = &c->entries;
  while (*p) {
    wg_entry_t *e = *p;
    if (e->state == WG_ENTRY_WAITING && now - e->created > expiry) {
      e->state = WG_ENTRY_DROPPED; /* leader gone: no correction will come */
      free(e->delta);
      e->delta = NULL;
      c->counters.rounds_left_out++;
    }
    if (e->state == WG_ENTRY_RESOLVED) {
      apply_correction(c, e, model);
      applied++;
      if (e->global && e->round + 1 > c->model_global)
        c->model_global = e->round + 1;
    }
    if ((e->state == WG_ENTRY_APPLIED || e->state == WG_ENTRY_DROPPED) && e->round < cur) {
      *p = e->next;
      wg_engine_entry_free(e);
      continue;
    }
    p = &e->next;
  }
  c->counters.corrections_applied += (uint64_t)applied;
  return applied;
}

static void stats_from_entry(const wagma_comm_t *c, const wg_entry_t *e, wagma_round_stats_t *st) {
  st->activator = e->activator;
  st->members = e->members;
  st->contributors = e->ncontrib;
  st->left_out = e->members - e->ncontrib;
  st->ncontrib =
      e->ncontrib < WAGMA_STATS_MAX_CONTRIBUTORS ? e->ncontrib : WAGMA_STATS_MAX_CONTRIBUTORS;
  st->max_staleness = 0;
  for (int i = 0; i < e->ncontrib; i++) {
    uint64_t s = wg_engine_staleness(e->round, e->versions[i]);
    if (i < st->ncontrib) {
      st->contributor_rank[i] = e->ranks[i];
      st->contributor_staleness[i] = s;
    }
    if (s > st->max_staleness)
      st->max_staleness = s;
  }
  (void)c;
}

/* Waits (mu held) until e leaves WAITING, the deadline, or stop. Returns 0 or ETIMEDOUT. */
static int wait_entry(wagma_comm_t *c, wg_entry_t *e, double deadline) {
  struct timespec ts;
  abs_timespec(deadline, &ts);
  while (e->state == WG_ENTRY_WAITING && !c->stopping) {
    if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT)
      return e->state == WG_ENTRY_WAITING ? WAGMA_ETIMEDOUT : 0;
  }
  return c->stopping ? WAGMA_ECLOSED : 0;
}

/* ---------------------------------------------------------------- rounds */

/* Group round r (or wait-avoiding global round) for the compute thread. model was just
 * published as version r. */
static int group_round(wagma_comm_t *c, float *model, uint64_t r, int global,
                       wagma_round_stats_t *st) {
  int rc = 0;
  pthread_mutex_lock(&c->mu);
  const int *ranks = NULL;
  uint32_t g = 0;
  int n = wg_engine_group_of(c, r, c->rank, &g, &ranks);
  st->group = global ? 0 : (int)g;
  st->members = n > 0 ? n : 0;
  wg_entry_t *e = wg_engine_entry_find(c, r);
  if (e && e->state == WG_ENTRY_WAITING && e->version >= r)
    goto wait; /* my round thread contributed this very snapshot: I am on time, wait */
  if (e) {
    /* My round thread contributed an older snapshot to r: take the correction if it is in,
     * else it comes with a later step. */
    if (e->state == WG_ENTRY_RESOLVED || e->state == WG_ENTRY_APPLIED)
      stats_from_entry(c, e, st);
    if (e->state == WG_ENTRY_RESOLVED) {
      apply_correction(c, e, model);
      st->corrections_applied++;
      c->counters.corrections_applied++;
    }
    goto out;
  }
  if (n <= 1) {
    st->contributors = 1;
    st->ncontrib = 1;
    st->contributor_rank[0] = c->rank;
    st->activator = c->rank;
    goto out;
  }
  for (int attempt = 0; attempt < n; attempt++) {
    wg_lround_t *lr = wg_engine_lround_find(c, r);
    int leader = lr ? c->rank : wg_engine_leader_of(c, ranks, n);
    e = wg_engine_entry_from_snapshot(c, r, g, global, leader);
    if (!e) {
      rc = WAGMA_ENOMEM;
      goto out;
    }
    if (leader == c->rank) {
      if (!lr && wg_engine_finished(c, r)) {
        e->state = WG_ENTRY_DROPPED;
        c->counters.rounds_left_out++;
        break;
      }
      if (!lr)
        lr = wg_engine_lround_start(c, r, g, global, c->rank);
      if (!lr) {
        e->state = WG_ENTRY_DROPPED;
        rc = WAGMA_ENOMEM;
        goto out;
      }
      wg_engine_lround_add(c, lr, c->rank, e->version, e->delta);
      break;
    }
    if (wg_engine_send_contrib(c, leader, r, g, e) == 0)
      break;
    /* Leader unreachable: suspect it and try the next one. */
    c->suspect[leader] = 1;
    for (wg_entry_t **p = &c->entries; *p; p = &(*p)->next)
      if (*p == e) {
        *p = e->next;
        break;
      }
    wg_engine_entry_free(e);
    e = NULL;
  }
  if (!e)
    goto out;
wait:;
  double t0 = e->created;
  int wrc = wait_entry(c, e, t0 + wg_engine_member_timeout(c));
  if (wrc == WAGMA_ECLOSED) {
    rc = wrc;
    goto out;
  }
  if (e->state == WG_ENTRY_RESOLVED) {
    double lat = wg_now() - t0;
    c->ewma_member = c->ewma_member == 0.0 ? lat : 0.8 * c->ewma_member + 0.2 * lat;
    stats_from_entry(c, e, st);
    apply_correction(c, e, model);
    st->corrections_applied++;
    c->counters.corrections_applied++;
  } else if (e->state == WG_ENTRY_DROPPED) {
    st->left_out = st->members;
  } else if (e->leader != c->rank) {
    c->suspect[e->leader] = 1; /* no result in time: choose another leader next time */
    wg_logf(c->log, c->log_user, WAGMA_LOG_WARN,
            "engine: rank %d: no result for round %llu from leader %d in time", c->rank,
            (unsigned long long)r, e->leader);
  }
out:
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static uint64_t ranks_hash40(const int *ranks, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    h ^= (uint64_t)(uint32_t)ranks[i] + 1;
    h *= 1099511628211ull;
  }
  return h & ((1ull << 40) - 1);
}

enum coll_op { COLL_ALLREDUCE, COLL_BROADCAST, COLL_AVERAGE };

/* Runs a blocking collective over the live ranks, in chunks of at most chunk floats (chunk k
 * uses round - k); when a participant dies mid-way it restores buf and runs every chunk again
 * on the smaller live set (each set has its own seq space). Ranks a failure notice names are
 * left out of the next attempt even before my transport sees them dead. */
static int coll_live(wagma_comm_t *c, enum coll_op op, uint64_t round, uint32_t group, float *buf,
                     size_t count, size_t chunk, wagma_reduce_op_t rop, int root, float weight,
                     int *live_out, int *nlive_out) {
  int rc = 0;
  int *live = malloc((size_t)c->nranks * sizeof(int));
  uint8_t *excluded = calloc((size_t)c->nranks, 1);
  float *saved = malloc(count * sizeof(float));
  uint64_t prev = UINT64_MAX;
  double deadline = wg_now() + c->global_timeout_s;
  if (!live || !excluded || !saved) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  memcpy(saved, buf, count * sizeof(float));
  for (;;) {
    int n = 0;
    for (int i = 0; i < c->nranks; i++)
      if (i == c->rank || (!excluded[i] && c->ops->peer_alive(c->tp, i)))
        live[n++] = i;
    uint64_t h = ranks_hash40(live, n);
    if (h == prev)
      break; /* same set failed already */
    prev = h;
    if (op == COLL_BROADCAST) {
      int found = 0;
      for (int i = 0; i < n; i++)
        found |= live[i] == root;
      if (!found) {
        rc = WAGMA_EPEER;
        break;
      }
    }
    int failed = -1;
    wg_coll_ctx_t ctx = {0};
    ctx.ops = c->ops;
    ctx.transport = c->tp;
    ctx.rank = c->rank;
    ctx.ranks = live;
    ctx.nranks = n;
    ctx.group = group;
    ctx.seq = h << 20;
    ctx.failed_rank = &failed;
    memcpy(buf, saved, count * sizeof(float));
    rc = 0;
    for (size_t off = 0, k = 0; off < count && rc == 0; off += chunk, k++) {
      size_t len = count - off < chunk ? count - off : chunk;
      ctx.round = round - k;
      switch (op) {
      case COLL_ALLREDUCE: rc = wg_coll_allreduce(&ctx, buf + off, len, rop, deadline); break;
      case COLL_BROADCAST: rc = wg_coll_broadcast(&ctx, buf + off, len, root, deadline); break;
      case COLL_AVERAGE: rc = wg_coll_average(&ctx, buf + off, len, weight, deadline); break;
      }
    }
    if (live_out && nlive_out) {
      memcpy(live_out, live, (size_t)n * sizeof(int));
      *nlive_out = n;
    }
    if (rc != WAGMA_EPEER)
      break;
    if (failed >= 0 && failed < c->nranks && failed != c->rank)
      excluded[failed] = 1;
    wg_logf(c->log, c->log_user, WAGMA_LOG_INFO,
            "engine: rank %d: collective over %d ranks failed (rank %d dead), retrying", c->rank, n,
            failed);
  }
  if (rc != 0)
    memcpy(buf, saved, count * sizeof(float));
out:
  free(live);
  free(excluded);
  free(saved);
  return rc;
}

static int barrier_global(wagma_comm_t *c, float *model, uint64_t g, wagma_round_stats_t *st) {
  int rc = 0;
  /* My earlier rounds first: wait (bounded) for their results, then apply them. */
  pthread_mutex_lock(&c->mu);
  double deadline = wg_now() + wg_engine_member_timeout(c);
  for (wg_entry_t *e = c->entries; e; e = e->next) {
    if (e->round < g && e->state == WG_ENTRY_WAITING &&
        wait_entry(c, e, deadline) == WAGMA_ECLOSED) {
      pthread_mutex_unlock(&c->mu);
      return WAGMA_ECLOSED;
    }
  }
  st->corrections_applied += apply_resolved(c, model, g, wg_now());
  pthread_mutex_unlock(&c->mu);

  int live[c->nranks];
  int nlive = 0;
  st->members = c->nranks;
  rc = coll_live(c, COLL_ALLREDUCE, g, BARRIER_GROUP, model, c->count, c->count, WAGMA_REDUCE_MEAN,
                 0, 0, live, &nlive);
  if (rc != 0) {
    set_err(c, "barrier global round: %s: %s", "allreduce", rc);
    return rc;
  }
  st->contributors = nlive;
  st->left_out = c->nranks - nlive;
  st->ncontrib = nlive < WAGMA_STATS_MAX_CONTRIBUTORS ? nlive : WAGMA_STATS_MAX_CONTRIBUTORS;
  for (int i = 0; i < st->ncontrib; i++) {
    st->contributor_rank[i] = live[i];
    st->contributor_staleness[i] = 0;
  }
  pthread_mutex_lock(&c->mu);
  memcpy(c->global_mean, model, c->count * sizeof(float));
  c->global_round = g;
  c->have_global = 1;
  c->model_global = g + 1;
  pthread_mutex_unlock(&c->mu);
  publish(c, model, g);
  return 0;
}

/* §5.2: adopt the latest global mean from a peer and jump. Returns 0 and *next, or an error
 * (the step then runs its round normally). */
static int catch_up(wagma_comm_t *c, float *model, uint64_t r, uint64_t *next) {
  int rc = 0;
  wg_message_t *m = NULL;
  pthread_mutex_lock(&c->mu);
  int peer = c->highest_src;
  if (peer < 0 || peer == c->rank || !c->ops->peer_alive(c->tp, peer)) {
    peer = -1;
    for (int i = 0; i < c->nranks && peer < 0; i++)
      if (i != c->rank && c->ops->peer_alive(c->tp, i))
        peer = i;
  }
  uint64_t seq = ++c->catchup_seq;
  double timeout = 2.0 * wg_engine_member_timeout(c);
  pthread_mutex_unlock(&c->mu);
  if (peer < 0)
    return WAGMA_EPEER;
  wg_frame_header_t h = {0};
  h.kind = WG_FRAME_CATCHUP_REQ;
  h.round = r;
  h.src = (uint32_t)c->rank;
  h.seq = seq;
  rc = c->ops->send(c->tp, peer, &h, NULL, 0);
  if (rc != 0)
    goto out;
  wg_match_t match;
  wg_match_any(&match);
  match.src = (uint64_t)peer;
  match.kinds = 1u << WG_FRAME_CATCHUP_REP;
  match.seq = seq;
  rc = c->ops->recv(c->tp, &match, wg_now() + timeout, &m);
  if (rc != 0)
    goto out;
  uint64_t peer_round = m->header.aux;
  if (m->header.flags & WG_CATCHUP_NONE) {
    *next = peer_round > r + 1 ? peer_round : r + 1;
    goto jumped;
  }
  if (m->header.length != c->count * sizeof(float)) {
    rc = WAGMA_EPROTO;
    goto out;
  }
  uint64_t g = m->header.round;
  memcpy(model, m->payload, c->count * sizeof(float));
  *next = g + 1 > peer_round ? g + 1 : peer_round;
  if (*next <= r)
    *next = r + 1;
  publish(c, model, g);
  pthread_mutex_lock(&c->mu);
  if (!c->have_global || c->global_round < g) {
    memcpy(c->global_mean, model, c->count * sizeof(float));
    c->global_round = g;
    c->have_global = 1;
  }
  pthread_mutex_unlock(&c->mu);
jumped:
  pthread_mutex_lock(&c->mu);
  /* Corrections of rounds before the new round refer to the model we just dropped. */
  wg_entry_t **p = &c->entries;
  while (*p) {
    wg_entry_t *e = *p;
    if (e->round < *next) {
      *p = e->next;
      wg_engine_entry_free(e);
      continue;
    }
    p = &e->next;
  }
  c->highest_seen = *next;
  if (!(m->header.flags & WG_CATCHUP_NONE))
    c->model_global = m->header.round + 1;
  c->counters.catchups++;
  pthread_mutex_unlock(&c->mu);
  wg_logf(c->log, c->log_user, WAGMA_LOG_INFO,
          "engine: rank %d caught up from rank %d: round %llu -> %llu", c->rank, peer,
          (unsigned long long)r, (unsigned long long)*next);
out:
  wg_message_free(m);
  return rc;
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
  /* A wait-avoiding global round G > r my round thread contributed to: skip to G + 1. */
  uint64_t jump_to = 0;
  if (c->mode == WAGMA_GLOBAL_WAIT_AVOIDING)
    for (wg_entry_t *e = c->entries; e; e = e->next)
      if (e->global && e->round > r && e->state != WG_ENTRY_DROPPED)
        jump_to = e->round;
  st.corrections_applied = apply_resolved(c, model, r, wg_now());
  if (jump_to && jump_to + 1 > c->model_global)
    c->model_global = jump_to + 1; /* its correction is applied now or at a later step */
  uint64_t version = model_version(c, r);
  int behind = c->highest_seen > version + c->tau;
  pthread_mutex_unlock(&c->mu);

  if (jump_to) {
    publish(c, model, version);
    next = jump_to + 1;
    st.kind = WAGMA_ROUND_GLOBAL;
    st.members = c->nranks;
    goto done;
  }
  if (behind && catch_up(c, model, r, &next) == 0) {
    st.caught_up = 1;
    goto done;
  }
  if (atomic_load(&c->aborted))
    return WAGMA_ECANCELED;
  next = r + 1;
  publish(c, model, version);
  if (global && c->mode == WAGMA_GLOBAL_BARRIER)
    rc = barrier_global(c, model, r, &st);
  else
    rc = group_round(c, model, r, global, &st);
  rc = cancel_rc(c, rc);
  if (rc == WAGMA_ECLOSED || rc == WAGMA_ECANCELED)
    return rc;

done:
  pthread_mutex_lock(&c->mu);
  atomic_store(&c->cur_round, next);
  c->counters.rounds_completed++;
  st.rounds_skipped = next - r - 1;
  c->counters.rounds_skipped += st.rounds_skipped;
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
  pthread_mutex_lock(&c->mu);
  int n = apply_resolved(c, model, atomic_load(&c->cur_round), wg_now());
  pthread_mutex_unlock(&c->mu);
  return n;
}

int wg_comm_busy(wagma_comm_t *c) {
  int n = 0;
  pthread_mutex_lock(&c->mu);
  for (wg_entry_t *e = c->entries; e; e = e->next)
    n += e->state == WG_ENTRY_WAITING;
  for (wg_lround_t *lr = c->lrounds; lr; lr = lr->next)
    n++;
  pthread_mutex_unlock(&c->mu);
  return n;
}

/* ---------------------------------------------------------------- blocking collectives */

static int public_coll(wagma_comm_t *c, enum coll_op op, float *buf, size_t count,
                       wagma_reduce_op_t rop, int root, float weight) {
  if (!c || (!buf && count > 0) || count > SIZE_MAX / (2 * sizeof(float)))
    return WAGMA_EINVAL;
  if (atomic_load(&c->aborted))
    return WAGMA_ECANCELED;
  if (count == 0)
    return 0;
  if (op == COLL_BROADCAST && (root < 0 || root >= c->nranks))
    return WAGMA_EINVAL;
  uint32_t group = (uint32_t)c->coll_calls++;
  size_t chunk = c->coll_chunk > 0 ? c->coll_chunk : count;
  int rc = cancel_rc(
      c, coll_live(c, op, COLL_ROUND, group, buf, count, chunk, rop, root, weight, NULL, NULL));
  if (rc != 0)
    set_err(c, "blocking collective %s: %s",
            op == COLL_ALLREDUCE   ? "allreduce"
            : op == COLL_BROADCAST ? "broadcast"
                                   : "average",
            rc);
  return rc;
}

int wagma_comm_allreduce(wagma_comm_t *comm, float *buf, size_t count, wagma_reduce_op_t op) {
  if (op != WAGMA_REDUCE_SUM && op != WAGMA_REDUCE_MEAN)
    return WAGMA_EINVAL;
  return public_coll(comm, COLL_ALLREDUCE, buf, count, op, 0, 0);
}

int wagma_comm_broadcast(wagma_comm_t *comm, float *buf, size_t count, int root) {
  return public_coll(comm, COLL_BROADCAST, buf, count, WAGMA_REDUCE_SUM, root, 0);
}

int wagma_comm_average(wagma_comm_t *comm, float *buf, size_t count, float weight) {
  if (!(weight >= 0))
    return WAGMA_EINVAL;
  return public_coll(comm, COLL_AVERAGE, buf, count, WAGMA_REDUCE_SUM, 0, weight);
}
