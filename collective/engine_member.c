/* engine_member.c — my side of the rounds: the contributions I make (entries), the rule that
 * at most one of them is outstanding, the activations I defer until I may contribute, and the
 * compute thread's group round.
 *
 * Owns: comm->entries, comm->outstanding, comm->deferred.
 * Threads: the round thread (activations, results) and the compute thread (its own arrival),
 * always under comm->mu; wg_member_group_round takes and releases it.
 *
 * Rules (docs/design.md, "The engine"):
 *  - One outstanding contribution: I contribute only while none of mine waits for its result.
 *    The snapshot it carried stays pinned until its round a ends; an activation of a later
 *    round arriving meanwhile is deferred and answered once a ended, with the snapshot that
 *    then contains its correction; an activation of an earlier round is declined. So no
 *    snapshot goes into two rounds, on any path, and waits only run from a round to earlier
 *    ones: no two rounds wait for each other (no cycle for a deadline to break).
 *  - A round ends the same way for all its contributors: a waiting contribution ends only by
 *    the leader's word (RESULT: applied; EXCLUDED: void) or by the leader's death as the
 *    transport reports it (void: the leader's own model leaves the job with it). There is no
 *    timer that drops it while the leader lives, so a late RESULT is always applied.
 *  - Resolving and voiding never answer deferred activations themselves (callers may be in
 *    the middle of walking the leader rounds); the round thread and the compute thread call
 *    wg_member_answer_deferred at points where no list is being walked. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "wagma/log_internal.h"

wg_entry_t *wg_member_entry(wagma_comm_t *c, uint64_t round) {
  for (wg_entry_t *e = c->entries; e; e = e->next)
    if (e->round == round)
      return e;
  return NULL;
}

void wg_member_entry_free(wg_entry_t *e) {
  if (!e)
    return;
  free(e->ranks);
  free(e->versions);
  free(e);
}

void wg_member_prune(wagma_comm_t *c, uint64_t cur) {
  wg_entry_t **p = &c->entries;
  while (*p) {
    wg_entry_t *e = *p;
    if ((e->state == WG_ENTRY_APPLIED || e->state == WG_ENTRY_VOID) && e->round < cur &&
        !e->sending) {
      *p = e->next;
      wg_member_entry_free(e);
      continue;
    }
    p = &e->next;
  }
}

/* Ownership: the entry is linked into c->entries (sorted by round) and owned by c. */
wg_entry_t *wg_member_contribute(wagma_comm_t *c, uint64_t round, uint32_t group, int leader,
                                 int by_round_thread) {
  wg_entry_t *e = calloc(1, sizeof(*e));
  if (!e)
    return NULL;
  e->round = round;
  e->group = group;
  e->global = wg_engine_is_global(c, round);
  e->state = WG_ENTRY_WAITING;
  e->version = c->snap.version;
  e->leader = leader;
  e->activator = -1;
  wg_entry_t **p = &c->entries;
  while (*p && (*p)->round < round)
    p = &(*p)->next;
  e->next = *p;
  *p = e;
  c->snap.pinned = c->snap.front;
  c->outstanding = e;
  if (by_round_thread)
    c->counters.rounds_joined++;
  if (leader == c->rank) {
    wg_lround_t *lr = wg_leader_find(c, round);
    if (lr) /* (an allreduce round moves no data through its leader) */
      wg_leader_add(c, lr, c->rank, e->version,
                    c->rounds_allreduce ? NULL : c->snap.buf[c->snap.pinned]);
    else
      wg_member_void(c, e, "my round is closed");
    return e;
  }
  if (c->rounds_allreduce) { /* JOIN: a CONTRIB without the snapshot */
    wg_frame_header_t h = {0};
    h.kind = WG_FRAME_CONTRIB;
    h.round = round;
    h.group = group;
    h.aux = e->version;
    wg_outbox_post(c, leader, &h, NULL);
    return e;
  }
  wg_outbox_post_contrib(c, e);
  return e;
}

/* Copies of n ranks and versions into e's arrays (replacing them; the arguments may be e's
 * own). 0 or WAGMA_ENOMEM (e keeps its old arrays). */
static int set_list(wg_entry_t *e, int n, const int *ranks, const uint64_t *versions) {
  int *r = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
  uint64_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint64_t));
  if (!r || !v) {
    free(r);
    free(v);
    return WAGMA_ENOMEM;
  }
  memcpy(r, ranks, (size_t)n * sizeof(int));
  memcpy(v, versions, (size_t)n * sizeof(uint64_t));
  free(e->ranks);
  free(e->versions);
  e->ranks = r;
  e->versions = v;
  e->ncontrib = n;
  return 0;
}

int wg_member_go(wagma_comm_t *c, wg_entry_t *e, int activator, int members, int n,
                 const int *ranks, const uint64_t *versions, int coll) {
  if (e->state != WG_ENTRY_WAITING || e->go)
    return 0;
  if (set_list(e, n, ranks, versions) != 0)
    return WAGMA_ENOMEM;
  e->go = 1;
  e->coll = coll;
  e->activator = activator;
  e->members = members;
  pthread_cond_broadcast(&c->cv); /* the data thread */
  return 0;
}

void wg_member_resolve(wagma_comm_t *c, wg_entry_t *e, const float *mean, int activator,
                       int members, int ncontrib, const int *ranks, const uint64_t *versions) {
  if (e->state != WG_ENTRY_WAITING)
    return;
  if (set_list(e, ncontrib, ranks, versions) != 0) {
    free(e->ranks);
    free(e->versions);
    e->ranks = NULL;
    e->versions = NULL;
    ncontrib = 0;
  }
  wg_snapshot_resolve(c, mean, e->round, e->global);
  e->state = WG_ENTRY_RESOLVED;
  e->activator = activator;
  e->members = members;
  e->ncontrib = ncontrib;
  if (activator == c->rank)
    c->counters.rounds_activated++;
  if (e->global)
    wg_engine_store_global(c, e->round, mean);
  if (c->outstanding == e)
    c->outstanding = NULL;
  pthread_cond_broadcast(&c->cv);
}

void wg_member_void(wagma_comm_t *c, wg_entry_t *e, const char *why) {
  if (e->state != WG_ENTRY_WAITING)
    return;
  e->state = WG_ENTRY_VOID;
  if (e->global && c->jump_global == e->round + 1 && c->model_global == e->round + 1) {
    /* a step jumped over this global round counting on its correction, which will not come:
     * the model does not include its mean (the next step catches up) */
    c->model_global = c->model_global_before_jump;
    c->jump_global = 0;
  }
  if (c->outstanding == e) {
    c->outstanding = NULL;
    wg_snapshot_unpin(c);
  }
  c->counters.rounds_left_out++;
  pthread_cond_broadcast(&c->cv);
  wg_logf(c->log, c->log_user, WAGMA_LOG_DEBUG, "engine: rank %d: round %llu void for me: %s",
          c->rank, (unsigned long long)e->round, why);
}

void wg_member_decline(wagma_comm_t *c, uint64_t round, uint32_t group, int leader) {
  if (leader == c->rank) {
    wg_lround_t *lr = wg_leader_find(c, round);
    if (lr)
      wg_leader_release(c, lr, c->rank);
    return;
  }
  wg_frame_header_t h = {0};
  h.kind = WG_FRAME_CONTRIB;
  h.round = round;
  h.group = group;
  h.flags = WG_CONTRIB_DECLINE;
  wg_outbox_post(c, leader, &h, NULL);
}

static void defer(wagma_comm_t *c, uint64_t round, uint32_t group, int leader, double wait_s) {
  for (int i = 0; i < c->ndeferred; i++)
    if (c->deferred[i].round == round)
      return;
  if (c->ndeferred == WG_DEFERRED_MAX) {
    wg_member_decline(c, round, group, leader);
    return;
  }
  wg_deferred_t *d = &c->deferred[c->ndeferred++];
  d->round = round;
  d->group = group;
  d->leader = leader;
  d->expires = wg_now() + wait_s;
}

void wg_member_activated(wagma_comm_t *c, uint64_t round, uint32_t group, int leader) {
  if (c->stopping)
    return;
  wg_entry_t *e = wg_member_entry(c, round);
  if (e && e->leader == leader)
    return; /* my contribution is with this leader already */
  if (e || round < atomic_load(&c->cur_round)) {
    /* Contributed elsewhere, or passed the round (maybe declined it before this leader
     * opened it, and a DECLINE to a round not open yet is not kept): don't wait for me. */
    wg_member_decline(c, round, group, leader);
    return;
  }
  int global = wg_engine_is_global(c, round);
  if (c->snap.front < 0) {
    /* Still computing my first round. A global round must not leave me out (I would have to
     * catch up), nor the epoch's first round: the leader waits for my first snapshot, as long
     * as its deadline allows. A later group round: don't wait for me. */
    if (global || round <= c->plan.start_round)
      defer(c, round, group, leader, global ? c->global_timeout_s : wg_engine_leader_timeout(c));
    else
      wg_member_decline(c, round, group, leader);
    return;
  }
  if (wg_engine_staleness(round, c->snap.version) > c->tau) {
    wg_member_decline(c, round, group, leader); /* too stale: catch-up will fix me */
    return;
  }
  if (!wg_snapshot_available(c)) {
    /* My contribution to another round a is outstanding. A later round waits for a to end
     * (deferred); an earlier one is declined at once. So a chain of waits always runs to
     * lower rounds and ends: two rounds never wait for each other. */
    if (c->outstanding && round < c->outstanding->round)
      wg_member_decline(c, round, group, leader);
    else
      defer(c, round, group, leader, 2.0 * wg_engine_leader_timeout(c));
    return;
  }
  if (!wg_member_contribute(c, round, group, leader, 1) && leader == c->rank) {
    wg_lround_t *lr = wg_leader_find(c, round);
    if (lr)
      wg_leader_release(c, lr, c->rank);
  }
}

void wg_member_answer_deferred(wagma_comm_t *c) {
  double now = wg_now();
  uint64_t cur = atomic_load(&c->cur_round);
  for (;;) {
    /* Drop what is over; pick the oldest round that can be answered now. */
    int best = -1;
    for (int i = 0; i < c->ndeferred;) {
      wg_deferred_t *d = &c->deferred[i];
      int mine_closed = d->leader == c->rank && !wg_leader_find(c, d->round);
      if (d->round < cur || wg_member_entry(c, d->round) || mine_closed || now >= d->expires) {
        if (now >= d->expires && d->round >= cur && !wg_member_entry(c, d->round) && !mine_closed)
          wg_member_decline(c, d->round, d->group, d->leader);
        c->deferred[i] = c->deferred[--c->ndeferred];
        continue;
      }
      if (best < 0 || d->round < c->deferred[best].round)
        best = i;
      i++;
    }
    if (best < 0 || !wg_snapshot_available(c) || c->stopping)
      return;
    wg_deferred_t d = c->deferred[best];
    c->deferred[best] = c->deferred[--c->ndeferred];
    wg_member_activated(c, d.round, d.group, d.leader);
    if (!wg_snapshot_available(c))
      return; /* contributed: the rest waits for this one */
  }
}

void wg_member_stats(const wagma_comm_t *c, const wg_entry_t *e, wagma_round_stats_t *st) {
  (void)c;
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
}

/* Waits (mu held) until e leaves WAITING or deadline; returns WAGMA_ECLOSED on stop. */
static int wait_entry(wagma_comm_t *c, wg_entry_t *e, double deadline) {
  while (e->state == WG_ENTRY_WAITING && !c->stopping && wg_now() < deadline)
    wg_engine_wait(c, deadline);
  return c->stopping ? WAGMA_ECLOSED : 0;
}

/* Takes the result of e if its round ended, for the stats of this step. */
static void finish_stats(wagma_comm_t *c, wg_entry_t *e, wagma_round_stats_t *st) {
  if (e->state == WG_ENTRY_RESOLVED || e->state == WG_ENTRY_APPLIED)
    wg_member_stats(c, e, st);
  else if (e->state == WG_ENTRY_VOID)
    st->left_out = st->members;
}

/* The compute thread arrives at group round r: model was just published (version r or
 * newer). Leaves every correction known by the end in model. */
int wg_member_group_round(wagma_comm_t *c, float *model, uint64_t r, int global,
                          wagma_round_stats_t *st) {
  int rc = 0;
  pthread_mutex_lock(&c->mu);
  const int *ranks = NULL;
  uint32_t g = 0;
  int n = wg_engine_group_of(c, r, c->rank, &g, &ranks);
  st->group = global ? 0 : (int)g;
  st->members = n > 0 ? n : 0;
  if (n <= 1) {
    st->contributors = 1;
    st->ncontrib = 1;
    st->contributor_rank[0] = c->rank;
    st->activator = c->rank;
    goto out;
  }
  double t0 = wg_now();
  double deadline = t0 + wg_engine_member_timeout(c);
  wg_entry_t *e = wg_member_entry(c, r);
  /* Another contribution of mine is outstanding: wait (bounded) for its round to end. The
   * round thread may meanwhile answer an activation of r for me. */
  while (!e && c->outstanding && c->outstanding->round < r && !c->stopping && wg_now() < deadline) {
    wg_engine_wait(c, deadline);
    e = wg_member_entry(c, r);
  }
  if (c->stopping) {
    rc = WAGMA_ECLOSED;
    goto out;
  }
  if (!e) {
    int leader = wg_leader_find(c, r) ? c->rank : wg_engine_leader_of(c, ranks, n);
    if (!wg_snapshot_available(c) || (leader == c->rank && wg_leader_finished(c, r))) {
      /* Still outstanding elsewhere (its leader is slow), or my round ended without me. */
      if (!wg_leader_finished(c, r))
        wg_member_decline(c, r, g, leader);
      st->left_out = st->members;
      c->counters.rounds_left_out++;
      goto out;
    }
    if (leader == c->rank && !wg_leader_find(c, r) && !wg_leader_open(c, r, g, c->rank)) {
      rc = WAGMA_ENOMEM;
      goto out;
    }
    e = wg_member_contribute(c, r, g, leader, 0);
    if (!e) {
      rc = WAGMA_ENOMEM;
      goto out;
    }
  } else if (!(e->state == WG_ENTRY_WAITING && e->version >= r)) {
    /* My round thread contributed an older snapshot to r: its correction comes with a later
     * step. */
    finish_stats(c, e, st);
    goto out;
  }
  /* My newest snapshot is in round r: wait (bounded) for the round to end. */
  pthread_mutex_unlock(&c->mu);
  wg_outbox_flush(c);
  pthread_mutex_lock(&c->mu);
  if (wait_entry(c, e, deadline) == WAGMA_ECLOSED) {
    rc = WAGMA_ECLOSED;
    goto out;
  }
  if (e->state == WG_ENTRY_RESOLVED) {
    wg_engine_ewma(&c->ewma_member, wg_now() - t0);
    finish_stats(c, e, st);
  } else if (e->state == WG_ENTRY_VOID) {
    st->left_out = st->members;
  } else if (e->leader != c->rank) {
    /* Still waiting: the result will be applied whenever it comes; pick another leader next
     * time. */
    c->suspect[e->leader] = 1;
    wg_logf(c->log, c->log_user, WAGMA_LOG_WARN,
            "engine: rank %d: no result for round %llu from leader %d yet; training on", c->rank,
            (unsigned long long)r, e->leader);
  }
out:;
  int napplied = 0;
  float *taken = rc == 0 ? wg_snapshot_take(c, &napplied) : NULL;
  wg_member_answer_deferred(c);
  pthread_mutex_unlock(&c->mu);
  wg_outbox_flush(c);
  wg_snapshot_add_taken(c, model, taken); /* outside mu */
  st->corrections_applied += napplied;
  return rc;
}
