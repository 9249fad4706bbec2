/* Helpers shared by the plan tests (see test_plan_util.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_plan_util.h"

void pu_fill_members(wagma_plan_t *plan) {
  for (int r = 0; r < plan->nranks; r++) {
    snprintf(plan->members[r].name, sizeof(plan->members[r].name), "a%d", r);
    snprintf(plan->members[r].address, sizeof(plan->members[r].address), "127.0.0.1:%d", 7000 + r);
  }
}

static int find(int *parent, int x) {
  while (parent[x] != x)
    x = parent[x] = parent[parent[x]];
  return x;
}

void pu_assert_rule(const wagma_plan_t *plan, int P, int S) {
  assert_int_equal(plan->nranks, P);
  assert_int_equal(plan->group_size, S);
  assert_true(plan->nphases >= 1);
  /* L is small: at most ceil(log_S P), and 1 for P <= S */
  int ceil_log = 0;
  for (long long p = 1; p < P; p *= S)
    ceil_log++;
  assert_true(plan->nphases <= (ceil_log > 1 ? ceil_log : 1));
  int *count = calloc((size_t)P, sizeof(int));
  int *parent = malloc((size_t)P * sizeof(int));
  assert_non_null(count);
  assert_non_null(parent);
  for (int r = 0; r < P; r++)
    parent[r] = r;
  for (int j = 0; j < plan->nphases; j++) {
    const wagma_phase_t *ph = &plan->phases[j];
    memset(count, 0, (size_t)P * sizeof(int));
    assert_int_equal(ph->offsets[0], 0);
    assert_int_equal(ph->offsets[ph->ngroups], P);
    for (int g = 0; g < ph->ngroups; g++) {
      int size = ph->offsets[g + 1] - ph->offsets[g];
      if (P == 1) {
        assert_int_equal(size, 1);
      } else if (P < S) {
        assert_int_equal(ph->ngroups, 1); /* one group of all P */
        assert_int_equal(size, P);
      } else {
        assert_in_range(size, WAGMA_PLAN_MIN_GROUP(S), WAGMA_PLAN_MAX_GROUP(S));
        assert_in_range(size, S, 2 * S - 1);
      }
      for (int x = ph->offsets[g]; x < ph->offsets[g + 1]; x++) {
        int r = ph->ranks[x];
        assert_in_range(r, 0, P - 1);
        count[r]++;
        assert_int_equal(ph->group_of[r], g);
        if (x > ph->offsets[g])
          assert_true(ph->ranks[x - 1] < r);
        int a = find(parent, r), b = find(parent, ph->ranks[ph->offsets[g]]);
        parent[a] = b;
      }
    }
    for (int r = 0; r < P; r++)
      assert_int_equal(count[r], 1); /* exactly one group per phase */
  }
  for (int r = 1; r < P; r++)
    assert_int_equal(find(parent, r), find(parent, 0));
  free(count);
  free(parent);
}

void pu_assert_butterfly(const wagma_plan_t *plan, int S, int k, const int *rank_order) {
  int P = 1;
  for (int i = 0; i < k; i++)
    P *= S;
  assert_int_equal(plan->nranks, P);
  assert_int_equal(plan->nphases, k > 0 ? k : 1);
  int *expect = malloc((size_t)S * sizeof(int));
  assert_non_null(expect);
  for (int j = 0; j < k; j++) {
    int stride = 1;
    for (int i = 0; i < j; i++)
      stride *= S;
    const wagma_phase_t *ph = &plan->phases[j];
    assert_int_equal(ph->ngroups, P / S);
    for (int pos = 0; pos < P; pos++) {
      int digit = (pos / stride) % S, base = pos - digit * stride;
      for (int d = 0; d < S; d++) {
        int p = base + d * stride;
        expect[d] = rank_order ? rank_order[p] : p;
      }
      int rank = rank_order ? rank_order[pos] : pos;
      const int *ranks = NULL;
      int n = wagma_plan_group(plan, (uint64_t)j, rank, NULL, &ranks);
      assert_int_equal(n, S);
      /* same set: every expected rank shares the group */
      for (int d = 0; d < S; d++)
        assert_int_equal(ph->group_of[expect[d]], ph->group_of[rank]);
    }
  }
  free(expect);
}

void pu_assert_plan_equal(const wagma_plan_t *a, const wagma_plan_t *b) {
  assert_true(a->epoch == b->epoch);
  assert_true(a->start_round == b->start_round);
  assert_int_equal(a->nranks, b->nranks);
  assert_int_equal(a->group_size, b->group_size);
  assert_int_equal(a->staleness_bound, b->staleness_bound);
  assert_int_equal(a->global_sync, b->global_sync);
  assert_int_equal(a->nphases, b->nphases);
  for (int r = 0; r < a->nranks; r++) {
    assert_string_equal(a->members[r].name, b->members[r].name);
    assert_string_equal(a->members[r].address, b->members[r].address);
    assert_int_equal(a->members[r].joiner, b->members[r].joiner);
  }
  for (int j = 0; j < a->nphases; j++) {
    const wagma_phase_t *x = &a->phases[j], *y = &b->phases[j];
    assert_int_equal(x->ngroups, y->ngroups);
    assert_memory_equal(x->offsets, y->offsets, ((size_t)x->ngroups + 1) * sizeof(int));
    assert_memory_equal(x->ranks, y->ranks, (size_t)a->nranks * sizeof(int));
    assert_memory_equal(x->group_of, y->group_of, (size_t)a->nranks * sizeof(int));
  }
}

void pu_average_rounds(const wagma_plan_t *plan, double *x, int dim, int nrounds) {
  double *sum = malloc((size_t)dim * sizeof(double));
  assert_non_null(sum);
  for (int t = 0; t < nrounds; t++) {
    const wagma_phase_t *ph = wagma_plan_phase(plan, (uint64_t)t);
    for (int g = 0; g < ph->ngroups; g++) {
      int lo = ph->offsets[g], hi = ph->offsets[g + 1];
      memset(sum, 0, (size_t)dim * sizeof(double));
      for (int i = lo; i < hi; i++)
        for (int d = 0; d < dim; d++)
          sum[d] += x[(size_t)ph->ranks[i] * dim + d];
      for (int i = lo; i < hi; i++)
        for (int d = 0; d < dim; d++)
          x[(size_t)ph->ranks[i] * dim + d] = sum[d] / (hi - lo);
    }
  }
  free(sum);
}

void pu_average_rounds_float(const wagma_plan_t *plan, float *x, int dim, int nrounds) {
  double *sum = malloc((size_t)dim * sizeof(double));
  assert_non_null(sum);
  for (int t = 0; t < nrounds; t++) {
    const wagma_phase_t *ph = wagma_plan_phase(plan, (uint64_t)t);
    for (int g = 0; g < ph->ngroups; g++) {
      int lo = ph->offsets[g], hi = ph->offsets[g + 1];
      memset(sum, 0, (size_t)dim * sizeof(double));
      for (int i = lo; i < hi; i++)
        for (int d = 0; d < dim; d++)
          sum[d] += x[(size_t)ph->ranks[i] * dim + d];
      for (int i = lo; i < hi; i++)
        for (int d = 0; d < dim; d++)
          x[(size_t)ph->ranks[i] * dim + d] = (float)(sum[d] / (hi - lo));
    }
  }
  free(sum);
}

double pu_rand(uint64_t *state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(*state >> 11) / (double)(1ULL << 52) - 1.0;
}
