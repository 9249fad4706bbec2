/* wagma-coordinator and wagma-agent against an etcd with TLS, client certificates and etcd
 * users (tls_etcd.h): both start with --etcd-cacert/--etcd-cert/--etcd-key/--etcd-user (the
 * password from --etcd-password-file, or $WAGMA_ETCD_PASSWORD for one agent), the
 * coordinator is ready (its /readyz pings etcd as the user), the agents register and a
 * 2-worker job trains to the end. A wrong password (agent) and a wrong CA (coordinator) end
 * the process with exit status 4 and a message that says why, well before
 * --etcd-startup-timeout; the password is on no command line. An agent whose etcd user
 * cannot read the job's secrets stays out of the job rather than run it unauthenticated. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "coordinator_process.h"
#include "http_client.h"
#include "process.h"
#include "tls_etcd.h"

#define STARTUP_TIMEOUT_S "60"

static tls_etcd_t g_tls;
static coordinator_process_t g_coordinator;
static pid_t g_agents[2];

static const char *path(const char *name) {
  return tls_etcd_path(&g_tls, name);
}

/* The etcd flags of both daemons; password_file NULL = from the environment. */
static int etcd_flags_as(const char **argv, int n, const char *ca, const char *password_file,
                         const char *user) {
  static char files[5][320];
  snprintf(files[0], sizeof files[0], "%s", ca);
  snprintf(files[1], sizeof files[1], "%s", path("client.crt"));
  snprintf(files[2], sizeof files[2], "%s", path("client.key"));
  argv[n++] = "--etcd-cacert";
  argv[n++] = files[0];
  argv[n++] = "--etcd-cert";
  argv[n++] = files[1];
  argv[n++] = "--etcd-key";
  argv[n++] = files[2];
  argv[n++] = "--etcd-user";
  argv[n++] = user;
  if (password_file != NULL) {
    snprintf(files[3], sizeof files[3], "%s", password_file);
    argv[n++] = "--etcd-password-file";
    argv[n++] = files[3];
  }
  argv[n++] = "--etcd-startup-timeout";
  argv[n++] = STARTUP_TIMEOUT_S;
  return n;
}

static int etcd_flags(const char **argv, int n, const char *ca, const char *password_file) {
  return etcd_flags_as(argv, n, ca, password_file, "wagma");
}

static pid_t start_agent_as(const char *name, const char *user, const char *password_file,
                            const char *const *env) {
  const char *argv[40];
  char listen[64], log[320];
  int n = 0;
  snprintf(listen, sizeof listen, "127.0.0.1:%d", proc_free_port_low());
  snprintf(log, sizeof log, "%s/%s.log", g_tls.dir, name);
  argv[n++] = getenv("WAGMA_AGENT_BIN");
  argv[n++] = "--etcd";
  argv[n++] = etcd_fixture_endpoints(g_tls.etcd);
  argv[n++] = "--name";
  argv[n++] = name;
  argv[n++] = "--listen";
  argv[n++] = listen;
  argv[n++] = "--lease-ttl";
  argv[n++] = "4";
  argv[n++] = "--progress-interval";
  argv[n++] = "0.3";
  argv[n++] = "--synthetic-train";
  argv[n++] = "2048";
  argv[n++] = "--synthetic-test";
  argv[n++] = "512";
  argv[n++] = "--data-dir";
  argv[n++] = "/nonexistent/wagma-test";
  argv[n++] = "--checkpoint-root";
  argv[n++] = g_tls.dir;
  n = etcd_flags_as(argv, n, path("ca.crt"), password_file, user);
  argv[n] = NULL;
  return proc_spawn(argv, log, env);
}

static pid_t start_agent(const char *name, const char *password_file, const char *const *env) {
  return start_agent_as(name, "wagma", password_file, env);
}

static void dump(const char *name) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "tail -n 30 '%s/%s' >&2", g_tls.dir, name);
  if (system(cmd) != 0)
    fprintf(stderr, "(no %s)\n", name);
}

/* GET base + route; returns the status, the body in *body (caller frees) when body != NULL. */
static long get(const char *route, char **body) {
  char url[256];
  http_result_t r;
  long status;
  snprintf(url, sizeof url, "%s%s", g_coordinator.base, route);
  if (http_request("GET", url, NULL, 0, NULL, NULL, &r) != 0) {
    http_result_free(&r);
    return -1;
  }
  status = r.status;
  if (body != NULL)
    *body = strdup(r.body ? r.body : "");
  http_result_free(&r);
  return status;
}

static int setup(void **state) {
  (void)state;
  const char *flags[20];
  int n = 0;
  char log[320];
  if (getenv("WAGMA_AGENT_BIN") == NULL || getenv("WAGMA_COORDINATOR_BIN") == NULL ||
      tls_etcd_start(&g_tls, NULL) != 0)
    return -1;
  n = etcd_flags(flags, n, path("ca.crt"), path("password"));
  flags[n] = NULL;
  snprintf(log, sizeof log, "%s/coordinator.log", g_tls.dir);
  coordinator_options_t o = {
      .endpoints = etcd_fixture_endpoints(g_tls.etcd), .lease_ttl = 3, .log = log, .extra = flags};
  if (coordinator_process_start(&o, &g_coordinator) != 0 ||
      coordinator_process_wait_healthy(&g_coordinator, 30) != 0) {
    dump("coordinator.log");
    return -1;
  }
  g_agents[0] = start_agent("agent-0", path("password"), NULL);
  g_agents[1] =
      start_agent("agent-1", NULL, (const char *const[]){"WAGMA_ETCD_PASSWORD=wagmapw", NULL});
  return g_agents[0] > 0 && g_agents[1] > 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++)
    if (g_agents[i] > 0)
      proc_stop(g_agents[i], SIGTERM, 10);
  if (g_coordinator.pid > 0)
    coordinator_process_stop(&g_coordinator, SIGTERM);
  tls_etcd_stop(&g_tls);
  return 0;
}

static void a_job_trains_over_tls_as_an_etcd_user(void **state) {
  (void)state;
  char url[256], *body = NULL;
  http_result_t r;
  double t0 = proc_now();
  /* Ready (healthy is only alive: the setup's wait): the leader is elected over TLS, as its
   * etcd user; bounded, as every wait. */
  long ready;
  while ((ready = get("/readyz", NULL)) != 200 && proc_now() - t0 < 30)
    proc_sleep(0.2);
  if (ready != 200)
    dump("coordinator.log");
  assert_int_equal(ready, 200);
  /* Both agents register. */
  for (;;) {
    assert_int_equal(get("/v1/agents", &body), 200);
    int both = strstr(body, "\"agent-0\"") && strstr(body, "\"agent-1\"");
    free(body);
    if (both)
      break;
    if (proc_now() - t0 > 30) {
      dump("agent-0.log");
      dump("agent-1.log");
      fail_msg("the agents did not register");
    }
    proc_sleep(0.2);
  }
  static const char job[] = "{\"name\":\"tls\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
                            "\"algorithm\":\"allreduce\",\"workers\":2,\"batch_size\":32,"
                            "\"iterations\":150,\"eval_every\":50}";
  snprintf(url, sizeof url, "%s/v1/jobs", g_coordinator.base);
  assert_int_equal(http_request("POST", url, job, strlen(job), "application/json", NULL, &r), 0);
  assert_int_equal(r.status, 201);
  http_result_free(&r);
  for (t0 = proc_now();; proc_sleep(0.3)) {
    assert_int_equal(get("/v1/jobs/tls", &body), 200);
    int done = strstr(body, "\"state\":\"succeeded\"") != NULL;
    int failed = strstr(body, "\"state\":\"failed\"") != NULL;
    if (done || failed || proc_now() - t0 > 60) {
      fprintf(stderr, "job: %.600s\n", body);
      free(body);
      if (!done) {
        dump("coordinator.log");
        dump("agent-0.log");
      }
      assert_true(done);
      break;
    }
    free(body);
  }
  /* No password on a command line. */
  for (int i = 0; i < 2; i++) {
    char cmdline[64], text[4096] = "";
    snprintf(cmdline, sizeof cmdline, "/proc/%d/cmdline", (int)g_agents[i]);
    FILE *f = fopen(cmdline, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    for (size_t k = 0; k < n; k++)
      if (text[k] == '\0')
        text[k] = ' ';
    assert_null(strstr(text, "wagmapw"));
  }
}

/* An agent whose etcd user may read everything under /wagma/ but the secrets (<prefix>/secrets/)
 * gets a plan without its epoch's secret: it never runs that data plane unauthenticated. It
 * reports itself unavailable, saying why, and the job succeeds with the two other agents.
 * (Before, it ran the epoch unauthenticated, with the collective's warning.) */
static void an_agent_without_the_secret_stays_out(void **state) {
  (void)state;
  char url[256], *body = NULL, cmd[512];
  http_result_t r;
  assert_int_equal(etcd_fixture_etcdctl(g_tls.etcd, "role add blind"), 0);
  assert_int_equal(etcd_fixture_etcdctl(g_tls.etcd, "role grant-permission blind readwrite "
                                                    "/wagma/ /wagma/secrets/"),
                   0);
  assert_int_equal(etcd_fixture_etcdctl(g_tls.etcd, "role grant-permission blind readwrite "
                                                    "/wagma/secrets0 /wagma0"),
                   0);
  assert_int_equal(etcd_fixture_etcdctl(g_tls.etcd, "user add blind:wagmapw --interactive=false"),
                   0);
  assert_int_equal(etcd_fixture_etcdctl(g_tls.etcd, "user grant-role blind blind"), 0);
  pid_t blind = start_agent_as("agent-blind", "blind", path("password"), NULL);
  assert_true(blind > 0);
  double t0 = proc_now();
  for (;; proc_sleep(0.2)) {
    assert_int_equal(get("/v1/agents", &body), 200);
    int in = strstr(body, "\"agent-blind\"") != NULL;
    free(body);
    if (in)
      break;
    if (proc_now() - t0 > 30) {
      dump("agent-blind.log");
      proc_stop(blind, SIGTERM, 10);
      fail_msg("agent-blind did not register");
    }
  }
  static const char job[] = "{\"name\":\"blind\",\"model\":\"softmax\",\"dataset\":"
                            "\"synthetic\",\"algorithm\":\"allreduce\",\"workers\":3,"
                            "\"min_workers\":2,\"batch_size\":32,\"iterations\":150}";
  snprintf(url, sizeof url, "%s/v1/jobs", g_coordinator.base);
  assert_int_equal(http_request("POST", url, job, strlen(job), "application/json", NULL, &r), 0);
  assert_int_equal(r.status, 201);
  http_result_free(&r);
  int done = 0;
  for (t0 = proc_now(); !done && proc_now() - t0 < 90; proc_sleep(0.3)) {
    assert_int_equal(get("/v1/jobs/blind", &body), 200);
    done = strstr(body, "\"state\":\"succeeded\"") != NULL;
    if (strstr(body, "\"state\":\"failed\"")) {
      fprintf(stderr, "job: %.600s\n", body);
      free(body);
      break;
    }
    free(body);
  }
  proc_stop(blind, SIGTERM, 10);
  if (!done) {
    dump("coordinator.log");
    dump("agent-blind.log");
  }
  assert_true(done);
  snprintf(cmd, sizeof cmd, "grep -q 'no data-plane secret for epoch' '%s/agent-blind.log'",
           g_tls.dir);
  if (tls_etcd_sh("%s", cmd) != 0) {
    dump("agent-blind.log");
    fail_msg("agent-blind does not say that it had no secret");
  }
  /* the collective's warning, or the runner's line of an epoch joined without a secret */
  snprintf(cmd, sizeof cmd,
           "grep -q -e 'is unauthenticated' -e 'data plane UNAUTHENTICATED' '%s/agent-blind.log'",
           g_tls.dir);
  if (tls_etcd_sh("%s", cmd) == 0) {
    dump("agent-blind.log");
    fail_msg("agent-blind ran a data plane unauthenticated");
  }
}

/* Runs to its end (at most 30 s, far less than --etcd-startup-timeout): the exit status, and
 * whether its log says expect. */
static int exits_with(pid_t pid, const char *log, const char *expect) {
  double t0 = proc_now();
  int status = proc_wait(pid, 30);
  char cmd[512];
  fprintf(stderr, "exited after %.1f s, status %d\n", proc_now() - t0,
          status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  snprintf(cmd, sizeof cmd, "grep -q '%s' '%s/%s'", expect, g_tls.dir, log);
  if (tls_etcd_sh("%s", cmd) != 0) {
    dump(log);
    fail_msg("%s does not say '%s'", log, expect);
  }
  assert_true(proc_now() - t0 < 20);
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void a_wrong_password_ends_the_agent(void **state) {
  (void)state;
  assert_int_equal(tls_etcd_write(&g_tls, "wrong", "not-it\n"), 0);
  pid_t pid = start_agent("agent-wrong", path("wrong"), NULL);
  assert_true(pid > 0);
  assert_int_equal(exits_with(pid, "agent-wrong.log", "authentication failed"), 4);
}

static void a_wrong_ca_ends_the_coordinator(void **state) {
  (void)state;
  const char *flags[20];
  char log[320];
  coordinator_process_t p;
  int n = etcd_flags(flags, 0, path("other-ca.crt"), path("password"));
  flags[n] = NULL;
  snprintf(log, sizeof log, "%s/coordinator-wrong.log", g_tls.dir);
  coordinator_options_t o = {
      .endpoints = etcd_fixture_endpoints(g_tls.etcd), .log = log, .extra = flags};
  assert_int_equal(coordinator_process_start(&o, &p), 0);
  assert_int_equal(exits_with(p.pid, "coordinator-wrong.log", "TLS handshake"), 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_job_trains_over_tls_as_an_etcd_user),
      cmocka_unit_test(an_agent_without_the_secret_stays_out),
      cmocka_unit_test(a_wrong_password_ends_the_agent),
      cmocka_unit_test(a_wrong_ca_ends_the_coordinator),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
