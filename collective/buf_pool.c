/* buf_pool.c — a process-wide cache of large buffers for frame payloads and outbound queue
 * entries (transport.h: wg_buf_alloc / wg_buf_free), shared by every transport.
 *
 * Why: a large collective moves one 1 MiB segment per frame; allocating and freeing each from
 * malloc means mmap/munmap or arena trimming and a page fault per 4 KiB, which cost more than
 * the copy itself. Buffers of 64 KiB .. 64 MiB are kept in power-of-two classes, at most
 * POOL_PER_CLASS per class and POOL_MAX_BYTES in all; smaller and larger ones go to malloc.
 *
 * Layout: every buffer has a 64-byte prefix holding its class, so the pointer handed out is
 * 64-byte aligned and the free needs no size. Threads: any; one mutex. The cache is released
 * at process exit (destructor), so leak checkers see nothing. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "transport.h"

#define PREFIX 64u
#define MIN_CLASS 16 /* 64 KiB */
#define MAX_CLASS 26 /* 64 MiB */
#define NCLASSES (MAX_CLASS - MIN_CLASS + 1)
#define POOL_PER_CLASS 16
#define POOL_MAX_BYTES ((size_t)256 << 20)
#define CLASS_NONE 0xffu

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static void *pool[NCLASSES][POOL_PER_CLASS];
static int pool_count[NCLASSES];
static size_t pool_bytes;

static unsigned class_of(size_t size) {
  if (size + PREFIX <= ((size_t)1 << MIN_CLASS) / 2)
    return CLASS_NONE; /* small: malloc is fast enough */
  for (unsigned c = MIN_CLASS; c <= MAX_CLASS; c++)
    if (size + PREFIX <= ((size_t)1 << c))
      return c;
  return CLASS_NONE;
}

void *wg_buf_alloc(size_t size) {
  unsigned c = class_of(size);
  uint8_t *base = NULL;
  if (c != CLASS_NONE) {
    pthread_mutex_lock(&pool_lock);
    int i = c - MIN_CLASS;
    if (pool_count[i] > 0) {
      base = pool[i][--pool_count[i]];
      pool_bytes -= (size_t)1 << c;
    }
    pthread_mutex_unlock(&pool_lock);
    if (base == NULL)
      base = aligned_alloc(64, (size_t)1 << c);
  } else {
    size_t total = (size + PREFIX + 63u) & ~(size_t)63u;
    if (total < size)
      return NULL;
    base = aligned_alloc(64, total);
  }
  if (base == NULL)
    return NULL;
  base[0] = (uint8_t)c;
  return base + PREFIX;
}

void wg_buf_free(void *ptr) {
  if (ptr == NULL)
    return;
  uint8_t *base = (uint8_t *)ptr - PREFIX;
  unsigned c = base[0];
  if (c != CLASS_NONE) {
    pthread_mutex_lock(&pool_lock);
    int i = c - MIN_CLASS;
    if (pool_count[i] < POOL_PER_CLASS && pool_bytes + ((size_t)1 << c) <= POOL_MAX_BYTES) {
      pool[i][pool_count[i]++] = base;
      pool_bytes += (size_t)1 << c;
      base = NULL;
    }
    pthread_mutex_unlock(&pool_lock);
  }
  free(base);
}

__attribute__((destructor)) static void pool_release(void) {
  pthread_mutex_lock(&pool_lock);
  for (int i = 0; i < NCLASSES; i++) {
    while (pool_count[i] > 0)
      free(pool[i][--pool_count[i]]);
  }
  pool_bytes = 0;
  pthread_mutex_unlock(&pool_lock);
}
