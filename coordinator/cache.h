/* coordinator/cache.h — the read cache (cache.c, cache_serve.c): a watch-fed view of the jobs,
 * plans, progress and agents, its syncs with etcd, the reads and event-stream snapshots it answers.
 * Its insides are cache_view.h's. */
#ifndef WAGMA_COORD_CACHE_H
#define WAGMA_COORD_CACHE_H

#include "coord.h"
#include "hub.h"
#include "request.h"
#include "router.h"

typedef struct wg_cache wg_cache_t;

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
/* Tests (tests/unit/coordinator): a view without etcd, valid at once, with neither watch nor
 * thread; wg_cache_feed is the watch callback (events in revision order, rev the last one's).
 * Stop it with wg_cache_stop. */
wg_cache_t *wg_cache_detached(wg_coord_t *c);
void wg_cache_feed(wg_cache_t *cache, int status, const wagma_etcd_event_t *events, size_t n,
                   int64_t rev);

#endif
