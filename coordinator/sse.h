/* coordinator/sse.h — server-sent events on the wire: the encoder and the bounded byte queue
 * (sse.c, pure). */
#ifndef WAGMA_COORD_SSE_H
#define WAGMA_COORD_SSE_H

#include <stddef.h>

/* Encodes one event ("id:", "event:" lines when given, one "data:" line per line of data, a
 * blank line) into out (cap bytes, NUL-terminated when it fits); returns its length whatever
 * cap is, so (NULL, 0) measures. CR/LF in id and event become spaces. */
size_t wg_sse_encode(char *out, size_t cap, const char *id, const char *event, const char *data);
/* wg_sse_encode into a new string (*len its length). Ownership: the caller frees. */
char *wg_sse_event(const char *id, const char *event, const char *data, size_t *len);
/* A comment line ": text\n\n" (heartbeats), as wg_sse_encode measures and writes. */
size_t wg_sse_comment(char *out, size_t cap, const char *text);

/* The bytes a client has not taken yet, at most limit. */
typedef struct wg_sse_queue {
  char *buf;
  size_t off, len, cap, limit;
} wg_sse_queue_t;
void wg_sse_queue_init(wg_sse_queue_t *q, size_t limit);
void wg_sse_queue_free(wg_sse_queue_t *q);
/* Appends n bytes: 0; WAGMA_ERANGE (nothing appended) when the queue would hold more than its
 * limit; WAGMA_ENOMEM. */
int wg_sse_queue_push(wg_sse_queue_t *q, const char *bytes, size_t n);
/* Takes up to max bytes into out; returns how many. */
size_t wg_sse_queue_pop(wg_sse_queue_t *q, char *out, size_t max);
size_t wg_sse_queue_pending(const wg_sse_queue_t *q);

#endif
