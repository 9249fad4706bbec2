/* Unit tests of the shared status table and log helper. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "wagma/log_internal.h"
#include "wagma/status.h"

static void every_code_has_its_own_text(void **state) {
  (void)state;
  assert_string_equal(wagma_strerror(WAGMA_OK), "ok");
  for (int code = WAGMA_EINVAL; code >= WAGMA_EINTERNAL; code--) {
    const char *text = wagma_strerror(code);
    assert_non_null(text);
    assert_string_not_equal(text, "unknown status");
    for (int other = code + 1; other <= WAGMA_OK; other++)
      assert_string_not_equal(text, wagma_strerror(other));
  }
  assert_string_equal(wagma_strerror(-1000), "unknown status");
  assert_string_equal(wagma_strerror(5), "unknown status");
}

static char captured[64];
static int captured_level = -1;
static void capture(void *user, int level, const char *msg) {
  *(int *)user += 1;
  captured_level = level;
  strncpy(captured, msg, sizeof captured - 1);
}

static void log_helper_formats_and_tolerates_null(void **state) {
  (void)state;
  int calls = 0;
  wg_logf(NULL, NULL, WAGMA_LOG_INFO, "dropped %d", 1);
  wg_logf(capture, &calls, WAGMA_LOG_WARN, "peer %d of %s", 3, "job");
  assert_int_equal(calls, 1);
  assert_int_equal(captured_level, WAGMA_LOG_WARN);
  assert_string_equal(captured, "peer 3 of job");
  assert_string_equal(wagma_log_level_name(WAGMA_LOG_ERROR), "error");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_code_has_its_own_text),
      cmocka_unit_test(log_helper_formats_and_tolerates_null),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
