/* cuda_runtime_api.h (fake) — the subset of the CUDA runtime API the NCCL transport
 * (collective/nccl*.c) calls, for its test build against tests/fake_nccl. Device memory is
 * host memory; a stream is a counter of NCCL groups not yet completed on it, and a queue of
 * the copies posted behind them.
 *
 * Every name is mapped to a fakecuda_ symbol, so a process can hold the fake and the real
 * CUDA runtime side by side (the tests link the product library too). Values of the enums
 * are the real API's. */
#ifndef WAGMA_FAKE_CUDA_RUNTIME_API_H
#define WAGMA_FAKE_CUDA_RUNTIME_API_H

#include <pthread.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
  cudaErrorNotSupported = 801,
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};

#define cudaStreamNonBlocking 0x01
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01

typedef struct fakecuda_stream *cudaStream_t;

#define cudaGetDeviceCount fakecuda_cudaGetDeviceCount
#define cudaSetDevice fakecuda_cudaSetDevice
#define cudaGetDevice fakecuda_cudaGetDevice
#define cudaStreamCreateWithFlags fakecuda_cudaStreamCreateWithFlags
#define cudaStreamCreateWithPriority fakecuda_cudaStreamCreateWithPriority
#define cudaDeviceGetStreamPriorityRange fakecuda_cudaDeviceGetStreamPriorityRange
#define cudaStreamDestroy fakecuda_cudaStreamDestroy
#define cudaStreamQuery fakecuda_cudaStreamQuery
#define cudaMalloc fakecuda_cudaMalloc
#define cudaFree fakecuda_cudaFree
#define cudaMallocAsync fakecuda_cudaMallocAsync
#define cudaFreeAsync fakecuda_cudaFreeAsync
#define cudaGetLastError fakecuda_cudaGetLastError
#define cudaMemcpy fakecuda_cudaMemcpy
#define cudaMemcpyAsync fakecuda_cudaMemcpyAsync
#define cudaHostAlloc fakecuda_cudaHostAlloc
#define cudaFreeHost fakecuda_cudaFreeHost
#define cudaGetErrorString fakecuda_cudaGetErrorString

/* FAKE_NCCL_DEVICES (default 1) devices. */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
/* The calling thread's current device: the last cudaSetDevice of the thread, else 0. */
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
/* Priorities are accepted and ignored (the range is 0 to -5, CUDA's on recent GPUs). */
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
/* cudaErrorNotReady while an NCCL group or a copy queued on the stream has not completed.
 * Runs the queued copies whose groups ahead of them completed (or were dropped). */
cudaError_t cudaStreamQuery(cudaStream_t stream);
/* The calls that wait for the whole device (cudaMalloc, cudaFree, cudaHostAlloc,
 * cudaFreeHost: CUDA's implicit synchronization) first sleep FAKE_CUDA_SYNC_MS milliseconds
 * (default 0), as if another stream, the application's compute, had that much work queued;
 * fakecuda_device_waits counts them. The stream-ordered pair never waits. */
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
/* Stream-ordered: the allocation is usable by what is queued on stream after it; the free
 * happens once what was queued before it completed. FAKE_CUDA_NO_MEMORY_POOLS=1: both fail
 * with cudaErrorNotSupported, as on a device without memory pools. */
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
/* The last error of a call on this thread, reset to cudaSuccess. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
/* Ordered on the stream: done at once when nothing is pending on it, else queued behind the
 * groups posted so far (cudaStreamQuery runs it). Into pageable memory it waits, as the real
 * call does, until what is before it on the stream completed (fake: for 10 s at most, then
 * cudaErrorNotReady). A copy whose host side is not page-locked
 * (from cudaHostAlloc) is counted (fakecuda_pageable_copies): the real call then stages. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);

/* Fake only: asynchronous copies made so far whose host side was not page-locked memory, and
 * those whose host side was. */
long fakecuda_pageable_copies(void);
long fakecuda_locked_copies(void);
/* Fake only: calls made so far that waited for the whole device (see cudaMalloc above), in
 * all and by one thread of this process (the first 64 threads that made one are told apart). */
long fakecuda_device_waits(void);
long fakecuda_device_waits_by(pthread_t thread);
const char *cudaGetErrorString(cudaError_t error);

#ifdef __cplusplus
}
#endif
#endif
