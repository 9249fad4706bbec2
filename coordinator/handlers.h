/* coordinator/handlers.h — one request from router to endpoint (dispatch.c), the endpoints that are
 * not reads (handlers_jobs.c: the mutations; handlers_misc.c: /healthz, /readyz, /metrics) and the
 * answer of an etcd failure. The reads are reads.h's. */
#ifndef WAGMA_COORD_HANDLERS_H
#define WAGMA_COORD_HANDLERS_H

#include <stdint.h>

#include "coord.h"
#include "request.h"
#include "router.h"

/* Handles one request (router + auth + handler). Fills *res. */
void wg_handle(wg_coord_t *c, const wg_request_t *req, wg_response_t *res);
/* wg_handle in two steps, for http.c: every check before the endpoint (target, route, token,
 * body size, content type) fills *r and returns 0 when the endpoint is to run, or answers in
 * *res and returns 1; wg_handle_route then runs the endpoint r names. */
int wg_handle_prepare(wg_coord_t *c, const wg_request_t *req, wg_route_t *r, wg_response_t *res);
void wg_handle_route(wg_coord_t *c, const wg_request_t *req, const wg_route_t *r,
                     wg_response_t *res);
/* 1 when the endpoint calls etcd (it then runs on an HTTP worker, never on MHD's threads). */
int wg_route_uses_etcd(wg_route_id_t id);

/* Handlers (handlers_jobs.c, handlers_misc.c). */
void wg_h_jobs_submit(wg_coord_t *c, const wg_request_t *req, wg_response_t *res);
void wg_h_job_patch(wg_coord_t *c, const char *job, const wg_request_t *req, wg_response_t *res);
void wg_h_job_delete(wg_coord_t *c, const char *job, const wg_request_t *req, wg_response_t *res);
void wg_h_healthz(wg_coord_t *c, wg_response_t *res);
void wg_h_readyz(wg_coord_t *c, wg_response_t *res);
/* The /readyz answer for a ping that returned e (0: revision rev; else detail says why). */
void wg_h_readyz_answer(wg_coord_t *c, int e, int64_t rev, const char *detail, wg_response_t *res);
void wg_h_metrics(wg_coord_t *c, wg_response_t *res);

/* Maps an etcd failure onto a response (503 unavailable, 500 otherwise). */
void wg_response_etcd_error(wg_coord_t *c, wg_response_t *res, int status);

#endif
