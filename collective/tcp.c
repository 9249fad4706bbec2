/* tcp.c — the TCP transport (transport.h): progress thread, outbound queues, mailbox.
 *
 * Owns: one socket per peer (connected by tcp_mesh.c during open), an epoll set, an eventfd
 * to wake the progress thread, per-peer outbound queues and the mailbox of received frames.
 *
 * Threads: one progress thread reads every socket (non-blocking, a header-then-payload state
 * machine per peer) and drains the outbound queues on EPOLLOUT. Callers' threads enqueue
 * frames (send) and take messages (recv).
 *
 * Invariants:
 *  - Every socket in peers[] completed the authenticated handshake of tcp_mesh.c as its rank.
 *  - A header is decoded and validated by wg_frame_decode (epoch, src < nranks, length <=
 *    max_payload) and its src must be the connection's rank, before the payload is allocated.
 *    A bad frame is counted in frames_rejected, logged, and its peer is declared dead. So a
 *    frame, a BYE included, only ever speaks for the rank whose connection carried it.
 *  - A peer's socket is written by at most one thread at a time: a sender writes directly
 *    only while holding out_lock with an empty queue; the progress thread writes only the head
 *    of a non-empty queue, and only it pops. So frames leave in the order they were queued.
 *  - A dead peer is never revived in this epoch; its fd stays open (shut down) until close,
 *    so no fd number is reused under a concurrent sender.
 *  - Dead flags change under mbox_lock before a broadcast, so recv waiters never miss one.
 *  - recv yields the CPU for at most RECV_SPIN_S before sleeping on the condvar (a cheap wait
 *    for a frame already on its way); it checks interrupt, close and its deadline every turn.
 *  - close queues a BYE to each live peer and flushes queues for at most
 *    WG_TCP_CLOSE_LINGER_S, so a frozen peer cannot make close hang. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "tcp_internal.h"
#include "wagma/log_internal.h"

#define READ_BUDGET ((size_t)8 << 20) /* bytes read from one peer per wake-up, for fairness */
#define RECV_SPIN_S 100e-6            /* recv yields (sched_yield) this long before it sleeps */

static void wake_progress(struct wg_transport *t) {
  uint64_t one = 1;
  ssize_t n = write(t->wakefd, &one, sizeof one);
  (void)n; /* a full counter already means "wake up" */
}

/* Takes ownership of m. */
static void mailbox_put(struct wg_transport *t, wg_message_t *m) {
  m->next = NULL;
  pthread_mutex_lock(&t->mbox_lock);
  if (t->mbox_tail != NULL)
    t->mbox_tail->next = m;
  else
    t->mbox_head = m;
  t->mbox_tail = m;
  pthread_cond_broadcast(&t->mbox_cond);
  pthread_mutex_unlock(&t->mbox_lock);
}

static void free_queue(wg_tcp_peer_t *p) {
  wg_out_frame_t *f = p->out_head;
  while (f != NULL) {
    wg_out_frame_t *next = f->next;
    wg_buf_free(f);
    f = next;
  }
  p->out_head = p->out_tail = NULL;
  p->out_head_off = 0;
  p->out_queued = 0;
}

/* Declares rank dead (idempotent): shuts its socket down (the fd stays open until close; the
 * progress thread frees its queue, since it may be writing from the head) and wakes recv
 * waiters. Callable from any thread. */
static void peer_kill(struct wg_transport *t, int rank, int level, const char *why) {
  wg_tcp_peer_t *p = &t->peers[rank];
  pthread_mutex_lock(&p->out_lock);
  int was_dead = atomic_exchange(&p->dead, 1);
  if (!was_dead && p->fd >= 0)
    shutdown(p->fd, SHUT_RDWR);
  pthread_mutex_unlock(&p->out_lock);
  if (was_dead)
    return;
  wg_logf(t->log, t->log_user, level, "rank %d: peer %d is dead: %s", t->rank, rank, why);
  pthread_mutex_lock(&t->mbox_lock);
  pthread_cond_broadcast(&t->mbox_cond);
  pthread_mutex_unlock(&t->mbox_lock);
  wake_progress(t); /* lets the progress thread drop the fd from its epoll set */
}

/* Progress thread: a bad frame from rank. */
static void reject(struct wg_transport *t, int rank, const char *why) {
  atomic_fetch_add(&t->frames_rejected, 1);
  peer_kill(t, rank, WAGMA_LOG_WARN, why);
}

/* Progress thread: a complete frame arrived. Takes ownership of m. */
static void deliver(struct wg_transport *t, int rank, wg_message_t *m) {
  atomic_fetch_add(&t->bytes_received, WG_FRAME_HEADER_SIZE + m->header.length);
  if (m->header.kind == WG_FRAME_BYE) {
    wg_message_free(m);
    peer_kill(t, rank, WAGMA_LOG_INFO, "closed (BYE)");
    return;
  }
  mailbox_put(t, m);
}

/* Progress thread: validates a complete header and starts its frame. Returns 0 or -1 (peer
 * killed). */
static int header_complete(struct wg_transport *t, wg_tcp_peer_t *p) {
  wg_frame_header_t h;
  int rc = wg_frame_decode(p->in_hdr, WG_FRAME_HEADER_SIZE, t->epoch, (uint32_t)t->nranks,
                           t->max_payload, &h);
  p->in_hdr_got = 0;
  if (rc == WAGMA_EEPOCH) {
    reject(t, p->rank, "frame of another epoch");
    return -1;
  }
  if (rc != 0) {
    reject(t, p->rank, "corrupt frame header");
    return -1;
  }
  if (h.src != (uint32_t)p->rank || h.kind == WG_FRAME_HELLO) {
    reject(t, p->rank, h.kind == WG_FRAME_HELLO ? "HELLO after handshake" : "wrong src rank");
    return -1;
  }
  wg_message_t *m = wg_message_new(&h, (size_t)h.length);
  if (m == NULL) {
    peer_kill(t, p->rank, WAGMA_LOG_ERROR, "out of memory for a frame payload");
    return -1;
  }
  if (h.length == 0) {
    deliver(t, p->rank, m);
    return 0;
  }
  p->in_msg = m;
  p->in_payload_got = 0;
  return 0;
}

/* Progress thread: reads what is available from p (up to READ_BUDGET). */
static void on_readable(struct wg_transport *t, wg_tcp_peer_t *p) {
  size_t budget = READ_BUDGET;
  while (budget > 0 && !atomic_load(&p->dead)) {
    uint8_t *dst;
    size_t want;
    if (p->in_msg == NULL) {
      dst = p->in_hdr + p->in_hdr_got;
      want = WG_FRAME_HEADER_SIZE - p->in_hdr_got;
    } else {
      dst = p->in_msg->payload + p->in_payload_got;
      want = (size_t)p->in_msg->header.length - p->in_payload_got;
    }
    if (want > budget)
      want = budget;
    ssize_t n = recv(p->fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n <= 0) {
      if (p->in_msg != NULL || p->in_hdr_got > 0) {
        atomic_fetch_add(&t->frames_rejected, 1);
        peer_kill(t, p->rank, WAGMA_LOG_WARN, "connection lost inside a frame (truncated)");
      } else {
        /* While closing, a peer that got our BYE shuts down its side: that is expected. */
        int level = atomic_load(&t->bye_sent) ? WAGMA_LOG_DEBUG : WAGMA_LOG_WARN;
        peer_kill(t, p->rank, level, n == 0 ? "connection closed" : strerror(errno));
      }
      return;
    }
    budget -= (size_t)n;
    if (p->in_msg == NULL) {
      p->in_hdr_got += (size_t)n;
      if (p->in_hdr_got == WG_FRAME_HEADER_SIZE && header_complete(t, p) != 0)
        return;
    } else {
      p->in_payload_got += (size_t)n;
      if (p->in_payload_got == p->in_msg->header.length) {
        wg_message_t *m = p->in_msg;
        p->in_msg = NULL;
        deliver(t, p->rank, m);
      }
    }
  }
}

/* Writes as much of iov as the socket takes now. Returns bytes written or -1 (errno). */
static ssize_t write_nonblocking(int fd, struct iovec *iov, int iovcnt) {
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
  for (;;) {
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    return n;
  }
}

static void set_armed(struct wg_transport *t, wg_tcp_peer_t *p, int armed) {
  if (p->out_armed == armed || p->out_armed < 0)
    return;
  struct epoll_event ev = {.events = EPOLLIN | (armed ? EPOLLOUT : 0),
                           .data.u32 = (uint32_t)p->rank};
  epoll_ctl(t->epfd, EPOLL_CTL_MOD, p->fd, &ev);
  p->out_armed = armed;
}

/* Progress thread: writes queued frames to p until the queue is empty or the socket full. */
static void on_writable(struct wg_transport *t, wg_tcp_peer_t *p) {
  for (;;) {
    pthread_mutex_lock(&p->out_lock);
    wg_out_frame_t *f = p->out_head;
    size_t off = p->out_head_off;
    pthread_mutex_unlock(&p->out_lock);
    if (f == NULL || atomic_load(&p->dead)) {
      set_armed(t, p, 0);
      return;
    }
    struct iovec iov = {.iov_base = f->data + off, .iov_len = f->len - off};
    ssize_t n = write_nonblocking(p->fd, &iov, 1);
    if (n < 0) {
      peer_kill(t, p->rank, WAGMA_LOG_WARN, strerror(errno));
      return;
    }
    atomic_fetch_add(&t->bytes_sent, (uint64_t)n);
    wg_out_frame_t *done = NULL;
    pthread_mutex_lock(&p->out_lock);
    if (p->out_head == f) { /* only this thread pops or frees: always true */
      p->out_head_off += (size_t)n;
      p->out_queued -= (size_t)n;
      if (p->out_head_off == f->len) {
        done = f;
        p->out_head = f->next;
        if (p->out_head == NULL)
          p->out_tail = NULL;
        p->out_head_off = 0;
      }
    }
    pthread_mutex_unlock(&p->out_lock);
    wg_buf_free(done);
    if (done == NULL) { /* socket full: wait for EPOLLOUT */
      set_armed(t, p, 1);
      return;
    }
  }
}

/* Progress thread: after a wake-up, arm or write the peers with queued frames and drop the
 * fds of dead peers from the epoll set. Returns the bytes still queued over all peers. */
static size_t service_queues(struct wg_transport *t) {
  size_t pending = 0;
  for (int r = 0; r < t->nranks; r++) {
    wg_tcp_peer_t *p = &t->peers[r];
    if (p->fd < 0 || r == t->rank)
      continue;
    if (atomic_load(&p->dead)) {
      pthread_mutex_lock(&p->out_lock);
      free_queue(p);
      pthread_mutex_unlock(&p->out_lock);
      if (p->out_armed >= 0) {
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, p->fd, NULL);
        p->out_armed = -1; /* removed */
      }
      continue;
    }
    pthread_mutex_lock(&p->out_lock);
    int queued = p->out_head != NULL;
    pthread_mutex_unlock(&p->out_lock);
    if (queued && !p->out_armed)
      on_writable(t, p);
    pthread_mutex_lock(&p->out_lock);
    pending += p->out_queued;
    pthread_mutex_unlock(&p->out_lock);
  }
  return pending;
}

/* Bytes handed to the kernel for live peers but not yet acknowledged by them. Closing a
 * socket that still has unread input sends a reset, which would discard these. */
static size_t unacknowledged(struct wg_transport *t) {
  size_t total = 0;
  for (int r = 0; r < t->nranks; r++) {
    wg_tcp_peer_t *p = &t->peers[r];
    int outq = 0;
    if (r != t->rank && p->fd >= 0 && !atomic_load(&p->dead) &&
        ioctl(p->fd, SIOCOUTQ, &outq) == 0 && outq > 0)
      total += (size_t)outq;
  }
  return total;
}

static void *progress_main(void *arg) {
  struct wg_transport *t = arg;
  double linger_deadline = 0;
  const uint32_t wake_id = (uint32_t)t->nranks;
  for (;;) {
    int timeout_ms = -1;
    if (atomic_load(&t->closing)) {
      /* Flush the queues, then wait until peers acknowledged everything, for at most the
       * linger time; a frozen peer costs at most that. */
      double now = wg_now();
      if (linger_deadline == 0)
        linger_deadline = now + WG_TCP_CLOSE_LINGER_S;
      size_t pending = service_queues(t);
      if ((pending == 0 && unacknowledged(t) == 0) || now >= linger_deadline)
        break;
      timeout_ms = pending > 0 ? (int)ceil((linger_deadline - now) * 1000.0) : 1;
      if (timeout_ms < 1)
        timeout_ms = 1;
    }
    struct epoll_event events[64];
    int n = epoll_wait(t->epfd, events, 64, timeout_ms);
    for (int i = 0; i < n; i++) {
      uint32_t id = events[i].data.u32;
      if (id == wake_id) {
        uint64_t v;
        ssize_t r = read(t->wakefd, &v, sizeof v);
        (void)r;
        service_queues(t);
        continue;
      }
      wg_tcp_peer_t *p = &t->peers[id];
      if (atomic_load(&p->dead))
        continue;
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        on_readable(t, p);
      if ((events[i].events & EPOLLOUT) && !atomic_load(&p->dead))
        on_writable(t, p);
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Operations
 * ---------------------------------------------------------------------------------------- */

static void tcp_free(struct wg_transport *t) {
  if (t == NULL)
    return;
  for (int r = 0; t->peers != NULL && r < t->nranks; r++) {
    wg_tcp_peer_t *p = &t->peers[r];
    if (p->fd >= 0) {
      /* Unread input would turn close into a reset: drain what is there first. */
      char scratch[4096];
      for (int i = 0; i < 1024 && recv(p->fd, scratch, sizeof scratch, MSG_DONTWAIT) > 0; i++)
        ;
      close(p->fd);
    }
    free_queue(p);
    wg_message_free(p->in_msg);
    pthread_mutex_destroy(&p->out_lock);
  }
  free(t->peers);
  wg_message_t *m = t->mbox_head;
  while (m != NULL) {
    wg_message_t *next = m->next;
    wg_message_free(m);
    m = next;
  }
  if (t->epfd >= 0)
    close(t->epfd);
  if (t->wakefd >= 0)
    close(t->wakefd);
  pthread_cond_destroy(&t->mbox_cond);
  pthread_mutex_destroy(&t->mbox_lock);
  free(t);
}

/* Ownership: on success *out is the caller's, released with tcp_close. */
static int tcp_open(const wg_transport_config_t *cfg, wg_transport_t **out) {
  int rc = 0;
  struct wg_transport *t = NULL;
  if (cfg == NULL || out == NULL || cfg->plan == NULL || cfg->plan->nranks < 1 ||
      cfg->plan->members == NULL || cfg->rank < 0 || cfg->rank >= cfg->plan->nranks)
    return WAGMA_EINVAL;
  const wg_transport_auth_t *auth = &cfg->auth;
  if ((auth->secret == NULL) != (auth->secret_len == 0) ||
      (auth->secret != NULL && auth->secret_len < WAGMA_SECRET_MIN_LEN) ||
      auth->secret_len > (size_t)INT_MAX)
    return WAGMA_EINVAL;
  *out = NULL;
  t = calloc(1, sizeof *t);
  if (t == NULL)
    return WAGMA_ENOMEM;
  t->epfd = t->wakefd = -1;
  t->rank = cfg->rank;
  t->nranks = cfg->plan->nranks;
  t->epoch = cfg->epoch;
  t->max_payload = cfg->max_payload ? cfg->max_payload : WG_TCP_DEFAULT_MAX_PAYLOAD;
  t->max_queued = cfg->max_queued_bytes ? cfg->max_queued_bytes : WG_TCP_DEFAULT_MAX_QUEUED;
  t->connect_timeout_s =
      cfg->connect_timeout_s > 0 ? cfg->connect_timeout_s : WG_TCP_DEFAULT_CONNECT_S;
  t->log = cfg->log;
  t->log_user = cfg->log_user;
  pthread_mutex_init(&t->mbox_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&t->mbox_cond, &ca);
  pthread_condattr_destroy(&ca);
  t->peers = calloc((size_t)t->nranks, sizeof *t->peers);
  if (t->peers == NULL) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  for (int r = 0; r < t->nranks; r++) {
    t->peers[r].rank = r;
    t->peers[r].fd = -1;
    pthread_mutex_init(&t->peers[r].out_lock, NULL);
  }
  t->epfd = epoll_create1(EPOLL_CLOEXEC);
  t->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->epfd < 0 || t->wakefd < 0) {
    rc = WAGMA_EIO;
    goto out;
  }
  if (auth->secret == NULL && t->nranks > 1)
    wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
            "rank %d: no secret: the data plane of epoch %llu is unauthenticated", t->rank,
            (unsigned long long)t->epoch);
  rc = wg_tcp_mesh_connect(t, cfg->plan, auth, wg_now() + t->connect_timeout_s, cfg->cancelled,
                           cfg->cancel_user);
  if (rc != 0)
    goto out;
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)t->nranks};
  if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wakefd, &ev) != 0) {
    rc = WAGMA_EIO;
    goto out;
  }
  int missing = 0;
  for (int r = 0; r < t->nranks; r++) {
    wg_tcp_peer_t *p = &t->peers[r];
    if (r == t->rank)
      continue;
    if (p->fd < 0) {
      atomic_store(&p->dead, 1);
      missing++;
      continue;
    }
    int fl = fcntl(p->fd, F_GETFL);
    fcntl(p->fd, F_SETFL, fl | O_NONBLOCK);
    ev.events = EPOLLIN;
    ev.data.u32 = (uint32_t)r;
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, p->fd, &ev) != 0) {
      rc = WAGMA_EIO;
      goto out;
    }
  }
  if (missing > 0)
    wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
            "rank %d: %d of %d peers did not connect within %.1f s; they count as dead", t->rank,
            missing, t->nranks - 1, t->connect_timeout_s);
  if (pthread_create(&t->thread, NULL, progress_main, t) != 0) {
    rc = WAGMA_EIO;
    goto out;
  }
  t->thread_started = 1;
  *out = t;
  t = NULL;
out:
  tcp_free(t);
  return rc;
}

/* Queues a copy of the bytes not yet written. Called with p->out_lock held. */
static int enqueue_rest(struct wg_transport *t, wg_tcp_peer_t *p, const uint8_t *hdr,
                        const void *payload, size_t length, size_t written) {
  size_t total = WG_FRAME_HEADER_SIZE + length;
  size_t rest = total - written;
  if (p->out_queued + rest > t->max_queued)
    return WAGMA_EPEER;
  wg_out_frame_t *f = wg_buf_alloc(sizeof *f + rest);
  if (f == NULL)
    return WAGMA_ENOMEM;
  f->next = NULL;
  f->len = rest;
  size_t pos = 0;
  if (written < WG_FRAME_HEADER_SIZE) {
    memcpy(f->data, hdr + written, WG_FRAME_HEADER_SIZE - written);
    pos = WG_FRAME_HEADER_SIZE - written;
    written = WG_FRAME_HEADER_SIZE;
  }
  if (length > 0)
    memcpy(f->data + pos, (const uint8_t *)payload + (written - WG_FRAME_HEADER_SIZE),
           total - written);
  if (p->out_tail != NULL)
    p->out_tail->next = f;
  else
    p->out_head = f;
  p->out_tail = f;
  p->out_queued += rest;
  return 0;
}

static int send_local(struct wg_transport *t, const wg_frame_header_t *h, const void *payload,
                      size_t length) {
  wg_message_t *m = wg_message_new(h, (size_t)h->length);
  if (m == NULL)
    return WAGMA_ENOMEM;
  if (length > 0)
    memcpy(m->payload, payload, length);
  mailbox_put(t, m);
  return 0;
}

static int tcp_send(wg_transport_t *t, int dst, wg_frame_header_t *header, const void *payload,
                    size_t length) {
  if (t == NULL || header == NULL || (length > 0 && payload == NULL))
    return WAGMA_EINVAL;
  if (atomic_load(&t->closing))
    return WAGMA_ECLOSED;
  if (dst < 0 || dst >= t->nranks || length > t->max_payload)
    return WAGMA_EINVAL;
  if (header->kind < WG_FRAME_HELLO || header->kind > WG_FRAME_KIND_MAX)
    return WAGMA_EINVAL;
  header->magic = WG_FRAME_MAGIC;
  header->version = WG_FRAME_VERSION;
  header->epoch = t->epoch;
  header->src = (uint32_t)t->rank;
  header->length = length;
  header->reserved = 0;
  if (dst == t->rank)
    return send_local(t, header, payload, length);

  uint8_t hdr[WG_FRAME_HEADER_SIZE];
  wg_frame_encode(header, hdr);
  wg_tcp_peer_t *p = &t->peers[dst];
  int rc = 0, kick = 0;
  size_t written = 0;
  pthread_mutex_lock(&p->out_lock);
  if (atomic_load(&p->dead)) {
    rc = WAGMA_EPEER;
    goto unlock;
  }
  if (p->out_head == NULL) {
    /* Nothing queued: try the socket now, so most frames never wait for the progress thread
     * and are never copied. */
    struct iovec iov[2] = {{.iov_base = hdr, .iov_len = sizeof hdr},
                           {.iov_base = (void *)payload, .iov_len = length}};
    ssize_t n = write_nonblocking(p->fd, iov, length > 0 ? 2 : 1);
    if (n < 0) {
      rc = WAGMA_EPEER;
      goto unlock;
    }
    written = (size_t)n;
    atomic_fetch_add(&t->bytes_sent, (uint64_t)n);
  }
  if (written < WG_FRAME_HEADER_SIZE + length) {
    kick = p->out_head == NULL;
    rc = enqueue_rest(t, p, hdr, payload, length, written);
  }
unlock:
  pthread_mutex_unlock(&p->out_lock);
  if (rc == WAGMA_EPEER && !atomic_load(&p->dead))
    peer_kill(t, dst, WAGMA_LOG_WARN,
              written > 0 ? "outbound queue overflow" : "send failed or queue overflow");
  else if (rc != 0 && written > 0)
    peer_kill(t, dst, WAGMA_LOG_ERROR, "out of memory with a frame half written");
  if (rc == 0 && kick)
    wake_progress(t);
  return rc;
}

static int matches(const wg_match_t *mt, const wg_frame_header_t *h) {
  return (mt->src == WG_ANY || mt->src == h->src) &&
         (mt->kinds == 0 || (h->kind < 64 && (mt->kinds & ((uint64_t)1 << h->kind)))) &&
         (mt->round == WG_ANY || mt->round == h->round) &&
         (mt->group == WG_ANY || mt->group == h->group) && (mt->seq == WG_ANY || mt->seq == h->seq);
}

static int tcp_recv(wg_transport_t *t, const wg_match_t *match, double deadline,
                    wg_message_t **out) {
  if (t == NULL || match == NULL || out == NULL)
    return WAGMA_EINVAL;
  *out = NULL;
  int src_rank = -1;
  if (match->src != WG_ANY) {
    if (match->src >= (uint64_t)t->nranks)
      return WAGMA_EINVAL;
    src_rank = (int)match->src;
  }
  struct timespec ts;
  double whole = floor(deadline);
  if (!(deadline < 1e15)) /* far future or NaN: wait "forever" (until close/interrupt) */
    whole = 1e15;
  ts.tv_sec = (time_t)whole;
  ts.tv_nsec = deadline < 1e15 ? (long)((deadline - whole) * 1e9) : 0;
  if (ts.tv_nsec >= 1000000000L)
    ts.tv_nsec = 999999999L;
  if (ts.tv_nsec < 0)
    ts.tv_nsec = 0;

  int rc = 0;
  double spin_until = 0;
  pthread_mutex_lock(&t->mbox_lock);
  for (;;) {
    if (t->interrupted || atomic_load(&t->closing)) {
      rc = WAGMA_ECLOSED;
      break;
    }
    wg_message_t *prev = NULL, *m = t->mbox_head;
    while (m != NULL && !matches(match, &m->header)) {
      prev = m;
      m = m->next;
    }
    if (m != NULL) {
      if (prev != NULL)
        prev->next = m->next;
      else
        t->mbox_head = m->next;
      if (t->mbox_tail == m)
        t->mbox_tail = prev;
      m->next = NULL;
      *out = m;
      break;
    }
    if (src_rank >= 0 && src_rank != t->rank && atomic_load(&t->peers[src_rank].dead)) {
      rc = WAGMA_EPEER;
      break;
    }
    double now = wg_now();
    if (now >= deadline) {
      rc = WAGMA_ETIMEDOUT;
      break;
    }
    /* Briefly yield instead of sleeping: on a busy host the progress thread usually delivers
     * the next frame within a few scheduler slices, and a condvar sleep adds a wake-up. */
    if (spin_until == 0)
      spin_until = now + RECV_SPIN_S;
    if (now < spin_until) {
      pthread_mutex_unlock(&t->mbox_lock);
      sched_yield();
      pthread_mutex_lock(&t->mbox_lock);
      continue;
    }
    pthread_cond_timedwait(&t->mbox_cond, &t->mbox_lock, &ts);
  }
  pthread_mutex_unlock(&t->mbox_lock);
  return rc;
}

static int tcp_peer_alive(wg_transport_t *t, int rank) {
  if (t == NULL || rank < 0 || rank >= t->nranks)
    return 0;
  if (rank == t->rank)
    return 1;
  return t->peers[rank].fd >= 0 && !atomic_load(&t->peers[rank].dead);
}

static void tcp_interrupt(wg_transport_t *t) {
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->mbox_lock);
  t->interrupted = 1;
  pthread_cond_broadcast(&t->mbox_cond);
  pthread_mutex_unlock(&t->mbox_lock);
}

static void tcp_stats(wg_transport_t *t, wg_transport_stats_t *out) {
  if (t == NULL || out == NULL)
    return;
  out->bytes_sent = atomic_load(&t->bytes_sent);
  out->bytes_received = atomic_load(&t->bytes_received);
  out->frames_rejected = atomic_load(&t->frames_rejected);
}

static void tcp_close(wg_transport_t *t) {
  if (t == NULL)
    return;
  /* An orderly goodbye, so peers log INFO rather than a lost connection. */
  atomic_store(&t->bye_sent, 1);
  for (int r = 0; r < t->nranks; r++) {
    if (r == t->rank || !tcp_peer_alive(t, r))
      continue;
    wg_frame_header_t bye = {.kind = WG_FRAME_BYE};
    tcp_send(t, r, &bye, NULL, 0);
  }
  pthread_mutex_lock(&t->mbox_lock);
  atomic_store(&t->closing, 1);
  pthread_cond_broadcast(&t->mbox_cond);
  pthread_mutex_unlock(&t->mbox_lock);
  wake_progress(t);
  if (t->thread_started)
    pthread_join(t->thread, NULL);
  tcp_free(t);
}

const wg_transport_ops_t wg_tcp_transport = {
    .name = "tcp",
    .open = tcp_open,
    .send = tcp_send,
    .recv = tcp_recv,
    .peer_alive = tcp_peer_alive,
    .interrupt = tcp_interrupt,
    .stats = tcp_stats,
    .close = tcp_close,
};
