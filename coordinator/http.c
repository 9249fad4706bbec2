/* coordinator/http.c — the libmicrohttpd glue: which thread answers what.
 *
 * Owns, per server (one per wg_http_start): the MHD daemon, the connection front (front.c,
 * which owns the sockets), the HTTP worker pool and the readiness prober. Threads:
 *
 *   MHD's pool (WG_HTTP_IO_THREADS, epoll): parses requests (the front relays them over a
 *     socketpair per connection), accumulates bodies up to c->max_body (beyond: read and
 *     discarded, answered 413), runs every check before an endpoint (wg_handle_prepare) and
 *     answers what needs no etcd: /healthz, /metrics, every refusal. It never calls etcd, so
 *     /healthz answers whatever etcd and the other requests do.
 *   HTTP workers (c->threads): run the endpoints that call etcd. The request's connection is
 *     suspended (MHD_suspend_connection) and queued; a worker takes it, checks first that
 *     the client is still there (the front passes a client's departure on as the end of
 *     MHD's input), skips the work when not, or when it waited more than
 *     WG_HTTP_QUEUE_WAIT_S (503 busy), runs the endpoint, and resumes the connection, whose
 *     MHD thread sends the answer. Each connection has at most one request in flight, so
 *     the queue holds at most WG_HTTP_MAX_CONNECTIONS.
 *   Readiness prober and waiter: /readyz is suspended too; the prober pings etcd (one ping
 *     at a time, shared by every /readyz that arrived before it finished) and the waiter
 *     answers each with the first ping that finished after it arrived, or 503 after
 *     WG_HTTP_READY_WAIT_MS: /readyz answers within that even when etcd hangs.
 *
 *   Read cache (cache.c): the reads it can answer (jobs, a job, groups, plan, agents, a
 *     timeline) are answered on MHD's thread from memory, at once when the view is fresh
 *     enough (--read-staleness-ms), else after a sync: suspended, handed to the cache waiter
 *     thread, resumed once a sync that started after the read arrived verified the view, and
 *     answered then on MHD's thread (CTX_CACHED). Without a sync in WG_CACHE_SYNC_WAIT_S they
 *     go to the workers, whose handlers read etcd.
 *   Event streams (hub.c): opened on MHD's thread from the cache's snapshot; libmicrohttpd
 *     takes the bytes in a content reader that suspends the connection while nothing is
 *     queued, and the hub resumes it. A slow stream is dropped by the hub, never waited for.
 *     A stream of a job the view lacks waits for a sync as a read does (the cache waiter),
 *     and is opened (or refused) on MHD's thread when it resumes: never waits on MHD's thread.
 *   The web view's files are answered on MHD's thread from memory (ui.c).
 *
 * Per request, the URI log callback keeps a copy of the raw request target (MHD decodes the
 * path in place; wg_handle_prepare checks the raw bytes, see router.c). The request context
 * (conn_ctx_t) is MHD's per-request pointer: created by the URI callback, freed by the
 * completion callback; while a worker or the waiter holds it the connection is suspended, so
 * MHD neither completes nor frees it until the holder resumes it (and lets go of it then). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "coord.h"
#include "front.h"
#include "handlers.h"
#include "http.h"
#include "hub.h"
#include "metrics.h"
#include "request.h"
#include "router.h"
#include "wagma/log_internal.h"

/* CTX_CACHED: resumed by the cache waiter after a sync: answer from the read cache. */
enum { CTX_NEW = 0, CTX_WAITING, CTX_ANSWERED, CTX_GONE, CTX_CACHED };

typedef struct conn_ctx {
  char *target;        /* the raw request target, copied by on_uri before MHD decodes it */
  int started_handler; /* on_request has seen this request once */
  char *body;
  size_t len, cap;
  int too_large;
  double started;
  wg_request_t req;
  /* what happens to it */
  struct MHD_Connection *conn;
  int fd;       /* MHD's end of the front's socketpair */
  unsigned gen; /* the front's generation of that connection */
  int state;
  wg_route_t route;
  wg_response_t res;
  double queued;         /* when it was suspended and handed over */
  struct conn_ctx *next; /* in the worker queue or the readiness waiters */
  struct wg_server *srv;
} conn_ctx_t;

typedef struct ready_result {
  double done; /* wg_mono() when the ping returned; 0 = none yet */
  int e;
  int64_t rev;
  char detail[256];
} ready_result_t;

typedef struct wg_server {
  wg_coord_t *c;
  struct MHD_Daemon *mhd;
  wg_front_t *front;
  pthread_mutex_t mu; /* the queue, the waiters, the ping result, stop */
  pthread_cond_t work_cv, ping_cv, ready_cv, cache_cv;
  conn_ctx_t *qhead, *qtail;
  long qlen;
  conn_ctx_t *waiters;
  conn_ctx_t *cache_waiters; /* reads waiting for a sync of the read cache */
  int ping_wanted;
  double ping_started; /* when the ping under way started; 0 = none under way */
  ready_result_t ping;
  int stop;
  pthread_t *workers;
  int nworkers;
  pthread_t prober, waiter, cache_waiter;
  int prober_up, waiter_up, cache_waiter_up;
  struct wg_server *next_server;
} wg_server_t;

/* wg_http_stop gets only the daemon (main.c keeps that): the servers by daemon. */
static pthread_mutex_t servers_mu = PTHREAD_MUTEX_INITIALIZER;
static wg_server_t *servers;

/* ---- MHD callbacks: request context -------------------------------------------------------- */

/* MHD's URI log callback: called once per request with the raw target (path and query, not
 * yet decoded). Its result becomes the request's *con_cls. NULL (out of memory) makes
 * on_request refuse the request. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
  (void)conn;
  conn_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return NULL;
  ctx->target = strdup(uri ? uri : "");
  if (!ctx->target) {
    free(ctx);
    return NULL;
  }
  ctx->srv = cls;
  ctx->fd = -1;
  return ctx;
}

static enum MHD_Result collect_query(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value) {
  (void)kind;
  wg_request_t *req = cls;
  if (!key)
    return MHD_YES;
  if (req->nquery == WG_MAX_QUERY) {
    req->query_overflow = 1; /* never drop one silently: it could be the one that matters */
    return MHD_NO;
  }
  req->query_key[req->nquery] = key;
  req->query_value[req->nquery] = value;
  req->nquery++;
  return MHD_YES;
}

static void add_body(conn_ctx_t *ctx, const char *data, size_t n, size_t max) {
  if (ctx->too_large || ctx->len + n > max) {
    ctx->too_large = 1; /* keep reading, discard */
    return;
  }
  if (ctx->len + n + 1 > ctx->cap) {
    size_t cap = ctx->cap ? ctx->cap : 1024;
    while (cap < ctx->len + n + 1)
      cap *= 2;
    char *nb = realloc(ctx->body, cap);
    if (!nb) {
      ctx->too_large = 1; /* answered 413: we cannot hold it */
      free(ctx->body);
      ctx->body = NULL;
      ctx->len = ctx->cap = 0;
      return;
    }
    ctx->body = nb;
    ctx->cap = cap;
  }
  memcpy(ctx->body + ctx->len, data, n);
  ctx->len += n;
  ctx->body[ctx->len] = '\0';
}

/* 1 when the client is gone, as the front saw it (its input ended or failed). The end of
 * MHD's input alone does not say so: the front also ends it after a refused head, when the
 * requests before it are still to be answered. When the front cannot tell, MHD's end is
 * peeked (only peeked: MHD does not read a suspended connection). */
static int client_gone(void *user) {
  const conn_ctx_t *ctx = user;
  int g = wg_front_client_gone(ctx->srv->front, ctx->fd, ctx->gen);
  if (g >= 0 || ctx->fd < 0)
    return g > 0;
  char b;
  ssize_t n = recv(ctx->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Queues ctx's answer on its connection (MHD's thread). */
static enum MHD_Result send_answer(wg_server_t *srv, struct MHD_Connection *conn, conn_ctx_t *ctx,
                                   const char *method) {
  wg_response_t *res = &ctx->res;
  wg_metrics_http(srv->c->metrics, method, ctx->route.label ? ctx->route.label : "other",
                  res->status, wg_mono() - ctx->started);
  struct MHD_Response *mr = MHD_create_response_from_buffer(
      res->body_len, res->body ? res->body : (void *)"",
      res->body && !res->static_body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!mr) {
    wg_response_free(res);
    return MHD_NO;
  }
  res->body = NULL; /* owned by MHD now (or static) */
  res->static_body = 0;
  if (res->cache_control)
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CACHE_CONTROL, res->cache_control);
  if (ctx->route.id == WG_ROUTE_UI) { /* the web view: its own files only, never framed */
    MHD_add_response_header(mr, "Content-Security-Policy",
                            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
    MHD_add_response_header(mr, "X-Content-Type-Options", "nosniff");
  }
  if (res->content_type && res->status != 204)
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, res->content_type);
  if (res->location[0])
    MHD_add_response_header(mr, MHD_HTTP_HEADER_LOCATION, res->location);
  if (res->allow[0])
    MHD_add_response_header(mr, MHD_HTTP_HEADER_ALLOW, res->allow);
  if (res->www_authenticate)
    MHD_add_response_header(mr, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"wagma\"");
  if (res->status == 413)
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONNECTION, "close");
  if (res->retry_after > 0) {
    char ra[16];
    snprintf(ra, sizeof ra, "%d", res->retry_after);
    MHD_add_response_header(mr, MHD_HTTP_HEADER_RETRY_AFTER, ra);
  }
  enum MHD_Result ret = MHD_queue_response(conn, (unsigned)res->status, mr);
  MHD_destroy_response(mr);
  return ret;
}

/* MHD's diagnostics, into the coordinator's log. Those about TCP socket options are dropped:
 * MHD's ends are socketpair ends (the front holds the TCP sockets), where TCP_NODELAY and
 * TCP_CORK do not exist and nothing is delayed. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  wg_server_t *srv = cls;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (strstr(msg, "TCP_CORK") || strstr(msg, "TCP_NODELAY") ||
      strstr(msg, "push the data from buffers"))
    return;
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
    msg[--n] = '\0';
  wg_logf(srv->c->log, srv->c->log_user, WAGMA_LOG_DEBUG, "libmicrohttpd: %s", msg);
}

/* ---- the worker pool ------------------------------------------------------------------------ */

/* Hands a suspended request to the workers, under srv->mu. */
static void enqueue_locked(wg_server_t *srv, conn_ctx_t *ctx) {
  ctx->next = NULL;
  if (srv->qtail)
    srv->qtail->next = ctx;
  else
    srv->qhead = ctx;
  srv->qtail = ctx;
  srv->qlen++;
  wg_metrics_queue_depth(srv->c->metrics, srv->qlen);
  pthread_cond_signal(&srv->work_cv);
}

/* Hands a suspended request to the workers. Caller: MHD's thread, after suspending. */
static void enqueue(wg_server_t *srv, conn_ctx_t *ctx) {
  pthread_mutex_lock(&srv->mu);
  enqueue_locked(srv, ctx);
  pthread_mutex_unlock(&srv->mu);
}

/* ---- reads from the read cache (cache.c) ---------------------------------------------------- */

/* Hands a suspended read to the cache waiter. */
static void cache_enqueue(wg_server_t *srv, conn_ctx_t *ctx) {
  pthread_mutex_lock(&srv->mu);
  ctx->next = srv->cache_waiters;
  srv->cache_waiters = ctx;
  pthread_cond_signal(&srv->cache_cv);
  pthread_mutex_unlock(&srv->mu);
}

/* The cache waiter: for the reads that wait, one sync of the read cache that started after the
 * oldest of them arrived (wg_cache_sync; reads that arrive meanwhile share the next one); each
 * read that arrived before the sync started goes back to its MHD thread to be answered from
 * the view (CTX_CACHED). Reads whose sync did not come within WG_CACHE_SYNC_WAIT_S, or all of
 * them when the view is not valid or etcd does not answer, go to the workers, which read etcd
 * (the fallback). Never touches a connection's data: only lists, states and resumes. */
static void *cache_waiter_main(void *arg) {
  wg_server_t *srv = arg;
  pthread_mutex_lock(&srv->mu);
  while (!srv->stop) {
    if (!srv->cache_waiters) {
      pthread_cond_wait(&srv->cache_cv, &srv->mu);
      continue;
    }
    double oldest = srv->cache_waiters->queued;
    for (conn_ctx_t *w = srv->cache_waiters; w; w = w->next)
      if (w->queued < oldest)
        oldest = w->queued;
    pthread_mutex_unlock(&srv->mu);
    double v = wg_cache_sync(srv->c->cache, oldest, oldest + WG_CACHE_SYNC_WAIT_S);
    double now = wg_mono();
    pthread_mutex_lock(&srv->mu);
    conn_ctx_t *ready = NULL, **pp = &srv->cache_waiters;
    while (*pp) {
      conn_ctx_t *w = *pp;
      if (client_gone(w)) { /* nobody to answer: dropped, never worked on */
        *pp = w->next;
        w->state = CTX_GONE;
        w->next = ready;
        ready = w;
      } else if (v >= 0 && w->queued <= v) {
        *pp = w->next;
        w->state = CTX_CACHED;
        w->next = ready;
        ready = w;
      } else if (v < 0 && (now - w->queued >= WG_CACHE_SYNC_WAIT_S || w->queued <= oldest)) {
        *pp = w->next; /* no sync: etcd answers (or says why not) */
        wg_metrics_cache(srv->c->metrics, WG_METRIC_CACHE_FALLBACK);
        enqueue_locked(srv, w);
      } else {
        pp = &w->next;
      }
    }
    if (ready) {
      pthread_mutex_unlock(&srv->mu);
      while (ready) {
        conn_ctx_t *w = ready;
        ready = w->next;
        MHD_resume_connection(w->conn);
      }
      pthread_mutex_lock(&srv->mu);
    }
  }
  pthread_mutex_unlock(&srv->mu);
  return NULL;
}

/* ---- event streams (hub.c) ------------------------------------------------------------------ */

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  long n = wg_hub_read(cls, buf, max);
  return n >= 0    ? (ssize_t)n
         : n == -1 ? MHD_CONTENT_READER_END_OF_STREAM
                   : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_done(void *cls) {
  wg_hub_client_done(cls);
}

static int sse_gone(void *front, int fd, unsigned gen) {
  return wg_front_client_gone(front, fd, gen) > 0;
}

/* Accept: text/event-stream (EventSource sends it; so do wagmactl watch and the web view). */
static int wants_stream(struct MHD_Connection *conn) {
  const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Accept");
  return a && strstr(a, "text/event-stream") != NULL;
}

/* A stream asked for (after wg_handle_prepare let it through). */
static int stream_asked(struct MHD_Connection *conn, const conn_ctx_t *ctx) {
  return (ctx->route.id == WG_ROUTE_EVENTS || ctx->route.id == WG_ROUTE_JOB_EVENTS) &&
         wants_stream(conn);
}

/* How far an event stream's opening got: at arrival; after a sync of the read cache that
 * started after it arrived (the cache waiter, CTX_CACHED); without one (the cache waiter gave
 * up after WG_CACHE_SYNC_WAIT_S and a worker answered from the view, CTX_ANSWERED). */
enum { STREAM_ARRIVED = 0, STREAM_SYNCED, STREAM_UNSYNCED };

/* Opens an event stream on MHD's thread: the snapshot and the events after it come from the
 * read cache and the hub; nothing here waits. A job the view does not have at arrival may be
 * one just created that the watch has not brought yet (read-your-writes): the connection is
 * suspended and handed to the cache waiter, as a read that waits for a sync, and opened again
 * when it resumes it: 404 when the synced view still lacks the job, 503 (Retry-After: 1) when
 * no sync came. */
static enum MHD_Result open_stream(wg_server_t *srv, struct MHD_Connection *conn, conn_ctx_t *ctx,
                                   const char *method, int attempt) {
  wg_coord_t *c = srv->c;
  const char *job = ctx->route.id == WG_ROUTE_JOB_EVENTS ? ctx->route.job : "";
  wg_sse_client_t *cl =
      c->hub ? wg_hub_client_new(c->hub, job, conn, ctx->fd, ctx->gen, sse_gone, srv->front) : NULL;
  if (!cl) {
    wg_response_error(&ctx->res, 503, "unavailable", NULL, "event streams are not available");
    return send_answer(srv, conn, ctx, method);
  }
  const char *last = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Last-Event-ID");
  int st = wg_cache_subscribe(c->cache, cl, last, &ctx->res);
  if (st != 0) {
    wg_hub_client_free(cl); /* not listed */
    if (st == 404 && attempt == STREAM_ARRIVED) {
      wg_response_free(&ctx->res);
      ctx->state = CTX_WAITING;
      ctx->queued = ctx->started;
      MHD_suspend_connection(conn);
      cache_enqueue(srv, ctx);
      return MHD_YES;
    }
    if (st == 404 && attempt == STREAM_UNSYNCED) { /* cannot tell whether it exists */
      wg_response_error(&ctx->res, 503, "unavailable", NULL,
                        "the read cache could not be brought up to date; retry");
      ctx->res.retry_after = 1;
    }
    return send_answer(srv, conn, ctx, method);
  }
  struct MHD_Response *mr =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, cl, sse_done);
  if (!mr) {
    wg_hub_client_done(cl);
    return MHD_NO;
  }
  MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
  MHD_add_response_header(mr, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(mr, "X-Accel-Buffering", "no");
  wg_metrics_http(c->metrics, method, ctx->route.label ? ctx->route.label : "other", 200,
                  wg_mono() - ctx->started);
  enum MHD_Result ret = MHD_queue_response(conn, 200, mr);
  MHD_destroy_response(mr); /* MHD holds it until the stream ends (then sse_done) */
  return ret;
}

/* Runs one request off the queue, then gives the connection back to MHD. After
 * MHD_resume_connection the context belongs to MHD again (it may be freed at once). */
static void run_one(wg_server_t *srv, conn_ctx_t *ctx) {
  if (client_gone(ctx)) {
    ctx->state = CTX_GONE;
  } else if (wg_mono() - ctx->queued > WG_HTTP_QUEUE_WAIT_S) {
    wg_response_error(&ctx->res, 503, "busy", NULL,
                      "the server is busy: the request waited %.0f s for a worker; retry later",
                      WG_HTTP_QUEUE_WAIT_S);
    ctx->res.retry_after = 1;
    ctx->state = CTX_ANSWERED;
  } else {
    ctx->req.gone = client_gone;
    ctx->req.gone_user = ctx;
    wg_handle_route(srv->c, &ctx->req, &ctx->route, &ctx->res);
    ctx->state = client_gone(ctx) ? CTX_GONE : CTX_ANSWERED;
  }
  MHD_resume_connection(ctx->conn);
}

static void *worker_main(void *arg) {
  wg_server_t *srv = arg;
  /* Bulk work (etcd reads, JSON of whole pages) yields the CPU to the front and MHD's threads,
   * so probes and refusals are answered while the workers are saturated: a nicer thread
   * (Linux sets the nice value per thread). Best effort. */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), WG_HTTP_WORKER_NICE);
  pthread_mutex_lock(&srv->mu);
  for (;;) {
    while (!srv->qhead && !srv->stop)
      pthread_cond_wait(&srv->work_cv, &srv->mu);
    if (srv->stop)
      break;
    conn_ctx_t *ctx = srv->qhead;
    srv->qhead = ctx->next;
    if (!srv->qhead)
      srv->qtail = NULL;
    srv->qlen--;
    wg_metrics_queue_depth(srv->c->metrics, srv->qlen);
    pthread_mutex_unlock(&srv->mu);
    run_one(srv, ctx);
    pthread_mutex_lock(&srv->mu);
  }
  pthread_mutex_unlock(&srv->mu);
  return NULL;
}

/* ---- readiness ------------------------------------------------------------------------------ */

static void *prober_main(void *arg) {
  wg_server_t *srv = arg;
  pthread_mutex_lock(&srv->mu);
  for (;;) {
    while (!srv->ping_wanted && !srv->stop)
      pthread_cond_wait(&srv->ping_cv, &srv->mu);
    if (srv->stop)
      break;
    srv->ping_wanted = 0;
    srv->ping_started = wg_mono();
    pthread_mutex_unlock(&srv->mu);
    int64_t rev = 0;
    int e = wagma_etcd_ping(srv->c->etcd, &rev);
    ready_result_t r = {.done = wg_mono(), .e = e, .rev = rev};
    if (e) /* the detail is this thread's: copy it here */
      snprintf(r.detail, sizeof r.detail, "%s", wagma_etcd_errmsg(srv->c->etcd));
    pthread_mutex_lock(&srv->mu);
    srv->ping = r;
    srv->ping_started = 0;
    pthread_cond_signal(&srv->ready_cv);
  }
  pthread_mutex_unlock(&srv->mu);
  return NULL;
}

/* Answers the /readyz waiters: each with the first ping that returned after it came, or 503
 * once it waited WG_HTTP_READY_WAIT_MS, or at once when the ping under way has already been
 * waiting that long for etcd (etcd hangs: every probe would only wait out the deadline). */
static void *waiter_main(void *arg) {
  wg_server_t *srv = arg;
  const double wait_s = WG_HTTP_READY_WAIT_MS / 1000.0;
  pthread_mutex_lock(&srv->mu);
  while (!srv->stop) {
    double now = wg_mono(), next = now + 1.0;
    conn_ctx_t *done = NULL, **pp = &srv->waiters;
    while (*pp) {
      conn_ctx_t *w = *pp;
      if (srv->ping.done >= w->queued) {
        wg_h_readyz_answer(srv->c, srv->ping.e, srv->ping.rev, srv->ping.detail, &w->res);
      } else if (now - w->queued >= wait_s ||
                 (srv->ping_started > 0 && now - srv->ping_started >= wait_s)) {
        wg_response_error(&w->res, 503, "unavailable", NULL, "etcd did not answer within %d ms",
                          WG_HTTP_READY_WAIT_MS);
      } else {
        if (w->queued + wait_s < next)
          next = w->queued + wait_s;
        pp = &w->next;
        continue;
      }
      *pp = w->next;
      w->state = CTX_ANSWERED;
      w->next = done;
      done = w;
    }
    if (done) { /* resumed outside the lock: MHD takes its own */
      pthread_mutex_unlock(&srv->mu);
      while (done) {
        conn_ctx_t *w = done;
        done = w->next;
        MHD_resume_connection(w->conn);
      }
      pthread_mutex_lock(&srv->mu);
      continue;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double delay = next - wg_mono();
    if (delay < 0.0005)
      delay = 0.0005;
    long ns = ts.tv_nsec + (long)(delay * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&srv->ready_cv, &srv->mu, &ts);
  }
  pthread_mutex_unlock(&srv->mu);
  return NULL;
}

static void ready_enqueue(wg_server_t *srv, conn_ctx_t *ctx) {
  pthread_mutex_lock(&srv->mu);
  ctx->next = srv->waiters;
  srv->waiters = ctx;
  srv->ping_wanted = 1;
  pthread_cond_signal(&srv->ping_cv);
  pthread_cond_signal(&srv->ready_cv);
  pthread_mutex_unlock(&srv->mu);
}

/* ---- the access handler ------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  wg_server_t *srv = cls;
  wg_coord_t *c = srv->c;
  conn_ctx_t *ctx = *con_cls;
  (void)version;
  if (!ctx)
    return MHD_NO; /* on_uri ran out of memory: without the raw target, refuse */
  if (!ctx->started_handler) {
    ctx->started_handler = 1;
    ctx->started = wg_mono();
    ctx->conn = conn;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    ctx->fd = ci ? ci->connect_fd : -1;
    ctx->gen = wg_front_conn_gen(srv->front, ctx->fd);
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > c->max_body)
      ctx->too_large = 1;
    ctx->req.target = ctx->target;
    ctx->req.target_len = strlen(ctx->target);
    return MHD_YES;
  }
  if (*upload_data_size) {
    add_body(ctx, upload_data, *upload_data_size, c->max_body);
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (ctx->state == CTX_ANSWERED) {
    if (stream_asked(conn, ctx) && ctx->res.status != 503) { /* a stream that got no sync */
      wg_response_free(&ctx->res);
      return open_stream(srv, conn, ctx, method, STREAM_UNSYNCED);
    }
    return send_answer(srv, conn, ctx, method);
  }
  if (ctx->state == CTX_GONE) {
    wg_metrics_abandoned(c->metrics);
    return MHD_NO; /* nobody to answer: close */
  }
  if (ctx->state == CTX_WAITING)
    return MHD_YES;               /* not resumed yet (MHD should not call then) */
  if (ctx->state == CTX_CACHED) { /* a sync verified the view after this read arrived */
    if (stream_asked(conn, ctx))
      return open_stream(srv, conn, ctx, method, STREAM_SYNCED);
    if (wg_cache_serve(c->cache, &ctx->req, &ctx->route, &ctx->res) == 0) {
      wg_metrics_cache(c->metrics, WG_METRIC_CACHE_WAIT);
      ctx->state = CTX_ANSWERED;
      return send_answer(srv, conn, ctx, method);
    }
    wg_metrics_cache(c->metrics, WG_METRIC_CACHE_FALLBACK);
    ctx->state = CTX_WAITING;
    ctx->queued = wg_mono();
    MHD_suspend_connection(conn);
    enqueue(srv, ctx);
    return MHD_YES;
  }
  wg_request_t *req = &ctx->req;
  req->method = method;
  req->path = url;
  req->content_type = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
  req->authorization = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
  req->body = ctx->body;
  req->body_len = ctx->len;
  req->body_too_large = ctx->too_large;
  req->max_body = c->max_body;
  MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, collect_query, req);

  if (wg_handle_prepare(c, req, &ctx->route, &ctx->res) == 0 &&
      (ctx->route.id == WG_ROUTE_EVENTS || ctx->route.id == WG_ROUTE_JOB_EVENTS) &&
      wants_stream(conn))
    return open_stream(srv, conn, ctx, method, STREAM_ARRIVED);
  if (ctx->res.status || !wg_route_uses_etcd(ctx->route.id)) {
    if (ctx->res.status == 0) /* /healthz, /metrics, the web view: no etcd, answered here */
      wg_handle_route(c, req, &ctx->route, &ctx->res);
    return send_answer(srv, conn, ctx, method);
  }
  /* A read the cache can answer: at once when it is fresh enough (--read-staleness-ms), else
   * after a sync (the cache waiter). */
  if (c->cache && wg_cache_route(ctx->route.id)) {
    if (wg_cache_fresh(c->cache, ctx->started) &&
        wg_cache_serve(c->cache, req, &ctx->route, &ctx->res) == 0) {
      wg_metrics_cache(c->metrics, WG_METRIC_CACHE_HIT);
      ctx->state = CTX_ANSWERED;
      return send_answer(srv, conn, ctx, method);
    }
    ctx->state = CTX_WAITING;
    ctx->queued = ctx->started;
    MHD_suspend_connection(conn);
    cache_enqueue(srv, ctx);
    return MHD_YES;
  }
  /* An etcd endpoint: off MHD's thread. */
  ctx->state = CTX_WAITING;
  ctx->queued = wg_mono();
  MHD_suspend_connection(conn);
  if (ctx->route.id == WG_ROUTE_READYZ)
    ready_enqueue(srv, ctx);
  else
    enqueue(srv, ctx);
  return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)conn;
  (void)toe;
  conn_ctx_t *ctx = *con_cls;
  if (ctx) {
    wg_front_mhd_done(ctx->srv->front, ctx->fd, ctx->gen); /* the front may answer reads again */
    wg_response_free(&ctx->res);
    free(ctx->target);
    free(ctx->body);
    free(ctx);
  }
  *con_cls = NULL;
}

/* Binds and listens on c->listen_host:c->listen_port (port 0: any free one, written back to
 * c->listen_port). Ownership: *fd is the caller's until wg_http_start takes it. */
int wg_http_bind(wg_coord_t *c, int *fd_out) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  int one = 1, fd = -1;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)c->listen_port);
  if (inet_pton(AF_INET, c->listen_host, &sa.sin_addr) != 1) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "listen: %s is not an IPv4 address",
            c->listen_host);
    return WAGMA_EINVAL;
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "cannot listen on %s:%d: %s", c->listen_host,
            c->listen_port, strerror(errno));
    if (fd >= 0)
      close(fd);
    return WAGMA_EIO;
  }
  c->listen_port = ntohs(sa.sin_port);
  *fd_out = fd;
  return 0;
}

/* Stops what srv started, in the order that leaves no request half-held: the front (no new
 * requests; every client connection closed, so MHD's ends read their end of input), the
 * workers and readiness threads (the queued and waiting requests are resumed as gone), then
 * MHD; the front's memory last (the workers and MHD's completion callbacks read it). */
static void server_stop(wg_server_t *srv) {
  wg_hub_close_all(srv->c->hub); /* every stream ends; none calls into the front any more */
  wg_front_stop(srv->front);
  pthread_mutex_lock(&srv->mu);
  srv->stop = 1;
  pthread_cond_broadcast(&srv->work_cv);
  pthread_cond_broadcast(&srv->ping_cv);
  pthread_cond_broadcast(&srv->ready_cv);
  pthread_cond_broadcast(&srv->cache_cv);
  pthread_mutex_unlock(&srv->mu);
  for (int i = 0; i < srv->nworkers; i++)
    pthread_join(srv->workers[i], NULL);
  if (srv->prober_up)
    pthread_join(srv->prober, NULL);
  if (srv->waiter_up)
    pthread_join(srv->waiter, NULL);
  if (srv->cache_waiter_up)
    pthread_join(srv->cache_waiter, NULL);
  conn_ctx_t *lists[3] = {srv->qhead, srv->waiters, srv->cache_waiters};
  srv->qhead = srv->qtail = srv->waiters = srv->cache_waiters = NULL;
  for (int l = 0; l < 3; l++) {
    while (lists[l]) {
      conn_ctx_t *ctx = lists[l];
      lists[l] = ctx->next;
      ctx->state = CTX_GONE;
      MHD_resume_connection(ctx->conn);
    }
  }
  if (srv->mhd)
    MHD_stop_daemon(srv->mhd); /* its completion callbacks still ask the front */
  wg_front_free(srv->front);
  pthread_cond_destroy(&srv->work_cv);
  pthread_cond_destroy(&srv->ping_cv);
  pthread_cond_destroy(&srv->ready_cv);
  pthread_cond_destroy(&srv->cache_cv);
  pthread_mutex_destroy(&srv->mu);
  free(srv->workers);
  free(srv);
}

/* Starts the server on a socket from wg_http_bind (taken over: closed by wg_http_stop, or
 * here on failure). Ownership: the caller stops it with wg_http_stop(*out). */
int wg_http_start(wg_coord_t *c, int fd, struct MHD_Daemon **out) {
  wg_server_t *srv = calloc(1, sizeof *srv);
  if (!srv) {
    close(fd);
    return WAGMA_ENOMEM;
  }
  srv->c = c;
  pthread_mutex_init(&srv->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&srv->work_cv, NULL);
  pthread_cond_init(&srv->ping_cv, NULL);
  pthread_cond_init(&srv->ready_cv, &ca);
  pthread_cond_init(&srv->cache_cv, NULL);
  pthread_condattr_destroy(&ca);
  srv->mhd = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME |
          MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC,
      0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, srv,
      MHD_OPTION_THREAD_POOL_SIZE, (unsigned)WG_HTTP_IO_THREADS, MHD_OPTION_URI_LOG_CALLBACK,
      on_uri, srv, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
      /* The front enforces the limits and timeouts; these are MHD's backstops. */
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)(2 * WG_HTTP_MAX_CONNECTIONS),
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(2 * WG_HTTP_MAX_PER_IP),
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(2 * WG_HTTP_IDLE_TIMEOUT_S),
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(4 * WG_HTTP_MAX_HEAD), MHD_OPTION_END);
  int e = srv->mhd ? 0 : WAGMA_EIO;
  srv->nworkers = c->threads > 0 ? c->threads : 4;
  srv->workers = e ? NULL : calloc((size_t)srv->nworkers, sizeof *srv->workers);
  if (!e && !srv->workers)
    e = WAGMA_ENOMEM;
  for (int i = 0; !e && i < srv->nworkers; i++)
    if (pthread_create(&srv->workers[i], NULL, worker_main, srv) != 0) {
      srv->nworkers = i;
      e = WAGMA_EIO;
    }
  if (!e && pthread_create(&srv->prober, NULL, prober_main, srv) != 0)
    e = WAGMA_EIO;
  srv->prober_up = !e;
  if (!e && pthread_create(&srv->waiter, NULL, waiter_main, srv) != 0)
    e = WAGMA_EIO;
  srv->waiter_up = !e;
  if (!e && pthread_create(&srv->cache_waiter, NULL, cache_waiter_main, srv) != 0)
    e = WAGMA_EIO;
  srv->cache_waiter_up = !e;
  if (!e && (e = wg_front_start(c, fd, srv->mhd, &srv->front)) == 0)
    fd = -1; /* the front's now */
  if (e) {
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "cannot start the HTTP server: %s",
            wagma_strerror(e));
    if (!srv->workers)
      srv->nworkers = 0;
    if (fd >= 0)
      close(fd);
    server_stop(srv);
    return WAGMA_EIO;
  }
  pthread_mutex_lock(&servers_mu);
  srv->next_server = servers;
  servers = srv;
  pthread_mutex_unlock(&servers_mu);
  *out = srv->mhd;
  return 0;
}

void wg_http_stop(struct MHD_Daemon *d) {
  if (!d)
    return;
  wg_server_t *srv = NULL;
  pthread_mutex_lock(&servers_mu);
  for (wg_server_t **pp = &servers; *pp; pp = &(*pp)->next_server)
    if ((*pp)->mhd == d) {
      srv = *pp;
      *pp = srv->next_server;
      break;
    }
  pthread_mutex_unlock(&servers_mu);
  if (srv)
    server_stop(srv);
  else
    MHD_stop_daemon(d);
}
