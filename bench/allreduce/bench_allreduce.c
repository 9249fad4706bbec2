/* bench_allreduce.c — wg_coll_allreduce over the TCP transport on loopback, and the engine's
 * group round at the same sizes.
 *
 * Forks P processes (one per rank, free 127.0.0.1 ports), and for each size from --min to
 * --max (x4), after a warm-up of a quarter of the iterations, measures:
 *   - the allreduce (MEAN) over all P ranks: bus bandwidth, and the CPU time the process
 *     (all its threads: caller, progress thread) burns per operation (getrusage);
 *   - with --group 1: the P ranks split into P/S groups of S that allreduce at the same time;
 *   - with --engine 1: the wait-avoiding engine's round (wagma_comm_step on a model of that
 *     size, plan groups of S, no global round): wall time and CPU time per round.
 * busbw = bytes / time * 2(n-1)/n with n the ranks in one allreduce (nccl-tests convention).
 * With --lat N, N allreduces of --lat-bytes (default 4096) are timed one by one, on every rank.
 *
 * Output, one line per size:
 *   size_bytes busbw_all_GBs cpu_us_per_op group_busbw_GBs engine_us_per_round
 *   engine_cpu_us_per_round
 * (a column not measured is "-": --coll 0 skips the allreduce; CPU is the mean over the
 * ranks), then with --lat:
 *   lat bytes p50_us p99_us cpu_us_per_op
 * (percentiles over every rank's samples).
 *
 * usage: bench_allreduce [-P 4] [-S 2] [--min 4096] [--max 67108864] [--seconds 0.5]
 *        [--alg auto|doubling|rabenseifner|ring] [--coll 0|1] [--group 0|1] [--engine 0|1]
 *        [--lat N]
 *        [--lat-bytes B] [--seal 0|1]
 * --seal 1: every frame encrypted and authenticated (wagma_comm_options_t.encrypt; the
 * transport with a secret), to measure what data-plane encryption costs against --seal 0.
 * Builds against older trees of coll.h too (without --alg), so a "before" build can run the
 * same program (docs/benchmarks.md). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll.h"
#include "wagma/collective.h"

#define MAX_P 64
#define MAX_SIZES 32
#define MAX_LAT 5000

typedef struct results {
  double all_s[MAX_SIZES][MAX_P], all_cpu[MAX_SIZES][MAX_P];
  double group_s[MAX_SIZES][MAX_P];
  double eng_s[MAX_SIZES][MAX_P], eng_cpu[MAX_SIZES][MAX_P];
  double lat[MAX_P][MAX_LAT], lat_cpu[MAX_P];
  int failed;
} results_t;

static int P = 4, S = 2, group = 0, engine = 0, nlat = 0, coll = 1;
static int seal = 0; /* --seal 1: encrypted frames (where the tree has them) */
static const uint8_t bench_secret[32] = "wagma-bench-secret-32-bytes-long";
static int alg __attribute__((unused)) = 0; /* --alg, where coll.h has WG_COLL_ALGORITHMS */
static size_t min_bytes = 4096, max_bytes = 64u << 20, lat_bytes = 4096;
static double seconds = 0.5;
static wagma_plan_t plan;
static int ports[2 * MAX_P];

static void bench_log(void *user, int level, const char *msg) {
  (void)user;
  if (level >= WAGMA_LOG_WARN && !strstr(msg, "unauthenticated"))
    fprintf(stderr, "%s: %s\n", wagma_log_level_name(level), msg);
}

static double cpu_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

static int barrier_op(wg_coll_ctx_t *barrier) {
  float token = 0;
  int rc = wg_coll_allreduce(barrier, &token, 1, WAGMA_REDUCE_SUM, wg_now() + 120);
  barrier->seq += 1u << 20;
  return rc;
}

/* Times iters allreduces of ctx between two barriers; returns seconds per op and the
 * process's CPU seconds per op. */
static double time_allreduce(wg_coll_ctx_t *ctx, wg_coll_ctx_t *barrier, float *buf, size_t count,
                             int iters, double *cpu, int *failed) {
  int rc = barrier_op(barrier);
  double t0 = wg_now(), c0 = cpu_now();
  for (int i = 0; i < iters && rc == 0; i++) {
    rc = wg_coll_allreduce(ctx, buf, count, WAGMA_REDUCE_MEAN, wg_now() + 120);
    ctx->seq += 1u << 20;
  }
  double c1 = cpu_now();
  if (rc == 0)
    rc = barrier_op(barrier);
  double dt = (wg_now() - t0) / iters;
  *cpu = (c1 - c0) / iters;
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

static int warmups(int iters) {
  return iters / 4 > 1 ? iters / 4 : 1;
}

/* The engine's round at count floats: a communicator per size (ports P..2P-1), warm-up, then
 * iters steps between two blocking allreduces. */
static int time_engine(int rank, size_t count, int iters, double *dt, double *cpu) {
  wagma_plan_t ep;
  if (wagma_plan_build(P, S, NULL, &ep) != 0)
    return -1;
  ep.epoch = 2;
  ep.staleness_bound = 1 << 30; /* no global round inside the measurement */
  for (int i = 0; i < P; i++) {
    snprintf(ep.members[i].name, WAGMA_NAME_MAX, "e%d", i);
    snprintf(ep.members[i].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", ports[P + i]);
  }
  wagma_comm_options_t o;
  wagma_comm_options_init(&o);
  o.plan = &ep;
  o.rank = rank;
  o.count = count;
  o.connect_timeout_s = 30;
  o.global_timeout_s = 120;
  o.log = bench_log;
#ifdef WG_TRANSPORT_HAS_SEAL
  if (seal) {
    o.secret = bench_secret;
    o.secret_len = sizeof bench_secret;
    o.encrypt = 1;
  }
#endif
  wagma_comm_t *comm = NULL;
  int rc = wagma_comm_create(&o, &comm);
  wagma_plan_free(&ep);
  if (rc != 0)
    return rc;
  float *model = malloc(count * sizeof *model);
  for (size_t i = 0; i < count; i++)
    model[i] = 1.0f;
  float token = 0;
  for (int i = 0; i < warmups(iters) + 1 && rc == 0; i++) /* warm-up */
    rc = wagma_comm_step(comm, model, NULL);
  if (rc == 0)
    rc = wagma_comm_allreduce(comm, &token, 1, WAGMA_REDUCE_SUM);
  double t0 = wg_now(), c0 = cpu_now();
  for (int i = 0; i < iters && rc == 0; i++)
    rc = wagma_comm_step(comm, model, NULL);
  *dt = (wg_now() - t0) / iters;
  *cpu = (cpu_now() - c0) / iters;
  if (rc == 0)
    rc = wagma_comm_allreduce(comm, &token, 1, WAGMA_REDUCE_SUM);
  if (rc == 0 && model[0] != 1.0f)
    rc = -2;
  free(model);
  wagma_comm_destroy(comm);
  return rc;
}

static int run_rank(int rank, results_t *res) {
  wg_transport_t *t = NULL;
  wg_transport_config_t cfg = {.plan = &plan,
                               .rank = rank,
                               .epoch = 1,
                               .max_payload = 0,
                               .connect_timeout_s = 30,
                               .log = bench_log};
#ifdef WG_TRANSPORT_HAS_SEAL
  if (seal)
    cfg.auth =
        (wg_transport_auth_t){.secret = bench_secret, .secret_len = sizeof bench_secret, .seal = 1};
#endif
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
#ifdef WG_COLL_ALGORITHMS
  whole.algorithm = alg;
  grp.algorithm = alg;
#endif
  grp.round = 2;
  grp.group = (uint32_t)g;
  grp.ranks = mine;
  grp.nranks = gs;
  size_t top = max_bytes > lat_bytes ? max_bytes : lat_bytes;
  float *buf = aligned_alloc(64, (top + 63) & ~(size_t)63);
  int failed = 0, k = 0;
  double cpu;
  for (size_t bytes = min_bytes; coll && bytes <= max_bytes && k < MAX_SIZES; bytes *= 4, k++) {
    size_t count = bytes / sizeof(float);
    int iters = iterations(bytes);
    for (size_t i = 0; i < count; i++)
      buf[i] = 1.0f;
    /* Warm-up: a quarter of the iterations, so the sockets' buffers have grown (TCP
     * autotuning) and the buffer pool is filled, as in a long-running job. */
    time_allreduce(&whole, &barrier, buf, count, warmups(iters), &cpu, &failed);
    res->all_s[k][rank] = time_allreduce(&whole, &barrier, buf, count, iters, &cpu, &failed);
    res->all_cpu[k][rank] = cpu;
    if (group)
      res->group_s[k][rank] = time_allreduce(&grp, &barrier, buf, count, iters, &cpu, &failed);
  }
  if (nlat > 0) {
    size_t count = lat_bytes / sizeof(float);
    for (size_t i = 0; i < count; i++)
      buf[i] = 1.0f;
    time_allreduce(&whole, &barrier, buf, count, 10, &cpu, &failed); /* warm-up */
    int rc = barrier_op(&barrier);
    double c0 = cpu_now();
    for (int i = 0; i < nlat && rc == 0; i++) {
      double t0 = wg_now();
      rc = wg_coll_allreduce(&whole, buf, count, WAGMA_REDUCE_MEAN, wg_now() + 120);
      res->lat[rank][i] = wg_now() - t0;
      whole.seq += 1u << 20;
    }
    res->lat_cpu[rank] = (cpu_now() - c0) / nlat;
    if (rc == 0)
      rc = barrier_op(&barrier);
    if (rc != 0 || buf[0] != 1.0f)
      failed = 1;
  }
  free(buf);
  wg_tcp_transport.close(t);
  k = 0;
  for (size_t bytes = min_bytes; engine && bytes <= max_bytes && k < MAX_SIZES && !failed;
       bytes *= 4, k++) {
    int rc = time_engine(rank, bytes / sizeof(float), iterations(bytes), &res->eng_s[k][rank],
                         &res->eng_cpu[k][rank]);
    if (rc != 0) {
      fprintf(stderr, "rank %d: engine round at %zu bytes failed: %d\n", rank, bytes, rc);
      failed = 1;
    }
  }
  if (failed)
    res->failed = 1;
  return failed;
}

static double max_over(const double *v) {
  double m = 0;
  for (int r = 0; r < P; r++)
    if (v[r] > m)
      m = v[r];
  return m;
}

static double mean_over(const double *v) {
  double s = 0;
  for (int r = 0; r < P; r++)
    s += v[r];
  return s / P;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
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
    else if (!strcmp(argv[i], "--group"))
      group = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--coll"))
      coll = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--engine"))
      engine = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--lat"))
      nlat = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--lat-bytes"))
      lat_bytes = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--seal"))
      seal = atoi(argv[i + 1]);
#ifdef WG_COLL_ALGORITHMS
    else if (!strcmp(argv[i], "--alg"))
      alg = !strcmp(argv[i + 1], "doubling")       ? WG_COLL_DOUBLING
            : !strcmp(argv[i + 1], "rabenseifner") ? WG_COLL_RABENSEIFNER
            : !strcmp(argv[i + 1], "ring")         ? WG_COLL_RING
                                                   : WG_COLL_AUTO;
#endif
    else {
      fprintf(stderr,
              "usage: %s [-P 4] [-S 2] [--min B] [--max B] [--seconds s] [--alg A] [--coll 0|1] "
              "[--group 0|1] [--engine 0|1] [--lat N] [--lat-bytes B] [--seal 0|1]\n",
              argv[0]);
      return 2;
    }
  }
  if (P < 2 || P > MAX_P || S < 2 || S > P || min_bytes < 4 || max_bytes < min_bytes || nlat < 0 ||
      nlat > MAX_LAT || lat_bytes < 4) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  plan.nranks = P;
  plan.members = calloc((size_t)P, sizeof *plan.members);
  int fds[2 * MAX_P];
  for (int r = 0; r < 2 * P; r++) { /* free loopback ports, all held until all are chosen */
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    fds[r] = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(fds[r], (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fds[r], (struct sockaddr *)&a, &len) != 0)
      return 1;
    ports[r] = ntohs(a.sin_port);
  }
  for (int r = 0; r < 2 * P; r++)
    close(fds[r]);
  for (int r = 0; r < P; r++) {
    snprintf(plan.members[r].address, WAGMA_ADDRESS_MAX, "127.0.0.1:%d", ports[r]);
    snprintf(plan.members[r].name, WAGMA_NAME_MAX, "b%d", r);
  }
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
  int gs = S < P ? S : P;
  printf("# wagma tcp allreduce, P=%d, group S=%d; size_bytes busbw_all_GBs cpu_us_per_op "
         "group_busbw_GBs engine_us_per_round engine_cpu_us_per_round\n",
         P, S);
  int k = 0;
  for (size_t bytes = min_bytes; bytes <= max_bytes && k < MAX_SIZES; bytes *= 4, k++) {
    double t_all = max_over(res->all_s[k]);
    if (coll)
      printf("%zu %.3f %.1f", bytes, (double)bytes / t_all * 2.0 * (P - 1) / P / 1e9,
             mean_over(res->all_cpu[k]) * 1e6);
    else
      printf("%zu - -", bytes);
    if (group && coll)
      printf(" %.3f", (double)bytes / max_over(res->group_s[k]) * 2.0 * (gs - 1) / gs / 1e9);
    else
      printf(" -");
    if (engine)
      printf(" %.1f %.1f\n", mean_over(res->eng_s[k]) * 1e6, mean_over(res->eng_cpu[k]) * 1e6);
    else
      printf(" - -\n");
  }
  if (nlat > 0) {
    double *all = malloc((size_t)P * nlat * sizeof *all);
    for (int r = 0; r < P; r++)
      memcpy(all + (size_t)r * nlat, res->lat[r], (size_t)nlat * sizeof *all);
    qsort(all, (size_t)P * nlat, sizeof *all, cmp_double);
    size_t n = (size_t)P * nlat;
    printf("lat %zu %.1f %.1f %.1f\n", lat_bytes, all[n / 2] * 1e6, all[(n * 99) / 100] * 1e6,
           mean_over(res->lat_cpu) * 1e6);
    free(all);
  }
  free(plan.members);
  return 0;
}
