/* fake_cudart.c — a stand-in for the CUDA runtime's memory calls, for tests of libwagma's
 * device buffers (worker/cuda_stage.c) without a GPU. Built as a shared library that libwagma
 * dlopens ($WAGMA_CUDART) and a test program links.
 *
 * "Device" memory (cudaMalloc) is mapped PROT_NONE: only this library's copies open it, for the
 * copy's duration, so any direct read or write of a device pointer (libwagma treating it as
 * host memory) is a SIGSEGV. Copies must name the right direction (cudaMemcpyHostToDevice with
 * a device destination and a host source, and so on), else cudaErrorInvalidValue. The copies
 * are counted by direction (fake_cudart_counts). One mutex; streams are ignored (everything is
 * synchronous). */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { OK = 0, INVALID_VALUE = 1, MEMORY_ALLOCATION = 2 };
enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3 };

#define MAX_ALLOCS 64
static struct {
  char *p;
  size_t bytes; /* mapped (page multiple) */
} allocs[MAX_ALLOCS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long counts[4];

static int find(const void *p) {
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].p && (const char *)p >= allocs[i].p &&
        (const char *)p < allocs[i].p + allocs[i].bytes)
      return i;
  return -1;
}

int cudaMalloc(void **p, size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + page - 1) / page * page;
  void *m = mmap(NULL, n ? n : page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return MEMORY_ALLOCATION;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (!allocs[i].p) {
      allocs[i].p = m;
      allocs[i].bytes = n ? n : page;
      pthread_mutex_unlock(&mu);
      *p = m;
      return OK;
    }
  pthread_mutex_unlock(&mu);
  munmap(m, n);
  return MEMORY_ALLOCATION;
}

int cudaFree(void *p) {
  pthread_mutex_lock(&mu);
  int i = find(p);
  if (i >= 0) {
    munmap(allocs[i].p, allocs[i].bytes);
    allocs[i].p = NULL;
  }
  pthread_mutex_unlock(&mu);
  return i >= 0 || !p ? OK : INVALID_VALUE;
}

int cudaMallocHost(void **p, size_t bytes) {
  *p = malloc(bytes ? bytes : 1);
  return *p ? OK : MEMORY_ALLOCATION;
}

int cudaFreeHost(void *p) {
  free(p);
  return OK;
}

int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind) {
  pthread_mutex_lock(&mu);
  int d = find(dst), s = find(src), e = OK;
  int want_d = kind == H2D || kind == D2D, want_s = kind == D2H || kind == D2D;
  if (kind < 0 || kind > 3 || (d >= 0) != want_d || (s >= 0) != want_s ||
      (d >= 0 && (char *)dst + bytes > allocs[d].p + allocs[d].bytes) ||
      (s >= 0 && (const char *)src + bytes > allocs[s].p + allocs[s].bytes)) {
    e = INVALID_VALUE;
  } else {
    if (d >= 0)
      mprotect(allocs[d].p, allocs[d].bytes, PROT_READ | PROT_WRITE);
    if (s >= 0 && s != d)
      mprotect(allocs[s].p, allocs[s].bytes, PROT_READ);
    memmove(dst, src, bytes);
    if (d >= 0)
      mprotect(allocs[d].p, allocs[d].bytes, PROT_NONE);
    if (s >= 0 && s != d)
      mprotect(allocs[s].p, allocs[s].bytes, PROT_NONE);
    counts[kind]++;
  }
  pthread_mutex_unlock(&mu);
  return e;
}

int cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, void *stream) {
  (void)stream;
  return cudaMemcpy(dst, src, bytes, kind);
}

int cudaStreamSynchronize(void *stream) {
  (void)stream;
  return OK;
}

const char *cudaGetErrorString(int e) {
  return e == OK              ? "no error"
         : e == INVALID_VALUE ? "invalid argument (fake)"
                              : "out of memory (fake)";
}

/* The tests' own: copies so far, by direction (host to device, device to host). */
void fake_cudart_counts(unsigned long *to_device, unsigned long *to_host) {
  pthread_mutex_lock(&mu);
  *to_device = counts[H2D];
  *to_host = counts[D2H];
  pthread_mutex_unlock(&mu);
}
