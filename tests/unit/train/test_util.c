/* Helpers shared by the test_train and test_train_gpu executables. */
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
