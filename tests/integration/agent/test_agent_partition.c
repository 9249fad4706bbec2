/* test_agent_partition.c — members cut off from their peers are seen, planned around and back
 * in step after the heal (issue 27). Real etcd, coordinator and wagma-agent processes: some
 * agents here on 10.213.K.1, the side to be cut off in a network namespace of its own
 * (cluster_netns_open) at 10.213.K.2; a wagma job of every agent, groups of 2, tau 8, lease
 * TTL 5 s. Cases: one member of four cut on the data plane only, and fully, in both global
 * modes; two of five cut off together (they still reach each other).
 *
 * A data-plane cut: `ip rule add from 10.213.K.1 ipproto tcp sport|dport <port> blackhole`
 * inside the namespace for every data-plane port (those here as source, those inside as
 * destination), ahead of the rule that delivers to local addresses (moved from 0 to 10), so
 * what the data planes here send inside is dropped on arrival: data and acknowledgements
 * both ways go unanswered while the agents
 * inside still reach etcd and the coordinator (their leases stay alive) and each other: a
 * bad switch port or a network policy. (Rules, not nft or iptables: the kernel here has
 * neither, nor tc's drop action.) A full cut: the namespace's veth end down (etcd lost too).
 * Checked:
 *   - before the plan changes, the members report whom they cannot reach (progress
 *     "unreachable" in GET /v1/jobs/{id});
 *   - a job of two cut in two (no majority): nobody is left out, and the report of the cut
 *     shows in REST and in /metrics (wagma_agent_unreachable_peers);
 *   - within the lease TTL + 3 s of the cut, a plan without the side cut off; for a
 *     data-plane cut, each of its agents quarantined in GET /v1/agents with a reason naming
 *     the cut, and the timeline saying so;
 *   - the longest time the survivors ran below a quarter of their calm rate (printed) is
 *     within the same bound;
 *   - after the heal, the survivors' rate over 3 s once all are in step is at least a
 *     quarter of the calm rate (printed as a share of it);
 *   - after the heal, the agents inside are back in a plan within BACK_BOUND_S (the timeline
 *     says "reachable again" after a data-plane cut) and in step within 3 s of that (its
 *     report of the new epoch at most 0.5 s of calm-rate training behind the slowest here).
 * Figures are printed (docs/benchmarks.md). Needs root and iproute2; skips otherwise. Label
 * timing: the bounds are wall-clock. */
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

#include <jansson.h>

#include "cluster.h"
#include "etcd_fixture.h"

#define LEASE_TTL_S 5.0
#define DETECT_BOUND_S (LEASE_TTL_S + 3.0)
#define BACK_BOUND_S 15.0 /* heal -> a plan with them again (probe 1 s or registering again) */
#define STEP_BOUND_S 3.0  /* back in a plan -> in step */
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

/* One case: nhere agents here, nns in the namespace (cut off together), the kind of cut and
 * the job's global mode. */
typedef struct scenario {
  const char *name;
  int nhere, nns;
  int full; /* 1: the namespace's link down (etcd lost too); 0: data-plane ports blackholed */
  const char *sync;
} scenario_t;

static cluster_netns_t net;

static int setup(void **state) {
  (void)state;
  cluster_netns_open(&net, "wgpart");
  if (!net.on)
    fprintf(stderr, "test_agent_partition: skipped: %s\n", net.why_off);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  cluster_netns_close(&net);
  return 0;
}

/* Adds (add 1) or deletes the rules that cut the agents inside from those here: whatever
 * leaves the namespace for a data-plane port here, or from a data-plane port inside. */
static int cut_rules(const cluster_t *c, const scenario_t *sc, int add) {
  int rc = 0;
  /* What comes in is dropped, ahead of the lookup of local addresses (the namespace's rule 0,
   * moved to 10). Not what goes out: a blackhole route fails a local send at once, so the
   * data stays unsent in the socket and nothing on that side ever sees silence, which a cut
   * cable does not do; dropped on arrival, the packets leave, go unacknowledged, and both
   * sides see the silence. */
  if (add && cluster_sh("ip -n %s rule show pref 0 | grep -q local", net.ns) == 0)
    rc |= cluster_sh("ip -n %s rule add pref 10 lookup local", net.ns) |
          cluster_sh("ip -n %s rule del pref 0", net.ns);
  for (int i = 0; i < sc->nhere + sc->nns; i++)
    rc |= cluster_sh("ip -n %s rule %s pref 5 from %s ipproto tcp %s %d blackhole", net.ns,
                     add ? "add" : "del", net.here, i < sc->nhere ? "sport" : "dport",
                     c->agent_port[i]);
  return rc;
}

static int cut(const cluster_t *c, const scenario_t *sc, int on) {
  if (sc->full)
    return cluster_sh("ip -n %s link set %s %s", net.ns, net.link, on ? "down" : "up");
  return cut_rules(c, sc, on);
}

/* The smallest iteration of the members here (0 when none reported). */
static uint64_t survivors_iteration(const cluster_t *c, const scenario_t *sc, const job_view_t *v) {
  uint64_t lo = UINT64_MAX;
  for (int i = 0; i < sc->nhere; i++) {
    const job_member_t *m = job_member(v, c->agent_name[i]);
    if (m && m->has_progress && m->iteration < lo)
      lo = m->iteration;
  }
  return lo == UINT64_MAX ? 0 : lo;
}

/* How many of the agents inside are members of the plan in v. */
static int inside_members(const cluster_t *c, const scenario_t *sc, const job_view_t *v) {
  int n = 0;
  for (int i = sc->nhere; i < sc->nhere + sc->nns; i++)
    n += job_member(v, c->agent_name[i]) != NULL;
  return n;
}

/* 1 when every agent inside reports the plan's epoch, at most IN_STEP_S of training at the
 * calm rate behind the slowest here (reports come every 0.2 s, each member's at its own
 * moment: a member in step can be one report, ~0.2 s of training, behind). */
#define IN_STEP_S 0.5
static int inside_in_step(const cluster_t *c, const scenario_t *sc, const job_view_t *v,
                          double calm) {
  uint64_t here = survivors_iteration(c, sc, v), slack = (uint64_t)(calm * IN_STEP_S);
  for (int i = sc->nhere; i < sc->nhere + sc->nns; i++) {
    const job_member_t *m = job_member(v, c->agent_name[i]);
    if (!m || !m->has_progress || m->epoch != v->epoch || m->iteration == 0 || here == 0 ||
        m->iteration + slack < here)
      return 0;
  }
  return 1;
}

/* 1 when GET path's body holds needle. */
static int body_has(const cluster_t *c, const char *path, const char *needle) {
  long status = 0;
  char *body = NULL;
  int has = cluster_http(c, "GET", path, NULL, &status, &body) == 0 && status == 200 && body &&
            strstr(body, needle) != NULL;
  free(body);
  return has;
}

/* Starts etcd, the coordinator, sc->nhere agents here and sc->nns in the namespace. */
static void start(cluster_t *c, const scenario_t *sc) {
  cluster_net_t cn = {.agent_host = net.here, .etcd_extra_host = net.here};
  int n = sc->nhere + sc->nns, ok = cluster_start_net(c, sc->nhere, agent_args, NULL, &cn) == 0;
  for (int i = sc->nhere; ok && i < n; i++)
    ok = cluster_place_agent(c, i, net.ns, net.there,
                             etcd_fixture_endpoints_on_extra_host(c->etcd)) == 0 &&
         cluster_add_agent(c, NULL) == i;
  if (!ok || cluster_wait_agents(c, n, 30) != 0) {
    cluster_dump_logs(c);
    cluster_stop(c);
    fail_msg("the cluster did not start");
  }
}

static void run(const scenario_t *sc) {
  if (!net.on)
    skip();
  cluster_t c;
  int n = sc->nhere + sc->nns;
  start(&c, sc);
  const char *job = "part";
  assert_int_equal(cluster_job_submit(&c,
                                      "{\"name\":\"%s\",\"model\":\"softmax\",\"dataset\":"
                                      "\"synthetic\",\"algorithm\":\"wagma\",\"workers\":%d,"
                                      "\"min_workers\":2,\"group_size\":2,\"staleness_bound\":8,"
                                      "\"global_sync\":\"%s\",\"batch_size\":32,"
                                      "\"iterations\":100000000,\"eval_every\":100000}",
                                      job, n, sc->sync),
                   0);
  job_view_t v;
  assert_true(cluster_wait_training(&c, job, 0, n, 20, 60, &v) >= 0);
  /* Calm: the survivors' rate over 3 s. */
  assert_int_equal(cluster_job_get(&c, job, &v), 0);
  uint64_t it0 = survivors_iteration(&c, sc, &v), epoch0 = v.epoch;
  cluster_sleep(3.0);
  assert_int_equal(cluster_job_get(&c, job, &v), 0);
  double calm = (double)(survivors_iteration(&c, sc, &v) - it0) / 3.0;
  uint64_t stale_calm = 0;
  for (int i = 0; i < v.nmembers; i++)
    if (v.members[i].has_progress && v.members[i].staleness > stale_calm)
      stale_calm = v.members[i].staleness;
  assert_true(calm > 0);

  /* The cut. */
  assert_int_equal(cut(&c, sc, 1), 0);
  double t_cut = cluster_now(), t_detect = -1, slow_since = -1, slow_longest = 0;
  int reported = 0;
  uint64_t stale_inside = 0;
  double last_t = t_cut;
  uint64_t last_it = survivors_iteration(&c, sc, &v);
  while (cluster_now() - t_cut < DETECT_BOUND_S + 6) {
    cluster_sleep(POLL_S);
    if (cluster_job_get(&c, job, &v) != 0)
      continue;
    double now = cluster_now();
    uint64_t it = survivors_iteration(&c, sc, &v);
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
    if (t_detect < 0 && v.epoch > epoch0 && inside_members(&c, sc, &v) == 0)
      t_detect = now;
    for (int i = 0; t_detect < 0 && i < n; i++) { /* a member reports whom it cannot reach */
      const job_member_t *m = job_member(&v, c.agent_name[i]);
      if (m && m->has_progress && m->epoch == epoch0 && m->unreachable > 0)
        reported = 1;
      if (m && m->has_progress && m->epoch == epoch0 && i >= sc->nhere &&
          m->staleness > stale_inside)
        stale_inside = m->staleness;
    }

    if (t_detect > 0 && now - t_detect > 2.0)
      break;
  }
  /* A data-plane cut: each agent inside quarantined, and the timeline says why. */
  int quarantined = 1, timeline_cut = 1;
  char path[96];
  snprintf(path, sizeof path, "/v1/jobs/%s/events", job);
  if (!sc->full) {
    for (int i = sc->nhere; i < n; i++) {
      json_t *a = cluster_agent_get(&c, c.agent_name[i]);
      const char *reason =
          json_string_value(json_object_get(json_object_get(a, "quarantine"), "reason"));
      quarantined &= reason && strstr(reason, "job part: cut off on the data plane") != NULL &&
                     json_is_false(json_object_get(a, "healthy"));
      json_decref(a);
    }
    timeline_cut = body_has(&c, path, "cut off on the data plane");
  }
  printf("partition (%s): calm %.0f it/s (staleness up to %llu); a plan without the cut side "
         "%.2f s after the cut; survivors below a quarter of calm for at most %.2f s; the side "
         "cut off reported staleness up to %llu\n",
         sc->name, calm, (unsigned long long)stale_calm, t_detect > 0 ? t_detect - t_cut : -1,
         slow_longest, (unsigned long long)stale_inside);
  fflush(stdout);

  /* The heal. */
  assert_int_equal(cut(&c, sc, 0), 0);
  double t_heal = cluster_now(), t_back = -1, t_step = -1;
  uint64_t epoch_cut = v.epoch;
  while (cluster_now() - t_heal < BACK_BOUND_S + 10) {
    cluster_sleep(POLL_S);
    if (cluster_job_get(&c, job, &v) != 0)
      continue;
    if (t_back < 0 && v.epoch > epoch_cut && inside_members(&c, sc, &v) == sc->nns)
      t_back = cluster_now();
    if (t_back > 0 && inside_in_step(&c, sc, &v, calm)) {
      t_step = cluster_now();
      break;
    }
  }
  int timeline_back = sc->full || body_has(&c, path, "reachable again");
  /* After: the survivors' rate over 3 s once all are back in step, against the calm one. */
  double after = -1;
  if (t_step > 0 && cluster_job_get(&c, job, &v) == 0) {
    uint64_t it1 = survivors_iteration(&c, sc, &v);
    cluster_sleep(3.0);
    if (cluster_job_get(&c, job, &v) == 0)
      after = (double)(survivors_iteration(&c, sc, &v) - it1) / 3.0;
  }
  printf("partition (%s): after the heal, back in a plan %.2f s, in step %.2f s; then %.0f it/s "
         "(%.0f%% of calm)\n",
         sc->name, t_back > 0 ? t_back - t_heal : -1, t_step > 0 ? t_step - t_heal : -1, after,
         100 * after / calm);
  fflush(stdout);
  cluster_job_stop(&c, job, 20);
  int good = reported && t_detect > 0 && t_detect - t_cut <= DETECT_BOUND_S && quarantined &&
             timeline_cut && slow_longest <= DETECT_BOUND_S && t_back > 0 &&
             t_back - t_heal <= BACK_BOUND_S && t_step > 0 && t_step - t_back <= STEP_BOUND_S &&
             timeline_back && after >= calm / 4;
  if (!good)
    cluster_dump_logs(&c);
  cluster_stop(&c);
  assert_true(reported);
  assert_true(t_detect > 0);
  assert_true(t_detect - t_cut <= DETECT_BOUND_S);
  assert_true(quarantined);
  assert_true(timeline_cut);
  assert_true(slow_longest <= DETECT_BOUND_S);
  assert_true(t_back > 0 && t_back - t_heal <= BACK_BOUND_S);
  assert_true(t_step > 0 && t_step - t_back <= STEP_BOUND_S);
  assert_true(timeline_back);
  assert_true(after >= calm / 4);
}

static void test_data_plane_cut_wait_avoiding(void **state) {
  (void)state;
  run(&(scenario_t){"data plane, wait-avoiding", 3, 1, 0, "wait-avoiding"});
}

static void test_data_plane_cut_barrier(void **state) {
  (void)state;
  run(&(scenario_t){"data plane, barrier", 3, 1, 0, "barrier"});
}

static void test_full_cut_wait_avoiding(void **state) {
  (void)state;
  run(&(scenario_t){"full cut, wait-avoiding", 3, 1, 1, "wait-avoiding"});
}

static void test_full_cut_barrier(void **state) {
  (void)state;
  run(&(scenario_t){"full cut, barrier", 3, 1, 1, "barrier"});
}

/* Two of five cut off together (they still reach each other): both leave, not the three. */
static void test_minority_cut_together(void **state) {
  (void)state;
  run(&(scenario_t){"a minority of 2 of 5, data plane, wait-avoiding", 3, 2, 0, "wait-avoiding"});
}

/* A job of two whose link is cut: neither side is a majority, so nobody is left out (the
 * plan stays), and the report of the cut shows in REST and in /metrics meanwhile. (One side
 * may see the other close rather than go silent: the drops are inbound, so the inside's
 * retransmissions still reach the side here, which hears its close when it gives up.) */
static void test_no_majority(void **state) {
  (void)state;
  if (!net.on)
    skip();
  const scenario_t sc = {"no majority: 1 | 1, data plane", 1, 1, 0, "wait-avoiding"};
  cluster_t c;
  start(&c, &sc);
  assert_int_equal(cluster_job_submit(&c,
                                      "{\"name\":\"pair\",\"model\":\"softmax\",\"dataset\":"
                                      "\"synthetic\",\"algorithm\":\"wagma\",\"workers\":2,"
                                      "\"min_workers\":1,\"group_size\":2,\"staleness_bound\":8,"
                                      "\"batch_size\":32,\"iterations\":100000000,"
                                      "\"eval_every\":100000}"),
                   0);
  job_view_t v;
  assert_true(cluster_wait_training(&c, "pair", 0, 2, 20, 60, &v) >= 0);
  uint64_t epoch0 = v.epoch;
  assert_int_equal(cut(&c, &sc, 1), 0);
  double t_cut = cluster_now();
  int reported = 0, metrics = 0;
  while (cluster_now() - t_cut < DETECT_BOUND_S + 4 && !(reported && metrics)) {
    cluster_sleep(POLL_S);
    if (cluster_job_get(&c, "pair", &v) != 0)
      continue;
    const job_member_t *a = job_member(&v, c.agent_name[0]), *b = job_member(&v, c.agent_name[1]);
    reported = (a && a->unreachable > 0) | (b && b->unreachable > 0) << 1;
    for (int i = 0; i < 2; i++) {
      char needle[160];
      snprintf(needle, sizeof needle,
               "wagma_agent_unreachable_peers{agent=\"%.32s\",job=\"pair\"} 1", c.agent_name[i]);
      if ((reported >> i & 1) && body_has(&c, "/metrics", needle))
        metrics |= 1 << i;
    }
  }
  cluster_sleep(2.0); /* the rule has had its chance: still nobody left out */
  assert_int_equal(cluster_job_get(&c, "pair", &v), 0);
  int kept = v.epoch == epoch0 && v.nmembers == 2 && strcmp(v.state, "running") == 0;
  for (int i = 0; i < 2; i++) { /* and nobody quarantined */
    json_t *a = cluster_agent_get(&c, c.agent_name[i]);
    kept &= json_is_true(json_object_get(a, "healthy"));
    json_decref(a);
  }
  printf("partition (%s): reported by %d, in /metrics for %d (bits: rank 0, 1), plan kept %d "
         "(epoch %llu)\n",
         sc.name, reported, metrics, kept, (unsigned long long)v.epoch);
  assert_int_equal(cut(&c, &sc, 0), 0);
  cluster_job_stop(&c, "pair", 20);
  if (!reported || !metrics || !kept)
    cluster_dump_logs(&c);
  cluster_stop(&c);
  assert_true(reported);
  assert_true(metrics);
  assert_true(kept);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_data_plane_cut_wait_avoiding),
      cmocka_unit_test(test_data_plane_cut_barrier),
      cmocka_unit_test(test_full_cut_wait_avoiding),
      cmocka_unit_test(test_full_cut_barrier),
      cmocka_unit_test(test_minority_cut_together),
      cmocka_unit_test(test_no_majority),
  };
  if (getenv("TEST_FILTER"))
    cmocka_set_test_filter(getenv("TEST_FILTER"));
  return cmocka_run_group_tests(tests, setup, teardown);
}
