/* test_train_gpu (ctest label "gpu"): the conformance suite (conformance.c) against the real
 * CUDA backend. Needs a CUDA GPU: where there is none, or the build has no CUDA backend, it
 * prints "SKIP: <cause>" and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE 77).
 * scripts/gpu-check.sh runs it on a GPU machine. */
#include <stdio.h>

#include "agent/train/train.h"
#include "test_train.h"

int main(void) {
  char err[256] = "";
  wagma_backend_t *gpu = NULL;
  int rc = wagma_backend_open("cuda", &gpu, err, sizeof(err));
  if (rc) {
    printf("SKIP: no CUDA GPU for the gpu tests: %s (%s)\n", err, wagma_strerror(rc));
    return 77;
  }
  printf("test_train_gpu on %s\n", wagma_backend_name(gpu));
  int failed = train_conformance_tests(gpu);
  wagma_backend_close(gpu);
  return failed ? 1 : 0;
}
