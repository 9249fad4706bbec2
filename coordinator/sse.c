/* coordinator/sse.c — server-sent events on the wire: the encoder of one event and the bounded
 * byte queue each event-stream client has (docs/api.md "Event streams").
 *
 * An event is "id: <id>\nevent: <name>\ndata: <line>\n" per line of its data "\n" — the
 * text/event-stream format of the HTML standard. id and name are single lines (CR and LF in
 * them become spaces, so a value can never start a field of its own); data is split at "\n",
 * "\r\n" and "\r", each piece on its own "data:" line, so a client joins them back with "\n".
 * A comment (heartbeat) is ": <text>\n\n".
 *
 * The queue holds the bytes a client has not taken yet, up to a limit: a push that would pass
 * it fails and changes nothing (the caller then drops the client: the server never waits for a
 * slow reader). The owner may set the limit before each push: hub.c lets a snapshot pass
 * --sse-client-buffer and holds the events after it to the buffer on their own. Pure; a queue
 * is used under its owner's lock. Unit-tested in tests/unit/coordinator. */
#include <stdlib.h>
#include <string.h>

#include "sse.h"
#include "wagma/status.h"

/* Copies a one-line field value: CR/LF become spaces. Returns its length. */
static size_t put_line(char *out, size_t at, size_t cap, const char *s) {
  size_t n = 0;
  for (; s[n]; n++)
    if (at + n < cap)
      out[at + n] = (s[n] == '\r' || s[n] == '\n') ? ' ' : s[n];
  return n;
}

static size_t put_raw(char *out, size_t at, size_t cap, const char *s, size_t n) {
  if (at < cap)
    memcpy(out + at, s, at + n <= cap ? n : cap - at);
  return n;
}

size_t wg_sse_encode(char *out, size_t cap, const char *id, const char *event, const char *data) {
  size_t at = 0;
  if (id && id[0]) {
    at += put_raw(out, at, cap, "id: ", 4);
    at += put_line(out, at, cap, id);
    at += put_raw(out, at, cap, "\n", 1);
  }
  if (event && event[0]) {
    at += put_raw(out, at, cap, "event: ", 7);
    at += put_line(out, at, cap, event);
    at += put_raw(out, at, cap, "\n", 1);
  }
  const char *p = data ? data : "";
  for (;;) {
    size_t n = strcspn(p, "\r\n");
    at += put_raw(out, at, cap, "data: ", 6);
    at += put_raw(out, at, cap, p, n);
    at += put_raw(out, at, cap, "\n", 1);
    p += n;
    if (!*p)
      break;
    p += (p[0] == '\r' && p[1] == '\n') ? 2 : 1;
  }
  at += put_raw(out, at, cap, "\n", 1);
  if (at < cap)
    out[at] = '\0';
  return at;
}

char *wg_sse_event(const char *id, const char *event, const char *data, size_t *len) {
  size_t n = wg_sse_encode(NULL, 0, id, event, data);
  char *s = malloc(n + 1);
  if (!s)
    return NULL;
  wg_sse_encode(s, n + 1, id, event, data);
  if (len)
    *len = n;
  return s;
}

size_t wg_sse_comment(char *out, size_t cap, const char *text) {
  size_t at = put_raw(out, 0, cap, ": ", 2);
  at += put_line(out, at, cap, text ? text : "");
  at += put_raw(out, at, cap, "\n\n", 2);
  if (at < cap)
    out[at] = '\0';
  return at;
}

void wg_sse_queue_init(wg_sse_queue_t *q, size_t limit) {
  memset(q, 0, sizeof *q);
  q->limit = limit;
}

void wg_sse_queue_free(wg_sse_queue_t *q) {
  free(q->buf);
  memset(q, 0, sizeof *q);
}

size_t wg_sse_queue_pending(const wg_sse_queue_t *q) {
  return q->len - q->off;
}

int wg_sse_queue_push(wg_sse_queue_t *q, const char *bytes, size_t n) {
  size_t pending = q->len - q->off;
  if (n > q->limit || pending > q->limit - n)
    return WAGMA_ERANGE;
  if (q->off > 0 && q->len + n > q->cap) { /* move what is left to the front first */
    memmove(q->buf, q->buf + q->off, pending);
    q->off = 0;
    q->len = pending;
  }
  if (q->len + n > q->cap) {
    size_t cap = q->cap ? q->cap : 4096;
    while (cap < q->len + n)
      cap *= 2;
    char *nb = realloc(q->buf, cap);
    if (!nb)
      return WAGMA_ENOMEM;
    q->buf = nb;
    q->cap = cap;
  }
  memcpy(q->buf + q->len, bytes, n);
  q->len += n;
  return 0;
}

size_t wg_sse_queue_pop(wg_sse_queue_t *q, char *out, size_t max) {
  size_t n = q->len - q->off;
  if (n > max)
    n = max;
  memcpy(out, q->buf + q->off, n);
  q->off += n;
  if (q->off == q->len) {
    q->off = q->len = 0;
    if (q->cap > 65536) { /* a burst is over: give its memory back */
      free(q->buf);
      q->buf = NULL;
      q->cap = 0;
    }
  }
  return n;
}
