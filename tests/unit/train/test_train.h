/* Shared declarations of the test_train executable (one cmocka binary, several groups). */
#ifndef WAGMA_TEST_TRAIN_H
#define WAGMA_TEST_TRAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "agent/train/train.h"

int train_elementwise_tests(void);
int train_backend_tests(void);
int train_layer_tests(void);
int train_optim_tests(void);
int train_data_tests(void);
int train_run_tests(void);
/* The conformance suite of a device backend against the CPU (conformance.c). */
int train_conformance_tests(wagma_backend_t *device);
/* "cuda-emu": the CUDA backend's algorithm on the host (emu_backend.c); wagma_backend_close. */
wagma_backend_t *test_emu_backend_open(void);

/* A fresh directory under $TMPDIR (or /tmp) for files a test writes; removed by
 * test_rmtree. */
void test_mkdtemp(char *out, size_t len);
void test_rmtree(const char *dir);

#endif
