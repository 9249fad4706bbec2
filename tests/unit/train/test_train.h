/* Shared declarations of the test_train executable (one cmocka binary, several groups). */
#ifndef WAGMA_TEST_TRAIN_H
#define WAGMA_TEST_TRAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

int train_elementwise_tests(void);
int train_backend_tests(void);
int train_layer_tests(void);
int train_optim_tests(void);
int train_data_tests(void);
int train_run_tests(void);

/* A fresh directory under $TMPDIR (or /tmp) for files a test writes; removed by
 * test_rmtree. */
void test_mkdtemp(char *out, size_t len);
void test_rmtree(const char *dir);

#endif
