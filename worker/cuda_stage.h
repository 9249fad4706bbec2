/* worker/cuda_stage.h — the CUDA runtime as libwagma uses it for device buffers (cuda_stage.c):
 * page-locked host memory and copies on the caller's stream, nothing else. Loaded with dlopen
 * when a program registers device memory (wagma_worker_use_cuda), so libwagma itself needs no
 * CUDA to load or to serve host buffers. Private to libwagma. */
#ifndef WAGMA_WORKER_CUDA_STAGE_H
#define WAGMA_WORKER_CUDA_STAGE_H

#include <stddef.h>

typedef struct wg_cuda {
  void *dl;
  /* the runtime's functions (cudaError_t is an int enum; 0 = cudaSuccess) */
  int (*malloc_host)(void **p, size_t bytes);
  int (*free_host)(void *p);
  int (*memcpy_async)(void *dst, const void *src, size_t bytes, int kind, void *stream);
  int (*stream_synchronize)(void *stream);
  const char *(*error_string)(int e);
} wg_cuda_t;

/* Loads the runtime: $WAGMA_CUDART (a path) if set, else libcudart.so.13, .12, libcudart.so
 * (a process that already has one loaded, e.g. PyTorch's, gets that one). 0, or WAGMA_ENOSYS
 * with err saying what was tried. wg_cuda_unload is a no-op on a zeroed c. */
int wg_cuda_load(wg_cuda_t *c, char *err, size_t err_len);
void wg_cuda_unload(wg_cuda_t *c);

/* Copies n floats between the device buffer dev and the page-locked host buffer host on
 * stream: to_host waits for the copy (and so for everything queued on stream before it);
 * to the device it is queued and not waited for (the caller's next work on stream comes after
 * it). 0 or WAGMA_EIO with err naming the runtime's error. */
int wg_cuda_to_host(const wg_cuda_t *c, float *host, const float *dev, size_t n, void *stream,
                    char *err, size_t err_len);
int wg_cuda_to_device(const wg_cuda_t *c, float *dev, const float *host, size_t n, void *stream,
                      char *err, size_t err_len);

#endif
