/* memops.c — the host's memory operations (memops.h): plain loops, float32 in the written order
 * (built with -ffp-contract=off: no FMA contraction, so the CUDA kernels can match them bit for
 * bit). No state, no threads: callers own the buffers and their locking. */
#include "memops.h"

#include <string.h>

#include "wagma/status.h"

static void host_copy(void *self, float *dst, const float *src, size_t n) {
  (void)self;
  if (n && dst != src)
    memmove(dst, src, n * sizeof(float));
}

static void host_add(void *self, float *dst, const float *src, size_t n) {
  (void)self;
  for (size_t i = 0; i < n; i++)
    dst[i] = dst[i] + src[i];
}

static void host_add_clear(void *self, float *dst, float *src, size_t n) {
  (void)self;
  for (size_t i = 0; i < n; i++) {
    dst[i] = dst[i] + src[i];
    src[i] = 0.0f;
  }
}

static void host_add_clear_copy(void *self, float *dst, float *copy, float *src, size_t n) {
  (void)self;
  for (size_t i = 0; i < n; i++) {
    float x = dst[i] + src[i];
    dst[i] = x;
    copy[i] = x;
    src[i] = 0.0f;
  }
}

static void host_add_diff(void *self, float *dst, const float *a, const float *b, size_t n) {
  (void)self;
  for (size_t i = 0; i < n; i++)
    dst[i] = dst[i] + (a[i] - b[i]);
}

static void host_add_diff2(void *self, float *d1, float *d2, const float *a, const float *b,
                           size_t n) {
  (void)self;
  for (size_t i = 0; i < n; i++) {
    float d = a[i] - b[i];
    d1[i] = d1[i] + d;
    d2[i] = d2[i] + d;
  }
}

static void host_scale(void *self, float *dst, float s, size_t n) {
  (void)self;
  for (size_t i = 0; i < n; i++)
    dst[i] = dst[i] * s;
}

static int host_sync(void *self) {
  (void)self;
  return 0;
}

const wg_memops_t wg_memops_host = {
    .name = "host",
    .self = NULL,
    .copy = host_copy,
    .add = host_add,
    .add_clear = host_add_clear,
    .add_clear_copy = host_add_clear_copy,
    .add_diff = host_add_diff,
    .add_diff2 = host_add_diff2,
    .scale = host_scale,
    .sync = host_sync,
};

#ifndef WAGMA_MEMOPS_CUDA
int wg_memops_cuda_new(void *stream, wg_memops_t **out) {
  (void)stream;
  *out = NULL;
  return WAGMA_ENOSYS;
}

void wg_memops_cuda_free(wg_memops_t *m) {
  (void)m;
}
#endif
