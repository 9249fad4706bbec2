/* test_buf_pool: the payload buffer caches (collective/buf_pool.c) with a source of this test's
 * (as the NCCL transport's page-locked one): buffers of any size up to 16 GiB are cached, so a
 * large model's payloads can be page-locked (payloads over 64 MiB never were); a payload of
 * exactly 2^k bytes costs 2^k + 64 bytes, not 2^(k+1); the cache keeps at most two buffers of
 * a class above 64 MiB and bounds its bytes; the default source keeps nothing above 64 MiB.
 * The source allocates with aligned_alloc (untouched pages of a large one cost nothing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "transport.h"

static int allocs, releases;
static size_t last_bytes;

static void *count_alloc(size_t bytes) {
  allocs++;
  last_bytes = bytes;
  return aligned_alloc(64, bytes); /* as a source must: 64-byte aligned */
}

static void count_release(void *base) {
  releases++;
  free(base);
}

#define MiB ((size_t)1 << 20)

static void test_large_buffers_are_cached(void **s) {
  (void)s;
  wg_buf_source_t *src = wg_buf_source_new(count_alloc, count_release);
  assert_non_null(src);
  size_t big = 100 * MiB; /* above the old 64 MiB limit */
  assert_null(wg_buf_take_cached(src, big));
  assert_int_equal(wg_buf_cache_add(src, big), 1); /* the keeper's fill */
  assert_int_equal(allocs, 1);
  assert_int_equal(last_bytes, 128 * MiB + 64);
  void *p = wg_buf_take_cached(src, big);
  assert_non_null(p);
  assert_true(wg_buf_is_from(p, src));
  assert_int_equal((uintptr_t)p % 64, 0);
  assert_null(wg_buf_take_cached(src, big)); /* one was cached */
  wg_buf_free(p);                            /* back into the cache */
  assert_int_equal(releases, 0);
  void *q = wg_buf_take_cached(src, big);
  assert_ptr_equal(q, p);
  wg_buf_free(q);
  wg_buf_source_free(src);
}

static void test_power_of_two_payload_fits_its_class(void **s) {
  (void)s;
  wg_buf_source_t *src = wg_buf_source_new(count_alloc, count_release);
  assert_non_null(src);
  void *p = wg_buf_alloc_from(src, 64 * MiB);
  assert_non_null(p);
  assert_int_equal(last_bytes, 64 * MiB + 64);
  wg_buf_free(p);
  p = wg_buf_alloc_from(src, 64 * MiB + 1);
  assert_non_null(p);
  assert_int_equal(last_bytes, 128 * MiB + 64);
  wg_buf_free(p);
  wg_buf_source_free(src);
}

static void test_big_classes_are_bounded(void **s) {
  (void)s;
  wg_buf_source_t *src = wg_buf_source_new(count_alloc, count_release);
  assert_non_null(src);
  size_t gib = 1024 * MiB;
  int before = releases;
  assert_int_equal(wg_buf_cache_add(src, gib), 1);
  assert_int_equal(wg_buf_cache_add(src, gib), 1);
  assert_int_equal(wg_buf_cache_room(src, gib), 0); /* two of a class above 64 MiB */
  assert_int_equal(wg_buf_cache_add(src, gib), 0);
  assert_int_equal(wg_buf_cache_add(src, 512 * MiB), 0); /* the bytes' bound: 2 x 1 GiB */
  void *a = wg_buf_take_cached(src, gib), *b = wg_buf_take_cached(src, gib);
  void *c = wg_buf_alloc_from(src, gib); /* a third, from the source */
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  wg_buf_free(a);
  wg_buf_free(b);
  wg_buf_free(c); /* no room: released */
  assert_int_equal(releases, before + 1);
  assert_null(wg_buf_take_cached(src, (size_t)17 << 30)); /* past 16 GiB: never cached */
  assert_int_equal(wg_buf_cache_add(src, (size_t)17 << 30), 0);
  wg_buf_source_free(src);
}

static void test_default_source_keeps_64_mib(void **s) {
  (void)s;
  assert_int_equal(wg_buf_cache_room(NULL, 64 * MiB), 1);
  assert_int_equal(wg_buf_cache_room(NULL, 64 * MiB + 1), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_large_buffers_are_cached),
      cmocka_unit_test(test_power_of_two_payload_fits_its_class),
      cmocka_unit_test(test_big_classes_are_bounded),
      cmocka_unit_test(test_default_source_keeps_64_mib),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
