/* memops.h — the engine's model-sized arithmetic as a table of memory operations (docs/design.md
 * "The engine": snapshot, correction, mean). Host loops for host buffers (memops.c), CUDA
 * kernels on a stream for device buffers (memops_cuda.cu, where CMake found CUDA); the two agree
 * bit for bit: every operation is elementwise float32, evaluated in the order written below,
 * never contracted into an FMA (memops.c is built with -ffp-contract=off, the kernels use
 * __fadd_rn / __fsub_rn / __fmul_rn), so test_memops_gpu compares them with memcmp.
 * Private to collective/. The transport's reductions (coll.c) are not here. */
#ifndef WAGMA_COLLECTIVE_MEMOPS_H
#define WAGMA_COLLECTIVE_MEMOPS_H

#include <stddef.h>

typedef struct wg_memops {
  const char *name; /* "host", "cuda" */
  void *self;       /* the implementation's state (the CUDA stream), NULL for the host */
  void (*copy)(void *self, float *dst, const float *src, size_t n); /* dst = src */
  void (*add)(void *self, float *dst, const float *src, size_t n);  /* dst = dst + src */
  void (*add_clear)(void *self, float *dst, float *src, size_t n);  /* dst += src; src = 0 */
  /* dst += src; copy = dst; src = 0: the corrections into the model and the model into a
   * snapshot, in one pass */
  void (*add_clear_copy)(void *self, float *dst, float *copy, float *src, size_t n);
  /* dst = dst + (a - b): a correction, mean minus what was contributed */
  void (*add_diff)(void *self, float *dst, const float *a, const float *b, size_t n);
  /* d1 = d1 + (a - b); d2 = d2 + (a - b): one pass for the accumulator and the snapshot */
  void (*add_diff2)(void *self, float *d1, float *d2, const float *a, const float *b, size_t n);
  void (*scale)(void *self, float *dst, float s, size_t n); /* dst = dst * s */
  /* 0 once every operation queued so far is done (the host's are done on return) */
  int (*sync)(void *self);
} wg_memops_t;

extern const wg_memops_t wg_memops_host;

/* The CUDA operations on stream (a cudaStream_t, NULL = the legacy default stream): 0 and *out
 * (the caller's, wg_memops_cuda_free), or WAGMA_ENOSYS in a build without CUDA. Their sync
 * waits for the stream and reports a kernel's failure as WAGMA_EIO. */
int wg_memops_cuda_new(void *stream, wg_memops_t **out);
void wg_memops_cuda_free(wg_memops_t *m);

#endif
