/* Unit tests of the group rule, plan lifetime, validation and lookups (collective/plan.c).
 * JSON codec tests are in test_plan_json.c; shared checks in test_plan_util.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "test_plan_util.h"

/* test_plan_json.c */
extern const struct CMUnitTest plan_json_tests[];
extern const size_t plan_json_ntests;

static int ipow(int s, int k) {
  int p = 1;
  while (k-- > 0)
    p *= s;
  return p;
}

static int is_power(int P, int S, int *k) {
  int p = 1, e = 0;
  while (p < P) {
    p *= S;
    e++;
  }
  *k = e;
  return p == P;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void small_sizes_keep_every_property(void **state) {
  (void)state;
  for (int S = 2; S <= 5; S++) {
    for (int P = 1; P <= 70; P++) {
      wagma_plan_t plan;
      assert_int_equal(wagma_plan_build(P, S, NULL, &plan), 0);
      pu_assert_rule(&plan, P, S);
      pu_fill_members(&plan);
      char err[256] = "";
      if (wagma_plan_validate(&plan, err, sizeof(err)) != 0)
        fail_msg("P=%d S=%d: %s", P, S, err);
      int k;
      if (is_power(P, S, &k) && P > 1)
        pu_assert_butterfly(&plan, S, k, NULL);
      wagma_plan_free(&plan);
    }
  }
}

static void powers_are_the_butterfly(void **state) {
  (void)state;
  for (int S = 2; S <= 9; S++) {
    for (int k = 1; ipow(S, k) <= 5000; k++) {
      wagma_plan_t plan;
      assert_int_equal(wagma_plan_build(ipow(S, k), S, NULL, &plan), 0);
      assert_int_equal(plan.nphases, k);
      pu_assert_butterfly(&plan, S, k, NULL);
      pu_assert_rule(&plan, ipow(S, k), S);
      wagma_plan_free(&plan);
    }
  }
  /* large S */
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(32 * 32, 32, NULL, &plan), 0);
  pu_assert_butterfly(&plan, 32, 2, NULL);
  wagma_plan_free(&plan);
}

static void one_rank_and_fewer_than_s(void **state) {
  (void)state;
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(1, 4, NULL, &plan), 0);
  assert_int_equal(plan.nphases, 1);
  assert_int_equal(plan.phases[0].ngroups, 1);
  assert_int_equal(plan.phases[0].ranks[0], 0);
  assert_int_equal(plan.phases[0].group_of[0], 0);
  wagma_plan_free(&plan);
  assert_int_equal(wagma_plan_build(3, 8, NULL, &plan), 0);
  assert_int_equal(plan.nphases, 1);
  assert_int_equal(plan.phases[0].ngroups, 1);
  assert_int_equal(plan.phases[0].offsets[1], 3);
  wagma_plan_free(&plan);
  wagma_plan_free(&plan); /* twice is safe */
}

static void defaults_are_set(void **state) {
  (void)state;
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(10, 3, NULL, &plan), 0);
  assert_int_equal(plan.staleness_bound, 8);
  assert_int_equal(plan.global_sync, WAGMA_GLOBAL_BARRIER);
  assert_true(plan.epoch == 0 && plan.start_round == 0);
  for (int r = 0; r < 10; r++) {
    assert_string_equal(plan.members[r].name, "");
    assert_int_equal(plan.members[r].joiner, 0);
  }
  /* names are the caller's: unnamed members do not validate */
  char err[128];
  assert_int_equal(wagma_plan_validate(&plan, err, sizeof(err)), WAGMA_EINVAL);
  assert_non_null(strstr(err, "members[0].name"));
  wagma_plan_free(&plan);
}

static void large_sizes_keep_every_property(void **state) {
  (void)state;
  static const int sizes[] = {1000, 10000, 9999, 4097};
  static const int groups[] = {2, 3, 4, 5, 8, 16};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    for (size_t s = 0; s < sizeof(groups) / sizeof(groups[0]); s++) {
      wagma_plan_t plan;
      assert_int_equal(wagma_plan_build(sizes[i], groups[s], NULL, &plan), 0);
      pu_assert_rule(&plan, sizes[i], groups[s]);
      wagma_plan_free(&plan);
    }
  }
}

/* Prints the planning time (not asserted: unit tests run loaded and under sanitizers). */
static void planning_time_is_printed(void **state) {
  (void)state;
  static const int sizes[] = {100, 1000, 10000};
  static const int groups[] = {2, 4, 8};
  for (size_t i = 0; i < 3; i++) {
    for (size_t s = 0; s < 3; s++) {
      const int reps = 20;
      double best = 1e9, worst = 0;
      int nphases = 0;
      for (int rep = 0; rep < reps; rep++) {
        wagma_plan_t plan;
        double t0 = now_s();
        assert_int_equal(wagma_plan_build(sizes[i], groups[s], NULL, &plan), 0);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
        worst = dt > worst ? dt : worst;
        nphases = plan.nphases;
        wagma_plan_free(&plan);
      }
      printf("plan build P=%-6d S=%-2d L=%-2d %d runs: best %.3f ms, worst %.3f ms\n", sizes[i],
             groups[s], nphases, reps, best * 1e3, worst * 1e3);
    }
  }
  /* the JSON codec's time at P = 10000: test_plan_json.c, codec_time_is_printed */
}

/* With fresh inputs, L consecutive rounds of group averaging leave the exact global mean on
 * every rank when P = S^k (float storage, float tolerance). */
static void powers_give_the_exact_mean(void **state) {
  (void)state;
  const int dim = 5;
  for (int S = 2; S <= 5; S++) {
    for (int k = 1; ipow(S, k) <= 3125; k++) {
      int P = ipow(S, k);
      wagma_plan_t plan;
      assert_int_equal(wagma_plan_build(P, S, NULL, &plan), 0);
      float *x = malloc((size_t)P * dim * sizeof(float));
      double *mean = calloc((size_t)dim, sizeof(double));
      assert_non_null(x);
      assert_non_null(mean);
      uint64_t rng = (uint64_t)(P * 31 + S);
      for (int i = 0; i < P * dim; i++) {
        x[i] = (float)(10.0 * pu_rand(&rng));
        mean[i % dim] += x[i];
      }
      for (int d = 0; d < dim; d++)
        mean[d] /= P;
      /* start at any round: any L consecutive phases */
      for (int start = 0; start < plan.nphases; start++) {
        float *y = malloc((size_t)P * dim * sizeof(float));
        assert_non_null(y);
        memcpy(y, x, (size_t)P * dim * sizeof(float));
        wagma_plan_t rotated = plan; /* rotate phases so round 0 uses phase start */
        wagma_phase_t *phases = malloc((size_t)plan.nphases * sizeof(*phases));
        assert_non_null(phases);
        for (int j = 0; j < plan.nphases; j++)
          phases[j] = plan.phases[(start + j) % plan.nphases];
        rotated.phases = phases;
        pu_average_rounds_float(&rotated, y, dim, plan.nphases);
        for (int i = 0; i < P * dim; i++)
          if (fabs(y[i] - mean[i % dim]) > 1e-5 * 10.0)
            fail_msg("P=%d S=%d start=%d: rank %d holds %g, mean %g", P, S, start, i / dim, y[i],
                     mean[i % dim]);
        free(phases);
        free(y);
      }
      free(x);
      free(mean);
      wagma_plan_free(&plan);
    }
  }
}

static double max_deviation(const double *x, const double *mean, int P, int dim) {
  double m = 0;
  for (int i = 0; i < P * dim; i++)
    m = fmax(m, fabs(x[i] - mean[i % dim]));
  return m;
}

/* For other P the rounds are doubly stochastic and connected: repeating the L phases brings
 * every rank to the global mean. Also prints the worst one-cycle contraction. */
static void other_sizes_converge_to_the_mean(void **state) {
  (void)state;
  const int dim = 3, cycles = 60;
  double worst = 0;
  int worst_p = 0, worst_s = 0;
  for (int S = 2; S <= 5; S++) {
    for (int P = 2; P <= 70; P++) {
      int k;
      if (is_power(P, S, &k))
        continue;
      wagma_plan_t plan;
      assert_int_equal(wagma_plan_build(P, S, NULL, &plan), 0);
      double *x = malloc((size_t)P * dim * sizeof(double));
      double *mean = calloc((size_t)dim, sizeof(double));
      assert_non_null(x);
      assert_non_null(mean);
      uint64_t rng = (uint64_t)(P * 131 + S);
      for (int i = 0; i < P * dim; i++) {
        x[i] = pu_rand(&rng);
        mean[i % dim] += x[i];
      }
      for (int d = 0; d < dim; d++)
        mean[d] /= P;
      double before = max_deviation(x, mean, P, dim), prev = before;
      for (int c = 0; c < cycles; c++) {
        pu_average_rounds(&plan, x, dim, plan.nphases);
        double dev = max_deviation(x, mean, P, dim);
        assert_true(dev <= prev + 1e-12); /* averaging never moves away from the mean */
        if (c == 0 && dev / before > worst) {
          worst = dev / before;
          worst_p = P;
          worst_s = S;
        }
        prev = dev;
      }
      if (prev > 1e-9 * before)
        fail_msg("P=%d S=%d: deviation %g of %g after %d cycles", P, S, prev, before, cycles);
      free(x);
      free(mean);
      wagma_plan_free(&plan);
    }
  }
  printf("worst deviation left after one cycle of L rounds (P <= 70, S 2..5): %.3f at P=%d "
         "S=%d\n",
         worst, worst_p, worst_s);
}

static void rank_order_relabels_positions(void **state) {
  (void)state;
  static const int cases[][2] = {{16, 2}, {27, 3}, {10, 3}, {23, 4}, {70, 5}, {1000, 4}};
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    int P = cases[c][0], S = cases[c][1];
    int *order = malloc((size_t)P * sizeof(int));
    assert_non_null(order);
    for (int i = 0; i < P; i++)
      order[i] = i;
    uint64_t rng = (uint64_t)P;
    for (int i = P - 1; i > 0; i--) { /* Fisher-Yates */
      int j = (int)((pu_rand(&rng) + 1.0) / 2.0 * (i + 1));
      j = j > i ? i : j;
      int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    wagma_plan_t base, perm;
    assert_int_equal(wagma_plan_build(P, S, NULL, &base), 0);
    assert_int_equal(wagma_plan_build(P, S, order, &perm), 0);
    pu_assert_rule(&perm, P, S);
    assert_int_equal(base.nphases, perm.nphases);
    for (int j = 0; j < base.nphases; j++) {
      const wagma_phase_t *b = &base.phases[j], *p = &perm.phases[j];
      assert_int_equal(b->ngroups, p->ngroups);
      for (int g = 0; g < b->ngroups; g++) {
        /* the group of positions {i} is the group of ranks {order[i]} */
        int target = p->group_of[order[b->ranks[b->offsets[g]]]];
        int size = b->offsets[g + 1] - b->offsets[g];
        assert_int_equal(p->offsets[target + 1] - p->offsets[target], size);
        for (int x = b->offsets[g]; x < b->offsets[g + 1]; x++)
          assert_int_equal(p->group_of[order[b->ranks[x]]], target);
      }
    }
    int k;
    if (is_power(P, S, &k))
      pu_assert_butterfly(&perm, S, k, order);
    wagma_plan_free(&base);
    wagma_plan_free(&perm);
    free(order);
  }
}

static void bad_arguments_are_rejected(void **state) {
  (void)state;
  wagma_plan_t plan;
  int dup[] = {0, 1, 1, 3}, out_of_range[] = {0, 1, 2, 4}, negative[] = {0, -1, 2, 3};
  assert_int_equal(wagma_plan_build(4, 2, dup, &plan), WAGMA_EINVAL);
  assert_null(plan.phases);
  assert_null(plan.members);
  assert_int_equal(plan.nranks, 0);
  assert_int_equal(wagma_plan_build(4, 2, out_of_range, &plan), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_build(4, 2, negative, &plan), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_build(0, 2, NULL, &plan), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_build(-3, 2, NULL, &plan), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_build(4, 1, NULL, &plan), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_build(4, 0, NULL, &plan), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_build(4, 2, NULL, NULL), WAGMA_EINVAL);
  assert_int_equal(plan.nphases, 0);
  wagma_plan_free(NULL);
  assert_int_equal(wagma_plan_copy(NULL, &plan), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_copy(&plan, NULL), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_validate(NULL, NULL, 0), WAGMA_EINVAL);
}

static void lookups(void **state) {
  (void)state;
  wagma_plan_t plan;
  assert_int_equal(wagma_plan_build(9, 3, NULL, &plan), 0);
  pu_fill_members(&plan);
  assert_int_equal(plan.nphases, 2);
  assert_ptr_equal(wagma_plan_phase(&plan, 0), &plan.phases[0]);
  assert_ptr_equal(wagma_plan_phase(&plan, 1), &plan.phases[1]);
  assert_ptr_equal(wagma_plan_phase(&plan, 1000001), &plan.phases[1]);
  assert_ptr_equal(wagma_plan_phase(&plan, UINT64_MAX), &plan.phases[UINT64_MAX % 2]);
  assert_null(wagma_plan_phase(NULL, 0));
  int group = -1;
  const int *ranks = NULL;
  assert_int_equal(wagma_plan_group(&plan, 0, 4, &group, &ranks), 3); /* digit 0 varies */
  assert_int_equal(ranks[0], 3);
  assert_int_equal(ranks[1], 4);
  assert_int_equal(ranks[2], 5);
  assert_int_equal(group, plan.phases[0].group_of[4]);
  assert_int_equal(wagma_plan_group(&plan, 3, 4, NULL, &ranks), 3); /* phase 1: digit 1 */
  assert_int_equal(ranks[0], 1);
  assert_int_equal(ranks[1], 4);
  assert_int_equal(ranks[2], 7);
  assert_int_equal(wagma_plan_group(&plan, 3, 4, NULL, NULL), 3);
  assert_int_equal(wagma_plan_group(&plan, 0, 9, NULL, NULL), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_group(&plan, 0, -1, NULL, NULL), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_group(NULL, 0, 0, NULL, NULL), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_rank_of(&plan, "a7"), 7);
  assert_int_equal(wagma_plan_rank_of(&plan, "a0"), 0);
  assert_int_equal(wagma_plan_rank_of(&plan, "a9"), WAGMA_ENOTFOUND);
  assert_int_equal(wagma_plan_rank_of(&plan, ""), WAGMA_ENOTFOUND);
  assert_int_equal(wagma_plan_rank_of(&plan, NULL), WAGMA_EINVAL);
  wagma_plan_free(&plan);
}

static void copy_is_deep(void **state) {
  (void)state;
  wagma_plan_t plan, copy;
  assert_int_equal(wagma_plan_build(50, 4, NULL, &plan), 0);
  pu_fill_members(&plan);
  plan.epoch = 12;
  plan.start_round = 345;
  plan.members[3].joiner = 1;
  assert_int_equal(wagma_plan_copy(&copy, &plan), 0);
  pu_assert_plan_equal(&plan, &copy);
  assert_ptr_not_equal(copy.members, plan.members);
  assert_ptr_not_equal(copy.phases[0].ranks, plan.phases[0].ranks);
  copy.phases[0].ranks[0] = 49;
  strcpy(copy.members[0].name, "changed");
  assert_int_equal(plan.phases[0].ranks[0], 0);
  assert_string_equal(plan.members[0].name, "a0");
  wagma_plan_free(&copy);
  assert_int_equal(wagma_plan_copy(&plan, &plan), WAGMA_EINVAL); /* onto itself: refused */
  assert_int_equal(wagma_plan_validate(&plan, NULL, 0), 0);
  wagma_plan_free(&plan);
}

/* Each corruption of a valid plan is caught with a message naming the field. */
typedef void (*corrupt_fn)(wagma_plan_t *p);
static void c_dup_rank(wagma_plan_t *p) {
  p->phases[1].ranks[1] = p->phases[1].ranks[0];
}
static void c_unsorted(wagma_plan_t *p) {
  int t = p->phases[0].ranks[0];
  p->phases[0].ranks[0] = p->phases[0].ranks[1];
  p->phases[0].ranks[1] = t;
}
static void c_out_of_range(wagma_plan_t *p) {
  p->phases[1].ranks[2] = 99;
}
static void c_group_of(wagma_plan_t *p) {
  p->phases[1].group_of[5] = (p->phases[1].group_of[5] + 1) % p->phases[1].ngroups;
}
static void c_offsets(wagma_plan_t *p) {
  p->phases[0].offsets[p->phases[0].ngroups] = 15;
}
static void c_singleton(wagma_plan_t *p) {
  p->phases[0].offsets[1] = 1;
}
static void c_ngroups(wagma_plan_t *p) {
  p->phases[0].ngroups = 0;
}
static void c_empty_name(wagma_plan_t *p) {
  p->members[2].name[0] = '\0';
}
static void c_dup_name(wagma_plan_t *p) {
  strcpy(p->members[5].name, "a1");
}
static void c_unterminated(wagma_plan_t *p) {
  memset(p->members[3].name, 'x', sizeof(p->members[3].name));
}
static void c_address(wagma_plan_t *p) {
  memset(p->members[4].address, 'x', sizeof(p->members[4].address));
}
static void c_joiner(wagma_plan_t *p) {
  p->members[1].joiner = 2;
}
static void c_staleness(wagma_plan_t *p) {
  p->staleness_bound = 0;
}
static void c_group_size(wagma_plan_t *p) {
  p->group_size = 1;
}
static void c_sync(wagma_plan_t *p) {
  p->global_sync = (wagma_global_sync_t)7;
}
static void c_nranks(wagma_plan_t *p) {
  p->nranks = 0;
}
static void c_nphases(wagma_plan_t *p) {
  p->nphases = 0;
}
static void c_disconnected(wagma_plan_t *p) { /* phase 1 := phase 0: blocks never meet */
  wagma_phase_t *a = &p->phases[0], *b = &p->phases[1];
  b->ngroups = a->ngroups;
  memcpy(b->offsets, a->offsets, ((size_t)a->ngroups + 1) * sizeof(int));
  memcpy(b->ranks, a->ranks, (size_t)p->nranks * sizeof(int));
  memcpy(b->group_of, a->group_of, (size_t)p->nranks * sizeof(int));
}

static void validate_catches_corruption(void **state) {
  (void)state;
  static const struct {
    corrupt_fn fn;
    const char *field;
  } cases[] = {
      {c_dup_rank, "phases[1][0]: rank"},
      {c_unsorted, "phases[0][0]: ranks not in incr"},
      {c_out_of_range, "phases[1][0][2]"},
      {c_group_of, "phases[1].group_of[5]"},
      {c_offsets, "phases[0].offsets"},
      {c_singleton, "phases[0][0]: group of one"},
      {c_ngroups, "phases[0].ngroups"},
      {c_empty_name, "members[2].name: empty"},
      {c_dup_name, "members[5].name"},
      {c_unterminated, "members[3].name"},
      {c_address, "members[4].address"},
      {c_joiner, "members[1].joiner"},
      {c_staleness, "staleness_bound"},
      {c_group_size, "group_size"},
      {c_sync, "global_sync"},
      {c_nranks, "nranks"},
      {c_nphases, "nphases"},
      {c_disconnected, "phases: "},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    wagma_plan_t plan;
    char err[256] = "";
    assert_int_equal(wagma_plan_build(16, 4, NULL, &plan), 0); /* 2 phases of 4 groups */
    pu_fill_members(&plan);
    assert_int_equal(wagma_plan_validate(&plan, err, sizeof(err)), 0);
    int nranks = plan.nranks, nphases = plan.nphases, ngroups0 = plan.phases[0].ngroups;
    cases[i].fn(&plan);
    assert_int_equal(wagma_plan_validate(&plan, err, sizeof(err)), WAGMA_EINVAL);
    if (!strstr(err, cases[i].field))
      fail_msg("case %zu: expected \"%s\" in \"%s\"", i, cases[i].field, err);
    plan.nranks = nranks; /* restore what free needs */
    plan.nphases = nphases;
    plan.phases[0].ngroups = ngroups0;
    wagma_plan_free(&plan);
  }
  /* a NULL err and a short err buffer are fine */
  wagma_plan_t plan;
  char tiny[8];
  assert_int_equal(wagma_plan_build(16, 4, NULL, &plan), 0);
  assert_int_equal(wagma_plan_validate(&plan, NULL, 0), WAGMA_EINVAL);
  assert_int_equal(wagma_plan_validate(&plan, tiny, sizeof(tiny)), WAGMA_EINVAL);
  assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
  wagma_plan_free(&plan);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(small_sizes_keep_every_property),
      cmocka_unit_test(powers_are_the_butterfly),
      cmocka_unit_test(one_rank_and_fewer_than_s),
      cmocka_unit_test(defaults_are_set),
      cmocka_unit_test(large_sizes_keep_every_property),
      cmocka_unit_test(planning_time_is_printed),
      cmocka_unit_test(powers_give_the_exact_mean),
      cmocka_unit_test(other_sizes_converge_to_the_mean),
      cmocka_unit_test(rank_order_relabels_positions),
      cmocka_unit_test(bad_arguments_are_rejected),
      cmocka_unit_test(lookups),
      cmocka_unit_test(copy_is_deep),
      cmocka_unit_test(validate_catches_corruption),
  };
  int failed = cmocka_run_group_tests_name("plan", tests, NULL, NULL);
  failed += _cmocka_run_group_tests("plan_json", plan_json_tests, plan_json_ntests, NULL, NULL);
  return failed;
}
