/* bench_allreduce.c — bus bandwidth of wg_coll_allreduce over the TCP transport on loopback.
 *
 * Forks P processes (one per rank, free 127.0.0.1 ports), and for each size from --min to
 * --max (x4) measures:
 *   - the allreduce over all P ranks;
 *   - a group round: the P ranks split into P/S groups of S that reduce at the same time.
 * busbw = bytes / time * 2(n-1)/n with n the ranks in one allreduce (nccl-tests convention).
 * Prints one line per size: "size_bytes busbw_all_GBs busbw_group_GBs" (GB = 1e9 bytes).
 *
 * usage: bench_allreduce [-P 4] [-S 2] [--min 4096] [--max 67108864] [--seconds 0.5] */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll.h"

#define MAX_P 64
#define MAX_SIZES 32

typedef struct results {
  double all[MAX_SIZES];
  double group[MAX_SIZES];
  int failed;
} results_t;

static int P = 4, S = 2;
static size_t min_bytes = 4096, max_bytes = 64u << 20;
static double seconds = 0.5;
static wagma_plan_t plan;

static void bench_log(void *user, int level, const char *msg) {
  (void)user;
  if (level >= WAGMA_LOG_WARN)
    fprintf(stderr, "%s: %s\n", wagma_log_level_name(level), msg);
}

/* Times iters allreduces of ctx; returns seconds per op (max over the participants is what
 * the closing barrier-allreduce enforces: everyone leaves together). */
static double time_allreduce(wg_coll_ctx_t *ctx, wg_coll_ctx_t *barrier, float *buf, size_t count,
                             int iters, int *failed) {
  float token = 0;
  int rc = wg_coll_allreduce(barrier, &token, 1, WAGMA_REDUCE_SUM, wg_now() + 120);
  barrier->seq += 1u << 20;
  double t0 = wg_now();
  for (int i = 0; i < iters && rc == 0; i++) {
    rc = wg_coll_allreduce(ctx, buf, count, WAGMA_REDUCE_MEAN, wg_now() + 120);
    ctx->seq += 1u << 20;
  }
  if (rc == 0)
    rc = wg_coll_allreduce(barrier, &token, 1, WAGMA_REDUCE_SUM, wg_now() + 120);
  barrier->seq += 1u << 20;
  double dt = (wg_now() - t0) / iters;
  if (rc != 0 || buf[0] != 1.0f || buf[count - 1] != 1.0f) {
    fprintf(stderr, "rank %d: allreduce failed: %s\n", ctx->rank, wagma_strerror(rc));
    *failed = 1;
  }
  return dt;
}

static int iterations(size_t bytes) {
  /* Aim for about `seconds` at ~1 GB/s, at least 3 and at most 1000. */
  double it = seconds * 1e9 / (double)bytes;
  return it < 3 ? 3 : it > 1000 ? 1000 : (int)it;
}

static int run_rank(int rank, results_t *res) {
  wg_transport_t *t = NULL;
  wg_transport_config_t cfg = {.plan = &plan,
                               .rank = rank,
                               .epoch = 1,
                               .max_payload = 0,
                               .connect_timeout_s = 30,
                               .log = bench_log};
  if (wg_tcp_transport.open(&cfg, &t) != 0)
    return 2;
  int all[MAX_P], mine[MAX_P];
  for (int r = 0; r < P; r++)
    all[r] = r;
  int g = rank / S, gs = 0;
  for (int r = g * S; r < (g + 1) * S && r < P; r++)
    mine[gs++] = r;
  wg_coll_ctx_t barrier = {.ops = &wg_tcp_transport,
                           .transport = t,
                           .rank = rank,
                           .ranks = all,
                           .nranks = P,
                           .round = 1,
                           .group = 1000000};
  wg_coll_ctx_t whole = barrier, grp = barrier;
  whole.group = 0;
  grp.round = 2;
  grp.group = (uint32_t)g;
  grp.ranks = mine;
  grp.nranks = gs;
  float *buf = aligned_alloc(64, max_bytes);
  int failed = 0, k = 0;
  for (size_t bytes = min_bytes; bytes <= max_bytes && k < MAX_SIZES; bytes *= 4, k++) {
    size_t count = bytes / sizeof(float);
    int iters = iterations(bytes);
    for (size_t i = 0; i < count; i++)
      buf[i] = 1.0f;
    time_allreduce(&whole, &barrier, buf, count, 1, &failed); /* warm-up */
    double dt = time_allreduce(&whole, &barrier, buf, count, iters, &failed);
    if (rank == 0)
      res->all[k] = (double)bytes / dt * 2.0 * (P - 1) / P / 1e9;
    dt = time_allreduce(&grp, &barrier, buf, count, iters, &failed);
    if (rank == 0)
      res->group[k] = (double)bytes / dt * 2.0 * (gs - 1) / gs / 1e9;
  }
  free(buf);
  wg_tcp_transport.close(t);
  if (failed)
    res->failed = 1;
  return failed;
}

int main(int argc, char **argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-P"))
      P = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-S"))
      S = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--min"))
      min_bytes = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--max"))
      max_bytes = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--seconds"))
      seconds = atof(argv[i + 1]);
    else {
      fprintf(stderr, "usage: %s [-P 4] [-S 2] [--min B] [--max B] [--seconds s]\n", argv[0]);
      return 2;
    }
  }
  if (P < 2 || P > MAX_P || S < 2 || S > P || min_bytes < 4 || max_bytes < min_bytes) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  plan.nranks = P;
  plan.members = calloc((size_t)P, sizeof *plan.members);
  int fds[MAX_P];
  for (int r = 0; r < P; r++) { /* free loopback ports, all held until all are chosen */
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    fds[r] = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(fds[r], (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fds[r], (struct sockaddr *)&a, &len) != 0)
      return 1;
    snprintf(plan.members[r].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%u", ntohs(a.sin_port));
    snprintf(plan.members[r].name, WAGMA_NAME_MAX, "b%d", r);
  }
  for (int r = 0; r < P; r++)
    close(fds[r]);
  results_t *res =
      mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(res, 0, sizeof *res);
  pid_t pids[MAX_P];
  fflush(NULL);
  for (int r = 0; r < P; r++) {
    pids[r] = fork();
    if (pids[r] == 0)
      _exit(run_rank(r, res));
  }
  int bad = 0;
  for (int r = 0; r < P; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  if (bad || res->failed) {
    fprintf(stderr, "a rank failed\n");
    return 1;
  }
  printf("# wagma tcp allreduce, P=%d, group S=%d; size_bytes busbw_all_GBs busbw_group_GBs\n", P,
         S);
  int k = 0;
  for (size_t bytes = min_bytes; bytes <= max_bytes && k < MAX_SIZES; bytes *= 4, k++)
    printf("%zu %.3f %.3f\n", bytes, res->all[k], res->group[k]);
  free(plan.members);
  return 0;
}
