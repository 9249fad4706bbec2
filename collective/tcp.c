/* tcp.c — the TCP transport (transport.h): progress thread, reader sessions, outbound
 * queues, mailbox.
 *
 * Owns: one socket per peer (connected by tcp_mesh.c during open), an epoll set, an eventfd
 * to wake the progress thread, an eventfd that interrupt and close write (it wakes reader
 * sessions), per-peer outbound queues and the mailbox of received frames.
 *
 * Threads: one progress thread reads the sockets nobody else reads (non-blocking, a
 * header-then-payload state machine per peer) and drains the outbound queues on EPOLLOUT.
 * Callers' threads enqueue frames (send) and take messages (recv). A caller may also become
 * the reader of some peers' sockets for a while (a reader session, reader_begin/_end: the
 * blocking collectives do, for the peers they receive from): its recv_into then reads the
 * socket of the peer it waits for itself and sleeps in ppoll on it, so a hop costs one
 * wake-up (the kernel wakes the caller) instead of two (progress thread, then the caller
 * through the mailbox condition variable), and a payload can go straight from the socket
 * into the caller's buffer (a sink).
 *
 * Invariants:
 *  - Every socket in peers[] completed the authenticated handshake of tcp_mesh.c as its rank.
 *  - A header is decoded and validated by wg_frame_decode (epoch, src < nranks, length <=
 *    max_payload) and its src must be the connection's rank, before the payload is allocated.
 *    A bad frame is counted in frames_rejected, logged, and its peer is declared dead. So a
 *    frame, a BYE included, only ever speaks for the rank whose connection carried it.
 *  - A peer's socket is read by one thread at a time: the holder of peers[r].reader (taken by
 *    compare-and-swap from WG_RD_FREE), which alone touches the inbound state machine. The
 *    progress thread takes it for one wake-up; a reader session keeps it until it lets go.
 *    While a session holds it, EPOLLIN is off in the epoll set (ev_lock guards the
 *    registration, computed from the state under the lock), so the progress thread is not
 *    woken for data it will not read. A reader stops only at a frame boundary of what it has
 *    read: every complete frame it read is delivered before it lets go, so data left in the
 *    kernel always shows as EPOLLIN to the next reader.
 *  - A peer's socket is written by one thread at a time, under out_lock: a sender writes
 *    directly only with an empty queue; the progress thread or a session writes the head of
 *    a non-empty queue. So frames leave in the order they were queued.
 *  - A dead peer is never revived in this epoch; its fd stays open (shut down) until close,
 *    so no fd number is reused under a concurrent sender or reader.
 *  - Dead flags change under mbox_lock before a broadcast, so condvar waiters never miss one;
 *    a session waiting on a socket is woken by the shutdown of a dead peer's socket and by
 *    intrfd.
 *  - recv without a reader yields the CPU for at most RECV_SPIN_S before it sleeps on the
 *    condvar; a session yields for at most SESSION_SPIN_S before it sleeps in ppoll. Both
 *    check interrupt, close and their deadline every turn.
 *  - close queues a BYE to each live peer and flushes queues for at most
 *    WG_TCP_CLOSE_LINGER_S, so a frozen peer cannot make close hang. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "tcp_internal.h"
#include "wagma/log_internal.h"

#define READ_BUDGET ((size_t)8 << 20) /* bytes read from one peer per wake-up, for fairness */
#define RECV_SPIN_S 100e-6            /* recv yields (sched_yield) this long before it sleeps */
#define SESSION_SPIN_S 100e-6 /* a session yields this long, trying its socket, before ppoll */
/* A session waiting on one peer reads its other peers too once it has waited this long, so
 * their frames for other threads wait at most about this. */
#define SESSION_GRACE_S 1e-3
/* An ended session leaves its sockets lingering this long: a collective that follows within it
 * takes them back with no epoll change and finds its peers' early frames still in the
 * kernel, with no progress-thread wake-up; frames for other threads wait at most this. */
#define LINGER_S 2e-3
#define SILENCE_CHECK_S 0.5 /* how often the progress thread looks for silent peers */
#define SCRATCH_SIZE                                                                               \
  ((size_t)64 << 10)                  /* read buffer of a reader: frames up to this in one         \
                                         read */
#define DIRECT_MIN (SCRATCH_SIZE / 2) /* a payload remainder this large is read in place */

static void reader_free(wg_reader_t *rd);
static int note_flush(struct wg_transport *t, int dst);

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

/* Brings fd's epoll registration in line with the state. Called with p->ev_lock held. */
static void ev_update(struct wg_transport *t, wg_tcp_peer_t *p) {
  if (p->ev_removed == 1)
    return;
  int r = atomic_load(&p->reader);
  int held = r == WG_RD_CALLER || r == WG_RD_LINGER;
  uint32_t want = (held ? 0 : EPOLLIN) | (p->ev_out ? EPOLLOUT : 0);
  struct epoll_event ev = {.events = want, .data.u32 = (uint32_t)p->rank};
  if (p->ev_removed == 2) {
    if (held)
      return; /* stays out while the caller reads; added back when it lets go */
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, p->fd, &ev) == 0) {
      p->ev_removed = 0;
      p->ev_mask = want;
    }
    return;
  }
  if (want != p->ev_mask && epoll_ctl(t->epfd, EPOLL_CTL_MOD, p->fd, &ev) == 0)
    p->ev_mask = want;
}

/* Progress thread: whether it wants EPOLLOUT for p. */
static void set_ev_out(struct wg_transport *t, wg_tcp_peer_t *p, int on) {
  if (p->ev_out == on) /* only this thread writes ev_out */
    return;
  pthread_mutex_lock(&p->ev_lock);
  p->ev_out = on;
  ev_update(t, p);
  pthread_mutex_unlock(&p->ev_lock);
}

/* Declares rank dead (idempotent): shuts its socket down (the fd stays open until close; the
 * progress thread frees its queue, since it may be writing from the head), wakes recv
 * waiters (a session waiting on the socket wakes from the shutdown). Callable from any
 * thread. */
static void peer_kill_as(struct wg_transport *t, int rank, int level, const char *why, int silent) {
  wg_tcp_peer_t *p = &t->peers[rank];
  pthread_mutex_lock(&p->out_lock);
  if (!atomic_load(&p->dead)) { /* (every death is set under out_lock, but the open's) */
    atomic_store(&p->silent, silent);
    atomic_store(&p->dead_ns, (uint_fast64_t)(wg_now() * 1e9));
  }
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

static void peer_kill(struct wg_transport *t, int rank, int level, const char *why) {
  peer_kill_as(t, rank, level, why, 0);
}

/* The socket of rank failed with errno err (what: where, or NULL): silent
 * (tcp_peer_unreachable) when keepalive probes went unanswered (ETIMEDOUT) or no route leads
 * there; closed otherwise (reset, broken pipe: its process is gone). */
static void peer_lost(struct wg_transport *t, int rank, int level, int err, const char *what) {
  int silent = err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH || err == EHOSTDOWN ||
               err == ENETDOWN;
  char why[160];
  snprintf(why, sizeof why, "%s%s%s", what ? what : "", what ? ": " : "", strerror(err));
  peer_kill_as(t, rank, level, why, silent);
}

/* A bad frame from rank (any reader). */
static void reject(struct wg_transport *t, int rank, const char *why) {
  atomic_fetch_add(&t->frames_rejected, 1);
  peer_kill(t, rank, WAGMA_LOG_WARN, why);
}

/* ------------------------------------------------------------------------------------------
 * Inbound: the reader of a socket (the progress thread, or a session) runs these.
 * ---------------------------------------------------------------------------------------- */

/* What a reader does with complete frames: the one its caller waits for (want, matched
 * first) goes to the caller, through the sink when its length fits; the rest to the
 * mailbox. The progress thread wants nothing. */
typedef struct rd_ctx {
  uint8_t *scratch; /* SCRATCH_SIZE bytes */
  const wg_match_t *want;
  const wg_sink_t *sink;
  int found;         /* the wanted frame is complete */
  wg_message_t *msg; /* it, unless its payload went to the sink (then NULL) */
} rd_ctx_t;

/* A complete frame from p. */
static void frame_complete(struct wg_transport *t, wg_tcp_peer_t *p, rd_ctx_t *ctx) {
  wg_message_t *m = p->in_msg;
  int sunk = p->in_sink != NULL;
  p->in_big = m->header.length >= DIRECT_MIN;
  p->in_msg = NULL;
  p->in_sink = NULL;
  p->in_payload_got = 0;
  p->in_tag_phase = 0;
  atomic_fetch_add(&t->bytes_received,
                   WG_FRAME_HEADER_SIZE + m->header.length + (t->sealed ? WG_SEAL_TAG_LEN : 0));
  if (m->header.kind == WG_FRAME_BYE) {
    wg_message_free(m);
    peer_kill(t, p->rank, WAGMA_LOG_INFO, "closed (BYE)");
    return;
  }
  if (sunk) {
    ctx->found = 1;
    wg_message_free(m); /* the header only: its payload is in the sink */
    return;
  }
  if (ctx->want != NULL && !ctx->found && wg_match_frame(ctx->want, &m->header)) {
    ctx->found = 1;
    ctx->msg = m;
    return;
  }
  mailbox_put(t, m);
}

/* p's current frame has its whole payload: complete, or, sealed, its tag comes next. */
static void payload_complete(struct wg_transport *t, wg_tcp_peer_t *p, rd_ctx_t *ctx) {
  if (!t->sealed) {
    frame_complete(t, p, ctx);
    return;
  }
  p->in_tag_phase = 1;
  p->in_tag_got = 0;
}

/* Sealed: the tag of p's current frame is complete: opens the payload in place (decrypts,
 * and checks header and payload) and completes the frame. Returns 0 or -1 (peer killed: an
 * altered, forged, replayed or reordered frame). */
static int tag_complete(struct wg_transport *t, wg_tcp_peer_t *p, rd_ctx_t *ctx) {
  uint8_t *payload = p->in_sink != NULL ? p->in_sink : p->in_msg->payload;
  int rc =
      wg_seal_open_frame(&p->seal, p->in_hdr, payload, (size_t)p->in_msg->header.length, p->in_tag);
  if (rc != 0) {
    reject(t, p->rank,
           rc == WAGMA_EPROTO ? "sealed frame failed authentication (altered, forged or "
                                "replayed on the way)"
                              : "cannot open a sealed frame (libcrypto)");
    return -1;
  }
  frame_complete(t, p, ctx);
  return 0;
}

/* Validates a complete header and starts its frame. Returns 0 or -1 (peer killed). */
static int header_complete(struct wg_transport *t, wg_tcp_peer_t *p, rd_ctx_t *ctx) {
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
  int sink = ctx->sink != NULL && !ctx->found && h.length > 0 && h.length == ctx->sink->length &&
             wg_match_frame(ctx->want, &h);
  wg_message_t *m = wg_message_new(&h, sink ? 0 : (size_t)h.length);
  if (m == NULL) {
    peer_kill(t, p->rank, WAGMA_LOG_ERROR, "out of memory for a frame payload");
    return -1;
  }
  p->in_msg = m;
  p->in_payload_got = 0;
  p->in_sink = sink ? ctx->sink->dst : NULL;
  p->in_tag_phase = 0;
  if (h.length == 0)
    payload_complete(t, p, ctx);
  return 0;
}

/* Moves what *data holds of the want - *got bytes part still lacks into part, advancing *data
 * and *n. Returns 1 when part is complete. */
static int fill_part(uint8_t *part, size_t *got, size_t want, const uint8_t **data, size_t *n) {
  size_t take = want - *got;
  if (take > *n)
    take = *n;
  memcpy(part + *got, *data, take);
  *got += take;
  *data += take;
  *n -= take;
  return *got == want;
}

/* Feeds n bytes read from p's socket through the state machine. Returns 0 or -1 (killed). */
static int consume(struct wg_transport *t, wg_tcp_peer_t *p, rd_ctx_t *ctx, const uint8_t *data,
                   size_t n) {
  while (n > 0) {
    if (p->in_msg == NULL) {
      if (fill_part(p->in_hdr, &p->in_hdr_got, WG_FRAME_HEADER_SIZE, &data, &n) &&
          header_complete(t, p, ctx) != 0)
        return -1;
    } else if (p->in_tag_phase) {
      if (fill_part(p->in_tag, &p->in_tag_got, WG_SEAL_TAG_LEN, &data, &n) &&
          tag_complete(t, p, ctx) != 0)
        return -1;
    } else {
      size_t len = (size_t)p->in_msg->header.length, take = len - p->in_payload_got;
      if (take > n)
        take = n;
      uint8_t *dst = p->in_sink != NULL ? p->in_sink : p->in_msg->payload;
      memcpy(dst + p->in_payload_got, data, take);
      p->in_payload_got += take;
      data += take;
      n -= take;
      if (p->in_payload_got == len)
        payload_complete(t, p, ctx);
    }
  }
  return 0;
}

/* The holder of p's reader role reads what the socket has, up to READ_BUDGET bytes, and
 * stops early once ctx's wanted frame is complete. Returns 1 if the socket may have more
 * (budget spent or wanted frame found), 0 if it would block or the peer is dead. */
static int read_peer(struct wg_transport *t, wg_tcp_peer_t *p, rd_ctx_t *ctx) {
  size_t budget = READ_BUDGET;
  while (!atomic_load(&p->dead)) {
    if (ctx->found || budget == 0)
      return 1;
    uint8_t *dst = ctx->scratch;
    size_t want = SCRATCH_SIZE;
    int direct = 0;
    if (p->in_msg == NULL && p->in_big) {
      /* Frames from p are large: the header alone, so the payload is read in place rather
       * than half through the scratch buffer and copied. */
      dst = ctx->scratch;
      want = WG_FRAME_HEADER_SIZE - p->in_hdr_got;
    } else if (p->in_msg != NULL && !p->in_tag_phase) {
      size_t rest = (size_t)p->in_msg->header.length - p->in_payload_got;
      if (rest >= DIRECT_MIN) { /* a large remainder: read it in place, no copy */
        dst = (p->in_sink != NULL ? p->in_sink : p->in_msg->payload) + p->in_payload_got;
        want = rest;
        direct = 1;
      }
    }
    if (want > budget)
      want = budget;
    ssize_t n = recv(p->fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    if (n <= 0) {
      if (p->in_msg != NULL || p->in_hdr_got > 0) {
        atomic_fetch_add(&t->frames_rejected, 1);
        if (n < 0)
          peer_lost(t, p->rank, WAGMA_LOG_WARN, errno, "connection lost inside a frame");
        else
          peer_kill(t, p->rank, WAGMA_LOG_WARN, "connection lost inside a frame (truncated)");
      } else {
        /* While closing, a peer that got our BYE shuts down its side: that is expected. */
        int level = atomic_load(&t->bye_sent) ? WAGMA_LOG_DEBUG : WAGMA_LOG_WARN;
        if (n == 0)
          peer_kill(t, p->rank, level, "connection closed");
        else
          peer_lost(t, p->rank, level, errno, NULL);
      }
      return 0;
    }
    budget -= (size_t)n;
    if (direct) {
      p->in_payload_got += (size_t)n;
      if (p->in_payload_got == p->in_msg->header.length)
        payload_complete(t, p, ctx);
    } else if (consume(t, p, ctx, dst, (size_t)n) != 0) {
      return 0;
    }
  }
  return 0;
}

/* A session's recv_into returns while a frame of p is half read into its sink: the part
 * read moves into a payload buffer of its own, so the caller's buffer is free again. */
static void unsink(struct wg_transport *t, wg_tcp_peer_t *p) {
  if (p->in_sink == NULL)
    return;
  uint8_t *payload = wg_buf_alloc((size_t)p->in_msg->header.length);
  if (payload == NULL) {
    p->in_sink = NULL;
    peer_kill(t, p->rank, WAGMA_LOG_ERROR, "out of memory for a frame payload");
    return;
  }
  memcpy(payload, p->in_sink, p->in_payload_got);
  p->in_msg->payload = payload;
  p->in_sink = NULL;
}

/* Progress thread: p's socket is readable (or failed). */
static void on_readable(struct wg_transport *t, wg_tcp_peer_t *p, uint32_t events) {
  int expected = WG_RD_FREE;
  if (!atomic_compare_exchange_strong(&p->reader, &expected, WG_RD_PROGRESS)) {
    /* A session reads it: an event from before EPOLLIN went off, or an error/hang-up (always
     * reported): take the fd out of the set until the session lets go, so it cannot spin. */
    pthread_mutex_lock(&p->ev_lock);
    int r = atomic_load(&p->reader);
    if ((events & (EPOLLERR | EPOLLHUP)) && p->ev_removed == 0 &&
        (r == WG_RD_CALLER || r == WG_RD_LINGER)) {
      if (epoll_ctl(t->epfd, EPOLL_CTL_DEL, p->fd, NULL) == 0)
        p->ev_removed = 2;
    } else {
      ev_update(t, p);
    }
    pthread_mutex_unlock(&p->ev_lock);
    return;
  }
  rd_ctx_t ctx = {.scratch = t->scratch};
  read_peer(t, p, &ctx);
  atomic_store(&p->reader, WG_RD_FREE);
  if (atomic_exchange(&p->claim_waiting, 0)) { /* a session waits to take it */
    pthread_mutex_lock(&t->mbox_lock);
    pthread_cond_broadcast(&t->mbox_cond);
    pthread_mutex_unlock(&t->mbox_lock);
  }
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Makes timerfd fire by at_ns (any thread); with push, also moves it later to at_ns when it
 * would fire more than a quarter of LINGER_S earlier: while collectives follow each other the
 * timer never fires (it used to wake the progress thread every LINGER_S, which showed in the
 * latency tail), for one timerfd_settime per LINGER_S / 4 at most. */
static void linger_arm(struct wg_transport *t, uint64_t at_ns, int push) {
  pthread_mutex_lock(&t->linger_lock);
  uint64_t armed = t->timer_armed_ns;
  if (armed == 0 || armed > at_ns || (push && at_ns - armed > (uint64_t)(LINGER_S * 1e9 / 4))) {
    struct itimerspec its = {.it_value = {.tv_sec = (time_t)(at_ns / 1000000000u),
                                          .tv_nsec = (long)(at_ns % 1000000000u)}};
    if (timerfd_settime(t->timerfd, TFD_TIMER_ABSTIME, &its, NULL) == 0)
      t->timer_armed_ns = at_ns;
  }
  pthread_mutex_unlock(&t->linger_lock);
}

/* A lingering socket back to the progress thread (EPOLLIN on: what came meanwhile wakes it
 * now), unless a session took it back first; wakes threads waiting to claim it. Any thread. */
static void take_back(struct wg_transport *t, wg_tcp_peer_t *p) {
  int expected = WG_RD_LINGER;
  if (!atomic_compare_exchange_strong(&p->reader, &expected, WG_RD_FREE))
    return; /* a session took it back */
  pthread_mutex_lock(&p->ev_lock);
  ev_update(t, p);
  pthread_mutex_unlock(&p->ev_lock);
  if (atomic_exchange(&p->claim_waiting, 0)) {
    pthread_mutex_lock(&t->mbox_lock);
    pthread_cond_broadcast(&t->mbox_cond);
    pthread_mutex_unlock(&t->mbox_lock);
  }
}

/* Progress thread, timerfd fired: takes back the sockets whose linger has passed (EPOLLIN on:
 * what came meanwhile wakes it now) and arms the timer for the others. */
static void on_timer(struct wg_transport *t) {
  uint64_t v;
  ssize_t rn = read(t->timerfd, &v, sizeof v);
  (void)rn;
  pthread_mutex_lock(&t->linger_lock);
  t->timer_armed_ns = 0;
  pthread_mutex_unlock(&t->linger_lock);
  uint64_t now = now_ns(), next = 0;
  for (int r = 0; r < t->nranks; r++) {
    wg_tcp_peer_t *p = &t->peers[r];
    if (atomic_load(&p->reader) != WG_RD_LINGER)
      continue;
    uint64_t until = atomic_load(&p->linger_until_ns);
    if (until > now) {
      if (next == 0 || until < next)
        next = until;
      continue;
    }
    take_back(t, p);
  }
  if (next != 0)
    linger_arm(t, next, 0);
}

/* Progress thread, every SILENCE_CHECK_S: a live peer whose kernel has acknowledged nothing
 * for WG_TCP_SILENCE_S while data of ours waits for its acknowledgement (retransmissions into
 * a cut link) is unreachable: killed as silent. tcp(7) TCP_INFO: tcpi_last_ack_recv is the
 * time since the last ACK of any kind, the answers to zero-window probes included, so a
 * stopped peer whose receive buffer is full is not silent (TCP_USER_TIMEOUT is not used for
 * this: since Linux 5.11 it also ends a connection whose peer answers those probes with a
 * zero window, which made a SIGSTOPped member look cut off). An idle connection is watched by
 * keepalive (tcp_mesh.c): unanswered probes fail it with ETIMEDOUT (peer_lost). */
static void check_silence(struct wg_transport *t) {
  for (int r = 0; r < t->nranks; r++) {
    wg_tcp_peer_t *p = &t->peers[r];
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    if (r == t->rank || p->fd < 0 || atomic_load(&p->dead) ||
        getsockopt(p->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
      continue;
    if (ti.tcpi_unacked > 0 && ti.tcpi_last_ack_recv >= WG_TCP_SILENCE_S * 1000u) {
      char why[128];
      snprintf(why, sizeof why, "no acknowledgement for %.1f s with data in flight (cut off)",
               ti.tcpi_last_ack_recv / 1000.0);
      peer_kill_as(t, r, WAGMA_LOG_WARN, why, 1);
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

/* Writes queued frames to p until the queue is empty or the socket full (any thread).
 * Returns 0 (queue empty), 1 (socket full, more queued) or -1 (peer killed or dead). */
static int flush_queue(struct wg_transport *t, wg_tcp_peer_t *p) {
  int rc = 0, err = 0;
  pthread_mutex_lock(&p->out_lock);
  for (;;) {
    wg_out_frame_t *f = p->out_head;
    if (f == NULL)
      break;
    if (atomic_load(&p->dead)) {
      rc = -1;
      break;
    }
    struct iovec iov = {.iov_base = f->data + p->out_head_off, .iov_len = f->len - p->out_head_off};
    ssize_t n = write_nonblocking(p->fd, &iov, 1);
    if (n < 0) {
      rc = -2;
      err = errno;
      break;
    }
    atomic_fetch_add(&t->bytes_sent, (uint64_t)n);
    p->out_head_off += (size_t)n;
    p->out_queued -= (size_t)n;
    if (p->out_head_off < f->len) {
      rc = 1; /* socket full */
      break;
    }
    p->out_head = f->next;
    if (p->out_head == NULL)
      p->out_tail = NULL;
    p->out_head_off = 0;
    wg_buf_free(f);
  }
  pthread_mutex_unlock(&p->out_lock);
  if (rc == -2) {
    peer_lost(t, p->rank, WAGMA_LOG_WARN, err, NULL);
    rc = -1;
  }
  return rc;
}

static int queue_empty(wg_tcp_peer_t *p) {
  pthread_mutex_lock(&p->out_lock);
  int empty = p->out_head == NULL;
  pthread_mutex_unlock(&p->out_lock);
  return empty;
}

/* Progress thread: writes p's queue; waits for EPOLLOUT while the socket is full. */
static void on_writable(struct wg_transport *t, wg_tcp_peer_t *p) {
  set_ev_out(t, p, flush_queue(t, p) == 1);
}

/* Progress thread: after a wake-up, write the peers with queued frames and drop the fds of
 * dead peers from the epoll set. Returns the bytes still queued over all peers. */
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
      pthread_mutex_lock(&p->ev_lock);
      if (p->ev_removed != 1) {
        if (p->ev_removed == 0)
          epoll_ctl(t->epfd, EPOLL_CTL_DEL, p->fd, NULL);
        p->ev_removed = 1; /* for good */
      }
      pthread_mutex_unlock(&p->ev_lock);
      continue;
    }
    if (!p->ev_out && !queue_empty(p))
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
  const uint32_t wake_id = (uint32_t)t->nranks, timer_id = wake_id + 1;
  double next_check = wg_now() + SILENCE_CHECK_S;
  for (;;) {
    int timeout_ms = (int)(SILENCE_CHECK_S * 1000);
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
    if (!atomic_load(&t->closing) && wg_now() >= next_check) {
      check_silence(t);
      next_check = wg_now() + SILENCE_CHECK_S;
    }
    for (int i = 0; i < n; i++) {
      uint32_t id = events[i].data.u32;
      if (id == timer_id) {
        on_timer(t);
        continue;
      }
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
        on_readable(t, p, events[i].events);
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
    wg_seal_free(&p->seal);
    pthread_mutex_destroy(&p->out_lock);
    pthread_mutex_destroy(&p->ev_lock);
  }
  free(t->peers);
  free(t->scratch);
  reader_free(atomic_load(&t->spare_reader));
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
  if (t->intrfd >= 0)
    close(t->intrfd);
  if (t->timerfd >= 0)
    close(t->timerfd);
  pthread_mutex_destroy(&t->linger_lock);
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
      auth->secret_len > (size_t)INT_MAX || (auth->seal && auth->secret == NULL))
    return WAGMA_EINVAL; /* sealing keys come from the secret */
  *out = NULL;
  t = calloc(1, sizeof *t);
  if (t == NULL)
    return WAGMA_ENOMEM;
  t->epfd = t->wakefd = t->intrfd = t->timerfd = -1;
  pthread_mutex_init(&t->linger_lock, NULL);
  t->rank = cfg->rank;
  t->nranks = cfg->plan->nranks;
  t->epoch = cfg->epoch;
  t->listen_fd = cfg->use_listen_fd ? cfg->listen_fd : -1;
  t->max_payload = cfg->max_payload ? cfg->max_payload : WG_TCP_DEFAULT_MAX_PAYLOAD;
  t->max_queued = cfg->max_queued_bytes ? cfg->max_queued_bytes : WG_TCP_DEFAULT_MAX_QUEUED;
  t->connect_timeout_s =
      cfg->connect_timeout_s > 0 ? cfg->connect_timeout_s : WG_TCP_DEFAULT_CONNECT_S;
  t->log = cfg->log;
  t->log_user = cfg->log_user;
  t->sealed = auth->seal != 0;
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
    pthread_mutex_init(&t->peers[r].ev_lock, NULL);
  }
  t->scratch = malloc(SCRATCH_SIZE);
  if (t->scratch == NULL) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  t->epfd = epoll_create1(EPOLL_CLOEXEC);
  t->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  t->intrfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  t->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (t->epfd < 0 || t->wakefd < 0 || t->intrfd < 0 || t->timerfd < 0) {
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
  struct epoll_event tev = {.events = EPOLLIN, .data.u32 = (uint32_t)t->nranks + 1};
  if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wakefd, &ev) != 0 ||
      epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->timerfd, &tev) != 0) {
    rc = WAGMA_EIO;
    goto out;
  }
  int missing = 0;
  for (int r = 0; r < t->nranks; r++) {
    wg_tcp_peer_t *p = &t->peers[r];
    if (r == t->rank)
      continue;
    if (p->fd < 0) {
      /* Never connected. Unreachable (tcp_peer_unreachable) only when I dialed it and no
       * dial got a TCP connection (no route, SYNs unanswered); a rank that connects to me, or
       * answered but did not complete the handshake (late, frozen, another secret), may be
       * anything. */
      atomic_store(&p->silent, r < t->rank && !p->dialed_tcp);
      atomic_store(&p->dead_ns, (uint_fast64_t)(wg_now() * 1e9));
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
    p->ev_mask = EPOLLIN;
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
  uint8_t *sealed = NULL; /* sealed: the encrypted payload and its tag, sent in its place */
  int nonce_used = 0;     /* a frame was sealed: it must go out, or the stream is broken */
  int send_err = 0;       /* the socket's errno when the direct write failed */
  pthread_mutex_lock(&p->out_lock);
  if (atomic_load(&p->dead)) {
    rc = WAGMA_EPEER;
    goto unlock;
  }
  if (t->sealed) {
    /* Under out_lock: frames are sealed in the order they go out (the nonce counts them). */
    sealed = wg_buf_alloc(length + WG_SEAL_TAG_LEN);
    if (sealed == NULL) {
      rc = WAGMA_ENOMEM;
      goto unlock;
    }
    if (wg_seal_frame(&p->seal, hdr, payload, length, sealed, sealed + length) != 0) {
      rc = WAGMA_EIO;
      goto unlock;
    }
    nonce_used = 1;
    payload = sealed;
    length += WG_SEAL_TAG_LEN; /* what follows the header on the wire */
  }
  if (p->out_head == NULL) {
    /* Nothing queued: try the socket now, so most frames never wait for the progress thread
     * and are never copied. */
    struct iovec iov[2] = {{.iov_base = hdr, .iov_len = sizeof hdr},
                           {.iov_base = (void *)payload, .iov_len = length}};
    ssize_t n = write_nonblocking(p->fd, iov, length > 0 ? 2 : 1);
    if (n < 0) {
      send_err = errno;
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
  wg_buf_free(sealed);
  if (rc == WAGMA_EPEER && send_err && !atomic_load(&p->dead))
    peer_lost(t, dst, WAGMA_LOG_WARN, send_err, "send failed");
  else if (rc == WAGMA_EPEER && !atomic_load(&p->dead))
    peer_kill(t, dst, WAGMA_LOG_WARN,
              written > 0 ? "outbound queue overflow" : "send failed or queue overflow");
  else if (rc != 0 && (written > 0 || nonce_used))
    peer_kill(t, dst, WAGMA_LOG_ERROR,
              written > 0 ? "out of memory with a frame half written"
                          : "out of memory with a sealed frame (its nonce is spent)");
  /* A reader session of this thread writes the rest itself while it waits (or hands it to
   * the progress thread when it ends): no wake-up of the progress thread for it. */
  if (rc == 0 && kick && !note_flush(t, dst))
    wake_progress(t);
  return rc;
}

/* ------------------------------------------------------------------------------------------
 * Reader sessions
 * ---------------------------------------------------------------------------------------- */

#define FLUSH_MAX 8 /* peers whose queue a session writes itself */

struct wg_reader {
  struct wg_transport *t;
  int cap; /* entries the arrays below hold */
  int n;
  int *ranks;
  uint8_t *held;      /* held[i]: this session reads ranks[i]'s socket */
  struct pollfd *pfd; /* cap + 1 + FLUSH_MAX entries */
  int *pfd_idx;       /* pfd[k]: index in ranks, -1 intrfd, -2 - rank a peer in flush[] */
  uint8_t *scratch;   /* SCRATCH_SIZE bytes */
  /* Peers whose outbound queue this session's own sends left non-empty: it writes them while
   * it waits, and wakes the progress thread for what is left when it ends. */
  int nflush;
  int flush[FLUSH_MAX];
};

/* The reader session of the calling thread, if it has one (sends consult it). */
static _Thread_local wg_reader_t *tls_reader;

/* tcp_send from this thread left dst's queue non-empty: 1 if this thread's session takes
 * care of writing it (then the progress thread is not woken). */
static int note_flush(struct wg_transport *t, int dst) {
  wg_reader_t *rd = tls_reader;
  if (rd == NULL || rd->t != t)
    return 0;
  for (int i = 0; i < rd->nflush; i++)
    if (rd->flush[i] == dst)
      return 1;
  if (rd->nflush == FLUSH_MAX)
    return 0;
  rd->flush[rd->nflush++] = dst;
  return 1;
}

/* Writes the queues of the session's own frames; forgets the peers whose queue emptied. */
static void flush_own(struct wg_transport *t, wg_reader_t *rd) {
  for (int i = 0; i < rd->nflush;) {
    if (flush_queue(t, &t->peers[rd->flush[i]]) == 1) {
      i++;
      continue;
    }
    rd->flush[i] = rd->flush[--rd->nflush]; /* empty, or dead */
  }
}

/* Hands what the session's own sends left queued to the progress thread. */
static void flush_handoff(struct wg_transport *t, wg_reader_t *rd) {
  if (rd->nflush == 0)
    return;
  flush_own(t, rd);
  if (rd->nflush > 0)
    wake_progress(t);
  rd->nflush = 0;
}

static void reader_free(wg_reader_t *rd) {
  if (rd == NULL)
    return;
  free(rd->scratch);
  free(rd);
}

/* A reader for n peers: the transport's spare one when it is large enough. One block for the
 * arrays; the scratch buffer apart. */
static wg_reader_t *reader_alloc(struct wg_transport *t, int n) {
  wg_reader_t *rd = atomic_exchange(&t->spare_reader, NULL);
  if (rd != NULL && rd->cap >= n)
    return rd;
  reader_free(rd);
  int cap = n < 8 ? 8 : n;
  size_t k = (size_t)cap + 1 + FLUSH_MAX;
  size_t size = sizeof *rd + k * (sizeof(struct pollfd) + 2 * sizeof(int) + 1);
  rd = calloc(1, size);
  uint8_t *scratch = malloc(SCRATCH_SIZE);
  if (rd == NULL || scratch == NULL) {
    free(rd);
    free(scratch);
    return NULL;
  }
  rd->cap = cap;
  rd->scratch = scratch;
  rd->pfd = (struct pollfd *)(rd + 1);
  rd->ranks = (int *)(rd->pfd + k);
  rd->pfd_idx = rd->ranks + k;
  rd->held = (uint8_t *)(rd->pfd_idx + k);
  return rd;
}

/* Takes ranks[i]'s socket for the session if nobody reads it now (free, or lingering after
 * an earlier session). Returns 1 if held. */
static int hold(struct wg_transport *t, wg_reader_t *rd, int i) {
  if (rd->held[i])
    return 1;
  wg_tcp_peer_t *p = &t->peers[rd->ranks[i]];
  if (p->fd < 0 || atomic_load(&p->dead))
    return 0;
  int expected = WG_RD_LINGER;
  if (atomic_compare_exchange_strong(&p->reader, &expected, WG_RD_CALLER)) {
    rd->held[i] = 1; /* EPOLLIN is off already */
    return 1;
  }
  expected = WG_RD_FREE;
  if (!atomic_compare_exchange_strong(&p->reader, &expected, WG_RD_CALLER)) {
    atomic_store(&p->claim_waiting, 1); /* the progress thread reads it: wake me after */
    return 0;
  }
  pthread_mutex_lock(&p->ev_lock);
  ev_update(t, p); /* EPOLLIN off: the progress thread is not woken for it any more */
  pthread_mutex_unlock(&p->ev_lock);
  rd->held[i] = 1;
  return 1;
}

/* Leaves ranks[i]'s socket lingering until until_ns: the next session takes it back as is;
 * else the progress thread does when the timer fires. */
static void let_go(struct wg_transport *t, wg_reader_t *rd, int i, uint64_t until_ns) {
  if (!rd->held[i])
    return;
  wg_tcp_peer_t *p = &t->peers[rd->ranks[i]];
  unsink(t, p);
  atomic_store(&p->linger_until_ns, until_ns);
  atomic_store(&p->reader, WG_RD_LINGER);
  rd->held[i] = 0;
}

static int tcp_reader_begin(wg_transport_t *t, const int *ranks, int n, wg_reader_t **out) {
  if (t == NULL || out == NULL || n < 0 || (n > 0 && ranks == NULL))
    return WAGMA_EINVAL;
  *out = NULL;
  wg_reader_t *rd = reader_alloc(t, n);
  if (rd == NULL)
    return WAGMA_ENOMEM;
  rd->t = t;
  rd->n = 0;
  rd->nflush = 0;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= t->nranks || ranks[i] == t->rank)
      continue;
    int dup = 0;
    for (int j = 0; j < rd->n && !dup; j++)
      dup = rd->ranks[j] == ranks[i];
    if (!dup) {
      rd->held[rd->n] = 0;
      rd->ranks[rd->n++] = ranks[i];
    }
  }
  for (int i = 0; i < rd->n; i++)
    hold(t, rd, i);
  if (tls_reader == NULL)
    tls_reader = rd;
  *out = rd;
  return 0;
}

/* Ends a session: its sockets linger LINGER_S (reader_end), or go back to the progress thread
 * at once (release: frames for other threads are read now, not after the linger). */
static void reader_finish(wg_transport_t *t, wg_reader_t *rd, int release) {
  if (t == NULL || rd == NULL)
    return;
  if (tls_reader == rd)
    tls_reader = NULL;
  flush_handoff(t, rd);
  uint64_t until = now_ns() + (release ? 0 : (uint64_t)(LINGER_S * 1e9));
  int any = 0;
  for (int i = 0; i < rd->n; i++) {
    int held = rd->held[i];
    any |= held;
    let_go(t, rd, i, until);
    if (held && release)
      take_back(t, &t->peers[rd->ranks[i]]);
  }
  if (any && !release)
    linger_arm(t, until, 1);
  void *none = NULL;
  if (!atomic_compare_exchange_strong(&t->spare_reader, &none, (void *)rd))
    reader_free(rd);
}

static void tcp_reader_end(wg_transport_t *t, wg_reader_t *rd) {
  reader_finish(t, rd, 0);
}

static void tcp_reader_release(wg_transport_t *t, wg_reader_t *rd) {
  reader_finish(t, rd, 1);
}

/* A session waits (ppoll) on the socket of ranks[idx], the one its recv wants, until it is
 * readable, deadline, or an interrupt; it writes its peers' queues when their sockets take
 * more, and reads its other peers' sockets once it has waited SESSION_GRACE_S (their frames
 * go to the mailbox). */
static void session_wait(struct wg_transport *t, wg_reader_t *rd, int idx, double deadline,
                         double since) {
  double now = wg_now();
  int all = now - since >= SESSION_GRACE_S;
  double until = all ? deadline : fmin(deadline, since + SESSION_GRACE_S);
  int k = 0;
  rd->pfd[k] = (struct pollfd){.fd = t->intrfd, .events = POLLIN};
  rd->pfd_idx[k++] = -1;
  for (int i = 0; i < rd->n; i++) {
    if (!rd->held[i])
      continue;
    wg_tcp_peer_t *p = &t->peers[rd->ranks[i]];
    if (atomic_load(&p->dead))
      continue;
    short ev = (i == idx || all) ? POLLIN : 0;
    if (!queue_empty(p))
      ev |= POLLOUT;
    if (ev == 0)
      continue;
    rd->pfd[k] = (struct pollfd){.fd = p->fd, .events = ev};
    rd->pfd_idx[k++] = i;
  }
  for (int j = 0; j < rd->nflush; j++) { /* my own frames to peers I do not read */
    int r = rd->flush[j], in = 0;
    for (int i = 0; i < rd->n && !in; i++)
      in = rd->held[i] && rd->ranks[i] == r;
    if (in || atomic_load(&t->peers[r].dead))
      continue;
    rd->pfd[k] = (struct pollfd){.fd = t->peers[r].fd, .events = POLLOUT};
    rd->pfd_idx[k++] = -2 - r;
  }
  double left = until - now;
  if (left < 0)
    left = 0;
  if (left > 3600)
    left = 3600;
  struct timespec ts = {.tv_sec = (time_t)left, .tv_nsec = (long)((left - floor(left)) * 1e9)};
  int n = ppoll(rd->pfd, (nfds_t)k, &ts, NULL);
  if (n <= 0)
    return;
  for (int j = 1; j < k; j++) {
    short re = rd->pfd[j].revents;
    if (re == 0)
      continue;
    int i = rd->pfd_idx[j];
    if (i <= -2) {
      flush_queue(t, &t->peers[-2 - i]);
      continue;
    }
    wg_tcp_peer_t *p = &t->peers[rd->ranks[i]];
    if (re & POLLOUT)
      flush_queue(t, p);
    if (i != idx && (re & (POLLIN | POLLERR | POLLHUP))) {
      rd_ctx_t ctx = {.scratch = rd->scratch};
      read_peer(t, p, &ctx); /* into the mailbox */
    }
  }
}

/* Waits on the mailbox condition variable until ts (or shorter when given). Called with
 * mbox_lock held. */
static void cond_wait_until(struct wg_transport *t, const struct timespec *ts, double short_s) {
  if (short_s > 0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double until = (double)now.tv_sec + now.tv_nsec * 1e-9 + short_s;
    double lim = (double)ts->tv_sec + ts->tv_nsec * 1e-9;
    if (until < lim) {
      struct timespec s2 = {.tv_sec = (time_t)floor(until),
                            .tv_nsec = (long)((until - floor(until)) * 1e9)};
      pthread_cond_timedwait(&t->mbox_cond, &t->mbox_lock, &s2);
      return;
    }
  }
  pthread_cond_timedwait(&t->mbox_cond, &t->mbox_lock, ts);
}

/* Takes the oldest mailbox message matching; called with mbox_lock held. */
static wg_message_t *mailbox_take(struct wg_transport *t, const wg_match_t *match) {
  wg_message_t *prev = NULL, *m = t->mbox_head;
  while (m != NULL && !wg_match_frame(match, &m->header)) {
    prev = m;
    m = m->next;
  }
  if (m == NULL)
    return NULL;
  if (prev != NULL)
    prev->next = m->next;
  else
    t->mbox_head = m->next;
  if (t->mbox_tail == m)
    t->mbox_tail = prev;
  m->next = NULL;
  return m;
}

/* The caller took m for recv_into: into the sink, or out. */
static int hand_over(wg_message_t *m, const wg_sink_t *sink, wg_message_t **out) {
  if (sink == NULL) {
    *out = m;
    return 0;
  }
  int rc = 0;
  if (m->header.length != sink->length)
    rc = WAGMA_EPROTO;
  else if (sink->length > 0)
    memcpy(sink->dst, m->payload, sink->length);
  wg_message_free(m);
  return rc;
}

static int tcp_recv_into(wg_transport_t *t, wg_reader_t *rd, const wg_match_t *match,
                         double deadline, const wg_sink_t *sink, wg_message_t **out) {
  if (t == NULL || match == NULL || out == NULL || (sink && sink->length > 0 && !sink->dst))
    return WAGMA_EINVAL;
  *out = NULL;
  int src_rank = -1;
  if (match->src != WG_ANY) {
    if (match->src >= (uint64_t)t->nranks)
      return WAGMA_EINVAL;
    src_rank = (int)match->src;
  }
  int idx = -1; /* the session's entry of src, when it has one */
  for (int i = 0; rd != NULL && src_rank >= 0 && i < rd->n && idx < 0; i++)
    if (rd->ranks[i] == src_rank)
      idx = i;
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
  double spin_until = 0, wait_since = 0;
  wg_tcp_peer_t *p = src_rank >= 0 ? &t->peers[src_rank] : NULL;
  for (;;) {
    int held = idx >= 0 && hold(t, rd, idx);
    pthread_mutex_lock(&t->mbox_lock);
    if (idx >= 0 && !held) /* again under the lock: a wake-up after this is not missed */
      held = hold(t, rd, idx);
    if (t->interrupted || atomic_load(&t->closing)) {
      pthread_mutex_unlock(&t->mbox_lock);
      rc = WAGMA_ECLOSED;
      break;
    }
    wg_message_t *m = mailbox_take(t, match);
    if (m != NULL) {
      pthread_mutex_unlock(&t->mbox_lock);
      rc = hand_over(m, sink, out);
      break;
    }
    if (src_rank >= 0 && src_rank != t->rank && atomic_load(&p->dead)) {
      pthread_mutex_unlock(&t->mbox_lock);
      rc = WAGMA_EPEER;
      break;
    }
    double now = wg_now();
    if (now >= deadline) {
      pthread_mutex_unlock(&t->mbox_lock);
      rc = WAGMA_ETIMEDOUT;
      break;
    }
    if (spin_until == 0) {
      spin_until = now + (idx >= 0 ? SESSION_SPIN_S : RECV_SPIN_S);
      wait_since = now;
    }
    if (held) {
      /* This thread reads src's socket: no mailbox hand-off, no progress thread. Nothing
       * matching can reach the mailbox meanwhile (only this thread reads src), so it is not
       * looked at again until something ends the wait. */
      pthread_mutex_unlock(&t->mbox_lock);
      rd_ctx_t ctx = {.scratch = rd->scratch, .want = match, .sink = sink};
      for (;;) {
        if (rd->nflush > 0)
          flush_own(t, rd); /* my queued frames first: the peer may wait for them */
        read_peer(t, p, &ctx);
        if (ctx.found || atomic_load(&p->dead) || atomic_load(&t->interrupted) ||
            atomic_load(&t->closing))
          break;
        now = wg_now();
        if (now >= deadline)
          break;
        if (now < spin_until)
          sched_yield();
        else
          session_wait(t, rd, idx, deadline, wait_since);
      }
      if (ctx.found) {
        rc = ctx.msg != NULL ? hand_over(ctx.msg, sink, out) : 0;
        break;
      }
      continue; /* closed, dead (what it sent first is in the mailbox) or deadline: decided
                   above, under the lock */
    }
    if (rd != NULL && rd->nflush > 0) { /* this wait does not write: the progress thread does */
      pthread_mutex_unlock(&t->mbox_lock);
      flush_handoff(t, rd);
      continue;
    }
    /* Briefly yield instead of sleeping: on a busy host the progress thread usually delivers
     * the next frame within a few scheduler slices, and a condvar sleep adds a wake-up. */
    if (now < spin_until) {
      pthread_mutex_unlock(&t->mbox_lock);
      sched_yield();
      continue;
    }
    /* A session that waits to take src's socket from the progress thread looks again soon. */
    cond_wait_until(t, &ts, idx >= 0 ? 1e-3 : 0);
    pthread_mutex_unlock(&t->mbox_lock);
  }
  if (idx >= 0 && rd->held[idx])
    unsink(t, p); /* a frame half read into the sink: the caller's buffer is its own again */
  return rc;
}

static int tcp_recv(wg_transport_t *t, const wg_match_t *match, double deadline,
                    wg_message_t **out) {
  return tcp_recv_into(t, NULL, match, deadline, NULL, out);
}

static int tcp_peer_alive(wg_transport_t *t, int rank) {
  if (t == NULL || rank < 0 || rank >= t->nranks)
    return 0;
  if (rank == t->rank)
    return 1;
  return t->peers[rank].fd >= 0 && !atomic_load(&t->peers[rank].dead);
}

static int tcp_peer_unreachable(wg_transport_t *t, int rank, double *since) {
  if (t == NULL || rank < 0 || rank >= t->nranks || rank == t->rank)
    return 0;
  wg_tcp_peer_t *p = &t->peers[rank];
  if (!atomic_load(&p->dead) || !atomic_load(&p->silent))
    return 0;
  if (since)
    *since = (double)atomic_load(&p->dead_ns) / 1e9;
  return 1;
}

static void tcp_interrupt(wg_transport_t *t) {
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->mbox_lock);
  t->interrupted = 1;
  pthread_cond_broadcast(&t->mbox_cond);
  pthread_mutex_unlock(&t->mbox_lock);
  uint64_t one = 1;
  ssize_t n = write(t->intrfd, &one, sizeof one); /* wakes sessions waiting in ppoll */
  (void)n;
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
  uint64_t one = 1;
  ssize_t n = write(t->intrfd, &one, sizeof one);
  (void)n;
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
    .reader_begin = tcp_reader_begin,
    .reader_end = tcp_reader_end,
    .reader_release = tcp_reader_release,
    .recv_into = tcp_recv_into,
    .peer_alive = tcp_peer_alive,
    .peer_unreachable = tcp_peer_unreachable,
    .interrupt = tcp_interrupt,
    .stats = tcp_stats,
    .close = tcp_close,
};
