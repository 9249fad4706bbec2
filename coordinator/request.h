/* coordinator/request.h — one REST request and its response, independent of libmicrohttpd (http.c
 * fills them, the connection front too; dispatch.c holds the response helpers). Tests and fuzzers
 * build them by hand. */
#ifndef WAGMA_COORD_REQUEST_H
#define WAGMA_COORD_REQUEST_H

#include <stddef.h>

#define WG_MAX_QUERY 8

typedef struct wg_request {
  const char *method;
  const char *path; /* percent-decoded, without the query */
  /* The request target as it came on the wire (path and query, not decoded), target_len
   * bytes; a NUL among them was a raw NUL byte on the wire (http.c passes the bytes up to and
   * including it). NULL when the server did not capture it: then only path is checked. */
  const char *target;
  size_t target_len;
  const char *content_type;  /* NULL if absent */
  const char *authorization; /* NULL if absent */
  const char *body;          /* NULL or body_len bytes (NUL-terminated by http.c) */
  size_t body_len;
  int body_too_large; /* the body exceeded --max-body (it was discarded) */
  size_t max_body;
  int nquery;
  int query_overflow; /* more than WG_MAX_QUERY parameters came: answered 400 */
  const char *query_key[WG_MAX_QUERY];
  const char *query_value[WG_MAX_QUERY]; /* NULL for "?flag" */
  /* 1 when the client has left (its connection ended): a long handler asks between etcd
   * calls and stops. NULL: never asked (tests, fuzzers). */
  int (*gone)(void *gone_user);
  void *gone_user;
} wg_request_t;

/* Returns the value of a query parameter, NULL when absent; *present (may be NULL) = 1 when
 * the key appeared (even without value). */
const char *wg_request_query(const wg_request_t *req, const char *key, int *present);

typedef struct wg_response {
  int status;
  int static_body;           /* body points at static memory (not freed, not copied) */
  const char *cache_control; /* static string, NULL = none */
  char *body;                /* malloc'd, owned by the response */
  size_t body_len;
  const char *content_type; /* static string */
  char location[192];       /* "" = none */
  char allow[64];           /* "" = none */
  int www_authenticate;     /* add WWW-Authenticate: Bearer */
  int retry_after;          /* add Retry-After: <seconds> (503 busy); 0 = none */
} wg_response_t;

/* Sets an error response with the JSON error body. */
void wg_response_error(wg_response_t *res, int status, const char *code, const char *field,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Takes ownership of json (malloc'd string). */
void wg_response_json(wg_response_t *res, int status, char *json);
void wg_response_free(wg_response_t *res);

#endif
