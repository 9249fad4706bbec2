/* test_agent_partition.c — a member cut off from its peers on the data plane is seen, planned
 * around and back in step after the heal (issue 27). Real etcd, coordinator and 4 wagma-agent
 * processes: agents 0-2 here on 10.213.K.1, agent 3 in a network namespace of its own
 * (cluster_netns_open) at 10.213.K.2, a wagma job of 4 workers, groups of 2, tau 8, lease TTL
 * 5 s.
 *
 * The cut: `ip rule ... blackhole` rules inside agent 3's namespace for the data-plane ports
 * (its peers' as destination and source, its own likewise), so its packets to and from its
 * peers go nowhere while it still reaches etcd and the coordinator: its lease stays alive, as
 * with a bad switch port or a network policy. (Rules, not nft or iptables: the kernel here has
 * neither, nor tc's drop action.) Checked, for both global modes:
 *   - within the lease TTL + 3 s of the cut, a plan without agent 3, which GET /v1/agents
 *     shows quarantined with a reason naming the cut, and a timeline entry that says so;
 *   - the survivors' rate: the longest time they ran below a quarter of their calm rate is
 *     printed, and must stay within the same bound;
 *   - after the heal, agent 3 is back in a plan (the timeline says "reachable again") and
 *     trains in it. Times are printed as figures (docs/benchmarks.md).
 * Needs root and iproute2; skips otherwise. Label timing: the bounds are wall-clock. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"
#include "etcd_fixture.h"

#define NAGENTS 4
#define CUT 3 /* the agent in the namespace */
#define LEASE_TTL_S 5.0
#define DETECT_BOUND_S (LEASE_TTL_S + 3.0)
#define BACK_BOUND_S 10.0 /* heal -> a plan with it again (probe 1 s, pass, setup) */
#define POLL_S 0.2

static const char *const agent_args[] = {"--lease-ttl",
                                         "5",
                                         "--progress-interval",
                                         "0.2",
                                         "--round-deadline",
                                         "0.3",
                                         "--synthetic-train",
                                         "2048",
                                         "--synthetic-test",
                                         "512",
                                         "--eval-samples",
                                         "256",
                                         "--data-dir",
                                         "/nonexistent/wagma-test",
                                         NULL};

typedef struct {
  cluster_t c;
  cluster_netns_t net;
} fixture_t;

static int setup(void **state) {
  static fixture_t f;
  memset(&f, 0, sizeof f);
  cluster_netns_open(&f.net, "wgpart");
  if (!f.net.on) {
    fprintf(stderr, "test_agent_partition: skipped: %s\n", f.net.why_off);
    *state = &f;
    return 0;
  }
  cluster_net_t net = {.agent_host = f.net.here, .etcd_extra_host = f.net.here};
  if (cluster_start_net(&f.c, NAGENTS - 1, agent_args, NULL, &net) != 0 ||
      cluster_place_agent(&f.c, CUT, f.net.ns, f.net.there,
                          etcd_fixture_endpoints_on_extra_host(f.c.etcd)) != 0 ||
      cluster_add_agent(&f.c, NULL) != CUT || cluster_wait_agents(&f.c, NAGENTS, 30) != 0) {
    cluster_dump_logs(&f.c);
    cluster_stop(&f.c);
    cluster_netns_close(&f.net);
    return -1;
  }
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  if (f->net.on)
    cluster_stop(&f->c);
  cluster_netns_close(&f->net);
  return 0;
}

/* Adds (add 1) or deletes the blackhole rules that cut agent CUT from its peers. */
static int cut_rules(fixture_t *f, int add) {
  int rc = 0;
  for (int i = 0; i < NAGENTS; i++)
    for (int dir = 0; dir < 2; dir++)
      rc |= cluster_sh("ip -n %s rule %s ipproto tcp %s %d blackhole", f->net.ns,
                       add ? "add" : "del", dir ? "sport" : "dport", f->c.agent_port[i]);
  return rc;
}

/* The smallest iteration of the members other than CUT (0 when none reported). */
static uint64_t survivors_iteration(const fixture_t *f, const job_view_t *v) {
  uint64_t lo = UINT64_MAX;
  for (int i = 0; i < v->nmembers; i++)
    if (strcmp(v->members[i].name, f->c.agent_name[CUT]) != 0 && v->members[i].has_progress &&
        v->members[i].iteration < lo)
      lo = v->members[i].iteration;
  return lo == UINT64_MAX ? 0 : lo;
}

/* 1 when GET path's body holds needle. */
static int body_has(const fixture_t *f, const char *path, const char *needle) {
  long status = 0;
  char *body = NULL;
  int has = cluster_http(&f->c, "GET", path, NULL, &status, &body) == 0 && status == 200 && body &&
            strstr(body, needle) != NULL;
  free(body);
  return has;
}

static void run_cut(void **state, const char *sync) {
  fixture_t *f = *state;
  if (!f->net.on)
    skip();
  char job[32];
  snprintf(job, sizeof job, "part-%s", sync);
  assert_int_equal(cluster_job_submit(&f->c,
                                      "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":"
                                      "\"synthetic\",\"algorithm\":\"wagma\",\"workers\":4,"
                                      "\"min_workers\":2,\"group_size\":2,\"staleness_bound\":8,"
                                      "\"global_sync\":\"%s\",\"batch_size\":32,"
                                      "\"iterations\":100000000,\"eval_every\":100000}",
                                      job, sync),
                   0);
  job_view_t v;
  assert_true(cluster_wait_training(&f->c, job, 0, NAGENTS, 20, 60, &v) >= 0);
  /* Calm: the survivors' rate over 3 s. */
  assert_int_equal(cluster_job_get(&f->c, job, &v), 0);
  uint64_t it0 = survivors_iteration(f, &v), epoch0 = v.epoch;
  cluster_sleep(3.0);
  assert_int_equal(cluster_job_get(&f->c, job, &v), 0);
  double calm = (double)(survivors_iteration(f, &v) - it0) / 3.0;
  assert_true(calm > 0);

  /* The cut. */
  assert_int_equal(cut_rules(f, 1), 0);
  double t_cut = cluster_now(), t_detect = -1, slow_since = -1, slow_longest = 0;
  double last_t = t_cut;
  uint64_t last_it = survivors_iteration(f, &v);
  while (cluster_now() - t_cut < DETECT_BOUND_S + 6) {
    cluster_sleep(POLL_S);
    if (cluster_job_get(&f->c, job, &v) != 0)
      continue;
    double now = cluster_now();
    uint64_t it = survivors_iteration(f, &v);
    if (now - last_t >= 1.0) { /* the survivors' rate over about a second */
      double rate = it >= last_it ? (double)(it - last_it) / (now - last_t) : calm;
      if (rate < calm / 4) {
        if (slow_since < 0)
          slow_since = last_t;
        if (now - slow_since > slow_longest)
          slow_longest = now - slow_since;
      } else {
        slow_since = -1;
      }
      last_t = now;
      last_it = it;
    }
    if (t_detect < 0 && v.epoch > epoch0 && !job_member(&v, f->c.agent_name[CUT]))
      t_detect = now;
    if (t_detect > 0 && now - t_detect > 2.0)
      break;
  }
  char agents_needle[96];
  snprintf(agents_needle, sizeof agents_needle, "job %s: cut off on the data plane", job);
  int quarantined = body_has(f, "/v1/agents", agents_needle);
  char path[96];
  snprintf(path, sizeof path, "/v1/jobs/%s/events", job);
  int timeline_cut = body_has(f, path, "cut off on the data plane");
  printf("partition (%s): calm %.0f it/s; detected (plan without %s) %.2f s after the cut; "
         "survivors below a quarter of calm for at most %.2f s\n",
         sync, calm, f->c.agent_name[CUT], t_detect > 0 ? t_detect - t_cut : -1, slow_longest);
  fflush(stdout);

  /* The heal. */
  assert_int_equal(cut_rules(f, 0), 0);
  double t_heal = cluster_now(), t_back = -1, t_step = -1;
  uint64_t epoch_cut = v.epoch;
  while (cluster_now() - t_heal < BACK_BOUND_S + 10) {
    cluster_sleep(POLL_S);
    if (cluster_job_get(&f->c, job, &v) != 0)
      continue;
    const job_member_t *m = job_member(&v, f->c.agent_name[CUT]);
    if (t_back < 0 && m && v.epoch > epoch_cut)
      t_back = cluster_now();
    if (t_back > 0 && m && m->has_progress && m->epoch == v.epoch && m->iteration > 0 &&
        survivors_iteration(f, &v) > 0 && m->iteration + 50 >= survivors_iteration(f, &v)) {
      t_step = cluster_now();
      break;
    }
  }
  int timeline_back = body_has(f, path, "reachable again");
  printf("partition (%s): after the heal, back in a plan %.2f s, in step %.2f s\n", sync,
         t_back > 0 ? t_back - t_heal : -1, t_step > 0 ? t_step - t_heal : -1);
  fflush(stdout);
  cluster_job_stop(&f->c, job, 20);
  if (t_detect < 0 || t_detect - t_cut > DETECT_BOUND_S || !quarantined || !timeline_cut ||
      slow_longest > DETECT_BOUND_S || t_back < 0 || t_back - t_heal > BACK_BOUND_S || t_step < 0 ||
      !timeline_back)
    cluster_dump_logs(&f->c);
  assert_true(t_detect > 0);
  assert_true(t_detect - t_cut <= DETECT_BOUND_S);
  assert_true(quarantined);
  assert_true(timeline_cut);
  assert_true(slow_longest <= DETECT_BOUND_S);
  assert_true(t_back > 0 && t_back - t_heal <= BACK_BOUND_S);
  assert_true(t_step > 0);
  assert_true(timeline_back);
}

static void test_cut_wait_avoiding(void **state) {
  run_cut(state, "wait-avoiding");
}

static void test_cut_barrier(void **state) {
  run_cut(state, "barrier");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cut_wait_avoiding),
      cmocka_unit_test(test_cut_barrier),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
