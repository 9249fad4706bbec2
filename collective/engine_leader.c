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
  lr->sum = calloc(c->count, sizeof(double));
  if (!lr->contributed || !lr->expected || !lr->versions || !lr->sum) {
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
  for (size_t k = 0; k < c->count; k++)
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
  memcpy(c->global_mean, mean, c->count * sizeof(float));
  c->global_round = round;
  c->have_global = 1;
}

/* Unlinks lr, remembers its round as finished and frees it. */
static void retire(wagma_comm_t *c, wg_lround_t *lr) {
  c->finished[c->finished_pos] = lr->round + 1;
  c->finished_pos = (c->finished_pos + 1) % WG_FINISHED_RING;
  for (wg_lround_t **p = &c->lrounds; *p; p = &(*p)->next) {
    if (*p == lr) {
      *p = lr->next;
      break;
    }
  }
  lround_free(lr);
  pthread_cond_broadcast(&c->cv);
}

void wg_leader_finalize(wagma_comm_t *c, wg_lround_t *lr, double now) {
  if (complete(lr))
    wg_engine_ewma(&c->ewma_leader, now - lr->created);
  for (int i = 0; i < lr->nmembers; i++)
    if (lr->expected[i] && !lr->contributed[i] && lr->members[i] != c->rank)
      c->suspect[lr->members[i]] = 1; /* missed the deadline: do not wait for it again */
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
    for (int i = 0; i < lr->nmembers; i++) {
      if (!lr->contributed[i] || lr->members[i] == c->rank)
        continue;
      wg_frame_header_t h = {0};
      h.kind = WG_FRAME_RESULT;
      h.round = lr->round;
      h.group = lr->group;
      h.flags = WG_RESULT_EXCLUDED;
      wg_outbox_post(c, lr->members[i], &h, NULL);
    }
    if (i_contributed && mine && mine->state == WG_ENTRY_WAITING)
      wg_member_void(c, mine, "out of memory");
    goto out;
  }
  for (size_t k = 0; k < c->count; k++)
    mean[k] = (float)(lr->sum[k] / n);
  int j = 0;
  for (int i = 0; i < lr->nmembers; i++) {
    if (!lr->contributed[i])
      continue;
    ranks[j] = lr->members[i];
    versions[j] = lr->versions[i];
    j++;
  }
  wg_codec_result_encode(blob->data, mean, c->count, n, ranks, versions);
  for (int i = 0; i < n; i++) {
    if (ranks[i] == c->rank)
      continue;
    wg_frame_header_t h = {0};
    h.kind = WG_FRAME_RESULT;
    h.round = lr->round;
    h.group = lr->group;
    h.seq = (uint64_t)(int64_t)lr->activator;
    h.aux = (uint64_t)n;
    h.flags = lr->global ? WG_RESULT_GLOBAL : 0;
    wg_outbox_post(c, ranks[i], &h, blob);
  }
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
}
