/* bench_nccl_fake — what the NCCL transport's control path costs per round, without a GPU:
 * two ranks (processes on 127.0.0.1) run wagma_comm_step back to back (no compute), once over
 * the TCP transport (the baseline) and once over the NCCL transport linked against
 * tests/fake_nccl, for model sizes from 4 KiB to 4 MiB. The fake moves bytes over loopback
 * sockets like TCP does, so the difference is our path: the announcement, the clear-to-send /
 * GO agreement, the lane thread's hand-offs and the device copies (memcpy in the fake).
 * Prints microseconds per round (median of the two ranks' means) and NCCL / TCP.
 *
 * Usage: bench_nccl_fake [rounds (default 300)] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_internal.h"
#include "nccl_internal.h"
#include "process.h"

typedef struct shared {
  int ports[2];
  double per_round_us[2];
  int errors[2];
  uint64_t lane_transfers[2];
} shared_t;

static void rank_main(shared_t *sh, int rank, int nccl, size_t count, int rounds) {
  wagma_plan_t plan;
  if (wagma_plan_build(2, 2, NULL, &plan) != 0)
    exit(1);
  plan.epoch = 1;
  plan.staleness_bound = 64;
  for (int r = 0; r < 2; r++) {
    snprintf(plan.members[r].name, WAGMA_NAME_MAX, "r%d", r);
    snprintf(plan.members[r].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", sh->ports[r]);
  }
  wagma_comm_options_t o;
  wagma_comm_options_init(&o);
  o.plan = &plan;
  o.rank = rank;
  o.count = count;
  o.connect_timeout_s = 10;
  wagma_comm_t *comm = NULL;
  int rc =
      nccl ? wg_comm_create_with(&o, &wg_ncclfake_transport, &comm) : wagma_comm_create(&o, &comm);
  wagma_plan_free(&plan);
  if (rc != 0)
    exit(1);
  if (nccl) { /* wait for the lane, so every round uses it */
    nc_t *t = (nc_t *)comm->tp;
    for (double until = proc_now() + 10;
         atomic_load(&t->lane_state) == NC_LANE_INIT && proc_now() < until;)
      proc_sleep(0.002);
    proc_sleep(0.05);
  }
  float *model = calloc(count, sizeof(float));
  int warm = rounds / 4;
  double t0 = 0;
  for (int k = 0; k < warm + rounds; k++) {
    if (k == warm)
      t0 = proc_now();
    model[0] += 1.0f;
    if (wagma_comm_step(comm, model, NULL) != 0)
      sh->errors[rank]++;
  }
  sh->per_round_us[rank] = (proc_now() - t0) / rounds * 1e6;
  if (nccl)
    sh->lane_transfers[rank] = atomic_load(&((nc_t *)comm->tp)->lane_transfers);
  proc_sleep(0.2); /* the peer's last round */
  wagma_comm_destroy(comm);
  WG_NCCL(forget)();
  free(model);
  exit(sh->errors[rank] ? 1 : 0);
}

static int run(int nccl, size_t count, int rounds, double *us, uint64_t *transfers) {
  shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED)
    return -1;
  memset(sh, 0, sizeof *sh);
  int ok = proc_free_ports(2, sh->ports) == 0;
  pid_t pid[2] = {0, 0};
  fflush(NULL);
  for (int r = 0; r < 2 && ok; r++) {
    pid[r] = fork();
    if (pid[r] == 0)
      rank_main(sh, r, nccl, count, rounds);
    ok = pid[r] > 0;
  }
  for (int r = 0; r < 2; r++)
    if (pid[r] > 0 && proc_wait(pid[r], 120) != 0) {
      proc_stop(pid[r], SIGKILL, 0);
      ok = 0;
    }
  *us = (sh->per_round_us[0] + sh->per_round_us[1]) / 2;
  *transfers = sh->lane_transfers[0] + sh->lane_transfers[1];
  munmap(sh, sizeof *sh);
  return ok ? 0 : -1;
}

int main(int argc, char **argv) {
  /* the fake's launch delay models NCCL's background launch for the tests; here it would be
   * counted as our control path's cost */
  setenv("FAKE_NCCL_LAUNCH_US", "0", 0);
  int rounds = argc > 1 ? atoi(argv[1]) : 300;
  const size_t sizes[] = {1024, 16384, 262144, 1048576}; /* floats: 4 KiB .. 4 MiB */
  printf("# two ranks, wagma_comm_step back to back, %d rounds after %d warm-up\n", rounds,
         rounds / 4);
  printf("%10s %14s %14s %8s %10s\n", "bytes", "tcp_us/round", "nccl_us/round", "ratio",
         "lane_xfers");
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    double tcp = 0, nccl = 0;
    uint64_t xfers = 0, none = 0;
    if (run(0, sizes[i], rounds, &tcp, &none) != 0 ||
        run(1, sizes[i], rounds, &nccl, &xfers) != 0) {
      fprintf(stderr, "bench_nccl_fake: a run failed at %zu floats\n", sizes[i]);
      return 1;
    }
    printf("%10zu %14.1f %14.1f %8.2f %10llu\n", sizes[i] * sizeof(float), tcp, nccl, nccl / tcp,
           (unsigned long long)xfers);
  }
  return 0;
}
