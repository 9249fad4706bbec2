/* test_gpu_env: wg_gpu_visible_devices (agent/gpu.c), the CUDA_VISIBLE_DEVICES an agent sets
 * for `--gpu N`: N itself when nothing is inherited, else the N-th entry of the inherited list
 * (indices, UUIDs, MIG ids; spaces dropped), and a clear refusal for an empty list, an index
 * past its end, an empty entry, an index out of range and an output buffer too small. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "agent/gpu.h"

typedef struct row {
  const char *inherited;
  int index;
  const char *want;    /* NULL: refused */
  const char *because; /* a part of the refusal's reason */
} row_t;

static const row_t rows[] = {
    {NULL, 0, "0", NULL},
    {NULL, 3, "3", NULL},
    {NULL, WG_GPU_MAX, "1023", NULL},
    {"2,3", 0, "2", NULL},
    {"2,3", 1, "3", NULL},
    {"2,3", 2, NULL, "lists 2 devices"},
    {"7", 1, NULL, "lists 1 device"},
    {" 4 , 5 ", 1, "5", NULL},
    {"GPU-8f0c1a2b-0000-1111-2222-333344445555,GPU-aa", 0,
     "GPU-8f0c1a2b-0000-1111-2222-333344445555", NULL},
    {"MIG-0a1b,MIG-2c3d", 1, "MIG-2c3d", NULL},
    {"", 0, NULL, "no GPU is visible"},
    {"0,,1", 2, NULL, "empty entry"},
    {"0, ", 1, NULL, "empty entry"},
    {NULL, -1, NULL, "0..1023"},
    {NULL, WG_GPU_MAX + 1, NULL, "0..1023"},
};

static void test_rows(void **s) {
  (void)s;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    char out[64] = "untouched", err[256] = "";
    int rc =
        wg_gpu_visible_devices(rows[i].inherited, rows[i].index, out, sizeof out, err, sizeof err);
    print_message("'%s' [%d] -> %d '%s' %s\n", rows[i].inherited ? rows[i].inherited : "(unset)",
                  rows[i].index, rc, rc == 0 ? out : "", err);
    if (rows[i].want) {
      assert_int_equal(rc, 0);
      assert_string_equal(out, rows[i].want);
    } else {
      assert_int_equal(rc, -1);
      assert_non_null(strstr(err, rows[i].because));
    }
  }
}

static void test_output_too_small(void **s) {
  (void)s;
  char out[4], err[256] = "";
  assert_int_equal(wg_gpu_visible_devices("GPU-8f0c1a2b", 0, out, sizeof out, err, sizeof err), -1);
  assert_non_null(strstr(err, "too long"));
  assert_int_equal(wg_gpu_visible_devices(NULL, 12345 % 1000, out, 3, err, sizeof err), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rows),
      cmocka_unit_test(test_output_too_small),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
