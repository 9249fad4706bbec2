/* tcp_mesh.c — connection setup of the TCP transport: one socket per pair of members.
 *
 * Rule: rank r dials every rank below r and accepts every rank above r, so each pair gets
 * exactly one socket. The dialer sends HELLO(epoch, src = r, aux = nranks); the acceptor checks
 * magic, version, epoch, kind, that src is a rank above it and that nranks agrees, then answers
 * with its own HELLO, which the dialer checks the same way (src must be the rank it dialed).
 * A connection with a bad HELLO is counted in frames_rejected, logged and dropped; a dialer
 * whose connection fails (refused, reset, wrong epoch: an old process still on the port)
 * retries with backoff until the deadline.
 *
 * Runs on the thread that calls open, before the progress thread exists, with its own epoll
 * set; no locks. Invariant: exactly 64 bytes are read from a connection here, so frames a
 * faster peer sends right after its handshake stay in the socket for the progress thread. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_internal.h"
#include "wagma/log_internal.h"

enum slot_kind { SLOT_DIAL, SLOT_ACCEPT };
enum slot_state { SLOT_IDLE, SLOT_CONNECTING, SLOT_HELLO_WAIT, SLOT_DONE, SLOT_FREE };

typedef struct mesh_slot {
  int kind;
  int state;
  int fd;
  int rank; /* dial target; -1 for an accepted connection */
  uint8_t buf[WG_FRAME_HEADER_SIZE];
  size_t got;
  double retry_at;
  double backoff;
} mesh_slot_t;

typedef struct mesh {
  struct wg_transport *t;
  const wagma_plan_t *plan;
  int epfd;
  int listen_fd;
  mesh_slot_t *dials;   /* nranks entries, used for ranks below mine */
  mesh_slot_t *accepts; /* naccepts entries */
  int naccepts;
  int missing; /* peers without a connection yet */
} mesh_t;

static const int listen_tag; /* epoll data.ptr of the listening socket */

int wg_tcp_parse_address(const char *address, char *host, size_t host_len, char *port,
                         size_t port_len) {
  if (address == NULL)
    return WAGMA_EINVAL;
  const char *colon = strrchr(address, ':');
  if (colon == NULL || colon[1] == '\0')
    return WAGMA_EINVAL;
  const char *h = address;
  size_t hlen = (size_t)(colon - address);
  if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
    h++;
    hlen -= 2;
  }
  size_t plen = strlen(colon + 1);
  if (hlen >= host_len || plen >= port_len)
    return WAGMA_EINVAL;
  for (size_t i = 0; i < plen; i++)
    if (colon[1 + i] < '0' || colon[1 + i] > '9')
      return WAGMA_EINVAL;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  memcpy(port, colon + 1, plen + 1);
  return 0;
}

static void make_hello(const struct wg_transport *t, uint8_t out[WG_FRAME_HEADER_SIZE]) {
  wg_frame_header_t h = {0};
  h.magic = WG_FRAME_MAGIC;
  h.version = WG_FRAME_VERSION;
  h.kind = WG_FRAME_HELLO;
  h.epoch = t->epoch;
  h.src = (uint32_t)t->rank;
  h.aux = (uint64_t)t->nranks;
  wg_frame_encode(&h, out);
}

/* Validates a HELLO; returns its src rank or a negative status. */
static int check_hello(mesh_t *m, const uint8_t buf[WG_FRAME_HEADER_SIZE], const char *what) {
  struct wg_transport *t = m->t;
  wg_frame_header_t h;
  int rc = wg_frame_decode(buf, WG_FRAME_HEADER_SIZE, t->epoch, (uint32_t)t->nranks, 0, &h);
  if (rc == 0 && (h.kind != WG_FRAME_HELLO || h.aux != (uint64_t)t->nranks))
    rc = WAGMA_EPROTO;
  if (rc != 0) {
    atomic_fetch_add(&t->frames_rejected, 1);
    wg_logf(t->log, t->log_user, WAGMA_LOG_WARN, "rank %d: rejected %s: %s", t->rank, what,
            wagma_strerror(rc));
    return rc;
  }
  return (int)h.src;
}

static int bind_listener(mesh_t *m) {
  struct wg_transport *t = m->t;
  char host[WAGMA_ADDRESS_MAX], port[16];
  const char *address = m->plan->members[t->rank].address;
  if (wg_tcp_parse_address(address, host, sizeof host, port, sizeof port) != 0) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_ERROR, "rank %d: bad address '%s'", t->rank, address);
    return WAGMA_EINVAL;
  }
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (rc != 0) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_ERROR, "rank %d: cannot resolve '%s': %s", t->rank,
            address, gai_strerror(rc));
    return WAGMA_EINVAL;
  }
  int err = 0;
  for (struct addrinfo *ai = res; ai != NULL && m->listen_fd < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int b = bind(fd, ai->ai_addr, ai->ai_addrlen);
    if (b != 0 && errno == EADDRNOTAVAIL) {
      /* The plan address is not local (NAT, service IP): listen on every interface. */
      struct sockaddr_storage any = {0};
      memcpy(&any, ai->ai_addr, ai->ai_addrlen);
      if (ai->ai_family == AF_INET)
        ((struct sockaddr_in *)&any)->sin_addr.s_addr = htonl(INADDR_ANY);
      else if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&any)->sin6_addr = in6addr_any;
      b = bind(fd, (struct sockaddr *)&any, ai->ai_addrlen);
    }
    if (b != 0 || listen(fd, t->nranks + 16) != 0) {
      err = errno;
      close(fd);
      continue;
    }
    m->listen_fd = fd;
  }
  freeaddrinfo(res);
  if (m->listen_fd < 0) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_ERROR, "rank %d: cannot listen on %s: %s", t->rank,
            address, strerror(err));
    return WAGMA_EIO;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = (void *)&listen_tag};
  if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, m->listen_fd, &ev) != 0)
    return WAGMA_EIO;
  return 0;
}

static void slot_close(mesh_t *m, mesh_slot_t *s) {
  if (s->fd >= 0) {
    epoll_ctl(m->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
  }
  s->fd = -1;
  s->got = 0;
}

static void dial_failed(mesh_t *m, mesh_slot_t *s) {
  slot_close(m, s);
  s->state = SLOT_IDLE;
  s->retry_at = wg_now() + s->backoff;
  s->backoff = fmin(s->backoff * 2, 0.2);
}

static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int send_hello(mesh_t *m, int fd) {
  uint8_t hello[WG_FRAME_HEADER_SIZE];
  make_hello(m->t, hello);
  ssize_t n = send(fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == (ssize_t)sizeof hello ? 0 : -1;
}

static void dial_hello_sent(mesh_t *m, mesh_slot_t *s) {
  if (send_hello(m, s->fd) != 0) {
    dial_failed(m, s);
    return;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
  epoll_ctl(m->epfd, EPOLL_CTL_MOD, s->fd, &ev);
  s->state = SLOT_HELLO_WAIT;
}

static void dial_start(mesh_t *m, mesh_slot_t *s) {
  struct wg_transport *t = m->t;
  char host[WAGMA_ADDRESS_MAX], port[16];
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const char *address = m->plan->members[s->rank].address;
  if (wg_tcp_parse_address(address, host, sizeof host, port, sizeof port) != 0 ||
      getaddrinfo(host[0] ? host : NULL, port, &hints, &res) != 0) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_DEBUG, "rank %d: cannot resolve '%s' of rank %d",
            t->rank, address, s->rank);
    dial_failed(m, s);
    return;
  }
  s->fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->fd < 0) {
    freeaddrinfo(res);
    dial_failed(m, s);
    return;
  }
  set_nodelay(s->fd);
  int rc = connect(s->fd, res->ai_addr, res->ai_addrlen);
  int err = errno;
  freeaddrinfo(res);
  struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = s};
  if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, s->fd, &ev) != 0) {
    dial_failed(m, s);
    return;
  }
  if (rc == 0)
    dial_hello_sent(m, s);
  else if (err == EINPROGRESS)
    s->state = SLOT_CONNECTING;
  else
    dial_failed(m, s);
}

/* Reads the rest of a 64-byte HELLO; returns 1 complete, 0 more to come, -1 EOF or error. */
static int read_hello(mesh_slot_t *s) {
  while (s->got < WG_FRAME_HEADER_SIZE) {
    ssize_t n = recv(s->fd, s->buf + s->got, WG_FRAME_HEADER_SIZE - s->got, MSG_DONTWAIT);
    if (n > 0)
      s->got += (size_t)n;
    else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    else if (n < 0 && errno == EINTR)
      continue;
    else
      return -1;
  }
  return 1;
}

static void on_dial_event(mesh_t *m, mesh_slot_t *s) {
  struct wg_transport *t = m->t;
  if (s->state == SLOT_CONNECTING) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
      dial_failed(m, s);
    else
      dial_hello_sent(m, s);
    return;
  }
  if (s->state != SLOT_HELLO_WAIT)
    return;
  int r = read_hello(s);
  if (r < 0) {
    dial_failed(m, s);
    return;
  }
  if (r == 0)
    return;
  int src = check_hello(m, s->buf, "HELLO reply");
  if (src != s->rank) {
    if (src >= 0) {
      atomic_fetch_add(&t->frames_rejected, 1);
      wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
              "rank %d: HELLO reply from rank %d on the connection to rank %d", t->rank, src,
              s->rank);
    }
    dial_failed(m, s);
    return;
  }
  epoll_ctl(m->epfd, EPOLL_CTL_DEL, s->fd, NULL);
  t->peers[s->rank].fd = s->fd;
  s->fd = -1;
  s->state = SLOT_DONE;
  m->missing--;
}

static void on_listen_event(mesh_t *m) {
  for (;;) {
    int fd = accept4(m->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return;
    mesh_slot_t *s = NULL;
    for (int i = 0; i < m->naccepts && s == NULL; i++)
      if (m->accepts[i].state == SLOT_FREE)
        s = &m->accepts[i];
    struct epoll_event ev = {.events = EPOLLIN};
    if (s == NULL) {
      close(fd); /* too many half-open connections: a flood, not a member */
      continue;
    }
    s->fd = fd;
    s->got = 0;
    s->state = SLOT_HELLO_WAIT;
    ev.data.ptr = s;
    if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      slot_close(m, s);
      s->state = SLOT_FREE;
    }
  }
}

static void on_accept_event(mesh_t *m, mesh_slot_t *s) {
  struct wg_transport *t = m->t;
  int r = read_hello(s);
  if (r == 0)
    return;
  if (r < 0) {
    if (s->got > 0) {
      atomic_fetch_add(&t->frames_rejected, 1);
      wg_logf(t->log, t->log_user, WAGMA_LOG_WARN, "rank %d: truncated HELLO (%zu bytes)", t->rank,
              s->got);
    }
    slot_close(m, s);
    s->state = SLOT_FREE;
    return;
  }
  int src = check_hello(m, s->buf, "HELLO");
  if (src >= 0 && src <= t->rank) {
    atomic_fetch_add(&t->frames_rejected, 1);
    wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
            "rank %d: HELLO from rank %d, which should accept, not dial", t->rank, src);
    src = WAGMA_EPROTO;
  }
  if (src < 0 || send_hello(m, s->fd) != 0) {
    slot_close(m, s);
    s->state = SLOT_FREE;
    return;
  }
  epoll_ctl(m->epfd, EPOLL_CTL_DEL, s->fd, NULL);
  wg_tcp_peer_t *p = &t->peers[src];
  if (p->fd >= 0) {
    /* The dialer gave up on an earlier connection and retried: the newest one wins. */
    close(p->fd);
    m->missing++;
  }
  p->fd = s->fd;
  s->fd = -1;
  s->state = SLOT_FREE;
  m->missing--;
}

static int mesh_run(mesh_t *m, double deadline) {
  struct wg_transport *t = m->t;
  int rc = bind_listener(m);
  if (rc != 0)
    return rc;
  for (int r = 0; r < t->rank; r++) {
    mesh_slot_t *s = &m->dials[r];
    s->kind = SLOT_DIAL;
    s->state = SLOT_IDLE;
    s->fd = -1;
    s->rank = r;
    s->retry_at = 0;
    s->backoff = 0.01;
  }
  while (m->missing > 0) {
    double now = wg_now();
    if (now >= deadline)
      break;
    double next = deadline;
    for (int r = 0; r < t->rank; r++) {
      mesh_slot_t *s = &m->dials[r];
      if (s->state == SLOT_IDLE && s->retry_at <= now)
        dial_start(m, s);
      if (s->state == SLOT_IDLE && s->retry_at < next)
        next = s->retry_at;
    }
    int timeout_ms = (int)ceil((next - wg_now()) * 1000.0);
    if (timeout_ms < 0)
      timeout_ms = 0;
    struct epoll_event events[32];
    int n = epoll_wait(m->epfd, events, 32, timeout_ms);
    for (int i = 0; i < n; i++) {
      void *ptr = events[i].data.ptr;
      if (ptr == &listen_tag) {
        on_listen_event(m);
        continue;
      }
      mesh_slot_t *s = ptr;
      if (s->kind == SLOT_DIAL)
        on_dial_event(m, s);
      else
        on_accept_event(m, s);
    }
  }
  return 0;
}

int wg_tcp_mesh_connect(struct wg_transport *t, const wagma_plan_t *plan, double deadline) {
  int rc = 0;
  mesh_t m = {.t = t, .plan = plan, .epfd = -1, .listen_fd = -1, .missing = t->nranks - 1};
  if (t->nranks <= 1)
    return 0;
  m.naccepts = t->nranks + 32;
  m.dials = calloc((size_t)t->nranks, sizeof *m.dials);
  m.accepts = calloc((size_t)m.naccepts, sizeof *m.accepts);
  m.epfd = epoll_create1(EPOLL_CLOEXEC);
  if (m.dials == NULL || m.accepts == NULL || m.epfd < 0) {
    rc = m.epfd < 0 ? WAGMA_EIO : WAGMA_ENOMEM;
    goto out;
  }
  for (int i = 0; i < m.naccepts; i++) {
    m.accepts[i].kind = SLOT_ACCEPT;
    m.accepts[i].state = SLOT_FREE;
    m.accepts[i].fd = -1;
    m.accepts[i].rank = -1;
  }
  rc = mesh_run(&m, deadline);
out:
  for (int r = 0; m.dials != NULL && r < t->rank; r++)
    if (m.dials[r].state != SLOT_DONE && m.dials[r].fd >= 0)
      close(m.dials[r].fd);
  for (int i = 0; m.accepts != NULL && i < m.naccepts; i++)
    if (m.accepts[i].fd >= 0)
      close(m.accepts[i].fd);
  if (m.listen_fd >= 0)
    close(m.listen_fd);
  if (m.epfd >= 0)
    close(m.epfd);
  free(m.dials);
  free(m.accepts);
  for (int r = 0; r < t->nranks; r++)
    if (r != t->rank && t->peers[r].fd >= 0)
      set_nodelay(t->peers[r].fd);
  return rc;
}
