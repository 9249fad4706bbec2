/* Integration tests of libwagma_etcd against one real etcd (started by etcd_fixture):
 * KV, Txn, leases and keepalive, watch order and prev_kv, compaction, election, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "etcd_fixture.h"
#include "recorder.h"
#include "wagma/etcd.h"

struct env {
  etcd_fixture_t *fixture;
  wagma_etcd_t *etcd;
};

static int setup(void **state) {
  static struct env env;
  wagma_etcd_options_t options = {0};
  if (etcd_fixture_start(1, &env.fixture) != 0)
    return -1;
  options.endpoints = etcd_fixture_endpoints(env.fixture);
  options.call_timeout_ms = 5000;
  if (wagma_etcd_open(&options, &env.etcd) != 0) {
    etcd_fixture_stop(env.fixture);
    return -1;
  }
  *state = &env;
  return 0;
}

static int teardown(void **state) {
  struct env *env = *state;
  wagma_etcd_close(env->etcd);
  etcd_fixture_stop(env->fixture);
  return 0;
}

static int put_str(wagma_etcd_t *etcd, const char *key, const char *value, int64_t *revision) {
  return wagma_etcd_put(etcd, key, value, strlen(value), 0, revision);
}

static void kv_put_get_delete(void **state) {
  struct env *env = *state;
  wagma_etcd_kv_t *kv = NULL, *prev = NULL;
  int64_t rev1 = 0, rev2 = 0, read_rev = 0, deleted = -1;

  assert_int_equal(wagma_etcd_ping(env->etcd, &read_rev), 0);
  assert_true(read_rev >= 1);
  assert_int_equal(put_str(env->etcd, "/t/kv/a", "one", &rev1), 0);
  assert_true(rev1 > read_rev);
  assert_int_equal(wagma_etcd_get(env->etcd, "/t/kv/a", &kv, &read_rev), 0);
  assert_string_equal(kv->key, "/t/kv/a");
  assert_int_equal(kv->key_len, 7);
  assert_string_equal(kv->value, "one");
  assert_int_equal(kv->value_len, 3);
  assert_int_equal(kv->version, 1);
  assert_int_equal(kv->create_revision, rev1);
  assert_int_equal(kv->mod_revision, rev1);
  assert_int_equal(kv->lease, 0);
  assert_int_equal(read_rev, rev1);
  wagma_etcd_kv_free(kv);

  /* put with prev_kv returns the old value; binary values round-trip. */
  {
    const char binary[4] = {'x', '\0', 'y', '\0'};
    assert_int_equal(
        wagma_etcd_put_prev(env->etcd, "/t/kv/a", binary, sizeof binary, 0, &prev, &rev2), 0);
    assert_non_null(prev);
    assert_string_equal(prev->value, "one");
    assert_int_equal(prev->mod_revision, rev1);
    wagma_etcd_kv_free(prev);
    assert_int_equal(wagma_etcd_get(env->etcd, "/t/kv/a", &kv, NULL), 0);
    assert_int_equal(kv->value_len, 4);
    assert_memory_equal(kv->value, binary, 4);
    assert_int_equal(kv->version, 2);
    assert_int_equal(kv->mod_revision, rev2);
    assert_int_equal(kv->create_revision, rev1);
    wagma_etcd_kv_free(kv);
  }
  /* prev of a new key is NULL */
  assert_int_equal(wagma_etcd_put_prev(env->etcd, "/t/kv/new", "v", 1, 0, &prev, NULL), 0);
  assert_null(prev);

  assert_int_equal(wagma_etcd_delete(env->etcd, "/t/kv/a", 0, &deleted, NULL), 0);
  assert_int_equal(deleted, 1);
  assert_int_equal(wagma_etcd_get(env->etcd, "/t/kv/a", &kv, NULL), WAGMA_ENOTFOUND);
  assert_null(kv);
  assert_int_equal(wagma_etcd_delete(env->etcd, "/t/kv/a", 0, &deleted, NULL), 0);
  assert_int_equal(deleted, 0);
}

static void kv_range_prefix_options(void **state) {
  struct env *env = *state;
  wagma_etcd_range_t range;
  wagma_etcd_range_options_t options = {0};
  int64_t rev_after_two = 0, deleted = 0;
  char key[64], value[32];

  for (int i = 0; i < 5; i++) {
    snprintf(key, sizeof key, "/t/range/k%d", i);
    snprintf(value, sizeof value, "v%d", i);
    assert_int_equal(put_str(env->etcd, key, value, i == 1 ? &rev_after_two : NULL), 0);
  }
  assert_int_equal(put_str(env->etcd, "/t/range0", "outside", NULL), 0);
  assert_int_equal(put_str(env->etcd, "/t/rang", "outside", NULL), 0);

  options.prefix = 1;
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/range/", &options, &range), 0);
  assert_int_equal(range.n, 5);
  assert_int_equal(range.count, 5);
  assert_false(range.more);
  for (size_t i = 0; i < range.n; i++) {
    snprintf(key, sizeof key, "/t/range/k%zu", i);
    snprintf(value, sizeof value, "v%zu", i);
    assert_string_equal(range.kvs[i].key, key);
    assert_string_equal(range.kvs[i].value, value);
  }
  wagma_etcd_range_free(&range);
  assert_null(range.kvs);

  options.limit = 2;
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/range/", &options, &range), 0);
  assert_int_equal(range.n, 2);
  assert_int_equal(range.count, 5);
  assert_true(range.more);
  wagma_etcd_range_free(&range);

  options.limit = 0;
  options.revision = rev_after_two;
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/range/", &options, &range), 0);
  assert_int_equal(range.n, 2);
  assert_string_equal(range.kvs[1].key, "/t/range/k1");
  wagma_etcd_range_free(&range);

  options.revision = 0;
  options.keys_only = 1;
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/range/", &options, &range), 0);
  assert_int_equal(range.n, 5);
  assert_string_equal(range.kvs[4].key, "/t/range/k4");
  assert_int_equal(range.kvs[4].value_len, 0);
  assert_string_equal(range.kvs[4].value, "");
  wagma_etcd_range_free(&range);

  options.keys_only = 0;
  options.count_only = 1;
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/range/", &options, &range), 0);
  assert_int_equal(range.n, 0);
  assert_int_equal(range.count, 5);
  wagma_etcd_range_free(&range);

  /* an empty prefix range is not an error */
  options.count_only = 0;
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/nothing/", &options, &range), 0);
  assert_int_equal(range.n, 0);
  assert_true(range.revision > 0);
  wagma_etcd_range_free(&range);

  assert_int_equal(wagma_etcd_delete(env->etcd, "/t/range/", 1, &deleted, NULL), 0);
  assert_int_equal(deleted, 5);
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/range", &options, &range), 0);
  assert_int_equal(range.n, 1); /* /t/range0 is under the prefix /t/range, /t/rang is not */
  assert_string_equal(range.kvs[0].key, "/t/range0");
  wagma_etcd_range_free(&range);
  options.prefix = 0;
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/rang", &options, &range), 0);
  assert_int_equal(range.n, 1);
  wagma_etcd_range_free(&range);
}

static void txn_compares_and_branches(void **state) {
  struct env *env = *state;
  wagma_etcd_txn_result_t result;
  wagma_etcd_kv_t *kv = NULL;
  int64_t rev = 0;

  /* create-if-absent: version == 0 */
  wagma_etcd_cmp_t absent = {
      .key = "/t/txn/a", .target = WAGMA_ETCD_CMP_VERSION, .result = WAGMA_ETCD_EQUAL, .number = 0};
  wagma_etcd_op_t create[] = {
      {.type = WAGMA_ETCD_OP_PUT, .key = "/t/txn/a", .value = "1", .value_len = 1},
      {.type = WAGMA_ETCD_OP_PUT, .key = "/t/txn/b", .value = "2", .value_len = 1}};
  wagma_etcd_op_t read_a[] = {{.type = WAGMA_ETCD_OP_RANGE, .key = "/t/txn/a"}};
  assert_int_equal(wagma_etcd_txn(env->etcd, &absent, 1, create, 2, read_a, 1, &result), 0);
  assert_true(result.succeeded);
  assert_int_equal(result.n, 2);
  assert_int_equal(result.results[0].type, WAGMA_ETCD_OP_PUT);
  rev = result.revision;
  wagma_etcd_txn_result_free(&result);

  /* again: the compare fails, the else branch reads the key */
  assert_int_equal(wagma_etcd_txn(env->etcd, &absent, 1, create, 2, read_a, 1, &result),
                   WAGMA_ECONFLICT);
  assert_false(result.succeeded);
  assert_int_equal(result.n, 1);
  assert_int_equal(result.results[0].type, WAGMA_ETCD_OP_RANGE);
  assert_int_equal(result.results[0].range.n, 1);
  assert_string_equal(result.results[0].range.kvs[0].value, "1");
  assert_int_equal(result.results[0].range.kvs[0].mod_revision, rev);
  wagma_etcd_txn_result_free(&result);

  /* guarded update on mod revision, create revision and value; delete + range in then */
  {
    wagma_etcd_cmp_t guards[] = {{.key = "/t/txn/a",
                                  .target = WAGMA_ETCD_CMP_MOD,
                                  .result = WAGMA_ETCD_EQUAL,
                                  .number = rev},
                                 {.key = "/t/txn/a",
                                  .target = WAGMA_ETCD_CMP_CREATE,
                                  .result = WAGMA_ETCD_LESS,
                                  .number = rev + 1},
                                 {.key = "/t/txn/b",
                                  .target = WAGMA_ETCD_CMP_VALUE,
                                  .result = WAGMA_ETCD_EQUAL,
                                  .value = "2",
                                  .value_len = 1},
                                 {.key = "/t/txn/a",
                                  .target = WAGMA_ETCD_CMP_VERSION,
                                  .result = WAGMA_ETCD_GREATER,
                                  .number = 0},
                                 {.key = "/t/txn/b",
                                  .target = WAGMA_ETCD_CMP_VALUE,
                                  .result = WAGMA_ETCD_NOT_EQUAL,
                                  .value = "3",
                                  .value_len = 1}};
    wagma_etcd_op_t then_ops[] = {
        {.type = WAGMA_ETCD_OP_PUT, .key = "/t/txn/a", .value = "11", .value_len = 2},
        {.type = WAGMA_ETCD_OP_DELETE, .key = "/t/txn/b"},
        {.type = WAGMA_ETCD_OP_RANGE, .key = "/t/txn/", .prefix = 1}};
    assert_int_equal(wagma_etcd_txn(env->etcd, guards, 5, then_ops, 3, NULL, 0, &result), 0);
    assert_int_equal(result.n, 3);
    assert_int_equal(result.results[1].type, WAGMA_ETCD_OP_DELETE);
    assert_int_equal(result.results[1].deleted, 1);
    assert_int_equal(result.results[2].range.n, 1); /* b deleted, a updated */
    assert_string_equal(result.results[2].range.kvs[0].value, "11");
    wagma_etcd_txn_result_free(&result);

    /* the same guards now fail (mod revision moved on); NULL result is fine */
    assert_int_equal(wagma_etcd_txn(env->etcd, guards, 5, then_ops, 3, NULL, 0, NULL),
                     WAGMA_ECONFLICT);
  }
  assert_int_equal(wagma_etcd_get(env->etcd, "/t/txn/a", &kv, NULL), 0);
  assert_string_equal(kv->value, "11");
  wagma_etcd_kv_free(kv);

  /* prefix delete inside a txn */
  {
    wagma_etcd_op_t wipe = {.type = WAGMA_ETCD_OP_DELETE, .key = "/t/txn/", .prefix = 1};
    assert_int_equal(wagma_etcd_txn(env->etcd, NULL, 0, &wipe, 1, NULL, 0, &result), 0);
    assert_int_equal(result.results[0].deleted, 1);
    wagma_etcd_txn_result_free(&result);
  }
  /* bad input is rejected before anything is sent */
  {
    wagma_etcd_op_t bad = {.type = WAGMA_ETCD_OP_PUT, .key = ""};
    assert_int_equal(wagma_etcd_txn(env->etcd, NULL, 0, &bad, 1, NULL, 0, NULL), WAGMA_EINVAL);
  }
}

static void lost_fn(void *user, int64_t lease, int status) {
  (void)lease;
  __atomic_store_n((int *)user, status, __ATOMIC_SEQ_CST);
}

static void lease_expiry_and_keepalive(void **state) {
  struct env *env = *state;
  int64_t kept = 0, dropped = 0, remaining = -1, granted = -1, ttl = 0;
  wagma_etcd_keepalive_t *keepalive = NULL;
  wagma_etcd_kv_t *kv = NULL, *kv2 = NULL;
  int lost_status = 0;
  int64_t start;

  assert_int_equal(wagma_etcd_lease_grant(env->etcd, 2, &kept), 0);
  assert_int_equal(wagma_etcd_lease_grant(env->etcd, 2, &dropped), 0);
  assert_int_not_equal(kept, dropped);
  assert_int_equal(wagma_etcd_lease_ttl(env->etcd, kept, &remaining, &granted), 0);
  assert_int_equal(granted, 2);
  assert_true(remaining >= 0 && remaining <= 2);
  assert_int_equal(wagma_etcd_put(env->etcd, "/t/lease/kept", "k", 1, kept, NULL), 0);
  assert_int_equal(wagma_etcd_put(env->etcd, "/t/lease/dropped", "d", 1, dropped, NULL), 0);
  assert_int_equal(wagma_etcd_keepalive_start(env->etcd, kept, lost_fn, &lost_status, &keepalive),
                   0);

  /* The unrefreshed lease expires (etcd checks expiry about every 500 ms). */
  start = test_now_ms();
  while (wagma_etcd_get(env->etcd, "/t/lease/dropped", &kv2, NULL) == 0 &&
         test_now_ms() - start < 15000) {
    wagma_etcd_kv_free(kv2);
    kv2 = NULL;
    test_sleep_ms(200);
  }
  assert_null(kv2);
  assert_true(test_now_ms() - start >= 1000);
  assert_int_equal(wagma_etcd_lease_ttl(env->etcd, dropped, NULL, NULL), WAGMA_ENOTFOUND);
  assert_int_equal(wagma_etcd_lease_keepalive_once(env->etcd, dropped, NULL), WAGMA_ENOTFOUND);

  /* The kept one is still there well past its TTL. */
  test_sleep_ms(1500);
  assert_int_equal(wagma_etcd_get(env->etcd, "/t/lease/kept", &kv, NULL), 0);
  assert_int_equal(kv->lease, kept);
  wagma_etcd_kv_free(kv);
  assert_int_equal(__atomic_load_n(&lost_status, __ATOMIC_SEQ_CST), 0);
  assert_int_equal(wagma_etcd_lease_keepalive_once(env->etcd, kept, &ttl), 0);
  assert_int_equal(ttl, 2);

  /* Revoking deletes the key and the keepalive reports the loss. */
  assert_int_equal(wagma_etcd_lease_revoke(env->etcd, kept), 0);
  assert_int_equal(wagma_etcd_get(env->etcd, "/t/lease/kept", &kv, NULL), WAGMA_ENOTFOUND);
  start = test_now_ms();
  while (__atomic_load_n(&lost_status, __ATOMIC_SEQ_CST) == 0 && test_now_ms() - start < 10000)
    test_sleep_ms(50);
  assert_int_equal(__atomic_load_n(&lost_status, __ATOMIC_SEQ_CST), WAGMA_ENOTFOUND);
  wagma_etcd_keepalive_stop(keepalive);
  assert_int_equal(wagma_etcd_lease_revoke(env->etcd, kept), WAGMA_ENOTFOUND);
  assert_int_equal(wagma_etcd_keepalive_start(env->etcd, kept, NULL, NULL, &keepalive),
                   WAGMA_ENOTFOUND);
  assert_null(keepalive);
}

static void watch_prefix_in_order(void **state) {
  struct env *env = *state;
  recorder_t *r = calloc(1, sizeof *r), *history = calloc(1, sizeof *history);
  wagma_etcd_watch_t *watch = NULL, *replay = NULL;
  wagma_etcd_watch_options_t options = {.prefix = 1, .prev_kv = 1};
  int64_t first = 0;
  char key[64], value[32];

  recorder_init(r);
  recorder_init(history);
  assert_int_equal(put_str(env->etcd, "/t/watch/old", "before", &first), 0);
  assert_int_equal(
      wagma_etcd_watch_start(env->etcd, "/t/watch/", &options, recorder_watch_fn, r, &watch), 0);
  for (int i = 0; i < 20; i++) {
    snprintf(key, sizeof key, "/t/watch/k%d", i % 3);
    snprintf(value, sizeof value, "%d", i);
    assert_int_equal(put_str(env->etcd, key, value, NULL), 0);
  }
  assert_int_equal(wagma_etcd_delete(env->etcd, "/t/watch/k1", 0, NULL, NULL), 0);
  assert_int_equal(put_str(env->etcd, "/t/watchX", "outside", NULL), 0);
  {
    /* a txn's several events arrive together, in order */
    wagma_etcd_op_t ops[] = {
        {.type = WAGMA_ETCD_OP_PUT, .key = "/t/watch/t1", .value = "a", .value_len = 1},
        {.type = WAGMA_ETCD_OP_PUT, .key = "/t/watch/t2", .value = "b", .value_len = 1}};
    assert_int_equal(wagma_etcd_txn(env->etcd, NULL, 0, ops, 2, NULL, 0, NULL), 0);
  }
  assert_int_equal(recorder_wait_events(r, 23, 10000), 23);
  test_sleep_ms(200); /* nothing more may arrive */
  pthread_mutex_lock(&r->lock);
  assert_int_equal(r->n, 23);
  assert_false(r->bad_order);
  for (int i = 0; i < 20; i++) {
    snprintf(key, sizeof key, "/t/watch/k%d", i % 3);
    snprintf(value, sizeof value, "%d", i);
    assert_int_equal(r->events[i].type, WAGMA_ETCD_EVENT_PUT);
    assert_string_equal(r->events[i].key, key);
    assert_string_equal(r->events[i].value, value);
    assert_int_equal(r->events[i].has_prev, i >= 3);
    if (i >= 3) {
      snprintf(value, sizeof value, "%d", i - 3);
      assert_string_equal(r->events[i].prev_value, value);
    }
    if (i > 0)
      assert_int_equal(r->events[i].mod_revision, r->events[i - 1].mod_revision + 1);
  }
  assert_int_equal(r->events[20].type, WAGMA_ETCD_EVENT_DELETE);
  assert_string_equal(r->events[20].key, "/t/watch/k1");
  assert_string_equal(r->events[21].key, "/t/watch/t1");
  assert_string_equal(r->events[22].key, "/t/watch/t2");
  assert_int_equal(r->events[21].mod_revision, r->events[22].mod_revision);
  pthread_mutex_unlock(&r->lock);
  wagma_etcd_watch_stop(watch);

  /* From a past revision: history replays from there, the same events. */
  options.start_revision = first;
  options.prev_kv = 0;
  assert_int_equal(
      wagma_etcd_watch_start(env->etcd, "/t/watch/", &options, recorder_watch_fn, history, &replay),
      0);
  assert_int_equal(recorder_wait_events(history, 24, 10000), 24);
  assert_string_equal(history->events[0].value, "before");
  for (int i = 0; i < 23; i++)
    assert_int_equal(history->events[i + 1].mod_revision, r->events[i].mod_revision);
  wagma_etcd_watch_stop(replay);
  recorder_destroy(r);
  recorder_destroy(history);
  free(r);
  free(history);
}

static void watch_reports_compaction(void **state) {
  struct env *env = *state;
  recorder_t *r = calloc(1, sizeof *r);
  wagma_etcd_watch_t *watch = NULL;
  wagma_etcd_watch_options_t options = {0};
  wagma_etcd_range_options_t at_old = {0};
  wagma_etcd_range_t range;
  int64_t old_rev = 0, last = 0;
  char args[64];

  recorder_init(r);
  assert_int_equal(put_str(env->etcd, "/t/compact", "0", &old_rev), 0);
  for (int i = 1; i <= 5; i++)
    assert_int_equal(put_str(env->etcd, "/t/compact", "x", &last), 0);
  snprintf(args, sizeof args, "compact %lld", (long long)last);
  assert_int_equal(etcd_fixture_etcdctl(env->fixture, args), 0);

  at_old.revision = old_rev;
  assert_int_equal(wagma_etcd_range(env->etcd, "/t/compact", &at_old, &range), WAGMA_ECOMPACTED);
  assert_non_null(strstr(wagma_etcd_errmsg(env->etcd), "compacted"));

  options.start_revision = old_rev;
  assert_int_equal(
      wagma_etcd_watch_start(env->etcd, "/t/compact", &options, recorder_watch_fn, r, &watch), 0);
  assert_true(recorder_wait_compacted(r, 10000));
  pthread_mutex_lock(&r->lock);
  assert_int_equal(r->compact_revision, last);
  assert_int_equal(r->n, 0);
  pthread_mutex_unlock(&r->lock);
  wagma_etcd_watch_stop(watch);
  recorder_destroy(r);
  free(r);
}

/* ---- election ----------------------------------------------------------------------- */

struct campaigner {
  wagma_etcd_election_t *election;
  int64_t lease;
  const char *value;
  int timeout_ms;
  int rc;
};

static void *campaign_thread(void *arg) {
  struct campaigner *c = arg;
  c->rc = wagma_etcd_election_campaign(c->election, c->lease, c->value, strlen(c->value),
                                       c->timeout_ms);
  return NULL;
}

static void election_two_clients(void **state) {
  struct env *env = *state;
  wagma_etcd_t *other = NULL;
  wagma_etcd_options_t options = {.endpoints = etcd_fixture_endpoints(env->fixture)};
  wagma_etcd_election_t *a = NULL, *b = NULL;
  wagma_etcd_keepalive_t *ka_a = NULL, *ka_b = NULL;
  wagma_etcd_watch_t *observer = NULL;
  wagma_etcd_kv_t *leader = NULL;
  recorder_t *r = calloc(1, sizeof *r);
  int64_t lease_a = 0, lease_b = 0, start;
  struct campaigner cb;
  pthread_t thread;
  const char *name = "/t/election/coordinator";

  recorder_init(r);
  assert_int_equal(wagma_etcd_open(&options, &other), 0);
  assert_int_equal(wagma_etcd_election_leader(env->etcd, name, &leader), WAGMA_ENOTFOUND);
  assert_int_equal(wagma_etcd_election_observe(other, name, recorder_leader_fn, r, &observer), 0);
  assert_true(recorder_wait_leader(r, "", 5000));

  assert_int_equal(wagma_etcd_lease_grant(env->etcd, 5, &lease_a), 0);
  assert_int_equal(wagma_etcd_lease_grant(other, 5, &lease_b), 0);
  assert_int_equal(wagma_etcd_keepalive_start(env->etcd, lease_a, NULL, NULL, &ka_a), 0);
  assert_int_equal(wagma_etcd_keepalive_start(other, lease_b, NULL, NULL, &ka_b), 0);
  assert_int_equal(wagma_etcd_election_open(env->etcd, name, &a), 0);
  assert_int_equal(wagma_etcd_election_open(other, name, &b), 0);

  assert_int_equal(wagma_etcd_election_campaign(a, lease_a, "A", 1, 5000), 0);
  assert_true(wagma_etcd_election_is_leader(a));
  assert_true(recorder_wait_leader(r, "A", 5000));
  assert_int_equal(wagma_etcd_election_leader(other, name, &leader), 0);
  assert_string_equal(leader->value, "A");
  assert_int_equal(leader->lease, lease_a);
  wagma_etcd_kv_free(leader);

  /* B cannot win while A leads: a deadline ... */
  start = test_now_ms();
  assert_int_equal(wagma_etcd_election_campaign(b, lease_b, "B", 1, 700), WAGMA_ETIMEDOUT);
  assert_true(test_now_ms() - start >= 600);
  assert_false(wagma_etcd_election_is_leader(b));
  /* ... and a cancel end a campaign. */
  cb = (struct campaigner){.election = b, .lease = lease_b, .value = "B", .timeout_ms = 0};
  assert_int_equal(pthread_create(&thread, NULL, campaign_thread, &cb), 0);
  test_sleep_ms(300);
  wagma_etcd_election_cancel(b);
  pthread_join(thread, NULL);
  assert_int_equal(cb.rc, WAGMA_ECANCELED);

  /* Proclaim changes the value observers see. */
  assert_int_equal(wagma_etcd_election_proclaim(a, "A2", 2), 0);
  assert_true(recorder_wait_leader(r, "A2", 5000));
  assert_int_equal(wagma_etcd_election_proclaim(b, "B?", 2), WAGMA_EPERM);

  /* B campaigns in the background; A resigns; B takes over. */
  cb = (struct campaigner){.election = b, .lease = lease_b, .value = "B", .timeout_ms = 10000};
  assert_int_equal(pthread_create(&thread, NULL, campaign_thread, &cb), 0);
  test_sleep_ms(300);
  assert_int_equal(wagma_etcd_election_resign(a), 0);
  assert_false(wagma_etcd_election_is_leader(a));
  pthread_join(thread, NULL);
  assert_int_equal(cb.rc, 0);
  assert_true(wagma_etcd_election_is_leader(b));
  assert_true(recorder_wait_leader(r, "B", 5000));

  /* When B's lease goes, nobody leads. */
  wagma_etcd_keepalive_stop(ka_b);
  assert_int_equal(wagma_etcd_lease_revoke(other, lease_b), 0);
  assert_true(recorder_wait_leader(r, "", 5000));
  assert_int_equal(wagma_etcd_election_resign(a), 0); /* not leading: no-op */

  wagma_etcd_watch_stop(observer);
  wagma_etcd_election_close(a);
  wagma_etcd_election_close(b);
  wagma_etcd_keepalive_stop(ka_a);
  assert_int_equal(wagma_etcd_lease_revoke(env->etcd, lease_a), 0);
  wagma_etcd_close(other);
  recorder_destroy(r);
  free(r);
}

/* ---- errors ------------------------------------------------------------------------- */

static void bad_input_and_unreachable(void **state) {
  struct env *env = *state;
  wagma_etcd_t *nowhere = NULL;
  wagma_etcd_options_t options = {.endpoints = "127.0.0.1:1", .call_timeout_ms = 800};
  wagma_etcd_range_t range;
  wagma_etcd_kv_t *kv = NULL;
  wagma_etcd_watch_t *watch = NULL;
  recorder_t r;
  int64_t start;

  assert_int_equal(wagma_etcd_open(&(wagma_etcd_options_t){.endpoints = " , "}, &nowhere),
                   WAGMA_EINVAL);
  assert_int_equal(wagma_etcd_open(NULL, &nowhere), WAGMA_EINVAL);
  assert_int_equal(wagma_etcd_put(env->etcd, "", "x", 1, 0, NULL), WAGMA_EINVAL);
  assert_int_equal(wagma_etcd_put(env->etcd, "/k", NULL, 3, 0, NULL), WAGMA_EINVAL);
  assert_int_equal(wagma_etcd_range(env->etcd, NULL, NULL, &range), WAGMA_EINVAL);
  assert_int_equal(wagma_etcd_lease_grant(env->etcd, 0, &start), WAGMA_EINVAL);
  /* etcd's own rejection: a lease that does not exist */
  assert_int_equal(wagma_etcd_put(env->etcd, "/t/err", "x", 1, 12345, NULL), WAGMA_ENOTFOUND);
  assert_non_null(strstr(wagma_etcd_errmsg(env->etcd), etcd_fixture_endpoint(env->fixture, 0)));
  assert_non_null(strstr(wagma_etcd_errmsg(env->etcd), "NOT_FOUND"));

  /* Nothing listens: a clear error within the deadline, not a hang. */
  recorder_init(&r);
  assert_int_equal(wagma_etcd_open(&options, &nowhere), 0);
  start = test_now_ms();
  assert_int_equal(wagma_etcd_get(nowhere, "/k", &kv, NULL), WAGMA_EUNAVAIL);
  assert_true(test_now_ms() - start < 5000);
  assert_non_null(strstr(wagma_etcd_errmsg(nowhere), "127.0.0.1:1"));
  assert_non_null(strstr(wagma_etcd_errmsg(nowhere), "UNAVAILABLE"));
  start = test_now_ms();
  assert_int_equal(wagma_etcd_watch_start(nowhere, "/k", NULL, recorder_watch_fn, &r, &watch),
                   WAGMA_EUNAVAIL);
  assert_null(watch);
  assert_true(test_now_ms() - start < 5000);
  assert_non_null(strstr(wagma_etcd_errmsg(nowhere), "127.0.0.1:1"));
  wagma_etcd_close(nowhere);
  recorder_destroy(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(kv_put_get_delete),         cmocka_unit_test(kv_range_prefix_options),
      cmocka_unit_test(txn_compares_and_branches), cmocka_unit_test(lease_expiry_and_keepalive),
      cmocka_unit_test(watch_prefix_in_order),     cmocka_unit_test(watch_reports_compaction),
      cmocka_unit_test(election_two_clients),      cmocka_unit_test(bad_input_and_unreachable),
  };
  return cmocka_run_group_tests_name("etcd", tests, setup, teardown);
}
