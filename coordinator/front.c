/* coordinator/front.c — the connection front of the REST server: every client connection
 * passes through it on its way to libmicrohttpd.
 *
 * Owns the listening socket, the client sockets and one end of a socketpair per client (the
 * other end is handed to libmicrohttpd with MHD_add_connection, with the client's address, so
 * libmicrohttpd parses and answers as if the client were there). One thread, the front
 * thread, runs an epoll loop over all of them and never blocks:
 *
 *   - accepts, and refuses with a JSON 503 `busy` beyond WG_HTTP_MAX_CONNECTIONS connections
 *     in all or WG_HTTP_MAX_PER_IP from one address;
 *   - checks every request head with wg_http_head_parse before forwarding a byte of it, and
 *     answers a head that libmicrohttpd would refuse with its own HTML (414, 431, 505, a bad
 *     Content-Length, a Transfer-Encoding, folding, garbage) with the documented JSON error,
 *     exactly once, then closes: earlier requests on the connection are answered first (the
 *     front half-closes libmicrohttpd's side and relays until libmicrohttpd has closed it);
 *   - forwards exactly Content-Length body bytes, then checks the next head (keep-alive and
 *     pipelining keep working);
 *   - times out a head that does not complete within WG_HTTP_HEAD_TIMEOUT_S and a body that
 *     stalls for as long (408 `request_timeout`), and closes connections with no traffic for
 *     WG_HTTP_IDLE_TIMEOUT_S;
 *   - passes a client's departure on: when the client closes, libmicrohttpd's side sees the
 *     end of its input, which http.c uses to drop queued work of clients that left;
 *   - answers the cached reads itself (front_reads.c says which), from the read cache, when
 *     libmicrohttpd has nothing of the connection's in hand (every request handed over was
 *     completed, wg_front_mhd_done, and its bytes relayed): a consistent read is PARKED (its
 *     head kept, the connection's later bytes not looked at) until the cache says a sync that
 *     started after it arrived verified the view (wg_cache_ready; the cache writes the front's
 *     wake eventfd), then answered; one that waited WG_CACHE_SYNC_WAIT_S, or that the cache
 *     cannot answer, goes to libmicrohttpd as any request (whose path reads etcd). The
 *     answer is one sendmsg of head and body; what the client did not take is kept (fast[])
 *     and goes out before anything libmicrohttpd sends later. Why: the relay cost two copies,
 *     four system calls and two thread hand-offs per answer, the front thread was the busiest
 *     of the coordinator under a read load (docs/benchmarks.md, "Cached reads").
 *
 * Responses are relayed unchanged. The front is the only reader of the client sockets and the
 * only writer of its socketpair ends; libmicrohttpd's threads touch only their own ends. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "coord.h"
#include "front.h"
#include "http.h"
#include "http_head.h"
#include "metrics.h"
#include "request.h"
#include "wagma/log_internal.h"

#define IN_CAP (WG_HTTP_MAX_LINE + WG_HTTP_MAX_HEAD + 64)
#define OUT_CAP 16384
#define LINGER_S 2.0 /* after a refusal: how long unread input is drained before closing */

typedef struct front_conn {
  int cfd;      /* the client */
  int mfd;      /* our end of the socketpair */
  int mhd_peer; /* libmicrohttpd's end (its number indexes wg_front.gen and .gone) */
  unsigned gen; /* this connection's generation of that number */
  struct sockaddr_storage addr;
  socklen_t addrlen;
  /* client -> libmicrohttpd: in[0, approved) is checked and goes out; the rest is a head
   * still arriving */
  char *in;
  size_t in_len, approved;
  uint64_t body_left;  /* body bytes of the current request still to forward */
  double head_started; /* when the first byte of the pending head came; 0 = none pending */
  double last_client;  /* last byte from the client */
  /* libmicrohttpd -> client */
  char *out;
  size_t out_off, out_len;
  int client_eof, mhd_eof, mfd_shut, cfd_shut, dead, closed;
  /* refusal: 1 = waiting for libmicrohttpd to finish earlier answers, 2 = queued / lingering */
  int refusing;
  int refuse_status;
  const char *refuse_code, *refuse_why;
  char refuse_method[16];
  double refuse_at, linger_until;
  double last_activity;
  /* reads answered by the front (front_reads.c) */
  int mhd_idle;             /* libmicrohttpd has nothing of this connection's to answer or send */
  int parked;               /* the head at in[0] waits for a sync of the read cache */
  double parked_at;         /* when it arrived */
  unsigned parked_failures; /* the cache's failure count then (wg_cache_ready) */
  int reclassify;           /* look at the pending input again (woken, or a parked head's time) */
  char *fast;               /* what the client has not taken yet of the front's answers */
  size_t fast_off, fast_len;
  struct front_conn *prev, *next;
} front_conn_t;

struct wg_front {
  wg_coord_t *c;
  struct MHD_Daemon *mhd;
  int lfd, epfd, stopfd;
  int accept_paused;
  double accept_resume;
  pthread_t thread;
  front_conn_t *conns;
  front_conn_t *graveyard; /* closed during an epoll batch; freed after it */
  int nconns;
  wg_http_limits_t limits;
  char stop_tag, listen_tag;
  /* Whether a connection's client has left, by the number of libmicrohttpd's end: gen[fd]
   * is the generation of the connection that holds the number (a new one per socketpair),
   * gone[fd] the generation whose client left (its input ended or failed, or the front
   * closed the connection). Written by the front thread only, read by the HTTP workers.
   * libmicrohttpd may close its end, and the number come back with a new connection, before
   * the front has closed the old one: the generation keeps the old one's departure off the
   * new one. */
  atomic_uint *gen, *gone;
  /* requests handed to libmicrohttpd and not completed yet, by the number of its end (reset
   * at accept; the front adds, http.c's completion callback takes away) */
  atomic_uint *pending;
  unsigned next_gen;
  size_t nfd;
  int wakefd; /* eventfd: the read cache says parked reads may go (wg_cache_notify) */
  char wake_tag;
};

static void mark_gone(wg_front_t *f, const front_conn_t *k) {
  if (k->mhd_peer >= 0 && (size_t)k->mhd_peer < f->nfd &&
      atomic_load(&f->gen[k->mhd_peer]) == k->gen)
    atomic_store(&f->gone[k->mhd_peer], k->gen);
}

unsigned wg_front_conn_gen(const wg_front_t *f, int mhd_fd) {
  if (!f || mhd_fd < 0 || (size_t)mhd_fd >= f->nfd)
    return 0;
  return atomic_load(&f->gen[mhd_fd]);
}

int wg_front_client_gone(const wg_front_t *f, int mhd_fd, unsigned gen) {
  if (!f || gen == 0 || mhd_fd < 0 || (size_t)mhd_fd >= f->nfd)
    return -1;
  return atomic_load(&f->gone[mhd_fd]) == gen;
}

void wg_front_mhd_done(wg_front_t *f, int mhd_fd, unsigned gen) {
  /* Before libmicrohttpd closes mhd_fd: the number cannot belong to a newer connection yet. */
  if (f && gen != 0 && mhd_fd >= 0 && (size_t)mhd_fd < f->nfd &&
      atomic_load(&f->gen[mhd_fd]) == gen && atomic_load(&f->pending[mhd_fd]) > 0)
    atomic_fetch_sub(&f->pending[mhd_fd], 1);
}

/* ---- the JSON answers the front gives itself ------------------------------------------ */

/* Formats a whole HTTP/1.1 response with the JSON error body into buf; returns its length
 * (0 when it does not fit). */
static size_t error_response(int status, const char *code, const char *why, char *buf, size_t cap) {
  char *body = wagma_api_error_body(code, why, NULL);
  const char *reason = status == 400   ? "Bad Request"
                       : status == 408 ? "Request Timeout"
                       : status == 411 ? "Length Required"
                       : status == 413 ? "Content Too Large"
                       : status == 414 ? "URI Too Long"
                       : status == 431 ? "Request Header Fields Too Large"
                       : status == 503 ? "Service Unavailable"
                       : status == 505 ? "HTTP Version Not Supported"
                                       : "Error";
  int n =
      body ? snprintf(buf, cap,
                      "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: "
                      "application/json\r\n%sContent-Length: %zu\r\n\r\n%s",
                      status, reason, status == 503 ? "Retry-After: 1\r\n" : "", strlen(body), body)
           : -1;
  free(body);
  return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* A connection refused at accept: the answer goes out at once (a fresh socket has room for
 * it), then the socket is closed. */
static void refuse_now(wg_front_t *f, int fd, const char *why) {
  char buf[1024];
  size_t n = error_response(503, "busy", why, buf, sizeof buf);
  if (n)
    (void)!send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  close(fd);
  wg_metrics_conn_refused(f->c->metrics);
  wg_metrics_http(f->c->metrics, NULL, "other", 503, 0);
}

/* ---- connections ---------------------------------------------------------------------- */

static int same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  if (a->ss_family != b->ss_family)
    return 0;
  if (a->ss_family == AF_INET)
    return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
           ((const struct sockaddr_in *)b)->sin_addr.s_addr;
  if (a->ss_family == AF_INET6)
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
  return 0;
}

/* Closes both sockets and unlists k; the memory stays until free_graveyard, since events of
 * the current epoll batch may still point at it (they see k->closed). */
static void conn_close(wg_front_t *f, front_conn_t *k) {
  mark_gone(f, k);
  epoll_ctl(f->epfd, EPOLL_CTL_DEL, k->cfd, NULL);
  epoll_ctl(f->epfd, EPOLL_CTL_DEL, k->mfd, NULL);
  close(k->cfd);
  close(k->mfd); /* libmicrohttpd's end reads the end of input and closes its side */
  if (k->prev)
    k->prev->next = k->next;
  else
    f->conns = k->next;
  if (k->next)
    k->next->prev = k->prev;
  f->nconns--;
  wg_metrics_conn_open(f->c->metrics, -1);
  k->closed = 1;
  k->prev = NULL;
  k->next = f->graveyard;
  f->graveyard = k;
}

static void free_graveyard(wg_front_t *f) {
  while (f->graveyard) {
    front_conn_t *k = f->graveyard;
    f->graveyard = k->next;
    free(k->in);
    free(k->out);
    free(k->fast);
    free(k);
  }
}

/* Starts refusing: nothing more from the client goes to libmicrohttpd; once its earlier
 * answers are out, the JSON error follows and the connection closes. */
static void refuse(front_conn_t *k, int status, const char *code, const char *why,
                   const char *method) {
  if (k->refusing)
    return;
  k->refusing = 1;
  k->refuse_status = status;
  k->refuse_code = code;
  k->refuse_why = why;
  k->refuse_at = wg_mono();
  snprintf(k->refuse_method, sizeof k->refuse_method, "%s", method ? method : "");
  k->in_len = k->approved; /* drop the refused head and whatever followed it */
  k->body_left = 0;
  k->head_started = 0;
  k->parked = 0;
}

static int would_block(void) {
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

/* Sends a front answer (head and body), keeping what the client did not take in k->fast. */
static void send_fast(front_conn_t *k, const char *head, size_t hl, const char *body, size_t bl) {
  struct iovec iov[2] = {{(void *)head, hl}, {(void *)body, bl}};
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
  ssize_t n = sendmsg(k->cfd, &mh, MSG_NOSIGNAL);
  if (n < 0 && !would_block()) {
    k->dead = 1;
    return;
  }
  size_t sent = n > 0 ? (size_t)n : 0, rest = hl + bl - sent;
  if (rest == 0)
    return;
  k->fast = malloc(rest);
  if (!k->fast) {
    k->dead = 1; /* half an answer cannot be taken back */
    return;
  }
  size_t o = 0;
  if (sent < hl) {
    memcpy(k->fast, head + sent, hl - sent);
    o = hl - sent;
  }
  memcpy(k->fast + o, body + (sent > hl ? sent - hl : 0), rest - o);
  k->fast_off = 0;
  k->fast_len = rest;
}

/* The head at k->in[0] (h, no body) as a read the front answers: 1 answered (the head is
 * gone), 0 parked until the read cache is current for it, -1 for libmicrohttpd. */
static int answer_read(wg_front_t *f, front_conn_t *k, const wg_http_head_t *h, double now) {
  wg_coord_t *c = f->c;
  if (!c->cache || k->fast_off < k->fast_len || k->out_off < k->out_len)
    return -1;
  if (!k->mhd_idle) { /* everything handed over completed, and its bytes relayed? */
    char b;
    if ((size_t)k->mhd_peer >= f->nfd || atomic_load(&f->pending[k->mhd_peer]) != 0 ||
        recv(k->mfd, &b, 1, MSG_PEEK | MSG_DONTWAIT) >= 0 || !would_block())
      return -1;
    k->mhd_idle = 1;
  }
  wg_fast_read_t rd;
  if (!wg_fast_read_parse(c, k->in, h->len, &rd)) {
    k->parked = 0;
    return -1;
  }
  int first = !k->parked;
  /* Arrival: now, not the pump's start (a sync that started before the head came may not
   * hold a write its client saw complete in between). */
  double arrival = first ? wg_mono() : k->parked_at;
  int ready = wg_cache_ready(c->cache, arrival, &k->parked_failures, first);
  if (ready == 0 && now - arrival < WG_CACHE_SYNC_WAIT_S) {
    k->parked = 1;
    k->parked_at = arrival;
    k->head_started = 0; /* complete: no 408 for it */
    return 0;
  }
  k->parked = 0;
  if (ready != 1)
    return -1;
  wg_response_t res;
  memset(&res, 0, sizeof res);
  char head[256];
  size_t hl = 0;
  if (wg_cache_serve(c->cache, &rd.req, &rd.route, &res) != 0 ||
      (hl = wg_fast_read_head(res.status, res.content_type, res.body_len, head, sizeof head)) ==
          0) {
    wg_response_free(&res);
    return -1;
  }
  send_fast(k, head, hl, res.body, res.body_len);
  wg_metrics_cache(c->metrics, first ? WG_METRIC_CACHE_HIT : WG_METRIC_CACHE_WAIT);
  wg_metrics_cache(c->metrics, WG_METRIC_CACHE_FRONT);
  wg_metrics_http(c->metrics, "GET", rd.route.label, res.status, wg_mono() - arrival);
  wg_response_free(&res);
  memmove(k->in, k->in + h->len, k->in_len - h->len);
  k->in_len -= h->len;
  k->last_activity = now;
  return 1;
}

/* Checks what arrived after the approved bytes: body bytes pass, heads are parsed. */
static void classify(wg_front_t *f, front_conn_t *k, double now) {
  while (k->approved < k->in_len && !k->refusing) {
    if (k->body_left > 0) {
      size_t avail = k->in_len - k->approved;
      size_t take = k->body_left < avail ? (size_t)k->body_left : avail;
      k->approved += take;
      k->body_left -= take;
      continue;
    }
    wg_http_head_t h;
    int r = wg_http_head_parse(k->in + k->approved, k->in_len - k->approved, &f->limits, &h);
    if (r == WG_HEAD_MORE) {
      if (k->head_started == 0)
        k->head_started = now;
      return;
    }
    if (r == WG_HEAD_BAD) {
      refuse(k, h.status, h.code, h.why, h.method);
      return;
    }
    if (h.skip) { /* empty lines before the request line: not forwarded */
      memmove(k->in + k->approved, k->in + k->approved + h.skip, k->in_len - k->approved - h.skip);
      k->in_len -= h.skip;
    }
    if (h.content_length == 0 && k->approved == 0) {
      int a = answer_read(f, k, &h, now);
      if (a == 0 || k->dead)
        return; /* parked: nothing after it is looked at yet */
      if (a == 1)
        continue;
    }
    k->approved += h.len;
    k->mhd_idle = 0;
    if ((size_t)k->mhd_peer < f->nfd)
      atomic_fetch_add(&f->pending[k->mhd_peer], 1);
    k->body_left = h.content_length;
    k->head_started = 0;
  }
}

/* Moves bytes every way they can go until nothing moves, then closes a finished
 * connection. Edge-triggered: every read and write goes on until EAGAIN or a full buffer,
 * and a full buffer empties only here, so this loop is where reading resumes. */
static void pump(wg_front_t *f, front_conn_t *k) {
  double now = wg_mono();
  for (int moved = 1; moved && !k->dead;) {
    moved = 0;
    if (k->reclassify) { /* woken: a parked head may go now */
      k->reclassify = 0;
      if (!k->refusing && !k->client_eof)
        classify(f, k, now);
      if (k->dead)
        break;
    }
    /* client -> in (discarded while lingering after a refusal) */
    if (!k->client_eof && (k->refusing == 2 ? k->cfd_shut : !k->refusing) && k->in_len < IN_CAP) {
      char sink[4096];
      char *dst = k->refusing ? sink : k->in + k->in_len;
      size_t room = k->refusing ? sizeof sink : IN_CAP - k->in_len;
      ssize_t n = recv(k->cfd, dst, room, 0);
      if (n > 0) {
        moved = 1;
        k->last_client = k->last_activity = now;
        if (!k->refusing) {
          k->in_len += (size_t)n;
          classify(f, k, now);
          if (k->dead)
            break;
        }
      } else if (n == 0) {
        moved = 1;
        k->client_eof = 1;
        mark_gone(f, k);
        k->in_len = k->approved; /* a head cut short (or parked) is dropped */
        k->body_left = 0;
        k->head_started = 0;
        if (k->parked) /* a read that waited for the cache: nobody to answer */
          wg_metrics_abandoned(f->c->metrics);
        k->parked = 0;
      } else if (!would_block()) {
        k->dead = 1;
        break;
      }
    }
    /* in -> libmicrohttpd */
    if (k->approved > 0 && !k->mfd_shut) {
      ssize_t n = send(k->mfd, k->in, k->approved, MSG_NOSIGNAL);
      if (n > 0) {
        moved = 1;
        k->last_activity = now;
        memmove(k->in, k->in + n, k->in_len - (size_t)n);
        k->in_len -= (size_t)n;
        k->approved -= (size_t)n;
      } else if (n < 0 && !would_block()) {
        /* libmicrohttpd closed its side: what it wrote before is still read below. */
        moved = 1;
        k->approved = k->in_len = 0;
        k->body_left = 0;
        k->mfd_shut = 1;
      }
    }
    /* Nothing more will come for libmicrohttpd: let it see the end of its input. */
    if (k->approved == 0 && (k->client_eof || k->refusing) && !k->mfd_shut) {
      shutdown(k->mfd, SHUT_WR);
      k->mfd_shut = 1;
      moved = 1;
    }
    /* libmicrohttpd -> out */
    if (k->out_off == k->out_len)
      k->out_off = k->out_len = 0;
    if (!k->mhd_eof && k->out_len < OUT_CAP) {
      ssize_t n = recv(k->mfd, k->out + k->out_len, OUT_CAP - k->out_len, 0);
      if (n > 0) {
        moved = 1;
        k->out_len += (size_t)n;
        k->last_activity = now;
      } else if (n == 0 || !would_block()) {
        moved = 1;
        k->mhd_eof = 1;
      }
    }
    /* the front's own answers, then out -> client (they came first) */
    if (k->fast_off < k->fast_len && !k->cfd_shut) {
      ssize_t n = send(k->cfd, k->fast + k->fast_off, k->fast_len - k->fast_off, MSG_NOSIGNAL);
      if (n > 0) {
        moved = 1;
        k->fast_off += (size_t)n;
        k->last_activity = now;
        if (k->fast_off == k->fast_len) {
          free(k->fast);
          k->fast = NULL;
          k->fast_off = k->fast_len = 0;
        }
      } else if (n < 0 && !would_block()) {
        k->dead = 1;
        break;
      }
    } else if (k->out_off < k->out_len && !k->cfd_shut) {
      ssize_t n = send(k->cfd, k->out + k->out_off, k->out_len - k->out_off, MSG_NOSIGNAL);
      if (n > 0) {
        moved = 1;
        k->out_off += (size_t)n;
        k->last_activity = now;
      } else if (n < 0 && !would_block()) {
        k->dead = 1;
        break;
      }
    }
    /* The refusal goes out once libmicrohttpd has answered what came before and closed. */
    if (k->refusing == 1 && k->mhd_eof && k->out_off == k->out_len && k->fast_len == 0) {
      k->out_off = 0;
      k->out_len = error_response(k->refuse_status, k->refuse_code, k->refuse_why, k->out, OUT_CAP);
      k->refusing = 2;
      moved = 1;
      wg_metrics_http(f->c->metrics, k->refuse_method[0] ? k->refuse_method : NULL, "other",
                      k->refuse_status, now - k->refuse_at);
    }
    if (k->refusing == 2 && k->out_off == k->out_len && !k->cfd_shut) {
      shutdown(k->cfd, SHUT_WR);
      k->cfd_shut = 1;
      k->linger_until = now + LINGER_S;
      moved = 1;
    }
  }
  if (k->refusing == 2 && k->cfd_shut && k->client_eof)
    k->dead = 1; /* refused, answered, and the client is done */
  if (!k->refusing && k->mhd_eof && k->out_off == k->out_len && k->fast_len == 0)
    k->dead = 1; /* libmicrohttpd closed (Connection: close, its timeout, client gone) */
  if (k->dead)
    conn_close(f, k);
}

static void accept_all(wg_front_t *f) {
  for (;;) {
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    int fd = accept4(f->lfd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* No descriptor for it: stop accepting for a moment (the backlog keeps it). */
        wg_logf(f->c->log, f->c->log_user, WAGMA_LOG_WARN, "accept: %s: pausing 100 ms",
                strerror(errno));
        struct epoll_event ev = {.events = 0, .data.ptr = &f->listen_tag};
        epoll_ctl(f->epfd, EPOLL_CTL_MOD, f->lfd, &ev);
        f->accept_paused = 1;
        f->accept_resume = wg_mono() + 0.1;
      }
      return;
    }
    if (f->nconns >= WG_HTTP_MAX_CONNECTIONS) {
      refuse_now(f, fd, "too many connections: retry later");
      continue;
    }
    int from_peer = 0;
    for (front_conn_t *k = f->conns; k; k = k->next)
      from_peer += same_address(&k->addr, &sa);
    if (from_peer >= WG_HTTP_MAX_PER_IP) {
      refuse_now(f, fd, "too many connections from your address: retry later");
      continue;
    }
    int one = 1, sv[2];
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    front_conn_t *k = calloc(1, sizeof *k);
    char *in = malloc(IN_CAP), *out = malloc(OUT_CAP);
    if (!k || !in || !out ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
      free(k);
      free(in);
      free(out);
      refuse_now(f, fd, "out of resources: retry later");
      continue;
    }
    unsigned gen = ++f->next_gen ? f->next_gen : ++f->next_gen; /* 0 = unknown */
    if ((size_t)sv[1] < f->nfd) {
      atomic_store(&f->pending[sv[1]], 0);
      atomic_store(&f->gen[sv[1]], gen);
    }
    /* libmicrohttpd owns sv[1] from here, also on failure (it closes it then). */
    if (MHD_add_connection(f->mhd, sv[1], (struct sockaddr *)&sa, len) != MHD_YES) {
      close(sv[0]);
      free(k);
      free(in);
      free(out);
      refuse_now(f, fd, "connection limit of the HTTP server: retry later");
      continue;
    }
    k->cfd = fd;
    k->mfd = sv[0];
    k->mhd_peer = sv[1];
    k->gen = gen;
    k->addr = sa;
    k->addrlen = len;
    k->in = in;
    k->out = out;
    k->mhd_idle = 1;
    k->last_activity = k->last_client = wg_mono();
    k->next = f->conns;
    if (f->conns)
      f->conns->prev = k;
    f->conns = k;
    f->nconns++;
    wg_metrics_conn_open(f->c->metrics, +1);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = k};
    if (epoll_ctl(f->epfd, EPOLL_CTL_ADD, k->cfd, &ev) != 0 ||
        epoll_ctl(f->epfd, EPOLL_CTL_ADD, k->mfd, &ev) != 0) {
      conn_close(f, k);
      continue;
    }
    pump(f, k);
  }
}

/* Timeouts, every WG_HTTP_SWEEP_S. */
static void sweep(wg_front_t *f) {
  double now = wg_mono();
  if (f->accept_paused && now >= f->accept_resume) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &f->listen_tag};
    epoll_ctl(f->epfd, EPOLL_CTL_MOD, f->lfd, &ev);
    f->accept_paused = 0;
  }
  front_conn_t *next;
  for (front_conn_t *k = f->conns; k; k = next) {
    next = k->next;
    if (k->refusing == 2 && k->cfd_shut && now >= k->linger_until) {
      conn_close(f, k);
      continue;
    }
    if (!k->refusing && k->head_started > 0 && now - k->head_started > WG_HTTP_HEAD_TIMEOUT_S) {
      refuse(k, 408, "request_timeout", "the request head did not complete in time", NULL);
      pump(f, k);
      continue;
    }
    if (!k->refusing && k->body_left > 0 && now - k->last_client > WG_HTTP_HEAD_TIMEOUT_S) {
      refuse(k, 408, "request_timeout", "the request body stalled", NULL);
      pump(f, k);
      continue;
    }
    if (k->parked && now - k->parked_at >= WG_CACHE_SYNC_WAIT_S) {
      k->reclassify = 1; /* to libmicrohttpd (answer_read) */
      pump(f, k);
      continue;
    }
    if (now - k->last_activity > WG_HTTP_IDLE_TIMEOUT_S)
      conn_close(f, k); /* nothing moved either way: idle keep-alive, or a client gone mute */
  }
}

static int fcntl_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 ? -1 : 0;
}

static void *front_main(void *arg) {
  wg_front_t *f = arg;
  struct epoll_event evs[256];
  double next_sweep = wg_mono() + WG_HTTP_SWEEP_S;
  for (;;) {
    int timeout_ms = (int)((next_sweep - wg_mono()) * 1000) + 1;
    int n = epoll_wait(f->epfd, evs, 256, timeout_ms < 1 ? 1 : timeout_ms);
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &f->stop_tag)
        return NULL;
      if (p == &f->listen_tag)
        accept_all(f);
      if (p == &f->wake_tag) {
        uint64_t v;
        (void)!read(f->wakefd, &v, sizeof v);
        front_conn_t *next;
        for (front_conn_t *k = f->conns; k; k = next) {
          next = k->next;
          if (k->parked) {
            k->reclassify = 1;
            pump(f, k);
          }
        }
      }
    }
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &f->stop_tag || p == &f->listen_tag || p == &f->wake_tag)
        continue;
      front_conn_t *k = p;
      if (!k->closed) /* closed by an earlier event of this batch */
        pump(f, k);
    }
    free_graveyard(f);
    if (wg_mono() >= next_sweep) {
      sweep(f);
      free_graveyard(f);
      next_sweep = wg_mono() + WG_HTTP_SWEEP_S;
    }
  }
}

int wg_front_start(wg_coord_t *c, int listen_fd, struct MHD_Daemon *mhd, wg_front_t **out) {
  wg_front_t *f = calloc(1, sizeof *f);
  if (!f)
    return WAGMA_ENOMEM;
  f->c = c;
  f->mhd = mhd;
  f->lfd = listen_fd;
  f->limits = (wg_http_limits_t){
      .max_line = WG_HTTP_MAX_LINE, .max_head = WG_HTTP_MAX_HEAD, .max_fields = WG_HTTP_MAX_FIELDS};
  /* Three descriptors per connection (client, two socketpair ends) plus etcd's: ask for
   * the hard limit when the soft one is lower than that needs. */
  struct rlimit rl;
  rlim_t want = (rlim_t)WG_HTTP_MAX_CONNECTIONS * 3 + 512;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
    rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  f->nfd = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (1u << 20) ? rl.rlim_cur : 1u << 20;
  f->gen = calloc(f->nfd, sizeof *f->gen);
  f->gone = calloc(f->nfd, sizeof *f->gone);
  f->pending = calloc(f->nfd, sizeof *f->pending);
  if (!f->gen || !f->gone || !f->pending) {
    free(f->gen);
    free(f->gone);
    free(f->pending);
    free(f);
    return WAGMA_ENOMEM;
  }
  f->epfd = epoll_create1(EPOLL_CLOEXEC);
  f->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  f->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &f->listen_tag};
  struct epoll_event sev = {.events = EPOLLIN, .data.ptr = &f->stop_tag};
  struct epoll_event wev = {.events = EPOLLIN, .data.ptr = &f->wake_tag};
  /* *out is set before the thread starts: libmicrohttpd's threads read it (through http.c)
   * for connections the thread hands them. */
  *out = f;
  if (f->wakefd >= 0)
    wg_cache_notify(c->cache, f->wakefd); /* before the first read can park */
  if (f->epfd < 0 || f->stopfd < 0 || f->wakefd < 0 || fcntl_nonblock(listen_fd) != 0 ||
      epoll_ctl(f->epfd, EPOLL_CTL_ADD, listen_fd, &lev) != 0 ||
      epoll_ctl(f->epfd, EPOLL_CTL_ADD, f->stopfd, &sev) != 0 ||
      epoll_ctl(f->epfd, EPOLL_CTL_ADD, f->wakefd, &wev) != 0 ||
      pthread_create(&f->thread, NULL, front_main, f) != 0) {
    *out = NULL;
    wg_logf(c->log, c->log_user, WAGMA_LOG_ERROR, "cannot start the connection front: %s",
            strerror(errno));
    if (f->epfd >= 0)
      close(f->epfd);
    if (f->stopfd >= 0)
      close(f->stopfd);
    if (f->wakefd >= 0) {
      wg_cache_notify(c->cache, -1 - f->wakefd);
      close(f->wakefd);
    }
    free(f->gen);
    free(f->gone);
    free(f->pending);
    free(f);
    return WAGMA_EIO;
  }
  return 0;
}

void wg_front_stop(wg_front_t *f) {
  if (!f)
    return;
  uint64_t one = 1;
  (void)!write(f->stopfd, &one, sizeof one);
  pthread_join(f->thread, NULL);
  wg_cache_notify(f->c->cache, -1 - f->wakefd);
  while (f->conns)
    conn_close(f, f->conns);
  free_graveyard(f);
  close(f->lfd);
  close(f->epfd);
  close(f->stopfd);
  close(f->wakefd);
}

void wg_front_free(wg_front_t *f) {
  if (!f)
    return;
  free(f->gen);
  free(f->gone);
  free(f->pending);
  free(f);
}
