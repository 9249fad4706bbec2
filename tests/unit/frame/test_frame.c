/* test_frame.c — the 64-byte frame header: layout, round trip, every validation failure,
 * and seeded random / truncated / bit-flipped input that must never crash and never decode
 * to a header whose re-encoding differs from the input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frame.h"
#include "wagma/status.h"

#define EPOCH 7u
#define NRANKS 16u
#define MAXP 4096u

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) { /* xorshift64*, seeded: reproducible */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

static wg_frame_header_t valid_header(void) {
  wg_frame_header_t h = {0};
  h.magic = WG_FRAME_MAGIC;
  h.version = WG_FRAME_VERSION;
  h.kind = WG_FRAME_COLL;
  h.epoch = EPOCH;
  h.round = 0x0102030405060708ull;
  h.group = 0x11223344u;
  h.src = 3;
  h.seq = 0xa1a2a3a4a5a6a7a8ull;
  h.length = 1000;
  h.aux = 0xdeadbeefcafef00dull;
  h.flags = 0x80000001u;
  h.reserved = 0;
  return h;
}

static int decode(const uint8_t *buf, size_t len, wg_frame_header_t *out) {
  return wg_frame_decode(buf, len, EPOCH, NRANKS, MAXP, out);
}

static void test_layout_little_endian(void **state) {
  (void)state;
  wg_frame_header_t h = valid_header();
  uint8_t b[WG_FRAME_HEADER_SIZE];
  wg_frame_encode(&h, b);
  assert_memory_equal(b, "WGMA", 4);
  assert_int_equal(b[4], 1); /* version */
  assert_int_equal(b[5], 0);
  assert_int_equal(b[6], WG_FRAME_COLL);
  assert_int_equal(b[8], EPOCH); /* epoch low byte first */
  assert_int_equal(b[16], 0x08); /* round */
  assert_int_equal(b[23], 0x01);
  assert_int_equal(b[24], 0x44);        /* group */
  assert_int_equal(b[28], 3);           /* src */
  assert_int_equal(b[32], 0xa8);        /* seq */
  assert_int_equal(b[40], 1000 & 0xff); /* length */
  assert_int_equal(b[41], 1000 >> 8);
  assert_int_equal(b[48], 0x0d); /* aux */
  assert_int_equal(b[56], 0x01); /* flags */
  assert_int_equal(b[59], 0x80);
  for (int i = 60; i < 64; i++)
    assert_int_equal(b[i], 0);
}

static void test_round_trip(void **state) {
  (void)state;
  for (int i = 0; i < 2000; i++) {
    wg_frame_header_t h = valid_header(), d;
    h.kind = (uint16_t)(1 + rng() % WG_FRAME_KIND_MAX);
    h.round = rng();
    h.group = (uint32_t)rng();
    h.src = (uint32_t)(rng() % NRANKS);
    h.seq = rng();
    h.length = rng() % (MAXP + 1);
    h.aux = rng();
    h.flags = (uint32_t)rng();
    uint8_t b[WG_FRAME_HEADER_SIZE];
    wg_frame_encode(&h, b);
    assert_int_equal(decode(b, sizeof b, &d), 0);
    assert_memory_equal(&h, &d, sizeof h);
  }
  /* Boundaries are accepted: length == max, src == nranks - 1, longer input. */
  wg_frame_header_t h = valid_header(), d;
  h.length = MAXP;
  h.src = NRANKS - 1;
  uint8_t b[WG_FRAME_HEADER_SIZE + 8] = {0};
  wg_frame_encode(&h, b);
  assert_int_equal(decode(b, sizeof b, &d), 0);
  assert_int_equal(d.length, MAXP);
}

/* Encodes h, expects rc, and that *out was left untouched. */
static void expect_reject(const wg_frame_header_t *h, int rc) {
  uint8_t b[WG_FRAME_HEADER_SIZE];
  wg_frame_encode(h, b);
  wg_frame_header_t out;
  memset(&out, 0x5a, sizeof out);
  wg_frame_header_t before = out;
  assert_int_equal(decode(b, sizeof b, &out), rc);
  assert_memory_equal(&out, &before, sizeof out);
}

static void test_each_validation_failure(void **state) {
  (void)state;
  wg_frame_header_t h;
  h = valid_header();
  h.magic = 0x414d4758u;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.magic = 0;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.version = 0;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.version = 2;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.kind = 0;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.kind = WG_FRAME_KIND_MAX + 1;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.kind = 0xffff;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.reserved = 1;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.reserved = 0x80000000u;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.length = MAXP + 1;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.length = UINT64_MAX;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.src = NRANKS;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.src = UINT32_MAX;
  expect_reject(&h, WAGMA_EPROTO);
  h = valid_header();
  h.epoch = EPOCH + 1;
  expect_reject(&h, WAGMA_EEPOCH);
  h = valid_header();
  h.epoch = EPOCH - 1;
  expect_reject(&h, WAGMA_EEPOCH);
  /* A corrupt header is EPROTO even when its epoch is also wrong. */
  h = valid_header();
  h.epoch = 99;
  h.magic = 1;
  expect_reject(&h, WAGMA_EPROTO);
}

static void test_short_input(void **state) {
  (void)state;
  wg_frame_header_t h = valid_header(), d;
  uint8_t b[WG_FRAME_HEADER_SIZE];
  wg_frame_encode(&h, b);
  for (size_t len = 0; len < WG_FRAME_HEADER_SIZE; len++) {
    /* Copy into an exact-size heap block so ASan catches any read past len. */
    uint8_t *p = malloc(len ? len : 1);
    memcpy(p, b, len);
    assert_int_equal(decode(p, len, &d), WAGMA_EPROTO);
    free(p);
  }
  assert_int_equal(decode(NULL, 64, &d), WAGMA_EPROTO);
  assert_int_equal(decode(b, sizeof b, NULL), 0); /* out may be NULL: validate only */
}

/* Property: decode either fails or yields a header that re-encodes to the same bytes. */
static void check_any(const uint8_t *buf, size_t len) {
  wg_frame_header_t d;
  int rc = decode(buf, len, &d);
  assert_true(rc == 0 || rc == WAGMA_EPROTO || rc == WAGMA_EEPOCH);
  if (rc == 0) {
    uint8_t again[WG_FRAME_HEADER_SIZE];
    wg_frame_encode(&d, again);
    assert_memory_equal(again, buf, WG_FRAME_HEADER_SIZE);
    assert_true(d.length <= MAXP && d.src < NRANKS && d.epoch == EPOCH);
  }
}

static void test_random_input_never_crashes(void **state) {
  (void)state;
  rng_state = 12345;
  int accepted = 0;
  for (int i = 0; i < 50000; i++) {
    size_t len = (size_t)(rng() % 80);
    uint8_t *buf = malloc(len ? len : 1);
    if (i % 2 == 0) { /* pure noise */
      for (size_t j = 0; j < len; j++)
        buf[j] = (uint8_t)rng();
    } else { /* a valid header, truncated and/or with a few bits flipped */
      wg_frame_header_t h = valid_header();
      h.src = (uint32_t)(rng() % NRANKS);
      h.length = rng() % (MAXP + 1);
      uint8_t full[80] = {0};
      wg_frame_encode(&h, full);
      memcpy(buf, full, len);
      int flips = (int)(rng() % 3);
      for (int f = 0; f < flips && len > 0; f++)
        buf[rng() % len] ^= (uint8_t)(1u << (rng() % 8));
    }
    wg_frame_header_t d;
    if (decode(buf, len, &d) == 0)
      accepted++;
    check_any(buf, len);
    free(buf);
  }
  /* Some flipped headers stay valid (flips in round/seq/aux...), noise essentially never. */
  assert_true(accepted > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_little_endian),       cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_each_validation_failure),    cmocka_unit_test(test_short_input),
      cmocka_unit_test(test_random_input_never_crashes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
