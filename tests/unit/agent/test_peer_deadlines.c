/* test_peer_deadlines: the bounds of the agent's peer endpoints' served connections
 * (agent/peer_io.h; adpsgd.c, ps.c, peer_server.c) over real loopback TCP, in one process:
 * - every accepted and every connected socket has TCP keepalive with the short probes and
 *   TCP_USER_TIMEOUT (a peer whose host vanishes ends the wait), and a connection whose serve
 *   returned is joined and no longer counted;
 * - an AD-PSGD passive closes a connection that sent a valid request header and never its
 *   model, and one that never sent anything, within the frame bound (twice the epoch's
 *   exchange deadline, at least 2 s), with a log line naming the peer; the connection's thread
 *   is joined, and a well-behaved active is served afterwards;
 * - a parameter-server shard does the same for a push whose gradient stops halfway;
 * - a connection idle past the idle bound is closed, and the active's next averaging connects
 *   afresh instead of failing on the closed connection;
 * - more stalled connections than the endpoint's limit (WG_PEER_MAX_CONNS): all are closed
 *   within the bound and a legitimate active is served again.
 * Label timing: the assertions bound wall-clock times. */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/adpsgd.h"
#include "agent/peer_io.h"
#include "agent/ps.h"
#include "wagma/clock_internal.h"

#define N 1000
#define DEADLINE_S 0.5 /* the epoch's exchange deadline: the frame bound is its floor, 2 s */
#define FRAME_S WG_PEER_FRAME_MIN_S

/* ---- log capture ------------------------------------------------------------------------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

static void capture_log(void *user, int level, const char *msg) {
  (void)user;
  (void)level;
  pthread_mutex_lock(&log_mu);
  size_t used = strlen(log_text);
  if (used + strlen(msg) + 2 < sizeof log_text) {
    strcat(log_text, msg);
    strcat(log_text, "\n");
  }
  pthread_mutex_unlock(&log_mu);
}

static int log_has(const char *needle) {
  pthread_mutex_lock(&log_mu);
  int has = strstr(log_text, needle) != NULL;
  pthread_mutex_unlock(&log_mu);
  return has;
}

static void log_reset(void) {
  pthread_mutex_lock(&log_mu);
  log_text[0] = '\0';
  pthread_mutex_unlock(&log_mu);
}

/* ---- helpers ----------------------------------------------------------------------------- */

typedef struct gossip_header { /* adpsgd.h's wire format */
  uint32_t magic;
  uint16_t version, kind;
  uint64_t epoch, token, count, reserved;
} gossip_header_t;

typedef struct ps_header { /* ps.h's wire format */
  uint32_t magic;
  uint16_t version, kind;
  uint64_t epoch, token, a, b, count;
  double loss;
  uint64_t rank;
} ps_header_t;

static int connect_to(uint16_t port) {
  int fd = -1;
  assert_int_equal(wg_peer_connect("127.0.0.1", port, wg_mono() + 5.0, &fd), 0);
  return fd;
}

/* Seconds until the server closes fd (EOF or reset), at most limit_s (then limit_s + 1). */
static double wait_closed(int fd, double limit_s) {
  double t0 = wg_mono();
  char b[256];
  for (double left = limit_s; left > 0; left = limit_s - (wg_mono() - t0)) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, left < 0.05 ? (int)(left * 1000.0) : 50) == 1) {
      ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return wg_mono() - t0;
    }
  }
  return limit_s + 1;
}

static uint16_t local_port(int fd) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
  return ntohs(sa.sin_port);
}

/* A passive (rank 1) and an active (rank 0) of epoch 7. */
typedef struct pair {
  wg_adpsgd_t *g[2];
  wg_adpsgd_peer_t peers[2];
  float model[2][N];
  double deadline_s;
} pair_t;

static void pair_epoch(pair_t *p) {
  for (int r = 0; r < 2; r++)
    assert_int_equal(wg_adpsgd_set_epoch(p->g[r], 7, r, 2, p->peers, 100 + (uint64_t)r,
                                         p->deadline_s, 10.0, p->model[r]),
                     0);
}

static void pair_open(pair_t *p, double deadline_s) {
  memset(p, 0, sizeof *p);
  p->deadline_s = deadline_s;
  for (int r = 0; r < 2; r++) {
    assert_int_equal(wg_adpsgd_open("127.0.0.1", N, capture_log, NULL, &p->g[r]), 0);
    snprintf(p->peers[r].host, sizeof p->peers[r].host, "127.0.0.1");
    p->peers[r].port = wg_adpsgd_port(p->g[r]);
    p->peers[r].token = 100 + (uint64_t)r;
    for (int i = 0; i < N; i++)
      p->model[r][i] = (float)(r * 2 - 1) + 0.001f * (float)i;
  }
  pair_epoch(p);
}

static void pair_close(pair_t *p) {
  wg_adpsgd_close(p->g[0]);
  wg_adpsgd_close(p->g[1]);
}

static int average_once(pair_t *p) {
  wagma_rng_t rng;
  wagma_rng_seed(&rng, 9);
  int peer = -1, e = wg_adpsgd_average(p->g[0], p->model[0], &rng, &peer);
  wg_adpsgd_publish(p->g[1], p->model[1]);
  return e;
}

/* The passive's connections (threads not joined) reach want within limit_s: 1 or 0. */
static int passive_conns_reach(pair_t *p, uint64_t want, double limit_s) {
  double t0 = wg_mono();
  wg_adpsgd_counters_t c;
  do {
    wg_adpsgd_counters(p->g[1], &c);
    if (c.connections == want)
      return 1;
    usleep(20000);
  } while (wg_mono() - t0 < limit_s);
  return 0;
}

static void stalled_request(int fd) {
  gossip_header_t h = {
      .magic = 0x44414757u, .version = 1, .kind = 1, .epoch = 7, .token = 101, .count = N};
  float part[10] = {0};
  assert_int_equal(wg_peer_send(fd, &h, sizeof h, wg_mono() + 5.0), 0);
  assert_int_equal(wg_peer_send(fd, part, sizeof part, wg_mono() + 5.0), 0); /* 10 of N */
}

/* ---- keepalive and the slot of an ended connection -------------------------------------- */

typedef struct ka_seen {
  int keepalive, idle, intvl, cnt;
  unsigned user_ms;
  int served;
} ka_seen_t;

static void read_keepalive(int fd, ka_seen_t *k) {
  socklen_t l = sizeof(int);
  socklen_t ul = sizeof k->user_ms;
  assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &k->keepalive, &l), 0);
  assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k->idle, &l), 0);
  assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k->intvl, &l), 0);
  assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k->cnt, &l), 0);
  assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &k->user_ms, &ul), 0);
}

static void check_keepalive(const ka_seen_t *k) {
  assert_true(k->keepalive != 0);
  assert_int_equal(k->idle, WG_PEER_KEEPIDLE_S);
  assert_int_equal(k->intvl, WG_PEER_KEEPINTVL_S);
  assert_int_equal(k->cnt, WG_PEER_KEEPCNT);
  assert_int_equal(k->user_ms,
                   1000u * (WG_PEER_KEEPIDLE_S + WG_PEER_KEEPCNT * WG_PEER_KEEPINTVL_S));
}

static void serve_keepalive(void *user, int fd) {
  ka_seen_t *k = user;
  read_keepalive(fd, k);
  char b;
  (void)!recv(fd, &b, 1, 0); /* one byte, then the connection ends */
  k->served = 1;
}

static void sockets_have_short_keepalive(void **state) {
  (void)state;
  int lfd;
  uint16_t port;
  ka_seen_t server = {0}, client = {0};
  wg_peer_server_t *s = NULL;
  assert_int_equal(wg_peer_listen("127.0.0.1", &lfd, &port), 0);
  assert_int_equal(wg_peer_server_start(lfd, 4, serve_keepalive, &server, &s), 0);
  int fd = connect_to(port);
  read_keepalive(fd, &client);
  check_keepalive(&client);
  double t0 = wg_mono();
  while (wg_peer_server_count(s) != 1 && wg_mono() - t0 < 5)
    usleep(10000);
  assert_int_equal(wg_peer_server_count(s), 1);
  assert_int_equal(wg_peer_send(fd, "x", 1, wg_mono() + 5), 0);
  /* its serve returned: the thread is joined and the slot free within a poll period */
  while (wg_peer_server_count(s) != 0 && wg_mono() - t0 < 5)
    usleep(10000);
  assert_int_equal(wg_peer_server_count(s), 0);
  assert_true(server.served);
  check_keepalive(&server);
  close(fd);
  wg_peer_server_stop(s);
  close(lfd);
}

/* ---- AD-PSGD: a stalled request and a silent connection ---------------------------------- */

static void adpsgd_stalled_request_is_closed_within_the_frame_bound(void **state) {
  (void)state;
  pair_t p;
  log_reset();
  pair_open(&p, DEADLINE_S);
  int stalled = connect_to(p.peers[1].port), silent = connect_to(p.peers[1].port);
  stalled_request(stalled);
  assert_true(passive_conns_reach(&p, 2, 5.0));
  double t0 = wg_mono();
  double t_stalled = wait_closed(stalled, FRAME_S + 3.0);
  (void)wait_closed(silent, FRAME_S + 3.0);
  double t_silent = wg_mono() - t0; /* closed by then */
  print_message("stalled request closed after %.2f s, silent connection by %.2f s (bound %.1f s)\n",
                t_stalled, t_silent, FRAME_S);
  assert_true(t_stalled >= FRAME_S - 0.2 && t_stalled <= FRAME_S + 1.5);
  assert_true(t_silent <= FRAME_S + 1.5);
  /* their threads exit and their slots are released */
  assert_true(passive_conns_reach(&p, 0, 1.0));
  wg_adpsgd_counters_t c;
  wg_adpsgd_counters(p.g[1], &c);
  assert_int_equal(c.dropped, 2);
  char line[128];
  snprintf(line, sizeof line, "closing the connection from 127.0.0.1:%u: the model of a request",
           (unsigned)local_port(stalled));
  assert_true(log_has(line));
  snprintf(line, sizeof line, "closing the connection from 127.0.0.1:%u: a first request",
           (unsigned)local_port(silent));
  assert_true(log_has(line));
  close(stalled);
  close(silent);
  /* a well-behaved active is served */
  assert_int_equal(average_once(&p), 0);
  wg_adpsgd_counters(p.g[1], &c);
  assert_int_equal(c.served, 1);
  assert_int_equal(c.dropped, 2);
  pair_close(&p);
}

/* ---- AD-PSGD: the idle bound -------------------------------------------------------------- */

static void idle_connection_is_closed_and_the_active_connects_afresh(void **state) {
  (void)state;
  pair_t p;
  log_reset();
  pair_open(&p, DEADLINE_S);
  wg_adpsgd_set_idle_bound(p.g[1], 0.5);
  assert_int_equal(average_once(&p), 0);
  assert_true(passive_conns_reach(&p, 1, 1.0));
  /* idle past the bound: the passive closes it and its thread ends */
  assert_true(passive_conns_reach(&p, 0, 0.5 + 1.5));
  wg_adpsgd_counters_t c;
  wg_adpsgd_counters(p.g[1], &c);
  assert_int_equal(c.dropped, 1);
  assert_true(log_has("a request (idle connection) did not come within 0.5 s"));
  /* the active's next averaging does not fail on the closed connection */
  assert_int_equal(average_once(&p), 0);
  wg_adpsgd_counters(p.g[1], &c);
  assert_int_equal(c.served, 2);
  wg_adpsgd_counters(p.g[0], &c);
  assert_int_equal(c.averaged, 2);
  assert_int_equal(c.skipped, 0);
  pair_close(&p);
}

/* ---- AD-PSGD: more stalled connections than the limit ----------------------------------- */

#define FLOOD (WG_PEER_MAX_CONNS + 76)
/* The exchange deadline of the flood's epoch: a frame bound of 5 s, so that the stalled
 * connections fill the endpoint before the first of them times out, even on a slow machine. */
#define FLOOD_DEADLINE_S 2.5

static void flood_of_stalled_connections_times_out_and_peers_are_served(void **state) {
  (void)state;
  const double bound = 2 * FLOOD_DEADLINE_S; /* the frame bound, twice the deadline */
  struct rlimit rl;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur < 2 * FLOOD + 200) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < 2 * FLOOD + 200) {
    print_message("RLIMIT_NOFILE %llu: too few descriptors for the flood\n",
                  (unsigned long long)rl.rlim_cur);
    skip();
  }
  pair_t p;
  log_reset();
  pair_open(&p, FLOOD_DEADLINE_S);
  static int fds[FLOOD];
  wg_adpsgd_counters_t c;
  uint64_t most = 0;
  double t0 = wg_mono();
  for (int i = 0; i < FLOOD; i++) {
    fds[i] = connect_to(p.peers[1].port);
    gossip_header_t h = {
        .magic = 0x44414757u, .version = 1, .kind = 1, .epoch = 7, .token = 101, .count = N};
    /* one refused at accept may be closed already: the send may fail */
    (void)wg_peer_send(fds[i], &h, sizeof h, wg_mono() + 1.0);
    /* paced to the accept thread: a full listen queue drops SYNs (retried after 1 s) */
    for (double t = wg_mono(); wg_mono() - t < 1.0; usleep(500)) {
      wg_adpsgd_counters(p.g[1], &c);
      most = c.connections > most ? c.connections : most;
      if (c.connections + 16 > (uint64_t)i || c.connections == WG_PEER_MAX_CONNS)
        break;
    }
  }
  double filled = wg_mono() - t0;
  print_message("%d stalled connections opened in %.2f s; the passive held %llu at most\n", FLOOD,
                filled, (unsigned long long)most);
  assert_true(filled < bound); /* else the flood did not test the limit */
  assert_int_equal(most, WG_PEER_MAX_CONNS);
  /* while full a legitimate active is closed at accept (asserted only while the first stalled
   * connection is surely still held) */
  double asked = wg_mono() - t0;
  int e = average_once(&p);
  print_message("an averaging %.2f s after the first connect, while full: %s\n", asked,
                wagma_strerror(e));
  if (asked < bound - 1.5)
    assert_int_equal(e, WAGMA_EPEER);
  /* every stalled connection is closed within the bound of its accept */
  int open = 0;
  double worst = 0;
  for (int i = 0; i < FLOOD; i++) {
    double left = t0 + filled + bound + 2.0 - wg_mono();
    double t = wait_closed(fds[i], left > 0 ? left : 0.001);
    if (t > left)
      open++;
    else
      worst = fmax(worst, wg_mono() - t0);
    close(fds[i]);
  }
  print_message("the last closed %.2f s after the first connect (bound %.1f s); %d left open\n",
                worst, bound, open);
  assert_int_equal(open, 0);
  /* a new epoch closes the active's connections (and forgets the suspect mark of the try
   * above): every thread of the passive ends, every slot is free */
  pair_epoch(&p);
  assert_true(passive_conns_reach(&p, 0, 1.5));
  wg_adpsgd_counters(p.g[1], &c);
  assert_true(c.dropped >= WG_PEER_MAX_CONNS);
  /* a legitimate active is served */
  assert_int_equal(average_once(&p), 0);
  pair_close(&p);
}

/* ---- parameter server: a push whose gradient stops halfway ------------------------------- */

static void ps_stalled_push_is_closed_and_the_shard_serves(void **state) {
  (void)state;
  wagma_optim_config_t sgd = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  wg_ps_t *ps[2];
  wg_adpsgd_peer_t peers[2];
  float w0[N];
  log_reset();
  for (int i = 0; i < N; i++)
    w0[i] = 0.01f * (float)i;
  for (int r = 0; r < 2; r++) {
    assert_int_equal(wg_ps_open("127.0.0.1", N, &sgd, 0.0, capture_log, NULL, &ps[r]), 0);
    snprintf(peers[r].host, sizeof peers[r].host, "127.0.0.1");
    peers[r].port = wg_ps_port(ps[r]);
    peers[r].token = 500 + (uint64_t)r;
  }
  for (int r = 0; r < 2; r++)
    assert_int_equal(wg_ps_set_epoch(ps[r], 3, r, 2, 1, peers, 500 + (uint64_t)r, DEADLINE_S, w0),
                     0);
  int fd = connect_to(peers[0].port);
  ps_header_t h = {.magic = 0x53504757u,
                   .version = 1,
                   .kind = 3,
                   .epoch = 3,
                   .token = 500,
                   .count = N,
                   .rank = 1};
  float half[N / 2] = {0};
  assert_int_equal(wg_peer_send(fd, &h, sizeof h, wg_mono() + 5), 0);
  assert_int_equal(wg_peer_send(fd, half, sizeof half, wg_mono() + 5), 0);
  double t = wait_closed(fd, FRAME_S + 3.0);
  print_message("stalled push closed after %.2f s (bound %.1f s)\n", t, FRAME_S);
  assert_true(t >= FRAME_S - 0.2 && t <= FRAME_S + 1.5);
  wg_ps_shard_stats_t st;
  for (double t0 = wg_mono();; usleep(20000)) { /* its thread is joined within a poll period */
    wg_ps_shard_stats(ps[0], &st);
    if (st.connections == 0 || wg_mono() - t0 > 1.0)
      break;
  }
  assert_int_equal(st.connections, 0);
  assert_int_equal(st.dropped, 1);
  char line[128];
  snprintf(line, sizeof line, "ps: closing the connection from 127.0.0.1:%u: the floats",
           (unsigned)local_port(fd));
  assert_true(log_has(line));
  assert_int_equal(st.pushes, 0); /* nothing of it was applied */
  close(fd);
  /* a well-behaved worker is served */
  float m[N], g[N];
  uint64_t delay;
  for (int i = 0; i < N; i++)
    g[i] = 1.0f;
  assert_int_equal(wg_ps_pull(ps[1], m), 0);
  assert_memory_equal(m, w0, sizeof m);
  assert_int_equal(wg_ps_push(ps[1], g, 1, 0.5, &delay), 0);
  wg_ps_shard_stats(ps[0], &st);
  assert_int_equal(st.pushes, 1);
  assert_int_equal(st.dropped, 1);
  wg_ps_close(ps[0]);
  wg_ps_close(ps[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sockets_have_short_keepalive),
      cmocka_unit_test(adpsgd_stalled_request_is_closed_within_the_frame_bound),
      cmocka_unit_test(idle_connection_is_closed_and_the_active_connects_afresh),
      cmocka_unit_test(flood_of_stalled_connections_times_out_and_peers_are_served),
      cmocka_unit_test(ps_stalled_push_is_closed_and_the_shard_serves),
  };
  return cmocka_run_group_tests_name("peer_deadlines", tests, NULL, NULL);
}
