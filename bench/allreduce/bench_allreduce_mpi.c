/* bench_allreduce_mpi.c — the baseline: MPI_Allreduce (float, sum, in place) on the same sizes
 * and with the same timing method as bench_allreduce (warm-up, barrier, iterations, barrier).
 * Prints "size_bytes busbw_GBs" per size. usage: mpirun -np P bench_allreduce_mpi [--min B]
 * [--max B] [--seconds s] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int iterations(size_t bytes, double seconds) {
  double it = seconds * 1e9 / (double)bytes;
  return it < 3 ? 3 : it > 1000 ? 1000 : (int)it;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  size_t min_bytes = 4096, max_bytes = 64u << 20;
  double seconds = 0.5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--min"))
      min_bytes = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--max"))
      max_bytes = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--seconds"))
      seconds = atof(argv[i + 1]);
  }
  float *buf = malloc(max_bytes);
  if (rank == 0)
    printf("# MPI_Allreduce, P=%d; size_bytes busbw_GBs\n", P);
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    int count = (int)(bytes / sizeof(float)), iters = iterations(bytes, seconds);
    for (int i = 0; i < count; i++)
      buf[i] = 1.0f;
    MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double dt = (MPI_Wtime() - t0) / iters;
    if (rank == 0)
      printf("%zu %.3f\n", bytes, (double)bytes / dt * 2.0 * (P - 1) / P / 1e9);
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
