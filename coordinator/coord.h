/* coordinator/coord.h — private header of wagma-coordinator: the shared state of one
 * coordinator process and the interfaces between its parts.
 *
 *   main.c        options, logging, signals, start / stop order
 *   front.c       the connection front: accept, connection limits, request heads checked
 *                 (http_head.c) before libmicrohttpd sees them, timeouts, bytes relayed,
 *                 cached reads answered from the read cache (front_reads.c says which)
 *   http.c        libmicrohttpd glue: body accumulation and cap, the worker pool that runs
 *                 the etcd handlers off libmicrohttpd's threads, readiness probes, responses
 *   pages.c       the pages of GET /v1/jobs: ids after a position, the continue token (pure)
 *   router.c      raw target check (400), (method, path) -> route, 404 / 405 (pure; fuzzed)
 *   handlers_*.c  one function per endpoint, on wg_request_t / wg_response_t
 *   store.c       etcd reads and writes of jobs for the handlers
 *   cache.c       the read cache: one watch on <prefix>/ feeding an in-memory view (jobs,
 *                 plans and their history, progress, agents), its sync with etcd, the job
 *                 timelines and the events it derives (cache.h)
 *   cache_serve.c the read endpoints and the event-stream snapshots answered from the view
 *   hub.c         event-stream clients: bounded queues, publishing, heartbeats, drops
 *   sse.c         the text/event-stream encoder and the bounded byte queue (pure)
 *   ui.c          the web view: HTML, JS and CSS compiled in (coordinator/ui/)
 *   scheduler.c   membership and lifecycle: the reconcile loop (leader writes, all observe)
 *   planner.c     plan glue: members -> wagma_plan_build -> JSON + history entry, and back
 *   election.c    leader election on <prefix>/coordinator/leader (leased key)
 *   metrics.c     counters, histograms and the Prometheus text
 *
 * Threads: the front thread relays every connection; MHD's pool (WG_HTTP_IO_THREADS) parses
 * requests and answers those that need no etcd (/healthz, /metrics, refusals); the HTTP
 * workers (--threads) run the etcd handlers; the readiness prober pings etcd for /readyz and
 * its waiter answers within WG_HTTP_READY_WAIT_MS; the scheduler thread reconciles; the
 * election thread campaigns; the etcd library runs watch and keepalive threads; the read
 * cache has a sync thread (and its watch's), the event hub a heartbeat thread. Shared mutable
 * state is in wg_metrics_t, wg_election_t, wg_cache_t and wg_hub_t (each with its own locks)
 * and the atomics here. */
#ifndef WAGMA_COORD_H
#define WAGMA_COORD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "wagma/api.h"
#include "wagma/clock_internal.h" /* wg_wall (timestamps), wg_mono (durations) */
#include "wagma/etcd.h"
#include "wagma/status.h"

/* ---- requests and responses (independent of libmicrohttpd) -------------------------------- */

#define WG_MAX_QUERY 8

typedef struct wg_request {
  const char *method;
  const char *path; /* percent-decoded, without the query */
  /* The request target as it came on the wire (path and query, not decoded), target_len
   * bytes; a NUL among them was a raw NUL byte on the wire (http.c passes the bytes up to and
   * including it). NULL when the server did not capture it: then only path is checked. */
  const char *target;
  size_t target_len;
  const char *content_type;  /* NULL if absent */
  const char *authorization; /* NULL if absent */
  const char *body;          /* NULL or body_len bytes (NUL-terminated by http.c) */
  size_t body_len;
  int body_too_large; /* the body exceeded --max-body (it was discarded) */
  size_t max_body;
  int nquery;
  int query_overflow; /* more than WG_MAX_QUERY parameters came: answered 400 */
  const char *query_key[WG_MAX_QUERY];
  const char *query_value[WG_MAX_QUERY]; /* NULL for "?flag" */
  /* 1 when the client has left (its connection ended): a long handler asks between etcd
   * calls and stops. NULL: never asked (tests, fuzzers). */
  int (*gone)(void *gone_user);
  void *gone_user;
} wg_request_t;

/* Returns the value of a query parameter, NULL when absent; *present (may be NULL) = 1 when
 * the key appeared (even without value). */
const char *wg_request_query(const wg_request_t *req, const char *key, int *present);

typedef struct wg_response {
  int status;
  int static_body;           /* body points at static memory (not freed, not copied) */
  const char *cache_control; /* static string, NULL = none */
  char *body;                /* malloc'd, owned by the response */
  size_t body_len;
  const char *content_type; /* static string */
  char location[192];       /* "" = none */
  char allow[64];           /* "" = none */
  int www_authenticate;     /* add WWW-Authenticate: Bearer */
  int retry_after;          /* add Retry-After: <seconds> (503 busy); 0 = none */
} wg_response_t;

/* Sets an error response with the JSON error body. */
void wg_response_error(wg_response_t *res, int status, const char *code, const char *field,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Takes ownership of json (malloc'd string). */
void wg_response_json(wg_response_t *res, int status, char *json);
void wg_response_free(wg_response_t *res);

/* ---- router ------------------------------------------------------------------------------ */

typedef enum wg_route_id {
  WG_ROUTE_NONE = 0,
  WG_ROUTE_JOBS_LIST,
  WG_ROUTE_JOBS_SUBMIT,
  WG_ROUTE_JOB_GET,
  WG_ROUTE_JOB_PATCH,
  WG_ROUTE_JOB_DELETE,
  WG_ROUTE_JOB_GROUPS,
  WG_ROUTE_JOB_PLAN,
  WG_ROUTE_AGENTS,
  WG_ROUTE_HEALTHZ,
  WG_ROUTE_READYZ,
  WG_ROUTE_METRICS,
  WG_ROUTE_JOB_EVENTS, /* GET /v1/jobs/{id}/events: the timeline (JSON), or a stream */
  WG_ROUTE_EVENTS,     /* GET /v1/events: the stream of every job's changes */
  WG_ROUTE_UI,         /* GET /, /ui/...: the web view's files */
} wg_route_id_t;

typedef struct wg_route {
  wg_route_id_t id;
  int status;     /* 0 = matched; 404 or 405 otherwise */
  char allow[64]; /* with 405: the methods the path has */
  char job[WAGMA_API_NAME_MAX];
  int mutation;      /* POST / PATCH / DELETE: needs the token when one is configured */
  int events;        /* an events path: needs the token too (docs/api.md "Event streams") */
  int asset;         /* WG_ROUTE_UI: the file's index (ui.c); -1 = "/" (redirect to /ui/) */
  const char *label; /* low-cardinality path label for metrics ("/v1/jobs/{id}") */
} wg_route_t;

/* Pure. path has no query string. HEAD is treated as GET. */
void wg_route(const char *method, const char *path, wg_route_t *out);

/* Pure. Checks a raw request target (len bytes, path and query, before any percent-decoding):
 * 0 when acceptable, 400 when it holds a NUL or control byte, raw or percent-encoded, a
 * malformed percent escape, or (in the path) an encoded '/'. *why (may be NULL) gets a
 * static reason with 400, NULL with 0. target NULL is acceptable (nothing to check). */
int wg_route_target_check(const char *target, size_t len, const char **why);

/* ---- metrics ----------------------------------------------------------------------------- */

typedef struct wg_metrics wg_metrics_t;
int wg_metrics_create(wg_metrics_t **out);
void wg_metrics_destroy(wg_metrics_t *m);
void wg_metrics_http(wg_metrics_t *m, const char *method, const char *route, int status,
                     double seconds);
void wg_metrics_plan_time(wg_metrics_t *m, double seconds);
void wg_metrics_regrouping(wg_metrics_t *m);
/* Replaces the cluster snapshot text (lines of the scheduler's view); takes ownership. */
void wg_metrics_set_snapshot(wg_metrics_t *m, char *text);
/* Renders the whole exposition; caller frees. */
char *wg_metrics_render(wg_metrics_t *m, int leader);
/* The REST server's own gauges and counters (atomics, no lock): open connections (delta),
 * connections refused at accept, requests dropped because their client left, and the
 * worker queue's depth. */
void wg_metrics_conn_open(wg_metrics_t *m, int delta);
void wg_metrics_conn_refused(wg_metrics_t *m);
void wg_metrics_abandoned(wg_metrics_t *m);
void wg_metrics_queue_depth(wg_metrics_t *m, long depth);
/* The read cache (what: one of these) and the event streams (open delta, dropped). */
enum {
  WG_METRIC_CACHE_HIT,
  WG_METRIC_CACHE_WAIT,
  WG_METRIC_CACHE_FALLBACK,
  WG_METRIC_CACHE_RELOAD,
  WG_METRIC_CACHE_FRONT /* a hit or wait the connection front answered itself */
};
void wg_metrics_cache(wg_metrics_t *m, int what);
void wg_metrics_sse(wg_metrics_t *m, int clients_delta, int dropped);

/* ---- election ------------------------------------------------------------------------------ */

typedef struct wg_election wg_election_t;
/* Starts the campaign thread. Ownership: *out is the caller's (wg_election_stop). */
int wg_election_start(wagma_etcd_t *etcd, const wagma_keys_t *keys, const char *id,
                      const char *address, int ttl_s, wagma_log_fn log, void *log_user,
                      wg_election_t **out);
/* Resigns (revokes the lease), stops the thread, frees. NULL is a no-op. */
void wg_election_stop(wg_election_t *e);
/* 1 while we lead; *lease (may be NULL) = the lease our leader key is attached to. */
int wg_election_is_leader(wg_election_t *e, int64_t *lease);

/* ---- planner ------------------------------------------------------------------------------- */

typedef struct wg_plan_member {
  const char *name;
  const char *address;
  int joiner;
} wg_plan_member_t;

typedef struct wg_plan_request {
  uint64_t epoch;
  uint64_t start_round;
  int group_size;
  int staleness_bound;
  wagma_sync_t global_sync;
  int nmembers;
  const wg_plan_member_t *members; /* rank order */
} wg_plan_request_t;

/* Builds the plan and encodes it, and with record non-NULL its history entry
 * (wagma_plan_record_t, see wagma/api.h). Ownership: *json and *record are the caller's
 * (free); both NULL on failure. */
int wg_planner_build(const wg_plan_request_t *req, char **json, char **record, double *seconds);
/* wg_planner_build without the history entry. */
int wg_planner_build_json(const wg_plan_request_t *req, char **json, double *seconds);
/* FNV-1a 64 of the plan's phases (nranks, nphases, every phase's offsets and ranks). */
struct wagma_plan; /* wagma/collective.h */
uint64_t wg_planner_phases_hash(const struct wagma_plan *plan);
/* Rebuilds the groups of a history entry: wagma_plan_build(nmembers, group_size) with the
 * entry's epoch, start_round, staleness bound, global sync and member names (no addresses).
 * WAGMA_ERANGE when the phases do not hash to the entry's phases_hash (a planner that groups
 * differently wrote it). Ownership: on 0, *plan is the caller's (wagma_plan_free). */
int wg_planner_from_record(const wagma_plan_record_t *rec, struct wagma_plan *plan);

/* ---- the coordinator ---------------------------------------------------------------------- */

typedef struct wg_scheduler wg_scheduler_t;
typedef struct wg_cache wg_cache_t;
typedef struct wg_hub wg_hub_t;

typedef struct wg_coord {
  /* configuration */
  char id[WAGMA_API_NAME_MAX];
  char listen_host[64];
  int listen_port;
  char token[256]; /* "" = no auth */
  size_t max_body;
  int lease_ttl_s;
  int threads;
  int quarantine_s;        /* how long an agent that cannot serve jobs is not assigned; 0 = never */
  int read_cache;          /* serve reads from the watch-fed cache (--read-cache on, the default) */
  double read_staleness_s; /* --read-staleness-ms / 1000: 0 = consistent reads (see cache.c) */
  double sse_heartbeat_s;  /* event streams: a comment line this often (default 15 s) */
  size_t sse_client_buffer; /* event streams: bytes queued for one client before it is dropped */
  int sse_max_clients;      /* event streams open at once (more: 503 busy) */
  wagma_keys_t keys;
  /* parts */
  wagma_etcd_t *etcd;
  wg_metrics_t *metrics;
  wg_election_t *election;
  wg_scheduler_t *scheduler;
  wg_cache_t *cache; /* NULL: every read goes to etcd */
  wg_hub_t *hub;     /* NULL: no event streams */
  wagma_log_fn log;
  void *log_user;
} wg_coord_t;

/* ---- the REST server's limits (front.c, http.c; docs/api.md "Limits") ---------------------- */

#define WG_HTTP_MAX_CONNECTIONS 1024 /* open client connections; more: 503 busy at accept */
#define WG_HTTP_MAX_PER_IP 128       /* open connections from one client address */
#define WG_HTTP_MAX_LINE 8192        /* request line bytes; longer: 414 */
#define WG_HTTP_MAX_HEAD 16384       /* request line + header fields; larger: 431 */
#define WG_HTTP_MAX_FIELDS 100       /* header fields; more: 431 */
#define WG_HTTP_CONTENT_LENGTH_MAX 1000000000000000ULL /* beyond: 413 at once */
#define WG_HTTP_HEAD_TIMEOUT_S 10.0 /* a head (or a stalled body) within: else 408 */
#define WG_HTTP_IDLE_TIMEOUT_S 30.0 /* a connection with no traffic either way is closed */
#define WG_HTTP_SWEEP_S 0.25        /* how often the front checks its timeouts */
#define WG_HTTP_IO_THREADS 2        /* MHD's pool: parsing, /healthz, /metrics */
#define WG_HTTP_QUEUE_WAIT_S 10.0   /* a request queued longer for a worker: 503 busy */
#define WG_HTTP_WORKER_NICE 10      /* the workers' nice value: probes and I/O go first */
#define WG_HTTP_READY_WAIT_MS 50    /* /readyz waits this long for etcd's answer: else 503 */

/* ---- request heads (http_head.c, pure; fuzzed) ------------------------------------------- */

typedef struct wg_http_limits {
  size_t max_line; /* request line without its end; longer: 414 */
  size_t max_head; /* everything from the request line to the blank line; larger: 431 */
  int max_fields;  /* header fields; more: 431 */
} wg_http_limits_t;

enum { WG_HEAD_MORE = 0, WG_HEAD_OK = 1, WG_HEAD_BAD = 2 };

typedef struct wg_http_head {
  size_t skip;             /* WG_HEAD_OK: empty lines before the request line (not forwarded) */
  size_t len;              /* WG_HEAD_OK: the head after them, blank line included */
  uint64_t content_length; /* WG_HEAD_OK: body bytes that follow (0 without Content-Length) */
  char method[16];         /* the method when the request line got that far, else "" */
  int status;              /* WG_HEAD_BAD: 400, 411, 413, 414, 431 or 505 */
  const char *code;        /* WG_HEAD_BAD: the error code (docs/api.md) */
  const char *why;         /* WG_HEAD_BAD: static text */
} wg_http_head_t;

/* Checks the n bytes of one request head at the start of buf (what arrived so far):
 * WG_HEAD_MORE (nothing wrong yet, need more bytes), WG_HEAD_OK or WG_HEAD_BAD (*h says
 * why). Pure. */
int wg_http_head_parse(const char *buf, size_t n, const wg_http_limits_t *lim, wg_http_head_t *h);

/* ---- the connection front (front.c) ------------------------------------------------------ */

struct MHD_Daemon;
typedef struct wg_front wg_front_t;
/* Starts the front thread on a listening socket (taken over: closed by wg_front_stop, or
 * left to the caller on failure), handing connections to mhd (MHD_USE_NO_LISTEN_SOCKET).
 * Ownership: *out is the caller's (wg_front_stop, then wg_front_free). */
int wg_front_start(wg_coord_t *c, int listen_fd, struct MHD_Daemon *mhd, wg_front_t **out);
/* Stops the thread, closes every connection and the listening socket (every client then reads
 * as gone). NULL: no-op. */
void wg_front_stop(wg_front_t *f);
/* Frees a stopped front, once nothing calls wg_front_client_gone, wg_front_conn_gen or
 * wg_front_mhd_done any more (the workers joined, libmicrohttpd stopped). NULL: no-op. */
void wg_front_free(wg_front_t *f);
/* The generation of the connection whose libmicrohttpd end is mhd_fd (0 = unknown), read
 * while libmicrohttpd holds that end; then whether that connection's client has left: 1, 0,
 * or -1 when the front cannot tell. Thread-safe (atomics per descriptor number). */
unsigned wg_front_conn_gen(const wg_front_t *f, int mhd_fd);
int wg_front_client_gone(const wg_front_t *f, int mhd_fd, unsigned gen);
/* libmicrohttpd completed a request on its end mhd_fd of generation gen (http.c's completion
 * callback): the front counts the requests it handed over, and answers cached reads itself
 * only on connections where none is left. Thread-safe. */
void wg_front_mhd_done(wg_front_t *f, int mhd_fd, unsigned gen);

/* The reads the front answers itself (front_reads.c). */
#define WG_FAST_TARGET_MAX 512
typedef struct wg_fast_read {
  char target[WG_FAST_TARGET_MAX]; /* the path, then the query's pieces (req points here) */
  wg_request_t req;
  wg_route_t route;
} wg_fast_read_t;
/* 1 when the request head (len bytes, accepted by wg_http_head_parse, no body) is a read the
 * front may answer from the read cache with the same bytes libmicrohttpd would send; *out then
 * holds the request and its route (not to be copied: req points into it). Pure. */
int wg_fast_read_parse(const wg_coord_t *c, const char *head, size_t len, wg_fast_read_t *out);
/* The status line and header fields of an answer with a body of body_len bytes, into buf:
 * their length, or 0 (a status it has no reason phrase for, or cap too small). Front thread
 * only (it keeps the Date of the current second). */
size_t wg_fast_read_head(int status, const char *content_type, size_t body_len, char *buf,
                         size_t cap);

/* ---- pages of GET /v1/jobs (pages.c, pure) ------------------------------------------------ */

#define WG_LIST_LIMIT_DEFAULT 100 /* jobs per page without ?limit */
#define WG_LIST_LIMIT_MAX 500     /* the largest ?limit */
#define WG_LIST_PROBE_KEYS 2048   /* keys per keys-only read of the walk */
#define WG_LIST_ROUND_TRIPS 48    /* etcd round trips of the walk per request */
#define WG_LIST_PROGRESS_MAX 256  /* progress records read per listed job (see docs/api.md) */
#define WG_LIST_TOKEN_MAX 128     /* bytes of a continue token, NUL included */
#define WG_WALK_START (-2)        /* wg_walk_pos_t.level: no position yet */

/* Relative keys (after <prefix>/jobs/), sorted; more = 1 when the read was cut by its limit. */
typedef struct wg_keylist {
  char **keys;
  size_t n;
  int more;
} wg_keylist_t;

typedef struct wg_walk_io {
  /* keys-only read of the first limit keys under <jobs prefix>prefix */
  int (*keys)(void *user, const char *prefix, size_t limit, wg_keylist_t *out);
  /* exists[i] = 1 when some key starts with <jobs prefix>prefixes[i]; one round trip */
  int (*exists)(void *user, const char *const *prefixes, size_t n, int *exists);
  void (*free_keys)(void *user, wg_keylist_t *kl);
  void *user;
} wg_walk_io_t;

/* A position in the job ids: after last, going on at level (WG_WALK_START: before all). */
typedef struct wg_walk_pos {
  char last[WAGMA_API_NAME_MAX];
  int level;
} wg_walk_pos_t;

/* Compares job ids in key order ("a/" against "b/" bytewise). */
int wg_job_key_cmp(const char *a, const char *b);
/* Puts up to want ids after *pos into ids (n of them, in key order) with at most
 * *round_trips etcd calls through io (counted down), and moves *pos past them. *done = 1 when no id
 * is left after *pos. Returns 0 or the first error of io (then *n ids were still found). */
int wg_jobs_walk(const wg_walk_io_t *io, wg_walk_pos_t *pos, size_t want, int *round_trips,
                 size_t probe_keys, char (*ids)[WAGMA_API_NAME_MAX], size_t *n, int *done);
/* The opaque continue token of a position (base64url), and back: -1 when token is not one
 * this server wrote (any other string, a position that cannot be). */
int wg_list_token_encode(const wg_walk_pos_t *pos, char *out, size_t len);
int wg_list_token_decode(const char *token, wg_walk_pos_t *pos);

/* http.c: the MHD daemon (opaque here). */
int wg_http_bind(wg_coord_t *c, int *fd);
int wg_http_start(wg_coord_t *c, int fd, struct MHD_Daemon **out);
void wg_http_stop(struct MHD_Daemon *d);

/* Handles one request (router + auth + handler). Fills *res. */
void wg_handle(wg_coord_t *c, const wg_request_t *req, wg_response_t *res);
/* wg_handle in two steps, for http.c: every check before the endpoint (target, route, token,
 * body size, content type) fills *r and returns 0 when the endpoint is to run, or answers in
 * *res and returns 1; wg_handle_route then runs the endpoint r names. */
int wg_handle_prepare(wg_coord_t *c, const wg_request_t *req, wg_route_t *r, wg_response_t *res);
void wg_handle_route(wg_coord_t *c, const wg_request_t *req, const wg_route_t *r,
                     wg_response_t *res);
/* 1 when the endpoint calls etcd (it then runs on an HTTP worker, never on MHD's threads). */
int wg_route_uses_etcd(wg_route_id_t id);

/* Handlers (handlers_jobs.c, handlers_misc.c). */
void wg_h_jobs_submit(wg_coord_t *c, const wg_request_t *req, wg_response_t *res);
void wg_h_job_patch(wg_coord_t *c, const char *job, const wg_request_t *req, wg_response_t *res);
void wg_h_job_delete(wg_coord_t *c, const char *job, const wg_request_t *req, wg_response_t *res);
void wg_h_healthz(wg_coord_t *c, wg_response_t *res);
void wg_h_readyz(wg_coord_t *c, wg_response_t *res);
/* The /readyz answer for a ping that returned e (0: revision rev; else detail says why). */
void wg_h_readyz_answer(wg_coord_t *c, int e, int64_t rev, const char *detail, wg_response_t *res);
void wg_h_metrics(wg_coord_t *c, wg_response_t *res);

/* Maps an etcd failure onto a response (503 unavailable, 500 otherwise). */
void wg_response_etcd_error(wg_coord_t *c, wg_response_t *res, int status);

/* ---- store (store.c): one job read from etcd -------------------------------------------- */

typedef struct wg_progress_entry {
  char agent[WAGMA_API_NAME_MAX];
  wagma_progress_t progress;
  int64_t mod; /* mod revision of the progress key: which registration of the agent wrote it */
} wg_progress_entry_t;

typedef struct wg_job_record {
  char id[WAGMA_API_NAME_MAX];
  int has_spec, has_status;
  wagma_job_spec_t spec;
  int64_t spec_mod;
  wagma_job_status_t status;
  int64_t status_mod;
  char *plan_json; /* NULL when no plan */
  size_t plan_len;
  int64_t plan_mod;
  int has_checkpoint;
  wagma_checkpoint_record_t checkpoint; /* the job's checkpoint record, when has_checkpoint */
  int nprogress;
  wg_progress_entry_t *progress;
} wg_job_record_t;

/* Fills rec from the kvs of one job (keys under <prefix>/jobs/<id>/). Records that do not
 * decode are skipped (logged). */
int wg_job_record_from_kvs(wg_coord_t *c, const char *id, const wagma_etcd_kv_t *kvs, size_t n,
                           wg_job_record_t *rec);
void wg_job_record_free(wg_job_record_t *rec);
/* Reads one job. WAGMA_ENOTFOUND when it has no spec. */
int wg_store_load_job(wg_coord_t *c, const char *id, wg_job_record_t *rec);
/* The job's iteration as REST shows it: status.iteration (the high-water mark written at each
 * plan change) or the highest iteration an agent reported in the status' epoch, whichever is
 * larger. Reports of older epochs do not count: a survivor may have reported an iteration of
 * the old epoch past the new plan's start_round, which it counts again in the new epoch, and
 * the job's iteration must not go back when it does. */
uint64_t wg_job_record_iteration(const wg_job_record_t *rec);
/* The job's result when it ends at `finished` (unix s): the final reports of its last epoch
 * (those that reported "done" when any did, else those running or failed; never an agent's
 * "unavailable"), status.summary. */
void wg_job_record_summary(const wg_job_record_t *rec, double finished, wagma_job_summary_t *out);
/* The REST view of a job: {"id","spec","status","warnings","members"} (members only when
 * with_members; warnings: wagma_job_spec_warnings, [] when none). */
json_t *wg_job_record_to_value(const wg_job_record_t *rec, int with_members);

/* ---- server-sent events on the wire (sse.c, pure) ---------------------------------------- */

/* Encodes one event ("id:", "event:" lines when given, one "data:" line per line of data, a
 * blank line) into out (cap bytes, NUL-terminated when it fits); returns its length whatever
 * cap is, so (NULL, 0) measures. CR/LF in id and event become spaces. */
size_t wg_sse_encode(char *out, size_t cap, const char *id, const char *event, const char *data);
/* wg_sse_encode into a new string (*len its length). Ownership: the caller frees. */
char *wg_sse_event(const char *id, const char *event, const char *data, size_t *len);
/* A comment line ": text\n\n" (heartbeats), as wg_sse_encode measures and writes. */
size_t wg_sse_comment(char *out, size_t cap, const char *text);

/* The bytes a client has not taken yet, at most limit. */
typedef struct wg_sse_queue {
  char *buf;
  size_t off, len, cap, limit;
} wg_sse_queue_t;
void wg_sse_queue_init(wg_sse_queue_t *q, size_t limit);
void wg_sse_queue_free(wg_sse_queue_t *q);
/* Appends n bytes: 0; WAGMA_ERANGE (nothing appended) when the queue would hold more than its
 * limit; WAGMA_ENOMEM. */
int wg_sse_queue_push(wg_sse_queue_t *q, const char *bytes, size_t n);
/* Takes up to max bytes into out; returns how many. */
size_t wg_sse_queue_pop(wg_sse_queue_t *q, char *out, size_t max);
size_t wg_sse_queue_pending(const wg_sse_queue_t *q);

/* ---- the event hub (hub.c) ------------------------------------------------------------------ */

#define WG_SSE_CLIENT_BUFFER (1u << 20) /* default --sse-client-buffer */
#define WG_SSE_MAX_CLIENTS 256          /* default --sse-max-clients */
#define WG_SSE_HEARTBEAT_S 15.0         /* default --sse-heartbeat-ms / 1000 */

struct MHD_Connection;
typedef struct wg_sse_client wg_sse_client_t;

/* Starts the hub and its heartbeat thread. Ownership: *out is the caller's (wg_hub_destroy,
 * after the HTTP server stopped: libmicrohttpd's completion of a stream calls into it). */
int wg_hub_create(wg_coord_t *c, wg_hub_t **out);
void wg_hub_destroy(wg_hub_t *h);
/* A client of one job's events (job its id) or of every job's (job NULL or ""), on the
 * connection conn whose libmicrohttpd end is fd (the front's generation gen);
 * gone(gone_user, fd, gen) says whether its client left (1). Not listed yet. Ownership: the
 * caller's until wg_hub_add_locked lists it (then the hub frees it in wg_hub_client_done). */
wg_sse_client_t *wg_hub_client_new(wg_hub_t *h, const char *job, struct MHD_Connection *conn,
                                   int fd, unsigned gen, int (*gone)(void *, int, unsigned),
                                   void *gone_user);
void wg_hub_client_free(wg_sse_client_t *cl);
/* Publishing: between wg_hub_lock and wg_hub_unlock (which resumes the connections that got
 * data, after releasing the lock). The cache publishes under its own lock (cache, then hub). */
void wg_hub_lock(wg_hub_t *h);
void wg_hub_unlock(wg_hub_t *h);
/* Queues bytes for every listed client of job (all_too: and for every all-jobs client); a
 * client that would pass its buffer is dropped. */
void wg_hub_publish_locked(wg_hub_t *h, const char *job, int all_too, const char *bytes, size_t n);
/* Queues bytes for one client (its snapshot, a resumed stream's missed events), whatever
 * their size: only later events are held to the client's buffer. Drops the client when what
 * it has not read is already over its buffer. */
void wg_hub_send_locked(wg_hub_t *h, wg_sse_client_t *cl, const char *bytes, size_t n);
/* Calls fn for every listed client (the cache sends new snapshots after a reload). */
void wg_hub_foreach_locked(wg_hub_t *h, void (*fn)(void *user, wg_sse_client_t *cl), void *user);
const char *wg_hub_client_job(const wg_sse_client_t *cl); /* "" = every job */
/* 1 when some listed client follows job (or every job). */
int wg_hub_wants_locked(wg_hub_t *h, const char *job);
/* Lists the client (0), or WAGMA_EBUSY beyond --sse-max-clients. */
int wg_hub_add_locked(wg_hub_t *h, wg_sse_client_t *cl);
/* libmicrohttpd's content reader of a stream: bytes copied, 0 after suspending the connection
 * (nothing queued), -1 end of stream (server stopping), -2 error (dropped). */
long wg_hub_read(wg_sse_client_t *cl, char *buf, size_t max);
/* libmicrohttpd is done with the stream: unlists and frees the client. */
void wg_hub_client_done(wg_sse_client_t *cl);
/* Server stop: every stream ends (suspended ones are resumed to see it). */
void wg_hub_close_all(wg_hub_t *h);

/* ---- the read cache (cache.c, cache_serve.c) ------------------------------------------------ */

#define WG_CACHE_SYNC_WAIT_S 1.0 /* a read waits at most this for a sync, then reads etcd */

/* Loads the view (one Range of <prefix>/) and starts the watch and the sync thread; a failed
 * load is retried by the thread (reads go to etcd meanwhile). Ownership: *out is the
 * caller's (wg_cache_stop). */
int wg_cache_start(wg_coord_t *c, wg_cache_t **out);
void wg_cache_stop(wg_cache_t *cache);
/* A write of this coordinator committed at rev: reads wait until the view has it. NULL: no-op. */
void wg_cache_note_write(wg_cache_t *cache, int64_t rev);
/* 1 when a read that arrived at mono time arrival may be answered from the view at once:
 * --read-staleness-ms > 0, the view verified current within it, and every write of this
 * coordinator in it. */
int wg_cache_fresh(wg_cache_t *cache, double arrival);
/* For the connection front, which answers reads itself without waiting: may a read that
 * arrived at mono time arrival be answered from the view now? 1 yes (as wg_cache_fresh, or a
 * sync that started at or after arrival verified the view, with this coordinator's writes in
 * it); 0 not yet (a sync is asked for, and the eventfds given to wg_cache_notify are written
 * once one completes); -1 no: the view is reloading or etcd failed twice since the first call
 * for this read (first = 1 records the failure count in *failures), so the caller hands the
 * read to libmicrohttpd, whose path falls back to etcd. Thread-safe. */
int wg_cache_ready(wg_cache_t *cache, double arrival, unsigned *failures, int first);
/* Registers an eventfd (efd >= 0) to be written when parked reads may be ready, or unregisters
 * fd with efd = -1 - fd. At most WG_CACHE_NOTIFY_MAX. The caller keeps the descriptor. */
void wg_cache_notify(wg_cache_t *cache, int efd);
/* Waits until a sync that started at or after since verified the view (it then holds every
 * change etcd had committed then), at most until deadline (mono). Returns the verified time,
 * or -1 (deadline, view not valid, etcd unreachable). */
double wg_cache_sync(wg_cache_t *cache, double since, double deadline);
/* 1 for the routes the cache answers (GET of jobs, a job, groups, plan, agents, events). */
int wg_cache_route(wg_route_id_t id);
/* Answers a read from the view: 0, or WAGMA_EUNAVAIL when the view is not valid (the caller
 * reads etcd). Never calls etcd. */
int wg_cache_serve(wg_cache_t *cache, const wg_request_t *req, const wg_route_t *r,
                   wg_response_t *res);
/* Lists cl in the hub with its first event, the snapshot (rendered from the view under the
 * same lock, so no change is lost or sent twice); or, when last_event_id (Last-Event-ID, may be
 * NULL) is an id of this view that the kept events still reach back to, the events it missed
 * instead (docs/api.md "Event streams"). 0; 404 not_found (job unknown), 503 when
 * the view is not valid or too many streams are open: then *res says so and cl is the
 * caller's. */
int wg_cache_subscribe(wg_cache_t *cache, wg_sse_client_t *cl, const char *last_event_id,
                       wg_response_t *res);

/* ---- the web view (ui.c) ----------------------------------------------------------------------
 */

/* The files, generated from coordinator/ui/ by cmake/WagmaEmbed.cmake (ui_assets.c). */
typedef struct wg_ui_file {
  const char *name; /* path under /ui/ */
  const char *type; /* Content-Type */
  const unsigned char *data;
  size_t len;
} wg_ui_file_t;
extern const wg_ui_file_t wg_ui_files[];
extern const int wg_ui_nfiles;
/* The file of route->asset, or the redirect of "/": a static body. */
void wg_h_ui(const wg_route_t *r, wg_response_t *res);
/* The index of a file of the web view by its path under /ui/ ("" = index.html), or -1. */
int wg_ui_asset(const char *name);

/* ---- scheduler --------------------------------------------------------------------------- */

/* Starts the reconcile thread (observes always, writes when the election says we lead). */
int wg_scheduler_start(wg_coord_t *c, wg_scheduler_t **out);
void wg_scheduler_stop(wg_scheduler_t *s);
/* Asks for a reconcile pass soon (e.g. after a REST mutation). */
void wg_scheduler_poke(wg_scheduler_t *s);

#endif
