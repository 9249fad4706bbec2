/* test_agent_encrypt.c — data-plane encryption end to end, with real processes (etcd,
 * wagma-coordinator, 3 wagma-agents with --encrypt-data-plane on 127.0.0.1, synthetic data):
 *  - a wagma job of 3 members trains to a useful accuracy, every member joins its epoch with
 *    the data plane "authenticated and encrypted", and the members' final models agree;
 *  - --encrypt-data-plane with --transport nccl is a usage error (exit 2) that says why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "cluster.h"
#include "process.h"

static const char *const agent_args[] = {"--encrypt-data-plane",
                                         "--lease-ttl",
                                         "3",
                                         "--progress-interval",
                                         "0.2",
                                         "--synthetic-train",
                                         "2048",
                                         "--synthetic-test",
                                         "512",
                                         "--eval-samples",
                                         "512",
                                         "--linger",
                                         "5",
                                         NULL};

static int setup(void **state) {
  return cluster_group_setup(state, 3, agent_args);
}

static int teardown(void **state) {
  return cluster_group_teardown(state);
}

/* How many lines of file contain text. */
static int lines_with(const char *file, const char *text) {
  FILE *f = fopen(file, "r");
  char line[2048];
  int n = 0;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    n += strstr(line, text) != NULL;
  if (f != NULL)
    fclose(f);
  return n;
}

static void encrypted_job_trains_and_its_members_agree(void **state) {
  cluster_t *c = *state;
  job_view_t v;
  assert_int_equal(cluster_job_submit(c, "{\"name\":\"sealed\",\"model\":\"softmax\",\"dataset\":"
                                         "\"synthetic\",\"algorithm\":\"wagma\",\"workers\":3,"
                                         "\"group_size\":2,\"staleness_bound\":4,\"batch_size\":32,"
                                         "\"iterations\":1500,\"eval_every\":100000}"),
                   0);
  if (cluster_job_wait_state(c, "sealed", "succeeded", 120, &v) != 0) {
    cluster_dump_logs(c);
    fail_msg("the encrypted job did not succeed");
  }
  int done = 0;
  for (int m = 0; m < v.nmembers; m++) {
    print_message("%s: %s, accuracy %.4f\n", v.members[m].name, v.members[m].state,
                  v.members[m].accuracy);
    if (strcmp(v.members[m].state, "done") == 0) {
      done++;
      assert_true(v.members[m].accuracy > 0.9);
    }
  }
  assert_int_equal(done, 3);
  double spread = job_fingerprint_spread(&v);
  print_message("model spread %.4f\n", spread);
  assert_true(spread >= 0 && spread <= 0.05);
  int encrypted = 0, clear = 0;
  for (int i = 0; i < c->nagents; i++) {
    char log[320];
    snprintf(log, sizeof log, "%s/agent-%d.log", c->dir, i);
    encrypted += lines_with(log, "data plane authenticated and encrypted") > 0;
    clear += lines_with(log, "data plane authenticated,") + lines_with(log, "UNAUTHENTICATED");
  }
  print_message("%d of %d agents joined encrypted, %d joins without encryption\n", encrypted,
                c->nagents, clear);
  assert_int_equal(encrypted, 3);
  assert_int_equal(clear, 0);
}

static void encryption_with_nccl_is_a_usage_error(void **state) {
  cluster_t *c = *state;
  char log[320];
  snprintf(log, sizeof log, "%s/usage.log", c->dir);
  const char *argv[] = {getenv("WAGMA_AGENT_BIN"),
                        "--etcd",
                        etcd_fixture_endpoints(c->etcd),
                        "--name",
                        "usage",
                        "--listen",
                        "127.0.0.1:1",
                        "--device",
                        "cuda",
                        "--transport",
                        "nccl",
                        "--encrypt-data-plane",
                        NULL};
  pid_t pid = proc_spawn(argv, log, NULL);
  assert_true(pid > 0);
  int st = proc_wait(pid, 10);
  assert_true(st >= 0 && WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 2);
  assert_int_equal(lines_with(log, "--encrypt-data-plane needs --transport tcp"), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(encrypted_job_trains_and_its_members_agree),
      cmocka_unit_test(encryption_with_nccl_is_a_usage_error),
  };
  return cmocka_run_group_tests_name("agent_encrypt", tests, setup, teardown);
}
