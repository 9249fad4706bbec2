/* test_agent_config.c — misconfiguration is reported, not retried for ever (issue 9, item 7):
 * real wagma-agent and wagma-coordinator processes, a real etcd for the name checks.
 *
 *  - an invalid etcd address (port out of range, empty host or port, garbage, another
 *    scheme) is a usage error: exit status 2 within 2 s and a message naming the address and
 *    what is wrong, for the agent and the coordinator alike;
 *  - an etcd that does not answer (nothing listens on its port): both give up after
 *    --etcd-startup-timeout (2 s here; each try may take one --etcd-timeout-ms more) with exit
 *    status 4 and a message; SIGTERM while they wait ends them cleanly (status 0) at once;
 *  - a second agent with the --name of a live one exits with status 5, naming the conflict,
 *    within one keepalive period of the first's lease plus a margin; the first keeps its
 *    registration (same address);
 *  - an agent restarted under its name right after a SIGKILL (its old lease not expired yet,
 *    and not kept alive) takes the name over instead of refusing;
 *  - an agent whose lease it gave up as lost during an etcd outage, and that etcd renewed on
 *    its restart, keeps its registration under that lease.
 * Before the fix the agent accepted 127.0.0.1:99999 and retried every address for ever, and
 * the duplicate silently shared the name. Label timing: the bounds are wall-clock ones.
 * Everything is stopped by PID. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"
#include "process.h"
#include "wagma/etcd.h"

/* Runs bin with args (NULL-terminated after argv[0]), its output in log; returns the exit
 * status (-1 when it did not exit within timeout_s: then it was killed) and the seconds it
 * took. */
static int run(const char *bin, const char *const *args, const char *log, double timeout_s,
               double *seconds) {
  const char *argv[32];
  int n = 0;
  argv[n++] = bin;
  for (int i = 0; args[i] && n < 31; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  unlink(log);
  double t0 = proc_now();
  pid_t pid = proc_spawn(argv, log, NULL);
  if (pid <= 0)
    return -1;
  int st = proc_wait(pid, timeout_s);
  *seconds = proc_now() - t0;
  return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int file_contains(const char *path, const char *needle) {
  char line[2048];
  int found = 0;
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

static void print_file(const char *path) {
  char line[2048];
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    fprintf(stderr, "    | %s", line);
  if (f)
    fclose(f);
}

static void test_bad_etcd_address_is_a_usage_error(void **state) {
  (void)state;
  static const struct {
    const char *address, *says;
  } bad[] = {
      {"127.0.0.1:99999", "port must be 1..65535"},
      {"127.0.0.1:0", "port must be 1..65535"},
      {":2379", "empty host"},
      {"127.0.0.1:", "empty port"},
      {"127.0.0.1", "must be HOST:PORT"},
      {"127.0.0.1:23x9", "port must be a number"},
      {"no such host:2379", "bad character in host"},
      {"ftp://127.0.0.1:2379", "only http:// and https://"},
      {"https://127.0.0.1:2379,http://127.0.0.1:2380", "mixed"},
      {"127.0.0.1:2379,127.0.0.1:70000", "port must be 1..65535"},
      {",", "no endpoints"},
  };
  char log[256];
  snprintf(log, sizeof log, "%s/wagma-config-usage-%d.log", getenv("TMPDIR") ?: "/tmp",
           (int)getpid());
  const char *agent = getenv("WAGMA_AGENT_BIN"), *coord = getenv("WAGMA_COORDINATOR_BIN");
  assert_non_null(agent);
  assert_non_null(coord);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *const aargs[] = {"--etcd",   bad[i].address,    "--name", "a0",
                                 "--listen", "127.0.0.1:20999", NULL};
    const char *const cargs[] = {"--etcd", bad[i].address, "--listen", "127.0.0.1:0", NULL};
    for (int which = 0; which < 2; which++) {
      double secs = 0;
      int rc = run(which ? coord : agent, which ? cargs : aargs, log, 5, &secs);
      int says = file_contains(log, "bad --etcd") && file_contains(log, bad[i].says);
      fprintf(stderr, "  %-18s --etcd '%s': exit %d in %.2f s\n",
              which ? "wagma-coordinator" : "wagma-agent", bad[i].address, rc, secs);
      if (rc != 2 || !says)
        print_file(log);
      assert_int_equal(rc, 2);
      assert_true(says);
      assert_true(secs < 2.0);
    }
  }
  unlink(log);
}

static void test_unreachable_etcd_gives_up(void **state) {
  (void)state;
  char log[256], etcd[32];
  snprintf(log, sizeof log, "%s/wagma-config-unreachable-%d.log", getenv("TMPDIR") ?: "/tmp",
           (int)getpid());
  const char *agent = getenv("WAGMA_AGENT_BIN"), *coord = getenv("WAGMA_COORDINATOR_BIN");
  int port = proc_free_port(); /* nothing listens there */
  assert_true(port > 0);
  snprintf(etcd, sizeof etcd, "127.0.0.1:%d", port);
  const char *const aargs[] = {"--etcd",
                               etcd,
                               "--name",
                               "a0",
                               "--listen",
                               "127.0.0.1:20999",
                               "--etcd-startup-timeout",
                               "2",
                               "--etcd-timeout-ms",
                               "500",
                               NULL};
  const char *const cargs[] = {
      "--etcd", etcd, "--listen", "127.0.0.1:0", "--etcd-startup-timeout", "2", "--etcd-timeout-ms",
      "500",    NULL};
  for (int which = 0; which < 2; which++) {
    double secs = 0;
    int rc = run(which ? coord : agent, which ? cargs : aargs, log, 30, &secs);
    int says = file_contains(log, "did not answer within 2 s") && file_contains(log, etcd);
    fprintf(stderr, "  %-18s unreachable etcd: exit %d in %.2f s\n",
            which ? "wagma-coordinator" : "wagma-agent", rc, secs);
    if (rc != 4 || !says)
      print_file(log);
    assert_int_equal(rc, 4);
    assert_true(says);
    assert_true(secs >= 1.9);
    assert_true(secs < 2.0 + 0.5 + 3.0); /* the timeout, one call deadline, process start */
  }
  unlink(log);
}

/* SIGTERM while still waiting for etcd at startup: a clean exit (status 0) at once. */
static void test_stop_while_waiting_for_etcd(void **state) {
  (void)state;
  char log[256], etcd[32];
  snprintf(log, sizeof log, "%s/wagma-config-stop-%d.log", getenv("TMPDIR") ?: "/tmp",
           (int)getpid());
  snprintf(etcd, sizeof etcd, "127.0.0.1:%d", proc_free_port());
  const char *const aargs[] = {
      getenv("WAGMA_AGENT_BIN"), "--etcd", etcd, "--name", "a0", "--listen", "127.0.0.1:20999",
      "--etcd-timeout-ms",       "500",    NULL};
  const char *const cargs[] = {getenv("WAGMA_COORDINATOR_BIN"),
                               "--etcd",
                               etcd,
                               "--listen",
                               "127.0.0.1:0",
                               "--etcd-timeout-ms",
                               "500",
                               NULL};
  for (int which = 0; which < 2; which++) {
    pid_t pid = proc_spawn(which ? cargs : aargs, log, NULL);
    assert_true(pid > 0);
    proc_sleep(1.5);
    double t0 = proc_now();
    kill(pid, SIGTERM);
    int st = proc_wait(pid, 10);
    double secs = proc_now() - t0;
    fprintf(stderr, "  %-18s SIGTERM while waiting for etcd: status 0x%x in %.2f s\n",
            which ? "wagma-coordinator" : "wagma-agent", st, secs);
    assert_true(st >= 0 && WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(secs < 2.0); /* at most one etcd call deadline (0.5 s) and the shutdown */
  }
  unlink(log);
}

static const char *const agent_args[] = {"--lease-ttl", "4", NULL};

static int setup(void **state) {
  return cluster_group_setup(state, 1, agent_args);
}

static int teardown(void **state) {
  return cluster_group_teardown(state);
}

/* The address agent name is registered with in GET /v1/agents ("" when absent). */
static void registered_address(const cluster_t *c, const char *name, char *out, size_t len) {
  json_t *a = cluster_agent_get(c, name);
  snprintf(out, len, "%s", a ? json_string_value(json_object_get(a, "address")) ?: "" : "");
  json_decref(a);
}

static void test_duplicate_name_refused(void **state) {
  cluster_t *c = *state;
  char log[320], listen[32], before[64], after[64], first[32];
  snprintf(log, sizeof log, "%s/duplicate.log", c->dir);
  snprintf(listen, sizeof listen, "127.0.0.1:%d", proc_free_port_low());
  snprintf(first, sizeof first, "127.0.0.1:%d", c->agent_port[0]);
  registered_address(c, "agent-0", before, sizeof before);
  assert_string_equal(before, first);
  const char *const args[] = {"--etcd",      etcd_fixture_endpoints(c->etcd),
                              "--name",      "agent-0",
                              "--listen",    listen,
                              "--lease-ttl", "4",
                              NULL};
  double secs = 0;
  /* the first's lease (TTL 4) is refreshed every 1.3 s: seen within 4 / 3 + 2 s at most */
  int rc = run(getenv("WAGMA_AGENT_BIN"), args, log, 20, &secs);
  int says = file_contains(log, "agent-0 is in use by a live agent") && file_contains(log, first);
  fprintf(stderr, "  duplicate agent-0: exit %d in %.2f s\n", rc, secs);
  if (rc != 5 || !says)
    print_file(log);
  assert_int_equal(rc, 5);
  assert_true(says);
  assert_true(secs < 8.0);
  /* The first keeps its name and registration. */
  assert_int_equal(kill(c->agent[0], 0), 0);
  registered_address(c, "agent-0", after, sizeof after);
  assert_string_equal(after, first);
}

static void test_restart_after_a_crash_takes_the_name(void **state) {
  cluster_t *c = *state;
  char address[64], want[32];
  /* SIGKILL: the lease stays for its TTL, nobody keeps it alive. */
  kill(c->agent[0], SIGKILL);
  waitpid(c->agent[0], NULL, 0);
  c->agent[0] = 0;
  double t0 = cluster_now();
  assert_int_equal(cluster_restart_agent(c, 0, NULL), 0);
  snprintf(want, sizeof want, "127.0.0.1:%d", c->agent_port[0]);
  do {
    registered_address(c, "agent-0", address, sizeof address);
    if (strcmp(address, want) == 0)
      break;
    cluster_sleep(0.2);
  } while (cluster_now() - t0 < 10);
  fprintf(stderr, "  restarted agent-0 registered after %.2f s\n", cluster_now() - t0);
  assert_string_equal(address, want);
  assert_int_equal(kill(c->agent[0], 0), 0); /* running, not refused */
}

/* The lease and create revision of agent name's key (0, 0 when absent). */
static void agent_key(const cluster_t *c, const char *name, int64_t *lease, int64_t *created) {
  wagma_etcd_options_t eo = {.endpoints = etcd_fixture_endpoints(c->etcd)};
  wagma_etcd_t *etcd = NULL;
  wagma_etcd_range_t r;
  char key[256];
  *lease = *created = 0;
  snprintf(key, sizeof key, "/wagma/agents/%s", name);
  memset(&r, 0, sizeof r);
  assert_int_equal(wagma_etcd_open(&eo, &etcd), 0);
  assert_int_equal(wagma_etcd_range(etcd, key, NULL, &r), 0);
  if (r.n == 1) {
    *lease = r.kvs[0].lease;
    *created = r.kvs[0].create_revision;
  }
  wagma_etcd_range_free(&r);
  wagma_etcd_close(etcd);
}

/* etcd is down longer than the agent's lease TTL, so the agent gives its lease up as lost;
 * etcd comes back with every lease renewed for a full TTL (a restarted etcd does that). The
 * agent key is still there under the agent's own lease: the agent keeps it (a new keepalive
 * on the same lease), so the coordinator sees no departure. Before the fix it refused "its"
 * key as another process's ("cannot register again: the name agent-0 is held by another
 * process"), the lease expired a TTL later, and it registered anew: its jobs saw it leave
 * (the soak's soak-72 failed so, its members' registrations gone at the job's end). */
static void test_registration_kept_across_an_etcd_restart(void **state) {
  cluster_t *c = *state;
  char log[320];
  int64_t lease0, created0, lease1, created1;
  snprintf(log, sizeof log, "%s/agent-0.log", c->dir);
  agent_key(c, "agent-0", &lease0, &created0);
  assert_true(lease0 != 0);
  assert_int_equal(etcd_fixture_kill(c->etcd, 0), 0);
  cluster_sleep(5.5); /* TTL 4: the agent's keepalive gives the lease up within 4 s */
  assert_int_equal(etcd_fixture_restart(c->etcd, 0), 0);
  cluster_sleep(6.0); /* beyond a TTL: a lease nobody refreshed would have expired */
  agent_key(c, "agent-0", &lease1, &created1);
  int lost = file_contains(log, "lease lost"), kept = file_contains(log, "keeping it");
  fprintf(stderr, "  agent-0: lease %llx -> %llx, key created at %lld -> %lld (lost %d, kept %d)\n",
          (unsigned long long)lease0, (unsigned long long)lease1, (long long)created0,
          (long long)created1, lost, kept);
  if (lease1 != lease0)
    cluster_dump_logs(c);
  assert_true(lost); /* the case under test happened */
  assert_true(lease1 == lease0);
  assert_true(created1 == created0);
  assert_true(kept);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_etcd_address_is_a_usage_error),
      cmocka_unit_test(test_unreachable_etcd_gives_up),
      cmocka_unit_test(test_stop_while_waiting_for_etcd),
      cmocka_unit_test(test_duplicate_name_refused),
      cmocka_unit_test(test_restart_after_a_crash_takes_the_name),
      cmocka_unit_test(test_registration_kept_across_an_etcd_restart),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
