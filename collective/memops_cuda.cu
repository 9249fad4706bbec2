/* memops_cuda.cu — the CUDA memory operations (memops.h): one elementwise kernel per operation
 * on the caller's stream, with __fadd_rn / __fsub_rn / __fmul_rn so nothing is contracted into
 * an FMA and the results match memops.c's loops bit for bit (test_memops_gpu). Operations are
 * queued, not waited for; sync waits for the stream. No threads of its own. */
#include <cuda_runtime.h>

#include <stdlib.h>

extern "C" {
#include "memops.h"
#include "wagma/status.h"
}

namespace {

struct cuda_self {
  cudaStream_t stream;
  wg_memops_t ops;
};

constexpr unsigned kThreads = 256;

unsigned blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b > 65535 * 32 ? 65535 * 32 : b);
}

__global__ void k_add(float *dst, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = __fadd_rn(dst[i], src[i]);
}

__global__ void k_add_clear(float *dst, float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    dst[i] = __fadd_rn(dst[i], src[i]);
    src[i] = 0.0f;
  }
}

__global__ void k_add_clear_copy(float *dst, float *copy, float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float x = __fadd_rn(dst[i], src[i]);
    dst[i] = x;
    copy[i] = x;
    src[i] = 0.0f;
  }
}

__global__ void k_add_diff(float *dst, const float *a, const float *b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = __fadd_rn(dst[i], __fsub_rn(a[i], b[i]));
}

__global__ void k_add_diff2(float *d1, float *d2, const float *a, const float *b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float d = __fsub_rn(a[i], b[i]);
    d1[i] = __fadd_rn(d1[i], d);
    d2[i] = __fadd_rn(d2[i], d);
  }
}

__global__ void k_scale(float *dst, float s, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = __fmul_rn(dst[i], s);
}

cudaStream_t stream_of(void *self) {
  return static_cast<cuda_self *>(self)->stream;
}

void c_copy(void *self, float *dst, const float *src, size_t n) {
  if (n && dst != src)
    cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_of(self));
}

void c_add(void *self, float *dst, const float *src, size_t n) {
  if (n)
    k_add<<<blocks(n), kThreads, 0, stream_of(self)>>>(dst, src, n);
}

void c_add_clear(void *self, float *dst, float *src, size_t n) {
  if (n)
    k_add_clear<<<blocks(n), kThreads, 0, stream_of(self)>>>(dst, src, n);
}

void c_add_clear_copy(void *self, float *dst, float *copy, float *src, size_t n) {
  if (n)
    k_add_clear_copy<<<blocks(n), kThreads, 0, stream_of(self)>>>(dst, copy, src, n);
}

void c_add_diff(void *self, float *dst, const float *a, const float *b, size_t n) {
  if (n)
    k_add_diff<<<blocks(n), kThreads, 0, stream_of(self)>>>(dst, a, b, n);
}

void c_add_diff2(void *self, float *d1, float *d2, const float *a, const float *b, size_t n) {
  if (n)
    k_add_diff2<<<blocks(n), kThreads, 0, stream_of(self)>>>(d1, d2, a, b, n);
}

void c_scale(void *self, float *dst, float s, size_t n) {
  if (n)
    k_scale<<<blocks(n), kThreads, 0, stream_of(self)>>>(dst, s, n);
}

int c_sync(void *self) {
  if (cudaGetLastError() != cudaSuccess)
    return WAGMA_EIO;
  return cudaStreamSynchronize(stream_of(self)) == cudaSuccess ? 0 : WAGMA_EIO;
}

} // namespace

extern "C" int wg_memops_cuda_new(void *stream, wg_memops_t **out) {
  *out = NULL;
  cuda_self *s = static_cast<cuda_self *>(calloc(1, sizeof(cuda_self)));
  if (!s)
    return WAGMA_ENOMEM;
  s->stream = static_cast<cudaStream_t>(stream);
  s->ops.name = "cuda";
  s->ops.self = s;
  s->ops.copy = c_copy;
  s->ops.add = c_add;
  s->ops.add_clear = c_add_clear;
  s->ops.add_clear_copy = c_add_clear_copy;
  s->ops.add_diff = c_add_diff;
  s->ops.add_diff2 = c_add_diff2;
  s->ops.scale = c_scale;
  s->ops.sync = c_sync;
  *out = &s->ops;
  return 0;
}

extern "C" void wg_memops_cuda_free(wg_memops_t *m) {
  free(m ? m->self : NULL);
}
