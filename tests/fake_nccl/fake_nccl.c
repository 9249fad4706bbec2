/* fake_nccl.c — a fake of the NCCL and CUDA runtime subset the NCCL transport calls
 * (include/nccl.h, include/cuda_runtime_api.h say which, and the faults it injects), so the
 * transport's multi-rank tests run on machines without a GPU.
 *
 * Model: each rank is a process. ncclGetUniqueId opens a listening socket on 127.0.0.1 (or
 * FAKE_NCCL_HOST, the process's address its peers reach) and writes its address, port and a
 * random nonce into the id; the rank 0 that initialises with that id (in the same process)
 * collects every rank's data listener there and sends the table back; then
 * each rank dials every lower rank's data listener (a HELLO with the nonce and its rank) and
 * accepts the higher ones. ncclCommShrink builds a new mesh among the survivors over the
 * same data listeners with a derived nonce. A send is `u64 length` + bytes on the pair's
 * socket; a recv reads them into the buffer (a length that differs is ncclInvalidUsage).
 *
 * Threads: a non-blocking communicator initialises (or shrinks) on a thread of its own; each
 * communicator has a worker thread that runs its posted groups one after the other (the
 * stream order), progressing every operation of a group together with poll(). A stream is a
 * counter of groups posted on it and not yet completed or dropped. Group state is
 * thread-local, as NCCL's is. Nothing here waits without a bound on abort: every loop polls
 * at most 20 ms at a time and checks the abort and revoke flags. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define FAKE_ID_MAGIC 0x4c43434eu /* "NCCL" */
#define FAKE_INIT_TIMEOUT_S 60.0
#define FAKE_MAX_RANKS 1024

/* A copy (or a free: free_dst) queued on a stream behind the groups posted before it. */
typedef struct fcopy {
  void *dst;
  const void *src;
  size_t bytes;
  int free_dst; /* cudaFreeAsync of dst */
  long after;   /* runs once this many groups of the stream ended */
  struct fcopy *next;
} fcopy_t;

struct fakecuda_stream {
  atomic_int pending;        /* groups posted and not completed or dropped */
  atomic_long posted, ended; /* groups posted, and ended (completed or dropped) */
  pthread_mutex_t mu;
  fcopy_t *copies, *copies_tail; /* (mu) in order */
};

/* A group on s completed or was dropped (ended counts before pending drops: a query that
 * sees nothing pending sees every group ended). */
static void stream_group_ended(struct fakecuda_stream *s) {
  atomic_fetch_add(&s->ended, 1);
  atomic_fetch_sub(&s->pending, 1);
}

/* A group is on its stream: a copy queued after this waits for it. */
static void stream_group_posted(struct fakecuda_stream *s) {
  atomic_fetch_add(&s->posted, 1);
  atomic_fetch_add(&s->pending, 1);
}

/* What a collective does once every send and receive of its group completed: the sum of
 * every rank's input in rank order into dst (in[me] is the caller's own input, read before
 * dst[i] is written, so in place works). Owned by its group (group_free). */
typedef struct fcoll {
  float *dst;
  const float *own;
  float **in; /* nranks inputs, in[me] unused (own) */
  int nranks, me;
  size_t count;
  struct fcoll *next;
} fcoll_t;

typedef struct fop {
  int send;
  int peer;
  uint8_t *buf;
  size_t bytes;
  uint8_t hdr[8];
  size_t hdr_done;
  uint64_t announced; /* recv: the length the sender wrote */
  size_t done;
  fcoll_t *coll; /* a collective's reduction: carried by an op that moves nothing (nop) */
  int nop;
  int hang;    /* fault: never progresses */
  int stalled; /* the peer's socket failed: never progresses (as NCCL on one host) */
  int complete;
} fop_t;

typedef struct fgroup {
  fop_t *ops;
  int nops;
  fcoll_t *colls; /* run in order once every op completed */
  struct fakecuda_stream *stream;
  int unlaunched; /* non-blocking: not yet on its stream (the worker launches it) */
  struct fgroup *next;
} fgroup_t;

/* Where a rank's listener is: an IPv4 address (network order) and a port. */
typedef struct fake_ep {
  uint32_t addr;
  uint16_t port;
  uint16_t pad;
} fake_ep_t;

struct fakenccl_comm {
  int nranks, rank, blocking;
  uint64_t nonce;
  fake_ep_t root;
  int listen_fd;
  fake_ep_t *eps; /* data listener of each rank */
  int *fds;       /* socket to each peer, -1 for self */
  _Atomic int async;
  atomic_int aborting, revoking, revoked_done, init_hang;
  atomic_int launching; /* non-blocking groups ended and not yet on their stream */
  pthread_t init_thread, worker;
  int init_started, worker_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fgroup_t *head, *tail;
  fop_t *self_sends; /* a self-send waits here for the self-recv of the same group */
  /* shrink */
  struct fakenccl_comm *parent;
  int *keep; /* parent ranks kept, in order */
  /* split: this rank's colour, key and new listener, exchanged with every rank of the
   * parent in a group on the parent (the records live here until the exchange ended) */
  struct fsplit *split;
  int splits; /* parent: splits made so far (the same sequence on every rank) */
};

typedef struct fsplit_rec {
  int32_t color, key;
  fake_ep_t ep;
} fsplit_rec_t;

struct fsplit {
  struct fakecuda_stream stream; /* the exchange's group, on the parent */
  fsplit_rec_t *all;             /* parent->nranks records */
  int parent_rank, parent_n;
  uint64_t seq;
};

static atomic_long op_counter;

/* ------------------------------------------------------------------ small helpers */
static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long env_long(const char *name) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : 0;
}

/* This process's address for its listeners: FAKE_NCCL_HOST (an IPv4 address its peers can
 * reach, e.g. a process in a network namespace of its own), else 127.0.0.1. */
static uint32_t my_addr(void) {
  const char *v = getenv("FAKE_NCCL_HOST");
  struct in_addr in;
  if (v && *v && inet_pton(AF_INET, v, &in) == 1)
    return in.s_addr;
  return htonl(INADDR_LOOPBACK);
}

static int listen_any(fake_ep_t *ep) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = my_addr()};
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    close(fd);
    return -1;
  }
  ep->addr = a.sin_addr.s_addr;
  ep->port = ntohs(a.sin_port);
  return fd;
}

/* Waits for fd to be ready for events, 20 ms at a time, until deadline or abort. */
static int wait_fd(struct fakenccl_comm *c, int fd, short events, double deadline) {
  for (;;) {
    if (atomic_load(&c->aborting) || mono() > deadline)
      return -1;
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, 20);
    if (n > 0)
      return 0;
    if (n < 0 && errno != EINTR)
      return -1;
  }
}

static int io_all(struct fakenccl_comm *c, int fd, void *buf, size_t len, int write_it,
                  double deadline) {
  uint8_t *p = buf;
  while (len > 0) {
    if (wait_fd(c, fd, write_it ? POLLOUT : POLLIN, deadline) != 0)
      return -1;
    ssize_t n =
        write_it ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
    if (n == 0)
      return -1;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR)
        continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int dial(struct fakenccl_comm *c, fake_ep_t ep, double deadline) {
  while (!atomic_load(&c->aborting) && mono() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return -1;
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(ep.port), .sin_addr.s_addr = ep.addr};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    close(fd);
    usleep(20000);
  }
  return -1;
}

static int accept_one(struct fakenccl_comm *c, int lfd, double deadline) {
  if (wait_fd(c, lfd, POLLIN, deadline) != 0)
    return -1;
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

/* ------------------------------------------------------------------ unique ids */
typedef struct root_entry {
  uint64_t nonce;
  int fd;
  struct root_entry *next;
} root_entry_t;
static root_entry_t *roots;
static pthread_mutex_t roots_mu = PTHREAD_MUTEX_INITIALIZER;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id)
    return ncclInvalidArgument;
  root_entry_t *e = calloc(1, sizeof *e);
  fake_ep_t ep = {0};
  if (!e)
    return ncclSystemError;
  e->fd = listen_any(&ep);
  if (e->fd < 0 || getrandom(&e->nonce, sizeof e->nonce, 0) != sizeof e->nonce) {
    if (e->fd >= 0)
      close(e->fd);
    free(e);
    return ncclSystemError;
  }
  memset(id, 0, sizeof *id);
  uint32_t magic = FAKE_ID_MAGIC;
  memcpy(id->internal, &magic, 4);
  memcpy(id->internal + 4, &ep.port, 2);
  memcpy(id->internal + 8, &e->nonce, 8);
  memcpy(id->internal + 16, &ep.addr, 4);
  pthread_mutex_lock(&roots_mu);
  e->next = roots;
  roots = e;
  pthread_mutex_unlock(&roots_mu);
  return ncclSuccess;
}

static int take_root(uint64_t nonce) {
  int fd = -1;
  pthread_mutex_lock(&roots_mu);
  for (root_entry_t **p = &roots; *p; p = &(*p)->next)
    if ((*p)->nonce == nonce) {
      root_entry_t *e = *p;
      fd = e->fd;
      *p = e->next;
      free(e);
      break;
    }
  pthread_mutex_unlock(&roots_mu);
  return fd;
}

/* ------------------------------------------------------------------ mesh set-up */
typedef struct hello { /* no implicit padding: every byte sent is set */
  uint64_t nonce;
  uint32_t rank;
  uint32_t pad;
  fake_ep_t ep;
} hello_t;

/* Every rank dials the lower ranks' data ports and accepts the higher ones. */
static int build_mesh(struct fakenccl_comm *c, double deadline) {
  for (int j = 0; j < c->rank; j++) {
    int fd = dial(c, c->eps[j], deadline);
    hello_t h = {.nonce = c->nonce, .rank = (uint32_t)c->rank};
    if (fd < 0)
      return -1;
    c->fds[j] = fd;
    if (io_all(c, fd, &h, sizeof h, 1, deadline) != 0)
      return -1;
  }
  int want = c->nranks - 1 - c->rank;
  while (want > 0) {
    int fd = accept_one(c, c->listen_fd, deadline);
    hello_t h;
    if (fd < 0)
      return -1;
    if (io_all(c, fd, &h, sizeof h, 0, deadline) != 0 || h.nonce != c->nonce ||
        (int)h.rank <= c->rank || (int)h.rank >= c->nranks || c->fds[h.rank] >= 0) {
      close(fd); /* a stale or foreign connection: not ours */
      continue;
    }
    c->fds[h.rank] = fd;
    want--;
  }
  return 0;
}

static int rendezvous(struct fakenccl_comm *c, double deadline) {
  if (c->rank == 0) {
    int root = take_root(c->nonce);
    if (root < 0)
      return -1; /* rank 0 must initialise in the process that made the id */
    int *peer = calloc((size_t)c->nranks, sizeof(int));
    int rc = peer ? 0 : -1;
    for (int i = 1; i < c->nranks && rc == 0; i++) {
      int fd = accept_one(c, root, deadline);
      hello_t h;
      if (fd < 0) {
        rc = -1;
        break;
      }
      if (io_all(c, fd, &h, sizeof h, 0, deadline) != 0 || h.nonce != c->nonce || h.rank == 0 ||
          (int)h.rank >= c->nranks || peer[h.rank]) {
        close(fd);
        i--;
        continue;
      }
      peer[h.rank] = fd;
      c->eps[h.rank] = h.ep;
    }
    for (int i = 1; i < c->nranks; i++)
      if (peer && peer[i] > 0) {
        if (rc == 0 && io_all(c, peer[i], c->eps, c->nranks * sizeof(fake_ep_t), 1, deadline) != 0)
          rc = -1;
        close(peer[i]);
      }
    free(peer);
    close(root);
    return rc;
  }
  int fd = dial(c, c->root, deadline);
  if (fd < 0)
    return -1;
  hello_t h = {.nonce = c->nonce, .rank = (uint32_t)c->rank, .ep = c->eps[c->rank]};
  int rc = io_all(c, fd, &h, sizeof h, 1, deadline);
  if (rc == 0)
    rc = io_all(c, fd, c->eps, c->nranks * sizeof(fake_ep_t), 0, deadline);
  close(fd);
  return rc;
}

static void *worker_main(void *arg);

/* 1 once the split's exchange group ended on the parent; -1 when it was dropped or the
 * parent failed or the deadline passed. */
static int split_exchanged(struct fakenccl_comm *parent, struct fsplit *sp, double deadline,
                           atomic_int *aborting) {
  while (atomic_load(&sp->stream.ended) < 1) {
    if ((aborting && atomic_load(aborting)) || atomic_load(&parent->aborting) || mono() > deadline)
      return -1;
    usleep(500);
  }
  return atomic_load(&parent->revoking) || atomic_load(&parent->async) != ncclSuccess ? -1 : 1;
}

/* Split: once the colours are known, this communicator's ranks are the parent's ranks of my
 * colour ordered by (key, parent rank); its mesh runs over listeners of its own. */
static int split_members(struct fakenccl_comm *c, double deadline) {
  struct fsplit *sp = c->split;
  if (split_exchanged(c->parent, sp, deadline, &c->aborting) < 0)
    return -1;
  int color = sp->all[sp->parent_rank].color, n = 0;
  int *m = malloc((size_t)sp->parent_n * sizeof(int));
  if (!m)
    return -1;
  for (int r = 0; r < sp->parent_n; r++)
    if (sp->all[r].color == color) {
      int k = n++; /* insertion by (key, parent rank) */
      while (k > 0 && sp->all[m[k - 1]].key > sp->all[r].key) {
        m[k] = m[k - 1];
        k--;
      }
      m[k] = r;
    }
  uint64_t h = (c->parent->nonce ^ (sp->seq * 0x9e3779b97f4a7c15ull)) * 0x100000001b3ull;
  c->nonce = (h ^ (uint64_t)(uint32_t)color) * 0x100000001b3ull;
  c->nranks = n;
  for (int k = 0; k < n; k++) {
    c->eps[k] = sp->all[m[k]].ep;
    if (m[k] == sp->parent_rank)
      c->rank = k;
  }
  free(m);
  return 0;
}

static void *init_main(void *arg) {
  struct fakenccl_comm *c = arg;
  double deadline = mono() + FAKE_INIT_TIMEOUT_S;
  if (atomic_load(&c->init_hang)) {
    while (!atomic_load(&c->aborting))
      usleep(10000);
    return NULL;
  }
  int rc = 0;
  if (c->split)
    rc = split_members(c, deadline);
  else if (!c->parent)
    rc = rendezvous(c, deadline);
  if (rc == 0)
    rc = build_mesh(c, deadline);
  if (rc == 0 && pthread_create(&c->worker, NULL, worker_main, c) == 0)
    c->worker_started = 1;
  else
    rc = -1;
  atomic_store(&c->async, rc == 0 ? ncclSuccess : ncclSystemError);
  return NULL;
}

static struct fakenccl_comm *comm_new(int nranks, int rank, const ncclConfig_t *config) {
  struct fakenccl_comm *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->nranks = nranks;
  c->rank = rank;
  c->blocking = !(config && config->blocking == 0);
  c->listen_fd = -1;
  c->eps = calloc((size_t)nranks, sizeof(fake_ep_t));
  c->fds = malloc((size_t)nranks * sizeof(int));
  if (!c->eps || !c->fds) {
    free(c->eps);
    free(c->fds);
    free(c);
    return NULL;
  }
  for (int i = 0; i < nranks; i++)
    c->fds[i] = -1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  atomic_store(&c->async, ncclInProgress);
  atomic_store(&c->init_hang, env_long("FAKE_NCCL_INIT_HANG") != 0);
  return c;
}

static ncclResult_t start_init(struct fakenccl_comm *c) {
  if (c->blocking) {
    init_main(c);
    return (ncclResult_t)atomic_load(&c->async);
  }
  if (pthread_create(&c->init_thread, NULL, init_main, c) != 0)
    return ncclSystemError;
  c->init_started = 1;
  return ncclInProgress;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
  uint32_t magic;
  memcpy(&magic, id.internal, 4);
  if (!out || nranks < 1 || nranks > FAKE_MAX_RANKS || rank < 0 || rank >= nranks ||
      magic != FAKE_ID_MAGIC)
    return ncclInvalidArgument;
  struct fakenccl_comm *c = comm_new(nranks, rank, config);
  if (!c)
    return ncclSystemError;
  memcpy(&c->root.port, id.internal + 4, 2);
  memcpy(&c->nonce, id.internal + 8, 8);
  memcpy(&c->root.addr, id.internal + 16, 4);
  c->listen_fd = listen_any(&c->eps[rank]);
  if (c->listen_fd < 0) {
    ncclCommAbort(c);
    return ncclSystemError;
  }
  *out = c;
  return start_init(c);
}

ncclResult_t ncclCommShrink(ncclComm_t parent, int *exclude, int nexclude, ncclComm_t *out,
                            ncclConfig_t *config, int flags) {
  (void)flags;
  /* NCCL 2.28 refuses a shrink that excludes nobody (seen with 2.28.3 and 2.28.9 on an H100) */
  if (!parent || !out || nexclude <= 0 || !exclude)
    return ncclInvalidArgument;
  uint8_t *gone = calloc((size_t)parent->nranks, 1);
  if (!gone)
    return ncclSystemError;
  uint64_t h = parent->nonce * 0x9e3779b97f4a7c15ull + 1;
  for (int i = 0; i < nexclude; i++) {
    if (exclude[i] < 0 || exclude[i] >= parent->nranks || exclude[i] == parent->rank) {
      free(gone);
      return ncclInvalidArgument;
    }
    gone[exclude[i]] = 1;
  }
  int n = 0, me = -1;
  for (int i = 0; i < parent->nranks; i++)
    if (!gone[i]) {
      h = (h ^ (uint64_t)i) * 0x100000001b3ull;
      if (i == parent->rank)
        me = n;
      n++;
    }
  ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
  inherit.blocking = parent->blocking ? 1 : 0;
  struct fakenccl_comm *c = comm_new(n, me, config ? config : &inherit);
  if (!c) {
    free(gone);
    return ncclSystemError;
  }
  c->nonce = h;
  c->parent = parent;
  for (int i = 0, k = 0; i < parent->nranks; i++)
    if (!gone[i])
      c->eps[k++] = parent->eps[i];
  free(gone);
  c->listen_fd = dup(parent->listen_fd); /* the parent's data listener, shared */
  if (c->listen_fd < 0) {
    ncclCommAbort(c);
    return ncclSystemError;
  }
  *out = c;
  return start_init(c);
}

static ncclResult_t submit(struct fakenccl_comm *c, struct fakecuda_stream *s, fop_t *ops, int n);

/* Every rank of the parent posts one group on it (its stream order, as NCCL orders a split
 * with the parent's operations): its record to every peer and theirs back. */
ncclResult_t ncclCommSplit(ncclComm_t parent, int color, int key, ncclComm_t *out,
                           ncclConfig_t *config) {
  if (!parent || !out || (color < 0 && color != NCCL_SPLIT_NOCOLOR))
    return ncclInvalidArgument;
  *out = NULL;
  if (atomic_load(&parent->async) != ncclSuccess || atomic_load(&parent->revoking))
    return ncclInvalidUsage;
  int n = parent->nranks, me = parent->rank;
  struct fsplit *sp = calloc(1, sizeof *sp);
  fop_t *ops = calloc((size_t)(2 * n), sizeof(fop_t));
  if (!sp || !ops || !(sp->all = calloc((size_t)n, sizeof(fsplit_rec_t)))) {
    free(sp);
    free(ops);
    return ncclSystemError;
  }
  pthread_mutex_init(&sp->stream.mu, NULL);
  sp->parent_rank = me;
  sp->parent_n = n;
  sp->seq = (uint64_t)++parent->splits;
  sp->all[me].color = color;
  sp->all[me].key = key;
  struct fakenccl_comm *c = NULL;
  if (color != NCCL_SPLIT_NOCOLOR) {
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = parent->blocking ? 1 : 0;
    c = comm_new(n, me, config ? config : &inherit);
    if (!c || (c->listen_fd = listen_any(&sp->all[me].ep)) < 0) {
      if (c)
        ncclCommAbort(c);
      free(sp->all);
      free(sp);
      free(ops);
      return ncclSystemError;
    }
    c->parent = parent;
    c->split = sp;
  }
  int k = 0;
  for (int r = 0; r < n; r++)
    if (r != me) {
      ops[k++] = (fop_t){
          .send = 1, .peer = r, .buf = (uint8_t *)&sp->all[me], .bytes = sizeof(fsplit_rec_t)};
      ops[k++] = (fop_t){
          .send = 0, .peer = r, .buf = (uint8_t *)&sp->all[r], .bytes = sizeof(fsplit_rec_t)};
    }
  ncclResult_t rc = k ? submit(parent, &sp->stream, ops, k) : ncclSuccess;
  free(ops);
  if (k == 0) /* alone: nothing to exchange */
    atomic_store(&sp->stream.ended, 1);
  if (rc != ncclSuccess) {
    if (c)
      c->split = NULL; /* nothing posted: freed here */
    ncclCommAbort(c);
    free(sp->all);
    free(sp);
    return rc;
  }
  if (!c) { /* no colour: take part in the exchange, get no communicator */
    int ok = split_exchanged(parent, sp, mono() + FAKE_INIT_TIMEOUT_S, NULL) > 0;
    if (ok) { /* else the parent may still write sp: leaked */
      pthread_mutex_destroy(&sp->stream.mu);
      free(sp->all);
      free(sp);
    }
    return ok ? ncclSuccess : ncclSystemError;
  }
  *out = c;
  return start_init(c);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  if (!c || !err)
    return ncclInvalidArgument;
  if (atomic_load(&c->revoking) && !atomic_load(&c->revoked_done)) {
    *err = ncclInProgress;
    return ncclSuccess;
  }
  *err = (ncclResult_t)atomic_load(&c->async);
  if (*err == ncclSuccess && atomic_load(&c->launching) > 0)
    *err = ncclInProgress; /* a group ended and not yet launched */
  return ncclSuccess;
}

/* ------------------------------------------------------------------ groups and the worker */
typedef struct pending_op {
  struct fakenccl_comm *comm;
  struct fakecuda_stream *stream;
  fop_t op;
} pending_op_t;

static _Thread_local int group_depth;
static _Thread_local pending_op_t *group_ops;
static _Thread_local int group_n, group_cap;

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

static ncclResult_t submit(struct fakenccl_comm *c, struct fakecuda_stream *s, fop_t *ops, int n) {
  fgroup_t *g = calloc(1, sizeof *g);
  if (!g)
    return ncclSystemError;
  g->ops = malloc((size_t)n * sizeof(fop_t));
  if (!g->ops) {
    free(g);
    return ncclSystemError;
  }
  memcpy(g->ops, ops, (size_t)n * sizeof(fop_t));
  g->nops = n;
  for (int i = n - 1; i >= 0; i--) /* the group owns the reductions now, in op order */
    if (g->ops[i].coll) {
      g->ops[i].coll->next = g->colls;
      g->colls = g->ops[i].coll;
      g->ops[i].coll = NULL;
    }
  g->stream = s;
  /* A non-blocking communicator's ncclGroupEnd returns ncclInProgress before the group is on
   * the stream: NCCL launches it from a thread of its own, and the async error stays
   * ncclInProgress until it did. The worker launches it here, after a pause, so work queued
   * on the stream before the async error said ncclSuccess runs before the group, as on a GPU. */
  if (c->blocking)
    stream_group_posted(s);
  else {
    g->unlaunched = 1;
    atomic_fetch_add(&c->launching, 1);
  }
  pthread_mutex_lock(&c->mu);
  if (c->tail)
    c->tail->next = g;
  else
    c->head = g;
  c->tail = g;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth <= 0)
    return ncclInvalidUsage;
  if (--group_depth > 0)
    return ncclSuccess;
  ncclResult_t rc = ncclSuccess;
  int nonblocking = 0;
  /* one group per (communicator, stream), in the order of first appearance */
  for (int i = 0; i < group_n; i++) {
    if (!group_ops[i].comm)
      continue;
    struct fakenccl_comm *c = group_ops[i].comm;
    struct fakecuda_stream *s = group_ops[i].stream;
    fop_t *ops = malloc((size_t)group_n * sizeof(fop_t));
    int n = 0;
    if (!ops) {
      rc = ncclSystemError;
      break;
    }
    for (int j = i; j < group_n; j++)
      if (group_ops[j].comm == c && group_ops[j].stream == s) {
        ops[n++] = group_ops[j].op;
        group_ops[j].comm = NULL;
      }
    nonblocking |= !c->blocking;
    ncclResult_t r = submit(c, s, ops, n);
    free(ops);
    if (r != ncclSuccess)
      rc = r;
  }
  group_n = 0;
  free(group_ops); /* thread-local: nothing would free it when the thread ends */
  group_ops = NULL;
  group_cap = 0;
  if (rc == ncclSuccess && nonblocking)
    return ncclInProgress; /* as a non-blocking communicator may answer: poll the async error */
  return rc;
}

static void coll_free(fcoll_t *k) {
  for (int r = 0; r < k->nranks; r++)
    free(k->in[r]);
  free(k->in);
  free(k);
}

/* Adds op to the calling thread's group, or submits it alone outside one. */
static ncclResult_t enqueue(ncclComm_t c, cudaStream_t s, fop_t op) {
  if (group_depth == 0) {
    ncclResult_t rc = submit(c, s, &op, 1);
    return rc == ncclSuccess && !c->blocking ? ncclInProgress : rc;
  }
  if (group_n == group_cap) {
    int cap = group_cap ? 2 * group_cap : 8;
    pending_op_t *p = realloc(group_ops, (size_t)cap * sizeof *p);
    if (!p)
      return ncclSystemError;
    group_ops = p;
    group_cap = cap;
  }
  group_ops[group_n++] = (pending_op_t){.comm = c, .stream = s, .op = op};
  return ncclSuccess;
}

/* The faults of the nth operation this process posts. */
static void faults(ncclComm_t c, fop_t *op) {
  long nth = atomic_fetch_add(&op_counter, 1) + 1;
  if (env_long("FAKE_NCCL_HANG_OP") == nth)
    op->hang = 1;
  if (env_long("FAKE_NCCL_REMOTE_ERROR_OP") == nth) {
    op->hang = 1;
    atomic_store(&c->async, ncclRemoteError);
  }
}

static ncclResult_t post(int send, const void *buf, size_t count, ncclDataType_t type, int peer,
                         ncclComm_t c, cudaStream_t s) {
  size_t elem = type == ncclFloat32 ? 4 : 1;
  if (!c || !s || peer < 0 || peer >= c->nranks || (count > 0 && !buf))
    return ncclInvalidArgument;
  if (atomic_load(&c->async) != ncclSuccess || atomic_load(&c->revoking))
    return ncclInvalidUsage;
  fop_t op = {.send = send, .peer = peer, .buf = (uint8_t *)buf, .bytes = count * elem};
  faults(c, &op);
  return enqueue(c, s, op);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  if (!c || !s || datatype != ncclFloat32 || op != ncclSum ||
      (count > 0 && (!sendbuff || !recvbuff)))
    return ncclInvalidArgument;
  if (atomic_load(&c->async) != ncclSuccess || atomic_load(&c->revoking))
    return ncclInvalidUsage;
  fcoll_t *k = calloc(1, sizeof *k);
  float **in = k ? calloc((size_t)c->nranks, sizeof(float *)) : NULL;
  if (!in) {
    free(k);
    return ncclSystemError;
  }
  *k = (fcoll_t){.dst = recvbuff,
                 .own = sendbuff,
                 .in = in,
                 .nranks = c->nranks,
                 .me = c->rank,
                 .count = count};
  for (int r = 0; r < c->nranks; r++)
    if (r != c->rank && !(in[r] = malloc(count * sizeof(float) + 1))) {
      coll_free(k);
      return ncclSystemError;
    }
  fop_t carrier = {.nop = 1, .complete = 1, .peer = -1, .coll = k};
  faults(c, &carrier);
  int hang = carrier.hang;
  carrier.hang = 0;
  ncclGroupStart();
  ncclResult_t rc = enqueue(c, s, carrier);
  for (int r = 0; r < c->nranks && rc == ncclSuccess; r++) {
    if (r == c->rank)
      continue;
    fop_t tx = {.send = 1, .peer = r, .buf = (uint8_t *)sendbuff, .bytes = count * 4, .hang = hang};
    fop_t rx = {.send = 0, .peer = r, .buf = (uint8_t *)in[r], .bytes = count * 4, .hang = hang};
    rc = enqueue(c, s, tx);
    if (rc == ncclSuccess)
      rc = enqueue(c, s, rx);
  }
  ncclResult_t end = ncclGroupEnd();
  return rc != ncclSuccess ? rc : end;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
                      cudaStream_t s) {
  return post(1, buf, count, type, peer, c, s);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
                      cudaStream_t s) {
  return post(0, buf, count, type, peer, c, s);
}

/* Moves what the socket takes now. */
static void progress(struct fakenccl_comm *c, fop_t *op) {
  int fd = c->fds[op->peer];
  for (;;) {
    ssize_t n;
    if (op->hdr_done < 8) {
      if (op->send && op->hdr_done == 0) {
        uint64_t len = op->bytes;
        memcpy(op->hdr, &len, 8);
      }
      n = op->send ? send(fd, op->hdr + op->hdr_done, 8 - op->hdr_done, MSG_NOSIGNAL | MSG_DONTWAIT)
                   : recv(fd, op->hdr + op->hdr_done, 8 - op->hdr_done, MSG_DONTWAIT);
    } else {
      if (!op->send && op->hdr_done == 8 && op->done == 0) {
        memcpy(&op->announced, op->hdr, 8);
        if (op->announced != op->bytes) {
          atomic_store(&c->async, ncclInvalidUsage);
          op->stalled = 1;
          return;
        }
      }
      if (op->done == op->bytes) {
        op->complete = 1;
        return;
      }
      n = op->send ? send(fd, op->buf + op->done, op->bytes - op->done, MSG_NOSIGNAL | MSG_DONTWAIT)
                   : recv(fd, op->buf + op->done, op->bytes - op->done, MSG_DONTWAIT);
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      op->stalled = 1; /* the peer is gone: NCCL on one host would just never finish */
      return;
    }
    if (n < 0)
      return;
    if (op->hdr_done < 8)
      op->hdr_done += (size_t)n;
    else
      op->done += (size_t)n;
  }
}

/* g completed or was dropped: off its stream (or never launched). */
static void group_ended(struct fakenccl_comm *c, fgroup_t *g) {
  if (g->unlaunched)
    atomic_fetch_sub(&c->launching, 1);
  else
    stream_group_ended(g->stream);
}

/* g ended: its reductions run when every op completed (ran = 1), before the stream sees it
 * end (a copy queued behind it reads the result); then it is off its stream and freed. */
static void group_finish(struct fakenccl_comm *c, fgroup_t *g, int ran) {
  while (g->colls) {
    fcoll_t *k = g->colls;
    g->colls = k->next;
    for (size_t i = 0; ran && i < k->count; i++) {
      float acc = k->me == 0 ? k->own[i] : k->in[0][i];
      for (int r = 1; r < k->nranks; r++)
        acc += r == k->me ? k->own[i] : k->in[r][i];
      k->dst[i] = acc;
    }
    coll_free(k);
  }
  group_ended(c, g);
  free(g->ops);
  free(g);
}

/* 1 when an earlier op of g still moves bytes the same way with the same peer: the pair's
 * socket carries one op's bytes at a time, in the order posted. */
static int behind(const fgroup_t *g, int i) {
  for (int j = 0; j < i; j++)
    if (!g->ops[j].complete && !g->ops[j].nop && g->ops[j].peer == g->ops[i].peer &&
        g->ops[j].send == g->ops[i].send)
      return 1;
  return 0;
}

/* 1 when every operation of g completed, 0 when it was dropped (revoke, abort). */
static int run_group(struct fakenccl_comm *c, fgroup_t *g) {
  /* self: a send to myself completes with the recv from myself of the same group */
  for (int i = 0; i < g->nops; i++) {
    fop_t *a = &g->ops[i];
    if (a->peer != c->rank || a->complete || a->hang)
      continue;
    for (int j = 0; j < g->nops; j++) {
      fop_t *b = &g->ops[j];
      if (j != i && b->peer == c->rank && b->send != a->send && !b->complete && !b->hang &&
          a->bytes == b->bytes) {
        fop_t *s = a->send ? a : b, *r = a->send ? b : a;
        memcpy(r->buf, s->buf, s->bytes);
        a->complete = b->complete = 1;
        break;
      }
    }
  }
  for (;;) {
    if (atomic_load(&c->aborting) || atomic_load(&c->revoking))
      return 0;
    struct pollfd pfd[64];
    int np = 0, left = 0;
    for (int i = 0; i < g->nops; i++) {
      fop_t *op = &g->ops[i];
      if (op->complete)
        continue;
      left++;
      if (op->hang || op->stalled || op->peer == c->rank || np == 64 || behind(g, i))
        continue;
      progress(c, op);
      if (op->complete) {
        left--;
        continue;
      }
      if (!op->stalled)
        pfd[np++] = (struct pollfd){.fd = c->fds[op->peer], .events = op->send ? POLLOUT : POLLIN};
    }
    if (left == 0)
      return 1;
    if (np == 0)
      usleep(20000);
    else
      poll(pfd, (nfds_t)np, 20);
  }
}

static void *worker_main(void *arg) {
  struct fakenccl_comm *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    if (atomic_load(&c->aborting))
      break;
    if (atomic_load(&c->revoking)) { /* drop everything posted: the streams become idle */
      while (c->head) {
        fgroup_t *g = c->head;
        c->head = g->next;
        group_finish(c, g, 0);
      }
      c->tail = NULL;
      atomic_store(&c->revoked_done, 1);
    }
    if (!c->head) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 20 * 1000 * 1000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&c->cv, &c->mu, &ts);
      continue;
    }
    fgroup_t *g = c->head;
    pthread_mutex_unlock(&c->mu);
    if (g->unlaunched) {
      const char *us = getenv("FAKE_NCCL_LAUNCH_US");
      usleep(us && *us ? (useconds_t)strtol(us, NULL, 10) : 300);
      stream_group_posted(g->stream);
      g->unlaunched = 0;
      atomic_fetch_sub(&c->launching, 1);
    }
    int done = run_group(c, g);
    pthread_mutex_lock(&c->mu);
    if (done || atomic_load(&c->revoking) || atomic_load(&c->aborting)) {
      c->head = g->next;
      if (!c->head)
        c->tail = NULL;
      group_finish(c, g, done && !atomic_load(&c->revoking) && !atomic_load(&c->aborting));
    }
  }
  while (c->head) {
    fgroup_t *g = c->head;
    c->head = g->next;
    group_finish(c, g, 0);
  }
  c->tail = NULL;
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

ncclResult_t ncclCommRevoke(ncclComm_t c, int flags) {
  if (!c || flags != NCCL_REVOKE_DEFAULT)
    return ncclInvalidArgument;
  atomic_store(&c->revoking, 1);
  if (!c->worker_started)
    atomic_store(&c->revoked_done, 1);
  pthread_mutex_lock(&c->mu);
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c)
    return ncclSuccess;
  atomic_store(&c->aborting, 1);
  pthread_mutex_lock(&c->mu);
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (c->init_started)
    pthread_join(c->init_thread, NULL);
  if (c->worker_started)
    pthread_join(c->worker, NULL);
  for (int i = 0; i < c->nranks; i++)
    if (c->fds[i] >= 0)
      close(c->fds[i]);
  if (c->listen_fd >= 0)
    close(c->listen_fd);
  if (!c->parent && c->rank == 0) {
    int root = take_root(c->nonce); /* an id never used for a rendezvous */
    if (root >= 0)
      close(root);
  }
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  if (c->split && atomic_load(&c->split->stream.ended) >= 1) { /* else the parent may still
                                                                 write it: leaked */
    pthread_mutex_destroy(&c->split->stream.mu);
    free(c->split->all);
    free(c->split);
  }
  free(c->eps);
  free(c->fds);
  free(c->keep);
  free(c);
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error (fake: rendezvous or socket failed)";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

/* ------------------------------------------------------------------ CUDA runtime */
cudaError_t cudaGetDeviceCount(int *count) {
  const char *v = getenv("FAKE_NCCL_DEVICES");
  if (!count)
    return cudaErrorInvalidValue;
  *count = v && *v ? atoi(v) : 1;
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}

static _Thread_local int current_device;

cudaError_t cudaSetDevice(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess)
    return cudaErrorNoDevice;
  if (device < 0 || device >= n)
    return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (!device)
    return cudaErrorInvalidValue;
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  (void)flags;
  if (!stream)
    return cudaErrorInvalidValue;
  *stream = calloc(1, sizeof(struct fakecuda_stream));
  if (!*stream)
    return cudaErrorMemoryAllocation;
  pthread_mutex_init(&(*stream)->mu, NULL);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority) {
  (void)priority;
  return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least)
    *least = 0;
  if (greatest)
    *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream)
    return cudaSuccess;
  while (stream->copies) { /* copies never run: the real call does not wait for them */
    fcopy_t *c = stream->copies;
    stream->copies = c->next;
    if (c->free_dst) /* the real one releases it once the work before it is done */
      free(c->dst);
    free(c);
  }
  pthread_mutex_destroy(&stream->mu);
  free(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!stream)
    return cudaErrorInvalidValue;
  int pending = atomic_load(&stream->pending);
  pthread_mutex_lock(&stream->mu);
  long ended = atomic_load(&stream->ended);
  while (stream->copies && stream->copies->after <= ended) {
    fcopy_t *c = stream->copies;
    if (c->free_dst)
      free(c->dst);
    else
      memcpy(c->dst, c->src, c->bytes);
    stream->copies = c->next;
    free(c);
  }
  if (!stream->copies)
    stream->copies_tail = NULL;
  int queued = stream->copies != NULL;
  pthread_mutex_unlock(&stream->mu);
  return pending > 0 || queued ? cudaErrorNotReady : cudaSuccess;
}

static _Thread_local cudaError_t last_error;
static atomic_long device_waits;

static cudaError_t failed(cudaError_t e) {
  last_error = e;
  return e;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

/* Which threads made such calls, and how many. */
#define WAITERS_MAX 64
static struct {
  pthread_t thread;
  long waits;
} waiters[WAITERS_MAX];
static int nwaiters;
static pthread_mutex_t waiters_mu = PTHREAD_MUTEX_INITIALIZER;

long fakecuda_device_waits_by(pthread_t thread) {
  long n = 0;
  pthread_mutex_lock(&waiters_mu);
  for (int i = 0; i < nwaiters; i++)
    if (pthread_equal(waiters[i].thread, thread))
      n = waiters[i].waits;
  pthread_mutex_unlock(&waiters_mu);
  return n;
}

/* What a call that synchronizes with the device costs while the application's compute
 * stream has FAKE_CUDA_SYNC_MS of work queued. */
static void wait_for_device(void) {
  atomic_fetch_add(&device_waits, 1);
  pthread_mutex_lock(&waiters_mu);
  int i = 0;
  while (i < nwaiters && !pthread_equal(waiters[i].thread, pthread_self()))
    i++;
  if (i == nwaiters && nwaiters < WAITERS_MAX)
    waiters[nwaiters++].thread = pthread_self();
  if (i < nwaiters)
    waiters[i].waits++;
  pthread_mutex_unlock(&waiters_mu);
  long ms = env_long("FAKE_CUDA_SYNC_MS");
  if (ms > 0)
    usleep((useconds_t)ms * 1000);
}

long fakecuda_device_waits(void) {
  return atomic_load(&device_waits);
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
  if (!ptr)
    return failed(cudaErrorInvalidValue);
  wait_for_device();
  *ptr = malloc(size ? size : 1);
  return *ptr ? cudaSuccess : failed(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void *ptr) {
  wait_for_device();
  free(ptr);
  return cudaSuccess;
}

/* Queues c behind what is pending on stream, or runs it now when nothing is. */
static cudaError_t stream_enqueue(cudaStream_t stream, fcopy_t c) {
  pthread_mutex_lock(&stream->mu);
  if (!stream->copies && atomic_load(&stream->pending) == 0) {
    if (c.free_dst)
      free(c.dst);
    else
      memcpy(c.dst, c.src, c.bytes);
    pthread_mutex_unlock(&stream->mu);
    return cudaSuccess;
  }
  fcopy_t *q = malloc(sizeof *q);
  if (!q) {
    pthread_mutex_unlock(&stream->mu);
    return failed(cudaErrorMemoryAllocation);
  }
  *q = c;
  q->next = NULL;
  q->after = atomic_load(&stream->posted);
  if (stream->copies_tail)
    stream->copies_tail->next = q;
  else
    stream->copies = q;
  stream->copies_tail = q;
  pthread_mutex_unlock(&stream->mu);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream) {
  if (!ptr || !stream)
    return failed(cudaErrorInvalidValue);
  *ptr = NULL;
  if (env_long("FAKE_CUDA_NO_MEMORY_POOLS"))
    return failed(cudaErrorNotSupported);
  *ptr = malloc(size ? size : 1);
  return *ptr ? cudaSuccess : failed(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
  if (!stream)
    return failed(cudaErrorInvalidValue);
  if (env_long("FAKE_CUDA_NO_MEMORY_POOLS"))
    return failed(cudaErrorNotSupported);
  if (!ptr)
    return cudaSuccess;
  return stream_enqueue(stream, (fcopy_t){.dst = ptr, .free_dst = 1});
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  (void)kind;
  if (count > 0 && (!dst || !src))
    return cudaErrorInvalidValue;
  if (count > 0)
    memcpy(dst, src, count);
  return cudaSuccess;
}

/* Page-locked host memory: the ranges cudaHostAlloc handed out and not yet freed. */
typedef struct flocked {
  const uint8_t *base;
  size_t bytes;
} flocked_t;
static pthread_mutex_t locked_mu = PTHREAD_MUTEX_INITIALIZER;
static flocked_t *locked;
static size_t nlocked, locked_cap;
static atomic_long pageable_copies, locked_copies;

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  (void)flags;
  if (!ptr)
    return cudaErrorInvalidValue;
  *ptr = NULL;
  wait_for_device();
  if (env_long("FAKE_CUDA_NO_HOST_ALLOC"))
    return failed(cudaErrorMemoryAllocation); /* page-locked memory is short */
  void *p = aligned_alloc(4096, (size ? size + 4095 : 4096) & ~(size_t)4095);
  if (!p)
    return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&locked_mu);
  if (nlocked == locked_cap) {
    size_t cap = locked_cap ? 2 * locked_cap : 64;
    flocked_t *n = realloc(locked, cap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&locked_mu);
      free(p);
      return cudaErrorMemoryAllocation;
    }
    locked = n;
    locked_cap = cap;
  }
  locked[nlocked++] = (flocked_t){.base = p, .bytes = size};
  pthread_mutex_unlock(&locked_mu);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
  if (!ptr)
    return cudaSuccess;
  wait_for_device();
  pthread_mutex_lock(&locked_mu);
  size_t i = 0;
  while (i < nlocked && locked[i].base != ptr)
    i++;
  int found = i < nlocked;
  if (found)
    locked[i] = locked[--nlocked];
  pthread_mutex_unlock(&locked_mu);
  if (!found)
    return cudaErrorInvalidValue;
  free(ptr);
  return cudaSuccess;
}

static int is_locked(const void *p, size_t bytes) {
  const uint8_t *b = p;
  int yes = 0;
  pthread_mutex_lock(&locked_mu);
  for (size_t i = 0; i < nlocked && !yes; i++)
    yes = b >= locked[i].base && b + bytes <= locked[i].base + locked[i].bytes;
  pthread_mutex_unlock(&locked_mu);
  return yes;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!stream || (count > 0 && (!dst || !src)))
    return cudaErrorInvalidValue;
  if (count == 0)
    return cudaSuccess;
  const void *host = kind == cudaMemcpyHostToDevice   ? src
                     : kind == cudaMemcpyDeviceToHost ? dst
                                                      : NULL;
  int locked_host = host && is_locked(host, count);
  if (host)
    atomic_fetch_add(locked_host ? &locked_copies : &pageable_copies, 1);
  if (kind == cudaMemcpyDeviceToHost && !locked_host) {
    /* into pageable memory the real call returns only once the copy is done, i.e. after all
     * that is before it on the stream: wait as it would (for 10 s at most, then fail, so a
     * test reports a lane thread that would hang instead of hanging) */
    double until = mono() + 10.0;
    while (cudaStreamQuery(stream) == cudaErrorNotReady && mono() < until)
      usleep(1000);
    if (cudaStreamQuery(stream) == cudaErrorNotReady)
      return cudaErrorNotReady;
  }
  return stream_enqueue(stream, (fcopy_t){.dst = dst, .src = src, .bytes = count});
}

long fakecuda_pageable_copies(void) {
  return atomic_load(&pageable_copies);
}

long fakecuda_locked_copies(void) {
  return atomic_load(&locked_copies);
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorNotSupported: return "operation not supported";
  default: return "unknown error";
  }
}
