/* test_engine_tcp.c — the engine over real TCP between real processes (one fork per rank on
 * 127.0.0.1): exact group and global means for P = 2, 4, 6, 8; conservation of the sum of
 * models with slow ranks in both global modes (staleness <= tau); SIGKILL and SIGSTOP of a
 * rank mid-run; epoch changes that destroy communicators with rounds in flight. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine_world.h"

static ew_result_t res[EW_MAXP];

/* ---------------------------------------------------------------- exact means */

static void check_means(int P) {
  /* group round 0 (tau large), then a global round 0 in both modes (tau = 1) */
  ew_scenario_t sc;
  ew_scenario_init(&sc, P, 2, 100, WAGMA_GLOBAL_WAIT_AVOIDING);
  sc.floor_s = 10; /* nobody is left out on a loaded machine */
  assert_int_equal(ew_run(&sc, res), 0);
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(P, 2, NULL, &plan), 0);
  for (int r = 0; r < P; r++) {
    const int *g = NULL;
    int n = wagma_plan_group(&plan, 0, r, NULL, &g);
    for (int i = 0; i < EW_COUNT; i++) {
      double mean = 0;
      for (int k = 0; k < n; k++)
        mean += res[g[k]].initial[i] + res[g[k]].added[i];
      assert_float_equal(res[r].model[i], mean / n, 1e-3);
    }
    assert_int_equal(res[r].first.contributors, n);
    assert_int_equal(res[r].first.max_staleness, 0);
  }
  wagma_plan_free(&plan);
  for (int mode = 0; mode < 2; mode++) {
    ew_scenario_init(&sc, P, 2, 1, (wagma_global_sync_t)mode);
    sc.floor_s = 10;
    assert_int_equal(ew_run(&sc, res), 0);
    for (int r = 0; r < P; r++) {
      for (int i = 0; i < EW_COUNT; i++) {
        double mean = 0;
        for (int k = 0; k < P; k++)
          mean += res[k].initial[i] + res[k].added[i];
        assert_float_equal(res[r].model[i], mean / P, 1e-3);
      }
      assert_int_equal(res[r].first.kind, WAGMA_ROUND_GLOBAL);
      assert_int_equal(res[r].first.contributors, P);
    }
  }
}

static void test_means_p2(void **s) {
  (void)s;
  check_means(2);
}
static void test_means_p4(void **s) {
  (void)s;
  check_means(4);
}
static void test_means_p6(void **s) {
  (void)s;
  check_means(6);
}
static void test_means_p8(void **s) {
  (void)s;
  check_means(8);
}

/* ---------------------------------------------------------------- conservation */

static void check_conservation(wagma_global_sync_t mode) {
  ew_scenario_t sc;
  ew_scenario_init(&sc, 4, 2, 4, mode);
  sc.rounds = 48;
  sc.base_ms[0] = 12; /* slow */
  sc.base_ms[1] = 1;
  sc.base_ms[2] = 2;
  sc.base_ms[3] = 1;
  sc.slow_p = 0.2;
  sc.slow_ms = 5;
  sc.settle_s = 1.5; /* > deadline floor: every open round has finished */
  assert_int_equal(ew_run(&sc, res), 0);
  for (int i = 0; i < EW_COUNT; i++) {
    double have = 0, want = 0;
    for (int r = 0; r < sc.P; r++) {
      have += res[r].model[i];
      want += res[r].initial[i] + res[r].added[i];
    }
    assert_float_equal(have, want, 1e-2 + 1e-4 * fabs(want));
  }
  uint64_t joined = 0;
  for (int r = 0; r < sc.P; r++) {
    assert_int_equal(res[r].errors, 0);
    assert_int_equal(res[r].bad_staleness, 0);
    assert_int_equal(res[r].counters.catchups, 0);
    assert_true(res[r].counters.corrections_applied > 5);
    joined += res[r].counters.rounds_joined;
    for (int i = 0; i < EW_COUNT; i++)
      assert_true(fabsf(res[r].model[i] - res[0].model[i]) < 20.0f);
  }
  assert_true(joined > 0); /* the slow rank's round thread contributed for it */
}

static void test_conservation_barrier(void **s) {
  (void)s;
  check_conservation(WAGMA_GLOBAL_BARRIER);
}
static void test_conservation_wait_avoiding(void **s) {
  (void)s;
  check_conservation(WAGMA_GLOBAL_WAIT_AVOIDING);
}

/* ---------------------------------------------------------------- failures */

static void check_kill(wagma_global_sync_t mode) {
  ew_scenario_t sc;
  ew_scenario_init(&sc, 4, 2, 4, mode);
  sc.rounds = 80;
  sc.floor_s = 0.3;
  for (int r = 0; r < 4; r++)
    sc.base_ms[r] = 3;
  sc.kill_rank = 2;
  assert_int_equal(ew_run(&sc, res), 0);
  for (int r = 0; r < 4; r++) {
    if (r == 2)
      continue;
    assert_int_equal(res[r].errors, 0);
    assert_true(res[r].final_round >= 80);
    /* a round waits at most about one deadline for the dead rank */
    assert_true(res[r].max_wait_after_s < 3.0);
    assert_true(res[r].exited_ok);
  }
}

static void test_sigkill_wait_avoiding(void **s) {
  (void)s;
  check_kill(WAGMA_GLOBAL_WAIT_AVOIDING);
}
static void test_sigkill_barrier(void **s) {
  (void)s;
  check_kill(WAGMA_GLOBAL_BARRIER);
}

static void test_sigstop_catches_up(void **s) {
  (void)s;
  ew_scenario_t sc;
  ew_scenario_init(&sc, 4, 2, 4, WAGMA_GLOBAL_WAIT_AVOIDING);
  sc.rounds = 300;
  sc.floor_s = 0.2;
  for (int r = 0; r < 4; r++)
    sc.base_ms[r] = 5;
  sc.stop_rank = 3;
  sc.stop_s = 2.0;
  assert_int_equal(ew_run(&sc, res), 0);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].errors, 0);
    assert_true(res[r].max_wait_after_s < 2.5);
  }
  /* after SIGCONT the stopped rank skipped ahead instead of replaying ~200 rounds */
  assert_true(res[3].caught_up || res[3].skipped >= 4);
  assert_true(res[3].final_round >= 300);
  assert_true(res[3].steps < res[0].steps);
}

/* ---------------------------------------------------------------- epoch changes */

#define EPOCHS 3

static int epoch_ports[EPOCHS][EW_MAXP];

static int free_ports(int n, int *ports) {
  int fds[EW_MAXP];
  for (int i = 0; i < n; i++) {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t len = sizeof(a);
    if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fds[i], (struct sockaddr *)&a, &len) != 0)
      return -1;
    ports[i] = ntohs(a.sin_port);
  }
  for (int i = 0; i < n; i++)
    close(fds[i]);
  return 0;
}

/* Rank `rank` of epoch 1 runs every epoch whose plan still has it (P = 5, 4, 3), a few rounds
 * each at its own pace, and destroys its communicator right after its last step: peers still
 * have rounds in flight with it. Exit status 0 = every create/destroy went fine. */
static int epoch_child(int rank) {
  int bad = 0;
  for (int e = 0; e < EPOCHS; e++) {
    int P = 5 - e;
    if (rank >= P)
      break;
    wagma_plan_t plan;
    if (wagma_plan_build(P, 2, NULL, &plan) != 0)
      return 1;
    plan.epoch = (uint64_t)e + 1;
    plan.start_round = (uint64_t)e * 100;
    plan.staleness_bound = 4;
    plan.global_sync = WAGMA_GLOBAL_WAIT_AVOIDING;
    for (int i = 0; i < P; i++) {
      snprintf(plan.members[i].name, WAGMA_NAME_MAX, "r%d", i);
      snprintf(plan.members[i].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", epoch_ports[e][i]);
    }
    wagma_comm_options_t o;
    wagma_comm_options_init(&o);
    o.plan = &plan;
    o.rank = rank;
    o.count = EW_COUNT;
    o.connect_timeout_s = 15;
    o.round_deadline_floor_s = 0.5;
    wagma_comm_t *comm = NULL;
    int rc = wagma_comm_create(&o, &comm);
    wagma_plan_free(&plan);
    if (rc != 0)
      return 1;
    float *model = calloc(EW_COUNT, sizeof(float));
    int steps = 10 + 7 * rank; /* ranks leave at different times */
    for (int k = 0; k < steps; k++) {
      usleep((useconds_t)(1000 * (1 + rank)));
      if (wagma_comm_step(comm, model, NULL) != 0)
        bad = 1;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    wagma_comm_destroy(comm);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if ((double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9 > 3.0)
      bad = 1;
    free(model);
  }
  return bad;
}

static void test_epoch_changes(void **s) {
  (void)s;
  for (int e = 0; e < EPOCHS; e++)
    assert_int_equal(free_ports(5, epoch_ports[e]), 0);
  pid_t pids[5];
  fflush(NULL);
  for (int r = 0; r < 5; r++) {
    pids[r] = fork();
    if (pids[r] == 0)
      exit(epoch_child(r));
    assert_true(pids[r] > 0);
  }
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int left = 5, failed = 0;
  while (left > 0) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 90) {
      failed = 1;
      break;
    }
    for (int r = 0; r < 5; r++) {
      int status;
      if (pids[r] > 0 && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          fprintf(stderr, "epoch rank %d: status 0x%x\n", r, status);
          failed = 1;
        }
        pids[r] = 0;
        left--;
      }
    }
    usleep(5000);
  }
  for (int r = 0; r < 5; r++)
    if (pids[r] > 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], NULL, 0);
    }
  assert_int_equal(failed, 0);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_means_p2),
      cmocka_unit_test(test_means_p4),
      cmocka_unit_test(test_means_p6),
      cmocka_unit_test(test_means_p8),
      cmocka_unit_test(test_conservation_barrier),
      cmocka_unit_test(test_conservation_wait_avoiding),
      cmocka_unit_test(test_sigkill_wait_avoiding),
      cmocka_unit_test(test_sigkill_barrier),
      cmocka_unit_test(test_sigstop_catches_up),
      cmocka_unit_test(test_epoch_changes),
  };
  if (argc > 1)
    cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
