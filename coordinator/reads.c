/* coordinator/reads.c — the read endpoints, once, over a read source (reads.h): the queries
 * parsed, the source asked, the answers rendered (the list page, a job, its plan, the groups of
 * a round from the current plan or the plan history, the timeline, the agents). No I/O of its
 * own and no state: it runs on whichever thread asks (libmicrohttpd's, the HTTP workers, the
 * connection front), under whatever the source's begin holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"
#include "reads.h"
#include "wagma/collective.h"
#include "wagma/log_internal.h"

/* ---- pieces ------------------------------------------------------------------------------- */

/* A decimal uint64 <= INT64_MAX (answered as a JSON integer): 0 or -1. */
static int parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s || strlen(s) > 19)
    return -1;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9')
      return -1;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (v > INT64_MAX)
    return -1;
  *out = v;
  return 0;
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

/* A text into res as a 200/201 JSON answer (taken over when it is the source's to give). */
static void answer_text(wg_response_t *res, int status, wg_text_t *t) {
  char *b = t->own;
  if (!b && (b = malloc(t->len + 1))) {
    memcpy(b, t->p, t->len);
    b[t->len] = '\0';
  }
  t->own = NULL;
  if (!b) {
    wg_response_error(res, 500, "internal", NULL, "out of memory");
    return;
  }
  wg_response_free(res);
  res->status = status;
  res->body = b;
  res->body_len = t->len;
  res->content_type = "application/json";
}

/* Answers an error of the source's: a read whose client left (nobody reads the answer), or
 * what the source says of its own errors. */
static void answer_failure(wg_read_t *rd, int e, wg_response_t *res) {
  const wg_request_t *req = rd->req;
  if (e == WAGMA_ECANCELED && req && req->gone && req->gone(req->gone_user))
    wg_response_error(res, 503, "unavailable", NULL, "the client left");
  else
    rd->ops->fail(rd, e, res);
}

int wg_jobs_page_add(wg_jobs_page_t *page, const char *json, size_t len) {
  if (page->len + len + 2 > page->cap) {
    size_t cap = (page->cap ? page->cap * 2 : 4096) + len;
    char *b = realloc(page->buf, cap);
    if (!b)
      return WAGMA_ENOMEM;
    page->buf = b;
    page->cap = cap;
  }
  if (page->n++)
    page->buf[page->len++] = ',';
  memcpy(page->buf + page->len, json, len);
  page->len += len;
  return 0;
}

/* ---- GET /v1/jobs ------------------------------------------------------------------------- */

/* One page of jobs in key order (pages.c's positions and tokens). With a state filter a page
 * may hold fewer than limit jobs (even none) while more remain: "continue" says so. */
static void jobs_list(wg_read_t *rd, wg_response_t *res) {
  const wg_request_t *req = rd->req;
  wg_jobs_query_t q = {.limit = WG_LIST_LIMIT_DEFAULT, .pos = {.level = WG_WALK_START}};
  int has_limit = 0, has_token = 0;
  const char *state = wg_request_query(req, "state", &q.filter);
  const char *lim = wg_request_query(req, "limit", &has_limit);
  const char *token = wg_request_query(req, "continue", &has_token);
  if (q.filter && wagma_job_state_from_name(state, &q.want) != 0) {
    wg_response_error(res, 400, "bad_request", "state",
                      "state must be pending, running, succeeded, failed or stopped");
    return;
  }
  if (has_limit && parse_limit(lim, &q.limit) != 0) {
    wg_response_error(res, 400, "bad_request", "limit", "limit must be an integer in [1, %d]",
                      WG_LIST_LIMIT_MAX);
    return;
  }
  if (has_token && token && *token && wg_list_token_decode(token, &q.pos) != 0) {
    wg_response_error(res, 400, "bad_request", "continue",
                      "continue must be the token a previous page returned");
    return;
  }
  wg_jobs_page_t page = {.cap = 4096};
  int e = (page.buf = malloc(page.cap)) ? 0 : WAGMA_ENOMEM;
  if (!e) {
    memcpy(page.buf, "{\"jobs\":[", 9);
    page.len = 9;
    e = rd->ops->jobs_page(rd, &q, &page);
  }
  char tok[WG_LIST_TOKEN_MAX];
  size_t tail = 0;
  if (!e && page.more && wg_list_token_encode(&page.next, tok, sizeof tok) == 0)
    tail = strlen(tok) + 16;
  if (!e && page.len + tail + 3 > page.cap) {
    char *b = realloc(page.buf, page.len + tail + 3);
    if (!b)
      e = WAGMA_ENOMEM;
    else
      page.buf = b;
  }
  if (e) {
    free(page.buf);
    answer_failure(rd, e, res);
    return;
  }
  page.len += (size_t)sprintf(page.buf + page.len, "]");
  if (tail)
    page.len += (size_t)sprintf(page.buf + page.len, ",\"continue\":\"%s\"", tok);
  page.len += (size_t)sprintf(page.buf + page.len, "}");
  wg_response_free(res);
  res->status = 200;
  res->body = page.buf;
  res->body_len = page.len;
  res->content_type = "application/json";
}

/* ---- a job and its plan -------------------------------------------------------------------- */

static void job_get(wg_read_t *rd, const char *id, int status, wg_response_t *res) {
  wg_text_t t = {0};
  int e = rd->ops->job(rd, id, &t);
  if (e == WAGMA_ENOTFOUND)
    wg_response_error(res, 404, "not_found", NULL, "no job %s", id);
  else if (e)
    answer_failure(rd, e, res);
  else
    answer_text(res, status, &t);
  free(t.own);
}

int wg_reads_job(wg_read_t *rd, const char *id, int status, wg_response_t *res) {
  if (rd->ops->begin(rd) != 0)
    return WAGMA_EUNAVAIL;
  job_get(rd, id, status, res);
  rd->ops->end(rd);
  return 0;
}

/* The current plan, or the answer that says why not (404 no_plan / not_found, an error). */
static int read_plan(wg_read_t *rd, const char *id, int decode, wg_read_plan_t *p,
                     wg_response_t *res) {
  int has_job = 0;
  memset(p, 0, sizeof *p);
  int e = rd->ops->plan(rd, id, decode, p, &has_job);
  if (e == WAGMA_ENOTFOUND && has_job)
    wg_response_error(res, 404, "no_plan", NULL, "job %s has no plan yet", id);
  else if (e == WAGMA_ENOTFOUND)
    wg_response_error(res, 404, "not_found", NULL, "no job %s", id);
  else if (e)
    answer_failure(rd, e, res);
  return e;
}

static void job_plan(wg_read_t *rd, const char *id, wg_response_t *res) {
  wg_read_plan_t p;
  if (read_plan(rd, id, 0, &p, res) == 0)
    answer_text(res, 200, &p.json);
  free(p.json.own);
}

/* ---- GET .../groups ------------------------------------------------------------------------ */

/* The answer of GET .../groups for round t of plan. */
static void groups_answer(const char *job, const wagma_plan_t *plan, uint64_t t,
                          wg_response_t *res) {
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

/* The plan in effect at round t when t is before the current plan's start_round: the plan of
 * the highest epoch whose start_round <= t among the history entries plans/<epoch> (while
 * start_rounds only grow that is the greatest start_round <= t; after a restart from an older
 * checkpoint the later epoch ran those rounds again and wins). Answers 404 no_plan when no
 * kept entry starts at or before t, 500 when the entry does not decode or rebuild.
 * Ownership: on 0, *plan is the caller's (wagma_plan_free). */
static int plan_from_history(wg_read_t *rd, const char *job, uint64_t t, wagma_plan_t *plan,
                             wg_response_t *res) {
  const wagma_etcd_kv_t *kvs = NULL;
  size_t n = 0;
  wagma_plan_record_t rec, best;
  wagma_api_error_t err;
  uint64_t oldest_epoch = 0, oldest_start = 0;
  int found = 0, e = rd->ops->history(rd, job, &kvs, &n);
  if (e) {
    answer_failure(rd, e, res);
    return e;
  }
  memset(&best, 0, sizeof best);
  for (size_t i = n; i-- > 0 && !found;) { /* keys sort by epoch: newest first */
    const wagma_etcd_kv_t *kv = &kvs[i];
    if (wagma_plan_record_from_json(kv->value, kv->value_len, &rec, &err) != 0) {
      wg_logf(rd->c->log, rd->c->log_user, WAGMA_LOG_WARN, "%s: bad plan history entry (%s: %s)",
              kv->key, err.field, err.message);
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

/* GET /v1/jobs/{id}/groups[?iteration=T]: the groups of round T in the plan in effect at T
 * (round == iteration, docs/agent.md): the current plan when T >= its start_round (an answer
 * the source may keep per plan and round), else the plan history. Without T: the job's
 * iteration, at least the current start_round. */
static void job_groups(wg_read_t *rd, const char *id, wg_response_t *res) {
  uint64_t t = 0;
  int given = 0;
  const char *it = wg_request_query(rd->req, "iteration", &given);
  if (given && parse_u64(it, &t)) {
    wg_response_error(res, 400, "bad_request", "iteration",
                      "iteration must be an integer in [0, 2^63 - 1]");
    return;
  }
  wg_read_plan_t p;
  if (read_plan(rd, id, 1, &p, res))
    goto out;
  if (!p.plan) {
    wg_response_error(res, 500, "internal", NULL, "stored plan does not decode%s%s",
                      p.decode_error[0] ? ": " : "", p.decode_error);
    goto out;
  }
  if (!given) {
    t = rd->ops->iteration(rd, id);
    if (t < p.plan->start_round)
      t = p.plan->start_round;
  }
  if (t >= p.plan->start_round) {
    const wg_read_ops_t *o = rd->ops;
    if (o->memo_get && o->memo_get(rd, id, WG_MEMO_GROUPS, p.mod, t, res))
      goto out;
    groups_answer(id, p.plan, t, res);
    if (o->memo_put)
      o->memo_put(rd, id, WG_MEMO_GROUPS, p.mod, t, res);
    goto out;
  }
  wagma_plan_t old;
  memset(&old, 0, sizeof old);
  if (plan_from_history(rd, id, t, &old, res) == 0)
    groups_answer(id, &old, t, res);
  wagma_plan_free(&old);
out:
  free(p.json.own);
}

/* ---- the timeline and the agents ------------------------------------------------------------ */

/* GET /v1/jobs/{id}/events (not as a stream): the job's timeline. */
static void job_events(wg_read_t *rd, const char *id, wg_response_t *res) {
  const json_t *events = NULL;
  int64_t rev = 0;
  int e = rd->ops->timeline(rd, id, &events, &rev);
  if (e == WAGMA_ENOTFOUND) {
    wg_response_error(res, 404, "not_found", NULL, "no job %s", id);
    return;
  }
  if (e == WAGMA_EUNAVAIL) {
    wg_response_error(res, 503, "unavailable", NULL,
                      "the events need the read cache, which is not current; retry");
    return;
  }
  if (e) {
    answer_failure(rd, e, res);
    return;
  }
  const wg_read_ops_t *o = rd->ops;
  if (o->memo_get && o->memo_get(rd, id, WG_MEMO_EVENTS, rev, 0, res))
    return;
  json_t *v = json_pack("{s:s,s:I,s:O}", "job", id, "revision", (json_int_t)rev, "events",
                        (json_t *)events);
  wg_response_json(res, 200, v ? json_dumps(v, WG_JSON_FLAGS) : NULL);
  json_decref(v);
  if (o->memo_put)
    o->memo_put(rd, id, WG_MEMO_EVENTS, rev, 0, res);
}

/* GET /v1/agents from the registrations, assignments and quarantine records (each sorted by
 * key, as etcd returns them), at wall time now. An agent is "healthy" unless a quarantine record
 * names its current registration (the agent key's create revision) and its "until" has not
 * passed, as the scheduler decides. */
static void agents_answer(wg_coord_t *c, const wagma_etcd_range_t *agents,
                          const wagma_etcd_range_t *assign, const wagma_etcd_range_t *quar,
                          double now, wg_response_t *res) {
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

static void agents(wg_read_t *rd, wg_response_t *res) {
  wagma_etcd_range_t a = {0}, s = {0}, q = {0};
  int e = rd->ops->agents(rd, &a, &s, &q);
  if (e)
    answer_failure(rd, e, res);
  else
    agents_answer(rd->c, &a, &s, &q, wg_wall(), res);
}

/* ---- dispatch ------------------------------------------------------------------------------- */

int wg_reads_answer(wg_read_t *rd, const wg_route_t *r, wg_response_t *res) {
  switch (r->id) {
  case WG_ROUTE_JOBS_LIST:
  case WG_ROUTE_JOB_GET:
  case WG_ROUTE_JOB_PLAN:
  case WG_ROUTE_JOB_GROUPS:
  case WG_ROUTE_AGENTS:
  case WG_ROUTE_JOB_EVENTS:
  case WG_ROUTE_EVENTS: break;
  default: return WAGMA_EINVAL;
  }
  if (rd->ops->begin(rd) != 0)
    return WAGMA_EUNAVAIL;
  switch (r->id) {
  case WG_ROUTE_JOBS_LIST: jobs_list(rd, res); break;
  case WG_ROUTE_JOB_GET: job_get(rd, r->job, 200, res); break;
  case WG_ROUTE_JOB_PLAN: job_plan(rd, r->job, res); break;
  case WG_ROUTE_JOB_GROUPS: job_groups(rd, r->job, res); break;
  case WG_ROUTE_AGENTS: agents(rd, res); break;
  case WG_ROUTE_JOB_EVENTS: job_events(rd, r->job, res); break;
  default: /* WG_ROUTE_EVENTS not asked as a stream (http.c opens those) */
    wg_response_error(res, 400, "bad_request", NULL,
                      "/v1/events is a stream: ask with Accept: text/event-stream");
    break;
  }
  rd->ops->end(rd);
  return 0;
}
