/* test_mesh.c — the TCP transport's mesh setup (tcp_mesh.c) under a hostile network and a
 * slow resolver, between real processes on loopback:
 *  - a connection flood: the parent holds hundreds of connections to rank 0's port while the
 *    members connect, reopening every one the member closes at once and every one before it
 *    would time out, from one source address, from eight (127.0.0.2, ...), and with a valid
 *    step 1 (the public plan's epoch and rank 1) before its silence. The members must still be
 *    alive to each other, within the connect deadline, and their allreduce must work;
 *  - a connection that never says HELLO is dropped after WG_TCP_HELLO_SILENT_S;
 *  - host names: resolved once per member, off the handshake loop (a resolver that fails once
 *    and then takes 0.5 s per answer is asked at most twice), a name that never resolves or
 *    hangs costs only its own member and the connect deadline, and cancel ends a wait for a
 *    resolver.
 * The resolver is this file's getaddrinfo, which the transport (a static library) links
 * instead of libc's: names under .wagma.test behave as above, every other name goes to libc's. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll.h"
#include "tcp_internal.h"
#include "world.h"

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

static const wg_transport_ops_t *ops = &wg_tcp_transport;

#define MAXR 4
#define FLOOD_HOLD 256

typedef struct mesh_report {
  volatile int flood_ready; /* the flood holds its connections: rank 1 may open */
  int done;                 /* members finished (atomic) */
  int open_rc[MAXR];
  double open_s[MAXR]; /* how long open took */
  int alive[MAXR][MAXR];
  int allreduce_rc[MAXR];
  uint64_t rejected[MAXR];
  long flood_opened, flood_dropped; /* connections the flood opened; the member closed */
  int gai_slow[MAXR], gai_never[MAXR], gai_hang[MAXR]; /* calls per process and name */
} mesh_report_t;

/* ---------------------------------------------------------------- the resolver */

static mesh_report_t *g_rep; /* set before the fork */
static int g_rank = -1;      /* the child's rank */
static int g_slow_failed;    /* this process's first "slow" call failed already */

static void count(int *calls) {
  if (g_rep != NULL && g_rank >= 0 && g_rank < MAXR)
    __atomic_fetch_add(&calls[g_rank], 1, __ATOMIC_SEQ_CST);
}

/* Names under .wagma.test, looked up (not AI_NUMERICHOST): "slow" fails once (EAI_AGAIN), then
 * answers 127.0.0.1 after 0.5 s; "never" does not exist; "hang" answers nothing for 8 s. */
int getaddrinfo(const char *restrict node, const char *restrict service,
                const struct addrinfo *restrict hints, struct addrinfo **restrict res) {
  typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
  static gai_fn real;
  if (real == NULL)
    real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
  if (hints != NULL && (hints->ai_flags & AI_NUMERICHOST))
    return real(node, service, hints, res); /* no lookup: libc's answer for a name is right */
  if (node != NULL && strcmp(node, "slow.wagma.test") == 0) {
    count(g_rep ? g_rep->gai_slow : NULL);
    if (!__atomic_exchange_n(&g_slow_failed, 1, __ATOMIC_SEQ_CST))
      return EAI_AGAIN;
    usleep(500000);
    return real("127.0.0.1", service, hints, res);
  }
  if (node != NULL && strcmp(node, "never.wagma.test") == 0) {
    count(g_rep ? g_rep->gai_never : NULL);
    return EAI_NONAME;
  }
  if (node != NULL && strcmp(node, "hang.wagma.test") == 0) {
    count(g_rep ? g_rep->gai_hang : NULL);
    usleep(8000000);
    return EAI_AGAIN;
  }
  return real(node, service, hints, res);
}

/* ---------------------------------------------------------------- members */

typedef struct mesh_case {
  int late_rank;      /* opens only once the flood is ready, or -1 */
  double connect_s;   /* connect timeout */
  int cancel_after_s; /* > 0: open is cancelled after this long (rank 0 only) */
} mesh_case_t;

static int allreduce_alive(wg_transport_t *t, int rank, int nranks, const int *alive) {
  int ranks[MAXR], n = 0;
  for (int r = 0; r < nranks; r++)
    if (alive[r])
      ranks[n++] = r;
  enum { COUNT = 5000 };
  static float buf[COUNT];
  for (size_t i = 0; i < COUNT; i++)
    buf[i] = (float)((i % 11) * (size_t)(rank + 1));
  wg_coll_ctx_t ctx = {
      .ops = ops, .transport = t, .rank = rank, .ranks = ranks, .nranks = n, .round = 1};
  int rc = wg_coll_allreduce(&ctx, buf, COUNT, WAGMA_REDUCE_SUM, wg_now() + 30);
  size_t factor = 0;
  for (int q = 0; q < n; q++)
    factor += (size_t)(ranks[q] + 1);
  for (size_t i = 0; i < COUNT && rc == 0; i++)
    if (buf[i] != (float)((i % 11) * factor))
      rc = -100;
  return rc;
}

static double cancel_at;
static int cancel_now(void *user) {
  (void)user;
  return wg_now() >= cancel_at;
}

/* A member: opens (the late one once the flood is ready), records its open's result and
 * time, who it sees alive, and runs an allreduce over the ranks alive to it. */
static int run_member(world_t *w, int rank, void *arg) {
  const mesh_case_t *mc = arg;
  mesh_report_t *rep = w->shared;
  g_rank = rank;
  if (rank == mc->late_rank) {
    double deadline = wg_now() + 20;
    while (!rep->flood_ready && wg_now() < deadline)
      usleep(5000);
  }
  wg_transport_config_t cfg = {0};
  cfg.plan = &w->plan;
  cfg.rank = rank;
  cfg.epoch = w->epoch;
  cfg.connect_timeout_s = mc->connect_s;
  cfg.auth.secret = w->secret;
  cfg.auth.secret_len = w->secret_len;
  cfg.log = world_log;
  if (mc->cancel_after_s > 0 && rank == 0) {
    cancel_at = wg_now() + mc->cancel_after_s;
    cfg.cancelled = cancel_now;
  }
  wg_transport_t *t = NULL;
  double t0 = wg_now();
  int rc = ops->open(&cfg, &t);
  rep->open_s[rank] = wg_now() - t0;
  rep->open_rc[rank] = rc;
  if (rc != 0) {
    __atomic_fetch_add(&rep->done, 1, __ATOMIC_SEQ_CST);
    return 0;
  }
  for (int r = 0; r < w->nranks; r++)
    rep->alive[rank][r] = r == rank || ops->peer_alive(t, r);
  rep->allreduce_rc[rank] = allreduce_alive(t, rank, w->nranks, rep->alive[rank]);
  wg_transport_stats_t st;
  ops->stats(t, &st);
  rep->rejected[rank] = st.frames_rejected;
  __atomic_fetch_add(&rep->done, 1, __ATOMIC_SEQ_CST);
  /* Stay until every member is done, so nobody's allreduce loses a peer that closed. */
  double deadline = wg_now() + 30;
  while (__atomic_load_n(&rep->done, __ATOMIC_SEQ_CST) < w->nranks && wg_now() < deadline)
    usleep(5000);
  ops->close(t);
  return 0;
}

/* ---------------------------------------------------------------- the flood */

typedef struct flood {
  mesh_case_t mc; /* first: the members get the same argument as the parent */
  int nsources;   /* source addresses 127.0.0.2 ... 127.0.0.(1 + nsources); 0: 127.0.0.1 */
  int send_step1; /* each connection sends a valid step 1 as rank 1, then stays silent */
} flood_t;

typedef struct flood_conn {
  int fd;
  int connecting;
  double born;
} flood_conn_t;

static void flood_open(world_t *w, const flood_t *f, flood_conn_t *c, int i,
                       const struct sockaddr_in *dst) {
  (void)w;
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  c->born = wg_now();
  c->connecting = 1;
  if (c->fd < 0)
    return;
  struct sockaddr_in src = {.sin_family = AF_INET, .sin_port = 0};
  src.sin_addr.s_addr = htonl(0x7f000001u + (uint32_t)(f->nsources ? 1 + i % f->nsources : 0));
  int one = 1;
  setsockopt(c->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  if (bind(c->fd, (struct sockaddr *)&src, sizeof src) != 0 ||
      (connect(c->fd, (const struct sockaddr *)dst, sizeof *dst) != 0 && errno != EINPROGRESS)) {
    close(c->fd);
    c->fd = -1;
  }
}

/* The parent: floods rank 0's port until every member is done (at most 40 s). A connection
 * is reopened as soon as the member closes it and before it is 0.9 s old (under the silent
 * limit of the member), always keeping FLOOD_HOLD open. */
static int flood_parent(world_t *w, void *arg) {
  const flood_t *f = arg;
  mesh_report_t *rep = w->shared;
  struct sockaddr_in dst = {.sin_family = AF_INET};
  unsigned port = 0;
  if (sscanf(w->plan.members[0].address, "127.0.0.1:%u", &port) != 1)
    return 1;
  dst.sin_port = htons((uint16_t)port);
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  uint8_t step1[WG_FRAME_HEADER_SIZE + WG_HELLO_STEP1_LEN] = {0};
  wg_frame_header_t h = {.magic = WG_FRAME_MAGIC,
                         .version = WG_FRAME_VERSION,
                         .kind = WG_FRAME_HELLO,
                         .epoch = w->epoch,
                         .src = 1,
                         .seq = 1,
                         .length = WG_HELLO_STEP1_LEN,
                         .aux = (uint64_t)w->nranks,
                         .flags = WG_HELLO_F_AUTH};
  wg_frame_encode(&h, step1);
  static flood_conn_t conns[FLOOD_HOLD];
  static struct pollfd pfds[FLOOD_HOLD];
  for (int i = 0; i < FLOOD_HOLD; i++)
    conns[i].fd = -1;
  double start = wg_now(), deadline = start + 40;
  long connected = 0;
  while (__atomic_load_n(&rep->done, __ATOMIC_SEQ_CST) < w->nranks && wg_now() < deadline) {
    double now = wg_now();
    for (int i = 0; i < FLOOD_HOLD; i++) {
      flood_conn_t *c = &conns[i];
      if (c->fd >= 0 && now - c->born > 0.9) {
        close(c->fd);
        c->fd = -1;
      }
      if (c->fd < 0) {
        flood_open(w, f, c, i, &dst);
        rep->flood_opened++;
      }
      pfds[i].fd = c->fd;
      pfds[i].events = c->connecting ? POLLOUT : POLLIN;
      pfds[i].revents = 0;
    }
    if (poll(pfds, FLOOD_HOLD, 1) < 0)
      continue;
    for (int i = 0; i < FLOOD_HOLD; i++) {
      flood_conn_t *c = &conns[i];
      if (c->fd < 0 || pfds[i].revents == 0)
        continue;
      int err = 0;
      socklen_t len = sizeof err;
      if (c->connecting) {
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
          close(c->fd);
          c->fd = -1;
          continue;
        }
        c->connecting = 0;
        connected++;
        if (f->send_step1)
          (void)send(c->fd, step1, sizeof step1, MSG_NOSIGNAL | MSG_DONTWAIT);
        continue;
      }
      uint8_t b[256];
      ssize_t n = recv(c->fd, b, sizeof b, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close(c->fd); /* the member dropped it: open another at once */
        c->fd = -1;
        rep->flood_dropped++;
      }
    }
    /* Rank 1 opens once the flood has filled rank 0's table and backlog for a while. */
    if (!rep->flood_ready && connected >= FLOOD_HOLD && now - start > 1.0)
      rep->flood_ready = 1;
    if (!rep->flood_ready && now - start > 5.0)
      rep->flood_ready = 1; /* rank 0 never listened: let the test fail on its own terms */
  }
  for (int i = 0; i < FLOOD_HOLD; i++)
    if (conns[i].fd >= 0)
      close(conns[i].fd);
  return 0;
}

static void run_flood(const char *name, const flood_t *f) {
  world_t w;
  assert_int_equal(world_init(&w, 2, sizeof(mesh_report_t)), 0);
  mesh_report_t *rep = w.shared;
  int codes[2], prc = -1;
  assert_int_equal(world_run(&w, run_member, (void *)f, 60, NULL, codes, flood_parent, &prc), 0);
  fprintf(stderr,
          "%s: flood opened %ld (member closed %ld); open rc %d/%d in %.2f/%.2f s; alive 0->1 %d, "
          "1->0 %d; rank 0 rejected %llu; allreduce %d/%d\n",
          name, rep->flood_opened, rep->flood_dropped, rep->open_rc[0], rep->open_rc[1],
          rep->open_s[0], rep->open_s[1], rep->alive[0][1], rep->alive[1][0],
          (unsigned long long)rep->rejected[0], rep->allreduce_rc[0], rep->allreduce_rc[1]);
  assert_int_equal(prc, 0);
  assert_true(rep->flood_opened >= FLOOD_HOLD);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(codes[r], 0);
    assert_int_equal(rep->open_rc[r], 0);
    assert_true(rep->open_s[r] < f->mc.connect_s + 0.5);
    assert_int_equal(rep->allreduce_rc[r], 0);
  }
  assert_int_equal(rep->alive[0][1], 1);
  assert_int_equal(rep->alive[1][0], 1);
  world_free(&w);
}

static void test_flood_one_source(void **state) {
  (void)state;
  flood_t f = {.nsources = 1, .mc = {.late_rank = 1, .connect_s = 3}};
  run_flood("flood from 127.0.0.2", &f);
}

static void test_flood_many_sources(void **state) {
  (void)state;
  flood_t f = {.nsources = 8, .mc = {.late_rank = 1, .connect_s = 3}};
  run_flood("flood from 127.0.0.2-9", &f);
}

static void test_flood_step1_many_sources(void **state) {
  (void)state;
  flood_t f = {.nsources = 8, .send_step1 = 1, .mc = {.late_rank = 1, .connect_s = 3}};
  run_flood("step-1 flood from 127.0.0.2-9", &f);
}

static void test_flood_members_source(void **state) {
  (void)state;
  flood_t f = {.nsources = 0, .mc = {.late_rank = 1, .connect_s = 3}};
  run_flood("flood from 127.0.0.1 (the members' address)", &f);
}

/* ---------------------------------------------------------------- a silent connection */

#ifndef WG_TCP_HELLO_SILENT_S
#define WG_TCP_HELLO_SILENT_S 1.0 /* what this test expects */
#endif

/* Rank 1 waits; a silent connection to rank 0 must be dropped after WG_TCP_HELLO_SILENT_S. */
static int silent_parent(world_t *w, void *arg) {
  (void)arg;
  mesh_report_t *rep = w->shared;
  int fd = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  double t0 = wg_now();
  int rc = fd < 0 || world_raw_wait_dropped(fd) != 0 ? 1 : 0;
  double took = wg_now() - t0;
  fprintf(stderr, "silent connection dropped after %.2f s\n", took);
  if (rc == 0 && (took < WG_TCP_HELLO_SILENT_S - 0.1 || took > WG_TCP_HELLO_SILENT_S + 0.6))
    rc = 2;
  if (fd >= 0)
    close(fd);
  rep->flood_ready = 1;
  return rc;
}

static void test_silent_connection_dropped(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 2, sizeof(mesh_report_t)), 0);
  mesh_report_t *rep = w.shared;
  mesh_case_t mc = {.late_rank = 1, .connect_s = 10};
  int codes[2], prc = -1;
  assert_int_equal(world_run(&w, run_member, &mc, 60, NULL, codes, silent_parent, &prc), 0);
  assert_int_equal(prc, 0);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(codes[r], 0);
    assert_int_equal(rep->open_rc[r], 0);
    assert_int_equal(rep->allreduce_rc[r], 0);
  }
  assert_int_equal(rep->alive[0][1], 1);
  assert_int_equal(rep->rejected[0], 1);
  world_free(&w);
}

/* ---------------------------------------------------------------- host names */

static void set_host(world_t *w, int rank, const char *host) {
  char *colon = strrchr(w->plan.members[rank].address, ':');
  char port[16];
  snprintf(port, sizeof port, "%s", colon + 1);
  snprintf(w->plan.members[rank].address, WAGMA_ADDRESS_MAX, "%s:%s", host, port);
}

/* Rank 0 is slow.wagma.test, rank 1 localhost (libc's resolver), rank 2 an IP: all connect,
 * and each process asks for slow.wagma.test at most twice (its first answer fails). */
static void test_names_resolved_once(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 3, sizeof(mesh_report_t)), 0);
  set_host(&w, 0, "slow.wagma.test");
  set_host(&w, 1, "localhost");
  mesh_report_t *rep = w.shared;
  g_rep = rep;
  mesh_case_t mc = {.late_rank = -1, .connect_s = 5};
  int codes[3];
  assert_int_equal(world_run(&w, run_member, &mc, 60, NULL, codes, NULL, NULL), 0);
  g_rep = NULL;
  for (int r = 0; r < 3; r++) {
    fprintf(stderr, "rank %d: open rc %d in %.2f s, slow.wagma.test asked %d times\n", r,
            rep->open_rc[r], rep->open_s[r], rep->gai_slow[r]);
    assert_int_equal(codes[r], 0);
    assert_int_equal(rep->open_rc[r], 0);
    assert_int_equal(rep->allreduce_rc[r], 0);
    for (int q = 0; q < 3; q++)
      assert_int_equal(rep->alive[r][q], 1);
    assert_true(rep->gai_slow[r] >= 1 && rep->gai_slow[r] <= 2);
  }
  world_free(&w);
}

/* Rank 0's name hangs, rank 1's does not exist, ranks 2 and 3 are IPs; connect timeout 2 s.
 * Ranks 2 and 3 connect to each other and open within the deadline; rank 0's open ends with
 * WAGMA_ETIMEDOUT, rank 1's with WAGMA_EINVAL, both within the deadline too. */
static void test_unresolved_names_keep_the_deadline(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 4, sizeof(mesh_report_t)), 0);
  set_host(&w, 0, "hang.wagma.test");
  set_host(&w, 1, "never.wagma.test");
  mesh_report_t *rep = w.shared;
  g_rep = rep;
  mesh_case_t mc = {.late_rank = -1, .connect_s = 2};
  int codes[4];
  assert_int_equal(world_run(&w, run_member, &mc, 60, NULL, codes, NULL, NULL), 0);
  g_rep = NULL;
  for (int r = 0; r < 4; r++) {
    fprintf(stderr,
            "rank %d: open rc %d in %.2f s; asked hang %d, never %d times; alive %d%d%d%d\n", r,
            rep->open_rc[r], rep->open_s[r], rep->gai_hang[r], rep->gai_never[r], rep->alive[r][0],
            rep->alive[r][1], rep->alive[r][2], rep->alive[r][3]);
    assert_int_equal(codes[r], 0);
    assert_true(rep->open_s[r] < mc.connect_s + 0.5);
    assert_true(rep->gai_never[r] <= 8); /* retried now and then, not once per dial */
  }
  assert_int_equal(rep->open_rc[0], WAGMA_ETIMEDOUT);
  assert_int_equal(rep->open_rc[1], WAGMA_EINVAL);
  for (int r = 2; r < 4; r++) {
    assert_int_equal(rep->open_rc[r], 0);
    assert_int_equal(rep->alive[r][0], 0);
    assert_int_equal(rep->alive[r][1], 0);
    assert_int_equal(rep->alive[r][5 - r], 1);
    assert_int_equal(rep->allreduce_rc[r], 0);
  }
  world_free(&w);
}

/* Rank 0 waits for its own name (it hangs) and is cancelled after 1 s: open ends then. */
static void test_cancel_while_resolving(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 2, sizeof(mesh_report_t)), 0);
  set_host(&w, 0, "hang.wagma.test");
  mesh_report_t *rep = w.shared;
  mesh_case_t mc = {.late_rank = -1, .connect_s = 6, .cancel_after_s = 1};
  int mode[2] = {WORLD_SPAWN, 0}, codes[2];
  assert_int_equal(world_run(&w, run_member, &mc, 60, mode, codes, NULL, NULL), 0);
  fprintf(stderr, "cancelled: open rc %d in %.2f s\n", rep->open_rc[0], rep->open_s[0]);
  assert_int_equal(codes[0], 0);
  assert_int_equal(rep->open_rc[0], WAGMA_ECANCELED);
  assert_true(rep->open_s[0] >= 0.9 && rep->open_s[0] < 1.3);
  world_free(&w);
}

int main(int argc, char **argv) {
  if (argc > 1)
    cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_silent_connection_dropped),
      cmocka_unit_test(test_flood_one_source),
      cmocka_unit_test(test_flood_many_sources),
      cmocka_unit_test(test_flood_step1_many_sources),
      cmocka_unit_test(test_flood_members_source),
      cmocka_unit_test(test_names_resolved_once),
      cmocka_unit_test(test_unresolved_names_keep_the_deadline),
      cmocka_unit_test(test_cancel_while_resolving),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
