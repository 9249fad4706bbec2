/* test_train: unit tests of agent/train (element-wise math, the backend interface on the CPU,
 * layers, models, optimizers, data, checkpoints, short training runs). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_train.h"

void test_mkdtemp(char *out, size_t len) {
  const char *base = getenv("TMPDIR");
  snprintf(out, len, "%s/wagma-train-XXXXXX", base && *base ? base : "/tmp");
  assert_non_null(mkdtemp(out));
}

/* Removes the files a test created in dir (flat, no subfolders), then dir. */
void test_rmtree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  char path[4200];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
      unlink(path);
    }
  closedir(d);
  rmdir(dir);
}

int main(void) {
  int failed = 0;
  failed += train_elementwise_tests();
  failed += train_backend_tests();
  failed += train_layer_tests();
  failed += train_optim_tests();
  failed += train_data_tests();
  failed += train_run_tests();
  return failed ? 1 : 0;
}
