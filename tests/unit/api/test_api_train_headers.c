/* Guards that the REST/etcd contract (wagma/api.h) and the agent's training library
 * (agent/train/train.h) can be included in one translation unit, as the agent's runner does:
 * the api's job-spec kinds are wagma_model_kind_t / wagma_dataset_kind_t (WAGMA_MODEL_*,
 * WAGMA_DATASET_*), the library's architectures WAGMA_ARCH_* and its objects wagma_model_t /
 * wagma_dataset_t. A clash of names fails this file's build. The test also checks that every
 * model name the api accepts is one the training library's model parser knows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "agent/train/train.h"
#include "wagma/api.h"

/* both sides' types in one scope */
typedef struct both {
  wagma_model_kind_t kind;
  wagma_dataset_kind_t dataset_kind;
  enum wagma_train_arch arch;
  wagma_dataset_t *dataset;
  wagma_model_t *model;
  wagma_checkpoint_record_t record;
} both_t;

static void test_api_model_names_parse_as_architectures(void **state) {
  (void)state;
  static const struct {
    wagma_model_kind_t kind;
    int arch;
  } map[] = {
      {WAGMA_MODEL_SOFTMAX, WAGMA_ARCH_SOFTMAX},
      {WAGMA_MODEL_MLP, WAGMA_ARCH_MLP},
      {WAGMA_MODEL_LENET5, WAGMA_ARCH_LENET5},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
    wagma_model_config_t cfg;
    char err[256] = "";
    const char *name = wagma_model_name(map[i].kind);
    assert_int_equal(wagma_model_config_parse(name, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.arch, map[i].arch);
  }
}

static void test_both_sides_in_one_struct(void **state) {
  (void)state;
  both_t b;
  memset(&b, 0, sizeof b);
  b.kind = WAGMA_MODEL_LENET5;
  b.dataset_kind = WAGMA_DATASET_SYNTHETIC;
  b.arch = WAGMA_ARCH_LENET5;
  assert_string_equal(wagma_model_name(b.kind), "lenet5");
  assert_string_equal(wagma_dataset_name(b.dataset_kind), "synthetic");
  assert_int_equal(wagma_model_defaults(b.arch).arch, WAGMA_ARCH_LENET5);
  assert_null(b.model);
  assert_null(b.dataset);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_api_model_names_parse_as_architectures),
      cmocka_unit_test(test_both_sides_in_one_struct),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
