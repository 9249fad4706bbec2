/* coordinator/metrics.h — the coordinator's counters, histograms and the Prometheus text
 * (metrics.c). Thread-safe. */
#ifndef WAGMA_COORD_METRICS_H
#define WAGMA_COORD_METRICS_H

#include <stddef.h>

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

#endif
