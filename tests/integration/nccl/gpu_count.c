/* gpu_count.c — see gpu_count.h. */
#include "gpu_count.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "process.h"

int gpu_count(void) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return 0;
  if (pid == 0) {
    int n = 0;
    _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? (n > 100 ? 100 : n) : 0);
  }
  int st = proc_wait(pid, 30);
  return st > 0 && WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

int gpu_count_for_ranks(const char *test) {
  int n = gpu_count();
  if (n >= 2)
    return n;
  printf("SKIP: %s needs 2 or more CUDA GPUs (one NCCL rank per GPU); %d here\n", test, n);
  return -1;
}
