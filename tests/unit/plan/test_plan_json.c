/* Unit tests of the plan JSON codec (collective/plan_json.c): exact round trips, the
 * documented shape, the direct encoder byte for byte against jansson's dump of the same object
 * (escapes, UTF-8 acceptance), a table of bad inputs each rejected with its field named, and
 * the codec's time at P = 10000 (printed, not asserted). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <time.h>

#include "test_plan_util.h"

/* P = 4, S = 2, as wagma_plan_build makes it, members named by pu_fill_members. */
#define M(r)                                                                                       \
  "{\"rank\":" #r ",\"name\":\"a" #r "\",\"address\":\"127.0.0.1:700" #r "\",\"joiner\":false}"
#define BASE_JSON                                                                                  \
  "{\"epoch\":3,\"start_round\":120,\"group_size\":2,\"staleness_bound\":8,"                       \
  "\"global_sync\":\"barrier\",\"members\":[" M(0) "," M(1) "," M(2) "," M(                        \
      3) "],"                                                                                      \
         "\"phases\":[[[0,1],[2,3]],[[0,2],[1,3]]]}"

static void shape_is_the_documented_one(void **state) {
  (void)state;
  wagma_plan_t plan;
  char *json = NULL;
  assert_int_equal(wagma_plan_build(4, 2, NULL, &plan), 0);
  pu_fill_members(&plan);
  plan.epoch = 3;
  plan.start_round = 120;
  assert_int_equal(wagma_plan_to_json(&plan, &json), 0);
  assert_string_equal(json, BASE_JSON);
  free(json);
  wagma_plan_free(&plan);
}

/* to_json -> from_json gives the same plan, and encoding it again gives the same text. */
static void round_trip(const wagma_plan_t *plan) {
  char *json = NULL, *again = NULL, err[256] = "";
  wagma_plan_t back;
  assert_int_equal(wagma_plan_to_json(plan, &json), 0);
  if (wagma_plan_from_json(json, strlen(json), &back, err, sizeof(err)) != 0)
    fail_msg("decode of own encoding failed: %s", err);
  pu_assert_plan_equal(plan, &back);
  assert_int_equal(wagma_plan_to_json(&back, &again), 0);
  assert_string_equal(json, again);
  free(json);
  free(again);
  wagma_plan_free(&back);
}

static void round_trips_are_exact(void **state) {
  (void)state;
  static const int cases[][2] = {{1, 2}, {2, 5}, {7, 3}, {16, 2}, {70, 5}, {1000, 4}};
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    int P = cases[c][0];
    int *order = malloc((size_t)P * sizeof(int));
    assert_non_null(order);
    for (int i = 0; i < P; i++)
      order[i] = (i * 7 + 3) % P == i ? i : P - 1 - i; /* a reversal: a permutation */
    wagma_plan_t plan;
    assert_int_equal(wagma_plan_build(P, cases[c][1], c % 2 ? order : NULL, &plan), 0);
    pu_fill_members(&plan);
    plan.epoch = c == 0 ? (uint64_t)INT64_MAX : (uint64_t)c;
    plan.start_round = (uint64_t)c * 1000003;
    plan.staleness_bound = (int)c + 1;
    plan.global_sync = c % 2 ? WAGMA_GLOBAL_WAIT_AVOIDING : WAGMA_GLOBAL_BARRIER;
    for (int r = 0; r < P; r += 3)
      plan.members[r].joiner = 1;
    round_trip(&plan);
    free(order);
    wagma_plan_free(&plan);
  }
  /* names and addresses with escapes, UTF-8, and the longest allowed lengths */
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(5, 2, NULL, &plan), 0);
  pu_fill_members(&plan);
  strcpy(plan.members[0].name, "quote\" back\\slash /\t\n");
  strcpy(plan.members[1].name, "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac");
  memset(plan.members[2].name, 'n', WAGMA_NAME_MAX - 1);
  memset(plan.members[3].address, 'h', WAGMA_ADDRESS_MAX - 1);
  strcpy(plan.members[4].address, "[::1]:65535");
  round_trip(&plan);
  wagma_plan_free(&plan);
}

static void encoder_refuses_what_cannot_decode(void **state) {
  (void)state;
  wagma_plan_t plan;
  char *json = (char *)"untouched";
  assert_int_equal(wagma_plan_build(4, 2, NULL, &plan), 0);
  assert_int_equal(wagma_plan_to_json(&plan, &json), WAGMA_EINVAL); /* unnamed members */
  assert_null(json);
  pu_fill_members(&plan);
  plan.epoch = (uint64_t)INT64_MAX + 1;
  assert_int_equal(wagma_plan_to_json(&plan, &json), WAGMA_ERANGE);
  plan.epoch = 0;
  plan.start_round = UINT64_MAX;
  assert_int_equal(wagma_plan_to_json(&plan, &json), WAGMA_ERANGE);
  plan.start_round = 0;
  strcpy(plan.members[1].name, "bad\xff");
  assert_int_equal(wagma_plan_to_json(&plan, &json), WAGMA_EINVAL); /* not UTF-8 */
  assert_int_equal(wagma_plan_to_json(&plan, NULL), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_to_json(NULL, &json), WAGMA_EINVAL);
  wagma_plan_free(&plan);
}

/* The reference: the documented object built as a json_t tree and dumped compact by jansson
 * (what wagma_plan_to_json produced before it wrote the text itself). NULL when a string is not
 * valid UTF-8. The plan must validate. */
static char *jansson_reference(const wagma_plan_t *plan) {
  static const char *const sync[] = {"barrier", "wait-avoiding"};
  json_t *members = json_array(), *phases = json_array();
  char *out = NULL;
  for (int i = 0; i < plan->nranks; i++) {
    json_t *name = json_string(plan->members[i].name);
    json_t *address = json_string(plan->members[i].address);
    if (!name || !address) {
      json_decref(name);
      json_decref(address);
      goto out;
    }
    json_array_append_new(members,
                          json_pack("{s:i, s:o, s:o, s:b}", "rank", i, "name", name, "address",
                                    address, "joiner", plan->members[i].joiner));
  }
  for (int j = 0; j < plan->nphases; j++) {
    const wagma_phase_t *ph = &plan->phases[j];
    json_t *groups = json_array();
    for (int g = 0; g < ph->ngroups; g++) {
      json_t *ranks = json_array();
      for (int x = ph->offsets[g]; x < ph->offsets[g + 1]; x++)
        json_array_append_new(ranks, json_integer(ph->ranks[x]));
      json_array_append_new(groups, ranks);
    }
    json_array_append_new(phases, groups);
  }
  json_t *root =
      json_pack("{s:I, s:I, s:i, s:i, s:s, s:O, s:O}", "epoch", (json_int_t)plan->epoch,
                "start_round", (json_int_t)plan->start_round, "group_size", plan->group_size,
                "staleness_bound", plan->staleness_bound, "global_sync", sync[plan->global_sync],
                "members", members, "phases", phases);
  assert_non_null(root);
  out = json_dumps(root, JSON_COMPACT);
  json_decref(root);
out:
  json_decref(members);
  json_decref(phases);
  return out;
}

static void assert_matches_reference(const wagma_plan_t *plan) {
  char *mine = NULL, *ref = jansson_reference(plan);
  int rc = wagma_plan_to_json(plan, &mine);
  if (!ref) {
    assert_int_equal(rc, WAGMA_EINVAL); /* both refuse */
    assert_null(mine);
    return;
  }
  assert_int_equal(rc, 0);
  assert_string_equal(mine, ref);
  free(mine);
  free(ref);
}

static void encoder_matches_jansson(void **state) {
  (void)state;
  static const int cases[][2] = {{1, 2}, {3, 2}, {9, 3}, {70, 5}, {1000, 4}};
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    wagma_plan_t plan;
    assert_int_equal(wagma_plan_build(cases[c][0], cases[c][1], NULL, &plan), 0);
    pu_fill_members(&plan);
    plan.epoch = c == 0 ? (uint64_t)INT64_MAX : c * 1000000007ull;
    plan.start_round = c == 1 ? (uint64_t)INT64_MAX : c;
    plan.staleness_bound = c == 2 ? INT32_MAX : (int)c + 1;
    plan.global_sync = c % 2 ? WAGMA_GLOBAL_WAIT_AVOIDING : WAGMA_GLOBAL_BARRIER;
    plan.members[0].joiner = 1;
    assert_matches_reference(&plan);
    wagma_plan_free(&plan);
  }
  /* every byte of a name: each control character, the escapes, '/', DEL, and UTF-8 */
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(2, 2, NULL, &plan), 0);
  pu_fill_members(&plan);
  for (int b = 1; b < 0x80; b++) {
    snprintf(plan.members[0].name, WAGMA_NAME_MAX, "x%cy%c", b, b);
    snprintf(plan.members[1].address, WAGMA_ADDRESS_MAX, "%c", b);
    assert_matches_reference(&plan);
  }
  /* well-formed and ill-formed UTF-8: the encoder accepts exactly what jansson accepts */
  static const char *const utf8[] = {
      "\xc2\x80",
      "\xdf\xbf",
      "\xe0\xa0\x80",
      "\xef\xbf\xbf",
      "\xed\x9f\xbf",
      "\xee\x80\x80",
      "\xf0\x90\x80\x80",
      "\xf4\x8f\xbf\xbf",
      "caf\xc3\xa9", /* valid */
      "\x80",
      "\xbf",
      "\xc0\x80",
      "\xc1\xbf",
      "\xe0\x9f\xbf",
      "\xed\xa0\x80",
      "\xed\xbf\xbf",
      "\xf0\x8f\xbf\xbf",
      "\xf4\x90\x80\x80",
      "\xf5\x80\x80\x80",
      "\xff",
      "\xc3",
      "\xc3x",
      "\xe2\x82",
      "\xf0\x90\x80",
      "\xe2\x82\xc3\xa9", /* invalid */
  };
  for (size_t i = 0; i < sizeof(utf8) / sizeof(utf8[0]); i++) {
    snprintf(plan.members[1].name, WAGMA_NAME_MAX, "n%s", utf8[i]);
    assert_matches_reference(&plan);
    snprintf(plan.members[1].name, WAGMA_NAME_MAX, "a1");
    snprintf(plan.members[0].address, WAGMA_ADDRESS_MAX, "%s:1", utf8[i]);
    assert_matches_reference(&plan);
    snprintf(plan.members[0].address, WAGMA_ADDRESS_MAX, "h:1");
  }
  wagma_plan_free(&plan);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Prints the codec's time at P = 10000 (not asserted: unit tests run loaded and under
 * sanitizers), with jansson's tree + dump of the same plan as the named baseline. */
static void codec_time_is_printed(void **state) {
  (void)state;
  const int reps = 5;
  double enc = 1e9, dec = 1e9, ref = 1e9;
  size_t bytes = 0;
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(10000, 4, NULL, &plan), 0);
  pu_fill_members(&plan);
  for (int rep = 0; rep < reps; rep++) {
    wagma_plan_t back;
    char *json = NULL, *baseline = NULL, err[256];
    double t0 = now_s();
    assert_int_equal(wagma_plan_to_json(&plan, &json), 0);
    double t1 = now_s();
    assert_int_equal(wagma_plan_from_json(json, strlen(json), &back, err, sizeof(err)), 0);
    double t2 = now_s();
    baseline = jansson_reference(&plan);
    double t3 = now_s();
    assert_string_equal(json, baseline);
    enc = t1 - t0 < enc ? t1 - t0 : enc;
    dec = t2 - t1 < dec ? t2 - t1 : dec;
    ref = t3 - t2 < ref ? t3 - t2 : ref;
    bytes = strlen(json);
    free(json);
    free(baseline);
    wagma_plan_free(&back);
  }
  printf("plan JSON P=10000 S=4: %zu bytes, best of %d: to_json %.2f ms (jansson tree+dump "
         "%.2f ms, %.1fx), from_json %.2f ms\n",
         bytes, reps, enc * 1e3, ref * 1e3, ref / enc, dec * 1e3);
  wagma_plan_free(&plan);
}

/* The bad inputs: BASE_JSON with `find` replaced by `with` (or whole when find is NULL). */
static const struct bad_case {
  const char *find, *with, *expect;
} bad_cases[] = {
    {NULL, "", "json:"},
    {NULL, "{", "json:"},
    {NULL, "[1,2]", "plan: expected a JSON object"},
    {NULL, "\"plan\"", "json:"},
    {"]]]}", "]]]} x", "json:"},
    {"\"epoch\":3,", "", "epoch: missing"},
    {",\"phases\":[[[0,1],[2,3]],[[0,2],[1,3]]]", "", "phases: missing"},
    {"\"epoch\":3", "\"epoch\":\"3\"", "epoch: expected an integer"},
    {"\"epoch\":3", "\"epoch\":-1", "epoch: -1 out of range"},
    {"\"epoch\":3", "\"epoch\":1.5", "epoch: expected an integer"},
    {"\"epoch\":3", "\"epoch\":null", "epoch: expected an integer"},
    {"\"epoch\":3", "\"epoch\":99999999999999999999", "json:"},
    {"\"epoch\":3,", "\"epoch\":3,\"epoch\":4,", "duplicate"},
    {"\"epoch\":3,", "\"epoch\":3,\"color\":1,", "color: unknown field"},
    {"\"start_round\":120", "\"start_round\":true", "start_round: expected an integer"},
    {"\"start_round\":120", "\"start_round\":-5", "start_round: -5 out of range"},
    {"\"group_size\":2", "\"group_size\":1", "group_size: 1 out of range"},
    {"\"group_size\":2", "\"group_size\":[2]", "group_size: expected an integer"},
    {"\"staleness_bound\":8", "\"staleness_bound\":0", "staleness_bound: 0 out of range"},
    {"\"staleness_bound\":8", "\"staleness_bound\":2147483648", "staleness_bound: 2147483648"},
    {"\"barrier\"", "\"sometimes\"", "global_sync: expected"},
    {"\"barrier\"", "1", "global_sync: expected"},
    {"\"members\":[" M(0) "," M(1) "," M(2) "," M(3) "]", "\"members\":{}",
     "members: expected an array"},
    {"\"members\":[" M(0) "," M(1) "," M(2) "," M(3) "]", "\"members\":[]", "members: 0 members"},
    {M(0), "5", "members[0]: expected an object"},
    {M(0), "null", "members[0]: expected an object"},
    {"\"name\":\"a1\",", "", "members[1].name: missing"},
    {"\"rank\":2", "\"rank\":3", "members[2].rank: 3, must equal its index 2"},
    {"\"rank\":2", "\"rank\":7", "members[2].rank: 7 out of range"},
    {"\"rank\":2", "\"rank\":\"2\"", "members[2].rank: expected an integer"},
    {"\"a0\"", "\"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\"",
     "members[0].name: 64 bytes"},
    {"\"127.0.0.1:7000\"",
     "\"hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh.com:1\"",
     "members[0].address: 69 bytes"},
    {"\"127.0.0.1:7003\"", "7003", "members[3].address: expected a string"},
    {"\"a0\"", "5", "members[0].name: expected a string"},
    {"\"a0\"", "\"a\\u0000b\"", "members[0].name: contains a NUL"},
    {"\"a2\"", "\"\"", "members[2].name: empty"},
    {"\"a3\"", "\"a1\"", "members[3].name: \"a1\" is also the name of members[1]"},
    {"\"joiner\":false}", "\"joiner\":0}", "members[0].joiner: expected true or false"},
    {"\"joiner\":false}", "\"joiner\":false,\"gpu\":1}", "members[0].gpu: unknown field"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "{}", "phases: expected an array"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[]", "phases: 0 phases"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[2,3]],5]", "phases[1]: expected an array"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[2,3]],[]]", "phases[1]: 0 groups"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[2,3],[]],[[0,2],[1,3]]]",
     "phases[0][2]: expected a non-empty array"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[2,3]],[[0,2],7]]",
     "phases[1][1]: expected a non-empty array"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,\"1\"],[2,3]],[[0,2],[1,3]]]",
     "phases[0][0][1]: expected an integer"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[2,3]],[[0,2],[1,4]]]",
     "phases[1][1][1]: rank 4 out of range"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[2,3]],[[-1,2],[1,3]]]",
     "phases[1][0][0]: rank -1 out of range"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[1,3]],[[0,2],[1,3]]]",
     "phases[0][1]: rank 1 appears twice"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[2,3]],[[0,2],[1,2]]]",
     "phases[1][1]: rank 2 appears twice"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[3]],[[0,2],[1,3]]]",
     "phases[0]: rank 2 is in no group"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[1,0],[2,3]],[[0,2],[1,3]]]",
     "phases[0][0]: ranks not in increasing order"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0],[1,2,3]],[[0,2],[1,3]]]",
     "phases[0][0]: group of one rank"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0],[1],[2],[3],[0]],[[0,2],[1,3]]]",
     "phases[0]: 5 groups"},
    {"[[[0,1],[2,3]],[[0,2],[1,3]]]", "[[[0,1],[2,3]],[[0,1],[2,3]]]",
     "phases: the groups of all 2 phases never connect rank 2 to rank 0"},
};

static char *substitute(const char *find, const char *with) {
  const char *base = BASE_JSON;
  if (!find)
    return strdup(with);
  const char *at = strstr(base, find);
  if (!at)
    fail_msg("table error: \"%s\" not in the base JSON", find);
  size_t head = (size_t)(at - base), n = strlen(base) - strlen(find) + strlen(with) + 1;
  char *s = malloc(n);
  assert_non_null(s);
  snprintf(s, n, "%.*s%s%s", (int)head, base, with, at + strlen(find));
  return s;
}

static void bad_inputs_name_their_field(void **state) {
  (void)state;
  wagma_plan_t plan;
  char err[256];
  /* the base itself decodes */
  assert_int_equal(wagma_plan_from_json(BASE_JSON, strlen(BASE_JSON), &plan, err, sizeof(err)), 0);
  wagma_plan_free(&plan);
  for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
    char *json = substitute(bad_cases[i].find, bad_cases[i].with);
    strcpy(err, "(none)");
    memset(&plan, 0x5a, sizeof(plan));
    int rc = wagma_plan_from_json(json, strlen(json), &plan, err, sizeof(err));
    if (rc != WAGMA_EINVAL)
      fail_msg("case %zu (%s): rc %d", i, bad_cases[i].expect, rc);
    if (!strstr(err, bad_cases[i].expect))
      fail_msg("case %zu: expected \"%s\" in \"%s\"", i, bad_cases[i].expect, err);
    assert_null(plan.members); /* left empty */
    assert_null(plan.phases);
    assert_int_equal(plan.nranks, 0);
    free(json);
  }
}

static void decoder_arguments(void **state) {
  (void)state;
  wagma_plan_t plan;
  char err[128];
  assert_int_equal(wagma_plan_from_json(NULL, 0, &plan, err, sizeof(err)), WAGMA_EINVAL);
  assert_non_null(strstr(err, "json"));
  assert_int_equal(wagma_plan_from_json(BASE_JSON, 10, &plan, err, sizeof(err)), WAGMA_EINVAL);
  assert_non_null(strstr(err, "json:")); /* only len bytes are read */
  assert_int_equal(wagma_plan_from_json(BASE_JSON, strlen(BASE_JSON), NULL, err, sizeof(err)),
                   WAGMA_EINVAL);
  assert_int_equal(wagma_plan_from_json("{}", 2, &plan, NULL, 0), WAGMA_EINVAL);
  /* not NUL-terminated input */
  size_t n = strlen(BASE_JSON);
  char *copy = malloc(n);
  assert_non_null(copy);
  memcpy(copy, BASE_JSON, n);
  assert_int_equal(wagma_plan_from_json(copy, n, &plan, err, sizeof(err)), 0);
  assert_int_equal(plan.nranks, 4);
  assert_int_equal(wagma_plan_rank_of(&plan, "a2"), 2);
  wagma_plan_free(&plan);
  free(copy);
}

const struct CMUnitTest plan_json_tests[] = {
    cmocka_unit_test(shape_is_the_documented_one),
    cmocka_unit_test(round_trips_are_exact),
    cmocka_unit_test(encoder_refuses_what_cannot_decode),
    cmocka_unit_test(encoder_matches_jansson),
    cmocka_unit_test(bad_inputs_name_their_field),
    cmocka_unit_test(decoder_arguments),
    cmocka_unit_test(codec_time_is_printed),
};
const size_t plan_json_ntests = sizeof(plan_json_tests) / sizeof(plan_json_tests[0]);
