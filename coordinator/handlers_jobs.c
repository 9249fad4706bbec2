/* coordinator/handlers_jobs.c — the /v1/jobs endpoints.
 *
 * Every handler reads etcd directly (linearizable reads, so a replica that does not lead
 * still answers with the truth) and writes with Txns guarded by the mod revision it read:
 * submit creates spec + status only if the spec key does not exist; patch and delete retry a
 * few times when the scheduler wrote in between, then answer 409 conflict. The scheduler
 * does the rest (assignment, plans, release of agents). Runs on MHD's pool threads. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "coord.h"
#include "wagma/collective.h"
#include "wagma/log_internal.h"

#define WG_TXN_RETRIES 5

/* Parses the body as JSON (400 bad_json on failure). Ownership: the caller decrefs. */
static json_t *parse_body(const wg_request_t *req, wg_response_t *res) {
  json_error_t jerr;
  if (!req->body || req->body_len == 0) {
    wg_response_error(res, 400, "bad_json", NULL, "empty body");
    return NULL;
  }
  json_t *root = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    wg_response_error(res, 400, "bad_json", NULL, "invalid JSON at line %d column %d: %s",
                      jerr.line, jerr.column, jerr.text);
  return root;
}

/* Loads job's record; on failure answers 404 not_found or the etcd error and returns it.
 * Ownership: on 0, *rec is the caller's (wg_job_record_free). */
static int load_job(wg_coord_t *c, const char *job, wg_job_record_t *rec, wg_response_t *res) {
  int e = wg_store_load_job(c, job, rec);
  if (e == WAGMA_ENOTFOUND)
    wg_response_error(res, 404, "not_found", NULL, "no job %s", job);
  else if (e)
    wg_response_etcd_error(c, res, e);
  return e;
}

/* Settles the result e of a guarded write: WAGMA_ECONFLICT is handed back untouched (the
 * caller retries or names the conflict), another error is answered as an etcd error, success
 * pokes the scheduler. Returns e. */
static int settle_write(wg_coord_t *c, int e, wg_response_t *res) {
  if (e == WAGMA_ECONFLICT)
    return e;
  if (e)
    wg_response_etcd_error(c, res, e);
  else
    wg_scheduler_poke(c->scheduler);
  return e;
}

static void respond_job(wg_coord_t *c, const char *id, int status, wg_response_t *res) {
  wg_job_record_t rec;
  if (load_job(c, id, &rec, res))
    return;
  json_t *v = wg_job_record_to_value(&rec, 1);
  wg_job_record_free(&rec);
  wg_response_json(res, status, v ? json_dumps(v, WG_JSON_FLAGS) : NULL);
  json_decref(v);
}

void wg_h_job_get(wg_coord_t *c, const char *job, wg_response_t *res) {
  respond_job(c, job, 200, res);
}

void wg_h_jobs_list(wg_coord_t *c, const wg_request_t *req, wg_response_t *res) {
  char key[256];
  wagma_etcd_range_t range = {0};
  wagma_etcd_range_options_t opt = {.prefix = 1};
  wagma_job_state_t want = WAGMA_JOB_PENDING;
  int filter = 0, e;
  const char *state = wg_request_query(req, "state", &filter);
  if (filter && wagma_job_state_from_name(state, &want) != 0) {
    wg_response_error(res, 400, "bad_request", "state",
                      "state must be pending, running, succeeded, failed or stopped");
    return;
  }
  wagma_key_jobs_prefix(&c->keys, key, sizeof key);
  if ((e = wagma_etcd_range(c->etcd, key, &opt, &range))) {
    wg_response_etcd_error(c, res, e);
    return;
  }
  json_t *jobs = json_array();
  size_t i = 0;
  while (i < range.n) {
    char id[WAGMA_API_NAME_MAX] = "";
    wagma_key_parse(&c->keys, range.kvs[i].key, range.kvs[i].key_len, id, NULL);
    size_t j = i + 1;
    while (j < range.n) {
      char other[WAGMA_API_NAME_MAX] = "";
      wagma_key_parse(&c->keys, range.kvs[j].key, range.kvs[j].key_len, other, NULL);
      if (strcmp(other, id) != 0)
        break;
      j++;
    }
    wg_job_record_t rec;
    if (id[0] && wg_job_record_from_kvs(c, id, range.kvs + i, j - i, &rec) == 0) {
      if (rec.has_spec && (!filter || rec.status.state == want))
        json_array_append_new(jobs, wg_job_record_to_value(&rec, 0));
      wg_job_record_free(&rec);
    }
    i = j;
  }
  wagma_etcd_range_free(&range);
  json_t *o = json_pack("{s:o}", "jobs", jobs);
  wg_response_json(res, 200, o ? json_dumps(o, WG_JSON_FLAGS) : NULL);
  json_decref(o);
}

static void random_name(char *out, size_t len) {
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
    r = (uint32_t)(wg_mono() * 1e9);
  snprintf(out, len, "job-%08x", r);
}

void wg_h_jobs_submit(wg_coord_t *c, const wg_request_t *req, wg_response_t *res) {
  wagma_job_spec_t spec;
  wagma_job_status_t st = {0};
  wagma_api_error_t err;
  char *spec_json = NULL, *status_json = NULL;
  char spec_key[256], status_key[256];
  json_t *root = parse_body(req, res);
  int e;
  if (!root)
    return;
  e = wagma_job_spec_from_value(root, &spec, &err);
  json_decref(root);
  if (e) {
    wg_response_error(res, 422, "invalid_spec", err.field, "%s%s%s", err.field,
                      err.field[0] ? ": " : "", err.message);
    return;
  }
  if (!spec.name[0])
    random_name(spec.name, sizeof spec.name);
  st.state = WAGMA_JOB_PENDING;
  /* The scheduler writes the same text while the job waits: no rewrite per pass. */
  snprintf(st.reason, sizeof st.reason, "waiting for %d free %s agents", spec.min_workers,
           wagma_device_name(spec.device));
  st.created = wg_wall();
  if (wagma_job_spec_to_json(&spec, &spec_json) || wagma_job_status_to_json(&st, &status_json)) {
    wg_response_error(res, 500, "internal", NULL, "out of memory");
    goto out;
  }
  wagma_key_job_spec(&c->keys, spec.name, spec_key, sizeof spec_key);
  wagma_key_job_status(&c->keys, spec.name, status_key, sizeof status_key);
  wagma_etcd_cmp_t cmp = {
      .key = spec_key, .target = WAGMA_ETCD_CMP_VERSION, .result = WAGMA_ETCD_EQUAL, .number = 0};
  wagma_etcd_op_t ops[2] = {
      {.type = WAGMA_ETCD_OP_PUT,
       .key = spec_key,
       .value = spec_json,
       .value_len = strlen(spec_json)},
      {.type = WAGMA_ETCD_OP_PUT,
       .key = status_key,
       .value = status_json,
       .value_len = strlen(status_json)},
  };
  e = settle_write(c, wagma_etcd_txn(c->etcd, &cmp, 1, ops, 2, NULL, 0, NULL), res);
  if (e == WAGMA_ECONFLICT)
    wg_response_error(res, 409, "exists", "name", "job %s exists already", spec.name);
  if (e)
    goto out;
  respond_job(c, spec.name, 201, res);
  if (res->status == 201)
    snprintf(res->location, sizeof res->location, "/v1/jobs/%s", spec.name);
out:
  free(spec_json);
  free(status_json);
}

void wg_h_job_patch(wg_coord_t *c, const char *job, const wg_request_t *req, wg_response_t *res) {
  wagma_job_patch_t patch;
  wagma_api_error_t err;
  char key[256];
  json_t *root = parse_body(req, res);
  int e;
  if (!root)
    return;
  json_decref(root);
  if (wagma_job_patch_from_json(req->body, req->body_len, &patch, &err)) {
    wg_response_error(res, 422, "invalid_patch", err.field, "%s%s%s", err.field,
                      err.field[0] ? ": " : "", err.message);
    return;
  }
  wagma_key_job_spec(&c->keys, job, key, sizeof key);
  for (int attempt = 0; attempt < WG_TXN_RETRIES; attempt++) {
    wg_job_record_t rec;
    char *json = NULL;
    if (load_job(c, job, &rec, res))
      return;
    if (wagma_job_state_terminal(rec.status.state)) {
      wg_response_error(res, 409, "finished", NULL, "job %s is %s", job,
                        wagma_job_state_name(rec.status.state));
      wg_job_record_free(&rec);
      return;
    }
    wagma_job_spec_t spec = rec.spec;
    int64_t mod = rec.spec_mod;
    wg_job_record_free(&rec);
    if (wagma_job_patch_apply(&patch, &spec, &err)) {
      wg_response_error(res, 422, "invalid_patch", err.field, "%s: %s", err.field, err.message);
      return;
    }
    if (wagma_job_spec_to_json(&spec, &json)) {
      wg_response_error(res, 500, "internal", NULL, "out of memory");
      return;
    }
    wagma_etcd_cmp_t cmp = {
        .key = key, .target = WAGMA_ETCD_CMP_MOD, .result = WAGMA_ETCD_EQUAL, .number = mod};
    wagma_etcd_op_t op = {
        .type = WAGMA_ETCD_OP_PUT, .key = key, .value = json, .value_len = strlen(json)};
    e = wagma_etcd_txn(c->etcd, &cmp, 1, &op, 1, NULL, 0, NULL);
    free(json);
    if ((e = settle_write(c, e, res)) == WAGMA_ECONFLICT)
      continue;
    if (!e)
      respond_job(c, job, 200, res);
    return;
  }
  wg_response_error(res, 409, "conflict", NULL, "job %s changed concurrently; retry", job);
}

void wg_h_job_delete(wg_coord_t *c, const char *job, const wg_request_t *req, wg_response_t *res) {
  int present = 0, purge = 0, e;
  char status_key[256], prefix[256];
  const char *pv = wg_request_query(req, "purge", &present);
  if (present) {
    if (!pv || !*pv || strcmp(pv, "true") == 0 || strcmp(pv, "1") == 0)
      purge = 1;
    else if (strcmp(pv, "false") != 0 && strcmp(pv, "0") != 0) {
      wg_response_error(res, 400, "bad_request", "purge", "purge must be true or false");
      return;
    }
  }
  wagma_key_job_status(&c->keys, job, status_key, sizeof status_key);
  wagma_key_job_prefix(&c->keys, job, prefix, sizeof prefix);
  for (int attempt = 0; attempt < WG_TXN_RETRIES; attempt++) {
    wg_job_record_t rec;
    char *json = NULL;
    if (load_job(c, job, &rec, res))
      return;
    int terminal = wagma_job_state_terminal(rec.status.state);
    int64_t mod = rec.status_mod;
    wagma_etcd_cmp_t cmp = {
        .key = status_key, .target = WAGMA_ETCD_CMP_MOD, .result = WAGMA_ETCD_EQUAL, .number = mod};
    if (purge) {
      wg_job_record_free(&rec);
      if (!terminal) {
        wg_response_error(res, 409, "active", NULL,
                          "job %s is still active: stop it first (DELETE without purge)", job);
        return;
      }
      wagma_etcd_op_t op = {.type = WAGMA_ETCD_OP_DELETE, .key = prefix, .prefix = 1};
      e = wagma_etcd_txn(c->etcd, &cmp, 1, &op, 1, NULL, 0, NULL);
    } else {
      if (terminal) {
        wg_response_error(res, 409, "finished", NULL, "job %s is already %s", job,
                          wagma_job_state_name(rec.status.state));
        wg_job_record_free(&rec);
        return;
      }
      rec.status.state = WAGMA_JOB_STOPPED;
      snprintf(rec.status.reason, sizeof rec.status.reason, "stopped by request");
      rec.status.finished = wg_wall();
      rec.status.iteration = wg_job_record_iteration(&rec);
      e = wagma_job_status_to_json(&rec.status, &json);
      wg_job_record_free(&rec);
      if (e) {
        wg_response_error(res, 500, "internal", NULL, "out of memory");
        return;
      }
      wagma_etcd_op_t op = {
          .type = WAGMA_ETCD_OP_PUT, .key = status_key, .value = json, .value_len = strlen(json)};
      e = wagma_etcd_txn(c->etcd, &cmp, 1, &op, 1, NULL, 0, NULL);
      free(json);
    }
    if ((e = settle_write(c, e, res)) == WAGMA_ECONFLICT)
      continue;
    if (e)
      return;
    if (purge) {
      wg_response_free(res);
      res->status = 204;
      res->content_type = NULL;
    } else {
      respond_job(c, job, 200, res);
    }
    return;
  }
  wg_response_error(res, 409, "conflict", NULL, "job %s changed concurrently; retry", job);
}

/* Reads the plan key; 404 not_found / no_plan. Ownership: *kv is the caller's. */
static int load_plan(wg_coord_t *c, const char *job, wagma_etcd_kv_t **kv, wg_response_t *res) {
  char key[256];
  wagma_key_job_plan(&c->keys, job, key, sizeof key);
  int e = wagma_etcd_get(c->etcd, key, kv, NULL);
  if (e == WAGMA_ENOTFOUND) {
    wagma_etcd_kv_t *spec = NULL;
    wagma_key_job_spec(&c->keys, job, key, sizeof key);
    int s = wagma_etcd_get(c->etcd, key, &spec, NULL);
    wagma_etcd_kv_free(spec);
    if (s == 0)
      wg_response_error(res, 404, "no_plan", NULL, "job %s has no plan yet", job);
    else if (s == WAGMA_ENOTFOUND)
      wg_response_error(res, 404, "not_found", NULL, "no job %s", job);
    else
      wg_response_etcd_error(c, res, s);
    return e;
  }
  if (e)
    wg_response_etcd_error(c, res, e);
  return e;
}

void wg_h_job_plan(wg_coord_t *c, const char *job, wg_response_t *res) {
  wagma_etcd_kv_t *kv = NULL;
  if (load_plan(c, job, &kv, res))
    return;
  wg_response_json(res, 200, strndup(kv->value, kv->value_len));
  wagma_etcd_kv_free(kv);
}

static int parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s || strlen(s) > 19)
    return -1;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9')
      return -1;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (v > INT64_MAX) /* answered as a JSON integer (int64) */
    return -1;
  *out = v;
  return 0;
}

/* The plan in effect at round t when t is before the current plan's start_round: the plan of
 * the highest epoch whose start_round <= t among the history entries plans/<epoch> (while
 * start_rounds only grow that is the greatest start_round <= t; after a restart from an older
 * checkpoint the later epoch ran those rounds again and wins). Answers 404 no_plan when no
 * kept entry starts at or before t, 500 when the entry does not decode or rebuild.
 * Ownership: on 0, *plan is the caller's (wagma_plan_free). */
static int plan_from_history(wg_coord_t *c, const char *job, uint64_t t, wagma_plan_t *plan,
                             wg_response_t *res) {
  char key[256];
  wagma_etcd_range_t range = {0};
  wagma_etcd_range_options_t opt = {.prefix = 1};
  wagma_plan_record_t rec, best;
  wagma_api_error_t err;
  uint64_t oldest_epoch = 0, oldest_start = 0;
  int found = 0, e;
  memset(&best, 0, sizeof best);
  wagma_key_job_plans_prefix(&c->keys, job, key, sizeof key);
  if ((e = wagma_etcd_range(c->etcd, key, &opt, &range))) {
    wg_response_etcd_error(c, res, e);
    return e;
  }
  for (size_t i = range.n; i-- > 0 && !found;) { /* keys sort by epoch: newest first */
    const wagma_etcd_kv_t *kv = &range.kvs[i];
    if (wagma_plan_record_from_json(kv->value, kv->value_len, &rec, &err) != 0) {
      wg_logf(c->log, c->log_user, WAGMA_LOG_WARN, "%s: bad plan history entry (%s: %s)", kv->key,
              err.field, err.message);
      continue;
    }
    if (rec.start_round <= t) {
      best = rec;
      found = 1;
    } else {
      oldest_epoch = rec.epoch;
      oldest_start = rec.start_round;
      wagma_plan_record_free(&rec);
    }
  }
  wagma_etcd_range_free(&range);
  if (!found) {
    if (oldest_epoch)
      wg_response_error(res, 404, "no_plan", "iteration",
                        "no plan of job %s covers iteration %llu: the oldest plan kept (epoch "
                        "%llu) starts at round %llu",
                        job, (unsigned long long)t, (unsigned long long)oldest_epoch,
                        (unsigned long long)oldest_start);
    else
      wg_response_error(res, 404, "no_plan", "iteration", "no plan of job %s covers iteration %llu",
                        job, (unsigned long long)t);
    return WAGMA_ENOTFOUND;
  }
  e = wg_planner_from_record(&best, plan);
  if (e)
    wg_response_error(res, 500, "internal", NULL,
                      "the plan history entry of epoch %llu does not rebuild: %s",
                      (unsigned long long)best.epoch, wagma_strerror(e));
  wagma_plan_record_free(&best);
  return e;
}

/* GET /v1/jobs/{id}/groups[?iteration=T]: the groups of round T in the plan in effect at T
 * (round == iteration, docs/agent.md): the current plan when T >= its start_round, else the
 * plan history. Without T: the job's iteration, at least the current start_round. */
void wg_h_job_groups(wg_coord_t *c, const char *job, const wg_request_t *req, wg_response_t *res) {
  wagma_etcd_kv_t *kv = NULL;
  wagma_plan_t plan;
  char perr[256];
  uint64_t t = 0;
  int given = 0;
  const char *it = wg_request_query(req, "iteration", &given);
  memset(&plan, 0, sizeof plan);
  if (given && parse_u64(it, &t)) {
    wg_response_error(res, 400, "bad_request", "iteration",
                      "iteration must be an integer in [0, 2^63 - 1]");
    return;
  }
  if (load_plan(c, job, &kv, res))
    return;
  if (wagma_plan_from_json(kv->value, kv->value_len, &plan, perr, sizeof perr)) {
    wg_response_error(res, 500, "internal", NULL, "stored plan does not decode: %s", perr);
    goto out;
  }
  if (!given) {
    wg_job_record_t rec;
    if (wg_store_load_job(c, job, &rec) == 0) {
      t = wg_job_record_iteration(&rec);
      wg_job_record_free(&rec);
    }
    if (t < plan.start_round)
      t = plan.start_round;
  } else if (t < plan.start_round) {
    wagma_plan_free(&plan);
    if (plan_from_history(c, job, t, &plan, res))
      goto out;
  }
  json_t *groups = json_array();
  int global = plan.staleness_bound > 0 && (t + 1) % (uint64_t)plan.staleness_bound == 0;
  int phase = (int)(t % (uint64_t)plan.nphases);
  if (global) {
    json_t *ranks = json_array(), *names = json_array();
    for (int r = 0; r < plan.nranks; r++) {
      json_array_append_new(ranks, json_integer(r));
      json_array_append_new(names, json_string(plan.members[r].name));
    }
    json_array_append_new(groups,
                          json_pack("{s:i,s:o,s:o}", "group", 0, "ranks", ranks, "members", names));
  } else {
    const wagma_phase_t *ph = &plan.phases[phase];
    for (int g = 0; g < ph->ngroups; g++) {
      json_t *ranks = json_array(), *names = json_array();
      for (int k = ph->offsets[g]; k < ph->offsets[g + 1]; k++) {
        json_array_append_new(ranks, json_integer(ph->ranks[k]));
        json_array_append_new(names, json_string(plan.members[ph->ranks[k]].name));
      }
      json_array_append_new(
          groups, json_pack("{s:i,s:o,s:o}", "group", g, "ranks", ranks, "members", names));
    }
  }
  json_t *o =
      json_pack("{s:s,s:I,s:I,s:I,s:i,s:s,s:o}", "job", job, "epoch", (json_int_t)plan.epoch,
                "start_round", (json_int_t)plan.start_round, "iteration", (json_int_t)t, "phase",
                phase, "kind", global ? "global" : "group", "groups", groups);
  wg_response_json(res, 200, o ? json_dumps(o, WG_JSON_FLAGS) : NULL);
  json_decref(o);
out:
  wagma_plan_free(&plan);
  wagma_etcd_kv_free(kv);
}
