/* tcp_mesh.c — connection setup of the TCP transport: one authenticated socket per pair of
 * members.
 *
 * Rule: rank r dials every rank below r and accepts every rank above r, so each pair gets
 * exactly one socket. On each connection the two sides run a three-step HELLO handshake
 * (tcp_internal.h): the dialer sends a fresh nonce_d; the acceptor answers with a fresh
 * nonce_a and its proof; the dialer checks it and sends its own proof. A proof is
 * HMAC-SHA256 under the epoch's secret over both nonces, the epoch, both ranks, nranks and the
 * side (wg_tcp_hello_proof), compared in constant time. Every HELLO is also checked for magic,
 * version, epoch, step, length, nranks, flags and ranks (the acceptor: src above it; the
 * dialer: src = the rank it dialed). So a connection stands for a member only once the peer
 * proved it holds the secret: an impostor that knows the (public) plan is refused, and its
 * failure takes nothing from the real member, who can still connect. Without a secret (NULL/0)
 * the same exchange runs with an empty key: it authenticates nothing, and HELLO flags make an
 * authenticated rank refuse such a peer.
 *
 * A refused connection is closed, counted in frames_rejected and logged with its remote
 * address; a dialer whose connection fails (refused, reset, a proof that does not verify, the
 * wrong epoch: an old process still on the port) retries with backoff until the deadline.
 *
 * Floods. Whoever can reach the port, secret or not, must not keep the members from
 * connecting. A connection waits for its handshake in one of (higher ranks + 64) accept slots;
 * one source address (IPv4 address, IPv6 /64) holds at most (higher ranks + 8) of them. A new
 * connection never waits for a slot and is never refused for want of one: at its source's cap
 * it takes the place of that source's worst connection, with every slot taken the place of the
 * worst of all. Worst, in this order: waited on longer than MESH_GRACE_S (a member answers
 * within a round trip), from the source holding the most slots, step 1 not received, the
 * oldest; a candidate without step 1 is read once before it goes, so a member whose step 1 is
 * already in the socket keeps its place. Step 1 must arrive within WG_TCP_HELLO_SILENT_S of
 * the accept (a dialer sends it once connected), the whole handshake within
 * WG_TCP_HELLO_TIMEOUT_S + 1 s. A wake-up accepts at most MESH_ACCEPT_BATCH connections, after
 * its other events, so a flood starves neither handshakes in progress nor the cancel poll.
 * Each dropped connection counts in frames_rejected; one WARN line sums them up.
 *
 * Host names. Each distinct host name this rank needs (its own, those of the ranks it dials) is
 * resolved once, off the loop, by up to RESOLVE_THREADS detached resolver threads, which write
 * an eventfd when an answer comes in; a failed name is asked again every RESOLVE_RETRY_S
 * until the mesh is done. IP literals are parsed here. The loop dials a rank once its address
 * is known (over up to MESH_MAX_ADDRS of them, the next one after each failure) and binds once
 * its own is; a name without an answer by the deadline leaves its rank unconnected (an ERROR
 * line), or, its own, fails the open.
 *
 * Threads: the handshakes run on the thread that calls open, before the progress thread
 * exists, with their own epoll set and no locks. The resolver threads block every signal and
 * share only a resolver_t with it (its mutex guards all of it; the last of the mesh and the
 * threads to let go frees it, so a thread still inside getaddrinfo when open returns touches
 * nothing else and ends by itself). Reads the secret from the caller's auth only during
 * wg_tcp_mesh_connect and keeps no copy. In a sealed mesh (auth->seal, HELLO flag WG_HELLO_F_SEAL
 * on both sides, or the pair is refused) each completed connection is keyed here, from the secret
 * and its two nonces (seal_connection, tcp_seal.c). Invariant: only the handshake's own bytes are
 * read from a connection here (a header, then exactly the payload length of its step, checked
 * before it is read), so frames a faster peer sends right after its handshake stay in the socket
 * for the progress thread. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "tcp_internal.h"
#include "wagma/log_internal.h"

#define MAX_AUTH_WARNINGS 8    /* refused handshakes logged at WARN per open; the rest at DEBUG */
#define MESH_ACCEPT_SPARE 64   /* accept slots beyond one per higher rank */
#define MESH_SOURCE_SPARE 8    /* slots one source address may hold beyond one per higher rank */
#define MESH_GRACE_S 0.2       /* a peer waited on longer than this goes first when room is made */
#define MESH_ACCEPT_BATCH 64   /* connections accepted per wake-up */
#define MESH_BACKLOG 1024      /* listen backlog (the kernel caps it at net.core.somaxconn) */
#define MESH_MAX_ADDRS 4       /* addresses kept per rank */
#define MESH_CANCEL_POLL_MS 50 /* cancelled is polled at least this often */
#define RESOLVE_THREADS 4      /* resolver threads at most per open */
#define RESOLVE_RETRY_S 0.5    /* a name that failed is asked again after this long */

enum slot_kind { SLOT_DIAL, SLOT_ACCEPT };
enum slot_state {
  SLOT_IDLE,       /* dial: waiting for retry_at */
  SLOT_CONNECTING, /* dial: connect in progress */
  SLOT_HELLO_WAIT, /* dial: step 1 sent, reading step 2; accept: reading step 1 */
  SLOT_PROOF_WAIT, /* accept: step 2 sent, reading step 3 */
  SLOT_DONE,       /* dial: connected and authenticated */
  SLOT_FREE,       /* accept: unused */
};

typedef struct mesh_slot {
  int kind;
  int state;
  int fd;
  int rank; /* dial target; for an accepted connection the rank its step 1 claimed, or -1 */
  uint8_t buf[WG_FRAME_HEADER_SIZE + WG_HELLO_MAX_LEN];
  size_t got;
  wg_frame_header_t hdr; /* header of the HELLO being read, once got >= header size */
  uint8_t nonce_d[WG_HELLO_NONCE_LEN];
  uint8_t nonce_a[WG_HELLO_NONCE_LEN];
  double expires; /* the handshake in progress is dropped at this time */
  double retry_at;
  double backoff;
  char remote[WAGMA_ADDRESS_MAX + 32]; /* "host:port" of the other end, for logs */
  /* accept slots only */
  double since;     /* since when the peer owes us bytes: the accept, or step 2 sent */
  double accepted;  /* when it was accepted */
  uint64_t src_key; /* its source address (source_key) */
  int src_n;        /* slots in use by that source, this one included */
} mesh_slot_t;

/* Where a rank is: its own address (bound) or one it dials. */
enum addr_state { ADDR_WAIT, ADDR_READY, ADDR_BAD };
typedef struct mesh_addr {
  int state; /* ADDR_WAIT: its host name is being resolved (resolver entry `name`) */
  int name;
  int err, logged; /* the resolver's last error for it; the last one logged */
  uint16_t port;
  int n, next; /* addresses, and the one the next dial uses (mod n) */
  struct sockaddr_storage sa[MESH_MAX_ADDRS];
  socklen_t len[MESH_MAX_ADDRS];
} mesh_addr_t;

/* The resolver threads' work, shared with the mesh under lock. */
enum name_state { NAME_PENDING, NAME_BUSY, NAME_OK, NAME_FAILED };
typedef struct resolve_name {
  char host[WAGMA_ADDRESS_MAX];
  int state;
  int err;         /* getaddrinfo's last error while NAME_FAILED */
  double retry_at; /* NAME_FAILED: asked again then */
  int n;           /* NAME_OK: addresses (port 0) */
  struct sockaddr_storage sa[MESH_MAX_ADDRS];
  socklen_t len[MESH_MAX_ADDRS];
} resolve_name_t;

typedef struct resolver {
  pthread_mutex_t lock;
  pthread_cond_t cond; /* CLOCK_MONOTONIC; a thread waits on it to ask a failed name again */
  int refs;            /* the mesh and each running thread; the last one frees */
  int stop;            /* the mesh is done: the threads end at their next turn */
  int wakefd;          /* eventfd, written after every answer; closed with the resolver */
  int n, cap;
  resolve_name_t names[];
} resolver_t;

typedef struct mesh {
  struct wg_transport *t;
  const wagma_plan_t *plan;
  const wg_transport_auth_t *auth;
  int authed; /* 1: this rank holds a secret and requires peers to prove theirs */
  int sealed; /* 1: frames after the handshake are sealed, and peers must seal theirs */
  int epfd;
  int listen_fd;
  mesh_slot_t *dials;   /* nranks entries, used for ranks below mine */
  mesh_slot_t *accepts; /* naccepts entries */
  int naccepts;
  int per_source;              /* accept slots one source address may hold */
  int missing;                 /* peers without a connection yet */
  int nwarned;                 /* refused handshakes logged at WARN so far */
  unsigned long long nevicted; /* connections dropped to make room */
  mesh_addr_t *addrs;          /* ranks 0..rank: the ones dialed, and mine */
  resolver_t *res;             /* NULL when every address is an IP literal */
} mesh_t;

static const int listen_tag;   /* epoll data.ptr of the listening socket */
static const int resolver_tag; /* epoll data.ptr of the resolver's eventfd */

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

int wg_tcp_hello_proof(const wg_transport_auth_t *auth, wg_hello_side_t side, uint64_t epoch,
                       int dialer, int acceptor, int nranks,
                       const uint8_t nonce_d[WG_HELLO_NONCE_LEN],
                       const uint8_t nonce_a[WG_HELLO_NONCE_LEN], uint8_t out[WG_HELLO_PROOF_LEN]) {
  return wg_tcp_hello_mac(auth, "wagma-hello-v1", side, epoch, dialer, acceptor, nranks, nonce_d,
                          nonce_a, out);
}

int wg_tcp_hello_mac(const wg_transport_auth_t *auth, const char *label, wg_hello_side_t side,
                     uint64_t epoch, int dialer, int acceptor, int nranks,
                     const uint8_t nonce_d[WG_HELLO_NONCE_LEN],
                     const uint8_t nonce_a[WG_HELLO_NONCE_LEN], uint8_t out[WG_HELLO_PROOF_LEN]) {
  static const uint8_t no_key[1];
  uint8_t msg[32 + 1 + 8 + 3 * 4 + 2 * WG_HELLO_NONCE_LEN];
  size_t n = 0, label_len = strlen(label);
  if (label_len > 32)
    return WAGMA_EINVAL;
  memcpy(msg, label, label_len);
  n += label_len;
  msg[n++] = (uint8_t)side;
  wg_le_put_u64(msg + n, epoch);
  n += 8;
  wg_le_put_u32(msg + n, (uint32_t)dialer);
  n += 4;
  wg_le_put_u32(msg + n, (uint32_t)acceptor);
  n += 4;
  wg_le_put_u32(msg + n, (uint32_t)nranks);
  n += 4;
  memcpy(msg + n, nonce_d, WG_HELLO_NONCE_LEN);
  n += WG_HELLO_NONCE_LEN;
  memcpy(msg + n, nonce_a, WG_HELLO_NONCE_LEN);
  n += WG_HELLO_NONCE_LEN;
  int keyed = auth != NULL && auth->secret != NULL && auth->secret_len > 0;
  if (keyed && auth->secret_len > (size_t)INT_MAX)
    return WAGMA_EINVAL;
  unsigned int out_len = 0;
  if (HMAC(EVP_sha256(), keyed ? auth->secret : no_key, keyed ? (int)auth->secret_len : 0, msg, n,
           out, &out_len) == NULL ||
      out_len != WG_HELLO_PROOF_LEN)
    return WAGMA_EIO;
  return 0;
}

static size_t hello_len(int step) {
  return step == 1 ? WG_HELLO_STEP1_LEN : step == 2 ? WG_HELLO_STEP2_LEN : WG_HELLO_STEP3_LEN;
}

/* A connection refused in the handshake: counted, logged with the remote address. */
static void refuse(mesh_t *m, mesh_slot_t *s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void refuse(mesh_t *m, mesh_slot_t *s, const char *fmt, ...) {
  struct wg_transport *t = m->t;
  char why[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  atomic_fetch_add(&t->frames_rejected, 1);
  int level = m->nwarned++ < MAX_AUTH_WARNINGS ? WAGMA_LOG_WARN : WAGMA_LOG_DEBUG;
  wg_logf(t->log, t->log_user, level, "rank %d: refused %s connection %s %s: %s", t->rank,
          s->kind == SLOT_DIAL ? "outgoing" : "incoming", s->kind == SLOT_DIAL ? "to" : "from",
          s->remote, why);
}

/* Sends HELLO step `step` with len payload bytes in one non-blocking write (a fresh socket
 * always takes it). Returns 0 or -1. */
static int send_hello(mesh_t *m, int fd, int step, const uint8_t *payload, size_t len) {
  struct wg_transport *t = m->t;
  uint8_t out[WG_FRAME_HEADER_SIZE + WG_HELLO_MAX_LEN];
  wg_frame_header_t h = {0};
  h.magic = WG_FRAME_MAGIC;
  h.version = WG_FRAME_VERSION;
  h.kind = WG_FRAME_HELLO;
  h.epoch = t->epoch;
  h.src = (uint32_t)t->rank;
  h.seq = (uint64_t)step;
  h.length = len;
  h.aux = (uint64_t)t->nranks;
  h.flags = (m->authed ? WG_HELLO_F_AUTH : 0) | (m->sealed ? WG_HELLO_F_SEAL : 0);
  wg_frame_encode(&h, out);
  memcpy(out + WG_FRAME_HEADER_SIZE, payload, len);
  size_t total = WG_FRAME_HEADER_SIZE + len;
  ssize_t n = send(fd, out, total, MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == (ssize_t)total ? 0 : -1;
}

/* Validates the header of HELLO step `step` in s->buf into s->hdr. Returns 0 or -1 (refused:
 * counted and logged). */
static int check_header(mesh_t *m, mesh_slot_t *s, int step) {
  struct wg_transport *t = m->t;
  wg_frame_header_t *h = &s->hdr;
  int rc = wg_frame_decode(s->buf, WG_FRAME_HEADER_SIZE, t->epoch, (uint32_t)t->nranks,
                           WG_HELLO_MAX_LEN, h);
  if (rc == WAGMA_EEPOCH) {
    refuse(m, s, "HELLO of another epoch");
    return -1;
  }
  if (rc != 0 || h->kind != WG_FRAME_HELLO) {
    refuse(m, s, "not a HELLO frame (%s)", rc != 0 ? wagma_strerror(rc) : "another kind");
    return -1;
  }
  int peer_authed = (h->flags & WG_HELLO_F_AUTH) != 0;
  int peer_sealed = (h->flags & WG_HELLO_F_SEAL) != 0;
  if (h->aux != (uint64_t)t->nranks) {
    refuse(m, s, "HELLO for %llu ranks, not %d", (unsigned long long)h->aux, t->nranks);
  } else if (h->seq != (uint64_t)step || h->length != hello_len(step)) {
    refuse(m, s, "HELLO step %llu of %llu bytes where step %d was due (another version?)",
           (unsigned long long)h->seq, (unsigned long long)h->length, step);
  } else if (h->flags & ~(WG_HELLO_F_AUTH | WG_HELLO_F_SEAL)) {
    refuse(m, s, "unknown HELLO flags 0x%x", (unsigned)h->flags);
  } else if (m->sealed != peer_sealed) {
    refuse(m, s,
           "rank %u %s its frames and this rank %s (every member must use the same "
           "data-plane encryption setting)",
           (unsigned)h->src, peer_sealed ? "encrypts" : "does not encrypt",
           m->sealed ? "does" : "does not");
  } else if (m->authed && !peer_authed) {
    refuse(m, s, "rank %u sent an unauthenticated HELLO (it holds no secret)", (unsigned)h->src);
  } else if (!m->authed && peer_authed) {
    refuse(m, s, "rank %u authenticates and this rank holds no secret", (unsigned)h->src);
  } else if (s->kind == SLOT_DIAL && h->src != (uint32_t)s->rank) {
    refuse(m, s, "HELLO reply from rank %u on the connection to rank %d", (unsigned)h->src,
           s->rank);
  } else if (s->kind == SLOT_ACCEPT && step == 1 && (int)h->src <= t->rank) {
    refuse(m, s, "HELLO from rank %u, which should accept, not dial", (unsigned)h->src);
  } else if (s->kind == SLOT_ACCEPT && step == 3 && h->src != (uint32_t)s->rank) {
    refuse(m, s, "step 3 from rank %u after step 1 from rank %d", (unsigned)h->src, s->rank);
  } else {
    return 0;
  }
  return -1;
}

/* Reads the rest of HELLO step `step` (header, checked, then its payload). Returns 1 complete
 * (s->hdr, payload at s->buf + header size), 0 more to come, -1 EOF or error, -2 refused. */
static int read_hello(mesh_t *m, mesh_slot_t *s, int step) {
  for (;;) {
    size_t want = WG_FRAME_HEADER_SIZE;
    if (s->got >= WG_FRAME_HEADER_SIZE)
      want += (size_t)s->hdr.length;
    if (s->got == want)
      return 1;
    ssize_t n = recv(s->fd, s->buf + s->got, want - s->got, MSG_DONTWAIT);
    if (n > 0) {
      s->got += (size_t)n;
      if (s->got == WG_FRAME_HEADER_SIZE && check_header(m, s, step) != 0)
        return -2;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return 0;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return -1;
    }
  }
}

/* Compares the proof at `got` with what `side` must have sent, in constant time.
 * Returns 0 if it verifies, -1 if not (or the MAC failed). */
static int verify_proof(mesh_t *m, wg_hello_side_t side, int dialer, int acceptor,
                        const uint8_t nonce_d[WG_HELLO_NONCE_LEN],
                        const uint8_t nonce_a[WG_HELLO_NONCE_LEN], const uint8_t *got) {
  struct wg_transport *t = m->t;
  uint8_t want[WG_HELLO_PROOF_LEN];
  if (wg_tcp_hello_proof(m->auth, side, t->epoch, dialer, acceptor, t->nranks, nonce_d, nonce_a,
                         want) != 0)
    return -1;
  return CRYPTO_memcmp(want, got, WG_HELLO_PROOF_LEN) == 0 ? 0 : -1;
}

static void format_remote(const struct sockaddr *sa, socklen_t len, char *out, size_t out_len) {
  char host[INET6_ADDRSTRLEN], port[8];
  if (getnameinfo(sa, len, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) !=
      0)
    snprintf(out, out_len, "?");
  else if (sa->sa_family == AF_INET6)
    snprintf(out, out_len, "[%s]:%s", host, port);
  else
    snprintf(out, out_len, "%s:%s", host, port);
}

/* ---------------------------------------------------------------- addresses and names */

static void copy_addrs(const struct addrinfo *res, struct sockaddr_storage *sa, socklen_t *len,
                       int *n) {
  *n = 0;
  for (const struct addrinfo *ai = res; ai != NULL && *n < MESH_MAX_ADDRS; ai = ai->ai_next) {
    if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) || ai->ai_addrlen > sizeof *sa)
      continue;
    memcpy(&sa[*n], ai->ai_addr, ai->ai_addrlen);
    len[*n] = ai->ai_addrlen;
    (*n)++;
  }
}

static void set_port(struct sockaddr_storage *sa, uint16_t port) {
  if (sa->ss_family == AF_INET)
    ((struct sockaddr_in *)sa)->sin_port = htons(port);
  else if (sa->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
}

static void resolver_unref(resolver_t *r) {
  pthread_mutex_lock(&r->lock);
  int last = --r->refs == 0;
  pthread_mutex_unlock(&r->lock);
  if (!last)
    return;
  pthread_cond_destroy(&r->cond);
  pthread_mutex_destroy(&r->lock);
  if (r->wakefd >= 0)
    close(r->wakefd);
  free(r);
}

/* A resolver thread: asks getaddrinfo, outside the lock, for the next name that is pending or
 * due again, until none is left to ask or the mesh stops it. */
static void *resolver_main(void *arg) {
  resolver_t *r = arg;
  pthread_mutex_lock(&r->lock);
  while (!r->stop) {
    double now = wg_now(), wake = INFINITY;
    resolve_name_t *e = NULL;
    for (int i = 0; i < r->n && e == NULL; i++) {
      resolve_name_t *c = &r->names[i];
      if (c->state == NAME_PENDING || (c->state == NAME_FAILED && c->retry_at <= now))
        e = c;
      else if (c->state == NAME_FAILED && c->retry_at < wake)
        wake = c->retry_at;
    }
    if (e == NULL) {
      if (isinf(wake))
        break; /* all answered, or being asked by another thread */
      struct timespec ts = {.tv_sec = (time_t)floor(wake)};
      ts.tv_nsec = (long)((wake - floor(wake)) * 1e9);
      pthread_cond_timedwait(&r->cond, &r->lock, &ts);
      continue;
    }
    e->state = NAME_BUSY;
    char host[WAGMA_ADDRESS_MAX];
    memcpy(host, e->host, sizeof host);
    pthread_mutex_unlock(&r->lock);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    pthread_mutex_lock(&r->lock);
    if (rc == 0)
      copy_addrs(res, e->sa, e->len, &e->n);
    if (rc == 0 && e->n > 0) {
      e->state = NAME_OK;
    } else {
      e->state = NAME_FAILED;
      e->err = rc != 0 ? rc : EAI_NONAME;
      e->retry_at = wg_now() + RESOLVE_RETRY_S;
    }
    if (res != NULL)
      freeaddrinfo(res);
    uint64_t one = 1;
    ssize_t w = write(r->wakefd, &one, sizeof one);
    (void)w; /* the counter cannot overflow; a failure only delays the mesh to its next turn */
  }
  pthread_mutex_unlock(&r->lock);
  resolver_unref(r);
  return NULL;
}

/* The resolver entry of host, added if new. Ownership: the first name creates m->res, which
 * holds the mesh's reference until resolver_stop. -1 when out of memory. */
static int resolver_add(mesh_t *m, const char *host) {
  struct wg_transport *t = m->t;
  if (m->res == NULL) {
    int cap = t->rank + 1;
    resolver_t *r = calloc(1, sizeof *r + (size_t)cap * sizeof r->names[0]);
    if (r == NULL)
      return -1;
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    r->refs = 1;
    r->wakefd = -1;
    r->cap = cap;
    m->res = r;
  }
  resolver_t *r = m->res;
  for (int i = 0; i < r->n; i++)
    if (strcmp(r->names[i].host, host) == 0)
      return i;
  if (r->n >= r->cap)
    return -1;
  snprintf(r->names[r->n].host, sizeof r->names[r->n].host, "%s", host);
  r->names[r->n].state = NAME_PENDING;
  return r->n++;
}

/* Starts the resolver threads (every signal blocked in them), each holding a reference to
 * m->res that it drops when it ends. 0 or WAGMA_EIO. */
static int resolver_start(mesh_t *m) {
  struct wg_transport *t = m->t;
  resolver_t *r = m->res;
  r->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = (void *)&resolver_tag};
  if (r->wakefd < 0 || epoll_ctl(m->epfd, EPOLL_CTL_ADD, r->wakefd, &ev) != 0)
    return WAGMA_EIO;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int started = 0;
  for (int i = 0; i < r->n && i < RESOLVE_THREADS; i++) {
    pthread_t th;
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
    if (pthread_create(&th, &attr, resolver_main, r) != 0) {
      pthread_mutex_lock(&r->lock);
      r->refs--;
      pthread_mutex_unlock(&r->lock);
      break;
    }
    started++;
  }
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (started == 0) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_ERROR, "rank %d: cannot start a resolver thread",
            t->rank);
    return WAGMA_EIO;
  }
  return 0;
}

/* The mesh is done with the resolver: its threads end at their next turn, the last frees it. */
static void resolver_stop(resolver_t *r) {
  pthread_mutex_lock(&r->lock);
  r->stop = 1;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  resolver_unref(r);
}

static void log_addr(mesh_t *m, int r, int level, const char *what) {
  struct wg_transport *t = m->t;
  const char *address = m->plan->members[r].address;
  if (r == t->rank)
    wg_logf(t->log, t->log_user, level, "rank %d: its own address '%s' %s", t->rank, address, what);
  else
    wg_logf(t->log, t->log_user, level, "rank %d: the address '%s' of rank %d %s", t->rank, address,
            r, what);
}

/* Reads rank r's plan address into m->addrs[r]: an IP literal (or no host) here, a host name
 * handed to the resolver. A malformed address: WAGMA_EINVAL for my own, logged and never
 * dialed for another rank's. 0, WAGMA_EINVAL or WAGMA_ENOMEM. */
static int addr_init(mesh_t *m, int r) {
  struct wg_transport *t = m->t;
  mesh_addr_t *a = &m->addrs[r];
  char host[WAGMA_ADDRESS_MAX], port[16], why[160];
  a->name = -1;
  a->state = ADDR_BAD;
  if (wg_tcp_parse_address(m->plan->members[r].address, host, sizeof host, port, sizeof port) !=
          0 ||
      strtoul(port, NULL, 10) > 65535) {
    log_addr(m, r, WAGMA_LOG_ERROR, "is not host:port");
    return r == t->rank ? WAGMA_EINVAL : 0;
  }
  a->port = (uint16_t)strtoul(port, NULL, 10);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | (r == t->rank ? AI_PASSIVE : 0);
  int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res); /* no lookup: numeric */
  if (rc == 0) {
    copy_addrs(res, a->sa, a->len, &a->n);
    freeaddrinfo(res);
    a->state = a->n > 0 ? ADDR_READY : ADDR_BAD;
  } else if (rc == EAI_NONAME && host[0] != '\0') {
    a->name = resolver_add(m, host); /* a host name */
    if (a->name < 0)
      return WAGMA_ENOMEM;
    a->state = ADDR_WAIT;
  }
  if (a->state == ADDR_BAD) {
    snprintf(why, sizeof why, "is not usable: %s",
             rc != 0 ? gai_strerror(rc) : "no IPv4 or IPv6 address");
    log_addr(m, r, WAGMA_LOG_ERROR, why);
    return r == t->rank ? WAGMA_EINVAL : 0;
  }
  return 0;
}

/* Takes the resolver's answers for the ranks still waiting on one; logs each new failure. */
static void collect_names(mesh_t *m) {
  struct wg_transport *t = m->t;
  resolver_t *r = m->res;
  if (r == NULL)
    return;
  uint64_t count;
  while (read(r->wakefd, &count, sizeof count) > 0)
    ;
  pthread_mutex_lock(&r->lock);
  for (int q = 0; q <= t->rank; q++) {
    mesh_addr_t *a = &m->addrs[q];
    if (a->state != ADDR_WAIT)
      continue;
    const resolve_name_t *e = &r->names[a->name];
    if (e->state == NAME_OK) {
      a->n = e->n;
      for (int i = 0; i < e->n; i++) {
        a->sa[i] = e->sa[i];
        a->len[i] = e->len[i];
        set_port(&a->sa[i], a->port);
      }
      a->state = ADDR_READY;
    } else if (e->state == NAME_FAILED) {
      a->err = e->err;
    }
  }
  pthread_mutex_unlock(&r->lock);
  for (int q = 0; q <= t->rank; q++) {
    mesh_addr_t *a = &m->addrs[q];
    if (a->state == ADDR_WAIT && a->err != 0 && a->err != a->logged) {
      char why[200];
      snprintf(why, sizeof why, "does not resolve yet (%s); asking again every %.1f s",
               gai_strerror(a->err), RESOLVE_RETRY_S);
      log_addr(m, q, WAGMA_LOG_WARN, why);
      a->logged = a->err;
    }
  }
}

/* Binds and listens on my address, now resolved (or takes a dup of the caller's listening
 * socket, t->listen_fd). 0 or WAGMA_EIO. */
static int bind_listener(mesh_t *m) {
  struct wg_transport *t = m->t;
  const mesh_addr_t *a = &m->addrs[t->rank];
  int err = 0;
  if (t->listen_fd >= 0) {
    m->listen_fd = fcntl(t->listen_fd, F_DUPFD_CLOEXEC, 0);
    /* O_NONBLOCK is shared with the caller's descriptor: it never accepts on it itself */
    int fl = m->listen_fd >= 0 ? fcntl(m->listen_fd, F_GETFL) : -1;
    if (fl < 0 || fcntl(m->listen_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
      err = errno;
      if (m->listen_fd >= 0)
        close(m->listen_fd);
      m->listen_fd = -1;
    }
  }
  for (int i = 0; i < a->n && m->listen_fd < 0 && t->listen_fd < 0; i++) {
    const struct sockaddr_storage *sa = &a->sa[i];
    int fd = socket(sa->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int b = bind(fd, (const struct sockaddr *)sa, a->len[i]);
    if (b != 0 && errno == EADDRNOTAVAIL) {
      /* The plan address is not local (NAT, service IP): listen on every interface. */
      struct sockaddr_storage any = *sa;
      if (sa->ss_family == AF_INET)
        ((struct sockaddr_in *)&any)->sin_addr.s_addr = htonl(INADDR_ANY);
      else
        ((struct sockaddr_in6 *)&any)->sin6_addr = in6addr_any;
      b = bind(fd, (struct sockaddr *)&any, a->len[i]);
    }
    if (b != 0 || listen(fd, MESH_BACKLOG) != 0) {
      err = errno;
      close(fd);
      continue;
    }
    m->listen_fd = fd;
  }
  if (m->listen_fd < 0) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_ERROR, "rank %d: cannot listen on %s: %s", t->rank,
            m->plan->members[t->rank].address, strerror(err));
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
  m->addrs[s->rank].next++; /* the next of its addresses, if it has several */
  s->state = SLOT_IDLE;
  s->retry_at = wg_now() + s->backoff;
  s->backoff = fmin(s->backoff * 2, 0.2);
}

/* Counts slot s in its source's slots (s in use, src_key set). */
static void source_add(mesh_t *m, mesh_slot_t *s) {
  s->src_n = 1;
  for (int i = 0; i < m->naccepts; i++) {
    mesh_slot_t *o = &m->accepts[i];
    if (o != s && o->state != SLOT_FREE && o->src_key == s->src_key) {
      o->src_n++;
      s->src_n++;
    }
  }
}

static void accept_free(mesh_t *m, mesh_slot_t *s) {
  if (s->state != SLOT_FREE)
    for (int i = 0; i < m->naccepts; i++) {
      mesh_slot_t *o = &m->accepts[i];
      if (o != s && o->state != SLOT_FREE && o->src_key == s->src_key)
        o->src_n--;
    }
  slot_close(m, s);
  s->state = SLOT_FREE;
  s->rank = -1;
}

/* The data plane's socket options: no Nagle delay, silence detected (WG_TCP_SILENCE_S), and a
 * receive buffer of
 * WG_TCP_RCVBUF_BYTES from the start. The kernel's receive autotuning starts a connection at
 * tcp_rmem's default (128 KiB here) and grows it only as it sees the window fill, so the
 * first megabytes of a collective trickle through a small window with a window update per
 * segment; a fixed buffer advertises the whole window at once. Measured on loopback, P = 4
 * and 8, 1 and 4 MiB: 1.4-1.6x the allreduce bandwidth and about 30 % less CPU per operation
 * (docs/benchmarks.md). The kernel caps it at net.core.rmem_max and only allocates what
 * arrives. Silence on an idle connection: keepalive probes after 1 s of idleness, one a second,
 * WG_TCP_SILENCE_S - 1 of them unanswered fail the socket with ETIMEDOUT; with data in flight
 * the progress thread watches the acknowledgements (tcp.c check_silence). */
static void tune_socket(int fd) {
  int one = 1, rcvbuf = WG_TCP_RCVBUF_BYTES, idle = 1, intvl = 1, cnt = WG_TCP_SILENCE_S - 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* Dialer, connected: step 1 (a fresh nonce_d), then wait for step 2. */
static void dial_send_nonce(mesh_t *m, mesh_slot_t *s) {
  struct wg_transport *t = m->t;
  t->peers[s->rank].dialed_tcp = 1; /* reachable: whatever fails later is not the network */
  if (RAND_bytes(s->nonce_d, sizeof s->nonce_d) != 1) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_ERROR, "rank %d: RAND_bytes failed", t->rank);
    dial_failed(m, s);
    return;
  }
  if (send_hello(m, s->fd, 1, s->nonce_d, sizeof s->nonce_d) != 0) {
    dial_failed(m, s);
    return;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
  epoll_ctl(m->epfd, EPOLL_CTL_MOD, s->fd, &ev);
  s->got = 0;
  s->state = SLOT_HELLO_WAIT;
}

/* Dials rank s->rank at the next of its addresses (resolved: no lookup here). */
static void dial_start(mesh_t *m, mesh_slot_t *s) {
  mesh_addr_t *a = &m->addrs[s->rank];
  const struct sockaddr_storage *sa = &a->sa[a->next % a->n];
  socklen_t salen = a->len[a->next % a->n];
  snprintf(s->remote, sizeof s->remote, "%s (rank %d)", m->plan->members[s->rank].address, s->rank);
  s->fd = socket(sa->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->fd < 0) {
    dial_failed(m, s);
    return;
  }
  tune_socket(s->fd);
  s->expires = wg_now() + WG_TCP_HELLO_TIMEOUT_S;
  int rc = connect(s->fd, (const struct sockaddr *)sa, salen);
  int err = errno;
  struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = s};
  if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, s->fd, &ev) != 0) {
    dial_failed(m, s);
    return;
  }
  if (rc == 0)
    dial_send_nonce(m, s);
  else if (err == EINPROGRESS)
    s->state = SLOT_CONNECTING;
  else
    dial_failed(m, s);
}

/* Dialer: step 2 arrived. Checks the acceptor's proof, answers with ours (step 3). */
static int seal_connection(mesh_t *m, mesh_slot_t *s, int dialer, int acceptor);

static void on_dial_event(mesh_t *m, mesh_slot_t *s) {
  struct wg_transport *t = m->t;
  if (s->state == SLOT_CONNECTING) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
      dial_failed(m, s);
    else
      dial_send_nonce(m, s);
    return;
  }
  if (s->state != SLOT_HELLO_WAIT)
    return;
  int r = read_hello(m, s, 2);
  if (r == 0)
    return;
  if (r < 0) {
    dial_failed(m, s);
    return;
  }
  const uint8_t *payload = s->buf + WG_FRAME_HEADER_SIZE;
  memcpy(s->nonce_a, payload, WG_HELLO_NONCE_LEN);
  if (verify_proof(m, WG_HELLO_ACCEPTOR, t->rank, s->rank, s->nonce_d, s->nonce_a,
                   payload + WG_HELLO_NONCE_LEN) != 0) {
    refuse(m, s, "rank %d failed authentication (another secret?)", s->rank);
    dial_failed(m, s);
    return;
  }
  uint8_t proof[WG_HELLO_PROOF_LEN];
  if (wg_tcp_hello_proof(m->auth, WG_HELLO_DIALER, t->epoch, t->rank, s->rank, t->nranks,
                         s->nonce_d, s->nonce_a, proof) != 0 ||
      send_hello(m, s->fd, 3, proof, sizeof proof) != 0 ||
      seal_connection(m, s, t->rank, s->rank) != 0) {
    dial_failed(m, s);
    return;
  }
  epoll_ctl(m->epfd, EPOLL_CTL_DEL, s->fd, NULL);
  t->peers[s->rank].fd = s->fd;
  s->fd = -1;
  s->state = SLOT_DONE;
  m->missing--;
}

/* A sealed mesh: keys this connection's frames with rank `peer`, from the secret and the
 * handshake's nonces (tcp_seal.c). 0 or -1 (logged; the connection is then not used). */
static int seal_connection(mesh_t *m, mesh_slot_t *s, int dialer, int acceptor) {
  struct wg_transport *t = m->t;
  if (!m->sealed)
    return 0;
  uint8_t from_dialer[WG_SEAL_KEY_LEN], from_acceptor[WG_SEAL_KEY_LEN];
  _Static_assert(WG_SEAL_KEY_LEN == WG_HELLO_PROOF_LEN, "one HMAC-SHA256 per key");
  int rc = wg_tcp_hello_mac(m->auth, "wagma-seal-v1", WG_HELLO_DIALER, t->epoch, dialer, acceptor,
                            t->nranks, s->nonce_d, s->nonce_a, from_dialer);
  if (rc == 0)
    rc = wg_tcp_hello_mac(m->auth, "wagma-seal-v1", WG_HELLO_ACCEPTOR, t->epoch, dialer, acceptor,
                          t->nranks, s->nonce_d, s->nonce_a, from_acceptor);
  int i_dialed = dialer == t->rank;
  if (rc == 0)
    rc = wg_seal_init(&t->peers[i_dialed ? acceptor : dialer].seal,
                      i_dialed ? from_dialer : from_acceptor,
                      i_dialed ? from_acceptor : from_dialer);
  OPENSSL_cleanse(from_dialer, sizeof from_dialer);
  OPENSSL_cleanse(from_acceptor, sizeof from_acceptor);
  if (rc != 0) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_ERROR, "rank %d: cannot key the connection with %d: %s",
            t->rank, i_dialed ? acceptor : dialer, wagma_strerror(rc));
    return -1;
  }
  return 0;
}

static void on_accept_event(mesh_t *m, mesh_slot_t *s);

/* The source of a connection, as the accept slots count it: an IPv4 address (an IPv4-mapped
 * IPv6 one too), or the /64 of an IPv6 address (one host's share of a network). */
static uint64_t source_key(const struct sockaddr_storage *sa) {
  if (sa->ss_family == AF_INET)
    return 1ull << 32 | ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
  if (sa->ss_family != AF_INET6)
    return 0;
  const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(b, v4mapped, sizeof v4mapped) == 0)
    return 1ull << 32 | (uint64_t)b[12] << 24 | (uint64_t)b[13] << 16 | (uint64_t)b[14] << 8 |
           b[15];
  uint64_t k = 0;
  for (int i = 0; i < 8; i++)
    k = k << 8 | b[i];
  return k | 1ull << 63;
}

/* 1 if connection a should give way before b (the order of the file's note on floods). */
static int gives_way_before(const mesh_slot_t *a, const mesh_slot_t *b, double now) {
  int late_a = now - a->since > MESH_GRACE_S, late_b = now - b->since > MESH_GRACE_S;
  if (late_a != late_b)
    return late_a;
  if (a->src_n != b->src_n)
    return a->src_n > b->src_n;
  int silent_a = a->state == SLOT_HELLO_WAIT, silent_b = b->state == SLOT_HELLO_WAIT;
  if (silent_a != silent_b)
    return silent_a;
  return a->since < b->since;
}

/* A free accept slot for a new connection from source key, made by dropping the connection
 * that gives way first (from key's own slots when key is at its cap). */
static mesh_slot_t *take_slot(mesh_t *m, uint64_t key) {
  for (int tries = 0;; tries++) {
    int same = 0;
    mesh_slot_t *free_slot = NULL;
    for (int i = 0; i < m->naccepts; i++) {
      mesh_slot_t *s = &m->accepts[i];
      if (s->state == SLOT_FREE && free_slot == NULL)
        free_slot = s;
      else if (s->state != SLOT_FREE && s->src_key == key)
        same++;
    }
    int capped = same >= m->per_source;
    if (!capped && free_slot != NULL)
      return free_slot;
    double now = wg_now();
    mesh_slot_t *v = NULL;
    for (int i = 0; i < m->naccepts; i++) {
      mesh_slot_t *s = &m->accepts[i];
      if (s->state == SLOT_FREE || (capped && s->src_key != key))
        continue;
      if (v == NULL || gives_way_before(s, v, now))
        v = s;
    }
    if (v == NULL)
      return free_slot;
    if (v->state == SLOT_HELLO_WAIT && tries < 3) {
      on_accept_event(m, v); /* its step 1 may be in the socket: then it stays */
      if (v->state != SLOT_HELLO_WAIT)
        continue;
    }
    m->nevicted++;
    refuse(m, v, "dropped to make room: %s hold connections without a completed handshake",
           capped ? "its address's accept slots all" : "all accept slots");
    accept_free(m, v);
    return v;
  }
}

static void on_listen_event(mesh_t *m) {
  for (int k = 0; k < MESH_ACCEPT_BATCH; k++) {
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    int fd = accept4(m->listen_fd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return;
    uint64_t key = source_key(&sa);
    mesh_slot_t *s = take_slot(m, key);
    if (s == NULL) {
      close(fd);
      continue;
    }
    s->fd = fd;
    s->got = 0;
    s->rank = -1;
    s->state = SLOT_HELLO_WAIT;
    s->accepted = s->since = wg_now();
    s->expires = s->accepted + WG_TCP_HELLO_SILENT_S;
    s->src_key = key;
    source_add(m, s);
    format_remote((struct sockaddr *)&sa, salen, s->remote, sizeof s->remote);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
    if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
      accept_free(m, s);
    else
      on_accept_event(m, s); /* a member's step 1 is often there already */
  }
}

/* Acceptor, step 1 arrived: answers with a fresh nonce_a and our proof (step 2). */
static void accept_step1(mesh_t *m, mesh_slot_t *s) {
  struct wg_transport *t = m->t;
  uint8_t payload[WG_HELLO_STEP2_LEN];
  s->rank = (int)s->hdr.src;
  memcpy(s->nonce_d, s->buf + WG_FRAME_HEADER_SIZE, WG_HELLO_NONCE_LEN);
  if (RAND_bytes(s->nonce_a, sizeof s->nonce_a) != 1) {
    wg_logf(t->log, t->log_user, WAGMA_LOG_ERROR, "rank %d: RAND_bytes failed", t->rank);
    accept_free(m, s);
    return;
  }
  memcpy(payload, s->nonce_a, WG_HELLO_NONCE_LEN);
  if (wg_tcp_hello_proof(m->auth, WG_HELLO_ACCEPTOR, t->epoch, s->rank, t->rank, t->nranks,
                         s->nonce_d, s->nonce_a, payload + WG_HELLO_NONCE_LEN) != 0 ||
      send_hello(m, s->fd, 2, payload, sizeof payload) != 0) {
    accept_free(m, s);
    return;
  }
  s->got = 0;
  s->state = SLOT_PROOF_WAIT;
  s->since = wg_now();
  /* A second more than a dialer allows itself, so a step 3 it sent in its time arrives in
   * ours. */
  s->expires = s->accepted + WG_TCP_HELLO_TIMEOUT_S + 1.0;
}

/* Acceptor, step 3 arrived: the connection becomes the claimed rank's only if its proof
 * verifies. */
static void accept_step3(mesh_t *m, mesh_slot_t *s) {
  struct wg_transport *t = m->t;
  if (verify_proof(m, WG_HELLO_DIALER, s->rank, t->rank, s->nonce_d, s->nonce_a,
                   s->buf + WG_FRAME_HEADER_SIZE) != 0) {
    refuse(m, s, "it claims rank %d and failed authentication (no or another secret)", s->rank);
    accept_free(m, s);
    return;
  }
  if (seal_connection(m, s, s->rank, t->rank) != 0) {
    accept_free(m, s);
    return;
  }
  epoll_ctl(m->epfd, EPOLL_CTL_DEL, s->fd, NULL);
  wg_tcp_peer_t *p = &t->peers[s->rank];
  if (p->fd >= 0) {
    /* The dialer gave up on an earlier connection and retried: the newest one wins. Both
     * proved the secret, so this is the member, not an impostor. */
    close(p->fd);
    m->missing++;
  }
  p->fd = s->fd;
  s->fd = -1;
  accept_free(m, s);
  m->missing--;
}

static void on_accept_event(mesh_t *m, mesh_slot_t *s) {
  int step = s->state == SLOT_HELLO_WAIT ? 1 : 3;
  int r = read_hello(m, s, step);
  if (r == 0)
    return;
  if (r == -1 && step == 3)
    refuse(m, s, "it claimed rank %d and closed before its proof (it refused ours?)", s->rank);
  else if (r == -1 && s->got > 0)
    refuse(m, s, "truncated HELLO (%zu bytes)", s->got);
  if (r < 0)
    accept_free(m, s);
  else if (step == 1)
    accept_step1(m, s);
  else
    accept_step3(m, s);
}

/* Drops the handshakes past their own deadline; returns the earliest deadline left (or
 * `next`). */
static double expire_handshakes(mesh_t *m, double now, double next) {
  struct wg_transport *t = m->t;
  for (int i = 0; i < m->naccepts; i++) {
    mesh_slot_t *s = &m->accepts[i];
    if (s->state == SLOT_FREE)
      continue;
    if (s->expires <= now) {
      if (s->state == SLOT_HELLO_WAIT)
        refuse(m, s, "no HELLO within %.1f s", WG_TCP_HELLO_SILENT_S);
      else
        refuse(m, s, "handshake not completed within %.0f s", WG_TCP_HELLO_TIMEOUT_S + 1.0);
      accept_free(m, s);
    } else if (s->expires < next) {
      next = s->expires;
    }
  }
  for (int r = 0; r < t->rank; r++) {
    mesh_slot_t *s = &m->dials[r];
    if (s->state != SLOT_CONNECTING && s->state != SLOT_HELLO_WAIT)
      continue;
    if (s->expires <= now) {
      wg_logf(t->log, t->log_user, WAGMA_LOG_DEBUG,
              "rank %d: handshake with %s not completed within %.0f s, dialing again", t->rank,
              s->remote, WG_TCP_HELLO_TIMEOUT_S);
      dial_failed(m, s);
    } else if (s->expires < next) {
      next = s->expires;
    }
  }
  return next;
}

/* After the loop: logs the ranks whose name never resolved; my own makes the open fail
 * (WAGMA_EINVAL when the resolver answered with an error, WAGMA_ETIMEDOUT when not at all). */
static int report_unresolved(mesh_t *m) {
  struct wg_transport *t = m->t;
  int rc = 0;
  for (int r = 0; r <= t->rank; r++) {
    mesh_addr_t *a = &m->addrs[r];
    if (a->state != ADDR_WAIT)
      continue;
    char why[200];
    snprintf(why, sizeof why, "did not resolve within the connect timeout (%s)",
             a->err != 0 ? gai_strerror(a->err) : "the resolver did not answer");
    log_addr(m, r, WAGMA_LOG_ERROR, why);
    if (r == t->rank)
      rc = a->err != 0 ? WAGMA_EINVAL : WAGMA_ETIMEDOUT;
  }
  return rc;
}

static int mesh_run(mesh_t *m, double deadline, int (*cancelled)(void *), void *cancel_user) {
  struct wg_transport *t = m->t;
  for (int r = 0; r < t->rank; r++) {
    mesh_slot_t *s = &m->dials[r];
    s->kind = SLOT_DIAL;
    s->state = SLOT_IDLE;
    s->fd = -1;
    s->rank = r;
    s->retry_at = 0;
    s->backoff = 0.01;
  }
  for (;;) {
    if (cancelled && cancelled(cancel_user))
      return WAGMA_ECANCELED; /* the caller's connections are closed by wg_tcp_mesh_connect */
    double now = wg_now();
    if (now >= deadline)
      break;
    collect_names(m);
    if (m->listen_fd < 0 && m->addrs[t->rank].state == ADDR_READY) {
      int rc = bind_listener(m);
      if (rc != 0)
        return rc;
    }
    if (m->missing == 0 && m->listen_fd >= 0)
      break;
    double next = expire_handshakes(m, now, deadline);
    for (int r = 0; r < t->rank; r++) {
      mesh_slot_t *s = &m->dials[r];
      if (m->addrs[r].state != ADDR_READY)
        continue;
      if (s->state == SLOT_IDLE && s->retry_at <= now)
        dial_start(m, s);
      if (s->state == SLOT_IDLE && s->retry_at < next)
        next = s->retry_at;
    }
    int timeout_ms = (int)ceil((next - wg_now()) * 1000.0);
    if (timeout_ms < 0)
      timeout_ms = 0;
    if (cancelled && timeout_ms > MESH_CANCEL_POLL_MS)
      timeout_ms = MESH_CANCEL_POLL_MS;
    struct epoll_event events[32];
    int n = epoll_wait(m->epfd, events, 32, timeout_ms);
    int listen_ready = 0;
    for (int i = 0; i < n; i++) {
      void *ptr = events[i].data.ptr;
      if (ptr == &listen_tag) {
        listen_ready = 1; /* after the handshakes in progress */
        continue;
      }
      if (ptr == &resolver_tag)
        continue; /* collect_names, next turn */
      mesh_slot_t *s = ptr;
      if (s->kind == SLOT_DIAL)
        on_dial_event(m, s);
      else if (s->state != SLOT_FREE)
        on_accept_event(m, s);
    }
    if (listen_ready)
      on_listen_event(m);
  }
  return report_unresolved(m);
}

/* Reads every address this rank needs; starts the resolver for the host names among them. */
static int mesh_addresses(mesh_t *m) {
  for (int r = 0; r <= m->t->rank; r++) {
    int rc = addr_init(m, r);
    if (rc != 0)
      return rc;
  }
  return m->res != NULL ? resolver_start(m) : 0;
}

int wg_tcp_mesh_connect(struct wg_transport *t, const wagma_plan_t *plan,
                        const wg_transport_auth_t *auth, double deadline, int (*cancelled)(void *),
                        void *cancel_user) {
  int rc = 0;
  mesh_t m = {.t = t,
              .plan = plan,
              .auth = auth,
              .authed = auth != NULL && auth->secret_len > 0,
              .sealed = auth != NULL && auth->seal,
              .epfd = -1,
              .listen_fd = -1,
              .missing = t->nranks - 1};
  if (t->nranks <= 1)
    return 0;
  int higher = t->nranks - 1 - t->rank; /* the ranks that dial me */
  m.naccepts = higher + MESH_ACCEPT_SPARE;
  m.per_source = higher + MESH_SOURCE_SPARE;
  m.dials = calloc((size_t)t->nranks, sizeof *m.dials);
  m.accepts = calloc((size_t)m.naccepts, sizeof *m.accepts);
  m.addrs = calloc((size_t)t->rank + 1, sizeof *m.addrs);
  m.epfd = epoll_create1(EPOLL_CLOEXEC);
  if (m.dials == NULL || m.accepts == NULL || m.addrs == NULL || m.epfd < 0) {
    rc = m.epfd < 0 ? WAGMA_EIO : WAGMA_ENOMEM;
    goto out;
  }
  for (int i = 0; i < m.naccepts; i++) {
    m.accepts[i].kind = SLOT_ACCEPT;
    m.accepts[i].state = SLOT_FREE;
    m.accepts[i].fd = -1;
    m.accepts[i].rank = -1;
  }
  rc = mesh_addresses(&m);
  if (rc == 0)
    rc = mesh_run(&m, deadline, cancelled, cancel_user);
  if (m.nevicted > 0)
    wg_logf(t->log, t->log_user, WAGMA_LOG_WARN,
            "rank %d: %llu connections that had not completed a handshake were dropped to make "
            "room for others (a connection flood?)",
            t->rank, m.nevicted);
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
  if (m.res != NULL)
    resolver_stop(m.res);
  free(m.dials);
  free(m.accepts);
  free(m.addrs);
  for (int r = 0; r < t->nranks; r++)
    if (r != t->rank && t->peers[r].fd >= 0)
      tune_socket(t->peers[r].fd);
  return rc;
}
