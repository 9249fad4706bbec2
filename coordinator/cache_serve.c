/* coordinator/cache_serve.c — the read endpoints answered from the read cache's view
 * (cache.c), and the snapshot that opens an event stream.
 *
 * Each endpoint gives the same answer as its etcd handler (handlers_jobs.c, handlers_misc.c)
 * would at the view's revision: the job bodies are the ones cache.c rendered with the same
 * functions (store.c), the groups and the agents use the same answer functions, the list the
 * same pages (key order, limits, continue tokens of pages.c). Under the view's read lock;
 * never calls etcd and never waits for a sync (a stream of a job the view lacks is answered
 * 404 here, and http.c asks again after a sync), so libmicrohttpd's threads may run it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

int wg_cache_route(wg_route_id_t id) {
  return id == WG_ROUTE_JOBS_LIST || id == WG_ROUTE_JOB_GET || id == WG_ROUTE_JOB_GROUPS ||
         id == WG_ROUTE_JOB_PLAN || id == WG_ROUTE_AGENTS || id == WG_ROUTE_JOB_EVENTS;
}

static void answer_copy(wg_response_t *res, int status, const char *body, size_t len) {
  char *b = malloc(len + 1);
  if (!b) {
    wg_response_error(res, 500, "internal", NULL, "out of memory");
    return;
  }
  memcpy(b, body, len);
  b[len] = '\0';
  wg_response_free(res);
  res->status = status;
  res->body = b;
  res->body_len = len;
  res->content_type = "application/json";
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

/* GET /v1/jobs: as wg_h_jobs_list, from the view. */
static void jobs_list(wg_cache_t *c, const wg_request_t *req, wg_response_t *res) {
  wagma_job_state_t want = WAGMA_JOB_PENDING;
  int filter = 0, has_limit = 0, has_token = 0, limit = WG_LIST_LIMIT_DEFAULT;
  const char *state = wg_request_query(req, "state", &filter);
  const char *lim = wg_request_query(req, "limit", &has_limit);
  const char *token = wg_request_query(req, "continue", &has_token);
  wg_walk_pos_t pos = {.level = WG_WALK_START};
  if (filter && wagma_job_state_from_name(state, &want) != 0) {
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
  size_t i = 0;
  if (pos.level != WG_WALK_START) /* after pos.last in key order */
    while (i < c->njobs && wg_job_key_cmp(c->jobs[i]->id, pos.last) <= 0)
      i++;
  /* The page: with a filter at most WG_LIST_LIMIT_MAX jobs looked at, as the etcd path. */
  size_t cap = 64, looked = 0, taken = 0, last = SIZE_MAX;
  for (size_t k = i; k < c->njobs; k++)
    cap += c->jobs[k]->summary_len + 1;
  char *out = malloc(cap + WG_LIST_TOKEN_MAX + 32);
  if (!out) {
    wg_response_error(res, 500, "internal", NULL, "out of memory");
    return;
  }
  size_t n = (size_t)snprintf(out, cap, "{\"jobs\":[");
  for (; i < c->njobs && (int)taken < limit && (!filter || looked < WG_LIST_LIMIT_MAX); i++) {
    const cjob_t *j = c->jobs[i];
    looked++;
    last = i;
    if (!j->summary || (filter && j->state != want))
      continue;
    if (taken++)
      out[n++] = ',';
    memcpy(out + n, j->summary, j->summary_len);
    n += j->summary_len;
  }
  memcpy(out + n, "]", 1);
  n++;
  int more = 0;
  for (size_t k = i; k < c->njobs && !more; k++)
    more = c->jobs[k]->summary != NULL;
  char tok[WG_LIST_TOKEN_MAX];
  if (more && last != SIZE_MAX) {
    wg_walk_pos_t next = {.level = 0};
    snprintf(next.last, sizeof next.last, "%s", c->jobs[last]->id);
    next.level = (int)strlen(next.last);
    if (wg_list_token_encode(&next, tok, sizeof tok) == 0)
      n += (size_t)sprintf(out + n, ",\"continue\":\"%s\"", tok);
  }
  memcpy(out + n, "}", 2);
  n++;
  wg_response_free(res);
  res->status = 200;
  res->body = out;
  res->body_len = n;
  res->content_type = "application/json";
}

/* A kept answer (a cjob_t's memo) into res: 1, or 0 when none or out of memory. */
static int memo_answer(const char *body, size_t len, wg_response_t *res) {
  if (!body)
    return 0;
  answer_copy(res, 200, body, len);
  return res->status == 200;
}

/* Keeps a copy of res's body in *slot (the previous one freed); under j->memo_mu. */
static void memo_keep(char **slot, size_t *slot_len, const wg_response_t *res) {
  char *b = res->status == 200 && res->body ? malloc(res->body_len + 1) : NULL;
  if (!b)
    return;
  memcpy(b, res->body, res->body_len + 1);
  free(*slot);
  *slot = b;
  *slot_len = res->body_len;
}

static void job_get(wg_cache_t *c, const char *id, wg_response_t *res) {
  const cjob_t *j = wg_cache_job(c, id);
  if (!j || !j->full)
    wg_response_error(res, 404, "not_found", NULL, "no job %s", id);
  else
    answer_copy(res, 200, j->full, j->full_len);
}

/* The current plan's kv, or the 404 of the etcd path. */
static const wagma_etcd_kv_t *plan_kv(wg_cache_t *c, const cjob_t *j, const char *id,
                                      wg_response_t *res) {
  char key[256];
  const wagma_etcd_kv_t *kv = NULL;
  if (j && wagma_key_job_plan(&c->c->keys, id, key, sizeof key) == 0)
    kv = wg_kvarr_find(&j->kvs, key, strlen(key));
  if (!kv) {
    if (j && j->full)
      wg_response_error(res, 404, "no_plan", NULL, "job %s has no plan yet", id);
    else
      wg_response_error(res, 404, "not_found", NULL, "no job %s", id);
  }
  return kv;
}

static void job_plan(wg_cache_t *c, const char *id, wg_response_t *res) {
  const cjob_t *j = wg_cache_job(c, id);
  const wagma_etcd_kv_t *kv = plan_kv(c, j, id, res);
  if (kv)
    answer_copy(res, 200, kv->value, kv->value_len);
}

/* GET .../groups: as wg_h_job_groups, from the view. */
static void job_groups(wg_cache_t *c, const char *id, const wg_request_t *req, wg_response_t *res) {
  uint64_t t = 0;
  int given = 0;
  const char *it = wg_request_query(req, "iteration", &given);
  if (given && wg_parse_u64(it, &t)) {
    wg_response_error(res, 400, "bad_request", "iteration",
                      "iteration must be an integer in [0, 2^63 - 1]");
    return;
  }
  const cjob_t *j = wg_cache_job(c, id);
  const wagma_etcd_kv_t *kv = plan_kv(c, j, id, res);
  if (!kv)
    return;
  if (!j->has_plan) {
    wg_response_error(res, 500, "internal", NULL, "stored plan does not decode");
    return;
  }
  if (!given) {
    t = j->iteration;
    if (t < j->plan.start_round)
      t = j->plan.start_round;
  }
  if (t >= j->plan.start_round) { /* the current plan's: kept per round */
    cjob_t *mj = (cjob_t *)j;
    pthread_mutex_lock(&mj->memo_mu);
    int kept = mj->groups_rev == kv->mod_revision && mj->groups_t == t &&
               memo_answer(mj->groups_body, mj->groups_len, res);
    pthread_mutex_unlock(&mj->memo_mu);
    if (kept)
      return;
    wg_groups_answer(id, &j->plan, t, res);
    pthread_mutex_lock(&mj->memo_mu);
    memo_keep(&mj->groups_body, &mj->groups_len, res);
    mj->groups_rev = kv->mod_revision;
    mj->groups_t = t;
    pthread_mutex_unlock(&mj->memo_mu);
    return;
  }
  char prefix[256];
  size_t lo = 0, hi = 0;
  if (wagma_key_job_plans_prefix(&c->c->keys, id, prefix, sizeof prefix) == 0)
    wg_kvarr_prefix(&j->kvs, prefix, &lo, &hi);
  wagma_plan_t plan;
  memset(&plan, 0, sizeof plan);
  if (wg_plan_from_history_kvs(c->c, id, t, j->kvs.kv + lo, hi - lo, &plan, res) == 0)
    wg_groups_answer(id, &plan, t, res);
  wagma_plan_free(&plan);
}

static void agents(wg_cache_t *c, wg_response_t *res) {
  wagma_etcd_range_t a = {.kvs = c->agents.kv, .n = c->agents.n};
  wagma_etcd_range_t s = {.kvs = c->assigns.kv, .n = c->assigns.n};
  wagma_etcd_range_t q = {.kvs = c->quars.kv, .n = c->quars.n};
  wg_agents_answer(c->c, &a, &s, &q, wg_wall(), res);
}

/* GET /v1/jobs/{id}/events (not as a stream): the job's timeline. */
static void job_events(wg_cache_t *c, const char *id, wg_response_t *res) {
  cjob_t *j = wg_cache_job(c, id);
  if (!j || !j->full) {
    wg_response_error(res, 404, "not_found", NULL, "no job %s", id);
    return;
  }
  pthread_mutex_lock(&j->memo_mu); /* kept per view revision */
  int kept = j->events_rev == c->applied && memo_answer(j->events_body, j->events_len, res);
  pthread_mutex_unlock(&j->memo_mu);
  if (kept)
    return;
  json_t *o = json_pack("{s:s,s:I,s:O}", "job", id, "revision", (json_int_t)c->applied, "events",
                        j->timeline);
  wg_response_json(res, 200, o ? json_dumps(o, WG_JSON_FLAGS) : NULL);
  json_decref(o);
  pthread_mutex_lock(&j->memo_mu);
  memo_keep(&j->events_body, &j->events_len, res);
  j->events_rev = c->applied;
  pthread_mutex_unlock(&j->memo_mu);
}

int wg_cache_serve(wg_cache_t *c, const wg_request_t *req, const wg_route_t *r,
                   wg_response_t *res) {
  if (!c)
    return WAGMA_EUNAVAIL;
  pthread_rwlock_rdlock(&c->rw);
  if (!c->valid) {
    pthread_rwlock_unlock(&c->rw);
    return WAGMA_EUNAVAIL;
  }
  switch (r->id) {
  case WG_ROUTE_JOBS_LIST: jobs_list(c, req, res); break;
  case WG_ROUTE_JOB_GET: job_get(c, r->job, res); break;
  case WG_ROUTE_JOB_PLAN: job_plan(c, r->job, res); break;
  case WG_ROUTE_JOB_GROUPS: job_groups(c, r->job, req, res); break;
  case WG_ROUTE_AGENTS: agents(c, res); break;
  case WG_ROUTE_JOB_EVENTS: job_events(c, r->job, res); break;
  case WG_ROUTE_EVENTS:
    wg_response_error(res, 400, "bad_request", NULL,
                      "/v1/events is a stream: ask with Accept: text/event-stream");
    break;
  default: pthread_rwlock_unlock(&c->rw); return WAGMA_EINVAL;
  }
  pthread_rwlock_unlock(&c->rw);
  return 0;
}

/* The events a stream that last got the event with id last (Last-Event-ID) missed, for its
 * job ("" = every job), concatenated into *out (NULL and 0 when none): 0; or -1 when the id
 * is not one of this view's or the kept events do not reach back to it (then a snapshot).
 * Under the view's lock. */
static int missed_events(const wg_cache_t *c, const char *last, const char *job, char **out,
                         size_t *len) {
  long long rev;
  unsigned long long seq;
  char tag[sizeof c->view_tag] = "";
  int used = 0;
  *out = NULL;
  *len = 0;
  if (!last || !c->view_tag[0] ||
      sscanf(last, "%lld.%llu.%23[0-9a-f]%n", &rev, &seq, tag, &used) != 3 || last[used] != '\0' ||
      strcmp(tag, c->view_tag) != 0 || seq < c->hist_floor || seq > c->seq)
    return -1;
  size_t n = 0;
  for (int pass = 0; pass < 2; pass++) { /* sizes, then bytes */
    for (size_t i = 0; i < c->hist_n; i++) {
      const hist_event_t *e = &c->hist[(c->hist_head + i) % WG_CACHE_HISTORY_EVENTS];
      if (e->seq <= seq || (job[0] ? strcmp(e->job, job) != 0 : !e->all_too))
        continue;
      if (pass)
        memcpy(*out + n, e->bytes, e->n);
      n += e->n;
    }
    if (!pass && (n == 0 || !(*out = malloc(n))))
      return n == 0 ? 0 : -1;
    if (!pass)
      n = 0;
  }
  *len = n;
  return 0;
}

int wg_cache_subscribe(wg_cache_t *c, wg_sse_client_t *cl, const char *last_event_id,
                       wg_response_t *res) {
  const char *job = wg_hub_client_job(cl);
  if (!c || !c->c->hub) {
    wg_response_error(res, 503, "unavailable", NULL, "event streams are off (--read-cache off)");
    return 503;
  }
  pthread_rwlock_rdlock(&c->rw);
  if (!c->valid) {
    pthread_rwlock_unlock(&c->rw);
    wg_response_error(res, 503, "unavailable", NULL,
                      "the read cache is loading (etcd unreachable or the watch lost); retry");
    res->retry_after = 1;
    return 503;
  }
  size_t n = 0;
  char *data = NULL, *bytes = NULL;
  const cjob_t *j = job[0] ? wg_cache_job(c, job) : NULL;
  if (job[0] && (!j || !j->full)) {
    /* Not in the view. It may be a job just created (through this coordinator or another)
     * that the watch has not brought yet: the caller (http.c) asks again after a sync of the
     * view, off libmicrohttpd's thread; nothing here waits. */
    pthread_rwlock_unlock(&c->rw);
    wg_response_error(res, 404, "not_found", NULL, "no job %s", job);
    return 404;
  }
  int resumed = missed_events(c, last_event_id, job, &bytes, &n) == 0;
  if (!resumed) { /* a snapshot first */
    data = job[0] ? wg_cache_job_snapshot(c, j, &n) : wg_cache_all_snapshot(c, &n);
    char id[64];
    wg_cache_event_id(c, c->applied, id, sizeof id);
    bytes = data ? wg_sse_event(id, "snapshot", data, &n) : NULL;
    free(data);
  }
  int e = bytes || resumed ? 0 : WAGMA_ENOMEM;
  wg_hub_lock(c->c->hub);
  if (!e && (e = wg_hub_add_locked(c->c->hub, cl)) == 0 && bytes)
    wg_hub_send_locked(c->c->hub, cl, bytes, n);
  wg_hub_unlock(c->c->hub);
  pthread_rwlock_unlock(&c->rw);
  free(bytes);
  if (e == WAGMA_EBUSY) {
    wg_response_error(res, 503, "busy", NULL, "too many event streams are open; retry later");
    res->retry_after = 1;
    return 503;
  }
  if (e) {
    wg_response_error(res, 500, "internal", NULL, "out of memory");
    return 500;
  }
  return 0;
}
