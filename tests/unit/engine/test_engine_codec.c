/* test_engine_codec.c — the engine's RESULT payload codec: round trip, the exact
 * little-endian bytes (host-independent), and rejection of out-of-range ranks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine_internal.h"

static void test_result_round_trip(void **state) {
  (void)state;
  const float mean[3] = {1.5f, -2.0f, 3.25f};
  const int ranks[2] = {0, 5};
  const uint64_t versions[2] = {7, 0x0102030405060708ull};
  uint8_t buf[64];
  size_t n = wg_codec_result_size(3, 2);
  assert_int_equal(n, 3 * 4 + 2 * 4 + 2 * 8);
  wg_codec_result_encode(buf, mean, 3, 2, ranks, versions);
  /* little-endian on the wire: 1.5f = 0x3fc00000, rank 5, version bytes 08 07 .. 01 */
  const uint8_t one_and_half[4] = {0x00, 0x00, 0xc0, 0x3f};
  assert_memory_equal(buf, one_and_half, 4);
  const uint8_t rank5[4] = {5, 0, 0, 0};
  assert_memory_equal(buf + 12 + 4, rank5, 4);
  const uint8_t v2[8] = {8, 7, 6, 5, 4, 3, 2, 1};
  assert_memory_equal(buf + 12 + 8 + 8, v2, 8);
  float m2[3];
  int r2[2];
  uint64_t ver2[2];
  assert_int_equal(wg_codec_result_decode(buf, 3, 2, 6, m2, r2, ver2), 0);
  assert_memory_equal(m2, mean, sizeof(mean));
  assert_int_equal(r2[1], 5);
  assert_true(ver2[1] == versions[1]);
  /* rank 5 is out of range for 5 ranks; a negative rank too */
  assert_int_equal(wg_codec_result_decode(buf, 3, 2, 5, m2, r2, ver2), WAGMA_EPROTO);
  const int bad[2] = {-1, 0};
  wg_codec_result_encode(buf, mean, 3, 2, bad, versions);
  assert_int_equal(wg_codec_result_decode(buf, 3, 2, 6, m2, r2, ver2), WAGMA_EPROTO);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_result_round_trip)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
