/* nccl_test_rank.c — see nccl_test_rank.h. */
#include "nccl_test_rank.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "process.h"

int nt_rank_setup(int P, int me, const int *ports, wagma_plan_t *plan, wg_transport_config_t *cfg) {
  if (wagma_plan_build(P, 2, NULL, plan) != 0)
    return -1;
  plan->epoch = 1;
  for (int r = 0; r < P; r++) {
    snprintf(plan->members[r].name, WAGMA_NAME_MAX, "r%d", r);
    snprintf(plan->members[r].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", ports[r]);
  }
  memset(cfg, 0, sizeof *cfg);
  cfg->plan = plan;
  cfg->rank = me;
  cfg->epoch = 1;
  cfg->max_payload = 1 << 20;
  cfg->max_queued_bytes = 64 << 20;
  cfg->connect_timeout_s = 15;
  return 0;
}

int nt_wait_ranks(const pid_t *pid, int n, int killed) {
  int ok = 1;
  for (int r = 0; r < n; r++) {
    if (r == killed) {
      proc_stop(pid[r], SIGKILL, 0); /* reaped */
      continue;
    }
    int st = proc_wait(pid[r], 60);
    if (st != 0) {
      fprintf(stderr, "rank %d: exit %d\n", r, st);
      proc_stop(pid[r], SIGKILL, 0);
      ok = 0;
    }
  }
  return ok;
}
