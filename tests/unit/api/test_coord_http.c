/* Unit tests of the REST server's pure request-side parts, without etcd or sockets:
 *
 *   - the request head check of the connection front (http_head.c): what is forwarded to
 *     libmicrohttpd, what is refused with which status and code, limits, partial heads;
 *   - the pages of GET /v1/jobs (pages.c) against an in-memory key space standing in for etcd
 *     (prefix reads with a limit, existence checks): every id exactly once and in key order
 *     over many random key spaces, page sizes, read limits and round-trip budgets, also while
 *     jobs are created and removed between pages; the continue token's codec. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pages.h"
#include "http_head.h"
#include "coord.h"

/* ---- request heads ------------------------------------------------------------------------- */

static const wg_http_limits_t limits = {.max_line = 64, .max_head = 256, .max_fields = 8};

static int parse(const char *s, wg_http_head_t *h) {
  return wg_http_head_parse(s, strlen(s), &limits, h);
}

static void test_head_ok(void **state) {
  (void)state;
  wg_http_head_t h;
  const char *get = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  assert_int_equal(parse(get, &h), WG_HEAD_OK);
  assert_int_equal(h.len, strlen(get));
  assert_int_equal(h.content_length, 0);
  assert_string_equal(h.method, "GET");
  /* What follows the head is not the head's. */
  char two[256];
  snprintf(two, sizeof two, "%sGET /x HTTP/1.1\r\n", get);
  assert_int_equal(parse(two, &h), WG_HEAD_OK);
  assert_int_equal(h.len, strlen(get));
  /* Bare LF line ends, HTTP/1.0, empty lines before the request line (skipped). */
  assert_int_equal(parse("GET / HTTP/1.0\n\n", &h), WG_HEAD_OK);
  assert_int_equal(parse("\r\n\r\nPOST /v1/jobs HTTP/1.1\r\nContent-Length: 12\r\n\r\n", &h),
                   WG_HEAD_OK);
  assert_int_equal(h.skip, 4);
  assert_int_equal(h.content_length, 12);
  assert_int_equal(h.len, strlen("POST /v1/jobs HTTP/1.1\r\nContent-Length: 12\r\n\r\n"));
  assert_int_equal(parse("PUT /a HTTP/1.1\r\ncontent-length:  0 \r\nX: a\tb\r\n\r\n", &h),
                   WG_HEAD_OK);
  /* Percent escapes and odd targets are the router's business, not the front's. */
  assert_int_equal(parse("GET /healthz%00junk?x=%zz HTTP/1.1\r\n\r\n", &h), WG_HEAD_OK);
  /* HTTP/1.x with x > 1 is served as HTTP/1.1. */
  assert_int_equal(parse("GET / HTTP/1.2\r\n\r\n", &h), WG_HEAD_OK);
}

static void test_head_partial(void **state) {
  (void)state;
  wg_http_head_t h;
  const char *full = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n";
  /* Every proper prefix of a good head is "more", never a refusal. */
  for (size_t n = 0; n < strlen(full); n++)
    if (wg_http_head_parse(full, n, &limits, &h) != WG_HEAD_MORE)
      fail_msg("prefix of %zu bytes: not MORE (%s)", n, h.why);
  /* Garbage is refused before its line ends. */
  assert_int_equal(parse("\x16\x03\x01\x02", &h), WG_HEAD_BAD); /* a TLS hello */
  assert_int_equal(h.status, 400);
  assert_int_equal(parse("GET /x HTTQ", &h), WG_HEAD_BAD);
  assert_int_equal(parse("GET /x HTTP/1.1\r\n folded", &h), WG_HEAD_BAD);
}

static void test_head_refused(void **state) {
  (void)state;
  char longline[200], longhead[400];
  memset(longline, 0, sizeof longline);
  snprintf(longline, sizeof longline, "GET /%0100d HTTP/1.1\r\n\r\n", 0);
  snprintf(longhead, sizeof longhead, "GET / HTTP/1.1\r\nA: %0300d\r\n\r\n", 0);
  const struct {
    const char *head;
    int status;
    const char *code;
  } bad[] = {
      {"GET / HTTP/2.0\r\n\r\n", 505, "http_version_not_supported"},
      {"GET / HTTP/0.9\r\n\r\n", 505, "http_version_not_supported"},
      {"GET / HTTP/1.1x\r\n\r\n", 400, "bad_request"},
      {"GET / HTTP/11\r\n\r\n", 400, "bad_request"},
      {"GET /\r\n\r\n", 400, "bad_request"},
      {"GET  / HTTP/1.1\r\n\r\n", 400, "bad_request"},
      {"GET / x HTTP/1.1\r\n\r\n", 400, "bad_request"},
      {"G(T / HTTP/1.1\r\n\r\n", 400, "bad_request"},
      {" GET / HTTP/1.1\r\n\r\n", 400, "bad_request"},
      {"GET /a\x01 HTTP/1.1\r\n\r\n", 400, "bad_request"},
      {"GET /a\x7f HTTP/1.1\r\n\r\n", 400, "bad_request"},
      {"GET /a\rb HTTP/1.1\r\n\r\n", 400, "bad_request"},
      {"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400, "bad_request"},
      {"GET / HTTP/1.1\r\nA : b\r\n\r\n", 400, "bad_request"},
      {"GET / HTTP/1.1\r\n: b\r\n\r\n", 400, "bad_request"},
      {"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 400, "bad_request"},
      {"GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 400, "bad_request"},
      {"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 400, "bad_request"},
      {"POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400, "bad_request"},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "bad_request"},
      {"POST / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n", 400, "bad_request"},
      {"POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", 400, "bad_request"},
      {"POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400, "bad_request"},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400, "bad_request"},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, "too_large"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "length_required"},
      {"POST / HTTP/1.1\r\ntransfer-encoding: identity\r\n\r\n", 411, "length_required"},
      {"GET / HTTP/1.1\r\nA:1\r\nA:2\r\nA:3\r\nA:4\r\nA:5\r\nA:6\r\nA:7\r\nA:8\r\nA:9\r\n\r\n", 431,
       "headers_too_large"},
      {longline, 414, "uri_too_long"},
      {longhead, 431, "headers_too_large"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    wg_http_head_t h;
    int r = parse(bad[i].head, &h);
    if (r != WG_HEAD_BAD || h.status != bad[i].status || strcmp(h.code, bad[i].code) != 0)
      fail_msg("case %zu: result %d status %d code %s, want %d %s", i, r, h.status,
               r == WG_HEAD_BAD ? h.code : "-", bad[i].status, bad[i].code);
    assert_non_null(h.why);
  }
  /* The limits apply while the bytes still come: a long line is 414 before its end. */
  wg_http_head_t h;
  assert_int_equal(wg_http_head_parse(longline, 80, &limits, &h), WG_HEAD_BAD);
  assert_int_equal(h.status, 414);
  assert_int_equal(wg_http_head_parse(longhead, 300, &limits, &h), WG_HEAD_BAD);
  assert_int_equal(h.status, 431);
}

/* ---- an in-memory key space for the walk ---------------------------------------------------- */

typedef struct space {
  char **keys; /* sorted, distinct (relative keys "id/suffix") */
  size_t n, cap;
  long calls;
} space_t;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void space_add(space_t *s, const char *key) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->keys[i], key) == 0)
      return;
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    s->keys = realloc(s->keys, s->cap * sizeof *s->keys);
  }
  s->keys[s->n++] = strdup(key);
  qsort(s->keys, s->n, sizeof *s->keys, cmp_str);
}

/* Removes every key of job id. */
static void space_remove_job(space_t *s, const char *id) {
  size_t len = strlen(id), o = 0;
  for (size_t i = 0; i < s->n; i++) {
    if (strncmp(s->keys[i], id, len) == 0 && s->keys[i][len] == '/')
      free(s->keys[i]);
    else
      s->keys[o++] = s->keys[i];
  }
  s->n = o;
}

static void space_free(space_t *s) {
  for (size_t i = 0; i < s->n; i++)
    free(s->keys[i]);
  free(s->keys);
}

static int io_keys(void *user, const char *prefix, size_t limit, wg_keylist_t *out) {
  space_t *s = user;
  size_t pl = strlen(prefix);
  s->calls++;
  out->keys = calloc(limit + 1, sizeof *out->keys);
  out->n = 0;
  out->more = 0;
  for (size_t i = 0; i < s->n; i++) {
    if (strncmp(s->keys[i], prefix, pl) != 0)
      continue;
    if (out->n == limit) {
      out->more = 1;
      break;
    }
    out->keys[out->n++] = strdup(s->keys[i]);
  }
  return 0;
}

static int io_exists(void *user, const char *const *prefixes, size_t n, int *ex) {
  space_t *s = user;
  s->calls++;
  assert_true(n <= 128); /* etcd's default limit of ops per Txn */
  for (size_t j = 0; j < n; j++) {
    ex[j] = 0;
    for (size_t i = 0; i < s->n && !ex[j]; i++)
      ex[j] = strncmp(s->keys[i], prefixes[j], strlen(prefixes[j])) == 0;
  }
  return 0;
}

static void io_free(void *user, wg_keylist_t *kl) {
  (void)user;
  for (size_t i = 0; i < kl->n; i++)
    free(kl->keys[i]);
  free(kl->keys);
}

static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)((rng_state >> 33) % n);
}

/* A random valid job id over a small alphabet with the characters that sort around '/'. */
static void random_id(char *id, size_t maxlen) {
  static const char first[] = "ab0_";
  static const char rest[] = "ab0_-.";
  size_t len = 1 + rnd((uint32_t)maxlen);
  id[0] = first[rnd(sizeof first - 1)];
  for (size_t i = 1; i < len; i++)
    id[i] = rest[rnd(sizeof rest - 1)];
  id[len] = '\0';
}

/* Adds job id with 1..max_keys keys (like spec, status, progress/<agent>). */
static void add_job(space_t *s, const char *id, int max_keys) {
  static const char *const suffix[] = {"checkpoint", "plan",       "plans/001", "plans/002",
                                       "progress/a", "progress/b", "spec",      "status"};
  int k = 1 + (int)rnd((uint32_t)max_keys);
  char key[128];
  for (int i = 0; i < k; i++) {
    snprintf(key, sizeof key, "%s/%s", id, suffix[i % 8]);
    if (i >= 8)
      snprintf(key, sizeof key, "%s/progress/z%d", id, i);
    space_add(s, key);
  }
}

/* The distinct ids of the space in key order. */
static size_t space_ids(const space_t *s, char (*ids)[WAGMA_API_NAME_MAX], size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < s->n && n < max; i++) {
    const char *slash = strchr(s->keys[i], '/');
    char id[WAGMA_API_NAME_MAX];
    snprintf(id, sizeof id, "%.*s", (int)(slash - s->keys[i]), s->keys[i]);
    if (n == 0 || strcmp(ids[n - 1], id) != 0)
      snprintf(ids[n++], sizeof ids[0], "%s", id);
  }
  return n;
}

/* Pages through the whole space; returns the ids in the order the pages gave them. Each page
 * resumes from its token (encoded and decoded, as a client would carry it). */
static size_t page_all(space_t *s, size_t want, int budget, size_t probe,
                       char (*out)[WAGMA_API_NAME_MAX], size_t max, int *pages) {
  wg_walk_io_t io = {.keys = io_keys, .exists = io_exists, .free_keys = io_free, .user = s};
  wg_walk_pos_t pos = {.level = WG_WALK_START};
  size_t total = 0;
  char(*ids)[WAGMA_API_NAME_MAX] = calloc(want, sizeof *ids);
  *pages = 0;
  for (int guard = 0; guard < 100000; guard++) {
    size_t n = 0;
    int done = 0, rt = budget;
    assert_int_equal(wg_jobs_walk(&io, &pos, want, &rt, probe, ids, &n, &done), 0);
    assert_true(rt >= 0 && rt <= budget);
    ++*pages;
    for (size_t i = 0; i < n && total < max; i++)
      snprintf(out[total++], sizeof out[0], "%s", ids[i]);
    if (done)
      break;
    char tok[WG_LIST_TOKEN_MAX];
    assert_int_equal(wg_list_token_encode(&pos, tok, sizeof tok), 0);
    wg_walk_pos_t back;
    assert_int_equal(wg_list_token_decode(tok, &back), 0);
    assert_string_equal(back.last, pos.last);
    assert_int_equal(back.level, pos.level);
    pos = back;
  }
  free(ids);
  return total;
}

static void test_key_order(void **state) {
  (void)state;
  /* "a-b/" < "a.b/" < "a/" < "a0/" < "ab/" bytewise. */
  assert_true(wg_job_key_cmp("a-b", "a.b") < 0);
  assert_true(wg_job_key_cmp("a.b", "a") < 0);
  assert_true(wg_job_key_cmp("a", "a0") < 0);
  assert_true(wg_job_key_cmp("a0", "ab") < 0);
  assert_true(wg_job_key_cmp("ab", "ab") == 0);
  assert_true(wg_job_key_cmp("b", "a") > 0);
  assert_true(wg_job_key_cmp("a", "a-") > 0);
}

/* Every id exactly once and in key order, over random spaces and walk parameters. */
static void test_walk_random(void **state) {
  (void)state;
  enum { MAXIDS = 400 };
  char(*want_ids)[WAGMA_API_NAME_MAX] = calloc(MAXIDS, WAGMA_API_NAME_MAX);
  char(*got)[WAGMA_API_NAME_MAX] = calloc(4 * MAXIDS, WAGMA_API_NAME_MAX);
  for (int round = 0; round < 400; round++) {
    rng_state = 0x9e3779b97f4a7c15ULL * (uint64_t)(round + 1);
    space_t s = {0};
    int njobs = (int)rnd(120), max_keys = 1 + (int)rnd(12);
    size_t maxlen = 1 + rnd(6);
    char id[WAGMA_API_NAME_MAX];
    for (int j = 0; j < njobs; j++) {
      random_id(id, maxlen);
      add_job(&s, id, max_keys);
    }
    size_t nwant = space_ids(&s, want_ids, MAXIDS);
    size_t want = 1 + rnd(9), probe = 1 + rnd(10);
    int budget = 3 + (int)rnd(12), pages = 0;
    size_t ngot = page_all(&s, want, budget, probe, got, 4 * MAXIDS, &pages);
    if (ngot != nwant)
      fail_msg("round %d: %zu ids paged, %zu in the space (want %zu probe %zu budget %d)", round,
               ngot, nwant, want, probe, budget);
    for (size_t i = 0; i < ngot; i++)
      if (strcmp(got[i], want_ids[i]) != 0)
        fail_msg("round %d: id %zu is %s, want %s", round, i, got[i], want_ids[i]);
    space_free(&s);
  }
  free(want_ids);
  free(got);
}

/* Jobs created and removed between pages: a job present from the first page to the last is
 * listed exactly once; nothing is listed twice; the listing is in key order. */
static void test_walk_concurrent(void **state) {
  (void)state;
  enum { MAXIDS = 600 };
  char(*stable)[WAGMA_API_NAME_MAX] = calloc(MAXIDS, WAGMA_API_NAME_MAX);
  char(*got)[WAGMA_API_NAME_MAX] = calloc(MAXIDS, WAGMA_API_NAME_MAX);
  char(*ids)[WAGMA_API_NAME_MAX] = calloc(16, WAGMA_API_NAME_MAX);
  for (int round = 0; round < 200; round++) {
    rng_state = 0x5851f42d4c957f2dULL * (uint64_t)(round + 7);
    space_t s = {0};
    char id[WAGMA_API_NAME_MAX];
    /* Stable jobs start with 'a' or 'b'; churned ones with '0' or '_', interleaved with them
     * in key order through shared characters. */
    for (int j = 0; j < 60; j++) {
      random_id(id, 5);
      id[0] = rnd(2) ? 'a' : 'b';
      add_job(&s, id, 6);
    }
    size_t nstable = space_ids(&s, stable, MAXIDS);
    wg_walk_io_t io = {.keys = io_keys, .exists = io_exists, .free_keys = io_free, .user = &s};
    wg_walk_pos_t pos = {.level = WG_WALK_START};
    size_t ngot = 0;
    size_t want = 1 + rnd(6), probe = 1 + rnd(8);
    for (int page = 0; page < 10000; page++) {
      size_t n = 0;
      int done = 0, rt = 3 + (int)rnd(8);
      assert_int_equal(wg_jobs_walk(&io, &pos, want, &rt, probe, ids, &n, &done), 0);
      for (size_t i = 0; i < n; i++) {
        assert_true(ngot < MAXIDS);
        snprintf(got[ngot++], sizeof got[0], "%s", ids[i]);
      }
      if (done)
        break;
      /* Churn: new jobs anywhere (before and after the position), churned ones removed. */
      for (int k = 0; k < 3; k++) {
        random_id(id, 5);
        id[0] = rnd(2) ? '0' : '_';
        if (rnd(3) == 0) { /* or next to a stable one: same prefix, other tail */
          snprintf(id, sizeof id, "%.*s%c", (int)rnd(3) + 1, stable[rnd((uint32_t)nstable)],
                   "-._0"[rnd(4)]);
          if (id[0] == 'a' || id[0] == 'b')
            id[0] = '0';
        }
        add_job(&s, id, 4);
      }
      if (rnd(2) && s.n) { /* remove a churned job */
        const char *k = s.keys[rnd((uint32_t)s.n)];
        if (k[0] == '0' || k[0] == '_') {
          const char *slash = strchr(k, '/');
          snprintf(id, sizeof id, "%.*s", (int)(slash - k), k);
          space_remove_job(&s, id);
        }
      }
    }
    for (size_t i = 1; i < ngot; i++)
      if (wg_job_key_cmp(got[i - 1], got[i]) >= 0)
        fail_msg("round %d: %s listed before %s", round, got[i - 1], got[i]);
    for (size_t j = 0; j < nstable; j++) {
      int seen = 0;
      for (size_t i = 0; i < ngot; i++)
        seen += strcmp(got[i], stable[j]) == 0;
      if (seen != 1)
        fail_msg("round %d: stable job %s listed %d times", round, stable[j], seen);
    }
    space_free(&s);
  }
  free(stable);
  free(got);
  free(ids);
}

/* Round trips stay few for a page in a dense space of "job-<8 hex>" ids, the usual names. */
static void test_walk_cost(void **state) {
  (void)state;
  space_t s = {0};
  char id[WAGMA_API_NAME_MAX];
  rng_state = 42;
  for (int j = 0; j < 3000; j++) {
    snprintf(id, sizeof id, "job-%08x", (unsigned)rnd(0xffffffffu));
    add_job(&s, id, 8);
  }
  wg_walk_io_t io = {.keys = io_keys, .exists = io_exists, .free_keys = io_free, .user = &s};
  wg_walk_pos_t pos = {.level = WG_WALK_START};
  char(*ids)[WAGMA_API_NAME_MAX] = calloc(100, WAGMA_API_NAME_MAX);
  long worst = 0, total = 0;
  int pages = 0;
  for (;;) {
    size_t n = 0;
    int done = 0, rt = WG_LIST_ROUND_TRIPS;
    s.calls = 0;
    assert_int_equal(wg_jobs_walk(&io, &pos, 100, &rt, WG_LIST_PROBE_KEYS, ids, &n, &done), 0);
    pages++;
    total += (long)n;
    if (s.calls > worst)
      worst = s.calls;
    if (done)
      break;
    assert_int_equal(n, 100); /* the budget is enough for a full page here */
  }
  print_message("3000 jobs: %d pages, at most %ld round trips per page\n", pages, worst);
  assert_true(total >= 2900);
  assert_true(worst <= 24);
  free(ids);
  space_free(&s);
}

static void test_token(void **state) {
  (void)state;
  wg_walk_pos_t p = {.last = "job-0a1b2c3d", .level = 12}, q;
  char tok[WG_LIST_TOKEN_MAX];
  assert_int_equal(wg_list_token_encode(&p, tok, sizeof tok), 0);
  for (const char *c = tok; *c; c++) /* URL-safe as it is */
    assert_non_null(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", *c));
  assert_int_equal(wg_list_token_decode(tok, &q), 0);
  assert_string_equal(q.last, p.last);
  assert_int_equal(q.level, 12);
  p.level = 0;
  assert_int_equal(wg_list_token_encode(&p, tok, sizeof tok), 0);
  assert_int_equal(wg_list_token_decode(tok, &q), 0);
  assert_int_equal(q.level, 0);
  /* Not tokens of this server. */
  static const char *const bad[] = {"",
                                    "x",
                                    "====",
                                    "MTo5OTpqb2I",
                                    "MToxOg",
                                    "MTotMTphYmM",
                                    "MTozOi5hYmM",
                                    "MTozOmEvYg",
                                    "MjozOmFiYw",
                                    "!!!!",
                                    "MTowNzphYmNkZWZnaA"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (wg_list_token_decode(bad[i], &q) == 0)
      fail_msg("token %s accepted (%s, %d)", bad[i], q.last, q.level);
  /* Too small a buffer is refused, not truncated. */
  assert_int_equal(wg_list_token_encode(&p, tok, 4), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_head_ok),      cmocka_unit_test(test_head_partial),
      cmocka_unit_test(test_head_refused), cmocka_unit_test(test_key_order),
      cmocka_unit_test(test_walk_random),  cmocka_unit_test(test_walk_concurrent),
      cmocka_unit_test(test_walk_cost),    cmocka_unit_test(test_token),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
