/* test_train: unit tests of agent/train (element-wise math, the backend interface on the CPU,
 * layers, models, optimizers, data, checkpoints, short training runs, and the conformance suite
 * against the host emulation of the CUDA backend). */
#include <stdio.h>

#include "test_train.h"

int main(void) {
  int failed = 0;
  failed += train_elementwise_tests();
  failed += train_backend_tests();
  failed += train_layer_tests();
  failed += train_optim_tests();
  failed += train_data_tests();
  failed += train_run_tests();
  /* The CUDA backend's algorithm, emulated on the host, against the CPU backend. */
  wagma_backend_t *emu = test_emu_backend_open();
  if (!emu) {
    fprintf(stderr, "out of memory for the emulated backend\n");
    return 1;
  }
  failed += train_conformance_tests(emu);
  wagma_backend_close(emu);
  return failed ? 1 : 0;
}
