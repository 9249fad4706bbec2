/* Helpers shared by the plan tests: members, independent property checks, simulation. */
#ifndef WAGMA_TEST_PLAN_UTIL_H
#define WAGMA_TEST_PLAN_UTIL_H

#include <stdint.h>

#include "wagma/collective.h"

/* Names "a<rank>", addresses "127.0.0.1:<7000+rank>". */
void pu_fill_members(wagma_plan_t *plan);

/* Asserts (cmocka) every property of wagma_plan_build's rule for P ranks and group size S,
 * checked here without wagma_plan_validate: partition and group_of, sorted groups, the size
 * band, connectivity of the union of the L phases (union-find), L <= ceil(log_S P) + 1. */
void pu_assert_rule(const wagma_plan_t *plan, int P, int S);

/* Asserts the plan is the butterfly for P = S^k (identity order when rank_order is NULL,
 * else position i holds rank rank_order[i]). */
void pu_assert_butterfly(const wagma_plan_t *plan, int S, int k, const int *rank_order);

/* Asserts a and b hold the same plan (field by field). */
void pu_assert_plan_equal(const wagma_plan_t *a, const wagma_plan_t *b);

/* Runs nrounds group-averaging rounds (round t uses phase t mod L) on P vectors of dim doubles
 * in x (rank-major), every group replacing its members' vectors by their mean. */
void pu_average_rounds(const wagma_plan_t *plan, double *x, int dim, int nrounds);

/* Same with float storage (sums in double), as the engine holds models. */
void pu_average_rounds_float(const wagma_plan_t *plan, float *x, int dim, int nrounds);

/* Deterministic uniform [-1, 1) from a 64-bit state. */
double pu_rand(uint64_t *state);

#endif
