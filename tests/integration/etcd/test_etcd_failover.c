/* Integration tests of libwagma_etcd when etcd fails: SIGKILL + restart on the same data
 * dir (watch resumes without loss or duplicates; calls fail fast and recover; keepalive
 * rides it out) and a 3-member cluster that loses a member. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "etcd_fixture.h"
#include "recorder.h"
#include "wagma/etcd.h"

#define CALL_TIMEOUT_MS 1500

static wagma_etcd_t *open_client(etcd_fixture_t *fixture) {
  wagma_etcd_t *etcd = NULL;
  wagma_etcd_options_t options = {.endpoints = etcd_fixture_endpoints(fixture),
                                  .call_timeout_ms = CALL_TIMEOUT_MS};
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
  int64_t first_rev = 0, last_rev = 0, lease = 0, start;
  wagma_etcd_kv_t *kv = NULL;
  int lost = 0;
  char key[64], value[32];
  (void)state;

  recorder_init(live);
  recorder_init(history);
  assert_int_equal(etcd_fixture_start(1, &fixture), 0);
  etcd = open_client(fixture);
  assert_int_equal(wagma_etcd_lease_grant(etcd, 10, &lease), 0);
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

    /* while it is down: a clear error within the deadline, not a hang */
    start = test_now_ms();
    assert_int_equal(wagma_etcd_get(etcd, "/f/w/k0", &kv, NULL), WAGMA_EUNAVAIL);
    assert_true(test_now_ms() - start < CALL_TIMEOUT_MS + 3000);
    assert_non_null(strstr(wagma_etcd_errmsg(etcd), etcd_fixture_endpoint(fixture, 0)));
    test_sleep_ms(300 * round);
    assert_int_equal(etcd_fixture_restart(fixture, 0), 0);
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

  /* The keepalive rode out the restarts: the leased key is still there. */
  assert_int_equal(__atomic_load_n(&lost, __ATOMIC_SEQ_CST), 0);
  assert_int_equal(wagma_etcd_get(etcd, "/f/leased", &kv, NULL), 0);
  wagma_etcd_kv_free(kv);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(watch_survives_kill_and_restart),
      cmocka_unit_test(cluster_keeps_serving_without_one_member),
      cmocka_unit_test(keepalive_reports_loss_while_etcd_is_down),
  };
  return cmocka_run_group_tests_name("etcd_failover", tests, NULL, NULL);
}
