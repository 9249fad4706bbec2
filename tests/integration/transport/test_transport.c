/* test_transport.c — the TCP transport between real processes on loopback: mailbox matching,
 * ordering and 65 MiB frames, members that never come, a peer killed with SIGKILL, a frozen
 * peer (SIGSTOP), raw sockets (authenticated as a member) sending garbage / truncated /
 * oversized / wrong-epoch / wrong-src frames and a BYE in another rank's name (rejected,
 * counted, the rank keeps working with the rest), and open/close in a loop across epochs
 * without leaking fds or threads. Peer authentication has its own tests (test_auth.c). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
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

static const wg_transport_ops_t *ops = &wg_tcp_transport;

static int send_coll(wg_transport_t *t, int dst, uint64_t round, uint32_t group, uint64_t seq,
                     const void *payload, size_t len) {
  wg_frame_header_t h = {.kind = WG_FRAME_COLL, .round = round, .group = group, .seq = seq};
  return ops->send(t, dst, &h, payload, len);
}

/* Sum allreduce of a few sizes over ranks; 0 if exact. */
static int allreduce_ok(wg_transport_t *t, int rank, const int *ranks, int n, uint64_t round) {
  static const size_t counts[] = {100, 50001};
  for (int c = 0; c < 2; c++) {
    size_t count = counts[c];
    float *buf = malloc(count * sizeof *buf);
    for (size_t i = 0; i < count; i++)
      buf[i] = (float)((i % 13) * (size_t)(rank + 1));
    wg_coll_ctx_t ctx = {.ops = ops,
                         .transport = t,
                         .rank = rank,
                         .ranks = ranks,
                         .nranks = n,
                         .round = round,
                         .seq = (uint64_t)c << 20};
    int rc = wg_coll_allreduce(&ctx, buf, count, WAGMA_REDUCE_SUM, wg_now() + 30);
    int factor = 0;
    for (int k = 0; k < n; k++)
      factor += ranks[k] + 1;
    for (size_t i = 0; i < count && rc == 0; i++)
      if (buf[i] != (float)((i % 13) * (size_t)factor))
        rc = -100;
    free(buf);
    if (rc != 0) {
      fprintf(stderr, "rank %d: allreduce(%zu) rc %d\n", rank, count, rc);
      return 1;
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- mailbox, one process */

typedef struct waiter {
  wg_transport_t *t;
  wg_match_t match;
  int rc;
  wg_message_t *m;
} waiter_t;

static void *waiter_main(void *arg) {
  waiter_t *w = arg;
  w->rc = ops->recv(w->t, &w->match, wg_now() + 30, &w->m);
  return NULL;
}

static void test_mailbox_matching(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 1, 0), 0);
  wg_transport_t *t = NULL;
  assert_int_equal(world_open(&w, 0, 1024, 1.0, &t), 0);
  assert_int_equal(ops->peer_alive(t, 0), 1);
  assert_int_equal(ops->peer_alive(t, 1), 0);

  /* Frames to myself go straight to the mailbox. */
  uint32_t v;
  for (v = 0; v < 4; v++)
    assert_int_equal(send_coll(t, 0, 10 + v % 2, v / 2, v, &v, sizeof v), 0);
  wg_frame_header_t act = {.kind = WG_FRAME_ACTIVATE, .round = 11, .group = 1};
  assert_int_equal(ops->send(t, 0, &act, NULL, 0), 0);
  assert_int_equal(act.epoch, w.epoch); /* send completes the header */
  assert_int_equal(act.src, 0);
  assert_int_equal(act.magic, WG_FRAME_MAGIC);

  wg_match_t m;
  wg_message_t *msg = NULL;
  wg_match_any(&m);
  assert_int_equal(m.src, WG_ANY);
  assert_int_equal(m.kinds, 0);
  m.kinds = 1u << WG_FRAME_ACTIVATE;
  assert_int_equal(ops->recv(t, &m, wg_now() + 1, &msg), 0);
  assert_int_equal(msg->header.kind, WG_FRAME_ACTIVATE);
  assert_null(msg->payload);
  wg_message_free(msg);

  wg_match_any(&m);
  m.round = 11; /* seq 1 and 3 have round 11: the oldest first */
  assert_int_equal(ops->recv(t, &m, wg_now() + 1, &msg), 0);
  assert_int_equal(msg->header.seq, 1);
  assert_int_equal(((uintptr_t)msg->payload) % 64, 0);
  assert_int_equal(*(uint32_t *)msg->payload, 1);
  wg_message_free(msg);
  m.group = 0; /* round 11, group 0: seq 1 is gone, nothing left */
  double t0 = wg_now();
  assert_int_equal(ops->recv(t, &m, wg_now() + 0.2, &msg), WAGMA_ETIMEDOUT);
  assert_null(msg);
  assert_true(wg_now() - t0 >= 0.19);
  assert_int_equal(ops->recv(t, &m, wg_now() - 1, &msg), WAGMA_ETIMEDOUT); /* past deadline */

  wg_match_any(&m);
  m.seq = 2;
  m.src = 0;
  assert_int_equal(ops->recv(t, &m, wg_now() + 1, &msg), 0);
  assert_int_equal(msg->header.round, 10);
  assert_int_equal(msg->header.group, 1);
  wg_message_free(msg);

  /* Bad arguments. */
  assert_int_equal(send_coll(t, 1, 0, 0, 0, NULL, 0), WAGMA_EINVAL);
  assert_int_equal(send_coll(t, -1, 0, 0, 0, NULL, 0), WAGMA_EINVAL);
  static uint8_t big[2048];
  assert_int_equal(send_coll(t, 0, 0, 0, 0, big, sizeof big), WAGMA_EINVAL); /* > max_payload */
  wg_match_any(&m);
  m.src = 5;
  assert_int_equal(ops->recv(t, &m, wg_now() + 1, &msg), WAGMA_EINVAL);

  /* A blocked waiter gets a frame sent later, another gets ECLOSED from interrupt. */
  waiter_t a = {.t = t}, b = {.t = t};
  wg_match_any(&a.match);
  a.match.seq = 77;
  wg_match_any(&b.match);
  b.match.seq = 78;
  pthread_t ta, tb;
  pthread_create(&ta, NULL, waiter_main, &a);
  pthread_create(&tb, NULL, waiter_main, &b);
  usleep(50000);
  assert_int_equal(send_coll(t, 0, 0, 0, 77, NULL, 0), 0);
  pthread_join(ta, NULL);
  assert_int_equal(a.rc, 0);
  assert_int_equal(a.m->header.seq, 77);
  wg_message_free(a.m);
  ops->interrupt(t);
  pthread_join(tb, NULL);
  assert_int_equal(b.rc, WAGMA_ECLOSED);
  wg_match_any(&m);
  assert_int_equal(ops->recv(t, &m, wg_now() + 1, &msg), WAGMA_ECLOSED);

  wg_transport_stats_t st;
  ops->stats(t, &st);
  assert_int_equal(st.frames_rejected, 0);
  ops->close(t); /* frees the frames still in the mailbox (seq 0, 3) */
  world_free(&w);
}

/* ---------------------------------------------------------------- order and big frames */

#define BIG_FRAME ((size_t)(65u << 20) + 3)

static int run_big(world_t *w, int rank, void *arg) {
  (void)arg;
  wg_transport_t *t = NULL;
  if (world_open(w, rank, BIG_FRAME, 30, &t) != 0)
    return 2;
  int bad = 0;
  uint8_t *big = malloc(BIG_FRAME);
  wg_match_t m;
  wg_match_any(&m);
  wg_message_t *msg = NULL;
  if (rank == 0) {
    for (size_t i = 0; i < BIG_FRAME; i++)
      big[i] = (uint8_t)(i * 7 + 1);
    for (uint64_t s = 0; s < 300 && !bad; s++) {
      size_t len = s % 25 == 0 ? (1u << 20) : sizeof s;
      memcpy(big, &s, sizeof s);
      bad |= send_coll(t, 1, 0, 0, s, big, len) != 0;
    }
    for (size_t i = 0; i < sizeof(uint64_t); i++)
      big[i] = (uint8_t)(i * 7 + 1);
    bad |= send_coll(t, 1, 0, 0, 300, big, BIG_FRAME) != 0;
    bad |= send_coll(t, 1, 0, 0, 301, NULL, 0) != 0;
    m.src = 1; /* wait for the ack, then close */
    int rc = ops->recv(t, &m, wg_now() + 60, &msg);
    if (bad || rc != 0)
      fprintf(stderr, "rank 0: sends %s, ack rc %d\n", bad ? "failed" : "ok", rc);
    bad |= rc != 0;
    wg_message_free(msg);
  } else {
    m.src = 0;
    for (uint64_t s = 0; s <= 301 && !bad; s++) {
      int rc = ops->recv(t, &m, wg_now() + 60, &msg);
      if (rc != 0 || msg->header.seq != s) {
        fprintf(stderr, "rank 1: frame %llu: rc %d seq %llu\n", (unsigned long long)s, rc,
                rc ? 0ull : (unsigned long long)msg->header.seq);
        bad = 1;
      } else if (s < 300) {
        uint64_t got;
        memcpy(&got, msg->payload, sizeof got);
        bad |= got != s || msg->header.length != (s % 25 == 0 ? (1u << 20) : 8u);
      } else if (s == 300) {
        bad |= msg->header.length != BIG_FRAME;
        for (size_t i = 0; i < BIG_FRAME && !bad; i++)
          bad |= msg->payload[i] != (uint8_t)(i * 7 + 1);
      }
      wg_message_free(msg);
    }
    wg_transport_stats_t st;
    ops->stats(t, &st);
    bad |= st.bytes_received < BIG_FRAME + 12u * (1u << 20);
    bad |= send_coll(t, 0, 0, 0, 0, NULL, 0) != 0;
  }
  free(big);
  ops->close(t);
  return bad;
}

static void test_order_and_65mib_frame(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 2, 0), 0);
  int codes[2];
  assert_int_equal(world_run(&w, run_big, NULL, 120, NULL, codes, NULL, NULL), 0);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  world_free(&w);
}

/* ---------------------------------------------------------------- a member never comes */

static int run_missing(world_t *w, int rank, void *arg) {
  (void)arg;
  wg_transport_t *t = NULL;
  double t0 = wg_now();
  if (world_open(w, rank, 0, 1.0, &t) != 0)
    return 2;
  int bad = 0;
  double took = wg_now() - t0;
  bad |= (took < 0.9 || took > 10) << 1; /* waited for rank 2 until the connect deadline */
  bad |= (ops->peer_alive(t, 2) != 0) << 2;
  bad |= (ops->peer_alive(t, 1 - rank) != 1) << 3;
  wg_match_t m;
  wg_match_any(&m);
  m.src = 2;
  wg_message_t *msg = NULL;
  bad |= (ops->recv(t, &m, wg_now() + 10, &msg) != WAGMA_EPEER) << 4;
  bad |= (send_coll(t, 2, 0, 0, 0, NULL, 0) != WAGMA_EPEER) << 5;
  static const int pair[] = {0, 1};
  bad |= allreduce_ok(t, rank, pair, 2, 1) << 6;
  ops->close(t);
  return bad;
}

static void test_member_never_connects(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 3, 0), 0);
  int codes[3], mode[3] = {WORLD_SPAWN, WORLD_SPAWN, 0};
  assert_int_equal(world_run(&w, run_missing, NULL, 60, mode, codes, NULL, NULL), 0);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  world_free(&w);
}

/* ---------------------------------------------------------------- killed and frozen peers */

typedef struct fail_report {
  int rc[8][2];
  double elapsed[8][2];
  double close_s[8];
} fail_report_t;

#define KILL_DEADLINE_S 6.0

static int run_killed(world_t *w, int rank, void *arg) {
  (void)arg;
  fail_report_t *rep = w->shared;
  wg_transport_t *t = NULL;
  if (world_open(w, rank, 0, 20, &t) != 0)
    return 2;
  if (rank == w->nranks - 1)
    raise(SIGKILL);
  static const int all[] = {0, 1, 2, 3};
  static const size_t counts[] = {100, 400000};
  for (int c = 0; c < 2; c++) {
    float *buf = calloc(counts[c], sizeof *buf);
    wg_coll_ctx_t ctx = {.ops = ops,
                         .transport = t,
                         .rank = rank,
                         .ranks = all,
                         .nranks = 4,
                         .round = 1,
                         .seq = (uint64_t)c << 20};
    double t0 = wg_now();
    rep->rc[rank][c] =
        wg_coll_allreduce(&ctx, buf, counts[c], WAGMA_REDUCE_SUM, wg_now() + KILL_DEADLINE_S);
    rep->elapsed[rank][c] = wg_now() - t0;
    free(buf);
  }
  double t0 = wg_now();
  ops->close(t);
  rep->close_s[rank] = wg_now() - t0;
  return 0;
}

static void test_peer_killed(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 4, sizeof(fail_report_t)), 0);
  int codes[4];
  assert_int_equal(world_run(&w, run_killed, NULL, 90, NULL, codes, NULL, NULL), 0);
  fail_report_t *rep = w.shared;
  assert_int_equal(codes[3], -SIGKILL);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(codes[r], 0);
    for (int c = 0; c < 2; c++) {
      int rc = rep->rc[r][c];
      assert_true(rc == WAGMA_EPEER || rc == WAGMA_ETIMEDOUT);
      assert_true(rep->elapsed[r][c] <= KILL_DEADLINE_S + 10.0); /* no hang past the deadline */
    }
    assert_true(rep->close_s[r] < (WG_TCP_CLOSE_LINGER_S + 8.0));
  }
  world_free(&w);
}

#define FROZEN_DEADLINE_S 1.5

static int run_frozen(world_t *w, int rank, void *arg) {
  (void)arg;
  fail_report_t *rep = w->shared;
  wg_transport_t *t = NULL;
  if (world_open(w, rank, 0, 20, &t) != 0)
    return 2;
  if (rank == 2)
    raise(SIGSTOP); /* frozen until the parent kills it */
  static const int all[] = {0, 1, 2}, pair[] = {0, 1};
  float buf[64] = {0};
  wg_coll_ctx_t ctx = {
      .ops = ops, .transport = t, .rank = rank, .ranks = all, .nranks = 3, .round = 1};
  double t0 = wg_now();
  rep->rc[rank][0] =
      wg_coll_allreduce(&ctx, buf, 64, WAGMA_REDUCE_SUM, wg_now() + FROZEN_DEADLINE_S);
  rep->elapsed[rank][0] = wg_now() - t0;
  int bad = ops->peer_alive(t, 2) != 1;          /* frozen is not dead */
  bad |= allreduce_ok(t, rank, pair, 2, 2) << 1; /* the others go on without it */
  t0 = wg_now();
  ops->close(t);
  rep->close_s[rank] = wg_now() - t0;
  return bad;
}

static void test_peer_frozen(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 3, sizeof(fail_report_t)), 0);
  int codes[3], mode[3] = {WORLD_SPAWN, WORLD_SPAWN, WORLD_SPAWN | WORLD_KILL_LAST};
  assert_int_equal(world_run(&w, run_frozen, NULL, 60, mode, codes, NULL, NULL), 0);
  fail_report_t *rep = w.shared;
  assert_int_equal(codes[2], -SIGKILL);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(codes[r], 0);
    assert_int_equal(rep->rc[r][0], WAGMA_ETIMEDOUT);
    assert_true(rep->elapsed[r][0] >= FROZEN_DEADLINE_S - 0.05);
    assert_true(rep->elapsed[r][0] <= FROZEN_DEADLINE_S + 10.0);
    assert_true(rep->close_s[r] < (WG_TCP_CLOSE_LINGER_S + 8.0));
  }
  world_free(&w);
}

/* ---------------------------------------------------------------- bad frames from raw sockets */

enum fault {
  F_GARBAGE,
  F_TRUNCATED,
  F_OVERSIZED,
  F_WRONG_EPOCH,
  F_WRONG_SRC,
  F_HELLO_AGAIN,
  F_BAD_MAGIC,
  F_BYE_OTHER_SRC,
  F_COUNT
};
static const char *fault_name[] = {"garbage",   "truncated",   "oversized", "wrong-epoch",
                                   "wrong-src", "hello-again", "bad-magic", "bye-as-rank-1"};

#define RAW_MAX_PAYLOAD (1u << 20)

typedef struct raw_report {
  uint64_t rejected[2];
  int alive_after[2]; /* peer 2 after the fault: must be 0 */
} raw_report_t;

static void header_bytes(uint8_t out[64], uint16_t kind, uint64_t epoch, uint32_t src,
                         uint64_t length, uint64_t aux) {
  wg_frame_header_t h = {.magic = WG_FRAME_MAGIC,
                         .version = WG_FRAME_VERSION,
                         .kind = kind,
                         .epoch = epoch,
                         .src = src,
                         .length = length,
                         .aux = aux};
  wg_frame_encode(&h, out);
}

/* Handshake as rank 2 of 3 with rank dst, with the world's secret; returns the fd or -1. */
static int raw_handshake(world_t *w, int dst) {
  int fd = world_raw_connect(w->plan.members[dst].address, wg_now() + 20);
  if (fd < 0)
    return -1;
  if (world_raw_handshake(w, fd, 2, dst, w->secret, w->secret_len, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int send_fault(world_t *w, int fd, int fault) {
  uint8_t b[256];
  int rc = 0;
  switch (fault) {
  case F_GARBAGE:
    for (size_t i = 0; i < sizeof b; i++)
      b[i] = (uint8_t)(i * 131 + 17);
    rc = world_raw_write(fd, b, sizeof b);
    break;
  case F_TRUNCATED:
    header_bytes(b, WG_FRAME_COLL, w->epoch, 2, 1000, 0);
    rc = world_raw_write(fd, b, 64 + 10);
    shutdown(fd, SHUT_WR); /* the frame ends early */
    break;
  case F_OVERSIZED:
    header_bytes(b, WG_FRAME_COLL, w->epoch, 2, (uint64_t)RAW_MAX_PAYLOAD + 1, 0);
    rc = world_raw_write(fd, b, 64);
    break;
  case F_WRONG_EPOCH:
    header_bytes(b, WG_FRAME_ACTIVATE, w->epoch + 1, 2, 0, 0);
    rc = world_raw_write(fd, b, 64);
    break;
  case F_WRONG_SRC:
    header_bytes(b, WG_FRAME_COLL, w->epoch, 1, 0, 0);
    rc = world_raw_write(fd, b, 64);
    break;
  case F_HELLO_AGAIN:
    header_bytes(b, WG_FRAME_HELLO, w->epoch, 2, 0, 3);
    rc = world_raw_write(fd, b, 64);
    break;
  case F_BAD_MAGIC:
    header_bytes(b, WG_FRAME_COLL, w->epoch, 2, 0, 0);
    b[0] ^= 0x20;
    rc = world_raw_write(fd, b, 64);
    break;
  case F_BYE_OTHER_SRC: /* an authenticated member speaking for rank 1: ends only itself */
    header_bytes(b, WG_FRAME_BYE, w->epoch, 1, 0, 0);
    rc = world_raw_write(fd, b, 64);
    break;
  }
  return rc;
}

/* The parent plays rank 2. Before its handshake it sends rank 0 two bad connections (noise,
 * a HELLO of another epoch); after it, the fault on both connections. */
static int raw_parent(world_t *w, void *arg) {
  int fault = *(int *)arg;
  int fd = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  uint8_t b[64];
  for (int i = 0; i < 64; i++)
    b[i] = (uint8_t)(255 - i);
  if (fd < 0 || world_raw_write(fd, b, 64) != 0 || world_raw_wait_dropped(fd) != 0)
    return 1;
  close(fd);
  fd = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  header_bytes(b, WG_FRAME_HELLO, w->epoch + 1, 2, 0, 3);
  if (fd < 0 || world_raw_write(fd, b, 64) != 0 || world_raw_wait_dropped(fd) != 0)
    return 2;
  close(fd);
  int fd0 = raw_handshake(w, 0), fd1 = raw_handshake(w, 1);
  if (fd0 < 0 || fd1 < 0)
    return 3;
  int rc = 0;
  if (send_fault(w, fd0, fault) != 0 || send_fault(w, fd1, fault) != 0)
    rc = 4;
  else if (world_raw_wait_dropped(fd0) != 0 || world_raw_wait_dropped(fd1) != 0)
    rc = 5;
  close(fd0);
  close(fd1);
  return rc;
}

static int run_raw_child(world_t *w, int rank, void *arg) {
  (void)arg;
  raw_report_t *rep = w->shared;
  wg_transport_t *t = NULL;
  if (world_open(w, rank, RAW_MAX_PAYLOAD, 30, &t) != 0)
    return 2;
  double deadline = wg_now() + 20;
  while (ops->peer_alive(t, 2) && wg_now() < deadline)
    usleep(5000);
  rep->alive_after[rank] = ops->peer_alive(t, 2);
  wg_transport_stats_t st;
  ops->stats(t, &st);
  rep->rejected[rank] = st.frames_rejected;
  static const int pair[] = {0, 1};
  int bad = allreduce_ok(t, rank, pair, 2, 1);
  ops->close(t);
  return bad;
}

static void test_bad_frames_rejected(void **state) {
  (void)state;
  for (int fault = 0; fault < F_COUNT; fault++) {
    world_t w;
    assert_int_equal(world_init(&w, 3, sizeof(raw_report_t)), 0);
    int codes[3], mode[3] = {WORLD_SPAWN, WORLD_SPAWN, 0}, prc = -1;
    assert_int_equal(world_run(&w, run_raw_child, &fault, 60, mode, codes, raw_parent, &prc), 0);
    raw_report_t *rep = w.shared;
    fprintf(stderr, "fault %-12s: parent %d, rejected %llu/%llu, codes %d/%d\n", fault_name[fault],
            prc, (unsigned long long)rep->rejected[0], (unsigned long long)rep->rejected[1],
            codes[0], codes[1]);
    (void)fault_name;
    assert_int_equal(prc, 0);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(rep->alive_after[0], 0);
    assert_int_equal(rep->alive_after[1], 0);
    assert_int_equal(rep->rejected[0], 3); /* noise, wrong-epoch HELLO, the fault */
    assert_int_equal(rep->rejected[1], 1);
    world_free(&w);
  }
}

/* ---------------------------------------------------------------- open/close across epochs */

#define EPOCHS 12

typedef struct loop_report {
  int fds[2][8];
  int threads[2][8];
} loop_report_t;

static int run_loop(world_t *w, int rank, void *arg) {
  (void)arg;
  loop_report_t *rep = w->shared;
  static const int all[] = {0, 1, 2};
  rep->fds[0][rank] = world_count_fds();
  rep->threads[0][rank] = world_count_threads();
  int bad = 0;
  for (int e = 1; e <= EPOCHS && !bad; e++) {
    w->epoch = (uint64_t)e; /* the same ports, a new epoch */
    wg_transport_t *t = NULL;
    if (world_open(w, rank, 0, 20, &t) != 0)
      return 2;
    for (int r = 0; r < 3; r++)
      bad |= !ops->peer_alive(t, r);
    bad |= allreduce_ok(t, rank, all, 3, (uint64_t)e) << 1;
    ops->close(t);
  }
  rep->fds[1][rank] = world_count_fds();
  rep->threads[1][rank] = world_count_threads();
  return bad;
}

static void test_open_close_loop(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 3, sizeof(loop_report_t)), 0);
  int codes[3];
  assert_int_equal(world_run(&w, run_loop, NULL, 120, NULL, codes, NULL, NULL), 0);
  loop_report_t *rep = w.shared;
  for (int r = 0; r < 3; r++) {
    assert_int_equal(codes[r], 0);
    assert_true(rep->fds[0][r] > 0);
    assert_int_equal(rep->fds[1][r], rep->fds[0][r]);
    assert_int_equal(rep->threads[1][r], rep->threads[0][r]);
  }
  world_free(&w);
}

int main(int argc, char **argv) {
  if (argc > 1)
    cmocka_set_test_filter(argv[1]); /* e.g. test_p6* */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mailbox_matching),      cmocka_unit_test(test_order_and_65mib_frame),
      cmocka_unit_test(test_member_never_connects), cmocka_unit_test(test_peer_killed),
      cmocka_unit_test(test_peer_frozen),           cmocka_unit_test(test_bad_frames_rejected),
      cmocka_unit_test(test_open_close_loop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
