/* test_sse.c — the text/event-stream encoder and the bounded queue (coordinator/sse.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sse.h"
#include "coord.h"

static void expect_event(const char *id, const char *event, const char *data, const char *want) {
  size_t n = wg_sse_encode(NULL, 0, id, event, data);
  assert_int_equal(n, strlen(want));
  char *buf = malloc(n + 1);
  assert_int_equal(wg_sse_encode(buf, n + 1, id, event, data), n);
  assert_string_equal(buf, want);
  free(buf);
  size_t m = 0;
  char *s = wg_sse_event(id, event, data, &m);
  assert_int_equal(m, n);
  assert_string_equal(s, want);
  free(s);
}

static void test_encode(void **state) {
  (void)state;
  expect_event("7", "progress", "{\"a\":1}", "id: 7\nevent: progress\ndata: {\"a\":1}\n\n");
  expect_event(NULL, NULL, "x", "data: x\n\n");
  expect_event("", "", "", "data: \n\n");
  /* Every line of data on its own data: line, whatever its end (LF, CRLF, CR). */
  expect_event(NULL, "m", "a\nb\r\nc\rd", "event: m\ndata: a\ndata: b\ndata: c\ndata: d\n\n");
  expect_event(NULL, NULL, "end\n", "data: end\ndata: \n\n");
  /* A newline in id or event cannot start a field of its own. */
  expect_event("1\n2", "a\r\nevent: evil", "d", "id: 1 2\nevent: a  event: evil\ndata: d\n\n");
  /* Short buffers: the length is still told, and what fits is written. */
  char small[8];
  size_t n = wg_sse_encode(small, sizeof small, "123", "e", "data");
  assert_int_equal(n, strlen("id: 123\nevent: e\ndata: data\n\n"));
  assert_memory_equal(small, "id: 123\n", 8);
  char c[32];
  assert_int_equal(wg_sse_comment(c, sizeof c, "keepalive"), strlen(": keepalive\n\n"));
  assert_string_equal(c, ": keepalive\n\n");
  assert_int_equal(wg_sse_comment(c, sizeof c, "a\nb"), strlen(": a b\n\n"));
}

static void test_queue(void **state) {
  (void)state;
  wg_sse_queue_t q;
  char out[64];
  wg_sse_queue_init(&q, 10);
  assert_int_equal(wg_sse_queue_push(&q, "abcdef", 6), 0);
  assert_int_equal(wg_sse_queue_push(&q, "ghij", 4), 0);
  assert_int_equal(wg_sse_queue_pending(&q), 10);
  /* Over the limit: refused, nothing changed. */
  assert_int_equal(wg_sse_queue_push(&q, "k", 1), WAGMA_ERANGE);
  assert_int_equal(wg_sse_queue_pending(&q), 10);
  assert_int_equal(wg_sse_queue_pop(&q, out, 4), 4);
  assert_memory_equal(out, "abcd", 4);
  assert_int_equal(wg_sse_queue_push(&q, "klmn", 4), 0); /* room again, bytes kept in order */
  assert_int_equal(wg_sse_queue_push(&q, "o", 1), WAGMA_ERANGE);
  assert_int_equal(wg_sse_queue_pop(&q, out, sizeof out), 10);
  assert_memory_equal(out, "efghijklmn", 10);
  assert_int_equal(wg_sse_queue_pop(&q, out, sizeof out), 0);
  assert_int_equal(wg_sse_queue_push(&q, "0123456789A", 11), WAGMA_ERANGE);
  /* A long run through a bigger queue keeps every byte in order. */
  wg_sse_queue_free(&q);
  wg_sse_queue_init(&q, 1 << 16);
  unsigned char next = 0, want = 0;
  for (int round = 0; round < 2000; round++) {
    char chunk[97];
    size_t k = (size_t)(round % 97) + 1;
    for (size_t i = 0; i < k; i++)
      chunk[i] = (char)next++;
    if (wg_sse_queue_push(&q, chunk, k) != 0) {
      next -= (unsigned char)k;
      continue;
    }
    size_t got = wg_sse_queue_pop(&q, out, (size_t)(round % 50) + 1);
    for (size_t i = 0; i < got; i++)
      assert_int_equal((unsigned char)out[i], want++);
  }
  size_t got;
  while ((got = wg_sse_queue_pop(&q, out, sizeof out)) > 0)
    for (size_t i = 0; i < got; i++)
      assert_int_equal((unsigned char)out[i], want++);
  assert_int_equal(want, next);
  wg_sse_queue_free(&q);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_encode), cmocka_unit_test(test_queue)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
