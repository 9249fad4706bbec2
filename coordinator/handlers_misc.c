/* coordinator/handlers_misc.c — /healthz, /readyz, /metrics: the coordinator's own state, no
 * job data (the reads are reads.c's). /healthz and /metrics run on libmicrohttpd's threads
 * and never call etcd; /readyz pings etcd (through http.c's readiness prober). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "election.h"
#include "handlers.h"
#include "metrics.h"
#include "request.h"

void wg_h_healthz(wg_coord_t *c, wg_response_t *res) {
  json_t *o = json_pack("{s:s,s:s,s:b}", "status", "ok", "id", c->id, "leader",
                        wg_election_is_leader(c->election, NULL));
  wg_response_json(res, 200, o ? json_dumps(o, WG_JSON_FLAGS) : NULL);
  json_decref(o);
}

void wg_h_readyz(wg_coord_t *c, wg_response_t *res) {
  int64_t rev = 0;
  int e = wagma_etcd_ping(c->etcd, &rev);
  wg_h_readyz_answer(c, e, rev, e ? wagma_etcd_errmsg(c->etcd) : "", res);
}

/* http.c pings from its readiness prober and answers through this. */
void wg_h_readyz_answer(wg_coord_t *c, int e, int64_t rev, const char *detail, wg_response_t *res) {
  if (e) {
    wg_response_error(res, 503, "unavailable", NULL, "etcd does not answer: %s", detail);
    return;
  }
  json_t *o = json_pack("{s:b,s:s,s:b,s:I}", "ready", 1, "id", c->id, "leader",
                        wg_election_is_leader(c->election, NULL), "revision", (json_int_t)rev);
  wg_response_json(res, 200, o ? json_dumps(o, WG_JSON_FLAGS) : NULL);
  json_decref(o);
}

void wg_h_metrics(wg_coord_t *c, wg_response_t *res) {
  char *text = wg_metrics_render(c->metrics, wg_election_is_leader(c->election, NULL));
  if (!text) {
    wg_response_error(res, 500, "internal", NULL, "out of memory");
    return;
  }
  wg_response_free(res);
  res->status = 200;
  res->body = text;
  res->body_len = strlen(text);
  res->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
