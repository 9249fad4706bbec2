/* coordinator/front_reads.c — the reads the connection front (front.c) answers itself from the
 * read cache, without libmicrohttpd: which heads qualify, and the bytes of the answer.
 *
 * A read qualifies when the answer would be the same through libmicrohttpd: `GET` over
 * HTTP/1.1 with no body; a target of at most WG_FAST_TARGET_MAX bytes that needs no decoding
 * (no '%', no '+': then libmicrohttpd's decoded path and query values are the raw bytes) and
 * passes wg_route_target_check; no `Connection` field but `keep-alive` (HTTP/1.1's default,
 * which browsers send; a `close` goes through libmicrohttpd, which closes after its answer);
 * one job's read (GET of the job, its plan, groups or timeline: their cost is the job's size,
 * the bodies rendered already; not the job list or the agents, rendered per read from the
 * whole cluster, which the front thread must not wait for); for the timeline, not asked as a
 * stream and no token configured (the token check and streams stay in dispatch.c and
 * http.c). Anything else goes to libmicrohttpd unchanged: this is a shortcut, never a second
 * set of rules.
 *
 * The answer has the status line, `Date`, `Content-Type` and `Content-Length` fields that
 * libmicrohttpd writes for the same response, and the body of wg_cache_serve.
 *
 * No state; called on the front thread only (the Date cache is its). */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cache.h"
#include "coord.h"
#include "front.h"
#include "request.h"
#include "router.h"

/* The end of the line that starts at p (its CR or LF), within end. */
static const char *line_end(const char *p, const char *end) {
  while (p < end && *p != '\r' && *p != '\n')
    p++;
  return p;
}

static const char *next_line(const char *p, const char *end) {
  p = line_end(p, end);
  if (p < end && *p == '\r')
    p++;
  if (p < end && *p == '\n')
    p++;
  return p;
}

/* 1 when a Connection field's value (from v to e) is just "keep-alive" (what browsers send;
 * HTTP/1.1's default, so libmicrohttpd's answer is the same without it). */
static int keep_alive(const char *v, const char *e) {
  while (v < e && (*v == ' ' || *v == '\t'))
    v++;
  while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
    e--;
  return e - v == 10 && strncasecmp(v, "keep-alive", 10) == 0;
}

/* Splits the query (NUL-terminated, writable) into r's pairs as libmicrohttpd would: pieces
 * between '&', "key=value" or "key" (value NULL). 0, or -1 when a piece is empty or there are
 * more than WG_MAX_QUERY (then libmicrohttpd decides). */
static int split_query(char *q, wg_request_t *r) {
  while (*q) {
    if (r->nquery == WG_MAX_QUERY)
      return -1;
    char *amp = strchr(q, '&');
    if (amp)
      *amp = '\0';
    if (!*q || *q == '=')
      return -1;
    char *eq = strchr(q, '=');
    if (eq)
      *eq = '\0';
    r->query_key[r->nquery] = q;
    r->query_value[r->nquery] = eq ? eq + 1 : NULL;
    r->nquery++;
    if (!amp)
      break;
    q = amp + 1;
    if (!*q)
      return -1; /* a trailing '&' */
  }
  return 0;
}

int wg_fast_read_parse(const wg_coord_t *c, const char *head, size_t len, wg_fast_read_t *out) {
  const char *end = head + len, *p = head;
  memset(out, 0, sizeof *out);
  if (!c->cache || len < 16 || memcmp(p, "GET ", 4) != 0)
    return 0;
  p += 4;
  const char *t = p;
  while (p < end && *p != ' ')
    p++;
  size_t tlen = (size_t)(p - t);
  const char *le = line_end(p, end);
  if (tlen == 0 || tlen >= WG_FAST_TARGET_MAX || *t != '/' || le - p != 9 ||
      memcmp(p, " HTTP/1.1", 9) != 0)
    return 0;
  if (memchr(t, '%', tlen) || memchr(t, '+', tlen) || wg_route_target_check(t, tlen, NULL) != 0)
    return 0;
  int stream = 0;
  for (p = next_line(p, end); p < end && *p != '\r' && *p != '\n'; p = next_line(p, end)) {
    const char *e = line_end(p, end);
    size_t n = (size_t)(e - p);
    if (n >= 11 && strncasecmp(p, "connection:", 11) == 0 && !keep_alive(p + 11, e))
      return 0;
    if (n >= 7 && strncasecmp(p, "accept:", 7) == 0 && n >= 17 &&
        memmem(p, n, "text/event-stream", 17))
      stream = 1;
  }
  memcpy(out->target, t, tlen);
  out->target[tlen] = '\0';
  char *q = strchr(out->target, '?');
  if (q) {
    *q++ = '\0';
    if (split_query(q, &out->req) != 0)
      return 0;
  }
  out->req.method = "GET";
  out->req.path = out->target;
  wg_route("GET", out->target, &out->route);
  /* One job's reads only: their cost is the job's size (the bodies are rendered already).
   * The job list and the agents are rendered per read from the whole cluster, which would hold
   * up every other connection of the front: libmicrohttpd's threads answer those. */
  wg_route_id_t id = out->route.id;
  if (out->route.status != 0 || !wg_cache_route(id) ||
      (id != WG_ROUTE_JOB_GET && id != WG_ROUTE_JOB_PLAN && id != WG_ROUTE_JOB_GROUPS &&
       id != WG_ROUTE_JOB_EVENTS))
    return 0;
  if (out->route.id == WG_ROUTE_JOB_EVENTS && (stream || c->token[0]))
    return 0;
  return 1;
}

static const char *reason(int status) {
  switch (status) {
  case 200: return "OK";
  case 400: return "Bad Request";
  case 404: return "Not Found";
  case 500: return "Internal Server Error";
  case 503: return "Service Unavailable";
  default: return NULL;
  }
}

size_t wg_fast_read_head(int status, const char *content_type, size_t body_len, char *buf,
                         size_t cap) {
  static time_t date_at = -1; /* front thread only */
  static char date[40];
  const char *why = reason(status);
  time_t now = time(NULL);
  if (!why)
    return 0;
  if (now != date_at) {
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    date_at = now;
  }
  int n = snprintf(buf, cap,
                   "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                   status, why, date, content_type ? content_type : "application/json", body_len);
  return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}
