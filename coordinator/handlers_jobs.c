/* coordinator/handlers_jobs.c — the /v1/jobs endpoints.
 *
 * Every handler reads etcd directly (linearizable reads, so a replica that does not lead
 * still answers with the truth) and writes with Txns guarded by the mod revision it read:
 * the list reads one page (pages.c finds the ids, then spec, status and progress of each);
 * submit creates spec + status only if the spec key does not exist; patch and delete retry a
 * few times when the scheduler wrote in between, then answer 409 conflict. The scheduler
 * does the rest (assignment, plans, release of agents). Runs on the HTTP workers (http.c). */
#include <errno.h>
#include <stdint.h>
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

/* ---- GET /v1/jobs: pages ---------------------------------------------------------------- */

/* The walk's etcd access (pages.c): keys-only prefix reads and one-Txn existence checks
 * under <prefix>/jobs/. Each first asks whether the client is still there. */
typedef struct list_io {
  wg_coord_t *c;
  const wg_request_t *req;
  char jobs[256];
  size_t jobs_len;
} list_io_t;

static int list_gone(const list_io_t *io) {
  return io->req->gone && io->req->gone(io->req->gone_user);
}

static void io_free_keys(void *user, wg_keylist_t *kl) {
  (void)user;
  for (size_t i = 0; i < kl->n; i++)
    free(kl->keys[i]);
  free(kl->keys);
  memset(kl, 0, sizeof *kl);
}

static int io_keys(void *user, const char *prefix, size_t limit, wg_keylist_t *out) {
  list_io_t *io = user;
  char key[512];
  wagma_etcd_range_t r = {0};
  wagma_etcd_range_options_t opt = {.prefix = 1, .limit = (int64_t)limit, .keys_only = 1};
  if (list_gone(io))
    return WAGMA_ECANCELED;
  snprintf(key, sizeof key, "%s%s", io->jobs, prefix);
  int e = wagma_etcd_range(io->c->etcd, key, &opt, &r);
  if (e)
    return e;
  out->keys = calloc(r.n ? r.n : 1, sizeof *out->keys);
  for (size_t i = 0; out->keys && i < r.n; i++) {
    out->keys[i] = strdup(r.kvs[i].key_len >= io->jobs_len ? r.kvs[i].key + io->jobs_len : "");
    if (!out->keys[i])
      e = WAGMA_ENOMEM;
    out->n = i + 1;
  }
  if (!out->keys)
    e = WAGMA_ENOMEM;
  out->more = r.more;
  wagma_etcd_range_free(&r);
  if (e)
    io_free_keys(user, out);
  return e;
}

static int io_exists(void *user, const char *const *prefixes, size_t n, int *exists) {
  list_io_t *io = user;
  wagma_etcd_op_t ops[80];
  char keys[80][320];
  wagma_etcd_txn_result_t tr = {0};
  if (n > 80)
    return WAGMA_EINVAL;
  if (list_gone(io))
    return WAGMA_ECANCELED;
  for (size_t i = 0; i < n; i++) {
    snprintf(keys[i], sizeof keys[i], "%s%s", io->jobs, prefixes[i]);
    ops[i] =
        (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_RANGE, .key = keys[i], .prefix = 1, .limit = 1};
  }
  int e = wagma_etcd_txn(io->c->etcd, NULL, 0, ops, n, NULL, 0, &tr);
  if (!e && tr.n != n)
    e = WAGMA_EPROTO;
  for (size_t i = 0; !e && i < n; i++)
    exists[i] = tr.results[i].range.n > 0;
  wagma_etcd_txn_result_free(&tr);
  return e;
}

#define LIST_TXN_JOBS 100 /* jobs per Txn (one op each): under etcd's 128 ops per Txn */

/* 1 when the status among these kvs names a terminal state (its iteration is final: the
 * scheduler stored it when the job finished, so its progress need not be read). */
static int kvs_terminal(wg_coord_t *c, const wagma_etcd_range_t *r) {
  for (size_t j = 0; j < r->n; j++) {
    const wagma_etcd_kv_t *kv = &r->kvs[j];
    wagma_job_status_t st;
    wagma_api_error_t err;
    if (wagma_key_parse(&c->keys, kv->key, kv->key_len, NULL, NULL) != WAGMA_KEY_JOB_STATUS ||
        wagma_job_status_from_json(kv->value, kv->value_len, &st, &err) != 0)
      continue;
    int t = wagma_job_state_terminal(st.state);
    wagma_job_status_free(&st);
    return t;
  }
  return 0;
}

/* Reads the jobs of n ids, LIST_TXN_JOBS at a time: one Txn of spec and status (one prefix
 * op per job: "<id>/s" holds exactly those two keys), then one Txn of the progress records
 * (at most WG_LIST_PROGRESS_MAX each) of the jobs that are not finished, whose iteration is
 * live. Appends the REST view of the jobs that still exist (and are in state want when
 * filter) to jobs, up to max entries; *taken = how many ids were looked at (all n, or fewer
 * when max was reached: the rest is for the next page). */
static int read_page(list_io_t *io, char (*ids)[WAGMA_API_NAME_MAX], size_t n, int filter,
                     wagma_job_state_t want, json_t *jobs, size_t max, size_t *taken) {
  wg_coord_t *c = io->c;
  char(*keys)[320] = malloc(2 * LIST_TXN_JOBS * sizeof *keys);
  wagma_etcd_op_t *ops = malloc(2 * LIST_TXN_JOBS * sizeof *ops);
  size_t *prog_of = malloc(LIST_TXN_JOBS * sizeof *prog_of);
  int e = keys && ops && prog_of ? 0 : WAGMA_ENOMEM;
  *taken = 0;
  for (size_t base = 0; !e && base < n && json_array_size(jobs) < max; base += LIST_TXN_JOBS) {
    size_t k = n - base < LIST_TXN_JOBS ? n - base : LIST_TXN_JOBS, np = 0;
    wagma_etcd_txn_result_t tr = {0}, tp = {0};
    if (list_gone(io)) {
      e = WAGMA_ECANCELED;
      break;
    }
    for (size_t i = 0; i < k; i++) {
      snprintf(keys[i], sizeof keys[0], "%s%s/s", io->jobs, ids[base + i]);
      ops[i] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_RANGE, .key = keys[i], .prefix = 1};
    }
    if ((e = wagma_etcd_txn(c->etcd, NULL, 0, ops, k, NULL, 0, &tr)) == 0 && tr.n != k)
      e = WAGMA_EPROTO;
    for (size_t i = 0; !e && i < k; i++) {
      prog_of[i] = SIZE_MAX;
      if (tr.results[i].range.n == 0 || kvs_terminal(c, &tr.results[i].range))
        continue;
      wagma_key_job_progress_prefix(&c->keys, ids[base + i], keys[k + np], sizeof keys[0]);
      ops[np] = (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_RANGE,
                                  .key = keys[k + np],
                                  .prefix = 1,
                                  .limit = WG_LIST_PROGRESS_MAX};
      prog_of[i] = np++;
    }
    if (!e && np && (e = wagma_etcd_txn(c->etcd, NULL, 0, ops, np, NULL, 0, &tp)) == 0 &&
        tp.n != np)
      e = WAGMA_EPROTO;
    for (size_t i = 0; !e && i < k && json_array_size(jobs) < max; i++) {
      const wagma_etcd_range_t *sr = &tr.results[i].range;
      const wagma_etcd_range_t *pr = prog_of[i] != SIZE_MAX ? &tp.results[prog_of[i]].range : NULL;
      size_t nkv = sr->n + (pr ? pr->n : 0), at = 0;
      wagma_etcd_kv_t *kvs = malloc((nkv ? nkv : 1) * sizeof *kvs);
      if (!kvs) {
        e = WAGMA_ENOMEM;
        break;
      }
      for (size_t j = 0; j < sr->n; j++) /* shallow copies: the Txn results keep the strings */
        kvs[at++] = sr->kvs[j];
      for (size_t j = 0; pr && j < pr->n; j++)
        kvs[at++] = pr->kvs[j];
      wg_job_record_t rec;
      if (wg_job_record_from_kvs(c, ids[base + i], kvs, nkv, &rec) == 0) {
        if (rec.has_spec && (!filter || rec.status.state == want))
          json_array_append_new(jobs, wg_job_record_to_value(&rec, 0));
        wg_job_record_free(&rec);
      }
      free(kvs);
      ++*taken;
    }
    wagma_etcd_txn_result_free(&tr);
    wagma_etcd_txn_result_free(&tp);
  }
  free(keys);
  free(ops);
  free(prog_of);
  return e;
}

static int parse_limit(const char *s, int *out) {
  if (!s || !*s || strlen(s) > 6)
    return -1;
  int v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9')
      return -1;
    v = v * 10 + (*p - '0');
  }
  if (v < 1 || v > WG_LIST_LIMIT_MAX)
    return -1;
  *out = v;
  return 0;
}

/* GET /v1/jobs[?state=S][&limit=N][&continue=T]: one page of jobs in key order (pages.c).
 * Work per request is bounded: WG_LIST_ROUND_TRIPS round trips to find ids, at most
 * WG_LIST_LIMIT_MAX jobs read (in Txns of LIST_TXN_JOBS), each with at most
 * WG_LIST_PROGRESS_MAX progress records. With a state filter a page may hold fewer than
 * limit jobs (even none) while more remain: "continue" says so. */
void wg_h_jobs_list(wg_coord_t *c, const wg_request_t *req, wg_response_t *res) {
  wagma_job_state_t want_state = WAGMA_JOB_PENDING;
  int filter = 0, has_limit = 0, has_token = 0, limit = WG_LIST_LIMIT_DEFAULT, done = 0, e = 0;
  const char *state = wg_request_query(req, "state", &filter);
  const char *lim = wg_request_query(req, "limit", &has_limit);
  const char *token = wg_request_query(req, "continue", &has_token);
  wg_walk_pos_t pos = {.level = WG_WALK_START};
  if (filter && wagma_job_state_from_name(state, &want_state) != 0) {
    wg_response_error(res, 400, "bad_request", "state",
                      "state must be pending, running, succeeded, failed or stopped");
    return;
  }
  if (has_limit && parse_limit(lim, &limit) != 0) {
    wg_response_error(res, 400, "bad_request", "limit", "limit must be an integer in [1, %d]",
                      WG_LIST_LIMIT_MAX);
    return;
  }
  if (has_token && token && *token && wg_list_token_decode(token, &pos) != 0) {
    wg_response_error(res, 400, "bad_request", "continue",
                      "continue must be the token a previous page returned");
    return;
  }
  list_io_t io = {.c = c, .req = req};
  wagma_key_jobs_prefix(&c->keys, io.jobs, sizeof io.jobs);
  io.jobs_len = strlen(io.jobs);
  wg_walk_io_t wio = {.keys = io_keys, .exists = io_exists, .free_keys = io_free_keys, .user = &io};
  /* The ids of the page in one walk: limit + 1 without a filter (the one after the page says
   * whether more remain), up to WG_LIST_LIMIT_MAX to look at with one. */
  size_t want = filter ? WG_LIST_LIMIT_MAX : (size_t)limit + 1, n = 0, taken = 0;
  char(*ids)[WAGMA_API_NAME_MAX] = malloc(want * sizeof *ids);
  json_t *jobs = json_array();
  int budget = WG_LIST_ROUND_TRIPS;
  wg_walk_pos_t next = pos;
  if (!ids || !jobs)
    e = WAGMA_ENOMEM;
  if (!e)
    e = wg_jobs_walk(&wio, &next, want, &budget, WG_LIST_PROBE_KEYS, ids, &n, &done);
  if (!e && n > 0) /* without a filter the id after the page is not read, only counted */
    e = read_page(&io, ids, filter || n <= (size_t)limit ? n : (size_t)limit, filter, want_state,
                  jobs, (size_t)limit, &taken);
  if (!e && taken < n) { /* the page is full before the last id: go on after the last taken */
    snprintf(next.last, sizeof next.last, "%s", ids[taken - 1]);
    next.level = (int)strlen(next.last);
    done = 0;
  }
  free(ids);
  if (e == WAGMA_ECANCELED) { /* the client left: nobody reads this */
    json_decref(jobs);
    wg_response_error(res, 503, "unavailable", NULL, "the client left");
    return;
  }
  if (e) {
    json_decref(jobs);
    if (e == WAGMA_ENOMEM)
      wg_response_error(res, 500, "internal", NULL, "out of memory");
    else
      wg_response_etcd_error(c, res, e);
    return;
  }
  json_t *o = json_pack("{s:o}", "jobs", jobs);
  char tok[WG_LIST_TOKEN_MAX];
  if (o && !done && next.level != WG_WALK_START &&
      wg_list_token_encode(&next, tok, sizeof tok) == 0)
    json_object_set_new(o, "continue", json_string(tok));
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

int wg_parse_u64(const char *s, uint64_t *out) {
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
int wg_plan_from_history_kvs(wg_coord_t *c, const char *job, uint64_t t, const wagma_etcd_kv_t *kvs,
                             size_t n, wagma_plan_t *plan, wg_response_t *res) {
  wagma_plan_record_t rec, best;
  wagma_api_error_t err;
  uint64_t oldest_epoch = 0, oldest_start = 0;
  int found = 0, e;
  memset(&best, 0, sizeof best);
  for (size_t i = n; i-- > 0 && !found;) { /* keys sort by epoch: newest first */
    const wagma_etcd_kv_t *kv = &kvs[i];
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
  int e;
  wagma_key_job_plans_prefix(&c->keys, job, key, sizeof key);
  if ((e = wagma_etcd_range(c->etcd, key, &opt, &range))) {
    wg_response_etcd_error(c, res, e);
    return e;
  }
  e = wg_plan_from_history_kvs(c, job, t, range.kvs, range.n, plan, res);
  wagma_etcd_range_free(&range);
  return e;
}

void wg_groups_answer(const char *job, const wagma_plan_t *plan, uint64_t t, wg_response_t *res) {
  json_t *groups = json_array();
  int global = plan->staleness_bound > 0 && (t + 1) % (uint64_t)plan->staleness_bound == 0;
  int phase = (int)(t % (uint64_t)plan->nphases);
  if (global) {
    json_t *ranks = json_array(), *names = json_array();
    for (int r = 0; r < plan->nranks; r++) {
      json_array_append_new(ranks, json_integer(r));
      json_array_append_new(names, json_string(plan->members[r].name));
    }
    json_array_append_new(groups,
                          json_pack("{s:i,s:o,s:o}", "group", 0, "ranks", ranks, "members", names));
  } else {
    const wagma_phase_t *ph = &plan->phases[phase];
    for (int g = 0; g < ph->ngroups; g++) {
      json_t *ranks = json_array(), *names = json_array();
      for (int k = ph->offsets[g]; k < ph->offsets[g + 1]; k++) {
        json_array_append_new(ranks, json_integer(ph->ranks[k]));
        json_array_append_new(names, json_string(plan->members[ph->ranks[k]].name));
      }
      json_array_append_new(
          groups, json_pack("{s:i,s:o,s:o}", "group", g, "ranks", ranks, "members", names));
    }
  }
  json_t *o =
      json_pack("{s:s,s:I,s:I,s:I,s:i,s:s,s:o}", "job", job, "epoch", (json_int_t)plan->epoch,
                "start_round", (json_int_t)plan->start_round, "iteration", (json_int_t)t, "phase",
                phase, "kind", global ? "global" : "group", "groups", groups);
  wg_response_json(res, 200, o ? json_dumps(o, WG_JSON_FLAGS) : NULL);
  json_decref(o);
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
  if (given && wg_parse_u64(it, &t)) {
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
  wg_groups_answer(job, &plan, t, res);
out:
  wagma_plan_free(&plan);
  wagma_etcd_kv_free(kv);
}
