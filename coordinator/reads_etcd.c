/* coordinator/reads_etcd.c — the etcd read source (reads.h): every read a linearizable etcd
 * read, so a replica that does not lead, or whose read cache is not current, still answers with
 * the truth. The list reads one page (pages.c finds the ids, then spec, status and progress of
 * each in Txns); a job is one Range of its keys (store.c); the agents one Txn of three Ranges.
 * What it hands out is kept in the read's held[] until end. Runs on the HTTP workers (http.c),
 * one read per worker at a time; no state of its own. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "handlers.h"
#include "reads.h"
#include "wagma/collective.h"

enum { HELD_PLAN, HELD_HISTORY, HELD_AGENTS };

#define LIST_TXN_JOBS 100 /* jobs per Txn (one op each): under etcd's 128 ops per Txn */

static int gone(const wg_read_t *rd) {
  return rd->req && rd->req->gone && rd->req->gone(rd->req->gone_user);
}

/* ---- GET /v1/jobs: the walk's etcd access (pages.c) ------------------------------------------ */

/* Keys-only prefix reads and one-Txn existence checks under <prefix>/jobs/. Each first asks
 * whether the client is still there. */
typedef struct list_io {
  wg_read_t *rd;
  char jobs[256];
  size_t jobs_len;
} list_io_t;

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
  if (gone(io->rd))
    return WAGMA_ECANCELED;
  snprintf(key, sizeof key, "%s%s", io->jobs, prefix);
  int e = wagma_etcd_range(io->rd->c->etcd, key, &opt, &r);
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
  if (gone(io->rd))
    return WAGMA_ECANCELED;
  for (size_t i = 0; i < n; i++) {
    snprintf(keys[i], sizeof keys[i], "%s%s", io->jobs, prefixes[i]);
    ops[i] =
        (wagma_etcd_op_t){.type = WAGMA_ETCD_OP_RANGE, .key = keys[i], .prefix = 1, .limit = 1};
  }
  int e = wagma_etcd_txn(io->rd->c->etcd, NULL, 0, ops, n, NULL, 0, &tr);
  if (!e && tr.n != n)
    e = WAGMA_EPROTO;
  for (size_t i = 0; !e && i < n; i++)
    exists[i] = tr.results[i].range.n > 0;
  wagma_etcd_txn_result_free(&tr);
  return e;
}

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

/* Adds job id's list entry, from its kvs (shallow copies of nkv key-values), to the page when
 * it still exists (and is in state want when filter). */
static int page_add_job(wg_coord_t *c, const char *id, const wagma_etcd_kv_t *kvs, size_t nkv,
                        const wg_jobs_query_t *q, wg_jobs_page_t *page) {
  wg_job_record_t rec;
  int e = 0;
  if (wg_job_record_from_kvs(c, id, kvs, nkv, &rec) != 0)
    return 0;
  if (rec.has_spec && (!q->filter || rec.status.state == q->want)) {
    json_t *v = wg_job_record_to_value(&rec, 0);
    char *s = v ? json_dumps(v, WG_JSON_FLAGS) : NULL;
    e = s ? wg_jobs_page_add(page, s, strlen(s)) : WAGMA_ENOMEM;
    free(s);
    json_decref(v);
  }
  wg_job_record_free(&rec);
  return e;
}

/* Reads the jobs of n ids, LIST_TXN_JOBS at a time: one Txn of spec and status (one prefix
 * op per job: "<id>/s" holds exactly those two keys), then one Txn of the progress records
 * (at most WG_LIST_PROGRESS_MAX each) of the jobs that are not finished, whose iteration is
 * live. Adds the jobs that still exist (and are in state want when filter) to the page, up
 * to max entries; *taken = how many ids were looked at (all n, or fewer when max was reached:
 * the rest is for the next page). */
static int read_page(list_io_t *io, char (*ids)[WAGMA_API_NAME_MAX], size_t n,
                     const wg_jobs_query_t *q, wg_jobs_page_t *page, size_t max, size_t *taken) {
  wg_coord_t *c = io->rd->c;
  char(*keys)[320] = malloc(2 * LIST_TXN_JOBS * sizeof *keys);
  wagma_etcd_op_t *ops = malloc(2 * LIST_TXN_JOBS * sizeof *ops);
  size_t *prog_of = malloc(LIST_TXN_JOBS * sizeof *prog_of);
  int e = keys && ops && prog_of ? 0 : WAGMA_ENOMEM;
  *taken = 0;
  for (size_t base = 0; !e && base < n && page->n < max; base += LIST_TXN_JOBS) {
    size_t k = n - base < LIST_TXN_JOBS ? n - base : LIST_TXN_JOBS, np = 0;
    wagma_etcd_txn_result_t tr = {0}, tp = {0};
    if (gone(io->rd)) {
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
    for (size_t i = 0; !e && i < k && page->n < max; i++) {
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
      e = page_add_job(c, ids[base + i], kvs, nkv, q, page);
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

/* Work per request is bounded: WG_LIST_ROUND_TRIPS round trips to find ids, at most
 * WG_LIST_LIMIT_MAX jobs read (in Txns of LIST_TXN_JOBS), each with at most
 * WG_LIST_PROGRESS_MAX progress records. */
static int jobs_page(wg_read_t *rd, const wg_jobs_query_t *q, wg_jobs_page_t *page) {
  list_io_t io = {.rd = rd};
  wagma_key_jobs_prefix(&rd->c->keys, io.jobs, sizeof io.jobs);
  io.jobs_len = strlen(io.jobs);
  wg_walk_io_t wio = {.keys = io_keys, .exists = io_exists, .free_keys = io_free_keys, .user = &io};
  /* The ids of the page in one walk: limit + 1 without a filter (the one after the page says
   * whether more remain), up to WG_LIST_LIMIT_MAX to look at with one. */
  size_t want = q->filter ? WG_LIST_LIMIT_MAX : (size_t)q->limit + 1, n = 0, taken = 0;
  char(*ids)[WAGMA_API_NAME_MAX] = malloc(want * sizeof *ids);
  int budget = WG_LIST_ROUND_TRIPS, done = 0, e = ids ? 0 : WAGMA_ENOMEM;
  wg_walk_pos_t next = q->pos;
  if (!e)
    e = wg_jobs_walk(&wio, &next, want, &budget, WG_LIST_PROBE_KEYS, ids, &n, &done);
  if (!e && n > 0) /* without a filter the id after the page is not read, only counted */
    e = read_page(&io, ids, q->filter || n <= (size_t)q->limit ? n : (size_t)q->limit, q, page,
                  (size_t)q->limit, &taken);
  if (!e && taken < n) { /* the page is full before the last id: go on after the last taken */
    snprintf(next.last, sizeof next.last, "%s", ids[taken - 1]);
    next.level = (int)strlen(next.last);
    done = 0;
  }
  free(ids);
  page->more = !e && !done && next.level != WG_WALK_START;
  page->next = next;
  return e;
}

/* ---- a job, its plan and plan history ------------------------------------------------------ */

static int job(wg_read_t *rd, const char *id, wg_text_t *out) {
  wg_job_record_t rec;
  int e = wg_store_load_job(rd->c, id, &rec);
  if (e)
    return e;
  json_t *v = wg_job_record_to_value(&rec, 1);
  wg_job_record_free(&rec);
  out->own = v ? json_dumps(v, WG_JSON_FLAGS) : NULL;
  json_decref(v);
  if (!out->own)
    return WAGMA_ENOMEM;
  out->p = out->own;
  out->len = strlen(out->own);
  return 0;
}

/* The plan key; without one, whether the spec key exists says "no plan" from "no job". */
static int plan(wg_read_t *rd, const char *id, int decode, wg_read_plan_t *out, int *has_job) {
  wg_coord_t *c = rd->c;
  char key[256];
  wagma_etcd_kv_t *kv = NULL;
  wagma_key_job_plan(&c->keys, id, key, sizeof key);
  int e = wagma_etcd_get(c->etcd, key, &kv, NULL);
  if (e == WAGMA_ENOTFOUND) {
    wagma_etcd_kv_t *spec = NULL;
    wagma_key_job_spec(&c->keys, id, key, sizeof key);
    int s = wagma_etcd_get(c->etcd, key, &spec, NULL);
    wagma_etcd_kv_free(spec);
    *has_job = s == 0;
    return s == 0 || s == WAGMA_ENOTFOUND ? WAGMA_ENOTFOUND : s;
  }
  if (e)
    return e;
  out->mod = kv->mod_revision;
  out->json.own = malloc(kv->value_len + 1); /* the stored bytes, as the cache gives them */
  if (out->json.own) {
    memcpy(out->json.own, kv->value, kv->value_len);
    out->json.own[kv->value_len] = '\0';
  }
  out->json.p = out->json.own;
  out->json.len = kv->value_len;
  if (decode && out->json.own) {
    wagma_plan_t *p = calloc(1, sizeof *p);
    if (p && wagma_plan_from_json(kv->value, kv->value_len, p, out->decode_error,
                                  sizeof out->decode_error) == 0) {
      rd->held[HELD_PLAN] = p;
      out->plan = p;
    } else if (p) {
      wagma_plan_free(p);
      free(p);
    } else {
      e = WAGMA_ENOMEM;
    }
  }
  wagma_etcd_kv_free(kv);
  return out->json.own ? e : WAGMA_ENOMEM;
}

static uint64_t iteration(wg_read_t *rd, const char *id) {
  wg_job_record_t rec;
  uint64_t t = 0;
  if (wg_store_load_job(rd->c, id, &rec) == 0) {
    t = wg_job_record_iteration(&rec);
    wg_job_record_free(&rec);
  }
  return t;
}

static int history(wg_read_t *rd, const char *id, const wagma_etcd_kv_t **kvs, size_t *n) {
  char key[256];
  wagma_etcd_range_options_t opt = {.prefix = 1};
  wagma_etcd_range_t *range = calloc(1, sizeof *range);
  if (!range)
    return WAGMA_ENOMEM;
  wagma_key_job_plans_prefix(&rd->c->keys, id, key, sizeof key);
  int e = wagma_etcd_range(rd->c->etcd, key, &opt, range);
  if (e) {
    free(range);
    return e;
  }
  rd->held[HELD_HISTORY] = range;
  *kvs = range->kvs;
  *n = range->n;
  return 0;
}

/* ---- the agents and what etcd does not have ------------------------------------------------ */

/* The registrations, the assignments and the quarantine records in one Txn (one revision). */
static int agents(wg_read_t *rd, wagma_etcd_range_t *a, wagma_etcd_range_t *s,
                  wagma_etcd_range_t *q) {
  wg_coord_t *c = rd->c;
  char akey[256], skey[256], qkey[256];
  wagma_etcd_txn_result_t *tr = calloc(1, sizeof *tr);
  if (!tr)
    return WAGMA_ENOMEM;
  wagma_key_agents_prefix(&c->keys, akey, sizeof akey);
  wagma_key_assignments_prefix(&c->keys, skey, sizeof skey);
  wagma_key_quarantine_prefix(&c->keys, qkey, sizeof qkey);
  wagma_etcd_op_t ops[3] = {{.type = WAGMA_ETCD_OP_RANGE, .key = akey, .prefix = 1},
                            {.type = WAGMA_ETCD_OP_RANGE, .key = skey, .prefix = 1},
                            {.type = WAGMA_ETCD_OP_RANGE, .key = qkey, .prefix = 1}};
  int e = wagma_etcd_txn(c->etcd, NULL, 0, ops, 3, NULL, 0, tr);
  rd->held[HELD_AGENTS] = tr;
  if (e || tr->n != 3)
    return e ? e : WAGMA_EPROTO;
  *a = tr->results[0].range;
  *s = tr->results[1].range;
  *q = tr->results[2].range;
  return 0;
}

/* Timelines live in the read cache only. */
static int timeline(wg_read_t *rd, const char *id, const json_t **events, int64_t *rev) {
  (void)rd, (void)id, (void)events, (void)rev;
  return WAGMA_EUNAVAIL;
}

static void fail(wg_read_t *rd, int e, wg_response_t *res) {
  wg_response_etcd_error(rd->c, res, e);
}

static int begin(wg_read_t *rd) {
  memset(rd->held, 0, sizeof rd->held);
  return 0;
}

static void end(wg_read_t *rd) {
  wagma_plan_t *p = rd->held[HELD_PLAN];
  wagma_etcd_range_t *h = rd->held[HELD_HISTORY];
  wagma_etcd_txn_result_t *tr = rd->held[HELD_AGENTS];
  if (p)
    wagma_plan_free(p);
  if (h)
    wagma_etcd_range_free(h);
  if (tr)
    wagma_etcd_txn_result_free(tr);
  free(p);
  free(h);
  free(tr);
  memset(rd->held, 0, sizeof rd->held);
}

static const wg_read_ops_t etcd_ops = {.name = "etcd",
                                       .begin = begin,
                                       .end = end,
                                       .jobs_page = jobs_page,
                                       .job = job,
                                       .plan = plan,
                                       .iteration = iteration,
                                       .history = history,
                                       .agents = agents,
                                       .timeline = timeline,
                                       .fail = fail};

void wg_read_etcd_init(wg_read_t *rd, wg_coord_t *c, const wg_request_t *req) {
  memset(rd, 0, sizeof *rd);
  rd->ops = &etcd_ops;
  rd->src = c;
  rd->c = c;
  rd->req = req;
}
