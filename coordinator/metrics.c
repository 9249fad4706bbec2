/* coordinator/metrics.c — Prometheus metrics of the coordinator.
 *
 * Owns: REST request counters by (method, route, code) and a latency histogram, a plan
 * computation histogram, the regroupings counter, and the latest cluster snapshot text that
 * the scheduler renders after each reconcile pass (jobs by state, agents, per-job epoch,
 * iteration and loss). One mutex guards everything; rendering copies under it. The REST
 * server's connection gauges and counters are atomics (the front thread updates them per
 * connection and must not wait on the mutex), and so are the read cache's and the event
 * streams' counters. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "wagma/status.h"

#define NBUCKETS 12
static const double http_buckets[NBUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                              0.05,   0.1,   0.25,   0.5,   1,    2.5};
static const double plan_buckets[NBUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                              0.01,   0.025,   0.05,   0.1,   0.25,   1};
#define MAX_SERIES 96

typedef struct series {
  char method[8];
  char route[32];
  int code;
  uint64_t count;
} series_t;

typedef struct histogram {
  uint64_t buckets[NBUCKETS];
  uint64_t count;
  double sum;
} histogram_t;

struct wg_metrics {
  pthread_mutex_t mu;
  series_t series[MAX_SERIES];
  int nseries;
  histogram_t http;
  histogram_t plan;
  uint64_t regroupings;
  char *snapshot;
  atomic_long conns_open;
  atomic_ullong conns_refused;
  atomic_ullong abandoned;
  atomic_long queue_depth;
  /* the read cache and the event streams (cache.c, hub.c) */
  atomic_ullong cache_hits, cache_waits, cache_fallbacks, cache_reloads, cache_front;
  atomic_long sse_clients;
  atomic_ullong sse_dropped;
};

void wg_metrics_cache(wg_metrics_t *m, int what) {
  if (!m)
    return;
  atomic_ullong *c = what == WG_METRIC_CACHE_HIT      ? &m->cache_hits
                     : what == WG_METRIC_CACHE_WAIT   ? &m->cache_waits
                     : what == WG_METRIC_CACHE_RELOAD ? &m->cache_reloads
                     : what == WG_METRIC_CACHE_FRONT  ? &m->cache_front
                                                      : &m->cache_fallbacks;
  atomic_fetch_add(c, 1);
}

void wg_metrics_sse(wg_metrics_t *m, int clients_delta, int dropped) {
  if (!m)
    return;
  atomic_fetch_add(&m->sse_clients, clients_delta);
  if (dropped)
    atomic_fetch_add(&m->sse_dropped, (unsigned long long)dropped);
}

void wg_metrics_conn_open(wg_metrics_t *m, int delta) {
  if (m)
    atomic_fetch_add(&m->conns_open, delta);
}

void wg_metrics_conn_refused(wg_metrics_t *m) {
  if (m)
    atomic_fetch_add(&m->conns_refused, 1);
}

void wg_metrics_abandoned(wg_metrics_t *m) {
  if (m)
    atomic_fetch_add(&m->abandoned, 1);
}

void wg_metrics_queue_depth(wg_metrics_t *m, long depth) {
  if (m)
    atomic_store(&m->queue_depth, depth);
}

int wg_metrics_create(wg_metrics_t **out) {
  wg_metrics_t *m = calloc(1, sizeof *m);
  if (!m)
    return WAGMA_ENOMEM;
  pthread_mutex_init(&m->mu, NULL);
  *out = m;
  return 0;
}

void wg_metrics_destroy(wg_metrics_t *m) {
  if (!m)
    return;
  pthread_mutex_destroy(&m->mu);
  free(m->snapshot);
  free(m);
}

static void observe(histogram_t *h, const double *bounds, double x) {
  for (int i = 0; i < NBUCKETS; i++)
    if (x <= bounds[i])
      h->buckets[i]++;
  h->count++;
  h->sum += x;
}

void wg_metrics_http(wg_metrics_t *m, const char *method, const char *route, int status,
                     double seconds) {
  if (!m)
    return;
  /* Unknown methods are folded into one label so clients cannot blow up the series. */
  static const char *const known[] = {"GET", "HEAD", "POST", "PATCH", "DELETE", "PUT"};
  const char *mlabel = "other";
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (method && strcmp(method, known[i]) == 0)
      mlabel = known[i];
  pthread_mutex_lock(&m->mu);
  observe(&m->http, http_buckets, seconds);
  int i;
  for (i = 0; i < m->nseries; i++) {
    series_t *s = &m->series[i];
    if (s->code == status && strcmp(s->method, mlabel) == 0 && strcmp(s->route, route) == 0)
      break;
  }
  if (i == m->nseries && m->nseries < MAX_SERIES) {
    series_t *s = &m->series[m->nseries++];
    snprintf(s->method, sizeof s->method, "%s", mlabel);
    snprintf(s->route, sizeof s->route, "%s", route);
    s->code = status;
  }
  if (i < m->nseries)
    m->series[i].count++;
  pthread_mutex_unlock(&m->mu);
}

void wg_metrics_plan_time(wg_metrics_t *m, double seconds) {
  if (!m)
    return;
  pthread_mutex_lock(&m->mu);
  observe(&m->plan, plan_buckets, seconds);
  pthread_mutex_unlock(&m->mu);
}

void wg_metrics_regrouping(wg_metrics_t *m) {
  if (!m)
    return;
  pthread_mutex_lock(&m->mu);
  m->regroupings++;
  pthread_mutex_unlock(&m->mu);
}

void wg_metrics_set_snapshot(wg_metrics_t *m, char *text) {
  if (!m) {
    free(text);
    return;
  }
  pthread_mutex_lock(&m->mu);
  free(m->snapshot);
  m->snapshot = text;
  pthread_mutex_unlock(&m->mu);
}

/* A growable string. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  if (b->oom)
    return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = 1;
      return;
    }
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + (size_t)n + 1)
      cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
}

static void render_histogram(sbuf_t *b, const char *name, const char *help, const histogram_t *h,
                             const double *bounds) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  for (int i = 0; i < NBUCKETS; i++)
    sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)h->buckets[i]);
  sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
  sb_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

char *wg_metrics_render(wg_metrics_t *m, int leader) {
  sbuf_t b = {0};
  pthread_mutex_lock(&m->mu);
  sb_printf(&b,
            "# HELP wagma_leader 1 if this coordinator leads (schedules)\n"
            "# TYPE wagma_leader gauge\nwagma_leader %d\n",
            leader);
  sb_printf(&b,
            "# HELP wagma_regroupings_total Plans this coordinator published after a "
            "job's first\n# TYPE wagma_regroupings_total counter\n"
            "wagma_regroupings_total %llu\n",
            (unsigned long long)m->regroupings);
  sb_printf(&b, "# HELP wagma_http_requests_total REST requests\n"
                "# TYPE wagma_http_requests_total counter\n");
  for (int i = 0; i < m->nseries; i++)
    sb_printf(&b, "wagma_http_requests_total{method=\"%s\",route=\"%s\",code=\"%d\"} %llu\n",
              m->series[i].method, m->series[i].route, m->series[i].code,
              (unsigned long long)m->series[i].count);
  render_histogram(&b, "wagma_http_request_duration_seconds", "REST request handling time",
                   &m->http, http_buckets);
  sb_printf(&b,
            "# HELP wagma_http_connections Open client connections\n"
            "# TYPE wagma_http_connections gauge\nwagma_http_connections %ld\n"
            "# HELP wagma_http_connections_refused_total Connections refused at accept (limits)\n"
            "# TYPE wagma_http_connections_refused_total counter\n"
            "wagma_http_connections_refused_total %llu\n"
            "# HELP wagma_http_abandoned_total Requests dropped because their client left\n"
            "# TYPE wagma_http_abandoned_total counter\nwagma_http_abandoned_total %llu\n"
            "# HELP wagma_http_queue_depth Requests waiting for an HTTP worker\n"
            "# TYPE wagma_http_queue_depth gauge\nwagma_http_queue_depth %ld\n",
            atomic_load(&m->conns_open), (unsigned long long)atomic_load(&m->conns_refused),
            (unsigned long long)atomic_load(&m->abandoned), atomic_load(&m->queue_depth));
  sb_printf(&b,
            "# HELP wagma_read_cache_total Reads of cacheable endpoints by how they were served "
            "(hit: at once from the cache; wait: from the cache after a sync; etcd: fallback)\n"
            "# TYPE wagma_read_cache_total counter\n"
            "wagma_read_cache_total{served=\"hit\"} %llu\n"
            "wagma_read_cache_total{served=\"wait\"} %llu\n"
            "wagma_read_cache_total{served=\"etcd\"} %llu\n"
            "# HELP wagma_read_cache_reloads_total Full reads of the tree by the cache (start, "
            "compaction, watch lost)\n# TYPE wagma_read_cache_reloads_total counter\n"
            "wagma_read_cache_reloads_total %llu\n"
            "# HELP wagma_read_cache_front_total Reads of the cache (hit or wait) that the "
            "connection front answered itself\n# TYPE wagma_read_cache_front_total counter\n"
            "wagma_read_cache_front_total %llu\n"
            "# HELP wagma_event_streams Open event-stream connections\n"
            "# TYPE wagma_event_streams gauge\nwagma_event_streams %ld\n"
            "# HELP wagma_event_streams_dropped_total Event-stream clients dropped for reading "
            "too slowly\n# TYPE wagma_event_streams_dropped_total counter\n"
            "wagma_event_streams_dropped_total %llu\n",
            (unsigned long long)atomic_load(&m->cache_hits),
            (unsigned long long)atomic_load(&m->cache_waits),
            (unsigned long long)atomic_load(&m->cache_fallbacks),
            (unsigned long long)atomic_load(&m->cache_reloads),
            (unsigned long long)atomic_load(&m->cache_front), atomic_load(&m->sse_clients),
            (unsigned long long)atomic_load(&m->sse_dropped));
  render_histogram(&b, "wagma_plan_compute_seconds", "Time to build and encode a plan", &m->plan,
                   plan_buckets);
  if (m->snapshot)
    sb_printf(&b, "%s", m->snapshot);
  pthread_mutex_unlock(&m->mu);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p;
}
