/* nccl_hostmem.c — the NCCL transport's page-locked host memory (docs/design.md §6.4): the
 * buf_pool.c source of page-locked buffers (cudaHostAlloc / cudaFreeHost) and the one thread
 * per process that calls them, the keeper.
 *
 * Why a thread of its own: allocating or freeing page-locked memory synchronizes with the
 * whole device (CUDA's implicit synchronization), so the call waits for whatever the
 * application's compute stream has queued. Made by a lane thread, the only reader of its
 * transport's control channel, it would hold every peer's frames that long; made by an
 * engine thread, it would hold a round. Every other thread only takes buffers from the cache
 * (WG_NCCL(locked_take)); a miss asks the keeper for one of that size, and the caller uses
 * pageable memory this once. A buffer the cache has no room for is queued for the keeper to
 * free. A keeper stuck behind a device that never idles (a kernel left running by a revoke)
 * stops refilling: payloads then use pageable memory, slower and never stuck.
 *
 * State: `hm`, under hm.mu. Threads: locked_take, is_locked and the source's release from any
 * thread; the keeper (detached, started by the first miss; a forked child starts its own
 * and forgets the parent's buffers to free) does the rest. After a failed cudaHostAlloc none is
 * tried for LOCKED_RETRY_S: page-locked memory is short, and each try costs. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_internal.h"

#define LOCKED_RETRY_S 10.0
#define WANTED_MAX 64 /* misses remembered until the keeper runs; more are dropped */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t wake;
  wg_buf_source_t *source;
  int keeper_running;    /* in this process: a forked child starts its own */
  double start_retry_at; /* after a failed pthread_create */
  struct {
    int device;
    size_t len;
  } wanted[WANTED_MAX]; /* buffers to put in the cache, in order of the misses */
  int nwanted;
  void *to_free;         /* released buffers, a list through each one's first bytes */
  double alloc_retry_at; /* after a failed cudaHostAlloc */
} hm = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* The source's alloc: on the keeper only (wg_buf_cache_add there). */
static void *locked_alloc(size_t bytes) {
  pthread_mutex_lock(&hm.mu);
  int skip = wg_now() < hm.alloc_retry_at;
  pthread_mutex_unlock(&hm.mu);
  if (skip)
    return NULL;
  void *p = NULL;
  /* portable: page-locked for every context, whichever device the keeper had */
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess)
    return p;
  (void)cudaGetLastError();
  pthread_mutex_lock(&hm.mu);
  hm.alloc_retry_at = wg_now() + LOCKED_RETRY_S;
  pthread_mutex_unlock(&hm.mu);
  return NULL;
}

/* The source's release, from any thread that freed a payload into a full cache. */
static void locked_release(void *base) {
  pthread_mutex_lock(&hm.mu);
  memcpy(base, &hm.to_free, sizeof(void *));
  hm.to_free = base;
  pthread_cond_signal(&hm.wake);
  pthread_mutex_unlock(&hm.mu);
}

static void *keeper_main(void *arg) {
  (void)arg;
  int device = -1;
  for (;;) {
    pthread_mutex_lock(&hm.mu);
    while (hm.nwanted == 0 && hm.to_free == NULL) {
      struct timespec until; /* idle: look again each second (hm.wake is on CLOCK_REALTIME) */
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_sec += 1;
      pthread_cond_timedwait(&hm.wake, &hm.mu, &until);
    }
    void *to_free = hm.to_free;
    hm.to_free = NULL;
    int n = hm.nwanted;
    __typeof__(hm.wanted) wanted;
    memcpy(wanted, hm.wanted, (size_t)n * sizeof wanted[0]);
    hm.nwanted = 0;
    pthread_mutex_unlock(&hm.mu);
    while (to_free) {
      void *next;
      memcpy(&next, to_free, sizeof next);
      (void)cudaFreeHost(to_free);
      to_free = next;
    }
    for (int i = 0; i < n; i++) {
      if (wanted[i].device != device) {
        if (cudaSetDevice(wanted[i].device) != cudaSuccess) {
          (void)cudaGetLastError();
          continue;
        }
        device = wanted[i].device;
      }
      /* one more in the cache for each miss, unless it is full */
      (void)wg_buf_cache_add(hm.source, wanted[i].len);
    }
  }
  return NULL;
}

static void atfork_prepare(void) {
  pthread_mutex_lock(&hm.mu);
}

static void atfork_parent(void) {
  pthread_mutex_unlock(&hm.mu);
}

static void atfork_child(void) {
  /* the parent's keeper did not come along: a wait of its on hm.wake would make the child's
   * next signal hang, so the lock and the condition start afresh; the parent's buffers to
   * free are its own business (a child cannot use the parent's CUDA context anyway) */
  pthread_mutex_init(&hm.mu, NULL);
  pthread_cond_init(&hm.wake, NULL);
  hm.keeper_running = 0;
  hm.start_retry_at = 0;
  hm.nwanted = 0;
  hm.to_free = NULL;
}

static pthread_once_t hostmem_once = PTHREAD_ONCE_INIT;

static void hostmem_init(void) {
  hm.source = wg_buf_source_new(locked_alloc, locked_release);
  (void)pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

wg_buf_source_t *WG_NCCL(locked_source)(void) {
  pthread_once(&hostmem_once, hostmem_init);
  return hm.source;
}

/* Asks the keeper for a page-locked buffer of len bytes on device, starting it if need be. */
static void want(int device, size_t len) {
  pthread_mutex_lock(&hm.mu);
  if (!hm.keeper_running && wg_now() >= hm.start_retry_at) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    hm.keeper_running = pthread_create(&th, &attr, keeper_main, NULL) == 0;
    pthread_attr_destroy(&attr);
    if (!hm.keeper_running) /* no thread to be had: pageable buffers, and a new try in 1 s */
      hm.start_retry_at = wg_now() + 1.0;
  }
  if (hm.keeper_running && hm.nwanted < WANTED_MAX) {
    hm.wanted[hm.nwanted].device = device;
    hm.wanted[hm.nwanted].len = len;
    hm.nwanted++;
    pthread_cond_signal(&hm.wake);
  }
  pthread_mutex_unlock(&hm.mu);
}

void *WG_NCCL(locked_take)(int device, size_t len) {
  wg_buf_source_t *src = WG_NCCL(locked_source)();
  if (src == NULL)
    return NULL;
  void *p = wg_buf_take_cached(src, len);
  if (p == NULL && wg_buf_cache_room(src, len)) /* no room: a size the cache does not keep */
    want(device, len);
  return p;
}

void *WG_NCCL(payload_buffer)(int device, size_t len) {
  void *p = WG_NCCL(locked_take)(device, len);
  return p ? p : wg_buf_alloc(len);
}

int WG_NCCL(is_locked)(const void *p) {
  wg_buf_source_t *src = WG_NCCL(locked_source)();
  return src && wg_buf_is_from(p, src);
}
