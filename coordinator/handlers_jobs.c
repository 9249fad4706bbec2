/* coordinator/handlers_jobs.c — the /v1/jobs mutations: submit, patch, delete.
 *
 * Each writes with a Txn guarded by what it read: submit creates spec + status only if the
 * spec key does not exist; patch and delete read the job (linearizable), write guarded by the
 * mod revision they read, retry a few times when the scheduler wrote in between, then answer
 * 409 conflict. They answer with the job as the etcd read source renders it (reads.c). The
 * scheduler does the rest (assignment, plans, release of agents). Runs on the HTTP workers
 * (http.c). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "cache.h"
#include "coord.h"
#include "handlers.h"
#include "reads.h"
#include "request.h"
#include "scheduler.h"
#include "store.h"

#define WG_TXN_RETRIES 5 /* guarded writes tried before 409 conflict */

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
 * notes the write's revision for the read cache (a later read waits for it) and pokes the
 * scheduler. Frees *tr. Returns e. */
static int settle_write(wg_coord_t *c, int e, wagma_etcd_txn_result_t *tr, wg_response_t *res) {
  int64_t rev = tr->revision;
  wagma_etcd_txn_result_free(tr);
  if (e == WAGMA_ECONFLICT)
    return e;
  if (e) {
    wg_response_etcd_error(c, res, e);
  } else {
    wg_cache_note_write(c->cache, rev); /* reads through this coordinator see it (docs/api.md) */
    wg_scheduler_poke(c->scheduler);
  }
  return e;
}

/* Answers with the job as it is now (status 200 or 201). */
static void respond_job(wg_coord_t *c, const char *id, int status, wg_response_t *res) {
  wg_read_t rd;
  wg_read_etcd_init(&rd, c, NULL);
  wg_reads_job(&rd, id, status, res);
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
  wagma_etcd_txn_result_t tr = {0};
  e = settle_write(c, wagma_etcd_txn(c->etcd, &cmp, 1, ops, 2, NULL, 0, &tr), &tr, res);
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
    wagma_etcd_txn_result_t tr = {0};
    e = wagma_etcd_txn(c->etcd, &cmp, 1, &op, 1, NULL, 0, &tr);
    free(json);
    if ((e = settle_write(c, e, &tr, res)) == WAGMA_ECONFLICT)
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
    wagma_etcd_txn_result_t tr = {0};
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
      e = wagma_etcd_txn(c->etcd, &cmp, 1, &op, 1, NULL, 0, &tr);
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
      wg_job_record_summary(&rec, rec.status.finished, &rec.status.summary);
      rec.status.iteration = wg_job_record_iteration(&rec);
      e = wagma_job_status_to_json(&rec.status, &json);
      wg_job_record_free(&rec);
      if (e) {
        wg_response_error(res, 500, "internal", NULL, "out of memory");
        return;
      }
      wagma_etcd_op_t op = {
          .type = WAGMA_ETCD_OP_PUT, .key = status_key, .value = json, .value_len = strlen(json)};
      e = wagma_etcd_txn(c->etcd, &cmp, 1, &op, 1, NULL, 0, &tr);
      free(json);
    }
    if ((e = settle_write(c, e, &tr, res)) == WAGMA_ECONFLICT)
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
