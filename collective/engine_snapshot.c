/* engine_snapshot.c — the snapshot my contributions are taken from and the accumulator of
 * corrections that the compute thread adds to its model (engine_internal.h, wg_snapshot_t).
 *
 * Owns: comm->snap (three buffers of count floats and the accumulator). Their arithmetic goes
 * through comm->mem (memops.h), so device buffers can take the same path with kernels.
 * Threads: publish runs on the compute thread and copies the model outside mu into a buffer
 * that is neither front, pinned nor read by the data thread (with allreduce rounds, its
 * allreduce reads the contribution outside mu: snap.reading); everything else runs under
 * comm->mu from any thread.
 *
 * The allreduce rounds' mean arrives in comm->work, a fourth buffer of the same size: when the
 * contribution is still the front snapshot (nothing published since), the mean becomes the
 * front by exchanging work with a free snapshot buffer (pointers, not a copy).
 *
 * Invariant kept here: front == model + acc (+ the corrections the compute thread took and is
 * adding outside mu, wg_snapshot_take) at every moment mu is free, where model is the compute
 * thread's buffer as of its last publish plus its local steps since. Hence a contribution
 * taken from front already contains every correction I know of, and the one contribution
 * outstanding at a time (pinned) is never contributed again: a snapshot goes into at most one
 * round. No model-sized work on the compute thread's side runs under mu: the accumulator is
 * exchanged with a zeroed spare (pointers) and added to the model outside it. The round
 * thread's resolve moves pointers for an allreduce round's correction (comm->delta, made by
 * the allreduce) when no other is pending; otherwise (the star's mean, a member that trained
 * on past its round) it adds mean - pinned to acc, and to a newer front, under mu. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

int wg_snapshot_init(wg_snapshot_t *s, size_t count) {
  memset(s, 0, sizeof(*s));
  s->count = count;
  s->front = s->pinned = s->writing = s->reading = -1;
  for (int i = 0; i < 3; i++)
    s->buf[i] = calloc(count, sizeof(float));
  s->acc = calloc(count, sizeof(float));
  s->spare = calloc(count, sizeof(float));
  if (!s->buf[0] || !s->buf[1] || !s->buf[2] || !s->acc || !s->spare) {
    wg_snapshot_free(s);
    return WAGMA_ENOMEM;
  }
  return 0;
}

void wg_snapshot_free(wg_snapshot_t *s) {
  for (int i = 0; i < 3; i++) {
    free(s->buf[i]);
    s->buf[i] = NULL;
  }
  free(s->acc);
  s->acc = NULL;
  free(s->spare);
  s->spare = NULL;
}

int wg_snapshot_available(const wagma_comm_t *c) {
  return c->snap.front >= 0 && c->snap.pinned < 0 && !c->outstanding;
}

float *wg_snapshot_take(wagma_comm_t *c, int *n_out) {
  wg_snapshot_t *s = &c->snap;
  int n = s->acc_n;
  *n_out = 0;
  if (n == 0 || !s->spare)
    return NULL; /* (no spare: a take not added back yet; the next take gets these) */
  *n_out = n;
  float *taken = s->acc;
  s->acc = s->spare;
  s->spare = NULL;
  for (wg_entry_t *e = c->entries; e; e = e->next)
    if (e->state == WG_ENTRY_RESOLVED) {
      e->state = WG_ENTRY_APPLIED;
      if (e->ncontrib >= 2 && e->round + 1 > c->mixed_round)
        c->mixed_round = e->round + 1; /* a mean with another member's model */
    }
  if (s->acc_global > c->model_global)
    c->model_global = s->acc_global;
  s->acc_n = 0;
  s->acc_global = 0;
  c->counters.corrections_applied += (uint64_t)n;
  return taken;
}

void wg_snapshot_add_taken(wagma_comm_t *c, float *model, float *taken) {
  if (!taken)
    return;
  c->mem->add_clear(c->mem->self, model, taken, c->snap.count);
  c->snap.spare = taken; /* (only the compute thread takes and gives back) */
}

int wg_snapshot_publish(wagma_comm_t *c, float *model, uint64_t version, int apply) {
  wg_snapshot_t *s = &c->snap;
  int applied = 0;
  pthread_mutex_lock(&c->mu);
  /* A buffer that is neither published, pinned nor read. All three are taken when the data
   * thread still reads a contribution whose round ended (voided while its allreduce waits for
   * a frozen or dead peer) and a newer one is pinned: wait for its deadline to end the read
   * (it broadcasts), bounded; past that, this snapshot is skipped (front stays, older). */
  int w = -1;
  double until = wg_now() + wg_engine_data_timeout(c) + 5.0;
  for (;;) {
    for (int k = 0; k < 3 && w < 0; k++)
      if (k != s->front && k != s->pinned && k != s->reading)
        w = k;
    if (w >= 0 || c->stopping || wg_now() > until)
      break;
    wg_engine_wait(c, wg_now() + 0.05);
  }
  float *taken = apply ? wg_snapshot_take(c, &applied) : NULL;
  if (w < 0) {
    pthread_mutex_unlock(&c->mu);
    wg_snapshot_add_taken(c, model, taken);
    return applied;
  }
  s->writing = w;
  pthread_mutex_unlock(&c->mu);

  if (taken) { /* model += taken; the snapshot = model; taken = 0: one pass */
    c->mem->add_clear_copy(c->mem->self, model, s->buf[w], taken, s->count);
    s->spare = taken;
  } else {
    c->mem->copy(c->mem->self, s->buf[w], model, s->count);
  }

  pthread_mutex_lock(&c->mu);
  if (s->acc_n > 0) /* corrections not in model (resolved during the copy, or all without apply) */
    c->mem->add(c->mem->self, s->buf[w], s->acc, s->count);
  s->front = w;
  s->writing = -1;
  s->version = version;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return applied;
}

void wg_snapshot_resolve(wagma_comm_t *c, const float *mean, uint64_t round, int global) {
  wg_snapshot_t *s = &c->snap;
  if (s->pinned < 0)
    return;
  const wg_memops_t *m = c->mem;
  const float *pinned = s->buf[s->pinned];
  int moved_on = s->front >= 0 && s->front != s->pinned;
  if (mean == c->work && c->delta && s->reading < 0 && s->acc_n == 0) {
    /* An allreduce round's correction came with its mean (c->delta = mean - pinned, exactly
     * add_diff's into a zero accumulator): it becomes the accumulator, and the zero
     * accumulator the next round's delta buffer. Pointers, no pass under mu. */
    float *zero = s->acc;
    s->acc = c->delta;
    c->delta = zero;
    if (moved_on) /* the newer snapshot takes the correction too */
      m->add(m->self, s->buf[s->front], s->acc, s->count);
  } else if (moved_on) { /* accumulator and newer snapshot take mean - pinned, in one pass */
    m->add_diff2(m->self, s->acc, s->buf[s->front], mean, pinned, s->count);
  } else {
    m->add_diff(m->self, s->acc, mean, pinned, s->count);
  }
  s->acc_n++;
  if (global && round + 1 > s->acc_global)
    s->acc_global = round + 1;
  if (global && c->jump_global <= round + 1)
    c->jump_global = 0; /* the correction a jump counted on came (engine_internal.h) */
  if (s->front == s->pinned) {
    /* The snapshot is still the contribution: it becomes the mean exactly. The mean goes into
     * a buffer that is neither pinned (a flush may still be reading it for the CONTRIB's
     * send) nor being written by publish; with three buffers one is always free (the data
     * thread reads none by now: it reported the allreduce that made the mean). The
     * allreduce's mean is comm->work: that buffer itself becomes the snapshot and the free
     * one becomes work (the data thread is done with work; the next round's is this one). */
    int w = 0;
    while (w == s->pinned || w == s->writing || w == s->reading)
      w++;
    if (mean == c->work && s->reading < 0) {
      float *freed = s->buf[w];
      s->buf[w] = c->work;
      c->work = freed;
    } else {
      m->copy(m->self, s->buf[w], mean, s->count);
    }
    s->front = w;
    if (round > s->version)
      s->version = round;
  }
  /* A publish copying right now gets the correction from acc when it finishes. */
  s->pinned = -1;
}

void wg_snapshot_unpin(wagma_comm_t *c) {
  c->snap.pinned = -1;
}
