/* test_reach.c — the partition rule (coordinator/reach.c, wg_reach_decide), table-driven: each
 * case is a plan of n members, who reports whom unreachable and for how long, and whom the
 * rule must leave out. Pure: no etcd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reach.h"

#define MAXN 8

typedef struct {
  const char *name;
  int n;
  const char *reports[MAXN]; /* per rank: the ranks it reports, e.g. "123"; NULL = none */
  double secs;               /* how long every report says (grace is 1 s) */
  const char *absent;        /* ranks not present, e.g. "3" */
  int want;                  /* the return value */
  const char *out;           /* ranks left out */
} reach_case_t;

static const reach_case_t cases[] = {
    {"nobody reports", 4, {0}, 5, "", 0, ""},
    {"one cut off from three, everyone reports", 4, {"123", "0", "0", "0"}, 5, "", 1, "0"},
    {"one cut off from three, only it reports", 4, {NULL, NULL, "013"}, 5, "", 1, "2"},
    {"one cut off from three, only they report", 4, {"3", "3", "3"}, 5, "", 1, "3"},
    {"reports younger than the grace count for nothing", 4, {"123", "0", "0", "0"}, 0.5, "", 0, ""},
    /* the first reports of a cut: 0 and 3 see each other gone, 1 and 2 have not yet */
    {"the first reports of a cut leave out nobody", 4, {"3", NULL, NULL, "0"}, 5, "", 0, ""},
    {"one cut off from three, two of them report it so far", 4, {"3", "3"}, 5, "", 1, "3"},
    {"a minority of two cut off together", 5, {"234", "234", "01", "01", "01"}, 5, "", 2, "01"},
    /* the first reports of that cut: 2 sees 0 and 1 gone; 2 is not cut off from most */
    {"the first reports of a minority's cut leave out nobody", 5, {NULL, NULL, "01"}, 5, "", 0, ""},
    {"a minority claiming everyone is unreachable is left out, not the majority",
     5,
     {"1234", NULL, NULL, NULL, NULL},
     5,
     "",
     1,
     "0"},
    {"two liars do not evict three", 5, {"234", "234"}, 5, "", 2, "01"},
    {"two members: no majority", 2, {"1", "0"}, 5, "", WG_REACH_NO_MAJORITY, ""},
    {"two halves: no majority", 4, {"23", "23", "01", "01"}, 5, "", WG_REACH_NO_MAJORITY, ""},
    {"a report of a member that is gone counts for nothing", 4, {"3", "3", "3"}, 5, "3", 0, ""},
    {"an absent reporter counts for nothing", 4, {"123"}, 5, "0", 0, ""},
    {"one bad link between two members leaves both in", 3, {"1", "0"}, 5, "", 0, ""},
    {"out-of-range and self reports are ignored", 3, {"0", "9"}, 5, "", 0, ""},
};

static void parse_ranks(const char *s, int *out, int n) {
  memset(out, 0, (size_t)n * sizeof *out);
  for (; s && *s; s++)
    if (*s - '0' < n)
      out[*s - '0'] = 1;
}

static void test_table(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const reach_case_t *k = &cases[c];
    wg_reach_member_t m[MAXN];
    struct wagma_unreachable lists[MAXN][MAXN];
    int absent[MAXN], want[MAXN], out[MAXN];
    parse_ranks(k->absent, absent, k->n);
    parse_ranks(k->out, want, k->n);
    for (int r = 0; r < k->n; r++) {
      m[r] = (wg_reach_member_t){.present = !absent[r]};
      int ni = 0;
      for (const char *p = k->reports[r]; p && *p; p++)
        lists[r][ni++] = (struct wagma_unreachable){.rank = *p - '0', .seconds = k->secs};
      m[r].nunreachable = ni;
      m[r].unreachable = lists[r];
    }
    int got = wg_reach_decide(m, k->n, 1.0, out);
    if (got != k->want || memcmp(out, want, (size_t)k->n * sizeof *out) != 0) {
      fprintf(stderr, "case \"%s\": returned %d (want %d), left out:", k->name, got, k->want);
      for (int r = 0; r < k->n; r++)
        if (out[r])
          fprintf(stderr, " %d", r);
      fprintf(stderr, " (want %s)\n", k->out);
      fail();
    }
  }
}

/* A large plan: member 17 of 1000 cut off, each of its 999 peers reports it, and it reports
 * the first WAGMA_API_UNREACHABLE_MAX of them (a truncated list). */
static void test_large_plan(void **state) {
  (void)state;
  enum { N = 1000 };
  static wg_reach_member_t m[N];
  static struct wagma_unreachable one = {.rank = 17, .seconds = 4};
  static struct wagma_unreachable many[WAGMA_API_UNREACHABLE_MAX];
  static int out[N];
  for (int r = 0; r < N; r++)
    m[r] = (wg_reach_member_t){.present = 1, .nunreachable = 1, .unreachable = &one};
  for (int i = 0; i < WAGMA_API_UNREACHABLE_MAX; i++)
    many[i] = (struct wagma_unreachable){.rank = i < 17 ? i : i + 1, .seconds = 4};
  m[17].nunreachable = WAGMA_API_UNREACHABLE_MAX;
  m[17].unreachable = many;
  assert_int_equal(wg_reach_decide(m, N, 1.0, out), 1);
  for (int r = 0; r < N; r++)
    assert_int_equal(out[r], r == 17);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_table),
                                     cmocka_unit_test(test_large_plan)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
