/* engine_world.h — real-process worlds for the engine's integration tests and the straggler
 * benchmark: one fork per rank on 127.0.0.1 with free ports, results to the parent through
 * MAP_SHARED memory, every child reaped by PID, a hard deadline after which the parent
 * SIGKILLs what is left (by PID) and reports failure. */
#ifndef WAGMA_TEST_ENGINE_WORLD_H
#define WAGMA_TEST_ENGINE_WORLD_H

#include <stdint.h>

#include "wagma/collective.h"

#define EW_MAXP 8
#define EW_COUNT 1000

typedef enum ew_loop {
  EW_LOOP_STEP = 0, /* wagma_comm_step every iteration */
  EW_LOOP_SYNC = 1, /* synchronous baseline: wagma_comm_allreduce(MEAN) every iteration */
} ew_loop_t;

typedef struct ew_scenario {
  int P, S, tau;
  wagma_global_sync_t mode;
  ew_loop_t loop;
  double floor_s;
  int rounds;              /* each rank runs until its round counter reaches this */
  double base_ms[EW_MAXP]; /* compute delay of each rank per iteration */
  double slow_p, slow_ms;  /* transient imbalance: extra slow_ms with probability slow_p */
  unsigned seed;
  int kill_rank; /* -1: none; SIGKILLed once it reached round 10 */
  int stop_rank; /* -1: none; SIGSTOPped at round 10 for stop_s seconds */
  double stop_s;
  int leave_rank; /* -1: none; at leave_round it waits leave_delay_s, then destroys its
                     communicator (an orderly BYE) and exits 0 while the others go on */
  int leave_round;
  double leave_delay_s;
  double hard_timeout_s; /* default 90 */
  double settle_s;       /* after all finished: let open rounds end (default 0.1 s) */
  int track_catchup;     /* record each catch-up's model change in results[].catchup */
  size_t count;          /* the model's floats (0 = EW_COUNT); beyond EW_COUNT they are zeros
                            and untracked: a large model makes each round's data phase long */
  int rounds_path;       /* wagma_comm_options_t.rounds (0 = the default) */
} ew_scenario_t;

typedef struct ew_result {
  volatile int started, finished, exited_ok;
  volatile uint64_t round; /* progress, for the parent's kill/stop triggers */
  int errors;
  int steps;
  uint64_t final_round;
  double elapsed_s; /* from the first to the last iteration */
  double max_wait_s;
  double max_wait_after_s; /* max step wait after the victim was hit (kill/stop) */
  uint64_t max_staleness;
  int bad_staleness;
  int caught_up;
  uint64_t skipped;
  wagma_round_stats_t first;
  wagma_comm_counters_t counters;
  float model[EW_COUNT];
  double initial[EW_COUNT];
  double added[EW_COUNT];
  double catchup[EW_COUNT]; /* sum of (model after - before) of steps that caught up */
} ew_result_t;

/* The data-plane secret every rank of these worlds passes (wagma_comm_options_t.secret), as
 * agents pass their epoch's. */
extern const uint8_t ew_secret[32];

/* Runs the scenario; results[] gets one entry per rank. Returns 0 when every child that was
 * not a victim exited 0 before the hard deadline. */
int ew_run(const ew_scenario_t *sc, ew_result_t *results);

/* Scenario defaults: kill/stop/leave none, floor 0.5 s, hard timeout 90 s. */
/* The scenario draws of the property tests: xorshift32 on *x, in [0, 32768). */
static inline unsigned ew_draw(unsigned *x) {
  *x ^= *x << 13;
  *x ^= *x >> 17;
  *x ^= *x << 5;
  return *x % 32768u;
}

void ew_scenario_init(ew_scenario_t *sc, int P, int S, int tau, wagma_global_sync_t mode);

#endif
