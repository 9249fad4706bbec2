/* engine_round.c — the round thread of the wait-avoiding engine, the leader side of group
 * and wait-avoiding global rounds, and the bookkeeping of my contributions ("entries").
 *
 * Owns: nothing of its own; works on struct wagma_comm (engine_internal.h) under comm->mu.
 *
 * Thread: wg_engine_round_main runs on the engine's round thread. It takes ACTIVATE,
 * CONTRIB, RESULT and CATCHUP_REQ frames out of the transport mailbox (COLL and CATCHUP_REP
 * frames are left for the compute thread), and finalizes leader rounds whose deadline passed.
 * It answers an activation at once with the latest snapshot, whatever the compute thread is
 * doing, so a slow worker's contribution never waits for its compute.
 *
 * Invariants:
 *  - A rank contributes at most once to a round (an entry exists from its contribution until
 *    the compute thread has passed the round), so each leader's sum of corrections is zero
 *    and the sum of all models is conserved, whichever leader each member chose.
 *  - A leader round's result goes to exactly its contributors; a contribution arriving after
 *    its round finished is answered with RESULT|EXCLUDED and gets no correction.
 *  - The round thread never frees an entry (the compute thread may be waiting on one); it
 *    only changes entry states. Leader rounds are created and freed under mu.
 *  - A contribution waiting on a leader that the transport marks dead (EOF, BYE, error) is
 *    dropped at the next tick once no RESULT of it is queued (a leader that finished and
 *    closed sent its RESULT before its BYE), so the compute thread stops waiting at once
 *    instead of at its deadline. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "wagma/log_internal.h"

#define ROUND_TICK_S 0.05
#define SAME_SNAPSHOT_WAIT_S 0.25

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
  return 1.5 * t + 0.1;
}

static void ewma_update(double *avg, double sample) {
  *avg = *avg == 0.0 ? sample : 0.8 * *avg + 0.2 * sample;
}

/* ---------------------------------------------------------------- entries */

wg_entry_t *wg_engine_entry_find(wagma_comm_t *c, uint64_t round) {
  for (wg_entry_t *e = c->entries; e; e = e->next)
    if (e->round == round)
      return e;
  return NULL;
}

void wg_engine_entry_free(wg_entry_t *e) {
  if (!e)
    return;
  free(e->delta);
  free(e->ranks);
  free(e->versions);
  free(e);
}

/* Ownership: the entry is linked into c->entries (sorted by round) and owned by c. */
wg_entry_t *wg_engine_entry_from_snapshot(wagma_comm_t *c, uint64_t round, uint32_t group,
                                          int global, int leader) {
  wg_entry_t *e = calloc(1, sizeof(*e));
  if (!e)
    return NULL;
  e->delta = malloc(c->count * sizeof(float));
  if (!e->delta) {
    free(e);
    return NULL;
  }
  pthread_mutex_lock(&c->snap_mu);
  int have = c->snap_have;
  if (have) {
    memcpy(e->delta, c->snap[c->snap_front], c->count * sizeof(float));
    e->version = c->snap_version;
    e->snap_seq = c->snap_seq;
  }
  pthread_mutex_unlock(&c->snap_mu);
  if (!have) {
    wg_engine_entry_free(e);
    return NULL;
  }
  e->round = round;
  e->group = group;
  e->global = global;
  e->state = WG_ENTRY_WAITING;
  e->leader = leader;
  e->activator = -1;
  e->created = wg_now();
  wg_entry_t **p = &c->entries;
  while (*p && (*p)->round < round)
    p = &(*p)->next;
  e->next = *p;
  *p = e;
  return e;
}

static void store_global_mean(wagma_comm_t *c, uint64_t round, const float *mean) {
  if (c->have_global && c->global_round >= round)
    return;
  memcpy(c->global_mean, mean, c->count * sizeof(float));
  c->global_round = round;
  c->have_global = 1;
}

void wg_engine_entry_resolve(wagma_comm_t *c, wg_entry_t *e, const float *mean, int activator,
                             int members, int ncontrib, const int *ranks,
                             const uint64_t *versions) {
  e->ranks = malloc((size_t)(ncontrib > 0 ? ncontrib : 1) * sizeof(int));
  e->versions = malloc((size_t)(ncontrib > 0 ? ncontrib : 1) * sizeof(uint64_t));
  if (!e->ranks || !e->versions) {
    free(e->ranks);
    free(e->versions);
    e->ranks = NULL;
    e->versions = NULL;
    ncontrib = 0;
  } else {
    memcpy(e->ranks, ranks, (size_t)ncontrib * sizeof(int));
    memcpy(e->versions, versions, (size_t)ncontrib * sizeof(uint64_t));
  }
  for (size_t i = 0; i < c->count; i++)
    e->delta[i] = mean[i] - e->delta[i];
  e->state = WG_ENTRY_RESOLVED;
  e->activator = activator;
  e->members = members;
  e->ncontrib = ncontrib;
  if (activator == c->rank)
    c->counters.rounds_activated++;
  if (e->global)
    store_global_mean(c, e->round, mean);
  /* The snapshot I contributed is still the latest: it becomes the mean (C + delta), so a
   * later activation gets the averaged model, not the same stale one again. */
  pthread_mutex_lock(&c->snap_mu);
  if (c->snap_have && !c->snap_publishing && c->snap_seq == e->snap_seq) {
    int back = 1 - c->snap_front;
    memcpy(c->snap[back], mean, c->count * sizeof(float));
    c->snap_front = back;
    c->snap_version = e->round;
    c->snap_seq++;
  }
  pthread_mutex_unlock(&c->snap_mu);
  pthread_cond_broadcast(&c->cv);
}

/* ---------------------------------------------------------------- leader rounds */

wg_lround_t *wg_engine_lround_find(wagma_comm_t *c, uint64_t round) {
  for (wg_lround_t *lr = c->lrounds; lr; lr = lr->next)
    if (lr->round == round)
      return lr;
  return NULL;
}

int wg_engine_finished(const wagma_comm_t *c, uint64_t round) {
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

static int member_index(const wg_lround_t *lr, int rank) {
  for (int i = 0; i < lr->nmembers; i++)
    if (lr->members[i] == rank)
      return i;
  return -1;
}

/* Ownership: the leader round is linked into c->lrounds and owned by c. */
wg_lround_t *wg_engine_lround_start(wagma_comm_t *c, uint64_t round, uint32_t group, int global,
                                    int activator) {
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
  lr->global = global;
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
    h.src = (uint32_t)c->rank;
    if (c->ops->send(c->tp, m, &h, NULL, 0) == 0 && !c->suspect[m])
      lr->expected[i] = 1;
  }
  lr->next = c->lrounds;
  c->lrounds = lr;
  return lr;
}

static int lround_complete(const wg_lround_t *lr) {
  for (int i = 0; i < lr->nmembers; i++)
    if (lr->expected[i] && !lr->contributed[i])
      return 0;
  return 1;
}

void wg_engine_lround_add(wagma_comm_t *c, wg_lround_t *lr, int src, uint64_t version,
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
  if (lround_complete(lr))
    wg_engine_lround_finalize(c, lr, wg_now());
}

/* Sends the mean to every contributor, resolves my own entry, and frees lr. */
void wg_engine_lround_finalize(wagma_comm_t *c, wg_lround_t *lr, double now) {
  int complete = lround_complete(lr);
  if (complete)
    ewma_update(&c->ewma_leader, now - lr->created);
  for (int i = 0; i < lr->nmembers; i++)
    if (lr->expected[i] && !lr->contributed[i] && lr->members[i] != c->rank)
      c->suspect[lr->members[i]] = 1; /* missed the deadline: do not wait for it again */
  int n = lr->ncontrib;
  if (n > 0) {
    size_t fbytes = c->count * sizeof(float);
    size_t len = fbytes + (size_t)n * (sizeof(int32_t) + sizeof(uint64_t));
    uint8_t *payload = malloc(len);
    int *ranks = malloc((size_t)n * sizeof(int));
    uint64_t *versions = malloc((size_t)n * sizeof(uint64_t));
    if (payload && ranks && versions) {
      float *mean = (float *)payload;
      for (size_t k = 0; k < c->count; k++)
        mean[k] = (float)(lr->sum[k] / n);
      int j = 0;
      for (int i = 0; i < lr->nmembers; i++) {
        if (!lr->contributed[i])
          continue;
        ranks[j] = lr->members[i];
        versions[j] = lr->versions[i];
        int32_t r32 = lr->members[i];
        memcpy(payload + fbytes + (size_t)j * sizeof(int32_t), &r32, sizeof(r32));
        memcpy(payload + fbytes + (size_t)n * sizeof(int32_t) + (size_t)j * sizeof(uint64_t),
               &versions[j], sizeof(uint64_t));
        j++;
      }
      for (int i = 0; i < n; i++) {
        if (ranks[i] == c->rank)
          continue;
        wg_frame_header_t h = {0};
        h.kind = WG_FRAME_RESULT;
        h.round = lr->round;
        h.group = lr->group;
        h.src = (uint32_t)c->rank;
        h.seq = (uint64_t)(int64_t)lr->activator;
        h.aux = (uint64_t)n;
        h.flags = lr->global ? WG_RESULT_GLOBAL : 0;
        (void)c->ops->send(c->tp, ranks[i], &h, payload, len);
      }
      wg_entry_t *mine = wg_engine_entry_find(c, lr->round);
      if (member_index(lr, c->rank) >= 0 && lr->contributed[member_index(lr, c->rank)] && mine &&
          mine->state == WG_ENTRY_WAITING)
        wg_engine_entry_resolve(c, mine, mean, lr->activator, lr->nmembers, n, ranks, versions);
      else if (lr->global)
        store_global_mean(c, lr->round, mean);
    } else {
      wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "engine: out of memory finishing round %llu",
              (unsigned long long)lr->round);
    }
    free(payload);
    free(ranks);
    free(versions);
  }
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

/* Finalizes leader rounds that are complete (dead members no longer expected) or late. */
static void lrounds_tick(wagma_comm_t *c, double now) {
  wg_lround_t *lr = c->lrounds;
  while (lr) {
    wg_lround_t *next = lr->next;
    for (int i = 0; i < lr->nmembers; i++) {
      int m = lr->members[i];
      if (lr->expected[i] && !lr->contributed[i] && m != c->rank && !c->ops->peer_alive(c->tp, m))
        lr->expected[i] = 0;
    }
    if (now >= lr->deadline || lround_complete(lr))
      wg_engine_lround_finalize(c, lr, now);
    lr = next;
  }
}

/* ---------------------------------------------------------------- frame handlers */

static void note_peer(wagma_comm_t *c, int src, uint64_t round) {
  c->suspect[src] = 0;
  if (round > c->highest_seen && round != UINT64_MAX) {
    c->highest_seen = round;
    c->highest_src = src;
  }
}

/* 1 if src belongs to my group of round (group index g). (mu) */
static int same_group(wagma_comm_t *c, uint64_t round, uint32_t g, int src) {
  const int *ranks = NULL;
  uint32_t mine = 0;
  int n = wg_engine_group_of(c, round, c->rank, &mine, &ranks);
  if (n <= 0 || mine != g)
    return 0;
  for (int i = 0; i < n; i++)
    if (ranks[i] == src)
      return 1;
  return 0;
}

static void handle_result(wagma_comm_t *c, wg_message_t *m);

/* Before answering an activation with the snapshot that an unresolved contribution of mine
 * already carries, wait briefly for that result: contributing one snapshot to two rounds
 * would apply two corrections against it and overshoot. Drops and retakes mu. */
static void settle_same_snapshot(wagma_comm_t *c) {
  double until = wg_now() + SAME_SNAPSHOT_WAIT_S;
  for (int tries = 0; tries < 4 && !c->stopping; tries++) {
    pthread_mutex_lock(&c->snap_mu);
    uint64_t seq = c->snap_seq;
    pthread_mutex_unlock(&c->snap_mu);
    wg_entry_t *e = NULL;
    for (wg_entry_t *x = c->entries; x; x = x->next)
      if (x->state == WG_ENTRY_WAITING && x->snap_seq == seq && x->leader != c->rank)
        e = x;
    if (!e || wg_now() >= until)
      return;
    wg_match_t match;
    wg_match_any(&match);
    match.kinds = 1u << WG_FRAME_RESULT;
    match.round = e->round;
    match.src = (uint64_t)e->leader;
    pthread_mutex_unlock(&c->mu);
    wg_message_t *m = NULL;
    int rc = c->ops->recv(c->tp, &match, until, &m);
    if (rc == 0) {
      handle_result(c, m);
      wg_message_free(m);
    }
    pthread_mutex_lock(&c->mu);
    if (rc != 0)
      return;
  }
}

int wg_engine_send_contrib(wagma_comm_t *c, int dst, uint64_t round, uint32_t group,
                           const wg_entry_t *e) {
  wg_frame_header_t h = {0};
  h.kind = WG_FRAME_CONTRIB;
  h.round = round;
  h.group = group;
  h.src = (uint32_t)c->rank;
  if (!e) {
    h.flags = WG_CONTRIB_DECLINE;
    return c->ops->send(c->tp, dst, &h, NULL, 0);
  }
  h.aux = e->version;
  return c->ops->send(c->tp, dst, &h, e->delta, c->count * sizeof(float));
}

/* Answers an activation of (round, group) from leader src with my latest snapshot, unless I
 * contributed already, passed the round, or my snapshot is too stale. (mu) */
static void contribute(wagma_comm_t *c, uint64_t round, uint32_t group, int src) {
  if (c->stopping || round < atomic_load(&c->cur_round) || wg_engine_entry_find(c, round))
    return;
  pthread_mutex_lock(&c->snap_mu);
  int have = c->snap_have;
  uint64_t version = c->snap_version;
  pthread_mutex_unlock(&c->snap_mu);
  if (!have || wg_engine_staleness(round, version) > c->tau)
    return;
  wg_entry_t *e =
      wg_engine_entry_from_snapshot(c, round, group, wg_engine_is_global(c, round), src);
  if (!e)
    return;
  e->by_round_thread = 1;
  c->counters.rounds_joined++;
  if (src == c->rank) {
    wg_lround_t *lr = wg_engine_lround_find(c, round);
    if (lr)
      wg_engine_lround_add(c, lr, c->rank, e->version, e->delta);
    else
      e->state = WG_ENTRY_DROPPED;
    return;
  }
  if (wg_engine_send_contrib(c, src, round, group, e) != 0) {
    e->state = WG_ENTRY_DROPPED; /* never reached the leader: no correction will come */
    free(e->delta);
    e->delta = NULL;
    c->counters.rounds_joined--;
  }
}

/* Once my first snapshot exists: answer deferred activations, and contribute to the global
 * rounds I lead that wait for me. (mu) */
static void answer_deferred(wagma_comm_t *c) {
  pthread_mutex_lock(&c->snap_mu);
  int have = c->snap_have;
  pthread_mutex_unlock(&c->snap_mu);
  if (!have)
    return;
  for (int i = 0; i < c->ndeferred; i++)
    contribute(c, c->deferred[i].round, c->deferred[i].group, c->deferred[i].src);
  c->ndeferred = 0;
  for (wg_lround_t *lr = c->lrounds; lr;) {
    wg_lround_t *next = lr->next;
    int me = member_index(lr, c->rank);
    if (lr->global && me >= 0 && lr->expected[me] && !lr->contributed[me] &&
        !wg_engine_entry_find(c, lr->round))
      contribute(c, lr->round, lr->group, c->rank); /* may finalize and free lr */
    lr = next;
  }
}

static void handle_activate(wagma_comm_t *c, wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  int src = (int)h->src;
  pthread_mutex_lock(&c->mu);
  note_peer(c, src, h->round);
  if (c->stopping || !same_group(c, h->round, h->group, src))
    goto out;
  if (h->round < atomic_load(&c->cur_round) || wg_engine_entry_find(c, h->round))
    goto out; /* I contributed to it already, or jumped past it */
  pthread_mutex_lock(&c->snap_mu);
  int have = c->snap_have;
  uint64_t version = c->snap_version;
  pthread_mutex_unlock(&c->snap_mu);
  if (!have && wg_engine_is_global(c, h->round)) {
    /* Still computing my first round: a global round must not leave me out (I would have to
     * catch up), so answer as soon as my first snapshot exists. */
    if (c->ndeferred < (int)(sizeof(c->deferred) / sizeof(c->deferred[0]))) {
      c->deferred[c->ndeferred].round = h->round;
      c->deferred[c->ndeferred].group = h->group;
      c->deferred[c->ndeferred].src = src;
      c->ndeferred++;
    }
    goto out;
  }
  if (!have && h->round > c->plan.start_round) {
    /* Still computing my first round: tell the leader of a group round not to wait for me.
     * At the first round of the epoch the leader waits (bounded) for my compute instead. */
    (void)wg_engine_send_contrib(c, src, h->round, h->group, NULL);
    goto out;
  }
  if (!have || wg_engine_staleness(h->round, version) > c->tau)
    goto out; /* nothing yet, or too stale to contribute: catch-up will fix it */
  settle_same_snapshot(c);
  contribute(c, h->round, h->group, src);
out:
  pthread_mutex_unlock(&c->mu);
}

static void send_excluded(wagma_comm_t *c, const wg_frame_header_t *h) {
  wg_frame_header_t out = {0};
  out.kind = WG_FRAME_RESULT;
  out.round = h->round;
  out.group = h->group;
  out.src = (uint32_t)c->rank;
  out.flags = WG_RESULT_EXCLUDED;
  (void)c->ops->send(c->tp, (int)h->src, &out, NULL, 0);
}

static void handle_contrib(wagma_comm_t *c, wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  int src = (int)h->src;
  pthread_mutex_lock(&c->mu);
  note_peer(c, src, h->round);
  if (c->stopping)
    goto out;
  if (h->flags & WG_CONTRIB_DECLINE) {
    wg_lround_t *open = wg_engine_lround_find(c, h->round);
    int i = open ? member_index(open, src) : -1;
    if (i >= 0 && !open->contributed[i]) {
      open->expected[i] = 0;
      if (lround_complete(open))
        wg_engine_lround_finalize(c, open, wg_now());
    }
    goto out;
  }
  if (h->length != c->count * sizeof(float) || !same_group(c, h->round, h->group, src)) {
    c->counters.frames_rejected++;
    goto out;
  }
  int global = wg_engine_is_global(c, h->round);
  wg_lround_t *lr = wg_engine_lround_find(c, h->round);
  if (!lr) {
    if (wg_engine_finished(c, h->round)) {
      send_excluded(c, h);
      goto out;
    }
    lr = wg_engine_lround_start(c, h->round, h->group, global, src);
    if (!lr) {
      send_excluded(c, h);
      goto out;
    }
    /* My own contribution: the latest snapshot, unless I contributed already (elsewhere),
     * passed the round, or am too stale; with no snapshot yet my compute brings it. */
    int me = member_index(lr, c->rank);
    uint64_t cur = atomic_load(&c->cur_round);
    if (!wg_engine_entry_find(c, h->round) && h->round >= cur) {
      pthread_mutex_lock(&c->snap_mu);
      int have = c->snap_have;
      uint64_t version = c->snap_version;
      pthread_mutex_unlock(&c->snap_mu);
      if (have && wg_engine_staleness(h->round, version) <= c->tau) {
        wg_entry_t *e = wg_engine_entry_from_snapshot(c, h->round, h->group, global, c->rank);
        if (e) {
          e->by_round_thread = 1;
          c->counters.rounds_joined++;
          wg_engine_lround_add(c, lr, c->rank, e->version, e->delta);
        } else {
          lr->expected[me] = 0;
        }
      } else if (have || (h->round > c->plan.start_round && !global)) {
        lr->expected[me] = 0; /* a global round waits for my first snapshot (deferred) */
      }
    } else {
      lr->expected[me] = 0;
    }
  }
  wg_engine_lround_add(c, lr, src, h->aux, (const float *)m->payload);
out:
  pthread_mutex_unlock(&c->mu);
}

static void resolve_from_frame(wagma_comm_t *c, wg_entry_t *e, const wg_message_t *m, int n) {
  const wg_frame_header_t *h = &m->header;
  size_t fbytes = c->count * sizeof(float);
  int ranks[n];
  uint64_t versions[n];
  for (int i = 0; i < n; i++) {
    int32_t r32;
    memcpy(&r32, m->payload + fbytes + (size_t)i * sizeof(int32_t), sizeof(r32));
    memcpy(&versions[i],
           m->payload + fbytes + (size_t)n * sizeof(int32_t) + (size_t)i * sizeof(uint64_t),
           sizeof(uint64_t));
    if (r32 < 0 || r32 >= c->nranks) {
      c->counters.frames_rejected++;
      return;
    }
    ranks[i] = r32;
  }
  const int *gr = NULL;
  uint32_t g = 0;
  int members = wg_engine_group_of(c, h->round, c->rank, &g, &gr);
  int activator = (int)(int64_t)h->seq;
  if (activator < -1 || activator >= c->nranks)
    activator = -1;
  wg_engine_entry_resolve(c, e, (const float *)m->payload, activator, members, n, ranks, versions);
}

static void handle_result(wagma_comm_t *c, wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  pthread_mutex_lock(&c->mu);
  note_peer(c, (int)h->src, h->round);
  wg_entry_t *e = wg_engine_entry_find(c, h->round);
  if (!e || e->state != WG_ENTRY_WAITING)
    goto out; /* late or duplicate */
  if (h->flags & WG_RESULT_EXCLUDED) {
    e->state = WG_ENTRY_DROPPED;
    free(e->delta);
    e->delta = NULL;
    c->counters.rounds_left_out++;
    pthread_cond_broadcast(&c->cv);
    goto out;
  }
  uint64_t n = h->aux;
  size_t fbytes = c->count * sizeof(float);
  if (n == 0 || n > (uint64_t)c->nranks ||
      h->length != fbytes + n * (sizeof(int32_t) + sizeof(uint64_t))) {
    c->counters.frames_rejected++;
    goto out;
  }
  resolve_from_frame(c, e, m, (int)n);
out:
  pthread_mutex_unlock(&c->mu);
}

static void handle_catchup_req(wagma_comm_t *c, wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  pthread_mutex_lock(&c->mu);
  c->suspect[h->src] = 0;
  wg_frame_header_t out = {0};
  out.kind = WG_FRAME_CATCHUP_REP;
  out.src = (uint32_t)c->rank;
  out.seq = h->seq;
  out.aux = atomic_load(&c->cur_round);
  if (c->have_global) {
    out.round = c->global_round;
    (void)c->ops->send(c->tp, (int)h->src, &out, c->global_mean, c->count * sizeof(float));
  } else {
    out.flags = WG_CATCHUP_NONE;
    (void)c->ops->send(c->tp, (int)h->src, &out, NULL, 0);
  }
  pthread_mutex_unlock(&c->mu);
}

/* Drops my contributions whose leader is dead with no RESULT from it queued: none will come.
 * A queued RESULT is handled instead. Takes and drops mu. */
static void drop_orphans(wagma_comm_t *c) {
  pthread_mutex_lock(&c->mu);
  for (int handled = 0; handled < 64 && !c->stopping;) {
    wg_entry_t *e = c->entries;
    while (e && !(e->state == WG_ENTRY_WAITING && e->leader != c->rank &&
                  !c->ops->peer_alive(c->tp, e->leader)))
      e = e->next;
    if (!e)
      break;
    wg_match_t match;
    wg_match_any(&match);
    match.src = (uint64_t)e->leader;
    match.kinds = 1u << WG_FRAME_RESULT;
    match.round = e->round;
    wg_message_t *m = NULL;
    int rc = c->ops->recv(c->tp, &match, 0.0, &m);
    if (rc == 0) {
      pthread_mutex_unlock(&c->mu);
      handle_result(c, m);
      wg_message_free(m);
      pthread_mutex_lock(&c->mu);
      handled++;
      continue; /* the list may have changed meanwhile: look again from its head */
    }
    if (rc != WAGMA_EPEER)
      break; /* interrupted, or the transport does not report dead sources */
    e->state = WG_ENTRY_DROPPED;
    free(e->delta);
    e->delta = NULL;
    c->counters.rounds_left_out++;
    pthread_cond_broadcast(&c->cv);
    wg_logf(c->log, c->log_user, WAGMA_LOG_INFO,
            "engine: rank %d: leader %d of round %llu is gone: no correction", c->rank, e->leader,
            (unsigned long long)e->round);
  }
  pthread_mutex_unlock(&c->mu);
}

void *wg_engine_round_main(void *arg) {
  wagma_comm_t *c = arg;
  wg_match_t match;
  wg_match_any(&match);
  match.kinds = (1u << WG_FRAME_ACTIVATE) | (1u << WG_FRAME_CONTRIB) | (1u << WG_FRAME_RESULT) |
                (1u << WG_FRAME_CATCHUP_REQ);
  for (;;) {
    pthread_mutex_lock(&c->mu);
    if (c->stopping) {
      pthread_mutex_unlock(&c->mu);
      break;
    }
    double deadline = wg_now() + ROUND_TICK_S;
    for (wg_lround_t *lr = c->lrounds; lr; lr = lr->next)
      if (lr->deadline < deadline)
        deadline = lr->deadline;
    pthread_mutex_unlock(&c->mu);

    wg_message_t *m = NULL;
    int rc = c->ops->recv(c->tp, &match, deadline, &m);
    if (rc == WAGMA_ECLOSED)
      break;
    if (rc == 0) {
      switch (m->header.kind) {
      case WG_FRAME_ACTIVATE: handle_activate(c, m); break;
      case WG_FRAME_CONTRIB: handle_contrib(c, m); break;
      case WG_FRAME_RESULT: handle_result(c, m); break;
      case WG_FRAME_CATCHUP_REQ: handle_catchup_req(c, m); break;
      default: break;
      }
      wg_message_free(m);
    }
    pthread_mutex_lock(&c->mu);
    answer_deferred(c);
    lrounds_tick(c, wg_now());
    pthread_mutex_unlock(&c->mu);
    drop_orphans(c);
  }
  return NULL;
}
