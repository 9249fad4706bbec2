/* test_agent_auth.c — the per-epoch data-plane secret end to end (issue 9 item 5): a real
 * etcd, a real wagma-coordinator and real wagma-agent processes on 127.0.0.1.
 *
 *  - the agents of a job run authenticated: each member logs "data plane authenticated" and
 *    none logs the collective's "unauthenticated" warning; <prefix>/secrets/<job>/<epoch>
 *    exists for the epoch (64 hex characters), a new epoch (PATCH workers) gets a new secret,
 *    the epoch before stays and the one before that is deleted (in the plan's Txn), and all of
 *    them go when the job is stopped;
 *  - no REST response holds a secret: every GET (jobs list, job, plan, groups, the job's
 *    timeline, agents, metrics, healthz, readyz, the web view's page) and both event streams
 *    (/v1/events and the job's, read from before the first plan until the check) are searched
 *    for each secret seen, as lower- and upper-case hex, base64 (standard and URL-safe) and raw
 *    bytes;
 *  - an impostor that knows the plan (GET /v1/jobs/{id}/plan) but not the secret cannot join a
 *    member's mesh: while rank 1 is stopped (SIGSTOP) rank 0 waits for it, and the impostor
 *    connects to rank 0's collective port as rank 1: an unauthenticated HELLO and one with a
 *    forged proof are both refused (no step 2, resp. a proof that does not verify, then the
 *    connection dropped), rank 0 logs the refusals, and once rank 1 resumes (SIGCONT) the real
 *    member joins and the job trains.
 * Before the secrets were wired every check failed: no secret keys, the agents logged "no
 * secret: the data plane of epoch E is unauthenticated", and the unauthenticated HELLO of the
 * impostor completed its handshake as rank 1.
 * Everything started is stopped by PID (cluster.c). */
#define _GNU_SOURCE /* memmem */
#include <ctype.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <pthread.h>

#include "cluster.h"
#include "wagma/api.h"
#include "wagma/etcd.h"
#include "world.h"

static const char *const agent_args[] = {"--lease-ttl",
                                         "10",
                                         "--progress-interval",
                                         "0.3",
                                         "--round-deadline",
                                         "0.3",
                                         "--synthetic-train",
                                         "4096",
                                         "--synthetic-test",
                                         "1024",
                                         "--eval-samples",
                                         "512",
                                         "--linger",
                                         "5",
                                         "--connect-timeout",
                                         "30",
                                         NULL};

#define MAX_SECRETS 16

typedef struct seen_secret {
  char job[64];
  uint64_t epoch;
  char hex[2 * WAGMA_API_SECRET_LEN + 1];
} seen_secret_t;

static seen_secret_t seen[MAX_SECRETS];
static int nseen;

/* An event stream (text/event-stream) read by a thread from before the first secret was
 * written until the REST check: whatever the coordinator streamed meanwhile. */
typedef struct stream {
  const cluster_t *c;
  const char *path;
  pthread_t thread;
  pthread_mutex_t mu;
  char *buf;
  size_t len, cap;
  volatile int stop;
  long status;
} stream_t;

static stream_t streams[2] = {{.path = "/v1/events"}, {.path = "/v1/jobs/authed/events"}};

static int setup(void **state) {
  return cluster_group_setup(state, 3, agent_args);
}

static void streams_stop(void);

static int teardown(void **state) {
  streams_stop();
  return cluster_group_teardown(state);
}

/* ---- etcd ------------------------------------------------------------------------------ */

static wagma_etcd_t *etcd_of(const cluster_t *c) {
  static wagma_etcd_t *etcd;
  if (!etcd) {
    wagma_etcd_options_t o = {.endpoints = etcd_fixture_endpoints(c->etcd),
                              .call_timeout_ms = 3000};
    assert_int_equal(wagma_etcd_open(&o, &etcd), 0);
  }
  return etcd;
}

/* The secrets of job in etcd: epochs[] and their hex values (n returned, at most max). */
static int job_secrets(const cluster_t *c, const char *job, uint64_t *epochs, char (*hex)[65],
                       int max) {
  wagma_keys_t keys;
  char prefix[256];
  wagma_etcd_range_t r;
  wagma_etcd_range_options_t opt = {.prefix = 1};
  int n = 0;
  memset(&r, 0, sizeof r);
  wagma_keys_init(&keys, "/wagma");
  wagma_key_job_secrets_prefix(&keys, job, prefix, sizeof prefix);
  assert_int_equal(wagma_etcd_range(etcd_of(c), prefix, &opt, &r), 0);
  for (size_t i = 0; i < r.n && n < max; i++) {
    assert_int_equal(wagma_key_secret_epoch(r.kvs[i].key, r.kvs[i].key_len, &epochs[n]), 0);
    assert_int_equal(r.kvs[i].value_len, 2 * WAGMA_API_SECRET_LEN);
    for (size_t k = 0; k < r.kvs[i].value_len; k++)
      assert_true(isxdigit((unsigned char)r.kvs[i].value[k]));
    memcpy(hex[n], r.kvs[i].value, 64);
    hex[n][64] = '\0';
    n++;
  }
  wagma_etcd_range_free(&r);
  return n;
}

static void remember(const char *job, uint64_t epoch, const char *hex) {
  for (int i = 0; i < nseen; i++)
    if (strcmp(seen[i].hex, hex) == 0)
      return;
  if (nseen < MAX_SECRETS) {
    snprintf(seen[nseen].job, sizeof seen[nseen].job, "%s", job);
    seen[nseen].epoch = epoch;
    memcpy(seen[nseen].hex, hex, sizeof seen[nseen].hex - 1);
    seen[nseen].hex[sizeof seen[nseen].hex - 1] = '\0';
    nseen++;
  }
}

/* The secret of (job, epoch) in etcd, into hex (65 bytes); 0 when found. */
static int secret_of(const cluster_t *c, const char *job, uint64_t epoch, char *hex) {
  uint64_t epochs[8];
  char vals[8][65];
  int n = job_secrets(c, job, epochs, vals, 8);
  for (int i = 0; i < n; i++) {
    remember(job, epochs[i], vals[i]);
    if (epochs[i] == epoch) {
      memcpy(hex, vals[i], 65);
      return 0;
    }
  }
  return -1;
}

/* ---- REST ------------------------------------------------------------------------------- */

#define submit(c, json) assert_int_equal(cluster_job_submit(c, "%s", json), 0)

#define patch_workers(c, job, n) assert_int_equal(cluster_job_patch_workers(c, job, n), 0)

#define stop_job(c, job) assert_int_equal(cluster_job_stop(c, job, 30), 0)

/* Waits for an epoch > after with n members that all report progress of it. */
static int wait_epoch(cluster_t *c, const char *job, uint64_t after, int n, double timeout_s,
                      job_view_t *v) {
  double deadline = cluster_now() + timeout_s;
  while (cluster_now() < deadline) {
    if (cluster_job_get(c, job, v) == 0 && v->epoch > after && v->nmembers == n) {
      int ok = 1;
      for (int i = 0; i < v->nmembers; i++)
        ok &= v->members[i].has_progress && v->members[i].epoch == v->epoch &&
              v->members[i].iteration > 0;
      if (ok)
        return 0;
    }
    cluster_sleep(0.2);
  }
  fprintf(stderr, "job %s: no epoch > %llu with %d members (epoch %llu, %d)\n", job,
          (unsigned long long)after, n, (unsigned long long)v->epoch, v->nmembers);
  cluster_dump_logs(c);
  return -1;
}

static size_t stream_data(char *p, size_t size, size_t n, void *user) {
  stream_t *st = user;
  size_t k = size * n;
  pthread_mutex_lock(&st->mu);
  if (st->len + k + 1 > st->cap) {
    size_t cap = (st->len + k + 1) * 2;
    char *b = realloc(st->buf, cap);
    if (!b) {
      pthread_mutex_unlock(&st->mu);
      return 0;
    }
    st->buf = b;
    st->cap = cap;
  }
  memcpy(st->buf + st->len, p, k);
  st->len += k;
  st->buf[st->len] = '\0';
  pthread_mutex_unlock(&st->mu);
  return k;
}

static int stream_progress(void *user, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
  (void)a, (void)b, (void)c, (void)d;
  return ((stream_t *)user)->stop; /* non-zero ends the transfer */
}

static void *stream_main(void *arg) {
  stream_t *st = arg;
  char url[256];
  struct curl_slist *hdr = curl_slist_append(NULL, "Accept: text/event-stream");
  CURL *h = curl_easy_init();
  snprintf(url, sizeof url, "%s%s", st->c->api, st->path);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stream_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, st);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, stream_progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, st);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 200L);
  curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st->status);
  curl_easy_cleanup(h);
  curl_slist_free_all(hdr);
  return NULL;
}

static void streams_start(const cluster_t *c) {
  for (int i = 0; i < 2; i++) {
    streams[i].c = c;
    pthread_mutex_init(&streams[i].mu, NULL);
    assert_int_equal(pthread_create(&streams[i].thread, NULL, stream_main, &streams[i]), 0);
  }
}

static void streams_stop(void) {
  for (int i = 0; i < 2; i++) {
    if (!streams[i].c)
      continue;
    streams[i].stop = 1;
    pthread_join(streams[i].thread, NULL);
    streams[i].c = NULL;
  }
}

/* ---- encodings of a secret --------------------------------------------------------------- */

static void base64(const uint8_t *in, size_t n, int url, char *out) {
  const char *a = url ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                      : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                 (i + 2 < n ? in[i + 2] : 0);
    out[o++] = a[v >> 18 & 63];
    out[o++] = a[v >> 12 & 63];
    if (i + 1 < n)
      out[o++] = a[v >> 6 & 63];
    if (i + 2 < n)
      out[o++] = a[v & 63];
  }
  out[o] = '\0'; /* no padding: a prefix match finds padded forms too */
}

/* Whether body (len bytes) holds the secret hex in any of the forms. */
static const char *holds_secret(const char *body, size_t len, const char *hex) {
  uint8_t raw[WAGMA_API_SECRET_LEN];
  char upper[65], b64[64], b64url[64];
  assert_int_equal(wagma_secret_from_hex(hex, strlen(hex), raw, sizeof raw), 0);
  for (int i = 0; i < 65; i++)
    upper[i] = (char)toupper((unsigned char)hex[i]);
  base64(raw, sizeof raw, 0, b64);
  base64(raw, sizeof raw, 1, b64url);
  if (memmem(body, len, hex, 64))
    return "hex";
  if (memmem(body, len, upper, 64))
    return "upper-case hex";
  if (memmem(body, len, b64, strlen(b64)))
    return "base64";
  if (memmem(body, len, b64url, strlen(b64url)))
    return "base64url";
  if (memmem(body, len, raw, sizeof raw))
    return "raw bytes";
  /* half of it would be a leak too */
  if (memmem(body, len, hex, 32) || memmem(body, len, hex + 32, 32))
    return "half of the hex";
  return NULL;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_members_authenticated_secret_per_epoch(void **state) {
  cluster_t *c = *state;
  const char *job = "authed";
  job_view_t v;
  char s1[65], s2[65], s3[65];
  uint64_t epochs[8];
  char vals[8][65];
  submit(c, "{\"name\":\"authed\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
            "\"algorithm\":\"wagma\",\"workers\":2,\"max_workers\":3,\"group_size\":2,"
            "\"staleness_bound\":4,"
            "\"batch_size\":32,\"iterations\":100000000,\"eval_every\":100}");
  streams_start(c); /* the event streams, from now on (searched by the next test) */
  assert_int_equal(wait_epoch(c, job, 0, 2, 60, &v), 0);
  uint64_t e1 = v.epoch;
  assert_int_equal(secret_of(c, job, e1, s1), 0);

  /* every member runs authenticated; nobody warns of an unauthenticated data plane */
  for (int i = 0; i < v.nmembers; i++) {
    int k = cluster_agent_index(c, v.members[i].name);
    assert_true(k >= 0);
    if (cluster_agent_log_count(c, k, "job authed: epoch", "data plane authenticated") < 1) {
      cluster_dump_logs(c);
      fail_msg("%s did not log an authenticated data plane", c->agent_name[k]);
    }
  }

  /* a new epoch, a new secret; the previous one stays, for a member still setting it up */
  patch_workers(c, job, 3);
  assert_int_equal(wait_epoch(c, job, e1, 3, 60, &v), 0);
  uint64_t e2 = v.epoch;
  assert_int_equal(secret_of(c, job, e2, s2), 0);
  assert_string_not_equal(s1, s2);
  /* one more: the secret of two epochs back is deleted in the plan's Txn */
  patch_workers(c, job, 2);
  assert_int_equal(wait_epoch(c, job, e2, 2, 60, &v), 0);
  uint64_t e3 = v.epoch;
  assert_int_equal(secret_of(c, job, e3, s3), 0);
  assert_string_not_equal(s3, s1);
  assert_string_not_equal(s3, s2);
  int n = job_secrets(c, job, epochs, vals, 8);
  for (int i = 0; i < n; i++)
    fprintf(stderr, "  secret of epoch %llu\n", (unsigned long long)epochs[i]);
  for (int i = 0; i < n; i++)
    assert_true(epochs[i] + 1 >= e3 && epochs[i] <= e3);
  fprintf(stderr, "  epochs %llu, %llu, %llu: three secrets, %d kept\n", (unsigned long long)e1,
          (unsigned long long)e2, (unsigned long long)e3, n);

  for (int k = 0; k < c->nagents; k++) {
    int bad = cluster_agent_log_count(c, k, "unauthenticated", NULL) +
              cluster_agent_log_count(c, k, "UNAUTHENTICATED", NULL);
    if (bad) {
      cluster_dump_logs(c);
      fail_msg("%s logged an unauthenticated data plane %d times", c->agent_name[k], bad);
    }
  }
}

static void test_rest_never_shows_a_secret(void **state) {
  cluster_t *c = *state;
  const char *paths[] = {"/ui/",
                         "/ui/app.js",
                         "/v1/jobs",
                         "/v1/jobs?state=running",
                         "/v1/jobs?limit=1",
                         "/v1/jobs/authed",
                         "/v1/jobs/authed/plan",
                         "/v1/jobs/authed/groups",
                         "/v1/jobs/authed/groups?iteration=0",
                         "/v1/jobs/authed/groups?iteration=5",
                         "/v1/jobs/authed/events",
                         "/v1/agents",
                         "/metrics",
                         "/healthz",
                         "/readyz"};
  char hex[65];
  job_view_t v;
  assert_int_equal(cluster_job_get(c, "authed", &v), 0);
  assert_int_equal(secret_of(c, "authed", v.epoch, hex), 0); /* the current one, remembered */
  assert_true(nseen >= 3);
  int checked = 0;
  for (size_t p = 0; p < sizeof paths / sizeof *paths; p++) {
    char *body = NULL;
    long st = 0;
    assert_int_equal(cluster_http(c, "GET", paths[p], NULL, &st, &body), 0);
    size_t len = body ? strlen(body) : 0;
    fprintf(stderr, "  GET %-36s %ld, %zu bytes\n", paths[p], st, len);
    for (int i = 0; i < nseen && body; i++) {
      const char *form = holds_secret(body, len, seen[i].hex);
      if (form)
        fail_msg("GET %s shows the secret of %s epoch %llu (%s)", paths[p], seen[i].job,
                 (unsigned long long)seen[i].epoch, form);
      checked++;
    }
    free(body);
  }
  /* the event streams, open since before the first plan: three epochs of changes */
  streams_stop();
  for (int k = 0; k < 2; k++) {
    stream_t *stm = &streams[k];
    fprintf(stderr, "  stream %-30s %ld, %zu bytes\n", stm->path, stm->status, stm->len);
    assert_int_equal(stm->status, 200);
    assert_true(stm->len > 0);
    for (int i = 0; i < nseen; i++) {
      const char *form = holds_secret(stm->buf, stm->len, seen[i].hex);
      if (form)
        fail_msg("the stream %s shows the secret of %s epoch %llu (%s)", stm->path, seen[i].job,
                 (unsigned long long)seen[i].epoch, form);
    }
    free(stm->buf);
    stm->buf = NULL;
  }
  fprintf(stderr, "  %d secrets x %zu endpoints and 2 streams: none shown\n", nseen,
          sizeof paths / sizeof *paths);
  assert_true(checked > 0);
}

static void test_secrets_go_with_the_job(void **state) {
  cluster_t *c = *state;
  uint64_t epochs[8];
  char vals[8][65];
  int before = job_secrets(c, "authed", epochs, vals, 8);
  fprintf(stderr, "  %d secrets before the stop\n", before);
  assert_true(before >= 1);
  stop_job(c, "authed");
  double deadline = cluster_now() + 15;
  int n;
  while ((n = job_secrets(c, "authed", epochs, vals, 8)) > 0 && cluster_now() < deadline)
    cluster_sleep(0.2);
  assert_int_equal(n, 0);
}

/* The impostor knows the plan from REST, not the secret: refused by rank 0 while the real
 * rank 1 is stopped, and the real rank 1 joins afterwards. */
static void test_impostor_cannot_join(void **state) {
  cluster_t *c = *state;
  const char *job = "guarded";
  char *body = NULL;
  long st = 0;
  job_view_t v;
  /* The two free agents in name order become ranks 0 and 1; stop the one that will be rank 1
   * (rank 1 dials rank 0, so rank 0 waits for it with its port open). */
  int r0 = 0, r1 = 1;
  assert_true(c->agent[r0] > 0 && c->agent[r1] > 0);
  assert_int_equal(kill(c->agent[r1], SIGSTOP), 0);
  submit(c, "{\"name\":\"guarded\",\"model\":\"softmax\",\"dataset\":\"synthetic\","
            "\"algorithm\":\"wagma\",\"workers\":2,\"group_size\":2,\"staleness_bound\":4,"
            "\"batch_size\":32,\"iterations\":100000000,\"eval_every\":100}");
  /* the plan, as anyone can read it */
  double deadline = cluster_now() + 20;
  json_t *plan = NULL;
  while (!plan && cluster_now() < deadline) {
    free(body);
    body = NULL;
    if (cluster_http(c, "GET", "/v1/jobs/guarded/plan", NULL, &st, &body) == 0 && st == 200)
      plan = json_loads(body, 0, NULL);
    else
      cluster_sleep(0.1);
  }
  free(body);
  assert_non_null(plan);
  json_t *members = json_object_get(plan, "members");
  assert_int_equal(json_array_size(members), 2);
  const char *name0 = json_string_value(json_object_get(json_array_get(members, 0), "name"));
  const char *name1 = json_string_value(json_object_get(json_array_get(members, 1), "name"));
  assert_string_equal(name0, c->agent_name[r0]);
  assert_string_equal(name1, c->agent_name[r1]);
  world_t w;
  memset(&w, 0, sizeof w);
  w.nranks = 2;
  w.epoch = (uint64_t)json_integer_value(json_object_get(plan, "epoch"));
  char address[64];
  snprintf(address, sizeof address, "%s",
           json_string_value(json_object_get(json_array_get(members, 0), "address")));
  json_decref(plan);
  int refused_before = cluster_agent_log_count(c, r0, "refused", NULL);

  /* 1: the HELLO of a member without a secret, as rank 1 */
  int fd = world_raw_connect(address, cluster_now() + 20);
  assert_true(fd >= 0);
  int hs = world_raw_handshake(&w, fd, 1, 0, NULL, 0, 0);
  int dropped = world_raw_wait_dropped(fd);
  close(fd);
  fprintf(stderr, "  unauthenticated HELLO as rank 1: handshake %d (-1 = refused), dropped %d\n",
          hs, dropped);
  /* 2: claims a secret, proves a guessed one */
  static const uint8_t guess[32] = "an impostor's guess, 32 bytes!!";
  fd = world_raw_connect(address, cluster_now() + 20);
  assert_true(fd >= 0);
  int hs2 = world_raw_handshake(&w, fd, 1, 0, guess, sizeof guess, 1);
  int dropped2 = world_raw_wait_dropped(fd);
  close(fd);
  fprintf(stderr,
          "  forged proof as rank 1: handshake %d (1 = rank 0's proof did not verify), "
          "dropped %d\n",
          hs2, dropped2);

  /* the real rank 1 comes back and joins the same epoch */
  assert_int_equal(kill(c->agent[r1], SIGCONT), 0);
  int joined = wait_epoch(c, job, w.epoch - 1, 2, 40, &v);
  int refusals = cluster_agent_log_count(c, r0, "refused", NULL) - refused_before;
  fprintf(stderr, "  rank 0 logged %d refusals; job at epoch %llu (plan epoch %llu)\n", refusals,
          (unsigned long long)v.epoch, (unsigned long long)w.epoch);
  assert_int_equal(hs, -1);
  assert_int_equal(dropped, 0);
  assert_int_equal(hs2, 1);
  assert_int_equal(dropped2, 0);
  assert_true(refusals >= 2);
  assert_true(cluster_agent_log_count(c, r0, "rank 1 sent an unauthenticated HELLO", NULL) >= 1);
  assert_int_equal(joined, 0);
  assert_int_equal(v.epoch, w.epoch); /* the impostor cost nothing: no replan */
  stop_job(c, job);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_members_authenticated_secret_per_epoch),
      cmocka_unit_test(test_rest_never_shows_a_secret),
      cmocka_unit_test(test_secrets_go_with_the_job),
      cmocka_unit_test(test_impostor_cannot_join),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
