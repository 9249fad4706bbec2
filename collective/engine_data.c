/* engine_data.c — the data thread of allreduce rounds (docs/design.md "Rounds as an
 * allreduce"): a round's data moves as ONE allreduce among exactly its contributors instead of
 * through the leader.
 *
 * The protocol, per round (the leader's side is engine_leader.c, the frames engine_thread.c):
 *   ACTIVATE (leader -> members), JOIN (a CONTRIB without payload, member -> leader, aux = the
 *   snapshot version), then at the leader's finalize GO (a RESULT with WG_RESULT_GO and the
 *   list of contributors) to each contributor; each contributor's data thread runs
 *   wg_coll_allreduce_delta among the list: the MEAN of the pinned snapshots into c->work and
 *   mean - snapshot into c->delta (out of place: no staging copy, and the correction comes
 *   with the mean; tag: round, group, seq = a hash of the list), then reports DONE (ok or
 *   failed) to the leader; the leader
 *   answers COMMIT once every contributor's allreduce succeeded, ABORT (RESULT EXCLUDED) at the
 *   first failure, a contributor's death or its deadline. COMMIT applies c->work as the round's
 *   mean (the correction work - pinned, engine_snapshot.c); ABORT voids the round. So a round
 *   ends the same way for all its contributors even when the allreduce succeeded on some of
 *   them only, and the mean is bit for bit the same on all (coll.c's allreduce).
 *
 * Owns: c->work while its allreduce runs (the one outstanding contribution's: a rank has at
 * most one, so at most one job at a time), and reads the pinned snapshot meanwhile, marked
 * c->snap.reading so that no publish reuses it even if the round is voided under it. Thread:
 * its own; it takes mu to claim a job and to report it, never while the allreduce runs, so
 * the round thread answers other leaders meanwhile. It never touches an entry after its round
 * ended (it looks it up again by round). */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "engine_internal.h"
#include "wagma/log_internal.h"

wg_engine_staged_hook_t wg_engine_staged_hook = NULL;
wg_engine_data_fault_t wg_engine_data_fault = NULL;

/* Seconds an allreduce of the model is given: the measured round latency's multiple (at least
 * the floor), plus the bytes at a pessimistic 100 MB/s, so large models are not cut off by a
 * deadline made for small ones. (mu, or a copy of the fields) */
double wg_engine_data_timeout(const wagma_comm_t *c) {
  double t = c->factor * c->ewma_data;
  if (t < c->floor_s)
    t = c->floor_s;
  return t + (double)(c->count * sizeof(float)) / 100e6;
}

uint64_t wg_engine_list_seq(const int *ranks, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    h ^= (uint64_t)(uint32_t)ranks[i];
    h *= 1099511628211ull;
  }
  return (h & ((1ull << 40) - 1)) << 20;
}

/* The outstanding entry this thread has not taken yet, or NULL. (mu) */
static wg_entry_t *job(wagma_comm_t *c) {
  wg_entry_t *e = c->outstanding;
  return e && e->state == WG_ENTRY_WAITING && !e->claimed ? e : NULL;
}

void *wg_engine_data_main(void *arg) {
  wagma_comm_t *c = arg;
  int *ranks = malloc((size_t)c->nranks * sizeof(int));
  for (;;) {
    pthread_mutex_lock(&c->mu);
    wg_entry_t *e;
    while (!c->stopping && !(e = job(c)))
      wg_engine_wait(c, wg_now() + 0.2);
    if (c->stopping || !ranks) {
      pthread_mutex_unlock(&c->mu);
      break;
    }
    /* The pinned snapshot is the allreduce's input, read outside mu: marked as read until
     * the report below (immutable while pinned; kept from reuse while read). */
    e->claimed = 1;
    uint64_t round = e->round;
    int leader = e->leader;
    c->snap.reading = c->snap.pinned;
    const float *pinned = c->snap.buf[c->snap.pinned];
    while (!c->stopping && (e = wg_member_entry(c, round)) && e->state == WG_ENTRY_WAITING &&
           !e->go)
      wg_engine_wait(c, wg_now() + 0.2); /* no timer of its own: the round's end decides */
    if (c->stopping || !e || e->state != WG_ENTRY_WAITING) {
      c->snap.reading = -1;
      pthread_cond_broadcast(&c->cv); /* a publish may wait for the buffer */
      pthread_mutex_unlock(&c->mu);
      continue; /* void, a lone contributor's COMMIT, or the end */
    }
    if (wg_engine_staged_hook && leader != c->rank) /* the snapshot goes into the allreduce */
      wg_engine_staged_hook(c->rank, leader, round, pinned, c->count);
    uint32_t group = e->group;
    int n = e->ncontrib;
    int coll = e->coll;
    memcpy(ranks, e->ranks, (size_t)n * sizeof(int));
    double timeout = wg_engine_data_timeout(c);
    /* (a COMMIT's resolve exchanges these with snapshot buffers, after this job's report) */
    float *work = c->work, *delta = c->delta;
    pthread_mutex_unlock(&c->mu);

    int failed = -1;
    wg_coll_ctx_t ctx = {0};
    ctx.ops = c->ops;
    ctx.transport = c->tp;
    ctx.rank = c->rank;
    ctx.ranks = ranks; /* the leader's list follows the group's order: sorted */
    ctx.nranks = n;
    ctx.round = round;
    ctx.group = group;
    ctx.seq = wg_engine_list_seq(ranks, n);
    ctx.failed_rank = &failed;
    ctx.release = 1; /* DONE, COMMIT and the next round's frames come from these peers */
    /* the mean into work and the correction (mean - contribution) into delta, each written
     * as the allreduce finishes its element: COMMIT then moves pointers, not the model. With
     * the transport's own collective (GO said so: NCCL's group communicator), its sum, then
     * the mean and correction in one pass. */
    int rc;
    if (coll && c->ops->group_allreduce) {
      const float *sum = NULL;
      rc = c->ops->group_allreduce(c->tp, ranks, n, round, pinned, c->count, wg_now() + timeout,
                                   &sum);
      if (rc == 0)
        wg_coll_mean_delta(sum, n, pinned, work, delta, c->count);
    } else {
      rc = wg_coll_allreduce_delta(&ctx, pinned, work, delta, c->count, wg_now() + timeout);
    }
    if (rc == WAGMA_ECLOSED) {
      pthread_mutex_lock(&c->mu);
      c->snap.reading = -1;
      pthread_cond_broadcast(&c->cv); /* a publish may wait for the buffer */
      pthread_mutex_unlock(&c->mu);
      break; /* destroy or abort: nothing more to report */
    }
    if (wg_engine_data_fault)
      rc = wg_engine_data_fault(c->rank, round, rc);

    pthread_mutex_lock(&c->mu);
    c->snap.reading = -1;
    pthread_cond_broadcast(&c->cv); /* a publish may wait for the buffer */
    wg_entry_t *now = wg_member_entry(c, round);
    if (now && now->state == WG_ENTRY_WAITING && now->claimed) {
      now->data_done = 1;
      now->data_rc = rc;
      if (rc)
        wg_logf(c->log, c->log_user, WAGMA_LOG_DEBUG,
                "engine: rank %d: allreduce of round %llu failed: %s (rank %d)", c->rank,
                (unsigned long long)round, wagma_strerror(rc), failed);
      if (leader == c->rank) {
        wg_leader_done(c, round, c->rank, rc == 0);
      } else {
        wg_frame_header_t h = {0};
        h.kind = WG_FRAME_CONTRIB;
        h.round = round;
        h.group = group;
        h.flags = WG_CONTRIB_DONE | (rc ? WG_CONTRIB_FAILED : 0u);
        h.aux = (uint64_t)(int64_t)failed;
        wg_outbox_post(c, leader, &h, NULL);
      }
    }
    wg_member_answer_deferred(c);
    pthread_mutex_unlock(&c->mu);
    wg_outbox_flush(c);
  }
  free(ranks);
  return NULL;
}
