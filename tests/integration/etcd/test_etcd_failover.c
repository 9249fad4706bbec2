/* Integration tests of libwagma_etcd when etcd fails: SIGKILL + restart on the same data
 * dir (watch resumes without loss or duplicates; calls fail fast and recover; keepalive
 * rides it out), a 3-member cluster that loses a member, and how fast a handle with a short
 * call timeout (1000 / 500 ms) works again after a restart or a silent endpoint. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "etcd_fixture.h"
#include "recorder.h"
#include "wagma/etcd.h"

#define CALL_TIMEOUT_MS 1500
#define FAILOVER_LEASE_TTL_S 10

/* WAGMA_TEST_ETCD_LOG=1 prints the library's log (with a monotonic time stamp). */
static void test_log(void *user, int level, const char *message) {
  (void)user;
  fprintf(stderr, "[%lld] etcd log %d: %s\n", (long long)test_now_ms(), level, message);
}

static wagma_etcd_t *open_client(etcd_fixture_t *fixture) {
  wagma_etcd_t *etcd = NULL;
  wagma_etcd_options_t options = {.endpoints = etcd_fixture_endpoints(fixture),
                                  .call_timeout_ms = CALL_TIMEOUT_MS};
  if (getenv("WAGMA_TEST_ETCD_LOG") != NULL)
    options.log_fn = test_log;
  assert_int_equal(wagma_etcd_open(&options, &etcd), 0);
  return etcd;
}

/* Puts until it succeeds (etcd may be coming back); returns the revision. */
static int64_t put_retry(wagma_etcd_t *etcd, const char *key, const char *value) {
  int64_t rev = 0, start = test_now_ms();
  int rc;
  while ((rc = wagma_etcd_put(etcd, key, value, strlen(value), 0, &rev)) != 0) {
    if (test_now_ms() - start >= 30000)
      fail_msg("put %s kept failing: %d %s", key, rc, wagma_etcd_errmsg(etcd));
    test_sleep_ms(100);
  }
  return rev;
}

static void lost_fn(void *user, int64_t lease, int status) {
  (void)lease;
  __atomic_store_n((int *)user, status, __ATOMIC_SEQ_CST);
}

static void watch_survives_kill_and_restart(void **state) {
  etcd_fixture_t *fixture = NULL;
  wagma_etcd_t *etcd;
  wagma_etcd_watch_t *watch = NULL, *replay = NULL;
  wagma_etcd_keepalive_t *keepalive = NULL;
  wagma_etcd_watch_options_t options = {.prefix = 1};
  recorder_t *live = calloc(1, sizeof *live), *history = calloc(1, sizeof *history);
  int64_t first_rev = 0, last_rev = 0, lease = 0, start, killed_at, longest_outage = 0;
  wagma_etcd_kv_t *kv = NULL;
  int lost = 0;
  char key[64], value[32];
  (void)state;

  recorder_init(live);
  recorder_init(history);
  assert_int_equal(etcd_fixture_start(1, &fixture), 0);
  etcd = open_client(fixture);
  assert_int_equal(wagma_etcd_lease_grant(etcd, FAILOVER_LEASE_TTL_S, &lease), 0);
  assert_int_equal(wagma_etcd_keepalive_start(etcd, lease, lost_fn, &lost, &keepalive), 0);
  assert_int_equal(wagma_etcd_put(etcd, "/f/leased", "x", 1, lease, NULL), 0);
  assert_int_equal(wagma_etcd_ping(etcd, &first_rev), 0);
  assert_int_equal(wagma_etcd_watch_start(etcd, "/f/w/", &options, recorder_watch_fn, live, &watch),
                   0);

  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 30; i++) {
      snprintf(key, sizeof key, "/f/w/k%d", i % 4);
      snprintf(value, sizeof value, "%d-%d", round, i);
      last_rev = put_retry(etcd, key, value);
      if (i == 17)
        assert_int_equal(wagma_etcd_delete(etcd, "/f/w/k1", 0, NULL, NULL), 0);
    }
    /* etcd dies with events possibly still in flight to the watcher */
    assert_int_equal(etcd_fixture_kill(fixture, 0), 0);
    killed_at = test_now_ms();

    /* while it is down: a clear error within the deadline, not a hang */
    start = test_now_ms();
    assert_int_equal(wagma_etcd_get(etcd, "/f/w/k0", &kv, NULL), WAGMA_EUNAVAIL);
    assert_true(test_now_ms() - start < CALL_TIMEOUT_MS + 3000);
    assert_non_null(strstr(wagma_etcd_errmsg(etcd), etcd_fixture_endpoint(fixture, 0)));
    test_sleep_ms(300 * round);
    assert_int_equal(etcd_fixture_restart(fixture, 0), 0);
    if (test_now_ms() - killed_at > longest_outage)
      longest_outage = test_now_ms() - killed_at;
  }
  last_rev = put_retry(etcd, "/f/w/end", "end");

  /* The live watch delivered exactly etcd's history of the prefix, in order. */
  options.start_revision = first_rev + 1;
  assert_int_equal(
      wagma_etcd_watch_start(etcd, "/f/w/", &options, recorder_watch_fn, history, &replay), 0);
  start = test_now_ms();
  while (test_now_ms() - start < 15000) {
    pthread_mutex_lock(&history->lock);
    pthread_mutex_lock(&live->lock);
    int done = history->n > 0 && live->n > 0 &&
               history->events[history->n - 1].mod_revision == last_rev &&
               live->events[live->n - 1].mod_revision == last_rev;
    pthread_mutex_unlock(&live->lock);
    pthread_mutex_unlock(&history->lock);
    if (done)
      break;
    test_sleep_ms(50);
  }
  wagma_etcd_watch_stop(replay);
  wagma_etcd_watch_stop(watch);
  assert_true(live->n >= 3 * 31 + 1);
  assert_int_equal(live->n, history->n);
  assert_false(live->bad_order);
  for (size_t i = 0; i < live->n; i++) {
    assert_int_equal(live->events[i].mod_revision, history->events[i].mod_revision);
    assert_string_equal(live->events[i].key, history->events[i].key);
    assert_string_equal(live->events[i].value, history->events[i].value);
    assert_int_equal(live->events[i].type, history->events[i].type);
    if (i > 0)
      assert_true(live->events[i].mod_revision > live->events[i - 1].mod_revision);
  }

  /* The keepalive rode out the restarts: the leased key is still there. Each restart leaves
   * etcd up only for the ~30 puts of the next round (~100 ms), so the outages add up to
   * more than the TTL on a loaded machine; the keepalive is kicked by the first put that
   * succeeds and must refresh in every such window. It can only be asked to ride out an
   * outage shorter than TTL - TTL/3 (it may have refreshed last TTL/3 before the kill);
   * under a load that makes one etcd restart take longer, losing the lease is correct. */
  print_message("longest etcd outage %lld ms (lease TTL %d s)\n", (long long)longest_outage,
                FAILOVER_LEASE_TTL_S);
  if (__atomic_load_n(&lost, __ATOMIC_SEQ_CST) != 0) {
    if (longest_outage < FAILOVER_LEASE_TTL_S * 1000 * 2 / 3)
      fail_msg("lease reported lost (%d) although the longest etcd outage was %lld ms of a "
               "%d s TTL",
               __atomic_load_n(&lost, __ATOMIC_SEQ_CST), (long long)longest_outage,
               FAILOVER_LEASE_TTL_S);
    assert_int_equal(__atomic_load_n(&lost, __ATOMIC_SEQ_CST), WAGMA_ETIMEDOUT);
  } else {
    int rc = wagma_etcd_get(etcd, "/f/leased", &kv, NULL);
    if (rc != 0)
      fail_msg("get /f/leased after the restarts: %d %s", rc, wagma_etcd_errmsg(etcd));
    wagma_etcd_kv_free(kv);
  }
  wagma_etcd_keepalive_stop(keepalive);

  wagma_etcd_close(etcd);
  etcd_fixture_stop(fixture);
  recorder_destroy(live);
  recorder_destroy(history);
  free(live);
  free(history);
}

static void cluster_keeps_serving_without_one_member(void **state) {
  etcd_fixture_t *fixture = NULL;
  wagma_etcd_t *etcd;
  wagma_etcd_watch_t *watch = NULL;
  recorder_t *r = calloc(1, sizeof *r);
  wagma_etcd_kv_t *kv = NULL;
  char value[32];
  (void)state;

  recorder_init(r);
  assert_int_equal(etcd_fixture_start(3, &fixture), 0);
  assert_int_equal(etcd_fixture_members(fixture), 3);
  etcd = open_client(fixture);
  assert_int_equal(wagma_etcd_put(etcd, "/c/k", "0", 1, 0, NULL), 0);
  assert_int_equal(wagma_etcd_watch_start(etcd, "/c/k", NULL, recorder_watch_fn, r, &watch), 0);

  /* The client talks to member 0 first: kill it. */
  assert_int_equal(etcd_fixture_kill(fixture, 0), 0);
  for (int i = 1; i <= 20; i++) {
    snprintf(value, sizeof value, "%d", i);
    put_retry(etcd, "/c/k", value);
  }
  assert_int_equal(wagma_etcd_get(etcd, "/c/k", &kv, NULL), 0);
  assert_string_equal(kv->value, "20");
  wagma_etcd_kv_free(kv);
  assert_int_equal(recorder_wait_events(r, 20, 15000), 20);
  for (int i = 0; i < 20; i++) {
    snprintf(value, sizeof value, "%d", i + 1);
    assert_string_equal(r->events[i].value, value);
  }

  /* Kill another one: no quorum, calls fail with a clear error within the deadline. */
  assert_int_equal(etcd_fixture_kill(fixture, 1), 0);
  {
    int64_t start = test_now_ms();
    int rc = wagma_etcd_put(etcd, "/c/k", "x", 1, 0, NULL);
    if (rc != WAGMA_EUNAVAIL && rc != WAGMA_ETIMEDOUT)
      fail_msg("put without quorum: %d %s", rc, wagma_etcd_errmsg(etcd));
    assert_true(test_now_ms() - start < CALL_TIMEOUT_MS + 3000);
    assert_true(strlen(wagma_etcd_errmsg(etcd)) > 0);
  }
  /* Members come back: the cluster and the watch recover. */
  assert_int_equal(etcd_fixture_restart(fixture, 1), 0);
  assert_int_equal(etcd_fixture_restart(fixture, 0), 0);
  put_retry(etcd, "/c/k", "back");
  /* (the timed-out "x" may or may not have been committed once the quorum returned) */
  {
    int64_t start = test_now_ms();
    for (;;) {
      pthread_mutex_lock(&r->lock);
      int done = strcmp(r->events[r->n - 1].value, "back") == 0;
      pthread_mutex_unlock(&r->lock);
      if (done || test_now_ms() - start > 15000)
        break;
      test_sleep_ms(50);
    }
  }
  pthread_mutex_lock(&r->lock);
  assert_true(r->n == 21 || r->n == 22);
  assert_string_equal(r->events[r->n - 1].value, "back");
  assert_false(r->bad_order);
  pthread_mutex_unlock(&r->lock);

  wagma_etcd_watch_stop(watch);
  wagma_etcd_close(etcd);
  etcd_fixture_stop(fixture);
  recorder_destroy(r);
  free(r);
}

static void keepalive_reports_loss_while_etcd_is_down(void **state) {
  etcd_fixture_t *fixture = NULL;
  wagma_etcd_t *etcd;
  wagma_etcd_keepalive_t *keepalive = NULL;
  int64_t lease = 0, start;
  int lost = 0;
  (void)state;

  assert_int_equal(etcd_fixture_start(1, &fixture), 0);
  etcd = open_client(fixture);
  assert_int_equal(wagma_etcd_lease_grant(etcd, 2, &lease), 0);
  assert_int_equal(wagma_etcd_keepalive_start(etcd, lease, lost_fn, &lost, &keepalive), 0);
  test_sleep_ms(1000);
  assert_int_equal(__atomic_load_n(&lost, __ATOMIC_SEQ_CST), 0);
  assert_int_equal(etcd_fixture_kill(fixture, 0), 0);
  start = test_now_ms();
  while (__atomic_load_n(&lost, __ATOMIC_SEQ_CST) == 0 && test_now_ms() - start < 15000)
    test_sleep_ms(50);
  /* no refresh for a whole TTL: the holder is told, not left believing it is alive */
  assert_int_equal(__atomic_load_n(&lost, __ATOMIC_SEQ_CST), WAGMA_ETIMEDOUT);
  assert_true(test_now_ms() - start <= 2000 + CALL_TIMEOUT_MS + 3000);
  wagma_etcd_keepalive_stop(keepalive);
  wagma_etcd_close(etcd);
  etcd_fixture_stop(fixture);
}

/* ---- recovery time after a restart, with short call timeouts -------------------------- */

#define RECOVERY_BOUND_MS 5000 /* from etcd healthy again to the first successful call */
#define RECOVERY_LEASE_TTL_S 8

/* Opens a handle with call_timeout_ms, keeps a watch and a keepalive on it, SIGKILLs etcd,
 * lets calls fail for a while (so gRPC's reconnect backoff grows), restarts etcd on the same
 * data dir and requires the handle, the watch and the keepalive to work again promptly. */
static void recovers_promptly_after_restart(int call_timeout_ms) {
  etcd_fixture_t *fixture = NULL;
  wagma_etcd_t *etcd = NULL;
  wagma_etcd_watch_t *watch = NULL;
  wagma_etcd_keepalive_t *keepalive = NULL;
  wagma_etcd_watch_options_t options = {.prefix = 1};
  wagma_etcd_options_t handle_options = {.call_timeout_ms = call_timeout_ms};
  recorder_t *r = calloc(1, sizeof *r);
  wagma_etcd_kv_t *kv = NULL;
  int64_t lease = 0, killed_at, healthy_at, recovered_at, put_ok_at, start;
  int lost = 0, rc = 0, failures = 0;

  recorder_init(r);
  assert_int_equal(etcd_fixture_start(1, &fixture), 0);
  handle_options.endpoints = etcd_fixture_endpoints(fixture);
  assert_int_equal(wagma_etcd_open(&handle_options, &etcd), 0);
  assert_int_equal(wagma_etcd_lease_grant(etcd, RECOVERY_LEASE_TTL_S, &lease), 0);
  assert_int_equal(wagma_etcd_keepalive_start(etcd, lease, lost_fn, &lost, &keepalive), 0);
  assert_int_equal(wagma_etcd_put(etcd, "/r/leased", "x", 1, lease, NULL), 0);
  assert_int_equal(wagma_etcd_watch_start(etcd, "/r/w/", &options, recorder_watch_fn, r, &watch),
                   0);
  assert_int_equal(wagma_etcd_put(etcd, "/r/w/before", "1", 1, 0, NULL), 0);
  assert_int_equal(recorder_wait_events(r, 1, 10000), 1);

  assert_int_equal(etcd_fixture_kill(fixture, 0), 0);
  killed_at = test_now_ms();
  /* calls fail (each within its deadline) while etcd is down */
  while (test_now_ms() - killed_at < 2500) {
    start = test_now_ms();
    rc = wagma_etcd_get(etcd, "/r/w/before", &kv, NULL);
    assert_int_equal(rc, WAGMA_EUNAVAIL);
    assert_true(test_now_ms() - start < call_timeout_ms + 3000);
    failures++;
  }
  assert_int_equal(etcd_fixture_restart(fixture, 0), 0);
  healthy_at = test_now_ms();

  /* the same handle works again within RECOVERY_BOUND_MS of etcd being healthy */
  while ((rc = wagma_etcd_get(etcd, "/r/w/before", &kv, NULL)) != 0) {
    if (test_now_ms() - healthy_at > RECOVERY_BOUND_MS)
      fail_msg("timeout %d ms: no call succeeded %lld ms after etcd was healthy: %d %s",
               call_timeout_ms, (long long)(test_now_ms() - healthy_at), rc,
               wagma_etcd_errmsg(etcd));
    test_sleep_ms(20);
  }
  recovered_at = test_now_ms();
  assert_string_equal(kv->value, "1");
  wagma_etcd_kv_free(kv);
  assert_int_equal(wagma_etcd_put(etcd, "/r/w/after", "2", 1, 0, NULL), 0);
  put_ok_at = test_now_ms();
  print_message("timeout %d ms: %d failed calls while down; first call ok %lld ms after "
                "etcd healthy\n",
                call_timeout_ms, failures, (long long)(recovered_at - healthy_at));

  /* the watch resumed: it delivers the put made after the restart */
  assert_int_equal(recorder_wait_events(r, 2, RECOVERY_BOUND_MS), 2);
  assert_string_equal(r->events[1].key, "/r/w/after");
  print_message("timeout %d ms: watch delivered %lld ms after the put\n", call_timeout_ms,
                (long long)(test_now_ms() - put_ok_at));

  /* the keepalive resumed: had it not refreshed since the kill, it would have reported the
   * lease lost by killed_at + TTL */
  while (test_now_ms() - killed_at < RECOVERY_LEASE_TTL_S * 1000 + 2000 &&
         __atomic_load_n(&lost, __ATOMIC_SEQ_CST) == 0)
    test_sleep_ms(100);
  assert_int_equal(__atomic_load_n(&lost, __ATOMIC_SEQ_CST), 0);
  assert_int_equal(wagma_etcd_get(etcd, "/r/leased", &kv, NULL), 0);
  wagma_etcd_kv_free(kv);

  wagma_etcd_keepalive_stop(keepalive);
  wagma_etcd_watch_stop(watch);
  wagma_etcd_close(etcd);
  etcd_fixture_stop(fixture);
  recorder_destroy(r);
  free(r);
}

static void recovers_promptly_after_restart_1000ms(void **state) {
  (void)state;
  recovers_promptly_after_restart(1000);
}

static void recovers_promptly_after_restart_500ms(void **state) {
  (void)state;
  recovers_promptly_after_restart(500);
}

/* etcd binds its client port before it is ready to serve, so a reconnection can meet a
 * listener that accepts TCP but sends no HTTP/2 SETTINGS (gRPC: "connection attempt timed
 * out before receiving SETTINGS frame"). Simulated with a silent listener held longer than
 * gRPC's connect timeout; once etcd serves again, the handle must recover promptly. */
static void recovers_after_a_silent_endpoint(void **state) {
  etcd_fixture_t *fixture = NULL;
  wagma_etcd_t *etcd = NULL;
  wagma_etcd_options_t options = {.call_timeout_ms = 1000};
  wagma_etcd_kv_t *kv = NULL;
  struct sockaddr_in address = {.sin_family = AF_INET};
  int rc, listener, one = 1, calls = 0;
  int64_t silent_at, healthy_at, start;
  (void)state;

  assert_int_equal(etcd_fixture_start(1, &fixture), 0);
  options.endpoints = etcd_fixture_endpoints(fixture);
  assert_int_equal(wagma_etcd_open(&options, &etcd), 0);
  assert_int_equal(wagma_etcd_put(etcd, "/s/k", "1", 1, 0, NULL), 0);
  assert_int_equal(etcd_fixture_kill(fixture, 0), 0);

  listener = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(listener >= 0);
  address.sin_port = htons((uint16_t)atoi(strchr(etcd_fixture_endpoint(fixture, 0), ':') + 1));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  assert_int_equal(bind(listener, (struct sockaddr *)&address, sizeof address), 0);
  assert_int_equal(listen(listener, 64), 0);
  silent_at = test_now_ms();
  while (test_now_ms() - silent_at < 7000) { /* > gRPC's 5 s connect timeout */
    start = test_now_ms();
    rc = wagma_etcd_get(etcd, "/s/k", &kv, NULL);
    if (rc != WAGMA_ETIMEDOUT && rc != WAGMA_EUNAVAIL)
      fail_msg("get from a silent endpoint: %d %s", rc, wagma_etcd_errmsg(etcd));
    assert_true(test_now_ms() - start < options.call_timeout_ms + 3000);
    assert_non_null(strstr(wagma_etcd_errmsg(etcd), etcd_fixture_endpoint(fixture, 0)));
    calls++;
    test_sleep_ms(200);
  }
  close(listener);
  assert_int_equal(etcd_fixture_restart(fixture, 0), 0);
  healthy_at = test_now_ms();
  while ((rc = wagma_etcd_get(etcd, "/s/k", &kv, NULL)) != 0) {
    if (test_now_ms() - healthy_at > RECOVERY_BOUND_MS)
      fail_msg("no call succeeded %lld ms after etcd was healthy: %d %s",
               (long long)(test_now_ms() - healthy_at), rc, wagma_etcd_errmsg(etcd));
    test_sleep_ms(20);
  }
  print_message("silent endpoint: %d failed calls; first call ok %lld ms after etcd healthy\n",
                calls, (long long)(test_now_ms() - healthy_at));
  assert_string_equal(kv->value, "1");
  wagma_etcd_kv_free(kv);
  wagma_etcd_close(etcd);
  etcd_fixture_stop(fixture);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(watch_survives_kill_and_restart),
      cmocka_unit_test(cluster_keeps_serving_without_one_member),
      cmocka_unit_test(keepalive_reports_loss_while_etcd_is_down),
      cmocka_unit_test(recovers_promptly_after_restart_1000ms),
      cmocka_unit_test(recovers_promptly_after_restart_500ms),
      cmocka_unit_test(recovers_after_a_silent_endpoint),
  };
  if (getenv("TEST_FILTER") != NULL) /* e.g. TEST_FILTER='recovers_*' */
    cmocka_set_test_filter(getenv("TEST_FILTER"));
  return cmocka_run_group_tests_name("etcd_failover", tests, NULL, NULL);
}
