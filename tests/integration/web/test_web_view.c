/* test_web_view.c — the web view in a real browser (issue 14): etcd, wagma-coordinator and 4
 * agents on 127.0.0.1 (cluster.c), a wagma job running, then web_view.mjs opens the page in
 * headless Chromium (playwright-core, Debian's chromium): the job on the jobs list, its groups
 * drawn and changing phase, one agent killed by PID and its new epoch on the timeline with the
 * reason, the accuracy curve, a screenshot (WAGMA_WEB_SCREENSHOT names where; default
 * <build>/tests/integration/web/web-view.png); then a spec's warning on its page and the
 * stopped job's result (status summary) on its page, timeline and the jobs list. Skipped (exit 77)
 * without chromium, node or playwright-core, with the reason on stderr. Everything stopped by PID.
 */
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

static const char *agent_args[] = {"--lease-ttl",
                                   "2",
                                   "--progress-interval",
                                   "0.2",
                                   "--round-deadline",
                                   "0.3",
                                   "--synthetic-train",
                                   "4096",
                                   "--synthetic-test",
                                   "1024",
                                   "--eval-samples",
                                   "256",
                                   "--sleep-prob",
                                   "1",
                                   "--sleep-ms",
                                   "4",
                                   NULL};

static const char *node_bin(void) {
  return access("/usr/bin/node", X_OK) == 0 ? "/usr/bin/node" : "/usr/local/bin/node";
}

static int skip_reason(char *why, size_t len) {
  const char *tools = getenv("WAGMA_TOOLS");
  char path[512];
  if (access("/usr/bin/chromium", X_OK) != 0) {
    snprintf(why, len, "/usr/bin/chromium is not installed (scripts/deps.sh installs it)");
    return 1;
  }
  if (access(node_bin(), X_OK) != 0) {
    snprintf(why, len, "node is not installed (scripts/deps.sh installs it)");
    return 1;
  }
  snprintf(path, sizeof path, "%s/node_modules/playwright-core/package.json", tools ? tools : "");
  if (!tools || access(path, R_OK) != 0) {
    snprintf(why, len, "playwright-core is not in %s (scripts/deps.sh installs it)",
             tools ? tools : "$WAGMA_TOOLS");
    return 1;
  }
  return 0;
}

static void test_web_view(void **state) {
  (void)state;
  cluster_t c;
  char body[1024], shot[512], pid[32];
  long st = 0;
  double t0 = cluster_now();
  const char *const coord_args[] = {"--sse-heartbeat-ms", "2000", NULL};
  assert_int_equal(cluster_start_with(&c, 4, agent_args, coord_args), 0);
  snprintf(body, sizeof body,
           "{\"name\":\"web\",\"model\":\"softmax\",\"dataset\":\"synthetic\",\"workers\":4,"
           "\"min_workers\":2,\"group_size\":2,\"staleness_bound\":4,\"batch_size\":32,"
           "\"iterations\":1000000,\"eval_every\":20,\"optimizer\":{\"type\":\"sgd\",\"lr\":0.002,"
           "\"momentum\":0}}");
  char *resp = NULL;
  assert_int_equal(cluster_http(&c, "POST", "/v1/jobs", body, &st, &resp), 0);
  free(resp);
  assert_int_equal(st, 201);
  job_view_t v;
  int running = 0;
  for (double t = cluster_now(); !running && cluster_now() - t < 30; cluster_sleep(0.2))
    running = cluster_job_get(&c, "web", &v) == 0 && strcmp(v.state, "running") == 0 &&
              job_min_iteration(&v) > 0;
  if (!running)
    cluster_dump_logs(&c);
  assert_true(running);
  /* The member with the highest rank goes (any would do). */
  const char *victim = v.members[v.nmembers - 1].name;
  int vi = -1;
  for (int i = 0; i < c.nagents; i++)
    if (strcmp(c.agent_name[i], victim) == 0)
      vi = i;
  assert_true(vi >= 0);
  snprintf(pid, sizeof pid, "%d", (int)c.agent[vi]);
  if (getenv("WAGMA_WEB_SCREENSHOT"))
    snprintf(shot, sizeof shot, "%s", getenv("WAGMA_WEB_SCREENSHOT"));
  else
    snprintf(shot, sizeof shot, "%s/web-view.png",
             getenv("WAGMA_WEB_OUT") ? getenv("WAGMA_WEB_OUT") : ".");
  const char *argv[] = {node_bin(), getenv("WAGMA_WEB_SCRIPT"), c.api, "web", pid, victim,
                        shot,       getenv("WAGMA_TOOLS"),      NULL};
  double tb = cluster_now();
  pid_t node = proc_spawn(argv, NULL, NULL);
  assert_true(node > 0);
  int status = 0, rc = -1;
  while (cluster_now() - tb < 75) {
    pid_t w = waitpid(node, &status, WNOHANG);
    if (w == node) {
      rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
      break;
    }
    cluster_sleep(0.1);
  }
  if (rc < 0) {
    proc_stop(node, SIGKILL, 1);
    fprintf(stderr, "web_view.mjs did not finish within 75 s\n");
  }
  fprintf(stderr, "browser part: %.1f s, whole test: %.1f s, screenshot %s\n", cluster_now() - tb,
          cluster_now() - t0, shot);
  if (rc != 0)
    cluster_dump_logs(&c);
  cluster_stop(&c);
  assert_int_equal(rc, 0);
  struct stat sb;
  assert_int_equal(stat(shot, &sb), 0);
  assert_true(sb.st_size > 10000);
}

int main(void) {
  char why[512];
  if (skip_reason(why, sizeof why)) {
    fprintf(stderr, "test_web_view: SKIPPED: %s\n", why);
    return 77;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_web_view)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
