/* test_agent_unavailable.c — agents that cannot serve their job (issue 9, items 2 and 7), end
 * to end: a real etcd, a real wagma-coordinator and real wagma-agent processes on 127.0.0.1.
 *
 *  - an agent whose --data-dir is broken is given a Fashion-MNIST job along with a healthy one
 *    while a third is free: it reports "unavailable", is quarantined (visible in
 *    GET /v1/agents with the reason), the job runs and succeeds on the two healthy agents; a
 *    second job goes to a healthy agent, not to the quarantined one (first in name order);
 *    restarted (registered anew) with good data it is healthy again.
 * (A taken --listen port fails the agent's start, exit 2: test_agent_programs' test_port_in_use.)
 * Before the fix the job failed ("agent agent-0 failed: setup failed").
 * Label timing: the bounds are wall-clock ones. Everything is stopped by PID (cluster.c). */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"

/* the program reports + progress write + scheduler pass, with slack for a loaded machine */
#define REASON_BOUND_S 12.0

#define submit(c, json) assert_int_equal(cluster_job_submit(c, "%s", json), 0)

/* "healthy" of agent name in GET /v1/agents (-1 when absent); *reason gets the quarantine
 * reason ("" when none). */
static int agent_healthy(const cluster_t *c, const char *name, char *reason, size_t len) {
  json_t *a = cluster_agent_get(c, name);
  if (reason)
    reason[0] = '\0';
  if (!a)
    return -1;
  int healthy = json_is_true(json_object_get(a, "healthy"));
  const char *why = json_string_value(json_object_get(json_object_get(a, "quarantine"), "reason"));
  if (reason && why)
    snprintf(reason, len, "%s", why);
  json_decref(a);
  return healthy;
}

static int wait_healthy(const cluster_t *c, const char *name, int want, double timeout_s,
                        char *reason, size_t len) {
  double deadline = cluster_now() + timeout_s;
  while (cluster_now() < deadline) {
    if (agent_healthy(c, name, reason, len) == want)
      return 0;
    cluster_sleep(0.2);
  }
  return -1;
}

/* A tiny Fashion-MNIST-shaped data set (uncompressed IDX files, which zlib reads as they are)
 * in dir: n_train / n_test 28x28 images of 10 classes, each class a bright stripe. */
static int write_idx_set(const char *dir, int n_train, int n_test) {
  static const char *const names[2][2] = {{"train-images-idx3-ubyte", "train-labels-idx1-ubyte"},
                                          {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}};
  if (mkdir(dir, 0755) != 0)
    return -1;
  for (int set = 0; set < 2; set++) {
    int n = set == 0 ? n_train : n_test;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, names[set][0]);
    FILE *img = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/%s", dir, names[set][1]);
    FILE *lab = fopen(path, "wb");
    if (!img || !lab)
      return -1;
    unsigned char ih[16] = {0,
                            0,
                            8,
                            3,
                            (unsigned char)(n >> 24),
                            (unsigned char)(n >> 16),
                            (unsigned char)(n >> 8),
                            (unsigned char)n,
                            0,
                            0,
                            0,
                            28,
                            0,
                            0,
                            0,
                            28};
    unsigned char lh[8] = {0,
                           0,
                           8,
                           1,
                           (unsigned char)(n >> 24),
                           (unsigned char)(n >> 16),
                           (unsigned char)(n >> 8),
                           (unsigned char)n};
    fwrite(ih, 1, sizeof ih, img);
    fwrite(lh, 1, sizeof lh, lab);
    for (int i = 0; i < n; i++) {
      unsigned char px[28 * 28], y = (unsigned char)(i % 10);
      for (int k = 0; k < 28 * 28; k++)
        px[k] = (unsigned char)(((k / 28) / 3 == y ? 200 : 20) + (i * 7 + k * 13) % 31);
      fwrite(px, 1, sizeof px, img);
      fwrite(&y, 1, 1, lab);
    }
    fclose(img);
    fclose(lab);
  }
  return 0;
}

static void test_bad_data_quarantined(void **state) {
  (void)state;
  static const char *const common[] = {"--lease-ttl", "4",  "--progress-interval", "0.3",
                                       "--linger",    "10", "--eval-samples",      "256",
                                       NULL};
  cluster_t c;
  job_view_t v;
  char good[320], bad[320], why[256];
  if (cluster_start(&c, 0, common) != 0) {
    cluster_dump_logs(&c);
    cluster_stop(&c);
    fail_msg("cluster did not start");
  }
  snprintf(good, sizeof good, "%s/good-data", c.dir);
  snprintf(bad, sizeof bad, "%s/bad-data", c.dir);
  assert_int_equal(write_idx_set(good, 1000, 200), 0);
  assert_int_equal(mkdir(bad, 0755), 0); /* empty: no data set there */
  const char *const bad_args[] = {"--data-dir", bad, NULL};
  const char *const good_args[] = {"--data-dir", good, NULL};
  /* agent-0 (first in name order) has bad data; agent-1 and agent-2 are healthy. */
  assert_int_equal(cluster_add_agent(&c, bad_args), 0);
  assert_int_equal(cluster_add_agent(&c, good_args), 1);
  assert_int_equal(cluster_add_agent(&c, good_args), 2);
  assert_int_equal(cluster_wait_agents(&c, 3, 30), 0);

  double t0 = cluster_now();
  submit(&c, "{\"name\":\"fm1\",\"model\":\"softmax\",\"dataset\":\"fashion-mnist\","
             "\"algorithm\":\"allreduce\",\"workers\":2,\"batch_size\":32,\"iterations\":300,"
             "\"eval_every\":100}");
  /* agent-0 is quarantined with the reason, within a bound. */
  int q = wait_healthy(&c, "agent-0", 0, REASON_BOUND_S, why, sizeof why);
  fprintf(stderr, "  agent-0 after %.1f s: %s\n", cluster_now() - t0, why);
  if (q != 0)
    cluster_dump_logs(&c);
  assert_int_equal(q, 0);
  assert_non_null(strstr(why, "fm1"));
  assert_non_null(strstr(why, "setup failed"));
  /* fm1 succeeds on the two healthy agents. */
  int ok = cluster_job_wait_state(&c, "fm1", "succeeded", 60, &v);
  if (ok != 0)
    cluster_dump_logs(&c);
  assert_int_equal(ok, 0);
  assert_int_equal(v.nmembers, 2);
  assert_non_null(job_member(&v, "agent-1"));
  assert_non_null(job_member(&v, "agent-2"));

  /* fm2 goes to a healthy agent, not to the quarantined agent-0. */
  submit(&c, "{\"name\":\"fm2\",\"model\":\"softmax\",\"dataset\":\"fashion-mnist\","
             "\"algorithm\":\"allreduce\",\"workers\":1,\"batch_size\":32,\"iterations\":100,"
             "\"eval_every\":50}");
  ok = cluster_job_wait_state(&c, "fm2", "succeeded", 60, &v);
  if (ok != 0)
    cluster_dump_logs(&c);
  assert_int_equal(ok, 0);
  assert_int_equal(v.nmembers, 1);
  assert_string_not_equal(v.members[0].name, "agent-0");
  assert_false(cluster_agent_log_count(&c, 0, "assigned to job fm2", NULL) > 0);
  assert_int_equal(agent_healthy(&c, "agent-0", why, sizeof why), 0);

  /* Registered anew (restarted with good data), agent-0 is healthy again. */
  assert_int_equal(cluster_restart_agent(&c, 0, good_args), 0);
  t0 = cluster_now();
  assert_int_equal(wait_healthy(&c, "agent-0", 1, 15, why, sizeof why), 0);
  fprintf(stderr, "  agent-0 healthy %.1f s after its restart\n", cluster_now() - t0);
  cluster_stop(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_data_quarantined),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
