/* coordinator/handlers_misc.c — /v1/agents, /healthz, /readyz, /metrics.
 * /v1/agents reads the registrations, the assignments and the quarantine records in one Txn
 * (one revision); an agent is "healthy" unless a quarantine record names its current
 * registration (the agent key's create revision) and its "until" has not passed, as the
 * scheduler decides. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"

void wg_h_agents(wg_coord_t *c, wg_response_t *res) {
  char akey[256], skey[256], qkey[256];
  wagma_etcd_txn_result_t tr = {0};
  wagma_key_agents_prefix(&c->keys, akey, sizeof akey);
  wagma_key_assignments_prefix(&c->keys, skey, sizeof skey);
  wagma_key_quarantine_prefix(&c->keys, qkey, sizeof qkey);
  wagma_etcd_op_t ops[3] = {{.type = WAGMA_ETCD_OP_RANGE, .key = akey, .prefix = 1},
                            {.type = WAGMA_ETCD_OP_RANGE, .key = skey, .prefix = 1},
                            {.type = WAGMA_ETCD_OP_RANGE, .key = qkey, .prefix = 1}};
  int e = wagma_etcd_txn(c->etcd, NULL, 0, ops, 3, NULL, 0, &tr);
  if (e || tr.n != 3) {
    wg_response_etcd_error(c, res, e ? e : WAGMA_EPROTO);
    wagma_etcd_txn_result_free(&tr);
    return;
  }
  wg_agents_answer(c, &tr.results[0].range, &tr.results[1].range, &tr.results[2].range, wg_wall(),
                   res);
  wagma_etcd_txn_result_free(&tr);
}

/* The answer of GET /v1/agents from the registrations, assignments and quarantine records
 * (each sorted by key, as etcd returns them), at wall time now. */
void wg_agents_answer(wg_coord_t *c, const wagma_etcd_range_t *agents,
                      const wagma_etcd_range_t *assign, const wagma_etcd_range_t *quar, double now,
                      wg_response_t *res) {
  json_t *arr = json_array();
  size_t j = 0, q = 0;
  for (size_t i = 0; i < agents->n; i++) {
    char name[WAGMA_API_NAME_MAX] = "";
    wagma_agent_info_t info;
    wagma_api_error_t err;
    const wagma_etcd_kv_t *kv = &agents->kvs[i];
    if (wagma_key_parse(&c->keys, kv->key, kv->key_len, NULL, name) != WAGMA_KEY_AGENT ||
        wagma_agent_info_from_json(kv->value, kv->value_len, &info, &err))
      continue;
    /* Both ranges are sorted by name: merge. */
    json_t *job = json_null();
    while (j < assign->n) {
      char an[WAGMA_API_NAME_MAX] = "";
      wagma_key_parse(&c->keys, assign->kvs[j].key, assign->kvs[j].key_len, NULL, an);
      int d = strcmp(an, name);
      if (d > 0)
        break;
      j++;
      if (d == 0) {
        wagma_assignment_t a;
        if (wagma_assignment_from_json(assign->kvs[j - 1].value, assign->kvs[j - 1].value_len, &a,
                                       &err) == 0) {
          json_decref(job);
          job = json_string(a.job);
        }
        break;
      }
    }
    /* The quarantine record of this agent, if it names this registration. */
    json_t *quarantine = NULL;
    while (q < quar->n) {
      char qn[WAGMA_API_NAME_MAX] = "";
      wagma_key_parse(&c->keys, quar->kvs[q].key, quar->kvs[q].key_len, NULL, qn);
      int d = strcmp(qn, name);
      if (d > 0)
        break;
      q++;
      wagma_quarantine_t qr;
      if (d == 0 &&
          wagma_quarantine_from_json(quar->kvs[q - 1].value, quar->kvs[q - 1].value_len, &qr,
                                     &err) == 0 &&
          qr.registration == kv->create_revision && now < qr.until) {
        quarantine = json_pack("{s:s,s:s,s:f,s:f}", "reason", qr.reason, "job", qr.job, "since",
                               qr.since, "until", qr.until);
        if (!quarantine) /* a reason that is not UTF-8 */
          quarantine = json_pack("{s:s,s:s,s:f,s:f}", "reason", "(not UTF-8)", "job", qr.job,
                                 "since", qr.since, "until", qr.until);
        break;
      }
    }
    json_t *o = wagma_agent_info_to_value(&info);
    json_t *full = json_object();
    json_object_set_new(full, "name", json_string(name));
    json_object_update(full, o);
    json_decref(o);
    json_object_set_new(full, "job", job);
    json_object_set_new(full, "healthy", json_boolean(quarantine == NULL));
    if (quarantine)
      json_object_set_new(full, "quarantine", quarantine);
    json_array_append_new(arr, full);
  }
  json_t *out = json_pack("{s:o}", "agents", arr);
  wg_response_json(res, 200, out ? json_dumps(out, WG_JSON_FLAGS) : NULL);
  json_decref(out);
}

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
