/* bench_straggler — rounds per second of the fast ranks under injected compute delays, for the
 * engine's barrier and wait-avoiding global modes against a synchronous allreduce loop
 * (wagma_comm_allreduce every step, the baseline) under the same delays. Real processes, one
 * per rank, over TCP on 127.0.0.1.
 *
 * Scenarios: transient imbalance (each round each rank sleeps slow_ms more with probability
 * p) and one persistent straggler (10x slower than the others).
 *
 * Usage: bench_straggler [P] [rounds] [base_ms] [tau]   (defaults 4 120 4 4) */
#include <stdio.h>
#include <stdlib.h>

#include "engine_world.h"

static ew_result_t res[EW_MAXP];

/* Mean rate over ranks other than `slow` (-1: all) of rounds / elapsed; for the synchronous
 * loop the round counter is the number of allreduce steps. */
static double rate(int P, int slow) {
  double sum = 0;
  int n = 0;
  for (int r = 0; r < P; r++)
    if (r != slow) {
      sum += (double)res[r].final_round / res[r].elapsed_s;
      n++;
    }
  return sum / n;
}

/* Same, counting only the iterations a rank computed (a wait-avoiding jump skips rounds). */
static double step_rate(int P, int slow) {
  double sum = 0;
  int n = 0;
  for (int r = 0; r < P; r++)
    if (r != slow) {
      sum += (double)res[r].steps / res[r].elapsed_s;
      n++;
    }
  return sum / n;
}

static double wa_steps;

static int run(ew_scenario_t *sc, ew_loop_t loop, wagma_global_sync_t mode, int slow, double *out) {
  sc->loop = loop;
  sc->mode = mode;
  if (ew_run(sc, res) != 0) {
    fprintf(stderr, "bench_straggler: a run failed\n");
    return -1;
  }
  *out = rate(sc->P, slow);
  if (loop == EW_LOOP_STEP && mode == WAGMA_GLOBAL_WAIT_AVOIDING)
    wa_steps = step_rate(sc->P, slow);
  return 0;
}

int main(int argc, char **argv) {
  int P = argc > 1 ? atoi(argv[1]) : 4;
  int rounds = argc > 2 ? atoi(argv[2]) : 120;
  double base = argc > 3 ? atof(argv[3]) : 4;
  int tau = argc > 4 ? atoi(argv[4]) : 4;
  if (P < 2 || P > EW_MAXP || rounds < tau || base <= 0 || tau < 1) {
    fprintf(stderr, "usage: bench_straggler [P 2..%d] [rounds] [base_ms] [tau]\n", EW_MAXP);
    return 2;
  }
  printf("P=%d, %d rounds, compute %.1f ms/round, tau=%d, group size 2, model %d floats\n\n", P,
         rounds, base, tau, EW_COUNT);
  printf("%-34s %10s %12s %12s %14s %10s %10s\n", "scenario", "sync r/s", "barrier r/s",
         "wait-av r/s", "wait-av steps/s", "barrier/x", "wait-av/x");

  ew_scenario_t sc;
  double sync, barrier, wa;

  ew_scenario_init(&sc, P, 2, tau, WAGMA_GLOBAL_BARRIER);
  sc.rounds = rounds;
  for (int r = 0; r < P; r++)
    sc.base_ms[r] = base;
  sc.slow_p = 0.25;
  sc.slow_ms = 5 * base;
  sc.seed = 11;
  if (run(&sc, EW_LOOP_SYNC, WAGMA_GLOBAL_BARRIER, -1, &sync) ||
      run(&sc, EW_LOOP_STEP, WAGMA_GLOBAL_BARRIER, -1, &barrier) ||
      run(&sc, EW_LOOP_STEP, WAGMA_GLOBAL_WAIT_AVOIDING, -1, &wa))
    return 1;
  char name[64];
  snprintf(name, sizeof(name), "transient: +%.0f ms w.p. 0.25", sc.slow_ms);
  printf("%-34s %10.1f %12.1f %12.1f %14.1f %9.2fx %9.2fx\n", name, sync, barrier, wa, wa_steps,
         barrier / sync, wa / sync);

  ew_scenario_init(&sc, P, 2, tau, WAGMA_GLOBAL_BARRIER);
  sc.rounds = rounds;
  for (int r = 0; r < P; r++)
    sc.base_ms[r] = base;
  sc.base_ms[P - 1] = 10 * base;
  if (run(&sc, EW_LOOP_SYNC, WAGMA_GLOBAL_BARRIER, P - 1, &sync) ||
      run(&sc, EW_LOOP_STEP, WAGMA_GLOBAL_BARRIER, P - 1, &barrier) ||
      run(&sc, EW_LOOP_STEP, WAGMA_GLOBAL_WAIT_AVOIDING, P - 1, &wa))
    return 1;
  snprintf(name, sizeof(name), "persistent: rank %d 10x slower", P - 1);
  printf("%-34s %10.1f %12.1f %12.1f %14.1f %9.2fx %9.2fx\n", name, sync, barrier, wa, wa_steps,
         barrier / sync, wa / sync);
  printf("\nr/s = rounds/s of the fast ranks (all ranks for transient), counting rounds a "
         "wait-avoiding jump skipped;\nsteps/s = iterations actually computed; x = r/s vs. the "
         "synchronous allreduce loop under the same delays\n");
  return 0;
}
