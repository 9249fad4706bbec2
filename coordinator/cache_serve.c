/* coordinator/cache_serve.c — the read cache's view as a read source (reads.h), and the
 * snapshot that opens an event stream.
 *
 * The reads give the same answers as the etcd source (reads_etcd.c) would at the view's
 * revision: the job bodies are the ones cache.c rendered with the same functions (store.c),
 * the list is in the same key order with the same continue tokens (pages.c). A read holds the
 * view's read lock from begin to end; it never calls etcd and never waits for a sync (a stream
 * of a job the view lacks is answered 404 here, and http.c asks again after a sync), so
 * libmicrohttpd's threads and the connection front may run it. Answers rendered from the view
 * (the groups of a round, a timeline) are kept per job under its memo_mu for the next reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"
#include "cache_view.h"
#include "reads.h"

int wg_cache_route(wg_route_id_t id) {
  return id == WG_ROUTE_JOBS_LIST || id == WG_ROUTE_JOB_GET || id == WG_ROUTE_JOB_GROUPS ||
         id == WG_ROUTE_JOB_PLAN || id == WG_ROUTE_AGENTS || id == WG_ROUTE_JOB_EVENTS;
}

static int begin(wg_read_t *rd) {
  wg_cache_t *c = rd->src;
  pthread_rwlock_rdlock(&c->rw);
  if (c->valid)
    return 0;
  pthread_rwlock_unlock(&c->rw);
  return WAGMA_EUNAVAIL;
}

static void end(wg_read_t *rd) {
  wg_cache_t *c = rd->src;
  pthread_rwlock_unlock(&c->rw);
}

/* The page from the view's sorted jobs. With a filter at most WG_LIST_LIMIT_MAX jobs looked
 * at, as the etcd source. */
static int jobs_page(wg_read_t *rd, const wg_jobs_query_t *q, wg_jobs_page_t *page) {
  wg_cache_t *c = rd->src;
  size_t i = 0, looked = 0, taken = 0, last = SIZE_MAX;
  int e = 0;
  if (q->pos.level != WG_WALK_START) /* after pos.last in key order */
    while (i < c->njobs && wg_job_key_cmp(c->jobs[i]->id, q->pos.last) <= 0)
      i++;
  for (; !e && i < c->njobs && (int)taken < q->limit && (!q->filter || looked < WG_LIST_LIMIT_MAX);
       i++) {
    const cjob_t *j = c->jobs[i];
    looked++;
    last = i;
    if (!j->summary || (q->filter && j->state != q->want))
      continue;
    taken++;
    e = wg_jobs_page_add(page, j->summary, j->summary_len);
  }
  int more = 0;
  for (size_t k = i; k < c->njobs && !more; k++)
    more = c->jobs[k]->summary != NULL;
  if (more && last != SIZE_MAX) {
    page->more = 1;
    snprintf(page->next.last, sizeof page->next.last, "%s", c->jobs[last]->id);
    page->next.level = (int)strlen(page->next.last);
  }
  return e;
}

static int job(wg_read_t *rd, const char *id, wg_text_t *out) {
  const cjob_t *j = wg_cache_job(rd->src, id);
  if (!j || !j->full)
    return WAGMA_ENOTFOUND;
  out->p = j->full;
  out->len = j->full_len;
  return 0;
}

static int plan(wg_read_t *rd, const char *id, int decode, wg_read_plan_t *out, int *has_job) {
  wg_cache_t *c = rd->src;
  char key[256];
  const cjob_t *j = wg_cache_job(c, id);
  const wagma_etcd_kv_t *kv = NULL;
  if (j && wagma_key_job_plan(&c->c->keys, id, key, sizeof key) == 0)
    kv = wg_kvarr_find(&j->kvs, key, strlen(key));
  if (!kv) {
    *has_job = j && j->full;
    return WAGMA_ENOTFOUND;
  }
  out->json.p = kv->value;
  out->json.len = kv->value_len;
  out->mod = kv->mod_revision;
  out->plan = decode && j->has_plan ? &j->plan : NULL; /* decoded when the view took it */
  return 0;
}

static uint64_t iteration(wg_read_t *rd, const char *id) {
  const cjob_t *j = wg_cache_job(rd->src, id);
  return j ? j->iteration : 0;
}

static int history(wg_read_t *rd, const char *id, const wagma_etcd_kv_t **kvs, size_t *n) {
  wg_cache_t *c = rd->src;
  const cjob_t *j = wg_cache_job(c, id);
  char prefix[256];
  size_t lo = 0, hi = 0;
  if (j && wagma_key_job_plans_prefix(&c->c->keys, id, prefix, sizeof prefix) == 0)
    wg_kvarr_prefix(&j->kvs, prefix, &lo, &hi);
  *kvs = j ? j->kvs.kv + lo : NULL;
  *n = hi - lo;
  return 0;
}

static int agents(wg_read_t *rd, wagma_etcd_range_t *a, wagma_etcd_range_t *s,
                  wagma_etcd_range_t *q) {
  wg_cache_t *c = rd->src;
  *a = (wagma_etcd_range_t){.kvs = c->agents.kv, .n = c->agents.n};
  *s = (wagma_etcd_range_t){.kvs = c->assigns.kv, .n = c->assigns.n};
  *q = (wagma_etcd_range_t){.kvs = c->quars.kv, .n = c->quars.n};
  return 0;
}

static int timeline(wg_read_t *rd, const char *id, const json_t **events, int64_t *rev) {
  wg_cache_t *c = rd->src;
  const cjob_t *j = wg_cache_job(c, id);
  if (!j || !j->full)
    return WAGMA_ENOTFOUND;
  *events = j->timeline;
  *rev = c->applied;
  return 0;
}

/* The kept answers: the groups of one round of the current plan (the plan key's mod revision,
 * the round) and the timeline at one view revision. */
static int memo_get(wg_read_t *rd, const char *id, int kind, int64_t rev, uint64_t t,
                    wg_response_t *res) {
  cjob_t *j = wg_cache_job(rd->src, id);
  int kept = 0;
  if (!j)
    return 0;
  pthread_mutex_lock(&j->memo_mu);
  const char *body = kind == WG_MEMO_GROUPS ? j->groups_body : j->events_body;
  size_t len = kind == WG_MEMO_GROUPS ? j->groups_len : j->events_len;
  if (body &&
      (kind == WG_MEMO_GROUPS ? j->groups_rev == rev && j->groups_t == t : j->events_rev == rev)) {
    char *b = malloc(len + 1);
    if (b) {
      memcpy(b, body, len + 1);
      wg_response_free(res);
      res->status = 200;
      res->body = b;
      res->body_len = len;
      res->content_type = "application/json";
      kept = 1;
    }
  }
  pthread_mutex_unlock(&j->memo_mu);
  return kept;
}

static void memo_put(wg_read_t *rd, const char *id, int kind, int64_t rev, uint64_t t,
                     const wg_response_t *res) {
  cjob_t *j = wg_cache_job(rd->src, id);
  char *b = j && res->status == 200 && res->body ? malloc(res->body_len + 1) : NULL;
  if (!b)
    return;
  memcpy(b, res->body, res->body_len + 1);
  pthread_mutex_lock(&j->memo_mu);
  if (kind == WG_MEMO_GROUPS) {
    free(j->groups_body);
    j->groups_body = b;
    j->groups_len = res->body_len;
    j->groups_rev = rev;
    j->groups_t = t;
  } else {
    free(j->events_body);
    j->events_body = b;
    j->events_len = res->body_len;
    j->events_rev = rev;
  }
  pthread_mutex_unlock(&j->memo_mu);
}

static void fail(wg_read_t *rd, int e, wg_response_t *res) {
  (void)rd;
  wg_response_error(res, 500, "internal", NULL, "read cache: %s", wagma_strerror(e));
}

static const wg_read_ops_t cache_ops = {.name = "cache",
                                        .begin = begin,
                                        .end = end,
                                        .jobs_page = jobs_page,
                                        .job = job,
                                        .plan = plan,
                                        .iteration = iteration,
                                        .history = history,
                                        .agents = agents,
                                        .timeline = timeline,
                                        .memo_get = memo_get,
                                        .memo_put = memo_put,
                                        .fail = fail};

int wg_cache_serve(wg_cache_t *c, const wg_request_t *req, const wg_route_t *r,
                   wg_response_t *res) {
  if (!c)
    return WAGMA_EUNAVAIL;
  wg_read_t rd = {.ops = &cache_ops, .src = c, .c = c->c, .req = req};
  return wg_reads_answer(&rd, r, res);
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
