/* The engine over the NCCL transport between real processes (fork per rank on 127.0.0.1):
 * 2, 3 and 4 ranks in groups of 2, and groups of 2..P over 2..8 ranks drawn per seed, with
 * changing contributors (the sum of the models is conserved and
 * every contribution's staleness is <= tau), the synchronous allreduce baseline, a peer
 * SIGKILLed or SIGSTOPped mid-run, and the fake's faults (an operation that never completes,
 * ncclRemoteError, an initialisation in progress for ever): the lane is revoked and the rounds
 * go on over TCP. Every scenario also checks what the lane did, so a run that silently moved
 * everything over TCP fails.
 *
 * Built twice: test_nccl_engine against tests/fake_nccl (every machine), and
 * test_nccl_engine_multi_gpu (label gpu) against NCCL with rank r on GPU r: the scenarios
 * of P ranks run where the machine has P GPUs (skipped, with the count, where it has fewer;
 * exit 77 below 2); the fault cases need the fake. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine_world.h"
#include "gpu_count.h"
#include "nccl_internal.h"
#include "nccl_world_hooks.h"

static ew_result_t res[EW_MAXP];

static int gpus = 1 << 20; /* the real build: CUDA devices (gpu_count) */

/* The star variant (WAGMA_ENGINE_ROUNDS=star): contributions through the leader over the lane,
 * no group collectives. */
static int star_rounds(void) {
  const char *r = getenv("WAGMA_ENGINE_ROUNDS");
  return r && strcmp(r, "star") == 0;
}

/* Skips the calling test when a scenario of P ranks has fewer GPUs than ranks (real NCCL). */
static void need_gpus(int P) {
  if (gpus < P) {
    printf("  %d ranks need %d GPUs, %d here: skipped\n", P, P, gpus);
    skip();
  }
}

/* seed 0: rank 0 slow, the others' pace in rank order; else each rank's pace and the
 * stragglers' pauses drawn from the seed (random arrival orders). */
static void run_conservation(int P, int S, int tau, wagma_global_sync_t mode, unsigned seed) {
  need_gpus(P);
  ew_scenario_t sc;
  ew_scenario_init(&sc, P, S, tau, mode);
  sc.rounds = 40;
  for (int r = 0; r < P; r++)
    sc.base_ms[r] = 1 + 2 * r; /* the contributors of a round change with these */
  sc.base_ms[0] = 10;          /* slow: its round thread contributes for it */
  sc.slow_p = 0.2;
  sc.slow_ms = 6;
  if (seed) {
    unsigned x = seed * 2654435761u + 7u;
    for (int r = 0; r < P; r++)
      sc.base_ms[r] = 0.5 + (double)(ew_draw(&x) % 100) / 10.0;
    sc.slow_p = (double)(ew_draw(&x) % 30) / 100.0;
    sc.slow_ms = 2 + (double)(ew_draw(&x) % 20);
    sc.seed = seed;
  }
  sc.settle_s = 1.5;
  sc.track_catchup = 1;
  nw_reset();
  assert_int_equal(ew_run(&sc, res), 0);
  for (int i = 0; i < EW_COUNT; i++) {
    double have = 0, want = 0;
    for (int r = 0; r < P; r++) {
      have += res[r].model[i];
      want += res[r].initial[i] + res[r].added[i] + res[r].catchup[i];
    }
    assert_float_equal(have, want, 1e-2 + 1e-4 * fabs(want));
  }
  uint64_t corrections = 0, collectives = 0, failed = 0;
  for (int r = 0; r < P; r++) {
    assert_int_equal(res[r].errors, 0);
    assert_int_equal(res[r].bad_staleness, 0);
    corrections += res[r].counters.corrections_applied;
    assert_true(nw_lanes[r].recorded);
    assert_int_equal(nw_lanes[r].state, NC_LANE_UP);
    assert_true(nw_lanes[r].transfers + nw_lanes[r].collectives > 0);
    if (nw_lanes[r].failures || nw_lanes[r].collective_failures)
      printf("  rank %d: %llu lane transfers failed, %llu of %llu collectives\n", r,
             (unsigned long long)nw_lanes[r].failures,
             (unsigned long long)nw_lanes[r].collective_failures,
             (unsigned long long)nw_lanes[r].collectives);
    /* a drawn scenario of up to 8 ranks on a loaded 2-core machine may miss a data deadline
     * (0.5 s) now and then: the round is void for all its contributors, and the sums above
     * still hold; a fixed one never does */
    if (!seed) {
      assert_int_equal(nw_lanes[r].failures, 0);
      assert_int_equal(nw_lanes[r].collective_failures, 0);
    }
    failed += nw_lanes[r].failures + nw_lanes[r].collective_failures;
    collectives += nw_lanes[r].collectives;
  }
  assert_true(corrections > (uint64_t)(5 * P));
  assert_true(10 * failed <= collectives + corrections);
  /* rounds as one allreduce on the group's communicator (the default over NCCL), or, in the
   * star variant, none */
  if (star_rounds())
    assert_int_equal(collectives, 0);
  else
    assert_true(collectives > (uint64_t)(2 * P));
}

static void test_groups_p2(void **s) {
  (void)s;
  run_conservation(2, 2, 4, WAGMA_GLOBAL_BARRIER, 0);
}

static void test_groups_p3(void **s) {
  (void)s;
  run_conservation(3, 2, 4, WAGMA_GLOBAL_WAIT_AVOIDING, 0);
}

static void test_groups_p4(void **s) {
  (void)s;
  run_conservation(4, 2, 4, WAGMA_GLOBAL_WAIT_AVOIDING, 0);
}

/* Groups of 2..P over P = 2..8 ranks, both global modes, tau 2..5, each rank's pace and its
 * stragglers drawn per seed ($WAGMA_NCCL_PROPERTY_SEEDS, default 4, from
 * $WAGMA_NCCL_PROPERTY_FIRST_SEED, default 1): conservation, staleness, the group collectives. */
static void test_groups_random(void **s) {
  (void)s;
  const char *env = getenv("WAGMA_NCCL_PROPERTY_SEEDS");
  const char *first_env = getenv("WAGMA_NCCL_PROPERTY_FIRST_SEED");
  unsigned seeds = env ? (unsigned)atoi(env) : 4, first = first_env ? (unsigned)atoi(first_env) : 1;
  for (unsigned seed = first; seed < first + seeds; seed++) {
    unsigned x = seed * 40503u + 11u;
    int P = 2 + (int)(ew_draw(&x) % 7);
    int S = 2 + (int)(ew_draw(&x) % (unsigned)(P - 1));
    int tau = 2 + (int)(ew_draw(&x) % 4);
    wagma_global_sync_t mode = ew_draw(&x) % 2 ? WAGMA_GLOBAL_WAIT_AVOIDING : WAGMA_GLOBAL_BARRIER;
    printf("  seed %u: P %d S %d tau %d %s\n", seed, P, S, tau,
           mode == WAGMA_GLOBAL_BARRIER ? "barrier" : "wait-avoiding");
    if (gpus < P)
      continue; /* the real build on fewer GPUs */
    run_conservation(P, S, tau, mode, seed);
  }
}

/* The synchronous baseline: wagma_comm_allreduce(MEAN) every iteration on NCCL. */
static void test_allreduce_mean(void **s) {
  (void)s;
  need_gpus(3);
  ew_scenario_t sc;
  ew_scenario_init(&sc, 3, 2, 4, WAGMA_GLOBAL_BARRIER);
  sc.loop = EW_LOOP_SYNC;
  sc.rounds = 20;
  for (int r = 0; r < 3; r++) /* the run outlasts the lane's start (the group splits) */
    sc.base_ms[r] = 5;
  nw_reset();
  assert_int_equal(ew_run(&sc, res), 0);
  for (int i = 0; i < EW_COUNT; i++) {
    double want = 0;
    for (int r = 0; r < 3; r++)
      want += res[r].initial[i] + res[r].added[i];
    for (int r = 0; r < 3; r++)
      assert_float_equal(res[r].model[i], want / 3, 1e-2);
  }
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].errors, 0);
    assert_true(nw_lanes[r].transfers > 0);
  }
}

/* A peer SIGKILLed mid-run; the survivors' rounds go on within about a deadline. In both
 * global modes: in barrier mode the next global round is a blocking allreduce, and a survivor
 * that started it before seeing the death ran it among all four while the others ran it among
 * three, until the 30 s global deadline (6 of 40 runs with two copies of this test beside eight
 * busy loops on 2 cores, over TCP too: NW_TCP=1). Fixed by the stale-view notices of
 * engine_global.c (0 of 60 such runs); on an idle machine this rarely races. */
static void sigkill_mid_run(wagma_global_sync_t mode) {
  need_gpus(4);
  ew_scenario_t sc;
  ew_scenario_init(&sc, 4, 2, 4, mode);
  sc.rounds = 60;
  sc.floor_s = 0.3;
  for (int r = 0; r < 4; r++)
    sc.base_ms[r] = 3;
  sc.kill_rank = 2;
  nw_reset();
  assert_int_equal(ew_run(&sc, res), 0);
  for (int r = 0; r < 4; r++) {
    if (r == 2)
      continue;
    assert_int_equal(res[r].errors, 0);
    assert_true(res[r].final_round >= 60);
    assert_true(res[r].max_wait_after_s < 3.0); /* about one deadline for the dead rank */
    assert_true(nw_lanes[r].transfers > 0);
    assert_true(nw_lanes[r].dead_mask & (1u << 2)); /* the transport learned of the death */
  }
}

static void test_sigkill_mid_run_barrier(void **s) {
  (void)s;
  sigkill_mid_run(WAGMA_GLOBAL_BARRIER);
}

static void test_sigkill_mid_run(void **s) {
  (void)s;
  sigkill_mid_run(WAGMA_GLOBAL_WAIT_AVOIDING);
}

static void test_sigstop_mid_run(void **s) {
  (void)s;
  need_gpus(4);
  ew_scenario_t sc;
  ew_scenario_init(&sc, 4, 2, 4, WAGMA_GLOBAL_WAIT_AVOIDING);
  sc.rounds = 200;
  sc.floor_s = 0.2;
  for (int r = 0; r < 4; r++)
    sc.base_ms[r] = 5;
  sc.stop_rank = 3;
  sc.stop_s = 2.0;
  nw_reset();
  assert_int_equal(ew_run(&sc, res), 0);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res[r].errors, 0);
    assert_true(res[r].final_round >= 200);
    if (r < 3)
      assert_true(res[r].max_wait_after_s < 2.5); /* survivors moved on within the deadline */
  }
}

#ifdef WG_NCCL_FAKE
/* Faults from the fake, set in every rank: the lane goes down (or never up), nothing hangs,
 * the models are still conserved. */
static void run_fault(const char *var, const char *value, int expect_up) {
  setenv(var, value, 1);
  ew_scenario_t sc;
  ew_scenario_init(&sc, 3, 2, 4, WAGMA_GLOBAL_WAIT_AVOIDING);
  sc.rounds = 30;
  sc.floor_s = 0.3;
  for (int r = 0; r < 3; r++)
    sc.base_ms[r] = 2 + r;
  sc.settle_s = 1.5;
  sc.track_catchup = 1;
  nw_reset();
  int rc = ew_run(&sc, res);
  unsetenv(var);
  assert_int_equal(rc, 0);
  for (int i = 0; i < EW_COUNT; i++) {
    double have = 0, want = 0;
    for (int r = 0; r < 3; r++) {
      have += res[r].model[i];
      want += res[r].initial[i] + res[r].added[i] + res[r].catchup[i];
    }
    assert_float_equal(have, want, 1e-2 + 1e-4 * fabs(want));
  }
  uint64_t failures = 0;
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].errors, 0);
    assert_true(res[r].final_round >= 30);
    /* star rounds: every operation is the lane's, so the fault revokes the lane; otherwise
     * the faulty operation may be a group allreduce: its communicator is revoked instead */
    failures += nw_lanes[r].failures + (star_rounds() ? 0 : nw_lanes[r].collective_failures);
    if (!expect_up) {
      /* never up: still initialising when the run ended, or given up at the deadline */
      assert_true(nw_lanes[r].state == NC_LANE_INIT || nw_lanes[r].state == NC_LANE_OFF);
      assert_int_equal(nw_lanes[r].transfers, 0);
      assert_int_equal(nw_lanes[r].collectives, 0);
    } else if (star_rounds()) {
      assert_int_equal(nw_lanes[r].state, NC_LANE_DOWN);
    } else {
      assert_true(nw_lanes[r].state == NC_LANE_DOWN || nw_lanes[r].state == NC_LANE_UP);
    }
  }
  if (expect_up)
    assert_true(failures > 0);
}

static void test_fault_op_never_completes(void **s) {
  (void)s;
  run_fault("FAKE_NCCL_HANG_OP", "6", 1);
}

static void test_fault_remote_error(void **s) {
  (void)s;
  run_fault("FAKE_NCCL_REMOTE_ERROR_OP", "4", 1);
}

static void test_fault_init_in_progress_for_ever(void **s) {
  (void)s;
  run_fault("FAKE_NCCL_INIT_HANG", "1", 0);
}

#endif

int main(void) {
#ifndef WG_NCCL_FAKE
  if ((gpus = gpu_count_for_ranks("test_nccl_engine_multi_gpu")) < 0)
    return 77;
#endif
  nw_init();
  if (getenv("NW_ONLY")) /* one test by name, e.g. to repeat it */
    cmocka_set_test_filter(getenv("NW_ONLY"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_groups_p2),
      cmocka_unit_test(test_groups_p3),
      cmocka_unit_test(test_groups_p4),
      cmocka_unit_test(test_groups_random),
      cmocka_unit_test(test_allreduce_mean),
      cmocka_unit_test(test_sigkill_mid_run),
      cmocka_unit_test(test_sigkill_mid_run_barrier),
      cmocka_unit_test(test_sigstop_mid_run),
#ifdef WG_NCCL_FAKE
      cmocka_unit_test(test_fault_op_never_completes),
      cmocka_unit_test(test_fault_remote_error),
      cmocka_unit_test(test_fault_init_in_progress_for_ever),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
