/* agent/ps.c — the asgd / dc-asgd parameter-server endpoint (ps.h): the shard's server side
 * and the worker's pull / push / done.
 *
 * Owns: a listening socket on an ephemeral port, its server (peer_server.c: an accept thread
 * and one thread per accepted connection running serve_conn); the shard's slice, its optimizer (the
 * job's, on the CPU backend, over the slice), its version, dc-asgd's per-worker copies of the
 * pulled slice, the push statistics; the worker's connections to the shards of the epoch and the
 * versions of its last pull. Threads: the training thread calls set_epoch, pull, push, done and the
 * shard_* readers; the connection threads serve pulls and pushes. mu guards the epoch, the shard's
 * state, the bounds of the connections and the statistics; no socket I/O happens under it. The
 * worker's side is the training thread's only. Every wait has a deadline: the worker's its
 * exchange deadline; a connection thread's the bounds of peer_io.h (a request's first byte
 * within the idle bound, the frame bound before the first; the rest of it within the frame
 * bound; its reply within WG_PEER_REPLY_S), and keepalive ends the wait of a connection whose
 * host vanished. A connection that misses one is closed with a log line and counted (dropped);
 * its buffer, allocated at its first request, goes with its thread. close() shuts the sockets
 * down, which ends every wait, and joins the threads. */
#include "agent/ps.h"

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/peer_io.h"
#include "wagma/clock_internal.h"
#include "wagma/log_internal.h"

#define PS_MAGIC 0x53504757u /* "WGPS" little-endian */
#define PS_VERSION 1u
enum { KIND_PULL = 1, KIND_SLICE, KIND_PUSH, KIND_PUSHED, KIND_DONE, KIND_ACK, KIND_REFUSED };

typedef struct ps_header {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint64_t epoch;
  uint64_t token;
  uint64_t a, b;
  uint64_t count;
  double loss;
  uint64_t rank; /* push: the worker's rank */
} ps_header_t;
_Static_assert(sizeof(ps_header_t) == 64, "header layout");

typedef struct ps_shard_peer {
  wg_adpsgd_peer_t addr;
  int fd;
  uint64_t version; /* of my last pull from it */
} ps_shard_peer_t;

struct wg_ps {
  size_t n;
  wagma_optim_config_t optim_cfg;
  double lambda;
  int adaptive; /* dc-asgd-a: lambda / sqrt(mean square of g) per element */
  wagma_log_fn log;
  void *log_user;
  int listen_fd;
  uint16_t port;
  wg_peer_server_t *server; /* accept thread, a thread per connection: serve_conn */

  pthread_mutex_t mu;
  uint64_t epoch, token;
  int rank, nranks, shards;
  double frame_s, idle_s; /* the bounds of a served connection (peer_io.h) */
  uint64_t dropped;       /* connections closed on a missed bound, a lost peer, a bad frame */
  int stopping;
  /* shard state (rank < shards) */
  size_t first, len;
  float *slice;       /* len floats */
  float *pulled;      /* dc-asgd: nranks x len, the slice as each worker last pulled it */
  float *scratch;     /* len floats: the compensated gradient */
  float *meansq;      /* dc-asgd-a: len floats, the moving mean of g^2 */
  wagma_optim_t *opt; /* over the slice */
  uint64_t version, max_delay, pushes, max_iteration;
  double loss_ema;
  uint8_t *worker_done; /* nranks flags */
  int workers_done;

  /* worker side: training thread only */
  ps_shard_peer_t *peers; /* shards entries */
  double deadline_s;
  char last_error[384]; /* of the last failed request */
};

void wg_ps_slice(size_t n, int shards, int k, size_t *first, size_t *len) {
  size_t a = n * (size_t)k / (size_t)shards, b = n * (size_t)(k + 1) / (size_t)shards;
  *first = a;
  *len = b - a;
}

int wg_ps_shards(int want, int nranks) {
  int s = want < nranks - 1 ? want : nranks - 1;
  return s > 0 ? s : 0;
}

static void header_init(ps_header_t *h, int kind, uint64_t epoch, uint64_t token) {
  memset(h, 0, sizeof *h);
  h->magic = PS_MAGIC;
  h->version = PS_VERSION;
  h->kind = (uint16_t)kind;
  h->epoch = epoch;
  h->token = token;
}

/* ---- shard side -------------------------------------------------------------------------- */

/* Is this request for me, now? (under mu) */
static int request_ok(const wg_ps_t *p, const ps_header_t *h) {
  return h->epoch == p->epoch && h->token == p->token && p->rank >= 0 && p->rank < p->shards &&
         p->slice != NULL;
}

/* Why a request is refused (a refusal's a): the shard has not entered the request's epoch yet
 * (REFUSED_NOT_YET: the worker came out of the epoch's opening sync first and tries again), or
 * it will not serve it (REFUSED_NO). Takes mu. */
enum { REFUSED_NO = 0, REFUSED_NOT_YET = 1 };
static uint64_t refusal_code(wg_ps_t *p, const ps_header_t *h) {
  pthread_mutex_lock(&p->mu);
  int not_yet = h->epoch > p->epoch; /* set_epoch sets the epoch and the slice at once */
  pthread_mutex_unlock(&p->mu);
  return not_yet ? REFUSED_NOT_YET : REFUSED_NO;
}

/* A pull: the slice, its length and its version into out (under mu); dc-asgd keeps the
 * worker's copy. */
static int serve_pull(wg_ps_t *p, const ps_header_t *h, float *out, uint64_t *version,
                      size_t *len) {
  int ok = 0;
  pthread_mutex_lock(&p->mu);
  if (request_ok(p, h) && h->a < (uint64_t)p->nranks) {
    memcpy(out, p->slice, p->len * sizeof(float));
    if (p->pulled)
      memcpy(p->pulled + h->a * p->len, p->slice, p->len * sizeof(float));
    *version = p->version;
    *len = p->len;
    ok = 1;
  }
  pthread_mutex_unlock(&p->mu);
  return ok;
}

/* A push: applies the gradient g (len floats) at once; *delay = updates since the pull. */
static int serve_push(wg_ps_t *p, const ps_header_t *h, uint64_t worker, const float *g,
                      uint64_t *delay) {
  int ok = 0;
  pthread_mutex_lock(&p->mu);
  if (request_ok(p, h) && worker < (uint64_t)p->nranks) {
    const float *use = g;
    if (p->pulled && p->lambda > 0) { /* dc-asgd: g + lambda g (.) g (.) (w_now - w_pulled) */
      const float lam = (float)p->lambda, *back = p->pulled + worker * p->len;
      for (size_t i = 0; i < p->len; i++) {
        float l = lam;
        if (p->meansq) { /* dc-asgd-a: MeanSquare = 0.95 MeanSquare + 0.05 g^2 */
          p->meansq[i] =
              WG_PS_MEANSQ_DECAY * p->meansq[i] + (1.0f - WG_PS_MEANSQ_DECAY) * g[i] * g[i];
          l = lam / sqrtf(p->meansq[i] + WG_PS_MEANSQ_EPS);
        }
        p->scratch[i] = g[i] + l * g[i] * g[i] * (p->slice[i] - back[i]);
      }
      use = p->scratch;
    }
    wagma_optim_step(p->opt, h->b, p->slice, use);
    *delay = p->version >= h->a ? p->version - h->a : 0;
    p->version++;
    p->pushes++;
    if (*delay > p->max_delay)
      p->max_delay = *delay;
    if (h->b > p->max_iteration)
      p->max_iteration = h->b;
    if (isfinite(h->loss))
      p->loss_ema = isfinite(p->loss_ema) ? 0.98 * p->loss_ema + 0.02 * h->loss : h->loss;
    ok = 1;
  }
  pthread_mutex_unlock(&p->mu);
  return ok;
}

static int serve_done(wg_ps_t *p, const ps_header_t *h) {
  int ok = 0;
  pthread_mutex_lock(&p->mu);
  if (request_ok(p, h) && h->a < (uint64_t)p->nranks && (int)h->a >= p->shards) {
    if (!p->worker_done[h->a]) {
      p->worker_done[h->a] = 1;
      p->workers_done++;
    }
    ok = 1;
  }
  pthread_mutex_unlock(&p->mu);
  return ok;
}

/* Counts a connection that ends on a missed bound or a lost peer, and logs it (INFO for an
 * idle one: a client that waited long between requests connects afresh; WARN else). */
static void drop(wg_ps_t *p, const char *peer, int e, int why, const char *what, double bound_s,
                 int idle) {
  if (e == WAGMA_EPEER && why == 0)
    return; /* the worker closed: the normal end */
  pthread_mutex_lock(&p->mu);
  int stopping = p->stopping;
  if (!stopping)
    p->dropped++;
  pthread_mutex_unlock(&p->mu);
  if (!stopping)
    wg_peer_log_drop(p->log, p->log_user, idle ? WAGMA_LOG_INFO : WAGMA_LOG_WARN, "ps", peer, e,
                     why, what, bound_s);
}

/* A connection thread of the server (peer_server.c): pulls, pushes and done reports until the
 * worker closes, sends something else, misses a bound, or close shuts the socket down. */
static void serve_conn(void *user, int fd) {
  wg_ps_t *p = user;
  float *buf = NULL; /* a slice is at most the model: n floats, from the first request on */
  char peer[WG_PEER_NAME_MAX];
  wg_peer_name(fd, peer, sizeof peer);
  for (int n = 0;; n++) {
    ps_header_t h, out;
    pthread_mutex_lock(&p->mu);
    double frame_s = p->frame_s, wait_s = n == 0 ? p->frame_s : p->idle_s;
    pthread_mutex_unlock(&p->mu);
    double frame_deadline;
    int e = wg_peer_next_request(fd, &h, sizeof h, wait_s, frame_s, &frame_deadline), why = errno;
    if (e) {
      double bound_s;
      int idle;
      const char *what = wg_peer_missed(n, frame_deadline, wait_s, frame_s, &bound_s, &idle);
      drop(p, peer, e, why, what, bound_s, idle);
      break;
    }
    if (h.magic != PS_MAGIC || h.version != PS_VERSION || h.count > p->n) {
      drop(p, peer, WAGMA_EPROTO, 0, NULL, 0, 0);
      break;
    }
    if (!buf && !(buf = malloc(p->n * sizeof(float))))
      break;
    if (h.count && (e = wg_peer_recv(fd, buf, h.count * sizeof(float), frame_deadline))) {
      drop(p, peer, e, errno, "the floats of a request", frame_s, 0);
      break;
    }
    uint64_t x = 0;
    int ok = 0;
    size_t send_floats = 0;
    if (h.kind == KIND_PULL) {
      ok = serve_pull(p, &h, buf, &x, &send_floats);
      header_init(&out, ok ? KIND_SLICE : KIND_REFUSED, h.epoch, 0);
    } else if (h.kind == KIND_PUSH) {
      pthread_mutex_lock(&p->mu);
      int fits = h.count == p->len;
      pthread_mutex_unlock(&p->mu);
      ok = fits && serve_push(p, &h, h.rank, buf, &x);
      header_init(&out, ok ? KIND_PUSHED : KIND_REFUSED, h.epoch, 0);
    } else if (h.kind == KIND_DONE) {
      ok = serve_done(p, &h);
      header_init(&out, ok ? KIND_ACK : KIND_REFUSED, h.epoch, 0);
    } else {
      drop(p, peer, WAGMA_EPROTO, 0, NULL, 0, 0);
      break;
    }
    out.a = ok ? x : refusal_code(p, &h);
    out.count = send_floats;
    double deadline = wg_mono() + WG_PEER_REPLY_S; /* a worker that stops reading costs this
                                                       thread only */
    if ((e = wg_peer_send(fd, &out, sizeof out, deadline)) ||
        (send_floats && (e = wg_peer_send(fd, buf, send_floats * sizeof(float), deadline)))) {
      drop(p, peer, e, errno, "the worker's read of the reply", WG_PEER_REPLY_S, 0);
      break;
    }
  }
  free(buf);
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static void free_shard(wg_ps_t *p) {
  wagma_optim_destroy(p->opt);
  p->opt = NULL;
  free(p->slice);
  free(p->pulled);
  free(p->scratch);
  free(p->meansq);
  free(p->worker_done);
  p->slice = p->pulled = p->scratch = p->meansq = NULL;
  p->worker_done = NULL;
}

static void close_peers(wg_ps_t *p) {
  for (int k = 0; p->peers && k < p->shards; k++)
    if (p->peers[k].fd >= 0) {
      close(p->peers[k].fd);
      p->peers[k].fd = -1;
    }
}

int wg_ps_open(const char *bind_host, size_t n, const wagma_optim_config_t *optim, double lambda,
               wagma_log_fn log, void *log_user, wg_ps_t **out) {
  int e;
  *out = NULL;
  if (n == 0 || !optim || !(lambda >= 0))
    return WAGMA_EINVAL;
  wg_ps_t *p = calloc(1, sizeof *p);
  if (!p)
    return WAGMA_ENOMEM;
  pthread_mutex_init(&p->mu, NULL);
  p->n = n;
  p->optim_cfg = *optim;
  p->lambda = lambda;
  p->log = log;
  p->log_user = log_user;
  p->rank = -1;
  p->loss_ema = NAN;
  p->frame_s = wg_peer_frame_bound(1.0);
  p->idle_s = WG_PEER_IDLE_S;
  if ((e = wg_peer_listen(bind_host, &p->listen_fd, &p->port)))
    goto fail;
  if ((e = wg_peer_server_start(p->listen_fd, WG_PEER_MAX_CONNS, serve_conn, p, &p->server))) {
    close(p->listen_fd);
    goto fail;
  }
  *out = p;
  return 0;
fail:
  pthread_mutex_destroy(&p->mu);
  free(p);
  return e;
}

void wg_ps_close(wg_ps_t *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->stopping = 1; /* the connections that end now are not dropped ones */
  pthread_mutex_unlock(&p->mu);
  wg_peer_server_stop(p->server); /* shuts the connections down, joins their threads */
  close(p->listen_fd);
  close_peers(p);
  free(p->peers);
  free_shard(p);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

void wg_ps_set_adaptive(wg_ps_t *p, int on) {
  p->adaptive = on;
}

uint16_t wg_ps_port(const wg_ps_t *p) {
  return p->port;
}

void wg_ps_set_idle_bound(wg_ps_t *p, double idle_s) {
  pthread_mutex_lock(&p->mu);
  p->idle_s = idle_s > 0 ? idle_s : WG_PEER_IDLE_S;
  pthread_mutex_unlock(&p->mu);
}

int wg_ps_set_epoch(wg_ps_t *p, uint64_t epoch, int rank, int nranks, int shards,
                    const wg_adpsgd_peer_t *peers, uint64_t my_token, double deadline_s,
                    const float *model) {
  if (nranks < 1 || rank < 0 || rank >= nranks || shards < 0 || shards >= nranks + (nranks == 1) ||
      !peers || !model)
    return WAGMA_EINVAL;
  ps_shard_peer_t *np = shards ? calloc((size_t)shards, sizeof *np) : NULL;
  if (shards && !np)
    return WAGMA_ENOMEM;
  for (int k = 0; k < shards; k++) {
    np[k].addr = peers[k];
    np[k].fd = -1;
  }
  /* the shard's new state, built outside the lock */
  float *slice = NULL, *pulled = NULL, *scratch = NULL, *meansq = NULL;
  uint8_t *done = NULL;
  wagma_optim_t *opt = NULL;
  size_t first = 0, len = 0;
  int e = 0;
  if (rank < shards) {
    char err[200] = "";
    wg_ps_slice(p->n, shards, rank, &first, &len);
    slice = malloc((len ? len : 1) * sizeof(float));
    scratch = malloc((len ? len : 1) * sizeof(float));
    done = calloc((size_t)nranks, 1);
    if (p->lambda > 0)
      pulled = calloc((size_t)nranks * (len ? len : 1), sizeof(float));
    if (p->lambda > 0 && p->adaptive)
      meansq = calloc(len ? len : 1, sizeof(float));
    if (!slice || !scratch || !done || (p->lambda > 0 && !pulled) ||
        (p->lambda > 0 && p->adaptive && !meansq) ||
        (len && (e = wagma_optim_create(&p->optim_cfg, len, &opt, err, sizeof err)))) {
      if (err[0])
        wg_logf(p->log, p->log_user, WAGMA_LOG_ERROR, "ps shard: %s", err);
      free(slice);
      free(scratch);
      free(done);
      free(pulled);
      free(meansq);
      free(np);
      return e ? e : WAGMA_ENOMEM;
    }
    memcpy(slice, model + first, len * sizeof(float));
    if (pulled) /* until a worker pulls, its copy is the slice as the epoch began */
      for (int r = 0; r < nranks; r++)
        memcpy(pulled + (size_t)r * len, slice, len * sizeof(float));
  }
  close_peers(p);
  free(p->peers);
  p->peers = np;
  p->deadline_s = deadline_s > 0 ? deadline_s : 1.0;
  pthread_mutex_lock(&p->mu);
  free_shard(p);
  p->epoch = epoch;
  p->token = my_token;
  p->frame_s = wg_peer_frame_bound(p->deadline_s);
  p->rank = rank;
  p->nranks = nranks;
  p->shards = shards;
  p->first = first;
  p->len = len;
  p->slice = slice;
  p->pulled = pulled;
  p->scratch = scratch;
  p->meansq = meansq;
  p->opt = opt;
  p->worker_done = done;
  p->workers_done = 0;
  p->version = 0;
  p->max_iteration = 0;
  pthread_mutex_unlock(&p->mu);
  return 0;
}

/* ---- worker side ------------------------------------------------------------------------- */

/* One request to shard k and its reply header; payload out (reply count floats) when out. */
static int request(wg_ps_t *p, int k, ps_header_t *h, const float *payload, size_t floats,
                   ps_header_t *reply, float *out, size_t out_cap) {
  ps_shard_peer_t *s = &p->peers[k];
  double deadline = wg_mono() + p->deadline_s;
  int e = 0, refused = 0;
  if (s->addr.port == 0) {
    snprintf(p->last_error, sizeof p->last_error, "shard %d: no endpoint in this epoch", k);
    return WAGMA_EPEER;
  }
  if (s->fd >= 0 && wg_peer_stale(s->fd)) { /* the shard closed it (idle bound): afresh */
    close(s->fd);
    s->fd = -1;
  }
  if (s->fd < 0 && (e = wg_peer_connect(s->addr.host, s->addr.port, deadline, &s->fd)))
    goto out;
  h->token = s->addr.token;
  h->count = floats;
  if ((e = wg_peer_send(s->fd, h, sizeof *h, deadline)) ||
      (floats && (e = wg_peer_send(s->fd, payload, floats * sizeof(float), deadline))) ||
      (e = wg_peer_recv(s->fd, reply, sizeof *reply, deadline)))
    goto out;
  if (reply->magic != PS_MAGIC || reply->version != PS_VERSION || reply->count > out_cap) {
    e = WAGMA_EPROTO;
    goto out;
  }
  if (reply->kind == KIND_REFUSED) {
    /* not in the epoch yet: try again (the caller decides for how long); else it left */
    e = reply->a == REFUSED_NOT_YET ? WAGMA_EBUSY : WAGMA_EPEER;
    refused = 1;
    goto out;
  }
  if (reply->count && (e = wg_peer_recv(s->fd, out, reply->count * sizeof(float), deadline)))
    goto out;
out:
  if (e && s->fd >= 0) { /* the stream may hold half a message: start afresh next time */
    close(s->fd);
    s->fd = -1;
  }
  if (e)
    snprintf(p->last_error, sizeof p->last_error, "shard %d at %.255s:%u: %.64s", k, s->addr.host,
             (unsigned)s->addr.port,
             e == WAGMA_EBUSY ? "not in this epoch yet"
             : refused        ? "refused the request"
                              : wagma_strerror(e));
  return e;
}

const char *wg_ps_last_error(const wg_ps_t *p) {
  return p->last_error;
}

int wg_ps_pull(wg_ps_t *p, float *model) {
  int first_error = 0;
  for (int k = 0; k < p->shards; k++) {
    size_t first, len;
    ps_header_t h, r;
    wg_ps_slice(p->n, p->shards, k, &first, &len);
    header_init(&h, KIND_PULL, p->epoch, 0);
    h.a = (uint64_t)p->rank;
    int e = request(p, k, &h, NULL, 0, &r, model + first, len);
    if (e == 0 && (r.kind != KIND_SLICE || r.count != len))
      e = WAGMA_EPROTO;
    if (e == 0)
      p->peers[k].version = r.a;
    else if (!first_error)
      first_error = e;
  }
  return first_error;
}

int wg_ps_push(wg_ps_t *p, const float *grads, uint64_t iteration, double loss,
               uint64_t *max_delay) {
  int first_error = 0;
  *max_delay = 0;
  for (int k = 0; k < p->shards; k++) {
    size_t first, len;
    ps_header_t h, r;
    wg_ps_slice(p->n, p->shards, k, &first, &len);
    header_init(&h, KIND_PUSH, p->epoch, 0);
    h.a = p->peers[k].version;
    h.b = iteration;
    h.loss = loss;
    h.rank = (uint64_t)p->rank;
    int e = request(p, k, &h, grads + first, len, &r, NULL, 0);
    if (e == 0 && r.kind != KIND_PUSHED)
      e = WAGMA_EPROTO;
    if (e == 0 && r.a > *max_delay)
      *max_delay = r.a;
    if (e && !first_error)
      first_error = e;
  }
  return first_error;
}

int wg_ps_done(wg_ps_t *p) {
  int first_error = 0;
  for (int k = 0; k < p->shards; k++) {
    ps_header_t h, r;
    header_init(&h, KIND_DONE, p->epoch, 0);
    h.a = (uint64_t)p->rank;
    int e = request(p, k, &h, NULL, 0, &r, NULL, 0);
    if (e && !first_error)
      first_error = e;
  }
  return first_error;
}

void wg_ps_shard_stats(wg_ps_t *p, wg_ps_shard_stats_t *out) {
  pthread_mutex_lock(&p->mu);
  out->version = p->version;
  out->max_delay = p->max_delay;
  p->max_delay = 0;
  out->pushes = p->pushes;
  out->max_iteration = p->max_iteration;
  out->loss = p->loss_ema;
  out->workers_done = p->workers_done;
  out->dropped = p->dropped;
  pthread_mutex_unlock(&p->mu);
  out->connections = wg_peer_server_count(p->server);
}

void wg_ps_shard_slice(wg_ps_t *p, float *model) {
  pthread_mutex_lock(&p->mu);
  if (p->slice)
    memcpy(model + p->first, p->slice, p->len * sizeof(float));
  pthread_mutex_unlock(&p->mu);
}
