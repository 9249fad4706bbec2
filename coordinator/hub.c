/* coordinator/hub.c — the event-stream clients (GET /v1/jobs/{id}/events as a stream,
 * GET /v1/events) and what they are sent.
 *
 * Owns the list of clients, each with a bounded byte queue (sse.c) of what it has not taken
 * yet. Threads:
 *   - the publisher (the read cache's watch thread, cache.c) appends events to the queues of
 *     the clients that follow the job, under the hub's lock (which it takes while holding the
 *     cache's, so a snapshot and the events after it never overlap or leave a gap);
 *   - libmicrohttpd's threads take bytes in the content reader (wg_hub_read): with nothing
 *     queued it suspends the connection (so no thread polls an idle stream) and the next
 *     publish resumes it; a stream is never answered from a worker, never waits for etcd;
 *   - the heartbeat thread adds a comment line to every stream each --sse-heartbeat-ms (the
 *     front closes connections idle for 30 s) and drops the suspended streams whose client
 *     left (a suspended connection is not watched by libmicrohttpd).
 * A client whose queue would pass --sse-client-buffer is DROPPED: marked, its libmicrohttpd
 * socket shut down (libmicrohttpd then fails the connection and completes it; the front closes
 * the client side), never waited for. The opening bytes of a stream and the snapshot after a
 * reload (wg_hub_send_locked) do not count against the buffer while they wait: they are queued
 * whatever their size (a client is dropped only when what it has not taken of the rest is
 * already over the buffer then), and the events after them are held to the buffer on their
 * own. So a slow reader costs at most its buffer plus one snapshot, and neither the publisher
 * nor /healthz ever waits for it. Only clients dropped for reading too slowly are counted
 * (wagma_event_streams_dropped_total); a suspended stream whose client left is dropped by the
 * heartbeat without counting.
 *
 * Lifetime: a client is freed only by wg_hub_client_done, libmicrohttpd's completion of its
 * response, which takes the hub's lock: while the lock is held a listed client exists, and
 * its socket (closed by libmicrohttpd only after the completion) is open. A suspended
 * connection is never completed, so the one that cleared `suspended` may resume it after
 * releasing the locks. Lock order: cache, hub, client. MHD_resume_connection is only called
 * with no lock held. */
#include <sys/socket.h>

#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"
#include "hub.h"
#include "metrics.h"
#include "sse.h"
#include "wagma/log_internal.h"

struct wg_sse_client {
  wg_hub_t *hub;
  char job[WAGMA_API_NAME_MAX]; /* "" = every job */
  pthread_mutex_t mu;           /* q, suspended, dropped, closing */
  wg_sse_queue_t q;
  size_t limit; /* --sse-client-buffer */
  /* Bytes of the stream queued and taken so far, and the snapshot's among them,
   * [exempt_lo, exempt_hi): those not taken yet are not counted against limit. */
  uint64_t queued, taken, exempt_lo, exempt_hi;
  int suspended, dropped, closing;
  struct MHD_Connection *conn;
  int fd;
  unsigned gen;
  int (*gone)(void *user, int fd, unsigned gen);
  void *gone_user;
  int listed;
  double opened;
  wg_sse_client_t *prev, *next;
};

struct wg_hub {
  wg_coord_t *c;
  pthread_mutex_t mu; /* the list, nclients, resumes, stop */
  pthread_cond_t cv;  /* heartbeat waits, stop */
  wg_sse_client_t *clients;
  int nclients;
  struct MHD_Connection **resume; /* to resume after the lock is released */
  size_t nresume, capresume;
  int stop;
  pthread_t thread;
  int thread_up;
};

/* ---- clients ------------------------------------------------------------------------------ */

wg_sse_client_t *wg_hub_client_new(wg_hub_t *h, const char *job, struct MHD_Connection *conn,
                                   int fd, unsigned gen, int (*gone)(void *, int, unsigned),
                                   void *gone_user) {
  wg_sse_client_t *cl = calloc(1, sizeof *cl);
  if (!cl)
    return NULL;
  cl->hub = h;
  snprintf(cl->job, sizeof cl->job, "%s", job ? job : "");
  pthread_mutex_init(&cl->mu, NULL);
  cl->limit = h->c->sse_client_buffer ? h->c->sse_client_buffer : WG_SSE_CLIENT_BUFFER;
  wg_sse_queue_init(&cl->q, cl->limit);
  cl->conn = conn;
  cl->fd = fd;
  cl->gen = gen;
  cl->gone = gone;
  cl->gone_user = gone_user;
  cl->opened = wg_mono();
  return cl;
}

void wg_hub_client_free(wg_sse_client_t *cl) {
  if (!cl)
    return;
  wg_sse_queue_free(&cl->q);
  pthread_mutex_destroy(&cl->mu);
  free(cl);
}

const char *wg_hub_client_job(const wg_sse_client_t *cl) {
  return cl->job;
}

/* Under the hub's lock: remembers a connection to resume once it is released. */
static void want_resume(wg_hub_t *h, struct MHD_Connection *conn) {
  if (h->nresume == h->capresume) {
    size_t cap = h->capresume ? 2 * h->capresume : 16;
    struct MHD_Connection **nr = realloc(h->resume, cap * sizeof *nr);
    if (!nr)
      return; /* the heartbeat resumes it at the latest (it only ever adds data) */
    h->resume = nr;
    h->capresume = cap;
  }
  h->resume[h->nresume++] = conn;
}

/* Under the hub's and the client's locks: the client is behind by more than its buffer (slow:
 * counted in wagma_event_streams_dropped_total), or left, or out of memory (not counted). */
static void drop(wg_hub_t *h, wg_sse_client_t *cl, int slow, const char *why) {
  if (cl->dropped)
    return;
  cl->dropped = 1;
  if (slow)
    wg_metrics_sse(h->c->metrics, 0, 1);
  wg_logf(h->c->log, h->c->log_user, WAGMA_LOG_INFO,
          "event stream (%s) dropped after %.1f s: %s (%zu bytes queued)",
          cl->job[0] ? cl->job : "all jobs", wg_mono() - cl->opened, why,
          wg_sse_queue_pending(&cl->q));
  wg_sse_queue_free(&cl->q);
  /* libmicrohttpd fails its next send (or sees the end at once) and completes the stream. */
  if (cl->fd >= 0)
    shutdown(cl->fd, SHUT_RDWR);
  if (cl->suspended) {
    cl->suspended = 0;
    want_resume(h, cl->conn);
  }
}

/* Under the client's lock: the bytes of the snapshot not taken yet. */
static size_t exempt_left(const wg_sse_client_t *cl) {
  uint64_t from = cl->taken > cl->exempt_lo ? cl->taken : cl->exempt_lo;
  return from < cl->exempt_hi ? (size_t)(cl->exempt_hi - from) : 0;
}

/* Under the hub's lock. A snapshot (the opening bytes, or the snapshot after a reload) is
 * queued whatever its size, unless what the client has not taken yet is over its buffer
 * already (a snapshot it has not finished counts then); other bytes may make the rest (all
 * but the snapshot) at most the buffer: the queue's limit for this push says so. */
static void queue_locked(wg_hub_t *h, wg_sse_client_t *cl, const char *bytes, size_t n,
                         int snapshot) {
  pthread_mutex_lock(&cl->mu);
  if (!cl->dropped && !cl->closing) {
    size_t pending = wg_sse_queue_pending(&cl->q);
    int e;
    if (snapshot && pending > cl->limit) {
      e = WAGMA_ERANGE;
    } else {
      cl->q.limit = snapshot ? pending + n : cl->limit + exempt_left(cl);
      e = wg_sse_queue_push(&cl->q, bytes, n);
    }
    if (!e) {
      if (snapshot) {
        cl->exempt_lo = cl->queued;
        cl->exempt_hi = cl->queued + n;
      }
      cl->queued += n;
    }
    if (e == WAGMA_ERANGE)
      drop(h, cl, 1, "the client reads too slowly");
    else if (e)
      drop(h, cl, 0, "out of memory");
    else if (cl->suspended) {
      cl->suspended = 0;
      want_resume(h, cl->conn);
    }
  }
  pthread_mutex_unlock(&cl->mu);
}

void wg_hub_lock(wg_hub_t *h) {
  pthread_mutex_lock(&h->mu);
}

void wg_hub_unlock(wg_hub_t *h) {
  struct MHD_Connection *local[64], **list = local;
  size_t n = h->nresume;
  if (n > 64 && !(list = malloc(n * sizeof *list))) {
    list = local; /* resume what fits; the rest at the next heartbeat or publish */
    n = 64;
  }
  if (n > 0)
    memcpy(list, h->resume, n * sizeof *list);
  h->nresume = 0;
  pthread_mutex_unlock(&h->mu);
  for (size_t i = 0; i < n; i++)
    MHD_resume_connection(list[i]);
  if (list != local)
    free(list);
}

void wg_hub_publish_locked(wg_hub_t *h, const char *job, int all_too, const char *bytes, size_t n) {
  for (wg_sse_client_t *cl = h->clients; cl; cl = cl->next)
    if (cl->job[0] ? (job && strcmp(cl->job, job) == 0) : all_too)
      queue_locked(h, cl, bytes, n, 0);
}

void wg_hub_send_locked(wg_hub_t *h, wg_sse_client_t *cl, const char *bytes, size_t n) {
  queue_locked(h, cl, bytes, n, 1);
}

void wg_hub_foreach_locked(wg_hub_t *h, void (*fn)(void *user, wg_sse_client_t *cl), void *user) {
  for (wg_sse_client_t *cl = h->clients; cl; cl = cl->next)
    fn(user, cl);
}

int wg_hub_wants_locked(wg_hub_t *h, const char *job) {
  for (wg_sse_client_t *cl = h->clients; cl; cl = cl->next)
    if (!cl->job[0] || (job && strcmp(cl->job, job) == 0))
      return 1;
  return 0;
}

int wg_hub_add_locked(wg_hub_t *h, wg_sse_client_t *cl) {
  int max = h->c->sse_max_clients > 0 ? h->c->sse_max_clients : WG_SSE_MAX_CLIENTS;
  if (h->stop || h->nclients >= max)
    return WAGMA_EBUSY;
  cl->listed = 1;
  cl->prev = NULL;
  cl->next = h->clients;
  if (h->clients)
    h->clients->prev = cl;
  h->clients = cl;
  h->nclients++;
  wg_metrics_sse(h->c->metrics, +1, 0);
  return 0;
}

long wg_hub_read(wg_sse_client_t *cl, char *buf, size_t max) {
  long n;
  pthread_mutex_lock(&cl->mu);
  if (cl->dropped) {
    n = -2;
  } else if (wg_sse_queue_pending(&cl->q) > 0) {
    n = (long)wg_sse_queue_pop(&cl->q, buf, max);
    cl->taken += (uint64_t)n;
  } else if (cl->closing) {
    n = -1;
  } else {
    /* Nothing to send: leave libmicrohttpd's loop until a publish resumes us. */
    cl->suspended = 1;
    MHD_suspend_connection(cl->conn);
    n = 0;
  }
  pthread_mutex_unlock(&cl->mu);
  return n;
}

void wg_hub_client_done(wg_sse_client_t *cl) {
  if (!cl)
    return;
  wg_hub_t *h = cl->hub;
  pthread_mutex_lock(&h->mu);
  if (cl->listed) {
    if (cl->prev)
      cl->prev->next = cl->next;
    else
      h->clients = cl->next;
    if (cl->next)
      cl->next->prev = cl->prev;
    h->nclients--;
    wg_metrics_sse(h->c->metrics, -1, 0);
  }
  pthread_mutex_unlock(&h->mu);
  wg_hub_client_free(cl);
}

void wg_hub_close_all(wg_hub_t *h) {
  if (!h)
    return;
  pthread_mutex_lock(&h->mu);
  h->stop = 1;
  for (wg_sse_client_t *cl = h->clients; cl; cl = cl->next) {
    pthread_mutex_lock(&cl->mu);
    cl->closing = 1;
    if (cl->suspended) {
      cl->suspended = 0;
      want_resume(h, cl->conn);
    }
    pthread_mutex_unlock(&cl->mu);
  }
  pthread_cond_broadcast(&h->cv);
  wg_hub_unlock(h);
}

/* ---- the heartbeat thread ---------------------------------------------------------------------
 */

static void *heartbeat_main(void *arg) {
  wg_hub_t *h = arg;
  double period = h->c->sse_heartbeat_s > 0 ? h->c->sse_heartbeat_s : WG_SSE_HEARTBEAT_S;
  char line[64];
  pthread_mutex_lock(&h->mu);
  while (!h->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = ts.tv_nsec + (long)((period - (long)period) * 1e9);
    ts.tv_sec += (time_t)period + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) != ETIMEDOUT || h->stop)
      continue;
    size_t n = wg_sse_comment(line, sizeof line, "keepalive");
    for (wg_sse_client_t *cl = h->clients; cl; cl = cl->next) {
      pthread_mutex_lock(&cl->mu);
      int gone = cl->suspended && cl->gone && cl->gone(cl->gone_user, cl->fd, cl->gen);
      pthread_mutex_unlock(&cl->mu);
      if (gone) {
        pthread_mutex_lock(&cl->mu);
        drop(h, cl, 0, "the client left");
        pthread_mutex_unlock(&cl->mu);
        continue;
      }
      queue_locked(h, cl, line, n, 0);
    }
    wg_hub_unlock(h);
    pthread_mutex_lock(&h->mu);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

int wg_hub_create(wg_coord_t *c, wg_hub_t **out) {
  wg_hub_t *h = calloc(1, sizeof *h);
  if (!h)
    return WAGMA_ENOMEM;
  h->c = c;
  pthread_mutex_init(&h->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&h->thread, NULL, heartbeat_main, h) != 0) {
    wg_hub_destroy(h);
    return WAGMA_EIO;
  }
  h->thread_up = 1;
  *out = h;
  return 0;
}

void wg_hub_destroy(wg_hub_t *h) {
  if (!h)
    return;
  pthread_mutex_lock(&h->mu);
  h->stop = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  if (h->thread_up)
    pthread_join(h->thread, NULL);
  while (h->clients) { /* only when the HTTP server never completed them (it stopped first) */
    wg_sse_client_t *cl = h->clients;
    h->clients = cl->next;
    wg_hub_client_free(cl);
  }
  free(h->resume);
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->mu);
  free(h);
}
