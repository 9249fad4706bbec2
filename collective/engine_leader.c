/* engine_leader.c — the rounds this rank leads (wg_lround_t): opened by my own arrival or by
 * the first CONTRIB of a member, they collect contributions until every expected member
 * contributed or the deadline max(floor, factor x measured latency), then post the mean A
 * with the contributor list to every contributor and resolve my own contribution.
 *
 * Owns: comm->lrounds, comm->finished (rounds led and finished, so a late CONTRIB is answered
 * EXCLUDED), comm->global_mean (stored by whoever learns a global round's mean).
 * Threads: the round thread and the compute thread, always under comm->mu.
 *
 * Invariants: a round's RESULT goes to exactly its contributors and says who they are, so
 * their corrections A - C_i sum to zero; a member that missed a deadline is suspected (not
 * waited for) until any frame of it arrives. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "engine_internal.h"
#include "wagma/log_internal.h"

wg_lround_t *wg_leader_find(wagma_comm_t *c, uint64_t round) {
  for (wg_lround_t *lr = c->lrounds; lr; lr = lr->next)
    if (lr->round == round)
      return lr;
  return NULL;
}

int wg_leader_finished(const wagma_comm_t *c, uint64_t round) {
  for (int i = 0; i < WG_FINISHED_RING; i++)
    if (c->finished[i] == round + 1)
      return 1;
  return 0;
}

static void lround_free(wg_lround_t *lr) {
  if (!lr)
    return;
  free(lr->contributed);
  free(lr->expected);
  free(lr->versions);
  free(lr->sum);
  free(lr->done);
  free(lr);
}

void wg_leader_free_all(wagma_comm_t *c) {
  wg_lround_t *lr = c->lrounds;
  while (lr) {
    wg_lround_t *n = lr->next;
    lround_free(lr);
    lr = n;
  }
  c->lrounds = NULL;
  for (lr = c->drounds; lr;) {
    wg_lround_t *n = lr->next;
    lround_free(lr);
    lr = n;
  }
  c->drounds = NULL;
}

static int member_index(const wg_lround_t *lr, int rank) {
  for (int i = 0; i < lr->nmembers; i++)
    if (lr->members[i] == rank)
      return i;
  return -1;
}

/* Ownership: the round is linked into c->lrounds and owned by c. */
wg_lround_t *wg_leader_open(wagma_comm_t *c, uint64_t round, uint32_t group, int activator) {
  const int *ranks = NULL;
  uint32_t g = 0;
  int n = wg_engine_group_of(c, round, c->rank, &g, &ranks);
  if (n <= 0 || g != group)
    return NULL;
  wg_lround_t *lr = calloc(1, sizeof(*lr));
  if (!lr)
    return NULL;
  lr->contributed = calloc((size_t)n, 1);
  lr->expected = calloc((size_t)n, 1);
  lr->versions = calloc((size_t)n, sizeof(uint64_t));
  if (c->rounds_allreduce)
    lr->done = calloc((size_t)n, 1);
  else
    lr->sum = calloc(c->count, sizeof(double));
  if (!lr->contributed || !lr->expected || !lr->versions || (!lr->sum && !lr->done)) {
    lround_free(lr);
    return NULL;
  }
  lr->round = round;
  lr->group = group;
  lr->global = wg_engine_is_global(c, round);
  lr->nmembers = n;
  lr->members = ranks;
  lr->activator = activator;
  lr->created = wg_now();
  lr->deadline = lr->created + wg_engine_leader_timeout(c);
  for (int i = 0; i < n; i++) {
    int m = ranks[i];
    if (m == c->rank || m == activator) {
      lr->expected[i] = 1;
      continue;
    }
    if (!c->ops->peer_alive(c->tp, m))
      continue;
    wg_frame_header_t h = {0};
    h.kind = WG_FRAME_ACTIVATE;
    h.round = round;
    h.group = group;
    wg_outbox_post(c, m, &h, NULL);
    if (!c->suspect[m])
      lr->expected[i] = 1;
  }
  lr->next = c->lrounds;
  c->lrounds = lr;
  return lr;
}

static int complete(const wg_lround_t *lr) {
  for (int i = 0; i < lr->nmembers; i++)
    if (lr->expected[i] && !lr->contributed[i])
      return 0;
  return 1;
}

void wg_leader_add(wagma_comm_t *c, wg_lround_t *lr, int src, uint64_t version,
                   const float *model) {
  int i = member_index(lr, src);
  if (i < 0 || lr->contributed[i])
    return;
  lr->contributed[i] = 1;
  lr->expected[i] = 1;
  lr->versions[i] = version;
  lr->ncontrib++;
  for (size_t k = 0; model && lr->sum && k < c->count; k++)
    lr->sum[k] += (double)model[k];
  if (complete(lr))
    wg_leader_finalize(c, lr, wg_now());
}

void wg_leader_release(wagma_comm_t *c, wg_lround_t *lr, int src) {
  int i = member_index(lr, src);
  if (i < 0 || lr->contributed[i])
    return;
  lr->expected[i] = 0;
  if (complete(lr))
    wg_leader_finalize(c, lr, wg_now());
}

void wg_engine_store_global(wagma_comm_t *c, uint64_t round, const float *mean) {
  if (c->have_global && c->global_round >= round)
    return;
  c->mem->copy(c->mem->self, c->global_mean, mean, c->count);
  c->global_round = round;
  c->have_global = 1;
}

static void mark_finished(wagma_comm_t *c, uint64_t round) {
  c->finished[c->finished_pos] = round + 1;
  c->finished_pos = (c->finished_pos + 1) % WG_FINISHED_RING;
}

static void unlink_round(wg_lround_t **list, wg_lround_t *lr) {
  for (wg_lround_t **p = list; *p; p = &(*p)->next) {
    if (*p == lr) {
      *p = lr->next;
      return;
    }
  }
}

/* Unlinks lr, remembers its round as finished and frees it. */
static void retire(wagma_comm_t *c, wg_lround_t *lr) {
  if (!lr->data)
    mark_finished(c, lr->round); /* (a data-phase round was marked at its GO) */
  unlink_round(lr->data ? &c->drounds : &c->lrounds, lr);
  lround_free(lr);
  pthread_cond_broadcast(&c->cv);
}

/* ---- allreduce rounds: GO, then every contributor's DONE, then COMMIT or ABORT ----------- */

wg_lround_t *wg_leader_data_find(wagma_comm_t *c, uint64_t round) {
  for (wg_lround_t *lr = c->drounds; lr; lr = lr->next)
    if (lr->round == round)
      return lr;
  return NULL;
}

/* The contributors of lr, in member order (sorted): ranks and versions (nmembers entries). */
static int contributor_list(const wg_lround_t *lr, int *ranks, uint64_t *versions) {
  int n = 0;
  for (int i = 0; i < lr->nmembers; i++) {
    if (!lr->contributed[i])
      continue;
    ranks[n] = lr->members[i];
    versions[n] = lr->versions[i];
    n++;
  }
  return n;
}

static void post_decision(wagma_comm_t *c, const wg_lround_t *lr, uint32_t flags, wg_blob_t *blob,
                          int n) {
  for (int i = 0; i < lr->nmembers; i++) {
    if (!lr->contributed[i] || lr->members[i] == c->rank)
      continue;
    wg_frame_header_t h = {0};
    h.kind = WG_FRAME_RESULT;
    h.round = lr->round;
    h.group = lr->group;
    h.seq = (uint64_t)(int64_t)lr->activator;
    h.aux = (uint64_t)n;
    h.flags = flags | (lr->global ? WG_RESULT_GLOBAL : 0u);
    wg_outbox_post(c, lr->members[i], &h, blob);
  }
}

/* Every contributor's allreduce succeeded: COMMIT; my own contribution takes c->work. */
static void commit_round(wagma_comm_t *c, wg_lround_t *lr, double now) {
  wg_engine_ewma(&c->ewma_data, now - lr->go_at);
  post_decision(c, lr, WG_RESULT_COMMIT, NULL, lr->ncontrib);
  wg_entry_t *mine = wg_member_entry(c, lr->round);
  if (mine && mine->state == WG_ENTRY_WAITING && mine->go && mine->data_done && mine->data_rc == 0)
    wg_member_resolve(c, mine, c->work, mine->activator, mine->members, mine->ncontrib, mine->ranks,
                      mine->versions);
  retire(c, lr);
}

/* The round is void for every contributor: ABORT, and a failure notice of its allreduce so
 * that contributors still inside it give up now (coll.h) rather than at their deadline. */
static void abort_round(wagma_comm_t *c, wg_lround_t *lr, const char *why) {
  post_decision(c, lr, WG_RESULT_EXCLUDED, NULL, 0);
  int ranks[lr->nmembers];
  uint64_t versions[lr->nmembers];
  int n = contributor_list(lr, ranks, versions);
  for (int i = 0; i < n; i++) {
    if (ranks[i] == c->rank)
      continue;
    wg_frame_header_t h = {0};
    h.kind = WG_FRAME_COLL;
    h.round = lr->round;
    h.group = lr->group;
    h.seq = wg_engine_list_seq(ranks, n) | WG_COLL_NOTICE_BIT;
    h.flags = WG_COLL_FAILED;
    h.aux = (uint64_t)(int64_t)-1;
    wg_outbox_post(c, ranks[i], &h, NULL);
  }
  wg_entry_t *mine = wg_member_entry(c, lr->round);
  if (mine && mine->state == WG_ENTRY_WAITING)
    wg_member_void(c, mine, why);
  wg_logf(c->log, c->log_user, WAGMA_LOG_DEBUG, "engine: rank %d: round %llu aborted: %s", c->rank,
          (unsigned long long)lr->round, why);
  retire(c, lr);
}

/* The contributors are decided: GO to each (my own entry directly), then the data phase. A
 * lone contributor needs no allreduce: COMMIT at once, its own snapshot is the mean. */
static void go_round(wagma_comm_t *c, wg_lround_t *lr, double now) {
  int ranks[lr->nmembers];
  uint64_t versions[lr->nmembers];
  for (int i = 0; i < lr->nmembers; i++) /* a contributor that died since: not in the list */
    if (lr->contributed[i] && lr->members[i] != c->rank &&
        !c->ops->peer_alive(c->tp, lr->members[i])) {
      lr->contributed[i] = 0;
      lr->ncontrib--;
      wg_frame_header_t h = {0}; /* (answered all the same, as every contribution is) */
      h.kind = WG_FRAME_RESULT;
      h.round = lr->round;
      h.group = lr->group;
      h.flags = WG_RESULT_EXCLUDED;
      wg_outbox_post(c, lr->members[i], &h, NULL);
    }
  int n = contributor_list(lr, ranks, versions);
  wg_entry_t *mine = wg_member_entry(c, lr->round);
  int me_in = 0;
  for (int i = 0; i < n; i++)
    me_in |= ranks[i] == c->rank;
  if (n == 0) {
    retire(c, lr);
    return;
  }
  wg_blob_t *blob = wg_blob_new(wg_codec_list_size(n));
  if (!blob) {
    abort_round(c, lr, "out of memory");
    return;
  }
  wg_codec_list_encode(blob->data, n, ranks, versions);
  if (n == 1) {
    post_decision(c, lr, WG_RESULT_COMMIT, blob, 1);
    if (me_in && mine && mine->state == WG_ENTRY_WAITING)
      wg_member_resolve(c, mine, c->snap.buf[c->snap.pinned], lr->activator, lr->nmembers, 1, ranks,
                        versions);
    wg_blob_unref(blob);
    retire(c, lr);
    return;
  }
  /* the transport's own collective when it has one for exactly these ranks (NCCL: the
   * group's communicator); the flag makes every contributor go the same way */
  int coll = c->ops->group_ready && c->ops->group_ready(c->tp, lr->round, ranks, n);
  post_decision(c, lr, WG_RESULT_GO | (coll ? WG_RESULT_COLL : 0u), blob, n);
  wg_blob_unref(blob);
  if (me_in && mine && mine->state == WG_ENTRY_WAITING &&
      wg_member_go(c, mine, lr->activator, lr->nmembers, n, ranks, versions, coll) != 0) {
    abort_round(c, lr, "out of memory");
    return;
  }
  mark_finished(c, lr->round); /* a JOIN from now on is too late: EXCLUDED */
  unlink_round(&c->lrounds, lr);
  lr->data = 1;
  lr->go_at = now;
  double slack = c->floor_s / 2 > 0.1 ? c->floor_s / 2 : 0.1;
  lr->deadline = now + wg_engine_data_timeout(c) + slack;
  lr->next = c->drounds;
  c->drounds = lr;
  pthread_cond_broadcast(&c->cv);
}

void wg_leader_done(wagma_comm_t *c, uint64_t round, int src, int ok) {
  wg_lround_t *lr = wg_leader_data_find(c, round);
  int i = lr ? member_index(lr, src) : -1;
  if (i < 0 || !lr->contributed[i] || lr->done[i])
    return;
  lr->done[i] = 1;
  lr->ndone++;
  if (!ok)
    abort_round(c, lr, "a contributor's allreduce failed");
  else if (lr->ndone == lr->ncontrib)
    commit_round(c, lr, wg_now());
}

/* Data-phase rounds past their deadline, or with a contributor gone before its DONE: abort
 * (the missing ones are suspected). */
static void data_tick(wagma_comm_t *c, double now) {
  wg_lround_t *lr = c->drounds;
  while (lr) {
    wg_lround_t *next = lr->next;
    int gone = 0, late = now >= lr->deadline;
    for (int i = 0; i < lr->nmembers; i++) {
      int m = lr->members[i];
      if (!lr->contributed[i] || lr->done[i] || m == c->rank)
        continue;
      if (!c->ops->peer_alive(c->tp, m))
        gone = 1;
      if (late)
        c->suspect[m] = 1;
    }
    if (late || gone)
      abort_round(c, lr, late ? "its allreduce missed the deadline" : "a contributor died");
    lr = next;
  }
}

void wg_leader_finalize(wagma_comm_t *c, wg_lround_t *lr, double now) {
  if (complete(lr))
    wg_engine_ewma(&c->ewma_leader, now - lr->created);
  for (int i = 0; i < lr->nmembers; i++)
    if (lr->expected[i] && !lr->contributed[i] && lr->members[i] != c->rank)
      c->suspect[lr->members[i]] = 1; /* missed the deadline: do not wait for it again */
  if (c->rounds_allreduce) {
    go_round(c, lr, now);
    return;
  }
  int n = lr->ncontrib;
  wg_entry_t *mine = wg_member_entry(c, lr->round);
  int me = member_index(lr, c->rank);
  int i_contributed = me >= 0 && lr->contributed[me];
  if (n == 0) {
    retire(c, lr);
    return;
  }
  float *mean = malloc(c->count * sizeof(float));
  int *ranks = malloc((size_t)n * sizeof(int));
  uint64_t *versions = malloc((size_t)n * sizeof(uint64_t));
  wg_blob_t *blob = wg_blob_new(wg_codec_result_size(c->count, n));
  if (!mean || !ranks || !versions || !blob) {
    /* The round is void for everybody: excluded answers, my contribution void. */
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "engine: out of memory finishing round %llu",
            (unsigned long long)lr->round);
    post_decision(c, lr, WG_RESULT_EXCLUDED, NULL, 0);
    if (i_contributed && mine && mine->state == WG_ENTRY_WAITING)
      wg_member_void(c, mine, "out of memory");
    goto out;
  }
  for (size_t k = 0; k < c->count; k++)
    mean[k] = (float)(lr->sum[k] / n);
  contributor_list(lr, ranks, versions);
  wg_codec_result_encode(blob->data, mean, c->count, n, ranks, versions);
  post_decision(c, lr, 0, blob, n); /* the RESULT, to every other contributor */
  if (lr->global)
    wg_engine_store_global(c, lr->round, mean);
  if (i_contributed && mine && mine->state == WG_ENTRY_WAITING)
    wg_member_resolve(c, mine, mean, lr->activator, lr->nmembers, n, ranks, versions);
out:
  wg_blob_unref(blob);
  free(mean);
  free(ranks);
  free(versions);
  retire(c, lr);
}

void wg_leader_tick(wagma_comm_t *c, double now) {
  wg_lround_t *lr = c->lrounds;
  while (lr) {
    wg_lround_t *next = lr->next;
    for (int i = 0; i < lr->nmembers; i++) {
      int m = lr->members[i];
      if (lr->expected[i] && !lr->contributed[i] && m != c->rank && !c->ops->peer_alive(c->tp, m))
        lr->expected[i] = 0;
    }
    /* My own contribution may be deferred: the round still ends at its deadline. */
    if (now >= lr->deadline || complete(lr))
      wg_leader_finalize(c, lr, now);
    lr = next;
  }
  data_tick(c, now);
}
