/* test_coll.c — blocking collectives (coll.h) between real processes on loopback: allreduce
 * sum/mean for P = 2, 4, 6, 8 and 64, small (recursive doubling) and large (ring) buffers,
 * each algorithm forced (doubling, Rabenseifner, ring) on empty, uneven and multi-segment
 * blocks, 64 MiB buffers, broadcast, weighted average with a weight-0 joiner, disjoint groups
 * running at the same time, a participant that closes without taking part (every survivor
 * learns it within about a second through failure notices). Every allreduce runs in place and
 * out of place (wg_coll_allreduce_from: the output starts as NaN, the input stays unchanged),
 * and every MEAN also with its deltas (wg_coll_allreduce_delta: output minus input, bitwise).
 * Values are small integers so every sum is exact and the result can be compared bit for bit. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll.h"
#include "world.h"

#define OP_DEADLINE_S 60.0

typedef struct scenario {
  int full;         /* 0: only the P = 64 subset of operations */
  size_t big_count; /* floats of the ring allreduce */
} scenario_t;

static float value(int rank, size_t i) {
  return (float)((int)(i % 97) - 40) * (float)(rank + 1);
}

static int all_ranks[64];

static wg_coll_ctx_t make_ctx(wg_transport_t *t, int rank, const int *ranks, int n) {
  wg_coll_ctx_t c = {0};
  c.ops = &wg_tcp_transport;
  c.transport = t;
  c.rank = rank;
  c.ranks = ranks;
  c.nranks = n;
  c.round = 1;
  c.group = 0;
  c.seq = 0;
  return c;
}

/* Allreduce of count floats over ctx->ranks; returns 0 if every element is exact. Out of
 * place (mode 1, wg_coll_allreduce_from): the input in a buffer of its own, the output's
 * buffer filled with NaN first (an element never written shows), and the input must be
 * unchanged; mode 2 (MEAN only, wg_coll_allreduce_delta) also checks every delta, the output
 * minus the input, bit for bit. */
static int check_allreduce_as(wg_coll_ctx_t *ctx, size_t count, wagma_reduce_op_t op, int mode) {
  float *buf = malloc(count * sizeof *buf);
  float *src = mode ? malloc(count * sizeof *src) : NULL;
  float *delta = mode == 2 ? malloc(count * sizeof *delta) : NULL;
  int bad = 0;
  for (size_t i = 0; i < count; i++) {
    buf[i] = mode ? NAN : value(ctx->rank, i);
    if (src)
      src[i] = value(ctx->rank, i);
    if (delta)
      delta[i] = NAN;
  }
  double deadline = wg_now() + OP_DEADLINE_S;
  int rc = mode == 2   ? wg_coll_allreduce_delta(ctx, src, buf, delta, count, deadline)
           : mode == 1 ? wg_coll_allreduce_from(ctx, src, buf, count, op, deadline)
                       : wg_coll_allreduce(ctx, buf, count, op, deadline);
  for (size_t i = 0; src && i < count && !bad; i++)
    if (src[i] != value(ctx->rank, i)) {
      fprintf(stderr, "rank %d: allreduce_from(%zu) wrote its input at %zu\n", ctx->rank, count, i);
      bad = 1;
    }
  for (size_t i = 0; delta && rc == 0 && i < count && !bad; i++) {
    volatile float want = buf[i] - src[i];
    float got = delta[i];
    if (memcmp(&got, (const void *)&want, sizeof got) != 0) {
      fprintf(stderr, "rank %d: allreduce_delta(%zu)[%zu] = %g, want %g\n", ctx->rank, count, i,
              (double)got, (double)want);
      bad = 1;
    }
  }
  free(src);
  free(delta);
  if (rc != 0) {
    fprintf(stderr, "rank %d: allreduce(%zu) failed: %s\n", ctx->rank, count, wagma_strerror(rc));
    free(buf);
    return 1;
  }
  int factor = 0;
  for (int k = 0; k < ctx->nranks; k++)
    factor += ctx->ranks[k] + 1;
  for (size_t i = 0; i < count && !bad; i++) {
    float want = (float)((int)(i % 97) - 40) * (float)factor;
    if (op == WAGMA_REDUCE_MEAN)
      want /= (float)ctx->nranks;
    if (buf[i] != want) {
      fprintf(stderr, "rank %d: allreduce(%zu, op %d)[%zu] = %g, want %g\n", ctx->rank, count,
              (int)op, i, buf[i], want);
      bad = 1;
    }
  }
  free(buf);
  ctx->seq += (uint64_t)1 << 20;
  return bad;
}

/* Every way: in place, out of place, and for MEAN with the deltas. */
static int check_allreduce(wg_coll_ctx_t *ctx, size_t count, wagma_reduce_op_t op) {
  int bad = check_allreduce_as(ctx, count, op, 0) | check_allreduce_as(ctx, count, op, 1);
  if (op == WAGMA_REDUCE_MEAN)
    bad |= check_allreduce_as(ctx, count, op, 2);
  return bad;
}

static int check_broadcast(wg_coll_ctx_t *ctx, size_t count, int root) {
  float *buf = malloc(count * sizeof *buf);
  for (size_t i = 0; i < count; i++)
    buf[i] = ctx->rank == root ? value(root, i) : NAN;
  int rc = wg_coll_broadcast(ctx, buf, count, root, wg_now() + OP_DEADLINE_S);
  int bad = rc != 0;
  for (size_t i = 0; i < count && !bad; i++)
    bad = buf[i] != value(root, i);
  if (bad)
    fprintf(stderr, "rank %d: broadcast(%zu, root %d) wrong (rc %d)\n", ctx->rank, count, root, rc);
  free(buf);
  ctx->seq += (uint64_t)1 << 20;
  return bad;
}

/* Weights w_r = r (rank 0 is a joiner with weight 0 and a buffer of NaNs). */
static int check_average(wg_coll_ctx_t *ctx, size_t count) {
  float *buf = malloc(count * sizeof *buf);
  for (size_t i = 0; i < count; i++)
    buf[i] = ctx->rank == 0 ? NAN : (float)((int)(i % 7) + ctx->rank);
  int rc = wg_coll_average(ctx, buf, count, (float)ctx->rank, wg_now() + OP_DEADLINE_S);
  int bad = rc != 0;
  double wsum = 0;
  for (int k = 0; k < ctx->nranks; k++)
    wsum += ctx->ranks[k];
  for (size_t i = 0; i < count && !bad; i++) {
    double want = 0;
    for (int k = 0; k < ctx->nranks; k++)
      want += ctx->ranks[k] * (double)((int)(i % 7) + ctx->ranks[k]);
    want /= wsum;
    bad = !(fabs(buf[i] - want) <= 1e-5 * fabs(want) + 1e-6);
  }
  if (bad)
    fprintf(stderr, "rank %d: average(%zu) wrong (rc %d)\n", ctx->rank, count, rc);
  free(buf);
  ctx->seq += (uint64_t)1 << 20;
  /* Every weight 0: WAGMA_EINVAL on every participant. */
  float one = 1;
  rc = wg_coll_average(ctx, &one, 1, 0.0f, wg_now() + OP_DEADLINE_S);
  ctx->seq += (uint64_t)1 << 20;
  if (rc != WAGMA_EINVAL) {
    fprintf(stderr, "rank %d: all-zero weights gave %d\n", ctx->rank, rc);
    bad = 1;
  }
  return bad;
}

static int run_scenario(world_t *w, int rank, void *arg) {
  const scenario_t *sc = arg;
  wg_transport_t *t = NULL;
  if (world_open(w, rank, 0, 30.0, &t) != 0)
    return 2;
  int n = w->nranks, bad = 0;
  wg_coll_ctx_t ctx = make_ctx(t, rank, all_ranks, n);
  bad |= check_allreduce(&ctx, 1000, WAGMA_REDUCE_SUM) << 1; /* recursive doubling */
  bad |= check_allreduce(&ctx, 1, WAGMA_REDUCE_MEAN) << 1;
  bad |= check_allreduce(&ctx, sc->big_count, WAGMA_REDUCE_SUM) << 2; /* ring */
  if (sc->full) {
    bad |= check_allreduce(&ctx, 1000, WAGMA_REDUCE_MEAN) << 1;
    bad |= check_allreduce(&ctx, sc->big_count, WAGMA_REDUCE_MEAN) << 2;
    ctx.small_threshold = 4; /* ring with fewer floats than ranks: empty chunks */
    bad |= check_allreduce(&ctx, 3, WAGMA_REDUCE_SUM) << 3;
    bad |= check_allreduce(&ctx, (size_t)n + 1, WAGMA_REDUCE_MEAN) << 3;
    ctx.small_threshold = 0;
    bad |= check_broadcast(&ctx, 1000, n - 1) << 4;
    bad |= check_broadcast(&ctx, 300000, 0) << 4;
    bad |= check_broadcast(&ctx, 300000, n / 2) << 4;
    bad |= check_average(&ctx, 1000) << 5;
    bad |= check_average(&ctx, 200000) << 5;
    /* Every algorithm forced, on sizes that leave blocks empty (fewer floats than ranks),
     * uneven, and large enough for several segments per exchange (8 MiB + 12 bytes). */
    static const size_t counts[] = {1, 3, 1000, 100003, (2u << 20) + 3};
    for (int alg = WG_COLL_DOUBLING; alg <= WG_COLL_RING; alg++) {
      ctx.algorithm = alg;
      for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        int b = check_allreduce(&ctx, counts[i], i % 2 ? WAGMA_REDUCE_MEAN : WAGMA_REDUCE_SUM);
        if (b)
          fprintf(stderr, "rank %d: algorithm %d, %zu floats wrong\n", rank, alg, counts[i]);
        bad |= b << 7;
      }
    }
    ctx.algorithm = 0;
  }
  wg_transport_stats_t st;
  wg_tcp_transport.stats(t, &st);
  if (st.frames_rejected != 0)
    bad |= 1 << 6;
  wg_tcp_transport.close(t);
  return bad;
}

static void run_world(int nranks, scenario_t *sc, double timeout_s) {
  world_t w;
  assert_int_equal(world_init(&w, nranks, 0), 0);
  int codes[64];
  assert_int_equal(world_run(&w, run_scenario, sc, timeout_s, NULL, codes, NULL, NULL), 0);
  for (int r = 0; r < nranks; r++) {
    if (codes[r] != 0)
      fprintf(stderr, "P=%d rank %d exit code %d\n", nranks, r, codes[r]);
    assert_int_equal(codes[r], 0);
  }
  world_free(&w);
}

static void test_p2(void **state) {
  (void)state;
  scenario_t sc = {.full = 1, .big_count = 300001};
  run_world(2, &sc, 90);
}

static void test_p4(void **state) {
  (void)state;
  scenario_t sc = {.full = 1, .big_count = 300001};
  run_world(4, &sc, 90);
}

static void test_p6_non_power_of_two(void **state) {
  (void)state;
  scenario_t sc = {.full = 1, .big_count = 300001};
  run_world(6, &sc, 90);
}

static void test_p8(void **state) {
  (void)state;
  scenario_t sc = {.full = 1, .big_count = 300001};
  run_world(8, &sc, 120);
}

static void test_p64(void **state) {
  (void)state;
  scenario_t sc = {.full = 0, .big_count = 70000};
  run_world(64, &sc, 150);
}

/* 64 MiB + 20 bytes per rank, P = 2 and 3: ring allreduce of big buffers. */
static void test_64mib(void **state) {
  (void)state;
  scenario_t sc = {.full = 0, .big_count = (16u << 20) + 5};
  run_world(3, &sc, 150);
}

/* P = 6 split in two groups {0,2,5} and {1,3,4} that reduce at the same time with the same
 * round and seq; only the group field keeps their frames apart. */
static int run_groups(world_t *w, int rank, void *arg) {
  (void)arg;
  static const int g0[] = {0, 2, 5}, g1[] = {1, 3, 4};
  wg_transport_t *t = NULL;
  if (world_open(w, rank, 0, 30.0, &t) != 0)
    return 2;
  int in0 = rank == 0 || rank == 2 || rank == 5;
  wg_coll_ctx_t ctx = make_ctx(t, rank, in0 ? g0 : g1, 3);
  ctx.group = in0 ? 0 : 1;
  int bad = 0;
  for (int i = 0; i < 5; i++) {
    ctx.seq = 0; /* identical seq in both groups, on purpose */
    bad |= check_allreduce(&ctx, 777, WAGMA_REDUCE_SUM);
    bad |= check_allreduce(&ctx, 100003, WAGMA_REDUCE_MEAN);
    ctx.round++;
  }
  wg_tcp_transport.close(t);
  return bad;
}

static void test_concurrent_groups(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 6, 0), 0);
  int codes[6];
  assert_int_equal(world_run(&w, run_groups, NULL, 90, NULL, codes, NULL, NULL), 0);
  for (int r = 0; r < 6; r++)
    assert_int_equal(codes[r], 0);
  world_free(&w);
}

/* P = 8, rank 5 closes (BYE) 0.3 s after the others started an allreduce over all 8 it never
 * takes part in: every survivor, not only those that wait on rank 5 directly, returns
 * WAGMA_EPEER naming rank 5 well before the 30 s deadline. Then the 7 survivors complete an
 * allreduce among themselves. */
static int run_closer(world_t *w, int rank, void *arg) {
  (void)arg;
  wg_transport_t *t = NULL;
  if (world_open(w, rank, 0, 30.0, &t) != 0)
    return 2;
  if (rank == 5) {
    usleep(300 * 1000);
    wg_tcp_transport.close(t);
    return 0;
  }
  int bad = 0;
  for (int pass = 0; pass < 3; pass++) { /* doubling, ring, Rabenseifner */
    size_t count = pass == 0 ? 100 : 100000;
    int failed = -1;
    wg_coll_ctx_t ctx = make_ctx(t, rank, all_ranks, 8);
    ctx.algorithm = pass == 0 ? WG_COLL_DOUBLING : pass == 1 ? WG_COLL_RING : WG_COLL_RABENSEIFNER;
    ctx.seq = (uint64_t)pass << 21;
    ctx.failed_rank = &failed;
    float *buf = calloc(count, sizeof(float));
    double t0 = wg_now();
    int rc = wg_coll_allreduce(&ctx, buf, count, WAGMA_REDUCE_SUM, t0 + 30.0);
    double took = wg_now() - t0;
    free(buf);
    if (rc != WAGMA_EPEER || failed != 5 || took > 3.0) {
      fprintf(stderr, "rank %d pass %d: rc %d failed %d after %.3f s\n", rank, pass, rc, failed,
              took);
      bad |= 1 << pass;
    }
  }
  static const int survivors[] = {0, 1, 2, 3, 4, 6, 7};
  wg_coll_ctx_t ctx = make_ctx(t, rank, survivors, 7);
  ctx.seq = (uint64_t)7 << 20;
  ctx.round = 2;
  bad |= check_allreduce(&ctx, 1000, WAGMA_REDUCE_SUM) << 2;
  wg_tcp_transport.close(t);
  return bad;
}

static void test_peer_closes_mid_op(void **state) {
  (void)state;
  world_t w;
  assert_int_equal(world_init(&w, 8, 0), 0);
  int codes[8];
  assert_int_equal(world_run(&w, run_closer, NULL, 90, NULL, codes, NULL, NULL), 0);
  for (int r = 0; r < 8; r++) {
    if (codes[r] != 0)
      fprintf(stderr, "closer rank %d exit code %d\n", r, codes[r]);
    assert_int_equal(codes[r], 0);
  }
  world_free(&w);
}

int main(int argc, char **argv) {
  if (argc > 1)
    cmocka_set_test_filter(argv[1]); /* e.g. test_p6* */
  for (int i = 0; i < 64; i++)
    all_ranks[i] = i;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_p2),
      cmocka_unit_test(test_p4),
      cmocka_unit_test(test_p6_non_power_of_two),
      cmocka_unit_test(test_p8),
      cmocka_unit_test(test_concurrent_groups),
      cmocka_unit_test(test_peer_closes_mid_op),
      cmocka_unit_test(test_p64),
      cmocka_unit_test(test_64mib),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
