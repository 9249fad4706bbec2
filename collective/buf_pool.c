/* buf_pool.c — process-wide caches of large buffers for frame payloads and outbound queue
 * entries (transport.h: wg_buf_alloc / wg_buf_free), shared by every transport, and the
 * sources they come from: the default one (aligned_alloc / free) and those a transport makes
 * for memory of its own kind (the NCCL transport's page-locked host memory, whose copies to
 * and from a GPU run at DMA speed; allocating it costs far more than malloc, so it is cached
 * the same way).
 *
 * Why: a large collective moves one 1 MiB segment per frame; allocating and freeing each from
 * malloc means mmap/munmap or arena trimming and a page fault per 4 KiB, which cost more than
 * the copy itself. Payloads of up to 64 KiB .. 64 MiB are kept in power-of-two classes (class
 * c holds 2^c payload bytes, the prefix beyond them, so a payload of exactly 2^c bytes is not
 * rounded up to twice that), at most POOL_PER_CLASS per class and POOL_MAX_BYTES in all per
 * source; larger ones go straight to the default source. Any other source (page-locked
 * memory, which is worth caching at any size: a model's round needs one) has classes up to
 * 16 GiB, at most BIG_PER_CLASS each above 64 MiB, and may cache two buffers of its largest
 * class beyond POOL_MAX_BYTES. Smaller ones go to malloc from the default source, and are
 * rounded up to the smallest class from any other (so they are cached too).
 *
 * Layout: every buffer has a 64-byte prefix holding its class and its source, so the pointer
 * handed out is 64-byte aligned and the free needs neither size nor source. Threads: any; one
 * mutex per source. The default source's cache is released at process exit (destructor), so
 * leak checkers see nothing; other sources live (with their caches) until the process ends. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport.h"

#define PREFIX 64u
#define MIN_CLASS 16     /* 64 KiB */
#define MAX_CLASS 26     /* 64 MiB: the default source's largest */
#define MAX_CLASS_ANY 34 /* 16 GiB: other sources' largest */
#define NCLASSES (MAX_CLASS_ANY - MIN_CLASS + 1)
#define POOL_PER_CLASS 16
#define BIG_PER_CLASS 2 /* above MAX_CLASS */
#define POOL_MAX_BYTES ((size_t)256 << 20)
#define CLASS_NONE 0xffu

struct wg_buf_source {
  void *(*alloc)(size_t bytes);
  void (*release)(void *base);
  pthread_mutex_t lock;
  void *cache[NCLASSES][POOL_PER_CLASS];
  int count[NCLASSES];
  size_t bytes;
};

static void *default_alloc(size_t bytes) {
  return aligned_alloc(64, bytes);
}

static wg_buf_source_t default_source = {
    .alloc = default_alloc, .release = free, .lock = PTHREAD_MUTEX_INITIALIZER};

/* What sits in front of every buffer (within PREFIX bytes). */
typedef struct prefix {
  wg_buf_source_t *source;
  uint8_t cls;
} prefix_t;
_Static_assert(sizeof(prefix_t) <= PREFIX, "the prefix fits");

wg_buf_source_t *wg_buf_source_new(void *(*alloc)(size_t bytes), void (*release)(void *base)) {
  wg_buf_source_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  s->alloc = alloc;
  s->release = release;
  pthread_mutex_init(&s->lock, NULL);
  return s;
}

static unsigned class_of(const wg_buf_source_t *s, size_t size) {
  if (s == &default_source && size + PREFIX <= ((size_t)1 << MIN_CLASS) / 2)
    return CLASS_NONE; /* small: malloc is fast enough */
  unsigned top = s == &default_source ? MAX_CLASS : MAX_CLASS_ANY;
  for (unsigned c = MIN_CLASS; c <= top; c++)
    if (size <= ((size_t)1 << c))
      return c;
  return CLASS_NONE;
}

/* Bytes a buffer of class c takes from its source. */
static size_t class_bytes(unsigned c) {
  return ((size_t)1 << c) + PREFIX;
}

/* With s->lock: 1 when s's cache may keep one more buffer of class c. */
static int has_room(const wg_buf_source_t *s, unsigned c) {
  int i = (int)(c - MIN_CLASS);
  size_t cb = class_bytes(c);
  size_t cap = POOL_MAX_BYTES;
  if (s != &default_source && 2 * cb > cap)
    cap = 2 * cb;
  return s->count[i] < (c > MAX_CLASS ? BIG_PER_CLASS : POOL_PER_CLASS) && s->bytes + cb <= cap;
}

/* A cached buffer of class c of s (its base, its prefix already set), or NULL. */
static uint8_t *cache_take(wg_buf_source_t *s, unsigned c) {
  uint8_t *base = NULL;
  pthread_mutex_lock(&s->lock);
  int i = c - MIN_CLASS;
  if (s->count[i] > 0) {
    base = s->cache[i][--s->count[i]];
    s->bytes -= class_bytes(c);
  }
  pthread_mutex_unlock(&s->lock);
  return base;
}

void *wg_buf_alloc_from(wg_buf_source_t *s, size_t size) {
  if (s == NULL)
    s = &default_source;
  unsigned c = class_of(s, size);
  uint8_t *base = NULL;
  if (c != CLASS_NONE) {
    base = cache_take(s, c);
    if (base == NULL)
      base = s->alloc(class_bytes(c));
  } else {
    size_t total = (size + PREFIX + 63u) & ~(size_t)63u;
    if (total < size)
      return NULL;
    base = s->alloc(total);
  }
  if (base == NULL)
    return NULL;
  prefix_t p = {.source = s, .cls = (uint8_t)c};
  memcpy(base, &p, sizeof p);
  return base + PREFIX;
}

int wg_buf_cache_add(wg_buf_source_t *s, size_t size) {
  if (s == NULL)
    s = &default_source;
  unsigned c = class_of(s, size);
  if (c == CLASS_NONE || !wg_buf_cache_room(s, size))
    return 0;
  uint8_t *base = s->alloc(class_bytes(c));
  if (base == NULL)
    return 0;
  prefix_t p = {.source = s, .cls = (uint8_t)c};
  memcpy(base, &p, sizeof p);
  wg_buf_free(base + PREFIX); /* into the cache (released again if it filled meanwhile) */
  return 1;
}

void *wg_buf_take_cached(wg_buf_source_t *s, size_t size) {
  if (s == NULL)
    s = &default_source;
  unsigned c = class_of(s, size);
  uint8_t *base = c == CLASS_NONE ? NULL : cache_take(s, c);
  return base ? base + PREFIX : NULL;
}

int wg_buf_cache_room(wg_buf_source_t *s, size_t size) {
  if (s == NULL)
    s = &default_source;
  unsigned c = class_of(s, size);
  if (c == CLASS_NONE)
    return 0;
  pthread_mutex_lock(&s->lock);
  int room = has_room(s, c);
  pthread_mutex_unlock(&s->lock);
  return room;
}

void *wg_buf_alloc(size_t size) {
  return wg_buf_alloc_from(&default_source, size);
}

int wg_buf_is_from(const void *ptr, const wg_buf_source_t *s) {
  prefix_t p;
  if (ptr == NULL)
    return 0;
  memcpy(&p, (const uint8_t *)ptr - PREFIX, sizeof p);
  return p.source == (s ? s : &default_source);
}

void wg_buf_free(void *ptr) {
  if (ptr == NULL)
    return;
  uint8_t *base = (uint8_t *)ptr - PREFIX;
  prefix_t p;
  memcpy(&p, base, sizeof p);
  wg_buf_source_t *s = p.source;
  unsigned c = p.cls;
  if (c != CLASS_NONE) {
    pthread_mutex_lock(&s->lock);
    int i = c - MIN_CLASS;
    if (has_room(s, c)) {
      s->cache[i][s->count[i]++] = base;
      s->bytes += class_bytes(c);
      base = NULL;
    }
    pthread_mutex_unlock(&s->lock);
  }
  if (base)
    s->release(base);
}

/* Releases every buffer s caches. */
static void drain(wg_buf_source_t *s) {
  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < NCLASSES; i++) {
    while (s->count[i] > 0)
      s->release(s->cache[i][--s->count[i]]);
  }
  s->bytes = 0;
  pthread_mutex_unlock(&s->lock);
}

void wg_buf_source_free(wg_buf_source_t *s) {
  if (s == NULL || s == &default_source)
    return;
  drain(s);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

__attribute__((destructor)) static void pool_release(void) {
  drain(&default_source);
}
