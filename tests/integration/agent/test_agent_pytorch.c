/* test_agent_pytorch.c — the PyTorch example (examples/pytorch/fmnist_cnn.py) trained by 4 real
 * agents (issue 25): a real etcd, a real wagma-coordinator, 4 wagma-agent processes with
 * --programs, real PyTorch (Debian's python3-torch, CPU) through the Python package
 * (python/wagma, ctypes over the build's libwagma).
 *
 *  - under wagma, allreduce and local-sgd the job succeeds, every member's test accuracy is
 *    above ACC_BOUND and the members' models ended close (fingerprints before the final
 *    average, within test_agent's bound);
 *  - a member's program SIGKILLed mid-run is restarted and rejoins as a joiner within the
 *    lease TTL + 1 s (its new process receives the parameters and the optimizer state: the
 *    library's log line says how many floats of state came, not 0), the others keep their PIDs,
 *    and the
 *    job still succeeds above ACC_BOUND;
 *  - PATCH scales a running job down to 3 and up to 4 again: each change is a new epoch, and
 *    the job succeeds.
 * Skipped (exit 77) without /usr/bin/python3 and torch. Not in sanitizer builds (CMake): an
 * instrumented libwagma cannot be loaded into an uninstrumented Python. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"
#include "process.h"

#define ACC_BOUND 0.75
#define SPREAD_BOUND 0.05 /* test_agent.c's: fingerprints of models that were averaged */
#define SPEC                                                                                       \
  "\"program\":{\"name\":\"fmnist_cnn\"},\"workers\":4,\"min_workers\":2,\"group_size\":2,"        \
  "\"staleness_bound\":4,\"batch_size\":32"

static char programs_dir[256], env_path[600], env_lib[600];
static const char *agent_args[20];

static int setup(void **state) {
  snprintf(programs_dir, sizeof programs_dir, "/tmp/wagma-pytorch.XXXXXX");
  if (!mkdtemp(programs_dir))
    return -1;
  char path[512];
  snprintf(path, sizeof path, "%s/fmnist_cnn", programs_dir);
  if (symlink(getenv("WAGMA_PYTORCH_EXAMPLE"), path) != 0)
    return -1;
  snprintf(env_path, sizeof env_path, "PYTHONPATH=%s", getenv("WAGMA_PYTHON_DIR"));
  snprintf(env_lib, sizeof env_lib, "WAGMA_LIBRARY=%s", getenv("WAGMA_LIBRARY_PATH"));
  int n = 0;
  agent_args[n++] = "--lease-ttl";
  agent_args[n++] = "3";
  agent_args[n++] = "--progress-interval";
  agent_args[n++] = "0.2";
  agent_args[n++] = "--programs";
  agent_args[n++] = programs_dir;
  agent_args[n++] = "--program-env";
  agent_args[n++] = env_path;
  agent_args[n++] = "--program-env";
  agent_args[n++] = env_lib;
  agent_args[n++] = "--program-grace";
  agent_args[n++] = "5";
  agent_args[n] = NULL;
  return cluster_group_setup(state, 4, agent_args);
}

static int teardown(void **state) {
  int rc = cluster_group_teardown(state);
  char path[512];
  snprintf(path, sizeof path, "%s/fmnist_cnn", programs_dir);
  unlink(path);
  rmdir(programs_dir);
  return rc;
}

static void check_result(cluster_t *c, const char *job, job_view_t *v) {
  if (cluster_job_wait_state(c, job, "succeeded", 240, v) != 0 ||
      strcmp(v->state, "succeeded") != 0) {
    fprintf(stderr, "job %s: %s (%s)\n", job, v->state, v->reason);
    cluster_dump_logs(c);
  }
  assert_string_equal(v->state, "succeeded");
  double spread = job_fingerprint_spread(v);
  fprintf(stderr, "  %s: accuracy %.4f (%.4f-%.4f over %d), spread %.2e, %.1f s\n", job,
          v->summary.accuracy_mean, v->summary.accuracy_min, v->summary.accuracy_max,
          v->summary.evaluated, spread, v->summary.wall_time);
  assert_true(v->summary.evaluated >= 3);
  assert_true(v->summary.accuracy_min > ACC_BOUND);
  assert_true(spread >= 0 && spread < SPREAD_BOUND); /* before the final average: close */
}

static void train(cluster_t *c, const char *algorithm) {
  job_view_t v;
  char job[64];
  snprintf(job, sizeof job, "torch-%s", algorithm);
  assert_int_equal(
      cluster_job_submit(c, "{\"name\":\"%s\",\"algorithm\":\"%s\",\"iterations\":300," SPEC "}",
                         job, algorithm),
      0);
  check_result(c, job, &v);
}

static void test_wagma(void **state) {
  train(*state, "wagma");
}
static void test_allreduce(void **state) {
  train(*state, "allreduce");
}
static void test_local_sgd(void **state) {
  train(*state, "local-sgd");
}

static void test_program_killed(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  assert_int_equal(cluster_job_submit(c, "{\"name\":\"torch-kill\",\"iterations\":600," SPEC "}"),
                   0);
  assert_true(cluster_wait_training(c, "torch-kill", 0, 4, 30, 60, &v) >= 0);
  uint64_t epoch = v.epoch;
  int idx[4];
  pid_t pids[4];
  for (int i = 0; i < 4; i++) {
    idx[i] = cluster_agent_index(c, v.members[i].name);
    pids[i] = cluster_program_pid(c, idx[i], "torch-kill");
    assert_true(pids[i] > 0);
  }
  assert_int_equal(kill(pids[2], SIGKILL), 0);
  double t0 = cluster_now();
  /* a new epoch with the killed member as a joiner, planned without waiting for a lease */
  int replanned = 0;
  while (!replanned && cluster_now() - t0 < 3 + 1) {
    replanned = cluster_job_get(c, "torch-kill", &v) == 0 && v.epoch > epoch && v.nmembers == 4;
    if (!replanned)
      cluster_sleep(0.05);
  }
  fprintf(stderr, "  epoch %llu planned %.2f s after the kill\n", (unsigned long long)v.epoch,
          cluster_now() - t0);
  assert_true(replanned);
  /* the restarted process loads Python and torch before it joins: it trains in the new epoch */
  double waited = cluster_wait_training(c, "torch-kill", epoch, 4, 5, 60, &v);
  fprintf(stderr, "  4 members training again %.1f s after the kill\n", cluster_now() - t0);
  assert_true(waited >= 0);
  for (int i = 0; i < 4; i++)
    if (i != 2)
      assert_int_equal(cluster_program_pid(c, idx[i], "torch-kill"), pids[i]);
  assert_true(cluster_program_pid(c, idx[2], "torch-kill") != pids[2]);
  /* the new process received the parameters and the optimizer's state (SGD with momentum:
   * one buffer per parameter) */
  assert_int_equal(cluster_agent_log_count(c, idx[2], "joined: model and", "torch-kill"), 1);
  assert_int_equal(cluster_agent_log_count(c, idx[2], "joined: model and 0 floats", "torch-kill"),
                   0);
  check_result(c, "torch-kill", &v);
}

static void test_scale(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  assert_int_equal(cluster_job_submit(c, "{\"name\":\"torch-scale\",\"iterations\":800," SPEC "}"),
                   0);
  assert_true(cluster_wait_training(c, "torch-scale", 0, 4, 20, 60, &v) >= 0);
  uint64_t epoch = v.epoch;
  assert_int_equal(cluster_job_patch_workers(c, "torch-scale", 3), 0);
  assert_true(cluster_wait_training(c, "torch-scale", epoch, 3, 20, 60, &v) >= 0);
  epoch = v.epoch;
  assert_int_equal(cluster_job_patch_workers(c, "torch-scale", 4), 0);
  assert_true(cluster_wait_training(c, "torch-scale", epoch, 4, 5, 60, &v) >= 0);
  check_result(c, "torch-scale", &v);
}

static int torch_missing(void) {
  if (access("/usr/bin/python3", X_OK) != 0)
    return 1;
  int st = system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1");
  return st != 0;
}

int main(void) {
  if (!getenv("WAGMA_PYTORCH_EXAMPLE") || !getenv("WAGMA_PYTHON_DIR") ||
      !getenv("WAGMA_LIBRARY_PATH")) {
    fprintf(stderr,
            "WAGMA_PYTORCH_EXAMPLE, WAGMA_PYTHON_DIR, WAGMA_LIBRARY_PATH: CMake sets them\n");
    return 1;
  }
  if (torch_missing()) {
    fprintf(stderr, "test_agent_pytorch: SKIPPED: /usr/bin/python3 with torch is not installed "
                    "(scripts/deps.sh installs python3-torch)\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wagma),     cmocka_unit_test(test_allreduce),
      cmocka_unit_test(test_local_sgd), cmocka_unit_test(test_program_killed),
      cmocka_unit_test(test_scale),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
