/* engine_outbox.c — frames the engine decided to send while holding comm->mu, sent after it
 * is released, so no transport call (which copies the payload) runs under the engine mutex.
 *
 * Owns: comm->outbox (a FIFO of wg_out_t) and the payload blobs (reference counted, one blob
 * shared by the frames of one RESULT to several contributors).
 * Threads: post under mu from any engine thread; flush from whichever thread posted, after it
 * released mu. Two flushes may run at once; frames to one peer keep their order within one
 * flush, which is all the engine needs (matching is by kind, round and source). A CONTRIB's
 * payload is the pinned snapshot: entry->sending keeps it pinned until the send returned. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "wagma/log_internal.h"

wg_blob_t *wg_blob_new(size_t len) {
  wg_blob_t *b = malloc(sizeof(*b) + (len ? len : 1));
  if (!b)
    return NULL;
  b->refs = 1;
  b->len = len;
  return b;
}

/* Blob references are only changed under mu or by the one flusher owning the frame. */
void wg_blob_unref(wg_blob_t *b) {
  if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0)
    free(b);
}

static void append(wagma_comm_t *c, wg_out_t *o) {
  if (c->outbox_tail)
    c->outbox_tail->next = o;
  else
    c->outbox = o;
  c->outbox_tail = o;
}

void wg_outbox_post(wagma_comm_t *c, int dst, const wg_frame_header_t *h, wg_blob_t *blob) {
  wg_out_t *o = calloc(1, sizeof(*o));
  if (!o) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "engine: out of memory queueing a frame");
    return;
  }
  o->dst = dst;
  o->header = *h;
  o->header.src = (uint32_t)c->rank;
  if (blob) {
    __atomic_add_fetch(&blob->refs, 1, __ATOMIC_ACQ_REL);
    o->blob = blob;
  }
  append(c, o);
}

void wg_outbox_post_contrib(wagma_comm_t *c, wg_entry_t *e) {
  wg_out_t *o = calloc(1, sizeof(*o));
  if (!o) {
    wg_member_void(c, e, "out of memory");
    return;
  }
  o->dst = e->leader;
  o->header.kind = WG_FRAME_CONTRIB;
  o->header.round = e->round;
  o->header.group = e->group;
  o->header.src = (uint32_t)c->rank;
  o->header.aux = e->version;
  o->entry = e;
  e->sending = 1;
  append(c, o);
}

void wg_outbox_flush(wagma_comm_t *c) {
  pthread_mutex_lock(&c->mu);
  wg_out_t *list = c->outbox;
  c->outbox = c->outbox_tail = NULL;
  const float *pinned = c->snap.pinned >= 0 ? c->snap.buf[c->snap.pinned] : NULL;
  pthread_mutex_unlock(&c->mu);
  if (!list)
    return;
  float *le = NULL; /* a CONTRIB payload in little-endian order, on big-endian hosts */
  for (wg_out_t *o = list; o; o = o->next) {
    int rc;
    if (o->entry) {
      const void *payload = pinned;
      if (pinned && !wg_codec_floats_view((const uint8_t *)pinned)) {
        if (!le)
          le = malloc(c->count * sizeof(float));
        if (le)
          wg_codec_put_floats((uint8_t *)le, pinned, c->count);
        payload = le;
      }
      rc = payload ? c->ops->send(c->tp, o->dst, &o->header, payload, c->count * sizeof(float))
                   : WAGMA_ENOMEM;
    } else {
      rc = c->ops->send(c->tp, o->dst, &o->header, o->blob ? o->blob->data : NULL,
                        o->blob ? o->blob->len : 0);
    }
    o->failed = rc != 0;
  }
  free(le);
  pthread_mutex_lock(&c->mu);
  for (wg_out_t *o = list; o; o = o->next) {
    if (!o->entry)
      continue;
    o->entry->sending = 0;
    if (o->failed && o->entry->state == WG_ENTRY_WAITING) {
      /* Never reached its leader: no result will come. Try another leader next time. */
      if (o->dst >= 0 && o->dst < c->nranks)
        c->suspect[o->dst] = 1;
      wg_member_void(c, o->entry, "leader unreachable");
    }
  }
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  while (list) {
    wg_out_t *n = list->next;
    wg_blob_unref(list->blob);
    free(list);
    list = n;
  }
  /* Voiding above may have let deferred activations be answered: send those too. */
  pthread_mutex_lock(&c->mu);
  int more = c->outbox != NULL;
  pthread_mutex_unlock(&c->mu);
  if (more)
    wg_outbox_flush(c);
}

void wg_outbox_discard(wagma_comm_t *c) {
  wg_out_t *o = c->outbox;
  while (o) {
    wg_out_t *n = o->next;
    if (o->entry)
      o->entry->sending = 0;
    wg_blob_unref(o->blob);
    free(o);
    o = n;
  }
  c->outbox = c->outbox_tail = NULL;
}
