/* test_auth.c — peer authentication of the TCP transport between real processes on loopback.
 * The parent process plays an impostor that knows everything the public plan shows (epoch,
 * ranks, addresses) but not the epoch's secret, while the members (forked children) connect:
 *  - forged HELLOs (the old unauthenticated one, one without a secret, one with a forged
 *    proof, one that never sends its proof) as a member's rank are refused and counted, and
 *    the real mesh forms and works;
 *  - an impostor that sends BYE in a member's name after the member connected kills nothing;
 *  - a real transport with another secret, or with none, is refused both ways;
 *  - bad secret arguments are refused by open; an unauthenticated world still works.
 * A frame whose src differs from its connection's rank is test_transport.c's
 * test_bad_frames_rejected (faults wrong-src, bye-as-rank-1). */
#define _GNU_SOURCE
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

#define MAXR 4

typedef struct auth_report {
  volatile int impostor_done; /* the parent's impostor finished: the late rank may open */
  uint64_t rejected[MAXR];
  int alive[MAXR][MAXR];
  int allreduce_rc[MAXR];
} auth_report_t;

typedef struct auth_case {
  int late_rank; /* opens only once impostor_done, or -1 */
} auth_case_t;

/* Sum allreduce over every rank; 0 if exact. */
static int allreduce_all(wg_transport_t *t, int rank, int nranks) {
  int ranks[MAXR];
  for (int r = 0; r < nranks; r++)
    ranks[r] = r;
  enum { COUNT = 5000 };
  static float buf[COUNT];
  for (size_t i = 0; i < COUNT; i++)
    buf[i] = (float)((i % 11) * (size_t)(rank + 1));
  wg_coll_ctx_t ctx = {
      .ops = ops, .transport = t, .rank = rank, .ranks = ranks, .nranks = nranks, .round = 1};
  int rc = wg_coll_allreduce(&ctx, buf, COUNT, WAGMA_REDUCE_SUM, wg_now() + 30);
  int factor = nranks * (nranks + 1) / 2;
  for (size_t i = 0; i < COUNT && rc == 0; i++)
    if (buf[i] != (float)((i % 11) * (size_t)factor))
      rc = -100;
  return rc;
}

/* A member: opens (the late one after the impostor), records who it sees alive and what it
 * rejected, and runs an allreduce over every rank. */
static int run_member(world_t *w, int rank, void *arg) {
  const auth_case_t *ac = arg;
  auth_report_t *rep = w->shared;
  if (rank == ac->late_rank) {
    double deadline = wg_now() + 40;
    while (!rep->impostor_done && wg_now() < deadline)
      usleep(5000);
  }
  wg_transport_t *t = NULL;
  if (world_open(w, rank, 0, 40, &t) != 0)
    return 2;
  for (int r = 0; r < w->nranks; r++)
    rep->alive[rank][r] = ops->peer_alive(t, r);
  rep->allreduce_rc[rank] = allreduce_all(t, rank, w->nranks);
  wg_transport_stats_t st;
  ops->stats(t, &st);
  rep->rejected[rank] = st.frames_rejected;
  ops->close(t);
  return rep->allreduce_rc[rank] != 0;
}

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

static void expect_all_alive_and_working(world_t *w, const int *codes) {
  auth_report_t *rep = w->shared;
  for (int r = 0; r < w->nranks; r++) {
    assert_int_equal(codes[r], 0);
    assert_int_equal(rep->allreduce_rc[r], 0);
    for (int q = 0; q < w->nranks; q++)
      assert_int_equal(rep->alive[r][q], 1);
  }
}

/* ---------------------------------------------------------------- forged HELLOs */

static const uint8_t not_the_secret[32] = "an impostor's guess, 32 bytes!!";

/* The impostor claims rank 2 to rank 0 four ways, and to rank 1 once; every connection must
 * be dropped. Returns 0 or the number of the attempt that was not refused. */
static int forged_hello_parent(world_t *w, void *arg) {
  (void)arg;
  auth_report_t *rep = w->shared;
  int rc = 0;
  /* 1: the HELLO of the unauthenticated protocol: right epoch, rank and nranks. */
  int fd = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  uint8_t b[64];
  header_bytes(b, WG_FRAME_HELLO, w->epoch, 2, 0, (uint64_t)w->nranks);
  if (fd < 0 || world_raw_write(fd, b, 64) != 0 || world_raw_wait_dropped(fd) != 0)
    rc = rc ? rc : 1;
  close(fd);
  /* 2: this protocol's HELLO, holding no secret (no AUTH flag). */
  fd = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  if (fd < 0 || world_raw_handshake(w, fd, 2, 0, NULL, 0, 0) != -1 ||
      world_raw_wait_dropped(fd) != 0)
    rc = rc ? rc : 2;
  close(fd);
  /* 3 and 4: claims a secret, answers with a forged proof (to rank 0, then rank 1). */
  for (int dst = 0; dst < 2; dst++) {
    fd = world_raw_connect(w->plan.members[dst].address, wg_now() + 20);
    if (fd < 0 ||
        world_raw_handshake(w, fd, 2, dst, not_the_secret, sizeof not_the_secret, 1) != 1 ||
        world_raw_wait_dropped(fd) != 0)
      rc = rc ? rc : 3 + dst;
    close(fd);
  }
  /* 5: a valid step 1, then silence: dropped by the handshake deadline, not at connect's. */
  fd = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  wg_frame_header_t h = {.magic = WG_FRAME_MAGIC,
                         .version = WG_FRAME_VERSION,
                         .kind = WG_FRAME_HELLO,
                         .epoch = w->epoch,
                         .src = 2,
                         .seq = 1,
                         .length = WG_HELLO_STEP1_LEN,
                         .aux = (uint64_t)w->nranks,
                         .flags = WG_HELLO_F_AUTH};
  uint8_t step1[WG_FRAME_HEADER_SIZE + WG_HELLO_STEP1_LEN] = {0};
  wg_frame_encode(&h, step1);
  double t0 = wg_now();
  if (fd < 0 || world_raw_write(fd, step1, sizeof step1) != 0 || world_raw_wait_dropped(fd) != 0 ||
      wg_now() - t0 > WG_TCP_HELLO_TIMEOUT_S + 3.0)
    rc = rc ? rc : 5;
  close(fd);
  rep->impostor_done = 1;
  return rc;
}

static void test_forged_hello_refused(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 3, sizeof(auth_report_t)), 0);
  auth_case_t ac = {.late_rank = 2};
  int codes[3], prc = -1;
  assert_int_equal(world_run(&w, run_member, &ac, 90, NULL, codes, forged_hello_parent, &prc), 0);
  auth_report_t *rep = w.shared;
  fprintf(stderr, "forged HELLO: impostor %d, rejected %llu/%llu/%llu\n", prc,
          (unsigned long long)rep->rejected[0], (unsigned long long)rep->rejected[1],
          (unsigned long long)rep->rejected[2]);
  assert_int_equal(prc, 0);
  expect_all_alive_and_working(&w, codes);
  assert_int_equal(rep->rejected[0], 4);
  assert_int_equal(rep->rejected[1], 1);
  assert_int_equal(rep->rejected[2], 0);
  world_free(&w);
}

/* ---------------------------------------------------------------- BYE in a member's name */

/* Ranks 0..2 connect first; rank 3 waits, so 0 and 1 are still accepting. The impostor then
 * claims rank 2 (already connected) to rank 0 and sends BYE and a data frame in its name.
 * Returns 0 when both attempts were dropped. */
static int impostor_bye_parent(world_t *w, void *arg) {
  (void)arg;
  auth_report_t *rep = w->shared;
  int rc = 0;
  uint8_t b[128];
  /* Let rank 2 finish its handshakes with 0 and 1 (loopback: milliseconds). */
  int probe = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  close(probe);
  usleep(1000000);
  /* 1: the unauthenticated HELLO, BYE and COLL right behind it. */
  int fd = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  header_bytes(b, WG_FRAME_HELLO, w->epoch, 2, 0, (uint64_t)w->nranks);
  header_bytes(b + 64, WG_FRAME_BYE, w->epoch, 2, 0, 0);
  if (fd < 0 || world_raw_write(fd, b, 128) != 0 || world_raw_wait_dropped(fd) != 0)
    rc = rc ? rc : 1;
  close(fd);
  /* 2: a forged proof, then BYE. */
  fd = world_raw_connect(w->plan.members[0].address, wg_now() + 20);
  header_bytes(b, WG_FRAME_BYE, w->epoch, 2, 0, 0);
  if (fd < 0 || world_raw_handshake(w, fd, 2, 0, not_the_secret, sizeof not_the_secret, 1) != 1 ||
      world_raw_write(fd, b, 64) != 0 || world_raw_wait_dropped(fd) != 0)
    rc = rc ? rc : 2;
  close(fd);
  rep->impostor_done = 1;
  return rc;
}

static void test_impostor_bye_kills_nobody(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 4, sizeof(auth_report_t)), 0);
  auth_case_t ac = {.late_rank = 3};
  int codes[4], prc = -1;
  assert_int_equal(world_run(&w, run_member, &ac, 90, NULL, codes, impostor_bye_parent, &prc), 0);
  auth_report_t *rep = w.shared;
  fprintf(stderr,
          "impostor BYE: impostor %d, rejected %llu/%llu/%llu/%llu, rank 0 sees rank 2 %s, "
          "allreduce rc %d/%d/%d/%d\n",
          prc, (unsigned long long)rep->rejected[0], (unsigned long long)rep->rejected[1],
          (unsigned long long)rep->rejected[2], (unsigned long long)rep->rejected[3],
          rep->alive[0][2] ? "alive" : "dead", rep->allreduce_rc[0], rep->allreduce_rc[1],
          rep->allreduce_rc[2], rep->allreduce_rc[3]);
  assert_int_equal(prc, 0);
  expect_all_alive_and_working(&w, codes);
  assert_int_equal(rep->rejected[0], 2);
  for (int r = 1; r < 4; r++)
    assert_int_equal(rep->rejected[r], 0);
  world_free(&w);
}

/* ---------------------------------------------------------------- another secret, or none */

/* A real transport as rank 2 (listening elsewhere, since rank 2's port is the member's) with
 * another secret, then one with no secret: neither may connect to anyone, and each refuses
 * the members' proofs or flags in turn. Returns 0 when that held. */
static int wrong_secret_parent(world_t *w, void *arg) {
  (void)arg;
  auth_report_t *rep = w->shared;
  int rc = 0;
  wagma_plan_t plan = w->plan;
  wagma_member_t members[3];
  memcpy(members, w->plan.members, sizeof members);
  snprintf(members[2].address, WAGMA_ADDRESS_MAX, "127.0.0.1:0");
  plan.members = members;
  for (int attempt = 0; attempt < 2; attempt++) {
    wg_transport_t *t = NULL;
    if (attempt == 0)
      rc = world_open_as(&plan, w->epoch, 2, not_the_secret, sizeof not_the_secret, 1.5, &t);
    else
      rc = world_open_as(&plan, w->epoch, 2, NULL, 0, 1.5, &t);
    if (rc != 0)
      return 10 + attempt;
    wg_transport_stats_t st;
    ops->stats(t, &st);
    if (ops->peer_alive(t, 0) || ops->peer_alive(t, 1))
      rc = 20 + attempt; /* it got in */
    else if (attempt == 0 && st.frames_rejected == 0)
      rc = 30; /* with a secret, it must have refused the members' proofs */
    ops->close(t);
    if (rc != 0)
      break;
  }
  rep->impostor_done = 1;
  return rc;
}

static void test_wrong_or_no_secret_refused(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 3, sizeof(auth_report_t)), 0);
  auth_case_t ac = {.late_rank = 2};
  int codes[3], prc = -1;
  assert_int_equal(world_run(&w, run_member, &ac, 90, NULL, codes, wrong_secret_parent, &prc), 0);
  auth_report_t *rep = w.shared;
  fprintf(stderr, "wrong/no secret: impostor %d, rejected %llu/%llu/%llu\n", prc,
          (unsigned long long)rep->rejected[0], (unsigned long long)rep->rejected[1],
          (unsigned long long)rep->rejected[2]);
  assert_int_equal(prc, 0);
  expect_all_alive_and_working(&w, codes);
  assert_true(rep->rejected[0] >= 2); /* at least one attempt of each impostor */
  assert_true(rep->rejected[1] >= 2);
  assert_int_equal(rep->rejected[2], 0);
  world_free(&w);
}

/* ---------------------------------------------------------------- arguments, no secret */

static void test_secret_arguments(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 1, 0), 0);
  wg_transport_t *t = NULL;
  static const uint8_t key[64] = {1, 2, 3}, other[32] = {1, 2, 4};
  assert_int_equal(world_open_as(&w.plan, 1, 0, NULL, 32, 1, &t), WAGMA_EINVAL);
  assert_int_equal(world_open_as(&w.plan, 1, 0, key, 0, 1, &t), WAGMA_EINVAL);
  assert_int_equal(world_open_as(&w.plan, 1, 0, key, WAGMA_SECRET_MIN_LEN - 1, 1, &t),
                   WAGMA_EINVAL);
  assert_null(t);
  assert_int_equal(world_open_as(&w.plan, 1, 0, key, WAGMA_SECRET_MIN_LEN, 1, &t), 0);
  ops->close(t);
  assert_int_equal(world_open_as(&w.plan, 1, 0, key, sizeof key, 1, &t), 0);
  ops->close(t);
  world_free(&w);

  /* The proofs: both sides and every input matter. */
  wg_transport_auth_t a = {.secret = key, .secret_len = 32},
                      b = {.secret = other, .secret_len = 32};
  uint8_t nd[WG_HELLO_NONCE_LEN] = {7}, na[WG_HELLO_NONCE_LEN] = {9};
  uint8_t p0[32], p1[32];
  assert_int_equal(wg_tcp_hello_proof(&a, WG_HELLO_DIALER, 5, 3, 1, 4, nd, na, p0), 0);
  assert_int_equal(wg_tcp_hello_proof(&a, WG_HELLO_DIALER, 5, 3, 1, 4, nd, na, p1), 0);
  assert_memory_equal(p0, p1, 32);
  assert_int_equal(wg_tcp_hello_proof(&a, WG_HELLO_ACCEPTOR, 5, 3, 1, 4, nd, na, p1), 0);
  assert_memory_not_equal(p0, p1, 32);
  assert_int_equal(wg_tcp_hello_proof(&b, WG_HELLO_DIALER, 5, 3, 1, 4, nd, na, p1), 0);
  assert_memory_not_equal(p0, p1, 32);
  assert_int_equal(wg_tcp_hello_proof(&a, WG_HELLO_DIALER, 6, 3, 1, 4, nd, na, p1), 0);
  assert_memory_not_equal(p0, p1, 32);
  assert_int_equal(wg_tcp_hello_proof(&a, WG_HELLO_DIALER, 5, 2, 1, 4, nd, na, p1), 0);
  assert_memory_not_equal(p0, p1, 32);
  assert_int_equal(wg_tcp_hello_proof(&a, WG_HELLO_DIALER, 5, 3, 1, 4, na, nd, p1), 0);
  assert_memory_not_equal(p0, p1, 32);
}

static void test_unauthenticated_world(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 3, sizeof(auth_report_t)), 0);
  w.secret_len = 0; /* every member without a secret: allowed, and works */
  auth_case_t ac = {.late_rank = -1};
  int codes[3];
  assert_int_equal(world_run(&w, run_member, &ac, 60, NULL, codes, NULL, NULL), 0);
  auth_report_t *rep = w.shared;
  expect_all_alive_and_working(&w, codes);
  for (int r = 0; r < 3; r++)
    assert_int_equal(rep->rejected[r], 0);
  world_free(&w);
}

int main(int argc, char **argv) {
  if (argc > 1)
    cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_secret_arguments),
      cmocka_unit_test(test_forged_hello_refused),
      cmocka_unit_test(test_impostor_bye_kills_nobody),
      cmocka_unit_test(test_wrong_or_no_secret_refused),
      cmocka_unit_test(test_unauthenticated_world),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
