/* test_agent_ckroot.c — the agent's checkpoint root (agent/ckroot.c): checkpoints are written
 * and read only below it.
 *  - the path rule: relative, no empty / "." / ".." component, no control character;
 *  - save creates the directories of checkpoint.path below the root, load reads the file back;
 *  - refused: an absolute path, "..", a symbolic link anywhere below the root (a directory
 *    link to a directory outside, a file link to a valid checkpoint outside, a link planted at
 *    the temporary file's name), a FIFO (refused at once, never waited on); nothing outside
 *    the root is read or written;
 *  - the root itself may be a link (resolved once, at open), and must exist. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/ckroot.h"
#include "agent/train/train.h"

static char base[256], root_dir[300], outside[300];

static void sh(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  assert_int_equal(system(cmd), 0);
}

static int setup(void **state) {
  (void)state;
  snprintf(base, sizeof base, "%s/wagma-ckroot.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(base))
    return -1;
  snprintf(root_dir, sizeof root_dir, "%s/root", base);
  snprintf(outside, sizeof outside, "%s/outside", base);
  if (mkdir(root_dir, 0755) != 0 || mkdir(outside, 0755) != 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", base); /* our own mkdtemp directory */
  return system(cmd) == 0 ? 0 : -1;
}

static wagma_model_t *model(uint64_t seed) {
  char err[256];
  wagma_model_t *m = NULL;
  wagma_model_config_t mc = wagma_model_defaults(WAGMA_ARCH_SOFTMAX);
  assert_int_equal(wagma_model_create(&mc, &m, err, sizeof err), 0);
  wagma_model_init(m, seed);
  return m;
}

static long file_size(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void test_path_rule(void **state) {
  (void)state;
  const char *ok[] = {"a", "a/b", "ckpt/runs-1/x.y", "..a", "a..", ".hidden"};
  const char *bad[] = {"",    "/a",    "/",    "..", ".",      "../a",  "a/..", "a/../b",
                       "./a", "a/./b", "a//b", "a/", "a\001b", "a\177", "a\nb"};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
    assert_null(wg_ckroot_path_problem(ok[i]));
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const char *why = wg_ckroot_path_problem(bad[i]);
    if (!why)
      fail_msg("'%s' was accepted", bad[i]);
  }
}

static void test_open_root(void **state) {
  (void)state;
  wg_ckroot_t r;
  char err[512], link[400], file[400];
  assert_int_not_equal(wg_ckroot_open("/nonexistent/wagma", &r, err, sizeof err), 0);
  assert_non_null(strstr(err, "No such file"));
  assert_int_equal(r.fd, -1);
  snprintf(file, sizeof file, "%s/plain", base);
  sh("echo x > '%s'", file);
  assert_int_not_equal(wg_ckroot_open(file, &r, err, sizeof err), 0);
  assert_non_null(strstr(err, "Not a directory"));
  /* a root that is itself a link is resolved once */
  snprintf(link, sizeof link, "%s/root-link", base);
  assert_int_equal(symlink(root_dir, link), 0);
  assert_int_equal(wg_ckroot_open(link, &r, err, sizeof err), 0);
  char real[PATH_MAX];
  assert_non_null(realpath(root_dir, real));
  assert_string_equal(r.path, real);
  wg_ckroot_close(&r);
  /* "" is the current directory */
  assert_int_equal(wg_ckroot_open("", &r, err, sizeof err), 0);
  char cwd[PATH_MAX];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_string_equal(r.path, cwd);
  wg_ckroot_close(&r);
}

static void test_save_load_below_root(void **state) {
  (void)state;
  wg_ckroot_t r;
  char err[512], path[600];
  uint64_t it = 0;
  assert_int_equal(wg_ckroot_open(root_dir, &r, err, sizeof err), 0);
  wagma_model_t *m = model(1), *m2 = model(2);
  size_t n = wagma_model_param_count(m);
  assert_int_equal(wg_ckroot_save(&r, "jobs/run1", "j.ckpt", m, NULL, 42, err, sizeof err), 0);
  snprintf(path, sizeof path, "%s/jobs/run1/j.ckpt", root_dir);
  assert_true(file_size(path) > 96);
  assert_int_equal(wg_ckroot_load(&r, "jobs/run1/j.ckpt", m2, NULL, &it, err, sizeof err), 0);
  assert_int_equal(it, 42);
  assert_memory_equal(wagma_model_params(m), wagma_model_params(m2), n * sizeof(float));
  /* a file directly in the root */
  assert_int_equal(wg_ckroot_save(&r, "", "top.ckpt", m, NULL, 7, err, sizeof err), 0);
  assert_int_equal(wg_ckroot_load(&r, "top.ckpt", m2, NULL, &it, err, sizeof err), 0);
  assert_int_equal(it, 7);
  /* missing */
  assert_int_equal(wg_ckroot_load(&r, "jobs/none/j.ckpt", m2, NULL, &it, err, sizeof err),
                   WAGMA_ENOTFOUND);
  assert_int_equal(wg_ckroot_load(&r, "jobs/run1/none.ckpt", m2, NULL, &it, err, sizeof err),
                   WAGMA_ENOTFOUND);
  wagma_model_destroy(m);
  wagma_model_destroy(m2);
  wg_ckroot_close(&r);
}

static void test_escapes_refused(void **state) {
  (void)state;
  wg_ckroot_t r;
  char err[512], path[600], victim[600];
  uint64_t it = 99;
  assert_int_equal(wg_ckroot_open(root_dir, &r, err, sizeof err), 0);
  wagma_model_t *m = model(1), *m2 = model(2);
  size_t n = wagma_model_param_count(m);
  float *before = malloc(n * sizeof(float));
  memcpy(before, wagma_model_params(m2), n * sizeof(float));

  /* a valid checkpoint outside the root, which nothing below may reach */
  snprintf(victim, sizeof victim, "%s/secret.ckpt", outside);
  assert_int_equal(wagma_checkpoint_save(victim, m, NULL, 5, err, sizeof err), 0);
  long victim_size = file_size(victim);

  /* absolute and ".." paths, from the record (load) and from the spec (save) */
  assert_int_equal(wg_ckroot_load(&r, victim, m2, NULL, &it, err, sizeof err), WAGMA_EPERM);
  assert_non_null(strstr(err, "absolute"));
  assert_int_equal(wg_ckroot_load(&r, "../outside/secret.ckpt", m2, NULL, &it, err, sizeof err),
                   WAGMA_EPERM);
  assert_non_null(strstr(err, ".."));
  assert_int_equal(wg_ckroot_save(&r, "../outside", "x.ckpt", m, NULL, 1, err, sizeof err),
                   WAGMA_EPERM);
  assert_int_equal(wg_ckroot_save(&r, outside, "x.ckpt", m, NULL, 1, err, sizeof err), WAGMA_EPERM);
  snprintf(path, sizeof path, "%s/x.ckpt", outside);
  assert_int_equal(access(path, F_OK), -1);

  /* a directory link below the root pointing outside */
  snprintf(path, sizeof path, "%s/escape", root_dir);
  assert_int_equal(symlink(outside, path), 0);
  assert_int_equal(wg_ckroot_load(&r, "escape/secret.ckpt", m2, NULL, &it, err, sizeof err),
                   WAGMA_EPERM);
  assert_non_null(strstr(err, "symbolic link"));
  assert_int_equal(wg_ckroot_save(&r, "escape", "x.ckpt", m, NULL, 1, err, sizeof err),
                   WAGMA_EPERM);
  assert_int_equal(wg_ckroot_save(&r, "escape/deeper", "x.ckpt", m, NULL, 1, err, sizeof err),
                   WAGMA_EPERM);
  snprintf(path, sizeof path, "%s/x.ckpt", outside);
  assert_int_equal(access(path, F_OK), -1);
  snprintf(path, sizeof path, "%s/deeper", outside);
  assert_int_equal(access(path, F_OK), -1);
  /* ... also deeper down the path */
  snprintf(path, sizeof path, "%s/a/b", root_dir);
  sh("mkdir -p '%s'", path);
  snprintf(path, sizeof path, "%s/a/b/up", root_dir);
  assert_int_equal(symlink(outside, path), 0);
  assert_int_equal(wg_ckroot_load(&r, "a/b/up/secret.ckpt", m2, NULL, &it, err, sizeof err),
                   WAGMA_EPERM);

  /* a file link at the checkpoint's name pointing at the valid checkpoint outside */
  snprintf(path, sizeof path, "%s/files", root_dir);
  assert_int_equal(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/files/j.ckpt", root_dir);
  assert_int_equal(symlink(victim, path), 0);
  assert_int_equal(wg_ckroot_load(&r, "files/j.ckpt", m2, NULL, &it, err, sizeof err), WAGMA_EPERM);
  assert_non_null(strstr(err, "symbolic link"));
  /* saving replaces the link itself; the file it pointed at is untouched */
  assert_int_equal(wg_ckroot_save(&r, "files", "j.ckpt", m, NULL, 8, err, sizeof err), 0);
  struct stat st;
  assert_int_equal(lstat(path, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  assert_int_equal(file_size(victim), victim_size);

  /* a link planted at the temporary file's name: not written through */
  char tmp[700], target[600];
  snprintf(target, sizeof target, "%s/planted", outside);
  snprintf(tmp, sizeof tmp, "%s/files/k.ckpt.tmp.%ld", root_dir, (long)getpid());
  assert_int_equal(symlink(target, tmp), 0);
  assert_int_not_equal(wg_ckroot_save(&r, "files", "k.ckpt", m, NULL, 9, err, sizeof err), 0);
  assert_int_equal(access(target, F_OK), -1);

  /* a FIFO is refused at once, not waited on */
  snprintf(path, sizeof path, "%s/files/fifo.ckpt", root_dir);
  assert_int_equal(mkfifo(path, 0644), 0);
  time_t t0 = time(NULL);
  assert_int_not_equal(wg_ckroot_load(&r, "files/fifo.ckpt", m2, NULL, &it, err, sizeof err), 0);
  assert_true(time(NULL) - t0 < 2);
  assert_non_null(strstr(err, "not a regular file"));

  /* nothing refused changed the model or the iteration */
  assert_int_equal(it, 99);
  assert_memory_equal(before, wagma_model_params(m2), n * sizeof(float));
  free(before);
  wagma_model_destroy(m);
  wagma_model_destroy(m2);
  wg_ckroot_close(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_path_rule),
      cmocka_unit_test(test_open_root),
      cmocka_unit_test(test_save_load_below_root),
      cmocka_unit_test(test_escapes_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
