/* coordinator/hub.h — the event hub (hub.c): event-stream clients, their bounded queues,
 * publishing, heartbeats (one thread), drops. */
#ifndef WAGMA_COORD_HUB_H
#define WAGMA_COORD_HUB_H

#include <stddef.h>

#include "coord.h"

typedef struct wg_hub wg_hub_t;

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

#endif
