/* agent/adpsgd.c — the AD-PSGD endpoint (adpsgd.h): pairwise model averaging between an active
 * and a passive worker over TCP.
 *
 * Owns: a listening socket on an ephemeral port, its server (peer_server.c: an accept thread
 * and one thread per accepted connection running serve_conn, the passive side: read a
 * request, average against the snapshot, answer), the
 * snapshot and pending correction (count floats each), and the active side's connections to
 * the passives of the epoch (used by the training thread only).
 * Threads: the training thread calls set_epoch, publish and average; the accept thread and the
 * connection threads serve. mu guards the epoch, rank, token, snapshot, pending, the bounds of
 * the connections and counters; no socket I/O happens under it, so a stopped or slow active
 * stalls only its own connection thread. Every socket operation has a deadline (poll): the
 * active side's its exchange deadline; a connection thread's the bounds of peer_io.h (a
 * request's first byte within the idle bound, the frame bound before the first; the rest of
 * the request within the frame bound; its reply within WG_PEER_REPLY_S), and keepalive ends
 * the wait of a connection whose host vanished. A connection that misses one is closed with a
 * log line and counted (dropped); its buffers, allocated at its first request, go with its
 * thread. close() shuts every socket down and joins every thread. */
#include "agent/adpsgd.h"
#include "agent/peer_io.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "wagma/clock_internal.h"
#include "wagma/log_internal.h"

#define GOSSIP_MAGIC 0x44414757u /* "WGAD" little-endian */
#define GOSSIP_VERSION 1u
enum { KIND_REQUEST = 1, KIND_REPLY = 2, KIND_REFUSED = 3 };
/* A request for an epoch this passive has not entered yet waits this long for set_epoch: the
 * actives of a new epoch start asking as soon as their own endpoint exchange returns, a few
 * microseconds to milliseconds before every passive has set its epoch; refused, the active
 * would skip that passive for its whole back-off (seconds). */
#define EPOCH_WAIT_S 1.0

typedef struct gossip_header {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint64_t epoch;
  uint64_t token;
  uint64_t count;
  uint64_t reserved;
} gossip_header_t;
_Static_assert(sizeof(gossip_header_t) == 40, "header layout");

typedef struct out_peer {
  wg_adpsgd_peer_t addr;
  int fd;             /* -1 = not connected */
  double suspect_end; /* skipped until then (wg_mono) */
  /* a request whose reply missed its deadline: the passive may still answer (and has then
   * taken its half), so the reply is collected later and the active's half applied then */
  int late;
  float *sent; /* count floats: the model that request carried (allocated on first need) */
} out_peer_t;

struct wg_adpsgd {
  size_t count;
  wagma_log_fn log;
  void *log_user;
  int listen_fd;
  uint16_t port;
  wg_peer_server_t *server; /* accept thread, a thread per connection: serve_conn */

  pthread_mutex_t mu;
  pthread_cond_t epoch_cv; /* set_epoch and close broadcast it (CLOCK_MONOTONIC) */
  int stopping;
  uint64_t epoch;
  int rank, nranks;
  uint64_t token;
  float *snapshot, *pending;
  int pending_n;
  double frame_s, idle_s; /* the bounds of a served connection (peer_io.h) */
  wg_adpsgd_counters_t counters;

  /* active side: training thread only */
  out_peer_t *peers;
  int *candidates; /* nranks entries: the passives an averaging may pick */
  double deadline_s, backoff_s;
  float *reply;
};

static void header_init(gossip_header_t *h, int kind, uint64_t epoch, uint64_t token,
                        uint64_t count) {
  memset(h, 0, sizeof *h);
  h->magic = GOSSIP_MAGIC;
  h->version = GOSSIP_VERSION;
  h->kind = (uint16_t)kind;
  h->epoch = epoch;
  h->token = token;
  h->count = count;
}

/* ---- passive side: connection threads ---------------------------------------------------- */

/* Averages the request w (count floats) into the snapshot under mu; reply gets the snapshot
 * as it was. 0, or WAGMA_EEPOCH / WAGMA_EPERM when the request is refused. */
static int serve_average(wg_adpsgd_t *g, const gossip_header_t *h, const float *w, float *reply) {
  int e = 0;
  pthread_mutex_lock(&g->mu);
  if (h->epoch > g->epoch && !g->stopping) { /* the active entered it first: wait (bounded) */
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)EPOCH_WAIT_S;
    until.tv_nsec += (long)((EPOCH_WAIT_S - (double)(time_t)EPOCH_WAIT_S) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    while (h->epoch > g->epoch && !g->stopping)
      if (pthread_cond_timedwait(&g->epoch_cv, &g->mu, &until) != 0)
        break;
  }
  if (h->epoch != g->epoch || g->rank < 0 || wg_adpsgd_rank_active(g->rank)) {
    e = WAGMA_EEPOCH;
  } else if (h->token != g->token) {
    e = WAGMA_EPERM;
  } else {
    float *s = g->snapshot, *pend = g->pending;
    for (size_t i = 0; i < g->count; i++) {
      float half = 0.5f * (w[i] - s[i]);
      reply[i] = s[i];
      s[i] += half;
      pend[i] += half;
    }
    g->pending_n++;
    g->counters.served++;
  }
  if (e)
    g->counters.refused++;
  pthread_mutex_unlock(&g->mu);
  return e;
}

/* Counts a connection that ends on a missed bound or a lost peer, and logs it (INFO for an
 * idle one: a client that waited long between requests connects afresh; WARN else). */
static void drop(wg_adpsgd_t *g, const char *peer, int e, int why, const char *what, double bound_s,
                 int idle) {
  if (e == WAGMA_EPEER && why == 0)
    return; /* the active closed: the normal end */
  pthread_mutex_lock(&g->mu);
  int stopping = g->stopping;
  if (!stopping)
    g->counters.dropped++;
  pthread_mutex_unlock(&g->mu);
  if (!stopping)
    wg_peer_log_drop(g->log, g->log_user, idle ? WAGMA_LOG_INFO : WAGMA_LOG_WARN, "adpsgd", peer, e,
                     why, what, bound_s);
}

/* A connection thread of the server (peer_server.c): requests until the active closes, sends
 * something else, misses a bound, or close shuts the socket down. */
static void serve_conn(void *user, int fd) {
  wg_adpsgd_t *g = user;
  float *w = NULL, *reply = NULL; /* count floats each, from the first request on */
  char peer[WG_PEER_NAME_MAX];
  wg_peer_name(fd, peer, sizeof peer);
  for (int n = 0;; n++) {
    gossip_header_t h, out;
    pthread_mutex_lock(&g->mu);
    double frame_s = g->frame_s, wait_s = n == 0 ? g->frame_s : g->idle_s;
    pthread_mutex_unlock(&g->mu);
    double frame_deadline;
    int e = wg_peer_next_request(fd, &h, sizeof h, wait_s, frame_s, &frame_deadline), why = errno;
    if (e) {
      double bound_s;
      int idle;
      const char *what = wg_peer_missed(n, frame_deadline, wait_s, frame_s, &bound_s, &idle);
      drop(g, peer, e, why, what, bound_s, idle);
      break;
    }
    if (h.magic != GOSSIP_MAGIC || h.version != GOSSIP_VERSION || h.kind != KIND_REQUEST ||
        h.count != g->count) { /* not our protocol, or another model: drop the connection */
      drop(g, peer, WAGMA_EPROTO, 0, NULL, 0, 0);
      break;
    }
    if (!w &&
        (!(w = malloc(g->count * sizeof(float))) || !(reply = malloc(g->count * sizeof(float)))))
      break;
    if ((e = wg_peer_recv(fd, w, g->count * sizeof(float), frame_deadline))) {
      drop(g, peer, e, errno, "the model of a request", frame_s, 0);
      break;
    }
    int refused = serve_average(g, &h, w, reply);
    header_init(&out, refused ? KIND_REFUSED : KIND_REPLY, h.epoch, 0, refused ? 0 : g->count);
    double send_deadline = wg_mono() + WG_PEER_REPLY_S;
    if ((e = wg_peer_send(fd, &out, sizeof out, send_deadline)) ||
        (!refused && (e = wg_peer_send(fd, reply, g->count * sizeof(float), send_deadline)))) {
      drop(g, peer, e, errno, "the active's read of the reply", WG_PEER_REPLY_S, 0);
      break;
    }
  }
  free(w);
  free(reply);
}

/* ---- lifecycle --------------------------------------------------------------------------- */

int wg_adpsgd_open(const char *bind_host, size_t count, wagma_log_fn log, void *log_user,
                   wg_adpsgd_t **out) {
  int e = WAGMA_ENOMEM;
  *out = NULL;
  if (count == 0)
    return WAGMA_EINVAL;
  wg_adpsgd_t *g = calloc(1, sizeof *g);
  if (!g)
    return WAGMA_ENOMEM;
  pthread_mutex_init(&g->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->epoch_cv, &ca);
  pthread_condattr_destroy(&ca);
  g->count = count;
  g->log = log;
  g->log_user = log_user;
  g->listen_fd = -1;
  g->rank = -1;
  g->frame_s = wg_peer_frame_bound(1.0);
  g->idle_s = WG_PEER_IDLE_S;
  g->snapshot = calloc(count, sizeof(float));
  g->pending = calloc(count, sizeof(float));
  g->reply = malloc(count * sizeof(float));
  if (!g->snapshot || !g->pending || !g->reply)
    goto fail;
  if ((e = wg_peer_listen(bind_host, &g->listen_fd, &g->port))) {
    wg_logf(log, log_user, WAGMA_LOG_ERROR, "adpsgd: cannot listen on %s: %s",
            bind_host ? bind_host : "*", strerror(errno));
    goto fail;
  }
  if ((e = wg_peer_server_start(g->listen_fd, WG_PEER_MAX_CONNS, serve_conn, g, &g->server)))
    goto fail;
  *out = g;
  return 0;
fail:
  if (g->listen_fd >= 0)
    close(g->listen_fd);
  free(g->snapshot);
  free(g->pending);
  free(g->reply);
  pthread_cond_destroy(&g->epoch_cv);
  pthread_mutex_destroy(&g->mu);
  free(g);
  return e;
}

static void close_peers(wg_adpsgd_t *g) {
  for (int i = 0; g->peers && i < g->nranks; i++) {
    if (g->peers[i].fd >= 0) {
      close(g->peers[i].fd);
      g->peers[i].fd = -1;
    }
    free(g->peers[i].sent);
    g->peers[i].sent = NULL;
    g->peers[i].late = 0;
  }
}

void wg_adpsgd_close(wg_adpsgd_t *g) {
  if (!g)
    return;
  pthread_mutex_lock(&g->mu);
  g->stopping = 1;
  pthread_cond_broadcast(&g->epoch_cv); /* a request waiting for an epoch gives up */
  pthread_mutex_unlock(&g->mu);
  wg_peer_server_stop(g->server); /* shuts the connections down, joins their threads */
  close(g->listen_fd);
  close_peers(g);
  free(g->peers);
  free(g->candidates);
  free(g->snapshot);
  free(g->pending);
  free(g->reply);
  pthread_cond_destroy(&g->epoch_cv);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

uint16_t wg_adpsgd_port(const wg_adpsgd_t *g) {
  return g->port;
}

void wg_adpsgd_set_idle_bound(wg_adpsgd_t *g, double idle_s) {
  pthread_mutex_lock(&g->mu);
  g->idle_s = idle_s > 0 ? idle_s : WG_PEER_IDLE_S;
  pthread_mutex_unlock(&g->mu);
}

int wg_adpsgd_set_epoch(wg_adpsgd_t *g, uint64_t epoch, int rank, int nranks,
                        const wg_adpsgd_peer_t *peers, uint64_t my_token, double deadline_s,
                        double backoff_s, const float *model) {
  if (nranks < 1 || rank < 0 || rank >= nranks || !peers || !model)
    return WAGMA_EINVAL;
  out_peer_t *np = calloc((size_t)nranks, sizeof *np);
  int *cand = calloc((size_t)nranks, sizeof *cand);
  if (!np || !cand) {
    free(np);
    free(cand);
    return WAGMA_ENOMEM;
  }
  for (int i = 0; i < nranks; i++) {
    np[i].addr = peers[i];
    np[i].addr.host[sizeof np[i].addr.host - 1] = '\0';
    np[i].fd = -1;
  }
  close_peers(g);
  free(g->peers);
  free(g->candidates);
  g->peers = np;
  g->candidates = cand;
  g->deadline_s = deadline_s > 0 ? deadline_s : 1.0;
  g->backoff_s = backoff_s > 0 ? backoff_s : 5.0;
  pthread_mutex_lock(&g->mu);
  g->epoch = epoch;
  g->rank = rank;
  g->nranks = nranks;
  g->token = my_token;
  g->frame_s = wg_peer_frame_bound(g->deadline_s);
  memcpy(g->snapshot, model, g->count * sizeof(float));
  memset(g->pending, 0, g->count * sizeof(float));
  g->pending_n = 0;
  pthread_cond_broadcast(&g->epoch_cv);
  pthread_mutex_unlock(&g->mu);
  return 0;
}

int wg_adpsgd_publish(wg_adpsgd_t *g, float *model) {
  pthread_mutex_lock(&g->mu);
  int n = g->pending_n;
  if (n) {
    for (size_t i = 0; i < g->count; i++)
      model[i] += g->pending[i];
    memset(g->pending, 0, g->count * sizeof(float));
    g->pending_n = 0;
  }
  memcpy(g->snapshot, model, g->count * sizeof(float));
  pthread_mutex_unlock(&g->mu);
  return n;
}

/* ---- active side ------------------------------------------------------------------------- */

/* One exchange with peer p: 0 with the peer's snapshot in reply, or why not. */
/* Reads a reply (header, then count floats into reply) before deadline. */
static int read_reply(wg_adpsgd_t *g, out_peer_t *p, uint64_t epoch, float *reply,
                      double deadline) {
  gossip_header_t h;
  int e = wg_peer_recv(p->fd, &h, sizeof h, deadline);
  if (e)
    return e;
  if (h.magic != GOSSIP_MAGIC || h.version != GOSSIP_VERSION || h.epoch != epoch)
    return WAGMA_EPROTO;
  if (h.kind == KIND_REFUSED)
    return WAGMA_EPEER;
  if (h.kind != KIND_REPLY || h.count != g->count)
    return WAGMA_EPROTO;
  return wg_peer_recv(p->fd, reply, g->count * sizeof(float), deadline);
}

/* One exchange with peer p: 0 with the peer's snapshot in reply, or why not; *sent = 1 when
 * the whole request went out (then the passive may apply it even if its reply is late). */
static int exchange(wg_adpsgd_t *g, out_peer_t *p, uint64_t epoch, const float *model, float *reply,
                    int *sent) {
  double deadline = wg_mono() + g->deadline_s;
  gossip_header_t h;
  int e = 0;
  *sent = 0;
  if (p->fd >= 0 && wg_peer_stale(p->fd)) { /* the passive closed it (idle bound): afresh */
    close(p->fd);
    p->fd = -1;
  }
  if (p->fd < 0 && (e = wg_peer_connect(p->addr.host, p->addr.port, deadline, &p->fd)))
    return e;
  header_init(&h, KIND_REQUEST, epoch, p->addr.token, g->count);
  if ((e = wg_peer_send(p->fd, &h, sizeof h, deadline)) ||
      (e = wg_peer_send(p->fd, model, g->count * sizeof(float), deadline)))
    return e;
  *sent = 1;
  return read_reply(g, p, epoch, reply, deadline);
}

/* Late replies: for each peer with a request outstanding whose reply has arrived by now,
 * model += (s - w_sent) / 2, the active's half of that averaging (the passive took its half
 * when it answered), so the sum of the models stays conserved. A peer that closed the
 * connection answered nothing (or died: its model is gone with it). */
static void collect_late(wg_adpsgd_t *g, float *model, uint64_t epoch, int nranks) {
  for (int r = 1; r < nranks; r += 2) {
    out_peer_t *p = &g->peers[r];
    if (!p->late)
      continue;
    struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
    if (poll(&pfd, 1, 0) != 1)
      continue; /* nothing yet */
    /* the passive writes a reply whole: once it starts arriving the rest follows */
    int e = read_reply(g, p, epoch, g->reply, wg_mono() + g->deadline_s);
    if (e == 0) {
      for (size_t i = 0; i < g->count; i++)
        model[i] += 0.5f * (g->reply[i] - p->sent[i]);
      pthread_mutex_lock(&g->mu);
      g->counters.averaged++;
      g->counters.late++;
      pthread_mutex_unlock(&g->mu);
    }
    p->late = 0;
    if (e) {
      close(p->fd);
      p->fd = -1;
    }
  }
}

int wg_adpsgd_average(wg_adpsgd_t *g, float *model, wagma_rng_t *rng, int *peer) {
  int nc = 0;
  double now = wg_mono();
  pthread_mutex_lock(&g->mu);
  uint64_t epoch = g->epoch;
  int rank = g->rank, nranks = g->nranks;
  pthread_mutex_unlock(&g->mu);
  if (peer)
    *peer = -1;
  if (rank < 0 || !g->peers)
    return WAGMA_ENOTFOUND;
  collect_late(g, model, epoch, nranks);
  for (int r = 1; r < nranks; r += 2) /* the passives not suspect */
    if (r != rank && g->peers[r].addr.port != 0 && g->peers[r].suspect_end <= now &&
        !g->peers[r].late)
      g->candidates[nc++] = r;
  if (nc == 0) {
    pthread_mutex_lock(&g->mu);
    g->counters.skipped++;
    pthread_mutex_unlock(&g->mu);
    return WAGMA_ENOTFOUND;
  }
  int pick = g->candidates[wagma_rng_below(rng, (uint64_t)nc)];
  out_peer_t *p = &g->peers[pick];
  int sent = 0;
  int e = exchange(g, p, epoch, model, g->reply, &sent);
  if (e == 0) {
    for (size_t i = 0; i < g->count; i++)
      model[i] = 0.5f * (model[i] + g->reply[i]);
  } else {
    if (e == WAGMA_ETIMEDOUT && sent && (p->sent || (p->sent = malloc(g->count * sizeof(float))))) {
      /* the request is with the passive: keep the connection for its reply (collect_late) */
      memcpy(p->sent, model, g->count * sizeof(float));
      p->late = 1;
    } else if (p->fd >= 0) { /* the stream may hold half a message: start afresh */
      close(p->fd);
      p->fd = -1;
    }
    p->suspect_end = wg_mono() + g->backoff_s;
    wg_logf(g->log, g->log_user, WAGMA_LOG_WARN,
            "adpsgd epoch %llu: averaging with rank %d (%s:%u) skipped: %s; not asking it for "
            "%.1f s",
            (unsigned long long)epoch, pick, p->addr.host, (unsigned)p->addr.port,
            wagma_strerror(e), g->backoff_s);
  }
  pthread_mutex_lock(&g->mu);
  if (e == 0)
    g->counters.averaged++;
  else
    g->counters.skipped++;
  pthread_mutex_unlock(&g->mu);
  if (peer)
    *peer = pick;
  return e == WAGMA_ETIMEDOUT ? e : e ? WAGMA_EPEER : 0;
}

void wg_adpsgd_counters(wg_adpsgd_t *g, wg_adpsgd_counters_t *out) {
  pthread_mutex_lock(&g->mu);
  *out = g->counters;
  pthread_mutex_unlock(&g->mu);
  out->connections = (uint64_t)wg_peer_server_count(g->server);
}

/* ---- the per-epoch exchange of ports and tokens ------------------------------------------ */

void wg_adpsgd_exchange_encode(float *buf, int rank, uint16_t port, uint64_t token) {
  float *b = buf + (size_t)rank * WG_ADPSGD_EXCHANGE_FLOATS;
  b[0] = (float)port;
  for (int k = 0; k < 4; k++)
    b[1 + k] = (float)((token >> (16 * k)) & 0xffffu);
}

void wg_adpsgd_exchange_decode(const float *buf, int rank, uint16_t *port, uint64_t *token) {
  const float *b = buf + (size_t)rank * WG_ADPSGD_EXCHANGE_FLOATS;
  float pf = b[0];
  *port = pf >= 0 && pf <= 65535 ? (uint16_t)pf : 0;
  uint64_t t = 0;
  for (int k = 0; k < 4; k++) {
    float v = b[1 + k];
    uint64_t piece = v >= 0 && v <= 65535 ? (uint64_t)v : 0;
    t |= piece << (16 * k);
  }
  *token = t;
}
