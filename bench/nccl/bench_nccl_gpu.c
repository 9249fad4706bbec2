/* bench_nccl_gpu — what one payload costs on the NCCL transport's data path, on one GPU, against
 * a bare ncclAllReduce of the same buffer on the same communicator (the baseline).
 *
 * One GPU runs single-rank NCCL only (two ranks on one GPU are refused), so the round among
 * peers cannot run here; this measures, per size, the pieces our lane adds to each transfer
 * (collective/nccl_lane.c, docs/design.md §6.4), in the lane's order:
 *   allreduce  bare ncclAllReduce in place on a device buffer, then cudaStreamSynchronize;
 *   sendrecv   ncclSend + ncclRecv to myself in one group (the lane's NCCL operation; a real
 *              transfer posts each half on its own rank), then cudaStreamSynchronize;
 *   malloc     the lane's data path for one payload as it was first written: cudaMalloc of
 *              the device buffer, cudaMemcpy host -> device from the collective's (pageable)
 *              host buffer, the send/recv group, completion polled as the lane polls it
 *              (ncclCommGetAsyncError + cudaStreamQuery), cudaMemcpy device -> host, cudaFree;
 *   lane       the same with the lane's device buffer allocated once (as nccl_lane.c does now);
 *   bounce     the lane's path staged through one page-locked buffer: memcpy from the
 *              collective's host buffer into it, async copy to the device, the group, async
 *              copy back, memcpy out;
 *   pinned     the same with the collective's buffers themselves page-locked (no memcpy): the
 *              bound for a lane that staged through pinned memory or a device snapshot.
 * Prints the median microseconds of each over the repetitions, malloc / lane (what the kept
 * buffer saves), lane / bounce (what staging through page-locked memory would save) and
 * lane / allreduce.
 *
 * Usage: bench_nccl_gpu [repetitions per size (default 200)]
 * Exits 77 (skipped) without a usable GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

#define CK_CUDA(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "bench_nccl_gpu: %s: %s\n", #call, cudaGetErrorString(e_));                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)
#define CK_NCCL(call)                                                                              \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess && r_ != ncclInProgress) {                                               \
      fprintf(stderr, "bench_nccl_gpu: %s: %s\n", #call, ncclGetErrorString(r_));                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static void self_pair(ncclComm_t comm, cudaStream_t s, const void *src, void *dst, size_t len) {
  CK_NCCL(ncclGroupStart());
  CK_NCCL(ncclSend(src, len, ncclUint8, 0, comm, s));
  CK_NCCL(ncclRecv(dst, len, ncclUint8, 0, comm, s));
  CK_NCCL(ncclGroupEnd());
}

/* Completion as the lane's check_posted sees it (its pump waits between checks). */
static void poll_done(ncclComm_t comm, cudaStream_t s) {
  for (;;) {
    ncclResult_t e = ncclSuccess;
    CK_NCCL(ncclCommGetAsyncError(comm, &e));
    if (e != ncclSuccess && e != ncclInProgress) {
      fprintf(stderr, "bench_nccl_gpu: async error: %s\n", ncclGetErrorString(e));
      exit(1);
    }
    if (e == ncclSuccess) {
      cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess)
        return;
      if (q != cudaErrorNotReady)
        CK_CUDA(q);
    }
  }
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 200;
  int ndev = 0, version = 0;
  if (reps < 5)
    reps = 5;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("SKIP: bench_nccl_gpu needs a CUDA GPU\n");
    return 77;
  }
  CK_CUDA(cudaSetDevice(0));
  struct cudaDeviceProp prop;
  CK_CUDA(cudaGetDeviceProperties(&prop, 0));
  ncclGetVersion(&version);
  ncclUniqueId id;
  ncclComm_t comm;
  cudaStream_t s;
  CK_NCCL(ncclGetUniqueId(&id));
  CK_NCCL(ncclCommInitRank(&comm, 1, id, 0));
  CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  printf("bench_nccl_gpu: %s, NCCL %d, one rank, median of %d repetitions, microseconds\n",
         prop.name, version, reps);
  printf("%10s %10s %9s %9s %9s %9s %9s %12s %12s %14s\n", "bytes", "allreduce", "sendrecv",
         "malloc", "lane", "bounce", "pinned", "malloc/lane", "lane/bounce", "lane/allreduce");

  const size_t max = (size_t)64 << 20;
  void *d_a, *d_b, *h_pin_a, *h_pin_b;
  CK_CUDA(cudaMalloc(&d_a, max));
  CK_CUDA(cudaMalloc(&d_b, max));
  CK_CUDA(cudaMallocHost(&h_pin_a, max));
  CK_CUDA(cudaMallocHost(&h_pin_b, max));
  unsigned char *h_a = malloc(max), *h_b = malloc(max);
  double *t = malloc((size_t)reps * sizeof *t);
  if (!h_a || !h_b || !t)
    return 1;
  memset(h_a, 1, max);
  memset(h_pin_a, 1, max);
  CK_CUDA(cudaMemset(d_a, 0, max));

  for (size_t len = 4096; len <= max; len *= 4) {
    double med[6];
    for (int kind = 0; kind < 6; kind++) {
      for (int r = -3; r < reps; r++) { /* 3 warm-up repetitions */
        double t0 = now_us();
        if (kind == 0) {
          CK_NCCL(ncclAllReduce(d_a, d_a, len / sizeof(float), ncclFloat32, ncclSum, comm, s));
          CK_CUDA(cudaStreamSynchronize(s));
        } else if (kind == 1) {
          self_pair(comm, s, d_a, d_b, len);
          CK_CUDA(cudaStreamSynchronize(s));
        } else if (kind == 2) {
          void *src = NULL, *dst = NULL;
          CK_CUDA(cudaMalloc(&src, len));
          CK_CUDA(cudaMemcpy(src, h_a, len, cudaMemcpyHostToDevice));
          CK_CUDA(cudaMalloc(&dst, len));
          self_pair(comm, s, src, dst, len);
          poll_done(comm, s);
          CK_CUDA(cudaMemcpy(h_b, dst, len, cudaMemcpyDeviceToHost));
          CK_CUDA(cudaFree(src));
          CK_CUDA(cudaFree(dst));
        } else if (kind == 3) {
          CK_CUDA(cudaMemcpy(d_a, h_a, len, cudaMemcpyHostToDevice));
          self_pair(comm, s, d_a, d_b, len);
          poll_done(comm, s);
          CK_CUDA(cudaMemcpy(h_b, d_b, len, cudaMemcpyDeviceToHost));
        } else if (kind == 4) {
          memcpy(h_pin_a, h_a, len);
          CK_CUDA(cudaMemcpyAsync(d_a, h_pin_a, len, cudaMemcpyHostToDevice, s));
          self_pair(comm, s, d_a, d_b, len);
          CK_CUDA(cudaMemcpyAsync(h_pin_b, d_b, len, cudaMemcpyDeviceToHost, s));
          poll_done(comm, s);
          memcpy(h_b, h_pin_b, len);
        } else {
          CK_CUDA(cudaMemcpyAsync(d_a, h_pin_a, len, cudaMemcpyHostToDevice, s));
          self_pair(comm, s, d_a, d_b, len);
          CK_CUDA(cudaMemcpyAsync(h_pin_b, d_b, len, cudaMemcpyDeviceToHost, s));
          poll_done(comm, s);
        }
        if (r >= 0)
          t[r] = now_us() - t0;
      }
      med[kind] = median(t, reps);
    }
    printf("%10zu %10.1f %9.1f %9.1f %9.1f %9.1f %9.1f %12.2f %12.2f %14.2f\n", len, med[0], med[1],
           med[2], med[3], med[4], med[5], med[2] / med[3], med[3] / med[4], med[3] / med[0]);
    fflush(stdout);
  }
  ncclCommDestroy(comm);
  cudaStreamDestroy(s);
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFreeHost(h_pin_a);
  cudaFreeHost(h_pin_b);
  free(h_a);
  free(h_b);
  free(t);
  return 0;
}
