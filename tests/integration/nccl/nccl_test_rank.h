/* nccl_test_rank.h — what the NCCL transport tests' forked ranks share: the plan of P ranks on
 * 127.0.0.1 (groups of 2, epoch 1, members r0 .. r<P-1>) and a transport config for rank me. */
#ifndef WAGMA_TEST_NCCL_RANK_H
#define WAGMA_TEST_NCCL_RANK_H

#include <sys/types.h>

#include "transport.h"

/* Fills *plan (the caller frees it with wagma_plan_free) and *cfg (pointing at plan) for rank
 * me of P listening on ports[r]; 0, or -1 when the plan cannot be built. */
int nt_rank_setup(int P, int me, const int *ports, wagma_plan_t *plan, wg_transport_config_t *cfg);

/* Waits (60 s each) for the n forked ranks pid[]; one that does not exit 0 is killed and said.
 * Rank `killed` (-1: none), which the test killed itself, is only reaped. 1 when every other
 * rank exited 0. */
int nt_wait_ranks(const pid_t *pid, int n, int killed);

#endif
