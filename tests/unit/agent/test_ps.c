/* test_ps: the asgd / dc-asgd parameter-server endpoint (agent/ps.c) over real loopback TCP, in
 * one process, against direct computations:
 * - the slices of any model over any number of shards partition it;
 * - asgd: pushes are applied at once in arrival order (w -= lr g), each push's delay is the
 *   updates applied since that worker's pull;
 * - dc-asgd: the shard applies g + lambda g.g.(w_now - w_pulled) with w_pulled the slice as
 *   that worker pulled it, and its adaptive variant lambda / sqrt(MeanSquare);
 * - two shards: a pull assembles the whole model, a push reaches both slices;
 * - done is counted per worker; a request of another epoch is refused; a shard that is gone
 *   fails the pull within the deadline. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent/ps.h"
#include "wagma/clock_internal.h"

#define N 10
#define RANKS 3

typedef struct world {
  wg_ps_t *p[RANKS];
  wg_adpsgd_peer_t peers[RANKS];
  float w0[N];
} world_t;

static void world_open_a(world_t *w, int shards, double lambda, int adaptive) {
  wagma_optim_config_t sgd = wagma_optim_defaults(WAGMA_OPTIM_SGD);
  sgd.schedule.lr = 0.1f;
  sgd.momentum = 0.0f;
  memset(w, 0, sizeof *w);
  for (int i = 0; i < N; i++)
    w->w0[i] = 0.5f * (float)i - 1.0f;
  for (int r = 0; r < RANKS; r++) {
    assert_int_equal(wg_ps_open("127.0.0.1", N, &sgd, lambda, NULL, NULL, &w->p[r]), 0);
    wg_ps_set_adaptive(w->p[r], adaptive);
    snprintf(w->peers[r].host, sizeof w->peers[r].host, "127.0.0.1");
    w->peers[r].port = wg_ps_port(w->p[r]);
    w->peers[r].token = 1000 + (uint64_t)r;
  }
  for (int r = 0; r < RANKS; r++)
    assert_int_equal(
        wg_ps_set_epoch(w->p[r], 5, r, RANKS, shards, w->peers, 1000 + (uint64_t)r, 2.0, w->w0), 0);
}

static void world_open(world_t *w, int shards, double lambda) {
  world_open_a(w, shards, lambda, 0);
}

static void world_close(world_t *w) {
  for (int r = 0; r < RANKS; r++)
    wg_ps_close(w->p[r]);
}

static void grad_of(int worker, float *g) {
  for (int i = 0; i < N; i++)
    g[i] = (float)(worker * 3 + i % 4) * 0.25f - 0.5f;
}

static void slices_partition_the_model(void **state) {
  (void)state;
  for (size_t n = 1; n < 50; n += 7)
    for (int s = 1; s <= 9; s++) {
      size_t next = 0;
      for (int k = 0; k < s; k++) {
        size_t first, len;
        wg_ps_slice(n, s, k, &first, &len);
        assert_int_equal(first, next);
        next = first + len;
      }
      assert_int_equal(next, n);
    }
  assert_int_equal(wg_ps_shards(2, 4), 2);
  assert_int_equal(wg_ps_shards(8, 4), 3);
  assert_int_equal(wg_ps_shards(1, 1), 0);
}

/* Two workers pull, then push in turn; the shard's slice and the delays against by hand. */
static void check_two_pushes(double lambda, int adaptive) {
  world_t w;
  world_open_a(&w, 1, lambda, adaptive);
  float m1[N], m2[N], g1[N], g2[N], got[N];
  uint64_t d1 = 99, d2 = 99;
  assert_int_equal(wg_ps_pull(w.p[1], m1), 0);
  assert_int_equal(wg_ps_pull(w.p[2], m2), 0);
  assert_memory_equal(m1, w.w0, sizeof m1);
  grad_of(1, g1);
  grad_of(2, g2);
  assert_int_equal(wg_ps_push(w.p[1], g1, 7, 0.5, &d1), 0);
  assert_int_equal(wg_ps_push(w.p[2], g2, 9, 0.7, &d2), 0);
  assert_int_equal(d1, 0); /* nothing applied since its pull */
  assert_int_equal(d2, 1); /* worker 1's push came in between */
  wg_ps_shard_stats_t st;
  wg_ps_shard_stats(w.p[0], &st);
  assert_int_equal(st.version, 2);
  assert_int_equal(st.pushes, 2);
  assert_int_equal(st.max_delay, 1);
  assert_int_equal(st.max_iteration, 9);
  memset(got, 0, sizeof got);
  wg_ps_shard_slice(w.p[0], got);
  for (int i = 0; i < N; i++) {
    /* push 1 (worker 1 pulled w0, the shard is at w0: no compensation) */
    float ms = (1.0f - WG_PS_MEANSQ_DECAY) * g1[i] * g1[i];
    float after1 = w.w0[i] - 0.1f * g1[i];
    float g = g2[i], lam = (float)lambda;
    if (adaptive) { /* MeanSquare after both pushes */
      ms = WG_PS_MEANSQ_DECAY * ms + (1.0f - WG_PS_MEANSQ_DECAY) * g2[i] * g2[i];
      lam = (float)lambda / sqrtf(ms + WG_PS_MEANSQ_EPS);
    }
    if (lambda > 0) /* worker 2 pulled w0; the shard is at after1 now */
      g = g2[i] + lam * g2[i] * g2[i] * (after1 - w.w0[i]);
    float want = after1 - 0.1f * g;
    assert_true(fabsf(got[i] - want) <= 1e-6f);
  }
  /* the next pull sees the shard's model */
  assert_int_equal(wg_ps_pull(w.p[1], m1), 0);
  assert_memory_equal(m1, got, sizeof got);
  world_close(&w);
}

static void asgd_applies_pushes_at_once_and_measures_delay(void **state) {
  (void)state;
  check_two_pushes(0.0, 0);
}

static void dc_asgd_compensates_with_the_workers_pull(void **state) {
  (void)state;
  check_two_pushes(0.5, 0);
}

static void dc_asgd_adaptive_scales_lambda_by_the_mean_square(void **state) {
  (void)state;
  check_two_pushes(0.5, 1);
}

static void two_shards_serve_their_slices(void **state) {
  (void)state;
  world_t w;
  world_open(&w, 2, 0.0);
  float m[N], g[N], want[N];
  uint64_t d;
  assert_int_equal(wg_ps_pull(w.p[2], m), 0);
  assert_memory_equal(m, w.w0, sizeof m);
  grad_of(2, g);
  assert_int_equal(wg_ps_push(w.p[2], g, 1, 0.1, &d), 0);
  memset(want, 0, sizeof want);
  wg_ps_shard_slice(w.p[0], want);
  wg_ps_shard_slice(w.p[1], want);
  for (int i = 0; i < N; i++)
    assert_true(fabsf(want[i] - (w.w0[i] - 0.1f * g[i])) <= 1e-6f);
  assert_int_equal(wg_ps_pull(w.p[2], m), 0);
  assert_memory_equal(m, want, sizeof m);
  world_close(&w);
}

static void done_epochs_and_dead_shards(void **state) {
  (void)state;
  world_t w;
  world_open(&w, 1, 0.0);
  wg_ps_shard_stats_t st;
  assert_int_equal(wg_ps_done(w.p[1]), 0);
  assert_int_equal(wg_ps_done(w.p[1]), 0); /* counted once */
  wg_ps_shard_stats(w.p[0], &st);
  assert_int_equal(st.workers_done, 1);
  assert_int_equal(wg_ps_done(w.p[2]), 0);
  wg_ps_shard_stats(w.p[0], &st);
  assert_int_equal(st.workers_done, 2);
  /* the shard moves to epoch 6: a worker still in epoch 5 is refused, its model unchanged */
  assert_int_equal(wg_ps_set_epoch(w.p[0], 6, 0, RANKS, 1, w.peers, 1000, 2.0, w.w0), 0);
  float m[N], keep[N];
  for (int i = 0; i < N; i++)
    m[i] = keep[i] = 42.0f;
  assert_int_equal(wg_ps_pull(w.p[1], m), WAGMA_EPEER);
  assert_memory_equal(m, keep, sizeof m);
  /* the shard is gone: the pull fails within its deadline */
  wg_ps_close(w.p[0]);
  w.p[0] = NULL;
  double t0 = wg_mono();
  assert_true(wg_ps_pull(w.p[2], m) != 0);
  assert_true(wg_mono() - t0 < 2.0 + 1.0); /* hang guard: the deadline is 2 s */
  world_close(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(slices_partition_the_model),
      cmocka_unit_test(asgd_applies_pushes_at_once_and_measures_delay),
      cmocka_unit_test(dc_asgd_compensates_with_the_workers_pull),
      cmocka_unit_test(dc_asgd_adaptive_scales_lambda_by_the_mean_square),
      cmocka_unit_test(two_shards_serve_their_slices),
      cmocka_unit_test(done_epochs_and_dead_shards),
  };
  return cmocka_run_group_tests_name("ps", tests, NULL, NULL);
}
