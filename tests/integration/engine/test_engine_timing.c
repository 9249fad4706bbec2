/* test_engine_timing.c — wall-clock claims of §5.1, real processes over TCP (label timing):
 *  - transient imbalance (each round each rank sleeps D with probability p): barrier mode
 *    finishes N rounds clearly faster than a synchronous allreduce loop under the same delays;
 *  - one persistent straggler 10x slower: in wait-avoiding mode the fast ranks complete at
 *    least 3x more rounds per second than lockstep allows; in barrier mode they do not (they
 *    run at the straggler's pace on average). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "engine_world.h"

static ew_result_t res[EW_MAXP];

static double slowest_elapsed(int P) {
  double t = 0;
  for (int r = 0; r < P; r++)
    if (res[r].elapsed_s > t)
      t = res[r].elapsed_s;
  return t;
}

static void test_transient_imbalance(void **s) {
  (void)s;
  ew_scenario_t sc;
  ew_scenario_init(&sc, 4, 2, 8, WAGMA_GLOBAL_BARRIER);
  sc.rounds = 48;
  for (int r = 0; r < 4; r++)
    sc.base_ms[r] = 1;
  sc.slow_p = 0.25;
  sc.slow_ms = 20;
  sc.seed = 7;
  assert_int_equal(ew_run(&sc, res), 0);
  double t_barrier = slowest_elapsed(4);
  sc.loop = EW_LOOP_SYNC;
  assert_int_equal(ew_run(&sc, res), 0);
  double t_sync = slowest_elapsed(4);
  printf("transient imbalance, 48 rounds: barrier %.3f s, synchronous allreduce %.3f s, "
         "speedup %.2fx\n",
         t_barrier, t_sync, t_sync / t_barrier);
  assert_true(t_barrier < 0.9 * t_sync);
}

static double fast_rate(int P, int slow) {
  double sum = 0;
  for (int r = 0; r < P; r++)
    if (r != slow)
      sum += (double)res[r].final_round / res[r].elapsed_s;
  return sum / (P - 1);
}

static void test_persistent_straggler(void **s) {
  (void)s;
  ew_scenario_t sc;
  ew_scenario_init(&sc, 4, 2, 4, WAGMA_GLOBAL_WAIT_AVOIDING);
  sc.rounds = 80;
  for (int r = 0; r < 4; r++)
    sc.base_ms[r] = 4;
  sc.base_ms[3] = 40;
  double lockstep = 1000.0 / 40.0;
  assert_int_equal(ew_run(&sc, res), 0);
  double wa = fast_rate(4, 3);
  uint64_t skipped = res[3].skipped;
  sc.mode = WAGMA_GLOBAL_BARRIER;
  assert_int_equal(ew_run(&sc, res), 0);
  double barrier = fast_rate(4, 3);
  printf("persistent 10x straggler: fast ranks %.1f rounds/s wait-avoiding (straggler skipped "
         "%llu rounds), %.1f rounds/s barrier; lockstep allows %.1f\n",
         wa, (unsigned long long)skipped, barrier, lockstep);
  assert_true(wa >= 3.0 * lockstep);
  assert_true(barrier < 3.0 * lockstep);
  assert_true(skipped > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_transient_imbalance),
      cmocka_unit_test(test_persistent_straggler),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
