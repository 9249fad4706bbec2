/* engine_global.c — what the compute thread runs over all live members: barrier global
 * rounds, catch-up (adopting a peer's latest global mean) and the blocking collectives
 * (allreduce, broadcast, weighted average) in chunks on the live set.
 *
 * Owns: nothing beyond the calls' own buffers.
 * Thread: the compute thread. Takes comm->mu only briefly; collectives run without it.
 *
 * Blocking collectives take any count: the buffer moves in chunks of comm->coll_chunk floats,
 * one coll operation each, so no frame exceeds the transport's max_payload. Chunk k uses COLL
 * frames with round `round - k`; public collectives use round UINT64_MAX - 1 and group = the
 * call counter, barrier global rounds use the round and group UINT32_MAX; group rounds use
 * no COLL frames. So none of them mix. A live set is one attempt: when a participant dies
 * mid-way (EPEER, directly or by a failure notice, coll.h), the whole buffer is restored and
 * every chunk runs again on the smaller set, so all chunks are reduced over the same members. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "engine_internal.h"
#include "wagma/log_internal.h"

#define BARRIER_GROUP UINT32_MAX

static uint64_t ranks_hash40(const int *ranks, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    h ^= (uint64_t)(uint32_t)ranks[i] + 1;
    h *= 1099511628211ull;
  }
  return h & ((1ull << 40) - 1);
}

/* A survivor that starts a global collective before it learned that a peer died runs it among
 * a larger set (another seq) and would wait for the others until the global deadline, since
 * the dead peer it would notice is not its first partner (seen: a barrier round 30 s flat after
 * a SIGKILL under load). So a rank that starts with fewer live ranks than members sends, to
 * every live peer, the failure notice (coll.h) of each operation a stale view would run: among
 * the live ranks and one of the dead (one death not yet seen), and among all members. A peer
 * running one of them gives up within a wait slice and retries without the rank named dead.
 * Bounded: the first 4 such collectives of a communicator (the window is a rank's delay in
 * seeing a death; notices nobody takes stay in mailboxes until the epoch ends). */
static void notice_set(wagma_comm_t *c, uint64_t round, uint32_t group, const int *set, int nset,
                       int dead, const int *live, int n) {
  wg_frame_header_t h = {0};
  h.kind = WG_FRAME_COLL;
  h.round = round;
  h.group = group;
  h.seq = (ranks_hash40(set, nset) << 20) | WG_COLL_NOTICE_BIT; /* as ctx.seq below */
  h.flags = WG_COLL_FAILED;
  h.aux = (uint64_t)(int64_t)dead;
  for (int k = 0; k < n; k++)
    if (live[k] != c->rank)
      (void)c->ops->send(c->tp, live[k], &h, NULL, 0);
}

static void tell_stale_views(wagma_comm_t *c, uint64_t round, uint32_t group, const int *live,
                             int n) {
  if (n >= c->nranks || c->stale_view_notices >= 4)
    return;
  c->stale_view_notices++;
  int set[c->nranks];
  int first_dead = -1, ndead = 0;
  for (int d = 0, k = 0; d < c->nranks; d++) {
    if (k < n && live[k] == d) {
      k++;
      continue;
    }
    if (first_dead < 0)
      first_dead = d;
    ndead++;
    int m = 0, placed = 0; /* live with d, sorted */
    for (int j = 0; j < n; j++) {
      if (!placed && live[j] > d) {
        set[m++] = d;
        placed = 1;
      }
      set[m++] = live[j];
    }
    if (!placed)
      set[m++] = d;
    notice_set(c, round, group, set, m, d, live, n);
  }
  if (ndead > 1)
    notice_set(c, round, group, c->all_ranks, c->nranks, first_dead, live, n);
}

int wg_global_coll_live(wagma_comm_t *c, enum wg_coll_op op, uint64_t round, uint32_t group,
                        float *buf, size_t count, size_t chunk, wagma_reduce_op_t rop, int root,
                        float weight, int *live_out, int *nlive_out) {
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
  c->mem->copy(c->mem->self, saved, buf, count);
  for (;;) {
    int n = 0;
    for (int i = 0; i < c->nranks; i++)
      if (i == c->rank || (!excluded[i] && c->ops->peer_alive(c->tp, i)))
        live[n++] = i;
    uint64_t h = ranks_hash40(live, n);
    if (h == prev)
      break; /* same set failed already */
    if (prev == UINT64_MAX)
      tell_stale_views(c, round, group, live, n);
    prev = h;
    if (op == WG_COLL_BROADCAST) {
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
    c->mem->copy(c->mem->self, buf, saved, count);
    rc = 0;
    for (size_t off = 0, k = 0; off < count && rc == 0; off += chunk, k++) {
      size_t len = count - off < chunk ? count - off : chunk;
      ctx.round = round - k;
      switch (op) {
      case WG_COLL_ALLREDUCE: rc = wg_coll_allreduce(&ctx, buf + off, len, rop, deadline); break;
      case WG_COLL_BROADCAST: rc = wg_coll_broadcast(&ctx, buf + off, len, root, deadline); break;
      case WG_COLL_AVERAGE: rc = wg_coll_average(&ctx, buf + off, len, weight, deadline); break;
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
    c->mem->copy(c->mem->self, buf, saved, count);
out:
  free(live);
  free(excluded);
  free(saved);
  return rc;
}

int wg_global_barrier(wagma_comm_t *c, float *model, uint64_t g, wagma_round_stats_t *st) {
  /* My outstanding contribution first: its round ends (bounded wait), its correction is
   * applied, so the global mean contains it. */
  pthread_mutex_lock(&c->mu);
  double deadline = wg_now() + wg_engine_member_timeout(c);
  while (c->outstanding && !c->stopping && wg_now() < deadline)
    wg_engine_wait(c, deadline);
  if (c->stopping) {
    pthread_mutex_unlock(&c->mu);
    return WAGMA_ECLOSED;
  }
  int napplied = 0;
  float *taken = wg_snapshot_take(c, &napplied);
  pthread_mutex_unlock(&c->mu);
  wg_snapshot_add_taken(c, model, taken); /* outside mu */
  st->corrections_applied += napplied;

  int live[c->nranks];
  int nlive = 0;
  st->members = c->nranks;
  int rc = wg_global_coll_live(c, WG_COLL_ALLREDUCE, g, BARRIER_GROUP, model, c->count, c->count,
                               WAGMA_REDUCE_MEAN, 0, 0, live, &nlive);
  if (rc != 0) {
    snprintf(c->err, sizeof(c->err), "barrier global round: allreduce: %s", wagma_strerror(rc));
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
  wg_engine_store_global(c, g, model);
  c->model_global = g + 1;
  if (nlive >= 2 && g + 1 > c->mixed_round)
    c->mixed_round = g + 1;
  if (c->jump_global <= c->model_global)
    c->jump_global = 0; /* the model holds a global mean as new as the jump claimed */
  pthread_mutex_unlock(&c->mu);
  /* A correction that arrived during the allreduce (an outstanding round of mine that ended
   * late) goes on top of the mean, like any late correction. */
  st->corrections_applied += wg_snapshot_publish(c, model, g, 1);
  return 0;
}

/* Catch-up: adopt the latest global mean from a peer and jump. Returns 0 and *next, or an
 * error (the step then runs its round normally). The model becomes exactly M; corrections of
 * my rounds still to come (resolved or outstanding) are applied on top of it at later steps,
 * so the only change to the sum of models is M - (my model before), which stats report as a
 * catch-up. */
int wg_global_catch_up(wagma_comm_t *c, float *model, uint64_t r, uint64_t *next) {
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
    return rc;
  wg_match_t match;
  wg_match_any(&match);
  match.src = (uint64_t)peer;
  match.kinds = 1u << WG_FRAME_CATCHUP_REP;
  match.seq = seq;
  rc = c->ops->recv(c->tp, &match, wg_now() + timeout, &m);
  if (rc != 0)
    return rc;
  uint64_t peer_round = m->header.aux;
  int none = (m->header.flags & WG_CATCHUP_NONE) != 0;
  uint64_t g = m->header.round;
  if (!none && m->header.length != c->count * sizeof(float)) {
    wg_message_free(m);
    return WAGMA_EPROTO;
  }
  pthread_mutex_lock(&c->mu);
  if (!none && c->model_global > g) {
    none = 1; /* my model already contains that mean or a newer one: just jump */
  }
  pthread_mutex_unlock(&c->mu);
  if (none) {
    *next = peer_round > r + 1 ? peer_round : r + 1;
  } else {
    wg_codec_get_floats(model, m->payload, c->count);
    *next = g + 1 > peer_round ? g + 1 : peer_round;
    if (*next <= r)
      *next = r + 1;
    pthread_mutex_lock(&c->mu);
    wg_engine_store_global(c, g, model);
    c->model_global = g + 1;
    if (g + 1 > c->mixed_round)
      c->mixed_round = g + 1; /* a peer's global mean */
    if (c->jump_global <= c->model_global)
      c->jump_global = 0; /* the model holds a global mean as new as the jump claimed */
    pthread_mutex_unlock(&c->mu);
    wg_snapshot_publish(c, model, g, 0);
  }
  pthread_mutex_lock(&c->mu);
  c->highest_seen = *next;
  c->counters.catchups++;
  pthread_mutex_unlock(&c->mu);
  wg_logf(c->log, c->log_user, WAGMA_LOG_INFO,
          "engine: rank %d caught up from rank %d: round %llu -> %llu", c->rank, peer,
          (unsigned long long)r, (unsigned long long)*next);
  wg_message_free(m);
  return 0;
}
