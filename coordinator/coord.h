/* coordinator/coord.h — one coordinator process: its configuration and its parts. Each part's
 * interface is its own header, which says what the part owns:
 *
 *   main.c        options, logging, signals, start / stop order
 *   front.h       the connection front (front.c): accept, connection limits, request heads
 *                 checked (http_head.h) before libmicrohttpd sees them, timeouts, bytes
 *                 relayed, cached reads answered itself (front_reads.c says which)
 *   http.h        libmicrohttpd glue (http.c): body accumulation and cap, the worker pool that
 *                 runs the etcd endpoints off libmicrohttpd's threads, readiness probes
 *   request.h     a request and its response, independent of libmicrohttpd
 *   router.h      raw target check (400), (method, path) -> route, 404 / 405 (pure; fuzzed)
 *   handlers.h    a request from router to endpoint (dispatch.c); the mutations
 *                 (handlers_jobs.c) and /healthz, /readyz, /metrics (handlers_misc.c)
 *   reads.h       the read endpoints, once, over a read source: the read cache or etcd
 *                 (reads.c, reads_etcd.c, cache_serve.c)
 *   pages.h       the pages of GET /v1/jobs: ids after a position, the continue token (pure)
 *   store.h       one job read from etcd, and its REST view
 *   cache.h       the read cache: one watch on <prefix>/ feeding an in-memory view (jobs,
 *                 plans and their history, progress, agents), its sync with etcd, the job
 *                 timelines and the events it derives (its insides: cache_view.h)
 *   hub.h         event-stream clients: bounded queues, publishing, heartbeats, drops
 *   sse.h         the text/event-stream encoder and the bounded byte queue (pure)
 *   ui.h          the web view: HTML, JS and CSS compiled in (coordinator/ui/)
 *   scheduler.h   membership and lifecycle: the reconcile loop (leader writes, all observe),
 *                 which reads the tree and applies what sched_decide.h decides
 *   sched_decide.h the scheduler's rules, pure: a snapshot and the clock -> the writes it wants
 *   reach.h       the partition rule: whom a job leaves out when members cannot reach each
 *                 other (pure)
 *   snapshot.h    the scheduler's view of the cluster as metrics lines
 *   planner.h     plan glue: members -> wagma_plan_build -> JSON + history entry, and back
 *   election.h    leader election on <prefix>/coordinator/leader (leased key)
 *   metrics.h     counters, histograms and the Prometheus text
 *
 * Threads: the front thread relays every connection; MHD's pool (WG_HTTP_IO_THREADS) parses
 * requests and answers those that need no etcd (/healthz, /metrics, refusals); the HTTP
 * workers (--threads) run the etcd handlers; the readiness prober pings etcd for /readyz and
 * its waiter answers within WG_HTTP_READY_WAIT_MS; the scheduler thread reconciles; the
 * election thread campaigns; the etcd library runs watch and keepalive threads; the read
 * cache has a sync thread (and its watch's), the event hub a heartbeat thread. Shared mutable
 * state is in wg_metrics_t, wg_election_t, wg_cache_t and wg_hub_t (each with its own locks);
 * wg_coord_t is written before the threads start and only read after. */
#ifndef WAGMA_COORD_H
#define WAGMA_COORD_H

#include <stddef.h>

#include "wagma/api.h"
#include "wagma/clock_internal.h" /* wg_wall (timestamps), wg_mono (durations) */
#include "wagma/etcd.h"
#include "wagma/status.h"

struct wg_metrics;
struct wg_election;
struct wg_scheduler;
struct wg_cache;
struct wg_hub;

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
  struct wg_metrics *metrics;
  struct wg_election *election;
  struct wg_scheduler *scheduler;
  struct wg_cache *cache; /* NULL: every read goes to etcd */
  struct wg_hub *hub;     /* NULL: no event streams */
  wagma_log_fn log;
  void *log_user;
} wg_coord_t;

#endif
