/* bench_allreduce_mpi.c — the baseline: MPI_Allreduce (float, sum, in place) on the same sizes
 * and with the same timing method as bench_allreduce (warm-up of a quarter of the iterations,
 * barrier, iterations, barrier),
 * and the same CPU measure (getrusage of each process, mean over ranks).
 * Prints "size_bytes busbw_GBs cpu_us_per_op" per size, then with --lat N
 * "lat bytes p50_us p99_us cpu_us_per_op" (N allreduces timed one by one on every rank).
 * usage: mpirun -np P bench_allreduce_mpi [--min B] [--max B] [--seconds s] [--coll 0|1]
 * [--lat N] [--lat-bytes B]   (--coll 0: only the latency samples) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int iterations(size_t bytes, double seconds) {
  double it = seconds * 1e9 / (double)bytes;
  return it < 3 ? 3 : it > 1000 ? 1000 : (int)it;
}

static double cpu_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  size_t min_bytes = 4096, max_bytes = 64u << 20, lat_bytes = 4096;
  double seconds = 0.5;
  int nlat = 0, coll = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--min"))
      min_bytes = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--max"))
      max_bytes = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--seconds"))
      seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--coll"))
      coll = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--lat"))
      nlat = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--lat-bytes"))
      lat_bytes = strtoull(argv[i + 1], NULL, 0);
  }
  size_t top = max_bytes > lat_bytes ? max_bytes : lat_bytes;
  float *buf = malloc(top);
  if (rank == 0)
    printf("# MPI_Allreduce, P=%d; size_bytes busbw_GBs cpu_us_per_op\n", P);
  for (size_t bytes = min_bytes; coll && bytes <= max_bytes; bytes *= 4) {
    int count = (int)(bytes / sizeof(float)), iters = iterations(bytes, seconds);
    for (int i = 0; i < count; i++)
      buf[i] = 1.0f;
    for (int i = 0; i < (iters / 4 > 1 ? iters / 4 : 1); i++) /* warm-up, as bench_allreduce */
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime(), c0 = cpu_now();
    for (int i = 0; i < iters; i++)
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double cpu = (cpu_now() - c0) / iters, cpu_sum = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double dt = (MPI_Wtime() - t0) / iters;
    MPI_Reduce(&cpu, &cpu_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
      printf("%zu %.3f %.1f\n", bytes, (double)bytes / dt * 2.0 * (P - 1) / P / 1e9,
             cpu_sum / P * 1e6);
  }
  if (nlat > 0) {
    int count = (int)(lat_bytes / sizeof(float));
    double *lat = malloc((size_t)nlat * sizeof *lat), *all = NULL;
    for (int i = 0; i < 10; i++) /* warm-up */
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double c0 = cpu_now();
    for (int i = 0; i < nlat; i++) {
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      lat[i] = MPI_Wtime() - t0;
    }
    double cpu = (cpu_now() - c0) / nlat, cpu_sum = 0;
    MPI_Reduce(&cpu, &cpu_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
      all = malloc((size_t)P * nlat * sizeof *all);
    MPI_Gather(lat, nlat, MPI_DOUBLE, all, nlat, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      size_t n = (size_t)P * nlat;
      qsort(all, n, sizeof *all, cmp_double);
      printf("lat %zu %.1f %.1f %.1f\n", lat_bytes, all[n / 2] * 1e6, all[(n * 99) / 100] * 1e6,
             cpu_sum / P * 1e6);
    }
    free(all);
    free(lat);
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
