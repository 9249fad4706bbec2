/* coordinator/http.h — the REST server (http.c: libmicrohttpd, its worker pool and readiness
 * prober) and its limits (front.c applies them too; docs/api.md "Limits"). */
#ifndef WAGMA_COORD_HTTP_H
#define WAGMA_COORD_HTTP_H

#include "coord.h"

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

struct MHD_Daemon;
/* http.c: the MHD daemon (opaque here). */
int wg_http_bind(wg_coord_t *c, int *fd);
int wg_http_start(wg_coord_t *c, int fd, struct MHD_Daemon **out);
void wg_http_stop(struct MHD_Daemon *d);

#endif
