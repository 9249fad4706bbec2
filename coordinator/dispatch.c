/* coordinator/dispatch.c — one request from router to handler: request target, route,
 * content type, bearer token (mutations and the events paths), then the endpoint. Also the response
 * helpers. Independent of libmicrohttpd so tests and fuzzers can drive it. Thread-safe: the checks
 * run on MHD's threads, the endpoints that call etcd on the HTTP workers (http.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cache.h"
#include "coord.h"
#include "handlers.h"
#include "reads.h"
#include "request.h"
#include "router.h"
#include "ui.h"

const char *wg_request_query(const wg_request_t *req, const char *key, int *present) {
  if (present)
    *present = 0;
  for (int i = 0; i < req->nquery; i++) {
    if (strcmp(req->query_key[i], key) == 0) {
      if (present)
        *present = 1;
      return req->query_value[i];
    }
  }
  return NULL;
}

void wg_response_free(wg_response_t *res) {
  if (!res->static_body)
    free(res->body);
  res->static_body = 0;
  res->body = NULL;
  res->body_len = 0;
}

void wg_response_json(wg_response_t *res, int status, char *json) {
  wg_response_free(res);
  res->status = json ? status : 500;
  res->body = json ? json
                   : strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of "
                            "memory\"}}");
  res->body_len = res->body ? strlen(res->body) : 0;
  res->content_type = "application/json";
}

void wg_response_error(wg_response_t *res, int status, const char *code, const char *field,
                       const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  wg_response_json(res, status, wagma_api_error_body(code, msg, field));
  res->status = status;
}

void wg_response_etcd_error(wg_coord_t *c, wg_response_t *res, int status) {
  const char *detail = c->etcd ? wagma_etcd_errmsg(c->etcd) : "";
  if (status == WAGMA_EUNAVAIL || status == WAGMA_ETIMEDOUT)
    wg_response_error(res, 503, "unavailable", NULL, "etcd unavailable: %s", detail);
  else
    wg_response_error(res, 500, "internal", NULL, "etcd: %s: %s", wagma_strerror(status), detail);
}

/* Constant-time comparison of the presented token with the configured one. */
static int token_ok(const char *configured, const char *authorization) {
  static const char scheme[] = "Bearer ";
  if (!authorization || strncasecmp(authorization, scheme, sizeof scheme - 1) != 0)
    return 0;
  const char *t = authorization + sizeof scheme - 1;
  while (*t == ' ')
    t++;
  size_t a = strlen(configured), b = strlen(t);
  unsigned char diff = (unsigned char)(a != b);
  for (size_t i = 0; i < a; i++)
    diff |= (unsigned char)(configured[i] ^ (i < b ? t[i] : 0));
  return diff == 0;
}

/* application/json, optionally with parameters (charset) and the merge-patch variant. */
static int content_type_json(const char *ct) {
  if (!ct)
    return 0;
  while (*ct == ' ')
    ct++;
  size_t n = strcspn(ct, "; ");
  return (n == 16 && strncasecmp(ct, "application/json", 16) == 0) ||
         (n == 28 && strncasecmp(ct, "application/merge-patch+json", 28) == 0);
}

int wg_handle_prepare(wg_coord_t *c, const wg_request_t *req, wg_route_t *r, wg_response_t *res) {
  const char *why = NULL;
  if (wg_route_target_check(req->target, req->target_len, &why) != 0) {
    /* The decoded path is not what the client sent (cut at a NUL, an encoded '/', ...):
     * neither route it nor echo it. */
    memset(r, 0, sizeof *r);
    r->label = "other";
    wg_response_error(res, 400, "bad_request", NULL, "bad request target: %s", why);
    return 1;
  }
  wg_route(req->method, req->path, r);
  if (r->status == 404) {
    wg_response_error(res, 404, "not_found", NULL, "no such path: %s", req->path);
    return 1;
  }
  if (r->status == 405) {
    wg_response_error(res, 405, "method_not_allowed", NULL, "%s is not allowed on %s (allowed: %s)",
                      req->method, req->path, r->allow);
    snprintf(res->allow, sizeof res->allow, "%s", r->allow);
    return 1;
  }
  if ((r->mutation || r->events) && c->token[0] && !token_ok(c->token, req->authorization)) {
    wg_response_error(res, 401, "unauthorized", NULL, "missing or wrong bearer token");
    res->www_authenticate = 1;
    return 1;
  }
  if (req->query_overflow) {
    wg_response_error(res, 400, "bad_request", NULL,
                      "more than %d query parameters: none is ignored silently, so the request "
                      "is refused",
                      WG_MAX_QUERY);
    return 1;
  }
  if (req->body_too_large) {
    wg_response_error(res, 413, "too_large", NULL, "the body exceeds %zu bytes", req->max_body);
    return 1;
  }
  if ((r->id == WG_ROUTE_JOBS_SUBMIT || r->id == WG_ROUTE_JOB_PATCH) &&
      !content_type_json(req->content_type)) {
    wg_response_error(res, 415, "unsupported_media_type", NULL,
                      "the body must be application/json (got %s)",
                      req->content_type ? req->content_type : "none");
    return 1;
  }
  return 0;
}

int wg_route_uses_etcd(wg_route_id_t id) {
  return id != WG_ROUTE_HEALTHZ && id != WG_ROUTE_METRICS && id != WG_ROUTE_NONE &&
         id != WG_ROUTE_UI && id != WG_ROUTE_EVENTS;
}

void wg_handle_route(wg_coord_t *c, const wg_request_t *req, const wg_route_t *r,
                     wg_response_t *res) {
  wg_read_t rd;
  switch (r->id) {
  case WG_ROUTE_JOBS_SUBMIT: wg_h_jobs_submit(c, req, res); break;
  case WG_ROUTE_JOB_PATCH: wg_h_job_patch(c, r->job, req, res); break;
  case WG_ROUTE_JOB_DELETE: wg_h_job_delete(c, r->job, req, res); break;
  case WG_ROUTE_HEALTHZ: wg_h_healthz(c, res); break;
  case WG_ROUTE_READYZ: wg_h_readyz(c, res); break;
  case WG_ROUTE_METRICS: wg_h_metrics(c, res); break;
  case WG_ROUTE_UI: wg_h_ui(r, res); break;
  default: /* the reads; a timeline from the cache (streams are http.c's), which etcd lacks */
    if (r->id == WG_ROUTE_JOB_EVENTS && wg_cache_serve(c->cache, req, r, res) == 0)
      break;
    wg_read_etcd_init(&rd, c, req);
    if (wg_reads_answer(&rd, r, res) != 0)
      wg_response_error(res, 500, "internal", NULL, "unrouted");
    break;
  }
}

void wg_handle(wg_coord_t *c, const wg_request_t *req, wg_response_t *res) {
  wg_route_t r;
  if (!wg_handle_prepare(c, req, &r, res))
    wg_handle_route(c, req, &r, res);
}
