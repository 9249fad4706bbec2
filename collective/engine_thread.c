/* engine_thread.c — the engine's round thread: takes ACTIVATE, CONTRIB, RESULT and
 * CATCHUP_REQ frames out of the transport's mailbox (COLL and CATCHUP_REP frames are left for
 * the compute thread), hands them to the member side (engine_member.c) or the leader side
 * (engine_leader.c), finalizes leader rounds whose deadline passed, answers deferred
 * activations, and voids my outstanding contribution when the transport reports its leader
 * dead with no RESULT of it queued.
 *
 * Owns: the round thread itself (started by wg_comm_create_with, joined by destroy).
 * Thread: the round thread; every handler runs under comm->mu and leaves frames in the
 * outbox, flushed after mu is released. It answers an activation at once with the latest
 * snapshot, whatever the compute thread is doing, so a slow worker never delays its group. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "wagma/log_internal.h"

#define ROUND_TICK_S 0.05

static void note_peer(wagma_comm_t *c, int src, uint64_t round) {
  c->suspect[src] = 0;
  if (round > c->highest_seen && round != UINT64_MAX) {
    c->highest_seen = round;
    c->highest_src = src;
  }
}

static void send_excluded(wagma_comm_t *c, const wg_frame_header_t *h) {
  wg_frame_header_t out = {0};
  out.kind = WG_FRAME_RESULT;
  out.round = h->round;
  out.group = h->group;
  out.flags = WG_RESULT_EXCLUDED;
  wg_outbox_post(c, (int)h->src, &out, NULL);
}

static void handle_activate(wagma_comm_t *c, const wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  note_peer(c, (int)h->src, h->round);
  if (!wg_engine_same_group(c, h->round, h->group, (int)h->src))
    return;
  wg_member_activated(c, h->round, h->group, (int)h->src);
}

/* A member's contribution (or decline) for a round I lead or am to lead. Every contribution
 * gets an answer: RESULT when its round ends, or EXCLUDED now, so no member waits on me for a
 * round I will not finish. */
static void handle_contrib(wagma_comm_t *c, const wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  int src = (int)h->src;
  note_peer(c, src, h->round);
  wg_lround_t *lr = wg_leader_find(c, h->round);
  if (h->flags & WG_CONTRIB_DECLINE) {
    if (lr)
      wg_leader_release(c, lr, src);
    return;
  }
  if (h->flags & WG_CONTRIB_DONE) { /* an allreduce round's contributor is through */
    if (c->rounds_allreduce && h->length == 0)
      wg_leader_done(c, h->round, src, !(h->flags & WG_CONTRIB_FAILED));
    else
      c->counters.frames_rejected++;
    return;
  }
  size_t want = c->rounds_allreduce ? 0 : c->count * sizeof(float); /* a JOIN, or the snapshot */
  if (h->length != want || !wg_engine_same_group(c, h->round, h->group, src)) {
    c->counters.frames_rejected++;
    send_excluded(c, h);
    return;
  }
  if (!lr) {
    if (wg_leader_finished(c, h->round) || c->stopping) {
      send_excluded(c, h);
      return;
    }
    lr = wg_leader_open(c, h->round, h->group, src);
    if (!lr) {
      send_excluded(c, h);
      return;
    }
    /* The member's arrival activates me too: contribute now, or once I may. */
    wg_member_activated(c, h->round, h->group, c->rank);
    lr = wg_leader_find(c, h->round);
    if (!lr) {
      send_excluded(c, h); /* ended already (cannot happen while src is expected) */
      return;
    }
  }
  if (c->rounds_allreduce) {
    wg_leader_add(c, lr, src, h->aux, NULL);
    return;
  }
  const float *model = wg_codec_floats_view(m->payload);
  float *copy = NULL;
  if (!model) {
    copy = malloc(c->count * sizeof(float));
    if (!copy) {
      send_excluded(c, h);
      return;
    }
    wg_codec_get_floats(copy, m->payload, c->count);
    model = copy;
  }
  wg_leader_add(c, lr, src, h->aux, model);
  free(copy);
}

/* Allreduce rounds: GO (the list: my data thread runs the allreduce) or COMMIT (apply the
 * allreduce's mean, c->work; a lone contributor's COMMIT carries the list and its own snapshot
 * is the mean). */
static void handle_go_commit(wagma_comm_t *c, const wg_message_t *m, wg_entry_t *e) {
  const wg_frame_header_t *h = &m->header;
  int go = (h->flags & WG_RESULT_GO) != 0;
  uint64_t n = h->aux;
  if (!c->rounds_allreduce || n == 0 || n > (uint64_t)c->nranks || (go && e->go)) {
    c->counters.frames_rejected++;
    return;
  }
  int activator = (int)(int64_t)h->seq;
  if (activator < -1 || activator >= c->nranks)
    activator = -1;
  const int *gr = NULL;
  uint32_t g = 0;
  int members = wg_engine_group_of(c, h->round, c->rank, &g, &gr);
  if (!go && e->go) { /* COMMIT after GO: my allreduce succeeded, or the leader is wrong */
    if (e->data_done && e->data_rc == 0)
      wg_member_resolve(c, e, c->work, e->activator, e->members, e->ncontrib, e->ranks,
                        e->versions);
    else
      wg_member_void(c, e, "a commit without my allreduce's result");
    return;
  }
  if (h->length != wg_codec_list_size((int)n)) {
    c->counters.frames_rejected++;
    return;
  }
  int ranks[c->nranks];
  uint64_t versions[c->nranks];
  int listed = 0;
  if (wg_codec_list_decode(m->payload, (int)n, c->nranks, ranks, versions) != 0) {
    c->counters.frames_rejected++;
    return;
  }
  for (uint64_t i = 0; i < n; i++)
    listed |= ranks[i] == c->rank;
  if (!listed) {
    wg_member_void(c, e, "not among the contributors");
  } else if (go) {
    if (wg_member_go(c, e, activator, members, (int)n, ranks, versions,
                     (h->flags & WG_RESULT_COLL) != 0) != 0)
      wg_member_void(c, e, "out of memory"); /* (the leader aborts at my missing DONE) */
  } else if (n == 1 && c->snap.pinned >= 0) {
    wg_member_resolve(c, e, c->snap.buf[c->snap.pinned], activator, members, 1, ranks, versions);
  } else {
    c->counters.frames_rejected++;
  }
}

static void handle_result(wagma_comm_t *c, const wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  note_peer(c, (int)h->src, h->round);
  wg_entry_t *e = wg_member_entry(c, h->round);
  if (!e || e->state != WG_ENTRY_WAITING || e->leader != (int)h->src)
    return; /* not mine: duplicate, or for a contribution that went elsewhere */
  if (h->flags & WG_RESULT_EXCLUDED) {
    wg_member_void(c, e, e->go ? "the round's allreduce was aborted" : "excluded by the leader");
    return;
  }
  if (h->flags & (WG_RESULT_GO | WG_RESULT_COMMIT)) {
    handle_go_commit(c, m, e);
    return;
  }
  uint64_t n = h->aux;
  if (n == 0 || n > (uint64_t)c->nranks || h->length != wg_codec_result_size(c->count, (int)n)) {
    c->counters.frames_rejected++;
    return;
  }
  int *ranks = malloc(n * sizeof(int));
  uint64_t *versions = malloc(n * sizeof(uint64_t));
  const float *mean = wg_codec_floats_view(m->payload);
  float *copy = mean ? NULL : malloc(c->count * sizeof(float));
  if (!ranks || !versions || (!mean && !copy) ||
      wg_codec_result_decode(m->payload, c->count, (int)n, c->nranks, copy, ranks, versions)) {
    c->counters.frames_rejected++;
    goto out;
  }
  const int *gr = NULL;
  uint32_t g = 0;
  int members = wg_engine_group_of(c, h->round, c->rank, &g, &gr);
  int activator = (int)(int64_t)h->seq;
  if (activator < -1 || activator >= c->nranks)
    activator = -1;
  int listed = 0;
  for (uint64_t i = 0; i < n; i++)
    listed |= ranks[i] == c->rank;
  if (!listed) {
    wg_member_void(c, e, "not among the contributors");
    goto out;
  }
  wg_member_resolve(c, e, mean ? mean : copy, activator, members, (int)n, ranks, versions);
out:
  free(ranks);
  free(versions);
  free(copy);
}

static void handle_catchup_req(wagma_comm_t *c, const wg_message_t *m) {
  const wg_frame_header_t *h = &m->header;
  c->suspect[h->src] = 0;
  wg_frame_header_t out = {0};
  out.kind = WG_FRAME_CATCHUP_REP;
  out.seq = h->seq;
  out.aux = atomic_load(&c->cur_round);
  wg_blob_t *blob = NULL;
  if (c->have_global && (blob = wg_blob_new(c->count * sizeof(float)))) {
    out.round = c->global_round;
    wg_codec_put_floats(blob->data, c->global_mean, c->count);
  } else {
    out.flags = WG_CATCHUP_NONE;
  }
  wg_outbox_post(c, (int)h->src, &out, blob);
  wg_blob_unref(blob);
}

/* Voids my outstanding contribution if its leader is dead and no RESULT of it is queued:
 * none will come. A queued RESULT is handled instead. Takes and releases mu. */
static void void_orphan(wagma_comm_t *c) {
  pthread_mutex_lock(&c->mu);
  wg_entry_t *e = c->outstanding;
  if (!e || e->leader == c->rank || e->sending || c->stopping ||
      c->ops->peer_alive(c->tp, e->leader)) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  wg_match_t match;
  wg_match_any(&match);
  match.src = (uint64_t)e->leader;
  match.kinds = 1u << WG_FRAME_RESULT;
  match.round = e->round;
  wg_message_t *m = NULL;
  int rc = c->ops->recv(c->tp, &match, 0.0, &m);
  if (rc == 0)
    handle_result(c, m);
  else if (rc == WAGMA_EPEER)
    wg_member_void(c, e, "its leader is gone");
  pthread_mutex_unlock(&c->mu);
  wg_message_free(m);
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
    for (wg_lround_t *lr = c->drounds; lr; lr = lr->next)
      if (lr->deadline < deadline)
        deadline = lr->deadline;
    pthread_mutex_unlock(&c->mu);

    wg_message_t *m = NULL;
    int rc = c->ops->recv(c->tp, &match, deadline, &m);
    if (rc == WAGMA_ECLOSED)
      break;
    pthread_mutex_lock(&c->mu);
    if (rc == 0 && !c->stopping) {
      switch (m->header.kind) {
      case WG_FRAME_ACTIVATE: handle_activate(c, m); break;
      case WG_FRAME_CONTRIB: handle_contrib(c, m); break;
      case WG_FRAME_RESULT: handle_result(c, m); break;
      case WG_FRAME_CATCHUP_REQ: handle_catchup_req(c, m); break;
      default: break;
      }
    }
    wg_leader_tick(c, wg_now());
    wg_member_answer_deferred(c);
    pthread_mutex_unlock(&c->mu);
    wg_message_free(m);
    wg_outbox_flush(c);
    void_orphan(c);
    wg_outbox_flush(c);
  }
  return NULL;
}
