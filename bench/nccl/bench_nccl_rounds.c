/* bench_nccl_rounds — what a round of the wait-avoiding group allreduce costs on the NCCL
 * transport: two ranks (processes) run wagma_comm_step back to back (no compute), for model
 * sizes from 4 KiB to 4 MiB, against a baseline in the same run. Built twice:
 *
 * bench_nccl_fake (every machine): the NCCL transport linked against tests/fake_nccl, against
 *   the TCP transport and against a bare fake ncclAllReduce of the same buffer between the same
 *   two ranks (the baselines). The fake moves bytes over loopback sockets like TCP does, so
 *   the difference is our control path: a round that is one group allreduce (the default)
 *   pays the activation, JOIN / GO / DONE / COMMIT, the hand-offs, the device copies (memcpy
 *   in the fake) and the mean and correction. Columns: tcp_us, nccl_us (per round, mean of
 *   the two ranks), bare_ar_us, nccl / tcp, nccl / bare, lane transfers, group allreduces.
 *
 * bench_nccl_multi_gpu (a CUDA build; scripts/gpu-check.sh): rank r on GPU r over real NCCL,
 *   against a bare ncclAllReduce of the same buffer among the same two GPUs (the baseline).
 *   A round of ours is what a GPU agent pays per step: the model's copy from the device, the
 *   step (activation, agreement, the payloads on the lane), the copy back. Columns:
 *   allreduce_us, step_us (the step alone), agent_us (with the two copies), agent / allreduce.
 *   Exits 77 (skipped) below 2 GPUs: NCCL refuses two ranks on one GPU.
 *
 * Both print the lane's transfers and the rounds run as one group allreduce (both 0 would
 * mean the payloads went on TCP).
 * Usage: bench_nccl_fake | bench_nccl_multi_gpu [rounds (default 300)] */
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
#ifndef WG_NCCL_FAKE
#include "gpu_count.h"
#endif

enum { RUN_BASELINE, RUN_STEP, RUN_BARE };

typedef struct shared {
  int ports[2];
  double per_round_us[2];
  double with_copies_us[2]; /* bench_nccl_multi_gpu: the step with the device copies */
  int errors[2];
  uint64_t lane_transfers[2];
  uint64_t collectives[2]; /* rounds run as one group allreduce (nccl_groups.c) */
  volatile int id_ready;
  ncclUniqueId id; /* the bare allreduce's communicator, from rank 0 */
} shared_t;

/* Counts and reports a failure; 0 (a measurement that failed). */
static double fail(shared_t *sh, int rank, const char *what) {
  fprintf(stderr, "rank %d: %s\n", rank, what);
  sh->errors[rank]++;
  return 0;
}

/* A bare ncclAllReduce (sum, in place) of count floats on the device, each waited for, as a
 * blocking allreduce is used: bench_nccl_multi_gpu's baseline, and in bench_nccl_fake what a
 * round that is one group allreduce is compared with (the fake's device memory is host
 * memory and its allreduce moves the bytes over loopback sockets). */
static double allreduce_rounds(shared_t *sh, int rank, size_t count, int rounds) {
#ifndef WG_NCCL_FAKE
  if (cudaSetDevice(rank) != cudaSuccess)
    return fail(sh, rank, "cudaSetDevice");
#endif
  if (rank == 0) {
    if (ncclGetUniqueId(&sh->id) != ncclSuccess)
      return fail(sh, rank, "ncclGetUniqueId");
    __atomic_store_n(&sh->id_ready, 1, __ATOMIC_RELEASE);
  }
  for (double until = proc_now() + 30; !__atomic_load_n(&sh->id_ready, __ATOMIC_ACQUIRE);) {
    if (proc_now() > until)
      return fail(sh, rank, "no unique id from rank 0 within 30 s");
    proc_sleep(0.001);
  }
  ncclComm_t comm;
  float *dev = NULL, *zeros = calloc(count, sizeof(float));
  cudaStream_t stream;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER; /* blocking */
  if (!zeros || ncclCommInitRankConfig(&comm, 2, sh->id, rank, &config) != ncclSuccess) {
    free(zeros);
    return fail(sh, rank, "ncclCommInitRankConfig");
  }
  if (cudaMalloc((void **)&dev, count * sizeof(float)) != cudaSuccess ||
      cudaMemcpy(dev, zeros, count * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    ncclCommAbort(comm); /* the peer's next allreduce then fails instead of waiting */
    free(zeros);
    return fail(sh, rank, "device buffer");
  }
  free(zeros);
  int warm = rounds / 4;
  double t0 = 0;
  for (int k = 0; k < warm + rounds && !sh->errors[rank]; k++) {
    if (k == warm)
      t0 = proc_now();
    if (ncclAllReduce(dev, dev, count, ncclFloat, ncclSum, comm, stream) != ncclSuccess) {
      fail(sh, rank, "ncclAllReduce");
      break;
    }
    cudaError_t q;
    double until = proc_now() + 30;
    while ((q = cudaStreamQuery(stream)) == cudaErrorNotReady && proc_now() < until)
      ;
    if (q != cudaSuccess)
      fail(sh, rank, "ncclAllReduce did not complete within 30 s");
  }
  double us = (proc_now() - t0) / rounds * 1e6;
#ifdef WG_NCCL_FAKE
  ncclCommAbort(comm);
#else
  if (sh->errors[rank])
    ncclCommAbort(comm);
  else
    ncclCommDestroy(comm);
#endif
  cudaStreamDestroy(stream);
  cudaFree(dev);
  return us;
}

static void log_stderr(void *user, int level, const char *msg) {
  (void)user;
  if (level >= WAGMA_LOG_WARN)
    fprintf(stderr, "%s\n", msg);
}

/* wagma_comm_step rounds over the NCCL transport (or, for bench_nccl_fake's baseline, TCP).
 * A run whose lane did not come up, or went down, fails: its rounds would be TCP's.
 * With a device model (bench_nccl_multi_gpu) also the rounds bracketed by its copies. */
static void step_rounds(shared_t *sh, int rank, int nccl, size_t count, int rounds) {
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
  o.log = log_stderr; /* why a lane did not come up, or went down */
  static const uint8_t secret[32] = "bench_nccl_rounds: epoch secret"; /* as agents have one */
  o.secret = secret;
  o.secret_len = sizeof secret;
  wagma_comm_t *comm = NULL;
#ifdef WG_NCCL_FAKE
  int rc =
      nccl ? wg_comm_create_with(&o, &wg_ncclfake_transport, &comm) : wagma_comm_create(&o, &comm);
#else
  o.transport = WAGMA_TRANSPORT_NCCL;
  o.device = rank;
  int rc = cudaSetDevice(rank) == cudaSuccess ? wagma_comm_create(&o, &comm) : -1;
#endif
  wagma_plan_free(&plan);
  if (rc != 0)
    exit(1);
  if (nccl) { /* wait for the lane, so every round uses it */
    nc_t *t = (nc_t *)comm->tp;
    for (double until = proc_now() + 10;
         atomic_load(&t->lane_state) == NC_LANE_INIT && proc_now() < until;)
      proc_sleep(0.002);
    if (atomic_load(&t->lane_state) != NC_LANE_UP)
      fail(sh, rank, "the nccl lane did not come up");
    proc_sleep(0.05);
  }
  float *model = calloc(count, sizeof(float));
  void *dev = NULL;
#ifndef WG_NCCL_FAKE
  float *host = NULL; /* the agent's page-locked mirror of the device model */
  if (cudaMalloc(&dev, count * sizeof(float)) != cudaSuccess ||
      cudaMemset(dev, 0, count * sizeof(float)) != cudaSuccess ||
      cudaHostAlloc((void **)&host, count * sizeof(float), cudaHostAllocDefault) != cudaSuccess)
    exit(1);
#endif
  /* the step alone; then, with a device model, the step between the copies as an agent runs
   * it (wg_job_params_to_host / _from_host) */
  for (int pass = 0; pass < (dev ? 2 : 1); pass++) {
    float *m = model;
    int warm = rounds / 4;
    double t0 = 0;
    for (int k = 0; k < warm + rounds; k++) {
      if (k == warm)
        t0 = proc_now();
#ifndef WG_NCCL_FAKE
      if (pass == 1) {
        m = host;
        if (cudaMemcpy(host, dev, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
          fail(sh, rank, "copy from the device");
      }
#endif
      m[0] += 1.0f;
      if (wagma_comm_step(comm, m, NULL) != 0)
        fail(sh, rank, "wagma_comm_step");
#ifndef WG_NCCL_FAKE
      if (pass == 1 &&
          cudaMemcpy(dev, host, count * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        fail(sh, rank, "copy to the device");
#endif
    }
    double us = (proc_now() - t0) / rounds * 1e6;
    if (pass == 0)
      sh->per_round_us[rank] = us;
    else
      sh->with_copies_us[rank] = us;
  }
  if (nccl) {
    nc_t *t = (nc_t *)comm->tp;
    sh->lane_transfers[rank] = atomic_load(&t->lane_transfers);
    sh->collectives[rank] = atomic_load(&t->collectives);
    if (atomic_load(&t->lane_failures) != 0)
      fail(sh, rank, "the nccl lane went down: rounds moved on TCP");
  }
  proc_sleep(0.2); /* the peer's last round */
  wagma_comm_destroy(comm);
  WG_NCCL(forget)();
  free(model);
#ifndef WG_NCCL_FAKE
  cudaFree(dev);
  cudaFreeHost(host);
#endif
}

static void rank_main(shared_t *sh, int rank, int what, size_t count, int rounds) {
#ifdef WG_NCCL_FAKE
  if (what == RUN_BARE)
    sh->per_round_us[rank] = allreduce_rounds(sh, rank, count, rounds);
  else
    step_rounds(sh, rank, what == RUN_STEP, count, rounds); /* the baseline: over TCP */
#else
  if (what == RUN_BASELINE)
    sh->per_round_us[rank] = allreduce_rounds(sh, rank, count, rounds);
  else
    step_rounds(sh, rank, 1, count, rounds);
#endif
  exit(sh->errors[rank] ? 1 : 0);
}

/* One measurement: two ranks, forked (this process holds no CUDA context). */
static int run(int what, size_t count, int rounds, double *us, double *with_copies_us,
               uint64_t *transfers, uint64_t *collectives) {
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
      rank_main(sh, r, what, count, rounds);
    ok = pid[r] > 0;
  }
  for (int r = 0; r < 2; r++)
    if (pid[r] > 0 && proc_wait(pid[r], 120) != 0) {
      proc_stop(pid[r], SIGKILL, 0);
      ok = 0;
    }
  *us = (sh->per_round_us[0] + sh->per_round_us[1]) / 2;
  *with_copies_us = (sh->with_copies_us[0] + sh->with_copies_us[1]) / 2;
  *transfers = sh->lane_transfers[0] + sh->lane_transfers[1];
  *collectives = sh->collectives[0] + sh->collectives[1];
  munmap(sh, sizeof *sh);
  return ok ? 0 : -1;
}

int main(int argc, char **argv) {
#ifdef WG_NCCL_FAKE
  const char *name = "bench_nccl_fake";
  /* the fake's launch delay models NCCL's background launch for the tests; here it would be
   * counted as our control path's cost */
  setenv("FAKE_NCCL_LAUNCH_US", "0", 0);
#else
  const char *name = "bench_nccl_multi_gpu";
  if (gpu_count_for_ranks(name) < 0)
    return 77;
#endif
  int rounds = argc > 1 ? atoi(argv[1]) : 300;
  const size_t sizes[] = {1024, 16384, 262144, 1048576}; /* floats: 4 KiB .. 4 MiB */
  printf("# %s: two ranks, %d rounds back to back after %d warm-up, microseconds per round\n", name,
         rounds, rounds / 4);
#ifdef WG_NCCL_FAKE
  printf("%10s %13s %14s %12s %9s %10s %10s %11s\n", "bytes", "tcp_us/round", "nccl_us/round",
         "bare_ar_us", "nccl/tcp", "nccl/bare", "lane_xfers", "group_ars");
#else
  printf("%10s %13s %9s %10s %16s %10s %11s\n", "bytes", "allreduce_us", "step_us", "agent_us",
         "agent/allreduce", "lane_xfers", "group_ars");
#endif
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    double base = 0, step = 0, agent = 0, bare = 0, unused = 0;
    uint64_t xfers = 0, colls = 0, none = 0;
    int failed = run(RUN_BASELINE, sizes[i], rounds, &base, &unused, &none, &none) != 0 ||
                 run(RUN_STEP, sizes[i], rounds, &step, &agent, &xfers, &colls) != 0;
#ifdef WG_NCCL_FAKE
    failed = failed || run(RUN_BARE, sizes[i], rounds, &bare, &unused, &none, &none) != 0;
#endif
    if (failed) {
      fprintf(stderr, "%s: a run failed at %zu floats\n", name, sizes[i]);
      return 1;
    }
#ifdef WG_NCCL_FAKE
    printf("%10zu %13.1f %14.1f %12.1f %9.2f %10.2f %10llu %11llu\n", sizes[i] * sizeof(float),
           base, step, bare, step / base, step / bare, (unsigned long long)xfers,
           (unsigned long long)colls);
#else
    (void)bare;
    printf("%10zu %13.1f %9.1f %10.1f %16.1f %10llu %11llu\n", sizes[i] * sizeof(float), base, step,
           agent, agent / base, (unsigned long long)xfers, (unsigned long long)colls);
#endif
  }
  return 0;
}
