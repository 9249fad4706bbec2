/* coordinator/reads.h — the read endpoints over a read source.
 *
 * GET /v1/jobs, /v1/jobs/{id}, .../plan, .../groups, .../events (the timeline, not as a
 * stream) and /v1/agents are answered by ONE set of handlers (reads.c): they parse the
 * queries, ask a source for what they need and render the answers. A source is an ops table
 * over one of the two places the coordinator reads from:
 *   - the read cache's view (cache_serve.c: wg_cache_serve): memory, under the view's read
 *     lock, never etcd; it hands out what the view holds (pre-rendered job bodies, the decoded
 *     plan) and keeps answers it rendered for the next reads (the memo ops);
 *   - etcd (reads_etcd.c): linearizable reads, each a round trip or a Txn.
 * Both give the same bytes for the same state (test_coordinator_read_sources compares a
 * coordinator with the cache and one with --read-cache off). Adding a read endpoint: a route
 * (router.c), its handler here, and the ops it needs in both sources. */
#ifndef WAGMA_COORD_READS_H
#define WAGMA_COORD_READS_H

#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "pages.h"
#include "request.h"
#include "router.h"

struct wagma_plan;

/* A text a source hands out: p, len bytes; own non-NULL when the caller takes it over (then
 * p == own; the caller frees it), else it stays valid until the read ends. */
typedef struct wg_text {
  const char *p;
  size_t len;
  char *own;
} wg_text_t;

/* One page of GET /v1/jobs as asked. */
typedef struct wg_jobs_query {
  int filter;             /* only jobs in state want */
  wagma_job_state_t want; /* with filter */
  int limit;              /* jobs on the page, 1..WG_LIST_LIMIT_MAX */
  wg_walk_pos_t pos;      /* after this position (WG_WALK_START: from the first) */
} wg_jobs_query_t;

/* The page a source fills: wg_jobs_page_add for each job's list entry, in key order; more and
 * next when jobs remain after it. */
typedef struct wg_jobs_page {
  char *buf; /* "{\"jobs\":[" and the entries so far (reads.c's) */
  size_t len, cap;
  size_t n;
  int more;
  wg_walk_pos_t next;
} wg_jobs_page_t;

/* Appends one job's entry (its REST view without members, as JSON). 0 or WAGMA_ENOMEM. */
int wg_jobs_page_add(wg_jobs_page_t *page, const char *json, size_t len);

/* The current plan of a job. */
typedef struct wg_read_plan {
  wg_text_t json;                /* as stored */
  int64_t mod;                   /* the plan key's mod revision */
  const struct wagma_plan *plan; /* decoded when asked and it decodes, else NULL */
  char decode_error[256];        /* why it does not decode ("" when the source does not say) */
} wg_read_plan_t;

/* The kinds of answers a source may keep (the memo ops). */
enum { WG_MEMO_GROUPS, WG_MEMO_EVENTS };

typedef struct wg_read wg_read_t;

/* A read source. Every op may be called only between begin (when it returned 0) and end;
 * what an op hands out stays valid until end. Errors: WAGMA_ENOTFOUND as each op says,
 * WAGMA_ECANCELED (the client left), WAGMA_ENOMEM, or the source's own (answered by fail). */
typedef struct wg_read_ops {
  const char *name;
  /* 0, or WAGMA_EUNAVAIL when the source cannot answer now (the cache's view is not valid:
   * the caller asks etcd). */
  int (*begin)(wg_read_t *rd);
  void (*end)(wg_read_t *rd);
  /* The page q asks for. */
  int (*jobs_page)(wg_read_t *rd, const wg_jobs_query_t *q, wg_jobs_page_t *page);
  /* The REST view of job id with its members: WAGMA_ENOTFOUND when it has no spec. */
  int (*job)(wg_read_t *rd, const char *id, wg_text_t *out);
  /* The current plan (decoded too when decode): WAGMA_ENOTFOUND with *has_job = 1 when the
   * job exists without a plan, 0 when there is no job. */
  int (*plan)(wg_read_t *rd, const char *id, int decode, wg_read_plan_t *out, int *has_job);
  /* The job's iteration as REST shows it (wg_job_record_iteration); 0 when unknown. */
  uint64_t (*iteration)(wg_read_t *rd, const char *id);
  /* The plan history entries of job id (<prefix>/jobs/<id>/plans/..., key order). */
  int (*history)(wg_read_t *rd, const char *id, const wagma_etcd_kv_t **kvs, size_t *n);
  /* Registrations, assignments and quarantine records, each sorted by key, at one revision. */
  int (*agents)(wg_read_t *rd, wagma_etcd_range_t *agents, wagma_etcd_range_t *assign,
                wagma_etcd_range_t *quar);
  /* The job's timeline (a JSON array, borrowed) and the revision it is at: WAGMA_ENOTFOUND
   * when no job, WAGMA_EUNAVAIL when the source has no timelines (etcd). */
  int (*timeline)(wg_read_t *rd, const char *id, const json_t **events, int64_t *rev);
  /* Optional (NULL: nothing kept). An answer of kind for job id kept at (rev, t): 1 and *res
   * holds it, or 0. And keeping one. */
  int (*memo_get)(wg_read_t *rd, const char *id, int kind, int64_t rev, uint64_t t,
                  wg_response_t *res);
  void (*memo_put)(wg_read_t *rd, const char *id, int kind, int64_t rev, uint64_t t,
                   const wg_response_t *res);
  /* Answers a source error e (not one of the common ones above). */
  void (*fail)(wg_read_t *rd, int e, wg_response_t *res);
} wg_read_ops_t;

/* One request's reads from one source. */
struct wg_read {
  const wg_read_ops_t *ops;
  void *src;               /* the source: wg_cache_t * or wg_coord_t * */
  wg_coord_t *c;           /* keys, log */
  const wg_request_t *req; /* may be NULL (mutations answering with the job) */
  void *held[4];           /* what the source keeps until end (etcd: its results) */
};

/* Answers the read route r from the source rd was set up with (wg_read_etcd_init or the
 * cache's): 0, or WAGMA_EUNAVAIL when the source cannot answer now (nothing in *res), or
 * WAGMA_EINVAL when r is not a read route. */
int wg_reads_answer(wg_read_t *rd, const wg_route_t *r, wg_response_t *res);

/* The answer with job id's REST view as status (the mutations answer with it: 200, 201): 0,
 * or WAGMA_EUNAVAIL as wg_reads_answer. */
int wg_reads_job(wg_read_t *rd, const char *id, int status, wg_response_t *res);

/* The etcd source: sets up *rd to read through c's etcd client for req (may be NULL). */
void wg_read_etcd_init(wg_read_t *rd, wg_coord_t *c, const wg_request_t *req);

#endif
