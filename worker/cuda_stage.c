/* worker/cuda_stage.c — the CUDA runtime for libwagma's device buffers (cuda_stage.h): loaded
 * with dlopen, used for page-locked host memory and copies on the caller's stream only.
 * No threads of its own; the training thread makes every call. */
#include "cuda_stage.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wagma/status.h"

/* cudaMemcpyKind (CUDA runtime API, driver_types.h) */
enum { MEMCPY_HOST_TO_DEVICE = 1, MEMCPY_DEVICE_TO_HOST = 2 };

int wg_cuda_load(wg_cuda_t *c, char *err, size_t err_len) {
  static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  const char *forced = getenv("WAGMA_CUDART");
  memset(c, 0, sizeof *c);
  if (forced && forced[0])
    c->dl = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; !c->dl && !(forced && forced[0]) && i < sizeof names / sizeof *names; i++)
    c->dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!c->dl) {
    snprintf(err, err_len, "no CUDA runtime (%s): %s",
             forced && forced[0] ? forced : "libcudart.so.13, .12 or libcudart.so", dlerror());
    return WAGMA_ENOSYS;
  }
  *(void **)&c->malloc_host = dlsym(c->dl, "cudaMallocHost");
  *(void **)&c->free_host = dlsym(c->dl, "cudaFreeHost");
  *(void **)&c->memcpy_async = dlsym(c->dl, "cudaMemcpyAsync");
  *(void **)&c->stream_synchronize = dlsym(c->dl, "cudaStreamSynchronize");
  *(void **)&c->error_string = dlsym(c->dl, "cudaGetErrorString");
  if (!c->malloc_host || !c->free_host || !c->memcpy_async || !c->stream_synchronize ||
      !c->error_string) {
    snprintf(err, err_len, "the CUDA runtime lacks cudaMallocHost, cudaMemcpyAsync, ...");
    wg_cuda_unload(c);
    return WAGMA_ENOSYS;
  }
  return 0;
}

void wg_cuda_unload(wg_cuda_t *c) {
  if (c->dl)
    dlclose(c->dl);
  memset(c, 0, sizeof *c);
}

static int failed(const wg_cuda_t *c, int e, const char *what, char *err, size_t err_len) {
  snprintf(err, err_len, "%s: CUDA error %d (%s)", what, e, c->error_string(e));
  return WAGMA_EIO;
}

int wg_cuda_to_host(const wg_cuda_t *c, float *host, const float *dev, size_t n, void *stream,
                    char *err, size_t err_len) {
  int e = c->memcpy_async(host, dev, n * sizeof(float), MEMCPY_DEVICE_TO_HOST, stream);
  if (e)
    return failed(c, e, "copy to the host", err, err_len);
  if ((e = c->stream_synchronize(stream)))
    return failed(c, e, "waiting for the caller's stream", err, err_len);
  return 0;
}

int wg_cuda_to_device(const wg_cuda_t *c, float *dev, const float *host, size_t n, void *stream,
                      char *err, size_t err_len) {
  int e = c->memcpy_async(dev, host, n * sizeof(float), MEMCPY_HOST_TO_DEVICE, stream);
  return e ? failed(c, e, "copy to the device", err, err_len) : 0;
}
