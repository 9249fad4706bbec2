/* transport.c — the transport-neutral helpers of transport.h that every transport (tcp.c,
 * nccl later, the tests' fake) and the engine share: the clock (wg_now), the match-all
 * pattern (wg_match_any), and the lifetime of received messages (wg_message_new /
 * wg_message_free, payloads from the buffer pool of buf_pool.c).
 *
 * Owns no state. Threads: any; every function is reentrant. */
#include <stdlib.h>

#include "transport.h"
#include "wagma/clock_internal.h"

double wg_now(void) {
  return wg_mono();
}

void wg_match_any(wg_match_t *match) {
  match->src = WG_ANY;
  match->kinds = 0;
  match->round = WG_ANY;
  match->group = WG_ANY;
  match->seq = WG_ANY;
}

int wg_match_frame(const wg_match_t *mt, const wg_frame_header_t *h) {
  return (mt->src == WG_ANY || mt->src == h->src) &&
         (mt->kinds == 0 || (h->kind < 64 && (mt->kinds & ((uint64_t)1 << h->kind)))) &&
         (mt->round == WG_ANY || mt->round == h->round) &&
         (mt->group == WG_ANY || mt->group == h->group) && (mt->seq == WG_ANY || mt->seq == h->seq);
}

wg_message_t *wg_message_new(const wg_frame_header_t *header, size_t payload_len) {
  wg_message_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return NULL;
  m->header = *header;
  if (payload_len > 0) {
    m->payload = wg_buf_alloc(payload_len);
    if (m->payload == NULL) {
      free(m);
      return NULL;
    }
  }
  return m;
}

void wg_message_free(wg_message_t *message) {
  if (message == NULL)
    return;
  wg_buf_free(message->payload);
  free(message);
}
