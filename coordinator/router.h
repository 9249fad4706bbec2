/* coordinator/router.h — (method, path) -> route, and the raw request-target check (router.c, pure;
 * fuzzed). */
#ifndef WAGMA_COORD_ROUTER_H
#define WAGMA_COORD_ROUTER_H

#include "wagma/api.h"

typedef enum wg_route_id {
  WG_ROUTE_NONE = 0,
  WG_ROUTE_JOBS_LIST,
  WG_ROUTE_JOBS_SUBMIT,
  WG_ROUTE_JOB_GET,
  WG_ROUTE_JOB_PATCH,
  WG_ROUTE_JOB_DELETE,
  WG_ROUTE_JOB_GROUPS,
  WG_ROUTE_JOB_PLAN,
  WG_ROUTE_AGENTS,
  WG_ROUTE_HEALTHZ,
  WG_ROUTE_READYZ,
  WG_ROUTE_METRICS,
  WG_ROUTE_JOB_EVENTS, /* GET /v1/jobs/{id}/events: the timeline (JSON), or a stream */
  WG_ROUTE_EVENTS,     /* GET /v1/events: the stream of every job's changes */
  WG_ROUTE_UI,         /* GET /, /ui/...: the web view's files */
} wg_route_id_t;

typedef struct wg_route {
  wg_route_id_t id;
  int status;     /* 0 = matched; 404 or 405 otherwise */
  char allow[64]; /* with 405: the methods the path has */
  char job[WAGMA_API_NAME_MAX];
  int mutation;      /* POST / PATCH / DELETE: needs the token when one is configured */
  int events;        /* an events path: needs the token too (docs/api.md "Event streams") */
  int asset;         /* WG_ROUTE_UI: the file's index (ui.c); -1 = "/" (redirect to /ui/) */
  const char *label; /* low-cardinality path label for metrics ("/v1/jobs/{id}") */
} wg_route_t;

/* Pure. path has no query string. HEAD is treated as GET. */
void wg_route(const char *method, const char *path, wg_route_t *out);

/* Pure. Checks a raw request target (len bytes, path and query, before any percent-decoding):
 * 0 when acceptable, 400 when it holds a NUL or control byte, raw or percent-encoded, a
 * malformed percent escape, or (in the path) an encoded '/'. *why (may be NULL) gets a
 * static reason with 400, NULL with 0. target NULL is acceptable (nothing to check). */
int wg_route_target_check(const char *target, size_t len, const char **why);

#endif
