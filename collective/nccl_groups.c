/* nccl_groups.c — the NCCL transport's group communicators and the collective a round runs on
 * one (docs/design.md §6.4, "Rounds as one collective"): per epoch, once the epoch's
 * communicator is up, one ncclCommSplit per phase of the plan (colour = my group in that
 * phase, key = my plan rank), and one of everyone (the world's: a global round where every
 * member contributes), so the contributors of a round that are its whole group (or everyone)
 * reduce with ONE ncclAllReduce on that communicator instead of coll.c's point-to-point steps
 * through the lane.
 *
 * Owns: t->groups (set by the lane thread before the lane is up, then fixed; up/down under
 * t->mu), the peers' NC_GROUPS bits (t->mu), the turn (t->mu, t->turn_cv), and the one
 * caller's stream and buffers (coll_*: the engine's data thread; close frees them after
 * every thread ended). Threads: groups_split and groups_on_control on the lane thread;
 * group_ready from any thread; group_allreduce on one caller thread at a time.
 *
 * Why no two NCCL operations can wait on each other (NCCL 2.28 user guide, "Using multiple
 * NCCL communicators concurrently": operations on different communicators may deadlock when
 * they run at the same time, so they should be used "at different epochs with a locking
 * mechanism", submitted in the same order across ranks). Here:
 *  1. One NCCL operation at a time per process: the turn. The lane thread holds it from a
 *     clear-to-send (or a sender's post) until its transfer ended; a collective takes it
 *     when the lane is idle, and while one waits for it the lane starts nothing new (no CTS,
 *     a CTS is answered NACK).
 *  2. A lane transfer is posted by both ends only after CTS / GO agreed on it, so each end
 *     posts its half at once, without waiting for anything else; it ends or misses its
 *     deadline.
 *  3. A collective of round r is posted by exactly the contributors of r, after their
 *     leader's GO. A rank has at most one contribution outstanding (engine_member.c), so a
 *     contributor of r runs no other collective before r: each posts r as soon as its lane
 *     transfer, if any, ended (2). Ranks post their collectives in increasing round order,
 *     each communicator's in the same order on all its ranks.
 * So every posted operation's partners post it in bounded time unless one died or froze;
 * then the deadline (polled, growing with the buffer) ends it: ncclCommRevoke, the group told
 * over TCP (NC_GROUP_DOWN), the group's later rounds through coll.c, and the next epoch splits
 * afresh. ncclCommAbort only at close, on no thread anyone waits for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_internal.h"
#include "wagma/log_internal.h"

/* How long a collective goes on after a member's death was seen (it may have completed). */
#define DEAD_GRACE_S 0.25

int WG_NCCL(groups_new)(nc_t *t, const wagma_plan_t *plan) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&t->turn_cv, &ca);
  pthread_condattr_destroy(&ca);
  t->groups_said = calloc((size_t)t->nranks, sizeof(uint64_t));
  t->groups_heard = calloc((size_t)t->nranks, 1);
  if (!t->groups_said || !t->groups_heard)
    return WAGMA_ENOMEM;
  if (plan->nphases < 1 || plan->nphases > NC_GROUPS_MAX_PHASES)
    return 0;
  t->group_of = malloc((size_t)(plan->nphases + 1) * (size_t)t->nranks * sizeof(int));
  t->groups = calloc((size_t)plan->nphases + 1, sizeof(nc_group_t)); /* + the world's */
  if (!t->group_of || !t->groups)
    return WAGMA_ENOMEM;
  t->nphases = plan->nphases;
  for (int p = 0; p < plan->nphases; p++) {
    const wagma_phase_t *ph = &plan->phases[p];
    for (int r = 0; r < t->nranks; r++)
      t->group_of[p * t->nranks + r] = ph->group_of[r];
  }
  for (int r = 0; r < t->nranks; r++) /* index nphases: the world, one group of everyone */
    t->group_of[plan->nphases * t->nranks + r] = 0;
  return 0;
}

/* Polls a communicator being created until it is ready: 0, or -1 (failed, or the deadline). */
static int poll_ready(nc_t *t, ncclComm_t comm) {
  for (;;) {
    ncclResult_t e = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &e) != ncclSuccess)
      return -1;
    if (e == ncclSuccess)
      return 0;
    if (e != ncclInProgress || atomic_load(&t->stopping) || wg_now() > t->init_deadline)
      return -1;
    WG_NCCL(pump)(t, 0.001);
  }
}

int WG_NCCL(groups_split)(nc_t *t) {
  for (int p = 0; p < t->nphases + (t->nphases > 0); p++) {
    nc_group_t *g = &t->groups[p];
    int mine = t->group_of[p * t->nranks + t->rank];
    g->ranks = malloc((size_t)t->nranks * sizeof(int));
    if (!g->ranks)
      return -1;
    for (int r = 0; r < t->nranks; r++)
      if (t->group_of[p * t->nranks + r] == mine)
        g->ranks[g->n++] = r; /* ascending: key = plan rank, so NCCL ranks follow */
    /* ncclCommSplit (NCCL 2.28 API, "ncclCommSplit"): collective over the parent, every rank
     * calls it (NCCL_SPLIT_NOCOLOR: no communicator), ranks of one colour ordered by key;
     * "there should not be any outstanding NCCL operations on the comm" when it is called:
     * nothing is posted on t->comm before the lane is up. config: non-blocking, polled with
     * ncclCommGetAsyncError like the parent (user guide, "Nonblocking group operation"). */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    int colour = g->n >= 2 ? mine : NCCL_SPLIT_NOCOLOR;
    ncclResult_t rc = ncclCommSplit(t->comm, colour, t->rank, &g->comm, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      wg_logf(t->log, t->log_user, WAGMA_LOG_WARN, "rank %d: ncclCommSplit of phase %d: %s",
              t->rank, p, ncclGetErrorString(rc));
      g->comm = NULL;
      return -1;
    }
    /* the parent too: a non-blocking communicator takes no new call while it is in progress
     * (user guide, "Nonblocking group operation"), and without a colour there is no child to
     * poll */
    if (poll_ready(t, t->comm) != 0) {
      wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
              "rank %d: the epoch's communicator did not finish the split of phase %d", t->rank, p);
      return -1;
    }
    if (colour == NCCL_SPLIT_NOCOLOR) {
      g->comm = NULL;
      continue;
    }
    if (!g->comm || poll_ready(t, g->comm) != 0) {
      wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
              "rank %d: the group communicator of phase %d did not come up", t->rank, p);
      return -1;
    }
    pthread_mutex_lock(&t->mu);
    g->up = 1;
    pthread_mutex_unlock(&t->mu);
  }
  return 0;
}

void WG_NCCL(groups_announce)(nc_t *t) {
  uint64_t bits = 0;
  pthread_mutex_lock(&t->mu);
  for (int p = 0; p < t->nphases + (t->nphases > 0); p++)
    if (t->groups[p].up)
      bits |= 1ull << p;
  t->groups_said[t->rank] = bits;
  t->groups_heard[t->rank] = 1;
  pthread_mutex_unlock(&t->mu);
  for (int r = 0; r < t->nranks; r++)
    if (r != t->rank)
      (void)WG_NCCL(control)(t, r, NC_GROUPS, bits, NULL, 0);
}

void WG_NCCL(groups_on_control)(nc_t *t, int src, enum nc_op op, uint64_t aux) {
  pthread_mutex_lock(&t->mu);
  if (op == NC_GROUPS) {
    t->groups_said[src] = aux;
    t->groups_heard[src] = 1;
  } else if (op == NC_GROUP_DOWN && aux <= (uint64_t)t->nphases && t->nphases > 0) {
    nc_group_t *g = &t->groups[aux];
    for (int i = 0; i < g->n; i++)
      if (g->ranks[i] == src) { /* only a member's word counts */
        g->down = 1;
        atomic_store(&g->down_asked, 1);
      }
  }
  pthread_mutex_unlock(&t->mu);
}

int WG_NCCL(turn_lane)(nc_t *t) {
  pthread_mutex_lock(&t->mu);
  int ok = t->turn == NC_TURN_LANE || (t->turn == NC_TURN_FREE && t->coll_want == 0);
  if (ok)
    t->turn = NC_TURN_LANE;
  pthread_mutex_unlock(&t->mu);
  return ok;
}

void WG_NCCL(turn_lane_release)(nc_t *t) {
  pthread_mutex_lock(&t->mu);
  if (t->turn == NC_TURN_LANE) {
    t->turn = NC_TURN_FREE;
    pthread_cond_broadcast(&t->turn_cv);
  }
  pthread_mutex_unlock(&t->mu);
}

/* With t->mu: 1 when group p is exactly `ranks` and usable on all of them. */
static int matches(nc_t *t, int p, const int *ranks, int n) {
  nc_group_t *g = &t->groups[p];
  if (!g->up || g->down || g->n != n)
    return 0;
  for (int i = 0; i < n; i++)
    if (g->ranks[i] != ranks[i] || !t->groups_heard[ranks[i]] ||
        !(t->groups_said[ranks[i]] & (1ull << p)))
      return 0;
  return 1;
}

/* With t->mu: the communicator for round's allreduce among `ranks`: its phase's group, or the
 * world's (a global round's, everyone contributing); *p its index. NULL when none. */
static nc_group_t *usable(nc_t *t, uint64_t round, const int *ranks, int n, int *p) {
  if (t->nphases == 0 || n < 2)
    return NULL;
  *p = (int)(round % (uint64_t)t->nphases);
  if (matches(t, *p, ranks, n))
    return &t->groups[*p];
  *p = t->nphases;
  return matches(t, *p, ranks, n) ? &t->groups[*p] : NULL;
}

int WG_NCCL(group_ready)(wg_transport_t *t, uint64_t round, const int *ranks, int n) {
  int p = 0;
  pthread_mutex_lock(&t->mu);
  int ok = usable(t, round, ranks, n, &p) != NULL;
  pthread_mutex_unlock(&t->mu);
  return ok;
}

/* Takes the turn for a collective by deadline: 0, or -1. */
static int turn_coll(nc_t *t, double deadline) {
  pthread_mutex_lock(&t->mu);
  t->coll_want++;
  while (t->turn != NC_TURN_FREE && wg_now() < deadline && !t->closed) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 2 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&t->turn_cv, &t->mu, &ts);
  }
  t->coll_want--;
  int ok = t->turn == NC_TURN_FREE && !t->closed;
  if (ok)
    t->turn = NC_TURN_COLL;
  pthread_mutex_unlock(&t->mu);
  return ok ? 0 : -1;
}

static void turn_coll_release(nc_t *t) {
  pthread_mutex_lock(&t->mu);
  t->turn = NC_TURN_FREE;
  pthread_cond_broadcast(&t->turn_cv);
  pthread_mutex_unlock(&t->mu);
}

/* Frees the device buffer behind what is queued on the stream. */
static void dev_free(nc_t *t) {
  if (t->coll_dev && (t->coll_dev_ordered ? cudaFreeAsync(t->coll_dev, t->coll_stream)
                                          : cudaFree(t->coll_dev)) != cudaSuccess)
    (void)cudaGetLastError();
  t->coll_dev = NULL;
  t->coll_dev_cap = 0;
}

/* The caller's stream (high priority: rounds go before bulk copies of the application) and
 * buffers of at least bytes: 0, or -1. The device buffer is stream-ordered (cudaMallocAsync:
 * no wait for the application's compute stream), falling back to cudaMalloc. */
static int coll_buffers(nc_t *t, size_t bytes) {
  if (!t->coll_stream) {
    int least = 0, greatest = 0;
    if (cudaSetDevice(t->device) != cudaSuccess ||
        cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess ||
        cudaStreamCreateWithPriority(&t->coll_stream, cudaStreamNonBlocking, greatest) !=
            cudaSuccess) {
      (void)cudaGetLastError();
      t->coll_stream = NULL;
      return -1;
    }
  }
  if (t->coll_dev_cap < bytes) {
    dev_free(t);
    t->coll_dev_ordered = 1;
    if (cudaMallocAsync(&t->coll_dev, bytes, t->coll_stream) != cudaSuccess) {
      (void)cudaGetLastError();
      t->coll_dev = NULL;
      t->coll_dev_ordered = 0;
      if (cudaMalloc(&t->coll_dev, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        t->coll_dev = NULL;
        return -1;
      }
    }
    t->coll_dev_cap = bytes;
  }
  if (t->coll_host_cap < bytes || (t->coll_host && !WG_NCCL(is_locked)(t->coll_host))) {
    float *h = WG_NCCL(payload_buffer)(t->device, bytes); /* page-locked when cached */
    if (!h)
      return t->coll_host_cap >= bytes ? 0 : -1;
    wg_buf_free(t->coll_host);
    t->coll_host = h;
    t->coll_host_cap = bytes;
  }
  return 0;
}

/* After a failure: revoke (NCCL 2.28 user guide, "Fault Tolerance": ncclCommRevoke stops the
 * operations in flight and makes the communicator refuse new ones; it is then only shrunk or
 * aborted), wait (at most 1 s) for the stream to drain, tell the group. Buffers the device
 * may still write are left to it (leaked) and the next call allocates new ones. */
static void retire(nc_t *t, nc_group_t *g, int p, const char *why) {
  wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
          "rank %d: the nccl group communicator of phase %d is revoked (%s); its rounds go "
          "through point-to-point steps for the rest of epoch %llu",
          t->rank, p, why, (unsigned long long)t->epoch);
  atomic_fetch_add(&t->collective_failures, 1);
  (void)ncclCommRevoke(g->comm, NCCL_REVOKE_DEFAULT);
  if (!WG_NCCL(quiesce)(g->comm, t->coll_stream)) {
    t->coll_dev = NULL; /* leaked, see above */
    t->coll_dev_cap = 0;
    t->coll_host = NULL;
    t->coll_host_cap = 0;
  }
  pthread_mutex_lock(&t->mu);
  g->down = 1;
  pthread_mutex_unlock(&t->mu);
  for (int i = 0; i < g->n; i++)
    if (g->ranks[i] != t->rank)
      (void)WG_NCCL(control)(t, g->ranks[i], NC_GROUP_DOWN, (uint64_t)p, NULL, 0);
}

int WG_NCCL(group_allreduce)(wg_transport_t *t, const int *ranks, int n, uint64_t round,
                             const float *src, size_t count, double deadline, const float **sum) {
  *sum = NULL;
  int p = 0;
  pthread_mutex_lock(&t->mu);
  nc_group_t *g = usable(t, round, ranks, n, &p);
  pthread_mutex_unlock(&t->mu);
  if (!g) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_DEBUG,
            "rank %d: no group communicator for round %llu here", t->rank,
            (unsigned long long)round);
    return WAGMA_EIO;
  }
  size_t bytes = count * sizeof(float);
  if (coll_buffers(t, bytes ? bytes : 1) != 0) {
    retire(t, g, p, "no stream or buffers");
    return WAGMA_EIO;
  }
  if (turn_coll(t, deadline) != 0)
    return WAGMA_ETIMEDOUT; /* nothing posted: the members' own deadlines retire the group */
  const char *fail = NULL;
  int late = 0, gone = 0;
  double dead_since = 0;
  char why[160];
  int locked = WG_NCCL(is_locked)(t->coll_host), copied = 0;
  /* In place on the device, ordered on the stream: upload, ncclAllReduce (NCCL 2.28 API,
   * "ncclAllReduce": sendbuff == recvbuff is in place, user guide "In-place Operations"),
   * download; a non-blocking communicator may return ncclInProgress, and its async error
   * says when the operation is on the stream. */
  ncclResult_t rc = ncclSuccess;
  if (cudaMemcpyAsync(t->coll_dev, src, bytes, cudaMemcpyHostToDevice, t->coll_stream) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    fail = "upload";
  } else {
    rc = ncclAllReduce(t->coll_dev, t->coll_dev, count, ncclFloat32, ncclSum, g->comm,
                       t->coll_stream);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      snprintf(why, sizeof why, "ncclAllReduce: %s", ncclGetErrorString(rc));
      fail = why;
    }
  }
  /* The download goes behind the collective once the non-blocking communicator's async error
   * says ncclSuccess, i.e. the collective is on the stream (before that, a copy queued now
   * could run first: user guide, "Nonblocking group operation"); into pageable memory only
   * once the stream is idle too (that call returns when the copy is done, and must never wait
   * for a frozen peer). */
  while (!fail) {
    ncclResult_t e = ncclSuccess;
    if (ncclCommGetAsyncError(g->comm, &e) != ncclSuccess)
      e = ncclInternalError;
    if (e != ncclSuccess && e != ncclInProgress) {
      snprintf(why, sizeof why, "%s", ncclGetErrorString(e));
      fail = why;
      break;
    }
    if (atomic_load(&g->down_asked)) {
      fail = "a member revoked its communicator";
      break;
    }
    pthread_mutex_lock(&t->mu);
    int closed = t->closed;
    pthread_mutex_unlock(&t->mu);
    if (closed) { /* interrupted: close aborts the communicator */
      turn_coll_release(t);
      return WAGMA_ECLOSED;
    }
    cudaError_t q = e == ncclSuccess ? cudaStreamQuery(t->coll_stream) : cudaErrorNotReady;
    if (q != cudaSuccess && q != cudaErrorNotReady) {
      snprintf(why, sizeof why, "stream: %s", cudaGetErrorString(q));
      fail = why;
      break;
    }
    if (q == cudaSuccess && copied)
      break;
    if (e == ncclSuccess && !copied && (locked || q == cudaSuccess)) {
      if (cudaMemcpyAsync(t->coll_host, t->coll_dev, bytes, cudaMemcpyDeviceToHost,
                          t->coll_stream) != cudaSuccess) {
        (void)cudaGetLastError();
        fail = "download";
      }
      copied = 1;
      continue;
    }
    /* a member the control channel buried: NCCL would wait for it. Not at once: a member
     * whose collective completed may leave (the job's end) while mine still takes in what it
     * sent */
    int dead = -1;
    for (int i = 0; i < g->n && dead < 0; i++)
      if (g->ranks[i] != t->rank && !t->tcp_ops->peer_alive(t->tcp, g->ranks[i]))
        dead = g->ranks[i];
    if (dead >= 0 && dead_since == 0)
      dead_since = wg_now();
    if (dead >= 0 && wg_now() - dead_since > DEAD_GRACE_S) {
      snprintf(why, sizeof why, "rank %d died", dead);
      fail = why;
      gone = 1;
      break;
    }
    if (wg_now() > deadline) {
      fail = "missed its deadline";
      late = 1;
      break;
    }
    WG_NCCL(nap_us)(50);
  }
  int result = 0;
  if (fail) {
    retire(t, g, p, fail);
    result = gone || atomic_load(&g->down_asked) ? WAGMA_EPEER : late ? WAGMA_ETIMEDOUT : WAGMA_EIO;
  } else {
    atomic_fetch_add(&t->collectives, 1);
    *sum = t->coll_host;
  }
  turn_coll_release(t);
  return result;
}

void WG_NCCL(groups_free)(nc_t *t) {
  for (int p = 0; t->groups && p <= t->nphases; p++) {
    if (t->groups[p].comm)
      (void)ncclCommAbort(t->groups[p].comm); /* close: nobody waits for it */
    free(t->groups[p].ranks);
  }
  if (t->coll_stream) {
    dev_free(t);
    if (cudaStreamDestroy(t->coll_stream) != cudaSuccess)
      (void)cudaGetLastError();
  }
  wg_buf_free(t->coll_host);
  free(t->groups);
  free(t->group_of);
  free(t->groups_said);
  free(t->groups_heard);
  pthread_cond_destroy(&t->turn_cv);
}
